"""The launch builders on picks written by hand (issue 25 item 1): every flag and value each engine
gets, derived here from the pick's own numbers, plus each emitted line checked against the engines'
argument definitions (tests/contracts/*.json via tests/engine_contracts.py).

The memory plan is given directly (``MemoryFacts``), so each figure is arithmetic on round numbers:
an 80 GB GPU at gpu_mem_util 0.9 (72 GB), weights 8 GB per GPU, an activation reserve of 2 GB, a
KV pool of 62 GB per GPU holding 10,050 tokens (chosen so that each engine's block rounding gives a
different figure: vLLM (10,050 // 16 - 1) x 16 = 10,032; TensorRT-LLM 10,050 // 32 x 32 = 10,048;
SGLang the pool itself, 10,050).
"""

from __future__ import annotations

import dataclasses
import json
import math
import pytest
import re
import yaml
from engine_contracts import check_argv, check_trtllm_api, trtllm_startup_errors, vllm_startup_errors
from launch_picks import M, MEM, POOL, flag, pick
from kvtune.optimizer.launch import ENGINE_VERSIONS, Unsupported, argv_of, launch_for_pick, scheduling, context as lc, kubernetes as k8s, MemoryFacts, disaggregated_launch, launch_settings, pick as lp, build_pick
from kvtune.optimizer.launch.llamacpp import llamacpp_argv
from kvtune.optimizer.launch.sglang import sglang_argv, sglang_mixed_chunk
from kvtune.optimizer.launch.shell import command, comment_block
from kvtune.optimizer.launch.trtllm import free_fraction, trtllm_api, trtllm_argv
from kvtune.optimizer.launch.vllm import vllm_argv
from statistics import NormalDist
from kvtune.costmodel.traffic import LengthDist, RequestClass, Trace, Workload
from kvtune.costmodel import get_gpu, get_model

def test_each_engine_is_sized_to_the_longest_request_when_the_pool_holds_it():
    p = pick()
    v = lc.vllm_max_model_len(p)
    assert v == lc.Sized(5000, "context: --max-model-len 5,000 = the longest prompt + output kvtune simulated "
                               "(the KV pool holds 10,032)")
    # SGLang: the request + 1 (context_len - 1) and the prompt + 6 (- 1 - 5): max(5,001, 4,006)
    s = lc.sglang_context_length(p)
    assert s == lc.Sized(5001, "context: --context-length 5,001 = the longest prompt + output kvtune simulated "
                               "(the KV pool holds 10,050)")
    assert lc.trtllm_max_seq_len(p) == lc.Sized(5000, "context: max_seq_len 5,000 = the longest prompt + output "
                                                      "kvtune simulated (the KV pool holds 10,048)")


def test_a_prefill_pool_needs_the_longest_prompt_and_its_first_token():
    p = pick()
    v = lc.vllm_max_model_len(p, "prefill")
    assert v.value == 4001 and "= the longest prompt + its first token kvtune simulated" in v.note
    assert lc.sglang_context_length(p, "prefill").value == 4006      # max(4,002, 4,000 + 6)
    assert lc.trtllm_max_seq_len(p, "decode").value == 5000
    assert lc.sglang_context_length(pick(max_prompt_tokens=4998)).value == 5004   # max(5,001, 5,004)
    assert lc.sglang_context_length(pick(max_prompt_tokens=None)).value == 5001
    # no prompt length known: the prefill pool is sized to what its pool holds
    assert lc.vllm_max_model_len(pick(max_prompt_tokens=None), "prefill").value == 10_032


def test_a_longest_request_over_the_pool_gets_what_the_pool_holds_in_whole_blocks():
    p = pick(max_request_tokens=20_000)
    assert lc.vllm_max_model_len(p) == lc.Sized(10_032, (
        "context: the longest request kvtune simulated needs 20,000 tokens but the 10,050-token KV pool holds "
        "10,032: --max-model-len 10,032; vLLM refuses longer requests"))
    assert lc.trtllm_max_seq_len(p).value == 10_048 and "TensorRT-LLM refuses" in lc.trtllm_max_seq_len(p).note
    assert lc.sglang_context_length(p).value == 10_050
    assert lc.sglang_context_length(p).note.endswith(": --context-length 10,050; SGLang refuses longer requests")
    # exactly the pool: still the request
    assert lc.vllm_max_model_len(pick(max_request_tokens=10_032)).value == 10_032
    assert lc.vllm_max_model_len(pick(max_request_tokens=10_033)).value == 10_032


def test_never_more_than_the_models_own_context():
    big = dataclasses.replace(MEM, kv_pool_tokens=10**6, kv_pool_tokens_per_gpu=10**6)
    p = pick(memory=big, max_request_tokens=200_000, model_context_tokens=8192)
    assert lc.vllm_max_model_len(p).value == 8192
    assert lc.vllm_max_model_len(pick(memory=big, max_request_tokens=8192, model_context_tokens=8192)).value == 8192
    # an unknown model context (0) caps nothing
    assert lc.vllm_max_model_len(pick(memory=big, max_request_tokens=200_000, model_context_tokens=0)).value == 200_000


def test_without_workload_lengths_the_pool_sizes_the_context_unless_it_holds_the_whole_model_context():
    p = pick(max_request_tokens=None, max_prompt_tokens=None)
    assert lc.vllm_max_model_len(p) == lc.Sized(10_032, "context: --max-model-len 10,032, the most the "
                                                        "10,050-token KV pool holds (no workload lengths given)")
    assert lc.vllm_max_model_len(dataclasses.replace(p, model_context_tokens=10_032)) == lc.Sized(None)
    assert lc.vllm_max_model_len(dataclasses.replace(p, model_context_tokens=10_033)).value == 10_032
    assert lc.vllm_max_model_len(dataclasses.replace(p, model_context_tokens=0)).value == 10_032
    assert lc.vllm_max_model_len(dataclasses.replace(p, memory=None)) == lc.Sized(None)
    # no pool: the request alone
    assert lc.vllm_max_model_len(pick(memory=None)) == lc.Sized(
        5000, "context: --max-model-len 5,000 = the longest prompt + output kvtune simulated")


def test_a_pool_without_one_whole_block_is_refused():
    tiny = dataclasses.replace(MEM, kv_pool_tokens=31, kv_pool_tokens_per_gpu=31)
    with pytest.raises(Unsupported, match=r"the KV pool \(31 tokens per GPU\) holds no whole vLLM block"):
        lc.vllm_max_model_len(pick(memory=tiny))            # (31 // 16 - 1) x 16 = 0
    with pytest.raises(Unsupported, match="no whole TensorRT-LLM block"):
        lc.trtllm_max_seq_len(pick(memory=tiny))            # 31 // 32 x 32 = 0
    assert lc.sglang_context_length(pick(memory=tiny)).value == 31
    ok = dataclasses.replace(MEM, kv_pool_tokens=32, kv_pool_tokens_per_gpu=32)
    assert lc.vllm_max_model_len(pick(memory=ok)).value == 16 and lc.trtllm_max_seq_len(pick(memory=ok)).value == 32


def test_request_lengths_of_classes_and_traces():
    from kvtune.optimizer.workload import load_workload_dict
    d = {"model": "llama-3.1-8b", "hardware": {"gpu": "h100-sxm", "usd_per_gpu_hour": 2.0},
         "workload": {"rate_req_s": 1, "classes": [
             {"name": "a", "share": 0.5, "input_tokens": 1000, "output_tokens": 300},
             {"name": "b", "share": 0.5, "input_tokens": {"dist": "lognormal", "mean": 500, "sigma": 0.5, "max": 3000},
              "output_tokens": {"dist": "lognormal", "mean": 100, "sigma": 0.5, "max": 700}}]},
         "slo": {"ttft_ms": 1000, "tpot_ms": 50}}
    w = load_workload_dict(d).workload
    assert lc.request_lengths(w) == lc.RequestLengths(3000, 3700)
    assert lc.request_lengths(None) is None


# --- vLLM -------------------------------------------------------------------------------------------------------

def test_vllm_argv_of_a_plain_pick():
    argv, notes = vllm_argv(pick())
    assert argv == ["vllm", "serve", M, "--tensor-parallel-size", "2", "--max-model-len", "5000", "--max-num-seqs", "64",
                    "--max-num-batched-tokens", "2048", "--enable-chunked-prefill", "--kv-cache-dtype", "auto",
                    "--gpu-memory-utilization", "0.9", "--enable-prefix-caching", "--host", "0.0.0.0", "--port", "8000"]
    assert notes == [lc.vllm_max_model_len(pick()).note]
    assert check_argv("vllm", argv) == [] and vllm_startup_errors(argv, POOL) == []


def test_vllm_kv_dtype_caching_and_the_multi_node_form():
    argv, _ = vllm_argv(pick(kv_dtype="fp8", prefix_caching=False, gpu_mem_util=0.85), "1", "10.0.0.1", "2")
    assert flag(argv, "--kv-cache-dtype") == "fp8" and flag(argv, "--gpu-memory-utilization") == "0.85"
    assert "--no-enable-prefix-caching" in argv and "--enable-prefix-caching" not in argv
    i = argv.index("--nnodes")
    assert argv[i:i + 9] == ["--nnodes", "2", "--node-rank", "1", "--master-addr", "10.0.0.1", "--master-port",
                             "29501", "--headless"]
    argv0, _ = vllm_argv(pick(tp=16, gpus_per_node=8), "0")
    assert flag(argv0, "--nnodes") == "2" and flag(argv0, "--master-addr") == "<leader-address>"
    assert "--headless" not in argv0
    assert flag(vllm_argv(pick(kv_dtype="fp16"))[0], "--kv-cache-dtype") == "float16"
    for a in (argv, argv0):
        assert check_argv("vllm", a) == []


def test_vllm_parallel_layouts():
    argv, _ = vllm_argv(pick(tp=4, pp=2, ep=4, is_moe=True))
    assert flag(argv, "--tensor-parallel-size") == "4" and flag(argv, "--pipeline-parallel-size") == "2"
    assert "--enable-expert-parallel" in argv and "--data-parallel-size" not in argv
    argv, _ = vllm_argv(pick(tp=4, dp_attention=True, ep=4, is_moe=True))
    assert flag(argv, "--tensor-parallel-size") == "1" and flag(argv, "--data-parallel-size") == "4"
    assert check_argv("vllm", argv) == []
    assert "--pipeline-parallel-size" not in vllm_argv(pick())[0] and "--enable-expert-parallel" not in vllm_argv(pick())[0]
    with pytest.raises(Unsupported, match="DP attention: vLLM 0.33.0 data parallelism of a dense model"):
        vllm_argv(pick(tp=4, dp_attention=True))
    with pytest.raises(Unsupported, match="expert parallel size 2: .* over TP x DP = 4 ranks, not 2"):
        vllm_argv(pick(tp=4, ep=2, is_moe=True))


def test_vllm_speculation_json():
    argv, _ = vllm_argv(pick(spec_k=3, spec_method="ngram"))
    assert json.loads(flag(argv, "--speculative-config")) == {"method": "ngram", "num_speculative_tokens": 3,
                                                             "prompt_lookup_min": 5, "prompt_lookup_max": 5}
    argv, _ = vllm_argv(pick(spec_k=2, spec_method="draft", draft_model="meta-llama/Llama-3.2-1B-Instruct"))
    assert json.loads(flag(argv, "--speculative-config")) == {"method": "draft_model", "num_speculative_tokens": 2,
                                                             "model": "meta-llama/Llama-3.2-1B-Instruct"}
    assert check_argv("vllm", argv) == []
    with pytest.raises(Unsupported, match="needs its draft model"):
        vllm_argv(pick(spec_k=2, spec_method="eagle3"))
    with pytest.raises(Unsupported, match="no draft here"):
        vllm_argv(pick(spec_k=2, spec_method="eagle3", draft_error="no draft here"))
    with pytest.raises(Unsupported, match=r"multi-token-prediction heads \(config.json num_nextn_predict_layers, "
                                          r"e.g. DeepSeek-V3\); this model has none"):
        vllm_argv(pick(spec_k=1, spec_method="mtp"))
    # a method the capability table refuses: its reason, not a lookup error
    from kvtune.optimizer.launch.vllm import vllm_speculative_config
    with pytest.raises(Unsupported, match="vLLM 0.33.0 dropped Medusa"):
        vllm_speculative_config(pick(spec_k=2, spec_method="medusa"))
    argv, _ = vllm_argv(pick(spec_k=1, spec_method="mtp", mtp_layers=1))
    assert json.loads(flag(argv, "--speculative-config")) == {"method": "mtp", "num_speculative_tokens": 1}
    # a draft length without a method (or k = 0): no speculation
    assert "--speculative-config" not in vllm_argv(pick(spec_k=3))[0]
    assert "--speculative-config" not in vllm_argv(pick(spec_k=0, spec_method="ngram"))[0]


# --- SGLang -----------------------------------------------------------------------------------------------------

def test_sglang_argv_of_a_plain_pick():
    argv, notes = sglang_argv(pick())
    assert argv == ["python", "-m", "sglang.launch_server", "--model-path", M, "--tp-size", "2", "--context-length",
                    "5001", "--max-running-requests", "64", "--chunked-prefill-size", "2048", "--max-prefill-tokens",
                    "2048", "--enable-mixed-chunk", "--mem-fraction-static", "0.9", "--host", "0.0.0.0", "--port",
                    "8000"]
    assert notes == [lc.sglang_context_length(pick()).note]
    assert check_argv("sglang", argv) == []


