"""The request plan a pick was judged on, written in a format load tools replay, and read back.

``kvtune solve --plan FILE`` writes the very requests whose simulation gave the pick's printed
figures: the first fresh draw of its robust verification (``optimizer.verify.robust``: seed
``draws.seeds[0]``, ``draws.n_requests`` requests at ``draws.load_req_s``, the per-replica or
per-unit rate that ``simulate_at``/``simulate_unit_at`` split the fleet's rate into), so
``spec.requests(n, seed, rate_req_s=load)`` is that list, bit for bit. ``kvtune tune --plan`` writes
the open-loop run it measured its pick on at the promise (``OpenLoopPlan.from_workload``).

The format is the Mooncake trace JSONL, one request per line, in arrival order::

    {"timestamp": 1532, "input_length": 812, "output_length": 240, "hash_ids": [0, 1, 17], "kvtune": {...}}

as NVIDIA AIPerf reads it (ai-dynamo/aiperf v0.1.1, ``aiperf/dataset/loader/models.py``
``MooncakeTrace`` and ``aiperf/dataset/loader/mooncake_trace.py``): ``timestamp`` whole milliseconds
(an int field), ``input_length`` and ``output_length`` tokens, ``hash_ids`` one id per block of
``--prompt-input-tokens-block-size`` tokens (default 512, ``aiperf/common/config/prompt_config.py``).
AIPerf builds each prompt block by block and reuses a block's tokens wherever its id comes again
(``aiperf/dataset/generator/prompt.py`` ``_generate_cached_prompt``); it requires
``len(hash_ids) == ceil(input_length / block)`` (the last block holds the rest). So a shared prefix
is shared exactly when it is whole blocks: the block size written is the greatest common divisor of
the plan's prefix lengths (a system prompt of 200 tokens: blocks of 200), and the blocks inside a
request's prefix carry its prefix group's ids while every other block gets an id of its own. Where
that divisor is too small for a sensible line (under ``MIN_BLOCK_TOKENS``, or more than
``MAX_BLOCKS_PER_REQUEST`` ids in a line), blocks of 512 are written and each prefix keeps its whole
blocks: ``PlanFile.prefix_tokens_unshared`` counts the tokens the replay then does not share.

``kvtune`` (per line; AIPerf's models allow extra keys, ``AIPerfBaseModel`` ``extra="allow"``, and
Mooncake readers ignore them) holds what the Mooncake fields cannot: the exact arrival time in
seconds (``arrival_s``; ``timestamp`` is it rounded to the millisecond), the class, the prefix
tokens and group, the request's SLO and whether it is warm-up (the first ``floor(0.1 n)`` in arrival
order, which the simulator leaves out of every statistic: ``costmodel.simulate.default_warmup_frac``).
The first line's ``kvtune.plan`` describes the plan: its source, rate, seed, block size, SLO, the
pick it judged and the simulator's figures on it (``predicted``).

AIPerf replays it with (``aiperf/common/config/input_config.py``, ``endpoint_config.py``)::

    aiperf profile --model M --url http://localhost:8000 --endpoint-type completions --streaming \\
        --input-file FILE --custom-dataset-type mooncake_trace --fixed-schedule \\
        --fixed-schedule-auto-offset --prompt-input-tokens-block-size B --extra-inputs ignore_eos:true

(``ignore_eos``: every request generates its ``output_length`` tokens, as kvtune's driver asks;
AIPerf's README says the output length is otherwise not guaranteed). ``read_plan`` reads a plan back
(or any Mooncake trace: its prefixes by ``optimizer.traces``' 512-token blocks) as an
``OpenLoopPlan`` for kvtune's own driver (``kvtune profile replay``).
"""

from __future__ import annotations

import json
import math
import shlex
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from kvtune.costmodel.errors import InputError
from kvtune.costmodel.files import read_text, reading
from kvtune.costmodel.requests import Requests
from kvtune.costmodel.traffic import MAX_LENGTH_TOKENS, SLO

from .loadgen import OpenLoopPlan
from kvtune.costmodel.simulate import default_warmup_frac
from .traces import read_trace

