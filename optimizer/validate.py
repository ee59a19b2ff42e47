"""``kvtune validate``: every row of measured tables predicted with the current model.

Rows are predicted exactly as the calibration predicts them (``costmodel.fit.RowPredictor``: step
rows with the step model, closed-loop rows through ``costmodel.closed_loop`` with the engine's
client rule, all-at-once rows as an offline batch), under the efficiency a command would use: the
``--calibration`` given, else the shipped calibration for the rows' GPU and engine, else (a GPU
kvtune ships none for) the ideal model. The report is measured against predicted, side by side,
with per-metric MAPE and bias (mean signed error: + means kvtune predicts high) and the worst rows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from kvtune.costmodel.calibration import ENGINES, efficiency_for
from kvtune.costmodel.closed_loop import STAGGERED_ENGINES, canonical_engine
from kvtune.costmodel.efficiency import IDEAL, Efficiency
from kvtune.costmodel.errors import DoesNotFit, InputError, ProfileDataMissing
from kvtune.costmodel.fit import METRICS, PointFit, RowPredictor, evaluate, measured_metrics
from kvtune.costmodel.hardware import GPU, get_gpu
from kvtune.costmodel.models import get_model
from kvtune.costmodel.profile_table import ProfileRow
from kvtune.costmodel.request_log import met_slo, read_request_log
from .loadgen import DEFAULT_CI_METHOD, attainment_interval

__all__ = ["MetricSummary", "ValidationGroup", "Validation", "OpenLoopCheck", "validate_rows", "open_loop_check",
           "summarise", "predictable"]


@dataclass(frozen=True)
class MetricSummary:
    metric: str
    points: int
    mape_pct: float
    bias_pct: float            # mean of (predicted / measured - 1): + = kvtune predicts high
    median_abs_err_pct: float
    max_abs_err_pct: float


@dataclass(frozen=True)
class ValidationGroup:
    """Rows of one GPU and engine, predicted under one efficiency."""

    gpu: str
    engine: str
    calibration: str           # the efficiency's source line
    points: tuple[PointFit, ...]


@dataclass(frozen=True)
class OpenLoopCheck:
    """An open-loop row: measured against predicted SLO attainment and latency percentiles, the
    simulator replaying the run's own arrivals and lengths (``replay``)."""

    id: str
    rate_req_s: float
    replay: str                          # what was replayed: the per-request log, or Poisson at the rate
    loadavg_1m: float | None
    threads: int | None
    measured_attainment: float | None    # over the counted (non-warm-up) requests; None: no SLO recorded
    measured_lo: float | None            # its confidence interval (method below)
    measured_hi: float | None
    counted: int
    interval: str
    predicted_attainment: float | None
    figures: dict = field(default_factory=dict)   # metric -> (measured, predicted): ttft/tpot mean, p50, p90

    @property
    def inside(self) -> bool | None:
        """The predicted attainment lies inside the measured interval (None: nothing to compare)."""
        if self.predicted_attainment is None or self.measured_lo is None or self.measured_hi is None:
            return None
        return self.measured_lo <= self.predicted_attainment <= self.measured_hi


@dataclass(frozen=True)
class Validation:
    groups: tuple[ValidationGroup, ...]
    skipped: tuple[str, ...] = field(default_factory=tuple)   # "row id: why"
    open_loop: tuple[OpenLoopCheck, ...] = ()

    @property
    def points(self) -> tuple[PointFit, ...]:
        return tuple(p for g in self.groups for p in g.points)

    def summary(self, engine: str | None = None) -> dict[str, MetricSummary]:
        pts = [p for g in self.groups if engine is None or g.engine == engine for p in g.points]
        return summarise(pts)

    def worst(self, n: int = 10) -> list[PointFit]:
        return sorted(self.points, key=lambda p: -abs(p.err_after))[:n]


def summarise(points: Sequence[PointFit]) -> dict[str, MetricSummary]:
    out = {}
    for m in METRICS:
        e = np.array([p.err_after for p in points if p.metric == m], dtype=float)
        if not len(e):
            continue
        a = np.abs(e) * 100
        out[m] = MetricSummary(m, len(e), float(a.mean()), float(e.mean() * 100), float(np.median(a)), float(a.max()))
    return out


