"""Measure request-level profile rows from a live OpenAI-compatible server (``kvtune profile run``).

For each (concurrency C, input length, output length) point: C client threads run a closed loop
(each sends its next request when the last one finishes) over ``requests_per_point`` streaming
``/v1/completions`` requests. Each request gets a different synthetic prompt of the requested
token length (so no prefix is shared), a fixed output length (``max_tokens`` + ``ignore_eos``, and
``min_tokens`` for vLLM), and ``cache_prompt: false`` for llama.cpp. Per request we record the
time to the first streamed token and the time of the last one; TPOT = (last - first) / (output
tokens - 1), as vLLM's benchmark defines it. The prompt and output lengths written to the table
are the ones the server reports (``usage``, or llama.cpp's ``timings``), not the ones asked for.
The KV pool the server reports (SGLang's ``max_total_num_tokens`` in ``/get_server_info``, vLLM's
``vllm:cache_config_info`` in ``/metrics``, llama.cpp's slots x per-slot context) goes in every
row's ``kv_pool_tokens``, so a fit simulates the pool the engine really had. llama.cpp's settings
map onto kvtune's: its slots (``-np``, ``/props`` ``total_slots`` or the length of ``/slots``) are
the batch cap (``batch_cap``), its context (``-c``; ``/props``
``default_generation_settings.n_ctx`` is per slot, tools/server/server-context.cpp ``get_props``)
times the slots is the pool, and its logical batch (``-b``, the most tokens one step takes, which
the server does not report) is the chunk budget (``chunk_tokens``, from ``--chunk-tokens``).

Standard library only (``http.client`` + threads). Prompts come from ``numpy.random.default_rng``
so a seed gives the same prompts; timings are measurements and vary run to run.
"""

from __future__ import annotations

import http.client
import json
import math
import os
import queue
import re
import socket
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Callable

import numpy as np

from kvtune.costmodel.errors import InputError, KvtuneError
from kvtune.costmodel.profile_table import ProfileRow

from .importers import Metadata, latency_summary

__all__ = ["Endpoint", "API_PATHS", "API_KEY_ENV", "RunSpec", "RequestResult", "PointResult", "ServerInfo", "probe_server", "make_prompt", "fit_prompt",
           "count_tokens", "server_root", "run_profile", "LoadRecord", "LoadSampler", "load_now", "stream_completion", "completion_payload", "summarize_point"]

# Short, common English words: most BPE vocabularies hold " word" as one token, so N words are
# close to N tokens; when the server has a /tokenize endpoint we trim or pad to the exact count.
_WORDS = ("the of and to in is was for on as with by at from his an were are which this be has "
          "had one not but have its all new more also two first after time can who they been "
          "other year most only over when into there some would where city may such these many "
          "made used state world then school three part both years under her between during "
          "well war people found while area them high known early same each work called around "
          "since water house small just life west south north east group great game began power "
          "line name set age long end left land old team way day play came film book music home "
          "road river light king field point order form case place food green blue red black "
          "white gold stone wood glass paper cloud rain snow wind fire sun moon star tree bird "
          "fish horse dog cat ship train car door wall room table chair bread milk salt sugar").split()


