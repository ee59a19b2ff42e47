"""Model catalog: parameter counts against published sizes, KV bytes, config.json parsing."""

import json
import re
import pytest
from kvtune.costmodel import InputError, get_model, list_models
from kvtune.costmodel.models import MAX_DIM, ModelArch, catalog_entry, model_from_config

@pytest.mark.parametrize("name", list_models())
def test_parameter_count_matches_published_size(name):
    m = get_model(name)
    assert m.published_params > 0
    assert m.total_params == pytest.approx(m.published_params, rel=0.005)


@pytest.mark.parametrize("name,active_b", [
    ("mixtral-8x7b", 12.9),     # Mistral AI: 12.9B active of 46.7B
    ("qwen3-30b-a3b", 3.3),     # Qwen3 model card: 3.3B activated
    ("deepseek-v3", 37.0),      # DeepSeek-V3 report: 37B activated per token
])
def test_moe_active_parameters(name, active_b):
    m = get_model(name)
    assert m.active_params == pytest.approx(active_b * 1e9, rel=0.03)
    assert m.active_params < m.total_params


def test_kv_bytes_hand_derived():
    # Llama-2-70B: 2 (K,V) x 80 layers x 8 KV heads x 128 head_dim x 2 bytes = 327,680
    assert get_model("llama-2-70b").kv_bytes_per_token("bf16") == 327_680
    # Qwen3-32B has head_dim 128 != 5120/64 = 80: 2 x 64 x 8 x 128 x 2 = 262,144
    q = get_model("qwen3-32b")
    assert q.head_dim == 128 and q.kv_bytes_per_token("bf16") == 262_144
    # DeepSeek-V3 MLA: 61 layers x (512 + 64) x 2 bytes = 70,272, replicated on every TP rank
    d = get_model("deepseek-v3")
    assert d.kv_bytes_per_token("bf16") == 61 * (512 + 64) * 2
    assert d.kv_bytes_per_token_per_gpu("bf16", 8) == d.kv_bytes_per_token("bf16")


def test_fp8_kv_halves_bytes():
    for name in list_models():
        m = get_model(name)
        assert m.kv_bytes_per_token("fp8") * 2 == m.kv_bytes_per_token("bf16")


def test_kv_heads_replicate_past_tp():
    m = get_model("llama-3.1-70b")  # 8 KV heads
    full = m.kv_bytes_per_token("bf16")
    assert m.kv_bytes_per_token_per_gpu("bf16", 8) == full / 8
    # TP 16 > 8 KV heads: each rank still holds one head
    assert m.kv_bytes_per_token_per_gpu("bf16", 16) == full / 8


def test_lookup_by_short_name_and_hf_id():
    assert get_model("meta-llama/Llama-2-70b-hf").name == "llama-2-70b"
    assert get_model("meta-llama/Llama-3.1-70B-Instruct").name == "llama-3.1-70b"
    assert get_model("Qwen/Qwen3-32B").name == "qwen3-32b"
    with pytest.raises(InputError, match="unknown model 'nosuch'"):
        get_model("nosuch")


def test_local_config_json_with_text_config(tmp_path):
    cfg = {"model_type": "llava", "text_config": json.loads(open(
        __import__("kvtune.costmodel.files").costmodel.files.profiles_path("models", "llama-3.1-8b.json")).read())}
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    m = get_model(str(p))
    assert m.total_params == pytest.approx(8.03e9, rel=0.005)


def test_malformed_config_json(tmp_path):
    p = tmp_path / "config.json"
    p.write_text("{not json")
    with pytest.raises(InputError, match="malformed JSON"):
        get_model(str(p))
    p.write_text(json.dumps({"hidden_size": 4096}))
    with pytest.raises(InputError, match="missing key 'num_attention_heads'"):
        get_model(str(p))


def test_sliding_window_layers():
    g = get_model("gemma-2-9b")  # alternating local (4096) / global layers
    assert g.n_sliding_layers == 21 and g.sliding_window == 4096
    assert g.tied_embeddings
    # at 16k context, half the layers read 4k: (21*16384 + 21*4096) / 42
    assert g.kv_read_tokens(16384) == pytest.approx((16384 + 4096) / 2)
    assert g.kv_read_tokens(1000) == 1000


