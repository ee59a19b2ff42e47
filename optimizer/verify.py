"""One config's simulator verification: goodput bisected by ``costmodel.goodput`` on the workload's
own request sample (``SolveContext.workload_seed``), sized into a deployment and simulated once more
at its real per-replica load. ``kvtune solve`` and ``bench/bench_oracle.py`` both call ``verify``,
so the oracle and the search measure a config the same way (same requests, same tolerance).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field, fields

from .launch import scheduling as launch_scheduling
from .layouts import gpus_per_replica
from .search import SolveContext

__all__ = ["Verification", "verify", "verify_config", "sim_requests", "config_requests", "sim_config", "MAX_SIM_REQUESTS", "REL_TOL"]

MAX_SIM_REQUESTS = 6000  # cap on requests per simulated rate (simulation time)
REL_TOL = 0.005        # goodput bisection tolerance: two configs compared at 1% need a finer step


@dataclass(frozen=True)
class Verification:
    """One config's simulator verification (``verify``): per-replica goodput, the deployment it
    sizes to and its latencies at the real per-replica load. A config that misses even at a trickle
    carries only the first five fields. ``to_json``/``from_json``: the record work items return
    (shared through the study's storage by ``optimizer.scaleout``) and the race's outcomes keep."""

    params: dict
    per_replica_goodput_req_s: float
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
    slo_attainment: float | None = None
    ttft_ms: dict = field(default_factory=dict)   # mean, p50, p90, p99 at the per-replica load
    tpot_ms: dict = field(default_factory=dict)
    output_tok_s: float | None = None
    preemptions: int | None = None
    sim_requests: int | None = None

    def to_json(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        if self.replicas is None:  # missed even at a trickle: no deployment, no latencies
            return {k: d[k] for k in ("params", "per_replica_goodput_req_s", "simulations", "feasible", "reason")}
        return d

    @classmethod
    def from_json(cls, d: dict) -> "Verification":
        return cls(**d)


def sim_config(ctx: SolveContext, params: dict):
    if ctx.engine is not None:
        cfg = ctx.engine.sim_config(params["batch_cap"], params["chunk_tokens"])
        # simulate the scheduling the launch settings give (SGLang: prefill-first under NGRAM/STANDALONE)
        s = ctx.spec.speculative
        if launch_scheduling(ctx.engine.engine, s.method if s else None, params.get("spec_k", 0)) == "prefill_first":
            cfg = dataclasses.replace(cfg, prefill_first=True)
        return cfg
    from kvtune.costmodel.simulate import SimConfig
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
    from kvtune.costmodel.goodput import default_n_requests
    return int(min(default_n_requests(attainment, max_concurrency=operating_batch),
                   MAX_SIM_REQUESTS))


def slots(ctx: SolveContext, params: dict) -> int:
    """Sequences the batch cap and the KV pool admit at once on a workload's mean request
    (``costmodel.goodput``'s own measure of the in-flight set); 0 if the pool is too small."""
    sm = ctx.fitting_step(params)
    per_seq = max(ctx.stats.mean_input_tokens + ctx.stats.mean_output_tokens, 1.0)
    return int(min(params["batch_cap"], sm.memory.kv_pool_tokens // per_seq))


def config_requests(ctx: SolveContext, params: dict) -> int:
    """Requests per simulated rate for one config: a function of the config alone (its
    ``slots``), so every stage of the search, and the oracle, simulate it on the same requests."""
    return sim_requests(ctx.spec.slo.attainment, max(slots(ctx, params), 1))


def verify_config(ctx: SolveContext, params: dict) -> Verification:
    """``verify`` one config the way the search and the oracle both do: ``config_requests``
    requests, the bisection started at the screened goodput."""
    from .search import evaluate
    ev = evaluate(ctx, params)
    return verify(ctx, params, max(slots(ctx, params), 1), ev.per_replica_goodput_req_s or None)


def verify(ctx: SolveContext, params: dict, operating_batch: int, guess_req_s: float | None = None) -> Verification:
    """Simulated per-replica goodput, sizing and latencies at the target load for one config.
    ``guess_req_s`` (the screened goodput) starts the goodput bracket; it does not bias the answer
    beyond the bisection tolerance."""
    from kvtune.costmodel.goodput import goodput
    from kvtune.costmodel.simulate import simulate

    sm = ctx.fitting_step(params)
    spec, seed = ctx.spec, ctx.workload_seed
    cfg = sim_config(ctx, params)
    n = sim_requests(spec.slo.attainment, operating_batch)

    def make(rate, n, s):
        return spec.requests(n, s, rate_req_s=rate)

    g = goodput(sm, make, cfg, spec.slo.attainment, n_requests=n, seed=seed, rel_tol=REL_TOL,
                guess_req_s=guess_req_s)
    per_replica = float(g.goodput_req_s)
    h = spec.hardware
    if per_replica <= 0:
        return Verification(dict(params), per_replica, g.iterations, False,
                            g.reason or "simulated SLO attainment misses the target even at a trickle")
    if spec.objective == "max_goodput":
        replicas = ctx.max_gpus // gpus_per_replica(params)
    else:
        replicas = math.ceil(ctx.rate_req_s / per_replica * (1 - 1e-12))
    gpus = replicas * gpus_per_replica(params)
    nodes = math.ceil(gpus / h.gpus_per_node)
    if spec.objective == "min_cost":
        load = ctx.rate_req_s / replicas
    else:  # max_goodput: at the target rate, or at the goodput when there is no target or it is higher
        load = per_replica if not math.isfinite(ctx.rate_req_s) else min(ctx.rate_req_s / replicas, per_replica)
    res = simulate(sm, make(load, n, seed + 1), cfg, arrival="trace", seed=seed)
    summ = res.summary()
    attainment = float(res.slo_attainment)
    feasible = nodes <= h.max_nodes and attainment >= spec.slo.attainment - 1e-9
    reason = ""
    if nodes > h.max_nodes:
        reason = f"needs {nodes} nodes > max_nodes {h.max_nodes} at {per_replica:.2f} req/s per replica (simulated)"
    elif not feasible:
        reason = (f"simulated SLO attainment {attainment:.3f} < {spec.slo.attainment:g} "
                  f"at {load:.2f} req/s per replica")
    return Verification(
        params=dict(params), per_replica_goodput_req_s=per_replica, simulations=g.iterations + 1,
        feasible=feasible, reason=reason, replicas=replicas, gpus=gpus, nodes=nodes,
        usd_per_hour=gpus * h.usd_per_gpu_hour, goodput_req_s=per_replica * replicas, load_per_replica_req_s=load,
        output_tok_s_at_goodput=per_replica * replicas * ctx.stats.mean_output_tokens,
        slo_attainment=attainment, ttft_ms=_pct(summ, "ttft_ms"), tpot_ms=_pct(summ, "tpot_ms"),
        output_tok_s=float(res.output_tok_s) * replicas, preemptions=int(res.preemptions), sim_requests=n)
