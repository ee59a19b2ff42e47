"""Workload sampling (costmodel.traffic) and the workload YAML (optimizer.workload)."""

from __future__ import annotations

import copy
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtune.costmodel.errors import InputError
from kvtune.costmodel.traffic import SLO, LengthDist, RequestClass, Trace, Workload
from kvtune.costmodel.dtypes import KNOWN as DTYPE_NAMES
from kvtune.optimizer.workload import SearchSpec, load_workload, load_workload_dict

DATA = Path(__file__).parent.parent / "data"
EXAMPLE = DATA / "workload_example.yaml"
TRACES = Path(__file__).parent.parent.parent / "examples" / "traces"


# ---- length distributions ------------------------------------------------------------------------

@pytest.mark.parametrize("dist, expected_mean", [
    (LengthDist.fixed(250), 250.0),
    (LengthDist.uniform(100, 301), 200.5),
    (LengthDist.lognormal(1200, 0.8), 1200.0),
    (LengthDist.normal(300, 50), 300.0),
])
def test_dist_mean_matches_samples_and_hand_value(dist, expected_mean):
    x = dist.sample(np.random.default_rng(1), 200_000)
    assert x.dtype == np.int64 and x.min() >= 1
    assert dist.mean == pytest.approx(expected_mean, rel=1e-3)
    assert x.mean() == pytest.approx(dist.mean, rel=0.01)


@pytest.mark.parametrize("dist", [
    LengthDist.lognormal(1200, 1.2, min_tokens=400, max_tokens=3000),
    LengthDist.normal(50, 100, max_tokens=120),   # heavily clipped at 1 and at 120
    LengthDist.lognormal(3, 1.5),                 # much mass below 1 token
    LengthDist("fixed", (5000,), max_tokens=4096),
])
def test_clipped_dist_analytic_mean(dist):
    x = dist.sample(np.random.default_rng(2), 400_000)
    assert x.min() >= dist.lower_bound and x.max() <= dist.upper_bound
    assert x.mean() == pytest.approx(dist.mean, rel=0.01, abs=0.05)


def test_lognormal_parameterisation_is_the_distribution_mean():
    d = LengthDist.lognormal(1000, 0.5)
    x = d.sample(np.random.default_rng(3), 200_000)
    # median of a lognormal is exp(mu) = mean * exp(-sigma^2 / 2)
    assert np.median(x) == pytest.approx(1000 * math.exp(-0.125), rel=0.01)
    assert np.log(x).std() == pytest.approx(0.5, rel=0.02)


def test_uniform_is_inclusive_and_sampling_is_seeded():
    d = LengthDist.uniform(3, 5)
    x = d.sample(np.random.default_rng(0), 10_000)
    assert set(np.unique(x)) == {3, 4, 5}
    assert np.array_equal(d.sample(np.random.default_rng(7), 100), d.sample(np.random.default_rng(7), 100))


@settings(max_examples=60, deadline=None)
@given(kind=st.sampled_from(["lognormal", "normal"]), mean=st.floats(1, 1e5), spread=st.floats(0, 2),
       lo=st.integers(1, 500), width=st.one_of(st.none(), st.integers(0, 5000)), seed=st.integers(0, 2**32))
def test_samples_stay_in_bounds(kind, mean, spread, lo, width, seed):
    d = LengthDist(kind, (mean, spread * (mean if kind == "normal" else 1)), lo, None if width is None else lo + width)
    x = d.sample(np.random.default_rng(seed), 500)
    assert x.dtype == np.int64 and x.min() >= max(lo, 1) and x.max() <= d.upper_bound
    assert d.lower_bound <= d.mean <= d.upper_bound


@pytest.mark.parametrize("args", [("fixed", (0,)), ("fixed", (2.5,)), ("uniform", (5, 3)), ("lognormal", (-1, 0.5)),
                                  ("normal", (100, -1)), ("gamma", (1, 2)), ("lognormal", (100,))])
def test_bad_dist_rejected(args):
    with pytest.raises(InputError):
        LengthDist(*args)


# ---- sampling requests from classes --------------------------------------------------------------

