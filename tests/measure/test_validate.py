"""`kvtune validate`, the shared closed-loop path, and llama.cpp tables at their own formats."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import yaml

from kvtune.costmodel import get_gpu
from kvtune.costmodel.calibration import efficiency_for
from kvtune.costmodel.closed_loop import STAGGERED_ENGINES, default_clients, measured_window, run_closed_loop
from kvtune.costmodel.errors import InputError
from kvtune.costmodel.requests import Requests
from kvtune.costmodel.dtypes import BYTES_PER_ELEMENT, canonical
from kvtune.costmodel.fit import RowPredictor
from kvtune.costmodel.profile_table import ProfileRow, read_table

from helpers import kvtune, kvtune_json, write_table

ROOT = Path(__file__).parent.resolve().parents[1]
CPU_TABLE = ROOT / "profiles" / "tables" / "smollm2-135m-cpu-llamacpp.csv"
CPU_HW = ROOT / "profiles" / "hardware-cpu-example.yaml"
FIXED = ROOT / "tests" / "data" / "fixed-llama3.1-8b.yaml"


# ---- item 1: kvtune simulate --concurrency and the calibration share one path -------------------

@pytest.mark.parametrize("engine,clients", [("vllm", None), ("trtllm", "burst"), ("sglang", "staggered")])
def test_simulate_cli_and_row_predictor_give_the_same_number(tmp_path, engine, clients):
    """The same closed-loop run (llama-3.1-8b, 1024/256 tokens, 16 clients) through `kvtune simulate
    --concurrency` and through the calibration's RowPredictor: identical mean TTFT and TPOT."""
    c, isl, osl = 16, 1024, 256
    n = 64  # RowPredictor: max(4 x C, 64)
    args = ["simulate", FIXED, "--concurrency", c, "--engine", engine, "--requests", n, "--batch-cap", c]
    if clients:
        args += ["--clients", clients]
    cli = kvtune_json(*args)
    used = clients or default_clients(engine)
    assert cli["closed_loop"]["clients"] == used
    assert cli["closed_loop"]["excluded"]["warmup_requests"] == c == cli["closed_loop"]["excluded"]["drain_requests"]
    assert cli["measured_requests"] == n - 2 * c
    gpu = get_gpu("h100-sxm")
    eff = efficiency_for("calibrated", "h100-sxm", None, engine)
    # the CLI runs the scheduler kvtune launches (mixed prefill chunks); the row says so
    row = ProfileRow(id="r", kind="request", gpu="h100-sxm", engine=engine, model="llama-3.1-8b", concurrency=c,
                     input_tokens=isl, output_tokens=osl, ttft_mean_ms=1.0, tpot_mean_ms=1.0, scheduler="mixed")
    pred = RowPredictor(gpu, stagger=used == "staggered")([row], eff)[0]
    assert cli["ttft_ms"]["mean"] == pytest.approx(pred["ttft_ms"], rel=1e-9)
    assert cli["tpot_ms"]["mean"] == pytest.approx(pred["tpot_ms"], rel=1e-9)


def test_default_clients_follow_the_engines_scheduler():
    assert default_clients("vllm") == default_clients("trtllm") == default_clients(None) == "staggered"
    assert default_clients("sglang") == default_clients("llama.cpp") == "burst"
    assert "sglang" not in STAGGERED_ENGINES
    keep = measured_window(10, 3)
    assert keep.tolist() == [False] * 3 + [True] * 4 + [False] * 3
    assert measured_window(5, 3).all()  # too short to drop both ends: every request counts
    assert measured_window(10, 3, "whole_run").all()  # a load tool that counts its whole run
    with pytest.raises(InputError, match="window must be one of steady, whole_run"):
        measured_window(10, 3, "all")


def _whole_run_row(**kw) -> ProfileRow:
    base = dict(id="w", kind="request", gpu="h100-sxm", engine="vllm", model="llama-3.1-8b", concurrency=8,
                input_tokens=2048, output_tokens=64, ttft_mean_ms=1.0, tpot_mean_ms=1.0, chunk_tokens=2048 + 8 + 1500)
    return ProfileRow(**{**base, **kw})


