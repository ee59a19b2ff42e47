"""llm-d: values for the llm-d-modelservice Helm chart (v0.4.12,
charts/llm-d-modelservice/values.yaml and values.schema.json), for one pick, aggregated or
disaggregated: ``helm install NAME llm-d-modelservice/llm-d-modelservice -f values.yaml``.

The chart runs vLLM: each pool (``decode``, and ``prefill`` for a disaggregated pick) is a
container with ``modelCommand: vllmServe``, for which the chart writes ``vllm serve <model>
--port ... --tensor-parallel-size <parallelism.tensor> --served-model-name <modelArtifacts.name>``
itself (templates/_helpers.tpl ``vllmServeModelCommand``) and appends the container's ``args``:
kvtune's vLLM flags (vllm.py) less the ones the chart sets. A disaggregated pick adds vLLM's
NixlConnector on both pools and turns on the chart's routing sidecar (``routing.proxy``, connector
``nixlv2``) in front of the decode pods. The image is kvtune's pinned vLLM (versions.py), the one
its flags are checked against.

The chart's multi-node form (``multinode: true``, a LeaderWorkerSet) runs data-parallel vLLM
(``parallelism.data/dataLocal/workers``); a replica whose TP x PP spans nodes is not that form, so
such a pick gets the reason instead of values.

Checked against tests/contracts/platforms/llm-d-modelservice-0.4.12.json (the chart's own
values.schema.json, what ``helm install`` validates, bench/refresh_platform_schemas.py).
"""

from __future__ import annotations

import json
import math

from .disagg import VLLM_CONNECTOR
from .pick import LaunchPick, Unsupported
from .platform_argv import PlatformVersion, without_flags
from .versions import ENGINE_VERSIONS
from .vllm import vllm_argv

__all__ = ["LLMD", "HF_SECRET", "llmd_values", "CHART_SETS"]

LLMD = PlatformVersion("llmd", "llm-d-modelservice", "0.4.12", "llm-d-incubation/llm-d-modelservice",
                       "3051935eb5a49f6df21cd6aeb5e4f05b98799262",
                       "tests/contracts/platforms/llm-d-modelservice-0.4.12.json")
# modelArtifacts.authSecretName: a Secret whose key HF_TOKEN the chart reads (_helpers.tpl hfEnv)
HF_SECRET = "llm-d-hf-token"
# flags vllmServe writes itself (_helpers.tpl vllmServeModelCommand): dropped from kvtune's argv
CHART_SETS = ("--port", "--host", "--tensor-parallel-size", "--served-model-name")
PROXY_CONNECTOR = "nixlv2"    # values.yaml routing.proxy.connector


def _pool(p: LaunchPick, role: str, disagg: bool) -> dict:
    argv = without_flags(vllm_argv(p, role=role)[0], CHART_SETS)[3:]   # less `vllm serve MODEL`
    if disagg:
        argv += ["--kv-transfer-config", json.dumps(VLLM_CONNECTOR, separators=(",", ":"))]
    gpus = p.gpus_per_replica
    container = {"name": "vllm", "image": ENGINE_VERSIONS["vllm"].image, "modelCommand": "vllmServe",
                 "args": argv, "env": [{"name": "VLLM_NIXL_SIDE_CHANNEL_HOST",
                                        "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}] if disagg else [],
                 "resources": {"limits": {"nvidia.com/gpu": gpus}, "requests": {"nvidia.com/gpu": gpus}},
                 "mountModelVolume": True}
    # under DP attention vLLM runs TP 1 x DP tp (vllm.py): its --data-parallel-size stays in the args
    tensor = 1 if p.dp_attention else p.tp
    return {"create": True, "replicas": p.replicas, "parallelism": {"tensor": tensor}, "containers": [container]}


def llmd_values(serve: LaunchPick | None = None, prefill: LaunchPick | None = None,
                decode: LaunchPick | None = None, engine: str | None = None) -> dict:
    """The chart's values: ``serve`` for an aggregated pick, ``prefill`` + ``decode`` for a
    disaggregated one. ``engine``: the workload's; the chart runs vLLM whatever it is."""
    if serve is not None:
        roles: list[tuple[str, LaunchPick, str]] = [("decode", serve, "serve")]
    elif prefill is not None and decode is not None:
        roles = [("prefill", prefill, "prefill"), ("decode", decode, "decode")]
    else:
        raise ValueError("llmd_values: give serve, or prefill and decode")
    for _, p, _ in roles:
        if p.multi_node:
            raise Unsupported(f"one replica spans {p.nodes} nodes (TP {p.tp} x PP {p.pp}): the chart's multinode "
                              f"form runs data-parallel vLLM only; use the LeaderWorkerSet manifest (k8s)")
        p.require_launchable("vllm")
    first = roles[0][1]
    ckpt = vllm_argv(first)[0][2]
    # the model volume: the checkpoint kvtune planned plus a fifth (as kubernetes.pvc), at least 20 GiB
    size_gib = 100 if first.memory is None else max(20, math.ceil(first.memory.weight_bytes_total * 1.2 / 2**30))
    disagg = serve is None
    values: dict = {"modelArtifacts": {"name": ckpt, "uri": f"hf://{ckpt}", "size": f"{size_gib}Gi",
                                       "authSecretName": HF_SECRET},
                    "multinode": False,
                    "routing": {"servicePort": 8000, "proxy": {"enabled": disagg, "connector": PROXY_CONNECTOR}},
                    "prefill": {"create": False}}
    for pool, p, role in roles:
        values[pool] = _pool(p, role, disagg)
    return values
