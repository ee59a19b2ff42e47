"""What ``kvtune solve`` answers (``optimizer.recommend``), on the fake engine of ``tests/race_fakes.py``
whose pick is known by hand (issue 25): every field of an ``ok`` answer (the deployment, the
predicted figures, $/h and $ per million output tokens at the rate it is priced at, headroom, the
front, the bottleneck, the notes, the launch lines, the provenance), each reason an answer with no
pick gives, and what ``solve`` passes on. Milliseconds each: the race runs on the fake."""

from __future__ import annotations

import dataclasses
import math

import optuna
import pytest

from kvtune.optimizer.deployment import Aggregated
from kvtune import __version__
from kvtune.optimizer import recommend as rc
from kvtune.optimizer import simsearch as ss
from kvtune.optimizer.result import ParetoPoint
from kvtune.optimizer.search import UNLAUNCHABLE, completed_evals, config_key, evaluate, open_study, run_search
from kvtune.optimizer.simsearch import Outcome, Probe, Race
from kvtune.optimizer.verify import Verification

from race_fakes import MEETS, FakeRunner, make_ctx, params, patch_simulation
from test_simsearch import G, KEYS


def _answer(monkeypatch, objective="min_cost", goodput=G, trials=0, **kw):
    ctx = make_ctx(objective, **kw)
    run = FakeRunner(ctx, goodput)
    patch_simulation(monkeypatch, run)
    study = open_study(ctx, "grid", None, None)
    if trials:
        run_search(ctx, study, trials, "grid")
    return ctx, rc.recommend(ctx, study, "grid", runner=run), study


def test_an_ok_answer_by_hand(monkeypatch):
    """tp1 b64 fp8 at 16 req/s per replica: 2 replicas on 2 GPUs for 30 req/s, $4/h; 30 req/s x 200
    output tokens = 6,000 tok/s = 21.6 M tokens an hour: $4 / 21.6 = $0.185 per million."""
    ctx, r, study = _answer(monkeypatch, trials=6)
    assert r.status == "ok" and r.reason is None and r.closest is None
    rec = r.recommendation
    assert (rec.tp, rec.batch_cap, rec.kv_dtype, rec.spec_k, rec.chunk_tokens) == (1, 64, "fp8", 0, 1024)
    assert (rec.replicas, rec.gpus, rec.nodes, rec.gpu, rec.model) == (2, 2, 1, "h100-sxm", "llama-3.1-8b")
    assert (rec.pp, rec.ep, rec.dp_attention, rec.nodes_per_replica, rec.gpus_per_node, rec.layout) == (
        1, 1, False, 1, 8, None)
    p = r.predicted
    assert (p.goodput_req_s, p.per_replica_goodput_req_s, p.ranked_goodput_req_s) == (32.0, 16.0, 32.0)
    assert (p.slo_attainment, p.output_tok_s, p.load_per_replica_req_s, p.evidence) == (MEETS, 1234.0, 15.0, "simulated")
    assert p.ttft_ms == {"p50": 100.0, "p90": 200.0, "p99": 300.0, "mean": 120.0}
    assert p.tpot_ms["mean"] == 25.0 and math.isnan(p.tpot_ms["p90"])
    assert p.tok_s_per_user == 1000.0 / 25.0
    assert p.draws["seeds"] == list(range(1, 20)) and p.draws["load_req_s"] == 15.0
    assert p.check.startswith("kvtune simulate '<test>' --tp 1 --batch-cap 64 --kv-dtype fp8 --spec-k 0 "
                              "--chunk-tokens 1024 --replicas 2 --rate 30") and "--seed 1" in p.check
    c = r.cost
    assert (c.usd_per_hour, c.usd_per_gpu_hour, c.priced_at) == (4.0, 2.0, "target rate")
    assert c.usd_per_million_output_tokens == pytest.approx(4.0 / 21.6)
    assert r.headroom == pytest.approx(32.0 / 30.0 - 1)
    assert r.notes == ("FP8 KV: no bf16 config meets the target at $4.00/h (simulated); check quality on your "
                       "hardest evals",)
    # the front of the verified configs: the race takes bf16 KV first at the screen's cheapest price,
    # so tp1 b64 bf16 is verified too: 12 req/s per replica on this fake, 3 replicas for 30 req/s,
    # $6/h for 36 req/s: dearer than the pick but with more goodput, so on the front beside it
    assert [(x.gpus, x.usd_per_hour, x.goodput_req_s, x.evidence) for x in r.pareto] == [
        (2, 4.0, 32.0, "simulated"), (3, 6.0, 36.0, "simulated")]
    assert r.pareto[0].config == dict(params(1, 64, "fp8"), replicas=2)
    # the bottleneck and the screened figures are the screen's of the pick
    ev = evaluate(ctx, params(1, 64, "fp8"))
    assert (r.bottleneck.term, r.bottleneck.batch_limit, r.bottleneck.operating_batch) == (ev.bottleneck, ev.batch_limit,
                                                                                          ev.batch)
    assert r.bottleneck.step.step_ms == ev.detail["step_ms"] and r.bottleneck.step.limits == ev.detail["limits"]
    assert r.bottleneck.step.kv_pool_tokens == ev.detail["kv_pool_tokens"]
    assert r.screened.per_replica_goodput_req_s == ev.per_replica_goodput_req_s and r.screened.batch == ev.batch
    # the launch lines: the pick's flags, its replicas and the workload's longest request (1,000 + 200)
    vllm = r.launch["vllm"]
    for flag in ("vllm serve meta-llama/Llama-3.1-8B-Instruct", "--tensor-parallel-size 1", "--max-num-seqs 64",
                 "--max-num-batched-tokens 1024", "--kv-cache-dtype fp8", "--gpu-memory-utilization 0.9",
                 "--max-model-len 1200"):
        assert flag in vllm, flag
    assert "spec:\n  replicas: 2\n" in r.launch["k8s"] and "name: kvtune-llama-3-1-8b\n" in r.launch["k8s"]
    assert "KV pool 55.9 GB" in vllm and "activation reserve 0.0 GB" in vllm
    assert "--speculative" not in vllm
    # provenance and the race's evidence
    assert (r.kvtune_version, r.seed, r.workload_seed, r.sampler, r.objective) == (__version__, 0, 0, "grid", "min_cost")
    assert r.source.startswith("calibrated: h100-sxm") and r.calibration["name"] == "h100-sxm"
    assert r.admission == "prompt" and r.profile is None and r.engine is None
    assert r.study_name == study.study_name and r.target_rate_req_s == 30.0
    assert (r.trials.completed, r.trials.feasible) == (6, 6)
    # verified: the pick and tp1 b64 bf16 (the front above); the other 10 beaten
    assert r.verification.configs == 2 and r.verification.outcomes == {"beaten": 10, "verified": 2}
    assert r.verification.simulations == sum(x.simulations for x in r.race) and r.verification.work_items > 0
    assert [x.config for x in r.race] == [p for p in ss.lattice_configs(ctx)]
    assert [x.config for x in r.verified] == [params(1, 64, "bf16"), params(1, 64, "fp8")]   # lattice order
    v = r.verified[1]
    assert (v.config, v.feasible, v.usd_per_hour, v.goodput_req_s, v.per_replica_goodput_req_s, v.reason) == (
        params(1, 64, "fp8"), True, 4.0, 32.0, 16.0, "")
    # its own simulations: the fake's bisection (5), 19 fresh draws and the pick at its load; the race row
    # adds the probes that raced it
    assert v.simulations == 5 + 19 + 1
    assert next(x.simulations for x in r.race if x.config == params(1, 64, "fp8")) > v.simulations


