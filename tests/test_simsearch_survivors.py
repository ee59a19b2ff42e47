"""Unit tests of the race (``optimizer.simsearch``) aimed at the mutants the full mutation run left
alive (bench/mutation-runs/simsearch-all-0727.json): the pool's entry points, when the runner forks,
the probes run ahead, the progress stages, the closest misses, the cost cap's edge, ``consider``
before and after robust sizing, and ``meets_bar``'s short and full probes.

Every expected value is derived by hand from the fake engine's rule (``tests/race_fakes.py``: a
config with goodput G req/s per replica meets every rate <= G) and the docstrings; each test runs
in milliseconds on the fakes (the pool tests fork two processes)."""

from __future__ import annotations

import dataclasses
import math
import os
from types import SimpleNamespace

import numpy as np
import pytest


from kvtune.optimizer.deployment import Aggregated
from kvtune.optimizer import simsearch as ss
from kvtune.optimizer.search import config_key, evaluate
from kvtune.optimizer.simsearch import Work
from kvtune.optimizer.verify import Verification, config_requests

from race_fakes import FakeRunner, make_ctx, params, patch_simulation

# per-replica goodput by hand (req/s), as in tests/test_simsearch_units.py: at 30 req/s the cheapest is tp1 b64 fp8
# (16 req/s: 2 replicas, 2 GPUs, $4/h)
G = {"tp1-b16-bf16-k0-c1024": 5, "tp1-b32-bf16-k0-c1024": 10, "tp1-b64-bf16-k0-c1024": 12,
     "tp1-b16-fp8-k0-c1024": 6, "tp1-b32-fp8-k0-c1024": 11, "tp1-b64-fp8-k0-c1024": 16,
     "tp2-b16-bf16-k0-c1024": 8, "tp2-b32-bf16-k0-c1024": 14, "tp2-b64-bf16-k0-c1024": 20,
     "tp2-b16-fp8-k0-c1024": 9, "tp2-b32-fp8-k0-c1024": 15, "tp2-b64-fp8-k0-c1024": 25}


def _ver(ctx, p: dict, per_replica: float, replicas: int | None = None, robust: bool = False) -> Verification:
    """A verification sized by hand: ceil(rate / per-replica) replicas (or ``replicas``), TP GPUs each, $2/GPU-h."""
    r = replicas or math.ceil(ctx.rate_req_s / per_replica)
    gpus = r * p["tp"]
    draws = None
    if robust:
        from kvtune.optimizer.verify import Draws
        draws = Draws((1,), 100, None, ctx.rate_req_s / r, (0.95,), 1)
    return Verification(p, per_replica, 1, True, replicas=r, gpus=gpus, nodes=1, usd_per_hour=2.0 * gpus,
                        goodput_req_s=per_replica * r, nominal_per_replica_goodput_req_s=per_replica,
                        sim_requests=100, draws=draws)


def _state(ctx, goodput=G, usd_cap: float = math.inf, **kw):
    run = FakeRunner(ctx, goodput, **kw)
    return ss._race_of(ctx)(ctx, run, None, usd_cap), run


# ---- the pool's entry points and when the runner forks ---------------------------------------------------------
def test_pool_entry_points_run_execute_and_evaluate_on_the_pool_context(monkeypatch):
    """What a forked process runs: ``evaluate`` / ``execute`` on the context the runner set before
    forking (called here in this process, so the test sees them run)."""
    ctx = make_ctx()
    monkeypatch.setattr(ss, "_POOL_CTX", ctx)
    p = params(1, 64, "fp8")
    assert ss._pool_screen(p).to_json() == evaluate(ctx, p).to_json()
    seen = []
    monkeypatch.setattr(ss, "execute", lambda c, w: seen.append((c, w)) or {"done": w.key})
    w = Work("probe", Aggregated.from_config(p), 1.0, 10)
    assert ss._pool_execute(w) == {"done": w.key} and seen == [(ctx, w)]


def test_local_runner_forks_for_two_items_or_more_and_screens_on_a_pool_above_64(monkeypatch):
    """``run``: one item to do runs in this process (no fork for nothing to share), two or more on
    the pool; ``screen``: up to 64 configs in this process, more on the pool. Told apart by the
    process id that answers."""
    ctx = make_ctx()
    me = os.getpid()
    monkeypatch.setattr(ss, "execute", lambda c, w: {"pid": os.getpid()})
    monkeypatch.setattr(ss, "evaluate", lambda c, p: os.getpid())
    with ss.LocalRunner(ctx, 2) as run:
        assert run.run([Work("probe", Aggregated.from_config(params()), 1.0, 10)]) == [{"pid": me}] and run._pool is None
        assert run.screen([params()] * 64) == [me] * 64 and run._pool is None
        two = run.run([Work("probe", Aggregated.from_config(params(2)), 1.0, 10), Work("probe", Aggregated.from_config(params(1, 64)), 1.0, 10)])
        assert run._pool is not None and all(r["pid"] != me for r in two)
    with ss.LocalRunner(ctx, 2) as run:
        got = run.screen([params()] * 65)
        assert run._pool is not None and len(got) == 65 and me not in got


