"""TensorRT-LLM's home: ``trtllm-serve`` and its ``--extra_llm_api_options`` YAML for TensorRT-LLM 1.0.0 (PyTorch
backend). Every flag and key is one of 1.0's own definitions: serve.py's click options and
llm_args.py's pydantic classes, extracted into tests/contracts/tensorrt-llm-1.0.0.json, which CI
checks each emitted line and YAML against (FLAGS / TRTLLM_KEYS below say where each is read).

Memory: ``kv_cache_config.free_gpu_memory_fraction`` is a share of the memory *left free after the
model is loaded* (KvCacheConfig), not vLLM's share of all memory. kvtune's pool per GPU is
``memory x gpu_mem_util - weights/GPU - activation reserve``; the memory free after loading is
``memory - weights/GPU - activation reserve``; their ratio is the fraction that gives TensorRT-LLM
the same pool. ``max_tokens`` caps the pool at kvtune's token count too (the smaller one wins).
"""

from __future__ import annotations

import math

from .context import trtllm_max_seq_len
from ..space import knob_argv
from .pick import NGRAM_MATCH_TOKENS, LaunchPick, Unsupported
from .serving import EngineHome, ServeLine
from .versions import EngineVersion

__all__ = ["trtllm_api", "trtllm_argv", "free_fraction", "PORT", "VERSION", "FLAGS", "TRTLLM_KEYS",
           "TRTLLM_DISAGG_KEYS", "HOME"]

PORT = 8000


def free_fraction(p: LaunchPick) -> float | None:
    """The ``free_gpu_memory_fraction`` whose pool equals kvtune's, or None without a memory plan."""
    m = p.memory
    if m is None:
        return None
    # free after the model and the speculative draft have loaded
    free = m.gpu_memory_bytes - m.weight_bytes_per_gpu - m.draft_weight_bytes_per_gpu - m.activation_reserve_bytes
    if free <= 0:
        return None
    return min(max(m.kv_pool_bytes_per_gpu / free, 0.0), 1.0)


def _spec(p: LaunchPick) -> dict | None:
    if not p.speculating:
        return None
    m, k = p.spec_method, int(p.spec_k)
    if m == "eagle3":
        # EagleDecodingConfig with eagle3_one_model: the 1.0 spelling (Eagle3DecodingConfig and
        # speculative_model came later)
        return {"decoding_type": "Eagle", "max_draft_len": k, "speculative_model_dir": p.require_draft("TensorRT-LLM"),
                "eagle3_one_model": True}
    if m == "mtp":
        p.require_mtp()
        return {"decoding_type": "MTP", "num_nextn_predict_layers": k}
    if m == "ngram":
        return {"decoding_type": "NGram", "max_draft_len": k, "max_matching_ngram_size": NGRAM_MATCH_TOKENS}
    if m == "draft":
        return {"decoding_type": "DraftTarget", "max_draft_len": k,
                "speculative_model_dir": p.require_draft("TensorRT-LLM")}
    if m in ("eagle", "medusa"):
        raise Unsupported(f"speculative method {m!r}: TensorRT-LLM 1.0.0's PyTorch backend (trtllm-serve's default) "
                          f"runs EAGLE-3, MTP, NGram and draft/target speculation; {m} heads need the TensorRT "
                          f"engine backend, which kvtune does not generate")
    raise Unsupported(f"speculative method {m!r} is not one TensorRT-LLM 1.0.0 runs")


def _checkpoint(p: LaunchPick) -> tuple[str, str]:
    if p.weights != "fp8":
        return p.model, ""
    ckpt = p.checkpoint("modelopt")
    if not ckpt:
        raise Unsupported(f"FP8 weights: TensorRT-LLM 1.0.0's PyTorch backend loads FP8 from a pre-quantized "
                          f"(ModelOpt) checkpoint and kvtune knows none for {p.model}: quantize it with ModelOpt "
                          f"and name that folder in the workload's checkpoint:")
    return ckpt, f"FP8 weights: the pre-quantized checkpoint {ckpt} (its hf_quant_config sets the FP8 GEMMs)"


