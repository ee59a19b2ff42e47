"""``kvtune tune``: simulate everything, measure the few configs that matter on the live engine,
feed the measurements back, stop when the measured pick keeps its promise (DESIGN.md "The
measured loop"; issue 21).

A round:
1. **Solve in simulation** (``optimizer.solve.solve``, the very search ``kvtune solve`` runs: every
   kind of deployment the workload and engine allow) under the session's calibration: the pick and
   its promise, the per-replica goodput the simulator predicts. What the live engine cannot run is
   refused with the reason (``check_tunable``: several GPU types; a disaggregated pick).
2. **Measure what matters**: the pick, open loop, at ``pick_multipliers`` x its promise (0.8x,
   1.0x, 1.2x the first time a config is the pick; 1.0x after) plus the check at 1.3x, and the
   ``near`` configs the simulator ranks next at 1.0x, each on its own engine start
   (``optimizer.adapters``), each start opened by a short closed-loop speed probe. The very
   requests the simulator draws for that rate (``optimizer.loadgen``), and the simulator's own
   prediction for those requests beside every measurement. With no calibration to start from, a
   small closed-loop profile grid comes first.
3. **Check**: the pick keeps its promise when its measured attainment at 1.0x is at least the
   target, and the promise is tight when the 1.3x run misses. Both: done, the pick is
   ``measured``.
4. **Feed back**: otherwise refit the calibration (``optimizer.calibrate``) on everything measured
   this session since the machine last drifted (the probes measure the same point at every engine
   start: ``loadgen.drift`` flags two beyond noise, and the fit never spans a drift) and go to 1.

The budget (real runs, engine wall time) is checked before every run; the whole session's jobs
live in the optuna storage (``optimizer.tune_store``): resumable, and shareable by several
machines each with its own engine.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import os
import platform
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from kvtune import __version__
from kvtune.costmodel.errors import Infeasible, InputError, KvtuneError
from kvtune.costmodel.fit import FitResult, RowPredictor
from kvtune.costmodel.profile_table import ProfileRow, read_table
from kvtune.costmodel.request_log import read_request_log

from .adapters import Adapter, RunningEngine
from .adapters.errors import EngineError
from .importers import Metadata, latency_summary, rows_to_csv
from .output import write_atomic
from .result import DisaggregatedRecommendation
from .solve import SolveOptions, solve
from .tune_records import CONFIG_KEYS, JobRecord, RoundRecord, RunRecord, TuneResult, config_id
from .tune_store import TuneStore
from .launch import HOMES
from .search import SolveContext, lattice
from .layouts import gpus_per_replica
from .verify import verify_config, sim_config
from .launch.pick import build_pick
from kvtune.costmodel.hardware import resolve_gpu
from kvtune.costmodel.models import get_model
from .profile_run import RunSpec, run_profile
from kvtune.costmodel.goodput import goodput
from .loadgen import OpenLoopPlan, run_open_loop, drift
from kvtune.costmodel.simulate import simulate
from kvtune.costmodel.closed_loop import STAGGERED_ENGINES
from .calibrate import calibrate, calibration_dict, calibration_yaml, resolve_base
from .validate import predictable

__all__ = ["TuneSettings", "Tuner", "tune", "settings_digest", "max_request_tokens", "check_tunable"]

CHECK_MULTIPLIER = 1.3          # the promise is tight when the pick misses at this many times it
PROBE_OUTPUT_TOKENS = 16        # the speed probe: concurrency 1, the workload's mean prompt, 16 tokens out
WARMUP_FRAC = 0.1               # of a run's requests, left out (costmodel.simulate.default_warmup_frac)
# The grid's prompts: a quarter of the mean, the mean, and the workload's long prompts (its 95th
# percentile, drawn from GRID_LONG_DRAW requests) where they are over 1.5x the mean. Closed-loop points at
# the mean alone cannot see decode attention or the cost of a step carrying a long prefill: on the
# live llama-server (bench/RESULTS-overload.md) round 1's 1.3x run, predicted from a grid without the long
# prompts, was 17% low in TTFT p50, 9% with them.
GRID_LONG_QUANTILE = 0.95
GRID_LONG_RATIO = 1.5
GRID_LONG_DRAW = 2000
# The promise is the rate a run is predicted to meet the target at with this many binomial standard
# errors of the run's attainment to spare: promised at the crossing itself, half the runs there
# would miss by chance (n = 60 at a 0.9 target: one standard error is 0.039).
PROMISE_MARGIN_SE = 1.0
MAX_RUN_FACTOR = 3.0            # a run at a low rate may last this many times --run-s, fewer requests then
MIN_RUN_REQUESTS = 10           # counted requests below which a run says too little to be made
PROMISES = ("steady", "run")    # what a promise means: the steady state, or a run of --run-s from an empty queue


@dataclass(frozen=True)
class TuneSettings:
    """What the loop measures and when it stops (``kvtune tune``'s flags)."""

    calibration: str | None = None      # where the model starts: a file, a shipped name, 'ideal'; None: a grid first
    max_runs: int = 40                  # real load runs (open-loop runs, probes and grid points)
    max_engine_s: float = 1200.0        # engine wall time, start to stop, summed
    run_s: float = 60.0                 # seconds of arrivals per open-loop run
    min_requests: int = 40
    max_requests: int = 600
    warmup: int = 4                     # first requests of a run, left out of every statistic
    pick_multipliers: tuple[float, ...] = (0.8, 1.0, 1.2)
    check_multiplier: float = CHECK_MULTIPLIER
    near: int = 2
    max_rounds: int = 5
    seed: int = 0
    request_timeout_s: float | None = None  # None: 4x the longest request's SLO budget, within 10-300 s
    grid: bool | None = None            # None: a grid exactly when no calibration is given
    probe_requests: int = 4
    grid_requests: int = 6
    max_nfev: int = 40
    # run: the goodput a run of --run-s seconds meets from an empty queue (every run reports its
    # TTFT trend); steady: the steady-state goodput (solve's, robust to the draw), measured on runs as
    # long as the simulator says a queue at the check rate takes to show (within the budget), kept
    # only where TTFT does not rise through the 1.0x run
    promise: str = "run"

    def __post_init__(self) -> None:
        if self.max_runs < 1:
            raise InputError(f"--max-runs {self.max_runs}: a budget of zero runs measures nothing; give >= 1")
        if not self.max_engine_s > 0:
            raise InputError(f"--max-engine-s {self.max_engine_s:g}: a budget of zero engine time measures nothing")
        if not self.run_s > 0:
            raise InputError(f"--run-s {self.run_s:g}: must be > 0")
        if not 1 <= self.min_requests <= self.max_requests:
            raise InputError(f"--min-requests {self.min_requests} / --max-requests {self.max_requests}: "
                             f"need 1 <= min <= max")
        if self.warmup < 0 or self.warmup >= self.min_requests:
            raise InputError(f"--warmup {self.warmup}: must be in 0..{self.min_requests - 1} (below --min-requests)")
        if not self.pick_multipliers or any(not m > 0 for m in self.pick_multipliers) or 1.0 not in self.pick_multipliers:
            raise InputError(f"--rates {','.join(f'{m:g}' for m in self.pick_multipliers)}: positive multipliers of the "
                             f"promise, 1 among them")
        if not self.check_multiplier > 1:
            raise InputError(f"--check {self.check_multiplier:g}: must be > 1 (a rate above the promise)")
        if self.request_timeout_s is not None and not self.request_timeout_s > 0:
            raise InputError(f"--request-timeout-s {self.request_timeout_s:g}: must be > 0")
        if self.near < 0 or self.max_rounds < 1:
            raise InputError("--near must be >= 0 and --max-rounds >= 1")
        if self.promise not in PROMISES:
            raise InputError(f"--promise must be one of {', '.join(PROMISES)}, got {self.promise!r}")

    def decides(self) -> dict[str, Any]:
        """The settings that decide what is measured (the study's digest; budgets may change on resume)."""
        d = dataclasses.asdict(self)
        for k in ("max_runs", "max_engine_s", "max_rounds", "request_timeout_s"):
            d.pop(k)
        return d


def settings_digest(spec, settings: TuneSettings, engine: str, extra: dict[str, Any]) -> str:
    blob = json.dumps({"workload": spec.to_dict(), "settings": settings.decides(), "engine": engine, **extra},
                      sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def max_request_tokens(spec, context_limit: int | None = None) -> int:
    """The longest prompt + output the workload can send: the classes' bounds where finite, else
    1.5 x the longest of 4,000 draws (a trace: its longest)."""
    req = spec.requests(4000, spec.search.seed)
    longest = int((req.input_tokens + req.output_tokens).max())
    wl = spec.workload
    if wl.trace is None and wl.classes:
        ub = max(c.input_tokens.upper_bound + c.output_tokens.upper_bound for c in wl.classes)
        longest = int(ub) if math.isfinite(ub) else int(longest * 1.5)
    return min(longest, context_limit) if context_limit else longest


def request_timeout_s(spec) -> float:
    """How long a request may wait for its next byte: 4x the longest request's SLO budget (TTFT +
    output x TPOT), within 10-300 s. A request queued that long has missed its SLO many times over;
    giving up on it lets an overloaded run end (the engines cancel a request whose client left)."""
    req = spec.requests(2000, spec.search.seed)
    budget = float(((req.ttft_slo_s + req.output_tokens * req.tpot_slo_s)[np.isfinite(req.ttft_slo_s)]).max()
                   if np.isfinite(req.ttft_slo_s).any() else 75.0)
    return float(min(300.0, max(10.0, 4 * budget)))


def _machine() -> dict[str, Any]:
    cpu = platform.processor() or ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {"host": socket.gethostname(), "cpu": cpu, "logical_cpus": os.cpu_count(), "platform": platform.platform()}


# the terms a drift of the machine's speed moves, in the order a refit on few runs takes them:
# decode reads (TPOT), prefill arithmetic (TTFT), then the fixed per-step and per-prefill costs
RESCALE_PARAMS = ("bw_efficiency", "prefill_flops_efficiency", "step_overhead_s", "prefill_overhead_s",
                  "decode_flops_efficiency")


def grid_prompts(spec, seed: int) -> list[int]:
    """The profile grid's prompt lengths: a quarter of the workload's mean, the mean, and its
    95th-percentile prompt (``GRID_LONG_QUANTILE``) where that is over ``GRID_LONG_RATIO`` x the mean."""
    isl = max(1, int(round(spec.workload.mean_input_tokens)))
    long = int(np.percentile(spec.requests(GRID_LONG_DRAW, seed).input_tokens, 100 * GRID_LONG_QUANTILE))
    return sorted({max(1, isl // 4), isl} | ({long} if long > GRID_LONG_RATIO * isl else set()))


def _ms(v) -> str:
    return "-" if v is None else f"{v:.0f} ms"


def _loadavg() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except (OSError, AttributeError):
        return None


class BudgetSpent(Exception):
    """The next run would exceed the budget."""


class Unmeasurable(Exception):
    """A promised rate so low that a run of it would outlast ``MAX_RUN_FACTOR`` x ``run_s``."""


class Tuner:
    """One ``kvtune tune`` session (module docstring). ``run()`` returns the ``TuneResult``."""

    def __init__(self, spec, adapter: Adapter, settings: TuneSettings, store: TuneStore, workdir: Path,
                 log: Callable[[str], None] = lambda s: None, threads: int | None = None):
        self.spec, self.adapter, self.s, self.store = spec, adapter, settings, store
        self.workdir = Path(workdir)
        (self.workdir / "requests").mkdir(parents=True, exist_ok=True)
        self.log, self.threads = log, threads
        self.engine = adapter.engine if adapter.engine in HOMES else (spec.engine or "")
        self.jobs: dict[str, JobRecord] = {}
        self.rounds: list[RoundRecord] = []
        self.drift: list[str] = []
        self.notes: list[str] = []
        self.machine = _machine()
        self.calibration = settings.calibration        # what the next round solves with
        self.cal_label = settings.calibration or "none"
        self.fit_report: dict[str, Any] = {}
        self.timeout_s = settings.request_timeout_s or request_timeout_s(spec)
        self._partial: list[JobRecord] = []   # jobs the budget cut short (reported, not stored)
        self._secs: dict[str, float] = {}     # the round's run length per config (steady-state promises)
        self._promises: dict[tuple, float] = {}   # _promise per (calibration, config, steady state)

    # ---- budget ---------------------------------------------------------------------------------
    @property
    def runs_used(self) -> int:
        return sum(len(j.runs) for j in (*self.jobs.values(), *self._partial))

    @property
    def engine_s_used(self) -> float:
        return sum(j.engine_s for j in (*self.jobs.values(), *self._partial))

    def _spend(self, engine_s_now: float, runs_now: int) -> None:
        """Raise ``BudgetSpent`` if one more run would exceed the budget (``*_now``: the job on now)."""
        if self.runs_used + runs_now >= self.s.max_runs:
            raise BudgetSpent(f"the run budget ({self.s.max_runs} runs) is spent")
        if self.engine_s_used + engine_s_now >= self.s.max_engine_s:
            raise BudgetSpent(f"the engine-time budget ({self.s.max_engine_s:g} s of engine time) is spent")

    # ---- the loop -------------------------------------------------------------------------------
    def run(self) -> TuneResult:
        self.jobs.update(self.store.done())
        status, reason = "rounds", f"no pick kept its promise within {self.s.max_rounds} rounds"
        n = 0
        try:
            gridded = False
            if self.s.grid if self.s.grid is not None else self.calibration is None:
                self._grid()
                gridded = True
            while n < self.s.max_rounds:
                n += 1
                try:
                    rnd = self._round(n)
                except Infeasible as exc:
                    if gridded:
                        raise
                    # the model says nothing meets: measure before believing it (a wrong calibration)
                    self.log(f"round {n}: {exc}; measuring a profile grid before believing it")
                    self._grid()
                    gridded, n = True, n - 1
                    continue
                self.rounds.append(rnd)
                if rnd.meets and rnd.tight:
                    what = "its steady-state promise, with no rise of TTFT through the run," \
                        if self.s.promise == "steady" else "its promised rate"
                    status, reason = "converged", (f"round {n}: the pick met the SLOs at {what} and missed "
                                                   f"at {self.s.check_multiplier:g}x (measured)")
                    self._refit(n)
                    break
                self._refit(n)
        except (BudgetSpent, Unmeasurable) as exc:
            status, reason = ("budget" if isinstance(exc, BudgetSpent) else "unmeasurable"), str(exc)
            with contextlib.suppress(KvtuneError):
                self._refit(n)   # the round cut short: its finished jobs count
        except Infeasible as exc:
            status, reason = "infeasible", str(exc)
        return self._result(status, reason)

    # ---- solving --------------------------------------------------------------------------------
    def _solve(self):
        cal = self.calibration or "ideal"
        res = solve(self.spec, SolveOptions(calibration=cal, engine=self.engine or None))
        if res.status != "ok" or res.recommendation is None or res.predicted is None:
            raise Infeasible(f"no configuration meets the SLOs in simulation (calibration {self.cal_label}): "
                             f"{res.reason}")
        if isinstance(res.recommendation, DisaggregatedRecommendation):
            raise InputError(f"{self.spec.path}: the simulator's pick is a disaggregated deployment "
                             f"({res.recommendation.prefill.replicas} prefill + {res.recommendation.decode.replicas} "
                             f"decode replicas), and kvtune tune measures one aggregated engine; to tune the best "
                             f"aggregated deployment, set search.deployment: [aggregated]")
        return res

    def _context(self):
        return SolveContext.build(self.spec, None, self.calibration or "ideal", self.engine or None)

    def _candidates(self, n: int, res, ctx) -> list[tuple[str, dict, float]]:
        """(role, config, steady-state goodput): the pick, then up to ``near`` configs the simulator
        ranks next (per-replica goodput per GPU) that this adapter can run and no earlier round
        measured. A server you launched (``--url``) runs one config: when it is not the simulator's
        pick, the best verified config it runs is measured as the pick, else its own config."""
        rec = res.recommendation
        pick = {k: getattr(rec, k) for k in CONFIG_KEYS}
        ranked = [({k: v.config[k] for k in CONFIG_KEYS}, float(v.per_replica_goodput_req_s))
                  for v in sorted((v for v in res.verified if v.feasible and v.per_replica_goodput_req_s > 0),
                                  key=lambda v: -v.per_replica_goodput_req_s / gpus_per_replica(v.config))]
        out = [("pick", pick, float(res.predicted.per_replica_goodput_req_s))]
        why = self.adapter.why_not(self._pick(ctx, pick))
        if why:
            runnable = [(c, g) for c, g in ranked if self.adapter.why_not(self._pick(ctx, c)) is None]
            if not runnable:
                runnable = [self._own_config(ctx, pick)]
            self.log(f"round {n}: the simulator's pick {config_id(pick)} is not what {self.adapter.describe()} runs "
                     f"({why}); measuring {config_id(runnable[0][0])} as the pick")
            self.notes.append(f"round {n}: the simulator's pick {config_id(pick)} was not measured ({why})")
            out = [("pick", *runnable[0])]
        # told apart at the rates the pick is measured at: its promise and the check
        at = out[0][2] if self.s.promise == "steady" or not self.s.near else self._promise(ctx, out[0][1], out[0][2])
        rates = (at, self.s.check_multiplier * at)
        tell_apart = self.s.near > 0 and all(math.isfinite(r) and r > 0 for r in rates)
        kept = [(out[0][1], self._behaviour(ctx, out[0][1], rates))] if tell_apart else []
        for cfg, g in ranked:
            if len(out) > self.s.near:
                break
            if cfg == out[0][1] or self._seen(cfg, n):
                continue
            if self.adapter.why_not(self._pick(ctx, cfg)) is None:
                seen = self._behaviour(ctx, cfg, rates) if tell_apart else []
                twin = next((c for c, b in kept if _scheduling_only(c, cfg) and _same_behaviour(b, seen)),
                            None) if tell_apart else None
                if twin is not None:   # a run of it would measure the twin again (issue 33.4)
                    self.log(f"round {n}: not measuring {config_id(cfg)} near the pick: the simulator schedules "
                             f"the workload's requests exactly as {config_id(twin)} at {rates[0]:.3g} and "
                             f"{rates[1]:.3g} req/s (simulated)")
                    continue
                kept.append((cfg, seen))
                out.append(("near", cfg, g))
        return out

    def _behaviour(self, ctx, cfg: dict, rates: tuple[float, ...]) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per request, TTFT and end-to-end time the simulator gives ``cfg`` on the workload's own
        draw of a run at each rate (the pick's promise and its check): two configs with equal arrays schedule every request alike
        (a chunk budget above every step's tokens, a cap above what the pool admits), and a run
        of one measures the other."""
        out = []
        for rate in rates:
            res = self._simulate(ctx, cfg, self.spec.requests(self._n_requests(rate), self.s.seed, rate_req_s=rate))
            out.append((res.ttft_s, res.e2e_s))
        return out

    def _own_config(self, ctx, like: dict) -> tuple[dict, float]:
        """The config a server you launched runs (its slots and chunk budget, the rest as ``like``)
        and its simulated steady-state goodput."""
        rep = getattr(self.adapter, "report", None)
        cfg = dict(like, batch_cap=getattr(rep, "slots", None) or like["batch_cap"],
                   chunk_tokens=getattr(rep, "chunk_tokens", None) or like["chunk_tokens"])
        why = self.adapter.why_not(self._pick(ctx, cfg))
        if why:
            raise Infeasible(f"no config kvtune can simulate matches the server ({why})")
        v = verify_config(ctx, cfg)
        if not v.per_replica_goodput_req_s > 0:
            raise Infeasible(f"the config the server runs, {config_id(cfg)}, meets the SLOs at no rate in simulation "
                             f"(calibration {self.cal_label}): {v.reason}")
        return cfg, float(v.per_replica_goodput_req_s)

    def _seen(self, cfg: dict, n: int, role: str | None = None) -> bool:
        """Measured in a round before ``n`` (as ``role``): what the storage holds of round ``n`` itself
        must not change what round ``n`` measures, or a resumed tune would measure other things."""
        return any(j.config == cfg and 0 < j.round < n and (role is None or j.role == role) for j in self.jobs.values())

    def _pick(self, ctx, cfg: dict):
        s = self.spec.speculative
        return build_pick(ctx.model.hf_id or self.spec.model, cfg, 1, self.spec.gpu_mem_util,
                          {"method": s.method, "draft_model": s.draft_model} if s else None, arch=ctx.model,
                          gpu=ctx.gpu, weights=self.spec.weights, activation_reserve_bytes=ctx.eff.activation_reserve_bytes,
                          gpus_per_node=self.spec.hardware.gpus_per_node,
                          max_request_tokens=max_request_tokens(self.spec, ctx.model.max_context_tokens or None),
                          checkpoint=self.spec.checkpoint)

    def _round(self, n: int) -> RoundRecord:
        ctx = self._context()
        res = self._solve()
        steady = self._candidates(n, res, ctx)
        if self.s.promise == "steady":
            cands = steady
            secs = {config_id(cfg): self._run_seconds(ctx, cfg, g) for _, cfg, g in cands}
        else:
            cands = [(role, cfg, self._promise(ctx, cfg, g)) for role, cfg, g in steady]
            secs = {}
        role, pick, promise = cands[0]
        what = (f", the steady state (simulated, calibration {self.cal_label}), measured on runs of "
                f"{secs[config_id(pick)]:.0f} s" if self.s.promise == "steady" else
                f" for runs of {self.s.run_s:g} s (steady state {steady[0][2]:.3g} req/s; simulated, calibration "
                f"{self.cal_label})")
        self.log(f"round {n}: pick {config_id(pick)}, promise {promise:.3g} req/s per replica{what}"
                 + "".join(f"; near {config_id(c)} {g:.3g} req/s" for _, c, g in cands[1:]))
        self._secs = secs
        todo = []
        for role, cfg, g in cands:
            if role == "pick":
                mults = (1.0,) if self._seen(cfg, n, "pick") else tuple(sorted(set(self.s.pick_multipliers)))
                mults = tuple(sorted(set(mults) | {self.s.check_multiplier}))
            else:
                mults = (1.0,)
            todo.append((f"r{n}:{config_id(cfg)}", role, cfg, g, mults))
        keys = [t[0] for t in todo]
        for key in keys:
            if key in self.jobs:
                self.log(f"  {key}: measured before, read from the storage")
        for _ in range(3):    # jobs another process held and dropped (it died) are measured here
            for key, role, cfg, g, mults in todo:
                if key not in self.jobs:
                    self._job(key, n, role, cfg, g, mults, ctx)
            self.jobs.update(self.store.wait([k for k in keys if k not in self.jobs]))
            if all(k in self.jobs for k in keys):
                break
        pj = self.jobs.get(keys[0])
        if pj is not None and pj.promise_req_s is not None and not math.isclose(pj.promise_req_s, promise, rel_tol=1e-6):
            # measured before (a resumed session) at the promise its round made then: the runs are at
            # multiples of that rate, so it is the round's promise
            self.log(f"  {keys[0]}: measured at a promise of {pj.promise_req_s:.3g} req/s per replica "
                     f"(calibration {pj.calibration}); the round's promise is the measured one")
            promise = pj.promise_req_s
        at1 = pj.run_at(1.0) if pj else None
        atc = pj.run_at(self.s.check_multiplier) if pj else None
        target = self.spec.slo.attainment
        rising = self.s.promise == "steady" and at1 is not None and (at1.ttft_trend or {}).get("rising", False)
        meets = None if at1 is None or at1.attainment is None else at1.attainment["value"] >= target and not rising
        tight = None if atc is None or atc.attainment is None else atc.attainment["value"] < target
        return RoundRecord(round=n, calibration=self.cal_label, pick=pick, promise_req_s=promise, jobs=tuple(keys),
                           meets=meets, tight=tight, steady_state_req_s=steady[0][2])

    # ---- jobs: one engine start ------------------------------------------------------------------
    def _job(self, key: str, n: int, role: str, cfg: dict, promise: float, mults: tuple[float, ...], ctx) -> None:
        if not self.store.claim(key):
            self.log(f"  {key}: measured by another process on this storage")
            return
        pick = self._pick(ctx, cfg)
        runs: list[RunRecord] = []
        t0 = time.monotonic()
        launch, report = "", {}
        try:
            self._spend(0.0, 0)
            with self.adapter.running(pick) as eng:
                launch, report = eng.launch_line, eng.report.to_json()
                self.log(f"  {key}: {role} up ({eng.url}); launch line measured:\n    "
                         + (launch.replace("\n", "\n    ") if launch else "(your server)"))
                runs.append(self._probe(key, eng, cfg, time.monotonic() - t0, len(runs)))
                for m in mults:
                    runs.append(self._open(key, eng, cfg, m, promise, ctx, time.monotonic() - t0, len(runs)))
        except (BudgetSpent, Unmeasurable) as exc:
            # given back, not stored: a session resumed with more budget measures the job whole
            self.store.release(key, str(exc))
            self._partial.append(JobRecord(key=key, round=n, role=role, config=dict(cfg), promise_req_s=promise,
                                           calibration=self.cal_label, launch_line=launch, engine=report,
                                           host=self.machine["host"], engine_s=round(time.monotonic() - t0, 2),
                                           runs=tuple(runs), status="budget", error=str(exc), pid=os.getpid()))
            raise
        except EngineError as exc:
            if role != "near":
                self.store.release(key, f"{type(exc).__name__}: {exc}")
                raise
            # a config beside the pick that would not start as planned, or failed: the round's answer is
            # the pick's, so it is recorded as failed (not retried) and the session goes on
            self.log(f"  {key}: near config not measured: {exc}")
            self.notes.append(f"round {n}: near config {config_id(cfg)} not measured: {exc}")
            job = JobRecord(key=key, round=n, role=role, config=dict(cfg), promise_req_s=promise,
                            calibration=self.cal_label, launch_line=launch, engine=report, host=self.machine["host"],
                            engine_s=round(time.monotonic() - t0, 2), runs=tuple(runs), status="failed",
                            error=str(exc), pid=os.getpid())
            self.store.finish(job)
            self.jobs[key] = job
            return
        except BaseException as exc:
            self.store.release(key, f"{type(exc).__name__}: {exc}")
            raise
        job = JobRecord(key=key, round=n, role=role, config=dict(cfg), promise_req_s=promise,
                        calibration=self.cal_label, launch_line=launch, engine=report, host=self.machine["host"],
                        engine_s=round(time.monotonic() - t0, 2), runs=tuple(runs), pid=os.getpid())
        self.store.finish(job)
        self.jobs[key] = job

    def _meta(self, eng: RunningEngine, cfg: dict, key: str) -> Metadata:
        gpu = resolve_gpu(self.spec.hardware.gpu, self.spec.hardware.gpu_file)
        model = get_model(self.spec.model).name
        return Metadata(model=model, gpu=gpu.name, tp=int(cfg["tp"]), engine=self.engine or eng.report.engine or None,
                        engine_version=eng.report.version or None, weight_dtype=self.spec.weights,
                        kv_dtype=str(cfg["kv_dtype"]), source=f"kvtune tune {self.machine['host']} {key}")

    def _row_fix(self, row: ProfileRow, eng: RunningEngine, cfg: dict, **kw) -> ProfileRow:
        """What the adapter read back wins over the load driver's generic probe (llama.cpp's pool
        with -kvu is its whole buffer, not slots x /props' n_ctx)."""
        return dataclasses.replace(row, kv_pool_tokens=eng.report.pool_tokens or row.kv_pool_tokens,
                                   chunk_tokens=int(cfg["chunk_tokens"]), threads=eng.report.threads or self.threads,
                                   **kw)

    def _probe(self, key: str, eng: RunningEngine, cfg: dict, engine_s: float, runs_now: int) -> RunRecord:
        """Concurrency 1, the workload's mean prompt, ``PROBE_OUTPUT_TOKENS`` out: the same point at
        every engine start (no batch cap or pool in its row: one request never meets either), so
        ``loadgen.drift`` sees the machine's speed move."""
        self._spend(engine_s, runs_now)
        isl = max(1, int(round(self.spec.workload.mean_input_tokens)))
        t0, load0 = time.monotonic(), _loadavg()
        rows, _ = run_profile(RunSpec(eng.url, eng.served_model, (1,), (isl,), (PROBE_OUTPUT_TOKENS,),
                                      requests_per_point=self.s.probe_requests, seed=self.s.seed,
                                      timeout_s=self.timeout_s, warmup_requests=1, api_key=eng.api_key, api=eng.api),
                              self._meta(eng, cfg, key), id_prefix=f"{key}:probe")
        load = _mean_load(load0, _loadavg())
        row = dataclasses.replace(rows[0], id=f"{key}:probe", batch_cap=None, kv_pool_tokens=None, chunk_tokens=None,
                                  threads=eng.report.threads or self.threads, loadavg_1m=load)
        self.log(f"    probe: TTFT {row.ttft_mean_ms:.0f} ms, TPOT {row.tpot_mean_ms or 0:.1f} ms at concurrency 1 "
                 f"(measured, loadavg {load})")
        return RunRecord(key=row.id, kind="probe", multiplier=None, rate_req_s=None, n_requests=self.s.probe_requests,
                         warmup=1, started_at=row.date, duration_s=round(time.monotonic() - t0, 2),
                         loadavg_1m=load, table_csv=rows_to_csv([row]))

    def _n_requests(self, rate: float, secs: float | None = None) -> int:
        """Requests in a run at ``rate``: ``run_s`` of arrivals within [min, max], but no more than
        ``MAX_RUN_FACTOR`` x ``run_s`` of arrivals (a low rate), plus its warm-up; with ``secs``
        (a steady-state promise's runs), ``secs`` of arrivals within [min, max]."""
        return self._counted(rate, secs) + self._warmup(self._counted(rate, secs))

    def _counted(self, rate: float, secs: float | None = None) -> int:
        if secs is not None:
            return int(min(self.s.max_requests, max(self.s.min_requests, math.ceil(rate * secs))))
        n = int(min(self.s.max_requests, max(self.s.min_requests, math.ceil(rate * self.s.run_s))))
        return max(1, min(n, math.floor(rate * MAX_RUN_FACTOR * self.s.run_s)))

    def _run_seconds(self, ctx, cfg: dict, steady_req_s: float) -> float:
        """Seconds of arrivals for the runs of a steady-state promise: the shortest of ``run_s``,
        2 x ``run_s``, 4 x ... at which the simulator's run at the check rate (``check_multiplier`` x
        the promise, the workload's own draw, warm-up excluded) misses the target: a run that long
        lets a queue that grows at the check rate show, so the 1.0x run holding is evidence of a
        steady state, not of an empty queue at the start. Capped where the check run reaches
        ``max_requests`` (the log says the check may not miss within it)."""
        target = self.spec.slo.attainment
        rate = self.s.check_multiplier * steady_req_s
        if not (math.isfinite(rate) and rate > 0):
            return self.s.run_s
        # the pick's runs (its multipliers and the check; a low rate's run lasts until its --min-requests
        # have arrived) and one near config's run must fit 0.8 of the engine time left: a run length the
        # budget cannot hold measures nothing
        mults = sorted(set(self.s.pick_multipliers) | {self.s.check_multiplier}) + [1.0] * self.s.near
        room_s = 0.8 * (self.s.max_engine_s - self.engine_s_used)

        def engine_s(secs: float) -> float:
            return sum(self._n_requests(m * steady_req_s, secs) / (m * steady_req_s) for m in mults)
        secs = self.s.run_s
        while True:
            if secs > self.s.run_s and engine_s(secs) > room_s:
                self.log(f"  {config_id(cfg)}: the simulator's {self.s.check_multiplier:g}x run still meets the "
                         f"target after {secs / 2:.0f} s of arrivals; the engine-time budget holds no longer runs: "
                         f"the check may not miss within a run (simulated)")
                return secs / 2
            n = self._n_requests(rate, secs)
            res = self._simulate(ctx, cfg, self.spec.requests(n, self.s.seed, rate_req_s=rate),
                                 (n - self._counted(rate, secs)) / n)
            if res.slo_attainment < target:
                return secs
            if self._counted(rate, secs) >= self.s.max_requests:
                self.log(f"  {config_id(cfg)}: the simulator's {self.s.check_multiplier:g}x run still meets the "
                         f"target after --max-requests {self.s.max_requests} ({secs:.0f} s of arrivals): the check "
                         f"may not miss within a run (simulated)")
                return secs
            secs *= 2

    def _warmup(self, n: int) -> int:
        """The simulator's warm-up share (10%), at least ``warmup`` requests."""
        return max(self.s.warmup, math.ceil(WARMUP_FRAC * n))

    def _promise(self, ctx, cfg: dict, steady_req_s: float) -> float:
        """The per-replica goodput the simulator predicts for runs like the ones measured: ``run_s``
        of Poisson arrivals of the workload's requests (``_n_requests``), warm-up excluded. A
        finite run sees less queueing than the steady state (solve's goodput, over >= 1,000
        requests): promising the steady state on runs of a minute would leave the 1.3x check
        meeting for want of time for the queue to build, not because the model is wrong."""
        memo = (self.cal_label, config_id(cfg), steady_req_s)   # _candidates asks for the pick's first
        if memo in self._promises:
            return self._promises[memo]

        def make(rate: float, n: int, seed: int):
            return self.spec.requests(self._n_requests(rate) if math.isfinite(rate) else self.s.max_requests, seed,
                                      rate_req_s=rate)

        n = self._n_requests(steady_req_s)
        g = goodput(ctx.fitting_step(cfg), make, sim_config(ctx, cfg), self.promise_attainment(n),
                    n_requests=n, seed=self.s.seed, rel_tol=0.01, warmup_frac=WARMUP_FRAC, guess_req_s=steady_req_s)
        self._promises[memo] = float(g.goodput_req_s) if g.goodput_req_s > 0 else steady_req_s
        return self._promises[memo]

    def promise_attainment(self, n: int) -> float:
        """The attainment a promise is simulated at: the target plus ``PROMISE_MARGIN_SE`` standard
        errors of a run of ``n`` requests (capped below 1)."""
        a = self.spec.slo.attainment
        counted = max(1, n - self._warmup(n))
        return min(max(a, 1 - 0.5 / counted), a + PROMISE_MARGIN_SE * math.sqrt(a * (1 - a) / counted))

    def _open(self, key: str, eng: RunningEngine, cfg: dict, mult: float, promise: float, ctx,
              engine_s: float, runs_now: int) -> RunRecord:
        self._spend(engine_s, runs_now)
        rate = mult * promise
        secs = self._secs.get(config_id(cfg))
        n = self._n_requests(rate, secs)
        warm = n - self._counted(rate, secs)
        if n - warm < MIN_RUN_REQUESTS:
            raise Unmeasurable(f"{config_id(cfg)}'s promise at {mult:g}x, {rate:.3g} req/s, is too low to measure: "
                               f"{MIN_RUN_REQUESTS} requests would take {MIN_RUN_REQUESTS / rate:.0f} s, more than "
                               f"{MAX_RUN_FACTOR:g} x --run-s; the SLOs are at this machine's limit (is it loaded?)")
        if self.engine_s_used + engine_s + n / rate > self.s.max_engine_s:
            raise BudgetSpent(f"the engine-time budget ({self.s.max_engine_s:g} s) has no room for the next run "
                              f"(about {n / rate:.0f} s)")
        plan = OpenLoopPlan.from_workload(self.spec, rate, n, self.s.seed, warm)
        pred_att, pred = self._predict(ctx, cfg, plan)
        t0 = time.monotonic()
        rid = f"{key}:x{mult:g}"
        stop, allowed, misses = threading.Event(), math.floor((1 - self.spec.slo.attainment) * (n - warm) + 1e-9), [0]

        def progress(rec, done: int, total: int) -> None:
            """Stop sending once the run cannot reach the target: an overloaded engine drains slowly."""
            met = rec.ok and rec.ttft_ms is not None and rec.ttft_ms <= rec.ttft_slo_ms \
                and (rec.tpot_ms is None or rec.tpot_ms <= rec.tpot_slo_ms)
            if not rec.warmup and not met:
                misses[0] += 1
                if misses[0] > allowed:
                    stop.set()
        if not eng.wait_idle(self.timeout_s):   # the last run's abandoned requests, cancelled by now
            self.notes.append(f"{rid}: the engine was still busy {self.timeout_s:g} s after the previous run")
        run = run_open_loop(eng.endpoint(), eng.served_model, plan, timeout_s=self.timeout_s, stop=stop,
                            on_progress=progress)
        eng.check_alive()
        fname = "requests/" + rid.replace(":", "_") + ".csv"
        run.write_requests(self.workdir / fname)
        rep_att, rep = self._replay(ctx, cfg, self.workdir / fname)
        row = run.to_rows(self._meta(eng, cfg, key), fname, row_id=rid, threads=eng.report.threads or self.threads,
                          chunk_tokens=int(cfg["chunk_tokens"]))[0]
        row = self._row_fix(row, eng, cfg, batch_cap=int(cfg["batch_cap"]))
        att = run.attainment()
        pct = run.percentiles()
        load = run.load.mean_1m
        stopped = None if run.complete else stop_record(len(run.sent), n, n - warm, misses[0], allowed)
        trend = run.ttft_trend()
        if stopped is None:
            seen = f"attainment {att.value:.3f} [{att.lo:.3f}, {att.hi:.3f}] (measured, n={att.n}, " \
                   f"{att.warmup_excluded} warm-up excluded, loadavg {load:.2f})"
        else:   # the bound the misses proved, not the observed share of the few sent as an estimate
            seen = f"attainment at most {stopped['attainment_at_most']:.3f} (measured: {stopped['misses']} of " \
                   f"{stopped['counted_planned']} counted requests missed before the end, the target allows " \
                   f"{allowed}; stopped after {stopped['sent']} of {n} sent, {att.met} of {att.n} counted met, " \
                   f"loadavg {load:.2f})"
        replayed = "" if stopped is None or rep is None else \
            (f"; replayed on the {len(run.sent)} sent: TTFT p50 {_ms(rep['ttft_ms']['p50'])}, TPOT p50 "
             f"{_ms(rep['tpot_ms']['p50'])} (simulated) vs {_ms(pct['ttft_ms']['p50'])}, {_ms(pct['tpot_ms']['p50'])} "
             f"(measured)")
        self.log(f"    {mult:g}x = {rate:.3g} req/s: {seen}; predicted {pred_att:.3f} (simulated){replayed}"
                 + (f"; {len(run.failures)} failed" if run.failures else "")
                 + (f"; TTFT rose {trend['rise_ms']:.0f} ms through the run ({trend['slope_ms_per_s']:+.1f} ms/s, "
                    f"p {trend['p_value']:.3g}): the queue grew, not a steady state (measured)"
                    if trend and trend["rising"] else ""))
        return RunRecord(key=rid, kind="open", multiplier=mult, rate_req_s=rate, n_requests=n, warmup=warm,
                         started_at=run.started_at, duration_s=round(time.monotonic() - t0, 2),
                         loadavg_1m=round(load, 2) if math.isfinite(load) else None, table_csv=rows_to_csv([row]),
                         requests_file=fname, requests_csv=(self.workdir / fname).read_text(),
                         attainment=att.to_json(), measured={k: pct[k] for k in ("ttft_ms", "tpot_ms")},
                         offered_rate_req_s=run.offered_rate_req_s,
                         goodput_at_rate_req_s=None if stopped else run.offered_rate_req_s * att.value,
                         predicted_attainment=pred_att, predicted=pred, failed=len(run.failures), stopped=stopped,
                         ttft_trend=trend, replayed_attainment=rep_att, replayed=rep)

    def _simulate(self, ctx, cfg: dict, requests, warmup_frac: float | None = None):
        """``cfg`` under the round's calibration on ``requests`` at their own arrival times."""
        return simulate(ctx.fitting_step(cfg), requests, sim_config(ctx, cfg), arrival="trace", seed=self.s.seed,
                        warmup_frac=warmup_frac)

    def _predict(self, ctx, cfg: dict, plan) -> tuple[float, dict]:
        """The simulator on the run's own requests under the round's calibration."""
        res = self._simulate(ctx, cfg, plan.requests, plan.warmup / len(plan))
        summ = res.summary()
        return float(res.slo_attainment), {k: summ.get(k, {}) for k in ("ttft_ms", "tpot_ms")}

    def _replay(self, ctx, cfg: dict, log_path: Path) -> tuple[float | None, dict | None]:
        """The simulator on the requests the run really sent, at their send times: attainment over
        the counted ones, percentiles over the measured ones (the measured figures' own sets)."""
        log = read_request_log(log_path)
        if not len(log):
            return None, None
        res = self._simulate(ctx, cfg, log.to_requests(), 0.0)
        out: dict[str, dict] = {}
        for key, vals in (("ttft_ms", res.ttft_s), ("tpot_ms", res.tpot_s)):
            v = np.asarray(vals)[log.measured] * 1e3
            v = v[np.isfinite(v)]
            mean, p50, p90, p99 = latency_summary(v.tolist()) if len(v) else (None, None, None, None)
            out[key] = {"mean": mean, "p50": p50, "p90": p90, "p99": p99}
        met = np.asarray(res.met_slo)[log.counted]
        return (float(met.mean()) if len(met) else None), out

    # ---- the profile grid (no calibration yet) ---------------------------------------------------
    def _grid(self) -> None:
        key = "grid"
        if key in self.jobs or not self.store.claim(key):
            self.store.wait([key])
            self.jobs.update(self.store.done())
            self._refit(0)
            return
        s = self.spec.search
        caps = lattice(*s.batch_cap)
        cap = max(c for c in caps if c <= max(caps[0], 4))
        chunks = lattice(*s.chunk_tokens)
        cfg = {"tp": s.tp[0], "batch_cap": cap, "kv_dtype": s.kv_dtype[0], "spec_k": 0,
               "chunk_tokens": chunks[len(chunks) // 2]}
        ctx = self._context()
        osl = max(2, int(round(self.spec.workload.mean_output_tokens)))
        conc = tuple(sorted({1, cap}))
        prompts = grid_prompts(self.spec, self.s.seed)
        self.log(f"grid: closed-loop profile of {config_id(cfg)} at concurrency "
                 f"{','.join(map(str, conc))}, prompts {', '.join(map(str, prompts))}, {osl} tokens out")
        t0 = time.monotonic()
        runs: list[RunRecord] = []
        launch, report = "", {}
        try:
            with self.adapter.running(self._pick(ctx, cfg)) as eng:
                launch, report = eng.launch_line, eng.report.to_json()
                for c in conc:
                    for i in prompts:
                        self._spend(time.monotonic() - t0, len(runs))
                        l0, r0 = _loadavg(), time.monotonic()
                        rows, _ = run_profile(RunSpec(eng.url, eng.served_model, (c,), (i,), (osl,),
                                                      requests_per_point=max(self.s.grid_requests, c * 2),
                                                      seed=self.s.seed, timeout_s=self.timeout_s,
                                                      warmup_requests=1, api_key=eng.api_key, api=eng.api),
                                              self._meta(eng, cfg, key), id_prefix="grid")
                        load = _mean_load(l0, _loadavg())
                        row = self._row_fix(rows[0], eng, cfg, batch_cap=cap, loadavg_1m=load)
                        self.log(f"    concurrency {c}, prompt {i}: TTFT {row.ttft_mean_ms:.0f} ms, TPOT "
                                 f"{row.tpot_mean_ms or 0:.1f} ms (measured, loadavg {load})")
                        runs.append(RunRecord(key=row.id, kind="grid", multiplier=None, rate_req_s=None,
                                              n_requests=row.num_requests or 0, warmup=1, started_at=row.date,
                                              duration_s=round(time.monotonic() - r0, 2), loadavg_1m=load,
                                              table_csv=rows_to_csv([row])))
        except BaseException as exc:   # the budget too: a resumed session measures the grid whole
            self.store.release(key, f"{type(exc).__name__}: {exc}")
            raise
        finally:
            if key in self.store.held:
                job = JobRecord(key=key, round=0, role="grid", config=cfg, promise_req_s=None, calibration="none",
                                launch_line=launch, engine=report, host=self.machine["host"],
                                engine_s=round(time.monotonic() - t0, 2), runs=tuple(runs), pid=os.getpid())
                self.store.finish(job)
                self.jobs[key] = job
        self._refit(0)

    # ---- feeding back -----------------------------------------------------------------------------
    def _table(self) -> Path:
        """Every run of the session as one profile table (the per-request logs beside it)."""
        rows_csv = []
        for j in sorted(self.jobs.values(), key=lambda j: (j.round, j.key)):
            for r in j.runs:
                if r.requests_file and r.requests_csv:
                    p = self.workdir / r.requests_file
                    if not p.exists():
                        p.write_text(r.requests_csv)
                rows_csv.append(r.table_csv)
        header = rows_csv[0].splitlines()[0] if rows_csv else ""
        text = header + "\n" + "".join(line + "\n" for t in rows_csv for line in t.splitlines()[1:])
        path = self.workdir / "measured.csv"
        write_atomic(path, text)
        return path

    def rows(self) -> list[ProfileRow]:
        return read_table(self._table()) if any(j.runs for j in self.jobs.values()) else []

    def _epoch(self, rows: list[ProfileRow], upto: int) -> tuple[list[ProfileRow], list[str]]:
        """The rows of rounds up to ``upto`` measured since the machine last drifted, and the drift
        lines. The speed probes at each engine start (one host's, in order) are the same point
        measured again: where two in a row differ beyond noise (``loadgen.drift``), the fit starts at
        the later one's job. A resumed session's storage holds later rounds too: round n's fit is
        the one it had when it ran, so round n+1 re-solves as it did."""
        order = sorted((j for j in self.jobs.values() if j.round <= upto), key=lambda j: (j.round, j.key))
        job_of = {r.key: j.key for j in order for r in j.runs}
        by_id = {r.id: r for r in rows}
        lines, cut = [], 0
        for host in sorted({j.host for j in order}):
            probes = [by_id[r.key] for j in order if j.host == host for r in j.runs if r.kind == "probe" and r.key in by_id]
            for a, b in zip(probes, probes[1:]):
                d = drift([a, b])
                if d:
                    lines += d
                    cut = max(cut, next(i for i, j in enumerate(order) if j.key == job_of[b.id]))
        keep = {j.key for j in order[cut:]}
        return [r for r in rows if job_of.get(r.id) in keep], lines

    def _refit(self, n: int) -> None:
        rows = self.rows()
        if not rows:
            return
        epoch, lines = self._epoch(rows, n)
        for line in lines:
            if line not in self.drift:
                self.drift.append(line)
                self.log(f"  {line}: the fit uses the runs since")
        use = [r for r in epoch if predictable(r) is None]
        skipped = len(epoch) - len(use)
        gpu = resolve_gpu(self.spec.hardware.gpu, self.spec.hardware.gpu_file)
        name = f"tune-{Path(self.spec.path).stem}-{self.engine or 'engine'}"
        predict = RowPredictor(gpu, stagger=STAGGERED_ENGINES, gpu_mem_util=self.spec.gpu_mem_util)
        # from the calibration the session started with, and from the datasheet (a start far off,
        # e.g. a deliberately wrong file, can leave the solver where it began): the better fit wins
        starts = [self.s.calibration or "ideal"] + (["ideal"] if self.s.calibration not in (None, "ideal") else [])
        try:
            fits = [calibrate(use, gpu, resolve_base(b, gpu, self.engine or None), None, predict,
                              max_nfev=self.s.max_nfev, name=name) for b in starts]
            res = min(fits, key=lambda f: f.rms_log_residual)
        except InputError as exc:
            rescaled = self._rescale(use, gpu, predict, name) if lines else None
            if rescaled is None:
                self.notes.append(f"round {n}: not refitted ({exc}); the calibration stays {self.cal_label}")
                self.log(f"  refit: {exc}; keeping {self.cal_label}")
                return
            res = rescaled
            self.notes.append(f"round {n}: too few runs since the drift for a full fit ({exc}); "
                              f"refitted {', '.join(res.fitted)} on them from {self.cal_label}")
        d = calibration_dict(res, name, gpu, self.engine or None, [{"path": "measured.csv", "rows": len(use),
                                                                       "source": f"kvtune tune session {self.store.name}"}],
                             self.s.calibration or "ideal",
                             notes=[f"{skipped} rows the simulator cannot predict left out"] if skipped else [])
        d["provenance"] = self._provenance(use)
        text = calibration_yaml(d)
        path = self.workdir / f"calibration-r{n}.yaml"
        write_atomic(path, text)
        write_atomic(self.workdir / "calibration.yaml", text)   # the latest fit: what the session ends with
        sha = hashlib.sha256(text.encode()).hexdigest()[:12]
        self.calibration = str(path)
        self.cal_label = f"{path.name} (sha256 {sha}, {len(use)} rows)"
        self.fit_report = {"rows": len(use), "skipped": skipped, "mape_before_pct": d["fit"]["mape_before_pct"],
                           "mape_after_pct": d["fit"]["mape_after_pct"], "fitted": d["fit"]["fitted"], "file": path.name}
        if self.rounds and self.rounds[-1].round == n:
            self.rounds[-1] = dataclasses.replace(self.rounds[-1], fit=self.fit_report, drift=tuple(lines))
        self.log(f"  refit on {len(use)} rows: MAPE {d['fit']['mape_before_pct']} -> {d['fit']['mape_after_pct']} "
                 f"(fitted {', '.join(d['fit']['fitted'])})")

    def _rescale(self, use: list[ProfileRow], gpu, predict, name: str) -> FitResult | None:
        """After a drift the runs since it are too few for every parameter: refit only the terms
        that set the machine's speed (RESCALE_PARAMS, as many as the runs can carry), the rest
        kept from the latest fit (the drift moved the speed, not the shape of the cost). None when
        not even one term can be fitted."""
        base = resolve_base(self.calibration or "ideal", gpu, self.engine or None)
        for k in range(len(RESCALE_PARAMS), 0, -1):
            try:
                return calibrate(use, gpu, base, RESCALE_PARAMS[:k], predict, max_nfev=self.s.max_nfev, name=name)
            except InputError:
                continue
        return None

    def _provenance(self, rows: list[ProfileRow]) -> dict[str, Any]:
        reports = [j.engine for j in self.jobs.values() if j.engine]
        return {"made_by": "kvtune tune", "kvtune_version": __version__, "engine": self.engine,
                "engine_version": sorted({r.get("version", "") for r in reports} - {""}),
                "threads": sorted({r.threads for r in rows if r.threads}), "machine": self.machine,
                "study": self.store.name, "rows": len(rows),
                "loadavg_1m": sorted({r.loadavg_1m for r in rows if r.loadavg_1m is not None})[:1]
                + sorted({r.loadavg_1m for r in rows if r.loadavg_1m is not None})[-1:]}

    # ---- the answer -------------------------------------------------------------------------------
    def _result(self, status: str, reason: str) -> TuneResult:
        final = self.rounds[-1] if self.rounds else None
        pick, promise, evidence, a1, ac, launch = None, None, "simulated", None, None, ""
        if final is not None:
            job = self.jobs.get(final.jobs[0]) if final.jobs else None
            pick, promise = final.pick, final.promise_req_s
            if job is not None:
                launch = job.launch_line
                r1, rc = job.run_at(1.0), job.run_at(self.s.check_multiplier)
                a1, ac = _attainment_of(r1), _attainment_of(rc)
            if status != "converged":
                best = self._best_measured()
                if best is not None:
                    job, run = best
                    pick, promise, launch = job.config, run.rate_req_s, job.launch_line
                    a1, ac = run.attainment, None
                    reason += (f"; best measured: {config_id(pick)} met the SLOs at {promise:.3g} req/s per replica "
                               f"(measured)")
            evidence = "measured" if a1 is not None and a1["value"] >= self.spec.slo.attainment else "simulated"
        return TuneResult(status=status, reason=reason, workload=self.spec.path, engine=self.engine,
                          target_attainment=self.spec.slo.attainment, check_multiplier=self.s.check_multiplier,
                          pick=pick, promise_req_s=promise, evidence=evidence, attainment_at_promise=a1,
                          attainment_at_check=ac, launch_line=launch,
                          calibration_file="calibration.yaml" if (self.workdir / "calibration.yaml").exists() else "",
                          runs=self.runs_used, engine_s=round(self.engine_s_used, 1), rounds=tuple(self.rounds),
                          jobs=tuple(sorted(list(self.jobs.values()) + self._partial, key=lambda j: (j.round, j.key))),
                          drift=tuple(self.drift), notes=tuple(self.notes), promise=self.s.promise)

    def _best_measured(self) -> tuple[JobRecord, RunRecord] | None:
        """The highest per-replica rate any measured config met the SLOs at (measured)."""
        target = self.spec.slo.attainment
        best = None
        for j in self.jobs.values():
            for r in j.runs:
                if r.kind == "open" and r.attainment and r.attainment["value"] >= target and r.rate_req_s:
                    if best is None or r.rate_req_s > (best[1].rate_req_s or 0.0):
                        best = (j, r)
        return best


# what a twin may differ in: the scheduler's limits (a chunk budget above every step's tokens, a cap above
# what the pool admits schedule alike, issue 33.4). A KV cache type, TP or speculation changes the engine's
# kernels, which the simulator sees only through bytes and FLOPs: two such configs it schedules alike may
# still run apart (bench/RESULTS-tune.md 2026-12-08: q8_0 KV was never measured, the best was q8_0)
SCHEDULING_KEYS = ("batch_cap", "chunk_tokens")


def _scheduling_only(a: dict, b: dict) -> bool:
    """``a`` and ``b`` differ in the scheduler's limits alone (``SCHEDULING_KEYS``)."""
    return {k: v for k, v in a.items() if k not in SCHEDULING_KEYS} == {k: v for k, v in b.items() if k not in SCHEDULING_KEYS}


def _same_behaviour(a: list[tuple[np.ndarray, np.ndarray]], b: list[tuple[np.ndarray, np.ndarray]]) -> bool:
    return len(a) == len(b) and all(np.array_equal(x, y, equal_nan=True) for pa, pb in zip(a, b)
                                    for x, y in zip(pa, pb))


def _attainment_of(run: RunRecord | None) -> dict | None:
    """The run's measured attainment; a run stopped early carries the bound it proved under ``stopped``."""
    if run is None or run.attainment is None:
        return None
    return {**run.attainment, "stopped": run.stopped} if run.stopped else run.attainment


def stop_record(sent: int, planned: int, counted_planned: int, misses: int, allowed: int) -> dict:
    """What a run stopped early proved: ``misses`` of the ``counted_planned`` requests past warm-up
    had missed before the end, so had every remaining request met, the run's attainment would be at
    most (counted_planned - misses) / counted_planned, below the target once ``misses`` > ``allowed``.
    The share met among the few sent is an observation of an overloaded start, not an estimate of
    the run (issue 33: it printed 0.000 [0, 0.755] as if it were)."""
    return {"sent": sent, "planned": planned, "counted_planned": counted_planned, "misses": misses,
            "allowed": allowed, "attainment_at_most": round((counted_planned - misses) / counted_planned, 4)}


def _mean_load(a: float | None, b: float | None) -> float | None:
    vals = [v for v in (a, b) if v is not None]
    return round(sum(vals) / len(vals), 2) if vals else None


def check_tunable(spec) -> None:
    """Refuse, before any engine starts, what a session on one live engine cannot measure: a
    workload that lists several GPU types (``kvtune solve`` chooses among them; tune then measures
    the chosen one). A disaggregated pick is refused when the solve makes it (``Tuner._solve``)."""
    choices = spec.hardware.choices
    if choices:
        names = ", ".join(g for g, _ in choices)
        raise InputError(f"{spec.path}: hardware.gpu lists {len(choices)} GPU types ({names}); kvtune tune measures "
                         f"one engine on one machine, so it cannot compare them: run kvtune solve for the choice, "
                         f"then tune the chosen type (e.g. hardware.gpu: {choices[0][0]})")


def tune(spec, adapter: Adapter, settings: TuneSettings, store: TuneStore, workdir: Path,
         log: Callable[[str], None] = lambda s: None, threads: int | None = None) -> TuneResult:
    """Run one session (``Tuner``); engine failures propagate as ``EngineError`` (exit 3)."""
    check_tunable(spec)
    try:
        return Tuner(spec, adapter, settings, store, workdir, log, threads).run()
    except (EngineError, KeyboardInterrupt):
        store.release_all("interrupted or engine failure")
        raise
