"""Model catalog: parameter counts against published sizes, KV bytes, config.json parsing."""

import json

import pytest

from kvtune.costmodel import InputError, get_model, list_models


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
