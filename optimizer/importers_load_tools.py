"""Profile rows from three more load tools' outputs (``optimizer.importers`` dispatches to these).

- ``guidellm``: GuideLLM's ``benchmarks.json`` (``GenerativeBenchmarksReport``, vllm-project/guidellm
  ``src/guidellm/benchmark/schemas/``): ``benchmarks``, one per strategy run, each with
  ``config.strategy`` (``type_`` synchronous / concurrent (``streams``) / throughput
  (``max_concurrency``) / constant and poisson (``rate``)), ``config.backend.model`` and ``metrics``:
  ``request_totals`` and StatusDistributionSummary objects (``successful`` / ``errored`` /
  ``incomplete`` / ``total``, each with ``mean``, ``median``, ``percentiles.p50|p90|p99``) for
  ``time_to_first_token_ms``, ``inter_token_latency_ms``, ``prompt_token_count``,
  ``output_token_count``, ``requests_per_second`` and ``output_tokens_per_second``. One row per
  benchmark, from its successful requests. GuideLLM's ``inter_token_latency_ms`` is kvtune's TPOT
  ((last token - first token) / (output tokens - 1)); its ``time_per_output_token_ms`` counts the
  TTFT too and is not read.
- ``trtllm-bench``: ``trtllm-bench throughput|latency --report_json`` (NVIDIA/TensorRT-LLM
  ``tensorrt_llm/bench/dataclasses/reporting.py`` ``get_statistics_dict``): ``engine`` (``model``,
  ``version``, ``dtype``, ``quantization``, ``kv_cache_dtype``), ``world_info`` (``tp_size``,
  ``pp_size``, ``max_batch_size``, ``max_num_tokens``), ``request_info`` (``num_requests``,
  ``avg_input_length``, ``avg_output_length``), ``performance`` (``request_throughput_req_s``,
  ``system_output_throughput_tok_s``) and, with ``--streaming``, ``streaming_metrics``
  (``avg_ttft_ms``, ``avg_tpot_ms``, ``ttft_percentiles`` / ``tpot_percentiles`` with ``p50``,
  ``p90``, ``p99`` in ms). The report does not record ``--concurrency``: the load comes from the
  caller (``kvtune profile import --concurrency``), by default trtllm-bench throughput's (no limit:
  every request at once).
- ``inference-perf``: a kubernetes-sigs/inference-perf ``stage_N_lifecycle_metrics.json``
  (``inference_perf/reportgen/base.py`` ``summarize_requests``): ``load_summary``
  (``requested_rate``, ``concurrency`` for a concurrent stage), ``successes`` with ``count``,
  ``latency.time_to_first_token`` / ``time_per_output_token`` (seconds: ``mean``, ``median``,
  ``p90``, ``p99``), ``throughput`` (``requests_per_sec``, ``output_tokens_per_sec``),
  ``prompt_tokens`` (``prompt_len`` before 2026-08) and ``output_len``. Its TPOT is kvtune's.

Each builder returns the row's values and, under ``_meta``, the keyword arguments of its
``Metadata``; this module does not import ``optimizer.importers`` (which imports it).
"""

from __future__ import annotations

import math
from datetime import datetime, timezone
from typing import Any

from kvtune.costmodel.checkpoint_format import _MODELOPT
from kvtune.costmodel.dtypes import canonical
from kvtune.costmodel.errors import InputError

from .import_values import Rec, dig, ms, number, short, whole

__all__ = ["guidellm_benchmarks", "guidellm_row", "inference_perf_row", "is_guidellm", "is_inference_perf",
           "is_trtllm_bench", "trtllm_bench_row"]


def is_guidellm(obj: dict) -> bool:
    return isinstance(obj.get("benchmarks"), list) and ("args" in obj or "config" in obj)


def is_trtllm_bench(obj: dict) -> bool:
    return isinstance(obj.get("world_info"), dict) and isinstance(obj.get("performance"), dict)


def is_inference_perf(obj: dict) -> bool:
    return isinstance(obj.get("load_summary"), dict) and "successes" in obj


def _section(rec: Rec, obj: Any, label: str) -> dict:
    """``obj`` must be a JSON object; ``label`` is its dotted key path for the message."""
    if obj is None:
        raise InputError(f"{rec.where}: missing key '{label}'")
    if not isinstance(obj, dict):
        raise InputError(f"{rec.where}: key '{label}' = {short(obj)} is not an object")
    return obj


