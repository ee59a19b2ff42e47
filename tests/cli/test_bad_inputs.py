"""A hostile user's corpus: every command, fed bad files, bad numbers, bad flags and broken storage.

Each case runs the CLI in-process (click's CliRunner) and must end with exit 2 (bad input) or 3
(valid but unservable), exactly one ``Error:`` line on stderr that names the file, the key and the
value (the case lists the pieces it must name), no traceback, and nothing half-written: the
output paths a case passes (``--json``, ``--report``, ``-o``) do not exist afterwards and the
output folder holds no temporary files.

``CASES`` is built by one small function per kind; ``test_corpus_size`` keeps the count honest.
"""

from __future__ import annotations

import json
import math
import os
import pytest
import sqlite3
import threading
import time
import yaml
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from click.testing import CliRunner
from kvtune.costmodel.files import UNFORESEEN
from kvtune.optimizer.cli import main
from kvtune.costmodel.errors import InputError
from kvtune.costmodel.models import model_from_config
from kvtune.costmodel.profile_table import contradictions, read_table
from kvtune.optimizer.storage import check_journal, check_storage_url
from kvtune.optimizer.workload import load_workload, load_workload_dict

ROOT = Path(__file__).parent.resolve().parent.parent
DATA = Path(__file__).parent.parent / "data"
TRACES = ROOT / "examples" / "traces"
MODELS = ROOT / "profiles" / "models"


@dataclass
class Case:
    id: str
    kind: str
    argv: list[str]                        # "{d}" is replaced by the case's folder
    files: dict[str, str | bytes | Sparse] = field(default_factory=dict)
    names: tuple[str, ...] = ()            # pieces the Error line must hold (file, key, value)
    code: int = 2
    outputs: tuple[str, ...] = ()          # paths (relative to the folder) that must not exist afterwards
    whole: tuple[str, ...] = ()            # exit 3: result files that may be written, but whole
    once: tuple[str, ...] = ()             # pieces the Error line holds exactly once (no doubled prefix)
    absent: tuple[str, ...] = ()           # pieces the Error line must not hold (a raw control character)


@dataclass(frozen=True)
class Sparse:
    """A file of ``size`` bytes written as a hole (no disk used): for the size limits."""

    size: int


CASES: list[Case] = []


def case(*a, **k) -> None:
    c = Case(*a, **k)
    assert (c.kind, c.id) not in {(x.kind, x.id) for x in CASES}, c.id
    CASES.append(c)


# ---- the good files every case starts from ------------------------------------------------------

BASE = {"model": "llama-3.1-8b",
        "hardware": {"gpu": "h100-sxm", "usd_per_gpu_hour": 3.0},
        "workload": {"rate_req_s": 5,
                     "classes": [{"name": "chat", "share": 1.0, "input_tokens": 512, "output_tokens": 64}]},
        "slo": {"ttft_ms": 1000, "tpot_ms": 50},
        "search": {"tp": [1], "batch_cap": [8, 64], "kv_dtype": ["bf16"], "chunk_tokens": [2048, 2048], "trials": 2}}

RAW = "@@RAW@@"


def wl_text(edits: dict | None = None, raw: str | None = None) -> str:
    """BASE with ``edits`` ({"a.b[0].c": value, None value: delete}); ``RAW`` in a value is replaced
    by ``raw`` verbatim in the YAML text (numbers PyYAML cannot write: 1e400, 1 and 400 zeros)."""
    import copy

    d = copy.deepcopy(BASE)
    for path, v in (edits or {}).items():
        keys = []
        for part in path.split("."):
            if "[" in part:
                name, idx = part[:-1].split("[")
                keys += [name, int(idx)]
            else:
                keys.append(part)
        obj = d
        for k in keys[:-1]:
            obj = obj[k]
        if v is DELETE:
            del obj[keys[-1]]
        else:
            obj[keys[-1]] = v
    text = yaml.safe_dump(d, sort_keys=False)
    if raw is not None:
        text = text.replace(f"'{RAW}'", raw).replace(RAW, raw)
    return text


DELETE = object()
COMMANDS = ("simulate", "goodput", "solve")


def wl_argv(cmd: str, f: str = "w.yaml") -> list[str]:
    if cmd == "solve":
        return ["solve", "{d}/" + f, "--quiet", "--json", "{d}/out/r.json", "--report", "{d}/out/rep"]
    if cmd == "simulate":
        return ["simulate", "{d}/" + f, "--requests", "20", "--json"]
    return ["goodput", "{d}/" + f, "--requests", "20", "--json"]


WL_OUT = ("out/r.json", "out/rep")


def wl_case(cid: str, kind: str, text: str | bytes | Sparse, names: tuple[str, ...], extra: dict | None = None,
            cmds: tuple[str, ...] = COMMANDS, code: int = 2, file: str = "w.yaml") -> None:
    """One workload file run through each command in ``cmds`` (one case per command); the error
    must name ``file`` (the workload, or the file it points to that is at fault)."""
    for cmd in cmds:
        case(f"{cid}-{cmd}", kind, wl_argv(cmd), {"w.yaml": text, **(extra or {})}, (file,) + names, code,
             WL_OUT if cmd == "solve" else ())


# ---- workload YAML: structure and values ---------------------------------------------------------

def _workload_cases() -> None:
    k = "workload-value"
    bad = [
        ("rate-neg", {"workload.rate_req_s": -2}, ("workload.rate_req_s", "-2")),
        ("rate-zero", {"workload.rate_req_s": 0}, ("workload.rate_req_s", "0")),
        ("rate-nan", {"workload.rate_req_s": math.nan}, ("workload.rate_req_s", "nan")),
        ("rate-str", {"workload.rate_req_s": "fast"}, ("workload.rate_req_s", "fast")),
        ("rate-tiny", {"workload.rate_req_s": 1e-300}, ("workload.rate_req_s", "1e-300")),
        ("rate-list", {"workload.rate_req_s": [1, 2]}, ("workload.rate_req_s", "[1, 2]")),
        ("share-sum", {"workload.classes[0].share": 0.5}, ("share", "0.5")),
        ("share-neg", {"workload.classes[0].share": -1}, ("share", "-1")),
        ("share-nan", {"workload.classes[0].share": math.nan}, ("share", "nan")),
        ("input-zero", {"workload.classes[0].input_tokens": 0}, ("input_tokens", "0")),
        ("input-neg", {"workload.classes[0].input_tokens": -5}, ("input_tokens", "-5")),
        ("input-frac", {"workload.classes[0].input_tokens": 10.5}, ("input_tokens", "10.5")),
        ("input-bool", {"workload.classes[0].input_tokens": True}, ("input_tokens", "True")),
        ("input-null", {"workload.classes[0].input_tokens": None}, ("input_tokens",)),
        ("input-huge", {"workload.classes[0].input_tokens": 10**23}, ("input_tokens", "1000000000")),
        ("dist-list", {"workload.classes[0].input_tokens": {"dist": ["uniform"], "min": 1, "max": 9}},
         ("input_tokens.dist", "['uniform']")),
        ("dist-unknown", {"workload.classes[0].input_tokens": {"dist": "zipf", "mean": 3}}, ("dist", "zipf")),
        ("dist-missing", {"workload.classes[0].input_tokens": {"mean": 300, "sigma": 1}}, ("input_tokens.dist",)),
        ("dist-extra-key", {"workload.classes[0].input_tokens": {"dist": "fixed", "value": 9, "sigma": 1}},
         ("input_tokens.sigma",)),
        ("uniform-max-1e20", {"workload.classes[0].input_tokens": {"dist": "uniform", "min": 1, "max": 1e20}},
         ("input_tokens.max", "1e+20")),
        ("uniform-inverted", {"workload.classes[0].input_tokens": {"dist": "uniform", "min": 90, "max": 9}},
         ("input_tokens.max", "9")),
        ("lognormal-mean-neg", {"workload.classes[0].input_tokens": {"dist": "lognormal", "mean": -3, "sigma": 1}},
         ("input_tokens.mean", "-3")),
        ("lognormal-sigma-inf", {"workload.classes[0].input_tokens": {"dist": "lognormal", "mean": 300,
                                                                      "sigma": math.inf}},
         ("input_tokens.sigma", "inf")),
        ("normal-std-nan", {"workload.classes[0].output_tokens": {"dist": "normal", "mean": 30, "std": math.nan}},
         ("output_tokens.std", "nan")),
        ("fixed-value-str", {"workload.classes[0].output_tokens": {"dist": "fixed", "value": "ten"}},
         ("output_tokens.value", "ten")),
        ("prefix-over-input", {"workload.classes[0].prefix_tokens": 600}, ("prefix_tokens", "600")),
        ("prefix-neg", {"workload.classes[0].prefix_tokens": -1}, ("prefix_tokens", "-1")),
        ("class-slo-zero", {"workload.classes[0].slo": {"ttft_ms": 0}}, ("slo.ttft_ms", "0")),
        ("class-unknown-key", {"workload.classes[0].colour": "red"}, ("classes[0].colour",)),
        ("class-name-list", {"workload.classes[0].name": ["a"]}, ("classes[0].name", "['a']")),
        ("classes-empty", {"workload.classes": []}, ("workload.classes", "[]")),
        ("classes-mapping", {"workload.classes": {"a": 1}}, ("workload.classes", "{'a': 1}")),
        ("slo-neg", {"slo.tpot_ms": -1}, ("slo.tpot_ms", "-1")),
        ("slo-inf", {"slo.ttft_ms": math.inf}, ("slo.ttft_ms", "inf")),
        ("slo-attain-2", {"slo.attainment": 2}, ("slo.attainment", "2")),
        ("slo-empty", {"slo": {}}, ("slo", "{}")),
        ("slo-str", {"slo": "fast"}, ("slo", "fast")),
        ("usd-inf", {"hardware.usd_per_gpu_hour": math.inf}, ("hardware.usd_per_gpu_hour", "inf")),
        ("usd-zero", {"hardware.usd_per_gpu_hour": 0}, ("hardware.usd_per_gpu_hour", "0")),
        ("usd-huge", {"hardware.usd_per_gpu_hour": 1e300}, ("hardware.usd_per_gpu_hour", "1e+300")),
        ("gpus-per-node-0", {"hardware.gpus_per_node": 0}, ("hardware.gpus_per_node", "0")),
        ("gpus-per-node-huge", {"hardware.gpus_per_node": 10**12}, ("hardware.gpus_per_node", "1000000000000")),
        ("max-nodes-frac", {"hardware.max_nodes": 1.5}, ("hardware.max_nodes", "1.5")),
        ("gpu-unknown", {"hardware.gpu": "tpu-v9"}, ("hardware.gpu", "tpu-v9")),
        ("gpu-int", {"hardware.gpu": 100}, ("hardware.gpu", "100")),
        ("hardware-missing", {"hardware": DELETE}, ("hardware",)),
        ("model-unknown", {"model": "gpt-17"}, ("model", "gpt-17")),
        ("model-number", {"model": 8}, ("model", "8")),
        ("weights-int3", {"weights": "int3"}, ("weights", "int3")),
        ("engine-tgi", {"engine": "tgi"}, ("engine", "tgi")),
        ("engine-list", {"engine": ["vllm"]}, ("engine", "['vllm']")),
        ("gpu-mem-util-0", {"gpu_mem_util": 0}, ("gpu_mem_util", "0")),
        ("gpu-mem-util-nan", {"gpu_mem_util": math.nan}, ("gpu_mem_util", "nan")),
        ("objective-fast", {"objective": "fastest"}, ("objective", "fastest")),
        ("unknown-top-key", {"modle": "x"}, ("modle",)),
        ("key-with-newline", {"workload.classes[0].share\nx": 1}, ("workload.classes[0].share\\nx",)),
        ("value-with-newline", {"model": "llama\n3.1"}, ("model", "llama\\n3.1")),
        ("search-tp-0", {"search.tp": [0]}, ("search.tp[0]", "0")),
        ("search-tp-16", {"search.tp": [16]}, ("search.tp", "16")),
        ("search-batch-inverted", {"search.batch_cap": [64, 8]}, ("search.batch_cap", "[64, 8]")),
        ("search-batch-str", {"search.batch_cap": "big"}, ("search.batch_cap", "big")),
        ("search-kv-int4", {"search.kv_dtype": ["int4"]}, ("search.kv_dtype[0]", "int4")),
        ("search-trials-0", {"search.trials": 0}, ("search.trials", "0")),
        ("search-seed-neg", {"search.seed": -1}, ("search.seed", "-1")),
        ("search-seed-2to40", {"search.seed": 2**40}, ("search.seed", str(2**40))),
        ("search-spec-no-section", {"search.spec_k": [0, 4]}, ("search.spec_k", "[0, 4]")),
        ("search-unknown", {"search.depth": 3}, ("search.depth",)),
        ("spec-acceptance-2", {"speculative": {"method": "eagle3", "acceptance": 2}},
         ("speculative.acceptance", "2")),
        ("spec-draft-nan", {"speculative": {"method": "eagle3", "acceptance": 0.7, "draft_cost": math.nan}},
         ("speculative.draft_cost", "nan")),
        ("spec-k-huge", {"speculative": {"method": "eagle3", "acceptance": 0.7}, "search.spec_k": [0, 10**6]},
         ("search.spec_k[1]", "1000000")),
        ("time-scale-with-classes", {"workload.time_scale": 2}, ("workload.time_scale", "2")),
        ("both-classes-and-trace", {"workload.trace": "t.csv"}, ("workload",)),
        ("trace-missing", {"workload.classes": DELETE, "workload.trace": "nope.csv"}, ("workload.trace", "nope.csv")),
        ("calibration-missing", {"calibration": "nope.yaml"}, ("calibration", "nope.yaml")),
        ("profile-missing", {"profile": "nope.csv"}, ("profile", "nope.csv")),
        ("hardware-file-missing", {"hardware.gpu": "nope.yaml"}, ("hardware.gpu", "nope.yaml")),
        ("gpu-list-unknown", {"hardware.gpu": ["h100-sxm", "tpu-v9"]}, ("hardware.gpu[1]", "tpu-v9")),
        ("gpu-list-price-nan", {"hardware.gpu": ["h100-sxm", "h200"],
                                "hardware.usd_per_gpu_hour": {"h100-sxm": 3, "h200": math.nan}},
         ("hardware.usd_per_gpu_hour.h200", "nan")),
        ("gpu-list-price-inf", {"hardware.gpu": ["h100-sxm", "h200"], "hardware.usd_per_gpu_hour": math.inf},
         ("hardware.usd_per_gpu_hour", "inf")),
        ("gpu-list-empty", {"hardware.gpu": []}, ("hardware.gpu", "[]")),
        ("gpu-list-nested", {"hardware.gpu": [["h100-sxm"]]}, ("hardware.gpu[0]",)),
        ("gpu-list-nodes-huge", {"hardware.gpu": ["h100-sxm", "h200"], "hardware.max_nodes": 10**9},
         ("hardware.max_nodes", "1000000000")),
    ]
    for i, (cid, edits, names) in enumerate(bad):
        # every command reads workloads the same way: rotate through them, and run the first few
        # through all three
        cmds = COMMANDS if i < 6 else (COMMANDS[i % 3],)
        wl_case(cid, k, wl_text(edits), names, cmds=cmds)


