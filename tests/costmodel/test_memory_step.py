"""Memory plan and step times: the seed arithmetic, hand-derived cases and property tests."""


import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtune.costmodel import (IDEAL, DoesNotFit, InputError, SpecConfig, StepModel, estimate, get_gpu,
                       get_model, plan_memory, spec_tokens_per_step)
from kvtune.costmodel.calibration import efficiency_for

H100 = get_gpu("h100-sxm")
L70 = get_model("llama-2-70b")


@pytest.fixture(scope="module")
def seed_estimate():
    return estimate(L70, H100, 8, 4096, [1, 64, 320], "bf16", "bf16", IDEAL, 0.9)


def test_seed_arithmetic_llama2_70b_tp8(seed_estimate):
    e = seed_estimate
    # Published arithmetic (issue 2): 8 x 3.35 TB/s / (4096 x 327,680 B) ~ 20,000 tok/s
    assert e.kv_bytes_per_token == 327_680
    assert e.ceiling_tok_s == pytest.approx(20_000, rel=0.05)
    # one lonely user: 26.8 TB/s / 138 GB ~ 190 tok/s
    assert e.single_user_tok_s == pytest.approx(190, rel=0.05)
    assert e.rows[0].tok_s_per_user == pytest.approx(190, rel=0.05)
    # pool: (8 x 80 GB x 0.9 - 138 GB) / 327,680 B ~ 1.3 M tokens (decimal GB, no reserve in ideal)
    assert e.kv_pool_tokens == pytest.approx(1.3e6, rel=0.10)
    assert e.max_batch == pytest.approx(320, rel=0.10)
    plan = plan_memory(L70, H100, 8, "bf16", "bf16", 0.9)
    assert plan.max_batch(131072) == pytest.approx(10, rel=0.10)


def test_pool_limited_batch_speed():
    plan = plan_memory(L70, H100, 8, "bf16", "bf16", 0.9)
    b = plan.max_batch(4096)
    s = StepModel(L70, H100, 8).decode_step(b, 4096)
    assert 1 / s.time_s == pytest.approx(47, rel=0.10)       # per user
    assert b / s.time_s == pytest.approx(15_000, rel=0.10)   # per node


def test_frontier_is_a_straight_line(seed_estimate):
    """total = ceiling x (1 - per_user / single_user): intercepts are the ceiling and BW/W."""
    sm = StepModel(L70, H100, 8)
    ceiling = seed_estimate.ceiling_tok_s
    u1 = H100.hbm_bytes_per_s / sm.memory.weight_bytes_per_gpu
    for b in (1, 8, 32, 100, 200, 320):
        s = sm.decode_step(b, 4096)
        per_user, total = 1 / s.time_s, b / s.time_s
        # The KV written this step (1 token per sequence) nudges the line by < 0.1%
        assert total == pytest.approx(ceiling * (1 - per_user / u1), rel=2e-3, abs=5)


def test_hand_derived_decode_step_llama3_8b():
    m = get_model("llama-3.1-8b")
    sm = StepModel(m, H100, 1)
    s = sm.decode_step(1, 1000)
    weights = m.total_params * 2
    kv = m.kv_bytes_per_token("bf16") * (1000 + 1)
    assert s.time_s == pytest.approx((weights + kv) / 3.35e12, rel=1e-9)
    assert s.bound == "bandwidth"


def test_prefill_is_compute_bound_with_attention_term():
    m = get_model("llama-3.1-8b")
    sm = StepModel(m, H100, 1)
    t = sm.prefill_time_s(8192)
    gemm = 2 * (m.total_params - m.vocab * m.hidden) * 8192
    attn = 4 * m.n_layers * m.n_heads * m.head_dim * (8192 * 8193 / 2)
    assert t == pytest.approx((gemm + attn) / 989.4e12, rel=1e-9)
    assert sm.breakdown(0, 0, 8192, sm.chunk_pairs(8192, 0), 0).bound == "compute"
    # chunking the same prompt costs the same arithmetic (plus re-reading weights, hidden under compute)
    assert sm.prefill_time_s(8192, chunk_tokens=2048) == pytest.approx(t, rel=0.01)


