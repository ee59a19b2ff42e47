"""``kvtune tune``: close the loop on the live engine (optimizer.tune)."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import shutil
import signal
import sys
import tempfile
from pathlib import Path

import click

from kvtune.costmodel.errors import Infeasible, InputError

from ._common import STDOUT, Choice, EngineChoice, Float, FloatList, Int, endpoint_options, parse_int
from ._plan import check_plan_dest, plan_lines, plan_option, write_plan

__all__ = ["tune_cmd", "COMMANDS"]


def _float(value: str | None, flag: str, lo: float = 0.0) -> float | None:
    if value is None:
        return None
    try:
        v = float(value)
    except ValueError:
        raise InputError(f"{flag}: {value[:40]!r} is not a number") from None
    if not v >= lo or v != v or v == float("inf"):
        raise InputError(f"{flag}: {value} must be a finite number >= {lo:g}")
    return v


def _floats(value: str, flag: str) -> tuple[float, ...]:
    out = tuple(_float(x.strip(), flag, 0.0) or 0.0 for x in value.split(",") if x.strip())
    if not out:
        raise InputError(f"{flag}: empty list")
    return out


@contextlib.contextmanager
def _sigterm_as_interrupt():
    """SIGTERM ends the session as Ctrl-C does: engines stopped, claims released, one line."""
    def handler(signum, frame):
        raise KeyboardInterrupt
    try:
        old = signal.signal(signal.SIGTERM, handler)
    except ValueError:       # not the main thread (a test runner): nothing to install
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def _adapter(spec, engine, engine_bin, model_file, command, url, served_model, threads, port, startup_timeout_s,
             log_dir, api_key=None, api="completions"):
    adapter = _adapter_for(spec, engine, engine_bin, model_file, command, url, served_model, threads, port,
                           startup_timeout_s, log_dir, api_key, api)
    adapter.api = api
    return adapter


def _adapter_for(spec, engine, engine_bin, model_file, command, url, served_model, threads, port, startup_timeout_s,
                 log_dir, api_key, api):
    from kvtune.costmodel.models import get_model
    from kvtune.optimizer.adapters import LocalAdapter, TemplateAdapter, UrlAdapter
    given = [x for x in (command, url) if x]
    if len(given) > 1:
        raise InputError("kvtune tune: give one of --command or --url (or neither: kvtune starts --engine itself)")
    if url:
        arch = get_model(spec.model)
        return UrlAdapter(url, (arch.name, arch.hf_id or "", spec.model), served_model, api_key=api_key or None, api=api)
    if command:
        return TemplateAdapter(command, engine=engine or "", threads=threads, port=port, log_dir=log_dir,
                               startup_timeout_s=startup_timeout_s, model=model_file)
    engine = engine or spec.engine
    if not engine:
        raise InputError(f"{spec.path}: no engine: give --engine llamacpp|vllm|sglang (or engine: in the workload), "
                         f"--command or --url")
    return LocalAdapter(engine, binary=engine_bin, model=model_file, threads=threads, port=port, log_dir=log_dir,
                        startup_timeout_s=startup_timeout_s)


def _swap_in(tmp: Path, out: Path) -> None:
    """Replace ``out`` with the finished ``tmp`` folder (a rename each; the old one removed last)."""
    old = None
    if out.exists():
        old = out.with_name(f".{out.name}.old-{os.getpid()}")
        os.replace(out, old)
    os.replace(tmp, out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


@click.command("tune")
@click.argument("workload", type=click.Path(dir_okay=False))
@click.option("--engine", type=EngineChoice(), default=None, help="llamacpp | vllm | sglang: the engine kvtune starts per config from its "
              "own launch settings (default: the workload's engine:).")
@click.option("--engine-bin", default=None, help="The engine's executable: llama-server, vllm, or for SGLang the "
              "Python that has sglang (default: found on PATH; SGLang: this Python).")
@click.option("--model-file", default=None, help="The weights the engine loads: llama.cpp's GGUF file; vLLM/SGLang: a "
              "folder or Hugging Face id (default: the workload model's id).")
@click.option("--command", "command", default=None, help="Your own start command, its {port}, {batch_cap}, "
              "{chunk_tokens}, {kv_dtype}, {tp}, {spec_k}, {model}, {threads}, {ctx_tokens}, {gpu_mem_util} filled "
              "per config (with --engine naming what it runs, for its health check and read-back).")
@click.option("--url", default=None, help="A server you launched (http://HOST:PORT/v1): only the configs it runs "
              "are measured.")
@click.option("--served-model", default=None, help="--url: the model name the server serves, if not the workload's.")
@click.option("--threads", type=Int(1), default=None, help="CPU threads for llama.cpp (-t/-tb; default: the CPUs this process may "
              "use). Recorded with every run.")
@click.option("--memory-budget-gb", type=Float(), default=None, help="Memory the server may take (CPU hosts: not the machine's "
              "whole RAM): kvtune plans the KV pool from it (and llama.cpp's -c).")
@click.option("--calibration", default=None, help="Where the model starts: a calibration file, a shipped name or "
              "'ideal' (default: the workload's calibration:, else none: a small profile grid is measured first).")
@click.option("--max-runs", type=Int(0), default="40", show_default=True, help="Budget: real load runs (open-loop runs, the speed "
              "probe each engine start opens with, profile-grid points).")
@click.option("--max-engine-s", type=Float(), default="1200", show_default=True, help="Budget: engine wall time, seconds (start to "
              "stop, every start summed).")
@click.option("--run-s", type=Float(), default="60", show_default=True, help="Seconds of arrivals per open-loop run (its requests: "
              "rate x this, within --min-requests/--max-requests).")
@click.option("--min-requests", type=Int(1), default="40", show_default=True)
@click.option("--max-requests", type=Int(1), default="600", show_default=True)
@click.option("--warmup", type=Int(0), default="4", show_default=True, help="First requests of each run left out of every statistic.")
@click.option("--rates", type=FloatList(), default="0.8,1.0,1.2", show_default=True, help="Multiples of the promised per-replica goodput "
              "the pick is measured at (the first time it is the pick).")
@click.option("--check", type=Float(), default="1.3", show_default=True, help="The rate multiple that must miss: the promise is tight.")
@click.option("--promise", type=Choice(["run", "steady"]), default="run", show_default=True, help="What the promised "
              "rate means: run, the goodput a run of --run-s seconds meets from an empty queue (each run reports whether "
              "TTFT rose through it); steady, the steady-state goodput (solve's), measured on runs as long as the "
              "simulator says a queue at the --check rate takes to show (within the budget), kept only where TTFT does "
              "not rise through the 1.0x run.")
@click.option("--near", type=Int(0), default="2", show_default=True, help="Configs the simulator ranks next to the pick, measured at "
              "1.0x their promise.")
@click.option("--max-rounds", type=Int(1), default="5", show_default=True)
@click.option("--grid/--no-grid", default=None, help="Measure a small closed-loop profile grid first (default: only "
              "when no calibration is given).")
@click.option("--storage", default=None, help="Optuna storage for the runs (default journal:OUT.journal): a killed "
              "tune resumes from it; several machines on one RDB URL measure different configs of one study.")
@click.option("--study-name", default=None, help="Study in --storage (default: derived from the workload and engine).")
@click.option("-o", "--out", "out", default=None, help="Folder for the results (default: tune-<workload>/), written "
              "whole at the end.")
@click.option("--port", type=Int(1, 65535), default=None, help="Port for the engines kvtune starts (default: a free one each start).")
@click.option("--startup-timeout-s", type=Float(), default="600", show_default=True, help="Seconds an engine may take to be healthy.")
@click.option("--request-timeout-s", type=Float(), default=None, help="Seconds a request may wait for its next byte (default: 4x the "
              "longest request's SLO budget, within 10-300 s: an overloaded run ends instead of draining).")
@click.option("--seed", type=Int(0), default="0", show_default=True, help="The runs' request draw (the simulator's own for that rate).")
@click.option("--quiet", is_flag=True, help="Only the closing summary.")
@plan_option("Write the requests the final pick was measured on at its promise (the open-loop run: arrival times, "
             "input/output lengths, shared-prefix blocks) to FILE as Mooncake trace JSONL, which AIPerf replays "
             "(--custom-dataset-type mooncake_trace --fixed-schedule; the command is printed); '-': stdout, and "
             "the human text goes to stderr.")
@endpoint_options
def tune_cmd(workload, engine, engine_bin, model_file, command, url, served_model, threads, memory_budget_gb,
             calibration, max_runs, max_engine_s, run_s, min_requests, max_requests, warmup, rates, check, near,
             max_rounds, grid, storage, study_name, out, port, startup_timeout_s, request_timeout_s, seed, quiet,
             api_key, api, promise="run", plan_path=None):
    """Tune WORKLOAD.yaml on the live engine: solve in simulation, measure the pick and its neighbours
    open-loop, refit, re-solve, until the measured pick keeps its promise (or the budget ends)."""
    from kvtune.costmodel.hardware import resolve_gpu
    from kvtune.optimizer.adapters.errors import Interrupted
    from kvtune.optimizer.search import make_storage
    from kvtune.optimizer.tune import TuneSettings, check_tunable, settings_digest, tune
    from kvtune.optimizer.tune_store import TuneStore
    from kvtune.optimizer.workload import load_workload

    settings = TuneSettings(
        calibration=None, max_runs=parse_int(max_runs, "--max-runs", 0), max_engine_s=_float(max_engine_s, "--max-engine-s") or 0.0,
        run_s=_float(run_s, "--run-s") or 0.0, min_requests=parse_int(min_requests, "--min-requests", 1),
        max_requests=parse_int(max_requests, "--max-requests", 1), warmup=parse_int(warmup, "--warmup", 0),
        pick_multipliers=_floats(rates, "--rates"), check_multiplier=_float(check, "--check") or 0.0,
        near=parse_int(near, "--near", 0), max_rounds=parse_int(max_rounds, "--max-rounds", 1),
        seed=parse_int(seed, "--seed", 0), request_timeout_s=_float(request_timeout_s, "--request-timeout-s") if request_timeout_s else None,
        grid=grid, promise=promise)
    n_threads = parse_int(threads, "--threads", 1) if threads is not None else len(os.sched_getaffinity(0)) \
        if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    port_v = parse_int(port, "--port", 1, 65535) if port is not None else None
    startup = _float(startup_timeout_s, "--startup-timeout-s") or 0.0
    check_plan_dest(plan_path)   # before anything starts: a session takes minutes
    spec = load_workload(workload, engine)   # its search space cut to what the engine can launch
    check_tunable(spec)   # what one live engine cannot measure is refused before anything starts
    cal = calibration if calibration is not None else spec.calibration
    settings = dataclasses.replace(settings, calibration=cal)
    if memory_budget_gb is not None:
        budget = _float(memory_budget_gb, "--memory-budget-gb")
        gpu = resolve_gpu(spec.hardware.gpu, spec.hardware.gpu_file)
        if not budget or budget * 1e9 > gpu.memory_bytes:
            raise InputError(f"--memory-budget-gb {memory_budget_gb}: must be > 0 and at most the machine's "
                             f"{gpu.memory_bytes / 1e9:g} GB ({gpu.name})")
        spec = dataclasses.replace(spec, gpu_mem_util=budget * 1e9 / gpu.memory_bytes)
    if out == STDOUT:
        raise InputError("--out -: '-' (stdout) cannot take a folder of results; give a folder path")
    out_dir = Path(out or f"tune-{Path(workload).stem}")
    if not out_dir.parent.exists():
        raise InputError(f"--out {out_dir}: folder {out_dir.parent} does not exist")
    if out_dir.exists() and not out_dir.is_dir():
        raise InputError(f"--out {out_dir}: exists and is not a folder")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not (out_dir / "tune.json").exists():
        raise InputError(f"--out {out_dir}: a folder holding other files (kvtune tune replaces only its own results)")
    storage_url = storage or f"journal:{out_dir.with_name(out_dir.name + '.journal')}"
    log_dir = Path(tempfile.gettempdir()) / "kvtune-tune-logs"
    adapter = _adapter(spec, engine, engine_bin, model_file, command, url, served_model, n_threads, port_v, startup,
                       log_dir, api_key, api)
    eng_name = adapter.engine or spec.engine or ""
    extra = {"threads": n_threads, "gpu_mem_util": spec.gpu_mem_util, "adapter": type(adapter).__name__}
    if api != "completions":   # the chat template's tokens change what is measured: another session's runs
        extra["api"] = api
    digest = settings_digest(spec, settings, eng_name, extra)
    name = study_name or re.sub(r"[^A-Za-z0-9_.-]", "-", f"tune-{Path(workload).stem}-{eng_name or 'engine'}-{digest[:8]}")
    store = TuneStore(make_storage(storage_url), name, digest)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.partial-", dir=out_dir.parent))
    log = (lambda s: None) if quiet else (lambda s: click.echo(s, err=True))
    log(f"kvtune tune: {adapter.describe()}; runs stored in {storage_url} (study {name}); budget {settings.max_runs} "
        f"runs, {settings.max_engine_s:g} s of engine time")
    try:
        with _sigterm_as_interrupt():
            try:
                result = tune(spec, adapter, settings, store, tmp, log, n_threads)
            except KeyboardInterrupt:
                raise Interrupted(f"interrupted: the engine was stopped; {len(store.done())} finished jobs are stored "
                                  f"in {storage_url} (study {name}): run the same command to resume") from None
        _write(result, tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    from kvtune.optimizer.tune_report import round_table, summary_lines
    click.echo("\n".join(round_table(result)), err=plan_path == STDOUT)   # stdout holds the plan alone
    click.echo("\n".join(summary_lines(result, str(out_dir))), err=plan_path == STDOUT)
    if plan_path:
        _tune_plan(result, spec, settings.seed, plan_path, out_dir)
    if result.status == "infeasible":
        raise Infeasible(result.reason)
    if result.status != "converged":
        sys.exit(1)


def _tune_plan(result, spec, seed: int, plan_path: str, out_dir: Path) -> None:
    """``--plan``: the final pick's run at its promise (``optimizer.plan.tune_plan``), written after the
    session's results (a plan that cannot be written is an error; ``out_dir`` holds the session)."""
    from kvtune.optimizer.launch import argv_of
    from kvtune.optimizer.plan import tune_plan
    made = tune_plan(spec, result, seed)
    if made is None:
        click.echo("note: no plan written: the session measured no run of its pick at the promise", err=True)
        return
    argv = argv_of(result.launch_line) if result.launch_line else None
    try:
        pf = write_plan(plan_path, made, spec.model, result.engine or spec.engine or "llamacpp", argv)
    except InputError as exc:
        raise InputError(f"{exc} (the session's results are in {out_dir})") from None
    click.echo("\n".join(plan_lines(pf)), err=True)


def _write(result, tmp: Path, out_dir: Path) -> None:
    from kvtune.optimizer.cli._common import dumps
    from kvtune.optimizer.tune_report import write_report
    (tmp / "tune.json").write_text(dumps(result.to_json()) + "\n")
    if result.launch_line:
        (tmp / "launch.sh").write_text("#!/bin/sh\n# the launch line kvtune tune measured, exactly\n"
                                       + result.launch_line + "\n")
    write_report(result, tmp, str(out_dir))
    _swap_in(tmp, out_dir)


COMMANDS = [tune_cmd]
