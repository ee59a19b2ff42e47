"""Launch settings users can paste, for one recommended deployment: vLLM, SGLang and
TensorRT-LLM commands, a llama.cpp ``llama-server`` command, and a Kubernetes manifest.

Each targets one named engine version (``ENGINE_VERSIONS``; every flag or config key it emits is in
``FLAGS`` / ``TRTLLM_KEYS`` with the source file and section it was read from) and is set so that
the engine does what kvtune simulated: batch cap, chunk budget and mixed prefill/decode steps, the
KV pool (memory share converted per engine), KV dtype, prefix caching, speculation by the same
method and draft length, FP8 weights from an FP8 checkpoint or online quantization. Where an engine
cannot run the pick, its entry says why instead of giving a command (``unsupported``).

One home module per engine (``vllm.py``, ``sglang.py``, ``trtllm.py``, ``llamacpp.py``: its version,
flags, launch line and tune adapter), registered once in ``registry.py``; ``kubernetes.py`` wraps the
chosen engine in a Deployment or, for a replica spanning nodes, a LeaderWorkerSet; ``disagg.py``
gives a disaggregated pick's prefill and decode pools, router and manifest for every engine;
``context.py`` sizes each engine's context (vLLM ``--max-model-len``, SGLang ``--context-length``,
TensorRT-LLM ``max_seq_len``) to the workload's longest request and what the KV pool holds.
tests/contracts/ holds the engines' own argument definitions the tests check every line against.
"""

from __future__ import annotations

from . import kubernetes
from .disagg import disaggregated_launch as _disaggregated_launch
from .pick import SPEC_METHODS, LaunchPick, MemoryFacts, Unsupported, build_pick, native_fp8
from .platforms import PlannerTargets, platform_launch
from .registry import ENGINE_VERSIONS, FLAGS, HOMES, TRTLLM_DISAGG_KEYS, TRTLLM_KEYS, home
from .serving import EngineHome
from .shell import add_argv, argv_of, command, comment_block
from .versions import ROUTER_VERSIONS

__all__ = ["launch_settings", "launch_for_pick", "disaggregated_launch", "ROUTER_VERSIONS", "TRTLLM_DISAGG_KEYS", "build_pick", "scheduling", "CHECKED", "ENGINE_VERSIONS",
           "FLAGS", "HOMES", "TRTLLM_KEYS", "LaunchPick", "MemoryFacts", "Unsupported", "SPEC_METHODS", "argv_of", "PlannerTargets"]

CHECKED = ("flags read from the engines' own sources: " +
           "; ".join(f"{v.label}" for v in ENGINE_VERSIONS.values()) +
           " (each engine's module in optimizer/launch/ lists each flag with its file and section)")


def scheduling(engine: str | None, spec_method: str | None, spec_k: int) -> str:
    """How the engine schedules prompts next to decodes with these launch settings: 'mixed'
    (chunks ride in decode steps) or 'prefill_first' (SGLang under NGRAM/STANDALONE speculation)."""
    return HOMES[engine].scheduling(spec_method, spec_k) if engine in HOMES else "mixed"


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


def _multi_node_note(h: EngineHome, p: LaunchPick) -> list[str]:
    if not p.multi_node:
        return []
    return [f"one replica spans {p.nodes} nodes: this is node 0; on node r = 1..{p.nodes - 1} run the same "
            f"with {h.worker_flags} (the Kubernetes manifest does this with a LeaderWorkerSet)"]


def launch_for_pick(p: LaunchPick, name: str = "kvtune-llm", engine: str | None = None,
                    targets: PlannerTargets | None = None) -> dict:
    """Every engine's settings for ``p``; the Kubernetes manifest runs ``engine`` (default vLLM);
    ``platforms``: Dynamo, llm-d and KServe (platforms.py; ``targets``: their SLOs)."""
    safe = "".join(c if c.isalnum() else "-" for c in name.lower()).strip("-")[:50].strip("-") or "kvtune-llm"
    out: dict = {"versions": {e: v.to_json() for e, v in ENGINE_VERSIONS.items()}, "unsupported": {}, "notes": {},
                 "scheduling": {e: scheduling(e, p.spec_method, p.spec_k) for e in HOMES}}
    for e, h in HOMES.items():
        try:
            line = h.serve_line(p, "0" if p.multi_node else None)
            notes = line.notes + _multi_node_note(h, p)
            text = _header(e, p, notes) + "\n" + command(line.argv, head=h.head)
            out[e] = text if h.config_file is None else \
                {"command": text, "config_yaml": kubernetes.dump_yaml([line.config or {}])}
            out["notes"][e] = notes
        except Unsupported as exc:
            out[e] = _unsupported(e, str(exc)) if h.config_file is None else \
                {"command": _unsupported(e, str(exc)), "config_yaml": ""}
            out["unsupported"][e] = str(exc)
    k8s_engine = engine if engine in HOMES else "vllm"
    k8s = home(k8s_engine)
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
        if k8s.config_file is not None:
            head.append(f"{k8s.config_file} ({k8s.config_flag}): the ConfigMap {safe}-config, mounted at "
                        f"{kubernetes.CONFIG_DIR}")
        body = kubernetes.manifest(p, safe, k8s.version,
                                   lambda r, a, n: k8s.serve_line(p, r, a, n, kubernetes.CONFIG_DIR).argv,
                                   {k8s.config_file: out[k8s_engine]["config_yaml"]} if k8s.config_file else None)
        out["k8s"] = comment_block(head) + "\n" + body
    except Unsupported as exc:
        out["k8s"] = _unsupported(k8s_engine, str(exc))
        out["unsupported"]["k8s"] = str(exc)
    out["memory"] = None if p.memory is None else {**p.memory.to_json(), "weights": p.weights,
                                                   "gpu_mem_util": p.gpu_mem_util}
    out["checked"] = CHECKED
    out["platforms"] = platform_launch(safe, engine, serve=p, targets=targets)
    return add_argv(out, HOMES)


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

