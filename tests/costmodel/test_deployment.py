"""A disaggregated deployment (costmodel.deployment): its physics at vanishing load, the transfer
term, and where it wins or loses against aggregated replicas (issue 14 items 2-3)."""

from __future__ import annotations

import json
import math
import numpy as np
import pytest
from kvtune.costmodel import StepModel, efficiency_for, get_gpu, get_model, InputError, deployment as D
from kvtune.costmodel.deployment import KVLink, Pool, disaggregated_bound_req_s, exposed_transfer_s, kv_link, simulate_disaggregated
from kvtune.costmodel.goodput import goodput, capacity_bound_req_s
from kvtune.costmodel.requests import Requests
from kvtune.costmodel.simulate import SimConfig, simulate, simulate_replica
from kvtune.costmodel.step import SpecConfig

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


# A disaggregated deployment (costmodel.deployment) on cases whose answer is derived by hand: the
# links' figures, the throughput bound from step times, a front end that costs time (the calibrated
# files ship 0, which hides its sign), transfers queueing on one link, pools that reject what the
# other accepts, and the counters. Written against the mutants of costmodel/deployment.py the older
# tests let through (bench/bench_mutation.py, bench/RESULTS-mutation.md).

FRONT_S = 0.02
EFF = efficiency_for("calibrated", "h100-sxm").with_params(request_overhead_s=FRONT_S)
STEP = StepModel(get_model("llama-3.1-8b"), H100, 1, efficiency=EFF)


def requests(inputs, outputs, arrivals) -> Requests:
    n = len(inputs)
    return Requests(arrival_s=np.asarray(arrivals, dtype=float), input_tokens=np.asarray(inputs, dtype=np.int64),
                    output_tokens=np.asarray(outputs, dtype=np.int64), prefix_tokens=np.zeros(n, dtype=np.int64),
                    prefix_group=np.full(n, -1), ttft_slo_s=np.full(n, math.inf), tpot_slo_s=np.full(n, math.inf),
                    class_idx=np.zeros(n, dtype=np.int64))


def test_the_links_from_the_hardware_file():
    assert kv_link(H100, True) == KVLink(450e9, 0.0, "h100-sxm NVLink within a node")      # 900 GB/s both ways
    net = kv_link(H100, False)                                                              # 400 Gb/s, 10 us
    assert (net.bytes_per_s, net.source) == (50e9, "h100-sxm network between nodes")
    assert net.latency_s == pytest.approx(10e-6, rel=1e-12)
    link = KVLink(1e9, 1e-3, "test")
    assert link.transfer_s(np.array([2e9]), 4)[0] == pytest.approx(1e-3 + 0.5, rel=1e-12)
    assert link.transfer_s(np.array([2e9]), 0)[0] == pytest.approx(1e-3 + 2.0, rel=1e-12)   # at least one stream


def test_a_pool_counts_its_gpus_and_wants_a_replica():
    assert Pool(StepModel(get_model("llama-3.1-70b"), H100, 4), SimConfig(8), 3).gpus == 12
    assert Pool(STEP, SimConfig(8), np.int64(2)).gpus == 2
    for bad in (0, True, 1.0):
        with pytest.raises(InputError, match=rf"^deployment: a pool needs replicas >= 1, got {bad!r}$"):
            Pool(STEP, SimConfig(8), bad)


class _Step:
    """Step times linear in every argument, so a dropped or changed argument shows."""

    class memory:
        kv_pool_tokens = 100_000
        kv_bytes_per_token = 100_000.0

    tp = 1
    tokens_per_step = 1.0
    calls: list = []

    def step_time_s(self, n_decode, ctx_sum, tokens=0.0, pairs=0.0, kv_read=0.0):
        self.calls.append((n_decode, ctx_sum, tokens, pairs, kv_read))
        return 0.010 + 5e-4 * n_decode + 1e-6 * ctx_sum + 2e-6 * tokens + 1e-9 * pairs + 3e-7 * kv_read


