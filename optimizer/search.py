"""The optuna study of the analytic screen, one trial per config, and the context every solve uses.

The screen's trials are the search's prior and its browsable record (optuna-dashboard); what is
recommended is decided by the simulator race over the whole lattice (``optimizer.simsearch``),
which does not depend on which configs these trials visited.

A trial picks TP, batch cap (log scale), KV dtype, speculative length (only with a
``speculative:`` section) and chunk budget (log scale); ``optimizer.screen`` bounds the
per-replica goodput and the replica count follows:

    min_cost      replicas = ceil(rate / goodput), gpus = replicas x TP, nodes = ceil(gpus / per node)
                  objective: $/h (ties: more headroom first)
    max_goodput   replicas = the GPUs max_nodes offers // TP; objective: goodput per $
    --sampler nsga2  replicas searched too (as nodes); objectives ($/h, goodput): the Pareto front

Infeasible trials (does not fit, misses SLOs, over the node budget) carry a constraint vector
(every entry <= 0: feasible) under optuna's own key, the trial system attribute ``constraints``,
which the samplers and optuna-dashboard read (so the dashboard marks infeasible trials, whose
value is the penalty), and in ``user_attrs['constraint']`` with ``constraint_names``. The study's
``metric_names`` say what its values are (``metric_names``). Each trial stores its whole
evaluation in ``user_attrs['eval']``.

Several processes may share one storage: before each ask a process counts the study's finished
and live trials, and a trial that turns out to be surplus after a race (more than ``n_trials``
finished or running with lower numbers) is told FAIL unevaluated. RUNNING trials left by a killed
process (its pid is gone, or older than ``STALE_S``) are marked FAIL when a run resumes.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import socket
import time
import uuid
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field, fields
from typing import Callable, Mapping

import optuna
from optuna.trial import TrialState

from kvtune.costmodel import SpecConfig, get_model
from kvtune.costmodel.draft import DraftFootprint
from kvtune.costmodel.efficiency import Efficiency
from kvtune.costmodel.engines import DEFAULT_ENGINE, capabilities_for
from kvtune.costmodel.errors import DoesNotFit, InputError
from kvtune.costmodel.hardware import GPU, resolve_gpu
from kvtune.costmodel.models import ModelArch

from kvtune.costmodel.parallel import Parallel
from kvtune.costmodel.step import StepCost

from . import space as knob_space
from .deployment import Aggregated, Offer
from .objective import MinCost, Objective, objective_for
from .step_factory import StepFactory
from .launch.registry import home
from .layouts import gpus_per_replica, search_layouts
from .screen import WorkloadStats, screen
from .workload import WorkloadSpec
from .storage import check_storage_url, journal_backend
from .liveness import pid_alive   # a zombie (a killed --workers child not yet reaped) is dead
from optuna.storages.journal import JournalFileSymlinkLock, JournalStorage

__all__ = ["SolveContext", "Evaluation", "evaluate", "make_storage", "open_study", "run_search", "grid_space", "quiet_optuna",
           "SAMPLERS", "STALE_S", "config_key", "UNLAUNCHABLE"]

SAMPLERS = ("tpe", "grid", "nsga2")
JOURNAL_LOCK_GRACE_S = 5  # seconds after which a journal lock left by a killed process is broken
STALE_S = 600.0        # a RUNNING trial this old is a leftover (one evaluation takes milliseconds)
UNCLAIMED_S = 10.0     # a RUNNING trial that never wrote its host/pid this long after it started is dead
N_SCREEN_REQUESTS = 2000  # requests sampled to describe the workload's lengths and SLOs
GOODPUT_BONUS = MinCost.GOODPUT_BONUS   # the screen's value: optimizer.objective.MinCost.screen_value
PARSIMONY = MinCost.PARSIMONY
UNLAUNCHABLE = "unlaunchable_layouts"  # memo key: why the layouts that hold the model cannot be launched
SEEDER_ATTR = "kvtune_seeder"  # study user attribute: the process that created the study (and seeds it)
PROCESS_TOKEN = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}"  # this process, unique


@dataclass(frozen=True, eq=False)
class SolveContext:
    """Everything a trial needs, built once per solve from the workload spec (``build``).

    Two seeds: ``seed`` drives the sampler; ``workload_seed`` (``search.seed`` of the spec) draws
    the request sample the screen describes and the simulator verifies with. Keeping the sample
    fixed while the sampler seed varies gives every search the same landscape and every
    verification of a config the same answer (common random numbers), so two searches can be
    compared on what they found rather than on which requests they happened to draw."""

    spec: WorkloadSpec                 # the workload file, loaded (optimizer.workload)
    seed: int
    workload_seed: int
    model: ModelArch
    gpu: GPU
    eff: Efficiency
    stats: WorkloadStats
    rate_req_s: float                  # the target rate; nan for max_goodput without one
    engine: StepFactory                # builds the step models; records calibration and profile use
    layouts: dict[str, dict] = field(default_factory=dict)  # multi-node layouts searched instead of TP (optimizer.layouts)
    memo: dict = field(default_factory=dict)  # results derived from this context alone (simsearch's never-fit check)
    steps: dict[tuple, StepCost | Exception] = field(default_factory=dict)  # step models built, by config
    draft: DraftFootprint | None = None  # the speculative drafter resident beside the model (costmodel.draft)
    objective: Objective = field(default_factory=MinCost)  # the workload's objective (optimizer.objective)

    @classmethod
    def build(cls, spec: WorkloadSpec, seed: int | None = None, calibration: str | None = None,
              engine: str | None = None, profile: str | None = None) -> "SolveContext":
        """``calibration``/``engine``/``profile`` override the workload's (``--calibration`` etc.):
        a calibration file, shipped name or "ideal"; an engine alone picks its shipped calibration."""
        model = spec.model if isinstance(spec.model, ModelArch) else get_model(spec.model)
        gpu = resolve_gpu(spec.hardware.gpu, spec.hardware.gpu_file)
        cal = calibration if calibration is not None else (None if engine is not None else spec.calibration)
        em = StepFactory.build(gpu, "calibrated", cal, engine or spec.engine, profile or spec.profile)
        weight_dtype = spec.weights or "bf16"
        em.check_profile_covers(model, weight_dtype)
        rate = spec.workload.mean_rate_req_s
        objective = objective_for(spec.objective)
        if rate is None or not math.isfinite(rate):
            if objective.caps_cost:
                raise InputError(f"{spec.path}: workload.rate_req_s: objective min_cost needs a finite target rate")
            rate = math.nan  # max_goodput without a target: no headroom to report
        req = spec.requests(N_SCREEN_REQUESTS, spec.search.seed)
        draft = None
        if spec.speculative is not None:
            try:
                draft = spec.speculative.footprint(model, weight_dtype)
            except InputError as exc:
                raise InputError(f"{spec.path}: {exc}") from None
        h = spec.hardware
        layouts = search_layouts(model, gpu, weight_dtype, spec.search.tp, h.gpus_per_node,
                                 h.max_nodes, spec.gpu_mem_util, em.efficiency.activation_reserve_bytes)
        # only layouts the engine can launch (a replica over nodes: not on TensorRT-LLM or llama.cpp)
        caps = capabilities_for(engine or spec.engine)
        why = {k: caps.replica_error(gpus_per_replica(v), h.gpus_per_node) for k, v in layouts.items()}
        memo = {UNLAUNCHABLE: next(iter(why.values()))} if why and all(why.values()) else {}
        return cls(spec=spec, seed=spec.search.seed if seed is None else seed, workload_seed=spec.search.seed,
                   model=model, gpu=gpu, eff=em.efficiency, stats=WorkloadStats.from_requests(req, spec.slo.attainment),
                   rate_req_s=float(rate), engine=em, layouts={k: v for k, v in layouts.items() if not why[k]},
                   draft=draft, memo=memo, objective=objective)

    @property
    def weight_dtype(self) -> str:
        return self.spec.weights or "bf16"

    @property
    def knob_axes(self) -> list[knob_space.KnobAxis]:
        """``optimizer.space``'s axes this solve searches: those its engine has a flag for."""
        return knob_space.searched(home(self.engine.engine or DEFAULT_ENGINE).knob_flags)

    def knob_values(self) -> dict[str, list[int]]:
        """Each searched axis's values under the workload's ranges."""
        ranges = self.spec.search.knob_ranges
        return {a.name: knob_space.values(a, ranges) for a in self.knob_axes}

    @property
    def offer(self) -> Offer:
        """This solve's GPU type at its price."""
        h = self.spec.hardware
        return Offer(self.gpu.name, float(h.usd_per_gpu_hour), int(h.gpus_per_node))

    def speculation(self, k: int) -> SpecConfig | None:
        """Draft length k of the workload's speculative section as the step model's config (None: off).
        ``spec`` is the workload file throughout ``optimizer``; speculation is always spelled out."""
        s = self.spec.speculative
        if not k or s is None:
            return None
        return s.config(k, self.draft)

    def step(self, tp: int, kv_dtype: str, spec_k: int, layout: str | None = None) -> StepCost | Exception:
        """The step model of a config (measured step times where the profile table covers it), or
        the error that says why it cannot run (does not fit, bad layout); built once per config."""
        key = (tp, kv_dtype, spec_k, layout)
        if key not in self.steps:
            par = None
            if layout is not None:  # a multi-node layout (optimizer.layouts)
                par = Parallel(gpus_per_node=self.spec.hardware.gpus_per_node, **self.layouts[layout])
            try:
                self.steps[key] = self.engine.step(self.model, tp, self.weight_dtype, kv_dtype,
                                                   self.speculation(spec_k), self.spec.gpu_mem_util,
                                                   require_profile=False, parallel=par)
            except (DoesNotFit, InputError) as exc:
                self.steps[key] = exc
        return self.steps[key]

    def step_of(self, d: Aggregated) -> StepCost | Exception:
        """``step`` for a deployment's config."""
        return self.step(d.layout.tp, d.knobs.kv_dtype, d.knobs.spec_k, d.layout.name)

    def fitting_step(self, params: Mapping) -> StepCost:
        """The step model of a config known to fit (the simulator's): its error raised otherwise.
        ``params`` needs only what the step depends on (``tp``, ``kv_dtype``, ``spec_k``, a layout)."""
        sm = self.step(int(params["tp"]), params["kv_dtype"], int(params.get("spec_k", 0)),
                       params.get("layout") or None)
        if isinstance(sm, Exception):
            raise sm
        return sm

    @property
    def max_gpus(self) -> int:
        h = self.spec.hardware
        return h.max_nodes * h.gpus_per_node


