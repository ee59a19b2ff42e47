"""One config's simulator verification, in two fidelities that ``kvtune solve`` and
``bench/bench_oracle.py`` both call, so the oracle and the search measure a config the same way:

``verify`` (nominal): goodput bisected by ``costmodel.goodput`` to ``REL_TOL`` on the workload's own
request sample (draw 0, ``SolveContext.workload_seed``: common random numbers, so every config is
ranked on the same requests), then sized into a deployment. Every config the race verifies gets this.

``robust`` (the pick and whatever could beat it): the deployment is checked on ``DRAWS`` fresh
draws of the same size (seeds ``workload_seed + 1 ... + DRAWS``), each simulated at the
deployment's real per-replica load; all of them must meet the target there. min_cost adds
replicas until they do (the load falls); max_goodput, whose load is its goodput, takes the least
goodput over draw 0 and the fresh draws (``DrawSet.least_goodput``, found without bisecting every
draw) as its goodput. Either way every fresh draw's goodput is at least the load. Fresh draws are
exchangeable (draw 0 is not: the pick was chosen on it), so a further fresh draw's goodput falls
below the least of ``DRAWS`` with probability 1 / (DRAWS + 1) = 5%: a fresh draw of ``n_requests``
requests at the pick's load meets the target with probability >= 95% (attainment falls as the rate
rises, per draw, up to scheduling noise). Robust $/h is never below the nominal and robust goodput never above it, so a
nominal figure bounds a robust one and the race may prune on nominal figures.

A replayed trace has one draw (its requests do not depend on the seed); with speculative decoding
its draws still differ in the accepted tokens.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field, fields
from typing import Callable, Mapping

from kvtune.costmodel.goodput import default_n_requests, goodput
from kvtune.costmodel.simulate import SimConfig, simulate, simulate_fleet

from .deployment import Aggregated
from .launch import scheduling as launch_scheduling
from .layouts import gpus_per_replica
from .search import SolveContext, evaluate

__all__ = ["Verification", "Draws", "verify", "verify_config", "robust", "sim_requests", "config_requests",
           "sim_config", "simulate_at", "draw_seeds", "robust_config", "DrawSet", "draw_attainment",
           "MAX_SIM_REQUESTS", "REL_TOL", "DRAWS"]

MAX_SIM_REQUESTS = 6000  # cap on requests per simulated rate (simulation time)
REL_TOL = 0.005        # goodput bisection tolerance: two configs compared at 1% need a finer step
DRAWS = 19             # fresh draws of a robust verification: P(a 20th one's goodput < the least of 19) = 1/20
STEP_DOWN = 0.97       # a draw that misses at a rate: its goodput is looked for first this much lower
DRAW_BATCH = 2         # min_cost: draws tried at a time (one batch of work items) before giving up on a miss


@dataclass(frozen=True)
class Draws:
    """A robust verification's fresh draws (``robust``): their seeds and size, each draw's SLO
    attainment at the deployment's per-replica load (``load_req_s``) and, for max_goodput, the least
    goodput over them and draw 0 (the robust per-replica goodput; None for min_cost, which checks
    its load instead)."""

    seeds: tuple[int, ...]
    n_requests: int
    goodput_min_req_s: float | None
    load_req_s: float
    attainment: tuple[float, ...]
    simulations: int

    @property
    def coverage(self) -> float:
        """The chance a further fresh draw's goodput is at least the least of these (exchangeable
        draws): the designed chance that a fresh draw meets the target at the load."""
        return len(self.seeds) / (len(self.seeds) + 1)

    def to_json(self) -> dict:
        a = self.attainment
        return {"seeds": list(self.seeds), "n_requests": self.n_requests, "goodput_min_req_s": self.goodput_min_req_s,
                "load_req_s": self.load_req_s, "attainment": list(a),
                "attainment_mean": sum(a) / len(a), "attainment_min": min(a), "attainment_max": max(a),
                "coverage": self.coverage, "simulations": self.simulations}

    @classmethod
    def from_json(cls, d: dict) -> "Draws":
        return cls(tuple(d["seeds"]), d["n_requests"], d["goodput_min_req_s"], d["load_req_s"],
                   tuple(d["attainment"]), d["simulations"])


@dataclass(frozen=True)
class Verification:
    """One config's simulator verification (``verify``, then ``robust`` for a pick): per-replica
    goodput, the deployment it sizes to and (robust) its latencies at the real per-replica load.
    A config that misses even at a trickle carries only the first five fields. ``to_json``/
    ``from_json``: the record work items return (shared through the study's storage by
    ``optimizer.scaleout``) and the race's outcomes keep."""

    params: Aggregated                      # the config verified (one replica; ``config``: its JSON)
    per_replica_goodput_req_s: float       # robust when ``draws`` is set, else draw 0's
    simulations: int
    feasible: bool
    reason: str = ""                        # why not feasible ("" when feasible)
    replicas: int | None = None
    gpus: int | None = None
    nodes: int | None = None
    usd_per_hour: float | None = None
    goodput_req_s: float | None = None
    load_per_replica_req_s: float | None = None
    output_tok_s_at_goodput: float | None = None  # output tok/s when the fleet serves its goodput
    slo_attainment: float | None = None     # robust: the first fresh draw's at the load
    ttft_ms: dict = field(default_factory=dict)   # mean, p50, p90, p99 at the per-replica load (robust)
    tpot_ms: dict = field(default_factory=dict)
    output_tok_s: float | None = None
    preemptions: int | None = None
    sim_requests: int | None = None
    nominal_per_replica_goodput_req_s: float | None = None  # draw 0's bisection (the race ranks on it)
    fleet_rate_req_s: float | None = None   # the rate the whole deployment is simulated at (load x replicas)
    draws: Draws | None = None              # robust only

    def __post_init__(self) -> None:
        if not isinstance(self.params, Aggregated):   # a config mapping (read back, or a caller's)
            object.__setattr__(self, "params", Aggregated.from_config(self.params))

    @property
    def robust(self) -> bool:
        """Sized robust to the request draw (``robust``)."""
        return self.draws is not None

    @property
    def deployment(self) -> Aggregated | None:
        """The deployment this verification sizes to (None: it sizes to none)."""
        return None if self.replicas is None else self.params.sized(self.replicas)

    def to_json(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["params"] = self.params.config
        if self.replicas is None:  # missed even at a trickle: no deployment, no latencies
            return {k: d[k] for k in ("params", "per_replica_goodput_req_s", "simulations", "feasible", "reason")}
        d["draws"] = self.draws.to_json() if self.draws is not None else None
        return d

    @classmethod
    def from_json(cls, d: dict) -> "Verification":
        dr = d.get("draws")
        return cls(**{**d, "draws": Draws.from_json(dr) if dr is not None else None})


def sim_config(ctx: SolveContext, params: Mapping):
    if ctx.engine is not None:
        cfg = ctx.engine.sim_config(params["batch_cap"], params["chunk_tokens"])
        # simulate the scheduling the launch settings give (SGLang: prefill-first under NGRAM/STANDALONE)
        s = ctx.spec.speculative
        if launch_scheduling(ctx.engine.engine, s.method if s else None, params.get("spec_k", 0)) == "prefill_first":
            cfg = dataclasses.replace(cfg, prefill_first=True)
        return cfg
    return SimConfig(batch_cap=int(params["batch_cap"]), chunk_tokens=int(params["chunk_tokens"]))


def _pct(summary: dict, key: str) -> dict:
    d = summary.get(key, {})
    def num(x):
        return float("nan") if x is None else float(x)  # null: no measured request was served
    return {p: num(d.get(p)) for p in ("p50", "p90", "p99")} | {"mean": num(d.get("mean"))}


def sim_requests(attainment: float, operating_batch: int) -> int:
    """Requests per simulated rate: goodput's default (>= 100 in the allowed-miss tail, and several
    times the concurrency the screen expects: fewer requests than the KV pool holds sequences
    would all be admitted at once and never queue), capped for simulation time."""
    return int(min(default_n_requests(attainment, max_concurrency=operating_batch),
                   MAX_SIM_REQUESTS))


def slots(ctx: SolveContext, params: Mapping) -> int:
    """Sequences the batch cap and the KV pool admit at once on a workload's mean request
    (``costmodel.goodput``'s own measure of the in-flight set); 0 if the pool is too small."""
    sm = ctx.fitting_step(params)
    per_seq = max(ctx.stats.mean_input_tokens + ctx.stats.mean_output_tokens, 1.0)
    return int(min(params["batch_cap"], sm.memory.kv_pool_tokens // per_seq))


def config_requests(ctx: SolveContext, params: Mapping) -> int:
    """Requests per simulated rate for one config: a function of the config alone (its
    ``slots``), so every stage of the search, and the oracle, simulate it on the same requests."""
    return sim_requests(ctx.spec.slo.attainment, max(slots(ctx, params), 1))


def verify_config(ctx: SolveContext, params: Mapping) -> Verification:
    """``verify`` one config the way the search and the oracle both do: ``config_requests``
    requests, the bisection started at the screened goodput."""
    ev = evaluate(ctx, params)
    return verify(ctx, params, max(slots(ctx, params), 1), ev.per_replica_goodput_req_s or None)


def verify(ctx: SolveContext, params: Mapping, operating_batch: int, guess_req_s: float | None = None) -> Verification:
    """Nominal verification (module docstring): draw 0's simulated per-replica goodput and the
    deployment it sizes to. ``guess_req_s`` (the screened goodput) starts the goodput bracket; it
    does not bias the answer beyond the bisection tolerance."""
    sm = ctx.fitting_step(params)
    spec, seed = ctx.spec, ctx.workload_seed
    n = sim_requests(spec.slo.attainment, operating_batch)
    g = goodput(sm, _maker(ctx), sim_config(ctx, params), spec.slo.attainment, n_requests=n, seed=seed,
                rel_tol=REL_TOL, guess_req_s=guess_req_s)
    per_replica = float(g.goodput_req_s)
    if per_replica <= 0:
        return Verification(Aggregated.from_config(params), per_replica, g.iterations, False,
                            g.reason or "simulated SLO attainment misses the target even at a trickle")
    return _sized(ctx, params, per_replica, g.iterations, n, nominal=per_replica)


def _maker(ctx: SolveContext):
    def make(rate, n, s):
        return ctx.spec.requests(n, s, rate_req_s=rate)
    return make


def _sized(ctx: SolveContext, params: Mapping, per_replica: float, simulations: int, n: int, *,
           nominal: float, replicas: int | None = None) -> Verification:
    """The deployment ``per_replica`` req/s per replica sizes to: min_cost, enough replicas for the
    target rate (at least ``replicas``); max_goodput, every replica max_nodes holds. The fleet is
    simulated at ``fleet_rate_req_s`` (min_cost: the target rate; max_goodput: the goodput, or the
    target rate when lower), each replica at ``fleet_rate_req_s / replicas`` (as ``kvtune simulate
    --replicas`` splits it)."""
    h, goal = ctx.spec.hardware, ctx.objective
    gpr = gpus_per_replica(params)
    r = goal.replicas(ctx.rate_req_s, per_replica, gpr, ctx.max_gpus, at_least=replicas)
    gpus = r * gpr
    nodes = math.ceil(gpus / h.gpus_per_node)
    fleet = goal.fleet_rate_req_s(ctx.rate_req_s, per_replica, r)
    feasible = nodes <= h.max_nodes
    reason = "" if feasible else (f"{_label(params)} serves {per_replica:.3g} req/s per replica (simulated): "
                                  f"{r} x {gpus_per_replica(params)} GPUs = {gpus} GPUs on {nodes} nodes, "
                                  f"max_nodes is {h.max_nodes}")
    return Verification(
        params=Aggregated.from_config(params), per_replica_goodput_req_s=per_replica, simulations=simulations, feasible=feasible,
        reason=reason, replicas=r, gpus=gpus, nodes=nodes, usd_per_hour=gpus * h.usd_per_gpu_hour,
        goodput_req_s=per_replica * r, load_per_replica_req_s=fleet / r,
        output_tok_s_at_goodput=per_replica * r * ctx.stats.mean_output_tokens, sim_requests=n,
        nominal_per_replica_goodput_req_s=nominal, fleet_rate_req_s=fleet)


def _label(p: Mapping) -> str:
    """A config as a user reads it: TP8 fp8 cap 512 chunk 4096 (k 2) (layout)."""
    par = p.get("layout") or f"TP{p['tp']}" + (f" x PP{p['pp']}" if p.get("pp", 1) > 1 else "")
    return (f"{par} {p['kv_dtype']} cap {p['batch_cap']} chunk {p['chunk_tokens']}"
            + (f" k {p['spec_k']}" if p.get("spec_k") else ""))


def draw_seeds(ctx: SolveContext) -> list[int]:
    """The fresh draws' seeds: ``DRAWS`` after the workload's own; one for a replayed trace without
    speculative decoding (its requests, and so its simulation, do not depend on the seed)."""
    k = 1 if ctx.spec.workload.trace is not None and ctx.spec.speculative is None else DRAWS
    return [ctx.workload_seed + 1 + i for i in range(k)]


def simulate_at(ctx: SolveContext, params: Mapping, fleet_rate_req_s: float, replicas: int, n: int, seed: int):
    """One draw of the deployment at its load: exactly what ``kvtune simulate W --replicas R --rate
    F --requests N --seed S`` runs with the config's flags (``costmodel.simulate.simulate_fleet``)."""
    return simulate_fleet(ctx.fitting_step(params), _maker(ctx), sim_config(ctx, params), int(replicas),
                          fleet_rate_req_s, int(n), "trace", None, int(seed))


class DrawSet:
    """SLO attainment of one deployment on fresh draws, per (seed, per-replica rate), each simulated
    once: ``attain(seed, rate)`` runs one draw (``n`` requests of that seed at that rate);
    ``attain_many(pairs)``, when given, runs a batch of them (on several processes: the race's
    runner) and ``prefetch`` uses it where the next steps need several draws at once."""

    def __init__(self, attain: Callable[[int, float], float], target: float,
                 attain_many: Callable[[list[tuple[int, float]]], list[float]] | None = None):
        self._attain, self.a, self._many = attain, target, attain_many
        self.seen: dict[tuple[int, float], float] = {}
        self.sims = 0

    def prefetch(self, pairs: list[tuple[int, float]]) -> None:
        todo = list(dict.fromkeys(k for k in pairs if k not in self.seen))
        if self._many is None or len(todo) < 2:
            return
        for k, a in zip(todo, self._many(todo)):
            self.seen[k] = float(a)
        self.sims += len(todo)

    def attainment(self, seed: int, rate: float) -> float:
        key = (seed, rate)
        if key not in self.seen:
            self.seen[key] = float(self._attain(seed, rate))
            self.sims += 1
        return self.seen[key]

    def meets(self, seed: int, rate: float) -> bool:
        return self.attainment(seed, rate) >= self.a

    def goodput_below(self, seed: int, miss_req_s: float) -> float:
        """The highest rate below ``miss_req_s`` (where draw ``seed`` misses) at which it meets, to
        ``REL_TOL``: down by ``STEP_DOWN`` until it meets, then bisected (0 if it misses even at
        a thousandth of the rate)."""
        hi, lo = miss_req_s, miss_req_s * STEP_DOWN
        while not self.meets(seed, lo):
            hi, lo = lo, lo * (STEP_DOWN if lo > 0.8 * miss_req_s else 0.8)
            if lo < 1e-3 * miss_req_s:
                return 0.0
        while hi - lo > REL_TOL * lo:
            mid = math.sqrt(lo * hi)
            if self.meets(seed, mid):
                lo = mid
            else:
                hi = mid
        return lo

    def least_goodput(self, seeds: list[int], start_req_s: float) -> float:
        """The least goodput over the draws, at most ``start_req_s``: every draw is simulated at the
        running least; of those that miss there, the worst is bisected (its goodput is the new least)
        and the others are tried again at it, until all meet. Attainment falls with the rate on each
        draw, so a draw that met at a higher rate meets at a lower one and is not simulated again."""
        r = start_req_s
        self.prefetch([(s, r) for s in seeds])
        fails = [s for s in seeds if not self.meets(s, r)]
        while fails and r > 0:
            worst = min(fails, key=lambda s: (self.attainment(s, r), s))
            r = self.goodput_below(worst, r)
            if r > 0:
                self.prefetch([(s, r) for s in fails if s != worst])
            fails = [s for s in fails if s != worst and r > 0 and not self.meets(s, r)]
        return r

    def replicas_for(self, seeds: list[int], replicas: int, max_replicas: int,
                     load_for: Callable[[int], float]) -> int | None:
        """min_cost: the fewest replicas from ``replicas`` up (at most ``max_replicas``) at whose
        per-replica load (``load_for``) every draw meets the target; None: none within the budget.
        The draws are tried in the order given, ``DRAW_BATCH`` at a time, and a count of replicas is
        given up at its first miss (the hardest draws first make a config that fails cheap)."""
        r = replicas
        while r <= max_replicas:
            load = load_for(r)
            for i in range(0, len(seeds), DRAW_BATCH):
                part = seeds[i:i + DRAW_BATCH]
                self.prefetch([(s, load) for s in part])
                if not all(self.meets(s, load) for s in part):
                    break
            else:
                return r
            r += 1
        return None

    def goodput_at_load(self, seeds: list[int], start_req_s: float, load_for: Callable[[float], float]
                        ) -> tuple[float, float]:
        """max_goodput: (robust goodput, per-replica load): the least goodput over the draws
        (``least_goodput``) and the load of the deployment sized on it (``load_for``), at which every
        draw is simulated and must meet; one that does not (against the trend in rate) lowers the
        goodput to its own. Goodput 0: a draw misses even at a trickle."""
        g = self.least_goodput(seeds, start_req_s)
        load = load_for(g) if g > 0 else 0.0
        for _ in range(len(seeds) + 1):
            if g > 0:
                self.prefetch([(s, load) for s in seeds])
            late = [s for s in seeds if g > 0 and not self.meets(s, load)]
            if not late:
                break
            g = min(g, min(self.goodput_below(s, load) for s in late))
            load = load_for(g) if g > 0 else 0.0
        return g, load


def draw_attainment(ctx: SolveContext, params: Mapping, rate_req_s: float, n: int, seed: int) -> float:
    """SLO attainment of one replica of ``params`` on draw ``seed`` (``n`` requests at ``rate_req_s``)."""
    res = simulate(ctx.fitting_step(params), ctx.spec.requests(n, seed, rate_req_s=rate_req_s),
                   sim_config(ctx, params), "trace", seed=seed)
    return float(res.slo_attainment)


def robust_config(ctx: SolveContext, params: Mapping, nominal_req_s: float, n: int) -> Verification:
    """``robust`` from a nominal goodput (``verify``'s ``per_replica_goodput_req_s`` on ``n``
    requests per simulation): the race's work item, so a process needs only these numbers. Its
    ``simulations`` count the robust stage's alone."""
    return robust(ctx, _sized(ctx, params, nominal_req_s, 0, n, nominal=nominal_req_s))


def robust(ctx: SolveContext, v: Verification,
           attain_many: Callable[[list[tuple[int, float]]], list[float]] | None = None,
           max_replicas: int | None = None, order: list[int] | None = None) -> Verification:
    """A nominal verification made robust to the request draw (module docstring): every fresh draw
    meets the target at the deployment's per-replica load (min_cost: replicas added until they do;
    max_goodput: the goodput the least over the draws). Its latency percentiles and attainment are
    the first fresh draw's at that load, which ``simulate_at`` (and so ``kvtune simulate``) reproduces.
    ``attain_many(pairs)``: the attainment of each (seed, per-replica rate) draw of this config, run
    as a batch (the race's runner; ``draw_attainment`` is one of them); the result does not depend on it.
    min_cost: ``max_replicas``, the most replicas worth checking (the race's: beyond them it cannot
    beat its best; a config that needs more comes back not feasible with ``draws`` None and says
    so), ``order`` the order the draws are tried in (the race's: the hardest so far first)."""
    if v.replicas is None or v.robust or not v.per_replica_goodput_req_s > 0:
        return v
    p, n = v.params, int(v.sim_requests or config_requests(ctx, v.params))
    nominal = v.nominal_per_replica_goodput_req_s or v.per_replica_goodput_req_s
    seeds = draw_seeds(ctx)
    d = DrawSet(lambda s, rate: draw_attainment(ctx, p, rate, n, s), ctx.spec.slo.attainment, attain_many)
    least: float | None = None
    if not ctx.objective.fixed_fleet:   # replicas grow until every draw meets the target rate
        most = max(v.replicas, ctx.max_gpus // gpus_per_replica(p))
        cap = most if max_replicas is None else min(most, max_replicas)
        tried = [s for s in (order or []) if s in seeds] + [s for s in seeds if s not in (order or [])]
        r = d.replicas_for(tried, v.replicas, cap, lambda r: ctx.rate_req_s / r)
        if r is None and cap < most:
            return dataclasses.replace(v, feasible=False, simulations=v.simulations + d.sims, reason=(
                f"{_label(p)} misses on a fresh draw of {n:,} requests with up to {cap} replicas, the most "
                f"that could beat the best so far"))
        if r is None:
            return dataclasses.replace(v, feasible=False, simulations=v.simulations + d.sims, reason=(
                f"{_label(p)} meets the SLOs on every one of {len(seeds)} fresh draws of {n:,} requests only "
                f"beyond {most} replicas ({ctx.max_gpus} GPUs, max_nodes {ctx.spec.hardware.max_nodes}); the "
                f"workload's own draw alone gives {nominal:.3g} req/s per replica"))
        sz = _sized(ctx, p, v.per_replica_goodput_req_s, v.simulations, n, nominal=nominal, replicas=r)
    else:
        least, _ = d.goodput_at_load(seeds, nominal, lambda g: float(
            _sized(ctx, p, g, 0, n, nominal=nominal).load_per_replica_req_s or 0.0))
        if least <= 0:
            return dataclasses.replace(v, feasible=False, simulations=v.simulations + d.sims, reason=(
                f"misses the SLO attainment target {ctx.spec.slo.attainment:g} on a fresh draw of {n:,} "
                f"requests even at a trickle"))
        sz = _sized(ctx, p, least, v.simulations, n, nominal=nominal)
    fleet, r = float(sz.fleet_rate_req_s or 0.0), int(sz.replicas or 1)
    load = fleet / r
    atts = tuple(d.attainment(s, load) for s in seeds)
    at = simulate_at(ctx, p, fleet, r, n, seeds[0])
    summ = at.summary()
    draws = Draws(tuple(seeds), n, least, load, atts, d.sims + 1)
    return dataclasses.replace(
        sz, simulations=v.simulations + d.sims + 1, slo_attainment=float(at.slo_attainment),
        ttft_ms=_pct(summ, "ttft_ms"), tpot_ms=_pct(summ, "tpot_ms"), output_tok_s=float(at.output_tok_s),
        preemptions=int(at.preemptions), draws=draws)
