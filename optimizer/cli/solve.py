"""``kvtune solve``: the cheapest deployment that meets the SLOs, with evidence and launch settings."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from kvtune.costmodel.engines import REGISTRY as ENGINE_POLICIES
from kvtune.costmodel.errors import Infeasible, InputError
from kvtune.optimizer import space
from kvtune.optimizer.storage import check_shared_storage

from ._common import MAX_SEED, STDOUT, Choice, EngineChoice, check_json_dest, check_output_folder, dumps, json_document, \
    json_option, output_folder, parse_int, write_atomic
from ._plan import check_plan_dest, plan_lines, plan_option, write_plan

if TYPE_CHECKING:
    from kvtune.optimizer.result import SolveResult

SAMPLER_NAMES = ("tpe", "grid", "nsga2")


class _Int(click.ParamType):
    """An integer option, shown as INTEGER (with its range) in ``--help``; a bad value is the one
    ``Error:`` line ``parse_int`` writes (``--trials: 'ten' is not an integer``), not click's."""

    name = "integer"

    def __init__(self, minimum: int, maximum: int | None = None):
        self.minimum, self.maximum = minimum, maximum

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str:
        return "INTEGER"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        flag = param.opts[0] if param is not None else "value"
        return parse_int(value, flag, self.minimum, self.maximum)


class _Progress:
    """One status line on stderr (interactive runs only) over the whole solve: the screen's trials
    as a bar, then the simulator race (most of the wall time) stage by stage, then the
    disaggregated search, each with the seconds it has run, redrawn every second by a timer thread
    so a long stage still shows it is alive. ``--quiet`` or a non-terminal stderr: silent."""

    WIDTH = 30
    TICK_S = 1.0

    def __init__(self, enabled: bool, stream: Any = None):
        self.enabled = enabled
        self.stream = stream if stream is not None else sys.stderr
        self.prefix = ""
        self.text = ""
        self.t0 = time.monotonic()
        self.raced = 0
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.ticker: threading.Thread | None = None
        self.width = 0

    # -- the phases ----------------------------------------------------------------------------
    def start(self, label: str | None = None) -> None:
        """A new aggregated search (one per GPU type): the trials come next."""
        self._newline()
        self.prefix = f"{label}: " if label else ""
        self.raced = 0
        self._show("trials ...", restart=True)

    def __call__(self, done: int, total: int) -> None:
        """The screen's trials: ``done`` of ``total`` (``run_search``'s ``on_trial``)."""
        fill = int(self.WIDTH * done / max(total, 1))
        if done < total:
            self._show(f"trials [{'#' * fill}{'.' * (self.WIDTH - fill)}] {done}/{total}")
        else:   # the race starts with each config's largest requests against its KV pool
            self._show(f"trials {total}/{total}; simulator race: the largest requests against each KV pool",
                       restart=True)

    def stage(self, name: str, n: int) -> None:
        """A stage of the simulator race as it starts (``optimizer.simsearch.race``'s ``on_stage``)."""
        if name == "race":
            self.raced += n
            text = f"simulator race: {self.raced} configs raced so far"
        elif name == "zero load":
            text = f"simulator race: zero load, {n} groups"
        else:
            text = f"simulator race: {name}, {n} configs"
        self._show(text)

    def phase(self, text: str) -> None:
        """Any other phase (the disaggregated search, the report): its name and its seconds."""
        self._newline()
        self.prefix = ""
        self._show(text, restart=True)

    def close(self) -> None:
        self.stop.set()
        if self.ticker is not None:
            self.ticker.join()
            self.ticker = None
        self._newline()

    # -- drawing -------------------------------------------------------------------------------
    def _show(self, text: str, restart: bool = False) -> None:
        if not self.enabled:
            return
        with self.lock:
            if restart:
                self.t0 = time.monotonic()
            self.text = text
            self._draw()
        if self.ticker is None:
            self.ticker = threading.Thread(target=self._tick, daemon=True)
            self.ticker.start()

    def _tick(self) -> None:
        while not self.stop.wait(self.TICK_S):
            with self.lock:
                if self.text:
                    self._draw()

    def _draw(self) -> None:
        line = f"  {self.prefix}{self.text}  {time.monotonic() - self.t0:.0f} s"
        # one column short of the terminal: a line that wraps cannot be redrawn by \r (read at each draw: a resize)
        cols = shutil.get_terminal_size().columns
        if len(line) > cols - 1:
            line = line[:max(cols - 2, 1)] + "~"
        self.stream.write("\r" + line + " " * max(0, self.width - len(line)))
        self.stream.flush()
        self.width = len(line)

    def _newline(self) -> None:
        if self.enabled and self.text:
            with self.lock:
                self.stream.write("\n")
                self.stream.flush()
                self.text, self.width = "", 0