def config_key(p: Mapping) -> str:
    """A config's name (``optimizer.deployment.Aggregated.key``)."""
    return Aggregated.from_config(p).key


def _size(ctx: SolveContext, tp: int, goodput_req_s: float, nodes_pick: int | None) -> dict:
    """Replicas, GPUs, nodes and cost for a per-replica goodput (``Objective.replicas``)."""
    h = ctx.spec.hardware
    if nodes_pick is not None:                                # nsga2: nodes searched
        replicas = nodes_pick * h.gpus_per_node // tp
    else:
        replicas = ctx.objective.replicas(ctx.rate_req_s, goodput_req_s, tp, ctx.max_gpus)
    gpus = replicas * tp
    nodes = math.ceil(gpus / h.gpus_per_node)
    usd = gpus * h.usd_per_gpu_hour
    total = replicas * goodput_req_s
    headroom = total / ctx.rate_req_s - 1 if replicas and ctx.rate_req_s > 0 else -1.0
    return {"replicas": replicas, "gpus": gpus, "nodes": nodes, "usd_per_hour": usd,
            "goodput_req_s": total, "headroom": headroom if math.isfinite(headroom) else 0.0}


def _aggressiveness(ctx: SolveContext, params: Mapping) -> float:
    """Where batch cap and chunk budget sit in their search ranges, 0 (smallest) to 1 (largest),
    on a log scale. Past the point where they bind, larger values buy no screened goodput but
    admit more at once (bigger KV swings, longer mixed steps) in ways the screen does not see."""
    s = ctx.spec.search
    pos = []
    for key, (lo, hi) in (("batch_cap", s.batch_cap), ("chunk_tokens", s.chunk_tokens)):
        pos.append(math.log(params[key] / lo) / math.log(hi / lo) if hi > lo else 0.0)
    return sum(pos) / len(pos)


