"""One config's verification (``optimizer.verify``) piece by piece, on hand-derived figures (issue 25):
the sizing arithmetic, the fresh draws' search (``DrawSet``) on fake draws whose goodput is known,
robust sizing for both objectives, what ``verify`` asks of the goodput bisection, the request
counts, the seeds and the records. Each test runs in milliseconds (the fake engine of
``tests/race_fakes.py`` stands in for the simulator where one is not the point)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from kvtune.costmodel.goodput import default_n_requests
from kvtune.costmodel.simulate import SimConfig
from kvtune.optimizer import verify as vf
from kvtune.optimizer.verify import (DRAW_BATCH, DRAWS, MAX_SIM_REQUESTS, REL_TOL, STEP_DOWN, Draws, DrawSet,
                                     Verification)

from race_fakes import MEETS, MISSES, FakeRunner, make_ctx, params, patch_simulation


# ---- sizing ------------------------------------------------------------------------------------------------------
def test_sized_min_cost_by_hand():
    ctx = make_ctx(rate=30, max_nodes=2)
    v = vf._sized(ctx, params(2, 64), 7.0, 11, 1500, nominal=8.0)
    # ceil(30 / 7) = 5 replicas x 2 GPUs = 10 GPUs on 2 nodes, $2/GPU-h
    assert (v.replicas, v.gpus, v.nodes, v.usd_per_hour) == (5, 10, 2, 20.0)
    assert v.feasible and v.reason == "" and v.simulations == 11 and v.sim_requests == 1500
    assert v.goodput_req_s == 35.0 and v.per_replica_goodput_req_s == 7.0
    assert v.fleet_rate_req_s == 30 and v.load_per_replica_req_s == 6.0
    assert v.output_tok_s_at_goodput == 35.0 * 200
    assert v.nominal_per_replica_goodput_req_s == 8.0 and v.draws is None and not v.robust
    # an exact division needs no extra replica (30 / 10 = 3, not 4 from a rounding)
    assert vf._sized(ctx, params(1), 10.0, 0, 1, nominal=10.0).replicas == 3
    assert vf._sized(ctx, params(1), 30.0 / 7, 0, 1, nominal=1.0).replicas == 7
    # at least ``replicas`` when given (robust sizing)
    r = vf._sized(ctx, params(1), 10.0, 0, 1, nominal=10.0, replicas=4)
    assert (r.replicas, r.gpus, r.load_per_replica_req_s, r.goodput_req_s) == (4, 4, 7.5, 40.0)


def test_sized_over_the_node_budget_says_why():
    ctx = make_ctx(rate=30, max_nodes=1)
    v = vf._sized(ctx, params(2, 64, "fp8", 2), 3.0, 0, 1, nominal=3.0)
    assert (v.replicas, v.gpus, v.nodes, v.feasible) == (10, 20, 3, False)
    assert v.reason == ("TP2 fp8 cap 64 chunk 1024 k 2 serves 3 req/s per replica (simulated): 10 x 2 GPUs = 20 GPUs "
                        "on 3 nodes, max_nodes is 1")
    assert vf._sized(ctx, params(1), 3.75, 0, 1, nominal=1.0).feasible       # 8 GPUs: one node exactly


def test_sized_max_goodput_every_replica_of_the_budget():
    ctx = make_ctx("max_goodput", rate=100, max_nodes=2)
    v = vf._sized(ctx, params(2), 5.0, 0, 1, nominal=5.0)
    # 16 GPUs / 2 = 8 replicas, 40 req/s goodput < the 100 target: simulated at the goodput
    assert (v.replicas, v.gpus, v.nodes, v.goodput_req_s, v.fleet_rate_req_s, v.load_per_replica_req_s) == (
        8, 16, 2, 40.0, 40.0, 5.0)
    assert v.feasible
    fast = vf._sized(ctx, params(2), 25.0, 0, 1, nominal=25.0)     # 200 req/s > 100: simulated at the target
    assert (fast.fleet_rate_req_s, fast.load_per_replica_req_s, fast.goodput_req_s) == (100.0, 12.5, 200.0)
    import dataclasses
    free = dataclasses.replace(make_ctx("max_goodput"), rate_req_s=math.nan)   # no target: at the goodput
    w = vf._sized(free, params(1), 5.0, 0, 1, nominal=5.0)
    assert (w.replicas, w.fleet_rate_req_s, w.load_per_replica_req_s) == (8, 40.0, 5.0)


def test_label_reads_as_a_user_would():
    assert vf._label(params(8, 512, "fp8", 2, 4096)) == "TP8 fp8 cap 512 chunk 4096 k 2"
    assert vf._label(params(1, 16)) == "TP1 bf16 cap 16 chunk 1024"
    assert vf._label(dict(params(4), pp=2)) == "TP4 x PP2 bf16 cap 16 chunk 1024"
    assert vf._label(dict(params(4), pp=1)) == "TP4 bf16 cap 16 chunk 1024"
    assert vf._label(dict(params(4), layout="tp8-pp2", pp=2)) == "tp8-pp2 bf16 cap 16 chunk 1024"


# ---- request counts, seeds, simulator config ---------------------------------------------------------------------
def test_request_counts():
    # goodput's default: >= 100 misses allowed in the measured 90% (a 0.9 target: 100 / 0.1 / 0.9 = 1,112)
    assert vf.sim_requests(0.9, 1) == default_n_requests(0.9, max_concurrency=1) == 1112
    assert vf.sim_requests(0.9, 300) == 1500              # 5 runs per slot
    assert vf.sim_requests(0.99, 1) == MAX_SIM_REQUESTS   # capped for simulation time
    ctx = make_ctx()
    p = params(1, 64)
    pool = ctx.fitting_step(p).memory.kv_pool_tokens
    assert vf.slots(ctx, p) == min(64, int(pool // 1200)) == 64
    assert vf.slots(ctx, params(1, 100000)) == int(pool // 1200)
    assert vf.config_requests(ctx, p) == vf.sim_requests(0.9, 64)
    assert vf.config_requests(ctx, params(1, 100000)) == min(default_n_requests(0.9, max_concurrency=int(pool // 1200)),
                                                             MAX_SIM_REQUESTS)


def test_draw_seeds_after_the_workload_seed():
    def ctx(trace, spec):
        return SimpleNamespace(spec=SimpleNamespace(workload=SimpleNamespace(trace=trace), speculative=spec),
                               workload_seed=5)
    assert vf.draw_seeds(ctx(None, None)) == list(range(6, 6 + DRAWS))
    assert vf.draw_seeds(ctx("t.jsonl", None)) == [6]                 # a replayed trace: one draw
    assert vf.draw_seeds(ctx("t.jsonl", object())) == list(range(6, 6 + DRAWS))   # speculation still draws
    assert vf.draw_seeds(ctx(None, object())) == list(range(6, 6 + DRAWS))
    assert DRAWS == 19


def test_sim_config_is_the_engines_with_sglang_prefill_first_under_ngram():
    ctx = make_ctx()
    got = vf.sim_config(ctx, params(1, 64, chunk=2048))
    assert got == ctx.engine.sim_config(64, 2048) and got.batch_cap == 64 and got.chunk_tokens == 2048
    assert not got.prefill_first

    def fake(engine, method):
        return SimpleNamespace(engine=SimpleNamespace(engine=engine, sim_config=ctx.engine.sim_config),
                               spec=SimpleNamespace(speculative=SimpleNamespace(method=method) if method else None))
    assert vf.sim_config(fake("sglang", "ngram"), params(1, 64, k=2)).prefill_first
    assert vf.sim_config(fake("sglang", "draft"), params(1, 64, k=2)).prefill_first
    assert not vf.sim_config(fake("sglang", "eagle"), params(1, 64, k=2)).prefill_first
    assert not vf.sim_config(fake("sglang", "ngram"), params(1, 64, k=0)).prefill_first
    assert not vf.sim_config(fake("sglang", None), params(1, 64)).prefill_first
    assert not vf.sim_config(fake("vllm", "ngram"), params(1, 64, k=2)).prefill_first
    assert vf.sim_config(fake("sglang", "ngram"), params(1, 32, k=2, chunk=512)).batch_cap == 32
    bare = vf.sim_config(SimpleNamespace(engine=None), params(1, 32, chunk=512))
    assert bare == SimConfig(batch_cap=32, chunk_tokens=512)


# ---- records -----------------------------------------------------------------------------------------------------
def test_draws_record():
    d = Draws((1, 2, 3), 500, 4.5, 3.0, (0.9, 0.95, 1.0), 7)
    assert d.coverage == 0.75
    j = d.to_json()
    assert j == {"seeds": [1, 2, 3], "n_requests": 500, "goodput_min_req_s": 4.5, "load_req_s": 3.0,
                 "attainment": [0.9, 0.95, 1.0], "attainment_mean": pytest.approx(0.95), "attainment_min": 0.9,
                 "attainment_max": 1.0, "coverage": 0.75, "simulations": 7}
    assert Draws.from_json(j) == d


def test_verification_record():
    miss = Verification(params(), 0.0, 3, False, "slow")
    assert miss.to_json() == {"params": params(), "per_replica_goodput_req_s": 0.0, "simulations": 3,
                              "feasible": False, "reason": "slow"}
    d = Draws((1,), 5, None, 2.0, (0.9,), 1)
    v = Verification(params(), 2.0, 3, True, replicas=2, gpus=2, draws=d, ttft_ms={"p50": 1.0})
    j = v.to_json()
    assert j["draws"] == d.to_json() and j["replicas"] == 2 and j["ttft_ms"] == {"p50": 1.0} and len(j) == 21
    assert Verification.from_json(j) == v and Verification.from_json(j).robust
    assert Verification.from_json(dict(j, draws=None)).draws is None


def test_pct_reads_the_summary_and_null_is_nan():
    got = vf._pct({"ttft_ms": {"p50": 1, "p90": None, "p99": 3.5, "mean": 2}}, "ttft_ms")
    assert got["p50"] == 1.0 and math.isnan(got["p90"]) and got["p99"] == 3.5 and got["mean"] == 2.0
    assert list(got) == ["p50", "p90", "p99", "mean"]
    empty = vf._pct({}, "tpot_ms")
    assert set(empty) == {"p50", "p90", "p99", "mean"} and all(math.isnan(x) for x in empty.values())


# ---- DrawSet: draws whose goodput is known -----------------------------------------------------------------------
class Fake:
    """attainment(seed, rate) = MEETS at rates <= goodput[seed], else MISSES; calls recorded."""

    def __init__(self, goodput: dict[int, float], late: dict[int, float] | None = None):
        self.g, self.late, self.calls, self.batches = goodput, late or {}, [], []

    def attain(self, seed, rate):
        self.calls.append((seed, rate))
        g = self.g[seed]
        if seed in self.late and rate > self.late[seed]:   # against the trend: misses at this rate and above
            return MISSES
        return MEETS if rate <= g else MISSES

    def many(self, pairs):
        self.batches.append(list(pairs))
        return [self.attain(s, r) for s, r in pairs]


def test_attainment_is_simulated_once_per_seed_and_rate():
    f = Fake({1: 10.0})
    d = DrawSet(f.attain, 0.9)
    assert d.attainment(1, 5.0) == MEETS and d.attainment(1, 5.0) == MEETS and d.sims == 1
    assert d.meets(1, 10.0) and not d.meets(1, 10.5) and d.sims == 3 and len(f.calls) == 3
    assert DrawSet(f.attain, MEETS).meets(1, 1.0)          # at the target counts as meeting


def test_prefetch_runs_a_batch_only_of_what_is_new_and_only_two_or_more():
    f = Fake({1: 10.0, 2: 10.0, 3: 10.0})
    d = DrawSet(f.attain, 0.9, f.many)
    d.prefetch([(1, 5.0)])                  # one alone: left to attainment()
    assert f.batches == [] and d.sims == 0
    d.attainment(1, 5.0)
    d.prefetch([(1, 5.0), (2, 5.0), (2, 5.0), (3, 20.0)])
    assert f.batches == [[(2, 5.0), (3, 20.0)]] and d.sims == 3
    assert d.seen[(3, 20.0)] == MISSES
    DrawSet(f.attain, 0.9).prefetch([(1, 1.0), (2, 1.0)])   # no batch runner: nothing run ahead
    assert len(f.batches) == 1


def test_goodput_below_steps_down_then_bisects_to_the_tolerance():
    f = Fake({1: 90.0})
    d = DrawSet(f.attain, 0.9)
    g = d.goodput_below(1, 100.0)
    assert 90.0 / (1 + REL_TOL) <= g <= 90.0 and d.meets(1, g)
    # the walk: 97, 94.09, 91.27 miss, 88.53 meets; then geometric middles between the last miss and hit
    assert [r for _, r in f.calls[:4]] == pytest.approx([97.0, 97.0 * STEP_DOWN, 97.0 * STEP_DOWN ** 2,
                                                         97.0 * STEP_DOWN ** 3])
    mid = math.sqrt(97.0 * STEP_DOWN ** 3 * 97.0 * STEP_DOWN ** 2)
    assert f.calls[4][1] == pytest.approx(mid)
    # below 80% of the miss the steps are 0.8 apart
    f2 = Fake({1: 10.0})
    g2 = DrawSet(f2.attain, 0.9).goodput_below(1, 100.0)
    assert 10.0 / (1 + REL_TOL) <= g2 <= 10.0
    rates = [r for _, r in f2.calls]
    walk = rates[:rates.index(next(r for r in rates if r <= 10.0)) + 1]
    assert all(b / a == pytest.approx(STEP_DOWN) for a, b in zip(walk, walk[1:]) if a > 80.0)
    assert all(b / a == pytest.approx(0.8) for a, b in zip(walk, walk[1:]) if a <= 80.0)
    # nothing down to a thousandth of the rate: 0
    assert DrawSet(Fake({1: 0.05}).attain, 0.9).goodput_below(1, 100.0) == 0.0
    g3 = DrawSet(Fake({1: 0.2}).attain, 0.9).goodput_below(1, 100.0)
    assert 0.2 / (1 + REL_TOL) <= g3 <= 0.2


def test_least_goodput_bisects_the_worst_and_retries_the_rest():
    f = Fake({1: 50.0, 2: 40.0, 3: 100.0, 4: 45.0})
    d = DrawSet(f.attain, 0.9, f.many)
    g = d.least_goodput([1, 2, 3, 4], 60.0)
    assert 40.0 / (1 + REL_TOL) <= g <= 40.0
    assert f.batches[0] == [(1, 60.0), (2, 60.0), (3, 60.0), (4, 60.0)]
    assert (3, g) not in f.calls          # met at 60: not simulated again lower
    # every draw meets at the start: the start
    assert DrawSet(Fake({1: 9.0, 2: 9.0}).attain, 0.9).least_goodput([1, 2], 8.0) == 8.0
    # goodputs below 1 req/s (a slow model): still bisected down to the least
    small = Fake({1: 0.5, 2: 0.4})
    g = DrawSet(small.attain, 0.9, small.many).least_goodput([1, 2], 0.6)
    assert 0.4 / (1 + REL_TOL) <= g <= 0.4
    # a draw that misses even at a trickle: 0
    assert DrawSet(Fake({1: 5.0, 2: 0.0}).attain, 0.9).least_goodput([1, 2], 6.0) == 0.0


def test_replicas_for_adds_replicas_until_every_draw_meets():
    f = Fake({1: 10.0, 2: 8.0, 3: 12.0})
    d = DrawSet(f.attain, 0.9, f.many)
    # rate 30: 3 replicas load 10 (draw 2 misses), 4 replicas load 7.5 (all meet)
    assert d.replicas_for([1, 2, 3], 3, 8, lambda r: 30.0 / r) == 4
    # draws in batches of DRAW_BATCH, a count given up at its first miss
    assert f.batches[0] == [(1, 10.0), (2, 10.0)] and DRAW_BATCH == 2
    assert (3, 10.0) not in f.calls
    assert d.replicas_for([1, 2, 3], 3, 3, lambda r: 30.0 / r) is None
    assert DrawSet(f.attain, 0.9).replicas_for([1, 3], 3, 3, lambda r: 30.0 / r) == 3
    assert DrawSet(f.attain, 0.9).replicas_for([3], 5, 4, lambda r: 30.0 / r) is None


def test_goodput_at_load_lowers_the_goodput_for_a_draw_late_at_the_load():
    f = Fake({1: 10.0, 2: 12.0})
    d = DrawSet(f.attain, 0.9, f.many)
    g, load = d.goodput_at_load([1, 2], 12.0, lambda g: g / 2)
    assert 10.0 / (1 + REL_TOL) <= g <= 10.0 and load == g / 2
    # draw 2 misses above 3 req/s (against its trend): with the load at twice the goodput it is late
    # there, but the goodput below that load is still above 2, so nothing moves
    f2 = Fake({1: 10.0, 2: 12.0}, late={2: 3.0})
    g2, load2 = DrawSet(f2.attain, 0.9, f2.many).goodput_at_load([1, 2], 2.0, lambda g: g * 2)
    assert (g2, load2) == (2.0, 4.0)     # its own goodput below the load (~3) is above 2: the goodput stays
    f3 = Fake({1: 10.0, 2: 12.0}, late={2: 3.0})
    g3, load3 = DrawSet(f3.attain, 0.9, f3.many).goodput_at_load([1, 2], 8.0, lambda g: g / 2)
    assert 3.0 / (1 + REL_TOL) <= g3 <= 3.0 and load3 == g3 / 2
    z = Fake({1: 0.0})
    assert DrawSet(z.attain, 0.9).goodput_at_load([1], 5.0, lambda g: g + 1.0) == (0.0, 0.0)   # no goodput: no load


# ---- robust ------------------------------------------------------------------------------------------------------
def _robust_setup(monkeypatch, objective="min_cost", factor=None, g=16.0, **kw):
    ctx = make_ctx(objective, **kw)
    p = params(1, 64, "fp8")
    run = FakeRunner(ctx, {"tp1-b64-fp8-k0-c1024": g}, factor=factor)
    at = patch_simulation(monkeypatch, run)
    return ctx, p, run, at


def test_robust_min_cost_adds_the_replicas_a_fresh_draw_needs(monkeypatch):
    # draw 0 serves 16 req/s per replica: 2 replicas for 30; fresh draw 9 serves 0.9 x 16 = 14.4 < 15, so 3
    ctx, p, run, at = _robust_setup(monkeypatch, factor={9: 0.9})
    v = vf._sized(ctx, p, 16.0, 4, 1000, nominal=16.0)
    r = vf.robust(ctx, v)
    assert (r.replicas, r.gpus, r.usd_per_hour, r.feasible) == (3, 3, 6.0, True)
    assert r.per_replica_goodput_req_s == 16.0 and r.nominal_per_replica_goodput_req_s == 16.0
    assert r.load_per_replica_req_s == 10.0 and r.goodput_req_s == 48.0
    d = r.draws
    assert d.seeds == tuple(range(1, 1 + DRAWS)) and d.n_requests == 1000 and d.load_req_s == 10.0
    assert r.sim_requests == 1000                       # sized on the draws' request count
    assert d.goodput_min_req_s is None and d.attainment == (MEETS,) * DRAWS
    # the pick at its load: the first fresh draw on 3 replicas of 1,000 requests at the target rate
    assert at == [(30.0, 3, 1000, 1)]
    assert (r.slo_attainment, r.output_tok_s, r.preemptions) == (MEETS, 1234.0, 3)
    assert r.ttft_ms == {"p50": 100.0, "p90": 200.0, "p99": 300.0, "mean": 120.0} and r.tpot_ms["mean"] == 25.0
    assert r.simulations == 4 + d.simulations and d.simulations >= DRAWS + 1
    assert vf.robust(ctx, r) is r                       # robust once
    miss = Verification(p, 0.0, 3, False, "x")
    assert vf.robust(ctx, miss) is miss


def test_robust_min_cost_tries_the_given_order_first_and_gives_up_past_the_cap(monkeypatch):
    ctx, p, run, at = _robust_setup(monkeypatch, factor={9: 0.5})
    v = vf._sized(ctx, p, 16.0, 4, 1000, nominal=16.0)
    tried = []
    r = vf.robust(ctx, v, lambda pairs: tried.append(pairs) or [run.draw(p, rate, s) for s, rate in pairs],
                  max_replicas=3, order=[9, 30])
    assert tried[0] == [(9, 15.0), (1, 15.0)]           # the order's seeds first (30 is no fresh draw here)
    assert r.feasible is False and r.draws is None and r.replicas == 2
    assert r.reason == "TP1 fp8 cap 64 chunk 1024 misses on a fresh draw of 1,000 requests with up to 3 replicas, " \
                       "the most that could beat the best so far"
    assert r.simulations > 4 and at == []
    # without a cap, up to every replica of the node: 16 x 0.5 = 8 >= 30 / 4
    assert vf.robust(ctx, v).replicas == 4


def test_robust_min_cost_beyond_the_node_says_so(monkeypatch):
    ctx, p, run, at = _robust_setup(monkeypatch, factor={2: 0.1})
    v = vf._sized(ctx, p, 16.0, 4, 1000, nominal=16.0)
    r = vf.robust(ctx, v)
    assert r.feasible is False and r.reason == (
        f"TP1 fp8 cap 64 chunk 1024 meets the SLOs on every one of {DRAWS} fresh draws of 1,000 requests only beyond "
        "8 replicas (8 GPUs, max_nodes 1); the workload's own draw alone gives 16 req/s per replica")
    assert r.simulations > 4                            # the fresh draws it ran are counted
    # a nominal sized beyond the node: robust checks from its own replicas
    big = vf._sized(ctx, params(1, 64, "fp8"), 3.0, 0, 1000, nominal=3.0)     # 10 replicas
    rb = vf.robust(ctx, big)
    assert rb.replicas == 10 and rb.feasible is False and "only beyond 10 replicas (8 GPUs, max_nodes 1)" in rb.reason


def test_robust_max_goodput_takes_the_least_goodput_over_the_draws(monkeypatch):
    ctx, p, run, at = _robust_setup(monkeypatch, "max_goodput", factor={4: 0.8}, rate=1000)
    v = vf._sized(ctx, p, 16.0, 4, 1000, nominal=16.0)
    assert v.replicas == 8 and v.goodput_req_s == 128.0
    r = vf.robust(ctx, v)
    least = r.draws.goodput_min_req_s
    assert 12.8 / (1 + REL_TOL) <= least <= 12.8 and r.per_replica_goodput_req_s == least
    assert r.replicas == 8 and r.goodput_req_s == pytest.approx(8 * least)
    assert r.nominal_per_replica_goodput_req_s == 16.0                      # the race still ranks on draw 0
    assert r.load_per_replica_req_s == pytest.approx(least) and r.draws.load_req_s == pytest.approx(least)
    assert all(a == MEETS for a in r.draws.attainment)
    assert at == [(pytest.approx(8 * least), 8, 1000, 1)]
    assert r.sim_requests == 1000 and r.simulations == 4 + r.draws.simulations   # sized on the draws' request count
    # a fresh draw that misses even at a trickle: not feasible (False, as the JSON answer says), with the reason
    ctx2, p2, run2, _ = _robust_setup(monkeypatch, "max_goodput", factor={3: 0.0}, rate=1000)
    r2 = vf.robust(ctx2, vf._sized(ctx2, p2, 16.0, 4, 1000, nominal=16.0))
    assert r2.feasible is False and r2.reason == ("misses the SLO attainment target 0.9 on a fresh draw of 1,000 requests "
                                             "even at a trickle") and r2.simulations > 4


def test_robust_config_starts_from_the_nominal_goodput(monkeypatch):
    ctx, p, run, at = _robust_setup(monkeypatch)
    r = vf.robust_config(ctx, p, 16.0, 1000)
    assert (r.replicas, r.usd_per_hour, r.per_replica_goodput_req_s) == (2, 4.0, 16.0)
    assert r.simulations == r.draws.simulations and r.draws.n_requests == 1000 and at == [(30.0, 2, 1000, 1)]


# ---- verify: what it asks of the goodput bisection ---------------------------------------------------------------
def test_verify_bisects_on_draw_0_to_the_tolerance_and_sizes(monkeypatch):
    asked = {}

    def fake_goodput(step, make, config, attainment, **kw):
        asked.update(kw, attainment=attainment, config=config, step=step)
        req = make(2.0, 10, 7)
        asked["made"] = (len(req.input_tokens), float(req.input_tokens.mean()))
        return SimpleNamespace(goodput_req_s=12.0, iterations=9, reason="")
    monkeypatch.setattr(vf, "goodput", fake_goodput)
    ctx = make_ctx()
    p = params(1, 64)
    v = vf.verify(ctx, p, 64, guess_req_s=11.0)
    assert asked["n_requests"] == vf.sim_requests(0.9, 64) and asked["seed"] == ctx.workload_seed == 0
    assert asked["rel_tol"] == REL_TOL and asked["guess_req_s"] == 11.0 and asked["attainment"] == 0.9
    assert asked["config"] == vf.sim_config(ctx, p) and asked["step"] is ctx.fitting_step(p)
    assert asked["made"] == (10, 1000.0)
    assert (v.per_replica_goodput_req_s, v.simulations, v.replicas, v.usd_per_hour) == (12.0, 9, 3, 6.0)
    assert v.sim_requests == vf.sim_requests(0.9, 64) and v.nominal_per_replica_goodput_req_s == 12.0

    monkeypatch.setattr(vf, "goodput", lambda *a, **k: SimpleNamespace(goodput_req_s=0.0, iterations=2, reason=""))
    miss = vf.verify(ctx, p, 64)
    assert miss == Verification(p, 0.0, 2, False, "simulated SLO attainment misses the target even at a trickle")
    monkeypatch.setattr(vf, "goodput", lambda *a, **k: SimpleNamespace(goodput_req_s=0.0, iterations=2, reason="TTFT"))
    assert vf.verify(ctx, p, 64).reason == "TTFT"


def test_verify_config_counts_its_slots_and_guesses_the_screen(monkeypatch):
    from kvtune.optimizer.search import evaluate
    seen = []
    monkeypatch.setattr(vf, "verify", lambda ctx, p, ob, guess=None: seen.append((ob, guess)) or "v")
    ctx = make_ctx()
    assert vf.verify_config(ctx, params(1, 64)) == "v"
    assert seen == [(64, evaluate(ctx, params(1, 64)).per_replica_goodput_req_s)]


def test_draw_attainment_and_simulate_at_on_the_real_simulator():
    """At a trickle every request meets; far beyond the capacity the queue grows and attainment falls;
    ``simulate_at`` splits the fleet rate over the replicas as ``kvtune simulate --replicas`` does."""
    ctx = make_ctx()
    p = params(1, 64)
    assert vf.draw_attainment(ctx, p, 0.5, 100, 3) == 1.0
    over = vf.draw_attainment(ctx, p, 400.0, 200, 3)
    assert over < 0.9 and over == vf.draw_attainment(ctx, p, 400.0, 200, 3)
    one = vf.simulate_at(ctx, p, 0.5, 1, 100, 3)
    two = vf.simulate_at(ctx, p, 1.0, 2, 100, 3)
    assert one.slo_attainment == 1.0 and two.slo_attainment == 1.0
    assert one.summary()["ttft_ms"]["p50"] > 0


def test_a_fake_runner_race_robust_stage_counts(monkeypatch):
    """``robust`` with a batch runner: the runner's batches cover every fresh draw at the load once."""
    ctx, p, run, at = _robust_setup(monkeypatch)
    v = vf._sized(ctx, p, 16.0, 4, 1000, nominal=16.0)
    pairs_seen = []

    def many(pairs):
        pairs_seen.extend(pairs)
        return [run.draw(p, rate, s) for s, rate in pairs]
    r = vf.robust(ctx, v, many)
    # in batches of two; the 19th draw, a batch of one, runs alone
    assert sorted(pairs_seen) == [(s, 15.0) for s in range(1, DRAWS)]
    assert r.draws.simulations == DRAWS + 1 and r.simulations == 4 + DRAWS + 1


