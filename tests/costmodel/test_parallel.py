"""Issue 16 item 1: the parallelism terms (costmodel/parallel.py, their use in StepModel and
plan_memory), each checked against arithmetic done by hand from the datasheet and model figures."""

from __future__ import annotations

import math
import pytest
from kvtune.costmodel import StepModel, get_gpu, get_model
from kvtune.costmodel.calibration import efficiency_for
from kvtune.costmodel.errors import DoesNotFit, InputError
from kvtune.costmodel.memory import attention_weight_bytes, plan_memory, weight_bytes
from kvtune.costmodel.parallel import Parallel, all_to_all_s, allreduce_s, expert_load_imbalance, hop_s, micro_batches

H100 = get_gpu("h100-sxm")
CAL = efficiency_for("calibrated", "h100-sxm")


# ---- the pure terms ---------------------------------------------------------------------------
def test_allreduce_inside_a_node_is_the_ring():
    # 8 GPUs, 1 MB, 100 GB/s links, 20 us: 20 us + 2 x 7/8 x 1e6 / 1e11 = 37.5 us
    assert allreduce_s(1e6, 8, 8, 1e11, 20e-6, 5e10, 10e-6) == pytest.approx(20e-6 + 17.5e-6)
    assert allreduce_s(1e6, 1, 8, 1e11, 20e-6, 5e10, 10e-6) == 0.0


def test_allreduce_across_nodes_adds_the_network_share():
    # 16 GPUs on 2 nodes: the NVLink ring above, plus 10 us + 2 x 1/2 x (1e6 / 8) / 5e10 = 2.5 us
    t = allreduce_s(1e6, 16, 8, 1e11, 20e-6, 5e10, 10e-6)
    assert t == pytest.approx(37.5e-6 + 10e-6 + 2.5e-6)
    # 32 GPUs on 4 nodes: 2 x 3/4 x 125 kB / 50 GB/s = 3.75 us
    assert allreduce_s(1e6, 32, 8, 1e11, 20e-6, 5e10, 10e-6) == pytest.approx(37.5e-6 + 10e-6 + 3.75e-6)


def test_all_to_all_inside_and_across_nodes():
    # 8 GPUs in a node: 7/8 of 1 MB over NVLink
    assert all_to_all_s(1e6, 8, 8, 1e11, 20e-6, 5e10, 10e-6) == pytest.approx(20e-6 + 8.75e-6)
    # 16 GPUs on 2 nodes: 7/16 over NVLink (24.375 us) in parallel with 8/16 over the network (20 us)
    assert all_to_all_s(1e6, 16, 8, 1e11, 20e-6, 5e10, 10e-6) == pytest.approx(max(20e-6 + 4.375e-6, 10e-6 + 10e-6))
    assert all_to_all_s(1e7, 16, 8, 1e11, 20e-6, 5e10, 10e-6) == pytest.approx(10e-6 + 1e-4)  # network bound
    assert all_to_all_s(1e6, 1, 8, 1e11, 20e-6, 5e10, 10e-6) == 0.0


def test_hop_and_micro_batches():
    assert hop_s(1e6, 1e11, 5e-6) == pytest.approx(15e-6)
    assert micro_batches(4, 1) == 1 and micro_batches(4, 3) == 3 and micro_batches(4, 100) == 4
    assert micro_batches(4, 0) == 1  # a lone prefill


def test_expert_load_imbalance():
    assert expert_load_imbalance(100, 8, 1) == 1.0
    # 1000 tokens x top-8 over 16 GPUs: mean 500 per GPU, busiest 1 + sqrt(2 ln 16 / 500)
    assert expert_load_imbalance(1000, 8, 16) == pytest.approx(1 + math.sqrt(2 * math.log(16) / 500))
    # one token: 8 assignments over 16 GPUs cannot exceed 16x the mean
    assert expert_load_imbalance(1, 8, 16) <= 16
    assert expert_load_imbalance(10, 8, 16) > expert_load_imbalance(1000, 8, 16) > 1


def test_layout_checks_and_counts():
    p = Parallel(tp=8, pp=4, gpus_per_node=8)
    assert p.gpus == 32 and p.nodes == 4 and p.tp_nodes == 1 and p.cross_node_hops == 3
    assert Parallel(tp=4, pp=4, gpus_per_node=8).cross_node_hops == 1   # stages 0,1 | 2,3
    assert Parallel(tp=16, gpus_per_node=8).tp_nodes == 2
    for bad in (dict(tp=8, ep=4), dict(tp=1, dp_attention=True), dict(tp=12, gpus_per_node=8), dict(pp=0)):
        with pytest.raises(InputError):
            Parallel(**bad)


