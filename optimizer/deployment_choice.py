"""Aggregated or disaggregated, on every GPU type: ``kvtune solve`` searches both kinds of
deployment (``search.deployment``, default both) on each GPU type ``hardware.gpu`` lists, and
recommends the best of all of them under one order (``optimizer.objective``).

GPU type x deployment kind x config is one space raced on equal evidence: ``solve_deployments``
runs, per GPU type (``optimizer.gpu_choice`` when there are several), the aggregated search
(``optimizer.recommend.solve``) and the disaggregated one (``optimizer.disagg.search_disaggregated``:
TP_p, TP_d, x:y, each pool's knobs, each KV dtype), on the same simulator, requests and seed. The
disaggregated search ranks on short runs; its ``DISAGG_VERIFY`` best are then verified as an
aggregated config is (``optimizer.disagg_verify``: the same requests per simulation, tolerance,
draws and robust sizing), so the two kinds' figures, and the margin printed between them, are
re-simulated numbers on equal evidence:

    min_cost      units of (x prefill + y decode) replicas to serve the target rate, $/h robust
                  to the draw; margin: $/h saved
    max_goodput   goodput per $ of units replicated within hardware.max_nodes; margin: goodput
                  per $ gained, both on the workload's own draw (the goodput configs are ranked on)

The result keeps every key of the aggregated one. ``deployment`` says which kind won and by how
much against the best of the other kind (``margin_pct``), with both kinds' picks; when the
disaggregated one wins, ``recommendation`` describes it in the same keys (``tp``/``batch_cap`` of
the decode pool, ``chunk_tokens`` of the prefill pool, ``replicas`` and ``gpus`` of the whole
deployment) plus ``prefill`` and ``decode``, ``predicted`` and ``cost`` are its own, ``launch``
holds its disaggregated launch settings and ``launch_aggregated`` the aggregated pick's.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from kvtune.costmodel.step import StepCost

from .check import disaggregated_command
from .disagg import DEFAULT_ENGINE, DisaggCandidate, PoolChoice, fork_map, search_disaggregated
from .disagg_verify import UnitVerification, robust_unit, unit_rank, verify_unit
from .objective import objective_for
from .result import (AggregatedSummary, Bottleneck, Cost, DeploymentChoice, DisaggregatedMiss,
                     DisaggregatedRecommendation, DisaggregatedSummary, JsonObject, Predicted, SolveResult)
from .search import SolveContext
from .workload import WorkloadSpec
from .launch import LaunchPick, PlannerTargets, build_pick, disaggregated_launch
from .launch.context import request_lengths
import multiprocessing as mp

__all__ = ["combine", "disaggregated_answer", "DisaggregatedAnswer", "deployment_lines", "Beside",
           "may_fork"]

MAX_UNIT_GPUS = 16   # one disaggregated unit spans at most two 8-GPU nodes
DISAGG_VERIFY = 3    # the disaggregated search's best candidates verified on the aggregated kind's evidence
BESIDE_NICE = 10     # the forked disaggregated search yields the cores to the aggregated one (see Beside)
_SUMMARY_KEYS = ("tp", "batch_cap", "kv_dtype", "spec_k", "chunk_tokens", "replicas")


@dataclass(frozen=True)
class DisaggregatedAnswer:
    """The disaggregated search's answer (``disaggregated_answer``): the best deployment or why
    none qualifies, each KV dtype's search, and (found one) its robust verification (``verified``)."""

    pick: DisaggregatedSummary | DisaggregatedMiss
    searches: tuple[JsonObject, ...] = ()      # {"kv_dtype": ..., **DisaggSearch.to_json()} per KV dtype
    verified: UnitVerification | None = None

    @property
    def load_per_unit_req_s(self) -> float:
        return self.verified.load_per_unit_req_s if self.verified is not None else math.nan

    @property
    def at_target(self) -> Mapping[str, Any] | None:
        """The first fresh draw's summary at the per-unit load (a complete verification)."""
        return self.verified.at if self.verified is not None else None


def _agg_summary(r: SolveResult) -> AggregatedSummary | None:
    if r.status != "ok" or r.recommendation is None or r.cost is None or r.predicted is None:
        return None
    rec = r.recommendation.to_json()
    return AggregatedSummary(gpus=rec["gpus"], usd_per_hour=r.cost.usd_per_hour,
                             goodput_req_s=r.predicted.goodput_req_s,
                             per_replica_goodput_req_s=r.predicted.per_replica_goodput_req_s,
                             config={k: rec[k] for k in _SUMMARY_KEYS if k in rec},
                             ranked_goodput_req_s=r.predicted.ranked_goodput_req_s)