def _two_class(rate=10.0):
    chat = RequestClass("chat", 0.7, LengthDist.lognormal(1200, 0.8, min_tokens=400), LengthDist.fixed(250), 400)
    rag = RequestClass("rag", 0.3, LengthDist.fixed(8000), LengthDist.uniform(200, 400), ttft_ms=2000)
    return Workload(classes=(chat, rag), rate_req_s=rate, slo=SLO(1000, 40, 0.9))


def test_class_mix_and_columns():
    w = _two_class()
    r = w.requests(20_000, seed=0)
    assert len(r) == 20_000 and r.class_names == ("chat", "rag")
    share = np.bincount(r.class_idx) / len(r)
    assert share == pytest.approx([0.7, 0.3], abs=0.015)
    chat, rag = r.class_idx == 0, r.class_idx == 1
    assert (r.prefix_tokens[chat] == 400).all() and (r.prefix_group[chat] == 0).all()
    assert (r.prefix_tokens[rag] == 0).all() and (r.prefix_group[rag] == -1).all()
    assert (r.input_tokens[rag] == 8000).all() and (r.input_tokens[chat] >= 400).all()
    assert (r.ttft_slo_s[chat] == 1.0).all() and (r.ttft_slo_s[rag] == 2.0).all()  # per-class override
    assert (r.tpot_slo_s == 0.040).all()
    assert r.input_tokens.mean() == pytest.approx(w.mean_input_tokens, rel=0.02)
    assert r.output_tokens.mean() == pytest.approx(w.mean_output_tokens, rel=0.02)
    assert w.mean_output_tokens == pytest.approx(0.7 * 250 + 0.3 * 300)
    assert w.mean_prefix_tokens == pytest.approx(0.7 * 400)


def test_poisson_rate():
    r = _two_class(rate=12.0).requests(20_000, seed=4)
    gaps = np.diff(r.arrival_s)
    assert r.arrival_s[0] == 0 and (gaps >= 0).all()
    assert gaps.mean() == pytest.approx(1 / 12, rel=0.03)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, abs=0.05)  # exponential: CV = 1


def test_rate_override_scales_the_same_arrivals_and_keeps_lengths():
    w = _two_class(rate=10.0)
    a, b = w.requests(500, seed=9), w.requests(500, seed=9, rate_req_s=20.0)
    assert np.allclose(b.arrival_s, a.arrival_s / 2)
    assert np.array_equal(a.input_tokens, b.input_tokens) and np.array_equal(a.class_idx, b.class_idx)


def test_rate_inf_all_arrive_at_zero():
    r = _two_class().requests(100, seed=0, rate_req_s=math.inf)
    assert (r.arrival_s == 0).all()


def test_same_seed_same_requests_other_seed_differs():
    w = _two_class()
    a, b, c = w.requests(1000, 5), w.requests(1000, 5), w.requests(1000, 6)
    for f in ("arrival_s", "input_tokens", "output_tokens", "class_idx", "prefix_tokens"):
        assert np.array_equal(getattr(a, f), getattr(b, f))
    assert not np.array_equal(a.input_tokens, c.input_tokens)


def test_no_rate_is_an_error_and_zero_requests_is_empty():
    w = Workload(classes=_two_class().classes, slo=SLO(1000, 40))
    with pytest.raises(InputError, match="rate"):
        w.requests(10, 0)
    assert len(w.requests(0, 0, rate_req_s=1.0)) == 0


def test_workload_object_checks():
    c = _two_class().classes
    with pytest.raises(InputError, match="sum to 1"):
        Workload(classes=(c[0],), rate_req_s=1.0)
    with pytest.raises(InputError, match="exactly one"):
        Workload(rate_req_s=1.0)
    with pytest.raises(InputError, match="prefix_tokens"):
        RequestClass("x", 1.0, LengthDist.fixed(100), LengthDist.fixed(10), prefix_tokens=101)
    with pytest.raises(InputError, match="attainment"):
        SLO(1000, 40, 1.5)


# ---- replaying a trace -----------------------------------------------------------------------------

