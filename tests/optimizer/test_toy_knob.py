"""Issue 32, what it must show 2: adding a search knob is one field on ``Knobs`` plus its range.

The test makes exactly the edits ``optimizer/space.py``'s docstring prescribes, to a copy of the
package (the installed one is never touched): a field on ``Knobs``, a ``KnobAxis`` row, and vLLM's
flag for it. It then runs ``kvtune solve`` from that copy on a small workload that narrows the
knob's range, and follows the knob through: searched (the race holds each value in range, and the
screen's study suggested it), stored (the study's trials hold it as a parameter; the race's rows and
the recommendation's JSON hold it), printed (the answer's knob line), launched (vLLM's line sets its
flag; SGLang, which has no flag for it, is planned without it), and read by the workload file
(out of range: one line naming the key). An engine without a flag holds the knob at its default, so
its configs keep their keys.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
import yaml

from tiny_workload import tiny_8b

pytestmark = pytest.mark.xdist_group("toy-knob")   # its module fixtures computed once, on one worker

ROOT = Path(__file__).resolve().parents[2]

# (file in the package, the text there now, what the edit puts in its place)
EDITS = (
    ("optimizer/deployment.py",
     "    chunk_tokens: int = 8192   # prefill chunk / token budget per step (vLLM --max-num-batched-tokens)\n",
     "    chunk_tokens: int = 8192   # prefill chunk / token budget per step (vLLM --max-num-batched-tokens)\n"
     "    toy_level: int = 0         # a toy knob (tests/optimizer/test_toy_knob.py)\n"),
    ("optimizer/space.py",
     "AXES: tuple[KnobAxis, ...] = ()\n",
     'AXES: tuple[KnobAxis, ...] = (KnobAxis("toy_level", "t", (0, 3), hi_max=5),)\n'),
    ("optimizer/launch/vllm.py",
     "KNOB_FLAGS: dict[str, tuple[str, str]] = {}\n",
     'KNOB_FLAGS: dict[str, tuple[str, str]] = {"toy_level": ("--toy-level", "a toy flag")}\n'),
)


@pytest.fixture(scope="module")
def toy_package(tmp_path_factory) -> Path:
    """A copy of the kvtune package with the toy knob added; the folder to put on PYTHONPATH."""
    top = tmp_path_factory.mktemp("toy-knob")
    shutil.copytree(ROOT / "kvtune", top / "kvtune", symlinks=False,
                    ignore=shutil.ignore_patterns("__pycache__", "traces"))
    for rel, old, new in EDITS:
        f = top / "kvtune" / rel
        text = f.read_text()
        assert text.count(old) == 1, f"{rel}: the edit's anchor moved; update EDITS and optimizer/space.py's docstring"
        f.write_text(text.replace(old, new))
    return top


def _kvtune(top: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(top)}
    return subprocess.run([sys.executable, "-c", "from kvtune.optimizer.cli import main; main()", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


def _workload(tmp: Path, toy_range, **search) -> Path:
    doc = tiny_8b({"tp": [1], "kv_dtype": ["bf16"], "batch_cap": [32, 64], "chunk_tokens": [4096, 8192],
                   "trials": 12, "deployment": ["aggregated"], "toy_level": toy_range, **search})
    path = tmp / "toy.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.fixture(scope="module")
def solved(toy_package, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("toy-solve")
    wl = _workload(tmp, [1, 2])
    run = _kvtune(toy_package, "solve", str(wl), "--json", str(tmp / "out.json"),
                  "--storage", f"journal:{tmp / 'study.log'}", cwd=tmp)
    assert run.returncode == 0, run.stderr
    return run, json.loads((tmp / "out.json").read_text()), tmp


def test_the_toy_knob_is_searched_over_its_range(solved):
    _, out, _ = solved
    levels = {row["config"]["toy_level"] for row in out["race"]}
    assert levels == {1, 2}     # the workload's [1, 2], not the axis's default [0, 3]
    # 1 TP x 1 KV x 2 batch caps x 2 chunks x 2 levels
    assert len(out["race"]) == 8


def test_the_study_stores_it_as_a_parameter(solved):
    _, out, tmp = solved
    storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(tmp / "study.log")))
    study = optuna.load_study(study_name=out["study_name"], storage=storage)
    suggested = {t.params["toy_level"] for t in study.trials if "toy_level" in t.params}
    assert suggested and suggested <= {1, 2}


def test_the_answer_holds_prints_and_launches_it(solved):
    run, out, _ = solved
    level = out["recommendation"]["knobs"]["toy_level"]
    assert level in (1, 2)
    assert f"toy_level {level}" in run.stdout
    argv = out["launch"]["argv"]["vllm"][0]   # one argv per node
    assert argv[argv.index("--toy-level") + 1] == str(level)
    assert "--toy-level" not in out["launch"]["argv"]["sglang"][0]
    assert "--toy-level" in out["launch"]["vllm"]   # the pasted command


def test_the_workload_file_checks_its_range(toy_package, tmp_path):
    run = _kvtune(toy_package, "solve", str(_workload(tmp_path, [1, 9])), cwd=tmp_path)
    assert run.returncode != 0
    assert "search.toy_level[1]" in run.stderr and "Traceback" not in run.stderr


def test_an_engine_without_its_flag_holds_it_at_the_default(toy_package, tmp_path):
    run = _kvtune(toy_package, "solve", str(_workload(tmp_path, [1, 2])), "--engine", "sglang",
                  "--json", str(tmp_path / "out.json"), cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    out = json.loads((tmp_path / "out.json").read_text())
    assert {row["config"]["toy_level"] for row in out["race"]} == {0}
    assert "knobs" not in out["recommendation"]
