"""Launch settings for a disaggregated pick (optimizer/launch/disagg.py): every flag and key is one
the targeted version defines (versions.py), each pool runs with its own knobs and role, and the
router lists every replica of both pools."""

import json

import pytest
import yaml

from helpers import nested_keys
from kvtune.costmodel import get_gpu, get_model
from kvtune.optimizer.launch import (ENGINE_VERSIONS, FLAGS, ROUTER_VERSIONS, TRTLLM_DISAGG_KEYS, TRTLLM_KEYS, argv_of,
                              build_pick, disaggregated_launch)

GPU = get_gpu("h100-sxm")
L70, L8 = get_model("llama-3.1-70b"), get_model("llama-3.1-8b")


def _pick(arch, tp, cap, chunk, replicas, kv="bf16", spec_k=0, spec=None):
    return build_pick(arch.hf_id, {"tp": tp, "batch_cap": cap, "kv_dtype": kv, "spec_k": spec_k, "chunk_tokens": chunk},
                      replicas, 0.9, spec, arch=arch, gpu=GPU, activation_reserve_bytes=2e9, max_request_tokens=4500)


def _blocks(text: str) -> list[list[str]]:
    """Each command of a multi-command text, as argv (comment lines and env prefixes dropped)."""
    out = []
    for block in text.split("\n\n"):
        body = "\n".join(ln for ln in block.splitlines() if not ln.startswith("#"))
        argv = [a for a in argv_of(body) if "=" not in a.split("-")[0] or a.startswith("-")]
        out.append([a for a in argv if not a.startswith(("VLLM_NIXL_SIDE_CHANNEL_"))])
    return out


def _flags(argv):
    return [a for a in argv if a.startswith("-") and not a.lstrip("-").isdigit()]


def _flag_all(argv, name):
    return [argv[i + 1] for i, a in enumerate(argv) if a == name]


PRE, DEC = _pick(L70, 4, 8, 2048, 2), _pick(L70, 2, 256, 8192, 3, kv="fp8")


@pytest.mark.parametrize("pools", [(PRE, DEC), (_pick(L8, 1, 16, 4096, 1), _pick(L8, 1, 512, 8192, 2))])
def test_every_flag_and_key_is_in_the_version_tables(pools):
    r = disaggregated_launch(*pools, "kvtune-x")
    assert r["unsupported"] == {}
    for engine, router in (("vllm", "vllm-router"), ("sglang", "sglang-router")):
        *servers, route = _blocks(r[engine])
        assert len(servers) == 2
        for argv in servers:
            body = argv[3:] if engine == "sglang" else argv
            assert set(_flags(body)) <= set(FLAGS[engine]), set(_flags(body)) - set(FLAGS[engine])
        body = route[3:] if router == "sglang-router" else route[1:]
        assert set(_flags(body)) <= set(FLAGS[router]), set(_flags(body)) - set(FLAGS[router])
    for argv in _blocks(r["trtllm"]["command"]):
        assert set(_flags(argv)) <= set(FLAGS["trtllm"])
    for key in ("ctx_config_yaml", "gen_config_yaml"):
        assert set(nested_keys(yaml.safe_load(r["trtllm"][key]))) <= set(TRTLLM_KEYS)
    assert set(nested_keys(yaml.safe_load(r["trtllm"]["disagg_config_yaml"]))) <= set(TRTLLM_DISAGG_KEYS)
    for name in ("vllm-router", "sglang-router"):
        assert r["versions"][name]["version"] == ROUTER_VERSIONS[name].version


