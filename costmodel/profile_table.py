"""Measured profile tables: the CSV format kvtune reads back (see profiles/README.md).

One row per measurement, units in every column name. Two kinds of row:

- ``step``: one engine iteration measured directly. ``phase`` is ``decode`` (``batch`` sequences
  each at ``context_tokens``) or ``prefill`` (a chunk of ``chunk_tokens`` after ``context_tokens``
  already cached, ``batch`` = 1); ``spec_k`` draft length; ``step_ms`` measured.
- ``request``: a benchmark run. ``concurrency`` (closed loop) or ``rate_req_s`` (open loop, ``inf``
  for all at once) with fixed ``input_tokens``/``output_tokens``; measured ``ttft_*_ms``,
  ``tpot_*_ms`` (mean/p50/p90/p99), ``output_tok_s``, ``request_s``. Optional ``batch_cap``: the
  most sequences the engine ran at once (``max_num_seqs``, ``max_batch_size``,
  ``max_running_requests``) when that was below ``concurrency``, so the rest queued. Optional
  ``scheduler``: ``mixed`` (prefill chunks ride in the decode steps: vLLM, TensorRT-LLM, SGLang
  with ``--enable-mixed-chunk``) or ``prefill_first`` (prefill batches alone, decodes wait: SGLang's
  default); empty means the engine's default. Optional ``kv_pool_tokens``: the KV pool the engine
  reported at start-up, tokens per replica (SGLang ``max_total_num_tokens``, vLLM "GPU KV cache
  size: N tokens"); empty means the pool kvtune's memory model gives.

Metadata columns on every row (a file may also carry file-level defaults in a sidecar
``NAME.meta.yaml``; row values win): ``gpu``, ``engine``, ``engine_version``, ``model``,
``weight_dtype``, ``kv_dtype``, ``tp``, ``date``, ``source``.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field, fields
from pathlib import Path

from ._data import load_yaml
from .errors import InputError

__all__ = ["ProfileRow", "COLUMNS", "read_table", "METADATA_COLUMNS"]

METADATA_COLUMNS = ("gpu", "engine", "engine_version", "model", "weight_dtype", "kv_dtype", "tp", "date", "source")
STEP_COLUMNS = ("phase", "batch", "context_tokens", "chunk_tokens", "spec_k", "step_ms")
REQUEST_COLUMNS = ("concurrency", "batch_cap", "scheduler", "kv_pool_tokens", "rate_req_s", "input_tokens", "output_tokens", "num_requests",
                   "ttft_mean_ms", "ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms",
                   "tpot_mean_ms", "tpot_p50_ms", "tpot_p90_ms", "tpot_p99_ms",
                   "output_tok_s", "request_s")
COLUMNS = ("id", "kind") + METADATA_COLUMNS + STEP_COLUMNS + REQUEST_COLUMNS
SCHEDULERS = ("", "mixed", "prefill_first")

_INT = {"tp", "batch", "context_tokens", "chunk_tokens", "spec_k", "concurrency", "batch_cap", "kv_pool_tokens", "input_tokens",
        "output_tokens", "num_requests"}
_FLOAT = {"step_ms", "rate_req_s", "ttft_mean_ms", "ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms",
          "tpot_mean_ms", "tpot_p50_ms", "tpot_p90_ms", "tpot_p99_ms", "output_tok_s", "request_s"}


@dataclass(frozen=True)
class ProfileRow:
    id: str
    kind: str                       # step | request
    gpu: str = ""
    engine: str = ""
    engine_version: str = ""
    model: str = ""
    weight_dtype: str = "bf16"
    kv_dtype: str = "bf16"
    tp: int = 1
    date: str = ""
    source: str = ""
    phase: str = ""                 # decode | prefill (step rows)
    batch: int | None = None
    context_tokens: int | None = None
    chunk_tokens: int | None = None
    spec_k: int | None = None
    step_ms: float | None = None
    concurrency: int | None = None
    batch_cap: int | None = None     # the engine's running-sequence cap, when below concurrency
    scheduler: str = ""              # mixed | prefill_first | "" (the engine's default)
    kv_pool_tokens: int | None = None  # the engine's reported KV pool (tokens per replica)
    rate_req_s: float | None = None  # math.inf for all-at-once
    input_tokens: int | None = None
    output_tokens: int | None = None
    num_requests: int | None = None
    ttft_mean_ms: float | None = None
    ttft_p50_ms: float | None = None
    ttft_p90_ms: float | None = None
    ttft_p99_ms: float | None = None
    tpot_mean_ms: float | None = None
    tpot_p50_ms: float | None = None
    tpot_p90_ms: float | None = None
    tpot_p99_ms: float | None = None
    output_tok_s: float | None = None
    request_s: float | None = None

    def as_csv_row(self) -> dict[str, str]:
        out = {}
        for c in COLUMNS:
            v = getattr(self, c)
            if v is None:
                out[c] = ""
            elif isinstance(v, float) and math.isinf(v):
                out[c] = "inf"
            elif isinstance(v, float):
                out[c] = f"{v:.6g}"
            else:
                out[c] = str(v)
        return out


def _convert(path: Path, line: int, key: str, raw: str):
    if raw == "":
        return None
    try:
        if key in _INT:
            v = float(raw)
            if v != int(v):
                raise ValueError
            return int(v)
        if key in _FLOAT:
            return math.inf if raw.strip().lower() in ("inf", "infinity") else float(raw)
    except ValueError:
        raise InputError(f"{path}: line {line}: column {key} = {raw!r} is not a "
                         f"{'whole number' if key in _INT else 'number'}") from None
    return raw


def read_table(path: str | Path) -> list[ProfileRow]:
    """Read a profile table (and its ``.meta.yaml`` sidecar if present); check every row."""
    p = Path(path)
    if not p.exists():
        raise InputError(f"profile table {p}: no such file")
    meta_path = p.with_suffix(".meta.yaml")
    meta = load_yaml(meta_path) if meta_path.exists() else {}
    if meta and not isinstance(meta, dict):
        raise InputError(f"{meta_path}: expected a mapping of metadata keys")
    with p.open(newline="") as f:
        reader = csv.DictReader(f)
        if not reader.fieldnames:
            raise InputError(f"{p}: empty file (no header)")
        unknown = [c for c in reader.fieldnames if c not in COLUMNS]
        if unknown:
            raise InputError(f"{p}: unknown column '{unknown[0]}' (columns: {', '.join(COLUMNS)})")
        for c in ("kind",):
            if c not in reader.fieldnames:
                raise InputError(f"{p}: missing column '{c}'")
        rows = []
        for i, raw in enumerate(reader, start=2):
            vals = {}
            for key in COLUMNS:
                cell = (raw.get(key) or "").strip()
                if cell == "" and key in meta:
                    cell = str(meta[key])
                v = _convert(p, i, key, cell)
                if v is not None:
                    vals[key] = v
            vals.setdefault("id", f"{p.stem}:{i}")
            kind = vals.get("kind")
            if kind == "step":
                need = ("phase", "batch", "context_tokens", "step_ms")
                if vals.get("phase") not in ("decode", "prefill"):
                    raise InputError(f"{p}: line {i}: column phase = {vals.get('phase', '')!r}, expected decode or prefill")
            elif kind == "request":
                need = ("input_tokens", "output_tokens")
                if "concurrency" not in vals and "rate_req_s" not in vals:
                    raise InputError(f"{p}: line {i}: a request row needs concurrency or rate_req_s")
                if vals.get("scheduler", "") not in SCHEDULERS:
                    raise InputError(f"{p}: line {i}: column scheduler = {vals['scheduler']!r}, expected "
                                     f"{' or '.join(x for x in SCHEDULERS if x)} (or empty: the engine's default)")
                for key in ("batch_cap", "kv_pool_tokens"):
                    if vals.get(key) is not None and vals[key] < 1:
                        raise InputError(f"{p}: line {i}: column {key} = {vals[key]}, expected at least 1")
                if not any(k in vals for k in ("ttft_mean_ms", "tpot_mean_ms", "ttft_p99_ms", "output_tok_s", "request_s")):
                    raise InputError(f"{p}: line {i}: a request row needs a measured ttft_*, tpot_*, output_tok_s or request_s column")
            else:
                raise InputError(f"{p}: line {i}: column kind = {kind!r}, expected step or request")
            for key in need:
                if key not in vals:
                    raise InputError(f"{p}: line {i}: missing value for column {key}")
            rows.append(ProfileRow(**vals))
    if not rows:
        raise InputError(f"{p}: no rows")
    return rows
