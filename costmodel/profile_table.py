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
import io
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from .files import MAX_TABLE_BYTES, load_yaml, path_kind, read_text, reading
from .errors import InputError

__all__ = ["ProfileRow", "COLUMNS", "read_table", "METADATA_COLUMNS", "RUN_COLUMNS", "OPEN_LOOP_COLUMNS", "check_value",
           "config_key", "contradictions", "row_content", "first_repeat"]

METADATA_COLUMNS = ("gpu", "engine", "engine_version", "model", "weight_dtype", "kv_dtype", "tp", "date", "source")
STEP_COLUMNS = ("phase", "batch", "context_tokens", "chunk_tokens", "spec_k", "step_ms")
REQUEST_COLUMNS = ("concurrency", "batch_cap", "scheduler", "kv_pool_tokens", "rate_req_s", "input_tokens", "output_tokens", "num_requests",
                   "ttft_mean_ms", "ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms",
                   "tpot_mean_ms", "tpot_p50_ms", "tpot_p90_ms", "tpot_p99_ms",
                   "output_tok_s", "request_s")
# Added with open-loop runs (optional; tables without them read as before): the engine's CPU
# threads and the machine's 1-minute load average while it ran (any row), and an open-loop run's
# SLO, its measured attainment and its per-request log (costmodel.request_log), a path relative
# to the table's folder.
RUN_COLUMNS = ("threads", "loadavg_1m")
OPEN_LOOP_COLUMNS = ("slo_ttft_ms", "slo_tpot_ms", "attainment", "requests_file")
# Optional on a closed-loop row (tables without it read as before): which requests its statistics
# cover (costmodel.closed_loop.STATS_WINDOWS; empty: steady). whole_run: the load tool's measured
# phase started on an idle engine with every client at once and its means are over all of its
# num_requests requests (AIPerf's profiling phase), so the fit simulates that run whole.
CLOSED_LOOP_COLUMNS = ("stats_window",)
COLUMNS = ("id", "kind") + METADATA_COLUMNS + STEP_COLUMNS + REQUEST_COLUMNS + RUN_COLUMNS + OPEN_LOOP_COLUMNS \
    + CLOSED_LOOP_COLUMNS
SCHEDULERS = ("", "mixed", "prefill_first")
STATS_WINDOW_VALUES = ("", "steady", "whole_run")  # closed_loop.STATS_WINDOWS, or empty

_INT = {"threads", "tp", "batch", "context_tokens", "chunk_tokens", "spec_k", "concurrency", "batch_cap", "kv_pool_tokens", "input_tokens",
        "output_tokens", "num_requests"}
_FLOAT = {"step_ms", "rate_req_s", "ttft_mean_ms", "ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms",
          "tpot_mean_ms", "tpot_p50_ms", "tpot_p90_ms", "tpot_p99_ms", "output_tok_s", "request_s",
          "loadavg_1m", "slo_ttft_ms", "slo_tpot_ms", "attainment"}
# measured or declared, but allowed to be 0: an idle machine's load, a run where no request met its SLO
_FLOAT_FROM_ZERO = {"loadavg_1m": math.inf, "attainment": 1.0}   # column: its largest value


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
    threads: int | None = None       # the engine's CPU threads (llama.cpp -t), where known
    loadavg_1m: float | None = None  # the machine's 1-minute load average during the run (os.getloadavg)
    slo_ttft_ms: float | None = None  # open loop: the run's TTFT target (per-request targets: requests_file)
    slo_tpot_ms: float | None = None
    attainment: float | None = None   # open loop: share of the non-warm-up requests meeting both targets
    requests_file: str = ""           # open loop: the per-request log, relative to the table's folder
    stats_window: str = ""            # closed loop: steady | whole_run | "" (steady)
    # the folder of the table the row was read from (not a column): where requests_file is found
    table_dir: str = field(default="", compare=False, repr=False)

    def requests_path(self) -> Path | None:
        """The per-request log's path (``requests_file`` under the table's folder), or None."""
        if not self.requests_file:
            return None
        return Path(self.table_dir or ".") / self.requests_file

    @property
    def open_loop(self) -> bool:
        """An open-loop run at a finite arrival rate."""
        return self.kind == "request" and self.rate_req_s is not None and math.isfinite(self.rate_req_s) \
            and self.concurrency is None

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
            else:  # a line break inside a cell would split the row when read back
                out[c] = str(v).replace("\r\n", " ").replace("\r", " ").replace("\n", " ")
        return out


# Least value of each numeric column: counts of things that exist start at 1; measured times and
# rates are > 0 (a zero or negative measurement is a broken record, and the fit divides by it).
_INT_MIN = {"threads": 1, "tp": 1, "batch": 1, "context_tokens": 0, "chunk_tokens": 1, "spec_k": 0, "concurrency": 1,
            "batch_cap": 1, "kv_pool_tokens": 1, "input_tokens": 1, "output_tokens": 1, "num_requests": 1}