def test_throughput_bound_by_hand():
    s = _Step()
    # 49,499 pool tokens hold 29 sequences of 1,650 (30 would need 49,500)
    prefill, decode = Pool(s, SimConfig(8, 4096), 3), Pool(s, SimConfig(64, kv_pool_tokens=49_499), 2)
    s.calls.clear()
    got = disaggregated_bound_req_s(prefill, decode, 1500.0, 300.0)
    # prefill: a 4,096-token chunk with no context before it, 4096 x 4097 / 2 pairs
    assert s.calls[0] == (0, 0.0, 4096, 4096 * 4097 / 2, 0.0)
    chunk_s = 0.010 + 2e-6 * 4096 + 1e-9 * 4096 * 4097 / 2
    pre = 3 * 4096 / chunk_s / 1500.0
    dec = 2 * 29 * 1.0 / ((0.010 + 5e-4 * 29 + 1e-6 * 29 * 1650) * 300)
    assert dec == pytest.approx(2 * capacity_bound_req_s(s, 1500.0, 300.0, 64, 0.0, 49_499), rel=1e-12)
    assert dec < pre
    assert got == pytest.approx(dec, rel=1e-12)
    # 300 decode replicas: the prefill pool is the limit
    assert disaggregated_bound_req_s(prefill, Pool(s, SimConfig(64, kv_pool_tokens=49_499), 300), 1500.0, 300.0) == \
        pytest.approx(pre, rel=1e-12)
    # prompts under a token: one token each
    tiny = disaggregated_bound_req_s(prefill, Pool(s, SimConfig(64), 10**6), 0.5, 300.0)
    assert tiny == pytest.approx(3 * 4096 / chunk_s / 1.0, rel=1e-12)


def test_exposed_transfer_by_hand():
    s = _Step()
    pool = Pool(s, SimConfig(8, 2048), 1)
    link = KVLink(1e9, 1e-3, "test")
    inp = np.array([1000, 5000])
    # the whole KV after the prompt: 1,000 and 5,000 tokens x 100 kB over one stream of 1 GB/s
    np.testing.assert_allclose(exposed_transfer_s(pool, pool, inp, link, per_chunk=False), 1e-3 + inp * 1e-4,
                               rtol=1e-12)
    # SGLang: the 5,000-token prompt is 3 chunks; the 2 earlier ones go while the next computes (each at least a
    # 2,048-token chunk's step with no context), so 0.5 s - 2 x chunk_s is left, or the last 904 tokens' 0.0904 s
    s.calls.clear()
    got = exposed_transfer_s(pool, pool, inp, link, per_chunk=True)
    assert s.calls == [(0, 0.0, 2048, 2048 * 2049 / 2, 0.0)]
    chunk_s = 0.010 + 2e-6 * 2048 + 1e-9 * 2048 * 2049 / 2
    np.testing.assert_allclose(got, [1e-3 + 0.1, 1e-3 + max(904 * 1e-4, 0.5 - 2 * chunk_s)], rtol=1e-12)


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_the_front_end_is_paid_once_and_the_engine_times_exclude_it(engine):
    inp, out = 3000, 40
    req = requests([inp] * 2, [out] * 2, [0.0, 1000.0])       # each alone in the deployment
    r = simulate_disaggregated(Pool(STEP, SimConfig(8, 1024), 1), Pool(STEP, SimConfig(64), 1), req,
                               kv_link(H100, True), engine=engine)
    prefill = STEP.prefill_time_s(inp, 0, 1024)
    np.testing.assert_allclose(r.prefill_s, prefill, rtol=1e-9)          # engine time: no front end in it
    transfer = r.transfer_s[0]
    np.testing.assert_allclose(r.kv_wait_s, transfer, rtol=1e-9)          # alone on the link: no queue
    steps = [STEP.step_time_s(1, inp + j) for j in range(out)]
    if engine == "sglang":     # the first token comes with the KV
        ttft, e2e = FRONT_S + prefill + transfer, FRONT_S + prefill + transfer + sum(steps[:out - 1])
    else:                      # vLLM recomputes the last prompt token: its first token is a decode step later
        mean_step = sum(steps) / out
        ttft, e2e = FRONT_S + prefill + transfer + mean_step, FRONT_S + prefill + transfer + sum(steps)
    np.testing.assert_allclose(r.result.ttft_s, ttft, rtol=1e-9)
    np.testing.assert_allclose(r.result.e2e_s, e2e, rtol=1e-9)
    # the counters add the two pools': 3 prompt chunks each, then the decode steps
    assert r.result.steps == 2 * 3 + 2 * (out - 1 if engine == "sglang" else out)
    assert r.result.events >= 2 * 3 + 2
    assert r.gpus == 2 and r.link == kv_link(H100, True)


