"""The workload's ``checkpoint:`` (optimizer/user_checkpoint.py) and Hub ids read from the local
Hugging Face cache (optimizer/hf_cache.py), issue 34 item 2: the folder, GGUF file or Hub id the
engine loads, checked for the format its files declare (costmodel/checkpoint_format.py), and
loaded by every launch line.

Every test that could reach a Hugging Face cache points HF_HUB_CACHE at a folder of its own and
hides huggingface_hub (``no_hub``), so no test reads this machine's cache or the network."""

from __future__ import annotations

import copy
import json
import struct
import sys
import types
from pathlib import Path

import pytest
import yaml

from helpers import kvtune
from kvtune.costmodel.checkpoint_format import config_format, folder_format, gguf_format
from kvtune.costmodel.errors import InputError
from kvtune.costmodel.files import profiles_path
from kvtune.costmodel.models import cached_hub_id, get_model
from kvtune.optimizer.hf_cache import hub_file, looks_like_hub_id
from kvtune.optimizer.launch import argv_of, launch_settings
from kvtune.optimizer.workload import load_workload, load_workload_dict

ROOT = Path(__file__).parent.resolve().parents[1]
# Qwen/Qwen2.5-7B-Instruct's config.json on the Hub (revision a09a354), the keys as published
QWEN_7B = {"architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
           "eos_token_id": 151645, "hidden_act": "silu", "hidden_size": 3584, "initializer_range": 0.02,
           "intermediate_size": 18944, "max_position_embeddings": 32768, "max_window_layers": 28,
           "model_type": "qwen2", "num_attention_heads": 28, "num_hidden_layers": 28, "num_key_value_heads": 4,
           "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 131072, "tie_word_embeddings": False,
           "torch_dtype": "bfloat16", "transformers_version": "4.43.1", "use_cache": True,
           "use_sliding_window": False, "vocab_size": 152064}
QWEN_REV = "a09a35458c702b33eeacc393d103063234e8bc28"
# the hf_quant_config.json ModelOpt writes for an FP8 checkpoint (nvidia/Llama-3.1-8B-Instruct-FP8's keys)
MODELOPT_FP8 = {"producer": {"name": "modelopt", "version": "0.29.0"},
                "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8", "exclude_modules": ["lm_head"]}}
BASE = {"model": "llama-2-70b", "engine": "trtllm",
        "hardware": {"gpu": "h100-sxm", "gpus_per_node": 8, "usd_per_gpu_hour": 3.0},
        "workload": {"rate_req_s": 4, "classes": [{"name": "chat", "input_tokens": 1024, "output_tokens": 128}]},
        "slo": {"ttft_ms": 2000, "tpot_ms": 60}, "search": {"trials": 12}}


@pytest.fixture(autouse=True)
def no_hub(monkeypatch, tmp_path):
    """No huggingface_hub (its import fails) and an empty cache of the test's own."""
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)
    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    return cache


def _wl(**over) -> dict:
    d = copy.deepcopy(BASE)
    for k, v in over.items():
        if v is None:
            d.pop(k, None)
        else:
            d[k] = v
    return d


def _write(tmp_path: Path, data: dict, name: str = "w.yaml") -> Path:
    p = tmp_path / name
    p.write_text(yaml.safe_dump(data))
    return p


def _folder(tmp_path: Path, name: str, config: dict, quant: dict | None = None) -> Path:
    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps(config))
    if quant is not None:
        (d / "hf_quant_config.json").write_text(json.dumps(quant))
    return d


def _llama2_70b() -> dict:
    return json.loads(profiles_path("models", "llama-2-70b.json").read_text())


def _cache_qwen(cache: Path, refs: bool = True) -> Path:
    repo = cache / "models--Qwen--Qwen2.5-7B-Instruct"
    snap = repo / "snapshots" / QWEN_REV
    snap.mkdir(parents=True)
    (snap / "config.json").write_text(json.dumps(QWEN_7B))
    if refs:
        (repo / "refs").mkdir()
        (repo / "refs" / "main").write_text(QWEN_REV)
    return snap / "config.json"


