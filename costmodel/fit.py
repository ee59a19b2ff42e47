"""Fitting a calibration: the ``Efficiency`` parameters that make kvtune match measured rows.

Least squares on relative residuals ``log(predicted / measured)`` (a 10% miss weighs the same on a
5 ms step and a 2 s TTFT), bounded by ``PARAM_BOUNDS``. Parameters are scaled inside the solver so
each moves on a unit near 1: overheads in ms, all-reduce latency in us, reserve in GB.

Uncertainty is the usual linearised one: with Jacobian ``J`` of the residuals at the solution,
``s^2 = sum(r^2) / (n - p)`` and ``cov = s^2 (J^T J)^-1``; one sigma is ``sqrt(diag(cov))``. It
assumes the model is right and the misses are noise, so read it as a lower bound.

Step rows are predicted with ``StepModel`` directly; request rows (mean TTFT/TPOT of a closed loop
at a concurrency, or a batch arriving all at once) by running the simulator (``costmodel.simulate``)
with a fixed seed, so residuals are deterministic and smooth in the parameters.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Callable, Collection, Sequence

import numpy as np

from .closed_loop import canonical_engine, run_closed_loop
from .dtypes import check_dtype
from .efficiency import PARAM_BOUNDS, Efficiency
from .engines import REGISTRY
from .errors import InputError
from .hardware import GPU
from .memory import GPU_MEM_UTIL
from .models import get_model
from .profile_table import ProfileRow
from .request_log import RequestLog, read_request_log
from .requests import Requests
from .step import StepModel
from scipy.optimize import least_squares
from .simulate import SimConfig, simulate

__all__ = ["FIT_PARAMS", "FIT_METRICS", "METRICS", "PERCENTILE_METRICS", "REQUEST_METRICS", "PointFit", "FitResult", "RowPredictor", "measured_metrics", "request_figures", "metric_of", "fit_efficiency", "visible_params",
           "evaluate", "cross_validate", "mape", "Prior", "NothingToFit", "HOLD_SD_RATIO", "PRIOR_FIGURE_SD_LOG", "HeldOutFold", "cv_key",
           "held_out_folds", "held_out_mape", "extrapolation"]

# Fitted by default; activation_reserve_bytes only shows when the KV pool limits a run, and
# request_overhead_s only in TTFT, so they are fitted only when asked for (--params).
FIT_PARAMS = ("bw_efficiency", "decode_flops_efficiency", "prefill_flops_efficiency",
              "step_overhead_s", "prefill_overhead_s", "allreduce_latency_s", "link_efficiency")

# Solver units: value = x * scale.
_SCALE = {"decode_attn_efficiency": 1.0, "bw_efficiency": 1.0, "decode_flops_efficiency": 1.0, "prefill_flops_efficiency": 1.0,
          "step_overhead_s": 1e-3, "prefill_overhead_s": 1e-3, "allreduce_latency_s": 1e-6, "link_efficiency": 1.0,
          "activation_reserve_bytes": 1e9, "request_overhead_s": 1e-3,
          "fp8_gemm_efficiency": 1.0, "fp8_kv_bw_efficiency": 1.0, "fp8_scale_overhead_s": 1e-3}
# Probe used to decide whether the rows can see a parameter at all: efficiencies are divided by 4,
# additive parameters get this much added.
_PROBE_ADD = {"step_overhead_s": 2e-3, "prefill_overhead_s": 2e-3, "allreduce_latency_s": 50e-6, "activation_reserve_bytes": 20e9,
              "request_overhead_s": 10e-3, "fp8_scale_overhead_s": 1e-3}
_VISIBLE_REL = 2e-3  # a parameter is visible if the probe moves some prediction by more than 0.2%

# Open-loop rows add their percentiles: the spread is what SLO attainment depends on, and a
# replay of the run's own arrivals predicts it request by request.
PERCENTILE_METRICS = ("ttft_p50_ms", "ttft_p90_ms", "tpot_p50_ms", "tpot_p90_ms")
# An open-loop row with a per-request log is also one figure per measured request: that request's
# TTFT and TPOT, the simulator replaying the very arrivals the engine saw. Past saturation the
# means hide which requests queued behind which prefills. On the live llama-server's runs
# (tests/data/live-llamacpp-overload, bench/RESULTS-overload.md), held out one at a time, the
# worst percentile miss was 31.6% fitting the means and 20.8% fitting the requests, the median
# 3.8% and 6.4%: so the requests are fitted when asked (--fit-metrics), reported always.
REQUEST_METRICS = ("request_ttft_ms", "request_tpot_ms")
METRICS = ("step_ms", "ttft_ms", "tpot_ms", "output_tok_s") + PERCENTILE_METRICS + REQUEST_METRICS
# what the fit's objective uses unless told (--fit-metrics): the means, as for closed-loop rows,
# and an open-loop row's requests one by one in place of its TTFT/TPOT means (those and the
# percentiles are predicted and reported)
FIT_METRICS = ("step_ms", "ttft_ms", "tpot_ms", "output_tok_s")
# One run's requests together weigh as much as this many figures per metric (its p50 and p90
# would be two): a run of 200 requests does not outweigh the closed-loop grid it is fitted with
REQUEST_FIGURES_PER_RUN = 2.0
# the mean each request metric stands in for
_REQUEST_MEAN = {"request_ttft_ms": "ttft_ms", "request_tpot_ms": "tpot_ms"}
# an open-loop row without a per-request log is simulated with this many Poisson arrivals at its
# rate (or its num_requests, when more), the first 10% left out as warm-up
OPEN_LOOP_MIN_REQUESTS = 200
OPEN_LOOP_DIFF_STEP = 0.03   # relative finite-difference step of a fit with open-loop rows (see fit_efficiency)
# The most requests one row's simulation may hold: a closed loop of C clients runs max(4 C, 64)
# requests, so 100,000 is 25,000 clients (the shipped tables' largest row: 144 clients, 1,024
# requests at once). Above it a row is refused, not simulated (concurrency 1e9 would allocate 30 GiB).
MAX_ROW_REQUESTS = 100_000


def measured_metrics(row: ProfileRow) -> dict[str, float]:
    """The figures of a row kvtune can predict: step_ms, or mean ttft_ms / tpot_ms / output_tok_s,
    and an open-loop row's TTFT/TPOT p50 and p90."""
    if row.kind == "step":
        return {"step_ms": row.step_ms} if row.step_ms and not row.spec_k else {}
    out = {}
    if row.ttft_mean_ms:
        out["ttft_ms"] = row.ttft_mean_ms
    if row.tpot_mean_ms and (row.output_tokens or 0) > 1:
        out["tpot_ms"] = row.tpot_mean_ms
    if row.output_tok_s:
        out["output_tok_s"] = row.output_tok_s
    if row.open_loop:
        for m in PERCENTILE_METRICS:
            v = getattr(row, m)
            if v and (m.startswith("ttft") or (row.output_tokens or 0) > 1):
                out[m] = v
    return out


