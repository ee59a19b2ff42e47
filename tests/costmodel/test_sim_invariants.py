"""Invariants of every simulated result (issue 12 item 3), over generated configs and requests:
served + rejected = offered, every number in the JSON finite, goodput never above the capacity
bound the same result reports, and that bound above what the simulator sustains."""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtune.costmodel import SpecConfig, StepModel, efficiency_for, get_gpu, get_model
from kvtune.costmodel.goodput import goodput
from kvtune.costmodel.requests import Requests
from kvtune.costmodel.simulate import SimConfig, simulate
from kvtune.costmodel.speculation import SPEC_CLT_TOKENS, verify_passes

H100 = get_gpu("h100-sxm")
CAL = efficiency_for("calibrated", "h100-sxm")
_STEPS: dict = {}
# examples per property: CI runs the default; a longer run by hand, e.g. KVTUNE_SIM_EXAMPLES=20
# pytest tests/costmodel/test_sim_invariants.py --hypothesis-profile=default (random draws, 20 x as many)
_X = max(1, int(os.environ.get("KVTUNE_SIM_EXAMPLES", "1")))


def _step(model: str, tp: int, util: float, spec: tuple | None) -> StepModel:
    key = (model, tp, util, spec)
    if key not in _STEPS:
        sc = SpecConfig(*spec) if spec else None
        _STEPS[key] = StepModel(get_model(model), H100, tp, efficiency=CAL, speculation=sc, gpu_mem_util=util)
    return _STEPS[key]


def _strict(obj) -> bool:
    try:
        json.dumps(obj, allow_nan=False)
    except ValueError:
        return False
    return True


engines = st.sampled_from([
    {},                                              # vLLM V1: mixed chunked prefill
    {"output_reserve": True},                        # SGLang's admission, mixed chunks
    {"output_reserve": True, "prefill_first": True},  # SGLang's default scheduling
])
steps = st.tuples(st.sampled_from([("llama-3.1-8b", 1), ("qwen3-32b", 2), ("gemma-2-9b", 1), ("mixtral-8x7b", 4)]),
                  st.sampled_from([0.45, 0.6, 0.9]),
                  st.sampled_from([None, (3, 0.7), (5, 0.9)]))


@st.composite
def workloads(draw):
    n = draw(st.integers(1, 120))
    seed = draw(st.integers(0, 2**16))
    rng = np.random.default_rng(seed)
    max_in = draw(st.sampled_from([64, 2000, 40000, 300000]))
    max_out = draw(st.sampled_from([1, 8, 600, 6000]))
    inp = rng.integers(1, max_in + 1, n)
    out = rng.integers(1, max_out + 1, n)
    groups = draw(st.integers(0, 3))
    grp = rng.integers(-1, groups, n) if groups else np.full(n, -1)
    pre = np.where(grp >= 0, np.minimum(inp, draw(st.sampled_from([16, 300, 5000]))), 0)
    ttft = draw(st.sampled_from([0.05, 1.0, 60.0, math.inf]))
    tpot = draw(st.sampled_from([0.005, 0.05, 1.0, math.inf]))
    return Requests(arrival_s=np.zeros(n), input_tokens=inp, output_tokens=out, prefix_tokens=pre,
                    prefix_group=grp, ttft_slo_s=np.full(n, ttft), tpot_slo_s=np.full(n, tpot),
                    class_idx=np.zeros(n, dtype=np.int64)), seed


@settings(max_examples=60 * _X, deadline=None)
@given(steps, engines, workloads(), st.sampled_from([1, 8, 64, 512]), st.sampled_from([64, 512, 8192]),
       st.booleans(), st.sampled_from(["trace", "inf", "closed"]), st.sampled_from([0.5, 20.0, 1e4]))
