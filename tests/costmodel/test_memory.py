"""The memory plan (costmodel.memory) figure by figure, every number derived by hand from the
config.json dimensions and the datasheet; written against the mutants of costmodel/memory.py that
the older tests let through (bench/bench_mutation.py, bench/RESULTS-mutation.md).

Llama-3.1-8B (32 layers, hidden 4096, 32 heads, 8 KV heads of 128, MLP 14336, vocab 128256, untied):
  per layer q, o 2 x 4096^2 + k, v 2 x 4096 x 1024 = 41,943,040 attention parameters
  all parameters 8,030,261,248 (tests/costmodel/test_draft_memory.py derives them), 2 bytes each in bf16
  KV per token 32 layers x K,V x 8 heads x 128 x 2 bytes = 131,072 bytes; a block of 16 tokens 2,097,152
"""

import dataclasses
import math

import pytest

from kvtune.costmodel import DoesNotFit, InputError, get_gpu, get_model, plan_memory
from kvtune.costmodel.draft import DraftFootprint
from kvtune.costmodel.memory import attention_weight_bytes, gpus_to_hold, weight_bytes, weight_bytes_per_gpu
from kvtune.costmodel.parallel import Parallel

H100 = get_gpu("h100-sxm")          # 80 GB decimal
L8 = get_model("llama-3.1-8b")
L70 = get_model("llama-3.1-70b")
L2_70 = get_model("llama-2-70b")
G9 = get_model("gemma-2-9b")
L8_BF16 = 16_060_522_496
L8_ATTN_PARAMS = 32 * 41_943_040     # 1,342,177,280
L8_KV = 131_072
BLOCK = 16 * L8_KV
# Llama-2-70B: 68,976,648,192 parameters (vocab 32000), 2 bytes each
L2_70_BF16 = 137_953_296_384


def gpu_with_usable(usable_bytes: int):
    """An H100 whose memory at utilisation 0.5 is exactly ``usable_bytes`` (integers: exact floats)."""
    return dataclasses.replace(H100, name="test-gpu", memory_bytes=float(2 * usable_bytes))


def toy_draft(weight_bytes_: float = 1e9) -> DraftFootprint:
    """One attention layer with Llama's 8 KV heads of 128: 2 x 8 x 128 x 2 bytes = 4,096 bytes per token."""
    return DraftFootprint("toy draft", weight_bytes_, 0.0, 1, 8, 2 * 8 * 128, 32)


# ---- weights ---------------------------------------------------------------------------------

def test_fp8_checkpoints_keep_the_embedding_and_lm_head_in_bf16():
    # untied: embedding and LM head 2 x 128256 x 4096 = 1,050,673,152 parameters at 2 bytes, the other
    # 8,030,261,248 - 1,050,673,152 = 6,979,588,096 at 1 byte
    assert weight_bytes(L8, "fp8") == 6_979_588_096 + 2 * 1_050_673_152 == 9_080_934_400
    # Gemma-2-9B ties them: one 256000 x 3584 = 917,504,000 matrix at 2 bytes; the 42 layers of
    # 44,040,192 attention + 154,140,672 MLP + 7,168 norm parameters and the final 3,584 norm at 1 byte
    gemm = 42 * (3 * 3584 * 16 * 256 + 3 * 3584 * 14336 + 2 * 3584) + 3584
    assert gemm == 8_323_900_928
    assert weight_bytes(G9, "fp8") == gemm + 2 * 917_504_000
    assert weight_bytes(G9, "bf16") == 2 * (gemm + 917_504_000)


def test_attention_weights_in_the_weight_format():
    assert attention_weight_bytes(L8, "bf16") == 2 * L8_ATTN_PARAMS == 2_684_354_560
    assert attention_weight_bytes(L8, "fp8") == L8_ATTN_PARAMS


def test_weights_per_gpu_with_pipeline_stages_and_dp_attention():
    # DP attention: every GPU of the TP group holds all the attention weights of its stage
    dp = Parallel(tp=4, pp=2, dp_attention=True)
    assert weight_bytes_per_gpu(L8, "bf16", dp) == ((L8_BF16 - 2_684_354_560) / 4 + 2_684_354_560) / 2 \
        == 3_014_198_272
    assert weight_bytes_per_gpu(L8, "bf16", Parallel(tp=4, pp=2)) == L8_BF16 / 8 == 2_007_565_312


