"""Serving simulator: one replica, event driven, scheduled the way vLLM V1 schedules.

Each engine iteration (step):

1. every running sequence that has finished its prefill decodes: 1 token, or a verify pass of
   k+1 tokens with speculation (it gains a random accepted run, mean ``step.tokens_per_step``);
2. the rest of the token budget ``chunk_tokens`` goes to prefill chunks: first the partially
   prefilled running requests in admission order, then new requests from the head of the waiting
   queue (FCFS, head-of-line blocking) while ``len(running) < batch_cap`` and the KV pool has
   blocks for the whole prompt (with ``output_reserve``, SGLang's rule: also for the request's whole
   output and a decaying share of the running requests' remaining output);
3. the step takes ``StepModel.step_time_s(n_decode, decode_ctx_sum, prefill_tokens,
   prefill_pairs, prefill_kv_read)``; the step that completes a prefill emits the first token.

KV pool: ``kv_pool_tokens // block_tokens`` blocks. A decoding sequence with ``c`` cached tokens
holds ceil((c + 1) / block_tokens) blocks (its cache plus the slot of the token it computes). When
a step's blocks do not fit, the most recently admitted running request is preempted (vLLM
RECOMPUTE): its blocks are freed, it goes back to the head of the waiting queue and later
re-prefills its prompt plus the tokens it had generated; as in vLLM V1, a step that had to preempt
admits nothing new. Prefix caching: once a request of a
``prefix_group`` finishes its prefill, the group's prefix stays cached for good, its blocks pinned
(taken out of the pool); later requests of the group skip those tokens (they are read, not
computed). If the engine is empty and the head request still does not fit, the cache is dropped.

Speed by design: when no prefill work is possible the running set is fixed until the next event
(a completion, an arrival that could be admitted, or block pressure), and the steps up to it are
summed in closed form by ``DecodeClock`` instead of one Python iteration per step. Likewise when
one long prompt takes a step's whole chunk budget beside a fixed decode set: the steps until its
last chunk (or the next completion, or the block bound) repeat in shape, every term linear in the
step index, and are summed at once (not for sliding-window models or speculation). A step model
whose times are not the StepModel's piecewise-linear function of context (one that sets
``closed_form_ok = False``, e.g. ``costmodel.measured.MeasuredStepModel``) is stepped one
iteration at a time instead, every step timed by its own ``step_time_s``. Completions are
found with a heap keyed by the global step count at which each sequence finishes. Block pressure is
checked against an upper bound (sum of ceilings <= sum + count) and resolved exactly with numpy
only when the bound says the pool may run out.

Simplifications (documented, deliberate): a re-prefill after preemption emits no token; a
speculative sequence gains its own mean accepted run per verify step (its number of verify steps is
sampled up front, so completion times are random as in the engine, but the context between
completions grows linearly); requests whose prompt plus output cannot fit in the pool at all are
rejected (never served, they miss the SLO and count in ``rejected``).

Warm-up: with Poisson/trace and closed-loop arrivals the first ``warmup_frac`` (default 10%) of
requests, in arrival order, see a filling system and are excluded from the latency statistics and
from SLO attainment (their tokens still count in throughput). With ``arrival="inf"`` (the offline
benchmark) nothing is excluded by default. Per-request arrays in ``SimResult`` cover every request;
``measured`` says which ones the statistics use.
"""

from __future__ import annotations

import heapq
import math
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable

import numpy as np

from .errors import InputError
from .requests import Requests
from .sim_clock import DecodeClock
from .step import StepModel

__all__ = ["SimConfig", "SimResult", "simulate", "simulate_fleet", "ARRIVAL_MODES", "default_warmup_frac"]

ARRIVAL_MODES = ("trace", "inf", "closed")

# SGLang's output reservation at admission (``SimConfig.output_reserve``); the defaults of SGLang's
# environ / global_config (SGLANG_INIT_NEW_TOKEN_RATIO, SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR,
# SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS, SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION,
# SGLANG_RETRACT_DECODE_STEPS), unchanged from 0.4 to 0.5.x
RESERVE_RATIO_INIT = 0.7
RESERVE_RATIO_MIN = 0.7 * 0.14
RESERVE_RATIO_DECAY_PER_STEP = (RESERVE_RATIO_INIT - RESERVE_RATIO_MIN) / 600
RESERVE_CLIP_TOKENS = 4096
RESERVE_RETRACT_STEPS = 20


def default_warmup_frac(arrival: str) -> float:
    """Share of requests (first in arrival order) left out of latency statistics by default."""
    return 0.0 if arrival == "inf" else 0.1


