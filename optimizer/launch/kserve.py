"""KServe 0.20.0: an ``LLMInferenceService`` (serving.kserve.io/v1alpha1) for one pick, aggregated
or disaggregated.

KServe's presets (config/llmisvcconfig/config-llm-template.yaml and the prefill/decode templates
at v0.20.0) run ``vllm serve /mnt/models --served-model-name ... --port 8000
--tensor-parallel-size <spec.parallelism.tensor> ... "$@"``: the main container's ``args`` reach vLLM
after the preset's own flags, and the prefill/decode presets add the NixlConnector
``--kv-transfer-config`` themselves. So the args are kvtune's vLLM flags (vllm.py) less those the
preset sets; replicas and tensor parallelism are the resource's own fields (``spec.replicas``,
``spec.parallelism``, ``spec.prefill``); the model is ``hf://<checkpoint>``, pulled by KServe's
storage initializer. The image is kvtune's pinned vLLM (vllm.VERSION), the one its flags are
checked against (the preset's own image bundles another vLLM build).

The presets' multi-node form (``spec.worker``, a LeaderWorkerSet) is data-parallel vLLM
(config-llm-worker-data-parallel.yaml: ``--data-parallel-size``, ``-size-local``, the start rank and
``--headless`` on the workers, from ``spec.parallelism``): an attention-data-parallel pick over
several nodes (DeepSeek-style DP attention with expert parallelism) is written in that form. A
replica whose TP x PP spans nodes gets the reason instead: v0.20.0's controller selects a
pipeline-parallel preset (``kserve-config-llm-worker-pipeline-parallel``, config_merge.go) that
the release does not ship (``_multi_node_reason``).

Checked against tests/contracts/platforms/kserve-0.20.0.json (the CRD's v1alpha1 schema,
bench/refresh_platform_schemas.py).
"""

from __future__ import annotations

from . import kubernetes
from .pick import LaunchPick, Unsupported, local_folder
from .platform_argv import PlatformVersion, data_parallel_nodes, safe_name, without_flags
from .registry import ENGINE_VERSIONS
from .vllm import vllm_argv

__all__ = ["KSERVE", "API_VERSION", "PRESET_SETS", "llm_inference_service"]

KSERVE = PlatformVersion("kserve", "KServe", "0.20.0", "kserve/kserve", "1fb781055dd1567164358233e1125142ca6ef1fe",
                         "tests/contracts/platforms/kserve-0.20.0.json")
API_VERSION = "serving.kserve.io/v1alpha1"
# flags the preset's `vllm serve` line writes itself (config-llm-template.yaml): dropped from kvtune's argv
PRESET_SETS = ("--port", "--host", "--tensor-parallel-size", "--served-model-name")


def _tensor(p: LaunchPick) -> int:
    """The preset's --tensor-parallel-size: 1 under DP attention (vLLM runs TP 1 x DP tp, vllm.py;
    its --data-parallel-size stays in the args)."""
    return 1 if p.dp_attention else p.tp


def _template(p: LaunchPick, role: str) -> dict:
    drop: tuple[str, ...] = PRESET_SETS
    switches: tuple[str, ...] = ()
    if data_parallel_nodes(p):
        # the data-parallel preset writes these from spec.parallelism (config-llm-worker-data-parallel.yaml)
        drop, switches = PRESET_SETS + ("--data-parallel-size",), ("--enable-expert-parallel",)
    args = without_flags(vllm_argv(p, role=role)[0], drop, switches)[3:]   # less `vllm serve MODEL`
    gpus = p.gpus_per_pod
    main = {"name": "main", "image": ENGINE_VERSIONS["vllm"].image, "args": args,
            "env": [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {**kubernetes.HF_SECRET,
                                                                          "optional": not p.gated}}}],
            "resources": {"limits": {"nvidia.com/gpu": str(gpus)}, "requests": {"nvidia.com/gpu": str(gpus)}}}
    return {"containers": [main]}


def _parallelism(p: LaunchPick) -> dict:
    if data_parallel_nodes(p):
        return {"tensor": 1, "data": p.tp, "dataLocal": p.gpus_per_pod, "expert": p.ep > 1}
    return {"tensor": _tensor(p)}


# the pipeline-parallel preset KServe 0.20.0's controller names but does not ship (see _multi_node_reason)
PIPELINE_PRESET = "kserve-config-llm-worker-pipeline-parallel"


