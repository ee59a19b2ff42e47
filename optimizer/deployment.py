"""The Deployment: the one record the search proposes, the simulator runs and the answer names.

Two kinds, each frozen, each with ``to_json``/``from_json``:

    Aggregated      ``replicas`` replicas of one engine config on one GPU type: a parallel
                    ``Layout`` (TP, PP, EP, DP-attention; a multi-node layout's label) and the
                    engine ``Knobs`` (batch cap, KV dtype, speculation length, chunk budget)
    Disaggregated   ``units`` copies of a unit of x prefill + y decode replicas (each pool its own
                    TP, replicas, batch cap and chunk budget), one KV dtype, the KV link

``gpus``, ``nodes`` and ``usd_per_hour`` are properties of the record and its ``Offer`` (the GPU
type at its price), never stored beside it. ``key`` names a deployment's config (not its replica
count) everywhere a config is named: the race's rows, work items, the study's trials.

A new search knob is one field on ``Knobs`` with its range in ``optimizer.space`` (that module's
docstring): the record's JSON, its key, the lattice and the study's parameters all read them.

``Aggregated`` also reads as the read-only mapping of its search config (``tp``, the knobs'
fields and, for a multi-node layout, ``layout``, ``pp``, ``ep``, ``dp_attention``): the ``config``
objects of the result's race and verified rows, a JSON contract, are this mapping.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from . import space

__all__ = ["Knobs", "Layout", "Offer", "Aggregated", "Pool", "Disaggregated", "Deployment", "deployment_from_json",
           "KNOB_NAMES"]


@dataclass(frozen=True)
class Knobs:
    """The engine settings of one replica: what the search turns besides the parallel layout."""

    batch_cap: int             # max concurrent sequences (vLLM --max-num-seqs)
    kv_dtype: str = "bf16"     # KV-cache format: bf16 | fp8
    spec_k: int = 0            # speculative draft length (0: off)
    chunk_tokens: int = 8192   # prefill chunk / token budget per step (vLLM --max-num-batched-tokens)

    def __post_init__(self) -> None:
        if int(self.batch_cap) < 1 or int(self.chunk_tokens) < 1 or int(self.spec_k) < 0:
            raise ValueError(f"knobs out of range: {self}")


KNOB_NAMES: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(Knobs))
_KNOB_DEFAULTS: dict[str, Any] = {f.name: f.default for f in dataclasses.fields(Knobs)}


def _key_suffix(k: Knobs) -> str:
    """What ``optimizer.space``'s axes add to a config key: ``-<tag><value>`` for each knob off its
    default, so the key of a config that does not turn them is what it was before they existed."""
    return "".join(f"-{a.tag}{getattr(k, a.name)}" for a in space.AXES
                   if getattr(k, a.name) != _KNOB_DEFAULTS[a.name])


@dataclass(frozen=True)
class Layout:
    """How one replica is split over GPUs: TP x PP GPUs; ``name`` labels a multi-node layout
    (``optimizer.layouts.layout_label``; None: plain TP inside one node)."""

    tp: int
    pp: int = 1
    ep: int = 1
    dp_attention: bool = False
    name: str | None = None

    @property
    def gpus(self) -> int:
        return int(self.tp) * int(self.pp)


@dataclass(frozen=True)
class Offer:
    """A GPU type at its price, as the workload's hardware section lists it."""

    gpu: str
    usd_per_gpu_hour: float
    gpus_per_node: int


def _nodes(gpus: int, gpus_per_node: int) -> int:
    return math.ceil(gpus / gpus_per_node)


