"""Every emitted launch artefact, for every kind of pick, checked against the engines' own
definitions (tests/contracts/, read from the engines' published archives by
bench/refresh_engine_contracts.py) and the Kubernetes API schemas (kubernetes-validate, offline),
plus what makes a manifest come up: mounted config files, Service names apart from the
LeaderWorkerSet's, probes and resources, pinned images, no installs at start-up, and vLLM's
start-up check of ``--max-model-len`` against the KV pool.

The default suite builds the picks directly (aggregated, disaggregated for each engine, multi-node,
another GPU, speculative methods, FP8); the slow one solves the shipped examples and checks what
``kvtune solve --json`` wrote."""

from __future__ import annotations

import itertools
import shlex

import kubernetes_validate
import pytest
import yaml

from engine_contracts import (check_argv, check_trtllm_api, contract, flag_value, trtllm_startup_errors,
                              vllm_startup_errors)
from example_solves import solve_example
from helpers import nested_keys
from kvtune.costmodel import get_gpu, get_model
from kvtune.optimizer.launch import (SPEC_METHODS, TRTLLM_DISAGG_KEYS, argv_of, build_pick,
                                     disaggregated_launch, launch_settings)
from kvtune.optimizer.launch.kubernetes import CONFIG_DIR

H100, H200 = get_gpu("h100-sxm"), get_gpu("h200")
L8, L70, L405, DSV3, QMOE = (get_model(n) for n in ("llama-3.1-8b", "llama-3.1-70b", "llama-3.1-405b",
                                                     "deepseek-v3", "qwen3-30b-a3b"))
K8S_VERSION = "1.33"
LENGTHS = {"max_request_tokens": 9200, "max_prompt_tokens": 8000}   # the rag example's longest


# ---- the picks: every kind ---------------------------------------------------------------------

def _agg(arch, cfg, spec=None, weights="bf16", engine=None, gpu=H100, replicas=2, **kw):
    return launch_settings(arch.hf_id, cfg, replicas, 0.9, spec, name=f"kvtune-{arch.name}", arch=arch, gpu=gpu,
                           weights=weights, activation_reserve_bytes=2e9, engine=engine, **{**LENGTHS, **kw})


def _pool(arch, tp, cap, chunk, replicas, kv="bf16", weights="bf16", **kw):
    # activation reserve 0: the shipped H100 calibration's (profiles/calibrations/h100-sxm.yaml), with
    # which the rag example's TP2 prefill pool holds 8,827 tokens
    return build_pick(arch.hf_id, {"tp": tp, "batch_cap": cap, "kv_dtype": kv, "spec_k": 0, "chunk_tokens": chunk},
                      replicas, 0.9, None, arch=arch, gpu=H100, weights=weights, activation_reserve_bytes=0.0,
                      **{**LENGTHS, **kw})


BASE = {"tp": 1, "batch_cap": 64, "kv_dtype": "bf16", "spec_k": 0, "chunk_tokens": 4096}
AGGREGATED = {
    "chat-8b": (L8, BASE, None, "bf16", None, H100),
    "fp8-weights-fp8-kv-70b": (L70, dict(BASE, tp=2, kv_dtype="fp8"), None, "fp8", None, H100),
    "gpu-choice-h200-70b": (L70, dict(BASE, tp=4), None, "bf16", "sglang", H200),
    "multinode-405b-vllm": (L405, dict(BASE, tp=16), None, "bf16", "vllm", H100),
    "multinode-405b-sglang": (L405, dict(BASE, tp=16), None, "bf16", "sglang", H100),
    "moe-dp-attention": (QMOE, dict(BASE, tp=4, ep=4, dp_attention=True), None, "bf16", "trtllm", H100),
    "trtllm-k8s-70b": (L70, dict(BASE, tp=4), None, "bf16", "trtllm", H100),
    **{f"spec-{m}": (DSV3 if m == "mtp" else L8, dict(BASE, tp=8 if m == "mtp" else 1, spec_k=3),
                     {"method": m, "draft_model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"}, "bf16",
                     "sglang" if m == "ngram" else None, H100) for m in SPEC_METHODS},
}
PRE, DEC = _pool(L70, 2, 16, 8192, 3), _pool(L70, 4, 64, 8192, 1)
DISAGGREGATED = {f"disagg-70b-{e}": (PRE, DEC, e) for e in ("vllm", "sglang", "trtllm", "llamacpp")}
DISAGGREGATED["disagg-8b-fp8kv"] = (_pool(L8, 1, 16, 4096, 1, kv="fp8"), _pool(L8, 1, 256, 8192, 2, kv="fp8"), None)


