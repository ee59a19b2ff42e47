"""Issue 16 item 2: models beyond one node get a multi-node recommendation (or a true infeasible)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvtune.costmodel import get_gpu, get_model
from kvtune.optimizer.layouts import layout_params, search_layouts
from kvtune.optimizer.recommend import solve
from kvtune.optimizer.workload import load_workload, load_workload_dict

ROOT = Path(__file__).parent.resolve().parents[1]


def test_layouts_only_for_models_beyond_one_node():
    h100 = get_gpu("h100-sxm")
    assert search_layouts(get_model("llama-3.1-70b"), h100, "bf16", (1, 2, 4, 8), 8, 4, 0.9, 0.0) == {}
    big = search_layouts(get_model("llama-3.1-405b"), h100, "bf16", (1, 2, 4, 8), 8, 8, 0.9, 0.0)
    assert {"tp16-pp1-ep1", "tp8-pp2-ep1", "tp4-pp4-ep1", "tp16-pp2-ep1", "tp32-pp1-ep1"} <= set(big)
    assert all(p["tp"] * p["pp"] in (16, 32) for p in big.values())
    moe = search_layouts(get_model("deepseek-v3"), h100, "fp8", (1, 2, 4, 8), 8, 8, 0.9, 0.0)
    assert {"tp16-pp1-ep16", "tp16-pp1-ep16-dpattn", "tp8-pp2-ep8-dpattn"} <= set(moe)


def test_layout_params_defaults():
    assert layout_params({"tp": 4}, 8) == {"pp": 1, "ep": 1, "dp_attention": False, "nodes_per_replica": 1,
                                           "gpus_per_node": 8}
    assert layout_params({"tp": 8, "pp": 2, "ep": 1, "dp_attention": False}, 8)["nodes_per_replica"] == 2


@pytest.mark.parametrize("example", ["multinode-llama3.1-405b.yaml", "multinode-deepseek-v3.yaml"])
@pytest.mark.slow
def test_solve_recommends_multi_node(example):
    spec = load_workload(ROOT / "examples" / example)
    r = solve(spec, trials=30)
    assert r.status == "ok", r.reason
    rec = r.recommendation
    assert rec.tp * rec.pp >= 16 and rec.nodes_per_replica >= 2 and rec.gpus_per_node == 8
    assert rec.gpus == rec.replicas * rec.tp * rec.pp
    assert r.predicted.slo_attainment >= spec.slo.attainment
    assert {"pp", "ep", "dp_attention", "nodes_per_replica", "gpus_per_node"} <= set(rec.to_json())


def test_one_node_budget_is_a_true_infeasible():
    import yaml

    data = yaml.safe_load((ROOT / "examples" / "multinode-llama3.1-405b.yaml").read_text())
    data["hardware"]["max_nodes"] = 1
    r = solve(load_workload_dict(data), trials=20)
    assert r.status == "infeasible"
    assert "hardware.max_nodes 1" in r.reason and "16 GPUs" in r.reason
