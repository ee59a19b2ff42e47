"""The GPU type as a choice: ``hardware.gpu`` lists several types, each with its price.

Each type is solved on its own, every deployment kind on it (``optimizer.solve.solve_type``; same
trials, seeds and request sample, its own shipped calibration unless the workload names one), so a
list is never dearer than any of its members alone; the answer is the best type's result under the
objective's order (``result_rank``), with every type's best beside it (``choose``; min_cost: a type
after the first is searched only at or below the cheapest $/h found so far, ``optimizer.solve``):

    min_cost      the lowest $/h that meets the SLOs at the target rate (ties: bf16 KV, then more goodput)
    max_goodput   the most goodput per $ within hardware.max_nodes (ties: the lowest $/h)

``gpu_choice`` lists each type: its $/GPU-hour, status, $/h, goodput, GPUs and config, and why it
lost (how much dearer, or why no config met the SLOs).
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
from typing import Callable

from .objective import objective_for
from .result import GpuChoiceRow, SolveResult
from .workload import WorkloadSpec

__all__ = ["choose", "quietly", "result_rank", "why_text"]

_CONFIG_KEYS = ("tp", "pp", "ep", "dp_attention", "batch_cap", "kv_dtype", "spec_k", "chunk_tokens", "replicas")


def result_rank(spec: WorkloadSpec, r: SolveResult) -> tuple:
    """One solve's answer under the objective (``optimizer.objective``): what the GPU-type choice
    compares; an answer that is not ok sorts last."""
    if r.status != "ok" or r.cost is None or r.predicted is None or r.recommendation is None:
        return (1,)
    p = r.predicted
    good = p.ranked_goodput_req_s if p.ranked_goodput_req_s is not None else p.goodput_req_s
    return (0, *objective_for(spec.objective).rank(r.cost.usd_per_hour, good, r.recommendation.kv_dtype,
                                                   spec.search.kv_dtype))


def _row(gpu: str, usd: float, r: SolveResult, why: str, usd_cap: float = math.inf) -> GpuChoiceRow:
    if r.status == "dearer":   # searched only up to the price another type already met
        return GpuChoiceRow(gpu=gpu, usd_per_gpu_hour=usd, status="dearer", source=r.source,
                            why=f"nothing at or below ${usd_cap:.2f}/h (a cheaper type was found first)",
                            reason=r.reason or "")
    if r.status == "ok" and r.cost is not None and r.predicted is not None and r.recommendation is not None:
        rec = r.recommendation
        js = rec.to_json()
        return GpuChoiceRow(gpu=gpu, usd_per_gpu_hour=usd, status=r.status, source=r.source, why=why,
                            usd_per_hour=r.cost.usd_per_hour, goodput_req_s=r.predicted.goodput_req_s,
                            gpus=rec.gpus, nodes=rec.nodes, config={k: js[k] for k in _CONFIG_KEYS if k in js})
    return GpuChoiceRow(gpu=gpu, usd_per_gpu_hour=usd, status=r.status, source=r.source, why=why,
                        reason=r.reason or "")


def _why(spec: WorkloadSpec, r: SolveResult, chosen: bool, best_gpu: str, best: SolveResult) -> str:
    """Why this type was chosen or lost against the best type's result."""
    if r.status == "dearer":
        return r.reason or ""
    if r.status != "ok" or r.cost is None or r.predicted is None:
        return f"no config meets the SLOs: {r.reason or ''}"
    if chosen:
        return "chosen"
    assert best.cost is not None and best.predicted is not None   # sorted first: ok whenever r is
    return why_text(spec.objective, r.cost.usd_per_hour, r.predicted.goodput_req_s, best_gpu,
                    best.cost.usd_per_hour, best.predicted.goodput_req_s)


def why_text(objective: str, usd_per_hour: float, goodput_req_s: float, best_gpu: str, best_usd_per_hour: float,
             best_goodput_req_s: float) -> str:
    """How a type that met the SLOs lost to the best type (its $/h and goodput against the best's);
    also used to restate the rows once the pick is settled (``optimizer.facts``)."""
    if objective_for(objective).fixed_fleet:   # ranked by goodput per $
        return (f"{goodput_req_s / usd_per_hour:.4g} req/s per $/h against {best_gpu}'s "
                f"{best_goodput_req_s / best_usd_per_hour:.4g}")
    d = usd_per_hour - best_usd_per_hour
    return (f"${d:.2f}/h more than {best_gpu} (${best_usd_per_hour:.2f}/h)" if d > 1e-9 else
            f"same ${usd_per_hour:.2f}/h as {best_gpu}, less goodput")


def choose(spec: WorkloadSpec, gpus: list[str], prices: list[float], results: list[SolveResult],
           caps: list[float]) -> SolveResult:
    """The best type's result (``results[i]`` solved ``gpus[i]`` at ``prices[i]`` $/GPU-hour, searched
    up to ``caps[i]`` $/h), with ``gpu_choice``: every type, best first (ties: the order listed)."""
    order = sorted(range(len(results)), key=lambda i: (result_rank(spec, results[i]), i))
    best_gpu, best = gpus[order[0]], results[order[0]]
    rows = tuple(_row(gpus[i], prices[i], results[i], _why(spec, results[i], i == order[0], best_gpu, best), caps[i])
                 for i in order)
    return dataclasses.replace(best, gpu_choice=rows)


def quietly(fn: Callable[[], SolveResult]) -> SolveResult:
    """``fn()`` in a forked process: its progress display (stderr) dropped, so several types solved
    at once do not write over each other's lines."""
    sys.stderr = open(os.devnull, "w")
    return fn()