def mape(pred: Sequence[float], meas: Sequence[float]) -> float:
    p, m = np.asarray(pred, float), np.asarray(meas, float)
    return float(np.mean(np.abs(p / m - 1.0)) * 100.0) if len(m) else float("nan")


# How far one measured figure may sit from the model and still be "fitted", in log units (one
# sigma): the shipped H100 calibrations' held-out TPOT errors are 5-10% per fold
# (profiles/calibrations/h100-sxm-*.yaml fit.cross_validation). With a Prior, the fit minimises
# sum((log pred/meas) / PRIOR_FIGURE_SD_LOG)^2 + sum(((p - p0) / sd_p)^2): a Gaussian likelihood with
# this spread and a Gaussian prior on each parameter (a MAP estimate).
PRIOR_FIGURE_SD_LOG = 0.1
# A term is held at the prior when the rows alone pin it this many times looser than the prior
# does (they add under 1/3^2 = 11% of the prior's information on it): the MAP fit would barely move
# it, and what it moves is the direction the rows cannot see
HOLD_SD_RATIO = 3.0


class NothingToFit(InputError):
    """The rows pin no parameter better than the prior: the prior is the answer."""


@dataclass(frozen=True)
class Prior:
    """What the fit is pulled toward: a calibration's parameters and one sigma for each (SI units).

    A parameter with no finite positive ``sd`` is not pulled (and not held: the rows decide).
    ``source`` says where the values and the widths came from."""

    efficiency: Efficiency
    sd: dict = field(default_factory=dict)
    source: str = ""

    def __post_init__(self):
        for k, v in self.sd.items():
            if k not in PARAM_BOUNDS:
                raise InputError(f"prior: unknown parameter '{k}' (known: {', '.join(PARAM_BOUNDS)})")
            if not isinstance(v, (int, float)) or math.isnan(v) or v < 0:
                raise InputError(f"prior: sd of {k} must be a number >= 0, got {v!r}")

    def width(self, name: str) -> float | None:
        v = self.sd.get(name)
        return float(v) if v is not None and 0 < v < math.inf else None

    def to_json(self) -> dict:
        return {"name": self.efficiency.name, "source": self.source, "params": self.efficiency.params(),
                "sd": dict(self.sd)}

    @classmethod
    def from_json(cls, d: dict) -> "Prior":
        return cls(Efficiency(**d["params"], name=d.get("name", "prior")), dict(d.get("sd", {})), d.get("source", ""))


def _prior_residual(p: np.ndarray, loss: str, f_scale: float) -> np.ndarray:
    """The residual whose robust cost equals ``p**2`` (so the prior stays Gaussian under soft_l1):
    soft_l1's rho(z) = 2 (sqrt(1 + z) - 1), z = (f / f_scale)^2; rho = (p / f_scale)^2 solves to
    f = f_scale t sqrt(1 + t^2 / 4), t = p / f_scale (least_squares scales rho by f_scale^2)."""
    if loss == "linear":
        return p
    if loss != "soft_l1":
        raise InputError(f"calibrate: a prior needs loss linear or soft_l1, got {loss!r}")
    t = p / f_scale
    return f_scale * t * np.sqrt(1.0 + t * t / 4.0)


# Engines whose default scheduler runs prefill batches alone while decodes wait (SGLang:
# enable_mixed_chunk is off by default, so a waiting prompt gets a prefill batch of its own before
# the next decode batch). vLLM V1 and TensorRT-LLM mix prefill chunks into the decode step.
PREFILL_FIRST_ENGINES = frozenset(e.name for e in REGISTRY.values() if e.prefill_first)
# engines whose admission holds pool room for the outputs (SGLang's new_token_ratio reserve,
# ``SimConfig.output_reserve``); on with or without mixed chunks. Both read costmodel.engines.
OUTPUT_RESERVE_ENGINES = frozenset(e.name for e in REGISTRY.values() if e.output_reserve)


