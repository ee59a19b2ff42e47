"""Kubernetes manifests for one recommendation: plain YAML (no anchors), a model-cache volume,
the Hugging Face token from a Secret, health probes, a Service, and the engine's pinned image.

A replica that fits one node is a pod of ``tp x pp`` GPUs and the replicas are a Deployment's
``replicas``; a replica spanning several nodes is one LeaderWorkerSet group (kubernetes-sigs/lws
v0.10.0, leaderworkerset.x-k8s.io/v1): a leader pod serving HTTP and ``nodes - 1`` worker pods,
started with the engine's multi-node flags from the ``LWS_LEADER_ADDRESS``, ``LWS_GROUP_SIZE`` and
``LWS_WORKER_INDEX`` variables LWS sets (api/leaderworkerset/v1/leaderworkerset_types.go).
"""

from __future__ import annotations

import math

import yaml

from .pick import LaunchPick, Unsupported
from .versions import EngineVersion

__all__ = ["manifest", "dump_yaml", "container", "volumes", "pvc", "service", "config_map", "router_deployment",
           "HF_SECRET", "HF_CACHE", "CONFIG_DIR", "ROUTER_RESOURCES"]

HF_SECRET = {"name": "hf-token", "key": "token"}
HF_CACHE = "/root/.cache/huggingface"
PORT = 8000
# where an engine's config files (a ConfigMap) are mounted: TensorRT-LLM's --extra_llm_api_options
# YAML, the disaggregated server's YAML
CONFIG_DIR = "/etc/kvtune"
# a router holds no model: a few cores and a little memory (requests so it schedules, limits so a
# runaway cannot starve the node)
ROUTER_RESOURCES = {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "4", "memory": "4Gi"}}
_LWS_API = "leaderworkerset.x-k8s.io/v1"


class _PlainDumper(yaml.SafeDumper):
    """SafeDumper that writes repeated objects out in full instead of ``&id001`` anchors."""

    def ignore_aliases(self, data) -> bool:
        return True


def _str(dumper: yaml.SafeDumper, data: str):
    # a file's text (a ConfigMap entry) as a literal block, readable and diffable as the file itself
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style="|" if "\n" in data else None)


_PlainDumper.add_representer(str, _str)


def dump_yaml(docs: list[dict]) -> str:
    return yaml.dump_all(docs, Dumper=_PlainDumper, sort_keys=False, default_flow_style=False)


def _probes() -> dict:
    get = {"path": "/health", "port": "http"}
    return {
        # loading (download + weights + graph capture) may take long: up to 60 min before liveness applies
        "startupProbe": {"httpGet": dict(get), "periodSeconds": 10, "failureThreshold": 360},
        "readinessProbe": {"httpGet": dict(get), "periodSeconds": 10, "failureThreshold": 3},
        "livenessProbe": {"httpGet": dict(get), "periodSeconds": 30, "failureThreshold": 5, "timeoutSeconds": 10},
    }


def container(name: str, image: str, argv: list[str], gpus: int, p: LaunchPick, serve: bool,
              config: bool = False) -> dict:
    """An engine container; ``config``: mount the ConfigMap of config files at ``CONFIG_DIR``."""
    c: dict = {"name": name, "image": image, "command": list(argv),
         "env": [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {**HF_SECRET, "optional": not p.gated}}},
                 {"name": "HF_HOME", "value": HF_CACHE}],
         "resources": {"limits": {"nvidia.com/gpu": gpus}, "requests": {"nvidia.com/gpu": gpus}},
         "volumeMounts": [{"name": "hf-cache", "mountPath": HF_CACHE}, {"name": "shm", "mountPath": "/dev/shm"}]}
    if config:
        c["volumeMounts"].append({"name": "config", "mountPath": CONFIG_DIR, "readOnly": True})
    if serve:
        c["ports"] = [{"name": "http", "containerPort": PORT}]
        c |= _probes()
    return c


def volumes(name: str, config: bool = False) -> list[dict]:
    out = [{"name": "hf-cache", "persistentVolumeClaim": {"claimName": f"{name}-hf-cache"}},
           {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}}]
    if config:
        out.append({"name": "config", "configMap": {"name": f"{name}-config"}})
    return out


def config_map(name: str, files: dict[str, str]) -> dict:
    """The ConfigMap ``{name}-config`` holding ``files`` (file name -> text), mounted at CONFIG_DIR."""
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"{name}-config", "labels": {"app": name}},
            "data": dict(files)}


