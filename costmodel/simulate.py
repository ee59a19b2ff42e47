"""Serving simulator: one replica, event driven, scheduled the way its engine schedules.

This module prepares the requests (arrival order, speculative verify steps drawn by
``costmodel.speculation``, rejections) and turns
the replica's times into results (``SimResult``); ``costmodel.replica`` is the replica's state and
step loop, and ``costmodel.engines`` the engines' scheduling and admission policies (vLLM V1's
mixed chunked prefill below; SGLang's prefill-first batches and output reserve are its
``PrefillFirst`` and ``OutputReserveAdmission``).

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
sampled up front, one draw per verify step, or from the renewal central limit theorem past
``costmodel.speculation.SPEC_CLT_TOKENS`` output tokens, so completion times are random as in the engine, but the
context between completions grows linearly); requests whose prompt plus output cannot fit in the pool at all are
rejected (never served, they miss the SLO and count in ``rejected``).

Warm-up: with Poisson/trace and closed-loop arrivals the first ``warmup_frac`` (default 10%) of
requests, in arrival order, see a filling system and are excluded from the latency statistics and
from SLO attainment (their tokens still count in throughput). With ``arrival="inf"`` (the offline
benchmark) nothing is excluded by default. Per-request arrays in ``SimResult`` cover every request;
``measured`` says which ones the statistics use.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from .engines import admission_for, scheduling_for
from .engines.policies import (RESERVE_CLIP_TOKENS, RESERVE_RATIO_DECAY_PER_STEP, RESERVE_RATIO_INIT,  # noqa: F401
                               RESERVE_RATIO_MIN, RESERVE_RETRACT_STEPS)
from .errors import InputError
from .memory import BLOCK_TOKENS
from .replica import Replica, ReplicaInputs
from .requests import Requests
from .speculation import verify_passes
from .step import StepCost

__all__ = ["SimConfig", "SimResult", "simulate", "simulate_fleet", "build_result", "ARRIVAL_MODES",
           "default_warmup_frac"]

ARRIVAL_MODES = ("trace", "inf", "closed")

# SGLang's output reservation constants (RESERVE_*) live with its admission policy,
# costmodel.engines.policies; imported above for the callers that read them here


def default_warmup_frac(arrival: str) -> float:
    """Share of requests (first in arrival order) left out of latency statistics by default."""
    return 0.0 if arrival == "inf" else 0.1


@dataclass(frozen=True)
class SimConfig:
    batch_cap: int                 # max running sequences (vLLM max_num_seqs)
    chunk_tokens: int = 8192       # per-step token budget (vLLM max_num_batched_tokens)
    block_tokens: int = BLOCK_TOKENS  # KV block size (costmodel.memory)
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


def simulate(step: StepCost, requests: Requests, config: SimConfig, arrival: str = "trace",
             concurrency: int | None = None, seed: int = 0, warmup_frac: float | None = None) -> SimResult:
    """Simulate one replica serving ``requests``.

    ``arrival``: "trace" (Poisson or replayed: ``requests.arrival_s``), "inf" (all at t=0: the
    offline benchmark) or "closed" (``concurrency`` clients, each sending its next request, in
    order, when its previous one completes; client ``i`` sends its first request at
    ``requests.arrival_s[i]``: all zeros is a cold-start burst, spread times a staggered start). ``seed`` drives speculative acceptance only.
    ``warmup_frac``: share of requests excluded from the statistics (default: see module doc).
    """
    return simulate_replica(step, requests, config, arrival, concurrency, seed, warmup_frac, naive=False)


def simulate_fleet(step: StepCost, make_requests: Callable[[float, int, int], Requests], config: SimConfig,
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
    r = simulate_replica(step, reqs, config, arrival, conc, seed, warmup_frac, naive=False)
    return SimResult(**{**r.__dict__, "output_tok_s": r.output_tok_s * replicas,
                        "request_s": r.request_s * replicas, "replicas": int(replicas)})


def simulate_replica(step: StepCost, requests: Requests, config: SimConfig, arrival: str,
                     concurrency: int | None, seed: int, warmup_frac: float | None, naive: bool,
                     kv_ready: np.ndarray | None = None) -> SimResult:
    """``simulate``; ``naive``: one step at a time (no closed form); ``kv_ready`` (a decode replica
    of a disaggregated deployment, ``costmodel.deployment``): True where the request's prompt KV
    arrives computed, so it starts decoding when admitted, its first token with it."""
    wall0 = time.perf_counter()
    if not step.closed_form_ok:
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
        assert concurrency is not None  # checked above for arrival "closed"
        k0 = min(int(concurrency), n)
        starts = requests.arrival_s[:k0].astype(float)
        if k0 and starts.max() > 0:
            if (np.diff(starts) < 0).any() or starts.min() < 0:
                raise InputError("closed loop: the clients' start times (first arrival_s) must be >= 0 and non-decreasing")
            arr[:k0] = starts.tolist()
            n_trace = k0
    if step.speculation is not None:
        nsteps_a = verify_passes(out_a, step.speculation, seed)
        gain_a = np.where(nsteps_a > 0, (out_a - 1) / np.maximum(nsteps_a, 1), 0.0)
    else:
        nsteps_a = np.maximum(out_a - 1, 0)
        gain_a = np.ones(n)
    nsteps, gain = nsteps_a.tolist(), gain_a.tolist()

    bt = int(config.block_tokens)
    total_blocks = int(config.kv_pool_tokens or step.memory.kv_pool_tokens) // bt
    watermark_blocks = int(config.watermark_frac * total_blocks)
    # too large for the whole pool: prompt + output (+ the slot being computed) in blocks
    rejected_mask = -(-(inp_a + out_a + 1) // bt) > total_blocks - watermark_blocks
    rejected = rejected_mask.tolist()
    any_rejected = bool(rejected_mask.any())
    reject_reason = _reject_reason(inp_a, out_a, rejected_mask, total_blocks, watermark_blocks, bt) if any_rejected else ""

    x = ReplicaInputs(inp=inp, out=out, pre=pre, grp=grp, arr=arr, nsteps=nsteps, gain=gain, rejected=rejected,
                      n_trace=n_trace, clients=k0 if arrival == "closed" else 0, all_at_once=arrival == "inf",
                      kv_ready=None if kv_ready is None else np.asarray(kv_ready, dtype=bool)[order].tolist())
    r = Replica(step, x, batch_cap=config.batch_cap, chunk_tokens=config.chunk_tokens,
                block_tokens=config.block_tokens, prefix_caching=config.prefix_caching, total_blocks=total_blocks,
                watermark_blocks=watermark_blocks, scheduling=scheduling_for(config.prefill_first),
                admission=admission_for(config.output_reserve), naive=naive)
    r.run()
    arr_t, first_t, fin_t = x.arr, r.first_t, r.fin_t
    preemptions, gstep, events = r.preemptions, r.gstep, r.events

    # ---- results (back in the caller's order) ----------------------------------------------------
    inv = np.empty(n, dtype=np.int64)
    inv[order] = np.arange(n)
    front_s = float(step.request_overhead_s)
    return build_result(requests, np.asarray(arr_t)[inv], np.asarray(first_t)[inv], np.asarray(fin_t)[inv],
                        rejected_mask[inv], front_s, warmup_frac, arrival, preemptions, gstep, events, wall0,
                        reject_reason)


def build_result(requests: Requests, arr_s: np.ndarray, first: np.ndarray, fin: np.ndarray, rej: np.ndarray,
                 front_s: float, warmup_frac: float, arrival: str, preemptions: int, steps: int, events: int,
                 wall0: float, reject_reason: str) -> SimResult:
    """A ``SimResult`` from each request's arrival, first-token and finish times (engine clock, in
    the caller's order), the rejected ones and ``front_s``, the front end's share of every request
    (HTTP, tokenizing, streaming the first token) outside the engine's steps."""
    n = len(arr_s)
    first = first.copy()
    fin = fin.copy()
    first[rej] = math.inf
    fin[rej] = math.inf
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
        output_tok_s=out_tok_s, request_s=req_s, slo_attainment=att, steps=steps, events=events,
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