def test_allreduce_and_overhead_only_when_calibrated():
    eff = efficiency_for("calibrated", "h100-sxm")
    ideal = StepModel(L70, H100, 8).decode_step(64, 4096)
    cal = StepModel(L70, H100, 8, efficiency=eff).decode_step(64, 4096)
    assert ideal.comm_s == 0 and ideal.overhead_s == 0
    assert cal.comm_s > 0 and cal.overhead_s == eff.step_overhead_s
    assert cal.time_s > ideal.time_s
    # TP=1 has no all-reduce at all
    assert StepModel(get_model("llama-3.1-8b"), H100, 1, efficiency=eff).decode_step(8, 1000).comm_s == 0


def test_prefill_overhead_only_on_steps_carrying_prompt_tokens():
    eff = efficiency_for("calibrated", "h100-sxm").with_params(prefill_overhead_s=4e-3)
    base = eff.with_params(prefill_overhead_s=0.0)
    with_, without = StepModel(L70, H100, 4, efficiency=eff), StepModel(L70, H100, 4, efficiency=base)
    assert with_.decode_step(32, 2048).time_s == without.decode_step(32, 2048).time_s
    mixed = (31, 31 * 2048.0, 512, StepModel.chunk_pairs(512, 0), 0)
    assert with_.step_time_s(*mixed) == pytest.approx(without.step_time_s(*mixed) + 4e-3, rel=1e-12)
    assert with_.breakdown(*mixed).overhead_s == pytest.approx(eff.step_overhead_s + 4e-3)
    assert with_.prefill_time_s(4096, chunk_tokens=1024) == pytest.approx(without.prefill_time_s(4096, chunk_tokens=1024) + 4 * 4e-3)


def test_spec_tokens_formula():
    assert spec_tokens_per_step(5, 0.8) == pytest.approx(3.69, abs=0.005)
    assert spec_tokens_per_step(0, 0.8) == 1
    assert spec_tokens_per_step(3, 1.0) == 4
    assert spec_tokens_per_step(4, 0.0) == 1


def test_spec_pays_when_memory_bound_and_not_when_compute_bound():
    m = get_model("llama-3.1-8b")
    plain = StepModel(m, H100, 1)
    spec = StepModel(m, H100, 1, speculation=SpecConfig(5, 0.8, 0.05))
    def gain(b, ctx):
        p, s = plain.decode_step(b, ctx), spec.decode_step(b, ctx)
        return (s.tokens_per_seq / s.time_s) / (1 / p.time_s)
    assert gain(1, 1000) > 2.5            # memory bound: ~3.69 tokens for ~1.25x the time
    assert gain(512, 200) < 1             # compute bound: 6x the arithmetic for 3.69 tokens


def test_fp8_weights_refused_on_a100():
    with pytest.raises(InputError, match="no FP8"):
        StepModel(get_model("llama-3.1-8b"), get_gpu("a100-80gb"), 1, weight_dtype="fp8")


def test_does_not_fit_says_by_how_much():
    with pytest.raises(DoesNotFit, match=r"short by \d+\.\d GB") as info:
        plan_memory(get_model("llama-3.1-405b"), H100, 2, "bf16", "bf16", 0.9)
    assert info.value.shortfall_bytes > 300e9


def test_moe_reads_only_touched_experts():
    m = get_model("mixtral-8x7b")
    sm = StepModel(m, H100, 2)
    b1 = sm.weight_read_bytes(1)
    assert b1 < sm.memory.weight_bytes_per_gpu * 0.5   # 2 of 8 experts at batch 1
    assert sm.weight_read_bytes(256) == pytest.approx(sm.memory.weight_bytes_per_gpu, rel=1e-3)


# ---- property tests ------------------------------------------------------------------------

