"""An open-loop run's per-request log: the CSV sidecar a profile-table row names in ``requests_file``.

One line per request that was sent, in the order they were planned. The load driver
(``optimizer.loadgen``) writes it; ``kvtune validate`` and ``kvtune calibrate`` read it back and
replay the run through the simulator with the same arrivals, lengths and shared prefixes
(``replay_open_loop``), so a prediction and a measurement describe the very same requests.

Columns (units in the names; an empty cell is "not known"):

| column | meaning |
| --- | --- |
| ``index`` | the request's place in the plan (0-based) |
| ``class_name`` | its workload class (``trace`` for a replayed trace) |
| ``warmup`` | 1: a warm-up request, left out of every statistic (it still loads the engine) |
| ``scheduled_s`` | planned arrival, seconds from the run's start |
| ``arrival_s`` | when the driver really sent it, seconds from the run's start (what the simulator replays) |
| ``input_tokens``, ``output_tokens`` | the planned prompt and output lengths |
| ``prefix_tokens``, ``prefix_group`` | leading prompt tokens shared with the group's other requests (-1: none) |
| ``ttft_slo_ms``, ``tpot_slo_ms`` | this request's targets (its class's, else the workload's; empty: none) |
| ``ok`` | 1: the stream ended normally with text |
| ``ttft_ms``, ``tpot_ms``, ``e2e_ms`` | measured from the send (TPOT = (last - first token) / (tokens - 1)) |
| ``prompt_tokens_server``, ``output_tokens_server`` | the lengths the server counted (``usage``; llama.cpp ``timings``) |
| ``cached_tokens_server`` | prompt tokens the server took from its cache, where it says (llama.cpp ``timings.cache_n``, vLLM ``usage.prompt_tokens_details.cached_tokens``) |
| ``error`` | why a request failed |

The simulator replays each request at ``arrival_s`` with the server's counted lengths where
known (they are what the engine processed), else the planned ones. The statistics are over the
requests that are neither warm-up nor failed; a failed request counts as a miss in attainment.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .errors import InputError
from .files import read_text, reading
from .requests import Requests

__all__ = ["REQUEST_LOG_COLUMNS", "RequestLog", "read_request_log", "request_log_csv", "met_slo"]

REQUEST_LOG_COLUMNS = ("index", "class_name", "warmup", "scheduled_s", "arrival_s", "input_tokens", "output_tokens",
                       "prefix_tokens", "prefix_group", "ttft_slo_ms", "tpot_slo_ms", "ok", "ttft_ms", "tpot_ms",
                       "e2e_ms", "prompt_tokens_server", "output_tokens_server", "cached_tokens_server", "error")
_REQUIRED = ("arrival_s", "input_tokens", "output_tokens", "ok")
_INT_COLS = ("index", "input_tokens", "output_tokens", "prefix_tokens", "prefix_group", "prompt_tokens_server",
             "output_tokens_server", "cached_tokens_server")
_FLOAT_COLS = ("scheduled_s", "arrival_s", "ttft_slo_ms", "tpot_slo_ms", "ttft_ms", "tpot_ms", "e2e_ms")
_FLAG_COLS = ("warmup", "ok")


def _frozen(a, dtype) -> np.ndarray:
    out = np.array(a, dtype=dtype)
    out.setflags(write=False)
    return out


@dataclass(frozen=True, eq=False)
class RequestLog:
    """Per-request columns of one open-loop run (see the module doc). Unknown values are NaN
    (floats) or -1 (server-counted lengths); an absent SLO is ``inf``."""

    index: np.ndarray
    class_name: tuple[str, ...]
    warmup: np.ndarray               # bool
    scheduled_s: np.ndarray
    arrival_s: np.ndarray            # sent, seconds from the run's start
    input_tokens: np.ndarray         # planned
    output_tokens: np.ndarray        # planned
    prefix_tokens: np.ndarray
    prefix_group: np.ndarray
    ttft_slo_ms: np.ndarray          # inf: no target
    tpot_slo_ms: np.ndarray
    ok: np.ndarray                   # bool
    ttft_ms: np.ndarray              # NaN where not measured
    tpot_ms: np.ndarray
    e2e_ms: np.ndarray
    prompt_tokens_server: np.ndarray  # -1: the server did not say
    output_tokens_server: np.ndarray
    cached_tokens_server: np.ndarray
    error: tuple[str, ...]
    source: str = ""

    def __post_init__(self) -> None:
        n = len(self.arrival_s)
        where = f"request log {self.source}" if self.source else "request log"
        for f, dt in (("index", np.int64), ("warmup", bool), ("scheduled_s", float), ("arrival_s", float),
                      ("input_tokens", np.int64), ("output_tokens", np.int64), ("prefix_tokens", np.int64),
                      ("prefix_group", np.int64), ("ttft_slo_ms", float), ("tpot_slo_ms", float), ("ok", bool),
                      ("ttft_ms", float), ("tpot_ms", float), ("e2e_ms", float), ("prompt_tokens_server", np.int64),
                      ("output_tokens_server", np.int64), ("cached_tokens_server", np.int64)):
            object.__setattr__(self, f, _frozen(getattr(self, f), dt))
            if len(getattr(self, f)) != n:
                raise InputError(f"{where}: column {f} has {len(getattr(self, f))} rows, expected {n}")
        for f in ("class_name", "error"):
            object.__setattr__(self, f, tuple(getattr(self, f)))
            if len(getattr(self, f)) != n:
                raise InputError(f"{where}: column {f} has {len(getattr(self, f))} rows, expected {n}")
        if n == 0:
            raise InputError(f"{where}: no requests")
        if not np.isfinite(self.arrival_s).all() or (self.arrival_s < 0).any():
            raise InputError(f"{where}: arrival_s must be finite and >= 0")
        if self.input_tokens.min() < 1 or self.output_tokens.min() < 1:
            raise InputError(f"{where}: input_tokens and output_tokens must be >= 1")
        if (self.prefix_tokens < 0).any() or (self.prefix_tokens > self.input_tokens).any():
            raise InputError(f"{where}: prefix_tokens must lie in [0, input_tokens]")
        if (self.ok & ~np.isfinite(self.ttft_ms)).any():
            raise InputError(f"{where}: a request marked ok needs its ttft_ms")

    def __len__(self) -> int:
        return len(self.arrival_s)

    @property
    def measured(self) -> np.ndarray:
        """The requests the statistics are over: past warm-up and served."""
        return ~self.warmup & self.ok

    @property
    def counted(self) -> np.ndarray:
        """The requests attainment is over: past warm-up (a failed one is a miss)."""
        return ~self.warmup

    def served_lengths(self) -> tuple[np.ndarray, np.ndarray]:
        """(prompt, output) tokens per request: the server's counts where it gave them, else the plan's."""
        inp = np.where(self.prompt_tokens_server >= 1, self.prompt_tokens_server, self.input_tokens)
        out = np.where(self.output_tokens_server >= 1, self.output_tokens_server, self.output_tokens)
        return inp.astype(np.int64), out.astype(np.int64)

    def met_slo(self) -> np.ndarray:
        """Measured: served, TTFT within its target and TPOT within its (a 1-token output has no TPOT)."""
        _, out = self.served_lengths()
        return met_slo(self.ok, self.ttft_ms, self.tpot_ms, out, self.ttft_slo_ms, self.tpot_slo_ms)

    def to_requests(self) -> Requests:
        """The simulator's batch: sent times (shifted to start at 0), served lengths, the same
        shared prefixes (clipped to the served prompt) and targets."""
        inp, out = self.served_lengths()
        names = tuple(dict.fromkeys(self.class_name)) or ("all",)
        cls = np.array([names.index(c) for c in self.class_name], dtype=np.int64)
        return Requests(arrival_s=self.arrival_s - self.arrival_s.min(), input_tokens=inp, output_tokens=out,
                        prefix_tokens=np.minimum(self.prefix_tokens, inp), prefix_group=self.prefix_group.copy(),
                        ttft_slo_s=self.ttft_slo_ms / 1e3, tpot_slo_s=self.tpot_slo_ms / 1e3, class_idx=cls,
                        class_names=names)


def met_slo(ok, ttft_ms, tpot_ms, output_tokens, ttft_slo_ms, tpot_slo_ms) -> np.ndarray:
    """Per request: served, TTFT <= its target, and TPOT <= its target unless it produced one token."""
    ok = np.asarray(ok, bool)
    with np.errstate(invalid="ignore"):
        ttft_ok = np.asarray(ttft_ms, float) <= np.asarray(ttft_slo_ms, float)
        tpot_ok = (np.asarray(output_tokens) <= 1) | (np.asarray(tpot_ms, float) <= np.asarray(tpot_slo_ms, float))
    return ok & ttft_ok & tpot_ok


def _cell(v) -> str:
    if isinstance(v, (bool, np.bool_)):
        return "1" if v else "0"
    if isinstance(v, (float, np.floating)):
        if math.isnan(v):
            return ""
        if math.isinf(v):
            return "" if v > 0 else "-inf"
        return f"{float(v):.6f}".rstrip("0").rstrip(".") if abs(v) < 1e6 else f"{float(v):.6g}"
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    return str(v).replace("\r", " ").replace("\n", " ")


def request_log_csv(log: RequestLog) -> str:
    """The sidecar's text (header ``REQUEST_LOG_COLUMNS``); an unknown count is left empty."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(REQUEST_LOG_COLUMNS)
    for i in range(len(log)):
        row = []
        for c in REQUEST_LOG_COLUMNS:
            v = getattr(log, c)[i]
            if c in ("prompt_tokens_server", "output_tokens_server", "cached_tokens_server") and v < 0:
                v = ""
            row.append(_cell(v))
        w.writerow(row)
    return buf.getvalue()


