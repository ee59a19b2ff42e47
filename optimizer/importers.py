"""Read serving-benchmark outputs into kvtune profile rows (``kind=request``; see profiles/README.md).

Formats (detected from content, or named):

- ``vllm``: ``vllm bench serve --save-result`` JSON (or ``--append-result``: one object per line).
  Keys from ``vllm/benchmarks/serve.py``: ``max_concurrency``, ``request_rate`` (``"inf"``),
  ``completed``, ``total_input_tokens``, ``total_output_tokens``, ``request_throughput``,
  ``output_throughput``, ``mean|median|p99_ttft_ms``, ``..._tpot_ms``; with ``--save-detailed``
  the per-request arrays ``input_lens``, ``output_lens``, ``ttfts``, ``itls`` (seconds),
  ``latencies`` (newer versions) and ``errors``, from which we recompute every percentile.
- ``sglang``: ``python -m sglang.bench_serving`` JSONL, one object per run, appended; may hold
  ``Infinity`` (``request_rate``). Same metric names, ``mean_e2e_latency_ms`` instead of e2el,
  optional detail arrays with ``--output-details``.
- ``genai-perf``: ``profile_export_genai_perf.json``: metric objects ``{"unit", "avg", "p50",
  "p90", "p99", ...}`` plus ``input_config`` (the CLI arguments, or the config tree of newer
  versions).
- ``aiperf``: ``profile_export_aiperf.json``: the same metric objects at top level (or under
  ``records`` in early versions), ``input_config.loadgen.concurrency``,
  ``input_config.endpoint.model_names``.
- ``llmperf``: LLMPerf ``*_summary.json`` (``token_benchmark_ray.py``): flat keys
  ``results_ttft_s_mean``, ``results_ttft_s_quantiles_p50`` ..., ``num_concurrent_requests``.
- ``guidellm`` (GuideLLM ``benchmarks.json``, one row per benchmark), ``trtllm-bench``
  (``--report_json``) and ``inference-perf`` (``stage_N_lifecycle_metrics.json``): read by
  ``optimizer.importers_load_tools``, whose docstring names their keys.

TPOT means time per output token after the first: (latency - TTFT) / (output tokens - 1), per
request, as vLLM, SGLang, genai-perf and AIPerf define it (their ``inter_token_latency``), and
GuideLLM (``inter_token_latency_ms``), trtllm-bench and inference-perf (``time_per_output_token``). LLMPerf's
``inter_token_latency_s`` is different (it counts the TTFT too, divided by all output tokens), so
for LLMPerf we derive only the mean, from the mean end-to-end latency and mean TTFT.
"""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from kvtune.costmodel.errors import InputError
from kvtune.costmodel.files import read_text, reading
from kvtune.costmodel.profile_table import COLUMNS, METADATA_COLUMNS, ProfileRow, check_value, first_repeat

from . import importers_load_tools as _load_tools
from .import_values import Rec as _Rec
from .import_values import dig as _dig
from .import_values import num_or_none as _num_or_none
from .import_values import number as _number
from .import_values import short as _short
from .import_values import whole as _whole

__all__ = ["FORMATS", "Metadata", "detect_format", "import_file", "import_files", "latency_summary",
           "rows_to_csv"]

FORMATS = ("vllm", "sglang", "genai-perf", "aiperf", "llmperf", "guidellm", "trtllm-bench", "inference-perf")
# the formats whose file does not record the load: ``--concurrency`` gives it (``import_file(concurrency=)``)
_LOAD_FROM_CALLER = ("trtllm-bench",)

# A benchmark client's ``backend`` names the engine only for these values (``openai`` does not).
_BACKEND_ENGINE = {"vllm": "vllm", "vllm-chat": "vllm", "sglang": "sglang", "sglang-oai": "sglang",
                   "sglang-native": "sglang", "sglang-oai-chat": "sglang", "lmdeploy": "lmdeploy",
                   "lmdeploy-chat": "lmdeploy", "trt": "trtllm", "tensorrt-llm": "trtllm",
                   "tgi": "tgi", "llama.cpp": "llama.cpp"}
_TIME_UNIT_MS = {"ns": 1e-6, "us": 1e-3, "µs": 1e-3, "ms": 1.0, "s": 1e3, "sec": 1e3}


