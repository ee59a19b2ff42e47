"""Shared option parsing for kvtune's commands: checked where input enters."""

from __future__ import annotations

import json
import math

import click

from kvtune.costmodel.errors import InputError
from kvtune.optimizer.output import check_output_folder, check_output_path, output_folder, write_atomic  # noqa: F401 (the commands import them from here)
from kvtune.optimizer.workload import MAX_SEED  # noqa: F401 (the seed bound of --seed flags)




def save_or_show(path, text: str, flag: str) -> None:
    """``write_atomic`` after a command's work: if the file cannot be written (a full disk), its
    text goes to stdout so the work (a fit, a benchmark) is not lost, and the error says so."""
    try:
        write_atomic(path, text)
    except InputError as exc:
        click.echo(text, nl=not text.endswith("\n"))
        raise InputError(f"{flag} {exc}; what it would hold is printed on stdout instead") from None


def parse_int(value: str, flag: str, minimum: int, maximum: int | None = None) -> int:
    """One integer option checked here (not by click), so a bad value is one ``Error:`` line."""
    text = str(value).strip()
    try:
        v = int(text)
    except ValueError:
        raise InputError(f"{flag}: {text[:40]!r} is not an integer") from None
    if v < minimum:
        raise InputError(f"{flag}: {v} must be >= {minimum}")
    if maximum is not None and v > maximum:
        raise InputError(f"{flag}: {text[:40]} must be <= {maximum}")
    return v


def parse_int_list(value: str, what: str, minimum: int = 1) -> list[int]:
    out = [parse_int(part, f"--{what}", minimum) for part in str(value).split(",")]
    if not out:
        raise InputError(f"--{what}: empty list")
    return out


def to_jsonable(obj):
    """Floats that JSON cannot hold (inf, nan) become strings; numpy scalars become Python ones."""
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if hasattr(obj, "item") and not isinstance(obj, (str, bytes)):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return "inf" if obj > 0 else ("-inf" if obj < 0 else "nan")
    return obj


def dumps(obj) -> str:
    return json.dumps(to_jsonable(obj), indent=2, sort_keys=False)


def echo_table(headers: list[str], rows: list[list], out=None) -> None:
    """A plain aligned table (units belong in the headers)."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    click.echo("\n".join(lines), file=out)
