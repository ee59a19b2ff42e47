"""From a finished study to the answer: verify the front-runners with the simulator, pick the
cheapest (or the most goodput per $), and assemble the result object ``kvtune solve`` prints.

Every number in ``predicted`` comes from the simulator: a config's per-replica goodput is the
highest Poisson rate at which the SLO attainment target holds (``costmodel.goodput``); replicas
follow from it, and the pick is then simulated once more at its real per-replica load
(target rate / replicas) for the latency percentiles. Verifications are cached in the study's
user attributes (``verify:<config>``), so the answer can be rebuilt from the storage alone and
every process sharing a storage reaches the same one.

Which configs are verified: the distinct screened-feasible configs at the cheapest screened cost,
up to ``verify_top`` of them in screened order (the screen ranks cost levels well but cannot tell
apart configs within one to a few percent, so several are simulated and the most simulated goodput
wins); then, while none has verified feasible or a cheaper screened level remains, the next levels.
Every verification of a config uses the same request sample (``SolveContext.workload_seed``), so
it gives the same number whichever search proposed it, and the bisection tolerance ``REL_TOL``
is fine enough to compare two configs at 1%.
"""

from __future__ import annotations

import math

import numpy as np

import contextlib

import optuna

from costmodel import __version__

from .launch import launch_settings
from .search import SolveContext, completed_evals, config_key, evaluate, grid_space, open_study, run_search
from .search import _size as size_deployment
from .verify import MAX_SIM_REQUESTS, REL_TOL, sim_config, sim_requests, verify

__all__ = ["solve", "verify", "recommend", "pareto_front", "sim_requests"]

VERIFY_TOP = 6         # distinct configs verified at the cheapest screened cost (and per level after)
MAX_VERIFY = 18        # verifications in all, cheapest levels first
POLISH_STEPS = 10      # neighbours of the pick challenged with the simulator (batch cap, chunk x/÷ 2, 4)
SCREEN_SLACK = 1.15    # the screen may underestimate simulated goodput by this much (seen: up to ~13%)
_PARAM_KEYS = ("tp", "batch_cap", "kv_dtype", "spec_k", "chunk_tokens")


def _verified(ctx: SolveContext, study, ev: dict) -> dict:
    key = "verify:" + config_key(ev["params"])
    got = study.user_attrs.get(key) if study is not None else None
    if got is None:
        got = verify(ctx, ev["params"], int(ev.get("batch") or 1), ev.get("per_replica_goodput_req_s") or None)
        if study is not None:
            study.set_user_attr(key, got)
    return got


def _meets_at(ctx: SolveContext, study, ev: dict, rate_req_s: float) -> dict:
    """One simulation of ``ev``'s config at ``rate_req_s`` per replica (the same requests its
    goodput bisection would use there): does it meet the attainment target?"""
    from costmodel.simulate import simulate

    params = ev["params"]
    key = f"challenge:{config_key(params)}@{rate_req_s:.9g}"
    got = study.user_attrs.get(key) if study is not None else None
    if got is None:
        sm = ctx.step(params["tp"], params["kv_dtype"], params["spec_k"])
        n = sim_requests(ctx.spec.slo.attainment, int(ev.get("batch") or 1))
        seed = ctx.workload_seed
        res = simulate(sm, ctx.spec.requests(n, seed, rate_req_s=rate_req_s), sim_config(ctx, params), "trace", seed=seed)
        got = {"rate_req_s": rate_req_s, "slo_attainment": float(res.slo_attainment),
               "meets": bool(res.slo_attainment >= ctx.spec.slo.attainment)}
        if study is not None:
            study.set_user_attr(key, got)
    return got