def _yaml_text_cases() -> None:
    k = "workload-text"
    big = "1" + "0" * 400
    raw = [
        ("rate-1e400", {"workload.rate_req_s": RAW}, "1e400", ("workload.rate_req_s", "1e400")),
        ("rate-400-digits", {"workload.rate_req_s": RAW}, big, ("workload.rate_req_s", "1000000000")),
        ("input-1e400", {"workload.classes[0].input_tokens": RAW}, "1e400",
         ("workload.classes[0].input_tokens", "1e400")),
        ("usd-neg-1e999", {"hardware.usd_per_gpu_hour": RAW}, "-1e999", ("hardware.usd_per_gpu_hour", "-1e999")),
        ("share-400-digits", {"workload.classes[0].share": RAW}, big, ("classes[0].share", "1000000000")),
        ("seed-400-digits", {"search.seed": RAW}, big, ("search.seed", "1000000000")),
    ]
    for i, (cid, edits, r, names) in enumerate(raw):
        wl_case(cid, k, wl_text(edits, r), names, cmds=(COMMANDS[i % 3],))
    good = wl_text()
    texts = [
        ("not-utf8", good.encode() + b"# caf\xe9\n", ("line", "UTF-8")),
        ("latin1-key", wl_text().replace("chat", "ch\xe2t").encode("latin-1"), ("UTF-8",)),
        ("binary", bytes(range(256)) * 4, ("UTF-8",)),
        ("utf16", good.encode("utf-16"), ("UTF-8",)),
        ("empty", "", ("empty",)),
        ("only-comment", "# nothing\n", ("empty",)),
        ("a-list", "- 1\n- 2\n", ("mapping",)),
        ("a-scalar", "42\n", ("mapping",)),
        ("bad-indent", "model: llama-3.1-8b\n  hardware: x\n", ("line 2", "invalid YAML")),
        ("unclosed", "model: [llama\n", ("invalid YAML",)),
        ("tab", "model:\tllama-3.1-8b\nslo:\n\t ttft_ms: 3\n", ("invalid YAML",)),
        ("dup-key", good + "model: llama-3.1-70b\n", ("model", "twice")),
        ("python-tag", "model: !!python/object/apply:os.system ['true']\n", ("invalid YAML",)),
        ("list-key", good + "? [a, b]\n: 1\n", ("invalid YAML",)),
        ("two-docs", good + "---\n" + good, ("invalid YAML",)),
        ("nul-bytes", good.replace("chat", "ch\x00at"), ("invalid YAML",)),
        ("deep-nesting", "model: " + "[" * 1000 + "]" * 1000 + "\n", ("w.yaml",)),
    ]
    for i, (cid, text, names) in enumerate(texts):
        wl_case(cid, k, text, names, cmds=(COMMANDS[i % 3],))
    # the workload file itself: missing, a folder
    for cmd in COMMANDS:
        case(f"workload-missing-{cmd}", "workload-file", wl_argv(cmd, "nope.yaml"), {}, ("nope.yaml", "no such"),
             outputs=WL_OUT if cmd == "solve" else ())
        case(f"workload-folder-{cmd}", "workload-file", wl_argv(cmd, "adir"), {"adir/x": "1"}, ("adir", "directory"),
             outputs=WL_OUT if cmd == "solve" else ())


# ---- context length: valid input no engine would serve -------------------------------------------

def _context_cases() -> None:
    k = "context-length"
    cases = [
        ("prompt-300k", {"workload.classes[0].input_tokens": 300_000}, "llama-3.1-8b",
         ("classes[0].input_tokens", "300000", "class chat", "131,072")),
        ("prompt-plus-output", {"workload.classes[0].input_tokens": 130_000, "workload.classes[0].output_tokens": 2000},
         "llama-3.1-8b", ("classes[0].output_tokens", "class chat", "132,000", "131,072")),
        ("llama2-8k", {"workload.classes[0].input_tokens": 8000}, "llama-2-7b",
         ("classes[0].input_tokens", "8000", "4,096")),
        ("uniform-max", {"workload.classes[0].input_tokens": {"dist": "uniform", "min": 100, "max": 41_000}},
         "qwen3-32b", ("classes[0].input_tokens", "41000", "40,960")),
        ("lognormal-open-tail", {"workload.classes[0].input_tokens": {"dist": "lognormal", "mean": 4000, "sigma": 1.0}},
         "llama-2-7b", ("classes[0].input_tokens", "99.9th percentile", "4,096")),
        ("output-long", {"workload.classes[0].output_tokens": 200_000}, "deepseek-v3",
         ("classes[0].output_tokens", "163,840")),
    ]
    for i, (cid, edits, model, names) in enumerate(cases):
        wl_case(cid, k, wl_text({**edits, "model": model}), names, cmds=COMMANDS if i < 2 else (COMMANDS[i % 3],))
    trace = "arrival_s,input_tokens,output_tokens\n0,1000,10\n1,300000,10\n"
    wl_case("trace-300k", k, wl_text({"workload.classes": DELETE, "workload.trace": "t.csv"}),
            ("workload.trace", "t.csv", "131,072", "300,000"), {"t.csv": trace})


# ---- traces --------------------------------------------------------------------------------------

def _trace_cases() -> None:
    k = "trace"
    azure = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
    burst = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
    kv = "arrival_s,input_tokens,output_tokens,prefix_tokens,prefix_group\n"
    moon = '{"timestamp": 0, "input_length": 100, "output_length": 10, "hash_ids": [1]}\n'
    traces = [
        ("azure-1e23", azure + "2023-11-16 18:15:46.7,100,10\n2023-11-16 18:15:47.7,1e23,10\n",
         ("line 3", "ContextTokens", "1e23")),
        ("azure-nan", azure + "2023-11-16 18:15:46.7,nan,10\n", ("line 2", "ContextTokens", "nan")),
        ("azure-bad-date", azure + "2023-13-45 18:15:46.7,100,10\n", ("line 2", "TIMESTAMP", "2023-13-45")),
        ("azure-hour-25", azure + "2023-11-16 25:15:46.7,100,10\n", ("line 2", "TIMESTAMP", "25:15")),
        ("azure-short-row", azure + "2023-11-16 18:15:46.7,100\n", ("line 2", "columns")),
        ("azure-neg", azure + "2023-11-16 18:15:46.7,100,-4\n", ("line 2", "GeneratedTokens", "-4")),
        ("azure-header-only", azure, ("no usable requests",)),
        ("azure-all-failed", azure + "2023-11-16 18:15:46.7,100,0\n", ("no usable requests", "failed")),
        ("burst-inf-time", burst + "inf,GPT-4,100,10,110,API log\n", ("line 2", "Timestamp", "inf")),
        ("burst-1e300-time", burst + "0,GPT-4,100,10,110,API\n1e300,GPT-4,100,10,110,API\n",
         ("line 3", "Timestamp", "1e300")),
        ("burst-400-digits", burst + "0,GPT-4," + "1" + "0" * 400 + ",10,110,API\n",
         ("line 2", "Request tokens", "1000000000")),
        ("burst-text-tokens", burst + "0,GPT-4,many,10,110,API\n", ("line 2", "Request tokens", "many")),
        ("kvtune-prefix-over", kv + "0,100,10,200,0\n", ("line 2", "prefix_tokens", "200")),
        ("kvtune-group-huge", kv + "0,100,10,50," + "9" * 30 + "\n", ("line 2", "prefix_group", "999999")),
        ("kvtune-group-text", kv + "0,100,10,50,abc\n", ("line 2", "prefix_group", "abc")),
        ("mooncake-bad-json", moon + '{"timestamp": 1, "input_length": \n', ("line 2", "JSON")),
        ("mooncake-list", moon + "[1, 2]\n", ("line 2", "JSON object")),
        ("mooncake-missing", moon + '{"timestamp": 1, "input_length": 5}\n', ("line 2", "output_length")),
        ("mooncake-nan", moon + '{"timestamp": NaN, "input_length": 5, "output_length": 3}\n',
         ("line 2", "timestamp", "nan")),
        ("mooncake-infinity", moon + '{"timestamp": 1, "input_length": Infinity, "output_length": 3}\n',
         ("line 2", "input_length", "inf")),
        ("mooncake-1e23", moon + '{"timestamp": 1, "input_length": 1e23, "output_length": 3}\n',
         ("line 2", "input_length", "1e+23")),
        ("mooncake-5000-digits", moon + '{"timestamp": 1, "input_length": ' + "9" * 5000 + ', "output_length": 3}\n',
         ("line 2", "JSON")),
        ("mooncake-hash-dict", moon + '{"timestamp": 1, "input_length": 5, "output_length": 3, "hash_ids": {"a": 1}}\n',
         ("line 2", "hash_ids")),
        ("mooncake-bool-len", moon + '{"timestamp": 1, "input_length": true, "output_length": 3}\n',
         ("line 2", "input_length", "True")),
        ("not-utf8", azure.encode() + b"2023-11-16 18:15:46.7,1\xff0,10\n", ("t.csv", "text")),
        ("unknown-header", "when,prompt,answer\n1,2,3\n", ("line 1", "header", "when,prompt,answer")),
        ("empty", "", ("empty",)),
        ("blank-lines", "\n\n\n", ("empty",)),
        ("huge-field", azure + "2023-11-16 18:15:46.7,\"" + "1" * 200_000 + "\",10\n", ("t.csv", "CSV")),
    ]
    for i, (cid, text, names) in enumerate(traces):
        wl_case(cid, k, wl_text({"workload.classes": DELETE, "workload.trace": "t.csv"}), names,
                {"t.csv": text}, cmds=(COMMANDS[i % 3],), file="t.csv")
    wl_case("trace-is-folder", k, wl_text({"workload.classes": DELETE, "workload.trace": "tdir"}),
            ("workload.trace", "tdir"), {"tdir/x": "1"}, cmds=("simulate",))
    wl_case("trace-time-scale-0", k, wl_text({"workload.classes": DELETE, "workload.trace": "t.csv",
                                              "workload.rate_req_s": DELETE, "workload.time_scale": 0}),
            ("workload.time_scale", "0"), {"t.csv": kv + "0,100,10,0,-1\n"}, cmds=("goodput",))