def test_tp_must_shard_heads():
    m = get_model("llama-2-70b")
    assert "8 KV heads" in m.tp_error(3)
    assert m.tp_error(8) is None and m.tp_error(16) is None
    # 128 is a multiple of the 8 KV heads (each rank holds one replicated head) but cannot split
    # the 64 query heads, and 3 divides neither
    assert m.tp_error(128) == "tp 128 does not divide llama-2-70b's 64 attention heads"
    assert m.tp_error(3) == "tp 3 does not divide llama-2-70b's 8 KV heads (nor is it a multiple of them)"
    assert m.tp_error(0) == "tp must be >= 1, got 0"


def test_flops_per_token_is_twice_matmul_params():
    m = get_model("llama-3.1-8b")
    # untied: the input embedding is a lookup, the LM head is a GEMM
    assert m.dense_flops_per_token() == 2 * (m.total_params - m.vocab * m.hidden)


# The config.json reader and the architecture's counts (costmodel.models), field by field: every key
# the reader understands, its alternative spellings and defaults, the sliding-window and RoPE-scaling
# rules, and the parameter and FLOP counts of small made-up architectures derived by hand. Written
# against the mutants of costmodel/models.py the older tests let through (bench/bench_mutation.py,
# bench/RESULTS-mutation.md).

BASE = {"hidden_size": 64, "num_attention_heads": 8, "num_key_value_heads": 2, "num_hidden_layers": 4,
        "intermediate_size": 256, "vocab_size": 1000}


def read(**over):
    cfg = dict(BASE)
    for k, v in over.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    return model_from_config(cfg, "toy", hf_id="org/toy", where="toy.json", published_params=1.5e6)


# ---- what the reader takes from each key --------------------------------------------------------

def test_a_plain_config_field_by_field():
    m = read()
    assert (m.name, m.hf_id, m.source, m.published_params) == ("toy", "org/toy", "toy.json", 1.5e6)
    assert (m.hidden, m.n_heads, m.n_kv_heads, m.head_dim, m.n_layers, m.intermediate, m.vocab) == \
        (64, 8, 2, 8, 4, 256, 1000)
    assert (m.tied_embeddings, m.qkv_bias, m.qk_norm) == (False, False, False)
    assert (m.n_experts, m.n_active_experts, m.moe_intermediate, m.n_shared_experts, m.n_dense_layers) == (0,) * 5
    assert (m.kv_lora_rank, m.q_lora_rank, m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim) == (0,) * 5
    assert (m.sliding_window, m.n_sliding_layers, m.n_mtp_layers, m.max_context_tokens) == (0, 0, 0, 0)


def test_other_spellings_of_the_dimensions():
    gpt = model_from_config({"d_model": 64, "n_head": 8, "n_layer": 4, "ffn_dim": 128, "vocab_size": 50}, "gpt")
    assert (gpt.hidden, gpt.n_heads, gpt.n_kv_heads, gpt.n_layers, gpt.intermediate) == (64, 8, 8, 4, 128)
    n_embd = model_from_config({"n_embd": 32, "n_head": 4, "n_layer": 2, "vocab_size": 50}, "gpt2")
    assert n_embd.hidden == 32 and n_embd.intermediate == 4 * 32 and n_embd.head_dim == 32 // 4


def test_defaults_when_keys_are_absent_or_null():
    m = read(num_key_value_heads=None, intermediate_size=None)
    assert m.n_kv_heads == 8 and m.intermediate == 256 and m.head_dim == 8
    assert read(head_dim=32).head_dim == 32
    assert read(num_key_value_heads=None).n_kv_heads == 8
    # a null is as good as absent
    cfg = dict(BASE, num_key_value_heads=None, intermediate_size=None, num_experts=None)
    n = model_from_config(cfg, "nulls")
    assert n.n_kv_heads == 8 and n.intermediate == 256 and n.n_experts == 0


def test_tied_embeddings_bias_and_qk_norm():
    assert read(tie_word_embeddings=True).tied_embeddings
    assert read(model_type="qwen2").qkv_bias and read(model_type="qwen2_moe", num_experts=4, num_experts_per_tok=2,
                                                        moe_intermediate_size=32).qkv_bias
    assert not read(model_type="qwen2", attention_bias=False).qkv_bias
    assert read(attention_bias=True).qkv_bias
    assert read(model_type="qwen3").qk_norm and read(model_type="qwen3_moe", num_experts=4, num_experts_per_tok=2,
                                                     moe_intermediate_size=32).qk_norm
    assert not read(model_type="llama").qk_norm


