"""The base of each engine's home module: ``EngineHome`` (what the optimizer knows of one engine:
its pinned version, its flags, its launch line, and, where ``kvtune tune`` can start it, its adapter)
and the adapter's base, ``EngineKind``.

Each engine's home is one module of this package (``vllm.py``, ``sglang.py``, ``trtllm.py``,
``llamacpp.py``) exporting ``HOME``; ``registry.py`` lists them once. Its pure policy (scheduler,
admission, what it can launch) is ``costmodel.engines.<name>``, under the same name.

An ``EngineKind`` (one per engine that ``kvtune tune`` can start, in that engine's module beside its
launch line: ``vllm.py``, ``sglang.py``, ``llamacpp.py``) turns a ``LaunchPick`` into an
``EnginePlan`` (the exact argv, and the slots, KV pool, chunk budget and threads the engine must
then report) and reads an ``EngineReport`` back from the running server.
``optimizer.adapters.engines.check`` compares the two: a server that came up other than planned is
not measured (its figures would describe another config).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Callable, Mapping

from kvtune.costmodel.engines import Engine, get_engine
from kvtune.optimizer.server_http import get, get_json

from .pick import LaunchPick
from .shell import command
from .versions import EngineVersion

__all__ = ["EngineHome", "ServeLine", "EngineReport", "EnginePlan", "EngineKind", "set_flag", "whole", "served_models",
           "model_matches"]


@dataclass(frozen=True)
class ServeLine:
    """One engine's serving command for a pick: its argv, the notes that explain it, and (TensorRT-LLM)
    the config file it reads, as a dict to write as YAML."""

    argv: list[str]
    notes: list[str]
    config: dict | None = None


@dataclass(frozen=True)
class EngineHome:
    """What the optimizer knows of one engine, from its one module (the package docstring)."""

    name: str                    # costmodel.engines' name for it (--engine, the workload's engine:)
    version: EngineVersion       # the release whose own flag definitions the launch line was read from
    flags: Mapping[str, str]     # every flag its launch line may hold -> where that version defines it
    # (pick, node_rank, leader_addr, nnodes, config_dir) -> ServeLine; raises launch.pick.Unsupported
    # where the engine cannot run the pick. node_rank None: one node; config_dir None: the config file
    # beside the command (a Kubernetes manifest mounts it)
    serve_line: Callable[..., ServeLine]
    head: int = 0                # argv words on the pasted command's first line (SGLang: python -m module)
    config_file: str | None = None   # the file serve_line's config is written to (TensorRT-LLM: config.yaml)
    config_flag: str = ""        # the flag that names it (TensorRT-LLM: --extra_llm_api_options)
    worker_flags: str = "--node-rank r"   # what node r > 0 of a multi-node replica adds to the command
    # (speculative method, draft length) -> whether prompt chunks still ride in decode steps (None: always)
    mixed_chunks: Callable[[str | None, int], bool] | None = None
    adapter: EngineKind | None = None     # how kvtune tune starts and reads it back (None: tune refuses)
    config_keys: Mapping[str, str] = field(default_factory=dict)   # config-file keys -> where defined
    # optimizer.space's knobs it sets: knob -> (flag, where defined); the search holds the others at their default
    knob_flags: Mapping[str, tuple[str, str]] = field(default_factory=dict)

    @property
    def policy(self) -> Engine:
        """Its pure policy (``costmodel.engines``): scheduling, admission, capabilities."""
        return get_engine(self.name)

    @property
    def label(self) -> str:
        """Engine and version as a person writes them (``vLLM 0.33.0``)."""
        return self.version.label

    def scheduling(self, spec_method: str | None, spec_k: int) -> str:
        """'mixed' (prompt chunks ride in decode steps) or 'prefill_first' under these settings."""
        return "prefill_first" if self.mixed_chunks is not None and not self.mixed_chunks(spec_method, spec_k) \
            else "mixed"


@dataclass(frozen=True)
class EngineReport:
    """What a running server says about itself (None: it does not say)."""

    engine: str = ""
    version: str = ""
    served_model: str = ""          # the id /v1/models lists (what requests name)
    model_path: str = ""            # the weights it loaded, where it says
    slots: int | None = None        # sequences it runs at once (llama.cpp -np, SGLang max_running_requests)
    pool_tokens: int | None = None  # its KV pool, tokens
    chunk_tokens: int | None = None  # the most tokens one step takes (llama.cpp -b, SGLang chunked prefill)
    threads: int | None = None      # CPU threads (llama.cpp -t)
    threads_batch: int | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> EngineReport:
        return cls(**{f.name: d.get(f.name, f.default) for f in fields(cls)})


@dataclass(frozen=True)
class EnginePlan:
    """What kvtune starts and what the server must then report."""

    kind: str
    argv: tuple[str, ...]
    slots: int
    chunk_tokens: int
    pool_tokens: int | None         # what the server must report (llama.cpp: -c); None: not checked
    threads: int | None
    served_model: str               # sent as "model" in requests (confirmed from /v1/models once up)
    notes: tuple[str, ...] = field(default=())
    head: int = 0                   # argv words on the pasted command's first line (SGLang: python -m module)

    @property
    def launch_line(self) -> str:
        """The exact command as a user pastes it (one flag per line)."""
        return command(list(self.argv), head=self.head)


def set_flag(argv: list[str], flag: str, value: str) -> list[str]:
    """``argv`` with ``flag``'s value set (replaced where present, appended where not)."""
    out = list(argv)
    if flag in out:
        out[out.index(flag) + 1] = value
    else:
        out += [flag, value]
    return out


