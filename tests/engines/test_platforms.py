"""The serving platforms' launch output (optimizer/launch/{dynamo,llmd,kserve}.py) for every kind of
pick and every shipped example, validated against the schemas of the pinned releases
(tests/contracts/platforms/, read from each project's repository at its release tag by
bench/refresh_platform_schemas.py) with ``jsonschema``, and every engine flag they pass through
checked against the engine's own definitions (tests/contracts/*.json).

A CRD schema is applied as the API server applies it under strict field validation (kubectl's
default ``--validate=strict``): an object field the schema does not declare is an error unless the
schema keeps unknown fields (``x-kubernetes-preserve-unknown-fields``). The llm-d chart's
values.schema.json is applied as published, as ``helm install`` applies it. CEL rules
(``x-kubernetes-validations``) are not evaluated here.

The default suite builds the picks directly (tests/launch_picks.py's way: ``build_pick`` on the
catalog's model and GPU); the slow suite checks what ``kvtune solve --json`` wrote for every shipped
example (the solves tests/example_solves.py shares with the report and result-schema tests) and for
the chat example solved disaggregated."""

from __future__ import annotations

import json
import math
import re
import shlex
from functools import lru_cache
from pathlib import Path

import jsonschema
import pytest
import yaml

from engine_contracts import check_argv, check_trtllm_api
from example_solves import solve_example
from helpers import kvtune
from kvtune.costmodel import get_gpu, get_model
from kvtune.optimizer.facts import launch_footer
from kvtune.optimizer.launch import PlannerTargets, build_pick, disaggregated_launch, launch_for_pick
from kvtune.optimizer.launch.context import request_lengths
from kvtune.optimizer.launch.dynamo import BUNDLED_ENGINES, DYNAMO, WORKERS
from kvtune.optimizer.launch.platforms import PLATFORMS
from kvtune.optimizer.report import _launch_lines
from kvtune.optimizer.workload import load_workload

ROOT = Path(__file__).parent.resolve().parents[1]
CONTRACTS = Path(__file__).parent.parent / "contracts" / "platforms"
H100 = get_gpu("h100-sxm")
L8, L70, L405, QMOE, DSV3 = (get_model(n) for n in ("llama-3.1-8b", "llama-3.1-70b", "llama-3.1-405b",
                                                   "qwen3-30b-a3b", "deepseek-v3"))
TARGETS = PlannerTargets(ttft_ms=1000.0, tpot_ms=40.0, per_replica_goodput_req_s=3.0)
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


# ---- the schemas ---------------------------------------------------------------------------------

@lru_cache(maxsize=None)
def contract(platform: str) -> dict:
    v = PLATFORMS[platform]
    return json.loads((ROOT / v.contract).read_text())


def _strict(node):
    """A CRD schema as strict field validation applies it: undeclared object fields refused."""
    if isinstance(node, list):
        return [_strict(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: _strict(v) if k != "enum" else v for k, v in node.items()}
    if out.get("type") == "object" and "properties" in out and "additionalProperties" not in out \
            and not out.get("x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False
    return out


@lru_cache(maxsize=None)
def validator(platform: str):
    c = contract(platform)
    schema = c["schema"] if platform == "llmd" else _strict(c["schema"])
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft7Validator)
    cls.check_schema(schema)
    return cls(schema)


def schema_errors(platform: str, doc: dict) -> list[str]:
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator(platform).iter_errors(doc)]
    if platform != "llmd":
        name = doc.get("metadata", {}).get("name", "")
        if not (_DNS_LABEL.match(name) and len(name) <= 63):
            errors.append(f"metadata.name {name!r} is not a DNS-1123 label")
        c = contract(platform)
        if (doc.get("apiVersion"), doc.get("kind")) != (c["api_version"], c["kind"]):
            errors.append(f"{doc.get('apiVersion')}/{doc.get('kind')} is not {c['api_version']}/{c['kind']}")
    return errors


# ---- the engine flags each platform passes through ----------------------------------------------------