# ---- checks ------------------------------------------------------------------------------------

def _engine_of(argv: list[str]) -> str | None:
    for engine, prefix in (("vllm", "vllm serve"), ("sglang", "python -m sglang.launch_server"),
                           ("vllm-router", "vllm-router"), ("sglang-router", "python -m sglang_router.launch_router"),
                           ("llamacpp", "llama-server"), ("trtllm-disagg", "trtllm-serve disaggregated"),
                           ("trtllm", "trtllm-serve")):
        if " ".join(argv).startswith(prefix):
            return engine
    return None


def command_errors(argv: list[str], pool_tokens_per_gpu: int | None = None) -> list[str]:
    engine = _engine_of(argv)
    if engine is None:
        return [f"unknown program {argv[:3]}"]
    errors = check_argv(engine, argv)
    if engine == "vllm":
        errors += vllm_startup_errors(argv, pool_tokens_per_gpu)
    return errors


def trtllm_yaml_errors(text: str, keys=None) -> list[str]:
    """An ``--extra_llm_api_options`` YAML against TensorRT-LLM 1.0.0's own classes
    (tests/contracts/tensorrt-llm-1.0.0.json); with ``keys`` (the disaggregated server's YAML, which
    ``trtllm-serve disaggregated -c`` parses in llmapi/disagg_utils.py, not in the contract) its
    keys against that table. A disaggregated worker must also size its transfer buffer
    (``max_tokens_in_buffer``), as docs/launch.md promises."""
    api = yaml.safe_load(text)
    if keys is not None:
        return [f"{k}: not a disaggregated-server key kvtune has read" for k in nested_keys(api) if k not in keys]
    errors = check_trtllm_api(api)
    ct = api.get("cache_transceiver_config") if isinstance(api, dict) else None
    if ct is not None and not isinstance(ct.get("max_tokens_in_buffer"), int):
        errors.append("cache_transceiver_config.max_tokens_in_buffer not set")
    return errors


def _templates(doc: dict) -> list[dict]:
    """Pod templates of a workload (a LeaderWorkerSet has two)."""
    if doc["kind"] == "LeaderWorkerSet":
        lwt = doc["spec"]["leaderWorkerTemplate"]
        return [lwt["leaderTemplate"], lwt["workerTemplate"]]
    if doc["kind"] in ("Deployment", "StatefulSet"):
        return [doc["spec"]["template"]]
    return []


