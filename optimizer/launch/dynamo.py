"""NVIDIA Dynamo 0.5.1: a ``DynamoGraphDeployment`` (nvidia.com/v1alpha1) for one pick, aggregated
or disaggregated, and the inputs of Dynamo's SLA planner.

The graph is a ``Frontend`` (Dynamo's OpenAI-compatible HTTP front and router) and the engine's
workers as ``components/backends/<engine>/deploy/{agg,disagg}.yaml`` at v0.5.1 write them:
``python3 -m dynamo.vllm --model M <vLLM engine flags>`` (prefill workers add
``--is-prefill-worker``), ``python3 -m dynamo.sglang <SGLang server flags>`` (with
``--disaggregation-mode prefill|decode --disaggregation-transfer-backend nixl``) or
``python3 -m dynamo.trtllm --model-path M ... --override-engine-args <kvtune's LLM API options>``. The engine flags
are kvtune's own (vllm.py, sglang.py: the batch cap, chunk budget, KV dtype and pool share kvtune
simulated) less those the worker sets itself (``--host``, ``--port``). A replica spanning nodes is
one service with ``multinode.nodeCount``: the operator starts its nodes (for vLLM over Ray, for
SGLang by adding ``--dist-init-addr/--nnodes/--node-rank``: deploy/cloud/operator/internal/dynamo/
backend_{vllm,sglang}.go), so the worker's argv is the single-node form.

Worker service names are the ones the SLA planner scales (components/planner/src/dynamo/planner/
defaults.py ``*ComponentName``). The planner interpolates profiles made by Dynamo's own profiler;
kvtune gives its targets (the workload's TTFT and TPOT SLOs), the per-replica GPU counts and the GPU
budget of the deployment kvtune sized, and kvtune's predicted per-replica capacity for reference.

Checked against tests/contracts/platforms/dynamo-0.5.1.json (the CRD's schema and the planner's
flags, bench/refresh_platform_schemas.py).
"""

from __future__ import annotations

import json
import math
import shlex
from dataclasses import dataclass

from .pick import LaunchPick, Unsupported
from .platform_argv import PlatformVersion, safe_name, without_flags
from .sglang import sglang_argv
from .trtllm import trtllm_argv
from .vllm import vllm_argv

__all__ = ["DYNAMO", "API_VERSION", "IMAGES", "WORKERS", "BUNDLED_ENGINES", "HF_SECRET", "PlannerTargets",
           "dynamo_graph", "planner_inputs"]

DYNAMO = PlatformVersion("dynamo", "NVIDIA Dynamo", "0.5.1", "ai-dynamo/dynamo",
                         "3ecc1fbe9592d3e0bcba1fdc9a1daad6cb05d1fe", "tests/contracts/platforms/dynamo-0.5.1.json")
API_VERSION = "nvidia.com/v1alpha1"
# the release's runtime images (components/backends/{vllm,sglang,trtllm}/deploy/disagg.yaml at v0.5.1)
IMAGES = {"vllm": "nvcr.io/nvidia/ai-dynamo/vllm-runtime:0.5.1",
          "sglang": "nvcr.io/nvidia/ai-dynamo/sglang-runtime:0.5.1",
          "trtllm": "nvcr.io/nvidia/ai-dynamo/trtllm-runtime:0.5.1"}
_WORKDIR = {e: f"/workspace/components/backends/{e}" for e in IMAGES}
# cache_transceiver_config.backend of Dynamo's own engine_configs/{prefill,decode}.yaml at v0.5.1
TRTLLM_TRANSCEIVER = "DEFAULT"
# the worker services the SLA planner scales, by backend (planner/defaults.py at v0.5.1)
WORKERS = {"vllm": {"prefill": "VllmPrefillWorker", "decode": "VllmDecodeWorker"},
           "sglang": {"prefill": "prefill", "decode": "decode"},
           "trtllm": {"prefill": "TRTLLMPrefillWorker", "decode": "TRTLLMDecodeWorker"}}
# the engine each runtime image bundles (pyproject.toml extras at v0.5.1); kvtune's flags are
# checked against its own pinned engine versions (each engine's VERSION), not these
BUNDLED_ENGINES = {"vllm": "0.10.1.1", "sglang": "0.5.0rc2", "trtllm": "1.1.0rc5"}
# the examples' envFromSecret: every key of the Secret becomes an environment variable (HF_TOKEN)
HF_SECRET = "hf-token-secret"
PLANNER_PROFILE_DIR = "/data/profiling_results"   # disagg_planner.yaml's --profile-results-dir
PLANNER_INTERVAL_S = 60                           # disagg_planner.yaml's --adjustment-interval


