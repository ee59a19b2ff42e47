"""Issue 16 item 4: the GPU type as a search dimension (hardware.gpu lists several, each priced)."""

from __future__ import annotations

import dataclasses
import inspect
import os
import pytest
import sys
import yaml
from pathlib import Path
from kvtune.costmodel.errors import InputError
from solve_fakes import solve_kinds, solve_types
from kvtune.optimizer.result import SolveResult, TrialCounts, VerificationCounts, Cost, GpuChoiceRow, Predicted, Recommendation
from kvtune.optimizer.workload import load_workload_dict
from kvtune.optimizer import gpu_choice as gc
from kvtune.optimizer.solve import search_types, solve, solve_type

ROOT = Path(__file__).parent.resolve().parents[1]


def _infeasible(reason: str) -> SolveResult:
    """A solve that found nothing, with no evidence: what the outer loop reads of a type's answer."""
    return SolveResult(kvtune_version="0", seed=0, workload_seed=0, sampler="tpe", source="test",
                       objective="min_cost", study_name="s", target_rate_req_s=1.0,
                       trials=TrialCounts(completed=0, feasible=0),
                       verification=VerificationCounts(configs=0, simulations=0, work_items=0, outcomes={}),
                       status="infeasible", verified=(), race=(), reason=reason)


def _doc(**hw):
    d = yaml.safe_load((ROOT / "examples" / "rag-llama3.1-70b.yaml").read_text())
    d["hardware"].update(hw)
    return d


def test_list_with_a_price_map_and_with_one_price():
    s = load_workload_dict(_doc(gpu=["h100-sxm", "h200"], usd_per_gpu_hour={"h100-sxm": 3.0, "h200": 3.8}))
    assert s.hardware.choices == (("h100-sxm", 3.0), ("h200", 3.8))
    assert s.hardware.gpu == "h100-sxm" and s.hardware.usd_per_gpu_hour == 3.0
    s = load_workload_dict(_doc(gpu=["h200", "b200"], usd_per_gpu_hour=4.0))
    assert s.hardware.choices == (("h200", 4.0), ("b200", 4.0))
    one = load_workload_dict(_doc(gpu="h100-sxm", usd_per_gpu_hour=3.0))  # the scalar forms still work
    assert one.hardware.choices == ()


@pytest.mark.parametrize("hw, needle", [
    (dict(gpu=["h100-sxm", "h200"], usd_per_gpu_hour={"h100-sxm": 3.0}), "hardware.usd_per_gpu_hour.h200: missing"),
    (dict(gpu=["h100-sxm"], usd_per_gpu_hour={"h100-sxm": 3.0, "b200": 5.0}), "hardware.usd_per_gpu_hour.b200"),
    (dict(gpu=["h100-sxm", "nope"], usd_per_gpu_hour=3.0), "hardware.gpu[1]"),
    (dict(gpu=["h100-sxm", "h100"], usd_per_gpu_hour=3.0), "listed twice"),
    (dict(gpu="h100-sxm", usd_per_gpu_hour={"h100-sxm": 3.0}), "needs hardware.gpu to list"),
    (dict(gpu=["h200", "h100-sxm"], usd_per_gpu_hour={"h200": -1, "h100-sxm": 3.0}), "hardware.usd_per_gpu_hour.h200"),
])
def test_bad_choices_name_the_key(hw, needle):
    with pytest.raises(InputError) as exc:
        load_workload_dict(_doc(**hw))
    assert needle in str(exc.value)


def test_fp8_weights_refuse_a_gpu_without_fp8_in_the_list():
    d = _doc(gpu=["h100-sxm", "a100"], usd_per_gpu_hour=2.0)
    d["weights"] = "fp8"
    with pytest.raises(InputError, match=r"hardware.gpu\[1\].*no FP8"):
        load_workload_dict(d)