# ---- model config.json --------------------------------------------------------------------------

def _model_cases() -> None:
    k = "model-config"
    base = json.loads((MODELS / "llama-3.1-8b.json").read_text())
    edits = [
        ("intermediate-neg", {"intermediate_size": -5}, ("intermediate_size", "-5")),
        ("intermediate-nan", {"intermediate_size": math.nan}, ("intermediate_size", "nan")),
        ("hidden-inf", {"hidden_size": math.inf}, ("hidden_size", "inf")),
        ("hidden-str", {"hidden_size": "4096"}, ("hidden_size", "4096")),
        ("hidden-float", {"hidden_size": 4096.5}, ("hidden_size", "4096.5")),
        ("hidden-huge", {"hidden_size": 10**30}, ("hidden_size", "1000000000000000000000000000000")),
        ("layers-zero", {"num_hidden_layers": 0}, ("num_hidden_layers", "0")),
        ("layers-missing", {"num_hidden_layers": None}, ("num_hidden_layers",)),
        ("heads-bool", {"num_attention_heads": True}, ("num_attention_heads", "True")),
        ("kv-heads-3", {"num_key_value_heads": 3}, ("num_key_value_heads", "3")),
        ("kv-heads-0", {"num_key_value_heads": 0}, ("num_key_value_heads", "0")),
        ("vocab-neg", {"vocab_size": -1}, ("vocab_size", "-1")),
        ("context-neg", {"max_position_embeddings": -4096}, ("max_position_embeddings", "-4096")),
        ("context-nan", {"max_position_embeddings": math.nan}, ("max_position_embeddings", "nan")),
        ("experts-topk-over", {"num_local_experts": 4, "num_experts_per_tok": 9}, ("num_experts_per_tok", "9")),
        ("experts-neg", {"num_local_experts": -4}, ("num_local_experts", "-4")),
        ("window-layers-str", {"sliding_window": 4096, "use_sliding_window": True, "max_window_layers": "all"},
         ("max_window_layers", "all")),
        ("head-dim-zero", {"head_dim": 0}, ("head_dim", "0")),
    ]
    for i, (cid, e, names) in enumerate(edits):
        cfg = {**base, **{kk: v for kk, v in e.items() if v is not None}}
        for kk, v in e.items():
            if v is None:
                cfg.pop(kk, None)
        text = json.dumps(cfg)
        if i % 2 == 0:
            case(f"{cid}-estimate", k, ["estimate", "--model", "{d}/m/config.json", "--json"],
                 {"m/config.json": text}, ("config.json",) + names)
        else:
            cmd = COMMANDS[i % 3]
            wl_case(cid, k, wl_text({"model": "m/config.json"}), ("config.json",) + names, {"m/config.json": text},
                    cmds=(cmd,))
    texts = [
        ("not-utf8", b'{"hidden_size": 4096, "name": "caf\xe9"}', ("config.json", "UTF-8")),
        ("not-json", "{hidden_size: 4096}", ("config.json", "JSON")),
        ("a-list", "[1, 2]", ("config.json", "JSON object")),
        ("empty", "", ("config.json", "JSON")),
        ("1e400", json.dumps(base).replace('"hidden_size": 4096', '"hidden_size": 1e400'), ("hidden_size", "inf")),
        ("5000-digits", json.dumps(base).replace('"hidden_size": 4096', '"hidden_size": ' + "9" * 5000),
         ("config.json", "JSON")),
        ("deep", "[" * 100_000 + "]" * 100_000, ("config.json", "JSON")),
    ]
    for cid, text, names in texts:
        case(f"{cid}-estimate", k, ["estimate", "--model", "{d}/m/config.json"], {"m/config.json": text}, names)
    case("folder-without-config", k, ["estimate", "--model", "{d}/m"], {"m/x.txt": "1"}, ("config.json", "no such"))


# ---- hardware and calibration files ---------------------------------------------------------------

HW = ("cpu:\n  display_name: c\n  memory_gb: 23\n  hbm_tb_s: 0.02\n  bf16_tflops: 0.07\n  fp8_tflops: 0\n"
      "  interconnect_gb_s: 20\n  interconnect: none\n  source: test\n")


def _hardware_cases() -> None:
    k = "hardware-file"
    edits = [
        ("memory-inf", HW.replace("memory_gb: 23", "memory_gb: .inf"), ("memory_gb", "inf")),
        ("memory-nan", HW.replace("memory_gb: 23", "memory_gb: .nan"), ("memory_gb", "nan")),
        ("memory-neg", HW.replace("memory_gb: 23", "memory_gb: -23"), ("memory_gb", "-23")),
        ("memory-1e400", HW.replace("memory_gb: 23", "memory_gb: 1e400"), ("memory_gb", "1e400")),
        ("bw-str", HW.replace("hbm_tb_s: 0.02", "hbm_tb_s: fast"), ("hbm_tb_s", "fast")),
        ("fp8-neg", HW.replace("fp8_tflops: 0", "fp8_tflops: -1"), ("fp8_tflops", "-1")),
        ("missing-key", HW.replace("  hbm_tb_s: 0.02\n", ""), ("hbm_tb_s",)),
        ("two-entries", HW + HW.replace("cpu:", "cpu2:"), ("exactly one entry",)),
        ("not-utf8", HW.encode().replace(b"display_name: c", b"display_name: \xff"), ("UTF-8",)),
        ("list", "- 1\n", ("exactly one entry",)),
        ("name-dict", HW.replace("display_name: c", "display_name: {a: 1}"), ("display_name",)),
    ]
    for i, (cid, text, names) in enumerate(edits):
        if i % 2 == 0:
            case(f"{cid}-calibrate", k, ["calibrate", "{d}/t.csv", "--gpu", "{d}/hw.yaml", "-o", "{d}/out/c.yaml"],
                 {"hw.yaml": text, "t.csv": STEP_TABLE}, ("hw.yaml",) + names, outputs=("out/c.yaml",))
        else:
            wl_case(cid, k, wl_text({"hardware.gpu": "hw.yaml", "model": "smollm2-135m"}), ("hw.yaml",) + names,
                    {"hw.yaml": text}, cmds=(COMMANDS[i % 3],))
    case("fp8-weights-on-cpu", k, wl_argv("simulate"),
         {"w.yaml": wl_text({"hardware.gpu": "hw.yaml", "model": "smollm2-135m", "weights": "fp8"}), "hw.yaml": HW},
         ("w.yaml", "hardware.gpu", "hw.yaml", "FP8"))


CAL = yaml.safe_load((ROOT / "profiles" / "calibrations" / "h100-sxm.yaml").read_text())


def cal_text(params: dict | None = None, drop: str | None = None, raw: str | None = None) -> str:
    """The shipped calibration with ``params`` set (``drop`` removed); RAW replaced by ``raw``."""
    d = {**CAL, "params": {**CAL["params"], **(params or {})}}
    if drop:
        del d["params"][drop]
    text = yaml.safe_dump(d, sort_keys=False)
    return text.replace(f"'{RAW}'", raw).replace(RAW, raw) if raw is not None else text


def _calibration_cases() -> None:
    k = "calibration-file"
    edits = [
        ("param-nan", cal_text({"bw_efficiency": math.nan}), ("bw_efficiency", "nan")),
        ("param-inf", cal_text({"bw_efficiency": math.inf}), ("bw_efficiency", "inf")),
        ("param-str", cal_text({"bw_efficiency": "high"}), ("bw_efficiency", "high")),
        ("param-out-of-bounds", cal_text({"bw_efficiency": 7}), ("bw_efficiency", "7")),
        ("param-1e400", cal_text({"step_overhead_s": RAW}, raw="1e400"), ("step_overhead_s", "1e400")),
        ("param-unknown", cal_text({"warp_speed": 9}), ("warp_speed",)),
        ("param-missing", cal_text(drop="bw_efficiency"), ("bw_efficiency",)),
        ("no-params", "name: x\n", ("params",)),
        ("not-utf8", cal_text().encode().replace(b"name: h100-sxm", b"name: h\xffsxm"), ("UTF-8",)),
        ("not-yaml", "params: [\n", ("invalid YAML",)),
    ]
    for i, (cid, text, names) in enumerate(edits):
        if i % 3 == 0:
            case(f"{cid}-estimate", k, ["estimate", "--model", "llama-3.1-8b", "--calibration", "{d}/cal.yaml"],
                 {"cal.yaml": text}, ("cal.yaml",) + names)
        elif i % 3 == 1:
            wl_case(cid, k, wl_text({"calibration": "cal.yaml"}), ("cal.yaml",) + names, {"cal.yaml": text},
                    cmds=(COMMANDS[i % 3],))
        else:
            case(f"{cid}-calibrate-base", k, ["calibrate", "{d}/t.csv", "--base", "{d}/cal.yaml", "-o", "{d}/out/c.yaml"],
                 {"cal.yaml": text, "t.csv": STEP_TABLE}, ("cal.yaml",) + names, outputs=("out/c.yaml",))


# ---- profile tables (estimate/simulate --profile, calibrate) --------------------------------------

STEP_TABLE = ("id,kind,gpu,model,tp,phase,batch,context_tokens,step_ms\n"
              "a,step,h100-sxm,llama-3.1-8b,1,decode,1,512,7.0\n"
              "b,step,h100-sxm,llama-3.1-8b,1,decode,32,512,9.0\n"
              "c,step,h100-sxm,llama-3.1-8b,1,decode,64,2048,12.0\n")