@dataclass(frozen=True)
class PlannerTargets:
    """What the SLA planner is asked to hold (the workload's SLOs; None: not set) and what kvtune
    predicted one replica serves at them (None: not known to the caller)."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    per_replica_goodput_req_s: float | None = None
    per_replica_is: str = "one replica"           # what "replica" is: one unit of a disaggregated pick

    def to_json(self) -> dict:
        return {"ttft_ms": self.ttft_ms, "tpot_ms": self.tpot_ms,
                "per_replica_goodput_req_s": self.per_replica_goodput_req_s, "per_replica_is": self.per_replica_is}

    @classmethod
    def from_slo(cls, slo, per_replica_goodput_req_s: float | None = None,
                 per_replica_is: str = "one replica") -> PlannerTargets:
        """From a ``costmodel.traffic.SLO`` (``inf``: no target, None here)."""
        def finite(v: float) -> float | None:
            return float(v) if math.isfinite(v) else None
        good = per_replica_goodput_req_s
        return cls(finite(slo.ttft_ms), finite(slo.tpot_ms),
                   good if good is not None and math.isfinite(good) else None, per_replica_is)


def _backend(engine: str | None) -> str:
    e = engine or "vllm"
    if e not in IMAGES:
        raise Unsupported(f"kvtune writes Dynamo workers for vLLM, SGLang and TensorRT-LLM; engine {e!r} is not one")
    return e


def worker_argv(engine: str, p: LaunchPick, role: str) -> list[str]:
    """The worker's argv: ``role`` 'serve' (aggregated), 'prefill' or 'decode'."""
    if engine == "vllm":
        argv = without_flags(vllm_argv(p, role=role)[0], ("--host", "--port"))
        out = ["python3", "-m", "dynamo.vllm", "--model", argv[2], *argv[3:]]
        if p.multi_node:
            out += ["--distributed-executor-backend", "ray"]   # the operator starts Ray on every node
        return out + (["--is-prefill-worker"] if role == "prefill" else [])
    if engine == "trtllm":
        return _trtllm_worker_argv(p, role)
    argv = without_flags(sglang_argv(p, role=role)[0], ("--host", "--port"))
    out = ["python3", "-m", "dynamo.sglang", *argv[3:]]
    if role in ("prefill", "decode"):
        out += ["--disaggregation-mode", role, "--disaggregation-transfer-backend", "nixl"]
    return out


def _trtllm_worker_argv(p: LaunchPick, role: str) -> list[str]:
    """``python3 -m dynamo.trtllm``: the engine's LLM API options kvtune writes (trtllm.py, the
    ``--extra_llm_api_options`` YAML) as ``--override-engine-args`` JSON, which the worker merges
    over its own (components/backends/trtllm/src/dynamo/trtllm/main.py), beside the worker's own
    flags for the same sizes; a disaggregated worker adds the cache transceiver of Dynamo's
    engine_configs/{prefill,decode}.yaml and its decode-first strategy (the planner's)."""
    serve_argv, api, _ = trtllm_argv(p, role=role)
    ckpt = serve_argv[1]
    api = dict(api)
    out = ["python3", "-m", "dynamo.trtllm", "--model-path", ckpt, "--served-model-name", ckpt,
           "--tensor-parallel-size", str(p.tp), "--max-batch-size", str(p.batch_cap),
           "--max-num-tokens", str(p.chunk_tokens)]
    if p.pp > 1:
        out += ["--pipeline-parallel-size", str(p.pp)]
    if p.ep > 1:
        out += ["--expert-parallel-size", str(p.ep)]
    if "max_seq_len" in api:
        out += ["--max-seq-len", str(api["max_seq_len"])]
    if role in ("prefill", "decode"):
        api["cache_transceiver_config"] = {"backend": TRTLLM_TRANSCEIVER}
    out += ["--override-engine-args", json.dumps(api, separators=(",", ":"))]
    if role in ("prefill", "decode"):
        out += ["--disaggregation-mode", role, "--disaggregation-strategy", "decode_first"]
    return out


