"""Writing kvtune's output files: checked before the work, written whole or not at all, and never
at the cost of what is already at the path.

- A regular file (or a new name) is written to a temporary file in the same folder and renamed over
  the target, so a reader sees the old file or the new one, never half of one. The new file gets
  the mode of the file it replaces, else ``0o666`` less the user's umask (as ``open`` would);
  replaced as root, it keeps its owner. A symbolic link stays a link: the file it points to is
  replaced.
- A character device (``/dev/null``, a terminal) or a FIFO (``--json >(jq .)``), and any path through
  ``/proc/*/fd`` (``/dev/stdout``), is written in place: a rename would replace the device node or
  the pipe with a regular file. A block device (a disk) or a socket is refused.
- ``check_output_path`` is what commands call before their work: the folder exists and can be
  written, the target is not a folder, a disk or a read-only file. ``output_folder`` does the same
  for a folder of files (``solve --report``): written into a temporary folder beside it and moved
  into place only when whole.

The CLI's commands and the library functions that write files (``optimizer.calibrate``'s shipped
refits) share these; a bad path is one ``InputError`` line naming it.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from kvtune.costmodel.errors import InputError
from kvtune.costmodel.files import path_kind

__all__ = ["check_output_path", "check_output_folder", "write_atomic", "output_folder", "default_file_mode"]

_SYMLINK_HOPS = 40  # as the kernel's limit on links followed in one lookup (MAXSYMLINKS)


# The version of the JSON documents kvtune writes (solve's result, the objects of estimate, simulate,
# goodput, validate, calibrate, tune.json): bumped when a key is removed or changes meaning, not when
# one is added (the published schemas, profiles/schemas/*.schema.json, carry the same number).
SCHEMA_VERSION = 1

# the path that means stdout for every --json and -o (the Unix convention)
STDOUT = "-"


def json_document(obj: Any) -> Any:
    """``obj`` as kvtune writes it: a JSON object gets ``schema_version`` first (the one place that
    adds it; records' ``to_json`` stay free of it, and ``from_json`` ignores it)."""
    if isinstance(obj, dict):
        return {"schema_version": SCHEMA_VERSION, **{k: v for k, v in obj.items() if k != "schema_version"}}
    return obj


def _umask() -> int:
    mask = os.umask(0o022)  # reading the umask means setting it; put it straight back
    os.umask(mask)
    return mask


def default_file_mode() -> int:
    """``0o666`` less the process's umask: the mode ``open()`` gives a new file."""
    return 0o666 & ~_umask()


def _where(path, flag: str) -> str:
    return f"{flag} {path}" if flag else str(path)


def _folder_problem(folder: Path) -> str | None:
    """Why no file can be created in ``folder`` (None: it can)."""
    try:
        if os.statvfs(folder).f_flag & os.ST_RDONLY:
            return f"{folder} is on a read-only file system"
    except OSError:
        pass
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"folder {folder} is not writable (permission denied)"
    return None


def _through_proc(path: Path) -> bool:
    """Whether ``path`` reaches a file through ``/proc`` (``/dev/stdout``, ``/dev/fd/1``): an open
    descriptor of this process, written in place."""
    p = os.path.abspath(path)
    for _ in range(_SYMLINK_HOPS):
        parent = os.path.realpath(os.path.dirname(p))
        if parent == "/proc" or parent.startswith("/proc/"):
            return True
        p = os.path.join(parent, os.path.basename(p))
        if not os.path.islink(p):
            return False
        p = os.path.join(parent, os.readlink(p))
    return False


def _special_kind(path: Path) -> str | None:
    """"in place" (a character device, a FIFO, a path through /proc), "refused: WHY", or None (a
    regular file, or nothing there: written by rename)."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return None
    if stat.S_ISBLK(mode):
        return "refused: is a block device (a disk); kvtune writes files, character devices and FIFOs"
    if stat.S_ISSOCK(mode):
        return "refused: is a socket; kvtune writes files, character devices and FIFOs"
    if stat.S_ISCHR(mode) or stat.S_ISFIFO(mode):
        return "in place"
    if stat.S_ISREG(mode) and _through_proc(path):
        return "in place"
    return None


def check_output_path(path: str | Path, flag: str = "") -> None:
    """An output file can be written there: its folder exists and can be written, and it is not a
    folder, a disk or a read-only file. Commands call this before their work, so a bad path costs
    nothing."""
    path = Path(path)
    where = _where(path, flag)
    if str(path) == STDOUT:   # the commands that can write to stdout handle '-' before this check
        raise InputError(f"{where}: '-' (stdout) cannot take this output, a file kvtune writes whole; give a file "
                         f"path (a file named '-': its full path)")
    if "\x00" in str(path):
        raise InputError(f"{where}: a path cannot hold a NUL character")
    if len(path.name.encode()) > 255:  # NAME_MAX of Linux and macOS file systems
        raise InputError(f"{where}: the file name is longer than 255 bytes")
    kind = path_kind(path)
    if kind == "dir":
        raise InputError(f"{where}: is a folder; give a file name")
    special = _special_kind(path)
    if special is not None:
        if special.startswith("refused: "):
            raise InputError(f"{where}: {special[len('refused: '):]}")
        if not os.access(path, os.W_OK):
            raise InputError(f"{where}: cannot be written (permission denied)")
        return
    target = _replaced(path)
    parent = path_kind(target.parent)
    if not parent:
        raise InputError(f"{where}: folder {target.parent} does not exist")
    if parent != "dir":
        raise InputError(f"{where}: {target.parent} is not a folder")
    problem = _folder_problem(target.parent)
    if problem:
        raise InputError(f"{where}: {problem}")
    if kind == "file" and not os.access(target, os.W_OK):
        raise InputError(f"{where}: the file is read-only; kvtune does not replace it (make it writable or "
                         f"give another name)")


def _replaced(path: Path) -> Path:
    """The file a rename should replace: the target of a symbolic link (the link stays), else ``path``."""
    return Path(os.path.realpath(path)) if os.path.islink(path) else path


def write_atomic(path: str | Path, text: str | bytes) -> None:
    """Write a file whole or not at all (see the module docstring for devices, FIFOs and links)."""
    path = Path(path)
    check_output_path(path)
    data = text.encode("utf-8") if isinstance(text, str) else text
    try:
        if _special_kind(path) == "in place":
            with open(path, "wb") as f:
                f.write(data)
            return
        _replace(_replaced(path), data)
    except OSError as exc:
        raise InputError(f"{path}: cannot write ({exc.strerror or exc})") from None


def _replace(target: Path, data: bytes) -> None:
    try:
        old = os.stat(target)
    except FileNotFoundError:
        old = None
    mode = stat.S_IMODE(old.st_mode) if old is not None else default_file_mode()
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name[:100]}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
            os.fchmod(f.fileno(), mode)
            if old is not None and os.geteuid() == 0:
                os.fchown(f.fileno(), old.st_uid, old.st_gid)
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


# ---- folders of files (solve --report) ------------------------------------------------------------

def _existing_ancestor(path: Path) -> Path:
    p = path
    while path_kind(p) is None and p != p.parent:
        p = p.parent
    return p


def check_output_folder(path: str | Path, flag: str = "") -> None:
    """A folder of output files can be made or filled there: it is a folder or nothing yet, and the
    nearest folder that exists on its way can be written."""
    path = Path(path)
    where = _where(path, flag)
    if str(path) == STDOUT:
        raise InputError(f"{where}: '-' (stdout) cannot take a folder of files; give a folder path")
    if "\x00" in str(path):
        raise InputError(f"{where}: a path cannot hold a NUL character")
    if any(len(part.encode()) > 255 for part in path.parts):
        raise InputError(f"{where}: a name in the path is longer than 255 bytes")
    kind = path_kind(path)
    if kind not in (None, "dir"):
        raise InputError(f"{where}: exists and is not a folder")
    base = path if kind == "dir" else _existing_ancestor(path.parent)
    if path_kind(base) != "dir":
        raise InputError(f"{where}: {base} is not a folder")
    problem = _folder_problem(base)
    if problem:
        raise InputError(f"{where}: {problem}")


@contextmanager
def output_folder(path: str | Path, flag: str = "") -> Iterator[Path]:
    """A temporary folder to write a folder of files into; when the block ends without error its
    files move into ``path`` (made if missing, each file replacing its namesake), otherwise it is
    removed. So a report is there whole or not at all, and a failure leaves nothing behind."""
    path = Path(path)
    where = _where(path, flag)
    check_output_folder(path, flag)
    home = path if path.is_dir() else _existing_ancestor(path.parent)
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name[:100]}.", suffix=".tmp", dir=home))
    except OSError as exc:
        raise InputError(f"{where}: cannot write ({exc.strerror or exc})") from None
    try:
        yield tmp
        os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes 0700; a new folder gets the umask as mkdir would
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            os.rename(tmp, path)
        else:
            for entry in sorted(tmp.iterdir()):
                os.replace(entry, path / entry.name)
            tmp.rmdir()
    except OSError as exc:
        raise InputError(f"{where}: cannot write ({exc.strerror or exc})") from None
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
