"""A disaggregated deployment (costmodel.deployment): its physics at vanishing load, the transfer
term, and where it wins or loses against aggregated replicas (issue 14 items 2-3)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from kvtune.costmodel import StepModel, efficiency_for, get_gpu, get_model
from kvtune.costmodel.deployment import (KVLink, Pool, disaggregated_bound_req_s, exposed_transfer_s, kv_link,
                                  simulate_disaggregated)
from kvtune.costmodel.goodput import goodput
from kvtune.costmodel.requests import Requests
from kvtune.costmodel.simulate import SimConfig, simulate

H100 = get_gpu("h100-sxm")
CAL = efficiency_for("calibrated", "h100-sxm")
NVLINK, NETWORK = kv_link(H100, True), kv_link(H100, False)


def _step(model, tp):
    return StepModel(get_model(model), H100, tp, efficiency=CAL)


def _maker(inp, out, ttft=math.inf, tpot=math.inf):
    def make(rate, n, seed):
        rng = np.random.default_rng(seed)
        gaps = rng.exponential(1.0, n)  # common random numbers: the same draws at every rate
        arr = np.zeros(n) if math.isinf(rate) else np.cumsum(gaps) / rate
        return Requests(arrival_s=arr, input_tokens=np.full(n, inp), output_tokens=np.full(n, out),
                        prefix_tokens=np.zeros(n, dtype=np.int64), prefix_group=np.full(n, -1),
                        ttft_slo_s=np.full(n, ttft), tpot_slo_s=np.full(n, tpot), class_idx=np.zeros(n, dtype=np.int64))
    return make


@pytest.mark.parametrize("engine", ["sglang", "trtllm", "vllm"])
def test_at_vanishing_load_ttft_is_prefill_plus_transfer_and_tpot_has_no_prefill(engine):
    p, d = _step("llama-3.1-70b", 4), _step("llama-3.1-70b", 4)
    inp, out, chunk = 6000, 50, 2048
    req = _maker(inp, out)(1e-3, 3, 0)  # 1,000 s apart: each alone in the deployment
    r = simulate_disaggregated(Pool(p, SimConfig(8, chunk), 1), Pool(d, SimConfig(64), 1), req, NETWORK,
                               engine=engine)
    prefill = p.prefill_time_s(inp, 0, chunk)
    per_token_s = p.memory.kv_bytes_per_token / (4 * NETWORK.bytes_per_s)
    if engine == "sglang":  # chunks 1-2 went while chunks 2-3 computed: only the last chunk's KV is left
        transfer = NETWORK.latency_s + (inp - 2 * chunk) * per_token_s
    else:                   # the whole KV after the prompt (NixlConnector pull, TRT-LLM transceiver)
        transfer = NETWORK.latency_s + inp * per_token_s
    front = p.request_overhead_s
    assert r.transfer_s == pytest.approx(transfer, rel=1e-12) and r.kv_wait_s == pytest.approx(transfer, rel=1e-9)
    # every later token is one decode step of a batch of 1, its context growing: no prefill in it
    steps = [d.step_time_s(1, inp + j) for j in range(out)]
    if engine == "vllm":
        # vLLM recomputes the last prompt token on the decode replica: one more (decode-sized) step
        assert r.result.ttft_s == pytest.approx(front + prefill + transfer + steps[0], rel=2e-3)
        assert r.result.tpot_s == pytest.approx(np.mean(steps), rel=2e-3)
    else:
        # the first token comes with the KV: no decode step in TTFT
        assert r.result.ttft_s == pytest.approx(front + prefill + transfer, rel=1e-9)
        assert r.result.tpot_s == pytest.approx(np.mean(steps[:-1]), rel=1e-9)
    assert r.gpus == 8 and r.result.rejected == 0


def test_sglang_hides_the_earlier_chunks_transfer_unless_the_link_is_slower_than_compute():
    p = _step("llama-3.1-70b", 4)
    pool = Pool(p, SimConfig(8, 2048), 1)
    inp = np.array([1000, 2048, 2049, 8192, 16000])
    whole = exposed_transfer_s(pool, pool, inp, NETWORK, per_chunk=False)
    piped = exposed_transfer_s(pool, pool, inp, NETWORK, per_chunk=True)
    assert piped[0] == pytest.approx(whole[0]) and piped[1] == pytest.approx(whole[1])  # one chunk: nothing to hide
    assert np.all(piped[2:] < whole[2:]) and piped[3] == pytest.approx(piped[1])  # 4 full chunks: the last one's
    # a link 1,000x slower than the network: the earlier chunks cannot all go while the next computes
    slow = KVLink(NETWORK.bytes_per_s / 1000, NETWORK.latency_s, "slow")
    w, q = (exposed_transfer_s(pool, pool, inp, slow, per_chunk=b) for b in (False, True))
    chunk_s = p.step_time_s(0, 0.0, 2048, StepModel.chunk_pairs(2048, 0), 0.0)
    assert q[4] == pytest.approx(w[4] - 7 * chunk_s) and q[4] > piped[4]


def test_the_transfer_grows_linearly_with_the_prompt_and_matters_across_nodes():
    p = _step("llama-3.1-70b", 4)
    kv = p.memory.kv_bytes_per_token
    for link in (NVLINK, NETWORK):
        t = link.transfer_s(np.array([1000.0, 2000.0, 8000.0]) * kv, 4) - link.latency_s
        assert t[1] == pytest.approx(2 * t[0]) and t[2] == pytest.approx(8 * t[0])
    wait = {}
    for name, link in (("nvlink", NVLINK), ("network", NETWORK)):
        req = _maker(8000, 20)(1e-3, 2, 0)
        r = simulate_disaggregated(Pool(p, SimConfig(8, 4096), 1), Pool(p, SimConfig(64), 1), req, link,
                                   engine="trtllm")  # the whole KV after the prompt
        wait[name] = float(r.kv_wait_s[0])
    # 8,000 tokens of Llama-3.1-70B's KV (2.6 GB): ~13 ms over 4 x 400 Gb/s, ~9x less over NVLink
    assert wait["network"] > 5 * wait["nvlink"] and wait["network"] > 0.010


def _best_per_gpu(runs):
    return max(g / gpus for g, gpus in runs)


def _disagg_goodput(prefill, decode, make, n=300):
    link = NVLINK  # both pools in one 8-GPU node
    ub = disaggregated_bound_req_s(prefill, decode, float(make(1.0, n, 0).input_tokens.mean()),
                                   float(make(1.0, n, 0).output_tokens.mean()))

    def sim(req, arrival, wf):
        return simulate_disaggregated(prefill, decode, req, link, arrival, 0, wf).result

    g = goodput(decode.step, make, decode.config, 0.9, n_requests=n, rel_tol=0.05, sim=sim, upper_bound_req_s=ub)
    assert g.goodput_req_s <= g.upper_bound_req_s
    return g.goodput_req_s


def test_long_prompts_and_tight_slos_need_fewer_gpus_disaggregated():
    # Llama-3.1-70B, 4,000 / 500 tokens, TTFT <= 600 ms, TPOT <= 40 ms (AIConfigurator's case)
    make = _maker(4000, 500, ttft=0.6, tpot=0.04)
    agg = [(goodput(_step("llama-3.1-70b", tp), make, SimConfig(cap, chunk), 0.9, n_requests=300,
                    rel_tol=0.05).goodput_req_s, tp)
           for tp in (4, 8) for cap in (16, 64, 256) for chunk in (512, 2048, 8192)]
    s4 = _step("llama-3.1-70b", 4)
    dis = _disagg_goodput(Pool(s4, SimConfig(8, 2048), 2), Pool(s4, SimConfig(256, 8192), 1), make)
    # per GPU: 2 prefill TP4 + 1 decode TP4 (12 GPUs) against the best aggregated replica
    assert dis / 12 > 1.05 * _best_per_gpu(agg)


def test_short_prompts_on_a_small_model_stay_aggregated():
    # Llama-3.1-8B, 1,024 / 1,024 tokens: the prefill is a small share of the work
    make = _maker(1024, 1024, ttft=1.0, tpot=0.05)
    agg = [(goodput(_step("llama-3.1-8b", 1), make, SimConfig(cap, chunk), 0.9, n_requests=300,
                    rel_tol=0.05).goodput_req_s, 1) for cap in (64, 256) for chunk in (512, 2048)]
    s = _step("llama-3.1-8b", 1)
    dis = [(_disagg_goodput(Pool(s, SimConfig(8, 2048), x), Pool(s, SimConfig(256, 8192), y), make), x + y)
           for x, y in ((1, 1), (1, 2))]
    assert _best_per_gpu(agg) > 1.2 * _best_per_gpu(dis)


def test_decode_steps_carry_no_prefill_under_load():
    make = _maker(8000, 300)
    req = make(1.5, 300, 0)
    s = _step("llama-3.1-70b", 4)
    agg = simulate(s, req, SimConfig(64, 2048))
    dis = simulate_disaggregated(Pool(s, SimConfig(8, 2048), 1), Pool(s, SimConfig(64), 1), req, NVLINK).result
    # aggregated, 2,048-token prompt chunks ride in the decode steps; disaggregated, never
    assert np.percentile(dis.tpot_s, 90) < 0.8 * np.percentile(agg.tpot_s, 90)
    batch_cap_step = s.step_time_s(64, 64 * 8300.0)
    assert dis.tpot_s.max() <= batch_cap_step


def test_a_prompt_too_big_for_a_pool_is_rejected_with_the_reason():
    p = _step("llama-3.1-70b", 4)
    big = p.memory.kv_pool_tokens + 100
    req = Requests(**{**_maker(1000, 10)(1.0, 4, 0).__dict__, "input_tokens": np.array([1000, big, 1000, 1000])})
    r = simulate_disaggregated(Pool(p, SimConfig(8, 2048), 1), Pool(p, SimConfig(64), 1), req, NVLINK)
    assert r.result.rejected == 1 and np.isinf(r.result.ttft_s[1]) and not r.result.met_slo[1]
    assert "can never fit the KV pool" in r.result.reject_reason
    json.dumps(r.result.summary(), allow_nan=False)


def test_across_nodes_the_transfer_can_break_a_ttft_slo_that_nvlink_meets():
    # Llama-3.1-70B, a 16,000-token prompt, TP4 prefill -> TP4 decode: 5.2 GB of KV over 4 streams
    p = _step("llama-3.1-70b", 4)
    pools = Pool(p, SimConfig(8, 4096), 1), Pool(p, SimConfig(64), 1)
    ttft = {}
    for engine in ("trtllm", "sglang"):
        for name, link in (("nvlink", NVLINK), ("network", NETWORK)):
            req = _maker(16000, 20)(1e-3, 2, 0)
            ttft[engine, name] = float(simulate_disaggregated(*pools, req, link, engine=engine, warmup_frac=0.0).result.ttft_s[0])
    # the whole KV after the prompt: ~26 ms across nodes against ~3 ms over NVLink
    extra = ttft["trtllm", "network"] - ttft["trtllm", "nvlink"]
    assert 0.018 < extra < 0.030
    slo = ttft["trtllm", "nvlink"] + 0.010
    req = _maker(16000, 20, ttft=slo)(1e-3, 2, 0)
    near = simulate_disaggregated(*pools, req, NVLINK, engine="trtllm", warmup_frac=0.0).result
    far = simulate_disaggregated(*pools, req, NETWORK, engine="trtllm", warmup_frac=0.0).result
    assert near.met_slo.all() and not far.met_slo.any()
    # SGLang streams the earlier chunks during the prefill: only the last 3,712 tokens' KV is left
    assert ttft["sglang", "network"] - ttft["sglang", "nvlink"] < 0.3 * extra
