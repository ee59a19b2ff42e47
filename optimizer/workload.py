"""The workload file: what to serve (model, weights), on what (GPU, price, nodes), the traffic
(request classes or a trace), the SLOs and the search space. Read and checked in one place.

    model: meta-llama/Llama-3.1-70B-Instruct   # catalog name, HF id (a Hub id outside the catalog: read
                                               # from the local Hugging Face cache), or path to config.json
    checkpoint: /models/llama-70b-fp8          # optional: the folder, GGUF file or Hub id the engine loads
                                               # (optimizer.user_checkpoint: its format fills in weights:)
    weights: bf16                              # bf16 | fp8 | a GGUF type (default: the checkpoint's, else bf16)
    engine: vllm                               # optional: vllm | sglang | trtllm | llamacpp (default vLLM's
                                               # rules: the search holds what it can launch)
    calibration: h100-sxm                      # optional: calibration file or shipped name
    profile: tables/my-engine.csv              # optional: measured step times (a profile table)
    gpu_mem_util: 0.9                          # optional
    hardware: {gpu: h100-sxm, gpus_per_node: 8, usd_per_gpu_hour: 3.0, max_nodes: 4}
                                               # gpu: a catalog name or a hardware YAML file
    workload:
      rate_req_s: 12                           # Poisson arrivals (.inf: all at t = 0)
      classes:
        - {name: chat, share: 0.7, input_tokens: {dist: lognormal, mean: 1200, sigma: 0.8},
           output_tokens: 250, prefix_tokens: 400}
        - {name: rag, share: 0.3, input_tokens: 8000, output_tokens: 300, slo: {ttft_ms: 2000}}
      # trace: traces/azure_conv.csv           # instead of classes; time_scale or rate_req_s rescales it
    slo: {ttft_ms: 1000, tpot_ms: 40, attainment: 0.9}
    speculative: {method: eagle3, acceptance: 0.75, draft_cost: 0.05, draft_model: ...}   # optional
    objective: min_cost                        # min_cost | max_goodput
    search: {tp: [1, 2, 4, 8], batch_cap: [8, 1024], kv_dtype: [bf16, fp8], spec_k: [0, 6],
             chunk_tokens: [512, 16384], trials: 200, seed: 0}

Lengths are a whole number or ``{dist: fixed, value}``, ``{dist: uniform, min, max}``,
``{dist: lognormal, mean, sigma}`` (``mean``: the mean length in tokens; ``sigma``: the standard
deviation of the underlying normal) or ``{dist: normal, mean, std}``, each with optional
``min``/``max`` clipping. A class's input is never shorter than its ``prefix_tokens``: for a
lognormal or normal input without ``min`` the prefix is the floor; otherwise the shortest input
must hold the prefix. Paths (model config, calibration, profile, hardware file, trace) are
relative to the YAML file.
``time_scale`` multiplies a trace's timestamps (0.5 replays it twice as fast).

Every error is one line naming the file, the key and the value.
"""

from __future__ import annotations

import difflib
import math
from pathlib import Path

from kvtune.costmodel import get_gpu, get_model
from kvtune.costmodel.files import MAX_YAML_BYTES, parse_yaml, path_kind, printable, profiles_path, read_text, reading
from kvtune.costmodel.calibration import efficiency_for
from kvtune.costmodel.engines import REGISTRY, capabilities_for
from kvtune.costmodel.errors import InputError, KvtuneError
from kvtune.costmodel.hardware import load_gpu_file
from kvtune.costmodel.memory import GPU_MEM_UTIL
from kvtune.costmodel.models import ModelArch, catalog_entry, list_models
from kvtune.costmodel.step import DRAFT_COST, SPEC_METHOD
from kvtune.costmodel.traffic import DISTS, MAX_LENGTH_TOKENS, SLO, SLO_ATTAINMENT, LengthDist, RequestClass, Workload

from . import space
from .engine_space import for_engine
from .hf_cache import HubFile, hub_cache_dir, hub_file, looks_like_hub_id
from .traces import read_trace
from .user_checkpoint import UserCheckpoint, check_architecture, check_weights, hub_checkpoint, read_checkpoint
from .workload_spec import (DEPLOYMENTS, FORMATS, KV_DTYPES, MAX_GPUS_PER_NODE, MAX_NODES, MAX_SEED, MAX_SPEC_K,
                            MAX_TIME_SCALE, MAX_USD_PER_GPU_HOUR, MIN_RATE_REQ_S, OBJECTIVES, WEIGHT_DTYPES,
                            HardwareSpec, SearchSpec, SpeculativeSpec, WorkloadSpec, _is_int, _is_num, _show)

