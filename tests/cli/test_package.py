"""The installed distribution is one top-level package, ``kvtune``; the layers keep their order.

``costmodel/``, ``optimizer/`` and ``profiles/`` stay at the repository root (the design card);
``kvtune/costmodel``, ``kvtune/optimizer``, ``kvtune/profiles`` and ``kvtune/examples`` link to them. These tests hold
the three things that could drift: an import of the old top-level names, ``costmodel`` importing
``optimizer``, and a wheel missing a module or a data file.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import kvtune

ROOT = Path(__file__).parent.resolve().parents[1]
OLD_TOP_LEVEL = {"costmodel", "optimizer", "profiles"}
LAYERS = ("costmodel", "optimizer", "profiles")


def _python_files(*folders: str) -> list[Path]:
    return sorted(p for f in folders for p in (ROOT / f).rglob("*.py") if "__pycache__" not in p.parts)


def _imports(path: Path) -> list[tuple[int, str, int]]:
    """(line, module, level) for every import statement in a file."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name, 0) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            out.append((node.lineno, node.module or "", node.level))
    return out


def test_the_package_folders_are_the_design_folders():
    for name in (*LAYERS, "examples"):
        link = ROOT / "kvtune" / name
        assert link.is_symlink() and link.resolve() == (ROOT / name).resolve(), link
    assert Path(kvtune.__file__).resolve().parent == (ROOT / "kvtune").resolve()


def test_nothing_imports_the_old_top_level_names():
    found = [f"{p.relative_to(ROOT)}:{line}: {mod}" for p in _python_files(*LAYERS, "kvtune", "tests", "bench")
             if not p.is_relative_to(ROOT / "kvtune" / "costmodel") and not p.is_relative_to(ROOT / "kvtune" / "optimizer")
             for line, mod, level in _imports(p) if level == 0 and mod.split(".")[0] in OLD_TOP_LEVEL]
    assert not found, "import kvtune.<layer>, not the bare layer name:\n" + "\n".join(found)


def test_costmodel_never_imports_optimizer():
    found = []
    for p in _python_files("costmodel"):
        depth = len(p.relative_to(ROOT / "costmodel").parts)  # a level-(depth+1) relative import reaches kvtune/
        for line, mod, level in _imports(p):
            absolute = mod if level == 0 else ("kvtune." + mod if level == depth + 1 else "")
            if absolute.startswith("kvtune.optimizer"):
                found.append(f"{p.relative_to(ROOT)}:{line}: {mod}")
    assert not found, "costmodel is pure and never imports optimizer:\n" + "\n".join(found)


@pytest.mark.slow
def test_the_wheel_is_one_package_that_runs_with_every_module_and_data_file(tmp_path):
    src = tmp_path / "src"  # build from a copy: setuptools writes build/ and egg-info beside the sources
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, src / name)
    for name in (*LAYERS, "examples", "kvtune"):
        shutil.copytree(ROOT / name, src / name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
    # the build pip install . runs: an isolated environment with the build-system requirements
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path / "dist"), str(src)], capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    (wheel,) = (tmp_path / "dist").glob("kvtune-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {"kvtune", f"kvtune-{kvtune.__version__}.dist-info"}
    top_level = zipfile.ZipFile(wheel).read(f"kvtune-{kvtune.__version__}.dist-info/top_level.txt").decode()
    assert top_level.split() == ["kvtune"]
    shipped = {f"kvtune/{p.relative_to(ROOT).as_posix()}" for p in _python_files("costmodel", "optimizer")}
    shipped |= {f"kvtune/{p.relative_to(ROOT).as_posix()}" for p in (ROOT / "profiles").rglob("*")
                if p.is_file() and "__pycache__" not in p.parts}
    shipped |= {f"kvtune/{p.relative_to(ROOT).as_posix()}" for p in (ROOT / "examples").rglob("*")
                if p.suffix in (".yaml", ".csv", ".jsonl")}
    assert not shipped - set(names), f"missing from the wheel: {sorted(shipped - set(names))}"
    assert any(n.endswith("/licenses/LICENSE") or n.endswith(".dist-info/LICENSE") for n in names), names

    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    code = ("import sys, kvtune.costmodel, kvtune.optimizer.cli as cli; "
            "print(kvtune.costmodel.__file__); sys.argv = ['kvtune', 'estimate', '--model', 'llama-3.1-8b', "
            "'--batch', '1,64', '--engine', 'sglang']; cli.main()")
    ran = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                         env={"PYTHONPATH": str(site), "PATH": ""})
    assert ran.returncode == 0, ran.stderr
    first, rest = ran.stdout.split("\n", 1)
    assert Path(first).is_relative_to(site)  # the wheel's copy, not the source tree
    assert "h100-sxm-sglang.yaml" in rest  # a shipped calibration read from the wheel's data files

    # a pip-only user gets the examples: `kvtune example NAME` writes one (and its trace) that solves
    code = ("import sys, kvtune.optimizer.cli as cli; sys.argv = ['kvtune', 'example', 'trace-azure']; cli.main()")
    work = tmp_path / "work"
    work.mkdir()
    ran = subprocess.run([sys.executable, "-c", code], cwd=work, capture_output=True, text=True,
                         env={"PYTHONPATH": str(site), "PATH": ""})
    assert ran.returncode == 0, ran.stderr
    assert (work / "trace-azure.yaml").read_text() == (ROOT / "examples" / "trace-azure.yaml").read_text()
    assert (work / "traces" / "azure_conv_sample.csv").is_file()
