"""llm-d: values for the llm-d-modelservice Helm chart (v0.4.12,
charts/llm-d-modelservice/values.yaml and values.schema.json), for one pick, aggregated or
disaggregated: ``helm install NAME llm-d-modelservice/llm-d-modelservice -f values.yaml``.

The chart runs vLLM: each pool (``decode``, and ``prefill`` for a disaggregated pick) is a
container with ``modelCommand: vllmServe``, for which the chart writes ``vllm serve <model>
--port ... --tensor-parallel-size <parallelism.tensor> --served-model-name <modelArtifacts.name>``
itself (templates/_helpers.tpl ``vllmServeModelCommand``) and appends the container's ``args``:
kvtune's vLLM flags (vllm.py) less the ones the chart sets. A disaggregated pick adds vLLM's
NixlConnector on both pools and turns on the chart's routing sidecar (``routing.proxy``, connector
``nixlv2``) in front of the decode pods. The image is kvtune's pinned vLLM (vllm.VERSION), the one
its flags are checked against.

The chart's multi-node form is ``multinode: true``: a LeaderWorkerSet (templates/decode-lws.yaml)
of ``parallelism.workers`` pods, each with ``parallelism.tensor x dataLocal`` GPUs (_helpers.tpl
``numGpuPerWorker``); its ``parallelism`` knows tensor, data, dataLocal and workers only (no
pipeline field: values.schema.json, ``additionalProperties: false``) and its vllmServe writes no
rank, address or pipeline size. So kvtune writes a multi-node replica with ``modelCommand: custom``
and a shell line that starts each pod's part of the replica from the variables LWS sets
(``LWS_WORKER_INDEX``, ``LWS_LEADER_ADDRESS``), non-leaders ``--headless``:

- attention data-parallel over several nodes (``parallelism.data/dataLocal``): each pod's
  data-parallel start rank and the leader's RPC address;
- TP x PP with one TP group per node (``parallelism.tensor`` = TP = a pod's GPUs, ``workers`` =
  nodes = PP): vLLM's own multi-node launch (mp backend: ``--nnodes``, ``--node-rank``,
  ``--master-addr``, ``--master-port``, the form kvtune's LeaderWorkerSet manifest runs),
  ``--pipeline-parallel-size`` in kvtune's flags.

A replica the chart cannot describe (TP wider than a pod, several TP groups on one pod, a
disaggregated pool over several nodes) gets the reason instead of values.

Checked against tests/contracts/platforms/llm-d-modelservice-0.4.12.json (the chart's own
values.schema.json, what ``helm install`` validates, bench/refresh_platform_schemas.py).
"""

from __future__ import annotations

import json
import math
import shlex

from .disagg import VLLM_CONNECTOR
from .pick import LaunchPick, Unsupported, local_folder
from .platform_argv import PlatformVersion, data_parallel_nodes, without_flags
from .registry import ENGINE_VERSIONS
from .vllm import vllm_argv

__all__ = ["LLMD", "HF_SECRET", "llmd_values", "CHART_SETS", "pipeline_nodes"]

LLMD = PlatformVersion("llmd", "llm-d-modelservice", "0.4.12", "llm-d-incubation/llm-d-modelservice",
                       "3051935eb5a49f6df21cd6aeb5e4f05b98799262",
                       "tests/contracts/platforms/llm-d-modelservice-0.4.12.json")
# modelArtifacts.authSecretName: a Secret whose key HF_TOKEN the chart reads (_helpers.tpl hfEnv)
HF_SECRET = "llm-d-hf-token"
# flags vllmServe writes itself (_helpers.tpl vllmServeModelCommand): dropped from kvtune's argv
CHART_SETS = ("--port", "--host", "--tensor-parallel-size", "--served-model-name")
PROXY_CONNECTOR = "nixlv2"    # values.yaml routing.proxy.connector
PORT = 8000                   # values.yaml routing.servicePort: vLLM's port with no routing sidecar
DP_RPC_PORT = 5555            # KServe's data-parallel preset's --data-parallel-rpc-port default, reused


def _dp_nodes_script(p: LaunchPick, argv: list[str]) -> str:
    """The container's shell line for the chart's multinode form: every pod of the LeaderWorkerSet
    runs one vLLM data-parallel node, ranks from ``LWS_WORKER_INDEX``, the leader's address from
    ``LWS_LEADER_ADDRESS`` (set by LWS), the non-leaders ``--headless`` (vLLM's own multi-node DP
    launch; the chart's vllmServe writes no rank or address)."""
    local = p.gpus_per_pod
    rest = without_flags(argv, ("--host", "--port", "--data-parallel-size"))[3:]
    cmd = ["vllm", "serve", argv[2], "--port", str(PORT), "--served-model-name", argv[2], *rest,
           "--data-parallel-size", str(p.tp), "--data-parallel-size-local", str(local),
           "--data-parallel-address", "$LWS_LEADER_ADDRESS", "--data-parallel-rpc-port", str(DP_RPC_PORT),
           "--data-parallel-start-rank", "$RANK"]
    return (f"RANK=$(( ${{LWS_WORKER_INDEX:-0}} * {local} )); HEADLESS=; "
            f'[ "${{LWS_WORKER_INDEX:-0}}" -gt 0 ] && HEADLESS=--headless; exec {_shell_words(cmd)} $HEADLESS')


def _shell_words(cmd: list[str]) -> str:
    """``cmd`` as one shell line: each word quoted, the ``$VARIABLE``s the pod sets left to expand."""
    return " ".join(shlex.quote(a) if not a.startswith("$") else f'"{a}"' for a in cmd)


