"""The load driver speaks to real endpoints (issue 33.7): a bearer key from --api-key or
$OPENAI_API_KEY (and never written down), /v1/chat/completions as well as /v1/completions, and
kept-alive connections, against the fake engine started with --api-key."""

from __future__ import annotations

import socket

import pytest
from click.testing import CliRunner

import fake_engine
from kvtune.optimizer import profile_run
from kvtune.optimizer.cli import main
from kvtune.optimizer.loadgen import OpenLoopPlan, run_open_loop
from kvtune.optimizer.profile_run import Endpoint
from kvtune.optimizer.workload import load_workload

KEY = "sk-kvtune-test-9f3c"


@pytest.fixture
def server(tmp_path, monkeypatch):
    """The fake llama-server with --api-key KEY: (url, setup paths)."""
    sh = fake_engine.setup(tmp_path, monkeypatch)
    with fake_engine.serving(sh["llama-server"], "-m", str(sh["gguf"]), "-np", "8", "-c", "4096", "-cb",
                             "--api-key", KEY) as url:
        yield url, sh


def _plan(sh, rate: float = 20.0, n: int = 30) -> OpenLoopPlan:
    return OpenLoopPlan.from_workload(load_workload(sh["workload"]), rate, n, 0, 3)


def test_without_the_key_the_server_refuses_and_the_error_says_how_to_give_it(server, tmp_path, monkeypatch):
    url, sh = server
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    out = tmp_path / "t.csv"
    r = CliRunner().invoke(main, ["profile", "open-loop", str(sh["workload"]), "--url", url, "--model", "m",
                                  "--rate", "5", "--requests", "10", "--warmup", "2", "-o", str(out)])
    assert r.exit_code == 2, r.output
    last = r.output.strip().splitlines()[-1]
    assert last.startswith("Error: ") and "HTTP 401" in last and "--api-key, or $OPENAI_API_KEY" in last
    assert not out.exists()
    r = CliRunner().invoke(main, ["profile", "open-loop", str(sh["workload"]), "--url", url, "--model", "m",
                                  "--rate", "5", "--requests", "10", "--warmup", "2", "-o", str(out),
                                  "--api-key", "wrong"])
    assert r.exit_code == 2 and "the API key was refused" in r.output


def test_the_key_from_the_environment_is_sent_and_written_nowhere(server, tmp_path, monkeypatch):
    url, sh = server
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    out = tmp_path / "t.csv"
    r = CliRunner().invoke(main, ["profile", "open-loop", str(sh["workload"]), "--url", url, "--model", "m",
                                  "--rate", "10", "--requests", "20", "--warmup", "2", "-o", str(out)])
    assert r.exit_code == 0, r.output
    written = [p for p in tmp_path.iterdir() if p.is_file() and p.suffix in (".csv", ".yaml", ".json")]
    assert out in written and len(written) >= 2   # the table and its per-request log
    assert all(KEY not in p.read_text() for p in written) and KEY not in r.output
    assert KEY not in repr(Endpoint(url, KEY))


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_both_apis_stream_timed_tokens(server, api):
    url, sh = server
    run = run_open_loop(Endpoint(url, KEY, api), "m", _plan(sh), timeout_s=30)
    assert run.complete and not run.failures, [r.error for r in run.failures]
    assert all(r.ttft_ms and r.ttft_ms > 0 and r.tpot_ms and r.tpot_ms > 0 for r in run.measured)
    assert all(r.output_tokens_server == r.output_tokens for r in run.measured)


def test_connections_are_kept_alive_across_requests(server, monkeypatch):
    url, sh = server
    opened = []
    real = profile_run._conn

    def counting(u: str, timeout_s: float):
        opened.append(u)
        return real(u, timeout_s)
    monkeypatch.setattr(profile_run, "_conn", counting)
    ep = Endpoint(url, KEY)
    plan = _plan(sh, rate=10.0, n=40)
    run = run_open_loop(ep, "m", plan, timeout_s=30)
    assert run.complete and not run.failures
    streamed = [u for u in opened if u == url]
    # at 10 req/s with ~0.2 s per request a handful are in flight at once: each needs a connection,
    # the rest reuse them (measured: 6-7 connections for 40 requests, 2026-12-06)
    assert 1 <= len(streamed) <= len(plan) // 2, len(streamed)


def test_a_stale_kept_alive_connection_is_retried_on_a_new_one(server):
    url, sh = server
    ep = Endpoint(url, KEY)
    payload = profile_run.completion_payload("m", "one two three", 4)
    assert profile_run.stream_completion(ep, payload, 10).ok
    assert len(ep._idle) == 1
    ep._idle[0].sock.close()   # as a server closing an idle connection leaves it
    ep._idle[0].sock = socket.socket()   # an unconnected socket: the send fails as on a closed peer
    r = profile_run.stream_completion(ep, payload, 10)
    assert r.ok, r.error


def test_an_unknown_api_is_one_clear_error():
    with pytest.raises(profile_run.InputError, match="--api 'embeddings': expected one of completions, chat"):
        Endpoint("http://127.0.0.1:1/v1", api="embeddings")
