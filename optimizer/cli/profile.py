"""``kvtune profile``: measured tables in. ``import`` reads benchmark outputs; ``run`` measures a
live OpenAI-compatible server. Both write the profile table format (profiles/README.md)."""

from __future__ import annotations

import dataclasses
import shlex
import sys
from pathlib import Path

import click

from kvtune.costmodel.errors import InputError
from kvtune.costmodel.profile_table import ProfileRow, read_table
from kvtune.optimizer.aiperf_records import FORMAT as RECORDS_FORMAT
from kvtune.optimizer.importers import FORMATS, Metadata, import_files, rows_to_csv

from ._common import Choice, check_output_path, echo_table, endpoint_options, parse_int_list, save_or_show, write_atomic


def _meta_options(f):
    for opt in reversed([
        click.option("--model", "model", default=None, help="Model name (fills what the file lacks)."),
        click.option("--gpu", default=None, help="GPU or machine label, e.g. h100-sxm or cpu-2core."),
        click.option("--tp", type=int, default=None, help="Tensor-parallel size."),
        click.option("--engine", default=None, help="Serving engine, e.g. vllm, sglang, llama.cpp."),
        click.option("--engine-version", default=None),
        click.option("--weight-dtype", default=None, help="Weight format, e.g. bf16, fp8, q4_1."),
        click.option("--kv-dtype", default=None, help="KV-cache format, e.g. bf16, fp8."),
        click.option("--source", default=None, help="Where the numbers come from (default: the tool and file)."),
    ]):
        f = opt(f)
    return f


def _summary(rows: list[ProfileRow]) -> None:
    def f(v, fmt="{:.1f}"):
        return "" if v is None else fmt.format(v)
    echo_table(["concurrency", "rate_req_s", "isl", "osl", "n", "ttft_mean_ms", "ttft_p99_ms", "tpot_mean_ms",
                "tpot_p99_ms", "output_tok_s"],
               [[f(r.concurrency, "{}"), f(r.rate_req_s, "{:g}"), r.input_tokens, r.output_tokens,
                 f(r.num_requests, "{}"), f(r.ttft_mean_ms), f(r.ttft_p99_ms), f(r.tpot_mean_ms, "{:.2f}"),
                 f(r.tpot_p99_ms, "{:.2f}"), f(r.output_tok_s)] for r in rows], out=sys.stderr)


def _unknown_note(rows: list[ProfileRow], given: Metadata) -> None:
    missing = [k for k in ("gpu", "model", "engine") if not all(getattr(r, k) for r in rows)]
    defaults = [k for k in ("weight_dtype", "kv_dtype", "tp") if getattr(given, k) is None]
    if missing:
        click.echo(f"note: {', '.join(missing)} not known for some rows (pass --{missing[0].replace('_', '-')})",
                   err=True)
    if defaults:
        click.echo(f"note: {', '.join(defaults)} not stated; the table format's defaults apply "
                   "(bf16, bf16, tp 1)", err=True)


def _engine_options(f):
    """What ``profile run`` and ``profile open-loop`` share: the table to extend and what the
    server does not say about itself."""
    for opt in reversed([
        click.option("--append", is_flag=True, help="Keep the rows already in OUTPUT and add these."),
        click.option("--gpu", default=None, help="GPU or machine label, e.g. h100-sxm or cpu-2core."),
        click.option("--tp", type=int, default=None),
        click.option("--engine", default=None, help="Default: what the server reports (llama.cpp, vllm, sglang)."),
        click.option("--engine-version", default=None),
        click.option("--weight-dtype", default=None),
        click.option("--kv-dtype", default=None),
        click.option("--chunk-tokens", type=int, default=None,
                     help="The engine's per-step token budget, written to every row when the server does not "
                          "report it (llama.cpp: its -b, 2048 by default; vLLM: --max-num-batched-tokens)."),
        click.option("--threads", type=int, default=None,
                     help="The engine's CPU threads (llama.cpp -t), written to every row's threads column (servers "
                          "do not report it)."),
    ]):
        f = opt(f)
    return f


def _run_metadata(cmd: list[str], **given) -> Metadata:
    """The rows' metadata; their source is the command that reproduces them (rebuilt from the
    options, so it reads the same however kvtune was invoked)."""
    for key, v in given.items():
        if v is not None:
            cmd = [*cmd, "--" + key.replace("_", "-"), str(v)]
    return Metadata(**{k: given[k] for k in ("gpu", "tp", "engine", "engine_version", "weight_dtype", "kv_dtype")},
                    source=shlex.join(cmd))


@click.group("profile")
def profile_group():
    """Measured profile tables: import benchmark outputs or measure a live server."""


