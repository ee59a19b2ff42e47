"""What a sampled race costs and finds against the exhaustive one (``search.exhaustive_max_configs``).

    python bench/bench_sampled.py [--workloads a.yaml,b.yaml] [--trials 20,40,80] [--seeds 0,1,2]
                                  [--samplers tpe,nsga2] [--out bench/RESULTS-sampled.md]

For each workload: one exhaustive solve (the default, every lattice config raced), then the same
workload with ``search.exhaustive_max_configs: 0``, so the race covers only the configs the screen's
study sampled, for every sampler x trials x seed. Each row: the pick's $/h and goodput against the
exhaustive pick's (min_cost: $/h ratio; max_goodput: goodput per $ ratio), whether it is the same
deployment, and the aggregated race's simulations summed over the GPU types (each type's race,
counted at ``optimizer.recommend.race``; the disaggregated pool search is the same either way).
All figures simulated (kvtune's simulator, calibrated H100 model), one process (``jobs`` 1); wall
seconds are this machine's and noisy; compare simulations.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

from kvtune.optimizer import recommend  # noqa: E402
from kvtune.optimizer.solve import SolveOptions, solve  # noqa: E402
from kvtune.optimizer.workload import load_workload  # noqa: E402

DEFAULT = ("examples/gpu-choice-llama3.1-70b.yaml", "examples/chat-llama3.1-8b.yaml")


def _counting():
    sims = []
    real = recommend.race

    def counted(*a, **k):
        r = real(*a, **k)
        sims.append(r.simulations)
        return r
    recommend.race = counted
    return sims, real


def run(spec, sampler: str, seed: int, trials: int | None) -> dict:
    sims, real = _counting()
    t0 = time.perf_counter()
    try:
        r = solve(spec, SolveOptions(sampler=sampler, seed=seed, trials=trials, jobs=1))
    finally:
        recommend.race = real
    wall = time.perf_counter() - t0
    rec = r.recommendation
    return {"status": r.status, "usd_per_hour": r.cost.usd_per_hour if r.cost else None,
            "goodput_req_s": r.predicted.goodput_req_s if r.predicted else None,
            "pick": rec.to_json() if rec is not None else None, "sims": sum(sims), "wall_s": wall,
            "raced": r.verification.raced, "lattice": r.verification.lattice_configs}


def row(lines: list[str], name: str, objective: str, ex: dict, search, sampler, trials, seed, x: dict) -> None:
    """One table row: ``x`` against the exhaustive solve ``ex``."""
    same = x["pick"] == ex["pick"]
    if x["status"] != "ok" or ex["status"] != "ok":
        vs = f"{x['status']} vs {ex['status']}"
    elif objective == "min_cost":
        vs = f"$/h x{x['usd_per_hour'] / ex['usd_per_hour']:.3f}"
    else:
        vs = f"goodput/$ x{(x['goodput_req_s'] / x['usd_per_hour']) / (ex['goodput_req_s'] / ex['usd_per_hour']):.3f}"
    usd = f"{x['usd_per_hour']:.2f}" if x["usd_per_hour"] is not None else "-"
    gp = f"{x['goodput_req_s']:.2f}" if x["goodput_req_s"] is not None else "-"
    lines.append(f"| {name} | {search} | {sampler} | {trials} | {seed} | {x['raced']} of {x['lattice']} | "
                 f"{x['sims']} | {usd} | {gp} | {'yes' if same else 'no'} | {vs} | {x['wall_s']:.1f} |")
    print(lines[-1], flush=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workloads", default=",".join(DEFAULT))
    ap.add_argument("--trials", default="20,40,80")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--samplers", default="tpe,nsga2")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    lines = [f"machine: {os.cpu_count()} CPUs, loadavg {os.getloadavg()[0]:.2f} at start; one process per solve",
             "", "| workload | search | sampler | trials | seed | raced configs (winning type) | aggregated-race simulations "
             "(all types) | $/h | goodput req/s | same pick | vs exhaustive | wall s |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for w in a.workloads.split(","):
        spec = load_workload(str(ROOT / w))
        objective = spec.objective
        ex = run(spec, "tpe", 0, None)
        name = Path(w).stem

        row(lines, name, objective, ex, "exhaustive", "-", "-", "-", ex)
        sampled = dataclasses.replace(spec, search=dataclasses.replace(spec.search, exhaustive_max_configs=0))
        for sampler in a.samplers.split(","):
            for trials in (int(t) for t in a.trials.split(",")):
                for seed in (int(s) for s in a.seeds.split(",")):
                    row(lines, name, objective, ex, "sampled", sampler, trials, seed, run(sampled, sampler, seed, trials))
    text = "\n".join(lines) + "\n"
    if a.out:
        Path(a.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
