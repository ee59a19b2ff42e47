"""A run's TTFT trend says whether its queue grew (issue 33.2): tune's steady-state promise holds only
where the 1.0x run's TTFT does not rise through the run."""

from __future__ import annotations

import dataclasses

from kvtune.costmodel.calibration import efficiency_for
from test_open_loop_replay import simulated_run


def test_an_overloaded_run_rises_and_a_light_one_does_not():
    eff = efficiency_for("calibrated", "h100-sxm", None, "vllm")
    for seed in (0, 1):   # attainment 1.0 at 4 and 8 req/s, both seeds
        for rate in (4.0, 8.0):
            light = simulated_run(rate, eff, n=200, warmup=20, seed=seed).ttft_trend()
            assert light is not None and not light["rising"], (rate, seed, light)
    heavy = simulated_run(30.0, eff, n=200, warmup=20).ttft_trend()   # attainment 0.22
    assert heavy is not None
    assert heavy["rising"] and heavy["slope_ms_per_s"] > 0 and heavy["p_value"] < 0.01, heavy
    assert heavy["rise_ms"] >= 0.25 * heavy["ttft_target_ms"]


def test_a_flat_run_with_a_few_slow_requests_is_not_a_growing_queue():
    eff = efficiency_for("calibrated", "h100-sxm", None, "vllm")
    run = simulated_run(4.0, eff, n=200, warmup=20)
    recs = list(run.requests)
    for i in (60, 120, 180):   # three stragglers spread over the run: noise, not a trend
        recs[i] = dataclasses.replace(recs[i], ttft_ms=(recs[i].ttft_ms or 0) + 2000.0)
    trend = dataclasses.replace(run, requests=tuple(recs)).ttft_trend()
    assert trend is not None and not trend["rising"], trend


def test_too_few_requests_say_nothing():
    eff = efficiency_for("calibrated", "h100-sxm", None, "vllm")
    assert simulated_run(4.0, eff, n=12, warmup=4).ttft_trend() is None