# ---- the fewest GPUs that hold the weights (the hint of a does-not-fit error) -------------------

def test_gpus_to_hold_leaves_five_percent_headroom():
    # 137.95 GB of weights on 72 GB usable: 2 GPUs hold 68.98 GB each, over 95% of 72 (68.4): 4
    assert gpus_to_hold(L2_70, "bf16", 72e9, 0.0) == 4
    # a 40 GB reserve on each GPU: 4 x 34.5 + 40 = 74.5 > 68.4, 8 x 17.2 + 40 = 57.2 fits
    assert gpus_to_hold(L2_70, "bf16", 72e9, 40e9) == 8


def test_gpus_to_hold_gives_up_past_1024_gpus():
    # 100 MB usable: 1024 GPUs need 134.7 MB each; 2048 would fit but are not offered
    assert gpus_to_hold(L2_70, "bf16", 0.1e9, 0.0) is None
    # a reserve over the usable memory: no number of GPUs helps
    assert gpus_to_hold(L2_70, "bf16", 72e9, 70e9) is None


def test_gpus_to_hold_wants_room_strictly_left():
    # weights + reserve exactly at 95% of usable on one GPU: not room left, so 2 (a - W is exact: Sterbenz)
    usable = 200e9
    reserve = usable * 0.95 - L2_70_BF16
    assert L2_70_BF16 + reserve == usable * 0.95
    assert gpus_to_hold(L2_70, "bf16", usable, reserve) == 2


# ---- the pool ----------------------------------------------------------------------------------

def test_pool_bytes_and_tokens_exactly():
    plan = plan_memory(L8, H100, 1, "bf16", "bf16", 0.5)
    assert (plan.tp, plan.pp, plan.dp_attention) == (1, 1, False)
    assert plan.usable_bytes_per_gpu == 40e9
    assert plan.activation_reserve_bytes == 0.0
    assert plan.kv_pool_bytes_per_gpu == 40e9 - L8_BF16 == 23_939_477_504
    assert plan.kv_pool_tokens == 182_643            # 23,939,477,504 / 131,072 = 182,643.7
    reserved = plan_memory(L8, H100, 1, "bf16", "bf16", 0.5, activation_reserve_bytes=1.5e9)
    assert reserved.activation_reserve_bytes == 1.5e9
    assert reserved.kv_pool_bytes_per_gpu == 22_439_477_504
    assert reserved.kv_pool_tokens == 171_199        # / 131,072 = 171,199.6


def test_max_batch_is_whole_sequences_of_the_pool():
    plan = plan_memory(L8, H100, 1, "bf16", "bf16", 0.5)
    assert plan.max_batch(1) == 182_643
    assert plan.max_batch(100_000) == 1
    assert plan.max_batch(200_000) == 0
    with pytest.raises(InputError, match=r"^context must be > 0 tokens, got 0$"):
        plan.max_batch(0)


def test_utilisation_must_be_in_zero_one():
    assert plan_memory(L8, H100, 1, "bf16", "bf16", 1.0).usable_bytes_per_gpu == 80e9
    for bad in (0.0, 1.5):
        with pytest.raises(InputError, match=rf"^gpu memory utilisation must be in \(0, 1\], got {bad}$"):
            plan_memory(L8, H100, 1, "bf16", "bf16", bad)


def test_unknown_dtypes_name_the_key_and_the_choices():
    with pytest.raises(InputError) as kv:
        plan_memory(L8, H100, 1, "bf16", "int3")
    assert str(kv.value).startswith("kv dtype must be one of fp32, bf16, fp16, fp8, int8, q8_0")
    assert str(kv.value).endswith(", q2_k, got 'int3'")
    with pytest.raises(InputError) as w:
        weight_bytes(L8, "int3")
    assert str(w.value).startswith("weight dtype must be one of fp32, bf16, fp16, fp8")


def test_tensor_parallel_must_shard_the_heads():
    with pytest.raises(InputError, match=r"^tp 3 does not divide llama-3.1-8b's 8 KV heads"):
        plan_memory(L8, H100, 3, "bf16", "bf16")


