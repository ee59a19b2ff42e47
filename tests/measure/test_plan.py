"""Issue 34.3, the load tools out and back: ``kvtune solve --plan`` writes the very requests the
simulator judged the pick on as Mooncake trace JSONL (the format AIPerf replays with
``--custom-dataset-type mooncake_trace --fixed-schedule``), kvtune's own driver replays such a plan
(``kvtune profile replay``), and AIPerf's per-request export (``profile_export.jsonl``) imports back
as an open-loop row with its per-request log (``kvtune profile import --plan``)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import jsonschema
import numpy as np
import pytest
from click.testing import CliRunner

import fake_engine
from kvtune.costmodel import simulate as sim
from kvtune.costmodel.profile_table import read_table
from kvtune.costmodel.request_log import RequestLog, read_request_log
from kvtune.costmodel.requests import Requests
from kvtune.costmodel.traffic import SLO, LengthDist, RequestClass, Workload
from kvtune.optimizer.aiperf_records import is_profile_export, read_profile_export
from kvtune.optimizer.cli import main
from kvtune.optimizer.loadgen import OpenLoopPlan
from kvtune.optimizer.plan import (DEFAULT_BLOCK_TOKENS, PlanFile, block_tokens_for, endpoint_of, plan_text,
                                   read_plan)
from kvtune.optimizer import verify
from kvtune.optimizer.result import SolveResult

ROOT = Path(__file__).parent.resolve().parent.parent
HW = ROOT / "tests" / "data" / "fake-cpu.yaml"
# the fake engine's workload (tests/fake_engine.py) with two classes sharing prefixes of 16 and 32 tokens
WORKLOAD = f"""\
model: smollm2-135m
weights: q4_1
engine: llamacpp
hardware: {{gpu: {HW}, gpus_per_node: 1, usd_per_gpu_hour: 0.05, max_nodes: 1}}
workload:
  rate_req_s: 20
  classes:
    - {{name: chat, share: 0.7, input_tokens: {{dist: uniform, min: 24, max: 40}}, output_tokens: 16, prefix_tokens: 16}}
    - {{name: rag, share: 0.3, input_tokens: 48, output_tokens: {{dist: uniform, min: 4, max: 12}}, prefix_tokens: 32,
        slo: {{ttft_ms: 400}}}}