@dataclass(frozen=True)
class Metadata:
    """Metadata for every row; ``None`` means "not given". ``fill`` keeps the first known value."""

    model: str | None = None
    gpu: str | None = None
    tp: int | None = None
    engine: str | None = None
    engine_version: str | None = None
    weight_dtype: str | None = None
    kv_dtype: str | None = None
    date: str | None = None
    source: str | None = None

    def __post_init__(self):
        if self.tp is not None and (not isinstance(self.tp, int) or self.tp < 1):
            raise InputError(f"--tp must be a whole number >= 1, got {self.tp!r}")

    def fill(self, fallback: "Metadata") -> "Metadata":
        return Metadata(**{k: (getattr(self, k) if getattr(self, k) not in (None, "") else getattr(fallback, k))
                           for k in self.__dataclass_fields__})

    def row_fields(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in METADATA_COLUMNS if getattr(self, k) not in (None, "")}


def latency_summary(values_ms: Sequence[float]) -> tuple[float, float, float, float]:
    """Mean, p50, p90, p99 (numpy's linear interpolation, as vLLM and SGLang report them)."""
    a = np.asarray(values_ms, dtype=float)
    if a.size == 0:
        raise ValueError("no samples")
    return (float(a.mean()), float(np.percentile(a, 50)), float(np.percentile(a, 90)),
            float(np.percentile(a, 99)))


def rows_to_csv(rows: Iterable[ProfileRow]) -> str:
    """The table text: a header of ``COLUMNS`` and one line per row."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=COLUMNS, lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow(r.as_csv_row())
    return buf.getvalue()


# ---------------------------------------------------------------------------------------------
# Reading records; the value checks (optimizer.import_values) make every failure one line naming
# the file, the record and the key.

def _load_records(path: Path) -> list[_Rec]:
    """One JSON document, or JSON Lines (one object per line, as vLLM --append-result and SGLang
    write them). Python's json reads the ``Infinity`` that SGLang writes for an infinite rate."""
    text = read_text(path, "benchmark output")
    if not text.strip():
        raise InputError(f"{path}: empty file")
    try:
        doc = json.loads(text)
    except RecursionError:
        raise InputError(f"{path}: not JSON (nested too deeply)") from None
    except json.JSONDecodeError as whole_err:
        lines = [(i, ln) for i, ln in enumerate(text.splitlines(), start=1) if ln.strip()]
        if len(lines) < 2:
            raise InputError(f"{path}: not JSON ({whole_err.msg} at line {whole_err.lineno})") from None
        recs = []
        for i, ln in lines:
            try:
                obj = json.loads(ln)
            except json.JSONDecodeError as e:
                raise InputError(f"{path}: line {i}: not JSON ({e.msg})") from None
            except (ValueError, RecursionError) as e:  # an integer of over 4300 digits; nesting too deep
                raise InputError(f"{path}: line {i}: not JSON ({str(e).splitlines()[0][:80]})") from None
            if not isinstance(obj, dict):
                raise InputError(f"{path}: line {i}: expected a JSON object, got {type(obj).__name__}") from None
            recs.append(_Rec(obj, f"{path}: line {i}"))
        return recs
    except ValueError as exc:  # an integer of over 4300 digits
        raise InputError(f"{path}: not JSON ({str(exc).splitlines()[0][:80]})") from None
    if not isinstance(doc, dict):
        raise InputError(f"{path}: expected a JSON object, got {type(doc).__name__}")
    return [_Rec(doc, str(path))]


def detect_format(obj: dict) -> str | None:
    """Which tool wrote this object, from keys only those tools write."""
    if _load_tools.is_guidellm(obj):
        return "guidellm"
    if _load_tools.is_trtllm_bench(obj):
        return "trtllm-bench"
    if _load_tools.is_inference_perf(obj):
        return "inference-perf"
    if any(k.startswith("results_ttft_s") for k in obj):
        return "llmperf"
    cfg = obj.get("input_config")
    records = obj.get("records")
    metrics: dict = records if isinstance(records, dict) else obj
    if isinstance(cfg, dict) and isinstance(metrics.get("time_to_first_token", metrics.get("inter_token_latency")), dict):
        # AIPerf's config has "loadgen" (and an "endpoint" section); genai-perf's newer config tree
        # has "perf_analyzer" instead, its older one the flat CLI arguments.
        if "records" in obj or "loadgen" in cfg or (isinstance(cfg.get("endpoint"), dict) and "perf_analyzer" not in cfg):
            return "aiperf"
        return "genai-perf"
    if "model_id" in obj and ("mean_ttft_ms" in obj or "ttfts" in obj or "mean_e2el_ms" in obj):
        return "vllm"
    if "mean_e2e_latency_ms" in obj or ("backend" in obj and "median_ttft_ms" in obj):
        return "sglang"
    return None


