"""Writing kvtune's output files: checked before the work, written whole or not at all.

The CLI's commands and the library functions that write files (``optimizer.calibrate``'s shipped
refits) share these; a bad path is one ``InputError`` line naming it.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from kvtune.costmodel.errors import InputError
from kvtune.costmodel.files import path_kind

__all__ = ["check_output_path", "write_atomic"]

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
