"""Goodput search: bracketing and bisection over the Poisson rate, with common random numbers."""

from __future__ import annotations

import math
import numpy as np
import pytest
from kvtune.costmodel import StepModel, efficiency_for, get_gpu, get_model
from kvtune.costmodel.errors import InputError
from kvtune.costmodel.goodput import capacity_bound_req_s, default_n_requests, goodput, _logit, completion_rate_req_s
from kvtune.costmodel.requests import Requests
from kvtune.costmodel.simulate import SimConfig, simulate, build_result

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


# The goodput search (costmodel.goodput) on simulators whose answer is known by construction: an
# attainment curve that drops at a chosen rate, a saturated throughput chosen below or above the
# analytic bound, requests that can never be served. The search must find the drop within its
# tolerance, never report a capacity-limited goodput above the simulated saturated throughput, and
# say why when the answer is 0. Written against the mutants of costmodel/goodput.py the older tests
# let through (bench/bench_mutation.py, bench/RESULTS-mutation.md).

STEP = StepModel(get_model("llama-3.1-8b"), get_gpu("h100-sxm"), 1)
CONFIG = SimConfig(batch_cap=64)
N = 300
TTFT_SLO_S = 1.0


def make_requests(rate: float, n: int, seed: int) -> Requests:
    """n one-token requests, evenly spaced at ``rate`` (all at t=0 when rate is inf)."""
    arr = np.zeros(n) if math.isinf(rate) else np.arange(n) / rate
    return Requests(arrival_s=arr, input_tokens=np.full(n, 100), output_tokens=np.ones(n, dtype=np.int64),
                    prefix_tokens=np.zeros(n, dtype=np.int64), prefix_group=np.full(n, -1),
                    ttft_slo_s=np.full(n, TTFT_SLO_S), tpot_slo_s=np.full(n, math.inf),
                    class_idx=np.zeros(n, dtype=np.int64))


def fake_sim(meets_up_to_req_s: float, saturated_req_s: float = 1e9, rejected_share: float = 0.0):
    """A deployment whose every request meets its TTFT (0.5 s) up to ``meets_up_to_req_s`` and misses
    it (5 s) above; run offline it completes ``saturated_req_s`` requests a second; the last
    ``rejected_share`` of the requests never fit it."""
    def sim(req: Requests, arrival: str, warmup_frac: float):
        assert arrival in ("trace", "inf")      # what a deployment simulator accepts
        n = len(req)
        rej = np.arange(n) >= n - round(rejected_share * n)
        if arrival == "inf":
            arr = np.zeros(n)
            fin = np.arange(1, n + 1) / saturated_req_s
            first = fin
        else:
            arr = req.arrival_s
            rate = (n - 1) / (arr[-1] - arr[0])
            first = fin = arr + (0.5 if rate <= meets_up_to_req_s else 5.0)
        return build_result(req, arr, first, fin, rej, 0.0, warmup_frac, arrival, 0, n, n, 0.0,
                            "a request needs 9,999 blocks, the pool has 100" if rej.any() else "")
    return sim


def search(sim, **kw):
    return goodput(STEP, make_requests, CONFIG, 0.9, n_requests=N, sim=sim, upper_bound_req_s=100.0, **kw)


def test_finds_the_rate_where_the_slo_breaks_within_its_tolerance():
    r = search(fake_sim(7.3))
    lo, hi = r.bracket
    assert r.goodput_req_s == lo
    assert lo <= 7.3 < hi and hi - lo <= 0.02 * lo
    assert 7.3 / 1.02 <= r.goodput_req_s <= 7.3
    assert not r.capacity_limited and r.saturated_req_s is None and r.limit == "slo" and r.reason == ""
    assert r.attainment == 1.0 and r.target_attainment == 0.9
    assert r.upper_bound_req_s == 100.0 and r.n_requests == N and r.rel_tol == 0.02
    assert r.iterations == len(r.history)
    # the zero-load probe first (1e-3 x the bound), then the bound itself; never above it
    assert r.history[0] == (0.1, 1.0) and r.history[1] == (100.0, 0.0)
    assert max(rate for rate, _ in r.history) == 100.0
    assert all((a == 1.0) == (rate <= 7.3) for rate, a in r.history)


def test_a_tighter_tolerance_closes_the_bracket_further():
    r = search(fake_sim(7.3), rel_tol=0.001)
    lo, hi = r.bracket
    assert lo <= 7.3 < hi and hi - lo <= 0.001 * lo


def test_loose_slos_end_at_the_simulated_saturated_throughput_not_the_bound():
    # the SLOs hold at every rate; the engine completes only 40 req/s with everything queued
    r = search(fake_sim(math.inf, saturated_req_s=40.0))
    assert r.capacity_limited
    assert r.saturated_req_s == pytest.approx(40.0, rel=1e-9)
    assert r.goodput_req_s == r.saturated_req_s      # never above what the simulator sustains
    assert r.bracket == (r.goodput_req_s, r.goodput_req_s)
    assert r.limit == ("throughput: the SLOs still hold at the simulator's saturated throughput (every request "
                       "queued), 40 req/s")
    # the saturated (offline) run counts as a simulation: one more than the rates probed
    assert r.iterations == len(r.history) + 1
    assert [rate for rate, _ in r.history] == [0.1, 100.0, pytest.approx(40.0, rel=1e-9)]


def test_loose_slos_and_a_saturated_throughput_above_the_bound_end_at_the_bound():
    r = search(fake_sim(math.inf, saturated_req_s=150.0))
    assert r.capacity_limited and r.goodput_req_s == 100.0
    assert r.saturated_req_s == pytest.approx(150.0, rel=1e-9)
    assert r.limit == "throughput: the SLOs still hold at the analytic capacity bound, 100 req/s"
    assert r.iterations == len(r.history) + 1 == 3


def test_saturation_below_every_probed_rate_starts_again_below_it():
    # SLOs hold everywhere, the engine completes 0.05 req/s offline: below the zero-load probe (0.1)
    r = search(fake_sim(math.inf, saturated_req_s=0.05))
    assert r.capacity_limited and r.goodput_req_s == pytest.approx(0.05, rel=1e-9)
    assert r.saturated_req_s == pytest.approx(0.05, rel=1e-9)
    # a new lowest probe at half the saturated rate
    assert [rate for rate, _ in r.history][:3] == [0.1, 100.0, pytest.approx(0.025, rel=1e-9)]


def test_missing_at_zero_load_is_zero_with_the_reason():
    r = search(fake_sim(0.0))
    assert r.goodput_req_s == 0.0 and r.bracket == (0.0, 0.1) and r.iterations == 1
    assert r.reason == "TTFT at zero load: p90 5000 ms (prefill) vs target 1000 ms; 100% of requests miss it"
    assert r.attainment == 0.0


def test_requests_that_never_fit_put_the_target_out_of_reach():
    r = search(fake_sim(7.3, rejected_share=0.2))
    assert r.goodput_req_s == 0.0 and r.bracket == (0.0, 0.1)
    assert r.reason == ("a request needs 9,999 blocks, the pool has 100: at most 0.778 of the measured requests can "
                        "meet the SLOs at any rate, below the target 0.9")
    # a few that never fit, within the 10% allowed to miss: the search goes on
    r = search(fake_sim(7.3, rejected_share=0.05))
    assert 7.3 / 1.02 <= r.goodput_req_s <= 7.3


def test_a_guess_starts_the_bracket_near_it():
    r = search(fake_sim(7.3), guess_req_s=7.0)
    # 0.85 x 7 = 5.95 meets; then max(1.05 x 7, 1.1 x 5.95) = 7.35 misses: no zero-load probe
    assert r.history[0] == (pytest.approx(5.95), 1.0) and r.history[1] == (pytest.approx(7.35), 0.0)
    assert 7.3 / 1.02 <= r.goodput_req_s <= 7.3
    high = search(fake_sim(7.3), guess_req_s=20.0)
    # 17 misses, then x0.75: 12.75, 9.5625 miss, 7.171875 meets
    assert [rate for rate, _ in high.history[:4]] == pytest.approx([17.0, 12.75, 9.5625, 7.171875])
    assert 7.3 / 1.02 <= high.goodput_req_s <= 7.3
    # a guess that meets with room: grow x1.25 until a miss
    low = search(fake_sim(7.3), guess_req_s=4.0)
    assert [rate for rate, _ in low.history[:3]] == pytest.approx([3.4, 4.2, 5.25])
    assert 7.3 / 1.02 <= low.goodput_req_s <= 7.3


