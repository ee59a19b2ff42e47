"""Aggregated or disaggregated: ``kvtune solve`` searches both kinds of deployment
(``search.deployment``, default both) and recommends the better one for the objective.

An outer layer, as ``optimizer.gpu_choice`` is: the aggregated search runs as before
(``optimizer.recommend.solve``; its answer is also the reference the other kind is measured
against), then ``optimizer.disagg.search_disaggregated`` races disaggregated deployments (TP_p,
TP_d, x:y, each pool's knobs, each KV dtype searched) on the same simulator, requests and seed,
ranked by the objective:

    min_cost      units of (x prefill + y decode) replicas to serve the target rate, $/h
    max_goodput   goodput per $ of one unit (replicated within hardware.max_nodes)

The result keeps every key of the aggregated one. ``deployment`` says which kind won and by how
much against the best of the other kind (``margin_pct``: $/h saved for min_cost, goodput per $
gained for max_goodput), with both kinds' picks; when the disaggregated one wins,
``recommendation`` describes it in the same keys (``tp``/``batch_cap`` of the decode pool,
``chunk_tokens`` of the prefill pool, ``replicas`` and ``gpus`` of the whole deployment) plus
``prefill`` and ``decode``, ``predicted`` and ``cost`` are its own, ``launch`` holds its
disaggregated launch settings and ``launch_aggregated`` the aggregated pick's.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from .disagg import DEFAULT_ENGINE, DisaggCandidate, PoolChoice, search_disaggregated
from .result import (AggregatedSummary, Bottleneck, Cost, DeploymentChoice, DisaggregatedMiss,
                     DisaggregatedRecommendation, DisaggregatedSummary, JsonObject, Predicted, SolveResult)
from .search import SolveContext
from .workload import WorkloadSpec

__all__ = ["solve_deployments", "disaggregated_answer", "DisaggregatedAnswer", "deployment_lines"]

MAX_UNIT_GPUS = 16   # one disaggregated unit spans at most two 8-GPU nodes
_SUMMARY_KEYS = ("tp", "batch_cap", "kv_dtype", "spec_k", "chunk_tokens", "replicas")


@dataclass(frozen=True)
class DisaggregatedAnswer:
    """The disaggregated search's answer (``disaggregated_answer``): the best deployment or why
    none qualifies, each KV dtype's search, and (found one) its simulation at the target load."""

    pick: DisaggregatedSummary | DisaggregatedMiss
    searches: tuple[JsonObject, ...] = ()      # {"kv_dtype": ..., **DisaggSearch.to_json()} per KV dtype
    load_per_unit_req_s: float = math.nan
    at_target: Mapping[str, Any] | None = None  # the simulated summary at load_per_unit_req_s per unit
    usd_per_million_output_tokens: float = math.nan


def _agg_summary(r: SolveResult) -> AggregatedSummary | None:
    if r.status != "ok" or r.recommendation is None or r.cost is None or r.predicted is None:
        return None
    rec = r.recommendation.to_json()
    return AggregatedSummary(gpus=rec["gpus"], usd_per_hour=r.cost.usd_per_hour,
                             goodput_req_s=r.predicted.goodput_req_s,
                             per_replica_goodput_req_s=r.predicted.per_replica_goodput_req_s,
                             config={k: rec[k] for k in _SUMMARY_KEYS if k in rec})


