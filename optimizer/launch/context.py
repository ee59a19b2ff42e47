"""How long a request each engine is launched to accept, sized to what the workload needs and what
the KV pool holds, so the engine comes up and takes every request kvtune simulated.

- vLLM 0.33.0 refuses to start when its KV cache cannot hold one request of ``max_model_len``
  (vllm/v1/core/kv_cache_planning.py ``check_enough_kv_cache_memory`` ->
  ``_check_enough_kv_cache_memory``: "To serve at least one request with the model's max seq len
  ... KV cache is needed, which is larger than the available KV cache memory"). The need is whole
  blocks (``cdiv(max_model_len, block_size) x page bytes``, FullAttentionSpec.max_memory_usage_bytes)
  and the pool it is checked against has the null block taken out (``_pool_bytes_per_block``).
  Without ``--max-model-len`` vLLM takes the model's own context (128k for Llama 3.1), which a
  small pool (the rag example's 8,827-token prefill pool) cannot hold: ``--max-model-len`` is
  always emitted.
- SGLang 0.5.23 starts with a pool smaller than ``--context-length`` but then refuses or
  truncates long requests (srt/managers/tp_worker.py: ``max_req_len = min(context_len - 1,
  kv_capacity - 1)``, ``max_req_input_len = max_req_len - 5``): ``--context-length`` is sized so
  that the longest prompt and the longest request both pass.
- TensorRT-LLM 1.0.0: ``max_seq_len`` (LlmArgs) caps prompt + output; sized the same way, in
  whole KV blocks of ``tokens_per_block`` (KvCacheConfig default 32).

A disaggregated prefill replica runs only the prompt and its first token (the router sends it the
request with one output token), so its need is the longest prompt + 1; a decode or aggregated
replica needs the longest prompt + output.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .pick import LaunchPick, Unsupported

__all__ = ["RequestLengths", "request_lengths", "Sized", "vllm_max_model_len", "sglang_context_length",
           "trtllm_max_seq_len", "VLLM_BLOCK_TOKENS", "TRTLLM_BLOCK_TOKENS", "SGLANG_INPUT_MARGIN"]

VLLM_BLOCK_TOKENS = 16     # vLLM 0.33.0 CacheConfig.block_size on CUDA (platforms/cuda.py: 16 when unset)
TRTLLM_BLOCK_TOKENS = 32   # TensorRT-LLM 1.0.0 KvCacheConfig.tokens_per_block default
SGLANG_INPUT_MARGIN = 6    # SGLang 0.5.23 tp_worker.py: max_req_input_len = context_len - 1 - 5
# a length distribution without ``max``: the share of requests the launch covers (the same
# quantile optimizer/workload.py checks against the model's context)
LENGTH_QUANTILE = 0.999


@dataclass(frozen=True)
class RequestLengths:
    """The longest prompt and the longest prompt + output the workload sends, tokens."""

    prompt_tokens: int
    total_tokens: int


def request_lengths(workload) -> RequestLengths | None:
    """From a ``costmodel.traffic.Workload``: a trace's longest, or each class's bound (its
    ``max``, else its 99.9th percentile)."""
    if workload is None:
        return None
    if workload.trace is not None:
        t = workload.trace
        if not len(t):
            return None
        return RequestLengths(int(t.input_tokens.max()), int((t.input_tokens + t.output_tokens).max()))
    prompt = total = 0
    for c in workload.classes:
        def high(d) -> int:
            b = d.upper_bound
            return int(math.ceil(b if math.isfinite(b) else d.quantile(LENGTH_QUANTILE)))
        i, o = high(c.input_tokens), high(c.output_tokens)
        prompt, total = max(prompt, i), max(total, i + o)
    return RequestLengths(prompt, total) if total else None


@dataclass(frozen=True)
class Sized:
    value: int | None          # the flag's value; None: leave the engine's default
    note: str = ""


def _need(p: LaunchPick, role: str) -> int | None:
    if role == "prefill":
        return None if p.max_prompt_tokens is None else int(p.max_prompt_tokens) + 1
    return None if p.max_request_tokens is None else int(p.max_request_tokens)


def _pool_tokens(p: LaunchPick) -> int | None:
    # one engine worker's pool: under DP attention each rank holds its own requests
    return None if p.memory is None else int(p.memory.kv_pool_tokens_per_gpu)


def _size(p: LaunchPick, role: str, holds: int | None, engine: str, flag: str, need_of=None) -> Sized:
    need = _need(p, role)
    if need is not None and need_of is not None:
        need = need_of(need)
    ctx = int(p.model_context_tokens or 0)
    if need is not None and ctx and need > ctx:
        need = ctx   # the workload reader refuses requests beyond the model's context; never ask for more
    if holds is not None and holds < 1:
        raise Unsupported(f"the KV pool ({_pool_tokens(p):,} tokens per GPU) holds no whole {engine} block")
    if need is None:
        if holds is None or (ctx and holds >= ctx):
            return Sized(None)
        return Sized(holds, f"context: {flag} {holds:,}, the most the {_pool_tokens(p):,}-token KV pool holds "
                            f"(no workload lengths given)")
    if holds is not None and need > holds:
        return Sized(holds, f"context: the longest request kvtune simulated needs {need:,} tokens but the "
                            f"{_pool_tokens(p):,}-token KV pool holds {holds:,}: {flag} {holds:,}; {engine} "
                            f"refuses longer requests")
    what = "the longest prompt + its first token" if role == "prefill" else "the longest prompt + output"
    return Sized(need, f"context: {flag} {need:,} = {what} kvtune simulated" +
                 ("" if holds is None else f" (the KV pool holds {holds:,})"))


def vllm_max_model_len(p: LaunchPick, role: str = "serve") -> Sized:
    """``--max-model-len`` for vLLM 0.33.0: at most what passes its start-up check (whole blocks,
    less the null block)."""
    pool = _pool_tokens(p)
    holds = None if pool is None else (pool // VLLM_BLOCK_TOKENS - 1) * VLLM_BLOCK_TOKENS
    return _size(p, role, holds, "vLLM", "--max-model-len")


def sglang_context_length(p: LaunchPick, role: str = "serve") -> Sized:
    """``--context-length`` for SGLang 0.5.23: room for the longest request (``- 1``) and the
    longest prompt (``- 6``); never above the pool (SGLang caps requests there anyway)."""
    pool = _pool_tokens(p)
    prompt = p.max_prompt_tokens

    def need_of(n: int) -> int:
        return max(n + 1, (int(prompt) + SGLANG_INPUT_MARGIN) if prompt is not None else 0)
    return _size(p, role, pool, "SGLang", "--context-length", need_of)


def trtllm_max_seq_len(p: LaunchPick, role: str = "serve") -> Sized:
    pool = _pool_tokens(p)
    holds = None if pool is None else (pool // TRTLLM_BLOCK_TOKENS) * TRTLLM_BLOCK_TOKENS
    return _size(p, role, holds, "TensorRT-LLM", "max_seq_len")