def test_sglang_kv_caching_parallel_and_multi_node():
    argv, _ = sglang_argv(pick(kv_dtype="fp8", prefix_caching=False, tp=4, pp=2, ep=4, dp_attention=True,
                               is_moe=True), "0", None, "2")
    assert flag(argv, "--kv-cache-dtype") == "fp8_e4m3" and "--disable-radix-cache" in argv
    assert flag(argv, "--pp-size") == "2" and flag(argv, "--ep-size") == "4" and flag(argv, "--attn-dp-size") == "4"
    assert flag(argv, "--nnodes") == "2" and flag(argv, "--node-rank") == "0"
    assert flag(argv, "--dist-init-addr") == "<leader-address>:20000"
    assert check_argv("sglang", argv) == []
    plain = sglang_argv(pick())[0]
    for f in ("--kv-cache-dtype", "--disable-radix-cache", "--pp-size", "--ep-size", "--attn-dp-size", "--nnodes"):
        assert f not in plain
    assert flag(sglang_argv(pick(tp=16), "1", "10.0.0.1:20000")[0], "--nnodes") == "2"


def test_sglang_speculation_chains_and_scheduling():
    argv, notes = sglang_argv(pick(spec_k=3, spec_method="ngram"))
    i = argv.index("--speculative-algorithm")
    assert argv[i:i + 6] == ["--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", "4",
                             "--speculative-ngram-max-bfs-breadth", "1"]
    assert "--enable-mixed-chunk" not in argv
    assert any("turns mixed chunks off under NGRAM speculation" in n for n in notes)
    argv, _ = sglang_argv(pick(spec_k=2, spec_method="eagle3", draft_model="d/eagle3"))
    i = argv.index("--speculative-algorithm")
    assert argv[i:i + 10] == ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", "d/eagle3",
                              "--speculative-num-steps", "2", "--speculative-eagle-topk", "1",
                              "--speculative-num-draft-tokens", "3"]
    assert "--enable-mixed-chunk" in argv and check_argv("sglang", argv) == []
    argv, _ = sglang_argv(pick(spec_k=1, spec_method="mtp", mtp_layers=1))
    assert flag(argv, "--speculative-algorithm") == "NEXTN" and "--speculative-draft-model-path" not in argv
    assert sglang_mixed_chunk(None, 0) and sglang_mixed_chunk("ngram", 0) and sglang_mixed_chunk(None, 3)
    assert not sglang_mixed_chunk("draft", 2) and sglang_mixed_chunk("eagle", 2) and not sglang_mixed_chunk("x", 2)
    assert scheduling("sglang", "ngram", 3) == "prefill_first" and scheduling("vllm", "ngram", 3) == "mixed"
    assert scheduling("sglang", "eagle3", 3) == "mixed"


# --- TensorRT-LLM -----------------------------------------------------------------------------------------------

def test_trtllm_fraction_is_the_pool_over_what_loading_leaves_free():
    # 62 GB pool / (80 - 8 - 2) GB free after loading = 0.885714...
    assert free_fraction(pick()) == pytest.approx(62 / 70, rel=1e-12)
    # with a 1 GB draft per GPU: the pool is 61 GB of the 69 GB left after the model and the draft
    d = dataclasses.replace(MEM, kv_pool_bytes_per_gpu=61e9, draft="llama-3.2-1b", draft_weight_bytes_per_gpu=1e9)
    assert free_fraction(pick(memory=d)) == pytest.approx(61 / 69, rel=1e-12)
    assert free_fraction(pick(memory=None)) is None
    assert free_fraction(pick(memory=dataclasses.replace(MEM, weight_bytes_per_gpu=78e9))) is None   # 0 left
    assert free_fraction(pick(memory=dataclasses.replace(MEM, weight_bytes_per_gpu=79e9))) is None
    assert free_fraction(pick(memory=dataclasses.replace(MEM, kv_pool_bytes_per_gpu=71e9))) == 1.0
    assert free_fraction(pick(memory=dataclasses.replace(MEM, kv_pool_bytes_per_gpu=-1.0))) == 0.0


def test_trtllm_api_and_argv_of_a_plain_pick():
    api, notes = trtllm_api(pick())
    assert api == {"tensor_parallel_size": 2, "max_batch_size": 64, "max_num_tokens": 2048,
                   "enable_chunked_prefill": True, "max_seq_len": 5000,
                   "kv_cache_config": {"dtype": "auto", "free_gpu_memory_fraction": 0.8857, "max_tokens": POOL,
                                       "enable_block_reuse": True}}
    assert any("free_gpu_memory_fraction 0.8857" in n and "10,050-token KV pool" in n for n in notes)
    argv, api2, _ = trtllm_argv(pick(), config="/etc/kvtune/config.yaml")
    assert argv == ["trtllm-serve", M, "--tp_size", "2", "--max_batch_size", "64", "--max_num_tokens", "2048",
                    "--extra_llm_api_options", "/etc/kvtune/config.yaml", "--host", "0.0.0.0", "--port", "8000"]
    assert api2 == api
    assert check_argv("trtllm", argv) == [] and check_trtllm_api(api) == [] and trtllm_startup_errors(argv, api) == []


def test_trtllm_layouts_kv_and_no_memory_plan():
    api, notes = trtllm_api(pick(tp=4, pp=2, ep=4, dp_attention=True, is_moe=True, kv_dtype="fp8",
                                 prefix_caching=False, memory=None, max_request_tokens=None))
    assert api["pipeline_parallel_size"] == 2 and api["moe_expert_parallel_size"] == 4
    assert api["enable_attention_dp"] is True and "max_seq_len" not in api
    assert api["kv_cache_config"] == {"dtype": "fp8", "enable_block_reuse": False}
    assert any("no memory plan to convert" in n for n in notes)
    argv, _, _ = trtllm_argv(pick(tp=4, pp=2, ep=4, is_moe=True))
    assert flag(argv, "--pp_size") == "2" and flag(argv, "--ep_size") == "4"
    plain = trtllm_api(pick())[0]
    assert not {"pipeline_parallel_size", "moe_expert_parallel_size", "enable_attention_dp"} & set(plain)
    assert "--pp_size" not in trtllm_argv(pick())[0] and "--ep_size" not in trtllm_argv(pick())[0]
    with pytest.raises(Unsupported, match="a replica over 2 nodes: TensorRT-LLM starts it under MPI"):
        trtllm_api(pick(tp=16))


def test_trtllm_speculation():
    api, _ = trtllm_api(pick(spec_k=3, spec_method="ngram"))
    assert api["speculative_config"] == {"decoding_type": "NGram", "max_draft_len": 3, "max_matching_ngram_size": 5}
    api, _ = trtllm_api(pick(spec_k=2, spec_method="draft", draft_model="d/1b"))
    assert api["speculative_config"] == {"decoding_type": "DraftTarget", "max_draft_len": 2,
                                         "speculative_model_dir": "d/1b"}
    api, _ = trtllm_api(pick(spec_k=2, spec_method="eagle3", draft_model="d/e3"))
    assert api["speculative_config"] == {"decoding_type": "Eagle", "max_draft_len": 2, "speculative_model_dir": "d/e3",
                                         "eagle3_one_model": True}
    api, _ = trtllm_api(pick(spec_k=1, spec_method="mtp", mtp_layers=1))
    assert api["speculative_config"] == {"decoding_type": "MTP", "num_nextn_predict_layers": 1}
    for m, extra in (("ngram", {}), ("draft", {"draft_model": "d/1b"}), ("eagle3", {"draft_model": "d/e3"})):
        argv, api, _ = trtllm_argv(pick(spec_k=2, spec_method=m, **extra))
        assert check_trtllm_api(api) == [] and trtllm_startup_errors(argv, api) == []
    assert "speculative_config" not in trtllm_api(pick())[0]


# --- llama.cpp --------------------------------------------------------------------------------------------------

def test_llamacpp_context_is_the_pool_over_the_slots_rounded_down_to_256():
    p = pick(tp=1, batch_cap=8)
    argv, notes = llamacpp_argv(p, model_path="m.gguf")
    # 10,050 // 8 = 1,256 tokens per slot (below the longest request, 5,000: said); 8 x 1,256 = 10,048 -> 9,984
    assert argv == ["llama-server", "-m", "m.gguf", "-np", "8", "-c", "9984", "-kvu", "-b", "2048", "-ub", "2048",
                    "-cb", "-ngl", "all", "-ctk", "bf16", "-ctv", "bf16", "--cache-prompt", "--host", "0.0.0.0",
                    "--port", "8000"]
    assert any("1256 tokens per slot is below the longest request (5000)" in n for n in notes)
    assert "context: -c 9984 = 8 slots x 1256 tokens per slot, rounded to a multiple of 256 as llama.cpp pads it" \
        in notes
    assert check_argv("llamacpp", argv) == []


def test_llamacpp_context_capped_by_the_longest_request_rounds_up():
    argv, notes = llamacpp_argv(pick(tp=1, batch_cap=8, max_request_tokens=1000), threads=4, model_path="m.gguf")
    assert flag(argv, "-c") == "8192"                         # 8 x 1,000 = 8,000 up to 8,192
    assert argv[argv.index("-c") + 2:argv.index("-c") + 6] == ["-t", "4", "-tb", "4"]
    assert any("8 slots x 1000 tokens per slot (the longest request kvtune simulated; the plan's pool, 10,050 "
               "tokens, would never fill)" in n for n in notes)
    assert not any(n.startswith("threads:") for n in notes)
    # no plan: the request sizes it; a small total is padded up
    assert flag(llamacpp_argv(pick(tp=1, batch_cap=8, memory=None, max_request_tokens=1000), model_path="m")[0],
                "-c") == "8192"
    small = dataclasses.replace(MEM, kv_pool_tokens=200, kv_pool_tokens_per_gpu=200)
    argv, notes = llamacpp_argv(pick(tp=1, batch_cap=4, memory=small, max_request_tokens=None), model_path="m")
    assert flag(argv, "-c") == "256" and any(n.startswith("threads: llama-server uses every core") for n in notes)
    exact = dataclasses.replace(MEM, kv_pool_tokens=1024, kv_pool_tokens_per_gpu=1024)
    argv, notes = llamacpp_argv(pick(tp=1, batch_cap=4, memory=exact, max_request_tokens=None), model_path="m")
    assert flag(argv, "-c") == "1024" and "context: -c 1024 = 4 slots x 256 tokens per slot" in notes


def test_llamacpp_refusals_and_flags():
    with pytest.raises(Unsupported, match="TP 2 x PP 1: llama.cpp's --split-mode"):
        llamacpp_argv(pick())
    with pytest.raises(Unsupported, match="no memory plan and no request length"):
        llamacpp_argv(pick(tp=1, memory=None, max_request_tokens=None))
    tiny = dataclasses.replace(MEM, kv_pool_tokens=7, kv_pool_tokens_per_gpu=7)
    with pytest.raises(Unsupported, match=r"the KV pool \(7 tokens\) holds less than one token per slot at 8 slots"):
        llamacpp_argv(pick(tp=1, batch_cap=8, memory=tiny))
    argv, _ = llamacpp_argv(pick(tp=1, batch_cap=8, kv_dtype="fp16", prefix_caching=False), model_path="m")
    assert "-ctk" not in argv and "--no-cache-prompt" in argv
    argv, _ = llamacpp_argv(pick(tp=1, batch_cap=8, spec_k=3, spec_method="ngram"), model_path="m")
    i = argv.index("--spec-type")
    assert argv[i:i + 6] == ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "5",
                             "--spec-ngram-simple-size-m", "3"]
    assert check_argv("llamacpp", argv) == []


# --- shell and the whole launch ---------------------------------------------------------------------------------

def test_command_puts_a_flag_and_its_value_per_line_and_argv_of_reads_it_back():
    argv = ["vllm", "serve", "m", "--a", "1", "--b", "x y", "--c", ""]
    text = command(argv)
    assert text == "vllm serve m \\\n  --a 1 \\\n  --b 'x y' \\\n  --c ''"
    assert argv_of("# a comment\n" + text) == argv
    assert command(["python", "-m", "s", "--x", "1"], head=3) == "python -m s \\\n  --x 1"
    assert command(["python", "-m", "s", "--x", "1"]) == "python \\\n  -m s \\\n  --x 1"
    assert comment_block(["a", "", "b"]) == "# a\n# b"


