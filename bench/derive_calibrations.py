"""Write the derived calibrations: every catalog GPU without a measured calibration of its own gets
``profiles/calibrations/<gpu>[-<engine>].yaml`` carried over from the H100 ones
(``costmodel.derived.derive_calibration``). Run after refitting the H100 calibrations:

    python bench/derive_calibrations.py
"""

from __future__ import annotations

from pathlib import Path

import yaml

from kvtune.costmodel import get_gpu, list_gpus
from kvtune.costmodel.files import load_yaml, profiles_path
from kvtune.costmodel.calibration import ENGINES
from kvtune.costmodel.derived import BASE_GPU, derive_calibration, sha256_file

ROOT = Path(__file__).resolve().parents[1]

HEADER = ("# Derived by bench/derive_calibrations.py (costmodel.derived): NOT fitted to this GPU. The base\n"
          "# calibration's efficiencies and overheads carried to this GPU's datasheet; see 'derivation'.\n")


def derived_documents() -> dict[Path, dict]:
    """Every derived calibration file and its document."""
    out = {}
    cal = profiles_path("calibrations")
    base_gpu = get_gpu(BASE_GPU)
    for gpu_name in list_gpus():
        if gpu_name == BASE_GPU:
            continue
        gpu = get_gpu(gpu_name)
        for engine in (None, *ENGINES):
            suffix = f"-{engine}" if engine else ""
            base_path = cal / f"{BASE_GPU}{suffix}.yaml"
            target = cal / f"{gpu_name}{suffix}.yaml"
            if not base_path.exists():
                continue
            if target.exists() and "derived_from" not in (load_yaml(target) or {}):
                continue  # a measured calibration of this GPU: never overwritten
            doc = derive_calibration(load_yaml(base_path), f"profiles/calibrations/{base_path.name}",
                                     sha256_file(base_path), gpu, base_gpu)
            out[target] = doc
    return out


def main() -> None:
    for path, doc in derived_documents().items():
        path.write_text(HEADER + yaml.safe_dump(doc, sort_keys=False, width=110))
        print(f"wrote {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