def pipeline_nodes(p: LaunchPick) -> bool:
    """Whether ``p`` is the TP x PP multi-node form kvtune writes on the chart: one TP group per pod
    (TP = a pod's GPUs, so ``parallelism.tensor`` counts the pod's GPUs as the chart does), a
    pipeline stage a node, no DP attention."""
    return p.multi_node and not p.dp_attention and p.tp == p.gpus_per_pod and p.pp == p.nodes


def _multi_node_reason(p: LaunchPick, aggregated: bool) -> str:
    shape = f"one replica spans {p.nodes} nodes (TP {p.tp} x PP {p.pp})"
    if not aggregated:
        return f"{shape}: kvtune writes the chart's multinode form for aggregated picks only; use Dynamo or k8s"
    if p.dp_attention:
        return (f"{shape}, attention data-parallel: the chart's parallelism has no pipeline field (values.schema.json) "
                f"and counts a pod's GPUs as tensor x dataLocal (_helpers.tpl numGpuPerWorker); kvtune writes DP "
                f"attention over nodes with PP 1 only; use the LeaderWorkerSet manifest (k8s) or Dynamo")
    return (f"{shape}: the chart counts a pod's GPUs as parallelism.tensor x dataLocal (_helpers.tpl "
            f"numGpuPerWorker) and kvtune writes TP x PP over its nodes only with TP = a pod's "
            f"{p.gpus_per_pod} GPUs; use the LeaderWorkerSet manifest (k8s) or Dynamo")


def _pp_nodes_script(p: LaunchPick) -> str:
    """The container's shell line for a TP x PP replica over the chart's LeaderWorkerSet: every pod
    runs vLLM's multi-node form (vllm.py, mp backend) with its node rank from ``LWS_WORKER_INDEX``
    and the leader's address from ``LWS_LEADER_ADDRESS``; the non-leaders run ``--headless``."""
    full = vllm_argv(p, node_rank="0", master_addr="$LWS_LEADER_ADDRESS", nnodes=str(p.nodes))[0]
    rest = without_flags(full, ("--host", "--port", "--node-rank"))[3:]
    cmd = ["vllm", "serve", full[2], "--port", str(PORT), "--served-model-name", full[2], *rest,
           "--node-rank", "$NODE_RANK"]
    return ('NODE_RANK=${LWS_WORKER_INDEX:-0}; HEADLESS=; '
            f'[ "$NODE_RANK" -gt 0 ] && HEADLESS=--headless; exec {_shell_words(cmd)} $HEADLESS')


def _pool(p: LaunchPick, role: str, disagg: bool) -> dict:
    full = vllm_argv(p, role=role)[0]
    gpus = p.gpus_per_pod
    env = [{"name": "VLLM_NIXL_SIDE_CHANNEL_HOST", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}] \
        if disagg else []
    container: dict = {"name": "vllm", "image": ENGINE_VERSIONS["vllm"].image}
    if data_parallel_nodes(p):
        container |= {"modelCommand": "custom", "command": ["/bin/sh", "-c"], "args": [_dp_nodes_script(p, full)]}
        parallelism = {"tensor": 1, "data": p.tp, "dataLocal": gpus, "workers": p.nodes}
    elif pipeline_nodes(p):
        container |= {"modelCommand": "custom", "command": ["/bin/sh", "-c"], "args": [_pp_nodes_script(p)]}
        parallelism = {"tensor": p.tp, "workers": p.nodes}
    else:
        argv = without_flags(full, CHART_SETS)[3:]   # less `vllm serve MODEL`
        if disagg:
            argv += ["--kv-transfer-config", json.dumps(VLLM_CONNECTOR, separators=(",", ":"))]
        container |= {"modelCommand": "vllmServe", "args": argv}
        # under DP attention vLLM runs TP 1 x DP tp (vllm.py): its --data-parallel-size stays in the args
        parallelism = {"tensor": 1 if p.dp_attention else p.tp}
    container |= {"env": env, "resources": {"limits": {"nvidia.com/gpu": gpus}, "requests": {"nvidia.com/gpu": gpus}},
                  "mountModelVolume": True}
    return {"create": True, "replicas": p.replicas, "parallelism": parallelism, "containers": [container]}


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
        if p.multi_node and not ((data_parallel_nodes(p) or pipeline_nodes(p)) and serve is not None):
            raise Unsupported(_multi_node_reason(p, serve is not None))
        p.require_launchable("vllm")
    first = roles[0][1]
    ckpt = vllm_argv(first)[0][2]
    local_folder(ckpt, "the llm-d chart")
    # the model volume: the checkpoint kvtune planned plus a fifth (as kubernetes.pvc), at least 20 GiB
    size_gib = 100 if first.memory is None else max(20, math.ceil(first.memory.weight_bytes_total * 1.2 / 2**30))
    disagg = serve is None
    values: dict = {"modelArtifacts": {"name": ckpt, "uri": f"hf://{ckpt}", "size": f"{size_gib}Gi",
                                       "authSecretName": HF_SECRET},
                    "multinode": any(p.multi_node for _, p, _ in roles),
                    "routing": {"servicePort": 8000, "proxy": {"enabled": disagg, "connector": PROXY_CONNECTOR}},
                    "prefill": {"create": False}}
    for pool, p, role in roles:
        values[pool] = _pool(p, role, disagg)
    return values
