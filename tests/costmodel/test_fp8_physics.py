"""FP8 as its own physics: FP8 GEMM and FP8 KV read terms separate from bf16, fitted on FP8 rows."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from kvtune.costmodel import get_gpu, get_model
from kvtune.costmodel.calibration import load_calibration
from kvtune.costmodel.efficiency import FP8_PARAMS, Efficiency
from kvtune.costmodel.fit import RowPredictor
from kvtune.costmodel.profile_table import ProfileRow
from kvtune.costmodel.step import StepModel
from kvtune.optimizer.calibrate import fit_fp8_terms

ROOT = Path(__file__).parent.resolve().parents[1]
GPU = get_gpu("h100-sxm")
M = get_model("llama-3.1-8b")
BASE = Efficiency(bw_efficiency=0.8, decode_flops_efficiency=0.4, prefill_flops_efficiency=0.6,
                  step_overhead_s=1e-3, model_comm=True, name="base")


def test_neutral_fp8_terms_change_nothing():
    for w, kv in (("bf16", "bf16"), ("fp8", "fp8"), ("fp8", "bf16")):
        a = StepModel(M, GPU, 1, w, kv, BASE)
        b = StepModel(M, GPU, 1, w, kv, BASE.with_params(fp8_gemm_efficiency=1.0, fp8_kv_bw_efficiency=1.0))
        assert a.prefill_time_s(4096) == b.prefill_time_s(4096) and a.decode_step(64, 4096).time_s == b.decode_step(64, 4096).time_s


def test_fp8_gemm_term_moves_fp8_prefill_only():
    slow = BASE.with_params(fp8_gemm_efficiency=0.5)
    # a compute-bound 8k prefill with FP8 weights: GEMM time doubles, attention (bf16 rate) does not
    f0, f1 = (StepModel(M, GPU, 1, "fp8", "fp8", e).breakdown(0, 0, 8192, StepModel.chunk_pairs(8192, 0)) for e in (BASE, slow))
    assert 1.3 < f1.compute_s / f0.compute_s < 2.0
    b0, b1 = (StepModel(M, GPU, 1, "bf16", "bf16", e).prefill_time_s(8192) for e in (BASE, slow))
    assert b0 == b1


def test_fp8_kv_term_moves_fp8_kv_reads_only():
    slow = BASE.with_params(fp8_kv_bw_efficiency=0.5)
    d0, d1 = (StepModel(M, GPU, 1, "bf16", "fp8", e).decode_step(256, 8192) for e in (BASE, slow))
    assert d1.mem_s > 1.5 * d0.mem_s and d1.bytes_per_gpu == d0.bytes_per_gpu  # same bytes, read slower
    assert (StepModel(M, GPU, 1, "bf16", "bf16", slow).decode_step(256, 8192).time_s
            == StepModel(M, GPU, 1, "bf16", "bf16", BASE).decode_step(256, 8192).time_s)


def test_fp8_stage_recovers_a_known_gemm_efficiency_and_reports_what_it_cannot_separate():
    truth = BASE.with_params(fp8_gemm_efficiency=0.7)
    rows = []
    for tp in (1, 2):
        sm = StepModel(M, GPU, tp, "fp8", "fp8", truth)
        for ch in (1024, 4096, 8192):
            rows.append(ProfileRow(id=f"p{tp}-{ch}", kind="step", gpu="h100-sxm", model="llama-3.1-8b", tp=tp,
                                   weight_dtype="fp8", kv_dtype="fp8", phase="prefill", batch=1, context_tokens=0,
                                   chunk_tokens=ch, step_ms=sm.step_time_s(0, 0, ch, StepModel.chunk_pairs(ch, 0), 0) * 1e3))
    eff, unc, rep = fit_fp8_terms(rows, GPU, BASE, RowPredictor(GPU), None)
    assert eff.fp8_gemm_efficiency == pytest.approx(0.7, rel=0.02)
    assert rep["separated"]["fp8_gemm_efficiency"] and not rep["separated"]["fp8_kv_bw_efficiency"]
    assert any("fp8_kv_bw_efficiency" in n for n in rep["notes"])  # prefill steps from scratch read no KV
    assert eff.fp8_kv_bw_efficiency == 1.0 and unc["fp8_kv_bw_efficiency"] == 0.0


def test_no_fp8_rows_keep_the_terms_neutral_and_say_so():
    eff, unc, rep = fit_fp8_terms([], GPU, BASE, RowPredictor(GPU), None)
    assert eff == BASE and rep["rows"] == 0 and "no FP8 rows" in rep["notes"][0]


@pytest.mark.parametrize("name", ["h100-sxm", "h100-sxm-trtllm", "h100-sxm-vllm", "h100-sxm-sglang"])
def test_shipped_calibrations_record_the_fp8_stage(name):
    p = ROOT / "profiles" / "calibrations" / f"{name}.yaml"
    d = yaml.safe_load(p.read_text())
    fp8 = d["fit"]["fp8"]
    assert set(fp8["separated"]) == set(FP8_PARAMS)
    eff = load_calibration(p)
    for k in FP8_PARAMS:
        if not fp8["separated"][k]:
            # a term the data cannot separate keeps its bf16 equivalent, and the file says why
            assert getattr(eff, k) == (0.0 if k.endswith("_s") else 1.0)
            assert any(k in n for n in fp8["notes"]) or fp8["rows"] == 0