# ---- memory -----------------------------------------------------------------------------------
def test_pipeline_stages_split_weights_and_kv():
    m = get_model("llama-3.1-405b")
    one = plan_memory(m, H100, 8, "bf16", "bf16", 0.9, 0.0, Parallel(tp=8, pp=2))
    w = weight_bytes(m, "bf16")
    assert one.weight_bytes_per_gpu == pytest.approx(w / 16)
    kv_gpu = m.n_layers * 2 * 1 * m.head_dim * 2 / 2          # 8 KV heads over TP 8, half the layers
    assert one.kv_bytes_per_token_per_gpu == pytest.approx(kv_gpu)
    assert one.kv_pool_tokens == math.floor((80e9 * 0.9 - w / 16) / kv_gpu)


def test_weights_that_do_not_fit_name_gpus_not_flags():
    with pytest.raises(DoesNotFit) as exc:
        plan_memory(get_model("llama-3.1-405b"), H100, 8, "bf16", "bf16")
    msg = str(exc.value)
    assert "--tp" not in msg and "at least 16 GPUs per replica (tensor x pipeline parallel)" in msg


def test_dp_attention_replicates_attention_weights_and_stops_replicating_the_latent():
    m = get_model("deepseek-v3")
    tp = plan_memory(m, H100, 16, "fp8", "bf16", 0.9, 0.0, Parallel(tp=16, gpus_per_node=8))
    dp = plan_memory(m, H100, 16, "fp8", "bf16", 0.9, 0.0, Parallel(tp=16, ep=16, dp_attention=True))
    w, a = weight_bytes(m, "fp8"), attention_weight_bytes(m, "fp8")
    assert dp.weight_bytes_per_gpu == pytest.approx((w - a) / 16 + a)
    kv = m.kv_bytes_per_token("bf16")                     # the whole latent, every layer
    assert tp.kv_bytes_per_token_per_gpu == dp.kv_bytes_per_token_per_gpu == kv
    assert tp.kv_pool_tokens == math.floor((72e9 - w / 16) / kv)
    assert dp.kv_pool_tokens == 16 * math.floor((72e9 - (w - a) / 16 - a) / kv)


# ---- step times -------------------------------------------------------------------------------
def test_pipeline_round_and_bubble_by_hand():
    """Ideal model (no communication): a round is pp stage-times of a 1/M micro-batch, M = min(pp, B).
    At B = 1 the stages idle half the time (bubble 1/2): the token costs what one TP-4 GPU group
    reading all the weights would; at B = 2 both micro-batches are in flight for the same time."""
    m = get_model("llama-3.1-70b")
    sm = StepModel(m, H100, 4, parallel=Parallel(tp=4, pp=2))
    w_gpu = weight_bytes(m, "bf16") / 8
    kv_gpu = m.kv_bytes_per_token_per_gpu("bf16", 4) / 2
    bw = H100.hbm_bytes_per_s
    ctx = 1000
    for b, mb in ((1, 1), (2, 2), (64, 2)):
        stage = (w_gpu + (b / mb) * (ctx + 1) * kv_gpu) / bw        # memory bound at these batches
        bd = sm.decode_step(b, ctx)
        assert bd.bound == "bandwidth"
        assert bd.time_s == pytest.approx(2 * stage, rel=1e-9)
    assert sm.decode_step(2, ctx).time_s == pytest.approx(sm.decode_step(1, ctx).time_s, rel=2e-3)


def test_pipeline_hops_cross_the_network_between_nodes():
    m = get_model("llama-3.1-405b")
    par = Parallel(tp=8, pp=2, gpus_per_node=8)
    sm = StepModel(m, H100, 8, "bf16", "bf16", CAL, parallel=par)
    b, ctx = 64, 2000
    m_b = 2                                                     # micro-batches
    tok = b / m_b
    hop = H100.network_latency_s + tok * m.hidden * 2 / (H100.network_bytes_per_s * CAL.link_efficiency)
    assert sm.hops_s(tok) == pytest.approx(hop)
    # the whole round: 2 stage-times (each: its 63 layers' all-reduces of 32 tokens) + one hop + overhead
    bd = sm.decode_step(b, ctx)
    ar = (m.n_layers * 2 / 2) * (CAL.allreduce_latency_s
                                 + 2 * 7 / 8 * tok * m.hidden * 2 / (H100.link_bytes_per_s * CAL.link_efficiency))
    assert bd.comm_s == pytest.approx(2 * ar + hop, rel=1e-9)


