"""The open-loop load driver: a workload's own requests sent to a live server at their arrival times.

``OpenLoopPlan.from_workload(spec, rate_req_s, n_requests, seed, warmup)`` takes the very draw
the simulator uses for that (rate, n, seed) (``costmodel.traffic.Workload.requests``): the same
classes, lengths, shared prefixes and Poisson arrivals (or the trace's), the first ``warmup``
requests marked warm-up. ``run_open_loop(url, model, plan)`` sends each request at its arrival
time whatever the earlier ones are doing (open loop: a slow server gets a queue, not fewer
requests), each a streaming ``/v1/completions`` with ``ignore_eos`` and ``max_tokens`` = its
exact output length, its prompt built to its exact token count (the server's ``/tokenize`` when
it has one), requests of one class sharing their prefix text and asking llama.cpp to reuse it
(``cache_prompt``). The prompts are built before the clock starts.

It records per request: planned and actual send time, TTFT, TPOT, the server's token counts,
ok/error; and the machine's load (``os.getloadavg`` before, after and sampled during the run):
on a shared host the same engine's speed moves with it (issue 21: 2x within minutes), so a
measurement without its load cannot be compared with another.

``OpenLoopRun.attainment(slo)`` is the share of the non-warm-up requests meeting both targets
with a confidence interval (``Attainment``; see ``attainment_interval`` for the methods and why
the default accounts for the correlation between requests of one run). ``OpenLoopRun.to_rows``
makes it a profile-table row whose ``requests_file`` names the per-request log
(``costmodel.request_log``), so ``kvtune validate`` and ``kvtune calibrate`` replay exactly these
arrivals and lengths through the simulator. ``drift(rows)`` flags the same point measured twice
beyond noise.

Standard library HTTP (``optimizer.profile_run``) and threads: one thread per request in flight.
"""

from __future__ import annotations

import math
import os
import secrets
import threading
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from kvtune.costmodel.errors import InputError, KvtuneError
from kvtune.costmodel.profile_table import ProfileRow, config_key
from kvtune.costmodel.request_log import RequestLog, met_slo, request_log_csv, read_request_log
from kvtune.costmodel.requests import Requests
from kvtune.costmodel.traffic import SLO

from .importers import Metadata, latency_summary
from .profile_run import (Endpoint, LoadRecord, LoadSampler, ServerInfo, completion_payload, count_tokens, load_now,
                          make_prompt, probe_server, stream_completion)
from statistics import NormalDist
from scipy.special import stdtr, stdtrit   # Student's t CDF and quantile (scipy.special: a fraction of scipy.stats' import)
from scipy.stats import binomtest

__all__ = ["OpenLoopPlan", "OpenLoopRun", "RequestRecord", "LoadRecord", "Attainment", "run_open_loop",
           "attainment_interval", "drift", "CI_METHODS", "DEFAULT_CI_METHOD", "DRIFT_REL", "load_now"]

CI_METHODS = ("batch-wilson", "wilson", "clopper-pearson")
# a request may match a few more cached tokens than its shared prefix by chance: the first words
# of its own text drawn from the same short word list as another's
CACHE_SLACK_TOKENS = 8
DEFAULT_CI_METHOD = "batch-wilson"
CONFIDENCE = 0.95
# batch-means batches: 5 of ~60 requests covered best of 5, 10, 20 and overlapping batches of 30-60
# on simulated runs near the knee (bench/bench_attainment_ci.py; 10-30 is the textbook range,
# Schmeiser 1982, but queueing episodes in a 300-request run outlast batches of 30)
BATCHES = 5
# TTFT trend within a run (OpenLoopRun.ttft_trend): a queue that grows for as long as the run lasts
# shows as TTFT rising from batch to batch. Statistically: the least-squares slope of TREND_BATCHES
# batch means above zero at one-sided level TREND_ALPHA (Student's t, batches - 2 degrees of
# freedom; 5 batches, 3 degrees of freedom, missed a run at attainment 0.61 in simulation); in size:
# the fitted rise over the run at least TREND_RISE_FRAC of the TTFT target, the budget a growing
# queue eats (a rise the size of a 30 ms TTFT is noise against a 400 ms target). Chosen on simulated
# runs of 200 requests (tests/measure/test_open_loop_replay.py's workload, 4-30 req/s x 3 seeds): rising in
# none of the 9 at attainment >= 0.92, in 7 of the 9 at 0.79 and below.
TREND_BATCHES = 10
TREND_ALPHA = 0.01
TREND_RISE_FRAC = 0.25


# ---------------------------------------------------------------------------------------------
# The plan