MODELS = ["llama-3.1-8b", "llama-2-70b", "qwen3-32b", "mixtral-8x7b", "deepseek-v3", "gemma-2-9b"]


def _model_tp(name):
    return {"deepseek-v3": 16, "llama-2-70b": 4, "qwen3-32b": 2, "mixtral-8x7b": 2}.get(name, 1)


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(MODELS), mode=st.sampled_from(["ideal", "calibrated"]),
       batch=st.integers(1, 512), ctx=st.integers(1, 64_000), db=st.integers(1, 64), dc=st.integers(1, 8000),
       kv=st.sampled_from(["bf16", "fp8"]))
def test_step_time_never_falls_as_batch_or_context_grows(name, mode, batch, ctx, db, dc, kv):
    m = get_model(name)
    w = "fp8" if name == "deepseek-v3" else "bf16"
    sm = StepModel(m, H100, _model_tp(name), w, kv, efficiency_for(mode, "h100-sxm"), gpu_mem_util=0.95)
    t = sm.decode_step(batch, ctx).time_s
    assert sm.decode_step(batch + db, ctx).time_s >= t
    assert sm.decode_step(batch, ctx + dc).time_s >= t


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(MODELS), tokens=st.integers(1, 10**6), k=st.integers(2, 50))
def test_kv_bytes_linear_in_tokens(name, tokens, k):
    m = get_model(name)
    per = m.kv_bytes_per_token("bf16")
    # hand-derived bytes per token: K and V of every KV head in every layer at 2 bytes (GQA), or
    # MLA's compressed latent plus its rope key (DeepSeek-V3: 512 + 64 elements), at 2 bytes
    elements = (m.kv_lora_rank + m.qk_rope_head_dim) if m.is_mla else 2 * m.n_kv_heads * m.head_dim
    assert per == m.n_layers * elements * 2
    # a decode step reads the weights once plus each sequence's KV: the bytes above the weights
    # grow linearly with the context (full-attention models; sliding-window layers cap their read)
    sm = StepModel(m, H100, _model_tp(name), "fp8" if name == "deepseek-v3" else "bf16", "bf16", IDEAL,
                   gpu_mem_util=0.95)
    ctx = min(tokens, 4000)
    base = sm.decode_step(1, 0).bytes_per_gpu
    kv_one = sm.decode_step(1, ctx).bytes_per_gpu - base
    kv_k = sm.decode_step(1, ctx * k).bytes_per_gpu - base
    if m.kv_read_tokens(ctx * k) == ctx * k:
        assert kv_one == pytest.approx(ctx * sm.memory.kv_bytes_per_token_per_gpu, rel=1e-9)
        assert kv_k == pytest.approx(k * kv_one, rel=1e-9)
    else:  # sliding-window layers: more context never reads less, but less than linearly
        assert kv_one <= kv_k < k * kv_one
    plan1 = plan_memory(m, H100, _model_tp(name), "fp8" if name == "deepseek-v3" else "bf16", "bf16", 0.95)
    # pool tokens x bytes per token never exceeds the pool bytes, and is within one token of it
    assert plan1.kv_pool_tokens * plan1.kv_bytes_per_token_per_gpu <= plan1.kv_pool_bytes_per_gpu
    assert plan1.kv_pool_bytes_per_gpu - plan1.kv_pool_tokens * plan1.kv_bytes_per_token_per_gpu < plan1.kv_bytes_per_token_per_gpu


@settings(max_examples=40, deadline=None)
@given(tp=st.sampled_from([1, 2, 4, 8]), util=st.floats(0.5, 0.95))
def test_fp8_kv_doubles_pool_tokens(tp, util):
    m = get_model("llama-3.1-8b")
    a = plan_memory(m, H100, tp, "bf16", "bf16", util)
    b = plan_memory(m, H100, tp, "bf16", "fp8", util)
    assert b.kv_pool_tokens == pytest.approx(2 * a.kv_pool_tokens, abs=2)
