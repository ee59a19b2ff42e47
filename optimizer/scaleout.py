"""Several processes, one storage: the simulator race's batches shared through an optuna study.

``StudyRunner`` runs the race's work items (``optimizer.simsearch.Work``) in trials of a second
study, ``<study name>:sim``, in the same storage (a journal file or any optuna RDB URL, e.g.
PostgreSQL: several machines can point at one); each batch is split into at most
``CHUNKS_PER_BATCH`` chunks, one trial each. Every process runs the same race, so every process
asks for the same batches in the same order; chunk ``i`` of the whole sequence is done by
whichever process created trial number ``i`` (optuna numbers a study's trials atomically in every
storage). A process creates trials only while the current batch has items left, runs its items,
then waits until the batch's trials are complete and reads every result from their user
attributes. Results depend only on the item (config, rate, requests), so the race, and the
answer, are the same as a single process's, whichever process ran what.

A process that dies holding a trial costs the others seconds, not minutes:

- a trial is created already claimed (``claim``: ``optimizer.liveness.identity()``, in the one
  storage write that creates it, so no trial is ever RUNNING without an owner), and its owner
  rewrites its ``heartbeat`` (wall time) every ``HEARTBEAT_S`` while it holds it;
- a waiting process judges a RUNNING trial of its batch dead when its owner, on this machine, is
  gone, a zombie or its pid reused (at once); when the owner is elsewhere and its heartbeat has
  not moved for ``GRACE_S`` as seen from here (or is ``LEFTOVER_S`` old by this clock: a trial
  left by an earlier run); or when the owner is alive here but silent for ``STALL_S`` (stopped);
- the dead trial is marked FAIL in the storage (so no later run waits on it) and its chunk is
  recomputed by each process that needs it: same item, same result.

optuna's own heartbeat (``RDBStorage(heartbeat_interval=...)`` with ``fail_stale_trials``) is not
used: it beats only inside ``Study.optimize`` (these trials are created here, one write with the
claim), it never judges a trial that has no heartbeat row yet (a process killed right after
creating one), its interval is whole seconds, and optuna 5.0's JournalStorage has no heartbeat.

A trial created past the end of the search (two processes raced for the last item) is marked
FAIL, ``surplus``.
"""

from __future__ import annotations

import math
import threading
import time
import warnings

import optuna
from optuna.exceptions import UpdateFinishedTrialError
from optuna.trial import TrialState

from .liveness import identity, owner_alive
from .simsearch import Work, execute
import subprocess
import sys
from .search import evaluate

__all__ = ["StudyRunner", "sim_study_name", "spawn_workers", "Reaper", "POLL_S", "HEARTBEAT_S", "GRACE_S"]

POLL_S = 0.02        # seconds between looks at the storage while another process finishes a batch,
POLL_MAX_S = 0.25    # growing with the wait up to this
CHUNKS_PER_BATCH = 8 # trials a batch of simulations is split into (fixed: every process splits alike)
HEARTBEAT_S = 1.0    # a process rewrites the heartbeat of the trials it holds this often
GRACE_S = 5.0        # a heartbeat unchanged this long (seen from here) marks its owner dead: 5 beats missed
STALL_S = 60.0       # ... even when the owner is alive on this machine (stopped, hung)
LEFTOVER_S = 60.0    # a heartbeat this old by this machine's clock: left by an earlier run (clock skew
                     # between machines is assumed below this; GRACE_S needs no common clock)


def sim_study_name(study_name: str) -> str:
    return f"{study_name}:sim"


SIM_METRIC = "simulations_in_job (a job's size, not an objective: no trial here is 'best')"


def _mark_work_queue(study: optuna.Study, study_name: str) -> None:
    """Say in the study what it is, so optuna-dashboard does not read a job as an optimum: its
    metric is named as a job size and a user attribute says where the answer is."""
    if study.metric_names is None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.set_metric_names([SIM_METRIC])
    if "about" not in study.user_attrs:
        study.set_user_attr("about", f"work queue of kvtune's simulator race: one trial per job of simulations, "
                                     f"its value the job's size; the screen's trials are study '{study_name}', "
                                     f"the recommendation is kvtune solve's output (--json)")