def _count(rec: Rec, src: dict, key: str, label: str) -> int:
    """A count of successful requests: a whole number >= 1."""
    v = rec.nonneg(key, obj=src, label=label)
    if v != int(v):
        raise InputError(f"{rec.where}: key '{label}' = {src[key]!r} must be a whole number")
    if v < 1:
        raise InputError(f"{rec.where}: key '{label}' = {src[key]!r}: no successful requests")
    return int(v)


def _concurrency(rec: Rec, src: dict, key: str, label: str) -> int:
    v = rec.num(key, obj=src, label=label)
    if v < 1 or v != int(v):
        raise InputError(f"{rec.where}: key '{label}' = {src[key]!r} must be a whole number >= 1")
    return int(v)


def _rate(rec: Rec, src: dict, key: str, label: str) -> float:
    v = rec.num(key, obj=src, label=label)
    if v <= 0:
        raise InputError(f"{rec.where}: key '{label}' = {src[key]!r} must be > 0")
    return v


def _utc(rec: Rec, ts: Any, label: str) -> str | None:
    """A Unix time in seconds as an ISO date (UTC); None where the file has none."""
    if ts is None:
        return None
    t = number(rec.where, label, ts, nonneg=True)
    try:
        return datetime.fromtimestamp(t, tz=timezone.utc).isoformat()
    except (OverflowError, OSError, ValueError):
        raise InputError(f"{rec.where}: key '{label}' = {short(ts)} is not a time") from None


# ---------------------------------------------------------------------------------------------
# GuideLLM: one row per entry of ``benchmarks``.

def guidellm_benchmarks(top: Rec) -> list[Rec]:
    """The report's benchmarks, each a record of its own (``FILE: benchmarks[i]``)."""
    benches = top.obj["benchmarks"]
    if not benches:
        raise InputError(f"{top.where}: key 'benchmarks' is empty: the run finished no benchmark")
    out = []
    for i, b in enumerate(benches):
        if not isinstance(b, dict):
            raise InputError(f"{top.where}: key 'benchmarks[{i}]' = {short(b)} is not an object")
        out.append(Rec(b, f"{top.where}: benchmarks[{i}]", parent=top.obj))
    return out


def guidellm_row(rec: Rec, fmt: str) -> dict[str, Any]:
    o = rec.obj
    config = _section(rec, o.get("config"), "config")
    metrics = _section(rec, o.get("metrics"), "metrics")
    out: dict[str, Any] = {}

    def successful(name: str) -> dict:
        """The successful requests' DistributionSummary of metric ``name``."""
        m = _section(rec, metrics.get(name), f"metrics.{name}")
        return _section(rec, m.get("successful"), f"metrics.{name}.successful")

    def stat(dist: dict, name: str, key: str, optional: bool = False) -> float | None:
        if key.startswith("p"):  # p50, p90, p99 live under "percentiles"
            per = dist.get("percentiles")
            if per is None and optional:
                return None
            per = _section(rec, per, f"metrics.{name}.successful.percentiles")
            return rec.nonneg(key, optional=optional, obj=per, label=f"metrics.{name}.successful.percentiles.{key}")
        return rec.nonneg(key, optional=optional, obj=dist, label=f"metrics.{name}.successful.{key}")

    strategy = _section(rec, config.get("strategy"), "config.strategy")
    kind = strategy.get("type_")
    if kind == "synchronous":
        out["concurrency"] = 1
    elif kind == "concurrent":
        out["concurrency"] = _concurrency(rec, strategy, "streams", "config.strategy.streams")
    elif kind == "throughput":  # as many as it can at once, up to max_concurrency where set
        if strategy.get("max_concurrency") is not None:
            out["concurrency"] = _concurrency(rec, strategy, "max_concurrency", "config.strategy.max_concurrency")
        else:
            out["rate_req_s"] = math.inf
    elif kind in ("constant", "poisson"):
        out["rate_req_s"] = _rate(rec, strategy, "rate", "config.strategy.rate")
        if strategy.get("max_concurrency") is not None:
            out["concurrency"] = _concurrency(rec, strategy, "max_concurrency", "config.strategy.max_concurrency")
    else:
        raise InputError(f"{rec.where}: key 'config.strategy.type_' = {short(kind)}: cannot tell the load "
                         "(expected synchronous, concurrent, throughput, constant or poisson)")

    totals = _section(rec, metrics.get("request_totals"), "metrics.request_totals")
    out["num_requests"] = _count(rec, totals, "successful", "metrics.request_totals.successful")
    for col, name in (("ttft", "time_to_first_token_ms"), ("tpot", "inter_token_latency_ms")):
        dist = successful(name)
        out[f"{col}_mean_ms"] = stat(dist, name, "mean")  # GuideLLM's *_ms metrics are in ms already
        for p in ("p50", "p90", "p99"):
            out[f"{col}_{p}_ms"] = stat(dist, name, p, optional=True)
    for col, name in (("input_tokens", "prompt_token_count"), ("output_tokens", "output_token_count")):
        out[col] = whole(stat(successful(name), name, "mean") or 0.0)
    for col, name in (("output_tok_s", "output_tokens_per_second"), ("request_s", "requests_per_second")):
        out[col] = None if metrics.get(name) is None else stat(successful(name), name, "mean")

    backend = config.get("backend")
    model = backend.get("model") if isinstance(backend, dict) else None
    if not (isinstance(model, str) and model):  # the report's own arguments: v0.7 config.spec, v0.4-0.6 args
        parent = rec.parent or {}
        model = dig(parent, "config", "spec", "backend", "model") or dig(parent, "args", "model")
    start = o.get("start_time", dig(o, "scheduler_metrics", "measure_start_time"))
    return out | {"_meta": {"model": model if isinstance(model, str) and model else None,
                            "date": _utc(rec, start, "start_time")}}


