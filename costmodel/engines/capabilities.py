"""What kvtune can launch on each engine version: one table, read from each version's own source.

``CAPABILITIES[engine]`` lists, for the engine version kvtune's launch settings target
(``optimizer.launch.versions``), the KV-cache formats, speculative methods, weight formats,
deployment kinds (aggregated replicas; disaggregated prefill/decode pools), the GPUs one replica
may span and whether a replica may span nodes. Formats are kvtune's canonical names
(``costmodel.dtypes``); methods are the workload's ``speculative.method`` names.

A row is what the engine runs *and* kvtune generates a launch for: where the engine can do more
than kvtune's launch writes (SGLang loads GGUF; TensorRT-LLM runs a replica over nodes under
MPI), the row leaves it out and ``not_launched`` says so, so the search never picks what the
printed command cannot start. ``optimizer.workload`` cuts the search space with the row of the
workload's ``engine:`` (vLLM's when none is named: the launch line kvtune prints by default), and
``costmodel.checkpoints`` resolves what each engine loads.

Engine-independent rules live beside the table (``method_needs``): ``mtp`` drafts with the model's
own multi-token-prediction heads; ``eagle3``, ``eagle`` and ``draft`` load a separate checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

__all__ = ["Capabilities", "CAPABILITIES", "DEFAULT_ENGINE", "capabilities_for", "method_needs", "GGUF_FORMATS",
           "DEPLOYMENT_KINDS"]

DEFAULT_ENGINE = "vllm"   # the engine whose launch line kvtune prints (and whose rules apply) when none is named
DEPLOYMENT_KINDS = ("aggregated", "disaggregated")

# the GGUF storage types of the weight formats kvtune models (costmodel.dtypes): what llama.cpp's
# llama-quantize writes (tools/quantize/quantize.cpp QUANT_OPTIONS) and llama-server loads
GGUF_FORMATS = ("fp32", "fp16", "bf16", "q8_0", "q6_k", "q5_1", "q5_k", "q5_0", "q4_1", "q4_k", "q4_0", "iq4_nl",
                "q3_k", "q2_k")

# what a speculative method loads besides the target: "draft_model" (a checkpoint of its own:
# EAGLE/EAGLE-3 heads, a smaller model), "mtp_heads" (the target's own MTP layers), "" (nothing:
# n-gram prompt lookup). The same on every engine (vllm/config/speculative.py: eagle/eagle3/draft_model
# read SpeculativeConfig.model, mtp reuses the target; SGLang spec.py speculative_draft_model_path).
_METHOD_NEEDS = {"eagle3": "draft_model", "eagle": "draft_model", "draft": "draft_model", "medusa": "draft_model",
                 "mtp": "mtp_heads", "ngram": ""}


def method_needs(method: str) -> str | None:
    """What ``method`` loads besides the target ("draft_model", "mtp_heads", ""), None if unknown."""
    return _METHOD_NEEDS.get(method)


@dataclass(frozen=True)
class Capabilities:
    """One engine version's launchable space. ``sources`` cites each field; ``not_launched`` gives
    the reason for values people ask for that the row leaves out (key: "kv:fp8", "spec:medusa",
    "weights:q4_1", "deployment:disaggregated", "multi_node")."""

    engine: str                        # kvtune's name (costmodel.engines)
    label: str                         # engine and version as a person writes them
    version: str                       # the version read (optimizer.launch.versions has the same)
    kv_dtypes: tuple[str, ...]
    spec_methods: tuple[str, ...]
    weight_formats: tuple[str, ...]
    deployments: tuple[str, ...]
    max_gpus_per_replica: int | None   # None: as many as the layout needs
    multi_node: bool                   # a replica may span nodes
    loader: str = "hf"                 # the checkpoints its launch loads (costmodel.checkpoints.LOADERS)
    # the search's defaults where the workload gives none (optimizer.workload): the KV dtypes to try
    # (None: every one kvtune models) and the smallest batch cap (None: the search's own)
    search_kv_dtypes: tuple[str, ...] | None = None
    min_batch_cap: int | None = None
    sources: Mapping[str, str] = field(default_factory=dict)
    not_launched: Mapping[str, str] = field(default_factory=dict)

    # ---- one reason per refusal (None: it can) --------------------------------------------------
    def kv_error(self, kv: str) -> str | None:
        if kv in self.kv_dtypes:
            return None
        why = self.not_launched.get(f"kv:{kv}") or f"its KV cache types are {', '.join(self.kv_dtypes)}"
        return f"kvtune cannot launch {kv} KV cache on {self.label}: {why}"

    def spec_error(self, method: str) -> str | None:
        if method in self.spec_methods:
            return None
        why = self.not_launched.get(f"spec:{method}") or f"it drafts with {', '.join(self.spec_methods)}"
        return f"kvtune cannot launch speculative method {method!r} on {self.label}: {why}"

    def weights_error(self, weights: str) -> str | None:
        if weights in self.weight_formats:
            return None
        gguf = weights in GGUF_FORMATS and weights not in ("fp32", "fp16", "bf16")
        why = self.not_launched.get(f"weights:{weights}") or (self.not_launched.get("weights:gguf") if gguf else None)
        if why is None:
            why = "it does not load GGUF files" if gguf else f"it loads {', '.join(self.weight_formats)}"
        return f"kvtune cannot launch {weights} weights on {self.label}: {why}"

    def deployment_error(self, kind: str) -> str | None:
        if kind in self.deployments:
            return None
        why = self.not_launched.get(f"deployment:{kind}", "kvtune has no launch for it")
        return f"kvtune cannot launch a {kind} deployment on {self.label}: {why}"

    def replica_error(self, gpus: int, gpus_per_node: int) -> str | None:
        """Why one replica of ``gpus`` GPUs (``gpus_per_node`` a node) cannot be launched, or None."""
        if self.max_gpus_per_replica is not None and gpus > self.max_gpus_per_replica:
            return (f"kvtune cannot launch a replica of {gpus} GPUs on {self.label} (at most "
                    f"{self.max_gpus_per_replica}): " + self.not_launched.get("tensor_parallel", ""))
        if gpus > gpus_per_node and not self.multi_node:
            return (f"kvtune cannot launch a replica over {-(-gpus // gpus_per_node)} nodes on {self.label}: "
                    + self.not_launched["multi_node"])
        return None

    def to_json(self) -> dict:
        return {"engine": self.engine, "label": self.label, "version": self.version,
                "kv_dtypes": list(self.kv_dtypes), "spec_methods": list(self.spec_methods),
                "weight_formats": list(self.weight_formats), "deployments": list(self.deployments),
                "max_gpus_per_replica": self.max_gpus_per_replica, "multi_node": self.multi_node,
                "sources": dict(self.sources), "not_launched": dict(self.not_launched)}


_VLLM = "vllm 0.33.0 wheel (PyPI)"
_SGL = "sglang 0.5.23 wheel (PyPI)"
_TRT = "TensorRT-LLM 1.0.0 documentation (nvidia.github.io/TensorRT-LLM/1.0.0)"
_LCPP = "ggml-org/llama.cpp@0c1e57098 (vendored by llama-cpp-python 0.3.36)"

CAPABILITIES: dict[str, Capabilities] = {
    "vllm": Capabilities(
        engine="vllm", label="vLLM 0.33.0", version="0.33.0",
        kv_dtypes=("bf16", "fp16", "fp8"),
        spec_methods=("eagle3", "eagle", "mtp", "ngram", "draft"),
        weight_formats=("bf16", "fp16", "fp8"),
        deployments=DEPLOYMENT_KINDS, max_gpus_per_replica=None, multi_node=True,
        sources={
            "kv_dtypes": f"{_VLLM}: vllm/config/cache.py CacheDType (auto, float16, bfloat16, fp8, fp8_e4m3, ...)",
            "spec_methods": f"{_VLLM}: vllm/config/speculative.py SpeculativeMethod (ngram, draft_model, suffix, "
                            "eagle, eagle3, mtp and the *_mtp model types, dflash, ...; no medusa)",
            "weight_formats": f"{_VLLM}: the checkpoint's torch_dtype; fp8 from an FP8 checkpoint or the online "
                              "fp8_per_tensor shorthand (vllm/model_executor/layers/quantization/__init__.py "
                              "QuantizationMethods: no gguf)",
            "deployments": f"{_VLLM}: --kv-transfer-config NixlConnector (vllm/config/kv_transfer.py)",
            "multi_node": f"{_VLLM}: vllm/config/parallel.py nnodes, node_rank (mp backend), serve --headless",
        },
        not_launched={
            "spec:medusa": "vLLM 0.33.0 dropped Medusa (not in vllm/config/speculative.py SpeculativeMethod)",
            "weights:gguf": "vLLM 0.33.0 has no GGUF loader (vllm/model_executor/layers/quantization/__init__.py "
                            "QuantizationMethods has no gguf)",
            "weights:int8": "kvtune knows no int8 checkpoint to launch (the online int8 shorthand is weight-only, "
                            "not the W8A8 kvtune models)",
            "weights:fp32": "kvtune's launch loads the checkpoint's own dtype and does not set --dtype float32",
        }),
    "sglang": Capabilities(
        engine="sglang", label="SGLang 0.5.23", version="0.5.23",
        kv_dtypes=("bf16", "fp8"),
        spec_methods=("eagle3", "eagle", "mtp", "ngram", "draft"),
        weight_formats=("bf16", "fp16", "fp8"),
        deployments=DEPLOYMENT_KINDS, max_gpus_per_replica=None, multi_node=True,
        sources={
            "kv_dtypes": f"{_SGL}: srt/arg_groups/fields/model.py kv_cache_dtype choices (auto, fp8_e5m2, fp8_e4m3, "
                         "mxfp8, bf16, bfloat16, nvfp4, fp4_mx_block16)",
            "spec_methods": f"{_SGL}: srt/speculative/spec_info.py SpeculativeAlgorithm (EAGLE, EAGLE3, STANDALONE, "
                            "NGRAM, ...; NEXTN is EAGLE over the model's MTP layers)",
            "weight_formats": f"{_SGL}: srt/arg_groups/choices.py QUANTIZATION_CHOICES (fp8: online)",
            "deployments": f"{_SGL}: srt/arg_groups/fields disagg.py disaggregation_mode (prefill, decode)",
            "multi_node": f"{_SGL}: srt/arg_groups/fields/parallel.py nnodes, node_rank, dist_init_addr",
        },
        not_launched={
            "kv:fp16": "its kv_cache_dtype choices have no float16 (auto follows the model's bf16)",
            "spec:medusa": "SGLang 0.5.23's SpeculativeAlgorithm has no Medusa",
            "weights:gguf": "SGLang 0.5.23 loads GGUF (--load-format gguf) but kvtune does not generate that launch",
            "weights:int8": "kvtune knows no w8a8_int8 checkpoint to launch",
            "weights:fp32": "kvtune's launch loads the checkpoint's own dtype and does not set --dtype float32",
        }),
    "trtllm": Capabilities(
        engine="trtllm", label="TensorRT-LLM 1.0.0", version="1.0.0",
        kv_dtypes=("bf16", "fp8"),
        spec_methods=("eagle3", "mtp", "ngram", "draft"),
        weight_formats=("bf16", "fp16", "fp8"),
        deployments=DEPLOYMENT_KINDS, max_gpus_per_replica=None, multi_node=False, loader="modelopt",
        sources={
            "kv_dtypes": f"{_TRT}: llm-api/reference KvCacheConfig.dtype (auto, fp8)",
            "spec_methods": f"{_TRT}: llm-api/reference TorchLlmArgs.speculative_config (EagleDecodingConfig with "
                            "eagle3_one_model, MTPDecodingConfig, NGramDecodingConfig, DraftTargetDecodingConfig); "
                            "examples/llm_speculative_decoding.py",
            "weight_formats": f"{_TRT}: the PyTorch backend loads Hugging Face checkpoints and FP8 from pre-quantized "
                              "ModelOpt checkpoints (hf_quant_config.json)",
            "deployments": f"{_TRT}: commands/trtllm-serve disaggregated; examples/disaggregated/README.md",
        },
        not_launched={
            "spec:eagle": "TensorRT-LLM 1.0.0's PyTorch backend (trtllm-serve's default) runs EAGLE-3 only; EAGLE-1/2 "
                          "heads need the TensorRT engine backend, which kvtune does not generate",
            "spec:medusa": "Medusa heads need the TensorRT engine backend, which kvtune does not generate",
            "multi_node": "TensorRT-LLM starts a replica over nodes under MPI (trtllm-llmapi-launch), which kvtune "
                          "does not generate",
            "weights:gguf": "it loads Hugging Face and ModelOpt checkpoints, not GGUF files",
            "weights:int8": "kvtune knows no int8 ModelOpt checkpoint to launch",
            "weights:fp32": "kvtune's launch loads the checkpoint's own dtype",
        }),
    "llamacpp": Capabilities(
        engine="llamacpp", label="llama.cpp llama-server 0c1e57098", version="0c1e57098",
        kv_dtypes=("fp32", "fp16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"),
        spec_methods=("eagle3", "mtp", "ngram", "draft"),
        weight_formats=GGUF_FORMATS,
        deployments=("aggregated",), max_gpus_per_replica=1, multi_node=False, loader="gguf",
        # llama-server runs a few slots (-np), so its batch caps start at 1; its cache is f16 by
        # default (--cache-type-k f16) and it has no fp8 (common/arg.cpp kv_cache_types)
        search_kv_dtypes=("fp16",), min_batch_cap=1,
        sources={
            "kv_dtypes": f"{_LCPP}: common/arg.cpp kv_cache_types (f32, f16, bf16, q8_0, q4_0, q4_1, iq4_nl, q5_0, "
                         "q5_1); a quantized V cache turns flash attention on (src/llama-context.cpp)",
            "spec_methods": f"{_LCPP}: common/speculative.cpp --spec-type names (draft-simple, draft-eagle3, "
                            "draft-mtp, ngram-simple, ...)",
            "weight_formats": f"{_LCPP}: tools/quantize/quantize.cpp QUANT_OPTIONS; convert_hf_to_gguf.py --outtype",
        },
        not_launched={
            "kv:fp8": "its cache types (common/arg.cpp kv_cache_types) are f32, f16, bf16, q8_0, q4_0, q4_1, iq4_nl, "
                      "q5_0, q5_1: no fp8",
            "spec:eagle": "llama-server drafts with draft-simple, draft-eagle3, draft-mtp and n-gram types: no "
                          "EAGLE-1/2 heads",
            "spec:medusa": "llama-server has no Medusa heads",
            "weights:fp8": "GGUF has no FP8 format (Q8_0 is 8.5 bits a weight with block scales, not what kvtune "
                           "would model for fp8)",
            "weights:int8": "GGUF has no int8 format (Q8_0 is 8.5 bits a weight with block scales)",
            "deployment:disaggregated": "llama-server has no prefill/decode disaggregation (no launch line)",
            "tensor_parallel": "llama.cpp's --split-mode splits layers or rows across GPUs, which is not the tensor "
                               "parallelism kvtune simulates",
            "multi_node": "llama-server runs on one machine",
        }),
}


def capabilities_for(engine: str | None) -> Capabilities:
    """The row of ``engine`` (``DEFAULT_ENGINE``'s when None)."""
    return CAPABILITIES[engine or DEFAULT_ENGINE]
