"""A disaggregated deployment (costmodel.deployment) on cases whose answer is derived by hand: the
links' figures, the throughput bound from step times, a front end that costs time (the calibrated
files ship 0, which hides its sign), transfers queueing on one link, pools that reject what the
other accepts, and the counters. Written against the mutants of costmodel/deployment.py the older
tests let through (bench/bench_mutation.py, bench/RESULTS-mutation.md)."""

import math

import numpy as np
import pytest

from kvtune.costmodel import InputError, StepModel, efficiency_for, get_gpu, get_model
from kvtune.costmodel.deployment import (KVLink, Pool, disaggregated_bound_req_s, exposed_transfer_s, kv_link,
                                         simulate_disaggregated)
from kvtune.costmodel.goodput import capacity_bound_req_s
from kvtune.costmodel.requests import Requests
from kvtune.costmodel.simulate import SimConfig
from kvtune.costmodel.step import SpecConfig

H100 = get_gpu("h100-sxm")
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
