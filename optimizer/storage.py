"""Checks on a ``--storage`` URL before optuna opens it, so that a storage fault is one line and a
damaged file is never written to.

- ``journal:PATH``: the folder must exist; an existing journal must be whole: every line a JSON
  record ending in a newline. optuna's reader skips a damaged *last* line, so its next append would
  glue new records onto the broken one and every later run would fail; a journal left so (a
  process killed mid-write, a full disk, a copy cut short) is refused with the line to cut. A
  partial last line may also be another process's append in flight, so a damaged end is checked
  again under the journal's own lock before it is reported.
- ``sqlite:///PATH``: the folder must exist; an existing file must be an SQLite database that
  passes ``PRAGMA quick_check`` (opened read-only, so the check writes nothing). A read-only URL
  (``?mode=ro``, ``?immutable=1``) is refused: optuna writes every trial into its storage, so a
  run cannot keep its promise not to write.
- Both: optuna writes there, so the file and its folder must be writable (a read-only mount, an
  immutable file, a folder without permission is one line before the run; the journal's lock and
  SQLite's rollback journal are files beside the storage).
- ``sqlite:///:memory:`` lives inside one process: with ``--workers`` above 1 the workers would
  share nothing (``check_shared_storage``).
- While a run goes on, ``journal_backend``'s appends check the journal's end under the lock: if
  another process was killed mid-record since, the append is refused (one line) rather than
  glued onto the partial record. An append that fails (a full disk) is cut back off, so the
  journal ends with a whole record, and the run stops with one line.
- Other RDB URLs are left to optuna and SQLAlchemy (``optimizer.search.make_storage`` turns
  their failures into one line).
"""

from __future__ import annotations

import json
import os
import sqlite3
import urllib.parse
from pathlib import Path

from kvtune.costmodel.files import path_kind
from kvtune.costmodel.errors import InputError, KvtuneError
from optuna.storages.journal import JournalFileBackend, JournalFileSymlinkLock

__all__ = ["check_storage_url", "check_shared_storage", "check_journal", "check_sqlite", "SQLITE_HEADER",
           "journal_backend", "StorageWriteError"]

SQLITE_HEADER = b"SQLite format 3\x00"  # the first 16 bytes of every SQLite 3 file (sqlite.org/fileformat.html)
_LOCK_GRACE_S = 5  # as optimizer.search.JOURNAL_LOCK_GRACE_S: a lock older than this was left by a killed process


def check_storage_url(url: str | None) -> None:
    """Raise ``InputError`` (one line) if the storage ``url`` names a missing folder or a damaged file."""
    if not url:
        return
    if url.startswith("journal:"):
        journal = url[len("journal:"):]
        if journal:
            check_journal(Path(journal), url)
        return
    if url.startswith("sqlite:"):
        path = _sqlite_path(url)
        if path is not None:
            check_sqlite(path, url)


class StorageWriteError(KvtuneError):
    """The storage could not be written while a run went on (a full disk): one line, exit 2."""

    exit_code = 2


def check_shared_storage(url: str | None, workers: int) -> None:
    """``--workers N`` share one storage; an in-memory SQLite database is private to one process."""
    if workers > 1 and url and url.startswith("sqlite:") and _sqlite_path(url) is None:
        raise InputError(f"--storage {url!r} with --workers {workers}: an in-memory SQLite database lives inside "
                         f"one process, so the workers would share nothing; give a file (sqlite:///kvtune.db), a "
                         f"journal (journal:kvtune.log), or no --storage (a temporary journal)")


_READ_ONLY_QUERY = {"mode": ("ro",), "immutable": ("1", "true", "yes", "on")}


def _sqlite_path(url: str) -> Path | None:
    """The file of ``sqlite:///rel.db`` or ``sqlite:////abs.db`` (None: in memory)."""
    rest = url[len("sqlite:"):]
    if not rest.startswith("//"):
        raise InputError(f"--storage {url!r}: an SQLite URL is sqlite:///FILE (relative) or sqlite:////FILE (absolute)")
    rest = rest[2:]
    host, _, path = rest.partition("/")
    path, _, query = path.partition("?")
    path = urllib.parse.unquote(path)
    if host:
        raise InputError(f"--storage {url!r}: an SQLite URL names no host; use sqlite:///FILE")
    for key, value in urllib.parse.parse_qsl(query, keep_blank_values=True):
        if value.lower() in _READ_ONLY_QUERY.get(key.lower(), ()):
            raise InputError(f"--storage {url!r}: {key}={value} opens the database read-only, but optuna writes every "
                             f"trial into its storage; give a copy to write to (a read-only study can be browsed "
                             f"with optuna-dashboard)")
    if path in ("", ":memory:"):
        return None
    return Path(path)


def _check_writable(path: Path, url: str) -> None:
    """optuna writes the storage and files beside it (the journal's lock, SQLite's rollback journal)."""
    folder = path.parent
    try:
        if os.statvfs(folder).f_flag & os.ST_RDONLY:
            raise InputError(f"--storage {url!r}: {folder} is on a read-only file system; optuna writes its trials "
                             f"into the storage")
    except OSError:
        pass
    if not os.access(folder, os.W_OK | os.X_OK):
        raise InputError(f"--storage {url!r}: folder {folder} is not writable (permission denied); optuna writes "
                         f"its trials into the storage and a lock file beside it")
    if path_kind(path) == "file" and not os.access(path, os.W_OK):
        raise InputError(f"--storage {url!r}: {path} cannot be written (read-only or immutable); optuna writes its "
                         f"trials into the storage")


