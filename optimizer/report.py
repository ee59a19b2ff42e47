"""``kvtune solve --report DIR``: report.md and three plots (matplotlib, Agg backend), for every
kind of pick (aggregated, disaggregated, multi-node, a GPU type chosen among several) and for an
infeasible answer (report.md alone: the reason, the closest miss, what each kind and type found).

1. ``frontier.png``: per-user tok/s against total output tok/s of one replica (a disaggregated
   pick: one decode replica) as the batch grows: the analytic decode-only step at the workload's
   mean context (``StepModel``), the TPOT SLO as a line, and the *simulated* operating point, where
   the deployment runs at its load (output tok/s per replica and tok/s per user of the simulation
   behind ``predicted``; the sequences decoding at once follow by Little's law). The point sits
   below the curve by what prefill chunks take from each step.
2. ``pareto.png``: every deployment the simulator sized (the aggregated configs it verified, the
   disaggregated ones it fully simulated, every other GPU type's best), the cost/goodput front
   through them (``result.pareto``, ``optimizer.facts``) and the pick.
3. ``latency.png``: TTFT and TPOT CDFs of the pick from the simulation behind ``predicted`` (the
   same requests, seed and load, re-run: its percentiles are ``predicted``'s), against the SLOs.

Every figure is formatted as the terminal formats it (``optimizer.facts``, ``summary_text``), so
the report, the terminal and the ``--json`` file give one number per fact.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from kvtune.costmodel.engines import REGISTRY as ENGINE_POLICIES
from kvtune.costmodel.errors import InputError

from .facts import describe, disaggregated_points, front_point_text, is_disaggregated, launch_footer, load_basis, \
    other_gpu_points, pick_params, pick_point
from .result import DisaggregatedRecommendation, Recommendation, SolveResult
from .search import SolveContext
from .workload import WorkloadSpec
import importlib.util
from kvtune.costmodel.simulate import simulate
from .verify import sim_config
from .deployment_choice import deployment_lines
from kvtune.costmodel.deployment import Pool, kv_link, simulate_disaggregated
from .disagg import DEFAULT_ENGINE

__all__ = ["write_report", "latency_sample", "operating_point", "pick_context", "PLOTS"]

PLOTS = ("frontier.png", "pareto.png", "latency.png")
_Rec = Recommendation | DisaggregatedRecommendation


REPORT_EXTRA = "pip install 'kvtune[report]'"


def require_matplotlib(flag: str = "--report") -> None:
    """Before any work: the plots need matplotlib, which is the ``report`` extra (not a dependency of
    ``kvtune solve``). Missing, one ``Error:`` line naming what to install; nothing is written."""
    if importlib.util.find_spec("matplotlib") is None:
        raise InputError(f"{flag}: the report's plots need matplotlib, which is not installed: {REPORT_EXTRA}")


def _plt() -> Any:
    require_matplotlib()
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


# ---- the pick's context and simulation -----------------------------------------------------------
def pick_context(result: SolveResult, spec: WorkloadSpec, calibration: str | None = None, engine: str | None = None,
                 profile: str | None = None) -> SolveContext:
    """The solve context the pick was simulated in: its GPU type (with several, the chosen one at
    its price, as ``optimizer.gpu_choice`` solves each type) and the solve's overrides."""
    h, rec = spec.hardware, result.recommendation
    if h.choices and rec is not None:
        prices = dict(h.choices)
        gpu = rec.gpu if rec.gpu in prices else h.choices[0][0]
        spec = dataclasses.replace(spec, hardware=dataclasses.replace(h, gpu=gpu, usd_per_gpu_hour=prices[gpu],
                                                                      choices=()))
    return SolveContext.build(spec, result.seed, calibration, engine, profile)


