"""One engine process, started and stopped whatever happens.

``EngineProcess`` starts an argv in a session (and process group) of its own, its output to a log
file, so that a Ctrl-C typed at kvtune's terminal reaches kvtune alone (which then stops the engine
in order) and so that stopping reaches every process the engine forked (vLLM and SGLang start
workers). ``stop`` sends SIGTERM to the group, waits ``grace_s``, then SIGKILL, and waits for the
leader: no orphan, no zombie. On Linux the engine also gets SIGKILL if kvtune itself is killed
(``PR_SET_PDEATHSIG``): a ``kill -9`` of kvtune leaves no server holding the port or the memory.

``free_port`` asks the kernel for a port nobody holds; ``port_in_use`` says whether one is held
(a user's ``--port``, checked before an engine is started on it).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Mapping, Sequence
from .errors import InputError, EngineStartError

__all__ = ["EngineProcess", "free_port", "port_in_use", "STOP_GRACE_S"]

STOP_GRACE_S = 10.0      # SIGTERM -> SIGKILL: llama-server stops in < 1 s; vLLM frees its GPUs in a few
_PR_SET_PDEATHSIG = 1    # linux/prctl.h


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that no socket holds now (the kernel's choice)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    """Whether something listens on (or holds) ``host:port``: a bind there fails."""
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


@contextlib.contextmanager
def _signals_deferred():
    """Ctrl-C or SIGTERM during a stop waits until the stop is done (a stop cut short leaves an orphan)."""
    sigs = {signal.SIGINT, signal.SIGTERM}
    try:
        old = signal.pthread_sigmask(signal.SIG_BLOCK, sigs)
    except (AttributeError, ValueError, OSError):
        yield
        return
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _die_with_parent() -> None:   # runs in the child between fork and exec
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class EngineProcess:
    """A started engine process (``start``), its log, and ``stop``. Use as a context manager."""

    def __init__(self, argv: Sequence[str], log_path: Path, env: Mapping[str, str] | None = None,
                 grace_s: float = STOP_GRACE_S):
        self.argv = [str(a) for a in argv]
        self.log_path = Path(log_path)
        self.env = dict(env) if env is not None else None
        self.grace_s = grace_s
        self.proc: subprocess.Popen | None = None
        self.started_at = 0.0
        self.stopped_at: float | None = None

    def start(self) -> EngineProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as log:
            try:
                self.proc = subprocess.Popen(
                    self.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                    env=self.env, start_new_session=True,
                    preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None)
            except (FileNotFoundError, PermissionError) as exc:   # the user's binary: not there, not runnable
                raise InputError(f"cannot start {self.argv[0]}: {exc.strerror or exc}") from None
            except OSError as exc:
                raise EngineStartError(f"cannot start {self.argv[0]}: {exc.strerror or exc}") from None
        self.started_at = time.monotonic()
        return self

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def returncode(self) -> int | None:
        """None while it runs; its exit status once it has ended."""
        return None if self.proc is None else self.proc.poll()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, lines: int = 5, max_chars: int = 400) -> str:
        """The last lines of the engine's log, as one line (for an error message)."""
        try:
            text = self.log_path.read_bytes()[-16384:].decode("utf-8", "replace")
        except OSError:
            return ""
        tail = [ln.strip() for ln in text.splitlines() if ln.strip()][-lines:]
        return " | ".join(tail)[-max_chars:]

    def log_text(self) -> str:
        try:
            return self.log_path.read_bytes().decode("utf-8", "replace")
        except OSError:
            return ""

    def stop(self) -> None:
        """SIGTERM to the whole group, SIGKILL after ``grace_s``; returns when the leader is reaped."""
        p = self.proc
        if p is None or self.stopped_at is not None:
            return
        with _signals_deferred():
            self._stop(p)

    def _stop(self, p: subprocess.Popen) -> None:
        try:
            self._signal(signal.SIGTERM)
            try:
                p.wait(timeout=self.grace_s)
            except subprocess.TimeoutExpired:
                pass
            self._signal(signal.SIGKILL)   # the leader may be gone with workers left in its group
            p.wait()
        finally:
            self.stopped_at = time.monotonic()

    def _signal(self, sig: int) -> None:
        assert self.proc is not None
        try:
            os.killpg(self.proc.pid, sig)   # the session leader's pid is its group's id
        except (ProcessLookupError, PermissionError):
            pass

    @property
    def wall_s(self) -> float:
        """Seconds from start to stop (or to now, while it runs)."""
        if not self.started_at:
            return 0.0
        return (self.stopped_at or time.monotonic()) - self.started_at

    def __enter__(self) -> EngineProcess:
        return self.start() if self.proc is None else self

    def __exit__(self, *exc) -> None:
        self.stop()
