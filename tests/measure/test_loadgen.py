"""The open-loop load driver (optimizer.loadgen) against the fake SSE server of test_profile_run.

The fake server sleeps a fixed time before the first token and between tokens, and serves every
request at once (no queue), so what is asserted about times is what the driver controls: when it
sends, that it never waits for earlier requests, and what it records.
"""

from __future__ import annotations

import math
import threading

import numpy as np
import pytest
from test_profile_run import ITL_S, TTFT_S, FakeServer, closed_port

from kvtune.costmodel.errors import InputError, KvtuneError
from kvtune.costmodel.profile_table import ProfileRow, read_table
from kvtune.costmodel.request_log import read_request_log
from kvtune.costmodel.traffic import SLO, LengthDist, RequestClass, Workload
from kvtune.optimizer.importers import Metadata, rows_to_csv
from kvtune.optimizer.loadgen import (Attainment, OpenLoopPlan, attainment_interval, drift, run_open_loop)


def workload(rate=40.0, slo=None):
    slo = slo or SLO(ttft_ms=1000.0, tpot_ms=100.0)
    chat = RequestClass("chat", 0.5, LengthDist.uniform(8, 20), LengthDist.fixed(4), prefix_tokens=6)
    rag = RequestClass("rag", 0.5, LengthDist.fixed(12), LengthDist.uniform(2, 5))
    return Workload(classes=(chat, rag), rate_req_s=rate, slo=slo)


def test_plan_is_the_simulators_draw():
    wl = workload()
    plan = OpenLoopPlan.from_workload(wl, 7.5, 50, seed=3, warmup=5)
    ref = wl.requests(50, 3, rate_req_s=7.5)
    for f in ("arrival_s", "input_tokens", "output_tokens", "prefix_tokens", "prefix_group", "class_idx"):
        assert np.array_equal(getattr(plan.requests, f), getattr(ref, f)), f
    warm = plan.is_warmup
    assert warm.sum() == 5 and warm[np.argsort(ref.arrival_s, kind="stable")[:5]].all()
    assert plan.slo == wl.slo


@pytest.mark.parametrize("kw, msg", [(dict(rate_req_s=0.0), "rate_req_s"), (dict(rate_req_s=math.inf), "rate_req_s"),
                                     (dict(n_requests=0), "n_requests"), (dict(warmup=10), "warmup"),
                                     (dict(warmup=-1), "warmup")])
def test_plan_refuses_bad_input(kw, msg):
    args = dict(rate_req_s=2.0, n_requests=10, seed=0, warmup=1) | kw
    with pytest.raises(InputError, match=msg):
        OpenLoopPlan.from_workload(workload(), **args)


def test_run_sends_open_loop_at_the_planned_times(tmp_path):
    plan = OpenLoopPlan.from_workload(workload(), 40.0, 24, seed=1, warmup=4)
    with FakeServer() as srv:
        seen = []
        run = run_open_loop(srv.url, "fake-model", plan, timeout_s=30,
                            on_progress=lambda rec, k, n: seen.append((k, n)))
        payloads = list(srv.payloads)
    assert run.complete and not run.failures and len(run.sent) == 24
    assert sorted(k for k, _ in seen) == list(range(1, 25)) and {n for _, n in seen} == {24}
    req = plan.requests
    recs = run.requests
    # each request asks for its exact output length, ignore_eos, and its prompt has its exact length
    by_prompt = {p["prompt"]: p for p in payloads}
    for r in recs:
        assert r.output_tokens_server == req.output_tokens[r.index]
        assert r.prompt_tokens_server == req.input_tokens[r.index]
    assert all(p["ignore_eos"] and p["stream"] for p in payloads)
    assert sorted(p["max_tokens"] for p in payloads) == sorted(req.output_tokens.tolist())
    # shared prefixes: the same text for every request of the class, and the cache asked for
    chat = [p for p in payloads if p["cache_prompt"]]
    assert len(chat) == int((req.prefix_tokens > 0).sum()) > 1
    heads = {" ".join(p["prompt"].split()[:5]) for p in chat}
    assert len(heads) == 1
    assert len(by_prompt) == 24
    # open loop: sent on schedule (within what a thread wake-up costs), even while earlier ones run
    late = [r.late_s for r in recs]
    assert min(late) >= -1e-3 and np.median(late) < 0.05
    overlap = sum(1 for a in recs for b in recs if a.sent_s < b.sent_s < a.sent_s + a.e2e_ms / 1e3)
    assert overlap > 0
    # what the fake server sleeps is a lower bound on what the driver measures
    assert min(r.ttft_ms for r in recs) >= TTFT_S * 1e3 * 0.9
    # (a late first read can shorten one TPOT; the whole stream cannot be shorter than its sleeps)
    assert all(r.e2e_ms >= (TTFT_S + (r.served_output_tokens - 1) * ITL_S) * 1e3 * 0.99 for r in recs)
    assert np.mean([r.tpot_ms for r in recs if r.served_output_tokens > 1]) >= ITL_S * 1e3 * 0.5
    assert math.isfinite(run.load.before_1m) and run.load.cpus >= 1


