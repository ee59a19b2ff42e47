"""A disaggregated deployment (xPyD): a pool of prefill replicas, a pool of decode replicas, a
router and the KV transfer between them, simulated with the same replica as aggregated serving.

A request's path:

1. the router sends it to a prefill replica, round robin in arrival order (each replica of x sees
   every x-th request: a smoother stream than a random split);
2. the prefill replica (``costmodel.replica.Replica`` with the prefill pool's step model and
   scheduler) computes the prompt in chunks of its token budget and, as the step that completes a
   prompt does, its first token;
3. the prompt's KV goes to a decode replica (round robin too): ``prompt tokens x KV bytes per
   token`` over ``min(TP_p, TP_d)`` GPU-to-GPU streams of the link between the pools (``KVLink``:
   NVLink when both pools sit in one node, the node's network otherwise), one transfer at a time
   into each decode replica, overlapped as the engine overlaps it (``Engine.kv_sent_per_chunk``):
   - SGLang sends each finished chunk of a chunked prompt while the next chunk computes
     (python/sglang/srt/disaggregation/prefill.py, process_prefill_chunk -> send_kv_chunk), so
     only the last chunk's KV, and whatever of the rest the link could not move while the earlier
     chunks computed (each at least a full chunk's step with no context), lands after the prompt;
   - vLLM's NixlConnector (the decode replica pulls the prompt's blocks once the prefill request
     finishes) and TensorRT-LLM's cache transceiver (after the context phase) move the whole KV
     after the prompt is done;
4. the decode replica admits it on its own KV pool when the KV has arrived (the batch cap, the
   pool and the engine's admission rule as for any request, with nothing to prefill). Its first
   token (``Engine.first_token_from_prefill``): SGLang and TensorRT-LLM stream the token the
   prefill replica computed with the KV (SGLang's send_kv_chunk carries it; TensorRT-LLM's
   ``first_gen_tokens``), so it comes at admission; vLLM recomputes the last prompt token on the
   decode replica (scheduler.py ``_update_waiting_for_remote_kv``), so its first token is one step of
   the decode batch later (kvtune: the request's mean decode step there). The remaining tokens are
   decode steps of that replica.

So at vanishing load TTFT = front end + prefill + exposed transfer (+ one decode step for vLLM),
and TPOT carries no prefill: the decode pool's steps hold only decodes. A request that can never
fit either pool is rejected (never served) with the reason.
"""

from __future__ import annotations

import hashlib
import math
import time
import weakref
from dataclasses import dataclass

import numpy as np

from .engines import get_engine
from .errors import InputError
from .hardware import GPU
from .requests import Requests
from .simulate import SimConfig, SimResult, simulate_replica, build_result, default_warmup_frac
from .step import StepCost, StepModel
from .goodput import capacity_bound_req_s

__all__ = ["Pool", "KVLink", "kv_link", "DisaggResult", "simulate_disaggregated", "exposed_transfer_s",
           "disaggregated_bound_req_s"]


@dataclass(frozen=True)
class Pool:
    """``replicas`` identical replicas, each a TP group with this step model and scheduler."""

    step: StepCost
    config: SimConfig
    replicas: int

    def __post_init__(self) -> None:
        r = self.replicas
        if isinstance(r, bool) or not isinstance(r, (int, np.integer)) or r < 1:
            raise InputError(f"deployment: a pool needs replicas >= 1, got {r!r}")

    @property
    def gpus(self) -> int:
        return int(self.replicas) * int(self.step.tp)


@dataclass(frozen=True)
class KVLink:
    """The link a prompt's KV crosses, per GPU and direction."""

    bytes_per_s: float
    latency_s: float
    source: str

    def transfer_s(self, kv_bytes: np.ndarray, streams: int) -> np.ndarray:
        """Seconds to move ``kv_bytes`` over ``streams`` GPU pairs in parallel."""
        return self.latency_s + kv_bytes / (max(int(streams), 1) * self.bytes_per_s)


def kv_link(gpu: GPU, same_node: bool) -> KVLink:
    """NVLink within a node, the node's scale-out network across nodes (``profiles/hardware.yaml``
    gives both with their sources)."""
    if same_node:
        return KVLink(gpu.link_bytes_per_s, 0.0, f"{gpu.name} NVLink within a node")
    return KVLink(gpu.network_bytes_per_s, gpu.network_latency_s, f"{gpu.name} network between nodes")


@dataclass(frozen=True, eq=False)
class DisaggResult:
    result: SimResult            # the deployment as a user sees it (TTFT, TPOT, goodput inputs)
    prefill_s: np.ndarray        # arrival -> prompt done on its prefill replica (engine time)
    transfer_s: np.ndarray       # the KV transfer that lands after the prompt is done (inf where rejected)
    kv_wait_s: np.ndarray        # prompt done -> KV arrived (queueing on the link + transfer)
    gpus: int
    link: KVLink


