"""Launch settings users can paste, for one recommended deployment: vLLM, SGLang and
TensorRT-LLM commands, a llama.cpp ``llama-server`` command, and a Kubernetes manifest.

Each targets one named engine version (``versions.ENGINE_VERSIONS``; every flag or config key it
emits is in ``versions.FLAGS`` / ``versions.TRTLLM_KEYS`` with the source file and section it was
read from) and is set so that the engine does what kvtune simulated: batch cap, chunk budget and
mixed prefill/decode steps, the KV pool (memory share converted per engine), KV dtype, prefix
caching, speculation by the same method and draft length, FP8 weights from an FP8 checkpoint or
online quantization. Where an engine cannot run the pick, its entry says why instead of giving a
command (``unsupported``).

Per engine: ``vllm.py``, ``sglang.py``, ``trtllm.py``, ``llamacpp.py``; ``kubernetes.py`` wraps the
chosen engine in a Deployment or, for a replica spanning nodes, a LeaderWorkerSet; ``disagg.py``
gives a disaggregated pick's prefill and decode pools, router and manifest for every engine;
``context.py`` sizes each engine's context (vLLM ``--max-model-len``, SGLang ``--context-length``,
TensorRT-LLM ``max_seq_len``) to the workload's longest request and what the KV pool holds.
tests/contracts/ holds the engines' own argument definitions the tests check every line against.
"""

from __future__ import annotations

from . import kubernetes
from .disagg import disaggregated_launch as _disaggregated_launch
from .llamacpp import llamacpp_argv
from .pick import SPEC_METHODS, LaunchPick, MemoryFacts, Unsupported, build_pick, native_fp8
from .platforms import PlannerTargets, platform_launch
from .sglang import sglang_argv, sglang_mixed_chunk, DIST_PORT
from .shell import add_argv, argv_of, command, comment_block
from .trtllm import trtllm_argv
from .versions import ENGINE_VERSIONS, ENGINES, FLAGS, ROUTER_VERSIONS, TRTLLM_DISAGG_KEYS, TRTLLM_KEYS
from .vllm import vllm_argv

__all__ = ["launch_settings", "launch_for_pick", "disaggregated_launch", "ROUTER_VERSIONS", "TRTLLM_DISAGG_KEYS", "build_pick", "scheduling", "CHECKED", "ENGINE_VERSIONS",
           "ENGINES", "FLAGS", "TRTLLM_KEYS", "LaunchPick", "MemoryFacts", "Unsupported", "SPEC_METHODS", "argv_of", "PlannerTargets"]

CHECKED = ("flags read from the engines' own sources: " +
           "; ".join(f"{v.label}" for v in ENGINE_VERSIONS.values()) +
           " (optimizer/launch/versions.py lists each flag with its file and section)")


def scheduling(engine: str | None, spec_method: str | None, spec_k: int) -> str:
    """How the engine schedules prompts next to decodes with these launch settings: 'mixed'
    (chunks ride in decode steps) or 'prefill_first' (SGLang under NGRAM/STANDALONE speculation)."""
    if engine == "sglang" and not sglang_mixed_chunk(spec_method, spec_k):
        return "prefill_first"
    return "mixed"


def _gb(x: float) -> str:
    return f"{x / 1e9:.1f} GB"


def _memory_lines(p: LaunchPick) -> list[str]:
    m = p.memory
    if m is None:
        return []
    w = ("FP8 (1-byte GEMM weights, bf16 embeddings and LM head)" if p.weights == "fp8" else p.weights)
    return [f"kvtune planned per GPU: weights {w} {_gb(m.weight_bytes_per_gpu)} "
            f"(of {_gb(m.weight_bytes_total)} at TP {p.tp} x PP {p.pp}), "
            + (f"draft ({m.draft}) {_gb(m.draft_weight_bytes_per_gpu)} + "
               f"{m.draft_kv_bytes_per_token_per_gpu:,.0f} KV bytes per pool token, " if m.draft else "")
            + "activation reserve "
            f"{_gb(m.activation_reserve_bytes)}, KV pool {_gb(m.kv_pool_bytes_per_gpu)} = "
            f"{m.kv_pool_tokens:,} tokens per replica ({p.kv_dtype} KV), at {p.gpu_mem_util:g} of "
            f"{_gb(m.gpu_memory_bytes)}"]


