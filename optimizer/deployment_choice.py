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

import math

from .disagg import DEFAULT_ENGINE, search_disaggregated

__all__ = ["solve_deployments"]

MAX_UNIT_GPUS = 16   # one disaggregated unit spans at most two 8-GPU nodes


def _agg_summary(r: dict) -> dict | None:
    if r.get("status") != "ok":
        return None
    rec = r["recommendation"]
    return {"gpus": rec["gpus"], "usd_per_hour": r["cost"]["usd_per_hour"],
            "goodput_req_s": r["predicted"]["goodput_req_s"],
            "per_replica_goodput_req_s": r["predicted"].get("per_replica_goodput_req_s"),
            "config": {k: rec[k] for k in ("tp", "batch_cap", "kv_dtype", "spec_k", "chunk_tokens", "replicas")
                       if k in rec}}


def _units(spec, c, max_total: int, rate: float) -> int:
    if spec.objective == "min_cost":
        return max(1, math.ceil(rate / c.goodput_req_s)) if c.goodput_req_s > 0 else 0
    return max(1, max_total // c.gpus)


def _score(spec, max_total: int, rate: float, usd: float):
    def score(c) -> tuple:
        if not c.goodput_req_s > 0:
            return (math.inf, 0.0)
        u = _units(spec, c, max_total, rate)
        if u * c.gpus > max_total:
            return (math.inf, 0.0)
        if spec.objective == "min_cost":
            return (u * c.gpus * usd, -c.goodput_req_s)
        return (-(c.goodput_req_s / (c.gpus * usd)), c.gpus)
    return score


def disaggregated_answer(spec, seed=None, calibration=None, engine=None, profile=None) -> tuple[dict, object]:
    """The best disaggregated deployment for ``spec`` (its own record: status ok or a reason), and
    the solve context it was searched in (None where skipped)."""
    from kvtune.costmodel.deployment import Pool, kv_link, simulate_disaggregated

    from .search import SolveContext

    if spec.speculative is not None:
        return {"status": "skipped", "reason": "speculative decoding is searched for aggregated replicas only"}, None
    ctx = SolveContext.build(spec, seed, calibration, engine, profile)
    h = spec.hardware
    max_total = h.max_nodes * h.gpus_per_node
    rate = ctx.rate_req_s
    usd = h.usd_per_gpu_hour
    eng = ctx.engine.engine or DEFAULT_ENGINE
    score = _score(spec, max_total, rate, usd)

    def make(r, n, s):
        return spec.requests(n, s, rate_req_s=r)

    best, best_kv, searches = None, None, []
    for kv in spec.search.kv_dtype:
        d = search_disaggregated(lambda tp, kv=kv: ctx.step(tp, kv, 0), ctx.engine.sim_config, make,
                                 spec.slo.attainment, tps=spec.search.tp, gpu=ctx.gpu,
                                 gpus_per_node=h.gpus_per_node, max_gpus=min(MAX_UNIT_GPUS, max_total),
                                 engine=eng, seed=ctx.workload_seed, score=score)
        searches.append({"kv_dtype": kv, **d.to_json()})
        if d.best is not None and (best is None or score(d.best) < score(best)):
            best, best_kv = d.best, kv
    if best is None:
        return {"status": "infeasible", "engine": eng, "searches": searches,
                "reason": "no disaggregated deployment of single-node replicas met the SLOs"
                          + (" within hardware.max_nodes" if searches else "")}, ctx
    units = _units(spec, best, max_total, rate)
    # the deployment at the target load: each unit carries rate / units (max_goodput: its goodput)
    load = rate / units if spec.objective == "min_cost" else best.goodput_req_s
    pp = Pool(ctx.step(best.prefill.tp, best_kv, 0), ctx.engine.sim_config(best.prefill.batch_cap,
                                                                          best.prefill.chunk_tokens), best.prefill.replicas)
    dp = Pool(ctx.step(best.decode.tp, best_kv, 0), ctx.engine.sim_config(best.decode.batch_cap,
                                                                         best.decode.chunk_tokens), best.decode.replicas)
    req = make(load, 400, ctx.workload_seed)
    at = simulate_disaggregated(pp, dp, req, kv_link(ctx.gpu, best.link == "nvlink"), "trace", ctx.workload_seed,
                                engine=eng).result.summary()
    gpus = units * best.gpus
    goodput = units * best.goodput_req_s
    out_tok_s = (rate if spec.objective == "min_cost" else goodput) * ctx.stats.mean_output_tokens
    return {"status": "ok", "engine": eng, "kv_dtype": best_kv, "units": units, "unit": best.to_json(),
            "gpus": gpus, "nodes": math.ceil(gpus / h.gpus_per_node), "usd_per_hour": gpus * usd,
            "goodput_req_s": goodput, "load_per_unit_req_s": load, "at_target": at,
            "usd_per_million_output_tokens": gpus * usd / (out_tok_s * 3600) * 1e6 if out_tok_s > 0 else math.inf,
            "searches": searches, "evidence": "simulated"}, ctx


def _margin(spec, win: dict, lose: dict) -> float:
    """How much better the winner is: $/h saved (min_cost) or goodput per $ gained (max_goodput)."""
    if spec.objective == "min_cost":
        return 100.0 * (lose["usd_per_hour"] / win["usd_per_hour"] - 1.0)
    return 100.0 * ((win["goodput_req_s"] / win["usd_per_hour"]) / (lose["goodput_req_s"] / lose["usd_per_hour"]) - 1.0)


def _better(spec, d: dict, a: dict) -> bool:
    return spec.objective_key(d["usd_per_hour"], d["goodput_req_s"]) < \
        spec.objective_key(a["usd_per_hour"], a["goodput_req_s"])


def _disagg_recommendation(spec, ctx_model: str, gpu: str, d: dict, kinds) -> dict:
    u, n = d["unit"], d["units"]
    pre = {**u["prefill"], "replicas": u["prefill"]["replicas"] * n}
    dec = {**u["decode"], "replicas": u["decode"]["replicas"] * n}
    pre["gpus"], dec["gpus"] = pre["tp"] * pre["replicas"], dec["tp"] * dec["replicas"]
    return {"deployment": "disaggregated", "tp": dec["tp"], "batch_cap": dec["batch_cap"],
            "kv_dtype": d["kv_dtype"], "spec_k": 0, "chunk_tokens": pre["chunk_tokens"],
            "replicas": pre["replicas"] + dec["replicas"], "gpus": d["gpus"], "nodes": d["nodes"],
            "gpu": gpu, "model": ctx_model, "prefill": pre, "decode": dec, "link": u["link"], "units": n}


def _launch(spec, rec: dict, ctx) -> dict:
    from .launch import build_pick, disaggregated_launch
    arch, gpu = ctx.model, ctx.gpu

    def pick(pool):
        cfg = {"tp": pool["tp"], "batch_cap": pool["batch_cap"], "kv_dtype": rec["kv_dtype"], "spec_k": 0,
               "chunk_tokens": pool["chunk_tokens"]}
        return build_pick(arch.hf_id or str(spec.model), cfg, pool["replicas"], spec.gpu_mem_util, None, arch=arch,
                          gpu=gpu, weights=spec.weights, activation_reserve_bytes=ctx.eff.activation_reserve_bytes,
                          gpus_per_node=spec.hardware.gpus_per_node)
    return disaggregated_launch(pick(rec["prefill"]), pick(rec["decode"]), f"kvtune-{arch.name}", spec.engine)


def _on_winning_gpu(spec, agg: dict):
    """With several GPU types (``optimizer.gpu_choice``), the disaggregated race runs on the type
    the aggregated answer chose (the first type where none met the SLOs), at that type's price."""
    import dataclasses

    h = spec.hardware
    if not h.choices:
        return spec
    prices = dict(h.choices)
    gpu = (agg.get("recommendation") or {}).get("gpu") if agg.get("status") == "ok" else None
    gpu = gpu if gpu in prices else h.choices[0][0]
    return dataclasses.replace(spec, hardware=dataclasses.replace(h, gpu=gpu, usd_per_gpu_hour=prices[gpu], choices=()))


def solve_deployments(spec, solve_one=None, **kwargs) -> dict:
    """``solve_one(spec, **kwargs)`` (aggregated) and, when ``spec.search.deployment`` lists it, the
    disaggregated search; the result of the better kind for the objective (module docstring)."""
    if solve_one is None:
        from .recommend import solve as solve_one
    kinds = tuple(spec.search.deployment)
    agg = solve_one(spec, **kwargs)
    if "disaggregated" not in kinds:
        return agg | {"deployment": {"kind": "aggregated", "searched": list(kinds)}}
    dspec = _on_winning_gpu(spec, agg)
    dis, ctx = disaggregated_answer(dspec, kwargs.get("seed"), kwargs.get("calibration"), kwargs.get("engine"),
                                    kwargs.get("profile"))
    a = _agg_summary(agg) if "aggregated" in kinds else None
    block = {"searched": list(kinds), "aggregated": _agg_summary(agg),
             "disaggregated": ({k: dis[k] for k in ("gpus", "nodes", "usd_per_hour", "goodput_req_s", "units", "unit",
                                                   "kv_dtype", "engine", "evidence")}
                               if dis["status"] == "ok" else {"status": dis["status"], "reason": dis["reason"]}),
             "search": dis.get("searches", [])}
    d_ok = dis["status"] == "ok"
    if not d_ok or (a is not None and not _better(spec, dis, a)):
        kind = "aggregated" if agg.get("status") == "ok" else None
        margin = _margin(spec, a, dis) if (a is not None and d_ok) else None
        return agg | {"deployment": block | {"kind": kind, "margin_pct": margin,
                                             "against": "disaggregated" if d_ok else None}}
    spec = dspec
    rec = _disagg_recommendation(spec, ctx.model.name, ctx.gpu.name, dis, kinds)
    at = dis["at_target"]
    tpot_mean = at["tpot_ms"].get("mean", float("nan"))
    out = dict(agg)
    out["status"] = "ok"
    out.pop("reason", None)
    out.pop("closest", None)
    out["recommendation"] = rec
    out["predicted"] = {"goodput_req_s": dis["goodput_req_s"], "per_replica_goodput_req_s": dis["unit"]["goodput_req_s"],
                        "slo_attainment": at["slo_attainment"], "ttft_ms": at["ttft_ms"], "tpot_ms": at["tpot_ms"],
                        "output_tok_s": at["output_tok_s"] * dis["units"],
                        "tok_s_per_user": 1000.0 / tpot_mean if tpot_mean and tpot_mean > 0 else float("nan"),
                        "load_per_replica_req_s": dis["load_per_unit_req_s"], "evidence": "simulated",
                        "per_replica_is": "one unit of the disaggregated deployment (prefill + decode pools)"}
    out["cost"] = {"usd_per_hour": dis["usd_per_hour"], "usd_per_gpu_hour": spec.hardware.usd_per_gpu_hour,
                   "usd_per_million_output_tokens": dis["usd_per_million_output_tokens"],
                   "priced_at": "target rate" if spec.objective == "min_cost" else "goodput"}
    rate = agg.get("target_rate_req_s")
    out["headroom"] = dis["goodput_req_s"] / rate - 1 if rate and rate > 0 else float("nan")
    out["bottleneck"] = {"term": "disaggregated", "batch_limit": None, "operating_batch": None}
    if "launch" in agg:
        out["launch_aggregated"] = agg["launch"]
    out["launch"] = _launch(spec, rec, ctx)
    out["deployment"] = block | {"kind": "disaggregated",
                                 "margin_pct": _margin(spec, dis, a) if a is not None else None,
                                 "against": "aggregated" if a is not None else None}
    return out


def deployment_lines(r: dict) -> list[str]:
    """``kvtune solve``'s summary lines for the kind of deployment: which won, by how much."""
    d = r.get("deployment") or {}
    if "disaggregated" not in d.get("searched", ()):
        return []
    basis = "$/h" if r.get("objective") == "min_cost" else "goodput per $"
    m = d.get("margin_pct")
    rec = r.get("recommendation") or {}
    lines = []
    if rec.get("deployment") == "disaggregated":
        p, q = rec["prefill"], rec["decode"]
        lines.append(f"  deployment: disaggregated: {p['replicas']} prefill x TP{p['tp']} (chunk {p['chunk_tokens']}, "
                     f"batch cap {p['batch_cap']}) + {q['replicas']} decode x TP{q['tp']} (batch cap {q['batch_cap']}), "
                     f"KV over {'NVLink' if rec['link'] == 'nvlink' else 'the network'}; engine rules "
                     f"{d['disaggregated']['engine']}")
    a, x = d.get("aggregated"), d.get("disaggregated") or {}
    if d.get("kind") == "disaggregated" and a and m is None:
        lines.append(f"  search.deployment lists disaggregated only; the best aggregated would be {a['gpus']} GPUs, "
                     f"${a['usd_per_hour']:.2f}/h, TP{a['config']['tp']}")
    elif d.get("kind") == "disaggregated" and a:
        by = (f"by {m:.1f}% in {basis}" if abs(m) >= 0.05 else
              f"at the same {basis} with more goodput ({x['goodput_req_s']:.2f} against {a['goodput_req_s']:.2f} req/s)")
        lines.append(f"  disaggregated beats the best aggregated ({a['gpus']} GPUs, ${a['usd_per_hour']:.2f}/h, "
                     f"TP{a['config']['tp']}) {by}")
    elif d.get("kind") == "aggregated" and x.get("gpus") and m is not None:
        u = x["unit"]
        lines.append(f"  aggregated beats the best disaggregated ({x['units']} x [{u['prefill']['replicas']} prefill "
                     f"x TP{u['prefill']['tp']} + {u['decode']['replicas']} decode x TP{u['decode']['tp']}], "
                     f"{x['gpus']} GPUs, ${x['usd_per_hour']:.2f}/h) by {m:.1f}% in {basis}")
    elif x.get("reason"):
        lines.append(f"  disaggregated: {x['reason']}")
    return lines