def test_launch_for_pick_gathers_every_engine_and_a_manifest():
    out = launch_for_pick(pick(), "My Model!", engine="sglang")
    assert out["k8s_engine"] == "sglang" and out["unsupported"] == {"llamacpp": out["unsupported"]["llamacpp"]}
    assert out["scheduling"] == {"vllm": "mixed", "sglang": "mixed", "trtllm": "mixed", "llamacpp": "mixed"}
    assert argv_of(out["vllm"]) == vllm_argv(pick())[0] and argv_of(out["sglang"]) == sglang_argv(pick())[0]
    assert out["vllm"].startswith("# vLLM 0.33.0 (image vllm/vllm-openai:v0.33.0)\n# kvtune planned per GPU: weights "
                                  "bf16 8.0 GB (of 16.0 GB at TP 2 x PP 1), activation reserve 2.0 GB, KV pool 62.0 GB "
                                  "= 10,050 tokens per replica (bf16 KV), at 0.9 of 80.0 GB\n")
    assert yaml.safe_load(out["trtllm"]["config_yaml"]) == trtllm_api(pick())[0]
    assert out["memory"] == {**MEM.to_json(), "weights": "bf16", "gpu_mem_util": 0.9}
    docs = list(yaml.safe_load_all(out["k8s"]))
    dep = next(d for d in docs if d["kind"] == "Deployment")
    assert dep["metadata"]["name"] == "my-model" and dep["spec"]["replicas"] == 1
    c = dep["spec"]["template"]["spec"]["containers"][0]
    assert c["image"] == "lmsysorg/sglang:v0.5.23" and c["command"] == sglang_argv(pick())[0]
    assert {"name": "shm", "mountPath": "/dev/shm"} in c["volumeMounts"]
    # the program's words on the first line, then a flag per line
    assert "\npython -m sglang.launch_server \\\n  --model-path " in out["sglang"]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 2
    assert c["env"][0]["valueFrom"]["secretKeyRef"] == {"name": "hf-token", "key": "token", "optional": False}
    pvc = next(d for d in docs if d["kind"] == "PersistentVolumeClaim")
    assert pvc["spec"]["resources"]["requests"]["storage"] == "20Gi"     # max(20, ceil(16e9 x 1.2 / 2^30) = 18)
    assert "(required: gated model)" in out["k8s"]
    assert launch_for_pick(pick(), "!!!")["k8s"].count("name: kvtune-llm\n") >= 1
    assert launch_for_pick(pick(), engine="nope")["k8s_engine"] == "vllm"


def test_a_long_name_still_gives_statefulsets_that_can_create_pods():
    # StatefulSet pods are labelled controller-revision-hash = <statefulset>-<10-character hash>, <= 63
    # characters (kubernetes/kubernetes#64023); LWS names its StatefulSets <lws> and <lws>-<group index>
    big = dataclasses.replace(MEM, weight_bytes_total=810e9)
    for name in ("x" * 60, "a" * 39 + "-" + "b" * 20, "m"):
        out = launch_for_pick(pick(tp=8, pp=2, replicas=12, memory=big, gated=False), name)
        docs = list(yaml.safe_load_all(out["k8s"]))
        lws = next(d for d in docs if d["kind"] == "LeaderWorkerSet")["metadata"]["name"]
        service = next(d for d in docs if d["kind"] == "Service")["metadata"]["name"]
        worker_sts = f"{lws}-{12 - 1}"
        assert len(f"{worker_sts}-0123456789") <= 63 and lws != service and lws.endswith("-lws")
        assert lws == (service if len(service) <= 40 else service[:40].rstrip("-")) + "-lws"
    # a client Service named as the LeaderWorkerSet would be would collide with the controller's own Service
    assert k8s.lws_name("c" * 40 + "-lws") == "c" * 40 + "-set"
    assert k8s.lws_name("short") == "short-lws"


def test_the_manifest_sizes_and_spreads_a_replica_over_nodes():
    big = dataclasses.replace(MEM, weight_bytes_total=810e9)
    out = launch_for_pick(pick(tp=8, pp=2, replicas=3, memory=big, gated=False), "m")
    docs = list(yaml.safe_load_all(out["k8s"]))
    lws = next(d for d in docs if d["kind"] == "LeaderWorkerSet")
    assert lws["metadata"]["name"] == "m-lws" and lws["spec"]["replicas"] == 3
    t = lws["spec"]["leaderWorkerTemplate"]
    assert t["size"] == 2 and t["restartPolicy"] == "RecreateGroupOnPodRestart"
    lead = t["leaderTemplate"]["spec"]["containers"][0]
    work = t["workerTemplate"]["spec"]["containers"][0]
    assert lead["resources"]["requests"]["nvidia.com/gpu"] == 8 and "ports" in lead and "ports" not in work
    assert flag(lead["command"], "--node-rank") == "0" and flag(work["command"], "--node-rank") == "$(LWS_WORKER_INDEX)"
    assert flag(lead["command"], "--master-addr") == "$(LWS_LEADER_ADDRESS)" and "--headless" in work["command"]
    assert lead["env"][0]["valueFrom"]["secretKeyRef"]["optional"] is True
    pvc = next(d for d in docs if d["kind"] == "PersistentVolumeClaim")
    assert pvc["spec"]["resources"]["requests"]["storage"] == "906Gi"    # ceil(810e9 x 1.2 / 2^30) = 906
    svc = next(d for d in docs if d["kind"] == "Service")
    assert svc["spec"]["selector"] == {"app": "m", "role": "leader"}
    assert "one replica spans 2 nodes: this is node 0; on node r = 1..1 run the same with --node-rank r --headless" \
        in out["vllm"]
    with pytest.raises(Unsupported, match="9 GPUs per replica do not split evenly over 2 nodes"):
        k8s.manifest(pick(tp=9, gpus_per_node=8), "m", ENGINE_VERSIONS["vllm"],
                     lambda r, a, n: ["x"])


def test_small_pieces_said_exactly():
    from kvtune.optimizer.launch import build_pick
    # no arch: the model is launched as given (no catalog id to swap in)
    p = build_pick("org/some-model", {"tp": 1, "batch_cap": 8, "chunk_tokens": 512}, 1, 0.9, None)
    assert p.model == "org/some-model" and p.model_note == "" and p.memory is None
    # no context to size and no quantization: no notes at all
    assert vllm_argv(pick(memory=None, max_request_tokens=None, max_prompt_tokens=None))[1] == []
    # llama.cpp: a draft model drafts by draft-simple, an EAGLE-3 head by draft-eagle3
    argv, _ = llamacpp_argv(pick(tp=1, batch_cap=8, spec_k=2, spec_method="draft", draft_model="llama-3.2-1b"),
                            model_path="m")
    assert flag(argv, "--spec-type") == "draft-simple" and flag(argv, "--spec-draft-n-max") == "2"
    argv, notes = llamacpp_argv(pick(tp=1, batch_cap=8, spec_k=2, spec_method="eagle3",
                                     draft_model="yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"), model_path="m")
    assert flag(argv, "--spec-type") == "draft-eagle3" and any("--target-model-dir" in n for n in notes)


# --- disaggregated --------------------------------------------------------------------------------------------

PRE = dict(tp=1, batch_cap=16, chunk_tokens=8192, replicas=2)
DEC = dict(tp=2, batch_cap=128, chunk_tokens=512, replicas=3)


def test_disaggregated_vllm_pools_and_router():
    from kvtune.optimizer.launch import disaggregated_launch
    out = disaggregated_launch(pick(**PRE), pick(**DEC), "Rag Pools", "vllm")
    v = out["vllm"]
    assert v.startswith("# vLLM 0.33.0 disaggregated (image vllm/vllm-openai:v0.33.0)\n")
    assert ("# prefill pool: 2 replica(s) of TP 1 (1 GPU(s) each), batch cap 16, chunk budget 8192 tokens; run on "
            "each of <prefill-0>, <prefill-1>") in v
    assert ("# decode pool: 3 replica(s) of TP 2 (2 GPU(s) each), batch cap 128, chunk budget 512 tokens; run on "
            "each of <decode-0>, <decode-1>, <decode-2>") in v
    blocks = v.split("\n\n")
    pre, dec, router = (argv_of(b.split("VLLM_NIXL_SIDE_CHANNEL_PORT=5600 ", 1)[-1]) for b in blocks)
    assert flag(pre, "--max-model-len") == "4001" and flag(dec, "--max-model-len") == "5000"   # prompt + 1; request
    assert json.loads(flag(pre, "--kv-transfer-config")) == {"kv_connector": "NixlConnector", "kv_role": "kv_both"}
    assert flag(pre, "--max-num-seqs") == "16" and flag(dec, "--tensor-parallel-size") == "2"
    assert router == ["vllm-router", "--vllm-pd-disaggregation", "--policy", "round_robin",
                      "--prefill", "http://<prefill-0>:8000", "--prefill", "http://<prefill-1>:8000",
                      "--decode", "http://<decode-0>:8000", "--decode", "http://<decode-1>:8000",
                      "--decode", "http://<decode-2>:8000", "--host", "0.0.0.0", "--port", "8000"]
    for a in (pre, dec):
        assert check_argv("vllm", a) == []
    assert check_argv("vllm-router", router) == []
    assert out["notes"]["vllm"][0].startswith("KV transfer: NixlConnector; the decode replica recomputes")
    assert out["memory"] == {"prefill": MEM.to_json(), "decode": MEM.to_json()} and out["unsupported"] == {}


def test_disaggregated_sglang_pools_and_router():
    from kvtune.optimizer.launch import disaggregated_launch
    out = disaggregated_launch(pick(**PRE), pick(**DEC))
    pre, dec, router = (argv_of(b) for b in out["sglang"].split("\n\n"))
    assert pre[-6:] == ["--disaggregation-mode", "prefill", "--disaggregation-transfer-backend", "mooncake",
                        "--disaggregation-bootstrap-port", "8998"]
    assert dec[-4:] == ["--disaggregation-mode", "decode", "--disaggregation-transfer-backend", "mooncake"]
    assert flag(pre, "--context-length") == "4006" and flag(dec, "--context-length") == "5001"
    assert router == ["python", "-m", "sglang_router.launch_router", "--pd-disaggregation", "--policy", "round_robin",
                      "--prefill", "http://<prefill-0>:8000", "8998", "--prefill", "http://<prefill-1>:8000", "8998",
                      "--decode", "http://<decode-0>:8000", "--decode", "http://<decode-1>:8000",
                      "--decode", "http://<decode-2>:8000", "--host", "0.0.0.0", "--port", "8000"]
    assert check_argv("sglang", pre) == [] and check_argv("sglang-router", router) == []
    assert "# decode pool: 3 replica(s) of TP 2" in out["sglang"]


def test_disaggregated_trtllm_configs():
    from kvtune.optimizer.launch import disaggregated_launch
    t = disaggregated_launch(pick(**PRE), pick(**DEC))["trtllm"]
    ctx, gen = yaml.safe_load(t["ctx_config_yaml"]), yaml.safe_load(t["gen_config_yaml"])
    assert check_trtllm_api(ctx) == [] and check_trtllm_api(gen) == []
    assert ctx["disable_overlap_scheduler"] is True and "disable_overlap_scheduler" not in gen
    assert ctx["cache_transceiver_config"] == {"backend": "UCX", "max_tokens_in_buffer": 4000}   # the longest prompt
    assert gen["cache_transceiver_config"] == {"backend": "UCX", "max_tokens_in_buffer": 4000}
    assert ctx["max_seq_len"] == 4001 and gen["max_seq_len"] == 5000 and ctx["max_batch_size"] == 16
    assert yaml.safe_load(t["disagg_config_yaml"]) == {
        "hostname": "0.0.0.0", "port": 8000, "backend": "pytorch",
        "context_servers": {"num_instances": 2, "urls": ["<prefill-0>:8000", "<prefill-1>:8000"]},
        "generation_servers": {"num_instances": 3, "urls": ["<decode-0>:8000", "<decode-1>:8000", "<decode-2>:8000"]}}
    assert "--extra_llm_api_options ctx_config.yaml" in t["command"].replace(" \\\n  ", " ")
    assert "trtllm-serve disaggregated \\\n  -c disagg_config.yaml" in t["command"]
    # no lengths: the buffer is left to TensorRT-LLM, and the note says to set it
    t = disaggregated_launch(pick(**PRE, max_prompt_tokens=None), pick(**DEC))["trtllm"]
    assert yaml.safe_load(t["ctx_config_yaml"])["cache_transceiver_config"]["max_tokens_in_buffer"] == 5000
    t = disaggregated_launch(pick(**PRE, max_prompt_tokens=None, max_request_tokens=None),
                             pick(**DEC, max_prompt_tokens=None, max_request_tokens=None))["trtllm"]
    assert yaml.safe_load(t["ctx_config_yaml"])["cache_transceiver_config"] == {"backend": "UCX"}
    assert "KV transfer buffer: no workload lengths given" in t["command"]