def test_bad_search_settings_say_what_is_wrong():
    for bad in (0.0, 1.5):
        with pytest.raises(InputError, match=rf"^attainment must be in \(0, 1\], got {bad!r}$"):
            goodput(STEP, make_requests, CONFIG, bad, n_requests=N, sim=fake_sim(7.3), upper_bound_req_s=100.0)
    for bad in (0.0, 1.0):
        with pytest.raises(InputError, match=rf"^rel_tol must be in \(0, 1\), got {bad!r}$"):
            search(fake_sim(7.3), rel_tol=bad)
    with pytest.raises(InputError, match=r"^n_requests must be >= 1, got 0$"):
        goodput(STEP, make_requests, CONFIG, 0.9, n_requests=0, sim=fake_sim(7.3), upper_bound_req_s=100.0)


def test_requests_per_simulation():
    # >= 100 measured requests in the allowed-miss tail, 10% warm-up: ceil(100 / ((1 - a) x 0.9))
    assert default_n_requests(0.9) == 1112
    assert default_n_requests(0.95) == 2223
    assert default_n_requests(0.99) == 11112
    assert default_n_requests(0.9, warmup_frac=0.0) == 1000
    assert default_n_requests(0.5) == 1000            # never fewer than 1,000
    assert default_n_requests(0.999) == 20000         # nor more than 20,000
    assert default_n_requests(1.0) == 20000
    assert default_n_requests(0.9, max_concurrency=400) == 2000     # 5 runs per concurrency slot
    assert default_n_requests(0.9, max_concurrency=5000) == 20000
    for bad in (0.0, 1.01):
        with pytest.raises(InputError, match=rf"^attainment must be in \(0, 1\], got {bad!r}$"):
            default_n_requests(bad)


class _LinearStep:
    """A step costing 10 ms + 1 us per cached token, 2 tokens per step, a 100,000-token pool."""

    class memory:
        kv_pool_tokens = 100_000

    tokens_per_step = 2.0

    @staticmethod
    def step_time_s(n_decode, ctx_sum, *rest):
        return 0.010 + 1e-6 * ctx_sum


def test_capacity_bound_by_hand():
    s = _LinearStep()
    # context 1000 + 200 / 2 = 1,100; the pool holds 90 such sequences, the cap 64
    assert capacity_bound_req_s(s, 1000, 200, 64) == pytest.approx(64 * 2 / ((0.010 + 64 * 1100e-6) * 200), rel=1e-12)
    assert capacity_bound_req_s(s, 1000, 200, 256) == pytest.approx(90 * 2 / ((0.010 + 90 * 1100e-6) * 200), rel=1e-12)
    # 500 shared (prefix-cached) tokens: each holds 600, so 166 fit
    assert capacity_bound_req_s(s, 1000, 200, 256, 500.0) == \
        pytest.approx(166 * 2 / ((0.010 + 166 * 1100e-6) * 200), rel=1e-12)
    # the simulator's own pool in place of the model's
    assert capacity_bound_req_s(s, 1000, 200, 256, 0.0, 11_000) == \
        pytest.approx(10 * 2 / ((0.010 + 10 * 1100e-6) * 200), rel=1e-12)
    # a pool too small for one sequence still runs one at a time
    assert capacity_bound_req_s(s, 1000, 200, 256, 0.0, 500) == \
        pytest.approx(1 * 2 / ((0.010 + 1100e-6) * 200), rel=1e-12)


# ---- the edges of the search ----------------------------------------------------------------------

def curve_sim(missing_share, n_out=1, lat_s=0.5, tpot_s=0.0):
    """A deployment where, at ``rate``, the last ``missing_share(rate)`` of the requests take 5 s to a
    first token (the others ``lat_s``); ``n_out``-token outputs ``tpot_s`` apart."""
    def sim(req, arrival, warmup_frac):
        assert arrival in ("trace", "inf")
        n = len(req)
        arr = req.arrival_s
        rate = (n - 1) / (arr[-1] - arr[0]) if arrival != "inf" else math.inf
        late = np.arange(n) >= n - round(missing_share(rate) * n)
        first = arr + np.where(late, 5.0, lat_s)
        fin = first + (n_out - 1) * tpot_s
        return build_result(req, arr, first, fin, np.zeros(n, dtype=bool), 0.0, warmup_frac, arrival, 0, n, n, 0.0, "")
    return sim


def make_long(rate, n, seed, n_out=1, tpot_slo_s=math.inf):
    r = make_requests(rate, n, seed)
    return Requests(**{**r.__dict__, "output_tokens": np.full(n, n_out), "tpot_slo_s": np.full(n, tpot_slo_s)})


def test_attainment_exactly_at_the_target_meets_it():
    # up to 6 req/s exactly 10% of the measured requests miss (attainment 0.9 = the target), above that 20%
    sim = curve_sim(lambda rate: 0.1 * 270 / 300 if rate <= 6.0 else 0.2)
    r = search(sim)
    assert r.attainment == 0.9 and 6.0 / 1.02 <= r.goodput_req_s <= 6.0
    assert search(sim, guess_req_s=5.0).goodput_req_s == pytest.approx(r.goodput_req_s, rel=0.03)


def test_guesses_that_are_no_guess():
    plain = search(fake_sim(7.3)).history
    for g in (0.0, -1.0, math.inf, math.nan):
        assert search(fake_sim(7.3), guess_req_s=g).history == plain, g
    # a guess so low that even its first probe is under the zero-load rate: the zero-load probe, then the bound
    assert search(fake_sim(7.3), guess_req_s=1e-4).history[:2] == ((0.1, 1.0), (100.0, 0.0))
    # a guess under 1 req/s is a guess
    assert search(fake_sim(7.3), guess_req_s=0.5).history[0] == (pytest.approx(0.425), 1.0)


def test_a_guess_walks_down_six_times_before_the_zero_load_probe():
    r = search(fake_sim(0.2), guess_req_s=100.0)
    rates = [rate for rate, _ in r.history]
    assert rates[:7] == pytest.approx([85.0 * 0.75 ** k for k in range(6)] + [0.1])
    assert 0.2 / 1.02 <= r.goodput_req_s <= 0.2


def test_a_guess_above_the_bound_probes_the_bound_once():
    r = search(fake_sim(math.inf, saturated_req_s=1e9), guess_req_s=1000.0)
    assert r.history == ((100.0, 1.0),) and r.iterations == 2      # the bound, then the saturated run
    assert r.capacity_limited and r.goodput_req_s == 100.0


def test_the_search_stops_at_its_iteration_cap():
    r = search(fake_sim(50.0), guess_req_s=1.0, max_iterations=4)
    assert len(r.history) == 4 and r.goodput_req_s == pytest.approx(1.640625)      # 0.85, 1.05, x1.25, x1.25
    assert r.limit == "no miss found up to 1.64 req/s after 4 simulations" and not r.capacity_limited


def test_a_saturated_throughput_exactly_at_the_bound_is_the_bound():
    r = goodput(STEP, make_requests, CONFIG, 0.9, n_requests=N, sim=fake_sim(math.inf, saturated_req_s=128.0),
                upper_bound_req_s=128.0)
    assert r.saturated_req_s == 128.0 and r.goodput_req_s == 128.0
    # the bound was probed and met; the engine sustains as much: no rate is probed again
    assert r.history == ((0.128, 1.0), (128.0, 1.0)) and r.iterations == 3
    assert r.limit == ("throughput: the SLOs still hold at the simulator's saturated throughput (every request "
                       "queued), 128 req/s")


def test_no_measured_request_and_some_never_served_is_zero():
    r = search(fake_sim(7.3, rejected_share=0.1), warmup_frac=1.0)
    assert r.goodput_req_s == 0.0 and "at most 0.000 of the measured requests" in r.reason