def _refused(tmp_path: Path, data: dict, *parts: str) -> str:
    """``kvtune solve`` on ``data``: exit 2, one ``Error:`` line holding ``parts``, nothing written."""
    p, out = _write(tmp_path, data), tmp_path / "r.json"
    before = set(tmp_path.rglob("*"))
    code, text = kvtune("solve", p, "--json", out, "--quiet")
    assert code == 2 and len(text.strip().splitlines()) == 1 and text.startswith(f"Error: {p}: "), text
    for part in parts:
        assert part in text, (part, text)
    assert not out.exists() and set(tmp_path.rglob("*")) == before
    return text


def _solve(tmp_path: Path, data: dict) -> dict:
    p, out = _write(tmp_path, data), tmp_path / "r.json"
    code, text = kvtune("solve", p, "--json", out, "--quiet")
    assert code == 0, text
    return json.loads(out.read_text())


# ---- Llama-2-70B FP8 on TensorRT-LLM from a ModelOpt folder -----------------------------------------

def test_llama2_70b_fp8_on_trtllm_solves_from_a_modelopt_folder_and_launches_it(tmp_path):
    ck = _folder(tmp_path, "llama-2-70b-fp8", _llama2_70b(), MODELOPT_FP8)
    # without the key: the catalog knows no ModelOpt checkpoint (as before), and the line names the key
    _refused(tmp_path, _wl(weights="fp8"), "catalog knows none for llama-2-70b", "name that folder in checkpoint:")
    r = _solve(tmp_path, _wl(checkpoint="llama-2-70b-fp8"))     # relative to the workload's folder
    assert r["status"] == "ok" and r["recommendation"]["model"] == "llama-2-70b"
    assert any(n.startswith("weights: not given; fp8, as the checkpoint declares (quant_algo FP8") for n in r["notes"])
    argv = r["launch"]["argv"]["trtllm"][0]
    assert argv[:2] == ["trtllm-serve", str(ck)], argv
    assert r["launch"]["memory"]["weights"] == "fp8"
    # the ModelOpt checkpoint sets FP8 KV, which TensorRT-LLM runs under dtype auto: only fp8 KV searched
    assert r["recommendation"]["kv_dtype"] == "fp8"
    assert any("kv_cache_quant_algo FP8" in n for n in r["notes"])
    for engine in ("vllm", "sglang"):   # the other engines load the same folder, no --quantization
        a = r["launch"]["argv"][engine][0]
        assert str(ck) in a and "--quantization" not in a, (engine, a)
    assert "kserve" in r["launch"]["platforms"]["unsupported"]   # KServe pulls hf://, not a local folder


def test_the_same_workload_with_weights_fp8_given_reads_the_same(tmp_path):
    _folder(tmp_path, "ck", _llama2_70b(), MODELOPT_FP8)
    a = load_workload(_write(tmp_path, _wl(checkpoint="ck")))
    b = load_workload(_write(tmp_path, _wl(checkpoint="ck", weights="fp8"), "w2.yaml"))
    assert a.weights == b.weights == "fp8" and a.search == b.search
    assert a.checkpoint is not None and a.checkpoint.modelopt and a.checkpoint.load.id == str(tmp_path / "ck")
    assert a.to_dict()["checkpoint"]["declared"]["declared"] == "quant_algo FP8"


# ---- refusals: one line, exit 2, nothing written ----------------------------------------------------

def test_weights_that_contradict_the_checkpoint_are_one_error_line(tmp_path):
    _folder(tmp_path, "ck", _llama2_70b(), MODELOPT_FP8)
    _refused(tmp_path, _wl(checkpoint="ck", weights="bf16"), "weights = 'bf16'",
             f"the checkpoint ck holds fp8 weights (quant_algo FP8 in {tmp_path / 'ck' / 'hf_quant_config.json'}")


