"""``vllm serve`` for vLLM 0.33.0 (flags: versions.FLAGS["vllm"]).

What runs is what kvtune simulated: ``--max-num-seqs`` is the batch cap, ``--max-num-batched-tokens``
the per-step token budget with chunked prefill on (mixed prefill/decode steps, vLLM's V1 scheduler),
``--gpu-memory-utilization`` the same share of the whole GPU memory that kvtune's pool is carved
from (weights + activations + KV pool), prefix caching on or off as simulated, and
``--max-model-len`` sized so the pool passes vLLM's start-up check (context.py).
"""

from __future__ import annotations

import json

from .context import vllm_max_model_len
from .pick import NGRAM_MATCH_TOKENS, LaunchPick, Unsupported

__all__ = ["vllm_argv", "vllm_speculative_config", "vllm_quantization", "PORT"]

PORT = 8000          # vllm/entrypoints/common/cli_args.py default
MASTER_PORT = 29501  # vllm/config/parallel.py ParallelConfig.master_port default
# kvtune method -> vLLM 0.33.0 SpeculativeConfig.method (vllm/config/speculative.py SpeculativeMethod:
# ngram, draft_model, suffix, custom_class, eagle/eagle3/mtp..., ngram_gpu, dspark; medusa is gone)
_METHOD = {"eagle3": "eagle3", "eagle": "eagle", "mtp": "mtp", "ngram": "ngram", "draft": "draft_model"}
# kvtune KV dtype -> vLLM 0.33.0 --kv-cache-dtype (vllm/config/cache.py CacheDType); bf16 is "auto",
# the model's own dtype
_KV_DTYPE = {"fp8": "fp8", "fp16": "float16"}


def vllm_speculative_config(p: LaunchPick) -> dict | None:
    if not p.speculating:
        return None
    m = p.spec_method
    if m not in _METHOD:
        p.require_launchable("vllm")   # the capability table's reason (costmodel.engines.capabilities)
        raise Unsupported(f"speculative method {m!r} is not one vLLM 0.33.0 runs ({', '.join(sorted(_METHOD))})")
    sc: dict = {"method": _METHOD[m], "num_speculative_tokens": int(p.spec_k)}
    if m == "ngram":
        sc["prompt_lookup_min"] = sc["prompt_lookup_max"] = NGRAM_MATCH_TOKENS
    elif m == "mtp":
        p.require_mtp()     # vLLM loads the target's own MTP layers (SpeculativeConfig: model = target)
    else:                   # eagle3 and eagle heads and draft models are separate checkpoints
        sc["model"] = p.require_draft("vLLM")
    return sc


def vllm_quantization(p: LaunchPick) -> tuple[str, list[str], str]:
    """(checkpoint, extra flags, note) for the pick's weights (bf16, fp16: the model's own
    checkpoint, 2 bytes a weight either way; fp8; anything else is refused by ``require_launchable``)."""
    p.require_launchable("vllm")
    if p.weights != "fp8":
        return p.model, [], ""
    ckpt = p.checkpoint("any")
    if ckpt:
        return ckpt, [], (f"FP8 weights: the FP8 checkpoint {ckpt} (vLLM reads its quantization_config; "
                          f"no --quantization flag)")
    # vLLM 0.33.0: --quantization fp8 refuses a bf16 checkpoint (quantization/fp8.py); the online
    # shorthand fp8_per_tensor quantizes bf16 weights while loading (quantization/online/base.py)
    return p.model, ["--quantization", "fp8_per_tensor"], \
        "FP8 weights: online quantization of the bf16 checkpoint while loading (--quantization fp8_per_tensor)"


def _parallel(p: LaunchPick) -> list[str]:
    out = []
    if p.dp_attention:
        if not p.is_moe:
            raise Unsupported("DP attention: vLLM 0.33.0 data parallelism of a dense model is plain replicas, "
                              "not the attention-DP kvtune simulated")
        # attention data-parallel over the replica's ranks, experts expert-parallel over all of them
        out += ["--tensor-parallel-size", "1", "--data-parallel-size", str(p.tp)]
        ep_world = p.tp
    else:
        out += ["--tensor-parallel-size", str(p.tp)]
        ep_world = p.tp
    if p.pp > 1:
        out += ["--pipeline-parallel-size", str(p.pp)]
    if p.ep > 1:
        if p.ep != ep_world:
            raise Unsupported(f"expert parallel size {p.ep}: vLLM 0.33.0 --enable-expert-parallel spreads experts "
                              f"over TP x DP = {ep_world} ranks, not {p.ep}")
        out.append("--enable-expert-parallel")
    return out


def vllm_argv(p: LaunchPick, node_rank: str | None = None, master_addr: str | None = None,
              nnodes: str | None = None, role: str = "serve") -> tuple[list[str], list[str]]:
    """(argv, notes). With ``node_rank`` etc. given, the multi-node (mp backend) form: rank 0 serves,
    the others run ``--headless`` (vllm/entrypoints/cli/serve.py run_headless). ``role``: 'serve'
    (aggregated), 'prefill' or 'decode' (a disaggregated pool; sizes ``--max-model-len``)."""
    ckpt, qflags, qnote = vllm_quantization(p)
    sc = vllm_speculative_config(p)
    ctx = vllm_max_model_len(p, role)
    argv = ["vllm", "serve", ckpt, *_parallel(p)]
    if ctx.value is not None:
        argv += ["--max-model-len", str(ctx.value)]
    argv += ["--max-num-seqs", str(p.batch_cap),
            "--max-num-batched-tokens", str(p.chunk_tokens), "--enable-chunked-prefill",
            "--kv-cache-dtype", _KV_DTYPE.get(p.kv_dtype, "auto"),
            "--gpu-memory-utilization", f"{p.gpu_mem_util:g}", *qflags]
    if sc is not None:
        argv += ["--speculative-config", json.dumps(sc, separators=(",", ":"))]
    argv.append("--enable-prefix-caching" if p.prefix_caching else "--no-enable-prefix-caching")
    if node_rank is not None:
        argv += ["--nnodes", nnodes or str(p.nodes), "--node-rank", node_rank,
                 "--master-addr", master_addr or "<leader-address>", "--master-port", str(MASTER_PORT)]
        if node_rank != "0":
            argv.append("--headless")
    argv += ["--host", "0.0.0.0", "--port", str(PORT)]
    notes = ([qnote] if qnote else []) + ([ctx.note] if ctx.note else [])
    return argv, notes
