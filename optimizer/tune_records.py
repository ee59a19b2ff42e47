"""The records ``kvtune tune`` keeps: one measured run, one job (a config on one engine start, its
runs), one round, and the whole session. Frozen, with ``to_json``/``from_json``: a job is what the
optuna storage holds per trial (``optimizer.tune_store``), so a killed tune resumes and several
machines share one study.

Every figure carries its evidence: ``measured`` (the live engine), ``simulated`` (the event-driven
simulator under the round's calibration) or ``screened`` (the analytic screen).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Mapping

__all__ = ["RunRecord", "JobRecord", "RoundRecord", "TuneResult", "config_id", "CONFIG_KEYS"]

CONFIG_KEYS = ("tp", "batch_cap", "kv_dtype", "spec_k", "chunk_tokens")


def config_id(cfg: Mapping[str, Any]) -> str:
    """A config as a short stable name: ``tp1-b4-c512-fp16-k0``."""
    return f"tp{cfg['tp']}-b{cfg['batch_cap']}-c{cfg['chunk_tokens']}-{cfg['kv_dtype']}-k{cfg.get('spec_k', 0)}"


def _num(x: Any) -> Any:
    return {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}.get(x, x) if isinstance(x, str) else x


class _Json:
    def to_json(self) -> dict[str, Any]:
        return asdict(self)  # type: ignore[call-overload]

    @classmethod
    def from_json(cls, d: Mapping[str, Any]):
        return cls(**{f.name: d[f.name] if f.name in d else f.default for f in fields(cls)})  # type: ignore[arg-type]


@dataclass(frozen=True)
class RunRecord(_Json):
    """One load run on the engine: open loop at ``rate_req_s`` (``kind`` open), the short closed-loop
    speed probe every engine start begins with (probe), or a profile-grid point (grid)."""

    key: str                             # unique in the session: job key + what was run
    kind: str                            # open | probe | grid
    multiplier: float | None             # open: rate / the config's promised per-replica goodput
    rate_req_s: float | None             # open: the planned Poisson rate
    n_requests: int
    warmup: int
    started_at: str
    duration_s: float
    loadavg_1m: float | None             # the machine's 1-minute load average during the run (measured)
    table_csv: str                       # the run's profile-table row(s), as kvtune's table CSV
    requests_file: str = ""              # open: the per-request log's name (relative to the table folder)
    requests_csv: str = ""               # open: the per-request log itself
    attainment: dict | None = None       # open: loadgen.Attainment as JSON (measured)
    measured: dict | None = None         # open: ttft_ms/tpot_ms percentiles (measured)
    offered_rate_req_s: float | None = None
    goodput_at_rate_req_s: float | None = None   # offered rate x attainment (measured)
    predicted_attainment: float | None = None    # the simulator on the same requests (simulated)
    predicted: dict | None = None                # ttft_ms/tpot_ms percentiles (simulated)
    failed: int = 0
    stopped: dict | None = None          # open, stopped early: tune.stop_record (the bound its misses proved)
    ttft_trend: dict | None = None       # open: loadgen.OpenLoopRun.ttft_trend (did the queue grow? measured)
    # open: the simulator on the requests really sent, at their send times, under the round's
    # calibration (simulated): what ``measured`` is compared with (``predicted`` is the whole plan,
    # made before the run; a stopped run sent only its first requests)
    replayed_attainment: float | None = None
    replayed: dict | None = None


@dataclass(frozen=True)
class JobRecord(_Json):
    """One config on one engine start: the runs made on it, the engine's report and launch line."""

    key: str                             # r<round>:<config id> or grid
    round: int
    role: str                            # pick | near | grid
    config: dict
    promise_req_s: float | None          # the per-replica goodput the round's simulator predicted
    calibration: str                     # the calibration the promise was made under (name, sha256)
    launch_line: str                     # the exact command measured ("" for a URL you launched)
    engine: dict                         # what the running engine reported (adapters.EngineReport)
    host: str
    engine_s: float                      # engine wall time: start to stop
    runs: tuple[RunRecord, ...] = ()
    status: str = "done"                 # done | budget (stopped by the budget part-way) | failed
    error: str = ""
    pid: int = 0                         # the kvtune process that measured it (several may share a study)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["runs"] = [r.to_json() for r in self.runs]
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "JobRecord":
        d = dict(d)
        d["runs"] = tuple(RunRecord.from_json(r) for r in d.get("runs", ()))
        return super().from_json(d)

    def run_at(self, multiplier: float) -> RunRecord | None:
        return next((r for r in self.runs if r.kind == "open" and r.multiplier is not None
                     and abs(r.multiplier - multiplier) < 1e-9), None)


@dataclass(frozen=True)
class RoundRecord(_Json):
    """One round: the simulator's pick under the round's calibration, what was measured, the check."""

    round: int
    calibration: str                     # what the round solved with
    pick: dict
    promise_req_s: float                 # the pick's per-replica goodput for runs like the measured ones (simulated)
    jobs: tuple[str, ...]                # job keys measured (or reused) this round
    meets: bool | None                   # measured attainment at 1.0x >= target
    tight: bool | None                   # measured attainment at the check multiplier < target
    drift: tuple[str, ...] = ()
    fit: dict = field(default_factory=dict)   # the refit after the round: MAPE before/after, rows used
    note: str = ""
    steady_state_req_s: float | None = None   # solve's goodput (>= 1,000 requests: the steady state; simulated)


@dataclass(frozen=True)
class TuneResult(_Json):
    """The session: its status, the final pick with its evidence, every round and job."""

    status: str                          # converged | budget | rounds | infeasible | unmeasurable
    reason: str
    workload: str
    engine: str
    target_attainment: float
    check_multiplier: float
    pick: dict | None                    # config
    promise_req_s: float | None          # per-replica goodput promised and measured to hold
    evidence: str                        # measured | simulated
    attainment_at_promise: dict | None   # measured, with its interval
    attainment_at_check: dict | None     # measured at check_multiplier x the promise
    launch_line: str
    calibration_file: str
    runs: int
    engine_s: float
    rounds: tuple[RoundRecord, ...] = ()
    jobs: tuple[JobRecord, ...] = ()
    drift: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    promise: str = "run"                 # steady: promise_req_s is the steady state; run: a run of --run-s from empty

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["rounds"] = [r.to_json() for r in self.rounds]
        d["jobs"] = [j.to_json() for j in self.jobs]
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "TuneResult":
        d = dict(d)
        d["rounds"] = tuple(RoundRecord.from_json(r) for r in d.get("rounds", ()))
        d["jobs"] = tuple(JobRecord.from_json(j) for j in d.get("jobs", ()))
        for k in ("drift", "notes"):
            d[k] = tuple(d.get(k, ()))
        return super().from_json(d)
