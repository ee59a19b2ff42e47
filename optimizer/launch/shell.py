"""Commands as users paste them: one flag and its value per line, comments on top."""

from __future__ import annotations

import shlex

__all__ = ["command", "comment_block", "argv_of"]


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
