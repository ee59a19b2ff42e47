"""``kvtune example``: a pip-only user gets the shipped example workloads (listed, written whole,
never over an existing file) and each one written loads as a workload."""

from pathlib import Path

import pytest

from helpers import kvtune
from kvtune.optimizer.cli.example import example_names, examples_dir
from kvtune.optimizer.workload import load_workload

ROOT = Path(__file__).parent.resolve().parents[1]


def test_the_package_carries_every_example_of_the_repository():
    assert examples_dir().resolve() == (ROOT / "examples").resolve()
    assert example_names() == sorted(p.stem for p in (ROOT / "examples").glob("*.yaml"))


def test_the_list_names_every_example_with_what_it_shows():
    code, out = kvtune("example")
    assert code == 0, out
    for name in example_names():
        line = next(ln for ln in out.splitlines() if ln.startswith(name + " "))
        assert len(line.split(None, 1)[1]) > 10, line


@pytest.mark.parametrize("name", example_names())
def test_each_example_is_written_and_loads(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out = kvtune("example", name)
    assert code == 0, out
    written = tmp_path / f"{name}.yaml"
    assert written.read_text() == (ROOT / "examples" / f"{name}.yaml").read_text()
    assert f"kvtune solve {name}.yaml" in out
    load_workload(written)   # a trace it replays was written beside it


def test_an_example_is_never_written_over_a_file_and_a_bad_name_is_one_line(tmp_path):
    dest = tmp_path / "mine.yaml"
    dest.write_text("my own workload\n")
    code, out = kvtune("example", "chat-llama3.1-8b", "-o", dest)
    assert code == 2 and "exists" in out and out.count("Error:") == 1
    assert dest.read_text() == "my own workload\n"
    code, out = kvtune("example", "no-such-example")
    assert code == 2 and "no-such-example" in out and "chat-llama3.1-8b" in out
    code, out = kvtune("example", "chat-llama3.1-8b", "-o", tmp_path / "missing" / "w.yaml")
    assert code == 2 and "does not exist" in out
    assert not (tmp_path / "missing").exists()


def test_a_trace_example_is_written_with_its_trace_or_not_at_all(tmp_path):
    (tmp_path / "traces").mkdir()
    (tmp_path / "traces" / "azure_conv_sample.csv").write_text("mine\n")
    code, out = kvtune("example", "trace-azure", "-o", tmp_path / "t.yaml")
    assert code == 2 and "azure_conv_sample.csv" in out
    assert not (tmp_path / "t.yaml").exists()
    assert (tmp_path / "traces" / "azure_conv_sample.csv").read_text() == "mine\n"


def test_dash_prints_the_example():
    code, out = kvtune("example", "rag-llama3.1-70b", "-o", "-")
    assert code == 0 and out == (ROOT / "examples" / "rag-llama3.1-70b.yaml").read_text()
