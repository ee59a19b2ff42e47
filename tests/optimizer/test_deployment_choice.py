"""kvtune solve searches aggregated and disaggregated deployments (search.deployment, default
both; optimizer.deployment_choice): the kind that wins for the objective, by how much against the
best of the other kind, the JSON's keys kept and the pools added, launch settings for the pools."""

from __future__ import annotations

import dataclasses
import json
import math
import pytest
import yaml
from pathlib import Path
from click.testing import CliRunner
from kvtune.optimizer.cli import main
from solve_fakes import solve_kinds
from kvtune.optimizer import deployment_choice as dc, gpu_choice
from kvtune.optimizer.disagg import DisaggCandidate, PoolChoice
from kvtune.optimizer.disagg_verify import UnitVerification
from kvtune.optimizer.result import AggregatedSummary, Cost, DeploymentChoice, DisaggregatedMiss, DisaggregatedRecommendation, DisaggregatedSummary, Predicted, Recommendation, SolveResult, TrialCounts, VerificationCounts
from kvtune.optimizer.objective import objective_for
from kvtune.optimizer.search import SolveContext
from kvtune.optimizer.verify import Draws
from kvtune.optimizer.workload import load_workload_dict

def _workload(tmp_path, name, model, inp, out, rate, ttft_ms, tpot_ms, tp, deployment=None, max_nodes=2):
    w = {"model": model, "weights": "bf16",
         "hardware": {"gpu": "h100-sxm", "gpus_per_node": 8, "usd_per_gpu_hour": 3.0, "max_nodes": max_nodes},
         "workload": {"rate_req_s": rate, "classes": [{"name": "c", "share": 1.0, "input_tokens": inp,
                                                        "output_tokens": out}]},
         "slo": {"ttft_ms": ttft_ms, "tpot_ms": tpot_ms, "attainment": 0.9}, "objective": "min_cost",
         "search": {"tp": tp, "batch_cap": [8, 512], "kv_dtype": ["bf16"], "chunk_tokens": [512, 16384],
                    "trials": 16, "seed": 0, **({"deployment": deployment} if deployment else {})}}
    p = tmp_path / f"{name}.yaml"
    p.write_text(yaml.safe_dump(w))
    return p


def _solve(path, tmp_path):
    out = tmp_path / (path.stem + ".json")
    r = CliRunner().invoke(main, ["solve", str(path), "--quiet", "--json", str(out)])
    assert r.exit_code == 0, r.output
    return json.loads(out.read_text()), r.output


RAG = Path(__file__).parent.resolve().parents[1] / "examples" / "rag-llama3.1-70b.yaml"


@pytest.fixture(scope="module")
def long_prompts(tmp_path_factory):
    # Llama-3.1-70B, 60% 1,000- and 40% 8,000-token prompts, ~300 output tokens, 4 req/s
    return _solve(RAG, tmp_path_factory.mktemp("long"))


@pytest.mark.xdist_group("rag-long-prompts")   # its module fixture solved once, on one worker
@pytest.mark.slow
def test_long_prompts_and_tight_slos_pick_a_disaggregated_deployment_with_its_pools_and_launch(long_prompts):
    r, text = long_prompts
    d = r["deployment"]
    assert d["searched"] == ["aggregated", "disaggregated"] and d["kind"] == "disaggregated"
    rec = r["recommendation"]
    assert rec["deployment"] == "disaggregated"
    assert rec["gpus"] == rec["prefill"]["gpus"] + rec["decode"]["gpus"]
    assert rec["prefill"]["gpus"] == rec["prefill"]["tp"] * rec["prefill"]["replicas"]
    # cheaper than the best aggregated deployment by the margin it prints, both simulated
    a = d["aggregated"]
    assert r["cost"]["usd_per_hour"] < a["usd_per_hour"]
    # both kinds on the example's $3.00 H100-hour: each $/h is its GPU count x 3, and the margin (min_cost:
    # the $/h saved) is the ratio of the GPU counts, not of the figures the code printed
    assert a["usd_per_hour"] == pytest.approx(3.0 * a["gpus"]) and r["cost"]["usd_per_hour"] == pytest.approx(3.0 * rec["gpus"])
    assert a["gpus"] > rec["gpus"] and d["margin_pct"] == pytest.approx(100 * (a["gpus"] / rec["gpus"] - 1))
    assert r["predicted"]["goodput_req_s"] >= r["target_rate_req_s"] and r["predicted"]["evidence"] == "simulated"
    assert r["predicted"]["slo_attainment"] >= 0.9
    assert f"by {d['margin_pct']:.1f}% in $/h" in text and "Recommendation: disaggregated" in text
    # the launch is the pools': vLLM's NixlConnector on both, the router lists every replica
    v = r["launch"]["vllm"]
    assert v.count("--kv-transfer-config") == 2 and "vllm-router" in v
    assert v.count("--prefill 'http://") == rec["prefill"]["replicas"] and v.count("--decode 'http://") == rec["decode"]["replicas"]
    assert "--disaggregation-mode prefill" in r["launch"]["sglang"] and "StatefulSet" in r["launch"]["k8s"]
    assert "vllm serve" in r["launch_aggregated"]["vllm"]


@pytest.mark.xdist_group("rag-long-prompts")   # its module fixture solved once, on one worker
@pytest.mark.slow
def test_the_json_keeps_the_aggregated_keys(long_prompts, tmp_path):
    r, _ = long_prompts
    w = yaml.safe_load(RAG.read_text())
    w["search"]["deployment"] = ["aggregated"]
    (tmp_path / "traces").mkdir()
    p = tmp_path / "agg.yaml"
    p.write_text(yaml.safe_dump(w))
    agg, _ = _solve(p, tmp_path)
    assert agg["deployment"] == {"kind": "aggregated", "searched": ["aggregated"]}
    assert set(agg) - {"deployment"} <= set(r)
    assert set(agg["recommendation"]) <= set(r["recommendation"]) | {"pp", "ep", "dp_attention", "nodes_per_replica",
                                                                    "gpus_per_node", "layout"}
    assert set(agg["predicted"]) <= set(r["predicted"]) and set(agg["cost"]) <= set(r["cost"])
    # the aggregated-only answer is the reference the disaggregated one was measured against
    assert agg["cost"]["usd_per_hour"] == r["deployment"]["aggregated"]["usd_per_hour"]


@pytest.mark.slow   # a whole CLI solve, ~24 s on 2 cores; tests/optimizer/test_deployment_choice.py checks the same choice on fakes
def test_short_prompts_on_a_small_model_stay_aggregated_and_say_by_how_much(tmp_path):
    r, text = _solve(_workload(tmp_path, "short", "llama-3.1-8b", 256, 1024, 20, 1000, 25, [1, 2]), tmp_path)
    d = r["deployment"]
    assert d["kind"] == "aggregated" and d["against"] == "disaggregated" and d["margin_pct"] > 0
    assert d["disaggregated"]["usd_per_hour"] > r["cost"]["usd_per_hour"]
    assert "aggregated beats the best disaggregated" in text
    assert "deployment" not in r["recommendation"]


def test_search_deployment_is_checked(tmp_path):
    p = _workload(tmp_path, "bad", "llama-3.1-8b", 256, 256, 1, 1000, 50, [1], deployment=["disagg"])
    r = CliRunner().invoke(main, ["solve", str(p), "--quiet"])
    assert r.exit_code == 2 and "search.deployment" in r.output and "Traceback" not in r.output


@pytest.mark.slow
def test_disaggregated_only_recommends_it_and_names_the_aggregated_best(tmp_path):
    w = yaml.safe_load(RAG.read_text())
    w["search"]["deployment"] = ["disaggregated"]
    p = tmp_path / "d.yaml"
    p.write_text(yaml.safe_dump(w))
    r, text = _solve(p, tmp_path)
    d = r["deployment"]
    assert d["searched"] == ["disaggregated"] and d["kind"] == "disaggregated" and d["margin_pct"] is None
    assert r["recommendation"]["deployment"] == "disaggregated"
    assert "lists disaggregated only; the best aggregated would be" in text