def _dynamo_worker_errors(line: str) -> list[str]:
    """A Dynamo worker's shell line, as the engine's own parser and the worker's own flags see it."""
    argv = shlex.split(line)
    own = contract("dynamo")["workers"]
    if argv[:3] == ["python3", "-m", "dynamo.vllm"]:
        rest = argv[3:]
        i = rest.index("--model")
        model, rest = rest[i + 1], rest[:i] + rest[i + 2:]
        rest = [a for a in rest if a not in own["dynamo.vllm"]["flags"]]
        return check_argv("vllm", ["vllm", "serve", model, *rest])
    if argv[:3] == ["python3", "-m", "dynamo.sglang"]:
        return check_argv("sglang", ["python", "-m", "sglang.launch_server", *argv[3:]])
    if argv[:3] == ["python3", "-m", "dynamo.trtllm"]:
        return _flag_errors(argv[3:], own["dynamo.trtllm"]["flags"]) + \
            check_trtllm_api(json.loads(argv[argv.index("--override-engine-args") + 1]))
    return [f"not a Dynamo worker: {line[:60]}"]


def _flag_errors(args: list[str], flags: dict) -> list[str]:
    """``args`` against an argparse parser's recorded flags (type, literal choices, store_true)."""
    errors, i = [], 0
    while i < len(args):
        name = args[i]
        f = flags.get(name)
        if f is None:
            errors.append(f"{name}: no such flag")
            i += 1
            continue
        if f.get("action") == "store_true":
            i += 1
            continue
        v = args[i + 1]
        conv = {"int": int, "float": float}.get(f.get("type", ""), str)
        try:
            conv(v)
        except ValueError:
            errors.append(f"{name} {v!r}: not {f['type']}")
        if isinstance(f.get("choices"), list) and v not in f["choices"]:
            errors.append(f"{name} {v!r}: not one of {f['choices']}")
        i += 2
    return errors


def _vllm_args_errors(model: str, tp: int, args: list[str]) -> list[str]:
    """Container args the chart / preset appends to its own ``vllm serve MODEL --tensor-parallel-size``."""
    return check_argv("vllm", ["vllm", "serve", model, "--tensor-parallel-size", str(tp), *args])


def _dp_nodes_script_errors(command: list[str], args: list[str]) -> list[str]:
    """llm-d's multinode shell line (data-parallel or TP x PP): the vLLM command it execs, on the
    leader (rank 0) and on a worker (``--headless``), with LWS's variables standing in as placeholders."""
    if command != ["/bin/sh", "-c"] or len(args) != 1 or " exec vllm serve " not in args[0]:
        return [f"not a shell line that execs vllm serve: {command} {args}"]
    words = shlex.split(args[0].split(" exec ", 1)[1].replace("$LWS_LEADER_ADDRESS", "$(LWS_LEADER_ADDRESS)")
                        .replace('"$RANK"', "8").replace('"$NODE_RANK"', "1"))
    if words[-1] != "$HEADLESS":
        return [f"the line does not end in $HEADLESS: {words[-3:]}"]
    return check_argv("vllm", words[:-1]) + check_argv("vllm", words[:-1] + ["--headless"])


def _planner_errors(argv: list[str]) -> list[str]:
    if argv[:3] != ["python3", "-m", "planner_sla"]:
        return [f"not the SLA planner: {argv[:3]}"]
    return _flag_errors(argv[3:], contract("dynamo")["planner"]["flags"])


def platform_errors(platforms: dict) -> list[str]:
    """Everything wrong with a launch's ``platforms`` entry: schema, YAML = object, flags."""
    errors: list[str] = []
    for key, text_key in (("dynamo", "manifest"), ("llmd", "values_yaml"), ("kserve", "manifest")):
        if key not in platforms:
            if not platforms["unsupported"].get(key):
                errors.append(f"{key}: neither output nor a reason")
            continue
        entry = platforms[key]
        doc = entry["resource"]
        errors += [f"{key}: {e}" for e in schema_errors(key, doc)]
        if list(yaml.safe_load_all(entry[text_key])) != [doc]:
            errors.append(f"{key}: the YAML is not the object")
        if key == "dynamo":
            for name, svc in doc["spec"]["services"].items():
                if svc["componentType"] == "worker":
                    errors += [f"dynamo {name}: {e}" for e in _dynamo_worker_errors(svc["extraPodSpec"]["mainContainer"]["args"][0])]
            if "planner" in entry:
                errors += [f"planner: {e}" for e in _planner_errors(entry["planner"]["argv"])]
                svc = {"Planner": entry["planner"]["service"]}
                with_planner = {**doc, "spec": {**doc["spec"], "services": {**doc["spec"]["services"], **svc}}}
                errors += [f"dynamo+planner: {e}" for e in schema_errors("dynamo", with_planner)]
        elif key == "llmd":
            for role in ("prefill", "decode"):
                pool = doc[role]
                if not pool["create"]:
                    continue
                c = pool["containers"][0]
                if c["modelCommand"] == "custom":
                    errors += [f"llmd {role}: {e}" for e in _dp_nodes_script_errors(c["command"], c["args"])]
                else:
                    errors += [f"llmd {role}: {e}" for e in _vllm_args_errors(doc["modelArtifacts"]["name"],
                                                                              pool["parallelism"]["tensor"], c["args"])]
        else:
            spec = doc["spec"]
            for where, part in (("template", spec), ("prefill", spec.get("prefill"))):
                if part is not None:
                    args = part["template"]["containers"][0]["args"]
                    errors += [f"kserve {where}: {e}" for e in _vllm_args_errors(spec["model"]["name"],
                                                                                 part["parallelism"]["tensor"], args)]
    return errors


