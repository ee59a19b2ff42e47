"""Hypothesis fuzzing of every reader of user files: the workload loader, the model config reader,
the trace readers (Azure, BurstGPT, Mooncake, kvtune CSV), the benchmark importers and the
profile table reader. The only exception allowed out of a reader is kvtune's own
``KvtuneError``; what a reader accepts must also be usable (requests sample to finite int64
lengths, a model's sizes are finite, rows re-read from the CSV they write).

CI runs a modest, derandomised number of examples per reader (``conftest.py`` loads the
``kvtune`` profile); ``KVTUNE_FUZZ_EXAMPLES=10000`` (or ``bench/fuzz_readers.py``) runs more.
"""

from __future__ import annotations

import copy
import json
import math
import os
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvtune.costmodel.files import UNFORESEEN
from kvtune.costmodel.errors import KvtuneError
from kvtune.costmodel.models import get_model, model_from_config
from kvtune.costmodel.profile_table import read_table
from kvtune.optimizer.importers import import_file, rows_to_csv
from kvtune.optimizer.traces import read_trace
from kvtune.optimizer.workload import load_workload, load_workload_dict

HERE = Path(__file__).parent.parent
ROOT = HERE.parent
N_EXAMPLES = int(os.environ.get("KVTUNE_FUZZ_EXAMPLES", "60"))
COUNTS: Counter = Counter()   # examples run per reader (bench/fuzz_readers.py reports them)
ACCEPTED: Counter = Counter()  # of those, inputs the reader accepted
_DIR = Path(tempfile.mkdtemp(prefix="kvtune-fuzz-"))

FUZZ = settings(max_examples=N_EXAMPLES, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])

# ---- values a hostile file may hold ----------------------------------------------------------------

NASTY_TEXT = ["", " ", "nan", "NaN", "inf", "-inf", "Infinity", "1e400", "-1e400", "1" + "0" * 400, "1e23", "0",
              "-1", "0.5", "1e-320", "true", "null", "[]", "{}", "\x00", "caf\xe9", "\u202e", "~nosuchuser/x",
              "../../etc/passwd", "a,b", '"', "9" * 30, "2023-11-16 18:15:46.7", "2023-02-30 00:00:00", "fp8", "bf16"]
scalars = st.one_of(
    st.integers(min_value=-(10**30), max_value=10**30),
    st.sampled_from([0, 1, -1, 2**31, 2**63, 2**64, 10**400, 10**23]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(), st.none(),
    st.sampled_from(NASTY_TEXT), st.text(max_size=12),
)
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                       st.dictionaries(st.text(max_size=8), inner, max_size=3)),
                      max_leaves=6)
# plausible numbers: inputs a reader accepts often enough for what comes after it to run too
plausible = st.one_of(st.integers(1, 200_000), st.floats(1e-3, 1e5), st.sampled_from([0.5, 1.0, 1e12, 2**31]))
replacement = st.one_of(values, st.sampled_from(NASTY_TEXT), plausible)


def _paths(obj, prefix=()):
    """Every (path, value) of a nested dict/list, containers included."""
    yield prefix, obj
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _paths(v, prefix + (i,))


@st.composite
def mutated(draw, base: dict, n_max: int = 3):
    """``base`` with up to ``n_max`` edits: a value replaced, a key removed, or a key added."""
    doc = copy.deepcopy(base)
    for _ in range(draw(st.integers(1, n_max))):
        paths = [p for p, _ in _paths(doc) if p]
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent = doc
        for k in path[:-1]:
            parent = parent[k]
        op = draw(st.sampled_from(["replace", "replace", "replace", "delete", "add"]))
        if op == "replace":
            parent[path[-1]] = draw(replacement)
        elif op == "delete":
            del parent[path[-1]]
        elif isinstance(parent, dict):
            parent[draw(st.sampled_from(["min", "max", "share", "dist", "trace", "x", "prefix_tokens"]))] = draw(values)
    return doc


def _write(name: str, content: str | bytes) -> Path:
    p = _DIR / name
    if isinstance(content, bytes):
        p.write_bytes(content)
    else:
        p.write_bytes(content.encode("utf-8", "surrogatepass"))
    return p