def test_a_multimodal_wrapper_reads_its_text_config():
    m = model_from_config({"model_type": "llava", "tie_word_embeddings": True, "text_config": dict(BASE)}, "mm")
    assert m.hidden == 64 and m.tied_embeddings
    own = model_from_config({"text_config": dict(BASE, tie_word_embeddings=False), "tie_word_embeddings": True}, "mm")
    assert not own.tied_embeddings     # the text config's own setting wins


@pytest.mark.parametrize("key", ["num_local_experts", "num_experts", "n_routed_experts"])
def test_experts_under_each_spelling(key):
    m = read(**{key: 16, "num_experts_per_tok": 4, "moe_intermediate_size": 32, "n_shared_experts": 1,
                "first_k_dense_replace": 1})
    assert (m.n_experts, m.n_active_experts, m.moe_intermediate, m.n_shared_experts, m.n_dense_layers) == \
        (16, 4, 32, 1, 1)
    assert m.is_moe and m.n_moe_layers == 3


def test_experts_without_their_own_mlp_size_use_the_intermediate_size():
    m = read(num_local_experts=8, num_experts_per_tok=2)           # Mixtral: intermediate_size is the expert's
    assert m.moe_intermediate == 256
    # a dense model ignores expert-only keys
    d = read(num_experts_per_tok=2, moe_intermediate_size=32, first_k_dense_replace=1)
    assert (d.n_active_experts, d.moe_intermediate, d.n_dense_layers) == (0, 0, 0)


def test_mla_keys():
    m = read(kv_lora_rank=16, q_lora_rank=24, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8,
             num_nextn_predict_layers=1)
    assert (m.kv_lora_rank, m.q_lora_rank, m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim, m.n_mtp_layers) == \
        (16, 24, 8, 4, 8, 1)
    assert m.is_mla
    # q_lora_rank only means something with a latent KV
    assert read(q_lora_rank=24).q_lora_rank == 0


# ---- sliding windows --------------------------------------------------------------------------

def test_sliding_window_rules():
    assert (read(sliding_window=512).sliding_window, read(sliding_window=512).n_sliding_layers) == (512, 4)  # Mistral
    assert read(sliding_window=512, use_sliding_window=False).n_sliding_layers == 0                        # Qwen2
    assert read(sliding_window=512, model_type="gemma2").n_sliding_layers == 2                             # alternate
    assert read(sliding_window=512, model_type="gemma3_text").n_sliding_layers == 2
    assert read(sliding_window=512, max_window_layers=3).n_sliding_layers == 1                              # above 3
    assert read(sliding_window=512, max_window_layers=9).n_sliding_layers == 0
    types = ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]
    assert read(sliding_window=512, layer_types=types).n_sliding_layers == 2
    assert read(sliding_window=512, layer_types=["sliding"] * 9).n_sliding_layers == 4                     # capped
    for off in (0, None, True, "4096", -1):
        m = read(sliding_window=off)
        assert (m.sliding_window, m.n_sliding_layers) == (0, 0), off


def test_sliding_reads_by_hand():
    m = read(sliding_window=512, layer_types=["sliding_attention", "full_attention"] * 2)
    # 2 of 4 layers read at most 512: (2 x 2000 + 2 x 512) / 4
    assert m.kv_read_tokens(2000) == (2 * 2000 + 2 * 512) / 4
    assert m.kv_read_tokens(300) == 300


# ---- the longest sequence -----------------------------------------------------------------------

def test_context_keys_the_smallest_wins():
    assert read(max_position_embeddings=4096).max_context_tokens == 4096
    assert read(max_position_embeddings=4096, seq_length=2048).max_context_tokens == 2048
    assert read(n_positions=1024).max_context_tokens == 1024
    assert read(max_position_embeddings=0).max_context_tokens == 0


@pytest.mark.parametrize("scaling, want", [
    ({"rope_type": "linear", "factor": 4.0}, 16384),
    ({"type": "dynamic", "factor": 2}, 8192),
    ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024}, 4096),
    ({"rope_type": "yarn", "factor": 4.0}, 16384),
    ({"rope_type": "llama3", "factor": 8.0}, 4096),      # already the stretched length
    ({"rope_type": "longrope", "factor": 8.0}, 4096),
    ({"rope_type": "su", "factor": 8.0}, 4096),
    ({"rope_type": "mrope", "factor": 8.0}, 4096),
    ({"rope_type": "default", "factor": 8.0}, 4096),
    ({"rope_type": "linear", "factor": 1.0}, 4096),
    ({"rope_type": "linear", "factor": 0.5}, 4096),      # below 1: not a stretch
    ({"rope_type": "linear", "factor": True}, 4096),     # not a number
    ({"rope_type": "linear"}, 4096),
    ({"rope_type": "linear", "factor": 2e9}, MAX_DIM),  # capped
])
def test_context_follows_rope_scaling(scaling, want):
    assert read(max_position_embeddings=4096, rope_scaling=scaling).max_context_tokens == want