@pytest.mark.slow
def test_a_disaggregated_deployment_answers_where_no_aggregated_one_meets_the_slos(tmp_path):
    import dataclasses

    from kvtune.optimizer.cli.solve import summary_text
    from solve_fakes import solve_kinds
    from kvtune.optimizer.recommend import solve
    from kvtune.optimizer.workload import load_workload

    spec = load_workload(str(RAG))
    tight = dataclasses.replace(spec, hardware=dataclasses.replace(spec.hardware, max_nodes=1))
    agg = solve(dataclasses.replace(tight, workload=dataclasses.replace(tight.workload, rate_req_s=5.0)), trials=12)
    assert agg.status != "ok"
    r = solve_kinds(spec, lambda s, **kw: agg, trials=12)
    assert r.status == "ok" and r.recommendation.deployment == "disaggregated"
    assert r.deployment.aggregated is None and r.deployment.margin_pct is None
    assert "Recommendation: disaggregated" in summary_text(r, None)


@pytest.mark.slow
def test_the_disaggregated_bound_counts_only_the_prompt_tokens_the_prefix_cache_does_not_hold():
    """Issue 22: an agent workload whose prompts share a 4,000-token prefix. Charging every prompt
    token to the prefill pool capped a unit's goodput at that bound, far below what it simulates to;
    the bound over the uncached tokens is still an upper bound and no longer the limit."""
    from kvtune.costmodel.deployment import Pool, disaggregated_bound_req_s, kv_link, simulate_disaggregated
    from kvtune.costmodel.goodput import goodput
    from kvtune.optimizer.disagg import uncached_prompt_tokens
    from kvtune.optimizer.search import SolveContext
    from kvtune.optimizer.workload import load_workload

    spec = load_workload(str(Path(__file__).parent.resolve().parents[1] / "bench/oracle/agent-prefix4k-llama3.1-8b-min-cost.yaml"))
    ctx = SolveContext.build(spec)
    step = ctx.step(1, "bf16", 0)
    pre = Pool(step, ctx.engine.sim_config(16, 8192), 1)
    dec = Pool(step, ctx.engine.sim_config(256, 8192), 1)
    probe = spec.requests(2000, 0, rate_req_s=1.0)
    mean_in, mean_out = float(probe.input_tokens.mean()), float(probe.output_tokens.mean())
    todo = uncached_prompt_tokens(probe)
    assert todo < 0.25 * mean_in                              # ~800 of ~4,800 prompt tokens are computed
    old = disaggregated_bound_req_s(pre, dec, mean_in, mean_out)
    new = disaggregated_bound_req_s(pre, dec, mean_in, mean_out, todo)
    link = kv_link(ctx.gpu, True)

    def sim(req, arrival, wf):
        return simulate_disaggregated(pre, dec, req, link, arrival, 0, wf, engine="vllm").result

    def make(r, n, s):
        return spec.requests(n, s, rate_req_s=r)
    capped = goodput(dec.step, make, dec.config, 0.9, n_requests=600, rel_tol=0.02, sim=sim, upper_bound_req_s=old)
    free = goodput(dec.step, make, dec.config, 0.9, n_requests=600, rel_tol=0.02, sim=sim, upper_bound_req_s=new)
    assert capped.capacity_limited and capped.goodput_req_s == pytest.approx(old)   # the old bound was the answer
    assert free.goodput_req_s > 1.5 * old and free.goodput_req_s <= new


# optimizer/deployment_choice.py piece by piece, on small synthetic inputs whose answers are derived
# by hand (issue 25 item 1: the module's own tests are mostly end-to-end solves marked slow, which the
# mutation runs leave out).
#
# The searches and verifications are replaced by fakes where the functions take them (``solve_one``)
# or look them up in the module (``search_disaggregated``, ``verify_unit``, ``robust_unit``,
# ``disaggregated_answer``, ``disaggregated_command``); the solve context is the real one (built in
# well under a second). Workload: Llama-3.1-8B on H100 at $2.00 per GPU-hour, 8 GPUs per node, at
# most 2 nodes (16 GPUs), a target of 10 req/s, min_cost, bf16 and fp8 KV searched.

USD = 2.0           # $ per GPU-hour
RATE = 10.0         # req/s


def _doc(objective="min_cost", deployment=None, **hw):
    return {"model": "llama-3.1-8b", "weights": "bf16",
            "hardware": {"gpu": "h100-sxm", "gpus_per_node": 8, "usd_per_gpu_hour": USD, "max_nodes": 2, **hw},
            "workload": {"rate_req_s": RATE, "classes": [{"name": "c", "share": 1.0, "input_tokens": 1000,
                                                           "output_tokens": 200}]},
            "slo": {"ttft_ms": 1000, "tpot_ms": 50, "attainment": 0.9}, "objective": objective,
            "search": {"tp": [1, 2], "batch_cap": [8, 256], "kv_dtype": ["bf16", "fp8"],
                       "chunk_tokens": [512, 8192], "trials": 8, "seed": 0,
                       **({"deployment": deployment} if deployment else {})}}


@pytest.fixture(scope="module")
def spec():
    return load_workload_dict(_doc())


@pytest.fixture(scope="module")
def gspec():
    return load_workload_dict(_doc(objective="max_goodput"))


@pytest.fixture(scope="module")
def ctx(spec):
    return SolveContext.build(spec)


_CTX: dict = {}


def _ctx(s):
    """The solve context of a workload, built once."""
    if id(s) not in _CTX:
        _CTX[id(s)] = (s, SolveContext.build(s))
    return _CTX[id(s)][1]


def _cand(p_tp=1, p_rep=1, d_tp=2, d_rep=1, goodput=3.0, rnd="final", chunk=2048, cap=64, link="nvlink"):
    return DisaggCandidate(PoolChoice(p_tp, p_rep, 16, chunk), PoolChoice(d_tp, d_rep, cap, 512), link,
                           bound_req_s=100.0, goodput_req_s=goodput, simulations=5, round=rnd)


def _unit(c=None, kv="bf16", per_unit=3.0, nominal=None, units=4, usd=None, feasible=True, draws=None, at=None,
          fleet=10.0):
    c = c or _cand()
    gpus = units * c.gpus
    return UnitVerification(c, kv, "vllm", per_unit, per_unit if nominal is None else nominal, 400, 7, feasible,
                            "", units, gpus, math.ceil(gpus / 8), gpus * USD if usd is None else usd, fleet, draws, at)


def _rec(tp=2, kv="bf16", replicas=3, gpus=6):
    return Recommendation(tp=tp, batch_cap=64, kv_dtype=kv, spec_k=0, chunk_tokens=2048, pp=1, ep=1,
                          dp_attention=False, nodes_per_replica=1, gpus_per_node=8, layout=None, replicas=replicas,
                          gpus=gpus, nodes=1, gpu="h100-sxm", model="llama-3.1-8b")


def _result(status="ok", usd=12.0, goodput=11.0, ranked=None, kv="bf16", objective="min_cost", launch=None):
    base = SolveResult(kvtune_version="0", seed=0, workload_seed=0, sampler="tpe", source="test",
                       objective=objective, study_name="s", target_rate_req_s=RATE,
                       trials=TrialCounts(completed=1, feasible=1),
                       verification=VerificationCounts(configs=1, simulations=1, work_items=1, outcomes={}),
                       status=status, verified=(), race=(), reason=None if status == "ok" else "nothing fits")
    if status != "ok":
        return base
    return dataclasses.replace(
        base, recommendation=_rec(kv=kv, gpus=int(round(usd / USD))),
        predicted=Predicted(goodput_req_s=goodput, per_replica_goodput_req_s=goodput / 3, slo_attainment=0.95,
                            ttft_ms={"p90": 100.0}, tpot_ms={"p90": 20.0, "mean": 15.0}, output_tok_s=2000.0,
                            tok_s_per_user=60.0, load_per_replica_req_s=RATE / 3, evidence="simulated",
                            ranked_goodput_req_s=ranked),
        cost=Cost(usd_per_hour=usd, usd_per_gpu_hour=USD, usd_per_million_output_tokens=1.0, priced_at="target rate"),
        launch=launch or {"vllm": "vllm serve aggregated"})