def _units(spec: WorkloadSpec, c: DisaggCandidate, max_total: int, rate: float) -> int:
    if spec.objective == "min_cost":
        return max(1, math.ceil(rate / c.goodput_req_s)) if c.goodput_req_s > 0 else 0
    return max(1, max_total // c.gpus)


def _score(spec: WorkloadSpec, max_total: int, rate: float, usd: float) -> Callable[[DisaggCandidate], tuple]:
    def score(c: DisaggCandidate) -> tuple:
        if not c.goodput_req_s > 0:
            return (math.inf, 0.0)
        u = _units(spec, c, max_total, rate)
        if u * c.gpus > max_total:
            return (math.inf, 0.0)
        if spec.objective == "min_cost":
            return (u * c.gpus * usd, -c.goodput_req_s)
        return (-(c.goodput_req_s / (c.gpus * usd)), c.gpus)
    return score


def disaggregated_answer(spec: WorkloadSpec, seed: int | None = None, calibration: str | None = None,
                         engine: str | None = None, profile: str | None = None
                         ) -> tuple[DisaggregatedAnswer, SolveContext | None]:
    """The best disaggregated deployment for ``spec`` (or why none), and the solve context it was
    searched in (None where skipped)."""
    from kvtune.costmodel.deployment import Pool, kv_link, simulate_disaggregated
    from kvtune.costmodel.step import StepCost

    if spec.speculative is not None:
        return DisaggregatedAnswer(DisaggregatedMiss(
            status="skipped", reason="speculative decoding is searched for aggregated replicas only")), None
    ctx = SolveContext.build(spec, seed, calibration, engine, profile)
    h = spec.hardware
    max_total = h.max_nodes * h.gpus_per_node
    rate = ctx.rate_req_s
    usd = h.usd_per_gpu_hour
    eng = ctx.engine.engine or DEFAULT_ENGINE
    score = _score(spec, max_total, rate, usd)

    def make(r, n, s):
        return spec.requests(n, s, rate_req_s=r)

    def step_for(kv: str) -> Callable[[int], StepCost | Exception]:
        return lambda tp: ctx.step(tp, kv, 0)

    best: DisaggCandidate | None = None
    best_kv = ""
    searches = []
    for kv in spec.search.kv_dtype:
        d = search_disaggregated(step_for(kv), ctx.engine.sim_config, make,
                                 spec.slo.attainment, tps=spec.search.tp, gpu=ctx.gpu,
                                 gpus_per_node=h.gpus_per_node, max_gpus=min(MAX_UNIT_GPUS, max_total),
                                 engine=eng, seed=ctx.workload_seed, score=score)
        searches.append({"kv_dtype": kv, **d.to_json()})
        if d.best is not None and (best is None or score(d.best) < score(best)):
            best, best_kv = d.best, kv
    if best is None:
        return DisaggregatedAnswer(DisaggregatedMiss(
            status="infeasible", reason="no disaggregated deployment of single-node replicas met the SLOs"
                                        + (" within hardware.max_nodes" if searches else "")), tuple(searches)), ctx
    units = _units(spec, best, max_total, rate)
    # the deployment at the target load: each unit carries rate / units (max_goodput: its goodput)
    load = rate / units if spec.objective == "min_cost" else best.goodput_req_s

    def pool(p: PoolChoice) -> Pool:
        step = ctx.step(p.tp, best_kv, 0)
        assert not isinstance(step, Exception)   # the search simulated this pool
        return Pool(step, ctx.engine.sim_config(p.batch_cap, p.chunk_tokens), p.replicas)

    req = make(load, 400, ctx.workload_seed)
    at = simulate_disaggregated(pool(best.prefill), pool(best.decode), req, kv_link(ctx.gpu, best.link == "nvlink"),
                                "trace", ctx.workload_seed, engine=eng).result.summary()
    gpus = units * best.gpus
    goodput = units * best.goodput_req_s
    out_tok_s = (rate if spec.objective == "min_cost" else goodput) * ctx.stats.mean_output_tokens
    pick = DisaggregatedSummary(gpus=gpus, nodes=math.ceil(gpus / h.gpus_per_node), usd_per_hour=gpus * usd,
                                goodput_req_s=goodput, units=units, unit=best, kv_dtype=best_kv, engine=eng,
                                evidence="simulated")
    return DisaggregatedAnswer(
        pick, tuple(searches), load_per_unit_req_s=load, at_target=at,
        usd_per_million_output_tokens=gpus * usd / (out_tok_s * 3600) * 1e6 if out_tok_s > 0 else math.inf), ctx


def _margin(spec: WorkloadSpec, win: AggregatedSummary | DisaggregatedSummary,
            lose: AggregatedSummary | DisaggregatedSummary) -> float:
    """How much better the winner is: $/h saved (min_cost) or goodput per $ gained (max_goodput)."""
    if spec.objective == "min_cost":
        return 100.0 * (lose.usd_per_hour / win.usd_per_hour - 1.0)
    return 100.0 * ((win.goodput_req_s / win.usd_per_hour) / (lose.goodput_req_s / lose.usd_per_hour) - 1.0)


def _better(spec: WorkloadSpec, d: DisaggregatedSummary, a: AggregatedSummary) -> bool:
    return spec.objective_key(d.usd_per_hour, d.goodput_req_s) < spec.objective_key(a.usd_per_hour, a.goodput_req_s)


def _disagg_recommendation(model: str, gpu: str, d: DisaggregatedSummary) -> DisaggregatedRecommendation:
    u, n = d.unit, d.units
    pre = dataclasses.replace(u.prefill, replicas=u.prefill.replicas * n)
    dec = dataclasses.replace(u.decode, replicas=u.decode.replicas * n)
    return DisaggregatedRecommendation(tp=dec.tp, batch_cap=dec.batch_cap, kv_dtype=d.kv_dtype, spec_k=0,
                                       chunk_tokens=pre.chunk_tokens, replicas=pre.replicas + dec.replicas,
                                       gpus=d.gpus, nodes=d.nodes, gpu=gpu, model=model, prefill=pre, decode=dec,
                                       link=u.link, units=n)


def _launch(spec: WorkloadSpec, rec: DisaggregatedRecommendation, ctx: SolveContext) -> dict:
    from .launch import LaunchPick, build_pick, disaggregated_launch
    from .launch.context import request_lengths
    arch, gpu = ctx.model, ctx.gpu
    n = request_lengths(spec.workload)

    def pick(pool: PoolChoice) -> LaunchPick:
        cfg = {"tp": pool.tp, "batch_cap": pool.batch_cap, "kv_dtype": rec.kv_dtype, "spec_k": 0,
               "chunk_tokens": pool.chunk_tokens}
        return build_pick(arch.hf_id or str(spec.model), cfg, pool.replicas, spec.gpu_mem_util, None, arch=arch,
                          gpu=gpu, weights=spec.weights, activation_reserve_bytes=ctx.eff.activation_reserve_bytes,
                          gpus_per_node=spec.hardware.gpus_per_node,
                          max_request_tokens=None if n is None else n.total_tokens,
                          max_prompt_tokens=None if n is None else n.prompt_tokens)
    return disaggregated_launch(pick(rec.prefill), pick(rec.decode), f"kvtune-{arch.name}", spec.engine)


def _on_winning_gpu(spec: WorkloadSpec, agg: SolveResult) -> WorkloadSpec:
    """With several GPU types (``optimizer.gpu_choice``), the disaggregated race runs on the type
    the aggregated answer chose (the first type where none met the SLOs), at that type's price."""
    h = spec.hardware
    if not h.choices:
        return spec
    prices = dict(h.choices)
    gpu = agg.recommendation.gpu if agg.status == "ok" and agg.recommendation is not None else None
    gpu = gpu if gpu in prices else h.choices[0][0]
    return dataclasses.replace(spec, hardware=dataclasses.replace(h, gpu=gpu, usd_per_gpu_hour=prices[gpu], choices=()))


def solve_deployments(spec: WorkloadSpec, solve_one: Callable[..., SolveResult] | None = None,
                      **kwargs: Any) -> SolveResult:
    """``solve_one(spec, **kwargs)`` (aggregated) and, when ``spec.search.deployment`` lists it, the
    disaggregated search; the result of the better kind for the objective (module docstring)."""
    if solve_one is None:
        from .recommend import solve
        solve_one = solve
    kinds = tuple(spec.search.deployment)
    agg = solve_one(spec, **kwargs)
    if "disaggregated" not in kinds:
        return dataclasses.replace(agg, deployment=DeploymentChoice(searched=kinds, kind="aggregated"))
    dspec = _on_winning_gpu(spec, agg)
    dis, ctx = disaggregated_answer(dspec, kwargs.get("seed"), kwargs.get("calibration"), kwargs.get("engine"),
                                    kwargs.get("profile"))
    shown = _agg_summary(agg)
    a = shown if "aggregated" in kinds else None
    block = DeploymentChoice(searched=kinds, kind=None, aggregated=shown, disaggregated=dis.pick, search=dis.searches)
    x = dis.pick
    if "aggregated" not in kinds and not isinstance(x, DisaggregatedSummary):
        return _no_disaggregated(agg, block, x, shown)
    if not isinstance(x, DisaggregatedSummary) or (a is not None and not _better(spec, x, a)):
        d_ok = isinstance(x, DisaggregatedSummary)
        return dataclasses.replace(agg, deployment=dataclasses.replace(
            block, kind="aggregated" if agg.status == "ok" else None,
            margin_pct=_margin(spec, a, x) if (a is not None and isinstance(x, DisaggregatedSummary)) else None,
            against="disaggregated" if d_ok else None))
    assert ctx is not None and dis.at_target is not None   # a deployment was found, so searched and simulated
    spec = dspec
    rec = _disagg_recommendation(ctx.model.name, ctx.gpu.name, x)
    at = dis.at_target
    tpot_mean = at["tpot_ms"].get("mean", float("nan"))
    rate = agg.target_rate_req_s
    return dataclasses.replace(
        agg, status="ok", reason=None, closest=None, recommendation=rec,
        predicted=Predicted(goodput_req_s=x.goodput_req_s, per_replica_goodput_req_s=x.unit.goodput_req_s,
                            slo_attainment=at["slo_attainment"], ttft_ms=at["ttft_ms"], tpot_ms=at["tpot_ms"],
                            output_tok_s=at["output_tok_s"] * x.units,
                            tok_s_per_user=1000.0 / tpot_mean if tpot_mean and tpot_mean > 0 else float("nan"),
                            load_per_replica_req_s=dis.load_per_unit_req_s, evidence="simulated",
                            per_replica_is="one unit of the disaggregated deployment (prefill + decode pools)"),
        cost=Cost(usd_per_hour=x.usd_per_hour, usd_per_gpu_hour=spec.hardware.usd_per_gpu_hour,
                  usd_per_million_output_tokens=dis.usd_per_million_output_tokens,
                  priced_at="target rate" if spec.objective == "min_cost" else "goodput"),
        headroom=x.goodput_req_s / rate - 1 if rate and rate > 0 else float("nan"),
        bottleneck=Bottleneck(term="disaggregated", batch_limit=None, operating_batch=None),
        launch_aggregated=agg.launch, launch=_launch(spec, rec, ctx),
        deployment=dataclasses.replace(block, kind="disaggregated",
                                       margin_pct=_margin(spec, x, a) if a is not None else None,
                                       against="aggregated" if a is not None else None))


def _no_disaggregated(agg: SolveResult, block: DeploymentChoice, miss: DisaggregatedMiss,
                      shown: AggregatedSummary | None) -> SolveResult:
    """``search.deployment`` asked for disaggregated deployments only and none exists or meets the
    SLOs: an infeasible answer with the reason (never the aggregated pick in its place), naming the
    best aggregated deployment as the nearest alternative when there is one."""
    reason = f"search.deployment lists disaggregated only, and {miss.reason}"
    if shown is not None:
        n = shown.gpus
        reason += (f" (the best aggregated deployment: {n} GPU{'s' if n != 1 else ''} at ${shown.usd_per_hour:.2f}/h, "
                   f"TP{shown.config['tp']}; list aggregated in search.deployment to allow it)")
    return dataclasses.replace(agg, status="infeasible", reason=reason, closest=None, recommendation=None,
                               predicted=None, screened=None, cost=None, bottleneck=None, headroom=None, pareto=None,
                               launch=None, launch_aggregated=None, notes=None,
                               deployment=dataclasses.replace(block, kind=None))


def deployment_lines(r: SolveResult) -> list[str]:
    """``kvtune solve``'s summary lines for the kind of deployment: which won, by how much."""
    d = r.deployment
    if d is None or "disaggregated" not in d.searched:
        return []
    basis = "$/h" if r.objective == "min_cost" else "goodput per $"
    m = d.margin_pct
    rec, a, x = r.recommendation, d.aggregated, d.disaggregated
    lines = []
    if isinstance(rec, DisaggregatedRecommendation) and isinstance(x, DisaggregatedSummary):
        p, q = rec.prefill, rec.decode
        lines.append(f"  deployment: disaggregated: {p.replicas} prefill x TP{p.tp} (chunk {p.chunk_tokens}, "
                     f"batch cap {p.batch_cap}) + {q.replicas} decode x TP{q.tp} (batch cap {q.batch_cap}), "
                     f"KV over {'NVLink' if rec.link == 'nvlink' else 'the network'}; engine rules {x.engine}")
    if d.kind == "disaggregated" and a and m is None:
        lines.append(f"  search.deployment lists disaggregated only; the best aggregated would be {a.gpus} GPUs, "
                     f"${a.usd_per_hour:.2f}/h, TP{a.config['tp']}")
    elif d.kind == "disaggregated" and a and m is not None and isinstance(x, DisaggregatedSummary):
        by = (f"by {m:.1f}% in {basis}" if abs(m) >= 0.05 else
              f"at the same {basis} with more goodput ({x.goodput_req_s:.2f} against {a.goodput_req_s:.2f} req/s)")
        lines.append(f"  disaggregated beats the best aggregated ({a.gpus} GPUs, ${a.usd_per_hour:.2f}/h, "
                     f"TP{a.config['tp']}) {by}")
    elif d.kind == "aggregated" and isinstance(x, DisaggregatedSummary) and x.gpus and m is not None:
        u = x.unit
        lines.append(f"  aggregated beats the best disaggregated ({x.units} x [{u.prefill.replicas} prefill "
                     f"x TP{u.prefill.tp} + {u.decode.replicas} decode x TP{u.decode.tp}], "
                     f"{x.gpus} GPUs, ${x.usd_per_hour:.2f}/h) by {m:.1f}% in {basis}")
    elif isinstance(x, DisaggregatedMiss) and x.reason:
        lines.append(f"  disaggregated: {x.reason}")
    return lines