@profile_group.command("import")
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False, path_type=Path))
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="Profile table to write (CSV); an AIPerf per-request export's log goes beside it.")
@click.option("--format", "fmt", type=Choice((*FORMATS, RECORDS_FORMAT)), default=None,
              help="Input format (default: detected from content).")
@click.option("--concurrency", type=int, default=None,
              help="The load of a trtllm-bench --report_json run, which the report does not record: the value given "
                   "to trtllm-bench --concurrency (<= 0: no limit, every request at once; the default, as "
                   "trtllm-bench throughput's).")
@click.option("--plan", "plan_path", default=None, type=click.Path(dir_okay=False, path_type=Path),
              help="The plan an AIPerf per-request export (profile_export.jsonl) replayed (kvtune solve/tune --plan): "
                   "each request gets its planned lengths, prefix, SLO and warm-up, and the simulator's figures on "
                   "the plan are printed beside the measured ones.")
@_meta_options
def import_cmd(files: tuple[Path, ...], output: Path, fmt: str | None, model: str | None, gpu: str | None,
               tp: int | None, engine: str | None, engine_version: str | None, weight_dtype: str | None,
               kv_dtype: str | None, source: str | None, plan_path: Path | None = None,
               concurrency: int | None = None) -> None:
    """Convert vLLM, SGLang, genai-perf, AIPerf, LLMPerf, GuideLLM, trtllm-bench or inference-perf
    results to one profile table.

    Values in a file win; the flags fill what a file does not record. A bad file stops the whole
    import and nothing is written. An AIPerf per-request export (profile_export.jsonl) becomes an
    open-loop row with its per-request log, as kvtune profile open-loop writes.
    """
    from kvtune.optimizer.aiperf_records import is_profile_export

    meta = Metadata(model=model, gpu=gpu, tp=tp, engine=engine, engine_version=engine_version,
                    weight_dtype=weight_dtype, kv_dtype=kv_dtype, source=source)
    check_output_path(output, "-o")
    per_request = [f for f in files if fmt == RECORDS_FORMAT or (fmt is None and is_profile_export(f))]
    summaries = [f for f in files if f not in per_request]
    if plan_path is not None and not per_request:
        raise InputError(f"--plan {plan_path}: applies to AIPerf per-request exports (profile_export.jsonl); none "
                         f"among the files given")
    if concurrency is not None and per_request:
        raise InputError(f"--concurrency: applies to trtllm-bench reports, not to AIPerf per-request exports "
                         f"({per_request[0]})")
    rows = import_files(summaries, fmt, meta, concurrency) if summaries else []
    replayed = _PerRequest(per_request, plan_path, meta, model)
    rows += replayed.rows(output)
    if len({r.id for r in rows}) < len(rows):
        raise InputError("two inputs give the same row id (two files of one name?): import them one at a time")
    replayed.write_logs(output)
    write_atomic(output, rows_to_csv(rows))
    _summary(rows)
    replayed.echo()
    _unknown_note(rows, meta.fill(replayed.planned))
    click.echo(f"wrote {len(rows)} rows to {output}", err=True)


class _PerRequest:
    """``profile import``'s AIPerf per-request exports (``optimizer.aiperf_records``): each an open-loop
    run, matched to ``--plan`` when given; its row names its per-request log, written beside the
    table. The row's metadata: the flags, then the pick the plan was made for."""

    def __init__(self, paths: list[Path], plan_path: Path | None, meta: Metadata, model: str | None):
        from kvtune.optimizer.aiperf_records import read_profile_export
        from kvtune.optimizer.plan import read_plan

        self.read = read_plan(plan_path) if plan_path is not None and paths else None
        self.header = (self.read.header or {}) if self.read is not None else {}
        self.pick = self.header.get("pick") or {}
        p = self.pick
        planned = Metadata(model=p.get("model"), gpu=p.get("gpu"), tp=p.get("tp"), engine=p.get("engine"),
                           weight_dtype=p.get("weights"), kv_dtype=p.get("kv_dtype"))
        self.planned = planned
        plan = self.read.plan if self.read is not None else None
        self.runs = []
        for path in paths:
            how = f", replaying {plan_path.name}" if plan_path is not None else ""
            m = meta.fill(planned).fill(Metadata(source=f"aiperf per-request export: {path.name}{how}"))
            self.runs.append((path, read_profile_export(path, plan, model or p.get("model") or ""), m))

    def _side(self, output: Path, path: Path) -> str:
        return f"{output.stem}.{path.stem}.requests.csv"

    def rows(self, output: Path) -> list[ProfileRow]:
        out = []
        for path, run, m in self.runs:
            row = run.to_rows(m, self._side(output, path), row_id=f"{path.stem}:requests",
                              chunk_tokens=self.pick.get("chunk_tokens"))[0]
            cap = self.pick.get("batch_cap")
            out.append(dataclasses.replace(row, batch_cap=cap) if cap and row.batch_cap is None else row)
        return out

    def write_logs(self, output: Path) -> None:
        for path, run, _ in self.runs:
            run.write_requests(output.parent / self._side(output, path))

    def echo(self) -> None:
        pred = self.header.get("predicted")
        for _, run, _ in self.runs:
            _echo_open_loop(run)
            if pred:
                whole = self.header.get("requests")
                part = "" if len(run.sent) == whole else (f" (over all {whole} of the plan's requests; the export "
                                                          f"holds {len(run.sent)})")
                click.echo("  " + _predicted_line(pred) + part, err=True)