def test_tensor_parallel_across_nodes_pays_the_network():
    m = get_model("llama-3.1-405b")
    sm = StepModel(m, H100, 16, "bf16", "bf16", CAL, parallel=Parallel(tp=16, gpus_per_node=8))
    n = 32
    link = H100.link_bytes_per_s * CAL.link_efficiency
    net = H100.network_bytes_per_s * CAL.link_efficiency
    s = m.hidden * 2 * n
    one = CAL.allreduce_latency_s + 2 * 7 / 8 * s / link + H100.network_latency_s + 2 * 1 / 2 * (s / 8) / net
    assert sm.decode_step(n, 1000).comm_s == pytest.approx(2 * m.n_layers * one, rel=1e-9)
    # inside one node (8 GPUs per node irrelevant at TP 8) the network terms vanish
    sm8 = StepModel(get_model("llama-3.1-70b"), H100, 8, "bf16", "bf16", CAL, parallel=Parallel(tp=8))
    assert sm8._n_ar == 2 * 80


def test_expert_parallel_charges_the_busiest_gpu():
    """Prefill of 8192 tokens on DeepSeek-V3 TP 8: with whole experts per GPU (EP 8) the busiest
    GPU runs (1 + sqrt(2 ln 8 / 8192)) x the mean routed-expert GEMMs; sliced experts (EP 1) run
    the mean exactly."""
    m, h200 = get_model("deepseek-v3"), get_gpu("h200")
    tp = StepModel(m, h200, 8, "fp8", "bf16", parallel=Parallel(tp=8))
    ep = StepModel(m, h200, 8, "fp8", "bf16", parallel=Parallel(tp=8, ep=8))
    n = 8192
    pairs = StepModel.chunk_pairs(n, 0)
    imb = 1 + math.sqrt(2 * math.log(8) / (n * 8 / 8))
    extra = n * 2 * m.routed_active_params / 8 * (imb - 1) / h200.fp8_flops_per_s
    d = ep.breakdown(0, 0, n, pairs).compute_s - tp.breakdown(0, 0, n, pairs).compute_s
    assert d == pytest.approx(extra, rel=1e-9)


def test_dp_attention_all_to_all_by_hand():
    """DeepSeek-V3 on 16 GPUs, EP 16, DP attention: per step, the 3 dense layers' gathers (one
    all-reduce volume each) plus dispatch and combine for each of the 58 MoE layers, each GPU
    sending its 1/16 of the tokens to top-8 experts, the busiest receiving imb x the mean."""
    m = get_model("deepseek-v3")
    sm = StepModel(m, H100, 16, "fp8", "bf16", CAL, parallel=Parallel(tp=16, ep=16, dp_attention=True))
    n = 256
    link = H100.link_bytes_per_s * CAL.link_efficiency
    net = H100.network_bytes_per_s * CAL.link_efficiency
    lat, nlat = CAL.allreduce_latency_s, H100.network_latency_s
    s_ar = n * m.hidden * 2
    ar = lat + 2 * 7 / 8 * s_ar / link + nlat + (s_ar / 8) / net
    imb = 1 + math.sqrt(2 * math.log(16) / (n * 8 / 16))
    s_a2a = n * imb * 8 * m.hidden * 2 / 16
    a2a = max(lat + s_a2a * 7 / 16 / link, nlat + s_a2a * 8 / 16 / net)
    assert m.n_layers - m.n_moe_layers == 3 and m.n_moe_layers == 58
    assert sm.decode_step(n, 1000).comm_s == pytest.approx(3 * ar + 2 * 58 * a2a, rel=1e-9)


def test_dp_attention_reads_each_sequence_kv_on_one_gpu():
    m, h200 = get_model("deepseek-v3"), get_gpu("h200")
    tp = StepModel(m, h200, 8, "fp8", "bf16", parallel=Parallel(tp=8))
    dp = StepModel(m, h200, 8, "fp8", "bf16", parallel=Parallel(tp=8, ep=8, dp_attention=True))
    b, ctx = 256, 4000
    kv = m.kv_bytes_per_token("bf16")
    d_kv = tp.decode_step(b, ctx).bytes_per_gpu - tp.weight_read_bytes(b)
    assert d_kv == pytest.approx(b * (ctx + 1) * kv)
    d_kv_dp = dp.decode_step(b, ctx).bytes_per_gpu - dp.weight_read_bytes(b)
    assert d_kv_dp == pytest.approx(b * (ctx + 1) * kv / 8)


def test_trivial_layout_is_the_single_node_model():
    m = get_model("llama-3.1-70b")
    a = StepModel(m, H100, 4, "bf16", "bf16", CAL)
    b = StepModel(m, H100, 4, "bf16", "bf16", CAL, parallel=Parallel(tp=4))
    for args in ((1, 1000.0), (64, 64000.0, 512, 2e5, 0.0)):
        assert a.step_time_s(*args) == b.step_time_s(*args)