def test_attainment_percentiles_and_rows_round_trip(tmp_path):
    plan = OpenLoopPlan.from_workload(workload(), 30.0, 20, seed=2, warmup=3)
    with FakeServer() as srv:
        run = run_open_loop(srv.url, "fake-model", plan, timeout_s=30)
    att = run.attainment()
    assert isinstance(att, Attainment)
    assert (att.n, att.met, att.value, att.warmup_excluded) == (17, 17, 1.0, 3)
    # no miss: Wilson's lower end n / (n + q^2), q Student's t for 5 batches (the VIF unknown)
    from scipy.special import stdtrit

    q = stdtrit(4, 0.975)
    assert att.lo == pytest.approx(17 / (17 + q * q)) and att.hi == 1.0 and att.method == "batch-wilson"
    assert att.verdict(0.5) == "meets" and att.verdict(0.9) == "undecided"
    assert run.attainment(SLO(ttft_ms=1.0)).value == 0.0      # nobody's first token comes in 1 ms
    assert run.attainment(SLO(ttft_ms=1.0)).verdict(0.9) == "misses"
    pct = run.percentiles()
    ttft = sorted(r.ttft_ms for r in run.measured)
    assert pct["ttft_ms"]["p50"] == pytest.approx(float(np.percentile(ttft, 50)))
    assert run.goodput_at_rate() == pytest.approx(run.offered_rate_req_s)

    run.write_requests(tmp_path / "t.r1.requests.csv")
    rows = run.to_rows(Metadata(gpu="cpu-test", weight_dtype="q4_1"), "t.r1.requests.csv", threads=1)
    (tmp_path / "t.csv").write_text(rows_to_csv(rows))
    back = read_table(tmp_path / "t.csv")[0]
    assert back.open_loop and back.rate_req_s == 30.0 and back.threads == 1 and back.attainment == 1.0
    assert (back.slo_ttft_ms, back.slo_tpot_ms, back.num_requests) == (1000.0, 100.0, 17)
    assert back.loadavg_1m is not None and back.engine == "llama.cpp" and back.batch_cap == 4
    assert back.ttft_mean_ms == pytest.approx(float(np.mean(ttft)), rel=1e-5)
    log = read_request_log(back.requests_path())
    assert len(log) == 20 and log.warmup.sum() == 3 and log.measured.sum() == 17
    assert log.met_slo()[log.measured].all()
    assert np.allclose(np.sort(log.ttft_ms[log.measured]), ttft)
    req = log.to_requests()
    assert req.arrival_s[np.argmin(log.arrival_s)] == 0.0 and req.prefix_tokens.max() == 6


def test_failed_requests_count_as_misses():
    plan = OpenLoopPlan.from_workload(workload(), 50.0, 12, seed=0, warmup=0)
    with FakeServer(fail_every=3) as srv:
        run = run_open_loop(srv.url, "fake-model", plan, timeout_s=30)
    assert len(run.failures) == 4 and all("HTTP 500" in r.error for r in run.failures)
    assert run.attainment().value == pytest.approx(8 / 12)
    assert len(run.measured) == 8 and run.to_rows(Metadata(), "x.csv")[0].num_requests == 8


