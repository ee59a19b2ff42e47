"""Launch settings: the flags each engine documents, mapped from the recommended config."""

import json
import shlex

import yaml

from optimizer.launch import launch_settings

CFG = {"tp": 4, "batch_cap": 128, "kv_dtype": "fp8", "spec_k": 3, "chunk_tokens": 4096}
SPEC = {"method": "eagle3", "draft_model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"}


def _argv(cmd: str) -> list[str]:
    return shlex.split(cmd.replace("\\\n", " "))


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_vllm_command_maps_every_knob():
    argv = _argv(launch_settings("meta-llama/Llama-3.1-8B-Instruct", CFG, 2, 0.9, SPEC)["vllm"])
    assert argv[:3] == ["vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct"]
    assert _flag(argv, "--tensor-parallel-size") == "4"
    assert _flag(argv, "--max-num-seqs") == "128"
    assert _flag(argv, "--max-num-batched-tokens") == "4096"
    assert _flag(argv, "--kv-cache-dtype") == "fp8"
    assert _flag(argv, "--gpu-memory-utilization") == "0.9"
    sc = json.loads(_flag(argv, "--speculative-config"))
    assert sc == {"method": "eagle3", "num_speculative_tokens": 3, "model": SPEC["draft_model"]}
    assert "--enable-prefix-caching" in argv


def test_bf16_no_spec_omits_options():
    cfg = dict(CFG, kv_dtype="bf16", spec_k=0)
    s = launch_settings("m", cfg, 1, 0.85, None)
    argv = _argv(s["vllm"])
    assert _flag(argv, "--kv-cache-dtype") == "auto" and "--speculative-config" not in argv
    sg = _argv(s["sglang"])
    assert "--kv-cache-dtype" not in sg and "--speculative-algorithm" not in sg
    api = yaml.safe_load(s["trtllm"]["config_yaml"])
    assert api["kv_cache_config"]["dtype"] == "auto" and "speculative_config" not in api


def test_sglang_chain_of_k_drafts_verifies_k_plus_one():
    argv = _argv(launch_settings("m", CFG, 1, 0.88, SPEC)["sglang"])
    assert argv[:3] == ["python", "-m", "sglang.launch_server"]
    assert _flag(argv, "--model-path") == "m" and _flag(argv, "--tp-size") == "4"
    assert _flag(argv, "--max-running-requests") == "128" and _flag(argv, "--chunked-prefill-size") == "4096"
    assert "--enable-mixed-chunk" in argv  # the simulated mixed steps; SGLang's default prefills alone
    assert _flag(argv, "--kv-cache-dtype") == "fp8_e4m3" and _flag(argv, "--mem-fraction-static") == "0.88"
    assert _flag(argv, "--speculative-algorithm") == "EAGLE3"
    assert _flag(argv, "--speculative-num-steps") == "3" and _flag(argv, "--speculative-eagle-topk") == "1"
    assert _flag(argv, "--speculative-num-draft-tokens") == "4"
    assert _flag(argv, "--speculative-draft-model-path") == SPEC["draft_model"]


def test_trtllm_command_and_llm_api_yaml():
    t = launch_settings("m", CFG, 1, 0.9, SPEC)["trtllm"]
    argv = _argv(t["command"])
    assert argv[:2] == ["trtllm-serve", "m"]
    assert _flag(argv, "--tp_size") == "4" and _flag(argv, "--max_batch_size") == "128"
    assert _flag(argv, "--max_num_tokens") == "4096" and _flag(argv, "--extra_llm_api_options") == "config.yaml"
    api = yaml.safe_load(t["config_yaml"])
    assert api["max_batch_size"] == 128 and api["max_num_tokens"] == 4096
    assert api["kv_cache_config"]["dtype"] == "fp8" and api["kv_cache_config"]["free_gpu_memory_fraction"] == 0.9
    assert api["speculative_config"] == {"decoding_type": "Eagle3", "max_draft_len": 3,
                                         "speculative_model_dir": SPEC["draft_model"]}


def test_k8s_deployment_replicas_and_gpu_limit():
    doc = yaml.safe_load(launch_settings("meta-llama/Llama-3.1-70B-Instruct", CFG, 5, 0.9, SPEC,
                                         name="kvtune-llama-3.1-70b")["k8s"])
    assert doc["kind"] == "Deployment" and doc["spec"]["replicas"] == 5
    c = doc["spec"]["template"]["spec"]["containers"][0]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 4
    assert c["command"] == ["vllm", "serve", "meta-llama/Llama-3.1-70B-Instruct"]
    assert c["args"][c["args"].index("--tensor-parallel-size") + 1] == "4"
    assert doc["metadata"]["name"] == "kvtune-llama-3-1-70b"
