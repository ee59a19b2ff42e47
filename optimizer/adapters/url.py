"""A server the user launched (``kvtune tune --url``): kvtune measures only the configs it runs.

What it runs is read once from the server (``engines.detect_kind`` and that engine's read-back):
its model (``/v1/models``, which must be the workload's), and where the engine says so, its slots,
chunk budget and KV pool. A config is measured only if it matches what the server reports; the
others are left out, with the reason, and kvtune never restarts or reconfigures your server.
"""

from __future__ import annotations

import contextlib
import urllib.parse
from typing import Iterator

from kvtune.optimizer.launch.pick import LaunchPick
from kvtune.optimizer.profile_run import refused

from .base import Adapter, RunningEngine
from .engines import EngineKind, EngineReport, detect_kind, model_matches, served_models
from .errors import EngineCrashed, InputError
from kvtune.optimizer.server_http import ServerRoot, Unreachable, get, root_of

__all__ = ["UrlAdapter"]


class UrlAdapter(Adapter):
    starts_engines = False

    def __init__(self, url: str, model_names: tuple[str, ...], served_model: str | None = None,
                 timeout_s: float = 10.0, api_key: str | None = None, api: str = "completions"):
        u = urllib.parse.urlsplit(url)
        try:
            u.port  # noqa: B018  (urllib checks the port's range only when asked)
        except ValueError as exc:
            raise InputError(f"--url {url!r}: {exc}") from None
        if u.scheme not in ("http", "https") or not u.hostname:
            raise InputError(f"--url {url!r}: expected http://HOST:PORT/v1")
        self.api_key, self.api = api_key, api
        self.root = ServerRoot(root_of(url), api_key)
        self.url = self.root + "/v1"
        try:
            st, _, _ = get(self.root, "/v1/models", timeout_s)
        except Unreachable as exc:
            raise InputError(f"--url {url}: cannot reach the server: {exc}") from None
        if st in (401, 403):
            raise InputError(f"--url {url}: GET /v1/models answered HTTP {st}: {refused(api_key)}")
        if st != 200:
            raise InputError(f"--url {url}: GET /v1/models answered HTTP {st} (not an OpenAI-compatible server?)")
        models = served_models(self.root, timeout_s)
        if served_model:
            if served_model not in models:
                raise InputError(f"--served-model {served_model!r}: the server at {url} serves "
                                 f"{', '.join(map(repr, models)) or 'no model'}")
            self.served = served_model
        else:
            hits = [m for m in models if model_matches(m, model_names)]
            if not hits:
                raise InputError(f"--url {url}: the server serves {', '.join(map(repr, models)) or 'no model'}, not the "
                                 f"workload's model {' / '.join(n for n in model_names if n)}; if it is the same "
                                 f"model under another name, say so with --served-model NAME")
            self.served = hits[0]
        self.kind: EngineKind = detect_kind(self.root, timeout_s)
        self.engine = self.kind.name
        self.report: EngineReport = self.kind.read_back(self.root, "", timeout_s)

    def describe(self) -> str:
        r = self.report
        what = ", ".join(x for x in (
            f"{r.slots} slots" if r.slots else "", f"chunk {r.chunk_tokens}" if r.chunk_tokens else "",
            f"KV pool {r.pool_tokens:,} tokens" if r.pool_tokens else "") if x)
        return f"the {self.kind.label} you launched at {self.url} ({self.served}{'; ' + what if what else ''})"

    def why_not(self, pick: LaunchPick) -> str | None:
        r = self.report
        if r.slots is not None and pick.batch_cap != r.slots:
            return f"batch cap {pick.batch_cap}: the server at {self.url} runs {r.slots}"
        if r.chunk_tokens is not None and self.kind.name != "llamacpp" and pick.chunk_tokens != r.chunk_tokens:
            return f"chunk budget {pick.chunk_tokens}: the server at {self.url} runs {r.chunk_tokens}"
        return None

    @contextlib.contextmanager
    def running(self, pick: LaunchPick) -> Iterator[RunningEngine]:
        yield _UrlEngine(url=self.url, served_model=self.served, report=self.report, launch_line="", plan=None,
                         process=None, kind=self.kind, api_key=self.api_key, api=self.api)


class _UrlEngine(RunningEngine):
    def check_alive(self) -> None:
        try:
            st, _, _ = get(self.root, "/v1/models", 5.0)
        except Unreachable as exc:
            raise EngineCrashed(f"the server at {self.url} stopped answering during a run: {exc}") from None
        if st != 200:
            raise EngineCrashed(f"the server at {self.url} answers GET /v1/models with HTTP {st} during a run")
