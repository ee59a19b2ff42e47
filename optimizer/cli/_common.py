"""Shared option parsing for kvtune's commands: checked where input enters."""

from __future__ import annotations

import json
import math

import click

from kvtune.costmodel.engines import REGISTRY
from kvtune.costmodel.errors import InputError
from kvtune.optimizer.output import STDOUT, json_document
from kvtune.optimizer.output import check_output_folder, check_output_path, output_folder, write_atomic  # noqa: F401 (the commands import them from here)
from kvtune.optimizer.workload import MAX_SEED  # noqa: F401 (the seed bound of --seed flags)

JSON_HELP = ("Write one JSON object to PATH ('-' or no PATH: stdout, and the human text goes to stderr or is left "
             "out). A PATH ending in .yaml/.yml/.csv is read as the command's input, so the old bare --json "
             "before it keeps working.")


def json_option(help: str = JSON_HELP, dest: str = "as_json"):
    """``--json [PATH]``, one meaning on every command: PATH ``-`` (or the bare flag) is stdout."""
    return click.option("--json", dest, is_flag=False, flag_value=STDOUT, default=None, metavar="PATH", help=help)


# Input files a bare --json may stand before (``kvtune validate --json t.csv``): click's optional
# value would take them as the output path, and writing the result over a workload loses it.
_INPUT_SUFFIXES = (".yaml", ".yml", ".csv")


def bare_json_args(args: list[str]) -> list[str]:
    """``--json X`` with X an input file (its suffix) becomes ``--json - X``: the old flag spelling."""
    out: list[str] = []
    for i, a in enumerate(args):
        out.append(a)
        if a == "--json" and i + 1 < len(args) and args[i + 1].lower().endswith(_INPUT_SUFFIXES):
            out.append(STDOUT)
    return out


def check_json_dest(dest: str | None) -> None:
    """Before the work: a --json file path can be written (stdout always can)."""
    if dest and dest != STDOUT:
        check_output_path(dest, "--json")


def emit_json(dest: str | None, obj) -> bool:
    """Write ``obj`` (with ``schema_version``) to ``dest``: stdout for ``-``, else the file, atomically.
    True when it went to stdout: the caller then prints no human text there."""
    if not dest:
        return False
    text = dumps(json_document(obj))
    if dest == STDOUT:
        click.echo(text)
        return True
    save_or_show(dest, text + "\n", "--json")
    return False


class Int(click.ParamType):
    """An integer option, shown as INTEGER in ``--help``; a bad value is the one ``Error:`` line
    ``parse_int`` writes (``--max-runs: 'ten' is not an integer``)."""

    name = "integer"

    def __init__(self, minimum: int, maximum: int | None = None):
        self.minimum, self.maximum = minimum, maximum

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str:
        return "INTEGER"

    def convert(self, value, param, ctx) -> int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        flag = param.opts[0] if param is not None else "value"
        return parse_int(value, flag, self.minimum, self.maximum)


class Float(click.ParamType):
    """A finite number ``>= minimum``, shown as FLOAT in ``--help``; a bad value is one ``Error:`` line."""

    name = "float"

    def __init__(self, minimum: float = 0.0):
        self.minimum = minimum

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str:
        return "FLOAT"

    def convert(self, value, param, ctx) -> float:
        if isinstance(value, float):
            return value
        flag = param.opts[0] if param is not None else "value"
        text = str(value).strip()
        try:
            v = float(text)
        except ValueError:
            raise InputError(f"{flag}: {text[:40]!r} is not a number") from None
        if not v >= self.minimum or v == float("inf"):
            raise InputError(f"{flag}: {text[:40]} must be a finite number >= {self.minimum:g}")
        return v


class FloatList(click.ParamType):
    """Comma-separated finite numbers ``>= 0`` (``--rates 0.8,1.0,1.2``), shown as FLOAT,..."""

    name = "floats"

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str:
        return "FLOAT,..."

    def convert(self, value, param, ctx) -> str:
        flag = param.opts[0] if param is not None else "value"
        parts = [x.strip() for x in str(value).split(",") if x.strip()]
        if not parts:
            raise InputError(f"{flag}: empty list")
        for x in parts:
            Float(0.0).convert(x, param, ctx)
        return str(value)   # the command splits it (optimizer/cli/tune.py's _floats)


