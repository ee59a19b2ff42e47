"""The serving engines kvtune models, registered in one place.

Each engine (``Engine``) carries its name (``--engine``, the workload's ``engine:``, profile rows),
its display name, the engine version its rules follow, its scheduling and admission policies (what
the simulator's replica asks: ``costmodel.engines.policies``) and how ``kvtune calibrate`` fits its
rows, and what kvtune can launch on the engine version its launch settings target
(``capabilities``: KV dtypes, speculative methods, weight formats, deployment kinds, multi-node;
one table in ``capabilities.py``). The step models, ``fit``, ``calibrate``, ``optimizer.step_factory`` and the CLI read this
registry; to add an engine, add a module beside ``vllm.py`` and list it in ``_ALL`` (its launch
line, version and tune adapter: one module in ``optimizer.launch``, registered in
``optimizer.launch.registry``). ``register`` adds one at run time (the tests' toy engine): the CLI's
``--engine``, the workload reader and the calibration lookup read ``REGISTRY`` when they run, so it
is a choice there; names taken when a module loads (``ENGINE_NAMES``, ``closed_loop.STAGGERED_ENGINES``,
calibrate's fit rules) hold the built-in engines only.
"""

from __future__ import annotations

from ..errors import InputError
from .base import Engine
from .capabilities import CAPABILITIES, DEFAULT_ENGINE, Capabilities, capabilities_for
from .policies import (Admission, MixedChunkedPrefill, OutputReserveAdmission, PrefillFirst, PromptAdmission,
                       Scheduling)
from .llamacpp import LLAMACPP
from .sglang import SGLANG
from .trtllm import TRTLLM
from .vllm import VLLM

__all__ = ["Engine", "Capabilities", "CAPABILITIES", "DEFAULT_ENGINE", "capabilities_for", "REGISTRY", "ENGINE_NAMES", "get_engine",
           "register", "unregister", "scheduling_for", "admission_for",
           "Scheduling", "Admission", "MixedChunkedPrefill", "PrefillFirst", "PromptAdmission",
           "OutputReserveAdmission"]

_ALL = (VLLM, SGLANG, TRTLLM, LLAMACPP)
REGISTRY: dict[str, Engine] = {e.name: e for e in _ALL}
ENGINE_NAMES: tuple[str, ...] = tuple(REGISTRY)

_MIXED, _PREFILL_FIRST = MixedChunkedPrefill(), PrefillFirst()
_PROMPT, _RESERVE = PromptAdmission(), OutputReserveAdmission()


def get_engine(name: str) -> Engine:
    """The registered engine called ``name``; ``InputError`` naming the choices otherwise."""
    try:
        return REGISTRY[name]
    except (KeyError, TypeError):
        raise InputError(f"engine must be one of {', '.join(REGISTRY)}, got {name!r}") from None


def register(engine: Engine) -> Engine:
    """Add ``engine`` (with its ``capabilities``) to the registry and the capability table."""
    if engine.capabilities is None or engine.capabilities.engine != engine.name:
        raise ValueError(f"engine {engine.name!r}: its capabilities must be given and name it")
    if engine.name in REGISTRY and REGISTRY[engine.name] is not engine:
        raise ValueError(f"engine {engine.name!r} is registered already")
    REGISTRY[engine.name] = engine
    CAPABILITIES[engine.name] = engine.capabilities
    return engine


def unregister(name: str) -> None:
    """Remove an engine ``register`` added (the built-in ones stay)."""
    if name in ENGINE_NAMES:
        raise ValueError(f"engine {name!r} is built in")
    REGISTRY.pop(name, None)
    CAPABILITIES.pop(name, None)


def scheduling_for(prefill_first: bool) -> Scheduling:
    """The scheduling policy a ``SimConfig`` names with its ``prefill_first`` flag."""
    return _PREFILL_FIRST if prefill_first else _MIXED


def admission_for(output_reserve: bool) -> Admission:
    """The admission policy a ``SimConfig`` names with its ``output_reserve`` flag."""
    return _RESERVE if output_reserve else _PROMPT