class RowPredictor:
    """Predicts every measurable figure of profile rows under a given ``Efficiency``.

    ``predict(rows, eff)`` returns one ``{metric: value}`` per row. Step models are shared per
    (model, TP, dtypes). Request rows run the simulator: a closed loop at the row's concurrency
    (``costmodel.closed_loop.run_closed_loop``, the same path as ``kvtune simulate --concurrency``)
    with ``max(requests_per_client x C, min_requests)`` requests, the clients starting as the
    engine's benchmark does (``stagger``), warm-up and drain left out of the means (a row whose
    ``stats_window`` is ``whole_run``: its ``num_requests``, every client starting at once, every
    request in the means, as its load tool counted them); or an
    all-at-once batch of ``num_requests`` (output tok/s = tokens / makespan). ``chunk_tokens`` is
    the engine's prefill token budget unless the row records its own (``chunk_tokens`` on a
    request row: llama.cpp's ``-b``).
    """

    def __init__(self, gpu: GPU, chunk_tokens: int = 8192, requests_per_client: int = 4,
                 min_requests: int = 64, seed: int = 0, gpu_mem_util: float = GPU_MEM_UTIL,
                 stagger: bool | Collection[str] = False):
        # stagger: True / False for every row, or the engines whose rows' clients were staggered
        self.gpu, self.chunk_tokens, self.seed, self.stagger = gpu, chunk_tokens, seed, stagger
        self.requests_per_client, self.min_requests = requests_per_client, min_requests
        self.gpu_mem_util = gpu_mem_util
        self._logs: dict[str, RequestLog] = {}   # open-loop rows' per-request logs, read once

    def step_model(self, row: ProfileRow, eff: Efficiency) -> StepModel:
        return StepModel(get_model(row.model), self.gpu, row.tp, check_dtype(row.weight_dtype, f"row {row.id}: weight_dtype"),
                         check_dtype(row.kv_dtype, f"row {row.id}: kv_dtype"), eff, gpu_mem_util=self.gpu_mem_util)

    def __call__(self, rows: Sequence[ProfileRow], eff: Efficiency) -> list[dict[str, float]]:
        models: dict[tuple, StepModel] = {}
        out = []
        for r in rows:
            key = (r.model, r.tp, r.weight_dtype, r.kv_dtype)
            if key not in models:
                models[key] = self.step_model(r, eff)
            out.append(self.predict_row(models[key], r))
        return out

    def clients(self, row: ProfileRow) -> str:
        """``staggered`` or ``burst`` for this row's closed loop (``costmodel.closed_loop``). A
        whole-run row starts ``burst``: its load tool sent the first C requests at once to an idle
        engine and counted them (``closed_loop.STATS_WINDOWS``); a staggered start stands in for a
        long run's drifted steady state only, which such a row's means do not stop at."""
        if row.stats_window == "whole_run":
            return "burst"
        if isinstance(self.stagger, bool):
            return "staggered" if self.stagger else "burst"
        return "staggered" if canonical_engine(row.engine) in self.stagger else "burst"

    def staggered(self, row: ProfileRow) -> bool:
        return self.clients(row) == "staggered"

    def row_chunk_tokens(self, row: ProfileRow) -> int:
        return row.chunk_tokens if row.kind == "request" and row.chunk_tokens else self.chunk_tokens

    def predict_row(self, sm, row: ProfileRow) -> dict[str, float]:
        if row.kind == "step":
            if row.phase == "decode":
                return {"step_ms": sm.decode_step(row.batch, row.context_tokens).time_s * 1e3}
            chunk, prior = row.chunk_tokens or 0, row.context_tokens or 0
            t = sm.step_time_s(0, 0.0, chunk, StepModel.chunk_pairs(chunk, prior), prior)
            return {"step_ms": t * 1e3}
        return self._simulate(sm, row)

    def sim_config(self, row: ProfileRow, cap: int):
        """The engine's scheduler as the simulator runs it: the row's ``scheduler`` column, else
        the engine's default (SGLang's rows prefill first, ``PREFILL_FIRST_ENGINES``; the others mix
        prefill chunks into decode steps); SGLang's admission reserves room for outputs
        (``OUTPUT_RESERVE_ENGINES``); the row's ``kv_pool_tokens``, when recorded, is the pool, and
        its ``chunk_tokens`` the per-step token budget."""
        engine = canonical_engine(row.engine)
        first = row.scheduler == "prefill_first" if row.scheduler else engine in PREFILL_FIRST_ENGINES
        return SimConfig(batch_cap=cap, chunk_tokens=self.row_chunk_tokens(row), prefill_first=first,
                         output_reserve=engine in OUTPUT_RESERVE_ENGINES, kv_pool_tokens=row.kv_pool_tokens)

    def simulated_requests(self, row: ProfileRow) -> int:
        """How many requests a request row is simulated with (0 for a step row); a row beyond
        ``MAX_ROW_REQUESTS`` is refused here, before anything is allocated."""
        if row.kind != "request":
            return 0
        if row.rate_req_s is not None and math.isinf(row.rate_req_s):
            n = row.num_requests or row.concurrency or 0
            what = f"num_requests {n:,}"
        elif row.stats_window == "whole_run" and row.num_requests:
            n = row.num_requests
            what = f"num_requests {n:,}"
        else:
            c = row.concurrency or 0
            n = max(self.requests_per_client * c, self.min_requests)
            what = f"concurrency {c:,} ({self.requests_per_client} requests per client)"
        if n > MAX_ROW_REQUESTS:
            raise InputError(f"row {row.id}: {what} would simulate {n:,} requests; kvtune simulates at most "
                             f"{MAX_ROW_REQUESTS:,} per row")
        return n

    def closed_loop_requests(self, row: ProfileRow):
        """The requests a closed-loop row is simulated with: ``max(requests_per_client x C,
        min_requests)`` identical ones (a whole-run row: its ``num_requests``)."""
        c, isl, osl = row.concurrency, row.input_tokens, row.output_tokens
        if c is None or isl is None or osl is None:
            raise InputError(f"row {row.id}: a closed-loop row needs concurrency, input_tokens and output_tokens")
        return Requests.uniform(self.simulated_requests(row), isl, osl)

    def _simulate(self, sm, row: ProfileRow) -> dict[str, float]:
        isl, osl = row.input_tokens, row.output_tokens
        if isl is None or osl is None:
            raise InputError(f"row {row.id}: a request row needs input_tokens and output_tokens")
        if row.rate_req_s is not None and math.isinf(row.rate_req_s):
            n = row.num_requests or row.concurrency
            if not n:
                raise InputError(f"row {row.id}: an all-at-once row (rate_req_s inf) needs num_requests")
            self.simulated_requests(row)
            res = simulate(sm, Requests.uniform(n, isl, osl), self.sim_config(row, min(row.batch_cap or n, n)),
                           arrival="inf", seed=self.seed)
            ttft, tpot = np.asarray(res.ttft_s), np.asarray(res.tpot_s)
            return {"ttft_ms": float(ttft.mean() * 1e3), "tpot_ms": float(np.nanmean(tpot) * 1e3) if osl > 1 else math.nan,
                    "output_tok_s": float(res.output_tok_s)}
        if row.concurrency is None:
            return self.open_loop(sm, row)
        c = row.concurrency
        cap = min(row.batch_cap or c, c)  # an engine cap below the clients leaves requests queued
        res = run_closed_loop(sm, self.closed_loop_requests(row), self.sim_config(row, cap), c, self.clients(row),
                              self.seed, window=row.stats_window or "steady")
        keep = np.asarray(res.measured)
        ttft, tpot = np.asarray(res.ttft_s)[keep], np.asarray(res.tpot_s)[keep]
        out = {"ttft_ms": float(ttft.mean() * 1e3), "tpot_ms": float(tpot.mean() * 1e3) if osl > 1 else math.nan}
        if row.output_tok_s:
            out["output_tok_s"] = c * osl / float(np.mean(np.asarray(res.e2e_s)[keep]))
        return out


    def open_loop_requests(self, row: ProfileRow) -> tuple[Requests, np.ndarray, np.ndarray]:
        """(requests, counted, measured) an open-loop row is replayed with: its per-request log's
        sent times, served lengths, prefixes and targets (``costmodel.request_log``), counted =
        past warm-up, measured = counted and served; without a log, ``OPEN_LOOP_MIN_REQUESTS``
        (or ``num_requests``) Poisson arrivals at its rate with its mean lengths, seeded, the
        first 10% warm-up."""

        path = row.requests_path()
        if path is not None:
            key = str(path)
            if key not in self._logs:

                self._logs[key] = read_request_log(path)
            log = self._logs[key]
            req = log.to_requests()
            # a request without its own target takes the row's
            req = dataclasses.replace(
                req, ttft_slo_s=np.where(np.isinf(req.ttft_slo_s), (row.slo_ttft_ms or math.inf) / 1e3, req.ttft_slo_s),
                tpot_slo_s=np.where(np.isinf(req.tpot_slo_s), (row.slo_tpot_ms or math.inf) / 1e3, req.tpot_slo_s))
            return req, log.counted, log.measured
        rate, isl, osl = row.rate_req_s, row.input_tokens, row.output_tokens
        if rate is None or isl is None or osl is None:
            raise InputError(f"row {row.id}: an open-loop row needs rate_req_s, input_tokens and output_tokens")
        n = max(row.num_requests or 0, OPEN_LOOP_MIN_REQUESTS)
        gaps = np.random.default_rng(self.seed).exponential(1.0 / rate, size=n)
        arrival = np.concatenate(([0.0], np.cumsum(gaps[1:])))
        req = Requests.uniform(n, isl, osl, ttft_slo_s=(row.slo_ttft_ms or math.inf) / 1e3,
                               tpot_slo_s=(row.slo_tpot_ms or math.inf) / 1e3, arrival_s=arrival)
        counted = np.arange(n) >= n // 10
        return req, counted, counted

    def open_loop(self, sm, row: ProfileRow) -> dict[str, float]:
        """An open-loop row replayed (``open_loop_requests``) through the simulator at the row's
        batch cap (none recorded: no cap below the pool's), its pool, chunk budget and scheduler:
        means and p50/p90 of TTFT and TPOT over the measured requests, throughput, and
        ``attainment`` over the counted ones (not a fitted figure)."""
        req, counted, measured = self.open_loop_requests(row)
        res = simulate(sm, req, self.sim_config(row, row.batch_cap or len(req)), arrival="trace", seed=self.seed,
                       warmup_frac=0.0)
        each = {f"request_ttft_ms#{j}": float(res.ttft_s[j] * 1e3) for j in np.flatnonzero(measured)}
        each.update({f"request_tpot_ms#{j}": float(res.tpot_s[j] * 1e3) for j in np.flatnonzero(measured)
                     if np.isfinite(res.tpot_s[j])})
        ttft = np.asarray(res.ttft_s)[measured] * 1e3
        tpot = np.asarray(res.tpot_s)[measured] * 1e3
        tpot = tpot[np.isfinite(tpot)]
        out = {"ttft_ms": float(ttft.mean()), "output_tok_s": float(res.output_tok_s),
               "ttft_p50_ms": float(np.percentile(ttft, 50)), "ttft_p90_ms": float(np.percentile(ttft, 90)),
               "attainment": float(np.mean(np.asarray(res.met_slo)[counted])) if counted.any() else math.nan,
               **(each if row.requests_path() is not None else {})}
        if len(tpot):
            out.update(tpot_ms=float(tpot.mean()), tpot_p50_ms=float(np.percentile(tpot, 50)),
                       tpot_p90_ms=float(np.percentile(tpot, 90)))
        else:
            out.update(tpot_ms=math.nan, tpot_p50_ms=math.nan, tpot_p90_ms=math.nan)
        return out


