"""Launch settings: every engine's flags against the table of that version's own definitions
(optimizer/launch/versions.py), and what each engine will do against what kvtune simulated."""

import itertools
import json

import pytest
import yaml

from helpers import nested_keys
from kvtune.costmodel import get_gpu, get_model
from kvtune.costmodel.files import profiles_path
from kvtune.costmodel.memory import weight_bytes
from kvtune.optimizer.launch import (ENGINE_VERSIONS, FLAGS, SPEC_METHODS, TRTLLM_KEYS, argv_of, build_pick,
                              launch_for_pick, launch_settings, scheduling)
from kvtune.optimizer.launch.trtllm import free_fraction

CFG = {"tp": 4, "batch_cap": 128, "kv_dtype": "fp8", "spec_k": 3, "chunk_tokens": 4096}
SPEC = {"method": "eagle3", "draft_model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"}
GPU = get_gpu("h100-sxm")
L8, L70, DSV3, QMOE = (get_model(n) for n in ("llama-3.1-8b", "llama-3.1-70b", "deepseek-v3", "qwen3-30b-a3b"))


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def _run(arch, cfg, spec=None, replicas=1, weights="bf16", engine=None, **kw):
    return launch_settings(arch.hf_id, cfg, replicas, 0.9, spec, name=f"kvtune-{arch.name}", arch=arch, gpu=GPU,
                           weights=weights, activation_reserve_bytes=2e9, engine=engine, **kw)


def _flags_of(argv: list[str]) -> list[str]:
    return [a for a in argv if a.startswith("-") and not a.lstrip("-").isdigit()]


# ---- every flag or key is one the targeted version defines ------------------------------------

PICKS = [dict(CFG, tp=tp, kv_dtype=kv, spec_k=k) for tp, kv, k in itertools.product((1, 2), ("bf16", "fp8"), (0, 3))]
SPECS = [None] + [{"method": m, "draft_model": "org/draft"} for m in SPEC_METHODS]


@pytest.mark.parametrize("weights", ["bf16", "fp8"])
@pytest.mark.parametrize("prefix_caching", [True, False])
def test_every_emitted_flag_and_key_is_in_the_version_table(weights, prefix_caching):
    seen = {e: set() for e in FLAGS}
    for arch, cfg, spec in itertools.product((L8, DSV3), PICKS, SPECS):
        r = _run(arch, cfg, spec, weights=weights, prefix_caching=prefix_caching)
        for e in ("vllm", "sglang", "llamacpp"):
            if e in r["unsupported"]:
                assert r[e].startswith(f"# {ENGINE_VERSIONS[e].label} cannot run this pick: ")
                continue
            flags = _flags_of(argv_of(r[e])[3 if e == "sglang" else 0:])
            assert set(flags) <= set(FLAGS[e]), (e, set(flags) - set(FLAGS[e]))
            seen[e] |= set(flags)
        if "trtllm" not in r["unsupported"]:
            assert set(_flags_of(argv_of(r["trtllm"]["command"]))) <= set(FLAGS["trtllm"])
            keys = nested_keys(yaml.safe_load(r["trtllm"]["config_yaml"]))
            assert set(keys) <= set(TRTLLM_KEYS), set(keys) - set(TRTLLM_KEYS)
    assert seen["vllm"] and seen["sglang"] and (seen["llamacpp"] or weights == "fp8")   # commands were made


def test_commands_and_json_name_the_engine_version():
    r = _run(L8, dict(CFG, tp=1, kv_dtype="bf16"), SPEC)
    for e, text in (("vllm", r["vllm"]), ("sglang", r["sglang"]), ("trtllm", r["trtllm"]["command"]),
                    ("llamacpp", r["llamacpp"])):
        v = ENGINE_VERSIONS[e]
        assert text.splitlines()[0].startswith(f"# {v.label}"), text.splitlines()[0]
        assert r["versions"][e]["version"] == v.version and r["versions"][e]["source"]
    for e in ("vllm", "sglang", "trtllm"):
        tag = ENGINE_VERSIONS[e].image.rsplit(":", 1)[1]
        assert tag != "latest" and ENGINE_VERSIONS[e].version in tag
    assert "vLLM 0.33.0" in r["checked"]


