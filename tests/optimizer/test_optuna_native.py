"""The studies read right in optuna's own tools: the screen's study names its metrics, and every
trial's constraints sit under optuna's key (the trial system attribute ``constraints``, which
optuna's samplers and optuna-dashboard read), so a penalty trial is never shown as feasible."""

import optuna
import pytest
from optuna.trial import TrialState

from kvtune.optimizer.search import CONSTRAINTS_ATTR, SolveContext, metric_names, open_study, run_search
from kvtune.optimizer.workload import load_workload_dict


def _spec(objective="min_cost"):
    # Llama-3.1-70B: TP1 does not fit an H100 (a memory constraint), TP4 fits; rate 12 req/s on one
    # node leaves some fitting configs over the node budget or missing the SLOs
    return load_workload_dict({
        "model": "llama-3.1-70b",
        "hardware": {"gpu": "h100-sxm", "gpus_per_node": 8, "usd_per_gpu_hour": 3.0, "max_nodes": 1},
        "workload": {"rate_req_s": 12, "classes": [{"name": "c", "share": 1.0, "input_tokens": 1000,
                                                    "output_tokens": 200}]},
        "slo": {"ttft_ms": 1000, "tpot_ms": 50, "attainment": 0.9}, "objective": objective,
        "search": {"tp": [1, 4, 8], "batch_cap": [8, 256], "kv_dtype": ["bf16", "fp8"],
                   "chunk_tokens": [512, 8192], "trials": 16, "seed": 0}}, "<test>")


def _dashboard_feasible(t: optuna.trial.FrozenTrial) -> bool:
    # optuna-dashboard's rule (optuna_dashboard/_serializer.py, ts/components: constraints.every(c <= 0))
    return all(c <= 0 for c in t.system_attrs.get("constraints", []))


@pytest.mark.parametrize("sampler", ["tpe", "grid", "nsga2"])
def test_constraints_under_optunas_key_mark_every_infeasible_trial(sampler):
    ctx = SolveContext.build(_spec())
    study = open_study(ctx, sampler, None, None)
    run_search(ctx, study, 16, sampler)
    trials = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    assert len(trials) == 16
    worst = 2 * ctx.max_gpus * ctx.spec.hardware.usd_per_gpu_hour   # the screen's penalty value
    kinds = set()
    for t in trials:
        ev = t.user_attrs["eval"]
        assert CONSTRAINTS_ATTR == "constraints"   # the key optuna's samplers and optuna-dashboard read
        assert list(t.system_attrs[CONSTRAINTS_ATTR]) == ev["constraint"]
        assert _dashboard_feasible(t) == ev["feasible"], (t.number, ev["constraint"], ev["reason"])
        if hasattr(t, "constraints"):   # optuna >= 5 reads the same list
            assert all(c <= 0 for c in t.constraints.values()) == ev["feasible"]
        if sampler != "nsga2" and t.value == pytest.approx(worst):
            assert not _dashboard_feasible(t), t.number   # a penalty is never shown feasible
        kinds.add(ev["feasible"])
    assert kinds == {True, False}, "the case should hold feasible and infeasible trials"
    assert study.metric_names == metric_names(sampler, "min_cost")
    assert len(study.metric_names) == len(study.directions)


def test_metric_names_say_what_each_objective_is():
    assert metric_names("tpe", "min_cost") == ["screened_usd_per_hour_ranked"]
    assert metric_names("grid", "max_goodput") == ["screened_neg_goodput_req_s_per_usd_hour"]
    assert metric_names("nsga2", "min_cost") == ["usd_per_hour", "screened_goodput_req_s"]


def test_no_deprecated_constraints_api_is_used(recwarn):
    ctx = SolveContext.build(_spec())
    study = open_study(ctx, "tpe", None, None)
    run_search(ctx, study, 4, "tpe")
    assert not [w for w in recwarn if issubclass(w.category, FutureWarning) and "constraint" in str(w.message)]


def test_the_sim_study_says_its_trials_are_jobs_not_optima():
    from kvtune.optimizer.scaleout import SIM_METRIC, StudyRunner
    storage = optuna.storages.InMemoryStorage()
    runner = StudyRunner(SolveContext.build(_spec()), storage, "capacity")
    sims = runner.study
    assert sims.study_name == "capacity:sim"
    assert sims.metric_names == [SIM_METRIC] and "not an objective" in SIM_METRIC
    assert "study 'capacity'" in sims.user_attrs["about"] and "--json" in sims.user_attrs["about"]
    again = StudyRunner(SolveContext.build(_spec()), storage, "capacity").study   # a second process
    assert again.metric_names == [SIM_METRIC]