def test_max_goodput_is_priced_at_its_goodput(monkeypatch):
    """max_goodput: 8 replicas of tp1 b64 fp8 (16 req/s each) = 128 req/s x 200 tokens on 8 GPUs ($16/h)."""
    ctx, r, _ = _answer(monkeypatch, "max_goodput", rate=1000)
    assert r.status == "ok" and r.recommendation.replicas == 8 and r.cost.usd_per_hour == 16.0
    assert r.cost.priced_at == "goodput"
    assert r.cost.usd_per_million_output_tokens == pytest.approx(16.0 / (128 * 200 * 3600) * 1e6)
    assert r.headroom == pytest.approx(128 / 1000 - 1) and r.objective == "max_goodput"
    # the front: every verified config, cheaper or with more goodput (all on 8 GPUs here: the best goodput)
    assert [x.goodput_req_s for x in r.pareto] == [max(x.goodput_req_s for x in r.verified if x.feasible)]


def test_dtype_notes():
    ctx = make_ctx()
    pick = Verification(params(1, 64, "bf16"), 12.0, 1, True, replicas=3, gpus=3, usd_per_hour=6.0, goodput_req_s=36.0)
    fp8 = Verification(params(1, 64, "fp8"), 13.0, 1, True, replicas=3, gpus=3, usd_per_hour=6.0, goodput_req_s=39.0)
    fp8_more = Verification(params(1, 32, "fp8"), 14.0, 1, True, replicas=3, gpus=3, usd_per_hour=6.0,
                            goodput_req_s=42.0)
    dear = Verification(params(2, 64, "fp8"), 40.0, 1, True, replicas=1, gpus=2, usd_per_hour=8.0, goodput_req_s=80.0)
    miss = Verification(params(2, 32, "fp8"), 40.0, 1, False, "x", replicas=1, gpus=2, usd_per_hour=6.0,
                        goodput_req_s=80.0)

    def race_of(*vs):
        return Race(tuple(Outcome(Aggregated.from_config(v.params), "verified", "", 1, v) for v in vs), 1, ())
    assert rc._dtype_notes(ctx, pick, race_of(pick, fp8, fp8_more, dear, miss)) == [
        "bf16 KV preferred at equal $/h: tp1-b32-fp8-k0-c1024 (fp8 KV) costs the same $6.00/h with 42.00 req/s "
        "goodput against 36.00 (simulated); fp8 KV is never chosen unless cheaper"]
    nothing = ["bf16 KV: FP8 KV buys no saving here (every fp8 config was raced for a cheaper deployment)"]
    assert rc._dtype_notes(ctx, pick, race_of(pick, dear, miss)) == nothing
    bf16_more = dataclasses.replace(fp8_more, params=params(2, 32, "bf16"))   # more goodput, but bf16: no note
    assert rc._dtype_notes(ctx, pick, race_of(pick, bf16_more)) == nothing
    less = dataclasses.replace(fp8, goodput_req_s=36.0)       # as much goodput is no cost of the preference
    assert rc._dtype_notes(ctx, pick, race_of(pick, less)) == nothing
    gctx = make_ctx("max_goodput", rate=1000)
    assert rc._dtype_notes(gctx, pick, race_of(pick, fp8)) == nothing
    assert rc._dtype_notes(ctx, fp8, race_of(pick, fp8)) == [
        "FP8 KV: no bf16 config meets the target at $6.00/h (simulated); check quality on your hardest evals"]
    assert rc._dtype_notes(make_ctx(kv=("bf16",)), pick, race_of(pick)) == ["FP8 KV excluded by search.kv_dtype: [bf16]"]
    assert rc._dtype_notes(make_ctx(kv=("fp8",)), fp8, race_of(fp8)) == []


