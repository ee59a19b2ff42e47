"""The simulator's memos (issue 22 item 7, speed) return what the computation they stand for
returns, bit for bit: the decode clock shared per step model, a chunk run's step fractions, the
MoE/pipeline token-count terms and the disaggregated prefill pool's outcome."""

from __future__ import annotations

import numpy as np

from kvtune.costmodel import StepModel, efficiency_for, get_gpu, get_model
from kvtune.costmodel.deployment import Pool, _prefill_pool, _simulate_prefill_pool, kv_link, simulate_disaggregated
from kvtune.costmodel.parallel import Parallel
from kvtune.costmodel.replica import _steps_over
from kvtune.costmodel.requests import Requests
from kvtune.costmodel.sim_clock import DecodeClock, clock_for
from kvtune.costmodel.simulate import SimConfig

H100 = get_gpu("h100-sxm")
CAL = efficiency_for("calibrated", "h100-sxm")


def _requests(n: int, seed: int) -> Requests:
    rng = np.random.default_rng(seed)
    return Requests(arrival_s=np.cumsum(rng.exponential(0.05, n)), input_tokens=rng.integers(200, 3000, n),
                    output_tokens=rng.integers(10, 200, n), prefix_tokens=np.zeros(n, dtype=np.int64),
                    prefix_group=np.full(n, -1), ttft_slo_s=np.full(n, np.inf), tpot_slo_s=np.full(n, np.inf),
                    class_idx=np.zeros(n, dtype=np.int64))


def test_the_shared_clock_is_one_per_model_and_gives_a_fresh_clocks_pieces():
    s = StepModel(get_model("llama-3.1-8b"), H100, 1, efficiency=CAL)
    c = clock_for(s)
    assert clock_for(s) is c
    assert clock_for(StepModel(get_model("llama-3.1-8b"), H100, 1, efficiency=CAL)) is not c
    for n in (1, 7, 64, 7):
        assert c.pieces(n) == DecodeClock(s).pieces(n)


def test_step_fractions_are_arange_over_the_last_step_and_read_only():
    for m in (2, 3, 17, 3):
        j = _steps_over(m, m - 1)
        assert np.array_equal(j, np.arange(m) / (m - 1))
        assert not j.flags.writeable


def test_memoised_token_terms_equal_a_fresh_models_first_evaluation():
    # MoE with expert parallelism and all-to-all, and a pipeline: the memoised paths
    for par in (Parallel(tp=16, ep=16, dp_attention=True, gpus_per_node=8), Parallel(tp=8, pp=2, gpus_per_node=8)):
        args = [(n, n * 900.0, p, p * (p + 1) / 2, 0.0) for n in (1, 3, 40) for p in (0, 512)]
        warm = StepModel(get_model("deepseek-v3"), H100, par.tp, "fp8", efficiency=CAL, parallel=par)
        first = [warm.step_terms(*a) for a in args]
        again = [warm.step_terms(*a) for a in args]
        fresh = [StepModel(get_model("deepseek-v3"), H100, par.tp, "fp8", efficiency=CAL,
                           parallel=par).step_terms(*a) for a in args]
        assert first == again == fresh


def test_the_prefill_pools_memo_returns_fresh_copies_of_the_computed_outcome():
    s = StepModel(get_model("llama-3.1-8b"), H100, 1, efficiency=CAL)
    pool = Pool(s, SimConfig(8, 1024), 2)
    req = _requests(60, 1)
    arr = req.arrival_s.astype(float)
    order = np.argsort(arr, kind="stable")
    want = _simulate_prefill_pool(pool, req, arr, order, "trace", 0)
    a = _prefill_pool(pool, req, arr, order, "trace", 0)
    a[0][:] = -1.0   # a caller writes into its copy
    a[1][:] = True
    b = _prefill_pool(pool, req, arr, order, "trace", 0)
    assert np.array_equal(b[0], want[0]) and np.array_equal(b[1], want[1]) and b[2:] == want[2:]
    other = _requests(60, 2)   # other requests: computed, not the first draw's outcome
    oarr = other.arrival_s.astype(float)
    oorder = np.argsort(oarr, kind="stable")
    c = _prefill_pool(pool, other, oarr, oorder, "trace", 0)
    assert np.array_equal(c[0], _simulate_prefill_pool(pool, other, oarr, oorder, "trace", 0)[0])
    assert not np.array_equal(c[0], want[0])


def test_a_disaggregated_simulation_repeated_is_the_same():
    s = StepModel(get_model("llama-3.1-8b"), H100, 1, efficiency=CAL)
    req = _requests(80, 3)
    link = kv_link(H100, True)
    runs = [simulate_disaggregated(Pool(s, SimConfig(8, 1024), 1), Pool(s, SimConfig(32), y), req, link)
            for y in (1, 2, 1)]
    assert np.array_equal(runs[0].result.ttft_s, runs[2].result.ttft_s)
    assert np.array_equal(runs[0].result.e2e_s, runs[2].result.e2e_s)
    assert np.array_equal(runs[0].prefill_s, runs[1].prefill_s)   # the same prefill pool beside either decode pool
