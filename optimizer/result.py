"""The solve result: what ``kvtune solve`` answers and writes with ``--json``, as frozen records.

``SolveResult.to_json`` is the ``--json`` file (before ``optimizer.cli._common.dumps`` writes inf
and nan as strings); its keys and their order are a user contract. ``SolveResult.from_json`` reads
it back, from that dict or from the parsed file. ``optimizer.recommend`` builds the aggregated
answer, ``optimizer.gpu_choice`` adds ``gpu_choice`` and ``optimizer.deployment_choice`` adds
``deployment`` (and, when the disaggregated deployment wins, its own recommendation).

The sections with a fixed shape are records here; the launch settings (one entry per engine and
version, ``optimizer.launch``), the calibration's provenance and a search config (the search's
parameter dict: ``tp``, ``batch_cap``, ... plus a layout's keys) stay JSON objects.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import (Any, ClassVar, Mapping, Protocol, TypeVar, get_args, get_origin, get_type_hints,
                    runtime_checkable)

from .disagg import DisaggCandidate, PoolChoice
from .plan import PlanFile   # the plan file a solve wrote (--plan), read back with the result

__all__ = ["SolveResult", "TrialCounts", "VerificationCounts", "Recommendation", "DisaggregatedRecommendation",
           "Predicted", "Screened", "Cost", "StepTerms", "Bottleneck", "ParetoPoint", "VerifiedRow", "RaceRow",
           "Closest", "ProfileUse", "GpuChoiceRow", "AggregatedSummary", "DisaggregatedSummary",
           "DisaggregatedMiss", "DeploymentChoice", "JsonObject"]

JsonObject = dict[str, Any]   # a JSON object as Python reads it

_NONFINITE = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}


def _num(x: Any) -> Any:
    """A value read back: the strings the output writes for inf and nan become floats again."""
    return _NONFINITE[x] if isinstance(x, str) and x in _NONFINITE else x


def _nums(d: Mapping[str, Any]) -> dict[str, Any]:
    return {k: _num(v) for k, v in d.items()}


def _plain(v: Any) -> Any:
    return list(v) if isinstance(v, tuple) else v


_F = TypeVar("_F", bound="_Flat")


class _Flat:
    """A record whose JSON object is its fields in order: tuples written as lists, the fields named
    in ``_OMIT_NONE`` left out while None, and on reading, inf and nan strings back to floats where
    the field holds floats (or a mapping of them) and lists back to tuples where it holds a tuple."""

    __dataclass_fields__: ClassVar[dict[str, Any]]
    _OMIT_NONE: ClassVar[tuple[str, ...]] = ()

    def to_json(self) -> JsonObject:
        return {f.name: _plain(getattr(self, f.name)) for f in fields(self)
                if not (f.name in self._OMIT_NONE and getattr(self, f.name) is None)}

    @classmethod
    def from_json(cls: type[_F], d: Mapping[str, Any]) -> _F:
        kw = {}
        hints = get_type_hints(cls)   # the annotations resolved (they are postponed strings)
        for f in fields(cls):
            v = d.get(f.name) if f.name in cls._OMIT_NONE else d[f.name]
            if _holds(hints[f.name], float):
                v = _nums(v) if isinstance(v, Mapping) else _num(v)
            elif _holds(hints[f.name], tuple) and isinstance(v, list):
                v = tuple(v)
            kw[f.name] = v
        return cls(**kw)


def _holds(tp: Any, kind: type) -> bool:
    """Whether annotation ``tp`` is ``kind`` or holds it: ``float | None``, ``Mapping[str, float]``,
    ``tuple[str, ...]`` (for ``tuple``, the origin)."""
    return tp is kind or get_origin(tp) is kind or any(_holds(a, kind) for a in get_args(tp) if a is not Ellipsis)


# ---- the study and the simulator race ------------------------------------------------------------
@dataclass(frozen=True)
class TrialCounts(_Flat):
    """The analytic screen's trials in the study."""

    completed: int
    feasible: int