def _agg(usd=12.0, goodput=11.0, ranked=None, kv="bf16", gpus=6, tp=2):
    return AggregatedSummary(gpus=gpus, usd_per_hour=usd, goodput_req_s=goodput, per_replica_goodput_req_s=goodput / 3,
                             config={"tp": tp, "kv_dtype": kv}, ranked_goodput_req_s=ranked)


def _dis(usd=8.0, goodput=12.0, ranked=None, kv="bf16", units=4, c=None):
    c = c or _cand()
    return DisaggregatedSummary(gpus=units * c.gpus, nodes=1, usd_per_hour=usd, goodput_req_s=goodput, units=units,
                                unit=c, kv_dtype=kv, engine="vllm", evidence="simulated", ranked_goodput_req_s=ranked)


# --- units, score and margin ------------------------------------------------------------------------------------

def test_units_min_cost_are_the_target_rate_over_a_units_goodput_rounded_up(spec, gspec):
    c = _cand(goodput=3.0)                                   # 3 GPUs: TP1 prefill + TP2 decode
    assert c.gpus == 3
    cost, good = objective_for(spec.objective), objective_for(gspec.objective)   # a unit is sized as a replica is
    assert cost.replicas(10.0, c.goodput_req_s, c.gpus, 16) == 4                 # ceil(10 / 3)
    assert cost.replicas(9.0, c.goodput_req_s, c.gpus, 16) == 3                  # exactly 3 units, not 4
    assert cost.replicas(1.0, c.goodput_req_s, c.gpus, 16) == 1
    assert cost.replicas(0.0, c.goodput_req_s, c.gpus, 16) == 1                  # at least one unit
    assert cost.replicas(10.0, 0.0, c.gpus, 16) == 0
    # max_goodput: as many units as hardware.max_nodes holds; none where one does not fit
    assert good.replicas(10.0, c.goodput_req_s, c.gpus, 16) == 5                 # 16 // 3
    assert good.replicas(10.0, c.goodput_req_s, c.gpus, 2) == 0


def test_score_min_cost_is_dollars_then_more_goodput(spec):
    s = dc._score(_ctx(spec), 16, 10.0, USD)
    assert s(_cand(goodput=3.0)) == (4 * 3 * USD, -3.0)      # 4 units x 3 GPUs x $2
    assert s(_cand(goodput=5.0)) == (2 * 3 * USD, -5.0)
    assert s(_cand(goodput=0.0)) == (math.inf, 0.0)
    assert s(_cand(goodput=math.nan)) == (math.inf, 0.0)
    # 20 req/s at 3 per unit needs 7 units = 21 GPUs > 16: not deployable
    assert dc._score(_ctx(spec), 16, 20.0, USD)(_cand(goodput=3.0)) == (math.inf, 0.0)
    assert dc._score(_ctx(spec), 21, 20.0, USD)(_cand(goodput=3.0)) == (42.0, -3.0)
    # a price cap from another GPU type: $24/h is allowed at a $24 cap, not at $23.99
    assert dc._score(_ctx(spec), 16, 10.0, USD, usd_cap=24.0)(_cand(goodput=3.0)) == (24.0, -3.0)
    assert dc._score(_ctx(spec), 16, 10.0, USD, usd_cap=23.99)(_cand(goodput=3.0)) == (math.inf, 0.0)


def test_score_max_goodput_is_goodput_per_dollar_then_fewer_gpus(gspec):
    s = dc._score(_ctx(gspec), 16, math.nan, USD)
    assert s(_cand(goodput=3.0)) == (-(3.0 / (3 * USD)), 3)
    assert s(_cand(d_tp=4, goodput=6.0)) == (-(6.0 / (5 * USD)), 5)
    # a unit larger than the whole allowance
    assert dc._score(_ctx(gspec), 2, math.nan, USD)(_cand(goodput=3.0)) == (math.inf, 0.0)
    # the cap applies to min_cost only
    assert dc._score(_ctx(gspec), 16, math.nan, USD, usd_cap=1.0)(_cand(goodput=3.0)) == (-0.5, 3)


def test_margin_min_cost_is_the_dollars_saved_and_max_goodput_the_goodput_per_dollar_gained(spec, gspec):
    assert dc._margin(spec, _dis(usd=8.0), _agg(usd=12.0)) == pytest.approx(50.0)       # 12 / 8 - 1
    assert dc._margin(spec, _agg(usd=12.0), _dis(usd=15.0)) == pytest.approx(25.0)
    # max_goodput on the ranked goodput where there is one: (6/8) / (4/10) - 1 = 87.5%
    w, lo = _dis(usd=8.0, goodput=99.0, ranked=6.0), _agg(usd=10.0, goodput=4.0)
    assert dc._margin(gspec, w, lo) == pytest.approx(87.5)
    assert dc._ranked(w) == 6.0 and dc._ranked(lo) == 4.0


def test_better_follows_the_objective_on_the_ranked_goodput(spec, gspec):
    assert dc._better(spec, _dis(usd=8.0), _agg(usd=12.0))
    assert not dc._better(spec, _dis(usd=12.0), _agg(usd=8.0))
    # same $/h: more (ranked) goodput wins; a tie is not better
    assert dc._better(spec, _dis(usd=12.0, goodput=1.0, ranked=12.0), _agg(usd=12.0, goodput=20.0, ranked=11.0))
    assert not dc._better(spec, _dis(usd=12.0, goodput=20.0, ranked=10.0), _agg(usd=12.0, goodput=1.0, ranked=11.0))
    assert not dc._better(spec, _dis(usd=12.0, goodput=11.0), _agg(usd=12.0, goodput=11.0))
    # same $/h, bf16 and fp8 both searched: bf16 KV wins over fp8 KV whatever the goodput
    assert not dc._better(spec, _dis(usd=12.0, goodput=30.0, kv="fp8"), _agg(usd=12.0, goodput=11.0, kv="bf16"))
    assert dc._better(spec, _dis(usd=12.0, goodput=1.0, kv="bf16"), _agg(usd=12.0, goodput=11.0, kv="fp8"))
    # an aggregated config without kv_dtype reads as bf16
    a = dataclasses.replace(_agg(usd=12.0, goodput=1.0), config={"tp": 2})
    assert not dc._better(spec, _dis(usd=12.0, goodput=30.0, kv="fp8"), a)
    # max_goodput: goodput per $ (12/8 = 1.5 against 11/6 = 1.83)
    assert not dc._better(gspec, _dis(usd=8.0, goodput=12.0), _agg(usd=6.0, goodput=11.0))
    assert dc._better(gspec, _dis(usd=8.0, goodput=16.0), _agg(usd=6.0, goodput=11.0))


def test_result_rank_sorts_a_failed_answer_last_and_ranks_on_the_ranked_goodput(spec, gspec):
    assert gpu_choice.result_rank(spec, _result(status="infeasible")) == (1,)
    assert gpu_choice.result_rank(spec, _result(usd=12.0, goodput=11.0)) == (0, 12.0, False, -11.0)
    assert gpu_choice.result_rank(spec, _result(usd=12.0, goodput=11.0, ranked=9.0)) == (0, 12.0, False, -9.0)
    assert gpu_choice.result_rank(spec, _result(usd=12.0, goodput=11.0, kv="fp8")) == (0, 12.0, True, -11.0)
    assert gpu_choice.result_rank(gspec, _result(usd=10.0, goodput=20.0)) == (0, -2.0, 10.0)
    ok = _result()
    for missing in ("cost", "predicted", "recommendation"):
        assert gpu_choice.result_rank(spec, dataclasses.replace(ok, **{missing: None})) == (1,)


