"""Launch settings for a disaggregated pick (x prefill replicas + y decode replicas): what kvtune
simulated in ``costmodel.deployment``, as each engine runs it.

- vLLM 0.33.0: every replica is ``vllm serve`` with ``--kv-transfer-config`` naming the
  NixlConnector (the decode replica pulls the prompt's KV blocks once the prefill finishes), and
  ``vllm-router --vllm-pd-disaggregation`` (vllm-router 0.1.17) routes each request to a prefill
  replica and then to a decode replica, round robin as kvtune's router does;
- SGLang 0.5.23: ``--disaggregation-mode prefill|decode`` with the Mooncake transfer backend
  (its default, named explicitly) and the prefill's bootstrap port, behind
  ``python -m sglang_router.launch_router --pd-disaggregation`` (sglang-router 0.3.2);
- TensorRT-LLM 1.0.0: context and generation ``trtllm-serve`` workers, each with its
  ``cache_transceiver_config`` (backend ``UCX``, ``max_tokens_in_buffer`` = the longest prompt), and
  ``trtllm-serve disaggregated -c disagg_config.yaml``;
- Kubernetes (every engine but llama.cpp): a StatefulSet per pool (stable pod names the router
  lists), their headless Services, the config files as a mounted ConfigMap (TensorRT-LLM), and the
  router (or TensorRT-LLM's disaggregated server) as a Deployment with a pinned image that already
  holds it, probes and resources, behind the Service users call.

Every flag is in ``registry.FLAGS`` (each engine's home module; the routers under their own names,
``versions.ROUTER_FLAGS``) and every TensorRT-LLM key in ``trtllm.TRTLLM_KEYS`` /
``trtllm.TRTLLM_DISAGG_KEYS``, with where it was read.
"""

from __future__ import annotations

import json

from . import kubernetes
from .pick import LaunchPick, Unsupported
from .sglang import PORT as SGLANG_PORT
from .sglang import sglang_argv
from .shell import add_argv, command, comment_block
from .trtllm import trtllm_argv
from .registry import ENGINE_VERSIONS, HOMES
from .versions import ROUTER_IMAGES, ROUTER_VERSIONS
from .vllm import vllm_argv

__all__ = ["disaggregated_launch", "ROUTER_PORT", "SGLANG_BOOTSTRAP_PORT", "VLLM_CONNECTOR", "SGLANG_BACKEND",
           "TRTLLM_BACKEND"]

ROUTER_PORT = 8000
ENGINE_PORT = 8000            # every replica serves on its own host or pod, as aggregated ones do
SGLANG_BOOTSTRAP_PORT = 8998  # sglang arg_groups/fields/disagg.py disaggregation_bootstrap_port default
VLLM_SIDE_CHANNEL_PORT = 5600  # vllm/envs.py VLLM_NIXL_SIDE_CHANNEL_PORT default
# the transfer each engine's launch uses, the one kvtune's link model stands for (RDMA over the
# node's network across nodes, NVLink/CUDA IPC within one)
VLLM_CONNECTOR = {"kv_connector": "NixlConnector", "kv_role": "kv_both"}   # vllm/config/kv_transfer.py
SGLANG_BACKEND = "mooncake"   # disagg.py disaggregation_transfer_backend (default mooncake)
# cache_transceiver_config.backend: TensorRT-LLM 1.0.0's CacheTransceiverConfig.backend is
# Optional[Literal["DEFAULT", "UCX", "NIXL", "MPI"]] (tests/contracts/tensorrt-llm-1.0.0.json, whose
# provenance says how 1.0.0's set was told from the release candidates' lower-case one); a 1.0.0rc6
# or older worker wants "ucx", and the launch notes say so
TRTLLM_BACKEND = "UCX"


def _hosts(role: str, n: int) -> list[str]:
    return [f"<{role}-{i}>" for i in range(n)]


def _pool_header(role: str, p: LaunchPick) -> str:
    return (f"{role} pool: {p.replicas} replica(s) of TP {p.tp} ({p.gpus_per_replica} GPU(s) each), batch cap "
            f"{p.batch_cap}, chunk budget {p.chunk_tokens} tokens")


