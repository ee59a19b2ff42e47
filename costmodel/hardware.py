"""GPU datasheet figures, loaded from ``profiles/hardware.yaml`` into frozen objects.

Units are SI inside: bytes, bytes/s, FLOP/s. The YAML holds datasheet units (GB, TB/s, TFLOPS)
with the datasheet named beside each figure; conversion happens here, once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from .files import load_yaml, path_kind, profiles_path, reading
from .errors import InputError
from pathlib import Path

__all__ = ["GPU", "get_gpu", "list_gpus", "load_gpu_file", "resolve_gpu"]

GB = 1e9  # decimal GB, as on the datasheets
TB = 1e12
TFLOP = 1e12


@dataclass(frozen=True)
class GPU:
    """One accelerator's datasheet peaks (dense tensor throughput, decimal memory)."""

    name: str
    display_name: str
    memory_bytes: float
    hbm_bytes_per_s: float
    bf16_flops_per_s: float
    fp8_flops_per_s: float  # 0 where the GPU has no FP8 tensor cores
    interconnect_bytes_per_s: float  # aggregate bidirectional, as on the datasheet
    interconnect: str
    source: str
    # the scale-out network between nodes, per GPU and direction (profiles/hardware.yaml gives the source)
    network_bytes_per_s: float = 50 * GB   # 400 Gb/s InfiniBand NDR, one NIC per GPU (DGX H100 datasheet)
    network_latency_s: float = 10e-6       # per cross-node collective (NCCL tuning model: 4.4 + 5.0 us)

    def __post_init__(self) -> None:
        for field in ("memory_bytes", "hbm_bytes_per_s", "bf16_flops_per_s", "interconnect_bytes_per_s",
                      "network_bytes_per_s"):
            if not getattr(self, field) > 0:
                raise InputError(f"hardware {self.name}: {field} must be > 0, got {getattr(self, field)}")
        if not self.network_latency_s >= 0:
            raise InputError(f"hardware {self.name}: network_latency_us must be >= 0, got {self.network_latency_s * 1e6}")

    @property
    def link_bytes_per_s(self) -> float:
        """One direction of the GPU-to-GPU link: half the datasheet's bidirectional figure."""
        return self.interconnect_bytes_per_s / 2

    def matmul_flops_per_s(self, weight_dtype: str) -> float:
        """Dense tensor-core peak for the weight format's GEMMs."""
        if weight_dtype == "fp8":
            if self.fp8_flops_per_s <= 0:
                raise InputError(f"gpu {self.name}: has no FP8 tensor cores, so FP8 weights cannot run on it; "
                                 f"use bf16 weights")
            return self.fp8_flops_per_s
        return self.bf16_flops_per_s


@lru_cache(maxsize=None)
def _catalog() -> dict:
    data = load_yaml(profiles_path("hardware.yaml"))
    assert isinstance(data, dict), "the shipped GPU catalog is a mapping of GPU names"
    return {k.lower(): v for k, v in data.items()}


_ALIASES = {"h100": "h100-sxm", "h100-sxm5": "h100-sxm", "h100-80gb": "h100-sxm", "h200-sxm": "h200",
            "a100": "a100-80gb", "a100-sxm": "a100-80gb", "b200-sxm": "b200"}


def list_gpus() -> list[str]:
    return sorted(_catalog())


def get_gpu(name: str) -> GPU:
    key = name.strip().lower()
    key = _ALIASES.get(key, key)
    cat = _catalog()
    if key not in cat:
        raise InputError(f"unknown gpu '{name}'; known: {', '.join(sorted(cat))}")
    return _gpu_from_row(key, cat[key])


# Numeric keys of a hardware entry, and a bound no datasheet figure comes near (memory in GB,
# bandwidth in TB/s or GB/s, TFLOPS: today's largest are a few thousand) so that SI products stay finite.
_FIGURES = ("memory_gb", "hbm_tb_s", "bf16_tflops", "fp8_tflops", "interconnect_gb_s")
_MAX_FIGURE = 1e9
_KEYS = ("display_name", "memory_gb", "hbm_tb_s", "bf16_tflops", "fp8_tflops", "interconnect_gb_s",
         "interconnect", "source")


def resolve_gpu(gpu: str, gpu_file: str | None = None) -> GPU:
    """The one rule for naming a GPU: ``gpu_file`` if given, a ``.yaml``/``.yml`` name as a hardware
    file (``profiles/hardware-cpu-example.yaml``'s format), a catalog name (``h100-sxm``), else an
    existing file of that name; otherwise the catalog's error (which lists the known names)."""
    if gpu_file:
        return load_gpu_file(gpu_file)
    if str(gpu).endswith((".yaml", ".yml")):
        return load_gpu_file(gpu)
    key = str(gpu).strip().lower()
    if _ALIASES.get(key, key) not in _catalog() and path_kind(gpu) is not None:
        return load_gpu_file(gpu)
    return get_gpu(gpu)


def load_gpu_file(path) -> GPU:
    """A user hardware file: one entry in ``profiles/hardware.yaml``'s format (``NAME: {keys}``).
    A fault the checks did not foresee is still one line (``costmodel.files.reading``).
    """
    with reading(path, "hardware file"):
        return _load_gpu_file(path)


def _load_gpu_file(path) -> GPU:
    p = Path(path)
    if not path_kind(p):
        raise InputError(f"hardware file {p}: no such file")
    data = load_yaml(p, "hardware file")
    if not isinstance(data, dict) or len(data) != 1 or not isinstance(next(iter(data.values())), dict):
        raise InputError(f"hardware file {p}: expected exactly one entry 'NAME: {{{', '.join(_KEYS)}}}'")
    key, row = next(iter(data.items()))
    for k in _KEYS:
        if k not in row:
            raise InputError(f"hardware file {p}: {key}: missing key '{k}'")
    for k in _FIGURES:
        v = row[k]
        floor = 0 if k == "fp8_tflops" else None  # 0 FP8: no FP8 tensor cores
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v > _MAX_FIGURE \
                or (v < 0 if floor == 0 else v <= 0):
            raise InputError(f"hardware file {p}: {key}.{k} = {v!r}: must be a finite number "
                             f"{'>= 0' if floor == 0 else '> 0'} and <= {_MAX_FIGURE:g}")
    for k in ("display_name", "interconnect", "source"):
        if not isinstance(row[k], (str, int, float)) or isinstance(row[k], bool):
            raise InputError(f"hardware file {p}: {key}.{k} = {row[k]!r}: must be text")
    row = {**row, **{k: str(row[k]) for k in ("display_name", "interconnect", "source")}}
    return _gpu_from_row(str(key).lower(), row)


def _gpu_from_row(key: str, row: dict) -> GPU:
    return GPU(
        name=key,
        display_name=row["display_name"],
        memory_bytes=float(row["memory_gb"]) * GB,
        hbm_bytes_per_s=float(row["hbm_tb_s"]) * TB,
        bf16_flops_per_s=float(row["bf16_tflops"]) * TFLOP,
        fp8_flops_per_s=float(row["fp8_tflops"]) * TFLOP,
        interconnect_bytes_per_s=float(row["interconnect_gb_s"]) * GB,
        interconnect=row["interconnect"],
        source=row["source"],
        network_bytes_per_s=float(row.get("network_gb_s", 50)) * GB,
        network_latency_s=float(row.get("network_latency_us", 10)) * 1e-6,
    )
