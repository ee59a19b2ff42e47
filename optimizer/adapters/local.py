"""Engines kvtune starts on this machine: from its own launch settings (``LocalAdapter``) or from
a command template the user gives (``TemplateAdapter``)."""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import string
from pathlib import Path
from typing import Iterator

from kvtune.optimizer.launch.llamacpp import llamacpp_argv
from kvtune.optimizer.launch.pick import LaunchPick, Unsupported

from .base import STARTUP_TIMEOUT_S, Adapter, RunningEngine, checked_report, start_engine
from .engines import GENERIC, EngineKind, EnginePlan, detect_kind, kind_of
from .errors import InputError

__all__ = ["LocalAdapter", "TemplateAdapter", "TEMPLATE_FIELDS"]


def _binary(name: str) -> str:
    """An executable path (a name found on PATH, or a file that may be run); one line if not."""
    found = shutil.which(name)
    if found:
        return found
    p = Path(name)
    if p.is_file() and os.access(p, os.X_OK):
        return str(p.resolve())
    raise InputError(f"--engine-bin {name}: no such executable (not a file that may be run, not on PATH)")


class LocalAdapter(Adapter):
    """``kind``'s server started from kvtune's launch settings for each config."""

    def __init__(self, kind: str, *, binary: str | None = None, model: str | None = None, threads: int | None = None,
                 host: str = "127.0.0.1", port: int | None = None, log_dir: Path, env: dict[str, str] | None = None,
                 startup_timeout_s: float = STARTUP_TIMEOUT_S):
        self.kind: EngineKind = kind_of(kind)
        self.engine = self.kind.name
        self.binary = _binary(binary or self.kind.default_binary)
        if model and self.kind.model_is_file and not Path(model).is_file():
            raise InputError(f"--model-file {model}: no such file")
        self.model, self.threads, self.host, self.port = model, threads, host, port
        self.log_dir, self.env, self.timeout_s = Path(log_dir), env, startup_timeout_s
        self.starts = 0

    def describe(self) -> str:
        return f"{self.kind.label} started by kvtune ({self.binary})"

    def plan(self, pick: LaunchPick, port: int) -> EnginePlan:
        return self.kind.plan(pick, binary=self.binary, model=self.model, host=self.host, port=port,
                              threads=self.threads)

    def why_not(self, pick: LaunchPick) -> str | None:
        try:
            self.plan(pick, 0)
        except Unsupported as exc:
            return str(exc)
        return None

    @contextlib.contextmanager
    def running(self, pick: LaunchPick) -> Iterator[RunningEngine]:
        self.starts += 1
        log = self.log_dir / f"engine-{os.getpid()}-{self.starts}.log"
        with start_engine(self.kind, lambda port: self.plan(pick, port), self.host, self.port, log, self.env,
                          self.timeout_s) as (plan, proc, root):
            rep = checked_report(self.kind, plan, proc, root)
            yield RunningEngine(url=root + "/v1", served_model=rep.served_model or plan.served_model, report=rep,
                                launch_line=plan.launch_line, plan=plan, process=proc, kind=self.kind, api=self.api)


# the fields a command template may name, filled per config
TEMPLATE_FIELDS = ("port", "host", "batch_cap", "chunk_tokens", "kv_dtype", "tp", "spec_k", "model", "threads",
                   "ctx_tokens", "gpu_mem_util")


class TemplateAdapter(Adapter):
    """The user's own command, its ``{field}``s filled per config (``TEMPLATE_FIELDS``): e.g.
    ``docker run ... vllm serve {model} --max-num-seqs {batch_cap} --port {port}``. ``engine``
    names what it runs (its health check and read-back); "" reads back whatever answers."""

    def __init__(self, template: str, *, engine: str = "", threads: int | None = None, host: str = "127.0.0.1",
                 port: int | None = None, log_dir: Path, env: dict[str, str] | None = None,
                 startup_timeout_s: float = STARTUP_TIMEOUT_S, model: str | None = None):
        names = [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]
        bad = [n for n in names if n not in TEMPLATE_FIELDS]
        if bad or not names and "{" in template:
            raise InputError(f"--command: unknown field {{{bad[0] if bad else ''}}} (fields: "
                             f"{', '.join('{' + f + '}' for f in TEMPLATE_FIELDS)})")
        if "port" not in names and port is None:
            raise InputError("--command: the template must place {port} (kvtune picks a free port per start), "
                             "or give --port")
        try:
            shlex.split(template)
        except ValueError as exc:
            raise InputError(f"--command: {exc}") from None
        self.template, self.engine = template, engine
        self.kind: EngineKind | None = kind_of(engine) if engine else None
        self.threads, self.host, self.port, self.model = threads, host, port, model
        self.log_dir, self.env, self.timeout_s = Path(log_dir), env, startup_timeout_s
        self.starts = 0

    def describe(self) -> str:
        return f"your command template ({self.template[:60]}{'...' if len(self.template) > 60 else ''})"

    def plan(self, pick: LaunchPick, port: int) -> EnginePlan:
        try:   # the total context kvtune's llama-server line would give (-c)
            largv = llamacpp_argv(pick)[0]
            ctx = int(largv[largv.index("-c") + 1])
        except Unsupported:
            ctx = 0
        values = {"port": port, "host": self.host, "batch_cap": pick.batch_cap, "chunk_tokens": pick.chunk_tokens,
                  "kv_dtype": pick.kv_dtype, "tp": pick.tp, "spec_k": pick.spec_k, "model": self.model or pick.model,
                  "threads": self.threads or "", "ctx_tokens": ctx, "gpu_mem_util": f"{pick.gpu_mem_util:g}"}
        text = self.template.format(**{k: shlex.quote(str(v)) for k, v in values.items()})
        argv = tuple(shlex.split(text))
        return EnginePlan(self.engine or "template", argv, pick.batch_cap, pick.chunk_tokens,
                          None, self.threads, str(self.model or pick.model))

    @contextlib.contextmanager
    def running(self, pick: LaunchPick) -> Iterator[RunningEngine]:
        self.starts += 1
        log = self.log_dir / f"engine-{os.getpid()}-{self.starts}.log"
        with start_engine(self.kind or GENERIC, lambda port: self.plan(pick, port), self.host, self.port, log,
                          self.env, self.timeout_s) as (plan, proc, root):
            kind = self.kind or detect_kind(root)
            rep = checked_report(kind, plan, proc, root)
            yield RunningEngine(url=root + "/v1", served_model=rep.served_model or plan.served_model, report=rep,
                                launch_line=plan.launch_line, plan=plan, process=proc, kind=kind, api=self.api)