def manifest_errors(text: str, pools: dict[str, int | None] | None = None) -> list[str]:
    """Everything that keeps the manifest from coming up: schema (strict), commands against the
    engines' definitions, config files named but not mounted, a Service named as the LWS (whose
    controller then skips its own headless Service), unpinned images, installs at start-up, missing
    probes or resources, Services selecting no pod."""
    assert "&id" not in text and "*id" not in text
    docs = [d for d in yaml.safe_load_all(text) if d]
    errors: list[str] = []
    config_maps = {d["metadata"]["name"]: d.get("data", {}) for d in docs if d["kind"] == "ConfigMap"}
    lws_names = {d["metadata"]["name"] for d in docs if d["kind"] == "LeaderWorkerSet"}
    services = [d for d in docs if d["kind"] == "Service"]
    for d in docs:
        if d["kind"] == "LeaderWorkerSet":
            assert set(d["spec"]) == {"replicas", "leaderWorkerTemplate"}, d["spec"].keys()
            for t in _templates(d):
                kubernetes_validate.validate({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"},
                                              "template": t}, K8S_VERSION, strict=True)
        else:
            kubernetes_validate.validate(d, K8S_VERSION, strict=True)
    for s in services:
        if s["metadata"]["name"] in lws_names:
            errors.append(f"Service {s['metadata']['name']} has the LeaderWorkerSet's name")
        sel = s["spec"]["selector"]
        if not any(sel.items() <= t["metadata"]["labels"].items() for d in docs for t in _templates(d)):
            errors.append(f"Service {s['metadata']['name']} selects no pod ({sel})")
    for d in docs:
        for t in _templates(d):
            vols = {v["name"]: v for v in t["spec"].get("volumes", [])}
            for c in t["spec"]["containers"]:
                where = f"{d['kind']} {d['metadata']['name']} container {c['name']}"
                image = c["image"]
                tag = image.rsplit(":", 1)[1] if ":" in image.split("/")[-1] else ""
                if tag in ("", "latest", "nightly"):
                    errors.append(f"{where}: image {image} is not pinned")
                line = " ".join(c.get("command", []) + c.get("args", []))
                if "pip install" in line or "apt-get" in line:
                    errors.append(f"{where}: installs at start-up")
                res = c.get("resources", {})
                if not res.get("requests") or not res.get("limits"):
                    errors.append(f"{where}: no resource requests and limits")
                if c.get("ports") and not (c.get("readinessProbe") and c.get("livenessProbe")):
                    errors.append(f"{where}: serves without readiness and liveness probes")
                mounts = {m["mountPath"]: m["name"] for m in c.get("volumeMounts", [])}
                for tok in c.get("command", []):
                    if tok.startswith(CONFIG_DIR + "/"):
                        vol = vols.get(mounts.get(CONFIG_DIR, ""), {})
                        cm = vol.get("configMap", {}).get("name")
                        fname = tok[len(CONFIG_DIR) + 1:]
                        if cm is None or fname not in config_maps.get(cm, {}):
                            errors.append(f"{where}: {tok} is not a mounted ConfigMap file")
                        elif fname.endswith(".yaml"):
                            keys = TRTLLM_DISAGG_KEYS if fname.startswith("disagg") else None
                            text = config_maps[cm][fname]
                            errors += [f"{where}: {fname}: {e}" for e in trtllm_yaml_errors(text, keys)]
                            if keys is None:
                                errors += [f"{where}: {fname}: {e}" for e in trtllm_startup_errors(
                                    c["command"], yaml.safe_load(text),
                                    disaggregated=fname in ("ctx_config.yaml", "gen_config.yaml"))]
                role = t["metadata"]["labels"].get("role", "")
                errors += [f"{where}: {e}" for e in command_errors(c["command"], (pools or {}).get(role))]
    return errors


def _blocks(text: str) -> list[list[str]]:
    """Each command of a multi-command text as argv (comment lines and env prefixes dropped)."""
    out = []
    for block in text.split("\n\n"):
        body = "\n".join(ln for ln in block.splitlines() if not ln.startswith("#"))
        argv = shlex.split(body.replace("\\\n", " "))
        while argv and "=" in argv[0] and not argv[0].startswith("-"):
            argv = argv[1:]
        if argv:
            out.append(argv)
    return out


def aggregated_errors(r: dict) -> list[str]:
    errors = []
    pool = (r.get("memory") or {}).get("kv_pool_tokens_per_gpu")
    for e in ("vllm", "sglang", "llamacpp"):
        if e not in r["unsupported"]:
            argv = argv_of(r[e])
            if "--node-rank" in argv:   # the leader's form; workers are checked in the manifest
                pass
            errors += [f"{e}: {x}" for x in command_errors(argv, pool)]
    if "trtllm" not in r["unsupported"]:
        errors += [f"trtllm: {x}" for x in command_errors(argv_of(r["trtllm"]["command"]))]
        errors += [f"trtllm config.yaml: {x}" for x in trtllm_yaml_errors(r["trtllm"]["config_yaml"])]
        errors += [f"trtllm start-up: {x}" for x in trtllm_startup_errors(argv_of(r["trtllm"]["command"]),
                                                                           yaml.safe_load(r["trtllm"]["config_yaml"]))]
    if "k8s" not in r["unsupported"]:
        role_pool = {"": pool, "leader": pool, "worker": pool}
        errors += [f"k8s: {x}" for x in manifest_errors(r["k8s"], role_pool)]
    return errors


