"""The serving simulator: limits it must reproduce from the step model, and its closed-form
advance checked against a plain step-by-step reference."""

from __future__ import annotations

import math
from collections import deque

import numpy as np
import pytest

from kvtune.costmodel import SpecConfig, StepModel, efficiency_for, get_gpu, get_model
from kvtune.costmodel.errors import InputError
from kvtune.costmodel.requests import Requests
from kvtune.costmodel.sim_clock import DecodeClock
from kvtune.costmodel.simulate import (RESERVE_RATIO_DECAY_PER_STEP, RESERVE_RATIO_INIT, SimConfig, simulate_replica, simulate,
                                 simulate_fleet)

H100 = get_gpu("h100-sxm")
CAL = efficiency_for("calibrated", "h100-sxm")


def _step(model="llama-3.1-8b", tp=1, kv="bf16", spec=None, util=0.9) -> StepModel:
    return StepModel(get_model(model), H100, tp, kv_dtype=kv, efficiency=CAL, speculation=spec, gpu_mem_util=util)


def _poisson(n, rate, inp=(512, 1024), out=(64, 128), seed=0, ttft=np.inf, tpot=np.inf) -> Requests:
    rng = np.random.default_rng(seed)
    arr = np.concatenate(([0.0], np.cumsum(rng.exponential(1.0 / rate, n - 1))))
    return Requests(arrival_s=arr, input_tokens=rng.integers(inp[0], inp[1] + 1, n),
                    output_tokens=rng.integers(out[0], out[1] + 1, n), prefix_tokens=np.zeros(n, dtype=np.int64),
                    prefix_group=np.full(n, -1, dtype=np.int64), ttft_slo_s=np.full(n, ttft),
                    tpot_slo_s=np.full(n, tpot), class_idx=np.zeros(n, dtype=np.int64))


# ---- a tiny, slow, independent reference: one Python iteration per engine step ----------------

def _reference(step: StepModel, req: Requests, cap: int, chunk: int, bt: int = 16):
    """Plain vLLM-V1-style loop (no speculation, no prefix cache): same rules as the simulator,
    written without any aggregate or closed form."""
    n = len(req)
    inp, out, arr = req.input_tokens.tolist(), req.output_tokens.tolist(), req.arrival_s.tolist()
    total = step.memory.kv_pool_tokens // bt
    t, nxt = 0.0, 0
    waiting: deque = deque()
    running: dict = {}                 # id -> state dict, in admission order
    done = [0] * n                     # decode steps done (kept across preemption)
    first, fin = [math.nan] * n, [math.nan] * n
    preempt = 0
    left = n
    while left:
        while nxt < n and arr[nxt] <= t:
            waiting.append(nxt)
            nxt += 1
        if not running and not waiting:
            t = arr[nxt]
            continue

        def used():
            return sum(math.ceil((s["ctx"] + 1) / bt) if s["dec"] else s["alloc"] for s in running.values())

        pre_now = False
        while used() > total:
            v = next(reversed(running))
            del running[v]
            waiting.appendleft(v)
            preempt += 1
            pre_now = True
        n_dec = sum(1 for s in running.values() if s["dec"])
        ctx = sum(s["ctx"] for s in running.values() if s["dec"])
        budget = chunk - n_dec
        work = []
        for i, s in running.items():
            if not s["dec"] and budget > 0:
                c = min(s["target"] - s["done"], budget)
                work.append((i, c, s["done"]))
                budget -= c
        while budget > 0 and waiting and len(running) < cap and not pre_now:
            i = waiting[0]
            target = inp[i] + done[i]
            need = math.ceil(target / bt)
            if used() + need > total:
                break
            waiting.popleft()
            running[i] = {"dec": False, "done": 0, "target": target, "alloc": need, "ctx": 0}
            c = min(target, budget)
            work.append((i, c, 0))
            budget -= c
        ptok = sum(c for _, c, _ in work)
        pairs = sum(c * d + c * (c + 1) / 2 for _, c, d in work)
        kv = sum(d for _, _, d in work)
        t += step.step_time_s(n_dec, ctx, ptok, pairs, kv)
        for i, s in list(running.items()):
            if s["dec"]:
                s["ctx"] += 1
                done[i] += 1
                if done[i] == out[i] - 1:
                    fin[i] = t
                    del running[i]
                    left -= 1
        for i, c, _ in work:
            s = running[i]
            s["done"] += c
            if s["done"] == s["target"]:
                if math.isnan(first[i]):
                    first[i] = t
                if done[i] == out[i] - 1:
                    fin[i] = t
                    del running[i]
                    left -= 1
                else:
                    s["dec"], s["ctx"] = True, s["target"]
    a = np.asarray(arr)
    return np.asarray(first) - a, np.asarray(fin) - a, preempt


