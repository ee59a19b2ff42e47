"""The race's drop rule as an optuna pruner (``optimizer.pruner``): each rung judged by what it can
tell, the verdict read from the trial's intermediate values, and the same verdict inside a real study."""

from __future__ import annotations

import math

import optuna
import pytest
from optuna.trial import TrialState

from kvtune.optimizer.pruner import OVERLOAD, RUNGS_ATTR, NoiseBoundPruner, Rung, rung_trial

TARGET = 0.9


def test_a_short_run_is_out_only_when_its_upper_bound_is_below_the_target():
    assert Rung("short", 2.0, 300, 0.5, "bound", upper=0.899).misses(TARGET)
    # a short run below the target whose bound still reaches it: a burst may explain it, so it runs in full
    assert not Rung("short", 2.0, 300, 0.5, "bound", upper=TARGET).misses(TARGET)
    assert not Rung("zero_load", 0.01, 100, 0.99, "bound", upper=1.0).misses(TARGET)


def test_a_full_run_is_out_below_the_target_or_when_the_engine_does_not_keep_up():
    assert not Rung("simulated", 10.0, 1000, TARGET, served_req_s=OVERLOAD * 10.0).misses(TARGET)
    assert Rung("simulated", 10.0, 1000, 0.8999, served_req_s=10.0).misses(TARGET)
    assert Rung("simulated", 10.0, 1000, 0.99, served_req_s=OVERLOAD * 10.0 - 1e-9).misses(TARGET)
    # not checked (zero load, or too few completions to tell): the attainment alone decides
    assert not Rung("zero_load", 10.0, 1000, 0.99).misses(TARGET)
    assert Rung("zero_load", 10.0, 1000, 0.5).misses(TARGET)
    # the verifier's run sizes a deployment: never a drop here
    assert not Rung("verified", 10.0, 1000, 0.0, "verification").misses(TARGET)


def test_the_pruner_judges_the_last_step_from_the_intermediate_values():
    pruner = NoiseBoundPruner(TARGET)
    passed, missed = Rung("zero_load", 0.01, 300, 1.0), Rung("simulated", 3.0, 1000, 0.7, served_req_s=3.0)
    assert pruner.prune(None, rung_trial([passed, missed]))
    assert not pruner.prune(None, rung_trial([missed, passed]))   # the last rung decides
    assert not pruner.prune(None, rung_trial([]))
    # the intermediate value is the attainment optuna shows: the pruner reads it, not a copy beside it
    t = rung_trial([passed])
    lowered = optuna.trial.create_trial(state=TrialState.RUNNING, intermediate_values={0: 0.5},
                                        user_attrs=dict(t.user_attrs))
    assert pruner.prune(None, lowered) and not pruner.prune(None, t)


def test_inside_a_study_should_prune_gives_the_same_verdict():
    study = optuna.create_study(pruner=NoiseBoundPruner(TARGET))
    trial = study.ask()
    rungs = [Rung("zero_load", 0.01, 100, 0.97, "bound", upper=0.999, served_req_s=None),
             Rung("short", 4.0, 300, 0.85, "bound", upper=0.93, served_req_s=4.0),
             Rung("simulated", 4.0, 1200, 0.86, served_req_s=3.9)]
    verdicts = []
    for i, g in enumerate(rungs):
        trial.set_user_attr(RUNGS_ATTR, [r.to_json() for r in rungs[:i + 1]])
        trial.report(g.attainment, i)
        verdicts.append(trial.should_prune())
    assert verdicts == [False, False, True]   # the short run's bound reached 0.9; the full run missed it
    study.tell(trial, state=TrialState.PRUNED)
    assert study.trials[0].state == TrialState.PRUNED and study.trials[0].intermediate_values == {0: 0.97, 1: 0.85, 2: 0.86}


def test_bad_rungs_and_targets_are_refused():
    with pytest.raises(ValueError, match="judged_by 'guess'"):
        Rung("short", 1.0, 10, 0.5, "guess")
    with pytest.raises(ValueError, match="finite or None"):
        Rung("simulated", 1.0, 10, 0.5, served_req_s=math.inf)
    for bad in (0.0, 1.01, -0.5):
        with pytest.raises(ValueError, match="must be in"):
            NoiseBoundPruner(bad)
    g = Rung("short", 2.0, 300, 0.93, "bound", 0.97, 1.9)
    assert Rung.from_json(g.to_json()) == g