@dataclass(frozen=True)
class Aggregated(Mapping):
    """``replicas`` replicas of one config (module docstring); ``offer`` None while the config is
    only a point of the search space (no price yet)."""

    kind: ClassVar[str] = "aggregated"
    _LAYOUT_KEYS: ClassVar[tuple[str, ...]] = ("layout", "pp", "ep", "dp_attention")

    layout: Layout
    knobs: Knobs
    replicas: int = 1
    offer: Offer | None = field(default=None, compare=False)
    _config: dict = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        cfg: dict[str, Any] = {"tp": self.layout.tp, **dataclasses.asdict(self.knobs)}
        if self.layout.name is not None:
            cfg |= {"layout": self.layout.name, "pp": self.layout.pp, "ep": self.layout.ep,
                    "dp_attention": self.layout.dp_attention}
        object.__setattr__(self, "_config", cfg)

    # ---- the search config, read as a mapping (the race's and verified rows' ``config``) ----
    def __getitem__(self, key: str) -> Any:
        return self._config[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._config)

    def __len__(self) -> int:
        return len(self._config)

    def __hash__(self) -> int:
        return hash((self.layout, self.knobs, self.replicas))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Aggregated):
            return (self.layout, self.knobs, self.replicas) == (other.layout, other.knobs, other.replicas)
        if isinstance(other, Mapping):   # a config read back from JSON: the same search point
            return self._config == dict(other)
        return NotImplemented

    @property
    def config(self) -> dict[str, Any]:
        """The search config as a plain dict (a copy)."""
        return dict(self._config)

    # ---- what the record implies ----
    @property
    def key(self) -> str:
        """The config's name: ``tp2-b64-bf16-k0-c8192`` (+ ``-<tag><value>`` for each of ``optimizer.space``'s
        knobs off its default, + ``-<layout>``); the replica count is not part of it."""
        k = self.knobs
        key = f"tp{self.layout.tp}-b{k.batch_cap}-{k.kv_dtype}-k{k.spec_k}-c{k.chunk_tokens}" + _key_suffix(k)
        return key + (f"-{self.layout.name}" if self.layout.name else "")

    @property
    def structure(self) -> tuple:
        """What one step model serves (TP, layout, KV dtype, speculation length): configs that differ
        only in batch cap and chunk budget share it."""
        return (self.layout.tp, self.layout.name, self.knobs.kv_dtype, self.knobs.spec_k)

    @property
    def gpus_per_replica(self) -> int:
        return self.layout.gpus

    @property
    def gpus(self) -> int:
        return self.replicas * self.layout.gpus

    @property
    def nodes(self) -> int:
        return _nodes(self.gpus, self._offer().gpus_per_node)

    @property
    def usd_per_hour(self) -> float:
        return self.gpus * self._offer().usd_per_gpu_hour

    def _offer(self) -> Offer:
        if self.offer is None:
            raise ValueError(f"{self.key}: a search point has no GPU offer (price, node size)")
        return self.offer

    def sized(self, replicas: int, offer: Offer | None = None) -> Aggregated:
        return dataclasses.replace(self, replicas=int(replicas), offer=offer or self.offer)

    # ---- construction and JSON ----
    @classmethod
    def from_config(cls, p: Mapping[str, Any], replicas: int = 1, offer: Offer | None = None) -> Aggregated:
        """From a search config mapping (``tp``, the knobs' fields, optionally a layout's keys)."""
        if isinstance(p, Aggregated):
            return p if replicas == p.replicas and offer is None else p.sized(replicas, offer)
        layout = Layout(tp=int(p["tp"]), pp=int(p.get("pp", 1)), ep=int(p.get("ep", 1)),
                        dp_attention=bool(p.get("dp_attention", False)), name=p.get("layout") or None)
        knobs = Knobs(**{k: p[k] for k in KNOB_NAMES if k in p})
        return cls(layout, knobs, int(replicas), offer)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"deployment": self.kind, **self.config, "replicas": self.replicas}
        if self.offer is not None:
            o = self.offer
            out |= {"gpu": o.gpu, "usd_per_gpu_hour": o.usd_per_gpu_hour, "gpus_per_node": o.gpus_per_node}
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Aggregated:
        offer = Offer(d["gpu"], float(d["usd_per_gpu_hour"]), int(d["gpus_per_node"])) if "gpu" in d else None
        return cls.from_config(d, int(d.get("replicas", 1)), offer)


@dataclass(frozen=True)
class Pool:
    """One pool of a disaggregated unit: ``replicas`` replicas of TP ``tp`` GPUs with their knobs."""

    tp: int
    replicas: int
    batch_cap: int
    chunk_tokens: int

    @property
    def gpus(self) -> int:
        return self.tp * self.replicas

    def to_json(self) -> dict[str, Any]:
        return {"tp": self.tp, "replicas": self.replicas, "batch_cap": self.batch_cap,
                "chunk_tokens": self.chunk_tokens, "gpus": self.gpus}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Pool:
        return cls(int(d["tp"]), int(d["replicas"]), int(d["batch_cap"]), int(d["chunk_tokens"]))


@dataclass(frozen=True)
class Disaggregated:
    """``units`` copies of one unit of a prefill and a decode pool (module docstring)."""

    kind: ClassVar[str] = "disaggregated"

    prefill: Pool
    decode: Pool
    kv_dtype: str
    link: str                  # "nvlink" | "network": how the KV cache moves from prefill to decode
    units: int = 1
    offer: Offer | None = field(default=None, compare=False)

    @property
    def key(self) -> str:
        p, d = self.prefill, self.decode
        return (f"p{p.replicas}xtp{p.tp}-b{p.batch_cap}-c{p.chunk_tokens}+d{d.replicas}xtp{d.tp}-b{d.batch_cap}"
                f"-{self.kv_dtype}-{self.link}")

    @property
    def gpus_per_unit(self) -> int:
        return self.prefill.gpus + self.decode.gpus

    @property
    def gpus(self) -> int:
        return self.units * self.gpus_per_unit

    @property
    def nodes(self) -> int:
        if self.offer is None:
            raise ValueError(f"{self.key}: a search point has no GPU offer (price, node size)")
        return _nodes(self.gpus, self.offer.gpus_per_node)

    @property
    def usd_per_hour(self) -> float:
        if self.offer is None:
            raise ValueError(f"{self.key}: a search point has no GPU offer (price, node size)")
        return self.gpus * self.offer.usd_per_gpu_hour

    def sized(self, units: int, offer: Offer | None = None) -> Disaggregated:
        return dataclasses.replace(self, units=int(units), offer=offer or self.offer)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"deployment": self.kind, "prefill": self.prefill.to_json(),
                               "decode": self.decode.to_json(), "kv_dtype": self.kv_dtype, "link": self.link,
                               "units": self.units}
        if self.offer is not None:
            o = self.offer
            out |= {"gpu": o.gpu, "usd_per_gpu_hour": o.usd_per_gpu_hour, "gpus_per_node": o.gpus_per_node}
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Disaggregated:
        offer = Offer(d["gpu"], float(d["usd_per_gpu_hour"]), int(d["gpus_per_node"])) if "gpu" in d else None
        return cls(Pool.from_json(d["prefill"]), Pool.from_json(d["decode"]), str(d["kv_dtype"]), str(d["link"]),
                   int(d.get("units", 1)), offer)


Deployment = Aggregated | Disaggregated


def deployment_from_json(d: Mapping[str, Any]) -> Aggregated | Disaggregated:
    """Either kind from its ``to_json`` object (``deployment`` says which; aggregated when absent)."""
    return Disaggregated.from_json(d) if d.get("deployment") == "disaggregated" else Aggregated.from_json(d)