def test_vllm_one_token_outputs_finish_at_their_first_token():
    req = requests([2000], [1], [0.0])
    r = simulate_disaggregated(Pool(STEP, SimConfig(8, 4096), 1), Pool(STEP, SimConfig(64), 1), req,
                               kv_link(H100, True), engine="vllm")
    assert r.result.ttft_s[0] == pytest.approx(r.result.e2e_s[0], rel=1e-12)
    assert r.result.ttft_s[0] == pytest.approx(FRONT_S + r.prefill_s[0] + r.transfer_s[0]
                                               + STEP.step_time_s(1, 2000), rel=1e-9)


def test_transfers_into_one_decode_replica_queue_on_its_link():
    # 2 prefill replicas finish two equal prompts at once; one decode replica takes the KV one at a time
    slow = KVLink(1e9, 1e-3, "slow link")
    req = requests([2000, 2000], [10, 10], [0.0, 0.0])
    r = simulate_disaggregated(Pool(STEP, SimConfig(8, 4096), 2), Pool(STEP, SimConfig(64), 1), req, slow,
                               arrival="inf", engine="trtllm")
    x = 1e-3 + 2000 * STEP.memory.kv_bytes_per_token / 1e9
    np.testing.assert_allclose(r.transfer_s, [x, x], rtol=1e-12)
    np.testing.assert_allclose(r.kv_wait_s, [x, 2 * x], rtol=1e-9)        # in arrival order
    assert r.result.measured.all()                                         # offline: no warm-up left out
    # three decode replicas, three links: nobody waits
    three = simulate_disaggregated(Pool(STEP, SimConfig(8, 4096), 3), Pool(STEP, SimConfig(64), 3),
                                   requests([2000] * 3, [10] * 3, [5.0, 6.0, 7.0]), slow, arrival="inf",
                                   engine="trtllm")
    np.testing.assert_allclose(three.kv_wait_s, [x, x, x], rtol=1e-9)
    # offline: every request counts from t = 0, whatever arrival times it carries; each is alone on its replicas
    alone = FRONT_S + STEP.prefill_time_s(2000, 0, 4096) + x
    np.testing.assert_allclose(three.result.ttft_s, alone, rtol=1e-9)
    np.testing.assert_allclose(three.result.e2e_s, alone + sum(STEP.step_time_s(1, 2000 + j) for j in range(9)),
                               rtol=1e-9)


def test_prompts_done_together_transfer_in_arrival_order_among_others():
    # 2 prefill replicas: the short prompts (odd requests) finish in one step, the long ones (even) one by one;
    # one decode replica takes them over one slow link, the short ones in their arrival order
    slow = KVLink(1e9, 1e-3, "slow link")
    n = 60
    inputs = [3000 if i % 2 == 0 else 100 for i in range(n)]
    r = simulate_disaggregated(Pool(STEP, SimConfig(64, 8192), 2), Pool(STEP, SimConfig(128), 1),
                               requests(inputs, [3] * n, [0.0] * n), slow, arrival="inf", engine="trtllm")
    odd = np.arange(1, n, 2)
    assert np.all(r.prefill_s[odd] == r.prefill_s[1])
    arrive = r.prefill_s[odd] + r.kv_wait_s[odd]
    assert np.all(np.diff(arrive) > 0)


def test_many_prompts_done_in_one_step_transfer_in_arrival_order():
    slow = KVLink(1e9, 1e-3, "slow link")
    n = 48
    req = requests([100] * n, [5] * n, [0.0] * n)                          # one prefill step does them all
    r = simulate_disaggregated(Pool(STEP, SimConfig(64, 8192), 1), Pool(STEP, SimConfig(64), 1), req, slow,
                               arrival="inf", engine="trtllm")
    assert np.all(r.prefill_s == r.prefill_s[0])
    x = 1e-3 + 100 * STEP.memory.kv_bytes_per_token / 1e9
    np.testing.assert_allclose(r.kv_wait_s, x * np.arange(1, n + 1), rtol=1e-9)
    assert r.result.measured.all() and r.result.arrival == "inf"     # offline: no warm-up left out