def test_a_missing_folder_is_one_error_line(tmp_path):
    _refused(tmp_path, _wl(checkpoint="./nosuch"), "checkpoint = './nosuch'", "no such file or folder")
    _refused(tmp_path, _wl(checkpoint="/nonexistent/llama.gguf"), "no such file or folder")


def test_a_checkpoint_of_another_model_is_one_error_line(tmp_path):
    _folder(tmp_path, "ck", QWEN_7B, MODELOPT_FP8)
    _refused(tmp_path, _wl(checkpoint="ck"), "checkpoint = 'ck'", "num_hidden_layers 28 where model llama-2-70b has 80")


def test_formats_kvtune_does_not_model_are_refused_by_name(tmp_path):
    _folder(tmp_path, "nvfp4", _llama2_70b(), {"quantization": {"quant_algo": "NVFP4"}})
    _refused(tmp_path, _wl(checkpoint="nvfp4"), "holds quant_algo NVFP4 weights", "a format kvtune does not model")
    awq = dict(_llama2_70b(), quantization_config={"quant_method": "awq", "bits": 4, "group_size": 128})
    _folder(tmp_path, "awq", awq)
    _refused(tmp_path, _wl(checkpoint="awq", engine="vllm"), "quant_method awq, bits 4")


def test_trtllm_fp8_needs_a_modelopt_checkpoint_not_a_quantization_config(tmp_path):
    fp8 = dict(_llama2_70b(), quantization_config={"quant_method": "fp8", "activation_scheme": "dynamic"})
    _folder(tmp_path, "hf-fp8", fp8)
    _refused(tmp_path, _wl(checkpoint="hf-fp8"), "checkpoint = 'hf-fp8'", "pre-quantized ModelOpt checkpoint",
             "quant_method fp8")
    _folder(tmp_path, "bf16", _llama2_70b())   # nor a bf16 one (TensorRT-LLM quantizes no FP8 while loading)
    _refused(tmp_path, _wl(checkpoint="bf16", weights="fp8"), "pre-quantized ModelOpt checkpoint")


def test_an_explicit_kv_dtype_the_modelopt_checkpoint_overrides_is_refused(tmp_path):
    _folder(tmp_path, "ck", _llama2_70b(), MODELOPT_FP8)
    _refused(tmp_path, _wl(checkpoint="ck", search={"kv_dtype": "bf16", "trials": 4}), "search.kv_dtype",
             "kv_cache_quant_algo FP8")


def test_a_gguf_checkpoint_needs_llamacpp(tmp_path):
    _gguf(tmp_path / "m.gguf", 15)
    _refused(tmp_path, _wl(checkpoint="m.gguf", model="llama-3.1-8b", engine=None),
             "a GGUF checkpoint", "engine: llamacpp", "vLLM 0.33.0 is the engine when none is named")


# ---- Hub ids from the Hugging Face cache ------------------------------------------------------------

def test_a_hub_id_outside_the_catalog_solves_from_the_local_cache(tmp_path, no_hub):
    cfg = _cache_qwen(no_hub)
    r = _solve(tmp_path, _wl(model="Qwen/Qwen2.5-7B-Instruct", engine=None))
    assert r["status"] == "ok" and r["recommendation"]["model"] == "Qwen2.5-7B-Instruct"
    assert any(n.startswith("model: Qwen/Qwen2.5-7B-Instruct is not in kvtune's catalog") and str(cfg) in n
               for n in r["notes"])
    assert r["launch"]["argv"]["vllm"][0][:3] == ["vllm", "serve", "Qwen/Qwen2.5-7B-Instruct"]
    # the architecture is the published config's: 7.6B parameters (the model card's 7.61B)
    arch = get_model(str(cfg))
    assert arch.hf_id == "Qwen/Qwen2.5-7B-Instruct" and arch.name == "Qwen2.5-7B-Instruct"
    assert (arch.n_layers, arch.hidden, arch.n_heads, arch.n_kv_heads, arch.intermediate, arch.vocab) == \
        (28, 3584, 28, 4, 18944, 152064)
    assert abs(arch.total_params / 7.61e9 - 1) < 0.01 and arch.n_sliding_layers == 0