# The communication terms of costmodel.parallel at their edges (two GPUs, one GPU per node, a TP
# group exactly one node, nothing to send), each figure by hand from the formulas in its docstring;
# written against the mutants of costmodel/parallel.py the older tests let through
# (bench/bench_mutation.py, bench/RESULTS-mutation.md).

LINK, LAT = 400e9, 2e-6       # NVLink-like bytes/s and latency (s), chosen round
NET, NET_LAT = 50e9, 10e-6    # network


def test_two_gpu_ring_all_reduce():
    # g = 2: lat + 2 (2 - 1) / 2 x S / link = 2 us + 1 MB / 400 GB/s = 2 us + 2.5 us
    assert allreduce_s(1e6, 2, 8, LINK, LAT, NET, NET_LAT) == pytest.approx(4.5e-6, rel=1e-12)


def test_one_gpu_per_node_pays_only_the_network():
    # g = 1: no NVLink step (and no NVLink latency); 4 nodes: net_lat + 2 x 3/4 x S / net
    t = allreduce_s(1e6, 4, 1, LINK, LAT, NET, NET_LAT)
    assert t == pytest.approx(10e-6 + 1.5 * 1e6 / 50e9, rel=1e-12)        # 40 us


def test_nothing_to_reduce_costs_nothing():
    assert allreduce_s(1e6, 1, 8, LINK, LAT, NET, NET_LAT) == 0.0
    assert allreduce_s(1e6, 0, 8, LINK, LAT, NET, NET_LAT) == 0.0
    assert allreduce_s(-1.0, 8, 8, LINK, LAT, NET, NET_LAT) == 0.0


def test_two_gpu_all_to_all_and_one_byte():
    # ep = 2 on one node: lat + S (2 - 1) / 2 / link
    assert all_to_all_s(1e6, 2, 8, LINK, LAT, NET, NET_LAT) == pytest.approx(2e-6 + 0.5e6 / 400e9, rel=1e-12)
    assert all_to_all_s(1.0, 8, 8, LINK, LAT, NET, NET_LAT) == pytest.approx(2e-6 + 7 / 8 / 400e9, rel=1e-12)
    assert all_to_all_s(0.0, 8, 8, LINK, LAT, NET, NET_LAT) == 0.0
    assert all_to_all_s(1e6, 1, 8, LINK, LAT, NET, NET_LAT) == 0.0


def test_an_expert_group_of_exactly_one_node_never_touches_the_network():
    # ep = g = 8: 2 us + 1 kB x 7/8 / 400 GB/s, below the network's 10 us latency, which is not paid
    t = all_to_all_s(1e3, 8, 8, LINK, LAT, NET, NET_LAT)
    assert t == pytest.approx(2e-6 + 1e3 * 7 / 8 / 400e9, rel=1e-12)
    assert t < NET_LAT


def test_expert_load_imbalance_by_hand():
    # mu = n x top_k / ep; busiest / mean = 1 + sqrt(2 ln(ep) / mu), at most ep
    assert expert_load_imbalance(4, 2, 2) == pytest.approx(1 + math.sqrt(2 * math.log(2) / 4), rel=1e-12)  # 1.589
    assert expert_load_imbalance(1, 8, 8) == pytest.approx(1 + math.sqrt(2 * math.log(8)), rel=1e-12)      # 3.039
    assert expert_load_imbalance(1, 1, 2) == 2.0     # mu = 0.5: 1 + sqrt(2 ln 2 / 0.5) = 2.67, capped at ep = 2
    assert expert_load_imbalance(0, 2, 8) == 1.0                                      # no tokens, no imbalance
    assert expert_load_imbalance(100, 2, 1) == 1.0


@pytest.mark.parametrize("field, value", [("tp", True), ("pp", 0), ("ep", 1.0), ("gpus_per_node", -8)])
def test_layout_sizes_are_whole_numbers(field, value):
    with pytest.raises(InputError, match=rf"^{field} must be a whole number >= 1, got {value!r}$"):
        Parallel(**{field: value})


def test_layout_rules_say_what_is_wrong():
    with pytest.raises(InputError, match=r"^ep must be 1 or equal to tp \(4\), got 2$"):
        Parallel(tp=4, ep=2)
    with pytest.raises(InputError, match=r"^dp_attention needs tp >= 2 \(attention is spread over the TP group's "
                                         r"GPUs\)$"):
        Parallel(tp=1, dp_attention=True)
    assert Parallel(tp=2, dp_attention=True).dp_attention
    with pytest.raises(InputError, match=r"^tp 12 spans nodes but is not a multiple of gpus_per_node 8$"):
        Parallel(tp=12)
    assert Parallel(tp=16).tp_nodes == 2