slo: {{ttft_ms: 300, tpot_ms: 30, attainment: 0.9}}
objective: max_goodput
search: {{batch_cap: [1, 8], chunk_tokens: [64, 256], trials: 8}}
"""


@pytest.fixture
def workload(tmp_path) -> Path:
    p = tmp_path / "w.yaml"
    p.write_text(WORKLOAD)
    return p


def _solve(workload: Path, *extra: str, monkeypatch=None):
    args = ["solve", str(workload), "--jobs", "1", "--quiet", "--calibration", "ideal", *extra]
    return CliRunner().invoke(main, args)


def _lines(path: Path) -> list[dict]:
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]


# ---- the plan is the simulator's request list ----------------------------------------------------

def test_solve_plan_is_the_request_list_the_simulator_judged_the_pick_on(workload, tmp_path, monkeypatch):
    seen: list[tuple[Requests, object]] = []
    real = sim.simulate_fleet

    def spy(step, make, config, replicas, rate_req_s=None, n_requests=2000, arrival="trace", concurrency=None,
            seed=0, warmup_frac=None):
        res = real(step, make, config, replicas, rate_req_s, n_requests, arrival, concurrency, seed, warmup_frac)
        seen.append((make(rate_req_s / replicas, n_requests, seed), res))   # the one replica's requests
        return res
    monkeypatch.setattr(sim, "simulate_fleet", spy)
    monkeypatch.setattr(verify, "simulate_fleet", spy)   # where the solve calls it (imported at its top)
    plan, out = tmp_path / "plan.jsonl", tmp_path / "r.json"
    r = _solve(workload, "--plan", str(plan), "--json", str(out))
    assert r.exit_code == 0, r.output
    doc = json.loads(out.read_text())
    p = doc["predicted"]
    # the simulation whose figures solve printed for the pick
    judged = [req for req, res in seen if res.summary()["ttft_ms"]["p50"] == p["ttft_ms"]["p50"]
              and float(res.slo_attainment) == p["slo_attainment"]]
    assert len(judged) == 1
    req = judged[0]
    lines = _lines(plan)
    order = np.argsort(req.arrival_s, kind="stable")
    assert len(lines) == len(req) == p["draws"]["n_requests"]
    names = req.class_names
    for ln, i in zip(lines, order):
        kv = ln["kvtune"]
        assert kv["arrival_s"] == float(req.arrival_s[i])                       # exactly, not rounded
        assert ln["timestamp"] == round(float(req.arrival_s[i]) * 1e3)          # Mooncake: whole ms
        assert (ln["input_length"], ln["output_length"]) == (int(req.input_tokens[i]), int(req.output_tokens[i]))
        assert (kv["prefix_tokens"], kv["prefix_group"]) == (int(req.prefix_tokens[i]), int(req.prefix_group[i]))
        assert kv["class"] == names[int(req.class_idx[i])]
        assert kv["ttft_slo_ms"] == pytest.approx(float(req.ttft_slo_s[i]) * 1e3)
    # warm-up: the first floor(10%) in arrival order, as the simulator leaves out
    warm = [ln["kvtune"]["warmup"] for ln in lines]
    k = math.floor(sim.default_warmup_frac("trace") * len(lines))
    assert warm == [True] * k + [False] * (len(lines) - k)
    # the result names the file and the aiperf command replaying it, and stays schema-valid
    pf = PlanFile.from_json(doc["plan"])
    assert pf.requests == len(req) and pf.block_tokens == 16 and pf.prefix_tokens_unshared == 0
    argv = pf.argv
    assert argv[:2] == ("aiperf", "profile") and argv[argv.index("--input-file") + 1] == str(plan)
    for flag, value in (("--custom-dataset-type", "mooncake_trace"), ("--prompt-input-tokens-block-size", "16"),
                        ("--url", "http://localhost:8000"), ("--endpoint-type", "completions")):
        assert argv[argv.index(flag) + 1] == value
    assert "--fixed-schedule" in argv and "--streaming" in argv
    assert "aiperf profile" in r.stderr and "kvtune profile import" in r.stderr
    schema = json.loads((ROOT / "profiles" / "schemas" / "result.schema.json").read_text())
    assert list(jsonschema.Draft202012Validator(schema).iter_errors(doc)) == []
    assert SolveResult.from_json(doc).plan == pf


def test_the_plan_reads_back_as_the_same_requests(workload, tmp_path):
    plan = tmp_path / "plan.jsonl"
    assert _solve(workload, "--plan", str(plan)).exit_code == 0
    back = read_plan(plan)
    from kvtune.optimizer.workload import load_workload
    head = back.header
    spec = load_workload(workload)
    ref = spec.requests(head["requests"], head["seed"], rate_req_s=head["rate_req_s"])
    got = back.plan.requests
    for f in ("arrival_s", "input_tokens", "output_tokens", "prefix_tokens", "prefix_group", "ttft_slo_s",
              "tpot_slo_s"):
        assert np.array_equal(getattr(got, f), getattr(ref, f)), f
    assert [got.class_names[c] for c in got.class_idx] == [ref.class_names[c] for c in ref.class_idx]
    assert back.plan.warmup == head["warmup"] and back.plan.slo == spec.slo
    assert head["pick"]["batch_cap"] >= 1 and head["predicted"]["evidence"] == "simulated"


def test_same_seed_same_plan(workload, tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    assert _solve(workload, "--plan", str(a)).exit_code == 0
    assert _solve(workload, "--plan", str(b)).exit_code == 0
    assert a.read_text() == b.read_text()


# ---- blocks: a shared prefix is whole blocks ----------------------------------------------------

def _requests(inp, pre, grp) -> Requests:
    n = len(inp)
    return Requests(arrival_s=np.arange(n, dtype=float), input_tokens=np.array(inp), output_tokens=np.full(n, 4),
                    prefix_tokens=np.array(pre), prefix_group=np.array(grp), ttft_slo_s=np.full(n, np.inf),
                    tpot_slo_s=np.full(n, np.inf), class_idx=np.zeros(n, dtype=np.int64))


def test_blocks_are_the_prefixes_common_divisor_and_each_line_has_aiperfs_count():
    req = _requests([450, 300, 1000, 350], [200, 300, 200, 0], [0, 1, 0, -1])
    assert block_tokens_for(req) == 100
    t = plan_text(OpenLoopPlan(req, 1.0, 0, 0))
    lines = [json.loads(x) for x in t.text.splitlines()]
    ids = [ln["hash_ids"] for ln in lines]
    # AIPerf: len(hash_ids) == ceil(input_length / block); the last block holds the rest
    assert [len(x) for x in ids] == [5, 3, 10, 4]
    assert ids[0][:2] == ids[2][:2]                         # group 0's 200 tokens: two shared blocks
    assert not set(ids[0][2:]) & set(ids[2][2:])            # their own text is their own
    assert not set(ids[1]) & (set(ids[0]) | set(ids[2]) | set(ids[3]))   # group 1's prefix is its alone
    assert t.prefix_tokens_unshared == 0
    # the plan says its block size, so kvtune reads the prefixes back exactly
    assert lines[0]["kvtune"]["plan"]["block_tokens"] == 100


def test_a_prefix_not_in_whole_blocks_falls_back_to_512_and_says_what_is_not_shared():
    req = _requests([600, 700], [7, 520], [0, 0])   # divisor 1: blocks of 512, 7 + 8 tokens unshared
    assert block_tokens_for(req) == DEFAULT_BLOCK_TOKENS
    t = plan_text(OpenLoopPlan(req, 1.0, 0, 0))
    assert t.prefix_tokens_unshared == 7 + 8
    a, b = (json.loads(x)["hash_ids"] for x in t.text.splitlines())
    assert len(a) == 2 and len(b) == 2 and a[0] != b[0]      # the 7-token prefix is not a whole block


def test_no_prefix_is_blocks_of_512():
    assert block_tokens_for(_requests([100, 2000], [0, 0], [-1, -1])) == 512


def test_the_endpoint_is_the_launch_lines_port_and_served_model():
    assert endpoint_of("vllm", ["vllm", "serve", "meta-llama/X", "--port", "8123"]) == \
        ("http://localhost:8123", "meta-llama/X")
    assert endpoint_of("sglang", ["python", "-m", "sglang.launch_server", "--model-path", "m"]) == \
        ("http://localhost:30000", "m")
    assert endpoint_of("llamacpp", None) == ("http://localhost:8080", None)


# ---- the CLI's conventions ----------------------------------------------------------------------

def test_plan_dash_is_the_jsonl_alone_on_stdout(workload):
    r = _solve(workload, "--plan", "-")
    assert r.exit_code == 0, r.output
    lines = [json.loads(ln) for ln in r.stdout.splitlines()]
    assert lines and all({"timestamp", "input_length", "output_length", "hash_ids"} <= set(x) for x in lines)
    assert "Recommendation:" in r.stderr and "aiperf profile" in r.stderr


def test_plan_and_json_cannot_both_take_stdout(workload):
    r = _solve(workload, "--plan", "-", "--json", "-")
    assert r.exit_code == 2 and r.output.count("Error:") == 1 and "both write to stdout" in r.output


def test_a_bad_plan_path_is_one_error_line_before_the_work_and_nothing_written(workload, tmp_path):
    r = _solve(workload, "--plan", str(tmp_path / "no" / "plan.jsonl"))
    assert r.exit_code == 2 and r.output.count("Error:") == 1 and "--plan" in r.output
    assert "Recommendation" not in r.output and not (tmp_path / "no").exists()


def test_tune_checks_its_plan_path_before_anything_starts(workload, tmp_path):
    r = CliRunner().invoke(main, ["tune", str(workload), "--url", "http://127.0.0.1:9/v1",
                                  "--plan", str(tmp_path / "no" / "p.jsonl"), "-o", str(tmp_path / "t")])
    assert r.exit_code == 2 and r.output.count("Error:") == 1 and "--plan" in r.output
    assert not (tmp_path / "t").exists()


# ---- AIPerf's per-request export, from its documented schema ---------------------------------------

# docs/tutorials/working-with-profile-exports.md (ai-dynamo/aiperf v0.1.1): a served and a cancelled record
AIPERF_OK = {"metadata": {"session_num": 0, "x_request_id": "7609a2e7", "x_correlation_id": "32ee4f33",
                          "conversation_id": "77aa5b0e", "turn_index": 0, "request_start_ns": 1759813207532900363,
                          "request_ack_ns": 1759813207650730976, "request_end_ns": 1759813207838764604,
                          "worker_id": "worker_359d423a", "record_processor_id": "record_processor_1fa47cd7",
                          "benchmark_phase": "profiling", "was_cancelled": False, "cancellation_time_ns": None},
             "metrics": {"input_sequence_length": {"value": 550, "unit": "tokens"},
                         "time_to_first_token": {"value": 255.88656799999998, "unit": "ms"},
                         "request_latency": {"value": 297.52522799999997, "unit": "ms"},
                         "output_token_count": {"value": 9, "unit": "tokens"},
                         "inter_chunk_latency": {"value": [4.898437, 5.316006, 4.801489, 5.674918, 4.811467,
                                                           5.097998, 5.504797, 5.533548], "unit": "ms"},
                         "output_sequence_length": {"value": 9, "unit": "tokens"},
                         "inter_token_latency": {"value": 5.2048325, "unit": "ms"},
                         "output_token_throughput_per_user": {"value": 192.1291415237666, "unit": "tokens/sec/user"}},
             "error": None}
AIPERF_CANCELLED = {"metadata": {"session_num": 1, "x_request_id": "c35e4b1b", "x_correlation_id": "77ecf78d",
                                 "conversation_id": "9526b41d", "turn_index": 0,
                                 "request_start_ns": 1759813207632900363, "request_ack_ns": None,
                                 "request_end_ns": 1759813207633525291, "worker_id": "worker_6006099d",
                                 "record_processor_id": "record_processor_fdeeec8f", "benchmark_phase": "profiling",
                                 "was_cancelled": True, "cancellation_time_ns": 1759813207633525291},
                    "metrics": {"error_isl": {"value": 550, "unit": "tokens"}},
                    "error": {"code": 499, "type": "RequestCancellationError",
                              "message": "Request was cancelled after 0.000 seconds"}}


def test_an_aiperf_per_request_export_written_to_its_schema_reads_as_an_open_loop_run(tmp_path):
    f = tmp_path / "profile_export.jsonl"
    f.write_text(json.dumps(AIPERF_OK) + "\n" + json.dumps(AIPERF_CANCELLED) + "\n")
    assert is_profile_export(f)
    run = read_profile_export(f, model="m")
    ok, bad = run.requests
    assert ok.ok and ok.ttft_ms == pytest.approx(255.886568) and ok.e2e_ms == pytest.approx(297.525228)
    assert ok.tpot_ms == pytest.approx(5.2048325) and ok.input_tokens == 550 and ok.output_tokens == 9
    assert not bad.ok and "RequestCancellationError" in bad.error and bad.input_tokens == 550
    assert bad.sent_s == pytest.approx(0.1)      # 100 ms after the first send
    att = run.attainment()
    assert (att.n, att.met) == (2, 1)            # no SLO: the served one meets, the cancelled one misses
    out = tmp_path / "t.csv"
    r = CliRunner().invoke(main, ["profile", "import", str(f), "-o", str(out), "--gpu", "h100-sxm"])
    assert r.exit_code == 0, r.output
    row, = read_table(out)
    assert row.requests_file and row.open_loop and row.ttft_p50_ms == pytest.approx(255.886568, rel=1e-4)
    assert len(read_request_log(out.parent / row.requests_file)) == 2


@pytest.mark.parametrize("change, msg", [
    (lambda d: d["metadata"].pop("request_start_ns"), "request_start_ns"),
    (lambda d: d["metrics"]["time_to_first_token"].update(value="fast"), "time_to_first_token"),
    (lambda d: d["metrics"]["request_latency"].update(unit="fortnights"), "unit"),
])
def test_a_bad_aiperf_record_is_one_line_naming_the_key(tmp_path, change, msg):
    d = json.loads(json.dumps(AIPERF_OK))
    change(d)
    f = tmp_path / "e.jsonl"
    f.write_text(json.dumps(AIPERF_OK) + "\n" + json.dumps({**d, "metadata": {**d["metadata"], "session_num": 1}})
                 + "\n")
    r = CliRunner().invoke(main, ["profile", "import", str(f), "--format", "aiperf-records", "-o",
                                  str(tmp_path / "t.csv")])
    assert r.exit_code == 2 and r.output.count("Error:") == 1 and msg in r.output and "line 2" in r.output
    assert not (tmp_path / "t.csv").exists()


def test_an_export_of_another_plan_is_refused(tmp_path):
    wl = Workload(classes=(RequestClass("a", 1.0, LengthDist.fixed(40), LengthDist.fixed(4)),), rate_req_s=5.0,
                  slo=SLO(ttft_ms=100.0))
    plan = OpenLoopPlan.from_workload(wl, 5.0, 4, 0, 0)
    f = tmp_path / "profile_export.jsonl"
    f.write_text(json.dumps(AIPERF_OK) + "\n")   # 550 prompt tokens against the plan's 40
    with pytest.raises(Exception, match="not a replay of that plan"):
        read_profile_export(f, plan)


# ---- round trip: exported, replayed by the fake engine through the plan, imported back ---------

def _aiperf_export(log: RequestLog, path: Path, t0_ns: int = 1_760_000_000_000_000_000) -> None:
    """The replay's per-request log in AIPerf's profile_export.jsonl shape (MetricRecordInfo), one
    record per sent request in send order, numbered as AIPerf numbers a fixed schedule's credits."""
    order = np.argsort(log.arrival_s, kind="stable")
    lines = []
    for k, i in enumerate(order):
        start = t0_ns + int(round(float(log.arrival_s[i]) * 1e9))
        metrics = {"input_sequence_length": {"value": int(log.prompt_tokens_server[i]), "unit": "tokens"}}
        if log.ok[i]:
            metrics |= {"time_to_first_token": {"value": float(log.ttft_ms[i]), "unit": "ms"},
                        "request_latency": {"value": float(log.e2e_ms[i]), "unit": "ms"},
                        "output_sequence_length": {"value": int(log.output_tokens_server[i]), "unit": "tokens"}}
            if math.isfinite(log.tpot_ms[i]):
                metrics["inter_token_latency"] = {"value": float(log.tpot_ms[i]), "unit": "ms"}
        end = start + int((float(log.e2e_ms[i]) if log.ok[i] else 0.0) * 1e6)
        lines.append(json.dumps({
            "metadata": {"session_num": k, "x_request_id": f"r{k}", "conversation_id": f"c{k}", "turn_index": 0,
                         "request_start_ns": start, "request_end_ns": end, "worker_id": "worker_0",
                         "record_processor_id": "record_processor_0", "benchmark_phase": "profiling",
                         "was_cancelled": False},
            "metrics": metrics,
            "error": None if log.ok[i] else {"code": 500, "type": "ServerError", "message": log.error[i]}}))
    path.write_text("\n".join(lines) + "\n")


