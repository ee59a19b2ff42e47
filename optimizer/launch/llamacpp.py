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

from kvtune.costmodel.checkpoints import GGUF_TYPES, Checkpoint, gguf_file, local_copy

from .pick import NGRAM_MATCH_TOKENS, LaunchPick, Unsupported

__all__ = ["llamacpp_argv", "llamacpp_model", "PORT", "CTX_PAD_TOKENS"]

PORT = 8000   # set explicitly (llama-server's default is 8080)
CTX_PAD_TOKENS = 256   # llama.cpp rounds n_ctx up to a multiple of this (src/llama-context.cpp GGML_PAD)


def llamacpp_model(c: Checkpoint, flag: str, hub_flag: str) -> tuple[list[str], list[str]]:
    """(argv, notes) that load GGUF ``c``: a published repository by ``hub_flag`` (``-hf repo:TYPE``:
    llama-server downloads the file named *TYPE.gguf, common/download.cpp find_best_model), else a
    local file by ``flag`` with the llama.cpp commands that make it."""
    t = GGUF_TYPES[c.weights]
    if c.kind == "gguf_hub":
        return [hub_flag, c.id], [f"model: {c.repo} publishes {t} GGUF files ({c.source})"]
    if not c.recipe:   # a GGUF file that exists: the workload's checkpoint
        return [flag, c.id], [f"model: the {t} GGUF file {c.id} ({c.source})"]
    return [flag, c.id], [f"model: make {c.id} ({t}) from {c.made_from} with llama.cpp's tools: "
                          + " && ".join(c.recipe)]


def _draft(p: LaunchPick, eagle3: bool) -> tuple[list[str], list[str]]:
    """The draft's GGUF (-md FILE or -hfd repo:TYPE): drafts run bf16 (costmodel.draft); an EAGLE-3
    head converts with the target's metadata (convert_hf_to_gguf.py --target-model-dir)."""
    draft = p.require_draft("llama.cpp")
    c = gguf_file(draft, "bf16")
    if eagle3:   # convert_hf_to_gguf.py --target-model-dir: an EAGLE-3 head needs the target's metadata
        (src, get), (tdir, tget) = local_copy(draft), local_copy(p.model)
        c = Checkpoint(c.id, "gguf_file", "bf16", made_from=draft, recipe=get + tget + (
            f"python convert_hf_to_gguf.py {src} --target-model-dir {tdir} --outtype bf16 --outfile {c.id}",))
    argv, notes = llamacpp_model(c, "-md", "-hfd")
    return argv, [n.replace("model: ", "draft: ", 1) for n in notes]


def _spec(p: LaunchPick) -> tuple[list[str], list[str]]:
    if not p.speculating:
        return [], []
    m, k = p.spec_method, str(int(p.spec_k))
    if m in ("draft", "eagle3"):
        kind = "draft-simple" if m == "draft" else "draft-eagle3"
        argv, notes = _draft(p, m == "eagle3")
        return ["--spec-type", kind, *argv, "--spec-draft-n-max", k], notes
    if m == "mtp":
        p.require_mtp()
        return ["--spec-type", "draft-mtp", "--spec-draft-n-max", k], []
    if m == "ngram":
        return ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", str(NGRAM_MATCH_TOKENS),
                "--spec-ngram-simple-size-m", k], []
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
    p.require_launchable("llamacpp")   # weights, KV dtype, speculation: costmodel.engines.capabilities
    ckpt = p.weights_checkpoint("llamacpp")
    if ckpt is None:
        raise Unsupported(f"{p.weights} weights: no GGUF file type holds them")
    notes: list[str] = []
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
    model_argv, model_notes = (["-m", model_path], []) if model_path else llamacpp_model(ckpt, "-m", "-hf")
    spec_argv, spec_notes = _spec(p)
    threads_argv = ["-t", str(threads), "-tb", str(threads)] if threads else []
    # the KV cache type kvtune modelled (common/arg.cpp kv_cache_types; f16 is the server's default)
    kv = [] if p.kv_dtype == "fp16" else ["-ctk", GGUF_TYPES[p.kv_dtype].lower(), "-ctv", GGUF_TYPES[p.kv_dtype].lower()]
    argv = ["llama-server", *model_argv, "-np", str(slots), "-c", str(ctx), *threads_argv,
            "-kvu", "-b", str(p.chunk_tokens), "-ub", str(p.chunk_tokens), "-cb", "-ngl", "all", *kv,
            "--cache-prompt" if p.prefix_caching else "--no-cache-prompt", *spec_argv,
            "--host", "0.0.0.0", "--port", str(PORT)]
    notes[:0] = model_notes + spec_notes
    notes.append(f"context: -c {ctx} = {slots} slots x {per_slot} tokens per slot{capped}"
                 + (f", rounded to a multiple of {CTX_PAD_TOKENS} as llama.cpp pads it" if ctx != slots * per_slot else ""))
    if not threads:
        notes.append("threads: llama-server uses every core by default; pass -t/-tb with the thread count your "
                     "calibration was measured at (kvtune tune records it)")
    return argv, notes
