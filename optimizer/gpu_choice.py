"""The GPU type as a choice: ``hardware.gpu`` lists several types, each with its price.

An outer loop over the types: each is solved on its own (``optimizer.recommend.solve``, same
trials, seeds and request sample, its own shipped calibration unless the workload names one), and
the answer is the best type's result with every type's best config beside it:

    min_cost      the lowest $/h that meets the SLOs at the target rate (ties: more goodput)
    max_goodput   the most goodput per $ within hardware.max_nodes

``gpu_choice`` lists each type: its $/GPU-hour, status, $/h, goodput, GPUs and config, and why it
lost (how much dearer, or why no config met the SLOs).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from .result import GpuChoiceRow, SolveResult
from .workload import WorkloadSpec

__all__ = ["solve_gpu_choice", "why_text"]

_CONFIG_KEYS = ("tp", "pp", "ep", "dp_attention", "batch_cap", "kv_dtype", "spec_k", "chunk_tokens", "replicas")


def _score(spec: WorkloadSpec, r: SolveResult) -> tuple:
    if r.status != "ok" or r.cost is None or r.predicted is None:
        return (1, 0.0)
    return (0, *spec.objective_key(r.cost.usd_per_hour, r.predicted.goodput_req_s))


def _row(gpu: str, usd: float, r: SolveResult, why: str) -> GpuChoiceRow:
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
    if objective == "max_goodput":
        return (f"{goodput_req_s / usd_per_hour:.4g} req/s per $/h against {best_gpu}'s "
                f"{best_goodput_req_s / best_usd_per_hour:.4g}")
    d = usd_per_hour - best_usd_per_hour
    return (f"${d:.2f}/h more than {best_gpu} (${best_usd_per_hour:.2f}/h)" if d > 1e-9 else
            f"same ${usd_per_hour:.2f}/h as {best_gpu}, less goodput")


def solve_gpu_choice(spec: WorkloadSpec, solve_one: Callable[..., SolveResult] | None = None,
                     **kwargs: Any) -> SolveResult:
    """Solve ``spec`` once per ``spec.hardware.choices`` entry; the best type's result, with
    ``gpu_choice`` (every type, best first) and ``status`` ok if any type met the SLOs."""
    if solve_one is None:
        from .recommend import solve
        solve_one = solve
    h = spec.hardware
    results = []
    for gpu, usd in h.choices:
        one = dataclasses.replace(spec, hardware=dataclasses.replace(h, gpu=gpu, usd_per_gpu_hour=usd, choices=()))
        kw = dict(kwargs)
        if kw.get("study_name"):  # one study per type in a shared storage
            kw["study_name"] = f"{kw['study_name']}-{gpu}"
        results.append((gpu, usd, solve_one(one, **kw)))
    order = sorted(range(len(results)), key=lambda i: (_score(spec, results[i][2]), i))
    best_gpu, _, best = results[order[0]]
    rows = tuple(_row(gpu, usd, r, _why(spec, r, i == order[0], best_gpu, best))
                 for i, (gpu, usd, r) in ((i, results[i]) for i in order))
    return dataclasses.replace(best, gpu_choice=rows)
