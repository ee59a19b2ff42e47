"""Opt-in: ``kvtune tune``'s engine path on the real llama.cpp ``llama-server`` (slow; runs when the
binary is cached, see bench/live_server.py, or KVTUNE_LIVE=1 demands it)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from live_server import find_model, find_server  # noqa: E402

from helpers import kvtune  # noqa: E402

CACHE = Path(os.environ.get("KVTUNE_LLAMA_CACHE", "/work/cache/llama"))
BINARY = find_server(None, CACHE) or find_server(None, Path.home() / ".cache" / "kvtune" / "llama")
MODEL = find_model(None)
if not (BINARY and MODEL):
    reason = "no llama-server binary or GGUF model cached (bench/live_server.py builds it)"
    if os.environ.get("KVTUNE_LIVE") == "1":
        pytest.fail(f"KVTUNE_LIVE=1: {reason}", pytrace=False)
    pytest.skip(reason, allow_module_level=True)

pytestmark = pytest.mark.slow


def test_llama_server_from_kvtunes_line_reads_back_as_planned(tmp_path):
    from kvtune.costmodel.hardware import resolve_gpu
    from kvtune.costmodel.models import get_model
    from kvtune.optimizer.adapters import LocalAdapter
    from kvtune.optimizer.launch.pick import build_pick
    from kvtune.optimizer.loadgen import OpenLoopPlan, run_open_loop
    from kvtune.optimizer.workload import load_workload

    spec = load_workload(ROOT / "bench" / "tune_demo.yaml")
    cfg = {"tp": 1, "batch_cap": 2, "kv_dtype": "fp16", "spec_k": 0, "chunk_tokens": 256}
    pick = build_pick("smollm2-135m", cfg, 1, spec.gpu_mem_util, None, arch=get_model("smollm2-135m"),
                      gpu=resolve_gpu(spec.hardware.gpu, spec.hardware.gpu_file), weights="q4_1", gpus_per_node=1, max_request_tokens=96)
    ad = LocalAdapter("llamacpp", binary=str(BINARY), model=str(MODEL), threads=1, log_dir=tmp_path)
    with ad.running(pick) as eng:
        r = eng.report
        assert (r.slots, r.pool_tokens, r.threads) == (2, 256, 1), r   # -c = 2 x 96 padded to 256
        run = run_open_loop(eng.url, eng.served_model, OpenLoopPlan.from_workload(spec, 0.5, 6, 0, 1), timeout_s=120)
        assert run.complete and not run.failures
    assert eng.process.returncode() is not None


def test_a_short_tune_on_llama_server_writes_its_result(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out = kvtune("tune", ROOT / "bench" / "tune_demo.yaml", "--engine-bin", BINARY, "--model-file", MODEL,
                       "--threads", "1", "--calibration", "ideal", "--no-grid", "--near", "0", "--rates", "1.0",
                       "--max-rounds", "1", "--run-s", "10", "--min-requests", "8", "--warmup", "1", "-o", "out")
    assert code in (0, 1), out
    res = json.loads((tmp_path / "out" / "tune.json").read_text())
    assert res["jobs"][0]["engine"]["threads"] == 1 and "-t 1" in res["launch_line"]
    assert res["jobs"][0]["runs"][0]["kind"] == "probe" and res["runs"] == 3