@dataclass(frozen=True)
class PointFit:
    """One measured figure with kvtune's prediction before and after the fit."""

    id: str
    metric: str
    measured: float
    before: float
    after: float
    engine: str = ""
    model: str = ""
    tp: int = 1

    @property
    def err_before(self) -> float:
        return self.before / self.measured - 1.0

    @property
    def err_after(self) -> float:
        return self.after / self.measured - 1.0


@dataclass(frozen=True)
class FitResult:
    efficiency: Efficiency
    fitted: tuple[str, ...]
    uncertainty: dict[str, float]          # one sigma, SI units; 0 for parameters kept at base
    points: tuple[PointFit, ...]
    notes: tuple[str, ...] = ()
    success: bool = True
    message: str = ""
    nfev: int = 0
    rms_log_residual: float = 0.0
    # correlation of each pair of fitted parameters (from the same linearised covariance): near +-1
    # the rows cannot tell the two apart, only a combination of them
    correlation: dict = field(default_factory=dict)

    def mape(self, after: bool = True, metric: str | None = None, engine: str | None = None) -> float:
        pts = [p for p in self.points if (metric is None or p.metric == metric) and (engine is None or p.engine == engine)]
        return mape([p.after if after else p.before for p in pts], [p.measured for p in pts])

    def mape_by_metric(self, after: bool = True) -> dict[str, float]:
        return {m: self.mape(after, m) for m in METRICS if any(p.metric == m for p in self.points)}


def metric_of(key: str) -> str:
    """The metric of a target key: a request figure's key is ``request_ttft_ms#17`` (the log's row)."""
    return key.split("#", 1)[0]


def _read_log(row: ProfileRow, cache: dict | None = None) -> RequestLog | None:
    path = row.requests_path() if row.open_loop else None
    if path is None:
        return None

    if cache is None:
        return read_request_log(path)
    if str(path) not in cache:
        cache[str(path)] = read_request_log(path)
    return cache[str(path)]