@dataclass(frozen=True)
class SimConfig:
    batch_cap: int                 # max running sequences (vLLM max_num_seqs)
    chunk_tokens: int = 8192       # per-step token budget (vLLM max_num_batched_tokens)
    block_tokens: int = 16         # KV block size (vLLM default 16)
    prefix_caching: bool = True
    watermark_frac: float = 0.0    # share of the pool kept free at admission (vLLM V0 used 0.01)
    # SGLang's default scheduling (enable_mixed_chunk off): while prompts wait, a prefill-only batch
    # runs and the decoding sequences wait for it; off, prefill chunks ride in the decode step
    # (vLLM V1, TensorRT-LLM in-flight batching)
    prefill_first: bool = False
    # SGLang's admission (PrefillAdder): a waiting request is admitted only while the pool also holds
    # its whole output and new_token_ratio x the remaining output of every running request (each
    # clipped at 4096 tokens); the ratio starts at 0.7 when the engine idles, falls linearly to 0.098
    # over 600 decode steps and is raised after a preemption. Off: admission counts the prompt only
    # (vLLM V1)
    output_reserve: bool = False
    # the KV pool in tokens, in place of the step model's (an engine's reported pool); None: the model's
    kv_pool_tokens: int | None = None

    def __post_init__(self) -> None:
        for key in ("batch_cap", "chunk_tokens", "block_tokens"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise InputError(f"simulator config: {key} must be an integer >= 1, got {v!r}")
        v = self.kv_pool_tokens
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1):
            raise InputError(f"simulator config: kv_pool_tokens must be an integer >= 1 or None, got {v!r}")
        if not 0 <= self.watermark_frac < 1:
            raise InputError(f"simulator config: watermark_frac must be in [0, 1), got {self.watermark_frac!r}")


def _pcts(x: np.ndarray, scale: float) -> dict:
    x = x[~np.isnan(x)]
    if x.size == 0:  # nothing to take a percentile of (JSON has no NaN): null
        return {"mean": None, "p50": None, "p90": None, "p99": None}
    if not np.all(np.isfinite(x)):
        p = np.percentile(x, [50, 90, 99], method="linear") if np.isfinite(x).any() else [math.inf] * 3
        return {"mean": math.inf, "p50": float(p[0]) * scale, "p90": float(p[1]) * scale, "p99": float(p[2]) * scale}
    p = np.percentile(x, [50, 90, 99])
    return {"mean": float(x.mean()) * scale, "p50": float(p[0]) * scale, "p90": float(p[1]) * scale,
            "p99": float(p[2]) * scale}


@dataclass(frozen=True, eq=False)
class SimResult:
    arrival_s: np.ndarray    # when each request arrived (closed loop: when its client sent it)
    ttft_s: np.ndarray       # arrival -> first token (inf if rejected)
    tpot_s: np.ndarray       # (e2e - ttft) / (output - 1); NaN for 1-token outputs
    e2e_s: np.ndarray        # arrival -> last token
    met_slo: np.ndarray      # ttft <= ttft_slo and tpot <= tpot_slo (tpot ignored for 1 token)
    measured: np.ndarray     # past warm-up: used by the statistics below
    output_tokens: np.ndarray
    preemptions: int
    rejected: int            # requests larger than the whole KV pool (never served)
    makespan_s: float        # first arrival -> last completion
    output_tok_s: float      # all served output tokens / makespan (x replicas for a fleet)
    request_s: float         # served requests / makespan (x replicas for a fleet)
    slo_attainment: float    # share of measured requests meeting both targets
    steps: int               # engine iterations simulated
    events: int              # scheduler loop turns (closed-form advances + explicit steps)
    arrival: str
    warmup_frac: float
    replicas: int = 1
    sim_wall_s: float = 0.0  # wall time of the simulation (not part of the results' determinism)
    # why requests were rejected: the tokens the largest one needs against the pool's ("" if none)
    reject_reason: str = ""

    def summary(self) -> dict:
        """Counts, and latency percentiles over the measured requests that were served (a rejected
        request has no latency; it counts as a miss in ``slo_attainment``)."""
        m = self.measured & ~np.isinf(self.ttft_s)
        return {
            "requests": int(len(self.ttft_s)),
            "measured_requests": int(self.measured.sum()),
            "served_requests": int(len(self.ttft_s) - self.rejected),
            "percentiles_over": "measured served requests",
            "ttft_ms": _pcts(self.ttft_s[m], 1e3),
            "tpot_ms": _pcts(self.tpot_s[m], 1e3),
            "e2e_ms": _pcts(self.e2e_s[m], 1e3),
            "slo_attainment": self.slo_attainment,
            "output_tok_s": self.output_tok_s,
            "request_s": self.request_s,
            "preemptions": self.preemptions,
            "rejected": self.rejected,
            "rejected_reason": self.reject_reason,
            "makespan_s": self.makespan_s,
            "steps": self.steps,
            "replicas": self.replicas,
            "sim_wall_s": self.sim_wall_s,
        }


