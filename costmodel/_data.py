"""Locating kvtune's shipped data files (the ``profiles`` package). Read-only."""

from __future__ import annotations

from pathlib import Path

import yaml

from .errors import InputError

PROFILES_DIR = Path(__file__).resolve().parent.parent / "profiles"


def profiles_path(*parts: str) -> Path:
    return PROFILES_DIR.joinpath(*parts)


def load_yaml(path: Path) -> object:
    """Parse a YAML file; a syntax error becomes one line naming the file and the line."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise InputError(f"{path}: cannot read file ({exc.strerror})") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise InputError(f"{path}:{where} invalid YAML: {problem}") from None