@click.command("solve")
@click.argument("workload", type=click.Path(dir_okay=False))
@click.option("--trials", type=_Int(1), default=None, help="Trials to run (default: search.trials; grid: the whole grid); above search.exhaustive_max_configs, the most configs the race covers.")
@click.option("--seed", type=_Int(0, MAX_SEED), default=None, help="Sampler seed (default: search.seed; the simulated requests always follow search.seed).")
@click.option("--sampler", type=Choice(SAMPLER_NAMES), default="tpe", show_default=True, help="tpe | grid | nsga2: the sampler of the analytic screen's trials (the study). The simulator race that picks covers the whole lattice up to search.exhaustive_max_configs configs (default 5000) whatever the sampler; above it, only the configs the sampler proposed.")
@click.option("--storage", default=None, help="Optuna storage: sqlite:///kvtune.db, journal:./kvtune.log or an RDB URL (default: in memory).")
@click.option("--study-name", default=None, help="Study to create or resume in --storage (default: derived from the workload).")
@click.option("--verify-top", type=_Int(1), default=None, help="max_goodput: configs fully verified before the simulator race (default 4).")
@click.option("--calibration", default=None,
              help="Calibration file, shipped name or 'ideal' (default: the workload's calibration:, else the shipped one).")
@click.option("--engine", type=EngineChoice(), default=None,
              help="vllm | sglang | trtllm | llamacpp: the engine to launch and its shipped calibration (overrides "
                   "the workload's engine: and calibration: unless --calibration is given).")
@click.option("--profile", default=None,
              help="Measured profile table: its step times for the configs it covers, the calibration elsewhere "
                   "(default: the workload's profile:).")
@json_option(dest="json_path", help="Write the result object to PATH (atomically); '-' or no PATH: to stdout, JSON "
             "only, and the summary goes to stderr (kvtune solve W --json - | jq .recommendation).")
@click.option("--report", "report_dir", default=None, help="Write report.md and plots to this folder.")
@plan_option()
@click.option("--quiet", is_flag=True, help="No progress bar; only the summary.")
@click.option("--jobs", type=_Int(1), default=None,
              help="Processes simulating on this machine (default: 2, or 1 on a one-core machine).")
@click.option("--workers", type=_Int(1), default=None,
              help="Processes sharing one --storage (default 1): this one plus N-1 started here; processes on "
                   "other machines join by running the same command on the same RDB URL. Without --storage, a "
                   "temporary journal file.")