def test_pareto_front_by_hand():
    def pt(usd, good):
        return ParetoPoint(gpus=int(usd), usd_per_hour=usd, goodput_req_s=good, config={}, evidence="simulated")
    pts = [pt(8, 50), pt(4, 30), pt(4, 32), pt(6, 31), pt(10, 50), pt(12, 70), pt(2, 10)]
    assert [(x.usd_per_hour, x.goodput_req_s) for x in rc.pareto_front(pts)] == [(2, 10), (4, 32), (8, 50), (12, 70)]
    assert rc.pareto_front([]) == []
    assert [(x.usd_per_hour, x.goodput_req_s) for x in rc.pareto_front([pt(1, 0.0)])] == [(1, 0.0)]
    assert len(rc.pareto_front([pt(4, 10), pt(5, 10 + 1e-13)])) == 1     # no real gain: not on the front
    assert len(rc.pareto_front([pt(4, 10), pt(5, 10 + 1e-12)])) == 1     # a gain must exceed 1e-12 req/s
    assert len(rc.pareto_front([pt(4, 10), pt(5, 10.5)])) == 2           # half a request per second is a gain


# ---- answers with no pick ----------------------------------------------------------------------------------------
def _race(outcomes=(), zero=(), no_fit=()):
    return Race(tuple(outcomes), 3, tuple(zero), tuple(no_fit))


def _o(p, status, reason="r", v=None):
    return Outcome(Aggregated.from_config(p), status, reason, 1, v)


def test_nothing_fits_in_memory():
    ctx = make_ctx()
    why, closest = rc._why_infeasible(ctx, _race(no_fit=(("tp1-b16-bf16-k0-c1024", "weights need 2 GPUs"),
                                                         ("tp2-b16-bf16-k0-c1024", "other"))))
    assert why == "no configuration of the search space fits in GPU memory: weights need 2 GPUs"
    assert closest.config is None and closest.miss == "weights need 2 GPUs"
    assert rc._why_infeasible(ctx, _race()) == ("no configuration of the search space fits in GPU memory: the search "
                                                "space is empty", None)
    ctx.memo[UNLAUNCHABLE] = "a replica over nodes cannot launch on trtllm"
    why, _ = rc._why_infeasible(ctx, _race(no_fit=(("k", "weights need 16 GPUs"),)))
    assert why == ("no configuration of the search space fits in GPU memory: weights need 16 GPUs; a replica over nodes "
                   "cannot launch on trtllm")


def test_never_fits_everywhere_and_zero_load_everywhere():
    ctx = make_ctx()
    outs = [_o(params(1), "never_fits", "too long A"), _o(params(2), "never_fits", "too long B")]
    why, closest = rc._why_infeasible(ctx, _race(outs))
    assert why == "in every configuration that fits in memory, too long B"
    assert closest.config == params(2) and closest.miss == "too long B"
    zl = [Probe("tp1-b16-bf16-k0-c1024", 0.01, 300, 0.5, False, reason="TTFT p90 900 ms > 400 ms"),
          Probe("tp2-b16-bf16-k0-c1024", 0.01, 300, 0.7, False, reason="TTFT p90 500 ms > 400 ms"),
          Probe("tp1-b16-fp8-k0-c1024", 0.01, 300, 0.6, False, reason="x")]
    outs = [_o(params(1), "zero_load"), _o(params(2), "zero_load"), _o(params(1, kv="fp8"), "never_fits")]
    why, closest = rc._why_infeasible(ctx, _race(outs, zl))
    assert why == ("TTFT p90 500 ms > 400 ms, even at zero load (one request at a time, so TTFT is the prefill alone), "
                   "in every configuration (simulated); the closest, tp2-b16-bf16-k0-c1024, meets the SLOs for 70.0% "
                   "of requests < 0.9")
    assert (closest.config, closest.miss, closest.attainment) == (params(2), "TTFT p90 500 ms > 400 ms", 0.7)
    tie = [dataclasses.replace(zl[0], attainment=0.7)] + zl[1:]     # equal attainment: the larger config key
    assert rc._why_infeasible(ctx, _race(outs, tie))[1].config == params(2)


