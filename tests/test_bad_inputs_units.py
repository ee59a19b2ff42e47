"""Storage faults, calibrate's refusals and warnings, and the valid inputs the checks must keep
accepting (YAML 1.2 floats, requests exactly at the context limit, RoPE-scaled contexts)."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from kvtune.costmodel.errors import InputError
from kvtune.costmodel.models import model_from_config
from kvtune.costmodel.profile_table import contradictions, read_table
from kvtune.optimizer.cli import main
from kvtune.optimizer.storage import check_journal, check_storage_url
from kvtune.optimizer.workload import load_workload, load_workload_dict

ROOT = Path(__file__).resolve().parent.parent
TINY = {"model": "llama-3.1-8b", "hardware": {"gpu": "h100-sxm", "usd_per_gpu_hour": 3.0},
        "workload": {"rate_req_s": 5, "classes": [{"input_tokens": 512, "output_tokens": 64}]},
        "slo": {"ttft_ms": 1000, "tpot_ms": 50},
        "search": {"tp": [1], "batch_cap": [8, 64], "kv_dtype": ["bf16"], "chunk_tokens": [2048, 2048]}}


def _run(argv):
    res = CliRunner().invoke(main, [str(a) for a in argv], catch_exceptions=True)
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    return res


def _one_error(res) -> str:
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("Error:")]
    assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    return lines[0]


@pytest.fixture
def workload(tmp_path) -> Path:
    """TINY, aggregated deployments only: the study's storage holds the aggregated search alone (the
    disaggregated search keeps nothing there), so the storage tests need not run it three times."""
    p = tmp_path / "w.yaml"
    p.write_text(yaml.safe_dump({**TINY, "search": {**TINY["search"], "deployment": ["aggregated"]}}))
    return p


# ---- storage -------------------------------------------------------------------------------------

def test_journal_cut_mid_line_is_refused_and_never_appended_to(tmp_path, workload):
    j = tmp_path / "j.log"
    argv = ["solve", workload, "--quiet", "--trials", "2", "--storage", f"journal:{j}"]
    assert _run(argv).exit_code == 0
    whole = j.read_bytes()
    assert _run(argv).exit_code == 0, "a whole journal resumes"
    whole = j.read_bytes()
    cut = whole[: len(whole) - 15]          # a write interrupted mid-record
    j.write_bytes(cut)
    for _ in range(2):                      # refused every time, and left exactly as it was
        res = _run(argv)
        assert res.exit_code == 2
        line = _one_error(res)
        assert "j.log" in line and "cut short" in line and str(len(cut) - len(cut.split(b"\n")[-1])) in line
        assert j.read_bytes() == cut
    j.write_bytes(cut[: len(cut) - len(cut.split(b"\n")[-1])])  # truncated as the message says: resumes
    assert _run(argv).exit_code == 0


def test_journal_garbage_line_is_refused(tmp_path):
    j = tmp_path / "j.log"
    j.write_bytes(b'{"op_code": 0}\nnot json\n{"op_code": 1}\n')
    with pytest.raises(InputError, match=r"line 2 \(byte offset 15\) is not a JSON record"):
        check_journal(j, f"journal:{j}")


def test_partial_last_line_of_a_writer_in_flight_is_not_a_fault(tmp_path):
    """Another process appending holds the journal's lock: the check waits for it and re-reads."""
    from optuna.storages.journal import JournalFileSymlinkLock

    j = tmp_path / "j.log"
    j.write_bytes(b'{"op_code": 0}\n{"op_co')
    lock = JournalFileSymlinkLock(str(j))
    lock.acquire()

    def finish():
        time.sleep(0.3)
        with j.open("ab") as f:
            f.write(b'de": 1}\n')
        lock.release()

    t = threading.Thread(target=finish)
    t.start()
    check_journal(j, f"journal:{j}")   # no error: the record was whole once the writer let go
    t.join()