# ---- the picks ---------------------------------------------------------------------------------------

def _pick(arch, tp, replicas=2, pp=1, gpus_per_node=8, speculative=None, spec_k=0, kv="bf16", weights="bf16",
          max_request_tokens=9200, max_prompt_tokens=8000):
    cfg = {"tp": tp, "pp": pp, "batch_cap": 64, "kv_dtype": kv, "spec_k": spec_k, "chunk_tokens": 4096}
    return build_pick(arch.hf_id, cfg, replicas, 0.9, speculative, arch=arch, gpu=H100, weights=weights,
                      activation_reserve_bytes=2e9, gpus_per_node=gpus_per_node,
                      max_request_tokens=max_request_tokens, max_prompt_tokens=max_prompt_tokens)


def test_the_contracts_name_their_release_commit_and_hash():
    for platform, v in PLATFORMS.items():
        c = contract(platform)
        src = c["source"]
        assert (c["platform"], c["version"]) == (platform, v.version)
        assert src["commit"] == v.commit and re.fullmatch(r"[0-9a-f]{40}", src["commit"])
        assert re.fullmatch(r"[0-9a-f]{64}", src["sha256"]) and src["path"] and src["tag"]
        assert src["repository"] == v.repository
        assert c["extracted_by"] == "bench/refresh_platform_schemas.py"
        assert "properties" in c["schema"] and len(json.dumps(c["schema"])) > 10_000


def test_the_dynamo_constants_are_the_releases_own():
    c = contract("dynamo")
    assert {e: WORKERS[e] for e in WORKERS} == {e: c["planner"]["worker_services"][e] for e in WORKERS}
    assert BUNDLED_ENGINES == c["bundled_engines"]["versions"]
    assert "--is-prefill-worker" in c["workers"]["dynamo.vllm"]["flags"]


def test_the_validator_refuses_what_the_api_server_would():
    """The checks have teeth: an unknown field, a wrong type, a missing required key each fail."""
    ok = launch_for_pick(_pick(L8, 1), "kvtune-llama-3.1-8b", None, TARGETS)["platforms"]
    assert platform_errors(ok) == []
    dgd = json.loads(json.dumps(ok["dynamo"]["resource"]))
    dgd["spec"]["services"]["VllmDecodeWorker"]["gpus"] = 1
    assert any("gpus" in e for e in schema_errors("dynamo", dgd))
    dgd = json.loads(json.dumps(ok["dynamo"]["resource"]))
    dgd["spec"]["services"]["VllmDecodeWorker"]["replicas"] = "2"
    assert schema_errors("dynamo", dgd)
    dgd["spec"]["services"]["VllmDecodeWorker"]["multinode"] = {}
    assert any("nodeCount" in e for e in schema_errors("dynamo", dgd))
    isvc = json.loads(json.dumps(ok["kserve"]["resource"]))
    del isvc["spec"]["model"]["uri"]
    assert any("uri" in e for e in schema_errors("kserve", isvc))
    isvc = json.loads(json.dumps(ok["kserve"]["resource"]))
    isvc["spec"]["parallelism"]["tensor"] = 0
    assert schema_errors("kserve", isvc)
    values = json.loads(json.dumps(ok["llmd"]["resource"]))
    values["multinode"] = "no"
    assert schema_errors("llmd", values)
    values = json.loads(json.dumps(ok["llmd"]["resource"]))
    values["modelArtifacts"]["url"] = values["modelArtifacts"].pop("uri")   # the chart's schema refuses a misspelt key
    assert any("url" in e for e in schema_errors("llmd", values))