@dataclass(frozen=True, eq=False)
class OpenLoopPlan:
    """The requests to send: the simulator's own draw, with the first ``warmup`` marked warm-up."""

    requests: Requests
    rate_req_s: float
    seed: int
    warmup: int
    slo: SLO = SLO()
    source: str = ""

    def __post_init__(self) -> None:
        n = len(self.requests)
        if n < 1:
            raise InputError("open-loop plan: no requests")
        if isinstance(self.warmup, bool) or not isinstance(self.warmup, (int, np.integer)) or not 0 <= self.warmup < n:
            raise InputError(f"open-loop plan: warmup must be a whole number in 0..{n - 1} (n_requests {n}), "
                             f"got {self.warmup!r}")
        if not (isinstance(self.rate_req_s, (int, float)) and self.rate_req_s > 0):
            raise InputError(f"open-loop plan: rate_req_s must be > 0, got {self.rate_req_s!r}")

    @classmethod
    def from_workload(cls, spec, rate_req_s: float, n_requests: int, seed: int, warmup: int) -> "OpenLoopPlan":
        """``spec``: an ``optimizer.workload.WorkloadSpec`` or a ``costmodel.traffic.Workload`` (both
        draw with ``requests(n, seed, rate_req_s)`` and carry ``slo``)."""
        if isinstance(n_requests, bool) or not isinstance(n_requests, (int, np.integer)) or n_requests < 1:
            raise InputError(f"open-loop plan: n_requests must be a whole number >= 1, got {n_requests!r}")
        if isinstance(rate_req_s, bool) or not isinstance(rate_req_s, (int, float)) or not rate_req_s > 0 \
                or math.isinf(rate_req_s):
            raise InputError(f"open-loop plan: rate_req_s must be a finite number > 0, got {rate_req_s!r}")
        req = spec.requests(int(n_requests), int(seed), rate_req_s=float(rate_req_s))
        where = getattr(spec, "path", "") or "workload"
        return cls(req, float(rate_req_s), int(seed), int(warmup), spec.slo,
                   f"{where}: {n_requests} requests at {rate_req_s:g} req/s, seed {seed}")

    def __len__(self) -> int:
        return len(self.requests)

    @property
    def is_warmup(self) -> np.ndarray:
        """True for the first ``warmup`` requests in arrival order."""
        order = np.argsort(self.requests.arrival_s, kind="stable")
        out = np.zeros(len(self), dtype=bool)
        out[order[: self.warmup]] = True
        return out

    def class_name(self, i: int) -> str:
        return self.requests.class_names[int(self.requests.class_idx[i])]


# ---------------------------------------------------------------------------------------------
# Attainment and its interval

@dataclass(frozen=True)
class Attainment:
    """The share of the counted requests (past warm-up; a failed one is a miss) that met both
    targets, with a ``confidence`` interval [lo, hi] by ``method`` (``attainment_interval``)."""

    value: float
    lo: float
    hi: float
    n: int                    # requests counted
    met: int
    confidence: float
    warmup_excluded: int
    method: str
    n_effective: float        # n shrunk by the correlation the batch means saw (= n for iid methods)

    def verdict(self, target: float) -> str:
        """``meets`` (the whole interval at or above ``target``), ``misses`` (all of it below) or
        ``undecided``."""
        if self.lo >= target:
            return "meets"
        if self.hi < target:
            return "misses"
        return "undecided"

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> "Attainment":
        return cls(**{k: d[k] for k in cls.__dataclass_fields__})


def _wilson(k: float, n: float, confidence: float, dof: int | None = None) -> tuple[float, float]:
    """Wilson's score interval for k of n; with ``dof``, Student's t quantile in place of the
    normal one (the variance behind n was estimated from dof + 1 batch means)."""

    if n <= 0:
        return 0.0, 1.0
    q = 0.5 + confidence / 2
    z = float(stdtrit(dof, q)) if dof else NormalDist().inv_cdf(q)
    p = k / n
    den = 1 + z * z / n
    mid = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    lo, hi = max(0.0, mid - half), min(1.0, mid + half)
    return (0.0 if k <= 0 else lo), (1.0 if k >= n else hi)   # exact at the ends, not 1 - 1e-16