@dataclass(frozen=True)
class RunSpec:
    url: str                          # base URL ending in /v1
    model: str                        # sent as "model" and written to the table
    concurrencies: tuple[int, ...]
    input_tokens: tuple[int, ...]
    output_tokens: tuple[int, ...]
    requests_per_point: int = 16
    seed: int = 0
    timeout_s: float = 600.0
    warmup_requests: int = 1
    chunk_tokens: int | None = None   # the engine's per-step token budget, when the server does not report it
    threads: int | None = None        # the engine's CPU threads (llama.cpp -t), recorded in every row
    api_key: str | None = field(default=None, repr=False)   # Authorization: Bearer (never written anywhere)
    api: str = "completions"          # completions | chat (/v1/chat/completions)

    def __post_init__(self):
        u = urllib.parse.urlsplit(self.url)
        try:
            u.port  # noqa: B018  # urllib checks the port's range only when asked
        except ValueError as exc:
            raise InputError(f"--url {self.url!r}: {exc}") from None
        if u.scheme not in ("http", "https") or not u.hostname:
            raise InputError(f"--url {self.url!r}: expected http://HOST:PORT/v1")
        for name, vals in (("concurrency", self.concurrencies), ("isl", self.input_tokens),
                           ("osl", self.output_tokens)):
            if not vals or any((not isinstance(v, int)) or v < 1 for v in vals):
                raise InputError(f"--{name} {vals!r}: expected whole numbers >= 1")
        if self.requests_per_point < 1:
            raise InputError(f"--requests-per-point {self.requests_per_point}: must be >= 1")
        if not (self.timeout_s > 0):
            raise InputError(f"--timeout-s {self.timeout_s}: must be > 0")
        if self.warmup_requests < 0:
            raise InputError(f"--warmup {self.warmup_requests}: must be >= 0")
        if self.chunk_tokens is not None and (not isinstance(self.chunk_tokens, int) or self.chunk_tokens < 1):
            raise InputError(f"--chunk-tokens {self.chunk_tokens!r}: expected a whole number >= 1")
        if self.threads is not None and (not isinstance(self.threads, int) or self.threads < 1):
            raise InputError(f"--threads {self.threads!r}: expected a whole number >= 1")
        self.endpoint()   # the API checked where it is used

    def endpoint(self) -> "Endpoint":
        return Endpoint(self.url, self.api_key, self.api)


@dataclass(frozen=True)
class ServerInfo:
    engine: str = ""
    engine_version: str = ""
    can_tokenize: bool = False
    kv_pool_tokens: int | None = None   # the KV pool the server reports, tokens (None: it does not say)
    batch_cap: int | None = None        # sequences it runs at once, where it says (llama.cpp: its slots)
    chunk_tokens: int | None = None     # most tokens one step takes, where it says (llama.cpp -b: it does not)


@dataclass(frozen=True)
class RequestResult:
    ok: bool
    ttft_s: float = 0.0
    last_token_s: float = 0.0
    chunks: int = 0                  # streamed chunks that carried text
    output_tokens: int | None = None  # from the server (usage.completion_tokens / timings.predicted_n)
    prompt_tokens: int | None = None  # from the server (usage.prompt_tokens / timings.prompt_n)
    error: str = ""
    sent_s: float = 0.0              # time.perf_counter() when the request was sent
    cached_tokens: int | None = None  # prompt tokens the server took from its cache, where it says

    @property
    def n_out(self) -> int:
        return self.output_tokens if self.output_tokens else self.chunks

    @property
    def tpot_s(self) -> float | None:
        return (self.last_token_s - self.ttft_s) / (self.n_out - 1) if self.ok and self.n_out > 1 else None


@dataclass(frozen=True)
class PointResult:
    concurrency: int
    isl: int
    osl: int
    duration_s: float
    results: tuple[RequestResult, ...] = field(repr=False)
    load: LoadRecord | None = None   # the machine's load while the point ran

    @property
    def failures(self) -> list[RequestResult]:
        return [r for r in self.results if not r.ok]


# ---------------------------------------------------------------------------------------------
# Machine load

def load_now() -> float:
    """The 1-minute load average (``os.getloadavg``; NaN where the platform has none)."""
    try:
        return float(os.getloadavg()[0])
    except (OSError, AttributeError):
        return math.nan


@dataclass(frozen=True)
class LoadRecord:
    """The machine's 1-minute load average around a run. It counts every runnable thread,
    the engine under test and this driver included."""

    before_1m: float
    after_1m: float
    samples_1m: tuple[float, ...] = ()   # every ``sample_s`` during the run
    sample_s: float = 1.0
    cpus: int = 0

    @property
    def mean_1m(self) -> float:
        vals = [v for v in (self.before_1m, *self.samples_1m, self.after_1m) if math.isfinite(v)]
        return float(np.mean(vals)) if vals else math.nan

    @property
    def max_1m(self) -> float:
        vals = [v for v in (self.before_1m, *self.samples_1m, self.after_1m) if math.isfinite(v)]
        return float(max(vals)) if vals else math.nan


