"""A fake OpenAI-compatible serving engine for the tune loop's tests (standard library only).

It parses the real command lines kvtune emits for llama.cpp (``llama-server -m ... -np ... -c ...``),
vLLM (``vllm serve MODEL --max-num-seqs ...``) and SGLang (``python -m sglang.launch_server
--model-path ... --max-running-requests ...``): an unknown flag is refused as the engine would, so
the tests hold kvtune's launch lines to each engine's flags. It then serves ``/v1/completions``
(streamed or not), ``/v1/models``, ``/health`` and the engine's own introspection (llama.cpp
``/props``, ``/slots``, ``/tokenize`` and its start-up log lines; vLLM ``/version`` and
``/metrics``; SGLang ``/get_server_info``).

Latency follows a hidden cost function, different from kvtune's default model, so a tune loop must
calibrate to converge: continuous batching over ``slots`` sequences, each step carrying every
running sequence's next token plus prompt chunks up to the step's token budget, and taking

    step_s = (base_ms + seq_ms * decoding + prefill_ms_per_tok * prompt_tokens
              + ctx_us_per_tok * context_tokens / 1000) / 1000 * speed / threads ** 0.5

real seconds (slept). Tokens are whitespace-separated words. A request's first token comes at the
end of the step that finishes its prompt; a step waits for a full request's prompt + output room
in the KV pool before admitting it.

Environment knobs (so that shims and command templates pass them through):
  KVTUNE_FAKE_COST   JSON overriding ``DEFAULT_COST`` (base_ms, seq_ms, prefill_ms_per_tok,
                     ctx_us_per_tok, speed). Optional ``kv``: {CACHE_TYPE: {"ctx_scale": X, "seq_ms": Y,
                     "prefill_ms_per_tok": Z}} for a KV cache type the engine was started with (llama.cpp
                     ``-ctk``, vLLM/SGLang ``--kv-cache-dtype``): the context term is scaled by X and Y, Z
                     added to those terms (a quantized cache reads fewer bytes but (de)quantizes); a
                     type not named there (and the default, no ``kv``) costs as above.
  KVTUNE_FAKE_SPEED_FILE  a file holding a number read at every step: the speed multiplier (a
                     test changes it to make the machine "drift").
  KVTUNE_FAKE_TIMING_LOG  a file each streamed request appends one JSON line to: when it was
                     received and when its first and last text chunks were written (Unix time),
                     for bench/bench_driver.py to check the client's timestamps against.
  KVTUNE_FAKE_FAULT  crash_after:N (exit mid-run when the N-th completion arrives), never_healthy,
                     wrong_model, exit_at_start, ignore_sigterm, spawn_child (a worker process in
                     its group, as vLLM starts), load_s:S (unhealthy for S seconds first).

``write_shims(folder)`` writes ``llama-server``, ``vllm`` and a ``sglang`` package there that run
this file with the interpreter running the tests.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

DEFAULT_COST = {"base_ms": 6.0, "seq_ms": 2.5, "prefill_ms_per_tok": 0.8, "ctx_us_per_tok": 20.0, "speed": 1.0}
N_CTX_TRAIN = 8192        # SmolLM2-135M's training context: llama.cpp caps a slot's context there
CTX_PAD = 256             # llama.cpp pads n_ctx to a multiple of 256
FAKE_GPU_TOKENS = 200_000  # vLLM/SGLang: KV pool tokens at --gpu-memory-utilization 1.0 on the fake GPU


# ---- the command lines ---------------------------------------------------------------------------
def _parser(style: str) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog={"llamacpp": "llama-server", "vllm": "vllm", "sglang": "sglang",
                                       "toy": "toy-serve"}[style],
                                 allow_abbrev=False)
    ap.add_argument("--host", default="127.0.0.1")
    if style == "llamacpp":
        ap.add_argument("-m", dest="model", required=True)
        ap.add_argument("-np", dest="slots", type=int, default=4)
        ap.add_argument("-c", dest="ctx", type=int, default=4096)
        ap.add_argument("-t", dest="threads", type=int, default=os.cpu_count() or 1)
        ap.add_argument("-tb", dest="threads_batch", type=int, default=None)
        ap.add_argument("-b", dest="batch", type=int, default=2048)
        ap.add_argument("-ub", dest="ubatch", type=int, default=512)
        ap.add_argument("-ngl", dest="ngl", default="auto")
        ap.add_argument("-ctk", dest="cache_type_k", default="f16")
        ap.add_argument("-ctv", dest="cache_type_v", default="f16")
        for f in ("-kvu", "-cb", "--cache-prompt", "--no-cache-prompt"):
            ap.add_argument(f, action="store_true")
        ap.add_argument("--port", type=int, default=8080)
    elif style == "vllm":
        ap.add_argument("serve", choices=["serve"])
        ap.add_argument("model")
        ap.add_argument("--max-num-seqs", dest="slots", type=int, default=256)
        ap.add_argument("--max-num-batched-tokens", dest="batch", type=int, default=8192)
        ap.add_argument("--gpu-memory-utilization", dest="mem", type=float, default=0.9)
        ap.add_argument("--kv-cache-dtype", default="auto")
        ap.add_argument("--tensor-parallel-size", type=int, default=1)
        ap.add_argument("--max-model-len", dest="ctx", type=int, default=N_CTX_TRAIN)
        for f in ("--enable-chunked-prefill", "--enable-prefix-caching", "--no-enable-prefix-caching"):
            ap.add_argument(f, action="store_true")
        ap.add_argument("--port", type=int, default=8000)
    elif style == "toy":   # the shared engine suite's toy engine (tests/toy_home.py)
        ap.add_argument("--model", dest="model", required=True)
        ap.add_argument("--max-seqs", dest="slots", type=int, default=8)
        ap.add_argument("--step-tokens", dest="batch", type=int, default=2048)
        ap.add_argument("--kv-tokens", dest="kv_tokens", type=int, default=65536)
        ap.add_argument("--port", type=int, default=8000)
    else:
        ap.add_argument("--model-path", dest="model", required=True)
        ap.add_argument("--tp-size", type=int, default=1)
        ap.add_argument("--context-length", dest="ctx", type=int, default=N_CTX_TRAIN)
        ap.add_argument("--max-running-requests", dest="slots", type=int, default=256)
        ap.add_argument("--chunked-prefill-size", dest="batch", type=int, default=8192)
        ap.add_argument("--max-prefill-tokens", type=int, default=16384)
        ap.add_argument("--mem-fraction-static", dest="mem", type=float, default=0.9)
        ap.add_argument("--kv-cache-dtype", default="auto")
        for f in ("--enable-mixed-chunk", "--disable-radix-cache"):
            ap.add_argument(f, action="store_true")
        ap.add_argument("--port", type=int, default=30000)
    ap.add_argument("--api-key", default=None)   # all three engines: Authorization: Bearer on every route but /health
    return ap


# ---- the engine ----------------------------------------------------------------------------------
@dataclass
class _Req:
    prompt_tokens: int
    output_tokens: int
    tokens: "collections.deque[str | None]" = field(default_factory=collections.deque)
    event: threading.Event = field(default_factory=threading.Event)
    prefilled: int = 0
    generated: int = 0
    cancelled: bool = False      # its client left: dropped, as llama-server and vLLM drop it


class Engine:
    """Continuous batching over ``slots`` sequences with the hidden step cost."""

    def __init__(self, slots: int, batch_tokens: int, pool_tokens: int, threads: int, cost: dict,
                 speed_file: str | None, kv_type: str = ""):
        self.slots, self.batch_tokens, self.pool_tokens, self.threads = slots, batch_tokens, pool_tokens, threads
        self.kv_type = kv_type
        self.cost, self.speed_file = cost, speed_file
        self.waiting: collections.deque[_Req] = collections.deque()
        self.running: list[_Req] = []
        self.cv = threading.Condition()
        threading.Thread(target=self._loop, daemon=True).start()

    def submit(self, r: _Req) -> None:
        with self.cv:
            self.waiting.append(r)
            self.cv.notify()

    def _speed(self) -> float:
        s = float(self.cost.get("speed", 1.0))
        if self.speed_file:
            try:
                s *= float(Path(self.speed_file).read_text().strip() or 1.0)
            except (OSError, ValueError):
                pass
        return s

    def _step_s(self, decoding: int, prompt: int, context: int) -> float:
        c = self.cost
        kv = (c.get("kv") or {}).get(self.kv_type, {})   # KVTUNE_FAKE_COST's kv terms for this cache type
        ms = (c["base_ms"] + (c["seq_ms"] + kv.get("seq_ms", 0.0)) * decoding
              + (c["prefill_ms_per_tok"] + kv.get("prefill_ms_per_tok", 0.0)) * prompt
              + c["ctx_us_per_tok"] * kv.get("ctx_scale", 1.0) * context / 1e3)
        return ms / 1e3 * self._speed() / max(1, self.threads) ** 0.5

    def _admit(self) -> None:
        used = sum(r.prompt_tokens + r.output_tokens for r in self.running)
        self.running = [r for r in self.running if not r.cancelled]
        while self.waiting and self.waiting[0].cancelled:
            self.waiting.popleft()
        while self.waiting and len(self.running) < self.slots:
            r = self.waiting[0]
            if r.cancelled:
                self.waiting.popleft()
                continue
            if used + r.prompt_tokens + r.output_tokens > self.pool_tokens and self.running:
                break
            self.waiting.popleft()
            self.running.append(r)
            used += r.prompt_tokens + r.output_tokens

    def _loop(self) -> None:
        while True:
            with self.cv:
                while not self.waiting and not self.running:
                    self.cv.wait()
                self._admit()
                decoding = [r for r in self.running if r.prefilled >= r.prompt_tokens]
                budget = max(0, self.batch_tokens - len(decoding))
                chunks: list[tuple[_Req, int]] = []
                for r in self.running:
                    if r.prefilled < r.prompt_tokens and budget > 0:
                        n = min(budget, r.prompt_tokens - r.prefilled)
                        chunks.append((r, n))
                        budget -= n
                context = sum(r.prefilled + r.generated for r in self.running)
            time.sleep(self._step_s(len(decoding), sum(n for _, n in chunks), context))
            with self.cv:
                for r, n in chunks:
                    r.prefilled += n
                    if r.prefilled >= r.prompt_tokens:
                        self._emit(r)          # the step that finishes the prompt yields the first token
                for r in decoding:
                    self._emit(r)
                self.running = [r for r in self.running if r.generated < r.output_tokens]

    @staticmethod
    def _emit(r: _Req) -> None:
        r.generated += 1
        r.tokens.append(" tok")
        if r.generated >= r.output_tokens:
            r.tokens.append(None)
        r.event.set()


# ---- HTTP ----------------------------------------------------------------------------------------
class _State:
    style = "llamacpp"
    model = ""
    served = ""
    args: argparse.Namespace
    engine: Engine
    pool = 0
    ready_at = 0.0
    fault = ""
    completions = 0
    lock = threading.Lock()


S = _State()


def _fault(name: str) -> str | None:
    for part in S.fault.split(","):
        k, _, v = part.partition(":")
        if k == name:
            return v or "1"
    return None


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # TCP_NODELAY, as the real servers stream: llama.cpp builds cpp-httplib with CPPHTTPLIB_TCP_NODELAY=1
    # (vendor/cpp-httplib/CMakeLists.txt), uvicorn's asyncio sockets set it. Without it each small SSE
    # chunk waited for the client's delayed ACK: the driver saw tokens ~40 ms after they were written
    # (bench/bench_driver.py, measured 2026-12-06: first token p50 40.2 ms late at 50 req/s).
    disable_nagle_algorithm = True

    def log_message(self, *a):   # quiet
        pass

    def _send(self, code: int, body, ctype: str = "application/json") -> None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def version_string(self) -> str:
        return "llama.cpp" if S.style == "llamacpp" else "uvicorn"

    def _authorized(self, path: str) -> bool:
        """llama.cpp's --api-key (tools/server/server-http.cpp): every route but /health and /v1/health
        wants ``Authorization: Bearer KEY``; 401 otherwise."""
        key = getattr(S.args, "api_key", None)
        if not key or path in ("/health", "/v1/health") or self.headers.get("Authorization") == f"Bearer {key}":
            return True
        self._send(401, {"error": {"code": 401, "message": "Invalid API Key", "type": "authentication_error"}})
        return False

    def do_GET(self) -> None:  # noqa: N802
        path = self.path.split("?")[0]
        if not self._authorized(path):
            return
        healthy = time.monotonic() >= S.ready_at and _fault("never_healthy") is None
        if path == "/health":
            if healthy:
                self._send(200, {"status": "ok"})
            else:
                self._send(503, {"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}})
            return
        if path == "/v1/models":
            self._send(200, {"object": "list", "data": [{"id": S.served, "object": "model", "owned_by": S.style}]})
            return
        a = S.args
        if S.style == "llamacpp" and path == "/props":
            n_ctx_slot = min(S.pool if a.kvu else S.pool // a.slots, N_CTX_TRAIN)
            self._send(200, {"default_generation_settings": {"n_ctx": n_ctx_slot}, "total_slots": a.slots,
                             "model_path": a.model, "model_alias": S.served, "build_info": "b0-fake"})
        elif S.style == "llamacpp" and path == "/slots":
            n_ctx_slot = min(S.pool if a.kvu else S.pool // a.slots, N_CTX_TRAIN)
            self._send(200, [{"id": i, "n_ctx": n_ctx_slot, "is_processing": False} for i in range(a.slots)])
        elif S.style == "vllm" and path == "/version":
            self._send(200, {"version": "0.33.0+fake"})
        elif S.style == "vllm" and path == "/metrics":
            text = (f'vllm:cache_config_info{{block_size="16",cache_dtype="{a.kv_cache_dtype}",'
                    f'num_gpu_blocks="{S.pool // 16}"}} 1.0\n')
            self._send(200, text.encode(), "text/plain")
        elif S.style == "toy" and path == "/toy/config":
            self._send(200, {"version": "1.0+fake", "max_seqs": a.slots, "step_tokens": a.batch, "kv_tokens": S.pool})
        elif S.style == "sglang" and path == "/get_server_info":
            self._send(200, {"version": "0.5.23+fake", "model_path": a.model, "max_running_requests": a.slots,
                             "chunked_prefill_size": a.batch, "max_total_num_tokens": S.pool})
        else:
            self._send(404, {"error": {"code": 404, "message": f"no route {path}"}})

    def do_POST(self) -> None:  # noqa: N802
        self.received_unix = time.time()   # the request line and headers are read: the request is in
        n = int(self.headers.get("Content-Length") or 0)
        try:
            body = json.loads(self.rfile.read(n) or b"{}")
        except ValueError:
            self._send(400, {"error": {"message": "bad json"}})
            return
        path = self.path.split("?")[0]
        if not self._authorized(path):
            return
        if path == "/tokenize":
            text = body.get("content", body.get("prompt", ""))
            toks = list(range(len(str(text).split())))
            self._send(200, {"tokens": toks, "count": len(toks)})
        elif path == "/v1/completions":
            self._completion(body)
        elif path == "/v1/chat/completions":   # the prompt is the messages' text (no chat template)
            msgs = body.get("messages") or []
            self._completion({**body, "prompt": " ".join(str(m.get("content", "")) for m in msgs)}, chat=True)
        else:
            self._send(404, {"error": {"code": 404, "message": f"no route {path}"}})

    def _completion(self, body: dict, chat: bool = False) -> None:
        with S.lock:
            S.completions += 1
            k = S.completions
        crash = _fault("crash_after")
        if crash is not None and k >= int(crash):
            os._exit(3)   # the engine dies mid-run, as an out-of-memory kill would
        prompt = body.get("prompt", "")
        p = len(prompt.split()) if isinstance(prompt, str) else len(prompt)
        out = int(body.get("max_tokens") or 16)
        if p + out > min(S.pool, N_CTX_TRAIN, getattr(S.args, "ctx", N_CTX_TRAIN) if S.style != "llamacpp" else N_CTX_TRAIN):
            self._send(400, {"error": {"code": 400, "message": f"request ({p + out} tokens) exceeds the context"}})
            return
        r = _Req(max(1, p), max(1, out))
        S.engine.submit(r)
        if not body.get("stream"):
            while True:
                if not self._wait(r):
                    return
                r.event.clear()
                if r.tokens and r.tokens[-1] is None:
                    break
            text = "".join(t for t in r.tokens if t)
            self._send(200, {"choices": [{"text": text, "index": 0, "finish_reason": "length"}],
                             "usage": {"prompt_tokens": p, "completion_tokens": out, "total_tokens": p + out}})
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        sent_unix: list[float] = []   # when each text chunk was written (KVTUNE_FAKE_TIMING_LOG)
        try:
            while True:
                if not self._wait(r):
                    return
                r.event.clear()
                done = False
                while r.tokens:
                    t = r.tokens.popleft()
                    if t is None:
                        done = True
                        break
                    self._chunk({"object": "chat.completion.chunk", "model": S.served,
                                 "choices": [{"delta": {"content": t}, "index": 0, "finish_reason": None}]} if chat
                                else {"object": "text_completion", "model": S.served,
                                      "choices": [{"text": t, "index": 0, "finish_reason": None}]})
                    sent_unix.append(time.time())
                if done:
                    break
            self._chunk({"object": "text_completion", "model": S.served,
                         "choices": [{"text": "", "index": 0, "finish_reason": "length"}],
                         "usage": {"prompt_tokens": p, "completion_tokens": out, "total_tokens": p + out}})
            self._raw(b"data: [DONE]\n\n")
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            return
        timing_log = os.environ.get("KVTUNE_FAKE_TIMING_LOG")
        if timing_log and sent_unix:   # the server's side of every request, to check a client's clock
            with S.lock, open(timing_log, "a") as f:
                f.write(json.dumps({"received_unix": self.received_unix, "first_unix": sent_unix[0],
                                    "last_unix": sent_unix[-1], "prompt_words": p, "chunks": len(sent_unix)}) + "\n")

    def _wait(self, r: _Req) -> bool:
        """Wait for the request's next token; False (and the request dropped) if its client left."""
        while not r.event.wait(0.1):
            if self._client_gone():
                r.cancelled = True
                return False
        return True

    def _client_gone(self) -> bool:
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            return bool(readable) and self.connection.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True

    def _chunk(self, d: dict) -> None:
        self._raw(b"data: " + json.dumps(d).encode() + b"\n\n")

    def _raw(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()


def main(argv: list[str], style: str) -> int:
    S.fault = os.environ.get("KVTUNE_FAKE_FAULT", "")
    ap = _parser(style)
    a = ap.parse_args(argv)          # an unknown flag: the usage and exit 2, as the engines do
    if _fault("exit_at_start") is not None:
        print("error: failed to load model (fake fault exit_at_start)", flush=True)
        return 1
    if style == "llamacpp" and not Path(a.model).is_file():
        print(f"llama_model_load: error loading model: failed to open {a.model}", flush=True)
        return 1
    pidfile = os.environ.get("KVTUNE_FAKE_PIDFILE")
    if pidfile:   # the tests check every process they caused is gone
        with open(pidfile, "a") as f:
            f.write(f"{os.getpid()}\n")
    if _fault("ignore_sigterm") is not None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if _fault("spawn_child") is not None:   # a worker in the engine's process group
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
        if pidfile:
            with open(pidfile, "a") as f:
                f.write(f"{child.pid}\n")
    cost = dict(DEFAULT_COST, **json.loads(os.environ.get("KVTUNE_FAKE_COST", "{}")))
    S.style, S.args, S.model = style, a, a.model
    threads = 1
    if style == "llamacpp":
        S.pool = -(-a.ctx // CTX_PAD) * CTX_PAD
        batch = min(a.batch, S.pool)
        threads = a.threads
        S.served = Path(a.model).name
        # what llama-server 0c1e57098 logs at its default verbosity (common/common.cpp, server-context.cpp)
        print(f"0.01.467.314 I cmn          init: llama threadpool init, n_threads = {a.threads}", flush=True)
        if a.threads_batch and a.threads_batch != a.threads:
            print(f"0.01.467.315 I cmn          init: llama threadpool init, n_threads = {a.threads_batch}", flush=True)
        n_ctx_seq = S.pool if a.kvu else S.pool // a.slots
        if n_ctx_seq > N_CTX_TRAIN:   # src/llama-context.cpp, then the server caps the slot (server-context.cpp)
            print(f"0.00.188.421 W llama_context: n_ctx_seq ({n_ctx_seq}) > n_ctx_train ({N_CTX_TRAIN}) -- possible "
                  f"training context overflow", flush=True)
        n_ctx_slot = min(n_ctx_seq, N_CTX_TRAIN)
        print(f"0.01.745.963 I srv    load_model: initializing, n_slots = {a.slots}, n_ctx_slot = {n_ctx_slot}, "
              f"kv_unified = '{'true' if a.kvu else 'false'}'", flush=True)
    elif style == "toy":
        S.pool, batch, S.served = a.kv_tokens, a.batch, a.model
    else:
        S.pool = int(a.mem * FAKE_GPU_TOKENS)
        batch = a.batch
        S.served = a.model
    if _fault("wrong_model") is not None:
        S.served = "Qwen/Qwen2.5-0.5B-Instruct"
    kv_type = a.cache_type_k if style == "llamacpp" else getattr(a, "kv_cache_dtype", "")
    S.engine = Engine(a.slots, batch, S.pool, threads, cost, os.environ.get("KVTUNE_FAKE_SPEED_FILE"), kv_type)
    load = _fault("load_s")
    S.ready_at = time.monotonic() + (float(load) if load else 0.0)
    try:
        srv = ThreadingHTTPServer((a.host, a.port), Handler)
    except OSError as exc:
        print(f"couldn't bind HTTP server socket, hostname: {a.host}, port: {a.port}: {exc}", flush=True)
        return 1
    srv.daemon_threads = True
    print(f"main: server is listening on http://{a.host}:{a.port}", flush=True)
    srv.serve_forever()
    return 0


def write_shims(folder: Path) -> dict[str, Path]:
    """``llama-server``, ``vllm`` and ``toy-serve`` executables and an importable ``sglang.launch_server`` in
    ``folder``, each running this fake engine under the interpreter running the tests. Put
    ``folder`` first on PATH (and on PYTHONPATH for SGLang's ``python -m``)."""
    folder.mkdir(parents=True, exist_ok=True)
    me = Path(__file__).resolve()
    run = (f"import sys\nsys.path.insert(0, {str(me.parent)!r})\nimport fake_engine\n"
           "sys.exit(fake_engine.main(sys.argv[1:], {style!r}))\n")
    out = {}
    for name, style in (("llama-server", "llamacpp"), ("vllm", "vllm"), ("toy-serve", "toy")):
        p = folder / name
        p.write_text(f"#!{sys.executable}\n" + run.format(style=style))
        p.chmod(0o755)
        out[name] = p
    pkg = folder / "sglang"
    pkg.mkdir(exist_ok=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "launch_server.py").write_text(run.format(style="sglang"))
    out["sglang"] = pkg
    return out


WORKLOAD = """\
model: smollm2-135m
weights: q4_1
engine: llamacpp
hardware: {{gpu: {hw}, gpus_per_node: 1, usd_per_gpu_hour: 0.05, max_nodes: 1}}
workload:
  rate_req_s: 5
  classes: [{{name: chat, share: 1.0, input_tokens: {{dist: uniform, min: 24, max: 40}}, output_tokens: 16}}]
slo: {{ttft_ms: 300, tpot_ms: 30, attainment: 0.9}}
objective: max_goodput
search: {{batch_cap: [1, 8], chunk_tokens: [64, 256], trials: 8}}
"""


def setup(tmp: Path, monkeypatch) -> dict[str, Path]:
    """For a test: the shims, a GGUF file to name, the pid file every fake process is written to
    (``KVTUNE_FAKE_PIDFILE``), the fake machine's hardware file and a small workload on it."""
    paths = write_shims(tmp / "shims")
    pidfile = tmp / "pids"
    monkeypatch.setenv("KVTUNE_FAKE_PIDFILE", str(pidfile))
    monkeypatch.setenv("PYTHONPATH", str(tmp / "shims") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    gguf = tmp / "SmolLM2-135M-Instruct.Q4_1.gguf"
    gguf.write_bytes(b"GGUF fake")
    hw = Path(__file__).resolve().parent / "data" / "fake-cpu.yaml"
    wl = tmp / "fake.yaml"
    wl.write_text(WORKLOAD.format(hw=hw))
    return {**paths, "gguf": gguf, "pidfile": pidfile, "workload": wl, "hardware": hw, "logs": tmp / "logs"}


@contextlib.contextmanager
def serving(shim: Path, *args: str, env: dict[str, str] | None = None, wait_s: float = 30.0):
    """Start the fake llama-server ``shim`` on a free port with ``args`` (its flags after -m/--port) and
    wait for ``/health``; yields the base URL (``http://127.0.0.1:PORT/v1``); stopped on leaving."""
    import http.client
    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        port = sk.getsockname()[1]
    proc = subprocess.Popen([str(shim), "--port", str(port), *args], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        t0 = time.monotonic()
        while True:
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
                c.request("GET", "/health")
                if c.getresponse().status == 200:
                    break
            except (OSError, http.client.HTTPException):
                pass
            if proc.poll() is not None or time.monotonic() - t0 > wait_s:
                raise RuntimeError(f"the fake engine did not start (exit {proc.poll()})")
            time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return True


def left_behind(pidfile: Path, wait_s: float = 5.0) -> list[int]:
    """The fake processes written to ``pidfile`` still running after ``wait_s``."""
    pids = [int(x) for x in pidfile.read_text().split()] if pidfile.exists() else []
    deadline = time.monotonic() + wait_s
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [p for p in pids if alive(p)]


if __name__ == "__main__":
    sys.exit(main(sys.argv[2:], sys.argv[1]))
