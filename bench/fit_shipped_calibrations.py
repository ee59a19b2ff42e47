"""Reproduce kvtune's shipped H100 calibrations from the shared measured data.

    python bench/fit_shipped_calibrations.py [--shared ../shared/data] [--convert-only] [--only NAME] [--fp8-only]

1. Converts ``h100_silicon_points.csv`` and ``h100_calibration_points.csv`` into kvtune profile
   tables ``profiles/tables/h100-silicon.csv`` and ``profiles/tables/h100-published.csv`` (each with
   a ``.meta.yaml`` that states how the points were read).
2. Fits ``profiles/calibrations/h100-sxm.yaml`` (all engines) and one file per engine
   (``h100-sxm-trtllm.yaml``, ``-vllm``, ``-sglang``) with ``optimizer.calibrate``.
3. Cross-validates each engine (fit on some TP sizes, predict the others) and records it in the
   YAML ``fit.cross_validation``; prints a summary for profiles/README.md.

Deterministic: the same data gives the same files (apart from the ``created`` stamp).
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
import time
from pathlib import Path

from kvtune.costmodel.profile_table import COLUMNS, ProfileRow
ROOT = Path(__file__).resolve().parents[1]

TABLES = ROOT / "profiles" / "tables"
CALIB = ROOT / "profiles" / "calibrations"

ENGINE = {"trtllm": "trtllm", "vllm": "vllm", "sglang": "sglang", "TensorRT-LLM": "trtllm", "SGLang": "sglang"}
MODEL = {"meta-llama/Llama-3.1-8B-Instruct": "llama-3.1-8b", "Qwen/Qwen3-32B": "qwen3-32b",
         "Llama-2-7B": "llama-2-7b", "Llama-2-70B": "llama-2-70b", "Llama-3.1-8B-Instruct": "llama-3.1-8b"}


def _write_table(path: Path, rows: list[ProfileRow], meta_text: str) -> None:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS, lineterminator="\n")
        w.writeheader()
        for r in rows:
            w.writerow(r.as_csv_row())
    path.with_suffix(".meta.yaml").write_text(meta_text)


# The TensorRT-LLM runs behave as if the engine ran one sequence fewer than the clients (the
# source does not record max_batch_size): at fixed TP, prompt and concurrency C, the measured mean
# TTFT grows with the request's lifetime L = osl x TPOT at a slope of 1/(C-1), i.e. each request
# waited one departure interval for a free slot (slope x (C-1), median over the 12 TP x prompt
# groups: 0.92 at C=8, 0.89 at C=16, 0.84 at C=32; vLLM's runs: 0.00 to -0.04; checked by
# tests/measure/test_calibrated_accuracy.py). Recorded as batch_cap = C - 1, which the fits simulate.
QUEUED_ONE = {"trtllm"}

# The vLLM BF16 sweep (1024/4096 x 128/512/1024 tokens, concurrency 8-128) records no server
# settings. aiconfigurator's benchmark mode, which generates the server lines its silicon runs are
# launched with, sets an aggregated vLLM server's --max-num-batched-tokens to max_batch_size + isl +
# 1500 (ai-dynamo/aiconfigurator src/aiconfigurator/generator/rule_plugin/benchmark/vllm.rule,
# "agg max_num_tokens = (max_batch_size or 0) + (SlaConfig.isl or 0) + 1500", since 71bb3d00e,
# 2026-01-30; max_num_tokens -> max-num-batched-tokens in generator/config/
# backend_config_mapping.yaml), and the silicon_sample rows give batch_size = concurrency. Inferred,
# not recorded: the rows' TTFT is flat in the output length and a few prefills long even at
# concurrency 8 (bench/bench_ttft_closed_loop.py, bench/RESULTS-ttft.md), which vLLM's own default
# of 8192 on an H100 does not reproduce. The three FP8 4000x1000 runs (measured 2026-01-23/25 with
# Dynamo 0.8.0, before that rule) keep the engine default.
BENCH_BUDGET_EXTRA_TOKENS = 1500


# num_requests = 20 x concurrency, stats_window = whole_run (the same vLLM BF16 rows, inferred like
# their budget, from the same generated benchmark): aiconfigurator's benchmark script runs
# `aiperf profile --concurrency C --num-requests C x 20 --warmup-request-count 2C`
# (generator/config/backend_templates/benchmark/bench_run.sh.j2, BENCH_MULTI_ROUND=20, commit
# 095f58a51), and AIPerf finishes the warm-up phase before its profiling phase starts all C clients
# at once on the idle engine and averages every one of its requests (costmodel.closed_loop
# STATS_WINDOWS). So the measured mean holds the first, bunched round and the drain.
BENCH_ROUNDS = 20


def _vllm_bench_rounds(engine: str, weight_dtype: str, concurrency: int) -> tuple[int | None, str]:
    if engine == "vllm" and weight_dtype == "bf16":
        return BENCH_ROUNDS * concurrency, "whole_run"
    return None, ""


def _vllm_bench_budget(engine: str, weight_dtype: str, concurrency: int, isl: int) -> int | None:
    if engine == "vllm" and weight_dtype == "bf16":
        return concurrency + isl + BENCH_BUDGET_EXTRA_TOKENS
    return None


def convert_silicon(src: Path) -> list[ProfileRow]:
    rows = []
    with src.open(newline="") as f:
        for r in csv.DictReader(f):
            wd = r["precision"].lower()
            c = int(r["concurrency"])
            n_req, window = _vllm_bench_rounds(ENGINE[r["engine"]], wd, c)
            rows.append(ProfileRow(
                id=r["id"], kind="request", gpu="h100-sxm", engine=ENGINE[r["engine"]],
                engine_version=r["engine_version"], model=MODEL[r["model"]], weight_dtype=wd,
                kv_dtype=wd,  # not recorded; the README says to assume it follows the weights
                tp=int(r["tp"]), source=f"{src.name}:{r['id']}",
                concurrency=c, batch_cap=c - 1 if ENGINE[r["engine"]] in QUEUED_ONE and c > 1 else None,
                chunk_tokens=_vllm_bench_budget(ENGINE[r["engine"]], wd, c, int(r["isl"])),
                input_tokens=int(r["isl"]),
                output_tokens=int(r["osl"]), ttft_mean_ms=float(r["ttft_ms"]),
                tpot_mean_ms=float(r["tpot_ms"]), num_requests=n_req, stats_window=window))
    return rows


SILICON_META = """\
# h100-silicon.csv: the 354 closed-loop runs of ../shared/data/h100_silicon_points.csv (from
# NVIDIA's aiconfigurator-core 0.12.0 systems/silicon_sample.csv), one request row each:
# concurrency C clients each sending the next request when the last finishes, fixed input/output
# lengths, mean TTFT and mean TPOT. kv_dtype is not recorded there: taken equal to the weights.
# batch_cap (TensorRT-LLM rows only) = concurrency - 1, inferred, not recorded: their TTFT grows
# with osl x TPOT at slope 1/(C-1), one request always waiting for a slot (see the converter).
# chunk_tokens (vLLM BF16 rows only) = concurrency + input_tokens + 1500, inferred, not recorded:
# aiconfigurator's benchmark mode sets --max-num-batched-tokens = max_batch_size + isl + 1500
# (generator/rule_plugin/benchmark/vllm.rule; see the converter).
# num_requests = 20 x concurrency and stats_window = whole_run (the same vLLM BF16 rows), inferred:
# that benchmark runs aiperf with --num-requests C x 20 after a warm-up phase, its profiling phase
# starts every client at once and its means count every request (see the converter).
# source = original file and id. Converted by bench/fit_shipped_calibrations.py.
gpu: h100-sxm
date: ""
"""


def convert_published(src: Path) -> list[ProfileRow]:
    """P19-P22 as all-at-once request rows (static batch B: rate inf, B requests, measured total
    output tok/s); P23-P26 as batch-1 prefill step rows; P46 as a batch-1 decode step row."""
    out = []
    with src.open(newline="") as f:
        pts = {r["id"]: r for r in csv.DictReader(f)}
    for pid in ("P19", "P20", "P21", "P22"):
        r = pts[pid]
        batch = int(r["batch_or_concurrency"].split()[-1])        # "static batch 896"
        tp = int(r["tp"])
        total = float(r["output_tok_s_per_gpu"]) * tp              # the page reports per GPU
        out.append(ProfileRow(
            id=pid, kind="request", gpu="h100-sxm", engine=ENGINE[r["framework"]],
            engine_version=r["framework_version"], model=MODEL[r["model"]],
            weight_dtype=r["weight_precision"].lower(), kv_dtype=r["kv_cache_dtype"].lower(), tp=tp,
            source=f"{src.name}:{pid}", rate_req_s=math.inf, num_requests=batch,
            input_tokens=int(r["input_len"]), output_tokens=int(r["output_len"]), output_tok_s=total))
    for pid in ("P23", "P24", "P25", "P26"):
        r = pts[pid]
        out.append(ProfileRow(
            id=pid, kind="step", gpu="h100-sxm", engine=ENGINE[r["framework"]],
            engine_version=r["framework_version"], model=MODEL[r["model"]],
            weight_dtype=r["weight_precision"].lower(), kv_dtype=r["kv_cache_dtype"].lower(),
            tp=int(r["tp"]), source=f"{src.name}:{pid}", phase="prefill", batch=1,
            context_tokens=0, chunk_tokens=int(r["input_len"]), step_ms=float(r["ttft_mean_ms"])))
    r = pts["P46"]
    out.append(ProfileRow(
        id="P46", kind="step", gpu="h100-sxm", engine="sglang", engine_version="",
        model="llama-3.1-8b", weight_dtype="bf16", kv_dtype="bf16", tp=1, source=f"{src.name}:P46",
        phase="decode", batch=1, context_tokens=512, step_ms=1000.0 / float(r["output_tok_s_total"])))
    return out


PUBLISHED_META = """\
# h100-published.csv: published H100 points of ../shared/data/h100_calibration_points.csv read as
# kvtune rows (converted by bench/fit_shipped_calibrations.py). How each was read:
# - P19-P22 (TensorRT-LLM 0.9 gptSessionBenchmark, static batching, batch B given, FP8 weights and
#   KV): B identical requests all arriving at once (rate_req_s inf, num_requests = B, batch cap B);
#   the measured figure is the total output tok/s = the page's per-GPU figure x TP. kvtune
#   predicts it as B x output / makespan of the simulated run. In-flight batching in the simulator
#   vs static batching in the benchmark differ only in when finished slots refill, and with equal
#   lengths all B finish together, so the two coincide.
# - P23-P26 (same page, '1st token latency' at batch 1, output length 1): one prefill step of
#   chunk = input length after 0 cached tokens, batch 1.
# - P46 (SGLang docs, Llama-3.1-8B BF16 batch 1, MT-bench, 158.34 tok/s): one decode step of
#   batch 1, step_ms = 1000 / 158.34; context_tokens 512 is our assumption for MT-bench (short
#   prompts, a few hundred generated tokens): the weight read dominates, context barely matters.
# - Left out: P11-P18 (offline max load, batch and scheduler limits not reported, so the
#   simulation has nothing to pin the batch to), P47-P48 (speculative, acceptance not given),
#   P54-P60 (microbenchmarks: they justify the parameter bounds and the starting point, they are
#   not serving points).
gpu: h100-sxm
"""


def convert(shared: Path) -> dict[str, Path]:
    TABLES.mkdir(parents=True, exist_ok=True)
    sil = TABLES / "h100-silicon.csv"
    pub = TABLES / "h100-published.csv"
    _write_table(sil, convert_silicon(shared / "h100_silicon_points.csv"), SILICON_META)
    _write_table(pub, convert_published(shared / "h100_calibration_points.csv"), PUBLISHED_META)
    return {"silicon": sil, "published": pub}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shared", default=str(ROOT.parent / "shared" / "data"))
    ap.add_argument("--convert-only", action="store_true")
    ap.add_argument("--only", action="append", default=[], metavar="NAME",
                    help="refit only this calibration (h100-sxm, h100-sxm-trtllm, ...); repeatable")
    ap.add_argument("--fp8-only", action="store_true",
                    help="fit only the FP8 terms on the FP8 rows, the files' other parameters fixed (the last stage "
                         "of a full refit, in seconds instead of half an hour)")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    paths = convert(Path(args.shared))
    print(f"converted: {paths['silicon']} {paths['published']}")
    if args.convert_only:
        return 0
    from kvtune.optimizer.calibrate import fit_shipped, refit_fp8_shipped
    if args.fp8_only:
        refit_fp8_shipped(paths, CALIB, log=print, only=tuple(args.only))
    else:
        fit_shipped(paths, CALIB, log=print, only=tuple(args.only))
    print(f"total wall time {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