# ---------------------------------------------------------------------------------------------
# vLLM and SGLang share metric names (SGLang's bench_serving started as a copy of vLLM's).

def _serve_row(rec: _Rec, fmt: str) -> dict[str, Any]:
    o = rec.obj
    out: dict[str, Any] = {}
    conc = rec.num("max_concurrency", optional=True)
    rate = rec.num("request_rate", optional=True, allow_inf=True)
    if conc is not None:
        if conc < 1 or conc != int(conc):
            raise InputError(f"{rec.where}: key 'max_concurrency' = {o['max_concurrency']!r} must be a whole number >= 1")
        out["concurrency"] = int(conc)
    if rate is not None and not (conc is not None and math.isinf(rate)):
        if rate <= 0:
            raise InputError(f"{rec.where}: key 'request_rate' = {o['request_rate']!r} must be > 0")
        out["rate_req_s"] = rate  # with a concurrency cap and an infinite rate the run is closed loop
    if not out:
        raise InputError(f"{rec.where}: missing key 'max_concurrency' (or 'request_rate'): cannot tell the load")
    completed = rec.nonneg("completed")
    if completed < 1:
        raise InputError(f"{rec.where}: key 'completed' = {o['completed']!r}: no successful requests")
    out["num_requests"] = int(completed)
    out["output_tok_s"] = rec.nonneg("output_throughput")
    out["request_s"] = rec.nonneg("request_throughput")
    if isinstance(o.get("ttfts"), list) and o["ttfts"]:
        out.update(_from_detail(rec))
    else:
        out["input_tokens"] = _whole(rec.nonneg("total_input_tokens") / completed)
        out["output_tokens"] = _whole(rec.nonneg("total_output_tokens") / completed)
        for m in ("ttft", "tpot"):
            out[f"{m}_mean_ms"] = rec.nonneg(f"mean_{m}_ms")
            out[f"{m}_p50_ms"] = rec.nonneg(f"median_{m}_ms", optional=True)
            out[f"{m}_p90_ms"] = rec.nonneg(f"p90_{m}_ms", optional=True)
            out[f"{m}_p99_ms"] = rec.nonneg(f"p99_{m}_ms", optional=True)
    model = o.get("model_id") or o.get("model")
    engine = _BACKEND_ENGINE.get(str(o.get("backend", "")).lower())
    date = _vllm_date(o.get("date")) if fmt == "vllm" else None
    out["_meta"] = Metadata(model=str(model) if model else None, engine=engine, date=date)
    return out


def _from_detail(rec: _Rec) -> dict[str, Any]:
    """Recompute every statistic from the per-request arrays (seconds), successful requests only.

    TPOT per request = (latency - ttft) / (output_len - 1), as vLLM's ``calculate_metrics``;
    latency = ``latencies[i]`` where written, else ttft + sum(itls[i]) (time of the last chunk).
    """
    ttfts = rec.list_of("ttfts")
    n = len(ttfts)
    itls = rec.list_of("itls", n)
    out_lens = rec.list_of("output_lens", n)
    in_lens = rec.list_of("input_lens", n)
    errors = rec.obj.get("errors") or [""] * n
    if not isinstance(errors, list):
        raise InputError(f"{rec.where}: key 'errors' = {_short(errors)} is not a list")
    lat = rec.obj.get("latencies")
    if lat is not None:
        lat = rec.list_of("latencies", n)
    ttft_ms, tpot_ms, ins, outs = [], [], [], []
    for i in range(n):
        if i < len(errors) and errors[i]:
            continue  # a failed request (vLLM and SGLang record its error text, "" on success)
        t = _number(rec.where, f"ttfts[{i}]", ttfts[i], nonneg=True)
        if not isinstance(itls[i], list):
            raise InputError(f"{rec.where}: key 'itls[{i}]' = {_short(itls[i])} is not a list")
        k = _number(rec.where, f"output_lens[{i}]", out_lens[i], nonneg=True)
        ins.append(_number(rec.where, f"input_lens[{i}]", in_lens[i], nonneg=True))
        outs.append(k)
        ttft_ms.append(t * 1e3)
        latency = (_number(rec.where, f"latencies[{i}]", lat[i], nonneg=True) if lat is not None
                   else t + sum(_number(rec.where, f"itls[{i}]", x, nonneg=True) for x in itls[i]))
        if k > 1:
            tpot_ms.append((latency - t) / (k - 1) * 1e3)
    if not ttft_ms:
        raise InputError(f"{rec.where}: key 'errors': every request failed")
    out: dict[str, Any] = {"input_tokens": _whole(float(np.mean(ins))), "output_tokens": _whole(float(np.mean(outs)))}
    for m, vals in (("ttft", ttft_ms), ("tpot", tpot_ms)):
        if vals:
            out[f"{m}_mean_ms"], out[f"{m}_p50_ms"], out[f"{m}_p90_ms"], out[f"{m}_p99_ms"] = latency_summary(vals)
    return out