@dataclass(frozen=True)
class Evaluation:
    """One configuration screened and sized (``evaluate``): what a trial stores in
    ``user_attrs['eval']`` (``to_json``) and what the race and the result read (``from_json``).
    A config that does not fit carries only the first eight fields."""

    params: Aggregated             # the config screened (one replica, no price; ``config``: its JSON)
    fits: bool
    feasible: bool
    constraint: tuple[float, ...]  # memory shortfall GB, SLO-share shortfall, nodes over budget: all <= 0 feasible
    value: float                   # the screened objective (lower is better)
    reason: str
    per_replica_goodput_req_s: float
    bottleneck: str
    batch: int = 0
    batch_limit: str = ""
    tpot_ms: float = 0.0
    tpot_batch1_ms: float = 0.0
    ttft_ms: float = 0.0
    ttft_zero_load_ms: float = 0.0
    slo_share: float = 0.0
    detail: dict = field(default_factory=dict)
    kv_pool_tokens: float = 0.0
    replicas: int = 0
    gpus: int = 0
    nodes: int = 0
    usd_per_hour: float = 0.0
    goodput_req_s: float = 0.0
    headroom: float = 0.0
    trial: int | None = None       # the optuna trial number, when read back from a study

    _NO_FIT_KEYS = ("params", "fits", "feasible", "constraint", "value", "reason", "per_replica_goodput_req_s",
                    "bottleneck")

    def __post_init__(self) -> None:
        if not isinstance(self.params, Aggregated):   # a config mapping (read back, or a caller's)
            object.__setattr__(self, "params", Aggregated.from_config(self.params))

    def to_json(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "trial"}
        if not self.fits:
            d = {k: d[k] for k in self._NO_FIT_KEYS}
        d["params"] = self.params.config
        d["constraint"] = list(self.constraint)
        return d

    @classmethod
    def from_json(cls, d: dict, trial: int | None = None) -> "Evaluation":
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known and k not in ("constraint", "params")},
                   params=Aggregated.from_config(d["params"]), constraint=tuple(d["constraint"]), trial=trial)

    def screened(self) -> dict:
        """The screen's figures the result shows under ``screened``."""
        return {"per_replica_goodput_req_s": self.per_replica_goodput_req_s, "batch": self.batch,
                "batch_limit": self.batch_limit, "tpot_ms": self.tpot_ms, "ttft_ms": self.ttft_ms,
                "ttft_zero_load_ms": self.ttft_zero_load_ms, "tpot_batch1_ms": self.tpot_batch1_ms}


