"""The race's drop rule as an optuna pruner: a config is out when the last rung of evidence on it says it
misses the SLO attainment target beyond that rung's own sampling noise.

Each simulation the race (``optimizer.simsearch``) runs on a config is a ``Rung``, reported as the
config's intermediate value at the next step (its SLO attainment). ``NoiseBoundPruner`` judges the
last one by what it can tell (``Rung.judged_by``):

- ``bound``: a short run. Its attainment alone could be a burst, so the config is out only when the
  run's one-sided upper confidence bound (``simsearch.upper_attainment``, exact binomial at zero
  load) is below the target; otherwise the race runs it in full (or, at zero load, keeps it where the
  lower bound is above the target);
- ``attainment``: a run of the full length (the very requests verification would use): out when its
  attainment is below the target, or, at load, when the engine does not keep up with the rate
  (``served_req_s`` < ``OVERLOAD`` x the rate: a finite run can meet loose SLOs while its queue only grows);
- ``verification``: the verifier's own run (``optimizer.verify``), which decides by sizing, not here.

The race builds each config's trial from its rungs (``rung_trial``) and asks the pruner after every
simulation; the evidence study (``optimizer.evidence``) stores the same intermediate values and the
same ``rungs`` user attr, so ``NoiseBoundPruner(target).prune(study, trial)`` replays the race's drop
on every trial it holds (tests/optimizer/test_evidence.py). The bar a config is judged at (the rate
it must serve to beat the best so far) is set before the run, by the race.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import optuna
from optuna.pruners import BasePruner
from optuna.trial import FrozenTrial, TrialState

__all__ = ["Rung", "NoiseBoundPruner", "rung_trial", "RUNGS_ATTR", "OVERLOAD"]

RUNGS_ATTR = "rungs"    # the trial's user attr holding each step's Rung (JSON), beside its intermediate values
OVERLOAD = 0.8          # a full probe whose middle completions run below this share of its rate is overloaded:
                        # the engine does not keep up, so its goodput (at most its saturated throughput, where the
                        # SLOs are loose enough to hold anyway) is below the rate (Poisson noise on >= 667 middle
                        # completions: ~4% sd)
JUDGED_BY = ("bound", "attainment", "verification")


@dataclass(frozen=True)
class Rung:
    """One rung of evidence the race put a config through: a simulation at ``rate_req_s`` per
    replica of ``n_requests`` requests and the SLO attainment it reached. ``fidelity``: ``zero_load``
    (its group's probe alone on the machine; the largest batch cap stands for the group), ``short``
    (a short run's), ``simulated`` (a full run's at the rate it needed), ``verified`` (the
    verification's, at the load it was sized for). ``judged_by``, ``upper`` and ``served_req_s``:
    what ``NoiseBoundPruner`` reads (module docstring); ``served_req_s`` None: not checked (zero
    load) or too few completions to tell."""

    fidelity: str
    rate_req_s: float
    n_requests: int
    attainment: float
    judged_by: str = "attainment"
    upper: float = 1.0
    served_req_s: float | None = None

    def __post_init__(self) -> None:
        if self.judged_by not in JUDGED_BY:
            raise ValueError(f"Rung.judged_by {self.judged_by!r}: one of {', '.join(JUDGED_BY)}")
        if self.served_req_s is not None and not math.isfinite(self.served_req_s):
            raise ValueError(f"Rung.served_req_s {self.served_req_s!r}: finite or None (JSON has no infinity)")

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> "Rung":
        return cls(**d)

    def misses(self, target: float) -> bool:
        """This rung alone drops the config (module docstring)."""
        if self.judged_by == "bound":
            return self.upper < target
        if self.judged_by == "verification":
            return False
        keeps_up = self.served_req_s is None or self.served_req_s >= OVERLOAD * self.rate_req_s
        return self.attainment < target or not keeps_up


class NoiseBoundPruner(BasePruner):
    """Prunes a trial whose last rung misses ``target`` beyond its sampling noise (module docstring).
    It reads the trial alone, not the study: the bar the config had to clear is in its rung's rate."""

    def __init__(self, target: float):
        if not 0.0 < target <= 1.0:
            raise ValueError(f"attainment target {target!r}: must be in (0, 1]")
        self.target = target

    def prune(self, study: optuna.Study | None, trial: FrozenTrial) -> bool:
        step = trial.last_step
        rungs = trial.user_attrs.get(RUNGS_ATTR) or ()
        if step is None or step >= len(rungs):
            return False
        return Rung.from_json(dict(rungs[step], attainment=trial.intermediate_values[step])).misses(self.target)


def rung_trial(rungs: Sequence[Rung]) -> FrozenTrial:
    """A running trial whose intermediate values are ``rungs``' attainments, step by step, with the
    rungs beside them: what the race asks the pruner about."""
    return optuna.trial.create_trial(state=TrialState.RUNNING,
                                     intermediate_values={i: float(g.attainment) for i, g in enumerate(rungs)},
                                     user_attrs={RUNGS_ATTR: [g.to_json() for g in rungs]})