def test_the_closest_priced_miss_is_the_one_on_the_fewest_gpus():
    ctx = make_ctx(rate=1000)
    a = Verification(params(1, 64), 20.0, 1, False, "A needs 50 GPUs", replicas=50, gpus=50, usd_per_hour=100.0)
    b = Verification(params(2, 64), 45.0, 1, False, "B needs 46 GPUs", replicas=23, gpus=46, usd_per_hour=92.0)
    c = Verification(params(1, 32), 21.74, 1, False, "C needs 46 GPUs", replicas=46, gpus=46, usd_per_hour=92.0)
    z = Verification(params(2, 16), 0.0, 1, False, "misses at a trickle")
    outs = [_o(v.params, "verified", v.reason, v) for v in (a, b, c, z)]
    why, closest = rc._why_infeasible(ctx, _race(outs))
    # 46 GPUs both; then the most goodput per GPU: C (21.74) over B (45 / 2 = 22.5)? B: 22.5 > 21.74
    assert closest.config == params(2, 64) and closest.usd_per_hour == 92.0 and closest.priced
    assert why == ("no configuration serves 1000 req/s within hardware.max_nodes 1 (8 GPUs), simulated; the closest: "
                   "B needs 46 GPUs")
    assert closest.miss == "B needs 46 GPUs"
    gctx = make_ctx("max_goodput", rate=1000)
    assert rc._why_infeasible(gctx, _race(outs))[0] == "B needs 46 GPUs"
    blank = dataclasses.replace(b, reason="")
    why, closest = rc._why_infeasible(gctx, _race([_o(b.params, "verified", "", blank)]))
    assert why == "simulated SLO attainment misses the target" and closest.miss == why


def test_unpriced_and_unverified_misses():
    ctx = make_ctx()
    z1 = Verification(params(2, 64), 0.0, 1, False, "")     # equal goodput (none): the larger config key
    z2 = Verification(params(1, 64), 0.0, 1, False, "misses at a trickle: TTFT")
    why, closest = rc._why_infeasible(ctx, _race([_o(z1.params, "verified", "", z1), _o(z2.params, "verified", "", z2)]))
    assert why == "simulated SLO attainment misses the target" and closest.config == params(2, 64)
    assert closest.priced and closest.usd_per_hour is None
    why, closest = rc._why_infeasible(ctx, _race([_o(z2.params, "verified", "", z2)]))
    assert why == closest.miss == "misses at a trickle: TTFT"
    outs = [_o(params(1), "zero_load"), _o(params(2), "beaten", "slow at 30"), _o(params(1, 32), "pruned", "p")]
    why, closest = rc._why_infeasible(ctx, _race(outs))
    assert why == ("no configuration serves 30 req/s within hardware.max_nodes 1 (8 GPUs), simulated; e.g. "
                   "tp2-b16-bf16-k0-c1024: slow at 30")
    assert closest.config == params(2) and closest.miss == "slow at 30" and not closest.priced


def test_infeasible_and_dearer_answers(monkeypatch):
    ctx = make_ctx()
    study = open_study(ctx, "grid", None, None)
    alive = _race([_o(params(2), "beaten", "slow at 30")])
    r = rc._infeasible(ctx, study, [], "grid", alive, usd_cap=5.0)
    assert r.status == "dearer" and r.reason == ("no deployment at or below $5.00/h meets the SLOs (a cheaper GPU type "
                                                 "was found first; searched no further)")
    assert r.sampler == "grid" and r.objective == "min_cost" and r.closest is None
    r2 = rc._infeasible(ctx, study, [], "grid", alive)
    assert r2.status == "infeasible" and r2.reason.endswith("e.g. tp2-b16-bf16-k0-c1024: slow at 30")
    assert r2.closest.config == params(2)
    dead = _race([_o(params(2), "zero_load")], [Probe("tp2-b16-bf16-k0-c1024", 0.01, 300, 0.5, False, reason="TTFT")])
    r3 = rc._infeasible(ctx, study, [], "tpe", dead, usd_cap=5.0)   # nothing alive: infeasible even under a cap
    assert r3.status == "infeasible" and r3.reason.startswith("TTFT, even at zero load") and r3.sampler == "tpe"
    # through recommend: the fake engine's cheapest is $4/h, so under a $3/h cap nothing is at or below it
    run = FakeRunner(ctx, G)
    patch_simulation(monkeypatch, run)
    r4 = rc.recommend(ctx, study, "grid", runner=run, usd_cap=3.0)
    assert r4.status == "dearer" and "$3.00/h" in r4.reason and r4.verification.configs == 0
    assert r4.sampler == "grid"
    assert len(r4.race) == len(KEYS)


def test_recommend_closes_the_runner_it_made_and_passes_the_stages(monkeypatch):
    ctx = make_ctx()
    seen = {}

    def fake_race(c, runner, on_stage=None, seeds=None, usd_cap=None, pool=None):
        seen.update(runner=runner, on_stage=on_stage, seeds=seeds, usd_cap=usd_cap, pool=pool)
        runner.screen([])        # a LocalRunner
        return Race((), 0, (), (("k", "no room"),))
    closed = []
    monkeypatch.setattr(rc, "race", fake_race)
    monkeypatch.setattr(ss.LocalRunner, "close", lambda self: closed.append(self))
    study = open_study(ctx, "grid", None, None)
    stage = lambda name, n: None   # noqa: E731
    r = rc.recommend(ctx, study, "grid", verify_top=3, on_stage=stage, usd_cap=7.0)
    assert isinstance(seen["runner"], ss.LocalRunner) and closed == [seen["runner"]] and seen["runner"].ctx is ctx
    assert seen["pool"] is None   # a lattice within search.exhaustive_max_configs: every config raced
    assert (seen["on_stage"], seen["seeds"], seen["usd_cap"]) == (stage, 3, 7.0)
    assert r.status == "infeasible" and r.reason.endswith("no room")
    mine = FakeRunner(ctx, G)
    rc.recommend(ctx, study, "grid", runner=mine)
    assert seen["runner"] is mine and len(closed) == 1 and seen["seeds"] == rc.VERIFY_TOP   # a given runner stays open
    assert seen["usd_cap"] == math.inf


