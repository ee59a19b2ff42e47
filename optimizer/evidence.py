"""The evidence that decided, as an optuna study: every deployment the simulator judged, with its figures.

The screen's study (``optimizer.search.open_study``) holds the analytic screen's trials, which
order the race but decide nothing. What decided is the simulator's race and the disaggregated
search; ``write_evidence`` records it in the same storage as a second study, ``<study>-verified``,
with two objectives (minimise ``usd_per_hour``, maximise ``goodput_req_s``), so optuna-dashboard
and ``optuna.visualization.plot_pareto_front`` show the cost/goodput front the report draws
(``result.pareto``, ``optimizer.facts``). One trial per deployment:

- COMPLETE, with values: the pick (user attr ``pick``), each aggregated config the race verified
  feasible and sized, each disaggregated deployment the pool search sized from a full simulation,
  and the best of each other GPU type the workload lists;
- PRUNED, with the reason (user attrs ``status``, ``reason``): a config the race simulated and
  dropped (beaten at the rate it needed, verified infeasible, missed at zero load), a GPU type with no
  answer, and a sized deployment at the pick's own $/h, where the pick (robust to the request draw)
  stands for its price, as in the report's front.

Configs the race dropped without a simulation (a capacity bound, memory) stay out: the screen decided
those, and their count is a study attribute. Each trial's ``fidelity`` user attr names the highest
rung of evidence behind it: ``simulated`` (a full run on the workload's requests), ``robust`` (every
fresh draw met; the pick), ``short`` (a short run's confidence bound), ``zero_load``. A trial's
intermediate values are the race's rungs on that config (``pruner.Rung``): step i is the SLO
attainment the i-th simulation reached, and user attr ``rungs`` holds each rung (``pruner.Rung``:
fidelity, per-replica rate in req/s, requests, what judged it, its upper confidence bound, the
completions per second), so optuna-dashboard's intermediate-value plot shows where each config was
dropped against the attainment target, and ``pruner.NoiseBoundPruner(target).prune(study, trial)``
replays the race's drop on each trial.

Params: ``gpu`` and ``deployment`` (aggregated | disaggregated), then the kind's config flattened
(``prefill_tp``, ``decode_batch_cap``...), categorical over the values seen, integers over their range.
The study is written once per (storage, name): a solve is deterministic, so a study already there
with the same digest holds this answer and is left as it is.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, IntDistribution
from optuna.trial import FrozenTrial, TrialState

from .deployment import Aggregated
from .facts import at_pick_price, disaggregated_points, other_gpu_points, pick_point
from .liveness import pid_alive
from .pruner import RUNGS_ATTR
from .result import SolveResult
from .search import make_storage, quiet_optuna

__all__ = ["EvidenceRow", "evidence_rows", "evidence_study_name", "write_evidence", "METRICS"]

METRICS = ("usd_per_hour", "goodput_req_s")
SUFFIX = "-verified"
_COMPLETE_ATTR = "complete"


@dataclass(frozen=True)
class EvidenceRow:
    """One deployment the simulator judged: its flattened params, its figures (COMPLETE) or why it is out."""

    params: Mapping[str, Any]
    state: TrialState
    fidelity: str
    values: tuple[float, float] | None = None
    status: str = ""
    reason: str = ""
    attrs: Mapping[str, Any] = field(default_factory=dict)
    rungs: tuple = ()   # pruner.Rung's JSON per simulation the race ran on it: the intermediate values


def evidence_study_name(result: SolveResult, study_name: str | None = None) -> str:
    """``<study>-verified``: the name given (``--study-name``) or the screen study's."""
    return (study_name or result.study_name) + SUFFIX


