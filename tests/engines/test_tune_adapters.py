"""Engine adapters against the fake engine (tests/fake_engine.py): kvtune's own launch lines for
llama.cpp, vLLM and SGLang start it, the running server is read back and checked against the plan,
and every start is stopped whatever happens: no process is left behind."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

import fake_engine
from kvtune.costmodel.hardware import resolve_gpu
from kvtune.costmodel.models import get_model
from kvtune.optimizer.adapters import (EngineCrashed, EngineMismatch, EngineStartError, LocalAdapter, TemplateAdapter,
                                       UrlAdapter, model_matches)
from kvtune.optimizer.adapters import process as process_mod
from kvtune.optimizer.adapters.errors import InputError
from kvtune.optimizer.launch.pick import build_pick
from kvtune.optimizer.profile_run import stream_completion

ROOT = Path(__file__).parent.resolve().parents[1]
FAKE_CPU = ROOT / "tests" / "data" / "fake-cpu.yaml"
CFG = {"tp": 1, "batch_cap": 4, "kv_dtype": "fp16", "spec_k": 0, "chunk_tokens": 128}


def pick(cfg=CFG, weights="q4_1", **kw):
    return build_pick("smollm2-135m", cfg, 1, 0.05, None, arch=get_model("smollm2-135m"),
                      gpu=resolve_gpu(str(FAKE_CPU)), weights=weights, gpus_per_node=1, max_request_tokens=56, **kw)


@pytest.fixture
def shims(tmp_path, monkeypatch):
    """The fake engine as llama-server, vllm and sglang; its pids recorded (every one must be gone)."""
    sh = fake_engine.setup(tmp_path, monkeypatch)
    yield {**sh, "paths": sh}
    assert_no_orphans(sh["pidfile"])


def alive(pid: int) -> bool:
    return fake_engine.alive(pid)


def assert_no_orphans(pidfile: Path) -> None:
    assert not fake_engine.left_behind(pidfile), "engine processes left behind"


def llama(sh, **kw) -> LocalAdapter:
    return LocalAdapter("llamacpp", binary=str(sh["paths"]["llama-server"]), model=str(sh["gguf"]), threads=1,
                        log_dir=sh["logs"], **kw)


def complete(url: str, model: str):
    return stream_completion(url, {"model": model, "prompt": " ".join(["w"] * 24), "max_tokens": 8, "stream": True}, 20)


def test_llama_server_starts_from_kvtunes_launch_line_and_is_read_back(shims):
    ad = llama(shims)
    with ad.running(pick()) as eng:
        argv = list(eng.plan.argv)
        assert argv[0] == str(shims["paths"]["llama-server"]) and argv[argv.index("-m") + 1] == str(shims["gguf"])
        assert argv[argv.index("-np") + 1] == "4" and argv[argv.index("-t") + 1] == "1" and "-kvu" in argv
        # -c: 4 slots x the longest request (56), padded to llama.cpp's 256, read back from its log
        assert argv[argv.index("-c") + 1] == "256" and eng.report.pool_tokens == 256
        # the server's log at its default verbosity does not say -b: not read back, not checked
        assert eng.report.slots == 4 and eng.report.threads == 1 and eng.report.chunk_tokens is None
        assert eng.launch_line.startswith(str(shims["paths"]["llama-server"])) and "-np 4" in eng.launch_line
        r = complete(eng.url, eng.served_model)
        assert r.ok and r.output_tokens == 8
    assert eng.process.returncode() is not None


def test_a_buffer_over_the_training_context_is_read_back_whole(shims):
    """A -c over the model's training context (8,192) with -kvu: llama-server keeps the whole buffer
    and caps the slot context it logs and serves: the pool is the buffer (on the live server 256
    slots x 318 tokens, -c 81408, logged n_ctx_slot 8192: a near config failed its start on this)."""
    ad = llama(shims)
    cfg = {**CFG, "batch_cap": 256}
    p = build_pick("smollm2-135m", cfg, 1, 0.05, None, arch=get_model("smollm2-135m"), gpu=resolve_gpu(str(FAKE_CPU)),
                   weights="q4_1", gpus_per_node=1, max_request_tokens=318)
    with ad.running(p) as eng:
        argv = list(eng.plan.argv)
        ctx = int(argv[argv.index("-c") + 1])   # as many slots as this host's pool holds
        assert ctx > 8192 and eng.report.pool_tokens == ctx


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_vllm_and_sglang_go_through_the_same_path_with_their_real_command_lines(shims, engine):
    import sys
    binary = str(shims["paths"]["vllm"]) if engine == "vllm" else sys.executable
    ad = LocalAdapter(engine, binary=binary, model="HuggingFaceTB/SmolLM2-135M-Instruct", log_dir=shims["logs"])
    with ad.running(pick(dict(CFG, kv_dtype="bf16"), weights="bf16")) as eng:   # vLLM/SGLang load no GGUF
        argv = list(eng.plan.argv)
        if engine == "vllm":
            assert argv[1:3] == ["serve", "HuggingFaceTB/SmolLM2-135M-Instruct"]
            assert argv[argv.index("--max-num-seqs") + 1] == "4"
            assert argv[argv.index("--max-num-batched-tokens") + 1] == "128"
        else:
            assert argv[1:3] == ["-m", "sglang.launch_server"] and argv[argv.index("--max-running-requests") + 1] == "4"
            assert eng.report.slots == 4 and eng.report.chunk_tokens == 128
        assert eng.report.engine == engine and eng.report.pool_tokens
        assert eng.served_model == "HuggingFaceTB/SmolLM2-135M-Instruct"
        assert complete(eng.url, eng.served_model).ok


def test_an_engine_that_never_becomes_healthy_is_stopped_with_one_line(shims, monkeypatch):
    monkeypatch.setenv("KVTUNE_FAKE_FAULT", "never_healthy,spawn_child")
    ad = llama(shims, startup_timeout_s=1.5)
    with pytest.raises(EngineStartError, match=r"not healthy after 1.5 s .*log "):
        with ad.running(pick()):
            pass


def test_an_engine_that_exits_at_start_says_why(shims, monkeypatch):
    monkeypatch.setenv("KVTUNE_FAKE_FAULT", "exit_at_start")
    with pytest.raises(EngineStartError, match="exited with status 1 during start-up: .*failed to load model"):
        with llama(shims).running(pick()):
            pass


def test_stop_reaches_the_whole_group_even_when_the_engine_ignores_sigterm(shims, monkeypatch):
    monkeypatch.setenv("KVTUNE_FAKE_FAULT", "ignore_sigterm,spawn_child")
    monkeypatch.setattr(process_mod, "STOP_GRACE_S", 0.5)
    ad = llama(shims)
    with ad.running(pick()) as eng:
        eng.process.grace_s = 0.5
        pids = [int(x) for x in shims["pidfile"].read_text().split()]
        assert len(pids) == 2 and all(alive(p) for p in pids)
    assert_no_orphans(shims["pidfile"])


def test_a_crash_mid_run_is_reported_and_leaves_nothing(shims, monkeypatch):
    monkeypatch.setenv("KVTUNE_FAKE_FAULT", "crash_after:2")
    with pytest.raises(EngineCrashed, match="exited with status 3 during a run"):
        with llama(shims).running(pick()) as eng:
            complete(eng.url, eng.served_model)
            assert not complete(eng.url, eng.served_model).ok
            time.sleep(0.2)
            eng.check_alive()


def test_a_port_taken_by_another_server(shims):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(InputError, match=f"--port {port}: already in use"):
            with llama(shims, port=port).running(pick()):
                pass
        # kvtune's own choice taken between choosing and binding: it tries another port
        taken = iter([port])
        real = process_mod.free_port
        import kvtune.optimizer.adapters.base as base_mod
        orig = base_mod.free_port
        base_mod.free_port = lambda host="127.0.0.1": next(taken, None) or real(host)
        try:
            with llama(shims).running(pick()) as eng:
                assert not eng.url.endswith(f":{port}/v1") and complete(eng.url, eng.served_model).ok
        finally:
            base_mod.free_port = orig


def test_a_command_template_is_filled_per_config_and_checked(shims):
    tpl = (f"{shims['paths']['llama-server']} -m {shims['gguf']} -np {{batch_cap}} -c {{ctx_tokens}} -b {{chunk_tokens}} "
           f"-t {{threads}} -kvu --port {{port}}")
    ad = TemplateAdapter(tpl, engine="llamacpp", threads=1, log_dir=shims["logs"])
    with ad.running(pick()) as eng:
        assert eng.report.slots == 4 and "-np 4" in eng.launch_line
    wrong = TemplateAdapter(tpl.replace("{batch_cap}", "2"), engine="llamacpp", threads=1, log_dir=shims["logs"])
    with pytest.raises(EngineMismatch, match=r"slots 2 \(planned 4\)"):
        with wrong.running(pick()):
            pass
    with pytest.raises(InputError, match=r"unknown field \{slots\}"):
        TemplateAdapter("llama-server -np {slots} --port {port}", log_dir=shims["logs"])
    with pytest.raises(InputError, match=r"must place \{port\}"):
        TemplateAdapter("llama-server -np {batch_cap}", log_dir=shims["logs"])


def test_a_url_you_launched_measures_only_its_own_config(shims, monkeypatch):
    with llama(shims).running(pick()) as eng:
        ad = UrlAdapter(eng.url, ("smollm2-135m", "HuggingFaceTB/SmolLM2-135M-Instruct"))
        assert ad.engine == "llamacpp" and ad.report.slots == 4
        assert ad.why_not(pick()) is None
        assert "runs 4" in ad.why_not(pick(dict(CFG, batch_cap=8)))
        with pytest.raises(InputError, match="serves 'SmolLM2-135M-Instruct.Q4_1.gguf', not the workload's model qwen"):
            UrlAdapter(eng.url, ("qwen2.5-0.5b", "Qwen/Qwen2.5-0.5B-Instruct"))
    with pytest.raises(InputError, match="cannot reach the server: connection refused"):
        UrlAdapter(eng.url, ("smollm2-135m",))


def test_a_missing_binary_or_model_file_is_one_line(shims):
    with pytest.raises(InputError, match="--engine-bin /nonexistent/llama-server: no such executable"):
        LocalAdapter("llamacpp", binary="/nonexistent/llama-server", model=str(shims["gguf"]), log_dir=shims["logs"])
    with pytest.raises(InputError, match="--model-file /nonexistent.gguf: no such file"):
        LocalAdapter("llamacpp", binary=str(shims["paths"]["llama-server"]), model="/nonexistent.gguf",
                     log_dir=shims["logs"])


@pytest.mark.parametrize("served, names, ok", [
    ("SmolLM2-135M-Instruct.Q4_1.gguf", ("smollm2-135m",), True),
    ("/models/HuggingFaceTB/SmolLM2-135M-Instruct", ("smollm2-135m", "HuggingFaceTB/SmolLM2-135M-Instruct"), True),
    ("meta-llama/Llama-3.1-8B-Instruct", ("llama-3.1-8b", "meta-llama/Llama-3.1-8B-Instruct"), True),
    ("Qwen/Qwen2.5-0.5B-Instruct", ("smollm2-135m", "HuggingFaceTB/SmolLM2-135M-Instruct"), False),
])
def test_model_matches(served, names, ok):
    assert model_matches(served, names) is ok


@pytest.mark.parametrize("slots, want", [([{"id": 0, "is_processing": False}, {"id": 1, "is_processing": True}], True),
                                         ([{"id": 0, "is_processing": False}], False),
                                         ({"error": "slots endpoint disabled"}, None)])
def test_llama_servers_slots_say_whether_a_request_is_still_in_it(slots, want):
    """Before the next run the engine must be idle (adapters.base.wait_idle): llama-server's /slots
    says so per slot (``is_processing``); a server that does not list them cannot tell (None)."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from kvtune.optimizer.launch.llamacpp import LlamaCpp

    class Slots(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):  # noqa: N802
            body = json.dumps(slots).encode()
            self.send_response(200 if self.path == "/slots" else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Slots)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        assert LlamaCpp().busy(f"http://127.0.0.1:{srv.server_address[1]}") is want
    finally:
        srv.shutdown()
        srv.server_close()