def solve_cmd(workload: str, trials: int | None, seed: int | None, sampler: str, storage: str | None,
              study_name: str | None, verify_top: int | None, calibration: str | None, engine: str | None,
              profile: str | None, json_path: str | None, report_dir: str | None, quiet: bool, jobs: int | None,
              workers: int | None, plan_path: str | None = None) -> None:
    """Search serving configs for WORKLOAD.yaml and recommend the cheapest that meets its SLOs."""
    from kvtune.optimizer.solve import Progress, SolveOptions, solve
    from kvtune.optimizer.workload import load_workload

    if sampler not in SAMPLER_NAMES:
        raise InputError(f"--sampler must be one of {', '.join(SAMPLER_NAMES)}, got {sampler!r}")
    n_jobs = jobs
    n_workers = workers or 1
    if n_jobs is None:
        import os
        n_jobs = min(2, os.cpu_count() or 1) if n_workers == 1 else 1
    check_json_dest(json_path)
    if plan_path == STDOUT and json_path == STDOUT:
        raise InputError("--plan - and --json - both write to stdout: give one of them a file")
    check_plan_dest(plan_path)
    if report_dir:
        from kvtune.optimizer.report import require_matplotlib
        require_matplotlib()
        check_output_folder(report_dir, "--report")
    check_shared_storage(storage, n_workers)
    spec = load_workload(workload, engine)   # its search space cut to what the engine can launch
    progress = _Progress(enabled=not quiet and sys.stderr.isatty())
    # every GPU type hardware.gpu lists x aggregated and/or disaggregated deployments (search.deployment):
    # one space, the best under the objective wins (optimizer.solve)
    try:
        with _workers(n_workers, storage, workload, sys.argv) as shared:
            options = SolveOptions(trials=trials, seed=seed, sampler=sampler, storage=shared, study_name=study_name,
                                   calibration=calibration, engine=engine, profile=profile, jobs=n_jobs,
                                   **({} if verify_top is None else {"verify_top": verify_top}))
            result = solve(spec, options, Progress(on_type=progress.start, on_trial=progress,
                                                   on_stage=progress.stage, on_phase=progress.phase))
        evidence = _write_evidence(result, storage, study_name, spec.hardware.gpu)
        if report_dir:
            progress.phase("report: plots and report.md")
        result, plan_failed = _write_plan(result, spec, plan_path)
        result, failed = _write_outputs(result, spec, report_dir, json_path, storage,
                                        overrides=(calibration, engine, profile))
        failed = plan_failed or failed
    finally:
        progress.close()
    to_stderr = STDOUT in (json_path, plan_path)
    click.echo(summary_text(result, storage), err=to_stderr)   # stdout holds the JSON (or the plan) alone
    if evidence:
        click.echo(evidence, err=to_stderr)
    if result.plan is not None:
        rec = result.recommendation
        click.echo("\n".join(plan_lines(result.plan, getattr(rec, "units", None) or getattr(rec, "replicas", None))),
                   err=True)
    elif plan_path and not plan_failed:
        click.echo("note: no plan written: there is no pick whose requests to write", err=True)
    if failed:  # the answer is printed above whatever became of the files
        raise failed
    if result.status != "ok":
        raise Infeasible(f"no configuration meets the SLOs: {result.reason}")


def _write_evidence(result: SolveResult, storage: str | None, study_name: str | None, gpu: str) -> str | None:
    """``--storage``: the deployments the simulator judged, recorded as their own optuna study beside
    the screen's (``optimizer.evidence``); the line saying where. The answer comes first: a storage
    that fails now is one line, and the answer is still printed and written."""
    if not storage:
        return None
    from kvtune.optimizer.evidence import write_evidence
    try:
        got = write_evidence(result, storage, study_name, gpu)
    except Exception as exc:   # the database went away after the solve: keep the answer
        return f"  note: the evidence study was not written to {storage}: {exc.__class__.__name__}: {str(exc).splitlines()[0]}"
    if got is None:
        return None   # another worker of this solve writes it
    name, n = got
    return (f"  evidence: study '{name}' in {storage}: the {n} deployments the simulator judged, its Pareto front "
            f"the cost/goodput front above (optuna-dashboard, optuna.visualization.plot_pareto_front)")


def _write_plan(result: SolveResult, spec, plan_path: str | None) -> tuple[SolveResult, InputError | None]:
    """``--plan``: the pick's judged requests (``optimizer.plan.solve_plan``) written, recorded in the
    result; a file that cannot be written is returned (the answer is still printed), as ``--json``'s."""
    if not plan_path:
        return result, None
    from kvtune.optimizer.plan import solve_plan
    made = solve_plan(spec, result)
    if made is None:
        return result, None
    eng = result.engine or spec.engine or "vllm"
    argv = ((result.launch or {}).get("argv") or {}).get(eng) or [None]
    try:
        pf = write_plan(plan_path, made, spec.model, eng, argv[0])
    except InputError as exc:
        return result, exc
    return dataclasses.replace(result, plan=pf), None


def _write_outputs(result: SolveResult, spec, report_dir: str | None, json_path: str | None,
                   storage: str | None, overrides: tuple[str | None, str | None, str | None] = (None, None, None)
                   ) -> tuple[SolveResult, InputError | None]:
    """Write --report and --json after the solve. A file that cannot be written (a full disk, a
    read-only mount) is returned, not raised, so the answer is still printed; any other failure
    prints the answer and then propagates. ``overrides``: the solve's --calibration, --engine and
    --profile, so the report's plots use the step model the solve used."""
    failed: InputError | None = None
    try:
        if report_dir:
            from kvtune.optimizer.report import write_report
            try:
                with output_folder(report_dir, "--report") as tmp:
                    written = Path(write_report(result, spec, str(tmp), *overrides))
                result = dataclasses.replace(result, report=str(Path(report_dir) / written.relative_to(tmp)))
            except InputError as exc:
                failed = exc
        if json_path == STDOUT:
            click.echo(dumps(json_document(result.to_json())))
        elif json_path:
            try:
                write_atomic(json_path, dumps(json_document(result.to_json())) + "\n")
            except InputError as exc:
                failed = failed or exc
    except BaseException:
        click.echo(summary_text(result, storage), err=json_path == STDOUT)
        raise
    return result, failed


