"""A disaggregated unit verified on the same evidence as an aggregated config (``optimizer.verify``).

``optimizer.disagg.search_disaggregated`` ranks pool shapes on short runs (150 and 400 requests,
5-10% tolerance): a screen. Before a disaggregated deployment is compared with an aggregated one,
its best candidates are verified as ``optimizer.verify`` verifies an aggregated config:

``verify_unit`` (nominal): the unit's goodput bisected to ``verify.REL_TOL`` on the workload's
own draw (``workload_seed``) with ``verify.sim_requests`` requests per simulation (the same rule
as an aggregated replica's: >= 100 in the allowed-miss tail, >= 5 x the sequences the decode pool
holds at once), then sized: min_cost, units for the target rate; max_goodput, every unit
``hardware.max_nodes`` holds.

``robust_unit``: the least goodput over the same fresh draws (``verify.draw_seeds``), the units
sized on it and every draw simulated at the per-unit load (``verify.DrawSet.robust_load``).

``simulate_unit_at`` is one draw of the deployment at its load: what ``kvtune simulate`` runs with
the disaggregated flags, so the printed percentiles can be checked.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Mapping

from .disagg import DisaggCandidate, ForkPool, PoolChoice, uncached_prompt_tokens
from .search import SolveContext
from .verify import REL_TOL, DrawSet, Draws, draw_seeds, sim_requests
from kvtune.costmodel.deployment import Pool, kv_link, disaggregated_bound_req_s, simulate_disaggregated
from kvtune.costmodel.goodput import goodput

__all__ = ["UnitVerification", "verify_unit", "robust_unit", "simulate_unit_at", "unit_rank"]

N_BOUND_REQUESTS = 2000   # requests describing the mean prompt and output for the capacity bound


@dataclass(frozen=True)
class UnitVerification:
    """One disaggregated unit's verification: per-unit goodput (robust when ``draws`` is set),
    the deployment of ``units`` units it sizes to, and (robust, checked at the load) the first
    fresh draw's summary there (``at``)."""

    cand: DisaggCandidate
    kv_dtype: str
    engine: str
    per_unit_goodput_req_s: float
    nominal_per_unit_goodput_req_s: float
    n_requests: int
    simulations: int
    feasible: bool
    reason: str = ""
    units: int = 0
    gpus: int = 0
    nodes: int = 0
    usd_per_hour: float = math.inf
    fleet_rate_req_s: float = 0.0
    draws: Draws | None = None
    at: Mapping[str, Any] | None = None

    @property
    def goodput_req_s(self) -> float:
        return self.per_unit_goodput_req_s * self.units

    @property
    def ranked_goodput_req_s(self) -> float:
        """The goodput deployments are ranked on: the workload's own draw, at the sized units."""
        return self.nominal_per_unit_goodput_req_s * self.units

    @property
    def load_per_unit_req_s(self) -> float:
        return self.fleet_rate_req_s / self.units if self.units else 0.0

    def candidate(self) -> DisaggCandidate:
        """The search's candidate with the verified per-unit goodput and the simulations spent."""
        return dataclasses.replace(self.cand, goodput_req_s=self.per_unit_goodput_req_s,
                                   simulations=self.cand.simulations + self.simulations, round="verified",
                                   reason=self.reason)


def unit_rank(ctx: SolveContext, u: UnitVerification) -> tuple:
    """``optimizer.objective.objective_rank`` for a unit, then fewer GPUs and its shape, so the order
    is total and never depends on which search produced it."""
    c = u.cand
    return (*ctx.objective.rank(u.usd_per_hour, u.ranked_goodput_req_s, u.kv_dtype, ctx.spec.search.kv_dtype),
            u.gpus, c.prefill.tp, c.prefill.replicas, c.decode.tp, c.decode.replicas, c.prefill.chunk_tokens,
            c.decode.batch_cap, u.kv_dtype)