def save_or_show(path, text: str, flag: str) -> None:
    """``write_atomic`` after a command's work: if the file cannot be written (a full disk), its
    text goes to stdout so the work (a fit, a benchmark) is not lost, and the error says so."""
    try:
        write_atomic(path, text)
    except InputError as exc:
        click.echo(text, nl=not text.endswith("\n"))
        raise InputError(f"{flag} {exc}; what it would hold is printed on stdout instead") from None


def parse_int(value: str, flag: str, minimum: int, maximum: int | None = None) -> int:
    """One integer option checked here (not by click), so a bad value is one ``Error:`` line."""
    text = str(value).strip()
    try:
        v = int(text)
    except ValueError:
        raise InputError(f"{flag}: {text[:40]!r} is not an integer") from None
    if v < minimum:
        raise InputError(f"{flag}: {v} must be >= {minimum}")
    if maximum is not None and v > maximum:
        raise InputError(f"{flag}: {text[:40]} must be <= {maximum}")
    return v


def parse_int_list(value: str, what: str, minimum: int = 1) -> list[int]:
    out = [parse_int(part, f"--{what}", minimum) for part in str(value).split(",")]
    if not out:
        raise InputError(f"--{what}: empty list")
    return out


def to_jsonable(obj):
    """Floats that JSON cannot hold (inf, nan) become strings; numpy scalars become Python ones."""
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if hasattr(obj, "item") and not isinstance(obj, (str, bytes)):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return "inf" if obj > 0 else ("-inf" if obj < 0 else "nan")
    return obj


def dumps(obj) -> str:
    return json.dumps(to_jsonable(obj), indent=2, sort_keys=False)


def echo_table(headers: list[str], rows: list[list], out=None) -> None:
    """A plain aligned table (units belong in the headers)."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    click.echo("\n".join(lines), file=out)


def endpoint_options(f):
    """How the load reaches the server: the bearer key and the OpenAI API it speaks (``profile run``,
    ``profile open-loop``, ``tune --url``). The key is sent, never written to a table, log or record."""
    for opt in reversed([
        click.option("--api-key", default=None, envvar="OPENAI_API_KEY", show_envvar=True,
                     help="Sent as 'Authorization: Bearer KEY' (a server started with --api-key, or a gateway)."),
        click.option("--api", type=Choice(["completions", "chat"]), default="completions", show_default=True,
                     help="The API the requests use: /v1/completions, or /v1/chat/completions (the prompt as one "
                          "user message; the server's chat template adds tokens, recorded as the server reports)."),
    ]):
        f = opt(f)
    return f


class Choice(click.Choice):
    """``click.Choice`` (the choices in ``--help`` and in shell completion) whose refusal is kvtune's one
    line, ``--flag must be one of a, b, got 'x'``, as every other input error (an ``InputError``: exit 2)."""

    def convert(self, value, param, ctx):
        if value is None or value in self.choices:
            return value
        flags = [o for o in (param.opts if param is not None else []) if o.startswith("--")] or \
            (list(param.opts) if param is not None else ["value"])
        raise InputError(f"{flags[0]} must be one of {', '.join(map(str, self.choices))}, got {value!r}")


class EngineChoice(Choice):
    """``--engine``: the engines registered when the command line is read (``costmodel.engines.REGISTRY``),
    so an engine added at run time (``costmodel.engines.register``, its home in ``optimizer.launch.registry``)
    is a choice as the built-in ones are; a tuple of names taken when the module loaded holds those only."""

    def __init__(self) -> None:
        super().__init__(tuple(REGISTRY))

    @property
    def choices(self) -> tuple[str, ...]:
        return tuple(REGISTRY)

    @choices.setter
    def choices(self, _value) -> None:   # click.Choice.__init__ sets it; the registry answers instead
        pass