def _table_cases() -> None:
    k = "profile-table"
    bad_rows = [
        ("step-neg", "d,step,h100-sxm,llama-3.1-8b,1,decode,1,512,-3\n", ("line 5", "step_ms", "-3")),
        ("step-zero", "d,step,h100-sxm,llama-3.1-8b,1,decode,1,512,0\n", ("line 5", "step_ms", "0")),
        ("step-nan", "d,step,h100-sxm,llama-3.1-8b,1,decode,1,512,nan\n", ("line 5", "step_ms", "nan")),
        ("step-inf", "d,step,h100-sxm,llama-3.1-8b,1,decode,1,512,inf\n", ("line 5", "step_ms", "inf")),
        ("step-1e400", "d,step,h100-sxm,llama-3.1-8b,1,decode,1,512,1e400\n", ("line 5", "step_ms", "1e400")),
        ("batch-1e400", "d,step,h100-sxm,llama-3.1-8b,1,decode,1e400,512,3\n", ("line 5", "batch", "1e400")),
        ("batch-frac", "d,step,h100-sxm,llama-3.1-8b,1,decode,1.5,512,3\n", ("line 5", "batch", "1.5")),
        ("batch-zero", "d,step,h100-sxm,llama-3.1-8b,1,decode,0,512,3\n", ("line 5", "batch", "0")),
        ("tp-huge", "d,step,h100-sxm,llama-3.1-8b,1e12,decode,1,512,3\n", ("line 5", "tp", "1e12")),
        ("context-neg", "d,step,h100-sxm,llama-3.1-8b,1,decode,1,-512,3\n", ("line 5", "context_tokens", "-512")),
        ("phase-bad", "d,step,h100-sxm,llama-3.1-8b,1,verify,1,512,3\n", ("line 5", "phase", "verify")),
        ("kind-bad", "d,trace,h100-sxm,llama-3.1-8b,1,decode,1,512,3\n", ("line 5", "kind", "trace")),
        ("step-missing", "d,step,h100-sxm,llama-3.1-8b,1,decode,1,512,\n", ("line 5", "step_ms")),
    ]
    for i, (cid, row, names) in enumerate(bad_rows):
        text = STEP_TABLE + row
        if i % 3 == 0:
            case(f"{cid}-calibrate", k, ["calibrate", "{d}/t.csv", "-o", "{d}/out/c.yaml", "--json"], {"t.csv": text},
                 ("t.csv",) + names, outputs=("out/c.yaml",))
        elif i % 3 == 1:
            case(f"{cid}-estimate", k, ["estimate", "--model", "llama-3.1-8b", "--profile", "{d}/t.csv"],
                 {"t.csv": text}, ("t.csv",) + names)
        else:
            case(f"{cid}-simulate", k, ["simulate", "{d}/w.yaml", "--profile", "{d}/t.csv", "--requests", "20"],
                 {"t.csv": text, "w.yaml": wl_text()}, ("t.csv",) + names)
    whole = [
        ("not-utf8", STEP_TABLE.encode() + b"d,step,h100-sxm,llama\xff,1,decode,1,512,3\n", ("t.csv", "UTF-8")),
        ("empty", "", ("t.csv", "empty")),
        ("unknown-column", STEP_TABLE.replace("step_ms", "step_us"), ("t.csv", "step_us")),
        ("column-with-newline", STEP_TABLE.replace("step_ms", '"step\nms"'), ("t.csv", "step\\nms")),
        ("no-kind", STEP_TABLE.replace("kind", "sort"), ("t.csv", "sort")),
        ("header-only", STEP_TABLE.splitlines()[0] + "\n", ("t.csv", "no rows")),
        ("huge-field", STEP_TABLE + 'd,step,h100-sxm,"' + "x" * 200_000 + '",1,decode,1,512,3\n', ("t.csv", "CSV")),
        ("folder", None, ("t.csv",)),
    ]
    for i, (cid, text, names) in enumerate(whole):
        files = {"t.csv/x": "1"} if text is None else {"t.csv": text}
        if i % 2 == 0:
            case(f"{cid}-calibrate", k, ["calibrate", "{d}/t.csv", "-o", "{d}/out/c.yaml"], files, names,
                 outputs=("out/c.yaml",))
        else:
            case(f"{cid}-estimate", k, ["estimate", "--model", "llama-3.1-8b", "--profile", "{d}/t.csv"], files, names)
    sidecars = [
        ("sidecar-not-utf8", b"gpu: h\xff100\n", ("t.meta.yaml", "UTF-8")),
        ("sidecar-list", "- 1\n", ("t.meta.yaml", "mapping")),
        ("sidecar-bad-yaml", "gpu: [\n", ("t.meta.yaml", "invalid YAML")),
        ("sidecar-tp-nested", "tp: {a: 1}\n", ("t.meta.yaml", "tp")),
        ("sidecar-tp-neg", "tp: -2\n", ("t.csv", "tp", "-2")),
        ("sidecar-1e400", "tp: 1e400\n", ("t.meta.yaml", "tp", "1e400")),
    ]
    table = STEP_TABLE.replace(",tp,", ",").replace(",1,decode", ",decode")
    for i, (cid, text, names) in enumerate(sidecars):
        argv = (["calibrate", "{d}/t.csv", "-o", "{d}/out/c.yaml"] if i % 2 else
                ["estimate", "--model", "llama-3.1-8b", "--profile", "{d}/t.csv"])
        case(cid, k, argv, {"t.csv": table, "t.meta.yaml": text}, names, outputs=("out/c.yaml",) if i % 2 else ())


# ---- calibrate: flags and refusals ---------------------------------------------------------------

def _calibrate_cases() -> None:
    k = "calibrate"
    out = ("out/c.yaml",)
    base = ["calibrate", "{d}/t.csv", "-o", "{d}/out/c.yaml"]
    flags = [
        ("max-nfev-0", ["--max-nfev", "0"], ("--max-nfev", "0")),
        ("max-nfev-neg", ["--max-nfev", "-3"], ("--max-nfev", "-3")),
        ("max-nfev-text", ["--max-nfev", "many"], ("--max-nfev", "many")),
        ("chunk-0", ["--chunk-tokens", "0"], ("--chunk-tokens", "0")),
        ("params-unknown", ["--params", "warp_speed"], ("--params", "warp_speed")),
        ("params-empty", ["--params", ","], ("--params",)),
        ("params-twice", ["--params", "bw_efficiency,bw_efficiency"], ("--params", "bw_efficiency")),
        ("metric-unknown", ["--fit-metrics", "joy_ms"], ("joy_ms",)),
        ("gpu-unknown", ["--gpu", "tpu-v9"], ("tpu-v9",)),
        ("gpu-file-missing", ["--gpu", "{d}/nope.yaml"], ("nope.yaml",)),
        ("base-missing", ["--base", "{d}/nope.yaml"], ("nope.yaml",)),
        ("engine-tgi", ["--engine", "tgi"], ("--engine", "tgi")),
        ("no-rows-for-gpu", ["--gpu", "a100-80gb"], ("a100-80gb",)),
        ("clients-bad", ["--clients", "lazy"], ("--clients", "lazy")),
    ]
    for cid, extra, names in flags:
        case(cid, k, base + extra, {"t.csv": STEP_TABLE}, names, outputs=out)
    case("output-folder-missing", k, ["calibrate", "{d}/t.csv", "-o", "{d}/nofolder/c.yaml"], {"t.csv": STEP_TABLE},
         ("nofolder",))
    case("table-missing", k, base, {}, ("t.csv", "no such"), outputs=out)
    case("too-many-params", k, base + ["--params", ",".join(["bw_efficiency", "decode_flops_efficiency",
                                                             "step_overhead_s", "link_efficiency"])],
         {"t.csv": STEP_TABLE.replace(",tp,", ",tp,").splitlines()[0] + "\n" + STEP_TABLE.splitlines()[1] + "\n"},
         ("measured figures",), outputs=out)


# ---- profile import -------------------------------------------------------------------------------

def _import_cases() -> None:
    k = "profile-import"
    vllm = json.loads((DATA / "import_vllm_result.json").read_text())
    out = ("out/t.csv",)
    argv = ["profile", "import", "{d}/r.json", "-o", "{d}/out/t.csv"]

    def v(**e):
        d = dict(vllm)
        for kk, vv in e.items():
            if vv is DELETE:
                d.pop(kk)
            else:
                d[kk] = vv
        return json.dumps(d)

    docs = [
        ("completed-nan", v(completed=math.nan), ("completed", "nan")),
        ("completed-inf", v(completed=math.inf), ("completed", "inf")),
        ("completed-zero", v(completed=0), ("completed", "0")),
        ("concurrency-inf", v(max_concurrency=math.inf, request_rate=DELETE), ("max_concurrency", "inf")),
        ("concurrency-frac", v(max_concurrency=2.5), ("max_concurrency", "2.5")),
        ("ttft-neg", v(mean_ttft_ms=-3), ("mean_ttft_ms", "-3")),
        ("ttft-str", v(mean_ttft_ms="fast"), ("mean_ttft_ms", "fast")),
        ("ttft-bool", v(mean_ttft_ms=True), ("mean_ttft_ms", "True")),
        ("throughput-400-digits", v(output_throughput=10**400), ("output_throughput", "1000000000")),
        ("tokens-1e300", v(total_input_tokens=1e300), ("input_tokens",)),
        ("no-load", v(max_concurrency=DELETE, request_rate=DELETE), ("max_concurrency",)),
        ("detail-mismatch", v(ttfts=[0.1, 0.2], itls=[[0.01]], output_lens=[3, 3], input_lens=[5, 5]),
         ("itls", "1 entries")),
        ("detail-itl-str", v(ttfts=[0.1], itls=["x"], output_lens=[3], input_lens=[5]), ("itls[0]",)),
        ("detail-errors-dict", v(ttfts=[0.1], itls=[[0.01]], output_lens=[3], input_lens=[5], errors={"a": 1}),
         ("errors",)),
        ("detail-all-failed", v(ttfts=[0.1], itls=[[0.01]], output_lens=[3], input_lens=[5], errors=["boom"]),
         ("errors",)),
        ("detail-ttft-nan", v(ttfts=[math.nan], itls=[[0.01]], output_lens=[3], input_lens=[5]), ("ttfts[0]", "nan")),
        ("detail-latency-below-ttft", v(ttfts=[0.5], itls=[[0.01]], output_lens=[3], input_lens=[5],
                                        latencies=[0.1]), ("tpot", "-")),
        ("unrecognised", json.dumps({"hello": 1}), ("not a recognised",)),
        ("a-list", "[1, 2]", ("JSON object",)),
        ("not-json", "{oops", ("not JSON",)),
        ("empty", "", ("empty",)),
        ("not-utf8", b'{"model_id": "caf\xe9"}', ("UTF-8",)),
        ("5000-digits", '{"completed": ' + "9" * 5000 + "}", ("not JSON",)),
        ("deep", "[" * 100_000 + "]" * 100_000, ("not JSON",)),
        ("jsonl-bad-line", v() .replace("\n", " ") + "\n{oops\n", ("line 2", "not JSON")),
        ("llmperf-timestamp-huge", json.dumps({"results_ttft_s_mean": 0.1, "num_concurrent_requests": 1,
                                               "results_num_completed_requests": 3, "mean_input_tokens": 5,
                                               "mean_output_tokens": 5, "results_end_to_end_latency_s_mean": 1,
                                               "results_mean_output_throughput_token_per_s": 9,
                                               "timestamp": 1e300}), ("timestamp", "1e+300")),
        ("llmperf-concurrency-inf", json.dumps({"results_ttft_s_mean": 0.1, "num_concurrent_requests": math.inf}),
         ("num_concurrent_requests", "inf")),
        ("genai-unit-bad", json.dumps({"input_config": {"concurrency": 4}, "time_to_first_token":
                                       {"unit": "parsecs", "avg": 3}, "input_sequence_length": {"avg": 5},
                                       "output_sequence_length": {"avg": 5}}), ("unit", "parsecs")),
        ("genai-metric-not-object", json.dumps({"input_config": {"concurrency": 4},
                                                "time_to_first_token": {"unit": "ms", "avg": 3},
                                                "inter_token_latency": 7,
                                                "input_sequence_length": {"avg": 5},
                                                "output_sequence_length": {"avg": 5}}), ("inter_token_latency",)),
        ("genai-request-count-inf", json.dumps({"input_config": {"concurrency": 4, "request_count": 1e400},
                                                "time_to_first_token": {"unit": "ms", "avg": 3},
                                                "input_sequence_length": {"avg": 5},
                                                "output_sequence_length": {"avg": 5},
                                                "request_count": {"avg": -2}}), ("request_count", "-2")),
    ]
    for cid, text, names in docs:
        case(cid, k, argv, {"r.json": text}, ("r.json",) + names, outputs=out)
    case("file-missing", k, argv, {}, ("r.json",), outputs=out)
    case("output-folder-missing", k, ["profile", "import", "{d}/r.json", "-o", "{d}/nofolder/t.csv"],
         {"r.json": v()}, ("nofolder",))
    case("format-unknown", k, argv + ["--format", "tgi"], {"r.json": v()}, ("--format", "tgi"), outputs=out)
    case("tp-zero", k, argv + ["--tp", "0"], {"r.json": v()}, ("--tp", "0"), outputs=out)
    case("second-file-bad", k, ["profile", "import", "{d}/r.json", "{d}/s.json", "-o", "{d}/out/t.csv"],
         {"r.json": v(), "s.json": v(completed=math.nan)}, ("s.json", "completed", "nan"), outputs=out)


