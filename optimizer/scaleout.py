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

A trial whose process died (RUNNING long after the others finished, or its pid is gone on this
host) is recomputed locally by each waiting process: same item, same result. A trial created
past the end of the search (two processes raced for the last item) is marked FAIL, ``surplus``.
"""

from __future__ import annotations

import math
import os
import socket
import time
import warnings

import optuna
from optuna.trial import TrialState

from .simsearch import Work, execute

__all__ = ["StudyRunner", "sim_study_name", "POLL_S"]

POLL_S = 0.02        # seconds between looks at the storage while another process finishes a batch,
POLL_MAX_S = 0.25    # growing with the wait up to this
CHUNKS_PER_BATCH = 8 # trials a batch of simulations is split into (fixed: every process splits alike)
STALE_S = 120.0      # a work trial RUNNING this long after its batch's others finished: its process died


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


class StudyRunner:
    """``run(items)`` with the work shared through ``storage`` (module docstring)."""

    def __init__(self, ctx, storage, study_name: str):
        self.ctx = ctx
        # trials are claimed, not sampled: a sampler that reads no trials keeps ``ask`` O(1)
        self.study = optuna.create_study(storage=storage, study_name=sim_study_name(study_name),
                                         direction="maximize", load_if_exists=True,
                                         sampler=optuna.samplers.RandomSampler(seed=0))
        _mark_work_queue(self.study, study_name)
        self.offset = 0                   # trial number of the current batch's first item
        self.cache: dict[str, dict] = {}
        self.ran = 0                      # items this process simulated
        self.held: dict[int, optuna.Trial] = {}

    def screen(self, configs):
        from .search import evaluate
        return [evaluate(self.ctx, p) for p in configs]

    def run(self, items: list[Work]) -> list[dict]:
        todo = list({w.key: w for w in items if w.key not in self.cache}.values())
        if todo:
            got = self._run_batch(todo)
            self.cache.update(got)
        return [self.cache[w.key] for w in items]

    def _trials(self):
        return self.study.get_trials(deepcopy=False)

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
                t = self.study.ask()
                if t.number >= hi:            # another process took the last chunk first
                    self.held[t.number] = t
                    break
                self._do(t, chunks[t.number - lo])
                if t.number == hi - 1:
                    break
        return self._collect(chunks, lo, hi)

    def _do(self, trial: optuna.Trial, chunk: list[Work]) -> None:
        trial.set_user_attr("claim", {"host": socket.gethostname(), "pid": os.getpid(), "keys": [w.key for w in chunk]})
        res = [execute(self.ctx, w) for w in chunk]
        self.ran += len(chunk)
        trial.set_user_attr("results", res)
        self.study.tell(trial, float(len(chunk)))

    def _collect(self, chunks: list[list[Work]], lo: int, hi: int) -> dict[str, dict]:
        out: dict[str, dict] = {}
        done: set[int] = set()
        first_done = None
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
                elif t.state == TrialState.FAIL or self._dead(t, first_done):
                    out.update((w.key, execute(self.ctx, w)) for w in chunk)   # its process died: same results
                    done.add(n)
            if len(done) < len(chunks):
                first_done = first_done or time.time()
                time.sleep(min(POLL_MAX_S, POLL_S * (1 + (time.time() - first_done) / POLL_S) ** 0.5))
        return out

    @staticmethod
    def _dead(t, since: float | None) -> bool:
        claim = t.user_attrs.get("claim", {})
        host, pid = claim.get("host"), claim.get("pid")
        if host == socket.gethostname() and pid is not None and pid != os.getpid():
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return True
            except PermissionError:
                pass
        return since is not None and time.time() - since > STALE_S

    def finish(self) -> None:
        """Trials this process created past the end of the search: surplus, marked FAIL."""
        for t in self.held.values():
            t.set_user_attr("surplus", True)
            self.study.tell(t, state=TrialState.FAIL)
        self.held.clear()

    def close(self) -> None:
        self.finish()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# flags a spawned worker drops (its own are added) and whether each takes a value
_DROP = {"--storage": True, "--workers": True, "--jobs": True, "--json": True, "--report": True, "--quiet": False}


def spawn_workers(argv: list[str], storage: str, n: int) -> list:
    """Start ``n`` more ``kvtune solve`` processes from this one's command line (``argv``), on
    ``storage``, with one process each and no output; returns their ``Popen`` objects."""
    import subprocess
    import sys

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
