"""What can go wrong with a live engine, as one-line errors (the CLI prints ``Error: ...``).

Exit status 2 is input the user can fix (a binary or model file that is not there, a URL nothing
answers at, a port someone else holds, a server that runs another model); 3 is an engine that
failed as kvtune ran it (exited during start-up, never became healthy, crashed mid-run, or came
up other than planned); 130 is an interruption (Ctrl-C, SIGTERM), after which every finished
run is in the storage and the same command resumes.
"""

from __future__ import annotations

from kvtune.costmodel.errors import InputError, KvtuneError

__all__ = ["EngineError", "EngineStartError", "EngineCrashed", "EngineMismatch", "Interrupted", "InputError"]


class EngineError(KvtuneError):
    """The engine failed while kvtune ran it."""

    exit_code = 3


class EngineStartError(EngineError):
    """The engine did not come up: it exited during start-up or was never healthy."""


class EngineCrashed(EngineError):
    """The engine died while it served a run."""


class EngineMismatch(EngineError):
    """The running engine is not what was planned (slots, KV pool, threads, model)."""


class Interrupted(KvtuneError):
    """Ctrl-C or SIGTERM: the engine was stopped and the finished runs are stored."""

    exit_code = 130