# ---- the cost cap's edge -------------------------------------------------------------------------------------
def test_ok_a_price_at_the_cap_within_its_tolerance_counts():
    """``_ok``: at or below the cap, to 1e-12 relative: a $4/h deployment under a cap c with
    c x (1 + 1e-12) == 4.0 exactly is at the cap (the comparison is <=, not <)."""
    ctx = make_ctx()
    cap = 4.0 / (1 + 1e-12)
    assert cap < 4.0 and cap * (1 + 1e-12) == 4.0
    st, _ = _state(ctx, usd_cap=cap)
    assert st._ok(_ver(ctx, params(1, 64, "fp8"), 16.0))          # 2 GPUs x $2 = $4.00/h
    assert not st._ok(_ver(ctx, params(1, 64, "fp8"), 10.0))      # 3 GPUs: $6/h


# ---- probes run ahead (LocalRunner with jobs >= 2) ----------------------------------------------------------------
def _w(ctx, p: dict, rate: float) -> Work:
    return Work("probe", Aggregated.from_config(p), rate, config_requests(ctx, p))


def _winners(ctx, rows):
    return [(evaluate(ctx, p), bar, 1, "x") for p, bar in rows]


def test_probe_ahead_runs_the_next_winners_probes_at_the_bars_the_best_sets():
    """Best: tp1 b64 fp8 on 2 GPUs ($4/h, 32 req/s). A tp1 bf16 config beats it on as many GPUs
    (bf16 KV): 30 / 2 = 15 req/s per replica; a tp1 fp8 one with 1% more goodput: 32 x 1.01 / 2 =
    16.16 req/s. With 2 jobs, the first two winners whose bar rose get their full probes as one
    batch; none is run on one job."""
    ctx = make_ctx()
    a, b, c = params(1, 16), params(1, 64), params(1, 16, "fp8")
    st, run = _state(ctx, jobs=2)
    st.best = _ver(ctx, params(1, 64, "fp8"), 16.0)
    st._probe_ahead(_winners(ctx, [(a, 10.0), (b, 10.0), (c, 10.0)]))
    assert run.batches == [[_w(ctx, a, 15.0), _w(ctx, b, 15.0)]]
    # three jobs: all three (fp8 at 16.16)
    st3, run3 = _state(ctx, jobs=3)
    st3.best = st.best
    st3._probe_ahead(_winners(ctx, [(a, 10.0), (b, 10.0), (c, 10.0)]))
    assert run3.batches == [[_w(ctx, a, 15.0), _w(ctx, b, 15.0), _w(ctx, c, 32.0 * 1.01 / 2)]]
    # one job: nothing run ahead
    st1, run1 = _state(ctx, jobs=1)
    st1.best = st.best
    st1._probe_ahead(_winners(ctx, [(a, 10.0), (b, 10.0), (c, 10.0)]))
    assert run1.batches == []


def test_probe_ahead_stops_at_a_winner_verified_next_and_skips_what_cannot_beat_the_best():
    """Best: tp1 b64 fp8 on 1 GPU ($2/h, 30 req/s). tp2 configs cannot beat 1 GPU (skipped, the
    best stays); tp1 bf16 must serve 30 req/s (bf16 on as many GPUs). A winner already at its bar
    (30 = 30) goes straight to verification, which may move the best: the probes stop there; a
    lone probe is not run ahead (it is run when asked)."""
    ctx = make_ctx()
    a, b, d = params(1, 16), params(1, 64), params(1, 32)
    best = _ver(ctx, params(1, 64, "fp8"), 30.0)
    st, run = _state(ctx, jobs=3)
    st.best = best
    st._probe_ahead(_winners(ctx, [(params(2, 64), 10.0), (a, 10.0), (b, 10.0), (d, 30.0), (params(1, 64, "fp8"), 1.0)]))
    assert run.batches == [[_w(ctx, a, 30.0), _w(ctx, b, 30.0)]]
    st2, run2 = _state(ctx, jobs=3)
    st2.best = best
    st2._probe_ahead(_winners(ctx, [(a, 10.0), (d, 30.0), (b, 10.0)]))
    assert run2.batches == []


def test_probe_ahead_skips_probes_already_run_and_runs_nothing_on_another_runner():
    ctx = make_ctx()
    a, b, c = params(1, 16), params(1, 32), params(1, 64)
    st, run = _state(ctx, jobs=2)
    st.best = _ver(ctx, params(1, 64, "fp8"), 16.0)
    run.run([_w(ctx, a, 15.0)])
    st._probe_ahead(_winners(ctx, [(a, 10.0), (b, 10.0), (c, 10.0)]))
    assert run.batches[1:] == [[_w(ctx, b, 15.0), _w(ctx, c, 15.0)]]

    class Other:                      # a shared-storage runner (optimizer.scaleout): batches are its unit
        jobs, cache = 4, {}

        def __init__(self):
            self.asked = []

        def run(self, items):
            self.asked.append(items)
            return [{} for _ in items]
    other = Other()
    st2 = ss._race_of(ctx)(ctx, other, None)
    st2.best = st.best
    st2._probe_ahead(_winners(ctx, [(a, 10.0), (b, 10.0), (c, 10.0)]))
    assert other.asked == []


def test_probe_ahead_with_no_best_uses_the_bar_within_the_cost_cap():
    """No best yet and a $8/h cap: 4 GPUs at $2; a tp1 replica then serves 30 / 4 = 7.5 req/s
    (each needs far more than 4 replicas by its bound, replicas_bound)."""
    ctx = make_ctx()
    a, b = params(1, 16), params(1, 64)
    assert min(ss.replicas_bound(ctx, a), ss.replicas_bound(ctx, b)) > 4
    st, run = _state(ctx, usd_cap=8.0, jobs=2)
    st._probe_ahead(_winners(ctx, [(a, 1.0), (b, 1.0)]))
    assert run.batches == [[_w(ctx, a, 7.5), _w(ctx, b, 7.5)]]