__all__ = ["PLAN_FORMAT", "DEFAULT_BLOCK_TOKENS", "MIN_BLOCK_TOKENS", "MAX_BLOCKS_PER_REQUEST", "PlanFile",
           "PlanText", "ReadPlan", "solve_plan", "tune_plan", "plan_text", "read_plan", "block_tokens_for",
           "aiperf_argv", "plan_file", "first_of_plan", "first_requests", "endpoint_of"]

PLAN_FORMAT = "mooncake_trace"   # AIPerf's --custom-dataset-type for it
DEFAULT_BLOCK_TOKENS = 512       # Mooncake's block (its trace README) and AIPerf's default block size
MIN_BLOCK_TOKENS = 16            # a smaller common divisor of the prefixes: blocks of 512 instead
MAX_BLOCKS_PER_REQUEST = 4096    # ids in one line at most (a 128k-token prompt in blocks of 32)
AIPERF_SOURCE = "ai-dynamo/aiperf v0.1.1"
_INF_KEYS = ("ttft_slo_ms", "tpot_slo_ms")
MAX_ABS_SECONDS = 1e15   # as optimizer.traces bounds a time: every number a float with sub-microsecond steps


@dataclass(frozen=True)
class PlanFile:
    """What ``--plan`` wrote: the ``plan`` entry of ``kvtune solve``'s JSON. ``argv`` (and ``command``,
    the same as shell text) replays it with AIPerf against the launched endpoint; ``rate_req_s`` is
    the arrival rate of one replica (one unit of a disaggregated deployment): the simulator splits
    the fleet's traffic evenly at random, so the plan is what one replica's endpoint receives."""

    path: str
    format: str
    requests: int
    warmup: int
    seed: int
    rate_req_s: float
    block_tokens: int
    prefix_tokens_unshared: int      # 0: every shared prefix is whole blocks (the replay shares it exactly)
    argv: tuple[str, ...]
    command: str

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "format": self.format, "requests": self.requests, "warmup": self.warmup,
                "seed": self.seed, "rate_req_s": self.rate_req_s, "block_tokens": self.block_tokens,
                "prefix_tokens_unshared": self.prefix_tokens_unshared, "argv": list(self.argv),
                "command": self.command}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "PlanFile":
        kw: dict[str, Any] = {f.name: d[f.name] for f in fields(cls)}
        return cls(**{**kw, "argv": tuple(kw["argv"])})


@dataclass(frozen=True)
class PlanText:
    """A plan as its file's text, with the block size and the prefix tokens it could not share."""

    text: str
    block_tokens: int
    prefix_tokens_unshared: int


@dataclass(frozen=True)
class ReadPlan:
    """A plan read back: the requests as an ``OpenLoopPlan`` and the first line's ``kvtune.plan``
    (None for a Mooncake trace kvtune did not write)."""

    plan: OpenLoopPlan
    header: Mapping[str, Any] | None
    block_tokens: int


# ---- which requests -------------------------------------------------------------------------------
def solve_plan(spec, result) -> tuple[OpenLoopPlan, dict, dict] | None:
    """The requests ``kvtune solve`` printed its pick's figures from (module docstring), with the
    pick and those figures; None when there is no pick or no fresh draw."""
    p, rec = result.predicted, result.recommendation
    if result.status != "ok" or p is None or rec is None or not p.draws:
        return None
    d = p.draws
    n, seed, rate = int(d["n_requests"]), int(d["seeds"][0]), float(d["load_req_s"])
    warm = int(math.floor(default_warmup_frac("trace") * n))   # simulate_replica: rank >= floor(frac * n)
    req = spec.requests(n, seed, rate_req_s=rate)
    per = p.per_replica_is or "one replica"
    plan = OpenLoopPlan(req, rate, seed, warm, spec.slo,
                        f"kvtune solve {spec.path}: the pick's first fresh draw, {n} requests at {rate:.6g} req/s "
                        f"({per}), seed {seed}")
    pick = {**rec.to_json(), "engine": result.engine or spec.engine or "vllm", "weights": spec.weights}
    predicted = {"slo_attainment": p.slo_attainment, "ttft_ms": dict(p.ttft_ms), "tpot_ms": dict(p.tpot_ms),
                 "evidence": "simulated", "check": p.check}
    return plan, pick, predicted