def _vllm_date(v) -> str | None:
    # vLLM writes datetime.now().strftime("%Y%m%d-%H%M%S") (local time, no zone).
    try:
        return datetime.strptime(str(v), "%Y%m%d-%H%M%S").isoformat()
    except ValueError:
        return None


# ---------------------------------------------------------------------------------------------
# genai-perf and AIPerf: metric objects {"unit": "ms", "avg": .., "p50": .., ...}.

def _perf_row(rec: _Rec, fmt: str) -> dict[str, Any]:
    o = rec.obj
    records, config = o.get("records"), o.get("input_config")
    stats: dict = records if isinstance(records, dict) else o
    cfg: dict = config if isinstance(config, dict) else {}
    out: dict[str, Any] = {}

    def metric(name: str, stat: str, optional: bool = True, to_ms: bool = False):
        m = stats.get(name)
        if m is None:
            if optional:
                return None
            raise InputError(f"{rec.where}: missing key '{name}'")
        if not isinstance(m, dict):
            raise InputError(f"{rec.where}: key '{name}' = {_short(m)} is not a metric object")
        v = rec.nonneg(stat, optional=optional, obj=m, label=f"{name}.{stat}")
        if v is not None and to_ms:
            unit = str(m.get("unit", "ms")).strip().lower()
            if unit not in _TIME_UNIT_MS:
                raise InputError(f"{rec.where}: key '{name}.unit' = {m.get('unit')!r} is not a time unit")
            v *= _TIME_UNIT_MS[unit]
        return v

    if stats.get("time_to_first_token") is None and stats.get("inter_token_latency") is None:
        raise InputError(f"{rec.where}: missing key 'time_to_first_token'")
    for col, name in (("ttft", "time_to_first_token"), ("tpot", "inter_token_latency")):
        if stats.get(name) is None:
            continue
        out[f"{col}_mean_ms"] = metric(name, "avg", optional=False, to_ms=True)
        for p in ("p50", "p90", "p99"):
            out[f"{col}_{p}_ms"] = metric(name, p, to_ms=True)
    out["output_tok_s"] = metric("output_token_throughput", "avg")
    out["request_s"] = metric("request_throughput", "avg")
    n = metric("request_count", "avg")
    if n is None:
        n = _num_or_none(cfg.get("request_count")) or _num_or_none(_dig(cfg, "loadgen", "request_count"))
    if n is not None:
        out["num_requests"] = int(n)

    isl = metric("input_sequence_length", "avg")
    if isl is None:
        isl = _first_num(cfg, [("synthetic_input_tokens_mean",), ("input", "prompt", "input_tokens", "mean"),
                               ("input", "synthetic_tokens", "mean")])
    osl = metric("output_sequence_length", "avg")
    if osl is None:
        osl = _first_num(cfg, [("output_tokens_mean",), ("input", "prompt", "output_tokens", "mean"),
                               ("input", "output_tokens", "mean"), ("output_tokens", "mean")])
    if isl is None:
        raise InputError(f"{rec.where}: missing key 'input_sequence_length' (and no input token mean in 'input_config')")
    if osl is None:
        raise InputError(f"{rec.where}: missing key 'output_sequence_length' (and no output token mean in 'input_config')")
    out["input_tokens"], out["output_tokens"] = _whole(isl), _whole(osl)

    conc = _first_num(cfg, [("concurrency",), ("loadgen", "concurrency"), ("perf_analyzer", "stimulus", "concurrency")])
    rate = _first_num(cfg, [("request_rate",), ("loadgen", "request_rate"), ("perf_analyzer", "stimulus", "request_rate")])
    if conc:
        out["concurrency"] = int(conc)
    if rate:
        out["rate_req_s"] = rate
    if not conc and not rate:
        raise InputError(f"{rec.where}: missing key 'input_config.{'loadgen.' if fmt == 'aiperf' else ''}concurrency' "
                         "(or a request rate): cannot tell the load")
    names = (_dig(cfg, "endpoint", "model_names") or cfg.get("model_names") or cfg.get("model"))
    model = names[0] if isinstance(names, list) and names else (names if isinstance(names, str) else None)
    model = model if isinstance(model, str) else None
    gpu = None
    gpus = _dig(o, "telemetry_data", "endpoints")
    if isinstance(gpus, dict):
        found: set[str] = set()
        for ep in gpus.values():
            per_gpu = ep.get("gpus") if isinstance(ep, dict) else None
            if isinstance(per_gpu, dict):
                found |= {g["gpu_name"] for g in per_gpu.values()
                          if isinstance(g, dict) and isinstance(g.get("gpu_name"), str) and g["gpu_name"]}
        gpu = found.pop() if len(found) == 1 else None
    date = o.get("start_time") if isinstance(o.get("start_time"), str) else None
    out["_meta"] = Metadata(model=model, gpu=gpu, date=date)
    return out


