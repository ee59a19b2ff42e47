"""kvtune solve end to end: examples solve and re-simulate within their SLOs, physics shows through,
errors are one line with the right exit status, nothing is half-written, one answer per storage."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from helpers import kvtune
from kvtune.costmodel.simulate import SimConfig, simulate
from kvtune.optimizer.recommend import sim_requests, solve
from kvtune.optimizer.search import SolveContext
from kvtune.optimizer.workload import load_workload, load_workload_dict

ROOT = Path(__file__).parent.resolve().parents[1]
EX = ROOT / "examples"


def _resimulate(spec, result, seed=12345):
    """Re-simulate the pick at rate / replicas with fresh requests (another seed)."""
    rec = result.recommendation
    ctx = SolveContext.build(spec)
    sm = ctx.step(rec.tp, rec.kv_dtype, rec.spec_k)
    n = sim_requests(spec.slo.attainment, result.bottleneck.operating_batch)
    req = spec.requests(n, seed, rate_req_s=ctx.rate_req_s / rec.replicas)
    return simulate(sm, req, SimConfig(batch_cap=rec.batch_cap, chunk_tokens=rec.chunk_tokens), seed=seed)


@pytest.mark.parametrize("name", ["chat-llama3.1-8b", "speculative-llama3.1-8b", "trace-azure"])
def test_example_solves_and_meets_its_slo_when_resimulated(name):
    spec = load_workload(EX / f"{name}.yaml")
    r = solve(spec)
    assert r.status == "ok"
    assert r.predicted.slo_attainment >= spec.slo.attainment
    assert r.headroom >= 0
    res = _resimulate(spec, r)
    assert res.slo_attainment >= spec.slo.attainment - 0.02, (name, res.slo_attainment)
    for key in ("vllm", "sglang", "trtllm", "k8s"):
        assert r.launch[key]


@pytest.mark.slow
def test_same_seed_same_recommendation():
    spec = load_workload(EX / "chat-llama3.1-8b.yaml")
    a, b = solve(spec, trials=25, seed=7), solve(spec, trials=25, seed=7)
    assert a.recommendation == b.recommendation and a.predicted == b.predicted


def _spec(tpot_ms, rate, spec_k=(0, 4), kv=("bf16",), trials=50, ttft_ms=2000, inp=600, out=300):
    return load_workload_dict({
        "model": "llama-3.1-8b",
        "hardware": {"gpu": "h100-sxm", "gpus_per_node": 8, "usd_per_gpu_hour": 3.0, "max_nodes": 4},
        "workload": {"rate_req_s": rate, "classes": [{"name": "c", "share": 1.0, "input_tokens": inp,
                                                      "output_tokens": out}]},
        "slo": {"ttft_ms": ttft_ms, "tpot_ms": tpot_ms, "attainment": 0.9},
        "speculative": {"method": "eagle3", "acceptance": 0.75, "draft_cost": 0.05},
        "search": {"tp": [1, 2, 4], "batch_cap": [1, 1024], "kv_dtype": list(kv), "spec_k": list(spec_k),
                   "chunk_tokens": [512, 16384], "trials": trials, "seed": 0}}, "<test>")


@pytest.mark.slow
def test_tight_tpot_at_small_batch_favours_speculation():
    # 5 ms/token: a plain 8B decode step on one H100 takes ~6.6 ms, so without drafts it needs TP 2
    r = solve(_spec(tpot_ms=5, rate=4))
    assert r.status == "ok"
    assert r.recommendation.spec_k > 0 and r.recommendation.tp == 1
    plain = solve(_spec(tpot_ms=5, rate=4, spec_k=(0, 0)))
    assert plain.status == "infeasible" or plain.cost.usd_per_hour > r.cost.usd_per_hour


@pytest.mark.slow
def test_loose_tpot_with_a_huge_rate_disfavours_speculation():
    # compute-bound big batches: k + 1 verify tokens per sequence cost more than the ~2.7 they emit
    r = solve(_spec(tpot_ms=200, rate=300))
    assert r.status == "ok" and r.recommendation.spec_k == 0


def _spec_len(model, inp, out, rate, ttft_ms=5000, tpot_ms=50, trials=40):
    return load_workload_dict({
        "model": model,
        "hardware": {"gpu": "h100-sxm", "gpus_per_node": 8, "usd_per_gpu_hour": 3.0, "max_nodes": 8},
        "workload": {"rate_req_s": rate, "classes": [{"name": "c", "share": 1.0, "input_tokens": inp,
                                                      "output_tokens": out}]},
        "slo": {"ttft_ms": ttft_ms, "tpot_ms": tpot_ms, "attainment": 0.9},
        "search": {"tp": [1, 2, 4, 8], "batch_cap": [8, 1024], "kv_dtype": ["bf16", "fp8"],
                   "chunk_tokens": [512, 16384], "trials": trials, "seed": 0}}, "<test>")


@pytest.mark.slow
def test_long_prompts_push_to_fp8_kv():
    """The final (simulator-verified) picks: 1k-token prompts at 5 req/s keep bf16 KV (their ~250
    sequences in flight fit one GPU's bf16 pool, so fp8 buys no saving); 16k-token prompts with the
    same outputs fill the KV pool and only fp8 KV fits the same GPU."""
    short = solve(_spec_len("llama-3.1-8b", 1000, 1000, rate=5))
    long = solve(_spec_len("llama-3.1-8b", 16000, 1000, rate=1))
    assert short.status == long.status == "ok"
    assert short.recommendation.kv_dtype == "bf16"
    assert long.recommendation.kv_dtype == "fp8"


@pytest.mark.slow
def test_longer_prompts_push_to_larger_tp():
    """Llama-3.1-70B: 1k/8k RAG prompts are served at TP 4; 100k-128k documents need TP 8, where
    prefill of a whole document is fastest and the pool holds the most sequences."""
    rag = solve(load_workload(EX / "rag-llama3.1-70b.yaml"))
    doc = solve(load_workload(EX / "longdoc-128k.yaml"))
    assert rag.status == doc.status == "ok"
    assert doc.recommendation.tp > rag.recommendation.tp


def test_bf16_only_search_never_picks_fp8():
    r = solve(_spec(tpot_ms=40, rate=50, spec_k=(0, 0), kv=("bf16",), trials=25))
    assert r.recommendation.kv_dtype == "bf16"
    assert any("excluded" in n for n in r.notes)


# ---- CLI: exit codes, one-line errors, atomic output ---------------------------------------------
def _write(tmp_path, d, name="w.yaml"):
    p = tmp_path / name
    p.write_text(yaml.safe_dump(d))
    return p


def test_impossible_slo_is_infeasible_exit_3_naming_the_binding_term(tmp_path):
    d = yaml.safe_load((EX / "chat-llama3.1-8b.yaml").read_text())
    d["slo"] = {"ttft_ms": 500, "tpot_ms": 1, "attainment": 0.9}
    d["search"]["trials"] = 15
    out = tmp_path / "r.json"
    code, text = kvtune("solve", str(_write(tmp_path, d)), "--json", str(out), "--quiet")
    assert code == 3
    r = json.loads(out.read_text())
    assert r["status"] == "infeasible" and r["reason"].startswith("TPOT")
    assert r["closest"]["config"] and "INFEASIBLE" in text


def test_ttft_impossible_names_prefill(tmp_path):
    d = yaml.safe_load((EX / "longdoc-128k.yaml").read_text())
    d["slo"]["ttft_ms"] = 500
    d["search"]["trials"] = 10
    out = tmp_path / "r.json"
    code, _ = kvtune("solve", str(_write(tmp_path, d)), "--json", str(out), "--quiet")
    r = json.loads(out.read_text())
    assert code == 3 and r["reason"].startswith("TTFT") and "prefill" in r["reason"]


@pytest.mark.parametrize("args", [["--trials", "abc"], ["--sampler", "random"], ["--seed", "-1"],
                                  ["--storage", "nonsense"]])
def test_bad_flags_one_line_exit_2_nothing_written(tmp_path, args):
    out = tmp_path / "r.json"
    code, text = kvtune("solve", str(EX / "chat-llama3.1-8b.yaml"), "--json", str(out), "--quiet", *args)
    assert code == 2
    assert len(text.strip().splitlines()) == 1 and text.startswith("Error:")
    assert not out.exists() and not list(tmp_path.iterdir())


def test_bad_yaml_one_line_exit_2_nothing_written(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: llama-3.1-8b\nslo: {ttft_ms: -5}\n")
    out = tmp_path / "r.json"
    code, text = kvtune("solve", str(bad), "--json", str(out), "--quiet")
    assert code == 2 and len(text.strip().splitlines()) == 1 and "bad.yaml" in text
    assert not out.exists()


@pytest.mark.slow
def test_json_has_the_contract_keys(tmp_path):
    out = tmp_path / "r.json"
    code, text = kvtune("solve", str(EX / "chat-llama3.1-8b.yaml"), "--trials", "20", "--json", str(out), "--quiet")
    assert code == 0, text
    r = json.loads(out.read_text())
    for k in ("status", "recommendation", "predicted", "cost", "bottleneck", "headroom", "pareto", "launch",
              "trials", "seed", "kvtune_version", "source", "notes"):
        assert k in r
    assert set(r["recommendation"]) >= {"tp", "replicas", "gpus", "nodes", "batch_cap", "kv_dtype", "spec_k", "chunk_tokens"}
    for k in ("ttft_ms", "tpot_ms"):
        assert set(r["predicted"][k]) >= {"p50", "p90", "p99"}
    assert r["cost"]["usd_per_hour"] == r["recommendation"]["gpus"] * 3.0
    assert r["bottleneck"]["term"] in ("kv_pool", "bandwidth", "compute", "prefill")
    assert r["trials"]["completed"] == 20 and r["source"].startswith("calibrated")
    assert "Recommendation:" in text and "vllm serve" in text


@pytest.mark.slow
def test_two_cli_processes_on_one_journal_give_one_answer(tmp_path):
    url = f"journal:{tmp_path / 'j.log'}"
    procs = [subprocess.Popen([sys.executable, "-c", "from kvtune.optimizer.cli import main; main()", "solve",
                               str(EX / "trace-azure.yaml"), "--trials", "40", "--storage", url, "--study-name", "s",
                               "--json", str(tmp_path / f"r{i}.json"), "--quiet"], cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for i in range(2)]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err.decode()[-2000:]
    a, b = (json.loads((tmp_path / f"r{i}.json").read_text()) for i in range(2))
    assert a["trials"]["completed"] == b["trials"]["completed"] == 40
    assert a["recommendation"] == b["recommendation"]
