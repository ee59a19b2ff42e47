"""Reading recorded request traces into ``costmodel.traffic.Trace``; the format is detected from
the file's first line.

    Azure LLM inference CSV   TIMESTAMP, ContextTokens, GeneratedTokens
                              (TIMESTAMP a datetime such as ``2023-11-16 18:15:46.6805900``)
    BurstGPT CSV              Timestamp, Model, Request tokens, Response tokens, Total tokens, Log Type
                              (Timestamp in seconds)
    Mooncake JSONL            {"timestamp": ms, "input_length": .., "output_length": .., "hash_ids": [..]}
                              (hash_ids: one id per 512-token block of the prompt)
    kvtune CSV                arrival_s, input_tokens, output_tokens[, prefix_tokens, prefix_group]

Rows whose output length is 0 are failed requests (BurstGPT logs them so); rows whose prompt is
empty cannot be served either. Both are skipped and counted in ``Trace.source``. Anything else
malformed is an ``InputError`` naming the file, the line and the column.

Timestamps are sorted (stably) and shifted to start at 0 s. Mooncake's shared prefix of a
request is the longest leading run of its block hashes that an earlier request already began
with (times 512 tokens, capped at the prompt); its ``prefix_group`` numbers that run.
"""

from __future__ import annotations

import csv
import datetime as _dt
import json
import math
import re
from pathlib import Path

import numpy as np

from kvtune.costmodel.files import path_kind, reading
from kvtune.costmodel.errors import InputError
from kvtune.costmodel.traffic import MAX_LENGTH_TOKENS, Trace

__all__ = ["read_trace", "detect_format", "FORMATS", "MOONCAKE_BLOCK_TOKENS"]

MOONCAKE_BLOCK_TOKENS = 512  # Mooncake trace README: each hash_id covers a block of 512 tokens
# Sanity bounds on what a row may hold, so that every count fits int64 and every time a float
# with sub-microsecond resolution: no model's context comes near 1e9 tokens (the longest in the
# catalog: 163,840), and 1e15 s is 30 million years (epoch seconds are 1.7e9, epoch ms 1.7e12).
MAX_TOKENS = MAX_LENGTH_TOKENS
MAX_ABS_SECONDS = 1e15

# Required columns of each CSV format (compared case-insensitively, spaces trimmed).
FORMATS = {
    "azure": ("timestamp", "contexttokens", "generatedtokens"),
    "burstgpt": ("timestamp", "request tokens", "response tokens"),
    "kvtune": ("arrival_s", "input_tokens", "output_tokens"),
    "mooncake": ("timestamp", "input_length", "output_length"),
}

_DATETIME = re.compile(
    r"^(\d{4})-(\d{2})-(\d{2})[ T](\d{2}):(\d{2}):(\d{2})(?:\.(\d+))?\s*(Z|[+-]\d{2}:?\d{2})?$")
_EPOCH_ORDINAL = _dt.date(1970, 1, 1).toordinal()


class _Rows:
    """Columns collected row by row, with the count of skipped rows."""

    def __init__(self) -> None:
        self.t_whole: list[int] = []   # whole seconds (datetimes), kept apart from the fraction
        self.t: list[float] = []        # the rest, in seconds
        self.inp: list[int] = []
        self.out: list[int] = []
        self.pre: list[int] = []
        self.grp: list[int] = []
        self.hashes: list[list] = []
        self.failed = 0      # output length 0
        self.empty = 0       # input length 0


def _whole(text, where: str, column: str) -> int:
    """A token count: a whole number >= 0 (``12``, ``12.0``)."""
    s = text.strip() if isinstance(text, str) else text
    try:
        if isinstance(s, bool):
            raise ValueError
        v = float(s)
        if not math.isfinite(v) or v != int(v):
            raise ValueError
        v = int(v)
    except (TypeError, ValueError, OverflowError):
        raise InputError(f"{where}: column {column} = {_clip(text)} is not a whole number") from None
    if v < 0:
        raise InputError(f"{where}: column {column} = {_clip(text)} is negative")
    if v > MAX_TOKENS:
        raise InputError(f"{where}: column {column} = {_clip(text)} is beyond {MAX_TOKENS:.0e} tokens")
    return v