# ---------------------------------------------------------------------------------------------
# trtllm-bench --report_json: times already in ms (ReportUtility.convert_to_ms).

def _trt_format(rec: Rec, algo: Any, dtype: str | None, label: str) -> str | None:
    """kvtune's name for a TensorRT-LLM QuantAlgo (None: unquantized, so ``dtype``); None where
    kvtune has no width for it (NVFP4, 4-bit AWQ/GPTQ...): the flags fill it."""
    if algo is None or (isinstance(algo, str) and algo.upper() in ("", "NONE", "NO_QUANT")):
        return dtype
    if not isinstance(algo, str):
        raise InputError(f"{rec.where}: key '{label}' = {short(algo)} is not a name")
    return _MODELOPT.get(algo.upper())


def trtllm_bench_row(rec: Rec, fmt: str, concurrency: int | None = None) -> dict[str, Any]:
    """``concurrency``: the run's ``--concurrency`` (<= 0: no limit, every request at once, as
    trtllm-bench reads it); None: trtllm-bench throughput's default, no limit."""
    o = rec.obj
    engine = _section(rec, o.get("engine"), "engine")
    world = _section(rec, o.get("world_info"), "world_info")
    req = _section(rec, o.get("request_info"), "request_info")
    perf = _section(rec, o.get("performance"), "performance")
    out: dict[str, Any] = {}
    pp = rec.num("pp_size", optional=True, obj=world, label="world_info.pp_size")
    if pp is not None and pp != 1:
        raise InputError(f"{rec.where}: key 'world_info.pp_size' = {world['pp_size']!r}: a pipeline-parallel run; "
                         "the profile table records tensor parallelism only")
    n = _count(rec, req, "num_requests", "request_info.num_requests")
    out["num_requests"] = n
    out["input_tokens"] = whole(rec.nonneg("avg_input_length", obj=req, label="request_info.avg_input_length"))
    out["output_tokens"] = whole(rec.nonneg("avg_output_length", obj=req, label="request_info.avg_output_length"))
    out["request_s"] = rec.nonneg("request_throughput_req_s", obj=perf, label="performance.request_throughput_req_s")
    out["output_tok_s"] = rec.nonneg("system_output_throughput_tok_s", obj=perf,
                                     label="performance.system_output_throughput_tok_s")
    stream = o.get("streaming_metrics")
    if stream is None:
        raise InputError(f"{rec.where}: missing key 'streaming_metrics': the run had no TTFT or TPOT "
                         "(a run without trtllm-bench's streaming option)")
    stream = _section(rec, stream, "streaming_metrics")
    for col in ("ttft", "tpot"):
        out[f"{col}_mean_ms"] = rec.nonneg(f"avg_{col}_ms", obj=stream, label=f"streaming_metrics.avg_{col}_ms")
        per = stream.get(f"{col}_percentiles")
        if per is not None:
            per = _section(rec, per, f"streaming_metrics.{col}_percentiles")
            for p in ("p50", "p90", "p99"):  # p90 since 2025; nearest rank, sorted[int(n * q)]
                out[f"{col}_{p}_ms"] = rec.nonneg(p, optional=True, obj=per,
                                                  label=f"streaming_metrics.{col}_percentiles.{p}")

    if concurrency is not None and concurrency > 0:
        out["concurrency"] = concurrency
    else:
        out["rate_req_s"] = math.inf  # no limit: every request submitted at once
    cap = rec.num("max_batch_size", optional=True, obj=world, label="world_info.max_batch_size")
    if cap is not None:
        if cap < 1 or cap != int(cap):
            raise InputError(f"{rec.where}: key 'world_info.max_batch_size' = {world['max_batch_size']!r} "
                             "must be a whole number >= 1")
        if cap < out.get("concurrency", n):  # the engine's cap binds: the rest queue for a slot
            out["batch_cap"] = int(cap)
    tokens = rec.num("max_num_tokens", optional=True, obj=world, label="world_info.max_num_tokens")
    if tokens is not None:
        out["chunk_tokens"] = tokens  # the engine's per-step token budget; the row check wants a whole number
    tp = rec.num("tp_size", optional=True, obj=world, label="world_info.tp_size")
    if tp is not None and (tp < 1 or tp != int(tp)):
        raise InputError(f"{rec.where}: key 'world_info.tp_size' = {world['tp_size']!r} must be a whole number >= 1")

    dtype_name = engine.get("dtype")
    dtype = canonical(dtype_name) if isinstance(dtype_name, str) else None
    model, version = engine.get("model"), engine.get("version")
    return out | {"_meta": {
        "model": model if isinstance(model, str) and model else None, "engine": "trtllm",
        "engine_version": version if isinstance(version, str) and version else None,
        "tp": None if tp is None else int(tp),
        "weight_dtype": _trt_format(rec, engine.get("quantization"), dtype, "engine.quantization"),
        "kv_dtype": _trt_format(rec, engine.get("kv_cache_dtype"), dtype, "engine.kv_cache_dtype")}}


