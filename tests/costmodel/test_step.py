"""The step model (costmodel.step) against a second derivation of the physics in its docstring,
written here term by term from the architecture's dimensions and the datasheet, with every
efficiency set to a different non-trivial value so that no term can hide behind another; plus its
edges (speculation bounds, bad layouts, chunked prefill). Written against the mutants of
costmodel/step.py the older tests let through (bench/bench_mutation.py, bench/RESULTS-mutation.md).

Per GPU of a TP group of ``tp`` (one pipeline stage), a step of ``n`` decoding sequences (each
putting q = k + 1 tokens through the model with speculation, else 1) whose contexts sum to C, plus
P prompt tokens attending over A (query, key) pairs after reading R cached tokens:

    weights read  W/tp (an MoE model: dense part + the experts touched, 1 - (1 - top_k/E)^tokens)
    KV bytes      (C + R + n q + P) x (layers x 2 x max(kv_heads/tp, 1) x head_dim x kv bytes)
    t_mem         (weights + KV bytes / fp8_kv_eff if the cache is fp8) / (HBM x bw_eff)
    GEMM FLOPs    2 x matmul params / tp per token;  attention 4 x layers x heads x head_dim / tp per pair
    decode pairs  q C + n q (q + 1) / 2  (the q verify tokens see the context and each other)
    t_comp        decode GEMMs / (peak x fp8_gemm_eff x decode_eff)
                  + decode attention / (bf16 peak x decode_eff x decode_attn_eff) + the prefill ones at prefill_eff
    t_comm        2 layers x (all-reduce latency + 2 (tp-1)/tp x tokens x hidden x 2 bytes / (link x link_eff))
    t_draft       k x draft_cost x max(plain decode memory time, plain decode compute time)
    t_step        max(t_mem, t_comp) + t_comm + step overhead (+ fp8 scaling) + t_draft (+ prefill overhead)
"""

import json
import numpy as np
import pytest
from kvtune.costmodel import Efficiency, InputError, SpecConfig, StepModel, get_gpu, get_model
from kvtune.costmodel.files import profiles_path
from kvtune.costmodel.models import model_from_config
from kvtune.costmodel.parallel import Parallel, all_to_all_s, allreduce_s, expert_load_imbalance, hop_s, micro_batches
from kvtune.costmodel.step import chunked_prefill_time_s, spec_tokens_per_step

H100 = get_gpu("h100-sxm")
BYTES = {"bf16": 2, "fp8": 1}
EFF = Efficiency(bw_efficiency=0.8, decode_flops_efficiency=0.55, prefill_flops_efficiency=0.7,
                 step_overhead_s=3e-3, prefill_overhead_s=1.5e-3, allreduce_latency_s=7e-6, link_efficiency=0.85,
                 activation_reserve_bytes=2e9, request_overhead_s=0.011, fp8_gemm_efficiency=1.3,
                 fp8_kv_bw_efficiency=0.9, fp8_scale_overhead_s=4e-4, decode_attn_efficiency=0.6, name="test")


def reference(m, par, wd, kd, eff, spec, n, ctx, pre, pairs, kv_read, _stages=1):
    """(time, mem, comp, comm, draft, bytes, flops) of one step, from the docstring above and, beyond one
    node's TP group, costmodel/parallel.py's docstring (its primitives are tested by hand in
    tests/costmodel/test_parallel.py and tests/costmodel/test_parallel.py)."""
    tp, pp, ep, dp, g = par.tp, par.pp, par.ep, par.dp_attention, par.gpus_per_node
    k, draft_cost = (spec.k, spec.draft_cost) if spec else (0, 0.0)
    q = k + 1
    if pp > 1:
        # a round: M micro-batches, each stage runs each; a sequence waits pp stage-times of a 1/M batch
        mb = micro_batches(pp, n)
        st = reference(m, Parallel(tp=tp, ep=ep, dp_attention=dp, gpus_per_node=g), wd, kd, eff, spec,
                       n / mb, ctx / mb, pre / mb, pairs / mb, kv_read / mb, _stages=pp)
        if st[0] <= 0:
            return st
        fixed = eff.step_overhead_s + (eff.fp8_scale_overhead_s if wd == "fp8" else 0) \
            + (eff.prefill_overhead_s if pre > 0 else 0)
        b = (n * q + pre) / mb * m.hidden * 2
        link, net = H100.interconnect_bytes_per_s / 2 * eff.link_efficiency, H100.network_bytes_per_s * eff.link_efficiency
        cross = par.cross_node_hops
        hops = (pp - 1 - cross) * hop_s(b, link, eff.allreduce_latency_s) + cross * hop_s(b, net, H100.network_latency_s)
        return (pp * (st[0] - fixed) + hops + fixed, pp * st[1], pp * st[2], pp * st[3] + hops, pp * st[4],
                mb * st[5], mb * st[6])
    return _stage(m, par, wd, kd, eff, spec, n, ctx, pre, pairs, kv_read, _stages)