def request_figures(row: ProfileRow, log: RequestLog | None = None) -> dict[str, float]:
    """An open-loop row's per-request figures (``request_ttft_ms#j``, ``request_tpot_ms#j``, j the
    log's row): every measured request's TTFT, and its TPOT where it streamed two tokens or more."""
    log = log if log is not None else _read_log(row)
    if log is None:
        return {}
    out: dict[str, float] = {}
    for j in np.flatnonzero(log.measured):
        if np.isfinite(log.ttft_ms[j]) and log.ttft_ms[j] > 0:
            out[f"request_ttft_ms#{j}"] = float(log.ttft_ms[j])
    for j in np.flatnonzero(log.measured):
        if np.isfinite(log.tpot_ms[j]) and log.tpot_ms[j] > 0:
            out[f"request_tpot_ms#{j}"] = float(log.tpot_ms[j])
    return out


def _targets(rows: Sequence[ProfileRow]) -> list[tuple[int, str, float]]:
    cache: dict = {}
    return [(i, k, v) for i, r in enumerate(rows)
            for k, v in {**measured_metrics(r), **request_figures(r, _read_log(r, cache))}.items()]


def _objective(targets: list[tuple[int, str, float]], metrics: Sequence[str]) -> list[tuple[int, str, float]]:
    """The targets a fit on ``metrics`` minimises: a row's TTFT/TPOT mean gives way to its requests'
    figures when those are fitted."""
    per_request = {(i, _REQUEST_MEAN[metric_of(k)]) for i, k, _ in targets if metric_of(k) in _REQUEST_MEAN
                   and metric_of(k) in metrics}
    return [t for t in targets if metric_of(t[1]) in metrics and (t[0], t[1]) not in per_request]


def _weights(targets: list[tuple[int, str, float]]) -> np.ndarray:
    """1 per figure; a run's request figures share ``REQUEST_FIGURES_PER_RUN`` per metric."""
    count: dict[tuple[int, str], int] = {}
    for i, k, _ in targets:
        count[(i, metric_of(k))] = count.get((i, metric_of(k)), 0) + 1
    return np.array([math.sqrt(REQUEST_FIGURES_PER_RUN / count[(i, metric_of(k))]) if metric_of(k) in _REQUEST_MEAN
                     else 1.0 for i, k, _ in targets])


def _point(rows: Sequence[ProfileRow], i: int, k: str, v: float, before: float, after: float) -> "PointFit":
    r = rows[i]
    rid = r.id + k[k.index("#"):] if "#" in k else r.id
    return PointFit(rid, metric_of(k), v, float(before), float(after), r.engine, r.model, r.tp)


def _flatten(pred: list[dict[str, float]], targets) -> np.ndarray:
    return np.array([pred[i][k] for i, k, _ in targets], dtype=float)


def evaluate(rows: Sequence[ProfileRow], eff: Efficiency, predict: Callable) -> list[PointFit]:
    """Predictions for every measured figure of ``rows`` under ``eff`` (before = after)."""
    t = _targets(rows)
    p = _flatten(predict(list(rows), eff), t)
    return [_point(rows, i, k, v, x, x) for (i, k, v), x in zip(t, p)]


def _probe_value(name: str, base: float) -> float:
    lo, hi = PARAM_BOUNDS[name]
    if name in _PROBE_ADD:
        return min(base + _PROBE_ADD[name], hi)
    return max(base / 4.0, lo)


def visible_params(rows: Sequence[ProfileRow], base: Efficiency, names: Sequence[str], predict: Callable,
                   metrics: Sequence[str] | None = None) -> list[str]:
    """Those of ``names`` whose probe (efficiency / 4, overhead + a few ms) moves some predicted
    figure of ``rows`` (of ``metrics``, default all) by more than 0.2%."""
    targets = _objective(_targets(rows), metrics or FIT_METRICS)
    if not targets:
        return []
    y0 = _flatten(predict(list(rows), base), targets)
    out = []
    for n in names:
        probe = base.with_params(**{n: _probe_value(n, getattr(base, n))})
        if np.max(np.abs(_flatten(predict(list(rows), probe), targets) / y0 - 1.0)) > _VISIBLE_REL:
            out.append(n)
    return out


