"""The llama.cpp loop: the committed CPU table calibrates at its own formats, and `solve` for a
llama.cpp target searches caps below 8, fp16 KV only on a CPU, and launches llama.cpp."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from kvtune.optimizer.workload import load_workload_dict

from helpers import kvtune

ROOT = Path(__file__).parent.resolve().parents[1]
CPU_TABLE = ROOT / "profiles" / "tables" / "smollm2-135m-cpu-llamacpp.csv"
CPU_HW = ROOT / "profiles" / "hardware-cpu-example.yaml"


def cpu_workload(tmp_path: Path, cal: Path, **search) -> Path:
    wl = {"model": "smollm2-135m", "weights": "q4_1", "engine": "llamacpp", "calibration": str(cal),
          "hardware": {"gpu": str(CPU_HW), "gpus_per_node": 1, "usd_per_gpu_hour": 0.05, "max_nodes": 1},
          "workload": {"rate_req_s": 0.05, "classes": [{"name": "chat", "share": 1.0, "input_tokens": 256,
                                                         "output_tokens": 64}]},
          "slo": {"ttft_ms": 20000, "tpot_ms": 100, "attainment": 0.9},
          "search": {"chunk_tokens": [512, 2048], "trials": 12, **search}}
    p = tmp_path / "cpu.yaml"
    p.write_text(yaml.safe_dump(wl))
    return p


def test_llamacpp_search_defaults_start_below_8_without_fp8_on_a_cpu():
    base = {"model": "smollm2-135m", "weights": "q4_1", "hardware": {"gpu": str(CPU_HW), "usd_per_gpu_hour": 0.05},
            "workload": {"rate_req_s": 1, "classes": [{"input_tokens": 64, "output_tokens": 8}]},
            "slo": {"ttft_ms": 1000, "tpot_ms": 100}}
    s = load_workload_dict({**base, "engine": "llamacpp"}).search
    assert s.batch_cap[0] == 1 and s.kv_dtype == ("fp16",)
    h100 = load_workload_dict({**base, "weights": "bf16", "hardware": {"gpu": "h100-sxm", "usd_per_gpu_hour": 3}}).search
    assert h100.batch_cap[0] == 8 and h100.kv_dtype == ("bf16", "fp8")  # other targets as before


@pytest.mark.slow
def test_solve_for_a_llamacpp_cpu_target_picks_a_small_cap_and_launches_llamacpp(tmp_path):
    cal = tmp_path / "cpu-2core.yaml"
    code, out = kvtune("calibrate", CPU_TABLE, "--gpu", CPU_HW, "-o", cal)
    assert code == 0, out
    res = tmp_path / "r.json"
    code, out = kvtune("solve", cpu_workload(tmp_path, cal, batch_cap=[1, 16]), "--quiet", "--json", res)
    assert code == 0, out
    r = json.loads(res.read_text())
    rec = r["recommendation"]
    assert rec["batch_cap"] < 8 and rec["kv_dtype"] == "fp16" and r["engine"] == "llamacpp"
    assert "Launch (llama.cpp llama-server):" in out and "vllm serve" not in out
