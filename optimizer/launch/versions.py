"""The engine versions kvtune's launch settings target, and every flag or config key the
generators emit, with the source file and section it was read from.

One version per engine: the release whose own source (or, for TensorRT-LLM, whose versioned
documentation) was read. ``FLAGS`` is the contract the tests hold the generated commands to: a
flag that is not in this table is never emitted.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["EngineVersion", "ENGINE_VERSIONS", "ROUTER_VERSIONS", "ROUTER_IMAGES", "FLAGS", "TRTLLM_KEYS",
           "TRTLLM_DISAGG_KEYS", "ENGINES"]


@dataclass(frozen=True)
class EngineVersion:
    engine: str          # kvtune's name for it
    name: str            # how people call it
    version: str
    source: str          # where the flags below were read
    image: str           # pinned container image of that version ("" where none is published)

    def to_json(self) -> dict:
        return {"engine": self.engine, "name": self.name, "version": self.version, "source": self.source,
                "image": self.image}

    @property
    def label(self) -> str:
        return f"{self.name} {self.version}"


ENGINE_VERSIONS: dict[str, EngineVersion] = {
    "vllm": EngineVersion(
        "vllm", "vLLM", "0.33.0",
        "vllm 0.33.0 wheel (PyPI; _version.py commit g4ba787ec9): vllm/engine/arg_utils.py, "
        "vllm/config/speculative.py, vllm/config/parallel.py, vllm/config/cache.py, "
        "vllm/entrypoints/common/cli_args.py, vllm/model_executor/layers/quantization/__init__.py",
        "vllm/vllm-openai:v0.33.0"),
    "sglang": EngineVersion(
        "sglang", "SGLang", "0.5.23",
        "sglang 0.5.23 wheel (PyPI): python/sglang/srt/server_args.py, srt/arg_groups/fields/{model,parallel,"
        "schedule,memory,spec,serving}.py, srt/arg_groups/speculative_hook.py, srt/speculative/spec_info.py",
        "lmsysorg/sglang:v0.5.23"),
    "trtllm": EngineVersion(
        "trtllm", "TensorRT-LLM", "1.0.0",
        "NVIDIA/TensorRT-LLM sources of the 1.0 line (tag v1.0.0 = ae8270b7): tensorrt_llm/commands/serve.py "
        "(click options, revision 4c05a748) and tensorrt_llm/llmapi/llm_args.py (TorchLlmArgs, KvCacheConfig, "
        "CacheTransceiverConfig, DecodingBaseConfig subclasses, a 1.0.0rc revision), as extracted into "
        "tests/contracts/tensorrt-llm-1.0.0.json",
        "nvcr.io/nvidia/tensorrt-llm/release:1.0.0"),
    "llamacpp": EngineVersion(
        "llamacpp", "llama.cpp llama-server", "0c1e57098",
        "ggml-org/llama.cpp@0c1e57098 as vendored by llama-cpp-python 0.3.36 (the build bench/live_server.py "
        "makes): tools/server/README.md (server parameters), common/arg.cpp",
        ""),  # no published image of that commit: build llama-server (bench/live_server.py) and push your own
}
ENGINES = tuple(ENGINE_VERSIONS)

# the routers in front of a disaggregated deployment (optimizer/launch/disagg.py); their flags were
# read from the installed wheel's own --help
ROUTER_VERSIONS: dict[str, EngineVersion] = {
    "vllm-router": EngineVersion(
        "vllm-router", "vllm-router", "0.1.17",
        "vllm-router 0.1.17 wheel (PyPI, vllm-project/router): vllm-router --help", ""),
    "sglang-router": EngineVersion(
        "sglang-router", "sglang-router", "0.3.2",
        "sglang-router 0.3.2 wheel (PyPI): python -m sglang_router.launch_router --help (sglang_router/router_args.py)",
        ""),
}

# the container image each router runs from in a Kubernetes manifest: one that already holds the
# router, so nothing is installed when the pod starts.
# - vllm-router: Docker Hub vllm/vllm-router carries nightly-<date>-<commit> tags (public launch
#   scripts pin this one), but vllm-project/router's .buildkite/scripts/cleanup-nightly-router-builds.sh
#   keeps only the newest 14 of them, so a dated pin stops pulling about two weeks after its date; its
#   release pipeline can also publish vX.Y.Z and latest (.buildkite/README.md: manually gated), and
#   whether v0.1.17 was published is not verified here: the manifest says all this;
# - sglang-router: lmsysorg/sglang builds and installs sgl-router from the same source tree
#   (sglang docker/Dockerfile, "Build and install sgl-router"), so the pinned engine image holds it.
ROUTER_IMAGES: dict[str, str] = {
    "vllm-router": "vllm/vllm-router:nightly-20260710-b93cbcb",
    "sglang-router": "lmsysorg/sglang:v0.5.23",
}

_V = "vllm/engine/arg_utils.py EngineArgs.add_cli_args"
_S = "sglang/srt/arg_groups/fields"
_L = "tools/server/README.md"

# flag -> where that version defines it
FLAGS: dict[str, dict[str, str]] = {
    "vllm": {
        "--tensor-parallel-size": f"{_V}, ParallelConfig group",
        "--pipeline-parallel-size": f"{_V}, ParallelConfig group",
        "--data-parallel-size": f"{_V}, ParallelConfig group",
        "--enable-expert-parallel": f"{_V}, ParallelConfig group",
        "--nnodes": f"{_V}, ParallelConfig group (ParallelConfig.nnodes: multi-node with the mp backend)",
        "--node-rank": f"{_V}, ParallelConfig group",
        "--master-addr": f"{_V}, ParallelConfig group",
        "--master-port": f"{_V}, ParallelConfig group",
        "--headless": "vllm/entrypoints/common/cli_args.py (serve --headless: workers of node_rank > 0, cli/serve.py run_headless)",
        "--max-model-len": f"{_V}, ModelConfig group (checked against the KV pool at start-up: "
                           "v1/core/kv_cache_planning.py check_enough_kv_cache_memory)",
        "--max-num-seqs": f"{_V}, SchedulerConfig group",
        "--max-num-batched-tokens": f"{_V}, SchedulerConfig group",
        "--enable-chunked-prefill": f"{_V}, SchedulerConfig group",
        "--kv-cache-dtype": f"{_V}, CacheConfig group; values vllm/config/cache.py CacheDType",
        "--gpu-memory-utilization": f"{_V}, CacheConfig group",
        "--enable-prefix-caching": f"{_V}, CacheConfig group (BooleanOptionalAction)",
        "--no-enable-prefix-caching": f"{_V}, CacheConfig group (BooleanOptionalAction)",
        "--quantization": f"{_V}, ModelConfig group; fp8_per_tensor: quantization/__init__.py online shorthands "
                          "(fp8 itself refuses online quantization: quantization/fp8.py Fp8Config)",
        "--speculative-config": f"{_V}, VllmConfig group; keys vllm/config/speculative.py SpeculativeConfig",
        "--kv-transfer-config": f"{_V}, VllmConfig group; keys vllm/config/kv_transfer.py KVTransferConfig "
                                "(kv_connector NixlConnector: kv_connector/factory.py; kv_role kv_both)",
        "--host": "vllm/entrypoints/common/cli_args.py (host)",
        "--port": "vllm/entrypoints/common/cli_args.py (port, default 8000)",
    },
    "sglang": {
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
    },
    "trtllm": {
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
    },
    "vllm-router": {
        "--vllm-pd-disaggregation": "vllm-router --help (PD mode)",
        "--policy": "vllm-router --help (random, round_robin, cache_aware, ...)",
        "--prefill": "vllm-router --help (--prefill URL [BOOTSTRAP_PORT], repeated per prefill server)",
        "--decode": "vllm-router --help (--decode URL, repeated per decode server)",
        "--host": "vllm-router --help",
        "--port": "vllm-router --help",
    },
    "sglang-router": {
        "--pd-disaggregation": "launch_router --help (PD mode)",
        "--policy": "launch_router --help (random, round_robin, cache_aware, power_of_two, manual)",
        "--prefill": "launch_router --help (--prefill URL [BOOTSTRAP_PORT], repeated per prefill server)",
        "--decode": "launch_router --help (--decode URL, repeated per decode server)",
        "--host": "launch_router --help",
        "--port": "launch_router --help (default 30000)",
    },
    "llamacpp": {
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
    },
}

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
