"""Issue 5, "using it": calibrations and measured tables reach every command, end to end.

Each command (estimate, simulate, goodput, solve) takes ``--calibration FILE|NAME|ideal``,
``--engine`` and ``--profile TABLE`` and says in its JSON which it used (``source``,
``calibration``, ``profile``). The tests below check that the choice changes the numbers the way
the data says it should: the TRT-LLM calibration lands closer to TRT-LLM's measured TPOT than the
ideal model, a table 1.3x slower than the model moves simulated TPOT by 1.3x, and a calibration
fitted on half of the CPU llama.cpp table predicts the other half better than ideal.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from kvtune.costmodel import StepModel, get_gpu, get_model
from kvtune.costmodel.calibration import efficiency_for
from kvtune.costmodel.profile_table import ProfileRow, read_table

from helpers import kvtune, kvtune_json, write_table

ROOT = Path(__file__).parent.resolve().parents[1]
FIXED = ROOT / "tests" / "data" / "fixed-llama3.1-8b.yaml"
CHAT = ROOT / "examples" / "chat-llama3.1-8b.yaml"
SILICON = ROOT / "profiles" / "tables" / "h100-silicon.csv"
CPU_TABLE = ROOT / "profiles" / "tables" / "smollm2-135m-cpu-llamacpp.csv"
CPU_HW = ROOT / "profiles" / "hardware-cpu-example.yaml"


def mape(pred, meas) -> float:
    p, m = np.asarray(pred, float), np.asarray(meas, float)
    return float(np.mean(np.abs(p / m - 1)) * 100)


def fixed_workload(path: Path, input_tokens: int, output_tokens: int, **top) -> Path:
    """tests/data/fixed-llama3.1-8b.yaml with other lengths (and top-level keys)."""
    d = yaml.safe_load(FIXED.read_text())
    d["workload"]["classes"][0].update(input_tokens=input_tokens, output_tokens=output_tokens)
    d.update(top)
    path.write_text(yaml.safe_dump(d))
    return path


# ---- solve: the calibration chosen is named and changes the answer ------------------------------

@pytest.mark.slow
def test_solve_names_its_calibration_and_two_calibrations_give_different_answers(tmp_path):
    runs = {}
    for name, flags in (("h100-sxm-trtllm", ["--calibration", "h100-sxm-trtllm"]), ("h100-sxm", []),
                        ("ideal", ["--calibration", "ideal"])):
        out = tmp_path / f"{name}.json"
        code, text = kvtune("solve", CHAT, "--trials", 12, "--quiet", "--json", out, *flags)
        assert code == 0, text
        r = json.loads(out.read_text())
        assert r["calibration"]["name"] == name
        line = next(s for s in text.splitlines() if s.strip().startswith("efficiency:"))
        assert name in line
        runs[name] = r
    for name in ("h100-sxm-trtllm", "h100-sxm"):
        cal = runs[name]["calibration"]
        assert cal["path"] == f"profiles/calibrations/{name}.yaml" and len(cal["sha256"]) == 64
        assert runs[name]["source"].startswith(f"calibrated: {name} (") and cal["sha256"][:12] in runs[name]["source"]
    assert runs["ideal"]["calibration"] == {"name": "ideal"} and runs["ideal"]["source"].startswith("ideal")
    assert "profile" not in runs["h100-sxm"]
    # the numbers follow the calibration: a single sequence decodes fastest on the ideal model, and
    # the two fits differ; simulated per-replica goodput and the GPUs bought follow
    b1 = {k: r["screened"]["tpot_batch1_ms"] for k, r in runs.items()}
    # (the aggregated pick's: a disaggregated deployment may win under one calibration)
    g = {k: r["deployment"]["aggregated"]["per_replica_goodput_req_s"] for k, r in runs.items()}
    gpus = {k: r["deployment"]["aggregated"]["gpus"] for k, r in runs.items()}
    print(f"solve chat-llama3.1-8b: batch-1 TPOT {b1}, per-replica goodput {g}, GPUs {gpus}")
    assert b1["ideal"] < min(b1["h100-sxm"], b1["h100-sxm-trtllm"])
    assert abs(b1["h100-sxm"] / b1["h100-sxm-trtllm"] - 1) > 0.005
    assert runs["h100-sxm-trtllm"]["predicted"] != runs["h100-sxm"]["predicted"]
    assert g["ideal"] > 1.2 * max(g["h100-sxm"], g["h100-sxm-trtllm"])
    assert gpus["ideal"] < gpus["h100-sxm-trtllm"] and gpus["ideal"] <= gpus["h100-sxm"]


@pytest.mark.slow
def test_solve_engine_flag_overrides_the_workload_calibration(tmp_path):
    wl = yaml.safe_load(CHAT.read_text())
    wl["calibration"] = "h100-sxm"
    p = tmp_path / "chat.yaml"
    p.write_text(yaml.safe_dump(wl))
    out = tmp_path / "r.json"
    code, text = kvtune("solve", p, "--trials", 4, "--quiet", "--json", out, "--engine", "sglang")
    assert code == 0, text
    got = json.loads(out.read_text())
    assert got["calibration"]["name"] == "h100-sxm-sglang"
    assert got["admission"] == "prompt and output (SGLang's reserve)"   # simulated as SGLang admits
    code, text = kvtune("solve", p, "--trials", 4, "--quiet", "--engine", "tgi")
    assert code == 2 and text.strip().splitlines() == ["Error: --engine must be one of vllm, sglang, trtllm, llamacpp, got 'tgi'"]


def test_engine_picks_the_simulators_admission():
    """The simulator admits as the engine does: SGLang holds pool room for the outputs, vLLM and
    TensorRT-LLM (and no engine named) admit on the prompt; kvtune's launch lines mix prefill chunks
    into decode steps for every engine, so the simulator does too."""
    from kvtune.optimizer.step_factory import StepFactory
    gpu = get_gpu("h100-sxm")
    for engine, reserve in (("sglang", True), ("vllm", False), ("trtllm", False), (None, False)):
        cfg = StepFactory.build(gpu, "calibrated", None, engine).sim_config(64, 2048)
        assert (cfg.batch_cap, cfg.chunk_tokens, cfg.output_reserve, cfg.prefill_first) == (64, 2048, reserve, False)


# ---- simulate: the TRT-LLM calibration matches TRT-LLM's measured TPOT better than ideal -----------

def _trtllm_rows():
    rows = [r for r in read_table(SILICON) if r.engine == "trtllm" and r.model == "llama-3.1-8b"
            and r.kind == "request" and r.concurrency and r.concurrency <= 32 and r.tp in (1, 2)
            and r.input_tokens in (1024, 2048) and r.output_tokens == 256 and r.tpot_mean_ms]
    assert len(rows) == 12  # TP 1, 2 x concurrency 8, 16, 32 x prompt 1024, 2048
    return rows


def test_trtllm_calibration_lands_closer_to_measured_tpot_than_ideal(tmp_path):
    meas, pred = [], {"ideal": [], "h100-sxm-trtllm": []}
    for r in _trtllm_rows():
        wl = fixed_workload(tmp_path / f"w{r.input_tokens}.yaml", r.input_tokens, r.output_tokens)
        args = ["simulate", wl, "--tp", r.tp, "--concurrency", r.concurrency, "--batch-cap", r.concurrency,
                "--requests", max(4 * r.concurrency, 64)]
        ideal = kvtune_json(*args, "--mode", "ideal")
        cal = kvtune_json(*args, "--engine", "trtllm")
        assert ideal["calibration"] == {"name": "ideal"} and ideal["source"].startswith("ideal")
        assert cal["calibration"]["name"] == "h100-sxm-trtllm" and "h100-sxm-trtllm" in cal["source"]
        meas.append(r.tpot_mean_ms)
        pred["ideal"].append(ideal["tpot_ms"]["mean"])
        pred["h100-sxm-trtllm"].append(cal["tpot_ms"]["mean"])
    e_ideal, e_cal = mape(pred["ideal"], meas), mape(pred["h100-sxm-trtllm"], meas)
    print(f"TRT-LLM llama-3.1-8b TPOT MAPE over 12 rows: ideal {e_ideal:.1f}%, h100-sxm-trtllm {e_cal:.1f}%")
    assert e_cal < 10.0 and e_cal < e_ideal / 3  # measured: 3.6% vs 39.3%


# ---- --profile: measured step times move the simulation, the calibration covers the rest ----------

def _calibrated_step():
    eff = efficiency_for("calibrated", "h100-sxm", "h100-sxm-trtllm")
    return StepModel(get_model("llama-3.1-8b"), get_gpu("h100-sxm"), 1, "bf16", "bf16", eff)


SLOW = 1.3  # every measured decode step is this much slower than the calibrated model


def slow_table(path: Path) -> Path:
    """Decode steps 1.3x the calibrated model's at batch 1-8 x context 512-4096; prefill chunks as
    modelled (so the prefill steps stay inside the table too)."""
    sm = _calibrated_step()
    meta = dict(gpu="h100-sxm", engine="trtllm", model="llama-3.1-8b")
    rows = [ProfileRow(id=f"d{b}-{c}", kind="step", phase="decode", batch=b, context_tokens=c,
                       step_ms=SLOW * sm.decode_step(b, c).time_s * 1e3, **meta)
            for b in (1, 2, 4, 8) for c in (512, 1024, 2048, 4096)]
    rows += [ProfileRow(id=f"p{n}", kind="step", phase="prefill", batch=1, context_tokens=0, chunk_tokens=n,
                        step_ms=sm.prefill_time_s(n) * 1e3, **meta) for n in (256, 1024, 4096, 8192)]
    return write_table(path, rows)


def test_profile_moves_tpot_by_the_tables_factor_and_counts_fallbacks(tmp_path):
    table = slow_table(tmp_path / "slow.csv")
    base = ["simulate", FIXED, "--engine", "trtllm", "--requests", 32]
    # low load: every step is inside the table
    plain = kvtune_json(*base, "--concurrency", 2)
    meas = kvtune_json(*base, "--concurrency", 2, "--profile", table)
    ratio = meas["tpot_ms"]["mean"] / plain["tpot_ms"]["mean"]
    print(f"--profile (decode x{SLOW}) at concurrency 2: TPOT {plain['tpot_ms']['mean']:.2f} -> "
          f"{meas['tpot_ms']['mean']:.2f} ms, ratio {ratio:.4f}; profile {meas['profile']}")
    assert ratio == pytest.approx(SLOW, rel=0.01)
    p = meas["profile"]
    assert p["rows_used"] == 20 and p["fallbacks"] == 0 and p["step_evaluations"] > 32 * 255 / 2
    assert p["sha256"] == hashlib.sha256(table.read_bytes()).hexdigest()
    assert meas["source"].startswith("measured table ") and "h100-sxm-trtllm" in meas["source"]
    assert meas["calibration"]["name"] == "h100-sxm-trtllm" and "profile" not in plain
    # 16 sequences decode at once (clients in lock-step): outside the table's batch range, the
    # calibration answers
    out = kvtune_json(*base, "--concurrency", 16, "--clients", "burst", "--profile", table)
    plain16 = kvtune_json(*base, "--concurrency", 16, "--clients", "burst")
    q = out["profile"]
    assert q["fallbacks"] > 0.9 * q["step_evaluations"] > 0
    assert f"outside ({q['fallbacks']} step evaluations)" in out["source"]
    assert out["tpot_ms"]["mean"] == pytest.approx(plain16["tpot_ms"]["mean"], rel=0.02)


def test_profile_on_goodput_and_estimate(tmp_path):
    table = slow_table(tmp_path / "slow.csv")
    g = kvtune_json("goodput", FIXED, "--engine", "trtllm", "--batch-cap", 8, "--requests", 60, "--rel-tol", 0.1,
                    "--profile", table)
    assert g["calibration"]["name"] == "h100-sxm-trtllm" and g["profile"]["step_evaluations"] > 0
    assert g["source"].startswith("measured table ")
    args = ["estimate", "--model", "llama-3.1-8b", "--engine", "trtllm", "--context", 1024, "--batch", "1,4,8,64"]
    e0, e1 = kvtune_json(*args), kvtune_json(*args, "--profile", table)
    r = [b["decode_step_ms"] / a["decode_step_ms"] for a, b in zip(e0["rows"], e1["rows"])]
    assert r[:3] == pytest.approx([SLOW] * 3, rel=1e-5) and r[3] == 1.0  # batch 64 is outside the table
    assert e1["profile"]["fallbacks"] == 1 and e1["calibration"] == e0["calibration"]
    assert e0["calibration"]["name"] == "h100-sxm-trtllm" and "profile" not in e0


def test_profile_without_matching_rows_is_one_line_error(tmp_path):
    table = slow_table(tmp_path / "slow.csv")
    code, out = kvtune("simulate", FIXED, "--concurrency", 2, "--tp", 2, "--profile", table)
    assert code == 2 and len(out.strip().splitlines()) == 1
    assert out.startswith(f"Error: measured table {table}: no step rows for model llama-3.1-8b tp 2")
    # a table of request rows only (no step rows at all) cannot answer solve's step times either
    code, out = kvtune("solve", CHAT, "--trials", 2, "--quiet", "--profile", SILICON)
    assert code == 2 and len(out.strip().splitlines()) == 1
    assert "no step rows for model llama-3.1-8b weights bf16" in out and "h100-silicon.csv" in out
    code, out = kvtune("simulate", FIXED, "--concurrency", 2, "--profile", tmp_path / "nope.csv")
    assert code == 2 and out.strip() == f"Error: --profile {tmp_path / 'nope.csv'}: no such profile table"


@pytest.mark.slow
def test_solve_with_a_profile_uses_it_where_it_matches(tmp_path):
    """The workload's profile: key; the table covers TP 1 only, so TP 2 trials get the calibration."""
    table = slow_table(tmp_path / "slow.csv")
    search = {"tp": [1, 2], "batch_cap": [4, 8], "kv_dtype": ["bf16"], "chunk_tokens": [2048, 4096], "trials": 6}
    runs = {}
    for name, extra in (("profile", {"profile": table.name}), ("plain", {})):
        wl = fixed_workload(tmp_path / f"{name}.yaml", 768, 8, engine="trtllm", search=search, **extra)
        out = tmp_path / f"{name}.json"
        code, text = kvtune("solve", wl, "--quiet", "--json", out)
        assert code == 0, text
        runs[name] = (json.loads(out.read_text()), text)
    r, text = runs["profile"]
    assert r["calibration"]["name"] == "h100-sxm-trtllm" and r["profile"]["path"].endswith("slow.csv")
    assert r["profile"]["rows_used"] == 20 and r["profile"]["step_evaluations"] > 1000
    assert r["profile"]["unmatched"] == ["tp2-wbf16-kvbf16-k0"]
    assert r["source"].startswith("measured table ") and "tp2-wbf16-kvbf16-k0 (no table rows)" in r["source"]
    assert "  profile: " in text and r["profile"]["path"] in text
    plain = runs["plain"][0]
    assert "profile" not in plain and plain["calibration"] == r["calibration"]
    assert r["recommendation"]["tp"] == plain["recommendation"]["tp"] == 1
    # the screen's single-sequence TPOT: its decode part comes from the table (1.3x), the prefill
    # it carries (768-token prompts over 8 output tokens, prefill rows as modelled, each chunk step
    # paying TRT-LLM's fitted prefill overhead) does not, so the whole moves by less than 1.3x
    ratio = r["screened"]["tpot_batch1_ms"] / plain["screened"]["tpot_batch1_ms"]
    assert 1.05 < ratio < SLOW * 1.005