@pytest.mark.parametrize("engine", ["vllm", "sglang", "trtllm"])
def test_disaggregated_manifest_statefulsets_services_and_front(engine):
    from kvtune.optimizer.launch import disaggregated_launch
    out = disaggregated_launch(pick(**PRE), pick(**DEC), "Rag", engine)
    assert out["k8s_engine"] == engine
    docs = list(yaml.safe_load_all(out["k8s"]))
    sts = {d["metadata"]["name"]: d for d in docs if d["kind"] == "StatefulSet"}
    assert set(sts) == {"rag-prefill", "rag-decode"}
    p, d = sts["rag-prefill"]["spec"], sts["rag-decode"]["spec"]
    assert p["replicas"] == 2 and d["replicas"] == 3 and p["serviceName"] == "rag-prefill"
    assert p["podManagementPolicy"] == "Parallel" and p["selector"]["matchLabels"] == {"app": "rag", "role": "prefill"}
    pc = p["template"]["spec"]["containers"][0]
    assert pc["resources"]["limits"]["nvidia.com/gpu"] == 1 and pc["name"] == "engine"
    assert "(required: gated model)" in out["k8s"]
    assert d["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 2
    heads = {x["metadata"]["name"]: x for x in docs if x["kind"] == "Service"}
    assert heads["rag-prefill"]["spec"]["clusterIP"] == "None" and heads["rag"]["spec"]["selector"] == {
        "app": "rag", "role": "router"}
    router = next(x for x in docs if x["kind"] == "Deployment")
    assert router["metadata"]["name"] == "rag-router"
    rc = router["spec"]["template"]["spec"]["containers"][0]
    if engine == "vllm":
        assert flag(pc["command"], "--max-model-len") == "4001"
        assert {"name": "VLLM_NIXL_SIDE_CHANNEL_HOST", "value": "$(POD_IP)"} in pc["env"]
        assert "http://rag-prefill-1.rag-prefill:8000" in rc["command"]
        assert rc["livenessProbe"]["httpGet"]["path"] == "/liveness"
    elif engine == "sglang":
        assert rc["image"] == "lmsysorg/sglang:v0.5.23" and "http://rag-decode-2.rag-decode:8000" in rc["command"]
        assert rc["readinessProbe"]["httpGet"]["path"] == "/readiness"
    else:
        files = next(x for x in docs if x["kind"] == "ConfigMap")["data"]
        assert set(files) == {"ctx_config.yaml", "gen_config.yaml", "disagg_config.yaml"}
        assert yaml.safe_load(files["disagg_config.yaml"])["context_servers"]["urls"] == [
            "rag-prefill-0.rag-prefill:8000", "rag-prefill-1.rag-prefill:8000"]
        assert rc["command"] == ["trtllm-serve", "disaggregated", "-c", "/etc/kvtune/disagg_config.yaml"]
        assert rc["livenessProbe"]["httpGet"]["path"] == "/health"
        assert "/etc/kvtune/ctx_config.yaml" in pc["command"]
    assert "disaggregated on Kubernetes: 2 prefill x TP 1 + 3 decode x TP 2" in out["k8s"]


def test_disaggregated_refusals():
    from kvtune.optimizer.launch import disaggregated_launch
    out = disaggregated_launch(pick(**PRE, spec_k=2, spec_method="ngram"), pick(**DEC))
    why = "speculative decoding in a disaggregated deployment is not something kvtune simulates"
    assert out["unsupported"] == {e: why for e in ("vllm", "sglang", "trtllm", "k8s")}
    assert out["vllm"] == f"# disaggregated launch: {why}"
    out = disaggregated_launch(pick(**PRE), pick(**dict(DEC, tp=16)))
    assert out["unsupported"]["k8s"] == ("a decode replica spans 2 nodes: kvtune emits disaggregated launch settings "
                                         "for single-node replicas only")
    out = disaggregated_launch(pick(**PRE), pick(**DEC), engine="llamacpp")
    assert out["unsupported"]["k8s"].startswith("llama.cpp llama-server 0c1e57098 has no disaggregated prefill/decode")
    assert disaggregated_launch(pick(**PRE), pick(**DEC), engine="nope")["k8s_engine"] == "vllm"


def test_the_header_states_the_plan_the_draft_and_the_checkpoint():
    d = dataclasses.replace(MEM, kv_pool_bytes_per_gpu=61e9, draft="llama-3.2-1b", draft_weight_bytes_per_gpu=1e9,
                            draft_kv_bytes_per_token_per_gpu=4096.0)
    p = pick(memory=d, weights="fp8", spec_k=2, spec_method="draft", draft_model="d/1b", draft_note="draft from x",
             model_note="model note", kv_dtype="fp8")
    head = [ln for ln in launch_for_pick(p)["vllm"].splitlines() if ln.startswith("#")]
    assert head[:3] == ["# vLLM 0.33.0 (image vllm/vllm-openai:v0.33.0)", "# model note", "# draft from x"]
    assert head[3] == ("# kvtune planned per GPU: weights FP8 (1-byte GEMM weights, bf16 embeddings and LM head) 8.0 GB "
                       "(of 16.0 GB at TP 2 x PP 1), draft (llama-3.2-1b) 1.0 GB + 4,096 KV bytes per pool token, "
                       "activation reserve 2.0 GB, KV pool 61.0 GB = 10,050 tokens per replica (fp8 KV), at 0.9 of "
                       "80.0 GB")
    # the draft's note only while speculating; a bf16 plan of a model published in FP8 says so
    q = pick(draft_note="draft from x", model="deepseek-ai/DeepSeek-V3", memory=None)
    head = [ln for ln in launch_for_pick(q)["sglang"].splitlines() if ln.startswith("#")]
    assert "# draft from x" not in head and len(head) >= 2
    assert head[1] == ("# weights: deepseek-ai/DeepSeek-V3 is published in FP8; kvtune planned bf16 weights, more "
                       "memory than this checkpoint uses (set weights: fp8 to plan for it)")
    assert launch_for_pick(q)["memory"] is None


def test_multi_node_notes_and_the_trtllm_manifest():
    out = launch_for_pick(pick(tp=16), engine="sglang")
    assert ("# one replica spans 2 nodes: this is node 0; on node r = 1..1 run the same with --node-rank r (the "
            "Kubernetes manifest does this with a LeaderWorkerSet)") in out["sglang"].splitlines()
    assert flag(argv_of(out["sglang"]), "--node-rank") == "0"
    assert "--node-rank" not in argv_of(launch_for_pick(pick())["sglang"])
    assert out["k8s"].startswith("# SGLang 0.5.23 on Kubernetes: 1 replica(s) of 16 GPU(s) over 2 nodes (LeaderWorkerSet)")
    assert out["unsupported"]["trtllm"].startswith("a replica over 2 nodes")
    assert out["trtllm"] == {"command": "# TensorRT-LLM 1.0.0 cannot run this pick: " + out["unsupported"]["trtllm"],
                             "config_yaml": ""}
    t = launch_for_pick(pick(), "m", engine="trtllm")
    assert ("# config.yaml (--extra_llm_api_options): the ConfigMap m-config, mounted at /etc/kvtune"
            in t["k8s"].splitlines())
    docs = list(yaml.safe_load_all(t["k8s"].split("\n", 4)[-1]))
    cm = next(d for d in docs if d["kind"] == "ConfigMap")
    assert cm["metadata"]["name"] == "m-config" and yaml.safe_load(cm["data"]["config.yaml"]) == trtllm_api(pick())[0]
    c = next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert flag(c["command"], "--extra_llm_api_options") == "/etc/kvtune/config.yaml"
    assert {"name": "config", "mountPath": "/etc/kvtune", "readOnly": True} in c["volumeMounts"]
    # the manifest's engine cannot run the pick: the manifest says why
    k = launch_for_pick(pick(tp=16), engine="trtllm")
    assert k["k8s"] == "# TensorRT-LLM 1.0.0 cannot run this pick: " + k["unsupported"]["trtllm"]
    assert k["unsupported"]["k8s"] == k["unsupported"]["trtllm"]
    assert launch_for_pick(pick(tp=1), engine="llamacpp")["unsupported"]["k8s"].startswith(
        "llama.cpp llama-server 0c1e57098 has no published container image")


def test_build_pick_reads_every_field_of_the_config_and_the_arch():
    from kvtune.costmodel import get_gpu, get_model
    from kvtune.optimizer.launch import build_pick
    arch = get_model("llama-3.1-8b")
    cfg = {"tp": 2, "batch_cap": 8, "chunk_tokens": 512, "nodes_per_replica": 2, "gpus_per_node": 4}
    p = build_pick("llama-3.1-8b", cfg, 1, 0.9, None, arch=arch, gpu=get_gpu("h100-sxm"))
    assert p.model == M and p.model_context_tokens == 131072
    assert p.nodes_per_replica == 2 and p.gpus_per_node == 4 and p.nodes == 2
    # a speculative section with no draft length: no draft resolved, nothing said about one
    q = build_pick("llama-3.1-8b", dict(cfg, spec_k=0), 1, 0.9, {"method": "eagle3"}, arch=arch)
    assert (q.draft_model, q.draft_error, q.draft_note, q.spec_method, q.spec_k) == (None, "", "", None, 0)
    # methods that load no draft (n-gram lookup, the model's own MTP heads): none named, nothing said
    for method in ("ngram", "mtp"):
        r = build_pick("llama-3.1-8b", dict(cfg, spec_k=2), 1, 0.9, {"method": method}, arch=arch)
        assert (r.draft_model, r.draft_error, r.draft_note, r.spec_method) == (None, "", "", method)


def test_disaggregated_names_and_an_engine_that_cannot_run_the_pools():
    from kvtune.optimizer.launch import disaggregated_launch
    out = disaggregated_launch(pick(**PRE), pick(**DEC), "!!!")
    assert "name: kvtune-llm-prefill" in out["k8s"]
    # FP8 weights of a model with no known ModelOpt checkpoint: TensorRT-LLM says why, vLLM quantizes online
    out = disaggregated_launch(pick(**PRE, model="org/unknown", weights="fp8"), pick(**DEC, model="org/unknown",
                                                                                   weights="fp8"))
    assert set(out["unsupported"]) == {"trtllm"}
    assert out["trtllm"] == {"command": "# TensorRT-LLM 1.0.0 cannot run this pick disaggregated: "
                                        + out["unsupported"]["trtllm"]}


# The launch package's mutation survivors (issue 25 item 1): each test states what an independent
# derivation gives - a value worked out by hand from the docstrings and the engines' rules, or a
# property every emitted manifest must have for Kubernetes to wire it up - and kills the mutants of
# bench/mutation-runs/lau5-launch-all-*.json that the other launch tests let through.
#
# Picks are written by hand as in tests/engines/test_launch_units.py (an 80 GB GPU, a 10,050-token pool per
# GPU), so every figure is arithmetic on round numbers.

def test_request_lengths_of_a_trace_are_its_longest_prompt_and_longest_prompt_plus_output_tokens():
    # three requests: the longest prompt (3,000) is not the longest request (50 + 2,000 = 2,050 < 3,000 + 10)
    t = Trace(arrival_s=[0.0, 1.0, 2.0], input_tokens=[100, 3000, 50], output_tokens=[900, 10, 2000],
              prefix_tokens=[0, 0, 0], prefix_group=[-1, -1, -1])
    assert lc.request_lengths(Workload(trace=t)) == lc.RequestLengths(3000, 3010)
    # a request whose output dominates: the longest request is 50 + 4,000, not the longest prompt's
    t2 = Trace(arrival_s=[0.0, 1.0], input_tokens=[3000, 50], output_tokens=[10, 4000],
               prefix_tokens=[0, 0], prefix_group=[-1, -1])
    assert lc.request_lengths(Workload(trace=t2)) == lc.RequestLengths(3000, 4050)


def test_request_lengths_of_an_unbounded_class_are_its_99_9th_percentile_tokens():
    # lognormal with mean 500 and sigma 0.5 and no max: mu = ln 500 - 0.5^2 / 2, the 0.999 quantile is
    # exp(mu + z_0.999 x 0.5) ~ 2,070 tokens (z_0.999 = 3.0902); the output is a fixed 100
    mu = math.log(500) - 0.5 ** 2 / 2
    q = math.ceil(math.exp(mu + NormalDist().inv_cdf(0.999) * 0.5))
    assert 2000 < q < 2100
    w = Workload(classes=(RequestClass("a", 1.0, LengthDist.lognormal(500, 0.5), LengthDist.fixed(100)),))
    assert lc.request_lengths(w) == lc.RequestLengths(q, q + 100)


# --- pick._looks_like_hf_id (a config.json's _name_or_path launched only when it is an HF id) -------------------

@pytest.mark.parametrize("s, ok", [
    ("acme/my-finetune-8b", True),
    ("a/b/c", False),            # two slashes: a path, not org/name
    (".cache/model", False),     # relative paths
    ("~/model", False),
    ("/model", False),           # absolute
    ("acme/", False),            # no name
    ("acme/my model", False),    # a space: never in a repository id
    (None, False), (3, False),
])
def test_an_hf_id_is_one_org_slash_name_without_a_path_start_or_space(s, ok):
    assert lp._looks_like_hf_id(s) is ok


# --- llama.cpp's draft ------------------------------------------------------------------------------------------

def test_llamacpp_eagle3_draft_is_a_local_bf16_gguf_converted_with_the_targets_metadata():
    d = "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"
    argv, notes = llamacpp_argv(pick(tp=1, batch_cap=8, spec_k=2, spec_method="eagle3", draft_model=d),
                                model_path="m.gguf")
    out = "EAGLE3-LLaMA3.1-Instruct-8B-BF16.gguf"        # the repository's name, its file type (BF16), .gguf
    assert flag(argv, "-md") == out and "-hfd" not in argv
    recipe = [f"huggingface-cli download {d} --local-dir EAGLE3-LLaMA3.1-Instruct-8B",
              f"huggingface-cli download {M} --local-dir Llama-3.1-8B-Instruct",
              f"python convert_hf_to_gguf.py EAGLE3-LLaMA3.1-Instruct-8B --target-model-dir Llama-3.1-8B-Instruct "
              f"--outtype bf16 --outfile {out}"]
    # the draft's note is the model note with "model: " turned into "draft: " (the target is loaded by -m here)
    assert notes[0] == f"draft: make {out} (BF16) from {d} with llama.cpp's tools: " + " && ".join(recipe)


def test_llamacpp_speculation_without_a_draft_names_llamacpp_as_the_loader():
    with pytest.raises(Unsupported, match=r"set speculative.draft_model in the workload \(llama.cpp loads it "
                                          r"separately\)"):
        llamacpp_argv(pick(tp=1, batch_cap=8, spec_k=2, spec_method="eagle3"), model_path="m.gguf")


# --- Kubernetes: every manifest wires up (names Kubernetes accepts, probes and Services on declared ports) ----

DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")            # RFC 1123 label: container and volume names
DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")       # object names
PORT_NAME = re.compile(r"(?=.*[a-z])[a-z0-9]([-a-z0-9]*[a-z0-9])?")  # IANA_SVC_NAME, at most 15 characters


def _manifests() -> dict[str, list[dict]]:
    """Every kind of manifest: one node (vLLM, SGLang, TensorRT-LLM with its ConfigMap), a replica over two
    nodes (LeaderWorkerSet), and each disaggregated engine (router Deployment, StatefulSets)."""
    texts = {e: launch_for_pick(pick(), "my-llm", e)["k8s"] for e in ("vllm", "sglang", "trtllm")}
    texts["lws"] = launch_for_pick(pick(tp=16), "my-llm", "sglang")["k8s"]
    texts["lws-vllm"] = launch_for_pick(pick(tp=16), "my-llm", "vllm")["k8s"]
    pre, dec = pick(tp=1, replicas=2), pick(tp=2, replicas=3)
    for e in ("vllm", "sglang", "trtllm"):
        texts[f"disagg-{e}"] = disaggregated_launch(pre, dec, "my-llm", e)["k8s"]
    out = {}
    for k, t in texts.items():
        assert not t.startswith("# kvtune could not") and "kind:" in t, (k, t[:300])
        out[k] = [d for d in yaml.safe_load_all(t) if d]
    return out


def _pod_templates(doc: dict) -> list[dict]:
    s = doc.get("spec", {})
    if "template" in s:
        return [s["template"]]
    lwt = s.get("leaderWorkerTemplate")
    return [lwt["leaderTemplate"], lwt["workerTemplate"]] if lwt else []


@pytest.fixture   # per test, not per module: mutmut credits a call to the test whose setup made it, so a
def manifests():  # module-scoped fixture would tie every manifest builder to the first test only
    return _manifests()


def test_every_kubernetes_name_is_one_the_api_server_accepts(manifests):
    for k, docs in manifests.items():
        for d in docs:
            assert DNS_SUBDOMAIN.fullmatch(d["metadata"]["name"]), (k, d["metadata"]["name"])
            for t in _pod_templates(d):
                for c in t["spec"]["containers"]:
                    assert DNS_LABEL.fullmatch(c["name"]), (k, c["name"])
                    for port in c.get("ports", []):
                        assert PORT_NAME.fullmatch(port["name"]) and len(port["name"]) <= 15, (k, port)
                for v in t["spec"].get("volumes", []):
                    assert DNS_LABEL.fullmatch(v["name"]), (k, v)


def test_every_probe_and_service_reaches_a_declared_port(manifests):
    for k, docs in manifests.items():
        templates = [t for d in docs for t in _pod_templates(d)]
        for t in templates:
            for c in t["spec"]["containers"]:
                names = {p["name"] for p in c.get("ports", [])}
                for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                    if probe in c:
                        assert c[probe]["httpGet"]["port"] in names, (k, c["name"], probe, names)
        for s in (d for d in docs if d["kind"] == "Service"):
            sel = s["spec"]["selector"]
            pods = [t for t in templates if sel.items() <= t["metadata"]["labels"].items()]
            assert pods, (k, sel)
            for sp in s["spec"]["ports"]:
                assert any(sp["targetPort"] in {p["name"] for c in t["spec"]["containers"] for p in c.get("ports", [])}
                           for t in pods), (k, sp)


def test_every_mount_has_its_volume_and_every_volume_its_object(manifests):
    for k, docs in manifests.items():
        names = {(d["kind"], d["metadata"]["name"]) for d in docs}
        for d in docs:
            for t in _pod_templates(d):
                vols = {v["name"]: v for v in t["spec"].get("volumes", [])}
                for c in t["spec"]["containers"]:
                    for m in c.get("volumeMounts", []):
                        assert m["name"] in vols, (k, c["name"], m)
                for v in vols.values():
                    if "configMap" in v:
                        assert ("ConfigMap", v["configMap"]["name"]) in names, (k, v)
                    if "persistentVolumeClaim" in v:
                        assert ("PersistentVolumeClaim", v["persistentVolumeClaim"]["claimName"]) in names, (k, v)
            sel = d.get("spec", {}).get("selector", {}).get("matchLabels")
            if sel is not None:
                for t in _pod_templates(d):
                    assert sel.items() <= t["metadata"]["labels"].items(), (k, d["metadata"]["name"])


def test_every_service_port_name_is_a_dns_label(manifests):
    for k, docs in manifests.items():
        for s in (d for d in docs if d["kind"] == "Service"):
            for sp in s["spec"]["ports"]:
                assert DNS_LABEL.fullmatch(sp["name"]), (k, s["metadata"]["name"], sp)


# --- disaggregated text: each pool's header names its role, its replicas' hosts and the program line ----------

PRE_HEAD = "prefill pool: 2 replica(s) of TP 1 (1 GPU(s) each), batch cap 16, chunk budget 8192 tokens"
DEC_HEAD = "decode pool: 3 replica(s) of TP 2 (2 GPU(s) each), batch cap 128, chunk budget 512 tokens"
PRE_HOSTS, DEC_HOSTS = "<prefill-0>, <prefill-1>", "<decode-0>, <decode-1>, <decode-2>"


def _first_command_line(block: str) -> str:
    return next(ln for ln in block.splitlines() if not ln.startswith("#"))


def test_sglang_disaggregated_blocks_name_each_pools_hosts_and_keep_the_program_on_one_line():
    out = disaggregated_launch(pick(**PRE), pick(**DEC), "x", "sglang")
    pre, dec, router = out["sglang"].split("\n\n")
    assert f"# {PRE_HEAD}; run on each of {PRE_HOSTS}\n" in pre
    assert f"# {DEC_HEAD}; run on each of {DEC_HOSTS}\n" in dec
    # command(head=3): "python -m <module>" stays on the first line, each flag then starts its own
    assert _first_command_line(pre) == _first_command_line(dec) == "python -m sglang.launch_server \\"
    assert _first_command_line(router) == "python -m sglang_router.launch_router \\"


def test_trtllm_disaggregated_blocks_name_each_pools_config_and_hosts():
    out = disaggregated_launch(pick(**PRE), pick(**DEC), "x", "sglang")["trtllm"]
    pre, dec, server = out["command"].split("\n\n")
    assert pre.startswith(f"# {PRE_HEAD} (ctx_config.yaml); run on each of {PRE_HOSTS}\n")
    assert dec.startswith(f"# {DEC_HEAD} (gen_config.yaml); run on each of {DEC_HOSTS}\n")
    assert server == ("# the disaggregated server (disagg_config.yaml); clients call http://<server-host>:8000\n"
                      "trtllm-serve disaggregated \\\n  -c disagg_config.yaml")
    # TensorRT-LLM 1.0.0 spells the backend UCX; the note tells release candidates' users the lower-case one
    assert any(n.endswith("1.0.0rc6 and older release candidates take 'ucx'") for n in pre.splitlines())


def test_trtllm_disaggregated_without_lengths_says_to_size_the_transfer_buffer():
    out = disaggregated_launch(pick(**PRE, max_request_tokens=None, max_prompt_tokens=None),
                               pick(**DEC, max_request_tokens=None, max_prompt_tokens=None), "x", "sglang")
    note = ("# KV transfer buffer: no workload lengths given, so max_tokens_in_buffer is left at TensorRT-LLM's "
            "default; set it to at least the longest prompt")
    blocks = out["trtllm"]["command"].split("\n\n")
    assert all(note in b.splitlines() for b in blocks[:2])
    assert "max_tokens_in_buffer" not in out["trtllm"]["ctx_config_yaml"]


def test_vllm_disaggregated_block_is_comments_then_the_env_and_command():
    out = disaggregated_launch(pick(**PRE), pick(**DEC), "x", "vllm")
    for b in out["vllm"].split("\n\n")[:2]:
        assert _first_command_line(b).startswith("VLLM_NIXL_SIDE_CHANNEL_HOST=<this-host-address> "
                                                 "VLLM_NIXL_SIDE_CHANNEL_PORT=5600 vllm serve ")


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_a_pool_over_several_nodes_is_refused_naming_the_pool(role):
    two_nodes = dict(PRE if role == "prefill" else DEC, tp=16)     # 16 GPUs > 8 per node: two nodes
    pre = pick(**(two_nodes if role == "prefill" else PRE))
    dec = pick(**(two_nodes if role == "decode" else DEC))
    out = disaggregated_launch(pre, dec, "x", "vllm")
    assert out["unsupported"]["vllm"].startswith(f"a {role} replica spans 2 nodes")


# the fields the downward API offers through env fieldRef (kubernetes.io/docs/concepts/workloads/pods/downward-api/)
FIELD_REFS = {"metadata.name", "metadata.namespace", "metadata.uid", "spec.nodeName", "spec.serviceAccountName",
              "status.hostIP", "status.hostIPs", "status.podIP", "status.podIPs"}
# what the LeaderWorkerSet controller sets in every pod of a group (lws api/leaderworkerset/v1)
LWS_VARS = {"LWS_LEADER_ADDRESS", "LWS_GROUP_SIZE", "LWS_WORKER_INDEX"}


def test_every_env_reference_resolves_to_a_variable_defined_before_it(manifests):
    # Kubernetes expands $(VAR) in env values and in the command only for variables defined earlier in the
    # container's env (or set by the LWS controller); an unknown one stays the literal text "$(VAR)"
    for k, docs in manifests.items():
        for d in docs:
            for t in _pod_templates(d):
                for c in t["spec"]["containers"]:
                    known = set(LWS_VARS) if d["kind"] == "LeaderWorkerSet" else set()
                    for e in c.get("env", []):
                        for ref in re.findall(r"\$\((\w+)\)", e.get("value", "")):
                            assert ref in known, (k, c["name"], e)
                        fr = e.get("valueFrom", {}).get("fieldRef")
                        if fr:
                            assert fr["fieldPath"] in FIELD_REFS, (k, e)
                        known.add(e["name"])
                    for a in c["command"]:
                        for ref in re.findall(r"\$\((\w+)\)", a):
                            assert ref in known, (k, c["name"], a)


def _pool_pods(docs: list[dict]) -> set[str]:
    """Every StatefulSet pod's stable DNS name: pod {set}-{ordinal} under its headless Service."""
    return {f"{d['metadata']['name']}-{i}.{d['spec']['serviceName']}"
            for d in docs if d["kind"] == "StatefulSet" for i in range(d["spec"]["replicas"])}


def test_every_disaggregated_front_lists_exactly_the_pool_pods_by_their_dns_names(manifests):
    for e in ("vllm", "sglang", "trtllm"):
        docs = manifests[f"disagg-{e}"]
        pods = _pool_pods(docs)
        assert pods == {f"my-llm-prefill-{i}.my-llm-prefill" for i in range(2)} | \
            {f"my-llm-decode-{i}.my-llm-decode" for i in range(3)}
        if e == "trtllm":
            cm = next(d for d in docs if d["kind"] == "ConfigMap")
            cfg = yaml.safe_load(cm["data"]["disagg_config.yaml"])
            hosts = {u.rsplit(":", 1)[0] for s in ("context_servers", "generation_servers") for u in cfg[s]["urls"]}
            assert {u.rsplit(":", 1)[0].split("-")[2] for u in cfg["context_servers"]["urls"]} == {"prefill"}
            assert {u.rsplit(":", 1)[0].split("-")[2] for u in cfg["generation_servers"]["urls"]} == {"decode"}
        else:
            router = next(d for d in docs if d["kind"] == "Deployment")
            argv = router["spec"]["template"]["spec"]["containers"][0]["command"]
            urls = [argv[i + 1] for i, a in enumerate(argv) if a in ("--prefill", "--decode")]
            hosts = {u.split("//", 1)[1].rsplit(":", 1)[0] for u in urls}
        assert hosts == pods, (e, hosts)


def test_trtllm_disaggregated_manifest_says_where_its_config_files_are(manifests):
    text = disaggregated_launch(pick(**PRE), pick(**DEC), "my-llm", "trtllm")["k8s"]
    assert ("# config files (ctx_config.yaml, gen_config.yaml, disagg_config.yaml): the ConfigMap my-llm-config, "
            "mounted at /etc/kvtune\n") in text


def test_vllm_disaggregated_pods_name_the_nixl_connector_both_ways(manifests):
    # every vLLM pool pod transfers KV through the NixlConnector in role kv_both (the module docstring:
    # the decode replica pulls the prompt's blocks once the prefill finishes; either side may hold them)
    sets = [d for d in manifests["disagg-vllm"] if d["kind"] == "StatefulSet"]
    assert len(sets) == 2
    for d in sets:
        argv = d["spec"]["template"]["spec"]["containers"][0]["command"]
        assert json.loads(flag(argv, "--kv-transfer-config")) == {"kv_connector": "NixlConnector", "kv_role": "kv_both"}


# --- the disaggregated manifest's header and its pools' context, per engine -----------------------------------

RDMA = ("# the KV moves pod to pod over RDMA: give the pods your cluster's RDMA devices (e.g. the NVIDIA network "
        "operator's rdma/ resources) or the transfer falls back to TCP, slower than kvtune's link model")


@pytest.mark.parametrize("engine, label, front", [
    ("vllm", "vLLM 0.33.0", "router"), ("sglang", "SGLang 0.5.23", "router"),
    ("trtllm", "TensorRT-LLM 1.0.0", "trtllm-serve disaggregated server")])
def test_disaggregated_manifest_header_names_the_front_the_token_secret_and_the_rdma_advice(engine, label, front):
    from kvtune.optimizer.launch.versions import ROUTER_IMAGES
    for gated in (True, False):
        text = disaggregated_launch(pick(**PRE, gated=gated), pick(**DEC, gated=gated), "my-llm", engine)["k8s"]
        head = [ln for ln in text.splitlines() if ln.startswith("#")]
        assert head[0] == (f"# {label} disaggregated on Kubernetes: 2 prefill x TP 1 + 3 decode x TP 2, the {front} "
                           f"as a Deployment behind Service my-llm")
        token = "# Hugging Face token: kubectl create secret generic hf-token --from-literal=token=hf_..."
        assert head[1] == token + (" (required: gated model)" if gated else "")
        assert head[2] == RDMA
        router_note = [ln for ln in head if ln.startswith("# router image ")]
        if engine == "vllm":   # a dated nightly image: the header says how to check it or replace it
            assert len(router_note) == 1 and router_note[0].startswith(
                f"# router image {ROUTER_IMAGES['vllm-router']}: a dated nightly; Docker Hub keeps only the newest 14")
        else:                  # the engine's own image holds the front
            assert router_note == []


def _context_flag(argv: list[str]) -> int:
    for f in ("--max-model-len", "--context-length"):
        if f in argv:
            return int(flag(argv, f))
    raise AssertionError(argv)


def test_disaggregated_pools_are_sized_by_role_in_the_manifest_too(manifests):
    # prefill pods run the prompt + its first token: 4,000 + 1 = 4,001 (SGLang: max(4,001 + 1, 4,000 + 6) = 4,006);
    # decode pods the whole request, 5,000 (SGLang + 1 = 5,001); TensorRT-LLM's max_seq_len in ctx/gen_config.yaml
    want = {"vllm": {"prefill": 4001, "decode": 5000}, "sglang": {"prefill": 4006, "decode": 5001}}
    for e, sizes in want.items():
        for d in (d for d in manifests[f"disagg-{e}"] if d["kind"] == "StatefulSet"):
            argv = d["spec"]["template"]["spec"]["containers"][0]["command"]
            assert _context_flag(argv) == sizes[d["metadata"]["labels"]["role"]], (e, d["metadata"]["name"])
    cm = next(d for d in manifests["disagg-trtllm"] if d["kind"] == "ConfigMap")
    assert yaml.safe_load(cm["data"]["ctx_config.yaml"])["max_seq_len"] == 4001
    assert yaml.safe_load(cm["data"]["gen_config.yaml"])["max_seq_len"] == 5000


def test_disaggregated_front_probes_use_each_fronts_health_routes(manifests):
    # vllm-router 0.1.17 / sglang-router 0.3.2: /liveness and /readiness; trtllm-serve disaggregated: /health
    want = {"vllm": ("/liveness", "/readiness"), "sglang": ("/liveness", "/readiness"), "trtllm": ("/health", "/health")}
    for e, (live, ready) in want.items():
        router = next(d for d in manifests[f"disagg-{e}"] if d["kind"] == "Deployment")
        c = router["spec"]["template"]["spec"]["containers"][0]
        assert (c["livenessProbe"]["httpGet"]["path"], c["readinessProbe"]["httpGet"]["path"]) == (live, ready)


def test_a_long_disaggregated_name_is_cut_to_names_kubernetes_accepts():
    # a StatefulSet's pods carry controller-revision-hash = "<set>-<10-character hash>", a label value of at
    # most 63 characters: a set name ({name}-prefill) of at most 52; names end in a letter or digit
    for name in ("a" * 39 + " model for the rag pools", "My RAG Pools " * 8, "--" + "b" * 60):
        text = disaggregated_launch(pick(**PRE), pick(**DEC), name, "vllm")["k8s"]
        docs = [d for d in yaml.safe_load_all(text) if d]
        for d in docs:
            n = d["metadata"]["name"]
            assert DNS_LABEL.fullmatch(n) and len(n) <= 63, (name, n)
            if d["kind"] == "StatefulSet":
                assert len(n) <= 52, (name, n)
    # the default name
    text = disaggregated_launch(pick(**PRE), pick(**DEC), engine="vllm")["k8s"]
    assert "behind Service kvtune-llm\n" in text
    assert {d["metadata"]["name"] for d in yaml.safe_load_all(text) if d and d["kind"] == "Service"} == \
        {"kvtune-llm", "kvtune-llm-prefill", "kvtune-llm-decode"}


# --- an engine that cannot run the pick says why, in its own entry ------------------------------------------------

def test_a_disaggregated_engine_that_cannot_run_the_pools_says_why_in_its_entry_and_the_manifest():
    # DP attention on a dense model: vLLM 0.33.0's data parallelism of a dense model is plain replicas
    out = disaggregated_launch(pick(**PRE, dp_attention=True), pick(**DEC, dp_attention=True), "x", "vllm")
    why = out["unsupported"]["vllm"]
    assert why.startswith("DP attention: vLLM 0.33.0 data parallelism of a dense model is plain replicas")
    assert out["vllm"] == f"# vLLM 0.33.0 cannot run this pick disaggregated: {why}"
    # the manifest runs vLLM (the engine asked for), which refuses the same way
    assert out["unsupported"]["k8s"] == why and out["k8s"] == f"# disaggregated Kubernetes manifest: {why}"


def test_llamacpp_mtp_drafts_with_the_models_own_heads():
    argv, notes = llamacpp_argv(pick(tp=1, batch_cap=8, spec_k=3, spec_method="mtp", mtp_layers=1), model_path="m.gguf")
    i = argv.index("--spec-type")
    assert argv[i:i + 4] == ["--spec-type", "draft-mtp", "--spec-draft-n-max", "3"] and "-md" not in argv
    assert check_argv("llamacpp", argv) == []
    with pytest.raises(Unsupported, match="multi-token-prediction heads"):
        llamacpp_argv(pick(tp=1, batch_cap=8, spec_k=3, spec_method="mtp"), model_path="m.gguf")


def test_sglang_algorithm_refuses_a_method_sglang_lacks_listing_those_it_runs():
    from kvtune.optimizer.launch.sglang import sglang_algorithm
    assert [sglang_algorithm(m) for m in ("eagle3", "eagle", "mtp", "ngram", "draft")] == \
        ["EAGLE3", "EAGLE", "NEXTN", "NGRAM", "STANDALONE"]
    with pytest.raises(Unsupported) as exc:
        sglang_algorithm("medusa")
    assert str(exc.value) == ("speculative method 'medusa': SGLang 0.5.23 has no such algorithm (it runs draft, eagle, "
                              "eagle3, mtp, ngram; medusa heads are not among them)")


# --- launch_settings' defaults and shell.argv_of ------------------------------------------------------------------

CFG = {"tp": 1, "batch_cap": 8, "chunk_tokens": 512}


def test_launch_settings_defaults_name_no_reserve_and_eight_gpus_a_node():
    from kvtune.costmodel.hardware import get_gpu
    from kvtune.costmodel.models import get_model
    out = launch_settings("llama-3.1-8b", CFG, 1, 0.9, None, arch=get_model("llama-3.1-8b"), gpu=get_gpu("h100-sxm"))
    assert "name: kvtune-llm\n" in out["k8s"]                  # the default name
    assert out["memory"]["activation_reserve_bytes"] == 0      # no reserve unless one is given
    # 9 GPUs a replica (PP 9) do not fit the default 8-GPU node: two nodes
    out = launch_settings("org/m", dict(CFG, pp=9), 1, 0.9, None)
    assert "one replica spans 2 nodes" in out["vllm"]


def test_launch_settings_passes_the_longest_prompt_to_sglangs_context():
    # SGLang's --context-length: max(longest request + 1, longest prompt + 6) = max(5,001, 4,998 + 6) = 5,004
    out = launch_settings("org/m", CFG, 1, 0.9, None, max_request_tokens=5000, max_prompt_tokens=4998)
    assert flag(argv_of(out["sglang"]), "--context-length") == "5004"


def test_argv_of_drops_indented_comment_lines_too():
    text = "# a comment\n  # an indented comment\nvllm serve m \\\n  --port 8000"
    assert argv_of(text) == ["vllm", "serve", "m", "--port", "8000"]


# --- pick._memory: the plan the simulator used, for the layout the config names -----------------------------------

def test_the_memory_plan_splits_weights_and_kv_over_the_pipeline_stages():
    # Llama-3.1-70B at TP 4 x PP 2 on an 80 GB H100 at 0.9: 70,553,706,496 params x 2 bytes / 8 GPUs =
    # 17,638,426,624 weight bytes a GPU; pool 72e9 - that = 54,361,573,376; KV a token a GPU: 80 layers / 2 stages
    # x 2 (K, V) x 8 / 4 heads x 128 x 2 bytes = 40,960; pool tokens floor(54,361,573,376 / 40,960) = 1,327,186
    from kvtune.costmodel import get_gpu, get_model
    from kvtune.optimizer.launch import build_pick
    cfg = {"tp": 4, "pp": 2, "batch_cap": 64, "chunk_tokens": 2048}
    p = build_pick("llama-3.1-70b", cfg, 1, 0.9, None, arch=get_model("llama-3.1-70b"), gpu=get_gpu("h100-sxm"))
    m = p.memory
    assert m.weight_bytes_per_gpu == 17_638_426_624
    assert m.kv_pool_bytes_per_gpu == pytest.approx(54_361_573_376, rel=1e-12)
    assert m.kv_bytes_per_token_per_gpu == 40_960 and m.kv_pool_tokens == 1_327_186


def test_a_layout_the_simulator_refuses_has_no_memory_plan():
    # costmodel.parallel.Parallel refuses ep other than 1 or tp, and a TP group over nodes that is not a whole
    # number of nodes: the simulator has no plan for such a config, so neither has the launch
    from kvtune.costmodel import get_gpu, get_model
    from kvtune.optimizer.launch import build_pick
    arch, gpu = get_model("llama-3.1-70b"), get_gpu("h100-sxm")
    cfg = {"tp": 4, "batch_cap": 64, "chunk_tokens": 2048}
    assert build_pick("llama-3.1-70b", cfg, 1, 0.9, None, arch=arch, gpu=gpu).memory is not None
    assert build_pick("llama-3.1-70b", dict(cfg, ep=2), 1, 0.9, None, arch=arch, gpu=gpu).memory is None
    assert build_pick("llama-3.1-70b", dict(cfg, tp=8), 1, 0.9, None, arch=arch, gpu=gpu,
                      gpus_per_node=6).memory is None


# --- pick.draft_reference / model_reference ----------------------------------------------------------------------

def test_draft_reference_names_the_checkpoint_and_says_where_it_came_from(tmp_path):
    from kvtune.costmodel import get_model
    l8 = get_model("llama-3.1-8b")
    # a catalog name becomes its Hugging Face id, with where that was read
    assert lp.draft_reference("draft", "smollm2-135m", l8) == (
        "HuggingFaceTB/SmolLM2-135M-Instruct", "",
        "draft: HuggingFaceTB/SmolLM2-135M-Instruct (profiles/models.yaml smollm2-135m)")
    # an id as given: nothing to say
    assert lp.draft_reference("draft", "acme/tiny-draft", l8) == ("acme/tiny-draft", "", "")
    # nothing to load: the reason, no draft, no note
    assert lp.draft_reference("draft", None, l8) == (
        None, "speculative.draft_model: method 'draft' needs the draft model", "")
    # a config.json naming its id: that id, and the note says so (no catalog source)
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"_name_or_path": "acme/my-draft"}))
    assert lp.draft_reference("draft", str(cfg), l8) == (
        "acme/my-draft", "", f"draft: acme/my-draft; model given as {cfg}: launching acme/my-draft, the id its "
                             f"config.json names")
    # a config.json naming none: no draft to launch, and why
    bare = tmp_path / "bare" / "config.json"
    bare.parent.mkdir()
    bare.write_text("{}")
    ref, err, note = lp.draft_reference("draft", str(bare), l8)
    assert (ref, note) == (None, "") and err.startswith(f"speculative.draft_model {str(bare)!r}: model given as ")
    # no method, or no model facts: the draft as given
    assert lp.draft_reference(None, "acme/x", l8) == ("acme/x", "", "")
    assert lp.draft_reference("eagle3", "acme/x", None) == ("acme/x", "", "")