def test_a_hub_id_in_no_cache_is_one_error_line_naming_where_kvtune_looked(tmp_path, no_hub):
    _refused(tmp_path, _wl(model="Qwen/Qwen2.5-7B-Instruct"), "not in kvtune's catalog", str(no_hub),
             "huggingface-cli download Qwen/Qwen2.5-7B-Instruct config.json")


def test_the_cache_without_refs_main_takes_its_only_snapshot(no_hub):
    cfg = _cache_qwen(no_hub, refs=False)
    found = hub_file("Qwen/Qwen2.5-7B-Instruct")
    assert found is not None and found.path == cfg and found.how == "the Hugging Face cache"
    assert hub_file("Qwen/Qwen2.5-72B-Instruct-X") is None


def test_hf_home_and_the_default_cache_are_read_when_hf_hub_cache_is_unset(tmp_path, monkeypatch):
    monkeypatch.delenv("HF_HUB_CACHE")
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    cfg = _cache_qwen(tmp_path / "home" / "hub")
    assert hub_file("Qwen/Qwen2.5-7B-Instruct").path == cfg


def test_huggingface_hub_when_installed_reads_the_cache_and_an_offline_download_is_a_miss(tmp_path, monkeypatch,
                                                                                        no_hub):
    calls = []

    def download(repo_id, filename, cache_dir=None):
        calls.append((repo_id, filename))
        raise OSError("offline")   # huggingface_hub raises its own errors offline; any is a miss

    cfg = _cache_qwen(no_hub)
    hub = types.SimpleNamespace(hf_hub_download=download,
                                try_to_load_from_cache=lambda repo_id, filename, cache_dir=None:
                                str(cfg) if repo_id == "Qwen/Qwen2.5-7B-Instruct" else None)
    monkeypatch.setitem(sys.modules, "huggingface_hub", hub)
    found = hub_file("Qwen/Qwen2.5-7B-Instruct")
    assert found.path == cfg and "huggingface_hub" in found.how and calls == []
    assert hub_file("org/not-cached") is None and calls == [("org/not-cached", "config.json")]
    _refused(tmp_path, _wl(model="org/not-cached"), "nor in the local Hugging Face cache")


def test_a_hub_checkpoint_in_the_cache_is_read_and_an_uncached_one_is_kept_with_a_note(tmp_path, no_hub):
    _cache_qwen(no_hub)
    s = load_workload_dict(_wl(model="Qwen/Qwen2.5-7B-Instruct", engine="vllm", checkpoint="Qwen/Qwen2.5-7B-Instruct"),
                           str(tmp_path / "w.yaml"))
    assert s.weights == "bf16" and s.checkpoint.declared.declared == "torch_dtype bfloat16"
    s = load_workload_dict(_wl(model="llama-2-70b", engine="vllm", checkpoint="someone/Llama-2-70b-FP8", weights="fp8"),
                           str(tmp_path / "w.yaml"))
    assert s.checkpoint.declared is None and s.weights == "fp8"
    assert any("not checked" in n for n in s.notes)
    p = launch_settings("meta-llama/Llama-2-70b-hf", {"tp": 4, "batch_cap": 64, "kv_dtype": "bf16", "spec_k": 0,
                                                      "chunk_tokens": 2048}, 1, 0.9, None, weights="fp8",
                        checkpoint=s.checkpoint)
    assert argv_of(p["vllm"])[:3] == ["vllm", "serve", "someone/Llama-2-70b-FP8"]   # trusted: no online quantization
    assert "--quantization" not in argv_of(p["vllm"])