def _score(ctx: SolveContext, max_total: int, rate: float, usd: float,
           usd_cap: float = math.inf) -> Callable[[DisaggCandidate], tuple]:
    """The disaggregated search's order of its candidates: each sized as the objective sizes a
    deployment (``Objective.replicas``), then ranked by it; one beyond the node budget, or (min_cost)
    dearer than ``usd_cap``, last."""
    goal = ctx.objective

    def score(c: DisaggCandidate) -> tuple:
        if not c.goodput_req_s > 0:
            return (math.inf, 0.0)
        u = goal.replicas(rate, c.goodput_req_s, c.gpus, max_total)
        if not u or u * c.gpus > max_total or (goal.caps_cost and u * c.gpus * usd > usd_cap * (1 + 1e-12)):
            return (math.inf, 0.0)
        if goal.caps_cost:
            return (u * c.gpus * usd, -c.goodput_req_s)
        return (-(c.goodput_req_s / (c.gpus * usd)), c.gpus)
    return score


def disaggregated_answer(ctx: SolveContext, jobs: int = 1, usd_cap: float = math.inf) -> DisaggregatedAnswer:
    """The best disaggregated deployment in ``ctx`` (or why none). The search's ``DISAGG_VERIFY``
    best candidates are verified on the aggregated kind's evidence (``optimizer.disagg_verify``),
    ranked by the objective, and the best made robust to the draw. ``usd_cap`` (min_cost): only
    deployments at or below it count (another GPU type has one there)."""
    spec = ctx.spec
    if spec.speculative is not None:
        return DisaggregatedAnswer(DisaggregatedMiss(
            status="skipped", reason="speculative decoding is searched for aggregated replicas only"))
    h = spec.hardware
    max_total = h.max_nodes * h.gpus_per_node
    rate = ctx.rate_req_s
    eng = ctx.engine.engine or DEFAULT_ENGINE
    score = _score(ctx, max_total, rate, h.usd_per_gpu_hour, usd_cap)

    def make(r, n, s):
        return spec.requests(n, s, rate_req_s=r)

    def step_for(kv: str) -> Callable[[int], StepCost | Exception]:
        return lambda tp: ctx.step(tp, kv, 0)

    finals: list[tuple[tuple, int, str, DisaggCandidate]] = []
    searches = []
    for i, kv in enumerate(spec.search.kv_dtype):
        d = search_disaggregated(step_for(kv), ctx.engine.sim_config, make,
                                 spec.slo.attainment, tps=spec.search.tp, gpu=ctx.gpu,
                                 gpus_per_node=h.gpus_per_node, max_gpus=min(MAX_UNIT_GPUS, max_total),
                                 engine=eng, seed=ctx.workload_seed, score=score, jobs=jobs)
        searches.append({"kv_dtype": kv, **d.to_json()})
        finals += [(score(c), i, kv, c) for c in d.simulated if c.round == "final" and c.goodput_req_s > 0
                   and math.isfinite(score(c)[0])]
    finals.sort(key=lambda f: (f[0], f[1]))
    top = [(kv, c) for _, _, kv, c in finals[:DISAGG_VERIFY]]
    best = _best_unit(ctx, fork_map(lambda kc: verify_unit(ctx, kc[1], kc[0], eng), top, jobs), usd_cap, jobs)
    if best is None:
        return DisaggregatedAnswer(DisaggregatedMiss(
            status="infeasible", reason="no disaggregated deployment of single-node replicas met the SLOs"
                                        + (" within hardware.max_nodes" if searches else "")), tuple(searches))
    return DisaggregatedAnswer(_summary(ctx, best), tuple(searches), best)


def _best_unit(ctx: SolveContext, nominal: list[UnitVerification], usd_cap: float = math.inf, jobs: int = 1
               ) -> UnitVerification | None:
    """The best of the nominal verifications under the objective, made robust to the draw: in
    nominal rank order, each that could still beat the best (a nominal figure bounds its robust
    one) is made robust (``robust_unit``, its draws on ``jobs`` processes); none dearer than
    ``usd_cap`` (min_cost)."""
    cap = usd_cap if ctx.objective.caps_cost else math.inf

    def ok(u: UnitVerification) -> bool:
        return u.feasible and u.usd_per_hour <= cap * (1 + 1e-12)
    best: UnitVerification | None = None
    for u in sorted((u for u in nominal if ok(u)), key=lambda u: unit_rank(ctx, u)):
        if best is not None and not unit_rank(ctx, u) < unit_rank(ctx, best):
            break
        r = robust_unit(ctx, u, jobs)
        if ok(r) and (best is None or unit_rank(ctx, r) < unit_rank(ctx, best)):
            best = r
    return best