def whole(v: Any) -> int | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return int(f) if f >= 1 and f == int(f) else None


def served_models(root: str, timeout_s: float = 5.0) -> list[str]:
    """The model ids ``GET /v1/models`` lists (empty if it lists none or answers otherwise)."""
    st, d = get_json(root, "/v1/models", timeout_s)
    if st != 200 or not isinstance(d, dict) or not isinstance(d.get("data"), list):
        return []
    return [str(m.get("id")) for m in d["data"] if isinstance(m, dict) and m.get("id")]


def _norm(s: str) -> str:
    return re.sub(r"[^a-z0-9]", "", s.lower())


def model_matches(served: str, names: tuple[str, ...]) -> bool:
    """Whether a served model id (an HF id, a path, a GGUF file name) is one of ``names`` (the
    catalog name, its HF id): compared without case and punctuation, the served id's last path
    part containing a name's last part."""
    tail = _norm(served.replace("\\", "/").rsplit("/", 1)[-1])
    return any(n and _norm(n.rsplit("/", 1)[-1]) in tail for n in names)


class EngineKind:
    """One engine kvtune starts (subclasses per engine)."""

    name = ""
    label = ""
    default_binary = ""
    health_path = "/health"
    # identifying a server kvtune did not start (optimizer.adapters.engines.detect_kind): the
    # introspection route only this engine answers, with a key its JSON holds; kinds are tried in
    # probe_rank order (a route other engines may also answer goes last)
    probe: tuple[str, str] | None = None
    probe_rank = 0
    server_header = ""          # a word of the Server header only this engine sends ("" none)
    chunk_label = "chunk budget"   # what the engine calls its per-step token budget, as check() says it
    model_is_file = False       # --model-file names a local file (llama.cpp's GGUF), not a model id

    def plan(self, pick: LaunchPick, *, binary: str, model: str | None, host: str, port: int,
             threads: int | None) -> EnginePlan:
        raise NotImplementedError

    def healthy(self, root: str, timeout_s: float = 2.0) -> bool:
        """The server answers its health check (raises ``Unreachable`` while nothing listens)."""
        st, _, _ = get(root, self.health_path, timeout_s)
        return st == 200

    def read_back(self, root: str, log_text: str = "", timeout_s: float = 5.0) -> EngineReport:
        raise NotImplementedError

    def busy(self, root: str, timeout_s: float = 5.0) -> bool | None:
        """Whether requests are still in the engine (None: it does not say)."""
        return None

    def planned_chunk(self, plan: EnginePlan) -> int:
        """The per-step token budget the running server must report for ``plan``."""
        return plan.chunk_tokens

    def identify(self, root: str, headers: Mapping[str, str], timeout_s: float = 5.0) -> bool:
        """Whether the server at ``root`` (whose ``/v1/models`` answered with ``headers``) is this engine."""
        if self.server_header and self.server_header in headers.get("server", ""):
            return True
        if self.probe is None:
            return False
        path, key = self.probe
        st, d = get_json(root, path, timeout_s)
        return st == 200 and isinstance(d, dict) and key in d