def _check(prefill: LaunchPick, decode: LaunchPick) -> None:
    for role, p in (("prefill", prefill), ("decode", decode)):
        if p.multi_node:
            raise Unsupported(f"a {role} replica spans {p.nodes} nodes: kvtune emits disaggregated launch settings "
                              f"for single-node replicas only")
        if p.speculating:
            raise Unsupported("speculative decoding in a disaggregated deployment is not something kvtune simulates")


def _vllm(prefill: LaunchPick, decode: LaunchPick) -> tuple[str, list[str]]:
    kvt = json.dumps(VLLM_CONNECTOR, separators=(",", ":"))
    blocks = []
    for role, p, hosts in (("prefill", prefill, _hosts("prefill", prefill.replicas)),
                           ("decode", decode, _hosts("decode", decode.replicas))):
        argv, notes = vllm_argv(p, role=role)
        argv = argv + ["--kv-transfer-config", kvt]
        env = (f"VLLM_NIXL_SIDE_CHANNEL_HOST=<this-host-address> VLLM_NIXL_SIDE_CHANNEL_PORT={VLLM_SIDE_CHANNEL_PORT} ")
        blocks.append(comment_block([_pool_header(role, p) + f"; run on each of {', '.join(hosts)}"] + notes)
                      + "\n" + env + command(argv))
    router = vllm_router_argv([f"http://{h}:{ENGINE_PORT}" for h in _hosts("prefill", prefill.replicas)],
                              [f"http://{h}:{ENGINE_PORT}" for h in _hosts("decode", decode.replicas)])
    rv = ROUTER_VERSIONS["vllm-router"]
    blocks.append(comment_block([f"router: {rv.label} (pip install vllm-router=={rv.version}); clients call "
                                 f"http://<router-host>:{ROUTER_PORT}"]) + "\n" + command(router))
    return "\n\n".join(blocks), [f"KV transfer: {VLLM_CONNECTOR['kv_connector']}; the decode replica recomputes the "
                                 f"last prompt token for the first output token (kvtune simulated that step)"]


def _sglang_role_flags(role: str) -> list[str]:
    flags = ["--disaggregation-mode", role, "--disaggregation-transfer-backend", SGLANG_BACKEND]
    if role == "prefill":
        flags += ["--disaggregation-bootstrap-port", str(SGLANG_BOOTSTRAP_PORT)]
    return flags


def _sglang(prefill: LaunchPick, decode: LaunchPick) -> tuple[str, list[str]]:
    blocks = []
    for role, p in (("prefill", prefill), ("decode", decode)):
        argv, notes = sglang_argv(p, role=role)
        argv = argv + _sglang_role_flags(role)
        hosts = _hosts(role, p.replicas)
        blocks.append(comment_block([_pool_header(role, p) + f"; run on each of {', '.join(hosts)}"] + notes)
                      + "\n" + command(argv, head=3))
    router = sglang_router_argv(_hosts("prefill", prefill.replicas), _hosts("decode", decode.replicas))
    rv = ROUTER_VERSIONS["sglang-router"]
    blocks.append(comment_block([f"router: {rv.label} (pip install sglang-router=={rv.version}); clients call "
                                 f"http://<router-host>:{ROUTER_PORT}"]) + "\n" + command(router, head=3))
    return "\n\n".join(blocks), [f"KV transfer: {SGLANG_BACKEND}; each finished prompt chunk is sent while the next "
                                 f"computes, the first token with the last (kvtune simulated that overlap)"]


def sglang_router_argv(prefill_hosts: list[str], decode_hosts: list[str]) -> list[str]:
    argv = ["python", "-m", "sglang_router.launch_router", "--pd-disaggregation", "--policy", "round_robin"]
    for h in prefill_hosts:
        argv += ["--prefill", f"http://{h}:{SGLANG_PORT}", str(SGLANG_BOOTSTRAP_PORT)]
    for h in decode_hosts:
        argv += ["--decode", f"http://{h}:{SGLANG_PORT}"]
    return argv + ["--host", "0.0.0.0", "--port", str(ROUTER_PORT)]


