"""Errors a user can fix. Each is one line naming what is wrong and where (file, key, value).

Bugs are not wrapped: they surface as tracebacks. The CLI turns a ``KvtuneError`` into a single
``Error: ...`` line on stderr and exits with ``exit_code``.
"""

from __future__ import annotations

__all__ = ["KvtuneError", "InputError", "DoesNotFit", "Infeasible", "ProfileDataMissing"]


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