@dataclass(frozen=True)
class VerificationCounts(_Flat):
    """How much the simulator race ran: configs verified, simulations, distinct work items, and
    each outcome's count (``optimizer.simsearch.Race.counts``, in the order they first occurred)."""

    _OMIT_NONE = ("lattice_configs", "raced", "searched")
    configs: int
    simulations: int
    work_items: int
    outcomes: Mapping[str, int]
    # how much of the space the race covered: ``exhaustive`` (every config of the lattice) or ``sampled``
    # (only the configs the screen's study proposed, ``search.exhaustive_max_configs``); None: a result
    # written before these keys
    lattice_configs: int | None = None
    raced: int | None = None
    searched: str | None = None


@dataclass(frozen=True)
class ProfileUse(_Flat):
    """How much a measured profile table answered (``optimizer.step_factory.StepFactory.record``)."""

    path: str
    sha256: str
    rows_used: int
    fallbacks: int
    step_evaluations: int
    unmatched: tuple[str, ...]


@dataclass(frozen=True)
class VerifiedRow(_Flat):
    """One config the simulator verified (``optimizer.verify.Verification``), as the result lists it."""

    config: JsonObject
    feasible: bool
    usd_per_hour: float | None
    goodput_req_s: float | None
    per_replica_goodput_req_s: float
    simulations: int
    reason: str


@dataclass(frozen=True)
class RaceRow(_Flat):
    """What the race concluded about one config (``optimizer.simsearch.Outcome``); ``rungs``: the
    simulations behind it (``pruner.Rung``: fidelity, per-replica rate, requests, SLO attainment, what
    judged it, its upper bound, completions per second; None in a result written before they were kept)."""

    _OMIT_NONE = ("rungs",)

    config: JsonObject
    status: str
    reason: str
    simulations: int
    rungs: tuple[JsonObject, ...] | None = None


# ---- the answer ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Recommendation(_Flat):
    """An aggregated deployment: ``replicas`` replicas of one config (its parallel layout filled in,
    ``optimizer.layouts.layout_params``; ``layout`` only for a multi-node layout)."""

    _OMIT_NONE = ("layout", "knobs")

    tp: int
    batch_cap: int
    kv_dtype: str
    spec_k: int
    chunk_tokens: int
    pp: int
    ep: int
    dp_attention: bool
    nodes_per_replica: int
    gpus_per_node: int
    layout: str | None
    replicas: int
    gpus: int
    nodes: int
    gpu: str
    model: str
    knobs: JsonObject | None = None   # optimizer.space's searched knobs, by name (None: it searched none)


@dataclass(frozen=True)
class DisaggregatedRecommendation:
    """A disaggregated deployment in the aggregated recommendation's keys (``tp``/``batch_cap`` of
    the decode pool, ``chunk_tokens`` of the prefill pool, ``replicas``/``gpus`` of the whole
    deployment) plus both pools (replicas summed over the ``units``) and the KV link."""

    deployment: ClassVar[str] = "disaggregated"

    tp: int
    batch_cap: int
    kv_dtype: str
    spec_k: int
    chunk_tokens: int
    replicas: int
    gpus: int
    nodes: int
    gpu: str
    model: str
    prefill: PoolChoice
    decode: PoolChoice
    link: str                 # "nvlink" | "network"
    units: int

    def to_json(self) -> JsonObject:
        return {"deployment": self.deployment, "tp": self.tp, "batch_cap": self.batch_cap, "kv_dtype": self.kv_dtype,
                "spec_k": self.spec_k, "chunk_tokens": self.chunk_tokens, "replicas": self.replicas,
                "gpus": self.gpus, "nodes": self.nodes, "gpu": self.gpu, "model": self.model,
                "prefill": self.prefill.to_json(), "decode": self.decode.to_json(), "link": self.link,
                "units": self.units}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> DisaggregatedRecommendation:
        return cls(tp=d["tp"], batch_cap=d["batch_cap"], kv_dtype=d["kv_dtype"], spec_k=d["spec_k"],
                   chunk_tokens=d["chunk_tokens"], replicas=d["replicas"], gpus=d["gpus"], nodes=d["nodes"],
                   gpu=d["gpu"], model=d["model"], prefill=PoolChoice.from_json(d["prefill"]),
                   decode=PoolChoice.from_json(d["decode"]), link=d["link"], units=d["units"])


