"""The traffic model: request classes (length distributions, mix shares, shared prefixes) or a
recorded trace, an arrival rate and SLOs (``Workload``); sampled into a ``Requests`` batch for the
simulator. (``optimizer.workload`` reads the workload YAML file into one of these.)

Lengths are whole tokens >= 1. A length distribution is one of

    fixed      value                      every request has ``value`` tokens
    uniform    min, max                   integers in [min, max], both ends included
    lognormal  mean, sigma                ``mean`` is the mean of the length distribution itself
                                          (tokens), ``sigma`` the standard deviation of the
                                          underlying normal: mu = ln(mean) - sigma^2 / 2
    normal     mean, std                  in tokens

then rounded to the nearest integer and clipped to [min_tokens, max_tokens] (min_tokens >= 1).

Arrivals are Poisson at ``rate_req_s``: the first request arrives at t = 0 and the gaps are
exponential with mean 1/rate. Randomness is split into independent streams (arrival gaps, class
choice, lengths) from one seed, and gaps are drawn at rate 1 and divided by the rate: the same
seed at two rates gives the same requests, with arrival times scaled (common random numbers, so a
search over rates compares like with like).

Pure: no file reading here; ``optimizer.traces`` reads trace files into ``Trace``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from .errors import InputError
from .requests import Requests

__all__ = ["LengthDist", "RequestClass", "SLO", "Trace", "Workload", "DISTS", "MAX_LENGTH_TOKENS", "SLO_ATTAINMENT"]

# The longest length any spec may name: far beyond every model's context (the longest in the
# catalog, DeepSeek-V3, holds 163,840 tokens) and small enough that sums of lengths stay exact in
# int64 and float64. Beyond it a length is a typo, not a workload.
MAX_LENGTH_TOKENS = 10**9

# Parameter names of each distribution, in the order ``LengthDist.params`` holds them.
DISTS = {"fixed": ("value",), "uniform": ("min", "max"), "lognormal": ("mean", "sigma"), "normal": ("mean", "std")}


def _phi(x: float) -> float:
    """Standard normal density."""
    return math.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)


def _Phi(x: float) -> float:
    """Standard normal CDF (inf-safe)."""
    if x == math.inf:
        return 1.0
    if x == -math.inf:
        return 0.0
    return 0.5 * (1.0 + math.erf(x / math.sqrt(2)))


def _is_whole(v) -> bool:
    return not isinstance(v, bool) and isinstance(v, (int, float, np.integer)) and math.isfinite(v) and int(v) == v


@dataclass(frozen=True)
class LengthDist:
    """A distribution of token counts. Build with ``fixed``, ``uniform``, ``lognormal``, ``normal``."""

    dist: str                       # fixed | uniform | lognormal | normal
    params: tuple[float, ...]       # see DISTS: fixed (value,), uniform (min, max), lognormal (mean, sigma), normal (mean, std)
    min_tokens: int = 1             # clip floor, >= 1
    max_tokens: int | None = None   # clip ceiling, None = unbounded

    def __post_init__(self) -> None:
        if self.dist not in DISTS:
            raise InputError(f"unknown length distribution {self.dist!r}; use {', '.join(DISTS)}")
        names = DISTS[self.dist]
        if len(self.params) != len(names):
            raise InputError(f"{self.dist} length distribution takes ({', '.join(names)}), got {self.params!r}")
        object.__setattr__(self, "params", tuple(float(p) for p in self.params))
        p = self.params
        if not all(math.isfinite(x) for x in p):
            raise InputError(f"{self.dist} length distribution: parameters must be finite, got {p}")
        if any(abs(x) > MAX_LENGTH_TOKENS for x in p):
            raise InputError(f"{self.dist} length distribution: parameters must be at most {MAX_LENGTH_TOKENS:.0e} "
                             f"tokens, got {p}")
        if not _is_whole(self.min_tokens) or self.min_tokens < 1:
            raise InputError(f"length min must be a whole number >= 1 token, got {self.min_tokens!r}")
        if self.min_tokens > MAX_LENGTH_TOKENS or (self.max_tokens is not None and self.max_tokens > MAX_LENGTH_TOKENS):
            raise InputError(f"length min/max must be at most {MAX_LENGTH_TOKENS:.0e} tokens, "
                             f"got {self.min_tokens!r}/{self.max_tokens!r}")
        if self.max_tokens is not None and (not _is_whole(self.max_tokens) or self.max_tokens < self.min_tokens):
            raise InputError(f"length max must be a whole number >= min ({self.min_tokens}), got {self.max_tokens!r}")
        if self.dist == "fixed" and (not _is_whole(p[0]) or p[0] < 1):
            raise InputError(f"fixed length must be a whole number >= 1 token, got {p[0]:g}")
        if self.dist == "uniform" and (not (_is_whole(p[0]) and _is_whole(p[1])) or not 1 <= p[0] <= p[1]):
            raise InputError(f"uniform length needs whole numbers 1 <= min <= max, got min {p[0]:g}, max {p[1]:g}")
        if self.dist in ("lognormal", "normal"):
            if p[0] <= 0:
                raise InputError(f"{self.dist} length mean must be > 0 tokens, got {p[0]:g}")
            if p[1] < 0:
                raise InputError(f"{self.dist} length {names[1]} must be >= 0, got {p[1]:g}")

    # ---- constructors ------------------------------------------------------------------------
    @classmethod
    def fixed(cls, value: int) -> "LengthDist":
        return cls("fixed", (value,))

    @classmethod
    def uniform(cls, lo: int, hi: int) -> "LengthDist":
        return cls("uniform", (lo, hi), min_tokens=int(lo), max_tokens=int(hi))

    @classmethod
    def lognormal(cls, mean_tokens: float, sigma: float, min_tokens: int = 1,
                  max_tokens: int | None = None) -> "LengthDist":
        return cls("lognormal", (mean_tokens, sigma), min_tokens, max_tokens)

    @classmethod
    def normal(cls, mean_tokens: float, std_tokens: float, min_tokens: int = 1,
               max_tokens: int | None = None) -> "LengthDist":
        return cls("normal", (mean_tokens, std_tokens), min_tokens, max_tokens)

    # ---- bounds and moments ------------------------------------------------------------------
    @property
    def _hi(self) -> float:
        return math.inf if self.max_tokens is None else float(self.max_tokens)

    @property
    def lower_bound(self) -> int:
        """The smallest length a sample can take."""
        p = self.params
        if self.dist == "fixed":
            return int(min(max(p[0], self.min_tokens), self._hi))
        if self.dist == "uniform":
            return int(min(max(p[0], self.min_tokens), self._hi))
        return self.min_tokens

    @property
    def upper_bound(self) -> float:
        """The largest length a sample can take (inf when unbounded)."""
        p = self.params
        if self.dist in ("fixed", "uniform"):
            return float(max(min(p[-1], self._hi), self.min_tokens))
        return self._hi

    def quantile(self, q: float) -> float:
        """The ``q`` quantile of the clipped distribution, in tokens (before rounding)."""
        p, a, b = self.params, float(self.min_tokens), self._hi
        if self.dist == "fixed":
            x = p[0]
        elif self.dist == "uniform":
            x = p[0] + q * (p[1] - p[0])
        else:
            z = NormalDist().inv_cdf(min(max(q, 1e-12), 1 - 1e-12))
            if self.dist == "lognormal":
                x = math.exp(min(math.log(p[0]) - p[1] ** 2 / 2 + z * p[1], 700.0))
            else:
                x = p[0] + z * p[1]
        return float(min(max(x, a), b))

    @property
    def mean(self) -> float:
        """Analytic mean in tokens of the clipped distribution.

        Lognormal and normal use the mean of the continuous distribution censored at
        [min_tokens, max_tokens] (a*P(X<a) + b*P(X>b) + E[X; a<X<b]); rounding to whole tokens
        moves it by well under one token for any spread of more than a token.
        """
        p, a, b = self.params, float(self.min_tokens), self._hi
        if self.dist == "fixed":
            return float(min(max(p[0], a), b))
        if self.dist == "uniform":
            lo, hi = max(p[0], a), min(p[1], b)
            return (lo + hi) / 2 if lo <= hi else float(lo)
        if self.dist == "lognormal":
            mean, s = p
            if s == 0:
                return float(min(max(mean, a), b))
            mu = math.log(mean) - s * s / 2
            z = lambda x: (math.log(x) - mu) / s if x < math.inf else math.inf  # noqa: E731
            # E[X; X < x] = mean * Phi((ln x - mu - s^2) / s) for a lognormal
            partial = lambda x: mean * _Phi(z(x) - s) if x < math.inf else mean  # noqa: E731
            inside = partial(b) - partial(a)
            upper = b * (1 - _Phi(z(b))) if b < math.inf else 0.0
            # the clipped mean lies in [a, b]; clamp away floating-point spill past the bounds
            return min(max(a * _Phi(z(a)) + inside + upper, a), b)
        mean, s = p  # normal
        if s == 0:
            return float(min(max(mean, a), b))
        al, be = (a - mean) / s, (b - mean) / s
        upper = b * (1 - _Phi(be)) if b < math.inf else 0.0
        phi_be = _phi(be) if be < math.inf else 0.0
        return min(max(a * _Phi(al) + upper + mean * (_Phi(be) - _Phi(al)) + s * (_phi(al) - phi_be), a), b)

    # ---- sampling ----------------------------------------------------------------------------
    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` lengths as int64 >= 1, drawn from ``rng``."""
        p = self.params
        if self.dist == "fixed":
            x = np.full(n, p[0])
        elif self.dist == "uniform":
            x = rng.integers(int(p[0]), int(p[1]) + 1, size=n).astype(float)
        elif self.dist == "lognormal":
            x = rng.lognormal(math.log(p[0]) - p[1] ** 2 / 2, p[1], size=n)
        else:
            x = rng.normal(p[0], p[1], size=n)
        # an open tail (a wide normal or lognormal) stops at MAX_LENGTH_TOKENS, inside int64
        x = np.clip(np.rint(x), self.min_tokens, min(self._hi, MAX_LENGTH_TOKENS))
        return x.astype(np.int64)

    def to_dict(self) -> dict:
        """The YAML form of this distribution."""
        out: dict = {"dist": self.dist}
        for k, v in zip(DISTS[self.dist], self.params):
            out[k] = int(v) if float(v).is_integer() else v
        if self.dist != "uniform":
            if self.min_tokens != 1:
                out["min"] = self.min_tokens
            if self.max_tokens is not None:
                out["max"] = self.max_tokens
        return out