def _clip(v) -> str:
    s = repr(v)
    return s if len(s) <= 40 else s[:30] + f"...({len(s)} characters)"


def _seconds(text, where: str, column: str) -> float:
    """A time in seconds: a plain number."""
    s = text.strip() if isinstance(text, str) else text
    try:
        if isinstance(s, bool):
            raise ValueError
        v = float(s)
        if not math.isfinite(v):
            raise ValueError
    except (TypeError, ValueError, OverflowError):
        raise InputError(f"{where}: column {column} = {_clip(text)} is not a number of seconds") from None
    if abs(v) > MAX_ABS_SECONDS:
        raise InputError(f"{where}: column {column} = {_clip(text)} is beyond {MAX_ABS_SECONDS:.0e} s")
    return v


def _datetime_s(text: str, where: str, column: str) -> tuple[int, float]:
    """Seconds since 1970 of ``YYYY-MM-DD HH:MM:SS[.fraction][tz]``, any number of fraction digits,
    as (whole seconds, fraction): kept apart until the first arrival is subtracted, so that
    sub-microsecond digits survive (Azure writes seven; a float of 1.7e9 s holds only ~0.2 us).
    """
    s = text.strip()
    m = _DATETIME.match(s)
    if m is None:
        try:
            return 0, _seconds(s, where, column)  # a plain number of seconds is accepted too
        except InputError:
            raise InputError(f"{where}: column {column} = {_clip(text)} is not a datetime "
                             f"(expected like 2023-11-16 18:15:46.6805900)") from None
    y, mo, d, hh, mm, ss, frac, tz = m.groups()
    try:
        days = _dt.date(int(y), int(mo), int(d)).toordinal() - _EPOCH_ORDINAL
    except ValueError:
        raise InputError(f"{where}: column {column} = {_clip(text)} is not a valid date") from None
    if int(hh) > 23 or int(mm) > 59 or int(ss) > 60:
        raise InputError(f"{where}: column {column} = {_clip(text)} is not a valid time of day")
    whole = days * 86400 + int(hh) * 3600 + int(mm) * 60 + int(ss)
    if tz and tz != "Z":
        sign = 1 if tz[0] == "+" else -1
        digits = tz[1:].replace(":", "")
        whole -= sign * (int(digits[:2]) * 3600 + int(digits[2:]) * 60)
    return whole, (float("0." + frac) if frac else 0.0)


def detect_format(path: str | Path) -> str:
    """``azure``, ``burstgpt``, ``mooncake`` or ``kvtune``, from the first non-empty line."""
    first = _first_line(Path(path))
    return _format_of(first, str(path))