def test_the_zero_load_reason_names_each_term_that_misses():
    # TTFT exactly at its target (met), TPOT 100 ms against 62.5 ms: only TPOT is named
    sim = curve_sim(lambda rate: 0.0, n_out=2, lat_s=1.0, tpot_s=0.1)
    r = goodput(STEP, lambda rate, n, seed: make_long(rate, n, seed, 2, 0.0625), CONFIG, 0.9, n_requests=N, sim=sim,
                upper_bound_req_s=100.0)
    assert r.goodput_req_s == 0.0 and r.limit == ""
    assert r.reason == "TPOT at zero load: p90 100.0 ms (batch-1 decode step) vs target 62.5 ms; 100% of requests miss it"
    # TPOT exactly at its target (met), TTFT late for the last 30% (of all; 1/3 of the measured): only TTFT
    sim = curve_sim(lambda rate: 0.3, n_out=2, lat_s=1.0, tpot_s=0.0625)
    r = goodput(STEP, lambda rate, n, seed: make_long(rate, n, seed, 2, 0.0625), CONFIG, 0.9, n_requests=N, sim=sim,
                upper_bound_req_s=100.0)
    assert r.reason == "TTFT at zero load: p90 5000 ms (prefill) vs target 1000 ms; 33% of requests miss it"
    # both, and requests that never fit: three parts
    def both(req, arrival, warmup_frac):
        n = len(req)
        rej = np.arange(n) >= n - 3
        first = req.arrival_s + 5.0
        return build_result(req, req.arrival_s, first, first + 0.1, rej, 0.0, warmup_frac, arrival, 0, n, n, 0.0,
                            "3 requests need more blocks than the pool has")
    r = goodput(STEP, lambda rate, n, seed: make_long(rate, n, seed, 2, 0.0625), CONFIG, 0.5, n_requests=N, sim=both,
                upper_bound_req_s=100.0)
    assert r.reason == ("TTFT at zero load: p50 5000 ms (prefill) vs target 1000 ms; 100% of requests miss it; "
                        "TPOT at zero load: p50 100.0 ms (batch-1 decode step) vs target 62.5 ms; 100% of requests "
                        "miss it; 3 requests need more blocks than the pool has")


def test_the_result_as_json_keeps_its_keys():
    r = search(fake_sim(7.3))
    d = r.to_dict()
    assert list(d) == ["goodput_req_s", "attainment", "target_attainment", "iterations", "bracket_req_s", "rel_tol",
                       "n_requests", "upper_bound_req_s", "reason", "capacity_limited", "saturated_req_s", "limit",
                       "history", "at_goodput"]
    assert (d["goodput_req_s"], d["attainment"], d["target_attainment"], d["iterations"]) == \
        (r.goodput_req_s, 1.0, 0.9, len(r.history))
    assert d["bracket_req_s"] == list(r.bracket) and d["rel_tol"] == 0.02 and d["n_requests"] == N
    assert (d["upper_bound_req_s"], d["reason"], d["capacity_limited"], d["saturated_req_s"], d["limit"]) == \
        (100.0, "", False, None, "slo")
    assert d["history"] == [list(h) for h in r.history] and d["at_goodput"] == r.summary


def test_capacity_bound_edges_by_hand():
    s = _LinearStep()
    # 98,999 tokens hold 89 sequences of 1,100 (90 would need 99,000): the default shares nothing
    assert capacity_bound_req_s(s, 1000, 200, 256, kv_pool_tokens=98_999) == \
        pytest.approx(89 * 2 / ((0.010 + 89 * 1100e-6) * 200), rel=1e-12)
    assert capacity_bound_req_s(s, 1000, 200, 256, 0.0, 98_999) == \
        pytest.approx(89 * 2 / ((0.010 + 89 * 1100e-6) * 200), rel=1e-12)
    # almost everything shared: each sequence holds at least one token
    assert capacity_bound_req_s(s, 1000, 200, 10**6, 1099.5) == \
        pytest.approx(100_000 * 2 / ((0.010 + 100_000 * 1100e-6) * 200), rel=1e-12)
    # one-token prompts and outputs: context 1.5, a step per output token
    assert capacity_bound_req_s(s, 1, 1, 64) == pytest.approx(64 * 2 / ((0.010 + 64 * 1.5e-6) * 1), rel=1e-12)
    assert capacity_bound_req_s(s, 0.5, 1, 64) == pytest.approx(64 * 2 / ((0.010 + 64 * 1.0e-6) * 1), rel=1e-12)


def test_logit_clips_half_a_request_from_either_end():
    from kvtune.costmodel.goodput import _logit
    assert _logit(0.9, 100) == pytest.approx(math.log(9), rel=1e-12)
    assert _logit(0.5, 100) == 0.0
    assert _logit(1.0, 100) == pytest.approx(math.log(0.995 / 0.005), rel=1e-12)
    assert _logit(0.0, 100) == pytest.approx(-math.log(0.995 / 0.005), rel=1e-12)


@pytest.mark.parametrize("r0, k", [(10.0, 1.0), (30.0, 0.2), (5.0, 3.0)])
def test_a_smooth_attainment_curve_is_bracketed_within_the_tolerance(r0, k):
    # the measured requests' miss share is logistic in the rate: attainment crosses 0.9 at r0 - ln(9) / k
    n = 20_000

    def sim(req, arrival, warmup_frac):
        m, arr = len(req), req.arrival_s
        share = 1 / (1 + math.exp(-k * ((m - 1) / (arr[-1] - arr[0]) - r0)))
        late = np.arange(m) >= m - round(share * (m - math.floor(warmup_frac * m)))
        first = arr + np.where(late, 5.0, 0.5)
        return build_result(req, arr, first, first, np.zeros(m, dtype=bool), 0.0, warmup_frac, arrival, 0, m, m, 0.0, "")

    r = goodput(STEP, make_requests, CONFIG, 0.9, n_requests=n, sim=sim, upper_bound_req_s=100.0)
    cross = r0 - math.log(9) / k
    lo, hi = r.bracket
    assert r.attainment >= 0.9 and lo == r.goodput_req_s and hi - lo <= 0.02 * lo
    assert lo <= cross * 1.0001 and hi >= cross / 1.0001      # the crossing lies in the bracket (to 1 request in 10^4)


def test_requests_that_never_fit_exactly_at_the_allowed_misses_can_still_meet():
    # 27 of the 270 measured requests never fit: at most 0.9 can meet, exactly the target
    r = search(fake_sim(7.3, rejected_share=0.09))
    assert r.attainment == 0.9 and 7.3 / 1.02 <= r.goodput_req_s <= 7.3


def test_the_bound_uses_the_simulators_pool():
    # 100-token prompts, 1-token outputs: context 100.5; 5,000 pool tokens hold 49 at once (the cap is 64)
    cfg = SimConfig(batch_cap=64, kv_pool_tokens=5_000)
    r = goodput(STEP, make_requests, cfg, 0.9, n_requests=N, sim=fake_sim(math.inf, saturated_req_s=1e9))
    assert r.upper_bound_req_s == pytest.approx(49 / STEP.step_time_s(49, 49 * 100.5), rel=1e-12)


def _traffic(rate, n, seed, slo_s=(0.5, 0.05)):
    """Poisson arrivals and uniform lengths from ``seed``: the same draw at every rate (common random numbers)."""
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1.0, n)
    arr = np.zeros(n) if math.isinf(rate) else np.cumsum(gaps) / rate
    return Requests(arrival_s=arr, input_tokens=rng.integers(200, 600, n), output_tokens=rng.integers(20, 80, n),
                    prefix_tokens=np.zeros(n, dtype=np.int64), prefix_group=np.full(n, -1),
                    ttft_slo_s=np.full(n, slo_s[0]), tpot_slo_s=np.full(n, slo_s[1]), class_idx=np.zeros(n, dtype=np.int64))