def read_request_log(path: str | Path) -> RequestLog:
    """Read and check a request log; any fault is one line naming the file, the line and the column."""
    with reading(path, "request log"):
        return _read(Path(path))


def _read(p: Path) -> RequestLog:
    text = read_text(p, "request log")
    try:
        reader = csv.DictReader(io.StringIO(text, newline=""))
        fields = reader.fieldnames or []
        unknown = [c for c in fields if c not in REQUEST_LOG_COLUMNS]
        if unknown:
            raise InputError(f"{p}: unknown column {unknown[0]!r} (columns: {', '.join(REQUEST_LOG_COLUMNS)})")
        missing = [c for c in _REQUIRED if c not in fields]
        if missing:
            raise InputError(f"{p}: missing column {missing[0]!r}")
        cols: dict[str, Any] = {c: [] for c in REQUEST_LOG_COLUMNS}
        for k, raw in enumerate(reader):
            line = reader.line_num
            for c in REQUEST_LOG_COLUMNS:
                cols[c].append(_parse(p, line, c, (raw.get(c) or "").strip(), k))
    except csv.Error as exc:
        raise InputError(f"{p}: malformed CSV ({exc})") from None
    return RequestLog(**cols, source=str(p))


def _parse(p: Path, line: int, c: str, cell: str, k: int):
    if c in ("class_name", "error"):
        return cell or ("all" if c == "class_name" else "")
    if c in _FLAG_COLS:
        if cell in ("", "0", "1"):
            return cell == "1"
        raise InputError(f"{p}: line {line}: column {c} = {cell!r}, expected 0 or 1")
    if cell == "":
        if c in _REQUIRED:
            raise InputError(f"{p}: line {line}: missing value for column {c}")
        defaults = {"index": k, "prefix_tokens": 0, "prefix_group": -1, "ttft_slo_ms": math.inf,
                    "tpot_slo_ms": math.inf}
        return defaults.get(c, -1 if c in _INT_COLS else math.nan)
    try:
        v = float(cell)
    except ValueError:
        raise InputError(f"{p}: line {line}: column {c} = {cell!r} is not a number") from None
    if c in _INT_COLS:
        if not math.isfinite(v) or v != int(v) or abs(v) > 1e9:
            raise InputError(f"{p}: line {line}: column {c} = {cell!r}: expected a whole number")
        return int(v)
    if math.isnan(v) or v < 0:
        raise InputError(f"{p}: line {line}: column {c} = {cell!r}: expected a number >= 0")
    return v