def evaluate(ctx: SolveContext, params: Mapping, nodes_pick: int | None = None) -> Evaluation:
    """Screen one configuration and size the deployment: a JSON-able record (``user_attrs['eval']``).

    ``constraint`` = [memory shortfall GB, SLO-share shortfall, nodes over budget]: all <= 0 is
    feasible. ``value`` is the screened objective (lower is better, ``Objective.screen_value``)."""
    params = Aggregated.from_config(params)
    sm = ctx.step_of(params)
    h = ctx.spec.hardware
    worst = ctx.max_gpus * h.usd_per_gpu_hour
    if isinstance(sm, Exception):
        short = getattr(sm, "shortfall_bytes", 0.0) / 1e9
        return Evaluation(params=params, fits=False, feasible=False, constraint=(max(short, 1e-3), 1.0, 0.0),
                          value=2 * worst, reason=str(sm), per_replica_goodput_req_s=0.0, bottleneck="memory")
    # what configs of one step model share is screened once (the step model and the statistics live
    # as long as the context, so their identities key its memo)
    memo = ctx.memo.setdefault(("screen", id(sm), id(ctx.stats)), {})
    s = screen(sm, ctx.stats, params.knobs.batch_cap, params.knobs.chunk_tokens, memo)
    gpr = params.gpus_per_replica
    size = _size(ctx, gpr, s.goodput_req_s, nodes_pick)
    over = 0.0
    if s.feasible:
        if size["replicas"] < 1:
            over = 1.0
        elif size["nodes"] > h.max_nodes:
            over = size["nodes"] - h.max_nodes
    feasible = s.feasible and over <= 0
    value = ctx.objective.screen_value(size["usd_per_hour"], s.goodput_req_s, gpr, h.usd_per_gpu_hour,
                                       size["headroom"], _aggressiveness(ctx, params), feasible, worst)
    reason = s.reason
    if s.feasible and over > 0:
        reason = (f"needs {size['nodes']} nodes ({size['gpus']} GPUs) for {ctx.rate_req_s:g} req/s at "
                  f"{s.goodput_req_s:.2f} req/s per TP-{params.layout.tp}"
                  + (f" x PP-{params.layout.pp}" if params.layout.pp > 1 else "")
                  + f" replica ({gpr} GPUs) > hardware.max_nodes {h.max_nodes}")
    return Evaluation(
        params=params, fits=True, feasible=feasible,
        constraint=(0.0, s.slo_shortfall, over), value=value, reason=reason,
        per_replica_goodput_req_s=s.goodput_req_s, batch=s.batch, batch_limit=s.batch_limit,
        tpot_ms=s.tpot_ms, tpot_batch1_ms=s.tpot_batch1_ms, ttft_ms=s.ttft_ms,
        ttft_zero_load_ms=s.ttft_zero_load_ms, slo_share=s.slo_share, bottleneck=s.bottleneck,
        detail=s.detail, kv_pool_tokens=s.pool_tokens, **size,
    )