# ---- the progress stages (on_stage: what a user watching the race sees) ------------------------------------------
def test_stages_of_a_min_cost_race_a_max_goodput_race_and_a_closest_miss(monkeypatch):
    """The lattice: 2 TPs x 3 batch caps x 2 KV dtypes = 12 configs in 4 (TP, KV) groups, all alive.
    min_cost at 30 req/s: one zero-load probe per group, then one race batch of the 12 (BATCH = 16);
    every draw meets, so the best keeps its rank and nothing is raced again. max_goodput: the 4 seeds
    (one per structure), then the other 8 in one batch. min_cost at 1,000 req/s: nothing can serve
    it (every bar is above its capacity), so the CLOSEST 3 are verified."""
    heard = []
    for objective, rate, want in (("min_cost", 30, [("zero load", 4), ("race", 12)]),
                                  ("max_goodput", 1000, [("zero load", 4), ("seeds", 4), ("race", 8)]),
                                  ("min_cost", 1000, [("zero load", 4), ("race", 12), ("closest", 3)])):
        ctx = make_ctx(objective, rate=rate)
        run = FakeRunner(ctx, G)
        patch_simulation(monkeypatch, run)
        heard.clear()
        ss.race(ctx, run, on_stage=lambda name, n: heard.append((name, n)))
        assert heard == want, (objective, rate)


def test_race_goodput_with_no_best_yet_verifies_every_batch_until_one_qualifies():
    """max_goodput on a 24-config lattice (6 batch caps): 4 seeds, then 20 in batches of 16 and 4.
    Only the last config serves anything, so no seed and nothing in the first batch qualifies: each
    batch is verified whole (nothing to beat yet) and the second one finds the best."""
    ctx = make_ctx("max_goodput", rate=1000, caps=(8, 256))
    alive = [evaluate(ctx, p) for p in ss.lattice_configs(ctx)]
    assert len(alive) == 24
    last = config_key(alive[-1].params)
    st, run = _state(ctx, {last: 5.0})
    heard = []
    st.on_stage = lambda name, n: heard.append((name, n))
    st.race_goodput(alive, 4)
    assert heard == [("seeds", 4), ("race", 16), ("race", 4)]
    assert [len(b) for b in run.batches] == [4, 16, 4]
    assert config_key(st.best.params) == last and len(st.outcomes) == 24


# ---- the closest misses ----------------------------------------------------------------------------------------
def test_closest_ranks_by_screened_goodput_per_gpu_and_skips_the_verified():
    """Screened goodput per GPU by hand: tp1 b64 fp8 3.0 (already verified: skipped, its structure
    still open), tp1 b16 fp8 0.5, tp2 b16 bf16 0.8 / 2 = 0.4, tp2 b16 fp8 0.6 / 2 = 0.3, tp1 b16 bf16
    0 (a config the screen gives no goodput comes last). The CLOSEST 3: the three in the middle."""
    ctx = make_ctx(rate=1000)
    rows = [(params(1, 16), 0.0), (params(2, 16, "fp8"), 0.6), (params(1, 64, "fp8"), 3.0),
            (params(2, 16), 0.8), (params(1, 16, "fp8"), 0.5)]
    alive = [dataclasses.replace(evaluate(ctx, p), per_replica_goodput_req_s=g) for p, g in rows]
    st, run = _state(ctx)
    st.verify([alive[2]])
    st.closest(alive)
    assert [[config_key(dict(w.params)) for w in b] for b in run.batches] == [
        ["tp1-b64-fp8-k0-c1024"], ["tp1-b16-fp8-k0-c1024", "tp2-b16-bf16-k0-c1024", "tp2-b16-fp8-k0-c1024"]]


# ---- consider ---------------------------------------------------------------------------------------------------
def test_consider_an_equal_rank_does_not_replace_the_best():
    """Only a config that beats the best (strictly, in rank) replaces it: the nominal record of the
    robust best's own config, with the same figures, leaves the robust one in place."""
    ctx = make_ctx()
    st, _ = _state(ctx)
    robust = _ver(ctx, params(1, 64, "fp8"), 16.0, robust=True)
    nominal = _ver(ctx, params(1, 64, "fp8"), 16.0)
    assert ss.rank(ctx, robust) == ss.rank(ctx, nominal)
    st.best = robust
    st.consider([nominal])
    assert st.best is robust and st.best.robust


def test_consider_once_robust_with_no_best_checks_the_replicas_the_cap_allows(monkeypatch):
    """``robust_now`` and no best: a winner is made robust checking every replica max_nodes allows
    within the cap. Fresh draw 2 serves 45% of tp1 b64 fp8's 16 req/s (7.2): 30 req/s needs 5
    replicas; under a $6/h cap (3 GPUs) it is not feasible within 3; with no cap it is (5 of the 8
    GPUs) and becomes the best, robust."""
    ctx = make_ctx()
    st, run = _state(ctx, usd_cap=6.0, factor={2: 0.45})
    patch_simulation(monkeypatch, run)
    st.robust_now = True
    st.consider(st.verify([evaluate(ctx, params(1, 64, "fp8"))]))
    v = st.outcomes["tp1-b64-fp8-k0-c1024"].verification
    assert st.best is None and not v.feasible and "up to 3 replicas" in v.reason
    st2, run2 = _state(ctx, factor={2: 0.45})
    patch_simulation(monkeypatch, run2)
    st2.robust_now = True
    st2.consider(st2.verify([evaluate(ctx, params(1, 64, "fp8"))]))
    assert st2.best.robust and st2.best.replicas == 5 and st2.best.usd_per_hour == 10.0