def _flat(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in config.items():
        if isinstance(v, Mapping):
            out |= _flat(v, f"{prefix}{k}_")
        elif v is not None:
            out[f"{prefix}{k}"] = v
    return out


def _params(gpu: str, config: Mapping[str, Any]) -> dict[str, Any]:
    kind = config.get("deployment", "aggregated")
    return {"gpu": gpu, "deployment": kind, **_flat({k: v for k, v in config.items() if k not in ("deployment", "gpu")})}


def _race_fidelity(status: str, reason: str) -> str:
    """The highest rung a config the race dropped reached (``optimizer.simsearch``): a zero-load probe
    (``zero_load``; ``pruned``: it passed one, then its bound said it could not beat the best), a
    short run's confidence bound (``short``) or a full run at the rate it needed (``simulated``)."""
    if status in ("zero_load", "pruned"):
        return "zero_load"
    return "short" if "(at most" in reason else "simulated"


def evidence_rows(result: SolveResult, gpu: str | None = None) -> list[EvidenceRow]:
    """Every deployment the simulator judged for ``result`` (module docstring), the pick first.
    ``gpu``: the GPU type the race's rows ran on where the result names none (an infeasible answer
    names no recommendation): the workload's ``hardware.gpu``."""
    rec = result.recommendation
    gpu = getattr(rec, "gpu", None) or gpu or next((g.gpu for g in result.gpu_choice or ()), None) or "unnamed"
    pick = pick_point(result)
    rows: list[EvidenceRow] = []
    if pick is not None:
        rows.append(EvidenceRow(_params(gpu, pick.config), TrialState.COMPLETE, "robust",
                                (pick.usd_per_hour, pick.goodput_req_s), "pick", attrs={"pick": True, "gpus": pick.gpus}))

    def sized(params: dict[str, Any], usd: float, goodput: float, gpus: int, what: str) -> EvidenceRow:
        if pick is not None and at_pick_price(usd, pick.usd_per_hour):
            return EvidenceRow(params, TrialState.PRUNED, "simulated", None, "at_pick_price",
                               f"${usd:.2f}/h, the pick's price: the pick (robust to the request draw) stands for it "
                               f"({goodput:.3g} req/s {what})", {"gpus": gpus, "usd_per_hour": usd, "goodput_req_s": goodput})
        return EvidenceRow(params, TrialState.COMPLETE, "simulated", (usd, goodput), what, attrs={"gpus": gpus})

    pick_cfg = pick.config if pick is not None else None
    rungs = {Aggregated.from_config(o.config).key: tuple(o.rungs or ()) for o in result.race}
    if pick is not None and rows[0].params.get("deployment") == "aggregated":   # the pick: its config's rungs
        rows[0] = dataclasses.replace(rows[0], rungs=rungs.get(Aggregated.from_config(pick.config).key, ()))
    for v in result.verified:
        cfg = dict(v.config)
        if v.feasible and v.usd_per_hour is not None and v.goodput_req_s is not None:
            replicas = round(v.goodput_req_s / v.per_replica_goodput_req_s) if v.per_replica_goodput_req_s else None
            full = {**cfg, **({"replicas": replicas} if replicas else {})}
            if pick_cfg is not None and dict(full) == dict(pick_cfg):
                continue   # the pick itself, recorded above with its robust figures
            gpus = int(round(v.usd_per_hour / result.cost.usd_per_gpu_hour)) if result.cost else 0
            rows.append(dataclasses.replace(sized(_params(gpu, full), v.usd_per_hour, v.goodput_req_s, gpus, "verified"),
                                            rungs=rungs.get(Aggregated.from_config(cfg).key, ())))
        else:
            rows.append(EvidenceRow(_params(gpu, cfg), TrialState.PRUNED, "simulated", None, "infeasible",
                                    v.reason or "simulated SLO attainment misses the target",
                                    {"simulations": v.simulations}, rungs.get(Aggregated.from_config(cfg).key, ())))
    for o in result.race:
        if o.status == "verified" or o.simulations == 0:
            continue   # verified: above; no simulation: the screen's verdict, not the simulator's
        rows.append(EvidenceRow(_params(gpu, o.config), TrialState.PRUNED, _race_fidelity(o.status, o.reason), None,
                                o.status, o.reason, {"simulations": o.simulations}, tuple(o.rungs or ())))
    if result.cost is not None:
        h = result.cost.usd_per_gpu_hour
        for x in disaggregated_points(result, h, 1 << 30):
            if pick_cfg is not None and dict(x.config) == dict(pick_cfg):
                continue
            rows.append(sized(_params(gpu, x.config), x.usd_per_hour, x.goodput_req_s, x.gpus, "disaggregated"))
    for x in other_gpu_points(result):   # each other GPU type's best, as the report's front has it
        rows.append(sized(_params(x.config["gpu"], x.config), x.usd_per_hour, x.goodput_req_s, x.gpus,
                          f"best on {x.config['gpu']}"))
    for g in result.gpu_choice or ():
        if g.gpu != gpu and g.status != "ok":
            rows.append(EvidenceRow({"gpu": g.gpu}, TrialState.PRUNED, "simulated", None, g.status,
                                    g.reason or g.why))
    return rows


def _distributions(rows: list[EvidenceRow]) -> dict[str, BaseDistribution]:
    """One distribution per param over every value the rows hold (optuna needs one per name per study)."""
    seen: dict[str, set] = {}
    for r in rows:
        for k, v in r.params.items():
            seen.setdefault(k, set()).add(v)
    out: dict[str, BaseDistribution] = {}
    for k, vs in seen.items():
        if all(isinstance(v, int) and not isinstance(v, bool) for v in vs):
            out[k] = IntDistribution(min(vs), max(vs))
        else:
            out[k] = CategoricalDistribution(sorted(vs, key=lambda v: (type(v).__name__, str(v))))
    return out


def _trials(rows: list[EvidenceRow]) -> list[FrozenTrial]:
    dist = _distributions(rows)
    out = []
    for r in rows:
        attrs = {"fidelity": r.fidelity, "status": r.status, "evidence": "simulated", **r.attrs}
        if r.reason:
            attrs["reason"] = r.reason
        if r.rungs:   # step i: the i-th simulation's SLO attainment; each rung beside it, as the race's pruner read it
            attrs[RUNGS_ATTR] = [dict(g) for g in r.rungs]
        out.append(optuna.trial.create_trial(
            state=r.state, values=list(r.values) if r.values is not None else None,
            params=dict(r.params), distributions={k: dist[k] for k in r.params}, user_attrs=attrs,
            intermediate_values={i: float(g["attainment"]) for i, g in enumerate(r.rungs)}))
    return out


def write_evidence(result: SolveResult, storage_url: str, study_name: str | None = None,
                   gpu: str | None = None) -> tuple[str, int] | None:
    """Record ``result``'s evidence as the study ``evidence_study_name`` in ``storage_url`` (module
    docstring); (its name, the trials it holds), or None where another live process is writing it."""
    with quiet_optuna(), warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)   # set_metric_names, since 3.2
        return _write(result, storage_url, study_name, gpu)


