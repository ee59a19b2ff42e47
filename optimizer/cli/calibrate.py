"""``kvtune calibrate``: fit the cost model's efficiencies to measured profile tables."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import click

from kvtune.costmodel.errors import InputError
from kvtune.costmodel.closed_loop import STAGGERED_ENGINES
from kvtune.costmodel.fit import CV_KINDS, FIT_METRICS, RowPredictor, held_out_mape
from kvtune.optimizer.calibrate_held_out import IF_WORSE
from kvtune.costmodel.profile_table import contradictions

from ._common import STDOUT, Choice, EngineChoice, check_json_dest, check_output_path, echo_table, emit_json, json_option, save_or_show


@click.command("calibrate")
@click.argument("tables", nargs=-1, required=True)
@click.option("--gpu", default="h100-sxm", show_default=True,
              help="Catalog GPU name, or a hardware YAML file (see profiles/hardware-cpu-example.yaml).")
@click.option("--engine", type=EngineChoice(), default=None,
              help="Use only this engine's rows (rows that name no engine count).")
@click.option("--base", default="ideal", show_default=True,
              help="Start (and value of unfitted parameters): ideal, calibrated (the shipped one) or a calibration file.")
@click.option("--params", default=None,
              help="Comma-separated parameters to fit (default: every one the rows can see).")
@click.option("--fit-metrics", default=None,
              help="Comma-separated figures the objective uses (step_ms,ttft_ms,tpot_ms,output_tok_s, and open-loop rows' "
                   "ttft_p50_ms,ttft_p90_ms,tpot_p50_ms,tpot_p90_ms; default: the first four).")
@click.option("--chunk-tokens", type=int, default=8192, show_default=True,
              help="Engine prefill token budget used when simulating request rows.")
@click.option("--clients", type=Choice(["auto", "burst", "staggered"]), default="auto", show_default=True,
              help="How closed-loop rows' clients are simulated: auto = each row's engine's rule (staggered for "
                   "vLLM and TensorRT-LLM, whose mixed steps let a burst drift apart; burst for SGLang and llama.cpp, "
                   "whose runs stay in lock-step; see costmodel/closed_loop.py), or one rule for every row.")
@click.option("--max-nfev", type=int, default=60, show_default=True, help="Most model evaluations of the solver.")
@click.option("-o", "--output", required=True, help="Calibration YAML to write (e.g. profiles/calibrations/NAME.yaml); "
              "- for stdout (the text then goes to stderr; give --name).")
@click.option("--name", default=None, help="Calibration name (default: the output file's stem).")
@json_option()
@click.option("--cv", "cv", type=Choice(list(CV_KINDS)), default="auto", show_default=True,
              help="Cross-validation the fit reports: auto = leave one concurrency out when the rows hold several, "
                   "else one length, else one TP, else one row; none = in-sample only.")
@click.option("--holdout", "holdout", multiple=True, metavar="TABLE",
              help="Profile table whose rows are predicted, never fitted (e.g. a sweep's high concurrencies), by the "
                   "prior and the fit; repeatable.")
@click.option("--if-worse", "if_worse", type=Choice(list(IF_WORSE)), default="hold", show_default=True,
              help="When the fit predicts held-out rows worse than the prior on a metric: hold = refit with the terms "
                   "that metric is most sensitive to held at the prior, and write the prior's parameters if that is "
                   "still worse; prior = write the prior's parameters; keep = write the fit. The output names the "
                   "metric and the rows.")
def calibrate_cmd(tables, gpu, engine, base, params, fit_metrics, chunk_tokens, clients, max_nfev, output, name, as_json,
                  cv, holdout, if_worse):
    """Fit bandwidth/FLOP efficiencies, step overhead and all-reduce cost to TABLES, and report the
    fit's cross-validated error beside the base calibration's (the prior) on the same held-out rows."""
    from kvtune.costmodel.hardware import resolve_gpu
    from kvtune.optimizer.loadgen import drift
    from kvtune.optimizer.calibrate import (base_path, calibration_dict, calibration_yaml, load_tables, resolve_base,
                                     select_rows)
    from kvtune.optimizer.calibrate_held_out import calibrate_checked, prior_for

    out = Path(output)
    to_stdout = output == STDOUT   # the YAML alone on stdout, the human text on stderr
    if to_stdout:
        if as_json == STDOUT:
            raise InputError("-o - and --json -: both cannot take stdout; give one of them a file")
        if not name:
            raise InputError("-o -: give --name (a calibration is named after its file's stem by default)")
    else:
        if not out.parent.exists():
            raise InputError(f"-o {output}: folder {out.parent} does not exist")
        check_output_path(out, "-o")
    check_json_dest(as_json)
    names = [p.strip() for p in params.split(",") if p.strip()] if params else None
    if params is not None and not names:
        raise InputError("--params: empty list")
    if chunk_tokens < 1:
        raise InputError(f"--chunk-tokens must be >= 1, got {chunk_tokens}")
    if max_nfev < 1:
        raise InputError(f"--max-nfev must be >= 1 (model evaluations the solver may make), got {max_nfev}")
    g = resolve_gpu(gpu)
    rows, inputs = load_tables(tables)
    rows, notes = select_rows(rows, g, engine)
    eff0 = resolve_base(base, g, engine)
    prior = prior_for(base_path(base, g, engine), eff0)
    held_rows, _ = load_tables(holdout) if holdout else ([], [])
    if held_rows:
        held_rows, _ = select_rows(held_rows, g, engine)
    warnings = contradictions(rows)
    warnings += [w for w in drift(rows) if not _said(w, warnings)]
    name = name or out.stem
    t0 = time.perf_counter()
    metrics = [m.strip() for m in fit_metrics.split(",") if m.strip()] if fit_metrics else None
    predict = RowPredictor(g, chunk_tokens=chunk_tokens, stagger=STAGGERED_ENGINES if clients == "auto" else clients == "staggered")
    checked = calibrate_checked(rows, g, eff0, prior, names, predict, max_nfev=max_nfev, name=name, metrics=metrics,
                                cv=cv, if_worse=if_worse, holdout=held_rows)
    res = checked.result
    wall = time.perf_counter() - t0
    warnings += worse_than_start(res, metrics) + list(checked.warnings)
    notes = list(notes) + list(checked.notes)
    extra = {"held_out": checked.to_json_summary(), **({"warnings": warnings} if warnings else {})}
    d = calibration_dict(res, name, g, engine, inputs, base, notes, wall_s=wall, extra=extra,
                         cross_validation=checked.fold_records())
    if to_stdout:
        click.echo(calibration_yaml(d), nl=False)
    else:
        save_or_show(out, calibration_yaml(d), "-o")
    if as_json:
        dj = dict(d, output=str(out),
                 points_detail=[{"id": p.id, "metric": p.metric, "measured": p.measured, "before": p.before,
                                 "after": p.after, "err_before_pct": p.err_before * 100,
                                 "err_after_pct": p.err_after * 100} for p in res.points],
                  held_out_points=[_point_json(p, f.held_out) for f in checked.all_folds() for p in f.points])
        if emit_json(as_json, dj):
            for w in warnings:
                click.echo(f"warning: {w}", err=True)
            return
    text_out = sys.stderr if to_stdout else None   # the human text: stderr when the YAML took stdout

    def say(line: str) -> None:
        click.echo(line, err=to_stdout)

    say(f"calibrate {g.name}{' engine ' + engine if engine else ''}: {len(res.points)} measured figures "
        f"from {len(rows)} rows, base {base}, {res.nfev} model evaluations, {wall:.1f} s")
    say(f"prior: {prior.source if prior else 'none (base ideal: not regularised)'}")
    echo_held_out(checked, to_stdout)
    say("in-sample (the rows the fit saw; before = base, after = fit):")
    echo_table(["id", "metric", "measured", "before", "err_before_%", "after", "err_after_%"],
               [[p.id[-40:], p.metric, f"{p.measured:.4g}", f"{p.before:.4g}", f"{p.err_before * 100:+.1f}",
                 f"{p.after:.4g}", f"{p.err_after * 100:+.1f}"] for p in res.points], out=text_out)
    say("in-sample MAPE %   before   after")
    for m, v in d["fit"]["mape_before_pct"].items():
        say(f"  {m:<17}{v:>7.1f} {d['fit']['mape_after_pct'][m]:>7.1f}")
    for t in checked.tried:
        if "mape_pct" in t:
            say(f"candidate '{t['choice']}' (fitted {', '.join(t['fitted']) or 'nothing'}): cross-validated MAPE "
                + ", ".join(f"{m} {v:.1f}%" for m, v in t["mape_pct"].items()))
    say(f"written: {checked.choice}")
    say("parameters (one sigma; '-' = kept at base):")
    for k, v in d["params"].items():
        s = d["uncertainty"][k]
        say(f"  {k:<26}{v:>12.5g}  {'+- %.2g' % s if k in res.fitted else '-'}")
    for n in d["fit"]["notes"]:
        say(f"  note: {n}")
    for w in warnings:
        say(f"  warning: {w}")
    say(f"wrote {'the calibration to stdout' if to_stdout else out}"
        + (f" ({len(warnings)} warnings, recorded under fit.warnings)" if warnings else ""))


def _point_json(p, fold: str) -> dict:
    return {"fold": fold, "id": p.id, "metric": p.metric, "measured": p.measured, "prior": p.before, "fit": p.after,
            "err_prior_pct": p.err_before * 100, "err_fit_pct": p.err_after * 100}


def echo_held_out(checked, err: bool = False) -> None:
    """The held-out tables: cross-validated MAPE per metric, the fit's beside the prior's, and the
    rows given apart (--holdout) one by one, with what was extrapolated."""
    ho = checked.held_out
    out = sys.stderr if err else None

    def say(line: str) -> None:
        click.echo(line, err=err)

    if ho is not None:
        a, b = ho.mape(True), ho.mape(False)
        worse = set(ho.worse())
        say(f"held-out error ({ho.label}, {len(ho.folds)} folds; each fold fitted on the other rows):")
        echo_table(["metric", "fit_MAPE_%", "prior_MAPE_%", ""],
                   [[m, f"{a[m]:.1f}", f"{b[m]:.1f}", "WORSE than the prior" if m in worse else ""] for m in a], out=out)
        for f in ho.folds:
            for x in f.extrapolation:
                say(f"  extrapolated in fold {f.held_out}: {x}")
    if checked.holdout is not None:
        h = checked.holdout
        say(f"given held-out rows (--holdout, {len(h.points)} figures, never fitted):")
        echo_table(["id", "metric", "measured", "prior", "err_prior_%", "fit", "err_fit_%"],
                   [[p.id[-40:], p.metric, f"{p.measured:.4g}", f"{p.before:.4g}", f"{p.err_before * 100:+.1f}",
                     f"{p.after:.4g}", f"{p.err_after * 100:+.1f}"] for p in h.points], out=out)
        a, b = held_out_mape(h.points, True), held_out_mape(h.points, False)
        say("  held-out MAPE %   prior     fit")
        for m in a:
            say(f"    {m:<16}{b[m]:>7.1f} {a[m]:>7.1f}")
        for x in h.extrapolation:
            say(f"  {x}")


def _said(drift_line: str, lines: list[str]) -> bool:
    """A drift line whose pair of rows a contradiction line already names."""
    ids = drift_line.split("rows ", 1)[1].split(" measure ", 1)[0]
    a, b = (x.split(" (", 1)[0] for x in ids.split(") and ", 1))
    return any(f"rows {a} and {b}" in w or f"rows {b} and {a}" in w for w in lines)


def worse_than_start(res, metrics) -> list[str]:
    """Warnings where the fit ends worse than it started: over all fitted figures, and per metric
    the objective used (a metric left out of ``--fit-metrics`` may move either way)."""
    out = []
    metrics = metrics or FIT_METRICS
    pts = [p for p in res.points if p.metric in metrics]
    if pts:
        before = sum(abs(p.err_before) for p in pts) / len(pts) * 100
        after = sum(abs(p.err_after) for p in pts) / len(pts) * 100
        if after > before:
            out.append(f"the fit is worse than its start: MAPE {before:.1f}% before, {after:.1f}% after, over "
                       f"{len(pts)} figures; the rows may contradict each other or the model may not describe them")
    after_m, before_m = res.mape_by_metric(True), res.mape_by_metric(False)
    for m, a in after_m.items():
        if m in metrics and a > before_m[m] * 1.0001 and len(after_m) > 1:
            out.append(f"{m}: MAPE {before_m[m]:.1f}% before, {a:.1f}% after (worse than the start)")
    return out


COMMANDS = [calibrate_cmd]
