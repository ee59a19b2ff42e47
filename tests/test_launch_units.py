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

import pytest
import yaml
from engine_contracts import check_argv, check_trtllm_api, trtllm_startup_errors, vllm_startup_errors
from launch_picks import M, MEM, POOL, flag, pick

from kvtune.optimizer.launch import (ENGINE_VERSIONS, Unsupported, argv_of, launch_for_pick,
                                     scheduling)
from kvtune.optimizer.launch import context as lc
from kvtune.optimizer.launch import kubernetes as k8s
from kvtune.optimizer.launch.llamacpp import llamacpp_argv
from kvtune.optimizer.launch.sglang import sglang_argv, sglang_mixed_chunk
from kvtune.optimizer.launch.shell import command, comment_block
from kvtune.optimizer.launch.trtllm import free_fraction, trtllm_api, trtllm_argv
from kvtune.optimizer.launch.vllm import vllm_argv


# --- context.py -------------------------------------------------------------------------------------------------

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