# The share of requests that must meet both targets where a workload gives none: DistServe's
# goodput is reported at 90% SLO attainment (Zhong et al., OSDI 2024).
SLO_ATTAINMENT = 0.9


@dataclass(frozen=True)
class SLO:
    """Latency targets: time to first token, time per output token, and the share of requests
    that must meet both. ``inf`` means no target."""

    ttft_ms: float = math.inf
    tpot_ms: float = math.inf
    attainment: float = SLO_ATTAINMENT

    def __post_init__(self) -> None:
        for f in ("ttft_ms", "tpot_ms"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
                raise InputError(f"slo {f} must be a number > 0, got {v!r}")
        a = self.attainment
        if isinstance(a, bool) or not isinstance(a, (int, float)) or not 0 < a <= 1:
            raise InputError(f"slo attainment must be in (0, 1], got {a!r}")


@dataclass(frozen=True)
class RequestClass:
    """One kind of request in the mix. ``prefix_tokens`` leading tokens are the same for every
    request of the class (system prompt, RAG header): prefix-cache candidates. ``ttft_ms`` and
    ``tpot_ms`` override the workload's SLO for this class when given."""

    name: str
    share: float
    input_tokens: LengthDist
    output_tokens: LengthDist
    prefix_tokens: int = 0
    ttft_ms: float | None = None
    tpot_ms: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise InputError(f"request class name must be a non-empty string, got {self.name!r}")
        s = self.share
        if isinstance(s, bool) or not isinstance(s, (int, float)) or not 0 < s <= 1:
            raise InputError(f"class {self.name}: share must be in (0, 1], got {s!r}")
        if not _is_whole(self.prefix_tokens) or self.prefix_tokens < 0:
            raise InputError(f"class {self.name}: prefix_tokens must be a whole number >= 0, got {self.prefix_tokens!r}")
        if self.prefix_tokens > self.input_tokens.lower_bound:
            raise InputError(f"class {self.name}: prefix_tokens {self.prefix_tokens} exceeds the shortest input "
                             f"({self.input_tokens.lower_bound} tokens)")
        for f in ("ttft_ms", "tpot_ms"):
            v = getattr(self, f)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0):
                raise InputError(f"class {self.name}: slo {f} must be a number > 0, got {v!r}")