def _bar_req_s(ctx: SolveContext, tp: int, best: dict, rival: dict | None) -> float | None:
    """Per-replica goodput a TP-``tp`` config needs to be worth a full verification: enough to
    serve the target on fewer GPUs than ``best`` (the cheapest verified), or, on as many, more
    goodput than ``rival`` (the best verified of its own KV dtype), by more than the bisection
    tolerance (closer is a tie, and the first verified keeps it). None: it cannot fit in fewer
    or as many GPUs at all."""
    rate = ctx.rate_req_s
    bars = []
    r_cheap = (best["gpus"] - 1) // tp
    if r_cheap >= 1:
        bars.append(rate / r_cheap)
    if best["gpus"] % tp == 0:
        bars.append(rate / (best["gpus"] // tp))
        if rival is not None and rival["usd_per_hour"] <= best["usd_per_hour"] + 1e-9:
            bars[-1] = max(bars[-1], rival["goodput_req_s"] * (1 + REL_TOL) / (best["gpus"] // tp))
    return min(bars) if bars else None


def _challenge_or_verify(ctx: SolveContext, study, ev: dict, ok: list[dict]) -> dict:
    """Verify ``ev`` fully, unless a single simulation shows it cannot beat the verified configs:
    it misses the target at the per-replica rate it would need (``_bar_req_s``). Same requests at
    every rate, so that one run answers exactly what its bisection would have found first."""
    if not ok or ctx.spec.objective != "min_cost":
        return _verified(ctx, study, ev)
    best = min(ok, key=lambda v: _rank(ctx, v))
    same = [v for v in ok if v["params"]["kv_dtype"] == ev["params"]["kv_dtype"]]
    rival = min(same, key=lambda v: _rank(ctx, v)) if same else None
    bar = _bar_req_s(ctx, ev["params"]["tp"], best, rival)
    if bar is not None:
        c = _meets_at(ctx, study, ev, bar)
        if c["meets"]:
            return _verified(ctx, study, ev)
        # name the config that set the bar: the cheapest, or its own KV dtype's best at that cost
        tp = ev["params"]["tp"]
        by_rival = (rival is not None and rival is not best and best["gpus"] % tp == 0
                    and bar == rival["goodput_req_s"] * (1 + REL_TOL) / (best["gpus"] // tp))
        beat = rival if by_rival else best
        why = f"attainment {c['slo_attainment']:.3f} at {bar:.3g} req/s per replica: cannot beat {config_key(beat['params'])}"
    else:
        why = f"TP {ev['params']['tp']} cannot fit in the {best['gpus']} GPUs of {config_key(best['params'])}"
    return {"params": dict(ev["params"]), "feasible": False, "dominated": True, "per_replica_goodput_req_s": None,
            "upper_req_s": bar, "simulations": 1 if bar is not None else 0, "reason": why}


def _rank(ctx: SolveContext, v: dict) -> tuple:
    """Verified configs, best first; the config key last so the order never depends on which
    search proposed them or in what order."""
    if ctx.spec.objective == "max_goodput":
        return (-v["per_replica_goodput_req_s"] / v["params"]["tp"], v["usd_per_hour"], config_key(v["params"]))
    return (v["usd_per_hour"], -v["goodput_req_s"], v["params"]["kv_dtype"] != "bf16", v["params"]["tp"],
            config_key(v["params"]))


def _distinct(evals: list[dict]) -> list[dict]:
    seen, out = set(), []
    for e in evals:
        k = config_key(e["params"])
        if k not in seen:
            seen.add(k)
            out.append(e)
    return out


def _screened_order(evals: list[dict]) -> list[dict]:
    """Distinct screened-feasible configs, best screened objective first (ties: config key)."""
    return _distinct(sorted((e for e in evals if e["feasible"]), key=lambda e: (e["value"], config_key(e["params"]))))


def _could_cost(ctx: SolveContext, ev: dict) -> float:
    """The least $/h a screened config could verify at, allowing the screen to be ``SCREEN_SLACK``
    pessimistic about its goodput."""
    if ctx.spec.objective != "min_cost":
        return ev["usd_per_hour"]
    return size_deployment(ctx, ev["params"]["tp"], ev["per_replica_goodput_req_s"] * SCREEN_SLACK, None)["usd_per_hour"]


def _diversified(level: list[dict]) -> list[dict]:
    """A cost level's configs, round-robin over their structure (TP, KV dtype, speculation), each
    structure's best screened first: configs the screen ties on cost can verify very differently
    (it is optimistic where prefill or the TPOT tail binds), and a sampler that dwelt on one TP
    must not fill every verification slot with it."""
    groups: dict[tuple, list[dict]] = {}
    for e in level:
        p = e["params"]
        groups.setdefault((p["tp"], p["kv_dtype"], p["spec_k"]), []).append(e)
    queues = list(groups.values())
    out = []
    for i in range(max(len(q) for q in queues)):
        out += [q[i] for q in queues if i < len(q)]
    return out


def _verify_front(ctx: SolveContext, study, feas: list[dict], verify_top: int) -> list[dict]:
    """Verify the cheapest screened cost level (up to ``verify_top`` configs), then further levels
    while none has verified feasible or a level could still verify cheaper than the best so far."""
    if ctx.spec.objective == "max_goodput":
        return [_verified(ctx, study, e) for e in feas[:verify_top]]
    levels: dict[float, list[dict]] = {}
    for e in feas:
        levels.setdefault(e["usd_per_hour"], []).append(e)
    verified: list[dict] = []
    for usd in sorted(levels):
        ok = [v for v in verified if v["feasible"]]
        if ok and usd >= min(v["usd_per_hour"] for v in ok) - 1e-9:
            break
        for e in _diversified(levels[usd])[:verify_top]:
            if len(verified) >= MAX_VERIFY:
                return verified
            verified.append(_challenge_or_verify(ctx, study, e, [v for v in verified if v["feasible"]]))
    return verified


def pareto_front(items: list[dict]) -> list[dict]:
    """Non-dominated (fewer $/h, more goodput) points, cheapest first."""
    pts = sorted(items, key=lambda d: (d["usd_per_hour"], -d["goodput_req_s"]))
    front, best = [], -math.inf
    for d in pts:
        if d["goodput_req_s"] > best + 1e-12:
            front.append(d)
            best = d["goodput_req_s"]
    return front


def _neighbours(ctx: SolveContext, p: dict) -> list[dict]:
    """The pick's batch cap and chunk budget moved one and two places along the search lattice
    (x2, /2, x4, /4 between the bounds; TP, KV dtype and speculation stay: the front already
    compared those)."""
    space = grid_space(ctx)
    out = []
    for key in ("batch_cap", "chunk_tokens"):
        vals = space[key]
        i = vals.index(p[key]) if p[key] in vals else min(range(len(vals)), key=lambda j: abs(vals[j] - p[key]))
        for d in (1, -1, 2, -2):
            if 0 <= i + d < len(vals) and vals[i + d] != p[key]:
                out.append(dict(p, **{key: vals[i + d]}))
    return out


def _polish(ctx: SolveContext, study, verified: list[dict], keep=lambda v: True) -> None:
    """Local search with the simulator around the verified best (min_cost): configs the screen
    ties on cost differ by a few percent of goodput, which the screen cannot rank. Each neighbour
    is challenged with one simulation at the rate it would need to win (``_challenge_or_verify``)
    and fully verified only if it passes; at most ``POLISH_STEPS`` neighbours. Same for every
    sampler, so the grid's answer is polished the same way. ``keep`` limits which verified configs
    count as the one to polish (the bf16 pick, once fp8 is known to buy no saving)."""
    if ctx.spec.objective != "min_cost":
        return
    seen = {config_key(v["params"]) for v in verified}
    steps = 0
    improved = True
    while improved and steps < POLISH_STEPS:
        improved = False
        ok = [v for v in verified if v["feasible"]]
        mine = [v for v in ok if keep(v)]
        if not mine:
            return
        best = min(mine, key=lambda v: _rank(ctx, v))
        for p in _neighbours(ctx, best["params"]):
            if steps >= POLISH_STEPS:
                break
            if config_key(p) in seen:
                continue
            seen.add(config_key(p))
            ev = evaluate(ctx, p)
            if not ev["feasible"]:
                continue
            steps += 1
            v = _challenge_or_verify(ctx, study, ev, ok)
            v["polish"] = True
            verified.append(v)
            if v["feasible"] and keep(v) and _rank(ctx, v) < _rank(ctx, best):
                improved = True
                break


def recommend(ctx: SolveContext, study, sampler: str, verify_top: int = VERIFY_TOP) -> dict:
    """The result object (``status`` ok or infeasible), built from the study's stored trials.

    Front, then polish, then the KV dtype policy (bf16 unless fp8 saves money). When the front's
    best is fp8 and a bf16 config verifies at its cost, the answer will be bf16 whatever fp8's
    polish finds at that cost, so the bf16 config is polished instead (one polish, not two)."""
    evals = completed_evals(study)
    feas = _screened_order(evals)
    verified, notes = _verify_front(ctx, study, feas, verify_top), []
    both = "fp8" in ctx.spec.search.kv_dtype and "bf16" in ctx.spec.search.kv_dtype
    pick = None
    ok = [v for v in verified if v["feasible"]]
    if both and ok:
        best = min(ok, key=lambda v: _rank(ctx, v))
        if best["params"]["kv_dtype"] == "fp8":
            kept, note = _prefer_bf16(ctx, study, best, feas, ok, verified)
            if kept is not best:
                pick = _polished_bf16(ctx, study, verified, kept["usd_per_hour"])
                notes.append(note)
    if pick is None:
        _polish(ctx, study, verified)
        ok = [v for v in verified if v["feasible"]]
        if not ok:
            return _base(ctx, study, evals, sampler, verified) | _infeasible(ctx, evals, verified)
        pick = min(ok, key=lambda v: _rank(ctx, v))
        if both:
            best = pick
            pick, note = _prefer_bf16(ctx, study, pick, feas, ok, verified)
            notes.append(note)
            if pick is not best:
                pick = _polished_bf16(ctx, study, verified, pick["usd_per_hour"])
        elif list(ctx.spec.search.kv_dtype) == ["bf16"]:
            notes.append("FP8 KV excluded by search.kv_dtype: [bf16]")
    ev = next((e for e in evals if config_key(e["params"]) == config_key(pick["params"])), None) \
        or evaluate(ctx, pick["params"])
    return _base(ctx, study, evals, sampler, verified) | _ok(ctx, pick, ev, evals, verified, notes)


def _polished_bf16(ctx: SolveContext, study, verified: list[dict], usd: float) -> dict:
    """The bf16 config kept at fp8's cost was found as a twin, not searched for: polish it along
    the lattice as the fp8 one would be, and return the best bf16 config at that cost."""
    def bf16_at(v):
        return v["params"]["kv_dtype"] == "bf16" and v["usd_per_hour"] <= usd + 1e-9
    _polish(ctx, study, verified, keep=bf16_at)
    return min((v for v in verified if v["feasible"] and bf16_at(v)), key=lambda v: _rank(ctx, v))


def _prefer_bf16(ctx, study, pick, feas, ok, verified):
    """FP8 KV costs a point or two of quality on hard evals: keep bf16 unless fp8 saves money.
    bf16 candidates: those already verified, the pick's bf16 twin and the best screened bf16
    config, the last two simulated only if the screen says they could match the pick's cost."""
    if pick["params"]["kv_dtype"] != "fp8":
        return pick, "bf16 KV: FP8 KV buys no saving here"
    cands = [v for v in ok if v["params"]["kv_dtype"] == "bf16"]
    extra = [evaluate(ctx, dict(pick["params"], kv_dtype="bf16"))]
    extra += [e for e in feas if e["params"]["kv_dtype"] == "bf16"][:1]
    have = {config_key(v["params"]) for v in verified}
    for e in extra:
        if e["feasible"] and config_key(e["params"]) not in have and _could_cost(ctx, e) <= pick["usd_per_hour"] + 1e-9:
            v = _challenge_or_verify(ctx, study, e, [v for v in verified if v["feasible"]])
            verified.append(v)
            have.add(config_key(e["params"]))
            if v["feasible"]:
                cands.append(v)
    cands.sort(key=lambda v: _rank(ctx, v))
    if cands and cands[0]["usd_per_hour"] <= pick["usd_per_hour"] + 1e-9 and ctx.spec.objective == "min_cost":
        return cands[0], (f"kept bf16 KV: FP8 KV buys no saving (same ${pick['usd_per_hour']:.2f}/h); "
                          f"FP8 KV can cost a point or two of quality on hard evals")
    if cands:
        return pick, (f"FP8 KV saves ${cands[0]['usd_per_hour'] - pick['usd_per_hour']:.2f}/h over the best bf16 "
                      f"config ({config_key(cands[0]['params'])}); check quality on your hardest evals")
    return pick, ("FP8 KV: no bf16 config verified as cheap (the screen rules out the rest); "
                  "check quality on your hardest evals")


def _base(ctx: SolveContext, study, evals, sampler, verified) -> dict:
    return {"kvtune_version": __version__, "seed": ctx.seed, "workload_seed": ctx.workload_seed,
            "sampler": sampler, **_source(ctx),
            "objective": ctx.spec.objective, "study_name": study.study_name,
            "target_rate_req_s": ctx.rate_req_s,
            "trials": {"completed": len(evals), "feasible": sum(1 for e in evals if e["feasible"])},
            "verification": {"configs": len(verified), "simulations": sum(v.get("simulations", 0) for v in verified)}}


def _source(ctx: SolveContext) -> dict:
    """``source`` (one line), ``calibration`` and, with a measured table, ``profile``."""
    if ctx.engine is None:
        return {"source": ctx.eff.source}
    return ctx.engine.record()


def _ok(ctx, pick, ev, evals, verified, notes) -> dict:
    spec, p = ctx.spec, pick["params"]
    out_tok_s = ctx.rate_req_s * ctx.stats.mean_output_tokens if spec.objective == "min_cost" else pick["output_tok_s"]
    usd = pick["usd_per_hour"]
    tpot_mean = pick["tpot_ms"]["mean"]
    model_id = ctx.model.hf_id or ctx.model.name
    sdict = None
    if spec.speculative is not None:
        s = spec.speculative
        sdict = {"method": s.method, "draft_model": s.draft_model}
    pareto_src = {config_key(v["params"]): v for v in verified if v.get("feasible")}
    items = []
    for e in _distinct([e for e in evals if e["feasible"]]):
        v = pareto_src.get(config_key(e["params"]))
        src = v if v is not None else e
        items.append({"gpus": src["gpus"], "usd_per_hour": src["usd_per_hour"], "goodput_req_s": src["goodput_req_s"],
                      "config": dict(e["params"], replicas=src["replicas"]),
                      "evidence": "simulated" if v is not None else "screened (upper bound)"})
    detail = ev.get("detail", {})
    return {
        "status": "ok",
        "recommendation": {**{k: p[k] for k in _PARAM_KEYS}, "replicas": pick["replicas"], "gpus": pick["gpus"],
                           "nodes": pick["nodes"], "gpu": ctx.gpu.name, "model": ctx.model.name},
        "predicted": {"goodput_req_s": pick["goodput_req_s"], "per_replica_goodput_req_s": pick["per_replica_goodput_req_s"],
                      "slo_attainment": pick["slo_attainment"], "ttft_ms": pick["ttft_ms"], "tpot_ms": pick["tpot_ms"],
                      "output_tok_s": pick["output_tok_s"],
                      "tok_s_per_user": 1000.0 / tpot_mean if tpot_mean and tpot_mean > 0 else float("nan"),
                      "load_per_replica_req_s": pick["load_per_replica_req_s"], "evidence": "simulated"},
        "screened": {k: ev.get(k) for k in ("per_replica_goodput_req_s", "batch", "batch_limit", "tpot_ms", "ttft_ms",
                                            "ttft_zero_load_ms", "tpot_batch1_ms")},
        "cost": {"usd_per_hour": usd, "usd_per_gpu_hour": spec.hardware.usd_per_gpu_hour,
                 "usd_per_million_output_tokens": usd / (out_tok_s * 3600) * 1e6 if out_tok_s > 0 else float("inf")},
        "bottleneck": {"term": ev.get("bottleneck"), "batch_limit": ev.get("batch_limit"), "operating_batch": ev.get("batch"),
                       **{k: detail.get(k) for k in ("step_ms", "mem_ms", "compute_ms", "comm_ms", "kv_pool_tokens",
                                                     "kv_pool_used", "prefill_tokens_per_step", "limits")}},
        "headroom": pick["goodput_req_s"] / ctx.rate_req_s - 1,
        "pareto": pareto_front(items),
        "verified": [{"config": v["params"], "feasible": v["feasible"], "usd_per_hour": v.get("usd_per_hour"),
                      "goodput_req_s": v.get("goodput_req_s"), "dominated": bool(v.get("dominated")),
                      "simulations": v.get("simulations", 0), "reason": v.get("reason", "")} for v in verified],
        "launch": launch_settings(model_id, p, pick["replicas"], spec.gpu_mem_util, sdict,
                                  name=f"kvtune-{ctx.model.name}"),
        "notes": notes,
    }


def _infeasible(ctx, evals, verified) -> dict:
    """The best miss: the smallest constraint violation, and why."""
    if verified:
        v = max(verified, key=lambda v: v.get("per_replica_goodput_req_s") or 0.0)
        reason = v.get("reason", "simulated SLO attainment misses the target")
        return {"status": "infeasible", "reason": reason, "closest": {"config": v["params"], "miss": reason,
                                                                      "usd_per_hour": v.get("usd_per_hour")}}
    if not evals:
        return {"status": "infeasible", "reason": "no trials ran", "closest": None}
    slo = ctx.spec.slo

    def badness(e):
        # weights that do not fit, then a KV pool that cannot hold one sequence, then the SLO miss:
        # the share of requests missing, then how far the worse of TTFT and TPOT is over its target
        c = e["constraint"]
        over = max((e.get("ttft_ms") or math.inf) / (slo.ttft_ms or math.inf),
                   (e.get("tpot_ms") or math.inf) / (slo.tpot_ms or math.inf))
        return (c[0] > 0, (e.get("batch") or 0) < 1, c[1], c[2], over if math.isfinite(over) else math.inf, c[0])
    e = min(evals, key=badness)
    return {"status": "infeasible", "reason": e["reason"],
            "closest": {"config": e["params"], "miss": e["reason"], "slo_share": e.get("slo_share"),
                        "ttft_ms": e.get("ttft_ms"), "tpot_ms": e.get("tpot_ms"),
                        "tpot_batch1_ms": e.get("tpot_batch1_ms")}}


def solve(spec, trials: int | None = None, seed: int | None = None, sampler: str = "tpe",
          storage: str | None = None, study_name: str | None = None, verify_top: int = VERIFY_TOP,
          on_trial=None, calibration: str | None = None, engine: str | None = None,
          profile: str | None = None) -> dict:
    """Search, verify and recommend: the whole ``kvtune solve`` for a loaded ``WorkloadSpec``.
    ``seed`` drives the sampler; the simulated request sample follows ``spec.search.seed``.
    ``calibration``/``engine``/``profile`` override the spec's (see ``SolveContext.build``)."""
    with _quiet_optuna():
        ctx = SolveContext.build(spec, seed, calibration, engine, profile)
        study = open_study(ctx, sampler, storage, study_name)
        if trials is None:
            trials = spec.search.trials
            if sampler == "grid":
                trials = math.prod(len(v) for v in grid_space(ctx).values())
        run_search(ctx, study, trials, sampler, on_trial)
        return recommend(ctx, study, sampler, verify_top)


@contextlib.contextmanager
def _quiet_optuna():
    """Optuna logs every trial at INFO; a solve reports progress itself. Restored afterwards."""
    before = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    try:
        yield
    finally:
        optuna.logging.set_verbosity(before)
