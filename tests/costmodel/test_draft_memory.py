"""The speculative draft in the memory plan (costmodel.draft): every figure derived by hand from the
config.json numbers (Llama-3.1-8B: hidden 4096, 32 layers, 32 heads, 8 KV heads of 128, MLP 14336,
vocab 128256; Llama-3.1-70B: 80 layers, 8 KV heads of 128) and the vLLM structures cited there."""

import math
from pathlib import Path

import pytest
from helpers import kvtune
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtune.costmodel import IDEAL, DoesNotFit, InputError, SpecConfig, StepModel, get_gpu, get_model, plan_memory
from kvtune.costmodel.draft import draft_footprint
from kvtune.costmodel.memory import weight_bytes
from kvtune.optimizer.launch import launch_settings
from kvtune.optimizer.workload import load_workload_dict

H100 = get_gpu("h100-sxm")
L8, L70 = get_model("llama-3.1-8b"), get_model("llama-3.1-70b")
DSV3 = get_model("deepseek-v3")
EXAMPLE = Path(__file__).parent.resolve().parent.parent / "examples" / "speculative-llama3.1-8b.yaml"

# Llama-3.1-8B parameters, by hand: embedding and LM head 2 x 128256 x 4096 = 1,050,673,152; per layer
# q,o 2 x 4096^2 + k,v 2 x 4096 x 1024 = 41,943,040, MLP 3 x 4096 x 14336 = 176,160,768, 2 norms 8192
# -> 218,112,000 x 32 = 6,979,584,000; final norm 4096: 8,030,261,248 parameters, 2 bytes each in bf16
L8_BF16_BYTES = 16_060_522_496
L70_KV_PER_TOKEN_TP8 = 80 * 2 * 1 * 128 * 2    # 80 layers x K,V x 1 KV head per GPU x 128 x 2 bytes = 40,960
L8_KV_PER_TOKEN_TP8 = 32 * 2 * 1 * 128 * 2     # the draft's 32 layers: 16,384


def _workload(model: str, speculative: dict) -> dict:
    return {"model": model, "hardware": {"gpu": "h100-sxm", "usd_per_gpu_hour": 3.0},
            "workload": {"rate_req_s": 1, "classes": [{"name": "a", "share": 1.0, "input_tokens": 500,
                                                       "output_tokens": 100}]},
            "slo": {"ttft_ms": 1000, "tpot_ms": 50}, "speculative": speculative}


def test_llama_8b_weights_by_hand():
    assert weight_bytes(L8, "bf16") == L8_BF16_BYTES


def test_70b_with_an_8b_draft_model_loses_the_drafts_weights_and_pays_its_kv_per_token():
    spec = load_workload_dict(_workload("llama-3.1-70b", {"method": "draft", "acceptance": 0.7,
                                                          "draft_model": "meta-llama/Llama-3.1-8B-Instruct"}))
    s = spec.speculative
    assert s is not None
    draft = s.footprint(L70, "bf16")
    plain = StepModel(L70, H100, 8, efficiency=IDEAL).memory
    spec_plan = StepModel(L70, H100, 8, efficiency=IDEAL, speculation=s.config(3, draft)).memory
    # the draft runs at the target's TP (vLLM draft_tensor_parallel_size default): 1/8 of its weights per GPU
    assert spec_plan.draft_weight_bytes_per_gpu == L8_BF16_BYTES / 8 == 2_007_565_312
    assert plain.kv_pool_bytes_per_gpu - spec_plan.kv_pool_bytes_per_gpu == L8_BF16_BYTES / 8
    assert plain.kv_bytes_per_token_per_gpu == spec_plan.kv_bytes_per_token_per_gpu == L70_KV_PER_TOKEN_TP8
    assert spec_plan.draft_kv_bytes_per_token_per_gpu == L8_KV_PER_TOKEN_TP8
    assert spec_plan.pool_bytes_per_token_per_gpu == L70_KV_PER_TOKEN_TP8 + L8_KV_PER_TOKEN_TP8
    assert spec_plan.kv_pool_tokens == math.floor(spec_plan.kv_pool_bytes_per_gpu / (40_960 + 16_384))
    assert plain.kv_pool_tokens == math.floor(plain.kv_pool_bytes_per_gpu / 40_960)
    assert spec_plan.kv_pool_tokens < 0.7 * plain.kv_pool_tokens     # ~1.33M -> ~0.91M tokens
    # k = 0 loads no draft: the plan is the plain one
    assert s.config(0, draft).k == 0
    assert StepModel(L70, H100, 8, efficiency=IDEAL, speculation=s.config(0, draft)).memory == plain


