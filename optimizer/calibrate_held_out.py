"""A calibration that reports its held-out error and is never worse than its prior without saying so.

``calibrate_checked`` is what ``kvtune calibrate`` runs:

1. The prior: the base calibration's parameters with a width per parameter (``prior_for``).
2. The fit (``optimizer.calibrate.calibrate``), regularised toward the prior; the terms the rows
   pin less tightly than the prior are held at the prior (``costmodel.fit.fit_efficiency``).
3. Cross-validation (``costmodel.fit.held_out_folds``): leave one concurrency (or length, or TP,
   or row) out, the same fitting procedure on the rest, and the prior's error on the same held-out
   rows beside the fit's, per metric.
4. Where the fit predicts the held-out rows worse than the prior on a metric, ``if_worse`` decides:
   ``hold`` (default) refits with the terms that metric is most sensitive to held at the prior
   and keeps that if it is no worse on any metric, else writes the prior's parameters; ``prior``
   writes the prior's parameters at once; ``keep`` keeps the fit. Whatever is worse is a warning
   naming the metric and the rows.
5. Rows given apart (``holdout``: e.g. the high concurrencies of a sweep) are predicted by the
   prior and the fit, never fitted, and extrapolation beyond the fitted rows is named.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import yaml

from kvtune.costmodel.calibration import shown_path
from kvtune.costmodel.efficiency import PARAM_BOUNDS, Efficiency
from kvtune.costmodel.errors import InputError
from kvtune.costmodel.files import profiles_path
from kvtune.costmodel.fit import (FitResult, HeldOutFold, NothingToFit, PointFit, Prior, cv_key, evaluate, extrapolation,
                                  held_out_folds, held_out_mape)
from kvtune.costmodel.hardware import GPU
from kvtune.costmodel.profile_table import ProfileRow

from .calibrate import DEFAULT_CANDIDATES, calibrate

__all__ = ["IF_WORSE", "PRIOR_RANGE_FRACTION", "HeldOutReport", "Checked", "prior_for", "calibrate_checked",
           "worse_lines"]

IF_WORSE = ("hold", "prior", "keep")
# A parameter neither the base file's fit nor the spread between shipped calibrations constrains
# (kept at its default in every file): a quarter of its physical range (costmodel.efficiency.PARAM_BOUNDS)
PRIOR_RANGE_FRACTION = 0.25
# "worse": the fit's held-out MAPE beyond the prior's by more than this many points (solver noise)
WORSE_TOLERANCE_PCT = 0.1
SHOW_ROWS = 6


def prior_for(path: Path | None, eff: Efficiency) -> Prior | None:
    """The prior a fit from the calibration file ``path`` is pulled toward (None for ideal: the
    datasheet peaks carry no uncertainty to weigh). One sigma per parameter, in quadrature:

    - the file's own ``uncertainty`` (the Jacobian sigma of its fit, a lower bound);
    - ``transfer_rel_sd`` x value, for a file derived from another GPU's;
    - the spread (population sd) of that parameter over the shipped calibrations of the same GPU
      (``profiles/calibrations/*.yaml``, e.g. h100-sxm's vLLM, SGLang, TensorRT-LLM and generic
      files): how far a term moves when the serving software changes on one GPU, the kind of
      difference a user's own engine build and settings make;
    - if all three are 0: ``PRIOR_RANGE_FRACTION`` of the parameter's physical range."""
    if path is None:
        return None
    d = yaml.safe_load(Path(path).read_text()) or {}
    unc = d.get("uncertainty") or {}
    rel = float(d.get("transfer_rel_sd") or 0.0)
    gpu = d.get("gpu")
    siblings = []
    for p in sorted(profiles_path("calibrations").glob("*.yaml")):
        s = yaml.safe_load(p.read_text()) or {}
        if s.get("gpu") == gpu and isinstance(s.get("params"), dict):
            siblings.append(s["params"])
    sd = {}
    how = {"file": 0, "spread": 0, "range": 0}
    for k, (lo, hi) in PARAM_BOUNDS.items():
        v = getattr(eff, k)
        own = float(unc.get(k) or 0.0)
        vals = [float(s[k]) for s in siblings if isinstance(s.get(k), (int, float))]
        spread = statistics.pstdev(vals) if len(vals) > 1 else 0.0
        w = math.sqrt(own ** 2 + (rel * v) ** 2 + spread ** 2)
        if w > 0:
            how["spread" if spread > own else "file"] += 1
        else:
            w = PRIOR_RANGE_FRACTION * (hi - lo)
            how["range"] += 1
        sd[k] = w
    src = (f"{eff.name} ({shown_path(Path(path))}): widths from its fit's sigma, the spread over {len(siblings)} "
           f"shipped {gpu} calibrations" + (f", its transfer sd {rel:.0%}" if rel else "")
           + f"; {how['range']} unconstrained terms at {PRIOR_RANGE_FRACTION:.0%} of their range")
    return Prior(eff, sd, src)


@dataclass(frozen=True)
class HeldOutReport:
    """Cross-validation of one fitting procedure: its folds, and the metrics on which it predicts
    the held-out rows worse than the prior."""

    label: str
    folds: tuple[HeldOutFold, ...]

    @property
    def points(self) -> list[PointFit]:
        return [p for f in self.folds for p in f.points]

    def mape(self, after: bool = True) -> dict[str, float]:
        return held_out_mape(self.points, after)

    def worse(self) -> list[str]:
        a, b = self.mape(True), self.mape(False)
        return [m for m in a if math.isfinite(a[m]) and a[m] > b[m] + WORSE_TOLERANCE_PCT]

    def to_json(self) -> dict:
        return {"label": self.label, "folds": len(self.folds), "mape_pct": self.mape(True),
                "prior_mape_pct": self.mape(False), "worse_than_prior": self.worse(),
                "extrapolation": [x for f in self.folds for x in f.extrapolation]}


@dataclass(frozen=True)
class Checked:
    """What ``calibrate_checked`` chose and why."""

    result: FitResult
    prior: Prior | None
    held_out: HeldOutReport | None           # the chosen fit's cross-validation
    holdout: HeldOutFold | None              # rows given apart, predicted by the prior and the fit
    choice: str                              # "fit", "fit, X held at the prior", "prior"
    tried: tuple[dict, ...] = ()             # each candidate's cross-validated MAPE
    warnings: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default_factory=tuple)

    def all_folds(self) -> list[HeldOutFold]:
        return list(self.held_out.folds if self.held_out else ()) + ([self.holdout] if self.holdout else [])

    def fold_records(self) -> list[dict]:
        """``fit.cross_validation`` entries (the keys the shipped files use, plus the prior's MAPE)."""
        return [{k: v for k, v in f.to_json().items() if k != "points"} for f in (self.held_out.folds if self.held_out else ())]

    def to_json_summary(self) -> dict:
        """``fit.held_out``: what was chosen, the prior, the cross-validated and given held-out MAPE."""
        d = self.to_json()
        if d["holdout"]:
            d["holdout"] = {k: v for k, v in d["holdout"].items() if k != "points"}
        if d["prior"]:
            d["prior"] = {"source": d["prior"]["source"], "sd": {k: float(f"{v:.3g}") for k, v in d["prior"]["sd"].items()}}
        return d

    def to_json(self) -> dict:
        return {"choice": self.choice, "prior": self.prior.to_json() if self.prior else None,
                "cross_validated": self.held_out.to_json() if self.held_out else None,
                "holdout": self.holdout.to_json() if self.holdout else None, "tried": list(self.tried)}


def _prior_result(rows: Sequence[ProfileRow], base: Efficiency, predict: Callable, note: str) -> FitResult:
    pts = tuple(evaluate(rows, base, predict))
    return FitResult(base, (), {k: 0.0 for k in PARAM_BOUNDS}, pts, (), True, f"prior kept: {note}", 0, 0.0)


def worse_lines(points: Sequence[PointFit], metrics: Sequence[str], what: str, prior_name: str) -> list[str]:
    """One line per metric of ``metrics``: the fit's and the prior's MAPE on ``points`` and the rows
    where the fit misses by more than the prior."""
    a, b = held_out_mape(points, True), held_out_mape(points, False)
    out = []
    for m in metrics:
        bad = sorted((p for p in points if p.metric == m and abs(p.err_after) > abs(p.err_before)),
                     key=lambda p: abs(p.err_before) - abs(p.err_after))
        shown = ", ".join(f"{p.id} ({p.err_after * 100:+.0f}% vs {p.err_before * 100:+.0f}%)" for p in bad[:SHOW_ROWS])
        more = f" and {len(bad) - SHOW_ROWS} more" if len(bad) > SHOW_ROWS else ""
        out.append(f"{m}: {what} MAPE {a[m]:.1f}% with the fit vs {b[m]:.1f}% with the prior ({prior_name}); "
                   f"worse on rows {shown}{more}")
    return out


def _sensitive_terms(res: FitResult, rows: Sequence[ProfileRow], metrics_worse: Sequence[str], prior: Prior | None,
                     predict: Callable) -> list[str]:
    """The fitted terms that move the ``metrics_worse`` figures at least as much as the others
    (mean |d log prediction| for a step of one prior sigma, or 10% of the value without a prior)."""
    pts0 = evaluate(rows, res.efficiency, predict)
    y0 = np.array([p.after for p in pts0])
    is_w = np.array([p.metric in metrics_worse for p in pts0])
    out = []
    for n in res.fitted:
        v = getattr(res.efficiency, n)
        lo, hi = PARAM_BOUNDS[n]
        step = (prior.width(n) if prior else None) or max(0.1 * abs(v), 1e-3 * (hi - lo))
        v1 = v + step if v + step <= hi else max(v - step, lo)
        y1 = np.array([p.after for p in evaluate(rows, res.efficiency.with_params(**{n: v1}), predict)])
        s = np.abs(np.log(y1 / y0))
        s_w = float(np.nanmean(s[is_w])) if is_w.any() else 0.0
        s_o = float(np.nanmean(s[~is_w])) if (~is_w).any() else 0.0
        if s_w > 0 and s_w >= s_o:
            out.append(n)
    return out


def _given(res: FitResult, rows: Sequence[ProfileRow], base: Efficiency, holdout: Sequence[ProfileRow],
           predict: Callable, prior_name: str, warnings: list[str]) -> HeldOutFold | None:
    """The rows given apart, predicted by the prior (before) and the fit (after); a metric the fit
    predicts worse is appended to ``warnings`` with its rows."""
    if not holdout:
        return None
    pts = evaluate(list(holdout), res.efficiency, predict)
    before = {(p.id, p.metric): p.after for p in evaluate(list(holdout), base, predict)}
    given = HeldOutFold("given held-out rows", len(res.points), tuple(
        PointFit(p.id, p.metric, p.measured, before[(p.id, p.metric)], p.after, p.engine, p.model, p.tp)
        for p in pts), tuple(extrapolation(rows, holdout)))
    a, b = held_out_mape(given.points, True), held_out_mape(given.points, False)
    warnings += worse_lines(given.points, [m for m in a if a[m] > b[m] + WORSE_TOLERANCE_PCT],
                            "held-out (--holdout)", prior_name)
    return given


def _refit_holding(held: list[str], res: FitResult, ho: HeldOutReport, rows: list[ProfileRow], fit: Callable,
                   cross: Callable, max_nfev: int, tried: list[dict], notes: list[str]
                   ) -> tuple[FitResult, HeldOutReport, str]:
    """Refit with ``held`` at the prior and cross-validate it; keep it if it leaves fewer metrics
    worse than the prior (``tried`` and ``notes`` say what was tried and chosen; the caller writes
    the prior if any metric is still worse)."""
    worse = ho.worse()
    what = f"fit, {', '.join(held)} held at the prior"
    try:
        res2, ho2 = fit(rows, held, max_nfev), cross(held)
    except InputError as e:
        notes.append(f"holding {', '.join(held)} at the prior leaves nothing the rows can fit ({e})")
        return res, ho, "fit"
    tried.append({"choice": what, "fitted": list(res2.fitted), "mape_pct": ho2.mape(True)})
    if len(ho2.worse()) < len(worse):
        notes.append(f"{', '.join(worse)} predicted worse than the prior held out; {', '.join(held)} (the terms "
                     f"{'it is' if len(worse) == 1 else 'they are'} most sensitive to) held at the prior's values")
        return res2, ho2, what
    notes.append(f"holding {', '.join(held)} at the prior left {', '.join(ho2.worse())} worse too: the first fit is kept")
    return res, ho, "fit"


def calibrate_checked(rows: Sequence[ProfileRow], gpu: GPU, base: Efficiency, prior: Prior | None,
                      params: Sequence[str] | None, predict: Callable, max_nfev: int = 60, name: str = "fitted",
                      metrics: Sequence[str] | None = None, cv: str = "auto", if_worse: str = "hold",
                      holdout: Sequence[ProfileRow] = (), fold_nfev: int | None = None,
                      log: Callable[[str], None] = lambda s: None) -> Checked:
    """Fit, cross-validate beside the prior, decide by ``if_worse`` (see the module docstring)."""
    if if_worse not in IF_WORSE:
        raise InputError(f"calibrate: --if-worse must be one of {', '.join(IF_WORSE)}, got {if_worse!r}")
    rows = list(rows)
    fold_nfev = fold_nfev or max(1, max_nfev // 2)
    prior_name = base.name

    def fit(train: list[ProfileRow], exclude: Sequence[str], nfev: int) -> FitResult:
        if params is not None:
            named = [p for p in params if p not in exclude]
            if not named:
                raise InputError("every named parameter is held at the prior")
            return calibrate(train, gpu, base, named, predict, nfev, name, metrics, prior=prior)
        return calibrate(train, gpu, base, None, predict, nfev, name, metrics,
                         candidates=[c for c in DEFAULT_CANDIDATES if c not in exclude], prior=prior)

    key = cv_key(rows, cv)

    def cross(exclude: Sequence[str]) -> HeldOutReport | None:
        if key is None:
            return None
        label, k = key
        log(f"cross-validating: leave one {label} out" + (f", {', '.join(exclude)} held" if exclude else ""))
        folds = held_out_folds(rows, k, label, lambda tr: fit(tr, exclude, fold_nfev).efficiency, base, predict)
        return HeldOutReport(f"leave one {label} out", tuple(folds))

    notes: list[str] = []
    warnings: list[str] = []
    try:
        res = fit(rows, (), max_nfev)
    except NothingToFit as e:
        res = _prior_result(rows, base, predict, f"{e}: the prior's parameters are written")
        return Checked(res, prior, None, _given(res, rows, base, holdout, predict, prior_name, warnings), "prior",
                       (), tuple(warnings), (f"{e}: the prior's parameters are written",))
    ho = cross(())
    tried = [{"choice": "fit", "fitted": list(res.fitted), **({"mape_pct": ho.mape(True)} if ho else {})}]
    choice = "fit"
    worse = ho.worse() if ho else []
    if worse and ho and if_worse == "hold":
        held = _sensitive_terms(res, rows, worse, prior, predict)
        if any(n not in held for n in res.fitted):
            res, ho, choice = _refit_holding(held, res, ho, rows, fit, cross, max_nfev, tried, notes)
        else:
            notes.append(f"every fitted term moves {', '.join(worse)} most")
        if ho.worse():
            notes.append(f"no candidate predicts the held-out rows as well as the prior on {', '.join(ho.worse())}: "
                         f"the prior's parameters are written (--if-worse keep writes the fit)")
            res, choice = _prior_result(rows, base, predict, notes[-1]), "prior"
    elif worse and ho and if_worse == "prior":
        notes.append("--if-worse prior: the fit predicts held-out rows worse than the prior on " + ", ".join(worse)
                     + "; the prior's parameters are written")
        res, choice = _prior_result(rows, base, predict, notes[-1]), "prior"
    worse = ho.worse() if ho else []
    if worse and ho:
        what = "the prior's parameters are written" if choice == "prior" else f"this fit is written (--if-worse {if_worse})"
        warnings += [f"{w}; {what}" for w in worse_lines(ho.points, worse, "cross-validated", prior_name)]
    given = _given(res, rows, base, holdout, predict, prior_name, warnings)
    if key is None:
        notes.append("no cross-validation: the rows form one group (or --cv none); the errors shown are in-sample")
    if prior is None:
        notes.append(f"base {base.name} carries no uncertainty: the fit is not regularised (--base calibrated or a "
                     f"calibration file pulls it toward that calibration)")
    return Checked(res, prior, ho, given, choice, tuple(tried), tuple(warnings), tuple(notes))

