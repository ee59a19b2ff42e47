"""Each shipped example solved once per test session, shared by the slow tests that read its answer.

Three slow suites check the same whole solves from three sides: the report and the terminal
(``cli/test_report_examples.py``), the result schema (``cli/test_conventions.py``) and the launch
lines against each engine's flags (``engines/test_launch_contracts.py``). A solve is deterministic
(same inputs and seed, same answer: ``cli/test_solve.py`` checks it), so one
``kvtune solve examples/NAME.yaml --quiet --json r.json --report rep [EXTRA...]`` serves all three.
Under pytest-xdist the workers share the cache folder (the session's base temporary folder) and a
file lock, so an example is solved once whichever worker asks first.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from helpers import kvtune

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Solved:
    """One example's solve: the exit code, the terminal text, the JSON file and the report folder."""

    code: int
    text: str
    json_path: Path
    report: Path

    @property
    def result(self) -> dict:
        return json.loads(self.json_path.read_text())


def _cache_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.getbasetemp()
    # pytest-xdist: each worker's base is <session base>/popen-gwN; the session base is shared
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "example-solves"
    root.mkdir(exist_ok=True)
    return root


_MEMO: dict[tuple[str, ...], Solved] = {}


def solve_example(tmp_path_factory: pytest.TempPathFactory, name: str, *extra: str) -> Solved:
    """``kvtune solve examples/NAME.yaml ... EXTRA`` once per session (any worker), then read back."""
    key = (name, *extra)
    if key in _MEMO:
        return _MEMO[key]
    folder = _cache_root(tmp_path_factory) / re.sub(r"[^A-Za-z0-9.-]+", "_", "_".join(key))
    with open(f"{folder}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = folder / "done.json"
        if not done.exists():
            folder.mkdir(exist_ok=True)
            code, text = kvtune("solve", ROOT / "examples" / f"{name}.yaml", "--quiet", "--json",
                                folder / "r.json", "--report", folder / "rep", *extra)
            done.write_text(json.dumps({"code": code, "text": text}))
        rec = json.loads(done.read_text())
    _MEMO[key] = Solved(rec["code"], rec["text"], folder / "r.json", folder / "rep")
    return _MEMO[key]