def test_every_draw_at_the_load_runs_as_one_batch_even_below_one_req_s():
    """max_goodput on a slow model (goodputs below 1 req/s): the draws at the deployment's load are
    still handed to the batch runner together (the race runs them side by side)."""
    f = Fake({1: 0.5, 2: 0.6, 3: 0.7})
    g, load = DrawSet(f.attain, 0.9, f.many).goodput_at_load([1, 2, 3], 0.4, lambda g: g / 2)
    assert (g, load) == (0.4, 0.2)
    assert [(1, 0.2), (2, 0.2), (3, 0.2)] in f.batches and len(f.calls) == 6


def test_robust_below_one_req_s_per_replica(monkeypatch):
    """A slow config (0.8 req/s per replica, 2 replicas for 1.5 req/s) is made robust like any other."""
    ctx, p, run, at = _robust_setup(monkeypatch, g=0.8, rate=1.5)
    r = vf.robust(ctx, vf._sized(ctx, p, 0.8, 4, 1000, nominal=0.8))
    assert r.robust and r.replicas == 2 and r.draws.load_req_s == 0.75 and at == [(1.5, 2, 1000, 1)]


def test_a_draw_late_at_the_load_with_no_goodput_below_it_leaves_no_load():
    """Draw 2 meets only at exactly 2 req/s (against any trend): at the load 2 x 2 + 1 = 5 it misses,
    and below 5 it meets nowhere, so the goodput is 0 and there is no load (0, not load_for(0) = 1)."""
    def attain(seed, rate):
        return MEETS if seed == 1 or rate == 2.0 else MISSES
    assert DrawSet(attain, 0.9).goodput_at_load([1, 2], 2.0, lambda g: 2 * g + 1.0) == (0.0, 0.0)


