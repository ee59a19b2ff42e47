"""``python -m sglang.launch_server`` for SGLang 0.5.23 (flags: versions.FLAGS["sglang"]).

Scheduling: SGLang's default runs a waiting prompt in a prefill-only batch while the decodes wait;
kvtune simulates steps that mix prefill chunks with decodes, which SGLang does with
``--enable-mixed-chunk``. Under speculation SGLang 0.5.23 keeps mixed chunks only for the
algorithms whose ``SpeculativeAlgorithm.supports_mixed_chunk()`` is true (EAGLE, EAGLE3, DFLASH,
DSPARK: srt/speculative/spec_info.py); NGRAM and STANDALONE turn them off
(srt/arg_groups/speculative_hook.py ``_handle_ngram``, ``_handle_eagle_family``). For those the flag
is not emitted and kvtune simulates SGLang's prefill-first scheduling (``scheduling()``).
"""

from __future__ import annotations

from .context import sglang_context_length
from .pick import LaunchPick, Unsupported

__all__ = ["sglang_argv", "sglang_algorithm", "sglang_mixed_chunk", "PORT", "DIST_PORT"]

PORT = 8000           # set explicitly (SGLang's default is 30000) so every engine serves on one port
DIST_PORT = 20000     # --dist-init-addr port of the LeaderWorkerSet example (kubernetes-sigs/lws docs/examples/sglang)
# kvtune method -> SGLang 0.5.23 --speculative-algorithm (NEXTN is the MTP alias of EAGLE: spec_registry.py)
_ALGO = {"eagle3": "EAGLE3", "eagle": "EAGLE", "mtp": "NEXTN", "ngram": "NGRAM", "draft": "STANDALONE"}
_MIXED_OK = ("EAGLE", "EAGLE3", "NEXTN")   # NEXTN resolves to EAGLE


def sglang_algorithm(method: str) -> str:
    if method not in _ALGO:
        raise Unsupported(f"speculative method {method!r}: SGLang 0.5.23 has no such algorithm "
                          f"(it runs {', '.join(sorted(_ALGO))}; medusa heads are not among them)")
    return _ALGO[method]


def sglang_mixed_chunk(method: str | None, spec_k: int) -> bool:
    """Whether SGLang 0.5.23 keeps mixed prefill/decode batches with this speculation."""
    if not spec_k or method is None:
        return True
    return _ALGO.get(method) in _MIXED_OK


def _spec(p: LaunchPick) -> list[str]:
    if not p.speculating or p.spec_method is None:
        return []
    algo = sglang_algorithm(p.spec_method)
    k = int(p.spec_k)
    out = ["--speculative-algorithm", algo]
    if p.spec_method == "mtp":
        p.require_mtp()   # NEXTN drafts with the target's own MTP layers: no draft path
    elif p.spec_method != "ngram":
        out += ["--speculative-draft-model-path", p.require_draft("SGLang")]
    if p.spec_method == "ngram":
        # a chain: breadth 1, k drafted tokens plus the verified one per pass
        out += ["--speculative-num-draft-tokens", str(k + 1), "--speculative-ngram-max-bfs-breadth", "1"]
    else:
        # a chain (top-k 1) of k draft steps verifies k + 1 tokens per pass, as the cost model assumes
        out += ["--speculative-num-steps", str(k), "--speculative-eagle-topk", "1",
                "--speculative-num-draft-tokens", str(k + 1)]
    return out


def sglang_argv(p: LaunchPick, node_rank: str | None = None, dist_addr: str | None = None,
                nnodes: str | None = None, role: str = "serve") -> tuple[list[str], list[str]]:
    p.require_launchable("sglang")   # weights, KV dtype, speculation: costmodel.engines.capabilities
    notes = []
    ckpt = p.model
    qflags: list[str] = []
    if p.weights == "fp8":
        ckpt = p.checkpoint("any")
        if ckpt:
            notes.append(f"FP8 weights: the FP8 checkpoint {ckpt} (SGLang reads its quantization_config)")
        else:
            ckpt = p.model
            qflags = ["--quantization", "fp8"]   # arg_groups/choices.py: fp8 = online MoE + linear quantization
            notes.append("FP8 weights: online quantization of the bf16 checkpoint while loading (--quantization fp8)")
    argv = ["python", "-m", "sglang.launch_server", "--model-path", ckpt, "--tp-size", str(p.tp)]
    if p.pp > 1:
        argv += ["--pp-size", str(p.pp)]
    if p.ep > 1:
        argv += ["--ep-size", str(p.ep)]
    if p.dp_attention:
        # attention data-parallel over every rank of the TP group (the deprecated spelling was
        # --dp-size N --enable-dp-attention: server_args.py)
        argv += ["--attn-dp-size", str(p.tp)]
    ctx = sglang_context_length(p, role)
    if ctx.value is not None:
        argv += ["--context-length", str(ctx.value)]
        notes.append(ctx.note)
    argv += ["--max-running-requests", str(p.batch_cap), "--chunked-prefill-size", str(p.chunk_tokens),
             "--max-prefill-tokens", str(p.chunk_tokens)]
    spec_argv = _spec(p)
    if sglang_mixed_chunk(p.spec_method, p.spec_k):
        argv.append("--enable-mixed-chunk")
    else:
        notes.append(f"scheduling: SGLang 0.5.23 turns mixed chunks off under {_ALGO.get(p.spec_method or '', p.spec_method)} speculation, "
                     f"so prefill batches run alone while decodes wait; kvtune simulated that (prefill-first) "
                     f"for this pick")
    argv += ["--mem-fraction-static", f"{p.gpu_mem_util:g}", *qflags]
    if p.kv_dtype == "fp8":
        argv += ["--kv-cache-dtype", "fp8_e4m3"]
    if not p.prefix_caching:
        argv.append("--disable-radix-cache")
    argv += spec_argv
    if node_rank is not None:
        argv += ["--nnodes", nnodes or str(p.nodes), "--node-rank", node_rank,
                 "--dist-init-addr", dist_addr or f"<leader-address>:{DIST_PORT}"]
    argv += ["--host", "0.0.0.0", "--port", str(PORT)]
    return argv, notes