def _predicted_line(pred: dict) -> str:
    def q(key: str) -> str:
        d = pred.get(key) or {}
        return "/".join("-" if d.get(s) is None else f"{d[s]:.0f}" for s in ("p50", "p90", "p99"))
    att = pred.get("slo_attainment")
    return (f"predicted (simulated on the plan): attainment {'-' if att is None else f'{att:.3f}'}  TTFT p50/p90/p99 "
            f"{q('ttft_ms')} ms  TPOT {q('tpot_ms')} ms")


@profile_group.command("run")
@click.option("--url", required=True, help="OpenAI-compatible base URL, e.g. http://127.0.0.1:8080/v1.")
@click.option("--model", "model", required=True, help="Model name: sent as 'model' and written to the table.")
@click.option("--concurrency", default="1,4,16", show_default=True, metavar="INTEGER,...", help="Closed-loop client counts.")
@click.option("--isl", default="256,2048", show_default=True, metavar="INTEGER,...", help="Prompt lengths in tokens.")
@click.option("--osl", default="128", show_default=True, metavar="INTEGER,...", help="Output lengths in tokens (ignore_eos).")
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--requests-per-point", type=int, default=16, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed for the synthetic prompts.")
@click.option("--timeout-s", type=float, default=600.0, show_default=True, help="Per-request timeout.")
@click.option("--warmup", type=int, default=1, show_default=True, help="Short requests sent before measuring.")
@_engine_options
@endpoint_options
def run_cmd(url: str, model: str, concurrency: str, isl: str, osl: str, output: Path, requests_per_point: int,
            seed: int, timeout_s: float, warmup: int, append: bool, gpu: str | None, tp: int | None,
            engine: str | None, engine_version: str | None, weight_dtype: str | None, kv_dtype: str | None,
            chunk_tokens: int | None, threads: int | None, api_key: str | None, api: str) -> None:
    """Measure TTFT, TPOT and throughput on a live server over a grid of loads and lengths."""
    from kvtune.optimizer.profile_run import PointResult, RunSpec, run_profile  # keeps `kvtune --help` light

    run = RunSpec(url=url, model=model, concurrencies=tuple(parse_int_list(concurrency, "concurrency")),
                   input_tokens=tuple(parse_int_list(isl, "isl")), output_tokens=tuple(parse_int_list(osl, "osl")),
                   requests_per_point=requests_per_point, seed=seed, timeout_s=timeout_s, warmup_requests=warmup,
                   chunk_tokens=chunk_tokens, threads=threads, api_key=api_key or None, api=api)
    old: list[ProfileRow] = []
    check_output_path(output, "-o")  # before the benchmark: it takes minutes
    if append and output.exists():
        old = read_table(output)
    cmd = ["kvtune", "profile", "run", "--url", url, "--model", model, "--concurrency", concurrency, "--isl", isl,
           "--osl", osl, "--requests-per-point", str(requests_per_point), "--seed", str(seed)] \
        + (["--api", api] if api != "completions" else [])
    meta = _run_metadata(cmd, gpu=gpu, tp=tp, engine=engine, engine_version=engine_version, weight_dtype=weight_dtype,
                         kv_dtype=kv_dtype, chunk_tokens=chunk_tokens, threads=threads)

    def progress(pt: PointResult, row: ProfileRow) -> None:
        fails = f"  ({len(pt.failures)} failed: {pt.failures[0].error})" if pt.failures else ""
        tpot = f"{row.tpot_mean_ms:.2f}" if row.tpot_mean_ms is not None else "-"
        load = f"  loadavg {row.loadavg_1m:.2f}" if row.loadavg_1m is not None else ""
        click.echo(f"concurrency {pt.concurrency:>3}  isl {row.input_tokens:>5}  osl {row.output_tokens:>4}  "
                   f"ttft {row.ttft_mean_ms:8.1f} ms  tpot {tpot:>7} ms  {row.output_tok_s:8.1f} tok/s  "
                   f"{pt.duration_s:6.1f} s{load}{fails}", err=True)

    prefix = "run" if not old else f"run{len(old)}"
    rows, info = run_profile(run, meta, progress, id_prefix=prefix)
    save_or_show(output, rows_to_csv([*old, *rows]), "-o")
    click.echo(f"wrote {len(rows)} rows to {output}" + (f" (after {len(old)} kept)" if old else "")
               + f"  [engine {info.engine or '?'} {info.engine_version}"
               + (f", KV pool {info.kv_pool_tokens:,} tokens" if info.kv_pool_tokens else ", KV pool not reported")
               + (f", {info.batch_cap} slots (batch cap)" if info.batch_cap else "")
               + "]", err=True)