def test_a_simulated_search_is_deterministic_with_speculation_and_counts_its_warm_up():
    from kvtune.costmodel import SpecConfig
    spec = StepModel(get_model("llama-3.1-8b"), get_gpu("h100-sxm"), 1, speculation=SpecConfig(3, 0.6))

    def run(**kw):
        return goodput(spec, _traffic, SimConfig(batch_cap=32), 0.9, n_requests=200, max_iterations=6, **kw)

    a, b = run(seed=3), run(seed=3)
    assert a.history == b.history and a.goodput_req_s == b.goodput_req_s      # the seed drives acceptance
    assert run(seed=0).history == run().history                              # the default seed is 0
    assert run(warmup_frac=0.0).summary["measured_requests"] == 200
    assert run(warmup_frac=0.25).summary["measured_requests"] == 150


def test_a_capacity_limited_simulated_search_is_deterministic():
    # SLOs no run can miss: the answer is the offline (saturated) throughput of the seed's own requests
    def run():
        return goodput(STEP, lambda rate, n, seed: _traffic(rate, n, seed, (math.inf, math.inf)), SimConfig(batch_cap=32),
                       0.9, n_requests=200, seed=5)

    a, b = run(), run()
    assert a.capacity_limited and a.saturated_req_s is not None
    assert a.saturated_req_s == b.saturated_req_s and a.goodput_req_s == b.goodput_req_s
    assert a.goodput_req_s <= a.saturated_req_s


# The goodput search (costmodel.goodput) against the mutants of a full mutmut run that the older
# tests let through (bench/RESULTS-mutation.md): every expected value here is derived by hand from
# the module's documented rules on an engine known by construction, never read off the code's output.
#
# The engine (``Engine``) is a fake deployment: at a Poisson rate r the last ``late(r)`` share of the
# measured requests take 5 s to a first token (target 1 s), the others 0.5 s, so its attainment is
# exactly ``1 - late(r)``; run offline (every request queued) it completes ``saturated_req_s``
# requests a second. It records every draw (rate, n, seed) and every simulation (arrival, warm-up).

N_survivors = 300            # requests per simulation; 10% warm-up: 270 measured




STEP_survivors = _LinearStep()


class Engine:
    def __init__(self, late=lambda rate: 0.0, saturated_req_s=1e9, inputs=None, prefix=None, groups=None, n_out=1):
        self.late, self.saturated_req_s, self.n_out = late, saturated_req_s, n_out
        self.inputs, self.prefix, self.groups = inputs, prefix, groups
        self.draws: list[tuple] = []
        self.sims: list[tuple] = []
        self.rate = None

    def make(self, rate, n, seed):
        self.draws.append((rate, n, seed))
        self.rate = rate
        arr = np.zeros(n) if math.isinf(rate) else np.arange(n) / rate
        inp = np.full(n, 100) if self.inputs is None else np.asarray(self.inputs(n), dtype=np.int64)
        pre = np.zeros(n, dtype=np.int64) if self.prefix is None else np.asarray(self.prefix(n), dtype=np.int64)
        grp = np.full(n, -1) if self.groups is None else np.asarray(self.groups(n), dtype=np.int64)
        return Requests(arrival_s=arr, input_tokens=inp, output_tokens=np.full(n, self.n_out), prefix_tokens=pre,
                        prefix_group=grp, ttft_slo_s=np.full(n, TTFT_SLO_S), tpot_slo_s=np.full(n, math.inf),
                        class_idx=np.zeros(n, dtype=np.int64))

    def sim(self, req, arrival, warmup_frac):
        self.sims.append((arrival, warmup_frac))
        n = len(req)
        if arrival == "inf":
            arr = np.zeros(n)
            first = fin = np.arange(1, n + 1) / self.saturated_req_s
        else:
            arr = req.arrival_s
            late = np.arange(n) >= n - round(self.late(self.rate) * (n - math.floor(warmup_frac * n)))
            first = fin = arr + np.where(late, 5.0, 0.5)
        return build_result(req, arr, first, fin, np.zeros(n, dtype=bool), 0.0, warmup_frac, arrival, 0, n, n, 0.0, "")


def search_survivors(engine, ub=100.0, attainment=0.9, **kw):
    kw.setdefault("n_requests", N_survivors)
    return goodput(STEP_survivors, engine.make, SimConfig(batch_cap=64), attainment, sim=engine.sim, upper_bound_req_s=ub, **kw)


def rates(r):
    return [rate for rate, _ in r.history]


def step_at(edge_req_s):
    """Every request meets up to ``edge_req_s``, every one misses above."""
    return lambda rate: 0.0 if rate <= edge_req_s else 1.0


# ---- after the saturated throughput replaces the bound ---------------------------------------------

def test_a_miss_below_the_saturated_throughput_is_zero_with_the_zero_load_reason():
    # meets at 0.1 (the zero-load probe) and at the bound; offline the engine completes 0.05 req/s,
    # below every rate met: a new lowest probe at min(1e-3 x 100, 0.5 x 0.05) = 0.025, which misses
    e = Engine(late=lambda rate: 1.0 if rate < 0.1 else 0.0, saturated_req_s=0.05)
    r = search_survivors(e)
    assert rates(r) == [0.1, 100.0, pytest.approx(0.025, rel=1e-12)]
    assert r.goodput_req_s == 0.0 and r.attainment == 0.0 and not r.capacity_limited and r.limit == ""
    assert r.bracket == (0.0, pytest.approx(0.025, rel=1e-12))
    assert r.saturated_req_s == pytest.approx(0.05, rel=1e-9)
    assert r.reason == "TTFT at zero load: p90 5000 ms (prefill) vs target 1000 ms; 100% of requests miss it"
    assert r.iterations == 4          # three rates and the offline run
    assert r.summary["measured_requests"] == 270


def test_a_low_probe_exactly_at_the_target_after_saturation_meets_it():
    # exactly 27 of the 270 measured requests miss at every rate: attainment 0.9 = the target everywhere
    e = Engine(late=lambda rate: 0.1, saturated_req_s=0.05)
    r = search_survivors(e)
    # 0.1 meets, the bound (100) meets, saturation at 0.05 below every rate met: 0.025 meets, then 0.05 meets
    assert rates(r) == pytest.approx([0.1, 100.0, 0.025, 0.05], rel=1e-9)
    assert r.capacity_limited and r.goodput_req_s == pytest.approx(0.05, rel=1e-9) and r.attainment == 0.9
    assert r.bracket == (r.goodput_req_s, r.goodput_req_s)


def test_a_saturated_throughput_equal_to_a_rate_met_needs_no_new_probe():
    # the bound 1000 makes the zero-load probe 1 req/s; offline the engine completes exactly 1 req/s
    # (finishes 1 s apart): the rate already met is the answer, nothing is probed again
    e = Engine(saturated_req_s=1.0)
    r = search_survivors(e, ub=1000.0)
    assert r.history == ((1.0, 1.0), (1000.0, 1.0))
    assert r.capacity_limited and r.goodput_req_s == 1.0 and r.saturated_req_s == 1.0
    assert r.bracket == (1.0, 1.0) and r.iterations == 3
    assert r.limit == ("throughput: the SLOs still hold at the simulator's saturated throughput (every request "
                       "queued), 1 req/s")


def test_a_guess_that_overshoots_the_saturated_throughput_restarts_at_the_zero_load_rate():
    # guess 50: 42.5 meets, then max(1.05 x 50, 1.1 x 42.5) = 52.5, grown x1.25 (65.625, 82.03125) up to the
    # bound 100, all met; offline 10 req/s, below every rate met: a new lowest probe at
    # min(1e-3 x 100, 0.5 x 10) = 0.1, then the saturated rate itself
    e = Engine(saturated_req_s=10.0)
    r = search_survivors(e, guess_req_s=50.0)
    assert rates(r) == pytest.approx([42.5, 52.5, 65.625, 82.03125, 100.0, 0.1, 10.0], rel=1e-9)
    assert r.capacity_limited and r.goodput_req_s == pytest.approx(10.0, rel=1e-9) and r.iterations == 8


def test_the_iteration_cap_keeps_the_bracket_up_to_the_bound():
    r = search_survivors(Engine(late=step_at(50.0)), guess_req_s=1.0, max_iterations=4)
    # 0.85, 1.05, then x1.25 twice, all met: no miss seen, the bracket's upper end is the bound
    assert r.goodput_req_s == pytest.approx(1.640625) and r.bracket == (pytest.approx(1.640625), 100.0)
    assert r.saturated_req_s is None and not r.capacity_limited


