"""``kvtune solve``: the cheapest deployment that meets the SLOs, with evidence and launch settings."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import click

from kvtune.costmodel.errors import Infeasible, InputError

from ._common import MAX_SEED, check_output_path, dumps, parse_int, write_atomic

if TYPE_CHECKING:
    from kvtune.optimizer.result import SolveResult

SAMPLER_NAMES = ("tpe", "grid", "nsga2")


def _int_opt(value: str | None, flag: str, minimum: int, maximum: int | None = None) -> int | None:
    return None if value is None else parse_int(value, flag, minimum, maximum)


class _Progress:
    """A one-line progress bar on stderr (interactive runs only)."""

    def __init__(self, enabled: bool):
        self.enabled = enabled

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled:
            return
        width = 30
        fill = int(width * done / max(total, 1))
        sys.stderr.write(f"\r  trials [{'#' * fill}{'.' * (width - fill)}] {done}/{total}")
        if done >= total:
            sys.stderr.write("\n")
        sys.stderr.flush()


@click.command("solve")
@click.argument("workload", type=click.Path(dir_okay=False))
@click.option("--trials", default=None, help="Trials to run (default: search.trials; grid: the whole grid).")
@click.option("--seed", default=None, help="Sampler seed (default: search.seed; the simulated requests always follow search.seed).")
@click.option("--sampler", default="tpe", show_default=True, help="tpe | grid | nsga2: the sampler of the analytic screen's trials (the study; the simulator race that picks covers the whole lattice whatever the sampler).")
@click.option("--storage", default=None, help="Optuna storage: sqlite:///kvtune.db, journal:./kvtune.log or an RDB URL (default: in memory).")
@click.option("--study-name", default=None, help="Study to create or resume in --storage (default: derived from the workload).")
@click.option("--verify-top", default=None, help="max_goodput: configs fully verified before the simulator race (default 4).")
@click.option("--calibration", default=None,
              help="Calibration file, shipped name or 'ideal' (default: the workload's calibration:, else the shipped one).")
@click.option("--engine", default=None,
              help="vllm | sglang | trtllm | llamacpp: the engine to launch and its shipped calibration (overrides "
                   "the workload's engine: and calibration: unless --calibration is given).")
@click.option("--profile", default=None,
              help="Measured profile table: its step times for the configs it covers, the calibration elsewhere "
                   "(default: the workload's profile:).")
@click.option("--json", "json_path", default=None, help="Write the result object to this file (atomically).")
@click.option("--report", "report_dir", default=None, help="Write report.md and plots to this folder.")
@click.option("--quiet", is_flag=True, help="No progress bar; only the summary.")
@click.option("--jobs", default=None,
              help="Processes simulating on this machine (default: 2, or 1 on a one-core machine).")
@click.option("--workers", default=None,
              help="Processes sharing one --storage (default 1): this one plus N-1 started here; processes on "
                   "other machines join by running the same command on the same RDB URL. Without --storage, a "
                   "temporary journal file.")
def solve_cmd(workload: str, trials: str | None, seed: str | None, sampler: str, storage: str | None,
              study_name: str | None, verify_top: str | None, calibration: str | None, engine: str | None,
              profile: str | None, json_path: str | None, report_dir: str | None, quiet: bool, jobs: str | None,
              workers: str | None) -> None:
    """Search serving configs for WORKLOAD.yaml and recommend the cheapest that meets its SLOs."""
    from kvtune.optimizer.recommend import solve as solve_aggregated
    from kvtune.optimizer.workload import load_workload

    if sampler not in SAMPLER_NAMES:
        raise InputError(f"--sampler must be one of {', '.join(SAMPLER_NAMES)}, got {sampler!r}")
    n_trials = _int_opt(trials, "--trials", 1)
    seed_v = _int_opt(seed, "--seed", 0, MAX_SEED)
    top = _int_opt(verify_top, "--verify-top", 1)
    n_jobs = _int_opt(jobs, "--jobs", 1)
    n_workers = _int_opt(workers, "--workers", 1) or 1
    if n_jobs is None:
        import os
        n_jobs = min(2, os.cpu_count() or 1) if n_workers == 1 else 1
    extra: dict[str, Any] = {} if top is None else {"verify_top": top}
    if json_path:
        parent = Path(json_path).parent
        if not parent.exists():
            raise InputError(f"--json {json_path}: folder {parent} does not exist")
        check_output_path(json_path, "--json")
    if report_dir and Path(report_dir).exists() and not Path(report_dir).is_dir():
        raise InputError(f"--report {report_dir}: exists and is not a folder")
    spec = load_workload(workload, engine)   # its search space cut to what the engine can launch
    progress = _Progress(enabled=not quiet and sys.stderr.isatty())
    solve_one: Callable[..., SolveResult] = solve_aggregated
    if spec.hardware.choices:  # several GPU types: solved per type, the cheapest wins (optimizer.gpu_choice)
        from kvtune.optimizer.gpu_choice import solve_gpu_choice
        solve_one = solve_gpu_choice
    # aggregated and/or disaggregated deployments (search.deployment; optimizer.deployment_choice)
    from kvtune.optimizer.deployment_choice import solve_deployments
    with _workers(n_workers, storage, workload, sys.argv) as shared:
        result = solve_deployments(spec, solve_one, trials=n_trials, seed=seed_v, sampler=sampler, storage=shared,
                                   study_name=study_name, on_trial=progress, calibration=calibration, engine=engine,
                                   profile=profile, jobs=n_jobs, **extra)
    if spec.notes:   # what reading the workload dropped or filled in for the engine (optimizer.engine_space)
        result = dataclasses.replace(result, notes=tuple(spec.notes) + tuple(result.notes or ()))
    if report_dir:
        from kvtune.optimizer.report import write_report
        result = dataclasses.replace(result, report=write_report(result, spec, report_dir))
    text = dumps(result.to_json())
    if json_path:
        write_atomic(json_path, text + "\n")
    click.echo(summary_text(result, storage))
    if result.status != "ok":
        raise Infeasible(f"no configuration meets the SLOs: {result.reason}")


class _workers:
    """``--workers N``: start N-1 more ``kvtune solve`` processes on the same storage (a temporary
    journal file without ``--storage``), each with ``--workers 1 --jobs 1 --quiet`` and no output
    files; wait for them on exit. Yields the storage URL this process should use."""

    def __init__(self, n: int, storage: str | None, workload: str, argv: list[str]):
        self.n, self.storage, self.workload, self.argv = n, storage, workload, argv
        self.procs: list[subprocess.Popen] = []
        self.tmp: tempfile.TemporaryDirectory | None = None

    def __enter__(self) -> str | None:
        if self.n <= 1:
            return self.storage
        from kvtune.optimizer.scaleout import spawn_workers
        if not self.storage:
            self.tmp = tempfile.TemporaryDirectory(prefix="kvtune-workers-")
            self.storage = f"journal:{self.tmp.name}/study.log"
        self.procs = spawn_workers(self.argv, self.storage, self.n - 1)
        return self.storage

    def __exit__(self, *exc) -> None:
        for p in self.procs:
            if exc[0] is not None:
                p.terminate()
            p.wait()
        if self.tmp is not None:
            self.tmp.cleanup()


def summary_text(r: SolveResult, storage: str | None) -> str:
    from kvtune.optimizer.deployment_choice import deployment_lines
    from kvtune.optimizer.result import DisaggregatedRecommendation

    lines = []
    t = r.trials
    head = f"kvtune {r.kvtune_version}  {r.objective}  target {r.target_rate_req_s:g} req/s  " \
           f"sampler {r.sampler} seed {r.seed}  trials {t.completed} ({t.feasible} feasible)"
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
    if isinstance(rec, DisaggregatedRecommendation):  # prefill and decode pools (optimizer.deployment_choice)
        q, d = rec.prefill, rec.decode
        lines.append(f"Recommendation: disaggregated, {q.replicas} prefill x TP{q.tp} + {d.replicas} decode x "
                     f"TP{d.tp} {rec.model} on {rec.gpus} {rec.gpu} "
                     f"({rec.nodes} node{'s' if rec.nodes > 1 else ''})")
    else:
        layout = f"TP{rec.tp}" + (f" x PP{rec.pp}" if rec.pp > 1 else "") \
            + (f" EP{rec.ep}" if rec.ep > 1 else "") + (" DP-attention" if rec.dp_attention else "")
        per = rec.nodes_per_replica
        lines.append(f"Recommendation: {rec.replicas} x {layout} {rec.model} on {rec.gpus} {rec.gpu} "
                     f"({rec.nodes} node{'s' if rec.nodes > 1 else ''}"
                     + (f", {per} per replica" if per > 1 else "") + ")")
    lines.append(f"  batch cap {rec.batch_cap}  chunk {rec.chunk_tokens} tokens  KV {rec.kv_dtype}  "
                 f"speculative k {rec.spec_k}")
    lines.append(f"  cost ${c.usd_per_hour:.2f}/h  ${c.usd_per_million_output_tokens:.3f} per 1M output tokens"
                 f" (at the {c.priced_at})")
    lines.append(f"  predicted (simulated at {p.load_per_replica_req_s:.2f} req/s per replica): "
                 f"goodput {p.goodput_req_s:.2f} req/s  SLO attainment {p.slo_attainment:.3f}  "
                 f"headroom {r.headroom * 100:+.0f}%")
    lines.append(f"  TTFT p50/p90/p99 {p.ttft_ms['p50']:.0f}/{p.ttft_ms['p90']:.0f}/{p.ttft_ms['p99']:.0f} ms   "
                 f"TPOT p50/p90/p99 {p.tpot_ms['p50']:.1f}/{p.tpot_ms['p90']:.1f}/{p.tpot_ms['p99']:.1f} ms   "
                 f"{p.tok_s_per_user:.0f} tok/s per user  {p.output_tok_s:,.0f} output tok/s")
    if b.step is not None:
        st = b.step
        lines.append(f"  bottleneck: {b.term} (batch limited by {b.batch_limit} at {b.operating_batch}; "
                     f"step {st.step_ms or 0:.1f} ms: memory {st.mem_ms or 0:.1f}, "
                     f"compute {st.compute_ms or 0:.1f})")
    lines += deployment_lines(r)
    for n in r.notes or ():
        lines.append(f"  note: {n}")
    for g in r.gpu_choice or ():
        cost = f"${g.usd_per_hour:.2f}/h  goodput {g.goodput_req_s:.2f} req/s on {g.gpus} GPUs" \
            if g.status == "ok" else "infeasible"
        lines.append(f"  gpu {g.gpu} (${g.usd_per_gpu_hour:g}/GPU-h): {cost}: {g.why}")
    pareto = r.pareto or ()
    if len(pareto) > 1:
        lines.append("  cost/goodput front (" + "; ".join(
            f"{x.gpus} GPUs ${x.usd_per_hour:.0f}/h {x.goodput_req_s:.1f} req/s {x.evidence}"
            for x in pareto[:6]) + ")")
    v = r.verification
    if v.outcomes:
        o = v.outcomes
        lines.append(f"  simulator race: {v.simulations} simulations; {o.get('verified', 0)} configs verified, "
                     + ", ".join(f"{o[k]} {k.replace('_', ' ')}" for k in ("beaten", "pruned", "zero_load", "never_fits") if o.get(k)))
    eng = r.engine or "vllm"
    launch = (r.launch or {}).get(eng)
    if isinstance(launch, dict):  # TensorRT-LLM: a command and its config file
        launch = launch.get("command")
    lines.append(f"Launch ({_ENGINE_LABEL.get(eng, eng)}):")
    if launch:
        lines.append("  " + launch.replace("\n", "\n  "))
        lines.append("  (the other engines' settings and a Kubernetes Deployment are in --json under 'launch')")
    else:
        lines.append(f"  no launch settings for {eng} in this build; the other engines' are in --json under 'launch'")
    if storage:
        lines.append(f"  study '{r.study_name}' in {storage}: browse with  optuna-dashboard {storage.replace('journal:', '')}")
    if r.report:
        lines.append(f"  report: {r.report}")
    return "\n".join(lines)


_ENGINE_LABEL = {"vllm": "vLLM", "sglang": "SGLang", "trtllm": "TensorRT-LLM", "llamacpp": "llama.cpp llama-server"}


def _cfg(p: dict[str, Any]) -> str:
    return f"{p.get('layout') or 'TP' + str(p['tp'])} batch {p['batch_cap']} KV {p['kv_dtype']} k {p['spec_k']} chunk {p['chunk_tokens']}"


COMMANDS = [solve_cmd]
