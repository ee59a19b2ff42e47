"""The one solve: GPU type x deployment kind x layout x knobs, searched for one workload.

``solve(spec, options)`` is what ``kvtune solve`` and ``kvtune tune`` both run. For each GPU type
the workload lists (``hardware.gpu``, with its price), one ``SolveContext`` is built and both kinds
of deployment are searched on it, on the same simulator, requests and seeds:

- aggregated: the screen's study and the simulator race (``optimizer.recommend.solve_in``);
- disaggregated (``search.deployment`` lists it, no speculation): the pool search and its best
  units verified on the aggregated kind's evidence (``optimizer.deployment_choice``), on a forked
  process beside the aggregated race when ``jobs`` > 1.

The best of each type's kinds (``optimizer.deployment_choice.combine``) and then the best type
(``optimizer.gpu_choice.choose``) win under the workload's ``Objective``; ``facts.settle`` makes
every figure describe that winner. Under min_cost, a type after the first is searched only at or
below the cheapest $/h found so far (the answer is the one a full search of every type gives).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Callable

from . import deployment_choice as kinds
from .deployment_choice import Beside, combine, may_fork
from .disagg import fork_map
from .facts import settle
from .gpu_choice import choose, quietly
from .objective import objective_for
from .recommend import VERIFY_TOP, solve_in
from .result import SolveResult
from .search import SolveContext
from .workload import WorkloadSpec

__all__ = ["SolveOptions", "Progress", "solve", "solve_type", "search_types", "type_specs"]


@dataclass(frozen=True)
class SolveOptions:
    """How to search (the CLI's flags): the screen's study (``trials``, ``seed``, ``sampler``,
    ``storage``, ``study_name``), the max_goodput seeds verified first (``verify_top``), what the
    step times come from (``calibration``, ``engine``, ``profile``: the workload's when None) and
    the processes simulating on this machine (``jobs``)."""

    trials: int | None = None
    seed: int | None = None
    sampler: str = "tpe"
    storage: str | None = None
    study_name: str | None = None
    verify_top: int = VERIFY_TOP
    calibration: str | None = None
    engine: str | None = None
    profile: str | None = None
    jobs: int = 1

    def for_type(self, gpu: str, several: bool) -> SolveOptions:
        """One GPU type's options: its own study in a shared storage."""
        if several and self.study_name:
            return dataclasses.replace(self, study_name=f"{self.study_name}-{gpu}")
        return self

    @property
    def overrides(self) -> dict[str, str | None]:
        return {"calibration": self.calibration, "engine": self.engine, "profile": self.profile}


@dataclass(frozen=True)
class Progress:
    """What a progress display hears: each GPU type as its search starts (None: the only one),
    the screen's trials (done, total), the race's stages (name, configs) and the next phase."""

    on_type: Callable[[str | None], None] | None = None
    on_trial: Callable[[int, int], None] | None = None
    on_stage: Callable[[str, int], None] | None = None
    on_phase: Callable[[str], None] | None = None
    name_types: bool = False   # several GPU types are searched: a phase line names the type

    def phase(self, text: str) -> None:
        if self.on_phase:
            self.on_phase(text)


TypeSolver = Callable[[WorkloadSpec, SolveOptions, Progress, float], SolveResult]
KindSolver = Callable[[SolveContext, SolveOptions, Progress, float], SolveResult]


def aggregated(ctx: SolveContext, options: SolveOptions, progress: Progress, usd_cap: float) -> SolveResult:
    """The aggregated kind in ``ctx``: the screen's study and the simulator race (``recommend.solve_in``)."""
    return solve_in(ctx, options.trials, options.sampler, options.storage, options.study_name, options.verify_top,
                    progress.on_trial, options.jobs, progress.on_stage, usd_cap, options.overrides)


def type_specs(spec: WorkloadSpec) -> list[WorkloadSpec]:
    """The workload once per GPU type it lists (one type: itself), each with that type's price."""
    h = spec.hardware
    if not h.choices:
        return [spec]
    return [dataclasses.replace(spec, hardware=dataclasses.replace(h, gpu=gpu, usd_per_gpu_hour=usd, choices=()))
            for gpu, usd in h.choices]


def solve_type(spec: WorkloadSpec, options: SolveOptions, progress: Progress, usd_cap: float = math.inf, *,
               solve_aggregated: KindSolver = aggregated) -> SolveResult:
    """Both kinds of deployment on ``spec``'s one GPU type, from one context (module docstring);
    ``solve_aggregated`` answers the aggregated kind (tests pass fakes)."""
    disaggregated = "disaggregated" in spec.search.deployment
    ctx = SolveContext.build(spec, options.seed, options.calibration, options.engine, options.profile)

    def dis():
        return kinds.disaggregated_answer(ctx, options.jobs, usd_cap)
    # the two kinds' searches are independent: with jobs > 1 the disaggregated one runs on a forked
    # process beside the aggregated one, filling the cores each leaves idle in its sequential steps
    beside = (Beside(dis) if disaggregated and spec.speculative is None and options.jobs > 1
              and not options.storage and may_fork() else None)
    try:
        agg = solve_aggregated(ctx, options, progress, usd_cap)
    except BaseException:
        if beside is not None:
            beside.cancel()
        raise
    if not disaggregated:
        return combine(spec, agg, None, ctx, options.overrides)
    if spec.speculative is None:
        progress.phase("disaggregated search: prefill and decode pools, simulated"
                       + (f" ({spec.hardware.gpu})" if progress.name_types else ""))
    got = beside.result() if beside is not None else None
    answer = got if got is not None else dis()   # not forked, or the process failed: here
    return combine(spec, agg, answer, ctx, options.overrides)


def solve(spec: WorkloadSpec, options: SolveOptions = SolveOptions(), progress: Progress = Progress(), *,
          solve_one: TypeSolver = solve_type) -> SolveResult:
    """The whole answer for ``spec`` (module docstring): every GPU type it lists, both kinds on each,
    the best under its objective, its figures settled and the workload's own notes first.
    ``solve_one`` solves one GPU type (tests pass fakes)."""
    result = search_types(spec, options, progress, solve_one)
    result = settle(result, spec)   # one number per fact in the terminal, the JSON and the report
    if spec.notes:   # what reading the workload dropped or filled in for the engine (optimizer.engine_space)
        result = dataclasses.replace(result, notes=tuple(spec.notes) + tuple(result.notes or ()))
    return result


def search_types(spec: WorkloadSpec, options: SolveOptions, progress: Progress,
                 solve_one: TypeSolver = solve_type) -> SolveResult:
    """Every GPU type ``spec`` lists solved by ``solve_one``, the best chosen (``gpu_choice.choose``;
    not yet settled). min_cost: in the order listed, each type searched only at or below the cheapest
    $/h met so far; max_goodput: every type in full, side by side on forked processes with ``jobs``
    > 1 and no shared storage (one job each; what each prints is dropped)."""
    specs = type_specs(spec)
    several = len(specs) > 1
    shown = dataclasses.replace(progress, name_types=several)
    caps: list[float] = []
    results: list[SolveResult] = []

    def one(s: WorkloadSpec, cap: float, jobs: int | None = None) -> SolveResult:
        if progress.on_type:
            progress.on_type(s.hardware.gpu if several else None)
        opts = options.for_type(s.hardware.gpu, several)
        if jobs is not None:
            opts = dataclasses.replace(opts, jobs=jobs)
        return solve_one(s, opts, shown, cap)

    if objective_for(spec.objective).caps_cost:
        cap = math.inf
        for s in specs:
            caps.append(cap)
            r = one(s, cap)
            results.append(r)
            if r.status == "ok" and r.cost is not None:
                cap = min(cap, r.cost.usd_per_hour)
    elif options.jobs > 1 and not options.storage and several:
        results = fork_map(lambda s: quietly(lambda: one(s, math.inf, jobs=1)), specs, options.jobs)
    else:
        results = [one(s, math.inf) for s in specs]
    if not several:
        return results[0]
    caps += [math.inf] * (len(results) - len(caps))
    return choose(spec, [s.hardware.gpu for s in specs], [s.hardware.usd_per_gpu_hour for s in specs], results, caps)