# ---- meets_bar: short then full probes --------------------------------------------------------------------------
def test_meets_bar_short_probe_size_and_an_upper_bound_at_the_target_gets_its_full_probe():
    """At 95% attainment a config simulates 2,223 requests (config_requests): its short probe is
    25% of them, 555 (above SHORT_MIN). A short miss whose upper bound reaches the target exactly
    (0.95 = 0.95) is not clearly out: its full probe runs, misses, and the config is beaten on it."""
    ctx = make_ctx(attainment=0.95)
    p = params(1, 32)
    n = config_requests(ctx, p)
    assert int(ss.SHORT_SHARE * n) > ss.SHORT_MIN
    st, run = _state(ctx, {**G, "tp1-b32-bf16-k0-c1024": 5.0}, upper=0.95)
    assert st.meets_bar([(evaluate(ctx, p), 10.0, 3, "A")]) == []
    assert [[(w.rate_req_s, w.n_requests) for w in b] for b in run.batches] == [[(10.0, int(0.25 * n))], [(10.0, n)]]
    o = st.outcomes["tp1-b32-bf16-k0-c1024"]
    assert (o.status, o.reason, o.simulations) == ("beaten", "attainment 0.500 at 10 req/s per replica: cannot beat A", 2)


# ---- _race_cost --------------------------------------------------------------------------------------------------
def test_race_cost_a_winner_at_an_unchanged_bar_is_verified_without_another_probe():
    """No best: tp1 b64 fp8 (16 req/s) must serve 30 / 8 = 3.75 req/s on 8 replicas: its short and
    full probes meet, the bar has not moved, so it is verified next (5 simulations in the fake):
    7 in all."""
    ctx = make_ctx()
    st, run = _state(ctx)
    st._race_cost([evaluate(ctx, params(1, 64, "fp8"))])
    o = st.outcomes["tp1-b64-fp8-k0-c1024"]
    assert o.status == "verified" and o.simulations == 7 and st.sims == 7
    assert [w.kind for w in run.executed] == ["probe", "probe", "verify"]


def test_race_cost_a_winner_whose_bar_rose_and_misses_names_what_it_cannot_beat():
    """Both meet 3.75 req/s; tp1 b64 fp8 (16) is verified first: 2 replicas, 2 GPUs, $4/h, 32 req/s.
    tp1 b16 fp8 (6) must then serve 1% more on as many GPUs: 32 x 1.01 / 2 = 16.16 req/s, and misses."""
    ctx = make_ctx()
    st, _ = _state(ctx)
    st._race_cost([evaluate(ctx, params(1, 64, "fp8")), evaluate(ctx, params(1, 16, "fp8"))])
    o = st.outcomes["tp1-b16-fp8-k0-c1024"]
    assert o.status == "beaten"
    assert o.reason == ("attainment 0.500 at 16.2 req/s per replica: cannot beat 32 req/s on $4.00/h (2 GPUs) of "
                        "tp1-b64-fp8-k0-c1024")


# ---- confidence bounds by hand -------------------------------------------------------------------------------------
def test_binomial_bounds_of_one_request_are_the_uniform_quantiles():
    """One measured request: the Clopper-Pearson bounds are quantiles of Beta(1, 1), the uniform
    distribution: met, the 99% lower bound is 0.01 (the upper 1); missed, the upper bound is 0.99."""
    assert ss.binomial_interval(1, 1) == (pytest.approx(0.01), 1.0)
    assert ss.binomial_interval(0, 1) == (0.0, pytest.approx(0.99))


def test_batch_mean_bounds_by_hand_from_the_t_table():
    """Stretches of 10 requests: 5 at 100% and 5 at 80% (mean 0.9, sample sd sqrt(10 x 0.01 / 9)),
    Student's t at 99% on 9 degrees of freedom 2.821 (tables): 0.9 -/+ 2.821 x 0.10541 / sqrt(10).
    Nine stretches at 100% and one at 50%: mean 0.95, sd sqrt(0.225 / 9) = 0.1581, half-width 0.141:
    the upper bound is clipped at 1. Two requests that both met: two stretches, no spread: (1, 1)."""
    met = ([1] * 10) * 5 + ([1] * 8 + [0] * 2) * 5
    lo, hi = ss.upper_attainment(met)
    half = 2.821 * math.sqrt(10 * 0.01 / 9) / math.sqrt(10)
    assert lo == pytest.approx(0.9 - half, abs=2e-4) and hi == pytest.approx(0.9 + half, abs=2e-4)
    lo2, hi2 = ss.upper_attainment([1] * 90 + [1] * 5 + [0] * 5)
    assert lo2 == pytest.approx(0.95 - 2.821 * math.sqrt(0.225 / 9) / math.sqrt(10), abs=2e-4) and hi2 == 1.0
    assert ss.upper_attainment([True, True]) == (1.0, 1.0)


