#!/usr/bin/env python3
"""Refresh tests/contracts/*.json: the argument definitions of the engine versions kvtune's launch
settings target, read from the engines' own published packages, so CI checks every emitted
launch line against them without installing any engine.

Run by hand (network to PyPI; a few minutes; the vLLM wheel is ~340 MB):

    python bench/refresh_engine_contracts.py                 # every engine below
    python bench/refresh_engine_contracts.py --only vllm     # one
    python bench/refresh_engine_contracts.py --only trtllm --trtllm-src PATH

What is read, per engine (each archive by ``pip download --no-deps``; its name and sha256 go into
the contract; only the files named are read, nothing is imported unless said):

- vLLM 0.33.0 (wheel): ``vllm serve``'s parser is built from config dataclasses
  (vllm/engine/arg_utils.py ``EngineArgs.add_cli_args``: ``add_argument("--flag", **get_kwargs(Cls)[field])``,
  vllm/entrypoints/common/cli_args.py ``make_arg_parser`` and ``FrontendArgs``). The script reads those
  calls and each field's annotation with ``ast`` and applies ``get_kwargs``' own rules
  (arg_utils.py ``_compute_kwargs``: a dataclass field takes JSON, bool makes ``--x/--no-x``,
  Literal gives choices, int/float/str their type); the config classes whose JSON kvtune emits
  (SpeculativeConfig, KVTransferConfig) are recorded field by field.
- SGLang 0.5.23 (wheel): ``ServerArgs`` fields annotated ``A[T, "help" | Arg(...)]``
  (srt/arg_groups/fields/*.py, srt/arg_groups/arg_utils.py ``add_cli_args_from_dataclass``: the flag
  is ``Arg.cli_name`` or the field name dashed, plus ``Arg.aliases``; bool is store_true; Literal
  gives choices) and the explicit ``parser.add_argument`` calls of srt/server_args.py.
- vllm-router 0.1.17, sglang-router 0.3.2 (wheels): ``router_args.RouterArgs.add_cli_args`` is
  plain argparse over the standard library: it is imported from the unpacked wheel (in a child
  process) and its parser's actions recorded.
- llama.cpp as vendored by llama-cpp-python 0.3.36 (sdist): ``common/arg.cpp``'s
  ``common_arg({"-x", "--long"}, "VALUE", ...)`` definitions and the examples each is
  ``.set_examples`` for (llama-server takes those with LLAMA_EXAMPLE_SERVER or no restriction).
- TensorRT-LLM 1.0.0: PyPI holds only a 1.6 kB stub that fetches the wheel from NVIDIA's own
  index, so the source is given with ``--trtllm-src`` (a checkout of NVIDIA/TensorRT-LLM at tag
  v1.0.0 = commit ae8270b7, or an unpacked 1.0.0 wheel): the pydantic fields of
  tensorrt_llm/llmapi/llm_args.py (TorchLlmArgs and the config classes the YAML sets, with Literal
  choices, and DecodingBaseConfig.from_dict's decoding_type table) and the click options of each
  command in tensorrt_llm/commands/serve.py (``serve`` is trtllm-serve itself, the others
  ``trtllm-serve NAME``). The sha256 recorded is of each file read; a PROVENANCE.json in or beside
  that tree goes into the contract as it is. ``--trtllm-bracket DIR`` adds a later revision's
  llm_args.py whose classes must also hold every key (for a tree read from before the tag).

  The committed contract was made without the tag's own files: neither a wheel nor the repository
  (about 2 GB, over the source tools' fetch limit) could be had, and the public code index these
  sessions search stores no file at ae8270b7. It was made from hand-transcribed, annotation-only
  extracts of the index's revisions (kept outside the repository, under the session's notes):
  serve.py at 4c05a748 and two llm_args.py revisions bracketing 1.0.0 (a 1.0.0rc one, whose literal
  sets are used, and a later one): ``--trtllm-src EXTRACT --trtllm-bracket LATER``. The contract's
  ``source.provenance`` says which index files and commits, how they were dated, and why one
  literal set (``CacheTransceiverConfig.backend``: upper case in 1.0.0, lower case in its release
  candidates) is taken from the later revision (``literal_sets_from_bracket``).
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import re
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "contracts"

PINS = {"vllm": ("vllm", "0.33.0"), "sglang": ("sglang", "0.5.23"), "vllm-router": ("vllm-router", "0.1.17"),
        "sglang-router": ("sglang-router", "0.3.2"), "llamacpp": ("llama-cpp-python", "0.3.36"),
        "trtllm": ("tensorrt-llm", "1.0.0")}
SCRIPT = "bench/refresh_engine_contracts.py"


# ---- archives --------------------------------------------------------------------------------

def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def download(dist: str, version: str, dest: Path, sdist: bool = False) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", f"{dist}=={version}", "-d", str(dest)]
    if sdist:
        cmd += ["--no-binary", ":all:"]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    norm = dist.replace("-", "_").lower()
    hits = [p for p in dest.iterdir() if p.name.lower().replace("-", "_").startswith(f"{norm}_{version}")]
    if not hits:
        raise SystemExit(f"pip download {dist}=={version}: no archive in {dest}")
    return hits[0]


def unpack_py(archive: Path, into: Path, suffixes=(".py",)) -> Path:
    if archive.suffix == ".whl":
        with zipfile.ZipFile(archive) as z:
            z.extractall(into, [n for n in z.namelist() if n.endswith(suffixes)])
    else:
        with tarfile.open(archive) as t:
            t.extractall(into, [m for m in t.getmembers() if m.name.endswith(suffixes)], filter="data")
    return into


def source(archive: Path, origin: str) -> dict:
    return {"archive": archive.name, "sha256": sha256(archive), "origin": origin}


# ---- annotations -> argparse kinds (vLLM's get_kwargs rules, SGLang's, pydantic's) ------------

class Index:
    """Module-level type aliases and classes of a source tree, by name."""

    def __init__(self, files: list[Path]):
        self.aliases: dict[str, ast.expr] = {}
        self.classes: dict[str, ast.ClassDef] = {}
        for f in files:
            try:
                tree = ast.parse(f.read_text(encoding="utf-8"))
            except (SyntaxError, UnicodeDecodeError):
                continue
            for node in tree.body:
                if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                    self.aliases.setdefault(node.targets[0].id, node.value)
                elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None \
                        and "TypeAlias" in ast.unparse(node.annotation):
                    self.aliases.setdefault(node.target.id, node.value)
                elif isinstance(node, getattr(ast, "TypeAlias", ())):
                    self.aliases.setdefault(node.name.id, node.value)
                elif isinstance(node, ast.ClassDef):
                    self.classes.setdefault(node.name, node)

    def fields(self, cls: str) -> dict[str, ast.expr]:
        """Annotated fields of ``cls`` and its bases found in the tree (bases first)."""
        node = self.classes.get(cls)
        if node is None:
            return {}
        out: dict[str, ast.expr] = {}
        for b in node.bases:
            name = ast.unparse(b).split(".")[-1].split("[")[0]
            if name != cls:
                out |= self.fields(name)
        for st in node.body:
            if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name) and "ClassVar" not in ast.unparse(st.annotation):
                out[st.target.id] = st.annotation
        return out

    def is_config_class(self, name: str) -> bool:
        node = self.classes.get(name)
        if node is None:
            return False
        decos = " ".join(ast.unparse(d) for d in node.decorator_list)
        bases = " ".join(ast.unparse(b) for b in node.bases)
        return "dataclass" in decos or "config" in decos or "BaseModel" in bases or "StrictBaseModel" in bases


def atoms(node: ast.expr | None, idx: Index, depth: int = 0) -> list[tuple]:
    """A type annotation as its union members: ('prim', name), ('literal', values), ('class', name),
    ('coll', name), ('none',)."""
    if node is None or depth > 12:
        return [("prim", "str")]
    if isinstance(node, ast.Constant):
        if node.value is None:
            return [("none",)]
        if isinstance(node.value, str):    # a string annotation
            try:
                return atoms(ast.parse(node.value, mode="eval").body, idx, depth + 1)
            except SyntaxError:
                return [("prim", "str")]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return atoms(node.left, idx, depth + 1) + atoms(node.right, idx, depth + 1)
    if isinstance(node, ast.Subscript):
        head = ast.unparse(node.value).split(".")[-1]
        sl = node.slice
        if head == "Literal":
            vals: list = []
            for e in (sl.elts if isinstance(sl, ast.Tuple) else [sl]):
                if isinstance(e, ast.Constant):
                    vals.append(e.value)
                else:   # Literal[OtherLiteral, ...]: that alias's values
                    vals += [v for a in atoms(e, idx, depth + 1) if a[0] == "literal" for v in a[1]]
            return [("literal", list(dict.fromkeys(vals)))]
        if head in ("Optional",):
            return atoms(sl, idx, depth + 1) + [("none",)]
        if head == "Union":
            return [a for e in (sl.elts if isinstance(sl, ast.Tuple) else [sl]) for a in atoms(e, idx, depth + 1)]
        if head in ("Annotated", "A"):
            first = sl.elts[0] if isinstance(sl, ast.Tuple) else sl
            return atoms(first, idx, depth + 1)
        if head.lower() in ("list", "tuple", "set", "sequence"):
            return [("coll", head.lower())]
        if head.lower() in ("dict", "mapping"):
            return [("prim", "dict")]
        return atoms(node.value, idx, depth + 1)
    if isinstance(node, (ast.Name, ast.Attribute)):
        name = ast.unparse(node).split(".")[-1]
        if name in ("int", "float", "bool", "str", "dict", "bytes"):
            return [("prim", name)]
        if name in ("list", "tuple", "set"):
            return [("coll", name)]
        if name == "None":
            return [("none",)]
        if name in idx.aliases:
            return atoms(idx.aliases[name], idx, depth + 1)
        if idx.is_config_class(name):
            return [("class", name)]
        return [("prim", "other")]
    return [("prim", "other")]


def vllm_kind(ann: ast.expr, idx: Index) -> dict:
    """What vLLM 0.33.0's ``_compute_kwargs`` makes of a field (arg_utils.py), as a contract entry."""
    at = atoms(ann, idx)
    prims = {a[1] for a in at if a[0] == "prim"}
    nullable = any(a[0] == "none" for a in at)
    literals = [v for a in at if a[0] == "literal" for v in a[1]]
    if any(a[0] == "class" for a in at):
        return {"type": "json", "config": next(a[1] for a in at if a[0] == "class")}
    if prims == {"bool", "str"} and nullable and not literals:
        return {"type": "str", "nargs": "?"}
    if "bool" in prims:
        return {"type": "bool", "negatable": True}
    if literals:
        return {"type": "int" if all(isinstance(v, int) for v in literals) else "str", "choices": literals,
                "nullable": nullable}
    if any(a[0] == "coll" for a in at):
        return {"type": "str", "nargs": "+"}
    for t in ("int", "float"):
        if t in prims:
            return {"type": t, "nullable": nullable}
    if "dict" in prims:
        return {"type": "json"}
    return {"type": "str", "nullable": nullable}