# ---- what the reader refuses, and how it says so ------------------------------------------------

@pytest.mark.parametrize("key, value, message", [
    ("hidden_size", 64.5, "toy.json: key 'hidden_size' must be a whole number, got 64.5"),
    ("hidden_size", True, "toy.json: key 'hidden_size' must be a whole number, got True"),
    ("hidden_size", "64", "toy.json: key 'hidden_size' must be a whole number, got '64'"),
    ("hidden_size", float("nan"), "toy.json: key 'hidden_size' must be a whole number, got nan"),
    ("hidden_size", 0, f"toy.json: key 'hidden_size' = 0 must be in 1..{MAX_DIM}"),
    ("vocab_size", 2**31, f"toy.json: key 'vocab_size' = 2147483648 must be in 1..{MAX_DIM}"),
    ("num_experts", -1, f"toy.json: key 'num_experts' = -1 must be in 0..{MAX_DIM}"),
    ("hidden_size", "x" * 50, "toy.json: key 'hidden_size' must be a whole number, got 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxx...(52 characters)"),
    ("num_key_value_heads", 3, "toy.json: model toy: num_attention_heads 8 is not a multiple of num_key_value_heads 3"),
])
def test_bad_values_name_the_file_and_the_key(key, value, message):
    with pytest.raises(InputError) as info:
        read(**{key: value})
    assert str(info.value) == message


def test_a_whole_float_is_a_whole_number():
    assert read(hidden_size=64.0).hidden == 64


@pytest.mark.parametrize("missing", ["hidden_size", "num_attention_heads", "num_hidden_layers", "vocab_size"])
def test_a_missing_dimension_is_named(missing):
    with pytest.raises(InputError, match=rf"^toy\.json: missing key '{missing}'$"):
        read(**{missing: None})


def test_rules_across_keys():
    with pytest.raises(InputError, match=r"^toy\.json: model toy: num_experts_per_tok 9 must be in 1\.\.8$"):
        read(num_experts=8, num_experts_per_tok=9)
    with pytest.raises(InputError, match=r"^toy\.json: model toy: num_experts_per_tok 0 must be in 1\.\.8$"):
        read(num_experts=8)
    with pytest.raises(InputError, match=r"^toy\.json: model toy: n_dense_layers 5 exceeds the 4 layers$"):
        read(num_experts=8, num_experts_per_tok=2, first_k_dense_replace=5)
    assert read(num_experts=8, num_experts_per_tok=8, first_k_dense_replace=4).n_moe_layers == 0
    with pytest.raises(InputError, match=r"^toy\.json: config must be a JSON object$"):
        model_from_config([1, 2], "toy", where="toy.json")


def test_the_architecture_checks_its_own_fields():
    fields = dict(name="x", hf_id="", n_layers=2, hidden=8, n_heads=2, n_kv_heads=1, head_dim=4, intermediate=16,
                  vocab=10)
    assert ModelArch(**fields).n_layers == 2
    with pytest.raises(InputError, match=rf"^model x: n_layers must be a whole number in 1\.\.{MAX_DIM}, got 0$"):
        ModelArch(**{**fields, "n_layers": 0})
    with pytest.raises(InputError, match=r"^model x: hidden must be a whole number in 1\.\.\d+, got True$"):
        ModelArch(**{**fields, "hidden": True})
    with pytest.raises(InputError, match=r"^model x: vocab must be a whole number in 1\.\.\d+, got 10\.0$"):
        ModelArch(**{**fields, "vocab": 10.0})
    assert ModelArch(**{**fields, "vocab": MAX_DIM}).vocab == MAX_DIM
    with pytest.raises(InputError, match=r"^model x: sliding_window must be a whole number in 0\.\.\d+, got -1$"):
        ModelArch(**{**fields, "sliding_window": -1})
    with pytest.raises(InputError, match=r"^model x: n_mtp_layers must be a whole number in 0\.\.\d+, got False$"):
        ModelArch(**{**fields, "n_mtp_layers": False})
    assert ModelArch(**{**fields, "n_sliding_layers": 2}).n_sliding_layers == 2
    with pytest.raises(InputError, match=r"^model x: n_sliding_layers 3 exceeds the 2 layers$"):
        ModelArch(**{**fields, "n_sliding_layers": 3})
    with pytest.raises(InputError, match=r"^model x: an MoE model needs moe_intermediate_size \(or "
                                         r"intermediate_size\) >= 1$"):
        ModelArch(**{**fields, "n_experts": 4, "n_active_experts": 1})