def test_aggregated_summary_keeps_the_figures_and_the_configs_keys(spec):
    r = _result(usd=12.0, goodput=11.0, ranked=10.5)
    s = dc._agg_summary(r)
    assert s == AggregatedSummary(gpus=6, usd_per_hour=12.0, goodput_req_s=11.0, per_replica_goodput_req_s=11.0 / 3,
                                  config={"tp": 2, "batch_cap": 64, "kv_dtype": "bf16", "spec_k": 0,
                                          "chunk_tokens": 2048, "replicas": 3},
                                  ranked_goodput_req_s=10.5)
    assert dc._agg_summary(_result(status="infeasible")) is None
    for missing in ("cost", "predicted", "recommendation"):
        assert dc._agg_summary(dataclasses.replace(r, **{missing: None})) is None


# --- the disaggregated answer -----------------------------------------------------------------------------------

def test_best_unit_takes_the_best_robust_unit_and_stops_when_none_can_beat_it(ctx, monkeypatch):
    made = []

    def robust(c, u, jobs=1):
        made.append((u.usd_per_hour, jobs))
        # the $18 unit's draws need one more unit; the others hold
        return dataclasses.replace(u, units=u.units + 1, usd_per_hour=u.usd_per_hour + 6.0) if u.usd_per_hour == 18.0 \
            else u
    monkeypatch.setattr(dc, "robust_unit", robust)
    a = _unit(c=_cand(goodput=3.0), units=3, usd=18.0)       # nominal best: $18, robust $24
    b = _unit(c=_cand(goodput=2.5), units=4, usd=21.0)       # robust $21: the answer
    c = _unit(c=_cand(goodput=2.0), units=4, usd=30.0)       # nominally dearer than $21: never made robust
    assert dc._best_unit(ctx, [c, b, a], jobs=3) == b
    assert made == [(18.0, 3), (21.0, 3)]
    # infeasible units and units dearer than the cap are left out before and after
    made.clear()
    assert dc._best_unit(ctx, [dataclasses.replace(a, feasible=False), b], usd_cap=20.0) is None
    assert made == []
    assert dc._best_unit(ctx, [a, b], usd_cap=21.0) == b        # a's robust $24 is over the cap
    assert dc._best_unit(ctx, []) is None


def test_best_unit_keeps_the_first_of_equal_robust_units_and_a_max_goodput_search_has_no_cap(ctx, monkeypatch):
    monkeypatch.setattr(dc, "robust_unit", lambda c, u, jobs=1: u)
    a = _unit(c=_cand(goodput=3.0), units=3, usd=18.0)
    b = _unit(c=_cand(goodput=3.0, chunk=4096), units=3, usd=18.0)   # ties a's objective; a larger chunk sorts later
    assert dc._best_unit(ctx, [b, a]) == a
    g = dataclasses.replace(ctx, spec=dataclasses.replace(ctx.spec, objective="max_goodput"),
                            objective=objective_for("max_goodput"))
    assert dc._best_unit(g, [a], usd_cap=1.0) == a


def test_disaggregated_recommendation_multiplies_the_pools_by_the_units():
    c = _cand(p_tp=1, p_rep=2, d_tp=2, d_rep=1, chunk=4096, cap=128, link="network")
    r = dc._disagg_recommendation("llama-3.1-8b", "h100-sxm", _dis(units=3, c=c, kv="fp8"))
    assert r.prefill == PoolChoice(1, 6, 16, 4096) and r.decode == PoolChoice(2, 3, 128, 512)
    assert (r.tp, r.batch_cap, r.chunk_tokens, r.replicas, r.spec_k, r.kv_dtype) == (2, 128, 4096, 9, 0, "fp8")
    assert (r.gpus, r.units, r.link, r.gpu, r.model, r.nodes) == (12, 3, "network", "h100-sxm", "llama-3.1-8b", 1)


def test_summary_of_a_verified_unit(ctx):
    u = _unit(c=_cand(goodput=3.0), per_unit=2.5, nominal=2.75, units=4)
    s = dc._summary(ctx, u)
    assert (s.gpus, s.nodes, s.usd_per_hour, s.units, s.kv_dtype, s.engine, s.evidence) == \
        (12, 2, 24.0, 4, "bf16", "vllm", "simulated")
    assert s.goodput_req_s == 10.0 and s.ranked_goodput_req_s == 11.0
    assert s.unit.goodput_req_s == 2.5 and s.unit.round == "verified" and s.unit.simulations == 5 + 7


class _Search:
    def __init__(self, simulated):
        self.simulated = tuple(simulated)

    def to_json(self):
        return {"n": len(self.simulated)}


def test_disaggregated_answer_verifies_the_three_best_final_candidates_over_both_kv_dtypes(spec, monkeypatch):
    calls, verified = [], []
    per_kv = {"bf16": [_cand(goodput=3.0), _cand(goodput=5.0, rnd="short"), _cand(goodput=2.0),
                       _cand(goodput=0.0), _cand(d_tp=4, d_rep=4, goodput=2.0)],   # 17 GPUs: over the 16
              "fp8": [_cand(goodput=5.0), _cand(goodput=2.5)]}

    def search(step_for, sim_config, make, attainment, **kw):
        kv = "bf16" if not calls else "fp8"
        calls.append(dict(kw, attainment=attainment, step=step_for(1), kv=kv, n=len(make(4.0, 7, 3).input_tokens)))
        return _Search(per_kv[kv])

    def verify(c, cand, kv, eng):
        verified.append((kv, cand.goodput_req_s, eng))
        return _unit(c=cand, kv=kv, units=math.ceil(RATE / cand.goodput_req_s),
                     usd=math.ceil(RATE / cand.goodput_req_s) * cand.gpus * USD)
    monkeypatch.setattr(dc, "search_disaggregated", search)
    monkeypatch.setattr(dc, "verify_unit", verify)
    monkeypatch.setattr(dc, "robust_unit", lambda c, u, jobs=1: u)
    ctx = SolveContext.build(spec)
    ans = dc.disaggregated_answer(ctx, jobs=1)
    assert [c["kv"] for c in calls] == ["bf16", "fp8"]
    kw = calls[0]
    assert kw["max_gpus"] == 16 and kw["gpus_per_node"] == 8 and tuple(kw["tps"]) == (1, 2)
    assert kw["engine"] == "vllm" and kw["seed"] == ctx.workload_seed and kw["jobs"] == 1
    assert kw["attainment"] == 0.9 and kw["gpu"] is ctx.gpu and kw["n"] == 7
    assert kw["step"] is ctx.step(1, "bf16", 0)
    # score (min_cost $/h at 10 req/s): fp8 5.0 -> 2 units x 3 GPUs = $12; bf16 3.0 -> $24; fp8 2.5 -> $24
    # (the bf16 one first: the KV dtypes' order); bf16 2.0 -> $30 is the fourth, not verified
    assert verified == [("fp8", 5.0, "vllm"), ("bf16", 3.0, "vllm"), ("fp8", 2.5, "vllm")]
    assert [s["kv_dtype"] for s in ans.searches] == ["bf16", "fp8"] and ans.searches[0]["n"] == 5
    p = ans.pick
    assert isinstance(p, DisaggregatedSummary) and p.kv_dtype == "fp8" and p.usd_per_hour == 12.0 and p.units == 2
    assert ans.verified is not None and ans.verified.kv_dtype == "fp8"
    assert ans.load_per_unit_req_s == 5.0 and ans.at_target is None


def test_disaggregated_answer_says_why_when_nothing_qualifies(spec, monkeypatch):
    monkeypatch.setattr(dc, "search_disaggregated", lambda *a, **k: _Search([_cand(goodput=0.0)]))
    monkeypatch.setattr(dc, "verify_unit", lambda *a: pytest.fail("nothing to verify"))
    ans = dc.disaggregated_answer(SolveContext.build(spec))
    assert isinstance(ans.pick, DisaggregatedMiss) and ans.pick.status == "infeasible"
    assert ans.pick.reason == ("no disaggregated deployment of single-node replicas met the SLOs within "
                               "hardware.max_nodes")
    assert len(ans.searches) == 2 and ans.verified is None
    assert math.isnan(ans.load_per_unit_req_s) and ans.at_target is None


