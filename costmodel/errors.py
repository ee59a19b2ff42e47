"""Errors a user can fix. Each is one line naming what is wrong and where (file, key, value).

Bugs are not wrapped: they surface as tracebacks. The CLI turns a ``KvtuneError`` into a single
``Error: ...`` line on stderr (``one_line``) and exits with ``exit_code``.

``one_line`` is the one home of how a message quotes what a user gave: characters that would
break or disguise the line (line breaks, other control characters, bidirectional overrides such
as U+202E, zero-width characters) are escaped, and a value longer than ``MAX_SHOWN_CHARS`` is cut
to its start and end with its length between (a 1 MB model name is not echoed whole).
"""

from __future__ import annotations

import re

__all__ = ["KvtuneError", "InputError", "DoesNotFit", "Infeasible", "ProfileDataMissing", "escape", "clip",
           "one_line", "MAX_SHOWN_CHARS", "MAX_MESSAGE_CHARS"]

MAX_SHOWN_CHARS = 120      # a word of a message (a value, a path) longer than this is clipped
MAX_MESSAGE_CHARS = 2000   # a whole message longer than this keeps its start and end


class KvtuneError(Exception):
    """Base class for expected, user-fixable outcomes."""

    exit_code = 2


class InputError(KvtuneError, ValueError):
    """Bad input: an unknown name, a value out of range, a malformed file."""

    exit_code = 2


class DoesNotFit(KvtuneError):
    """The weights (plus reserve) do not fit in GPU memory at this tensor-parallel size."""

    exit_code = 2

    def __init__(self, message: str, shortfall_bytes: float = 0.0):
        super().__init__(message)
        self.shortfall_bytes = shortfall_bytes


class Infeasible(KvtuneError):
    """No configuration meets the request; carries the reason and the closest miss."""

    exit_code = 3


class ProfileDataMissing(KvtuneError):
    """A measured table or calibration needed for the question is not there."""

    exit_code = 2


_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape_char(ch: str) -> str:
    if ch in _NAMED:
        return _NAMED[ch]
    n = ord(ch)
    return f"\\x{n:02x}" if n < 0x100 else f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}"


def escape(text: str) -> str:
    """``text`` with every character that is not printable escaped (``\\n``, ``\\x00``, ``\\u202e``):
    control characters, format characters (bidirectional overrides and isolates, zero-width
    joiners), separators other than the space, surrogates and unassigned code points. Printable
    non-ASCII text (``café``, ``模型``) is kept as written."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else _escape_char(ch) for ch in text)


def clip(text: str, limit: int = MAX_SHOWN_CHARS) -> str:
    """``text`` cut to its first and last characters with its length between, when longer than
    ``limit`` (the end of a long path names its file)."""
    if len(text) <= limit:
        return text
    tail = max(limit // 6, 8)
    head = max(limit - tail - 24, 8)
    return f"{text[:head]}...({len(text):,} characters)...{text[-tail:]}"


_LONG_WORD = re.compile(r"\S{%d,}" % (MAX_SHOWN_CHARS + 1))


def one_line(message: str) -> str:
    """A message as the single line the CLI prints: escaped (``escape``), every word longer than
    ``MAX_SHOWN_CHARS`` clipped, and the whole kept under about ``MAX_MESSAGE_CHARS``."""
    text = escape(message)
    text = _LONG_WORD.sub(lambda m: clip(m.group(0)), text)
    if len(text) > MAX_MESSAGE_CHARS:
        text = clip(text, MAX_MESSAGE_CHARS)
    return text