def _trace():
    return Trace(arrival_s=[0.0, 1.0, 1.5, 3.0], input_tokens=[100, 200, 300, 400], output_tokens=[10, 20, 30, 40],
                 prefix_tokens=[0, 50, 0, 50], prefix_group=[-1, 0, -1, 0], source="hand")


def test_trace_replay_first_rows_as_recorded():
    w = Workload(trace=_trace(), slo=SLO(500, 50))
    r = w.requests(3, seed=0)
    assert r.arrival_s.tolist() == [0.0, 1.0, 1.5]
    assert r.input_tokens.tolist() == [100, 200, 300] and r.prefix_group.tolist() == [-1, 0, -1]
    assert (r.ttft_slo_s == 0.5).all() and r.class_names == ("trace",)
    assert w.mean_rate_req_s == pytest.approx(1.0)  # 3 gaps over 3 s


def test_trace_wraps_with_time_offset():
    r = Workload(trace=_trace()).requests(10, seed=0)
    period = 3.0 * 4 / 3  # span plus one mean gap
    assert r.arrival_s[4] == pytest.approx(period) and r.arrival_s[9] == pytest.approx(2 * period + 1.0)
    assert (np.diff(r.arrival_s) >= 0).all()
    assert r.input_tokens.tolist() == [100, 200, 300, 400] * 2 + [100, 200]


def test_trace_rescaled_to_target_rate():
    r = Workload(trace=_trace()).requests(4, seed=0, rate_req_s=6.0)
    assert (len(r) - 1) / r.arrival_s[-1] == pytest.approx(6.0)
    assert r.arrival_s.tolist() == pytest.approx([0, 1 / 6, 0.25, 0.5])  # shape kept
    r = Workload(trace=_trace(), rate_req_s=2.0).requests(12, seed=0)
    assert (len(r) - 1) / r.arrival_s[-1] == pytest.approx(2.0)


def test_trace_time_scale():
    w = Workload(trace=_trace(), time_scale=0.5)
    assert w.requests(4, 0).arrival_s.tolist() == [0, 0.5, 0.75, 1.5]
    assert w.mean_rate_req_s == pytest.approx(2.0)
    with pytest.raises(InputError, match="not both"):
        Workload(trace=_trace(), time_scale=0.5, rate_req_s=3.0)


def test_trace_checks():
    with pytest.raises(InputError, match="no requests"):
        Trace([], [], [], [], [])
    with pytest.raises(InputError, match="start at 0"):
        Trace([1.0, 2.0], [1, 1], [1, 1], [0, 0], [-1, -1])
    t = _trace()
    with pytest.raises(ValueError):
        t.input_tokens[0] = 5  # the recorded columns are read-only


# ---- the YAML --------------------------------------------------------------------------------------

def test_example_yaml_loads():
    s = load_workload(EXAMPLE)
    assert s.model == "meta-llama/Llama-3.1-70B-Instruct" and s.weights == "bf16" and s.engine == "vllm"
    assert s.hardware.gpu == "h100-sxm" and s.hardware.max_gpus == 32 and s.hardware.usd_per_gpu_hour == 3.0
    assert s.slo == SLO(1000, 40, 0.9)
    assert s.speculative.acceptance == 0.75 and s.speculative.config(3).k == 3
    assert s.search == SearchSpec(tp=(1, 2, 4, 8), batch_cap=(8, 1024), kv_dtype=("bf16", "fp8"), spec_k=(0, 6),
                                  chunk_tokens=(512, 16384), trials=200, seed=0)
    chat, rag = s.workload.classes
    assert chat.input_tokens == LengthDist.lognormal(1200, 0.8, min_tokens=400)  # prefix floors an open dist
    assert rag.ttft_ms == 2000 and rag.tpot_ms is None
    r = s.requests(200, seed=1)
    assert len(r) == 200 and r.arrival_s[-1] > 0
    assert s.to_dict()["workload"]["classes"][0]["input_tokens"]["dist"] == "lognormal"


