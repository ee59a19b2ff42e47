"""One number per fact: the answer's figures made to agree before anything prints or writes them.

``kvtune solve`` assembles its answer in layers (``optimizer.recommend`` the aggregated search,
``optimizer.gpu_choice`` a GPU type per solve, ``optimizer.deployment_choice`` the kind of
deployment), and each layer kept the figures of the one below it where the pick changed: a
disaggregated winner printed the aggregated pick's KV-dtype note, the chosen GPU type's row the
aggregated pick's goodput, the cost/goodput front only aggregated deployments (one at the pick's
own price with another goodput). ``settle`` rewrites those parts to describe the pick that won,
so the terminal, the ``--json`` file and the report (which all read the settled result) give one
number for each fact:

- ``notes``: about the winning pick (a disaggregated pick's KV dtype against the other dtype's
  best disaggregated deployment);
- ``gpu_choice``: the chosen type's row is the pick (``deployment`` says which kind each row is),
  and the other rows say how they compare with it;
- ``pareto``: the front over every deployment the simulator sized, aggregated and disaggregated,
  and every other GPU type's best (its ``config`` names the ``gpu``); at the pick's price the
  front's point is the pick (kvtune's own preference among deployments of equal cost: bf16 KV
  before fp8).

Disaggregated candidates are sized as ``optimizer.deployment_choice`` sizes its pick (``units``
copies of a unit: enough for the target rate under ``min_cost``, as many as ``max_nodes`` holds
under ``max_goodput``); only the search's fully simulated (``final``) candidates count.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

from .result import (DisaggregatedRecommendation, GpuChoiceRow, JsonObject, ParetoPoint, Recommendation,
                     SolveResult)
from .workload import WorkloadSpec
from .recommend import pareto_front
from .gpu_choice import why_text
import yaml

__all__ = ["settle", "describe", "disaggregated_points", "other_gpu_points", "pick_point", "pick_params", "at_pick_price",
           "is_disaggregated", "load_basis", "front_point_text", "manifest_kinds", "launch_footer"]


def is_disaggregated(config: Mapping[str, Any] | None) -> bool:
    return bool(config) and (config or {}).get("deployment") == "disaggregated"


def describe(rec: Recommendation | DisaggregatedRecommendation) -> str:
    """The deployment in one phrase: ``5 x TP1``, ``1 x TP8 x PP2``, ``disaggregated, 3 prefill x
    TP2 + 1 decode x TP4``."""
    if isinstance(rec, DisaggregatedRecommendation):
        q, d = rec.prefill, rec.decode
        return f"disaggregated, {q.replicas} prefill x TP{q.tp} + {d.replicas} decode x TP{d.tp}"
    layout = f"TP{rec.tp}" + (f" x PP{rec.pp}" if rec.pp > 1 else "") + (f" EP{rec.ep}" if rec.ep > 1 else "") \
        + (" DP-attention" if rec.dp_attention else "")
    return f"{rec.replicas} x {layout}"


def _disagg_config(kv_dtype: str, units: int, unit: Mapping[str, Any]) -> JsonObject:
    """A disaggregated deployment as a front point's (or a GPU row's) ``config``: both pools with
    their replicas over all ``units``."""
    def pool(p: Mapping[str, Any]) -> JsonObject:
        return {"tp": p["tp"], "replicas": p["replicas"] * units, "batch_cap": p["batch_cap"],
                "chunk_tokens": p["chunk_tokens"]}
    return {"deployment": "disaggregated", "kv_dtype": kv_dtype, "units": units, "prefill": pool(unit["prefill"]),
            "decode": pool(unit["decode"]), "link": unit["link"]}


def _size(r: SolveResult, unit_gpus: int, unit_goodput: float, max_gpus: int) -> int:
    """Units of a disaggregated unit the objective deploys (0: none fits the node budget)."""
    if not unit_goodput > 0 or unit_gpus <= 0:
        return 0
    if r.objective == "max_goodput":
        units = max_gpus // unit_gpus
    else:
        units = max(1, math.ceil(r.target_rate_req_s / unit_goodput * (1 - 1e-12)))
    return units if 0 < units * unit_gpus <= max_gpus else 0


def disaggregated_points(r: SolveResult, usd_per_gpu_hour: float, max_gpus: int) -> list[ParetoPoint]:
    """Every fully simulated disaggregated candidate (``deployment.search``), sized into a deployment."""
    d = r.deployment
    out: list[ParetoPoint] = []
    if d is None:
        return out
    for s in d.search:
        for c in s.get("simulated", ()):
            g = c.get("goodput_req_s")
            if c.get("round") != "final" or not isinstance(g, (int, float)) or not g > 0:
                continue
            units = _size(r, int(c["gpus"]), float(g), max_gpus)
            if units:
                out.append(ParetoPoint(gpus=units * int(c["gpus"]), usd_per_hour=units * int(c["gpus"]) * usd_per_gpu_hour,
                                       goodput_req_s=units * float(g), config=_disagg_config(s["kv_dtype"], units, c),
                                       evidence="simulated"))
    return out


def pick_params(r: SolveResult) -> JsonObject | None:
    """The aggregated pick's search config as the race verified it (its layout's keys included):
    the verified row that is the recommendation; None for a disaggregated pick."""
    rec = r.recommendation
    if not isinstance(rec, Recommendation):
        return None
    for v in r.verified:
        c = v.config
        if v.feasible and all(c.get(k) == getattr(rec, k) for k in ("tp", "batch_cap", "kv_dtype", "spec_k",
                                                                         "chunk_tokens")) \
                and (c.get("layout") or None) == rec.layout:
            return dict(c)
    return None


def pick_point(r: SolveResult) -> ParetoPoint | None:
    rec, c, p = r.recommendation, r.cost, r.predicted
    if r.status != "ok" or rec is None or c is None or p is None:
        return None
    if isinstance(rec, DisaggregatedRecommendation):
        q, d = rec.prefill, rec.decode
        config: JsonObject = {"deployment": "disaggregated", "kv_dtype": rec.kv_dtype, "units": rec.units,
                              "prefill": {"tp": q.tp, "replicas": q.replicas, "batch_cap": q.batch_cap,
                                          "chunk_tokens": q.chunk_tokens},
                              "decode": {"tp": d.tp, "replicas": d.replicas, "batch_cap": d.batch_cap,
                                         "chunk_tokens": d.chunk_tokens}, "link": rec.link}
    else:
        params = pick_params(r)
        if params is None:
            js = rec.to_json()
            params = {k: js[k] for k in ("tp", "batch_cap", "kv_dtype", "spec_k", "chunk_tokens")}
        config = dict(params, replicas=rec.replicas)
    return ParetoPoint(gpus=rec.gpus, usd_per_hour=c.usd_per_hour, goodput_req_s=p.goodput_req_s, config=config,
                       evidence=p.evidence)


def other_gpu_points(r: SolveResult) -> list[ParetoPoint]:
    """The best deployment of every other GPU type the workload lists (``gpu_choice``), its
    ``config`` naming the type."""
    rec = r.recommendation
    out = []
    for g in r.gpu_choice or ():
        if g.status == "ok" and rec is not None and g.gpu != rec.gpu and g.usd_per_hour is not None \
                and g.goodput_req_s is not None and g.gpus is not None:
            out.append(ParetoPoint(gpus=g.gpus, usd_per_hour=g.usd_per_hour, goodput_req_s=g.goodput_req_s,
                                   config={**(g.config or {}), "gpu": g.gpu}, evidence="simulated"))
    return out


def at_pick_price(usd_per_hour: float, pick_usd_per_hour: float) -> bool:
    """A deployment at the pick's $/h (to a relative 1e-9): on the front the pick stands for that price."""
    return abs(usd_per_hour - pick_usd_per_hour) <= 1e-9 * max(1.0, pick_usd_per_hour)


