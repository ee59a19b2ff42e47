"""kvtune profile import: each benchmark format to profile rows, and bad files rejected whole.

The sample files in tests/data/import_* follow the writers' sources field for field; where each
field comes from is listed in tests/data/import_SOURCES.md.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvtune.costmodel.errors import InputError
from kvtune.costmodel.profile_table import COLUMNS, read_table
from kvtune.optimizer.cli import main
from kvtune.optimizer.importers import Metadata, detect_format, import_file, import_files, latency_summary, rows_to_csv

DATA = Path(__file__).parent.parent / "data"


def one(name, **kw):
    rows = import_file(DATA / name, **kw)
    assert len(rows) == 1
    return rows[0]


@pytest.mark.parametrize("name,fmt", [
    ("import_vllm_result.json", "vllm"), ("import_vllm_detailed.json", "vllm"),
    ("import_genai_perf.json", "genai-perf"), ("import_aiperf.json", "aiperf"),
    ("import_aiperf_records.json", "aiperf"), ("import_llmperf_summary.json", "llmperf"),
])
def test_detects_format_from_content(name, fmt):
    assert detect_format(json.loads((DATA / name).read_text())) == fmt


def test_sglang_lines_detected_and_infinity_read():
    lines = (DATA / "import_sglang.jsonl").read_text().splitlines()
    assert "Infinity" in lines[0]
    assert detect_format(json.loads(lines[0])) == "sglang"


def test_vllm_summary_maps_fields():
    r = one("import_vllm_result.json")
    assert (r.kind, r.concurrency, r.rate_req_s) == ("request", 16, None)  # cap + "inf" rate = closed loop
    assert (r.input_tokens, r.output_tokens, r.num_requests) == (1024, 128, 160)  # 163840/160, 20480/160
    assert (r.ttft_mean_ms, r.ttft_p50_ms, r.ttft_p90_ms, r.ttft_p99_ms) == (45.31, 41.87, None, 88.52)
    assert (r.tpot_mean_ms, r.tpot_p50_ms, r.tpot_p99_ms) == (9.02, 8.97, 9.88)
    assert (r.output_tok_s, r.request_s) == (1713.64, 13.3878)
    assert r.model == "meta-llama/Llama-3.1-8B-Instruct"
    assert r.engine == ""  # backend "openai" does not name the engine
    assert r.date == "2025-06-12T15:30:12"


def test_vllm_detailed_recomputes_from_arrays_and_skips_failed():
    r = one("import_vllm_detailed.json")
    # successful requests 0,1,2,4: ttft 50, 60, 80, 55 ms; request 3 has an error
    assert r.num_requests == 4
    assert r.ttft_mean_ms == pytest.approx(61.25)
    assert r.ttft_p50_ms == pytest.approx(57.5)
    assert r.ttft_p90_ms == pytest.approx(74.0)  # linear: 60 + 0.7 * (80 - 60)
    # TPOT = (latency - ttft) / (4 - 1): 33/3, 35/3, 45/3, 30/3 ms
    assert r.tpot_mean_ms == pytest.approx((11 + 35 / 3 + 15 + 10) / 4)
    assert r.tpot_p50_ms == pytest.approx((11 + 35 / 3) / 2)
    assert (r.concurrency, r.rate_req_s, r.input_tokens, r.output_tokens) == (2, 2.0, 128, 4)
    assert r.engine == "vllm"  # backend "vllm" does


def test_vllm_detailed_without_latencies_uses_ttft_plus_itls(tmp_path):
    d = json.loads((DATA / "import_vllm_detailed.json").read_text())
    del d["latencies"]
    p = tmp_path / "old.json"
    p.write_text(json.dumps(d))
    assert import_file(p)[0].tpot_mean_ms == pytest.approx(one("import_vllm_detailed.json").tpot_mean_ms)


def test_sglang_one_row_per_line():
    rows = import_file(DATA / "import_sglang.jsonl")
    assert [r.id for r in rows] == ["import_sglang:1", "import_sglang:2"]
    a, b = rows
    assert (a.concurrency, a.rate_req_s) == (8, None)        # Infinity rate with a cap
    assert (b.concurrency, b.rate_req_s) == (None, 4.0)      # open loop at 4 req/s
    assert (a.input_tokens, a.output_tokens, a.num_requests) == (2048, 256, 200)
    assert (a.ttft_mean_ms, a.ttft_p50_ms, a.ttft_p99_ms, a.tpot_mean_ms) == (118.4, 102.6, 231.8, 6.01)
    assert a.engine == "sglang" and a.source.startswith("sglang.bench_serving")


def test_genai_perf_metric_objects_and_argument_config():
    r = one("import_genai_perf.json")
    assert (r.concurrency, r.input_tokens, r.output_tokens, r.num_requests) == (4, 512, 128, 100)
    assert (r.ttft_mean_ms, r.ttft_p50_ms, r.ttft_p90_ms, r.ttft_p99_ms) == (31.8, 30.9, 36.0, 44.7)
    assert (r.tpot_mean_ms, r.tpot_p99_ms) == (8.98, 9.40)
    assert (r.output_tok_s, r.request_s) == (436.5, 3.41)
    assert r.model == "meta-llama/Llama-3.1-8B-Instruct"


def test_aiperf_both_layouts():
    r = one("import_aiperf.json")
    assert (r.concurrency, r.input_tokens, r.output_tokens, r.num_requests) == (100, 550, 97, 200)
    assert (r.ttft_mean_ms, r.ttft_p90_ms, r.tpot_mean_ms) == (1588.80, 3695.10, 51.76)
    assert r.model == "openai/gpt-oss-20b" and r.date == "2025-10-17T20:22:08.939332"
    e = one("import_aiperf_records.json")
    assert (e.concurrency, e.input_tokens, e.output_tokens, e.num_requests) == (32, 1024, 256, 32)
    assert (e.ttft_mean_ms, e.tpot_p99_ms, e.output_tok_s) == (210.5, 15.9, 2022.4)


def test_aiperf_seconds_unit_converted(tmp_path):
    d = json.loads((DATA / "import_aiperf.json").read_text())
    d["time_to_first_token"] = {"unit": "s", "avg": 1.5, "p50": 1.2}
    p = tmp_path / "s.json"
    p.write_text(json.dumps(d))
    r = import_file(p)[0]
    assert (r.ttft_mean_ms, r.ttft_p50_ms, r.ttft_p99_ms) == (1500.0, 1200.0, None)


def test_llmperf_ttft_quantiles_and_tpot_from_means():
    r = one("import_llmperf_summary.json")
    assert (r.concurrency, r.num_requests, r.input_tokens, r.output_tokens) == (4, 100, 551, 150)
    assert r.ttft_mean_ms == pytest.approx(103.2)
    assert (r.ttft_p50_ms, r.ttft_p90_ms, r.ttft_p99_ms) == pytest.approx((95.0, 140.0, 210.0))
    # LLMPerf's inter-token latency includes the TTFT; TPOT = (e2e - ttft) / (osl - 1) from means
    assert r.tpot_mean_ms == pytest.approx((3182 - 103.2) / (150.2 - 1))
    assert r.tpot_p50_ms is None
    assert r.request_s == pytest.approx(74.1 / 60)
    assert r.date.startswith("2024-06-10")


def test_flags_fill_what_file_lacks_but_file_wins():
    meta = Metadata(model="flag-model", gpu="h100-sxm", tp=2, engine="vllm", weight_dtype="fp8")
    r = one("import_vllm_result.json", meta=meta)
    assert r.model == "meta-llama/Llama-3.1-8B-Instruct"   # in the file
    assert (r.gpu, r.tp, r.engine, r.weight_dtype) == ("h100-sxm", 2, "vllm", "fp8")  # filled
    s = import_file(DATA / "import_sglang.jsonl", meta=meta)[0]
    assert s.model == "flag-model" and s.engine == "sglang"


def test_latency_summary_is_numpy_linear():
    assert latency_summary([1.0, 2.0, 3.0, 4.0]) == (2.5, 2.5, pytest.approx(3.7), pytest.approx(3.97))


def test_table_round_trips_through_read_table(tmp_path):
    rows = import_files(sorted(DATA.glob("import_*.json*")), meta=Metadata(gpu="h100-sxm"))
    p = tmp_path / "t.csv"
    p.write_text(rows_to_csv(rows))
    assert p.read_text().splitlines()[0] == ",".join(COLUMNS)
    back = read_table(p)
    assert [r.id for r in back] == [r.id for r in rows]
    for a, b in zip(rows, back):
        for col in ("concurrency", "input_tokens", "output_tokens", "num_requests"):
            assert getattr(a, col) == getattr(b, col)
        for col in ("ttft_mean_ms", "tpot_mean_ms", "output_tok_s"):
            if getattr(a, col) is not None:
                assert getattr(b, col) == pytest.approx(getattr(a, col), rel=1e-5)


def test_cli_import_writes_table(tmp_path):
    out = tmp_path / "t.csv"
    res = CliRunner().invoke(main, ["profile", "import", str(DATA / "import_sglang.jsonl"),
                                    str(DATA / "import_genai_perf.json"), "-o", str(out), "--gpu", "h100-sxm"])
    assert res.exit_code == 0, res.output
    rows = read_table(out)
    assert len(rows) == 3 and all(r.gpu == "h100-sxm" and r.kind == "request" for r in rows)


def test_cli_format_override_checked(tmp_path):
    out = tmp_path / "t.csv"
    res = CliRunner().invoke(main, ["profile", "import", str(DATA / "import_genai_perf.json"),
                                    "--format", "llmperf", "-o", str(out)])
    assert res.exit_code == 2
    assert "num_concurrent_requests" in res.output and not out.exists()


def _bad(tmp_path, text):
    p = tmp_path / "bad.json"
    p.write_text(text)
    return p


def _vllm_without(key):
    d = json.loads((DATA / "import_vllm_result.json").read_text())
    del d[key]
    return json.dumps(d)


def _vllm_with(key, value):
    d = json.loads((DATA / "import_vllm_result.json").read_text())
    d[key] = value
    return json.dumps(d)


@pytest.mark.parametrize("text,needle", [
    ("", "empty file"),
    ("not json at all", "not JSON"),
    ("[1, 2, 3]", "expected a JSON object"),
    ('{"hello": 1}', "not a recognised benchmark output"),
    (_vllm_without("mean_ttft_ms"), "'mean_ttft_ms'"),
    (_vllm_without("completed"), "'completed'"),
    (_vllm_with("mean_ttft_ms", "fast"), "'mean_ttft_ms' = 'fast' is not a number"),
    (_vllm_with("mean_tpot_ms", -1), "'mean_tpot_ms' = -1 must be"),
    (_vllm_with("completed", 0), "no successful requests"),
    (_vllm_with("max_concurrency", 2.5), "'max_concurrency'"),
], ids=["empty", "not-json", "not-object", "unknown", "no-ttft", "no-completed", "string-number",
        "negative", "zero-completed", "fractional-concurrency"])
def test_bad_file_one_line_exit_2_no_output(tmp_path, text, needle):
    bad = _bad(tmp_path, text)
    good = DATA / "import_vllm_result.json"
    out = tmp_path / "out.csv"
    res = CliRunner().invoke(main, ["profile", "import", str(good), str(bad), "-o", str(out)])
    assert res.exit_code == 2
    err = res.output.strip()
    assert err.startswith("Error:") and len(err.splitlines()) == 1, err
    assert str(bad) in err and needle in err
    assert not out.exists()


def test_bad_jsonl_line_named(tmp_path):
    lines = (DATA / "import_sglang.jsonl").read_text().splitlines()
    d = json.loads(lines[1])
    del d["mean_ttft_ms"]
    p = tmp_path / "b.jsonl"
    p.write_text(lines[0] + "\n" + json.dumps(d) + "\n")
    with pytest.raises(InputError, match=r"b\.jsonl: line 2: missing key 'mean_ttft_ms'"):
        import_file(p)


def test_detail_arrays_must_match(tmp_path):
    d = json.loads((DATA / "import_vllm_detailed.json").read_text())
    d["itls"] = d["itls"][:2]
    p = _bad(tmp_path, json.dumps(d))
    with pytest.raises(InputError, match="'itls' has 2 entries, expected 5"):
        import_file(p)


def test_missing_file_is_input_error(tmp_path):
    res = CliRunner().invoke(main, ["profile", "import", str(tmp_path / "nope.json"), "-o", str(tmp_path / "o.csv")])
    assert res.exit_code == 2 and not (tmp_path / "o.csv").exists()


def test_ids_unique_across_same_named_files(tmp_path):
    (tmp_path / "a").mkdir()
    second = json.loads((DATA / "import_vllm_result.json").read_text())
    second["mean_ttft_ms"] *= 1.1  # another run of the same benchmark
    (tmp_path / "a" / "import_vllm_result.json").write_text(json.dumps(second))
    rows = import_files([DATA / "import_vllm_result.json", tmp_path / "a" / "import_vllm_result.json"])
    assert len({r.id for r in rows}) == 2


def test_the_same_result_twice_is_refused(tmp_path):
    """A file given twice (or a JSONL with one record appended twice) would count one measurement
    twice in a fit; the table reader refuses such a table, so the import does not write one."""
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "import_vllm_result.json").write_text((DATA / "import_vllm_result.json").read_text())
    with pytest.raises(InputError, match=r"row import_vllm_result~2:1 repeats row import_vllm_result:1"):
        import_files([DATA / "import_vllm_result.json", tmp_path / "a" / "import_vllm_result.json"])
    line = json.dumps(json.loads((DATA / "import_vllm_result.json").read_text()))
    (tmp_path / "twice.jsonl").write_text(line + "\n" + line + "\n")
    with pytest.raises(InputError, match=r"twice.jsonl: record 2 repeats record 1"):
        import_file(tmp_path / "twice.jsonl")


def test_inf_rate_written_as_inf(tmp_path):
    d = json.loads((DATA / "import_vllm_result.json").read_text())
    d["max_concurrency"] = None
    p = tmp_path / "burst.json"
    p.write_text(json.dumps(d))
    r = import_file(p)[0]
    assert r.concurrency is None and math.isinf(r.rate_req_s)
    assert r.as_csv_row()["rate_req_s"] == "inf"


def test_genai_perf_config_tree_layout(tmp_path):
    # newer genai-perf writes its config tree as input_config (perf_analyzer.stimulus.concurrency)
    d = json.loads((DATA / "import_genai_perf.json").read_text())
    d["input_config"] = {"model_names": ["m"], "endpoint": {"type": "chat", "streaming": True},
                         "perf_analyzer": {"stimulus": {"concurrency": 8}},
                         "input": {"synthetic_tokens": {"mean": 512, "stddev": 0}}}
    p = tmp_path / "g.json"
    p.write_text(json.dumps(d))
    assert detect_format(d) == "genai-perf"
    r = import_file(p)[0]
    assert (r.concurrency, r.model, r.input_tokens) == (8, "m", 512)
