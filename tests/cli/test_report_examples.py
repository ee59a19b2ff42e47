"""Issue 23 items 1, 4 and 5 on every shipped example: ``kvtune solve --report DIR --json F`` exits
0 for every kind of pick (aggregated, disaggregated, multi-node, a GPU type chosen among several,
speculative, a replayed trace) and 3 for an infeasible variant, writes report.md with its sections
and three non-trivial PNGs, and gives one number per fact in the terminal, the JSON and the
report. Whole solves: slow."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import yaml

from example_solves import solve_example
from helpers import kvtune
from kvtune.optimizer.facts import manifest_kinds
from kvtune.optimizer.report import PLOTS, latency_sample, operating_point, pick_context
from kvtune.optimizer.result import DisaggregatedRecommendation, SolveResult
from kvtune.optimizer.workload import load_workload

ROOT = Path(__file__).parent.resolve().parents[1]
EXAMPLES = sorted(p.stem for p in (ROOT / "examples").glob("*.yaml"))
PNG = b"\x89PNG\r\n\x1a\n"


def _solve(tmp_path: Path, workload: Path) -> tuple[int, str, Path, Path]:
    out = tmp_path / "out"
    out.mkdir()
    code, text = kvtune("solve", workload, "--quiet", "--json", out / "r.json", "--report", out / "rep")
    return code, text, out / "r.json", out / "rep"


def _money(s: str) -> str:
    return s.replace(",", "")


def _deployments(text: str) -> dict[tuple[str, str, str], set[str]]:
    """(GPUs, $/h, GPU type) -> the goodput figures a text states for that deployment: the
    recommendation, the GPU-type rows and the cost/goodput front, as terminal lines or report rows."""
    facts: dict[tuple[str, str, str], set[str]] = {}

    def add(gpus: str, usd: str, gpu: str, goodput: str) -> None:
        facts.setdefault((gpus, _money(usd), gpu), set()).add(goodput)

    rec = re.search(r"Recommendation: .*? on (\d+) (\S+) \(", text) or \
        re.search(r"\*\*[^*]+\*\* \S+ on (\d+) (\S+) \(", text)
    cost = re.search(r"cost \| \$([\d,.]+)/h|cost \$([\d,.]+)/h", text)
    good = re.search(r"goodput \(simulated\) \| ([\d.]+) req/s|goodput ([\d.]+) req/s  SLO", text)
    assert rec and cost and good, text[:2000]
    pick_gpu = rec.group(2)
    add(rec.group(1), cost.group(1) or cost.group(2), pick_gpu, good.group(1) or good.group(2))
    for m in re.finditer(r"gpu (\S+) \(\$[\d.]+/GPU-h\): \$([\d,.]+)/h  goodput ([\d.]+) req/s on (\d+) GPUs", text):
        add(m.group(4), m.group(2), m.group(1), m.group(3))
    for m in re.finditer(r"^\| (\S+) \| \$[\d.]+ \| \$([\d,.]+)/h \| ([\d.]+) \| (\d+) \|", text, re.M):
        add(m.group(4), m.group(2), m.group(1), m.group(3))
    front = re.search(r"cost/goodput front \((.*)\)$", text, re.M)
    for m in re.finditer(r"(\d+) GPUs \$([\d,.]+)/h ([\d.]+) req/s(?: disaggregated)?(?: on (\S+))?",
                         front.group(1) if front else ""):
        add(m.group(1), m.group(2), m.group(4) or pick_gpu, m.group(3))
    for m in re.finditer(r"^\| (\d+) \| \$([\d,.]+)/h \| ([\d.]+) \| [a-z]+(?: on (\S+))?", text, re.M):
        add(m.group(1), m.group(2), m.group(4) or pick_gpu, m.group(3))
    return facts


def _check_one_number_per_fact(r: SolveResult, d: dict, terminal: str, md: str) -> None:
    rec, p, c = r.recommendation, r.predicted, r.cost
    # the recommendation's figures, as the JSON holds them, in the terminal and in the report
    figures = [f"${c.usd_per_hour:.2f}/h", f"{p.goodput_req_s:.2f} req/s", f"{p.load_per_replica_req_s:.2f} req/s",
               f"{p.slo_attainment:.3f}", f"${c.usd_per_million_output_tokens:.3f} per 1M output tokens",
               f"{p.ttft_ms['p50']:.0f}", f"{p.ttft_ms['p90']:.0f}", f"{p.ttft_ms['p99']:.0f}",
               f"{p.tpot_ms['p50']:.1f}", f"{p.tpot_ms['p90']:.1f}", f"{p.tpot_ms['p99']:.1f}",
               f"{p.tok_s_per_user:.0f}", f"{p.output_tok_s:,.0f}", f"{r.headroom * 100:+.0f}%"]
    for f in figures:
        assert f in terminal and f in md, f
    # every deployment (GPUs, $/h, GPU type) has one goodput across the terminal and the report
    t, m = _deployments(terminal), _deployments(md)
    for key in t.keys() | m.keys():
        assert len(t.get(key, set()) | m.get(key, set())) == 1, (key, t.get(key), m.get(key))
    # ... and it is the JSON's: the pick's row in gpu_choice and its point on the front are the pick
    for g in d.get("gpu_choice", []):
        if g["gpu"] == rec.gpu:
            assert (g["usd_per_hour"], g["goodput_req_s"], g["gpus"]) == (c.usd_per_hour, p.goodput_req_s, rec.gpus)
            assert g["deployment"] == ("disaggregated" if isinstance(rec, DisaggregatedRecommendation) else "aggregated")
    at_price = [x for x in d["pareto"] if abs(x["usd_per_hour"] - c.usd_per_hour) < 1e-9]
    assert [(x["goodput_req_s"], x["gpus"]) for x in at_price] == [(p.goodput_req_s, rec.gpus)]
    # notes describe the pick that won: its KV dtype, its kind
    notes = d.get("notes") or []
    assert [ln.split("note: ", 1)[1] for ln in terminal.splitlines() if "  note: " in ln] == notes
    assert [ln[len("- note: "):] for ln in md.splitlines() if ln.startswith("- note: ")] == notes
    for n in notes:
        if n.startswith(("bf16 KV:", "FP8 KV:")):   # the KV-dtype note of the pick (not "FP8 KV excluded by ...")
            assert n.lower().startswith(rec.kv_dtype), (rec.kv_dtype, n)
            assert ("disaggregated" in n) == isinstance(rec, DisaggregatedRecommendation), n
    # "per replica" only where the load is one replica's
    basis = "per unit of" if isinstance(rec, DisaggregatedRecommendation) else "per replica"
    assert f"simulated at {p.load_per_replica_req_s:.2f} req/s {basis}" in terminal
    # the footer names the Kubernetes objects the manifest holds
    kinds = manifest_kinds(d["launch"])
    footer = next(ln for ln in terminal.splitlines() if "are in --json under 'launch'" in ln
                  or "no Kubernetes manifest" in ln)
    if kinds:
        assert f"({', '.join(kinds)})" in footer
        assert ("LeaderWorkerSet" in footer) == ("LeaderWorkerSet" in kinds)
    else:
        assert "no Kubernetes manifest" in footer


def _check_plots(r: SolveResult, spec, rep: Path, md: str) -> None:
    for png in PLOTS:
        f = rep / png
        assert f.read_bytes()[:8] == PNG and f.stat().st_size > 20_000, png
        assert f"({png})" in md
    # latency.png is the simulation behind predicted: its percentiles are predicted's
    res = latency_sample(pick_context(r, spec), r)
    keep = res.measured & ~np.isinf(res.ttft_s)
    for name, arr in (("ttft_ms", res.ttft_s[keep] * 1e3), ("tpot_ms", res.tpot_s[keep] * 1e3)):
        arr = arr[np.isfinite(arr)]
        for q in (50, 90, 99):
            assert float(np.percentile(arr, q)) == pytest.approx(getattr(r.predicted, name)[f"p{q}"], rel=1e-9)
    # frontier.png's operating point is where the deployment runs: the simulated output tok/s per replica
    x, y, n = operating_point(r)
    assert f"{x:,.0f} output tok/s, {y:.0f} tok/s per user" in md
    assert x * n == pytest.approx(r.predicted.output_tok_s) and y == r.predicted.tok_s_per_user


@pytest.mark.slow
@pytest.mark.parametrize("name", EXAMPLES)
def test_every_example_reports_with_one_number_per_fact(name, tmp_path_factory):
    workload = ROOT / "examples" / f"{name}.yaml"
    s = solve_example(tmp_path_factory, name)   # solved once, shared with the schema and launch tests
    code, terminal, js, rep = s.code, s.text, s.json_path, s.report
    assert code == 0, terminal[-3000:]
    assert "Traceback" not in terminal
    d = json.loads(js.read_text())
    r = SolveResult.from_json(d)
    assert r.status == "ok" and d["report"] == str(rep / "report.md")
    md = (rep / "report.md").read_text()
    for section in ("## Recommendation", "## Plots", "## Launch (vLLM)", "## Launch (SGLang)",
                    "## Launch (TensorRT-LLM)", "## Kubernetes"):
        assert section in md, section
    assert sorted(p.name for p in rep.iterdir()) == sorted(["report.md", *PLOTS])
    assert not [p for p in rep.parent.iterdir() if p.name.startswith(".rep.")]   # no staging left
    _check_one_number_per_fact(r, d, terminal, md)
    _check_plots(r, load_workload(workload), rep, md)


@pytest.mark.slow
def test_an_infeasible_answer_writes_its_reason_and_no_plots(tmp_path):
    doc = yaml.safe_load((ROOT / "examples" / "chat-llama3.1-8b.yaml").read_text())
    doc["slo"]["tpot_ms"] = 1
    wl = tmp_path / "w.yaml"
    wl.write_text(yaml.safe_dump(doc))
    code, terminal, js, rep = _solve(tmp_path, wl)
    assert code == 3 and "Traceback" not in terminal
    d = json.loads(js.read_text())
    md = (rep / "report.md").read_text()
    assert d["status"] == "infeasible" and d["report"] == str(rep / "report.md")
    assert "## Infeasible" in md and d["reason"] in md and "TPOT" in md
    assert [p.name for p in rep.iterdir()] == ["report.md"]
