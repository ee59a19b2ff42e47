#!/usr/bin/env python3
"""Refresh tests/contracts/platforms/*.json: the schemas of the serving platforms kvtune's launch
settings write for (NVIDIA Dynamo, llm-d modelservice, KServe), read from each project's own
repository at a pinned release tag, so CI validates every emitted manifest offline.

Run by hand, on git directories of the three repositories (a clone, or a bare snapshot; only
``git show TAG:FILE`` and ``git rev-parse`` are run, nothing is built or imported):

    python bench/refresh_platform_schemas.py --dynamo-git D --kserve-git K --llmd-git L
    python bench/refresh_platform_schemas.py --only kserve --kserve-git K

The committed Dynamo contract was read from a snapshot of the fork izyuumi/dynamo (the upstream
repository's snapshot is over the source tools' size limit), at the upstream tag v0.5.1 it holds:
``--read-from dynamo=izyuumi/dynamo`` records that in the contract.

What is read, per platform (the sha256 recorded is of the file's bytes at the tag):

- NVIDIA Dynamo v0.5.1 (ai-dynamo/dynamo): the ``DynamoGraphDeployment`` CRD
  (deploy/cloud/operator/config/crd/bases/nvidia.com_dynamographdeployments.yaml), version
  v1alpha1's ``openAPIV3Schema``; the SLA planner's flags (components/planner/src/dynamo/planner/
  utils/planner_argparse.py ``parser.add_argument`` calls, read with ``ast``) and the worker service
  names it scales (defaults.py ``*ComponentName.*_worker_k8s_name``); the engine versions its
  runtime images bundle (pyproject.toml's ``vllm``/``sglang``/``trtllm`` extras); the workers' own
  flags (components/backends/{vllm,sglang}/src/dynamo/*/args.py, which they take beside the
  engine's; the TensorRT-LLM worker's whole parser, trtllm/utils/trtllm_utils.py).
- KServe v0.20.0 (kserve/kserve): the ``LLMInferenceService`` CRD
  (config/crd/full/llmisvc/serving.kserve.io_llminferenceservices.yaml), version v1alpha1.
- llm-d-modelservice v0.4.12 (llm-d-incubation/llm-d-modelservice): the chart's own
  charts/llm-d-modelservice/values.schema.json (what ``helm install`` validates values against).

Trimmed: ``description`` and ``title`` keys are dropped (text only, most of the bytes) and a CRD's
``status`` (never written by users); every other keyword is kept as published.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import re
import subprocess
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "contracts" / "platforms"
SCRIPT = "bench/refresh_platform_schemas.py"

PINS = {
    "dynamo": {"name": "NVIDIA Dynamo", "repository": "ai-dynamo/dynamo", "tag": "v0.5.1", "version": "0.5.1",
               "path": "deploy/cloud/operator/config/crd/bases/nvidia.com_dynamographdeployments.yaml",
               "kind": "DynamoGraphDeployment", "api_version": "nvidia.com/v1alpha1"},
    "kserve": {"name": "KServe", "repository": "kserve/kserve", "tag": "v0.20.0", "version": "0.20.0",
               "path": "config/crd/full/llmisvc/serving.kserve.io_llminferenceservices.yaml",
               "kind": "LLMInferenceService", "api_version": "serving.kserve.io/v1alpha1"},
    "llmd": {"name": "llm-d-modelservice", "repository": "llm-d-incubation/llm-d-modelservice",
             "tag": "llm-d-modelservice-v0.4.12", "version": "0.4.12",
             "path": "charts/llm-d-modelservice/values.schema.json"},
}
_PLANNER = "components/planner/src/dynamo/planner"
_DROP = ("description", "title")
# the workers' own flags (beside the engine's, which each parser adds from the engine itself)
_WORKER_ARGS = {"dynamo.vllm": "components/backends/vllm/src/dynamo/vllm/args.py",
                "dynamo.sglang": "components/backends/sglang/src/dynamo/sglang/args.py",
                "dynamo.trtllm": "components/backends/trtllm/src/dynamo/trtllm/utils/trtllm_utils.py"}


def git_show(git_dir: Path, tag: str, path: str) -> bytes:
    return subprocess.run(["git", "--git-dir", str(git_dir), "show", f"{tag}:{path}"], check=True,
                          capture_output=True).stdout


def git_commit(git_dir: Path, tag: str) -> str:
    return subprocess.run(["git", "--git-dir", str(git_dir), "rev-parse", f"{tag}^{{commit}}"], check=True,
                          capture_output=True, text=True).stdout.strip()


def trim(node):
    """The schema without its prose (``description``, ``title``), every other keyword as published."""
    if isinstance(node, dict):
        return {k: trim(v) for k, v in node.items() if k not in _DROP}
    if isinstance(node, list):
        return [trim(v) for v in node]
    return node


def crd_schema(text: bytes, api_version: str) -> dict:
    """The ``openAPIV3Schema`` of ``api_version``'s version in a CRD file, without ``status``."""
    group, version = api_version.split("/")
    docs = [d for d in yaml.safe_load_all(text) if d and d.get("kind") == "CustomResourceDefinition"]
    crd = next((d for d in docs if d["spec"]["group"] == group), None)
    if crd is None:
        raise SystemExit(f"no CustomResourceDefinition of group {group}")
    ver = next((v for v in crd["spec"]["versions"] if v["name"] == version), None)
    if ver is None or not ver.get("served"):
        raise SystemExit(f"{crd['metadata']['name']}: version {version} is not served")
    schema = dict(ver["schema"]["openAPIV3Schema"])
    schema["properties"] = {k: v for k, v in schema["properties"].items() if k != "status"}
    return trim(schema)