def _trtllm_config(p: LaunchPick, role: str, config_dir: str = "") -> tuple[list[str], dict, list[str]]:
    path = f"{config_dir}/{role}_config.yaml" if config_dir else f"{role}_config.yaml"
    argv, api, notes = trtllm_argv(p, role="prefill" if role == "ctx" else "decode", config=path)
    api = dict(api)
    if role == "ctx":
        # the overlap scheduler is not supported on context servers (examples/disaggregated/README.md)
        api["disable_overlap_scheduler"] = True
    ct: dict[str, object] = {"backend": TRTLLM_BACKEND}
    isl = p.max_prompt_tokens or p.max_request_tokens
    if isl:
        # "set it >= the maximum ISL of all requests" (examples/disaggregated/README.md)
        ct["max_tokens_in_buffer"] = int(isl)
    else:
        notes.append("KV transfer buffer: no workload lengths given, so max_tokens_in_buffer is left at "
                     "TensorRT-LLM's default; set it to at least the longest prompt")
    api["cache_transceiver_config"] = ct
    notes.append(f"KV transfer: cache_transceiver_config.backend {TRTLLM_BACKEND!r} is TensorRT-LLM 1.0.0's "
                 f"spelling; 1.0.0rc6 and older release candidates take {TRTLLM_BACKEND.lower()!r}")
    return argv, api, notes


def trtllm_disagg_config(prefill: LaunchPick, decode: LaunchPick, pre_hosts: list[str] | None = None,
                         dec_hosts: list[str] | None = None) -> dict:
    pre_hosts = pre_hosts or _hosts("prefill", prefill.replicas)
    dec_hosts = dec_hosts or _hosts("decode", decode.replicas)
    return {"hostname": "0.0.0.0", "port": ROUTER_PORT, "backend": "pytorch",
            "context_servers": {"num_instances": prefill.replicas, "urls": [f"{h}:{ENGINE_PORT}" for h in pre_hosts]},
            "generation_servers": {"num_instances": decode.replicas,
                                   "urls": [f"{h}:{ENGINE_PORT}" for h in dec_hosts]}}


def _trtllm(prefill: LaunchPick, decode: LaunchPick) -> dict:
    out = {}
    blocks = []
    for role, name, p in (("ctx", "prefill", prefill), ("gen", "decode", decode)):
        argv, api, notes = _trtllm_config(p, role)
        out[f"{role}_config_yaml"] = kubernetes.dump_yaml([api])
        blocks.append(comment_block([_pool_header(name, p) + f" ({role}_config.yaml); run on each of "
                                     f"{', '.join(_hosts(name, p.replicas))}"] + notes) + "\n" + command(argv))
    blocks.append(comment_block(["the disaggregated server (disagg_config.yaml); clients call "
                                 f"http://<server-host>:{ROUTER_PORT}"]) + "\n" +
                  command(["trtllm-serve", "disaggregated", "-c", "disagg_config.yaml"]))
    out["command"] = "\n\n".join(blocks)
    out["disagg_config_yaml"] = kubernetes.dump_yaml([trtllm_disagg_config(prefill, decode)])
    return out


# ---- Kubernetes ------------------------------------------------------------------------------

def _stateful_set(name: str, role: str, p: LaunchPick, image: str, argv: list[str], env: list[dict],
                  config: bool = False) -> list[dict]:
    svc = f"{name}-{role}"
    label = {"app": name, "role": role}
    c = kubernetes.container("engine", image, argv, p.gpus_per_replica, p, True, config)
    c["env"] = c["env"] + env
    sts = {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": svc, "labels": label},
           "spec": {"serviceName": svc, "replicas": p.replicas, "podManagementPolicy": "Parallel",
                    "selector": {"matchLabels": label},
                    "template": {"metadata": {"labels": label},
                                 "spec": {"containers": [c], "volumes": kubernetes.volumes(name, config)}}}}
    headless = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": svc, "labels": label},
                "spec": {"clusterIP": "None", "selector": dict(label),
                         "ports": [{"name": "http", "port": ENGINE_PORT, "targetPort": "http"}]}}
    return [sts, headless]