def test_whole_run_row_is_simulated_as_its_load_tool_ran_it():
    """A row whose means cover its whole run (AIPerf: every client starts at once on an idle engine,
    every request counted) is simulated with its num_requests requests, a burst start and no
    request left out; the first, bunched round then raises the mean TTFT over the steady rows'."""
    gpu = get_gpu("h100-sxm")
    eff = efficiency_for("calibrated", "h100-sxm", engine="vllm")
    row = _whole_run_row(num_requests=160, stats_window="whole_run")
    pred = RowPredictor(gpu, stagger=STAGGERED_ENGINES)
    assert pred.clients(row) == "burst" and pred.simulated_requests(row) == 160
    got = pred([row], eff)[0]
    sm = pred.step_model(row, eff)
    res = run_closed_loop(sm, Requests.uniform(160, 2048, 64), pred.sim_config(row, 8), 8, "burst", window="whole_run")
    assert np.asarray(res.measured).all()
    assert got["ttft_ms"] == pytest.approx(float(np.mean(res.ttft_s)) * 1e3, rel=1e-9)
    steady = pred([_whole_run_row(num_requests=160)], eff)[0]   # no stats_window: steady, staggered
    assert got["ttft_ms"] > steady["ttft_ms"]


def test_whole_run_window_needs_the_runs_request_count(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("id,kind,engine,concurrency,input_tokens,output_tokens,ttft_mean_ms,stats_window\n"
                 "a,request,vllm,8,128,16,10,whole_run\n")
    with pytest.raises(InputError, match="stats_window = 'whole_run' needs concurrency and num_requests"):
        read_table(p)
    p.write_text("id,kind,engine,concurrency,input_tokens,output_tokens,ttft_mean_ms,num_requests,stats_window\n"
                 "a,request,vllm,8,128,16,10,160,everything\n")
    with pytest.raises(InputError, match="stats_window = 'everything', expected steady or whole_run"):
        read_table(p)
    p.write_text("id,kind,engine,concurrency,input_tokens,output_tokens,ttft_mean_ms,num_requests,stats_window\n"
                 "a,request,vllm,8,128,16,10,160,whole_run\n")
    assert read_table(p)[0].stats_window == "whole_run"


def test_staggered_clients_cut_burst_ttft_on_vllm():
    """A burst prefills all 16 prompts in one step (each waits for all); staggered clients prefill
    one at a time: the issue's gap (burst TTFT several times the staggered one)."""
    base = ["simulate", FIXED, "--concurrency", 16, "--engine", "vllm", "--requests", 64]
    burst, stag = kvtune_json(*base, "--clients", "burst"), kvtune_json(*base)
    assert stag["closed_loop"]["clients_default"] == "staggered"
    assert burst["ttft_ms"]["mean"] > 3 * stag["ttft_ms"]["mean"]


def test_clients_flag_needs_a_closed_loop():
    code, out = kvtune("simulate", FIXED, "--rate", 1, "--clients", "burst")
    assert code == 2 and out.strip() == "Error: --clients applies to a closed loop: give --concurrency"
    code, out = kvtune("simulate", FIXED, "--concurrency", 4, "--clients", "sometimes")
    assert code == 2 and "--clients: 'sometimes' is not one of burst, staggered" in out


def test_poisson_json_says_what_warm_up_it_excludes():
    d = kvtune_json("simulate", FIXED, "--rate", 2, "--requests", 50)
    assert d["excluded"]["warmup_frac"] == pytest.approx(0.1) and "closed_loop" not in d


# ---- item 2: kvtune validate ------------------------------------------------------------------

@pytest.mark.slow
def test_validate_cpu_table_before_and_after_calibration(tmp_path):
    before = kvtune_json("validate", CPU_TABLE, "--gpu", CPU_HW)
    rows = read_table(CPU_TABLE)
    assert len({p["id"] for p in before["points"]}) == len(rows)
    assert before["groups"][0]["engine"] == "llamacpp" and before["groups"][0]["calibration"].startswith("ideal")
    for p in before["points"]:  # side by side, and the error is the ratio's
        assert p["err_pct"] == pytest.approx((p["predicted"] / p["measured"] - 1) * 100)
    s = before["summary"]["ttft_ms"]
    errs = [p["err_pct"] for p in before["points"] if p["metric"] == "ttft_ms"]
    assert s["mape_pct"] == pytest.approx(np.mean(np.abs(errs))) and s["bias_pct"] == pytest.approx(np.mean(errs))
    assert abs(before["worst"][0]["err_pct"]) == max(abs(p["err_pct"]) for p in before["points"])
    cal = tmp_path / "cpu.yaml"
    code, out = kvtune("calibrate", CPU_TABLE, "--gpu", CPU_HW, "-o", cal)
    assert code == 0, out
    after = kvtune_json("validate", CPU_TABLE, "--gpu", CPU_HW, "--calibration", cal)
    fit = yaml.safe_load(cal.read_text())["fit"]["mape_after_pct"]
    for m, s in after["summary"].items():  # validate predicts as the calibration did
        assert s["mape_pct"] == pytest.approx(fit[m], abs=0.06)
        assert s["mape_pct"] < before["summary"][m]["mape_pct"] / 2


def test_validate_text_output_and_engine_filter(tmp_path):
    rows = [r for r in read_table(ROOT / "profiles" / "tables" / "h100-published.csv")]
    t = write_table(tmp_path / "pub.csv", rows)
    code, out = kvtune("validate", t, "--engine", "trtllm", "--worst", 3)
    assert code == 0, out
    assert "h100-sxm engine trtllm" in out and "h100-sxm-trtllm" in out and "sglang" not in out
    assert "per metric" in out and "worst 3 rows:" in out


def test_validate_refuses_unknown_gpu_and_unpredictable_tables(tmp_path):
    code, out = kvtune("validate", CPU_TABLE)
    assert code == 2 and "gpu 'cpu-2core' is not in kvtune's catalog; give its hardware file with --gpu FILE" in out
    open_loop = ProfileRow(id="o1", kind="request", gpu="h100-sxm", model="llama-3.1-8b", rate_req_s=2.0,
                           input_tokens=100, output_tokens=10, ttft_mean_ms=50.0, requests_file="o1.requests.csv")
    t = write_table(tmp_path / "open.csv", [open_loop])
    code, out = kvtune("validate", t)
    assert code == 2 and out.startswith("Error: validate: no row of the tables can be predicted (o1: open loop: its "
                                        "per-request log")
    # without a log named, an open-loop row is simulated at its rate (tests/measure/test_open_loop_replay.py)
    t = write_table(tmp_path / "open.csv", [dataclasses.replace(open_loop, requests_file="")])
    code, out = kvtune("validate", t)
    assert code == 0 and "open-loop rows (1)" in out


def test_validate_an_imported_table(tmp_path):
    """A table made by `kvtune profile import` validates like a shipped one."""
    out_csv = tmp_path / "imp.csv"
    code, out = kvtune("profile", "import", ROOT / "tests" / "data" / "import_vllm_result.json", "-o", out_csv,
                       "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--tp", 1, "--engine", "vllm")
    assert code == 0, out
    d = kvtune_json("validate", out_csv)
    assert d["points"] and d["groups"][0]["calibration"].startswith("calibrated: h100-sxm-vllm")


# ---- item 4: formats as their byte widths; errors name file and row; provenance kept whole ----

def test_gguf_formats_have_their_block_widths():
    assert BYTES_PER_ELEMENT["q4_0"] * 8 == 4.5 and BYTES_PER_ELEMENT["q4_1"] * 8 == 5.0
    assert BYTES_PER_ELEMENT["q8_0"] * 8 == 8.5 and BYTES_PER_ELEMENT["fp16"] == 2
    assert canonical("f16") == "fp16" and canonical("Q4_K_M") == "q4_k" and canonical("fp8_e4m3") == "fp8"
    assert canonical("q9_9") is None


def test_calibrate_names_file_and_row_of_an_unknown_format(tmp_path):
    rows = read_table(CPU_TABLE)
    bad = [rows[0], ProfileRow(**{**rows[1].__dict__, "kv_dtype": "q9_9"})]
    t = write_table(tmp_path / "bad.csv", bad)
    code, out = kvtune("calibrate", t, "--gpu", CPU_HW, "-o", tmp_path / "x.yaml")
    assert code == 2
    assert out.startswith(f"Error: {t}: row {rows[1].id}: kv_dtype = 'q9_9' is not a format kvtune knows")
    assert not (tmp_path / "x.yaml").exists()


@pytest.mark.slow
def test_calibration_keeps_a_command_line_source_whole(tmp_path):
    cal = tmp_path / "cpu.yaml"
    code, out = kvtune("calibrate", CPU_TABLE, "--gpu", CPU_HW, "-o", cal)
    assert code == 0, out
    src = yaml.safe_load(cal.read_text())["inputs"][0]["source"]
    assert src.startswith("kvtune profile run --url http://127.0.0.1:") and "--weight-dtype q4_1" in src
    pub = yaml.safe_load((ROOT / "profiles" / "calibrations" / "h100-sxm-trtllm.yaml").read_text())
    assert any(i["source"].startswith("h100_") for i in pub["inputs"])


@pytest.mark.slow
def test_hardware_example_commands_run(tmp_path, monkeypatch):
    """The commands in profiles/hardware-cpu-example.yaml's comments work on the committed table
    (run from the repository root, the calibration written into a scratch folder)."""
    cmds = [ln.lstrip("# ").split() for ln in CPU_HW.read_text().splitlines() if ln.lstrip("# ").startswith("kvtune ")]
    assert [c[1] for c in cmds] == ["calibrate", "validate"]
    monkeypatch.chdir(ROOT)
    for cmd in cmds:
        args = [str(tmp_path / a) if a == "cpu-2core.yaml" else a for a in cmd[1:]]
        code, out = kvtune(*args)
        assert code == 0, out
    assert "calibrated: cpu-2core" in out and "ttft_ms" in out