def router_deployment(name: str, image: str, argv: list[str], port: int, health: tuple[str, str] | None,
                      config: bool = False) -> dict:
    """A model-less front (router, disaggregated server) as a Deployment: pinned image, probes
    (``health``: liveness and readiness paths), CPU and memory requests and limits."""
    label = {"app": name, "role": "router"}
    c: dict = {"name": "router", "image": image, "command": list(argv),
               "ports": [{"name": "http", "containerPort": port}], "resources": ROUTER_RESOURCES}
    if health is not None:
        live, ready = health
        c["livenessProbe"] = {"httpGet": {"path": live, "port": "http"}, "periodSeconds": 10, "failureThreshold": 3}
        c["readinessProbe"] = {"httpGet": {"path": ready, "port": "http"}, "periodSeconds": 10, "failureThreshold": 3}
    spec: dict = {"containers": [c]}
    if config:
        c["volumeMounts"] = [{"name": "config", "mountPath": CONFIG_DIR, "readOnly": True}]
        spec["volumes"] = [{"name": "config", "configMap": {"name": f"{name}-config"}}]
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": f"{name}-router", "labels": label},
            "spec": {"replicas": 1, "selector": {"matchLabels": label},
                     "template": {"metadata": {"labels": label}, "spec": spec}}}


def pvc(name: str, p: LaunchPick) -> dict:
    # room for the checkpoint kvtune planned (its weight bytes) plus a fifth, at least 20 GiB
    size_gib = 100 if p.memory is None else max(20, math.ceil(p.memory.weight_bytes_total * 1.2 / 2**30))
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": f"{name}-hf-cache"},
            "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": f"{size_gib}Gi"}}}}


def service(name: str, selector: dict) -> dict:
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "labels": {"app": name}},
            "spec": {"selector": dict(selector), "ports": [{"name": "http", "port": 80, "targetPort": "http"}]}}


def manifest(p: LaunchPick, name: str, version: EngineVersion, argv_for,
             config_files: dict[str, str] | None = None) -> str:
    """``argv_for(node_rank, leader_addr, nnodes)``: the engine's argv (multi-node form when
    ``node_rank`` is given); ``config_files``: files the argv names under ``CONFIG_DIR`` (a
    ConfigMap mounted there)."""
    if not version.image:
        raise Unsupported(f"{version.label} has no published container image: build one and put it in the manifest")
    label = {"app": name}
    cfg = bool(config_files)
    head = [pvc(name, p)] + ([config_map(name, config_files or {})] if cfg else [])
    if not p.multi_node:
        pod = {"containers": [container("engine", version.image, argv_for(None, None, None), p.gpus_per_replica,
                                         p, True, cfg)], "volumes": volumes(name, cfg)}
        work = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "labels": label},
                "spec": {"replicas": p.replicas, "selector": {"matchLabels": label},
                         "template": {"metadata": {"labels": label}, "spec": pod}}}
        return dump_yaml(head + [work, service(name, label)])
    if p.gpus_per_replica % p.nodes:
        raise Unsupported(f"{p.gpus_per_replica} GPUs per replica do not split evenly over {p.nodes} nodes")
    leader_label = {"app": name, "role": "leader"}
    addr, size = "$(LWS_LEADER_ADDRESS)", "$(LWS_GROUP_SIZE)"
    leader = {"metadata": {"labels": leader_label},
              "spec": {"containers": [container("leader", version.image, argv_for("0", addr, size),
                                                 p.gpus_per_pod, p, True, cfg)], "volumes": volumes(name, cfg)}}
    worker = {"metadata": {"labels": {"app": name, "role": "worker"}},
              "spec": {"containers": [container("worker", version.image, argv_for("$(LWS_WORKER_INDEX)", addr, size),
                                                 p.gpus_per_pod, p, False, cfg)], "volumes": volumes(name, cfg)}}
    # the LWS controller creates a headless Service named as the LeaderWorkerSet (pod DNS, the
    # LWS_LEADER_ADDRESS it sets) unless one of that name exists: ours, the one clients call,
    # must not take that name, or leader DNS depends on which was applied first
    lws = {"apiVersion": _LWS_API, "kind": "LeaderWorkerSet", "metadata": {"name": lws_name(name), "labels": label},
           "spec": {"replicas": p.replicas,
                    "leaderWorkerTemplate": {"size": p.nodes, "restartPolicy": "RecreateGroupOnPodRestart",
                                             "leaderTemplate": leader, "workerTemplate": worker}}}
    return dump_yaml(head + [lws, service(name, leader_label)])


# A StatefulSet's pods carry the label controller-revision-hash = "<statefulset>-<10-character hash>", at
# most 63 characters, so a StatefulSet named over 52 characters creates no pod (kubernetes/kubernetes#64023).
# The LWS controller names its leader StatefulSet as the LeaderWorkerSet and each group's worker StatefulSet
# "<leaderworkerset>-<group index>": 44 characters leave room for a 7-digit group index.
LWS_NAME_MAX = 44


def lws_name(name: str) -> str:
    """The LeaderWorkerSet's name (and its controller's headless Service's), at most ``LWS_NAME_MAX``
    characters: never the name of the Service kvtune emits for clients."""
    base = name[:LWS_NAME_MAX - len("-lws")].rstrip("-")
    out = f"{base}-lws"
    return out if out != name else f"{base}-set"