def test_the_default_iteration_cap_is_forty_simulations():
    # a tolerance no bisection reaches in 40 steps (the bracket halves at most once a probe)
    r = search_survivors(Engine(late=step_at(7.3)), rel_tol=1e-12)
    assert len(r.history) == r.iterations == 40
    lo, hi = r.bracket
    assert lo <= 7.3 < hi and r.goodput_req_s == lo


def test_a_guess_landing_exactly_on_the_zero_load_rate_is_the_zero_load_probe():
    # bound 1000: zero-load rate 1.0; 0.85 x (1 / 0.85) == 1.0 exactly, not above it: no walk, the
    # zero-load probe, then the bound (a guess is only walked from above the zero-load rate)
    assert 0.85 * (1 / 0.85) == 1.0
    r = search_survivors(Engine(late=step_at(7.3)), ub=1000.0, guess_req_s=1 / 0.85)
    assert rates(r)[:2] == [1.0, 1000.0]


def test_an_attainment_target_of_one_is_allowed():
    r = search_survivors(Engine(late=step_at(7.3)), attainment=1.0)
    assert r.target_attainment == 1.0 and 7.3 / 1.02 <= r.goodput_req_s <= 7.3


def test_a_single_request_per_simulation_is_allowed():
    e = Engine(late=step_at(7.3))
    r = search_survivors(e, n_requests=1, warmup_frac=0.0)
    assert r.n_requests == 1 and all(n == 1 for _, n, _ in e.draws)


# ---- the contract with make_requests and sim --------------------------------------------------------

def test_every_draw_uses_the_search_seed_and_every_simulation_its_arrival_and_warm_up():
    e = Engine(saturated_req_s=40.0)
    r = search_survivors(e, seed=7, warmup_frac=0.25)
    assert r.capacity_limited
    assert {seed for _, _, seed in e.draws} == {7}
    assert {n for _, n, _ in e.draws} == {N_survivors}
    # Poisson probes with the warm-up asked for; the offline run (rate inf) measures every request
    assert e.sims[:2] == [("trace", 0.25), ("trace", 0.25)]
    assert ("inf", 0.0) in e.sims and all(s in (("trace", 0.25), ("inf", 0.0)) for s in e.sims)
    offline = [i for i, (rate, _, _) in enumerate(e.draws) if math.isinf(rate)]
    assert len(offline) == 1


# ---- the capacity bound and the request count from the requests drawn -----------------------------

def test_the_bound_counts_only_the_requests_that_fit_the_pool():
    # 16-token blocks, a 1,600-token pool: 100 blocks, 25 (int(0.25 x 100)) kept free: a request fits
    # when ceil((input + output + 1) / 16) <= 75, i.e. input + 1 + 1 <= 1,200
    cfg = SimConfig(batch_cap=64, kv_pool_tokens=1_600, watermark_frac=0.25)
    # alternate 1,198-token prompts (exactly 1,200 with the output and its slot: fit) and 1,199 (1,201: do not)
    e = Engine(inputs=lambda n: np.where(np.arange(n) % 2 == 0, 1198, 1199))
    r = goodput(STEP_survivors, e.make, cfg, 0.5, n_requests=N_survivors, sim=e.sim)
    # only the 1,198-token ones: context 1,198.5, the 1,600-token pool holds one at a time
    assert r.upper_bound_req_s == pytest.approx(1 * 2 / ((0.010 + 1198.5e-6) * 1), rel=1e-12)
    # the draw the bound is taken from is the search's own n requests at the probe rate 1 req/s
    assert e.draws[0] == (1.0, N_survivors, 0)


def test_the_free_watermark_is_whole_blocks_of_whole_blocks():
    # a 190-token pool is 11 whole 16-token blocks (not 11.875); 90% kept free: int(0.9 x 11) = 9, so 2
    # blocks admit a request (11.875 - int(10.69) = 1.875 would admit none). 30-token prompts (32 tokens
    # with the output and its slot: 2 blocks) fit; 100-token ones (7 blocks) never do
    e = Engine(inputs=lambda n: np.where(np.arange(n) % 2 == 0, 30, 100))
    r = goodput(STEP_survivors, e.make, SimConfig(batch_cap=64, kv_pool_tokens=190, watermark_frac=0.9), 0.5, n_requests=N_survivors,
                sim=e.sim)
    # the bound over the 30-token ones: context 30.5, 190 // 30.5 = 6 at once
    assert r.upper_bound_req_s == pytest.approx(6 * 2 / ((0.010 + 6 * 30.5e-6) * 1), rel=1e-12)
    # requests of two sizes that all fit: the bound is over both (contexts 100.5 and 300.5, mean 200.5)
    two = Engine(inputs=lambda n: np.where(np.arange(n) % 2 == 0, 100, 300))
    r = goodput(STEP_survivors, two.make, SimConfig(batch_cap=4), 0.5, n_requests=N_survivors, sim=two.sim)
    assert r.upper_bound_req_s == pytest.approx(4 * 2 / ((0.010 + 4 * 200.5e-6) * 1), rel=1e-12)


def test_when_no_request_fits_the_bound_is_over_all_of_them():
    # 1,600-token pool, 2,000- and 4,000-token prompts: none fits; the mean context is 3,000.5
    e = Engine(inputs=lambda n: np.where(np.arange(n) % 2 == 0, 2000, 4000))
    cfg = SimConfig(batch_cap=64, kv_pool_tokens=1_600)
    r = goodput(STEP_survivors, e.make, cfg, 0.9, n_requests=N_survivors, sim=e.sim)
    assert r.upper_bound_req_s == pytest.approx(2 / (0.010 + 3000.5e-6), rel=1e-12)


def test_the_bound_reads_shared_prefix_tokens_only_of_requests_in_a_group_and_with_caching():
    # 1,000-token prompts, 1-token outputs: context 1,000.5; prefixes of 500 tokens, in group 0 for half
    # the requests, in none (-1, whose prefix_tokens do not count) for the other half
    kw = dict(inputs=lambda n: np.full(n, 1000), prefix=lambda n: np.full(n, 500),
              groups=lambda n: np.where(np.arange(n) % 2 == 0, 0, -1))
    e = Engine(**kw)
    r = goodput(STEP_survivors, e.make, SimConfig(batch_cap=10**6, kv_pool_tokens=99_800), 0.5, n_requests=N_survivors, sim=e.sim)
    # mean shared 250: each holds 1,000.5 - 250 = 750.5 tokens: 132 fit in 99,800 (750 each would fit 133)
    assert r.upper_bound_req_s == pytest.approx(132 * 2 / ((0.010 + 132 * 1000.5e-6) * 1), rel=1e-12)
    # prefix caching off: nothing shared, 99 fit
    e = Engine(**kw)
    r = goodput(STEP_survivors, e.make, SimConfig(batch_cap=10**6, kv_pool_tokens=99_800, prefix_caching=False), 0.5,
                n_requests=N_survivors, sim=e.sim)
    assert r.upper_bound_req_s == pytest.approx(99 * 2 / ((0.010 + 99 * 1000.5e-6) * 1), rel=1e-12)


def test_caching_off_shares_nothing_not_even_one_token():
    # 1,099-token prompts, 2-token outputs: context 1,099 + 1 = 1,100; 98,999 pool tokens hold 89 of them
    # (98,999 // 1,100), where one shared token (1,099 each) would make it 90
    e = Engine(inputs=lambda n: np.full(n, 1099), n_out=2)
    cfg = SimConfig(batch_cap=10**6, kv_pool_tokens=98_999, prefix_caching=False)
    r = goodput(STEP_survivors, e.make, cfg, 0.5, n_requests=N_survivors, sim=e.sim)
    assert r.upper_bound_req_s == pytest.approx(89 * 2 / ((0.010 + 89 * 1100e-6) * 2), rel=1e-12)