def _as_array(v, dtype) -> np.ndarray:
    a = np.array(v, dtype=dtype)  # a private copy
    a.setflags(write=False)
    return a


@dataclass(frozen=True)
class Trace:
    """A recorded request log: one row per request, sorted by arrival, first arrival at t = 0."""

    arrival_s: np.ndarray      # float64, non-decreasing, starts at 0
    input_tokens: np.ndarray   # int64 >= 1
    output_tokens: np.ndarray  # int64 >= 1
    prefix_tokens: np.ndarray  # int64 in [0, input]: leading tokens shared with earlier requests
    prefix_group: np.ndarray   # int64, -1 = no shared prefix
    source: str = ""           # where it came from: format, file, rows kept and skipped

    def __post_init__(self) -> None:
        for f, dt in (("arrival_s", np.float64), ("input_tokens", np.int64), ("output_tokens", np.int64),
                      ("prefix_tokens", np.int64), ("prefix_group", np.int64)):
            object.__setattr__(self, f, _as_array(getattr(self, f), dt))
        n = len(self.arrival_s)
        where = f"trace {self.source}" if self.source else "trace"
        if n == 0:
            raise InputError(f"{where}: no requests")
        for f in ("input_tokens", "output_tokens", "prefix_tokens", "prefix_group"):
            if len(getattr(self, f)) != n:
                raise InputError(f"{where}: column {f} has {len(getattr(self, f))} rows, expected {n}")
        if not np.isfinite(self.arrival_s).all() or self.arrival_s[0] != 0 or (np.diff(self.arrival_s) < 0).any():
            raise InputError(f"{where}: arrival_s must be finite, sorted and start at 0")
        if self.input_tokens.min() < 1 or self.output_tokens.min() < 1:
            raise InputError(f"{where}: input and output lengths must be >= 1 token")
        if (self.prefix_tokens < 0).any() or (self.prefix_tokens > self.input_tokens).any():
            raise InputError(f"{where}: prefix_tokens must lie in [0, input_tokens]")

    def __len__(self) -> int:
        return len(self.arrival_s)

    @property
    def span_s(self) -> float:
        """Time from the first arrival to the last."""
        return float(self.arrival_s[-1])

    @property
    def period_s(self) -> float:
        """How long one replay lasts before the next copy starts: the span plus one mean gap."""
        n = len(self)
        return self.span_s * n / (n - 1) if n > 1 else 0.0

    @property
    def native_rate_req_s(self) -> float:
        """Mean arrival rate as recorded: (rows - 1) / span; inf when all arrive at once."""
        return (len(self) - 1) / self.span_s if self.span_s > 0 else math.inf