# ---- zero load: a short probe decides only when clear -------------------------------------------------------------
def test_zero_load_short_probe_bounds_at_the_target_and_full_probes_judged_by_their_attainment():
    """The fake's meeting probe reports bounds (0.92, 1.0), a missing one (0.3, ``upper``).
    Target 0.92: a lower bound at the target is clear: 4 short probes, all alive. Target 0.9 with a
    dead group whose upper bound is exactly 0.9: not clearly out, so its full probe runs (and it is
    out). Target 0.95: every short probe straddles it, the full probes run and meet (attainment
    judged, not the bound): all alive."""
    for attainment, dead, upper, want_full in ((0.92, set(), 0.6, 0), (0.9, {"tp1-b16-bf16-k0-c1024"}, 0.9, 1),
                                              (0.95, set(), 0.6, 4)):
        ctx = make_ctx(attainment=attainment)
        evs = [evaluate(ctx, p) for p in ss.lattice_configs(ctx)]
        dead_keys = {config_key(e.params) for e in evs if e.params["tp"] == 1 and e.params["kv_dtype"] == "bf16"} \
            if dead else set()
        st, run = _state(ctx, dead=dead_keys, upper=upper)
        alive = st.zero_load(evs)
        n_zl = ss.sim_requests(attainment, 1)
        sizes = [w.n_requests for w in run.executed]
        assert sizes.count(ss.SHORT_MIN) == 4 and sizes.count(n_zl) == want_full, attainment
        assert len(alive) == 12 - len(dead_keys)


def _layout_ev(pp: int, cap: int = 64, g: float = 1.0):
    p = Aggregated.from_config(dict(params(8, cap, "fp8"), layout=f"tp8-pp{pp}", pp=pp, ep=1, dp_attention=False))
    return SimpleNamespace(params=p, per_replica_goodput_req_s=g)


def test_zero_load_and_seeds_tell_layouts_of_one_tp_apart(monkeypatch):
    """TP8 x PP1 and TP8 x PP2 share TP, KV dtype and draft length but are distinct structures: one
    zero-load probe each, and one max_goodput seed each."""
    ctx = make_ctx()
    monkeypatch.setattr(ss, "never_fit_reason", lambda c, p: "")
    monkeypatch.setattr(ss, "_capacity", lambda c, p: 10.0)
    st, run = _state(ctx, {}, default=100.0)      # every probe meets
    evs = [_layout_ev(1), _layout_ev(2), _layout_ev(2, 32)]
    assert len(st.zero_load(evs)) == 3
    assert len(run.executed) == 2 and {dict(w.params)["layout"] for w in run.executed} == {"tp8-pp1", "tp8-pp2"}
    gctx = make_ctx("max_goodput", rate=1000)
    st2, run2 = _state(gctx, {})
    st2.race_goodput([_layout_ev(1), _layout_ev(2)], 4)
    assert [[dict(w.params)["layout"] for w in b] for b in run2.batches] == [["tp8-pp1", "tp8-pp2"]]


# ---- settle: no more replicas than could beat the best ---------------------------------------------------------
def test_settle_checks_each_config_up_to_the_replicas_that_could_beat_the_robust_best(monkeypatch):
    """Fresh draw 3 serves 80% of draw 0. tp1 b64 fp8 (16 req/s): nominal 2 replicas ($4/h), robust
    3 (12.8 >= 10 req/s). tp1 b64 bf16 (12): nominal 3 replicas ($6/h, before fp8's robust $6/h on
    bf16 KV); robust it would need 4 (9.6 < 10), more than the 3 that could still beat the best: not
    feasible "with up to 3 replicas", and the robust fp8 config stays the best."""
    ctx = make_ctx()
    st, run = _state(ctx, factor={3: 0.8})
    patch_simulation(monkeypatch, run)
    st.consider(st.verify([evaluate(ctx, params(1, 64, "fp8")), evaluate(ctx, params(1, 64))]))
    assert st.settle() is False
    assert config_key(st.best.params) == "tp1-b64-fp8-k0-c1024" and st.best.robust and st.best.replicas == 3
    v = st.outcomes["tp1-b64-bf16-k0-c1024"].verification
    assert not v.feasible and "with up to 3 replicas" in v.reason


def test_settle_under_a_cap_checks_the_first_up_to_the_cap_and_keeps_no_miss(monkeypatch):
    """$8/h cap (4 GPUs): tp1 b64 fp8 (16 req/s) with a fresh draw at 45% (7.2 req/s) would need 5
    replicas: not feasible with up to 4, so nothing is the best (a miss never is)."""
    ctx = make_ctx()
    st, run = _state(ctx, usd_cap=8.0, factor={2: 0.45})
    patch_simulation(monkeypatch, run)
    st.consider(st.verify([evaluate(ctx, params(1, 64, "fp8"))]))
    assert st.best is not None and st.settle() is True and st.best is None
    v = st.outcomes["tp1-b64-fp8-k0-c1024"].verification
    assert not v.feasible and "with up to 4 replicas" in v.reason


def test_settle_runs_no_draw_for_a_verified_miss(monkeypatch):
    """A verified config that is not feasible (it cannot serve the rate on max_nodes) is never made
    robust: the only draws settle runs are the feasible best's."""
    ctx = make_ctx()
    st, run = _state(ctx, {"tp1-b64-fp8-k0-c1024": 16.0, "tp1-b16-bf16-k0-c1024": 3.0})
    patch_simulation(monkeypatch, run)
    res = st.verify([evaluate(ctx, params(1, 64, "fp8")), evaluate(ctx, params(1, 16))])
    assert [v.feasible for v in res] == [True, False]      # 30 / 3 = 10 replicas > 8 GPUs
    st.consider(res)
    st.settle()
    assert {config_key(dict(w.params)) for w in run.executed if w.kind == "draw"} == {"tp1-b64-fp8-k0-c1024"}


