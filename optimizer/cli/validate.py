"""``kvtune validate``: hold kvtune against measured tables, row by row."""

from __future__ import annotations

import click

from kvtune.costmodel.errors import InputError

from ._common import Choice, EngineChoice, echo_table, emit_json, json_option


@click.command("validate")
@click.argument("tables", nargs=-1, required=True)
@click.option("--calibration", default=None,
              help="Calibration file or shipped name (default: the shipped one for each row's GPU and engine; "
                   "ideal where kvtune ships none).")
@click.option("--engine", type=EngineChoice(), default=None,
              help="Only this engine's rows (rows that name no engine count), with its calibration.")
@click.option("--gpu", default=None,
              help="Catalog GPU name or hardware YAML file for every row (default: each row's gpu column).")
@click.option("--mode", type=Choice(["calibrated", "ideal"]), default="calibrated", show_default=True)
@click.option("--worst", type=click.IntRange(0), default=10, show_default=True, help="How many of the worst rows to list.")
@click.option("--all-rows", is_flag=True, help="Print every row's figures (default: only the summary and the worst).")
@json_option()
def validate_cmd(tables, calibration, engine, gpu, mode, worst, all_rows, as_json):
    """Predict every row of measured TABLES with the current model: measured vs predicted, per-metric
    MAPE and bias, the worst rows."""
    from kvtune.costmodel.hardware import resolve_gpu
    from kvtune.optimizer.calibrate import load_tables
    from kvtune.optimizer.validate import validate_rows, validation_dict

    if calibration is not None and mode == "ideal":
        raise InputError("validate: give --calibration or --mode ideal, not both")
    g = resolve_gpu(gpu) if gpu else None
    rows, inputs = load_tables(tables)
    v = validate_rows(rows, g, calibration, engine, mode)
    d = validation_dict(v, [dict(i) for i in inputs], worst)
    if emit_json(as_json, d):
        return
    for grp in d["groups"]:
        click.echo(f"{grp['gpu']} engine {grp['engine']}: {grp['rows']} rows  [{grp['calibration']}]")
    if all_rows:
        echo_table(["id", "metric", "measured", "predicted", "err_%"],
                   [[p["id"][-44:], p["metric"], f"{p['measured']:.4g}", f"{p['predicted']:.4g}",
                     f"{p['err_pct']:+.1f}"] for p in d["points"]])
    click.echo("per metric     points   MAPE %   bias %   median |err| %   max |err| %")
    for m, s in d["summary"].items():
        click.echo(f"  {m:<12} {s['points']:>7} {s['mape_pct']:>8.1f} {s['bias_pct']:>+8.1f} "
                   f"{s['median_abs_err_pct']:>16.1f} {s['max_abs_err_pct']:>13.1f}")
    if len(d["groups"]) > 1:
        for grp in d["groups"]:
            click.echo(f"  {grp['engine']}: " + ", ".join(f"{m} MAPE {s['mape_pct']:.1f}% bias {s['bias_pct']:+.1f}%"
                                                          for m, s in grp["summary"].items()))
    if worst:
        click.echo(f"worst {len(d['worst'])} rows:")
        echo_table(["id", "metric", "measured", "predicted", "err_%"],
                   [[p["id"][-44:], p["metric"], f"{p['measured']:.4g}", f"{p['predicted']:.4g}",
                     f"{p['err_pct']:+.1f}"] for p in d["worst"]])
    if d["open_loop"]:
        click.echo(f"open-loop rows ({len(d['open_loop'])}): measured vs predicted, the run's own arrivals replayed")
        echo_table(["id", "rate_req_s", "loadavg_1m", "attainment [95% CI]", "predicted", "ttft p50/p90 ms",
                    "predicted", "tpot p50/p90 ms", "predicted"],
                   [_open_loop_line(c) for c in d["open_loop"]])
    if d["skipped"]:
        click.echo(f"{len(d['skipped'])} rows not predicted: " + "; ".join(d["skipped"][:3])
                   + (" ..." if len(d["skipped"]) > 3 else ""))


def _open_loop_line(c: dict) -> list[str]:
    a, f = c["attainment"], c["figures"]

    def pair(metric: str, which: str) -> str:
        vals = [f.get(f"{metric}_{q}_ms", {}).get(which) for q in ("p50", "p90")]
        return "/".join("-" if v is None else f"{v:.4g}" for v in vals)

    att = "-" if a["measured"] is None else f"{a['measured']:.3f} [{a['lo']:.3f}, {a['hi']:.3f}]"
    pred = "-" if a["predicted"] is None else f"{a['predicted']:.3f}" + ("" if a["inside"] else " (outside)")
    load = "-" if c["loadavg_1m"] is None else f"{c['loadavg_1m']:.2f}"
    return [c["id"][-36:], f"{c['rate_req_s']:g}", load, att, pred, pair("ttft", "measured"), pair("ttft", "predicted"),
            pair("tpot", "measured"), pair("tpot", "predicted")]


COMMANDS = [validate_cmd]