def test_solve_runs_the_trials_then_recommends_with_its_overrides(monkeypatch):
    from race_fakes import spec_dict
    from kvtune.optimizer.workload import load_workload_dict
    got = []

    def fake_recommend(ctx, study, sampler, verify_top, runner, on_stage, overrides, usd_cap):
        got.append(dict(ctx=ctx, evals=completed_evals(study), sampler=sampler, verify_top=verify_top, runner=runner,
                        on_stage=on_stage, overrides=overrides, usd_cap=usd_cap))
        return "answer"
    monkeypatch.setattr(rc, "recommend", fake_recommend)
    spec = load_workload_dict(spec_dict(), "<test>")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    heard = []
    stage = lambda name, n: None   # noqa: E731
    assert rc.solve(spec, seed=3, sampler="grid", verify_top=2, jobs=1, usd_cap=9.0, calibration="h100-sxm",
                    on_trial=lambda done, total: heard.append((done, total)), on_stage=stage) == "answer"
    assert heard and heard[-1] == (12, 12) and got[-1]["on_stage"] is stage
    g = got[-1]
    assert len(g["evals"]) == 12                       # grid: every config of the lattice (2 TP x 3 caps x 2 KV)
    assert g["ctx"].seed == 3 and g["sampler"] == "grid" and g["verify_top"] == 2 and g["usd_cap"] == 9.0
    assert g["overrides"] == {"calibration": "h100-sxm", "engine": None, "profile": None}
    assert isinstance(g["runner"], ss.LocalRunner) and g["runner"].jobs == 1
    assert optuna.logging.get_verbosity() == optuna.logging.WARNING     # restored
    rc.solve(spec, sampler="tpe")
    assert len(got[-1]["evals"]) == spec.search.trials == 5 and got[-1]["ctx"].seed == 0
    assert got[-1]["runner"].jobs == 1                 # one process unless asked
    assert got[-1]["usd_cap"] == math.inf and got[-1]["verify_top"] == rc.VERIFY_TOP
    rc.solve(spec, trials=3, sampler="tpe", jobs=2)
    assert len(got[-1]["evals"]) == 3 and got[-1]["runner"].jobs == 2
    rc.solve(spec, trials=3, sampler="nsga2")          # two objectives ($/h, goodput): told as such
    assert len(got[-1]["evals"]) == 3 and got[-1]["sampler"] == "nsga2"
    rc.solve(spec, trials=1, sampler="tpe", calibration="ideal", engine="sglang")   # both reach the context
    assert got[-1]["ctx"].engine.record()["calibration"] == {"name": "ideal"} and got[-1]["ctx"].engine.engine == "sglang"
    assert got[-1]["overrides"] == {"calibration": "ideal", "engine": "sglang", "profile": None}


def test_solve_shares_the_race_through_a_storage_and_reads_a_profile(monkeypatch, tmp_path):
    from race_fakes import spec_dict
    from kvtune.optimizer.scaleout import StudyRunner
    from kvtune.optimizer.workload import load_workload_dict
    got = []
    monkeypatch.setattr(rc, "recommend", lambda ctx, study, sampler, vt, runner, *a: got.append((ctx, runner, study)) or 1)
    spec = load_workload_dict(spec_dict(), "<test>")
    rc.solve(spec, trials=2, storage=f"journal:{tmp_path}/s.log", study_name="mine")
    ctx, runner, study = got[-1]
    assert isinstance(runner, StudyRunner) and study.study_name == "mine" and runner.study.study_name == "mine:sim"
    assert runner.ctx is ctx
    # the screen's trials are in the journal, where another process resumes or shares them
    from kvtune.optimizer.search import make_storage
    shared = optuna.load_study(study_name="mine", storage=make_storage(f"journal:{tmp_path}/s.log"))
    assert len(shared.trials) == 2
    # and the race's work queue is there too, for the other processes to take work from
    assert "mine:sim" in optuna.get_all_study_names(make_storage(f"journal:{tmp_path}/s.log"))
    rc.solve(spec, trials=2, profile="profiles/tables/h100-published.csv")
    assert got[-1][0].engine.record()["profile"]["path"] == "profiles/tables/h100-published.csv"
    assert "profile" not in got[0][0].engine.record()


def test_lengths_size_the_context():
    ctx = make_ctx()
    assert rc._lengths(ctx.spec) == {"max_request_tokens": 1200, "max_prompt_tokens": 1000}


def test_a_speculative_pick_launches_with_its_draft(monkeypatch):
    """EAGLE3 at k = 2: the answer carries spec_k and every launch line the workload's draft."""
    ctx = make_ctx(speculative={"method": "eagle3", "acceptance": 0.75, "draft_cost": 0.05,
                                "draft_model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"}, spec_k=2)
    run = FakeRunner(ctx, {}, default=10.0)
    patch_simulation(monkeypatch, run)
    r = rc.recommend(ctx, open_study(ctx, "grid", None, None), "grid", runner=run)
    assert r.status == "ok" and r.recommendation.spec_k == 2 and r.recommendation.replicas == 3
    assert ('--speculative-config \'{"method":"eagle3","num_speculative_tokens":2,'
            '"model":"yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"}\'') in r.launch["vllm"]
    assert "--speculative-algorithm EAGLE3" in r.launch["sglang"]
    assert "--speculative-draft-model-path yuhuili/EAGLE3-LLaMA3.1-Instruct-8B" in r.launch["sglang"]