def test_model_reference_reads_the_id_a_config_names_wherever_the_path_points(tmp_path):
    named = {"_name_or_path": "acme/my-finetune-8b"}
    say = "launching acme/my-finetune-8b, the id its config.json names"
    assert lp.model_reference("anything", "org/catalog-id") == ("org/catalog-id", "")
    # a folder: its config.json
    (tmp_path / "ft").mkdir()
    (tmp_path / "ft" / "config.json").write_text(json.dumps(named))
    assert lp.model_reference(str(tmp_path / "ft")) == ("acme/my-finetune-8b", f"model given as {tmp_path / 'ft'}: {say}")
    # an existing file without the .json suffix
    (tmp_path / "cfg").write_text(json.dumps(named))
    assert lp.model_reference(str(tmp_path / "cfg"))[0] == "acme/my-finetune-8b"
    # a .json path that does not exist: a placeholder, never the path itself
    ref, note = lp.model_reference(str(tmp_path / "missing" / "config.json"))
    assert ref == lp.PLACEHOLDER and "replace" in note
    # an HF id (no such path): itself
    assert lp.model_reference("acme/model") == ("acme/model", "")


def test_launch_settings_passes_the_reserve_and_the_node_size_on():
    from kvtune.costmodel import get_gpu, get_model
    out = launch_settings("llama-3.1-8b", CFG, 1, 0.9, None, arch=get_model("llama-3.1-8b"), gpu=get_gpu("h100-sxm"),
                          activation_reserve_bytes=2e9)
    assert out["memory"]["activation_reserve_bytes"] == 2e9
    # TP 8 on 4-GPU nodes: two nodes
    out = launch_settings("org/m", dict(CFG, tp=8), 1, 0.9, None, gpus_per_node=4)
    assert "one replica spans 2 nodes" in out["vllm"]


