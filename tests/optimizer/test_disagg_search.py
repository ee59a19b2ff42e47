"""The disaggregated race (optimizer.disagg): the simulator decides, the bound only prunes, and
the same inputs give the same answer."""

from __future__ import annotations

import math

import numpy as np

from kvtune.costmodel import StepModel, efficiency_for, get_gpu, get_model
from kvtune.costmodel.requests import Requests
from kvtune.costmodel.simulate import SimConfig
from kvtune.optimizer.disagg import search_disaggregated

H100 = get_gpu("h100-sxm")
CAL = efficiency_for("calibrated", "h100-sxm")
STEPS = {tp: StepModel(get_model("llama-3.1-70b"), H100, tp, efficiency=CAL) for tp in (2, 4)}


def _make(rate, n, seed):
    rng = np.random.default_rng(seed)
    arr = np.zeros(n) if math.isinf(rate) else np.cumsum(rng.exponential(1.0, n)) / rate
    return Requests(arrival_s=arr, input_tokens=np.full(n, 4000), output_tokens=np.full(n, 300),
                    prefix_tokens=np.zeros(n, dtype=np.int64), prefix_group=np.full(n, -1),
                    ttft_slo_s=np.full(n, 1.0), tpot_slo_s=np.full(n, 0.04), class_idx=np.zeros(n, dtype=np.int64))


def _search():
    return search_disaggregated(STEPS.get, lambda cap, chunk: SimConfig(cap, chunk), _make, 0.9, tps=(2, 4),
                                gpu=H100, gpus_per_node=8, max_gpus=8, engine="trtllm", short_keep=12,
                                final_n=200)


def test_the_winner_is_simulated_within_its_bound_and_the_same_inputs_give_the_same_answer():
    a, b = _search(), _search()
    assert a.best is not None and a.best.round == "final"
    assert a.best == b.best and a.simulated == b.simulated
    assert 0 < a.best.goodput_req_s <= a.best.bound_req_s * (1 + 1e-9)
    assert a.best.gpus <= 8 and a.screened == a.pruned + len(a.simulated)
    # the winner has the most goodput per GPU among the fully simulated candidates
    finals = [c for c in a.simulated if c.round == "final"]
    assert a.best.goodput_per_gpu_req_s == max(c.goodput_per_gpu_req_s for c in finals)
    assert a.best.link == "nvlink"   # 8 GPUs: both pools in one node