def test_corrupt_sqlite_is_checked_before_use(tmp_path, workload):
    db = tmp_path / "k.db"
    argv = ["solve", workload, "--quiet", "--trials", "2", "--storage", f"sqlite:///{db}"]
    assert _run(argv).exit_code == 0
    assert _run(argv).exit_code == 0, "a sound database resumes"
    data = bytearray(db.read_bytes())
    data[100:4096] = b"\xa5" * (4096 - 100)  # the first page's body overwritten, header intact
    db.write_bytes(bytes(data))
    res = _run(argv)
    assert res.exit_code == 2
    assert "k.db" in _one_error(res) and "damaged" in _one_error(res)
    assert db.read_bytes() == bytes(data)


@pytest.mark.parametrize("url", [None, "", "sqlite:///:memory:", "journal:new.log", "sqlite:///new.db",
                                 "postgresql://u@h/db"])
def test_storage_urls_that_are_fine(url, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    check_storage_url(url)
    assert not (tmp_path / "new.log").exists() and not (tmp_path / "new.db").exists()  # checking writes nothing


# ---- calibrate ------------------------------------------------------------------------------------

STEPS = ("id,kind,gpu,model,tp,phase,batch,context_tokens,step_ms\n"
         "a,step,h100-sxm,llama-3.1-8b,1,decode,1,512,7.0\n"
         "b,step,h100-sxm,llama-3.1-8b,1,decode,32,512,9.0\n"
         "c,step,h100-sxm,llama-3.1-8b,1,decode,64,2048,12.0\n")
CONTRADICTORY = ("id,kind,gpu,model,tp,phase,batch,context_tokens,step_ms\n"
                 + "".join(f"{x}{i},step,h100-sxm,llama-3.1-8b,1,decode,{b},{c},{ms}\n"
                           for i, (b, c) in enumerate([(1, 512), (8, 512), (64, 2048)])
                           for x, ms in (("lo", 1), ("hi", 1000))))


def test_contradictory_rows_warn_in_output_and_file(tmp_path):
    (tmp_path / "t.csv").write_text(CONTRADICTORY)
    out = tmp_path / "c.yaml"
    # --if-worse keep: write the fit even where it predicts held-out rows worse than the base (the
    # default would write the base's parameters; tests/test_calibration_cv.py covers that)
    res = _run(["calibrate", tmp_path / "t.csv", "-o", out, "--params", "bw_efficiency,step_overhead_s",
                "--if-worse", "keep"])
    assert res.exit_code == 0, res.stderr
    warned = [ln.strip() for ln in res.stdout.splitlines() if ln.strip().startswith("warning:")]
    assert any("lo0 and hi0" in w and "1000.0x apart" in w for w in warned), res.stdout
    assert any("worse than its start" in w for w in warned), res.stdout
    saved = yaml.safe_load(out.read_text())["fit"]["warnings"]
    assert len(saved) == len(warned) and any("worse than its start" in w for w in saved)


def test_contradictory_rows_warn_in_json_too(tmp_path):
    (tmp_path / "t.csv").write_text(CONTRADICTORY)
    res = _run(["calibrate", tmp_path / "t.csv", "-o", tmp_path / "c.yaml", "--params", "bw_efficiency", "--json"])
    assert res.exit_code == 0
    assert any("describe the same configuration" in w for w in json.loads(res.stdout)["fit"]["warnings"])
    assert "warning:" in res.stderr


def test_consistent_rows_fit_without_warnings(tmp_path):
    (tmp_path / "t.csv").write_text(STEPS)
    out = tmp_path / "c.yaml"
    res = _run(["calibrate", tmp_path / "t.csv", "-o", out, "--params", "bw_efficiency,step_overhead_s"])
    assert res.exit_code == 0 and "warning:" not in res.stdout
    assert "warnings" not in yaml.safe_load(out.read_text())["fit"]


def test_contradictions_groups_identical_configs_only(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text(CONTRADICTORY)
    assert len(contradictions(read_table(p))) == 3
    p.write_text(STEPS + "d,step,h100-sxm,llama-3.1-8b,1,decode,1,512,7.9\n")  # a repeat within noise
    assert contradictions(read_table(p)) == []


@pytest.mark.parametrize("value", ["-3", "0", "nan", "inf", "-inf", "1e400"])
def test_calibrate_refuses_non_finite_or_non_positive_measurements(tmp_path, value):
    (tmp_path / "t.csv").write_text(STEPS + f"d,step,h100-sxm,llama-3.1-8b,1,decode,1,512,{value}\n")
    res = _run(["calibrate", tmp_path / "t.csv", "-o", tmp_path / "c.yaml"])
    assert res.exit_code == 2
    line = _one_error(res)
    assert "t.csv: line 5: column step_ms" in line and value in line
    assert not (tmp_path / "c.yaml").exists()


# ---- what the checks must keep accepting --------------------------------------------------------------

def test_yaml_1_2_exponent_floats_are_numbers(tmp_path):
    p = tmp_path / "w.yaml"
    p.write_text(yaml.safe_dump(TINY).replace("rate_req_s: 5", "rate_req_s: 1e12"))
    assert load_workload(p).workload.rate_req_s == 1e12
    p.write_text(yaml.safe_dump(TINY).replace("rate_req_s: 5", "rate_req_s: 2.5E-1"))
    assert load_workload(p).workload.rate_req_s == 0.25


@pytest.mark.parametrize("text", ["1e400", "1" + "0" * 400, "-1e999"])
def test_numbers_beyond_float_range_are_refused_with_key_and_text(tmp_path, text):
    p = tmp_path / "w.yaml"
    p.write_text(yaml.safe_dump(TINY).replace("rate_req_s: 5", f"rate_req_s: {text}"))
    with pytest.raises(InputError, match=r"w.yaml: line \d+: workload.rate_req_s = .*beyond the range"):
        load_workload(p)


def test_requests_exactly_at_the_context_limit_are_accepted():
    d = json.loads(json.dumps(TINY))
    d["workload"]["classes"][0].update(input_tokens=131_000, output_tokens=72)   # 131,072: the limit
    load_workload_dict(d)
    d["workload"]["classes"][0]["output_tokens"] = 73
    with pytest.raises(InputError, match=r"classes\[0\].output_tokens = 73: class class0: prompt \+ output reaches "
                                         r"131,000 \+ 73 = 131,073 tokens, beyond llama-3.1-8b's context of 131,072"):
        load_workload_dict(d)


def test_context_follows_rope_scaling_as_vllm_reads_it():
    cfg = json.loads((ROOT / "profiles" / "models" / "llama-3.1-8b.json").read_text())
    assert model_from_config(cfg, "x").max_context_tokens == 131_072          # llama3 scaling: stated length
    yarn = {**cfg, "max_position_embeddings": 32_768,
            "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32_768}}
    assert model_from_config(yarn, "x").max_context_tokens == 131_072
    linear = {**cfg, "max_position_embeddings": 4096, "rope_scaling": {"type": "linear", "factor": 2.0}}
    assert model_from_config(linear, "x").max_context_tokens == 8192
    none = {k: v for k, v in cfg.items() if k != "max_position_embeddings"}
    assert model_from_config(none, "x").max_context_tokens == 0               # not stated: not checked


def test_a_journal_cut_short_during_a_run_is_not_appended_to(tmp_path):
    import optuna

    from kvtune.optimizer.search import make_storage

    j = tmp_path / "j.log"
    storage = make_storage(f"journal:{j}")
    study = optuna.create_study(storage=storage, study_name="s")
    study.enqueue_trial({"x": 1})
    with j.open("ab") as f:           # another process killed mid-record
        f.write(b'{"op_code": 4, "wor')
    cut = j.read_bytes()
    with pytest.raises(InputError, match=r"cut short while this run went on.*nothing appended"):
        study.enqueue_trial({"x": 2})
    assert j.read_bytes() == cut


def test_an_imported_model_name_with_a_line_break_reads_back(tmp_path):
    """Found by bench/fuzz_readers.py: a model_id of "\\r" split the written row in two."""
    d = json.loads((ROOT / "tests" / "data" / "import_vllm_result.json").read_text())
    d["model_id"] = "meta-llama\r\nLlama\r-3.1\n8B"
    (tmp_path / "r.json").write_text(json.dumps(d))
    res = _run(["profile", "import", tmp_path / "r.json", "-o", tmp_path / "t.csv"])
    assert res.exit_code == 0, res.stderr
    (row,) = read_table(tmp_path / "t.csv")
    assert row.model == "meta-llama Llama -3.1 8B"