def test_each_pool_runs_its_own_knobs_and_role_and_the_router_lists_every_replica():
    r = disaggregated_launch(PRE, DEC, "kvtune-x")
    pre, dec, route = _blocks(r["vllm"])
    assert pre[pre.index("--tensor-parallel-size") + 1] == "4" and pre[pre.index("--max-num-seqs") + 1] == "8"
    assert dec[dec.index("--tensor-parallel-size") + 1] == "2" and dec[dec.index("--kv-cache-dtype") + 1] == "fp8"
    for argv in (pre, dec):
        cfg = json.loads(argv[argv.index("--kv-transfer-config") + 1])
        assert cfg == {"kv_connector": "NixlConnector", "kv_role": "kv_both"}
    assert len(_flag_all(route, "--prefill")) == 2 and len(_flag_all(route, "--decode")) == 3
    assert route[route.index("--policy") + 1] == "round_robin"   # kvtune's router
    pre, dec, route = _blocks(r["sglang"])
    assert pre[pre.index("--disaggregation-mode") + 1] == "prefill"
    assert dec[dec.index("--disaggregation-mode") + 1] == "decode"
    assert "--disaggregation-bootstrap-port" in pre and "--pd-disaggregation" in route
    assert _flag_all(route, "--prefill") == ["http://<prefill-0>:8000", "http://<prefill-1>:8000"]
    assert route.count("8998") == 2   # each prefill server with its bootstrap port
    ctx, gen = (yaml.safe_load(r["trtllm"][k]) for k in ("ctx_config_yaml", "gen_config_yaml"))
    assert ctx["disable_overlap_scheduler"] is True and "disable_overlap_scheduler" not in gen
    assert ctx["cache_transceiver_config"]["backend"] == gen["cache_transceiver_config"]["backend"] == "UCX"  # 1.0.0 literal
    assert ctx["cache_transceiver_config"]["max_tokens_in_buffer"] == 4500   # the longest prompt known (here the request)
    assert ctx["tensor_parallel_size"] == 4 and gen["tensor_parallel_size"] == 2
    d = yaml.safe_load(r["trtllm"]["disagg_config_yaml"])
    assert d["context_servers"]["num_instances"] == 2 and len(d["context_servers"]["urls"]) == 2
    assert d["generation_servers"]["num_instances"] == 3 and len(d["generation_servers"]["urls"]) == 3


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_the_kubernetes_manifest_holds_both_pools_and_a_router_that_names_their_pods(engine):
    r = disaggregated_launch(PRE, DEC, "kvtune-x", engine=engine)
    docs = list(yaml.safe_load_all(r["k8s"]))
    sts = {d["metadata"]["name"]: d for d in docs if d["kind"] == "StatefulSet"}
    assert sts["kvtune-x-prefill"]["spec"]["replicas"] == 2 and sts["kvtune-x-decode"]["spec"]["replicas"] == 3
    gpus = {n: s["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"]
            for n, s in sts.items()}
    assert gpus == {"kvtune-x-prefill": 4, "kvtune-x-decode": 2}
    for n, s in sts.items():
        c = s["spec"]["template"]["spec"]["containers"][0]
        assert c["image"] == ENGINE_VERSIONS[engine].image
        headless = [d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == n]
        assert headless and headless[0]["spec"]["clusterIP"] == "None"
    router = [d for d in docs if d["kind"] == "Deployment"][0]["spec"]["template"]["spec"]["containers"][0]
    text = " ".join(router["command"])
    for i in range(2):
        assert f"http://kvtune-x-prefill-{i}.kvtune-x-prefill:8000" in text
    for i in range(3):
        assert f"http://kvtune-x-decode-{i}.kvtune-x-decode:8000" in text
    svc = [d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == "kvtune-x"][0]
    assert svc["spec"]["selector"] == {"app": "kvtune-x", "role": "router"}


def test_same_inputs_same_settings_and_unsupported_picks_say_why():
    assert disaggregated_launch(PRE, DEC, "a") == disaggregated_launch(PRE, DEC, "a")
    spec = {"method": "eagle3", "draft_model": "org/draft"}
    r = disaggregated_launch(PRE, _pick(L70, 2, 256, 8192, 1, spec_k=3, spec=spec), "a")
    assert set(r["unsupported"]) == {"vllm", "sglang", "trtllm", "k8s"}
    assert "speculative" in r["vllm"]


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_the_disaggregated_manifest_matches_the_kubernetes_api_schema(engine):
    """Opt-in (pip install -e .[k8s]): every object, strictly, against Kubernetes 1.33's schemas."""
    kv = pytest.importorskip("kubernetes_validate")
    for d in yaml.safe_load_all(disaggregated_launch(PRE, DEC, "kvtune-x", engine=engine)["k8s"]):
        kv.validate(d, "1.33", strict=True)


def test_vllm_parser_accepts_the_disaggregated_commands(monkeypatch):
    """Opt-in (vllm installed): ``vllm serve``'s own parser reads both pools' commands, the KV
    transfer config included."""
    monkeypatch.setenv("VLLM_TARGET_DEVICE", "cpu")
    pytest.importorskip("vllm")
    from vllm.config.kv_transfer import KVTransferConfig
    from vllm.entrypoints.common.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    *servers, _ = _blocks(disaggregated_launch(PRE, DEC, "x")["vllm"])
    for argv in servers:
        args = make_arg_parser(FlexibleArgumentParser()).parse_args(argv[2:])
        cfg = args.kv_transfer_config
        cfg = cfg if isinstance(cfg, KVTransferConfig) else KVTransferConfig(**cfg)
        assert cfg.kv_connector == "NixlConnector" and cfg.kv_role == "kv_both"


def test_sglang_parser_accepts_the_disaggregated_commands():
    """Opt-in (sglang installed): SGLang's own server-args parser reads both pools' commands."""
    pytest.importorskip("sglang.srt.server_args")
    import argparse

    from sglang.srt.server_args import ServerArgs
    *servers, _ = _blocks(disaggregated_launch(PRE, DEC, "x")["sglang"])
    for argv, mode in zip(servers, ("prefill", "decode")):
        parser = argparse.ArgumentParser()
        ServerArgs.add_cli_args(parser)
        args = parser.parse_args(argv[3:])
        assert args.disaggregation_mode == mode and args.disaggregation_transfer_backend == "mooncake"