def test_eagle3_head_of_llama_8b_matches_vllms_llama_eagle3_structure():
    f = draft_footprint("eagle3", L8, "bf16")
    assert f is not None
    h, v_draft = 4096, 32000
    qkv = 2 * h * (32 * 128 + 2 * 8 * 128)       # q/k/v read [embedding, hidden]: 2h inputs
    o, mlp, lm_head = 32 * 128 * h, 3 * h * 14336, v_draft * h
    fc, norms = 3 * h * h, 4 * h                 # fc over 3 target hidden states (ReplicatedLinear); 4 RMSNorms
    assert f.sharded_weight_bytes == 2 * (qkv + o + mlp + lm_head) == 748_683_264
    assert f.replicated_weight_bytes == 2 * (fc + norms) + 8 * v_draft == 100_952_064   # + d2t (int64)
    assert f.weight_bytes == 849_635_328         # ~0.85 GB: the embedding is the target's, not counted
    one = plan_memory(L8, H100, 1, "bf16", "bf16", 0.9)
    head = plan_memory(L8, H100, 1, "bf16", "bf16", 0.9, draft=f)
    assert one.kv_pool_bytes_per_gpu - head.kv_pool_bytes_per_gpu == 849_635_328
    assert head.draft_kv_bytes_per_token_per_gpu == 1 * 2 * 8 * 128 * 2    # one layer's K and V: 4,096
    assert head.kv_pool_tokens == math.floor(head.kv_pool_bytes_per_gpu / (131_072 + 4_096))
    # at TP 4 the layer and LM head split, the fc, norms and id map do not
    assert f.weight_bytes_per_gpu(4) == 748_683_264 / 4 + 100_952_064


def test_eagle_head_shares_embedding_and_lm_head_with_the_target():
    f = draft_footprint("eagle", L8, "bf16")
    assert f is not None
    h = 4096
    layer = 2 * h * h + 2 * h * 1024 + 3 * h * 14336 + h     # attention, MLP, post-attention norm (no input norm)
    assert f.weight_bytes == 2 * (layer + 2 * h * h)          # + fc over [embedding, hidden]; bf16


def test_ngram_changes_nothing():
    spec = load_workload_dict(_workload("llama-3.1-8b", {"method": "ngram", "acceptance": 0.5}))
    s = spec.speculative
    assert s is not None and s.footprint(L8, "bf16") is None
    plain = StepModel(L8, H100, 1, efficiency=IDEAL).memory
    ngram = StepModel(L8, H100, 1, efficiency=IDEAL, speculation=s.config(4, s.footprint(L8, "bf16"))).memory
    assert ngram == plain


def test_library_spec_config_without_a_draft_plans_no_draft_memory():
    """SpecConfig built directly (no draft=) keeps its old meaning: no draft memory."""
    assert StepModel(L8, H100, 1, speculation=SpecConfig(3, 0.7)).memory == StepModel(L8, H100, 1).memory


