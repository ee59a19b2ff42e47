"""Goodput search: bracketing and bisection over the Poisson rate, with common random numbers."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kvtune.costmodel import StepModel, efficiency_for, get_gpu, get_model
from kvtune.costmodel.errors import InputError
from kvtune.costmodel.goodput import capacity_bound_req_s, default_n_requests, goodput
from kvtune.costmodel.requests import Requests
from kvtune.costmodel.simulate import SimConfig, simulate

H100 = get_gpu("h100-sxm")
CAL = efficiency_for("calibrated", "h100-sxm")


def _maker(inp=(500, 1500), out=(100, 300), ttft_s=2.0, tpot_s=0.05):
    def make(rate: float, n: int, seed: int) -> Requests:
        rng = np.random.default_rng(seed)
        gaps = rng.exponential(1.0, n)  # drawn at rate 1 and scaled: common random numbers
        arr = np.zeros(n) if math.isinf(rate) else np.concatenate(([0.0], np.cumsum(gaps[1:]))) / rate
        return Requests(arrival_s=arr, input_tokens=rng.integers(inp[0], inp[1] + 1, n),
                        output_tokens=rng.integers(out[0], out[1] + 1, n), prefix_tokens=np.zeros(n, dtype=np.int64),
                        prefix_group=np.full(n, -1, dtype=np.int64), ttft_slo_s=np.full(n, ttft_s),
                        tpot_slo_s=np.full(n, tpot_s), class_idx=np.zeros(n, dtype=np.int64))
    return make


def _step(kv="bf16", util=0.9, model="llama-3.1-8b", tp=1) -> StepModel:
    return StepModel(get_model(model), H100, tp, kv_dtype=kv, efficiency=CAL, gpu_mem_util=util)


def test_goodput_brackets_the_attainment_crossing():
    s, make, cfg = _step(), _maker(), SimConfig(64)
    r = goodput(s, make, cfg, attainment=0.9, n_requests=600, rel_tol=0.03)
    assert r.goodput_req_s > 0 and r.reason == ""
    lo, hi = r.bracket
    assert lo == r.goodput_req_s and hi > lo and (hi - lo) <= 0.03 * lo
    assert r.attainment >= 0.9
    # re-simulating at both ends reproduces the verdicts (same seed: common random numbers)
    assert simulate(s, make(lo, 600, 0), cfg).slo_attainment >= 0.9
    assert simulate(s, make(hi, 600, 0), cfg).slo_attainment < 0.9
    assert r.goodput_req_s <= r.upper_bound_req_s
    assert r.iterations == len(r.history) <= 40
    for key in ("ttft_ms", "tpot_ms", "slo_attainment"):
        assert key in r.summary


def test_goodput_is_deterministic():
    s, make, cfg = _step(), _maker(), SimConfig(32)
    a = goodput(s, make, cfg, 0.9, n_requests=400)
    b = goodput(s, make, cfg, 0.9, n_requests=400)
    assert a.goodput_req_s == b.goodput_req_s and a.history == b.history


def test_goodput_zero_with_reason_when_prefill_alone_misses_ttft():
    s = _step()
    make = _maker(inp=(30000, 32000), ttft_s=0.2)  # a 30k-token prefill takes longer than 200 ms
    r = goodput(s, make, SimConfig(32), 0.9, n_requests=300)
    assert r.goodput_req_s == 0.0
    assert "TTFT at zero load" in r.reason and "TPOT" not in r.reason
    make2 = _maker(tpot_s=0.001)  # no decode step is 1 ms on this model
    r2 = goodput(s, make2, SimConfig(32), 0.9, n_requests=300)
    assert r2.goodput_req_s == 0.0 and "TPOT at zero load" in r2.reason


def test_fp8_kv_raises_goodput_when_the_pool_binds():
    # long contexts, a big batch cap and a pool of a few tens of thousands of tokens: the pool binds
    make = _maker(inp=(6000, 8000), out=(200, 400), ttft_s=8.0, tpot_s=0.06)
    cfg = SimConfig(512)
    bf16, fp8 = _step("bf16", util=0.3), _step("fp8", util=0.3)
    assert fp8.memory.kv_pool_tokens == pytest.approx(2 * bf16.memory.kv_pool_tokens, rel=0.01)
    g16 = goodput(bf16, make, cfg, 0.9, n_requests=500, rel_tol=0.05)
    g8 = goodput(fp8, make, cfg, 0.9, n_requests=500, rel_tol=0.05)
    assert g8.goodput_req_s > 1.3 * g16.goodput_req_s


def test_default_n_requests_puts_100_in_the_tail():
    assert default_n_requests(0.9) == 1112           # 100 / (0.1 x 0.9)
    assert default_n_requests(0.99) == 11112
    assert default_n_requests(0.5) == 1000           # floor
    assert default_n_requests(1.0) == 20000          # cap
    for a in (0.8, 0.9, 0.95, 0.99):
        n = default_n_requests(a)
        assert (1 - a) * math.floor(n * 0.9) >= 100 - 1e-9 or n == 20000
    with pytest.raises(InputError):
        default_n_requests(0.0)


def test_capacity_bound_is_above_simulated_throughput():
    s, make = _step(), _maker()
    ub = capacity_bound_req_s(s, 1000.0, 200.0, 64)
    sat = simulate(s, make(math.inf, 800, 0), SimConfig(64), arrival="inf").request_s
    assert sat <= ub


def test_goodput_rejects_bad_arguments():
    s, make = _step(), _maker()
    with pytest.raises(InputError):
        goodput(s, make, SimConfig(8), attainment=1.5)
    with pytest.raises(InputError):
        goodput(s, make, SimConfig(8), attainment=0.9, rel_tol=0.0)


def test_cli_goodput(tmp_path):
    import json

    from click.testing import CliRunner

    from kvtune.optimizer.cli import main

    wl = tmp_path / "wl.yaml"
    wl.write_text("""
model: llama-3.1-8b
hardware: {gpu: h100-sxm, usd_per_gpu_hour: 3.0}
workload:
  rate_req_s: 10
  classes:
    - {name: chat, share: 1.0, input_tokens: {dist: uniform, min: 500, max: 1500}, output_tokens: 150}
slo: {ttft_ms: 1000, tpot_ms: 40, attainment: 0.9}
""")
    run = CliRunner().invoke
    res = run(main, ["goodput", str(wl), "--batch-cap", "64", "--requests", "400", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["goodput_req_s"] > 0 and out["attainment"] >= 0.9
    for key in ("ttft_ms", "tpot_ms", "e2e_ms", "config", "source", "bracket_req_s"):
        assert key in out
    two = json.loads(run(main, ["goodput", str(wl), "--batch-cap", "64", "--requests", "400", "--replicas", "2",
                                "--json"]).output)
    assert two["goodput_req_s"] == pytest.approx(2 * out["goodput_req_s"])
    human = run(main, ["goodput", str(wl), "--batch-cap", "64", "--requests", "400"])
    assert human.exit_code == 0 and "goodput" in human.output
    bad = run(main, ["goodput", str(wl), "--attainment", "2"])
    assert bad.exit_code == 2 and "Error:" in bad.output