def _stage(m, par, wd, kd, eff, spec, n, ctx, pre, pairs, kv_read, stages):
    tp, ep, dp, g = par.tp, par.ep, par.dp_attention, par.gpus_per_node
    gpus = tp * stages
    emb_params = m.vocab * m.hidden * (1 if m.tied_embeddings else 2)
    w = (m.total_params - emb_params) * BYTES[wd] + emb_params * 2
    k, draft_cost = (spec.k, spec.draft_cost) if spec else (0, 0.0)
    q = k + 1
    dec_tok = n * q
    tokens = dec_tok + pre
    if tokens <= 0:
        return (0.0,) * 7
    expert_bytes = (m.n_moe_layers * m.n_experts * 3 * m.hidden * m.moe_intermediate * BYTES[wd]) if m.is_moe else 0
    attn_bytes = m.attention_params * BYTES[wd] if dp else 0     # DP attention: every GPU holds them all
    dense_gpu = ((w - expert_bytes - attn_bytes) / tp + attn_bytes) / stages

    def weights_read(t):
        if not expert_bytes:
            return dense_gpu
        touched = 1 - (1 - m.n_active_experts / m.n_experts) ** max(t, 1)
        if ep > 1:   # whole experts per GPU: the busiest GPU's share
            touched = min(1.0, touched * expert_load_imbalance(t, m.n_active_experts, ep))
        return dense_gpu + expert_bytes / gpus * touched

    def ctx_read(n_seqs, c):
        if not m.n_sliding_layers or n_seqs <= 0:
            return c
        per = c / n_seqs
        full = m.n_layers - m.n_sliding_layers
        return n_seqs * (full * per + m.n_sliding_layers * min(per, m.sliding_window)) / m.n_layers

    per_layer = (m.kv_lora_rank + m.qk_rope_head_dim) if m.is_mla else 2 * m.n_kv_heads * m.head_dim
    if m.is_mla or dp:     # the latent is on every rank; DP attention: a sequence's whole KV on one GPU
        kv_tok = m.n_layers * per_layer * BYTES[kd] / stages / (tp if dp else 1)
    else:
        kv_tok = m.n_layers * 2 * max(m.n_kv_heads / tp, 1) * m.head_dim * BYTES[kd] / stages
    dec_kv = ctx_read(n, ctx)
    kv_bytes = (dec_kv + kv_read + tokens) * kv_tok
    bw = H100.hbm_bytes_per_s * eff.bw_efficiency
    mem = (weights_read(tokens) + kv_bytes / (eff.fp8_kv_bw_efficiency if kd == "fp8" else 1)) / bw
    routed = 2 * m.n_moe_layers * m.n_active_experts * 3 * m.hidden * m.moe_intermediate / gpus if ep > 1 else 0.0
    gemm_tok = 2 * (m.active_params - (0 if m.tied_embeddings else m.vocab * m.hidden)) / gpus - routed
    if m.is_mla:   # absorbed MLA: scores over latent + rope, values over the latent
        attn_pair = m.n_layers * m.n_heads * 2 * (2 * m.kv_lora_rank + m.qk_rope_head_dim) / gpus
    else:
        attn_pair = 4 * m.n_layers * m.n_heads * m.head_dim / gpus
    peak = (H100.fp8_flops_per_s * eff.fp8_gemm_efficiency) if wd == "fp8" else H100.bf16_flops_per_s
    imb = expert_load_imbalance(tokens, m.n_active_experts, ep) if ep > 1 else 1.0
    dec_pairs = q * ctx + n * q * (q + 1) / 2
    dec_gemm = dec_tok * (gemm_tok + routed * imb)
    pre_gemm = pre * (gemm_tok + routed * imb)
    comp = (dec_gemm / (peak * eff.decode_flops_efficiency)
            + dec_pairs * attn_pair / (H100.bf16_flops_per_s * eff.decode_flops_efficiency * eff.decode_attn_efficiency)
            + pre_gemm / (peak * eff.prefill_flops_efficiency)
            + pairs * attn_pair / (H100.bf16_flops_per_s * eff.prefill_flops_efficiency))
    comm = 0.0
    if tp > 1:
        link, net = H100.interconnect_bytes_per_s / 2 * eff.link_efficiency, H100.network_bytes_per_s * eff.link_efficiency
        ar = (link, eff.allreduce_latency_s, net, H100.network_latency_s)
        lat = allreduce_s(0.0, tp, g, *ar)
        per_token = allreduce_s(m.hidden * 2, tp, g, *ar) - lat
        # 2 all-reduces per layer; DP attention: one gather per dense (and sliced-expert) layer
        n_ar = (m.n_layers - (m.n_moe_layers if ep > 1 else 0)) if dp else 2 * m.n_layers
        comm = n_ar / stages * (lat + per_token * tokens)
        if dp and ep > 1:   # MoE dispatch + combine by all-to-all of each GPU's own tokens, top-k copies
            a2a = all_to_all_s(tokens * imb * m.n_active_experts * m.hidden * 2 / tp, ep, g, *ar)
            comm += 2 * m.n_moe_layers / stages * a2a
    draft = 0.0
    if k and n:
        plain_mem = (weights_read(n) + dec_kv * kv_tok) / bw
        plain_comp = (n * gemm_tok / (peak * eff.decode_flops_efficiency)
                      + ctx * attn_pair / (H100.bf16_flops_per_s * eff.decode_flops_efficiency * eff.decode_attn_efficiency))
        draft = k * draft_cost * max(plain_mem, plain_comp)
    t = (max(mem, comp) + comm + eff.step_overhead_s + (eff.fp8_scale_overhead_s if wd == "fp8" else 0.0) + draft
         + (eff.prefill_overhead_s if pre > 0 else 0.0))
    return t, mem, comp, comm, draft, weights_read(tokens) + kv_bytes, dec_gemm + dec_pairs * attn_pair + pre_gemm \
        + pairs * attn_pair


