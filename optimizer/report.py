"""``kvtune solve --report DIR``: report.md and three plots (matplotlib, Agg backend).

1. ``frontier.png``: per-user tok/s vs total tok/s of one replica over batch, for the chosen TP,
   KV dtype and speculative length (StepModel decode steps at the workload's mean context), with
   the TPOT SLO as a vertical line (1000 / tpot_ms tok/s per user) and the chosen operating point.
2. ``pareto.png``: the cost/goodput Pareto front (simulated or screened points) and the pick.
3. ``latency.png``: TTFT and TPOT CDFs of the pick, simulated at its per-replica load, against the SLOs.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from kvtune.costmodel.errors import InputError

from .result import DisaggregatedRecommendation, Recommendation, SolveResult
from .search import SolveContext
from .workload import WorkloadSpec

__all__ = ["write_report"]

_Rec = Recommendation | DisaggregatedRecommendation


def _plt() -> Any:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _layout(rec: _Rec) -> str | None:
    return rec.layout if isinstance(rec, Recommendation) else None


def _operating_batch(result: SolveResult) -> int:
    return (result.bottleneck.operating_batch if result.bottleneck is not None else None) or 1


def _step(ctx: SolveContext, rec: _Rec) -> Any:
    sm = ctx.step(rec.tp, rec.kv_dtype, rec.spec_k, _layout(rec))
    if isinstance(sm, Exception):   # the pick was simulated, so its step model exists
        raise sm
    return sm


def _frontier(ctx: SolveContext, rec: _Rec, result: SolveResult, path: Path) -> None:
    plt = _plt()
    sm = _step(ctx, rec)
    w = ctx.stats
    context = w.mean_input_tokens + w.mean_output_tokens / 2
    b_max = max(2, min(rec.batch_cap * 2, int(sm.memory.kv_pool_tokens // context)))
    batches = np.unique(np.geomspace(1, b_max, 40).astype(int))
    per_user, total = [], []
    for b in batches:
        s = sm.decode_step(int(b), context)
        u = s.tokens_per_seq / s.time_s
        per_user.append(u)
        total.append(u * b)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.plot(total, per_user, "-o", ms=3, label=f"TP{rec.tp} KV {rec.kv_dtype} k={rec.spec_k} (decode at {context:,.0f} ctx)")
    tpot = ctx.spec.slo.tpot_ms
    if np.isfinite(tpot):
        ax.axhline(1000 / tpot, color="red", ls="--", label=f"TPOT SLO {tpot:g} ms = {1000 / tpot:.0f} tok/s/user")
    op = _operating_batch(result)
    s = sm.decode_step(int(op), context)
    ax.plot([s.tokens_per_seq / s.time_s * op], [s.tokens_per_seq / s.time_s], "k*", ms=14,
            label=f"operating point (batch {op})")
    ax.set_xlabel("total output tok/s per replica")
    ax.set_ylabel("tok/s per user")
    ax.set_title(f"{ctx.model.name}: interactivity vs throughput (one replica)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _pareto(result: SolveResult, path: Path) -> None:
    plt = _plt()
    pts = result.pareto or ()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for ev, mk in (("simulated", "o"), ("screened (upper bound)", "x")):
        sel = [p for p in pts if p.evidence == ev]
        if sel:
            ax.plot([p.usd_per_hour for p in sel], [p.goodput_req_s for p in sel], mk, label=ev)
    if pts:
        xs = [p.usd_per_hour for p in pts]
        ys = [p.goodput_req_s for p in pts]
        ax.step(xs, ys, where="post", color="gray", alpha=0.5)
    c, pr = result.cost, result.predicted
    assert c is not None and pr is not None   # write_report draws an ok result only
    ax.plot([c.usd_per_hour], [pr.goodput_req_s], "r*", ms=14, label="recommendation (simulated)")
    rate = result.target_rate_req_s
    if rate and np.isfinite(rate):
        ax.axhline(rate, color="red", ls="--", label=f"target {rate:g} req/s")
    ax.set_xlabel("$ per hour")
    ax.set_ylabel("goodput, req/s (SLO attainment met)")
    ax.set_title("cost / goodput Pareto front")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _latency(ctx: SolveContext, rec: _Rec, result: SolveResult, path: Path) -> None:
    from kvtune.costmodel.simulate import simulate

    from .verify import sim_requests
    plt = _plt()
    sm = _step(ctx, rec)
    assert result.predicted is not None   # write_report draws an ok result only
    load = result.predicted.load_per_replica_req_s
    n = sim_requests(ctx.spec.slo.attainment, _operating_batch(result))
    res = simulate(sm, ctx.spec.requests(n, ctx.seed + 1, rate_req_s=load),
                   ctx.engine.sim_config(rec.batch_cap, rec.chunk_tokens), arrival="trace", seed=ctx.seed)
    m = res.measured
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, arr, slo, name in ((axes[0], res.ttft_s[m] * 1e3, ctx.spec.slo.ttft_ms, "TTFT"),
                               (axes[1], res.tpot_s[m] * 1e3, ctx.spec.slo.tpot_ms, "TPOT")):
        x = np.sort(arr[np.isfinite(arr)])
        if x.size:
            ax.plot(x, np.arange(1, x.size + 1) / x.size, label=f"simulated at {load:.2f} req/s/replica")
        if np.isfinite(slo):
            ax.axvline(slo, color="red", ls="--", label=f"SLO {slo:g} ms")
        ax.axhline(ctx.spec.slo.attainment, color="gray", ls=":", label=f"attainment {ctx.spec.slo.attainment:g}")
        ax.set_xlabel(f"{name}, ms")
        ax.set_ylabel("share of requests")
        ax.set_title(f"{name} CDF")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


_ENGINE_LABELS = (("vllm", "vLLM"), ("sglang", "SGLang"), ("trtllm", "TensorRT-LLM"),
                  ("llamacpp", "llama.cpp llama-server"))


def _launch_lines(launch: Mapping[str, Any]) -> list[str]:
    """The launch settings as markdown, whatever shape each engine's entry has (``optimizer.launch``:
    a command line, or a command and its config files, ``*_yaml``, as a disaggregated pick has
    several); engines absent from ``launch`` are left out."""
    out: list[str] = []
    for key, label in _ENGINE_LABELS:
        entry = launch.get(key)
        if not entry:
            continue
        out += [f"## Launch ({label})", ""]
        if isinstance(entry, Mapping):
            if entry.get("command"):
                out += ["```bash", str(entry["command"]).rstrip(), "```", ""]
            for name, text in entry.items():
                if name.endswith("_yaml") and text:
                    out += [f"{name[:-len('_yaml')]}.yaml:", "", "```yaml", str(text).rstrip(), "```", ""]
        else:
            out += ["```bash", str(entry).rstrip(), "```", ""]
    if launch.get("k8s"):
        out += ["## Kubernetes", "", "```yaml", str(launch["k8s"]).rstrip(), "```", ""]
    if launch.get("checked"):
        out += [f"_{launch['checked']}_", ""]
    return out


def write_report(result: SolveResult, spec: WorkloadSpec, out_dir: str) -> str:
    """Write report.md and the plots into ``out_dir`` (created if missing); returns the md path.

    Whole or not at all: the files are drawn in a staging folder beside ``out_dir`` and moved in
    only once every one is written, so a failure leaves no partial report behind."""
    d = Path(out_dir)
    if d.exists() and not d.is_dir():
        raise InputError(f"--report {out_dir}: exists and is not a folder")
    d.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{d.name}.", dir=d.parent))
    try:
        _write_files(result, spec, stage)
        d.mkdir(exist_ok=True)
        for f in sorted(stage.iterdir()):
            os.replace(f, d / f.name)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return str(d / "report.md")


def _write_files(result: SolveResult, spec: WorkloadSpec, d: Path) -> None:
    r = result
    lines = [f"# kvtune solve: {Path(spec.path).name}", "",
             f"kvtune {r.kvtune_version}, sampler {r.sampler}, seed {r.seed}, "
             f"{r.trials.completed} trials ({r.trials.feasible} feasible).",
             f"Efficiency: {r.source}.", ""]
    rec, p, c, b, launch = r.recommendation, r.predicted, r.cost, r.bottleneck, r.launch
    if r.status != "ok" or rec is None or p is None or c is None or b is None or launch is None \
            or r.headroom is None:
        lines += ["## Infeasible", "", r.reason or "", ""]
        (d / "report.md").write_text("\n".join(lines))
        return
    ctx = SolveContext.build(spec, r.seed)
    _frontier(ctx, rec, r, d / "frontier.png")
    _pareto(r, d / "pareto.png")
    _latency(ctx, rec, r, d / "latency.png")
    lines += [
        "## Recommendation", "",
        f"**{rec.replicas} x TP{rec.tp}** ({rec.gpus} GPUs, {rec.nodes} node(s)), batch cap "
        f"{rec.batch_cap}, chunk {rec.chunk_tokens} tokens, KV {rec.kv_dtype}, speculative k {rec.spec_k}.", "",
        "| metric | value |", "|---|---|",
        f"| cost | ${c.usd_per_hour:.2f}/h, ${c.usd_per_million_output_tokens:.3f} per 1M output tokens |",
        f"| goodput (simulated) | {p.goodput_req_s:.2f} req/s (target {r.target_rate_req_s:g}; headroom {r.headroom * 100:+.0f}%) |",
        f"| SLO attainment at target | {p.slo_attainment:.3f} |",
        f"| TTFT p50 / p90 / p99 | {p.ttft_ms['p50']:.0f} / {p.ttft_ms['p90']:.0f} / {p.ttft_ms['p99']:.0f} ms |",
        f"| TPOT p50 / p90 / p99 | {p.tpot_ms['p50']:.1f} / {p.tpot_ms['p90']:.1f} / {p.tpot_ms['p99']:.1f} ms |",
        f"| bottleneck | {b.term} (batch limited by {b.batch_limit} at {b.operating_batch}) |", "",
        *[f"- {n}" for n in r.notes or ()], "",
        "## Plots", "", "![frontier](frontier.png)", "", "![pareto](pareto.png)", "", "![latency](latency.png)", "",
        *_launch_lines(launch)]
    (d / "report.md").write_text("\n".join(lines))