def fit_efficiency(rows: Sequence[ProfileRow], gpu: GPU, base: Efficiency,
                   params: Sequence[str] | None = None, predict: Callable | None = None,
                   max_nfev: int = 60, name: str = "fitted", loss: str = "soft_l1",
                   f_scale: float = 0.1, metrics: Sequence[str] | None = None,
                   candidates: Sequence[str] = FIT_PARAMS, prior: Prior | None = None) -> FitResult:
    """Fit ``params`` (default: those of ``candidates`` the rows can see) starting from ``base``.

    ``loss``/``f_scale`` go to ``scipy.optimize.least_squares`` (after a plain least-squares
    stage that brings the start close): the default robust ``soft_l1``
    with scale 0.1 treats log residuals beyond ~10% as outliers (linear, not quadratic, cost), so a
    few points the model cannot describe (queueing the engine does and kvtune does not model) do
    not drag every parameter; ``loss="linear"`` is plain least squares.

    ``metrics`` limits which figures enter the objective (default all of ``METRICS``); the others
    are still predicted and reported before and after.

    ``prior``: the fit is a MAP estimate, each parameter pulled toward ``prior.efficiency`` with
    its width (``PRIOR_FIGURE_SD_LOG``); unless ``params`` names them, parameters the rows pin less
    tightly than the prior does (their data-only one-sigma, correlations included, from the
    Jacobian at the start, is over ``HOLD_SD_RATIO`` times the prior's) are held at the prior's value, and the notes
    say so. With a prior, fewer figures than parameters is allowed: the prior supplies the rest.

    Raises ``InputError`` if a named parameter is unknown or invisible in the rows, or if there
    are fewer than (parameters + 1) measured figures (without a prior).
    """
    rows = list(rows)
    predict = predict or RowPredictor(gpu)
    all_targets = _targets(rows)
    for m in metrics or ():
        if m not in METRICS:
            raise InputError(f"calibrate: unknown metric '{m}' (known: {', '.join(METRICS)})")
    targets = _objective(all_targets, metrics or FIT_METRICS)
    if not targets:
        raise InputError("calibrate: the rows hold no measured figure kvtune can predict (step_ms, ttft/tpot means, output_tok_s)")
    explicit = params is not None
    names = list(params) if params is not None else list(candidates)
    for n in names:
        if n not in PARAM_BOUNDS:
            raise InputError(f"calibrate: --params: unknown parameter '{n}' (known: {', '.join(PARAM_BOUNDS)})")
    if len(set(names)) != len(names):
        raise InputError(f"calibrate: --params: a parameter is named twice in {','.join(names)}")
    pulled = prior is not None and all(prior.width(n) for n in names)
    if explicit and not pulled and len(targets) < len(names) + 1:
        raise InputError(f"calibrate: {len(targets)} measured figures cannot fit {len(names)} parameters "
                         f"(need at least {len(names) + 1}); add rows or fit fewer --params")
    base = base.with_params(model_comm=True, name=name)
    meas = np.array([v for _, _, v in targets])
    weight = _weights(targets)
    y0 = _flatten(predict(rows, base), targets)
    notes = []
    visible = []
    for n in names:
        probe = base.with_params(**{n: _probe_value(n, getattr(base, n))})
        moved = np.max(np.abs(_flatten(predict(rows, probe), targets) / y0 - 1.0))
        if moved > _VISIBLE_REL:
            visible.append(n)
            continue
        why = "no TP>1 rows" if n in ("allreduce_latency_s", "link_efficiency") and all(r.tp == 1 for r in rows) \
            else "no measured figure depends on it"
        if explicit:
            raise InputError(f"calibrate: parameter {n} cannot be fitted from these rows ({why}); drop it from --params")
        notes.append(f"{n} kept at {getattr(base, n):.4g} (base): {why}")
    if prior is not None and not explicit and visible:
        for n, data_sd, prior_sd in _held_by_prior(rows, targets, base, visible, prior, predict, y0):
            visible.remove(n)
            notes.append(f"{n} held at the prior's {getattr(base, n):.4g}: the rows pin it to +-{data_sd:.2g} alone "
                         f"(prior +-{prior_sd:.2g}) and cannot separate it from the terms freed before it "
                         f"(data-only sigma over {HOLD_SD_RATIO:g} prior sigmas)")
        if not visible:
            raise NothingToFit("calibrate: the rows pin no parameter more tightly than the prior does: nothing to fit")
    if len(targets) < len(visible) + 1 and not (prior is not None and all(prior.width(n) for n in visible)):
        raise InputError(f"calibrate: {len(targets)} measured figures cannot fit {len(visible)} parameters "
                         f"(need at least {len(visible) + 1}); add rows or fit fewer --params")
    if not visible:
        raise InputError("calibrate: none of the parameters is visible in these rows")

    scale = np.array([_SCALE[n] for n in visible])
    lo = np.array([PARAM_BOUNDS[n][0] for n in visible]) / scale
    hi = np.array([PARAM_BOUNDS[n][1] for n in visible]) / scale
    x0 = np.array([getattr(base, n) for n in visible]) / scale
    x0 = np.clip(x0, lo + 1e-3 * (hi - lo), hi - 1e-3 * (hi - lo))  # least_squares wants a strict interior start

    def eff_of(x):
        return base.with_params(**{n: float(np.clip(v * s, PARAM_BOUNDS[n][0], PARAM_BOUNDS[n][1]))
                                   for n, v, s in zip(visible, x, scale)})

    pulls = [(i, getattr(prior.efficiency, n) / _SCALE[n], w / _SCALE[n])
             for i, n in enumerate(visible) if (w := prior.width(n))] if prior is not None else []
    n_data = len(targets)

    def resid_with(x, loss_now):
        r = weight * np.log(_flatten(predict(rows, eff_of(x)), targets) / meas)
        if not pulls:
            return r
        p = np.array([PRIOR_FIGURE_SD_LOG * (x[i] - c) / w for i, c, w in pulls])
        return np.concatenate([r, _prior_residual(p, loss_now, f_scale)])

    def resid(x):
        return resid_with(x, "linear")

    def resid_robust(x):
        return resid_with(x, loss)


    # Plain least squares first: from a far start (the ideal model misses by 50%+) a robust loss
    # sees every point as an outlier and its gradient vanishes; then the robust loss from there.
    # An open-loop replay's figures move in small jumps as a parameter moves (which request is
    # scheduled first flips: ~1% in mean TTFT between bandwidth efficiencies 0.0009 apart on
    # tests/test_open_loop_replay's workload), so a finite-difference step must span several for
    # the Jacobian to be the trend, not a jump. From bw 0.56 to the true 0.938 there, the fit
    # ends at 0.556 (step 1e-3), 0.746 (3e-3), 0.934 (1e-2), 0.938 (3e-2 and 0.1).
    diff_step = OPEN_LOOP_DIFF_STEP if any(r.open_loop for r in rows) else 1e-3
    sol = least_squares(resid, x0, bounds=(lo, hi), method="trf", x_scale="jac", diff_step=diff_step,
                        max_nfev=max_nfev)
    if loss != "linear":
        x1 = np.clip(sol.x, lo + 1e-6 * (hi - lo), hi - 1e-6 * (hi - lo))
        sol = least_squares(resid_robust, x1, bounds=(lo, hi), method="trf", x_scale="jac", diff_step=diff_step,
                            max_nfev=max_nfev, loss=loss, f_scale=f_scale)
    eff = eff_of(sol.x)
    data_fun = sol.fun[:n_data]
    dof = float(np.sum(weight ** 2)) - len(visible) + len(pulls)   # request figures count as their weight
    # sol.cost is the robust cost; with a prior its rows count as observations (dof), and the
    # figures' spread is at least the one the prior assumes
    s2 = float(np.sum(data_fun ** 2) / dof) if dof > 0 else float("nan")
    if pulls:
        s2 = max(s2, PRIOR_FIGURE_SD_LOG ** 2)
    J = sol.jac
    corr: dict[str, dict[str, float]] = {}
    try:
        cov = s2 * np.linalg.pinv(J.T @ J)
        sig = np.sqrt(np.clip(np.diag(cov), 0, None)) * scale
        d = np.sqrt(np.clip(np.diag(cov), 1e-300, None))
        c = cov / np.outer(d, d)
        corr = {a: {b: float(c[i, j]) for j, b in enumerate(visible) if j != i} for i, a in enumerate(visible)}
    except np.linalg.LinAlgError:
        sig = np.full(len(visible), np.nan)
    unc = {n: 0.0 for n in PARAM_BOUNDS}
    unc.update({n: float(s) for n, s in zip(visible, sig)})
    for n, x, x_lo, x_hi in zip(visible, sol.x, lo, hi):
        if x <= x_lo + 1e-6 * (x_hi - x_lo) or x >= x_hi - 1e-6 * (x_hi - x_lo):
            notes.append(f"{n} ended on its bound {x * _SCALE[n]:.4g}: the data push it further than physics allows")
    pred0, pred1 = predict(rows, base), predict(rows, eff)
    pts = tuple(_point(rows, i, k, v, pred0[i][k], pred1[i][k]) for i, k, v in all_targets)
    if metrics is not None:
        notes.append(f"objective: {', '.join(metrics)} only; other figures are reported, not fitted")
    if pulls and prior is not None:
        notes.append(f"regularised toward the prior ({prior.source or prior.efficiency.name}): "
                     f"{', '.join(visible[i] for i, _, _ in pulls)} pulled with the prior's widths, a figure trusted "
                     f"to {PRIOR_FIGURE_SD_LOG:.0%}")
    return FitResult(eff, tuple(visible), unc, pts, tuple(notes), bool(sol.success), str(sol.message),
                     int(sol.nfev), float(np.sqrt(np.sum(data_fun ** 2) / np.sum(weight ** 2))), corr)


