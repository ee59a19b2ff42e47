"""The contract every registered engine passes, in the style of optuna's tests/samplers_tests: one
suite, parametrized over the registry (optimizer.launch.registry) plus a toy engine the tests add
with its two modules only (tests/toy_policy.py, tests/toy_home.py), so that adding an engine is the
registry and those two modules.

Per engine: it is registered once (policy and home under one name); its launch line holds only the
flags its home lists and reads back as the same argv; what its capabilities exclude is refused
with their reason, in the launch settings and in the search space; and, where ``kvtune tune`` can
start it, its adapter starts the fake engine from that line, reads the server back as planned,
recognises a server it did not start, and serves a completion. An engine with no adapter is
refused by tune with the reason.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

import fake_engine
import toy_home
import toy_policy
from kvtune.costmodel import engines as policies
from kvtune.costmodel.hardware import resolve_gpu
from kvtune.costmodel.models import get_model
from kvtune.optimizer.adapters import LocalAdapter
from kvtune.optimizer.adapters.engines import check, detect_kind, kind_of, kinds
from kvtune.optimizer.adapters.errors import InputError
from kvtune.optimizer.engine_space import for_engine
from kvtune.optimizer.launch import SPEC_METHODS, Unsupported, argv_of, launch_for_pick, registry
from kvtune.optimizer.launch.pick import build_pick
from kvtune.optimizer.profile_run import stream_completion
from helpers import nested_keys
from tiny_workload import tiny_8b_spec

FAKE_CPU = Path(__file__).resolve().parents[1] / "data" / "fake-cpu.yaml"
BUILT_IN = tuple(registry.HOMES)
MODEL = "smollm2-135m"


@pytest.fixture(params=[*BUILT_IN, "toy"])
def engine(request):
    """Each registered engine's name; "toy" registers the toy engine's two modules for the test."""
    if request.param == "toy":
        policies.register(toy_policy.TOY)
        registry.register(toy_home.HOME)
        yield "toy"
        registry.unregister("toy")
        policies.unregister("toy")
    else:
        yield request.param


def launchable(engine: str, **cfg):
    """A one-GPU pick of the tiny model this engine can run: its own weight format and KV dtype."""
    caps = policies.capabilities_for(engine)
    weights = "q4_1" if caps.loader == "gguf" else "bf16"
    kv = "bf16" if "bf16" in caps.kv_dtypes else caps.kv_dtypes[0]
    c = {"tp": 1, "batch_cap": 4, "kv_dtype": kv, "spec_k": 0, "chunk_tokens": 128, **cfg}
    return build_pick(MODEL, c, 1, 0.05, None, arch=get_model(MODEL), gpu=resolve_gpu(str(FAKE_CPU)), weights=weights,
                      gpus_per_node=1, max_request_tokens=56)


def _flags(argv: list[str]) -> set[str]:
    return {a for a in argv if a.startswith("-") and not a.lstrip("-").replace(".", "").isdigit()}


# ---- registered once ------------------------------------------------------------------------------
def test_it_is_registered_once_under_one_name(engine):
    h = registry.home(engine)
    assert h.name == engine and h.policy is policies.get_engine(engine)
    assert h.policy.capabilities is policies.capabilities_for(engine) and h.policy.capabilities.engine == engine
    assert h.version.engine == engine and h.label == h.version.label
    assert registry.ENGINE_VERSIONS[engine] is h.version and registry.FLAGS[engine] is h.flags
    # the launch settings list it, under its version, with its scheduling
    out = launch_for_pick(launchable(engine))
    assert out["versions"][engine] == h.version.to_json() and engine in out["scheduling"]
    with pytest.raises(ValueError, match="registered already"):
        registry.register(dataclasses.replace(h))


# ---- the launch line ------------------------------------------------------------------------------
def test_its_launch_line_holds_only_its_flags_and_reads_back_as_the_same_argv(engine):
    h = registry.home(engine)
    p = launchable(engine)
    line = h.serve_line(p)
    flags = _flags(line.argv[max(h.head, 1):])   # after the program (SGLang's is python -m module)
    assert line.argv and flags <= set(h.flags), flags - set(h.flags)
    out = launch_for_pick(p)
    assert engine not in out["unsupported"], out["unsupported"].get(engine)
    entry = out[engine]
    text = entry["command"] if h.config_file else entry
    assert argv_of(text) == line.argv and out["argv"][engine] == [line.argv]
    assert text.startswith(f"# {h.label}")
    if h.config_file:   # its config file holds only keys its home lists
        keys = set(nested_keys(line.config or {}))
        assert keys and keys <= set(h.config_keys), keys - set(h.config_keys)
        assert entry["config_yaml"]


def test_what_its_capabilities_exclude_is_refused_with_their_reason(engine):
    h = registry.home(engine)
    caps = policies.capabilities_for(engine)
    refusals = [(dict(kv_dtype=kv), caps.kv_error(kv)) for kv in ("fp8", "fp16", "bf16") if caps.kv_error(kv)]
    refusals += [(dict(spec_method=m), caps.spec_error(m)) for m in SPEC_METHODS if caps.spec_error(m)]
    assert refusals or caps.max_gpus_per_replica is None, "an engine that refuses nothing has no limit either"
    for cfg, why in refusals:
        method = cfg.pop("spec_method", None)
        p = launchable(engine, **cfg)
        if method is not None:   # drafting 2 tokens a step by this method
            p = dataclasses.replace(p, spec_method=method, spec_k=2)
        with pytest.raises(Unsupported) as exc:
            h.serve_line(p)
        assert str(exc.value) == why
        assert launch_for_pick(p)["unsupported"][engine] == why


def test_its_capabilities_cut_the_search_space(engine):
    """The workload's search space, cut to what the engine launches: a KV dtype or a replica it
    cannot run is dropped with a note, never searched."""
    caps = policies.capabilities_for(engine)
    spec = tiny_8b_spec({"tp": [1, 2], "kv_dtype": ["bf16", "fp16", "fp8"]})
    wide = dataclasses.replace(spec, engine=engine)

    def bad(key, value, why):
        return InputError(f"{key} {value}: {why}")

    cut = for_engine(wide, get_model(spec.model), {}, bad, lambda key, why: InputError(f"{key}: {why}"))
    assert set(cut.search.kv_dtype) == {kv for kv in ("bf16", "fp16", "fp8") if caps.kv_error(kv) is None}
    assert set(cut.search.tp) == {t for t in (1, 2) if caps.replica_error(t, spec.hardware.gpus_per_node) is None}
    assert set(cut.search.deployment) <= set(caps.deployments)


# ---- kvtune tune: start it, read it back ------------------------------------------------------------
@pytest.fixture
def shims(tmp_path, monkeypatch):
    sh = fake_engine.setup(tmp_path, monkeypatch)
    yield sh
    assert not fake_engine.left_behind(sh["pidfile"]), "engine processes left behind"


def _binary(engine: str, sh) -> str:
    return {"llamacpp": str(sh["llama-server"]), "vllm": str(sh["vllm"]), "sglang": sys.executable,
            "toy": str(sh["toy-serve"])}[engine]


def test_tune_starts_it_from_its_launch_line_and_reads_it_back_as_planned(engine, shims):
    h = registry.home(engine)
    if h.adapter is None:
        with pytest.raises(InputError, match=f"--engine '{engine}': kvtune tune starts .*{h.label} has no adapter"):
            kind_of(engine)
        return
    assert kinds()[engine] is h.adapter
    model = str(shims["gguf"]) if h.adapter.model_is_file else "HuggingFaceTB/SmolLM2-135M-Instruct"
    ad = LocalAdapter(engine, binary=_binary(engine, shims), model=model, threads=1 if engine == "llamacpp" else None,
                      log_dir=shims["logs"])
    p = launchable(engine)
    with ad.running(p) as eng:
        assert eng.report.engine == engine and check(eng.plan, eng.report) == []
        assert eng.report.slots in (None, p.batch_cap) and eng.report.pool_tokens
        assert detect_kind(eng.url.removesuffix("/v1")) is h.adapter   # recognised when kvtune did not start it
        r = stream_completion(eng.url, {"model": eng.served_model, "prompt": " ".join(["w"] * 24), "max_tokens": 8,
                                        "stream": True}, 20)
        assert r.ok and r.output_tokens == 8
    assert eng.process.returncode() is not None


def test_the_cli_takes_it_as_an_engine_choice(engine, tmp_path):
    """--engine reads the registry when the command line is read: an engine registered at run time
    (the toy) is solved and launched through the CLI as a built-in one is, and named in --help."""
    import json

    import yaml

    from helpers import kvtune
    from tiny_workload import tiny_8b
    caps = policies.capabilities_for(engine)
    if "aggregated" not in caps.deployments or caps.loader == "gguf":
        pytest.skip(f"{engine}: the tiny 8B workload is not one it serves (GPU, bf16 weights)")
    wl = tmp_path / "w.yaml"
    kv = "bf16" if "bf16" in caps.kv_dtypes else caps.kv_dtypes[0]
    wl.write_text(yaml.safe_dump(tiny_8b({"tp": [1], "batch_cap": [16, 64], "kv_dtype": [kv], "trials": 6, "seed": 0,
                                          "deployment": ["aggregated"]})))
    code, out = kvtune("solve", wl, "--engine", engine, "--json", tmp_path / "r.json")
    assert code == 0, out
    r = json.loads((tmp_path / "r.json").read_text())
    assert r["engine"] == engine and r["launch"][engine], r["launch"].keys()   # its launch line, from its home
    code, helptext = kvtune("solve", "--help")
    assert code == 0 and engine in helptext
    if engine == "toy":   # once unregistered it is refused in kvtune's one line
        registry.unregister("toy")
        policies.unregister("toy")
        try:
            code, out = kvtune("solve", wl, "--engine", "toy")
            assert code == 2 and "--engine must be one of" in out and "got 'toy'" in out, out
        finally:
            policies.register(toy_policy.TOY)
            registry.register(toy_home.HOME)