def _write(result: SolveResult, storage_url: str, study_name: str | None, gpu: str | None) -> tuple[str, int] | None:
    name = evidence_study_name(result, study_name)
    storage = make_storage(storage_url)
    screen = result.study_name   # the screen's study this evidence belongs to
    try:
        got = optuna.load_study(study_name=name, storage=storage)
    except KeyError:
        got = None
    if got is not None:
        a = got.user_attrs
        if a.get(_COMPLETE_ATTR) and a.get("screen_study") == screen:
            return name, len(got.get_trials(deepcopy=False))
        if not a.get(_COMPLETE_ATTR) and a.get("host") == socket.gethostname() and a.get("pid") != os.getpid() \
                and pid_alive(int(a.get("pid", -1))):
            return None   # another worker of this solve is writing it
        optuna.delete_study(study_name=name, storage=storage)   # cut short by a killed writer, or another answer's
    try:
        study = optuna.create_study(storage=storage, study_name=name, directions=["minimize", "maximize"])
    except optuna.exceptions.DuplicatedStudyError:
        return None   # another worker made it first
    study.set_metric_names(list(METRICS))
    for k, v in (("host", socket.gethostname()), ("pid", os.getpid()), ("screen_study", screen),
                 ("objective", result.objective), ("status", result.status),
                 ("screened_only", sum(1 for o in result.race if o.simulations == 0 and o.status != "verified"))):
        study.set_user_attr(k, v)
    rows = evidence_rows(result, gpu)
    study.add_trials(_trials(rows))
    study.set_user_attr(_COMPLETE_ATTR, True)
    return name, len(rows)
