"""What ``kvtune tune`` prints and writes: the per-round table, the closing summary, and the report
page (``report.md``) with predicted-vs-measured plots (matplotlib, Agg backend).

Every figure names its evidence: ``measured`` (the live engine, with the machine's load),
``simulated`` (the simulator under the round's calibration, on the very requests of the run).
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

from .tune_records import JobRecord, RunRecord, TuneResult, config_id
import importlib.util

__all__ = ["round_table", "summary_lines", "write_report"]

# the plots need matplotlib, the report extra (optimizer/report.py REPORT_EXTRA for solve --report); tune
# writes report.md without them and its summary says so (its runs, not the plots, are what it was asked for)
NO_PLOTS = "no plots: matplotlib is not installed: pip install 'kvtune[report]'"


def _can_plot() -> bool:
    return importlib.util.find_spec("matplotlib") is not None


def _f(x: Any, fmt: str = ".3f") -> str:
    return "-" if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, fmt)


def _pct(d: dict | None, metric: str, p: str) -> Any:
    v = ((d or {}).get(metric) or {}).get(p)
    return None if v is None else float(v)


def _open_runs(result: TuneResult) -> list[tuple[JobRecord, RunRecord]]:
    return [(j, r) for j in result.jobs for r in j.runs if r.kind == "open"]


def round_table(result: TuneResult) -> list[str]:
    """A markdown table: one line per open-loop run, predicted beside measured."""
    head = ("| round | config | role | rate req/s (x promise) | attainment predicted (simulated) | "
            "attainment measured [95% CI] (measured) | TTFT p50/p90 ms simulated | TTFT p50/p90 ms measured | "
            "TPOT p50/p90 ms simulated | TPOT p50/p90 ms measured | goodput at rate req/s (measured) | loadavg 1m |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for j, r0 in _open_runs(result):
        # latencies: the simulator on the very requests sent (their send times), the measured set
        r = dataclasses.replace(r0, predicted=r0.replayed) if r0.replayed else r0
        lines.append(
            f"| {j.round} | {config_id(j.config)} | {j.role} | {_f(r.rate_req_s, '.3g')} ({_f(r.multiplier, 'g')}x) | "
            f"{_f(r.predicted_attainment)} | {_measured_attainment(r)} | "
            f"{_f(_pct(r.predicted, 'ttft_ms', 'p50'), '.0f')}/{_f(_pct(r.predicted, 'ttft_ms', 'p90'), '.0f')} | "
            f"{_f(_pct(r.measured, 'ttft_ms', 'p50'), '.0f')}/{_f(_pct(r.measured, 'ttft_ms', 'p90'), '.0f')} | "
            f"{_f(_pct(r.predicted, 'tpot_ms', 'p50'), '.1f')}/{_f(_pct(r.predicted, 'tpot_ms', 'p90'), '.1f')} | "
            f"{_f(_pct(r.measured, 'tpot_ms', 'p50'), '.1f')}/{_f(_pct(r.measured, 'tpot_ms', 'p90'), '.1f')} | "
            f"{_f(r.goodput_at_rate_req_s, '.3g')} | {_f(r.loadavg_1m, '.2f')} |")
    return lines


def _measured_attainment(r) -> str:
    """The interval of a whole run; for a run stopped early, the bound its misses proved."""
    a = r.attainment or {}
    if r.stopped:
        st = r.stopped
        return (f"at most {_f(st['attainment_at_most'])}: {st['misses']} of {st['counted_planned']} missed, "
                f"stopped after {st['sent']} of {st['planned']} sent")
    return f"{_f(a.get('value'))} [{_f(a.get('lo'))}, {_f(a.get('hi'))}] n={a.get('n', '-')}"


# The summary's words for TuneResult.status (the JSON keeps the status key itself).
_STATUS_WORDS = {"converged": "converged", "rounds": "stopped at the round limit", "budget": "stopped, budget spent",
                 "unmeasurable": "stopped, unmeasurable", "infeasible": "stopped, infeasible"}


def summary_lines(result: TuneResult, out_dir: str) -> list[str]:
    r = result
    lines = [f"kvtune tune {r.workload}: {_STATUS_WORDS.get(r.status, r.status)} after {len(r.rounds)} round(s), "
             f"{r.runs} runs, {r.engine_s:.0f} s of engine time ({r.engine or 'engine'})", f"  {r.reason}"]
    if r.pick is not None:
        a1, ac = r.attainment_at_promise or {}, r.attainment_at_check or {}
        lines.append(f"Pick ({r.evidence}): {config_id(r.pick)}, {_f(r.promise_req_s, '.3g')} req/s per replica"
                     + (", the steady state" if r.promise == "steady" else ", for a run of --run-s from an empty queue"))
        if a1 and a1.get("stopped"):
            st = a1["stopped"]
            lines.append(f"  at {_f(r.promise_req_s, '.3g')} req/s: SLO attainment at most "
                         f"{_f(st['attainment_at_most'])} ({st['misses']} of {st['counted_planned']} counted requests "
                         f"missed before the end) >= target {r.target_attainment:g}: no (measured)")
        elif a1:
            lines.append(f"  at {_f(r.promise_req_s, '.3g')} req/s: SLO attainment {_f(a1.get('value'))} "
                         f"[{_f(a1.get('lo'))}, {_f(a1.get('hi'))}] ({a1.get('confidence', 0.95):.0%} {a1.get('method', '')}, "
                         f"n={a1.get('n')}, {a1.get('warmup_excluded', 0)} warm-up excluded) >= target "
                         f"{r.target_attainment:g}: {'yes' if a1.get('value', 0) >= r.target_attainment else 'no'} (measured)")
        if ac:
            kept = bool(a1) and a1.get("value", 0) >= r.target_attainment
            misses = ac.get("value", 1) < r.target_attainment
            st = ac.get("stopped")
            seen = (f"at most {_f(st['attainment_at_most'])} ({st['misses']} of {st['counted_planned']} counted "
                    f"requests missed before the end; stopped after {st['sent']} of {st['planned']} sent)" if st
                    else f"{_f(ac.get('value'))} [{_f(ac.get('lo'))}, {_f(ac.get('hi'))}]")
            lines.append(f"  at {r.check_multiplier:g}x: SLO attainment {seen}: "
                         f"{'misses' if misses else 'still meets'} (measured)"
                         + ((": the promise is tight" if misses else ": the promise is not tight") if kept else ""))
        if r.launch_line:
            lines.append("  launch line measured, exactly:")
            lines += ["    " + ln for ln in r.launch_line.splitlines()]
    for d in r.drift:
        lines.append(f"  {d}")
    for n in r.notes:
        lines.append(f"  note: {n}")
    lines.append(f"  wrote {out_dir}/: tune.json, report.md ({'plots' if _can_plot() else NO_PLOTS}), "
                 f"measured.csv + requests/, "
                 + (f"{r.calibration_file} (fitted to this session's runs)" if r.calibration_file else "no calibration"))
    return lines


def _plots(result: TuneResult, out: Path) -> list[str]:
    if not _can_plot():   # the report extra is not installed: report.md without plots, and a line saying so
        return []
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = _open_runs(result)
    if not runs:
        return []
    names = []
    fig, ax = plt.subplots(figsize=(5.5, 5))
    for rnd in sorted({j.round for j, _ in runs}):
        pts = [(float(r.predicted_attainment), r.attainment) for j, r in runs
               if j.round == rnd and r.attainment and r.predicted_attainment is not None and not r.stopped]
        cut = [(float(r.predicted_attainment), float(r.stopped["attainment_at_most"])) for j, r in runs
               if j.round == rnd and r.stopped and r.predicted_attainment is not None]
        if cut:   # stopped early: the bound its misses proved, drawn as an upper limit
            ax.plot([p for p, _ in cut], [b for _, b in cut], "v", label=f"round {rnd}, stopped (at most)")
        ax.errorbar([p for p, _ in pts], [a["value"] for _, a in pts],
                    yerr=[[a["value"] - a["lo"] for _, a in pts], [a["hi"] - a["value"] for _, a in pts]],
                    fmt="o", capsize=3, label=f"round {rnd}")
    ax.plot([0, 1], [0, 1], "k:", lw=1)
    ax.axhline(result.target_attainment, color="r", lw=0.8, ls="--", label="target")
    ax.set_xlabel("SLO attainment predicted (simulated)")
    ax.set_ylabel("SLO attainment measured, 95% CI (measured)")
    ax.set_title("predicted vs measured, every open-loop run")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "attainment.png", dpi=110)
    plt.close(fig)
    names.append("attainment.png")

    fig, axes = plt.subplots(1, 2, figsize=(10, 4.5))
    for ax, metric, label in ((axes[0], "ttft_ms", "TTFT"), (axes[1], "tpot_ms", "TPOT")):
        for p, mk in (("p50", "o"), ("p90", "s")):
            xs = [_pct(r.predicted, metric, p) for _, r in runs]
            ys = [_pct(r.measured, metric, p) for _, r in runs]
            keep = [(x, y) for x, y in zip(xs, ys) if x and y]
            ax.scatter([x for x, _ in keep], [y for _, y in keep], marker=mk, label=p)
        lim = [v for _, r in runs for v in (_pct(r.predicted, metric, "p90"), _pct(r.measured, metric, "p90")) if v]
        if lim:
            ax.plot([min(lim) * 0.8, max(lim) * 1.2], [min(lim) * 0.8, max(lim) * 1.2], "k:", lw=1)
            ax.set_xscale("log")
            ax.set_yscale("log")
        ax.set_xlabel(f"{label} predicted, ms (simulated)")
        ax.set_ylabel(f"{label} measured, ms (measured)")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "latency.png", dpi=110)
    plt.close(fig)
    names.append("latency.png")

    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for cfg in sorted({config_id(j.config) for j, _ in runs}):
        rates = sorted((float(r.rate_req_s), float(r.stopped["attainment_at_most"] if r.stopped
                                                   else r.attainment["value"]), float(r.predicted_attainment))
                       for j, r in runs if config_id(j.config) == cfg and r.attainment and r.rate_req_s
                       and r.predicted_attainment is not None)
        line, = ax.plot([p[0] for p in rates], [p[1] for p in rates], "o-", label=f"{cfg} measured")
        ax.plot([p[0] for p in rates], [p[2] for p in rates], "x--", color=line.get_color(), label=f"{cfg} simulated")
    ax.axhline(result.target_attainment, color="r", lw=0.8, ls="--")
    ax.set_xlabel("rate per replica, req/s")
    ax.set_ylabel("SLO attainment")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "rates.png", dpi=110)
    plt.close(fig)
    names.append("rates.png")
    return names


def write_report(result: TuneResult, out: Path, shown: str | None = None) -> Path:
    """``report.md`` and its plots in ``out`` (named ``shown`` on the page: the folder it is moved to)."""
    plots = _plots(result, out)
    lines = ["# kvtune tune", "", *summary_lines(result, shown or str(out)), "", "## Rounds", ""]
    for rnd in result.rounds:
        lines.append(f"- round {rnd.round}: calibration {rnd.calibration}; pick {config_id(rnd.pick)} promised "
                     f"{rnd.promise_req_s:.3g} req/s per replica (simulated); kept: {rnd.meets}; tight: {rnd.tight}"
                     + (f"; refit: MAPE {rnd.fit.get('mape_before_pct')} -> {rnd.fit.get('mape_after_pct')} on "
                        f"{rnd.fit.get('rows')} rows" if rnd.fit else ""))
    lines += ["", "## Every open-loop run", "", *round_table(result), ""]
    lines += ["## Engine starts", ""]
    for j in result.jobs:
        lines.append(f"- {j.key} ({j.role}, {j.host}, {j.engine_s:.0f} s of engine time, {len(j.runs)} runs"
                     + (f", {j.status}: {j.error}" if j.status != "done" else "") + ")")
        if j.launch_line:
            lines += ["", "```", j.launch_line, "```", ""]
    for p in plots:
        lines += ["", f"![{p}]({p})"]
    page = out / "report.md"
    page.write_text("\n".join(lines) + "\n")
    return page