def test_at_most_one_pipeline_stage_per_layer():
    plan = plan_memory(L8, H100, 1, "bf16", "bf16", parallel=Parallel(pp=32))
    assert plan.pp == 32 and plan.weight_bytes_per_gpu == L8_BF16 / 32
    with pytest.raises(InputError, match=r"^pp 33 exceeds llama-3.1-8b's 32 layers$"):
        plan_memory(L8, H100, 1, "bf16", "bf16", parallel=Parallel(pp=33))


def test_a_layout_of_another_tp_keeps_its_stages_node_size_and_dp_attention():
    plan = plan_memory(L8, H100, 4, "bf16", "bf16", 0.5, parallel=Parallel(tp=1, pp=2, gpus_per_node=4))
    assert (plan.tp, plan.pp) == (4, 2)
    assert plan.weight_bytes_per_gpu == L8_BF16 / 8
    # node size 3 kept: a TP group of 4 spans nodes but is no multiple of 3
    with pytest.raises(InputError, match="spans nodes but is not a multiple of gpus_per_node 3"):
        plan_memory(L8, H100, 4, "bf16", "bf16", parallel=Parallel(tp=1, gpus_per_node=3))
    # DP attention kept: each GPU holds the whole KV of its own sequences, the pool is 4 GPUs' worth
    dp = plan_memory(L8, H100, 4, "bf16", "bf16", 0.5, parallel=Parallel(tp=2, dp_attention=True))
    assert dp.dp_attention
    assert dp.kv_bytes_per_token_per_gpu == L8_KV
    assert dp.kv_pool_tokens == math.floor(dp.kv_pool_bytes_per_gpu / L8_KV) * 4
    # whole experts per GPU follow the new TP (ep = tp), so the layout stays valid
    mix = plan_memory(get_model("mixtral-8x7b"), H100, 4, "bf16", "bf16", parallel=Parallel(tp=2, ep=2))
    assert mix.tp == 4


# ---- does not fit: the target, the draft, and what the errors say ---------------------------------

def test_weights_that_do_not_fit_say_every_figure():
    with pytest.raises(DoesNotFit) as info:
        plan_memory(L70, H100, 1, "bf16", "bf16", 0.9, activation_reserve_bytes=1.05e9)
    # 70,553,706,496 parameters x 2 = 141.1 GB; 141.107 + 1.05 - 72.0 = 70.157 GB short; 4 GPUs hold it
    assert str(info.value) == (
        "llama-3.1-70b weights (bf16) need 141.1 GB per GPU at TP=1 (+1.1 GB reserve) but h100-sxm offers "
        "72.0 GB at 0.90 utilisation: short by 70.2 GB, no room for the KV cache; the weights need at least "
        "4 GPUs per replica (tensor x pipeline parallel)")
    assert info.value.shortfall_bytes == pytest.approx(141_107_412_992 + 1.05e9 - 72e9, rel=1e-12)


def test_the_error_names_the_layout():
    with pytest.raises(DoesNotFit, match=r"need 101\.5 GB per GPU at TP=4 x PP=2 \(\+0\.0 GB reserve\)"):
        plan_memory(get_model("llama-3.1-405b"), H100, 4, "bf16", "bf16", parallel=Parallel(tp=4, pp=2))
    with pytest.raises(DoesNotFit, match=r"need 94\.1 GB per GPU at TP=8 with DP attention \(\+0\.0 GB"):
        plan_memory(get_model("deepseek-v3"), H100, 8, "fp8", "bf16", parallel=Parallel(tp=8, dp_attention=True))


def test_no_hint_when_no_number_of_gpus_holds_the_weights():
    with pytest.raises(DoesNotFit) as info:
        plan_memory(L8, H100, 1, "bf16", "bf16", 0.9, activation_reserve_bytes=70e9)
    assert str(info.value).endswith("short by 14.1 GB, no room for the KV cache")


@pytest.mark.parametrize("blocks", [0.5, 1.0])
def test_a_pool_of_at_most_one_block_is_no_room_for_the_kv_cache(blocks):
    gpu = gpu_with_usable(L8_BF16 + int(blocks * BLOCK))
    with pytest.raises(DoesNotFit, match="no room for the KV cache"):
        plan_memory(L8, gpu, 1, "bf16", "bf16", 0.5)
    assert plan_memory(L8, gpu_with_usable(L8_BF16 + BLOCK + 1), 1, "bf16", "bf16", 0.5).kv_pool_tokens == 16