def _pools(ctx: SolveContext, c: DisaggCandidate, kv: str):
    def pool(p: PoolChoice) -> Pool:
        step = ctx.step(p.tp, kv, 0)
        if isinstance(step, Exception):
            raise step
        return Pool(step, ctx.engine.sim_config(p.batch_cap, p.chunk_tokens), p.replicas)
    return pool(c.prefill), pool(c.decode), kv_link(ctx.gpu, c.link == "nvlink")


def _n_requests(ctx: SolveContext, c: DisaggCandidate, kv: str) -> int:
    """``verify.sim_requests`` for the sequences the unit's decode pool holds at once."""
    _, dp, _ = _pools(ctx, c, kv)
    per_seq = max(ctx.stats.mean_input_tokens + ctx.stats.mean_output_tokens, 1.0)
    slots = dp.replicas * int(min(c.decode.batch_cap, dp.step.memory.kv_pool_tokens // per_seq))
    return sim_requests(ctx.spec.slo.attainment, max(slots, 1))


def _maker(ctx: SolveContext):
    def make(rate, n, s):
        return ctx.spec.requests(n, s, rate_req_s=rate)
    return make


def _run_one(ctx: SolveContext, c: DisaggCandidate, kv: str, engine: str):
    """``sim(requests, arrival, warmup_frac)`` of one unit, and its pools' capacity bound (the
    prefill pool computing only the prompt tokens the prefix cache does not hold)."""
    pp, dp, link = _pools(ctx, c, kv)
    seed = ctx.workload_seed

    def sim(req, arrival, wf, s=seed):
        return simulate_disaggregated(pp, dp, req, link, arrival, s, wf, engine=engine).result
    probe = ctx.spec.requests(N_BOUND_REQUESTS, seed, rate_req_s=1.0)
    ub = disaggregated_bound_req_s(pp, dp, float(probe.input_tokens.mean()), float(probe.output_tokens.mean()),
                                   uncached_prompt_tokens(probe))
    return sim, pp, dp, ub


def _sized(ctx: SolveContext, base: UnitVerification, per_unit: float, units: int | None = None) -> UnitVerification:
    """The deployment ``per_unit`` req/s per unit sizes to (``units``, when robust sizing needs more)."""
    h, goal = ctx.spec.hardware, ctx.objective
    gpus_unit = base.cand.gpus
    units = goal.replicas(ctx.rate_req_s, per_unit, gpus_unit, ctx.max_gpus, at_least=units)
    fleet = goal.fleet_rate_req_s(ctx.rate_req_s, per_unit, units) if units else 0.0
    gpus = units * gpus_unit
    nodes = math.ceil(gpus / h.gpus_per_node)
    ok = 0 < gpus <= ctx.max_gpus
    why = "" if ok else (f"disaggregated {units} x [{base.cand.prefill.replicas} prefill x TP{base.cand.prefill.tp} + "
                         f"{base.cand.decode.replicas} decode x TP{base.cand.decode.tp}] serves {per_unit:.3g} req/s "
                         f"per unit (simulated): {nodes} nodes, max_nodes is {h.max_nodes}")
    return dataclasses.replace(base, per_unit_goodput_req_s=per_unit, units=units, gpus=gpus, nodes=nodes,
                               usd_per_hour=gpus * h.usd_per_gpu_hour, fleet_rate_req_s=fleet, feasible=ok,
                               reason=why)


def verify_unit(ctx: SolveContext, c: DisaggCandidate, kv: str, engine: str) -> UnitVerification:
    """The nominal verification of one unit (module docstring)."""
    sim, _, dp, ub = _run_one(ctx, c, kv, engine)
    n = _n_requests(ctx, c, kv)
    guess = c.goodput_req_s if c.goodput_req_s and math.isfinite(c.goodput_req_s) and c.goodput_req_s > 0 else None
    g = goodput(dp.step, _maker(ctx), dp.config, ctx.spec.slo.attainment, n_requests=n, seed=ctx.workload_seed,
                rel_tol=REL_TOL, sim=sim, upper_bound_req_s=ub, guess_req_s=guess)
    base = UnitVerification(c, kv, engine, float(g.goodput_req_s), float(g.goodput_req_s), n, int(g.iterations),
                            False, g.reason or "")
    if not g.goodput_req_s > 0:
        return dataclasses.replace(base, reason=g.reason or "misses the SLOs even at a trickle")
    return _sized(ctx, base, float(g.goodput_req_s))


def robust_unit(ctx: SolveContext, u: UnitVerification, jobs: int = 1) -> UnitVerification:
    """``u`` made robust to the request draw as ``verify.robust`` makes an aggregated config:
    every fresh draw meets at the per-unit load (min_cost: units added until they do; max_goodput:
    the goodput the least over the draws). ``jobs`` > 1: the draws the checks need at once on that
    many forked processes (the same answer)."""
    if u.draws is not None or not u.per_unit_goodput_req_s > 0:
        return u
    sim, _, _, _ = _run_one(ctx, u.cand, u.kv_dtype, u.engine)
    make, n = _maker(ctx), u.n_requests

    def attain(seed_rate: tuple[int, float]) -> float:
        s, rate = seed_rate
        return float(sim(make(rate, n, s), "trace", None, s).slo_attainment)
    with ForkPool(attain, jobs) as pool:
        d = DrawSet(lambda s, rate: attain((s, rate)), ctx.spec.slo.attainment, pool.map)
        return _robust_unit(ctx, u, d, n)


def _robust_unit(ctx: SolveContext, u: UnitVerification, d: DrawSet, n: int) -> UnitVerification:
    seeds = draw_seeds(ctx)
    least: float | None = None
    if not ctx.objective.fixed_fleet:   # units grow until every draw meets the target rate
        most = max(u.units, ctx.max_gpus // u.cand.gpus)
        units = d.replicas_for(seeds, u.units, most, lambda k: ctx.rate_req_s / k)
        if units is None:
            return dataclasses.replace(u, feasible=False, simulations=u.simulations + d.sims,
                                       reason=f"meets the SLOs on every fresh draw of {n:,} requests only beyond "
                                              f"{most} units (max_nodes {ctx.spec.hardware.max_nodes})")
        sz = _sized(ctx, u, u.per_unit_goodput_req_s, units)
    else:
        least, _ = d.goodput_at_load(seeds, u.nominal_per_unit_goodput_req_s,
                                     lambda g: _sized(ctx, u, g).load_per_unit_req_s)
        if least <= 0:
            return dataclasses.replace(u, feasible=False, simulations=u.simulations + d.sims,
                                       reason=f"misses the SLO attainment target on a fresh draw of {n:,} requests "
                                              f"even at a trickle")
        sz = _sized(ctx, u, least)
    load = sz.load_per_unit_req_s
    atts = tuple(d.attainment(s, load) for s in seeds)
    at = simulate_unit_at(ctx, sz.cand, u.kv_dtype, u.engine, sz.fleet_rate_req_s, sz.units, n, seeds[0])
    draws = Draws(tuple(seeds), n, least, load, atts, d.sims + 1)
    return dataclasses.replace(sz, simulations=u.simulations + d.sims + 1, draws=draws, at=at.summary())


def simulate_unit_at(ctx: SolveContext, c: DisaggCandidate, kv: str, engine: str, fleet_rate_req_s: float,
                     units: int, n: int, seed: int):
    """One draw of ``units`` units at ``fleet_rate_req_s`` split evenly among them (a random split of
    a Poisson stream: each unit sees ``fleet / units``): ``kvtune simulate``'s disaggregated run."""
    pp, dp, link = _pools(ctx, c, kv)
    req = ctx.spec.requests(int(n), int(seed), rate_req_s=fleet_rate_req_s / units)
    return simulate_disaggregated(pp, dp, req, link, "trace", int(seed), None, engine=engine).result
