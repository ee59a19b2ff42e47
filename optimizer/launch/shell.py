"""Commands as users paste them: one flag and its value per line, comments on top."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable

__all__ = ["command", "comment_block", "argv_of", "commands_of", "add_argv"]


def command(argv: list[str], head: int = 0) -> str:
    """``argv`` as one shell command, a flag and its value per continued line; the first ``head``
    words (the program, e.g. ``python -m sglang.launch_server``) stay on the first line."""
    lines: list[str] = []
    cur: list[str] = []
    for i, a in enumerate(argv):
        if a.startswith("-") and cur and i >= head:
            lines.append(" ".join(cur))
            cur = []
        cur.append(shlex.quote(a) if a != "" else "''")
    if cur:
        lines.append(" ".join(cur))
    return " \\\n  ".join(lines)


def comment_block(lines: list[str]) -> str:
    return "\n".join("# " + ln for ln in lines if ln)


def argv_of(text: str) -> list[str]:
    """The argv of a generated command (comment lines dropped, continuations joined)."""
    body = "\n".join(ln for ln in text.splitlines() if not ln.lstrip().startswith("#"))
    return shlex.split(body.replace("\\\n", " "))


_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")


def commands_of(text: str) -> list[dict]:
    """Each command of a generated launch text as ``{"argv": [...], "env": {...}}``: comment lines
    dropped, continuations joined, one command a line; leading ``NAME=value`` words are its env."""
    body = "\n".join(ln for ln in text.splitlines() if not ln.lstrip().startswith("#")).replace("\\\n", " ")
    out = []
    for line in body.splitlines():
        words = shlex.split(line)
        env: dict[str, str] = {}
        while words and _ASSIGNMENT.match(words[0]):
            k, _, v = words.pop(0).partition("=")
            env[k] = v
        if words:
            out.append({"argv": words, "env": env})
    return out


def add_argv(launch: dict, engines: Iterable[str]) -> dict:
    """``launch`` with ``argv`` and ``env`` beside each engine's shell text, for tools that start a
    process without a shell: ``argv[engine]`` is a list of argv lists (one per process to start: one
    for an aggregated pick; each pool's server and the router for a disaggregated one) and
    ``env[engine]`` the environment each needs (parallel lists). An engine that cannot run the pick
    (``unsupported``) gets empty lists. The shell text keeps its keys: it is the contract.
    ``engines``: the registered engines' names (``registry.HOMES``), each entry shell text (a
    string, or TensorRT-LLM's ``{"command": ...}``)."""
    argv: dict[str, list[list[str]]] = {}
    env: dict[str, list[dict[str, str]]] = {}
    for e in engines:
        entry = launch.get(e)
        text = entry.get("command") if isinstance(entry, dict) else entry
        cmds = [] if not isinstance(text, str) or e in launch.get("unsupported", {}) else commands_of(text)
        argv[e] = [c["argv"] for c in cmds]
        env[e] = [c["env"] for c in cmds]
    return {**launch, "argv": argv, "env": env}