# ---- search space -----------------------------------------------------------------------------
def lattice(lo: int, hi: int) -> list[int]:
    """The values a batch cap or chunk budget takes between its bounds: the powers of 2, plus the
    bounds themselves. Goodput moves by about a percent between neighbours of a x2 lattice, which
    is the simulator's own resolution, so a finer step would only rank noise (``optimizer.space.lattice``,
    which a doubling knob axis steps by too)."""
    return knob_space.lattice(lo, hi, doubling=True)


def grid_space(ctx: SolveContext) -> dict:
    """The discretised space every sampler searches (``--sampler grid`` walks all of it): TP, KV
    dtype and speculation length as given, batch cap and chunk budget on ``lattice``."""
    s = ctx.spec.search
    space = {**({"layout": list(ctx.layouts)} if ctx.layouts else {"tp": list(s.tp)}), "kv_dtype": list(s.kv_dtype),
             "batch_cap": lattice(*s.batch_cap), "chunk_tokens": lattice(*s.chunk_tokens)}
    if ctx.spec.speculative is not None:
        space["spec_k"] = list(range(s.spec_k[0], s.spec_k[1] + 1))
    return space | ctx.knob_values()


def seed_trials(ctx: SolveContext, n_trials: int) -> list[dict]:
    """The first trials of a fresh TPE/NSGA-II study: every structure (TP x KV dtype x speculation
    length) once, batch cap and chunk budget mid-lattice; with many speculation lengths only the
    shortest, middle and longest (or the middle) so they take at most half the budget, and never
    more than the budget. A sampler's random start can otherwise miss a whole TP (six draws from
    eight configs once gave TP 2 six times), and what it never screens it never verifies."""
    space = grid_space(ctx)
    spec_ks = space.get("spec_k", [0])
    mid = {k: space[k][len(space[k]) // 2] for k in ("batch_cap", "chunk_tokens", *ctx.knob_values())}
    out = []
    for ks in (spec_ks, sorted({spec_ks[0], spec_ks[len(spec_ks) // 2], spec_ks[-1]}), [spec_ks[len(spec_ks) // 2]]):
        tp_key = "layout" if "layout" in space else "tp"
        out = [{tp_key: tp, "kv_dtype": kv, **mid, **({"spec_k": k} if "spec_k" in space else {})}
               for tp in space[tp_key] for kv in space["kv_dtype"] for k in ks]
        if len(out) <= n_trials // 2:
            return out
    return out[:n_trials]


def _suggest(trial: optuna.Trial, ctx: SolveContext, nsga2: bool) -> tuple[dict, int | None]:
    s = ctx.spec.search
    if ctx.layouts:  # multi-node: one categorical over whole layouts (optimizer.layouts)
        label = trial.suggest_categorical("layout", list(ctx.layouts))
        tp_part = {"layout": label, **ctx.layouts[label]}
    else:
        tp_part = {"tp": trial.suggest_categorical("tp", list(s.tp))}
    p = {**tp_part,
         "batch_cap": trial.suggest_categorical("batch_cap", lattice(*s.batch_cap)),
         "kv_dtype": trial.suggest_categorical("kv_dtype", list(s.kv_dtype)),
         "spec_k": trial.suggest_int("spec_k", s.spec_k[0], s.spec_k[1]) if ctx.spec.speculative is not None else 0,
         "chunk_tokens": trial.suggest_categorical("chunk_tokens", lattice(*s.chunk_tokens)),
         **{k: trial.suggest_categorical(k, v) for k, v in ctx.knob_values().items()}}
    nodes = trial.suggest_int("nodes", 1, ctx.spec.hardware.max_nodes) if nsga2 else None
    return p, nodes


def _constraints(t) -> list[float]:
    return list(t.user_attrs.get("constraint", [1.0, 1.0, 1.0]))


# Constraints live where optuna and optuna-dashboard both read them: the trial's system attribute
# ``constraints``, a list, every entry <= 0 feasible (optuna/study/_constrained_optimization.py reads
# it for the samplers and FrozenTrial.constraints; optuna-dashboard 0.21 reads only that list,
# optuna_dashboard/_serializer.py CONSTRAINTS_KEY). Optuna 5's Trial.set_constraint writes
# "constraints:<name>" keys the dashboard does not read, so the list is written through the trial's
# storage (the public BaseStorage API) for every sampler (GridSampler has no constraints_func), and
# optuna 4's samplers get constraints_func as well.
CONSTRAINTS_ATTR = "constraints"
_OPTUNA_5 = hasattr(optuna.trial.Trial, "set_constraint")
_CONSTRAINT_NAMES = ("memory_shortfall_gb", "slo_share_shortfall", "nodes_over_budget")


def _store_constraints(trial: optuna.Trial, constraint: tuple[float, ...]) -> None:
    st = trial.storage
    trial_id = st.get_trial_id_from_study_id_trial_number(st.get_study_id_from_name(trial.study.study_name),
                                                          trial.number)
    st.set_trial_system_attr(trial_id, CONSTRAINTS_ATTR, [float(c) for c in constraint])


def metric_names(sampler: str, objective: str) -> list[str]:
    """What the screen's study values are (``study.set_metric_names``; optuna-dashboard shows them)."""
    if sampler == "nsga2":
        return ["usd_per_hour", "screened_goodput_req_s"]
    return [objective_for(objective).screen_metric]


def make_sampler(name: str, ctx: SolveContext, seed: int) -> optuna.samplers.BaseSampler:
    cf = None if _OPTUNA_5 else _constraints
    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed, multivariate=True, n_startup_trials=10, constraints_func=cf)
    if name == "grid":
        return optuna.samplers.GridSampler(grid_space(ctx), seed=seed)
    if name == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed, population_size=20, constraints_func=cf)
    raise InputError(f"--sampler must be one of {', '.join(SAMPLERS)}, got {name!r}")


# ---- storage and study ------------------------------------------------------------------------
def make_storage(url: str | None):
    """None: in memory; ``journal:PATH``: a journal file; anything else: an RDB URL (sqlite:///...)."""
    check_storage_url(url)  # missing folders, damaged journals and SQLite files: one line, nothing written
    if not url:
        return None
    if url.startswith("journal:"):
        path = url[len("journal:"):]
        if not path:
            raise InputError("--storage journal:PATH needs a file path")
        # A process killed while holding the journal's lock leaves it behind; optuna breaks a lock
        # older than its grace period (30 s by default). Every hold here lasts milliseconds, so
        # break one after JOURNAL_LOCK_GRACE_S and let a resumed run start promptly.
        lock = JournalFileSymlinkLock(path, grace_period=JOURNAL_LOCK_GRACE_S)
        return JournalStorage(journal_backend(path, lock))  # appends refuse a journal cut short meanwhile
    if "://" not in url:
        raise InputError(f"--storage {url!r}: use journal:PATH or an RDB URL such as sqlite:///kvtune.db")
    kwargs = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else None
    for attempt in range(3):
        try:
            return optuna.storages.RDBStorage(url, engine_kwargs=kwargs)
        except Exception as exc:  # a bad URL or missing driver is the user's to fix
            # two processes creating one new database race on its schema ("table ... already
            # exists", a duplicate version row): the loser finds it made on the next try
            racy = "already exists" in str(exc) or "UNIQUE constraint" in str(exc) or "locked" in str(exc)
            if racy and attempt < 2:
                time.sleep(0.2 * (attempt + 1))
                continue
            raise InputError(f"--storage {url!r}: {exc.__class__.__name__}: {str(exc).splitlines()[0]}") from None


@contextlib.contextmanager
def quiet_optuna() -> Iterator[None]:
    """Optuna logs every trial and study at INFO; a solve reports progress itself. Restored afterwards."""
    before = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    try:
        yield
    finally:
        optuna.logging.set_verbosity(before)


def workload_digest(ctx: SolveContext, sampler: str) -> str:
    spec = ctx.spec
    blob = json.dumps({"spec": repr(spec.hardware) + repr(spec.slo) + repr(spec.search) + repr(spec.speculative)
                       + repr(spec.objective) + str(spec.model) + str(spec.engine) + str(spec.gpu_mem_util)
                       + (repr(spec.search.knobs) if spec.search.knobs else ""),
                       "stats": [ctx.stats.mean_input_tokens, ctx.stats.mean_output_tokens, ctx.rate_req_s],
                       "sampler": sampler, "seed": ctx.seed, "workload_seed": ctx.workload_seed,
                       "source": ctx.eff.source,
                       **({"profile": ctx.engine.profile.sha256} if ctx.engine and ctx.engine.profile else {}),
                       **({"gpu": repr(ctx.gpu)} if getattr(spec.hardware, "gpu_file", None) else {})},
                      sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def open_study(ctx: SolveContext, sampler: str, storage_url: str | None, study_name: str | None) -> optuna.Study:
    digest = workload_digest(ctx, sampler)
    name = study_name or f"kvtune-{digest}"
    storage = make_storage(storage_url)
    directions: list[optuna.study.StudyDirection] = (
        [optuna.study.StudyDirection.MINIMIZE, optuna.study.StudyDirection.MAXIMIZE] if sampler == "nsga2"
        else [optuna.study.StudyDirection.MINIMIZE])
    try:
        study = optuna.create_study(storage=storage, study_name=name, directions=directions,
                                    sampler=make_sampler(sampler, ctx, ctx.seed))
        created = True
    except optuna.exceptions.DuplicatedStudyError:  # another process (or an earlier run) made it
        study = optuna.create_study(storage=storage, study_name=name, directions=directions,
                                    sampler=make_sampler(sampler, ctx, ctx.seed), load_if_exists=True)
        created = False
    # only the process that created the study seeds it, so two processes that start together on
    # one storage do not both enqueue the structure screen: the study's own record says which
    if created:
        study.set_user_attr(SEEDER_ATTR, PROCESS_TOKEN)
    if study.metric_names is None:   # a study of an earlier version is named on resume
        with warnings.catch_warnings():   # experimental since optuna 3.2, stable in use since
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.set_metric_names(metric_names(sampler, ctx.spec.objective))
    have = study.user_attrs.get("digest")
    if have is None:
        study.set_user_attr("digest", digest)
    elif have != digest:
        raise InputError(f"--study-name {name}: that study was run with another workload, sampler or seed "
                         f"(digest {have} != {digest}); pick a new --study-name")
    return study


def _is_stale(t) -> bool:
    host, pid = t.user_attrs.get("host"), t.user_attrs.get("pid")
    if host == socket.gethostname() and pid is not None and pid != os.getpid() and not pid_alive(pid):
        return True
    start = t.datetime_start.timestamp() if t.datetime_start else time.time()
    if pid is None:
        # its process died between creating the trial and writing its pid (the objective's first act)
        return time.time() - start > UNCLAIMED_S
    return time.time() - start > STALE_S


def fail_stale_trials(study: optuna.Study) -> int:
    n = 0
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if _is_stale(t):
            try:
                study.tell(t.number, state=TrialState.FAIL)
                n += 1
            except Exception:  # another process finished or failed it first
                pass
    return n


def _counted(study: optuna.Study, upto: int | None = None) -> int:
    """Trials that count towards the budget: complete, or running in a live process."""
    n = 0
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.RUNNING)):
        if upto is not None and t.number >= upto:
            continue
        if t.state == TrialState.COMPLETE or not _is_stale(t):
            n += 1
    return n


class _Surplus(Exception):
    """This trial lost a race with another process: the budget was already taken."""


def run_search(ctx: SolveContext, study: optuna.Study, n_trials: int, sampler: str,
               on_trial: Callable[[int, int], None] | None = None) -> int:
    """Run trials until the study holds ``n_trials`` complete ones (shared with other processes).
    Returns how many this process evaluated. (``study.optimize`` rather than ask/tell: the grid
    sampler stops the study when its grid is exhausted, which only works inside ``optimize``.)"""
    fail_stale_trials(study)
    nsga2 = sampler == "nsga2"
    ran = 0
    seeder = study.user_attrs.get(SEEDER_ATTR, PROCESS_TOKEN)  # a study made elsewhere: this process seeds
    if sampler != "grid" and seeder == PROCESS_TOKEN and not study.get_trials(deepcopy=False):
        for params in seed_trials(ctx, n_trials):
            study.enqueue_trial(params)

    def objective(trial: optuna.Trial):
        nonlocal ran
        trial.set_user_attr("host", socket.gethostname())
        trial.set_user_attr("pid", os.getpid())
        if _counted(study, upto=trial.number) >= n_trials:  # lost a race with another process
            trial.set_user_attr("surplus", True)
            study.stop()
            raise _Surplus()
        params, nodes = _suggest(trial, ctx, nsga2)
        ev = evaluate(ctx, params, nodes)
        trial.set_user_attr("eval", ev.to_json())
        trial.set_user_attr("constraint", list(ev.constraint))
        trial.set_user_attr("constraint_names", list(_CONSTRAINT_NAMES))
        _store_constraints(trial, ev.constraint)
        ran += 1
        if nsga2:
            worst = 2 * ctx.max_gpus * ctx.spec.hardware.usd_per_gpu_hour
            return ev.usd_per_hour if ev.fits else worst, ev.goodput_req_s
        return ev.value

    def callback(study: optuna.Study, trial) -> None:
        done = _counted(study)
        if on_trial:
            on_trial(min(done, n_trials), n_trials)
        if done >= n_trials:
            study.stop()

    while True:
        while (left := n_trials - _counted(study)) > 0:
            before = ran
            try:
                study.optimize(objective, n_trials=left, catch=(_Surplus,), callbacks=[callback])
            except optuna.exceptions.UpdateFinishedTrialError:
                # two processes popped the same enqueued trial (SQLite cannot lock the row between
                # reading WAITING and writing RUNNING); the other one finished it with the same
                # params and so the same evaluation: keep theirs and go on
                continue
            except ValueError as exc:
                # the same race, when the other process finished the trial after this one's last
                # write but before its tell: optuna's tell refuses a finished trial with a
                # ValueError ("Cannot tell a COMPLETE trial."), not UpdateFinishedTrialError
                if not str(exc).startswith("Cannot tell a "):
                    raise
                continue
            if ran == before:   # only surplus trials (another process holds the rest) or the grid is done
                break
        # other processes may still be finishing trials that count: wait for them, so every process
        # recommends from the same set of trials
        while any(not _is_stale(t) for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))):
            time.sleep(0.05)
        # a trial counted as live may have turned out dead (stale) meanwhile: run its share too
        if fail_stale_trials(study) == 0 or _counted(study) >= n_trials:
            return ran


def completed_evals(study: optuna.Study) -> list[Evaluation]:
    """Every complete trial's evaluation, in trial order, with its trial number."""
    out = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        ev = t.user_attrs.get("eval")
        if ev is not None:
            out.append(Evaluation.from_json(ev, t.number))
    return out
