"""One number per fact (issue 23 item 4), on two recorded answers (tests/data/import_SOURCES.md):
a disaggregated FP8 winner on a chosen GPU type, whose unsettled result printed the aggregated
pick's KV note, the aggregated pick's goodput on the chosen GPU row and an aggregated front; and an
aggregated bf16 pick with an fp8 config at its own price on the front."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from kvtune.optimizer.cli.solve import summary_text
from kvtune.optimizer.facts import launch_footer, manifest_kinds, pick_point, settle
from kvtune.optimizer.report import _context_lines, _recommendation_lines
from kvtune.optimizer.result import DisaggregatedRecommendation, SolveResult
from kvtune.optimizer.workload import load_workload

ROOT = Path(__file__).parent.resolve().parents[1]
DATA = Path(__file__).parent.resolve().parent / "data"


def _load(name: str, example: str) -> tuple[SolveResult, SolveResult]:
    raw = SolveResult.from_json(json.loads((DATA / name).read_text()))
    return raw, settle(raw, load_workload(ROOT / "examples" / example))


@pytest.fixture(scope="module")
def disagg():
    return _load("solve_gpu_choice_disaggregated.json", "gpu-choice-llama3.1-70b.yaml")


@pytest.fixture(scope="module")
def multinode():
    return _load("solve_multinode_aggregated.json", "multinode-llama3.1-405b.yaml")


def test_the_recorded_answers_had_the_issue(disagg, multinode):
    raw, _ = disagg
    assert isinstance(raw.recommendation, DisaggregatedRecommendation) and raw.recommendation.kv_dtype == "fp8"
    assert raw.notes[0].startswith("bf16 KV")                                          # the aggregated pick's note
    chosen = next(g for g in raw.gpu_choice if g.why == "chosen")
    assert f"{chosen.goodput_req_s:.2f}" == "4.15" and f"{raw.predicted.goodput_req_s:.2f}" == "4.83"
    assert [f"{x.goodput_req_s:.1f}" for x in raw.pareto if x.usd_per_hour == 30.4] == ["4.3"]
    raw_m, _ = multinode
    at = [x for x in raw_m.pareto if x.usd_per_hour == raw_m.cost.usd_per_hour]
    assert at and at[0].config["kv_dtype"] == "fp8" and raw_m.recommendation.kv_dtype == "bf16"


def test_a_disaggregated_winners_notes_rows_and_front_describe_it(disagg):
    _, r = disagg
    rec, c, p = r.recommendation, r.cost, r.predicted
    # the note is about the FP8 disaggregated pick, against bf16's best disaggregated deployment
    (note,) = r.notes
    assert note.startswith("FP8 KV") and "disaggregated" in note and "bf16" in note
    # the chosen GPU's row is the pick; the others compare with the pick's $/h
    chosen = next(g for g in r.gpu_choice if g.gpu == rec.gpu)
    assert (chosen.why, chosen.deployment, chosen.usd_per_hour, chosen.goodput_req_s, chosen.gpus) == \
        ("chosen", "disaggregated", c.usd_per_hour, p.goodput_req_s, rec.gpus)
    assert chosen.config["prefill"]["replicas"] == rec.prefill.replicas
    for g in r.gpu_choice:
        if g is not chosen and g.status == "ok":
            assert g.deployment == "aggregated"
            assert g.why == f"${g.usd_per_hour - c.usd_per_hour:.2f}/h more than {rec.gpu} (${c.usd_per_hour:.2f}/h)"
    # the front: the pick at its price, nothing else there, and every point undominated
    front = r.pareto
    assert [x for x in front if x.usd_per_hour == c.usd_per_hour] == [pick_point(r)]
    for a in front:
        assert not any(b.usd_per_hour <= a.usd_per_hour and b.goodput_req_s > a.goodput_req_s for b in front)
    assert any(x.config.get("gpu") == "h100-sxm" for x in front)   # another GPU type's best is on the front


def test_an_aggregated_picks_price_on_the_front_is_the_pick(multinode):
    _, r = multinode
    at = [x for x in r.pareto if x.usd_per_hour == r.cost.usd_per_hour]
    assert [(x.goodput_req_s, x.config["kv_dtype"], x.config["layout"]) for x in at] == \
        [(r.predicted.goodput_req_s, "bf16", r.recommendation.layout)]


def test_settle_is_idempotent_and_its_json_reads_back(disagg, multinode):
    for raw, r in (disagg, multinode):
        spec_example = "gpu-choice-llama3.1-70b.yaml" if r.gpu_choice else "multinode-llama3.1-405b.yaml"
        assert settle(r, load_workload(ROOT / "examples" / spec_example)) == r
        assert SolveResult.from_json(json.loads(json.dumps(r.to_json()))) == r
        assert set(raw.to_json()) == set(r.to_json())   # no key added or removed at the top


def _deployment_goodputs(text: str) -> dict[tuple[str, str], set[str]]:
    """(GPUs, $/h) -> goodputs, from the recommendation, GPU rows and front lines of a summary."""
    out: dict[tuple[str, str], set[str]] = {}
    rec = re.search(r"on (\d+) \S+ \(", text)
    cost = re.search(r"cost \$([\d.]+)/h", text)
    good = re.search(r"goodput ([\d.]+) req/s  SLO", text)
    out.setdefault((rec.group(1), cost.group(1)), set()).add(good.group(1))
    for m in re.finditer(r"\$([\d.]+)/h  goodput ([\d.]+) req/s on (\d+) GPUs", text):
        out.setdefault((m.group(3), m.group(1)), set()).add(m.group(2))
    front = re.search(r"cost/goodput front \((.*)\)$", text, re.M)
    for m in re.finditer(r"(\d+) GPUs \$([\d.]+)/h ([\d.]+) req/s", front.group(1) if front else ""):
        out.setdefault((m.group(1), m.group(2)), set()).add(m.group(3))
    return out


def test_the_summary_states_one_goodput_per_deployment(disagg):
    raw, r = disagg
    before = _deployment_goodputs(summary_text(raw, None))
    assert before[("8", "30.40")] == {"4.83", "4.15", "4.25"}                   # the issue: three numbers
    text = summary_text(r, None)
    after = _deployment_goodputs(text)
    assert all(len(v) == 1 for v in after.values()), after
    assert after[("8", "30.40")] == {"4.83"}
    assert "simulated at 4.00 req/s per unit of 3 prefill + 1 decode replicas" in text
    assert "per replica)" not in text
    assert "note: FP8 KV" in text and "note: bf16 KV" not in text


def test_the_footer_names_the_manifests_objects(disagg, multinode):
    _, r = disagg
    kinds = manifest_kinds(r.launch)
    assert "Deployment" in kinds and "LeaderWorkerSet" not in kinds
    _, m = multinode
    kinds_m = manifest_kinds(m.launch)
    assert "LeaderWorkerSet" in kinds_m and "Deployment" not in kinds_m
    assert "LeaderWorkerSet" in launch_footer(m.launch) and "Kubernetes Deployment" not in summary_text(m, None)
    assert launch_footer({"vllm": "x", "unsupported": {"k8s": "no GPUs"}}) == \
        "the other engines' settings are in --json under 'launch'; no Kubernetes manifest: no GPUs"


def test_the_report_tables_state_the_summarys_numbers(disagg):
    _, r = disagg
    md = "\n".join(_recommendation_lines(r) + _context_lines(r))
    text = summary_text(r, None)
    for g in r.gpu_choice:
        if g.status == "ok":
            row = f"| {g.gpu} | ${g.usd_per_gpu_hour:g} | ${g.usd_per_hour:.2f}/h | {g.goodput_req_s:.2f} | {g.gpus} |"
            assert row in md
            assert f"${g.usd_per_hour:.2f}/h  goodput {g.goodput_req_s:.2f} req/s on {g.gpus} GPUs" in text
    for x in r.pareto:
        assert f"| {x.gpus} | ${x.usd_per_hour:.2f}/h | {x.goodput_req_s:.2f} |" in md
        assert f"{x.gpus} GPUs ${x.usd_per_hour:.2f}/h {x.goodput_req_s:.2f} req/s" in text
    assert f"- note: {r.notes[0]}" in md
