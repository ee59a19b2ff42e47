"""The study of the evidence that decided (``optimizer.evidence``): written beside the screen's study
in ``--storage``, its Pareto front the report's cost/goodput front, written once per answer."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest
import yaml
from optuna.trial import TrialState

from example_solves import solve_example
from helpers import kvtune
from tiny_workload import tiny_8b
from kvtune.optimizer.evidence import evidence_rows, evidence_study_name, write_evidence
from kvtune.optimizer.pruner import RUNGS_ATTR, NoiseBoundPruner
from kvtune.optimizer.result import SolveResult

TINY = tiny_8b({"tp": [1, 2], "batch_cap": [16, 64], "kv_dtype": ["bf16", "fp8"], "chunk_tokens": [1024, 4096],
                "trials": 10, "seed": 0, "deployment": ["aggregated"]}, "max_goodput")


@pytest.fixture(scope="module")
def solved(tmp_path_factory):
    d = tmp_path_factory.mktemp("evidence")
    wl = d / "w.yaml"
    wl.write_text(yaml.safe_dump(TINY))
    url = f"sqlite:///{d / 's.db'}"
    code, text = kvtune("solve", wl, "--storage", url, "--json", d / "r.json")
    assert code == 0, text
    return url, text, SolveResult.from_json(json.loads((d / "r.json").read_text())), d


def _front(study: optuna.Study) -> set[tuple[float, float]]:
    return {(t.values[0], t.values[1]) for t in study.best_trials}


@pytest.mark.xdist_group("evidence-solved")   # its module fixture solved once, on one worker
def test_the_evidence_study_front_is_the_reports_front(solved):
    url, text, r, _ = solved
    name = evidence_study_name(r)
    assert f"evidence: study '{name}' in {url}" in text
    study = optuna.load_study(study_name=name, storage=url)
    assert [d.name for d in study.directions] == ["MINIMIZE", "MAXIMIZE"]
    assert study.metric_names == ["usd_per_hour", "goodput_req_s"]
    assert r.pareto and _front(study) == {(p.usd_per_hour, p.goodput_req_s) for p in r.pareto}
    picks = [t for t in study.trials if t.user_attrs.get("pick")]
    assert len(picks) == 1 and picks[0].values == [r.cost.usd_per_hour, r.predicted.goodput_req_s]
    assert picks[0].params["tp"] == r.recommendation.tp and picks[0].params["batch_cap"] == r.recommendation.batch_cap
    assert picks[0].user_attrs["fidelity"] == "robust"


@pytest.mark.xdist_group("evidence-solved")   # its module fixture solved once, on one worker
def test_every_simulated_config_is_a_trial_with_why_it_is_out(solved):
    url, _, r, _ = solved
    study = optuna.load_study(study_name=evidence_study_name(r), storage=url)
    pruned = [t for t in study.trials if t.state == TrialState.PRUNED]
    simulated_out = [o for o in r.race if o.status != "verified" and o.simulations > 0]
    infeasible = [v for v in r.verified if not v.feasible]
    # every config the simulator dropped is there once, with the race's own reason
    assert len([t for t in pruned if t.user_attrs["status"] in ("beaten", "pruned", "zero_load", "infeasible")]) \
        == len(simulated_out) + len(infeasible)
    reasons = {o.reason for o in simulated_out}
    assert reasons <= {t.user_attrs.get("reason") for t in pruned}
    assert all(t.user_attrs["fidelity"] in ("zero_load", "short", "simulated") for t in pruned)
    # configs dropped without a simulation are the screen's verdict: counted, not trials
    assert study.user_attrs["screened_only"] == sum(1 for o in r.race if o.simulations == 0 and o.status != "verified")
    assert study.user_attrs["complete"] is True


@pytest.mark.xdist_group("evidence-solved")   # its module fixture solved once, on one worker
def test_each_simulated_trial_carries_its_rungs_as_intermediate_values(solved):
    """The evidence ladder per trial: step i is the SLO attainment of the i-th simulation the race ran
    on the config (user attr ``rungs``: what each was). A config dropped at zero load or beaten on
    attainment ended on a rung below the target (one beaten as overloaded may meet it while its queue
    grows); each has the rungs of its race row."""
    url, _, r, _ = solved
    study = optuna.load_study(study_name=evidence_study_name(r), storage=url)
    target = TINY["slo"]["attainment"]
    laddered = [t for t in study.trials if t.intermediate_values]
    assert laddered
    for t in laddered:
        rungs = t.user_attrs["rungs"]
        assert sorted(t.intermediate_values) == list(range(len(rungs)))
        assert {g["fidelity"] for g in rungs} <= {"zero_load", "short", "simulated", "verified"}
        assert all(0.0 <= v <= 1.0 for v in t.intermediate_values.values())
        if t.user_attrs["status"] == "zero_load":
            assert all(g["fidelity"] == "zero_load" for g in rungs)
    dropped = [t for t in laddered if t.user_attrs["status"] in ("zero_load", "beaten")]
    assert dropped and all(t.intermediate_values[max(t.intermediate_values)] < target for t in dropped
                           if not t.user_attrs["reason"].startswith("overloaded"))
    by_reason = {o.reason: o for o in r.race if o.status in ("zero_load", "beaten")}
    for t in dropped:
        o = by_reason[t.user_attrs["reason"]]
        assert len(t.user_attrs["rungs"]) == len(o.rungs) and o.simulations >= 1


def _race_dropped_on_a_rung(t) -> bool:
    """The race dropped the config on a simulation's evidence: missed at zero load, or beaten at the rate
    it needed (not "meets ... but" a winner of its batch came first, nor a bound without a simulation)."""
    a = t.user_attrs
    return a["status"] == "zero_load" or (a["status"] == "beaten" and not a.get("reason", "").startswith("meets "))


@pytest.mark.xdist_group("evidence-solved")   # its module fixture solved once, on one worker
def test_the_study_replays_the_races_drops_through_its_pruner(solved):
    """The race's drop rule is an optuna pruner (optimizer.pruner): on every trial of the stored study,
    NoiseBoundPruner says "prune" exactly where the race dropped the config on its last rung, and at no
    earlier step of a config the race kept going (each rung it passed)."""
    url, _, r, _ = solved
    study = optuna.load_study(study_name=evidence_study_name(r), storage=url)
    pruner = NoiseBoundPruner(TINY["slo"]["attainment"])
    laddered = [t for t in study.trials if t.intermediate_values]
    dropped = [t for t in laddered if _race_dropped_on_a_rung(t)]
    assert dropped and len(dropped) < len(laddered)
    for t in laddered:
        rungs = t.user_attrs[RUNGS_ATTR]
        simulated = [i for i, g in enumerate(rungs) if g["judged_by"] != "verification"]
        steps = [i for i in simulated if pruner.prune(study, _upto(t, i))]
        if _race_dropped_on_a_rung(t):
            assert steps == [simulated[-1]], (t.user_attrs, steps)
        elif t.user_attrs["status"] in ("verified", "pick"):
            assert steps == [], (t.user_attrs, steps)
    # a real optuna study with this pruner prunes as the race did: report the rungs, ask should_prune
    live = optuna.create_study(pruner=pruner)
    for t in dropped[:3]:
        trial = live.ask()
        for i in range(len(t.user_attrs[RUNGS_ATTR])):
            trial.set_user_attr(RUNGS_ATTR, t.user_attrs[RUNGS_ATTR][:i + 1])
            trial.report(t.intermediate_values[i], i)
        assert trial.should_prune()
        live.tell(trial, state=optuna.trial.TrialState.PRUNED)


def _upto(t, step: int):
    """The trial as it stood after ``step``: its first step + 1 rungs."""
    return optuna.trial.create_trial(state=optuna.trial.TrialState.RUNNING,
                                     intermediate_values={i: v for i, v in t.intermediate_values.items() if i <= step},
                                     user_attrs={RUNGS_ATTR: t.user_attrs[RUNGS_ATTR][:step + 1]})


@pytest.mark.xdist_group("evidence-solved")   # its module fixture solved once, on one worker
def test_written_once_per_answer(solved):
    url, _, r, _ = solved
    name = evidence_study_name(r)
    before = len(optuna.load_study(study_name=name, storage=url).trials)
    assert write_evidence(r, url) == (name, before)   # the same answer: left as it is
    assert len(optuna.load_study(study_name=name, storage=url).trials) == before


@pytest.mark.xdist_group("evidence-solved")   # its module fixture solved once, on one worker
def test_a_study_cut_short_is_rewritten(solved):
    url, _, r, d = solved
    name = evidence_study_name(r, "cut")
    study = optuna.create_study(storage=url, study_name=name, directions=["minimize", "maximize"])
    study.set_user_attr("pid", 2 ** 22 + 12345)   # a writer that is gone, its study never marked complete
    assert write_evidence(r, url, "cut") == (name, len(evidence_rows(r)))
    assert _front(optuna.load_study(study_name=name, storage=url)) == {(p.usd_per_hour, p.goodput_req_s)
                                                                      for p in r.pareto}


def test_no_storage_no_evidence_line(tmp_path):
    wl = tmp_path / "w.yaml"
    wl.write_text(yaml.safe_dump(TINY))
    code, text = kvtune("solve", wl)
    assert code == 0 and "evidence: study" not in text


@pytest.mark.xdist_group("evidence-solved")   # its module fixture solved once, on one worker
def test_a_storage_that_fails_after_the_solve_keeps_the_answer(solved, monkeypatch):
    """The answer is printed and written even when the evidence cannot be stored."""
    _, _, _, d = solved
    import kvtune.optimizer.evidence as ev

    def broken(*a, **k):
        raise RuntimeError("database is locked")
    monkeypatch.setattr(ev, "write_evidence", broken)
    out = d / "again.json"
    code, text = kvtune("solve", d / "w.yaml", "--storage", f"sqlite:///{d / 'other.db'}", "--json", out)
    assert code == 0 and "Recommendation:" in text and out.exists()
    assert "note: the evidence study was not written" in text and "RuntimeError: database is locked" in text


EXAMPLES = sorted(p.stem for p in (Path(__file__).resolve().parents[2] / "examples").glob("*.yaml"))


@pytest.mark.slow
@pytest.mark.parametrize("name", EXAMPLES)
def test_every_examples_evidence_front_is_its_reported_front(tmp_path_factory, tmp_path, name):
    """Aggregated and disaggregated picks, GPU lists, multi-node layouts: the evidence study's
    Pareto front (what optuna-dashboard draws) is the front the report and the terminal show."""
    s = solve_example(tmp_path_factory, name)   # solved once, shared with the report and schema tests
    r = SolveResult.from_json(s.result)
    url = f"sqlite:///{tmp_path / 'e.db'}"
    name_, n = write_evidence(r, url)
    study = optuna.load_study(study_name=name_, storage=url)
    assert len(study.trials) == n
    if r.status == "ok":
        assert _front(study) == {(p.usd_per_hour, p.goodput_req_s) for p in r.pareto or ()}
        assert sum(1 for t in study.trials if t.user_attrs.get("pick")) == 1
    else:
        assert not study.best_trials


def test_an_infeasible_answer_is_recorded_on_its_gpu_with_nothing_on_the_front(tmp_path):
    wl = tmp_path / "w.yaml"
    wl.write_text(yaml.safe_dump({**TINY, "slo": {"ttft_ms": 5, "tpot_ms": 1, "attainment": 0.9}}))
    url = f"sqlite:///{tmp_path / 's.db'}"
    code, text = kvtune("solve", wl, "--storage", url, "--json", tmp_path / "r.json")
    assert code == 3, text
    r = SolveResult.from_json(json.loads((tmp_path / "r.json").read_text()))
    study = optuna.load_study(study_name=evidence_study_name(r), storage=url)
    assert study.trials and not study.best_trials and study.user_attrs["status"] == "infeasible"
    assert {t.params["gpu"] for t in study.trials} == {"h100-sxm"}
    assert all(t.state == TrialState.PRUNED and t.user_attrs["reason"] for t in study.trials)