def test_disaggregated_answer_skips_speculative_decoding(spec):
    c = dataclasses.replace(SolveContext.build(spec), spec=dataclasses.replace(spec, speculative=object()))
    ans = dc.disaggregated_answer(c)
    assert ans.pick == DisaggregatedMiss(
        status="skipped", reason="speculative decoding is searched for aggregated replicas only")
    assert ans.searches == ()


def test_a_price_cap_drops_the_dearer_candidates_before_verifying(spec, monkeypatch):
    verified = []
    monkeypatch.setattr(dc, "search_disaggregated", lambda *a, **k: _Search([_cand(goodput=3.0), _cand(goodput=5.0)]))
    monkeypatch.setattr(dc, "verify_unit", lambda c, cand, kv, e: verified.append(cand.goodput_req_s) or
                        _unit(c=cand, kv=kv, units=math.ceil(RATE / cand.goodput_req_s),
                              usd=math.ceil(RATE / cand.goodput_req_s) * cand.gpus * USD))
    monkeypatch.setattr(dc, "robust_unit", lambda c, u, jobs=1: u)
    ans = dc.disaggregated_answer(_ctx(spec), usd_cap=12.0)     # the 5.0 one is $12, the 3.0 one $24
    assert verified == [5.0, 5.0] and ans.pick.usd_per_hour == 12.0


# --- the whole answer -------------------------------------------------------------------------------------------

def _answer(pick, verified=None):
    return dc.DisaggregatedAnswer(pick, ({"kv_dtype": "bf16"},), verified)


def _run(spec, monkeypatch, agg, ans, **kw):
    seen = {}

    def answer(c, jobs, cap):
        seen["args"] = (c.seed, jobs, cap)
        seen["ctx"] = c
        return ans

    def one(s, **k):
        seen["agg_kw"] = k
        return agg
    monkeypatch.setattr(dc, "disaggregated_answer", answer)
    return solve_kinds(spec, one, **kw), seen


def test_aggregated_only_never_runs_the_disaggregated_search(monkeypatch):
    s = load_workload_dict(_doc(deployment=["aggregated"]))
    monkeypatch.setattr(dc, "disaggregated_answer", lambda *a: pytest.fail("not searched"))
    agg = _result()
    r = solve_kinds(s, lambda sp, **kw: agg, trials=3)
    assert r.deployment == DeploymentChoice(searched=("aggregated",), kind="aggregated")
    assert r.recommendation == agg.recommendation


def test_the_cheaper_aggregated_deployment_stays_with_its_margin(spec, monkeypatch):
    agg = _result(usd=12.0)
    r, seen = _run(spec, monkeypatch, agg, _answer(_dis(usd=15.0)), seed=5, calibration="ideal", trials=3)
    assert seen["args"] == (5, 1, math.inf) and seen["ctx"].engine.record()["calibration"] == {"name": "ideal"}
    assert seen["agg_kw"] == {"seed": 5, "calibration": "ideal", "trials": 3}
    d = r.deployment
    assert d.kind == "aggregated" and d.against == "disaggregated" and d.margin_pct == pytest.approx(25.0)
    assert d.searched == ("aggregated", "disaggregated") and d.aggregated == dc._agg_summary(agg)
    assert d.disaggregated == _dis(usd=15.0) and d.search == ({"kv_dtype": "bf16"},)
    assert r.recommendation == agg.recommendation and r.cost == agg.cost
    assert dc.deployment_lines(r) == [
        "  aggregated beats the best disaggregated (4 x [1 prefill x TP1 + 1 decode x TP2], 12 GPUs, $15.00/h) "
        "by 25.0% in $/h"]


def test_a_disaggregated_miss_leaves_the_aggregated_answer_and_says_why(spec, monkeypatch):
    miss = DisaggregatedMiss(status="infeasible", reason="none met the SLOs")
    r, seen = _run(spec, monkeypatch, _result(), _answer(miss), jobs=1, usd_cap=30.0, engine="sglang")
    assert seen["args"] == (0, 1, 30.0) and seen["ctx"].engine.engine == "sglang"
    d = r.deployment
    assert d.kind == "aggregated" and d.margin_pct is None and d.against is None and d.disaggregated == miss
    assert dc.deployment_lines(r) == ["  disaggregated: none met the SLOs"]
    # nothing anywhere: no kind
    r, seen = _run(spec, monkeypatch, _result(status="infeasible"), _answer(miss), usd_cap=30.0, engine="sglang")
    assert r.deployment.kind is None and r.status == "infeasible" and r.deployment.aggregated is None
    assert seen["args"] == (0, 1, 30.0) and seen["ctx"].engine.engine == "sglang"


def test_disaggregated_only_with_no_deployment_is_infeasible_and_names_the_aggregated_best(monkeypatch):
    s = load_workload_dict(_doc(deployment=["disaggregated"]))
    miss = DisaggregatedMiss(status="infeasible", reason="none met the SLOs")
    full = dataclasses.replace(_result(usd=12.0), screened="s", bottleneck="b", headroom=0.5, pareto=(), notes=("n",),
                               launch_aggregated={"vllm": "x"}, closest="c")   # every part the answer must drop
    r, _ = _run(s, monkeypatch, full, _answer(miss))
    assert r.status == "infeasible"
    assert r.reason == ("search.deployment lists disaggregated only, and none met the SLOs (the best aggregated "
                        "deployment: 6 GPUs at $12.00/h, TP2; list aggregated in search.deployment to allow it)")
    assert r.recommendation is None and r.predicted is None and r.cost is None and r.launch is None
    assert r.closest is None and r.notes is None and r.launch_aggregated is None and r.headroom is None
    assert r.screened is None and r.bottleneck is None and r.pareto is None
    assert r.deployment.kind is None and r.deployment.searched == ("disaggregated",)
    # one GPU: no plural; no aggregated answer: no alternative named
    one = dataclasses.replace(_result(usd=2.0), recommendation=_rec(tp=1, gpus=1))
    r, _ = _run(s, monkeypatch, one, _answer(miss))
    assert "(the best aggregated deployment: 1 GPU at $2.00/h, TP1;" in r.reason
    r, _ = _run(s, monkeypatch, _result(status="infeasible"), _answer(miss))
    assert r.reason == "search.deployment lists disaggregated only, and none met the SLOs"


def _won(units=2, per_unit=5.0, nominal=5.5):
    c = _cand(goodput=per_unit)
    draws = Draws(seeds=(11, 12), n_requests=400, goodput_min_req_s=None, load_req_s=5.0, attainment=(0.93, 0.95),
                  simulations=2)
    at = {"slo_attainment": 0.93, "ttft_ms": {"p90": 300.0}, "tpot_ms": {"p90": 30.0, "mean": 20.0},
          "output_tok_s": 900.0}
    u = _unit(c=c, per_unit=per_unit, nominal=nominal, units=units, draws=draws, at=at, fleet=10.0)
    return u, DisaggregatedSummary(gpus=u.gpus, nodes=u.nodes, usd_per_hour=u.usd_per_hour,
                                   goodput_req_s=u.goodput_req_s, units=units, unit=u.candidate(), kv_dtype="bf16",
                                   engine="vllm", evidence="simulated", ranked_goodput_req_s=u.ranked_goodput_req_s)


