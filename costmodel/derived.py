"""Calibrations for GPUs without measurements of their own, derived from the H100 ones.

A calibration's efficiencies are fractions of the datasheet (achieved / peak HBM bandwidth, achieved
/ dense tensor peak, achieved / one-way link bandwidth); its overheads are seconds spent on the
host (scheduling, launches, HTTP) and in collective latency. A derived calibration carries both
to another GPU's datasheet unchanged: the same engine on a sibling GPU reaches about the same share
of the new peaks, and the host side does not change with the GPU. The uncertainty adds, in
quadrature to the base fit's, a transfer term: ``TRANSFER_REL_SD`` of each efficiency (one standard
deviation), sized from the sourced H200/A100/L40S points in ``profiles/tables/other-gpus-published.csv``
(``tests/measure/test_derived_calibrations.py`` prints kvtune's error there).

``profiles/calibrations/<gpu>[-<engine>].yaml`` for every catalog GPU without its own calibration
are written by ``bench/derive_calibrations.py`` from ``derive_calibration``; a test checks that the
shipped files still equal what it derives.
"""

from __future__ import annotations

import hashlib
import math
from pathlib import Path

from .hardware import GPU

__all__ = ["BASE_GPU", "TRANSFER_REL_SD", "EFFICIENCY_KEYS", "derive_calibration"]

BASE_GPU = "h100-sxm"
# Relative one-sigma uncertainty of an efficiency carried to another GPU. Sized from the sourced
# points (TensorRT-LLM 0.9 perf-overview: H200, A100, L40S next to H100 on the same page): the
# derived calibrations' errors there, less the H100 calibration's own error on the H100 rows of the
# same page, spread by about this much (see tests/measure/test_derived_calibrations.py).
TRANSFER_REL_SD = 0.20
EFFICIENCY_KEYS = ("bw_efficiency", "decode_flops_efficiency", "prefill_flops_efficiency", "link_efficiency")


def _round(x: float) -> float:
    return float(f"{x:.5g}")


def derive_calibration(base: dict, base_path: str, base_sha256: str, gpu: GPU, base_gpu: GPU) -> dict:
    """The calibration document for ``gpu`` carried over from ``base`` (a calibration document of
    ``base_gpu``): same params, uncertainty widened by the transfer term, and the derivation
    recorded (``derived_from``, ``derivation``)."""
    params = dict(base["params"])
    unc_base = dict(base.get("uncertainty") or {})
    unc = {}
    for k, v in params.items():
        sd = float(unc_base.get(k, 0.0))
        if k in EFFICIENCY_KEYS:
            sd = math.hypot(sd, TRANSFER_REL_SD * float(v))
        unc[k] = _round(sd)
    engine = base.get("engine", "any")
    name = f"{gpu.name}-{engine}" if engine not in (None, "any") else gpu.name
    ratios = (f"HBM {gpu.hbm_bytes_per_s / base_gpu.hbm_bytes_per_s:.2f}x, "
              f"BF16 {gpu.bf16_flops_per_s / base_gpu.bf16_flops_per_s:.2f}x, "
              f"link {gpu.link_bytes_per_s / base_gpu.link_bytes_per_s:.2f}x the {base_gpu.name}'s")
    return {
        "name": name,
        "gpu": gpu.name,
        "engine": engine,
        "derived_from": {"name": base.get("name", Path(base_path).stem), "path": base_path, "sha256": base_sha256},
        "derivation": (f"efficiencies (achieved / datasheet: {', '.join(EFFICIENCY_KEYS)}) and overheads "
                       f"carried unchanged from {base.get('name')} to the {gpu.display_name} datasheet ({ratios}); "
                       f"no measurement of this GPU went in. Uncertainty: the base fit's plus "
                       f"{TRANSFER_REL_SD:.0%} of each efficiency (one sd) for the transfer."),
        "params": {k: params[k] for k in params},
        "uncertainty": unc,
        "transfer_rel_sd": TRANSFER_REL_SD,
    }


def sha256_file(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()
