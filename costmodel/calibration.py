"""Calibration files: fitted efficiencies for a GPU (and engine), loaded into ``Efficiency``.

A calibration lives in ``profiles/calibrations/NAME.yaml`` (or anywhere, by path)::

    name: h100-sxm-vllm
    gpu: h100-sxm
    engine: vllm
    params: {bw_efficiency: .., decode_flops_efficiency: .., prefill_flops_efficiency: ..,
             step_overhead_s: .., prefill_overhead_s: .., allreduce_latency_s: ..,
             link_efficiency: .., activation_reserve_bytes: .., request_overhead_s: ..}
    uncertainty: {same keys: one standard deviation}
    fit: {points: .., mape_ttft: .., mape_tpot: .., ...}
    inputs: [{path: .., sha256: .., rows: .., source: ..}]

Shipped ones are found by name: ``GPU-ENGINE`` first, then ``GPU``.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from pathlib import Path

from .files import load_yaml, path_kind, profiles_path, reading
from .efficiency import IDEAL, PARAM_BOUNDS, Efficiency
from .engines import ENGINE_NAMES, REGISTRY, get_engine
from .errors import InputError, ProfileDataMissing
from .hardware import get_gpu

__all__ = ["load_calibration", "find_calibration", "calibration_path", "efficiency_for", "lookup_calibration",
           "CalibrationChoice", "ENGINES"]

ENGINES = ENGINE_NAMES  # the registered engines (costmodel.engines); llamacpp: llama.cpp's llama-server
# parameters added after the first calibration files: absent means the value below
OPTIONAL_PARAMS = {"prefill_overhead_s": 0.0, "request_overhead_s": 0.0,
                   "fp8_gemm_efficiency": 1.0, "fp8_kv_bw_efficiency": 1.0, "fp8_scale_overhead_s": 0.0,
                   "decode_attn_efficiency": 1.0}


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def load_calibration(path: str | Path, gpu: str | None = None) -> Efficiency:
    """A calibration file loaded into ``Efficiency``; every fault is one line naming the file (one
    the checks did not foresee too: ``costmodel.files.reading``). With ``gpu``, a file fitted for
    another GPU (its ``gpu:`` key) is refused: efficiencies belong to one GPU."""
    with reading(path, "calibration file"):
        return _load_calibration(path, gpu)


def _same_gpu(a: str, b: str) -> bool:
    def canonical(name: str) -> str:
        try:
            return get_gpu(name).name
        except InputError:  # a machine of a hardware file (cpu-2core): its own name
            return name.strip().lower()

    return canonical(a) == canonical(b)


def _check_target(p: Path, data: dict, gpu: str | None) -> None:
    """The file's ``engine`` is a known one (or ``any``), and its ``gpu`` the one it is used on."""
    engine = data.get("engine")
    if engine is not None and (not isinstance(engine, str) or engine not in (*ENGINES, "any")):
        raise InputError(f"calibration {p}: engine = {engine!r}: unknown engine; one of {', '.join(ENGINES)} or any")
    cal_gpu = data.get("gpu")
    if cal_gpu is None:
        return
    if not isinstance(cal_gpu, str) or not cal_gpu.strip():
        raise InputError(f"calibration {p}: gpu = {cal_gpu!r}: must name the GPU the file was fitted on")
    if gpu is not None and not _same_gpu(cal_gpu, gpu):
        raise InputError(f"calibration {p}: gpu = {cal_gpu!r}: fitted for {cal_gpu}, but this run is on {gpu}; a "
                         f"calibration holds one GPU's efficiencies (use {gpu}'s, derive one from it with "
                         f"bench/derive_calibrations.py, or set its gpu: to {gpu} to reuse it on purpose)")