# ---- counts by hand ---------------------------------------------------------------------------

def test_dense_gqa_counts_by_hand():
    m = read()
    # per layer: q 64 x 64, k and v 64 x 16 each, o 64 x 64 = 10,240; MLP 3 x 64 x 256 = 49,152; 2 norms 128
    assert m.attention_params == 4 * 10_240
    assert m.decoder_layer_params(moe=False) == 10_240 + 49_152 + 128
    # + final norm 64 + embedding and LM head 2 x 1000 x 64
    assert m.total_params == 4 * (10_240 + 49_152 + 128) + 64 + 128_000 == m.active_params
    assert m.embedding_params == 64_000
    assert m.matmul_params_per_token == m.total_params - 64_000
    assert m.dense_flops_per_token() == 2.0 * m.matmul_params_per_token
    # K and V of 2 heads of 8 per layer: 32 elements
    assert m.kv_elements_per_token_per_layer() == 32
    assert m.kv_bytes_per_token("bf16") == 4 * 32 * 2 and m.kv_bytes_per_token("fp8") == 4 * 32
    assert m.kv_bytes_per_token_per_gpu("bf16", 2) == 4 * 2 * 1 * 8 * 2
    assert m.kv_bytes_per_token_per_gpu("bf16", 4) == 4 * 2 * 1 * 8 * 2    # 2 heads over 4: one each
    # QK^T and PV: 2 x 2 FLOPs per head-dim element per head per layer
    assert m.attn_flops_per_token_per_ctx() == 4 * 8 * 2 * 2 * 8
    tied = read(tie_word_embeddings=True)
    assert tied.total_params == m.total_params - 64_000 and tied.matmul_params_per_token == tied.total_params


def test_bias_and_qk_norm_counts():
    base = read().attention_params
    # q/k/v biases: (8 + 2 x 2) x 8 = 96 per layer; q/k norms: 2 x 8 = 16 per layer
    assert read(model_type="qwen2").attention_params == base + 4 * 96
    assert read(model_type="qwen3").attention_params == base + 4 * 16


def test_moe_counts_by_hand():
    m = read(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, n_shared_experts=1,
             first_k_dense_replace=1)
    expert = 3 * 64 * 32                     # 6,144
    moe_layer_mlp = (8 + 1) * expert + 64 * 8   # all experts, the shared one and the router
    assert m.decoder_layer_params(moe=True) == 10_240 + moe_layer_mlp + 128
    assert m.decoder_layer_params(moe=False) == 10_240 + 49_152 + 128
    assert m.expert_params_total == 3 * 8 * expert
    assert m.routed_active_params == 3 * 2 * expert
    norms_emb = 4 * 128 + 64 + 128_000
    assert m.total_params == 4 * 10_240 + 49_152 + 3 * moe_layer_mlp + norms_emb
    assert m.active_params == 4 * 10_240 + 49_152 + 3 * ((2 + 1) * expert + 64 * 8) + norms_emb


def test_mla_counts_by_hand():
    m = read(kv_lora_rank=16, q_lora_rank=24, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8)
    q = 64 * 24 + 24 + 24 * 8 * (8 + 4)
    kv = 64 * (16 + 4) + 16 + 16 * 8 * (8 + 8)
    o = 8 * 8 * 64
    assert m.attention_params == 4 * (q + kv + o)
    no_q_lora = read(kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8)
    assert no_q_lora.attention_params == 4 * (64 * 8 * 12 + kv + o)
    # the cache holds the latent and the rope key, replicated on every rank
    assert m.kv_elements_per_token_per_layer() == 20
    assert m.kv_bytes_per_token_per_gpu("bf16", 4) == m.kv_bytes_per_token("bf16") == 4 * 20 * 2
    assert m.attn_flops_per_token_per_ctx() == 4 * 8 * 2 * (2 * 16 + 4)
    assert m.tp_error(3) == "tp 3 does not divide toy's 8 attention heads"   # no KV-head rule for MLA
    assert m.tp_error(8) is None


