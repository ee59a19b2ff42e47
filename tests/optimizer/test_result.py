"""The solve result as a record: ``SolveResult.to_json`` is the ``--json`` object (its keys and
their order a user contract) and ``from_json`` reads it back, the dict or the file as written
(inf and nan as strings), for every shape of answer: ok, infeasible, a disaggregated deployment
over an ok or an infeasible aggregated answer, a GPU-type choice."""

from __future__ import annotations

import json

import pytest

from kvtune.optimizer.cli._common import dumps
from solve_fakes import solve_kinds
from kvtune.optimizer.recommend import solve
from kvtune.optimizer.result import DisaggregatedRecommendation, Recommendation, SolveResult
from kvtune.optimizer.workload import load_workload_dict

pytestmark = pytest.mark.xdist_group("result-solves")   # its module fixtures computed once, on one worker

HEAD = ["kvtune_version", "seed", "workload_seed", "sampler", "source", "calibration", "admission", "objective",
        "study_name", "target_rate_req_s", "trials", "verification", "status"]
OK = ["recommendation", "predicted", "screened", "cost", "bottleneck", "headroom", "pareto", "verified", "race",
      "launch", "notes"]
INFEASIBLE = ["verified", "race", "reason", "closest"]


def _spec(ttft_ms: float = 150.0, gpu: object = "h100-sxm", usd: object = 2.0, deployment=("aggregated",)):
    """Llama-3.1-8B, 3,000-token prompts at 30 req/s on one node: at a 150 ms TTFT the
    disaggregated deployment serves it at the aggregated one's price with more goodput."""
    return load_workload_dict({
        "model": "llama-3.1-8b",
        "hardware": {"gpu": gpu, "gpus_per_node": 8, "usd_per_gpu_hour": usd, "max_nodes": 1},
        "workload": {"rate_req_s": 30, "classes": [{"name": "c", "share": 1.0, "input_tokens": 3000,
                                                    "output_tokens": {"dist": "lognormal", "mean": 200,
                                                                      "sigma": 0.5, "max": 800}}]},
        "slo": {"ttft_ms": ttft_ms, "tpot_ms": 30, "attainment": 0.9}, "objective": "min_cost",
        "search": {"tp": [1, 2], "batch_cap": [16, 64], "kv_dtype": ["bf16"], "chunk_tokens": [1024, 4096],
                   "trials": 5, "seed": 0, "deployment": list(deployment)}}, "<test>")


@pytest.fixture(scope="module")
def ok() -> SolveResult:
    return solve(_spec(), trials=5)


@pytest.fixture(scope="module")
def infeasible() -> SolveResult:
    return solve(_spec(ttft_ms=20.0), trials=5)   # a 3,000-token prefill takes longer alone


def _round_trips(r: SolveResult) -> list[str]:
    """``r`` read back from its JSON object and from the file text equals ``r``, and writes the
    same JSON, keys in the same order; returns its keys."""
    js = r.to_json()
    back = SolveResult.from_json(js)
    assert back == r
    assert back.to_json() == js and list(back.to_json()) == list(js)
    text = dumps(js)
    assert dumps(SolveResult.from_json(json.loads(text)).to_json()) == text
    return list(js)


def test_an_ok_result_round_trips_with_the_contract_keys_in_order(ok):
    assert ok.status == "ok" and isinstance(ok.recommendation, Recommendation)
    assert _round_trips(ok) == HEAD + OK + ["engine"]
    js = ok.to_json()
    assert "layout" not in js["recommendation"] and "per_replica_is" not in js["predicted"]
    assert {"step_ms", "mem_ms", "limits"} <= set(js["bottleneck"])


def test_an_infeasible_result_round_trips_with_its_closest_miss(infeasible):
    assert infeasible.status == "infeasible" and infeasible.recommendation is None
    assert _round_trips(infeasible) == HEAD + INFEASIBLE + ["engine"]
    assert infeasible.to_json()["closest"]["attainment"] == infeasible.closest.attainment   # a zero-load miss


def test_a_disaggregated_winner_over_an_ok_aggregated_answer_round_trips(ok):
    r = solve_kinds(_spec(deployment=("aggregated", "disaggregated")), lambda s, **kw: ok)
    assert isinstance(r.recommendation, DisaggregatedRecommendation) and r.deployment.kind == "disaggregated"
    # the aggregated keys kept where they were; the aggregated launch and the choice appended
    assert _round_trips(r) == HEAD + OK + ["launch_aggregated", "deployment", "engine"]
    js = r.to_json()
    assert js["recommendation"]["deployment"] == "disaggregated" and js["bottleneck"] == {
        "term": "disaggregated", "batch_limit": None, "operating_batch": None}
    assert js["predicted"]["per_replica_is"].startswith("one unit")


@pytest.mark.slow
def test_a_disaggregated_answer_where_the_aggregated_search_found_none_round_trips(infeasible):
    r = solve_kinds(_spec(deployment=("aggregated", "disaggregated")), lambda s, **kw: infeasible)
    assert r.status == "ok" and isinstance(r.recommendation, DisaggregatedRecommendation)
    assert r.deployment.aggregated is None and r.screened is None and r.reason is None
    # the infeasible answer's keys stay in place, the disaggregated answer's follow
    assert _round_trips(r) == HEAD + ["verified", "race", "recommendation", "predicted", "cost", "headroom",
                                      "bottleneck", "launch", "deployment", "engine"]


def test_a_gpu_choice_round_trips_with_each_type_and_why(ok, infeasible):
    spec = _spec(gpu=["h100-sxm", "h200"], usd={"h100-sxm": 2.0, "h200": 3.0})
    # every GPU type solved on its own (each with every deployment kind searched), the best wins
    r = solve_kinds(spec, lambda one, **k: ok if one.hardware.gpu == "h100-sxm" else infeasible)
    assert [(g.gpu, g.status, g.why) for g in r.gpu_choice] == [
        ("h100-sxm", "ok", "chosen"), ("h200", "infeasible", f"no config meets the SLOs: {infeasible.reason}")]
    assert _round_trips(r) == HEAD + OK + ["gpu_choice", "deployment", "engine"]
    rows = r.to_json()["gpu_choice"]
    assert list(rows[0]) == ["gpu", "usd_per_gpu_hour", "status", "source", "usd_per_hour", "goodput_req_s", "gpus",
                             "nodes", "config", "why"]
    assert list(rows[1]) == ["gpu", "usd_per_gpu_hour", "status", "source", "usd_per_hour", "goodput_req_s",
                             "reason", "why"]
    assert r.to_json()["deployment"] == {"kind": "aggregated", "searched": ["aggregated"]}