def disaggregated_errors(r: dict) -> list[str]:
    errors = []
    mem = r.get("memory") or {}
    pools = {role: (m or {}).get("kv_pool_tokens_per_gpu") for role, m in mem.items()}
    for e in ("vllm", "sglang"):
        if e in r["unsupported"]:
            continue
        *servers, router = _blocks(r[e])
        for role, argv in zip(("prefill", "decode"), servers):
            errors += [f"{e} {role}: {x}" for x in command_errors(argv, pools.get(role))]
        errors += [f"{e} router: {x}" for x in command_errors(router)]
    if "trtllm" not in r["unsupported"]:
        t = r["trtllm"]
        yamls = {"ctx_config.yaml": t["ctx_config_yaml"], "gen_config.yaml": t["gen_config_yaml"]}
        for argv in _blocks(t["command"]):
            errors += [f"trtllm: {x}" for x in command_errors(argv)]
            cfg = flag_value(argv, "--extra_llm_api_options")
            if cfg is not None:
                errors += [f"trtllm start-up ({cfg}): {x}"
                           for x in trtllm_startup_errors(argv, yaml.safe_load(yamls[cfg]), disaggregated=True)]
        errors += [f"trtllm ctx: {x}" for x in trtllm_yaml_errors(t["ctx_config_yaml"])]
        errors += [f"trtllm gen: {x}" for x in trtllm_yaml_errors(t["gen_config_yaml"])]
        errors += [f"trtllm disagg: {x}" for x in trtllm_yaml_errors(t["disagg_config_yaml"], TRTLLM_DISAGG_KEYS)]
    if "k8s" not in r["unsupported"]:
        errors += [f"k8s: {x}" for x in manifest_errors(r["k8s"], pools)]
    return errors


# ---- the default suite: built picks ------------------------------------------------------------

@pytest.mark.parametrize("kind", sorted(AGGREGATED))
def test_every_aggregated_artefact_is_what_the_engines_accept(kind):
    arch, cfg, spec, weights, engine, gpu = AGGREGATED[kind]
    r = _agg(arch, cfg, spec, weights, engine, gpu)
    assert aggregated_errors(r) == []
    checked = {e for e in ("vllm", "sglang", "llamacpp", "trtllm", "k8s") if e not in r["unsupported"]}
    assert {"vllm", "k8s"} <= checked or kind.startswith(("spec-medusa", "moe")), (kind, r["unsupported"])


@pytest.mark.parametrize("kind", sorted(DISAGGREGATED))
def test_every_disaggregated_artefact_is_what_the_engines_accept(kind):
    pre, dec, engine = DISAGGREGATED[kind]
    r = disaggregated_launch(pre, dec, "kvtune-x", engine=engine)
    assert all(r["memory"][role] for role in ("prefill", "decode"))   # the start-up check had a pool to check
    assert disaggregated_errors(r) == []
    if engine == "llamacpp":
        assert "no disaggregated prefill/decode serving" in r["unsupported"]["k8s"]
    else:
        assert "k8s" not in r["unsupported"] and r["k8s_engine"] == (engine or "vllm")