KINDS = {
    "chat-8b": lambda: launch_for_pick(_pick(L8, 1, replicas=3), "kvtune-llama-3.1-8b", None, TARGETS),
    "70b-tp4-sglang": lambda: launch_for_pick(_pick(L70, 4), "kvtune-llama-3.1-70b", "sglang", TARGETS),
    "70b-trtllm": lambda: launch_for_pick(_pick(L70, 4), "kvtune-llama-3.1-70b", "trtllm", None),
    "fp8-kv": lambda: launch_for_pick(_pick(L70, 2, kv="fp8"), "kvtune-llama-3.1-70b", None, TARGETS),
    "spec-eagle3": lambda: launch_for_pick(
        _pick(L8, 1, speculative={"method": "eagle3", "draft_model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"},
              spec_k=3), "kvtune-llama-3.1-8b", None, TARGETS),
    "moe-dp-attention": lambda: launch_for_pick(
        build_pick(QMOE.hf_id, {"tp": 4, "ep": 4, "dp_attention": True, "batch_cap": 64, "kv_dtype": "bf16",
                                "spec_k": 0, "chunk_tokens": 4096}, 2, 0.9, None, arch=QMOE, gpu=H100,
                   activation_reserve_bytes=2e9, max_request_tokens=9200, max_prompt_tokens=8000),
        "kvtune-qwen3-30b-a3b", None, TARGETS),
    "multinode-dsv3-dp-attention": lambda: launch_for_pick(
        build_pick(DSV3.hf_id, {"tp": 16, "ep": 16, "dp_attention": True, "batch_cap": 64, "kv_dtype": "bf16",
                                "spec_k": 0, "chunk_tokens": 4096}, 1, 0.9, None, arch=DSV3, gpu=H100, weights="fp8",
                   activation_reserve_bytes=2e9, max_request_tokens=9200, max_prompt_tokens=8000),
        "kvtune-deepseek-v3", None, TARGETS),
    "multinode-dsv3-pp-dp-attention": lambda: launch_for_pick(
        build_pick(DSV3.hf_id, {"tp": 8, "pp": 2, "ep": 8, "dp_attention": True, "batch_cap": 64,
                                "kv_dtype": "bf16", "spec_k": 0, "chunk_tokens": 4096}, 1, 0.9, None, arch=DSV3,
                   gpu=H100, weights="fp8", activation_reserve_bytes=2e9, max_request_tokens=9200,
                   max_prompt_tokens=8000), "kvtune-deepseek-v3", None, TARGETS),
    "multinode-405b-vllm": lambda: launch_for_pick(_pick(L405, 16), "kvtune-llama-3.1-405b", "vllm", TARGETS),
    "multinode-405b-vllm-pp": lambda: launch_for_pick(_pick(L405, 8, pp=2), "kvtune-llama-3.1-405b", "vllm",
                                                      TARGETS),
    "multinode-405b-sglang": lambda: launch_for_pick(_pick(L405, 8, pp=2), "kvtune-llama-3.1-405b", "sglang",
                                                     TARGETS),
    "disagg-70b-vllm": lambda: disaggregated_launch(_pick(L70, 2, replicas=3), _pick(L70, 4, replicas=1),
                                                    "kvtune-llama-3.1-70b", "vllm", TARGETS),
    "disagg-70b-trtllm": lambda: disaggregated_launch(_pick(L70, 2, replicas=3), _pick(L70, 4, replicas=1),
                                                      "kvtune-llama-3.1-70b", "trtllm", TARGETS),
    "disagg-70b-sglang": lambda: disaggregated_launch(_pick(L70, 2, replicas=3), _pick(L70, 4, replicas=1),
                                                      "kvtune-llama-3.1-70b", "sglang", PlannerTargets()),
}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_kind_of_pick_is_schema_valid_on_every_platform(kind):
    out = KINDS[kind]()
    plat = out["platforms"]
    assert platform_errors(plat) == [], kind
    json.dumps(plat)   # the launch JSON carries it as it is
    assert "dynamo" in plat
    if "multinode" in kind:
        svc = next(s for s in plat["dynamo"]["resource"]["spec"]["services"].values() if s["componentType"] == "worker")
        assert svc["multinode"] == {"nodeCount": 2} and svc["resources"]["limits"]["gpu"] == "8"
        # llm-d writes DP attention and TP x PP with one TP group a node; KServe 0.20.0 only DP attention
        tp_pp = kind.startswith("multinode-405b") and kind != "multinode-405b-vllm"
        dp_nodes = kind == "multinode-dsv3-dp-attention"   # DP attention, PP 1: both platforms' DP form
        assert set(plat["unsupported"]) == (set() if dp_nodes else {"kserve"} if tp_pp
                                            else {"llmd", "kserve"}), kind
    else:
        assert plat["unsupported"] == {} and {"llmd", "kserve"} <= set(plat)


