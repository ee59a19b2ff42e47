"""A search costs what the workload needs, not what hardware.max_nodes offers: max_nodes 4, 10,000
and 100,000 give the same answer (once 4 nodes hold it) with the same simulations."""

import copy
import dataclasses
import math

import pytest

from kvtune.costmodel import get_model
from kvtune.costmodel.hardware import resolve_gpu
from solve_fakes import solve_kinds
from kvtune.optimizer.layouts import search_layouts
from kvtune.optimizer.search import SolveContext
from kvtune.optimizer.simsearch import ZERO_LOAD_SHARE, _capacity, bar_req_s, replicas_bound
from kvtune.optimizer.workload import load_workload_dict
from test_scaleout import WORKLOAD


def _spec(max_nodes, deployment=("aggregated", "disaggregated")):
    """tests/optimizer/test_scaleout.py's workload on ``max_nodes`` nodes."""
    w = copy.deepcopy(WORKLOAD)
    w["hardware"]["max_nodes"] = max_nodes
    w["search"]["deployment"] = list(deployment)
    return load_workload_dict(w, "<test>")


P = {"tp": 1, "batch_cap": 16, "kv_dtype": "bf16", "spec_k": 0, "chunk_tokens": 1024}


def test_the_first_bar_stops_at_the_replicas_a_config_could_need():
    small, big, huge = (SolveContext.build(_spec(n)) for n in (1, 10_000, 100_000))
    assert bar_req_s(small, P, None)[:2] == (30 / 8, 8)            # one node: max_nodes binds, as before
    need = replicas_bound(big, P)
    # the zero-load probe rate is a rate the config was simulated to meet: more replicas than
    # the target needs at that rate cannot be its cheapest deployment
    assert need == math.ceil(30 / (ZERO_LOAD_SHARE * _capacity(big, P)))
    assert 8 < need < big.max_gpus
    assert bar_req_s(big, P, None) == bar_req_s(huge, P, None)
    assert bar_req_s(big, P, None)[:2] == (30 / need, need)
    assert "could need" in bar_req_s(big, P, None)[2]


def test_multi_node_layouts_depend_on_the_model_not_on_max_nodes():
    model, gpu = get_model("llama-3.1-405b"), resolve_gpu("h100-sxm")
    got = [search_layouts(model, gpu, "bf16", (1, 2, 4, 8), 8, n, 0.9, 2e9) for n in (4, 10_000, 100_000)]
    assert got[0] and got[0] == got[1] == got[2]


@pytest.mark.slow
def test_max_nodes_4_10000_100000_same_answer_same_simulations():
    """Metamorphic: more nodes on offer than the answer needs change nothing, not even the work."""
    out = {n: solve_kinds(_spec(n), jobs=1) for n in (4, 10_000, 100_000)}
    ans = {n: (r.recommendation, r.predicted, r.cost, r.verified) for n, r in out.items()}
    assert out[4].status == "ok"
    assert ans[4] == ans[10_000] == ans[100_000]
    sims = {n: r.verification.simulations for n, r in out.items()}
    assert sims[10_000] == sims[100_000] <= sims[4] + 20, sims
    # the disaggregated race too (its units are bounded by MAX_UNIT_GPUS); its record's wall times aside
    assert _timeless(dataclasses.asdict(out[10_000].deployment)) == _timeless(dataclasses.asdict(out[100_000].deployment))


def _timeless(x):
    if isinstance(x, dict):
        return {k: _timeless(v) for k, v in x.items() if k != "wall_s"}
    if isinstance(x, (list, tuple)):
        return [_timeless(v) for v in x]
    return x