def test_a_plan_exported_replayed_by_the_fake_engine_and_imported_back(workload, tmp_path, monkeypatch):
    sh = fake_engine.setup(tmp_path, monkeypatch)
    plan = tmp_path / "plan.jsonl"
    assert _solve(workload, "--plan", str(plan)).exit_code == 0
    n = 30
    table, measured = tmp_path / "replayed.csv", tmp_path / "measured.csv"
    with fake_engine.serving(sh["llama-server"], "-m", str(sh["gguf"]), "-np", "8", "-c", "4096", "-cb") as url:
        r = CliRunner().invoke(main, ["profile", "replay", str(plan), "--url", url, "--model", "m",
                                      "--requests", str(n), "--gpu", "fake-cpu", "-o", str(table)])
    assert r.exit_code == 0, r.output
    assert "attainment" in r.stderr
    row, = read_table(table)
    sent = read_request_log(table.parent / row.requests_file)
    lines = _lines(plan)[:n]
    # the driver sent the plan's own first n requests: lengths and planned arrivals preserved
    assert list(sent.input_tokens) == [ln["input_length"] for ln in lines]
    assert list(sent.output_tokens) == [ln["output_length"] for ln in lines]
    t0 = lines[0]["kvtune"]["arrival_s"]
    assert np.allclose(sent.scheduled_s, [ln["kvtune"]["arrival_s"] - t0 for ln in lines], atol=1e-6)   # the log keeps microseconds
    assert sent.ok.all(), sent.error
    # ... written as AIPerf writes its per-request export, imported back against the plan
    export = tmp_path / "aiperf-plan" / "profile_export.jsonl"
    export.parent.mkdir()
    _aiperf_export(sent, export)
    r = CliRunner().invoke(main, ["profile", "import", str(export), "--plan", str(plan), "-o", str(measured)])
    assert r.exit_code == 0, r.output
    assert "predicted (simulated on the plan)" in r.stderr
    back, = read_table(measured)
    log = read_request_log(measured.parent / back.requests_file)
    assert len(log) == n                                     # the plan's first n, the rest never sent
    assert list(log.input_tokens) == list(sent.input_tokens) and list(log.output_tokens) == list(sent.output_tokens)
    assert np.allclose(log.scheduled_s, sent.scheduled_s)
    # the send times: an export has no schedule zero, so the first send is taken as on time
    assert np.allclose(log.arrival_s - log.arrival_s[0], sent.arrival_s - sent.arrival_s[0], atol=2e-6)
    assert list(log.prefix_tokens) == [ln["kvtune"]["prefix_tokens"] for ln in lines]
    # a partial replay: the same share warm-up as the whole plan's, in the driver and in the import
    head = lines[0]["kvtune"]["plan"]
    assert list(log.warmup) == list(sent.warmup) and log.warmup.sum() == n * head["warmup"] // head["requests"]
    assert list(log.ttft_slo_ms) == [ln["kvtune"]["ttft_slo_ms"] for ln in lines]
    # the measured figures, and the pick's configuration from the plan: a row kvtune validate replays
    assert back.open_loop and back.attainment is not None and back.ttft_p50_ms and back.tpot_p50_ms
    assert np.allclose(log.ttft_ms[log.ok], sent.ttft_ms[sent.ok])
    assert (back.model, back.engine, back.batch_cap, back.chunk_tokens) == \
        ("smollm2-135m", "llamacpp", lines[0]["kvtune"]["plan"]["pick"]["batch_cap"],
         lines[0]["kvtune"]["plan"]["pick"]["chunk_tokens"])
    assert back.ttft_p50_ms == pytest.approx(row.ttft_p50_ms) and back.attainment == pytest.approx(row.attainment)