# ---- race_cost: raced again against the robust best ---------------------------------------------------------------
def test_race_cost_races_again_what_was_pruned_and_makes_the_winner_robust_first(monkeypatch):
    """tp1 b64 fp8 (15.5 req/s) is the nominal best on 2 GPUs ($4/h). tp1 b16 bf16 (10.6) would have
    to serve 15 req/s there (bf16 on as many GPUs): above its capacity x 1.2 (13.8), pruned. Fresh
    draw 3 serves 95%: fp8 then needs 3 replicas (14.7 < 15), $6/h. Raced again, tp1 b16 bf16 needs
    10 req/s on 3 GPUs, meets it, is made robust (10.07 >= 10 on 3) and, bf16 at $6/h, is the best."""
    ctx = make_ctx()
    st, run = _state(ctx, {"tp1-b64-fp8-k0-c1024": 15.5, "tp1-b16-bf16-k0-c1024": 10.6}, factor={3: 0.95})
    patch_simulation(monkeypatch, run)
    st.consider(st.verify([evaluate(ctx, params(1, 64, "fp8"))]))
    assert ss._capacity(ctx, params(1, 16)) * ss.CAPACITY_SLACK < 15
    heard = []
    st.on_stage = lambda name, n: heard.append((name, n))
    st.race_cost([evaluate(ctx, params(1, 16))])
    assert heard == [("race", 1), ("race again", 1), ("race", 1)]   # race again: its batches are races too
    b = st.best
    assert config_key(b.params) == "tp1-b16-bf16-k0-c1024" and b.robust and (b.replicas, b.usd_per_hour) == (3, 6.0)


def test_settle_makes_nothing_robust_above_the_cap(monkeypatch):
    """A $3/h cap: the only verified config costs $4/h, so it is never the best; settle runs no draw and
    leaves its record as verified (feasible, 2 replicas, $4/h: over the cap, not a miss)."""
    ctx = make_ctx()
    st, run = _state(ctx, usd_cap=3.0)
    patch_simulation(monkeypatch, run)
    st.consider(st.verify([evaluate(ctx, params(1, 64, "fp8"))]))
    assert st.settle() is True and st.best is None
    assert [w.kind for w in run.executed] == ["verify"]
    v = st.outcomes["tp1-b64-fp8-k0-c1024"].verification
    assert v.feasible and (v.replicas, v.usd_per_hour) == (2, 4.0)


def test_local_runner_forks_even_where_the_default_start_method_does_not(monkeypatch):
    """The pool's processes inherit the context (``_POOL_CTX``) by fork: the runner asks for fork
    explicitly, not the platform's default (spawn on macOS, forkserver from Python 3.14)."""
    import multiprocessing as mp
    import multiprocessing.context as mpc
    monkeypatch.setattr(mpc._default_context, "_actual_context", mp.get_context("spawn"))
    assert mp.get_context(None).get_start_method() == "spawn"
    with ss.LocalRunner(make_ctx(), 2) as run:
        assert run._get_pool()._ctx.get_start_method() == "fork"


# ---- the whole race ------------------------------------------------------------------------------------------------
def test_race_max_goodput_ignores_a_cost_cap_and_screens_on_the_runner(monkeypatch):
    """The cost cap is min_cost's (another GPU type's price to beat): max_goodput fills the node
    (8 GPUs, $16/h) whatever cap is passed. The lattice is screened by the runner (a pool's, with jobs)."""
    ctx = make_ctx("max_goodput", rate=1000)
    run = FakeRunner(ctx, G)
    patch_simulation(monkeypatch, run)
    screened = []
    real = run.screen
    monkeypatch.setattr(run, "screen", lambda configs: screened.append(len(configs)) or real(configs))
    r = ss.race(ctx, run, usd_cap=1.0)
    assert r.best is not None and r.best.usd_per_hour == 16.0 and screened == [12]
    assert r.no_fit == ()


def test_race_a_closest_pick_that_qualifies_is_made_robust(monkeypatch):
    """1,000 req/s: every bar (125 req/s on a TP1 replica, 8 of them) is above every capacity x 1.2,
    so the race prunes all; the fake says tp1 b64 fp8 serves 130 req/s per replica anyway, and the
    closest misses include it (most screened goodput per GPU): verified on 8 replicas it qualifies,
    and is made robust before it is the answer."""
    ctx = make_ctx(rate=1000)
    run = FakeRunner(ctx, {"tp1-b64-fp8-k0-c1024": 130.0})
    patch_simulation(monkeypatch, run)
    r = ss.race(ctx, run)
    assert config_key(r.best.params) == "tp1-b64-fp8-k0-c1024" and r.best.robust and r.best.replicas == 8


def test_race_names_the_configs_that_do_not_fit():
    """70B in bf16 is about 141 GB of weights: more than one 80 GB GPU holds; split over 2 or more
    (about 70.5 GB each) they fit. The answer names the config that does not, with the reason."""
    from kvtune.optimizer.search import SolveContext
    from kvtune.optimizer.workload import load_workload_dict
    from race_fakes import spec_dict
    d = dict(spec_dict(tp=(1, 2, 4, 8), kv=("bf16",), caps=(64, 64)), model="llama-3.1-70b")
    ctx = SolveContext.build(load_workload_dict(d, "<test>"))
    r = ss.race(ctx, FakeRunner(ctx, {}))
    assert [k for k, _ in r.no_fit] == ["tp1-b64-bf16-k0-c1024"]
    assert all(why for _, why in r.no_fit)