def trtllm_api(p: LaunchPick, role: str = "serve") -> tuple[dict, list[str]]:
    p.require_launchable("trtllm")   # weights, KV dtype, speculation: costmodel.engines.capabilities
    if p.multi_node:
        raise Unsupported(f"a replica over {p.nodes} nodes: TensorRT-LLM starts it under MPI "
                          f"(trtllm-llmapi-launch), which kvtune does not generate")
    notes = []
    api: dict = {"tensor_parallel_size": p.tp}
    if p.pp > 1:
        api["pipeline_parallel_size"] = p.pp
    if p.ep > 1:
        api["moe_expert_parallel_size"] = p.ep
    if p.dp_attention:
        api["enable_attention_dp"] = True
    api |= {"max_batch_size": p.batch_cap, "max_num_tokens": p.chunk_tokens, "enable_chunked_prefill": True}
    ctx = trtllm_max_seq_len(p, role)
    if ctx.value is not None:
        api["max_seq_len"] = ctx.value
        notes.append(ctx.note)
    kv: dict = {"dtype": "fp8" if p.kv_dtype == "fp8" else "auto"}
    frac = free_fraction(p)
    if frac is not None and p.memory is not None:  # a fraction comes only with a memory plan
        kv["free_gpu_memory_fraction"] = math.floor(frac * 1e4) / 1e4   # down: max_tokens holds the rest
        kv["max_tokens"] = int(p.memory.kv_pool_tokens_per_gpu)   # per rank's pool
        notes.append(f"memory: free_gpu_memory_fraction {frac:.4f} of the memory left after loading gives the "
                     f"{p.memory.kv_pool_tokens_per_gpu:,}-token KV pool per GPU kvtune modelled at gpu_mem_util "
                     f"{p.gpu_mem_util:g} (max_tokens caps it there too)")
    else:
        notes.append("memory: no memory plan to convert; TensorRT-LLM's default free_gpu_memory_fraction applies "
                     "and its KV pool will differ from kvtune's")
    kv["enable_block_reuse"] = bool(p.prefix_caching)
    api["kv_cache_config"] = kv
    sc = _spec(p)
    if sc is not None:
        api["speculative_config"] = sc
    return api, notes


def trtllm_argv(p: LaunchPick, role: str = "serve", config: str = "config.yaml") -> tuple[list[str], dict, list[str]]:
    """(argv, the --extra_llm_api_options YAML as a dict, notes); ``config``: where the YAML is."""
    p.require_launchable("trtllm")
    ckpt, qnote = _checkpoint(p)
    api, notes = trtllm_api(p, role)
    argv = ["trtllm-serve", ckpt, "--tp_size", str(p.tp)]
    if p.pp > 1:
        argv += ["--pp_size", str(p.pp)]
    if p.ep > 1:
        argv += ["--ep_size", str(p.ep)]
    argv += ["--max_batch_size", str(p.batch_cap), "--max_num_tokens", str(p.chunk_tokens),
             *knob_argv(KNOB_FLAGS, p.knob_values),
             "--extra_llm_api_options", config, "--host", "0.0.0.0", "--port", str(PORT)]
    return argv, api, ([qnote] if qnote else []) + notes


# ---- the release this launch line was read from, and where it defines each flag ----
VERSION = EngineVersion(
    "trtllm", "TensorRT-LLM", "1.0.0",
    "NVIDIA/TensorRT-LLM sources of the 1.0 line (tag v1.0.0 = ae8270b7): tensorrt_llm/commands/serve.py "
    "(click options, revision 4c05a748) and tensorrt_llm/llmapi/llm_args.py (TorchLlmArgs, KvCacheConfig, "
    "CacheTransceiverConfig, DecodingBaseConfig subclasses, a 1.0.0rc revision), as extracted into "
    "tests/contracts/tensorrt-llm-1.0.0.json",
    "nvcr.io/nvidia/tensorrt-llm/release:1.0.0")
FLAGS: dict[str, str] = {
    "--tp_size": "commands/trtllm-serve (Options)",
    "--pp_size": "commands/trtllm-serve (Options)",
    "--ep_size": "commands/trtllm-serve (Options)",
    "--max_batch_size": "commands/trtllm-serve (Options)",
    "--max_num_tokens": "commands/trtllm-serve (Options)",
    "--extra_llm_api_options": "commands/trtllm-serve (Options): a YAML of LlmArgs keys",
    "--host": "commands/trtllm-serve (Options)",
    "--port": "commands/trtllm-serve (Options, default 8000)",
    "-c": "commands/trtllm-serve disaggregated (-c, --config_file: the disaggregated server's YAML; "
          "examples/disaggregated/README.md)",
}

# optimizer.space's knobs TensorRT-LLM sets: knob -> (its flag, where this release defines it); none of the
# shipped axes yet. Its flags join FLAGS, its launch line sets them (space.knob_argv)
KNOB_FLAGS: dict[str, tuple[str, str]] = {}
FLAGS |= dict(KNOB_FLAGS.values())

