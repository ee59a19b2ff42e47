"""The parsed workload spec (``WorkloadSpec`` and its sections) and the bounds its values are checked
against. ``optimizer.workload`` reads YAML into it and re-exports every name here; it lives below both
that reader and ``optimizer.engine_space`` (which adapts a spec to the engine), so neither imports the
other in a cycle."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from kvtune.costmodel.files import FLOAT_MAX
from kvtune.costmodel.draft import DraftFootprint, draft_footprint
from kvtune.costmodel.dtypes import KNOWN as _DTYPE_NAMES
from kvtune.costmodel.errors import InputError
from kvtune.costmodel.memory import GPU_MEM_UTIL
from kvtune.costmodel.models import ModelArch
from kvtune.costmodel.requests import Requests
from kvtune.costmodel.step import DRAFT_COST, SpecConfig
from kvtune.costmodel.traffic import SLO, Workload

from .user_checkpoint import UserCheckpoint

__all__ = ["WorkloadSpec", "HardwareSpec", "SearchSpec", "SpeculativeSpec", "OBJECTIVES", "KV_DTYPES",
           "WEIGHT_DTYPES", "FORMATS", "DEPLOYMENTS", "MAX_SEED", "MAX_SPEC_K", "MAX_GPUS_PER_NODE", "MAX_NODES",
           "MAX_USD_PER_GPU_HOUR", "MIN_RATE_REQ_S", "MAX_TIME_SCALE"]

OBJECTIVES = ("min_cost", "max_goodput")
# Sanity bounds on values that are typos beyond them (each error names the bound):
MAX_SEED = 2**32 - 1            # numpy's RandomState, which optuna's samplers seed, takes seeds below 2**32
MAX_SPEC_K = 64                 # tokens per verify pass (1 - a^(k+1)) / (1 - a) stop growing long before
MAX_GPUS_PER_NODE = 1024        # an NVL72 rack is one 72-GPU NVLink domain; 1024 leaves room
MAX_NODES = 100_000             # the largest clusters built hold ~100k GPUs
MAX_USD_PER_GPU_HOUR = 1e6
MIN_RATE_REQ_S = 1e-9           # one request in 30 years; slower ones overflow the arrival clock
MAX_TIME_SCALE = 1e9
KV_DTYPES = ("bf16", "fp8")   # the default KV search; any format of FORMATS may be named
# every format kvtune has a byte width for (costmodel.dtypes: bf16, fp16, fp8, GGUF q4_0, q4_1, q8_0, ...)
FORMATS = _DTYPE_NAMES
WEIGHT_DTYPES = FORMATS


# ---- the parsed spec ---------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class HardwareSpec:
    gpu: str                      # canonical catalog name (costmodel.get_gpu), or the hardware file's entry name
    gpus_per_node: int = 8
    usd_per_gpu_hour: float
    max_nodes: int = 1
    # a user hardware file (costmodel.hardware.load_gpu_file) instead of the catalog; out of repr so
    # catalog specs keep their repr (solve's study digest), which adds the file itself when set
    gpu_file: str | None = field(default=None, repr=False)
    # several GPU types to choose from (hardware.gpu as a list): ((gpu, usd_per_gpu_hour), ...) in the
    # order given; ``gpu``/``usd_per_gpu_hour`` are the first. Solved per type by optimizer.gpu_choice.
    choices: tuple[tuple[str, float], ...] = field(default=(), repr=False)

    def __post_init__(self) -> None:
        for f in ("gpus_per_node", "max_nodes"):
            v = getattr(self, f)
            if not _is_int(v) or v < 1:
                raise InputError(f"hardware {f} must be a whole number >= 1, got {v!r}")
        v = self.usd_per_gpu_hour
        if not _is_num(v) or not 0 < v < math.inf:
            raise InputError(f"hardware usd_per_gpu_hour must be a number > 0, got {v!r}")

    @property
    def max_gpus(self) -> int:
        return self.gpus_per_node * self.max_nodes


@dataclass(frozen=True)
class SpeculativeSpec:
    method: str                   # eagle3, eagle, medusa, mtp, ngram, draft, ...
    acceptance: float             # per-token probability that a drafted token is accepted
    draft_cost: float = DRAFT_COST   # one draft pass as a fraction of a target pass
    draft_model: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.method, str) or not self.method:
            raise InputError(f"speculative method must be a non-empty string, got {self.method!r}")
        if not _is_num(self.acceptance) or not 0 < self.acceptance <= 1:
            raise InputError(f"speculative acceptance must be in (0, 1], got {self.acceptance!r}")
        if not _is_num(self.draft_cost) or not 0 <= self.draft_cost <= 1:
            raise InputError(f"speculative draft_cost must be in [0, 1], got {self.draft_cost!r}")

    def footprint(self, target: ModelArch, weight_dtype: str) -> DraftFootprint | None:
        """The drafter this section keeps resident beside ``target`` (costmodel.draft; None: none)."""
        return draft_footprint(self.method, target, weight_dtype, self.draft_model)

    def config(self, k: int, draft: DraftFootprint | None = None) -> SpecConfig:
        """The step model's view at draft length ``k``; ``draft``: ``footprint``'s answer."""
        return SpecConfig(k=k, acceptance=self.acceptance, draft_cost=self.draft_cost, method=self.method,
                          draft=draft)


DEPLOYMENTS = ("aggregated", "disaggregated")   # search.deployment: replicas that do both phases; prefill/decode pools


@dataclass(frozen=True, kw_only=True)
class SearchSpec:
    tp: tuple[int, ...] = (1, 2, 4, 8)
    batch_cap: tuple[int, int] = (8, 1024)       # [lo, hi] integer range
    kv_dtype: tuple[str, ...] = KV_DTYPES
    spec_k: tuple[int, int] = (0, 6)             # [lo, hi]; searched only with speculative:
    chunk_tokens: tuple[int, int] = (512, 16384)  # [lo, hi] prefill chunk size
    trials: int = 200
    seed: int = 0
    deployment: tuple[str, ...] = DEPLOYMENTS    # which kinds solve searches (optimizer.deployment_choice)
    # the simulator race exhausts a GPU type's lattice up to this many configs; above it, the race covers
    # only the configs the screen's study sampled (``trials`` of them, by ``--sampler`` and ``--seed``).
    # 5,000: above every shipped workload's (the largest, examples/multinode-deepseek-v3.yaml: 1,624).
    # Out of the repr, which the screen study's name digests (optimizer.search.workload_digest): the
    # screen's trials are the same either side of the cut-over, so a study resumes across it
    exhaustive_max_configs: int = field(default=5000, repr=False)
    # the workload's ranges for optimizer.space's axes (search.<name>: [lo, hi]), as (name, (lo, hi)) pairs;
    # an axis it does not name takes its default range. Out of the repr while empty (workload_digest adds
    # it when not), so the screen study of a workload without one keeps its name
    knobs: tuple[tuple[str, tuple[int, int]], ...] = field(default=(), repr=False)

    @property
    def knob_ranges(self) -> dict[str, tuple[int, int]]:
        """The workload's ranges for ``optimizer.space``'s axes, by knob name."""
        return dict(self.knobs)

    def __post_init__(self) -> None:
        if not self.deployment or any(d not in DEPLOYMENTS for d in self.deployment):
            raise InputError(f"search deployment must list {' and/or '.join(DEPLOYMENTS)}, got {self.deployment!r}")
        if not self.tp or any(not _is_int(t) or t < 1 for t in self.tp):
            raise InputError(f"search tp values must be whole numbers >= 1, got {self.tp!r}")
        for f, lo_min in (("batch_cap", 1), ("spec_k", 0), ("chunk_tokens", 1)):
            r = getattr(self, f)
            if len(r) != 2 or not all(_is_int(x) for x in r) or not lo_min <= r[0] <= r[1]:
                raise InputError(f"search {f} must be [lo, hi] whole numbers with {lo_min} <= lo <= hi, got {r!r}")
        if not self.kv_dtype or any(k not in FORMATS for k in self.kv_dtype):
            raise InputError(f"search kv_dtype must be drawn from {', '.join(FORMATS)}, got {self.kv_dtype!r}")
        for name, (lo, hi) in self.knobs:
            if not (_is_int(lo) and _is_int(hi) and lo <= hi):
                raise InputError(f"search {name} must be [lo, hi] whole numbers with lo <= hi, got {(lo, hi)!r}")
        if not _is_int(self.trials) or self.trials < 1:
            raise InputError(f"search trials must be a whole number >= 1, got {self.trials!r}")
        if not _is_int(self.seed) or self.seed < 0:
            raise InputError(f"search seed must be a whole number >= 0, got {self.seed!r}")
        if not _is_int(self.exhaustive_max_configs) or self.exhaustive_max_configs < 0:
            raise InputError(f"search exhaustive_max_configs must be a whole number >= 0, "
                             f"got {self.exhaustive_max_configs!r}")


@dataclass(frozen=True, kw_only=True)
class WorkloadSpec:
    path: str                               # the YAML file (or "<dict>")
    model: str                              # as given; a path is resolved against the YAML's folder
    weights: str = "bf16"
    engine: str | None = None
    calibration: str | None = None          # as given; a path is resolved against the YAML's folder
    profile: str | None = None              # measured profile table, resolved against the YAML's folder
    gpu_mem_util: float = GPU_MEM_UTIL
    hardware: HardwareSpec
    workload: Workload
    slo: SLO
    speculative: SpeculativeSpec | None = None
    objective: str = "min_cost"
    search: SearchSpec = field(default_factory=SearchSpec)
    # the workload's checkpoint: (optimizer.user_checkpoint): what the engines load; None: the
    # catalog's checkpoints of the model (costmodel.checkpoints)
    checkpoint: UserCheckpoint | None = None
    # what reading the workload changed and why (options the engine cannot launch, a draft filled
    # in from the catalog: optimizer.engine_space); solve prints them and writes them to the JSON
    notes: tuple[str, ...] = field(default=(), repr=False)

    def objective_key(self, usd_per_hour: float, goodput_req_s: float) -> tuple[float, ...]:
        """Order of two answers under the objective, smaller first: min_cost by $/h, then more
        goodput; max_goodput by more goodput per $/h."""
        if self.objective == "max_goodput":
            return (-goodput_req_s / usd_per_hour,)
        return (usd_per_hour, -goodput_req_s)

    def requests(self, n: int, seed: int, rate_req_s: float | None = None) -> Requests:
        """``n`` requests of this workload (see ``costmodel.traffic.Workload.requests``)."""
        return self.workload.requests(n, seed, rate_req_s)

    def to_dict(self) -> dict:
        """The normalised spec, defaults filled in (for reports and result files)."""
        wl = self.workload
        if wl.trace is not None:
            traffic: dict = {"trace": wl.trace.source, "requests": len(wl.trace)}
            if wl.time_scale is not None:
                traffic["time_scale"] = wl.time_scale
        else:
            traffic = {"classes": [
                {"name": c.name, "share": c.share, "input_tokens": c.input_tokens.to_dict(),
                 "output_tokens": c.output_tokens.to_dict(), "prefix_tokens": c.prefix_tokens,
                 **({"slo": {k: v for k, v in (("ttft_ms", c.ttft_ms), ("tpot_ms", c.tpot_ms)) if v is not None}}
                    if c.ttft_ms is not None or c.tpot_ms is not None else {})}
                for c in wl.classes]}
        if wl.rate_req_s is not None:
            traffic = {"rate_req_s": wl.rate_req_s, **traffic}
        traffic["mean_input_tokens"] = round(wl.mean_input_tokens, 1)
        traffic["mean_output_tokens"] = round(wl.mean_output_tokens, 1)
        s = self.search
        return {
            "path": self.path, "model": self.model, "weights": self.weights, "engine": self.engine,
            "calibration": self.calibration, "profile": self.profile, "gpu_mem_util": self.gpu_mem_util,
            "hardware": {"gpu": self.hardware.gpu, "gpus_per_node": self.hardware.gpus_per_node,
                         "usd_per_gpu_hour": self.hardware.usd_per_gpu_hour, "max_nodes": self.hardware.max_nodes,
                         **({"gpu_file": self.hardware.gpu_file} if self.hardware.gpu_file else {})},
            "workload": traffic,
            "slo": {"ttft_ms": self.slo.ttft_ms, "tpot_ms": self.slo.tpot_ms, "attainment": self.slo.attainment},
            "speculative": None if self.speculative is None else {
                "method": self.speculative.method, "acceptance": self.speculative.acceptance,
                "draft_cost": self.speculative.draft_cost, "draft_model": self.speculative.draft_model},
            "objective": self.objective,
            "search": {"tp": list(s.tp), "batch_cap": list(s.batch_cap), "kv_dtype": list(s.kv_dtype),
                       "spec_k": list(s.spec_k), "chunk_tokens": list(s.chunk_tokens), "trials": s.trials,
                       "seed": s.seed, "deployment": list(s.deployment),
                       # only where given: a workload without it reads (and digests) as before
                       **({"exhaustive_max_configs": s.exhaustive_max_configs}
                          if s.exhaustive_max_configs != SearchSpec().exhaustive_max_configs else {})},
            # only where given: a workload without one reads (and digests) as before
            **({"checkpoint": self.checkpoint.to_json()} if self.checkpoint is not None else {}),
        }


# ---- value checks ------------------------------------------------------------------------------

def _is_num(v) -> bool:
    if isinstance(v, bool):
        return False
    if isinstance(v, int):
        return abs(v) <= FLOAT_MAX  # an integer no float can hold is not a usable number
    return isinstance(v, float) and not math.isnan(v)


def _is_int(v) -> bool:
    return _is_num(v) and math.isfinite(v) and int(v) == v


def _show(v) -> str:
    s = repr(v)
    return s if len(s) <= 60 else s[:57] + "..."
