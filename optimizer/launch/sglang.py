"""SGLang's home: ``python -m sglang.launch_server`` for SGLang 0.5.23 (its flags: ``FLAGS`` below), and how
``kvtune tune`` starts it and reads it back (``Sglang``).

Scheduling: SGLang's default runs a waiting prompt in a prefill-only batch while the decodes wait;
kvtune simulates steps that mix prefill chunks with decodes, which SGLang does with
``--enable-mixed-chunk``. Under speculation SGLang 0.5.23 keeps mixed chunks only for the
algorithms whose ``SpeculativeAlgorithm.supports_mixed_chunk()`` is true (EAGLE, EAGLE3, DFLASH,
DSPARK: srt/speculative/spec_info.py); NGRAM and STANDALONE turn them off
(srt/arg_groups/speculative_hook.py ``_handle_ngram``, ``_handle_eagle_family``). For those the flag
is not emitted and kvtune simulates SGLang's prefill-first scheduling (``scheduling()``).
"""

from __future__ import annotations

import sys

from kvtune.optimizer.server_http import get_json

from .context import sglang_context_length
from ..space import knob_argv
from .pick import LaunchPick, Unsupported
from .serving import EngineHome, EngineKind, EnginePlan, EngineReport, ServeLine, served_models, set_flag, whole
from .versions import EngineVersion

__all__ = ["sglang_argv", "sglang_algorithm", "sglang_mixed_chunk", "PORT", "DIST_PORT", "VERSION", "FLAGS", "Sglang",
           "HOME"]

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
    argv += knob_argv(KNOB_FLAGS, p.knob_values)
    argv += ["--host", "0.0.0.0", "--port", str(PORT)]
    return argv, notes


# ---- the release this launch line was read from, and where it defines each flag ----
_S = "sglang/srt/arg_groups/fields"
VERSION = EngineVersion(
    "sglang", "SGLang", "0.5.23",
    "sglang 0.5.23 wheel (PyPI): python/sglang/srt/server_args.py, srt/arg_groups/fields/{model,parallel,"
    "schedule,memory,spec,serving}.py, srt/arg_groups/speculative_hook.py, srt/speculative/spec_info.py",
    "lmsysorg/sglang:v0.5.23")
FLAGS: dict[str, str] = {
    "--model-path": f"{_S}/model.py model_path",
    "--tp-size": f"{_S}/parallel.py tp_size",
    "--pp-size": f"{_S}/parallel.py pp_size",
    "--ep-size": f"{_S}/parallel.py ep_size (--enable-ep-moe is gone in 0.5.23)",
    "--attn-dp-size": f"{_S}/parallel.py attn_dp_size (server_args.py: --enable-dp-attention is deprecated for it)",
    "--nnodes": f"{_S}/parallel.py nnodes",
    "--node-rank": f"{_S}/parallel.py node_rank",
    "--dist-init-addr": f"{_S}/parallel.py dist_init_addr",
    "--context-length": f"{_S}/model.py context_length (srt/managers/tp_worker.py caps requests at the pool)",
    "--max-running-requests": f"{_S}/schedule.py max_running_requests",
    "--chunked-prefill-size": f"{_S}/schedule.py chunked_prefill_size",
    "--max-prefill-tokens": f"{_S}/schedule.py max_prefill_tokens",
    "--enable-mixed-chunk": f"{_S}/schedule.py enable_mixed_chunk",
    "--mem-fraction-static": f"{_S}/schedule.py mem_fraction_static",
    "--kv-cache-dtype": f"{_S}/model.py kv_cache_dtype (choices include fp8_e4m3)",
    "--quantization": f"{_S}/model.py quantization; arg_groups/choices.py QUANTIZATION_CHOICES (fp8: online)",
    "--disable-radix-cache": f"{_S}/memory.py disable_radix_cache",
    "--speculative-algorithm": f"{_S}/spec.py speculative_algorithm; srt/speculative/spec_info.py SpeculativeAlgorithm",
    "--speculative-draft-model-path": f"{_S}/spec.py speculative_draft_model_path",
    "--speculative-num-steps": f"{_S}/spec.py speculative_num_steps",
    "--speculative-eagle-topk": f"{_S}/spec.py speculative_eagle_topk",
    "--speculative-num-draft-tokens": f"{_S}/spec.py speculative_num_draft_tokens",
    "--speculative-ngram-max-bfs-breadth": f"{_S}/spec.py speculative_ngram_max_bfs_breadth",
    "--disaggregation-mode": f"{_S}/disagg.py disaggregation_mode (null, prefill, decode)",
    "--disaggregation-transfer-backend": f"{_S}/disagg.py disaggregation_transfer_backend (default mooncake)",
    "--disaggregation-bootstrap-port": f"{_S}/disagg.py disaggregation_bootstrap_port (default 8998)",
    "--host": f"{_S}/serving.py host",
    "--port": f"{_S}/serving.py port (default 30000)",
}

# optimizer.space's knobs SGLang sets: knob -> (its flag, where this release defines it); none of the
# shipped axes yet. Its flags join FLAGS, its launch line sets them (space.knob_argv)
KNOB_FLAGS: dict[str, tuple[str, str]] = {}
FLAGS |= dict(KNOB_FLAGS.values())


# ---- kvtune tune: how it starts this engine and reads it back (optimizer.adapters) ----
class Sglang(EngineKind):
    name, label, default_binary = "sglang", "SGLang", sys.executable
    probe = ("/get_server_info", "version")

    def plan(self, pick, *, binary, model, host, port, threads):
        argv, notes = sglang_argv(pick)
        argv = [binary] + argv[1:]                            # python -m sglang.launch_server
        if model:
            argv = set_flag(argv, "--model-path", model)
        argv = set_flag(set_flag(argv, "--host", host), "--port", str(port))
        return EnginePlan(self.name, tuple(argv), pick.batch_cap, pick.chunk_tokens, None, None,
                          argv[argv.index("--model-path") + 1], tuple(notes), head=3)

    def read_back(self, root, log_text="", timeout_s=5.0):
        st, d = get_json(root, "/get_server_info", timeout_s)
        d = d if st == 200 and isinstance(d, dict) else {}
        models = served_models(root, timeout_s)
        return EngineReport(engine=self.name, version=str(d.get("version", "")),
                            served_model=models[0] if models else "", model_path=str(d.get("model_path", "")),
                            slots=whole(d.get("max_running_requests")), pool_tokens=whole(d.get("max_total_num_tokens")),
                            chunk_tokens=whole(d.get("chunked_prefill_size")))


def serve_line(p: LaunchPick, node_rank: str | None = None, addr: str | None = None, nnodes: str | None = None,
               config_dir: str | None = None) -> ServeLine:
    """``python -m sglang.launch_server`` for ``p`` (``EngineHome.serve_line``)."""
    return ServeLine(*sglang_argv(p, node_rank, None if addr is None else f"{addr}:{DIST_PORT}", nnodes))


HOME = EngineHome("sglang", VERSION, FLAGS, serve_line, knob_flags=KNOB_FLAGS, head=3, mixed_chunks=sglang_mixed_chunk, adapter=Sglang())