class Graded(Fake):
    """Like ``Fake``, but a draw's attainment falls with how far past its goodput it is run (0.9 x G / rate),
    so of several misses at one rate the one with the lowest goodput is the worst."""

    def attain(self, seed, rate):
        self.calls.append((seed, rate))
        g = self.g[seed]
        return MEETS if rate <= g else 0.9 * g / rate


def test_least_goodput_bisects_the_lowest_attainment_first_and_retries_the_rest_as_one_batch():
    """Draws of goodput 0.5, 0.4 and 0.45 req/s (a slow model), all missing at 0.6: draw 2 misses worst
    (attainment 0.6 against 0.75 and 0.675) and is bisected alone; draws 1 and 3 are then tried at its goodput
    together, in one batch, and meet there, so neither is simulated at any other rate."""
    f = Graded({1: 0.5, 2: 0.4, 3: 0.45})
    g = DrawSet(f.attain, 0.9, f.many).least_goodput([1, 2, 3], 0.6)
    assert 0.4 / (1 + REL_TOL) <= g <= 0.4
    assert [(s, r) for s, r in f.calls if s != 2] == [(1, 0.6), (3, 0.6), (1, g), (3, g)]
    assert f.batches == [[(1, 0.6), (2, 0.6), (3, 0.6)], [(1, g), (3, g)]]