CONFIGS = [
    # model, tp, the layout passed (None: one node's TP group), weights, kv, speculation
    ("llama-3.1-8b", 1, None, "bf16", "bf16", None),
    ("llama-3.1-8b", 2, None, "fp8", "fp8", SpecConfig(3, 0.7, 0.08)),
    ("llama-3.1-70b", 4, None, "bf16", "fp8", None),
    ("llama-3.1-70b", 8, None, "fp8", "bf16", SpecConfig(5, 0.6, 0.04)),
    ("llama-3.1-70b", 16, None, "bf16", "bf16", None),     # 16 > 8 KV heads: one head (replicated) per GPU
    ("mixtral-8x7b", 2, None, "bf16", "bf16", None),
    ("mixtral-8x7b", 4, None, "fp8", "fp8", SpecConfig(2, 0.5, 0.1)),
    ("gemma-2-9b", 1, None, "bf16", "bf16", SpecConfig(4, 0.8, 0.05)),   # tied embeddings, sliding windows
    ("gemma-2-9b", 2, None, "fp8", "bf16", None),
    # beyond one node's TP group
    ("llama-3.1-70b", 4, Parallel(tp=4, pp=2), "bf16", "bf16", SpecConfig(3, 0.7, 0.05)),  # stages in one node
    ("llama-3.1-70b", 8, Parallel(tp=8, pp=3), "fp8", "fp8", None),     # stages on 3 nodes: 2 network hops
    ("llama-3.1-8b", 1, Parallel(tp=1, pp=4), "bf16", "bf16", None),    # pipeline only: no all-reduce
    ("llama-3.1-70b", 16, Parallel(tp=16), "bf16", "bf16", None),       # TP across 2 nodes: hierarchical
    ("mixtral-8x7b", 8, Parallel(tp=8, ep=8), "bf16", "bf16", SpecConfig(2, 0.6, 0.05)),   # whole experts
    ("mixtral-8x7b", 4, Parallel(tp=4, dp_attention=True), "bf16", "bf16", None),        # DP attention, sliced
    ("qwen3-30b-a3b", 4, Parallel(tp=4, ep=4, dp_attention=True, pp=2), "bf16", "fp8", None),
    ("deepseek-v3", 16, Parallel(tp=16, ep=16, dp_attention=True), "fp8", "bf16", None),  # MLA, a2a across nodes
    ("deepseek-v3", 8, Parallel(tp=8, pp=2), "fp8", "bf16", SpecConfig(1, 0.8, 0.1)),
    ("mixtral-8x7b", 2, Parallel(tp=2, ep=2), "bf16", "bf16", None),                     # the smallest EP
    ("qwen3-30b-a3b", 2, Parallel(tp=2, ep=2, dp_attention=True), "bf16", "bf16", None),
    ("one-sliding-layer", 1, None, "bf16", "bf16", SpecConfig(2, 0.7, 0.05)),
]
STEPS = [
    # decoding sequences, their context sum, prompt tokens, pairs, cached tokens read
    (1, 1000.0, 0, 0.0, 0.0),
    (64, 64 * 3000.0, 0, 0.0, 0.0),
    (256, 256 * 700.0, 0, 0.0, 0.0),
    (0, 0.0, 2048, StepModel.chunk_pairs(2048, 0), 0.0),
    (0, 0.0, 512, StepModel.chunk_pairs(512, 4096), 4096.0),
    (31, 31 * 9000.0, 1024, StepModel.chunk_pairs(1024, 300), 300.0),
    (3, 3 * 5000.0, 8, StepModel.chunk_pairs(8, 0), 0.0),
    (2, 2 * 3000.0, 1, StepModel.chunk_pairs(1, 500), 500.0),       # a prompt's last token alone
    (1024, 1024 * 300.0, 0, 0.0, 0.0),                              # compute-bound decoding
]