def _recommendation(d: Mapping[str, Any]) -> Recommendation | DisaggregatedRecommendation:
    if d.get("deployment") == "disaggregated":
        return DisaggregatedRecommendation.from_json(d)
    return Recommendation.from_json(d)


@dataclass(frozen=True)
class Predicted(_Flat):
    """The pick's figures, all simulated: goodput, and the latency percentiles (``mean``, ``p50``,
    ``p90``, ``p99``, in ms) at its real load per replica (per unit, for a disaggregated one)."""

    _OMIT_NONE = ("per_replica_is", "draws", "check", "ranked_goodput_req_s")

    goodput_req_s: float
    per_replica_goodput_req_s: float
    slo_attainment: float
    ttft_ms: Mapping[str, float]
    tpot_ms: Mapping[str, float]
    output_tok_s: float
    tok_s_per_user: float
    load_per_replica_req_s: float
    evidence: str
    per_replica_is: str | None = None   # what "per replica" means, where not one replica
    draws: Mapping[str, Any] | None = None  # the fresh draws the pick was verified on (optimizer.verify.Draws)
    check: str | None = None            # the ``kvtune simulate`` command that reproduces these figures
    ranked_goodput_req_s: float | None = None   # goodput on the workload's own draw, which ranks deployments


@dataclass(frozen=True)
class Screened(_Flat):
    """The analytic screen's figures for the pick (``optimizer.search.Evaluation.screened``)."""

    per_replica_goodput_req_s: float
    batch: int
    batch_limit: str
    tpot_ms: float
    ttft_ms: float
    ttft_zero_load_ms: float
    tpot_batch1_ms: float


@dataclass(frozen=True)
class Cost(_Flat):
    """The pick's price: ``priced_at`` the target rate (min_cost) or its goodput (max_goodput)."""

    usd_per_hour: float
    usd_per_gpu_hour: float
    usd_per_million_output_tokens: float
    priced_at: str


@dataclass(frozen=True)
class StepTerms(_Flat):
    """The screen's step at the operating batch: its time and terms, the KV pool and the batch limits."""

    step_ms: float | None
    mem_ms: float | None
    compute_ms: float | None
    comm_ms: float | None
    kv_pool_tokens: float | None
    kv_pool_used: float | None
    prefill_tokens_per_step: float | None
    limits: Mapping[str, Any] | None


@dataclass(frozen=True)
class Bottleneck:
    """What limits the pick: ``term`` (``kv_pool``, ``bandwidth``, ``compute``, ``prefill``, or
    ``disaggregated``, which has no single step), the batch limit, and the step's terms."""

    term: str
    batch_limit: str | None
    operating_batch: int | None
    step: StepTerms | None = None    # None for a disaggregated deployment

    def to_json(self) -> JsonObject:
        out: JsonObject = {"term": self.term, "batch_limit": self.batch_limit, "operating_batch": self.operating_batch}
        return out | (self.step.to_json() if self.step is not None else {})

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Bottleneck:
        return cls(d["term"], d["batch_limit"], d["operating_batch"],
                   StepTerms.from_json(d) if "step_ms" in d else None)


@dataclass(frozen=True)
class ParetoPoint(_Flat):
    """One deployment on the cost/goodput front (``config``: the search config plus ``replicas``)."""

    gpus: int
    usd_per_hour: float
    goodput_req_s: float
    config: JsonObject
    evidence: str


@dataclass(frozen=True)
class Closest:
    """The closest miss of an infeasible solve: its config (None when none fits in memory) and
    why it misses; the SLO attainment it reaches alone (a zero-load miss), or, for a config the
    simulator verified (``priced``), its $/h (None where it missed even at a trickle)."""

    config: JsonObject | None
    miss: str
    attainment: float | None = None
    usd_per_hour: float | None = None
    priced: bool = False

    def to_json(self) -> JsonObject:
        out: JsonObject = {"config": self.config, "miss": self.miss}
        if self.attainment is not None:
            out["attainment"] = self.attainment
        if self.priced:
            out["usd_per_hour"] = self.usd_per_hour
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Closest:
        return cls(d["config"], d["miss"], _num(d.get("attainment")), _num(d.get("usd_per_hour")),
                   "usd_per_hour" in d)