def test_a_draw_that_misses_at_a_trickle_ends_the_search_without_simulating_the_rest_at_zero():
    """Draw 1 misses at every rate: the least goodput is 0, and the other draws that missed at the start
    are not simulated again (there is no rate to try them at), nor is any draw simulated at 0 req/s."""
    for search in ("least", "at_load"):
        f = Fake({1: 0.0, 2: 4.0, 3: 3.0})
        d = DrawSet(f.attain, 0.9, f.many)
        got = d.least_goodput([1, 2, 3], 6.0) if search == "least" else d.goodput_at_load([1, 2, 3], 6.0, lambda g: g / 2)
        assert got == (0.0 if search == "least" else (0.0, 0.0))
        assert [(s, r) for s, r in f.calls if s != 1] == [(2, 6.0), (3, 6.0)]
        assert all(r > 0 for _, r in f.calls) and d.sims == len(f.calls)


def test_goodput_at_load_corrects_a_draw_late_at_the_load_at_most_len_seeds_plus_one_times():
    """One draw (seeds [1]) that meets only in bands, against the trend (below 0.01, 0.05-0.09, 0.15-0.20,
    0.40-0.45 and from 1 req/s), the deployment's load half its goodput. From 1 req/s: the load 0.5 misses, so
    the goodput drops to the band below it, 0.45 (to the tolerance); its load 0.225 misses too: 0.20, load 0.10.
    That is len(seeds) + 1 = 2 corrections, the most it makes, so 0.20 at 0.10 is the answer (the load misses
    again, but the search stops there), in goodputs below 1 req/s like any other."""
    bands = [(0.0, 0.01), (0.05, 0.09), (0.15, 0.20), (0.40, 0.45), (1.0, math.inf)]

    def attain(seed, rate):
        return MEETS if any(lo <= rate <= hi for lo, hi in bands) else MISSES
    g, load = DrawSet(attain, 0.9).goodput_at_load([1], 1.0, lambda g: g / 2)
    assert 0.20 / (1 + REL_TOL) <= g <= 0.20 and load == g / 2


