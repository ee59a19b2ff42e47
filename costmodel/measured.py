"""Step times from a measured profile table, with the calibrated model outside the measured range.

``MeasuredStepModel(base, rows)`` answers like ``StepModel`` (the simulator cannot tell them
apart) but takes step times from the table's ``step`` rows for the same model, TP and dtypes:

- decode steps: linear interpolation of step_ms over (log batch, log context), from
  ``scipy.interpolate.LinearNDInterpolator`` on the measured points (1-D ``numpy.interp`` on the
  log axis when the table varies only one of the two);
- prefill chunks: the same over (log chunk, log(1 + cached context));
- a mixed step (decodes plus a prefill chunk): the base model's mixed time plus the measured
  minus modelled time of each part that lies inside the table (exact for pure steps).

Outside the measured points' convex hull the base model answers; ``source`` says which table
(and its sha256) and how many step evaluations fell back. Request rows are not used here: they
are for fitting (``costmodel.fit``).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING, Sequence

import numpy as np

from .errors import ProfileDataMissing
from .profile_table import ProfileRow
from .efficiency import Efficiency
from .hardware import GPU
from .memory import MemoryPlan
from .models import ModelArch
from .parallel import Parallel
from .step import SpecConfig, StepBreakdown, StepCost, StepModel, StepTerms, chunked_prefill_time_s
from scipy.interpolate import LinearNDInterpolator
from scipy.spatial import QhullError

__all__ = ["MeasuredStepModel"]


class _Surface:
    """step_ms over two positive axes, interpolated linearly on log axes; nan outside the data."""

    def __init__(self, a: np.ndarray, b: np.ndarray, t_ms: np.ndarray):
        la, lb = np.log(a), np.log(b)
        # average repeated measurements of the same point
        keys, inv = np.unique(np.stack([la, lb], 1), axis=0, return_inverse=True)
        t = np.bincount(inv.ravel(), weights=t_ms) / np.bincount(inv.ravel())
        self.points = keys
        self.t_ms = t
        self.range = (float(a.min()), float(a.max()), float(b.min()), float(b.max()))
        self._kind = None
        if len(keys) == 1:
            self._kind = "point"
        elif np.ptp(keys[:, 1]) == 0:
            self._kind, order = "a", np.argsort(keys[:, 0])
            self._x, self._y = keys[order, 0], t[order]
        elif np.ptp(keys[:, 0]) == 0:
            self._kind, order = "b", np.argsort(keys[:, 1])
            self._x, self._y = keys[order, 1], t[order]
        else:
            try:
                self._interp = LinearNDInterpolator(keys, t)
                self._kind = "2d"
            except QhullError:  # collinear points on a slanted line: use the nearest measured point only
                self._kind = "points"

    def __call__(self, a: float, b: float) -> float:
        a0, a1, b0, b1 = self.range
        if not (a0 * (1 - 1e-9) <= a <= a1 * (1 + 1e-9) and b0 * (1 - 1e-9) <= b <= b1 * (1 + 1e-9)):
            return math.nan  # outside the measured box: no interpolator call (the simulator asks per step)
        la, lb = math.log(a), math.log(b)
        tol = 1e-9
        if self._kind in ("point", "points"):
            hit = np.all(np.abs(self.points - [la, lb]) < tol, axis=1)
            return float(self.t_ms[hit][0]) if hit.any() else float("nan")
        if self._kind == "a":
            if abs(lb - self.points[0, 1]) > tol or not self._x[0] - tol <= la <= self._x[-1] + tol:
                return float("nan")
            return float(np.interp(la, self._x, self._y))
        if self._kind == "b":
            if abs(la - self.points[0, 0]) > tol or not self._x[0] - tol <= lb <= self._x[-1] + tol:
                return float("nan")
            return float(np.interp(lb, self._x, self._y))
        return float(self._interp([[la, lb]])[0])


class MeasuredStepModel:
    """A ``StepModel`` whose step times come from measured rows inside their range."""

    def __init__(self, base: StepModel, rows: Sequence[ProfileRow], table: str = "table", sha256: str = ""):
        self.base = base
        # step tables time the engine's iterations only: the front end's share of TTFT comes from base
        self.request_overhead_s = base.request_overhead_s
        k = base.speculation.k if base.speculation else 0
        m = base.model.name
        mine = [r for r in rows if r.kind == "step" and r.model == m and r.tp == base.tp
                and r.weight_dtype == base.weight_dtype and r.kv_dtype == base.kv_dtype and (r.spec_k or 0) == k]
        if not mine:
            raise ProfileDataMissing(
                f"measured table {table}: no step rows for model {m} tp {base.tp} weights {base.weight_dtype} "
                f"KV {base.kv_dtype} spec_k {k}")
        dec = [r for r in mine if r.phase == "decode"]
        pre = [r for r in mine if r.phase == "prefill"]
        self._dec = _Surface(np.array([r.batch for r in dec], float), np.array([max(r.context_tokens or 0, 1) for r in dec], float),
                             np.array([r.step_ms for r in dec], float)) if dec else None
        self._pre = _Surface(np.array([r.chunk_tokens or 1 for r in pre], float),
                             np.array([1.0 + (r.context_tokens or 0) for r in pre], float),
                             np.array([r.step_ms for r in pre], float)) if pre else None
        self.table, self.sha256 = table, sha256
        self.rows_used = len(mine)
        self.calls = 0
        self.fallbacks = 0

    # ---- costmodel.step.StepCost: the base model's configuration, measured step times ----------
    @property
    def model(self) -> ModelArch:
        return self.base.model

    @property
    def gpu(self) -> GPU:
        return self.base.gpu

    @property
    def tp(self) -> int:
        return self.base.tp

    @property
    def weight_dtype(self) -> str:
        return self.base.weight_dtype

    @property
    def kv_dtype(self) -> str:
        return self.base.kv_dtype

    @property
    def speculation(self) -> SpecConfig | None:
        return self.base.speculation

    @property
    def memory(self) -> MemoryPlan:
        return self.base.memory

    @property
    def eff(self) -> Efficiency:
        return self.base.eff

    @property
    def parallel(self) -> Parallel:
        return self.base.parallel

    @property
    def tokens_per_step(self) -> float:
        return self.base.tokens_per_step

    @property
    def verify_tokens_per_seq(self) -> int:
        return self.base.verify_tokens_per_seq

    @property
    def has_sliding_window(self) -> bool:
        return self.base.has_sliding_window

    @property
    def prefill_overhead_s(self) -> float:
        return self.base.prefill_overhead_s

    def weight_read_bytes(self, n_tokens: float) -> float:
        return self.base.weight_read_bytes(n_tokens)

    def plain_decode_mem_s(self, n_decode: float, decode_ctx_sum: float) -> float:
        raise NotImplementedError("measured step times have no closed form (closed_form_ok is False)")

    def plain_decode_compute_coeffs(self, n_decode: float) -> tuple[float, float]:
        raise NotImplementedError("measured step times have no closed form (closed_form_ok is False)")

    chunk_pairs = staticmethod(StepModel.chunk_pairs)
    # The simulator's closed-form decode runs (sim_clock.DecodeClock) assume T(context) is
    # piecewise linear with the base model's kinks; interpolated tables are not, so ask it to step.
    closed_form_ok = False

    def step_terms(self, n_decode: float, decode_ctx_sum: float, prefill_tokens: float,
                   prefill_pairs: float, prefill_kv_read: float) -> StepTerms:
        """``breakdown``'s numbers as ``StepModel.step_terms`` gives them (time measured inside the table)."""
        b = self.breakdown(n_decode, decode_ctx_sum, prefill_tokens, prefill_pairs, prefill_kv_read)
        return b.time_s, b.mem_s, b.compute_s, b.comm_s, b.draft_s, b.bytes_per_gpu, b.flops_per_gpu

    @property
    def source(self) -> str:
        parts = []
        if self._dec:
            a0, a1, b0, b1 = self._dec.range
            parts.append(f"decode batch {a0:g}-{a1:g} x context {b0:g}-{b1:g}")
        if self._pre:
            a0, a1, b0, b1 = self._pre.range
            parts.append(f"prefill chunk {a0:g}-{a1:g} x cached {b0 - 1:g}-{b1 - 1:g}")
        sha = f" (sha256 {self.sha256[:12]})" if self.sha256 else ""
        return (f"measured table {self.table}{sha} inside range [{'; '.join(parts)}]; "
                f"{self.base.eff.source} outside ({self.fallbacks} of {self.calls} step evaluations fell back)")

    def _measured_decode_ms(self, n: float, ctx_sum: float) -> float:
        if not self._dec or n <= 0:
            return float("nan")
        return self._dec(n, max(ctx_sum / n, 1.0))

    def _measured_prefill_ms(self, tokens: float, prior: float) -> float:
        if not self._pre or tokens <= 0:
            return float("nan")
        return self._pre(tokens, 1.0 + prior)

    def breakdown(self, n_decode: float, decode_ctx_sum: float, prefill_tokens: float = 0.0,
                  prefill_pairs: float = 0.0, prefill_kv_read: float = 0.0) -> StepBreakdown:
        b = self.base
        full = b.breakdown(n_decode, decode_ctx_sum, prefill_tokens, prefill_pairs, prefill_kv_read)
        if n_decode <= 0 and prefill_tokens <= 0:
            return full
        self.calls += 1
        t = full.time_s
        used = False
        if n_decode > 0:
            md = self._measured_decode_ms(n_decode, decode_ctx_sum)
            if np.isfinite(md):
                alone = b.breakdown(n_decode, decode_ctx_sum).time_s if prefill_tokens > 0 else full.time_s
                t += md * 1e-3 - alone
                used = True
        if prefill_tokens > 0:
            mp = self._measured_prefill_ms(prefill_tokens, prefill_kv_read)
            if np.isfinite(mp):
                alone = (b.breakdown(0, 0.0, prefill_tokens, prefill_pairs, prefill_kv_read).time_s
                         if n_decode > 0 else full.time_s)
                t += mp * 1e-3 - alone
                used = True
        if not used:
            self.fallbacks += 1
            return full
        return replace(full, time_s=max(t, 0.0))

    def step_time_s(self, n_decode: float, decode_ctx_sum: float, prefill_tokens: float = 0.0,
                    prefill_pairs: float = 0.0, prefill_kv_read: float = 0.0) -> float:
        return self.breakdown(n_decode, decode_ctx_sum, prefill_tokens, prefill_pairs, prefill_kv_read).time_s

    def decode_step(self, batch: int, context: float) -> StepBreakdown:
        self.base.decode_step(batch, context)  # same input checks
        return self.breakdown(batch, batch * float(context))

    def prefill_time_s(self, prompt_tokens: int, cached_tokens: int = 0, chunk_tokens: int | None = None) -> float:
        # StepModel's chunk loop, over this model's (measured where possible) step times
        return chunked_prefill_time_s(self.step_time_s, prompt_tokens, cached_tokens, chunk_tokens)


if TYPE_CHECKING:
    # Both step models implement the simulator's protocol explicitly: mypy (a CI gate) checks these
    # two declarations member by member, so a renamed or retyped term fails the build.
    _ANALYTIC_STEP: type[StepCost] = StepModel
    _MEASURED_STEP: type[StepCost] = MeasuredStepModel
