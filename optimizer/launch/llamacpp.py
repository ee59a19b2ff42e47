"""``llama-server`` for llama.cpp at ggml-org/llama.cpp@0c1e57098 (flags: versions.FLAGS["llamacpp"]).

Slots are the batch cap (``-np``); the logical and physical batch (``-b``/``-ub``) are the chunk
budget, so a step carries at most that many prompt + decode tokens, mixed (continuous batching,
``-cb``); ``-c`` is the total context = slots x per-slot context, held in one KV buffer all slots
share (``-kvu``), the paged pool kvtune simulated: per-slot context = kvtune's pool tokens / slots
(or the longest request when no memory plan is known), but never more than the slots can use at once:
slots x the longest request kvtune simulated, when known (a CPU host's plan covers the whole declared
memory; a buffer that size would only be allocated, never filled). ``-c`` is rounded up to a
multiple of 256, as llama.cpp pads it (src/llama-context.cpp: ``GGML_PAD(n_ctx, 256)``), so the
printed context is the one the server runs and reports. ``-t``/``-tb`` (CPU threads for decode
and for prompt batches) are emitted when the thread count is known (``kvtune tune`` always knows
it and records it with every run).
"""

from __future__ import annotations

from .pick import NGRAM_MATCH_TOKENS, LaunchPick, Unsupported

__all__ = ["llamacpp_argv", "PORT", "CTX_PAD_TOKENS"]

PORT = 8000   # set explicitly (llama-server's default is 8080)
CTX_PAD_TOKENS = 256   # llama.cpp rounds n_ctx up to a multiple of this (src/llama-context.cpp GGML_PAD)


def _spec(p: LaunchPick) -> list[str]:
    if not p.speculating:
        return []
    m, k = p.spec_method, str(int(p.spec_k))
    if m in ("draft", "eagle3"):
        kind = "draft-simple" if m == "draft" else "draft-eagle3"
        return ["--spec-type", kind, "-md", f"<{p.require_draft('llama.cpp')} as GGUF>", "--spec-draft-n-max", k]
    if m == "mtp":
        p.require_mtp()
        return ["--spec-type", "draft-mtp", "--spec-draft-n-max", k]
    if m == "ngram":
        return ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", str(NGRAM_MATCH_TOKENS),
                "--spec-ngram-simple-size-m", k]
    raise Unsupported(f"speculative method {m!r}: llama-server (0c1e57098) drafts with draft-simple, draft-eagle3, "
                      f"draft-mtp and the n-gram types; it has no {m} heads")


def _padded(tokens: int) -> int:
    return -(-tokens // CTX_PAD_TOKENS) * CTX_PAD_TOKENS


def llamacpp_argv(p: LaunchPick, *, threads: int | None = None,
                  model_path: str | None = None) -> tuple[list[str], list[str]]:
    """(argv, notes). ``threads``: ``-t``/``-tb``; ``model_path``: the GGUF file to load (default a
    placeholder naming the format to convert to)."""
    if p.gpus_per_replica > 1 or p.multi_node:
        raise Unsupported(f"TP {p.tp} x PP {p.pp}: llama.cpp's --split-mode splits layers or rows across GPUs, "
                          f"which is not the tensor parallelism kvtune simulated; use one GPU (or the CPU) per server")
    if p.weights == "fp8":
        raise Unsupported("FP8 weights: GGUF has no FP8 format (Q8_0 is 8.5 bits per weight with block scales, "
                          "not what kvtune planned)")
    if p.kv_dtype == "fp8":
        raise Unsupported("FP8 KV cache: llama-server's --cache-type-k/v offer f32, f16, bf16, q8_0, q4_0, ... and "
                          "no fp8")
    notes = []
    slots = p.batch_cap
    if p.memory is not None:
        per_slot = p.memory.kv_pool_tokens // slots
        if p.max_request_tokens and per_slot < p.max_request_tokens:
            notes.append(f"context: {per_slot} tokens per slot is below the longest request "
                         f"({p.max_request_tokens}); the shared buffer (-kvu) lets a slot use more while others "
                         f"use less, as kvtune's pool does")
    elif p.max_request_tokens:
        per_slot = int(p.max_request_tokens)
    else:
        raise Unsupported("no memory plan and no request length to size -c (total context) from")
    capped = ""
    if p.memory is not None and p.max_request_tokens and per_slot > p.max_request_tokens:
        capped = (f" (the longest request kvtune simulated; the plan's pool, {p.memory.kv_pool_tokens:,} tokens, "
                  f"would never fill)")
        per_slot = int(p.max_request_tokens)
    if per_slot < 1:
        held = f"the KV pool ({p.memory.kv_pool_tokens} tokens)" if p.memory is not None else "the request length"
        raise Unsupported(f"{held} holds less than one token per slot at {slots} slots")
    # padded as llama.cpp pads it: up where the requests size it, down where the pool does (memory)
    ctx = _padded(slots * per_slot) if capped or p.memory is None or slots * per_slot < CTX_PAD_TOKENS \
        else slots * per_slot // CTX_PAD_TOKENS * CTX_PAD_TOKENS
    model = model_path or f"<{p.model} as a BF16 GGUF>"
    threads_argv = ["-t", str(threads), "-tb", str(threads)] if threads else []
    argv = ["llama-server", "-m", model, "-np", str(slots), "-c", str(ctx), *threads_argv,
            "-kvu", "-b", str(p.chunk_tokens), "-ub", str(p.chunk_tokens), "-cb", "-ngl", "all",
            "--cache-prompt" if p.prefix_caching else "--no-cache-prompt", *_spec(p),
            "--host", "0.0.0.0", "--port", str(PORT)]
    if not model_path:
        notes.insert(0, f"model: llama-server loads GGUF; convert {p.model} with llama.cpp's convert_hf_to_gguf.py "
                        f"--outtype bf16 (the 2-byte weights kvtune planned)")
    notes.append(f"context: -c {ctx} = {slots} slots x {per_slot} tokens per slot{capped}"
                 + (f", rounded to a multiple of {CTX_PAD_TOKENS} as llama.cpp pads it" if ctx != slots * per_slot else ""))
    if not threads:
        notes.append("threads: llama-server uses every core by default; pass -t/-tb with the thread count your "
                     "calibration was measured at (kvtune tune records it)")
    return argv, notes