# ---- the outer choices: GPU type, kind of deployment ---------------------------------------------
@dataclass(frozen=True)
class GpuChoiceRow:
    """One GPU type of a ``hardware.gpu`` list (``optimizer.gpu_choice``): its best config (status
    ok) or why none met the SLOs, and ``why`` it was chosen or lost. ``deployment`` (once the
    answer is settled, ``optimizer.facts``): the kind of deployment the figures describe."""

    gpu: str
    usd_per_gpu_hour: float
    status: str
    source: str
    why: str
    usd_per_hour: float | None = None
    goodput_req_s: float | None = None
    gpus: int | None = None
    nodes: int | None = None
    config: JsonObject | None = None
    reason: str | None = None
    deployment: str | None = None   # which kind this type's figures are: aggregated | disaggregated

    def to_json(self) -> JsonObject:
        out: JsonObject = {"gpu": self.gpu, "usd_per_gpu_hour": self.usd_per_gpu_hour, "status": self.status,
                           "source": self.source, "usd_per_hour": self.usd_per_hour, "goodput_req_s": self.goodput_req_s}
        if self.status == "ok":
            out |= {"gpus": self.gpus, "nodes": self.nodes, "config": self.config}
            if self.deployment is not None:
                out["deployment"] = self.deployment
        else:
            out["reason"] = self.reason
        return out | {"why": self.why}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> GpuChoiceRow:
        return cls(gpu=d["gpu"], usd_per_gpu_hour=d["usd_per_gpu_hour"], status=d["status"], source=d["source"],
                   why=d["why"], usd_per_hour=d["usd_per_hour"], goodput_req_s=d["goodput_req_s"],
                   gpus=d.get("gpus"), nodes=d.get("nodes"), config=d.get("config"), reason=d.get("reason"),
                   deployment=d.get("deployment"))


@dataclass(frozen=True)
class AggregatedSummary(_Flat):
    """The best aggregated deployment, as the deployment choice compares it."""

    _OMIT_NONE = ("ranked_goodput_req_s",)

    gpus: int
    usd_per_hour: float
    goodput_req_s: float
    per_replica_goodput_req_s: float | None
    config: JsonObject
    ranked_goodput_req_s: float | None = None   # on the workload's own draw (what deployments are ranked on)


@dataclass(frozen=True)
class DisaggregatedSummary:
    """The best disaggregated deployment: ``units`` copies of ``unit`` (x prefill + y decode replicas)."""

    gpus: int
    nodes: int
    usd_per_hour: float
    goodput_req_s: float
    units: int
    unit: DisaggCandidate
    kv_dtype: str
    engine: str
    evidence: str
    ranked_goodput_req_s: float | None = None   # on the workload's own draw (what deployments are ranked on)

    def to_json(self) -> JsonObject:
        out = {"gpus": self.gpus, "nodes": self.nodes, "usd_per_hour": self.usd_per_hour,
               "goodput_req_s": self.goodput_req_s, "units": self.units, "unit": self.unit.to_json(),
               "kv_dtype": self.kv_dtype, "engine": self.engine, "evidence": self.evidence}
        if self.ranked_goodput_req_s is not None:
            out["ranked_goodput_req_s"] = self.ranked_goodput_req_s
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> DisaggregatedSummary:
        return cls(d["gpus"], d["nodes"], d["usd_per_hour"], d["goodput_req_s"], d["units"],
                   DisaggCandidate.from_json(d["unit"]), d["kv_dtype"], d["engine"], d["evidence"],
                   _num(d.get("ranked_goodput_req_s")))


@dataclass(frozen=True)
class DisaggregatedMiss(_Flat):
    """Why no disaggregated deployment qualifies: ``status`` infeasible or skipped."""

    status: str
    reason: str