def _ours(fn, *args):
    """Run a reader; a KvtuneError is a refusal (None), anything else propagates and fails the test."""
    try:
        return fn(*args)
    except KvtuneError as exc:
        msg = str(exc)
        assert msg and "\n" not in msg.strip(), f"not one line: {msg!r}"
        # the readers' last net (costmodel.files.reading) must not be what caught it
        assert UNFORESEEN not in msg, msg
        return None


# ---- the workload loader ----------------------------------------------------------------------------

WORKLOAD = {"model": "llama-3.1-8b",
            "hardware": {"gpu": "h100-sxm", "usd_per_gpu_hour": 3.0, "gpus_per_node": 8, "max_nodes": 2},
            "workload": {"rate_req_s": 5, "classes": [
                {"name": "chat", "share": 0.7, "input_tokens": {"dist": "lognormal", "mean": 900, "sigma": 0.8,
                                                                "max": 8000},
                 "output_tokens": {"dist": "normal", "mean": 200, "std": 50, "min": 1}, "prefix_tokens": 100},
                {"name": "rag", "share": 0.3, "input_tokens": {"dist": "uniform", "min": 1000, "max": 3000},
                 "output_tokens": 64, "slo": {"ttft_ms": 2000}}]},
            "slo": {"ttft_ms": 1000, "tpot_ms": 50, "attainment": 0.9},
            "speculative": {"method": "eagle3", "acceptance": 0.7},
            "search": {"tp": [1, 2], "batch_cap": [8, 256], "kv_dtype": ["bf16", "fp8"], "spec_k": [0, 4],
                       "chunk_tokens": [512, 8192], "trials": 5, "seed": 0}}


# hardware.gpu as a list of types, each with its price (the GPU type is searched)
WORKLOAD_TYPES = {**copy.deepcopy(WORKLOAD), "hardware": {"gpu": ["h100-sxm", "h200"], "gpus_per_node": 8,
                                                          "usd_per_gpu_hour": {"h100-sxm": 3.0, "h200": 4.0}}}


def check_workload_dict(doc) -> None:
    COUNTS["workload"] += 1
    spec = _ours(load_workload_dict, doc, str(_DIR / "w.yaml"))
    if spec is None:
        return
    ACCEPTED["workload"] += 1
    reqs = _ours(spec.requests, 30, 0)
    if reqs is not None:
        for a in (reqs.input_tokens, reqs.output_tokens):
            assert a.dtype == np.int64 and (a >= 1).all()
        assert np.isfinite(reqs.arrival_s).all()
    json.dumps(spec.to_dict())  # its normalised form is writable


@FUZZ
@given(st.one_of(mutated(WORKLOAD), mutated(WORKLOAD_TYPES)))
def test_fuzz_workload_dict(doc):
    check_workload_dict(doc)


def _yaml(doc) -> str:
    return yaml.safe_dump(doc, allow_unicode=True)


workload_text = st.one_of(
    st.one_of(mutated(WORKLOAD), mutated(WORKLOAD_TYPES)).map(_yaml),   # YAML the checks then read
    st.binary(max_size=200),
    st.text(max_size=200),
    st.lists(st.sampled_from(["model: llama-3.1-8b", "hardware: {gpu: h100-sxm, usd_per_gpu_hour: 3}",
                              "workload: {rate_req_s: 1e12, classes: [{input_tokens: 10, output_tokens: 5}]}",
                              "slo: {ttft_ms: 1e400}", "slo: {ttft_ms: .nan}", "  - 1", "? [a]", ": x", "&a [*a]",
                              "model: !!python/name:os.system", "---", "\t", "key: key: key", "a: 1\na: 2",
                              "workload: {rate_req_s: 1" + "0" * 400 + "}", "\x00", "caf\xe9: 1", "%YAML 1.1"]),
             max_size=8).map("\n".join),
)


def check_workload_file(content) -> None:
    COUNTS["workload file"] += 1
    if _ours(load_workload, _write("w.yaml", content)) is not None:
        ACCEPTED["workload file"] += 1


@FUZZ
@given(workload_text)
def test_fuzz_workload_file(content):
    check_workload_file(content)


# ---- the model config reader ------------------------------------------------------------------------

LLAMA = json.loads((ROOT / "profiles" / "models" / "llama-3.1-8b.json").read_text())
MOE = json.loads((ROOT / "profiles" / "models" / "deepseek-v3.json").read_text())