# ---- profile run: nothing listening, bad URLs, bad flags ------------------------------------------

def _run_cases() -> None:
    k = "profile-run"
    out = ("out/t.csv",)

    def argv(url="http://127.0.0.1:9/v1", *extra):
        return ["profile", "run", "--url", url, "--model", "m", "-o", "{d}/out/t.csv", "--timeout-s", "2", *extra]

    case("nothing-listening", k, argv(), {}, ("127.0.0.1:9",), outputs=out)
    case("url-no-scheme", k, argv("localhost:8000/v1"), {}, ("--url", "localhost:8000/v1"), outputs=out)
    case("url-ftp", k, argv("ftp://x/v1"), {}, ("--url", "ftp://x/v1"), outputs=out)
    case("url-empty", k, argv(""), {}, ("--url",), outputs=out)
    case("url-bad-port", k, argv("http://127.0.0.1:99999/v1"), {}, ("--url", "99999"), outputs=out)
    case("url-unresolvable", k, argv("http://no-such-host.invalid/v1"), {}, ("no-such-host.invalid",), outputs=out)
    case("concurrency-0", k, argv("http://127.0.0.1:9/v1", "--concurrency", "0"), {}, ("--concurrency", "0"),
         outputs=out)
    case("isl-text", k, argv("http://127.0.0.1:9/v1", "--isl", "long"), {}, ("--isl", "long"), outputs=out)
    case("osl-empty", k, argv("http://127.0.0.1:9/v1", "--osl", ""), {}, ("--osl",), outputs=out)
    case("timeout-neg", k, argv("http://127.0.0.1:9/v1", "--timeout-s", "-1"), {}, ("--timeout-s", "-1"),
         outputs=out)
    case("timeout-nan", k, argv("http://127.0.0.1:9/v1", "--timeout-s", "nan"), {}, ("--timeout-s", "nan"),
         outputs=out)
    case("requests-per-point-0", k, argv("http://127.0.0.1:9/v1", "--requests-per-point", "0"), {},
         ("--requests-per-point", "0"), outputs=out)
    case("warmup-neg", k, argv("http://127.0.0.1:9/v1", "--warmup", "-1"), {}, ("--warmup", "-1"), outputs=out)
    case("output-folder-missing", k, ["profile", "run", "--url", "http://127.0.0.1:9/v1", "--model", "m", "-o",
                                      "{d}/nofolder/t.csv"], {}, ("nofolder",))
    case("append-to-broken-table", k, argv("http://127.0.0.1:9/v1", "--append"), {"out/t.csv": "garbage,\n1,2\n"},
         ("t.csv",))


# ---- command-line flags ---------------------------------------------------------------------------

def _flag_cases() -> None:
    k = "flags"
    est = ["estimate", "--model", "llama-3.1-8b"]
    for cid, extra, names in [
        ("tp-0", ["--tp", "0"], ("tp", "0")),
        ("tp-3", ["--tp", "3"], ("tp 3",)),
        ("tp-text", ["--tp", "two"], ("--tp", "two")),
        ("context-0", ["--context", "0"], ("--context", "0")),
        ("context-neg", ["--context", "-5"], ("--context", "-5")),
        ("context-beyond-model", ["--context", "300000"], ("--context", "300000", "131,072")),
        ("batch-text", ["--batch", "1,x"], ("--batch", "x")),
        ("batch-0", ["--batch", "0"], ("--batch", "0")),
        ("batch-empty", ["--batch", ""], ("--batch",)),
        ("gpu-mem-util-2", ["--gpu-mem-util", "2"], ("--gpu-mem-util", "2")),
        ("gpu-mem-util-nan", ["--gpu-mem-util", "nan"], ("--gpu-mem-util", "nan")),
        ("spec-alpha-2", ["--spec-k", "3", "--spec-alpha", "2"], ("--spec-alpha", "2")),
        ("spec-k-neg", ["--spec-k", "-1"], ("--spec-k", "-1")),
        ("spec-draft-cost-inf", ["--spec-k", "2", "--spec-draft-cost", "inf"], ("--spec-draft-cost", "inf")),
        ("gpu-unknown", ["--gpu", "tpu-v9"], ("tpu-v9",)),
        ("calibration-missing", ["--calibration", "{d}/nope.yaml"], ("nope.yaml",)),
        ("profile-missing", ["--profile", "{d}/nope.csv"], ("nope.csv",)),
        ("weights-int4", ["--weight-dtype", "int4"], ("--weight-dtype", "int4")),
        ("model-70b-tp1", ["--model", "llama-3.1-405b"], ("llama-3.1-405b",)),
    ]:
        case(f"estimate-{cid}", k, est + extra, {}, names)
    case("estimate-no-model", k, ["estimate"], {}, ("--model",))
    sim = ["simulate", "{d}/w.yaml", "--requests", "20"]
    for cid, extra, names in [
        ("requests-0", ["--requests", "0"], ("--requests", "0")),
        ("rate-nan", ["--rate", "nan"], ("--rate", "nan")),
        ("rate-neg", ["--rate", "-3"], ("--rate", "-3")),
        ("rate-and-concurrency", ["--rate", "3", "--concurrency", "2"], ("--rate", "--concurrency")),
        ("batch-cap-0", ["--batch-cap", "0"], ("--batch-cap", "0")),
        ("chunk-text", ["--chunk-tokens", "lots"], ("--chunk-tokens", "lots")),
        ("kv-int4", ["--kv-dtype", "int4"], ("--kv-dtype", "int4")),
        ("replicas-0", ["--replicas", "0"], ("--replicas", "0")),
        ("seed-neg", ["--seed", "-1"], ("--seed", "-1")),
        ("spec-without-section", ["--spec-k", "3"], ("--spec-k", "speculative")),
        ("tp-3", ["--tp", "3"], ("tp 3",)),
        ("unknown-flag", ["--turbo"], ("--turbo",)),
        ("rate-1e400", ["--rate", "1e400"], ("--rate", "1e400")),
        ("requests-1e20", ["--requests", "1" + "0" * 20], ("--requests", "1" + "0" * 20)),
        ("spec-k-100", ["--spec-k", "100", "--spec-alpha", "0.5"], ("--spec-k", "100")),
        ("concurrency-0", ["--concurrency", "0"], ("--concurrency", "0")),
    ]:
        case(f"simulate-{cid}", k, sim + extra, {"w.yaml": wl_text()}, names)
    gp = ["goodput", "{d}/w.yaml"]
    for cid, extra, names in [
        ("requests-0", ["--requests", "0"], ("--requests", "0")),
        ("attainment-0", ["--attainment", "0"], ("--attainment", "0")),
        ("attainment-nan", ["--attainment", "nan"], ("--attainment", "nan")),
        ("rel-tol-1", ["--rel-tol", "1"], ("--rel-tol", "1")),
        ("mode-fast", ["--mode", "fast"], ("--mode", "fast")),
        ("engine-tgi", ["--engine", "tgi"], ("--engine", "tgi")),
        ("replicas-1e6", ["--replicas", "1000000"], ("--replicas", "1000000")),
    ]:
        case(f"goodput-{cid}", k, gp + extra, {"w.yaml": wl_text()}, names)
    so = ["solve", "{d}/w.yaml", "--quiet", "--json", "{d}/out/r.json", "--report", "{d}/out/rep"]
    for cid, extra, names in [
        ("trials-0", ["--trials", "0"], ("--trials", "0")),
        ("trials-text", ["--trials", "ten"], ("--trials", "ten")),
        ("seed-neg", ["--seed", "-1"], ("--seed", "-1")),
        ("seed-2to40", ["--seed", str(2**40)], ("--seed", str(2**40))),
        ("sampler-random", ["--sampler", "random"], ("--sampler", "random")),
        ("verify-top-0", ["--verify-top", "0"], ("--verify-top", "0")),
        ("engine-tgi", ["--engine", "tgi"], ("tgi",)),
        ("calibration-missing", ["--calibration", "{d}/nope.yaml"], ("nope.yaml",)),
    ]:
        case(f"solve-{cid}", k, so + extra, {"w.yaml": wl_text()}, names, outputs=WL_OUT)
    case("solve-json-folder-missing", k, ["solve", "{d}/w.yaml", "--quiet", "--json", "{d}/nofolder/r.json"],
         {"w.yaml": wl_text()}, ("--json", "nofolder"))
    case("unknown-command", k, ["tune"], {}, ("tune",))
    # names no file system holds (over 255 bytes; found by bench/fuzz_readers.py as a workload's model)
    # (a message clips a value this long to its start and end, with its length between)
    long = "1" * 400
    clipped = (long[:16], " characters)", long[-16:])
    case("estimate-model-name-too-long", k, ["estimate", "--model", long], {}, clipped)
    case("estimate-profile-name-too-long", k, ["estimate", "--model", "llama-3.1-8b", "--profile", long], {}, clipped)
    case("calibrate-gpu-name-too-long", k, ["calibrate", "{d}/t.csv", "--gpu", long, "-o", "{d}/out/c.yaml"],
         {"t.csv": STEP_TABLE}, clipped, outputs=("out/c.yaml",))
    case("solve-json-name-too-long", k, ["solve", "{d}/w.yaml", "--json", "{d}/out/" + long + ".json"],
         {"w.yaml": wl_text()}, ("--json", "255 bytes"))
    case("solve-storage-name-too-long", k, ["solve", "{d}/w.yaml", "--storage", "journal:{d}/" + long],
         {"w.yaml": wl_text()}, ("--storage", "255 bytes"))
    case("import-name-too-long", k, ["profile", "import", "{d}/" + long, "-o", "{d}/out/t.csv"], {}, clipped,
         outputs=("out/t.csv",))
    for i, cmd in enumerate(COMMANDS):
        key = ("model", "calibration", "profile")[i]
        wl_case(f"{key}-name-too-long", k, wl_text({key: long}), (key, long[:30]), cmds=(cmd,))
    # output paths that cannot be written: checked before the work starts
    case("solve-json-is-folder", k, ["solve", "{d}/w.yaml", "--quiet", "--json", "{d}/out/jdir"],
         {"w.yaml": wl_text(), "out/jdir/x": "1"}, ("--json", "jdir", "folder"))
    case("solve-report-is-file", k, ["solve", "{d}/w.yaml", "--quiet", "--report", "{d}/out/rep"],
         {"w.yaml": wl_text(), "out/rep": "a file"}, ("--report", "rep", "not a folder"))
    case("solve-json-nul", k, ["solve", "{d}/w.yaml", "--quiet", "--json", "{d}/out/r\x00.json"],
         {"w.yaml": wl_text()}, ("--json",))
    case("calibrate-output-is-folder", k, ["calibrate", "{d}/t.csv", "-o", "{d}/out/cdir"],
         {"t.csv": STEP_TABLE, "out/cdir/x": "1"}, ("-o", "cdir", "folder"))
    case("import-output-is-folder", k, ["profile", "import", "{d}/r.json", "-o", "{d}/out/tdir"],
         {"r.json": (DATA / "import_vllm_result.json").read_text(), "out/tdir/x": "1"}, ("-o", "tdir", "directory"))
    case("run-output-is-folder", k, ["profile", "run", "--url", "http://127.0.0.1:9/v1", "--model", "m", "-o",
                                     "{d}/out/tdir"], {"out/tdir/x": "1"}, ("-o", "tdir", "directory"))


# ---- storage faults --------------------------------------------------------------------------------

