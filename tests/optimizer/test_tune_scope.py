"""``kvtune tune`` searches what ``kvtune solve`` searches (issue 32 item 4): the one solve
(``optimizer.solve.solve``) under the session's calibration, and what one live engine cannot
measure is refused with the reason: several GPU types before anything starts, a disaggregated pick
when the solve makes it."""

from __future__ import annotations

import dataclasses

import pytest
import yaml

import fake_engine
from helpers import kvtune
from kvtune.costmodel.errors import InputError
from kvtune.optimizer import tune as tune_mod
from kvtune.optimizer.disagg import PoolChoice
from kvtune.optimizer.result import DisaggregatedRecommendation
from kvtune.optimizer.solve import SolveOptions, solve
from kvtune.optimizer.tune import Tuner, TuneSettings, check_tunable
from kvtune.optimizer.tune_store import TuneStore
from kvtune.optimizer.workload import load_workload, load_workload_dict


def _gpu_list_doc():
    return {"model": "llama-3.1-8b", "hardware": {"gpu": ["h100-sxm", "h200"],
                                                  "usd_per_gpu_hour": {"h100-sxm": 3.0, "h200": 3.8}},
            "workload": {"rate_req_s": 5, "classes": [{"name": "c", "share": 1.0, "input_tokens": 512,
                                                       "output_tokens": 64}]},
            "slo": {"ttft_ms": 1000, "tpot_ms": 50}}


def test_a_gpu_list_is_refused_with_the_reason():
    spec = load_workload_dict(_gpu_list_doc(), "w.yaml")
    with pytest.raises(InputError, match=r"w.yaml: hardware.gpu lists 2 GPU types \(h100-sxm, h200\); kvtune tune "
                                         r"measures one engine on one machine.*e.g. hardware.gpu: h100-sxm"):
        check_tunable(spec)
    check_tunable(load_workload_dict({**_gpu_list_doc(), "hardware": {"gpu": "h100-sxm", "usd_per_gpu_hour": 3.0}}))


def test_the_cli_refuses_a_gpu_list_before_any_engine_starts(tmp_path, monkeypatch):
    sh = fake_engine.setup(tmp_path, monkeypatch)
    monkeypatch.chdir(tmp_path)
    w = tmp_path / "list.yaml"
    w.write_text(yaml.safe_dump(_gpu_list_doc()))
    code, out = kvtune("tune", w, "--engine-bin", sh["llama-server"], "--model-file", sh["gguf"], "-o", "out")
    errors = [ln for ln in out.splitlines() if ln.startswith("Error:")]
    assert code == 2 and len(errors) == 1 and "hardware.gpu lists 2 GPU types" in errors[0], out
    assert not (tmp_path / "out").exists() and not fake_engine.left_behind(sh["pidfile"])


def _tuner(tmp_path, monkeypatch, spec=None):
    sh = fake_engine.setup(tmp_path, monkeypatch)
    from kvtune.optimizer.adapters import LocalAdapter
    from kvtune.optimizer.search import make_storage
    spec = spec or load_workload(sh["workload"])
    ad = LocalAdapter("llamacpp", binary=str(sh["llama-server"]), model=str(sh["gguf"]), threads=1,
                      log_dir=sh["logs"])
    store = TuneStore(make_storage(f"journal:{tmp_path / 't.journal'}"), "s", "digest")
    return Tuner(spec, ad, TuneSettings(calibration="ideal"), store, tmp_path / "work"), spec


def test_each_round_runs_the_one_solve_with_the_sessions_calibration(tmp_path, monkeypatch):
    tuner, spec = _tuner(tmp_path, monkeypatch)
    asked = []
    monkeypatch.setattr(tune_mod, "solve", lambda s, options: asked.append((s, options)) or solve(s, options))
    res = tuner._solve()
    assert asked == [(spec, SolveOptions(calibration="ideal", engine="llamacpp"))]
    # the same answer kvtune solve gives for this workload, engine and calibration
    direct = solve(spec, SolveOptions(calibration="ideal", engine="llamacpp"))
    assert res.recommendation == direct.recommendation and res.predicted == direct.predicted


def test_a_disaggregated_pick_is_refused_with_the_reason(tmp_path, monkeypatch):
    tuner, spec = _tuner(tmp_path, monkeypatch)
    real = solve(spec, SolveOptions(calibration="ideal", engine="llamacpp"))
    pool = PoolChoice(tp=1, replicas=1, batch_cap=8, chunk_tokens=512)
    dis = DisaggregatedRecommendation(tp=1, batch_cap=8, kv_dtype="bf16", spec_k=0, chunk_tokens=512, replicas=2,
                                      gpus=2, nodes=1, gpu="cpu", model="m", prefill=pool,
                                      decode=dataclasses.replace(pool, replicas=1), link="nvlink", units=1)
    monkeypatch.setattr(tune_mod, "solve", lambda s, o: dataclasses.replace(real, recommendation=dis))
    with pytest.raises(InputError, match="pick is a disaggregated deployment .* set search.deployment: "
                                         r"\[aggregated\]"):
        tuner._solve()