def _minimal():
    return {"model": "llama-3.1-8b", "hardware": {"gpu": "h100", "usd_per_gpu_hour": 2.5},
            "workload": {"rate_req_s": 5, "classes": [{"input_tokens": 1000, "output_tokens": 200}]},
            "slo": {"ttft_ms": 500, "tpot_ms": 50}}


def test_minimal_yaml_defaults():
    s = load_workload_dict(_minimal())
    assert s.weights == "bf16" and s.engine is None and s.calibration is None and s.gpu_mem_util == 0.9
    assert s.hardware.gpus_per_node == 8 and s.hardware.max_nodes == 1 and s.hardware.gpu == "h100-sxm"
    assert s.slo.attainment == 0.9 and s.objective == "min_cost" and s.speculative is None
    assert s.search == SearchSpec() and s.workload.classes[0].name == "class0"


def _with(path: str, value):
    """The minimal document with one key (dotted path; [i] for list items) set or, for DELETE, removed."""
    doc = copy.deepcopy(_minimal())
    parts = path.replace("[", ".[").split(".")
    node = doc
    for p in parts[:-1]:
        node = node[int(p[1:-1])] if p.startswith("[") else node.setdefault(p, {})
    last = parts[-1]
    if value is DELETE:
        del node[last]
    elif last.startswith("["):
        node[int(last[1:-1])] = value
    else:
        node[last] = value
    return doc


DELETE = object()
TWO = [{"name": "a", "share": 0.7, "input_tokens": 100, "output_tokens": 10},
       {"name": "b", "share": 0.5, "input_tokens": 100, "output_tokens": 10}]