def _summary(ctx: SolveContext, u: UnitVerification) -> DisaggregatedSummary:
    return DisaggregatedSummary(gpus=u.gpus, nodes=u.nodes, usd_per_hour=u.usd_per_hour, goodput_req_s=u.goodput_req_s,
                                units=u.units, unit=u.candidate(), kv_dtype=u.kv_dtype, engine=u.engine,
                                evidence="simulated", ranked_goodput_req_s=u.ranked_goodput_req_s)


def _ranked(x: AggregatedSummary | DisaggregatedSummary) -> float:
    return x.ranked_goodput_req_s if x.ranked_goodput_req_s is not None else x.goodput_req_s


def _margin(spec: WorkloadSpec, win: AggregatedSummary | DisaggregatedSummary,
            lose: AggregatedSummary | DisaggregatedSummary) -> float:
    """How much better the winner is: $/h saved (min_cost) or goodput per $ gained (max_goodput,
    both on the workload's own draw)."""
    return objective_for(spec.objective).margin_pct(win.usd_per_hour, _ranked(win), lose.usd_per_hour, _ranked(lose))


def _better(spec: WorkloadSpec, d: DisaggregatedSummary, a: AggregatedSummary) -> bool:
    kvs, goal = spec.search.kv_dtype, objective_for(spec.objective)
    return (goal.rank(d.usd_per_hour, _ranked(d), d.kv_dtype, kvs)
            < goal.rank(a.usd_per_hour, _ranked(a), str(a.config.get("kv_dtype", "bf16")), kvs))


def _disagg_recommendation(model: str, gpu: str, d: DisaggregatedSummary) -> DisaggregatedRecommendation:
    u, n = d.unit, d.units
    pre = dataclasses.replace(u.prefill, replicas=u.prefill.replicas * n)
    dec = dataclasses.replace(u.decode, replicas=u.decode.replicas * n)
    return DisaggregatedRecommendation(tp=dec.tp, batch_cap=dec.batch_cap, kv_dtype=d.kv_dtype, spec_k=0,
                                       chunk_tokens=pre.chunk_tokens, replicas=pre.replicas + dec.replicas,
                                       gpus=d.gpus, nodes=d.nodes, gpu=gpu, model=model, prefill=pre, decode=dec,
                                       link=u.link, units=n)


def _launch(spec: WorkloadSpec, rec: DisaggregatedRecommendation, ctx: SolveContext,
            per_unit_goodput_req_s: float | None = None) -> dict:
    arch, gpu = ctx.model, ctx.gpu
    n = request_lengths(spec.workload)

    def pick(pool: PoolChoice) -> LaunchPick:
        cfg = {"tp": pool.tp, "batch_cap": pool.batch_cap, "kv_dtype": rec.kv_dtype, "spec_k": 0,
               "chunk_tokens": pool.chunk_tokens}
        return build_pick(arch.hf_id or str(spec.model), cfg, pool.replicas, spec.gpu_mem_util, None, arch=arch,
                          gpu=gpu, weights=spec.weights, activation_reserve_bytes=ctx.eff.activation_reserve_bytes,
                          gpus_per_node=spec.hardware.gpus_per_node,
                          max_request_tokens=None if n is None else n.total_tokens,
                          max_prompt_tokens=None if n is None else n.prompt_tokens, checkpoint=spec.checkpoint)
    targets = PlannerTargets.from_slo(spec.slo, per_unit_goodput_req_s, "one unit (prefill + decode pools)")
    return disaggregated_launch(pick(rec.prefill), pick(rec.decode), f"kvtune-{arch.name}", spec.engine, targets)


def combine(spec: WorkloadSpec, agg: SolveResult, dis: DisaggregatedAnswer | None, ctx: SolveContext,
            over: Mapping[str, Any]) -> SolveResult:
    """One GPU type's answer: the aggregated kind's (``agg``) and, where ``search.deployment`` lists
    it, the disaggregated kind's (``dis``), the best of them for the objective (module docstring);
    ``ctx`` the context both were searched in."""
    kinds = tuple(spec.search.deployment)
    if dis is None:
        return dataclasses.replace(agg, deployment=DeploymentChoice(searched=kinds, kind="aggregated"))
    shown = _agg_summary(agg)
    a = shown if "aggregated" in kinds else None
    x = dis.pick
    block = DeploymentChoice(searched=kinds, kind=None, aggregated=shown, disaggregated=x, search=dis.searches)
    if "aggregated" not in kinds and not isinstance(x, DisaggregatedSummary):
        return _no_disaggregated(agg, block, x, shown)
    if not isinstance(x, DisaggregatedSummary) or (a is not None and not _better(spec, x, a)):
        d_ok = isinstance(x, DisaggregatedSummary)
        return dataclasses.replace(agg, deployment=dataclasses.replace(
            block, kind="aggregated" if agg.status == "ok" else None,
            margin_pct=_margin(spec, a, x) if (a is not None and isinstance(x, DisaggregatedSummary)) else None,
            against="disaggregated" if d_ok else None))
    assert dis.verified is not None and dis.at_target is not None   # completed above
    return _disaggregated_result(spec, agg, ctx, dis, x, a, block, over)