def _multi_node_reason(p: LaunchPick) -> str:
    """Why a multi-node replica is not written (one line). At v0.20.0 the controller picks
    ``kserve-config-llm-worker-pipeline-parallel`` for ``spec.worker`` with ``spec.parallelism.pipeline``
    set (pkg/controller/v1alpha2/llmisvc/config_merge.go combineBaseRefsConfig; the name is kept out of
    WellKnownDefaultConfigs, "FIXME move those presets to well-known when they're finally known"), but
    the release ships no such LLMInferenceServiceConfig (config/llmisvcconfig/ and
    charts/kserve-runtime-configs/files/llmisvcconfigs/resources.yaml hold the data-parallel worker
    presets only; the pipeline-parallel ones are in PR kserve/kserve#5315, commit 04184a46a, not in the
    tag): getConfig finds none and the service stops at PresetsCombined=False, ConfigNotFound. With
    neither ``data`` nor ``pipeline`` set, a worker gets no preset at all."""
    shape = f"one replica spans {p.nodes} nodes (TP {p.tp} x PP {p.pp})"
    if p.dp_attention and p.pp == 1:
        return (f"{shape}: KServe's multi-node preset runs attention-data-parallel vLLM aggregated only "
                f"(config-llm-worker-data-parallel.yaml); use the LeaderWorkerSet manifest (k8s)")
    if p.dp_attention:
        return (f"{shape}, attention data-parallel: KServe {KSERVE.version}'s data-parallel preset "
                f"(config-llm-worker-data-parallel.yaml) writes no pipeline size and its pipeline-parallel preset "
                f"{PIPELINE_PRESET} is not shipped (named in pkg/controller/v1alpha2/llmisvc/config_merge.go, absent "
                f"from config/llmisvcconfig/ at v{KSERVE.version}); use the LeaderWorkerSet manifest (k8s) or Dynamo")
    return (f"{shape}: KServe {KSERVE.version} selects the preset {PIPELINE_PRESET} for spec.worker with "
            f"spec.parallelism.pipeline (pkg/controller/v1alpha2/llmisvc/config_merge.go) but does not ship it "
            f"(config/llmisvcconfig/ at v{KSERVE.version} has data-parallel worker presets only; the "
            f"pipeline-parallel ones are in PR kserve/kserve#5315), so the service would stop at ConfigNotFound; "
            f"use the LeaderWorkerSet manifest (k8s) or Dynamo")


def llm_inference_service(name: str, serve: LaunchPick | None = None, prefill: LaunchPick | None = None,
                          decode: LaunchPick | None = None) -> dict:
    """The LLMInferenceService: ``serve`` for an aggregated pick, ``prefill`` + ``decode`` for a
    disaggregated one (each with ``replicas`` = its pool's replica count). An aggregated replica
    that is attention data-parallel over several nodes is the presets' multi-node form: a leader
    pod (``template``) and ``nodes - 1`` workers (``worker``) per replica."""
    main = serve if serve is not None else decode
    if main is None or (serve is None and prefill is None):
        raise ValueError("llm_inference_service: give serve, or prefill and decode")
    for p in (main, prefill):
        if p is not None and p.multi_node and not (data_parallel_nodes(p) and serve is not None):
            raise Unsupported(_multi_node_reason(p))
        if p is not None:
            p.require_launchable("vllm")
    ckpt = vllm_argv(main)[0][2]
    local_folder(ckpt, "KServe")
    spec: dict = {"model": {"uri": f"hf://{ckpt}", "name": ckpt}, "replicas": main.replicas,
                  "parallelism": _parallelism(main),
                  # KServe's managed route, gateway and inference scheduler (the presets' defaults)
                  "router": {"route": {}, "gateway": {}, "scheduler": {}},
                  "template": _template(main, "serve" if serve is not None else "decode")}
    if data_parallel_nodes(main):
        spec["worker"] = _template(main, "serve")
    if serve is None and prefill is not None:
        spec["prefill"] = {"replicas": prefill.replicas, "parallelism": _parallelism(prefill),
                           "template": _template(prefill, "prefill")}
    return {"apiVersion": API_VERSION, "kind": "LLMInferenceService", "metadata": {"name": safe_name(name)},
            "spec": spec}