def model(name):
    if name != "one-sliding-layer":
        return get_model(name)
    # Llama-3.1-8B with a 1,024-token window on one of its 32 layers
    cfg = json.loads(profiles_path("models", "llama-3.1-8b.json").read_text())
    types = ["sliding_attention"] + ["full_attention"] * 31
    return model_from_config(dict(cfg, sliding_window=1024, layer_types=types), name)


@pytest.mark.parametrize("name, tp, par, wd, kd, spec", CONFIGS,
                         ids=[f"{c[0]}-{c[2] or c[1]}-{c[3]}-{c[4]}-{'spec' if c[5] else 'plain'}" for c in CONFIGS])
def test_step_terms_match_a_second_derivation(name, tp, par, wd, kd, spec):
    m = model(name)
    sm = StepModel(m, H100, tp, wd, kd, EFF, spec, gpu_mem_util=0.95, parallel=par)
    layout = par or Parallel(tp=tp, gpus_per_node=max(tp, 8))
    for shape in STEPS:
        want = reference(m, layout, wd, kd, EFF, spec, *shape)
        got = sm.step_terms(*shape)
        assert got == pytest.approx(want, rel=1e-12), (shape, got, want)
        b = sm.breakdown(*shape)
        assert (b.time_s, b.mem_s, b.compute_s, b.comm_s, b.draft_s, b.bytes_per_gpu, b.flops_per_gpu) == \
            pytest.approx(want, rel=1e-12)
        fixed = EFF.step_overhead_s + (EFF.fp8_scale_overhead_s if wd == "fp8" else 0) \
            + (EFF.prefill_overhead_s if shape[2] else 0)
        assert b.overhead_s == pytest.approx(fixed, rel=1e-12)
        assert b.tokens_per_seq == (spec_tokens_per_step(spec.k, spec.acceptance) if spec else 1.0)
        assert sm.step_time_s(*shape) == got[0]
        if shape[2] == 0:
            # the closed-form clock's probes (costmodel.sim_clock) describe the same plain step
            mem = sm.plain_decode_mem_s(shape[0], shape[1])
            c0, c1 = sm.plain_decode_compute_coeffs(shape[0])
            if spec is None and not m.n_sliding_layers and layout.trivial:
                written = shape[0] * m.n_layers * 2 * max(m.n_kv_heads / tp, 1) * m.head_dim * BYTES[kd] \
                    / (EFF.fp8_kv_bw_efficiency if kd == "fp8" else 1) / (H100.hbm_bytes_per_s * EFF.bw_efficiency)
                if kd != "fp8":
                    assert mem + written == pytest.approx(b.mem_s, rel=1e-12)
                assert c0 + c1 * shape[1] + shape[0] * c1 == pytest.approx(b.compute_s, rel=1e-12)
    # a pure decode step through the two-argument forms (no prompt tokens, pairs or cached reads)
    for b, ctx in ((8, 2500.0), (1024, 300.0)):
        d = sm.decode_step(b, ctx)
        want = reference(m, layout, wd, kd, EFF, spec, b, b * ctx, 0, 0.0, 0.0)
        assert (d.time_s, d.flops_per_gpu) == pytest.approx((want[0], want[6]), rel=1e-12)
        assert sm.step_time_s(b, b * ctx) == pytest.approx(want[0], rel=1e-12)
    # an empty step costs nothing at all (no overhead either)
    assert sm.step_terms(0, 0.0, 0, 0.0, 0.0) == (0.0,) * 7
    assert sm.breakdown(0, 0.0).overhead_s == 0.0