def test_the_rag_prefill_pool_gets_a_max_model_len_it_can_hold():
    """Issue 23: the rag example's prefill pool (TP2 70B bf16, 8,827 tokens) had no
    --max-model-len, so vLLM checked the pool against Llama 3.1's 131,072-token context and refused
    to start. Now: the longest prompt + its first token, which the pool holds."""
    pre = _pool(L70, 2, 16, 8192, 3)
    assert pre.memory.kv_pool_tokens_per_gpu == 8_827   # too small for the longest prompt + output (9,200)
    r = disaggregated_launch(pre, DEC, "kvtune-x")
    prefill, decode, _ = _blocks(r["vllm"])
    assert flag_value(prefill, "--max-model-len") == "8001" and flag_value(decode, "--max-model-len") == "9200"
    assert vllm_startup_errors(prefill, pre.memory.kv_pool_tokens_per_gpu) == []
    # the check the test encodes is vLLM's: the model's own context would not pass
    assert vllm_startup_errors(["--max-model-len", str(L70.max_context_tokens)], pre.memory.kv_pool_tokens_per_gpu)
    # SGLang and TensorRT-LLM get the same sizing
    assert flag_value(_blocks(r["sglang"])[0], "--context-length") == str(8000 + 6)
    assert yaml.safe_load(r["trtllm"]["ctx_config_yaml"])["max_seq_len"] == 8001


