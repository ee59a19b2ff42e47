"""The profile grid tune measures before any calibration: its prompt lengths reach the workload's
long prompts, so the first fit sees decode attention and the long-prefill step (bench/RESULTS-overload.md)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from kvtune.optimizer.tune import GRID_LONG_QUANTILE, grid_prompts
from kvtune.optimizer.workload import load_workload

DATA = Path(__file__).parent.parent / "data"


def test_a_long_tailed_workload_adds_its_long_prompts_to_the_grid():
    spec = load_workload(DATA / "live-llamacpp-overload" / "support.yaml")   # 75% ~90 tokens, 25% 250-450
    prompts = grid_prompts(spec, 0)
    draw = spec.requests(2000, 0).input_tokens
    mean = int(round(spec.workload.mean_input_tokens))
    assert prompts == [mean // 4, mean, int(np.percentile(draw, 100 * GRID_LONG_QUANTILE))]
    assert 380 <= prompts[-1] <= 450   # the tickets' lengths, not the mean's 156


def test_a_workload_of_one_length_keeps_two_prompts():
    spec = load_workload(DATA / "fixed-llama3.1-8b.yaml")   # every prompt 1024 tokens
    assert grid_prompts(spec, 0) == [256, 1024]