def _storage_cases() -> None:
    k = "storage"
    so = ["solve", "{d}/w.yaml", "--quiet", "--trials", "2", "--json", "{d}/out/r.json"]
    good = '{"op_code": 0, "worker_id": "w", "study_name": "s", "directions": [1]}\n'
    sqlite_garbage = b"SQLite format 3\x00" + bytes(range(256)) * 20
    cases = [
        ("journal-missing-folder", "journal:{d}/nofolder/j.log", {}, ("nofolder",)),
        ("journal-cut-mid-line", "journal:{d}/j.log", {"j.log": good + good[:20]}, ("j.log", "line 2", "cut short")),
        ("journal-garbage-line", "journal:{d}/j.log", {"j.log": good + "garbage\n" + good}, ("j.log", "line 2")),
        ("journal-not-utf8", "journal:{d}/j.log", {"j.log": good.encode() + b"\xff\xfe\n"}, ("j.log", "line 2")),
        ("journal-is-folder", "journal:{d}/jdir", {"jdir/x": "1"}, ("jdir", "not a file")),
        ("journal-empty-path", "journal:", {}, ("journal:",)),
        ("sqlite-garbage", "sqlite:///{d}/g.db", {"g.db": b"this is not a database\n" * 50}, ("g.db", "not an SQLite")),
        ("sqlite-damaged", "sqlite:///{d}/g.db", {"g.db": sqlite_garbage}, ("g.db", "damaged")),
        ("sqlite-missing-folder", "sqlite:///{d}/nofolder/x.db", {}, ("nofolder",)),
        ("sqlite-is-folder", "sqlite:///{d}/ddir", {"ddir/x": "1"}, ("ddir", "not a file")),
        ("sqlite-host", "sqlite://host/x.db", {}, ("sqlite://host/x.db",)),
        ("unknown-scheme", "kvtune.db", {}, ("kvtune.db",)),
        ("rdb-no-driver", "nosuchdb://user@host/db", {}, ("nosuchdb://",)),
    ]
    for cid, url, files, names in cases:
        case(cid, k, so + ["--storage", url], {"w.yaml": wl_text(), **files}, ("--storage",) + names,
             outputs=("out/r.json",))
    # a truncated SQLite file: the first page of a real database, cut short
    case("sqlite-truncated", k, so + ["--storage", "sqlite:///{d}/t.db"], {"w.yaml": wl_text(), "t.db": _cut_sqlite()},
         ("--storage", "t.db"), outputs=("out/r.json",))


def _cut_sqlite() -> bytes:
    import tempfile

    with tempfile.TemporaryDirectory() as t:
        p = Path(t) / "x.db"
        con = sqlite3.connect(p)
        con.execute("create table a (x text)")
        con.executemany("insert into a values (?)", [("x" * 500,)] * 200)
        con.commit()
        con.close()
        data = p.read_bytes()
    return data[: len(data) // 2 + 100]


def _infeasible_cases() -> None:
    """Valid input no configuration can serve: exit 3 with the reason; --json/--report, when
    written, hold the whole (infeasible) result."""
    k = "infeasible"
    argv = ["solve", "{d}/w.yaml", "--quiet", "--json", "{d}/out/r.json", "--report", "{d}/out/rep"]
    for cid, edits, raw, names in [
        ("tpot-10us", {"slo.tpot_ms": 0.01}, None, ("TPOT",)),
        ("ttft-1us", {"slo.ttft_ms": 0.001}, None, ("TTFT",)),
        ("rate-1e12", {"workload.rate_req_s": RAW}, "1e12", ("1e+12 req/s", "max_nodes")),
        ("prompt-100k-ttft-50ms", {"workload.classes[0].input_tokens": 100_000, "slo.ttft_ms": 50}, None,
         ("TTFT", "100k")),
        # the layouts that meet TPOT 50 ms need 16 GPUs; one node (the default max_nodes) holds 8
        ("405b-tpot-50ms", {"model": "llama-3.1-405b", "search.tp": [1, 2]}, None, ("16 GPUs", "max_nodes 1")),
    ]:
        case(cid, k, argv, {"w.yaml": wl_text(edits, raw)}, names, code=3, whole=("r.json", "rep"))


# ---- issue 24: bombs and oversize files, duplicates, unpredictable rows, calibration targets, ----------
# ---- prices, read-only storage, message hygiene, output paths ---------------------------------------

def yaml_bomb(levels: int = 9) -> str:
    """The billion-laughs shape: 9**(levels + 1) values in a few hundred bytes."""
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, levels + 1)]
    return "\n".join(lines) + "\n"


MiB = 1 << 20


def _limit_cases() -> None:
    k = "yaml-limits"
    for cmd in COMMANDS:
        wl_case(f"workload-alias-bomb-{cmd}", k, yaml_bomb() + wl_text(), ("line 5", "more than 20,000 values"),
                cmds=(cmd,))
    wl_case("workload-recursive-alias", k, "x: &x [1, *x]\n" + wl_text(), ("line 1", "alias *x", "recursive"),
            cmds=("simulate",))
    wl_case("workload-oversize-comment", k, Sparse(50 * MiB), ("50 MiB", "at most 1 MiB"), cmds=("solve",))
    wl_case("workload-oversize-2mib", k, wl_text() + "#" * (2 * MiB) + "\n", ("2 MiB", "at most 1 MiB"),
            cmds=("goodput",))
    table = STEP_TABLE.replace(",tp,", ",").replace(",1,decode", ",decode")
    est = ["estimate", "--model", "llama-3.1-8b"]
    case("sidecar-alias-bomb", k, est + ["--profile", "{d}/t.csv"], {"t.csv": table, "t.meta.yaml": yaml_bomb()},
         ("t.meta.yaml", "more than 20,000 values"))
    case("sidecar-oversize", k, est + ["--profile", "{d}/t.csv"], {"t.csv": table, "t.meta.yaml": Sparse(3 * MiB)},
         ("t.meta.yaml", "3 MiB", "at most 1 MiB"))
    case("calibration-alias-bomb", k, est + ["--calibration", "{d}/cal.yaml"], {"cal.yaml": yaml_bomb() + cal_text()},
         ("cal.yaml", "more than 20,000 values"))
    case("calibration-oversize", k, est + ["--calibration", "{d}/cal.yaml"], {"cal.yaml": Sparse(50 * MiB)},
         ("cal.yaml", "50 MiB"))
    wl_case("hardware-alias-bomb", k, wl_text({"hardware.gpu": "hw.yaml", "model": "smollm2-135m"}),
            ("hw.yaml", "more than 20,000 values"), {"hw.yaml": yaml_bomb() + HW}, cmds=("simulate",))
    case("hardware-alias-bomb-calibrate", k, ["calibrate", "{d}/t.csv", "--gpu", "{d}/hw.yaml", "-o", "{d}/out/c.yaml"],
         {"hw.yaml": yaml_bomb(12) + HW, "t.csv": STEP_TABLE}, ("hw.yaml", "more than 20,000 values"),
         outputs=("out/c.yaml",))
    case("table-oversize", k, est + ["--profile", "{d}/t.csv"], {"t.csv": Sparse(9 * MiB)},
         ("t.csv", "9 MiB", "at most 8 MiB"))
    case("table-oversize-calibrate", k, ["calibrate", "{d}/t.csv", "-o", "{d}/out/c.yaml"],
         {"t.csv": Sparse(64 * MiB)}, ("t.csv", "64 MiB"), outputs=("out/c.yaml",))


REQ_TABLE = ("id,kind,gpu,model,tp,engine,concurrency,input_tokens,output_tokens,ttft_mean_ms,tpot_mean_ms\n"
             "a,request,h100-sxm,llama-3.1-8b,1,vllm,1,512,64,30,7\n"
             "b,request,h100-sxm,llama-3.1-8b,1,vllm,4,512,64,40,8\n")


def _duplicate_cases() -> None:
    k = "table-duplicates"
    step_row = STEP_TABLE.splitlines()[2]
    tables = [
        ("dup-column", STEP_TABLE.replace("context_tokens,step_ms", "step_ms,step_ms"), ("line 1", "step_ms", "twice")),
        ("dup-id", STEP_TABLE + step_row + "\n", ("line 5", "id 'b'", "line 3")),
        ("repeated-row", STEP_TABLE + "d" + step_row[1:] + "\n", ("line 5", "row 'd'", "repeats line 3")),
        ("extra-cells", STEP_TABLE + step_row.replace("b,", "e,", 1) + ",9,9\n", ("line 5", "11 cells", "names 9")),
    ]
    for cid, text, names in tables:
        case(f"{cid}-calibrate", k, ["calibrate", "{d}/t.csv", "-o", "{d}/out/c.yaml"], {"t.csv": text},
             ("t.csv",) + names, outputs=("out/c.yaml",))
        case(f"{cid}-estimate", k, ["estimate", "--model", "llama-3.1-8b", "--profile", "{d}/t.csv"], {"t.csv": text},
             ("t.csv",) + names)
    req = [
        ("dup-column-request", REQ_TABLE.replace("tpot_mean_ms", "ttft_mean_ms"), ("ttft_mean_ms", "twice")),
        ("dup-id-request", REQ_TABLE.replace("b,request", "a,request"), ("id 'a'", "line 2")),
        ("repeated-row-request", REQ_TABLE + REQ_TABLE.splitlines()[2].replace("b,", "c,", 1) + "\n",
         ("row 'c'", "repeats line 3")),
    ]
    for cid, text, names in req:
        case(f"{cid}-validate", k, ["validate", "{d}/t.csv"], {"t.csv": text}, ("t.csv",) + names)
    doc = json.loads((DATA / "import_vllm_result.json").read_text())
    case("repeated-row-import-jsonl", k, ["profile", "import", "{d}/r.jsonl", "-o", "{d}/out/t.csv"],
         {"r.jsonl": json.dumps(doc) + "\n" + json.dumps(doc) + "\n"}, ("r.jsonl", "record 2 repeats record 1"),
         outputs=("out/t.csv",))
    case("repeated-row-import-same-file-twice", k, ["profile", "import", "{d}/r.json", "{d}/r.json", "-o",
                                                    "{d}/out/t.csv"], {"r.json": json.dumps(doc)},
         ("repeats row r:1",), outputs=("out/t.csv",))


def _validate_cases() -> None:
    k = "validate-rows"
    pool = REQ_TABLE.replace("tpot_mean_ms\n", "tpot_mean_ms,kv_pool_tokens\n").replace(",7\n", ",7,1\n") \
        .replace(",8\n", ",8,100000\n")
    cases = [
        ("pool-below-request", pool, ("t.csv", "line 2", "kv_pool_tokens = 1", "512 input + 64 output")),
        ("rows-1e9-clients", REQ_TABLE.replace("vllm,4,512", "vllm,1000000000,512"),
         ("row b", "4,000,000,000 requests", "at most 100,000")),
        ("rows-all-at-once-1e9", REQ_TABLE.replace("concurrency", "rate_req_s,num_requests")
         .replace("vllm,4,512", "vllm,inf,1000000000,512").replace("vllm,1,512", "vllm,inf,8,512"),
         ("row b", "num_requests 1,000,000,000", "at most 100,000")),
        ("beyond-context-input-1e9", REQ_TABLE.replace("vllm,4,512", "vllm,4,1000000000"),
         ("row b", "1,000,000,064", "131,072")),
        ("beyond-context-step", STEP_TABLE.replace("32,512,9.0", "32,200000,9.0"), ("row b", "context_tokens",
                                                                                  "131,072")),
        ("not-fit-70b-tp1", REQ_TABLE.replace("llama-3.1-8b,1,vllm,4", "llama-3.1-70b,1,vllm,4"),
         ("row b", "llama-3.1-70b", "4 GPUs")),
    ]
    for cid, text, names in cases:
        case(cid, k, ["validate", "{d}/t.csv"], {"t.csv": text}, names)
    case("pool-below-request-calibrate", k, ["calibrate", "{d}/t.csv", "-o", "{d}/out/c.yaml"], {"t.csv": pool},
         ("t.csv", "kv_pool_tokens = 1"), outputs=("out/c.yaml",))


A100_CAL = ROOT / "profiles" / "calibrations" / "a100-80gb-sglang.yaml"