def test_the_cheaper_disaggregated_deployment_wins_with_its_own_figures_cost_and_launch(spec, monkeypatch):
    u, x = _won()                                 # 2 units x 3 GPUs = 6 GPUs, $12/h, 10 req/s
    cmd = []
    monkeypatch.setattr(dc, "disaggregated_command", lambda *a: cmd.append(a) or "kvtune simulate ...")
    agg = dataclasses.replace(_result(usd=18.0, goodput=12.0), target_rate_req_s=8.0)   # a target below its 10 req/s
    r, _ = _run(spec, monkeypatch, agg, _answer(x, u), seed=1)
    assert r.status == "ok" and r.reason is None and r.closest is None
    rec = r.recommendation
    assert isinstance(rec, DisaggregatedRecommendation) and rec.gpus == 6 and rec.units == 2
    assert rec.prefill.replicas == 2 and rec.decode.replicas == 2 and rec.model == "llama-3.1-8b"
    assert rec.gpu == "h100-sxm"
    p = r.predicted
    assert p.goodput_req_s == 10.0 and p.per_replica_goodput_req_s == 5.0 and p.slo_attainment == 0.93
    assert p.output_tok_s == 1800.0 and p.tok_s_per_user == 50.0 and p.load_per_replica_req_s == 5.0
    assert p.ttft_ms == {"p90": 300.0} and p.tpot_ms["p90"] == 30.0 and p.evidence == "simulated"
    assert p.per_replica_is == "one unit of the disaggregated deployment (prefill + decode pools)"
    assert p.ranked_goodput_req_s == 11.0 and p.draws == u.draws.to_json() and p.check == "kvtune simulate ..."
    # $ per million output tokens at the target rate: 6 GPUs x $2 / (8 req/s x 200 tokens x 3600 s) x 1e6
    assert r.cost == Cost(usd_per_hour=12.0, usd_per_gpu_hour=USD,
                          usd_per_million_output_tokens=pytest.approx(12.0 / (8 * 200 * 3600) * 1e6),
                          priced_at="target rate")
    assert r.headroom == pytest.approx(10 / 8 - 1) and r.bottleneck.term == "disaggregated"
    assert r.bottleneck.batch_limit is None and r.bottleneck.operating_batch is None
    assert r.launch_aggregated == agg.launch
    d = r.deployment
    assert d.kind == "disaggregated" and d.against == "aggregated" and d.margin_pct == pytest.approx(50.0)
    (args,) = cmd
    assert args[0] is spec and args[1:11] == (u.cand.prefill, u.cand.decode, "bf16", "nvlink", 2, "vllm", 10.0, 400, 11, "h100-sxm")
    assert args[11] == {"calibration": None, "engine": None, "profile": None}
    # the launch is the pools': TP1 prefill replicas and TP2 decode replicas, two of each
    v = r.launch["vllm"]
    assert v.count("--kv-transfer-config") == 2
    assert "--tensor-parallel-size 1" in v and "--tensor-parallel-size 2" in v
    assert "--max-num-seqs 64" in v and "--max-num-batched-tokens 2048" in v
    assert dc.deployment_lines(r) == [
        "  deployment: disaggregated: 2 prefill x TP1 (chunk 2048, batch cap 16) + 2 decode x TP2 (batch cap 64), "
        "KV over NVLink; engine rules vllm",
        "  disaggregated beats the best aggregated (9 GPUs, $18.00/h, TP2) by 50.0% in $/h"]


def test_a_max_goodput_disaggregated_win_is_priced_at_its_goodput(gspec, monkeypatch):
    u, x = _won()
    monkeypatch.setattr(dc, "disaggregated_command", lambda *a: "cmd")
    agg = dataclasses.replace(_result(usd=12.0, goodput=8.0, objective="max_goodput"), target_rate_req_s=4.0)
    r, _ = _run(gspec, monkeypatch, agg, _answer(x, u))
    assert r.deployment.kind == "disaggregated"
    # goodput per $: 11/12 (ranked) against 8/12
    assert r.deployment.margin_pct == pytest.approx(100 * (11 / 8 - 1))
    assert r.cost.priced_at == "goodput"
    # priced at its goodput (10 req/s x 200 tokens), not at the 4 req/s target; headroom 10 / 4 - 1
    assert r.cost.usd_per_million_output_tokens == pytest.approx(12.0 / (10.0 * 200 * 3600) * 1e6)
    assert r.headroom == pytest.approx(1.5)
    # a target below 1 req/s still has a headroom; no target: none
    r, _ = _run(gspec, monkeypatch, dataclasses.replace(agg, target_rate_req_s=0.5), _answer(x, u))
    assert r.headroom == pytest.approx(19.0)
    r, _ = _run(gspec, monkeypatch, dataclasses.replace(agg, target_rate_req_s=math.nan), _answer(x, u))
    assert math.isnan(r.headroom)
    # a goodput under 1 req/s is priced; none at all costs infinitely much per token
    for per_unit, want in ((0.0005, 12.0 / (0.001 * 200 * 3600) * 1e6), (0.0, math.inf)):
        u0, x0 = _won(per_unit=per_unit, nominal=per_unit)
        r, _ = _run(gspec, monkeypatch, dataclasses.replace(agg, status="infeasible", cost=None, predicted=None,
                                                             recommendation=None), _answer(x0, u0))
        assert r.deployment.kind == "disaggregated" and r.cost.usd_per_million_output_tokens == pytest.approx(want)


def test_a_disaggregated_win_without_an_aggregated_answer_has_no_margin(spec, monkeypatch):
    u, x = _won()
    monkeypatch.setattr(dc, "disaggregated_command", lambda *a: "cmd")
    r, _ = _run(spec, monkeypatch, dataclasses.replace(_result(status="infeasible"), closest="near"), _answer(x, u))
    assert r.status == "ok" and r.deployment.kind == "disaggregated" and r.reason is None and r.closest is None
    assert r.deployment.margin_pct is None and r.deployment.against is None and r.deployment.aggregated is None


def test_disaggregated_only_and_found_names_the_aggregated_best_without_a_margin(monkeypatch):
    s = load_workload_dict(_doc(deployment=["disaggregated"]))
    u, x = _won()
    monkeypatch.setattr(dc, "disaggregated_command", lambda *a: "cmd")
    r, _ = _run(s, monkeypatch, _result(usd=6.0), _answer(x, u))   # aggregated is cheaper but not searched
    assert r.deployment.kind == "disaggregated" and r.deployment.margin_pct is None
    assert r.deployment.aggregated == dc._agg_summary(_result(usd=6.0))
    assert dc.deployment_lines(r)[1] == ("  search.deployment lists disaggregated only; the best aggregated would be "
                                         "3 GPUs, $6.00/h, TP2")


def test_the_summary_lines_at_an_equal_price_and_over_the_network():
    u, x = _won()
    x = dataclasses.replace(x, unit=dataclasses.replace(x.unit, link="network"))
    rec = dataclasses.replace(dc._disagg_recommendation("m", "g", x), link="network")
    r = dataclasses.replace(_result(), recommendation=rec, deployment=DeploymentChoice(
        searched=("aggregated", "disaggregated"), kind="disaggregated", aggregated=_agg(usd=12.0, goodput=9.0),
        disaggregated=x, margin_pct=0.04, against="aggregated"))
    lines = dc.deployment_lines(r)
    assert "KV over the network" in lines[0]
    assert lines[1] == ("  disaggregated beats the best aggregated (6 GPUs, $12.00/h, TP2) at the same $/h with more "
                        "goodput (10.00 against 9.00 req/s)")
    g = dataclasses.replace(r, objective="max_goodput", deployment=dataclasses.replace(r.deployment, margin_pct=-0.05))
    assert dc.deployment_lines(g)[1].endswith("by -0.1% in goodput per $")
    assert dc.deployment_lines(dataclasses.replace(r, deployment=None)) == []
    assert dc.deployment_lines(dataclasses.replace(r, deployment=DeploymentChoice(searched=("aggregated",),
                                                                                   kind="aggregated"))) == []
    # aggregated won but the margin is unknown: no comparison line
    agg_won = dataclasses.replace(_result(), deployment=dataclasses.replace(r.deployment, kind="aggregated",
                                                                            margin_pct=None))
    assert dc.deployment_lines(agg_won) == []


def test_forked_and_in_process_disaggregated_searches_give_the_same_answer(spec, monkeypatch):
    """With jobs > 1 the disaggregated search runs on a forked process beside the aggregated one:
    the answer is the same; this process never runs it (the fake records calls here only)."""
    miss = DisaggregatedMiss(status="infeasible", reason="none met the SLOs")
    here = []

    def answer(c, *a):
        here.append(a)
        return _answer(miss)
    monkeypatch.setattr(dc, "disaggregated_answer", answer)
    agg = _result(usd=12.0)
    forked = solve_kinds(spec, lambda s, **k: agg, jobs=2)
    assert here == [] and forked.deployment.disaggregated == miss and forked.deployment.kind == "aggregated"
    alone = solve_kinds(spec, lambda s, **k: agg, jobs=2, storage="sqlite:///x.db")
    assert len(here) == 1 and alone.deployment == forked.deployment
    solve_kinds(spec, lambda s, **k: agg, jobs=1)
    assert len(here) == 2


