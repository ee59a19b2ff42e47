"""What every adapter hands the tune loop: a ``RunningEngine`` (its URL, the model to name in
requests, the plan it was started from, what it reported, the exact launch line) inside a
context that stops it whatever happens; and the start-up wait they share."""

from __future__ import annotations

import contextlib
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from kvtune.optimizer.launch.pick import LaunchPick
from kvtune.optimizer.profile_run import Endpoint

from .engines import EngineKind, EnginePlan, EngineReport, check
from .errors import EngineCrashed, EngineMismatch, EngineStartError, InputError
from kvtune.optimizer.server_http import ServerRoot, Unreachable
from .process import EngineProcess, free_port, port_in_use

__all__ = ["RunningEngine", "Adapter", "start_engine", "STARTUP_TIMEOUT_S", "PORT_TRIES"]

STARTUP_TIMEOUT_S = 600.0   # vLLM loading a 70B checkpoint and capturing CUDA graphs takes minutes
PORT_TRIES = 3              # a port taken between choosing it and the engine binding it: try another
_POLL_S = 0.25
# what engines print when their port is taken (llama.cpp: "couldn't bind HTTP server socket";
# uvicorn (vLLM, SGLang): "[Errno 98] ... address already in use")
_PORT_TAKEN = re.compile(r"address already in use|couldn't bind|could not bind|errno 98", re.I)


@dataclass
class RunningEngine:
    """A server the loop may send load to, as it came up."""

    url: str                           # base URL, ending in /v1
    served_model: str                  # the "model" requests name
    report: EngineReport
    launch_line: str                   # the exact command that started it ("" for a URL you launched)
    plan: EnginePlan | None = None     # None: launched by the user (a URL)
    process: EngineProcess | None = None
    kind: EngineKind | None = None     # how to ask it whether it is busy
    api_key: str | None = field(default=None, repr=False)   # Authorization: Bearer (a server you launched)
    api: str = "completions"           # the OpenAI API the load speaks: completions | chat

    @property
    def root(self) -> ServerRoot:
        """The server root (no ``/v1``), carrying the key."""
        return ServerRoot(self.url[:-3] if self.url.endswith("/v1") else self.url, self.api_key)

    def endpoint(self) -> Endpoint:
        """Where the load goes: the URL, the key, the API."""
        return Endpoint(self.url, self.api_key, self.api)

    def wait_idle(self, timeout_s: float) -> bool:
        """Wait until no request is left in the engine (clients that gave up leave theirs to be
        cancelled); True when idle or when the engine cannot tell, False after ``timeout_s``."""
        root = self.root
        t0 = time.monotonic()
        while self.kind is not None:
            try:
                busy = self.kind.busy(root)
            except Unreachable:
                return True
            if not busy:
                return True
            if time.monotonic() - t0 > timeout_s:
                return False
            time.sleep(_POLL_S)
        return True

    @property
    def log_path(self) -> Path | None:
        return self.process.log_path if self.process else None

    def check_alive(self) -> None:
        """Raise ``EngineCrashed`` if the engine process has ended (a URL: if it stopped answering)."""
        if self.process is not None:
            rc = self.process.returncode()
            if rc is not None:
                raise EngineCrashed(f"the engine exited with status {rc} during a run: {self.process.log_tail()} "
                                    f"(log {self.process.log_path})")


class Adapter:
    """How the loop gets an engine for a config. ``why_not(pick)`` is None when this adapter can
    serve the config (a URL you launched serves only its own); ``running(pick)`` yields a
    ``RunningEngine`` and stops it on leaving, whatever happened."""

    engine = ""          # kvtune's engine name for its rows (llamacpp, vllm, sglang; "" unknown)
    starts_engines = True
    api = "completions"  # the OpenAI API the load speaks to what it runs: completions | chat

    def why_not(self, pick: LaunchPick) -> str | None:
        return None

    def running(self, pick: LaunchPick) -> contextlib.AbstractContextManager[RunningEngine]:
        raise NotImplementedError

    def describe(self) -> str:
        raise NotImplementedError


def _wait_healthy(kind: EngineKind, root: str, proc: EngineProcess, timeout_s: float, auto_port: bool) -> None:
    t0 = time.monotonic()
    while True:
        rc = proc.returncode()
        if rc is not None:
            if auto_port and _PORT_TAKEN.search(proc.log_text()[-8192:]):
                raise _PortTaken()
            raise EngineStartError(f"{kind.label} exited with status {rc} during start-up: {proc.log_tail()} "
                                   f"(log {proc.log_path})")
        with contextlib.suppress(Unreachable):
            if kind.healthy(root):
                return
        if time.monotonic() - t0 > timeout_s:
            raise EngineStartError(f"{kind.label} was not healthy after {timeout_s:g} s (GET {root}{kind.health_path}); "
                                   f"last log lines: {proc.log_tail() or '(none)'} (log {proc.log_path})")
        time.sleep(_POLL_S)


class _PortTaken(Exception):
    pass


@contextlib.contextmanager
def start_engine(kind: EngineKind, make_plan, host: str, port: int | None, log_path: Path,
                 env: dict[str, str] | None, timeout_s: float) -> Iterator[tuple[EnginePlan, EngineProcess, str]]:
    """Start ``make_plan(port)``'s argv on a free port (or ``port``), wait until healthy, read it
    back and check it against the plan; yields (plan, process, root URL); always stops it."""
    for attempt in range(PORT_TRIES):
        p = port or free_port(host)
        if port and port_in_use(port, host):
            raise InputError(f"--port {port}: already in use on {host} (another server holds it); give a free "
                             f"port or leave --port out for kvtune to pick one")
        plan: EnginePlan = make_plan(p)
        proc = EngineProcess(plan.argv, log_path, env)
        root = f"http://{host}:{p}"
        try:
            proc.start()
            _wait_healthy(kind, root, proc, timeout_s, auto_port=port is None)
        except _PortTaken:
            proc.stop()
            if attempt == PORT_TRIES - 1:
                raise EngineStartError(f"{kind.label}: {PORT_TRIES} ports in a row were taken before it could "
                                       f"bind them (log {log_path})") from None
            continue
        except BaseException:
            proc.stop()
            raise
        try:
            yield plan, proc, root
        finally:
            proc.stop()
        return


def checked_report(kind: EngineKind, plan: EnginePlan, proc: EngineProcess, root: str) -> EngineReport:
    """The running server's report, or ``EngineMismatch`` naming what differs from the plan."""
    rep = kind.read_back(root, proc.log_text())
    bad = check(plan, rep)
    if bad:
        raise EngineMismatch(f"{kind.label} came up other than planned: {'; '.join(bad)}; not measured "
                             f"(log {proc.log_path})")
    return rep