@profile_group.command("open-loop")
@click.argument("workload", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--url", required=True, help="OpenAI-compatible base URL, e.g. http://127.0.0.1:8080/v1.")
@click.option("--model", "model", required=True, help="Model name: sent as 'model' and written to the table.")
@click.option("--rate", "rates", required=True, metavar="FLOAT,...", help="Arrival rates, req/s, comma-separated: one run each.")
@click.option("--requests", "n_requests", type=int, default=330, show_default=True,
              help="Requests per run (the workload's own draw for this rate and seed).")
@click.option("--warmup", type=int, default=30, show_default=True,
              help="The first requests of each run are warm-up: sent, but out of every statistic.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the draw (the simulator's).")
@click.option("--timeout-s", type=float, default=600.0, show_default=True, help="Per-request timeout.")
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="Profile table to write; each run's per-request log goes beside it.")
@_engine_options
@endpoint_options
def open_loop_cmd(workload: Path, url: str, model: str, rates: str, n_requests: int, warmup: int, seed: int,
                  timeout_s: float, output: Path, append: bool, gpu: str | None, tp: int | None, engine: str | None,
                  engine_version: str | None, weight_dtype: str | None, kv_dtype: str | None,
                  chunk_tokens: int | None, threads: int | None, api_key: str | None, api: str) -> None:
    """Send WORKLOAD's own requests open-loop (Poisson arrivals, or its trace) at each --rate; one row
    per run with its per-request log, so validate and calibrate replay exactly these requests."""
    from kvtune.optimizer.loadgen import OpenLoopPlan, run_open_loop
    from kvtune.optimizer.profile_run import Endpoint
    from kvtune.optimizer.workload import load_workload

    spec = load_workload(workload)
    rate_list = []
    for part in str(rates).split(","):
        try:
            r = float(part)
        except ValueError:
            raise InputError(f"--rate: {part.strip()[:40]!r} is not a number") from None
        if not 0 < r < float("inf"):
            raise InputError(f"--rate: {part.strip()[:40]} must be a finite number > 0 (requests per second)")
        rate_list.append(r)
    for flag, v, lo in (("--threads", threads, 1), ("--chunk-tokens", chunk_tokens, 1), ("--tp", tp, 1)):
        if v is not None and v < lo:
            raise InputError(f"{flag}: {v} must be >= {lo}")
    plans = [OpenLoopPlan.from_workload(spec, r, n_requests, seed, warmup) for r in rate_list]
    check_output_path(output, "-o")  # before the runs: they take minutes
    old: list[ProfileRow] = read_table(output) if append and output.exists() else []
    cmd = ["kvtune", "profile", "open-loop", str(workload), "--url", url, "--model", model, "--rate", rates,
           "--requests", str(n_requests), "--warmup", str(warmup), "--seed", str(seed)] \
        + (["--api", api] if api != "completions" else [])
    meta = _run_metadata(cmd, gpu=gpu, tp=tp, engine=engine, engine_version=engine_version, weight_dtype=weight_dtype,
                         kv_dtype=kv_dtype, chunk_tokens=chunk_tokens, threads=threads)
    rows = list(old)
    for plan in plans:
        run = run_open_loop(Endpoint(url, api_key or None, api), model, plan, timeout_s=timeout_s)
        tag = f"r{plan.rate_req_s:g}-s{seed}-{len(rows)}"
        side = f"{output.stem}.{tag}.requests.csv"
        run.write_requests(output.parent / side)
        rows += run.to_rows(meta, side, row_id=f"open:{tag}", threads=threads, chunk_tokens=chunk_tokens)
        write_atomic(output, rows_to_csv(rows))
        _echo_open_loop(run)
    click.echo(f"wrote {len(rows) - len(old)} rows to {output}" + (f" (after {len(old)} kept)" if old else ""), err=True)


