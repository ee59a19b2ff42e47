"""kvtune profile import: GuideLLM benchmarks.json, trtllm-bench --report_json and inference-perf
stage reports to profile rows, and bad files rejected whole with one line.

The samples (tests/data/import_guidellm.json, import_trtllm_bench.json, import_inference_perf.json)
follow the writers' code key for key; tests/data/import_SOURCES.md names the commits read. Every
expected number below is read off the sample by hand.
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvtune.costmodel.errors import InputError
from kvtune.costmodel.profile_table import read_table
from kvtune.optimizer.cli import main
from kvtune.optimizer.importers import FORMATS, Metadata, detect_format, import_file

DATA = Path(__file__).parent.parent / "data"
GUIDELLM, TRT, IPERF = "import_guidellm.json", "import_trtllm_bench.json", "import_inference_perf.json"


def doc(name: str) -> dict:
    return json.loads((DATA / name).read_text())


def write(tmp_path: Path, d: dict, name: str = "bad.json") -> Path:
    p = tmp_path / name
    p.write_text(json.dumps(d))
    return p


@pytest.mark.parametrize("name,fmt", [(GUIDELLM, "guidellm"), (TRT, "trtllm-bench"), (IPERF, "inference-perf")])
def test_detects_format_from_content(name, fmt):
    assert fmt in FORMATS
    assert detect_format(doc(name)) == fmt


# --- GuideLLM ----------------------------------------------------------------------------------

def test_guidellm_one_row_per_benchmark():
    a, b = import_file(DATA / GUIDELLM)
    assert (a.id, b.id) == ("import_guidellm:1", "import_guidellm:2")
    # benchmarks[0]: strategy concurrent, streams 8 -> closed loop at 8
    assert (a.kind, a.concurrency, a.rate_req_s) == ("request", 8, None)
    assert (a.num_requests, a.input_tokens, a.output_tokens) == (240, 512, 256)
    assert (a.ttft_mean_ms, a.ttft_p50_ms, a.ttft_p90_ms, a.ttft_p99_ms) == (85.4, 81.2, 120.6, 171.3)
    # TPOT is inter_token_latency_ms (excludes the first token), not time_per_output_token_ms (12.6)
    assert (a.tpot_mean_ms, a.tpot_p50_ms, a.tpot_p90_ms, a.tpot_p99_ms) == (12.31, 12.25, 13.02, 14.87)
    assert (a.output_tok_s, a.request_s) == (601.6, 2.35)
    assert a.model == "meta-llama/Llama-3.1-8B-Instruct"
    assert a.date == "2025-08-07T07:00:00+00:00"  # start_time 1754550000.0
    assert a.source == "guidellm benchmark: import_guidellm.json"
    # benchmarks[1]: poisson at 3.0 req/s, no concurrency cap -> open loop; the errored request is left out
    assert (b.concurrency, b.rate_req_s, b.num_requests) == (None, 3.0, 180)
    assert (b.input_tokens, b.output_tokens) == (512, 254)  # means 511.6 and 254.4, rounded
    assert (b.ttft_mean_ms, b.ttft_p99_ms, b.tpot_mean_ms, b.tpot_p90_ms) == (140.2, 402.0, 14.02, 15.9)
    assert (b.output_tok_s, b.request_s) == (758.11, 2.98)
    assert b.date == "2025-08-07T07:02:20+00:00"


@pytest.mark.parametrize("strategy,load", [
    ({"type_": "synchronous"}, (1, None)),
    ({"type_": "throughput", "max_concurrency": None}, (None, math.inf)),
    ({"type_": "throughput", "max_concurrency": 64}, (64, None)),
    ({"type_": "constant", "rate": 5.5, "max_concurrency": 32}, (32, 5.5)),
])
def test_guidellm_strategy_gives_the_load(tmp_path, strategy, load):
    d = doc(GUIDELLM)
    d["benchmarks"] = d["benchmarks"][:1]
    d["benchmarks"][0]["config"]["strategy"] = strategy
    r, = import_file(write(tmp_path, d))
    assert (r.concurrency, r.rate_req_s) == load


def test_guidellm_model_from_report_config_when_backend_has_none(tmp_path):
    d = doc(GUIDELLM)
    for b in d["benchmarks"]:
        b["config"]["backend"]["model"] = ""  # GuideLLM's default when --model is not given
    d["config"]["spec"]["backend"]["model"] = "Qwen/Qwen3-8B"
    rows = import_file(write(tmp_path, d))
    assert [r.model for r in rows] == ["Qwen/Qwen3-8B", "Qwen/Qwen3-8B"]


# --- trtllm-bench ------------------------------------------------------------------------------

def test_trtllm_bench_report():
    r, = import_file(DATA / TRT)
    # the report does not record --concurrency: throughput's default, every request at once
    assert (r.concurrency, r.rate_req_s) == (None, math.inf)
    assert (r.batch_cap, r.chunk_tokens) == (256, 8192)  # world_info.max_batch_size < 1000 requests
    assert (r.num_requests, r.input_tokens, r.output_tokens) == (1000, 1024, 512)
    assert (r.ttft_mean_ms, r.ttft_p50_ms, r.ttft_p90_ms, r.ttft_p99_ms) == (21450.0, 21880.0, 37510.0, 42970.0)
    assert (r.tpot_mean_ms, r.tpot_p50_ms, r.tpot_p90_ms, r.tpot_p99_ms) == (32.9, 32.6, 35.8, 39.4)
    assert (r.output_tok_s, r.request_s) == (2844.4444, 5.5556)
    assert (r.engine, r.engine_version, r.model) == ("trtllm", "1.1.0", "meta-llama/Llama-3.1-8B-Instruct")
    assert (r.tp, r.weight_dtype, r.kv_dtype) == (2, "fp8", "fp8")  # quantization FP8, kv_cache_dtype FP8


@pytest.mark.parametrize("concurrency,load,cap", [
    (64, (64, None), None),        # below max_batch_size 256: the cap does not bind
    (512, (512, None), 256),
    (0, (None, math.inf), 256),    # <= 0: no limit, as trtllm-bench reads it
    (-1, (None, math.inf), 256),
])
def test_trtllm_bench_concurrency_given(concurrency, load, cap):
    r, = import_file(DATA / TRT, concurrency=concurrency)
    assert (r.concurrency, r.rate_req_s) == load
    assert r.batch_cap == cap


def test_trtllm_bench_unquantized_formats_from_dtype(tmp_path):
    d = doc(TRT)
    d["engine"].update(quantization=None, kv_cache_dtype=None, dtype="float16")
    r, = import_file(write(tmp_path, d))
    assert (r.weight_dtype, r.kv_dtype) == ("fp16", "fp16")
    d["engine"].update(quantization="NVFP4")  # no width kvtune models: the flag fills it
    r, = import_file(write(tmp_path, d), meta=Metadata(weight_dtype="fp8"))
    assert (r.weight_dtype, r.kv_dtype) == ("fp8", "fp16")


def test_concurrency_refused_for_a_file_that_records_its_load():
    with pytest.raises(InputError, match=r"import_guidellm\.json: a guidellm output records its own load; "
                                         r"--concurrency applies to trtllm-bench"):
        import_file(DATA / GUIDELLM, concurrency=8)


# --- inference-perf ----------------------------------------------------------------------------

def test_inference_perf_stage_report():
    r, = import_file(DATA / IPERF)
    assert (r.concurrency, r.rate_req_s) == (None, 4.0)      # load_summary.requested_rate
    assert (r.num_requests, r.input_tokens, r.output_tokens) == (238, 1000, 200)  # means 1000.4, 199.6
    # seconds -> ms: 0.0612, 0.0588, 0.0811, 0.124 s
    assert (r.ttft_mean_ms, r.ttft_p50_ms, r.ttft_p90_ms, r.ttft_p99_ms) == pytest.approx((61.2, 58.8, 81.1, 124.0))
    assert (r.tpot_mean_ms, r.tpot_p50_ms, r.tpot_p90_ms, r.tpot_p99_ms) == pytest.approx((8.42, 8.31, 9.15, 10.77))
    assert (r.output_tok_s, r.request_s) == (772.44, 3.8699)
    assert r.model == "" and r.source == "inference-perf: import_inference_perf.json"


def test_inference_perf_concurrent_stage_and_older_prompt_len(tmp_path):
    d = doc(IPERF)
    d["load_summary"]["concurrency"] = 16   # a concurrent stage: its requested_rate is only the dispatch
    d["successes"]["prompt_len"] = {"mean": 980.2, "min": 900.0, "max": 1024.0}
    del d["successes"]["prompt_tokens"]     # reports before 2026-08 have prompt_len only
    r, = import_file(write(tmp_path, d), meta=Metadata(model="m", gpu="h100-sxm"))
    assert (r.concurrency, r.rate_req_s, r.input_tokens) == (16, None, 980)
    assert (r.model, r.gpu) == ("m", "h100-sxm")


# --- the CLI -----------------------------------------------------------------------------------

def test_cli_imports_each_format(tmp_path):
    out = tmp_path / "t.csv"
    res = CliRunner().invoke(main, ["profile", "import", str(DATA / GUIDELLM), str(DATA / TRT), str(DATA / IPERF),
                                    "-o", str(out), "--gpu", "h100-sxm"])
    assert res.exit_code == 0, res.output
    rows = read_table(out)
    assert [r.id for r in rows] == ["import_guidellm:1", "import_guidellm:2", "import_trtllm_bench:1",
                                    "import_inference_perf:1"]
    assert all(r.gpu == "h100-sxm" and r.kind == "request" for r in rows)
    assert [(r.concurrency, r.rate_req_s) for r in rows] == [(8, None), (None, 3.0), (None, math.inf), (None, 4.0)]
    assert rows[2].tpot_p99_ms == 39.4 and rows[2].batch_cap == 256 and rows[2].tp == 2
    assert rows[3].ttft_mean_ms == pytest.approx(61.2)
    assert "wrote 4 rows" in res.output


def test_cli_trtllm_bench_concurrency_flag(tmp_path):
    out = tmp_path / "t.csv"
    res = CliRunner().invoke(main, ["profile", "import", str(DATA / TRT), "--concurrency", "64", "-o", str(out)])
    assert res.exit_code == 0, res.output
    r, = read_table(out)
    assert (r.concurrency, r.rate_req_s, r.batch_cap) == (64, None, None)


def test_cli_concurrency_with_other_format_refused(tmp_path):
    out = tmp_path / "t.csv"
    res = CliRunner().invoke(main, ["profile", "import", str(DATA / IPERF), "--concurrency", "8", "-o", str(out)])
    assert res.exit_code == 2
    err = res.output.strip()
    assert err.startswith("Error:") and len(err.splitlines()) == 1, err
    assert "records its own load" in err and not out.exists()


def _changed(name, edit):
    d = copy.deepcopy(doc(name))
    edit(d)
    return name, d


def _del(path):
    def edit(d):
        *head, last = path
        for k in head:
            d = d[k]
        del d[last]
    return edit


def _set(path, value):
    def edit(d):
        *head, last = path
        for k in head:
            d = d[k]
        d[last] = value
    return edit


BAD = [
    (_changed(GUIDELLM, _del(["benchmarks", 1, "metrics", "time_to_first_token_ms"])),
     "benchmarks[1]: missing key 'metrics.time_to_first_token_ms'"),
    (_changed(GUIDELLM, _set(["benchmarks", 0, "config", "strategy", "streams"], "eight")),
     "benchmarks[0]: key 'config.strategy.streams' = 'eight' is not a number"),
    (_changed(GUIDELLM, _set(["benchmarks", 0, "config", "strategy", "type_"], "trace")),
     "key 'config.strategy.type_' = 'trace': cannot tell the load"),
    (_changed(GUIDELLM, _set(["benchmarks", 0, "metrics", "request_totals", "successful"], 0)),
     "key 'metrics.request_totals.successful' = 0: no successful requests"),
    (_changed(GUIDELLM, _set(["benchmarks"], [])), "key 'benchmarks' is empty"),
    (_changed(TRT, _del(["streaming_metrics"])), "missing key 'streaming_metrics'"),
    (_changed(TRT, _set(["streaming_metrics", "avg_ttft_ms"], "fast")),
     "key 'streaming_metrics.avg_ttft_ms' = 'fast' is not a number"),
    (_changed(TRT, _set(["world_info", "pp_size"], 2)), "key 'world_info.pp_size' = 2: a pipeline-parallel run"),
    (_changed(TRT, _del(["request_info", "avg_output_length"])), "missing key 'request_info.avg_output_length'"),
    (_changed(IPERF, _del(["load_summary", "requested_rate"])), "import the stage_N_lifecycle_metrics.json"),
    (_changed(IPERF, _set(["successes", "latency", "time_to_first_token"], None)),
     "missing key 'successes.latency.time_to_first_token'"),
    (_changed(IPERF, _set(["successes", "count"], 0)), "key 'successes.count' = 0: no successful requests"),
    (_changed(IPERF, _set(["successes", "throughput"], [])), "key 'successes.throughput' = [] is not an object"),
    (_changed(IPERF, _set(["successes", "latency", "time_per_output_token", "p99"], -0.01)),
     "key 'successes.latency.time_per_output_token.p99' = -0.01 must be a finite number >= 0"),
]


@pytest.mark.parametrize("case,needle", BAD, ids=[
    "guidellm-no-ttft", "guidellm-string-streams", "guidellm-trace", "guidellm-none-ok", "guidellm-empty",
    "trt-no-streaming", "trt-string-ttft", "trt-pipeline", "trt-no-osl", "iperf-summary-file", "iperf-null-ttft",
    "iperf-zero-count", "iperf-list-throughput", "iperf-negative-tpot"])
def test_bad_file_one_line_exit_2_no_output(tmp_path, case, needle):
    name, d = case
    assert detect_format(d) is not None  # still recognised: the error is about the key
    bad = write(tmp_path, d)
    out = tmp_path / "out.csv"
    res = CliRunner().invoke(main, ["profile", "import", str(DATA / name), str(bad), "-o", str(out)])
    assert res.exit_code == 2
    err = res.output.strip()
    assert err.startswith("Error:") and len(err.splitlines()) == 1, err
    assert str(bad) in err and needle in err, err
    assert not out.exists()
