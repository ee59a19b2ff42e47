"""kvtune solve searches aggregated and disaggregated deployments (search.deployment, default
both; optimizer.deployment_choice): the kind that wins for the objective, by how much against the
best of the other kind, the JSON's keys kept and the pools added, launch settings for the pools."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from kvtune.optimizer.cli import main


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


RAG = Path(__file__).resolve().parents[1] / "examples" / "rag-llama3.1-70b.yaml"


@pytest.fixture(scope="module")
def long_prompts(tmp_path_factory):
    # Llama-3.1-70B, 60% 1,000- and 40% 8,000-token prompts, ~300 output tokens, 4 req/s
    return _solve(RAG, tmp_path_factory.mktemp("long"))


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


@pytest.mark.slow   # a whole CLI solve, ~24 s on 2 cores; tests/test_deployment_choice_units.py checks the same choice on fakes
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

    spec = load_workload(str(Path(__file__).resolve().parents[1] / "bench/oracle/agent-prefix4k-llama3.1-8b-min-cost.yaml"))
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