# ---- finding a model ----------------------------------------------------------------------------

def test_lookup_spellings():
    assert get_model("Llama-3.1-8B-Instruct").name == "llama-3.1-8b"
    assert get_model("  LLAMA-3.1-8B  ").name == "llama-3.1-8b"
    assert get_model("meta-llama/Meta-Llama-3.1-8B-Instruct").name == "llama-3.1-8b"
    assert get_model("llama-2-70b-chat").name == "llama-2-70b"
    m = get_model("llama-3.1-8b")
    assert m.hf_id == "meta-llama/Llama-3.1-8B-Instruct" and m.source == "profiles/models/llama-3.1-8b.json"
    assert m.published_params == pytest.approx(8.03e9)
    assert catalog_entry("meta-llama/Llama-3.1-8B-Instruct")[0] == "llama-3.1-8b"
    assert catalog_entry("nosuch") is None and catalog_entry("") is None and catalog_entry("  ") is None


def test_empty_names_and_missing_files_say_so(tmp_path):
    for bad in ("", "   "):
        with pytest.raises(InputError, match=r"^model name is empty$"):
            get_model(bad)
    with pytest.raises(InputError, match=r"^model config .*nosuch\.json: no such file$"):
        get_model(str(tmp_path / "nosuch.json"))
    d = tmp_path / "mymodel"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(BASE))
    m = get_model(str(d))
    assert m.name == "mymodel" and m.source == str(d / "config.json")
    with pytest.raises(InputError) as info:
        get_model("nosuch-model")
    assert str(info.value).startswith("unknown model 'nosuch-model'; use a catalog name (llama-2-7b, llama-2-70b, ")
    assert str(info.value).endswith("), a Hugging Face id from that catalog, or a path to a config.json")


# ---- edges the first pass left open -------------------------------------------------------------

def test_the_smallest_valid_dimensions_are_one():
    m = model_from_config({"hidden_size": 1, "num_attention_heads": 1, "num_key_value_heads": 1, "head_dim": 1,
                           "num_hidden_layers": 1, "intermediate_size": 1, "vocab_size": 1}, "tiny")
    assert (m.hidden, m.n_heads, m.n_kv_heads, m.head_dim, m.n_layers, m.intermediate, m.vocab) == (1,) * 7
    assert read(vocab_size=MAX_DIM).vocab == MAX_DIM          # the largest too
    assert read(sliding_window=1).sliding_window == 1
    assert read(num_experts=8, num_experts_per_tok=1).n_active_experts == 1


@pytest.mark.parametrize("key", ["num_attention_heads", "num_key_value_heads", "head_dim", "num_hidden_layers",
                                 "intermediate_size"])
def test_zero_sized_dimensions_are_refused_by_the_reader(key):
    with pytest.raises(InputError) as info:
        read(**{key: 0})
    assert str(info.value) == f"toy.json: key '{key}' = 0 must be in 1..{MAX_DIM}"


@pytest.mark.parametrize("key, extra", [
    ("num_key_value_heads", {}), ("head_dim", {}), ("intermediate_size", {}), ("num_experts", {}),
    ("kv_lora_rank", {}), ("n_shared_experts", {}), ("qk_nope_head_dim", {}), ("qk_rope_head_dim", {}),
    ("v_head_dim", {}), ("num_nextn_predict_layers", {}), ("max_position_embeddings", {}),
    ("num_experts_per_tok", {"num_experts": 8}), ("moe_intermediate_size", {"num_experts": 8}),
    ("first_k_dense_replace", {"num_experts": 8, "num_experts_per_tok": 2}),
    ("q_lora_rank", {"kv_lora_rank": 16}), ("max_window_layers", {"sliding_window": 512}),
])
def test_every_key_read_names_the_file_when_it_is_not_a_number(key, extra):
    with pytest.raises(InputError) as info:
        read(**extra, **{key: "x"})
    assert str(info.value) == f"toy.json: key '{key}' must be a whole number, got 'x'"


def test_an_original_length_that_is_not_a_number_names_rope_scaling():
    with pytest.raises(InputError) as info:
        read(max_position_embeddings=4096, rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                                         "original_max_position_embeddings": "x"})
    assert str(info.value) == "toy.json: rope_scaling: key 'original_max_position_embeddings' must be a whole number, got 'x'"