# ---------------------------------------------------------------------------------------------
# inference-perf: one stage's lifecycle report; times in seconds.

def inference_perf_row(rec: Rec, fmt: str) -> dict[str, Any]:
    o = rec.obj
    load = _section(rec, o.get("load_summary"), "load_summary")
    ok = _section(rec, o.get("successes"), "successes")
    out: dict[str, Any] = {}
    if load.get("concurrency") is not None:  # a concurrent stage: closed loop (its rate is only the dispatch)
        out["concurrency"] = _concurrency(rec, load, "concurrency", "load_summary.concurrency")
    elif load.get("requested_rate") is not None:
        out["rate_req_s"] = _rate(rec, load, "requested_rate", "load_summary.requested_rate")
    else:
        raise InputError(f"{rec.where}: missing key 'load_summary.requested_rate': cannot tell the load (a "
                         "summary_lifecycle_metrics.json spans every stage: import the stage_N_lifecycle_metrics.json "
                         "files)")
    out["num_requests"] = _count(rec, ok, "count", "successes.count")
    latency = _section(rec, ok.get("latency"), "successes.latency")
    for col, name, required in (("ttft", "time_to_first_token", True), ("tpot", "time_per_output_token", False)):
        dist = latency.get(name)
        if dist is None:
            if required:
                raise InputError(f"{rec.where}: missing key 'successes.latency.{name}': no streamed request "
                                 "(inference-perf measures TTFT on streamed responses with a tokenizer)")
            continue
        label = f"successes.latency.{name}"
        dist = _section(rec, dist, label)
        out[f"{col}_mean_ms"] = ms(rec.nonneg("mean", obj=dist, label=f"{label}.mean"))
        for p, key in (("p50", "median"), ("p90", "p90"), ("p99", "p99")):
            v = rec.nonneg(key, optional=True, obj=dist, label=f"{label}.{key}")
            out[f"{col}_{p}_ms"] = None if v is None else ms(v)
    thr = _section(rec, ok.get("throughput"), "successes.throughput")
    out["output_tok_s"] = rec.nonneg("output_tokens_per_sec", obj=thr, label="successes.throughput.output_tokens_per_sec")
    out["request_s"] = rec.nonneg("requests_per_sec", obj=thr, label="successes.throughput.requests_per_sec")
    for col, keys in (("input_tokens", ("prompt_tokens", "prompt_len")), ("output_tokens", ("output_len", "output_tokens"))):
        key = next((k for k in keys if ok.get(k) is not None), keys[0])
        dist = _section(rec, ok.get(key), f"successes.{key}")
        out[col] = whole(rec.nonneg("mean", obj=dist, label=f"successes.{key}.mean"))
    return out | {"_meta": {}}