def test_same_inputs_same_settings():
    assert _run(L70, CFG, SPEC, replicas=3) == _run(L70, CFG, SPEC, replicas=3)


# ---- vLLM --------------------------------------------------------------------------------------

def test_vllm_command_maps_every_knob():
    r = _run(L8, CFG, SPEC, replicas=2)
    argv = argv_of(r["vllm"])
    assert argv[:3] == ["vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct"]
    assert _flag(argv, "--tensor-parallel-size") == "4"
    assert _flag(argv, "--max-num-seqs") == "128"
    assert _flag(argv, "--max-num-batched-tokens") == "4096" and "--enable-chunked-prefill" in argv
    assert _flag(argv, "--kv-cache-dtype") == "fp8"
    assert _flag(argv, "--gpu-memory-utilization") == "0.9"
    sc = json.loads(_flag(argv, "--speculative-config"))
    assert sc == {"method": "eagle3", "num_speculative_tokens": 3, "model": SPEC["draft_model"]}
    assert "--enable-prefix-caching" in argv and "--quantization" not in argv
    assert "--no-enable-prefix-caching" in argv_of(_run(L8, CFG, SPEC, prefix_caching=False)["vllm"])


def test_vllm_speculation_methods_are_vllms():
    def sc(arch, method, draft="org/draft"):
        r = _run(arch, CFG, {"method": method, "draft_model": draft})
        return r["unsupported"].get("vllm") or json.loads(_flag(argv_of(r["vllm"]), "--speculative-config"))
    assert sc(L8, "draft")["method"] == "draft_model"                       # not "draft"
    assert sc(L8, "ngram") == {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 5,
                               "prompt_lookup_max": 5}
    assert "on vLLM 0.33.0: vLLM 0.33.0 dropped Medusa" in sc(L8, "medusa")    # not in SpeculativeMethod
    assert sc(L8, "eagle") == {"method": "eagle", "num_speculative_tokens": 3, "model": "org/draft"}
    # no draft_model: the catalog's published EAGLE head for Llama-3.1-8B; none is known for 3.1-70B
    assert sc(L8, "eagle", draft=None)["model"] == "yuhuili/EAGLE-LLaMA3.1-Instruct-8B"
    assert "knows no published one" in sc(L70, "eagle", draft=None)
    assert "multi-token-prediction heads" in sc(L8, "mtp")                 # Llama has no MTP heads
    assert sc(DSV3, "mtp") == {"method": "mtp", "num_speculative_tokens": 3}  # DeepSeek-V3: num_nextn_predict_layers 1
    assert "cannot launch speculative method 'lookahead' on vLLM 0.33.0" in sc(L8, "lookahead")


def test_unknown_method_is_refused_everywhere_instead_of_printed():
    r = _run(L8, dict(CFG, tp=1, kv_dtype="bf16"), {"method": "lookahead", "draft_model": None})
    assert set(r["unsupported"]) >= {"vllm", "sglang", "trtllm", "llamacpp", "k8s"}
    assert r["trtllm"]["config_yaml"] == "" and not argv_of(r["vllm"])


def test_no_speculation_omits_options():
    cfg = dict(CFG, kv_dtype="bf16", spec_k=0)
    r = _run(L8, cfg, None)
    argv = argv_of(r["vllm"])
    assert _flag(argv, "--kv-cache-dtype") == "auto" and "--speculative-config" not in argv
    sg = argv_of(r["sglang"])
    assert "--kv-cache-dtype" not in sg and "--speculative-algorithm" not in sg
    api = yaml.safe_load(r["trtllm"]["config_yaml"])
    assert api["kv_cache_config"]["dtype"] == "auto" and "speculative_config" not in api


# ---- SGLang ------------------------------------------------------------------------------------

def test_sglang_chain_of_k_drafts_verifies_k_plus_one():
    argv = argv_of(_run(L8, CFG, SPEC)["sglang"])
    assert argv[:3] == ["python", "-m", "sglang.launch_server"]
    assert _flag(argv, "--model-path") == L8.hf_id and _flag(argv, "--tp-size") == "4"
    assert _flag(argv, "--max-running-requests") == "128" and _flag(argv, "--chunked-prefill-size") == "4096"
    assert "--enable-mixed-chunk" in argv   # EAGLE3 keeps mixed chunks in 0.5.23 (supports_mixed_chunk)
    assert _flag(argv, "--kv-cache-dtype") == "fp8_e4m3" and _flag(argv, "--mem-fraction-static") == "0.9"
    assert _flag(argv, "--speculative-algorithm") == "EAGLE3"
    assert _flag(argv, "--speculative-num-steps") == "3" and _flag(argv, "--speculative-eagle-topk") == "1"
    assert _flag(argv, "--speculative-num-draft-tokens") == "4"
    assert _flag(argv, "--speculative-draft-model-path") == SPEC["draft_model"]