def test_hub_ids_and_cache_paths():
    assert looks_like_hub_id("Qwen/Qwen2.5-7B-Instruct") and not looks_like_hub_id("./a/b")
    assert not looks_like_hub_id("a--b/c") and not looks_like_hub_id("a/b/c") and not looks_like_hub_id("gpt-5")
    assert cached_hub_id(Path(f"/c/models--Qwen--Qwen2.5-7B-Instruct/snapshots/{QWEN_REV}/config.json")) \
        == "Qwen/Qwen2.5-7B-Instruct"
    assert cached_hub_id(Path("/models/qwen/config.json")) == ""


# ---- what a checkpoint's files declare --------------------------------------------------------------

def test_quantization_config_fp8_is_read_as_fp8_weights_and_vllm_loads_it_as_is(tmp_path):
    fp8 = dict(_llama2_70b(), quantization_config={"quant_method": "fp8", "activation_scheme": "static"})
    ck = _folder(tmp_path, "hf-fp8", fp8)
    s = load_workload_dict(_wl(engine="vllm", checkpoint="hf-fp8"), str(tmp_path / "w.yaml"))
    assert s.weights == "fp8" and not s.checkpoint.modelopt
    p = launch_settings("meta-llama/Llama-2-70b-hf", {"tp": 4, "batch_cap": 64, "kv_dtype": "bf16", "spec_k": 0,
                                                      "chunk_tokens": 2048}, 1, 0.9, None, weights="fp8",
                        checkpoint=s.checkpoint)
    a = argv_of(p["vllm"])
    assert a[:3] == ["vllm", "serve", str(ck)] and "--quantization" not in a
    assert "ModelOpt" in p["unsupported"]["trtllm"]     # TensorRT-LLM's line refuses a non-ModelOpt FP8 folder


def test_an_unquantized_folder_with_weights_fp8_is_quantized_while_loading(tmp_path):
    ck = _folder(tmp_path, "bf16", _llama2_70b())
    s = load_workload_dict(_wl(engine="vllm", checkpoint="bf16", weights="fp8"), str(tmp_path / "w.yaml"))
    assert s.weights == "fp8" and s.checkpoint.load.weights == "fp16"   # the config's torch_dtype float16
    p = launch_settings("x", {"tp": 4, "batch_cap": 64, "kv_dtype": "bf16", "spec_k": 0, "chunk_tokens": 2048},
                        1, 0.9, None, weights="fp8", checkpoint=s.checkpoint)
    assert argv_of(p["vllm"])[2] == str(ck) and "fp8_per_tensor" in argv_of(p["vllm"])


def test_config_declarations():
    w = "c.json"
    assert config_format({"torch_dtype": "bfloat16"}, w).weights == "bf16"
    assert config_format({"dtype": "float16"}, w).weights == "fp16"
    assert config_format({}, w) is None
    ct = {"quant_method": "compressed-tensors", "config_groups": {"group_0": {"weights": {"num_bits": 8, "type": "float"}}}}
    assert config_format({"quantization_config": ct}, w).weights == "fp8"
    ct4 = {"quant_method": "compressed-tensors", "config_groups": {"g": {"weights": {"num_bits": 4, "type": "int"}}}}
    assert config_format({"quantization_config": ct4}, w).weights is None
    assert config_format({"quantization_config": {"quant_method": "gptq", "bits": 4}}, w).declared == \
        "quant_method gptq, bits 4"
    mo = config_format({"quantization_config": {"quant_method": "modelopt", "quant_algo": "FP8"}}, w)
    assert mo.weights == "fp8" and mo.modelopt


def test_a_modelopt_folder_that_quantized_only_the_kv_cache_holds_the_configs_precision(tmp_path):
    d = _folder(tmp_path, "kv", {"torch_dtype": "bfloat16"},
                {"quantization": {"quant_algo": None, "kv_cache_quant_algo": "FP8"}})
    f = folder_format(d)
    assert f.weights == "bf16" and f.modelopt and f.kv == "fp8"


# ---- GGUF -----------------------------------------------------------------------------------------

