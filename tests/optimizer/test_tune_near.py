"""tune measures near the pick only configs the simulator says behave differently (issue 33.4: the two
"near" configs were the pick with chunk budgets 2048 and 16384 in place of 1024; with no prompt above
450 tokens all three scheduled alike and measured exactly the same)."""

from __future__ import annotations

import pytest

import fake_engine
from kvtune.optimizer.adapters import LocalAdapter
from kvtune.optimizer.search import make_storage
from kvtune.optimizer.tune import Tuner, TuneSettings, _same_behaviour, _scheduling_only
from kvtune.optimizer.tune_store import TuneStore
from kvtune.optimizer.workload import load_workload


@pytest.fixture
def tuner(tmp_path, monkeypatch):
    sh = fake_engine.setup(tmp_path, monkeypatch)
    ad = LocalAdapter("llamacpp", binary=str(sh["llama-server"]), model=str(sh["gguf"]), threads=1,
                      log_dir=sh["logs"])
    store = TuneStore(make_storage(f"journal:{tmp_path / 'runs.journal'}"), "s", "digest")
    (tmp_path / "w").mkdir()
    return Tuner(load_workload(sh["workload"]), ad, TuneSettings(calibration="ideal", run_s=10.0), store,
                 tmp_path / "w", lambda s: None, 1)


def _cfg(cap: int, chunk: int) -> dict:
    return {"tp": 1, "batch_cap": cap, "kv_dtype": "fp16", "spec_k": 0, "chunk_tokens": chunk}


def test_chunk_budgets_above_every_step_schedule_alike_and_one_below_does_not(tuner):
    ctx = tuner._context()
    rates = (20.0, 26.0)   # the fake workload's prompts are 24-40 tokens: 8 slots x 40 = 320 tokens a step at most
    wide = tuner._behaviour(ctx, _cfg(8, 512), rates)
    assert _same_behaviour(wide, tuner._behaviour(ctx, _cfg(8, 4096), rates))
    assert not _same_behaviour(wide, tuner._behaviour(ctx, _cfg(8, 32), rates))   # one prompt per step at most
    assert not _same_behaviour(wide, tuner._behaviour(ctx, _cfg(2, 512), rates))  # fewer slots queue more


def test_only_the_schedulers_limits_make_twins():
    """A twin differs from a measured config in its batch cap or chunk budget only: a KV cache type (or
    TP, or speculation) changes the engine's kernels, which the simulator sees through bytes alone, so a
    q8_0 config it schedules like an fp16 one is still measured (the 72-config bench's best was q8_0,
    and tune, skipping every q8_0 config as an fp16 one's twin, never measured one)."""
    assert _scheduling_only(_cfg(8, 512), _cfg(8, 4096)) and _scheduling_only(_cfg(8, 512), _cfg(16, 512))
    assert not _scheduling_only(_cfg(8, 512), dict(_cfg(8, 512), kv_dtype="q8_0"))
    assert not _scheduling_only(_cfg(8, 512), dict(_cfg(8, 512), spec_k=2))
    assert not _scheduling_only(_cfg(8, 512), dict(_cfg(8, 512), tp=2))


def test_a_near_config_that_will_not_start_is_recorded_and_the_round_goes_on(tuner, monkeypatch):
    """On the live server a near config (256 slots) was read back other than planned and the whole
    session exited 3 after measuring the pick; the answer is the pick's, so a near config's engine
    failure is a failed job (not retried) and a note, while the pick's still ends the session."""
    from kvtune.optimizer.adapters.errors import EngineMismatch

    t, ad = tuner, tuner.adapter

    def refuse(pick):
        raise EngineMismatch("llama.cpp llama-server came up other than planned: KV pool tokens 8192 (planned 81408)")
    monkeypatch.setattr(ad, "running", refuse)
    ctx = t._context()
    cfg = _cfg(8, 1024)
    t._job("r1:near", 1, "near", cfg, 1.0, (1.0,), ctx)
    job = t.jobs["r1:near"]
    assert job.status == "failed" and "came up other than planned" in job.error and not job.runs
    assert any("near config" in n and "not measured" in n for n in t.notes)
    assert t._seen(cfg, 2)   # the next round does not start it again
    with pytest.raises(EngineMismatch):
        t._job("r1:pick", 1, "pick", cfg, 1.0, (1.0,), ctx)
    assert "r1:pick" not in t.jobs


def _resume_tuner(tmp_path, monkeypatch, sub: str):
    sh = fake_engine.setup(tmp_path / sub, monkeypatch)
    ad = LocalAdapter("llamacpp", binary=str(sh["llama-server"]), model=str(sh["gguf"]), threads=1,
                      log_dir=sh["logs"])
    store = TuneStore(make_storage(f"journal:{tmp_path / sub / 'runs.journal'}"), "s", "digest")
    (tmp_path / sub / "w").mkdir()
    return Tuner(load_workload(sh["workload"]), ad, TuneSettings(calibration="ideal", run_s=10.0, near=0), store,
                 tmp_path / sub / "w", lambda s: None, 1)


def test_a_resumed_round_keeps_the_promise_its_stored_pick_was_measured_at(tmp_path, monkeypatch):
    """Live: a session resumed after a crash refitted round 0 on every stored row (round 1's too), so
    round 1 re-solved to a promise of 0.695 req/s while its pick's runs, read from the storage, were
    at multiples of 0.757; the summary then printed 0.695 beside the attainment measured at 0.757."""
    from kvtune.optimizer.tune import config_id
    from kvtune.optimizer.tune_records import JobRecord

    t = _resume_tuner(tmp_path, monkeypatch, "a")
    ctx = t._context()
    _, pick, steady = t._candidates(1, t._solve(), ctx)[0]
    promise = t._promise(ctx, pick, steady)
    key = f"r1:{config_id(pick)}"
    stored = JobRecord(key=key, round=1, role="pick", config=dict(pick), promise_req_s=promise * 0.9,
                       calibration="an earlier fit", launch_line="", engine={}, host="h", engine_s=1.0)
    t.jobs[key] = stored
    rnd = t._round(1)
    assert rnd.promise_req_s == pytest.approx(promise * 0.9) and rnd.jobs == (key,)


def test_round_n_refits_on_rounds_up_to_n_only(tmp_path, monkeypatch):
    """The refit after round 0 (the grid) of a resumed session: the storage's round-1 rows are not in it."""
    from kvtune.optimizer.tune_records import JobRecord, RunRecord

    t = _resume_tuner(tmp_path, monkeypatch, "b")
    rows = {0: [], 1: []}
    for rnd in (0, 1):
        rows[rnd] = [RunRecord(key=f"g{rnd}-{i}", kind="grid", multiplier=None, rate_req_s=None, n_requests=4,
                               warmup=1, started_at="", duration_s=1.0, loadavg_1m=None, table_csv="")
                     for i in range(2)]
        t.jobs[f"j{rnd}"] = JobRecord(key=f"j{rnd}", round=rnd, role="grid" if rnd == 0 else "pick", config={},
                                      promise_req_s=None, calibration="", launch_line="", engine={}, host="h",
                                      engine_s=1.0, runs=tuple(rows[rnd]))

    class Row:
        def __init__(self, id_):
            self.id = id_
    table = [Row(r.key) for rnd in (0, 1) for r in rows[rnd]]
    kept, _ = t._epoch(table, 0)
    assert [r.id for r in kept] == ["g0-0", "g0-1"]
    kept, _ = t._epoch(table, 1)
    assert [r.id for r in kept] == ["g0-0", "g0-1", "g1-0", "g1-1"]