@pytest.mark.parametrize("blocks", [0.5, 1.0])
def test_a_target_without_a_block_of_kv_is_the_targets_error_not_the_drafts(blocks):
    # usable = the weights + half a block / exactly one block: the target alone has no room for KV
    gpu = gpu_with_usable(L8_BF16 + int(blocks * BLOCK))
    with pytest.raises(DoesNotFit) as info:
        plan_memory(L8, gpu, 1, "bf16", "bf16", 0.5, draft=toy_draft())
    assert str(info.value).startswith("llama-3.1-8b weights (bf16) need 16.1 GB per GPU at TP=1")
    assert "short by 0.0 GB" in str(info.value)
    assert info.value.shortfall_bytes == 0.0


@pytest.mark.parametrize("left", [8 * (L8_KV + 4096), 2_100_000, 16 * (L8_KV + 4096)])
def test_a_draft_leaving_at_most_one_block_of_target_and_draft_kv_is_refused(left):
    # 16 tokens of target + draft KV: 16 x (131,072 + 4,096) = 2,162,688 bytes; 2,100,000 is one block of
    # the target's KV alone but not of both
    gpu = gpu_with_usable(L8_BF16 + 1_000_000_000 + left)
    with pytest.raises(DoesNotFit) as info:
        plan_memory(L8, gpu, 1, "bf16", "bf16", 0.5, draft=toy_draft())
    assert str(info.value) == (
        "the speculative toy draft (1.0 GB per GPU at TP=1) does not fit beside llama-3.1-8b's weights "
        "(16.1 GB per GPU) on test-gpu at 0.50 utilisation: 1.0 GB left, no room for the KV cache")
    assert info.value.shortfall_bytes == 0.0


def test_a_draft_one_block_past_the_limit_fits():
    gpu = gpu_with_usable(L8_BF16 + 1_000_000_000 + 16 * (L8_KV + 4096) + 1)
    plan = plan_memory(L8, gpu, 1, "bf16", "bf16", 0.5, draft=toy_draft())
    assert plan.kv_pool_bytes_per_gpu == 16 * (L8_KV + 4096) + 1
    assert plan.kv_pool_tokens == 16
    assert plan.draft_name == "toy draft"


def test_a_draft_bigger_than_the_room_left_says_by_how_much():
    gpu = gpu_with_usable(L8_BF16 + 1_050_000_000)
    with pytest.raises(DoesNotFit) as info:
        plan_memory(L8, gpu, 1, "bf16", "bf16", 0.5, draft=toy_draft(2.35e9))
    assert str(info.value) == (
        "the speculative toy draft (2.4 GB per GPU at TP=1) does not fit beside llama-3.1-8b's weights "
        "(16.1 GB per GPU) on test-gpu at 0.50 utilisation: 1.1 GB left, no room for the KV cache")
    assert info.value.shortfall_bytes == 1_300_000_000


def test_the_draft_must_split_at_the_targets_tp():
    with pytest.raises(InputError, match=r"^speculative draft: tp 16 does not divide the toy draft's 24 attention "
                                         r"heads \(vLLM runs the draft at the target's TP\)$"):
        plan_memory(L70, H100, 16, "bf16", "bf16",
                    draft=DraftFootprint("toy draft", 1e9, 0.0, 1, 8, 2 * 8 * 128, 24))


def test_draft_kv_under_dp_attention_is_whole_on_each_gpu():
    dp = plan_memory(L8, H100, 4, "bf16", "bf16", parallel=Parallel(tp=4, dp_attention=True), draft=toy_draft())
    assert dp.draft_kv_bytes_per_token_per_gpu == 4096
    assert dp.draft_weight_bytes_per_gpu == 1e9 / 4
    plain = plan_memory(L8, H100, 4, "bf16", "bf16", draft=toy_draft())
    assert plain.draft_kv_bytes_per_token_per_gpu == 1024     # 8 heads over 4 GPUs: 2 of 8