def latency_sample(ctx: SolveContext, result: SolveResult) -> Any:
    """The simulation behind ``result.predicted``, run again (a ``SimResult``): the pick's first
    fresh draw (``predicted.draws``: its seed and size) at its load per replica, as
    ``optimizer.verify.simulate_at`` (aggregated) and ``optimizer.disagg_verify.simulate_unit_at``
    (disaggregated, per unit) run it. Its percentiles are ``predicted``'s (tests/optimizer/test_report.py
    holds them)."""
    rec, p = result.recommendation, result.predicted
    assert rec is not None and p is not None and p.draws   # an ok result: verified on fresh draws
    seed, n, load = p.draws["seeds"][0], p.draws["n_requests"], p.draws["load_req_s"]
    req = ctx.spec.requests(n, seed, rate_req_s=load)
    if isinstance(rec, DisaggregatedRecommendation):

        units = max(rec.units, 1)

        def pool(pc: Any) -> Pool:
            step = ctx.fitting_step({"tp": pc.tp, "kv_dtype": rec.kv_dtype, "spec_k": 0})
            return Pool(step, ctx.engine.sim_config(pc.batch_cap, pc.chunk_tokens), pc.replicas // units)
        return simulate_disaggregated(pool(rec.prefill), pool(rec.decode), req, kv_link(ctx.gpu, rec.link == "nvlink"),
                                      "trace", seed, None, engine=ctx.engine.engine or DEFAULT_ENGINE).result
    params = pick_params(result)
    assert params is not None   # an aggregated pick is a verified row
    return simulate(ctx.fitting_step(params), req, sim_config(ctx, params), arrival="trace", seed=seed)


def operating_point(result: SolveResult) -> tuple[float, float, int]:
    """Where one replica (a disaggregated pick: one decode replica) runs at the pick's load, from
    the simulation behind ``predicted``: (output tok/s, tok/s per user, replicas it is shared by)."""
    rec, p = result.recommendation, result.predicted
    assert rec is not None and p is not None
    n = rec.decode.replicas if isinstance(rec, DisaggregatedRecommendation) else rec.replicas
    return p.output_tok_s / max(n, 1), p.tok_s_per_user, n


# ---- the plots -------------------------------------------------------------------------------------
def _frontier(ctx: SolveContext, result: SolveResult, path: Path) -> None:
    plt = _plt()
    rec = result.recommendation
    assert rec is not None
    if isinstance(rec, DisaggregatedRecommendation):
        tp, cap, who = rec.decode.tp, rec.decode.batch_cap, "one decode replica"
        sm = ctx.fitting_step({"tp": tp, "kv_dtype": rec.kv_dtype, "spec_k": 0})
    else:
        params = pick_params(result)
        assert params is not None
        tp, cap, who = rec.tp, rec.batch_cap, "one replica"
        sm = ctx.fitting_step(params)
    w = ctx.stats
    context = w.mean_input_tokens + w.mean_output_tokens / 2
    pool_batch = int(sm.memory.kv_pool_tokens // max(context, 1.0))
    b_max = max(2, min(max(cap, 2) * 2, pool_batch))
    batches = np.unique(np.concatenate([np.geomspace(1, b_max, 40).astype(int), [min(cap, b_max)]]))
    per_user, total = [], []
    for b in batches:
        s = sm.decode_step(int(b), context)
        u = s.tokens_per_seq / s.time_s
        per_user.append(u)
        total.append(u * b)
    fig, ax = plt.subplots(figsize=(8, 6.2))
    layout = describe(rec).split(" x ", 1)[1] if isinstance(rec, Recommendation) else f"TP{tp}"
    ax.plot(total, per_user, "-", color="tab:blue",
            label=f"{layout} KV {rec.kv_dtype} k={rec.spec_k}: decode step alone at {context:,.0f} ctx (analytic)")
    i = int(np.searchsorted(batches, min(cap, b_max)))
    ax.plot([total[i]], [per_user[i]], "o", mfc="none", color="tab:blue", ms=9,
            label=f"batch cap {cap} on that curve (analytic)")
    tpot = ctx.spec.slo.tpot_ms
    if np.isfinite(tpot):
        ax.axhline(1000 / tpot, color="red", ls="--", label=f"TPOT SLO {tpot:g} ms = {1000 / tpot:.0f} tok/s per user")
    x, y, n = operating_point(result)
    seqs = max(1, round(x / y)) if y > 0 else 1
    s = sm.decode_step(seqs, context)
    ax.plot([s.tokens_per_seq / s.time_s * seqs], [s.tokens_per_seq / s.time_s], "x", color="tab:blue", ms=9,
            label=f"the decode step alone at those {seqs} sequences (analytic)")
    ax.plot([x], [y], "k*", ms=16, zorder=5,
            label=f"where it runs at its load (simulated): {x:,.0f} tok/s, {y:.0f} tok/s per user, "
                  f"~{seqs} sequences decoding (Little's law)")
    ax.set_xlabel(f"total output tok/s of {who}")
    ax.set_ylabel("tok/s per user")
    ax.set_title(f"{ctx.model.name} on {ctx.gpu.name}: interactivity vs throughput ({who} of {n})")
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    _legend_below(ax)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _pareto(result: SolveResult, spec: WorkloadSpec, path: Path) -> None:
    plt = _plt()
    c, pick = result.cost, pick_point(result)
    assert c is not None and pick is not None   # write_report draws an ok result only
    h = spec.hardware
    fig, ax = plt.subplots(figsize=(8, 6.2))
    gpu = pick_gpu(result)
    agg = [(v.usd_per_hour, v.goodput_req_s, v.config.get("kv_dtype")) for v in result.verified
           if v.feasible and v.usd_per_hour is not None and v.goodput_req_s is not None]
    dis = [(x.usd_per_hour, x.goodput_req_s, x.config.get("kv_dtype"))
           for x in disaggregated_points(result, c.usd_per_gpu_hour, h.max_nodes * h.gpus_per_node)]
    others = other_gpu_points(result)
    ax.plot([pick.usd_per_hour], [pick.goodput_req_s], "r*", ms=20, zorder=3,
            label=f"the pick: {pick.gpus} GPUs ${pick.usd_per_hour:.2f}/h {pick.goodput_req_s:.2f} req/s")
    for pts, mk, color, what in ((agg, "o", "tab:blue", "aggregated on {gpu} (simulated; the race's verified configs)"),
                                 (dis, "s", "tab:green", "disaggregated on {gpu} (simulated; the search's full runs)")):
        for kv, fill in (("bf16", True), ("fp8", False)):
            sel = [(u, g) for u, g, k in pts if (k == "bf16") == (kv == "bf16")]
            if sel:
                ax.plot(*zip(*sel), mk, color=color, ms=5 if fill else 7, zorder=4, mfc=color if fill else "none",
                        label=what.format(gpu=gpu) + (", bf16 KV" if fill else ", FP8 KV (hollow)"))
    for o in others:
        ax.plot([o.usd_per_hour], [o.goodput_req_s], "D", ms=7, zorder=4,
                label=f"best on {o.config['gpu']} (simulated)")
    front = result.pareto or ()
    if len(front) > 1:
        ax.step([x.usd_per_hour for x in front], [x.goodput_req_s for x in front], where="post", color="gray",
                alpha=0.7, zorder=2, label=f"cost/goodput front ({len(front)} deployments)")
    points = {(pick.usd_per_hour, pick.goodput_req_s), *((u, g) for u, g, _ in agg + dis),
              *((o.usd_per_hour, o.goodput_req_s) for o in others)}
    xs = [u for u, _ in points]
    ys = [g for _, g in points]
    rate = result.target_rate_req_s
    if rate and np.isfinite(rate):
        ax.axhline(rate, color="red", ls="--", zorder=1, label=f"target {rate:g} req/s")
        ys.append(rate)
    lo, hi = min(xs), max(xs)
    pad = max(0.08 * (hi - lo), 0.25 * lo, 1.0)   # a lone point still gets an axis worth reading
    ax.set_xlim(max(0.0, lo - pad), hi + pad)
    ylo, yhi = min(ys), max(ys)
    ypad = max(0.08 * (yhi - ylo), 0.2 * yhi, 1e-3)
    ax.set_ylim(max(0.0, ylo - ypad), yhi + ypad)
    ax.set_xlabel("$ per hour")
    ax.set_ylabel("goodput, req/s (SLO attainment met)")
    if len(points) > 1:
        ax.set_title(f"cost / goodput: the {len(points)} deployments the simulator sized")
    else:
        counts = result.verification.outcomes
        out = sum(v for k, v in counts.items() if k != "verified")
        ax.set_title(f"cost / goodput: the one deployment the simulator sized\n(the race ruled {out} other "
                     f"configs out before sizing them: beaten, pruned or missing the SLOs)", fontsize=10)
    ax.grid(alpha=0.3)
    _legend_below(ax)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _legend_below(ax: Any, ncol: int = 1) -> None:
    """The legend under the axes: it never hides a point."""
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(0.0, -0.12), ncol=ncol, frameon=False)


def pick_gpu(result: SolveResult) -> str:
    rec = result.recommendation
    return rec.gpu if rec is not None else ""


def _latency(ctx: SolveContext, result: SolveResult, res: Any, path: Path) -> None:
    plt = _plt()
    p = result.predicted
    assert p is not None
    m = res.measured & ~np.isinf(res.ttft_s)
    fig, axes = plt.subplots(1, 2, figsize=(11, 5))
    basis = load_basis(result)
    for ax, arr, slo, name in ((axes[0], res.ttft_s[m] * 1e3, ctx.spec.slo.ttft_ms, "TTFT"),
                               (axes[1], res.tpot_s[m] * 1e3, ctx.spec.slo.tpot_ms, "TPOT")):
        x = np.sort(arr[np.isfinite(arr)])
        if x.size:
            p90 = float(np.percentile(x, 90))
            ax.plot(x, np.arange(1, x.size + 1) / x.size,
                    label=f"simulated at {p.load_per_replica_req_s:.2f} req/s {basis}\n"
                          f"({x.size} requests measured; p90 {p90:.1f} ms)")
        if np.isfinite(slo):
            ax.axvline(slo, color="red", ls="--", label=f"SLO {slo:g} ms")
        ax.axhline(ctx.spec.slo.attainment, color="gray", ls=":", label=f"attainment {ctx.spec.slo.attainment:g}")
        ax.set_xlabel(f"{name}, ms")
        ax.set_ylabel("share of requests")
        ax.set_title(f"{name} CDF of the pick")
        ax.grid(alpha=0.3)
        _legend_below(ax)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---- report.md ---------------------------------------------------------------------------------------
def _launch_lines(launch: Mapping[str, Any]) -> list[str]:
    """The launch settings as markdown, whatever shape each engine's entry has (``optimizer.launch``:
    a command line, or a command and its config files, ``*_yaml``, as a disaggregated pick has
    several); engines absent from ``launch`` are left out."""
    out: list[str] = []
    for key, policy in ENGINE_POLICIES.items():   # each registered engine under its display name
        label = policy.display_name
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
    plat = launch.get("platforms") or {}
    for key, label, text in (("dynamo", "NVIDIA Dynamo", "manifest"), ("llmd", "llm-d modelservice values", "values_yaml"),
                             ("kserve", "KServe", "manifest")):
        why = plat.get("unsupported", {}).get(key)
        if key in plat or why:
            out += [f"## {label}", ""] + (["```yaml", str(plat[key][text]).rstrip(), "```", ""] if key in plat
                                          else [f"_{label} cannot run this pick: {why}_", ""])
    out += [f"_{launch_footer(launch).replace(' in --json', ' also in --json')}._", ""]
    if launch.get("checked"):
        out += [f"_{launch['checked']}_", ""]
    return out


def _context_lines(r: SolveResult) -> list[str]:
    """What the deployment kinds and the GPU types found (both answers have them)."""
    out: list[str] = []
    dl = [ln.strip() for ln in deployment_lines(r)]
    if dl:
        out += ["## Aggregated or disaggregated", "", *[f"- {ln}" for ln in dl], ""]
    rows = r.gpu_choice or ()
    if rows:
        out += ["## GPU types", "", "| GPU | $/GPU-h | $/h | goodput, req/s | GPUs | deployment | why |",
                "|---|---|---|---|---|---|---|"]
        for g in rows:
            if g.status == "ok" and g.usd_per_hour is not None and g.goodput_req_s is not None:
                out.append(f"| {g.gpu} | ${g.usd_per_gpu_hour:g} | ${g.usd_per_hour:.2f}/h | {g.goodput_req_s:.2f} | "
                           f"{g.gpus} | {g.deployment or ''} | {g.why} |")
            else:
                out.append(f"| {g.gpu} | ${g.usd_per_gpu_hour:g} | infeasible | | | | {g.why} |")
        out.append("")
    return out


def _recommendation_lines(r: SolveResult) -> list[str]:
    rec, p, c, b = r.recommendation, r.predicted, r.cost, r.bottleneck
    assert rec is not None and p is not None and c is not None and b is not None and r.headroom is not None
    per = f", {rec.nodes_per_replica} per replica" if isinstance(rec, Recommendation) and rec.nodes_per_replica > 1 else ""
    out = ["## Recommendation", "",
           f"**{describe(rec)}** {rec.model} on {rec.gpus} {rec.gpu} ({rec.nodes} node{'s' if rec.nodes > 1 else ''}{per}): "
           f"batch cap {rec.batch_cap}, chunk {rec.chunk_tokens} tokens, KV {rec.kv_dtype}, speculative k {rec.spec_k}"
           + "".join(f", {k} {v}" for k, v in (getattr(rec, "knobs", None) or {}).items()) + ".",
           ""]
    if isinstance(rec, DisaggregatedRecommendation):
        q, d = rec.prefill, rec.decode
        out += [f"Prefill pool: {q.replicas} x TP{q.tp}, chunk {q.chunk_tokens}, batch cap {q.batch_cap}; decode pool: "
                f"{d.replicas} x TP{d.tp}, batch cap {d.batch_cap}; KV over "
                f"{'NVLink' if rec.link == 'nvlink' else 'the network'}.", ""]
    out += ["| metric | value |", "|---|---|",
            f"| cost | ${c.usd_per_hour:.2f}/h, ${c.usd_per_million_output_tokens:.3f} per 1M output tokens "
            f"(at the {c.priced_at}) |",
            f"| goodput (simulated) | {p.goodput_req_s:.2f} req/s (target {r.target_rate_req_s:g} req/s; "
            f"headroom {r.headroom * 100:+.0f}%) |",
            f"| load simulated | {p.load_per_replica_req_s:.2f} req/s {load_basis(r)} |",
            f"| SLO attainment at that load (simulated) | {p.slo_attainment:.3f} |",
            f"| TTFT p50 / p90 / p99 (simulated) | {p.ttft_ms['p50']:.0f} / {p.ttft_ms['p90']:.0f} / "
            f"{p.ttft_ms['p99']:.0f} ms |",
            f"| TPOT p50 / p90 / p99 (simulated) | {p.tpot_ms['p50']:.1f} / {p.tpot_ms['p90']:.1f} / "
            f"{p.tpot_ms['p99']:.1f} ms |",
            f"| tok/s per user, output tok/s (simulated) | {p.tok_s_per_user:.0f}, {p.output_tok_s:,.0f} |"]
    if b.step is not None:
        st = b.step
        out.append(f"| bottleneck (analytic screen) | {b.term} (batch limited by {b.batch_limit} at "
                   f"{b.operating_batch}; step {st.step_ms or 0:.1f} ms: memory {st.mem_ms or 0:.1f}, compute "
                   f"{st.compute_ms or 0:.1f}) |")
    out.append("")
    if r.notes:
        out += [*[f"- note: {n}" for n in r.notes], ""]
    front = r.pareto or ()
    if front:
        out += ["### Cost/goodput front", "", "| GPUs | $/h | goodput, req/s | deployment | evidence |",
                "|---|---|---|---|---|"]
        for x in front:
            mine = " (the pick)" if "(the pick)" in front_point_text(r, x) else ""
            kind = ("disaggregated" if is_disaggregated(x.config) else "aggregated") \
                + (f" on {x.config['gpu']}" if x.config.get("gpu") else "")
            out.append(f"| {x.gpus} | ${x.usd_per_hour:.2f}/h | {x.goodput_req_s:.2f} | {kind}{mine} | {x.evidence} |")
        out.append("")
    return out


def _write_files(result: SolveResult, spec: WorkloadSpec, d: Path, calibration: str | None, engine: str | None,
                 profile: str | None) -> None:
    r = result
    lines = [f"# kvtune solve: {Path(spec.path).name}", "",
             f"kvtune {r.kvtune_version}, {r.objective}, target {r.target_rate_req_s:g} req/s, sampler {r.sampler}, "
             f"seed {r.seed}, {r.trials.completed} trials ({r.trials.feasible} feasible).",
             f"Efficiency: {r.source}.", ""]
    rec, p, c, b, launch = r.recommendation, r.predicted, r.cost, r.bottleneck, r.launch
    if r.status != "ok" or rec is None or p is None or c is None or b is None or launch is None \
            or r.headroom is None:
        lines += ["## Infeasible", "", r.reason or "", ""]
        if r.closest is not None:
            cfg = r.closest.config
            lines += [f"Closest miss: {cfg if cfg else 'none fits in memory'}: {r.closest.miss}", ""]
        lines += _context_lines(r)
        (d / "report.md").write_text("\n".join(lines))
        return
    ctx = pick_context(r, spec, calibration, engine, profile)
    _frontier(ctx, r, d / "frontier.png")
    _pareto(r, spec, d / "pareto.png")
    _latency(ctx, r, latency_sample(ctx, r), d / "latency.png")
    x, y, n = operating_point(r)
    lines += _recommendation_lines(r) + _context_lines(r) + [
        "## Plots", "",
        f"Interactivity against throughput of one {'decode ' if isinstance(rec, DisaggregatedRecommendation) else ''}"
        f"replica: the analytic decode step as the batch grows, and where the deployment runs at its load "
        f"(simulated: {x:,.0f} output tok/s, {y:.0f} tok/s per user).", "", "![frontier](frontier.png)", "",
        "Cost against goodput of every deployment the simulator sized, the front through them and the pick.", "",
        "![pareto](pareto.png)", "",
        f"TTFT and TPOT distributions of the pick, simulated at {p.load_per_replica_req_s:.2f} req/s "
        f"{load_basis(r)}, against the SLOs.", "", "![latency](latency.png)", "",
        *_launch_lines(launch)]
    (d / "report.md").write_text("\n".join(lines))


def write_report(result: SolveResult, spec: WorkloadSpec, out_dir: str, calibration: str | None = None,
                 engine: str | None = None, profile: str | None = None) -> str:
    """Write report.md and the plots into ``out_dir`` (created if missing); returns the md path.
    ``calibration``/``engine``/``profile``: the solve's overrides (``--calibration`` etc.), so the
    plots use the step model the solve used.

    Whole or not at all: the files are drawn in a staging folder beside ``out_dir`` and moved in
    only once every one is written, so a failure leaves no partial report behind."""
    d = Path(out_dir)
    if d.exists() and not d.is_dir():
        raise InputError(f"--report {out_dir}: exists and is not a folder")
    d.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{d.name}.", dir=d.parent))
    try:
        _write_files(result, spec, stage, calibration, engine, profile)
        d.mkdir(exist_ok=True)
        for f in sorted(stage.iterdir()):
            os.replace(f, d / f.name)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return str(d / "report.md")