def _worker(engine: str, ns: str, p: LaunchPick, role: str) -> dict:
    gpus = str(p.gpus_per_pod)
    svc: dict = {"dynamoNamespace": ns, "envFromSecret": HF_SECRET, "componentType": "worker",
                 "replicas": p.replicas, "resources": {"requests": {"gpu": gpus}, "limits": {"gpu": gpus}},
                 "extraPodSpec": {"mainContainer": {
                     "image": IMAGES[engine], "workingDir": _WORKDIR[engine], "command": ["/bin/sh", "-c"],
                     # one shell line, as the operator joins it behind `ray start --head &&` on a multi-node leader
                     "args": [shlex.join(worker_argv(engine, p, role))]}}}
    if p.multi_node:
        if p.gpus_per_replica % p.nodes:
            raise Unsupported(f"{p.gpus_per_replica} GPUs per replica do not split evenly over {p.nodes} nodes")
        svc["multinode"] = {"nodeCount": p.nodes}
    return svc


def dynamo_graph(name: str, engine: str | None, serve: LaunchPick | None = None,
                 prefill: LaunchPick | None = None, decode: LaunchPick | None = None) -> dict:
    """The DynamoGraphDeployment: ``serve`` for an aggregated pick, ``prefill`` + ``decode`` for a
    disaggregated one (each with ``replicas`` = its pool's replica count)."""
    e = _backend(engine)
    ns = safe_name(name)
    front = {"dynamoNamespace": ns, "componentType": "frontend", "replicas": 1,
             "extraPodSpec": {"mainContainer": {"image": IMAGES[e]}}}
    services: dict = {"Frontend": front}
    if serve is not None:
        services[WORKERS[e]["decode"]] = _worker(e, ns, serve, "serve")
    else:
        if prefill is None or decode is None:
            raise ValueError("dynamo_graph: give serve, or prefill and decode")
        if prefill.multi_node or decode.multi_node:
            raise Unsupported("kvtune writes disaggregated launch settings for single-node replicas only")
        services[WORKERS[e]["prefill"]] = _worker(e, ns, prefill, "prefill")
        services[WORKERS[e]["decode"]] = _worker(e, ns, decode, "decode")
    return {"apiVersion": API_VERSION, "kind": "DynamoGraphDeployment", "metadata": {"name": ns},
            "spec": {"backendFramework": e, "services": services}}


def planner_inputs(name: str, engine: str | None, prefill: LaunchPick, decode: LaunchPick,
                   targets: PlannerTargets | None) -> dict:
    """The SLA planner's argv and service entry for a disaggregated pick, with what they came from."""
    e = _backend(engine)
    t = targets or PlannerTargets()
    gpus = prefill.replicas * prefill.gpus_per_replica + decode.replicas * decode.gpus_per_replica
    argv = ["python3", "-m", "planner_sla", "--environment", "kubernetes", "--backend", e,
            "--adjustment-interval", str(PLANNER_INTERVAL_S), "--profile-results-dir", PLANNER_PROFILE_DIR,
            "--prefill-engine-num-gpu", str(prefill.gpus_per_replica),
            "--decode-engine-num-gpu", str(decode.gpus_per_replica), "--max-gpu-budget", str(gpus)]
    notes = ["the SLA planner interpolates the profiles of Dynamo's own profiler (benchmarks/profiler/"
             f"profile_sla.py), mounted at {PLANNER_PROFILE_DIR}: run it for this model and these TP sizes first",
             f"--max-gpu-budget is the {gpus} GPUs of the deployment kvtune sized: raise it to let the planner "
             f"grow past kvtune's answer"]
    # the planner takes seconds (planner/defaults.py SLAPlannerDefaults: ttft = 0.5, itl = 0.05)
    if t.ttft_ms is not None:
        argv += ["--ttft", f"{t.ttft_ms / 1000:g}"]
    else:
        notes.append("no TTFT SLO in the workload: the planner's default target applies")
    if t.tpot_ms is not None:
        argv += ["--itl", f"{t.tpot_ms / 1000:g}"]
    else:
        notes.append("no TPOT SLO in the workload: the planner's default ITL target applies")
    ns = safe_name(name)
    service = {"dynamoNamespace": ns, "envFromSecret": HF_SECRET, "componentType": "planner", "replicas": 1,
               "pvc": {"create": False, "name": "dynamo-pvc", "mountPoint": "/data"},
               "extraPodSpec": {"mainContainer": {"image": IMAGES[e],
                                                  "workingDir": "/workspace/components/planner/src/dynamo/planner",
                                                  "command": ["/bin/sh", "-c"], "args": [shlex.join(argv)]}}}
    return {"argv": argv, "service": service, "targets": t.to_json(),
            "kvtune_sized": {"prefill_replicas": prefill.replicas, "decode_replicas": decode.replicas,
                             "prefill_gpus_per_replica": prefill.gpus_per_replica,
                             "decode_gpus_per_replica": decode.gpus_per_replica, "gpus": gpus},
            "notes": notes}