class LoadSampler:
    """Samples ``load_now`` every ``every_s`` in a thread while in its ``with`` block."""

    def __init__(self, every_s: float):
        self.every_s = every_s
        self.samples: list[float] = []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True, name="kvtune-load")

    def _loop(self) -> None:
        while not self.done.wait(self.every_s):
            self.samples.append(load_now())

    def __enter__(self):
        self.before = load_now()
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.done.set()
        self.thread.join()

    def record(self) -> LoadRecord:
        return LoadRecord(self.before, load_now(), tuple(self.samples), self.every_s, os.cpu_count() or 0)


# ---------------------------------------------------------------------------------------------
# HTTP

def _split(url: str) -> tuple[str, str, int, str]:
    u = urllib.parse.urlsplit(url)
    if not u.hostname:  # RunSpec checks the URL it is given; this guards the public probe_server
        raise InputError(f"--url {url!r}: expected http://HOST:PORT/v1")
    port = u.port or (443 if u.scheme == "https" else 80)
    return u.scheme, u.hostname, port, u.path.rstrip("/")


def _conn(url: str, timeout_s: float) -> tuple[http.client.HTTPConnection, str]:
    scheme, host, port, path = _split(url)
    cls = http.client.HTTPSConnection if scheme == "https" else http.client.HTTPConnection
    return cls(host, port, timeout=timeout_s), path


# The OpenAI-compatible APIs the load speaks, and their paths under the base URL.
API_PATHS = {"completions": "/completions", "chat": "/chat/completions"}
API_KEY_ENV = "OPENAI_API_KEY"   # the variable OpenAI's own clients read the key from