def check_model_config(cfg) -> None:
    COUNTS["model config"] += 1
    arch = _ours(model_from_config, cfg, "fuzz", "", "fuzz/config.json")
    if arch is None:
        return
    ACCEPTED["model config"] += 1
    for v in (arch.total_params, arch.active_params, arch.kv_bytes_per_token("bf16"),
              arch.kv_bytes_per_token_per_gpu("fp8", 8), arch.dense_flops_per_token(),
              arch.attn_flops_per_token_per_ctx(), arch.kv_read_tokens(4096)):
        assert math.isfinite(v) and v >= 0, (v, cfg)


@FUZZ
@given(st.one_of(mutated(LLAMA, 4), mutated(MOE, 4)))
def test_fuzz_model_config(cfg):
    check_model_config(cfg)


def check_model_file(content) -> None:
    COUNTS["model config file"] += 1
    d = _DIR / "m"
    d.mkdir(exist_ok=True)
    (d / "config.json").write_bytes(content if isinstance(content, bytes) else content.encode("utf-8", "surrogatepass"))
    if _ours(get_model, str(d / "config.json")) is not None:
        ACCEPTED["model config file"] += 1


@FUZZ
@given(st.one_of(st.binary(max_size=300), st.text(max_size=100),
                 mutated(LLAMA).map(lambda c: json.dumps(c, allow_nan=True)),
                 st.sampled_from(["[" * 5000, '{"hidden_size": ' + "9" * 5000 + "}", "NaN", "{}"])))
def test_fuzz_model_config_file(content):
    check_model_file(content)


# ---- trace readers ------------------------------------------------------------------------------------

HEADERS = {
    "azure": "TIMESTAMP,ContextTokens,GeneratedTokens",
    "burstgpt": "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type",
    "kvtune": "arrival_s,input_tokens,output_tokens,prefix_tokens,prefix_group",
}
cell = st.one_of(st.sampled_from(NASTY_TEXT), st.integers(-5, 10**6).map(str),
                 st.floats(allow_nan=True, allow_infinity=True).map(repr), st.text(max_size=6))
good_row = {
    "azure": st.tuples(st.sampled_from(["2023-11-16 18:15:46.7053013", "2023-11-16 18:15:47", "1700000000.5"]),
                       st.integers(1, 5000).map(str), st.integers(0, 500).map(str)),
    "burstgpt": st.tuples(st.floats(0, 1e5).map(repr), st.just("GPT-4"), st.integers(0, 5000).map(str),
                          st.integers(0, 500).map(str), st.just("9"), st.just("API log")),
    "kvtune": st.tuples(st.floats(0, 1e5).map(repr), st.integers(1, 5000).map(str), st.integers(1, 500).map(str),
                        st.just("0"), st.just("-1")),
}


@st.composite
def csv_trace(draw):
    fmt = draw(st.sampled_from(sorted(HEADERS)))
    rows = []
    for _ in range(draw(st.integers(0, 6))):
        row = list(draw(good_row[fmt]))
        for _ in range(draw(st.integers(0, 2))):  # spoil some cells
            row[draw(st.integers(0, len(row) - 1))] = draw(cell)
        if draw(st.integers(0, 9)) == 0:
            row = row[: draw(st.integers(0, len(row)))]
        rows.append(",".join(row))
    return "\n".join([HEADERS[fmt]] + rows) + draw(st.sampled_from(["", "\n", "\n\n"]))


@st.composite
def mooncake_trace(draw):
    lines = []
    for _ in range(draw(st.integers(1, 6))):
        rec = {"timestamp": draw(st.integers(0, 10**6)), "input_length": draw(st.integers(1, 9000)),
               "output_length": draw(st.integers(0, 500)), "hash_ids": draw(st.lists(st.integers(0, 20), max_size=5))}
        if draw(st.booleans()):
            rec = draw(mutated(rec, 2))
        lines.append(json.dumps(rec, allow_nan=True) if draw(st.integers(0, 9)) else draw(st.text(max_size=20)))
    return "\n".join(lines) + "\n"


def check_trace(content) -> None:
    COUNTS["trace"] += 1
    tr = _ours(read_trace, _write("t.csv", content))
    if tr is None:
        return
    ACCEPTED["trace"] += 1
    assert np.isfinite(tr.arrival_s).all() and tr.arrival_s[0] == 0
    assert (tr.input_tokens >= 1).all() and (tr.output_tokens >= 1).all()