def test_a_prompt_only_one_pool_can_hold_is_rejected_and_the_others_are_served():
    # the prefill pool holds 2,000 tokens: the 5,000-token prompt (request 1) never fits it
    prefill = Pool(STEP, SimConfig(8, 1024, kv_pool_tokens=2_000), 1)
    decode = Pool(STEP, SimConfig(64), 3)                                  # request 1 would go to replica 1
    req = requests([500, 5000, 500], [20, 20, 20], [0.0, 10.0, 20.0])
    r = simulate_disaggregated(prefill, decode, req, kv_link(H100, True), engine="sglang")
    assert r.result.rejected == 1 and r.result.reject_reason.startswith("prefill pool: ")
    assert np.isinf(r.result.ttft_s[1]) and np.isinf(r.prefill_s[1]) and np.isinf(r.transfer_s[1])
    assert np.isfinite(r.result.ttft_s[[0, 2]]).all() and np.isfinite(r.result.e2e_s[[0, 2]]).all()
    # now the decode pool is the small one: the long prompt is computed, then cannot be held
    prefill, decode = Pool(STEP, SimConfig(8, 1024), 1), Pool(STEP, SimConfig(64, kv_pool_tokens=2_000), 1)
    r = simulate_disaggregated(prefill, decode, req, kv_link(H100, True), engine="sglang")
    assert r.result.rejected == 1 and r.result.reject_reason.startswith("decode pool: ")
    assert np.isinf(r.result.ttft_s[1]) and not r.result.met_slo[1] and np.isinf(r.kv_wait_s[1])
    assert np.isinf(r.prefill_s[1]) and np.isinf(r.transfer_s[1])      # computed, but never served
    assert r.result.arrival == "trace"
    assert np.isfinite(r.result.ttft_s[[0, 2]]).all()
    # both pools reject one each: both reasons, in pool order
    both = simulate_disaggregated(Pool(STEP, SimConfig(8, 1024, kv_pool_tokens=2_000), 1),
                                  Pool(STEP, SimConfig(64, kv_pool_tokens=1_500), 1),
                                  requests([500, 5000, 1700], [20, 20, 20], [0.0, 10.0, 20.0]), kv_link(H100, True))
    assert both.result.rejected == 2
    prefill_reason, decode_reason = both.result.reject_reason.split("; ")
    assert prefill_reason.startswith("prefill pool: ") and decode_reason.startswith("decode pool: ")


def test_a_small_decode_pool_preempts_and_the_count_reaches_the_result():
    req = requests([1000] * 6, [400] * 6, [0.0] * 6)
    r = simulate_disaggregated(Pool(STEP, SimConfig(8, 8192), 1), Pool(STEP, SimConfig(64, kv_pool_tokens=4_000), 1),
                               req, kv_link(H100, True), arrival="inf", engine="sglang")
    assert r.result.preemptions > 0 and r.result.rejected == 0


def test_the_same_seed_gives_the_same_deployment_run():
    spec = StepModel(get_model("llama-3.1-8b"), H100, 1, efficiency=EFF, speculation=SpecConfig(3, 0.6))
    req = requests([800] * 12, [60] * 12, np.arange(12) * 0.05)
    pools = Pool(STEP, SimConfig(8, 2048), 1), Pool(spec, SimConfig(64), 1)

    def run(**kw):
        return simulate_disaggregated(*pools, req, kv_link(H100, True), engine="sglang", **kw).result.e2e_s

    np.testing.assert_array_equal(run(), run(seed=0))     # the default seed is 0
    np.testing.assert_array_equal(run(seed=3), run(seed=3))
    assert not np.array_equal(run(seed=0), run(seed=3))   # the seed drives the draft's acceptance


def test_bad_calls_say_what_is_wrong():
    pools = Pool(STEP, SimConfig(8), 1), Pool(STEP, SimConfig(8), 1)
    with pytest.raises(InputError, match=r"^a disaggregated deployment simulates arrival trace or inf, got 'closed'$"):
        simulate_disaggregated(*pools, requests([10], [2], [0.0]), kv_link(H100, True), arrival="closed")
    with pytest.raises(InputError, match=r"^simulate: no requests$"):
        simulate_disaggregated(*pools, requests([], [], []), kv_link(H100, True))
    one = simulate_disaggregated(*pools, requests([10], [2], [0.0]), kv_link(H100, True))
    assert one.result.rejected == 0 and np.isfinite(one.result.e2e_s[0])