class _workers:
    """``--workers N``: start N-1 more ``kvtune solve`` processes on the same storage (a temporary
    journal file without ``--storage``), each with ``--workers 1 --jobs 1 --quiet`` and no output
    files; reap each as it ends (a dead one must not linger as a zombie that looks alive to the
    others: ``optimizer.scaleout.Reaper``), wait for them on exit and say which one failed. Yields
    the storage URL this process should use."""

    def __init__(self, n: int, storage: str | None, workload: str, argv: list[str]):
        self.n, self.storage, self.workload, self.argv = n, storage, workload, argv
        self.procs: list[subprocess.Popen] = []
        self.tmp: tempfile.TemporaryDirectory | None = None
        self.reaper: Any = None

    def __enter__(self) -> str | None:
        if self.n <= 1:
            return self.storage
        from kvtune.optimizer.scaleout import Reaper, spawn_workers
        if not self.storage:
            self.tmp = tempfile.TemporaryDirectory(prefix="kvtune-workers-")
            self.storage = f"journal:{self.tmp.name}/study.log"
        self.procs = spawn_workers(self.argv, self.storage, self.n - 1)
        self.reaper = Reaper(self.procs)
        return self.storage

    def __exit__(self, *exc) -> None:
        if self.reaper is not None:
            self.reaper.close()
        for p in self.procs:
            if exc[0] is not None:
                p.terminate()
            p.wait()
        if exc[0] is None:
            for p in self.procs:
                if p.returncode not in (0, Infeasible.exit_code):   # the same answer as this one's: no news
                    how = f"was killed by signal {-p.returncode}" if p.returncode < 0 else \
                        f"exited with status {p.returncode}"
                    click.echo(f"warning: --workers process {p.pid} {how}; the other processes did its share", err=True)
        if self.tmp is not None:
            self.tmp.cleanup()