@pytest.mark.parametrize("util,cap,chunk,rate", [(0.9, 16, 2048, 6.0), (0.233, 64, 1024, 40.0)])
def test_closed_form_matches_step_by_step_reference(util, cap, chunk, rate):
    """The key correctness check: skipping decode iterations in closed form gives the same
    per-request times as stepping every iteration (second case: a tiny pool, with preemptions)."""
    s = _step(util=util)
    req = _poisson(60, rate, inp=(200, 900), out=(20, 300), seed=3)
    cfg = SimConfig(cap, chunk_tokens=chunk, prefix_caching=False)
    res = simulate(s, req, cfg)
    ttft, e2e, pre = _reference(s, req, cap, chunk)
    assert res.preemptions == pre
    if util < 0.5:
        assert pre > 0, "the small-pool case should exercise preemption"
    np.testing.assert_allclose(res.ttft_s, ttft, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(res.e2e_s, e2e, rtol=1e-9, atol=1e-9)
    assert res.events < res.steps  # and it did skip iterations


@pytest.mark.parametrize("spec,reserve", [(None, False), (SpecConfig(4, 0.7), False), (None, True),
                                          (SpecConfig(4, 0.7), True)])
def test_closed_form_matches_internal_naive_mode_with_prefix_and_spec(spec, reserve):
    s = _step(spec=spec, util=0.233)
    req = _poisson(120, 30.0, inp=(300, 1500), out=(2, 400), seed=5)
    grp = np.where(np.arange(120) % 3 == 0, 7, -1)
    req = Requests(**{**req.__dict__, "prefix_group": grp, "prefix_tokens": np.where(grp >= 0, 256, 0)})
    cfg = SimConfig(48, chunk_tokens=1024, output_reserve=reserve)
    fast = simulate_replica(s, req, cfg, "trace", None, 1, None, naive=False)
    slow = simulate_replica(s, req, cfg, "trace", None, 1, None, naive=True)
    assert fast.preemptions == slow.preemptions
    np.testing.assert_allclose(fast.e2e_s, slow.e2e_s, rtol=1e-9)
    np.testing.assert_allclose(fast.ttft_s, slow.ttft_s, rtol=1e-9)
    # and it skipped iterations; how many depends on the shipped calibration (bench reports the ratio);
    # the output reserve steps one at a time while a request waits
    assert fast.events < slow.events / (1.2 if reserve else 2)


@pytest.mark.parametrize("model,tp,util,cap", [("llama-3.1-8b", 1, 0.9, 32), ("llama-3.1-8b", 1, 0.3, 64),
                                               ("llama-3.1-70b", 4, 0.9, 16), ("mixtral-8x7b", 2, 0.9, 16)])
def test_long_prompt_chunk_runs_match_naive_mode(model, tp, util, cap):
    """Long prompts chunked beside running decodes: runs of identical mixed steps summed in closed
    form give the per-request times of stepping every one (the second case: a small pool, with
    preemptions; prefix groups on), and take far fewer loop turns."""
    s = StepModel(get_model(model), H100, tp, efficiency=CAL, gpu_mem_util=util)
    req = _poisson(60, 2.0, inp=(3000, 40000), out=(10, 300), seed=11)
    grp = np.where(np.arange(60) % 4 == 0, 3, -1)
    req = Requests(**{**req.__dict__, "prefix_group": grp, "prefix_tokens": np.where(grp >= 0, 1500, 0)})
    cfg = SimConfig(cap, chunk_tokens=1024)
    fast = simulate_replica(s, req, cfg, "trace", None, 1, None, naive=False)
    slow = simulate_replica(s, req, cfg, "trace", None, 1, None, naive=True)
    if util < 0.5:
        assert slow.preemptions > 0, "the small-pool case should exercise preemption"
    assert fast.preemptions == slow.preemptions
    np.testing.assert_allclose(fast.ttft_s, slow.ttft_s, rtol=1e-9)
    np.testing.assert_allclose(fast.e2e_s, slow.e2e_s, rtol=1e-9)
    assert fast.steps == slow.steps
    assert fast.events < slow.events / 4


@pytest.mark.parametrize("model,tp,spec", [("llama-2-70b", 4, None), ("gemma-2-9b", 1, None),
                                           ("mixtral-8x7b", 2, None), ("llama-3.1-8b", 1, SpecConfig(3, 0.8))])
def test_decode_clock_pieces_equal_step_model(model, tp, spec):
    s = StepModel(get_model(model), H100, tp, efficiency=CAL, speculation=spec)
    clock = DecodeClock(s)
    rng = np.random.default_rng(0)
    for n in (1, 7, 64, 300):
        pcs = clock.pieces(n)
        assert pcs is not None
        for c in rng.uniform(0, n * 40000, 20):
            hi, a, b = next(p for p in pcs if c < p[0])
            assert a + b * c == pytest.approx(s.step_time_s(n, c), rel=1e-9)
        # sums and their inverse agree with brute force, across piece boundaries too
        c0, g, m = float(n * 100), float(n), 3000
        ts = np.cumsum([s.step_time_s(n, c0 + j * g) for j in range(m)])
        assert clock.time_of_steps(pcs, c0, g, m) == pytest.approx(ts[-1], rel=1e-9)
        for k in (0, 11, 1234, m - 1):  # a time inside step k (0-based) is reached after k + 1 steps
            tau = ts[k] - 0.5 * (ts[k] - (ts[k - 1] if k else 0.0))
            assert clock.steps_until(pcs, c0, g, tau) == k + 1


# ---- limits the simulator must reproduce from the cost model --------------------------------

def test_low_load_tpot_is_batch1_step_and_ttft_is_prefill_time():
    s = _step("llama-2-70b", tp=4)
    n, inp, out = 20, 3000, 400
    req = Requests.uniform(n, inp, out, arrival_s=np.arange(n) * 1000.0)  # never two at once
    res = simulate(s, req, SimConfig(128, chunk_tokens=2048), warmup_frac=0.0)
    assert res.ttft_s == pytest.approx(np.full(n, s.prefill_time_s(inp, chunk_tokens=2048)), rel=0.02)
    tpot_model = s.decode_step(1, inp + out / 2).time_s
    assert res.tpot_s == pytest.approx(np.full(n, tpot_model), rel=0.02)


def _wave_tok_s(s: StepModel, inp: int, out: int, b: float, chunk: int) -> float:
    """Steady state of a saturated replica with fixed lengths: B sequences decode out - 1 steps at
    the mean context, and their B prompts cost B x inp prefill tokens in full chunks."""
    ctx = inp + out / 2
    decode_s = (out - 1) * s.step_time_s(b, b * ctx)
    prefill_s = b * inp / chunk * s.step_time_s(0, 0.0, chunk, chunk * (inp + 1) / 2)
    return b * out / (decode_s + prefill_s)


@pytest.mark.parametrize("model,tp,util,inp,out,cap", [
    ("llama-3.1-8b", 1, 0.9, 256, 1024, 64),     # batch cap binds
    ("llama-3.1-8b", 1, 0.3, 1024, 32, 1024),    # KV pool binds
    ("llama-2-70b", 4, 0.9, 2048, 64, 1024),     # KV pool binds
])
def test_offline_throughput_matches_steady_state(model, tp, util, inp, out, cap):
    s = _step(model, tp, util=util)
    b = min(cap, s.memory.kv_pool_tokens / (inp + out / 2))
    if cap == 1024:
        assert b < cap  # the pool, not the cap, sets the batch
    res = simulate(s, Requests.uniform(600, inp, out), SimConfig(cap), arrival="inf")
    assert res.output_tok_s == pytest.approx(_wave_tok_s(s, inp, out, b, 8192), rel=0.05)
    assert res.rejected == 0 and np.isfinite(res.e2e_s).all()


def test_ttft_tail_grows_without_bound_past_saturation():
    s = _step()
    cap_req_s = simulate(s, _poisson(400, 1e6), SimConfig(32), arrival="inf").request_s
    p99 = [simulate(s, _poisson(n, 1.5 * cap_req_s), SimConfig(32)).summary()["ttft_ms"]["p99"] for n in (300, 600, 1200)]
    assert p99[0] < p99[1] < p99[2]
    assert p99[2] > 2.5 * p99[0]
    # below capacity it does not
    low = [simulate(s, _poisson(n, 0.5 * cap_req_s), SimConfig(32)).summary()["ttft_ms"]["p99"] for n in (300, 1200)]
    assert low[1] < 2 * low[0]


def test_spec_gain_at_batch1_and_lost_when_compute_bound():
    spec = SpecConfig(4, 0.8, draft_cost=0.05)
    plain, fast = _step(), _step(spec=spec)
    inp, out = 1000, 512
    # batch 1: requests never overlap
    req = Requests.uniform(30, inp, out, arrival_s=np.arange(30) * 1000.0)
    t_plain = np.nanmean(simulate(plain, req, SimConfig(8), warmup_frac=0.0).tpot_s)
    t_spec = np.nanmean(simulate(fast, req, SimConfig(8), seed=1, warmup_frac=0.0).tpot_s)
    ctx = inp + out / 2
    model_ratio = (fast.decode_step(1, ctx).time_s / fast.tokens_per_step) / plain.decode_step(1, ctx).time_s
    assert model_ratio < 0.6
    assert t_spec / t_plain == pytest.approx(model_ratio, rel=0.05)
    # batch 256, short contexts: the verify pass is compute bound and speculation stops paying
    assert fast.decode_step(256, 600).bound == "compute"
    big = Requests.uniform(1024, 300, 512)
    tok_plain = simulate(plain, big, SimConfig(256, chunk_tokens=16384), arrival="inf").output_tok_s
    tok_spec = simulate(fast, big, SimConfig(256, chunk_tokens=16384), arrival="inf").output_tok_s
    assert tok_spec < 1.1 * tok_plain
    assert (t_plain / t_spec) > 1.6  # whereas at batch 1 it was a large gain


def test_small_pool_preempts_and_everyone_finishes():
    s = _step(util=0.233)  # a few thousand tokens of pool
    req = Requests.uniform(200, 700, 600)
    res = simulate(s, req, SimConfig(256), arrival="inf")
    assert res.preemptions > 0
    assert res.rejected == 0
    assert np.isfinite(res.e2e_s).all() and (res.e2e_s >= res.ttft_s).all()
    # a roomy pool does not preempt
    assert simulate(_step(), req, SimConfig(256), arrival="inf").preemptions == 0


def test_requests_larger_than_the_pool_are_rejected_not_hung():
    s = _step(util=0.233)
    too_big = s.memory.kv_pool_tokens + 10
    req = Requests(**{**Requests.uniform(5, 100, 50).__dict__,
                      "input_tokens": np.array([100, too_big, 100, 100, 100])})
    res = simulate(s, req, SimConfig(8), arrival="inf")
    assert res.rejected == 1 and not res.met_slo[1] and np.isinf(res.ttft_s[1])
    assert np.isfinite(np.delete(res.e2e_s, 1)).all()


def test_prefix_cache_cuts_ttft():
    s = _step()
    req = Requests.uniform(100, 4000, 50, arrival_s=np.arange(100) * 10.0)
    shared = Requests(**{**req.__dict__, "prefix_tokens": np.full(100, 3500), "prefix_group": np.zeros(100, dtype=np.int64)})
    on = simulate(s, shared, SimConfig(16))
    off = simulate(s, shared, SimConfig(16, prefix_caching=False))
    assert np.median(on.ttft_s) < 0.3 * np.median(off.ttft_s)
    assert on.ttft_s[0] == pytest.approx(off.ttft_s[0])  # the first request pays for the prefix


def test_closed_loop_keeps_concurrency_and_is_saturating():
    s = _step()
    req = Requests.uniform(400, 500, 200)
    res = simulate(s, req, SimConfig(64), arrival="closed", concurrency=8)
    # at most 8 in flight: at any arrival, fewer than 8 earlier requests are unfinished
    fin = res.arrival_s + res.e2e_s
    for k in range(8, 400, 37):
        assert ((res.arrival_s[:k] <= res.arrival_s[k]) & (fin[:k] > res.arrival_s[k])).sum() < 8
    c16 = simulate(s, req, SimConfig(64), arrival="closed", concurrency=16)
    assert c16.output_tok_s > 1.5 * res.output_tok_s
    assert np.median(c16.tpot_s) > np.median(res.tpot_s)


def test_closed_loop_staggered_clients_prefill_one_at_a_time():
    """Clients that start spread over a request's lifetime keep apart: each prompt is prefilled in
    a step of its own beside the others' decodes, so TTFT is about one prefill, not the lock-step
    burst's eight, and those prefills land inside the others' TPOT."""
    s = _step()
    c, n, isl, osl = 8, 160, 1024, 128
    burst = simulate(s, Requests.uniform(n, isl, osl), SimConfig(64, chunk_tokens=8192), arrival="closed", concurrency=c)
    life_s = s.prefill_time_s(isl) + (osl - 1) * s.decode_step(c, isl + osl / 2).time_s
    starts = np.zeros(n)
    starts[:c] = np.arange(c) * life_s / c
    stag = simulate(s, Requests.uniform(n, isl, osl, arrival_s=starts), SimConfig(64, chunk_tokens=8192),
                    arrival="closed", concurrency=c)
    assert np.allclose(stag.arrival_s[:c], starts[:c])  # each client's first request at its start time
    keep = slice(2 * c, n - c)
    one = s.step_time_s(c - 1, (c - 1) * (isl + osl / 2), isl, s.chunk_pairs(isl, 0), 0)
    assert np.mean(stag.ttft_s[keep]) < 2 * one
    assert np.mean(burst.ttft_s[keep]) > 4 * one  # lock-step: all eight prompts in one step
    assert np.mean(stag.tpot_s[keep]) > np.mean(burst.tpot_s[keep])
    with pytest.raises(InputError, match="start times"):
        simulate(s, Requests.uniform(n, isl, osl, arrival_s=np.r_[1.0, 0.5, np.zeros(n - 2)]), SimConfig(64),
                 arrival="closed", concurrency=c)


def test_prefill_first_keeps_clients_in_lock_step():
    """SGLang's default scheduling (prefill_first): a waiting prompt gets a prefill-only step and the
    decodes wait for it. Clients that start together then stay together: each round's prompts are
    prefilled in steps of two (a 2048-token budget, 1024-token prompts), the j-th pair's first
    tokens come after j such steps, and everyone decodes together and finishes on the same step.
    So a request of pair j waits through the C/2 - j pair steps after its own inside its TPOT, and
    what is left is the round's shared decode steps: (osl - 1) steps at batch C."""
    s = _step()
    c, rounds, isl, osl = 8, 3, 1024, 64
    res = simulate(s, Requests.uniform(c * rounds, isl, osl), SimConfig(c, chunk_tokens=2 * isl, prefill_first=True),
                   arrival="closed", concurrency=c)
    pair_s = s.step_time_s(0, 0.0, 2 * isl, 2 * s.chunk_pairs(isl, 0), 0)
    for r in range(rounds):
        ids = slice(r * c, (r + 1) * c)
        ttft = res.ttft_s[ids]
        j = np.rint(ttft / pair_s)
        np.testing.assert_allclose(np.sort(ttft), np.repeat(np.arange(1, c // 2 + 1), 2) * pair_s, rtol=1e-9)
        finish = res.arrival_s[ids] + res.e2e_s[ids]
        np.testing.assert_allclose(finish, finish[0], rtol=1e-12)  # lock-step: one finishing step
        decode_s = res.tpot_s[ids] * (osl - 1) - (c // 2 - j) * pair_s
        np.testing.assert_allclose(decode_s, decode_s[0], rtol=1e-9)
        np.testing.assert_allclose(decode_s[0], (osl - 1) * s.decode_step(c, isl + osl / 2).time_s, rtol=0.02)
    # without prefill_first the pairs' chunks ride in decode steps: the clients drift out of lock-step
    mixed = simulate(s, Requests.uniform(c * rounds, isl, osl), SimConfig(c, chunk_tokens=2 * isl),
                     arrival="closed", concurrency=c)
    last = slice((rounds - 1) * c, rounds * c)
    assert np.ptp(mixed.arrival_s[last] + mixed.e2e_s[last]) > 3 * s.decode_step(c, isl).time_s


def test_output_reserve_holds_back_room_for_outputs_and_decays():
    """SGLang's admission (output_reserve): a request is admitted only while the pool also holds its
    whole output, plus new_token_ratio x the running requests' remaining output. The ratio starts at
    0.7 and falls every decode step, so a request that does not fit beside a long-running one gets
    in after a computable number of steps, long before that one finishes."""
    s = _step(util=0.21)          # a pool of a few thousand tokens
    pool = s.memory.kv_pool_tokens
    one_tok = SimConfig(8, block_tokens=1)
    # three requests whose prompts fit together; with their outputs, only two
    a, o = pool // 20, pool // 3
    three = Requests.uniform(3, a, o)
    plain = simulate(s, three, one_tok, arrival="inf")
    held = simulate(s, three, SimConfig(8, block_tokens=1, output_reserve=True), arrival="inf")
    assert np.ptp(plain.ttft_s) == 0                      # all three prefilled in the first step
    assert held.ttft_s[0] == held.ttft_s[1] < held.ttft_s[2]
    # a long request A (0.7 of the pool) and B, which fits beside A's reserve only once the ratio
    # has decayed: B's admission step j* follows from the rule, with A holding 10 + j + 1 tokens
    oa = int(0.7 * pool)
    ob = int(pool - 22 - RESERVE_RATIO_INIT * (oa - 1) + 0.02 * pool)
    two = Requests(**{**Requests.uniform(2, 10, 10).__dict__, "output_tokens": np.array([oa, ob])})
    j_star = next(j for j in range(oa) if (10 + j + 1) + (RESERVE_RATIO_INIT - RESERVE_RATIO_DECAY_PER_STEP * j)
                  * (oa - 1 - j) + 10 + ob <= pool)
    assert 10 < j_star < oa // 10
    res = simulate(s, two, SimConfig(8, block_tokens=1, output_reserve=True), arrival="inf")
    steps_waited = (res.ttft_s[1] - res.ttft_s[0]) / s.decode_step(1, 10 + j_star).time_s
    assert j_star <= steps_waited <= j_star + 2          # its own prefill step on top
    assert np.ptp(simulate(s, two, one_tok, arrival="inf").ttft_s) == 0  # no reserve: both at once


def test_same_seed_same_numbers_and_summary_keys():
    s = _step(spec=SpecConfig(3, 0.7))
    req = _poisson(300, 20.0, ttft=1.0, tpot=0.02)
    a, b = simulate(s, req, SimConfig(32), seed=4), simulate(s, req, SimConfig(32), seed=4)
    np.testing.assert_array_equal(a.e2e_s, b.e2e_s)
    np.testing.assert_array_equal(a.met_slo, b.met_slo)
    c = simulate(s, req, SimConfig(32), seed=5)
    assert not np.array_equal(a.e2e_s, c.e2e_s)  # the seed drives acceptance
    summ = a.summary()
    for key in ("requests", "ttft_ms", "tpot_ms", "e2e_ms", "slo_attainment", "output_tok_s", "request_s",
                "preemptions", "sim_wall_s"):
        assert key in summ
    assert set(summ["ttft_ms"]) == {"mean", "p50", "p90", "p99"}
    assert summ["requests"] == 300 and a.measured.sum() == 270  # 10% warm-up excluded
    assert 0 <= a.slo_attainment <= 1


def test_tpot_definition_and_slo():
    s = _step()
    req = Requests.uniform(3, 800, 1, ttft_slo_s=10.0, tpot_slo_s=1e-6, arrival_s=np.array([0.0, 50, 100]))
    res = simulate(s, req, SimConfig(4), warmup_frac=0.0)
    assert np.isnan(res.tpot_s).all() and res.met_slo.all()  # 1-token outputs: TPOT undefined, ignored
    req2 = Requests.uniform(3, 800, 10, ttft_slo_s=10.0, tpot_slo_s=1e-6, arrival_s=np.array([0.0, 50, 100]))
    res2 = simulate(s, req2, SimConfig(4), warmup_frac=0.0)
    np.testing.assert_allclose(res2.tpot_s, (res2.e2e_s - res2.ttft_s) / 9)
    assert not res2.met_slo.any()


def test_fleet_is_one_replica_at_split_rate():
    s = _step()

    def make(rate, n, seed):
        return _poisson(n, rate, seed=seed)

    fleet = simulate_fleet(s, make, SimConfig(32), replicas=4, rate_req_s=40.0, n_requests=400)
    one = simulate(s, make(10.0, 400, 0), SimConfig(32))
    assert fleet.request_s == pytest.approx(4 * one.request_s)
    np.testing.assert_array_equal(fleet.ttft_s, one.ttft_s)
    assert fleet.replicas == 4


def test_bad_inputs_raise_input_error():
    with pytest.raises(InputError):
        SimConfig(0)
    with pytest.raises(InputError):
        SimConfig(8, chunk_tokens=0)
    s = _step()
    req = Requests.uniform(4, 10, 10)
    with pytest.raises(InputError):
        simulate(s, req, SimConfig(8), arrival="poisson")
    with pytest.raises(InputError):
        simulate(s, req, SimConfig(8), arrival="closed")
    with pytest.raises(InputError):
        simulate(s, req, SimConfig(8), warmup_frac=1.0)


# ---- the command line ---------------------------------------------------------------------------

WORKLOAD_YAML = """
model: llama-3.1-8b
hardware: {gpu: h100-sxm, usd_per_gpu_hour: 3.0}
workload:
  rate_req_s: 10
  classes:
    - {name: chat, share: 1.0, input_tokens: {dist: uniform, min: 500, max: 1500}, output_tokens: 150, prefix_tokens: 100}
slo: {ttft_ms: 1000, tpot_ms: 40, attainment: 0.9}
speculative: {method: eagle3, acceptance: 0.75}
"""


def _cli(args, tmp_path):
    import json

    from click.testing import CliRunner

    from kvtune.optimizer.cli import main

    wl = tmp_path / "wl.yaml"
    wl.write_text(WORKLOAD_YAML)
    res = CliRunner().invoke(main, [a.replace("WL", str(wl)) for a in args])
    return res, (json.loads(res.output) if res.exit_code == 0 and "--json" in args else None)


def test_cli_simulate_json(tmp_path):
    res, out = _cli(["simulate", "WL", "--tp", "1", "--batch-cap", "64", "--requests", "300", "--json"], tmp_path)
    assert res.exit_code == 0, res.output
    for key in ("requests", "ttft_ms", "tpot_ms", "e2e_ms", "slo_attainment", "output_tok_s", "request_s",
                "preemptions", "sim_wall_s", "config", "source"):
        assert key in out
    assert out["requests"] == 300 and out["rate_req_s"] == 10 and out["source"].startswith("calibrated")
    assert set(out["tpot_ms"]) == {"mean", "p50", "p90", "p99"}
    # fleet: 4 replicas at 40 req/s behave like one at 10 req/s, throughput x4
    _, fleet = _cli(["simulate", "WL", "--requests", "300", "--rate", "40", "--replicas", "4", "--json"], tmp_path)
    assert fleet["request_s"] == pytest.approx(4 * out["request_s"], rel=1e-9)
    assert fleet["ttft_ms"] == out["ttft_ms"]
    _, spec = _cli(["simulate", "WL", "--spec-k", "3", "--requests", "300", "--json"], tmp_path)
    assert spec["tpot_ms"]["p50"] < 0.7 * out["tpot_ms"]["p50"]
    _, off = _cli(["simulate", "WL", "--rate", "inf", "--requests", "300", "--json"], tmp_path)
    assert off["arrival"] == "inf" and off["output_tok_s"] > out["output_tok_s"]
    _, closed = _cli(["simulate", "WL", "--concurrency", "8", "--requests", "300", "--json"], tmp_path)
    assert closed["arrival"] == "closed"


def test_cli_simulate_human_and_bad_flags(tmp_path):
    res, _ = _cli(["simulate", "WL", "--requests", "200"], tmp_path)
    assert res.exit_code == 0 and "SLO attainment" in res.output
    for bad in (["--tp", "abc"], ["--bogus"], ["--rate", "-1"], ["--rate", "1", "--concurrency", "2"],
                ["--kv-dtype", "fp4"], ["--batch-cap", "0"]):
        res, _ = _cli(["simulate", "WL", *bad], tmp_path)
        assert res.exit_code == 2, (bad, res.output)
        assert "Error:" in res.output and "Traceback" not in res.output


class _FixedSteps:
    """A step cost a test can follow by hand: every step that carries prompt tokens takes
    ``prompt_s``, every decode-only step ``decode_s``, whatever the batch or context."""

    speculation = None
    has_sliding_window = False
    closed_form_ok = False      # no closed form: the simulator times every step
    request_overhead_s = 0.0
    tokens_per_step = 1.0
    verify_tokens_per_seq = 1

    def __init__(self, prompt_s: float, decode_s: float):
        self.prompt_s, self.decode_s = prompt_s, decode_s
        self.memory = type("Pool", (), {"kv_pool_tokens": 1_000_000})()

    def step_time_s(self, n_dec, ctx_sum, ptoks=0, ppairs=0.0, pkv=0.0) -> float:
        return self.prompt_s if ptoks else self.decode_s


def test_closed_loop_next_request_misses_the_step_already_scheduled():
    """A closed-loop client's next request cannot ride in the step that starts the moment its last
    one finishes: that step is scheduled before the last token has even reached the client (vLLM
    V1's EngineCoreProc.run_busy_loop reads its input queue, then runs the step; the finished
    request's output goes out through the output queue, the next request comes back through the
    API server into the input queue). Two clients, prompt steps P = 100 ms, decode steps
    D = 10 ms, 10 decode steps a request, budget for every prompt at once:

    A sends at 0: its prompt step [0, P]; B sends at 5 ms, inside it: its prompt rides in the next
    step with A's first decode, [P, 2P]. A's 10th decode ends at 2P + 9D = 290 ms, B's at 300 ms.
    A's next request (2) misses the step [290, 300] (B's last decode alone) and is prefilled in
    [300, 400]: TTFT = D + P = 110 ms. B's next (3), sent at 300 ms, misses that step too and
    waits through A's prompt step: [400, 500], TTFT = 2P = 200 ms. (Joining the step in flight,
    as the simulator did before, gave 100 ms to both: no client ever waited for another's prompt.)"""
    P, D = 0.100, 0.010
    req = Requests.uniform(4, 100, 11, arrival_s=np.array([0.0, 0.005, 0.0, 0.0]))
    res = simulate(_FixedSteps(P, D), req, SimConfig(8, chunk_tokens=8192), arrival="closed", concurrency=2,
                   warmup_frac=0.0)
    np.testing.assert_allclose(res.arrival_s, [0.0, 0.005, 2 * P + 9 * D, 2 * P + 10 * D], atol=1e-12)
    np.testing.assert_allclose(res.ttft_s, [P, 2 * P - 0.005, D + P, 2 * P], atol=1e-12)