def test_mtp_layers_are_not_in_the_targets_weights_and_are_planned_as_draft():
    assert DSV3.n_mtp_layers == 1
    # the target's count is its num_hidden_layers only: dense and MoE layers, final norm, embedding and head
    layers = (DSV3.n_dense_layers * DSV3.decoder_layer_params(moe=False)
              + DSV3.n_moe_layers * DSV3.decoder_layer_params(moe=True))
    assert DSV3.total_params == layers + DSV3.hidden + 2 * DSV3.embedding_params
    f = draft_footprint("mtp", DSV3, "fp8")
    assert f is not None
    h = DSV3.hidden
    assert f.sharded_weight_bytes == DSV3.decoder_layer_params(moe=True) * 1          # FP8 like the target
    assert f.replicated_weight_bytes == 2 * h * h * 1 + 3 * h * 2                     # eh_proj, 3 bf16 norms
    # DeepSeek-V3's card: 671B main model + 14B MTP module, of which embedding and head (2 x 0.93B) are shared
    assert 11.0e9 < f.sharded_weight_bytes + 2 * h * h < 12.5e9
    assert f.kv_bytes_per_token_per_gpu("bf16", 16) == (512 + 64) * 2                 # one MLA latent, replicated
    assert draft_footprint("mtp", L8, "bf16") is None                                 # no MTP heads: nothing


def test_a_draft_that_does_not_fit_is_refused_naming_the_draft():
    # 70B bf16 at TP 2: 70.6 GB of 72 GB usable per GPU leave ~1.4 GB; the 8B draft needs 8.0 GB per GPU
    draft = draft_footprint("draft", L70, "bf16", "llama-3.1-8b")
    plan_memory(L70, H100, 2, "bf16", "bf16", 0.9)                    # the target alone fits
    with pytest.raises(DoesNotFit) as e:
        plan_memory(L70, H100, 2, "bf16", "bf16", 0.9, draft=draft)
    msg = str(e.value)
    assert "\n" not in msg and "draft model llama-3.1-8b" in msg and "8.0 GB per GPU" in msg


def test_estimate_cli_refuses_a_draft_that_does_not_fit_in_one_line():
    code, out = kvtune("estimate", "--model", "llama-3.1-70b", "--tp", "2", "--spec-k", "3",
                       "--spec-method", "draft", "--spec-draft-model", "llama-3.1-8b", "--mode", "ideal")
    assert code == 2 and out.startswith("Error: ") and out.count("\n") == 1
    assert "draft model llama-3.1-8b" in out


def test_unknown_draft_model_is_an_input_error_naming_the_key():
    with pytest.raises(InputError, match=r"speculative\.draft_model 'acme/nope'"):
        draft_footprint("draft", L70, "bf16", "acme/nope")
    with pytest.raises(InputError, match=r"speculative\.draft_model"):
        draft_footprint("draft", L70, "bf16", None)


def test_unknown_draft_model_in_a_workload_is_one_error_line(tmp_path):
    import yaml
    path = tmp_path / "w.yaml"
    path.write_text(yaml.safe_dump(_workload("llama-3.1-70b", {"method": "draft", "acceptance": 0.7,
                                                               "draft_model": "acme/nope"})))
    code, out = kvtune("solve", path)
    assert code == 2 and out.count("\n") == 1
    assert out.startswith(f"Error: {path}: speculative.draft_model 'acme/nope'")


def test_launch_header_and_json_carry_the_draft():
    cfg = {"tp": 8, "batch_cap": 64, "kv_dtype": "bf16", "spec_k": 3, "chunk_tokens": 2048}
    r = launch_settings(L70.hf_id, cfg, 1, 0.9, {"method": "draft", "draft_model": "llama-3.1-8b"},
                        arch=L70, gpu=H100)
    m = r["memory"]
    assert m["draft"] == "draft model llama-3.1-8b" and m["draft_weight_bytes_per_gpu"] == 2_007_565_312
    assert m["draft_kv_bytes_per_token_per_gpu"] == 16_384
    plan = plan_memory(L70, H100, 8, "bf16", "bf16", 0.9, draft=draft_footprint("draft", L70, "bf16", "llama-3.1-8b"))
    assert m["kv_pool_tokens"] == plan.kv_pool_tokens
    assert "draft (draft model llama-3.1-8b) 2.0 GB + 16,384 KV bytes per pool token" in r["vllm"]
    off = launch_settings(L70.hf_id, dict(cfg, spec_k=0), 1, 0.9, {"method": "draft", "draft_model": "llama-3.1-8b"},
                          arch=L70, gpu=H100)
    assert "draft" not in off["memory"] and off["memory"]["kv_pool_tokens"] > m["kv_pool_tokens"]