def test_several_gpu_types_go_through_the_gpu_choice_each_with_both_kinds(monkeypatch):
    s = load_workload_dict(_doc(gpu=["h100-sxm", "h200"], usd_per_gpu_hour={"h100-sxm": 2.0, "h200": 3.0}))
    miss = DisaggregatedMiss(status="infeasible", reason="none met the SLOs")
    seen = []

    def answer(c, *a):
        seen.append(c.spec.hardware.gpu)
        return _answer(miss)
    monkeypatch.setattr(dc, "disaggregated_answer", answer)
    kws = []

    def one(sp, **k):
        kws.append(k)
        return _result(usd=12.0 if sp.hardware.gpu == "h100-sxm" else 9.0)
    r = solve_kinds(s, one, trials=3)
    assert seen == ["h100-sxm", "h200"]
    assert kws == [{"trials": 3}, {"trials": 3, "usd_cap": 12.0}]     # each type's solve gets the options and its cap
    assert [g.gpu for g in r.gpu_choice] == ["h200", "h100-sxm"] and r.cost.usd_per_hour == 9.0
    assert r.deployment.kind == "aggregated"


def _child_only(parent_pid, in_child, in_parent):
    """A fake ``disaggregated_answer``: ``in_child()`` on the forked process, ``in_parent()`` here."""
    import os

    def answer(c, *a):
        return (in_child if os.getpid() != parent_pid else in_parent)(c)
    return answer


def test_a_forked_search_that_fails_or_cannot_send_its_answer_is_run_here_instead(spec, monkeypatch):
    import os
    miss = DisaggregatedMiss(status="infeasible", reason="none met the SLOs")
    here = []

    def parent(c):
        here.append(1)
        return _answer(miss)

    def fails(c):
        raise RuntimeError("lost")

    def unsendable(c):   # a lambda cannot be pickled back
        return dc.DisaggregatedAnswer(miss, ({"f": lambda: 0},))
    agg = _result(usd=12.0)
    for child in (fails, unsendable):
        monkeypatch.setattr(dc, "disaggregated_answer", _child_only(os.getpid(), child, parent))
        r = solve_kinds(spec, lambda s, **k: agg, jobs=2)
        assert r.deployment.disaggregated == miss and r.deployment.search == ({"kv_dtype": "bf16"},)
    assert len(here) == 2


def test_an_aggregated_search_that_raises_stops_the_forked_one(spec, monkeypatch):
    """The forked search would run for a minute; the error is raised at once (the fork is ended)."""
    import os
    import time

    def forever(s):
        time.sleep(60)
    monkeypatch.setattr(dc, "disaggregated_answer", _child_only(os.getpid(), forever, forever))

    def boom(s, **k):
        raise ValueError("aggregated search failed")
    with pytest.raises(ValueError, match="aggregated search failed"):
        solve_kinds(spec, boom, jobs=2)


def test_the_default_aggregated_solver_is_the_screen_and_race_in_the_types_context(monkeypatch):
    from kvtune.optimizer import solve as solve_mod
    s = load_workload_dict(_doc(deployment=["aggregated"]))
    agg = _result(usd=12.0)
    seen = []
    monkeypatch.setattr(solve_mod, "solve_in", lambda c, *a, **kw: seen.append(c.spec) or agg)
    assert solve_kinds(s).recommendation == agg.recommendation and seen == [s]


# --- the first full run's survivors -----------------------------------------------------------------------------

def test_a_unit_below_one_request_per_second_still_counts(spec, gspec):
    assert objective_for(spec.objective).replicas(10.0, 0.5, 3, 64) == 20
    assert dc._score(_ctx(spec), 64, 10.0, USD)(_cand(goodput=0.5)) == (20 * 3 * USD, -0.5)


def test_the_price_cap_is_inclusive_to_a_relative_1e_12(spec, ctx, monkeypatch):
    cap = 24.0 / (1 + 1e-12)                 # cap x (1 + 1e-12) == 24.0 exactly
    assert dc._score(_ctx(spec), 16, 10.0, USD, usd_cap=cap)(_cand(goodput=3.0)) == (24.0, -3.0)
    monkeypatch.setattr(dc, "robust_unit", lambda c, u, jobs=1: u)
    u = _unit(usd=21.0 * (1 + 1e-12))
    assert dc._best_unit(ctx, [u], usd_cap=21.0) == u


def test_best_unit_passes_its_context_and_jobs_and_never_keeps_a_robust_unit_that_fails(ctx, monkeypatch):
    calls = []

    def robust(c, u, jobs=1):
        assert c is ctx
        calls.append(jobs)
        return dataclasses.replace(u, feasible=False) if u.usd_per_hour == 18.0 else u
    monkeypatch.setattr(dc, "robust_unit", robust)
    a = _unit(c=_cand(goodput=3.0), units=3, usd=18.0)
    assert dc._best_unit(ctx, [a]) is None and calls == [1]          # the draws failed it
    # a robust unit over the cap is not kept, even with nothing better
    monkeypatch.setattr(dc, "robust_unit", lambda c, u, jobs=1: dataclasses.replace(u, usd_per_hour=24.0))
    assert dc._best_unit(ctx, [_unit(usd=18.0)], usd_cap=21.0) is None


def test_best_unit_stops_at_a_unit_that_only_ties_the_best(ctx, monkeypatch):
    made = []
    monkeypatch.setattr(dc, "robust_unit", lambda c, u, jobs=1: made.append(u) or u)
    a = _unit(usd=18.0)
    assert dc._best_unit(ctx, [a, dataclasses.replace(a)]) == a and len(made) == 1


def test_disaggregated_answer_wires_its_inputs_through(spec, gspec, monkeypatch):
    import numpy as np
    got: dict = {}
    def search(step_for, sim_config, make, attainment, **kw):
        first = "make" not in got
        got.update(kw, sim_config=sim_config, make=make)
        return _Search([_cand(goodput=0.5)] if first else [])    # one to verify: verified here, not forked

    def verify(c, cand, kv, eng):
        got["verify_ctx"] = c
        return _unit(c=cand, kv=kv, units=5, usd=30.0)
    monkeypatch.setattr(dc, "search_disaggregated", search)
    monkeypatch.setattr(dc, "verify_unit", verify)
    monkeypatch.setattr(dc, "robust_unit", lambda c, u, jobs=1: got.setdefault("robust_jobs", jobs) and u)
    # max_goodput: a unit of 0.5 req/s on 3 GPUs is a deployment (5 units within 16 GPUs)
    ctx = SolveContext.build(gspec, 7, "ideal", "sglang")
    ans = dc.disaggregated_answer(ctx, jobs=3)
    assert got["engine"] == "sglang"
    assert got["verify_ctx"] is ctx and got["robust_jobs"] == 3 and got["jobs"] == 3
    assert got["sim_config"] == ctx.engine.sim_config
    assert got["score"](_cand(goodput=3.0)) == (-(3.0 / (3 * USD)), 3)
    made = got["make"](4.0, 7, 3)
    assert np.array_equal(made.arrival_s, gspec.requests(7, 3, rate_req_s=4.0).arrival_s)
    assert isinstance(ans.pick, DisaggregatedSummary) and ans.pick.units == 5