def test_a_default_out_of_range_names_the_key_it_stands_for():
    with pytest.raises(InputError) as info:
        read(hidden_size=MAX_DIM, intermediate_size=None)
    assert str(info.value) == f"toy.json: key 'intermediate_size' = {4 * MAX_DIM} must be in 1..{MAX_DIM}"


def test_head_dim_defaults_to_whole_division():
    # hidden 60 over 8 heads: 7 (as transformers' hidden_size // num_attention_heads)
    assert read(hidden_size=60, num_key_value_heads=8).head_dim == 7


def test_experts_without_any_mlp_size_default_to_four_times_hidden():
    m = read(intermediate_size=None, num_experts=4, num_experts_per_tok=2)
    assert m.moe_intermediate == 4 * 64 and m.intermediate == 4 * 64


def test_a_text_config_without_tying_is_untied():
    assert not model_from_config({"text_config": dict(BASE)}, "mm").tied_embeddings


def test_more_rope_spellings():
    assert read(max_position_embeddings=4096, rope_scaling={"type": "llama3", "factor": 8.0}).max_context_tokens == 4096
    assert read(max_position_embeddings=4096, rope_scaling={"factor": 4.0}).max_context_tokens == 4096
    assert read(max_position_embeddings=4096, rope_scaling={"type": "linear", "factor": 1.5}).max_context_tokens == 6144


def test_stated_lengths_of_zero_do_not_count_and_one_does():
    assert read(max_position_embeddings=4096, seq_length=0).max_context_tokens == 4096
    assert read(max_position_embeddings=1).max_context_tokens == 1


def test_values_are_clipped_past_forty_characters():
    exactly = "x" * 38                                  # repr 40 characters: whole
    with pytest.raises(InputError) as info:
        read(hidden_size=exactly)
    assert str(info.value).endswith(f"got {exactly!r}")
    with pytest.raises(InputError) as info:
        read(hidden_size="x" * 39)                      # repr 41: clipped
    assert str(info.value).endswith("got 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxx...(41 characters)")


def test_json_that_python_cannot_hold_is_one_line(tmp_path):
    p = tmp_path / "config.json"
    p.write_text('{"hidden_size": ' + "9" * 5000 + "}")
    with pytest.raises(InputError) as info:
        get_model(str(p))
    msg = str(info.value)
    # Python's own words, which 3.11 changed ("(4300 digits)"; 3.10: "(4300)")
    assert re.match(re.escape(f"{p}: malformed JSON (Exceeds the limit (4300") + r"( digits)?\) for integer string conversion", msg), msg
    assert len(msg) == len(f"{p}: malformed JSON ()") + 80        # the exception's first line, cut at 80
    p.write_bytes(b'{"hidden_size": 64, "name": "caf\xe9"}')
    with pytest.raises(InputError, match=r"not UTF-8 text .*; a model config \(config\.json\) is a text file$"):
        get_model(str(p))


def test_lookup_strips_the_variant_suffixes_on_either_side():
    assert get_model("meta-llama/Llama-3.1-8B").name == "llama-3.1-8b"      # the catalog's id ends -Instruct
    assert get_model("meta-llama/Llama-2-70b").name == "llama-2-70b"        # the catalog's id ends -hf
    assert catalog_entry(None) is None


def test_published_size_and_defaults_of_the_reader():
    assert get_model("llama-3.1-8b").published_params == pytest.approx(8.03e9, rel=1e-12)
    m = model_from_config(dict(BASE), "plain")
    assert (m.hf_id, m.published_params, m.source) == ("", 0.0, "plain")
    assert m.kv_bytes_per_token() == m.kv_bytes_per_token("bf16")


def test_a_fault_nobody_foresaw_is_one_line_naming_the_file(monkeypatch):
    import kvtune.costmodel.models as models

    def broken(*a, **k):
        raise KeyError("boom")

    monkeypatch.setattr(models, "_model_from_config", broken)
    with pytest.raises(InputError) as info:
        model_from_config(dict(BASE), "toy", where="toy.json")
    assert str(info.value).startswith("toy.json: cannot read this model config (")
    assert str(info.value).endswith("KeyError: 'boom')")
    with pytest.raises(InputError, match=r"^toy: cannot read this model config \("):
        model_from_config(dict(BASE), "toy")