def test_with_speculation_a_draw_and_the_pick_at_its_load_follow_the_seed():
    """Speculative acceptance is sampled per verify pass from the simulation's seed: a fresh draw ``s`` runs
    its requests (drawn with ``s``) and its acceptance with ``s``, as ``kvtune simulate --seed s`` does, not
    with seed 0; on EAGLE3 at k = 2 near the capacity that moves the attainment and the TPOT."""
    from kvtune.costmodel.simulate import simulate, simulate_fleet
    ctx = make_ctx(speculative={"method": "eagle3", "acceptance": 0.6, "draft_cost": 0.05,
                                "draft_model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"}, spec_k=2)
    p = params(1, 64, "bf16", 2)
    step, cfg = ctx.fitting_step(p), vf.sim_config(ctx, p)

    def one(rate, seed):
        return simulate(step, ctx.spec.requests(100, 3, rate_req_s=rate), cfg, "trace", seed=seed).slo_attainment

    def figures(res):   # the summary less its wall time
        return {k: v for k, v in res.summary().items() if k != "sim_wall_s"}

    def fleet(rate, seed):
        return figures(simulate_fleet(step, vf._maker(ctx), cfg, 2, rate, 100, "trace", None, seed))
    rates = (30.0, 35.0, 40.0, 50.0)
    got = [vf.draw_attainment(ctx, p, rate, 100, 3) for rate in rates]
    assert got == [one(rate, 3) for rate in rates] and got != [one(rate, 0) for rate in rates]
    at = [figures(vf.simulate_at(ctx, p, 2 * rate, 2, 100, 3)) for rate in (10.0, 15.0, 20.0)]
    assert at == [fleet(2 * rate, 3) for rate in (10.0, 15.0, 20.0)]
    assert at != [fleet(2 * rate, 0) for rate in (10.0, 15.0, 20.0)]