def test_the_model_says_what_it_is():
    m = get_model("gemma-2-9b")
    spec = SpecConfig(4, 0.8, 0.05)
    sm = StepModel(m, H100, 2, "bf16", "bf16", EFF, spec)
    assert (sm.verify_tokens_per_seq, sm.has_sliding_window, sm.prefill_overhead_s) == (5, True, 1.5e-3)
    assert sm.request_overhead_s == 0.011
    assert sm.tokens_per_step == pytest.approx((1 - 0.8 ** 5) / (1 - 0.8), rel=1e-12)
    plain = StepModel(get_model("llama-3.1-8b"), H100, 1, efficiency=EFF)
    assert (plain.verify_tokens_per_seq, plain.has_sliding_window, plain.tokens_per_step) == (1, False, 1.0)
    # the default is one GPU
    assert StepModel(get_model("llama-3.1-8b"), H100).tp == 1
    # k = 0 is no speculation
    assert StepModel(get_model("llama-3.1-8b"), H100, 1, speculation=SpecConfig(0, 0.5)).speculation is None


def test_memory_plan_follows_the_efficiency_and_the_draft():
    m = get_model("llama-3.1-8b")
    sm = StepModel(m, H100, 2, "bf16", "fp8", EFF, gpu_mem_util=0.5)
    assert sm.memory.activation_reserve_bytes == 2e9
    assert sm.memory.kv_pool_bytes_per_gpu == 40e9 - 16_060_522_496 / 2 - 2e9
    assert sm.memory.kv_bytes_per_token_per_gpu == 32 * 2 * 4 * 128 * 1


def test_a_one_stage_model_has_no_hops_and_no_all_to_all():
    sm = StepModel(get_model("llama-3.1-8b"), H100, 1, efficiency=EFF)
    assert sm.hops_s(1000) == 0.0 and sm.a2a_s(1000) == 0.0
    moe = StepModel(get_model("mixtral-8x7b"), H100, 2, efficiency=EFF, parallel=Parallel(tp=2, ep=2))
    assert moe.a2a_s(1000) == 0.0        # experts whole per GPU but attention not data-parallel: no all-to-all
    with pytest.raises(InputError, match=r"^ep 2: llama-3.1-70b has no experts"):
        StepModel(get_model("llama-3.1-70b"), H100, 2, parallel=Parallel(tp=2, ep=2))