DRAW_MEMO = 64   # draws remembered (workload, requests, seed): a solve simulates a few dozen at many rates
_DRAWS: dict[tuple, tuple] = {}


@dataclass(frozen=True)
class Workload:
    """Either request ``classes`` (sampled, Poisson arrivals at ``rate_req_s``) or a ``trace``
    (replayed; ``rate_req_s`` or ``time_scale`` rescales its clock), plus the SLO."""

    classes: tuple[RequestClass, ...] = ()
    trace: Trace | None = None
    rate_req_s: float | None = None
    slo: SLO = SLO()
    time_scale: float | None = None  # trace only: arrival times are multiplied by this factor

    def __post_init__(self) -> None:
        object.__setattr__(self, "classes", tuple(self.classes))
        if bool(self.classes) == (self.trace is not None):
            raise InputError("workload: give either request classes or a trace (exactly one)")
        if self.classes:
            names = [c.name for c in self.classes]
            dup = {x for x in names if names.count(x) > 1}
            if dup:
                raise InputError(f"workload: class name {sorted(dup)[0]!r} is used twice")
            total = sum(c.share for c in self.classes)
            if abs(total - 1) > 1e-6:
                raise InputError(f"workload: class shares must sum to 1 (they sum to {total:g})")
            if self.time_scale is not None:
                raise InputError("workload: time_scale applies to a trace only")
        if self.rate_req_s is not None:
            _check_rate(self.rate_req_s, "workload rate_req_s")
        if self.time_scale is not None:
            t = self.time_scale
            if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 < t < math.inf:
                raise InputError(f"workload time_scale must be a number > 0, got {t!r}")
            if self.rate_req_s is not None:
                raise InputError("workload: give rate_req_s or time_scale for a trace, not both")

    # ---- analytic summaries (for screening) --------------------------------------------------
    @property
    def class_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.classes) if self.classes else ("trace",)

    @property
    def mean_input_tokens(self) -> float:
        if self.trace is not None:
            return float(self.trace.input_tokens.mean())
        return sum(c.share * c.input_tokens.mean for c in self.classes)

    @property
    def mean_output_tokens(self) -> float:
        if self.trace is not None:
            return float(self.trace.output_tokens.mean())
        return sum(c.share * c.output_tokens.mean for c in self.classes)

    @property
    def mean_prefix_tokens(self) -> float:
        """Mean leading tokens per request that are prefix-cache candidates."""
        if self.trace is not None:
            return float(self.trace.prefix_tokens.mean())
        return sum(c.share * c.prefix_tokens for c in self.classes)

    @property
    def mean_rate_req_s(self) -> float | None:
        """The arrival rate ``requests()`` uses by default (None: classes without a rate)."""
        if self.trace is None:
            return self.rate_req_s
        if self.rate_req_s is not None:
            return self.rate_req_s
        return self.trace.native_rate_req_s / (self.time_scale or 1.0)

    # ---- sampling ----------------------------------------------------------------------------
    def requests(self, n: int, seed: int, rate_req_s: float | None = None) -> Requests:
        """``n`` requests: sampled from the classes (Poisson arrivals) or replayed from the trace.

        ``rate_req_s`` overrides the workload's rate; ``math.inf`` puts every arrival at t = 0.
        A trace replays its first ``n`` rows (repeating it, each copy one ``period_s`` later, when
        ``n`` exceeds its rows), its clock scaled so that the replayed rows arrive at the rate
        asked for ((n - 1) / last arrival), or by ``time_scale`` when no rate is given.
        """
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
            raise InputError(f"number of requests must be a whole number >= 0, got {n!r}")
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise InputError(f"seed must be a whole number >= 0, got {seed!r}")
        rate = self.rate_req_s if rate_req_s is None else _check_rate(rate_req_s, "rate_req_s")
        if self.trace is not None:
            return self._replay(int(n), rate)
        if rate is None:
            raise InputError("workload: no arrival rate; give workload.rate_req_s or pass a rate")
        return self._sample(int(n), int(seed), rate)

    def _sample(self, n: int, seed: int, rate: float) -> Requests:
        """``n`` requests of seed ``seed`` at ``rate``: the draw at rate 1 (``_draw``, remembered:
        a search simulates one draw at many rates) with its arrival times divided by the rate."""
        try:
            key = (self, n, seed)
            parts = _DRAWS.get(key)
        except TypeError:       # a field that cannot be hashed: nothing remembered
            key, parts = None, None
        if parts is None:
            parts = self._draw(n, seed)
            if key is not None:
                if len(_DRAWS) >= DRAW_MEMO:
                    _DRAWS.pop(next(iter(_DRAWS)))      # the oldest first
                _DRAWS[key] = parts
        unit, cls, inp, out, pre, grp, ttft, tpot = parts
        if math.isinf(rate):
            arrival = np.zeros(n)
        else:
            arrival = unit / rate if n else np.zeros(0)
        # copies: a caller may change its requests' arrays, never the remembered draw
        return Requests(arrival_s=arrival, input_tokens=inp.copy(), output_tokens=out.copy(), prefix_tokens=pre.copy(),
                        prefix_group=grp.copy(), ttft_slo_s=ttft.copy(), tpot_slo_s=tpot.copy(),
                        class_idx=cls.copy(), class_names=self.class_names)

    def _draw(self, n: int, seed: int) -> tuple:
        """The rate-free part of ``_sample``: (arrival times at rate 1, class, prompt, output,
        prefix, prefix group, TTFT SLO, TPOT SLO), each of ``n``."""
        ss = np.random.SeedSequence(seed)
        r_arrival, r_class, *r_len = [np.random.default_rng(s) for s in ss.spawn(2 + 2 * len(self.classes))]
        gaps = r_arrival.exponential(1.0, size=n)
        unit = np.concatenate(([0.0], np.cumsum(gaps[1:]))) if n else np.zeros(0)
        cum = np.cumsum([c.share for c in self.classes])
        cls = np.minimum(np.searchsorted(cum / cum[-1], r_class.random(n), side="right"), len(self.classes) - 1)
        inp = np.empty(n, dtype=np.int64)
        out = np.empty(n, dtype=np.int64)
        pre = np.zeros(n, dtype=np.int64)
        grp = np.full(n, -1, dtype=np.int64)
        ttft = np.empty(n)
        tpot = np.empty(n)
        for i, c in enumerate(self.classes):
            m = cls == i
            k = int(m.sum())
            inp[m] = c.input_tokens.sample(r_len[2 * i], k)
            out[m] = c.output_tokens.sample(r_len[2 * i + 1], k)
            if c.prefix_tokens:
                pre[m] = c.prefix_tokens
                grp[m] = i
            ttft[m] = (self.slo.ttft_ms if c.ttft_ms is None else c.ttft_ms) / 1e3
            tpot[m] = (self.slo.tpot_ms if c.tpot_ms is None else c.tpot_ms) / 1e3
        return unit, cls.astype(np.int64), inp, out, pre, grp, ttft, tpot

    def _replay(self, n: int, rate: float | None) -> Requests:
        tr = self.trace
        if tr is None:
            raise InputError("workload: replay asked of a workload without a trace")
        rows = len(tr)
        idx = np.arange(n) % rows
        copy = np.arange(n) // rows
        arrival = tr.arrival_s[idx] + copy * tr.period_s
        if rate is not None:
            if math.isinf(rate):
                arrival = np.zeros(n)
            elif n > 1:
                if arrival[-1] <= 0:
                    raise InputError(f"trace {tr.source}: the first {n} requests all arrive at once; "
                                     f"cannot rescale them to {rate:g} req/s")
                arrival = arrival * ((n - 1) / arrival[-1] / rate)
        elif self.time_scale is not None:
            arrival = arrival * self.time_scale
        return Requests(arrival_s=arrival, input_tokens=tr.input_tokens[idx], output_tokens=tr.output_tokens[idx],
                        prefix_tokens=tr.prefix_tokens[idx], prefix_group=tr.prefix_group[idx],
                        ttft_slo_s=np.full(n, self.slo.ttft_ms / 1e3), tpot_slo_s=np.full(n, self.slo.tpot_ms / 1e3),
                        class_idx=np.zeros(n, dtype=np.int64), class_names=self.class_names)


def _check_rate(rate, what: str) -> float:
    if isinstance(rate, bool) or not isinstance(rate, (int, float, np.integer, np.floating)) or not rate > 0:
        raise InputError(f"{what} must be a number > 0 (or inf), got {rate!r}")
    return float(rate)
