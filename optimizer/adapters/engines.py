"""The engines kvtune starts itself, as ``kvtune tune`` reaches them: each registered engine's
adapter (``EngineKind``, in its home module ``optimizer.launch.<name>``: its command line from
kvtune's own launch settings, how it says it is healthy, what it says about itself once up), a
generic one for a server kvtune cannot name, and ``check``: a server that came up other than planned
is not measured (its figures would describe another config).

- llama.cpp ``llama-server`` (``optimizer.launch.llamacpp.LlamaCpp``): ``/props``, ``/slots`` and the
  server log (``llama_context: n_ctx``, ``n_batch``, ``system_info: n_threads``).
- vLLM ``vllm serve`` (``optimizer.launch.vllm.Vllm``): ``/version``, ``/v1/models`` and the KV pool
  from ``/metrics`` (``vllm:cache_config_info``).
- SGLang ``python -m sglang.launch_server`` (``optimizer.launch.sglang.Sglang``):
  ``/get_server_info`` (``max_running_requests``, ``chunked_prefill_size``, ``max_total_num_tokens``).
- TensorRT-LLM has no adapter: ``kind_of`` refuses it with the reason.
"""

from __future__ import annotations

from kvtune.optimizer.launch.registry import HOMES
from kvtune.optimizer.launch.serving import (EngineKind, EnginePlan, EngineReport, model_matches, served_models,
                                             set_flag)
from kvtune.optimizer.server_http import Unreachable, get

from .errors import InputError

__all__ = ["EngineReport", "EnginePlan", "EngineKind", "kinds", "GENERIC", "kind_of", "detect_kind", "check",
           "served_models", "model_matches", "set_flag"]


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


GENERIC = Generic()


def kinds() -> dict[str, EngineKind]:
    """The registered engines kvtune tune can start, by name (``optimizer.launch.registry``)."""
    return {name: h.adapter for name, h in HOMES.items() if h.adapter is not None}


def detect_kind(root: str, timeout_s: float = 5.0) -> EngineKind:
    """Which engine answers at ``root``: each registered adapter's ``identify`` (its Server header or
    its own introspection route), in ``probe_rank`` order, else ``GENERIC``."""
    try:
        _, headers, _ = get(root, "/v1/models", timeout_s)
        for kind in sorted(kinds().values(), key=lambda k: k.probe_rank):
            if kind.identify(root, headers, timeout_s):
                return kind
    except Unreachable:
        pass
    return GENERIC


def kind_of(name: str) -> EngineKind:
    """The adapter of engine ``name``; ``InputError`` saying why where kvtune tune cannot start it."""
    starts = kinds()
    if name not in starts:
        why = f"{HOMES[name].label} has no adapter here" if name in HOMES else "no such engine"
        raise InputError(f"--engine {name!r}: kvtune tune starts {', '.join(starts)} ({why}; or give --command "
                         f"or --url)")
    return starts[name]


def check(plan: EnginePlan, rep: EngineReport) -> list[str]:
    """Where the running server differs from the plan (empty: as planned, as far as it says)."""
    out = []
    for what, planned, got in (("slots", plan.slots, rep.slots), ("KV pool tokens", plan.pool_tokens, rep.pool_tokens),
                               ("threads", plan.threads, rep.threads), ("batch threads", plan.threads, rep.threads_batch)):
        if planned is not None and got is not None and planned != got:
            out.append(f"{what} {got} (planned {planned})")
    kind = kinds().get(plan.kind, GENERIC)
    want = kind.planned_chunk(plan)
    if rep.chunk_tokens is not None and rep.chunk_tokens != want:
        out.append(f"{kind.chunk_label} {rep.chunk_tokens} tokens (planned {want})")
    return out
