"""Fault injection for tests/optimizer/test_worker_faults.py: a ``kvtune solve --workers N`` child kills
itself (SIGKILL: no cleanup, no ``finally``) at one point of its work on the simulation study.

Loaded by every Python process started with this folder on ``PYTHONPATH`` (``sitecustomize``);
it acts only when ``KVTUNE_TEST_KILL`` names a point, only in a spawned worker (its command line
ends ``--workers 1 ...``, as ``optimizer.scaleout.spawn_workers`` writes it), and only once per
run: the first process to create ``KVTUNE_TEST_KILL_MARK`` (O_EXCL) dies and leaves its pid
there. The points, hooked where any implementation of the runner must pass:

- ``after_create``: the storage has just created a trial of the ``NAME:sim`` study for it;
- ``after_claim``: it is about to simulate the first item of a chunk it claimed (``_do``);
- ``mid_simulation``: while simulating that item (killed 50 ms in, or when it returns if sooner).
"""

from __future__ import annotations

import os
import signal
import sys
import threading

POINT = os.environ.get("KVTUNE_TEST_KILL", "")
MARK = os.environ.get("KVTUNE_TEST_KILL_MARK", "")


def _is_worker() -> bool:
    argv = sys.argv
    idx = [i for i, a in enumerate(argv) if a == "--workers"]
    return bool(idx) and idx[-1] + 1 < len(argv) and argv[idx[-1] + 1] == "1" and "solve" in argv


def _take_the_kill() -> bool:
    try:
        fd = os.open(MARK, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    os.write(fd, f"{os.getpid()} {POINT}\n".encode())
    os.close(fd)
    return True


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _in_own_chunk() -> bool:
    """Called (a few frames up) from the runner's ``_do``: a chunk this process claimed, not a
    dead process's chunk it recomputes."""
    f = sys._getframe(2)
    for _ in range(4):
        if f is None:
            return False
        if f.f_code.co_name == "_do":
            return True
        f = f.f_back
    return False


def _install() -> None:
    from kvtune.optimizer import scaleout

    if POINT == "after_create":
        from optuna.storages import JournalStorage, RDBStorage

        def hook(cls, name):
            orig = getattr(cls, name)

            def create(self, study_id, *a, **kw):
                out = orig(self, study_id, *a, **kw)
                if self.get_study_name_from_id(study_id).endswith(":sim") and _take_the_kill():
                    _die()
                return out
            setattr(cls, name, create)
        hook(JournalStorage, "create_new_trial")
        hook(RDBStorage, "_create_new_trial")   # what optuna's cache wrapper calls
        return

    orig_execute = scaleout.execute

    def execute(ctx, w):
        if not (_in_own_chunk() and _take_the_kill()):
            return orig_execute(ctx, w)
        if POINT == "after_claim":
            _die()
        timer = threading.Timer(0.05, _die)
        timer.start()
        orig_execute(ctx, w)
        _die()
    scaleout.execute = execute


if POINT and MARK and _is_worker():
    _install()