def test_a_disaggregated_pick_gives_the_planner_kvtunes_targets_and_sizes():
    plat = KINDS["disagg-70b-vllm"]()["platforms"]
    services = plat["dynamo"]["resource"]["spec"]["services"]
    assert services["VllmPrefillWorker"]["replicas"] == 3 and services["VllmPrefillWorker"]["resources"]["limits"]["gpu"] == "2"
    assert services["VllmDecodeWorker"]["replicas"] == 1 and services["VllmDecodeWorker"]["resources"]["limits"]["gpu"] == "4"
    assert "--is-prefill-worker" in shlex.split(services["VllmPrefillWorker"]["extraPodSpec"]["mainContainer"]["args"][0])
    argv = plat["dynamo"]["planner"]["argv"]

    def val(flag):
        return argv[argv.index(flag) + 1]
    # the planner takes seconds: 1000 ms TTFT, 40 ms TPOT
    assert float(val("--ttft")) == 1.0 and float(val("--itl")) == 0.04
    assert (val("--prefill-engine-num-gpu"), val("--decode-engine-num-gpu"), val("--max-gpu-budget")) == ("2", "4", "10")
    assert plat["dynamo"]["planner"]["targets"]["per_replica_goodput_req_s"] == 3.0
    # what kvtune sized, beside the targets: the planner starts from it
    assert plat["dynamo"]["planner"]["kvtune_sized"] == {"prefill_replicas": 3, "decode_replicas": 1,
                                                         "prefill_gpus_per_replica": 2, "decode_gpus_per_replica": 4,
                                                         "gpus": 10}
    # the manifest's head names the Hugging Face token, required for a gated model (Llama)
    token = next(ln for ln in plat["dynamo"]["manifest"].splitlines() if "Hugging Face token" in ln)
    assert token.endswith("--from-literal=HF_TOKEN=hf_... (required: gated model)"), token
    # no SLO: no target flag, and a note saying the planner's default applies
    bare = KINDS["disagg-70b-sglang"]()["platforms"]["dynamo"]["planner"]
    assert "--ttft" not in bare["argv"] and any("TTFT" in n for n in bare["notes"])
    # llm-d: both pools, the sidecar, NIXL; KServe: the prefill section
    values = plat["llmd"]["resource"]
    assert values["routing"]["proxy"]["enabled"] and values["prefill"]["replicas"] == 3
    assert "--kv-transfer-config" in values["decode"]["containers"][0]["args"]
    assert plat["kserve"]["resource"]["spec"]["prefill"]["parallelism"] == {"tensor": 2}


def test_the_planner_targets_read_an_slo_without_inventing_one():
    from kvtune.costmodel.traffic import SLO
    t = PlannerTargets.from_slo(SLO(ttft_ms=500.0), math.inf)
    assert (t.ttft_ms, t.tpot_ms, t.per_replica_goodput_req_s) == (500.0, None, None)