# --- build_pick: its defaults, and the drafter's memory ---------------------------------------------------------

def test_build_pick_defaults_are_bf16_weights_and_kv_caching_on_and_the_cost_models_method():
    from kvtune.costmodel.memory import GPU_MEM_UTIL
    from kvtune.costmodel.step import SPEC_METHOD
    from kvtune.optimizer.launch import build_pick
    p = build_pick("org/m", CFG, 1, 0.85, None)
    assert (p.weights, p.kv_dtype, p.prefix_caching, p.gpu_mem_util) == ("bf16", "bf16", True, 0.85)
    assert GPU_MEM_UTIL != 0.85
    # a speculative: section without a method means the cost model's (costmodel.step.SPEC_METHOD)
    q = build_pick("org/m", dict(CFG, spec_k=3), 1, 0.9, {"draft_model": "acme/head"})
    assert (q.spec_method, q.spec_k) == (SPEC_METHOD, 3)


def test_the_drafters_weights_and_kv_are_in_the_plan_only_while_speculating():
    # Llama-3.1-70B at TP 8 with the Llama-3.1-8B draft at the target's TP: the draft's KV a token a GPU is
    # 32 layers x 2 (K, V) x 8 / 8 heads x 128 x 2 bytes = 16,384; its weights 8,030,261,248 x 2 / 8 = 2,007,565,312
    from kvtune.costmodel import get_gpu, get_model
    from kvtune.optimizer.launch import build_pick
    arch, gpu = get_model("llama-3.1-70b"), get_gpu("h100-sxm")
    spec = {"method": "draft", "draft_model": "llama-3.1-8b"}
    cfg = {"tp": 8, "batch_cap": 64, "chunk_tokens": 2048, "spec_k": 3}
    m = build_pick("llama-3.1-70b", cfg, 1, 0.9, spec, arch=arch, gpu=gpu).memory
    assert m.draft == "draft model llama-3.1-8b"
    assert (m.draft_weight_bytes_per_gpu, m.draft_kv_bytes_per_token_per_gpu) == (2_007_565_312, 16_384)
    # no draft length (spec_k 0): speculation is off and nothing drafts beside the model
    off = build_pick("llama-3.1-70b", dict(cfg, spec_k=0), 1, 0.9, spec, arch=arch, gpu=gpu)
    assert not off.speculating and off.memory.draft == "" and off.memory.draft_weight_bytes_per_gpu == 0
    # the pick notes where the draft id came from (a catalog name)
    q = build_pick("llama-3.1-8b", dict(cfg, tp=1), 1, 0.9, {"method": "draft", "draft_model": "smollm2-135m"},
                   arch=get_model("llama-3.1-8b"))
    assert q.draft_note == "draft: HuggingFaceTB/SmolLM2-135M-Instruct (profiles/models.yaml smollm2-135m)"