def test_every_simulated_result_is_whole_and_finite(sm, engine, wl, cap, chunk, prefix, arrival, rate):
    (model, tp), util, spec = sm
    step = _step(model, tp, util, spec)
    req, seed = wl
    n = len(req)
    arr = np.cumsum(np.random.default_rng(seed).exponential(1.0 / rate, n))
    req = Requests(**{**req.__dict__, "arrival_s": arr})
    cfg = SimConfig(cap, chunk, prefix_caching=prefix, **engine)
    res = simulate(step, req, cfg, arrival, concurrency=3 if arrival == "closed" else None, seed=seed)
    served = ~np.isinf(res.ttft_s)
    # served + rejected = offered; the rejected are exactly those larger than the pool
    assert served.sum() + res.rejected == n
    too_big = -(-(req.input_tokens + req.output_tokens + 1) // 16) > step.memory.kv_pool_tokens // 16
    assert (~served == too_big).all()
    assert (res.reject_reason != "") == bool(res.rejected)
    # served requests have finite, ordered times; rejected ones never meet the SLOs
    assert np.isfinite(res.ttft_s[served]).all() and np.isfinite(res.e2e_s[served]).all()
    assert (res.e2e_s[served] >= res.ttft_s[served] - 1e-12).all() and (res.ttft_s[served] > 0).all()
    assert not res.met_slo[~served].any()
    # every output token served is counted once
    assert math.isclose(res.output_tok_s * res.makespan_s, float(req.output_tokens[served].sum()), rel_tol=1e-9) \
        or res.makespan_s == 0
    summ = res.summary()
    assert _strict(summ)
    assert summ["served_requests"] + summ["rejected"] == summ["requests"] == n
    assert 0.0 <= res.slo_attainment <= 1.0


def _maker(inp_max: int, out_max: int, ttft: float, tpot: float, prefix: int, huge_share: float, pool: int):
    def make(rate, n, seed):
        rng = np.random.default_rng(seed)
        gaps = rng.exponential(1.0, n)
        arr = np.zeros(n) if math.isinf(rate) else np.cumsum(gaps) / rate
        inp = rng.integers(max(1, inp_max // 4), inp_max + 1, n)
        out = rng.integers(1, out_max + 1, n)
        inp[rng.random(n) < huge_share] = pool + 1  # never fits
        grp = np.where(rng.random(n) < 0.5, 0, -1) if prefix else np.full(n, -1)
        pre = np.where(grp >= 0, np.minimum(inp, prefix), 0)
        return Requests(arrival_s=arr, input_tokens=inp, output_tokens=out, prefix_tokens=pre, prefix_group=grp,
                        ttft_slo_s=np.full(n, ttft), tpot_slo_s=np.full(n, tpot), class_idx=np.zeros(n, dtype=np.int64))
    return make


@settings(max_examples=25 * _X, deadline=None)
@given(steps, engines, st.sampled_from([8, 64, 256]), st.sampled_from([512, 8192]),
       st.sampled_from([(500, 200), (4000, 600), (20000, 100)]),
       st.sampled_from([(0.3, 0.03), (2.0, 0.06), (60.0, 1.0), (math.inf, math.inf)]),
       st.sampled_from([0, 400]), st.sampled_from([0.0, 0.02, 0.3]), st.sampled_from([None, 0.5, 3.0]))
def test_goodput_never_exceeds_its_capacity_bound(sm, engine, cap, chunk, sizes, slo, prefix, huge, guess):
    (model, tp), util, spec = sm
    step = _step(model, tp, util, spec)
    make = _maker(*sizes, *slo, prefix, huge, step.memory.kv_pool_tokens)
    cfg = SimConfig(cap, chunk, **engine)
    g = goodput(step, make, cfg, 0.9, n_requests=300, guess_req_s=guess)
    assert 0.0 <= g.goodput_req_s <= g.upper_bound_req_s
    assert _strict(g.to_dict())
    assert (g.goodput_req_s == 0) == (g.reason != "")
    if g.goodput_req_s > 0:
        assert g.attainment >= 0.9
        # the bound is above what the simulator sustains with every request queued
        sat = simulate(step, make(math.inf, 300, 0), cfg, "inf", warmup_frac=0.0)
        assert sat.request_s <= g.upper_bound_req_s * 1.0001


# ---- speculation: pass counts drawn per pass (or in closed form), never one draw per token -----

def test_speculation_with_huge_outputs_stays_small_in_memory():
    import tracemalloc

    out = np.full(20, 10**9)  # one draw per token would be 160 GB
    tracemalloc.start()
    passes = verify_passes(out, SpecConfig(5, 0.8), 0)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 64 * 2**20
    mu = SpecConfig(5, 0.8).tokens_per_step
    assert np.allclose(passes, (out - 1) / mu, rtol=1e-3)
    # and a whole simulation with such outputs runs
    step = _step("llama-3.1-8b", 1, 0.9, (5, 0.8))
    req = Requests.uniform(3, 100, 2_000_000)
    big = simulate(step, Requests(**{**req.__dict__, "output_tokens": np.full(3, 2_000_000)}),
                   SimConfig(8, kv_pool_tokens=10**8), arrival="inf")
    assert big.rejected == 0 and np.isfinite(big.e2e_s).all()


def test_block_by_block_draws_equal_drawing_the_whole_stream():
    rng = np.random.default_rng(4)
    for _ in range(40):
        spec = SpecConfig(int(rng.integers(1, 8)), float(rng.choice([0.3, 0.8, 0.95])))
        out = rng.integers(1, int(rng.choice([3, 50, 3000])), int(rng.integers(1, 40)))
        seed = int(rng.integers(0, 1000))
        whole = verify_passes(out, spec, seed)
        blocks = int(rng.choice([1, 5, 64]))
        assert (verify_passes(out, spec, seed, draws_per_block=blocks) == whole).all()


def test_long_outputs_draw_pass_counts_with_the_per_pass_law():
    for k, a in ((3, 0.3), (5, 0.8), (7, 0.95)):
        out = np.full(3000, SPEC_CLT_TOKENS + 2000)
        clt = verify_passes(out, SpecConfig(k, a), 1)
        exact = verify_passes(out, SpecConfig(k, a), 1, clt_tokens=10**9)
        assert abs(clt.mean() - exact.mean()) < 4 * exact.std() / np.sqrt(len(out)) + 0.5
        assert clt.std() == pytest.approx(exact.std(), rel=0.1)