def predictable(row: ProfileRow) -> str | None:
    """Why kvtune cannot predict this row (None: it can)."""
    if not measured_metrics(row):
        return "no measured figure kvtune predicts (step_ms, mean ttft/tpot, output_tok_s)"
    if row.kind == "request":
        if not row.input_tokens or not row.output_tokens:
            return "a request row needs input_tokens and output_tokens"
        inf = row.rate_req_s is not None and math.isinf(row.rate_req_s)
        log = row.requests_path()
        if row.open_loop and log is not None and not log.is_file():
            return f"open loop: its per-request log {log} is missing (requests_file {row.requests_file!r})"
        if inf and not (row.num_requests or row.concurrency):
            return "all-at-once row without num_requests"
    if row.kind == "step" and row.phase == "decode" and not (row.batch and row.context_tokens is not None):
        return "decode step row needs batch and context_tokens"
    return None


def _refuse_unpredictable(row: ProfileRow, pred: RowPredictor) -> None:
    """A row no prediction can be held against is refused before anything is simulated: a request
    longer than the model's context, more requests than a row may simulate."""
    try:
        pred.simulated_requests(row)
    except InputError as exc:
        raise InputError(f"validate: {exc}") from None
    arch = get_model(row.model)
    limit = arch.max_context_tokens
    if not limit:
        return
    if row.kind == "request" and row.input_tokens and row.output_tokens:
        need, what = row.input_tokens + row.output_tokens, "input_tokens + output_tokens"
    elif row.kind == "step":
        need, what = (row.context_tokens or 0) + (row.chunk_tokens or 0 if row.phase == "prefill" else 1), \
            "context_tokens" + (" + chunk_tokens" if row.phase == "prefill" else " + 1")
    else:
        return
    if need > limit:
        raise InputError(f"validate: row {row.id}: {what} = {need:,} exceeds {arch.name}'s context "
                         f"({limit:,} tokens); no engine serves it, so kvtune cannot predict it")


def _refuse_non_finite(points: Sequence[PointFit]) -> None:
    for p in points:
        if not math.isfinite(p.after):
            raise InputError(f"validate: row {p.id}: predicted {p.metric} = {p.after}: no simulated request of "
                             f"this row finished (does one request fit the KV pool at this TP and memory?); fix or "
                             f"remove the row")


def _efficiency(gpu: GPU, engine: str, calibration: str | None, mode: str) -> Efficiency:
    if mode == "ideal" or calibration == "ideal":
        return IDEAL
    if calibration:
        return efficiency_for("calibrated", gpu.name, calibration)
    try:
        return efficiency_for("calibrated", gpu.name, None, engine if engine in ENGINES else None)
    except ProfileDataMissing:
        return IDEAL.with_params(source=f"ideal: kvtune ships no calibration for {gpu.name} (datasheet peaks, "
                                        f"no overheads, no all-reduce cost)")


def validate_rows(rows: Sequence[ProfileRow], gpu_override: GPU | None = None, calibration: str | None = None,
                  engine: str | None = None, mode: str = "calibrated") -> Validation:
    """Predict every row (of ``engine`` when given) under the efficiency its GPU/engine runs with."""
    skipped = []
    checks: list[OpenLoopCheck] = []
    groups: dict[tuple[str, str], list[ProfileRow]] = {}
    for r in rows:
        e = canonical_engine(r.engine) or ""
        if engine and e and e != engine:
            continue
        why = predictable(r)
        if why:
            skipped.append(f"{r.id}: {why}")
            continue
        groups.setdefault((r.gpu or (gpu_override.name if gpu_override else ""), e), []).append(r)
    if not groups:
        raise InputError("validate: no row of the tables can be predicted" + (f" ({skipped[0]})" if skipped else ""))
    out = []
    for (gname, e), grows in sorted(groups.items()):
        if gpu_override is not None:
            gpu = gpu_override
        else:
            if not gname:
                raise InputError(f"validate: row {grows[0].id} names no gpu; give --gpu")
            try:
                gpu = get_gpu(gname)
            except InputError:
                raise InputError(f"validate: row {grows[0].id}: gpu {gname!r} is not in kvtune's catalog; give its "
                                 f"hardware file with --gpu FILE (see profiles/hardware-cpu-example.yaml)") from None
        eff = _efficiency(gpu, e or (engine or ""), calibration, mode)
        pred = RowPredictor(gpu, stagger=STAGGERED_ENGINES)
        models: set[tuple] = set()
        for r in grows:
            _refuse_unpredictable(r, pred)
            key = (r.model, r.tp, r.weight_dtype, r.kv_dtype)
            if key not in models:  # weights that do not fit: the error names the row
                models.add(key)
                try:
                    pred.step_model(r, eff)
                except DoesNotFit as exc:
                    raise DoesNotFit(f"validate: row {r.id}: {exc}") from None
        pts = tuple(evaluate(grows, eff, pred))
        _refuse_non_finite(pts)
        out.append(ValidationGroup(gpu.name, e or "any", eff.source, pts))
        checks += [open_loop_check(r, pred, eff) for r in grows if r.open_loop]
    return Validation(tuple(out), tuple(skipped), tuple(checks))