def test_ideal_communication_costs_nothing_even_across_layouts():
    ideal = Efficiency(model_comm=False)
    m = get_model("llama-3.1-70b")
    for par in (Parallel(tp=8), Parallel(tp=8, pp=2), Parallel(tp=16)):
        sm = StepModel(m, H100, par.tp, efficiency=ideal, parallel=par)
        assert sm.step_terms(16, 16 * 1000.0, 0, 0.0, 0.0)[3] == 0.0
    # and a calibrated one does pay for the pipeline's hops
    sm = StepModel(m, H100, 8, efficiency=EFF, parallel=Parallel(tp=8, pp=2))
    assert sm.step_terms(16, 16 * 1000.0, 0, 0.0, 0.0)[3] > 0.0


def test_speculation_bounds():
    assert spec_tokens_per_step(0, 0.3) == 1.0
    assert spec_tokens_per_step(3, 1.0) == 4.0
    assert spec_tokens_per_step(3, 0.0) == 1.0
    assert spec_tokens_per_step(2, 0.5) == pytest.approx(1.75, rel=1e-12)
    assert spec_tokens_per_step(1, 0.5) == pytest.approx(1.5, rel=1e-12)
    with pytest.raises(InputError, match=r"^speculative length k must be >= 0, got -1$"):
        spec_tokens_per_step(-1, 0.5)
    for a in (-0.1, 1.1):
        with pytest.raises(InputError, match=rf"^speculative acceptance must be in \[0, 1\], got {a}$"):
            spec_tokens_per_step(2, a)
    assert SpecConfig(2, 0.5, 1.0).draft_cost == 1.0 and SpecConfig(2, 0.5, 0.0).draft_cost == 0.0
    for c in (-0.01, 1.01):
        with pytest.raises(InputError, match=rf"^speculative draft_cost must be in \[0, 1\], got {c}$"):
            SpecConfig(2, 0.5, c)
    with pytest.raises(InputError, match="speculative acceptance"):
        SpecConfig(2, 1.5)


def test_bad_layouts_say_what_is_wrong():
    m = get_model("llama-3.1-70b")
    with pytest.raises(InputError, match=r"^parallel layout has tp 4 but the step model was asked for tp 8$"):
        StepModel(m, H100, 8, parallel=Parallel(tp=4))
    with pytest.raises(InputError, match=r"^ep 8: llama-3.1-70b has no experts \(expert parallelism needs an MoE "
                                         r"model\)$"):
        StepModel(m, H100, 8, parallel=Parallel(tp=8, ep=8))
    # without a layout, a TP group larger than a node spans nodes of 8
    assert StepModel(m, H100, 16).parallel == Parallel(tp=16, gpus_per_node=16)
    with pytest.raises(InputError, match=r"^batch must be >= 1, got 0$"):
        StepModel(m, H100, 8).decode_step(0, 100)


def test_chunked_prefill_sums_its_chunks():
    calls = []

    def step(n_decode, ctx, tokens, pairs, prior):
        calls.append((n_decode, ctx, tokens, pairs, prior))
        return 1.0 + tokens / 1000

    # 2,500 new tokens after 100 cached, in chunks of 1,000: 1,000 + 1,000 + 500
    t = chunked_prefill_time_s(step, 2600, 100, 1000)
    assert t == pytest.approx(3 * 1.0 + 2.5, rel=1e-12)
    assert calls == [(0, 0.0, 1000, 1000 * 100 + 1000 * 1001 / 2, 100),
                     (0, 0.0, 1000, 1000 * 1100 + 1000 * 1001 / 2, 1100),
                     (0, 0.0, 500, 500 * 2100 + 500 * 501 / 2, 2100)]
    calls.clear()
    assert chunked_prefill_time_s(step, 300) == pytest.approx(1.3, rel=1e-12)   # nothing cached, one step
    assert calls == [(0, 0.0, 300, 300 * 301 / 2, 0)]
    calls.clear()
    # the last token alone is a step too
    assert chunked_prefill_time_s(step, 2001, 0, 1000) == pytest.approx(3 * 1.0 + 2.001, rel=1e-12)
    assert [c[2] for c in calls] == [1000, 1000, 1]
    assert chunked_prefill_time_s(step, 101, 100) == pytest.approx(1.001, rel=1e-12)
    assert chunked_prefill_time_s(step, 100, 100, 10) == 0.0       # all cached: nothing to do
    assert chunked_prefill_time_s(step, 100, 200) == 0.0


