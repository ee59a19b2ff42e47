"""Reading and checking the values of a benchmark output (``optimizer.importers`` and
``optimizer.importers_load_tools``): every failure is one ``InputError`` line naming the file, the
record and the key."""

from __future__ import annotations

import math

from kvtune.costmodel.errors import InputError
from kvtune.costmodel.files import FLOAT_MAX

__all__ = ["Rec", "dig", "ms", "num_or_none", "number", "short", "whole"]

SECONDS_TO_MS = 1e3


def ms(seconds: float) -> float:
    """A time in seconds (as inference-perf and LLMPerf write them) in milliseconds."""
    return seconds * SECONDS_TO_MS


class Rec:
    """One JSON object from a file, with a label for messages (``FILE`` or ``FILE: line N``)."""

    def __init__(self, obj: dict, where: str, parent: dict | None = None):
        # parent: the document a record was split from (a GuideLLM report's benchmarks[i])
        self.obj, self.where, self.parent = obj, where, parent

    def has(self, key: str) -> bool:
        return self.obj.get(key) is not None

    def num(self, key: str, optional: bool = False, obj: dict | None = None, label: str | None = None,
            allow_inf: bool = False):
        src = self.obj if obj is None else obj
        if key not in src or src[key] is None:
            if optional:
                return None
            raise InputError(f"{self.where}: missing key '{label or key}'")
        v = number(self.where, label or key, src[key], nonneg=False)
        if math.isinf(v) and not allow_inf:
            raise InputError(f"{self.where}: key '{label or key}' = {short(src[key])} must be finite")
        return v

    def nonneg(self, key: str, optional: bool = False, obj: dict | None = None, label: str | None = None):
        src = self.obj if obj is None else obj
        if key not in src or src[key] is None:
            if optional:
                return None
            raise InputError(f"{self.where}: missing key '{label or key}'")
        return number(self.where, label or key, src[key], nonneg=True)

    def list_of(self, key: str, n: int | None = None) -> list:
        v = self.obj.get(key)
        if not isinstance(v, list):
            raise InputError(f"{self.where}: key '{key}' = {short(v)} is not a list")
        if n is not None and len(v) != n:
            raise InputError(f"{self.where}: key '{key}' has {len(v)} entries, expected {n} (one per request)")
        return v


def number(where: str, name: str, v, nonneg: bool) -> float:
    if isinstance(v, str) and v.strip().lower() in ("inf", "infinity"):
        v = math.inf
    if isinstance(v, int) and not isinstance(v, bool) and abs(v) > FLOAT_MAX:
        raise InputError(f"{where}: key '{name}' = {short(v)} is beyond the range of a number")
    if isinstance(v, bool) or not isinstance(v, (int, float)) or math.isnan(v):
        raise InputError(f"{where}: key '{name}' = {short(v)} is not a number")
    if nonneg and (v < 0 or math.isinf(v)):
        raise InputError(f"{where}: key '{name}' = {v!r} must be a finite number >= 0")
    return float(v)


def short(v) -> str:
    s = repr(v)
    return s if len(s) <= 40 else s[:37] + "..."


def whole(x: float) -> int | float:
    """A mean token count rounded to a whole number; inf stays the float inf: the row check names it."""
    return int(round(x)) if math.isfinite(x) else x


def dig(obj, *path):
    for p in path:
        if not isinstance(obj, dict) or p not in obj:
            return None
        obj = obj[p]
    return obj


def num_or_none(v):
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    if isinstance(v, int) and abs(v) > FLOAT_MAX:
        return None
    return float(v) if math.isfinite(v) else None