@dataclass(frozen=True)
class DeploymentChoice:
    """Which kind of deployment won (``optimizer.deployment_choice``): ``kind`` (None where
    neither met the SLOs) and, when the disaggregated kind was searched, both kinds' best, the
    disaggregated search per KV dtype (``optimizer.disagg.DisaggSearch.to_json``), and the
    winner's ``margin_pct`` ``against`` the other kind."""

    searched: tuple[str, ...]
    kind: str | None
    aggregated: AggregatedSummary | None = None
    disaggregated: DisaggregatedSummary | DisaggregatedMiss | None = None
    search: tuple[JsonObject, ...] = ()
    margin_pct: float | None = None
    against: str | None = None

    def to_json(self) -> JsonObject:
        if "disaggregated" not in self.searched:
            return {"kind": self.kind, "searched": list(self.searched)}
        return {"searched": list(self.searched),
                "aggregated": self.aggregated.to_json() if self.aggregated is not None else None,
                "disaggregated": self.disaggregated.to_json() if self.disaggregated is not None else None,
                "search": list(self.search), "kind": self.kind, "margin_pct": self.margin_pct,
                "against": self.against}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> DeploymentChoice:
        searched = tuple(d["searched"])
        if "disaggregated" not in searched:
            return cls(searched, d["kind"])
        a, x = d["aggregated"], d["disaggregated"]
        dis: DisaggregatedSummary | DisaggregatedMiss | None = None
        if x is not None:
            dis = DisaggregatedMiss.from_json(x) if "status" in x else DisaggregatedSummary.from_json(x)
        return cls(searched, d["kind"], AggregatedSummary.from_json(a) if a is not None else None, dis,
                   tuple(d["search"]), _num(d["margin_pct"]), d["against"])


