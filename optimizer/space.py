"""The search's knob axes beyond the four the physics models (batch cap, KV dtype, speculation
length, chunk budget): one ``KnobAxis`` row each.

A new search knob is

    1. one field on ``optimizer.deployment.Knobs`` (its default: what a deployment that does not
       search it runs), and
    2. one ``KnobAxis`` row in ``AXES`` below (its range, its tag in a config key),

and, where an engine can set it, one entry in that engine's ``KNOB_FLAGS`` (its home module,
``optimizer/launch/<engine>.py``; the flag is then in its ``FLAGS`` too). From those: the workload
reads ``search.<name>: [lo, hi]``; the screen's study suggests it, the lattice and the race take its
values, seed trials start it mid-range; the record's key, JSON and the race's ``config`` rows hold it;
the recommendation's ``knobs`` object and the printed answer name it; the launch line sets it.

An engine without a flag for a knob cannot launch its other values, so the space holds the knob at
its default for that engine (what the engine can launch cuts the space; ``searched``). The axes are
searched for aggregated deployments; a disaggregated unit's pools run the knobs at their defaults.
An editor's schema for the workload (profiles/schemas/workload.schema.json) lists ``search``'s keys
by hand: tests/cli/test_conventions.py fails until the new key is added there (a fourth edit). The four
physics knobs keep their own code in ``optimizer.search`` (their sampling order is part of what a
seed reproduces) and in the launch lines (each maps to engine-specific flags and configs).

``tests/optimizer/test_toy_knob.py`` adds a knob by exactly these edits to a copy of the package and
follows it from the workload file to the launch line.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["KnobAxis", "AXES", "searched", "values", "lattice", "knob_argv"]


@dataclass(frozen=True)
class KnobAxis:
    """One searched knob: ``name`` a ``Knobs`` field, taking the whole numbers of ``[lo, hi]`` as
    ``lattice`` steps them (the workload's ``search.<name>`` narrows it, within ``[lo_min, hi_max]``)."""

    name: str
    tag: str                      # its mark in a config key: ``-<tag><value>`` when not at the default
    default_range: tuple[int, int]
    lo_min: int = 0
    hi_max: int = 1 << 30
    doubling: bool = False        # the values are the powers of 2 in range plus its bounds (``lattice``)

    def __post_init__(self) -> None:
        lo, hi = self.default_range
        if not self.lo_min <= lo <= hi <= self.hi_max:
            raise ValueError(f"knob axis {self.name}: default range {self.default_range} outside "
                             f"[{self.lo_min}, {self.hi_max}]")


# The shipped knobs beyond the physics four: none yet. A row here and a field on Knobs make one.
AXES: tuple[KnobAxis, ...] = ()


def lattice(lo: int, hi: int, doubling: bool) -> list[int]:
    """The values an axis takes in [lo, hi]: every whole number, or (``doubling``) the powers of 2
    plus the bounds, the batch caps' and chunk budgets' rule (``optimizer.search.lattice`` says why)."""
    if not doubling:
        return list(range(lo, hi + 1))
    return sorted({lo, hi, *(1 << i for i in range(0, 31) if lo <= (1 << i) <= hi)})


def searched(engine_flags: Mapping[str, object]) -> list[KnobAxis]:
    """The axes a search turns: those the engine has a flag for (``engine_flags``: its KNOB_FLAGS)."""
    return [a for a in AXES if a.name in engine_flags]


def values(a: KnobAxis, ranges: Mapping[str, tuple[int, int]]) -> list[int]:
    """The values the search takes for ``a`` under the workload's ranges (``SearchSpec.knobs``)."""
    lo, hi = ranges.get(a.name, a.default_range)
    return lattice(int(lo), int(hi), a.doubling)


def knob_argv(knob_flags: Mapping[str, tuple[str, str]], knobs: Mapping[str, Any]) -> list[str]:
    """The launch words for the axes' knobs an engine sets (``knob_flags``: knob name -> (flag, where
    the engine defines it), the engine home's KNOB_FLAGS)."""
    out: list[str] = []
    for a in AXES:
        if a.name in knob_flags and a.name in knobs:
            out += [knob_flags[a.name][0], str(knobs[a.name])]
    return out