def open_loop_check(row: ProfileRow, pred: RowPredictor, eff: Efficiency) -> OpenLoopCheck:
    """Predict an open-loop row's attainment and percentiles and set them beside the measured
    ones; the measured attainment's interval is ``optimizer.loadgen``'s default (batch-means
    Wilson) over the per-request log, or plain Wilson on ``num_requests`` without one."""
    p = pred.open_loop(pred.step_model(row, eff), row)
    path = row.requests_path()
    lo = hi = att = None
    counted = 0
    method = DEFAULT_CI_METHOD
    if path is not None:
        log = read_request_log(path)
        req, cnt, _ = pred.open_loop_requests(row)
        order = np.argsort(log.arrival_s, kind="stable")
        _, out_tok = log.served_lengths()
        met = met_slo(log.ok, log.ttft_ms, log.tpot_ms, out_tok, req.ttft_slo_s * 1e3, req.tpot_slo_s * 1e3)
        met = met[order][cnt[order]]
        has_slo = bool(np.isfinite(req.ttft_slo_s).any() or np.isfinite(req.tpot_slo_s).any())
        counted = len(met)
        if has_slo and counted:
            att = float(met.mean())
            lo, hi, _ = attainment_interval(met, method=method)
        replay = f"per-request log {path.name} ({len(log)} requests, {int(log.warmup.sum())} warm-up)"
    else:
        replay = "Poisson arrivals at the row's rate and mean lengths (no per-request log)"
        method = "wilson"
        if row.attainment is not None and row.num_requests:
            att, counted = row.attainment, row.num_requests
            lo, hi, _ = attainment_interval(np.arange(counted) < round(att * counted), method=method)
    predicted = p.get("attainment") if att is not None else None
    figures = {m: (v, p[m]) for m, v in measured_metrics(row).items() if m != "output_tok_s"}
    return OpenLoopCheck(row.id, float(row.rate_req_s or math.nan), replay, row.loadavg_1m, row.threads, att, lo, hi,
                         counted, method, predicted if predicted is None or math.isfinite(predicted) else None,
                         figures)


def validation_dict(v: Validation, tables: Sequence[dict], worst: int = 10) -> dict:
    def ms(d: dict[str, MetricSummary]) -> dict:
        return {k: {"points": s.points, "mape_pct": s.mape_pct, "bias_pct": s.bias_pct,
                    "median_abs_err_pct": s.median_abs_err_pct, "max_abs_err_pct": s.max_abs_err_pct}
                for k, s in d.items()}

    return {
        "tables": list(tables),
        "summary": ms(v.summary()),
        "groups": [{"gpu": g.gpu, "engine": g.engine, "calibration": g.calibration, "rows": len({p.id for p in g.points}),
                    "summary": ms(summarise(g.points))} for g in v.groups],
        "points": [{"id": p.id, "engine": p.engine, "model": p.model, "tp": p.tp, "metric": p.metric,
                    "measured": p.measured, "predicted": p.after, "err_pct": p.err_after * 100} for p in v.points],
        "worst": [{"id": p.id, "metric": p.metric, "measured": p.measured, "predicted": p.after,
                   "err_pct": p.err_after * 100} for p in v.worst(worst)],
        "skipped": list(v.skipped),
        "open_loop": [{"id": c.id, "rate_req_s": c.rate_req_s, "replay": c.replay, "loadavg_1m": c.loadavg_1m,
                       "threads": c.threads,
                       "attainment": {"measured": c.measured_attainment, "lo": c.measured_lo, "hi": c.measured_hi,
                                      "counted": c.counted, "interval": c.interval, "confidence": 0.95,
                                      "predicted": c.predicted_attainment, "inside": c.inside},
                       "figures": {m: {"measured": a, "predicted": b, "err_pct": (b / a - 1) * 100}
                                   for m, (a, b) in c.figures.items()}} for c in v.open_loop],
        "clients": {"open_loop": "open-loop rows replay their per-request log's sent times and served lengths "
                                 "(warm-up and failed requests out of the statistics; failed ones count as misses)",
                    "rule": "closed-loop rows simulated as the calibration does: staggered clients for "
                            f"{', '.join(sorted(STAGGERED_ENGINES))}, a burst for the others; the first and last "
                            "C requests (warm-up, drain) left out of the means (costmodel/closed_loop.py)"},
    }

