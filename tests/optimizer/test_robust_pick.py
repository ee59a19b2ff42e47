"""Issue 22: the pick holds on tomorrow's traffic. The race returns the exhaustive lexicographic
optimum (and a wrong order would not), the pick meets the target on fresh draws of the benchmark
size, ``kvtune simulate`` reproduces the figures solve prints for any deployment kind, a GPU list is
never dearer than one of its members alone, and an infeasible answer names the nearest miss.
Whole searches: every test here is slow."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from kvtune.optimizer.cli import main
from kvtune.optimizer.search import SolveContext, config_key
from kvtune.optimizer.simsearch import LocalRunner, lattice_configs, race, ranked_goodput
from kvtune.optimizer.verify import robust, simulate_at, verify_config
from kvtune.optimizer.workload import load_workload, load_workload_dict

from test_simsearch import at_capacity_spec, tiny_spec

ROOT = Path(__file__).parent.resolve().parents[1]
pytestmark = pytest.mark.slow


def _spec_3k_ttft150():
    """Llama-3.1-8B, 3,000-token prompts at 30 req/s, TTFT 150 ms: the pick sits close to its
    goodput (a tight min_cost case)."""
    return load_workload_dict({
        "model": "llama-3.1-8b",
        "hardware": {"gpu": "h100-sxm", "gpus_per_node": 8, "usd_per_gpu_hour": 2.0, "max_nodes": 1},
        "workload": {"rate_req_s": 30, "classes": [{"name": "c", "share": 1.0, "input_tokens": 3000,
                                                    "output_tokens": {"dist": "lognormal", "mean": 200,
                                                                      "sigma": 0.5, "max": 800}}]},
        "slo": {"ttft_ms": 150, "tpot_ms": 30, "attainment": 0.9}, "objective": "min_cost",
        "search": {"tp": [1, 2], "batch_cap": [16, 64], "kv_dtype": ["bf16"], "chunk_tokens": [1024, 4096],
                   "trials": 5, "seed": 0, "deployment": ["aggregated"]}}, "<test>")


FRESH = 20   # fresh draws per pick, seeds far from the ones the pick was verified on


@pytest.mark.parametrize("make_spec", [_spec_3k_ttft150, at_capacity_spec,
                                       lambda: load_workload(ROOT / "bench/oracle/speculative-70b-acceptance05-max-goodput.yaml")],
                         ids=["min_cost-tight", "max_goodput-8b-at-capacity", "max_goodput-70b-speculative-at-capacity"])
def test_the_pick_meets_the_target_on_fresh_draws_of_the_benchmark_size(make_spec):
    """A fresh draw of the verification's size at the pick's load meets the target with probability
    >= 95% by design (the load is at most the least goodput of 20 exchangeable draws); 20 draws the
    pick never saw: at least 19 meet."""
    ctx = SolveContext.build(make_spec())
    b = race(ctx, LocalRunner(ctx, 1)).best
    assert b is not None and b.draws is not None and len(b.draws.seeds) == 19
    assert min(b.draws.attainment) >= ctx.spec.slo.attainment        # every design draw meets at the load
    seeds = [ctx.workload_seed + 1000 + i for i in range(FRESH)]
    att = [simulate_at(ctx, b.params, b.fleet_rate_req_s, b.replicas, b.draws.n_requests, s).slo_attainment
           for s in seeds]
    assert sum(a >= ctx.spec.slo.attainment for a in att) >= 19, att


# ---- the order: the race against the exhaustive optimum, and two wrong orders that must fail ------
def _costlier_first_spec():
    """36 configs (TP1/TP2, bf16/fp8 KV, batch caps 16-64, chunks 1k-4k) at 36 req/s: the race
    verifies bf16 configs at $12/h before an fp8 one at $10/h."""
    return tiny_spec(workload={"rate_req_s": 36, "classes": [
        {"name": "c", "share": 1.0, "input_tokens": 3000,
         "output_tokens": {"dist": "lognormal", "mean": 200, "sigma": 0.5, "max": 800}}]})


def _equal_cost_spec():
    """18 configs (bf16 KV only) at 30 req/s: the race verifies two configs at the least $/h whose
    goodput differs."""
    return tiny_spec(search={"tp": [1, 2], "batch_cap": [16, 64], "kv_dtype": ["bf16"],
                             "chunk_tokens": [1024, 4096], "trials": 5, "seed": 0})


def _key(ctx):
    """The order written out: $/h, then bf16 KV (when fp8 is searched too), then the most goodput."""
    both = set(ctx.spec.search.kv_dtype) == {"bf16", "fp8"}
    return lambda v: (v.usd_per_hour, both and v.params["kv_dtype"] != "bf16", -ranked_goodput(v), config_key(v.params))


def _exhaustive_best(ctx):
    """Every lattice config verified, then made robust in that order until none can beat the best
    (the oracle bench's rule)."""
    key = _key(ctx)
    ok = sorted((v for v in (verify_config(ctx, p) for p in lattice_configs(ctx)) if v.feasible), key=key)
    best = None
    for v in ok:
        if best is not None and not key(v) < key(best):
            break
        r = robust(ctx, v)
        if r.feasible and (best is None or key(r) < key(best)):
            best = r
    return best, ok


def _most_expensive_first(objective, usd, good, kv, kvs):
    return (-usd, kv != "bf16", -good)


def _least_goodput_first(objective, usd, good, kv, kvs):
    return (usd, kv != "bf16", good)


@pytest.mark.parametrize("make_spec, order", [
    (_costlier_first_spec, None), (_equal_cost_spec, None),
    (_costlier_first_spec, _most_expensive_first),
    # the race takes the screened configs in the objective's own order (Objective.rank, simsearch._prior), so a
    # tie-break that prefers the least goodput also races the weaker equal-cost config first, and
    # it keeps the best's place: the answer is wrong end to end (this case was a strict xfail while
    # the race order was the screen's value, which raced the better one first and never verified
    # the worse one)
    (_equal_cost_spec, _least_goodput_first)],
    ids=["costs differ", "goodputs differ at equal cost", "bug: most expensive first", "bug: tie-break least goodput"])
def test_the_race_returns_the_exhaustive_optimum_and_a_wrong_order_does_not(make_spec, order, monkeypatch):
    ctx = SolveContext.build(make_spec())
    best, ok = _exhaustive_best(ctx)
    # the lattice can tell the orders apart: configs at the least $/h differ in goodput, others cost more
    cheapest = [v for v in ok if v.usd_per_hour == best.usd_per_hour]
    assert len({round(ranked_goodput(v), 6) for v in cheapest}) > 1 and any(v.usd_per_hour > best.usd_per_hour for v in ok)
    if order is not None:
        # the objective's one ranking: the race's order and its pick both read it
        monkeypatch.setattr(type(ctx.objective), "rank",
                            lambda self, usd, good, kv, kvs=("bf16",): order(self.name, usd, good, kv, kvs))
    r = race(ctx, LocalRunner(ctx, 1))
    pick = r.best
    same = pick is not None and (pick.usd_per_hour, ranked_goodput(pick), pick.params["kv_dtype"]) == (
        best.usd_per_hour, ranked_goodput(best), best.params["kv_dtype"])
    assert same == (order is None), (config_key(pick.params) if pick else None, config_key(best.params))
    if order is None:   # the race simulated less than the exhaustive sweep
        assert len(r.verified) < len(ok)


# ---- kvtune simulate reproduces solve's printed figures, for every kind of deployment ------------
def _solve(path: Path, tmp_path: Path) -> dict:
    out = tmp_path / "r.json"
    r = CliRunner().invoke(main, ["solve", str(path), "--quiet", "--json", str(out)])
    assert r.exit_code == 0, r.output
    assert "check (the first fresh draw" in r.output and "kvtune simulate" in r.output
    return json.loads(out.read_text())


def _reproduces(result: dict) -> dict:
    p = result["predicted"]
    args = shlex.split(p["check"])
    assert args[:2] == ["kvtune", "simulate"]
    r = CliRunner().invoke(main, [*args[1:], "--json"])
    assert r.exit_code == 0, r.output
    sim = json.loads(r.output)
    for k in ("ttft_ms", "tpot_ms"):
        for q in ("mean", "p50", "p90", "p99"):
            assert sim[k][q] == p[k][q], (k, q)
    assert sim["slo_attainment"] == p["slo_attainment"]
    return sim


def test_simulate_reproduces_an_aggregated_pick(tmp_path):
    w = tmp_path / "w.yaml"
    w.write_text(yaml.safe_dump({**yaml.safe_load((ROOT / "examples/chat-llama3.1-8b.yaml").read_text()),
                                 "search": {"tp": [1, 2], "batch_cap": [64, 512], "kv_dtype": ["bf16", "fp8"],
                                            "chunk_tokens": [2048, 8192], "trials": 10, "seed": 0,
                                            "deployment": ["aggregated"]}}))
    sim = _reproduces(_solve(w, tmp_path))
    assert sim["config"]["replicas"] >= 1


def test_simulate_reproduces_a_disaggregated_pick(tmp_path):
    r = _solve(ROOT / "examples/rag-llama3.1-70b.yaml", tmp_path)
    assert r["recommendation"]["deployment"] == "disaggregated"
    sim = _reproduces(r)
    assert sim["config"]["deployment"] == "disaggregated"
    assert sim["config"]["gpus"] == r["recommendation"]["gpus"]


def test_simulate_reproduces_a_multi_node_pick(tmp_path):
    r = _solve(ROOT / "examples/multinode-llama3.1-405b.yaml", tmp_path)
    rec = r["recommendation"]
    assert rec["nodes_per_replica"] > 1 or rec["tp"] * rec["pp"] > 8
    _reproduces(r)


# ---- a GPU list searches every kind on every type: never dearer than a member alone --------------
def _gpu_doc(gpu, usd):
    d = yaml.safe_load((ROOT / "examples/chat-llama3.1-8b.yaml").read_text())
    d["hardware"].update(gpu=gpu, usd_per_gpu_hour=usd, max_nodes=1)
    d["workload"]["rate_req_s"] = 40
    d["search"] = {"tp": [1, 2], "batch_cap": [64, 512], "kv_dtype": ["bf16"], "chunk_tokens": [2048, 8192],
                   "trials": 10, "seed": 0}
    return d


def test_a_gpu_list_is_never_dearer_than_any_member_alone_and_its_pick_reproduces(tmp_path):
    prices = {"h100-sxm": 3.0, "h200": 3.4}
    (tmp_path / "list.yaml").write_text(yaml.safe_dump(_gpu_doc(list(prices), prices)))
    both = _solve(tmp_path / "list.yaml", tmp_path)
    alone = {}
    for g, usd in prices.items():
        (tmp_path / f"{g}.yaml").write_text(yaml.safe_dump(_gpu_doc(g, usd)))
        alone[g] = _solve(tmp_path / f"{g}.yaml", tmp_path)
        assert both["cost"]["usd_per_hour"] <= alone[g]["cost"]["usd_per_hour"] + 1e-9
    winner = both["recommendation"]["gpu"]
    assert both["cost"]["usd_per_hour"] == alone[winner]["cost"]["usd_per_hour"]
    assert both["recommendation"] == alone[winner]["recommendation"]
    # every type was searched with every kind: its row matches its solve alone, or (searched only up to
    # the price already found on a type before it) says nothing is there, which its solve alone confirms
    for row in both["gpu_choice"]:
        mine = alone[row["gpu"]]
        if row["status"] == "dearer":
            assert mine["status"] != "ok" or mine["cost"]["usd_per_hour"] > both["cost"]["usd_per_hour"]
        else:
            assert row["usd_per_hour"] == mine["cost"]["usd_per_hour"]
    sim = _reproduces(both)
    assert sim["config"]["gpu"] == winner


# ---- an infeasible answer names the nearest miss ---------------------------------------------------
def test_an_infeasible_answer_names_the_config_nearest_the_target(tmp_path):
    """Issue 22's 70B summariser of 16k-token documents at 2 req/s on one node: no config serves it,
    and the answer names the verified config that needs the fewest GPUs, what it serves per
    replica and how many nodes it would take (not the first config a bar happened to beat)."""
    import re
    w = tmp_path / "sum.yaml"
    w.write_text(yaml.safe_dump({
        "model": "llama-3.1-70b", "weights": "bf16",
        "hardware": {"gpu": "h100-sxm", "gpus_per_node": 8, "usd_per_gpu_hour": 3.0, "max_nodes": 1},
        "workload": {"rate_req_s": 2, "classes": [{"name": "doc", "share": 1.0, "input_tokens": 16000,
                                                   "output_tokens": {"dist": "lognormal", "mean": 400,
                                                                     "sigma": 0.4, "max": 1200}}]},
        "slo": {"ttft_ms": 8000, "tpot_ms": 60, "attainment": 0.9}, "objective": "min_cost",
        "search": {"tp": [4, 8], "batch_cap": [4, 64], "kv_dtype": ["bf16", "fp8"], "chunk_tokens": [2048, 8192],
                   "trials": 10, "seed": 0, "deployment": ["aggregated"]}}))
    out = tmp_path / "r.json"
    r = CliRunner().invoke(main, ["solve", str(w), "--quiet", "--json", str(out)])
    assert r.exit_code == 3, r.output
    res = json.loads(out.read_text())
    c = res["closest"]
    priced = [v for v in res["verified"] if v["usd_per_hour"] is not None]
    assert len(priced) >= 2 and c["usd_per_hour"] == min(v["usd_per_hour"] for v in priced)
    assert {v["config"]["tp"] for v in priced} == {4, 8}          # both TP sizes were looked at
    said = r"serves [0-9.]+ req/s per replica \(simulated\): \d+ x \d GPUs = \d+ GPUs on \d+ nodes, max_nodes is 1"
    assert re.search(said, c["miss"]) and re.search(said, res["reason"]), c["miss"]


# ---- a burst in a short probe cannot drop the optimum ---------------------------------------------
SPEC70 = ROOT / "bench/oracle/speculative-70b-acceptance05-max-goodput.yaml"
OPTIMUM70 = {"tp": 4, "batch_cap": 512, "kv_dtype": "fp8", "spec_k": 1, "chunk_tokens": 4096}


def test_a_burst_in_a_short_probe_does_not_drop_the_optimum():
    """Issue 22's 70B speculative case (acceptance 0.5, max_goodput), rebuilt: on the workload's seed
    the optimum's 640-request probe at 98% of its goodput reads attainment < 0.8 (a burst; a fixed
    margin of 0.10 below the target drops it there), its full 2,560 requests meet the target, and
    the probe's own upper confidence bound reaches the target, so the race keeps it and picks it."""
    from kvtune.optimizer.simsearch import Probe, Work, execute
    ctx = SolveContext.build(load_workload(SPEC70))
    p = OPTIMUM70
    v = verify_config(ctx, p)
    n = v.sim_requests
    rate = 0.98 * v.per_replica_goodput_req_s
    short = Probe.from_json(execute(ctx, Work("probe", p, rate, n // 4)))
    full = Probe.from_json(execute(ctx, Work("probe", p, rate, n)))
    assert (n, n // 4) == (2560, 640)
    assert short.attainment < ctx.spec.slo.attainment - 0.10 and full.meets
    assert short.upper >= ctx.spec.slo.attainment
    pick = race(ctx, LocalRunner(ctx, 1)).best
    assert pick is not None and ranked_goodput(pick) / pick.params["tp"] >= ranked_goodput(v) / p["tp"]