@pytest.mark.parametrize("method,algo,mixed", [("eagle3", "EAGLE3", True), ("eagle", "EAGLE", True),
                                               ("mtp", "NEXTN", True), ("ngram", "NGRAM", False),
                                               ("draft", "STANDALONE", False)])
def test_sglang_scheduling_follows_what_the_algorithm_allows(method, algo, mixed):
    r = _run(DSV3 if method == "mtp" else L8, CFG, {"method": method, "draft_model": "org/draft"})
    argv = argv_of(r["sglang"])
    assert _flag(argv, "--speculative-algorithm") == algo
    assert ("--enable-mixed-chunk" in argv) is mixed
    assert r["scheduling"]["sglang"] == ("mixed" if mixed else "prefill_first")
    assert scheduling("sglang", method, 3) == r["scheduling"]["sglang"]
    assert scheduling("vllm", method, 3) == "mixed" and scheduling("sglang", method, 0) == "mixed"
    if not mixed:
        assert any("prefill-first" in n for n in r["notes"]["sglang"])


def test_sglang_has_no_medusa():
    r = _run(L8, CFG, {"method": "medusa", "draft_model": "org/medusa"})
    assert "SpeculativeAlgorithm has no Medusa" in r["unsupported"]["sglang"]
    assert "EAGLE3" not in r["sglang"]


# ---- TensorRT-LLM ------------------------------------------------------------------------------

def test_trtllm_command_and_llm_api_yaml():
    t = _run(L8, CFG, SPEC)["trtllm"]
    argv = argv_of(t["command"])
    assert argv[:2] == ["trtllm-serve", L8.hf_id]
    assert _flag(argv, "--tp_size") == "4" and _flag(argv, "--max_batch_size") == "128"
    assert _flag(argv, "--max_num_tokens") == "4096" and _flag(argv, "--extra_llm_api_options") == "config.yaml"
    api = yaml.safe_load(t["config_yaml"])
    assert api["max_batch_size"] == 128 and api["max_num_tokens"] == 4096 and api["enable_chunked_prefill"] is True
    assert api["kv_cache_config"]["dtype"] == "fp8" and api["kv_cache_config"]["enable_block_reuse"] is True
    assert api["speculative_config"] == {"decoding_type": "Eagle", "max_draft_len": 3, "eagle3_one_model": True,
                                         "speculative_model_dir": SPEC["draft_model"]}


def test_trtllm_memory_fraction_gives_kvtunes_pool():
    p = build_pick(L70.hf_id, dict(CFG, tp=4, spec_k=0), 1, 0.9, None, arch=L70, gpu=GPU, weights="bf16",
                   activation_reserve_bytes=3e9)
    m = p.memory
    frac = free_fraction(p)
    free_after_load = GPU.memory_bytes - m.weight_bytes_per_gpu - m.activation_reserve_bytes
    assert frac * free_after_load == pytest.approx(m.kv_pool_bytes_per_gpu, rel=1e-9)
    assert frac < 0.9   # not vLLM's share of all memory: after 35 GB of weights per GPU the free share is smaller
    api = yaml.safe_load(launch_for_pick(p)["trtllm"]["config_yaml"])
    assert api["kv_cache_config"]["max_tokens"] == m.kv_pool_tokens
    assert api["kv_cache_config"]["free_gpu_memory_fraction"] == pytest.approx(frac, abs=1e-4)


@pytest.mark.parametrize("method,expect", [
    ("mtp", {"decoding_type": "MTP", "num_nextn_predict_layers": 3}),
    ("ngram", {"decoding_type": "NGram", "max_draft_len": 3, "max_matching_ngram_size": 5}),
    ("draft", {"decoding_type": "DraftTarget", "max_draft_len": 3, "speculative_model_dir": "org/draft"}),
    ("eagle", None), ("medusa", None)])
