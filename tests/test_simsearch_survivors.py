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
    return ss._State(ctx, run, None, usd_cap), run


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
    w = Work("probe", ss._freeze(p), 1.0, 10)
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
        assert run.run([Work("probe", ss._freeze(params()), 1.0, 10)]) == [{"pid": me}] and run._pool is None
        assert run.screen([params()] * 64) == [me] * 64 and run._pool is None
        two = run.run([Work("probe", ss._freeze(params(2)), 1.0, 10), Work("probe", ss._freeze(params(1, 64)), 1.0, 10)])
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
    return Work("probe", ss._freeze(p), rate, config_requests(ctx, p))


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
    st2 = ss._State(ctx, other, None)
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