def test_medusa_heads_hold_weights_and_no_kv():
    f = draft_footprint("medusa", L8, "bf16")
    assert f is not None
    h, v = 4096, 128256
    assert f.weight_bytes == 2 * 5 * (h * h + h + v * h)       # 5 heads: ResBlock (with bias) + LM head
    assert f.kv_bytes_per_token_per_gpu("bf16", 1) == 0
    with pytest.raises(InputError, match="speculative.method 'lookup-magic'"):
        draft_footprint("lookup-magic", L8, "bf16")


def test_simulate_and_estimate_clis_plan_the_eagle3_head():
    """The workload path (simulate) and the flags path (estimate, default method eagle3) both plan
    Llama-3.1-8B's EAGLE-3 head: 0.85 GB out of the pool and 4,096 more bytes per pool token."""
    from helpers import kvtune_json
    head = draft_footprint("eagle3", L8, "bf16")
    est = kvtune_json("estimate", "--model", "llama-3.1-8b", "--spec-k", "3")
    assert est["draft"] == "EAGLE-3 head of llama-3.1-8b, draft vocabulary 32000" and est["draft_weight_bytes_per_gpu"] == 849_635_328
    sim = kvtune_json("simulate", EXAMPLE, "--tp", "1", "--batch-cap", "32",
                      "--kv-dtype", "bf16", "--spec-k", "2", "--rate", "8", "--requests", "200")
    plain = kvtune_json("simulate", EXAMPLE, "--tp", "1", "--batch-cap", "32",
                        "--kv-dtype", "bf16", "--spec-k", "0", "--rate", "8", "--requests", "200")
    assert sim["config"]["kv_pool_tokens"] == est["kv_pool_tokens"] < plain["config"]["kv_pool_tokens"]
    pool_bytes = plain["config"]["kv_pool_tokens"] * 131_072   # the calibrated plan's pool, to a token
    assert pool_bytes - sim["config"]["kv_pool_tokens"] * (131_072 + 4_096) == pytest.approx(
        head.weight_bytes, abs=135_168 + 131_072)


@settings(max_examples=40)
@given(st.sampled_from(["llama-3.1-8b", "llama-3.1-70b", "qwen3-32b", "mixtral-8x7b", "mistral-7b"]),
       st.sampled_from([1, 2, 4, 8]), st.sampled_from(["eagle3", "eagle", "medusa", "draft", "ngram"]),
       st.sampled_from(["bf16", "fp8"]))
def test_a_draft_never_grows_the_pool_and_takes_exactly_its_bytes(name, tp, method, kv_dtype):
    m = get_model(name)
    if m.tp_error(tp):
        return
    draft = draft_footprint(method, m, "bf16", "smollm2-135m")
    try:
        plain = plan_memory(m, H100, tp, "bf16", kv_dtype, 0.9)
        with_draft = plan_memory(m, H100, tp, "bf16", kv_dtype, 0.9, draft=draft)
    except (DoesNotFit, InputError):
        return
    assert with_draft.kv_pool_tokens <= plain.kv_pool_tokens
    assert plain.kv_pool_bytes_per_gpu - with_draft.kv_pool_bytes_per_gpu == pytest.approx(
        with_draft.draft_weight_bytes_per_gpu, rel=1e-12)
    assert (with_draft.draft_weight_bytes_per_gpu == 0) == (draft is None)
