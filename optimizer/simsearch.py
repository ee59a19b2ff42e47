"""The simulator search: every lattice config that fits, raced against the best simulated so far.

The analytic screen (``optimizer.screen``) only orders the race and sizes simulations; what is
recommended is decided by the simulator. Stages, each a batch of independent simulations:

1. zero load: one simulation per (TP, KV dtype, speculation length, chunk budget) at a trickle
   (``ZERO_LOAD_SHARE`` x the decode-bound capacity; the batch cap cannot matter there). Its
   attainment bounds attainment at every rate, so a group that misses the target here is out,
   with the reason (which SLO, by how much; requests that can never fit the KV pool). When every
   group misses, that is the answer to "infeasible": no config meets the SLOs even at vanishing load.
   A short probe decides alone only where its exact binomial interval (requests are independent at
   a trickle) lies wholly on one side of the target.
2. seeds (max_goodput): the ``SEEDS`` best configs by screened objective, one per structure, verified.
3. the race, in prior order (``_prior``: min_cost the screened deployments in the recommendation's
   own order, so the best of a price is raced before its weaker neighbours, which its bar then
   prunes or beats on a short run), ``BATCH`` configs at a time: each config gets the per-replica rate it
   would have to serve to beat the best verified deployment (``bar_req_s``), then
      - pruned without simulating when its decode-bound capacity x ``CAPACITY_SLACK`` is below
        the bar, or when it cannot beat the best at any rate (needs fewer GPUs than its TP);
      - a short simulation (``SHORT_SHARE`` of the requests) at the bar: out only if the upper
        confidence bound of its attainment (``upper_attainment``: batch means over stretches of
        the measured requests, one-sided ``CONFIDENCE``) is below the target, so a burst in a short
        run cannot drop a config that a full run would keep;
      - a full simulation at the bar, on the very requests verification would use there (out if it
        misses the target, or the engine does not keep up: ``OVERLOAD``);
      - if it meets: verified (``optimizer.verify.verify``, draw 0); the best if it beats the best.
        With no best yet, the bar is the rate on the most replicas the config could need
        (``replicas_bound``) or max_nodes allows, whichever is fewer.
   Then the best is made robust to the request draw (``optimizer.verify.robust``: min_cost adds
   replicas until every fresh draw meets, the draws that missed most often tried first). A robust
   figure is never better than a nominal one, so the verified configs are made robust in rank
   order until none can beat the robust best. min_cost: if that cost the best its rank, the configs
   beaten or pruned against the nominal best are raced once more against the robust one, each
   winner now made robust (checking no more replicas than could still beat the best) before it
   becomes the best, so no config is dropped against figures that do not hold.
4. closest (an infeasible min_cost answer): the ``CLOSEST`` configs that look nearest (screened
   goodput per GPU) are verified, so the answer names the one that needs the fewest GPUs.

Every drop on a simulation's evidence (zero load, the short and the full runs at the bar) is the
verdict of ``optimizer.pruner.NoiseBoundPruner``, an optuna pruner, on the config's rungs of
evidence (``Rung``: its intermediate values); the evidence study stores the same rungs, so the
pruner replays the race's drops there.

"Beat" is the recommendation's lexicographic order (``rank``, ``optimizer.objective``): min_cost by
$/h, then bf16 KV over fp8 at equal cost (when both are searched), then goodput; max_goodput by
goodput per $, then the least $/h. Each stage's batch is a function of the earlier stages'
results only, and every simulation is a function of (config, rate, requests) only, so the answer
does not depend on which process ran which simulation (``optimizer.scaleout`` shares batches).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import asdict, dataclass, replace
from typing import Callable, ClassVar, Mapping

import numpy as np

from kvtune.costmodel.goodput import capacity_bound_req_s, completion_rate_req_s

from .deployment import Aggregated
from .objective import MaxGoodput, MinCost, prefers_bf16
from .pruner import OVERLOAD, NoiseBoundPruner, Rung, rung_trial
from .search import Evaluation, SolveContext, evaluate, grid_space
from .verify import (REL_TOL, Verification, config_requests, draw_attainment, robust, robust_config, sim_config,
                     sim_requests, verify_config)
from kvtune.costmodel.simulate import simulate
from scipy.special import betaincinv, stdtrit   # the beta and Student's t quantiles (scipy.stats takes seconds to import)
import multiprocessing as mp

__all__ = ["Probe", "Rung", "Outcome", "Race", "race", "candidates", "lattice_size", "exhaustive", "bar_req_s", "rank", "LocalRunner",
           "upper_attainment", "binomial_interval", "ZERO_LOAD_SHARE", "SEEDS", "BATCH", "CAPACITY_SLACK",
           "SHORT_SHARE", "CONFIDENCE", "STRETCHES", "CLOSEST", "EQUAL_COST_MARGIN", "OVERLOAD"]

ZERO_LOAD_SHARE = 1e-3  # zero-load probe rate, as a share of the decode-bound capacity (goodput's own)
SEEDS = 4               # configs fully verified before the race (best screened of distinct structures)
BATCH = 16              # configs raced per batch (fixed: the answer must not depend on worker count)
CAPACITY_SLACK = 1.2    # decode-bound capacity x this below the bar: pruned unsimulated (measured
                        # simulated goodput / capacity bound: at most 0.71 over bench_oracle's workloads)
SHORT_SHARE = 0.25      # short simulation: this share of the requests (at least SHORT_MIN)
SHORT_MIN = 300
CONFIDENCE = 0.99       # one-sided confidence of the bounds a short probe is judged by
STRETCHES = 10          # batch means: a short probe's measured requests cut into this many stretches
CLOSEST = 3             # an infeasible min_cost answer: configs verified to name the closest miss
EQUAL_COST_MARGIN = 0.01  # min_cost: a config at the best's $/h must beat its goodput by this much to be raced
                        # (twice the bisection tolerance: closer goodputs are not told apart; the pick's goodput
                        # is then at least 1/1.01 of the best at its $/h)


@dataclass(frozen=True)
class Probe:
    """One simulation of one config at one per-replica rate (req/s)."""

    config: str
    rate_req_s: float
    n_requests: int
    attainment: float
    meets: bool
    rejected: int = 0
    reason: str = ""     # why it misses, when it does (zero-load probes)
    lower: float = 0.0   # confidence bounds on the attainment (CONFIDENCE, one-sided each): exact
    upper: float = 1.0   # binomial at zero load, batch means under load (``upper_attainment``)
    served_req_s: float = math.inf   # completions per second over the middle of the run (completion_rate_req_s)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> "Probe":
        return cls(**d)


@dataclass(frozen=True)
class Outcome:
    """What the race concluded about one config: ``verified`` (``verification`` holds
    ``optimizer.verify.verify``'s record), or out with a reason: ``never_fits`` (some requests exceed its whole KV pool),
    ``zero_load`` (misses even alone),
    ``pruned`` (cannot beat the best, by its capacity bound or its TP), ``beaten`` (misses the
    rate it would need, simulated). ``rungs``: the simulations behind it, in the order run."""

    params: Aggregated   # the config (one replica)
    status: str
    reason: str
    simulations: int
    verification: Verification | None = None
    rungs: tuple = ()    # Rung per simulation (the evidence study's intermediate values)

    def __post_init__(self) -> None:
        if not isinstance(self.params, Aggregated):
            object.__setattr__(self, "params", Aggregated.from_config(self.params))

    @property
    def config(self) -> dict:
        return dict(self.params)

    def to_json(self) -> dict:
        return {"config": self.config, "status": self.status, "reason": self.reason,
                "simulations": self.simulations,
                "verification": self.verification.to_json() if self.verification is not None else None,
                "rungs": [r.to_json() for r in self.rungs]}

    @classmethod
    def from_json(cls, d: dict) -> "Outcome":
        v = d.get("verification")
        return cls(Aggregated.from_config(d["config"]), d["status"], d["reason"], d["simulations"],
                   Verification.from_json(v) if v is not None else None,
                   tuple(Rung.from_json(r) for r in d.get("rungs", ())))


@dataclass(frozen=True)
class Race:
    """The race's result: every fitting config's outcome, in lattice order, and how much it simulated."""

    outcomes: tuple
    simulations: int
    zero_load: tuple     # Probe per (tp, kv, k, chunk) group, in lattice order
    no_fit: tuple = ()   # (config key, why it does not fit in memory) for the rest of the lattice
    work_items: int = 0  # distinct simulation jobs (probes and verifications) the race ran
    best: Verification | None = None  # the pick: the best robust verification (None: nothing qualifies)

    @property
    def verified(self) -> list[Verification]:
        return [o.verification for o in self.outcomes if o.status == "verified" and o.verification is not None]

    def counts(self) -> dict:
        out: dict = {}
        for o in self.outcomes:
            out[o.status] = out.get(o.status, 0) + 1
        return out


# ---- work items: what a runner executes ---------------------------------------------------------
@dataclass(frozen=True)
class Work:
    """One simulation job: ``probe`` (one simulation at ``rate_req_s`` with ``n_requests``),
    ``verify`` (``optimizer.verify.verify_config``: a config verifies the same whichever stage asks)
    ``robust`` (``optimizer.verify.robust_config`` from the nominal goodput ``rate_req_s`` on
    ``n_requests`` requests per simulation) or ``draw`` (one fresh draw, ``seed``, of ``n_requests``
    at ``rate_req_s``: its attainment, ``optimizer.verify.draw_attainment``)."""

    kind: str
    params: Aggregated
    rate_req_s: float = 0.0
    n_requests: int = 0
    seed: int = 0        # ``draw``: the fresh draw's seed

    def __post_init__(self) -> None:
        if not isinstance(self.params, Aggregated):
            object.__setattr__(self, "params", Aggregated.from_config(self.params))

    @property
    def key(self) -> str:
        k = self.params.key
        if self.kind == "verify":
            return "verify:" + k
        if self.kind == "robust":
            return f"robust:{k}@{self.rate_req_s!r}x{self.n_requests}"
        if self.kind == "draw":
            return f"draw:{k}@{self.rate_req_s!r}x{self.n_requests}s{self.seed}"
        return f"probe:{k}@{self.rate_req_s:.9g}x{self.n_requests}"

    def to_json(self) -> dict:
        return {"kind": self.kind, "params": self.params.config, "rate_req_s": self.rate_req_s,
                "n_requests": self.n_requests, "seed": self.seed}

    @classmethod
    def from_json(cls, d: dict) -> "Work":
        return cls(**{**d, "params": Aggregated.from_config(d["params"])})


def execute(ctx: SolveContext, w: Work) -> dict:
    """Run one work item: a JSON-able result (a ``Probe``'s or a ``Verification``'s record)."""
    p = w.params
    if w.kind == "verify":
        return verify_config(ctx, p).to_json()
    if w.kind == "robust":
        return robust_config(ctx, p, w.rate_req_s, w.n_requests).to_json()
    if w.kind == "draw":
        return {"attainment": draw_attainment(ctx, p, w.rate_req_s, w.n_requests, w.seed)}
    sm = _step(ctx, p)
    seed = ctx.workload_seed
    req = ctx.spec.requests(w.n_requests, seed, rate_req_s=w.rate_req_s)
    res = simulate(sm, req, sim_config(ctx, p), "trace", seed=seed)
    a = ctx.spec.slo.attainment
    meets = bool(res.slo_attainment >= a)
    order = np.argsort(req.arrival_s, kind="stable")
    met = res.met_slo[order][res.measured[order]]
    lo_b, hi_b = binomial_interval(int(met.sum()), int(met.size))
    lo_s, hi_s = upper_attainment(met)
    return Probe(p.key, w.rate_req_s, w.n_requests, float(res.slo_attainment), meets, int(res.rejected),
                 "" if meets else _miss_reason(res, req, a), min(lo_b, lo_s), max(hi_b, hi_s),
                 completion_rate_req_s(res)).to_json()


def binomial_interval(met: int, measured: int, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Exact (Clopper-Pearson) one-sided bounds, each at ``confidence``, on the share of requests
    meeting the SLOs, from ``met`` of ``measured`` independent requests (at a trickle they are)."""
    if measured < 1:
        return 0.0, 1.0
    lo = float(betaincinv(met, measured - met + 1, 1 - confidence)) if met > 0 else 0.0
    hi = float(betaincinv(met + 1, measured - met, confidence)) if met < measured else 1.0
    return lo, hi


def upper_attainment(met_in_arrival_order: np.ndarray, confidence: float = CONFIDENCE,
                     stretches: int = STRETCHES) -> tuple[float, float]:
    """One-sided bounds, each at ``confidence``, on the attainment a longer run would reach, from
    one run's measured requests in arrival order (True: met its SLOs). Under load, neighbours share
    a queue, so their outcomes are not independent samples: the run is cut into ``stretches``
    consecutive stretches and their attainments are the samples (batch means; Student's t on
    ``stretches`` - 1 degrees of freedom). A burst shows as stretches far below the rest, widening
    the bounds; a steady overload, as stretches all below the target, does not."""
    met = np.asarray(met_in_arrival_order, dtype=float)
    b = min(int(stretches), met.size)
    if b < 2:
        return 0.0, 1.0
    x = np.array([c.mean() for c in np.array_split(met, b)])
    half = float(stdtrit(b - 1, confidence)) * float(x.std(ddof=1)) / math.sqrt(b)
    mean = float(met.mean())
    return max(0.0, mean - half), min(1.0, mean + half)


def _miss_reason(res, req, attainment: float) -> str:
    """Why a simulation misses the target: the SLO that more requests miss, at the attainment
    percentile, against its target; requests that never fit the KV pool."""
    m = res.measured & ~np.isinf(res.ttft_s)
    parts = []
    q = 100 * attainment
    if m.any():
        ttft, tpot = res.ttft_s[m], res.tpot_s[m]
        miss_ttft = ~(ttft <= req.ttft_slo_s[m])
        miss_tpot = (req.output_tokens[m] > 1) & ~(tpot <= req.tpot_slo_s[m])
        if miss_ttft.any():
            long_in = int(np.percentile(req.input_tokens[m], q))
            size = f"{long_in / 1e3:,.0f}k" if long_in >= 10_000 else f"{long_in:,}"
            parts.append(f"TTFT p{q:g} {np.percentile(ttft, q) * 1e3:,.0f} ms > {np.median(req.ttft_slo_s[m]) * 1e3:,.0f} ms "
                         f"({miss_ttft.mean():.0%} of requests miss it; the p{q:g} prompt is {size} tokens)")
        if miss_tpot.any():
            tp = tpot[~np.isnan(tpot)]
            parts.append(f"TPOT p{q:g} {np.percentile(tp, q) * 1e3:.1f} ms > {np.median(req.tpot_slo_s[m]) * 1e3:.1f} ms "
                         f"({miss_tpot.mean():.0%} of requests miss it)")
    if res.rejected:
        parts.append(res.reject_reason or f"{res.rejected} requests never fit the KV pool")
    return "; ".join(parts) or f"attainment {res.slo_attainment:.3f} < {attainment:g}"


_POOL_CTX: SolveContext | None = None  # the context forked pool processes work on


def _pool_execute(w: "Work") -> dict:
    assert _POOL_CTX is not None, "set by LocalRunner before the pool forks"
    return execute(_POOL_CTX, w)


def _pool_screen(params: Mapping) -> Evaluation:
    assert _POOL_CTX is not None, "set by LocalRunner before the pool forks"
    return evaluate(_POOL_CTX, params)


class LocalRunner:
    """Runs work items on this machine: in this process, or with ``jobs`` > 1 on that many forked
    processes (each item is independent; results come back in order). Remembers results, so a
    verification asked twice is simulated once. Use as a context manager to close the pool."""

    def __init__(self, ctx: SolveContext, jobs: int = 1):
        self.ctx = ctx
        self.cache: dict[str, dict] = {}
        self.jobs = max(1, int(jobs))
        self._pool = None

    def _get_pool(self):
        if self._pool is None and self.jobs > 1:
            # what every probe imports (scipy.special takes ~0.3 s) is imported with this module, so the
            # forked processes inherit it
            global _POOL_CTX
            _POOL_CTX = self.ctx
            self._pool = mp.get_context("fork").Pool(self.jobs)
        return self._pool

    def screen(self, configs: list[dict]) -> list[Evaluation]:
        pool = self._get_pool() if len(configs) > 64 else None
        if pool is None:
            return [evaluate(self.ctx, p) for p in configs]
        return pool.map(_pool_screen, configs, chunksize=max(1, len(configs) // (4 * self.jobs)))

    def run(self, items: list[Work]) -> list[dict]:
        todo = list({w.key: w for w in items if w.key not in self.cache}.values())
        pool = self._get_pool() if len(todo) > 1 else None
        if pool is None:
            for w in todo:
                self.cache[w.key] = execute(self.ctx, w)
        else:
            # the longest first (verifications), so the last to finish is a short one
            todo.sort(key=lambda w: (w.kind != "verify", -w.n_requests))
            for w, r in zip(todo, pool.imap(_pool_execute, todo, chunksize=1)):
                self.cache[w.key] = r
        return [self.cache[w.key] for w in items]

    def close(self) -> None:
        if self._pool is not None:
            self._pool.terminate()
            self._pool = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# ---- requests that can never fit -------------------------------------------------------------------
NEVER_FIT_SAMPLE = 6000  # requests drawn to find the workload's largest (the most any simulation here uses)
NEVER_FIT_CHECK = 4      # the largest this many (prompt + output) are run alone through the simulator


def _largest_requests(ctx: SolveContext):
    req = ctx.spec.requests(NEVER_FIT_SAMPLE, ctx.workload_seed, rate_req_s=1.0)
    k = min(NEVER_FIT_CHECK, len(req))
    idx = np.sort(np.argsort(req.input_tokens + req.output_tokens, kind="stable")[-k:])
    cols = {f: getattr(req, f)[idx] for f in ("input_tokens", "output_tokens", "ttft_slo_s", "tpot_slo_s", "class_idx")}
    return replace(req, arrival_s=np.arange(k, dtype=float) * 1e6, prefix_tokens=np.zeros(k, dtype=np.int64),
                   prefix_group=np.full(k, -1, dtype=np.int64), **cols)


def never_fit_reason(ctx: SolveContext, params: Mapping) -> str:
    """Why some of the workload's requests can never be served on this config (their prompt plus
    output exceed the whole KV pool, so the engine refuses them), or "" if all fit: the largest
    requests of a ``NEVER_FIT_SAMPLE`` draw, run alone through the simulator. Such a config is
    never recommended, whatever its attainment: a deployment would refuse those requests."""
    params = Aggregated.from_config(params)
    key = ("never_fit", *params.structure)
    cache = ctx.memo
    if key not in cache:
        if "largest" not in cache:
            cache["largest"] = _largest_requests(ctx)
        sm = _step(ctx, params)
        res = simulate(sm, cache["largest"], sim_config(ctx, params), "trace", seed=ctx.workload_seed, warmup_frac=0.0)
        cache[key] = (f"the workload's largest requests can never fit the KV pool ({res.reject_reason}; of "
                      f"{NEVER_FIT_SAMPLE:,} drawn)") if res.rejected else ""
    return cache[key]


# ---- the candidates and their order --------------------------------------------------------------
def _step(ctx: SolveContext, p):
    return ctx.step_of(Aggregated.from_config(p))


def lattice_configs(ctx: SolveContext) -> list[Aggregated]:
    """Every config of the search space (``grid_space``): TP, or a multi-node layout's whole
    parallelism (``optimizer.layouts``), x KV dtype x speculation length x batch cap x chunk."""
    space = grid_space(ctx)
    out = []
    for vals in itertools.product(*space.values()):
        p = dict(zip(space, vals))
        p.setdefault("spec_k", 0)
        if "layout" in p:
            p.update(ctx.layouts[p["layout"]])
        out.append(Aggregated.from_config(p))
    return out


def lattice_size(ctx: SolveContext) -> int:
    """How many configs ``lattice_configs`` holds (without building them)."""
    return math.prod(len(v) for v in grid_space(ctx).values())


def exhaustive(ctx: SolveContext) -> bool:
    """The race covers the whole lattice: it holds at most ``search.exhaustive_max_configs`` configs."""
    return lattice_size(ctx) <= ctx.spec.search.exhaustive_max_configs


def candidates(ctx: SolveContext, runner=None,
               pool: frozenset[str] | None = None) -> tuple[list[Evaluation], list[Evaluation]]:
    """(screen evaluations of the configs that fit in memory, of those that do not), in lattice order;
    ``pool``: only the configs of those keys."""
    configs = lattice_configs(ctx)
    if pool is not None:
        configs = [p for p in configs if p.key in pool]
    evs = runner.screen(configs) if runner is not None and hasattr(runner, "screen") else \
        [evaluate(ctx, p) for p in configs]
    return [e for e in evs if e.fits], [e for e in evs if not e.fits]


def _prior(ctx: SolveContext, ev: Evaluation) -> tuple:
    """Race order: screen-feasible configs first, min_cost in the recommendation's own order
    (``objective_rank``) on the screened deployment: its $/h, bf16 KV before fp8 at equal cost
    (when both are searched), the most screened goodput, then the screen's objective (its goodput
    bonus is clamped at 100% headroom, where its parsimony term alone would race the smallest
    batch caps first and each winner be verified only to be beaten by the next); max_goodput by
    the screen's objective.
    Then the rest by decode-bound capacity per GPU; the config key breaks ties. The order changes
    what the race simulates, not what it recommends (module docstring: every config that could
    beat the best is simulated against it)."""
    p = Aggregated.from_config(ev.params)
    if ev.feasible:
        return (0, *_race_of(ctx).prior(ctx, ev), p.key)
    return (1, -_capacity(ctx, p) / p.gpus_per_replica, p.key)


def _capacity(ctx: SolveContext, p) -> float:
    p = Aggregated.from_config(p)
    sm = _step(ctx, p)
    return capacity_bound_req_s(sm, ctx.stats.mean_input_tokens, ctx.stats.mean_output_tokens, p.knobs.batch_cap)


def _n(ctx: SolveContext, ev: Evaluation) -> int:
    return config_requests(ctx, ev.params)


# ---- what it takes to beat the best --------------------------------------------------------------
def rank(ctx: SolveContext, v: Verification) -> tuple:
    """Verified feasible configs, best first: ``optimizer.objective.objective_rank`` (min_cost by $/h,
    then bf16 KV over fp8 at equal cost when both are searched, then goodput; max_goodput by goodput
    per $, then $/h), then fewer GPUs per replica and the config key, so the order never depends on
    which stage verified them. Goodput is compared on the workload's own draw (``ranked_goodput``:
    every config on the same requests, a paired comparison); $/h is the deployment's as sized, robust
    to the draw once ``optimizer.verify.robust`` has run."""
    p = v.params
    return (*ctx.objective.rank(v.usd_per_hour or math.inf, ranked_goodput(v), p.knobs.kv_dtype,
                                ctx.spec.search.kv_dtype), p.gpus_per_replica, p.key)


def ranked_goodput(v: Verification) -> float:
    """The goodput configs are ranked on: draw 0's per-replica goodput x the deployment's replicas."""
    g = v.nominal_per_replica_goodput_req_s
    return (v.per_replica_goodput_req_s if g is None else g) * (v.replicas or 0)


def replicas_bound(ctx: SolveContext, p) -> int:
    """The most replicas config ``p`` could need for the target rate (min_cost): its group met
    the SLOs at zero load, simulated at ``ZERO_LOAD_SHARE`` x the decode-bound capacity of its
    largest batch cap, which is at least that share of ``p``'s own (capacity does not fall with
    the batch cap); attainment only falls with load, so each of ``rate / (ZERO_LOAD_SHARE x
    capacity)`` replicas serves at a rate already shown to meet. Its cheapest deployment needs
    no more, so no bar is set below that rate, however many more GPUs hardware.max_nodes offers:
    the race is the same for max_nodes 10,000 and 100,000 (``tests/optimizer/test_search_cost.py``)."""
    return max(1, math.ceil(ctx.rate_req_s / (ZERO_LOAD_SHARE * _capacity(ctx, p))))


def _replicas_to_beat(ctx: SolveContext, v: Verification, best: Verification | None,
                      usd_cap: float = math.inf) -> int:
    """min_cost: the most replicas of ``v``'s config that could still beat ``best`` (fewer GPUs; as
    many with bf16 KV against fp8, or with more goodput on the workload's draw in the same KV class),
    or with no best every replica max_nodes allows within ``usd_cap``; 0: none."""
    gpr = v.params.gpus_per_replica
    if best is None:
        return _gpus_within(ctx, usd_cap) // gpr
    g = best.gpus or 0
    cap = (g - 1) // gpr
    if g % gpr == 0:
        both = prefers_bf16(ctx.spec.search.kv_dtype)
        mine, theirs = both and v.params.knobs.kv_dtype != "bf16", both and best.params.knobs.kv_dtype != "bf16"
        per = v.nominal_per_replica_goodput_req_s or v.per_replica_goodput_req_s
        if (theirs and not mine) or (mine == theirs and per * (g // gpr) > ranked_goodput(best)):
            cap = max(cap, g // gpr)
    return cap


def _gpus_within(ctx: SolveContext, usd_cap: float) -> int:
    """The GPUs max_nodes allows, at most as many as ``usd_cap`` pays for."""
    if not math.isfinite(usd_cap):
        return ctx.max_gpus
    return min(ctx.max_gpus, int(usd_cap / ctx.spec.hardware.usd_per_gpu_hour * (1 + 1e-12)))


def bar_req_s(ctx: SolveContext, p, best: Verification | None,
              usd_cap: float = math.inf) -> tuple[float | None, int, str]:
    """(per-replica rate config ``p`` must serve to beat ``best``, the replicas it would then
    take, what it would beat); rate None: it cannot beat it at any rate. The objective's race
    says how (``_CostRace.bar``, ``_GoodputRace.bar``)."""
    return _race_of(ctx).bar(ctx, Aggregated.from_config(p), best, usd_cap)


def _cost_bar(ctx: SolveContext, p: Aggregated, best: Verification | None,
              usd_cap: float) -> tuple[float | None, int, str]:
    """min_cost: ``best`` holds ``params``, ``gpus``, ``usd_per_hour`` and ``goodput_req_s``. ``p``
    beats it on fewer GPUs; on as many, with bf16 KV against fp8 KV (when both are searched), or
    with more goodput (by ``EQUAL_COST_MARGIN``) in the same KV class. The lowest of those rates.
    With no best yet, the bar is the rate on the most replicas max_nodes allows."""
    tp = p.gpus_per_replica    # GPUs per replica (TP x PP)
    rate = ctx.rate_req_s
    if best is None:
        r = _gpus_within(ctx, usd_cap) // tp
        if r < 1 and math.isfinite(usd_cap) and ctx.max_gpus >= tp:
            return None, 0, f"a replica of {tp} GPUs costs more than ${usd_cap:.2f}/h, found on another GPU type"
        if r < 1:
            return None, 0, (f"a replica needs {tp} GPUs > the {ctx.max_gpus} GPUs of hardware.max_nodes "
                             f"{ctx.spec.hardware.max_nodes}")
        need = replicas_bound(ctx, p)
        if need < r:   # max_nodes offers more than this config could use (replicas_bound)
            return rate / need, need, f"the most {tp}-GPU replicas it could need ({need})"
        return rate / r, r, (f"the most {tp}-GPU replicas hardware.max_nodes allows ({r})" if not math.isfinite(usd_cap)
                             else f"the most {tp}-GPU replicas within ${usd_cap:.2f}/h, found on another GPU type ({r})")
    gpus = best.gpus or 0  # a verified best: sized
    why = f"${best.usd_per_hour:.2f}/h ({gpus} GPUs) of {best.params.key}"
    options = []
    r = (gpus - 1) // tp
    if r >= 1:                                                  # fewer GPUs: cheaper
        options.append((rate / r, r, why))
    if gpus % tp == 0:                                          # as many GPUs: the same $/h
        r = gpus // tp
        both = prefers_bf16(ctx.spec.search.kv_dtype)
        mine, theirs = both and p.knobs.kv_dtype != "bf16", both and best.params.knobs.kv_dtype != "bf16"
        if theirs and not mine:                                 # bf16 KV on as many GPUs wins
            options.append((rate / r, r, why + " (bf16 KV on as many GPUs)"))
        elif mine == theirs:                                    # more goodput on as many GPUs
            more = max(rate, ranked_goodput(best) * (1 + EQUAL_COST_MARGIN))
            options.append((more / r, r, f"{ranked_goodput(best):.3g} req/s on {why}"))
    if not options:
        return None, 0, f"{tp} GPUs per replica cannot beat {why}"
    return min(options, key=lambda o: (o[0], o[1]))


def _goodput_bar(ctx: SolveContext, p: Aggregated, best: Verification | None,
                 usd_cap: float) -> tuple[float | None, int, str]:
    """max_goodput: ``best`` is a verification; ``p`` beats it with more goodput per GPU (by the
    bisection tolerance)."""
    tp = p.gpus_per_replica
    if best is None:
        return None, 0, "no config verified yet"
    q = ranked_goodput(best) / (best.replicas or 1) / best.params.gpus_per_replica
    return q * tp * (1 + REL_TOL), ctx.max_gpus // tp, f"{q:.3g} req/s per GPU of {best.params.key}"


# ---- the race --------------------------------------------------------------------------------------
def race(ctx: SolveContext, runner=None, on_stage: Callable[[str, int], None] | None = None,
         seeds: int = SEEDS, usd_cap: float = math.inf, pool: frozenset[str] | None = None) -> Race:
    """Zero-load probes, then the race (module docstring). ``runner.run(list[Work])`` returns
    their results in order (``LocalRunner`` or ``optimizer.scaleout.StudyRunner``). ``usd_cap``
    (min_cost): only deployments at or below this $/h count (another GPU type already has one
    there, ``optimizer.gpu_choice``); nothing found is then no answer, without a closest miss.
    ``pool``: the config keys raced (the study's sampled trials, ``sampled_pool``); None: every one."""
    runner = runner or LocalRunner(ctx)
    st = _race_of(ctx)(ctx, runner, on_stage, usd_cap if ctx.objective.caps_cost else math.inf)
    fit, nofit = candidates(ctx, runner, pool)
    alive = st.zero_load(fit)
    alive.sort(key=lambda e: _prior(ctx, e))
    st.run(alive, seeds)
    order = {ev.params.key: i for i, ev in enumerate(fit)}
    outs = tuple(sorted(st.outcomes.values(), key=lambda o: order[o.params.key]))
    return Race(outs, st.sims, tuple(st.zl), tuple((e.params.key, e.reason) for e in nofit),
                len(st.keys), st.best)


def _beaten(pr: Probe, bar: float, why: str) -> str:
    if pr.meets:
        return (f"overloaded at {bar:.3g} req/s per replica (completes {pr.served_req_s:.3g} req/s in the middle of "
                f"the run, < {OVERLOAD:g} x the rate): cannot beat {why}")
    return f"attainment {pr.attainment:.3f} at {bar:.3g} req/s per replica: cannot beat {why}"


class _State:
    """The race's bookkeeping: outcomes, the best so far, simulations spent. One subclass per
    objective says what its race does differently (``_RACES``): its bar, its prior order, how it
    runs, how many replicas a robust check may try."""

    @staticmethod
    def bar(ctx: SolveContext, p: Aggregated, best: Verification | None,
            usd_cap: float) -> tuple[float | None, int, str]:
        """(per-replica rate ``p`` must serve to beat ``best``, the replicas it would take, what it beats)."""
        raise NotImplementedError

    robust_winners: ClassVar[bool]   # once ``robust_now``, a winner is made robust before it becomes the best

    @staticmethod
    def prior(ctx: SolveContext, ev: Evaluation) -> tuple:
        """The race order of a screen-feasible config (``_prior``), before its key."""
        raise NotImplementedError

    def __init__(self, ctx: SolveContext, runner, on_stage, usd_cap: float = math.inf):
        self.ctx, self.runner, self.on_stage, self.usd_cap = ctx, runner, on_stage, usd_cap
        self.outcomes: dict[str, Outcome] = {}
        self.sims = 0
        self.zl: list[Probe] = []
        self.best: Verification | None = None
        self.spent: dict[str, int] = {}
        self.rungs: dict[str, list[Rung]] = {}   # each config's simulations, in order (Outcome.rungs)
        self.a = ctx.spec.slo.attainment
        self.keys: set[str] = set()
        self.misses: dict[int, int] = {}   # fresh draw seed -> robust checks it missed (hardest first)
        self.pruner = NoiseBoundPruner(self.a)   # drops a config on its last rung (optimizer.pruner)
        self.robust_now = False   # min_cost: winners made robust before they become the best (race_cost)

    def stage(self, name: str, n: int) -> None:
        if self.on_stage:
            self.on_stage(name, n)

    def _run(self, work: list[Work]) -> list[dict]:
        self.keys.update(w.key for w in work)
        return self.runner.run(work)

    def probe(self, items: list[tuple[Aggregated, float, int]], fidelity: str | list[str],
              full: list[bool], at_load: bool = True) -> list[Probe]:
        """Each item's simulation (config, per-replica rate, requests), its rung recorded at
        ``fidelity`` (one for all, or one per item): judged by its attainment where ``full`` (the
        full number of requests), by its upper confidence bound where not; ``at_load``: the
        pruner also checks that the engine keeps up (not at zero load)."""
        res = [Probe.from_json(r) for r in self._run([Work("probe", Aggregated.from_config(p), rate, n) for p, rate, n in items])]
        self.sims += len(res)
        fids = [fidelity] * len(items) if isinstance(fidelity, str) else fidelity
        for (p, rate, _), pr, f, whole in zip(items, res, fids, full):
            self.spent[p.key] = self.spent.get(p.key, 0) + 1
            self.rungs.setdefault(p.key, []).append(Rung(f, rate, pr.n_requests, pr.attainment,
                                                         "attainment" if whole else "bound", pr.upper,
                                                         pr.served_req_s if at_load and math.isfinite(pr.served_req_s)
                                                         else None))
        return res

    def pruned(self, key: str) -> bool:
        """The pruner's verdict on the config's last rung (``optimizer.pruner``)."""
        return self.pruner.prune(None, rung_trial(self.rungs[key]))

    def _record(self, params: Aggregated, v: Verification, sims: int) -> None:
        k = params.key
        self.sims += sims
        self.spent[k] = self.spent.get(k, 0) + sims
        if v.slo_attainment is not None:
            self.rungs.setdefault(k, []).append(Rung("verified", v.load_per_replica_req_s or v.per_replica_goodput_req_s,
                                                     v.sim_requests or 0, v.slo_attainment, "verification"))
        self.outcomes[k] = Outcome(Aggregated.from_config(params), "verified", "" if v.feasible else v.reason, self.spent[k], v,
                                   tuple(self.rungs.get(k, ())))

    def verify(self, evs: list[Evaluation]) -> list[Verification]:
        res = [Verification.from_json(d) for d in self._run([Work("verify", Aggregated.from_config(ev.params)) for ev in evs])]
        for ev, v in zip(evs, res):
            self._record(ev.params, v, v.simulations)
        return res

    def robust(self, v: Verification, max_replicas: int | None = None) -> Verification:
        """``v`` (nominal) made robust to the request draw (``optimizer.verify.robust``), its draws run
        as work items (several at a time), the draws that missed most often so far tried first; its
        simulations add to the nominal ones. ``max_replicas`` (min_cost): the most worth checking."""
        p, n, a = Aggregated.from_config(v.params), int(v.sim_requests or 0), self.a

        def many(pairs: list[tuple[int, float]]) -> list[float]:
            out = [d["attainment"] for d in self._run([Work("draw", p, rate, n, s) for s, rate in pairs])]
            for (s, _), x in zip(pairs, out):
                self.misses[s] = self.misses.get(s, 0) + (x < a)
            return out
        order = sorted(self.misses, key=lambda s: (-self.misses[s], s))
        r = robust(self.ctx, v, many, max_replicas, order)
        self._record(v.params, r, r.simulations - v.simulations)
        return r

    def consider(self, res: list[Verification]) -> None:
        """Nominal verifications, in rank order, against the best: each that beats it becomes the
        best, nominal until ``settle``; once ``robust_now`` (min_cost, after the best lost its rank
        to robust sizing), each that could beat it is made robust first, checking no more replicas
        than could still beat the best, and becomes the best only if its robust figures say so."""
        for v in sorted((v for v in res if self._ok(v)), key=lambda v: rank(self.ctx, v)):
            if self.best is not None and not rank(self.ctx, v) < rank(self.ctx, self.best):
                continue
            if not (self.robust_now and self.robust_winners):
                self.best = v
                continue
            r = self.robust(v, _replicas_to_beat(self.ctx, v, self.best, self.usd_cap))
            if self._ok(r) and (self.best is None or rank(self.ctx, r) < rank(self.ctx, self.best)):
                self.best = r

    def _ok(self, v: Verification) -> bool:
        """Feasible, and at or below the cost cap."""
        return v.feasible and (v.usd_per_hour or 0.0) <= self.usd_cap * (1 + 1e-12)

    def settle(self) -> bool:
        """Make the best robust: in rank order, each verified config that could still beat the best
        robust one so far (a nominal figure bounds its robust one) is made robust (min_cost: checking
        no more replicas than could beat it). True if the best kept its rank: every config judged
        against the nominal best was then judged as against the robust one."""
        before = rank(self.ctx, self.best) if self.best is not None else None
        pool = sorted((o.verification for o in self.outcomes.values() if o.status == "verified"
                       and o.verification is not None and self._ok(o.verification)), key=lambda v: rank(self.ctx, v))
        best = None
        for v in pool:
            if best is not None and not rank(self.ctx, v) < rank(self.ctx, best):
                break
            cap = self.replicas_cap(v, best)
            r = v if v.robust else self.robust(v, cap)
            if self._ok(r) and (best is None or rank(self.ctx, r) < rank(self.ctx, best)):
                best = r
        self.best = best
        return best is None or rank(self.ctx, best) == before

    def out(self, ev: Evaluation, status: str, reason: str) -> None:
        k = ev.params.key
        self.outcomes[k] = Outcome(Aggregated.from_config(ev.params), status, reason, self.spent.get(k, 0),
                                   rungs=tuple(self.rungs.get(k, ())))

    # 1. zero load, per (tp, kv, k, chunk) group: the largest batch cap stands for the group
    def zero_load(self, fit: list[Evaluation]) -> list[Evaluation]:
        ctx, a = self.ctx, self.a
        groups: dict[tuple, list[Evaluation]] = {}
        for ev in fit:
            why = never_fit_reason(ctx, ev.params)
            if why:
                self.out(ev, "never_fits", why)
                continue
            p = ev.params
            groups.setdefault((*p.structure, p.knobs.chunk_tokens), []).append(ev)
        # a short probe first; the full one only where the short one's interval straddles the target
        n_zl = sim_requests(a, 1)
        n_short = min(n_zl, SHORT_MIN)
        reps = [max(g, key=lambda e: e.params.knobs.batch_cap).params for g in groups.values()]
        rates = [ZERO_LOAD_SHARE * _capacity(ctx, p) for p in reps]
        self.stage("zero load", len(reps))
        zl = self.probe([(p, r, n_short) for p, r in zip(reps, rates)], "zero_load", [n_short >= n_zl] * len(reps),
                        at_load=False)
        again = [i for i, pr in enumerate(zl) if pr.lower < a <= pr.upper and n_short < n_zl]
        for i, pr in zip(again, self.probe([(reps[i], rates[i], n_zl) for i in again], "zero_load", [True] * len(again),
                                           at_load=False)):
            zl[i] = pr
        self.zl = zl
        alive = []
        for g, pr, rep in zip(groups.values(), zl, reps):
            # the pruner on the last probe; a short one left standing has its lower bound above the target
            # (one that straddled it was run in full)
            ok = not self.pruned(rep.key)
            for ev in g:
                if ev.params.key != rep.key:   # the group's probe stands for it
                    self.rungs.setdefault(ev.params.key, []).extend(self.rungs.get(rep.key, ()))
                if ok:
                    alive.append(ev)
                else:
                    self.out(ev, "zero_load", f"misses at zero load (attainment {pr.attainment:.3f} < {a:g}): {pr.reason}")
        return alive

    def screen_bar(self, chunk: list[Evaluation]) -> list[tuple[Evaluation, float, int, str]]:
        """Each config's bar against the best; those that cannot beat it, or whose capacity bound
        says they cannot, are out here without a simulation."""
        keep = []
        for ev in chunk:
            p = ev.params
            bar, r, why = bar_req_s(self.ctx, p, self.best, self.usd_cap)
            if bar is None:
                self.out(ev, "pruned", why)
                continue
            cap = _capacity(self.ctx, p)
            if cap * CAPACITY_SLACK < bar:
                self.out(ev, "pruned", f"decode-bound capacity {cap:.3g} req/s x {CAPACITY_SLACK:g} < the "
                                       f"{bar:.3g} req/s per replica it needs to beat {why}")
                continue
            keep.append((ev, bar, r, why))
        return keep

    def meets_bar(self, cands: list[tuple[Evaluation, float, int, str]]) -> list[tuple[Evaluation, float, int, str]]:
        """Short simulations at the bar, then full ones for the configs not clearly out (the short
        run's upper confidence bound reaches the target): those that meet."""
        ctx = self.ctx
        ns = [max(SHORT_MIN, int(SHORT_SHARE * _n(ctx, ev))) for ev, _, _, _ in cands]
        whole = [n >= _n(ctx, ev) for (ev, _, _, _), n in zip(cands, ns)]
        short = self.probe([(ev.params, bar, n) for (ev, bar, _, _), n in zip(cands, ns)],
                           ["simulated" if w else "short" for w in whole], whole)
        full, done = [], {}
        for c, pr, n, w in zip(cands, short, ns, whole):
            ev, bar, _, why = c
            if w:
                done[ev.params.key] = pr
            elif self.pruned(ev.params.key):
                self.out(ev, "beaten", f"attainment {pr.attainment:.3f} (at most {pr.upper:.3f} at {CONFIDENCE:.0%} "
                                       f"confidence) at {bar:.3g} req/s per replica ({n} requests): cannot beat {why}")
                continue
            else:
                full.append(c)
        for (ev, _, _, _), pr in zip(full, self.probe([(ev.params, bar, _n(ctx, ev)) for ev, bar, _, _ in full],
                                                                        "simulated", [True] * len(full))):
            done[ev.params.key] = pr
        winners = []
        for c in cands:
            got = done.get(c[0].params.key)
            if got is None:
                continue
            if not self.pruned(c[0].params.key):
                winners.append(c)
            else:
                self.out(c[0], "beaten", _beaten(got, c[1], c[3]))
        return winners

    # what each objective's race does differently (``_CostRace``, ``_GoodputRace``)
    def run(self, alive: list[Evaluation], seeds: int) -> None:
        raise NotImplementedError

    def replicas_cap(self, v: Verification, best: Verification | None) -> int | None:
        """The most replicas worth checking when ``v`` is made robust against ``best`` (None: all)."""
        raise NotImplementedError


class _CostRace(_State):
    """min_cost: every config against the cheapest verified deployment so far (``_race_cost``),
    the best then made robust (``settle``); an infeasible answer names the closest miss."""

    bar = staticmethod(_cost_bar)
    robust_winners = True

    @staticmethod
    def prior(ctx: SolveContext, ev: Evaluation) -> tuple:
        return (*ctx.objective.rank(ev.usd_per_hour, ev.per_replica_goodput_req_s * ev.replicas,
                                    ev.params.knobs.kv_dtype, ctx.spec.search.kv_dtype), ev.value)

    def replicas_cap(self, v: Verification, best: Verification | None) -> int | None:
        return _replicas_to_beat(self.ctx, v, best, self.usd_cap)

    def run(self, alive: list[Evaluation], seeds: int) -> None:
        self.race_cost(alive)
        if self.best is None and not math.isfinite(self.usd_cap):
            self.robust_now = True
            self.closest(alive)

    def race_cost(self, alive: list[Evaluation]) -> None:
        """min_cost: every config against the best verified deployment so far (``_race_cost``),
        then the best made robust (``settle``). Where robust sizing cost it its rank, the configs
        beaten or pruned against the nominal figures are raced once more against the robust best,
        every winner now made robust before it becomes the best: the answer is as if every config
        had been judged against robust figures."""
        self._race_cost(alive)
        if self.settle():
            return
        self.robust_now = True
        again = [ev for ev in alive if self.outcomes[ev.params.key].status in ("beaten", "pruned")]
        if again:
            self.stage("race again", len(again))
            self._race_cost(again)

    def _race_cost(self, alive: list[Evaluation]) -> None:
        """A config that meets the rate it needs (against the best as it stands after the batch's
        earlier winners) is verified, and becomes the best if its verification says so."""
        ctx = self.ctx
        for i in range(0, len(alive), BATCH):
            self.stage("race", len(alive[i:i + BATCH]))
            winners = self.meets_bar(self.screen_bar(alive[i:i + BATCH]))
            for j, (ev, bar, _r, _why) in enumerate(winners):
                p = ev.params
                bar2, _r2, why2 = bar_req_s(ctx, p, self.best, self.usd_cap)
                if bar2 is None:                      # an earlier winner of this batch is cheaper
                    self.out(ev, "beaten", f"meets {bar:.3g} req/s per replica, but {why2}")
                    continue
                if bar2 > bar:                        # ... so it must serve more per replica
                    self._probe_ahead(winners[j:])
                    pr = self.probe([(p, bar2, _n(ctx, ev))], "simulated", [True])[0]
                    if self.pruned(p.key):
                        self.out(ev, "beaten", _beaten(pr, bar2, why2))
                        continue
                self.consider(self.verify([ev]))

    def _probe_ahead(self, winners: list[tuple[Evaluation, float, int, str]]) -> None:
        """Side by side (``LocalRunner.jobs`` at a time), the probes that the first of ``winners``
        and the ones after it will need at the bars the best as it stands sets, up to the first
        that goes straight to verification: a winner whose probe misses leaves the best as it is,
        so the next one's probe is then already run. Each result goes to the runner's cache only
        (a function of config, rate and requests: the race reads it as if run when asked, and
        counts it then); one left unread (a winner that met and became the best moved the bar)
        is the only cost. Not with a shared storage (``optimizer.scaleout``): there the race's
        batches are the unit of work."""
        if not isinstance(self.runner, LocalRunner) or self.runner.jobs < 2:
            return
        work: list[Work] = []
        for ev, bar, _r, _why in winners:
            if len(work) >= self.runner.jobs:
                break
            bar2, _r2, _why2 = bar_req_s(self.ctx, ev.params, self.best, self.usd_cap)
            if bar2 is None:          # beaten without a simulation: the best stays
                continue
            if not bar2 > bar:        # verified next: the best may move
                break
            w = Work("probe", Aggregated.from_config(ev.params), bar2, _n(self.ctx, ev))
            if w.key not in self.runner.cache:   # run ahead already
                work.append(w)
        if len(work) > 1:
            self.runner.run(work)

    # 4. nothing qualifies: verify the configs that look closest, so the answer names the nearest miss
    def closest(self, alive: list[Evaluation]) -> None:
        """The ``CLOSEST`` alive configs of distinct structures with the most screened goodput per
        GPU, verified (one that turns out to qualify after all is considered as any winner)."""
        picks, structs = [], set()
        ranked = sorted(alive, key=lambda e: (-(e.per_replica_goodput_req_s or 0.0) / e.params.gpus_per_replica,
                                              e.params.key))
        for ev in ranked:
            p = ev.params
            s = p.structure
            v = self.outcomes.get(p.key)
            if s in structs or (v is not None and v.status == "verified"):
                continue
            structs.add(s)
            picks.append(ev)
            if len(picks) >= CLOSEST:
                break
        if picks:
            self.stage("closest", len(picks))
            self.consider(self.verify(picks))


class _GoodputRace(_State):
    """max_goodput: the seeds verified, then every config against the best goodput per GPU; the best
    made robust (goodput is ranked on draw 0: robust sizing never costs the best its rank)."""

    bar = staticmethod(_goodput_bar)
    robust_winners = False   # goodput is ranked on draw 0: a robust figure never changes the order

    @staticmethod
    def prior(ctx: SolveContext, ev: Evaluation) -> tuple:
        return (ev.value,)

    def replicas_cap(self, v: Verification, best: Verification | None) -> int | None:
        return None

    def run(self, alive: list[Evaluation], seeds: int) -> None:
        self.race_goodput(alive, seeds)
        self.settle()

    def race_goodput(self, alive: list[Evaluation], n_seeds: int) -> None:
        """max_goodput: seeds verified, then every config against the best goodput per GPU."""
        seeds, structs = [], set()
        for ev in alive:
            s = ev.params.structure
            if s not in structs:
                structs.add(s)
                seeds.append(ev)
            if len(seeds) >= n_seeds:
                break
        self.stage("seeds", len(seeds))
        self.consider(self.verify(seeds))
        rest = [ev for ev in alive if ev.params.key not in self.outcomes]
        for i in range(0, len(rest), BATCH):
            chunk = rest[i:i + BATCH]
            self.stage("race", len(chunk))
            if self.best is None:                  # nothing to beat yet: each met the SLOs at zero load
                self.consider(self.verify(chunk))
                continue
            winners = [c[0] for c in self.meets_bar(self.screen_bar(chunk))]
            self.consider(self.verify(winners))


_RACES: dict[type, type[_State]] = {MinCost: _CostRace, MaxGoodput: _GoodputRace}


def _race_of(ctx: SolveContext) -> type[_State]:
    """The race of the workload's objective."""
    return _RACES[type(ctx.objective)]