# ---- kvtune tune --plan: the run the final pick was measured on at its promise --------------------

def _tune_result(spec, pick: dict, rate: float, n: int, warm: int):
    from kvtune.optimizer.tune_records import JobRecord, RunRecord, TuneResult
    run = RunRecord(key="r1:x1", kind="open", multiplier=1.0, rate_req_s=rate, n_requests=n, warmup=warm,
                    started_at="", duration_s=1.0, loadavg_1m=None, table_csv="", predicted_attainment=0.95,
                    predicted={"ttft_ms": {"p50": 10.0, "p90": 20.0, "p99": 30.0},
                               "tpot_ms": {"p50": 1.0, "p90": 2.0, "p99": 3.0}})
    other = RunRecord(**{**run.to_json(), "key": "r1:x1.3", "multiplier": 1.3, "rate_req_s": rate * 1.3})
    job = JobRecord(key="r1:pick", round=1, role="pick", config=pick, promise_req_s=rate, calibration="c",
                    launch_line="llama-server -m m.gguf -np 8 --port 8123", engine={}, host="h", engine_s=1.0,
                    runs=(other, run))
    return TuneResult(status="converged", reason="", workload=spec.path, engine="llamacpp", target_attainment=0.9,
                      check_multiplier=1.3, pick=pick, promise_req_s=rate, evidence="measured",
                      attainment_at_promise=None, attainment_at_check=None, launch_line=job.launch_line,
                      calibration_file="", runs=2, engine_s=1.0, jobs=(job,))