def field_kind(ann: ast.expr, idx: Index) -> dict:
    """A config-class field (the JSON/YAML keys kvtune writes): type and literal choices."""
    at = atoms(ann, idx)
    prims = {a[1] for a in at if a[0] == "prim"}
    literals = [v for a in at if a[0] == "literal" for v in a[1]]
    out: dict = {"nullable": any(a[0] == "none" for a in at)}
    if literals:
        out |= {"type": "literal", "choices": literals}
    elif any(a[0] == "class" for a in at):
        out |= {"type": "object", "config": next(a[1] for a in at if a[0] == "class")}
    elif "bool" in prims:
        out["type"] = "bool"
    elif "int" in prims:
        out["type"] = "float" if "float" in prims else "int"
    elif "float" in prims:
        out["type"] = "float"
    elif "dict" in prims:
        out["type"] = "object"
    elif any(a[0] == "coll" for a in at):
        out["type"] = "list"
    else:
        out["type"] = "str"
    return out


def _str_args(call: ast.Call) -> list[str]:
    return [a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]


def _explicit_kind(call: ast.Call, idx: Index, consts: dict) -> dict:
    kw = {k.arg: k.value for k in call.keywords if k.arg}
    action = ast.unparse(kw["action"]) if "action" in kw else ""
    if "store_true" in action or "store_false" in action:
        return {"type": "flag"}
    if "BooleanOptionalAction" in action:
        return {"type": "bool", "negatable": True}
    out: dict = {"type": ast.unparse(kw["type"]).split(".")[-1] if "type" in kw else "str"}
    if out["type"] not in ("int", "float", "str"):
        out["type"] = "str"
    if "choices" in kw:
        ch = kw["choices"]
        if isinstance(ch, (ast.List, ast.Tuple, ast.Set)):
            out["choices"] = [e.value for e in ch.elts if isinstance(e, ast.Constant)]
        elif isinstance(ch, ast.Name) and ch.id in consts:
            out["choices"] = consts[ch.id]
        else:
            out["choices_dynamic"] = ast.unparse(ch)
    if "nargs" in kw:
        out["nargs"] = ast.unparse(kw["nargs"]).strip("'\"")
    return out