# costmodel.deployment on what the full mutation run of the module (bench/bench_mutation.py) found
# untested: the throughput bound of a pool that caches prefixes (the prompt tokens it computes, and
# the tokens a decode replica holds once), and the router's round robin in arrival order when
# arrivals tie (the trace's order breaks the tie). Every figure by hand from the docstrings.

INP, OUT = 1500.0, 300.0
CTX = INP + OUT / 2                      # 1,650: a sequence half-way through
POOL = 49_499                            # decode pool tokens: 29 sequences of 1,650, 30 of 1,649
CHUNK = 4096
CHUNK_S = 0.010 + 2e-6 * CHUNK + 1e-9 * CHUNK * (CHUNK + 1) / 2    # _Step's full chunk, no context


def _dec(replicas: int, b: int) -> float:
    """Decode pool bound with b sequences per replica: b / (T(b) x output) each (_Step's T)."""
    return replicas * b / ((0.010 + 5e-4 * b + 1e-6 * b * CTX) * OUT)


def _pools(prefill_caching: bool, decode_caching: bool, prefill_replicas: int = 3, decode_replicas: int = 2):
    s = _Step()
    return (Pool(s, SimConfig(8, CHUNK, prefix_caching=prefill_caching), prefill_replicas),
            Pool(s, SimConfig(512, kv_pool_tokens=POOL, prefix_caching=decode_caching), decode_replicas))


@pytest.mark.parametrize("uncached, todo", [(300.0, 300.0),    # 1,200 of the 1,500 prompt tokens cached
                                            (-5.0, 0.0),       # clamped at nothing to compute (one token's time)
                                            (0.5, 0.5),        # under a token: one token's time
                                            (2000.0, INP)])    # more than the prompt: the prompt
def test_a_caching_prefill_pool_is_bounded_by_the_tokens_it_computes(uncached, todo):
    prefill, _ = _pools(True, False)
    huge_decode = Pool(_Step(), SimConfig(512, kv_pool_tokens=POOL), 10**6)
    got = disaggregated_bound_req_s(prefill, huge_decode, INP, OUT, mean_uncached_tokens=uncached)
    assert got == pytest.approx(3 * CHUNK / CHUNK_S / max(todo, 1.0), rel=1e-12)


@pytest.mark.parametrize("uncached, b", [(300.0, 109),     # own = 1,650 - 1,200 = 450: 49,499 // 450 = 109
                                         (-5.0, 329),      # the whole prompt shared: own 150
                                         (0.5, 328),       # shared 1,499.5: own 150.5 -> 328 (151 -> 327)
                                         (2000.0, 29)])    # nothing shared: own 1,650
def test_a_caching_decode_pool_holds_the_cached_tokens_once(uncached, b):
    _, decode = _pools(True, True)
    huge_prefill = Pool(_Step(), SimConfig(8, CHUNK, prefix_caching=True), 10**6)
    got = disaggregated_bound_req_s(huge_prefill, decode, INP, OUT, mean_uncached_tokens=uncached)
    assert got == pytest.approx(_dec(2, b), rel=1e-12)


def test_what_a_pool_does_not_cache_counts_whole():
    # the prefill pool caches, the decode pool does not: each decode sequence holds its whole context (29 fit;
    # holding one token less would fit 30)
    huge_prefill = Pool(_Step(), SimConfig(8, CHUNK, prefix_caching=True), 10**6)
    _, decode = _pools(True, False)
    assert disaggregated_bound_req_s(huge_prefill, decode, INP, OUT, mean_uncached_tokens=300.0) == \
        pytest.approx(_dec(2, 29), rel=1e-12)
    # the prefill pool does not cache: it computes whole prompts, and then nothing counts as shared downstream
    prefill, decode = _pools(False, True)
    huge_decode = Pool(_Step(), SimConfig(512, kv_pool_tokens=POOL), 10**6)
    assert disaggregated_bound_req_s(prefill, huge_decode, INP, OUT, mean_uncached_tokens=300.0) == \
        pytest.approx(3 * CHUNK / CHUNK_S / INP, rel=1e-12)
    huge_prefill = Pool(_Step(), SimConfig(8, CHUNK, prefix_caching=False), 10**6)
    assert disaggregated_bound_req_s(huge_prefill, decode, INP, OUT, mean_uncached_tokens=300.0) == \
        pytest.approx(_dec(2, 29), rel=1e-12)
    # no figure given: the whole prompt either way
    prefill, decode = _pools(True, True)
    assert disaggregated_bound_req_s(prefill, decode, INP, OUT) == \
        pytest.approx(min(3 * CHUNK / CHUNK_S / INP, _dec(2, 29)), rel=1e-12)


