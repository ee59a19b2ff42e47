"""Held-out replay of the live llama-server's open-loop runs (tests/data/live-llamacpp-overload,
measured): each run is predicted from a calibration fitted without it, as tune's refit fits, and
its measured arrivals replayed through the simulator. Two hold-outs: the runs before it (what tune
knows when it makes that run) and every other run; two objectives: the runs' means (the default)
and each request's TTFT/TPOT (``--fit-metrics`` with the request metrics).

Usage: python bench/bench_overload_replay.py [--table T]   (about 1 minute on 2 cores)
Figures as last measured: bench/RESULTS-overload.md.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from kvtune.costmodel.closed_loop import STAGGERED_ENGINES
from kvtune.costmodel.fit import FIT_METRICS, REQUEST_METRICS, RowPredictor
from kvtune.costmodel.hardware import resolve_gpu
from kvtune.costmodel.profile_table import read_table
from kvtune.optimizer.calibrate import calibrate, resolve_base
from kvtune.optimizer.validate import predictable

ROOT = Path(__file__).resolve().parents[1]
PCT = ("ttft_p50_ms", "ttft_p90_ms", "tpot_p50_ms", "tpot_p90_ms")
OBJECTIVES = {"means": None, "requests": tuple(FIT_METRICS) + REQUEST_METRICS}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--table", type=Path, default=ROOT / "tests" / "data" / "live-llamacpp-overload" / "measured.csv")
    ap.add_argument("--gpu-file", default=str(ROOT / "profiles" / "hardware-cpu-example.yaml"))
    a = ap.parse_args(argv)
    rows = [r for r in read_table(a.table) if predictable(r) is None]
    gpu = resolve_gpu("cpu-2core", a.gpu_file)
    predict = RowPredictor(gpu, stagger=STAGGERED_ENGINES)
    base = resolve_base("ideal", gpu, "llamacpp")
    runs = [r for r in rows if r.requests_file]
    print("| run | requests | fitted on | objective | " + " | ".join(f"{m} err %" for m in PCT) + " |")
    print("|---|---|---|---|" + "---|" * len(PCT))
    summary: dict[tuple[str, str], list[float]] = {}
    for held in runs:
        for hold, train in (("runs before", [r for r in rows if r.date < held.date]),
                            ("all other runs", [r for r in rows if r.id != held.id])):
            for obj, metrics in OBJECTIVES.items():
                fit = calibrate(train, gpu, base, None, predict, name="held-out", metrics=metrics)
                p = predict([held], fit.efficiency)[0]
                err = [100 * (p[m] / getattr(held, m) - 1) for m in PCT]
                summary.setdefault((hold, obj), []).extend(abs(e) for e in err)
                print(f"| {held.id} | {held.num_requests} | {hold} ({len(train)} rows) | {obj} | "
                      + " | ".join(f"{e:+.1f}" for e in err) + " |", flush=True)
    print()
    print("| fitted on | objective | median abs err % | max abs err % |")
    print("|---|---|---|---|")
    for (hold, obj), errs in summary.items():
        print(f"| {hold} | {obj} | {np.median(errs):.1f} | {max(errs):.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
