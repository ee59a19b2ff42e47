"""tune measures near the pick only configs the simulator says behave differently (issue 33.4: the two
"near" configs were the pick with chunk budgets 2048 and 16384 in place of 1024; with no prompt above
450 tokens all three scheduled alike and measured exactly the same)."""

from __future__ import annotations

import pytest

import fake_engine
from kvtune.optimizer.adapters import LocalAdapter
from kvtune.optimizer.search import make_storage
from kvtune.optimizer.tune import Tuner, TuneSettings, _same_behaviour
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