MAX_COUNT = 10**9  # no count in a table comes near (longest context in the catalog: 163,840 tokens)
MAX_MEASURED = 1e12  # ms, tok/s, req/s: 1e12 ms is 30 years


def check_value(where: str, key: str, v: float, shown: str | None = None) -> int | float:
    """One numeric column's value checked against its column's rules; ``where`` starts the message."""
    shown = shown if shown is not None else repr(v)
    if key in _INT:
        if isinstance(v, (int, float)) and math.isfinite(v) and v == int(v) and v < _INT_MIN[key]:
            raise InputError(f"{where}: column {key} = {int(v)}, expected at least {_INT_MIN[key]}")
        if not isinstance(v, (int, float)) or not math.isfinite(v) or v != int(v) or not _INT_MIN[key] <= v <= MAX_COUNT:
            raise InputError(f"{where}: column {key} = {shown}: expected a whole number in "
                             f"{_INT_MIN[key]}..{MAX_COUNT:.0e}")
        return int(v)
    if key == "rate_req_s" and v == math.inf:
        return v  # all requests at once
    if key in _FLOAT_FROM_ZERO:
        top = _FLOAT_FROM_ZERO[key]
        if not isinstance(v, (int, float)) or not 0 <= v <= min(top, MAX_MEASURED):
            raise InputError(f"{where}: column {key} = {shown}: expected a number in 0..{top:g}")
        return float(v)
    if not isinstance(v, (int, float)) or not 0 < v <= MAX_MEASURED:  # also refuses nan and inf
        raise InputError(f"{where}: column {key} = {shown}: expected a finite number > 0"
                         + (" (or inf)" if key == "rate_req_s" else ""))
    return float(v)


def _convert(path: Path, line: int, key: str, raw: str):
    if raw == "":
        return None
    if key not in _INT and key not in _FLOAT:
        return raw
    shown = repr(raw if len(raw) <= 40 else raw[:30] + f"...({len(raw)} characters)")
    try:
        v = float(raw)
    except (ValueError, OverflowError):
        raise InputError(f"{path}: line {line}: column {key} = {shown} is not a "
                         f"{'whole number' if key in _INT else 'number'}") from None
    return check_value(f"{path}: line {line}", key, v, shown)


def read_table(path: str | Path) -> list[ProfileRow]:
    """Read a profile table (and its ``.meta.yaml`` sidecar if present); check every row.
    A fault the checks did not foresee is still one line (``costmodel.files.reading``).
    """
    with reading(path, "profile table"):
        return _read_table(path)


def _read_table(path: str | Path) -> list[ProfileRow]:
    p = Path(path)
    if not path_kind(p):
        raise InputError(f"profile table {p}: no such file")
    meta_path = p.with_suffix(".meta.yaml")
    meta = load_yaml(meta_path, "table sidecar") if path_kind(meta_path) else {}
    if meta is None:
        meta = {}
    if not isinstance(meta, dict):
        raise InputError(f"{meta_path}: expected a mapping of metadata keys")
    for k, v in meta.items():
        if k in COLUMNS and not (isinstance(v, (str, int, float)) and not isinstance(v, bool)):
            raise InputError(f"{meta_path}: {k} = {v!r}: expected a single value")
    text = read_text(p, "profile table", MAX_TABLE_BYTES)
    try:
        return _read_rows(p, text, meta)
    except csv.Error as exc:
        raise InputError(f"{p}: malformed CSV ({exc})") from None