def test_dp_attention_keeps_the_platforms_tensor_parallelism_at_one():
    """vLLM runs DP attention as TP 1 x DP tp (launch/vllm.py): a chart or preset that writes
    --tensor-parallel-size from its own field must be given 1, the DP size riding in the args."""
    plat = KINDS["moe-dp-attention"]()["platforms"]
    pool = plat["llmd"]["resource"]["decode"]
    assert pool["parallelism"]["tensor"] == 1 and "--data-parallel-size" in pool["containers"][0]["args"]
    spec = plat["kserve"]["resource"]["spec"]
    assert spec["parallelism"]["tensor"] == 1 and "--data-parallel-size" in spec["template"]["containers"][0]["args"]
    assert spec["template"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "4"


def test_attention_dp_over_nodes_is_llmd_and_kserves_multi_node_form():
    """DeepSeek-V3 at DP 16 over two 8-GPU nodes: KServe's data-parallel preset (parallelism and a
    worker pod), llm-d's LeaderWorkerSet (multinode, 2 workers) with each pod's start rank."""
    plat = KINDS["multinode-dsv3-dp-attention"]()["platforms"]
    spec = plat["kserve"]["resource"]["spec"]
    assert spec["parallelism"] == {"tensor": 1, "data": 16, "dataLocal": 8, "expert": True}
    assert spec["worker"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "8"
    for c in (spec["template"]["containers"][0], spec["worker"]["containers"][0]):
        # the preset writes these from spec.parallelism
        assert "--data-parallel-size" not in c["args"] and "--enable-expert-parallel" not in c["args"]
    values = plat["llmd"]["resource"]
    assert values["multinode"] is True
    assert values["decode"]["parallelism"] == {"tensor": 1, "data": 16, "dataLocal": 8, "workers": 2}
    line = values["decode"]["containers"][0]["args"][0]
    assert "RANK=$(( ${LWS_WORKER_INDEX:-0} * 8 ))" in line and "--data-parallel-start-rank \"$RANK\"" in line


def _pp_line_sizes(values: dict) -> dict:
    """The parallel sizes llm-d's TP x PP shell line runs vLLM with."""
    words = shlex.split(values["decode"]["containers"][0]["args"][0].split(" exec ", 1)[1])
    return {f: int(words[words.index(f) + 1]) for f in ("--tensor-parallel-size", "--pipeline-parallel-size",
                                                         "--nnodes")}


def test_tp_x_pp_over_nodes_is_llmds_multinode_form():
    """Llama-3.1-405B at TP 8 x PP 2 over two 8-GPU nodes: the chart's LeaderWorkerSet (multinode,
    parallelism.tensor 8 = a pod's GPUs, 2 workers), every pod running vLLM's multi-node launch with
    its node rank from LWS and the non-leader headless; kvtune's flags ride in the line."""
    for kind in ("multinode-405b-vllm-pp", "multinode-405b-sglang"):
        plat = KINDS[kind]()["platforms"]
        values = plat["llmd"]["resource"]
        assert values["multinode"] is True and values["prefill"] == {"create": False}
        pool = values["decode"]
        assert pool["parallelism"] == {"tensor": 8, "workers": 2} and pool["replicas"] == 2
        c = pool["containers"][0]
        assert c["modelCommand"] == "custom" and c["resources"]["limits"]["nvidia.com/gpu"] == 8
        assert _pp_line_sizes(values) == {"--tensor-parallel-size": 8, "--pipeline-parallel-size": 2, "--nnodes": 2}
        line = c["args"][0]
        assert line.startswith("NODE_RANK=${LWS_WORKER_INDEX:-0}; ") and line.endswith(" $HEADLESS")
        for flag in ('--node-rank "$NODE_RANK"', '--master-addr "$LWS_LEADER_ADDRESS"', "--master-port 29501",
                     "--max-num-seqs 64", "--max-num-batched-tokens 4096", "--gpu-memory-utilization 0.9"):
            assert flag in line, flag
        if kind == "multinode-405b-sglang":
            assert any("SGLang" in n for n in plat["notes"]["llmd"])


def test_a_multi_node_replica_the_platforms_cannot_run_keeps_a_one_line_reason():
    """KServe 0.20.0 names a pipeline-parallel preset it does not ship: its reason cites where; llm-d's
    chart cannot describe TP wider than a pod, nor kvtune a disaggregated pool over nodes."""
    plat = KINDS["multinode-405b-vllm-pp"]()["platforms"]
    why = plat["unsupported"]["kserve"]
    assert "\n" not in why and "TP 8 x PP 2" in why
    for evidence in ("kserve-config-llm-worker-pipeline-parallel", "pkg/controller/v1alpha2/llmisvc/config_merge.go",
                     "config/llmisvcconfig/ at v0.20.0", "ConfigNotFound"):
        assert evidence in why, evidence
    wide = KINDS["multinode-405b-vllm"]()["platforms"]["unsupported"]
    assert "\n" not in wide["llmd"] and "TP 16 x PP 1" in wide["llmd"] and "numGpuPerWorker" in wide["llmd"]
    assert "pipeline-parallel" in wide["kserve"]
    # DeepSeek-V3 as its example solves (TP 8 x PP 2, DP attention, EP 8): neither DP form has a pipeline
    pp_dp = KINDS["multinode-dsv3-pp-dp-attention"]()["platforms"]["unsupported"]
    for key, evidence in (("llmd", "no pipeline field"), ("kserve", "writes no pipeline size")):
        assert "\n" not in pp_dp[key] and "TP 8 x PP 2" in pp_dp[key] and evidence in pp_dp[key], key
    # DeepSeek-V3 as its example solves (TP 8 x PP 2, DP attention, EP 8): neither DP form has a pipeline
    pp_dp = KINDS["multinode-dsv3-pp-dp-attention"]()["platforms"]["unsupported"]
    for key, evidence in (("llmd", "no pipeline field"), ("kserve", "writes no pipeline size")):
        assert "\n" not in pp_dp[key] and "TP 8 x PP 2" in pp_dp[key] and evidence in pp_dp[key], key
    dis = disaggregated_launch(_pick(L405, 8, pp=2, replicas=1), _pick(L405, 8, pp=2, replicas=1),
                               "kvtune-llama-3.1-405b", "vllm", TARGETS)["platforms"]
    assert platform_errors(dis) == []
    assert "aggregated picks only" in dis["unsupported"]["llmd"] and "pipeline" in dis["unsupported"]["kserve"]


def test_a_platform_running_another_engine_says_so():
    """llm-d and KServe run vLLM and say so for a TensorRT-LLM pick; Dynamo runs TensorRT-LLM."""
    plat = KINDS["70b-trtllm"]()["platforms"]
    for key in ("llmd", "kserve"):
        assert any("TensorRT-LLM" in n for n in plat["notes"][key]), key
    assert plat["dynamo"]["resource"]["spec"]["backendFramework"] == "trtllm" and plat["notes"]["dynamo"] == [
        f"{DYNAMO.label}'s SLA planner scales prefill and decode workers: it has no input for an aggregated pick"]


def test_a_dynamo_trtllm_worker_carries_kvtunes_llm_api_options():
    plat = KINDS["disagg-70b-trtllm"]()["platforms"]
    services = plat["dynamo"]["resource"]["spec"]["services"]
    argv = shlex.split(services["TRTLLMPrefillWorker"]["extraPodSpec"]["mainContainer"]["args"][0])
    api = json.loads(argv[argv.index("--override-engine-args") + 1])
    assert api["tensor_parallel_size"] == 2 and api["max_batch_size"] == 64 and "kv_cache_config" in api
    assert api["cache_transceiver_config"] == {"backend": "DEFAULT"}
    assert argv[argv.index("--disaggregation-mode") + 1] == "prefill"
    assert plat["dynamo"]["planner"]["argv"][plat["dynamo"]["planner"]["argv"].index("--backend") + 1] == "trtllm"


def test_the_summary_footer_names_the_platforms_written():
    assert "Dynamo, llm-d, KServe under 'launch.platforms'" in launch_footer(KINDS["chat-8b"]())
    assert "; Dynamo under 'launch.platforms'" in launch_footer(KINDS["multinode-405b-vllm"]())
    assert "launch.platforms" not in launch_footer({"vllm": "x", "unsupported": {"k8s": "no GPUs"}})


def test_the_report_shows_each_platform():
    launch = KINDS["multinode-405b-vllm"]()
    text = "\n".join(_launch_lines(launch))
    assert "## NVIDIA Dynamo" in text and "kind: DynamoGraphDeployment" in text
    assert "## KServe" in text and "cannot run this pick" in text


# ---- every shipped example ----------------------------------------------------------------------------

EXAMPLES = sorted(p.stem for p in (ROOT / "examples").glob("*.yaml"))


def _example_picks(name: str):
    """The example's model on its GPU at the smallest TP (a power of two) whose weights fit with a
    KV pool for its longest request, the way tests/engines/test_launch_contracts.py builds picks."""
    spec = load_workload(ROOT / "examples" / f"{name}.yaml")
    arch, gpu = get_model(spec.model), get_gpu(spec.hardware.gpu)
    n = request_lengths(spec.workload)
    lengths = {} if n is None else {"max_request_tokens": n.total_tokens, "max_prompt_tokens": n.prompt_tokens}
    sdict = None if spec.speculative is None else {"method": spec.speculative.method,
                                                   "draft_model": spec.speculative.draft_model}
    for tp in (1, 2, 4, 8, 16, 32):
        cfg = {"tp": tp, "batch_cap": 64, "kv_dtype": "bf16", "spec_k": 3 if sdict else 0, "chunk_tokens": 4096}
        p = build_pick(arch.hf_id or spec.model, cfg, 2, spec.gpu_mem_util, sdict, arch=arch, gpu=gpu,
                       weights=spec.weights, activation_reserve_bytes=2e9,
                       gpus_per_node=spec.hardware.gpus_per_node, **lengths)
        if p.memory is not None and p.memory.kv_pool_tokens >= lengths.get("max_request_tokens", 1):
            return spec, p
    raise AssertionError(f"{name}: no TP up to 32 fits")


@pytest.mark.parametrize("name", EXAMPLES)
def test_every_example_launches_on_every_platform(name):
    spec, p = _example_picks(name)
    targets = PlannerTargets.from_slo(spec.slo, 2.0)
    agg = launch_for_pick(p, f"kvtune-{name}", spec.engine, targets)["platforms"]
    assert platform_errors(agg) == [], name
    assert "dynamo" in agg, agg["unsupported"]
    if not p.multi_node and not p.speculating:
        dis = disaggregated_launch(p, p, f"kvtune-{name}", spec.engine, targets)["platforms"]
        assert platform_errors(dis) == [], name
        assert {"dynamo", "llmd", "kserve"} <= set(dis) and "planner" in dis["dynamo"]


def test_the_examples_cover_single_and_multi_node():
    kinds = {_example_picks(n)[1].multi_node for n in EXAMPLES}
    assert kinds == {True, False}


# ---- the slow suite: one example, solved -----------------------------------------------------------

@pytest.mark.slow
def test_a_solved_example_writes_schema_valid_platform_output(tmp_path):
    """The chat example solved disaggregated (search.deployment: [disaggregated]): every platform's
    output valid, and the planner given the workload's own SLOs and the solve's per-unit goodput."""
    w = yaml.safe_load((ROOT / "examples" / "chat-llama3.1-8b.yaml").read_text())
    w["search"] = {**w.get("search", {}), "deployment": ["disaggregated"]}
    path = tmp_path / "chat-disagg.yaml"
    path.write_text(yaml.safe_dump(w))
    out = tmp_path / "r.json"
    code, text = kvtune("solve", str(path), "--quiet", "--json", out)
    assert code == 0, text
    r = json.loads(out.read_text())
    assert r["status"] == "ok" and r["deployment"]["kind"] == "disaggregated"
    for launch in [r["launch"]] + ([r["launch_aggregated"]] if r.get("launch_aggregated") else []):
        plat = launch["platforms"]
        assert platform_errors(plat) == []
        assert {"dynamo", "llmd", "kserve"} <= set(plat)
    planner = r["launch"]["platforms"]["dynamo"]["planner"]
    argv = planner["argv"]
    assert float(argv[argv.index("--ttft") + 1]) == w["slo"]["ttft_ms"] / 1000
    assert float(argv[argv.index("--itl") + 1]) == w["slo"]["tpot_ms"] / 1000
    assert planner["targets"]["per_replica_goodput_req_s"] == r["predicted"]["per_replica_goodput_req_s"]
    assert int(argv[argv.index("--max-gpu-budget") + 1]) == r["recommendation"]["gpus"]


@pytest.mark.slow
@pytest.mark.parametrize("name", EXAMPLES)
def test_every_solved_example_writes_schema_valid_platform_output(name, tmp_path_factory):
    """What ``kvtune solve examples/NAME.yaml --json`` wrote under launch.platforms (and
    launch_aggregated.platforms for a disaggregated pick), not a pick built here: the solved
    configuration (its KV dtype, batch cap, speculation, deployment) is the one a user deploys."""
    s = solve_example(tmp_path_factory, name)   # solved once per session, shared with the schema and report tests
    assert s.code == 0, s.text[-2000:]
    r = s.result
    launches = [r["launch"]] + ([r["launch_aggregated"]] if r.get("launch_aggregated") else [])
    for launch in launches:
        plat = launch["platforms"]
        assert platform_errors(plat) == [], name   # each platform's output valid, or its reason
        assert "dynamo" in plat, plat["unsupported"]
    rec = r["recommendation"]
    if not name.startswith("multinode-"):
        return
    # both multinode examples solve to a TP x PP replica over two nodes (DeepSeek-V3 with DP attention)
    assert rec["pp"] > 1, rec
    plat = r["launch"]["platforms"]
    # KServe 0.20.0 names a pipeline-parallel preset it does not ship: the reason says where
    assert "kserve-config-llm-worker-pipeline-parallel" in plat["unsupported"]["kserve"]
    if rec["dp_attention"]:
        # vLLM's TP 1 x DP tp x PP pp: the chart's DP form has no pipeline field, a one-line reason
        assert "no pipeline field" in plat["unsupported"]["llmd"] and "\n" not in plat["unsupported"]["llmd"]
    else:
        # a TP x PP replica over nodes: llm-d's values run the solved sizes
        values = plat["llmd"]["resource"]
        assert values["multinode"] is True and values["decode"]["parallelism"]["tensor"] == rec["tp"]
        sizes = _pp_line_sizes(values)
        assert (sizes["--tensor-parallel-size"], sizes["--pipeline-parallel-size"]) == (rec["tp"], rec["pp"])
        assert values["decode"]["parallelism"]["workers"] == sizes["--nnodes"]