def _front(r: SolveResult, max_gpus: int) -> tuple[ParetoPoint, ...] | None:
    pick = pick_point(r)
    if pick is None or r.cost is None:
        return r.pareto
    items = list(r.pareto or ()) + disaggregated_points(r, r.cost.usd_per_gpu_hour, max_gpus) + other_gpu_points(r)
    items = [x for x in items if not at_pick_price(x.usd_per_hour, pick.usd_per_hour)]   # the pick stands for its price
    return tuple(pareto_front(items + [pick]))


def _notes(r: SolveResult, kv_searched: tuple[str, ...], max_gpus: int) -> tuple[str, ...] | None:
    """A disaggregated pick's KV-dtype note, from the disaggregated search of each dtype (the
    aggregated pick's note is the aggregated race's, ``optimizer.recommend._dtype_notes``)."""
    rec, d = r.recommendation, r.deployment
    if not isinstance(rec, DisaggregatedRecommendation) or d is None or r.cost is None:
        return r.notes
    kept = tuple(n for n in r.notes or () if not n.startswith(_KV_NOTES))   # the other notes stand
    return kept + _kv_note(r, rec, d, kv_searched, max_gpus)


_KV_NOTES = ("bf16 KV", "FP8 KV", "fp8 KV")   # how the KV-dtype notes begin (optimizer.recommend._dtype_notes)


