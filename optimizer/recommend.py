"""From the search to the answer: the simulator race (``optimizer.simsearch``) decides, and this
module assembles the result object ``kvtune solve`` prints.

Every number in ``predicted`` comes from the simulator: a config's per-replica goodput is the
highest Poisson rate at which the SLO attainment target holds (``costmodel.goodput``, through
``optimizer.verify``); replicas follow from it, and the pick is then simulated once more at its
real per-replica load (target rate / replicas) for the latency percentiles. The optuna study holds
the screen's trials (the analytic prior, browsable in optuna-dashboard); up to
``search.exhaustive_max_configs`` configs the race covers the whole lattice and which config is
recommended does not depend on them; above it, the race covers the configs they sampled.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import optuna

from kvtune import __version__

from .launch import PlannerTargets, launch_settings
from .layouts import gpus_per_replica, layout_params
from .result import (Bottleneck, Closest, Cost, ParetoPoint, Predicted, ProfileUse, RaceRow, Recommendation, Screened,
                     SolveResult, StepTerms, TrialCounts, VerificationCounts, VerifiedRow)
from .search import (UNLAUNCHABLE, Evaluation, SolveContext, completed_evals, config_key, evaluate, make_storage, open_study, quiet_optuna, run_search)
from .scaleout import StudyRunner
from .simsearch import LocalRunner, Race, exhaustive, lattice_size, race, ranked_goodput
from .check import aggregated_command
from .verify import Verification, sim_requests, verify
from .launch.context import request_lengths

__all__ = ["solve", "solve_in", "verify", "recommend", "pareto_front", "sim_requests", "VERIFY_TOP", "SolveResult"]

VERIFY_TOP = 4         # max_goodput: configs fully verified before the race (--verify-top)
_PARAM_KEYS = ("tp", "batch_cap", "kv_dtype", "spec_k", "chunk_tokens")
_STEP_TERMS = ("step_ms", "mem_ms", "compute_ms", "comm_ms", "kv_pool_tokens", "kv_pool_used",
               "prefill_tokens_per_step", "limits")   # the screen's detail the bottleneck shows


def pareto_front(items: list[ParetoPoint]) -> list[ParetoPoint]:
    """Non-dominated (fewer $/h, more goodput) points, cheapest first."""
    pts = sorted(items, key=lambda d: (d.usd_per_hour, -d.goodput_req_s))
    front, best = [], -math.inf
    for d in pts:
        if d.goodput_req_s > best + 1e-12:
            front.append(d)
            best = d.goodput_req_s
    return front


def recommend(ctx: SolveContext, study: optuna.Study, sampler: str, verify_top: int = VERIFY_TOP,
              runner: LocalRunner | StudyRunner | None = None,
              on_stage: Callable[[str, int], None] | None = None, overrides: dict | None = None,
              usd_cap: float = math.inf) -> SolveResult:
    """The result (``status`` ok or infeasible): the race's best robust verification. ``on_stage(name,
    n)`` hears each stage of the race as it starts (a progress display). ``overrides``: the
    ``calibration``/``engine``/``profile`` the solve was given (the printed ``kvtune simulate``
    command repeats them). ``usd_cap``: only deployments at or below it count (``optimizer.simsearch.race``)."""
    evals = completed_evals(study)
    own = runner is None
    runner = runner or LocalRunner(ctx)
    # a lattice too large to exhaust: the race covers the configs the study's sampler proposed
    pool = None if exhaustive(ctx) else frozenset(e.params.key for e in evals)
    try:
        r = race(ctx, runner, on_stage=on_stage, seeds=verify_top, usd_cap=usd_cap, pool=pool)
    finally:
        if own:
            runner.close()
    pick = r.best
    if pick is None:
        return _infeasible(ctx, study, evals, sampler, r, usd_cap)
    return _ok(ctx, study, evals, sampler, r, pick, evaluate(ctx, pick.params), _dtype_notes(ctx, pick, r), overrides)


def _dtype_notes(ctx: SolveContext, pick: Verification, r: Race) -> list[str]:
    kv = list(ctx.spec.search.kv_dtype)
    if kv == ["bf16"]:
        return ["FP8 KV excluded by search.kv_dtype: [bf16]"]
    if "bf16" not in kv:
        return []
    if pick.params["kv_dtype"] == "bf16":
        # the preference is stated where it cost goodput: an fp8 config verified at the same $/h with more
        more = [v for v in r.verified if v.feasible and v.params["kv_dtype"] != "bf16"
                and v.usd_per_hour == pick.usd_per_hour and (v.goodput_req_s or 0.0) > (pick.goodput_req_s or 0.0)]
        if more and ctx.objective.bf16_tie_break:
            v = max(more, key=lambda v: v.goodput_req_s or 0.0)
            return [f"bf16 KV preferred at equal $/h: {config_key(v.params)} (fp8 KV) costs the same "
                    f"${v.usd_per_hour:.2f}/h with {v.goodput_req_s:.2f} req/s goodput against "
                    f"{pick.goodput_req_s:.2f} (simulated); fp8 KV is never chosen unless cheaper"]
        return ["bf16 KV: FP8 KV buys no saving here (every fp8 config was raced for a cheaper deployment)"]
    return [f"FP8 KV: no bf16 config meets the target at ${pick.usd_per_hour:.2f}/h (simulated); "
            "check quality on your hardest evals"]


def _base(ctx: SolveContext, study: optuna.Study, evals: list[Evaluation], sampler: str, r: Race) -> dict[str, Any]:
    """The fields every result has: provenance, the screen's trials and the race's evidence."""
    rec = ctx.engine.record()   # source, calibration, admission and (with a table) profile
    return {"kvtune_version": __version__, "seed": ctx.seed, "workload_seed": ctx.workload_seed,
            "sampler": sampler, "source": rec["source"], "calibration": rec.get("calibration"),
            "admission": rec.get("admission"),
            "profile": ProfileUse.from_json(rec["profile"]) if "profile" in rec else None,
            "objective": ctx.spec.objective, "study_name": study.study_name,
            "target_rate_req_s": ctx.rate_req_s,
            "trials": TrialCounts(completed=len(evals), feasible=sum(1 for e in evals if e.feasible)),
            "verification": VerificationCounts(configs=len(r.verified), simulations=r.simulations,
                                               work_items=r.work_items, outcomes=r.counts(),
                                               lattice_configs=lattice_size(ctx),
                                               raced=len(r.outcomes) + len(r.no_fit),
                                               searched="exhaustive" if exhaustive(ctx) else "sampled"),
            "verified": tuple(_verified_row(v) for v in r.verified),
            "race": tuple(RaceRow(config=o.config, status=o.status, reason=o.reason, simulations=o.simulations,
                                  rungs=tuple(g.to_json() for g in o.rungs)) for o in r.outcomes),
            "engine": ctx.engine.engine}   # the engine whose launch line is printed (None: vLLM's)


def _ok(ctx: SolveContext, study: optuna.Study, evals: list[Evaluation], sampler: str, r: Race,
        pick: Verification, ev: Evaluation, notes: list[str], overrides: dict | None = None) -> SolveResult:
    spec, p = ctx.spec, pick.params
    # feasible, so sized and simulated at its load: every figure is there
    assert pick.usd_per_hour is not None and pick.goodput_req_s is not None and pick.replicas is not None \
        and pick.gpus is not None and pick.nodes is not None and pick.slo_attainment is not None \
        and pick.output_tok_s is not None and pick.load_per_replica_req_s is not None \
        and pick.output_tok_s_at_goodput is not None
    # min_cost is priced at the target rate it serves; max_goodput at its goodput
    out_tok_s = ctx.rate_req_s * ctx.stats.mean_output_tokens if not ctx.objective.fixed_fleet \
        else pick.output_tok_s_at_goodput
    usd = pick.usd_per_hour
    tpot_mean = pick.tpot_ms["mean"]
    sdict = None
    if spec.speculative is not None:
        s = spec.speculative
        sdict = {"method": s.method, "draft_model": s.draft_model}
    items = [ParetoPoint(gpus=v.gpus, usd_per_hour=v.usd_per_hour, goodput_req_s=v.goodput_req_s,
                         config=dict(v.params, replicas=v.replicas), evidence="simulated")
             for v in r.verified if v.feasible and v.gpus is not None and v.usd_per_hour is not None
             and v.goodput_req_s is not None]
    detail = ev.detail
    layout = layout_params(p, spec.hardware.gpus_per_node)
    headroom = pick.goodput_req_s / ctx.rate_req_s - 1 if ctx.rate_req_s > 0 else float("nan")
    return SolveResult(
        **_base(ctx, study, evals, sampler, r),
        status="ok",
        recommendation=Recommendation(**{k: p[k] for k in _PARAM_KEYS}, **layout, layout=p.get("layout") or None,
                                      replicas=pick.replicas, gpus=pick.gpus, nodes=pick.nodes, gpu=ctx.gpu.name,
                                      model=ctx.model.name,
                                      knobs={a.name: p[a.name] for a in ctx.knob_axes} or None),
        predicted=Predicted(goodput_req_s=pick.goodput_req_s,
                            per_replica_goodput_req_s=pick.per_replica_goodput_req_s,
                            slo_attainment=pick.slo_attainment, ttft_ms=pick.ttft_ms, tpot_ms=pick.tpot_ms,
                            output_tok_s=pick.output_tok_s,
                            tok_s_per_user=1000.0 / tpot_mean if tpot_mean and tpot_mean > 0 else float("nan"),
                            load_per_replica_req_s=pick.load_per_replica_req_s, evidence="simulated",
                            draws=pick.draws.to_json() if pick.draws is not None else None,
                            check=aggregated_command(spec, {**p, **layout}, pick, ctx.gpu.name, overrides),
                            ranked_goodput_req_s=ranked_goodput(pick)),
        screened=Screened.from_json(ev.screened()),
        cost=Cost(usd_per_hour=usd, usd_per_gpu_hour=spec.hardware.usd_per_gpu_hour,
                  usd_per_million_output_tokens=usd / (out_tok_s * 3600) * 1e6 if out_tok_s > 0 else float("inf"),
                  priced_at=ctx.objective.priced_at),
        bottleneck=Bottleneck(term=ev.bottleneck, batch_limit=ev.batch_limit, operating_batch=ev.batch,
                              step=StepTerms(**{k: detail.get(k) for k in _STEP_TERMS})),
        headroom=headroom,
        pareto=tuple(pareto_front(items)),
        launch=launch_settings(ctx.model.hf_id or spec.model, {**p, **layout},
                               pick.replicas, spec.gpu_mem_util, sdict,
                               name=f"kvtune-{ctx.model.name}", arch=ctx.model, gpu=ctx.gpu,
                               weights=spec.weights, activation_reserve_bytes=ctx.eff.activation_reserve_bytes,
                               gpus_per_node=spec.hardware.gpus_per_node, engine=spec.engine,
                               targets=PlannerTargets.from_slo(spec.slo, pick.per_replica_goodput_req_s),
                               checkpoint=spec.checkpoint, **_lengths(spec)),
        notes=tuple(notes),
    )


def _lengths(spec) -> dict:
    """The workload's longest prompt and request, which size each engine's context (launch/context.py)."""
    n = request_lengths(spec.workload)
    return {} if n is None else {"max_request_tokens": n.total_tokens, "max_prompt_tokens": n.prompt_tokens}


def _verified_row(v: Verification) -> VerifiedRow:
    return VerifiedRow(config=v.params.config, feasible=v.feasible, usd_per_hour=v.usd_per_hour,
                       goodput_req_s=v.goodput_req_s, per_replica_goodput_req_s=v.per_replica_goodput_req_s,
                       simulations=v.simulations, reason=v.reason)


def _infeasible(ctx: SolveContext, study: optuna.Study, evals: list[Evaluation], sampler: str, r: Race,
                usd_cap: float = math.inf) -> SolveResult:
    """No answer: ``infeasible`` with the reason and the closest miss, or, searched only up to
    ``usd_cap`` (another GPU type has a deployment there) with configs that meet the SLOs at some
    load, ``dearer``: nothing at or below that price (the search went no further)."""
    alive = any(o.status not in ("zero_load", "never_fits") for o in r.outcomes)
    if math.isfinite(usd_cap) and alive:
        return SolveResult(**_base(ctx, study, evals, sampler, r), status="dearer", reason=(
            f"no deployment at or below ${usd_cap:.2f}/h meets the SLOs (a cheaper GPU type was found first; "
            f"searched no further)"))
    reason, closest = _why_infeasible(ctx, r)
    return SolveResult(**_base(ctx, study, evals, sampler, r), status="infeasible", reason=reason, closest=closest)


def _why_infeasible(ctx: SolveContext, r: Race) -> tuple[str, Closest | None]:
    """Why nothing qualifies, from the simulator: every config misses even at zero load (the
    closest group's miss), or none serves the target within the node budget (the closest)."""
    spec = ctx.spec
    alive = [o for o in r.outcomes if o.status not in ("zero_load", "never_fits")]
    if not r.outcomes:
        why = r.no_fit[0][1] if r.no_fit else "the search space is empty"
        if UNLAUNCHABLE in ctx.memo:   # the layouts that would hold it are ones the engine cannot launch
            why += f"; {ctx.memo[UNLAUNCHABLE]}"
        return (f"no configuration of the search space fits in GPU memory: {why}",
                Closest(config=None, miss=why) if r.no_fit else None)
    if not alive and not r.zero_load:
        o = r.outcomes[-1]
        return f"in every configuration that fits in memory, {o.reason}", Closest(config=o.config, miss=o.reason)
    if not alive:
        pr = max(r.zero_load, key=lambda p: (p.attainment, p.config))
        o = next(o for o in r.outcomes if config_key(o.config) == pr.config)
        reason = (f"{pr.reason}, even at zero load (one request at a time, so TTFT is the prefill alone), "
                  f"in every configuration (simulated); the closest, {pr.config}, meets the SLOs for "
                  f"{pr.attainment:.1%} of requests < {spec.slo.attainment:g}")
        return reason, Closest(config=o.config, miss=pr.reason, attainment=pr.attainment)
    priced = [v for v in r.verified if v.gpus is not None and v.per_replica_goodput_req_s > 0]
    if priced:
        # the nearest miss by distance to the target: the fewest GPUs to serve the rate (then the
        # most goodput per GPU); its reason says what it serves and how many nodes that takes
        v = min(priced, key=lambda v: (v.gpus, -v.per_replica_goodput_req_s / gpus_per_replica(v.params),
                                       config_key(v.params)))
        h = spec.hardware
        reason = (f"no configuration serves {ctx.rate_req_s:g} req/s within hardware.max_nodes {h.max_nodes} "
                  f"({ctx.max_gpus} GPUs), simulated; the closest: {v.reason or 'simulated SLO attainment misses the target'}"
                  if not ctx.objective.fixed_fleet else v.reason or "simulated SLO attainment misses the target")
        return reason, Closest(config=v.params.config, miss=v.reason or reason, usd_per_hour=v.usd_per_hour, priced=True)
    if r.verified:
        v = max(r.verified, key=lambda v: (v.per_replica_goodput_req_s or 0.0, config_key(v.params)))
        reason = v.reason or "simulated SLO attainment misses the target"
        return reason, Closest(config=v.params.config, miss=reason, usd_per_hour=v.usd_per_hour, priced=True)
    o = alive[0]
    h = spec.hardware
    return (f"no configuration serves {ctx.rate_req_s:g} req/s within hardware.max_nodes {h.max_nodes} "
            f"({ctx.max_gpus} GPUs), simulated; e.g. {config_key(o.config)}: {o.reason}",
            Closest(config=o.config, miss=o.reason))


def solve(spec, trials: int | None = None, seed: int | None = None, sampler: str = "tpe",
          storage: str | None = None, study_name: str | None = None, verify_top: int = VERIFY_TOP,
          on_trial: Callable[[int, int], None] | None = None, calibration: str | None = None,
          engine: str | None = None, profile: str | None = None, jobs: int = 1,
          on_stage: Callable[[str, int], None] | None = None, usd_cap: float = math.inf) -> SolveResult:
    """The aggregated kind alone on ``spec``'s one GPU type (``optimizer.solve.solve`` searches
    every kind and type): its context built here, then ``solve_in``. ``seed`` drives the sampler;
    the simulated request sample follows ``spec.search.seed``. ``calibration``/``engine``/``profile``
    override the spec's (see ``SolveContext.build``)."""
    ctx = SolveContext.build(spec, seed, calibration, engine, profile)
    return solve_in(ctx, trials, sampler, storage, study_name, verify_top, on_trial, jobs, on_stage, usd_cap,
                    {"calibration": calibration, "engine": engine, "profile": profile})


def solve_in(ctx: SolveContext, trials: int | None = None, sampler: str = "tpe", storage: str | None = None,
             study_name: str | None = None, verify_top: int = VERIFY_TOP,
             on_trial: Callable[[int, int], None] | None = None, jobs: int = 1,
             on_stage: Callable[[str, int], None] | None = None, usd_cap: float = math.inf,
             overrides: dict | None = None) -> SolveResult:
    """Search, verify and recommend the aggregated kind in ``ctx``: the screen's study, then the
    race (``recommend``). ``on_trial(done, total)`` hears the screen's trials, ``on_stage(name, n)``
    the race's stages; ``overrides``: the calibration/engine/profile the solve was given (the
    printed ``kvtune simulate`` command repeats them)."""
    with quiet_optuna():
        study = open_study(ctx, sampler, storage, study_name)
        if trials is None:
            trials = ctx.spec.search.trials
            if sampler == "grid":
                trials = lattice_size(ctx)
        run_search(ctx, study, trials, sampler, on_trial)
        runner: LocalRunner | StudyRunner
        if storage:   # the race's simulations shared with every process on this storage
            runner = StudyRunner(ctx, make_storage(storage), study.study_name)
        else:
            runner = LocalRunner(ctx, jobs)
        with runner:
            return recommend(ctx, study, sampler, verify_top, runner, on_stage, overrides, usd_cap)