def test_the_default_request_count_outlasts_the_concurrency_the_pool_and_cap_allow():
    # 100-token prompts, 1-token outputs: 101 tokens a request; the step's 100,000-token pool holds 990
    e = Engine(late=step_at(7.3))
    r = goodput(STEP_survivors, e.make, SimConfig(batch_cap=10**6), 0.9, n_requests=None, sim=e.sim, upper_bound_req_s=100.0)
    assert r.n_requests == 5 * 990 == default_n_requests(0.9, 0.1, 990)
    # the cap binds at 400: 5 x 400 = 2,000 (more than the 1,112 the tail needs)
    e = Engine(late=step_at(7.3))
    r = goodput(STEP_survivors, e.make, SimConfig(batch_cap=400), 0.9, n_requests=None, sim=e.sim, upper_bound_req_s=100.0)
    assert r.n_requests == 2000
    # a small cap: the tail decides, 1,112 at 10% warm-up; 1,000 (the floor) at none
    for wf, want in ((None, 1112), (0.0, 1000)):
        e = Engine(late=step_at(7.3))
        r = goodput(STEP_survivors, e.make, SimConfig(batch_cap=8), 0.9, n_requests=None, sim=e.sim, upper_bound_req_s=100.0,
                    warmup_frac=wf)
        assert r.n_requests == want
    # the probe draw for the bound takes 1,000 requests when n_requests is not given
    assert e.draws[0] == (1.0, 1000, 0)


def test_the_bound_is_over_the_requests_simulated_not_a_thousand():
    # prompts grow along the draw (100 + i): over 300 requests the mean is 249.5 (context 250), over 1,000 it
    # would be 599.5
    e = Engine(inputs=lambda n: 100 + np.arange(n))
    r = goodput(STEP_survivors, e.make, SimConfig(batch_cap=4), 0.5, n_requests=N_survivors, sim=e.sim)
    assert r.upper_bound_req_s == pytest.approx(4 * 2 / ((0.010 + 4 * 250.0e-6) * 1), rel=1e-12)


# ---- completion rate over the middle completions ---------------------------------------------------

def _run(fin_s, arrival_s=None, rejected=()):
    n = len(fin_s)
    req = Requests(arrival_s=np.zeros(n) if arrival_s is None else np.asarray(arrival_s, float),
                   input_tokens=np.full(n, 10), output_tokens=np.ones(n, dtype=np.int64),
                   prefix_tokens=np.zeros(n, dtype=np.int64), prefix_group=np.full(n, -1),
                   ttft_slo_s=np.full(n, math.inf), tpot_slo_s=np.full(n, math.inf), class_idx=np.zeros(n, dtype=np.int64))
    rej = np.isin(np.arange(n), list(rejected))
    fin = np.asarray(fin_s, float)
    return build_result(req, req.arrival_s, fin, fin, rej, 0.0, 0.0, "inf", 0, n, n, 0.0, "x" if rej.any() else "")


def test_completion_rate_over_the_middle_sixty_percent_by_hand():
    # 10 completions: the 20%..80% window is sorted completions 2..7: 5 gaps over fin[7] - fin[2]
    fin = [9.0, 0.5, 1.0, 2.0, 3.0, 5.0, 8.0, 13.0, 21.0, 34.0]       # sorted: 0.5 1 2 3 5 8 9 13 21 34
    assert completion_rate_req_s(_run(fin)) == pytest.approx(5 / (13.0 - 2.0), rel=1e-12)
    # arrivals count: finish = arrival + e2e (here arrivals 1 s apart, e2e 2 s: finishes 2..11 s; the
    # e2e times alone are all equal, whose rate would be the run's 10 / 11 s)
    arr = np.arange(10.0)
    assert completion_rate_req_s(_run(arr + 2.0, arrival_s=arr)) == pytest.approx(5 / 5.0, rel=1e-12)
    # without arrival times: the e2e times themselves
    import dataclasses
    res = dataclasses.replace(_run(fin), arrival_s=None)
    assert completion_rate_req_s(res) == pytest.approx(5 / 11.0, rel=1e-12)
    # ... and without them, the requests never served are left out too
    res = dataclasses.replace(_run(fin + [0.1, 0.2], rejected=(10, 11)), arrival_s=None)
    assert completion_rate_req_s(res) == pytest.approx(5 / 11.0, rel=1e-12)


def test_completion_rate_leaves_out_requests_never_served():
    # 12 requests, two never served: the 10 served are as above
    fin = [9.0, 0.5, 1.0, 2.0, 3.0, 5.0, 8.0, 13.0, 21.0, 34.0, 0.1, 0.2]
    assert completion_rate_req_s(_run(fin, rejected=(10, 11))) == pytest.approx(5 / 11.0, rel=1e-12)


def test_completion_rate_falls_back_to_the_run_rate_when_the_window_is_too_small_or_flat():
    # 5 completions: window 1..4 (k2 - k1 = 3 >= 2): 2 gaps over fin[3] - fin[1]
    assert completion_rate_req_s(_run([1.0, 2.0, 4.0, 8.0, 16.0])) == pytest.approx(2 / 6.0, rel=1e-12)
    # 4 completions: window 0..3, k2 - k1 = 3 - 0 ... int(0.8 x 4) = 3, int(0.2 x 4) = 0: 2 gaps over fin[2] - fin[0]
    assert completion_rate_req_s(_run([1.0, 2.0, 4.0, 8.0])) == pytest.approx(2 / 3.0, rel=1e-12)
    # 3 completions: int(0.6) = 0, int(2.4) = 2: k2 - k1 = 2, one gap over fin[1] - fin[0]
    assert completion_rate_req_s(_run([1.0, 2.0, 4.0])) == pytest.approx(1 / 1.0, rel=1e-12)
    # 2 completions: int(0.4) = 0, int(1.6) = 1: no gap is a rate: the run's own (2 served / 4 s)
    assert completion_rate_req_s(_run([1.0, 4.0])) == pytest.approx(2 / 4.0, rel=1e-12)
    # all finishing at once in the window: the run's own rate (10 / 7 s)
    flat = [1.0, 2.0] + [5.0] * 6 + [6.0, 7.0]
    assert completion_rate_req_s(_run(flat)) == pytest.approx(10 / 7.0, rel=1e-12)


# ---- the narrowing: a second derivation of step 3 of the module docstring --------------------------

def narrow(lo, hi, a_lo, a_hi, attainment, measure, rel_tol, n_measured, budget):
    """Step 3 as documented, written from the docstring and the comments, not the code: while the
    bracket spans more than a factor 2, probe its geometric middle; else aim at the crossing
    interpolated linearly in logit(attainment) - logit(target) between the ends, and probe the pair
    aim x (1 -/+ 0.45 rel_tol), each kept 2% of the width inside the bracket, lower first, stopping
    at the first miss; after two aims (without a bisection) or when the ends do not straddle the
    target, bisect. A met probe's logit distance is kept >= +1e-9, a missed one's <= -1e-9. An end
    that did not move in a round has its distance halved (Illinois). Stop when hi - lo <= rel_tol lo
    or the budget of probes is spent. Returns the probes and the final bracket."""
    def g(a):
        return _logit(a, n_measured) - _logit(attainment, n_measured)
    f_lo, f_hi, aims, probes = g(a_lo), g(a_hi), 0, []
    while hi - lo > rel_tol * lo and len(probes) < budget:
        start = (lo, hi)
        if hi > 2 * lo:
            pair = [math.sqrt(lo * hi)]
        elif aims >= 2 or not (f_lo > 0 and f_hi < 0):
            pair, aims = [(lo + hi) / 2], 0
        else:
            x = lo + (hi - lo) * f_lo / (f_lo - f_hi)
            inner = (lo + 0.02 * (hi - lo), hi - 0.02 * (hi - lo))
            pair = sorted({min(max(x * (1 - 0.45 * rel_tol), inner[0]), inner[1]),
                           min(max(x * (1 + 0.45 * rel_tol), inner[0]), inner[1])})
            aims += 1
        for p in pair:
            if not lo < p < hi or hi - lo <= rel_tol * lo:
                continue
            a = measure(p)
            probes.append(p)
            if a >= attainment:
                lo, f_lo = p, max(g(a), 1e-9)
            else:
                hi, f_hi = p, min(g(a), -1e-9)
                break
        f_lo = f_lo / 2 if lo == start[0] else f_lo
        f_hi = f_hi / 2 if hi == start[1] else f_hi
    return probes, (lo, hi)