def _calibration_target_cases() -> None:
    k = "calibration-target"
    est = ["estimate", "--model", "llama-3.1-8b"]
    a100 = A100_CAL.read_text()
    case("a100-on-h100-estimate", k, est + ["--gpu", "h100-sxm", "--calibration", "{d}/a100.yaml"],
         {"a100.yaml": a100}, ("a100.yaml", "gpu = 'a100-80gb'", "h100-sxm"))
    case("a100-on-h100-shipped-name", k, est + ["--calibration", "a100-80gb-vllm"], {},
         ("a100-80gb-vllm", "gpu = 'a100-80gb'", "h100-sxm"))
    wl_case("a100-on-h100-workload", k, wl_text({"calibration": "a100.yaml"}), ("a100.yaml", "a100-80gb", "h100-sxm"),
            {"a100.yaml": a100}, cmds=("simulate", "solve"))
    case("a100-on-h100-validate", k, ["validate", "{d}/t.csv", "--calibration", "{d}/a100.yaml"],
         {"t.csv": REQ_TABLE, "a100.yaml": a100}, ("a100.yaml", "h100-sxm"))
    case("engine-tgi-in-calibration", k, est + ["--calibration", "{d}/cal.yaml"],
         {"cal.yaml": cal_text().replace("engine: any", "engine: tgi")}, ("cal.yaml", "engine = 'tgi'", "unknown"))
    wl_case("engine-list-in-calibration", k, wl_text({"calibration": "cal.yaml"}), ("cal.yaml", "engine"),
            {"cal.yaml": cal_text().replace("engine: any", "engine: [vllm]")}, cmds=("goodput",))
    case("gpu-not-a-name-in-calibration", k, est + ["--calibration", "{d}/cal.yaml"],
         {"cal.yaml": cal_text().replace("gpu: h100-sxm", "gpu: 3")}, ("cal.yaml", "gpu = 3"))


def _nonsense_cases() -> None:
    k = "accepted-nonsense"
    two = {"hardware.gpu": ["h100-sxm", "h200"]}
    for cid, prices, names in [
        ("priced-twice-alias", {"h100-sxm": 3.0, "h100": 1.0, "h200": 4.0},
         ("hardware.usd_per_gpu_hour.h100", "already priced", "h100-sxm")),
        ("priced-twice-case", {"h100-sxm": 3.0, "H100-SXM": 1.0, "h200": 4.0},
         ("hardware.usd_per_gpu_hour.H100-SXM", "already priced")),
    ]:
        wl_case(cid, k, wl_text({**two, "hardware.usd_per_gpu_hour": prices}), names, cmds=("solve",))
    for i, cmd in enumerate(COMMANDS):
        wl_case(f"ngram-draft-model-{cmd}", k, wl_text({"speculative": {"method": "ngram", "acceptance": 0.5,
                                                                         "draft_model": ("no-such", "llama-3.2-1b",
                                                                                         "llama-3.1-8b")[i]}}),
                ("speculative.draft_model", "ngram", "takes no draft model"), cmds=(cmd,))
    so = ["solve", "{d}/w.yaml", "--quiet", "--json", "{d}/out/r.json"]
    for cid, url, extra, names in [
        ("sqlite-mode-ro", "sqlite:///{d}/x.db?mode=ro", [], ("mode=ro", "read-only")),
        ("sqlite-immutable", "sqlite:///{d}/x.db?immutable=1", [], ("immutable=1",)),
        ("sqlite-memory-workers-2", "sqlite:///:memory:", ["--workers", "2"], (":memory:", "--workers 2",
                                                                               "share nothing")),
    ]:
        case(cid, "storage", so + ["--storage", url] + extra, {"w.yaml": wl_text()}, ("--storage",) + names,
             outputs=("out/r.json",))


def _message_cases() -> None:
    k = "messages"
    huge = "m" * 1_000_000
    wl_case("long-name-1mb-model", k, wl_text({"model": huge}), ("model", "(1,000,003 characters)"),
            cmds=("simulate",))
    case("long-name-1mb-flag", k, ["estimate", "--model", huge], {}, ("(1,000,003 characters)",))
    case("long-name-engine-flag", k, ["estimate", "--model", "llama-3.1-8b", "--engine", "e" * 100_000], {},
         ("--engine", "(100,002 characters)"))
    for cid, name, shown in [("rtl-override", "evil\u202egpj.exe", "\\u202e"),
                             ("zero-width-space", "llama\u200b-3.1-8b", "\\u200b"),
                             ("bidi-isolate", "x\u2067y\u2069", "\\u2067"),
                             ("escape-sequence", "x\x1b[2Jy", "\\x1b"),
                             ("bell", "x\x07y", "\\x07")]:
        wl_case(cid, k, wl_text({"model": name}), ("model", shown), cmds=("goodput",))
        CASES[-1].absent = tuple(ch for ch in name if not ch.isprintable())
    # a reader's own error is not wrapped again by the same reader ("w.yaml: k = v: w.yaml: k = v: ...")
    for cid, gpus, once in [("double-wrap-gpu-list", [42, "h200"], "hardware.gpu[0] = 42"),
                            ("double-wrap-gpu-list-empty", ["h100-sxm", ""], "hardware.gpu[1] = ''")]:
        wl_case(cid, k, wl_text({"hardware.gpu": gpus}), (once, "must be a non-empty string"), cmds=("simulate",))
        CASES[-1].once = ("w.yaml:", once)


def _output_path_cases() -> None:
    k = "output-path"
    if os.path.exists("/dev/full"):  # a write that fails after the work: one line, exit 2, no traceback
        case("devfull-solve-json", k, ["solve", "{d}/w.yaml", "--quiet", "--json", "/dev/full"], {"w.yaml": wl_text()},
             ("/dev/full", "No space left"))
        case("devfull-calibrate-output", k, ["calibrate", "{d}/t.csv", "-o", "/dev/full"], {"t.csv": STEP_TABLE},
             ("-o", "/dev/full", "No space left", "printed on stdout"))
        case("devfull-import-output", k, ["profile", "import", "{d}/r.json", "-o", "/dev/full"],
             {"r.json": (DATA / "import_vllm_result.json").read_text()}, ("/dev/full", "No space left"))
    case("report-parent-is-file", k, ["solve", "{d}/w.yaml", "--quiet", "--report", "{d}/out/f/rep"],
         {"w.yaml": wl_text(), "out/f": "a file"}, ("--report", "not a folder"))
    case("json-parent-is-file", k, ["solve", "{d}/w.yaml", "--quiet", "--json", "{d}/out/f/r.json"],
         {"w.yaml": wl_text(), "out/f": "a file"}, ("--json", "not a folder"))
    case("calibrate-output-parent-is-file", k, ["calibrate", "{d}/t.csv", "-o", "{d}/out/f/c.yaml"],
         {"t.csv": STEP_TABLE, "out/f": "a file"}, ("-o", "not a folder"))
    case("run-append-output-is-folder", k, ["profile", "run", "--url", "http://127.0.0.1:9/v1", "--model", "m",
                                            "--append", "-o", "{d}/out/tdir"], {"out/tdir/x": "1"}, ("-o", "directory"))


for _build in (_workload_cases, _yaml_text_cases, _context_cases, _trace_cases, _model_cases, _hardware_cases,
               _calibration_cases, _table_cases, _calibrate_cases, _import_cases, _run_cases, _flag_cases,
               _storage_cases, _infeasible_cases, _limit_cases, _duplicate_cases, _validate_cases,
               _calibration_target_cases, _nonsense_cases, _message_cases, _output_path_cases):
    _build()


# ---- the runner ------------------------------------------------------------------------------------

def _write(d: Path, files: dict) -> None:
    (d / "out").mkdir(exist_ok=True)
    for rel, content in files.items():
        p = d / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, Sparse):
            with p.open("wb") as f:
                f.truncate(content.size)
        elif isinstance(content, bytes):
            p.write_bytes(content)
        else:
            p.write_text(content)


def run_case(c: Case, d: Path):
    _write(d, c.files)
    argv = [a.replace("{d}", str(d)) for a in c.argv]
    before = {p.name for p in (d / "out").iterdir()}
    res = CliRunner().invoke(main, argv, catch_exceptions=True)
    return res, argv, before


@pytest.mark.parametrize("c", CASES, ids=[f"{c.kind}:{c.id}" for c in CASES])
def test_bad_input(c: Case, tmp_path: Path) -> None:
    res, argv, before = run_case(c, tmp_path)
    shown = f"kvtune {' '.join(argv)}\nexit {res.exit_code}\nstderr: {res.stderr!r}\nstdout: {res.stdout[-500:]!r}"
    assert isinstance(res.exception, SystemExit) or res.exception is None, \
        f"unexpected {type(res.exception).__name__}: {res.exception}\n{shown}"
    assert res.exit_code == c.code, shown
    err_lines = [ln for ln in res.stderr.splitlines() if ln.startswith("Error:")]
    assert len(err_lines) == 1, shown
    assert "Traceback" not in res.stderr + res.stdout, shown
    line = err_lines[0]
    assert UNFORESEEN not in line, f"caught only by the readers' last net\n{shown}"
    assert line.isprintable() and len(line) <= 2100, f"not one short printable line\n{shown[:3000]}"
    for piece in c.names:
        assert piece.replace("{d}/", "").lower() in line.lower(), f"{piece!r} not named\n{shown}"
    for piece in c.once:
        assert line.count(piece) == 1, f"{piece!r} not exactly once\n{shown}"
    for piece in c.absent:
        assert piece not in line, f"{piece!r} in the line\n{shown}"
    for rel in c.outputs:
        assert not (tmp_path / rel).exists(), f"{rel} was written\n{shown}"
    left = {p.name for p in (tmp_path / "out").iterdir()} - before - set(c.whole)
    assert not left, f"left behind in out/: {left}\n{shown}"
    for rel in c.whole:
        p = tmp_path / "out" / rel
        if p.suffix == ".json" and p.exists():
            assert json.loads(p.read_text())["status"] != "ok", shown


def test_corpus_size_and_kinds() -> None:
    kinds = Counter(c.kind for c in CASES)
    assert len(CASES) >= 200, kinds
    commands = Counter(c.argv[0] if c.argv[0] != "profile" else f"profile {c.argv[1]}" for c in CASES)
    for cmd in ("estimate", "simulate", "goodput", "solve", "profile import", "profile run", "calibrate"):
        assert commands[cmd] >= 5, commands


def corpus_counts() -> tuple[Counter, Counter]:
    """(cases per kind, cases per command): printed by ``python tests/cli/test_bad_inputs.py``."""
    kinds = Counter(c.kind for c in CASES)
    commands = Counter(c.argv[0] if c.argv[0] != "profile" else f"profile {c.argv[1]}" for c in CASES)
    return kinds, commands


FAULTS = {  # a case's fault, from a keyword in its id (first match wins)
    "YAML alias bomb / recursive alias": ("alias-bomb", "recursive-alias"),
    "file over its size limit": ("oversize",),
    "duplicated column / id / row": ("dup-column", "dup-id", "repeated-row", "extra-cells"),
    "row kvtune cannot predict": ("pool-below-request", "rows-1e9", "rows-all-at-once", "beyond-context",
                                  "not-fit-70b"),
    "calibration for another GPU / unknown engine": ("a100-on-h100", "in-calibration"),
    "GPU priced twice": ("priced-twice",),
    "ngram with a draft model": ("ngram-draft",),
    "read-only / in-memory storage": ("mode-ro", "immutable", "memory-workers"),
    "long values, control and bidi characters, doubled prefix": ("long-name", "rtl-", "zero-width", "bidi-",
                                                                 "escape-sequence", "bell", "double-wrap"),
    "output path unwritable / full device": ("devfull", "parent-is-file", "append-output"),
    "not UTF-8 / binary": ("utf8", "utf16", "binary", "latin1"),
    "beyond float range / non-finite": ("nan", "inf", "1e400", "digits", "1e23", "1e20", "1e300", "1e999", "huge",
                                        "1e12", "2to40", "1e6", "1e20"),
    "storage": ("journal", "sqlite", "scheme", "rdb"),
    "context length": ("300k", "prompt-plus-output", "llama2-8k", "uniform-max", "open-tail", "output-long",
                       "context-beyond"),
}


def fault_of(c: Case) -> str:
    for name, words in FAULTS.items():
        if any(w in c.id for w in words):
            return name
    return "other (structure, range, type, missing, flags)"