def simulate_disaggregated(prefill: Pool, decode: Pool, requests: Requests, link: KVLink,
                           arrival: str = "trace", seed: int = 0, warmup_frac: float | None = None,
                           engine: str = "sglang") -> DisaggResult:
    """Simulate ``requests`` through a prefill pool, the KV link and a decode pool (see the module
    docstring). ``arrival``: "trace" (``requests.arrival_s``) or "inf" (all at t=0); ``engine``:
    whose transfer overlap and first-token rule apply (``costmodel.engines``)."""
    wall0 = time.perf_counter()
    eng = get_engine(engine)
    if arrival not in ("trace", "inf"):
        raise InputError(f"a disaggregated deployment simulates arrival trace or inf, got {arrival!r}")
    if warmup_frac is None:
        warmup_frac = default_warmup_frac(arrival)
    n = len(requests)
    if n == 0:
        raise InputError("simulate: no requests")
    arr = requests.arrival_s.astype(float) if arrival == "trace" else np.zeros(n)
    order = np.argsort(arr, kind="stable")
    rank = np.empty(n, dtype=np.int64)
    rank[order] = np.arange(n)
    y = int(decode.replicas)

    # ---- prefill pool: each request's prompt, and the first token with it ----------------------
    ready, rej, preemptions, steps, events, reasons = _prefill_pool(prefill, requests, arr, order, arrival, seed)

    # ---- the KV transfers, one at a time into each decode replica -------------------------------
    xfer = exposed_transfer_s(prefill, decode, requests.input_tokens, link, eng.kv_sent_per_chunk)
    arrive_d = np.full(n, math.inf)
    dest = rank % y
    for d in range(y):
        mine = np.flatnonzero((dest == d) & ~rej)
        free = -math.inf
        for i in mine[np.argsort(ready[mine], kind="stable")]:
            start = ready[i] if ready[i] > free else free
            free = start + xfer[i]
            arrive_d[i] = free

    # ---- decode pool: admitted with the KV, first token then, the rest decoded ------------------
    first = np.full(n, math.inf)
    fin = np.full(n, math.inf)
    for d in range(y):
        idx = np.flatnonzero((dest == d) & ~rej)
        if idx.size == 0:
            continue
        out = requests.output_tokens[idx]
        # vLLM: one more step for the first token (the token "at admission" is not streamed)
        sub = _subset(requests, idx, arrive_d[idx], None if eng.first_token_from_prefill else out + 1)
        r = simulate_replica(decode.step, sub, decode.config, "trace", None, seed, 0.0, naive=False,
                      kv_ready=np.ones(idx.size, dtype=bool))
        front = float(decode.step.request_overhead_s)
        ok = ~np.isinf(r.ttft_s)
        admit = r.arrival_s + r.ttft_s - front
        done = r.arrival_s + r.e2e_s - front
        if not eng.first_token_from_prefill:
            with np.errstate(invalid="ignore"):
                admit = admit + (done - admit) / np.maximum(out, 1)
        first[idx[ok]] = admit[ok]
        fin[idx[ok]] = done[ok]
        rej[idx[~ok]] = True
        preemptions, steps, events = preemptions + r.preemptions, steps + r.steps, events + r.events
        if r.reject_reason:
            reasons.append(f"decode pool: {r.reject_reason}")

    front_s = float(prefill.step.request_overhead_s)
    res = build_result(requests, arr, first, fin, rej, front_s, warmup_frac, arrival, preemptions, steps, events,
                       wall0, "; ".join(reasons))
    with np.errstate(invalid="ignore"):
        return DisaggResult(res, np.where(rej, math.inf, ready - arr), np.where(rej, math.inf, xfer),
                            np.where(rej, math.inf, arrive_d - ready), prefill.gpus + decode.gpus, link)


# the prefill pool's outcome per step model (weakly: it lives as long as the model) and per inputs:
# a search simulates one prefill pool beside many decode pools, on the same requests
_PREFILL_MEMO: "weakref.WeakKeyDictionary[StepCost, dict]" = weakref.WeakKeyDictionary()
_PREFILL_MEMO_MAX = 256  # entries per step model (a few arrays of n each)


def _prefill_pool(prefill: Pool, requests: Requests, arr: np.ndarray, order: np.ndarray, arrival: str,
                  seed: int) -> tuple[np.ndarray, np.ndarray, int, int, int, list[str]]:
    """The prefill pool's replicas, each on its share of the requests (round robin in arrival
    order) with one output token: (engine time each prompt is done, rejected, preemptions, steps,
    events, reject reasons). A pure function of its inputs: the same inputs give the result
    computed before (fresh copies), keyed by the model and a digest of every input it reads."""
    x = int(prefill.replicas)
    h = hashlib.blake2b(digest_size=20)
    for a in (arr, order, requests.input_tokens, requests.prefix_tokens, requests.prefix_group):
        a = np.ascontiguousarray(a)
        h.update(f"{a.dtype.str}{a.shape}".encode())
        h.update(a.tobytes())
    key = (prefill.config, x, arrival, seed, h.digest())
    try:
        memo = _PREFILL_MEMO.setdefault(prefill.step, {})
    except TypeError:  # a model that cannot be weakly keyed: no memo
        memo = {}
    got = memo.get(key)
    if got is None:
        got = _simulate_prefill_pool(prefill, requests, arr, order, arrival, seed)
        if len(memo) >= _PREFILL_MEMO_MAX:
            memo.clear()
        memo[key] = got
    ready, rej, preemptions, steps, events, reasons = got
    return ready.copy(), rej.copy(), preemptions, steps, events, list(reasons)