def _first_line(p: Path) -> str:
    if not path_kind(p):
        raise InputError(f"{p}: no such trace file")
    try:
        with p.open(encoding="utf-8-sig", newline="") as f:
            for line in f:
                if line.strip():
                    return line
    except OSError as exc:
        raise InputError(f"{p}: cannot read ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise InputError(f"{p}: not a text file (a trace is CSV or JSONL)") from None
    raise InputError(f"{p}: empty trace file")


def _format_of(first: str, shown: str) -> str:
    if first.lstrip().startswith("{"):
        return "mooncake"
    try:
        header = {h.strip().lower() for h in next(csv.reader([first]))}
    except csv.Error as exc:
        raise InputError(f"{shown}: line 1: malformed CSV ({exc})") from None
    for name in ("azure", "burstgpt", "kvtune"):
        if set(FORMATS[name]) <= header:
            return name
    raise InputError(f"{shown}: line 1: unrecognised trace header {first.strip()!r}; expected Azure "
                     f"(TIMESTAMP, ContextTokens, GeneratedTokens), BurstGPT (Timestamp, Model, Request tokens, "
                     f"Response tokens, ...), kvtune (arrival_s, input_tokens, output_tokens) or Mooncake JSONL")


def _keep(rows: _Rows, t: tuple[int, float], inp: int, out: int, pre: int = 0, grp: int = -1, hashes=None) -> None:
    if out == 0:
        rows.failed += 1
        return
    if inp == 0:
        rows.empty += 1
        return
    rows.t_whole.append(t[0])
    rows.t.append(t[1])
    rows.inp.append(inp)
    rows.out.append(out)
    rows.pre.append(pre)
    rows.grp.append(grp)
    if hashes is not None:
        rows.hashes.append(hashes)


def _read_csv(p: Path, shown: str, fmt: str) -> _Rows:
    rows = _Rows()
    with p.open(encoding="utf-8-sig", newline="") as f:
        reader = csv.reader(f)
        header = None
        for rec in reader:
            if not rec or not any(c.strip() for c in rec):
                continue
            if header is None:
                header = [h.strip() for h in rec]
                lower = [h.lower() for h in header]
                cols = [lower.index(c) for c in FORMATS[fmt]]
                names = [header[i] for i in cols]
                extra = [(lower.index(c), header[lower.index(c)]) for c in ("prefix_tokens", "prefix_group")
                         if fmt == "kvtune" and c in lower]
                need = max(cols + [i for i, _ in extra]) + 1
                continue
            where = f"{shown}: line {reader.line_num}"
            if len(rec) < need:
                raise InputError(f"{where}: has {len(rec)} columns, expected {len(header)} ({', '.join(header)})")
            it, ii, io = cols
            if fmt == "azure":
                t = _datetime_s(rec[it], where, names[0])
            else:
                t = 0, _seconds(rec[it], where, names[0])
            inp = _whole(rec[ii], where, names[1])
            out = _whole(rec[io], where, names[2])
            pre, grp = 0, -1
            for i, name in extra:
                if name.lower() == "prefix_tokens":
                    pre = _whole(rec[i], where, name)
                    if pre > inp:
                        raise InputError(f"{where}: column {name} = {rec[i]!r} exceeds input_tokens {inp}")
                else:
                    try:
                        grp = int(rec[i].strip())
                        if not -1 <= grp <= MAX_TOKENS:
                            raise ValueError
                    except ValueError:
                        raise InputError(f"{where}: column {name} = {_clip(rec[i])} is not an integer "
                                         f"in [-1, {MAX_TOKENS:.0e}]") from None
            _keep(rows, t, inp, out, pre, grp)
    return rows


def _read_mooncake(p: Path, shown: str) -> _Rows:
    rows = _Rows()
    with p.open(encoding="utf-8-sig") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{shown}: line {lineno}"
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                raise InputError(f"{where}: not valid JSON ({exc.msg} at column {exc.colno})") from None
            except (ValueError, RecursionError) as exc:  # an integer of over 4300 digits; nesting too deep
                raise InputError(f"{where}: not valid JSON ({str(exc).splitlines()[0][:80]})") from None
            if not isinstance(rec, dict):
                raise InputError(f"{where}: expected a JSON object, got {type(rec).__name__}")
            for k in ("timestamp", "input_length", "output_length"):
                if k not in rec:
                    raise InputError(f"{where}: missing key '{k}'")
            t = 0, _seconds(rec["timestamp"], where, "timestamp") / 1e3  # Mooncake timestamps are in ms
            inp = _whole(rec["input_length"], where, "input_length")
            out = _whole(rec["output_length"], where, "output_length")
            hashes = rec.get("hash_ids", [])
            if hashes is None:
                hashes = []
            if not isinstance(hashes, list) or any(isinstance(h, (list, dict)) for h in hashes):
                raise InputError(f"{where}: column hash_ids = {str(hashes)[:40]!r} is not a list of block hashes")
            _keep(rows, t, inp, out, hashes=hashes)
    return rows


def _mooncake_prefixes(hashes: list[list], inp: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Shared-prefix tokens and group of each request, in arrival order.

    A trie of leading block runs: each node is one run ``hash_ids[:k]``. A request walks down
    the trie as far as earlier requests reached; that depth times 512 tokens (capped at the
    prompt) is its shared prefix and the node it stopped at is its group. Then it adds its own
    remaining blocks. Groups are renumbered 0, 1, ... in order of first use.
    """
    children: dict[tuple[int, object], int] = {}
    pre = np.zeros(len(hashes), dtype=np.int64)
    grp = np.full(len(hashes), -1, dtype=np.int64)
    renumber: dict[int, int] = {}
    for r, blocks in enumerate(hashes):
        node, depth = 0, 0
        for h in blocks:
            nxt = children.get((node, h))
            if nxt is None:
                break
            node, depth = nxt, depth + 1
        if depth:
            pre[r] = min(depth * MOONCAKE_BLOCK_TOKENS, int(inp[r]))
            grp[r] = renumber.setdefault(node, len(renumber))
        for h in blocks[depth:]:
            nxt = len(children) + 1
            children[(node, h)] = nxt
            node = nxt
    return pre, grp


def read_trace(path: str | Path, shown: str | None = None) -> Trace:
    """Read a trace file (format detected from its first line) into a ``Trace``.

    ``shown`` is how the file is named in messages (default: the path as given).

    A fault the checks did not foresee is still one line (``costmodel.files.reading``).
    """
    with reading(shown or path, "trace"):
        return _read_trace(path, shown)


def _read_trace(path: str | Path, shown: str | None = None) -> Trace:
    p = Path(path)
    shown = shown or str(path)
    fmt = _format_of(_first_line(p), shown)
    try:
        rows = _read_mooncake(p, shown) if fmt == "mooncake" else _read_csv(p, shown, fmt)
    except UnicodeDecodeError:
        raise InputError(f"{shown}: not a text file (a trace is CSV or JSONL)") from None
    except OSError as exc:
        raise InputError(f"{shown}: cannot read ({exc.strerror or exc})") from None
    except csv.Error as exc:
        raise InputError(f"{shown}: malformed CSV ({exc})") from None
    skipped = []
    if rows.failed:
        skipped.append(f"{rows.failed} failed (0 output tokens)")
    if rows.empty:
        skipped.append(f"{rows.empty} with an empty prompt")
    if not rows.t:
        raise InputError(f"{shown}: no usable requests in the trace" + (f" (skipped {', '.join(skipped)})" if skipped else ""))
    whole = np.asarray(rows.t_whole, dtype=np.int64)
    t = (whole - whole.min()).astype(np.float64) + np.asarray(rows.t, dtype=np.float64)
    order = np.argsort(t, kind="stable")
    t = t[order] - t[order[0]]
    inp = np.asarray(rows.inp, dtype=np.int64)[order]
    out = np.asarray(rows.out, dtype=np.int64)[order]
    if fmt == "mooncake":
        pre, grp = _mooncake_prefixes([rows.hashes[i] for i in order], inp)
    else:
        pre = np.asarray(rows.pre, dtype=np.int64)[order]
        grp = np.asarray(rows.grp, dtype=np.int64)[order]
    label = {"azure": "Azure CSV", "burstgpt": "BurstGPT CSV", "mooncake": "Mooncake JSONL", "kvtune": "kvtune CSV"}[fmt]
    source = f"{shown} ({label}): {len(t)} requests over {t[-1]:.1f} s"
    if skipped:
        source += f"; skipped {', '.join(skipped)}"
    return Trace(arrival_s=t, input_tokens=inp, output_tokens=out, prefix_tokens=pre, prefix_group=grp, source=source)