def test_prefill_time_is_the_chunked_sum_of_step_times():
    sm = StepModel(get_model("llama-3.1-8b"), H100, 1, efficiency=EFF)
    want = sum(sm.step_time_s(0, 0.0, n, StepModel.chunk_pairs(n, done), done)
               for n, done in ((512, 64), (512, 576), (100, 1088)))
    assert sm.prefill_time_s(1188, 64, 512) == pytest.approx(want, rel=1e-12)


def test_pairs_of_a_causal_chunk():
    # 3 new tokens after 2 cached: each sees the 2 cached and itself and those before it: 3 + 4 + 5 = 12
    assert StepModel.chunk_pairs(3, 2) == 12
    assert StepModel.chunk_pairs(4, 0) == 1 + 2 + 3 + 4
    assert StepModel.chunk_pairs(1, 0) == 1.0


# The step model's memos (costmodel/step.py: the per-token-count terms of an MoE step, the
# pipeline's micro-batches and hops) and its two entry points, against the mutants of round 5's
# full run that the older tests let through (bench/mutation-runs/r5-step-deployment-all-1337.json).
#
# Properties, each from the code's own contract rather than a snapshot:
#
# * ``step_terms`` / ``step_time_s`` are ``breakdown`` without the record (step_terms' docstring):
#   the simulator's hot path and the reported breakdown agree bit for bit, whatever the layout.
# * A memo returns what a fresh computation returns: a model that has already answered other calls
#   (plain floats, numpy scalars, in any order) answers every call exactly as a fresh model does.
#   The memos hold plain int/float calls only; "a numpy scalar computes its own" (``_PLAIN``), so a
#   float32 call must neither store its float32-rounded terms for a later float call nor read a
#   float call's terms.
# * numpy scalars compute the same model as plain floats (to float64 rounding).

EFF_step_memo_survivors = Efficiency(bw_efficiency=0.8, decode_flops_efficiency=0.55, prefill_flops_efficiency=0.7,
                 step_overhead_s=3e-3, prefill_overhead_s=1.5e-3, allreduce_latency_s=7e-6, link_efficiency=0.85,
                 activation_reserve_bytes=2e9, request_overhead_s=0.011, name="test")

# (model, tp, layout): one stage dense; TP dense; an MoE step (memoised per token count); a
# pipeline (memoised micro-batches and hops); an MoE pipeline with expert parallelism
LAYOUTS = [
    ("llama-3.1-8b", 1, None),
    ("llama-3.1-70b", 4, None),
    ("mixtral-8x7b", 2, Parallel(tp=2, ep=2)),
    ("llama-3.1-8b", 1, Parallel(tp=1, pp=4)),
    ("qwen3-30b-a3b", 2, Parallel(tp=2, ep=2, pp=2)),
]


def _model(name, tp, par):
    return StepModel(get_model(name), H100, tp, efficiency=EFF_step_memo_survivors, parallel=par)


def _step(n_seqs, ctx_tok, prefill_tok):
    """(n_decode, decode context sum, prefill tokens, prefill pairs, prefill KV read): a causal
    prefill chunk of P tokens with nothing cached attends over P (P + 1) / 2 pairs."""
    return (n_seqs, n_seqs * ctx_tok, prefill_tok, prefill_tok * (prefill_tok + 1) / 2, 0.0)