def test_workload_profile_key_is_relative_to_the_yaml(tmp_path):
    slow_table(tmp_path / "slow.csv")
    wl = fixed_workload(tmp_path / "w.yaml", 1024, 64, profile="slow.csv")
    d = kvtune_json("simulate", wl, "--concurrency", 1, "--requests", 4, "--engine", "trtllm")
    assert d["profile"]["path"].endswith("slow.csv") and d["profile"]["rows_used"] == 20
    bad = fixed_workload(tmp_path / "bad.yaml", 1024, 64, profile="missing.csv")
    code, out = kvtune("simulate", bad, "--concurrency", 1)
    assert code == 2 and out.startswith(f"Error: {bad}: profile = 'missing.csv': no such profile table")


def test_workload_hardware_file(tmp_path):
    wl = fixed_workload(tmp_path / "w.yaml", 64, 16, model="smollm2-135m",
                        hardware={"gpu": str(CPU_HW), "gpus_per_node": 1, "usd_per_gpu_hour": 0.1})
    d = kvtune_json("simulate", wl, "--concurrency", 1, "--requests", 4, "--mode", "ideal")
    assert d["config"]["gpu"] == "cpu-2core" and d["calibration"] == {"name": "ideal"}
    # no shipped calibration for this machine: say so, in one line
    code, out = kvtune("simulate", wl, "--concurrency", 1)
    assert code == 2 and out.startswith("Error: no shipped calibration for gpu cpu-2core")
    bad = fixed_workload(tmp_path / "bad.yaml", 64, 16, hardware={"gpu": "mine.yaml", "usd_per_gpu_hour": 1})
    code, out = kvtune("simulate", bad, "--concurrency", 1)
    assert code == 2 and out.strip() == f"Error: {bad}: hardware.gpu = 'mine.yaml': no such hardware file ({tmp_path / 'mine.yaml'})"