def test_build_pick_without_model_facts_assumes_no_heads_no_moe_and_no_context_cap():
    from kvtune.optimizer.launch import build_pick
    from kvtune.optimizer.launch.vllm import vllm_argv
    p = build_pick("org/m", CFG, 1, 0.9, None, max_request_tokens=5000)
    assert (p.mtp_layers, p.is_moe, p.model_context_tokens) == (0, False, 0)
    assert flag(vllm_argv(p)[0], "--max-model-len") == "5000"      # the request, not capped by a context
    q = build_pick("org/m", dict(CFG, spec_k=2), 1, 0.9, {"method": "mtp"})
    with pytest.raises(Unsupported, match="multi-token-prediction heads"):
        vllm_argv(q)


def test_a_model_of_unstated_context_leaves_the_request_uncapped():
    import dataclasses

    from kvtune.costmodel import get_model
    from kvtune.optimizer.launch import build_pick
    from kvtune.optimizer.launch.vllm import vllm_argv
    arch = dataclasses.replace(get_model("llama-3.1-8b"), max_context_tokens=0)   # config.json stating none
    p = build_pick("llama-3.1-8b", CFG, 1, 0.9, None, arch=arch, max_request_tokens=5000)
    assert p.model_context_tokens == 0 and flag(vllm_argv(p)[0], "--max-model-len") == "5000"


def test_the_memory_plan_holds_the_kv_dtype_the_config_names():
    # Llama-3.1-70B at TP 4: KV a token a GPU = 80 layers x 2 (K, V) x 8 / 4 heads x 128 x bytes: 81,920 at bf16
    # (the default), 40,960 at fp8
    from kvtune.costmodel import get_gpu, get_model
    from kvtune.optimizer.launch import build_pick
    arch, gpu = get_model("llama-3.1-70b"), get_gpu("h100-sxm")
    cfg = {"tp": 4, "batch_cap": 64, "chunk_tokens": 2048}
    assert build_pick("llama-3.1-70b", cfg, 1, 0.9, None, arch=arch, gpu=gpu).memory.kv_bytes_per_token_per_gpu == 81_920
    fp8 = build_pick("llama-3.1-70b", dict(cfg, kv_dtype="fp8"), 1, 0.9, None, arch=arch, gpu=gpu)
    assert fp8.kv_dtype == "fp8" and fp8.memory.kv_bytes_per_token_per_gpu == 40_960


def test_an_engine_without_a_published_image_names_none_in_its_header():
    text = launch_for_pick(pick(tp=1))["llamacpp"]
    assert text.splitlines()[0] == "# llama.cpp llama-server 0c1e57098"
    assert launch_for_pick(pick())["vllm"].splitlines()[0] == "# vLLM 0.33.0 (image vllm/vllm-openai:v0.33.0)"


def test_every_object_and_pod_of_a_manifest_carries_its_app_label(manifests):
    # one label finds the whole deployment (kubectl get all,pods -l app=NAME): every workload, Service, ConfigMap
    # and every pod template carry app=<the manifest's name>
    for k, docs in manifests.items():
        for d in docs:
            if d["kind"] != "PersistentVolumeClaim":
                assert d["metadata"]["labels"]["app"] == "my-llm", (k, d["kind"], d["metadata"])
            for t in _pod_templates(d):
                assert t["metadata"]["labels"]["app"] == "my-llm", (k, d["metadata"]["name"])


# --- launch_for_pick: entries, notes, the manifest's header -------------------------------------------------------

def test_every_engines_notes_are_in_its_entry_and_a_refusal_says_why():
    out = launch_for_pick(pick())
    texts = {"vllm": out["vllm"], "sglang": out["sglang"], "trtllm": out["trtllm"]["command"]}
    for e, text in texts.items():
        assert out["notes"][e], e
        for n in out["notes"][e]:
            assert f"# {n}\n" in text, (e, n)
    # llama.cpp runs one GPU a server: TP 2 is refused, and its entry says why
    why = out["unsupported"]["llamacpp"]
    assert why.startswith("TP 2 x PP 1: llama.cpp's --split-mode")
    assert out["llamacpp"] == f"# llama.cpp llama-server 0c1e57098 cannot run this pick: {why}"


def test_the_plain_commands_keep_each_flag_on_its_own_line():
    # command(): only SGLang keeps its first three words (python -m sglang.launch_server) together; llama-server's
    # first flag starts its own line like every other
    out = launch_for_pick(pick(tp=1))
    first = {e: next(ln for ln in out[e].splitlines() if not ln.startswith("#")) for e in ("vllm", "sglang", "llamacpp")}
    assert first == {"vllm": f"vllm serve {M} \\", "sglang": "python -m sglang.launch_server \\", "llamacpp": "llama-server \\"}


def test_a_multi_node_sglang_command_names_a_placeholder_leader():
    argv = argv_of(launch_for_pick(pick(tp=16))["sglang"])
    assert flag(argv, "--dist-init-addr") == "<leader-address>:20000" and flag(argv, "--node-rank") == "0"


@pytest.mark.parametrize("gated", [True, False])
def test_the_manifest_header_states_the_layout_the_token_and_the_cache(gated):
    one = launch_for_pick(pick(gated=gated), "my-llm")["k8s"].splitlines()
    token = "# Hugging Face token: kubectl create secret generic hf-token --from-literal=token=hf_..."
    assert one[:4] == ["# vLLM 0.33.0 on Kubernetes: 1 replica(s) of 2 GPU(s)",
                       token + (" (required: gated model)" if gated else ""),
                       "# model cache: a ReadWriteMany PersistentVolumeClaim (needs a storage class that offers it)",
                       "apiVersion: v1"]
    two = launch_for_pick(pick(tp=16, replicas=3, gated=gated), "my-llm")["k8s"].splitlines()
    assert two[0] == "# vLLM 0.33.0 on Kubernetes: 3 replica(s) of 16 GPU(s) over 2 nodes (LeaderWorkerSet)"


def test_launch_for_pick_names_and_cuts_the_manifest():
    assert "  name: kvtune-llm\n" in launch_for_pick(pick())["k8s"]          # the default name
    # a cut that ends on a separator: the name still ends in a letter or digit
    for name in ("a" * 49 + " model", "--" + "b" * 70):
        docs = [d for d in yaml.safe_load_all(launch_for_pick(pick(), name)["k8s"]) if d]
        for d in docs:
            assert DNS_LABEL.fullmatch(d["metadata"]["name"]), (name, d["metadata"]["name"])


# --- llama.cpp's context at its boundaries --------------------------------------------------------------------------

def _pool(tokens: int) -> MemoryFacts:
    return MemoryFacts(gpu_memory_bytes=80e9, weight_bytes_total=16e9, weight_bytes_per_gpu=16e9,
                       activation_reserve_bytes=0.0, kv_bytes_per_token_per_gpu=1e5, kv_pool_bytes_per_gpu=tokens * 1e5,
                       kv_pool_tokens=tokens, kv_pool_tokens_per_gpu=tokens)


def test_llamacpp_slots_that_hold_exactly_the_longest_request_are_neither_short_nor_capped():
    # 8,000 pool tokens over 8 slots: 1,000 a slot = the longest request. Not below it (no note), not above it
    # (no cap): -c is the pool's slots rounded down to 256 as the pool sizes it, 8,000 // 256 x 256 = 7,936
    argv, notes = llamacpp_argv(pick(tp=1, batch_cap=8, memory=_pool(8000), max_request_tokens=1000), model_path="m")
    assert flag(argv, "-c") == "7936"
    assert not any("below the longest request" in n for n in notes)
    assert "context: -c 7936 = 8 slots x 1000 tokens per slot, rounded to a multiple of 256 as llama.cpp pads it" in notes


def test_llamacpp_one_token_a_slot_still_runs_padded_to_256():
    # 8 tokens over 8 slots: one a slot is enough to start; 8 < 256, so -c is padded up to 256
    argv, _ = llamacpp_argv(pick(tp=1, batch_cap=8, memory=_pool(8), max_request_tokens=None), model_path="m")
    assert flag(argv, "-c") == "256"


def test_llamacpp_without_a_plan_or_lengths_says_what_it_lacks():
    with pytest.raises(Unsupported) as exc:
        llamacpp_argv(pick(tp=1, memory=None, max_request_tokens=None), model_path="m")
    assert str(exc.value) == "no memory plan and no request length to size -c (total context) from"


def test_the_model_note_heads_the_manifest_too():
    note = "model given as ./cfg.json: launching acme/x, the id its config.json names"
    assert f"\n# {note}\n" in launch_for_pick(pick(model_note=note))["k8s"]


@pytest.mark.parametrize("method", ["eagle3", "draft"])
def test_trtllm_speculation_without_a_draft_names_tensorrt_llm_as_the_loader(method):
    from kvtune.optimizer.launch.trtllm import trtllm_api
    with pytest.raises(Unsupported) as exc:
        trtllm_api(pick(spec_k=2, spec_method=method))
    assert str(exc.value) == (f"speculative method {method!r} needs its draft model: set speculative.draft_model in "
                              f"the workload (TensorRT-LLM loads it separately)")


def test_llamacpp_threads_flags_or_the_note_asking_for_them():
    argv, notes = llamacpp_argv(pick(tp=1, batch_cap=8), model_path="m")
    assert "-t" not in argv and notes[-1] == (
        "threads: llama-server uses every core by default; pass -t/-tb with the thread count your calibration was "
        "measured at (kvtune tune records it)")
    argv, notes = llamacpp_argv(pick(tp=1, batch_cap=8), threads=6, model_path="m")
    assert flag(argv, "-t") == flag(argv, "-tb") == "6" and not any(n.startswith("threads:") for n in notes)


