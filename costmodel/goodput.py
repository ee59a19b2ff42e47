"""Goodput: the highest Poisson arrival rate one replica serves with SLO attainment at target.

Attainment (the share of measured requests meeting both TTFT and TPOT targets) falls as the rate
rises. ``goodput`` brackets the crossing and bisects it:

1. zero load: a tiny rate (1e-3 x the analytic bound). If attainment already misses the target
   the answer is 0 req/s with the reason (which term, at which percentile, against which target);
2. upper bracket: the analytic decode-limited throughput at the largest batch the cap and the KV
   pool allow, ``B x tokens_per_step / (T(B) x mean output)`` req/s (prefill and queueing only
   lower it): ``upper_bound_req_s``. No rate above it is probed or reported. If the target still
   holds there (loose SLOs: a finite run finishes every request in time even when overloaded),
   the goodput is a throughput limit, not an SLO one: the rate the engine sustains with every
   request queued (an offline run of the same requests, its middle 60% of completions), capped
   by the bound, once the target is checked at that rate (``capacity_limited``);
3. bisection, geometric while the bracket spans more than a factor 2, then arithmetic, until
   ``hi - lo <= rel_tol x lo``. The answer is ``lo``, the highest rate seen to meet the target.

Requests that can never fit the KV pool are never served and miss at every rate: when they alone
keep attainment below the target the answer is 0 req/s with their reason.

With a ``guess_req_s`` (an estimate of the answer, e.g. the optimizer's analytic screen) the
bracket starts narrow instead: ``GUESS_LO`` x guess is tried first (meets: it is the lower end and
no zero-load probe is needed; misses: steps 1-3 run below it), then ``GUESS_HI`` x guess, grown by
x1.25 until it misses (never above the bound). A good guess saves the zero-load probe and the geometric phase.

Every rate uses the same seed: ``make_requests(rate, n, seed)`` should draw the same requests with
arrival times scaled by 1/rate (common random numbers; ``costmodel.traffic`` does), so the
attainment curve is monotone up to scheduling noise and the bisection compares like with like.

How many requests: with attainment target ``a`` the misses allowed are the ``1 - a`` tail; to
place that tail's edge we want at least ~100 measured requests in it, so the measured count must
be ``>= 100 / (1 - a)`` and, with the default 10% warm-up excluded, ``n >= 100 / ((1 - a) x 0.9)``:
1,112 requests at a = 0.9, 2,223 at 0.95, 11,112 at 0.99; never fewer than 1,000 (so the run
spans many service times and queues reach their load) and at most 20,000 (a = 1 and beyond 0.995:
the tail is then a handful of requests and the answer is noisier; pass ``n_requests`` to choose).

The run must also outlast the in-flight set several times: if the KV pool and batch cap admit B
sequences at once, fewer than a few x B requests are all admitted on arrival and never queue, so
an overload would go unseen. ``goodput`` therefore uses at least ``RUNS_PER_SLOT`` (5) x B
requests, B = min(batch cap, pool tokens / (mean input + mean output)).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Callable

import numpy as np

from .errors import InputError
from .requests import Requests
from .simulate import SimConfig, SimResult, default_warmup_frac, simulate
from .step import StepCost

__all__ = ["GoodputResult", "goodput", "default_n_requests", "capacity_bound_req_s", "completion_rate_req_s"]

_TAIL_REQUESTS = 100      # measured requests wanted in the allowed-miss tail
_MIN_REQUESTS = 1000
_MAX_REQUESTS = 20000
RUNS_PER_SLOT = 5         # requests per concurrency slot the pool and cap allow
GUESS_LO, GUESS_HI = 0.85, 1.05  # first bracket around a guess (kvtune's screen lands within it mostly)
GUESS_STEP_DOWN = 0.75    # below a guess that misses, try rates this much lower
SATURATED_WINDOW = (0.2, 0.8)  # completions of an offline run that measure its steady throughput
GUESS_STEPS_DOWN = 6      # ... this many times before falling back to the zero-load probe


def _logit(a: float, n_measured: int) -> float:
    """logit of an attainment, clipped half a request from 0 and 1. Attainment against load is
    sigmoid-like, so the crossing is interpolated linearly in logit(attainment)."""
    eps = 0.5 / n_measured
    a = min(max(a, eps), 1 - eps)
    return math.log(a / (1 - a))


def default_n_requests(attainment: float, warmup_frac: float = default_warmup_frac("trace"),
                       max_concurrency: int = 0) -> int:
    """Requests per simulation so that the allowed-miss tail holds >= 100 measured requests and
    the run outlasts ``max_concurrency`` in-flight sequences ``RUNS_PER_SLOT`` times."""
    if not 0 < attainment <= 1:
        raise InputError(f"attainment must be in (0, 1], got {attainment!r}")
    if attainment >= 1:
        return _MAX_REQUESTS
    n = math.ceil(_TAIL_REQUESTS / ((1 - attainment) * (1 - warmup_frac)) - 1e-9)
    n = max(n, RUNS_PER_SLOT * max(int(max_concurrency), 0))
    return int(min(max(n, _MIN_REQUESTS), _MAX_REQUESTS))


def capacity_bound_req_s(step: StepCost, mean_input_tokens: float, mean_output_tokens: float,
                         batch_cap: int, mean_shared_tokens: float = 0.0, kv_pool_tokens: int | None = None) -> float:
    """Decode-limited throughput at the largest batch the cap and pool allow (an upper bound).

    A sequence is half-way through on average: context = input + output / 2; the pool holds
    pool_tokens / (context - shared) of them (``mean_shared_tokens``: prefix-cached tokens a
    sequence reads but does not hold), the cap at most ``batch_cap``. Throughput in requests per
    second is B x tokens_per_step / (T(B) x output): every request needs output / tokens_per_step
    verify steps, each shared by B sequences. Prefill steps and queueing can only lower it.
    ``kv_pool_tokens``: the pool the simulator runs with (``SimConfig.kv_pool_tokens``), if not
    the step model's.
    """
    pool = kv_pool_tokens or step.memory.kv_pool_tokens
    ctx = max(mean_input_tokens + mean_output_tokens / 2.0, 1.0)
    own = max(ctx - max(float(mean_shared_tokens), 0.0), 1.0)
    b = max(1, min(int(batch_cap), int(pool // own)))
    t = step.step_time_s(b, b * ctx)
    return b * step.tokens_per_step / (t * max(mean_output_tokens, 1.0))


@dataclass(frozen=True)
class GoodputResult:
    goodput_req_s: float              # highest rate found to meet the target (0: none does)
    attainment: float                 # measured attainment at that rate
    target_attainment: float
    summary: dict                     # SimResult.summary() at that rate (zero-load probe when 0)
    iterations: int                   # simulations run
    bracket: tuple[float, float]      # final (meets, misses) rates, req/s
    rel_tol: float
    n_requests: int
    upper_bound_req_s: float          # the analytic starting bound
    reason: str = ""                  # why the goodput is 0 (empty otherwise)
    history: tuple = field(default=())  # ((rate_req_s, attainment), ...) in the order probed
    # the SLOs still held at the highest rate allowed (the capacity bound, or the simulator's
    # saturated throughput when that is lower): the goodput is a throughput limit
    capacity_limited: bool = False
    saturated_req_s: float | None = None  # offline throughput of the same requests (when it was needed)
    limit: str = ""                       # what ended the search: "slo", "throughput: ..." or ""

    def to_dict(self) -> dict:
        return {"goodput_req_s": self.goodput_req_s, "attainment": self.attainment,
                "target_attainment": self.target_attainment, "iterations": self.iterations,
                "bracket_req_s": list(self.bracket), "rel_tol": self.rel_tol, "n_requests": self.n_requests,
                "upper_bound_req_s": self.upper_bound_req_s, "reason": self.reason,
                "capacity_limited": self.capacity_limited, "saturated_req_s": self.saturated_req_s,
                "limit": self.limit, "history": [list(h) for h in self.history], "at_goodput": self.summary}


def completion_rate_req_s(res: SimResult) -> float:
    """Requests per second a run completed over its middle completions (``SATURATED_WINDOW``): the
    fill at the start and the drain at the end are left out. Of an offline run (every request
    queued) it is the saturated throughput; of a Poisson run it is about the arrival rate while the
    engine keeps up and about the saturated throughput when it does not."""
    served = ~np.isinf(res.ttft_s)
    fin = np.sort((res.arrival_s + res.e2e_s)[served]) if res.arrival_s is not None else np.sort(res.e2e_s[served])
    k1, k2 = int(SATURATED_WINDOW[0] * len(fin)), int(SATURATED_WINDOW[1] * len(fin))
    if k2 - k1 < 2 or not fin[k2 - 1] > fin[k1]:
        return float(res.request_s)
    return float((k2 - 1 - k1) / (fin[k2 - 1] - fin[k1]))


def _zero_load_reason(res: SimResult, req: Requests, attainment: float) -> str:
    m = res.measured & ~np.isinf(res.ttft_s)  # latencies of the served requests
    ttft, tpot = res.ttft_s[m], res.tpot_s[m]
    miss_ttft = ~(ttft <= req.ttft_slo_s[m])
    miss_tpot = (req.output_tokens[m] > 1) & ~(tpot <= req.tpot_slo_s[m])
    q = 100 * attainment
    parts = []
    if miss_ttft.mean() > 0:
        parts.append(f"TTFT at zero load: p{q:g} {np.percentile(ttft, q) * 1e3:.0f} ms (prefill) vs target "
                     f"{np.median(req.ttft_slo_s[m]) * 1e3:.0f} ms; {miss_ttft.mean():.0%} of requests miss it")
    if miss_tpot.mean() > 0:
        tp = tpot[~np.isnan(tpot)]
        parts.append(f"TPOT at zero load: p{q:g} {np.percentile(tp, q) * 1e3:.1f} ms (batch-1 decode step) vs target "
                     f"{np.median(req.tpot_slo_s[m]) * 1e3:.1f} ms; {miss_tpot.mean():.0%} of requests miss it")
    if res.rejected:
        parts.append(res.reject_reason)
    return "; ".join(parts) or f"attainment {res.slo_attainment:.3f} below {attainment:g} at zero load"


def goodput(step: StepCost, make_requests: Callable[[float, int, int], Requests], config: SimConfig,
            attainment: float, n_requests: int | None = None, seed: int = 0, rel_tol: float = 0.02,
            warmup_frac: float | None = None, max_iterations: int = 40,
            guess_req_s: float | None = None, *, sim: Callable[[Requests, str, float], SimResult] | None = None,
            upper_bound_req_s: float | None = None) -> GoodputResult:
    """Highest Poisson rate (req/s, one replica) at which SLO attainment stays >= ``attainment``.

    ``make_requests(rate_req_s, n, seed)`` draws the requests (the same seed at every rate). See
    the module docstring for the bracketing, the tolerance and ``n_requests`` (default
    ``default_n_requests(attainment)``) and ``guess_req_s`` (a starting bracket).
    ``sim(requests, arrival, warmup_frac)`` simulates something other than one replica of
    ``step`` (a disaggregated deployment: ``costmodel.deployment``), with ``upper_bound_req_s``
    its capacity bound.
    """
    if not 0 < attainment <= 1:
        raise InputError(f"attainment must be in (0, 1], got {attainment!r}")
    if not 0 < rel_tol < 1:
        raise InputError(f"rel_tol must be in (0, 1), got {rel_tol!r}")
    wf = default_warmup_frac("trace") if warmup_frac is None else warmup_frac
    probe = make_requests(1.0, n_requests or _MIN_REQUESTS, seed)
    pool = config.kv_pool_tokens or step.memory.kv_pool_tokens
    # the bound is over the requests that can be served: those that fit the pool at all
    blocks = pool // config.block_tokens
    fits = (-(-(probe.input_tokens + probe.output_tokens + 1) // config.block_tokens)
            <= blocks - int(config.watermark_frac * blocks))
    if fits.all():
        mean_in, mean_out = float(probe.input_tokens.mean()), float(probe.output_tokens.mean())
    elif fits.any():
        mean_in, mean_out = float(probe.input_tokens[fits].mean()), float(probe.output_tokens[fits].mean())
    else:
        mean_in, mean_out = float(probe.input_tokens.mean()), float(probe.output_tokens.mean())
    if n_requests is None:
        slots = min(config.batch_cap, int(step.memory.kv_pool_tokens // max(mean_in + mean_out, 1.0)))
        n = default_n_requests(attainment, wf, slots)
    else:
        n = int(n_requests)
    if n < 1:
        raise InputError(f"n_requests must be >= 1, got {n_requests!r}")
    history: list[tuple[float, float]] = []
    shared = (float(np.where(probe.prefix_group >= 0, probe.prefix_tokens, 0)[fits].mean())
              if config.prefix_caching and fits.any() else 0.0)
    ub = (capacity_bound_req_s(step, mean_in, mean_out, config.batch_cap, shared, config.kv_pool_tokens)
          if upper_bound_req_s is None else float(upper_bound_req_s))
    search = _Search(attainment, rel_tol, n, ub, history)

    def run(rate: float) -> tuple[SimResult, Requests]:
        req = make_requests(rate, n, seed)
        res = (simulate(step, req, config, "trace", seed=seed, warmup_frac=wf) if sim is None
               else sim(req, "trace", wf))
        history.append((rate, res.slo_attainment))
        if res.rejected:
            best = _best_attainment(res)
            if best < attainment:  # requests that never fit miss at every rate
                raise _Unreachable(search.result(
                    0.0, res, (0.0, rate),
                    reason=f"{res.reject_reason}: at most {best:.3f} of the measured requests can meet the SLOs at "
                           f"any rate, below the target {attainment:g}"))
        return res, req

    def saturated() -> float:
        """Requests per second the engine completes with every request queued (an offline run of
        the same requests), over its middle completions: the fill at the start and the drain at the
        end, when the batch is not full, are left out."""
        req = make_requests(math.inf, n, seed)
        res = (simulate(step, req, config, "inf", seed=seed, warmup_frac=0.0) if sim is None
               else sim(req, "inf", 0.0))
        return completion_rate_req_s(res)

    try:
        out = _bisect(run, saturated, search, wf, max_iterations, guess_req_s)
        # the offline run that measured the saturated throughput counts as a simulation too
        return out if out.saturated_req_s is None else replace(out, iterations=out.iterations + 1)
    except _Unreachable as exc:
        return exc.result


@dataclass(frozen=True)
class _Search:
    """What every answer of one goodput search shares: the target attainment, the tolerance, the
    requests per simulation, the capacity bound (req/s) and the probes so far, ``(rate_req_s,
    attainment)`` in order (the list grows as the search runs; each answer keeps a copy)."""

    target_attainment: float
    rel_tol: float
    n_requests: int
    upper_bound_req_s: float
    history: list[tuple[float, float]]

    def result(self, goodput_req_s: float, at: SimResult, bracket: tuple[float, float], *, reason: str = "",
               capacity_limited: bool = False, saturated_req_s: float | None = None, limit: str = "") -> GoodputResult:
        """The answer ``goodput_req_s`` (req/s), ``at`` the simulation at that rate (the zero-load
        probe when it is 0), ``bracket`` the final (meets, misses) rates; the rest as in
        ``GoodputResult``."""
        return GoodputResult(goodput_req_s=goodput_req_s, attainment=at.slo_attainment,
                             target_attainment=self.target_attainment, summary=at.summary(),
                             iterations=len(self.history), bracket=bracket, rel_tol=self.rel_tol,
                             n_requests=self.n_requests, upper_bound_req_s=self.upper_bound_req_s, reason=reason,
                             history=tuple(self.history), capacity_limited=capacity_limited,
                             saturated_req_s=saturated_req_s, limit=limit)


class _Unreachable(Exception):
    """Raised inside the bisection when rejected requests alone put the target out of reach."""

    def __init__(self, result: GoodputResult):
        super().__init__(result.reason)
        self.result = result


def _best_attainment(res: SimResult) -> float:
    """Attainment if every served measured request met its SLOs (rejected ones never do)."""
    m = res.measured
    if not m.any():
        return 0.0
    return float((m & ~np.isinf(res.ttft_s)).sum() / m.sum())


def _bisect(run, saturated, search: _Search, wf: float, max_iterations: int,
            guess_req_s: float | None) -> GoodputResult:
    attainment, n, rel_tol = search.target_attainment, search.n_requests, search.rel_tol
    ub, history = search.upper_bound_req_s, search.history
    guess = guess_req_s if guess_req_s is not None and math.isfinite(guess_req_s) and guess_req_s > 0 else None
    res_lo = res_hi = None
    met: list[tuple[float, SimResult]] = []   # rates that met the target, in the order probed
    top = ub        # no rate above the capacity bound is probed (nor reported)
    sat = None      # the simulator's saturated throughput, once a rate at the bound meets the target
    if guess is not None:
        # walk down from the guess until a rate meets the target (the zero-load probe only if
        # the walk gets that far), then up from the meeting rate until one misses
        rate = min(GUESS_LO * guess, top)
        while len(history) < GUESS_STEPS_DOWN and rate > ub * 1e-3:
            res, _ = run(rate)
            if res.slo_attainment >= attainment:
                lo_rate, res_lo = rate, res
                met.append((rate, res))
                break
            hi_rate, res_hi = rate, res
            rate *= GUESS_STEP_DOWN
        if res_lo is not None and res_hi is None:
            hi_rate = min(max(GUESS_HI * guess, lo_rate * 1.1), top)
    if res_lo is None:
        lo_rate = ub * 1e-3
        res_lo, req_lo = run(lo_rate)
        if res_lo.slo_attainment < attainment:
            return search.result(0.0, res_lo, (0.0, lo_rate), reason=_zero_load_reason(res_lo, req_lo, attainment))
        met.append((lo_rate, res_lo))
        if res_hi is None:
            hi_rate = top
    grow = 1.25 if guess is not None else 2.0
    if res_hi is None:
        if lo_rate >= top:
            res_hi = res_lo
        else:
            res_hi, _ = run(hi_rate)
    while res_hi.slo_attainment >= attainment and len(history) < max_iterations:
        lo_rate, res_lo = hi_rate, res_hi
        if not met or met[-1][0] != lo_rate:
            met.append((lo_rate, res_lo))
        if lo_rate >= top:
            if sat is not None:
                break
            # the SLOs hold at the analytic bound (a finite run of loose SLOs finishes every request
            # in time even when overloaded): no rate above what the engine sustains with every
            # request queued counts, the saturated throughput of the same requests
            sat = saturated()
            if sat >= top:
                break
            top = hi_rate = sat
            below = [(r, x) for r, x in met if r <= top]
            if below:
                lo_rate, res_lo = max(below, key=lambda rx: rx[0])
            else:
                lo_rate = min(ub * 1e-3, 0.5 * top)
                res_lo, req_lo = run(lo_rate)
                if res_lo.slo_attainment < attainment:
                    return search.result(0.0, res_lo, (0.0, lo_rate),
                                         reason=_zero_load_reason(res_lo, req_lo, attainment), saturated_req_s=sat)
            if lo_rate >= top:
                res_hi = res_lo
                break
            res_hi, _ = run(hi_rate)
            continue
        hi_rate = min(hi_rate * grow, top)
        res_hi, _ = run(hi_rate)
    if res_hi.slo_attainment >= attainment:
        if hi_rate >= top:
            what = ("the simulator's saturated throughput (every request queued)" if sat is not None and top == sat
                    else "the analytic capacity bound")
            what = f"{what}, {hi_rate:.3g} req/s"
            return search.result(hi_rate, res_hi, (hi_rate, hi_rate), capacity_limited=True, saturated_req_s=sat,
                                 limit=f"throughput: the SLOs still hold at {what}")
        return search.result(hi_rate, res_hi, (hi_rate, top), saturated_req_s=sat,
                             limit=f"no miss found up to {hi_rate:.3g} req/s after {max_iterations} simulations")
    # narrow the bracket: while it spans more than a factor 2, geometric bisection; then aim at the
    # crossing interpolated on logit(attainment) and probe a pair straddling it, 0.9 rel_tol apart,
    # which closes the bracket in two runs when the aim is good (bisection when a pair misses twice)
    n_meas = max(1, round(n * (1 - wf)))
    y_t = _logit(attainment, n_meas)
    f_lo, f_hi = _logit(res_lo.slo_attainment, n_meas) - y_t, _logit(res_hi.slo_attainment, n_meas) - y_t
    misses = 0
    while hi_rate - lo_rate > rel_tol * lo_rate and len(history) < max_iterations:
        was = (lo_rate, hi_rate)
        if hi_rate > 2 * lo_rate:
            probes = [math.sqrt(lo_rate * hi_rate)]
        elif misses >= 2 or not f_lo > 0 > f_hi:
            probes, misses = [0.5 * (lo_rate + hi_rate)], 0
        else:
            x = lo_rate + f_lo / (f_lo - f_hi) * (hi_rate - lo_rate)
            d = 0.45 * rel_tol * x
            w = hi_rate - lo_rate
            probes = sorted({min(max(x - d, lo_rate + 0.02 * w), hi_rate - 0.02 * w),
                             min(max(x + d, lo_rate + 0.02 * w), hi_rate - 0.02 * w)})
            misses += 1
        for mid in probes:
            if not lo_rate < mid < hi_rate or hi_rate - lo_rate <= rel_tol * lo_rate:
                continue
            res, _ = run(mid)
            f = _logit(res.slo_attainment, n_meas) - y_t
            if res.slo_attainment >= attainment:
                lo_rate, res_lo, f_lo = mid, res, max(f, 1e-9)
            else:
                hi_rate, f_hi = mid, min(f, -1e-9)
                break
        # Illinois: an end that did not move pulls the next aim less (regula falsi stalls otherwise)
        if lo_rate == was[0]:
            f_lo *= 0.5
        if hi_rate == was[1]:
            f_hi *= 0.5
    return search.result(lo_rate, res_lo, (lo_rate, hi_rate), saturated_req_s=sat, limit="slo")
