"""Is the process that claimed a piece of shared work still alive?

Processes sharing one storage (``kvtune solve --workers N``, or the same command on several
machines) mark what they are working on with ``identity()``: host name, pid and, on Linux, a
token of the process itself (boot id, pid namespace, start time). ``owner_alive`` answers from
that record, on this machine only:

- False (dead): the pid is gone, or a zombie (exited, not yet reaped by its parent), or it now
  belongs to another process (pids are reused: the start time differs);
- True: that very process is running on this machine;
- None: it cannot tell (another machine, another pid namespace, a record without a token):
  the caller falls back on the claim's heartbeat (``optimizer.scaleout``).

``os.kill(pid, 0)`` alone succeeds on a zombie, and on whatever process has since taken the pid;
a ``--workers`` child killed while its parent was busy stays a zombie until the parent reaps it.
"""

from __future__ import annotations

import os
import socket
from functools import lru_cache

__all__ = ["identity", "owner_alive", "pid_alive"]


@lru_cache(maxsize=1)
def _machine() -> str | None:
    """This boot of this kernel and this pid namespace (Linux), or None where /proc has neither."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        ns = os.readlink("/proc/self/ns/pid")
    except OSError:
        return None
    return f"{boot}/{ns}"


def _stat(pid: int) -> tuple[str, str] | None:
    """(state letter, start time in clock ticks after boot) from /proc/PID/stat; None if no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read().decode("ascii", "replace")
    except (FileNotFoundError, ProcessLookupError):
        return None
    # "pid (comm) state ppid ...": comm may hold spaces and parentheses; field 22 is the start time
    rest = raw[raw.rindex(")") + 2:].split()
    return rest[0], rest[19]


def identity() -> dict:
    """This process, as a claim records it: ``host``, ``pid`` and, where /proc allows, ``proc``."""
    me = {"host": socket.gethostname(), "pid": os.getpid()}
    machine, st = _machine(), _stat(os.getpid())
    if machine is not None and st is not None:
        me["proc"] = f"{machine}/{st[1]}"
    return me


def pid_alive(pid: int) -> bool:
    """A live process (not a zombie) has ``pid`` on this machine."""
    if _machine() is not None:
        st = _stat(pid)
        return st is not None and st[0] not in "ZXx"
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def owner_alive(claim: dict) -> bool | None:
    """Whether the process ``claim`` (an ``identity()``) names is alive: True, False, or None
    when this process cannot see it (module docstring)."""
    host, pid = claim.get("host"), claim.get("pid")
    if host != socket.gethostname() or not isinstance(pid, int) or pid <= 0:
        return None
    token, machine = claim.get("proc"), _machine()
    if not isinstance(token, str) or machine is None:
        if pid == os.getpid():
            return None          # an older record with this pid: no start time to tell it from this process
        return pid_alive(pid) or False
    where, _, start = token.rpartition("/")
    if where != machine:
        return None              # another boot, or another pid namespace under the same host name
    st = _stat(pid)
    if st is None or st[0] in "ZXx" or st[1] != start:
        return False
    return True