def test_memory_facts_json_names_every_field_as_it_is_and_the_drafts_only_with_one():
    import dataclasses
    fields = [f.name for f in dataclasses.fields(MemoryFacts)]
    draft_keys = ("draft", "draft_weight_bytes_per_gpu", "draft_kv_bytes_per_token_per_gpu")
    assert MEM.to_json() == {k: getattr(MEM, k) for k in fields if k not in draft_keys}
    d = dataclasses.replace(MEM, draft="draft model x", draft_weight_bytes_per_gpu=1e9,
                            draft_kv_bytes_per_token_per_gpu=2048.0)
    assert d.to_json() == {k: getattr(d, k) for k in fields}


# --- SGLang and TensorRT-LLM odds and ends ------------------------------------------------------------------------

def test_a_method_without_a_draft_length_runs_no_speculation_in_sglang():
    from kvtune.optimizer.launch.sglang import sglang_argv
    argv, _ = sglang_argv(pick(spec_method="ngram", spec_k=0))      # LaunchPick.speculating: False
    assert not any(a.startswith("--speculative") for a in argv) and "--enable-mixed-chunk" in argv


def test_sglang_speculation_without_a_draft_names_sglang_as_the_loader():
    from kvtune.optimizer.launch.sglang import sglang_argv
    with pytest.raises(Unsupported) as exc:
        sglang_argv(pick(spec_k=2, spec_method="draft"))
    assert str(exc.value) == ("speculative method 'draft' needs its draft model: set speculative.draft_model in the "
                              "workload (SGLang loads it separately)")


def test_trtllm_bf16_notes_are_the_context_and_memory_only_and_expert_parallel_two_is_set():
    from kvtune.optimizer.launch.trtllm import trtllm_api, trtllm_argv
    _, _, notes = trtllm_argv(pick())
    assert [n.split(":")[0] for n in notes] == ["context", "memory"]       # no checkpoint note for bf16 weights
    api, _ = trtllm_api(pick(tp=2, ep=2))
    assert api["moe_expert_parallel_size"] == 2
    api, notes = trtllm_api(pick(memory=None))
    assert "free_gpu_memory_fraction" not in api["kv_cache_config"]
    assert notes[-1] == ("memory: no memory plan to convert; TensorRT-LLM's default free_gpu_memory_fraction applies "
                         "and its KV pool will differ from kvtune's")


def test_an_engine_pod_gets_sixty_minutes_to_load_before_liveness_applies(manifests):
    # kubernetes._probes: loading (download + weights + graph capture) may take up to 60 minutes; the startup
    # probe holds liveness off for periodSeconds x failureThreshold
    for k, docs in manifests.items():
        for d in docs:
            for t in _pod_templates(d):
                for c in t["spec"]["containers"]:
                    if "startupProbe" in c:
                        s = c["startupProbe"]
                        assert s["periodSeconds"] * s["failureThreshold"] == 60 * 60, (k, c["name"])


def test_every_engine_pod_caches_models_on_the_volume_and_reads_the_token_secret(manifests):
    # huggingface_hub reads HF_HOME (where downloads go) and HF_TOKEN: HF_HOME must be where the PVC is mounted,
    # and the token comes from the Secret the header tells users to create (hf-token, key token)
    for k, docs in manifests.items():
        for d in docs:
            for t in _pod_templates(d):
                if d["kind"] == "Deployment" and t["metadata"]["labels"].get("role") == "router":
                    continue   # a router loads no model
                vols = {v["name"]: v for v in t["spec"]["volumes"]}
                for c in t["spec"]["containers"]:
                    env = {e["name"]: e for e in c["env"]}
                    cache = [m["mountPath"] for m in c["volumeMounts"] if "persistentVolumeClaim" in vols[m["name"]]]
                    assert env["HF_HOME"]["value"] in cache, (k, c["name"])
                    ref = env["HF_TOKEN"]["valueFrom"]["secretKeyRef"]
                    assert (ref["name"], ref["key"]) == ("hf-token", "token"), (k, c["name"])


# a Kubernetes quantity (apimachinery resource.Quantity): a number and a binary or decimal suffix, case as written
QUANTITY = re.compile(r"[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E)?")


def test_shared_memory_is_a_ram_backed_volume_and_the_cache_a_shared_claim(manifests):
    # the engines' workers talk through /dev/shm (NCCL): an emptyDir of medium Memory (the only RAM-backed
    # medium besides HugePages) with a valid size; the model cache is the one ReadWriteMany claim the header names
    for k, docs in manifests.items():
        for d in docs:
            if d["kind"] == "PersistentVolumeClaim":
                assert d["spec"]["accessModes"] == ["ReadWriteMany"], k
                assert QUANTITY.fullmatch(d["spec"]["resources"]["requests"]["storage"]), k
            for t in _pod_templates(d):
                vols = {v["name"]: v for v in t["spec"].get("volumes", [])}
                for c in t["spec"]["containers"]:
                    for m in c.get("volumeMounts", []):
                        if m["mountPath"] == "/dev/shm":
                            e = vols[m["name"]]["emptyDir"]
                            assert e["medium"] == "Memory" and QUANTITY.fullmatch(e["sizeLimit"]), (k, e)


# --- the YAML as written: block style, apiVersion and kind first, config files as literal blocks -----------------

def _manifest_texts() -> dict[str, str]:
    return {"trtllm": launch_for_pick(pick(), "my-llm", "trtllm")["k8s"],
            "disagg-trtllm": disaggregated_launch(pick(**PRE), pick(**DEC), "my-llm", "trtllm")["k8s"]}


def test_manifests_are_block_yaml_each_document_opening_with_apiversion_and_kind():
    for k, text in _manifest_texts().items():
        body = "\n".join(ln for ln in text.splitlines() if not ln.startswith("#"))
        for doc in body.split("\n---\n"):
            lines = doc.strip("\n").splitlines()
            assert lines[0].startswith("apiVersion: ") and lines[1].startswith("kind: "), (k, lines[:3])
        assert not re.search(r": \[|^\s*- \[", body, re.M), k       # no flow-style lists


def test_config_files_in_a_configmap_read_as_the_file_itself():
    # kubernetes._str: a file's text (several lines) is written as a YAML literal block
    for k, text in _manifest_texts().items():
        docs = [d for d in yaml.safe_load_all(text) if d]
        cm = next(d for d in docs if d["kind"] == "ConfigMap")
        for fname, content in cm["data"].items():
            assert "\n" in content
            block = "\n".join("    " + ln for ln in content.rstrip("\n").splitlines())
            assert f"  {fname}: |\n{block}\n" in text, (k, fname)


def test_the_service_users_call_listens_on_http_port_80(manifests):
    # clients call http://<name>/ (the header: "behind Service <name>"): port 80, HTTP's own
    for k, docs in manifests.items():
        svc = next(d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == "my-llm")
        assert [p["port"] for p in svc["spec"]["ports"]] == [80], k


# --- vLLM, SGLang and the version records -------------------------------------------------------------------------

def test_vllm_refusals_name_vllm_and_say_what_it_lacks():
    from kvtune.optimizer.launch.vllm import vllm_argv
    with pytest.raises(Unsupported) as exc:
        vllm_argv(pick(spec_k=2, spec_method="draft"))
    assert str(exc.value) == ("speculative method 'draft' needs its draft model: set speculative.draft_model in the "
                              "workload (vLLM loads it separately)")
    with pytest.raises(Unsupported) as exc:
        vllm_argv(pick(dp_attention=True))
    assert str(exc.value) == ("DP attention: vLLM 0.33.0 data parallelism of a dense model is plain replicas, not the "
                              "attention-DP kvtune simulated")


def test_sglang_fp8_weights_load_the_published_fp8_checkpoint_and_say_so():
    from kvtune.optimizer.launch.sglang import sglang_argv
    ckpt = lp.fp8_checkpoint(M)          # the catalog's published FP8 checkpoint of Llama-3.1-8B
    assert ckpt
    argv, notes = sglang_argv(pick(weights="fp8"))
    assert flag(argv, "--model-path") == ckpt and "--quantization" not in argv
    assert notes[0] == f"FP8 weights: the FP8 checkpoint {ckpt} (SGLang reads its quantization_config)"


def test_engine_version_json_names_every_field_as_it_is():
    import dataclasses

    from kvtune.optimizer.launch import ENGINE_VERSIONS
    for v in ENGINE_VERSIONS.values():
        assert v.to_json() == {f.name: getattr(v, f.name) for f in dataclasses.fields(v)}


def test_sglang_quantizes_online_without_a_published_fp8_checkpoint_and_sets_expert_parallel():
    from kvtune.optimizer.launch.sglang import sglang_argv
    assert lp.fp8_checkpoint("org/unknown") == ""
    argv, notes = sglang_argv(pick(model="org/unknown", gated=False, weights="fp8"))
    assert flag(argv, "--model-path") == "org/unknown" and flag(argv, "--quantization") == "fp8"
    assert notes[0] == "FP8 weights: online quantization of the bf16 checkpoint while loading (--quantization fp8)"
    assert flag(sglang_argv(pick(tp=2, ep=2))[0], "--ep-size") == "2"


def test_sglang_context_for_a_one_token_pool_is_that_token():
    # a pool of 1 token holds one whole SGLang token (SGLang pages one token): not refused, capped at 1
    s = lc.sglang_context_length(pick(memory=_pool(1)))
    assert s.value == 1 and s.note.endswith("--context-length 1; SGLang refuses longer requests")


def test_trtllm_argv_for_pipeline_and_expert_parallel_and_a_modelopt_checkpoint():
    from kvtune.optimizer.launch.trtllm import trtllm_argv
    argv, _, _ = trtllm_argv(pick(tp=2, pp=2))
    assert argv[:6] == ["trtllm-serve", M, "--tp_size", "2", "--pp_size", "2"]
    argv, _, _ = trtllm_argv(pick(tp=2, ep=2))
    assert flag(argv, "--ep_size") == "2"
    ckpt = lp.fp8_checkpoint(M, "modelopt")      # the catalog's ModelOpt FP8 checkpoint of Llama-3.1-8B
    argv, _, notes = trtllm_argv(pick(weights="fp8"))
    assert argv[1] == ckpt and notes[0] == (f"FP8 weights: the pre-quantized checkpoint {ckpt} (its hf_quant_config "
                                            f"sets the FP8 GEMMs)")


def test_vllm_fp8_notes_say_which_checkpoint_or_online_quantization():
    from kvtune.optimizer.launch.vllm import vllm_argv
    ckpt = lp.fp8_checkpoint(M)
    argv, notes = vllm_argv(pick(weights="fp8"))
    assert argv[2] == ckpt and notes[0] == (f"FP8 weights: the FP8 checkpoint {ckpt} (vLLM reads its "
                                            f"quantization_config; no --quantization flag)")
    argv, notes = vllm_argv(pick(model="org/unknown", gated=False, weights="fp8"))
    assert flag(argv, "--quantization") == "fp8_per_tensor"
    assert notes[0] == ("FP8 weights: online quantization of the bf16 checkpoint while loading (--quantization "
                        "fp8_per_tensor)")


def test_a_method_an_engine_lacks_is_no_refusal_while_speculation_is_off():
    from kvtune.optimizer.launch.vllm import vllm_argv
    # medusa with no draft length: nothing speculates, so vLLM 0.33.0 (which dropped Medusa) still launches
    argv, _ = vllm_argv(pick(spec_method="medusa", spec_k=0))
    assert "--speculative-config" not in argv


def test_a_request_exactly_the_pool_is_sized_to_it_without_a_refusal_note():
    # TensorRT-LLM holds 10,048 tokens (whole 32-token blocks of the 10,050 pool); a 10,048-token request fits
    s = lc.trtllm_max_seq_len(pick(max_request_tokens=10_048))
    assert s == lc.Sized(10_048, "context: max_seq_len 10,048 = the longest prompt + output kvtune simulated "
                                 "(the KV pool holds 10,048)")


# TensorRT-LLM's memory setting with a speculative draft, derived by hand (issue 25: a fraction that
# ignored the draft's weights, 0.8395 instead of 0.8674 for Llama-3.1-70B with a Llama-3.1-8B draft,
# passed every test).
#
# ``kv_cache_config.free_gpu_memory_fraction`` is a share of the memory left free after the model
# *and the draft* have loaded (TensorRT-LLM 1.0 KvCacheConfig, llm-api reference). Llama-3.1-70B at
# TP8 on H100 (80 GB, 0.9 utilisation) with a Llama-3.1-8B draft at the target's TP:
#
#     target weights per GPU  70,553,706,496 params x 2 bytes / 8 = 17,638,426,624
#     draft weights per GPU    8,030,261,248 params x 2 bytes / 8 =  2,007,565,312
#     kvtune's pool per GPU    72e9 - 17,638,426,624 - 2,007,565,312 = 52,354,008,064
#     free after loading       80e9 - 17,638,426,624 - 2,007,565,312 = 60,354,008,064
#     fraction                 52,354,008,064 / 60,354,008,064 = 0.86745  (written down to 4 digits: 0.8674)

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
