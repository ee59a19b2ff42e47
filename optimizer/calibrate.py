"""Calibration, end to end: read profile tables, fit, report, and write the calibration YAML.

The fitting itself is ``costmodel.fit`` (pure); this module picks rows, resolves the GPU and the
starting efficiencies, and turns a ``FitResult`` into the YAML that ``costmodel.calibration``
loads (``params``) plus the record of how it was made (``uncertainty``, ``fit``, ``inputs``,
``kvtune_version``, ``created``), which the loader ignores.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import hashlib
import math
import time
from pathlib import Path
from typing import Callable, Sequence

import yaml

from kvtune import __version__
from kvtune.costmodel.calibration import ENGINES, efficiency_for, load_calibration, lookup_calibration
from kvtune.costmodel.engines import REGISTRY
from kvtune.costmodel.efficiency import ATTENTION_PARAMS, FP8_PARAMS, IDEAL, PARAM_BOUNDS, Efficiency
from kvtune.costmodel.dtypes import KNOWN as KNOWN_DTYPES, canonical as canonical_dtype
from kvtune.costmodel.errors import DoesNotFit, InputError
from kvtune.costmodel.closed_loop import STAGGERED_ENGINES as _STAGGERED, canonical_engine
from kvtune.costmodel.fit import (FIT_PARAMS, METRICS, FitResult, FoldResult, PointFit, Prior, RowPredictor, cross_validate, evaluate,
                           fit_efficiency, measured_metrics, visible_params)
from kvtune.costmodel.hardware import GPU, get_gpu
from kvtune.costmodel.memory import GPU_MEM_UTIL
from kvtune.costmodel.models import get_model
from kvtune.costmodel.step import StepModel
from kvtune.costmodel.profile_table import ProfileRow, read_table
from kvtune.optimizer.output import write_atomic

__all__ = ["TableInput", "load_tables", "base_path", "resolve_base", "select_rows", "calibrate",
           "calibration_dict", "calibration_yaml", "fit_shipped"]


class TableInput(dict):
    """One input table as recorded in the YAML: path, sha256, rows, source."""


def _sha256(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def _shown(p: Path) -> str:
    try:
        return str(p.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(p)


def load_tables(paths: Sequence[str | Path]) -> tuple[list[ProfileRow], list[TableInput]]:
    if not paths:
        raise InputError("calibrate: give at least one profile table")
    rows, inputs = [], []
    for path in paths:
        p = Path(path)
        t = read_table(p)
        check_row_formats(p, t)
        sources = sorted({_provenance(r.source) for r in t if r.source})
        inputs.append(TableInput(path=_shown(p), sha256=_sha256(p), rows=len(t),
                                 source=", ".join(sources[:4]) or "not recorded"))
        rows.extend(t)
    return rows, inputs


def _provenance(source: str) -> str:
    """A row's source as the calibration records it: whole for a command line or a URL
    (``kvtune profile run --url http://...``), the file part of ``FILE:ROW`` references."""
    head, sep, _ = source.partition(":")
    if sep and " " not in head and head.lower().endswith((".csv", ".json", ".jsonl", ".yaml", ".yml", ".txt")):
        return head  # h100_silicon_points.csv:ID -> the file
    return source


def check_row_formats(path: Path, rows: Sequence[ProfileRow]) -> None:
    """Every row's weight and KV formats must be ones kvtune has a byte width for
    (``costmodel.dtypes``: bf16, fp16/f16, fp8, q4_0, q4_1, q8_0, ...); the error names file and row."""
    for r in rows:
        for key in ("weight_dtype", "kv_dtype"):
            v = getattr(r, key)
            if canonical_dtype(v) is None:
                raise InputError(f"{path}: row {r.id}: {key} = {v!r} is not a format kvtune knows "
                                 f"(known: {', '.join(KNOWN_DTYPES)}; spellings such as f16, fp8_e4m3, Q4_K_M too)")


def base_path(base: str, gpu: GPU, engine: str | None) -> Path | None:
    """The calibration file ``base`` names (None for ideal): the shipped one for ``calibrated``."""
    if base == "ideal":
        return None
    return lookup_calibration("calibrated", gpu.name, None if base == "calibrated" else base, engine).path


def resolve_base(base: str, gpu: GPU, engine: str | None) -> Efficiency:
    """Where the fit starts and what unfitted parameters keep: ``base`` is ideal, calibrated (the
    shipped calibration) or a calibration file."""
    if base == "ideal":
        return IDEAL.with_params(model_comm=True, name="ideal")
    if base == "calibrated":
        return efficiency_for("calibrated", gpu.name, None, engine)
    return load_calibration(base)


def select_rows(rows: Sequence[ProfileRow], gpu: GPU, engine: str | None) -> tuple[list[ProfileRow], list[str]]:
    """Rows for this GPU (rows that name none count) and engine; notes say what was left out."""
    notes = []
    if engine is not None and engine not in ENGINES:
        raise InputError(f"calibrate: --engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    keep = [r for r in rows if not r.gpu or r.gpu == gpu.name]
    if len(keep) < len(rows):
        notes.append(f"{len(rows) - len(keep)} rows for other GPUs left out")
    if engine:
        n = len(keep)
        keep = [r for r in keep if not r.engine or canonical_engine(r.engine) == engine]
        if len(keep) < n:
            notes.append(f"{n - len(keep)} rows of other engines left out")
    if not keep:
        raise InputError(f"calibrate: no rows for gpu {gpu.name}{' engine ' + engine if engine else ''} in the tables")
    return keep, notes


# What `kvtune calibrate` fits unless --params says: FIT_PARAMS the rows can see, and decode
# attention's rate where the rows reject its neutral value 1 (attention as fast as the GEMMs, the
# model without the term): fitted more than 2 sigma from 1, off its bounds, correlation with every
# other fitted parameter within +-0.9. Otherwise it is refitted without it, kept at 1, and the
# notes say why. On the committed CPU table it is 0.155 +- 0.085 (10 sigma from 1, correlation
# -0.78 with decode_flops_efficiency). The shipped H100 files are fitted on FIT_PARAMS alone
# (fit_shipped), as they were.
DEFAULT_CANDIDATES = FIT_PARAMS + ATTENTION_PARAMS


def calibrate(rows: Sequence[ProfileRow], gpu: GPU, base: Efficiency, params: Sequence[str] | None = None,
              predict: Callable | None = None, max_nfev: int = 60, name: str = "fitted",
              metrics: Sequence[str] | None = None, candidates: Sequence[str] = DEFAULT_CANDIDATES,
              prior: Prior | None = None) -> FitResult:
    """Fit ``rows`` from ``base`` (``costmodel.fit.fit_efficiency``), pulled toward ``prior`` when
    given; decode attention's rate only where the rows separate it (see DEFAULT_CANDIDATES)."""
    predict = predict or RowPredictor(gpu)
    res = fit_efficiency(rows, gpu, base, params, predict, max_nfev=max_nfev, name=name, metrics=metrics,
                         candidates=candidates, prior=prior)
    loose = [n for n in ATTENTION_PARAMS if params is None and n in res.fitted and not _separated(res, n)]
    if not loose:
        return res
    again = fit_efficiency(rows, gpu, base, None, predict, max_nfev=max_nfev, name=name, metrics=metrics,
                           candidates=[c for c in candidates if c not in loose], prior=prior)
    why = [f"{n} not kept: {getattr(res.efficiency, n):.3g} +- {res.uncertainty[n]:.2g} in the joint fit"
           + "".join(f", correlation {c:+.2f} with {b}" for b, c in res.correlation.get(n, {}).items()
                     if abs(c) > FP8_SEPARABLE_CORR)
           + f"; the rows do not separate it from {ATTENTION_NEUTRAL:g} (kept at {getattr(base, n):g})"
           for n in loose]
    return dataclasses.replace(again, notes=again.notes + tuple(why))


ATTENTION_NEUTRAL = 1.0      # decode_attn_efficiency that leaves the model as it was
ATTENTION_REJECT_SIGMA = 2.0


def _separated(res: FitResult, n: str) -> bool:
    """The fit moved ``n`` more than 2 sigma from its neutral value, off its bounds, with
    correlation within +-0.9 with every other fitted parameter."""
    v, sd = getattr(res.efficiency, n), res.uncertainty[n]
    lo, hi = PARAM_BOUNDS[n]
    on_bound = not lo + 1e-9 * (hi - lo) < v < hi - 1e-9 * (hi - lo)
    moved = math.isfinite(sd) and abs(v - ATTENTION_NEUTRAL) > ATTENTION_REJECT_SIGMA * sd and not on_bound
    return moved and all(abs(c) <= FP8_SEPARABLE_CORR for c in res.correlation.get(n, {}).values())


def _r(x: float, sig: int = 4) -> float:
    return float(f"{x:.{sig}g}") if math.isfinite(x) else x


def calibration_dict(result: FitResult, name: str, gpu: GPU, engine: str | None, inputs: Sequence[dict],
                     base_name: str, notes: Sequence[str] = (), cross_validation: Sequence[FoldResult | dict] = (),
                     wall_s: float | None = None, extra: dict | None = None) -> dict:
    eff = result.efficiency
    engines = sorted({p.engine for p in result.points if p.engine})
    fit = {
        "points": len(result.points),
        "rows": len({p.id for p in result.points}),
        "fitted": list(result.fitted),
        "base": base_name,
        "mape_before_pct": {k: _r(v, 3) for k, v in result.mape_by_metric(False).items()},
        "mape_after_pct": {k: _r(v, 3) for k, v in result.mape_by_metric(True).items()},
        "per_engine": {e: {m: _r(result.mape(True, m, e), 3) for m in METRICS
                           if any(p.metric == m and p.engine == e for p in result.points)} for e in engines},
        "rms_log_residual": _r(result.rms_log_residual, 3),
        "solver": {"success": result.success, "message": result.message, "nfev": result.nfev},
        "notes": list(notes) + list(result.notes),
    }
    if wall_s is not None:
        fit["wall_s"] = round(wall_s, 1)
    if cross_validation:
        fit["cross_validation"] = [_fold_record(f) for f in cross_validation]
    if extra:
        fit.update(extra)
    return {
        "name": name,
        "gpu": gpu.name,
        "engine": engine or "any",
        "kvtune_version": __version__,
        "created": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "params": {k: _r(getattr(eff, k), 5) for k in PARAM_BOUNDS},
        "uncertainty": {k: _r(result.uncertainty.get(k, 0.0), 2) for k in PARAM_BOUNDS},
        "fit": fit,
        "inputs": [dict(i) for i in inputs],
    }


def _fold_record(f: FoldResult | dict) -> dict:
    """A fold as ``fit.cross_validation`` records it: a ``FoldResult``, or a held-out fold's record
    (``costmodel.fit.HeldOutFold``, which adds the prior's MAPE and what was extrapolated)."""
    if isinstance(f, dict):
        return {k: ({m: _r(x, 3) for m, x in v.items()} if isinstance(v, dict) else
                    _r(v, 3) if isinstance(v, float) else v) for k, v in f.items()}
    return {"held_out": f.held_out, "fit_points": f.fit_points, "test_points": f.test_points,
            "mape_pct": {k: _r(v, 3) for k, v in f.mape_by_metric.items()}, "max_abs_err_pct": _r(f.max_abs_err_pct, 3)}


_HEADER = ("# Fitted by 'kvtune calibrate' (costmodel.fit): params are what kvtune uses; uncertainty is one\n"
           "# standard deviation from the Jacobian (a lower bound: it assumes the model form is right);\n"
           "# parameters with uncertainty 0 were not fitted and keep the base value (see fit.notes).\n")


def calibration_yaml(d: dict) -> str:
    text = _HEADER + yaml.safe_dump(d, sort_keys=False, default_flow_style=None, width=110)
    # what we write must load back (and within bounds): fail before anything touches the disk
    Efficiency().with_params(**{k: float(v) for k, v in yaml.safe_load(text)["params"].items()})
    return text


# ---- the shipped H100 files ------------------------------------------------------------------
# The efficiencies are fitted to TPOT, step times and throughput. vLLM's TTFT in the silicon
# closed-loop runs carries queueing kvtune cannot reproduce (~3 prefills even at concurrency 8, flat
# in the output length); fitting it drags the efficiencies to unphysical values that break TPOT, so
# it is reported, not fitted. SGLang's is fitted (below). TensorRT-LLM's
# is explained once its rows carry batch_cap = concurrency - 1 (bench/fit_shipped_calibrations.py):
# then a second stage fits request_overhead_s alone to its TTFT at concurrency <= TTFT_MAX_CONCURRENCY
# (above that TTFT jumps by up to a second while TPOT stays put: a queue the data does not explain).
SHIPPED_METRICS = ("step_ms", "tpot_ms", "output_tok_s")
TTFT_STAGE_ENGINES = tuple(sorted(e.name for e in REGISTRY.values() if e.fit_ttft_stage))  # costmodel.engines
TTFT_MAX_CONCURRENCY = 32
# SGLang prefills a waiting prompt in a batch of its own while the decodes wait
# (costmodel.fit.PREFILL_FIRST_ENGINES), so clients that start together stay in lock-step: each
# round's prompts are prefilled together, then all decode together. Its TPOT then carries no
# prefill at all and TTFT is the only figure that sees the prefill rate, so TTFT is fitted with
# the rest, on runs whose clients' prompts and outputs fit the KV pool with room to spare.
TTFT_JOINT_ENGINES = tuple(sorted(e.name for e in REGISTRY.values() if e.fit_ttft_joint))
# Above POOL_PRESSURE, SGLang's admission (which holds room for the outputs: costmodel.fit.
# OUTPUT_RESERVE_ENGINES) keeps requests waiting for whole lifetimes, so those runs' TTFT measures
# the pool's size, which the runs did not record. A second stage fits activation_reserve_bytes (per
# GPU, held back from the pool) to those TTFTs alone, the first stage's parameters fixed, by a scan
# of POOL_RESERVE_GRID_GB refined to POOL_RESERVE_STEP_GB: TTFT is a step function of the pool, so a
# gradient solver does not move.
POOL_STAGE_ENGINES = tuple(sorted(e.name for e in REGISTRY.values() if e.fit_pool_stage))
POOL_PRESSURE = 0.7
POOL_RESERVE_GRID_GB = tuple(x * 0.25 for x in range(41))   # 0 to 10 GB per GPU
POOL_RESERVE_STEP_GB = 0.02
# vLLM's and TensorRT-LLM's mixed steps let a long run's clients drift apart (costmodel.closed_loop)
STAGGERED_ENGINES = tuple(sorted(_STAGGERED))
_SHIPPED = (
    # name, engine, tables, cross-validation key
    ("h100-sxm-trtllm", "trtllm", ("silicon", "published"), "tp"),
    ("h100-sxm-vllm", "vllm", ("silicon",), "tp"),
    ("h100-sxm-sglang", "sglang", ("silicon", "published"), "tp"),
    ("h100-sxm", None, ("silicon", "published"), "engine"),
)


def _fit_request_overhead(res: FitResult, rows: Sequence[ProfileRow], gpu: GPU, predict: Callable,
                          max_nfev: int) -> FitResult:
    """Second stage: ``request_overhead_s`` alone, on TTFT at concurrency <= TTFT_MAX_CONCURRENCY,
    the first stage's efficiencies fixed. It moves TTFT only, so TPOT and the rest keep their fit;
    the result's points are every row's, re-predicted."""
    low = [r for r in rows if r.concurrency and r.concurrency <= TTFT_MAX_CONCURRENCY and r.ttft_mean_ms]
    st = fit_efficiency(low, gpu, res.efficiency, ["request_overhead_s"], predict, max_nfev=max_nfev,
                        name=res.efficiency.name, metrics=("ttft_ms",))
    eff = st.efficiency
    after = {(p.id, p.metric): p.after for p in evaluate(rows, eff, predict)}
    points = tuple(PointFit(p.id, p.metric, p.measured, p.before, after[(p.id, p.metric)], p.engine, p.model, p.tp)
                   for p in res.points)
    unc = {**res.uncertainty, "request_overhead_s": st.uncertainty["request_overhead_s"]}
    return FitResult(eff, res.fitted + ("request_overhead_s",), unc, points, res.notes + st.notes,
                     res.success and st.success, res.message, res.nfev + st.nfev, res.rms_log_residual)


def _fit_pool_reserve(res: FitResult, pool_rows: Sequence[ProfileRow], rows: Sequence[ProfileRow], gpu: GPU,
                      base: Efficiency, predict: Callable) -> FitResult:
    """Second stage for pool-bound runs: ``activation_reserve_bytes`` alone, scanned against the
    TTFT of ``pool_rows`` (rms of log residuals), the first stage's parameters fixed. The result's
    points are every row's with the pool-bound TTFTs added, all re-predicted; the uncertainty is half
    the span of the fine scan's values within 1.25x of the best rms."""
    ttft_rows = [dataclasses.replace(r, tpot_mean_ms=None, output_tok_s=None) for r in pool_rows]

    def rms(gb: float) -> float:
        try:
            pts = evaluate(ttft_rows, res.efficiency.with_params(activation_reserve_bytes=gb * 1e9), predict)
        except DoesNotFit:
            return math.inf  # a reserve that leaves no pool on some run
        lr = [math.log(p.after / p.measured) for p in pts]
        return math.sqrt(sum(x * x for x in lr) / len(lr)) if all(map(math.isfinite, lr)) else math.inf

    hi = PARAM_BOUNDS["activation_reserve_bytes"][1] / 1e9
    coarse = {g: rms(g) for g in POOL_RESERVE_GRID_GB if g <= hi}
    best = min(coarse, key=coarse.__getitem__)
    span = POOL_RESERVE_GRID_GB[1] - POOL_RESERVE_GRID_GB[0]
    n = int(round(span / POOL_RESERVE_STEP_GB))
    fine = {g: rms(g) for g in (round(best + k * POOL_RESERVE_STEP_GB, 6) for k in range(-n, n + 1)) if 0 <= g <= hi}
    best = min(fine, key=fine.__getitem__)
    near = [g for g, v in fine.items() if v <= 1.25 * fine[best]]
    eff = res.efficiency.with_params(activation_reserve_bytes=best * 1e9)
    all_rows = list(rows) + ttft_rows
    before = {(p.id, p.metric): p.before for p in res.points}
    points = []
    for p in evaluate(all_rows, eff, predict):
        b = before.get((p.id, p.metric))
        if b is None:
            b = evaluate([next(r for r in ttft_rows if r.id == p.id)], base, predict)[0].after
        points.append(PointFit(p.id, p.metric, p.measured, b, p.after, p.engine, p.model, p.tp))
    unc = {**res.uncertainty, "activation_reserve_bytes": (max(near) - min(near)) / 2 * 1e9}
    note = (f"activation_reserve_bytes: second stage, {best:.2f} GB per GPU from a scan against the TTFT of the "
            f"{len(ttft_rows)} pool-bound runs (rms log residual {fine[best]:.3f}; "
            f"{coarse[POOL_RESERVE_GRID_GB[0]]:.3f} with no reserve)")
    lr = [math.log(p.after / p.measured) for p in points]
    return FitResult(eff, res.fitted + ("activation_reserve_bytes",), unc, tuple(points), res.notes + (note,),
                     res.success, res.message, res.nfev + len(coarse) + len(fine),
                     math.sqrt(sum(x * x for x in lr) / len(lr)))


def pool_pressure(row: ProfileRow, gpu: GPU, eff: Efficiency, gpu_mem_util: float = GPU_MEM_UTIL) -> float:
    """Share of one replica's KV pool that a closed-loop row's clients fill with whole requests:
    concurrency x (input + output tokens) / pool tokens (0 for rows that are not closed loops)."""
    if not (row.concurrency and row.input_tokens and row.output_tokens):
        return 0.0
    sm = StepModel(get_model(row.model), gpu, row.tp, row.weight_dtype, row.kv_dtype, eff, gpu_mem_util=gpu_mem_util)
    return row.concurrency * (row.input_tokens + row.output_tokens) / sm.memory.kv_pool_tokens


def _without_pool_bound_ttft(rows: Sequence[ProfileRow], gpu: GPU, eff: Efficiency
                             ) -> tuple[list[ProfileRow], list[ProfileRow]]:
    """The rows with the TTFT of pool-bound runs taken out, and those runs as they were."""
    out, pool_bound = [], []
    for r in rows:
        if r.ttft_mean_ms and pool_pressure(r, gpu, eff) > POOL_PRESSURE:
            pool_bound.append(r)
            r = dataclasses.replace(r, ttft_mean_ms=None)
        out.append(r)
    return out, pool_bound


# ---- FP8 as its own physics ---------------------------------------------------------------------
# The FP8 terms (costmodel.efficiency.FP8_PARAMS) are fitted last, on the FP8 rows alone, every
# other parameter fixed at the bf16 fit: FP8 rows are a handful among hundreds, so a joint fit
# would let them pull on nothing but these terms anyway. A term is "separated" when the rows see it,
# its one-sigma is under half its value (efficiencies) or under 1 ms (the overhead), and its
# correlation with every other fitted FP8 term is within +-0.9; otherwise the file says the data
# cannot separate it. Figures used per engine as in the bf16 stage (vLLM's TTFT carries queueing
# kvtune does not model, see SHIPPED_METRICS).
FP8_SEPARABLE_CORR = 0.9
FP8_NOT_USED = ("P11-P18 of h100_calibration_points.csv (TensorRT-LLM 0.14 offline max-load FP8/FP16 pairs) are "
                "not in the tables: their batch and request count are not reported, so no run kvtune can "
                "simulate reproduces them")


def is_fp8_row(r: ProfileRow) -> bool:
    return canonical_dtype(r.weight_dtype) == "fp8" or canonical_dtype(r.kv_dtype) == "fp8"


def fit_fp8_terms(rows: Sequence[ProfileRow], gpu: GPU, base: Efficiency, predict: Callable,
                  metrics: Sequence[str] | None, max_nfev: int = 30) -> tuple[Efficiency, dict, dict]:
    """Fit the FP8 terms to the FP8 rows of ``rows`` (the rest of ``base`` fixed). Returns the
    efficiency, the one-sigma of each FP8 term (0: not fitted) and the report the calibration
    file records under ``fit.fp8``."""
    fp8 = [r for r in rows if is_fp8_row(r)]
    unc = {n: 0.0 for n in FP8_PARAMS}
    rep: dict = {"rows": len(fp8), "metrics": list(metrics) if metrics else list(METRICS), "fitted": [],
                 "separated": {}, "notes": []}
    if not fp8:
        rep["notes"].append("no FP8 rows: the FP8 terms keep 1 / 0 (FP8 runs at bf16's fitted efficiencies, "
                            "scaled to the FP8 datasheet rates and byte widths); the data cannot separate them")
        rep["separated"] = {n: False for n in FP8_PARAMS}
        return base, unc, rep
    figures = [1 for r in fp8 for k in measured_metrics(r) if metrics is None or k in metrics]
    vis = visible_params(fp8, base, FP8_PARAMS, predict, metrics)
    for n in FP8_PARAMS:
        if n not in vis:
            rep["notes"].append(f"{n}: no FP8 figure depends on it; kept at {getattr(base, n):g}")
    while vis and len(figures) < len(vis) + 1:
        dropped = vis.pop()
        rep["notes"].append(f"{dropped}: {len(figures)} FP8 figures cannot fit {len(vis) + 1} terms; kept at "
                            f"{getattr(base, dropped):g}")
    if not vis:
        rep["separated"] = {n: False for n in FP8_PARAMS}
        return base, unc, rep
    def judge(res, names) -> dict[str, bool]:
        sep = {}
        for n in names:
            v, sd = getattr(res.efficiency, n), res.uncertainty[n]
            lo, hi = PARAM_BOUNDS[n]
            on_bound = not lo + 1e-9 * (hi - lo) < v < hi - 1e-9 * (hi - lo)
            tight = math.isfinite(sd) and sd < (1e-3 if n.endswith("_s") else 0.5 * abs(v)) and not on_bound
            apart = all(abs(c) <= FP8_SEPARABLE_CORR for c in res.correlation.get(n, {}).values())
            sep[n] = bool(tight and apart)
        return sep

    rep["figures"] = len(figures)
    joint = fit_efficiency(fp8, gpu, base, vis, predict, max_nfev=max_nfev, name=base.name, metrics=metrics)
    sep = judge(joint, vis)
    rep["joint_fit"] = {n: {"value": _r(getattr(joint.efficiency, n), 4), "sigma": _r(joint.uncertainty[n], 2)}
                        for n in vis}
    rep["correlation"] = {a: {b: _r(c, 2) for b, c in d.items()} for a, d in joint.correlation.items()}
    for n in vis:
        if not sep[n]:
            v, sd = getattr(joint.efficiency, n), joint.uncertainty[n]
            others = [b for b, c in joint.correlation.get(n, {}).items() if abs(c) > FP8_SEPARABLE_CORR]
            rep["notes"].append(f"{n} = {v:.3g} +- {sd:.2g} in the joint fit" + (
                f", correlation with {', '.join(others)} beyond +-{FP8_SEPARABLE_CORR}" if others else "")
                + ": the FP8 rows cannot separate it from bf16 or from the other FP8 terms")
    keep = [n for n in vis if sep[n]]
    if keep == vis:
        res = joint
    elif keep:
        # the separated terms alone; the others stay at their bf16 equivalents
        res = fit_efficiency(fp8, gpu, base, keep, predict, max_nfev=max_nfev, name=base.name, metrics=metrics)
        keep = [n for n, ok in judge(res, keep).items() if ok] or keep
    else:
        # nothing separates: the rows fix one combination. Carry it in the single term that fits it best
        # (lowest rms log residual), said so; it stands for the combination, not for that term alone
        singles = [fit_efficiency(fp8, gpu, base, [n], predict, max_nfev=max_nfev, name=base.name, metrics=metrics)
                   for n in vis if not n.endswith("_s")]
        singles = [r for r in singles if judge(r, r.fitted)[r.fitted[0]]]
        if not singles:
            rep["separated"] = {n: False for n in FP8_PARAMS}
            rep["notes"].append("no single FP8 term is determined either: all kept at their bf16 equivalents")
            return base, unc, rep
        res = min(singles, key=lambda r: r.rms_log_residual)
        keep = list(res.fitted)
        rep["notes"].append(f"{keep[0]} alone carries the combination the FP8 rows fix (rms log residual "
                            f"{res.rms_log_residual:.3f}); read it as FP8's net speed on these rows, not as "
                            f"{keep[0]} separated from the others")
    eff = res.efficiency
    unc.update({n: res.uncertainty[n] for n in keep})
    rep["fitted"] = list(keep)
    rep["separated"] = {n: (n in keep and sep.get(n, False)) for n in FP8_PARAMS}
    rep["mape_before_pct"] = {k: _r(v, 3) for k, v in res.mape_by_metric(False).items()}
    rep["mape_after_pct"] = {k: _r(v, 3) for k, v in res.mape_by_metric(True).items()}
    return eff, unc, rep


def fit_shipped(tables: dict[str, Path], outdir: Path, log: Callable[[str], None] = print,
                max_nfev: int = 30, cv: bool = True, only: tuple[str, ...] = ()) -> dict[str, dict]:
    """Fit and write the shipped H100 calibrations (used by bench/fit_shipped_calibrations.py);
    ``only`` names the ones to refit (default all)."""
    gpu = get_gpu("h100-sxm")
    predict = RowPredictor(gpu, stagger=STAGGERED_ENGINES)
    out = {}
    for name, engine, which, cv_key in _SHIPPED:
        if only and name not in only:
            continue
        rows, inputs = load_tables([tables[k] for k in which])
        rows, notes = select_rows(rows, gpu, engine)
        notes = list(notes) + [
            f"closed-loop rows of {', '.join(STAGGERED_ENGINES)} simulated with staggered clients (kvtune calibrate "
            f"--clients staggered), SGLang's with clients starting together and prefill batches of their own"]
        base = resolve_base("ideal", gpu, engine)
        t0 = time.perf_counter()
        metrics: tuple[str, ...] = SHIPPED_METRICS
        params: tuple[str, ...] | None = None
        pool_bound: list[ProfileRow] = []
        if engine in TTFT_JOINT_ENGINES:
            rows, pool_bound = _without_pool_bound_ttft(rows, gpu, base)
            metrics, params = SHIPPED_METRICS + ("ttft_ms",), FIT_PARAMS + ("request_overhead_s",)
            notes.append(f"ttft_ms and request_overhead_s fitted with the rest (prefill-first lock-step runs), "
                         f"except the TTFT of {len(pool_bound)} runs whose clients fill over {POOL_PRESSURE:.0%} "
                         f"of the KV pool (0.9 x 80 GB - weights)")
        res = calibrate(rows, gpu, base, params, predict, max_nfev=max_nfev, name=name, metrics=metrics,
                        candidates=FIT_PARAMS)
        if engine in POOL_STAGE_ENGINES and pool_bound:
            res = _fit_pool_reserve(res, pool_bound, rows, gpu, base, predict)
        if engine in TTFT_STAGE_ENGINES:
            res = _fit_request_overhead(res, rows, gpu, predict, max_nfev)
            notes.append(f"request_overhead_s: second stage, TTFT of closed-loop rows at concurrency <= "
                         f"{TTFT_MAX_CONCURRENCY} only, the other parameters fixed")
        eff8, unc8, fp8_report = fit_fp8_terms(rows, gpu, res.efficiency, predict, metrics, max_nfev)
        res = dataclasses.replace(res, efficiency=eff8, uncertainty={**res.uncertainty, **unc8},
                                  fitted=res.fitted + tuple(fp8_report["fitted"]))
        fp8_report["notes"].append(FP8_NOT_USED)
        wall = time.perf_counter() - t0
        folds = []
        if cv:
            key = (lambda r: r.tp) if cv_key == "tp" else (lambda r: r.engine)
            folds = cross_validate(rows, gpu, res.efficiency, key, None, predict, max_nfev=max_nfev // 2,
                                   label=cv_key, metrics=metrics)
        d = calibration_dict(res, name, gpu, engine, inputs, "ideal", notes, folds, wall, extra={"fp8": fp8_report})
        write_atomic(outdir / f"{name}.yaml", calibration_yaml(d))
        log(f"{name}: {len(res.points)} points, fit {wall:.0f} s, MAPE before {d['fit']['mape_before_pct']} "
            f"after {d['fit']['mape_after_pct']}")
        for k in res.fitted:
            log(f"    {k} = {getattr(res.efficiency, k):.4g} +- {res.uncertainty[k]:.2g}")
        for f in folds:
            log(f"    CV {f.held_out}: {f.test_points} points, MAPE {f.mape_by_metric}, max {f.max_abs_err_pct:.0f}%")
        out[name] = d
    return out


def refit_fp8_shipped(tables: dict[str, Path], outdir: Path, log: Callable[[str], None] = print,
                      max_nfev: int = 30, only: tuple[str, ...] = ()) -> dict[str, dict]:
    """The FP8 stage alone on the shipped files as they are (their other parameters fixed): what
    ``fit_shipped`` does last, without the bf16 stages' half hour of CPU. Rewrites each file's FP8
    params, their uncertainty and ``fit.fp8``; everything else is kept."""
    gpu = get_gpu("h100-sxm")
    predict = RowPredictor(gpu, stagger=STAGGERED_ENGINES)
    out = {}
    for name, engine, which, _ in _SHIPPED:
        if only and name not in only:
            continue
        path = outdir / f"{name}.yaml"
        d = yaml.safe_load(path.read_text())
        base = load_calibration(path)
        rows, _ = load_tables([tables[k] for k in which])
        rows, _ = select_rows(rows, gpu, engine)
        metrics = SHIPPED_METRICS + (("ttft_ms",) if engine in TTFT_JOINT_ENGINES else ())
        if engine in TTFT_JOINT_ENGINES:
            rows, _ = _without_pool_bound_ttft(rows, gpu, base)
        eff, unc, rep = fit_fp8_terms(rows, gpu, base, predict, metrics, max_nfev)
        rep["notes"].append(FP8_NOT_USED)
        rep["stage"] = "refit_fp8_shipped: FP8 terms alone, the file's other parameters fixed"
        for k in FP8_PARAMS:
            d["params"][k] = _r(getattr(eff, k), 5)
            d["uncertainty"][k] = _r(unc[k], 2)
        d["fit"]["fp8"] = rep
        d["fit"]["fitted"] = [k for k in d["fit"]["fitted"] if k not in FP8_PARAMS] + rep["fitted"]
        write_atomic(path, calibration_yaml(d))
        log(f"{name}: FP8 rows {rep['rows']}, fitted {rep['fitted'] or 'none'}, "
            f"MAPE {rep.get('mape_before_pct', {})} -> {rep.get('mape_after_pct', {})}")
        for k in FP8_PARAMS:
            log(f"    {k} = {getattr(eff, k):.4g} +- {unc[k]:.2g}  separated: {rep['separated'].get(k)}")
        for n in rep["notes"]:
            log(f"    note: {n}")
        out[name] = d
    return out