__all__ = ["load_workload", "load_workload_dict", "WorkloadSpec", "HardwareSpec", "SearchSpec",
           "SpeculativeSpec", "OBJECTIVES", "KV_DTYPES", "WEIGHT_DTYPES"]

class _Reader:
    """Checks values against keys of one file; every error names the file, the key and the value."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.base = Path(path).parent if path != "<dict>" else Path(".")

    def bad(self, key: str, value, why: str) -> InputError:
        return InputError(f"{self.path}: {printable(key)} = {_show(value)}: {why}")

    def bad_key(self, key: str, why: str) -> InputError:
        return InputError(f"{self.path}: {printable(key)}: {why}")

    def mapping(self, v, key: str, allowed: tuple[str, ...], required: tuple[str, ...] = ()) -> dict:
        if not isinstance(v, dict):
            raise self.bad(key, v, f"must be a mapping with keys {', '.join(allowed)}")
        for k in v:
            if k not in allowed:
                near = difflib.get_close_matches(str(k), allowed, n=1)
                hint = f" (did you mean '{near[0]}'?)" if near else ""
                raise self.bad_key(f"{key}.{k}" if key else str(k),
                                   f"unknown key{hint}; allowed: {', '.join(allowed)}")
        for k in required:
            if k not in v or v[k] is None:
                raise self.bad_key(f"{key}.{k}" if key else k, "missing (required)")
        return v

    def num(self, v, key: str, lo: float = -math.inf, hi: float = math.inf, lo_open: bool = False,
            allow_inf: bool = False) -> float:
        if not _is_num(v) or (math.isinf(v) and not allow_inf):
            raise self.bad(key, v, "must be a number")
        if v < lo or (lo_open and v == lo) or v > hi:
            left = "(" if lo_open else "["
            if hi < math.inf and (lo == 0 or v > hi) and not (lo <= 0 and hi <= 1):
                why = f"must be {'>' if lo_open else '>='} {lo:g} and <= {hi:g}"
            elif hi < math.inf:
                why = f"must be in {left}{lo:g}, {hi:g}]"
            else:
                why = f"must be {'>' if lo_open else '>='} {lo:g}"
            raise self.bad(key, v, why)
        return float(v)

    def int_(self, v, key: str, lo: int, hi: int = MAX_LENGTH_TOKENS) -> int:
        if not _is_int(v):
            raise self.bad(key, v, "must be a whole number")
        if v < lo:
            raise self.bad(key, v, f"must be >= {lo}")
        if v > hi:
            raise self.bad(key, v, f"must be <= {hi:,}")
        return int(v)

    def str_(self, v, key: str) -> str:
        if not isinstance(v, str) or not v.strip():
            raise self.bad(key, v, "must be a non-empty string")
        return v.strip()

    def choice(self, v, key: str, options: tuple[str, ...]) -> str:
        if not isinstance(v, str) or v not in options:
            raise self.bad(key, v, f"must be one of {', '.join(options)}")
        return v

    def range_(self, v, key: str, lo_min: int, hi_max: int = MAX_LENGTH_TOKENS) -> tuple[int, int]:
        if _is_int(v):
            v = [v, v]
        if not isinstance(v, list) or len(v) != 2:
            raise self.bad(key, v, "must be [lo, hi] (two whole numbers) or one whole number")
        lo = self.int_(v[0], f"{key}[0]", lo_min, hi_max)
        hi = self.int_(v[1], f"{key}[1]", lo_min, hi_max)
        if lo > hi:
            raise self.bad(key, v, "lo must be <= hi")
        return lo, hi

    def local_path(self, value: str, key: str = "path") -> Path:
        if "\x00" in value:
            raise self.bad(key, value, "a path cannot hold a NUL character")
        try:
            p = Path(value).expanduser()
        except RuntimeError:  # ~user of a user this machine does not have
            raise self.bad(key, value, "names the home folder of an unknown user") from None
        return p if p.is_absolute() else self.base / p

    def wrap(self, key: str, value, exc: KvtuneError) -> KvtuneError:
        """``exc`` (from a reader of another file or a catalog) prefixed with this file, key and value,
        unless it already names this file (raised by this reader: wrapping it again would repeat it)."""
        if str(exc).startswith(f"{self.path}:"):
            return exc
        return type(exc)(f"{self.path}: {key} = {_show(value)}: {exc}")


# ---- sections ----------------------------------------------------------------------------------

_TOP = ("model", "weights", "checkpoint", "engine", "calibration", "profile", "gpu_mem_util", "hardware", "workload", "slo",
        "speculative", "objective", "search")
_LEN_EXTRA = ("min", "max")


def _length(r: _Reader, v, key: str, floor: int = 0) -> LengthDist:
    """A length spec; ``floor`` (a shared prefix) becomes the default ``min`` of open distributions."""
    if _is_num(v) and not isinstance(v, dict):
        if not _is_int(v) or v < 1:
            raise r.bad(key, v, "a length must be a whole number >= 1 token")
        return LengthDist.fixed(r.int_(v, key, 1))
    if not isinstance(v, dict):
        raise r.bad(key, v, "must be a whole number of tokens or {dist: fixed|uniform|lognormal|normal, ...}")
    if "dist" not in v:
        raise r.bad_key(f"{key}.dist", f"missing (required); one of {', '.join(DISTS)}")
    d = v["dist"]
    if not isinstance(d, str) or d not in DISTS:
        raise r.bad(f"{key}.dist", d, f"unknown distribution; use {', '.join(DISTS)}")
    names = DISTS[d]
    allowed = ("dist",) + names + tuple(k for k in _LEN_EXTRA if k not in names)
    r.mapping(v, key, allowed)
    for k in names:
        if k not in v or v[k] is None:
            raise r.bad_key(f"{key}.{k}", f"missing: dist {d} needs {', '.join(names)}")
    lo = r.int_(v["min"], f"{key}.min", 1) if v.get("min") is not None else None
    hi = r.int_(v["max"], f"{key}.max", 1) if v.get("max") is not None else None
    if lo is not None and hi is not None and lo > hi:
        raise r.bad(f"{key}.max", hi, f"must be >= min ({lo})")
    if d == "fixed":
        val = v["value"]
        if not _is_int(val) or val < 1:
            raise r.bad(f"{key}.value", val, "a length must be a whole number >= 1 token")
        r.int_(val, f"{key}.value", 1)
        return _dist(r, key, v, "fixed", (int(val),), lo or 1, hi)
    if d == "uniform":
        assert lo is not None and hi is not None  # min and max are required above
        return _dist(r, key, v, "uniform", (lo, hi), lo, hi)
    r.num(v["mean"], f"{key}.mean", 0, MAX_LENGTH_TOKENS, lo_open=True)
    r.num(v[names[1]], f"{key}.{names[1]}", 0, MAX_LENGTH_TOKENS)
    if lo is None and floor:
        if hi is not None and hi < floor:
            raise r.bad(f"{key}.max", hi, f"is shorter than the class's prefix_tokens ({floor})")
        lo = floor
    return _dist(r, key, v, d, (float(v["mean"]), float(v[names[1]])), lo or 1, hi)


def _dist(r: _Reader, key: str, given, dist: str, params: tuple, lo: int, hi: int | None) -> LengthDist:
    try:
        return LengthDist(dist, params, lo, hi)
    except InputError as exc:
        raise r.wrap(key, given, exc) from None


def _classes(r: _Reader, v) -> tuple[RequestClass, ...]:
    key = "workload.classes"
    if not isinstance(v, list) or not v:
        raise r.bad(key, v, "must be a non-empty list of request classes")
    out: list[RequestClass] = []
    seen: dict[str, int] = {}
    for i, c in enumerate(v):
        k = f"{key}[{i}]"
        r.mapping(c, k, ("name", "share", "input_tokens", "output_tokens", "prefix_tokens", "slo"),
                  required=("input_tokens", "output_tokens") + (("share",) if len(v) > 1 else ()))
        name = r.str_(c["name"], f"{k}.name") if c.get("name") is not None else f"class{i}"
        if name in seen:
            raise r.bad(f"{k}.name", name, f"already used by {key}[{seen[name]}]")
        seen[name] = i
        share = r.num(c.get("share", 1.0), f"{k}.share", 0, 1, lo_open=True)
        prefix = r.int_(c.get("prefix_tokens", 0), f"{k}.prefix_tokens", 0)
        inp = _length(r, c["input_tokens"], f"{k}.input_tokens", floor=prefix)
        if prefix > inp.lower_bound:
            raise r.bad(f"{k}.prefix_tokens", prefix,
                        f"exceeds the shortest input ({inp.lower_bound} tokens); every request holds its prefix")
        outp = _length(r, c["output_tokens"], f"{k}.output_tokens")
        ttft = tpot = None
        if c.get("slo") is not None:
            s = r.mapping(c["slo"], f"{k}.slo", ("ttft_ms", "tpot_ms"))
            if s.get("ttft_ms") is not None:
                ttft = r.num(s["ttft_ms"], f"{k}.slo.ttft_ms", 0, lo_open=True)
            if s.get("tpot_ms") is not None:
                tpot = r.num(s["tpot_ms"], f"{k}.slo.tpot_ms", 0, lo_open=True)
        out.append(RequestClass(name, share, inp, outp, prefix, ttft, tpot))
    total = sum(c.share for c in out)
    if abs(total - 1) > 1e-6:
        raise r.bad(f"{key}[{len(out) - 1}].share", out[-1].share, f"shares must sum to 1 (they sum to {total:g})")
    return tuple(out)


def _workload(r: _Reader, v, slo: SLO, objective: str) -> Workload:
    wl = r.mapping(v, "workload", ("rate_req_s", "classes", "trace", "time_scale"))
    has_c, has_t = wl.get("classes") is not None, wl.get("trace") is not None
    if has_c == has_t:
        raise r.bad_key("workload", "give either classes (sampled requests) or trace (a recorded log), "
                                    + ("not both" if has_c else "neither is given"))
    rate = r.num(wl["rate_req_s"], "workload.rate_req_s", 0, lo_open=True, allow_inf=True) \
        if wl.get("rate_req_s") is not None else None
    if rate is not None and rate < MIN_RATE_REQ_S:
        raise r.bad("workload.rate_req_s", wl["rate_req_s"], f"must be >= {MIN_RATE_REQ_S:g} (one request in 30 years)")
    if has_c:
        if wl.get("time_scale") is not None:
            raise r.bad("workload.time_scale", wl["time_scale"], "applies to a trace only")
        if rate is None and objective == "min_cost":
            raise r.bad_key("workload.rate_req_s", "missing: objective min_cost needs the arrival rate to serve")
        return Workload(classes=_classes(r, wl["classes"]), rate_req_s=rate, slo=slo)
    scale = None
    if wl.get("time_scale") is not None:
        scale = r.num(wl["time_scale"], "workload.time_scale", 1 / MAX_TIME_SCALE, MAX_TIME_SCALE)
        if rate is not None:
            raise r.bad("workload.time_scale", wl["time_scale"], "give time_scale or rate_req_s, not both")
    given = r.str_(wl["trace"], "workload.trace")
    p = r.local_path(given, "workload.trace")
    if path_kind(p) != "file":
        raise r.bad("workload.trace", given, f"no such file ({p})")
    trace = read_trace(p, shown=str(p))
    return Workload(trace=trace, rate_req_s=rate, slo=slo, time_scale=scale)


def _slo(r: _Reader, v) -> SLO:
    s = r.mapping(v, "slo", ("ttft_ms", "tpot_ms", "attainment"))
    if s.get("ttft_ms") is None and s.get("tpot_ms") is None:
        raise r.bad("slo", v, "give ttft_ms and/or tpot_ms")
    ttft = r.num(s["ttft_ms"], "slo.ttft_ms", 0, lo_open=True) if s.get("ttft_ms") is not None else math.inf
    tpot = r.num(s["tpot_ms"], "slo.tpot_ms", 0, lo_open=True) if s.get("tpot_ms") is not None else math.inf
    att = r.num(s.get("attainment", SLO_ATTAINMENT), "slo.attainment", 0, 1, lo_open=True)
    return SLO(ttft, tpot, att)


def _gpu_choices(r: _Reader, h: dict, weights: str) -> tuple[tuple[str, float], ...]:
    """hardware.gpu as a list of catalog names, usd_per_gpu_hour one price for all or a map per type."""
    names = []
    for i, g in enumerate(h["gpu"]):
        key = f"hardware.gpu[{i}]"
        try:
            gpu = get_gpu(r.str_(g, key))
        except InputError as exc:
            raise r.wrap(key, g, exc) from None
        if weights == "fp8" and gpu.fp8_flops_per_s <= 0:
            raise r.bad(key, g, f"{gpu.name} has no FP8 tensor cores, but weights is fp8")
        if gpu.name in names:
            raise r.bad(key, g, "listed twice")
        names.append(gpu.name)
    if not names:
        raise r.bad("hardware.gpu", h["gpu"], "must list at least one GPU type")
    usd = h["usd_per_gpu_hour"]
    if not isinstance(usd, dict):
        price = r.num(usd, "hardware.usd_per_gpu_hour", 0, MAX_USD_PER_GPU_HOUR, lo_open=True)
        return tuple((n, price) for n in names)
    prices: dict[str, float] = {}
    keys: dict[str, str] = {}  # GPU -> the key that priced it (an alias names the same GPU)
    for k, v in usd.items():
        try:
            gname = get_gpu(str(k)).name
            if gname in keys:
                raise r.bad_key(f"hardware.usd_per_gpu_hour.{k}", f"names {gname}, already priced by "
                                f"hardware.usd_per_gpu_hour.{keys[gname]}; give one price per GPU")
            keys[gname] = str(k)
            prices[gname] = r.num(v, f"hardware.usd_per_gpu_hour.{k}", 0, MAX_USD_PER_GPU_HOUR, lo_open=True)
        except InputError as exc:
            if str(exc).startswith(f"{r.path}:"):
                raise
            raise r.wrap(f"hardware.usd_per_gpu_hour.{k}", v, exc) from None
    for n in names:
        if n not in prices:
            raise r.bad_key(f"hardware.usd_per_gpu_hour.{n}", "missing: give a price for every GPU in hardware.gpu")
    extra = sorted(set(prices) - set(names))
    if extra:
        raise r.bad_key(f"hardware.usd_per_gpu_hour.{extra[0]}", "priced but not listed in hardware.gpu")
    return tuple((n, prices[n]) for n in names)


def _hardware(r: _Reader, v, weights: str) -> HardwareSpec:
    h = r.mapping(v, "hardware", ("gpu", "gpus_per_node", "usd_per_gpu_hour", "max_nodes"),
                  required=("gpu", "usd_per_gpu_hour"))
    if isinstance(h["gpu"], list):  # several GPU types: the choice is searched (optimizer.gpu_choice)
        choices = _gpu_choices(r, h, weights)
        return HardwareSpec(
            gpu=choices[0][0], usd_per_gpu_hour=choices[0][1],
            gpus_per_node=r.int_(h.get("gpus_per_node", 8), "hardware.gpus_per_node", 1, MAX_GPUS_PER_NODE),
            max_nodes=r.int_(h.get("max_nodes", 1), "hardware.max_nodes", 1, MAX_NODES),
            choices=choices if len(choices) > 1 else ())
    if isinstance(h["usd_per_gpu_hour"], dict):
        raise r.bad("hardware.usd_per_gpu_hour", h["usd_per_gpu_hour"],
                    "a map of prices needs hardware.gpu to list the GPU types")
    name = r.str_(h["gpu"], "hardware.gpu")
    gpu_file = None
    try:
        if name.endswith((".yaml", ".yml")):
            p = r.local_path(name, "hardware.gpu")
            if path_kind(p) != "file":
                raise r.bad("hardware.gpu", name, f"no such hardware file ({p})")
            gpu, gpu_file = load_gpu_file(p), str(p)
        else:
            gpu = get_gpu(name)
    except InputError as exc:
        if str(exc).startswith(f"{r.path}:"):
            raise
        raise r.wrap("hardware.gpu", name, exc) from None
    if weights == "fp8" and gpu.fp8_flops_per_s <= 0:
        raise r.bad("hardware.gpu", name, f"{gpu.name} has no FP8 tensor cores, but weights is fp8")
    return HardwareSpec(
        gpu=gpu.name,
        gpus_per_node=r.int_(h.get("gpus_per_node", 8), "hardware.gpus_per_node", 1, MAX_GPUS_PER_NODE),
        usd_per_gpu_hour=r.num(h["usd_per_gpu_hour"], "hardware.usd_per_gpu_hour", 0, MAX_USD_PER_GPU_HOUR,
                               lo_open=True),
        max_nodes=r.int_(h.get("max_nodes", 1), "hardware.max_nodes", 1, MAX_NODES),
        gpu_file=gpu_file,
    )


def _speculative(r: _Reader, v) -> SpeculativeSpec:
    s = r.mapping(v, "speculative", ("method", "acceptance", "draft_cost", "draft_model"), required=("acceptance",))
    if s.get("method") == "ngram" and s.get("draft_model") is not None:  # prompt lookup: no drafter to load
        raise r.bad("speculative.draft_model", s["draft_model"], "ngram drafts from the prompt's own n-grams and "
                                                                 "takes no draft model; remove draft_model")
    return SpeculativeSpec(
        method=r.str_(s.get("method", SPEC_METHOD), "speculative.method"),
        acceptance=r.num(s["acceptance"], "speculative.acceptance", 0, 1, lo_open=True),
        draft_cost=r.num(s.get("draft_cost", DRAFT_COST), "speculative.draft_cost", 0, 1),
        draft_model=r.str_(s["draft_model"], "speculative.draft_model") if s.get("draft_model") is not None else None,
    )


def _search_defaults(hw: HardwareSpec, engine: str | None) -> SearchSpec:
    """The search space where the workload gives none, as the engine's capability row shapes it
    (llama.cpp: a few slots, f16 KV; ``Capabilities.search_kv_dtypes`` / ``min_batch_cap``)."""
    caps = capabilities_for(engine)
    kv: tuple[str, ...] = caps.search_kv_dtypes or KV_DTYPES
    lo = caps.min_batch_cap or SearchSpec().batch_cap[0]
    return SearchSpec(kv_dtype=kv, batch_cap=(lo, SearchSpec().batch_cap[1]))


def _search(r: _Reader, v, hw: HardwareSpec, speculative: SpeculativeSpec | None, engine: str | None = None) -> SearchSpec:
    s = r.mapping({} if v is None else v, "search",
                  ("tp", "batch_cap", "kv_dtype", "spec_k", "chunk_tokens", "trials", "seed", "deployment",
                   "exhaustive_max_configs", *(a.name for a in space.AXES)))
    d = _search_defaults(hw, engine)
    if "tp" in s:
        tps = s["tp"] if isinstance(s["tp"], list) else [s["tp"]]
        if not tps:
            raise r.bad("search.tp", s["tp"], "must list at least one tensor-parallel size")
        tp = tuple(sorted({r.int_(t, f"search.tp[{i}]", 1) for i, t in enumerate(tps)}))
        if tp[-1] > hw.gpus_per_node:
            raise r.bad("search.tp", s["tp"], f"tp {tp[-1]} exceeds hardware.gpus_per_node {hw.gpus_per_node} "
                                              f"(a tensor-parallel group stays inside one node)")
    else:
        tp = tuple(t for t in d.tp if t <= hw.gpus_per_node)
    if "kv_dtype" in s:
        kvs = s["kv_dtype"] if isinstance(s["kv_dtype"], list) else [s["kv_dtype"]]
        if not kvs:
            raise r.bad("search.kv_dtype", s["kv_dtype"], f"must list at least one of {', '.join(KV_DTYPES)}")
        kv = tuple(dict.fromkeys(r.choice(k, f"search.kv_dtype[{i}]", FORMATS) for i, k in enumerate(kvs)))
    else:
        kv = d.kv_dtype
    spec_k = r.range_(s["spec_k"], "search.spec_k", 0, MAX_SPEC_K) if "spec_k" in s else d.spec_k
    if "spec_k" in s and speculative is None and spec_k[1] > 0:
        raise r.bad("search.spec_k", s["spec_k"], "speculative decoding needs a speculative: section "
                                                  "(method, acceptance)")
    return SearchSpec(
        tp=tp,
        batch_cap=r.range_(s["batch_cap"], "search.batch_cap", 1) if "batch_cap" in s else d.batch_cap,
        kv_dtype=kv,
        spec_k=spec_k,
        chunk_tokens=r.range_(s["chunk_tokens"], "search.chunk_tokens", 1) if "chunk_tokens" in s else d.chunk_tokens,
        trials=r.int_(s["trials"], "search.trials", 1) if "trials" in s else d.trials,
        seed=r.int_(s["seed"], "search.seed", 0, MAX_SEED) if "seed" in s else d.seed,
        deployment=_deployment(r, s["deployment"]) if "deployment" in s else d.deployment,
        exhaustive_max_configs=(r.int_(s["exhaustive_max_configs"], "search.exhaustive_max_configs", 0)
                                if "exhaustive_max_configs" in s else d.exhaustive_max_configs),
        knobs=tuple((a.name, r.range_(s[a.name], f"search.{a.name}", a.lo_min, a.hi_max))
                    for a in space.AXES if a.name in s),
    )


def _deployment(r: _Reader, v) -> tuple[str, ...]:
    kinds = v if isinstance(v, list) else [v]
    if not kinds:
        raise r.bad("search.deployment", v, f"must list at least one of {', '.join(DEPLOYMENTS)}")
    return tuple(dict.fromkeys(r.choice(k, f"search.deployment[{i}]", DEPLOYMENTS) for i, k in enumerate(kinds)))


def _model(r: _Reader, v) -> tuple[str, ModelArch, HubFile | None]:
    """(the model as solve reads it, its architecture, where a Hub id outside the catalog was found):
    a catalog name or id, a config.json (or its folder), else a Hub id read from the local Hugging
    Face cache (``optimizer.hf_cache``; the Hub itself when huggingface_hub is installed and online)."""
    given = r.str_(v, "model")
    p = r.local_path(given, "model")
    model = str(p) if given.endswith(".json") or path_kind(p) else given
    try:
        return model, get_model(model), None
    except InputError as exc:
        if model != given or catalog_entry(given) is not None or not looks_like_hub_id(given):
            raise r.wrap("model", given, exc) from None
    found = hub_file(given)
    if found is None:
        raise r.bad("model", given, f"not in kvtune's catalog ({', '.join(list_models())}) nor in the local Hugging "
                                    f"Face cache ({hub_cache_dir()}): fetch its config.json there (huggingface-cli "
                                    f"download {given} config.json) or give the path to one")
    try:
        return str(found.path), get_model(str(found.path)), found
    except InputError as exc:
        raise r.wrap("model", given, exc) from None


def _checkpoint(r: _Reader, data: dict, hub_model: HubFile | None, given_model: str, arch: ModelArch
                ) -> tuple[str, UserCheckpoint | None, list[str]]:
    """(the weights, the workload's checkpoint, notes): ``checkpoint:`` as given, else the Hub id of a
    model read from the Hugging Face cache (what the engine loads); its declared format fills in or
    checks ``weights:`` (``optimizer.user_checkpoint``)."""
    given_w = r.choice(data["weights"], "weights", WEIGHT_DTYPES) if data.get("weights") is not None else None
    notes: list[str] = []
    if data.get("checkpoint") is not None:
        given = r.str_(data["checkpoint"], "checkpoint")
        ck, notes = read_checkpoint(given, r.local_path(given, "checkpoint"), r.bad)
    elif hub_model is not None:
        ck = hub_checkpoint(given_model, hub_model, r.bad, key="model")
    else:
        return given_w or "bf16", None, []
    if hub_model is not None:
        notes.append(f"model: {given_model} is not in kvtune's catalog: its architecture is read from "
                     f"{hub_model.path} ({hub_model.how})")
    weights, ck, more = check_weights(ck, given_w, r.bad)
    check_architecture(ck, arch, r.bad)
    return weights, ck, notes + more


# A length distribution without max: the share of its requests the context check covers
CONTEXT_QUANTILE = 0.999


def _check_context(r: _Reader, wl: Workload, arch: ModelArch, trace_given=None) -> None:
    """Every request fits the model's context: prompt + output <= max_context_tokens (an engine
    refuses longer ones: vLLM answers HTTP 400 "maximum context length"). A distribution without
    ``max`` is held to its 99.9th percentile."""
    limit = arch.max_context_tokens
    if not limit:
        return
    where = f"{arch.name}'s context of {limit:,} tokens (max_position_embeddings)"
    if wl.trace is not None:
        total = wl.trace.input_tokens + wl.trace.output_tokens
        over = total > limit
        if over.any():
            i = int(total.argmax())
            raise r.bad("workload.trace", trace_given,
                        f"{int(over.sum())} requests exceed {where}; the longest holds "
                        f"{int(wl.trace.input_tokens[i]):,} prompt + {int(wl.trace.output_tokens[i]):,} output tokens")
        return
    for i, c in enumerate(wl.classes):
        key = f"workload.classes[{i}]"

        def high(d: LengthDist) -> tuple[float, str]:
            if math.isfinite(d.upper_bound):
                return d.upper_bound, ""
            return d.quantile(CONTEXT_QUANTILE), " (99.9th percentile; give max: to bound it)"

        inp, note_i = high(c.input_tokens)
        out, note_o = high(c.output_tokens)
        if inp > limit:
            raise r.bad(f"{key}.input_tokens", c.input_tokens.to_dict() if c.input_tokens.dist != "fixed" else
                        int(inp), f"class {c.name}: prompts of up to {inp:,.0f} tokens{note_i} exceed {where}")
        if inp + out > limit:
            raise r.bad(f"{key}.output_tokens", c.output_tokens.to_dict() if c.output_tokens.dist != "fixed" else
                        int(out), f"class {c.name}: prompt + output reaches {inp:,.0f} + {out:,.0f} = "
                                  f"{inp + out:,.0f} tokens{note_i or note_o}, beyond {where}")


def _calibration(r: _Reader, v, gpu: str, engine: str | None) -> str:
    given = r.str_(v, "calibration")
    p = r.local_path(given, "calibration")
    cal = str(p) if path_kind(p) == "file" else given
    try:
        efficiency_for("calibrated", gpu, cal, engine)
    except KvtuneError as exc:
        if "no such file" in str(exc):
            shipped = sorted(q.stem for q in profiles_path("calibrations").glob("*.yaml"))
            raise r.bad("calibration", given, f"no such file ({p}) nor shipped calibration; shipped: "
                                              f"{', '.join(shipped) or 'none'}") from None
        raise r.wrap("calibration", given, exc) from None
    return cal


def _profile(r: _Reader, v) -> str:
    given = r.str_(v, "profile")
    p = r.local_path(given, "profile")
    if path_kind(p) != "file":
        raise r.bad("profile", given, f"no such profile table ({p})")
    return str(p)


# ---- entry points ------------------------------------------------------------------------------

def load_workload_dict(data, path: str = "<dict>", engine: str | None = None) -> WorkloadSpec:
    """Check a parsed workload document; ``path`` names it in errors and anchors relative paths.
    ``engine`` (``--engine``) replaces the document's ``engine:`` as the engine whose launchable
    space the search is cut to (``optimizer.engine_space``).
    A fault the checks did not foresee is still one line (``costmodel.files.reading``).
    """
    with reading(path, "workload"):
        return _load_workload_dict(data, path, engine)


def _load_workload_dict(data, path: str = "<dict>", engine_override: str | None = None) -> WorkloadSpec:
    r = _Reader(str(path))
    if not isinstance(data, dict):
        raise InputError(f"{path}: must be a mapping with keys {', '.join(_TOP)}")
    r.mapping(data, "", _TOP, required=("model", "hardware", "workload", "slo"))
    model, arch, hub_model = _model(r, data["model"])
    weights, checkpoint, notes = _checkpoint(r, data, hub_model, str(data["model"]).strip(), arch)
    engines = tuple(REGISTRY)   # read now: an engine registered at run time is a choice (costmodel.engines.register)
    engine = r.choice(data["engine"], "engine", engines) if data.get("engine") is not None else None
    if engine_override is not None and engine_override not in engines:
        raise InputError(f"--engine must be one of {', '.join(engines)}, got {engine_override!r}")
    gpu_mem_util = r.num(data.get("gpu_mem_util", GPU_MEM_UTIL), "gpu_mem_util", 0, 1, lo_open=True)
    hardware = _hardware(r, data["hardware"], weights)
    calibration = _calibration(r, data["calibration"], hardware.gpu, engine) \
        if data.get("calibration") is not None else None
    profile = _profile(r, data["profile"]) if data.get("profile") is not None else None
    objective = r.choice(data.get("objective", "min_cost"), "objective", OBJECTIVES)
    slo = _slo(r, data["slo"])
    speculative = _speculative(r, data["speculative"]) if data.get("speculative") is not None else None
    search = _search(r, data.get("search"), hardware, speculative, engine_override or engine)
    workload = _workload(r, data["workload"], slo, objective)
    _check_context(r, workload, arch, data["workload"].get("trace"))
    spec = WorkloadSpec(path=str(path), model=model, weights=weights, engine=engine_override or engine,
                        calibration=calibration, profile=profile, gpu_mem_util=gpu_mem_util, hardware=hardware,
                        workload=workload, slo=slo, speculative=speculative, objective=objective, search=search,
                        checkpoint=checkpoint, notes=tuple(notes))
    return for_engine(spec, arch, data.get("search"), r.bad, r.bad_key)


def load_workload(path: str | Path, engine: str | None = None) -> WorkloadSpec:
    """Read and check a workload YAML file (``engine``: as ``load_workload_dict``).
    A fault the checks did not foresee is still one line (``costmodel.files.reading``).
    """
    with reading(path, "workload file"):
        return _load_workload(path, engine)


def _load_workload(path: str | Path, engine: str | None = None) -> WorkloadSpec:
    data = parse_yaml(read_text(path, "workload file", MAX_YAML_BYTES), str(path))
    if data is None:
        raise InputError(f"{path}: empty workload file")
    return load_workload_dict(data, str(path), engine)