def _gstr(s: str) -> bytes:
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def _gguf(path: Path, file_type: int | None, version: int = 3) -> Path:
    """A GGUF header as the spec lays it out (ggml docs/gguf.md): magic, version, tensor count,
    metadata count, then key, value type, value; a string array before general.file_type."""
    kvs = [_gstr("general.architecture") + struct.pack("<I", 8) + _gstr("llama"),
           _gstr("tokenizer.ggml.tokens") + struct.pack("<IIQ", 9, 8, 3) + _gstr("a") + _gstr("bc") + _gstr("<s>"),
           _gstr("tokenizer.ggml.scores") + struct.pack("<IIQ", 9, 6, 2) + struct.pack("<ff", 0.0, -1.0),
           _gstr("llama.block_count") + struct.pack("<II", 4, 32)]
    if file_type is not None:
        kvs.append(_gstr("general.file_type") + struct.pack("<II", 4, file_type))
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", version, 0, len(kvs)) + b"".join(kvs))
    return path


def test_a_gguf_files_type_is_read_from_its_header(tmp_path):
    assert gguf_format(_gguf(tmp_path / "a.gguf", 15)).weights == "q4_k"
    assert gguf_format(_gguf(tmp_path / "b.gguf", 32)).weights == "bf16"
    assert gguf_format(_gguf(tmp_path / "c.gguf", 7)).declared == "general.file_type 7 (Q8_0)"
    assert gguf_format(_gguf(tmp_path / "d.gguf", 30)).weights is None          # IQ4_XS: not modelled
    assert gguf_format(_gguf(tmp_path / "e.gguf", None)) is None                 # the key is optional
    whole = _gguf(tmp_path / "f.gguf", 15).read_bytes()
    (tmp_path / "t.gguf").write_bytes(whole[:-3])
    with pytest.raises(InputError, match="truncated GGUF header"):
        gguf_format(tmp_path / "t.gguf")
    (tmp_path / "x.gguf").write_bytes(b"NOPE" + whole[4:])
    with pytest.raises(InputError, match="not a GGUF file"):
        gguf_format(tmp_path / "x.gguf")
    with pytest.raises(InputError, match="GGUF version 1"):
        gguf_format(_gguf(tmp_path / "v1.gguf", 15, version=1))


def test_a_gguf_checkpoint_on_llamacpp_fills_in_weights_and_loads_the_file(tmp_path):
    g = _gguf(tmp_path / "llama-3.1-8b-Q4_K_M.gguf", 15)
    data = _wl(model="llama-3.1-8b", engine="llamacpp", checkpoint=g.name, search={"tp": [1], "trials": 4})
    s = load_workload_dict(data, str(tmp_path / "w.yaml"))
    assert s.weights == "q4_k" and s.checkpoint.load.kind == "gguf_file"
    p = launch_settings("meta-llama/Llama-3.1-8B-Instruct", {"tp": 1, "batch_cap": 4, "kv_dtype": "fp16", "spec_k": 0,
                                                             "chunk_tokens": 512}, 1, 0.9, None, weights="q4_k",
                        checkpoint=s.checkpoint, max_request_tokens=2048)
    a = argv_of(p["llamacpp"])
    assert a[:3] == ["llama-server", "-m", str(g)]
    assert "GGUF" in p["unsupported"]["vllm"] and "GGUF" in p["unsupported"]["trtllm"]
    _refused(tmp_path, dict(data, weights="q8_0"), "weights = 'q8_0'", "holds q4_k weights")