@pytest.mark.slow
def test_the_cheapest_type_wins_and_the_others_say_why():
    spec = load_workload_dict(_doc(gpu=["h100-sxm", "h200", "a100"],
                                   usd_per_gpu_hour={"h100-sxm": 3.0, "h200": 3.8, "a100": 1.8}))
    r = solve_kinds(spec, trials=20)
    rows = r.gpu_choice
    assert [g.gpu for g in rows] and {g.gpu for g in rows} == {"h100-sxm", "h200", "a100-80gb"}
    ok = [g for g in rows if g.status == "ok"]
    assert ok and rows[0].why == "chosen"
    assert r.recommendation.gpu == rows[0].gpu
    assert rows[0].usd_per_hour == min(g.usd_per_hour for g in ok)
    for g in rows[1:]:
        assert g.why and g.why != "chosen"
        if g.status == "ok":
            assert g.usd_per_hour >= rows[0].usd_per_hour
            assert g.usd_per_hour == pytest.approx(g.gpus * g.usd_per_gpu_hour)


def test_outer_loop_passes_each_type_and_its_price():
    spec = load_workload_dict(_doc(gpu=["h100-sxm", "h200"], usd_per_gpu_hour={"h100-sxm": 3.0, "h200": 5.0}))
    seen = []

    def fake(one, **kw):
        seen.append((one.hardware.gpu, one.hardware.usd_per_gpu_hour, one.hardware.choices, kw.get("study_name")))
        return _infeasible(f"nothing on {one.hardware.gpu}")

    r = solve_types(spec, fake, study_name="s")
    assert seen == [("h100-sxm", 3.0, (), "s-h100-sxm"), ("h200", 5.0, (), "s-h200")]
    assert r.status == "infeasible" and all("no config meets" in g.why for g in r.gpu_choice)


# optimizer/gpu_choice.py on fake per-type solves whose answers are known (issue 25 item 1): which
# type wins under each objective, the price cap a min_cost search passes on, each row's text, the
# forked max_goodput path. Every expected value below is derived by hand from the fakes' $/h and
# goodput; no search runs.

PRICES = {"h100-sxm": 3.0, "h200": 4.0, "a100": 2.0}


def _doc_units(objective="min_cost", gpus=("h100-sxm", "h200", "a100")):
    d = yaml.safe_load((ROOT / "examples" / "rag-llama3.1-70b.yaml").read_text())
    d["hardware"].update(gpu=list(gpus), usd_per_gpu_hour={g: PRICES[g] for g in gpus})
    d["objective"] = objective
    if objective == "max_goodput":
        d["workload"].pop("rate_req_s", None)
    return d


def _result(gpu, n_gpus=None, goodput=5.0, status="ok", kv="bf16", reason=None, source="test"):
    base = SolveResult(kvtune_version="0", seed=0, workload_seed=0, sampler="tpe", source=source,
                       objective="min_cost", study_name="s", target_rate_req_s=4.0,
                       trials=TrialCounts(completed=1, feasible=1),
                       verification=VerificationCounts(configs=1, simulations=1, work_items=1, outcomes={}),
                       status=status, verified=(), race=(), reason=reason)
    if status != "ok":
        return base
    usd = n_gpus * PRICES[gpu.split("-80gb")[0]]
    rec = Recommendation(tp=n_gpus, batch_cap=64, kv_dtype=kv, spec_k=0, chunk_tokens=2048, pp=1, ep=1,
                         dp_attention=False, nodes_per_replica=1, gpus_per_node=8, layout=None, replicas=1,
                         gpus=n_gpus, nodes=1, gpu=gpu, model="llama-3.1-70b")
    return dataclasses.replace(
        base, recommendation=rec,
        predicted=Predicted(goodput_req_s=goodput, per_replica_goodput_req_s=goodput, slo_attainment=0.95,
                            ttft_ms={}, tpot_ms={}, output_tok_s=1.0, tok_s_per_user=1.0,
                            load_per_replica_req_s=4.0, evidence="simulated"),
        cost=Cost(usd_per_hour=usd, usd_per_gpu_hour=PRICES[gpu.split("-80gb")[0]], usd_per_million_output_tokens=1.0,
                  priced_at="target rate"))