def test_stop_ends_sending_and_says_so():
    plan = OpenLoopPlan.from_workload(workload(), 5.0, 40, seed=0, warmup=0)   # about 8 s of arrivals
    stop = threading.Event()

    def progress(rec, k, n):
        if k >= 3:
            stop.set()

    with FakeServer() as srv:
        run = run_open_loop(srv.url, "fake-model", plan, timeout_s=30, stop=stop, on_progress=progress)
    assert not run.complete and 3 <= len(run.sent) < 40
    assert all(r.sent_s is None for r in run.requests if r not in run.sent)
    assert run.request_log().arrival_s.size == len(run.sent)


def test_unreachable_server_is_one_input_error():
    plan = OpenLoopPlan.from_workload(workload(), 5.0, 4, seed=0, warmup=0)
    with pytest.raises(InputError, match="cannot reach server"):
        run_open_loop(f"http://127.0.0.1:{closed_port()}/v1", "m", plan, timeout_s=2)


def test_every_request_failing_has_no_row():
    plan = OpenLoopPlan.from_workload(workload(), 50.0, 3, seed=0, warmup=0)
    with FakeServer(fail_every=1) as srv:
        run = run_open_loop(srv.url, "fake-model", plan, timeout_s=30)
    with pytest.raises(KvtuneError, match="no request was served"):
        run.to_rows(Metadata(), "x.csv")


# ---- the interval ----------------------------------------------------------------------------

def test_wilson_and_clopper_pearson_match_their_references():
    met = [True] * 90 + [False] * 10
    from scipy.stats import binomtest

    lo, hi, n_eff = attainment_interval(met, 0.95, "wilson")
    ref = binomtest(90, 100).proportion_ci(0.95, method="wilson")
    assert (lo, hi) == pytest.approx((ref.low, ref.high)) and n_eff == 100
    assert (lo, hi) == pytest.approx((0.8256, 0.9448), abs=1e-4)       # by hand: z = 1.95996
    ref = binomtest(90, 100).proportion_ci(0.95, method="exact")
    assert attainment_interval(met, 0.95, "clopper-pearson")[:2] == pytest.approx((ref.low, ref.high))
    assert attainment_interval([True] * 30, 0.95, "wilson")[1] == 1.0


def test_batch_wilson_widens_for_clustered_misses_only():
    rng = np.random.default_rng(0)
    iid = rng.random(300) > 0.1
    clustered = np.ones(300, dtype=bool)
    clustered[100:130] = False          # one congestion episode: 30 misses in a row
    lo_w, hi_w, _ = attainment_interval(clustered, method="wilson")
    lo_b, hi_b, n_eff = attainment_interval(clustered, method="batch-wilson")
    assert n_eff < 300 / 3 and lo_b < lo_w and hi_b >= hi_w
    # independent misses: the batch means see no inflation worth the name
    assert attainment_interval(iid, method="batch-wilson")[2] > 300 / 2
    with pytest.raises(InputError, match="method"):
        attainment_interval(iid, method="bootstrap")


# ---- drift -----------------------------------------------------------------------------------

def _row(rid, tpot, rate=2.0, load=None, **kw):
    return ProfileRow(id=rid, kind="request", gpu="cpu", engine="llama.cpp", model="smollm2-135m", rate_req_s=rate,
                      input_tokens=64, output_tokens=32, ttft_mean_ms=100.0, tpot_mean_ms=tpot, loadavg_1m=load, **kw)


def test_drift_flags_the_same_point_moving_beyond_noise():
    lines = drift([_row("a", 30.0, load=0.9), _row("b", 60.0, load=3.1), _row("c", 31.0), _row("d", 60.0, rate=3.0)])
    assert len(lines) == 2 and all("tpot_mean_ms" in x for x in lines)
    assert "loadavg 0.90" in lines[0] and "loadavg 3.10" in lines[0] and "2.00x" in lines[0]
    assert drift([_row("a", 30.0), _row("b", 33.0)]) == []          # 10%: noise
    assert drift([_row("a", 30.0, threads=1), _row("b", 60.0, threads=2)]) == []   # not the same point


# ---- the commands ----------------------------------------------------------------------------

