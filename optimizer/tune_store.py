"""``kvtune tune``'s measurements in an optuna storage: one trial per job (a config measured on one
engine start, ``tune_records.JobRecord`` in the trial's user attributes), in study
``<name>:tune`` of any storage ``kvtune solve`` takes (a journal file, SQLite, PostgreSQL).

- Resume: the loop is deterministic given the measurements (same solve, same refit), so a killed
  tune re-run with the same command finds its finished jobs here and measures only the rest.
- Several machines, each with its own engine, on one storage: a process *claims* a job before it
  starts an engine (a RUNNING trial holding the job's key and the claimant's host and pid); the
  others skip it and measure the round's other jobs, then wait until every job of the round is
  done and refit from the same rows. Two processes that claim one job at once keep the claim of
  the lower trial number; the other trial is marked FAIL (``surplus``). A claim whose process is
  gone (same host, pid not running) or that has run for ``STALE_S`` is taken over.
- The study records a digest of the workload and the tune settings that decide what is measured,
  and refuses a mismatch: a study is one session's record.
"""

from __future__ import annotations

import os
import socket
import time
from typing import Iterable

import optuna
from optuna.trial import TrialState

from kvtune.costmodel.errors import InputError

from .tune_records import JobRecord

__all__ = ["TuneStore", "tune_study_name", "STALE_S"]

STALE_S = 3600.0   # a claim older than this, on another host, was left by a process that died
_POLL_S = 1.0


def tune_study_name(name: str) -> str:
    return f"{name}:tune"


class TuneStore:
    """Jobs done, claimed and finished in ``storage`` (an optuna storage object; None: in memory)."""

    def __init__(self, storage, name: str, digest: str):
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.study = optuna.create_study(storage=storage, study_name=tune_study_name(name), direction="maximize",
                                         load_if_exists=True, sampler=optuna.samplers.RandomSampler(seed=0))
        have = self.study.user_attrs.get("tune_digest")
        if have is None:
            self.study.set_user_attr("tune_digest", digest)
        elif have != digest:
            raise InputError(f"--study-name {name}: the storage holds a tune of another workload or other settings "
                             f"(digest {have[:12]}, this one {digest[:12]}); give another --study-name")
        self.name = name
        self.held: dict[str, optuna.Trial] = {}

    def _trials(self):
        return self.study.get_trials(deepcopy=False)

    def done(self) -> dict[str, JobRecord]:
        """Every finished job, by key."""
        out = {}
        for t in self._trials():
            if t.state == TrialState.COMPLETE and "job" in t.user_attrs:
                out[t.user_attrs["key"]] = JobRecord.from_json(t.user_attrs["job"])
        return out

    def _owner_gone(self, t) -> bool:
        claim = t.user_attrs.get("claim") or {}
        if claim.get("host") == socket.gethostname() and claim.get("pid") not in (None, os.getpid()):
            try:
                os.kill(int(claim["pid"]), 0)
            except ProcessLookupError:
                return True
            except PermissionError:
                return False
        return time.time() - float(claim.get("at", time.time())) > STALE_S

    def claim(self, key: str) -> bool:
        """Take job ``key`` for this process: False if it is done or another live process holds it."""
        for t in self._trials():
            if t.user_attrs.get("key") != key:
                continue
            if t.state == TrialState.COMPLETE:
                return False
            if t.state == TrialState.RUNNING and not self._owner_gone(t):
                return False
        trial = self.study.ask()
        trial.set_user_attr("key", key)
        trial.set_user_attr("claim", {"host": socket.gethostname(), "pid": os.getpid(), "at": time.time()})
        holders = [t for t in self._trials() if t.user_attrs.get("key") == key
                   and (t.state == TrialState.COMPLETE or (t.state == TrialState.RUNNING and not self._owner_gone(t)))]
        if min(t.number for t in holders) != trial.number:
            trial.set_user_attr("surplus", True)
            self.study.tell(trial, state=TrialState.FAIL)
            return False
        self.held[key] = trial
        return True

    def finish(self, job: JobRecord) -> None:
        trial = self.held.pop(job.key)
        trial.set_user_attr("job", job.to_json())
        self.study.tell(trial, float(len(job.runs)))

    def release(self, key: str, why: str) -> None:
        """Give a claimed job back (an error or an interruption): FAIL, so a resumed run claims it again."""
        trial = self.held.pop(key, None)
        if trial is not None:
            trial.set_user_attr("released", why[:500])
            self.study.tell(trial, state=TrialState.FAIL)

    def release_all(self, why: str) -> None:
        for key in list(self.held):
            self.release(key, why)

    def wait(self, keys: Iterable[str], on_wait=None, timeout_s: float | None = None) -> dict[str, JobRecord]:
        """Block until every job in ``keys`` is done (by any process); returns them. A key nobody
        holds any more (its process died) comes back missing: the caller claims it itself."""
        keys = list(keys)
        t0 = time.monotonic()
        while True:
            done = self.done()
            missing = [k for k in keys if k not in done]
            if not missing:
                return {k: done[k] for k in keys}
            live = [t for t in self._trials() if t.user_attrs.get("key") in missing and t.state == TrialState.RUNNING
                    and not self._owner_gone(t)]
            if not live or (timeout_s is not None and time.monotonic() - t0 > timeout_s):
                return {k: done[k] for k in keys if k in done}
            if on_wait:
                on_wait(missing)
            time.sleep(_POLL_S)