def _header(engine: str, p: LaunchPick, notes: list[str]) -> str:
    v = ENGINE_VERSIONS[engine]
    lines = [f"{v.label}" + (f" (image {v.image})" if v.image else "")]
    if p.model_note:
        lines.append(p.model_note)
    if p.draft_note and p.speculating:
        lines.append(p.draft_note)
    if p.weights == "bf16" and native_fp8(p.model):
        lines.append(f"weights: {p.model} is published in FP8; kvtune planned bf16 weights, more memory than "
                     f"this checkpoint uses (set weights: fp8 to plan for it)")
    lines += _memory_lines(p) + notes
    return comment_block(lines)


def _unsupported(engine: str, reason: str) -> str:
    return f"# {ENGINE_VERSIONS[engine].label} cannot run this pick: {reason}"


def _multi_node_note(engine: str, p: LaunchPick) -> list[str]:
    if not p.multi_node:
        return []
    if engine == "vllm":
        return [f"one replica spans {p.nodes} nodes: this is node 0; on node r = 1..{p.nodes - 1} run the same "
                f"with --node-rank r --headless (the Kubernetes manifest does this with a LeaderWorkerSet)"]
    return [f"one replica spans {p.nodes} nodes: this is node 0; on node r = 1..{p.nodes - 1} run the same "
            f"with --node-rank r (the Kubernetes manifest does this with a LeaderWorkerSet)"]


def _engine_argv(engine: str, p: LaunchPick, node_rank=None, addr=None, nnodes=None):
    if engine == "vllm":
        return vllm_argv(p, node_rank, addr, nnodes)
    if engine == "sglang":
        return sglang_argv(p, node_rank, None if addr is None else f"{addr}:{DIST_PORT}", nnodes)
    if engine == "trtllm":
        argv, _, notes = trtllm_argv(p, config=f"{kubernetes.CONFIG_DIR}/config.yaml")
        return argv, notes
    return llamacpp_argv(p)