def test_race_goodput_a_winner_after_the_seeds_is_verified_and_becomes_the_best():
    """Seed tp1 b16 bf16 (5 req/s per GPU); tp1 b64 bf16 (12) beats it at the bar, is verified, the best."""
    ctx = make_ctx("max_goodput", rate=1000)
    st, _ = _state(ctx)
    st.race_goodput([evaluate(ctx, params(1, 16)), evaluate(ctx, params(1, 64))], 1)
    assert config_key(st.best.params) == "tp1-b64-bf16-k0-c1024"
    assert st.outcomes["tp1-b64-bf16-k0-c1024"].status == "verified"


# ---- robust: the misses remembered -------------------------------------------------------------------------------
def test_robust_remembers_no_miss_for_draws_that_meet_exactly_at_the_target(monkeypatch):
    """Target 0.95 and every fresh draw at attainment 0.95 (the fake's meeting figure): each draw
    met (>= the target), so each seed tried is remembered with 0 misses."""
    ctx = make_ctx(attainment=0.95)
    st, run = _state(ctx)
    patch_simulation(monkeypatch, run)
    v = st.verify([evaluate(ctx, params(1, 64, "fp8"))])[0]
    st.robust(v, 8)
    seeds = {w.seed for w in run.executed if w.kind == "draw"}
    assert seeds and st.misses == {s: 0 for s in seeds}


# ---- screen_bar and bar_req_s -----------------------------------------------------------------------------------
def test_screen_bar_with_no_best_under_a_cap_and_at_the_capacity_slack_edges():
    """No best and a $8/h cap: tp1 b64 fp8 must serve 30 / 4 = 7.5 req/s. Against a 1-GPU fp8 best of
    goodput g, it must serve g x 1.01: kept while that is at most its capacity x 1.2 (kept at exactly
    that, pruned above), also when it is above the capacity / 1.2."""
    ctx = make_ctx()
    p = params(1, 64, "fp8")
    ev = evaluate(ctx, p)
    st, _ = _state(ctx, usd_cap=8.0)
    assert [(c[1], c[2]) for c in st.screen_bar([ev])] == [(7.5, 4)]
    cap = ss._capacity(ctx, p)
    for g, kept in ((cap * 1.2 / 1.01, True), (cap * 1.2 / 1.01 * 1.001, False), (cap / 1.2 / 1.01 * 1.05, True)):
        st2, _ = _state(ctx)
        st2.best = _ver(ctx, p, g, replicas=1)
        bar = ss.bar_req_s(ctx, p, st2.best)[0]
        if kept and g > cap:
            assert bar == cap * ss.CAPACITY_SLACK        # exactly at the slack (the test's own premise)
        assert (len(st2.screen_bar([ev])) == 1) == kept, g


def test_bar_with_no_best_at_one_replica_and_a_replica_at_the_whole_budget():
    """A $2/h cap buys one TP1 replica: its bar is the whole rate on 1 replica. TP8 on one 8-GPU node
    without a cap: one replica, the whole rate. TP8 under a $10/h cap (5 GPUs): a replica costs more
    than the cap (the node could hold one)."""
    ctx = make_ctx()
    bar, r, why = ss.bar_req_s(ctx, params(1, 64), None, 2.0)
    assert (bar, r) == (30.0, 1) and "within $2.00/h" in why
    bar, r, why = ss.bar_req_s(ctx, params(8, 64), None)
    assert (bar, r, why) == (30.0, 1, "the most 8-GPU replicas hardware.max_nodes allows (1)")
    assert ss.bar_req_s(ctx, params(8, 64), None, 10.0) == (
        None, 0, "a replica of 8 GPUs costs more than $10.00/h, found on another GPU type")


def test_bar_where_the_replicas_it_could_need_equal_what_max_nodes_allows():
    """Rate 7.5 x 0.001 x capacity: tp1 b64 fp8's bound (replicas_bound) is ceil(7.5) = 8, as many as
    8 GPUs hold: the bar is named for max_nodes (the bound binds only when it is fewer)."""
    cap = ss._capacity(make_ctx(), params(1, 64, "fp8"))
    ctx = make_ctx(rate=7.5 * ss.ZERO_LOAD_SHARE * cap)
    p = params(1, 64, "fp8")
    assert ss.replicas_bound(ctx, p) == 8
    bar, r, why = ss.bar_req_s(ctx, p, None)
    assert r == 8 and bar == pytest.approx(ctx.rate_req_s / 8)
    assert why == "the most 1-GPU replicas hardware.max_nodes allows (8)"


def test_bar_fewer_gpus_is_whole_replicas_and_max_goodput_replicas_are_whole():
    """Best: tp2 fp8 on 2 replicas (4 GPUs) with 80 req/s. A tp2 fp8 config beats it on 1 replica
    (3 GPUs hold one whole TP2 replica): 30 req/s; on 2 it would need 80.8 / 2 = 40.4. max_goodput: the
    replicas of TP2 on 8 GPUs are 4, a whole number."""
    ctx = make_ctx()
    best = _ver(ctx, params(2, 64, "fp8"), 40.0, replicas=2)
    assert ss.bar_req_s(ctx, params(2, 16, "fp8"), best)[:2] == (30.0, 1)
    gctx = make_ctx("max_goodput", rate=1000)
    r = ss.bar_req_s(gctx, params(2, 16), _ver(gctx, params(1, 64), 10.0, replicas=8))[1]
    assert r == 4 and isinstance(r, int)