def test_robust_config_that_no_draw_sizes_keeps_its_nominal_goodput(monkeypatch):
    """Every fresh draw of a 16 req/s config serves 1% of it: no count of replicas within the node meets, so
    the answer is not feasible, and still says the nominal goodput it started from (16 req/s per replica)."""
    ctx, p, run, at = _robust_setup(monkeypatch, factor={s: 0.01 for s in range(1, DRAWS + 1)})
    r = vf.robust_config(ctx, p, 16.0, 1000)
    assert r.feasible is False and "only beyond 8 replicas" in r.reason and "gives 16 req/s per replica" in r.reason
    assert r.nominal_per_replica_goodput_req_s == 16.0 and r.per_replica_goodput_req_s == 16.0 and at == []


def test_verify_sizes_a_goodput_below_one_request_per_second(monkeypatch):
    """0.5 req/s per replica (a slow model) is a goodput like any other: 30 / 0.5 = 60 replicas of TP1, 60 GPUs on
    8 nodes, beyond max_nodes 1, so sized but not feasible (not the unsized miss of a zero goodput)."""
    monkeypatch.setattr(vf, "goodput", lambda *a, **k: SimpleNamespace(goodput_req_s=0.5, iterations=7, reason=""))
    v = vf.verify(make_ctx(), params(1, 64), 64)
    assert (v.per_replica_goodput_req_s, v.replicas, v.gpus, v.nodes, v.feasible) == (0.5, 60, 60, 8, False)