def test_candidates_tied_on_score_keep_the_kv_dtypes_order_and_their_own(monkeypatch):
    s = load_workload_dict(dict(_doc(), search=dict(_doc()["search"], kv_dtype=["fp8", "bf16"])))
    verified = []
    per_kv = {"fp8": [_cand(goodput=3.0, chunk=4096), _cand(goodput=3.0, chunk=1024)], "bf16": [_cand(goodput=3.0)]}
    order = iter(["fp8", "bf16"])
    monkeypatch.setattr(dc, "search_disaggregated", lambda *a, **k: _Search(per_kv[next(order)]))
    monkeypatch.setattr(dc, "verify_unit", lambda c, cand, kv, e: verified.append((kv, cand.prefill.chunk_tokens))
                        or _unit(c=cand, kv=kv, units=4, usd=24.0))
    monkeypatch.setattr(dc, "robust_unit", lambda c, u, jobs=1: u)
    dc.disaggregated_answer(SolveContext.build(s))
    # all three at $24/h with 3.0 req/s per unit: the KV dtypes as listed (fp8 first), each search's own order
    assert verified == [("fp8", 4096), ("fp8", 1024), ("bf16", 2048)]


def _pools_rec(kv="bf16", d_tp=2):
    return dc._disagg_recommendation("llama-3.1-8b", "h100-sxm",
                                     _dis(units=1, kv=kv, c=_cand(p_tp=1, d_tp=d_tp, chunk=2048, cap=64)))


def test_the_pools_launch_is_built_from_the_workload_and_the_context():
    import yaml as _yaml
    from engine_contracts import flag_value

    from kvtune.optimizer.launch import argv_of
    s = load_workload_dict(dict(_doc(), engine="sglang", weights="fp8"))
    ctx = SolveContext.build(s)
    ctx = dataclasses.replace(ctx, eff=dataclasses.replace(ctx.eff, activation_reserve_bytes=1.5e9))
    out = dc._launch(s, _pools_rec(kv="fp8"), ctx)
    assert out["k8s_engine"] == "sglang"                      # the workload's engine runs the manifest
    names = {d["metadata"]["name"] for d in _yaml.safe_load_all(out["k8s"].split("\n", 4)[-1]) if d}
    assert {"kvtune-llama-3-1-8b-prefill", "kvtune-llama-3-1-8b-decode"} <= names
    pre, dec = (argv_of(b.split("5600 ", 1)[-1]) for b in out["vllm"].split("\n\n")[:2])
    # each pool's context from the workload's lengths: 1,000-token prompts + 1 (prefill), + 200 output (decode)
    assert flag_value(pre, "--max-model-len") == "1001" and flag_value(dec, "--max-model-len") == "1200"
    assert flag_value(pre, "--kv-cache-dtype") == "fp8" and flag_value(dec, "--kv-cache-dtype") == "fp8"
    assert flag_value(pre, "--tensor-parallel-size") == "1" and flag_value(dec, "--max-num-seqs") == "64"
    assert "--speculative-config" not in pre + dec
    assert "vllm serve RedHatAI/Meta-Llama-3.1-8B-Instruct-FP8" in out["vllm"]     # the workload's FP8 weights
    m = out["memory"]["decode"]
    assert m["activation_reserve_bytes"] == 1.5e9 and m["gpu_memory_bytes"] == ctx.gpu.memory_bytes
    assert m["kv_bytes_per_token_per_gpu"] == 32 * 8 * 128 * 2 * 1 / 2   # layers x KV heads x dim x (K, V) x 1 byte / TP2
    # bf16 weights: the model's own checkpoint, by its Hugging Face id
    b = load_workload_dict(_doc())
    assert "vllm serve meta-llama/Llama-3.1-8B-Instruct " in dc._launch(b, _pools_rec(), SolveContext.build(b))["vllm"]


def test_a_pool_wider_than_the_workloads_node_is_refused():
    s = load_workload_dict(_doc(gpus_per_node=4))
    out = dc._launch(s, _pools_rec(d_tp=8), SolveContext.build(s))
    assert out["unsupported"]["vllm"] == ("a decode replica spans 2 nodes: kvtune emits disaggregated launch settings "
                                          "for single-node replicas only")


def test_an_aggregated_search_that_raises_with_nothing_forked_raises_its_own_error(spec, monkeypatch):
    monkeypatch.setattr(dc, "disaggregated_answer", lambda *a: pytest.fail("never reached"))

    def boom(s, **k):
        raise ValueError("aggregated search failed")
    with pytest.raises(ValueError, match="aggregated search failed"):
        solve_kinds(spec, boom, jobs=1)


def test_the_forked_search_may_start_processes_of_its_own(spec, monkeypatch):
    """The disaggregated search forks its own workers (fork_map): its process must not be daemonic."""
    import multiprocessing as mp
    import os
    miss = DisaggregatedMiss(status="infeasible", reason="none met the SLOs")

    def child(c):
        p = mp.get_context("fork").Process(target=int)
        p.start()
        p.join()
        return dc.DisaggregatedAnswer(miss, ({"ran": "forked"},))

    def parent(c):
        return dc.DisaggregatedAnswer(miss, ({"ran": "here"},))
    monkeypatch.setattr(dc, "disaggregated_answer", _child_only(os.getpid(), child, parent))
    r = solve_kinds(spec, lambda s, **k: _result(), jobs=2)
    assert r.deployment.search == ({"ran": "forked"},)


def test_tokens_per_user_from_the_mean_tpot(spec, monkeypatch):
    monkeypatch.setattr(dc, "disaggregated_command", lambda *a: "cmd")
    for tpot, want in ((0.5, 2000.0), (20.0, 50.0), (0.0, math.nan), (None, math.nan)):
        u, x = _won()
        at = dict(u.at, tpot_ms={"p90": 30.0} if tpot is None else {"p90": 30.0, "mean": tpot})
        u = dataclasses.replace(u, at=at)
        r, _ = _run(spec, monkeypatch, _result(status="infeasible"), _answer(x, u))
        got = r.predicted.tok_s_per_user
        assert (math.isnan(got) and math.isnan(want)) or got == pytest.approx(want)


def test_a_robust_unit_that_only_ties_the_best_does_not_replace_it(ctx, monkeypatch):
    monkeypatch.setattr(dc, "robust_unit", lambda c, u, jobs=1: dataclasses.replace(u, usd_per_hour=24.0))
    a = _unit(c=_cand(link="nvlink"), units=4, usd=18.0)       # robust $24
    b = _unit(c=_cand(link="network"), units=4, usd=21.0)      # robust $24 too, the same rank
    assert dc._best_unit(ctx, [a, b]).cand.link == "nvlink"


def test_a_model_without_a_hugging_face_id_launches_by_the_workloads_name(spec):
    c = SolveContext.build(spec)
    c = dataclasses.replace(c, model=dataclasses.replace(c.model, hf_id=""))
    assert "vllm serve llama-3.1-8b " in dc._launch(spec, _pools_rec(), c)["vllm"]


def test_one_context_per_gpu_type_built_from_the_options_serves_both_kinds(spec, monkeypatch):
    import os

    from kvtune.optimizer import solve as solve_mod
    u, x = _won()
    built, used = [], []
    real = SolveContext.build

    class Shim:
        @staticmethod
        def build(*a):
            built.append(a)
            return real(*a)
    monkeypatch.setattr(solve_mod, "SolveContext", Shim)
    monkeypatch.setattr(dc, "disaggregated_command", lambda *a: "cmd")
    monkeypatch.setattr(dc, "disaggregated_answer", _child_only(os.getpid(), lambda c: _answer(x, u),
                                                                lambda c: pytest.fail("not forked")))

    def agg(c, *a, **k):
        used.append(c)
        return _result(status="infeasible")
    monkeypatch.setattr(solve_mod, "solve_in", agg)
    r = solve_kinds(spec, jobs=2, seed=4, calibration="ideal", engine="vllm")
    assert r.deployment.kind == "disaggregated" and built == [(spec, 4, "ideal", "vllm", None)] and len(used) == 1


def test_the_disaggregated_search_beside_runs_at_a_lower_priority_and_returns_its_value():
    import os
    from kvtune.optimizer.deployment_choice import BESIDE_NICE, Beside
    here = os.nice(0)
    got = Beside(lambda: (os.nice(0), 6 * 7)).result()
    assert got == (min(here + BESIDE_NICE, 19), 42)
    assert os.nice(0) == here          # this process keeps its priority