def _simulate_prefill_pool(prefill: Pool, requests: Requests, arr: np.ndarray, order: np.ndarray, arrival: str,
                           seed: int) -> tuple[np.ndarray, np.ndarray, int, int, int, list[str]]:
    """``_prefill_pool`` computed."""
    n, x = len(requests), int(prefill.replicas)
    ready = np.full(n, math.inf)      # engine time the prompt is done
    rej = np.zeros(n, dtype=bool)
    preemptions = steps = events = 0
    reasons = []
    for p in range(x):
        idx = order[p::x]
        if idx.size == 0:
            continue
        sub = _subset(requests, idx, arr[idx], output_tokens=np.ones(idx.size, dtype=np.int64))
        r = simulate_replica(prefill.step, sub, prefill.config, arrival, None, seed, 0.0, naive=False)
        front = float(prefill.step.request_overhead_s)
        done = r.arrival_s + r.e2e_s - front
        ok = ~np.isinf(r.ttft_s)
        ready[idx[ok]] = done[ok]
        rej[idx[~ok]] = True
        preemptions, steps, events = preemptions + r.preemptions, steps + r.steps, events + r.events
        if r.reject_reason:
            reasons.append(f"prefill pool: {r.reject_reason}")
    return ready, rej, preemptions, steps, events, reasons


def exposed_transfer_s(prefill: Pool, decode: Pool, input_tokens: np.ndarray, link: KVLink,
                       per_chunk: bool) -> np.ndarray:
    """Seconds of each prompt's KV transfer that land after its prefill is done: the whole
    transfer, or (``per_chunk``, SGLang) the last chunk's share plus whatever of the earlier chunks'
    the link could not move while they computed; each earlier chunk takes at least a full chunk's
    step with no cached context (the fastest a chunk goes), so this never under-counts."""
    streams = min(int(prefill.step.tp), int(decode.step.tp))
    inp = np.asarray(input_tokens, dtype=float)
    kv = float(prefill.step.memory.kv_bytes_per_token)
    whole = link.transfer_s(inp * kv, streams)
    if not per_chunk:
        return whole
    c = int(prefill.config.chunk_tokens)
    earlier = np.maximum(np.ceil(inp / c) - 1.0, 0.0)
    last_bytes = (inp - earlier * c) * kv
    chunk_s = prefill.step.step_time_s(0, 0.0, c, StepModel.chunk_pairs(c, 0), 0.0)
    per_s = max(streams, 1) * link.bytes_per_s
    return link.latency_s + np.maximum(last_bytes / per_s, inp * kv / per_s - earlier * chunk_s)


def _subset(req: Requests, idx: np.ndarray, arrival_s: np.ndarray, output_tokens: np.ndarray | None = None) -> Requests:
    return Requests(arrival_s=np.asarray(arrival_s, dtype=float), input_tokens=req.input_tokens[idx],
                    output_tokens=req.output_tokens[idx] if output_tokens is None else output_tokens,
                    prefix_tokens=req.prefix_tokens[idx], prefix_group=req.prefix_group[idx],
                    ttft_slo_s=req.ttft_slo_s[idx], tpot_slo_s=req.tpot_slo_s[idx], class_idx=req.class_idx[idx],
                    class_names=req.class_names)


def disaggregated_bound_req_s(prefill: Pool, decode: Pool, mean_input_tokens: float, mean_output_tokens: float,
                              mean_uncached_tokens: float | None = None) -> float:
    """An upper bound on the deployment's throughput: the lower of the prefill pool's (a full
    chunk per step with no cached context before it, the fastest a prompt token can go, over the
    prompt tokens it computes: ``mean_uncached_tokens``, the prompt less what the prefix cache
    holds, when the pool caches prefixes) and the decode pool's (``goodput.capacity_bound_req_s``
    per replica; cached prefix tokens held once count as shared)."""
    c = int(prefill.config.chunk_tokens)
    t = prefill.step.step_time_s(0, 0.0, c, StepModel.chunk_pairs(c, 0), 0.0)
    todo = mean_input_tokens
    if mean_uncached_tokens is not None and prefill.config.prefix_caching:
        todo = min(max(float(mean_uncached_tokens), 0.0), mean_input_tokens)
    pre = prefill.replicas * c / t / max(todo, 1.0)
    shared = mean_input_tokens - todo if decode.config.prefix_caching else 0.0
    dec = decode.replicas * capacity_bound_req_s(decode.step, mean_input_tokens, mean_output_tokens,
                                                 decode.config.batch_cap, shared, decode.config.kv_pool_tokens)
    return min(pre, dec)