def _module_consts(tree: ast.Module) -> dict:
    out = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) \
                and isinstance(node.value, (ast.List, ast.Tuple)):
            vals = [e.value for e in node.value.elts if isinstance(e, ast.Constant)]
            if len(vals) == len(node.value.elts):
                out[node.targets[0].id] = vals
    return out


# ---- vLLM ------------------------------------------------------------------------------------

def vllm_contract(root: Path, src: dict) -> dict:
    files = sorted((root / "vllm").rglob("*.py"))
    idx = Index(files)
    flags: dict[str, dict] = {}

    def add(names: list[str], kind: dict, where: str) -> None:
        for n in names:
            if n.startswith("-"):
                flags[n] = dict(kind, where=where)
        if kind.get("negatable"):
            for n in names:
                if n.startswith("--"):
                    flags["--no-" + n[2:]] = dict(kind, where=where, negation_of=n)

    for rel in ("vllm/engine/arg_utils.py", "vllm/entrypoints/common/cli_args.py"):
        tree = ast.parse((root / rel).read_text())
        consts = _module_consts(tree)
        kw_vars: dict[str, str] = {}
        for node in ast.walk(tree):
            # X_kwargs = get_kwargs(Cls)  /  X = get_kwargs(Cls)["field"]
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                v = node.value
                if isinstance(v, ast.Call) and ast.unparse(v.func).endswith("get_kwargs") and v.args:
                    kw_vars[node.targets[0].id] = ast.unparse(v.args[0])
            if isinstance(node, ast.Call) and ast.unparse(node.func).endswith("add_argument"):
                names = _str_args(node)
                if not names:
                    continue
                star = [k.value for k in node.keywords if k.arg is None]
                if star and isinstance(star[0], ast.Dict):   # **{**X["field"], "default": None}
                    star = [v for k, v in zip(star[0].keys, star[0].values) if k is None] or star
                if star and isinstance(star[0], ast.Subscript) and isinstance(star[0].value, ast.Name) \
                        and star[0].value.id in kw_vars:
                    cls = kw_vars[star[0].value.id]
                    fname = ast.literal_eval(star[0].slice)
                    ann = idx.fields(cls).get(fname)
                    kind = vllm_kind(ann, idx) if ann is not None else {"type": "str"}
                    add(names, kind | {"field": f"{cls}.{fname}"}, rel)
                else:
                    add(names, _explicit_kind(node, idx, consts), rel)
    # FrontendArgs: one flag per field, --name-with-dashes (cli_args.py BaseFrontendArgs.add_cli_args)
    for cls in ("BaseFrontendArgs", "FrontendArgs"):
        for fname, ann in idx.fields(cls).items():
            add([f"--{fname.replace('_', '-')}"], vllm_kind(ann, idx) | {"field": f"{cls}.{fname}"},
                "vllm/entrypoints/common/cli_args.py")
    configs = {c: {f: field_kind(a, idx) for f, a in idx.fields(c).items()}
               for c in ("SpeculativeConfig", "KVTransferConfig")}
    return {"engine": "vllm", "name": "vLLM", "version": PINS["vllm"][1], "source": src, "extracted_by": SCRIPT,
            "programs": {"vllm serve": {"positional": ["model_tag"], "flags": dict(sorted(flags.items()))}},
            "configs": configs}