@pytest.mark.parametrize("path, value, expected", [
    ("hardware.gpux", 1, "x.yaml: hardware.gpux: unknown key (did you mean 'gpu'?); allowed: gpu, gpus_per_node"),
    ("sloo", {}, "x.yaml: sloo: unknown key (did you mean 'slo'?); allowed: model, weights"),
    ("workload.classes[0].input_token", 5, "x.yaml: workload.classes[0].input_token: unknown key (did you mean 'input_tokens'?); allowed: name, share"),
    ("workload.classes[0].colour", 5, "x.yaml: workload.classes[0].colour: unknown key; allowed: name, share"),
    ("workload.classes[0].input_tokens", {"dist": "lognormal", "mean": 5, "sigma": 1, "std": 2},
     "x.yaml: workload.classes[0].input_tokens.std: unknown key; allowed: dist, mean, sigma, min, max"),
    ("workload.classes", TWO, "x.yaml: workload.classes[1].share = 0.5: shares must sum to 1 (they sum to 1.2)"),
    ("workload.classes[0].share", 1.5, "x.yaml: workload.classes[0].share = 1.5: must be in (0, 1]"),
    ("workload.classes[0].input_tokens", 0, "x.yaml: workload.classes[0].input_tokens = 0: a length must be"),
    ("workload.classes[0].output_tokens", -5, "x.yaml: workload.classes[0].output_tokens = -5: a length must be"),
    ("workload.classes[0].input_tokens", {"dist": "lognormal", "mean": -3, "sigma": 1},
     "x.yaml: workload.classes[0].input_tokens.mean = -3: must be > 0"),
    ("workload.classes[0].input_tokens", {"dist": "gamma", "mean": 3},
     "x.yaml: workload.classes[0].input_tokens.dist = 'gamma': unknown distribution; use fixed, uniform, lognormal, normal"),
    ("workload.classes[0].input_tokens", {"dist": "lognormal", "mean": 1000},
     "x.yaml: workload.classes[0].input_tokens.sigma: missing: dist lognormal needs mean, sigma"),
    ("workload.classes[0].input_tokens", {"dist": "uniform", "min": 10},
     "x.yaml: workload.classes[0].input_tokens.max: missing: dist uniform needs min, max"),
    ("workload.classes[0].input_tokens", {"dist": "uniform", "min": 10, "max": 5},
     "x.yaml: workload.classes[0].input_tokens.max = 5: must be >= min (10)"),
    ("workload.classes[0].input_tokens", {"mean": 10}, "x.yaml: workload.classes[0].input_tokens.dist: missing"),
    ("workload.classes[0].input_tokens", "long", "x.yaml: workload.classes[0].input_tokens = 'long': must be a whole"),
    ("workload.classes[0].prefix_tokens", 2000,
     "x.yaml: workload.classes[0].prefix_tokens = 2000: exceeds the shortest input (1000 tokens)"),
    ("workload.classes[0].slo", {"ttft_ms": 0}, "x.yaml: workload.classes[0].slo.ttft_ms = 0: must be > 0"),
    ("slo.attainment", 1.2, "x.yaml: slo.attainment = 1.2: must be in (0, 1]"),
    ("slo.attainment", 0, "x.yaml: slo.attainment = 0: must be in (0, 1]"),
    ("slo", {"attainment": 0.9}, "x.yaml: slo = {'attainment': 0.9}: give ttft_ms and/or tpot_ms"),
    ("slo.ttft_ms", "fast", "x.yaml: slo.ttft_ms = 'fast': must be a number"),
    ("search.tp", [1, 0], "x.yaml: search.tp[1] = 0: must be >= 1"),
    ("search.tp", [2, 16], "x.yaml: search.tp = [2, 16]: tp 16 exceeds hardware.gpus_per_node 8"),
    ("search.tp", [1.5], "x.yaml: search.tp[0] = 1.5: must be a whole number"),
    ("search.batch_cap", [64, 8], "x.yaml: search.batch_cap = [64, 8]: lo must be <= hi"),
    ("search.batch_cap", [8, 64, 128], "x.yaml: search.batch_cap = [8, 64, 128]: must be [lo, hi]"),
    ("search.kv_dtype", ["bf16", "int4"], "x.yaml: search.kv_dtype[1] = 'int4': must be one of " + ", ".join(DTYPE_NAMES)),
    ("search.spec_k", [0, 4], "x.yaml: search.spec_k = [0, 4]: speculative decoding needs a speculative: section"),
    ("search.trials", 0, "x.yaml: search.trials = 0: must be >= 1"),
    ("search.seed", "abc", "x.yaml: search.seed = 'abc': must be a whole number"),
    ("weights", "int4", "x.yaml: weights = 'int4': must be one of " + ", ".join(DTYPE_NAMES)),
    ("engine", "tgi", "x.yaml: engine = 'tgi': must be one of vllm, sglang, trtllm"),
    ("objective", "fastest", "x.yaml: objective = 'fastest': must be one of min_cost, max_goodput"),
    ("gpu_mem_util", 1.5, "x.yaml: gpu_mem_util = 1.5: must be in (0, 1]"),
    ("hardware.usd_per_gpu_hour", DELETE, "x.yaml: hardware.usd_per_gpu_hour: missing (required)"),
    ("hardware.usd_per_gpu_hour", 0, "x.yaml: hardware.usd_per_gpu_hour = 0: must be > 0"),
    ("hardware.gpus_per_node", "8", "x.yaml: hardware.gpus_per_node = '8': must be a whole number"),
    ("hardware.gpu", "tpu-v5", "x.yaml: hardware.gpu = 'tpu-v5': unknown gpu 'tpu-v5'; known:"),
    ("model", "gpt-5", "x.yaml: model = 'gpt-5': unknown model 'gpt-5'"),
    ("model", DELETE, "x.yaml: model: missing (required)"),
    ("workload.rate_req_s", DELETE, "x.yaml: workload.rate_req_s: missing: objective min_cost needs"),
    ("workload.rate_req_s", -2, "x.yaml: workload.rate_req_s = -2: must be > 0"),
    ("workload.trace", "traces/nope.csv", "x.yaml: workload: give either classes (sampled requests) or trace"),
    ("workload.time_scale", 2, "x.yaml: workload.time_scale = 2: applies to a trace only"),
    ("speculative", {"method": "eagle3"}, "x.yaml: speculative.acceptance: missing (required)"),
    ("speculative", {"acceptance": 1.5}, "x.yaml: speculative.acceptance = 1.5: must be in (0, 1]"),
    ("calibration", "no-such-calibration", "x.yaml: calibration = 'no-such-calibration': no such file (no-such-calibration) nor shipped calibration; shipped: "),
])
def test_yaml_errors_are_one_line_naming_file_key_value(path, value, expected):
    with pytest.raises(InputError) as exc:
        load_workload_dict(_with(path, value), "x.yaml")
    msg = str(exc.value)
    assert "\n" not in msg
    assert msg.startswith(expected), msg


