"""``llama-server`` for llama.cpp at ggml-org/llama.cpp@0c1e57098 (flags: versions.FLAGS["llamacpp"]).

Slots are the batch cap (``-np``); the logical and physical batch (``-b``/``-ub``) are the chunk
budget, so a step carries at most that many prompt + decode tokens, mixed (continuous batching,
``-cb``); ``-c`` is the total context = slots x per-slot context, held in one KV buffer all slots
share (``-kvu``), the paged pool kvtune simulated: per-slot context = kvtune's pool tokens / slots
(or the longest request when no memory plan is known).
"""

from __future__ import annotations

from .pick import NGRAM_MATCH_TOKENS, LaunchPick, Unsupported

__all__ = ["llamacpp_argv", "PORT"]

PORT = 8000   # set explicitly (llama-server's default is 8080)


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


def llamacpp_argv(p: LaunchPick) -> tuple[list[str], list[str]]:
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
    if per_slot < 1:
        held = f"the KV pool ({p.memory.kv_pool_tokens} tokens)" if p.memory is not None else "the request length"
        raise Unsupported(f"{held} holds less than one token per slot at {slots} slots")
    argv = ["llama-server", "-m", f"<{p.model} as a BF16 GGUF>", "-np", str(slots), "-c", str(slots * per_slot),
            "-kvu", "-b", str(p.chunk_tokens), "-ub", str(p.chunk_tokens), "-cb", "-ngl", "all",
            "--cache-prompt" if p.prefix_caching else "--no-cache-prompt", *_spec(p),
            "--host", "0.0.0.0", "--port", str(PORT)]
    notes.insert(0, f"model: llama-server loads GGUF; convert {p.model} with llama.cpp's convert_hf_to_gguf.py "
                    f"--outtype bf16 (the 2-byte weights kvtune planned)")
    notes.append(f"context: -c {slots * per_slot} = {slots} slots x {per_slot} tokens per slot")
    return argv, notes