def _first_num(cfg: dict, paths: list[tuple]) -> float | None:
    for p in paths:
        v = _num_or_none(_dig(cfg, *p))
        if v is not None:
            return v
    return None


# ---------------------------------------------------------------------------------------------
# LLMPerf: LLMPerfResults.to_dict() flattens the summary with "_" (results_ttft_s_quantiles_p50).

def _llmperf_row(rec: _Rec, fmt: str) -> dict[str, Any]:
    o = rec.obj
    out: dict[str, Any] = {}
    conc = rec.num("num_concurrent_requests")
    if conc < 1 or conc != int(conc):
        raise InputError(f"{rec.where}: key 'num_concurrent_requests' = {o['num_concurrent_requests']!r} must be a whole number >= 1")
    out["concurrency"] = int(conc)
    done = rec.nonneg("results_num_completed_requests")
    if done < 1:
        raise InputError(f"{rec.where}: key 'results_num_completed_requests' = {o['results_num_completed_requests']!r}: no successful requests")
    out["num_requests"] = int(done)
    isl = rec.nonneg("results_number_input_tokens_mean", optional=True)
    isl = isl if isl is not None else rec.nonneg("mean_input_tokens")
    osl = rec.nonneg("results_number_output_tokens_mean", optional=True)
    osl = osl if osl is not None else rec.nonneg("mean_output_tokens")
    out["input_tokens"], out["output_tokens"] = _whole(isl), _whole(osl)
    out["ttft_mean_ms"] = rec.nonneg("results_ttft_s_mean") * 1e3
    for p in ("p50", "p90", "p99"):
        v = rec.nonneg(f"results_ttft_s_quantiles_{p}", optional=True)
        out[f"ttft_{p}_ms"] = None if v is None else v * 1e3
    # LLMPerf's inter_token_latency_s = (TTFT + the gaps between later chunks) / output tokens, so
    # TPOT (after the first token) = (E2E - TTFT) / (output - 1); from means, so only the mean.
    e2e = rec.nonneg("results_end_to_end_latency_s_mean", optional=True)
    if e2e is not None and osl > 1:
        out["tpot_mean_ms"] = max(e2e * 1e3 - out["ttft_mean_ms"], 0.0) / (osl - 1)
    else:
        itl = rec.nonneg("results_inter_token_latency_s_mean")
        if osl > 1:
            out["tpot_mean_ms"] = max(itl * osl * 1e3 - out["ttft_mean_ms"], 0.0) / (osl - 1)
    out["output_tok_s"] = rec.nonneg("results_mean_output_throughput_token_per_s")
    per_min = rec.nonneg("results_num_completed_requests_per_min", optional=True)
    out["request_s"] = None if per_min is None else per_min / 60.0
    ts = _num_or_none(o.get("timestamp"))
    try:
        date = datetime.fromtimestamp(ts, tz=timezone.utc).isoformat() if ts else None
    except (OverflowError, OSError, ValueError):
        raise InputError(f"{rec.where}: key 'timestamp' = {_short(o.get('timestamp'))} is not a time") from None
    out["_meta"] = Metadata(model=str(o["model"]) if o.get("model") else None, date=date)
    return out