def _held_by_prior(rows, targets, base: Efficiency, visible: Sequence[str], prior: Prior, predict: Callable,
                   y0: np.ndarray) -> list[tuple[str, float, float]]:
    """(name, data-only one sigma, prior one sigma) of each parameter to hold at the prior: from the
    Jacobian at ``base`` in prior-sigma units (a step of half a prior sigma), Fisher information
    J^T J / PRIOR_FIGURE_SD_LOG^2, marginal sigma = sqrt(diag(inverse)) over the freed set; the
    sigma reported for a held term is the one it would have alone."""
    named, cols = [], []
    for n in visible:
        sd = prior.width(n)
        if not sd:
            continue
        lo, hi = PARAM_BOUNDS[n]
        v = getattr(base, n)
        v1 = v + 0.5 * sd if v + 0.5 * sd <= hi else max(v - 0.5 * sd, lo)
        if v1 == v:
            continue
        y1 = _flatten(predict(list(rows), base.with_params(**{n: v1})), targets)
        named.append(n)
        cols.append(_weights(targets) * np.log(y1 / y0) / ((v1 - v) / sd))
    if not named:
        return []
    J = np.column_stack(cols)
    info = J.T @ J / PRIOR_FIGURE_SD_LOG ** 2

    def sds(idx: list[int]) -> np.ndarray:   # data-only marginal sigmas of the set, prior-sigma units
        sub = info[np.ix_(idx, idx)] + 1e-9 * np.eye(len(idx))
        return np.sqrt(np.clip(np.diag(np.linalg.inv(sub)), 0, None))

    # Greedy: free the term that keeps the set's widest data-only sigma smallest, while it stays
    # within HOLD_SD_RATIO prior sigmas; of two terms the rows move alike (a combination, not
    # each), the first freed carries the combination and the other is held.
    free: list[int] = []
    rest = list(range(len(named)))
    while rest:
        worst, pick = min((float(np.max(sds(free + [i]))), i) for i in rest)
        if worst > HOLD_SD_RATIO:
            break
        free.append(pick)
        rest.remove(pick)
    alone = {i: float(sds([i])[0]) for i in rest}
    return [(named[i], alone[i] * float(prior.width(named[i]) or 0), float(prior.width(named[i]) or 0))
            for i in rest]


@dataclass(frozen=True)
class FoldResult:
    held_out: str               # e.g. "tp=4"
    fit_points: int
    test_points: int
    mape_by_metric: dict = field(default_factory=dict)   # held-out MAPE per metric (after the fold's fit)
    max_abs_err_pct: float = 0.0


def cross_validate(rows: Sequence[ProfileRow], gpu: GPU, base: Efficiency, key: Callable[[ProfileRow], object],
                   params: Sequence[str] | None = None, predict: Callable | None = None,
                   max_nfev: int = 30, label: str = "fold", metrics: Sequence[str] | None = None) -> list[FoldResult]:
    """Leave-one-group-out: for each value of ``key(row)``, fit on the other rows and predict it."""
    rows = list(rows)
    predict = predict or RowPredictor(gpu)
    out = []
    for g in sorted({key(r) for r in rows}, key=str):
        train = [r for r in rows if key(r) != g]
        test = [r for r in rows if key(r) == g]
        try:
            res = fit_efficiency(train, gpu, base, params, predict, max_nfev=max_nfev, metrics=metrics)
        except InputError:
            # the remaining rows cannot see some parameter: fit only what they can
            res = fit_efficiency(train, gpu, base, None, predict, max_nfev=max_nfev, metrics=metrics)
        pts = evaluate(test, res.efficiency, predict)
        by = {m: mape([p.after for p in pts if p.metric == m], [p.measured for p in pts if p.metric == m])
              for m in METRICS if any(p.metric == m for p in pts)}
        worst = max((abs(p.err_after) for p in pts), default=0.0) * 100
        out.append(FoldResult(f"{label}={g}", len(_targets(train)), len(pts), by, worst))
    return out


# ---- held-out error: what a fit reports ---------------------------------------------------------
MAX_FOLDS = 8   # more distinct groups than this are binned into this many contiguous folds (CPU time)
CV_KINDS = ("auto", "none", "loo", "concurrency", "length", "tp")


