"""Requests that can never fit the KV pool: rejected, counted and explained; never a crash, never
a NaN or an infinity in a JSON output (issue 11 item 4, issue 12 item 3)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from kvtune.costmodel import StepModel, efficiency_for, get_gpu, get_model
from kvtune.costmodel.goodput import goodput
from kvtune.costmodel.requests import Requests
from kvtune.costmodel.simulate import SimConfig, simulate
from kvtune.optimizer.cli import main

H100 = get_gpu("h100-sxm")
CAL = efficiency_for("calibrated", "h100-sxm")
ROOT = Path(__file__).parent.resolve().parent.parent
RAG = str(ROOT / "examples" / "rag-llama3.1-70b.yaml")


def _step(model="llama-3.1-8b", tp=1, util=0.9) -> StepModel:
    return StepModel(get_model(model), H100, tp, efficiency=CAL, gpu_mem_util=util)


def _finite_json(obj) -> bool:
    """Strict JSON (no NaN, no Infinity) round-trips the object."""
    try:
        json.loads(json.dumps(obj, allow_nan=False))
    except ValueError:
        return False
    return True


def test_an_engine_emptied_by_preemption_beside_pinned_prefixes_drops_the_cache():
    # request 0 pins a 480-token prefix; request 1 fits the empty pool but not beside that prefix:
    # its decode outgrows the pool, preemption empties the engine, and the cache must give way
    s = _step(util=0.233)
    pool = s.memory.kv_pool_tokens
    inp = np.array([1000, pool - 600])
    req = Requests(arrival_s=np.array([0.0, 100.0]), input_tokens=inp, output_tokens=np.array([10, 300]),
                   prefix_tokens=np.array([480, 0]), prefix_group=np.array([0, -1]),
                   ttft_slo_s=np.full(2, np.inf), tpot_slo_s=np.full(2, np.inf), class_idx=np.zeros(2, dtype=np.int64))
    res = simulate(s, req, SimConfig(8))
    assert res.rejected == 0 and res.preemptions >= 1
    assert np.isfinite(res.e2e_s).all()
    assert res.output_tokens.sum() == 310


def test_the_rag_example_at_tp2_simulates_and_reports_its_rejections():
    from kvtune.optimizer.workload import load_workload

    spec = load_workload(RAG)
    s = StepModel(get_model(spec.model), H100, 2, efficiency=CAL)
    req = spec.requests(2000, 0, 1.0)
    res = simulate(s, req, SimConfig(8, 1024))
    too_big = (req.input_tokens + req.output_tokens + 1 + 15) // 16 > s.memory.kv_pool_tokens // 16
    assert res.rejected == int(too_big.sum()) > 0
    served = ~np.isinf(res.ttft_s)
    assert served.sum() + res.rejected == len(req)
    assert np.isfinite(res.e2e_s[served]).all()
    pool = s.memory.kv_pool_tokens // 16 * 16
    assert f"against {pool:,} pool tokens" in res.reject_reason
    assert "8,000" in res.reject_reason  # the prompt of the largest rejected request
    summ = res.summary()
    assert _finite_json(summ)
    assert summ["served_requests"] == len(req) - res.rejected
    assert summ["percentiles_over"] == "measured served requests"
    # percentiles over the served measured requests only
    m = res.measured & served
    assert summ["ttft_ms"]["p99"] == pytest.approx(np.percentile(res.ttft_s[m], 99) * 1e3)


def test_goodput_is_zero_with_the_reason_when_rejections_alone_miss_the_target():
    s = _step(util=0.233)
    pool = s.memory.kv_pool_tokens

    def make(rate, n, seed):
        rng = np.random.default_rng(seed)
        arr = np.cumsum(rng.exponential(1.0 / rate, n))
        inp = np.full(n, 200)
        inp[::5] = pool + 100  # a fifth of the requests can never fit
        return Requests(arrival_s=arr, input_tokens=inp, output_tokens=np.full(n, 20),
                        prefix_tokens=np.zeros(n, dtype=np.int64), prefix_group=np.full(n, -1),
                        ttft_slo_s=np.full(n, 0.5), tpot_slo_s=np.full(n, 0.05), class_idx=np.zeros(n, dtype=np.int64))

    g = goodput(s, make, SimConfig(16), 0.9, n_requests=500)
    assert g.goodput_req_s == 0.0
    assert "can never fit the KV pool" in g.reason and "pool tokens" in g.reason
    assert _finite_json(g.to_dict())
    # with a target the served requests can reach, the rejections only lower the attainment
    g = goodput(s, make, SimConfig(16), 0.75, n_requests=500)
    assert g.goodput_req_s > 0 and _finite_json(g.to_dict())


def test_all_requests_rejected_gives_null_percentiles_not_nan():
    s = _step(util=0.233)
    req = Requests.uniform(5, s.memory.kv_pool_tokens + 1, 10)
    res = simulate(s, req, SimConfig(8), arrival="inf")
    assert res.rejected == 5 and res.makespan_s == 0.0
    summ = res.summary()
    assert summ["ttft_ms"]["p90"] is None and _finite_json(summ)


def run_main(args, capsys):
    with pytest.raises(SystemExit) as info:
        main.main(args=args, prog_name="kvtune")
    out = capsys.readouterr()
    return info.value.code, out.out, out.err


def test_simulate_cli_exits_3_with_one_line_for_a_pool_too_small(capsys):
    code, out, err = run_main(["simulate", RAG, "--tp", "2", "--batch-cap", "8", "--chunk-tokens", "1024",
                               "--rate", "1", "--json"], capsys)
    assert code == 3 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and "Traceback" not in err
    assert "can never fit the KV pool" in lines[0] and "pool tokens" in lines[0] and "TP2" in lines[0]