class _Heartbeat:
    """One thread per runner rewriting the ``heartbeat`` user attribute of the trials it holds."""

    def __init__(self, storage, interval_s: float = HEARTBEAT_S):
        self.storage, self.interval_s = storage, interval_s
        self.ids: set[int] = set()
        self.lock = threading.Lock()
        self.stop_event = threading.Event()
        self.thread: threading.Thread | None = None

    def add(self, trial_id: int) -> None:
        with self.lock:
            self.ids.add(trial_id)
        if self.thread is None:
            self.thread = threading.Thread(target=self._run, name="kvtune-heartbeat", daemon=True)
            self.thread.start()

    def discard(self, trial_id: int) -> None:
        with self.lock:
            self.ids.discard(trial_id)

    def _run(self) -> None:
        while not self.stop_event.wait(self.interval_s):
            with self.lock:
                ids = sorted(self.ids)
            for tid in ids:
                try:
                    self.storage.set_trial_user_attr(tid, "heartbeat", time.time())
                except UpdateFinishedTrialError:   # finished meanwhile, or failed by another process
                    self.discard(tid)
                except Exception:  # a storage hiccup: the next beat tries again
                    pass

    def close(self) -> None:
        self.stop_event.set()
        if self.thread is not None:
            self.thread.join()


class StudyRunner:
    """``run(items)`` with the work shared through ``storage`` (module docstring)."""

    def __init__(self, ctx, storage, study_name: str):
        self.ctx = ctx
        # trials are claimed, not sampled: a sampler that reads no trials keeps creation O(1)
        self.study = optuna.create_study(storage=storage, study_name=sim_study_name(study_name),
                                         direction="maximize", load_if_exists=True,
                                         sampler=optuna.samplers.RandomSampler(seed=0))
        _mark_work_queue(self.study, study_name)
        # the storage's public API (optuna.storages.BaseStorage) for what Study does not expose:
        # a trial created with its claim in one write, and attributes of others' trials
        self.storage = storage
        self.study_id = storage.get_study_id_from_name(self.study.study_name)
        self.offset = 0                   # trial number of the current batch's first item
        self.cache: dict[str, dict] = {}
        self.ran = 0                      # items this process simulated
        self.held: dict[int, optuna.Trial] = {}
        self.mine: dict[int, list[dict]] = {}   # results of the trials this process ran, by number
        self.me = identity()
        self.beat = _Heartbeat(storage)
        self.seen: dict[int, tuple[object, float]] = {}  # others' RUNNING trials: (heartbeat, since when, monotonic)
        self.failed_dead = 0              # trials of dead processes this process marked FAIL

    def screen(self, configs):
        return [evaluate(self.ctx, p) for p in configs]

    def run(self, items: list[Work]) -> list[dict]:
        todo = list({w.key: w for w in items if w.key not in self.cache}.values())
        if todo:
            got = self._run_batch(todo)
            self.cache.update(got)
        return [self.cache[w.key] for w in items]

    def _trials(self):
        return self.study.get_trials(deepcopy=False)

    def _trial_id(self, number: int) -> int:
        return self.storage.get_trial_id_from_study_id_trial_number(self.study_id, number)

    def _create(self) -> optuna.Trial:
        """A new work trial, claimed by this process in the storage write that creates it."""
        template = optuna.trial.create_trial(state=TrialState.RUNNING,
                                             user_attrs={"claim": self.me, "heartbeat": time.time()})
        # Study.ask's own two steps (create, wrap), with the claim in the creating write
        trial_id = self.storage.create_new_trial(self.study_id, template_trial=template)
        self.beat.add(trial_id)
        return optuna.Trial(self.study, trial_id)

    def _run_batch(self, todo: list[Work]) -> dict[str, dict]:
        # one trial per chunk of items: a few storage round trips per chunk, not per simulation
        size = max(1, math.ceil(len(todo) / CHUNKS_PER_BATCH))
        chunks = [todo[i:i + size] for i in range(0, len(todo), size)]
        lo, hi = self.offset, self.offset + len(chunks)
        self.offset = hi
        # trials this process created earlier past the end of the last batch belong to this one
        for n in sorted(k for k in self.held if lo <= k < hi):
            self._do(self.held.pop(n), chunks[n - lo])
        if not self.held and len(self._trials()) < hi:   # one look at the storage per batch
            while True:
                t = self._create()
                if t.number >= hi:            # another process took the last chunk first
                    self.held[t.number] = t
                    break
                self._do(t, chunks[t.number - lo])
                if t.number == hi - 1:
                    break
        return self._collect(chunks, lo, hi)

    def _do(self, trial: optuna.Trial, chunk: list[Work]) -> None:
        res = [execute(self.ctx, w) for w in chunk]
        self.ran += len(chunk)
        self.mine[trial.number] = res
        try:
            trial.set_user_attr("claim", {**self.me, "keys": [w.key for w in chunk]})
            trial.set_user_attr("results", res)
            self.study.tell(trial, float(len(chunk)), skip_if_finished=True)
        except UpdateFinishedTrialError:
            pass   # another process judged this one dead (a stall) and failed the trial: results kept here
        finally:
            self.beat.discard(self._trial_id(trial.number))

    def _collect(self, chunks: list[list[Work]], lo: int, hi: int) -> dict[str, dict]:
        out: dict[str, dict] = {}
        done: set[int] = set()
        for n in range(lo, hi):
            if n in self.mine:
                out.update(zip([w.key for w in chunks[n - lo]], self.mine[n]))
                done.add(n)
        waiting_since = time.monotonic()
        while len(done) < len(chunks):
            for t in self._trials():
                n = t.number
                if not lo <= n < hi or n in done:
                    continue
                chunk = chunks[n - lo]
                if t.state == TrialState.COMPLETE:
                    keys = t.user_attrs["claim"]["keys"]
                    if keys != [w.key for w in chunk]:
                        raise RuntimeError(f"work trial {n} holds {keys[:2]}..., expected {chunk[0].key}...: "
                                           "processes sharing the study disagree on the race")
                    out.update(zip(keys, t.user_attrs["results"]))
                    done.add(n)
                elif t.state == TrialState.FAIL or self._dead(t):
                    out.update((w.key, execute(self.ctx, w)) for w in chunk)   # its process died: same results
                    done.add(n)
            if len(done) < len(chunks):
                waited = time.monotonic() - waiting_since
                time.sleep(min(POLL_MAX_S, POLL_S * (1 + waited / POLL_S) ** 0.5))
        return out

    def _dead(self, t) -> bool:
        """Whether RUNNING trial ``t`` (another process's) is held by a dead process (module
        docstring); if so it is marked FAIL, with the reason in ``dead_owner``."""
        claim = t.user_attrs.get("claim")
        alive = owner_alive(claim) if isinstance(claim, dict) else None
        beat = t.user_attrs.get("heartbeat")
        now = time.monotonic()
        last = self.seen.get(t.number)
        if last is None or last[0] != beat:
            self.seen[t.number] = last = (beat, now)
        silent_s = now - last[1]
        age_s = time.time() - beat if isinstance(beat, (int, float)) else math.inf
        if alive is False:
            why = f"its process (pid {claim.get('pid')} on {claim.get('host')}) is gone"
        elif alive is True:
            why = f"its process is alive here but its heartbeat stopped {silent_s:.0f} s ago" if silent_s > STALL_S else ""
        elif silent_s > GRACE_S:
            why = f"no heartbeat for {silent_s:.0f} s"
        elif age_s > LEFTOVER_S:
            why = f"its last heartbeat is {age_s:.0f} s old" if beat is not None else "no claim, no heartbeat"
        else:
            why = ""
        if not why:
            return False
        try:
            self.storage.set_trial_user_attr(self._trial_id(t.number), "dead_owner", why)
            self.study.tell(t.number, state=TrialState.FAIL, skip_if_finished=True)
            self.failed_dead += 1
        except (UpdateFinishedTrialError, ValueError):
            pass   # another process failed it first, or its owner finished it just now
        return True

    def finish(self) -> None:
        """Trials this process created past the end of the search: surplus, marked FAIL; so are
        those a dead process left there (no batch of this search waits on them)."""
        for t in self.held.values():
            t.set_user_attr("surplus", True)
            self.study.tell(t, state=TrialState.FAIL)
            self.beat.discard(self._trial_id(t.number))
        self.held.clear()
        for left in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            if left.number >= self.offset and left.number not in self.mine:
                self._dead(left)

    def close(self) -> None:
        try:
            self.finish()
        finally:
            self.beat.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Reaper:
    """Collects the exit status of spawned worker processes as they end (``Popen.poll`` every
    ``interval_s`` on a thread), so that a worker killed mid-run does not linger as a zombie that
    ``os.kill(pid, 0)`` still finds while this process is busy solving."""

    def __init__(self, procs: list, interval_s: float = 0.2):
        self.procs, self.interval_s = procs, interval_s
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self._run, name="kvtune-reaper", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop_event.wait(self.interval_s):
            if all(p.poll() is not None for p in self.procs):
                return

    def close(self) -> None:
        self.stop_event.set()
        self.thread.join()


# flags a spawned worker drops (its own are added) and whether each takes a value
_DROP = {"--storage": True, "--workers": True, "--jobs": True, "--json": True, "--report": True, "--quiet": False}


def spawn_workers(argv: list[str], storage: str, n: int) -> list:
    """Start ``n`` more ``kvtune solve`` processes from this one's command line (``argv``), on
    ``storage``, with one process each and no output; returns their ``Popen`` objects."""
    args, skip = [], False
    for a in argv[1:]:
        if skip:
            skip = False
            continue
        name = a.split("=", 1)[0]
        if name in _DROP:
            skip = _DROP[name] and "=" not in a
            continue
        args.append(a)
    cmd = [sys.executable, "-c", "import sys; from kvtune.optimizer.cli import main; sys.argv[0] = 'kvtune'; main()",
           *args, "--storage", storage, "--workers", "1", "--jobs", "1", "--quiet"]
    return [subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for _ in range(n)]
