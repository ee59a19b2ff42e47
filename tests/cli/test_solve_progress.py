"""kvtune solve's progress line covers the whole solve: the screen's trials, then the simulator
race (most of the wall time) stage by stage, then the disaggregated search; silent when quiet."""

import io
import time

from kvtune.optimizer.cli.solve import _Progress
from kvtune.optimizer.recommend import solve
from kvtune.optimizer.workload import load_workload_dict

TINY = {"model": "llama-3.1-8b", "hardware": {"gpu": "h100-sxm", "usd_per_gpu_hour": 3.0},
        "workload": {"rate_req_s": 5, "classes": [{"name": "c", "share": 1.0, "input_tokens": 512,
                                                   "output_tokens": 64}]},
        "slo": {"ttft_ms": 1000, "tpot_ms": 50},
        "search": {"tp": [1], "batch_cap": [8, 64], "kv_dtype": ["bf16"], "chunk_tokens": [2048, 2048],
                   "trials": 2}}


def _lines(text: str) -> list[str]:
    return [ln.strip() for ln in text.replace("\r", "\n").splitlines() if ln.strip()]


def test_the_race_reports_its_stages_to_the_solve_caller():
    stages: list[tuple[str, int]] = []
    trials: list[tuple[int, int]] = []
    r = solve(load_workload_dict(TINY, "<test>"), on_trial=lambda d, t: trials.append((d, t)),
              on_stage=lambda name, n: stages.append((name, n)))
    assert r.status == "ok"
    assert trials[-1] == (2, 2)
    names = [s for s, _ in stages]
    assert names[0] == "zero load" and "race" in names, stages


def test_the_line_shows_trials_then_each_race_stage_then_the_next_phase():
    buf = io.StringIO()
    p = _Progress(True, buf)
    p.start("h200")
    for i in range(1, 4):
        p(i, 3)
    p.stage("zero load", 36)
    p.stage("race", 16)
    p.stage("race", 16)
    p.phase("disaggregated search: prefill and decode pools, simulated")
    p.close()
    lines = _lines(buf.getvalue())
    assert lines[0].startswith("h200: trials")
    assert any(ln.startswith("h200: trials [") and "2/3" in ln for ln in lines)
    assert any("simulator race: zero load, 36 groups" in ln for ln in lines)
    assert any("simulator race: 32 configs raced so far" in ln for ln in lines)
    assert lines[-1].startswith("disaggregated search") and lines[-1].endswith(" s")
    assert buf.getvalue().endswith("\n")


def test_a_long_stage_is_redrawn_with_its_seconds():
    buf = io.StringIO()
    p = _Progress(True, buf)
    p.TICK_S = 0.05
    p.stage("zero load", 4)
    time.sleep(0.3)
    p.close()
    assert sum("zero load, 4 groups" in ln for ln in _lines(buf.getvalue())) >= 3


def test_quiet_writes_nothing():
    buf = io.StringIO()
    p = _Progress(False, buf)
    p.start()
    p(1, 1)
    p.stage("race", 16)
    p.phase("report")
    p.close()
    assert buf.getvalue() == ""