# ---- the CPU loop: measure (committed table), calibrate on half, predict the other half ----------

@pytest.mark.skipif(not CPU_TABLE.exists(), reason="CPU llama.cpp table not committed")
def test_cpu_llamacpp_half_table_calibration_predicts_the_other_half_via_the_cli(tmp_path):
    # the table's own formats (q4_1 weights, fp16 KV) at their byte widths, its slots (batch_cap),
    # -b (chunk_tokens) and pool (kv_pool_tokens) as recorded
    rows = read_table(CPU_TABLE)
    train, test = rows[0::2], rows[1::2]
    half = write_table(tmp_path / "half.csv", train)
    cal = tmp_path / "cpu-half.yaml"
    code, out = kvtune("calibrate", half, "--gpu", CPU_HW, "-o", cal, "--json")
    assert code == 0, out
    meas, pred = [], {"ideal": [], "cpu-half": []}
    for r in test:
        wl = {"model": "smollm2-135m", "weights": "q4_1", "engine": "llamacpp",
              "hardware": {"gpu": str(CPU_HW), "gpus_per_node": 1, "usd_per_gpu_hour": 0.1},
              "workload": {"rate_req_s": 1, "classes": [{"input_tokens": r.input_tokens, "output_tokens": r.output_tokens}]},
              "slo": {"ttft_ms": 1e6, "tpot_ms": 1e4}}
        p = tmp_path / f"{r.id.replace(':', '_')}.yaml"
        p.write_text(yaml.safe_dump(wl))
        args = ["simulate", p, "--concurrency", r.concurrency, "--batch-cap", 4, "--chunk-tokens", 2048,
                "--kv-dtype", "fp16", "--requests", max(4 * r.concurrency, 64)]
        ideal = kvtune_json(*args, "--mode", "ideal")
        fitted = kvtune_json(*args, "--calibration", cal)
        assert fitted["config"]["gpu"] == "cpu-2core" and fitted["calibration"]["name"] == "cpu-half"
        assert fitted["calibration"]["path"] == str(cal)
        meas.append(r.tpot_mean_ms)
        pred["ideal"].append(ideal["tpot_ms"]["mean"])
        pred["cpu-half"].append(fitted["tpot_ms"]["mean"])
    e_ideal, e_cal = mape(pred["ideal"], meas), mape(pred["cpu-half"], meas)
    print(f"CPU llama.cpp held-out TPOT MAPE ({len(test)} rows) via kvtune simulate: ideal {e_ideal:.1f}%, "
          f"calibrated on the other half {e_cal:.1f}%")
    # measured: 15.5% vs 81.7% (q4_1/fp16 at their widths; 20.5% before decode attention got its own rate)
    assert e_cal < 35.0 and e_cal < e_ideal / 2
