"""Launch settings users can paste: vLLM, SGLang and TensorRT-LLM commands and a Kubernetes
Deployment, for one recommended configuration.

Flag names checked against the engines' documentation (search of docs.vllm.ai v0.10-v0.14 spec
decoding pages and ``vllm serve`` examples; docs.sglang.io "Speculative Decoding" and server
arguments; nvidia.github.io TensorRT-LLM ``trtllm-serve`` reference and LLM-API ``LlmArgs``):
``CHECKED`` records the versions. The chunk budget maps to vLLM ``--max-num-batched-tokens``,
SGLang ``--chunked-prefill-size`` and TensorRT-LLM ``max_num_tokens``; the batch cap to
``--max-num-seqs`` / ``--max-running-requests`` / ``max_batch_size``.
"""

from __future__ import annotations

import json
import shlex

import yaml

__all__ = ["launch_settings", "CHECKED"]

CHECKED = "flags checked against vLLM 0.10-0.14, SGLang 0.5 docs, TensorRT-LLM 1.0 trtllm-serve/LlmArgs docs"

_SGLANG_ALGO = {"eagle3": "EAGLE3", "eagle": "EAGLE", "mtp": "EAGLE", "draft": "STANDALONE", "ngram": "NGRAM"}
_TRT_DECODING = {"eagle3": "Eagle3", "eagle": "Eagle", "mtp": "MTP", "draft": "DraftTarget", "ngram": "NGram"}


def _q(parts: list[str]) -> str:
    """One shell line, continued with backslashes every few arguments."""
    out, line = [], []
    for p in parts:
        line.append(p)
        if p.startswith("--") is False and len(line) >= 2:
            out.append(" ".join(line))
            line = []
    if line:
        out.append(" ".join(line))
    return " \\\n  ".join(out)


def vllm_command(model: str, cfg: dict, gpu_mem_util: float, spec: dict | None, prefix_caching: bool = True) -> str:
    parts = ["vllm serve", shlex.quote(model),
             "--tensor-parallel-size", str(cfg["tp"]),
             "--max-num-seqs", str(cfg["batch_cap"]),
             "--max-num-batched-tokens", str(cfg["chunk_tokens"]),
             "--kv-cache-dtype", "fp8" if cfg["kv_dtype"] == "fp8" else "auto",
             "--gpu-memory-utilization", f"{gpu_mem_util:g}"]
    if cfg.get("spec_k") and spec:
        sc = {"method": spec.get("method", "eagle3"), "num_speculative_tokens": int(cfg["spec_k"])}
        if spec.get("draft_model"):
            sc["model"] = spec["draft_model"]
        parts += ["--speculative-config", shlex.quote(json.dumps(sc))]
    if prefix_caching:
        parts.append("--enable-prefix-caching")
    return _q(parts)


def sglang_command(model: str, cfg: dict, gpu_mem_util: float, spec: dict | None) -> str:
    parts = ["python -m sglang.launch_server", "--model-path", shlex.quote(model),
             "--tp-size", str(cfg["tp"]),
             "--max-running-requests", str(cfg["batch_cap"]),
             "--chunked-prefill-size", str(cfg["chunk_tokens"]),
             # the recommendation was simulated with prefill chunks riding in the decode steps; SGLang
             # does that only with mixed chunks on (off by default: prefill batches run alone and the
             # decodes wait, costmodel.simulate's prefill_first)
             "--enable-mixed-chunk",
             "--mem-fraction-static", f"{gpu_mem_util:g}"]
    if cfg["kv_dtype"] == "fp8":
        parts += ["--kv-cache-dtype", "fp8_e4m3"]
    if cfg.get("spec_k") and spec:
        k = int(cfg["spec_k"])
        parts += ["--speculative-algorithm", _SGLANG_ALGO.get(spec.get("method", "eagle3"), "EAGLE3")]
        if spec.get("draft_model"):
            parts += ["--speculative-draft-model-path", shlex.quote(spec["draft_model"])]
        # a chain (top-k 1) of k draft steps verifies k + 1 tokens per pass, as the cost model assumes
        parts += ["--speculative-num-steps", str(k), "--speculative-eagle-topk", "1",
                  "--speculative-num-draft-tokens", str(k + 1)]
    return _q(parts)