def test_a_pick_at_a_trickle_is_still_priced(monkeypatch):
    """0.004 req/s x 200 tokens = 0.8 output tok/s: $2/h over 2,880 tokens an hour = $694.44 per million."""
    ctx, r, _ = _answer(monkeypatch, rate=0.004)
    assert r.status == "ok" and r.cost.usd_per_hour == 2.0
    assert r.cost.usd_per_million_output_tokens == pytest.approx(2.0 / (0.8 * 3600) * 1e6)


def test_fp8_weights_and_another_draft_method_reach_the_launch_lines(monkeypatch):
    ctx = make_ctx(weights="fp8", speculative={"method": "eagle", "acceptance": 0.7, "draft_cost": 0.05,
                                               "draft_model": "yuhuili/EAGLE-LLaMA3.1-Instruct-8B"}, spec_k=2)
    run = FakeRunner(ctx, {}, default=10.0)
    patch_simulation(monkeypatch, run)
    r = rc.recommend(ctx, open_study(ctx, "grid", None, None), "grid", runner=run)
    assert "weights FP8 (1-byte GEMM weights" in r.launch["vllm"] and "weights bf16" not in r.launch["vllm"]
    assert '"method":"eagle","num_speculative_tokens":2' in r.launch["vllm"]


def _with_tpot(monkeypatch, mean):
    """A pick whose simulation at its load reports TPOT mean ``mean`` ms (None: no request had a second token)."""
    import race_fakes
    from kvtune.optimizer import verify as vf

    class AtTpot(race_fakes.FakeAt):
        def summary(self) -> dict:
            return {**super().summary(), "tpot_ms": {"p50": mean, "p90": mean, "p99": mean, "mean": mean}}

    ctx = make_ctx()
    run = FakeRunner(ctx, G)
    patch_simulation(monkeypatch, run)
    monkeypatch.setattr(vf, "simulate_at", lambda *a: AtTpot())
    return rc.recommend(ctx, open_study(ctx, "grid", None, None), "grid", runner=run)


def test_a_pick_below_one_ms_per_token_streams_over_1000_tokens_per_second(monkeypatch):
    """TPOT mean 0.8 ms (a small model, speculation): a user sees 1000 / 0.8 = 1,250 tok/s."""
    r = _with_tpot(monkeypatch, 0.8)
    assert r.status == "ok" and r.predicted.tok_s_per_user == pytest.approx(1250.0)


def test_a_pick_with_no_tpot_has_no_per_user_speed(monkeypatch):
    """Outputs of one token have no inter-token gap: the simulation's TPOT mean is null (read as nan)
    and so is the speed a user sees, 1000 / TPOT tok/s; the rest of the answer stands."""
    r = _with_tpot(monkeypatch, None)
    assert r.status == "ok" and r.cost.usd_per_hour == 4.0
    assert math.isnan(r.predicted.tpot_ms["mean"]) and math.isnan(r.predicted.tok_s_per_user)


def test_the_front_holds_only_configs_that_qualified(monkeypatch):
    """A verified config beyond max_nodes keeps its sizing (20 replicas of tp2 at 2 req/s: 40 GPUs,
    $80/h, 40 req/s on 5 nodes > 1) but never serves the target: it is not on the front, even with
    more goodput than the pick's 32 req/s or tp1 b64 bf16's 36 ($6/h); the front is those two alone."""
    from kvtune.optimizer import verify as vf
    ctx = make_ctx()
    run = FakeRunner(ctx, G)
    patch_simulation(monkeypatch, run)
    far = vf._sized(ctx, params(2, 64), 2.0, 5, 100, nominal=2.0, replicas=20)
    assert (far.feasible, far.gpus, far.usd_per_hour, far.goodput_req_s) == (False, 40, 80.0, 40.0)
    real_race = rc.race

    def race_and_far(*a, **kw):   # the race verified tp2 b64 bf16 too (beaten on the fake)
        r = real_race(*a, **kw)
        out = tuple(Outcome(o.config, "verified", far.reason, 5, far) if config_key(o.config) == config_key(far.params) else o
                    for o in r.outcomes)
        return dataclasses.replace(r, outcomes=out)
    monkeypatch.setattr(rc, "race", race_and_far)
    r = rc.recommend(ctx, open_study(ctx, "grid", None, None), "grid", runner=run)
    assert r.status == "ok" and any(not v.feasible and v.usd_per_hour == 80.0 for v in r.verified)
    assert [(x.gpus, x.usd_per_hour, x.goodput_req_s) for x in r.pareto] == [(2, 4.0, 32.0), (3, 6.0, 36.0)]


def test_the_last_of_several_never_fit_reasons_is_the_one_given():
    """Three configs, none fits its longest request: the answer names the last one raced (lattice order)."""
    ctx = make_ctx()
    outs = [_o(params(1), "never_fits", "too long A"), _o(params(2), "never_fits", "too long B"),
            _o(params(1, 64), "never_fits", "too long C")]
    why, closest = rc._why_infeasible(ctx, _race(outs))
    assert why == "in every configuration that fits in memory, too long C" and closest.config == params(1, 64)


