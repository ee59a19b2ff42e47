"""The engines kvtune launches, registered once: each one's home module (``serving.EngineHome``).

To add an engine: its pure policy in ``costmodel/engines/<name>.py`` (listed in
``costmodel.engines``), its home module beside ``vllm.py`` (``VERSION``, ``FLAGS``, the launch line,
the adapter where ``kvtune tune`` can start it, ``HOME``), and one line in ``_BUILT_IN`` below. The
launch settings (``launch_for_pick``), the tune adapters (``optimizer.adapters.engines``) and the
tests' shared engine suite (tests/engines/test_engine_suite.py) read this registry and nothing else.
``register`` adds one at run time (the suite's toy engine).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from kvtune.costmodel.engines import REGISTRY as POLICIES
from kvtune.costmodel.errors import InputError

from . import llamacpp, sglang, trtllm, vllm
from .serving import EngineHome
from .versions import ROUTER_FLAGS, EngineVersion

__all__ = ["HOMES", "home", "register", "unregister", "ENGINE_VERSIONS", "FLAGS", "TRTLLM_KEYS", "TRTLLM_DISAGG_KEYS"]

_BUILT_IN = (vllm.HOME, sglang.HOME, trtllm.HOME, llamacpp.HOME)   # the order the launch settings list them

HOMES: dict[str, EngineHome] = {}


def register(h: EngineHome) -> EngineHome:
    """Add ``h`` (its policy must be registered in ``costmodel.engines`` under the same name)."""
    if h.name not in POLICIES:
        raise ValueError(f"engine {h.name!r} has no policy in costmodel.engines (register it there first)")
    if h.name in HOMES and HOMES[h.name] is not h:
        raise ValueError(f"engine {h.name!r} is registered already")
    HOMES[h.name] = h
    return h


def unregister(name: str) -> None:
    """Remove an engine ``register`` added (the built-in ones stay)."""
    if any(b.name == name for b in _BUILT_IN):
        raise ValueError(f"engine {name!r} is built in")
    HOMES.pop(name, None)


for _h in _BUILT_IN:
    register(_h)


def home(name: str) -> EngineHome:
    """The registered engine called ``name``; ``InputError`` naming the choices otherwise."""
    try:
        return HOMES[name]
    except (KeyError, TypeError):
        raise InputError(f"engine must be one of {', '.join(HOMES)}, got {name!r}") from None


class _Versions(Mapping[str, EngineVersion]):
    """engine -> its ``EngineVersion``, read from the registry as it is now."""

    def __getitem__(self, name: str) -> EngineVersion:
        return HOMES[name].version

    def __iter__(self) -> Iterator[str]:
        return iter(HOMES)

    def __len__(self) -> int:
        return len(HOMES)


class _Flags(Mapping[str, Mapping[str, str]]):
    """engine or router -> every flag its lines may hold -> where that version defines it."""

    def __getitem__(self, name: str) -> Mapping[str, str]:
        return HOMES[name].flags if name in HOMES else ROUTER_FLAGS[name]

    def __iter__(self) -> Iterator[str]:
        return iter([*HOMES, *ROUTER_FLAGS])

    def __len__(self) -> int:
        return len(HOMES) + len(ROUTER_FLAGS)


ENGINE_VERSIONS: Mapping[str, EngineVersion] = _Versions()
FLAGS: Mapping[str, Mapping[str, str]] = _Flags()
TRTLLM_KEYS, TRTLLM_DISAGG_KEYS = trtllm.TRTLLM_KEYS, trtllm.TRTLLM_DISAGG_KEYS