def may_fork() -> bool:
    """A forked process may start others (a pool's daemonic workers may not)."""
    return not mp.current_process().daemon


class Beside:
    """``fn()`` on a forked process, ``BESIDE_NICE`` lower in priority (it only changes who waits
    for whom: the value is the same), while this one goes on; ``result()`` waits for its value (None
    if the process failed or its value could not come back: the caller then runs ``fn`` itself, so
    an error is raised where it would have been), ``cancel()`` ends it."""

    def __init__(self, fn: Callable[[], Any]):
        mpc = mp.get_context("fork")
        self._recv, send = mpc.Pipe(duplex=False)

        def target() -> None:
            try:
                os.nice(BESIDE_NICE)
            except OSError:
                pass
            try:
                out = fn()
            except BaseException:
                out = None
            try:
                send.send(out)
            except Exception:
                send.send(None)
            finally:
                send.close()
        self._proc = mpc.Process(target=target, daemon=False)
        self._proc.start()
        send.close()

    def result(self) -> Any:
        try:
            return self._recv.recv()
        except (EOFError, OSError):
            return None
        finally:
            self._recv.close()
            self._proc.join()

    def cancel(self) -> None:
        if self._proc.is_alive():
            self._proc.terminate()
        self._proc.join()
        self._recv.close()


def _disaggregated_result(spec: WorkloadSpec, agg: SolveResult, ctx: SolveContext, dis: DisaggregatedAnswer,
                          x: DisaggregatedSummary, a: AggregatedSummary | None, block: DeploymentChoice,
                          over: Mapping[str, Any]) -> SolveResult:
    """The answer when the disaggregated deployment wins: its pools, its simulated figures (the
    first fresh draw at the per-unit load), cost, launch settings and the check command."""
    u = dis.verified
    assert u is not None and u.at is not None and u.draws is not None
    rec = _disagg_recommendation(ctx.model.name, ctx.gpu.name, x)
    at = u.at
    tpot_mean = at["tpot_ms"].get("mean", float("nan"))
    rate = agg.target_rate_req_s
    out_tok_s = ctx.objective.priced_rate_req_s(rate, x.goodput_req_s) * ctx.stats.mean_output_tokens
    usd = spec.hardware.usd_per_gpu_hour
    check = disaggregated_command(spec, u.cand.prefill, u.cand.decode, u.kv_dtype, u.cand.link, u.units, u.engine,
                                  u.fleet_rate_req_s, u.n_requests, u.draws.seeds[0], ctx.gpu.name, over)
    return dataclasses.replace(
        agg, status="ok", reason=None, closest=None, recommendation=rec,
        predicted=Predicted(goodput_req_s=x.goodput_req_s, per_replica_goodput_req_s=u.per_unit_goodput_req_s,
                            slo_attainment=at["slo_attainment"], ttft_ms=at["ttft_ms"], tpot_ms=at["tpot_ms"],
                            output_tok_s=at["output_tok_s"] * x.units,
                            tok_s_per_user=1000.0 / tpot_mean if tpot_mean and tpot_mean > 0 else float("nan"),
                            load_per_replica_req_s=u.load_per_unit_req_s, evidence="simulated",
                            per_replica_is="one unit of the disaggregated deployment (prefill + decode pools)",
                            draws=u.draws.to_json(), check=check, ranked_goodput_req_s=u.ranked_goodput_req_s),
        cost=Cost(usd_per_hour=x.usd_per_hour, usd_per_gpu_hour=usd,
                  usd_per_million_output_tokens=x.gpus * usd / (out_tok_s * 3600) * 1e6 if out_tok_s > 0 else math.inf,
                  priced_at=ctx.objective.priced_at),
        headroom=x.goodput_req_s / rate - 1 if rate and rate > 0 else float("nan"),
        bottleneck=Bottleneck(term="disaggregated", batch_limit=None, operating_batch=None),
        launch_aggregated=agg.launch, launch=_launch(spec, rec, ctx, u.per_unit_goodput_req_s),
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