def test_never_fitting_configs_are_infeasible_even_under_a_price_cap():
    """A cap from a cheaper GPU type makes an answer ``dearer`` only when something here meets the SLOs at
    some load; configs that never fit their requests (or miss at zero load) are not, so it is infeasible."""
    ctx = make_ctx()
    study = open_study(ctx, "grid", None, None)
    for status in ("never_fits", "zero_load"):
        r = rc._infeasible(ctx, study, [], "grid", _race([_o(params(1), status, "too long"),
                                                          _o(params(2), status, "too long")]), usd_cap=5.0)
        assert r.status == "infeasible" and r.reason == "in every configuration that fits in memory, too long"


def test_a_priced_miss_below_one_request_per_second_is_still_priced():
    """0.5 req/s per replica on TP2: 60 replicas, 120 GPUs for 30 req/s; the closest is that one, priced."""
    ctx = make_ctx()
    v = Verification(params(2, 64), 0.5, 1, False, "120 GPUs on 15 nodes", replicas=60, gpus=120,
                     usd_per_hour=240.0)
    why, closest = rc._why_infeasible(ctx, _race([_o(v.params, "verified", v.reason, v)]))
    assert why == ("no configuration serves 30 req/s within hardware.max_nodes 1 (8 GPUs), simulated; the closest: "
                   "120 GPUs on 15 nodes")
    assert closest.priced and closest.usd_per_hour == 240.0 and closest.config == params(2, 64)


def test_at_equal_gpus_the_closest_serves_the_most_per_gpu():
    """46 GPUs both: TP2 at 40 req/s per replica is 20 per GPU, TP1 at 21 is 21 per GPU: the TP1 one is closer
    (more per GPU), though its replica serves less. A miss with no reason reads as the SLO attainment's."""
    ctx = make_ctx(rate=1000)
    b = Verification(params(2, 64), 40.0, 1, False, "B", replicas=23, gpus=46, usd_per_hour=92.0)
    c = Verification(params(1, 32), 21.0, 1, False, "", replicas=46, gpus=46, usd_per_hour=92.0)
    why, closest = rc._why_infeasible(ctx, _race([_o(v.params, "verified", v.reason, v) for v in (b, c)]))
    assert closest.config == params(1, 32)
    assert why == ("no configuration serves 1000 req/s within hardware.max_nodes 1 (8 GPUs), simulated; the closest: "
                   "simulated SLO attainment misses the target")
    assert closest.miss == why


def test_the_workloads_own_draft_reaches_the_launch_lines(monkeypatch):
    """A draft head the workload names (not the catalog's published one for the target) is what every
    engine loads; no note says where a draft came from, since the user named it."""
    own = "acme/eagle3-llama-3.1-8b-finetuned"
    ctx = make_ctx(speculative={"method": "eagle3", "acceptance": 0.75, "draft_cost": 0.05, "draft_model": own},
                   spec_k=2)
    run = FakeRunner(ctx, {}, default=10.0)
    patch_simulation(monkeypatch, run)
    r = rc.recommend(ctx, open_study(ctx, "grid", None, None), "grid", runner=run)
    assert r.status == "ok" and r.recommendation.spec_k == 2
    assert f'"model":"{own}"' in r.launch["vllm"] and f"--speculative-draft-model-path {own}" in r.launch["sglang"]
    assert "yuhuili" not in r.launch["vllm"]


def test_headroom_is_against_the_target_rate_even_below_one_request_per_second(monkeypatch):
    """0.5 req/s: the cheapest pick serves its whole per-replica goodput, headroom goodput / 0.5 - 1."""
    _, r, _ = _answer(monkeypatch, rate=0.5)
    assert r.status == "ok" and r.predicted.goodput_req_s > 0.5
    assert r.headroom == pytest.approx(r.predicted.goodput_req_s / 0.5 - 1)


def test_max_goodput_without_a_target_rate_has_no_headroom(monkeypatch):
    """max_goodput with every request at t = 0 (rate .inf): the most goodput on the node (8 replicas of tp1 b64
    fp8 at 16 req/s); there is no target rate to have headroom over, so it is nan."""
    ctx, r, _ = _answer(monkeypatch, "max_goodput", rate=math.inf)
    assert math.isnan(ctx.rate_req_s)
    assert r.status == "ok" and r.predicted.goodput_req_s == 128.0 and math.isnan(r.headroom)


def test_the_check_command_names_the_gpu_and_the_solves_overrides(monkeypatch):
    """The printed ``kvtune simulate`` repeats the GPU (the workload names no gpu_file) and the calibration the
    solve was given, so it reproduces the pick's first fresh draw."""
    ctx = make_ctx()
    run = FakeRunner(ctx, G)
    patch_simulation(monkeypatch, run)
    r = rc.recommend(ctx, open_study(ctx, "grid", None, None), "grid", runner=run,
                     overrides={"calibration": "h100-sxm", "engine": None, "profile": None})
    assert r.status == "ok" and r.predicted.check.endswith(" --seed 1 --gpu h100-sxm --calibration h100-sxm")