def _fake(answers, seen=None):
    """A type solver answering ``answers[gpu]`` (a result, or a function of the options asked), recording each call."""
    def one(spec, **kw):
        g = spec.hardware.gpu
        if seen is not None:
            seen.append((g, spec.hardware.usd_per_gpu_hour, spec.hardware.choices, dict(kw)))
        a = answers[g]
        return a(kw) if callable(a) else a
    return one


def test_why_text_says_how_a_type_lost():
    assert gc.why_text("min_cost", 12.0, 5.0, "a100", 8.0, 5.0) == "$4.00/h more than a100 ($8.00/h)"
    assert gc.why_text("min_cost", 8.0, 3.0, "a100", 8.0, 5.0) == "same $8.00/h as a100, less goodput"
    assert gc.why_text("min_cost", 8.0 + 1e-12, 3.0, "a100", 8.0, 5.0) == "same $8.00/h as a100, less goodput"
    # the tolerance is 1e-9 $/h, exclusive: a difference of exactly 1e-9 is the same price
    assert gc.why_text("min_cost", 1e-9, 3.0, "a100", 0.0, 5.0) == "same $0.00/h as a100, less goodput"
    assert gc.why_text("min_cost", 9.0, 3.0, "a100", 8.0, 5.0) == "$1.00/h more than a100 ($8.00/h)"
    assert gc.why_text("max_goodput", 8.0, 4.0, "h200", 12.0, 9.0) == "0.5 req/s per $/h against h200's 0.75"
    assert gc.why_text("max_goodput", 3.0, 1.0, "h200", 7.0, 1.0) == "0.3333 req/s per $/h against h200's 0.1429"


def test_min_cost_picks_the_cheapest_type_and_caps_each_later_one_at_the_cheapest_so_far():
    spec = load_workload_dict(_doc_units())
    seen: list = []
    answers = {"h100-sxm": _result("h100-sxm", 4),                         # $12/h
               "h200": _result("h200", 2),                                 # $8/h: cheaper
               "a100-80gb": _result("a100-80gb", 8)}                       # $16/h
    r = solve_types(spec, _fake(answers, seen), trials=5, study_name="st")
    assert [(g, usd, ch) for g, usd, ch, _ in seen] == [("h100-sxm", 3.0, ()), ("h200", 4.0, ()), ("a100-80gb", 2.0, ())]
    assert [kw for *_, kw in seen] == [{"trials": 5, "study_name": "st-h100-sxm"},
                                       {"trials": 5, "study_name": "st-h200", "usd_cap": 12.0},
                                       {"trials": 5, "study_name": "st-a100-80gb", "usd_cap": 8.0}]
    assert r.recommendation.gpu == "h200" and r.cost.usd_per_hour == 8.0
    rows = r.gpu_choice
    assert [g.gpu for g in rows] == ["h200", "h100-sxm", "a100-80gb"]
    assert rows[0] == GpuChoiceRow(gpu="h200", usd_per_gpu_hour=4.0, status="ok", source="test", why="chosen",
                                   usd_per_hour=8.0, goodput_req_s=5.0, gpus=2, nodes=1,
                                   config={"tp": 2, "pp": 1, "ep": 1, "dp_attention": False, "batch_cap": 64,
                                           "kv_dtype": "bf16", "spec_k": 0, "chunk_tokens": 2048, "replicas": 1})
    assert rows[1].why == "$4.00/h more than h200 ($8.00/h)" and rows[1].usd_per_hour == 12.0
    assert rows[2].why == "$8.00/h more than h200 ($8.00/h)" and rows[2].reason is None