def _expected(late, start, n_measured=270, rel_tol=0.02, budget=40):
    """The probes after ``start`` (the rates probed to set up the bracket, by hand), and the final bracket."""
    def measure(rate):   # the engine's attainment: whole requests of the measured ones miss
        return 1 - round(late(rate) * n_measured) / n_measured
    met = [(r, measure(r)) for r in start]
    lo = max(r for r, a in met if a >= 0.9)
    hi = min(r for r, a in met if a < 0.9)
    return narrow(lo, hi, measure(lo), measure(hi), 0.9, measure, rel_tol, n_measured, budget - len(start))


@pytest.mark.parametrize("edge", [7.3, 0.37, 55.0, 99.0])
def test_a_step_curve_from_the_zero_load_bracket_is_narrowed_as_documented(edge):
    late = step_at(edge)
    r = search_survivors(Engine(late=late))
    probes, bracket = _expected(late, [0.1, 100.0])
    assert rates(r) == pytest.approx([0.1, 100.0] + probes, rel=1e-12)
    assert r.bracket == pytest.approx(bracket, rel=1e-12) and r.goodput_req_s == pytest.approx(bracket[0], rel=1e-12)
    assert bracket[0] <= edge < bracket[1] <= bracket[0] * 1.02


@pytest.mark.parametrize("guess, edge, start", [
    (7.0, 7.3, [5.95, 7.35]),          # 0.85 x 7 meets; max(1.05 x 7, 1.1 x 5.95) = 7.35 misses
    (7.0, 6.0, [5.95, 7.35]),
    (7.0, 5.99, [5.95, 7.35]),
    (100.0, 60.0, [85.0, 63.75, 47.8125]),   # 85 misses, x0.75: 63.75 misses, 47.8125 meets
])
def test_a_step_curve_from_a_guess_bracket_is_narrowed_as_documented(guess, edge, start):
    late = step_at(edge)
    r = search_survivors(Engine(late=late), guess_req_s=guess)
    probes, bracket = _expected(late, start)
    assert rates(r) == pytest.approx(start + probes, rel=1e-12)
    assert r.bracket == pytest.approx(bracket, rel=1e-12)
    assert bracket[0] <= edge < bracket[1]


def logistic(cross_req_s, k):
    """A miss share logistic in the rate, crossing attainment 0.9 at ``cross_req_s``: logit(attainment)
    is linear in the rate (-k x (rate - cross) + ln 9), the case the logit interpolation is exact on."""
    r0 = cross_req_s + math.log(9) / k
    return lambda rate: 1 / (1 + math.exp(-k * (rate - r0)))


@pytest.mark.parametrize("cross", [6.5, 6.9])
def test_a_logit_linear_curve_is_closed_by_one_aimed_pair(cross):
    # guess 7: 5.95 meets, 7.35 misses (< 2x apart): one aim lands on the crossing (to the measurement's
    # resolution, 20,000 requests), the pair 0.9 rel_tol apart straddles it and closes the bracket: 4 runs
    r = search_survivors(Engine(late=logistic(cross, 2.0)), guess_req_s=7.0, n_requests=20_000)
    assert len(r.history) == 4
    assert r.bracket == pytest.approx((cross * (1 - 0.009), cross * (1 + 0.009)), rel=2e-4)


def test_an_aim_at_the_lower_end_is_kept_two_percent_of_the_width_inside():
    # crossing at 5.99, just above the lower end 5.95 (width 1.4): the aim minus 0.9% would fall at 5.936,
    # under 5.95 + 0.028; the lower probe is 5.978, the upper the aim + 0.9% (6.044), which misses: 4 runs
    r = search_survivors(Engine(late=logistic(5.99, 2.0)), guess_req_s=7.0, n_requests=20_000)
    assert len(r.history) == 4
    assert r.history[2][0] == pytest.approx(5.95 + 0.02 * 1.4, rel=1e-12)
    assert r.bracket == pytest.approx((5.978, 5.99 * 1.009), rel=2e-4)


def test_an_aim_near_the_upper_end_stops_after_the_lower_probe_closes_the_bracket():
    # crossing at 7.3: the lower probe (7.3 x 0.991 = 7.234) meets and leaves 7.35 - 7.234 < 2% of 7.234:
    # the upper probe is not run: 3 runs
    r = search_survivors(Engine(late=logistic(7.3, 2.0)), guess_req_s=7.0, n_requests=20_000)
    assert len(r.history) == 3
    assert r.bracket == pytest.approx((7.3 * 0.991, 7.35), rel=2e-4)


def convex(cross_req_s, p):
    """Attainment 1 - 0.1 x (rate / cross)^p: crosses 0.9 at ``cross_req_s``, its logit far from linear in
    the rate, so an aim from the ends lands off the crossing and the pairs, Illinois and the
    bisection fallback all take turns."""
    return lambda rate: min(1.0, 0.1 * (rate / cross_req_s) ** p)


@pytest.mark.parametrize("cross, p, guess", [(6.3, 8, 7.0), (6.3, 30, 7.0), (7.2, 3, 7.0), (30.0, 12, None),
                                             (0.5, 6, None)])
def test_a_curve_whose_logit_is_not_linear_is_narrowed_as_documented(cross, p, guess):
    late = convex(cross, p)
    r = search_survivors(Engine(late=late), guess_req_s=guess, n_requests=20_000)
    start = [5.95, 7.35] if guess else [0.1, 100.0]   # the geometric steps from (0.1, 100) are step 3's
    probes, bracket = _expected(late, start, n_measured=18_000)
    assert rates(r) == pytest.approx(start + probes, rel=1e-9)
    assert r.bracket == pytest.approx(bracket, rel=1e-9)
    lo, hi = bracket
    assert 1 - round(late(lo) * 18_000) / 18_000 >= 0.9 > 1 - round(late(hi) * 18_000) / 18_000
    assert hi - lo <= 0.02 * lo and r.goodput_req_s == pytest.approx(lo, rel=1e-9)


def test_after_saturation_the_narrowing_starts_from_the_highest_rate_met_below_it():
    # every rate meets but those in (49.5, 50.5]; offline the engine completes 50 req/s. Guess 4: 3.4 meets,
    # then 4.2 and x1.25 up to the bound (none in the window: ... 39.1155, 48.8944, 61.1180, ...), all met;
    # the saturated rate 50 misses: the bracket is (48.8944..., 50), the highest rate met below 50
    late = lambda rate: 1.0 if 49.5 < rate <= 50.5 else 0.0  # noqa: E731
    r = search_survivors(Engine(late=late, saturated_req_s=50.0), guess_req_s=4.0)
    grown = [4.2 * 1.25 ** k for k in range(15)]
    start = [3.4] + [g for g in grown if g < 100.0] + [100.0]
    assert rates(r)[:len(start) + 1] == pytest.approx(start + [50.0], rel=1e-9)
    lo = max(g for g in start if g <= 50.0)
    assert lo == pytest.approx(48.89443516731262, rel=1e-12)
    probes, bracket = narrow(lo, r.history[len(start)][0], 1.0, 0.0, 0.9, lambda x: 1 - late(x), 0.02, 270,
                             40 - len(start) - 1)
    assert rates(r)[len(start) + 1:] == pytest.approx(probes, rel=1e-12)
    assert r.bracket == pytest.approx(bracket, rel=1e-12) and 49.5 / 1.02 <= r.goodput_req_s <= 49.5
    assert r.saturated_req_s == pytest.approx(50.0, rel=1e-9) and not r.capacity_limited