def _pod_dns(name: str, role: str, n: int) -> list[str]:
    return [f"{name}-{role}-{i}.{name}-{role}" for i in range(n)]


def vllm_router_argv(prefill_urls: list[str], decode_urls: list[str]) -> list[str]:
    argv = ["vllm-router", "--vllm-pd-disaggregation", "--policy", "round_robin"]
    for u in prefill_urls:
        argv += ["--prefill", u]
    for u in decode_urls:
        argv += ["--decode", u]
    return argv + ["--host", "0.0.0.0", "--port", str(ROUTER_PORT)]


# the router's health endpoints (both routers: /liveness answers while the process runs,
# /readiness once its workers are healthy; routes read from the 0.1.17 / 0.3.2 wheels)
_ROUTER_HEALTH = ("/liveness", "/readiness")


def _k8s(prefill: LaunchPick, decode: LaunchPick, name: str, engine: str) -> str:
    if engine not in ("vllm", "sglang", "trtllm"):
        raise Unsupported(f"{ENGINE_VERSIONS[engine].label} has no disaggregated prefill/decode serving: "
                          f"set engine to vllm, sglang or trtllm for this pick, or deploy the aggregated one")
    version = ENGINE_VERSIONS[engine]
    docs = [kubernetes.pvc(name, prefill)]
    pod_ip = [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]
    pre, dec = _pod_dns(name, "prefill", prefill.replicas), _pod_dns(name, "decode", decode.replicas)
    config = engine == "trtllm"
    head_extra: list[str] = []
    servers: list[tuple[str, LaunchPick, list[str], list[dict]]] = []
    if config:
        files = {}
        for role, trole, p in (("prefill", "ctx", prefill), ("decode", "gen", decode)):
            argv, api, _ = _trtllm_config(p, trole, kubernetes.CONFIG_DIR)
            files[f"{trole}_config.yaml"] = kubernetes.dump_yaml([api])
            servers.append((role, p, argv, []))
        files["disagg_config.yaml"] = kubernetes.dump_yaml([trtllm_disagg_config(prefill, decode, pre, dec)])
        docs.append(kubernetes.config_map(name, files))
        head_extra.append(f"config files (ctx_config.yaml, gen_config.yaml, disagg_config.yaml): the ConfigMap "
                          f"{name}-config, mounted at {kubernetes.CONFIG_DIR}")
    else:
        for role, p in (("prefill", prefill), ("decode", decode)):
            if engine == "vllm":
                argv = vllm_argv(p, role=role)[0] + ["--kv-transfer-config",
                                                     json.dumps(VLLM_CONNECTOR, separators=(",", ":"))]
                env = pod_ip + [{"name": "VLLM_NIXL_SIDE_CHANNEL_HOST", "value": "$(POD_IP)"}]
            else:
                argv = sglang_argv(p, role=role)[0] + _sglang_role_flags(role)
                env = []
            servers.append((role, p, argv, env))
    for role, p, argv, env in servers:
        docs += _stateful_set(name, role, p, version.image, argv, env, config)
    if engine == "vllm":
        rv = ROUTER_VERSIONS["vllm-router"]
        image = ROUTER_IMAGES["vllm-router"]
        cmd = vllm_router_argv([f"http://{h}:{ENGINE_PORT}" for h in pre], [f"http://{h}:{ENGINE_PORT}" for h in dec])
        health: tuple[str, str] | None = _ROUTER_HEALTH
        head_extra.append(f"router image {image}: a dated nightly; Docker Hub keeps only the newest 14 nightly "
                          f"tags of vllm/vllm-router, so check it still pulls (docker manifest inspect) or set "
                          f"vllm/vllm-router:v{rv.version} if that release tag was published; its flags here are "
                          f"checked against {rv.label}. To run exactly {rv.label}, build FROM python:3.12-slim "
                          f"with pip install vllm-router=={rv.version} and set that image")
    elif engine == "sglang":
        # lmsysorg/sglang builds and installs sgl-router from the same source tree (docker/Dockerfile:
        # "Build and install sgl-router"): the pinned engine image already holds the router
        image = version.image
        cmd = sglang_router_argv(pre, dec)
        health = _ROUTER_HEALTH
    else:
        # trtllm-serve disaggregated is in the engine image; its server answers /health
        image = version.image
        cmd = ["trtllm-serve", "disaggregated", "-c", f"{kubernetes.CONFIG_DIR}/disagg_config.yaml"]
        health = ("/health", "/health")
    docs.append(kubernetes.router_deployment(name, image, cmd, ROUTER_PORT, health, config))
    docs.append(kubernetes.service(name, {"app": name, "role": "router"}))
    front = "trtllm-serve disaggregated server" if engine == "trtllm" else "router"
    head = [f"{version.label} disaggregated on Kubernetes: {prefill.replicas} prefill x TP {prefill.tp} + "
            f"{decode.replicas} decode x TP {decode.tp}, the {front} as a Deployment behind Service {name}",
            f"Hugging Face token: kubectl create secret generic {kubernetes.HF_SECRET['name']} "
            f"--from-literal={kubernetes.HF_SECRET['key']}=hf_..." + (" (required: gated model)" if prefill.gated else ""),
            "the KV moves pod to pod over RDMA: give the pods your cluster's RDMA devices (e.g. the NVIDIA network "
            "operator's rdma/ resources) or the transfer falls back to TCP, slower than kvtune's link model",
            *head_extra]
    return comment_block(head) + "\n" + kubernetes.dump_yaml(docs)