def _kv_note(r: SolveResult, rec: DisaggregatedRecommendation, d: Any, kv_searched: tuple[str, ...],
             max_gpus: int) -> tuple[str, ...]:
    assert r.cost is not None
    kv = list(kv_searched) or [s["kv_dtype"] for s in d.search]
    if kv == ["bf16"]:
        return ("FP8 KV excluded by search.kv_dtype: [bf16]",)
    if "bf16" not in kv:
        return ()
    other_kv = next((k for k in kv if k != rec.kv_dtype), None) if rec.kv_dtype == "bf16" else "bf16"
    other = [p for p in disaggregated_points(r, r.cost.usd_per_gpu_hour, max_gpus)
             if p.config["kv_dtype"] == other_kv]
    key = (lambda p: (-p.goodput_req_s / p.usd_per_hour,)) if r.objective == "max_goodput" else \
        (lambda p: (p.usd_per_hour, -p.goodput_req_s))
    best = min(other, key=key) if other else None
    usd = r.cost.usd_per_hour
    if rec.kv_dtype == "bf16":
        if best is None:
            return (f"bf16 KV: no {other_kv} disaggregated deployment met the SLOs (simulated)",)
        return (f"bf16 KV: FP8 KV buys no saving here ({other_kv}'s best disaggregated deployment: "
                f"{best.gpus} GPUs, ${best.usd_per_hour:.2f}/h, {best.goodput_req_s:.2f} req/s, simulated)",)
    evals = "check quality on your hardest evals"
    if best is None:
        return (f"{rec.kv_dtype.upper()} KV: no bf16 disaggregated deployment met the SLOs (simulated); {evals}",)
    if best.usd_per_hour > usd * (1 + 1e-9):
        return (f"{rec.kv_dtype.upper()} KV: no bf16 disaggregated deployment meets the target at ${usd:.2f}/h "
                f"(bf16's best: ${best.usd_per_hour:.2f}/h, simulated); {evals}",)
    return (f"{rec.kv_dtype.upper()} KV: bf16's best disaggregated deployment costs the same ${usd:.2f}/h for "
            f"less goodput ({best.goodput_req_s:.2f} req/s, simulated); {evals}",)