@profile_group.command("replay")
@click.argument("plan_path", metavar="PLAN", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--url", required=True, help="OpenAI-compatible base URL, e.g. http://127.0.0.1:8000/v1.")
@click.option("--model", "model", required=True, help="Model name: sent as 'model' and written to the table.")
@click.option("--requests", "n_requests", type=click.IntRange(1), default=None,
              help="Send only the plan's first N requests (in arrival order; default: all of them), the same share "
                   "of them warm-up as of the whole plan.")
@click.option("--timeout-s", type=float, default=600.0, show_default=True, help="Per-request timeout.")
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="Profile table to write; the run's per-request log goes beside it.")
@_engine_options
@endpoint_options
def replay_cmd(plan_path: Path, url: str, model: str, n_requests: int | None, timeout_s: float, output: Path,
               append: bool, gpu: str | None, tp: int | None, engine: str | None, engine_version: str | None,
               weight_dtype: str | None, kv_dtype: str | None, chunk_tokens: int | None, threads: int | None,
               api_key: str | None, api: str) -> None:
    """Send PLAN's requests (kvtune solve/tune --plan, or any Mooncake trace JSONL) at their own times,
    open-loop, with kvtune's driver: one row with its per-request log, as profile open-loop writes."""
    from kvtune.optimizer.loadgen import run_open_loop
    from kvtune.optimizer.plan import first_of_plan, read_plan
    from kvtune.optimizer.profile_run import Endpoint

    if not timeout_s > 0:
        raise InputError(f"--timeout-s: {timeout_s} must be > 0")
    rp = read_plan(plan_path)
    plan = rp.plan if n_requests is None else first_of_plan(rp.plan, n_requests)
    check_output_path(output, "-o")  # before the run: it takes minutes
    old: list[ProfileRow] = read_table(output) if append and output.exists() else []
    cmd = ["kvtune", "profile", "replay", str(plan_path), "--url", url, "--model", model] \
        + (["--requests", str(n_requests)] if n_requests is not None else []) \
        + (["--api", api] if api != "completions" else [])
    pick = (rp.header or {}).get("pick") or {}
    meta = _run_metadata(cmd, gpu=gpu, tp=tp, engine=engine, engine_version=engine_version, weight_dtype=weight_dtype,
                         kv_dtype=kv_dtype, chunk_tokens=chunk_tokens, threads=threads)
    run = run_open_loop(Endpoint(url, api_key or None, api), model, plan, timeout_s=timeout_s)
    side = f"{output.stem}.{plan_path.stem}-{len(old)}.requests.csv"
    run.write_requests(output.parent / side)
    rows = old + run.to_rows(meta, side, row_id=f"replay:{plan_path.stem}-{len(old)}", threads=threads,
                             chunk_tokens=chunk_tokens or pick.get("chunk_tokens"))
    save_or_show(output, rows_to_csv(rows), "-o")
    _echo_open_loop(run)
    pred = (rp.header or {}).get("predicted")
    if pred and len(plan) == len(rp.plan):
        click.echo("  " + _predicted_line(pred), err=True)
    click.echo(f"wrote 1 row to {output}" + (f" (after {len(old)} kept)" if old else ""), err=True)


def _echo_open_loop(run) -> None:
    att, pct = run.attainment(), run.percentiles()

    def q(key: str) -> str:
        return "/".join("-" if pct[key][s] is None else f"{pct[key][s]:.0f}" for s in ("p50", "p90", "p99"))

    fails = f"  {len(run.failures)} failed ({run.failures[0].error})" if run.failures else ""
    load = f"loadavg {run.load.mean_1m:.2f} (max {run.load.max_1m:.2f})" if run.load.mean_1m == run.load.mean_1m \
        else "loadavg not recorded"   # an imported run (AIPerf's export) has no load record
    if run.cached_beyond_prefix:
        fails += (f"  warning: {len(run.cached_beyond_prefix)} requests took more than their shared prefix from "
                  f"the server's cache")
    click.echo(f"rate {run.rate_req_s:g} req/s (sent {run.offered_rate_req_s:.3g})  attainment {att.value:.3f} "
               f"[{att.lo:.3f}, {att.hi:.3f}] over {att.n} ({att.warmup_excluded} warm-up out)  TTFT p50/p90/p99 "
               f"{q('ttft_ms')} ms  TPOT {q('tpot_ms')} ms  {load}"
               f"  {run.duration_s:.0f} s{fails}", err=True)


COMMANDS = [profile_group]