def _load_calibration(path: str | Path, gpu: str | None = None) -> Efficiency:
    p = Path(path)
    if not path_kind(p):
        raise InputError(f"calibration {path}: no such file")
    data = load_yaml(p, "calibration file")
    if not isinstance(data, dict) or not isinstance(data.get("params"), dict):
        raise InputError(f"calibration {p}: missing key 'params'")
    _check_target(p, data, gpu)
    params = data["params"]
    unknown = [str(k) for k in params if k not in PARAM_BOUNDS]
    if unknown:
        raise InputError(f"calibration {p}: params: unknown key '{sorted(unknown)[0]}'")
    values = {}
    for key in PARAM_BOUNDS:
        if key not in params and key in OPTIONAL_PARAMS:
            values[key] = OPTIONAL_PARAMS[key]
            continue
        if key not in params:
            raise InputError(f"calibration {p}: params: missing key '{key}'")
        v = params[key]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise InputError(f"calibration {p}: params.{key} must be a finite number, got {v!r}")
        lo, hi = PARAM_BOUNDS[key]
        if not lo <= v <= hi:
            raise InputError(f"calibration {p}: params.{key} = {v!r}: outside its bounds [{lo:g}, {hi:g}]")
        values[key] = float(v)
    name = str(data.get("name", p.stem))
    try:
        shown = p.resolve().relative_to(profiles_path().parent)
    except ValueError:
        shown = p
    source = f"calibrated: {name} ({shown}, sha256 {_sha256(p)[:12]})"
    derived = data.get("derived_from")
    if isinstance(derived, dict):  # costmodel.derived: carried over from another GPU's calibration
        source = (f"derived: {name} ({shown}, sha256 {_sha256(p)[:12]}) from {derived.get('name')} "
                  f"(sha256 {str(derived.get('sha256', ''))[:12]}): efficiencies carried to the {data.get('gpu')} "
                  f"datasheet, +/-{float(data.get('transfer_rel_sd', 0)):.0%} (1 sd) each, not measured on it")
    return Efficiency(**values, model_comm=True, name=name, source=source)


def shown_path(p: Path) -> Path:
    """A calibration's path as outputs show it: relative to the repository (``profiles/...``) when
    it is a shipped one, else as given."""
    try:
        return p.resolve().relative_to(profiles_path().parent)
    except ValueError:
        return p


def find_calibration(gpu: str, engine: str | None = None) -> Path:
    """The shipped calibration file for a GPU (and engine)."""
    names = (get_engine(engine).calibration_names(gpu) if engine else []) + [gpu]
    for n in names:
        p = profiles_path("calibrations", f"{n}.yaml")
        if path_kind(p) == "file":
            return p
    raise ProfileDataMissing(
        f"no shipped calibration for gpu {gpu}{' engine ' + engine if engine else ''}: "
        f"pass --calibration ideal (datasheet peaks, no overheads), or fit one with 'kvtune calibrate' "
        f"and pass --calibration FILE")


def calibration_path(gpu: str, calibration: str | Path | None = None, engine: str | None = None) -> Path:
    """The one calibration lookup: a given file, a shipped name (``h100-sxm-trtllm``), a
    ``profiles/...`` path without its suffix, or (none given) the shipped one for the GPU and engine."""
    if not calibration:
        return find_calibration(gpu, engine)
    p = Path(calibration)
    if not path_kind(p) and not p.suffix:
        named = profiles_path("calibrations", f"{calibration}.yaml")
        if path_kind(named) == "file":
            return named
        if str(calibration).startswith("profiles/"):
            return profiles_path(*Path(str(calibration)).parts[1:]).with_suffix(".yaml")
    return p


@dataclass(frozen=True)
class CalibrationChoice:
    """The efficiency a command runs with and where it came from (``path`` None: ideal)."""

    efficiency: Efficiency
    path: Path | None
    sha256: str

    def record(self) -> dict[str, str]:
        """What outputs carry: ``{"name": "ideal"}`` or ``{name, path, sha256}``."""
        if self.path is None:
            return {"name": "ideal"}
        return {"name": self.efficiency.name, "path": str(shown_path(self.path)), "sha256": self.sha256}


def lookup_calibration(mode: str, gpu: str, calibration: str | Path | None = None,
                       engine: str | None = None) -> CalibrationChoice:
    """``efficiency_for`` with its provenance: the file it loaded and that file's sha256."""
    if mode == "ideal":
        return CalibrationChoice(IDEAL, None, "")
    if mode != "calibrated":
        raise InputError(f"mode must be ideal or calibrated, got {mode!r}")
    if engine is not None and engine not in REGISTRY:   # read now: an engine registered at run time too
        raise InputError(f"engine must be one of {', '.join(REGISTRY)}, got {engine!r}")
    p = calibration_path(gpu, calibration, engine)
    return CalibrationChoice(load_calibration(p, gpu), p, _sha256(p))


def efficiency_for(mode: str, gpu: str, calibration: str | Path | None = None,
                   engine: str | None = None) -> Efficiency:
    """The efficiency a command runs with: ideal, a given calibration file, or the shipped one."""
    return lookup_calibration(mode, gpu, calibration, engine).efficiency