_READERS: dict[str, Callable[..., dict]] = {
    "vllm": _serve_row, "sglang": _serve_row, "genai-perf": _perf_row, "aiperf": _perf_row,
    "llmperf": _llmperf_row, "guidellm": _load_tools.guidellm_row, "trtllm-bench": _load_tools.trtllm_bench_row,
    "inference-perf": _load_tools.inference_perf_row,
}
# a format whose one document holds several runs: its records, one per row
_SPLIT: dict[str, Callable[[_Rec], list[_Rec]]] = {"guidellm": _load_tools.guidellm_benchmarks}
_DEFAULT_SOURCE = {"vllm": "vllm bench serve", "sglang": "sglang.bench_serving", "genai-perf": "genai-perf",
                   "aiperf": "aiperf", "llmperf": "llmperf token_benchmark_ray", "guidellm": "guidellm benchmark",
                   "trtllm-bench": "trtllm-bench", "inference-perf": "inference-perf"}


def import_file(path: str | Path, fmt: str | None = None, meta: Metadata | None = None,
                concurrency: int | None = None) -> list[ProfileRow]:
    """Rows (``kind=request``) from one benchmark output. Values in the file win over ``meta``,
    which fills what the file lacks. Raises ``InputError`` naming the file and key on bad input.

    ``concurrency``: the load of a run whose file does not record it (trtllm-bench's
    ``--concurrency``: <= 0 for no limit); refused for a file that records its own.
    A fault the checks did not foresee is still one line (``costmodel.files.reading``).
    """
    with reading(path, "benchmark output"):
        return _import_file(path, fmt, meta, concurrency)


def _import_file(path: str | Path, fmt: str | None = None, meta: Metadata | None = None,
                 concurrency: int | None = None) -> list[ProfileRow]:
    p = Path(path)
    if fmt is not None and fmt not in FORMATS:
        raise InputError(f"--format {fmt!r}: expected one of {', '.join(FORMATS)}")
    if concurrency is not None and (isinstance(concurrency, bool) or not isinstance(concurrency, int)):
        raise InputError(f"--concurrency must be a whole number, got {concurrency!r}")
    meta = meta or Metadata()
    rows: list[ProfileRow] = []
    for top in _load_records(p):
        f = fmt or detect_format(top.obj)
        if f is None:
            raise InputError(f"{top.where}: not a recognised benchmark output (keys {_short(sorted(top.obj)[:6])}); "
                             f"pass --format ({', '.join(FORMATS)})")
        if concurrency is not None and f not in _LOAD_FROM_CALLER:
            raise InputError(f"{top.where}: a {f} output records its own load; --concurrency applies to "
                             f"{', '.join(_LOAD_FROM_CALLER)} reports only")
        for rec in (_SPLIT[f](top) if f in _SPLIT else [top]):
            vals = _READERS[f](rec, f, concurrency) if f in _LOAD_FROM_CALLER else _READERS[f](rec, f)
            given = vals.pop("_meta")
            file_meta: Metadata = given if isinstance(given, Metadata) else Metadata(**given)
            m = file_meta.fill(meta).fill(Metadata(source=f"{_DEFAULT_SOURCE[f]}: {p.name}"))
            vals = {k: v for k, v in vals.items() if v is not None}
            # the same rules the table reader applies, so what is written reads back
            vals = {k: (check_value(rec.where, k, v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v)
                    for k, v in vals.items()}
            rows.append(ProfileRow(id=f"{p.stem}:{len(rows) + 1}", kind="request", **m.row_fields(), **vals))
    repeat = first_repeat(rows)  # the table reader refuses a measurement given twice; so does the import
    if repeat is not None:
        later, earlier = (r.id.rpartition(":")[2] for r in repeat)
        raise InputError(f"{p}: record {later} repeats record {earlier} in every field (the same result appended "
                         f"twice?); a fit would count it twice")
    return rows


def import_files(paths: Sequence[str | Path], fmt: str | None = None, meta: Metadata | None = None,
                 concurrency: int | None = None) -> list[ProfileRow]:
    """All rows from several files, in order; ids stay unique (``STEM:N``, ``STEM~2:N`` on a clash).
    ``concurrency`` as for ``import_file``."""
    if not paths:
        raise InputError("no input files given")
    rows, seen = [], set()
    for path in paths:
        for r in import_file(path, fmt, meta, concurrency):
            rid, k = r.id, 2
            while rid in seen:
                stem, _, n = r.id.rpartition(":")
                rid, k = f"{stem}~{k}:{n}", k + 1
            seen.add(rid)
            rows.append(r if rid == r.id else replace(r, id=rid))
    repeat = first_repeat(rows)  # the table reader refuses a measurement twice; so does the import
    if repeat is not None:
        later, earlier = repeat
        raise InputError(f"row {later.id} repeats row {earlier.id} in every column (the same benchmark result "
                         f"given twice?); a fit would count it twice")
    return rows