def tune_plan(spec, result, seed: int) -> tuple[OpenLoopPlan, dict, dict] | None:
    """The open-loop run ``kvtune tune`` measured its final pick on at the promise: the config's
    job, the run at ``promise_req_s`` (its requests and warm-up), with the simulator's prediction
    on it; None when the session measured no such run."""
    if result.pick is None or result.promise_req_s is None:
        return None
    for job in result.jobs:
        if job.config != result.pick:
            continue
        for run in job.runs:
            if run.kind == "open" and run.rate_req_s is not None \
                    and math.isclose(run.rate_req_s, result.promise_req_s, rel_tol=1e-12):
                plan = OpenLoopPlan.from_workload(spec, float(run.rate_req_s), int(run.n_requests), int(seed),
                                                  int(run.warmup))
                pick = {**result.pick, "engine": result.engine, "model": spec.model, "weights": spec.weights,
                        "gpu": spec.hardware.gpu}
                predicted = {"slo_attainment": run.predicted_attainment, **(run.predicted or {}),
                             "evidence": "simulated"}
                return plan, pick, predicted
    return None


def first_of_plan(plan: OpenLoopPlan, n: int) -> OpenLoopPlan:
    """The plan's first ``n`` requests in arrival order (a partial replay), the same share of them
    warm-up: ``floor(n * warmup / len(plan))`` (the simulator's share of the whole, 10%)."""
    if n >= len(plan):
        return plan
    req = first_requests(plan.requests, n)
    warm = min(plan.warmup * n // len(plan), n - 1)
    return OpenLoopPlan(req, plan.rate_req_s, plan.seed, warm, plan.slo, f"{plan.source}; its first {n}")


def first_requests(req: Requests, n: int) -> Requests:
    """The first ``n`` requests in arrival order (all of them when ``n`` is at least their count)."""
    order = np.argsort(req.arrival_s, kind="stable")[: max(int(n), 0)]
    cols: dict[str, Any] = {f.name: getattr(req, f.name)[order] for f in fields(Requests) if f.name != "class_names"}
    return Requests(**cols, class_names=req.class_names)


# ---- writing --------------------------------------------------------------------------------------
def block_tokens_for(req: Requests) -> int:
    """The block size that shares every prefix exactly (their greatest common divisor), or 512 when
    there is no prefix or that divisor is too small (module docstring)."""
    shared = req.prefix_tokens[(req.prefix_tokens > 0) & (req.prefix_group >= 0)].astype(np.int64)
    if not len(shared):
        return DEFAULT_BLOCK_TOKENS
    g = int(np.gcd.reduce(shared))
    longest = int(req.input_tokens.max())
    if g < MIN_BLOCK_TOKENS or math.ceil(longest / g) > MAX_BLOCKS_PER_REQUEST:
        return DEFAULT_BLOCK_TOKENS
    return g


def _hash_ids(req: Requests, order: np.ndarray, block: int) -> tuple[list[list[int]], int]:
    """Each request's block ids (in ``order``) and the prefix tokens left unshared: the whole blocks
    of a prefix carry ids of its group, numbered by first use; every other block an id of its own."""
    ids: dict[tuple[int, int], int] = {}
    out, unshared, nxt = [], 0, 0
    for i in order:
        inp, pre, grp = int(req.input_tokens[i]), int(req.prefix_tokens[i]), int(req.prefix_group[i])
        whole = pre // block if grp >= 0 else 0
        unshared += pre - whole * block if grp >= 0 else 0
        row = []
        for b in range(math.ceil(inp / block)):
            key = (grp, b) if b < whole else None
            if key is not None and key in ids:
                row.append(ids[key])
                continue
            row.append(nxt)
            if key is not None:
                ids[key] = nxt
            nxt += 1
        out.append(row)
    return out, unshared


def _finite(v: float) -> float | None:
    return float(v) if math.isfinite(v) else None


def _clean(obj: Any) -> Any:
    """JSON-ready: a number JSON cannot hold (inf, nan: a percentile over no request) becomes null."""
    if isinstance(obj, Mapping):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if isinstance(obj, (float, np.floating)):
        return _finite(float(obj))
    if isinstance(obj, np.integer):
        return int(obj)
    return obj


def plan_text(plan: OpenLoopPlan, pick: Mapping[str, Any] | None = None,
              predicted: Mapping[str, Any] | None = None, version: str = "") -> PlanText:
    """``plan`` as Mooncake trace JSONL (module docstring), in arrival order."""
    req = plan.requests
    order = np.argsort(req.arrival_s, kind="stable")
    block = block_tokens_for(req)
    hashes, unshared = _hash_ids(req, order, block)
    warm = plan.is_warmup
    slo = plan.slo
    header = {"source": plan.source, "rate_req_s": plan.rate_req_s, "seed": plan.seed, "requests": len(req),
              "warmup": plan.warmup, "block_tokens": block, "prefix_tokens_unshared": unshared,
              "slo": {"ttft_ms": _finite(slo.ttft_ms), "tpot_ms": _finite(slo.tpot_ms), "attainment": slo.attainment},
              "kvtune_version": version, "pick": _clean(pick) if pick else None,
              "predicted": _clean(predicted) if predicted else None}
    lines = []
    for k, (i, ids) in enumerate(zip(order, hashes)):
        t = float(req.arrival_s[i])
        extra: dict[str, Any] = {"arrival_s": t, "class": plan.class_name(int(i)),
                                 "prefix_tokens": int(req.prefix_tokens[i]), "prefix_group": int(req.prefix_group[i]),
                                 "warmup": bool(warm[i])}
        for key, v in zip(_INF_KEYS, (req.ttft_slo_s[i], req.tpot_slo_s[i])):
            if math.isfinite(v):
                extra[key] = float(v) * 1e3
        if k == 0:
            extra["plan"] = header
        lines.append(json.dumps({"timestamp": int(round(t * 1e3)), "input_length": int(req.input_tokens[i]),
                                 "output_length": int(req.output_tokens[i]), "hash_ids": ids, "kvtune": extra},
                                separators=(", ", ": "), allow_nan=False))
    return PlanText("\n".join(lines) + "\n", block, unshared)


# ---- the replay command -------------------------------------------------------------------------
_DEFAULT_PORT = {"vllm": 8000, "sglang": 30000, "trtllm": 8000, "llamacpp": 8080}


def endpoint_of(engine: str, argv: Sequence[str] | None) -> tuple[str, str | None]:
    """(base URL, served model) of a launch argv: its ``--port`` (the engine's default port
    otherwise) on localhost, and the model the engine serves (vLLM ``serve M``, SGLang
    ``--model-path M``, TensorRT-LLM ``trtllm-serve M``; None for llama.cpp, which serves any name)."""
    a = list(argv or ())
    port = next((a[i + 1] for i in range(len(a) - 1) if a[i] == "--port"), None) or _DEFAULT_PORT.get(engine, 8000)
    model = None
    if engine == "vllm" and "serve" in a and a.index("serve") + 1 < len(a):
        model = a[a.index("serve") + 1]
    elif engine == "sglang" and "--model-path" in a and a.index("--model-path") + 1 < len(a):
        model = a[a.index("--model-path") + 1]
    elif engine == "trtllm" and len(a) > 1:
        model = a[1]
    return f"http://localhost:{port}", model


def aiperf_argv(plan_path: str, model: str, url: str, block_tokens: int, tokenizer: str | None = None,
                artifact_dir: str | None = None) -> list[str]:
    """``aiperf profile`` replaying ``plan_path`` at its timestamps (flags of ai-dynamo/aiperf v0.1.1:
    module docstring); its per-request export lands in ``ARTIFACT_DIR/profile_export.jsonl``."""
    art = artifact_dir or f"aiperf-{Path(plan_path).stem}"
    out = ["aiperf", "profile", "--model", model, "--url", url, "--endpoint-type", "completions", "--streaming",
           "--input-file", plan_path, "--custom-dataset-type", PLAN_FORMAT, "--fixed-schedule",
           "--fixed-schedule-auto-offset", "--prompt-input-tokens-block-size", str(int(block_tokens)),
           "--extra-inputs", "ignore_eos:true"]
    if tokenizer:
        out += ["--tokenizer", tokenizer]
    return out + ["--artifact-dir", art]


def plan_file(path: str, plan: OpenLoopPlan, written: PlanText, argv: Sequence[str]) -> PlanFile:
    """The record of ``written`` at ``path`` (``-``: stdout)."""
    return PlanFile(path=path, format=PLAN_FORMAT, requests=len(plan), warmup=plan.warmup, seed=plan.seed,
                    rate_req_s=plan.rate_req_s, block_tokens=written.block_tokens,
                    prefix_tokens_unshared=written.prefix_tokens_unshared, argv=tuple(argv),
                    command=shlex.join(argv))


# ---- reading --------------------------------------------------------------------------------------
def _whole(where: str, key: str, v: Any, lo: int, hi: int = MAX_LENGTH_TOKENS) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v != int(v) \
            or not lo <= v <= hi:
        raise InputError(f"{where}: key '{key}' = {str(v)[:40]!r} must be a whole number in [{lo}, {hi:.0e}]")
    return int(v)


def _num(where: str, key: str, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= MAX_ABS_SECONDS:
        raise InputError(f"{where}: key '{key}' = {str(v)[:40]!r} must be a number in [0, {MAX_ABS_SECONDS:.0e}]")
    return float(v)


def read_plan(path: str | Path, shown: str | None = None) -> ReadPlan:
    """A plan file back as an ``OpenLoopPlan``: a plan kvtune wrote exactly (its ``kvtune`` entries),
    any other Mooncake trace through ``optimizer.traces`` (timestamps in ms, prefixes by 512-token
    blocks, no SLO, no warm-up). Bad input is one ``InputError`` naming the file, line and key."""
    shown = shown or str(path)
    with reading(shown, "plan"):
        return _read_plan(Path(path), shown)


def _read_plan(p: Path, shown: str) -> ReadPlan:
    text = read_text(p, "plan")
    first = next((ln for ln in text.splitlines() if ln.strip()), "")
    try:
        head = json.loads(first) if first else None
    except (ValueError, RecursionError):
        head = None
    if not (isinstance(head, dict) and isinstance(head.get("kvtune"), dict)):
        tr = read_trace(p, shown)
        n = len(tr.arrival_s)
        req = Requests(arrival_s=tr.arrival_s, input_tokens=tr.input_tokens, output_tokens=tr.output_tokens,
                       prefix_tokens=tr.prefix_tokens, prefix_group=tr.prefix_group,
                       ttft_slo_s=np.full(n, np.inf), tpot_slo_s=np.full(n, np.inf),
                       class_idx=np.zeros(n, dtype=np.int64), class_names=("trace",))
        span = float(tr.arrival_s[-1] - tr.arrival_s[0])
        rate = (n - 1) / span if n > 1 and span > 0 else 1.0
        return ReadPlan(OpenLoopPlan(req, rate, 0, 0, SLO(), tr.source), None, DEFAULT_BLOCK_TOKENS)
    return _read_kvtune(text, shown)


def _read_kvtune(text: str, shown: str) -> ReadPlan:
    cols: dict[str, list] = {k: [] for k in ("t", "inp", "out", "pre", "grp", "ttft", "tpot", "cls", "warm")}
    header: dict | None = None
    block = DEFAULT_BLOCK_TOKENS
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{shown}: line {lineno}"
        try:
            rec = json.loads(line)
        except (ValueError, RecursionError) as exc:
            raise InputError(f"{where}: not JSON ({str(exc).splitlines()[0][:80]})") from None
        if not isinstance(rec, dict):
            raise InputError(f"{where}: expected a JSON object, got {type(rec).__name__}")
        kv = rec.get("kvtune")
        if not isinstance(kv, dict):
            raise InputError(f"{where}: no 'kvtune' entry, which the plan's first line has (a plan kvtune wrote, "
                             f"then edited?)")
        if header is None:
            h = kv.get("plan")
            if not isinstance(h, dict):
                raise InputError(f"{where}: the first line's 'kvtune' has no 'plan' entry")
            header = h
            block = _whole(where, "kvtune.plan.block_tokens", h.get("block_tokens"), 1)
        for k in ("input_length", "output_length"):
            if k not in rec:
                raise InputError(f"{where}: missing key '{k}'")
        inp = _whole(where, "input_length", rec["input_length"], 1)
        out = _whole(where, "output_length", rec["output_length"], 1)
        hashes = rec.get("hash_ids")
        if not isinstance(hashes, list) or len(hashes) != math.ceil(inp / block):
            raise InputError(f"{where}: key 'hash_ids' must list ceil(input_length / {block}) = "
                             f"{math.ceil(inp / block)} block ids (AIPerf refuses other counts)")
        pre = _whole(where, "kvtune.prefix_tokens", kv.get("prefix_tokens", 0), 0)
        if pre > inp:
            raise InputError(f"{where}: key 'kvtune.prefix_tokens' = {pre} exceeds input_length {inp}")
        cols["t"].append(_num(where, "kvtune.arrival_s", kv.get("arrival_s")))
        cols["inp"].append(inp)
        cols["out"].append(out)
        cols["pre"].append(pre)
        cols["grp"].append(_whole(where, "kvtune.prefix_group", kv.get("prefix_group", -1), -1, 2**62))
        for key, dest in zip(_INF_KEYS, ("ttft", "tpot")):
            v = kv.get(key)
            cols[dest].append(math.inf if v is None else _num(where, f"kvtune.{key}", v) / 1e3)
        name = kv.get("class", "all")
        cols["cls"].append(str(name))
        cols["warm"].append(kv.get("warmup") is True)
    if header is None:
        raise InputError(f"{shown}: empty plan")
    names = tuple(dict.fromkeys(cols["cls"]))
    req = Requests(arrival_s=np.array(cols["t"], dtype=float), input_tokens=np.array(cols["inp"], dtype=np.int64),
                   output_tokens=np.array(cols["out"], dtype=np.int64),
                   prefix_tokens=np.array(cols["pre"], dtype=np.int64),
                   prefix_group=np.array(cols["grp"], dtype=np.int64), ttft_slo_s=np.array(cols["ttft"], dtype=float),
                   tpot_slo_s=np.array(cols["tpot"], dtype=float),
                   class_idx=np.array([names.index(c) for c in cols["cls"]], dtype=np.int64), class_names=names)
    order = np.argsort(req.arrival_s, kind="stable")
    warm_sorted = np.array(cols["warm"], dtype=bool)[order]
    n_warm = int(warm_sorted.sum())
    if n_warm and not warm_sorted[:n_warm].all():
        raise InputError(f"{shown}: the warm-up requests are not the first {n_warm} in arrival order")
    s = header.get("slo") or {}
    if not isinstance(s, dict):
        raise InputError(f"{shown}: key 'kvtune.plan.slo' = {str(s)[:40]!r} must be a mapping "
                         "(ttft_ms, tpot_ms, attainment)")
    try:   # SLO checks its own values; the file and key are this reader's to name
        slo = SLO(ttft_ms=s.get("ttft_ms") or math.inf, tpot_ms=s.get("tpot_ms") or math.inf,
                  attainment=s.get("attainment") or SLO().attainment)
    except InputError as e:
        raise InputError(f"{shown}: key 'kvtune.plan.slo': {e}") from None
    rate = _num(shown, "kvtune.plan.rate_req_s", header.get("rate_req_s"))
    if not rate > 0:
        raise InputError(f"{shown}: key 'kvtune.plan.rate_req_s' = {rate!r} must be > 0")
    plan = OpenLoopPlan(req, rate, _whole(shown, "kvtune.plan.seed", header.get("seed", 0), 0, 2**63 - 1),
                        min(n_warm, len(req) - 1), slo, str(header.get("source") or shown))
    return ReadPlan(plan, header, block)