def test_verify_config_of_a_one_sequence_batch_operates_one_at_a_time(monkeypatch):
    """A batch cap of 1 admits one sequence at a time: the bisection sizes its requests for a batch of 1."""
    seen = []
    monkeypatch.setattr(vf, "verify", lambda ctx, p, ob, guess=None: seen.append(ob) or "v")
    ctx = make_ctx()
    assert vf.slots(ctx, params(1, 1)) == 1
    vf.verify_config(ctx, params(1, 1))
    assert seen == [1]


def test_robust_max_goodput_below_one_req_s_per_replica(monkeypatch):
    """max_goodput on a slow config: draw 0 serves 0.8 req/s per replica, every fresh draw 0.75 x 0.8 = 0.6: that
    least goodput (to the tolerance) is a goodput, not a miss, and sizes the 8 replicas of the node."""
    ctx, p, run, at = _robust_setup(monkeypatch, "max_goodput", g=0.8, factor={s: 0.75 for s in range(1, DRAWS + 1)},
                                    rate=1000)
    r = vf.robust(ctx, vf._sized(ctx, p, 0.8, 4, 1000, nominal=0.8))
    assert r.feasible is True and r.replicas == 8
    assert 0.6 / (1 + REL_TOL) <= r.per_replica_goodput_req_s <= 0.6 and r.nominal_per_replica_goodput_req_s == 0.8


def test_sized_max_goodput_counts_only_whole_replicas():
    """Three nodes (24 GPUs) and a 16-GPU replica (TP8 x PP2): one whole replica fits, on 16 GPUs over 2 nodes;
    the other 8 GPUs hold no replica (not 1.5 replicas)."""
    ctx = make_ctx("max_goodput", rate=100, max_nodes=3)
    v = vf._sized(ctx, dict(params(8, 64), pp=2), 5.0, 0, 1, nominal=5.0)
    assert (v.replicas, v.gpus, v.nodes, v.goodput_req_s) == (1, 16, 2, 5.0)
    assert isinstance(v.replicas, int) and isinstance(v.gpus, int)