def _gpu_rows(r: SolveResult) -> tuple[GpuChoiceRow, ...] | None:
    """The chosen type's row is the pick; the others compare with it (``optimizer.gpu_choice``)."""
    rows, pick, rec = r.gpu_choice, pick_point(r), r.recommendation
    if not rows or pick is None or rec is None:
        return rows
    kind = "disaggregated" if isinstance(rec, DisaggregatedRecommendation) else "aggregated"
    chosen = next((g for g in rows if g.gpu == rec.gpu), None) or next((g for g in rows if g.why == "chosen"), None)
    if chosen is None:
        return rows
    out = []
    for g in rows:
        if g is chosen:
            g = dataclasses.replace(g, status="ok", why="chosen", usd_per_hour=pick.usd_per_hour,
                                    goodput_req_s=pick.goodput_req_s, gpus=rec.gpus, nodes=rec.nodes,
                                    config=g.config if kind == "aggregated" else pick.config, deployment=kind)
        elif g.status == "ok" and g.usd_per_hour is not None and g.goodput_req_s is not None:
            g = dataclasses.replace(g, why=why_text(r.objective, g.usd_per_hour, g.goodput_req_s, chosen.gpu,
                                                    pick.usd_per_hour, pick.goodput_req_s),
                                    deployment=g.deployment or "aggregated")
        out.append(g)
    return tuple(out)


def settle(r: SolveResult, spec: WorkloadSpec) -> SolveResult:
    """``r`` with its notes, GPU rows and cost/goodput front describing the pick that won (module
    docstring); ``spec`` the workload it answers (its KV dtypes searched, its node budget)."""
    if r.status != "ok" or r.recommendation is None:
        return r
    h = spec.hardware
    max_gpus = h.max_nodes * h.gpus_per_node
    return dataclasses.replace(r, notes=_notes(r, tuple(spec.search.kv_dtype), max_gpus), gpu_choice=_gpu_rows(r),
                               pareto=_front(r, max_gpus))


# ---- the text both the terminal and the report print -------------------------------------------
def load_basis(r: SolveResult) -> str:
    """What the predicted load is per: a replica, or a disaggregated unit (its pools named)."""
    rec = r.recommendation
    if isinstance(rec, DisaggregatedRecommendation):
        n = max(rec.units, 1)
        return (f"per unit of {rec.prefill.replicas // n} prefill + {rec.decode.replicas // n} decode replicas"
                + (f", {rec.units} units" if rec.units > 1 else ""))
    return "per replica"


def front_point_text(r: SolveResult, x: ParetoPoint) -> str:
    pick = pick_point(r)
    kind = (" disaggregated" if is_disaggregated(x.config) else "") + (f" on {x.config['gpu']}" if x.config.get("gpu") else "")
    mine = pick is not None and x.config == pick.config and abs(x.usd_per_hour - pick.usd_per_hour) < 1e-9
    return (f"{x.gpus} GPUs ${x.usd_per_hour:.2f}/h {x.goodput_req_s:.2f} req/s{kind} {x.evidence}"
            + (" (the pick)" if mine else ""))


def manifest_kinds(launch: Mapping[str, Any]) -> list[str]:
    """The Kubernetes objects the launch's manifest holds (``Deployment``, ``LeaderWorkerSet``, ...),
    in order, each once; [] when there is none."""
    text = launch.get("k8s")
    if not text or "k8s" in (launch.get("unsupported") or {}):
        return []
    try:
        docs = [d for d in yaml.safe_load_all(str(text)) if isinstance(d, dict)]
    except yaml.YAMLError:
        return []
    out: list[str] = []
    for d in docs:
        k = str(d.get("kind", ""))
        if k and k not in out:
            out.append(k)
    return out


def launch_footer(launch: Mapping[str, Any]) -> str:
    """Where the rest of the launch settings are, naming the Kubernetes objects the manifest holds."""
    kinds = manifest_kinds(launch)
    plat = launch.get("platforms") or {}
    names = [n for k, n in (("dynamo", "Dynamo"), ("llmd", "llm-d"), ("kserve", "KServe")) if k in plat]
    more = f"; {', '.join(names)} under 'launch.platforms' (docs/platforms.md)" if names else ""
    if kinds:
        return (f"the other engines' settings and a Kubernetes manifest ({', '.join(kinds)}) are in --json under "
                f"'launch'{more}")
    why = (launch.get("unsupported") or {}).get("k8s")
    return "the other engines' settings are in --json under 'launch'; no Kubernetes manifest" \
        + (f": {why}" if why else "") + more
