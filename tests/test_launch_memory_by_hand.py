"""TensorRT-LLM's memory setting with a speculative draft, derived by hand (issue 25: a fraction that
ignored the draft's weights, 0.8395 instead of 0.8674 for Llama-3.1-70B with a Llama-3.1-8B draft,
passed every test).

``kv_cache_config.free_gpu_memory_fraction`` is a share of the memory left free after the model
*and the draft* have loaded (TensorRT-LLM 1.0 KvCacheConfig, llm-api reference). Llama-3.1-70B at
TP8 on H100 (80 GB, 0.9 utilisation) with a Llama-3.1-8B draft at the target's TP:

    target weights per GPU  70,553,706,496 params x 2 bytes / 8 = 17,638,426,624
    draft weights per GPU    8,030,261,248 params x 2 bytes / 8 =  2,007,565,312
    kvtune's pool per GPU    72e9 - 17,638,426,624 - 2,007,565,312 = 52,354,008,064
    free after loading       80e9 - 17,638,426,624 - 2,007,565,312 = 60,354,008,064
    fraction                 52,354,008,064 / 60,354,008,064 = 0.86745  (written down to 4 digits: 0.8674)
"""

import pytest
import yaml

from kvtune.costmodel import get_gpu, get_model
from kvtune.optimizer.launch import build_pick, launch_for_pick
from kvtune.optimizer.launch.trtllm import free_fraction

L70 = get_model("llama-3.1-70b")
H100 = get_gpu("h100-sxm")


def test_the_fraction_is_of_the_memory_left_after_the_model_and_the_draft():
    p = build_pick(L70.hf_id, {"tp": 8, "batch_cap": 64, "kv_dtype": "bf16", "spec_k": 3, "chunk_tokens": 2048}, 1,
                   0.9, {"method": "draft", "draft_model": "llama-3.1-8b"}, arch=L70, gpu=H100, weights="bf16")
    m = p.memory
    assert m.weight_bytes_per_gpu == 17_638_426_624 and m.draft_weight_bytes_per_gpu == 2_007_565_312
    assert m.kv_pool_bytes_per_gpu == pytest.approx(52_354_008_064, rel=1e-12)
    assert free_fraction(p) == pytest.approx(52_354_008_064 / 60_354_008_064, rel=1e-9)
    api = yaml.safe_load(launch_for_pick(p)["trtllm"]["config_yaml"])
    assert api["kv_cache_config"]["free_gpu_memory_fraction"] == 0.8674
