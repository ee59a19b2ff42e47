"""MeasuredStepModel: measured step times inside the table's range, the base model outside."""

from __future__ import annotations

import numpy as np
import pytest

from kvtune.costmodel import IDEAL, ProfileDataMissing, StepModel, get_gpu, get_model
from kvtune.costmodel.measured import MeasuredStepModel
from kvtune.costmodel.profile_table import ProfileRow

BASE = StepModel(get_model("llama-3.1-8b"), get_gpu("h100-sxm"), 1, efficiency=IDEAL)
BATCHES, CTXS, CHUNKS = (1, 8, 64), (256, 2048), (128, 1024, 4096)


def dec_ms(b, c):  # an arbitrary smooth "measurement", unlike the model's own numbers
    return 6.0 + 0.05 * b + 0.001 * c


def rows():
    out = [ProfileRow(id=f"d{b}-{c}", kind="step", model="llama-3.1-8b", phase="decode", batch=b,
                      context_tokens=c, step_ms=dec_ms(b, c)) for b in BATCHES for c in CTXS]
    out += [ProfileRow(id=f"p{c}", kind="step", model="llama-3.1-8b", phase="prefill", batch=1, context_tokens=0,
                       chunk_tokens=c, step_ms=0.02 * c) for c in CHUNKS]
    return out


def test_exact_at_grid_points():
    m = MeasuredStepModel(BASE, rows(), "t.csv", "ab" * 32)
    for b in BATCHES:
        for c in CTXS:
            assert m.decode_step(b, c).time_s == pytest.approx(dec_ms(b, c) * 1e-3, rel=1e-12)
    for c in CHUNKS:
        assert m.prefill_time_s(c) == pytest.approx(0.02 * c * 1e-3, rel=1e-12)
    assert m.fallbacks == 0


def test_between_grid_points_lies_between_neighbours():
    m = MeasuredStepModel(BASE, rows())
    t = m.decode_step(20, 1000).time_s * 1e3
    assert dec_ms(8, 256) < t < dec_ms(64, 2048)
    # log-axis linear in chunk: halfway in log between 128 and 1024 is 362
    assert m.prefill_time_s(362) * 1e3 == pytest.approx(np.interp(np.log(362), np.log([128, 1024]), [2.56, 20.48]), rel=1e-9)


def test_falls_back_outside_the_range_and_counts_it():
    m = MeasuredStepModel(BASE, rows(), "t.csv", "cd" * 32)
    assert m.decode_step(256, 1024).time_s == BASE.decode_step(256, 1024).time_s
    assert m.decode_step(8, 8192).time_s == BASE.decode_step(8, 8192).time_s
    assert m.prefill_time_s(16000, chunk_tokens=16000) == BASE.prefill_time_s(16000, chunk_tokens=16000)
    assert m.fallbacks == 3 and m.calls == 3
    assert "measured table t.csv (sha256 cdcdcdcdcdcd)" in m.source and "3 of 3" in m.source
    assert IDEAL.source in m.source


def test_mixed_step_adds_measured_corrections():
    m = MeasuredStepModel(BASE, rows())
    pairs = StepModel.chunk_pairs(1024, 0)
    mixed = m.step_time_s(8, 8 * 2048, 1024, pairs, 0)
    base_mixed = BASE.step_time_s(8, 8 * 2048, 1024, pairs, 0)
    expect = (base_mixed + (dec_ms(8, 2048) * 1e-3 - BASE.decode_step(8, 2048).time_s)
              + (20.48e-3 - BASE.prefill_time_s(1024)))
    assert mixed == pytest.approx(expect, rel=1e-12)


def test_same_interface_as_step_model():
    m = MeasuredStepModel(BASE, rows())
    assert m.memory is BASE.memory and m.tokens_per_step == 1.0 and m.speculation is None and m.tp == 1
    b = m.breakdown(8, 8 * 256)
    assert b.time_s == pytest.approx(dec_ms(8, 256) * 1e-3) and b.bytes_per_gpu == BASE.breakdown(8, 8 * 256).bytes_per_gpu


def test_simulator_runs_on_it():
    sim = pytest.importorskip("kvtune.costmodel.simulate")
    from kvtune.costmodel.requests import Requests

    m = MeasuredStepModel(BASE, rows())
    res = sim.simulate(m, Requests.uniform(16, 1024, 16), sim.SimConfig(batch_cap=8), arrival="closed", concurrency=8)
    # every decode step of 8 sequences at ~1-1.1k context comes from the table (6.4-7.5 ms)
    assert 6.0 < float(np.nanmean(res.tpot_s)) * 1e3 < 30.0


def test_simulator_times_every_decode_step_from_the_table():
    """All 8 requests prefill in one step, then 15 decode steps of 8 sequences at context
    1024..1038: TPOT is the mean of those measured (interpolated) step times, not the base model's."""
    from kvtune.costmodel.requests import Requests
    from kvtune.costmodel.simulate import SimConfig, simulate

    m = MeasuredStepModel(BASE, rows())
    res = simulate(m, Requests.uniform(8, 1024, 16), SimConfig(batch_cap=8, chunk_tokens=8192), arrival="inf")
    want = np.mean([m.decode_step(8, 1024 + j).time_s for j in range(15)])
    base = np.mean([BASE.decode_step(8, 1024 + j).time_s for j in range(15)])
    np.testing.assert_allclose(res.tpot_s, want, rtol=1e-9)
    assert abs(want / base - 1) > 0.2  # the table and the ideal model disagree: the test can tell them apart
    assert m.fallbacks == 1  # only the prefill of 8 x 1024 tokens (chunk 8192 > the table's 4096)


def test_no_matching_rows():
    with pytest.raises(ProfileDataMissing, match="no step rows for model llama-3.1-8b tp 2"):
        MeasuredStepModel(StepModel(get_model("llama-3.1-8b"), get_gpu("h100-sxm"), 2), rows())