def test_fp8_weights_need_fp8_hardware():
    doc = _with("hardware.gpu", "a100")
    doc["weights"] = "fp8"
    with pytest.raises(InputError, match=r"^x.yaml: hardware.gpu = 'a100': a100-80gb has no FP8"):
        load_workload_dict(doc, "x.yaml")


def test_max_goodput_needs_no_rate_and_scalars_are_accepted():
    doc = _with("workload.rate_req_s", DELETE)
    doc["objective"] = "max_goodput"
    doc["search"] = {"tp": 4, "batch_cap": 256, "kv_dtype": "fp8"}
    s = load_workload_dict(doc)
    assert s.workload.rate_req_s is None
    assert s.search.tp == (4,) and s.search.batch_cap == (256, 256) and s.search.kv_dtype == ("fp8",)


def test_default_tp_fits_the_node():
    s = load_workload_dict(_with("hardware.gpus_per_node", 4))
    assert s.search.tp == (1, 2, 4)


def test_yaml_file_errors(tmp_path):
    p = tmp_path / "w.yaml"
    p.write_text("model: llama-3.1-8b\nslo: {ttft_ms: 1}\nslo: {tpot_ms: 2}\n")
    with pytest.raises(InputError, match=r"w.yaml: line 3 invalid YAML: key 'slo' given twice"):
        load_workload(p)
    p.write_text("model: [unclosed\n")
    with pytest.raises(InputError, match="invalid YAML"):
        load_workload(p)
    p.write_text("")
    with pytest.raises(InputError, match="empty"):
        load_workload(p)
    with pytest.raises(InputError, match="no such workload file"):
        load_workload(tmp_path / "missing.yaml")


def test_paths_resolve_against_the_yaml_folder(tmp_path):
    (tmp_path / "traces").mkdir()
    shutil.copy(TRACES / "azure_conv_sample.csv", tmp_path / "traces" / "conv.csv")
    shutil.copy(Path(__file__).parent.parent.parent / "profiles" / "models" / "llama-3.1-8b.json", tmp_path / "cfg.json")
    shutil.copy(Path(__file__).parent.parent.parent / "profiles" / "calibrations" / "h100-sxm.yaml", tmp_path / "cal.yaml")
    doc = _minimal()
    doc["model"] = "cfg.json"
    doc["calibration"] = "cal.yaml"
    doc["workload"] = {"trace": "traces/conv.csv", "time_scale": 0.5}
    (tmp_path / "w.yaml").write_text(__import__("yaml").safe_dump(doc))
    s = load_workload(tmp_path / "w.yaml")
    assert s.model == str(tmp_path / "cfg.json") and s.calibration == str(tmp_path / "cal.yaml")
    assert len(s.workload.trace) == 300 and s.workload.time_scale == 0.5
    r = s.requests(600, seed=0, rate_req_s=20.0)
    assert (len(r) - 1) / r.arrival_s[-1] == pytest.approx(20.0)
    doc["workload"] = {"trace": "traces/nope.csv"}
    (tmp_path / "w.yaml").write_text(__import__("yaml").safe_dump(doc))
    with pytest.raises(InputError, match=r"w.yaml: workload.trace = 'traces/nope.csv': no such file"):
        load_workload(tmp_path / "w.yaml")
    doc["workload"] = {"trace": "traces/conv.csv", "time_scale": 2, "rate_req_s": 3}
    with pytest.raises(InputError, match="workload.time_scale = 2: give time_scale or rate_req_s, not both"):
        load_workload_dict(doc, str(tmp_path / "w.yaml"))


def test_shipped_calibration_by_name():
    s = load_workload_dict(_with("calibration", "h100-sxm"))
    assert s.calibration == "h100-sxm"
