"""AIPerf's per-request export (``profile_export.jsonl``) read as a kvtune open-loop run.

The schema, from ai-dynamo/aiperf v0.1.1 (``aiperf/common/models/record_models.py``
``MetricRecordInfo`` and ``MetricRecordMetadata``, written by
``aiperf/post_processors/record_export_results_processor.py``; documented in
``docs/tutorials/working-with-profile-exports.md``): one JSON object per request::

    {"metadata": {"session_num": 45, "request_start_ns": 1759813207532900363,
                  "request_end_ns": 1759813207838764604, "benchmark_phase": "profiling",
                  "was_cancelled": false, ...},
     "metrics": {"time_to_first_token": {"value": 255.9, "unit": "ms"},
                 "request_latency": {"value": 297.5, "unit": "ms"},
                 "inter_token_latency": {"value": 5.2, "unit": "ms"},
                 "input_sequence_length": {"value": 550, "unit": "tokens"},
                 "output_sequence_length": {"value": 9, "unit": "tokens"}, ...},
     "error": null}

Times are in the record's display unit (ms; ``ns``, ``us`` and ``s`` are converted too);
``request_start_ns`` is the wall clock (``time.time_ns()``) at the send. AIPerf's
``inter_token_latency`` is (request latency - TTFT) / (output tokens - 1)
(``aiperf/metrics/types/inter_token_latency_metric.py``): kvtune's TPOT. A failed request has an
``error`` object (code, type, message) and at most ``error_isl`` among its metrics; a cancelled one
``was_cancelled`` true. Both count as misses, as a failed request does in kvtune's own runs.

Replaying a plan (``optimizer.plan``) with ``--fixed-schedule``, AIPerf sends the requests in
timestamp order and numbers them in that order (``session_num`` is the credit number:
``aiperf/records/record_processor_service.py``; ``aiperf/timing/fixed_schedule_strategy.py`` drops
credits timestamp by timestamp, in file order within one), and the plan's lines are in arrival
order: record ``session_num`` k is the plan's k-th request (an export of the first k requests is a
replay of the plan's first k, the same share of them warm-up: ``optimizer.plan.first_of_plan``).
Given the plan, each measured request
gets its planned lengths, prefix, class, SLO and warm-up flag; AIPerf's own token counts become
the server-side counts of kvtune's per-request log (they are AIPerf's tokenizer's, not the
engine's). Without a plan the counts are the lengths, no request has an SLO, and AIPerf's
``warmup`` phase is the warm-up.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from kvtune.costmodel.errors import InputError
from kvtune.costmodel.files import read_text, reading
from kvtune.costmodel.traffic import SLO

from .loadgen import OpenLoopPlan, OpenLoopRun, RequestRecord
from .plan import first_of_plan

__all__ = ["FORMAT", "is_profile_export", "read_profile_export"]

FORMAT = "aiperf-records"
_TO_MS = {"ns": 1e-6, "us": 1e-3, "µs": 1e-3, "ms": 1.0, "s": 1e3, "sec": 1e3}
# a plan's planned prompt against AIPerf's count of the prompt it built: more than this median
# relative difference and the export is not a replay of that plan
_ISL_MISMATCH = 0.25
_MAX_VALUE = 1e15      # a time (1e15 ms: 30,000 years) or a token count beyond any run's


def is_profile_export(path: str | Path) -> bool:
    """Whether ``path``'s first line is an AIPerf per-request record (``metadata`` with
    ``request_start_ns``, and ``metrics``)."""
    try:
        with open(path, encoding="utf-8-sig") as f:
            first = next((ln for ln in f if ln.strip()), "")
        rec = json.loads(first)
    except (OSError, ValueError, UnicodeDecodeError, RecursionError):
        return False
    return isinstance(rec, dict) and isinstance(rec.get("metadata"), dict) \
        and "request_start_ns" in rec["metadata"] and "metrics" in rec


class _Record:
    """One line, checked: the send time, the metrics in ms and tokens, and whether it was served."""

    def __init__(self, obj: Any, where: str):
        if not isinstance(obj, dict):
            raise InputError(f"{where}: expected a JSON object, got {type(obj).__name__}")
        meta = obj.get("metadata")
        if not isinstance(meta, dict):
            raise InputError(f"{where}: missing key 'metadata'")
        self.where = where
        self.session = self._whole(meta, "session_num", "metadata.session_num")
        self.start_ns = self._whole(meta, "request_start_ns", "metadata.request_start_ns")
        self.phase = str(meta.get("benchmark_phase") or "profiling")
        metrics = obj.get("metrics") or {}
        if not isinstance(metrics, dict):
            raise InputError(f"{where}: key 'metrics' must be an object, got {type(metrics).__name__}")
        self.metrics = metrics
        self.ttft_ms = self._ms("time_to_first_token")
        self.e2e_ms = self._ms("request_latency")
        self.tpot_ms = self._ms("inter_token_latency")
        self.isl = self._tokens("input_sequence_length") or self._tokens("error_isl")
        self.osl = self._tokens("output_sequence_length") or self._tokens("output_token_count")
        err = obj.get("error")
        self.error = "" if err is None else (
            f"{err.get('type') or 'error'} {err.get('code') or ''}: {err.get('message') or ''}".strip()
            if isinstance(err, dict) else str(err))
        if meta.get("was_cancelled") is True and not self.error:
            self.error = "cancelled"
        self.ok = not self.error and self.ttft_ms is not None and self.e2e_ms is not None and bool(self.osl)

    def _whole(self, d: dict, key: str, shown: str) -> int:
        v = d.get(key)   # nanoseconds since 1970 fit int64 until 2262, as AIPerf's time.time_ns()
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < 2**63:
            raise InputError(f"{self.where}: key '{shown}' = {str(v)[:40]!r} must be a whole number in [0, 2**63)")
        return v

    def _metric(self, tag: str) -> tuple[float, str] | None:
        m = self.metrics.get(tag)
        if m is None:
            return None
        v = m.get("value") if isinstance(m, dict) else None
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= _MAX_VALUE:
            raise InputError(f"{self.where}: key 'metrics.{tag}.value' = {str(v)[:40]!r} must be a number in "
                             f"[0, {_MAX_VALUE:.0e}]")
        return float(v), str(m.get("unit") or "")

    def _ms(self, tag: str) -> float | None:
        m = self._metric(tag)
        if m is None:
            return None
        if m[1] not in _TO_MS:
            raise InputError(f"{self.where}: key 'metrics.{tag}.unit' = {m[1][:20]!r}: expected one of "
                             f"{', '.join(_TO_MS)}")
        return m[0] * _TO_MS[m[1]]

    def _tokens(self, tag: str) -> int | None:
        m = self._metric(tag)
        return None if m is None else int(round(m[0]))


def _records(path: Path, shown: str) -> list[_Record]:
    out = []
    for lineno, line in enumerate(read_text(path, "AIPerf export").splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{shown}: line {lineno}"
        try:
            obj = json.loads(line)
        except (ValueError, RecursionError) as exc:
            raise InputError(f"{where}: not JSON ({str(exc).splitlines()[0][:80]})") from None
        out.append(_Record(obj, where))
    if not out:
        raise InputError(f"{shown}: empty file")
    seen: dict[int, str] = {}
    for r in out:
        if r.session in seen:
            raise InputError(f"{r.where}: session_num {r.session} repeats {seen[r.session]} (two runs appended?)")
        seen[r.session] = r.where
    return sorted(out, key=lambda r: r.session)


def read_profile_export(path: str | Path, plan: OpenLoopPlan | None = None, model: str = "",
                        shown: str | None = None) -> OpenLoopRun:
    """The export at ``path`` as an ``OpenLoopRun`` (so its attainment, percentiles, profile row and
    per-request log are kvtune's own: ``OpenLoopRun.attainment``, ``to_rows``, ``write_requests``).
    ``plan``: the plan AIPerf replayed (``optimizer.plan.read_plan``), matched by ``session_num``."""
    shown = shown or str(path)
    with reading(shown, "AIPerf export"):
        recs = _records(Path(path), shown)
        return _with_plan(recs, plan, model, shown) if plan is not None else _alone(recs, model)


def _run(records: tuple[RequestRecord, ...], t0_ns: int, model: str, rate: float, seed: int,
         slo: SLO, source: str, complete: bool) -> OpenLoopRun:
    sent = [r for r in records if r.sent_s is not None]
    ends = [(r.sent_s or 0.0) + (r.e2e_ms or 0.0) / 1e3 for r in sent]
    duration = max(ends) - min(r.sent_s or 0.0 for r in sent) if sent else 0.0
    started = datetime.fromtimestamp(t0_ns / 1e9, timezone.utc).replace(microsecond=0).isoformat()
    return OpenLoopRun(url="", model=model, rate_req_s=rate, seed=seed, slo=slo, plan_source=source,
                       started_at=started, duration_s=duration, requests=records, complete=complete,
                       clock_zero_unix=t0_ns / 1e9)


def _measured(rec: RequestRecord, r: _Record, t0_ns: int) -> RequestRecord:
    return replace(rec, sent_s=(r.start_ns - t0_ns) / 1e9, ok=r.ok, ttft_ms=r.ttft_ms if r.ok else None,
                   tpot_ms=r.tpot_ms if r.ok else None, e2e_ms=r.e2e_ms if r.ok else None,
                   prompt_tokens_server=r.isl, output_tokens_server=r.osl, error=r.error[:200])


def _alone(recs: list[_Record], model: str) -> OpenLoopRun:
    """No plan: the lengths AIPerf counted, no SLO, AIPerf's warm-up phase as the warm-up."""
    t0 = min(r.start_ns for r in recs)
    out = []
    for k, r in enumerate(recs):
        t = (r.start_ns - t0) / 1e9
        base = RequestRecord(index=k, class_name="all", warmup=r.phase == "warmup", scheduled_s=t, sent_s=None,
                             input_tokens=max(r.isl or 1, 1), output_tokens=max(r.osl or 1, 1), prefix_tokens=0,
                             prefix_group=-1, ttft_slo_ms=math.inf, tpot_slo_ms=math.inf)
        out.append(_measured(base, r, t0))
    counted = [x.sent_s for x in out if not x.warmup and x.sent_s is not None]
    span = max(counted) - min(counted) if len(counted) > 1 else 0.0
    rate = (len(counted) - 1) / span if span > 0 else 1.0
    return _run(tuple(out), t0, model, rate, 0, SLO(), "AIPerf per-request export (no plan)", True)


def _with_plan(recs: list[_Record], plan: OpenLoopPlan, model: str, shown: str) -> OpenLoopRun:
    if recs[-1].session >= len(plan):
        raise InputError(f"{recs[-1].where}: session_num {recs[-1].session} is beyond the plan's {len(plan)} "
                         f"requests: this export is not a replay of that plan")
    # a partial replay (--fixed-schedule-end-offset, a run stopped early): the plan's first requests,
    # the same share of them warm-up
    plan = first_of_plan(plan, recs[-1].session + 1)
    req = plan.requests
    order = np.argsort(req.arrival_s, kind="stable")
    planned = np.array([req.input_tokens[order[r.session]] for r in recs if r.isl], dtype=float)
    counted = np.array([r.isl for r in recs if r.isl], dtype=float)
    if len(planned) and float(np.median(np.abs(counted - planned) / planned)) > _ISL_MISMATCH:
        raise InputError(f"{shown}: its input lengths differ from the plan's (median by more than "
                         f"{_ISL_MISMATCH:.0%}): this export is not a replay of that plan")
    arrival = req.arrival_s - float(req.arrival_s.min())
    warm = plan.is_warmup
    first = recs[0]
    # the schedule's zero: the first record's send less its planned offset (AIPerf starts at once
    # with --fixed-schedule-auto-offset; a late first send shifts every send time alike)
    t0 = first.start_ns - int(round(float(arrival[order[first.session]]) * 1e9))
    by_index = {int(order[r.session]): r for r in recs}
    out = []
    for i in range(len(plan)):
        base = RequestRecord(index=i, class_name=plan.class_name(i), warmup=bool(warm[i]),
                             scheduled_s=float(arrival[i]), sent_s=None, input_tokens=int(req.input_tokens[i]),
                             output_tokens=int(req.output_tokens[i]), prefix_tokens=int(req.prefix_tokens[i]),
                             prefix_group=int(req.prefix_group[i]), ttft_slo_ms=float(req.ttft_slo_s[i]) * 1e3,
                             tpot_slo_ms=float(req.tpot_slo_s[i]) * 1e3)
        r = by_index.get(i)
        out.append(base if r is None else _measured(base, r, t0))
    return _run(tuple(out), t0, model, plan.rate_req_s, plan.seed, plan.slo,
                f"AIPerf replay of {plan.source}", len(by_index) == len(plan))