def _length(r: ProfileRow) -> tuple:
    return (r.input_tokens or 0, r.output_tokens or 0)


def cv_key(rows: Sequence[ProfileRow], kind: str = "auto") -> tuple[str, Callable[[ProfileRow], object]] | None:
    """How to split ``rows`` into folds: ``(label, key)``, or None when they cannot be split (fewer
    than two groups, or ``kind`` none). ``auto``: by concurrency when the request rows hold more
    than one, else by (input, output) length, else by TP, else one row per fold (leave-one-out)."""
    if kind not in CV_KINDS:
        raise InputError(f"calibrate: --cv must be one of {', '.join(CV_KINDS)}, got {kind!r}")
    if kind == "none":
        return None
    req = [r for r in rows if r.kind == "request"]
    choices = {
        "concurrency": ("concurrency", lambda r: r.concurrency or 0),
        "length": ("length", _length),
        "tp": ("tp", lambda r: r.tp),
        "loo": ("row", lambda r: r.id),
    }
    if kind == "auto":
        if len({r.concurrency for r in req}) > 1:
            kind = "concurrency"
        elif len({_length(r) for r in req}) > 1:
            kind = "length"
        elif len({r.tp for r in rows}) > 1:
            kind = "tp"
        else:
            kind = "loo"
    label, key = choices[kind]
    return (label, key) if len({key(r) for r in rows}) > 1 else None


@dataclass(frozen=True)
class HeldOutFold:
    """One fold: the rows of ``held_out`` predicted by a fit on the others (``after``) and by the
    prior (``before``), with the ways the held-out rows lie outside the fitted ones."""

    held_out: str
    fit_points: int
    points: tuple[PointFit, ...]
    extrapolation: tuple[str, ...] = ()
    note: str = ""

    def to_json(self) -> dict:
        return {"held_out": self.held_out, "fit_points": self.fit_points, "test_points": len(self.points),
                "mape_pct": {m: v for m, v in held_out_mape(self.points, True).items()},
                "prior_mape_pct": {m: v for m, v in held_out_mape(self.points, False).items()},
                "max_abs_err_pct": max((abs(p.err_after) for p in self.points), default=0.0) * 100,
                "extrapolation": list(self.extrapolation), "note": self.note,
                "points": [dataclasses.asdict(p) for p in self.points]}

    @classmethod
    def from_json(cls, d: dict) -> "HeldOutFold":
        return cls(d["held_out"], d["fit_points"], tuple(PointFit(**p) for p in d["points"]),
                   tuple(d.get("extrapolation", ())), d.get("note", ""))


def held_out_mape(points: Sequence[PointFit], after: bool = True) -> dict[str, float]:
    """MAPE per metric, %, of ``after`` (the fit) or ``before`` (the prior)."""
    return {m: mape([p.after if after else p.before for p in points if p.metric == m],
                    [p.measured for p in points if p.metric == m])
            for m in METRICS if any(p.metric == m for p in points)}


_RANGE_FIELDS = (("concurrency", "concurrency"), ("input_tokens", "input length"), ("output_tokens", "output length"),
                 ("tp", "TP"), ("batch", "batch"), ("context_tokens", "context"), ("rate_req_s", "rate req/s"))


def extrapolation(fitted: Sequence[ProfileRow], held: Sequence[ProfileRow]) -> list[str]:
    """Lines naming each held-out row that lies outside the fitted rows' range (concurrency,
    lengths, TP, batch, context, rate) or on a model the fitted rows do not hold."""
    out = []
    models = {r.model for r in fitted}
    for r in held:
        why = []
        if r.model not in models:
            why.append(f"model {r.model} not among the fitted rows' ({', '.join(sorted(models))})")
        for f, label in _RANGE_FIELDS:
            v = getattr(r, f)
            seen = [getattr(x, f) for x in fitted if getattr(x, f) is not None and x.kind == r.kind]
            if v is None or not seen or (isinstance(v, float) and math.isinf(v)):
                continue
            if v < min(seen) or v > max(seen):
                why.append(f"{label} {v:g} outside the fitted rows' {min(seen):g}-{max(seen):g}")
        if why:
            out.append(f"row {r.id}: {'; '.join(why)}: extrapolated")
    return out


def held_out_folds(rows: Sequence[ProfileRow], key: Callable[[ProfileRow], object], label: str,
                   fit: Callable[[list[ProfileRow]], Efficiency], prior: Efficiency,
                   predict: Callable) -> list[HeldOutFold]:
    """Leave-one-group-out with any fitting procedure: for each value of ``key`` (binned into at
    most ``MAX_FOLDS`` contiguous folds), ``fit`` on the other rows, predict the group's rows with
    the result and with ``prior``. A fold whose rows cannot be fitted (``InputError``) predicts
    with the prior, said in its note."""
    rows = list(rows)
    groups = sorted({key(r) for r in rows}, key=lambda g: (str(type(g)), g) if not isinstance(g, str) else ("", g))
    bins = [groups[round(i * len(groups) / MAX_FOLDS):round((i + 1) * len(groups) / MAX_FOLDS)]
            for i in range(MAX_FOLDS)] if len(groups) > MAX_FOLDS else [[g] for g in groups]
    out = []
    for b in bins:
        if not b:
            continue
        test = [r for r in rows if key(r) in b]
        train = [r for r in rows if key(r) not in b]
        note = ""
        try:
            eff = fit(train)
        except InputError as e:
            eff, note = prior, f"the other rows cannot be fitted ({e}); the prior predicts this fold"
        before = {(p.id, p.metric): p.after for p in evaluate(test, prior, predict)}
        pts = tuple(PointFit(p.id, p.metric, p.measured, before[(p.id, p.metric)], p.after, p.engine, p.model, p.tp)
                    for p in evaluate(test, eff, predict))
        name = f"{label}={_fmt_group(b[0])}" + (f"..{_fmt_group(b[-1])}" if len(b) > 1 else "")
        out.append(HeldOutFold(name, len(_targets(train)), pts, tuple(extrapolation(train, test)), note))
    return out


def _fmt_group(g) -> str:
    return "x".join(map(str, g)) if isinstance(g, tuple) else str(g)