def test_tied_arrivals_go_round_robin_in_the_traces_order():
    """Round robin in arrival order: requests arriving together are dealt in the trace's order (a
    stable sort; the trace here is out of order, which the Requests contract does not ask for but
    both the router and the replica sort away), so of 30 requests at t = 0 (the even ones of 60;
    the odd ones come 100 s later) the
    k-th goes to prefill replica k mod 2 as its (k div 2)-th prompt. Each replica computes one
    prompt per step (batch cap 1, a chunk that holds the prompt): the k-th is done after
    (k div 2 + 1) prefill steps."""
    n = 60
    arrivals = [0.0 if i % 2 == 0 else 100.0 for i in range(n)]
    r = simulate_disaggregated(Pool(STEP, SimConfig(1, 4096), 2), Pool(STEP, SimConfig(64), 2),
                               requests([2000] * n, [4] * n, arrivals), KVLink(1e12, 0.0, "fast"), engine="trtllm")
    p = STEP.prefill_time_s(2000, 0, 4096)
    k = np.arange(n // 2)
    np.testing.assert_allclose(r.prefill_s[0::2], (k // 2 + 1) * p, rtol=1e-9)
    np.testing.assert_allclose(r.prefill_s[1::2], (k // 2 + 1) * p, rtol=1e-9)   # the later ones likewise
    assert math.isfinite(r.result.e2e_s.max())


# costmodel.deployment's prefill pool and its memo, on what the round-5 full mutation run of the
# module (bench/mutation-runs/r5-step-deployment-all-1337.json) found untested: the time a prompt is
# done on its prefill replica (engine time: the front end excluded), every replica of the round robin
# served even with a single request, the pool's counters as the sum of its replicas', and the memo
# (``_prefill_pool``): it answers exactly as a fresh simulation, computes each input once, tells apart
# inputs that differ in anything it reads, hands out copies, works for a model it cannot weakly key,
# and holds at most ``_PREFILL_MEMO_MAX`` entries per model. Figures by hand from the docstrings, or by
# a second derivation from ``simulate_replica`` (the replica each share runs on).



def _step_memo_survivors() -> StepModel:
    """A fresh model per test: the memo is keyed by the model object, so nothing carries over."""
    return StepModel(get_model("llama-3.1-8b"), H100, 1, efficiency=EFF)


def _prompt_s(step, tokens_per_prompt: list[int]) -> float:
    """One step computing whole prompts (each under a chunk, no cached context): the tokens and the
    attention pairs of each prompt with itself, added."""
    pairs = sum(StepModel.chunk_pairs(t, 0) for t in tokens_per_prompt)
    return step.step_time_s(0, 0.0, sum(tokens_per_prompt), pairs, 0.0)


def _args(req: Requests, arrival: str = "trace"):
    arr = req.arrival_s.astype(float) if arrival == "trace" else np.zeros(len(req))
    return arr, np.argsort(arr, kind="stable")


def _same(a, b) -> None:
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
    assert a[2:] == b[2:]


# ---- the prefill pool computed ----------------------------------------------------------------------

def test_a_lone_prompt_is_ready_one_prompt_step_after_its_arrival_s():
    # engine time: the prompt arrives at 5 s and is done one step later; the front end's 20 ms
    # (request_overhead_s) is the user's, not the engine's, so it is not in the ready time
    s = _step_memo_survivors()
    assert s.request_overhead_s == FRONT_S > 0
    req = requests([1000], [7], [5.0])
    ready, rej, pre, steps, _, reasons = D._simulate_prefill_pool(Pool(s, SimConfig(8, CHUNK), 1), req, *_args(req),
                                                                  "trace", 0)
    assert ready[0] == pytest.approx(5.0 + _prompt_s(s, [1000]), rel=1e-12)
    assert (rej.tolist(), pre, steps, reasons) == ([False], 0, 1, [])


def test_every_replica_of_the_round_robin_serves_even_a_single_request():
    # three prompts at t=0 over two replicas: replica 0 takes the 1st and 3rd (one step of both),
    # replica 1 the 2nd alone (one step); one step each, nothing preempted (nothing decodes there)
    s = _step_memo_survivors()
    req = requests([1000, 1000, 1000], [50, 60, 70], [0.0, 0.0, 0.0])
    arr, order = _args(req)
    ready, rej, pre, steps, events, reasons = D._simulate_prefill_pool(Pool(s, SimConfig(8, CHUNK), 2), req, arr,
                                                                       order, "trace", 0)
    two, one = _prompt_s(s, [1000, 1000]), _prompt_s(s, [1000])
    assert ready == pytest.approx([two, one, two], rel=1e-12)
    assert (rej.tolist(), pre, steps, reasons) == ([False] * 3, 0, 2, [])
    # the loop turns: the replicas', added (each serves its share with one output token)
    ev = 0
    for idx in (np.array([0, 2]), np.array([1])):
        sub = requests(req.input_tokens[idx], [1] * idx.size, req.arrival_s[idx])
        ev += simulate_replica(s, sub, SimConfig(8, CHUNK), "trace", None, 0, 0.0, naive=False).events
    assert events == ev and events >= 2      # each replica turns its loop at least once


def test_a_long_prompt_is_simulated_in_closed_form_chunk_runs_and_its_counters_add_up():
    # two 20,000-token prompts at t=0 over two replicas, 512-token chunks: each replica computes
    # ceil(20,000 / 512) = 40 chunks (39 full, one of 32), one step each: 80 steps in the pool. Its
    # loop turns are its replicas' as ``simulate`` runs them (runs of identical chunks summed in
    # closed form, naive=False), so far fewer turns than steps; the times are the replicas' too
    s = _step_memo_survivors()
    cfg = SimConfig(8, 512)
    req = requests([20_000, 20_000], [9, 9], [0.0, 0.0])
    ready, rej, pre, steps, events, _ = D._simulate_prefill_pool(Pool(s, cfg, 2), req, *_args(req), "trace", 0)
    assert (rej.tolist(), pre, steps) == ([False, False], 0, 80)
    lone = simulate_replica(s, requests([20_000], [1], [0.0]), cfg, "trace", None, 0, 0.0, naive=False)
    assert (lone.steps, events) == (40, 2 * lone.events)
    assert events < steps
    assert ready.tolist() == [lone.e2e_s[0] - FRONT_S] * 2


# ---- the memo -----------------------------------------------------------------------------------------

@pytest.fixture
def counted(monkeypatch):
    """Counts the prefill pools actually simulated (the memo's misses)."""
    calls = []
    real = D._simulate_prefill_pool

    def spy(*a):
        calls.append(a)
        return real(*a)

    monkeypatch.setattr(D, "_simulate_prefill_pool", spy)
    return calls


def _base() -> Requests:
    return requests([900, 1200, 700, 1500], [5, 5, 5, 5], [0.0, 0.004, 0.050, 0.100])   # replica 0: the 1st and 3rd


def test_the_memo_answers_as_a_fresh_simulation_and_simulates_each_input_once(counted):
    s, req = _step_memo_survivors(), _base()
    pool = Pool(s, SimConfig(8, CHUNK), 2)
    first = D._prefill_pool(pool, req, *_args(req), "trace", 0)
    again = D._prefill_pool(pool, req, *_args(req), "trace", 0)
    assert len(counted) == 1                  # the second call is a hit
    assert len(D._PREFILL_MEMO[s]) == 1       # kept per model
    _same(first, again)
    _same(again, D._simulate_prefill_pool(pool, req, *_args(req), "trace", 0))


def test_a_hit_shares_nothing_mutable_with_the_caller():
    s = _step_memo_survivors()
    req = requests([1000, 50_000_000 // 10], [1, 1], [0.0, 0.0])   # the 2nd never fits: rejected, with a reason
    pool = Pool(s, SimConfig(8, CHUNK), 1)
    got = D._prefill_pool(pool, req, *_args(req), "trace", 0)
    assert got[1].tolist() == [False, True] and got[5]
    want = D._simulate_prefill_pool(pool, req, *_args(req), "trace", 0)
    got[0][:] = -1.0
    got[1][:] = False
    got[5].append("scribbled")
    _same(D._prefill_pool(pool, req, *_args(req), "trace", 0), want)


def _variants():
    """(what differs, the requests the memo is primed with, the requests asked, replicas, config, arrival):
    each asked input differs from the primed one in one thing the prefill pool reads."""
    base = _base()
    n = len(base)

    def w(**kw):
        cols = dict(arrival_s=base.arrival_s, input_tokens=base.input_tokens, output_tokens=base.output_tokens,
                    prefix_tokens=base.prefix_tokens, prefix_group=base.prefix_group, ttft_slo_s=base.ttft_slo_s,
                    tpot_slo_s=base.tpot_slo_s, class_idx=base.class_idx)
        cols.update(kw)
        return Requests(**cols)

    cfg = SimConfig(8, CHUNK, prefix_caching=True)
    pre = np.array([600, 0, 600, 0])
    shared = w(prefix_tokens=pre, prefix_group=np.array([3, -1, 3, -1]))     # both on replica 0, one after the other
    return [
        ("replicas", base, base, 1, cfg, "trace"),
        ("arrival_s", base, w(arrival_s=base.arrival_s * 3), 2, cfg, "trace"),
        ("input_tokens", base, w(input_tokens=base.input_tokens + 500), 2, cfg, "trace"),
        ("prefix_tokens", base, shared, 2, cfg, "trace"),
        ("prefix_group", shared, w(prefix_tokens=pre, prefix_group=np.array([3, -1, 4, -1])), 2, cfg, "trace"),
        ("config", base, base, 2, SimConfig(8, 512, prefix_caching=True), "trace"),
        ("arrival", base, base, 2, cfg, "inf"),
        ("n", base, requests(base.input_tokens[:n - 1], [5] * (n - 1), base.arrival_s[:n - 1]), 2, cfg, "trace"),
    ]


@pytest.mark.parametrize("what, primed, req, replicas, cfg, arrival", _variants(), ids=[v[0] for v in _variants()])
def test_the_memo_tells_apart_inputs_that_differ_in_anything_it_reads(what, primed, req, replicas, cfg, arrival):
    # primed with the other inputs on the same model, the asked ones must get their own simulation
    s = _step_memo_survivors()
    prime_pool = Pool(s, SimConfig(8, CHUNK, prefix_caching=True), 2)
    D._prefill_pool(prime_pool, primed, *_args(primed), "trace", 0)
    pool = Pool(s, cfg, replicas)
    got = D._prefill_pool(pool, req, *_args(req, arrival), arrival, 0)
    want = D._simulate_prefill_pool(pool, req, *_args(req, arrival), arrival, 0)
    _same(got, want)
    other = D._simulate_prefill_pool(prime_pool, primed, *_args(primed), "trace", 0)[0]
    assert not (len(other) == len(want[0]) and np.array_equal(other, want[0])),\
        f"the {what} must change the answer for this test to mean anything"


class _Unweakable:
    """A step model that cannot be weakly referenced (no __weakref__ slot): the memo cannot key it."""

    __slots__ = ("_m",)

    def __init__(self, m):
        object.__setattr__(self, "_m", m)

    def __getattr__(self, name):
        return getattr(object.__getattribute__(self, "_m"), name)


def test_a_model_the_memo_cannot_key_is_simulated_each_time(counted):
    s = _Unweakable(_step_memo_survivors())
    req = _base()
    pool = Pool(s, SimConfig(8, CHUNK), 2)
    want = D._simulate_prefill_pool(pool, req, *_args(req), "trace", 0)
    counted.clear()
    for _ in range(2):
        _same(D._prefill_pool(pool, req, *_args(req), "trace", 0), want)
    assert len(counted) == 2


def test_the_memo_holds_at_most_its_max_entries_per_model(monkeypatch):
    monkeypatch.setattr(D, "_PREFILL_MEMO_MAX", 2)
    s, base = _step_memo_survivors(), _base()
    pool = Pool(s, SimConfig(8, CHUNK), 2)
    for k in range(5):                        # five different inputs (the arrivals shifted by k ms)
        req = requests(base.input_tokens, base.output_tokens, base.arrival_s + k * 1e-3)
        _same(D._prefill_pool(pool, req, *_args(req), "trace", 0),
              D._simulate_prefill_pool(pool, req, *_args(req), "trace", 0))
        assert 1 <= len(D._PREFILL_MEMO[s]) <= 2