def test_tune_plan_is_the_run_at_the_promise(workload, tmp_path, capsys):
    import dataclasses
    from kvtune.optimizer.cli.tune import _tune_plan
    from kvtune.optimizer.plan import tune_plan
    from kvtune.optimizer.workload import load_workload
    spec = load_workload(workload)
    pick = {"tp": 1, "batch_cap": 8, "kv_dtype": "fp16", "spec_k": 0, "chunk_tokens": 128}
    res = _tune_result(spec, pick, 3.7, 40, 4)
    plan, head, pred = tune_plan(spec, res, seed=5)
    ref = OpenLoopPlan.from_workload(spec, 3.7, 40, 5, 4)   # what tune sent at 1.0x
    for f in ("arrival_s", "input_tokens", "output_tokens", "prefix_tokens", "prefix_group"):
        assert np.array_equal(getattr(plan.requests, f), getattr(ref.requests, f)), f
    assert plan.warmup == 4 and head["batch_cap"] == 8 and pred["slo_attainment"] == 0.95
    out = tmp_path / "tuned.jsonl"
    _tune_plan(res, spec, 5, str(out), tmp_path)
    lines = _lines(out)
    assert len(lines) == 40 and sum(ln["kvtune"]["warmup"] for ln in lines) == 4
    assert "--url http://localhost:8123" in capsys.readouterr().err   # the measured launch line's port
    # a pick the session has no run of: no plan
    assert tune_plan(spec, dataclasses.replace(res, pick={**pick, "batch_cap": 4}), 5) is None


