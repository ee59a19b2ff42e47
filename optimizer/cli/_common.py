"""Shared option parsing for kvtune's commands: checked where input enters."""

from __future__ import annotations

import json
import math
import os
import sys
import tempfile
from pathlib import Path

import click

from costmodel._data import path_kind
from costmodel.errors import InputError
from optimizer.workload import MAX_SEED  # noqa: F401 (the seed bound of --seed flags)




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


def check_output_path(path: str | Path, flag: str = "") -> None:
    """An output file can be written there: its folder exists and it is not itself a folder.
    Commands call this before their work, so a bad path costs nothing."""
    path = Path(path)
    where = f"{flag} {path}" if flag else str(path)
    if "\x00" in str(path):
        raise InputError(f"{where}: a path cannot hold a NUL character")
    parent = path_kind(path.parent)
    if not parent:
        raise InputError(f"{where}: folder {path.parent} does not exist")
    if parent != "dir":
        raise InputError(f"{where}: {path.parent} is not a folder")
    if path_kind(path) == "dir":
        raise InputError(f"{where}: is a folder; give a file name")
    if len(path.name.encode()) > 255:  # NAME_MAX of Linux and macOS file systems
        raise InputError(f"{where}: the file name is longer than 255 bytes")


def write_atomic(path: str | Path, text: str) -> None:
    """Write a file whole or not at all: a temporary file in the same folder, then rename."""
    path = Path(path)
    check_output_path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent or ".")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except OSError as exc:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise InputError(f"{path}: cannot write ({exc.strerror or exc})") from None
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def echo_table(headers: list[str], rows: list[list], out=None) -> None:
    """A plain aligned table (units belong in the headers)."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    click.echo("\n".join(lines), file=out)