def _check_folder(path: Path, url: str) -> None:
    parent = path_kind(path.parent)
    if not parent:
        raise InputError(f"--storage {url!r}: folder {path.parent} does not exist")
    if parent != "dir":
        raise InputError(f"--storage {url!r}: {path.parent} is not a folder")
    if len(path.name.encode()) > 255:  # NAME_MAX of Linux and macOS file systems
        raise InputError(f"--storage {url!r}: the file name is longer than 255 bytes")
    if path_kind(path) not in (None, "file"):
        raise InputError(f"--storage {url!r}: {path} is not a file")


def _journal_fault(path: Path) -> str | None:
    """Why the journal at ``path`` is damaged, or None when it is whole (or absent/empty)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"cannot read ({exc.strerror or exc})"
    if not data:
        return None
    start = 0
    for n, line in enumerate(data.splitlines(keepends=True), start=1):
        if not line.endswith(b"\n"):
            return (f"line {n} is cut short ({len(line)} bytes after the last newline, at byte offset {start}): "
                    f"a write was interrupted; truncate the file to {start} bytes to resume from the whole records")
        try:
            rec = json.loads(line)
        except (ValueError, RecursionError):
            return (f"line {n} (byte offset {start}) is not a JSON record; the journal is damaged "
                    f"(restore it, or truncate it to {start} bytes to keep the records before)")
        if not isinstance(rec, dict):
            return f"line {n} (byte offset {start}) is not a journal record"
        start += len(line)
    return None


def check_journal(path: Path, url: str) -> None:
    _check_folder(path, url)
    _check_writable(path, url)
    fault = _journal_fault(path)
    if fault is None:
        return
    # Another process may be appending right now: look again while holding the journal's lock.
    try:

        lock = JournalFileSymlinkLock(str(path), grace_period=_LOCK_GRACE_S)
        lock.acquire()
        try:
            fault = _journal_fault(path)
        finally:
            lock.release()
    except OSError:
        pass  # cannot take the lock (a read-only folder): the first reading stands
    if fault is not None:
        raise InputError(f"--storage {url!r}: journal {path}: {fault}")


def check_sqlite(path: Path, url: str) -> None:
    _check_folder(path, url)
    _check_writable(path, url)
    try:
        with path.open("rb") as f:
            head = f.read(len(SQLITE_HEADER))
    except FileNotFoundError:
        return  # a new database
    except OSError as exc:
        raise InputError(f"--storage {url!r}: cannot read {path} ({exc.strerror or exc})") from None
    if not head:
        return  # an empty file: SQLite makes a new database in it
    if head != SQLITE_HEADER:
        raise InputError(f"--storage {url!r}: {path} is not an SQLite database (its first bytes are "
                         f"{head[:16]!r}); give a new file name or remove it")
    try:
        con = sqlite3.connect(f"file:{urllib.parse.quote(str(path.resolve()))}?mode=ro", uri=True, timeout=60)
        try:
            rows = con.execute("PRAGMA quick_check").fetchall()
        finally:
            con.close()
    except sqlite3.Error as exc:
        raise InputError(f"--storage {url!r}: {path} is a damaged SQLite database ({exc})") from None
    result = "; ".join(str(r[0]) for r in rows[:3])
    if result != "ok":
        raise InputError(f"--storage {url!r}: {path} is a damaged SQLite database (quick_check: {result[:200]})")


def journal_backend(path: str, lock):
    """optuna's journal file backend whose every append first checks, under the journal's lock,
    that the file ends with a whole record (see the module docstring)."""
    class _CheckedJournalFileBackend(JournalFileBackend):
        def append_logs(self, logs):
            lock.acquire()
            try:
                with open(path, "rb") as f:
                    f.seek(0, os.SEEK_END)
                    size = f.tell()
                    if size:
                        f.seek(size - 1)
                        if f.read(1) != b"\n":
                            raise InputError(f"--storage 'journal:{path}': journal {path}: its last record was cut "
                                             f"short while this run went on (another process killed mid-write?); "
                                             f"nothing appended")
                # the record format of optuna's JournalFileBackend.append_logs (optuna 4.x)
                text = "\n".join(json.dumps(log, separators=(",", ":")) for log in logs) + "\n"
                data = memoryview(text.encode("utf-8"))
                fd = os.open(path, os.O_WRONLY | os.O_APPEND)
                try:
                    while data:
                        data = data[os.write(fd, data):]
                    os.fsync(fd)
                except OSError as exc:  # a full disk: cut the partial record off, keep the whole ones
                    try:
                        os.ftruncate(fd, size)
                    except OSError:
                        pass
                    raise StorageWriteError(f"--storage 'journal:{path}': journal {path}: cannot append "
                                            f"({exc.strerror or exc}); the run stopped and the journal keeps "
                                            f"its {size:,} bytes of whole records") from None
                finally:
                    os.close(fd)
            finally:
                lock.release()

    return _CheckedJournalFileBackend(path, lock_obj=lock)
