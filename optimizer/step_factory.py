"""The factory of the step models every command runs on (``StepFactory``), and the record of
where their numbers come from.

One place decides the efficiency (``--mode ideal``, ``--calibration FILE|NAME|ideal``, or the
shipped calibration for the GPU and ``--engine``) and, with ``--profile TABLE``, wraps the step
model in ``costmodel.measured.MeasuredStepModel``: measured step times inside the table's range,
the calibrated model outside. Each command's JSON then carries::

    source       one line: the efficiency's source, or "measured table T (sha256 ..) inside its
                 range (N step evaluations), calibrated: C (...) outside (M step evaluations)"
    calibration  {name, path, sha256} of the calibration file, or {"name": "ideal"}
    profile      (with a table) {path, sha256, rows_used, fallbacks, step_evaluations, unmatched}

``fallbacks`` counts step evaluations the table could not answer (the calibrated model did);
``unmatched`` lists configurations (TP, dtypes, draft length) for which the table has no rows at
all, so the calibrated model answered every step (only ``kvtune solve`` allows that: it searches
configurations the table may not cover; a single-config command refuses with
``ProfileDataMissing``). Counts accumulate while the models run: read ``record()`` afterwards.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from kvtune.costmodel import StepModel
from kvtune.costmodel.calibration import lookup_calibration
from kvtune.costmodel.efficiency import Efficiency
from kvtune.costmodel.engines import REGISTRY, Engine, get_engine
from kvtune.costmodel.errors import InputError, ProfileDataMissing
from kvtune.costmodel.hardware import GPU
from kvtune.costmodel.measured import MeasuredStepModel
from kvtune.costmodel.memory import BLOCK_TOKENS, GPU_MEM_UTIL
from kvtune.costmodel.models import ModelArch
from kvtune.costmodel.profile_table import ProfileRow, read_table
from kvtune.costmodel.step import SpecConfig
from kvtune.costmodel.simulate import SimConfig

__all__ = ["StepFactory", "MeasuredProfile", "step_model_for", "resolve_calibration", "load_profile"]

MODES = ("calibrated", "ideal")


def _sha256(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def _shown(p: Path, root: Path | None = None) -> str:
    """A path as the user reads it: relative to ``root`` (default: the working folder) if inside."""
    try:
        return str(p.resolve().relative_to((root or Path.cwd()).resolve()))
    except ValueError:
        return str(p)


def resolve_calibration(mode: str, gpu: str, calibration: str | None = None,
                        engine: str | None = None) -> tuple[Efficiency, dict]:
    """The efficiency and its record: ``{"name": "ideal"}`` or ``{name, path, sha256}``
    (``costmodel.calibration.lookup_calibration``). ``calibration="ideal"`` is ``mode="ideal"``."""
    if mode not in MODES:
        raise InputError(f"--mode must be one of {', '.join(MODES)}, got {mode!r}")
    if engine is not None and engine not in REGISTRY:
        raise InputError(f"--engine must be one of {', '.join(REGISTRY)}, got {engine!r}")
    choice = lookup_calibration("ideal" if calibration == "ideal" else mode, gpu, calibration, engine)
    return choice.efficiency, choice.record()


@dataclass(frozen=True, eq=False)
class MeasuredProfile:
    """A profile table read once: its rows, where it is and its sha256."""

    path: str                       # as shown in outputs
    sha256: str
    rows: tuple[ProfileRow, ...]


def load_profile(path: str | Path) -> MeasuredProfile:
    p = Path(path)
    if not p.is_file():
        raise InputError(f"--profile {path}: no such profile table")
    return MeasuredProfile(_shown(p), _sha256(p), tuple(read_table(p)))


def _config_label(tp: int, weight_dtype: str, kv_dtype: str, spec_k: int) -> str:
    return f"tp{tp}-w{weight_dtype}-kv{kv_dtype}-k{spec_k}"


class StepFactory:
    """Builds step models with one efficiency (and optionally one measured table) and records
    what they used. ``step()`` may be called for many configurations (``kvtune solve``)."""

    def __init__(self, gpu: GPU, efficiency: Efficiency, calibration: dict, engine: str | None = None,
                 profile: MeasuredProfile | None = None):
        self.gpu, self.efficiency, self.calibration = gpu, efficiency, calibration
        self.engine, self.profile = engine, profile
        self._measured: list[MeasuredStepModel] = []
        self._unmatched: list[str] = []
        if profile is not None:
            # rows that name another GPU or (when an engine is named) another engine do not apply
            self._rows = tuple(r for r in profile.rows
                               if (not r.gpu or r.gpu == gpu.name) and (not engine or not r.engine or r.engine == engine))
        else:
            self._rows = ()

    @classmethod
    def build(cls, gpu: GPU, mode: str = "calibrated", calibration: str | None = None, engine: str | None = None,
              profile: str | Path | MeasuredProfile | None = None) -> "StepFactory":
        eff, rec = resolve_calibration(mode, gpu.name, calibration, engine)
        prof = load_profile(profile) if isinstance(profile, (str, Path)) else profile
        return cls(gpu, eff, rec, engine, prof)

    def _where(self) -> str:
        return f" on gpu {self.gpu.name}" + (f" engine {self.engine}" if self.engine else "")

    def check_profile_covers(self, model: ModelArch, weight_dtype: str) -> None:
        """Refuse a table with no step rows at all for this model and weight format."""
        if self.profile is None:
            return
        if not any(r.kind == "step" and r.model == model.name and r.weight_dtype == weight_dtype for r in self._rows):
            raise ProfileDataMissing(f"measured table {self.profile.path}: no step rows for model {model.name} "
                                     f"weights {weight_dtype}{self._where()} (at any TP or KV dtype)")

    def step(self, model: ModelArch, tp: int = 1, weight_dtype: str = "bf16", kv_dtype: str = "bf16",
             speculation: SpecConfig | None = None, gpu_mem_util: float = GPU_MEM_UTIL, require_profile: bool = True,
             parallel=None):
        """A ``StepModel`` (or ``MeasuredStepModel`` where the table has rows for this config).
        ``require_profile=False``: a config the table does not cover gets the calibrated model,
        and the record lists it under ``unmatched``."""
        base = StepModel(model, self.gpu, tp, weight_dtype, kv_dtype, self.efficiency, speculation, gpu_mem_util,
                         parallel=parallel)
        if self.profile is None:
            return base
        try:
            m = MeasuredStepModel(base, self._rows, self.profile.path, self.profile.sha256)
        except ProfileDataMissing as exc:
            if require_profile:
                raise ProfileDataMissing(f"{exc}{self._where()}") from None
            self._unmatched.append(_config_label(tp, weight_dtype, kv_dtype, base.speculation.k if base.speculation else 0))
            return base
        self._measured.append(m)
        return m

    @property
    def engine_info(self) -> Engine | None:
        """The named engine's record in ``costmodel.engines`` (name, display name, version, its
        scheduling and admission policies), or None when no engine is named."""
        return get_engine(self.engine) if self.engine else None

    @property
    def display_name(self) -> str:
        """The engine as a person writes it ("vLLM", "SGLang", "TensorRT-LLM"), or "" if none."""
        info = self.engine_info
        return info.display_name if info is not None else ""

    @property
    def default_calibration(self) -> str | None:
        """The calibration name ``--engine`` selects on this GPU (None when no engine is named)."""
        info = self.engine_info
        return info.default_calibration(self.gpu.name) if info is not None else None

    @property
    def output_reserve(self) -> bool:
        """Whether this engine's admission holds pool room for the outputs (SGLang)."""
        info = self.engine_info
        return info is not None and info.output_reserve

    def sim_config(self, batch_cap: int, chunk_tokens: int, block_tokens: int = BLOCK_TOKENS, prefix_caching: bool = True):
        """The simulator's scheduler for this engine: mixed prefill chunks (as kvtune's launch lines
        configure every engine), with the engine's admission policy (SGLang's output reserve)."""
        return SimConfig(int(batch_cap), int(chunk_tokens), int(block_tokens), bool(prefix_caching),
                         output_reserve=self.output_reserve)

    def record(self) -> dict:
        """``source``, ``calibration``, ``admission`` and (with a table) ``profile``: read after the
        models ran."""
        out = {"source": self.efficiency.source, "calibration": dict(self.calibration),
               "admission": "prompt and output (SGLang's reserve)" if self.output_reserve else "prompt"}
        if self.profile is None:
            return out
        calls = sum(m.calls for m in self._measured)
        fell = sum(m.fallbacks for m in self._measured)
        p = self.profile
        src = (f"measured table {p.path} (sha256 {p.sha256[:12]}) inside its range ({calls - fell} step evaluations), "
               f"{self.efficiency.source} outside ({fell} step evaluations)")
        if self._unmatched:
            src += f"; {self.efficiency.name} only for {', '.join(sorted(set(self._unmatched)))} (no table rows)"
        out["source"] = src
        out["profile"] = {"path": p.path, "sha256": p.sha256, "rows_used": sum(m.rows_used for m in self._measured),
                          "fallbacks": fell, "step_evaluations": calls,
                          "unmatched": sorted(set(self._unmatched))}
        return out


def step_model_for(model: ModelArch, gpu: GPU, tp: int = 1, weight_dtype: str = "bf16", kv_dtype: str = "bf16", *,
                   mode: str = "calibrated", calibration: str | None = None, engine: str | None = None,
                   profile: str | Path | MeasuredProfile | None = None, speculation: SpecConfig | None = None,
                   gpu_mem_util: float = GPU_MEM_UTIL):
    """The step model for one configuration and the ``StepFactory`` that made it (its
    ``record()`` is the ``source``/``calibration``/``profile`` part of a command's JSON)."""
    em = StepFactory.build(gpu, mode, calibration, engine, profile)
    return em.step(model, tp, weight_dtype, kv_dtype, speculation, gpu_mem_util), em