def trtllm_settings(model: str, cfg: dict, gpu_mem_util: float, spec: dict | None) -> dict:
    """``trtllm-serve`` command plus the ``--extra_llm_api_options`` YAML (LLM-API keys)."""
    api: dict = {"max_batch_size": int(cfg["batch_cap"]), "max_num_tokens": int(cfg["chunk_tokens"]),
                 "kv_cache_config": {"dtype": "fp8" if cfg["kv_dtype"] == "fp8" else "auto",
                                     "free_gpu_memory_fraction": round(float(gpu_mem_util), 3),
                                     "enable_block_reuse": True}}
    if cfg.get("spec_k") and spec:
        sc = {"decoding_type": _TRT_DECODING.get(spec.get("method", "eagle3"), "Eagle3"),
              "max_draft_len": int(cfg["spec_k"])}
        if spec.get("draft_model"):
            sc["speculative_model_dir"] = spec["draft_model"]
        api["speculative_config"] = sc
    cmd = _q(["trtllm-serve", shlex.quote(model), "--tp_size", str(cfg["tp"]),
              "--max_batch_size", str(cfg["batch_cap"]), "--max_num_tokens", str(cfg["chunk_tokens"]),
              "--extra_llm_api_options", "config.yaml"])
    return {"command": cmd, "config_yaml": yaml.safe_dump(api, sort_keys=False)}


def k8s_deployment(name: str, model: str, cfg: dict, replicas: int, gpu_mem_util: float, spec: dict | None) -> str:
    """A Deployment running the vLLM command: ``replicas`` pods of ``tp`` GPUs each."""
    args = ["--tensor-parallel-size", str(cfg["tp"]), "--max-num-seqs", str(cfg["batch_cap"]),
            "--max-num-batched-tokens", str(cfg["chunk_tokens"]),
            "--kv-cache-dtype", "fp8" if cfg["kv_dtype"] == "fp8" else "auto",
            "--gpu-memory-utilization", f"{gpu_mem_util:g}", "--enable-prefix-caching"]
    if cfg.get("spec_k") and spec:
        sc = {"method": spec.get("method", "eagle3"), "num_speculative_tokens": int(cfg["spec_k"])}
        if spec.get("draft_model"):
            sc["model"] = spec["draft_model"]
        args += ["--speculative-config", json.dumps(sc)]
    label = {"app": name}
    doc = {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "labels": label},
        "spec": {
            "replicas": int(replicas), "selector": {"matchLabels": label},
            "template": {
                "metadata": {"labels": label},
                "spec": {"containers": [{
                    "name": "vllm", "image": "vllm/vllm-openai:latest",
                    "command": ["vllm", "serve", model], "args": args,
                    "ports": [{"containerPort": 8000}],
                    "resources": {"limits": {"nvidia.com/gpu": int(cfg["tp"])}},
                    "volumeMounts": [{"name": "shm", "mountPath": "/dev/shm"}],
                }], "volumes": [{"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}}]},
            },
        },
    }
    return yaml.safe_dump(doc, sort_keys=False)


def launch_settings(model: str, cfg: dict, replicas: int, gpu_mem_util: float, spec: dict | None,
                    name: str = "kvtune-llm") -> dict:
    """All four, for ``cfg`` = {tp, batch_cap, kv_dtype, spec_k, chunk_tokens}."""
    safe = "".join(c if c.isalnum() else "-" for c in name.lower()).strip("-")[:50] or "kvtune-llm"
    return {
        "vllm": vllm_command(model, cfg, gpu_mem_util, spec),
        "sglang": sglang_command(model, cfg, gpu_mem_util, spec),
        "trtllm": trtllm_settings(model, cfg, gpu_mem_util, spec),
        "k8s": k8s_deployment(safe, model, cfg, replicas, gpu_mem_util, spec),
        "checked": CHECKED,
    }