def summary_text(r: SolveResult, storage: str | None) -> str:
    """What ``kvtune solve`` prints: the settled result (``optimizer.facts.settle``), every figure
    formatted as the report formats it (``optimizer.facts``' text helpers)."""
    from kvtune.optimizer.deployment_choice import deployment_lines
    from kvtune.optimizer.facts import describe, front_point_text, launch_footer, load_basis
    from kvtune.optimizer.result import Recommendation

    lines = []
    t = r.trials
    head = f"kvtune {r.kvtune_version}  {r.objective}  target {r.target_rate_req_s:g} req/s  " \
           f"sampler {r.sampler} seed {r.seed}  trials {t.completed} ({t.feasible} feasible)"
    v = r.verification
    if v.searched == "sampled":   # the sampler, its seed and its trials chose what the simulator raced
        head += f"  race: the {v.raced:,} configs sampled of {v.lattice_configs:,}"
    elif v.searched == "exhaustive":   # the sampler's study is the screen's record; the race covers all
        head += f"  race: all {v.lattice_configs:,} configs"
    lines.append(head)
    cal = r.calibration or {}
    named = f"calibration {cal['name']}: " if cal.get("name") and cal["name"] not in r.source else ""
    lines.append(f"  efficiency: {named}{r.source}")
    if r.profile is not None:
        pu = r.profile
        lines.append(f"  profile: {pu.path}: {pu.rows_used} rows used, {pu.fallbacks} of {pu.step_evaluations} "
                     f"step evaluations fell back to the calibration"
                     + (f"; no rows for {', '.join(pu.unmatched)}" if pu.unmatched else ""))
    rec, p, c, b = r.recommendation, r.predicted, r.cost, r.bottleneck
    if r.status != "ok" or rec is None or p is None or c is None or b is None or r.headroom is None:
        lines.append(f"INFEASIBLE: {r.reason}")
        if r.closest is not None and r.closest.config:
            lines.append(f"  closest: {_cfg(r.closest.config)}: {r.closest.miss}")
        lines += deployment_lines(r)
        lines += [f"  note: {n}" for n in r.notes or ()]
        return "\n".join(lines)
    lines.append(f"Recommendation: {describe(rec)} {rec.model} on {rec.gpus} {rec.gpu} "
                 f"({rec.nodes} node{'s' if rec.nodes > 1 else ''}"
                 + (f", {rec.nodes_per_replica} per replica" if isinstance(rec, Recommendation)
                    and rec.nodes_per_replica > 1 else "") + ")")
    lines.append(f"  batch cap {rec.batch_cap}  chunk {rec.chunk_tokens} tokens  KV {rec.kv_dtype}  "
                 f"speculative k {rec.spec_k}"
                 + "".join(f"  {k} {v}" for k, v in (getattr(rec, "knobs", None) or {}).items()))
    lines.append(f"  cost ${c.usd_per_hour:.2f}/h  ${c.usd_per_million_output_tokens:.3f} per 1M output tokens"
                 f" (at the {c.priced_at})")
    lines.append(f"  predicted (simulated at {p.load_per_replica_req_s:.2f} req/s {load_basis(r)}): "
                 f"goodput {p.goodput_req_s:.2f} req/s  SLO attainment {p.slo_attainment:.3f}  "
                 f"headroom {r.headroom * 100:+.0f}%")
    lines.append(f"  TTFT p50/p90/p99 {p.ttft_ms['p50']:.0f}/{p.ttft_ms['p90']:.0f}/{p.ttft_ms['p99']:.0f} ms   "
                 f"TPOT p50/p90/p99 {p.tpot_ms['p50']:.1f}/{p.tpot_ms['p90']:.1f}/{p.tpot_ms['p99']:.1f} ms   "
                 f"{p.tok_s_per_user:.0f} tok/s per user  {p.output_tok_s:,.0f} output tok/s")
    from kvtune.optimizer.check import check_lines
    lines += check_lines(r)
    if b.step is not None:
        st = b.step
        lines.append(f"  bottleneck (analytic screen): {b.term} (batch limited by {b.batch_limit} at "
                     f"{b.operating_batch}; step {st.step_ms or 0:.1f} ms: memory {st.mem_ms or 0:.1f}, "
                     f"compute {st.compute_ms or 0:.1f})")
    lines += deployment_lines(r)
    for n in r.notes or ():
        lines.append(f"  note: {n}")
    rows = r.gpu_choice or ()
    kinds = {g.deployment for g in rows if g.status == "ok"}
    for g in rows:
        kind = f" ({g.deployment})" if len(kinds) > 1 and g.deployment else ""
        cost = f"${g.usd_per_hour:.2f}/h  goodput {g.goodput_req_s:.2f} req/s on {g.gpus} GPUs{kind}" \
            if g.status == "ok" else g.status   # infeasible, or dearer (searched only up to the pick's price)
        lines.append(f"  gpu {g.gpu} (${g.usd_per_gpu_hour:g}/GPU-h): {cost}: {g.why}")
    pareto = r.pareto or ()
    if len(pareto) > 1:
        lines.append("  cost/goodput front (" + "; ".join(front_point_text(r, x) for x in pareto[:6]) + ")")
    v = r.verification
    if v.outcomes:
        o = v.outcomes
        lines.append(f"  simulator race: {v.simulations} simulations; {o.get('verified', 0)} configs verified, "
                     + ", ".join(f"{o[k]} {k.replace('_', ' ')}" for k in ("beaten", "pruned", "zero_load", "never_fits") if o.get(k)))
    eng = r.engine or "vllm"
    launch = (r.launch or {}).get(eng)
    if isinstance(launch, dict):  # TensorRT-LLM: a command and its config file
        launch = launch.get("command")
    lines.append(f"Launch ({ENGINE_POLICIES[eng].display_name if eng in ENGINE_POLICIES else eng}):")
    if launch:
        lines.append("  " + launch.replace("\n", "\n  "))
        lines.append(f"  ({launch_footer(r.launch or {})})")
    else:
        lines.append(f"  no launch settings for {eng} in this build; the other engines' are in --json under 'launch'")
    if storage:
        lines.append(f"  study '{r.study_name}' in {storage}: browse with  optuna-dashboard {storage.replace('journal:', '')}")
    if r.report:
        lines.append(f"  report: {r.report}")
    return "\n".join(lines)


def _cfg(p: dict[str, Any]) -> str:
    return (f"{p.get('layout') or 'TP' + str(p['tp'])} batch {p['batch_cap']} KV {p['kv_dtype']} k {p['spec_k']} "
            f"chunk {p['chunk_tokens']}" + "".join(f" {a.name} {p[a.name]}" for a in space.AXES if a.name in p))


COMMANDS = [solve_cmd]