@pytest.mark.parametrize("sat, window, share, rel_tol, base", [
    # exactly 2x: 1 req/s (the zero-load rate of the bound 1000) to the saturated 2 req/s: not wider than a
    # factor 2, so an aimed pair, not a geometric middle
    (2.0, (1.5, 2.5), 1.0, 0.02, 0.0),
    # 1 to 1.9 req/s, the upper end missing by one request (0.89994): the aim lands within 0.2% of it and
    # the lower probe is held 2% of the width (0.018) below the upper end: 1.882
    (1.9, (1.895, 2.5), 1801 / 18_000, 0.02, 0.0),
    # the same at rel_tol 0.001: the held probe (1.882) meets without closing the bracket; the aim itself
    # (above 1.882 by more than its 0.045% offset) is never probed: the pair is the one held probe
    (1.9, (1.895, 2.5), 1801 / 18_000, 0.001, 0.0),
    # 1 to 1.9 req/s, 12.9% missing at the upper end: aim 1.87; the lower probe 1.8532 meets (all meet up to
    # 1.86) and the upper one, 1.8868, is held at 1.882
    (1.9, (1.86, 2.5), 2318 / 18_000, 0.02, 0.0),
    # 1 to 1.9 req/s, the lower end meeting by one request (0.90006), every request missing at the upper:
    # the aim lands 0.004% above the lower end and the pair, 1.00904 and 1.0009, are both held 2% of the
    # width (0.018) above it: one probe, 1.018
    (1.9, (1.01, 2.5), 1.0, 0.02, 1799 / 18_000),
])
def test_a_bracket_from_the_saturated_throughput_is_narrowed_as_documented(sat, window, share, rel_tol, base):
    # meets at 1 and at the bound 1000 (a loose SLO), misses inside ``window`` (share of the measured
    # requests late, ``base`` elsewhere); offline the engine completes ``sat`` req/s, below the bound:
    # the bracket is (1, sat)
    def late(rate):
        return share if window[0] < rate <= window[1] else base
    r = search_survivors(Engine(late=late, saturated_req_s=sat), ub=1000.0, n_requests=20_000, rel_tol=rel_tol)
    assert rates(r)[:3] == pytest.approx([1.0, 1000.0, sat], rel=1e-9)
    hi = r.history[2][0]

    def measure(rate):
        return 1 - round(late(rate) * 18_000) / 18_000
    probes, bracket = narrow(1.0, hi, measure(1.0), measure(hi), 0.9, measure, rel_tol, 18_000, 37)
    assert rates(r)[3:] == pytest.approx(probes, rel=1e-12)
    assert r.bracket == pytest.approx(bracket, rel=1e-12) and r.saturated_req_s == pytest.approx(sat, rel=1e-9)
    if sat == 1.9 and base == 0.0:
        assert hi - 0.02 * (hi - 1.0) in probes     # the clamp below the upper end is what was probed
    if base:
        assert probes[0] == pytest.approx(1.0 + 0.02 * (hi - 1.0), rel=1e-12)   # ... above the lower end


@pytest.mark.parametrize("edge", [7.3, 99.0])
def test_a_target_within_half_a_request_of_zero_keeps_a_missed_probe_below_it(edge):
    # target 0.001 of 270 measured requests: it and a probe where every request misses both clip to half a
    # request (logit distance 0). A missed probe's distance is then held at -1e-9, which makes the next
    # aim an aimed pair rather than a bisection (edge 7.3); an upper end never moved keeps distance 0,
    # which is no straddle: a bisection (edge 99: every geometric probe meets)
    late = step_at(edge)
    r = search_survivors(Engine(late=late), attainment=0.001)

    def measure(rate):
        return 1 - late(rate)
    probes, bracket = narrow(0.1, 100.0, 1.0, 0.0, 0.001, measure, 0.02, 270, 38)
    assert rates(r) == pytest.approx([0.1, 100.0] + probes, rel=1e-12)
    assert r.bracket == pytest.approx(bracket, rel=1e-12) and bracket[0] <= edge < bracket[1]


def test_a_lower_end_exactly_at_the_target_is_no_straddle():
    # exactly 27 of 270 miss at the zero-load rate 0.1 (attainment 0.9 = the target: logit distance 0),
    # every request misses above 0.15: the geometric probes all miss, the lower end never moves and keeps
    # distance 0, so the narrowing bisects instead of aiming
    def late(rate):
        return 0.1 if rate <= 0.15 else 1.0
    r = search_survivors(Engine(late=late))

    def measure(rate):
        return 1 - round(late(rate) * 270) / 270
    probes, bracket = narrow(0.1, 100.0, 0.9, 0.0, 0.9, measure, 0.02, 270, 38)
    assert rates(r) == pytest.approx([0.1, 100.0] + probes, rel=1e-12)
    assert r.bracket == pytest.approx(bracket, rel=1e-12) and bracket[0] <= 0.15 < bracket[1]


def test_a_guess_probe_exactly_at_the_target_meets_it():
    # exactly 27 of 270 miss up to 6 req/s: 0.85 x 5 = 4.25 meets (attainment 0.9, the target), so the
    # upper end is max(1.05 x 5, 1.1 x 4.25) = 5.25, which meets too; x1.25: 6.5625 misses
    r = search_survivors(Engine(late=lambda rate: 0.1 if rate <= 6.0 else 0.2), guess_req_s=5.0)
    assert rates(r)[:3] == pytest.approx([4.25, 5.25, 6.5625], rel=1e-12)
    assert [a for _, a in r.history[:3]] == [0.9, 0.9, 0.8]


# ---- the real simulator gets the search's seed and warm-up --------------------------------------------

def _traffic_survivors(rate, n, seed):
    """Uniform lengths and evenly spaced arrivals that ignore ``seed``: only the simulator's draws
    (speculative acceptance) depend on it. At rate inf the arrival times are 1 s apart: an offline
    run ignores them (``Requests.arrival_s``), so only a run told it is offline queues them all."""
    rng = np.random.default_rng(1)
    arr = np.arange(n) / (1.0 if math.isinf(rate) else rate)
    return Requests(arrival_s=arr, input_tokens=rng.integers(200, 600, n), output_tokens=rng.integers(20, 80, n),
                    prefix_tokens=np.zeros(n, dtype=np.int64), prefix_group=np.full(n, -1),
                    ttft_slo_s=np.full(n, 0.5), tpot_slo_s=np.full(n, 0.05), class_idx=np.zeros(n, dtype=np.int64))


def _without_wall(summary):
    return {k: v for k, v in summary.items() if k != "sim_wall_s"}


@pytest.mark.parametrize("slo_s, wf", [((0.5, 0.05), 0.25), ((math.inf, math.inf), None)])
def test_the_simulator_runs_with_the_search_seed_and_warm_up(slo_s, wf):
    from kvtune.costmodel import SpecConfig, StepModel, get_gpu, get_model
    from kvtune.costmodel.simulate import simulate
    step = StepModel(get_model("llama-3.1-8b"), get_gpu("h100-sxm"), 1, speculation=SpecConfig(3, 0.6))
    cfg = SimConfig(batch_cap=32)

    def make(rate, n, seed):
        return Requests(**{**_traffic_survivors(rate, n, seed).__dict__, "ttft_slo_s": np.full(n, slo_s[0]),
                           "tpot_slo_s": np.full(n, slo_s[1])})

    r = goodput(step, make, cfg, 0.9, n_requests=200, max_iterations=6, seed=3, warmup_frac=wf)
    rate = r.history[-1][0] if r.goodput_req_s == 0 else r.goodput_req_s
    want_wf = 0.1 if wf is None else wf
    at = simulate(step, make(rate, 200, 3), cfg, "trace", seed=3, warmup_frac=want_wf)
    assert _without_wall(r.summary) == _without_wall(at.summary())
    # the seed matters here (speculative acceptance is drawn), so the check above can tell
    assert _without_wall(simulate(step, make(rate, 200, 3), cfg, "trace", seed=0, warmup_frac=want_wf).summary())\
        != _without_wall(at.summary())
    if r.saturated_req_s is not None:      # the offline run: every request at once, the same seed, nothing warm-up
        off = simulate(step, make(math.inf, 200, 3), cfg, "inf", seed=3, warmup_frac=0.0)
        assert r.saturated_req_s == completion_rate_req_s(off)
        assert completion_rate_req_s(simulate(step, make(math.inf, 200, 3), cfg, "inf", seed=0, warmup_frac=0.0))\
            != r.saturated_req_s