def test_an_infeasible_first_type_passes_no_cap_and_a_dearer_type_says_so():
    spec = load_workload_dict(_doc_units())
    seen: list = []
    answers = {"h100-sxm": _result("h100-sxm", status="infeasible", reason="TTFT 900 ms > 600 ms"),
               "h200": _result("h200", 3),                                 # $12/h
               "a100-80gb": _result("a100-80gb", status="dearer", reason="nothing at or below the cap")}
    r = solve_types(spec, _fake(answers, seen))
    assert [kw for *_, kw in seen] == [{}, {}, {"usd_cap": 12.0}]
    assert r.status == "ok" and r.recommendation.gpu == "h200"
    rows = {g.gpu: g for g in r.gpu_choice}
    assert [g.gpu for g in r.gpu_choice] == ["h200", "h100-sxm", "a100-80gb"]
    assert rows["h100-sxm"] == GpuChoiceRow(gpu="h100-sxm", usd_per_gpu_hour=3.0, status="infeasible", source="test",
                                            why="no config meets the SLOs: TTFT 900 ms > 600 ms",
                                            reason="TTFT 900 ms > 600 ms")
    assert rows["a100-80gb"] == GpuChoiceRow(gpu="a100-80gb", usd_per_gpu_hour=2.0, status="dearer", source="test",
                                             why="nothing at or below $12.00/h (a cheaper type was found first)",
                                             reason="nothing at or below the cap")
    answers["a100-80gb"] = _result("a100-80gb", status="dearer")
    row = solve_types(spec, _fake(answers)).gpu_choice[-1]
    assert row.status == "dearer" and row.reason == "" and row.why.startswith("nothing at or below $12.00/h")


def test_an_answer_that_did_not_meet_the_slos_never_caps_the_next_type():
    spec = load_workload_dict(_doc_units(gpus=("h100-sxm", "h200")))
    seen: list = []
    # an infeasible answer that still carries a price (its closest miss, say) is no cap
    priced_miss = dataclasses.replace(_result("h100-sxm", 2), status="infeasible", reason="missed")
    solve_types(spec, _fake({"h100-sxm": priced_miss, "h200": _result("h200", 2)}, seen))
    assert [kw for *_, kw in seen] == [{}, {}]


def test_the_default_solver_searches_both_kinds_of_one_type():
    assert inspect.signature(solve).parameters["solve_one"].default is solve_type
    assert inspect.signature(search_types).parameters["solve_one"].default is solve_type


def test_the_cap_is_the_least_price_met_so_far_and_an_equal_price_keeps_the_first_listed():
    spec = load_workload_dict(_doc_units())
    seen: list = []
    answers = {"h100-sxm": _result("h100-sxm", 4),                         # $12/h
               "h200": _result("h200", 4),                                 # $16/h: over the cap (a fake ignores it)
               "a100-80gb": _result("a100-80gb", 6, goodput=5.0)}          # $12/h, the same goodput
    r = solve_types(spec, _fake(answers, seen))
    assert [kw.get("usd_cap") for *_, kw in seen] == [None, 12.0, 12.0]
    assert [g.gpu for g in r.gpu_choice] == ["h100-sxm", "a100-80gb", "h200"]
    assert r.gpu_choice[1].why == "same $12.00/h as h100-sxm, less goodput"
    # more goodput at the same $/h wins
    answers["a100-80gb"] = _result("a100-80gb", 6, goodput=6.0)
    r = solve_types(spec, _fake(answers))
    assert r.recommendation.gpu == "a100-80gb"
    # bf16 KV before fp8 KV at the same $/h (the example searches both)
    answers["a100-80gb"] = _result("a100-80gb", 6, goodput=6.0, kv="fp8")
    assert solve_types(spec, _fake(answers)).recommendation.gpu == "h100-sxm"