def launch_for_pick(p: LaunchPick, name: str = "kvtune-llm", engine: str | None = None,
                    targets: PlannerTargets | None = None) -> dict:
    """Every engine's settings for ``p``; the Kubernetes manifest runs ``engine`` (default vLLM);
    ``platforms``: Dynamo, llm-d and KServe (platforms.py; ``targets``: their SLOs)."""
    safe = "".join(c if c.isalnum() else "-" for c in name.lower()).strip("-")[:50].strip("-") or "kvtune-llm"
    out: dict = {"versions": {e: v.to_json() for e, v in ENGINE_VERSIONS.items()}, "unsupported": {}, "notes": {},
                 "scheduling": {e: scheduling(e, p.spec_method, p.spec_k) for e in ENGINES}}
    for e in ("vllm", "sglang", "llamacpp"):
        try:
            rank0 = "0" if p.multi_node and e != "llamacpp" else None
            argv, notes = _engine_argv(e, p, rank0)
            notes = notes + _multi_node_note(e, p)
            out[e] = _header(e, p, notes) + "\n" + command(argv, head=3 if e == "sglang" else 0)
            out["notes"][e] = notes
        except Unsupported as exc:
            out[e] = _unsupported(e, str(exc))
            out["unsupported"][e] = str(exc)
    try:
        argv, api, notes = trtllm_argv(p)
        out["trtllm"] = {"command": _header("trtllm", p, notes) + "\n" + command(argv),
                         "config_yaml": kubernetes.dump_yaml([api])}
        out["notes"]["trtllm"] = notes
    except Unsupported as exc:
        out["trtllm"] = {"command": _unsupported("trtllm", str(exc)), "config_yaml": ""}
        out["unsupported"]["trtllm"] = str(exc)
    k8s_engine = engine if engine in ENGINES else "vllm"
    out["k8s_engine"] = k8s_engine
    try:
        if k8s_engine in out["unsupported"]:
            raise Unsupported(out["unsupported"][k8s_engine])
        head = [f"{ENGINE_VERSIONS[k8s_engine].label} on Kubernetes: {p.replicas} replica(s) of "
                f"{p.gpus_per_replica} GPU(s)" + (f" over {p.nodes} nodes (LeaderWorkerSet)" if p.multi_node else ""),
                f"Hugging Face token: kubectl create secret generic {kubernetes.HF_SECRET['name']} "
                f"--from-literal={kubernetes.HF_SECRET['key']}=hf_..." + (" (required: gated model)" if p.gated else ""),
                "model cache: a ReadWriteMany PersistentVolumeClaim (needs a storage class that offers it)"]
        if p.model_note:
            head.append(p.model_note)
        if k8s_engine == "trtllm":
            head.append(f"config.yaml (--extra_llm_api_options): the ConfigMap {safe}-config, mounted at "
                        f"{kubernetes.CONFIG_DIR}")
        body = kubernetes.manifest(p, safe, ENGINE_VERSIONS[k8s_engine],
                                   lambda r, a, n: _engine_argv(k8s_engine, p, r, a, n)[0],
                                   {"config.yaml": out["trtllm"]["config_yaml"]} if k8s_engine == "trtllm" else None)
        out["k8s"] = comment_block(head) + "\n" + body
    except Unsupported as exc:
        out["k8s"] = _unsupported(k8s_engine, str(exc))
        out["unsupported"]["k8s"] = str(exc)
    out["memory"] = None if p.memory is None else {**p.memory.to_json(), "weights": p.weights,
                                                   "gpu_mem_util": p.gpu_mem_util}
    out["checked"] = CHECKED
    out["platforms"] = platform_launch(safe, engine, serve=p, targets=targets)
    return add_argv(out)


def disaggregated_launch(prefill: LaunchPick, decode: LaunchPick, name: str = "kvtune-llm",
                         engine: str | None = None, targets: PlannerTargets | None = None) -> dict:
    """disagg.disaggregated_launch (argv and env beside the shell text), and the platforms' output
    (platforms.py) under ``platforms``."""
    out = _disaggregated_launch(prefill, decode, name, engine)
    out["platforms"] = platform_launch(name, engine, prefill=prefill, decode=decode, targets=targets)
    return out


def launch_settings(model: str, cfg: dict, replicas: int, gpu_mem_util: float, speculative: dict | None,
                    name: str = "kvtune-llm", *, arch=None, gpu=None, weights: str = "bf16",
                    activation_reserve_bytes: float = 0.0, gpus_per_node: int = 8, engine: str | None = None,
                    prefix_caching: bool = True, max_request_tokens: int | None = None,
                    max_prompt_tokens: int | None = None, targets: PlannerTargets | None = None,
                    checkpoint=None) -> dict:
    """All engines' settings for ``cfg`` = {tp, batch_cap, kv_dtype, spec_k, chunk_tokens} (and
    optionally pp, ep, dp_attention, nodes_per_replica, gpus_per_node). ``arch``/``gpu`` (the
    costmodel records) give the memory plan and the model's facts; ``engine`` picks the one the
    Kubernetes manifest runs (default vLLM); ``max_request_tokens`` / ``max_prompt_tokens`` (the
    workload's longest request and prompt) size each engine's context (context.py); ``checkpoint``:
    the workload's ``checkpoint:`` (optimizer.user_checkpoint), which every line loads."""
    p = build_pick(model, cfg, replicas, gpu_mem_util, speculative, arch=arch, gpu=gpu, weights=weights,
                   activation_reserve_bytes=activation_reserve_bytes, gpus_per_node=gpus_per_node,
                   prefix_caching=prefix_caching, max_request_tokens=max_request_tokens,
                   max_prompt_tokens=max_prompt_tokens, checkpoint=checkpoint)
    return launch_for_pick(p, name, engine, targets)

