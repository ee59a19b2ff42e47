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

__all__ = ["solve_gpu_choice"]


def _score(spec, r: dict) -> tuple:
    if r["status"] != "ok":
        return (1, 0.0)
    return (0, *spec.objective_key(r["cost"]["usd_per_hour"], r["predicted"]["goodput_req_s"]))


def _row(gpu: str, usd: float, r: dict) -> dict:
    row = {"gpu": gpu, "usd_per_gpu_hour": usd, "status": r["status"], "source": r.get("source", "")}
    if r["status"] == "ok":
        rec = r["recommendation"]
        row |= {"usd_per_hour": r["cost"]["usd_per_hour"], "goodput_req_s": r["predicted"]["goodput_req_s"],
                "gpus": rec["gpus"], "nodes": rec["nodes"],
                "config": {k: rec[k] for k in ("tp", "pp", "ep", "dp_attention", "batch_cap", "kv_dtype",
                                               "spec_k", "chunk_tokens", "replicas") if k in rec}}
    else:
        row |= {"usd_per_hour": None, "goodput_req_s": None, "reason": r.get("reason", "")}
    return row


def solve_gpu_choice(spec, solve_one=None, **kwargs) -> dict:
    """Solve ``spec`` once per ``spec.hardware.choices`` entry; the best type's result, with
    ``gpu_choice`` (every type, best first) and ``status`` ok if any type met the SLOs."""
    if solve_one is None:
        from .recommend import solve as solve_one
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
    rows = []
    for i in order:
        gpu, usd, r = results[i]
        row = _row(gpu, usd, r)
        if i == order[0] and r["status"] == "ok":
            row["why"] = "chosen"
        elif r["status"] != "ok":
            row["why"] = f"no config meets the SLOs: {r.get('reason', '')}"
        elif spec.objective == "max_goodput":
            mine = r["predicted"]["goodput_req_s"] / r["cost"]["usd_per_hour"]
            top = best["predicted"]["goodput_req_s"] / best["cost"]["usd_per_hour"]
            row["why"] = f"{mine:.4g} req/s per $/h against {best_gpu}'s {top:.4g}"
        else:
            d = r["cost"]["usd_per_hour"] - best["cost"]["usd_per_hour"]
            row["why"] = (f"${d:.2f}/h more than {best_gpu} (${best['cost']['usd_per_hour']:.2f}/h)" if d > 1e-9 else
                          f"same ${r['cost']['usd_per_hour']:.2f}/h as {best_gpu}, less goodput")
        rows.append(row)
    return {**best, "gpu_choice": rows}