def disaggregated_launch(prefill: LaunchPick, decode: LaunchPick, name: str = "kvtune-llm",
                         engine: str | None = None) -> dict:
    """Every engine's disaggregated settings for ``prefill`` and ``decode`` (each a ``LaunchPick``
    with ``replicas`` = that pool's replica count); the Kubernetes manifest runs ``engine``
    (default vLLM). An engine that cannot run the pick gets the reason in ``unsupported``."""
    safe = "".join(c if c.isalnum() else "-" for c in name.lower()).strip("-")[:40].strip("-") or "kvtune-llm"
    out: dict = {"versions": {**{e: ENGINE_VERSIONS[e].to_json() for e in ("vllm", "sglang", "trtllm")},
                              **{r: v.to_json() for r, v in ROUTER_VERSIONS.items()}},
                 "unsupported": {}, "notes": {},
                 # each pool's memory plan (the pool its --max-model-len is checked against)
                 "memory": {role: None if p.memory is None else p.memory.to_json()
                            for role, p in (("prefill", prefill), ("decode", decode))}}
    try:
        _check(prefill, decode)
    except Unsupported as exc:
        for e in ("vllm", "sglang", "trtllm", "k8s"):
            out["unsupported"][e] = str(exc)
            out[e] = f"# disaggregated launch: {exc}"
        return add_argv(out, HOMES)
    for e, fn in (("vllm", _vllm), ("sglang", _sglang)):
        try:
            text, notes = fn(prefill, decode)
            out[e] = comment_block([f"{ENGINE_VERSIONS[e].label} disaggregated (image {ENGINE_VERSIONS[e].image})"]) \
                + "\n" + text
            out["notes"][e] = notes
        except Unsupported as exc:
            out[e] = f"# {ENGINE_VERSIONS[e].label} cannot run this pick disaggregated: {exc}"
            out["unsupported"][e] = str(exc)
    try:
        out["trtllm"] = _trtllm(prefill, decode)
    except Unsupported as exc:
        out["trtllm"] = {"command": f"# {ENGINE_VERSIONS['trtllm'].label} cannot run this pick disaggregated: {exc}"}
        out["unsupported"]["trtllm"] = str(exc)
    k8s_engine = engine if engine is not None and engine in ENGINE_VERSIONS else "vllm"
    out["k8s_engine"] = k8s_engine
    try:
        out["k8s"] = _k8s(prefill, decode, safe, k8s_engine)
    except Unsupported as exc:
        out["k8s"] = f"# disaggregated Kubernetes manifest: {exc}"
        out["unsupported"]["k8s"] = str(exc)
    return add_argv(out, HOMES)
