"""bench/bench_oracle.py keys its cache on every file the answer depends on (issue 25, item 6): the
files the issue found missing from its old hand-kept list are in, and a change to any file's bytes
(or a trace the workload names) changes the key."""

import importlib.util
import shutil
from pathlib import Path

ROOT = Path(__file__).parent.resolve().parents[1]


def _bench():
    spec = importlib.util.spec_from_file_location("bench_oracle", ROOT / "bench" / "bench_oracle.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_code_key_covers_the_whole_cost_model_optimizer_and_profiles():
    b = _bench()
    rel = {str(p.relative_to(ROOT)) for p in b.code_files()}
    for f in ("costmodel/replica.py", "costmodel/engines/policies.py", "costmodel/models.py", "costmodel/parallel.py",
              "costmodel/efficiency.py", "costmodel/draft.py", "costmodel/goodput.py", "optimizer/verify.py",
              "optimizer/simsearch.py"):
        assert f in rel, f
    # every .py of the three folders, and the profiles' data files
    for d in ("costmodel", "optimizer", "profiles"):
        for p in (ROOT / d).rglob("*.py"):
            if "__pycache__" not in p.parts:
                assert str(p.relative_to(ROOT)) in rel
    assert any(r.startswith("profiles/") and not r.endswith(".py") for r in rel)


def test_any_byte_of_any_file_changes_the_key(tmp_path):
    b = _bench()
    for d in ("costmodel", "optimizer", "profiles"):
        shutil.copytree(ROOT / d, tmp_path / d, ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "kvtune").mkdir()
    shutil.copy(ROOT / "kvtune" / "__init__.py", tmp_path / "kvtune" / "__init__.py")
    before = b._sha(b.code_files(tmp_path))
    assert b._sha(b.code_files(tmp_path)) == before                  # the same files, the same key
    f = tmp_path / "costmodel" / "engines" / "policies.py"
    f.write_text(f.read_text() + "\n")
    assert b._sha(b.code_files(tmp_path)) != before
    # a new file counts too
    f.write_text(f.read_text()[:-1])
    assert b._sha(b.code_files(tmp_path)) == before
    (tmp_path / "optimizer" / "extra.py").write_text("")
    assert b._sha(b.code_files(tmp_path)) != before


def test_the_workload_key_covers_the_trace_it_names(tmp_path):
    b = _bench()
    (tmp_path / "traces").mkdir()
    trace = tmp_path / "traces" / "t.csv"
    trace.write_text("timestamp,input_tokens,output_tokens\n0,10,10\n")
    wl = tmp_path / "w.yaml"
    wl.write_text("model: llama-3.1-8b\nworkload: {trace: traces/t.csv}\n")
    assert b.workload_files(str(wl)) == sorted([wl.resolve(), trace.resolve()])
    before = b._sha(b.workload_files(str(wl)))
    trace.write_text("timestamp,input_tokens,output_tokens\n0,10,11\n")
    assert b._sha(b.workload_files(str(wl))) != before
