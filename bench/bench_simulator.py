"""Simulator speed: simulated requests per wall-second on one core.

Scenario (the issue's): Llama-2-70B, TP4, H100 SXM with the shipped calibration, 2,000 requests,
prompts uniform 2048-4096 tokens, outputs uniform 256-512, batch cap 128, Poisson 2 req/s.
Target: >= 25,000 requests/s (Vidur reports 80-530 on this class of machine).

Each run times ``simulate`` alone (requests are built once; imports and the step model's first
use are warmed up by one untimed run). Reports the best and the median of N runs, in wall time
(``time.perf_counter``) and in CPU time of this process (``time.process_time``): on a shared,
overloaded machine the wall time includes waiting for a core; the CPU time is what one core spends.

    python bench/bench_simulator.py            # 20 runs
    python bench/bench_simulator.py --quick    # 5 runs, for CI logs
    python bench/bench_simulator.py --json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

import numpy as np

from kvtune.costmodel import StepModel, efficiency_for, get_gpu, get_model
from kvtune.costmodel.requests import Requests
from kvtune.costmodel.simulate import SimConfig, simulate

TARGET_REQ_S = 25_000


def scenario_requests(n: int = 2000, rate_req_s: float = 2.0, seed: int = 0) -> Requests:
    rng = np.random.default_rng(seed)
    arr = np.concatenate(([0.0], np.cumsum(rng.exponential(1.0 / rate_req_s, n - 1))))
    return Requests(arrival_s=arr, input_tokens=rng.integers(2048, 4097, n), output_tokens=rng.integers(256, 513, n),
                    prefix_tokens=np.zeros(n, dtype=np.int64), prefix_group=np.full(n, -1, dtype=np.int64),
                    ttft_slo_s=np.full(n, 2.0), tpot_slo_s=np.full(n, 0.05), class_idx=np.zeros(n, dtype=np.int64))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--quick", action="store_true", help="5 runs")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--profile", action="store_true", help="cProfile one run and print the top functions")
    args = ap.parse_args()
    runs = 5 if args.quick else args.runs

    step = StepModel(get_model("llama-2-70b"), get_gpu("h100-sxm"), 4,
                     efficiency=efficiency_for("calibrated", "h100-sxm"))
    req = scenario_requests()
    cfg = SimConfig(batch_cap=128)
    first = simulate(step, req, cfg)  # warm-up (not timed)
    if args.profile:
        import cProfile
        import pstats
        cProfile.runctx("simulate(step, req, cfg)", globals(), locals(), "/tmp/kvtune_sim.prof")
        pstats.Stats("/tmp/kvtune_sim.prof").sort_stats("tottime").print_stats(15)
        return
    walls, cpus = [], []
    for _ in range(runs):
        c0, t0 = time.process_time(), time.perf_counter()
        res = simulate(step, req, cfg)
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    assert np.array_equal(res.e2e_s, first.e2e_s)  # deterministic
    n = len(req)
    best, med = min(walls), statistics.median(walls)
    cbest, cmed = min(cpus), statistics.median(cpus)
    out = {
        "scenario": "llama-2-70b tp4 h100-sxm calibrated, 2000 req, in U[2048,4096], out U[256,512], cap 128, Poisson 2 req/s",
        "runs": runs,
        "best_s": best, "median_s": med,
        "best_req_per_s": n / best, "median_req_per_s": n / med,
        "cpu_best_s": cbest, "cpu_median_s": cmed,
        "cpu_best_req_per_s": n / cbest, "cpu_median_req_per_s": n / cmed,
        "load_average_1min": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "target_req_per_s": TARGET_REQ_S, "meets_target": n / min(med, cmed) >= TARGET_REQ_S,
        "engine_steps": res.steps, "scheduler_events": res.events,
        "steps_per_event": res.steps / res.events,
        "machine": {"cpu_count": os.cpu_count(), "processor": platform.processor() or platform.machine(),
                    "python": platform.python_version(), "platform": platform.platform()},
        "check": {"tpot_p50_ms": res.summary()["tpot_ms"]["p50"], "ttft_p99_ms": res.summary()["ttft_ms"]["p99"]},
    }
    if args.json:
        print(json.dumps(out, indent=2))
        return
    print(f"{out['scenario']}")
    print(f"  {runs} runs, wall: best {best * 1e3:.1f} ms ({n / best:,.0f} req/s), median {med * 1e3:.1f} ms "
          f"({n / med:,.0f} req/s)")
    print(f"  {runs} runs, CPU:  best {cbest * 1e3:.1f} ms ({n / cbest:,.0f} req/s), median {cmed * 1e3:.1f} ms "
          f"({n / cmed:,.0f} req/s); target {TARGET_REQ_S:,} req/s: {'met' if out['meets_target'] else 'MISSED'}")
    print(f"  {res.steps:,} engine steps in {res.events:,} scheduler events ({res.steps / res.events:.1f} steps each)")
    print(f"  machine: {out['machine']['cpu_count']} CPUs, {out['machine']['processor']}, Python {out['machine']['python']}, "
          f"load average {out['load_average_1min']}")


if __name__ == "__main__":
    main()