@dataclass(frozen=True, eq=False)
class Endpoint:
    """An OpenAI-compatible server as the load sees it: its base URL (ending in ``/v1``), the bearer
    key it wants (``Authorization: Bearer``; None: none: llama.cpp's ``--api-key``, vLLM's and SGLang's
    ``--api-key``, any gateway), and which API the requests use (``completions`` or ``chat``). It
    keeps finished connections open for the next request (HTTP/1.1 keep-alive): at tens of requests
    per second a TCP connect per request is time the engine never spent. The key is never written
    anywhere (``repr`` hides it)."""

    url: str
    api_key: str | None = field(default=None, repr=False)
    api: str = "completions"
    _idle: list = field(default_factory=list, repr=False, compare=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def __post_init__(self):
        if self.api not in API_PATHS:
            raise InputError(f"--api {self.api!r}: expected one of {', '.join(API_PATHS)}")

    @classmethod
    def of(cls, url: "str | Endpoint") -> "Endpoint":
        return url if isinstance(url, Endpoint) else cls(url)

    def root(self) -> "Endpoint":
        """The server root with the same key: llama.cpp's /props and /tokenize, vLLM's /version."""
        return Endpoint(server_root(self.url), self.api_key, self.api)

    def headers(self, json_body: bool) -> dict[str, str]:
        h = {"Content-Type": "application/json"} if json_body else {}
        if self.api_key:
            h["Authorization"] = f"Bearer {self.api_key}"
        return h

    def connection(self, timeout_s: float) -> tuple[http.client.HTTPConnection, str, bool]:
        """(connection, base path, reused): an idle kept-alive one where there is, else a new one."""
        with self._lock:
            c = self._idle.pop() if self._idle else None
        if c is not None:
            c.timeout = timeout_s
            if c.sock is not None:
                c.sock.settimeout(timeout_s)
            return c, _split(self.url)[3], True
        c, base = _conn(self.url, timeout_s)
        return c, base, False

    def release(self, c: http.client.HTTPConnection, reusable: bool) -> None:
        if reusable:
            with self._lock:
                self._idle.append(c)
        else:
            c.close()

    def close(self) -> None:
        with self._lock:
            idle, self._idle[:] = list(self._idle), []
        for c in idle:
            c.close()


def refused(api_key: str | None) -> str:
    """Why a server answered 401/403: no key given, or the one given refused."""
    return "the API key was refused" if api_key else f"it wants an API key (--api-key, or ${API_KEY_ENV})"


def server_root(url: "str | Endpoint") -> str:
    """The server root: llama.cpp's /props and /tokenize and vLLM's /version live outside /v1."""
    scheme, host, port, path = _split(url.url if isinstance(url, Endpoint) else url)
    if path.endswith("/v1"):
        path = path[:-3]
    return f"{scheme}://{host}:{port}{path}"


def _request_json(url: "str | Endpoint", method: str, path: str, body: dict | None, timeout_s: float):
    ep = Endpoint.of(url)
    c, base = _conn(ep.url, timeout_s)
    try:
        c.request(method, base + path, json.dumps(body) if body is not None else None, ep.headers(body is not None))
        r = c.getresponse()
        data = r.read()
        return r.status, dict(r.getheaders()), data
    finally:
        c.close()


def probe_server(url: "str | Endpoint", timeout_s: float = 10.0) -> ServerInfo:
    """Check the server answers ``GET {url}/models``; find its engine and version where it says.

    llama.cpp: ``Server: llama.cpp`` header, ``GET /props`` -> ``build_info``; vLLM: ``GET
    /version`` -> ``version``; SGLang: ``GET /get_server_info`` -> ``version``. Unreachable ->
    ``InputError``.
    """
    ep = Endpoint.of(url)
    url = ep.url
    try:
        status, headers, _ = _request_json(ep, "GET", "/models", None, timeout_s)
    except (OSError, http.client.HTTPException) as exc:
        raise InputError(f"cannot reach server at {url}: {_reason(exc)}") from None
    if status in (401, 403):
        raise InputError(f"server at {url} answered GET /models with HTTP {status}: {refused(ep.api_key)}")
    if status >= 400:
        raise InputError(f"server at {url} answered GET /models with HTTP {status}")
    engine, version = "", ""
    root = ep.root()
    server_hdr = {k.lower(): v for k, v in headers.items()}.get("server", "")
    probes = [("/props", "build_info", "llama.cpp"), ("/version", "version", "vllm"),
              ("/get_server_info", "version", "sglang")]
    if "llama.cpp" in server_hdr:
        engine = "llama.cpp"
        probes = probes[:1]
    pool = cap = chunk = None
    for path, key, name in probes:
        try:
            st, _, data = _request_json(root, "GET", path, None, timeout_s)
            d = json.loads(data) if st == 200 else None
        except (OSError, http.client.HTTPException, ValueError):
            continue
        if isinstance(d, dict) and isinstance(d.get(key), str):
            engine, version = engine or name, d[key]
            if name == "sglang":
                pool = _whole(d.get("max_total_num_tokens"))
            if name == "llama.cpp":
                cap, pool, chunk = _llamacpp_settings(root, d, timeout_s)
            break
    if engine == "llama.cpp" and cap is None:
        cap, pool, chunk = _llamacpp_settings(root, {}, timeout_s)
    if engine == "vllm":
        pool = _vllm_pool_tokens(root, timeout_s)
    can_tok = count_tokens(root, "hello world", timeout_s) is not None
    return ServerInfo(engine, version, can_tok, pool, cap, chunk)


def _llamacpp_settings(root: "str | Endpoint", props: dict, timeout_s: float) -> tuple[int | None, int | None, int | None]:
    """(slots, pool tokens, batch tokens) of a llama.cpp server: ``/props`` ``total_slots`` and
    ``default_generation_settings.n_ctx`` (per slot), else ``/slots`` (one entry per slot, each with
    its ``n_ctx``); ``n_batch`` only if some field reports it. None where the server does not say."""
    settings = props.get("default_generation_settings")
    gen: dict = settings if isinstance(settings, dict) else {}
    slots, n_ctx = _whole(props.get("total_slots")), _whole(gen.get("n_ctx"))
    n_batch = _whole(props.get("n_batch")) or _whole(gen.get("n_batch"))
    pool = slots * n_ctx if slots and n_ctx else None
    if pool is None:
        try:
            st, _, data = _request_json(root, "GET", "/slots", None, timeout_s)
            lst = json.loads(data) if st == 200 else None
        except (OSError, http.client.HTTPException, ValueError):
            lst = None
        if isinstance(lst, list) and lst and all(isinstance(x, dict) for x in lst):
            ctxs = [c for c in (_whole(x.get("n_ctx")) for x in lst) if c is not None]
            slots = slots or len(lst)
            if len(ctxs) == len(lst):  # every slot says its context
                pool = sum(ctxs) if len(lst) == slots else slots * ctxs[0]
            n_batch = n_batch or _whole(lst[0].get("n_batch"))
    return slots, pool, n_batch


def _whole(v) -> int | None:
    """A positive whole number from a reported value (int or numeric string), else None."""
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return int(f) if f >= 1 and f == int(f) else None


def _vllm_pool_tokens(root: "str | Endpoint", timeout_s: float) -> int | None:
    """vLLM's KV pool from ``/metrics``: the ``vllm:cache_config_info`` labels, ``kv_cache_size_tokens``
    where present, else ``num_gpu_blocks`` x ``block_size``; None if the server does not say."""
    try:
        st, _, data = _request_json(root, "GET", "/metrics", None, timeout_s)
    except (OSError, http.client.HTTPException):
        return None
    if st != 200:
        return None
    m = re.search(r"^vllm:cache_config_info\{([^}]*)\}", data.decode("utf-8", "replace"), re.M)
    if not m:
        return None
    labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
    tokens = _whole(labels.get("kv_cache_size_tokens"))
    if tokens:
        return tokens
    blocks, size = _whole(labels.get("num_gpu_blocks")), _whole(labels.get("block_size"))
    return blocks * size if blocks and size else None


def _reason(exc: BaseException) -> str:
    if isinstance(exc, socket.timeout):
        return "timed out"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    return getattr(exc, "strerror", None) or str(exc) or type(exc).__name__


def count_tokens(root: "str | Endpoint", text: str, timeout_s: float) -> int | None:
    """Token count from llama.cpp's ``/tokenize`` ({"content"}) or vLLM's ({"prompt"}), else None."""
    for body in ({"content": text, "add_special": False}, {"prompt": text, "add_special_tokens": False}):
        try:
            st, _, data = _request_json(root, "POST", "/tokenize", body, timeout_s)
            d = json.loads(data) if st == 200 else None
        except (OSError, http.client.HTTPException, ValueError):
            return None
        if isinstance(d, dict) and isinstance(d.get("tokens"), list):
            return len(d["tokens"])
        if isinstance(d, dict) and isinstance(d.get("count"), int):
            return d["count"]
    return None


# ---------------------------------------------------------------------------------------------
# Prompts

def make_prompt(rng: np.random.Generator, n_words: int) -> str:
    """``n_words`` words drawn from a fixed list (the seeded generator decides which)."""
    idx = rng.integers(0, len(_WORDS), size=n_words)
    return " ".join(_WORDS[i] for i in idx)


def fit_prompt(rng: np.random.Generator, isl: int, root: "str | Endpoint | None", timeout_s: float) -> str:
    words = make_prompt(rng, isl).split(" ")
    if root is None:
        return " ".join(words)
    n = len(words)
    for _ in range(4):  # each word is about one token: a few corrections converge
        text = " ".join(words[:n])
        count = count_tokens(root, text, timeout_s)
        if count is None or count == isl:
            return text
        n = max(1, n + (isl - count))
        while n > len(words):
            words += make_prompt(rng, n - len(words)).split(" ")
    return " ".join(words[:n])


# ---------------------------------------------------------------------------------------------
# One streamed request

def stream_completion(url: "str | Endpoint", payload: dict, timeout_s: float) -> RequestResult:
    """POST ``{url}/completions`` (or ``/chat/completions``, the endpoint's ``api``) with ``stream:
    true``; time the text chunks of the SSE stream. A kept-alive connection the server closed while
    idle is retried once on a new one (nothing was sent: the request is not repeated)."""
    ep = Endpoint.of(url)
    c, base, reused = ep.connection(timeout_s)
    t0 = time.perf_counter()
    first: float | None = None  # perf_counter times of the first and the last text chunk
    last = t0
    chunks = 0
    usage_out = usage_in = cached = None
    reusable = False
    try:
        try:
            c.request("POST", base + API_PATHS[ep.api], json.dumps(payload), ep.headers(True))
            r = c.getresponse()
        except (ConnectionError, http.client.RemoteDisconnected, http.client.CannotSendRequest):
            if not reused:
                raise
            c.close()
            c, base = _conn(ep.url, timeout_s)
            t0 = last = time.perf_counter()
            c.request("POST", base + API_PATHS[ep.api], json.dumps(payload), ep.headers(True))
            r = c.getresponse()
        if r.status != 200:
            body = r.read(300).decode("utf-8", "replace").strip().replace("\n", " ")
            return RequestResult(ok=False, error=f"HTTP {r.status}: {body}")
        done = False
        for raw in r:
            line = raw.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                done = True
                break
            now = time.perf_counter()
            try:
                d = json.loads(data)
            except ValueError:
                return RequestResult(ok=False, error=f"bad stream chunk {data[:80]!r}")
            if "error" in d:
                return RequestResult(ok=False, error=f"server error: {str(d['error'])[:200]}")
            ch = d.get("choices") or []
            if ch and (ch[0].get("text") or (ch[0].get("delta") or {}).get("content")):
                chunks += 1
                first = now if first is None else first
                last = now
            u = d.get("usage") or {}
            t = d.get("timings") or {}
            usage_out = u.get("completion_tokens", t.get("predicted_n", usage_out))
            # llama.cpp's timings.prompt_n counts only the tokens it computed: add its cache_n
            t_in = t.get("prompt_n") + t.get("cache_n", 0) \
                if isinstance(t.get("prompt_n"), int) and isinstance(t.get("cache_n", 0), int) else None
            usage_in = u.get("prompt_tokens", t_in if t_in is not None else usage_in)
            details = u.get("prompt_tokens_details") or {}
            cached = t.get("cache_n", details.get("cached_tokens", cached) if isinstance(details, dict) else cached)
        if done:   # read the stream's end, then the connection can carry the next request
            r.read()
            reusable = not r.will_close
    except (OSError, http.client.HTTPException) as exc:
        return RequestResult(ok=False, error=_reason(exc), sent_s=t0)
    finally:
        ep.release(c, reusable)
    if first is None:
        return RequestResult(ok=False, error="stream ended without any text", sent_s=t0)
    return RequestResult(ok=True, ttft_s=first - t0, last_token_s=last - t0, chunks=chunks,
                         output_tokens=usage_out if isinstance(usage_out, int) else None,
                         prompt_tokens=usage_in if isinstance(usage_in, int) else None, sent_s=t0,
                         cached_tokens=cached if isinstance(cached, int) else None)


def completion_payload(model: str, prompt: str, osl: int, cache_prompt: bool = False, api: str = "completions") -> dict:
    """A streaming ``/v1/completions`` body that generates exactly ``osl`` tokens; with ``api`` chat,
    a ``/v1/chat/completions`` body with the prompt as the one user message (the server's chat
    template adds its own tokens: the prompt length recorded is the one the server reports)."""
    text = {"messages": [{"role": "user", "content": prompt}]} if api == "chat" else {"prompt": prompt}
    return {"model": model, **text, "max_tokens": osl, "stream": True,
            "ignore_eos": True,                         # vLLM, SGLang, llama.cpp: run to max_tokens
            "min_tokens": osl,                          # vLLM: do not stop early on a stop token
            "cache_prompt": cache_prompt,               # llama.cpp: reuse a cached prefix only when asked
            "temperature": 0.0,
            "stream_options": {"include_usage": True}}  # OpenAI/vLLM: usage in the last chunk


# ---------------------------------------------------------------------------------------------
# A point: C threads, closed loop

def _run_point(run: RunSpec, c: int, isl: int, osl: int, prompts: list[str], ep: "Endpoint | None" = None) -> PointResult:
    ep = ep or run.endpoint()
    work: queue.Queue[str] = queue.Queue()
    for p in prompts:
        work.put(p)
    results: list[RequestResult] = []
    lock = threading.Lock()

    def worker():
        while True:
            try:
                p = work.get_nowait()
            except queue.Empty:
                return
            r = stream_completion(ep, completion_payload(run.model, p, osl, api=ep.api), run.timeout_s)
            with lock:
                results.append(r)

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(min(c, len(prompts)))]
    with LoadSampler(1.0) as load:
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        duration = time.perf_counter() - t0
    return PointResult(c, isl, osl, duration, tuple(results), load.record())