def test_nothing_anywhere_is_infeasible_with_every_reason():
    spec = load_workload_dict(_doc_units(gpus=("h100-sxm", "h200")))
    answers = {"h100-sxm": _result("h100-sxm", status="infeasible", reason="a"),
               "h200": _result("h200", status="infeasible")}
    r = solve_types(spec, _fake(answers))
    assert r.status == "infeasible" and r.reason == "a"               # the first listed type's answer
    assert [(g.gpu, g.why, g.reason) for g in r.gpu_choice] == [
        ("h100-sxm", "no config meets the SLOs: a", "a"), ("h200", "no config meets the SLOs: ", "")]


def test_max_goodput_solves_every_type_in_full_and_ranks_goodput_per_dollar():
    spec = load_workload_dict(_doc_units(objective="max_goodput"))
    seen: list = []
    answers = {"h100-sxm": _result("h100-sxm", 8, goodput=24.0),             # 1.0 req/s per $/h
               "h200": _result("h200", 8, goodput=40.0),                     # 1.25
               "a100-80gb": _result("a100-80gb", 8, goodput=16.0)}           # 1.0 at $16: cheaper than h100's $24
    err = sys.stderr
    r = solve_types(spec, _fake(answers, seen), jobs=1)
    assert [kw for *_, kw in seen] == [{}] * 3                              # no cap (one job: the default)
    assert sys.stderr is err                                                # in this process, its output kept
    assert [g.gpu for g in r.gpu_choice] == ["h200", "a100-80gb", "h100-sxm"]
    assert r.gpu_choice[1].why == "1 req/s per $/h against h200's 1.25"


def test_max_goodput_with_jobs_solves_the_types_side_by_side_with_one_job_each():
    spec = load_workload_dict(_doc_units(objective="max_goodput", gpus=("h100-sxm", "h200")))

    def tagged(gpu, n):
        return lambda kw: _result(gpu, n, source=f"jobs={kw.get('jobs', 1)} pid={os.getpid()}")
    answers = {"h100-sxm": tagged("h100-sxm", 8), "h200": tagged("h200", 8)}
    r = solve_types(spec, _fake(answers), jobs=2)
    sources = [g.source for g in r.gpu_choice]
    assert all(s.startswith("jobs=1 ") for s in sources)
    assert all(s != f"jobs=1 pid={os.getpid()}" for s in sources)            # on forked processes
    # with a shared storage: in this process, the jobs passed on as given
    r = solve_types(spec, _fake(answers), jobs=2, storage="sqlite:///x.db")
    assert {g.source for g in r.gpu_choice} == {f"jobs=2 pid={os.getpid()}"}
    # no jobs given: one, in this process
    answers = {"h100-sxm": lambda kw: _result("h100-sxm", 8, source=f"pid={os.getpid()}"),
               "h200": lambda kw: _result("h200", 8, source=f"pid={os.getpid()}")}
    r = solve_types(spec, _fake(answers))
    assert {g.source for g in r.gpu_choice} == {f"pid={os.getpid()}"}


def test_quietly_drops_what_a_forked_solve_prints(monkeypatch):
    monkeypatch.setattr(sys, "stderr", sys.stderr)     # restored after the test
    got = []

    def one():
        got.append(sys.stderr.name)
        print("progress", file=sys.stderr)    # written (to nowhere), not refused
        return "r"
    assert gc.quietly(one) == "r"
    assert got == [os.devnull]


def test_rows_of_an_answer_missing_its_figures_read_as_not_met():
    r = dataclasses.replace(_result("h200", 2), cost=None)
    row = gc._row("h200", 4.0, r, "why")
    assert row == GpuChoiceRow(gpu="h200", usd_per_gpu_hour=4.0, status="ok", source="test", why="why", reason="")
    spec = load_workload_dict(_doc_units())
    assert gc._why(spec, r, False, "h100-sxm", _result("h100-sxm", 1)) == "no config meets the SLOs: "
    assert gc._why(spec, _result("h200", status="dearer"), False, "x", _result("h100-sxm", 1)) == ""
    assert gc._why(spec, _result("h200", 2), True, "h200", _result("h200", 2)) == "chosen"
