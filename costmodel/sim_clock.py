"""Closed-form time of a run of pure decode steps: what lets the simulator skip iterations.

Between scheduler events the running set is fixed: ``n`` sequences decode, each step their cached
contexts grow by ``g`` tokens in total (``n`` without speculation), so step ``j`` of the run sees a
context sum ``c_j = c0 + j g``. For a fixed ``n`` the step time of ``StepModel.breakdown`` is a
piecewise-linear function of that sum::

    T(c) = max(mem(c), comp(c)) + comm + overhead + draft_frac * max(plain_mem(c), plain_comp(c))

where mem/comp are affine in ``c`` (sliding-window layers add one kink at ``c = n x window``, where
the per-sequence context reaches the window). On a piece where ``T(c) = a + b c`` the time of ``m``
steps is an arithmetic series::

    S(m) = m (a + b c0) + b g m (m - 1) / 2

and the number of steps until a time ``tau`` is the root of that quadratic. ``DecodeClock`` finds
the kinks from the step model's coefficients, measures each piece's ``a`` and ``b`` by calling
``StepModel.step_time_s`` itself (so the pieces cannot drift from the cost model), and checks the
piece at its midpoint; a step model that is not piecewise linear falls back to stepping one
iteration at a time (``pieces`` returns None), as does one that says so itself with
``closed_form_ok = False`` (measured tables interpolate step times: not piecewise linear).
"""

from __future__ import annotations

import math

from .step import StepCost

__all__ = ["DecodeClock", "clock_for"]

_INF = math.inf


class DecodeClock:
    """Sums and inverts decode step times for a fixed batch of ``n`` sequences (cached per ``n``)."""

    def __init__(self, step: StepCost):
        self.step = step
        self._cache: dict[int, tuple | None] = {}

    # ---- pieces ------------------------------------------------------------------------------
    def _kinks(self, n: int) -> list[float]:
        """Context sums where the slope of T(c) may change, for ``n`` decode sequences."""
        s, m = self.step, self.step.model
        kinks: list[float] = []
        regions = [(0.0, _INF)]
        if m.n_sliding_layers and m.sliding_window:
            kw = float(n * m.sliding_window)
            kinks.append(kw)
            regions = [(0.0, kw), (kw, _INF)]
        for lo, hi in regions:
            # mem_s and compute_s are affine inside a region: intersect them
            x0 = lo + 1.0 if hi == _INF else lo + 0.25 * (hi - lo)
            x1 = x0 + 1e6 if hi == _INF else lo + 0.75 * (hi - lo)
            b0, b1 = s.breakdown(n, x0), s.breakdown(n, x1)
            dm = (b1.mem_s - b0.mem_s) / (x1 - x0)
            dc = (b1.compute_s - b0.compute_s) / (x1 - x0)
            if dm != dc:
                x = x0 + (b0.compute_s - b0.mem_s) / (dm - dc)
                if lo < x < hi:
                    kinks.append(x)
            if s.speculation is not None:
                # draft: max(plain_mem, plain_comp) of a plain (non-speculative) step of n sequences
                pc0, pc1 = s.plain_decode_compute_coeffs(n)

                def pm(c: float) -> float:
                    return s.plain_decode_mem_s(n, c)

                pm_slope = (pm(x1) - pm(x0)) / (x1 - x0)
                if pm_slope != pc1:
                    x = x0 + (pc0 + pc1 * x0 - pm(x0)) / (pm_slope - pc1)
                    if lo < x < hi:
                        kinks.append(x)
        return sorted(set(k for k in kinks if k > 0))

    def pieces(self, n: int) -> tuple | None:
        """((hi, a, b), ...) with T(c) = a + b c for c below hi (pieces in increasing c), or None."""
        if n in self._cache:
            return self._cache[n]
        if not self.step.closed_form_ok:
            self._cache[n] = None  # no probing: it would count as step evaluations of the model
            return None
        f = self.step.step_time_s
        edges = [0.0] + self._kinks(n) + [_INF]
        out = []
        ok = True
        for lo, hi in zip(edges[:-1], edges[1:]):
            if hi == _INF:
                x0, x1 = lo + 1.0, lo + 1.0 + max(lo, 1e6)
                xm = 0.5 * (x0 + x1)
            else:
                x0, x1, xm = lo + 0.25 * (hi - lo), lo + 0.75 * (hi - lo), lo + 0.5 * (hi - lo)
            t0, t1 = f(n, x0), f(n, x1)
            b = (t1 - t0) / (x1 - x0)
            a = t0 - b * x0
            tm = f(n, xm)
            if abs(a + b * xm - tm) > 1e-9 * tm:
                ok = False
                break
            out.append((hi, a, b))
        res = tuple(out) if ok else None
        self._cache[n] = res
        return res

    # ---- sums and inverses ---------------------------------------------------------------------
    @staticmethod
    def time_of_steps(pieces: tuple, c0: float, g: float, m: int) -> float:
        """Seconds of ``m`` decode steps whose context sums are c0, c0 + g, ..., c0 + (m-1) g."""
        total = 0.0
        j = 0
        for hi, a, b in pieces:
            cj = c0 + j * g
            if cj >= hi:
                continue
            last = c0 + (m - 1) * g
            if last < hi or g <= 0:
                k = m - j
                return total + k * (a + b * cj) + b * g * k * (k - 1) * 0.5
            jn = math.ceil((hi - c0) / g)  # first step index at or past hi
            if jn <= j:
                jn = j + 1
            k = jn - j
            total += k * (a + b * cj) + b * g * k * (k - 1) * 0.5
            j = jn
            if j >= m:
                return total
        return total

    @staticmethod
    def steps_until(pieces: tuple, c0: float, g: float, tau: float) -> int:
        """Smallest m >= 1 with time_of_steps(m) >= tau (tau > 0)."""
        total = 0.0
        j = 0
        for hi, a, b in pieces:
            cj = c0 + j * g
            if cj >= hi:
                continue
            a1 = a + b * cj          # time of the piece's first step
            b1 = b * g               # growth per step
            r = tau - total
            # k steps in this piece take a1 k + b1 k (k-1)/2; solve = r for the real root
            p = a1 - 0.5 * b1
            if b1 > 0:
                disc = math.sqrt(p * p + 2.0 * b1 * r)
                kr = 2.0 * r / (p + disc) if p > 0 else (disc - p) / b1
            else:
                kr = r / a1
            k = max(1, math.ceil(kr - 1e-9))
            while k > 1 and a1 * (k - 1) + b1 * (k - 1) * (k - 2) * 0.5 >= r:
                k -= 1
            while a1 * k + b1 * k * (k - 1) * 0.5 < r:
                k += 1
            if hi == _INF or g <= 0:
                return j + k
            kmax = max(math.ceil((hi - c0) / g) - j, 1)  # steps that stay in this piece
            if k <= kmax:
                return j + k
            total += a1 * kmax + b1 * kmax * (kmax - 1) * 0.5
            j += kmax
        return j + 1  # unreachable for a final piece that extends to infinity


def clock_for(step: StepCost) -> DecodeClock:
    """The ``DecodeClock`` of ``step``, kept on the model itself and shared by every simulation of
    it: its pieces are a pure function of (the model, n), and a solve simulates each config
    hundreds of times, each meeting the same batch sizes. A model that takes no new attribute
    gets a fresh clock."""
    clock = getattr(step, "_decode_clock", None)
    if clock is None:
        clock = DecodeClock(step)
        try:
            setattr(step, "_decode_clock", clock)  # noqa: B010  (StepCost, a protocol, declares no such member)
        except AttributeError:
            pass
    return clock