@FUZZ
@given(st.one_of(csv_trace(), mooncake_trace(), st.binary(max_size=200), st.text(max_size=200)))
def test_fuzz_traces(content):
    check_trace(content)


# ---- benchmark importers --------------------------------------------------------------------------------

def _fixture(name: str) -> dict:
    text = (HERE / "data" / name).read_text()
    return json.loads(text.splitlines()[0] if name.endswith(".jsonl") else text)


IMPORT_DOCS = [_fixture(n) for n in ("import_vllm_result.json", "import_vllm_detailed.json", "import_sglang.jsonl",
                                     "import_genai_perf.json", "import_aiperf.json", "import_aiperf_records.json",
                                     "import_llmperf_summary.json")]


def check_import(content) -> None:
    COUNTS["importers"] += 1
    rows = _ours(import_file, _write("r.json", content))
    if rows is None:
        return
    ACCEPTED["importers"] += 1
    table = _write("back.csv", rows_to_csv(rows))  # what the importer writes, the table reader reads
    read_table(table)


@FUZZ
@given(st.one_of(*(mutated(d, 3).map(lambda d: json.dumps(d, allow_nan=True)) for d in IMPORT_DOCS),
                 st.binary(max_size=200), st.text(max_size=100),
                 st.lists(mutated(IMPORT_DOCS[2], 2).map(lambda d: json.dumps(d, allow_nan=True)), min_size=2,
                          max_size=3).map("\n".join)))
def test_fuzz_importers(content):
    check_import(content)


# ---- the profile table reader ----------------------------------------------------------------------------

TABLE_HEAD = ("id,kind,gpu,engine,model,tp,phase,batch,context_tokens,chunk_tokens,spec_k,step_ms,concurrency,"
              "batch_cap,scheduler,kv_pool_tokens,rate_req_s,input_tokens,output_tokens,ttft_mean_ms,tpot_mean_ms,"
              "output_tok_s")
TABLE_ROWS = ["a,step,h100-sxm,vllm,llama-3.1-8b,1,decode,8,512,,0,7.5,,,,,,,,,,",
              "b,step,h100-sxm,vllm,llama-3.1-8b,1,prefill,1,0,2048,,30,,,,,,,,,,",
              "c,request,h100-sxm,sglang,llama-3.1-8b,2,,,,,,,16,8,prefill_first,300000,,1024,128,90,9.5,1500",
              "d,request,h100-sxm,trtllm,llama-3.1-8b,1,,,,,,,,,,,inf,128,128,,,19000"]


@st.composite
def profile_table(draw):
    rows = []
    for _ in range(draw(st.integers(0, 4))):
        cells = draw(st.sampled_from(TABLE_ROWS)).split(",")
        for _ in range(draw(st.integers(0, 2))):
            cells[draw(st.integers(0, len(cells) - 1))] = draw(cell).replace(",", ";").replace("\n", " ")
        rows.append(",".join(cells))
    return "\n".join([TABLE_HEAD] + rows) + "\n"


def check_table(content, sidecar) -> None:
    COUNTS["profile table"] += 1
    meta = _DIR / "p.meta.yaml"
    if sidecar is None:
        meta.unlink(missing_ok=True)
    else:
        _write("p.meta.yaml", sidecar)
    rows = _ours(read_table, _write("p.csv", content))
    if rows is None:
        return
    ACCEPTED["profile table"] += 1
    for r in rows:
        for v in (r.step_ms, r.ttft_mean_ms, r.tpot_mean_ms, r.output_tok_s):
            assert v is None or (math.isfinite(v) and v > 0)


@FUZZ
@given(st.one_of(profile_table(), st.binary(max_size=200), st.text(max_size=200)),
       st.one_of(st.none(), st.sampled_from(["gpu: h100-sxm\n", "tp: 1e400\n", "tp: -3\n", "- 1\n", "tp: {a: 1}\n",
                                             "gpu: [\n", "model: .nan\n"]), st.binary(max_size=30)))
def test_fuzz_profile_table(content, sidecar):
    check_table(content, sidecar)


READERS = {
    "workload": test_fuzz_workload_dict, "workload file": test_fuzz_workload_file,
    "model config": test_fuzz_model_config, "model config file": test_fuzz_model_config_file,
    "trace": test_fuzz_traces, "importers": test_fuzz_importers, "profile table": test_fuzz_profile_table,
}
