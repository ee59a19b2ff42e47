"""The ``kvtune`` command line. One group, one context; subcommands live in sibling modules.

Expected failures (``KvtuneError``) print one ``Error:`` line and exit with their code (2 for bad
input, 3 for an infeasible request); ``--debug`` shows the traceback instead. Every such line goes
through ``costmodel.errors.one_line`` (escaped, long values clipped). Output that cannot be written
(stdout to a full device, a study on a full disk) is one line too, not a traceback, exit 2 (the
user can free space or choose another place); a reader that went away (``kvtune ... | head``) ends
the command quietly with exit 1.
"""

from __future__ import annotations

import errno
import os
import sys

import click

from kvtune import __version__
from kvtune.costmodel.errors import KvtuneError, one_line

from ._common import bare_json_args

# the machine cannot take the output: a full or failing device, a quota, a file too large
_OUTPUT_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO, errno.EROFS}


def _fail(message: str, code: int) -> None:
    click.echo("Error: " + one_line(message), err=True)
    sys.exit(code)


# what SQLite says when the machine, not kvtune, stops a write (sqlite.org/rescode.html: SQLITE_FULL,
# SQLITE_READONLY, SQLITE_IOERR); optuna reports them wrapped (StorageInternalError), or loses them
# under an AssertionError of its own when the trial's final state cannot be written
_STORAGE_FAULTS = ("database or disk is full", "attempt to write a readonly database", "disk i/o error")


def _machine_fault(exc: BaseException) -> BaseException | None:
    """The user-fixable fault under ``exc`` (a ``KvtuneError``, a full or read-only device, a full
    database) when another exception was raised on top of it, else None (a bug: its traceback)."""
    stack: list[BaseException] = [exc]
    seen: set[int] = set()
    while stack:
        e = stack.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, KvtuneError) or (isinstance(e, OSError) and e.errno in _OUTPUT_ERRNOS):
            return e
        if type(e).__name__ == "OperationalError" and any(f in str(e).lower() for f in _STORAGE_FAULTS):
            return e
        stack += [x for x in (e.__cause__, e.__context__) if x is not None]
    return None


def _flag_value(flag: str) -> str | None:
    argv = sys.argv
    for i, a in enumerate(argv):
        if a == flag and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith(flag + "="):
            return a[len(flag) + 1:]
    return None


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's last flush at exit cannot fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass  # no real stdout (a test runner's buffer): nothing will be flushed at exit


class KvtuneGroup(click.Group):
    def main(self, args=None, *rest, **kwargs):
        debug = "--debug" in sys.argv
        try:
            args = bare_json_args(list(sys.argv[1:] if args is None else args))
            rv = super().main(args, *rest, standalone_mode=False, **kwargs)
            sys.stdout.flush()  # a full device shows here, while the error can still be one line
            return rv
        except KvtuneError as exc:
            if debug:
                raise
            _fail(str(exc), exc.exit_code)
        except OSError as exc:
            if debug:
                raise
            if exc.errno == errno.EPIPE:  # the reader of stdout went away: nothing more to say
                _silence_stdout()
                sys.exit(1)
            # A path no file system can hold (a name over 255 bytes) is the user's input; a device
            # that cannot take the output is the machine's state. Any other OSError is a fault of
            # kvtune and keeps its traceback.
            if exc.errno == errno.ENAMETOOLONG:
                _fail(f"{exc.filename}: {exc.strerror}", 2)
            if exc.errno in _OUTPUT_ERRNOS:
                where = exc.filename if exc.filename is not None else "stdout"
                if exc.filename is None:
                    _silence_stdout()
                _fail(f"{where}: cannot write the output ({exc.strerror})", 2)
            raise
        except click.exceptions.Abort:
            click.echo("Aborted.", err=True)
            sys.exit(130)
        except click.UsageError as exc:
            # one line, like every other input error; --help shows the usage
            where = f"{exc.ctx.command_path}: " if exc.ctx is not None else ""
            _fail(f"{where}{exc.format_message()}", 2)
        except click.ClickException as exc:
            _fail(exc.format_message(), exc.exit_code)
        except click.exceptions.Exit as exc:
            sys.exit(exc.exit_code)
        except Exception as exc:
            fault = None if debug else _machine_fault(exc)
            if fault is None:
                raise
            if isinstance(fault, KvtuneError):
                _fail(str(fault), fault.exit_code)
            if isinstance(fault, OSError):
                _fail(f"{fault.filename or 'output'}: cannot write ({fault.strerror})", 2)
            storage = _flag_value("--storage")
            first = (str(fault).splitlines() or [""])[0]
            _fail(f"--storage {storage!r}: cannot write the study ({first}); the run stopped, the trials already "
                  f"written are kept", 2)


# every option also reads KVTUNE_<COMMAND>_<OPTION> (KVTUNE_SOLVE_TRIALS=50, KVTUNE_TUNE_MAX_RUNS=10): click's
# auto_envvar_prefix. The KVTUNE_* variables kvtune reads itself (KVTUNE_LIVE, KVTUNE_PG, KVTUNE_LLAMA_*, ...)
# name no command, so they cannot be read as an option.
@click.group(cls=KvtuneGroup, context_settings={"auto_envvar_prefix": "KVTUNE"})
@click.version_option(__version__, prog_name="kvtune")
@click.option("--debug", is_flag=True, help="Show tracebacks for expected errors.")
@click.pass_context
def main(ctx: click.Context, debug: bool) -> None:
    """kvtune: which serving config, on how many GPUs, meets your SLOs at the lowest price."""
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug


def _register() -> None:
    import importlib

    for mod in ("estimate", "simulate", "solve", "profile", "calibrate", "validate", "example", "tune"):
        try:
            m = importlib.import_module(f"kvtune.optimizer.cli.{mod}")
        except ModuleNotFoundError as exc:
            if exc.name == f"kvtune.optimizer.cli.{mod}":
                continue  # that command is not built yet
            raise
        for cmd in getattr(m, "COMMANDS", []):
            main.add_command(cmd)


_register()