def test_trtllm_speculation(method, expect):
    r = _run(DSV3 if method == "mtp" else L8, dict(CFG, tp=8) if method == "mtp" else CFG,
             {"method": method, "draft_model": "org/draft"})
    if expect is None:
        assert "need the TensorRT engine backend" in r["unsupported"]["trtllm"]
    else:
        assert yaml.safe_load(r["trtllm"]["config_yaml"])["speculative_config"] == expect


# ---- FP8 weights end to end --------------------------------------------------------------------

def test_fp8_weights_launch_an_fp8_checkpoint_and_state_the_memory():
    r = _run(L70, dict(CFG, tp=2, spec_k=0), None, weights="fp8")
    assert argv_of(r["vllm"])[2] == "RedHatAI/Meta-Llama-3.1-70B-Instruct-FP8"
    assert _flag(argv_of(r["sglang"]), "--model-path") == "RedHatAI/Meta-Llama-3.1-70B-Instruct-FP8"
    assert argv_of(r["trtllm"]["command"])[1] == "nvidia/Llama-3.1-70B-Instruct-FP8"
    per_gpu_gb = weight_bytes(L70, "fp8") / 2 / 1e9
    assert f"weights FP8 (1-byte GEMM weights, bf16 embeddings and LM head) {per_gpu_gb:.1f} GB" in r["vllm"]
    assert r["memory"]["weights"] == "fp8"
    assert r["memory"]["weight_bytes_per_gpu"] == pytest.approx(weight_bytes(L70, "fp8") / 2)


def test_fp8_weights_without_a_known_checkpoint_quantize_online_or_refuse():
    mistral = get_model("mistral-7b")
    r = _run(mistral, dict(CFG, tp=1, spec_k=0), None, weights="fp8")
    v = argv_of(r["vllm"])
    assert v[2] == mistral.hf_id and _flag(v, "--quantization") == "fp8_per_tensor"   # fp8 refuses online in 0.33
    assert _flag(argv_of(r["sglang"]), "--quantization") == "fp8"
    assert "ModelOpt" in r["unsupported"]["trtllm"]
    assert "checkpoint:" in r["unsupported"]["trtllm"]   # the workload key that names such a folder
    assert "GGUF has no FP8" in r["unsupported"]["llamacpp"]


def test_deepseek_bf16_pick_says_the_checkpoint_is_fp8():
    r = _run(DSV3, dict(CFG, tp=8, spec_k=0), None, weights="bf16")
    assert "is published in FP8" in r["vllm"]


# ---- a model given as a config.json ------------------------------------------------------------

def test_config_json_model_never_launches_the_folder_name(tmp_path):
    folder = tmp_path / "my-finetune"
    folder.mkdir()
    cfg = json.loads(profiles_path("models", "llama-3.1-8b.json").read_text())
    (folder / "config.json").write_text(json.dumps(cfg))
    arch = get_model(str(folder / "config.json"))
    r = launch_settings(str(folder / "config.json"), dict(CFG, tp=1), 1, 0.9, None, arch=arch, gpu=GPU)
    model = argv_of(r["vllm"])[2]
    assert model != "my-finetune" and model.startswith("<")
    assert "replace" in r["vllm"] and "config.json" in r["vllm"]
    (folder / "config.json").write_text(json.dumps(dict(cfg, _name_or_path="acme/my-finetune-8b")))
    r = launch_settings(str(folder / "config.json"), dict(CFG, tp=1), 1, 0.9, None, arch=arch, gpu=GPU)
    assert argv_of(r["vllm"])[2] == "acme/my-finetune-8b"


# ---- llama.cpp ---------------------------------------------------------------------------------

