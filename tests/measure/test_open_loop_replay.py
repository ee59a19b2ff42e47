"""Open-loop rows through validate and calibrate: the simulator replays the run's own requests.

The "measurement" here is the simulator itself under a known calibration (the shipped vLLM H100
one), recorded through the load driver's own records (``OpenLoopRun.to_rows`` and its per-request
log). Replaying it with the same calibration must give back every figure exactly; a fit started
from a wrong calibration on those rows must find the right one again.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from helpers import kvtune, kvtune_json, write_table
from kvtune.costmodel import get_gpu
from kvtune.costmodel.calibration import efficiency_for
from kvtune.costmodel.fit import RowPredictor, fit_efficiency
from kvtune.costmodel.profile_table import ProfileRow, read_table
from kvtune.costmodel.simulate import SimConfig, simulate
from kvtune.costmodel.step import StepModel
from kvtune.costmodel.models import get_model
from kvtune.costmodel.traffic import SLO, LengthDist, RequestClass, Workload
from kvtune.optimizer.importers import Metadata
from kvtune.optimizer.loadgen import OpenLoopPlan, OpenLoopRun, RequestRecord
from kvtune.optimizer.profile_run import LoadRecord, ServerInfo
from kvtune.optimizer.validate import validate_rows

GPU = get_gpu("h100-sxm")
CAP = 64


def workload() -> Workload:
    chat = RequestClass("chat", 0.7, LengthDist.uniform(200, 1500), LengthDist.uniform(50, 300), prefix_tokens=150)
    docs = RequestClass("docs", 0.3, LengthDist.uniform(2000, 6000), LengthDist.uniform(20, 120))
    return Workload(classes=(chat, docs), rate_req_s=10.0, slo=SLO(ttft_ms=400.0, tpot_ms=25.0))


def simulated_run(rate: float, eff, seed: int = 0, n: int = 160, warmup: int = 16) -> OpenLoopRun:
    """An open-loop 'measurement' made by the simulator under ``eff``, recorded as the driver records one."""
    plan = OpenLoopPlan.from_workload(workload(), rate, n, seed, warmup)
    sm = StepModel(get_model("llama-3.1-8b"), GPU, 1, "bf16", "bf16", eff)
    res = simulate(sm, plan.requests, SimConfig(batch_cap=CAP), arrival="trace", warmup_frac=0.0)
    req, warm = plan.requests, plan.is_warmup
    recs = tuple(RequestRecord(index=i, class_name=plan.class_name(i), warmup=bool(warm[i]),
                               scheduled_s=float(req.arrival_s[i]), sent_s=float(req.arrival_s[i]),
                               input_tokens=int(req.input_tokens[i]), output_tokens=int(req.output_tokens[i]),
                               prefix_tokens=int(req.prefix_tokens[i]), prefix_group=int(req.prefix_group[i]),
                               ttft_slo_ms=float(req.ttft_slo_s[i]) * 1e3, tpot_slo_ms=float(req.tpot_slo_s[i]) * 1e3,
                               ok=True, ttft_ms=float(res.ttft_s[i]) * 1e3, tpot_ms=float(res.tpot_s[i]) * 1e3,
                               e2e_ms=float(res.e2e_s[i]) * 1e3) for i in range(len(plan)))
    return OpenLoopRun(url="sim://", model="llama-3.1-8b", rate_req_s=rate, seed=seed, slo=plan.slo,
                       plan_source=plan.source, started_at="2026-12-01T00:00:00+00:00",
                       duration_s=float(res.makespan_s), requests=recs, load=LoadRecord(0.5, 0.7),
                       server=ServerInfo(engine="vllm", batch_cap=CAP))


def table(tmp_path, eff, rates=(6.0, 12.0, 18.0)) -> list[ProfileRow]:
    rows = []
    for k, rate in enumerate(rates):
        run = simulated_run(rate, eff, seed=k)
        side = f"sim.r{rate:g}.requests.csv"
        run.write_requests(tmp_path / side)
        rows += run.to_rows(Metadata(gpu="h100-sxm", model="llama-3.1-8b"), side, row_id=f"open:r{rate:g}")
    write_table(tmp_path / "sim.csv", rows)
    return read_table(tmp_path / "sim.csv")


def test_replaying_a_run_under_its_own_calibration_gives_every_figure_back(tmp_path):
    eff = efficiency_for("calibrated", "h100-sxm", None, "vllm")
    rows = table(tmp_path, eff)
    assert all(r.open_loop and r.requests_file for r in rows)
    v = validate_rows(rows, calibration="h100-sxm-vllm")
    metrics = {p.metric for p in v.points}
    assert {"ttft_ms", "tpot_ms", "ttft_p90_ms", "tpot_p50_ms"} <= metrics
    for p in v.points:
        assert p.after == pytest.approx(p.measured, rel=1e-3), (p.id, p.metric)
    assert len(v.open_loop) == 3 and not v.skipped
    atts = [c.measured_attainment for c in v.open_loop]
    assert atts[0] > atts[-1]                         # the rates bracket the knee
    for c in v.open_loop:
        assert c.predicted_attainment == pytest.approx(c.measured_attainment) and c.inside
        assert c.measured_lo <= c.measured_attainment <= c.measured_hi and c.counted == 144
    # a slower model is seen as slower on the same arrivals
    slow = eff.with_params(bw_efficiency=eff.bw_efficiency * 0.7)
    p = RowPredictor(GPU).open_loop(RowPredictor(GPU).step_model(rows[1], slow), rows[1])
    assert p["tpot_ms"] > rows[1].tpot_mean_ms * 1.1


def test_calibrate_finds_the_calibration_again_from_open_loop_rows(tmp_path):
    truth = efficiency_for("calibrated", "h100-sxm", None, "vllm")
    rows = table(tmp_path, truth, rates=(6.0, 14.0))
    wrong = truth.with_params(bw_efficiency=truth.bw_efficiency * 0.6, prefill_flops_efficiency=0.9)
    res = fit_efficiency(rows, GPU, wrong, ["bw_efficiency", "prefill_flops_efficiency"], RowPredictor(GPU),
                         max_nfev=40)
    assert res.efficiency.bw_efficiency == pytest.approx(truth.bw_efficiency, rel=0.03)
    assert res.efficiency.prefill_flops_efficiency == pytest.approx(truth.prefill_flops_efficiency, rel=0.1)
    assert res.mape(True, "tpot_ms") < 1.0 < res.mape(False, "tpot_ms")
    # the percentiles are reported, not fitted (the default objective is the means)
    assert {p.metric for p in res.points} >= {"ttft_p90_ms", "tpot_p90_ms"}


def test_validate_cli_prints_the_open_loop_check_and_a_missing_log_is_named(tmp_path):
    eff = efficiency_for("calibrated", "h100-sxm", None, "vllm")
    rows = table(tmp_path, eff, rates=(8.0,))
    code, out = kvtune("validate", tmp_path / "sim.csv", "--calibration", "h100-sxm-vllm")
    assert code == 0, out
    assert "open-loop rows (1)" in out and "open:r8" in out
    d = kvtune_json("validate", tmp_path / "sim.csv", "--calibration", "h100-sxm-vllm")
    ol = d["open_loop"][0]
    assert ol["attainment"]["inside"] and ol["attainment"]["interval"] == "batch-wilson"
    assert ol["loadavg_1m"] == pytest.approx(0.6)
    (tmp_path / rows[0].requests_file).unlink()
    code, out = kvtune("validate", tmp_path / "sim.csv", "--calibration", "h100-sxm-vllm")
    assert code == 2 and "per-request log" in out and "missing" in out


def test_an_open_loop_row_without_a_log_is_simulated_at_its_rate():
    eff = efficiency_for("calibrated", "h100-sxm", None, "vllm")
    row = ProfileRow(id="x", kind="request", gpu="h100-sxm", model="llama-3.1-8b", rate_req_s=5.0, input_tokens=1000,
                     output_tokens=200, ttft_mean_ms=50.0, tpot_mean_ms=8.0, num_requests=300, slo_ttft_ms=200.0,
                     slo_tpot_ms=20.0)
    pred = RowPredictor(GPU)
    p1 = pred.open_loop(pred.step_model(row, eff), row)
    p2 = pred.open_loop(pred.step_model(row, eff), dataclasses.replace(row, rate_req_s=20.0))
    assert 0 < p1["ttft_ms"] < p2["ttft_ms"] and p1["tpot_ms"] < p2["tpot_ms"]
    assert p1["attainment"] >= p2["attainment"] and math.isfinite(p1["ttft_p90_ms"])
    assert np.isfinite([p1[k] for k in ("tpot_p50_ms", "tpot_p90_ms", "output_tok_s")]).all()