def test_a_pool_smaller_than_the_longest_request_gets_what_it_holds_and_says_so():
    pick = _pool(L70, 2, 16, 8192, 1)
    holds = (pick.memory.kv_pool_tokens_per_gpu // 16 - 1) * 16
    r = launch_settings(L70.hf_id, {"tp": 2, "batch_cap": 16, "kv_dtype": "bf16", "spec_k": 0, "chunk_tokens": 8192},
                        1, 0.9, None, arch=L70, gpu=H100, activation_reserve_bytes=0.0, **LENGTHS)
    argv = argv_of(r["vllm"])
    assert flag_value(argv, "--max-model-len") == str(holds) and "refuses longer requests" in r["vllm"]
    assert vllm_startup_errors(argv, pick.memory.kv_pool_tokens_per_gpu) == []


def test_trtllm_manifests_mount_the_config_they_name():
    for r in (_agg(L70, dict(BASE, tp=4), engine="trtllm"), disaggregated_launch(PRE, DEC, "kvtune-x", "trtllm")):
        docs = [d for d in yaml.safe_load_all(r["k8s"]) if d]
        cm = [d for d in docs if d["kind"] == "ConfigMap"]
        assert len(cm) == 1 and cm[0]["data"]
        named = [t for d in docs for tpl in _templates(d) for c in tpl["spec"]["containers"] for t in c["command"]
                 if t.startswith(CONFIG_DIR)]
        assert named and all(t[len(CONFIG_DIR) + 1:] in cm[0]["data"] for t in named)
    d = [d for d in yaml.safe_load_all(disaggregated_launch(PRE, DEC, "x", "trtllm")["k8s"]) if d]
    server = [x for x in d if x["kind"] == "Deployment"][0]["spec"]["template"]["spec"]["containers"][0]
    assert server["command"][:2] == ["trtllm-serve", "disaggregated"]
    disagg = yaml.safe_load([x for x in d if x["kind"] == "ConfigMap"][0]["data"]["disagg_config.yaml"])
    assert disagg["context_servers"]["urls"] == [f"x-prefill-{i}.x-prefill:8000" for i in range(3)]


def test_a_leaderworkerset_never_shares_its_name_with_our_service():
    r = _agg(L405, dict(BASE, tp=16), engine="vllm")
    docs = [d for d in yaml.safe_load_all(r["k8s"]) if d]
    lws = [d for d in docs if d["kind"] == "LeaderWorkerSet"][0]["metadata"]["name"]
    svc = [d for d in docs if d["kind"] == "Service"][0]["metadata"]["name"]
    assert lws != svc and svc == "kvtune-llama-3-1-405b"


@pytest.mark.parametrize("engine,image", [("vllm", "vllm/vllm-router:nightly-"), ("sglang", "lmsysorg/sglang:v0.5.23")])
def test_routers_run_from_a_pinned_image_with_probes_and_resources(engine, image):
    docs = [d for d in yaml.safe_load_all(disaggregated_launch(PRE, DEC, "x", engine)["k8s"]) if d]
    c = [d for d in docs if d["kind"] == "Deployment"][0]["spec"]["template"]["spec"]["containers"][0]
    assert c["image"].startswith(image) and c["command"][0] != "sh"
    assert c["livenessProbe"]["httpGet"]["path"] == "/liveness" and c["readinessProbe"]["httpGet"]["path"] == "/readiness"
    assert c["resources"]["requests"] and c["resources"]["limits"]


def test_the_checks_catch_what_issue_23_found():
    """The checks themselves: each defect of issue 23 makes them fail."""
    assert check_argv("vllm", ["vllm", "serve", "m", "--max-num-seqs", "x"])           # type
    assert check_argv("vllm", ["vllm", "serve", "m", "--kv-cache-dtype", "fp4"])       # choices
    assert check_argv("vllm", ["vllm", "serve", "m", "--no-such-flag"])                # existence
    assert check_argv("vllm", ["vllm", "serve", "m", "--speculative-config", '{"method": "medusa"}'])
    assert check_argv("sglang", ["python", "-m", "sglang.launch_server", "--disaggregation-mode", "both"])
    assert check_argv("vllm-router", ["vllm-router", "--policy", "least_loaded"])
    assert check_argv("llamacpp", ["llama-server", "-c", "many"])
    assert vllm_startup_errors(["vllm", "serve", "m"], 8827)                            # no --max-model-len
    assert vllm_startup_errors(["--max-model-len", "8816"], 8827)                       # one block too many
    assert not vllm_startup_errors(["--max-model-len", "8800"], 8827)
    assert trtllm_yaml_errors("cache_transceiver_config: {backend: ucx, max_tokens_in_buffer: 8000}")  # rc case
    assert not trtllm_yaml_errors("cache_transceiver_config: {backend: UCX, max_tokens_in_buffer: 8000}")
    assert trtllm_yaml_errors("cache_transceiver_config: {backend: UCX}")               # no max_tokens_in_buffer
    assert check_argv("trtllm", ["trtllm-serve", "m", "--tensor_parallel_size", "2"])   # not a trtllm-serve option
    assert check_argv("trtllm", ["trtllm-serve", "m", "--backend", "vllm"])            # ChoiceWithAlias set
    assert check_argv("trtllm-disagg", ["trtllm-serve", "disaggregated", "-c", "x", "--tp_size", "2"])
    assert trtllm_yaml_errors("kv_cache_config: {free_gpu_memory_fraction: 0.8, max_kv_tokens: 9}")  # no such field
    assert trtllm_yaml_errors("kv_cache_config: {max_tokens: 8.5}")                    # not an int
    assert trtllm_yaml_errors("speculative_config: {decoding_type: Eagle3, max_draft_len: 3}")  # 1.0 has no Eagle3 key
    assert trtllm_yaml_errors("speculative_config: {decoding_type: MTP, speculative_model: x}")  # later releases' name
    assert trtllm_yaml_errors("enable_chunked_prefill: yes please")                    # not a bool
    bad = ("apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: r}\nspec:\n  selector: {matchLabels: {a: b}}\n"
           "  template:\n    metadata: {labels: {a: b}}\n    spec:\n      containers:\n      - name: r\n"
           "        image: python:3.12-slim\n        command: [sh, -c, pip install vllm-router && vllm-router]\n"
           "        ports: [{name: http, containerPort: 8000}]\n")
    errs = manifest_errors(bad)
    assert any("installs at start-up" in e for e in errs) and any("probes" in e for e in errs)
    assert any("resource" in e for e in errs)


def test_the_trtllm_contract_names_the_files_it_was_read_from():
    """TensorRT-LLM 1.0.0 has no archive on PyPI: its contract names each file read (sha256 of the
    extract, the index file id and, where the index gives it, the upstream commit) and the commit
    the v1.0.0 tag points at, and holds the 1.0 names kvtune relies on."""
    c = contract("trtllm")
    assert c["version"] == "1.0.0" and set(c["programs"]) == {"trtllm-serve", "trtllm-serve disaggregated"}
    files = c["source"]["files_sha256"]
    assert len(files) == 2 and all(len(h) == 64 for h in files.values())
    prov = c["source"]["provenance"]
    assert prov["tag_commit"].startswith("ae8270b7")
    assert prov["files"]["tensorrt_llm/commands/serve.py"]["commit"].startswith("4c05a748")
    # 1.0.0's backend literals: upper case, taken from the later revision as the provenance records
    assert c["configs"]["CacheTransceiverConfig"]["backend"]["choices"] == ["DEFAULT", "UCX", "NIXL", "MPI"]
    assert prov["literal_sets_from_bracket"] == ["CacheTransceiverConfig.backend"]
    assert {"speculative_model_dir", "max_draft_len"} <= set(c["configs"]["EagleDecodingConfig"])
    assert c["decoding_types"]["DraftTarget"] == "DraftTargetDecodingConfig"
    # the later revision bracketing 1.0.0: upper-case literals, the same keys kvtune writes
    later = c["bracket"]["configs"]
    assert later["CacheTransceiverConfig"]["backend"]["choices"] == ["DEFAULT", "UCX", "NIXL", "MPI"]
    assert len(c["bracket"]["files_sha256"]) == 1


TRTLLM_KINDS = ("chat-8b", "fp8-weights-fp8-kv-70b", "gpu-choice-h200-70b", "moe-dp-attention", "trtllm-k8s-70b",
                "spec-eagle3", "spec-mtp", "spec-ngram", "spec-draft")


def test_every_kind_of_pick_reaches_the_trtllm_checks_or_is_refused_with_a_reason():
    """The TensorRT-LLM checks above are not vacuous: aggregated, MoE with attention DP, FP8,
    another GPU, each speculative method 1.0's PyTorch backend runs, and disaggregated picks all
    emit a trtllm-serve line and YAML (checked against the contract); a multi-node replica and
    EAGLE-1/Medusa heads are refused, each with its reason, instead of emitting a line."""
    for kind in TRTLLM_KINDS:
        arch, cfg, spec, weights, engine, gpu = AGGREGATED[kind]
        r = _agg(arch, cfg, spec, weights, engine, gpu)
        assert "trtllm" not in r["unsupported"], (kind, r["unsupported"].get("trtllm"))
        assert yaml.safe_load(r["trtllm"]["config_yaml"])["kv_cache_config"]
    for kind, why in (("multinode-405b-vllm", "MPI"), ("spec-eagle", "eagle"), ("spec-medusa", "Medusa")):
        arch, cfg, spec, weights, engine, gpu = AGGREGATED[kind]
        assert why in _agg(arch, cfg, spec, weights, engine, gpu)["unsupported"]["trtllm"]
    r = disaggregated_launch(PRE, DEC, "x", "trtllm")
    assert "trtllm" not in r["unsupported"]
    assert {yaml.safe_load(r["trtllm"][f])["cache_transceiver_config"]["backend"]
            for f in ("ctx_config_yaml", "gen_config_yaml")} == {"UCX"}   # 1.0.0's literal (contract)
    assert sum("1.0.0rc6 and older" in n for n in r["trtllm"]["command"].splitlines()) == 2


def test_trtllm_startup_checks_catch_what_1_0_refuses():
    """The start-up checks of TensorRT-LLM 1.0's llm_args.py that a launch can trip, each shown."""
    argv = ["trtllm-serve", "m", "--max_batch_size", "64", "--max_num_tokens", "4096"]
    assert not trtllm_startup_errors(argv, {"max_batch_size": 64, "max_num_tokens": 4096})
    assert trtllm_startup_errors(argv, {"max_batch_size": 65})                   # above build_config
    assert trtllm_startup_errors(argv, {"max_num_tokens": 8192})
    assert trtllm_startup_errors(["trtllm-serve", "m"], {"max_batch_size": 64})   # no flag: unknown default
    assert trtllm_startup_errors(argv, {"speculative_config": {"decoding_type": "Eagle", "max_draft_len": 3}})
    assert trtllm_startup_errors(argv, {"speculative_config": {"decoding_type": "DraftTarget",
                                                               "speculative_model_dir": "d"}})
    assert trtllm_startup_errors(argv, {"speculative_config": {"decoding_type": "NGram", "max_draft_len": 3}})
    assert trtllm_startup_errors(argv, {"speculative_config": {"decoding_type": "MTP",
                                                               "num_nextn_predict_layers": 0}})
    assert trtllm_startup_errors(argv, {"cache_transceiver_config": {"max_tokens_in_buffer": 8}}, disaggregated=True)


def test_a_key_missing_from_either_revision_round_1_0_0_is_refused():
    """A key of the pinned (1.0.0rc) revision that the later revision dropped or renamed, or one
    only the later revision has, is refused: kvtune writes only keys on both sides of the tag."""
    assert check_trtllm_api({"connector_config": None})          # 1.0.0rc name; later: kv_connector_config
    assert check_trtllm_api({"kv_connector_config": None})       # later name only
    assert check_trtllm_api({"kv_cache_config": {"tokens_per_block": 32}})   # later only
    assert check_trtllm_api({"speculative_config": {"decoding_type": "NGram", "is_auto_heuristic": True}})
    assert check_trtllm_api({"speculative_config": {"decoding_type": "SaveState"}})
    assert not check_trtllm_api({"kv_cache_config": {"max_tokens": 100, "dtype": "fp8"},
                                 "cache_transceiver_config": {"backend": "UCX", "max_tokens_in_buffer": 10},
                                 "speculative_config": {"decoding_type": "Eagle", "max_draft_len": 3,
                                                        "speculative_model_dir": "d", "eagle3_one_model": True}})


def test_the_contracts_name_their_source_archive():
    for e in ("vllm", "sglang", "vllm-router", "sglang-router", "llamacpp"):
        c = contract(e)
        assert len(c["source"]["sha256"]) == 64 and c["source"]["archive"] and c["version"]
        assert sum(len(p["flags"]) for p in c["programs"].values()) > 50


# ---- the slow suite: the shipped examples, solved ----------------------------------------------

EXAMPLES = ("chat-llama3.1-8b", "rag-llama3.1-70b", "speculative-llama3.1-8b", "multinode-llama3.1-405b",
            "gpu-choice-llama3.1-70b")
def _solve(name: str, *extra: str, tmp_path_factory) -> dict:
    """The example's answer, solved once per session (tests/example_solves.py: shared with the
    report and schema tests)."""
    s = solve_example(tmp_path_factory, name, *extra)
    assert s.code == 0, s.text[-3000:]
    return s.result


@pytest.mark.slow
@pytest.mark.parametrize("name,extra", [(n, ()) for n in EXAMPLES] +
                         [("rag-llama3.1-70b", ("--engine", e)) for e in ("sglang", "trtllm")] +
                         [("multinode-llama3.1-405b", ("--engine", "sglang"))])
def test_every_solved_example_launches_on_every_engine(name, extra, tmp_path_factory):
    r = _solve(name, *extra, tmp_path_factory=tmp_path_factory)
    assert r["status"] == "ok"
    launches = [r["launch"]] + ([r["launch_aggregated"]] if r.get("launch_aggregated") else [])
    for launch in launches:
        errors = disaggregated_errors(launch) if "prefill" in (launch.get("memory") or {}) else aggregated_errors(launch)
        assert errors == [], (name, extra, errors)
    assert any("k8s" not in x["unsupported"] for x in launches)


def test_the_pick_kinds_cover_every_engine_and_layout():
    """The default matrix holds each kind the issue lists: aggregated, disaggregated, multi-node,
    another GPU, speculative, FP8 (so a new kind of pick shows up here first)."""
    kinds = set(AGGREGATED) | set(DISAGGREGATED)
    for want in ("chat", "disagg", "multinode", "gpu-choice", "spec-", "fp8"):
        assert any(want in k for k in kinds), want
    engines = {AGGREGATED[k][4] for k in AGGREGATED} | {DISAGGREGATED[k][2] for k in DISAGGREGATED}
    assert {"vllm", "sglang", "trtllm", "llamacpp"} <= engines
    assert len(list(itertools.chain(AGGREGATED, DISAGGREGATED))) >= 15