def summarize_point(pt: PointResult) -> dict:
    """Row values (ms, tok/s, req/s) from a point's successful requests."""
    ok = [r for r in pt.results if r.ok]
    if not ok:
        first = pt.failures[0].error if pt.failures else "no requests"
        raise KvtuneError(f"every request failed at concurrency {pt.concurrency}, isl {pt.isl}, "
                          f"osl {pt.osl}: {first}")
    ttft = [r.ttft_s * 1e3 for r in ok]
    tpot = [r.tpot_s * 1e3 for r in ok if r.tpot_s is not None]
    prompt = [r.prompt_tokens for r in ok if r.prompt_tokens]
    out: dict = {"concurrency": pt.concurrency, "num_requests": len(ok),
                 "input_tokens": int(round(float(np.mean(prompt)))) if prompt else pt.isl,
                 "output_tokens": int(round(float(np.mean([r.n_out for r in ok])))),
                 "output_tok_s": sum(r.n_out for r in ok) / pt.duration_s,
                 "request_s": len(ok) / pt.duration_s}
    out["ttft_mean_ms"], out["ttft_p50_ms"], out["ttft_p90_ms"], out["ttft_p99_ms"] = latency_summary(ttft)
    if tpot:
        out["tpot_mean_ms"], out["tpot_p50_ms"], out["tpot_p90_ms"], out["tpot_p99_ms"] = latency_summary(tpot)
    return out