# ---- the whole result ----------------------------------------------------------------------------
@dataclass(frozen=True)
class SolveResult:
    """``kvtune solve``'s answer: ``status`` ok (a recommendation with its simulated figures, cost,
    bottleneck and launch settings) or infeasible (``reason`` and the ``closest`` miss), with the
    provenance of every figure (version, seeds, efficiency source, calibration, profile use) and
    the evidence (the screen's trials, the race's verifications and outcomes)."""

    kvtune_version: str
    seed: int
    workload_seed: int
    sampler: str
    source: str                                 # where the step times came from (one line)
    objective: str
    study_name: str
    target_rate_req_s: float
    trials: TrialCounts
    verification: VerificationCounts
    status: str                                 # "ok" | "infeasible"
    verified: tuple[VerifiedRow, ...]
    race: tuple[RaceRow, ...]
    calibration: Mapping[str, Any] | None = None   # {name, path, sha256} or {"name": "ideal"}
    admission: str | None = None
    profile: ProfileUse | None = None
    # status infeasible
    reason: str | None = None
    closest: Closest | None = None
    # status ok
    recommendation: Recommendation | DisaggregatedRecommendation | None = None
    predicted: Predicted | None = None
    screened: Screened | None = None            # None when the aggregated search found nothing
    cost: Cost | None = None
    bottleneck: Bottleneck | None = None
    headroom: float | None = None               # simulated goodput over the target rate, minus 1
    pareto: tuple[ParetoPoint, ...] | None = None
    launch: Mapping[str, Any] | None = None     # per engine: a command line (or command and config), k8s
    notes: tuple[str, ...] | None = None
    # the outer choices and the CLI
    gpu_choice: tuple[GpuChoiceRow, ...] | None = None
    launch_aggregated: Mapping[str, Any] | None = None   # the aggregated pick's, when disaggregated won
    deployment: DeploymentChoice | None = None
    engine: str | None = None                   # the engine whose launch line is printed (None: vLLM's)
    report: str | None = None                   # report.md's path (--report)
    plan: PlanFile | None = None                # the request plan --plan wrote and the command replaying it

    def to_json(self) -> JsonObject:
        """The ``--json`` object, keys in the order the answer is built: the provenance, then the
        aggregated search's answer, then what the GPU-type and deployment-kind choices add."""
        out: JsonObject = {"kvtune_version": self.kvtune_version, "seed": self.seed,
                           "workload_seed": self.workload_seed, "sampler": self.sampler, "source": self.source}
        _put(out, "calibration", dict(self.calibration) if self.calibration is not None else None)
        _put(out, "admission", self.admission)
        _put(out, "profile", self.profile)
        out |= {"objective": self.objective, "study_name": self.study_name,
                "target_rate_req_s": self.target_rate_req_s, "trials": self.trials.to_json(),
                "verification": self.verification.to_json(), "status": self.status}
        verified = [v.to_json() for v in self.verified]
        race = [o.to_json() for o in self.race]
        if self.status != "ok":
            out |= {"verified": verified, "race": race, "reason": self.reason,
                    "closest": self.closest.to_json() if self.closest is not None else None}
            _put(out, "gpu_choice", self.gpu_choice)
        elif self.screened is None:   # the aggregated search found nothing; the disaggregated kind answers
            out |= {"verified": verified, "race": race}
            _put(out, "gpu_choice", self.gpu_choice)
            _put(out, "recommendation", self.recommendation)
            _put(out, "predicted", self.predicted)
            _put(out, "cost", self.cost)
            out["headroom"] = self.headroom
            _put(out, "bottleneck", self.bottleneck)
            _put(out, "launch", self.launch)
        else:
            _put(out, "recommendation", self.recommendation)
            _put(out, "predicted", self.predicted)
            _put(out, "screened", self.screened)
            _put(out, "cost", self.cost)
            _put(out, "bottleneck", self.bottleneck)
            out["headroom"] = self.headroom
            _put(out, "pareto", self.pareto)
            out |= {"verified": verified, "race": race}
            _put(out, "launch", self.launch)
            _put(out, "notes", self.notes)
            _put(out, "gpu_choice", self.gpu_choice)
            _put(out, "launch_aggregated", self.launch_aggregated)
        _put(out, "deployment", self.deployment)
        out["engine"] = self.engine
        _put(out, "report", self.report)
        _put(out, "plan", self.plan)
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> SolveResult:
        """Read ``to_json``'s object back (or the parsed ``--json`` file)."""
        def opt(key: str, read: Any) -> Any:
            v = d.get(key)
            return None if v is None else read(v)

        def rows(key: str, read: Any) -> Any:
            return opt(key, lambda v: tuple(read(x) for x in v))

        return cls(
            kvtune_version=d["kvtune_version"], seed=d["seed"], workload_seed=d["workload_seed"], sampler=d["sampler"],
            source=d["source"], objective=d["objective"], study_name=d["study_name"],
            target_rate_req_s=_num(d["target_rate_req_s"]), trials=TrialCounts.from_json(d["trials"]),
            verification=VerificationCounts.from_json(d["verification"]), status=d["status"],
            verified=rows("verified", VerifiedRow.from_json) or (), race=rows("race", RaceRow.from_json) or (),
            calibration=d.get("calibration"), admission=d.get("admission"),
            profile=opt("profile", ProfileUse.from_json), reason=d.get("reason"),
            closest=opt("closest", Closest.from_json), recommendation=opt("recommendation", _recommendation),
            predicted=opt("predicted", Predicted.from_json), screened=opt("screened", Screened.from_json),
            cost=opt("cost", Cost.from_json), bottleneck=opt("bottleneck", Bottleneck.from_json),
            headroom=_num(d.get("headroom")), pareto=rows("pareto", ParetoPoint.from_json),
            launch=d.get("launch"), notes=opt("notes", tuple), gpu_choice=rows("gpu_choice", GpuChoiceRow.from_json),
            launch_aggregated=d.get("launch_aggregated"), deployment=opt("deployment", DeploymentChoice.from_json),
            engine=d.get("engine"), report=d.get("report"), plan=opt("plan", _plan_file))


def _plan_file(d: Mapping[str, Any]) -> PlanFile:
    return PlanFile.from_json(d)


@runtime_checkable
class _Record(Protocol):
    def to_json(self) -> JsonObject: ...


def _put(out: JsonObject, key: str, v: Any) -> None:
    """``out[key]``: a record as its JSON object, a tuple as a list (of records' objects); nothing
    when None."""
    if v is None:
        return
    if isinstance(v, tuple):
        out[key] = [x.to_json() if isinstance(x, _Record) else x for x in v]
    else:
        out[key] = v.to_json() if isinstance(v, _Record) else v
