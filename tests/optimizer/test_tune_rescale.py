"""After a drift the runs since it are too few for a full fit: ``Tuner._rescale`` refits only the
terms that set the machine's speed, as many as the runs can carry, the rest kept from the latest
fit. On this machine's committed llama.cpp table: the same points measured 2x slower are
predicted 2x slower after the rescale, and nothing else moves."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from kvtune.costmodel.efficiency import IDEAL, PARAM_BOUNDS
from kvtune.costmodel.errors import InputError
from kvtune.costmodel.fit import RowPredictor, fit_efficiency
from kvtune.costmodel.hardware import load_gpu_file
from kvtune.costmodel.profile_table import read_table
from kvtune.optimizer.calibrate import calibrate
from kvtune.optimizer.tune import RESCALE_PARAMS, Tuner, TuneSettings

pytestmark = pytest.mark.xdist_group("tune-rescale")   # its module fixtures computed once, on one worker

ROOT = Path(__file__).parent.resolve().parent.parent
GPU = load_gpu_file(ROOT / "profiles" / "hardware-cpu-example.yaml")
PREDICT = RowPredictor(GPU, chunk_tokens=2048)


def _rows():
    rows = [r for r in read_table(ROOT / "profiles" / "tables" / "smollm2-135m-cpu-llamacpp.csv")
            if r.model == "smollm2-135m" and r.tp == 1]
    return [replace(r, weight_dtype="bf16", kv_dtype="bf16") for r in rows]


def _slower(rows, factor: float):
    return [replace(r, id=f"{r.id}-slow", ttft_mean_ms=r.ttft_mean_ms and r.ttft_mean_ms * factor,
                    tpot_mean_ms=r.tpot_mean_ms and r.tpot_mean_ms * factor,
                    output_tok_s=r.output_tok_s and r.output_tok_s / factor) for r in rows]


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    res = fit_efficiency(_rows(), GPU, IDEAL, predict=PREDICT)
    path = tmp_path_factory.mktemp("cal") / "fitted.yaml"
    params = {k: float(getattr(res.efficiency, k)) for k in PARAM_BOUNDS}
    path.write_text(yaml.safe_dump({"name": "fitted", "params": params}))
    return path, res.efficiency


def _tuner(cal: Path) -> Tuner:
    t = Tuner.__new__(Tuner)   # only what _rescale reads: the latest calibration, the engine, the settings
    t.calibration, t.engine, t.s = str(cal), "llamacpp", TuneSettings()
    return t


def test_too_few_runs_for_a_full_fit_rescale_the_speed_terms(fitted):
    path, base = fitted
    few = _slower(_rows()[:2], 2.0)
    with pytest.raises(InputError, match="cannot fit"):    # the full fit the tuner tries first
        calibrate(few, GPU, base, None, PREDICT, name="x")
    res = _tuner(path)._rescale(few, GPU, PREDICT, "x")
    assert res is not None and res.fitted and set(res.fitted) <= set(RESCALE_PARAMS)
    for k in PARAM_BOUNDS:   # the shape of the cost is kept from the latest fit
        if k not in res.fitted:
            assert getattr(res.efficiency, k) == pytest.approx(getattr(base, k)), k
    before, after = PREDICT(few, base), PREDICT(few, res.efficiency)
    ratios = [a[m] / b[m] for b, a in zip(before, after) for m in ("ttft_ms", "tpot_ms") if b.get(m)]
    assert len(ratios) >= 3 and all(1.6 < x < 2.4 for x in ratios), ratios   # 2x slower, as measured


def test_no_rows_no_rescale(fitted):
    assert _tuner(fitted[0])._rescale([], GPU, PREDICT, "x") is None