def _spec_verify_steps(step: StepModel, out: np.ndarray, seed: int) -> np.ndarray:
    """Verify passes each request needs for its ``out - 1`` tokens after the first. A pass emits
    1 + X tokens, X = consecutive accepted drafts: P(X >= j) = a^j for j <= k, so
    X = min(floor(ln U / ln a), k); mean (1 - a^(k+1)) / (1 - a) = step.tokens_per_step."""
    need = np.maximum(out.astype(np.int64) - 1, 0)
    k, a = step.spec.k, step.spec.acceptance
    total = int(need.sum())
    if total == 0:
        return need.copy()
    if a >= 1.0:
        return -(-need // (k + 1))
    rng = np.random.default_rng(seed)
    if a <= 0.0:
        runs = np.ones(total, dtype=np.int64)
    else:
        u = rng.random(total)
        u[u <= 0] = np.finfo(float).tiny
        runs = 1 + np.minimum(np.floor(np.log(u) / math.log(a)), k).astype(np.int64)
    # each request draws from its own segment of the stream (at most need[i] draws, each >= 1 token)
    cum = np.concatenate(([0], np.cumsum(runs)))
    start = np.concatenate(([0], np.cumsum(need)[:-1]))
    base = cum[start]
    end = np.searchsorted(cum, base + need, side="left")  # first index with cum >= base + need
    return np.where(need > 0, end - start, 0).astype(np.int64)


def simulate(step: StepModel, requests: Requests, config: SimConfig, arrival: str = "trace",
             concurrency: int | None = None, seed: int = 0, warmup_frac: float | None = None) -> SimResult:
    """Simulate one replica serving ``requests``.

    ``arrival``: "trace" (Poisson or replayed: ``requests.arrival_s``), "inf" (all at t=0: the
    offline benchmark) or "closed" (``concurrency`` clients, each sending its next request, in
    order, when its previous one completes; client ``i`` sends its first request at
    ``requests.arrival_s[i]``: all zeros is a cold-start burst, spread times a staggered start). ``seed`` drives speculative acceptance only.
    ``warmup_frac``: share of requests excluded from the statistics (default: see module doc).
    """
    return _simulate(step, requests, config, arrival, concurrency, seed, warmup_frac, naive=False)


def simulate_fleet(step: StepModel, make_requests: Callable[[float, int, int], Requests], config: SimConfig,
                   replicas: int, rate_req_s: float | None = None, n_requests: int = 2000,
                   arrival: str = "trace", concurrency: int | None = None, seed: int = 0,
                   warmup_frac: float | None = None) -> SimResult:
    """``replicas`` identical replicas behind a load balancer that splits traffic at random.

    Random splitting of a Poisson stream of rate R gives N independent Poisson streams of rate R/N,
    so every replica is statistically the same: simulate one at R/N (closed loop: concurrency/N
    clients; offline: n/N requests) and multiply throughput by N. Cost does not grow with N.
    ``make_requests(rate_req_s, n, seed)`` builds the requests one replica sees.
    """
    if isinstance(replicas, bool) or not isinstance(replicas, (int, np.integer)) or replicas < 1:
        raise InputError(f"replicas must be an integer >= 1, got {replicas!r}")
    if arrival == "trace":
        if rate_req_s is None or not rate_req_s > 0:
            raise InputError(f"fleet simulation needs a rate > 0 req/s, got {rate_req_s!r}")
        reqs = make_requests(rate_req_s / replicas, n_requests, seed)
        conc = None
    elif arrival == "inf":
        reqs = make_requests(math.inf, max(1, n_requests // replicas), seed)
        conc = None
    else:
        if concurrency is None or concurrency < replicas:
            raise InputError(f"closed loop over {replicas} replicas needs concurrency >= replicas, got {concurrency!r}")
        reqs = make_requests(math.inf, n_requests, seed)
        conc = concurrency // replicas
    r = _simulate(step, reqs, config, arrival, conc, seed, warmup_frac, naive=False)
    return SimResult(**{**r.__dict__, "output_tok_s": r.output_tok_s * replicas,
                        "request_s": r.request_s * replicas, "replicas": int(replicas)})


def _simulate(step: StepModel, requests: Requests, config: SimConfig, arrival: str,
              concurrency: int | None, seed: int, warmup_frac: float | None, naive: bool) -> SimResult:
    wall0 = time.perf_counter()
    if not getattr(step, "closed_form_ok", True):
        naive = True  # measured step times: no closed form, time every decode step exactly
    if arrival not in ARRIVAL_MODES:
        raise InputError(f"arrival must be one of {', '.join(ARRIVAL_MODES)}, got {arrival!r}")
    if arrival == "closed":
        if isinstance(concurrency, bool) or not isinstance(concurrency, (int, np.integer)) or concurrency < 1:
            raise InputError(f"closed-loop arrival needs concurrency >= 1, got {concurrency!r}")
    if warmup_frac is None:
        warmup_frac = default_warmup_frac(arrival)
    if not 0 <= warmup_frac < 1:
        raise InputError(f"warmup_frac must be in [0, 1), got {warmup_frac!r}")
    n = len(requests)
    if n == 0:
        raise InputError("simulate: no requests")

    # ---- per-request inputs (Python lists: scalar access in the loop is faster than numpy) ----
    if arrival == "trace":
        order = np.argsort(requests.arrival_s, kind="stable")
    else:
        order = np.arange(n)
    inp_a = requests.input_tokens[order].astype(np.int64)
    out_a = requests.output_tokens[order].astype(np.int64)
    inp, out = inp_a.tolist(), out_a.tolist()
    pre = requests.prefix_tokens[order].tolist()
    grp = requests.prefix_group[order].tolist()
    if arrival == "trace":
        arr = requests.arrival_s[order].astype(float).tolist()
    else:
        arr = [0.0] * n
    n_trace = n if arrival == "trace" else 0   # requests that arrive at their own arrival_s
    if arrival == "closed":
        # the clients' first send times: all at 0 (a cold-start burst) unless arrival_s staggers them
        k0 = min(int(concurrency), n)
        starts = requests.arrival_s[:k0].astype(float)
        if k0 and starts.max() > 0:
            if (np.diff(starts) < 0).any() or starts.min() < 0:
                raise InputError("closed loop: the clients' start times (first arrival_s) must be >= 0 and non-decreasing")
            arr[:k0] = starts.tolist()
            n_trace = k0
    if step.spec is not None:
        nsteps_a = _spec_verify_steps(step, out_a, seed)
        gain_a = np.where(nsteps_a > 0, (out_a - 1) / np.maximum(nsteps_a, 1), 0.0)
    else:
        nsteps_a = np.maximum(out_a - 1, 0)
        gain_a = np.ones(n)
    nsteps, gain = nsteps_a.tolist(), gain_a.tolist()
    q = step.spec.k + 1 if step.spec is not None else 1

    bt = int(config.block_tokens)
    cap = int(config.batch_cap)
    chunk = int(config.chunk_tokens)
    use_prefix = bool(config.prefix_caching)
    total_blocks = int(config.kv_pool_tokens or step.memory.kv_pool_tokens) // bt
    watermark_blocks = int(config.watermark_frac * total_blocks)
    # too large for the whole pool: prompt + output (+ the slot being computed) in blocks
    rejected_mask = -(-(inp_a + out_a + 1) // bt) > total_blocks - watermark_blocks
    rejected = rejected_mask.tolist()
    any_rejected = bool(rejected_mask.any())
    reject_reason = _reject_reason(inp_a, out_a, rejected_mask, total_blocks, watermark_blocks, bt) if any_rejected else ""

    step_time = step.step_time_s
    # runs of identical prompt chunks beside a fixed decode set are summed in closed form too:
    # every term of those steps is linear in the step index (not for sliding-window attention,
    # whose KV reads are not, nor speculation, whose draft cost takes its own max)
    prefill_first = bool(config.prefill_first)
    chunk_runs = (not naive and not prefill_first and step.spec is None and not getattr(step, "_sliding", True)
                  and hasattr(step, "_terms"))
    clock = DecodeClock(step)
    pieces_of = clock.pieces
    time_of, steps_until = clock.time_of_steps, clock.steps_until

    # ---- state ----------------------------------------------------------------------------------
    t = 0.0
    gstep = 0                       # engine steps so far (every step decodes every decoding sequence)
    ctx_sum = 0.0                   # cached tokens of decoding sequences
    G = 0.0                         # their growth per step (sum of gains)
    n_dec = 0
    shared_dec = 0                  # pinned-prefix blocks the decoding sequences borrow
    # decode slots: inactive ones have L0 = -1, g = 0, shared = 0 so they need 0 blocks
    sL0 = np.full(cap, -1.0)
    sS0 = np.zeros(cap)
    sg = np.zeros(cap)
    ssh = np.zeros(cap)
    sF = np.zeros(cap)              # the step at which the slot's sequence finishes
    free_slots = list(range(cap))   # a heap: the lowest free slot first keeps active slots packed
    active = [False] * cap
    top = [0]                       # 1 + highest slot in use: numpy work covers slots [:top]
    unit_gain = step.spec is None
    slot_of = [-1] * n
    L0_of = [0.0] * n
    S0_of = [0] * n
    heap: list = []                 # (finish step, request, epoch)
    epoch = [0] * n
    running: dict[int, None] = {}   # admission order (preemption victim: the last one)
    prefilling: list[int] = []
    pf_done = [0] * n
    pf_target = [0] * n
    pf_alloc = [0] * n
    alloc_pf = 0                    # blocks held by prefilling requests
    shared_of = [0] * n
    pinned = 0
    cached_groups: set[int] = set()
    steps_done = [0] * n
    waiting: deque[int] = deque()
    first_t = [math.nan] * n
    fin_t = [math.nan] * n
    arr_t = list(arr)
    preemptions = 0
    events = 0
    n_left = n
    nxt = 0                          # next request not yet arrived
    reserve = bool(config.output_reserve)
    nt_r0, nt_s0 = RESERVE_RATIO_INIT, 0   # SGLang's new_token_ratio: its value at step nt_s0

    if arrival == "trace":
        pass
    elif arrival == "inf":
        nxt = n
        waiting.extend(range(n))
    elif n_trace == 0:
        waiting.extend(range(k0))
        nxt = k0
    nxt_c = k0 if arrival == "closed" else n   # the next request a closed-loop client sends

    def reject_skip() -> None:
        # drop rejected requests from the head of the waiting queue (they are never served)
        nonlocal n_left
        while waiting and rejected[waiting[0]]:
            i = waiting.popleft()
            n_left -= 1
            on_done(i)

    def on_done(i: int) -> None:
        # closed loop: the client that sent i sends the next request now
        nonlocal nxt_c
        if nxt_c < n:
            arr_t[nxt_c] = t
            waiting.append(nxt_c)
            nxt_c += 1

    def dec_blocks(j: int) -> int:
        """Exact blocks the decoding sequences hold for the step ``j`` steps from now."""
        if not n_dec:
            return 0
        k = top[0]
        c = sL0[:k] + (gstep + j - sS0[:k]) * sg[:k]
        return int(np.ceil((c + 1.0) / bt).sum() - ssh[:k].sum())

    def first_short_step(avail: int, m: int) -> int:
        """Steps that fit (1..m) before the decoding sequences' blocks exceed ``avail`` (step 0 is
        known to fit). With one token per step, a sequence with c cached tokens holds
        ceil((c + 1 + j) / bt) blocks at step j: floor((j + e) / bt) more than at step 0, where
        e = c mod bt. Over B sequences, after j = q bt + r steps that is q B + #{i : e_i >= bt - r}
        extra blocks, so the first step that does not fit follows from a histogram of e."""
        k = top[0]
        act = sg[:k] > 0
        c = (sL0[:k] + (gstep - sS0[:k]) * sg[:k])[act]
        used0 = int(np.ceil((c + 1.0) / bt).sum() - ssh[:k][act].sum())
        free = avail - used0
        if not unit_gain:
            lo, hi = 0, m - 1
            if dec_blocks(hi) <= avail:
                return m
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if dec_blocks(mid) > avail:
                    hi = mid
                else:
                    lo = mid
            return lo + 1
        nb = len(c)
        e = np.mod(c, bt).astype(np.int64)
        cnt = np.bincount(e, minlength=bt)
        suffix = np.cumsum(cnt[::-1])[::-1]             # suffix[x] = #{e_i >= x}
        q0 = free // nb
        rem = free - q0 * nb
        # smallest r in [1, bt] with #{e_i >= bt - r} > rem (r = bt: every sequence, nb > rem)
        r = 1
        while r < bt and suffix[bt - r] <= rem:
            r += 1
        j_short = q0 * bt + r                           # first step index whose blocks do not fit
        return min(m, j_short)

    def free_slot(s: int) -> None:
        sL0[s], sS0[s], sg[s], ssh[s], sF[s] = -1.0, 0.0, 0.0, 0.0, 0.0
        heapq.heappush(free_slots, s)
        active[s] = False
        k = top[0]
        while k and not active[k - 1]:
            k -= 1
        top[0] = k

    def reserve_blocks() -> float:
        """Blocks SGLang's admission holds back for the running requests' remaining output: the
        decaying new_token_ratio x their remaining tokens, each clipped (``output_reserve``)."""
        ratio = max(nt_r0 - RESERVE_RATIO_DECAY_PER_STEP * (gstep - nt_s0), RESERVE_RATIO_MIN)
        tok = 0.0
        if n_dec:
            k = top[0]
            tok = float(np.minimum((sF[:k] - gstep) * sg[:k], RESERVE_CLIP_TOKENS).sum())
        for i in prefilling:
            tok += min((nsteps[i] - steps_done[i]) * gain[i], RESERVE_CLIP_TOKENS)
        return ratio * tok / bt

    def retract_ratio() -> float:
        """SGLang's new_token_ratio after a retraction: (tokens decoded + 20 per request) over the
        running requests' whole outputs, at most 1."""
        done_tok, total_tok = 0.0, 0.0
        for i in running:
            s = slot_of[i]
            left = (sF[s] - gstep) * gain[i] if s >= 0 else (nsteps[i] - steps_done[i]) * gain[i]
            done_tok += max(out[i] - 1 - left, 0.0)
            total_tok += out[i]
        if total_tok <= 0:
            return RESERVE_RATIO_INIT
        return min(1.0, (done_tok + RESERVE_RETRACT_STEPS * len(running)) / total_tok)

    def dec_bound(j: int) -> float:
        return (ctx_sum + j * G + n_dec) / bt + n_dec - shared_dec

    def preempt() -> int:
        """Preempt the most recently admitted running request; return the blocks it frees."""
        nonlocal ctx_sum, G, n_dec, shared_dec, alloc_pf, preemptions
        v = next(reversed(running))
        del running[v]
        s = slot_of[v]
        if s >= 0:
            done_now = gstep - S0_of[v]
            steps_done[v] += done_now
            c = L0_of[v] + done_now * gain[v]
            freed = math.ceil((c + 1.0) / bt) - shared_of[v]
            ctx_sum -= c
            G -= gain[v]
            n_dec -= 1
            shared_dec -= shared_of[v]
            free_slot(s)
            slot_of[v] = -1
            epoch[v] += 1
            if n_dec == 0:
                ctx_sum, G = 0.0, 0.0
        else:
            prefilling.remove(v)
            alloc_pf -= pf_alloc[v]
            freed = pf_alloc[v]
        waiting.appendleft(v)
        preemptions += 1
        return freed

    while n_left > 0:
        events += 1
        # ---- arrivals up to now ------------------------------------------------------------------
        while nxt < n_trace and arr[nxt] <= t:
            waiting.append(nxt)
            nxt += 1
        if any_rejected and waiting and rejected[waiting[0]]:
            reject_skip()
            if n_left == 0:
                break
        if not running:
            if not waiting:
                t = arr[nxt]  # idle until the next arrival (trace mode only reaches here)
                nt_r0, nt_s0 = RESERVE_RATIO_INIT, gstep  # SGLang resets new_token_ratio when idle
                continue
        # ---- blocks for this step's decodes: preempt the newest while they do not fit ------------
        preempted_now = False
        if n_dec and (ctx_sum + n_dec) / bt + n_dec - shared_dec + alloc_pf + pinned > total_blocks:
            used = dec_blocks(0) + alloc_pf + pinned
            while used > total_blocks and running:
                used -= preempt()
                preempted_now = True
            if not running and pinned:
                # the last request alone did not fit beside the pinned prefixes: an empty engine
                # drops the prefix cache (as at admission) and may admit at once
                pinned = 0
                cached_groups.clear()
                preempted_now = False
            if reserve and preempted_now:
                nt_r0, nt_s0 = retract_ratio(), gstep
        # ---- prefill work for this step -----------------------------------------------------------
        budget = chunk if prefill_first else chunk - n_dec * q
        ptoks = 0
        ppairs = 0.0
        pkv = 0.0
        chunks: list = []
        if budget > 0 and (prefilling or waiting):
            for i in prefilling:
                d = pf_done[i]
                c = pf_target[i] - d
                if c > budget:
                    c = budget
                ptoks += c
                ppairs += c * d + c * (c + 1) * 0.5
                pkv += d
                chunks.append((i, c))
                budget -= c
                if budget <= 0:
                    break
            used_ub = None
            res = 0.0   # output_reserve: blocks held back for outputs (running, then admitted now)
            # vLLM V1 admits nothing in a step that had to preempt (the victim would come straight back)
            while budget > 0 and waiting and len(running) < cap and not preempted_now:
                i = waiting[0]
                if any_rejected and rejected[i]:
                    reject_skip()
                    continue
                target = inp[i] + (int(round(steps_done[i] * gain[i])) if steps_done[i] else 0)
                cached = 0
                if use_prefix and pre[i] > 0 and grp[i] in cached_groups:
                    cached = min(pre[i], target - 1)
                shared = cached // bt
                need = -(-target // bt) - shared
                if used_ub is None:
                    used_ub = (ctx_sum + n_dec) / bt + n_dec - shared_dec + alloc_pf + pinned
                    if reserve:
                        res = reserve_blocks()
                own = min((nsteps[i] - steps_done[i]) * gain[i] + 1, RESERVE_CLIP_TOKENS) / bt if reserve else 0.0
                # an empty engine takes the head whatever its output (it fits: not rejected)
                extra = res + own if running else 0.0
                if used_ub + need + extra > total_blocks - watermark_blocks:
                    used = dec_blocks(0) + alloc_pf + pinned
                    if used + need + extra > total_blocks - watermark_blocks:
                        if not running and pinned:
                            pinned = 0  # an empty engine that cannot take the head: drop the prefix cache
                            cached_groups.clear()
                            used_ub = None
                            continue
                        break
                    used_ub = used
                waiting.popleft()
                running[i] = None
                res += own
                pf_done[i], pf_target[i], pf_alloc[i] = cached, target, need
                shared_of[i] = shared
                alloc_pf += need
                used_ub += need
                prefilling.append(i)
                c = target - cached
                if c > budget:
                    c = budget
                ptoks += c
                ppairs += c * cached + c * (c + 1) * 0.5
                pkv += cached
                chunks.append((i, c))
                budget -= c
        m = 1
        if ptoks > 0 and chunk_runs and budget == 0 and len(chunks) == 1 and not preempted_now:
            # one prompt takes the whole budget: the next steps repeat this one (same chunk, the
            # prompt's cached prefix and the decodes' contexts growing linearly) until the prompt's
            # last chunk, the next completion or the block bound; nothing can be admitted meanwhile
            i, c = chunks[0]
            m = 1 + max(pf_target[i] - pf_done[i] - c - 1, 0) // c
            if n_dec:
                while heap[0][2] != epoch[heap[0][1]]:
                    heapq.heappop(heap)
                m = min(m, heap[0][0] - gstep)
                if G > 0:
                    room = (total_blocks - n_dec + shared_dec - alloc_pf - pinned) * bt - n_dec - ctx_sum
                    m = min(m, 1 + max(int(room // G), 0))
        if m > 1:
            # ---- a run of m identical-shape mixed steps, in closed form ----------------------
            d0 = pf_done[i]
            k = m - 1
            t0, mem0, comp0 = step._terms(n_dec, ctx_sum, c, c * d0 + c * (c + 1) * 0.5, d0)[:3]
            _, mem1, comp1 = step._terms(n_dec, ctx_sum + k * G, c, c * (d0 + k * c) + c * (c + 1) * 0.5,
                                         d0 + k * c)[:3]
            j = np.arange(m) / k
            t += float(np.sum(np.maximum(mem0 + j * (mem1 - mem0), comp0 + j * (comp1 - comp0)))) \
                + m * (t0 - max(mem0, comp0))
            gstep += m
            ctx_sum += m * G
            pf_done[i] = d0 + m * c
        elif ptoks > 0:
            # ---- one explicit step: mixed, or prefill only (the decodes wait: no decode step) ----
            if prefill_first:
                t += step_time(0, 0.0, ptoks, ppairs, pkv)
            else:
                t += step_time(n_dec, ctx_sum, ptoks, ppairs, pkv)
                gstep += 1
                ctx_sum += G
            for i, c in chunks:
                d = pf_done[i] + c
                pf_done[i] = d
                if d < pf_target[i]:
                    continue
                prefilling.remove(i)
                alloc_pf -= pf_alloc[i]
                if use_prefix and pre[i] > 0 and grp[i] >= 0 and grp[i] not in cached_groups:
                    pb = -(-pre[i] // bt)
                    if dec_bound(0) + alloc_pf + pinned + pb + -(-(d + 1) // bt) <= total_blocks:
                        cached_groups.add(grp[i])
                        pinned += pb
                if first_t[i] != first_t[i]:  # NaN: the first token of this request
                    first_t[i] = t
                left = nsteps[i] - steps_done[i]
                if left <= 0:
                    fin_t[i] = t
                    del running[i]
                    n_left -= 1
                    on_done(i)
                    continue
                s = heapq.heappop(free_slots)
                active[s] = True
                if s >= top[0]:
                    top[0] = s + 1
                slot_of[i] = s
                g = gain[i]
                L0_of[i], S0_of[i] = float(d), gstep
                sL0[s], sS0[s], sg[s], ssh[s], sF[s] = float(d), gstep, g, shared_of[i], gstep + left
                ctx_sum += d
                G += g
                n_dec += 1
                shared_dec += shared_of[i]
                heapq.heappush(heap, (gstep + left, i, epoch[i]))
        elif n_dec:
            # ---- a run of pure decode steps up to the next event, in closed form ----------------
            while heap[0][2] != epoch[heap[0][1]]:
                heapq.heappop(heap)
            m = heap[0][0] - gstep                   # steps until the first completion
            pcs = None if naive else pieces_of(n_dec)
            if pcs is None or (preempted_now and waiting):
                m = 1  # after a preemption the next step may admit again: no run ahead
            elif reserve and waiting and len(running) < cap:
                m = 1  # the output reserve shrinks step by step: the head may be admitted at any step
            elif not waiting and nxt < n_trace:
                # the next arrival joins after the step during which it arrives
                tau = arr[nxt] - t
                if len(pcs) == 1:
                    # one linear piece (the common case): S(k) = k a1 + b1 k (k - 1) / 2, solved inline
                    _, a, b = pcs[0]
                    a1 = a + b * ctx_sum
                    b1 = b * G
                    if m * a1 + b1 * m * (m - 1) * 0.5 > tau:
                        m = steps_until(pcs, ctx_sum, G, tau)
                else:
                    ma = steps_until(pcs, ctx_sum, G, tau)
                    if ma < m:
                        m = ma
            if m > 1 and (ctx_sum + (m - 1) * G + n_dec) / bt + n_dec - shared_dec + alloc_pf + pinned > total_blocks:
                # the pool may run out inside the run: stop before the first step that does not fit
                m = first_short_step(total_blocks - alloc_pf - pinned, m)
            if m == 1:
                t += step_time(n_dec, ctx_sum)
            elif len(pcs) == 1:
                _, a, b = pcs[0]
                t += m * (a + b * ctx_sum) + b * G * m * (m - 1) * 0.5
            else:
                t += time_of(pcs, ctx_sum, G, m)
            gstep += m
            ctx_sum += m * G
        else:
            # nothing can run: the head does not fit an empty engine (cannot happen after rejection)
            raise AssertionError("simulator stalled with an empty engine")
        # ---- completions at this step boundary --------------------------------------------------
        while heap and heap[0][0] <= gstep:
            fs, i, ep = heapq.heappop(heap)
            if ep != epoch[i]:
                continue
            fin_t[i] = t
            s = slot_of[i]
            ctx_sum -= L0_of[i] + (gstep - S0_of[i]) * gain[i]
            G -= gain[i]
            n_dec -= 1
            shared_dec -= shared_of[i]
            free_slot(s)
            slot_of[i] = -1
            steps_done[i] = nsteps[i]
            del running[i]
            n_left -= 1
            on_done(i)
        if n_dec == 0:
            ctx_sum, G = 0.0, 0.0

    # ---- results (back in the caller's order) ----------------------------------------------------
    inv = np.empty(n, dtype=np.int64)
    inv[order] = np.arange(n)
    arr_s = np.asarray(arr_t)[inv]
    first = np.asarray(first_t)[inv]
    fin = np.asarray(fin_t)[inv]
    rej = rejected_mask[inv]
    first[rej] = math.inf
    fin[rej] = math.inf
    # the front end's share (HTTP, tokenizing, streaming the first token), outside the engine's steps
    front_s = float(getattr(step, "request_overhead_s", 0.0))
    ttft = first - arr_s + front_s
    e2e = fin - arr_s + front_s
    out_c = requests.output_tokens.astype(np.int64)
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(out_c > 1, (e2e - ttft) / np.maximum(out_c - 1, 1), math.nan)
    tpot[rej & (out_c > 1)] = math.inf
    met = (ttft <= requests.ttft_slo_s) & ((out_c <= 1) | (tpot <= requests.tpot_slo_s))
    met &= ~rej
    # warm-up: the first share of requests in arrival order
    rank = np.empty(n, dtype=np.int64)
    rank[np.argsort(arr_s, kind="stable")] = np.arange(n)
    measured = rank >= int(math.floor(warmup_frac * n))
    served = ~rej
    if served.any():
        t0 = float(arr_s.min())
        makespan = float(fin[served].max()) - t0
    else:
        makespan = 0.0
    tok = float(out_c[served].sum())
    out_tok_s = tok / makespan if makespan > 0 else 0.0
    req_s = float(served.sum()) / makespan if makespan > 0 else 0.0
    att = float(met[measured].mean()) if measured.any() else 0.0
    return SimResult(
        arrival_s=arr_s, ttft_s=ttft, tpot_s=tpot, e2e_s=e2e, met_slo=met, measured=measured,
        output_tokens=out_c, preemptions=preemptions, rejected=int(rej.sum()), makespan_s=makespan,
        output_tok_s=out_tok_s, request_s=req_s, slo_attainment=att, steps=gstep, events=events,
        arrival=arrival, warmup_frac=float(warmup_frac), sim_wall_s=time.perf_counter() - wall0,
        reject_reason=reject_reason)


def _reject_reason(inp: np.ndarray, out: np.ndarray, mask: np.ndarray, total_blocks: int, watermark_blocks: int,
                   bt: int) -> str:
    """One line: how many requests can never fit the KV pool, and the largest one's tokens against
    the pool's (a sequence holds its prompt, its output and the slot of the token being computed)."""
    idx = np.flatnonzero(mask)
    j = idx[np.argmax(inp[idx] + out[idx])]
    pool = (total_blocks - watermark_blocks) * bt
    held = f" ({watermark_blocks * bt:,} held back by the watermark)" if watermark_blocks else ""
    return (f"{len(idx)} of {len(mask)} requests can never fit the KV pool: the largest needs "
            f"{int(inp[j]) + int(out[j]) + 1:,} tokens (prompt {int(inp[j]):,} + output {int(out[j]):,} + 1) "
            f"against {pool:,} pool tokens{held}")
