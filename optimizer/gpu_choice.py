"""The GPU type as a choice: ``hardware.gpu`` lists several types, each with its price.

Each type is solved on its own, every deployment kind on it (``optimizer.deployment_choice``
passes ``solve_deployments`` for one type as ``solve_one``; same trials, seeds and request
sample, its own shipped calibration unless the workload names one), so a list is never dearer
than any of its members alone; the answer is the best type's result under the objective's order
(``optimizer.deployment_choice.result_rank``), with every type's best beside it (min_cost: a type
after the first is searched only at or below the cheapest $/h found so far, ``solve_gpu_choice``):

    min_cost      the lowest $/h that meets the SLOs at the target rate (ties: bf16 KV, then more goodput)
    max_goodput   the most goodput per $ within hardware.max_nodes (ties: the lowest $/h)

``gpu_choice`` lists each type: its $/GPU-hour, status, $/h, goodput, GPUs and config, and why it
lost (how much dearer, or why no config met the SLOs).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

from .result import GpuChoiceRow, SolveResult
from .workload import WorkloadSpec

__all__ = ["solve_gpu_choice", "why_text"]

_CONFIG_KEYS = ("tp", "pp", "ep", "dp_attention", "batch_cap", "kv_dtype", "spec_k", "chunk_tokens", "replicas")


def _score(spec: WorkloadSpec, r: SolveResult) -> tuple:
    from .deployment_choice import result_rank
    return result_rank(spec, r)


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
    if objective == "max_goodput":
        return (f"{goodput_req_s / usd_per_hour:.4g} req/s per $/h against {best_gpu}'s "
                f"{best_goodput_req_s / best_usd_per_hour:.4g}")
    d = usd_per_hour - best_usd_per_hour
    return (f"${d:.2f}/h more than {best_gpu} (${best_usd_per_hour:.2f}/h)" if d > 1e-9 else
            f"same ${usd_per_hour:.2f}/h as {best_gpu}, less goodput")


def solve_gpu_choice(spec: WorkloadSpec, solve_one: Callable[..., SolveResult] | None = None,
                     **kwargs: Any) -> SolveResult:
    """Solve ``spec`` once per ``spec.hardware.choices`` entry; the best type's result, with
    ``gpu_choice`` (every type, best first) and ``status`` ok if any type met the SLOs.

    min_cost: the types in the order listed, each searched only for deployments at or below the
    cheapest found so far (``usd_cap``, passed to ``solve_one``; ties stay in, since more goodput
    at the same $/h wins): a type with nothing there says so (status ``dearer``) instead of naming
    its own dearer best. The answer is the one every type solved in full would give.
    max_goodput: every type in full; with ``jobs`` > 1 and no shared ``storage``, side by side on
    that many forked processes (each with one job; what each prints while it runs is dropped)."""
    if solve_one is None:
        from .recommend import solve
        solve_one = solve
    h = spec.hardware
    one_kw = []
    for gpu, usd in h.choices:
        one = dataclasses.replace(spec, hardware=dataclasses.replace(h, gpu=gpu, usd_per_gpu_hour=usd, choices=()))
        kw = dict(kwargs)
        if kw.get("study_name"):  # one study per type in a shared storage
            kw["study_name"] = f"{kw['study_name']}-{gpu}"
        one_kw.append((one, kw))
    caps: list[float] = []
    jobs = int(kwargs.get("jobs") or 1)
    if spec.objective == "min_cost":
        solved, cap = [], math.inf
        for one, kw in one_kw:
            caps.append(cap)
            capped: dict[str, Any] = {"usd_cap": cap} if math.isfinite(cap) else {}
            r = solve_one(one, **kw, **capped)
            solved.append(r)
            if r.status == "ok" and r.cost is not None:
                cap = min(cap, r.cost.usd_per_hour)
    elif jobs > 1 and not kwargs.get("storage") and len(one_kw) > 1:
        from .disagg import fork_map
        solved = fork_map(lambda x: _quietly(solve_one, x[0], {**x[1], "jobs": 1}), one_kw, jobs)
    else:
        solved = [solve_one(one, **kw) for one, kw in one_kw]
    caps += [math.inf] * (len(solved) - len(caps))
    results = [(gpu, usd, r) for (gpu, usd), r in zip(h.choices, solved)]
    order = sorted(range(len(results)), key=lambda i: (_score(spec, results[i][2]), i))
    best_gpu, _, best = results[order[0]]
    rows = tuple(_row(gpu, usd, r, _why(spec, r, i == order[0], best_gpu, best), caps[i])
                 for i, (gpu, usd, r) in ((i, results[i]) for i in order))
    return dataclasses.replace(best, gpu_choice=rows)


def _quietly(solve_one: Callable[..., SolveResult], one: WorkloadSpec, kw: dict) -> SolveResult:
    """``solve_one`` in a forked process: its progress display (stderr) dropped, so several types
    solved at once do not write over each other's lines."""
    import os
    import sys
    sys.stderr = open(os.devnull, "w")
    return solve_one(one, **kw)