def _read_rows(p: Path, text: str, meta: dict) -> list[ProfileRow]:
    reader = csv.DictReader(io.StringIO(text, newline=""))
    if not reader.fieldnames:
        raise InputError(f"{p}: empty file (no header)")
    unknown = [c for c in reader.fieldnames if c not in COLUMNS]
    if unknown:
        raise InputError(f"{p}: unknown column {unknown[0]!r} (columns: {', '.join(COLUMNS)})")
    for n, c in enumerate(reader.fieldnames):
        if c in reader.fieldnames[:n]:  # csv.DictReader would keep the last cell silently
            raise InputError(f"{p}: line 1: column {c} given twice (columns {reader.fieldnames.index(c) + 1} "
                             f"and {n + 1})")
    for c in ("kind",):
        if c not in reader.fieldnames:
            raise InputError(f"{p}: missing column '{c}'")
    rows = []
    ids: dict[str, int] = {}            # id -> the line that gave it
    contents: dict[tuple, int] = {}     # every cell but the id -> the line that gave them
    for raw in reader:
        i = reader.line_num
        if None in raw:  # cells beyond the header: DictReader files them under None
            raise InputError(f"{p}: line {i}: {len(reader.fieldnames) + len(raw[None])} cells, the header names "
                             f"{len(reader.fieldnames)}")
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
            need: tuple[str, ...] = ("phase", "batch", "context_tokens", "step_ms")
            if vals.get("phase") not in ("decode", "prefill"):
                raise InputError(f"{p}: line {i}: column phase = {vals.get('phase', '')!r}, expected decode or prefill")
        elif kind == "request":
            need = ("input_tokens", "output_tokens")
            if "concurrency" not in vals and "rate_req_s" not in vals:
                raise InputError(f"{p}: line {i}: a request row needs concurrency or rate_req_s")
            if vals.get("scheduler", "") not in SCHEDULERS:
                raise InputError(f"{p}: line {i}: column scheduler = {vals['scheduler']!r}, expected "
                                 f"{' or '.join(x for x in SCHEDULERS if x)} (or empty: the engine's default)")
            if vals.get("stats_window", "") not in STATS_WINDOW_VALUES:
                raise InputError(f"{p}: line {i}: column stats_window = {vals['stats_window']!r}, expected steady or "
                                 f"whole_run (or empty: steady)")
            if vals.get("stats_window") == "whole_run" and ("concurrency" not in vals or "num_requests" not in vals):
                raise InputError(f"{p}: line {i}: column stats_window = 'whole_run' needs concurrency and num_requests "
                                 f"(the closed-loop run whose requests the statistics cover)")
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
        pool = vals.get("kv_pool_tokens")
        if kind == "request" and pool is not None and pool < vals["input_tokens"] + vals["output_tokens"]:
            raise InputError(f"{p}: line {i}: column kv_pool_tokens = {pool:,} cannot hold one request of this row "
                             f"({vals['input_tokens']:,} input + {vals['output_tokens']:,} output tokens); the engine "
                             f"could not have served it (the pool is the engine's KV cache in tokens)")
        row = ProfileRow(**vals, table_dir=str(p.parent))
        _check_unique(p, i, row, ids, contents)
        rows.append(row)
    if not rows:
        raise InputError(f"{p}: no rows")
    return rows


def row_content(row: ProfileRow) -> tuple:
    """Every field of a row but its id: two rows with equal content are one measurement twice."""
    return tuple(getattr(row, c) for c in COLUMNS if c != "id")


def first_repeat(rows: Sequence[ProfileRow]) -> tuple[ProfileRow, ProfileRow] | None:
    """The first row whose content repeats an earlier row's, with that earlier row (None: none)."""
    seen: dict[tuple, ProfileRow] = {}
    for r in rows:
        earlier = seen.setdefault(row_content(r), r)
        if earlier is not r:
            return r, earlier
    return None


def _check_unique(p: Path, line: int, row: ProfileRow, ids: dict[str, int], contents: dict[tuple, int]) -> None:
    """A row's id names one row (validate and calibrate report by id), and a row is not a copy of
    another (every cell but the id equal): a fit would count the copy's measurement twice."""
    if row.id in ids:
        raise InputError(f"{p}: line {line}: id {row.id!r} already names the row on line {ids[row.id]}")
    ids[row.id] = line
    key = row_content(row)
    if key in contents:
        raise InputError(f"{p}: line {line}: row {row.id!r} repeats line {contents[key]} in every column but id "
                         f"(a fit would count the same measurement twice); remove one")
    contents[key] = line


# Columns that say what was measured (the rest of a row, less its id, date and provenance).
_MEASURED = tuple(c for c in sorted(_FLOAT) if c not in ("rate_req_s", "loadavg_1m", "slo_ttft_ms", "slo_tpot_ms",
                                                           "attainment"))
_NOT_CONFIG = set(_MEASURED) | {"id", "date", "source", "num_requests", "engine_version", "loadavg_1m", "attainment",
                                "slo_ttft_ms", "slo_tpot_ms", "requests_file"}
# Two runs of one configuration differing by more than this factor are not noise: run-to-run
# spread of serving benchmarks is a few percent (vLLM's own CI tolerates 5-10%).
CONTRADICTION_RATIO = 2.0


def config_key(row: ProfileRow) -> tuple:
    """What a row measured at: every column but the measured figures, its id, date, provenance and
    load. Two rows with one key measured the same point."""
    return tuple((c, getattr(row, c)) for c in COLUMNS if c not in _NOT_CONFIG)


def contradictions(rows: list[ProfileRow], ratio: float = CONTRADICTION_RATIO) -> list[str]:
    """Rows that describe the same configuration but disagree on a measurement by more than
    ``ratio`` times: one line each (the worst pair per configuration and measured column)."""
    groups: dict[tuple, list[ProfileRow]] = {}
    for r in rows:
        groups.setdefault(config_key(r), []).append(r)
    out = []
    for members in groups.values():
        if len(members) < 2:
            continue
        for col in _MEASURED:
            vals = [(getattr(r, col), r.id) for r in members if getattr(r, col) is not None]
            if len(vals) < 2:
                continue
            (lo, lo_id), (hi, hi_id) = min(vals), max(vals)
            if lo > 0 and hi / lo > ratio:
                out.append(f"rows {lo_id} and {hi_id} describe the same configuration but measured {col} "
                           f"{lo:.4g} and {hi:.4g} ({hi / lo:.1f}x apart)")
    return out