# ---- the readers refuse hostile files in one line (as tests/measure/test_fuzz_readers.py's) ------------------

from hypothesis import given, strategies as st   # noqa: E402
from test_fuzz_readers import FUZZ, _ours, _write, mutated  # noqa: E402

_SMALL = OpenLoopPlan(_requests([40, 48, 30], [16, 32, 16], [0, 1, 0]), 2.0, 0, 1, SLO(ttft_ms=300.0))
PLAN_LINES = [json.loads(x) for x in plan_text(_SMALL, {"batch_cap": 8}, {"slo_attainment": 1.0}).text.splitlines()]


@FUZZ
@given(st.lists(st.one_of(*(mutated(ln, 2) for ln in PLAN_LINES), st.sampled_from(PLAN_LINES)), min_size=1,
                max_size=4).map(lambda ls: "\n".join(json.dumps(x, allow_nan=True) for x in ls) + "\n"))
def test_fuzz_plan_reader(content):
    back = _ours(read_plan, _write("plan.jsonl", content))
    if back is None:
        return
    req = back.plan.requests
    assert np.isfinite(req.arrival_s).all() and (req.input_tokens >= 1).all() and (req.output_tokens >= 1).all()
    read_plan(_write("again.jsonl", plan_text(back.plan).text))   # what it accepts, it writes and reads back