def test_replicas_bound_at_a_trickle_is_one():
    ctx = make_ctx(rate=0.001)
    assert ss.replicas_bound(ctx, params(1, 64)) == 1      # 0.001 req/s < 0.001 x capacity (~33 req/s)


def test_step_of_a_speculative_config_reads_its_draft_length():
    ctx = make_ctx(speculative={"method": "eagle3", "acceptance": 0.6, "draft_cost": 0.05,
                                "draft_model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"}, spec_k=2)
    assert ss._step(ctx, params(1, 64, "bf16", 2)) is ctx.step(1, "bf16", 2, None)


# ---- the largest requests and never-fit --------------------------------------------------------------------------
def test_largest_requests_are_drawn_once(monkeypatch):
    """The largest requests are a function of the workload alone: drawn once per context, whatever
    the groups checked."""
    ctx = make_ctx()
    calls = []
    real = ss._largest_requests
    monkeypatch.setattr(ss, "_largest_requests", lambda c: calls.append(1) or real(c))
    assert ss.never_fit_reason(ctx, params(1, 64)) == "" and ss.never_fit_reason(ctx, params(2, 64, "fp8")) == ""
    assert calls == [1]


def test_largest_requests_are_the_largest_prompt_plus_output():
    """Two classes: long outputs (1,000 + 8,000 tokens) and long prompts (2,000 + 100): the largest
    by prompt + output are the long outputs', not the long prompts' (their prompt - output is larger)."""
    from kvtune.optimizer.search import SolveContext
    from kvtune.optimizer.workload import load_workload_dict
    from race_fakes import spec_dict
    d = spec_dict()
    d["workload"]["classes"] = [{"name": "gen", "share": 0.5, "input_tokens": 1000, "output_tokens": 8000},
                                {"name": "read", "share": 0.5, "input_tokens": 2000, "output_tokens": 100}]
    ctx = SolveContext.build(load_workload_dict(d, "<test>"))
    big = ss._largest_requests(ctx)
    assert list(big.input_tokens + big.output_tokens) == [9000] * ss.NEVER_FIT_CHECK


# ---- a probe -------------------------------------------------------------------------------------------------------
def test_a_probe_at_exactly_the_target_meets_and_runs_on_the_workload_seed(monkeypatch):
    """A probe meets at an attainment equal to the target (>=); it simulates with the workload's seed
    (``search.seed`` 5 here), which drives speculative acceptance."""
    import kvtune.costmodel.simulate as sim
    from race_fakes import spec_dict
    from kvtune.optimizer.search import SolveContext
    from kvtune.optimizer.workload import load_workload_dict
    d = spec_dict()
    d["search"]["seed"] = 5
    ctx = SolveContext.build(load_workload_dict(d, "<test>"))
    assert ctx.workload_seed != 0
    seen = []
    real = sim.simulate

    def at_target(step, req, cfg, arrival="trace", concurrency=None, seed=0, warmup_frac=None):
        seen.append((arrival, seed))
        return dataclasses.replace(real(step, req, cfg, arrival, concurrency, seed, warmup_frac), slo_attainment=0.9)
    monkeypatch.setattr(sim, "simulate", at_target)
    pr = ss.Probe.from_json(ss.execute(ctx, Work("probe", Aggregated.from_config(params(1, 64)), 0.5, 100)))
    assert pr.attainment == 0.9 and pr.meets and pr.reason == ""
    assert seen == [("trace", ctx.workload_seed)]


# ---- why a probe misses ----------------------------------------------------------------------------------------
def _miss(ttft, tpot, out, inp, slo_ttft=1.0, slo_tpot=0.05):
    n = len(ttft)
    res = SimpleNamespace(measured=np.ones(n, bool), ttft_s=np.array(ttft, float), tpot_s=np.array(tpot, float),
                          rejected=0, reject_reason="", slo_attainment=0.5)
    req = SimpleNamespace(ttft_slo_s=np.full(n, slo_ttft), tpot_slo_s=np.full(n, slo_tpot),
                          output_tokens=np.array(out), input_tokens=np.array(inp))
    return ss._miss_reason(res, req, 0.5)


def test_miss_reason_at_exactly_the_slo_and_two_token_outputs_and_prompt_sizes():
    """A TTFT or TPOT exactly at its SLO meets it; a 2-token output has a TPOT (one gap) and can miss
    it; prompts of 10,000 tokens and more are written in thousands (10,501 -> 11k), below as is."""
    at = _miss([1.0, 1.0], [0.05, 0.05], [10, 10], [500, 500])
    assert at == "attainment 0.500 < 0.5"
    two = _miss([0.1, 0.1], [0.08, 0.01], [2, 2], [500, 500])
    assert two == f"TPOT p50 {np.percentile([0.08, 0.01], 50) * 1e3:.1f} ms > 50.0 ms (50% of requests miss it)"
    ten = _miss([2.0, 2.0], [0.01, 0.01], [10, 10], [10_000, 10_000])
    assert ten == "TTFT p50 2,000 ms > 1,000 ms (100% of requests miss it; the p50 prompt is 10k tokens)"
    odd = _miss([2.0, 2.0], [0.01, 0.01], [10, 10], [10_501, 10_501])
    assert odd.endswith("the p50 prompt is 11k tokens)")
    small = _miss([2.0, 2.0], [0.01, 0.01], [10, 10], [9_999, 9_999])
    assert small.endswith("the p50 prompt is 9,999 tokens)")


def test_local_runner_pool_has_as_many_processes_as_jobs():
    with ss.LocalRunner(make_ctx(), 3) as run:
        assert run._get_pool()._processes == 3