# ---- SGLang ----------------------------------------------------------------------------------

def sglang_contract(root: Path, src: dict) -> dict:
    base = root / "sglang" / "srt"
    idx = Index(sorted((root / "sglang").rglob("*.py")))
    flags: dict[str, dict] = {}
    for f in sorted((base / "arg_groups" / "fields").glob("*.py")):
        tree = ast.parse(f.read_text())
        for node in ast.walk(tree):
            if not isinstance(node, ast.ClassDef):
                continue
            for st in node.body:
                if not (isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name)):
                    continue
                ann = st.annotation
                if not (isinstance(ann, ast.Subscript) and ast.unparse(ann.value) in ("A", "Annotated")):
                    continue
                elts = ann.slice.elts if isinstance(ann.slice, ast.Tuple) else [ann.slice]
                meta = elts[1] if len(elts) > 1 else None
                arg_kw: dict = {}
                if isinstance(meta, ast.Call) and ast.unparse(meta.func).endswith("Arg"):
                    arg_kw = {k.arg: k.value for k in meta.keywords if k.arg}
                    if "no_cli" in arg_kw and ast.unparse(arg_kw["no_cli"]) == "True":
                        continue
                elif not (isinstance(meta, ast.Constant) and isinstance(meta.value, str)) and \
                        not isinstance(meta, ast.JoinedStr) and not isinstance(meta, ast.BinOp):
                    continue
                name = st.target.id
                cli = arg_kw.get("cli_name")
                names = [cli.value if isinstance(cli, ast.Constant) else "--" + name.replace("_", "-")]
                if "aliases" in arg_kw and isinstance(arg_kw["aliases"], (ast.List, ast.Tuple)):
                    names += [e.value for e in arg_kw["aliases"].elts if isinstance(e, ast.Constant)]
                at = atoms(elts[0], idx)
                prims = {a[1] for a in at if a[0] == "prim"}
                literals = [v for a in at if a[0] == "literal" for v in a[1]]
                if "action" in arg_kw:
                    kind: dict = {"type": "flag" if "store" in ast.unparse(arg_kw["action"]) else "str"}
                elif "bool" in prims and not literals:
                    kind = {"type": "flag"}
                elif literals:
                    kind = {"type": "int" if all(isinstance(v, int) for v in literals) else "str",
                            "choices": literals}
                elif "choices" in arg_kw and isinstance(arg_kw["choices"], (ast.List, ast.Tuple)):
                    kind = {"type": "str", "choices": [e.value for e in arg_kw["choices"].elts
                                                       if isinstance(e, ast.Constant)]}
                elif "int" in prims:
                    kind = {"type": "int"}
                elif "float" in prims:
                    kind = {"type": "float"}
                elif any(a[0] == "coll" for a in at):
                    kind = {"type": "str", "nargs": "+"}
                else:
                    kind = {"type": "str"}
                if "choices" in arg_kw and "choices" not in kind:
                    ch = arg_kw["choices"]
                    ref = idx.aliases.get(ch.id) if isinstance(ch, ast.Name) else None
                    if isinstance(ref, (ast.List, ast.Tuple, ast.Set)) and all(isinstance(e, ast.Constant)
                                                                               for e in ref.elts):
                        kind["choices"] = [e.value for e in ref.elts]
                    else:
                        kind["choices_dynamic"] = ast.unparse(ch)
                for n in names:
                    flags[n] = dict(kind, field=f"{node.name}.{name}",
                                    where=str(f.relative_to(root)))
    tree = ast.parse((base / "server_args.py").read_text())
    consts = _module_consts(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and ast.unparse(node.func).endswith("add_argument"):
            names = [n for n in _str_args(node) if n.startswith("-")]
            for n in names:
                flags[n] = dict(_explicit_kind(node, idx, consts), where="sglang/srt/server_args.py")
    return {"engine": "sglang", "name": "SGLang", "version": PINS["sglang"][1], "source": src, "extracted_by": SCRIPT,
            "programs": {"python -m sglang.launch_server": {"flags": dict(sorted(flags.items()))}}}


# ---- the routers: their own argparse, imported from the unpacked wheel ------------------------

_DUMP_ROUTER = r"""
import argparse, importlib, json, sys
ra = importlib.import_module(sys.argv[1] + ".router_args")
p = argparse.ArgumentParser()
ra.RouterArgs.add_cli_args(p, use_router_prefix=False)
out = {}
for a in p._actions:
    if not a.option_strings or a.dest == "help":
        continue
    kind = {"type": "flag"} if a.nargs == 0 else {"type": getattr(a.type, "__name__", "str") if a.type else "str"}
    if kind["type"] not in ("flag", "int", "float", "str"):
        kind["type"] = "str"
    if a.choices is not None:
        kind["choices"] = list(a.choices)
    if a.nargs not in (None, 0):
        kind["nargs"] = a.nargs
    for n in a.option_strings:
        out[n] = kind
print(json.dumps(out))
"""


def router_contract(key: str, module: str, root: Path, src: dict, program: str) -> dict:
    res = subprocess.run([sys.executable, "-c", _DUMP_ROUTER, module], cwd=root, capture_output=True, text=True,
                         check=True)
    flags = json.loads(res.stdout)
    return {"engine": key, "name": key, "version": PINS[key][1], "source": src, "extracted_by": SCRIPT,
            "programs": {program: {"flags": dict(sorted(flags.items()))}}}


# ---- llama.cpp -------------------------------------------------------------------------------

def llamacpp_contract(arg_cpp: Path, src: dict, commit: str) -> dict:
    text = arg_cpp.read_text()
    flags: dict[str, dict] = {}
    # each option: add_opt(common_arg(\n {"-x", "--long"}, ["VALUE",] "help"...) ... ) [.set_examples({...})]
    starts = [m.start() for m in re.finditer(r"common_arg\(", text)] + [len(text)]
    for a, b in zip(starts, starts[1:]):
        chunk = text[a:b]
        m = re.match(r"common_arg\(\s*\{([^}]*)\}\s*,\s*(?:\{([^}]*)\}\s*,)?", chunk)
        if not m:
            continue
        names = re.findall(r"\"(-[^\"]+)\"", m.group(1))
        negs = re.findall(r"\"(-[^\"]+)\"", m.group(2) or "")
        # the handler's signature says what the option takes: (params) a bare flag, (params, bool)
        # a flag with its negation, (params, int|float|std::string ...) a value
        h = re.search(r"\[\]\(common_params\s*&\s*\w*\s*(?:,\s*([^)]*))?\)", chunk)
        arg = (h.group(1) or "").strip() if h else ""
        if not arg or arg.startswith("bool"):
            kind = "flag"
        elif arg.startswith("int"):
            kind = "int"
        elif arg.startswith("float") or arg.startswith("double"):
            kind = "float"
        else:
            kind = "str"
        ex = re.search(r"\.set_examples\(\{([^}]*)\}\)", chunk)
        examples = re.findall(r"LLAMA_EXAMPLE_[A-Z_]+", ex.group(1)) if ex else []
        excl = re.search(r"\.set_excludes\(\{([^}]*)\}\)", chunk)
        excludes = re.findall(r"LLAMA_EXAMPLE_[A-Z_]+", excl.group(1)) if excl else []
        # LLAMA_EXAMPLE_COMMON: every program (common_params_parser_init keeps options of the program or COMMON)
        server = ((not examples or "LLAMA_EXAMPLE_SERVER" in examples or "LLAMA_EXAMPLE_COMMON" in examples)
                  and "LLAMA_EXAMPLE_SERVER" not in excludes)
        for n in names:
            flags[n] = {"type": kind, "server": server}
        for n in negs:
            flags[n] = {"type": "flag", "server": server}
    return {"engine": "llamacpp", "name": "llama.cpp llama-server", "version": commit, "source": src,
            "extracted_by": SCRIPT,
            "programs": {"llama-server": {"flags": {k: v for k, v in sorted(flags.items()) if v["server"]}}}}


# ---- TensorRT-LLM ----------------------------------------------------------------------------

TRTLLM_CLASSES = ("TorchLlmArgs", "KvCacheConfig", "CacheTransceiverConfig", "DecodingBaseConfig",
                  "EagleDecodingConfig", "MTPDecodingConfig", "NGramDecodingConfig", "DraftTargetDecodingConfig")


def _click_kind(node: ast.Call) -> dict:
    kw = {k.arg: k.value for k in node.keywords if k.arg}
    kind: dict = {"type": "flag" if "is_flag" in kw else "str"}
    if "type" in kw:
        t = ast.unparse(kw["type"])
        if t in ("int", "float", "str"):
            kind["type"] = t
        elif "Choice" in t and isinstance(kw["type"], ast.Call) and kw["type"].args:
            ch = kw["type"].args[0]
            if isinstance(ch, (ast.List, ast.Tuple)):
                kind["choices"] = [e.value for e in ch.elts if isinstance(e, ast.Constant)]
    return kind


def click_programs(serve: Path, base: str = "trtllm-serve") -> dict:
    """The click commands of tensorrt_llm/commands/serve.py, each with its options: ``serve`` is
    trtllm-serve's default command (DefaultGroup), the others are ``trtllm-serve NAME``."""
    programs: dict[str, dict] = {}
    for fn in ast.walk(ast.parse(serve.read_text())):
        if not isinstance(fn, ast.FunctionDef):
            continue
        name, flags = None, {}
        for d in fn.decorator_list:
            if not isinstance(d, ast.Call):
                continue
            func = ast.unparse(d.func)
            if func.endswith("click.command"):
                name = (_str_args(d) or [fn.name])[0]
            elif func.endswith("click.option"):
                for n in (n for n in _str_args(d) if n.startswith("-")):
                    flags[n] = _click_kind(d)
        if name is not None:
            prog = base if name == "serve" else f"{base} {name}"
            programs[prog] = {"flags": dict(sorted(flags.items()))}
    return programs


def decoding_types(llm_args: Path) -> dict:
    """DecodingBaseConfig.from_dict's table: the YAML's speculative_config.decoding_type -> class."""
    for node in ast.walk(ast.parse(llm_args.read_text())):
        if isinstance(node, ast.Dict) and node.keys and all(isinstance(k, ast.Constant) for k in node.keys) \
                and any(getattr(k, "value", None) == "Eagle" for k in node.keys):
            return {k.value: ast.unparse(v) for k, v in zip(node.keys, node.values)}   # type: ignore[union-attr]
    return {}


def trtllm_contract(src_root: Path, bracket: Path | None = None) -> dict:
    """TensorRT-LLM from a source tree (or the extract of one, with PROVENANCE.json beside it);
    ``bracket``: llm_args.py of a later revision, so that a key must exist on both sides of the
    version (its literal sets and types are not held: the pinned side's are)."""
    llm_args = next(iter(sorted(src_root.rglob("llmapi/llm_args.py"))), None)
    serve = next(iter(sorted(src_root.rglob("commands/serve.py"))), None)
    if llm_args is None or serve is None:
        raise SystemExit(f"--trtllm-src {src_root}: needs tensorrt_llm/llmapi/llm_args.py and "
                         f"tensorrt_llm/commands/serve.py under it")
    idx = Index([llm_args])
    configs = {c: {f: field_kind(a, idx) for f, a in idx.fields(c).items()} for c in TRTLLM_CLASSES}
    files = {str(p.relative_to(src_root)): sha256(p) for p in (llm_args, serve)}
    source: dict = {"archive": f"source tree {src_root.name}", "files_sha256": files}
    prov = next((p / "PROVENANCE.json" for p in (src_root, src_root.parent) if (p / "PROVENANCE.json").exists()),
                None)
    if prov is not None:
        source["provenance"] = json.loads(prov.read_text())
        source["origin"] = "NVIDIA/TensorRT-LLM files as stored in a public code index (see provenance)"
    else:
        source["origin"] = "--trtllm-src (NVIDIA/TensorRT-LLM v1.0.0)"
    out = {"engine": "trtllm", "name": "TensorRT-LLM", "version": PINS["trtllm"][1], "source": source,
           "extracted_by": SCRIPT, "programs": click_programs(serve), "configs": configs,
           "decoding_types": decoding_types(llm_args)}
    if bracket is not None:
        later = next(iter(sorted(bracket.rglob("llmapi/llm_args.py"))), None)
        if later is None:
            raise SystemExit(f"--trtllm-bracket {bracket}: no tensorrt_llm/llmapi/llm_args.py under it")
        lidx = Index([later])
        out["bracket"] = {"files_sha256": {str(later.relative_to(bracket)): sha256(later)},
                          "configs": {c: {f: field_kind(a, lidx) for f, a in lidx.fields(c).items()}
                                      for c in TRTLLM_CLASSES},
                          "decoding_types": decoding_types(later)}
        # a literal set the provenance shows the tag shares with the later revision, not the earlier one
        for dotted in source.get("provenance", {}).get("literal_sets_from_bracket", []):
            cls, field = dotted.split(".")
            configs[cls][field] = out["bracket"]["configs"][cls][field]
    return out


# ---- main ------------------------------------------------------------------------------------

def write(contract: dict, name: str) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / name
    path.write_text(json.dumps(contract, indent=1, sort_keys=False) + "\n")
    n = sum(len(p["flags"]) for p in contract["programs"].values())
    print(f"{path.relative_to(ROOT)}: {n} flags" + (f", {len(contract.get('configs', {}))} config classes"
                                                    if contract.get("configs") else ""))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", choices=sorted(PINS), action="append")
    ap.add_argument("--download-dir", type=Path, help="reuse archives here (default: a temporary folder)")
    ap.add_argument("--trtllm-src", type=Path, help="a TensorRT-LLM v1.0.0 source tree or unpacked wheel")
    ap.add_argument("--trtllm-bracket", type=Path, help="a later TensorRT-LLM tree whose llm_args.py must also "
                                                        "hold every key (when the pinned tree is a revision "
                                                        "before the tag)")
    args = ap.parse_args(argv)
    only = set(args.only or PINS)
    with tempfile.TemporaryDirectory() as tmp:
        dl = args.download_dir or Path(tmp) / "dl"
        dl.mkdir(parents=True, exist_ok=True)
        work = Path(tmp) / "src"
        if "vllm" in only:
            a = download("vllm", PINS["vllm"][1], dl)
            write(vllm_contract(unpack_py(a, work / "vllm"), source(a, "PyPI")), f"vllm-{PINS['vllm'][1]}.json")
        if "sglang" in only:
            a = download("sglang", PINS["sglang"][1], dl)
            write(sglang_contract(unpack_py(a, work / "sglang"), source(a, "PyPI")),
                  f"sglang-{PINS['sglang'][1]}.json")
        for key, module, program in (("vllm-router", "vllm_router", "vllm-router"),
                                     ("sglang-router", "sglang_router", "python -m sglang_router.launch_router")):
            if key in only:
                a = download(key, PINS[key][1], dl)
                root = work / key
                with zipfile.ZipFile(a) as z:
                    z.extractall(root)
                write(router_contract(key, module, root, source(a, "PyPI"), program), f"{key}-{PINS[key][1]}.json")
        if "llamacpp" in only:
            a = download("llama-cpp-python", PINS["llamacpp"][1], dl, sdist=True)
            root = unpack_py(a, work / "llamacpp", suffixes=("common/arg.cpp",))
            arg_cpp = next(root.rglob("vendor/llama.cpp/common/arg.cpp"))
            commit = "0c1e57098"   # the llama.cpp commit llama-cpp-python 0.3.36 vendors (optimizer/launch/llamacpp.py VERSION)
            write(llamacpp_contract(arg_cpp, source(a, "PyPI sdist (vendor/llama.cpp/common/arg.cpp)"), commit),
                  f"llamacpp-{commit}.json")
        if "trtllm" in only:
            if args.trtllm_src is None:
                print("trtllm: skipped (PyPI has no TensorRT-LLM 1.0.0 wheel; give --trtllm-src)")
            else:
                write(trtllm_contract(args.trtllm_src, args.trtllm_bracket), f"tensorrt-llm-{PINS['trtllm'][1]}.json")


if __name__ == "__main__":
    main()