def run_profile(run: RunSpec, meta: Metadata, on_point: Callable[[PointResult, ProfileRow], None] | None = None,
                id_prefix: str = "run") -> tuple[list[ProfileRow], ServerInfo]:
    """Probe the server, then measure every (concurrency, isl, osl) point; one row per point.

    ``meta`` fills gpu, engine, version, dtypes, tp, source; the engine and version the server
    reports fill what ``meta`` leaves empty. ``on_point`` is called after each point (progress).
    """
    ep = run.endpoint()
    info = probe_server(ep, min(run.timeout_s, 10.0))
    root = ep.root() if info.can_tokenize else None
    rng = np.random.default_rng(run.seed)
    m = meta.fill(Metadata(model=run.model, engine=info.engine or None, engine_version=info.engine_version or None,
                           date=datetime.now(timezone.utc).replace(microsecond=0).isoformat()))
    if run.warmup_requests:
        warm = [stream_completion(ep, completion_payload(run.model, make_prompt(rng, 16), 4, api=ep.api), run.timeout_s)
                for _ in range(run.warmup_requests)]
        bad = [w for w in warm if not w.ok]
        if len(bad) == len(warm):
            raise KvtuneError(f"server at {run.url}: warm-up request failed: {bad[0].error}")
    rows = []
    for isl in run.input_tokens:
        for osl in run.output_tokens:
            for c in run.concurrencies:
                prompts = [fit_prompt(rng, isl, root, run.timeout_s) for _ in range(run.requests_per_point)]
                pt = _run_point(run, c, isl, osl, prompts, ep)
                load = pt.load.mean_1m if pt.load is not None else math.nan
                row = ProfileRow(id=f"{id_prefix}:c{c}-i{isl}-o{osl}", kind="request", **m.row_fields(),
                                 kv_pool_tokens=info.kv_pool_tokens, batch_cap=info.batch_cap,
                                 chunk_tokens=run.chunk_tokens or info.chunk_tokens, threads=run.threads,
                                 loadavg_1m=load if math.isfinite(load) else None, **summarize_point(pt))
                rows.append(row)
                if on_point:
                    on_point(pt, row)
    ep.close()
    return rows, info