def test_a_published_gguf_repository_and_type_loads_with_hf(tmp_path):
    data = _wl(model="llama-3.1-8b", engine="llamacpp", checkpoint="bartowski/Meta-Llama-3.1-8B-Instruct-GGUF:Q5_K_M")
    s = load_workload_dict(data, str(tmp_path / "w.yaml"))
    assert s.weights == "q5_k" and s.checkpoint.load.kind == "gguf_hub"
    p = launch_settings("x", {"tp": 1, "batch_cap": 4, "kv_dtype": "fp16", "spec_k": 0, "chunk_tokens": 512}, 1, 0.9,
                        None, weights="q5_k", checkpoint=s.checkpoint, max_request_tokens=2048)
    assert argv_of(p["llamacpp"])[1:3] == ["-hf", "bartowski/Meta-Llama-3.1-8B-Instruct-GGUF:Q5_K_M"]
    _refused(tmp_path, dict(data, checkpoint="org/repo-GGUF:IQ2_XXS"), "GGUF type 'IQ2_XXS' is not one kvtune models")


def test_an_hf_folder_on_llamacpp_converts_from_that_folder(tmp_path):
    cfg = json.loads(profiles_path("models", "llama-3.1-8b.json").read_text())
    ck = _folder(tmp_path, "l8", cfg)
    s = load_workload_dict(_wl(model="llama-3.1-8b", engine="llamacpp", checkpoint="l8", weights="q4_k",
                               search={"tp": [1]}), str(tmp_path / "w.yaml"))
    p = launch_settings("x", {"tp": 1, "batch_cap": 4, "kv_dtype": "fp16", "spec_k": 0, "chunk_tokens": 512}, 1, 0.9,
                        None, weights="q4_k", checkpoint=s.checkpoint, max_request_tokens=2048)
    assert any(f"convert_hf_to_gguf.py {ck} " in n for n in p["notes"]["llamacpp"])


# ---- workloads without the key read as before -------------------------------------------------------

def test_workloads_without_a_checkpoint_read_as_before():
    for path in sorted((ROOT / "examples").glob("*.yaml")):
        s = load_workload(path)
        assert s.checkpoint is None and "checkpoint" not in s.to_dict()
        assert not any(n.startswith(("checkpoint:", "weights: not given")) for n in s.notes), path


def test_the_shipped_workload_schema_knows_the_key():
    import jsonschema
    schema = json.loads((ROOT / "profiles" / "schemas" / "workload.schema.json").read_text())
    v = jsonschema.Draft202012Validator(schema)
    assert list(v.iter_errors(_wl(checkpoint="/models/llama-2-70b-fp8", weights="fp8"))) == []
    assert list(v.iter_errors(_wl(checkpoint=["not", "a", "string"])))


def test_tune_launches_the_workloads_checkpoint(tmp_path, monkeypatch):
    """kvtune tune builds its engine starts from the same pick as solve: the checkpoint goes with it."""
    import yaml

    import fake_engine
    from kvtune.optimizer.adapters import LocalAdapter
    from kvtune.optimizer.search import make_storage
    from kvtune.optimizer.tune import Tuner, TuneSettings
    from kvtune.optimizer.tune_store import TuneStore
    from kvtune.optimizer.workload import load_workload

    sh = fake_engine.setup(tmp_path, monkeypatch)
    w = yaml.safe_load(Path(sh["workload"]).read_text())
    w["checkpoint"] = str(_gguf(tmp_path / "mine-Q4_1.gguf", 3))   # general.file_type 3: Q4_1
    path = _write(tmp_path, w, "tune.yaml")
    ad = LocalAdapter("llamacpp", binary=str(sh["llama-server"]), model=str(sh["gguf"]), threads=1, log_dir=sh["logs"])
    (tmp_path / "w").mkdir()
    t = Tuner(load_workload(path), ad, TuneSettings(calibration="ideal"),
              TuneStore(make_storage(f"journal:{tmp_path / 'j.journal'}"), "s", "d"), tmp_path / "w", lambda s: None, 1)
    pick = t._pick(t._context(), {"tp": 1, "batch_cap": 4, "kv_dtype": "fp16", "spec_k": 0, "chunk_tokens": 512})
    assert t.spec.checkpoint is not None and pick.user_checkpoint == t.spec.checkpoint
    assert pick.model == w["checkpoint"]   # what the engine loads
