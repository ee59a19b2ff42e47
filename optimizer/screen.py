"""Fast analytic screen of one replica: does it fit, can it meet the SLOs, and an upper bound of
its goodput. Microseconds per config, so the search can afford it for every trial; the simulator
checks the front-runners.

Steady state of one replica running ``B`` sequences at once (a fluid model, no queueing):

    decode context   ctx  = mean input + mean output / 2        (a sequence is half-way through)
    prefill per step p(B) = B x tokens_per_step x P / O        (P: uncached prompt tokens, O: output)
    step time        t(B) = StepModel.breakdown(B decodes over B x ctx, p(B) prefill tokens)
    TPOT(B)               = t(B) / tokens_per_step
    goodput bound    X(B) = B x tokens_per_step / (O x t(B))   requests per second

``B`` grows until one of these binds: the batch cap, the KV pool (B x ctx tokens), the chunk
budget (p(B) + decode tokens <= chunk_tokens), or the SLOs: a request meets them when its TPOT
and its TTFT under load, ceil(L / free chunk) mixed steps, are within its targets, and the
share of requests that do must reach the attainment target. X at that batch bounds the
replica's goodput from above (queueing only lowers it).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from kvtune.costmodel.requests import Requests
from kvtune.costmodel.step import StepCost, StepModel

__all__ = ["WorkloadStats", "Screen", "screen"]

_N_LEN_POINTS = 24  # prompt lengths at which TTFT is evaluated, then interpolated per request


@dataclass(frozen=True)
class WorkloadStats:
    """What the screen needs from a request sample, computed once per solve."""

    mean_input_tokens: float
    mean_output_tokens: float
    mean_prefill_tokens: float        # uncached prompt tokens (prefix-cache hits removed)
    prefill_pairs_per_token: float    # attention (query, key) pairs per prefill token
    prefix_read_per_token: float      # cached prefix tokens read per prefill token
    long_input_tokens: float          # prompt length at the attainment quantile
    len_grid: np.ndarray              # prompt lengths where TTFT is evaluated
    todo_tokens: np.ndarray           # per request: uncached prompt tokens
    ttft_slo_s: np.ndarray
    tpot_slo_s: np.ndarray
    attainment: float

    @classmethod
    def from_requests(cls, req: Requests, attainment: float) -> "WorkloadStats":
        inp = req.input_tokens.astype(float)
        out = req.output_tokens.astype(float)
        # a prefix group's first request pays for the prefix; later ones hit the cache
        first = np.ones(len(req), dtype=bool)
        grp = req.prefix_group
        shared = grp >= 0
        if shared.any():
            _, idx = np.unique(grp[shared], return_index=True)
            first[shared] = False
            first[np.flatnonzero(shared)[idx]] = True
        cached = np.where(first, 0.0, req.prefix_tokens.astype(float))
        todo = inp - cached
        p_mean = float(todo.mean())
        pairs = float((todo * (todo + 1) / 2 + todo * cached).sum() / max(todo.sum(), 1.0))
        lens = np.unique(np.geomspace(max(todo.min(), 1), max(todo.max(), 1), _N_LEN_POINTS).round())
        return cls(
            mean_input_tokens=float(inp.mean()), mean_output_tokens=float(out.mean()),
            mean_prefill_tokens=p_mean, prefill_pairs_per_token=pairs,
            prefix_read_per_token=float((todo * cached).sum() / max(todo.sum(), 1.0)),
            long_input_tokens=float(np.quantile(inp, attainment)), len_grid=lens,
            todo_tokens=todo, ttft_slo_s=req.ttft_slo_s.astype(float),
            tpot_slo_s=req.tpot_slo_s.astype(float), attainment=attainment)


@dataclass(frozen=True)
class Screen:
    fits: bool
    feasible: bool                # meets the SLOs at some batch >= 1
    batch: int                    # operating concurrency
    batch_limit: str              # batch_cap | kv_pool | chunk | tpot | ttft
    goodput_req_s: float          # per replica, an upper bound; 0 when infeasible
    tpot_ms: float                # at the operating batch (mean)
    tpot_batch1_ms: float
    ttft_ms: float                # the attainment-quantile prompt, at the operating batch
    ttft_zero_load_ms: float      # the attainment-quantile prompt alone
    slo_share: float              # share of requests meeting both SLOs at the operating batch (batch 1 if infeasible)
    slo_shortfall: float          # attainment - share at batch 1 (> 0: infeasible)
    pool_tokens: int
    bottleneck: str               # kv_pool | bandwidth | compute | prefill
    detail: dict = field(default_factory=dict)
    reason: str = ""


def _ttft_grid(step: StepCost, w: WorkloadStats, n_decode: int, chunk_tokens: int) -> np.ndarray:
    """TTFT of prompts of ``w.len_grid`` uncached tokens: ceil(L / free chunk) mixed steps of an
    average chunk, ``n_decode`` other sequences' decodes riding along. Attention pairs and KV
    reads are linear in the prior tokens, so the average chunk is exact for them."""
    ctx = w.mean_input_tokens + w.mean_output_tokens / 2
    free = max(chunk_tokens - n_decode * step.verify_tokens_per_seq, 1)
    L = w.len_grid
    n_ch = np.ceil(L / free)
    n = L / n_ch
    return step.request_overhead_s + np.array([
        k * step.step_time_s(n_decode, n_decode * ctx, m, StepModel.chunk_pairs(m, (ln - m) / 2), (ln - m) / 2)
        for k, m, ln in zip(n_ch.tolist(), n.tolist(), L.tolist())])  # floats: IEEE arithmetic as numpy's, faster


def _lumpy_step_s(step: StepCost, w: WorkloadStats, b: int, chunk_tokens: int, t0_s: float,
                  riders: float | None = None) -> float:
    """Mean step time when prompts arrive whole: each request's prefill rides on ceil(L / free
    chunk) steps of the ``b`` decodes, and each such step costs t(b, chunk) instead of t0.

        mean step = t0 + (b x tokens_per_step / O) x mean over requests of sum over its chunks (t(b, m) - t0)

    (b x tokens_per_step / O requests finish, so arrive, per step.) Step time is a max of memory
    and compute terms, so a chunk small enough hides under the memory-bound decode and a large one
    does not; the fluid model spreads every prompt thinly and misses this. Charging each chunk
    alone still underestimates steps that carry several (the excess is superadditive), so both are
    lower bounds on the mean step and the screen takes the larger."""
    ctx = w.mean_input_tokens + w.mean_output_tokens / 2
    free = max(chunk_tokens - b * step.verify_tokens_per_seq, 1)
    L = w.len_grid
    n_ch = np.ceil(L / free)
    m = L / n_ch
    extra = np.array([k * (step.step_time_s(b, b * ctx, mm, StepModel.chunk_pairs(mm, (ll - mm) / 2), (ll - mm) / 2) - t0_s)
                      for k, mm, ll in zip(n_ch.tolist(), m.tolist(), L.tolist())])  # floats, as in _ttft_grid
    per_req = float(np.interp(w.todo_tokens, L, extra).mean())
    return t0_s + (b if riders is None else riders) * step.tokens_per_step / w.mean_output_tokens * max(per_req, 0.0)


def _cached(memo: dict | None, key: tuple, fn: Callable[[], Any]) -> Any:
    """``fn()``, remembered in ``memo`` under ``key`` (every value here is a function of the step
    model, the workload statistics and the key alone; None: nothing remembered)."""
    if memo is None:
        return fn()
    if key not in memo:
        memo[key] = fn()
    return memo[key]


def _at_batch(step: StepCost, w: WorkloadStats, b: int, chunk_tokens: int, cap: int | None = None,
              memo: dict | None = None):
    """Step time, TPOT, per-request TTFT and SLO share at ``b`` concurrent sequences.

    A sequence's TPOT carries the prompts prefilled beside its decode steps: b per lifetime
    while the cap leaves room (the arrivals during it join at once), b - 1 when ``b`` is the
    ``cap``: a waiting prompt then starts only when a sequence leaves, so it rides with the
    b - 1 others, and at cap 1 no prompt ever rides with a decode (the simulator's and
    llama.cpp's behaviour with one slot). The step time, and so the goodput bound, still
    carries every prompt. ``memo``: the mean steps and TTFT grids already computed for this step
    model and workload (configs that differ only in the batch cap share them)."""
    bd = _cached(memo, ("mean_step", b, chunk_tokens, b), lambda: _mean_step(step, w, b, chunk_tokens, b))
    tpot_s = bd.time_s / step.tokens_per_step
    if cap is not None and b >= cap:
        tpot_s = _cached(memo, ("mean_step", b, chunk_tokens, b - 1),
                         lambda: _mean_step(step, w, b, chunk_tokens, b - 1)).time_s / step.tokens_per_step
    ttft = np.interp(w.todo_tokens, w.len_grid,
                     _cached(memo, ("ttft_grid", b - 1, chunk_tokens), lambda: _ttft_grid(step, w, b - 1, chunk_tokens)))
    met = (ttft <= w.ttft_slo_s) & (tpot_s <= w.tpot_slo_s)
    p = b * step.tokens_per_step * w.mean_prefill_tokens / w.mean_output_tokens
    return bd, tpot_s, ttft, float(met.mean()), p + b * step.verify_tokens_per_seq


def _mean_step(step: StepCost, w: WorkloadStats, b: int, chunk_tokens: int, riders: float):
    """The mean step of ``b`` decoding sequences with ``riders`` prompts prefilled per
    sequence lifetime (fluid, then lumpy: the larger)."""
    tps, q = step.tokens_per_step, step.verify_tokens_per_seq
    ctx = w.mean_input_tokens + w.mean_output_tokens / 2
    p = riders * tps * w.mean_prefill_tokens / w.mean_output_tokens
    bd = step.breakdown(b, b * ctx, p, p * w.prefill_pairs_per_token, p * w.prefix_read_per_token)
    pf_s = step.prefill_overhead_s
    if pf_s and p > 0:
        # the fluid step spreads prompts over every step, but only the steps that carry a chunk pay
        # the prefill overhead: b x tokens_per_step / O requests arrive per step, each in its chunks
        free = max(chunk_tokens - b * q, 1)
        chunks = float(np.interp(w.todo_tokens, w.len_grid, np.ceil(w.len_grid / free)).mean())
        carrying = min(1.0, riders * tps / w.mean_output_tokens * chunks)
        bd = dataclasses.replace(bd, time_s=bd.time_s - pf_s * (1.0 - carrying),
                                 overhead_s=bd.overhead_s - pf_s * (1.0 - carrying))
    lumpy_s = _lumpy_step_s(step, w, b, chunk_tokens, step.step_time_s(b, b * ctx), riders)
    if lumpy_s > bd.time_s:
        bd = dataclasses.replace(bd, time_s=lumpy_s)
    return bd


def screen(step: StepCost, w: WorkloadStats, batch_cap: int, chunk_tokens: int, memo: dict | None = None) -> Screen:
    """One config screened: its operating batch and goodput bound, or why it cannot serve.
    ``memo``: a dict kept per (step model, workload statistics) across configs (``search.evaluate``
    keeps one per step model): what configs that differ only in batch cap or chunk budget share is
    computed once (the same figures, bit for bit)."""
    def at(b: int):
        # _at_batch depends on the cap only through whether b reaches it
        return _cached(memo, ("at_batch", b, chunk_tokens, b >= batch_cap),
                       lambda: _at_batch(step, w, b, chunk_tokens, batch_cap, memo))
    pool = step.memory.kv_pool_tokens
    hold = w.mean_input_tokens + w.mean_output_tokens / 2  # KV a running sequence holds on average
    b_pool = int(pool // hold)
    limits = {"batch_cap": batch_cap, "kv_pool": b_pool}
    b_max = min(batch_cap, b_pool)
    q = step.verify_tokens_per_seq
    b_chunk = int(chunk_tokens // (q + step.tokens_per_step * w.mean_prefill_tokens / w.mean_output_tokens))
    limits["chunk"] = b_chunk
    bd1, tpot1, ttft1, share1, _ = at(1)
    zero = float(np.quantile(np.interp(w.todo_tokens, w.len_grid, _cached(
        memo, ("ttft_grid", 0, chunk_tokens), lambda: _ttft_grid(step, w, 0, chunk_tokens))), w.attainment))
    common = dict(pool_tokens=pool, tpot_batch1_ms=tpot1 * 1e3, ttft_zero_load_ms=zero * 1e3)
    if b_pool < 1:
        return Screen(fits=False, feasible=False, batch=0, batch_limit="kv_pool", goodput_req_s=0.0,
                      tpot_ms=tpot1 * 1e3, ttft_ms=float(np.quantile(ttft1, w.attainment)) * 1e3,
                      slo_share=share1, slo_shortfall=w.attainment, bottleneck="kv_pool", reason=(
                          f"KV pool holds {pool:,} tokens, less than one sequence of {hold:,.0f}"),
                      detail={"limits": limits}, **common)
    if share1 < w.attainment:
        # the step terms at batch 1 go with it, so the bottleneck line has numbers to show
        return Screen(fits=True, feasible=False, batch=1, batch_limit=_slo_binding(w, tpot1, ttft1),
                      goodput_req_s=0.0, tpot_ms=tpot1 * 1e3, ttft_ms=float(np.quantile(ttft1, w.attainment)) * 1e3,
                      slo_share=share1, slo_shortfall=w.attainment - share1, bottleneck=_slo_binding(w, tpot1, ttft1),
                      reason=_miss_reason(step, w, tpot1, ttft1),
                      detail=_detail(step, w, bd1, limits, pool, 1, hold), **common)
    # largest b <= hard limits meeting the SLO share (monotone: more sequences, slower steps)
    hard = max(1, min(b_max, b_chunk))
    lo, hi = 1, hard
    best = (bd1, tpot1, ttft1, share1)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        r = at(mid)
        if r[3] >= w.attainment:
            lo, best = mid, r[:4]
        else:
            hi = mid - 1
    b = lo
    bd, tpot_s, ttft, share = best
    if b < hard:
        slo_limit = _slo_binding(w, *at(b + 1)[1:3])
        limit = slo_limit
    else:
        limit = min(("batch_cap", "kv_pool", "chunk"), key=lambda k: limits[k])
    x = b * step.tokens_per_step / (w.mean_output_tokens * bd.time_s)
    if limit == "kv_pool":
        bottleneck = "kv_pool"
    elif limit in ("chunk", "ttft"):
        bottleneck = "prefill"
    else:
        bottleneck = bd.bound
    detail = _detail(step, w, bd, limits, pool, b, hold)
    return Screen(fits=True, feasible=True, batch=b, batch_limit=limit, goodput_req_s=x, tpot_ms=tpot_s * 1e3,
                  ttft_ms=float(np.quantile(ttft, w.attainment)) * 1e3, slo_share=share, slo_shortfall=0.0, bottleneck=bottleneck, detail=detail, **common)


def _detail(step: StepCost, w: WorkloadStats, bd, limits: dict, pool: int, b: int, hold: float) -> dict:
    """The step terms at the operating batch ``b`` (what the bottleneck line shows)."""
    return {"limits": limits, "step_ms": bd.time_s * 1e3, "mem_ms": bd.mem_s * 1e3,
            "compute_ms": bd.compute_s * 1e3, "comm_ms": bd.comm_s * 1e3,
            "kv_pool_tokens": pool, "kv_tokens_held": b * hold,
            "kv_pool_used": b * hold / pool, "prefill_tokens_per_step": b * step.tokens_per_step
            * w.mean_prefill_tokens / w.mean_output_tokens}


def _slo_binding(w: WorkloadStats, tpot_s: float, ttft: np.ndarray) -> str:
    """Which SLO fails for more requests: ``ttft`` or ``tpot``."""
    miss_ttft = float((ttft > w.ttft_slo_s).mean())
    miss_tpot = float((tpot_s > w.tpot_slo_s).mean())
    return "ttft" if miss_ttft >= miss_tpot else "tpot"


def _miss_reason(step: StepCost, w: WorkloadStats, tpot_s: float, ttft: np.ndarray) -> str:
    a = w.attainment
    pct = f"p{a * 100:g}"
    t_q = float(np.quantile(ttft, a))
    if _slo_binding(w, tpot_s, ttft) == "ttft":
        slo = float(np.quantile(w.ttft_slo_s, 1 - a)) if len(w.ttft_slo_s) else math.inf
        return (f"TTFT {pct} {_fmt_s(t_q)} > {_fmt_s(slo)}: prefill of {w.long_input_tokens / 1e3:,.0f}k-token "
                f"prompts is {step.breakdown(0, 0, 8192, StepModel.chunk_pairs(8192, w.long_input_tokens / 2)).bound} "
                f"bound even alone at TP {step.tp}")
    slo = float(np.quantile(w.tpot_slo_s, 1 - a))
    bd = step.decode_step(1, w.mean_input_tokens + w.mean_output_tokens / 2)
    return (f"TPOT {tpot_s * 1e3:.1f} ms > {slo * 1e3:.1f} ms even at batch 1: one decode step is "
            f"{bd.bound} bound ({bd.time_s * 1e3:.1f} ms) at TP {step.tp}")


def _fmt_s(t: float) -> str:
    return f"{t * 1e3:.0f} ms" if t < 1 else f"{t:.1f} s"