if __name__ == "__main__":
    k, c = corpus_counts()
    print(f"{len(CASES)} cases\nby kind (the file or flag at fault):")
    for name, n in sorted(k.items()):
        print(f"  {name:<20} {n}")
    print("by command:")
    for name, n in sorted(c.items()):
        print(f"  {name:<20} {n}")
    print("by fault (keyword in the case id):")
    for name, n in Counter(fault_of(x) for x in CASES).most_common():
        print(f"  {name:<48} {n}")


# Storage faults, calibrate's refusals and warnings, and the valid inputs the checks must keep
# accepting (YAML 1.2 floats, requests exactly at the context limit, RoPE-scaled contexts).

TINY = {"model": "llama-3.1-8b", "hardware": {"gpu": "h100-sxm", "usd_per_gpu_hour": 3.0},
        "workload": {"rate_req_s": 5, "classes": [{"input_tokens": 512, "output_tokens": 64}]},
        "slo": {"ttft_ms": 1000, "tpot_ms": 50},
        "search": {"tp": [1], "batch_cap": [8, 64], "kv_dtype": ["bf16"], "chunk_tokens": [2048, 2048]}}


def _run(argv):
    res = CliRunner().invoke(main, [str(a) for a in argv], catch_exceptions=True)
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    return res


def _one_error(res) -> str:
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("Error:")]
    assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    return lines[0]


@pytest.fixture
def workload(tmp_path) -> Path:
    """TINY, aggregated deployments only: the study's storage holds the aggregated search alone (the
    disaggregated search keeps nothing there), so the storage tests need not run it three times."""
    p = tmp_path / "w.yaml"
    p.write_text(yaml.safe_dump({**TINY, "search": {**TINY["search"], "deployment": ["aggregated"]}}))
    return p


# ---- storage -------------------------------------------------------------------------------------

def test_journal_cut_mid_line_is_refused_and_never_appended_to(tmp_path, workload):
    j = tmp_path / "j.log"
    argv = ["solve", workload, "--quiet", "--trials", "2", "--storage", f"journal:{j}"]
    assert _run(argv).exit_code == 0
    whole = j.read_bytes()
    assert _run(argv).exit_code == 0, "a whole journal resumes"
    whole = j.read_bytes()
    cut = whole[: len(whole) - 15]          # a write interrupted mid-record
    j.write_bytes(cut)
    for _ in range(2):                      # refused every time, and left exactly as it was
        res = _run(argv)
        assert res.exit_code == 2
        line = _one_error(res)
        assert "j.log" in line and "cut short" in line and str(len(cut) - len(cut.split(b"\n")[-1])) in line
        assert j.read_bytes() == cut
    j.write_bytes(cut[: len(cut) - len(cut.split(b"\n")[-1])])  # truncated as the message says: resumes
    assert _run(argv).exit_code == 0


def test_journal_garbage_line_is_refused(tmp_path):
    j = tmp_path / "j.log"
    j.write_bytes(b'{"op_code": 0}\nnot json\n{"op_code": 1}\n')
    with pytest.raises(InputError, match=r"line 2 \(byte offset 15\) is not a JSON record"):
        check_journal(j, f"journal:{j}")


def test_partial_last_line_of_a_writer_in_flight_is_not_a_fault(tmp_path):
    """Another process appending holds the journal's lock: the check waits for it and re-reads."""
    from optuna.storages.journal import JournalFileSymlinkLock

    j = tmp_path / "j.log"
    j.write_bytes(b'{"op_code": 0}\n{"op_co')
    lock = JournalFileSymlinkLock(str(j))
    lock.acquire()

    def finish():
        time.sleep(0.3)
        with j.open("ab") as f:
            f.write(b'de": 1}\n')
        lock.release()

    t = threading.Thread(target=finish)
    t.start()
    check_journal(j, f"journal:{j}")   # no error: the record was whole once the writer let go
    t.join()


def test_corrupt_sqlite_is_checked_before_use(tmp_path, workload):
    db = tmp_path / "k.db"
    argv = ["solve", workload, "--quiet", "--trials", "2", "--storage", f"sqlite:///{db}"]
    assert _run(argv).exit_code == 0
    assert _run(argv).exit_code == 0, "a sound database resumes"
    data = bytearray(db.read_bytes())
    data[100:4096] = b"\xa5" * (4096 - 100)  # the first page's body overwritten, header intact
    db.write_bytes(bytes(data))
    res = _run(argv)
    assert res.exit_code == 2
    assert "k.db" in _one_error(res) and "damaged" in _one_error(res)
    assert db.read_bytes() == bytes(data)


@pytest.mark.parametrize("url", [None, "", "sqlite:///:memory:", "journal:new.log", "sqlite:///new.db",
                                 "postgresql://u@h/db"])
def test_storage_urls_that_are_fine(url, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    check_storage_url(url)
    assert not (tmp_path / "new.log").exists() and not (tmp_path / "new.db").exists()  # checking writes nothing


# ---- calibrate ------------------------------------------------------------------------------------

STEPS = ("id,kind,gpu,model,tp,phase,batch,context_tokens,step_ms\n"
         "a,step,h100-sxm,llama-3.1-8b,1,decode,1,512,7.0\n"
         "b,step,h100-sxm,llama-3.1-8b,1,decode,32,512,9.0\n"
         "c,step,h100-sxm,llama-3.1-8b,1,decode,64,2048,12.0\n")
CONTRADICTORY = ("id,kind,gpu,model,tp,phase,batch,context_tokens,step_ms\n"
                 + "".join(f"{x}{i},step,h100-sxm,llama-3.1-8b,1,decode,{b},{c},{ms}\n"
                           for i, (b, c) in enumerate([(1, 512), (8, 512), (64, 2048)])
                           for x, ms in (("lo", 1), ("hi", 1000))))


def test_contradictory_rows_warn_in_output_and_file(tmp_path):
    (tmp_path / "t.csv").write_text(CONTRADICTORY)
    out = tmp_path / "c.yaml"
    # --if-worse keep: write the fit even where it predicts held-out rows worse than the base (the
    # default would write the base's parameters; tests/measure/test_calibration_cv.py covers that)
    res = _run(["calibrate", tmp_path / "t.csv", "-o", out, "--params", "bw_efficiency,step_overhead_s",
                "--if-worse", "keep"])
    assert res.exit_code == 0, res.stderr
    warned = [ln.strip() for ln in res.stdout.splitlines() if ln.strip().startswith("warning:")]
    assert any("lo0 and hi0" in w and "1000.0x apart" in w for w in warned), res.stdout
    assert any("worse than its start" in w for w in warned), res.stdout
    saved = yaml.safe_load(out.read_text())["fit"]["warnings"]
    assert len(saved) == len(warned) and any("worse than its start" in w for w in saved)


def test_contradictory_rows_warn_in_json_too(tmp_path):
    (tmp_path / "t.csv").write_text(CONTRADICTORY)
    res = _run(["calibrate", tmp_path / "t.csv", "-o", tmp_path / "c.yaml", "--params", "bw_efficiency", "--json"])
    assert res.exit_code == 0
    assert any("describe the same configuration" in w for w in json.loads(res.stdout)["fit"]["warnings"])
    assert "warning:" in res.stderr


def test_consistent_rows_fit_without_warnings(tmp_path):
    (tmp_path / "t.csv").write_text(STEPS)
    out = tmp_path / "c.yaml"
    res = _run(["calibrate", tmp_path / "t.csv", "-o", out, "--params", "bw_efficiency,step_overhead_s"])
    assert res.exit_code == 0 and "warning:" not in res.stdout
    assert "warnings" not in yaml.safe_load(out.read_text())["fit"]


def test_contradictions_groups_identical_configs_only(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text(CONTRADICTORY)
    assert len(contradictions(read_table(p))) == 3
    p.write_text(STEPS + "d,step,h100-sxm,llama-3.1-8b,1,decode,1,512,7.9\n")  # a repeat within noise
    assert contradictions(read_table(p)) == []


@pytest.mark.parametrize("value", ["-3", "0", "nan", "inf", "-inf", "1e400"])
def test_calibrate_refuses_non_finite_or_non_positive_measurements(tmp_path, value):
    (tmp_path / "t.csv").write_text(STEPS + f"d,step,h100-sxm,llama-3.1-8b,1,decode,1,512,{value}\n")
    res = _run(["calibrate", tmp_path / "t.csv", "-o", tmp_path / "c.yaml"])
    assert res.exit_code == 2
    line = _one_error(res)
    assert "t.csv: line 5: column step_ms" in line and value in line
    assert not (tmp_path / "c.yaml").exists()


# ---- what the checks must keep accepting --------------------------------------------------------------

def test_yaml_1_2_exponent_floats_are_numbers(tmp_path):
    p = tmp_path / "w.yaml"
    p.write_text(yaml.safe_dump(TINY).replace("rate_req_s: 5", "rate_req_s: 1e12"))
    assert load_workload(p).workload.rate_req_s == 1e12
    p.write_text(yaml.safe_dump(TINY).replace("rate_req_s: 5", "rate_req_s: 2.5E-1"))
    assert load_workload(p).workload.rate_req_s == 0.25


@pytest.mark.parametrize("text", ["1e400", "1" + "0" * 400, "-1e999"])
def test_numbers_beyond_float_range_are_refused_with_key_and_text(tmp_path, text):
    p = tmp_path / "w.yaml"
    p.write_text(yaml.safe_dump(TINY).replace("rate_req_s: 5", f"rate_req_s: {text}"))
    with pytest.raises(InputError, match=r"w.yaml: line \d+: workload.rate_req_s = .*beyond the range"):
        load_workload(p)


def test_requests_exactly_at_the_context_limit_are_accepted():
    d = json.loads(json.dumps(TINY))
    d["workload"]["classes"][0].update(input_tokens=131_000, output_tokens=72)   # 131,072: the limit
    load_workload_dict(d)
    d["workload"]["classes"][0]["output_tokens"] = 73
    with pytest.raises(InputError, match=r"classes\[0\].output_tokens = 73: class class0: prompt \+ output reaches "
                                         r"131,000 \+ 73 = 131,073 tokens, beyond llama-3.1-8b's context of 131,072"):
        load_workload_dict(d)


def test_context_follows_rope_scaling_as_vllm_reads_it():
    cfg = json.loads((ROOT / "profiles" / "models" / "llama-3.1-8b.json").read_text())
    assert model_from_config(cfg, "x").max_context_tokens == 131_072          # llama3 scaling: stated length
    yarn = {**cfg, "max_position_embeddings": 32_768,
            "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32_768}}
    assert model_from_config(yarn, "x").max_context_tokens == 131_072
    linear = {**cfg, "max_position_embeddings": 4096, "rope_scaling": {"type": "linear", "factor": 2.0}}
    assert model_from_config(linear, "x").max_context_tokens == 8192
    none = {k: v for k, v in cfg.items() if k != "max_position_embeddings"}
    assert model_from_config(none, "x").max_context_tokens == 0               # not stated: not checked


def test_a_journal_cut_short_during_a_run_is_not_appended_to(tmp_path):
    import optuna

    from kvtune.optimizer.search import make_storage

    j = tmp_path / "j.log"
    storage = make_storage(f"journal:{j}")
    study = optuna.create_study(storage=storage, study_name="s")
    study.enqueue_trial({"x": 1})
    with j.open("ab") as f:           # another process killed mid-record
        f.write(b'{"op_code": 4, "wor')
    cut = j.read_bytes()
    with pytest.raises(InputError, match=r"cut short while this run went on.*nothing appended"):
        study.enqueue_trial({"x": 2})
    assert j.read_bytes() == cut


def test_an_imported_model_name_with_a_line_break_reads_back(tmp_path):
    """Found by bench/fuzz_readers.py: a model_id of "\\r" split the written row in two."""
    d = json.loads((ROOT / "tests" / "data" / "import_vllm_result.json").read_text())
    d["model_id"] = "meta-llama\r\nLlama\r-3.1\n8B"
    (tmp_path / "r.json").write_text(json.dumps(d))
    res = _run(["profile", "import", tmp_path / "r.json", "-o", tmp_path / "t.csv"])
    assert res.exit_code == 0, res.stderr
    (row,) = read_table(tmp_path / "t.csv")
    assert row.model == "meta-llama Llama -3.1 8B"
