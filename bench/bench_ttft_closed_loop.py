"""Why kvtune's closed-loop TTFT misses vLLM's silicon runs: the evidence, reproducible.

    python bench/bench_ttft_closed_loop.py [--engine vllm] [--rounds 20]

Reads the shipped H100 silicon table (profiles/tables/h100-silicon.csv: NVIDIA's
aiconfigurator-core 0.12.0 systems/silicon_sample.csv; vLLM 0.12.0, Qwen3-32B, TP 2/4/8) and
prints, all from the simulator with the shipped calibration (nothing here is a measurement of ours):

A. measured TTFT against the output length at a fixed concurrency and prompt (flat: the clients
   stay bunched; spread clients would see fewer prompts ahead of theirs as outputs grow);
B. measured TTFT at concurrency 8 in units of kvtune's lone prefill (one prompt, its own step);
C. the per-row prediction with each client rule (burst: vLLM's since this investigation;
   staggered: its rule before) and each token budget (the rows' chunk_tokens, aiconfigurator's
   benchmark launch rule C + isl + 1500; or vLLM's H100 default 8192), MAPE / bias / worst, split
   by prompt length;
D. hypothesis (a), the initial burst in the mean: clients starting together, ``--rounds`` rounds
   (aiconfigurator's generated benchmark sends concurrency x 20 requests after 2 x concurrency
   warm-up ones: src/aiconfigurator/generator/config/backend_templates/benchmark/bench_run.sh.j2,
   BENCH_MULTI_ROUND=20), the first round's mean TTFT against the last half's, and what the first
   round adds to a mean over all rounds.

Findings are written up in bench/RESULTS-ttft.md.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections import defaultdict
from pathlib import Path

import numpy as np

from kvtune.costmodel.calibration import efficiency_for
from kvtune.costmodel.closed_loop import run_closed_loop
from kvtune.costmodel.fit import RowPredictor
from kvtune.costmodel.hardware import get_gpu
from kvtune.costmodel.profile_table import read_table
from kvtune.costmodel.requests import Requests

ROOT = Path(__file__).resolve().parents[1]
TABLE = ROOT / "profiles" / "tables" / "h100-silicon.csv"


def _stats(err: list[float]) -> str:
    e = np.asarray(err) * 100
    return f"MAPE {np.mean(np.abs(e)):5.1f} %  bias {e.mean():+6.1f} %  worst {e[np.argmax(np.abs(e))]:+7.1f} %"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", default="vllm")
    ap.add_argument("--rounds", type=int, default=20)
    a = ap.parse_args()
    rows = [r for r in read_table(TABLE) if r.engine == a.engine and r.kind == "request" and r.concurrency]
    gpu = get_gpu("h100-sxm")
    eff = efficiency_for("calibrated", gpu.name, None, a.engine)
    print(f"{len(rows)} {a.engine} rows of {TABLE.relative_to(ROOT)}; calibration: {eff.source}\n")

    # ---- A. flat in the output length ------------------------------------------------------------
    print("A. measured TTFT (ms) against the output length, same TP, prompt and concurrency")
    by = defaultdict(dict)
    for r in rows:
        by[(r.tp, r.input_tokens, r.concurrency)][r.output_tokens] = r.ttft_mean_ms
    print(f"{'tp':>3} {'isl':>5} {'C':>4}  " + "  ".join(f"osl {o:>5}" for o in (128, 512, 1024)) + "   max/min")
    for (tp, isl, c), d in sorted(by.items()):
        if len(d) < 3 or c > 32:
            continue
        v = [d[o] for o in (128, 512, 1024)]
        print(f"{tp:>3} {isl:>5} {c:>4}  " + "  ".join(f"{x:>9.0f}" for x in v) + f"   {max(v) / min(v):7.2f}")

    # ---- B. TTFT at C = 8 in lone prefills ----------------------------------------------------------
    print("\nB. measured TTFT at concurrency 8 over kvtune's lone prefill (shipped calibration)")
    pred = RowPredictor(gpu, stagger=True)
    print(f"{'tp':>3} {'isl':>5} {'osl':>5}  {'measured_ms':>11}  {'lone_prefill_ms':>15}  {'ratio':>5}")
    for r in sorted(rows, key=lambda r: (r.tp, r.input_tokens, r.output_tokens)):
        if r.concurrency != 8:
            continue
        sm = pred.step_model(r, eff)
        lone_ms = sm.prefill_time_s(r.input_tokens, chunk_tokens=pred.chunk_tokens) * 1e3
        print(f"{r.tp:>3} {r.input_tokens:>5} {r.output_tokens:>5}  {r.ttft_mean_ms:>11.1f}  {lone_ms:>15.1f}  "
              f"{r.ttft_mean_ms / lone_ms:>5.2f}")

    # ---- C. each client rule ---------------------------------------------------------------------
    print("\nC. predicted against measured, by client rule and token budget (kvtune validate: burst, the rows')")
    for rule, budget in (("burst", "rows"), ("staggered", "rows"), ("burst", "8192"), ("staggered", "8192")):
        p = RowPredictor(gpu, stagger=rule == "staggered")
        rr = rows if budget == "rows" else [dataclasses.replace(r, chunk_tokens=None) for r in rows]
        out = p(rr, eff)
        t_err = [o["ttft_ms"] / r.ttft_mean_ms - 1 for o, r in zip(out, rows)]
        p_err = [o["tpot_ms"] / r.tpot_mean_ms - 1 for o, r in zip(out, rows)]
        print(f"{rule:>9}, budget {budget:>4}: TTFT {_stats(t_err)} | TPOT {_stats(p_err)}")
        for isl in sorted({r.input_tokens for r in rows}):
            e = [x for x, r in zip(t_err, rows) if r.input_tokens == isl]
            print(f"{'':>24}isl {isl:>5} ({len(e):>2} rows): TTFT {_stats(e)}")

    # ---- D. the initial burst in the mean ------------------------------------------------------------
    print(f"\nD. clients starting together, {a.rounds} rounds: the first round's share of the mean TTFT")
    print(f"{'tp':>3} {'isl':>5} {'osl':>5} {'C':>4}  {'round1_ms':>9}  {'last_half_ms':>12}  {'all_rounds_ms':>13}  "
          f"{'first_round_adds_ms':>19}  {'measured_ms':>11}")
    pb = RowPredictor(gpu, stagger=False)
    for r in sorted(rows, key=lambda r: (r.tp, r.input_tokens, r.concurrency)):
        if r.output_tokens != 512 or r.concurrency not in (8, 64):
            continue
        c = r.concurrency
        sm = pb.step_model(r, eff)
        res = run_closed_loop(sm, Requests.uniform(a.rounds * c, r.input_tokens, r.output_tokens),
                              pb.sim_config(r, c), c, "burst")
        ttft = np.asarray(res.ttft_s) * 1e3
        first, rest = ttft[:c].mean(), ttft[c:].mean()
        last = ttft[(a.rounds // 2) * c:].mean()
        print(f"{r.tp:>3} {r.input_tokens:>5} {r.output_tokens:>5} {c:>4}  {first:>9.0f}  {last:>12.0f}  "
              f"{ttft.mean():>13.0f}  {ttft.mean() - rest:>19.0f}  {r.ttft_mean_ms:>11.0f}")


if __name__ == "__main__":
    main()