def attainment_interval(met: Sequence[bool] | np.ndarray, confidence: float = CONFIDENCE,
                        method: str = DEFAULT_CI_METHOD, batches: int = BATCHES) -> tuple[float, float, float]:
    """(lo, hi, n_effective) for the share of ``met`` (in arrival order) that is True.

    - ``wilson``: Wilson's score interval, as if the requests were independent.
    - ``clopper-pearson``: the exact binomial interval (``scipy.stats.binomtest``), same assumption.
    - ``batch-wilson`` (default): requests of one open-loop run are not independent: a queue
      that builds up makes a run of consecutive misses. Split the requests, in arrival order,
      into ``batches`` contiguous batches of m; the variance of the batch means, against the
      binomial p(1-p)/m, is the variance inflation factor VIF = m var(batch means) / (p(1-p))
      (batch means: Law & Kelton, Simulation Modeling and Analysis, ch. 9). Wilson's interval is
      then taken on n / max(VIF, 1) requests with Student's t quantile for the batches' b - 1
      degrees of freedom. Wilson, not a t-interval on the batch means, because attainment sits
      near 1 where every batch may be all-met and a t-interval collapses to zero width. With no
      miss (or no hit) the VIF cannot be estimated: VIF 1, still with the t quantile.

    Measured coverage of the 95% intervals (``bench/bench_attainment_ci.py``: 200 simulated runs
    of 300 counted requests per rate, against the long-run attainment): independent-request
    intervals cover 0.92 at attainment 0.995, 0.74-0.77 at 0.984, 0.37-0.50 at 0.92-0.96 and
    0.21 at 0.83; the default 0.98-0.99 at 0.98-0.995 and 0.79-0.90 at 0.83-0.96, at twice to
    five times the width. Near the knee most of the spread
    between runs is how many requests each run's Poisson draw happened to bunch (300 arrivals
    carry a 6% spread in realised rate), which no interval from within one run can see; longer or
    repeated runs narrow it.
    """
    m_arr = np.asarray(met, dtype=bool)
    n = len(m_arr)
    if method not in CI_METHODS:
        raise InputError(f"attainment interval: method must be one of {', '.join(CI_METHODS)}, got {method!r}")
    if not 0 < confidence < 1:
        raise InputError(f"attainment interval: confidence must be in (0, 1), got {confidence!r}")
    if n == 0:
        return 0.0, 1.0, 0.0
    k = int(m_arr.sum())
    if method == "clopper-pearson":

        ci = binomtest(k, n).proportion_ci(confidence_level=confidence, method="exact")
        return float(ci.low), float(ci.high), float(n)
    if method == "wilson":
        lo, hi = _wilson(k, n, confidence)
        return lo, hi, float(n)
    b = min(batches, n // 2)
    n_eff = n / _variance_inflation(m_arr, b)
    lo, hi = _wilson(k * n_eff / n, n_eff, confidence, b - 1 if b >= 2 else None)
    return lo, hi, n_eff


def _variance_inflation(met: np.ndarray, b: int) -> float:
    """VIF >= 1 from ``b`` contiguous batch means; 1 when it cannot be estimated (fewer than 2
    batches, or no miss or no hit: the t quantile still says the variance was not known)."""
    n = len(met)
    p = float(met.mean())
    if b < 2 or p in (0.0, 1.0):
        return 1.0
    m = n // b
    means = met[: b * m].reshape(b, m).mean(axis=1)
    return max(m * float(np.var(means, ddof=1)) / (p * (1 - p)), 1.0)


# ---------------------------------------------------------------------------------------------
# One run

@dataclass(frozen=True)
class RequestRecord:
    """One request as planned and as measured (times in seconds from the run's start)."""

    index: int
    class_name: str
    warmup: bool
    scheduled_s: float
    sent_s: float | None             # None: never sent (the run was stopped first)
    input_tokens: int
    output_tokens: int
    prefix_tokens: int
    prefix_group: int
    ttft_slo_ms: float
    tpot_slo_ms: float
    ok: bool = False
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2e_ms: float | None = None
    prompt_tokens_server: int | None = None
    output_tokens_server: int | None = None
    cached_tokens_server: int | None = None
    error: str = ""

    @property
    def late_s(self) -> float | None:
        """How late the driver sent it (thread wake-up on a busy machine)."""
        return None if self.sent_s is None else self.sent_s - self.scheduled_s

    @property
    def served_output_tokens(self) -> int:
        return self.output_tokens_server or self.output_tokens


@dataclass(frozen=True)
class OpenLoopRun:
    url: str
    model: str
    rate_req_s: float               # planned
    seed: int
    slo: SLO
    plan_source: str
    started_at: str                 # ISO 8601, UTC
    duration_s: float               # first send to last completion
    requests: tuple[RequestRecord, ...] = field(repr=False)
    load: LoadRecord = LoadRecord(math.nan, math.nan)
    server: ServerInfo = ServerInfo()
    complete: bool = True           # False: stopped before every request was sent
    prompt_seed: int | None = None  # drew the prompts' words (fresh per run unless given)
    clock_zero_unix: float | None = None   # the Unix time of the run's clock zero (sent_s and scheduled_s count from it)

    # ---- which requests ------------------------------------------------------------------------
    @property
    def sent(self) -> list[RequestRecord]:
        return [r for r in self.requests if r.sent_s is not None]

    @property
    def counted(self) -> list[RequestRecord]:
        """Past warm-up and sent (attainment is over these; a failed one is a miss)."""
        return [r for r in self.sent if not r.warmup]

    @property
    def measured(self) -> list[RequestRecord]:
        """Past warm-up and served (latency statistics are over these)."""
        return [r for r in self.counted if r.ok]

    @property
    def failures(self) -> list[RequestRecord]:
        return [r for r in self.sent if not r.ok]

    @property
    def warmup_excluded(self) -> int:
        return sum(1 for r in self.sent if r.warmup)

    # ---- statistics ----------------------------------------------------------------------------
    def met(self, slo: SLO | None = None) -> np.ndarray:
        """Per counted request, in arrival order: met both targets. ``slo`` replaces every
        request's own targets (None: each request's, its class's or the workload's)."""
        rs = sorted(self.counted, key=lambda r: r.sent_s or 0.0)
        if not rs:
            return np.zeros(0, dtype=bool)
        ttft_slo = [slo.ttft_ms if slo else r.ttft_slo_ms for r in rs]
        tpot_slo = [slo.tpot_ms if slo else r.tpot_slo_ms for r in rs]
        return met_slo([r.ok for r in rs], [_nan(r.ttft_ms) for r in rs], [_nan(r.tpot_ms) for r in rs],
                       [r.served_output_tokens for r in rs], ttft_slo, tpot_slo)

    def attainment(self, slo: SLO | None = None, confidence: float = CONFIDENCE,
                   method: str = DEFAULT_CI_METHOD) -> Attainment:
        m = self.met(slo)
        lo, hi, n_eff = attainment_interval(m, confidence, method)
        value = float(m.mean()) if len(m) else math.nan
        return Attainment(value, lo, hi, len(m), int(m.sum()), confidence, self.warmup_excluded, method, n_eff)

    def ttft_trend(self, batches: int = TREND_BATCHES) -> dict | None:
        """Whether the queue grew through the run: TTFT of the measured requests in send order,
        cut into ``batches`` contiguous batches; the least-squares slope of the batch means against
        their mean send times, its standard error and one-sided p-value (Student's t on batches - 2
        degrees of freedom), the fitted rise over the run, and ``rising``: significant at
        ``TREND_ALPHA`` and a rise of at least ``TREND_RISE_FRAC`` of the requests' median TTFT
        target. A run whose TTFT rises this way has not reached a steady state: the rate it met is
        not one it holds. None with fewer than 2 requests per batch."""
        rs = sorted((r for r in self.measured if r.ttft_ms is not None and r.sent_s is not None),
                    key=lambda r: r.sent_s or 0.0)
        if batches < 3 or len(rs) < 2 * batches:
            return None
        t = np.array([r.sent_s for r in rs], dtype=float)
        y = np.array([r.ttft_ms for r in rs], dtype=float)
        parts = np.array_split(np.arange(len(rs)), batches)
        bt = np.array([t[i].mean() for i in parts])
        by = np.array([y[i].mean() for i in parts])
        dt = bt - bt.mean()
        sxx = float((dt * dt).sum())
        if sxx <= 0:
            return None
        slope = float((dt * (by - by.mean())).sum() / sxx)
        resid = by - by.mean() - slope * dt
        se = math.sqrt(float((resid * resid).sum()) / (batches - 2) / sxx)
        p = 0.0 if se == 0 and slope > 0 else (1.0 if se == 0 else float(1 - stdtr(batches - 2, slope / se)))
        rise = slope * float(t[-1] - t[0])
        target = float(np.median([r.ttft_slo_ms for r in rs]))
        return {"slope_ms_per_s": round(slope, 3), "slope_se": round(se, 3), "p_value": round(p, 5),
                "rise_ms": round(rise, 1), "median_ttft_ms": round(float(np.median(y)), 1),
                "ttft_target_ms": round(target, 1), "batches": batches,
                "rising": bool(p < TREND_ALPHA and rise >= TREND_RISE_FRAC * target)}

    def percentiles(self) -> dict[str, dict[str, float | None]]:
        """``{"ttft_ms": {mean, p50, p90, p99}, "tpot_ms": {...}, "e2e_ms": {...}}`` over the measured requests."""
        out: dict[str, dict[str, float | None]] = {}
        for key in ("ttft_ms", "tpot_ms", "e2e_ms"):
            vals = [getattr(r, key) for r in self.measured if getattr(r, key) is not None]
            if vals:
                mean, p50, p90, p99 = latency_summary(vals)
                out[key] = {"mean": mean, "p50": p50, "p90": p90, "p99": p99}
            else:
                out[key] = {"mean": None, "p50": None, "p90": None, "p99": None}
        return out

    @property
    def offered_rate_req_s(self) -> float:
        """The arrival rate really sent, over the counted requests: (n - 1) / (last - first send)."""
        t = sorted(r.sent_s for r in self.counted if r.sent_s is not None)
        return (len(t) - 1) / (t[-1] - t[0]) if len(t) > 1 and t[-1] > t[0] else math.nan

    def goodput_at_rate(self, slo: SLO | None = None) -> float:
        """Requests per second that met both targets at this load: the offered rate x attainment."""
        return self.offered_rate_req_s * self.attainment(slo).value

    @property
    def cached_beyond_prefix(self) -> list[RequestRecord]:
        """Requests whose server says it took more prompt tokens from its cache than the plan
        shares (a few tokens: random words that happen to match; many: text the engine had seen)."""
        return [r for r in self.sent if r.cached_tokens_server is not None
                and r.cached_tokens_server > r.prefix_tokens + CACHE_SLACK_TOKENS]

    def late_p99_s(self) -> float:
        """99th percentile of how late requests were sent: a driver that cannot keep up shows here."""
        late = [r.late_s for r in self.sent if r.late_s is not None]
        return float(np.percentile(late, 99)) if late else math.nan

    # ---- records -------------------------------------------------------------------------------
    def request_log(self) -> RequestLog:
        """The sent requests as a ``costmodel.request_log.RequestLog``."""
        rs = self.sent
        if not rs:
            raise KvtuneError("open-loop run: no request was sent")

        def col(name, missing):
            return [missing if getattr(r, name) is None else getattr(r, name) for r in rs]

        return RequestLog(index=col("index", -1), class_name=col("class_name", ""), warmup=col("warmup", False),
                          scheduled_s=col("scheduled_s", math.nan), arrival_s=col("sent_s", 0.0),
                          input_tokens=col("input_tokens", 1), output_tokens=col("output_tokens", 1),
                          prefix_tokens=col("prefix_tokens", 0), prefix_group=col("prefix_group", -1),
                          ttft_slo_ms=col("ttft_slo_ms", math.inf), tpot_slo_ms=col("tpot_slo_ms", math.inf),
                          ok=col("ok", False), ttft_ms=col("ttft_ms", math.nan), tpot_ms=col("tpot_ms", math.nan),
                          e2e_ms=col("e2e_ms", math.nan), prompt_tokens_server=col("prompt_tokens_server", -1),
                          output_tokens_server=col("output_tokens_server", -1),
                          cached_tokens_server=col("cached_tokens_server", -1), error=col("error", ""),
                          source=self.plan_source)

    def write_requests(self, path: str | Path) -> Path:
        """Write the per-request log (CSV) atomically; returns the path."""
        p = Path(path)
        tmp = p.with_name(p.name + ".tmp")
        tmp.write_text(request_log_csv(self.request_log()), encoding="utf-8")
        os.replace(tmp, p)
        return p

    def to_rows(self, meta: Metadata, requests_path: str, *, row_id: str | None = None, threads: int | None = None,
                chunk_tokens: int | None = None) -> list[ProfileRow]:
        """One ``request`` row for the profile table: the rate, mean lengths, TTFT/TPOT statistics
        over the measured requests, throughput, the SLO and attainment, the load, the engine's
        ``threads``, and ``requests_file`` = ``requests_path`` (as written: relative to the
        table's folder; write it with ``write_requests``). ``meta`` fills the metadata; what the
        server reported (engine, version, slots, pool) fills what it leaves empty."""
        ms = self.measured
        if not ms:
            first = self.failures[0].error if self.failures else "no request past warm-up"
            raise KvtuneError(f"open-loop run at {self.rate_req_s:g} req/s: no request was served past warm-up "
                              f"({first})")
        pct = self.percentiles()
        served = [r for r in self.sent if r.ok]
        t0 = min(r.sent_s for r in self.sent if r.sent_s is not None)
        t1 = max((r.sent_s or 0.0) + (r.e2e_ms or 0.0) / 1e3 for r in served)
        span = t1 - t0
        m = meta.fill(Metadata(model=self.model, engine=self.server.engine or None,
                               engine_version=self.server.engine_version or None, date=self.started_at))
        att = self.attainment()
        fields: dict = {
            "rate_req_s": self.rate_req_s, "num_requests": len(ms),
            "input_tokens": int(round(float(np.mean([r.prompt_tokens_server or r.input_tokens for r in ms])))),
            "output_tokens": int(round(float(np.mean([r.served_output_tokens for r in ms])))),
            "output_tok_s": sum(r.served_output_tokens for r in served) / span if span > 0 else None,
            "request_s": len(served) / span if span > 0 else None,
            "kv_pool_tokens": self.server.kv_pool_tokens, "batch_cap": self.server.batch_cap,
            "chunk_tokens": chunk_tokens or self.server.chunk_tokens, "threads": threads,
            "loadavg_1m": self.load.mean_1m if math.isfinite(self.load.mean_1m) else None,
            "slo_ttft_ms": self.slo.ttft_ms if math.isfinite(self.slo.ttft_ms) else None,
            "slo_tpot_ms": self.slo.tpot_ms if math.isfinite(self.slo.tpot_ms) else None,
            "attainment": att.value if math.isfinite(att.value) else None, "requests_file": requests_path}
        for key in ("ttft", "tpot"):
            for stat in ("mean", "p50", "p90", "p99"):
                fields[f"{key}_{stat}_ms"] = pct[f"{key}_ms"][stat]
        rid = row_id or f"open:r{self.rate_req_s:g}-n{len(self.requests)}-s{self.seed}"
        return [ProfileRow(id=rid, kind="request", **m.row_fields(), **fields)]

    def summary(self, slo: SLO | None = None) -> dict:
        """The run's figures as JSON-ready values (for progress lines and reports)."""
        att = self.attainment(slo)
        return {"rate_req_s": self.rate_req_s, "offered_rate_req_s": self.offered_rate_req_s,
                "requests": len(self.requests), "sent": len(self.sent), "failed": len(self.failures),
                "warmup_excluded": att.warmup_excluded, "attainment": att.to_json(),
                "goodput_at_rate_req_s": self.offered_rate_req_s * att.value, **self.percentiles(),
                "late_p99_s": self.late_p99_s(), "cached_beyond_prefix": len(self.cached_beyond_prefix),
                "duration_s": self.duration_s, "started_at": self.started_at,
                "loadavg_1m": {"before": self.load.before_1m, "mean": self.load.mean_1m, "max": self.load.max_1m,
                               "after": self.load.after_1m, "cpus": self.load.cpus},
                "complete": self.complete}


def _nan(v: float | None) -> float:
    return math.nan if v is None else v


# ---------------------------------------------------------------------------------------------
# Prompts

class _PromptBuilder:
    """Prompts of exact token counts: shared prefix text per prefix group, then a fresh suffix.
    With a tokenizer the whole prompt is counted and the suffix corrected until it matches."""

    def __init__(self, root: "str | Endpoint | None", seed: int, timeout_s: float):
        self.root, self.timeout_s = root, timeout_s
        self.rng = np.random.default_rng(seed)
        self.prefixes: dict[int, str] = {}

    def _count(self, text: str) -> int | None:
        return count_tokens(self.root, text, self.timeout_s) if self.root else None

    def _words(self, n: int, head: str = "") -> str:
        """``n`` tokens of text after ``head`` (``head`` + about ``n`` one-token words, corrected)."""
        words = make_prompt(self.rng, max(n, 1)).split(" ")
        base = self._count(head) if head else 0
        k = n
        for _ in range(5):
            text = " ".join(filter(None, [head, *words[:k]]))
            total = self._count(text)
            if total is None or base is None:
                return text
            got = total - base
            if got == n:
                return text
            k = max(1, k + (n - got))
            while k > len(words):
                words += make_prompt(self.rng, k - len(words)).split(" ")
        return " ".join(filter(None, [head, *words[:k]]))

    def prompt(self, input_tokens: int, prefix_tokens: int, group: int) -> str:
        if prefix_tokens <= 0 or group < 0:
            return self._words(input_tokens)
        if group not in self.prefixes:
            self.prefixes[group] = self._words(prefix_tokens)
        head = self.prefixes[group]
        rest = input_tokens - prefix_tokens
        return self._words(rest, head) if rest > 0 else head


# ---------------------------------------------------------------------------------------------
# Sending

def run_open_loop(url: "str | Endpoint", model: str, plan: OpenLoopPlan, *, timeout_s: float = 600.0, tokenize: bool = True,
                  stop: threading.Event | None = None,
                  on_progress: Callable[[RequestRecord, int, int], None] | None = None,
                  load_sample_s: float = 1.0, prompt_seed: int | None = None) -> OpenLoopRun:
    """Send ``plan``'s requests to ``url`` (``http://HOST:PORT/v1``) at their arrival times.

    ``tokenize``: build prompts to the exact count with the server's ``/tokenize`` where it has one
    (else about one word per token). ``stop``: set it to stop sending (requests in flight finish
    or time out; the run comes back with ``complete`` False). ``on_progress(record, done,
    total)`` is called from the request's thread as each one finishes. An unreachable server is
    an ``InputError`` before anything is sent.

    ``prompt_seed`` draws the prompts' words; by default a fresh one per run (kept in
    ``OpenLoopRun.prompt_seed``): the lengths, arrivals and prefix sharing are the plan's, but the
    text must be new to the engine, whose cache outlives a run. With the same text twice, llama.cpp
    reused whole prompts of the previous run (49 of 60 requests at 0.25 req/s on this machine,
    TTFT p50 328 ms against 3.3 s) where the simulator, rightly for a real workload, charges them.
    """
    if prompt_seed is None:
        prompt_seed = secrets.randbits(63)
    if not timeout_s > 0:
        raise InputError(f"open loop: timeout_s must be > 0, got {timeout_s!r}")
    ep = Endpoint.of(url)   # one per run: its kept-alive connections carry the run's requests
    url = ep.url
    info = probe_server(ep, min(timeout_s, 10.0))
    root = ep.root() if tokenize and info.can_tokenize else None
    req = plan.requests
    warm = plan.is_warmup
    builder = _PromptBuilder(root, prompt_seed, timeout_s)
    prompts = [builder.prompt(int(req.input_tokens[i]), int(req.prefix_tokens[i]), int(req.prefix_group[i]))
               for i in range(len(plan))]
    order = np.argsort(req.arrival_s, kind="stable")
    arrival = req.arrival_s - float(req.arrival_s.min())
    records: list[RequestRecord | None] = [None] * len(plan)
    lock = threading.Lock()
    done = [0]
    stop = stop or threading.Event()

    def planned(i: int) -> RequestRecord:
        return RequestRecord(index=i, class_name=plan.class_name(i), warmup=bool(warm[i]),
                             scheduled_s=float(arrival[i]), sent_s=None, input_tokens=int(req.input_tokens[i]),
                             output_tokens=int(req.output_tokens[i]), prefix_tokens=int(req.prefix_tokens[i]),
                             prefix_group=int(req.prefix_group[i]), ttft_slo_ms=float(req.ttft_slo_s[i]) * 1e3,
                             tpot_slo_ms=float(req.tpot_slo_s[i]) * 1e3)

    def send(i: int, t0: float) -> None:
        shared = int(req.prefix_tokens[i]) > 0 and int(req.prefix_group[i]) >= 0
        payload = completion_payload(model, prompts[i], int(req.output_tokens[i]), cache_prompt=shared, api=ep.api)
        r = stream_completion(ep, payload, timeout_s)
        rec = planned(i)
        tpot = r.tpot_s
        rec = RequestRecord(**{**asdict(rec), "sent_s": r.sent_s - t0, "ok": r.ok,
                               "ttft_ms": r.ttft_s * 1e3 if r.ok else None,
                               "tpot_ms": tpot * 1e3 if tpot is not None else None,
                               "e2e_ms": r.last_token_s * 1e3 if r.ok else None,
                               "prompt_tokens_server": r.prompt_tokens, "output_tokens_server": r.output_tokens,
                               "cached_tokens_server": r.cached_tokens, "error": r.error})
        with lock:
            records[i] = rec
            done[0] += 1
            k = done[0]
        if on_progress:
            on_progress(rec, k, len(plan))

    threads: list[threading.Thread] = []
    started_at = datetime.now(timezone.utc).replace(microsecond=0).isoformat()
    with LoadSampler(load_sample_s) as sampler:
        t0, t0_unix = time.perf_counter(), time.time()
        for i in order:
            wait = t0 + float(arrival[i]) - time.perf_counter()
            if (wait > 0 and stop.wait(wait)) or stop.is_set():
                break
            th = threading.Thread(target=send, args=(int(i), t0), daemon=True, name=f"kvtune-req-{i}")
            th.start()
            threads.append(th)
        for th in threads:
            th.join()
    ep.close()
    out = tuple(records[i] or planned(i) for i in range(len(plan)))
    sent = [r for r in out if r.sent_s is not None]
    ends = [r.sent_s + (r.e2e_ms or 0.0) / 1e3 for r in sent if r.sent_s is not None]
    duration = (max(ends) - min(r.sent_s for r in sent if r.sent_s is not None)) if sent else 0.0
    return OpenLoopRun(url=url, model=model, rate_req_s=plan.rate_req_s, seed=plan.seed, slo=plan.slo,
                       plan_source=plan.source, started_at=started_at, duration_s=duration, requests=out,
                       load=sampler.record(), server=info, complete=len(sent) == len(plan),
                       prompt_seed=prompt_seed, clock_zero_unix=t0_unix)


# ---------------------------------------------------------------------------------------------
# Drift

# Two measurements of the same point whose means differ by more than this share are drift, not
# noise, when the rows carry no per-request log to judge the noise from. The run-to-run spread of
# serving benchmarks is a few percent (vLLM's CI tolerates 5-10%); this machine's llama-server
# repeats within ~10% when the load holds (bench/RESULTS-measure.md), and moved 2.4x when it did
# not (issue 21: TTFT 876 -> 357 ms).
DRIFT_REL = 0.25
DRIFT_Z = 3.0   # with per-request logs: the difference against its batch-means standard error


def drift(rows: Sequence[ProfileRow], rel: float = DRIFT_REL, z: float = DRIFT_Z) -> list[str]:
    """The same point (every configuration column equal, the rate included) measured more than
    once with means differing beyond noise: one line per pair and metric, with both rows' load.

    Beyond noise: both rows have per-request logs and the difference of the means is more than
    ``z`` standard errors (each from batch means over its run, so queueing correlation widens
    it) and more than 10%; else the means differ by more than ``rel`` of the smaller."""
    groups: dict[tuple, list[ProfileRow]] = {}
    for r in rows:
        if r.kind == "request":
            groups.setdefault(config_key(r), []).append(r)
    out = []
    for members in groups.values():
        for a_i in range(len(members)):
            for b_i in range(a_i + 1, len(members)):
                out += _drift_pair(members[a_i], members[b_i], rel, z)
    return out


def _drift_pair(a: ProfileRow, b: ProfileRow, rel: float, z: float) -> list[str]:
    out = []
    logs = (_log_values(a), _log_values(b))
    for metric in ("ttft_mean_ms", "tpot_mean_ms"):
        va, vb = getattr(a, metric), getattr(b, metric)
        if not va or not vb:
            continue
        ratio = max(va, vb) / min(va, vb)
        key = metric.split("_")[0] + "_ms"
        how = ""
        if logs[0] is not None and logs[1] is not None and key in logs[0] and key in logs[1]:
            (ma, sa), (mb, sb) = logs[0][key], logs[1][key]
            se = math.hypot(sa, sb)
            score = abs(ma - mb) / se if se > 0 else math.inf
            if score <= z or ratio <= 1.10:
                continue
            how = f"{score:.1f} standard errors"
        elif ratio - 1 <= rel:
            continue
        else:
            how = f"more than {rel:.0%}"
        out.append(f"drift: rows {a.id} ({_when(a)}) and {b.id} ({_when(b)}) measure the same point but {metric} "
                   f"{va:.4g} vs {vb:.4g} ({ratio:.2f}x, {how} apart)")
    return out


def _when(row: ProfileRow) -> str:
    load = f"loadavg {row.loadavg_1m:.2f}" if row.loadavg_1m is not None else "load not recorded"
    return f"{row.date}, {load}" if row.date else load


def _log_values(row: ProfileRow) -> dict[str, tuple[float, float]] | None:
    """Mean and batch-means standard error of TTFT and TPOT from the row's per-request log."""
    p = row.requests_path()
    if p is None or not p.is_file():
        return None

    try:
        log = read_request_log(p)
    except KvtuneError:
        return None
    keep = log.measured[np.argsort(log.arrival_s, kind="stable")]
    out = {}
    for key in ("ttft_ms", "tpot_ms"):
        v = getattr(log, key)[np.argsort(log.arrival_s, kind="stable")][keep]
        v = v[np.isfinite(v)]
        if len(v) >= 4:
            out[key] = (float(v.mean()), _batch_se(v))
    return out


def _batch_se(v: np.ndarray, batches: int = BATCHES) -> float:
    """Standard error of the mean of a correlated series by batch means."""
    b = min(batches, len(v) // 2)
    m = len(v) // b
    means = v[: b * m].reshape(b, m).mean(axis=1)
    return float(np.std(means, ddof=1) / math.sqrt(b))