def test_profile_open_loop_and_run_record_threads_load_and_logs(tmp_path):
    import yaml
    from helpers import kvtune

    wl = {"model": "smollm2-135m", "weights": "q4_1", "engine": "llamacpp",
          "hardware": {"gpu": "h100-sxm", "usd_per_gpu_hour": 1.0},
          "workload": {"rate_req_s": 1.0, "classes": [
              {"name": "chat", "share": 1.0, "input_tokens": {"dist": "uniform", "min": 8, "max": 16},
               "output_tokens": 3, "prefix_tokens": 4}]},
          "slo": {"ttft_ms": 2000, "tpot_ms": 500}}
    wl_path = tmp_path / "wl.yaml"
    wl_path.write_text(yaml.safe_dump(wl))
    out = tmp_path / "t.csv"
    with FakeServer() as srv:
        code, text = kvtune("profile", "open-loop", wl_path, "--url", srv.url, "--model", "smollm2-135m",
                            "--rate", "40,60", "--requests", 12, "--warmup", 2, "-o", out, "--threads", 1,
                            "--gpu", "cpu-test")
        assert code == 0, text
        assert text.count("attainment 1.000 [") == 2 and "loadavg" in text
        code, text = kvtune("profile", "run", "--url", srv.url, "--model", "smollm2-135m", "--concurrency", "1",
                            "--isl", "8", "--osl", "3", "--requests-per-point", 2, "-o", out, "--append",
                            "--threads", 2)
        assert code == 0, text
        code, text = kvtune("profile", "open-loop", wl_path, "--url", srv.url, "--model", "m", "--rate", "0,1",
                            "-o", tmp_path / "u.csv")
        assert code == 2 and text.strip() == "Error: --rate: 0 must be a finite number > 0 (requests per second)"
    rows = read_table(out)
    assert [r.rate_req_s for r in rows[:2]] == [40.0, 60.0] and rows[2].concurrency == 1
    assert [r.threads for r in rows] == [1, 1, 2] and all(r.loadavg_1m is not None for r in rows)
    for r in rows[:2]:
        log = read_request_log(r.requests_path())
        assert len(log) == 12 and log.warmup.sum() == 2 and r.num_requests == 10
        assert (log.prefix_tokens == 4).all() and r.slo_ttft_ms == 2000.0
    assert not (tmp_path / "u.csv").exists()


def test_each_run_sends_new_text_of_the_same_lengths_unless_a_prompt_seed_is_given():
    """The engine's prompt cache outlives a run: the same text twice was served from it (live,
    49 of 60 requests). Lengths, arrivals and sharing stay the plan's."""
    plan = OpenLoopPlan.from_workload(workload(), 50.0, 6, seed=4, warmup=0)
    prompts = []
    with FakeServer() as srv:
        for ps in (None, None, 7, 7):
            n0 = len(srv.payloads)
            run = run_open_loop(srv.url, "fake-model", plan, timeout_s=30, prompt_seed=ps)
            prompts.append(sorted(p["prompt"] for p in srv.payloads[n0:]))
            assert [r.prompt_tokens_server for r in run.requests] == plan.requests.input_tokens.tolist()
            assert run.prompt_seed is not None and (ps is None or run.prompt_seed == ps)
    assert prompts[0] != prompts[1] and prompts[2] == prompts[3]


def test_calibrate_prints_drift_once_per_pair_beside_contradictions():
    from kvtune.costmodel.profile_table import contradictions
    from kvtune.optimizer.cli.calibrate import _said

    rows = [_row("a", 30.0, load=0.9, date="2026-12-01T20:00"), _row("b", 90.0, load=3.1), _row("c", 40.0)]
    said = contradictions(rows)
    lines = drift(rows)
    assert len(said) == 1 and "rows a and b" in said[0]
    assert "a (2026-12-01T20:00, loadavg 0.90)" in lines[0]
    fresh = [x for x in lines if not _said(x, said)]
    pairs = sorted(tuple(sorted((x.split("rows ")[1].split(" ")[0], x.split(") and ")[1].split(" ")[0])))
                   for x in fresh)
    assert len(lines) == 3 and pairs == [("a", "c"), ("b", "c")]