@FUZZ
@given(st.lists(st.one_of(mutated(AIPERF_OK, 3), mutated(AIPERF_CANCELLED, 2), st.just(AIPERF_OK)), min_size=1,
                max_size=3), st.booleans())
def test_fuzz_aiperf_records_reader(records, with_plan):
    for k, rec in enumerate(records):   # distinct numbers, as one export has, unless a mutation changed them
        if isinstance(rec.get("metadata"), dict) and rec["metadata"].get("session_num") in (0, 1):
            rec["metadata"]["session_num"] = k
    f = _write("profile_export.jsonl", "\n".join(json.dumps(r, allow_nan=True) for r in records) + "\n")
    wl = Workload(classes=(RequestClass("a", 1.0, LengthDist.fixed(550), LengthDist.fixed(9)),), rate_req_s=5.0)
    run = _ours(read_profile_export, f, OpenLoopPlan.from_workload(wl, 5.0, 4, 0, 0) if with_plan else None)
    if run is None:
        return
    run.attainment()
    run.percentiles()
    from kvtune.optimizer.importers import Metadata, rows_to_csv
    rows = _ours(run.to_rows, Metadata(gpu="h100-sxm"), "r.csv")
    if rows is not None:
        read_table(_write("t.csv", rows_to_csv(rows)))


@pytest.mark.parametrize("slo,msg", [('" "', r"key 'kvtune\.plan\.slo' = ' ' must be a mapping"),
                                     ('{"ttft_ms": "fast"}', r"key 'kvtune\.plan\.slo': slo ttft_ms must be a number > 0, got 'fast'"),
                                     ('{"attainment": 5}', r"key 'kvtune\.plan\.slo': slo attainment must be in \(0, 1\], got 5")])
def test_a_plan_whose_slo_is_not_a_mapping_of_numbers_is_one_line(tmp_path, slo, msg):
    """Found by test_fuzz_plan_reader on Python 3.10 (the lowest-dependencies job): a string for the
    header's slo was an unforeseen AttributeError."""
    from kvtune.costmodel import InputError
    line = ('{"timestamp": 0, "input_length": 40, "output_length": 4, "hash_ids": [0, 1, 2], "kvtune": {"arrival_s": 0.0, '
            '"class": "all", "prefix_tokens": 16, "prefix_group": 0, "warmup": false, "plan": {"source": "", '
            '"rate_req_s": 2.0, "seed": 0, "requests": 1, "warmup": 0, "block_tokens": 16, "prefix_tokens_unshared": 0, '
            f'"slo": {slo}, "kvtune_version": "", "pick": {{"batch_cap": 8}}, "predicted": {{"slo_attainment": 1.0}}}}}}}}\n')
    f = tmp_path / "plan.jsonl"
    f.write_text(line)
    with pytest.raises(InputError, match=msg):
        read_plan(f)
