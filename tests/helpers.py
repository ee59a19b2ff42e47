"""Helpers the test files share: the CLI run in-process through its real click group, and a
measured table written with the project's own table writer. Imported as ``from helpers import ...``
(pytest puts tests/ on the path, as for ``sim_golden_cases``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable

from click.testing import CliRunner

from kvtune.costmodel.profile_table import ProfileRow
from kvtune.optimizer.cli import main
from kvtune.optimizer.importers import rows_to_csv


def kvtune(*args: object) -> tuple[int, str]:
    """Run ``kvtune ARGS...`` through the real group (its one-line errors and exit codes);
    returns the exit code and the output (stdout and stderr together)."""
    r = CliRunner().invoke(main, [str(a) for a in args])
    return r.exit_code, r.output


def kvtune_json(*args: object) -> dict:
    """``kvtune ARGS... --json``, which must exit 0; returns the parsed JSON."""
    code, out = kvtune(*args, "--json")
    assert code == 0, out
    return json.loads(out)


def write_table(path: Path, rows: Iterable[ProfileRow]) -> Path:
    """Write ``rows`` as a measured table (optimizer.importers.rows_to_csv) and return ``path``."""
    path.write_text(rows_to_csv(rows))
    return path


def nested_keys(d: dict, prefix: str = "") -> list[str]:
    """Every key of a nested mapping as a dotted path (``a``, ``a.b``, ...): the keys a generated
    YAML config sets, to check against an engine's table of the keys it defines."""
    out = []
    for k, v in d.items():
        out.append(prefix + k)
        if isinstance(v, dict):
            out += nested_keys(v, prefix + k + ".")
    return out