def test_a_pick_over_two_nodes_names_its_layout(monkeypatch):
    """405B on two nodes of 8: every config is a multi-node layout (TP16, or TP8 x PP2); whichever the fake
    engine picks, the answer names that layout and its parallelism."""
    from kvtune.optimizer.search import SolveContext
    from kvtune.optimizer.workload import load_workload_dict
    from race_fakes import spec_dict
    d = dict(spec_dict(tp=(8,), max_nodes=2, kv=("fp8",), caps=(64, 64), rate=1), model="llama-3.1-405b")
    ctx = SolveContext.build(load_workload_dict(d, "<test>"))
    run = FakeRunner(ctx, {}, default=2.0)
    patch_simulation(monkeypatch, run)
    r = rc.recommend(ctx, open_study(ctx, "grid", None, None), "grid", runner=run)
    rec = r.recommendation
    assert r.status == "ok" and rec.layout in ctx.layouts and rec.gpus == 16 and rec.nodes == 2
    assert (rec.tp, rec.pp) == (ctx.layouts[rec.layout]["tp"], ctx.layouts[rec.layout]["pp"])


def test_the_workloads_engine_runs_in_the_manifest_with_its_activation_reserve(monkeypatch):
    """engine: sglang picks SGLang's shipped calibration, whose activation reserve is 4.65e9 bytes per GPU
    (profiles/calibrations/h100-sxm-sglang.yaml): the launch lines plan memory with 4.7 GB held back, and the
    Kubernetes manifest runs SGLang."""
    from kvtune.optimizer.search import SolveContext
    from kvtune.optimizer.workload import load_workload_dict
    from race_fakes import spec_dict
    ctx = SolveContext.build(load_workload_dict(dict(spec_dict(), engine="sglang"), "<test>"))
    assert ctx.eff.activation_reserve_bytes == 4.65e9
    run = FakeRunner(ctx, G)
    patch_simulation(monkeypatch, run)
    r = rc.recommend(ctx, open_study(ctx, "grid", None, None), "grid", runner=run)
    assert r.status == "ok" and r.engine == "sglang"
    assert "activation reserve 4.7 GB" in r.launch["sglang"] and "activation reserve 4.7 GB" in r.launch["vllm"]
    assert "sglang.launch_server" in r.launch["k8s"] and "vllm serve" not in r.launch["k8s"]


def test_a_model_given_as_a_config_json_launches_a_placeholder_that_names_it(monkeypatch, tmp_path):
    """A config.json without ``_name_or_path`` has no Hugging Face id: the launch line says which file was
    given and where to put the id, rather than launching the folder's name."""
    import json
    from kvtune.costmodel.files import profiles_path
    from kvtune.optimizer.search import SolveContext
    from kvtune.optimizer.workload import load_workload_dict
    from race_fakes import spec_dict
    path = tmp_path / "my-finetune" / "config.json"
    path.parent.mkdir()
    path.write_text(profiles_path("models", "llama-3.1-8b.json").read_text())
    assert "_name_or_path" not in json.loads(path.read_text())
    ctx = SolveContext.build(load_workload_dict(dict(spec_dict(), model=str(path)), "<test>"))
    run = FakeRunner(ctx, {}, default=16.0)
    patch_simulation(monkeypatch, run)
    r = rc.recommend(ctx, open_study(ctx, "grid", None, None), "grid", runner=run)
    assert r.status == "ok" and ctx.model.hf_id == ""
    assert f"model given as {path} (a config.json)" in r.launch["vllm"]
    assert "vllm serve '<hf-org/model-or-local-folder>'" in r.launch["vllm"] and "my-finetune \\" not in r.launch["vllm"]


def test_a_profile_the_solve_read_is_in_the_answer(monkeypatch):
    """A measured profile table given to the solve is named in the answer (path and how much it answered)."""
    from kvtune.optimizer.search import SolveContext
    from kvtune.optimizer.workload import load_workload_dict
    from race_fakes import spec_dict
    table = "profiles/tables/h100-published.csv"
    ctx = SolveContext.build(load_workload_dict(spec_dict(), "<test>"), None, None, None, table)
    run = FakeRunner(ctx, G)
    patch_simulation(monkeypatch, run)
    r = rc.recommend(ctx, open_study(ctx, "grid", None, None), "grid", runner=run)
    assert r.profile is not None and r.profile.path == table and len(r.profile.sha256) == 64


def test_the_race_rows_keep_each_configs_reason(monkeypatch):
    """Every config the race put out carries its reason into the answer; the one verified has none."""
    _, r, _ = _answer(monkeypatch)
    verified = [x for x in r.race if x.status == "verified"]
    beaten = [x for x in r.race if x.status == "beaten"]
    assert verified and all(x.reason == "" for x in verified)      # both verified here qualify
    assert len(verified) + len(beaten) == len(KEYS) and all(x.reason for x in beaten)


def test_the_race_counts_every_config_of_an_exhausted_lattice_fitting_or_not():
    """verification.raced: the configs the race covered, those that do not fit in memory included
    (70B bf16 weights, ~141 GB, fit no single 80 GB GPU): exhaustive, it is the whole lattice."""
    from tiny_workload import tiny_8b_spec
    spec = tiny_8b_spec({"tp": [1, 4], "batch_cap": [16, 64], "kv_dtype": ["bf16"], "chunk_tokens": [1024, 4096],
                         "trials": 6, "seed": 0, "deployment": ["aggregated"]}, model="llama-3.1-70b")
    r = rc.solve(spec)
    v = r.verification
    assert v.searched == "exhaustive" and v.lattice_configs == 18
    assert len(r.race) == 9 and v.raced == v.lattice_configs   # the 9 TP1 configs never fit, and count