# mixed steps; with one stage, some of them make ((t - fixed) + fixed) round away from t
STEPS_step_memo_survivors = [_step(187, 4496.0, 1417.0), _step(80, 1646.0, 2215.0), _step(219, 1746.0, 1580.0),
         _step(56, 0.0, 512.0), _step(179, 2653.0, 199.0), _step(25, 699.0, 2215.0),
         _step(5, 1000.0, 0.0), _step(7, 333.0, 0.0), _step(0, 0.0, 3.0)]


@pytest.mark.parametrize("name,tp,par", LAYOUTS)
def test_step_terms_is_breakdown_bit_for_bit(name, tp, par):
    """step_terms and step_time_s (what the simulator reads) are breakdown's figures exactly."""
    sm = _model(name, tp, par)
    for args in STEPS_step_memo_survivors:
        b = sm.breakdown(*args)
        assert sm.step_terms(*args) == (b.time_s, b.mem_s, b.compute_s, b.comm_s, b.draft_s,
                                        b.bytes_per_gpu, b.flops_per_gpu), (name, par, args)
        assert sm.step_time_s(*args) == b.time_s, (name, par, args)


def _as_floats(terms):
    return tuple(float(x) for x in terms)


def _cast(args, kinds):
    """The step's arguments as the given scalar types ('f' float, 'i' int, 'f32', 'f64' numpy)."""
    conv = {"f": float, "i": int, "f32": np.float32, "f64": np.float64}
    return tuple(conv[k](a) for a, k in zip(args, kinds))


# call orders: a numpy call first then the plain one with the same values, the reverse, and two
# numpy kinds in turn; the arguments that carry the memo keys (n_decode, prefill tokens) vary in type
ORDERS = [
    [("f32", "f", "f", "f", "f"), ("f", "f", "f", "f", "f")],      # numpy decode count, plain prompt
    [("i", "f", "f32", "f", "f"), ("i", "f", "f", "f", "f")],      # plain decode count, numpy prompt
    [("f32", "f32", "f32", "f32", "f32"), ("f", "f", "f", "f", "f")],
    [("f", "f", "f", "f", "f"), ("f32", "f32", "f32", "f32", "f32")],   # plain first, then numpy
    [("f", "f", "f", "f", "f"), ("f32", "f", "f", "f", "f")],
    [("f32", "f32", "f32", "f32", "f32"), ("f64", "f64", "f64", "f64", "f64")],
    [("f32", "f", "f", "f", "f"), ("f64", "f", "f", "f", "f")],    # two numpy decode counts in turn
    [("i", "f", "f32", "f", "f"), ("i", "f", "f64", "f", "f")],    # two numpy prompts in turn
]

# integral counts with a prompt (so prefill tokens enter the hops and the token count)
MEMO_STEPS = [_step(5, 1000.0, 3.0), _step(13, 777.0, 5.0), _step(3, 4096.0, 7.0), _step(6, 100.0, 0.0)]


@pytest.mark.parametrize("name,tp,par", LAYOUTS)
@pytest.mark.parametrize("order", ORDERS, ids=lambda o: ">".join(k[0] + k[2] for k in o))
def test_a_memo_answers_as_a_fresh_model(name, tp, par, order):
    """Every call of a model that has answered others equals the same call of a fresh model."""
    warm = _model(name, tp, par)
    for args in MEMO_STEPS:
        for kinds in order:
            call = _cast(args, kinds)
            got = _as_floats(warm.step_terms(*call))
            want = _as_floats(_model(name, tp, par).step_terms(*call))
            assert got == want, (name, par, kinds, args)


@pytest.mark.parametrize("name,tp,par", LAYOUTS)
def test_numpy_scalars_compute_the_plain_model(name, tp, par):
    """np.float64 arguments (the screen's grids) give the plain floats' step to float64 rounding."""
    sm = _model(name, tp, par)
    for args in STEPS_step_memo_survivors + MEMO_STEPS:
        plain = sm.step_terms(*args)
        np64 = _as_floats(sm.step_terms(*(np.float64(a) for a in args)))
        assert np64 == pytest.approx(plain, rel=1e-12, abs=0.0), (name, par, args)