def test_llamacpp_slots_batch_and_context():
    r = _run(L8, dict(CFG, tp=1, kv_dtype="bf16", spec_k=0, batch_cap=16, chunk_tokens=512), None)
    argv = argv_of(r["llamacpp"])
    pool = r["memory"]["kv_pool_tokens"]
    assert argv[0] == "llama-server"
    assert _flag(argv, "-np") == "16" and _flag(argv, "-b") == "512" and _flag(argv, "-ub") == "512"
    # the pool's whole slots, rounded down to the 256 tokens llama.cpp pads n_ctx to
    assert int(_flag(argv, "-c")) == 16 * (pool // 16) // 256 * 256 and "-kvu" in argv and "-cb" in argv
    spec = argv_of(_run(L8, dict(CFG, tp=1, kv_dtype="bf16"), {"method": "draft", "draft_model": "smollm2-135m"})["llamacpp"])
    assert _flag(spec, "--spec-type") == "draft-simple" and _flag(spec, "--spec-draft-n-max") == "3"
    assert "no fp8" in _run(L8, dict(CFG, tp=1), None)["unsupported"]["llamacpp"]


# ---- Kubernetes --------------------------------------------------------------------------------

def _docs(text: str) -> list[dict]:
    assert "&id" not in text and "*id" not in text   # plain YAML: no anchors or aliases
    return [d for d in yaml.safe_load_all(text) if d]


def test_k8s_single_node_replicas_are_a_deployment_with_probes_service_secret_and_cache():
    r = _run(L70, CFG, SPEC, replicas=5)
    docs = _docs(r["k8s"])
    kinds = [d["kind"] for d in docs]
    assert kinds == ["PersistentVolumeClaim", "Deployment", "Service"]
    dep = docs[1]
    assert dep["spec"]["replicas"] == 5 and dep["metadata"]["name"] == "kvtune-llama-3-1-70b"
    c = dep["spec"]["template"]["spec"]["containers"][0]
    assert c["image"] == "vllm/vllm-openai:v0.33.0"
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 4
    assert c["command"][:3] == ["vllm", "serve", "meta-llama/Llama-3.1-70B-Instruct"]
    assert c["command"][c["command"].index("--tensor-parallel-size") + 1] == "4"
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert c[probe]["httpGet"]["path"] == "/health"
    env = {e["name"]: e for e in c["env"]}
    assert env["HF_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "hf-token", "key": "token", "optional": False}
    mounts = {m["name"] for m in c["volumeMounts"]}
    vols = {v["name"]: v for v in dep["spec"]["template"]["spec"]["volumes"]}
    assert {"hf-cache", "shm"} <= mounts and vols["hf-cache"]["persistentVolumeClaim"]["claimName"] == docs[0]["metadata"]["name"]
    assert docs[2]["spec"]["selector"] == {"app": "kvtune-llama-3-1-70b"}


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_k8s_replica_over_two_nodes_is_a_leaderworkerset(engine):
    r = _run(get_model("llama-3.1-405b"), dict(CFG, tp=16, spec_k=0), None, replicas=2, engine=engine)
    docs = _docs(r["k8s"])
    lws = docs[1]
    assert lws["kind"] == "LeaderWorkerSet" and lws["apiVersion"] == "leaderworkerset.x-k8s.io/v1"
    assert lws["spec"]["replicas"] == 2 and lws["spec"]["leaderWorkerTemplate"]["size"] == 2
    lead = lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"][0]
    work = lws["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0]
    assert lead["resources"]["limits"]["nvidia.com/gpu"] == 8 == work["resources"]["limits"]["nvidia.com/gpu"]
    assert _flag(lead["command"], "--nnodes") == "$(LWS_GROUP_SIZE)"
    assert _flag(lead["command"], "--node-rank") == "0" and _flag(work["command"], "--node-rank") == "$(LWS_WORKER_INDEX)"
    if engine == "vllm":
        assert _flag(lead["command"], "--master-addr") == "$(LWS_LEADER_ADDRESS)"
        assert "--headless" in work["command"] and "--headless" not in lead["command"]
    else:
        assert _flag(work["command"], "--dist-init-addr") == "$(LWS_LEADER_ADDRESS):20000"
    assert "readinessProbe" in lead and "readinessProbe" not in work
    assert docs[2]["spec"]["selector"]["role"] == "leader"


# ---- the multi-node fields of a pick (pp, ep, dp_attention) ------------------------------------

def test_pipeline_expert_and_attention_dp_fields():
    cfg = dict(CFG, tp=8, spec_k=0, pp=2, ep=8, dp_attention=True, nodes_per_replica=2, gpus_per_node=8)
    r = _run(QMOE, cfg, None)
    v = argv_of(r["vllm"])
    assert _flag(v, "--pipeline-parallel-size") == "2" and _flag(v, "--data-parallel-size") == "8"
    assert _flag(v, "--tensor-parallel-size") == "1" and "--enable-expert-parallel" in v
    assert _flag(v, "--nnodes") == "2" and _flag(v, "--node-rank") == "0"
    s = argv_of(r["sglang"])
    assert _flag(s, "--pp-size") == "2" and _flag(s, "--ep-size") == "8" and _flag(s, "--attn-dp-size") == "8"
    assert "over 2 nodes" in r["unsupported"]["trtllm"]   # MPI launch not generated
    one_node = dict(cfg, pp=1, nodes_per_replica=1)
    api = yaml.safe_load(_run(QMOE, one_node, None)["trtllm"]["config_yaml"])
    assert api["moe_expert_parallel_size"] == 8 and api["enable_attention_dp"] is True
    api = yaml.safe_load(_run(QMOE, dict(one_node, tp=4, pp=2, ep=1, dp_attention=False), None)["trtllm"]["config_yaml"])
    assert api["pipeline_parallel_size"] == 2 and "moe_expert_parallel_size" not in api
    assert "plain replicas" in _run(L8, dict(one_node, ep=1), None)["unsupported"]["vllm"]


def test_defaults_of_the_multi_node_fields():
    p = build_pick(L8.hf_id, CFG, 1, 0.9, None)
    assert (p.pp, p.ep, p.dp_attention, p.nodes_per_replica, p.gpus_per_node) == (1, 1, False, 1, 8)


# ---- opt-in: the engines' own parsers and kubectl, where installed -----------------------------

def _engine_matrix():
    """(arch, cfg, spec, weights) picks covering every kind: methods, FP8, prefix caching, layouts."""
    base = dict(CFG, tp=1)
    yield L8, base, SPEC, "bf16"
    yield L8, dict(base, spec_k=0, kv_dtype="bf16"), None, "fp8"
    yield get_model("mistral-7b"), dict(base, spec_k=0), None, "fp8"          # online FP8 quantization
    for m in SPEC_METHODS:
        yield (DSV3 if m == "mtp" else L8), dict(base, tp=8 if m == "mtp" else 1), \
            {"method": m, "draft_model": "org/draft"}, "bf16"
    yield QMOE, dict(base, tp=4, pp=2, ep=4, dp_attention=True, spec_k=0), None, "bf16"
    yield get_model("llama-3.1-405b"), dict(base, tp=16, spec_k=0, nodes_per_replica=2), None, "bf16"


def test_vllm_parser_accepts_the_command(monkeypatch):
    """Opt-in (vllm installed): vLLM's own ``vllm serve`` parser reads every generated command to
    the values kvtune meant, and the speculative config's keys and method are SpeculativeConfig's."""
    monkeypatch.setenv("VLLM_TARGET_DEVICE", "cpu")   # building the parser asks for a platform; no GPU here
    pytest.importorskip("vllm")
    from typing import get_args

    from vllm.config.speculative import SpeculativeConfig, SpeculativeMethod
    from vllm.entrypoints.common.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    def flat(t):
        return {x for a in get_args(t) for x in (flat(a) if get_args(a) else {a})}
    methods = flat(SpeculativeMethod)
    fields = set(SpeculativeConfig.__dataclass_fields__)
    parsed = 0
    for arch, cfg, spec, weights in _engine_matrix():
        r = _run(arch, cfg, spec, weights=weights, prefix_caching=weights == "bf16")
        if "vllm" in r["unsupported"]:
            continue
        argv = argv_of(r["vllm"])
        args = make_arg_parser(FlexibleArgumentParser()).parse_args(argv[2:])
        assert args.model_tag == argv[2] and args.max_num_seqs == cfg["batch_cap"]
        assert args.max_num_batched_tokens == cfg["chunk_tokens"] and args.enable_chunked_prefill is True
        assert args.kv_cache_dtype == ("fp8" if cfg["kv_dtype"] == "fp8" else "auto")
        assert args.gpu_memory_utilization == 0.9 and args.enable_prefix_caching is (weights == "bf16")
        if "--speculative-config" in argv:
            sc = json.loads(_flag(argv, "--speculative-config"))
            assert sc["method"] in methods and set(sc) <= fields
        parsed += 1
    assert parsed >= 8


def test_sglang_parser_accepts_the_command():
    """Opt-in (sglang installed): SGLang's own server-args parser reads every generated command."""
    pytest.importorskip("sglang.srt.server_args")
    import argparse

    from sglang.srt.server_args import ServerArgs
    parsed = 0
    for arch, cfg, spec, weights in _engine_matrix():
        r = _run(arch, cfg, spec, weights=weights, prefix_caching=weights == "bf16")
        if "sglang" in r["unsupported"]:
            continue
        parser = argparse.ArgumentParser()
        ServerArgs.add_cli_args(parser)
        argv = argv_of(r["sglang"])[3:]
        args = parser.parse_args(argv)
        assert args.max_running_requests == cfg["batch_cap"] and args.chunked_prefill_size == cfg["chunk_tokens"]
        assert args.enable_mixed_chunk is (r["scheduling"]["sglang"] == "mixed")
        assert args.disable_radix_cache is (weights != "bf16")
        if spec is not None and cfg["spec_k"]:
            assert args.speculative_algorithm == _flag(argv, "--speculative-algorithm")
        parsed += 1
    assert parsed >= 8


def test_trtllm_config_classes_accept_the_yaml():
    llmapi = pytest.importorskip("tensorrt_llm.llmapi")
    api = yaml.safe_load(_run(L8, dict(CFG, tp=1), SPEC)["trtllm"]["config_yaml"])
    assert set(api) <= set(llmapi.TorchLlmArgs.model_fields)
    assert set(api["kv_cache_config"]) <= set(llmapi.KvCacheConfig.model_fields)


@pytest.mark.parametrize("arch_name,cfg,engine", [("llama-3.1-70b", dict(CFG, tp=4), "vllm"),
                                                  ("llama-3.1-405b", dict(CFG, tp=16, spec_k=0), "vllm"),
                                                  ("llama-3.1-405b", dict(CFG, tp=16, spec_k=0), "sglang")])
def test_manifest_matches_the_kubernetes_api_schema(arch_name, cfg, engine):
    """Opt-in (pip install -e .[k8s]): every object, strictly (no unknown field), against the
    Kubernetes 1.33 OpenAPI schemas kubernetes-validate ships; a LeaderWorkerSet's leader and worker
    templates as the PodTemplateSpecs they are (lws api/leaderworkerset/v1/leaderworkerset_types.go)."""
    kv = pytest.importorskip("kubernetes_validate")
    for d in _docs(_run(get_model(arch_name), cfg, SPEC, replicas=2, engine=engine)["k8s"]):
        if d["kind"] == "LeaderWorkerSet":
            assert set(d["spec"]) == {"replicas", "leaderWorkerTemplate"}
            lwt = d["spec"]["leaderWorkerTemplate"]
            assert set(lwt) == {"size", "restartPolicy", "leaderTemplate", "workerTemplate"}
            for t in ("leaderTemplate", "workerTemplate"):
                kv.validate({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"},
                             "template": lwt[t]}, "1.33", strict=True)
        else:
            kv.validate(d, "1.33", strict=True)


def test_kubectl_dry_run_accepts_the_manifest(tmp_path):
    import shutil
    import subprocess
    if not shutil.which("kubectl"):
        pytest.skip("kubectl not installed")
    if subprocess.run(["kubectl", "version", "--request-timeout=5s"], capture_output=True).returncode != 0:
        pytest.skip("kubectl apply --dry-run=client needs an API server for discovery; none reachable")
    f = tmp_path / "m.yaml"
    f.write_text(_run(L70, CFG, SPEC, replicas=2)["k8s"])
    res = subprocess.run(["kubectl", "apply", "--dry-run=client", "-f", str(f)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


def test_dp_attention_pool_is_per_gpu_for_trtllm():
    """Under DP attention every GPU holds its own sequences' KV (costmodel.memory): TensorRT-LLM's
    max_tokens is one rank's pool, the replica's is tp times that."""
    cfg = dict(CFG, tp=4, spec_k=0, ep=4, dp_attention=True)
    r = _run(QMOE, cfg, None)
    m = r["memory"]
    assert m["kv_pool_tokens"] == 4 * m["kv_pool_tokens_per_gpu"]
    assert yaml.safe_load(r["trtllm"]["config_yaml"])["kv_cache_config"]["max_tokens"] == m["kv_pool_tokens_per_gpu"]
