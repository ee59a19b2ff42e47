"""The ``kvtune`` command line. One group, one context; subcommands live in sibling modules.

Expected failures (``KvtuneError``) print one ``Error:`` line and exit with their code (2 for bad
input, 3 for an infeasible request); ``--debug`` shows the traceback instead.
"""

from __future__ import annotations

import errno
import sys

import click

from kvtune import __version__
from kvtune.costmodel.errors import KvtuneError


class KvtuneGroup(click.Group):
    def main(self, *args, **kwargs):
        debug = "--debug" in sys.argv
        try:
            return super().main(*args, standalone_mode=False, **kwargs)
        except KvtuneError as exc:
            if debug:
                raise
            # one line, whatever a message quotes from the input (a key or value with a line break)
            click.echo("Error: " + str(exc).replace("\r", "\\r").replace("\n", "\\n"), err=True)
            sys.exit(exc.exit_code)
        except OSError as exc:
            # A path no file system can hold (a name over 255 bytes) is the user's input, not a bug;
            # any other OSError is a fault of the machine or of kvtune and keeps its traceback.
            if exc.errno != errno.ENAMETOOLONG or debug:
                raise
            click.echo(f"Error: {exc.filename}: {exc.strerror}", err=True)
            sys.exit(2)
        except click.exceptions.Abort:
            click.echo("Aborted.", err=True)
            sys.exit(130)
        except click.UsageError as exc:
            # one line, like every other input error; --help shows the usage
            where = f"{exc.ctx.command_path}: " if exc.ctx is not None else ""
            click.echo(f"Error: {where}{exc.format_message()}", err=True)
            sys.exit(2)
        except click.ClickException as exc:
            click.echo(f"Error: {exc.format_message()}", err=True)
            sys.exit(exc.exit_code)
        except click.exceptions.Exit as exc:
            sys.exit(exc.exit_code)


@click.group(cls=KvtuneGroup)
@click.version_option(__version__, prog_name="kvtune")
@click.option("--debug", is_flag=True, help="Show tracebacks for expected errors.")
@click.pass_context
def main(ctx: click.Context, debug: bool) -> None:
    """kvtune: which serving config, on how many GPUs, meets your SLOs at the lowest price."""
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug


def _register() -> None:
    import importlib

    for mod in ("estimate", "simulate", "solve", "profile", "calibrate", "validate", "tune"):
        try:
            m = importlib.import_module(f"kvtune.optimizer.cli.{mod}")
        except ModuleNotFoundError as exc:
            if exc.name == f"kvtune.optimizer.cli.{mod}":
                continue  # that command is not built yet
            raise
        for cmd in getattr(m, "COMMANDS", []):
            main.add_command(cmd)


_register()
