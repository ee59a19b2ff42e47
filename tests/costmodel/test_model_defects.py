"""The two model defects of issue 21, pinned.

1. Decode cost per cached token. On llama.cpp's CPU server (the committed table, one client) TPOT
   rises 16.7 -> 24.3 -> 43.7 ms from 96 to 288 to 1056 tokens of context, 28 ms per 1000 tokens;
   the step model, with attention at the decode GEMM rate, rose 5 ms per 1000, so a prediction
   was one TPOT for every prompt length. ``decode_attn_efficiency`` (attention's rate against
   the GEMMs', 1 = the old model) carries it, fitted where the rows reject 1.
2. The screen at cap 1 charged prompts to a sequence no prompt can join (see test_search's hand
   case): the screen now agrees with the simulator there.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kvtune.costmodel import get_gpu
from kvtune.costmodel.calibration import efficiency_for
from kvtune.costmodel.efficiency import IDEAL, PARAM_BOUNDS
from kvtune.costmodel.fit import FitResult
from kvtune.costmodel.hardware import resolve_gpu
from kvtune.costmodel.models import get_model
from kvtune.costmodel.requests import Requests
from kvtune.costmodel.simulate import SimConfig, simulate
from kvtune.costmodel.step import StepModel
from kvtune.optimizer.calibrate import _separated, calibrate, load_tables
from kvtune.optimizer.screen import WorkloadStats, screen

ROOT = Path(__file__).parent.resolve().parents[1]
CPU_TABLE = ROOT / "profiles" / "tables" / "smollm2-135m-cpu-llamacpp.csv"
CPU_HW = ROOT / "profiles" / "hardware-cpu-example.yaml"


def cpu_step(**eff) -> StepModel:
    e = IDEAL.with_params(model_comm=True, decode_flops_efficiency=0.2, prefill_flops_efficiency=0.3, **eff)
    return StepModel(get_model("smollm2-135m"), resolve_gpu(str(CPU_HW)), 1, "q4_1", "fp16", e)


def test_decode_attention_rate_is_neutral_at_one_and_scales_the_context_slope():
    base, slow = cpu_step(), cpu_step(decode_attn_efficiency=0.25)
    h100 = efficiency_for("calibrated", "h100-sxm", None, "vllm")
    assert h100.decode_attn_efficiency == 1.0          # shipped files without the key: the model as it was
    for b in (1, 4):
        t0, t1 = base.decode_step(b, 100).time_s, base.decode_step(b, 1100).time_s
        s0, s1 = slow.decode_step(b, 100).time_s, slow.decode_step(b, 1100).time_s
        # compute bound on this CPU: the per-context-token cost is the attention's, 4x at a quarter the rate
        assert (s1 - s0) == pytest.approx(4 * (t1 - t0), rel=1e-6)
        assert s0 > t0
    # prefill attention keeps the prefill rate
    assert slow.prefill_time_s(512) == pytest.approx(base.prefill_time_s(512), rel=1e-12)
    # and the closed-form clock's coefficients carry it
    c0, c1 = slow.plain_decode_compute_coeffs(1)
    b0, b1 = base.plain_decode_compute_coeffs(1)
    assert c0 == pytest.approx(b0) and c1 == pytest.approx(4 * b1)
    lo, hi = PARAM_BOUNDS["decode_attn_efficiency"]
    assert lo < 0.155 < 1.0 < hi


def _fit(value, sigma, corr=0.0) -> FitResult:
    eff = IDEAL.with_params(decode_attn_efficiency=value)
    return FitResult(eff, ("decode_flops_efficiency", "decode_attn_efficiency"),
                     {"decode_attn_efficiency": sigma, "decode_flops_efficiency": 0.01}, (),
                     correlation={"decode_attn_efficiency": {"decode_flops_efficiency": corr}})


def test_attention_is_kept_only_where_the_rows_reject_the_neutral_value():
    assert _separated(_fit(0.155, 0.085, -0.78), "decode_attn_efficiency")     # the CPU table: 10 sigma from 1
    assert not _separated(_fit(0.8, 0.15), "decode_attn_efficiency")            # 1.3 sigma: not rejected
    assert not _separated(_fit(0.155, 0.01, -0.95), "decode_attn_efficiency")   # tied to the GEMM rate
    assert not _separated(_fit(PARAM_BOUNDS["decode_attn_efficiency"][0], 0.001), "decode_attn_efficiency")


def test_screen_at_cap_one_agrees_with_the_simulator():
    """One slot: TPOT is the decode step alone in the screen and in the simulator, whatever the
    prompt; a larger cap lets prompts join, and the screen charges them."""
    sm = StepModel(get_model("llama-3.1-8b"), get_gpu("h100-sxm"), 1, "bf16", "bf16",
                   efficiency_for("calibrated", "h100-sxm", None, "vllm"))
    req = Requests.uniform(200, 2000, 64, ttft_slo_s=60.0, tpot_slo_s=1.0,
                           arrival_s=np.arange(200) * 0.5)
    w = WorkloadStats.from_requests(req, 0.9)
    res = simulate(sm, req, SimConfig(batch_cap=1), arrival="trace")
    sim_tpot = float(np.mean(np.asarray(res.tpot_s)[np.asarray(res.measured)])) * 1e3
    s1 = screen(sm, w, 1, 8192)
    assert s1.tpot_batch1_ms == pytest.approx(sim_tpot, rel=0.02)
    assert screen(sm, w, 8, 8192).tpot_batch1_ms > 1.1 * s1.tpot_batch1_ms   # 5.9 vs 5.2 ms: a 2000-token prompt rides along


@pytest.mark.slow
def test_cpu_table_fit_keeps_decode_attention_and_follows_the_context_slope():
    rows, _ = load_tables([CPU_TABLE])
    gpu = resolve_gpu(str(CPU_HW))
    res = calibrate(rows, gpu, IDEAL.with_params(model_comm=True, name="ideal"))
    assert "decode_attn_efficiency" in res.fitted
    assert 0.05 < res.efficiency.decode_attn_efficiency < 0.4      # measured: 0.155 +- 0.085
    tpot = {p.id: (p.measured, p.after) for p in res.points if p.metric == "tpot_ms"}
    ids = ["run:c1-i64-o64", "run:c1-i256-o64", "run:c1-i1024-o64"]
    meas_slope = tpot[ids[2]][0] - tpot[ids[0]][0]
    pred_slope = tpot[ids[2]][1] - tpot[ids[0]][1]
    assert pred_slope == pytest.approx(meas_slope, rel=0.25)   # 25.5 ms predicted vs 27.0 measured (5.0 before)
    assert res.mape(True, "tpot_ms") < 16.0                     # 14.0% (18.8% without the term)
