"""The tune loop in-process against the fake engine: budgets end a session part-way and a second
session on the same storage continues it; a machine that drifts is reported and not fitted across."""

from __future__ import annotations

import pytest

import fake_engine
from kvtune.optimizer.adapters import LocalAdapter
from kvtune.optimizer.search import make_storage
from kvtune.optimizer.tune import Tuner, TuneSettings
from kvtune.optimizer.tune_store import TuneStore
from kvtune.optimizer.workload import load_workload

pytestmark = pytest.mark.slow

QUICK = dict(calibration="ideal", grid=False, near=0, run_s=3.0, min_requests=15, warmup=2, pick_multipliers=(1.0,))


@pytest.fixture
def fake(tmp_path, monkeypatch):
    sh = fake_engine.setup(tmp_path, monkeypatch)
    yield sh
    assert not fake_engine.left_behind(sh["pidfile"])


def session(sh, tmp_path, name: str, log=lambda s: None, **kw) -> tuple[Tuner, LocalAdapter]:
    ad = LocalAdapter("llamacpp", binary=str(sh["llama-server"]), model=str(sh["gguf"]), threads=1,
                      log_dir=sh["logs"])
    store = TuneStore(make_storage(f"journal:{tmp_path / 'runs.journal'}"), "s", "digest")
    work = tmp_path / name
    work.mkdir()
    return Tuner(load_workload(sh["workload"]), ad, TuneSettings(**{**QUICK, **kw}), store, work, log, 1), ad


def test_a_budget_ends_the_session_and_the_next_one_continues_it(fake, tmp_path):
    t1, ad1 = session(fake, tmp_path, "a", max_runs=3, max_rounds=3)
    r1 = t1.run()
    assert r1.status == "budget" and r1.runs == 3 and "run budget (3 runs)" in r1.reason
    assert r1.evidence in ("measured", "simulated") and ad1.starts == 1
    t2, ad2 = session(fake, tmp_path, "b", max_runs=12, max_rounds=2)
    r2 = t2.run()
    first = r1.jobs[0]
    assert r2.jobs[0].key == first.key and r2.jobs[0].runs == first.runs   # read back, not measured again
    assert r2.runs > r1.runs and ad2.starts == len(r2.jobs) - 1


def test_drift_is_reported_and_the_fit_starts_after_it(fake, tmp_path, monkeypatch):
    speed = tmp_path / "speed"
    speed.write_text("1.0")
    monkeypatch.setenv("KVTUNE_FAKE_SPEED_FILE", str(speed))

    def log(line: str) -> None:   # the machine gets 2.5x slower after round 1
        if line.startswith("round 2:"):
            speed.write_text("2.5")
    t, _ = session(fake, tmp_path, "a", log=log, max_rounds=2)
    res = t.run()
    assert len(res.rounds) == 2 and res.drift, res.drift
    assert all(":probe" in d and "loadavg" in d for d in res.drift)
    r2 = res.rounds[1]
    assert r2.drift and r2.fit["rows"] == len(res.jobs[-1].runs)   # only the runs since the drift
    # the runs since the drift refit the calibration: the machine got 2.5x slower, so round 2
    # promises the pick well below round 1 (measured: 42.7 -> 11.3 req/s)
    assert res.rounds[1].promise_req_s < 0.6 * res.rounds[0].promise_req_s


def test_an_overloaded_run_stops_early_and_reports_the_bound_its_misses_proved(fake, tmp_path, monkeypatch):
    speed = tmp_path / "speed"
    speed.write_text("2.0")   # twice as slow as the ideal calibration promises: the 1.0x run overloads
    monkeypatch.setenv("KVTUNE_FAKE_SPEED_FILE", str(speed))
    lines: list[str] = []
    t, _ = session(fake, tmp_path, "a", log=lines.append, max_rounds=1, min_requests=40, run_s=12.0)
    res = t.run()
    stopped = [r for j in res.jobs for r in j.runs if r.kind == "open" and r.stopped]
    assert stopped, lines
    for r in stopped:
        st = r.stopped
        assert st["sent"] < st["planned"] and st["misses"] > st["allowed"]
        assert st["attainment_at_most"] == round((st["counted_planned"] - st["misses"]) / st["counted_planned"], 4)
        assert st["attainment_at_most"] < res.target_attainment
        assert r.goodput_at_rate_req_s is None   # no goodput estimated from a stopped run
        # the simulated latencies beside the measured ones are over the very requests sent, at their
        # send times (the plan's prediction covers requests never sent)
        rows = r.requests_csv.strip().splitlines()[1:]
        assert r.replayed is not None and r.replayed["ttft_ms"]["p50"] > 0
        assert len(rows) == st["sent"] and r.replayed != r.predicted
    said = [ln for ln in lines if "stopped after" in ln]
    assert said and all("attainment at most" in ln for ln in said), lines
    assert all("replayed on the" in ln for ln in said), lines