# TensorRT-LLM 1.0.0 LLM-API keys of the --extra_llm_api_options YAML: dotted path -> where it is defined.
# A reader's table: CI checks every emitted YAML against the classes themselves
# (tests/contracts/tensorrt-llm-1.0.0.json, tests/engine_contracts.py check_trtllm_api).
TRTLLM_KEYS: dict[str, str] = {
    "tensor_parallel_size": "llm-api/reference LlmArgs",
    "pipeline_parallel_size": "llm-api/reference LlmArgs",
    "moe_expert_parallel_size": "llm-api/reference LlmArgs",
    "enable_attention_dp": "llm-api/reference TorchLlmArgs",
    "max_batch_size": "llm-api/reference LlmArgs",
    "max_num_tokens": "llm-api/reference LlmArgs",
    "enable_chunked_prefill": "llm-api/reference LlmArgs (off by default)",
    "max_seq_len": "llm-api/reference LlmArgs (prompt + output; context.py sizes it in whole KV blocks)",
    "kv_cache_config": "llm-api/reference LlmArgs -> KvCacheConfig",
    "kv_cache_config.dtype": "llm-api/reference KvCacheConfig",
    "kv_cache_config.free_gpu_memory_fraction": "llm-api/reference KvCacheConfig (share of the memory free after the "
                                                "model is loaded)",
    "kv_cache_config.max_tokens": "llm-api/reference KvCacheConfig (the smaller of this and the fraction wins)",
    "kv_cache_config.enable_block_reuse": "llm-api/reference KvCacheConfig",
    "speculative_config": "llm-api/reference TorchLlmArgs.speculative_config (decoding_type selects the class)",
    "speculative_config.decoding_type": "DecodingBaseConfig.from_dict: Eagle, MTP, NGram, DraftTarget",
    "speculative_config.max_draft_len": "DecodingBaseConfig",
    "speculative_config.speculative_model_dir": "EagleDecodingConfig / DraftTargetDecodingConfig (1.0 name)",
    "speculative_config.eagle3_one_model": "EagleDecodingConfig (examples/llm_speculative_decoding.py)",
    "speculative_config.num_nextn_predict_layers": "MTPDecodingConfig",
    "speculative_config.max_matching_ngram_size": "NGramDecodingConfig",
    # disaggregated workers (examples/disaggregated/README.md of the 1.0 line; llm-api/reference)
    "disable_overlap_scheduler": "TorchLlmArgs; off on context servers (examples/disaggregated/README.md: the "
                                 "overlap scheduler is not supported there)",
    "cache_transceiver_config": "TorchLlmArgs -> CacheTransceiverConfig",
    "cache_transceiver_config.backend": "CacheTransceiverConfig: 1.0.0's Literal DEFAULT, UCX, NIXL, MPI (the "
                                        "1.0.0 release candidates took them lower case)",
    "cache_transceiver_config.max_tokens_in_buffer": "CacheTransceiverConfig (>= the longest prompt, README)",
}

# keys of the disaggregated server's YAML (trtllm-serve disaggregated -c; examples/disaggregated/README.md)
TRTLLM_DISAGG_KEYS: dict[str, str] = {
    "hostname": "disagg_config.yaml: the server's bind address",
    "port": "disagg_config.yaml: the server's port",
    "backend": "disagg_config.yaml: pytorch",
    "context_servers": "disagg_config.yaml", "context_servers.num_instances": "disagg_config.yaml",
    "context_servers.urls": "disagg_config.yaml (host:port per context server)",
    "generation_servers": "disagg_config.yaml", "generation_servers.num_instances": "disagg_config.yaml",
    "generation_servers.urls": "disagg_config.yaml (host:port per generation server)",
}


def serve_line(p: LaunchPick, node_rank: str | None = None, addr: str | None = None, nnodes: str | None = None,
               config_dir: str | None = None) -> ServeLine:
    """``trtllm-serve`` for ``p`` and its ``--extra_llm_api_options`` YAML (``EngineHome.serve_line``)."""
    argv, api, notes = trtllm_argv(p, config="config.yaml" if config_dir is None else f"{config_dir}/config.yaml")
    return ServeLine(argv, notes, api)


# kvtune tune does not start trtllm-serve (no adapter): it needs an NVIDIA GPU, and kvtune tune --url
# measures one you started
HOME = EngineHome("trtllm", VERSION, FLAGS, serve_line, knob_flags=KNOB_FLAGS, config_file="config.yaml",
                  config_flag="--extra_llm_api_options", config_keys=TRTLLM_KEYS)
