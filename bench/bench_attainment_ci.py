"""Coverage of the attainment confidence intervals of ``optimizer.loadgen`` on simulated open-loop runs.

A measured open-loop run gives one attainment over N requests; the interval around it should
contain the attainment the engine holds at that rate in the long run, 95% of the time. Requests of
one run are not independent (a queue that builds makes misses come in runs), so an interval that
assumes independence (Wilson, Clopper-Pearson) may be too narrow. Here the "engine" is the
simulator, where the long-run attainment is known: the mean over ``--long-seeds`` runs of
``--long-requests`` requests. Each short run (``--requests`` requests, the first ``--warmup`` out,
as ``kvtune profile open-loop`` measures) gets each method's interval; coverage is the share of
short runs whose interval holds the long-run value.

Usage: nice python bench/bench_attainment_ci.py [--runs 200] [--requests 330] [--warmup 30]
Results as last measured are in bench/RESULTS-measure.md.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1].parent))

from kvtune.costmodel import get_gpu  # noqa: E402
from kvtune.costmodel.calibration import efficiency_for  # noqa: E402
from kvtune.costmodel.models import get_model  # noqa: E402
from kvtune.costmodel.simulate import SimConfig, simulate  # noqa: E402
from kvtune.costmodel.step import StepModel  # noqa: E402
from kvtune.costmodel.traffic import SLO, LengthDist, RequestClass, Workload  # noqa: E402
from kvtune.optimizer.loadgen import CI_METHODS, attainment_interval  # noqa: E402

CAP = 32


def workload() -> Workload:
    chat = RequestClass("chat", 0.7, LengthDist.uniform(200, 1500), LengthDist.uniform(50, 300), prefix_tokens=150)
    docs = RequestClass("docs", 0.3, LengthDist.uniform(2000, 6000), LengthDist.uniform(20, 120))
    return Workload(classes=(chat, docs), rate_req_s=10.0, slo=SLO(ttft_ms=300.0, tpot_ms=20.0))


def met_in_order(sm, wl: Workload, rate: float, n: int, seed: int, warmup: int) -> np.ndarray:
    req = wl.requests(n, seed, rate_req_s=rate)
    res = simulate(sm, req, SimConfig(batch_cap=CAP), arrival="trace", warmup_frac=0.0)
    order = np.argsort(req.arrival_s, kind="stable")
    return np.asarray(res.met_slo)[order][warmup:]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--requests", type=int, default=330)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--long-requests", type=int, default=20000)
    ap.add_argument("--long-seeds", type=int, default=4)
    ap.add_argument("--rates", default="10,12,13,14")
    args = ap.parse_args()
    gpu = get_gpu("h100-sxm")
    sm = StepModel(get_model("llama-3.1-8b"), gpu, 1, "bf16", "bf16", efficiency_for("calibrated", "h100-sxm", None,
                                                                                        "vllm"))
    wl = workload()
    t0 = time.perf_counter()
    print(f"llama-3.1-8b on h100-sxm (h100-sxm-vllm calibration), cap {CAP}, SLO TTFT {wl.slo.ttft_ms:g} ms / TPOT "
          f"{wl.slo.tpot_ms:g} ms; {args.runs} runs of {args.requests} requests ({args.warmup} warm-up) per rate; "
          f"long run: {args.long_seeds} x {args.long_requests}")
    print("| rate req/s | long-run attainment | mean short-run attainment | method | coverage of 95% CI | "
          "mean width | mean n_eff |")
    print("|---|---|---|---|---|---|---|")
    for rate in (float(r) for r in args.rates.split(",")):
        truth = float(np.mean([met_in_order(sm, wl, rate, args.long_requests, 10_000 + s,
                                            args.long_requests // 10).mean() for s in range(args.long_seeds)]))
        mets = [met_in_order(sm, wl, rate, args.requests, s, args.warmup) for s in range(args.runs)]
        mean_att = float(np.mean([m.mean() for m in mets]))
        for method in CI_METHODS:
            ci = np.array([attainment_interval(m, 0.95, method) for m in mets])
            cover = float(np.mean((ci[:, 0] <= truth) & (truth <= ci[:, 1])))
            print(f"| {rate:g} | {truth:.3f} | {mean_att:.3f} | {method} | {cover:.3f} | "
                  f"{float(np.mean(ci[:, 1] - ci[:, 0])):.3f} | {float(np.mean(ci[:, 2])):.0f} |")
    print(f"wall {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