def _source(pin: dict, git_dir: Path, path: str, data: bytes) -> dict:
    return {"repository": pin["repository"], "tag": pin["tag"], "commit": git_commit(git_dir, pin["tag"]),
            "path": path, "sha256": hashlib.sha256(data).hexdigest()}


def planner_flags(src: bytes) -> dict:
    """``--flag -> {type, choices, action}`` of every literal ``add_argument("--flag", ...)`` call in
    a Python file (planner_argparse.py, a worker's args.py)."""
    out: dict = {}
    for node in ast.walk(ast.parse(src.decode())):
        if not (isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument"):
            continue
        names = [a.value for a in node.args if isinstance(a, ast.Constant) and str(a.value).startswith("--")]
        kw = {k.arg: k.value for k in node.keywords}
        entry: dict = {}
        if "type" in kw and isinstance(kw["type"], ast.Name):
            entry["type"] = kw["type"].id
        for key in ("choices", "action"):
            if key in kw:
                try:
                    entry[key] = ast.literal_eval(kw[key])
                except ValueError:   # computed (e.g. sorted(VALID_CONNECTORS)): kept as source text
                    entry[key] = ast.unparse(kw[key])
        for n in names:
            out[n] = entry
    return out


def worker_names(src: bytes) -> dict:
    """backend -> {prefill, decode}: the DGD service names the SLA planner scales (defaults.py)."""
    tree = ast.parse(src.decode())
    classes: dict = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name.endswith("ComponentName"):
            vals = {t.targets[0].id: t.value.value for t in node.body
                    if isinstance(t, ast.Assign) and isinstance(t.targets[0], ast.Name)
                    and isinstance(t.value, ast.Constant)}
            classes[node.name] = {"prefill": vals.get("prefill_worker_k8s_name"),
                                  "decode": vals.get("decode_worker_k8s_name")}
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "WORKER_COMPONENT_NAMES":
            table = {ast.literal_eval(k): v.id for k, v in zip(node.value.keys, node.value.values)}  # type: ignore[attr-defined]
    return {backend: classes[cls] for backend, cls in table.items()}


def bundled_engines(pyproject: bytes) -> dict:
    """engine -> the version pin of its extra in Dynamo's pyproject.toml (what its runtime image holds)."""
    text = pyproject.decode()
    out = {}
    for engine, dist in (("vllm", "vllm"), ("sglang", "sglang"), ("trtllm", "tensorrt-llm")):
        m = re.search(rf'"{re.escape(dist)}(?:\[[^\]]*\])?==([^"]+)"', text)
        if m:
            out[engine] = m.group(1)
    return out


def dynamo_contract(git_dir: Path) -> dict:
    pin = PINS["dynamo"]
    crd = git_show(git_dir, pin["tag"], pin["path"])
    argp_path, defaults_path = f"{_PLANNER}/utils/planner_argparse.py", f"{_PLANNER}/defaults.py"
    argp, defaults = git_show(git_dir, pin["tag"], argp_path), git_show(git_dir, pin["tag"], defaults_path)
    pyproject = git_show(git_dir, pin["tag"], "pyproject.toml")
    workers = {}
    for program, path in _WORKER_ARGS.items():
        src = git_show(git_dir, pin["tag"], path)
        workers[program] = {"source": _source(pin, git_dir, path, src), "flags": planner_flags(src)}
    return {"platform": "dynamo", "name": pin["name"], "version": pin["version"], "kind": pin["kind"],
            "api_version": pin["api_version"], "source": _source(pin, git_dir, pin["path"], crd),
            "extracted_by": SCRIPT, "schema": crd_schema(crd, pin["api_version"]),
            "planner": {"source": [_source(pin, git_dir, argp_path, argp), _source(pin, git_dir, defaults_path, defaults)],
                        "flags": planner_flags(argp), "worker_services": worker_names(defaults)},
            "workers": workers,
            "bundled_engines": {"source": _source(pin, git_dir, "pyproject.toml", pyproject),
                                "versions": bundled_engines(pyproject)}}


def kserve_contract(git_dir: Path) -> dict:
    pin = PINS["kserve"]
    crd = git_show(git_dir, pin["tag"], pin["path"])
    return {"platform": "kserve", "name": pin["name"], "version": pin["version"], "kind": pin["kind"],
            "api_version": pin["api_version"], "source": _source(pin, git_dir, pin["path"], crd),
            "extracted_by": SCRIPT, "schema": crd_schema(crd, pin["api_version"])}


def llmd_contract(git_dir: Path) -> dict:
    pin = PINS["llmd"]
    raw = git_show(git_dir, pin["tag"], pin["path"])
    return {"platform": "llmd", "name": pin["name"], "version": pin["version"],
            "source": _source(pin, git_dir, pin["path"], raw), "extracted_by": SCRIPT,
            "schema": trim(json.loads(raw))}


def contract_path(platform: str) -> Path:
    pin = PINS[platform]
    stem = {"dynamo": "dynamo", "kserve": "kserve", "llmd": "llm-d-modelservice"}[platform]
    return OUT / f"{stem}-{pin['version']}.json"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", choices=sorted(PINS), action="append")
    ap.add_argument("--dynamo-git", type=Path, help="git directory of ai-dynamo/dynamo (holding tag v0.5.1)")
    ap.add_argument("--kserve-git", type=Path, help="git directory of kserve/kserve (holding tag v0.20.0)")
    ap.add_argument("--llmd-git", type=Path, help="git directory of llm-d-incubation/llm-d-modelservice")
    ap.add_argument("--read-from", action="append", default=[], metavar="PLATFORM=OWNER/NAME",
                    help="the git directory given is a fork's (holding the upstream tag): recorded in the contract")
    args = ap.parse_args(argv)
    read_from = dict(x.split("=", 1) for x in args.read_from)
    build = {"dynamo": (args.dynamo_git, dynamo_contract), "kserve": (args.kserve_git, kserve_contract),
             "llmd": (args.llmd_git, llmd_contract)}
    OUT.mkdir(parents=True, exist_ok=True)
    for platform in sorted(set(args.only or PINS)):
        git_dir, fn = build[platform]
        if git_dir is None:
            print(f"{platform}: skipped (give --{platform}-git)")
            continue
        c = fn(git_dir)
        if platform in read_from:
            c["source"]["read_from"] = (f"a snapshot of {read_from[platform]}, a fork holding the upstream tag "
                                        f"{c['source']['tag']} at the commit above")
        path = contract_path(platform)
        path.write_text(json.dumps(c, indent=None, sort_keys=True, separators=(",", ":")) + "\n")
        print(f"{path.relative_to(ROOT)}: {c['source']['repository']}@{c['source']['tag']} "
              f"({c['source']['commit'][:10]}), {path.stat().st_size:,} bytes")


if __name__ == "__main__":
    main()
