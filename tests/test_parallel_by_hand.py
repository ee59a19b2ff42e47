"""The communication terms of costmodel.parallel at their edges (two GPUs, one GPU per node, a TP
group exactly one node, nothing to send), each figure by hand from the formulas in its docstring;
written against the mutants of costmodel/parallel.py the older tests let through
(bench/bench_mutation.py, bench/RESULTS-mutation.md)."""

import math

import pytest

from kvtune.costmodel import InputError
from kvtune.costmodel.parallel import Parallel, all_to_all_s, allreduce_s, expert_load_imbalance

LINK, LAT = 400e9, 2e-6       # NVLink-like bytes/s and latency (s), chosen round
NET, NET_LAT = 50e9, 10e-6    # network


def test_two_gpu_ring_all_reduce():
    # g = 2: lat + 2 (2 - 1) / 2 x S / link = 2 us + 1 MB / 400 GB/s = 2 us + 2.5 us
    assert allreduce_s(1e6, 2, 8, LINK, LAT, NET, NET_LAT) == pytest.approx(4.5e-6, rel=1e-12)


def test_one_gpu_per_node_pays_only_the_network():
    # g = 1: no NVLink step (and no NVLink latency); 4 nodes: net_lat + 2 x 3/4 x S / net
    t = allreduce_s(1e6, 4, 1, LINK, LAT, NET, NET_LAT)
    assert t == pytest.approx(10e-6 + 1.5 * 1e6 / 50e9, rel=1e-12)        # 40 us


def test_nothing_to_reduce_costs_nothing():
    assert allreduce_s(1e6, 1, 8, LINK, LAT, NET, NET_LAT) == 0.0
    assert allreduce_s(1e6, 0, 8, LINK, LAT, NET, NET_LAT) == 0.0
    assert allreduce_s(-1.0, 8, 8, LINK, LAT, NET, NET_LAT) == 0.0


def test_two_gpu_all_to_all_and_one_byte():
    # ep = 2 on one node: lat + S (2 - 1) / 2 / link
    assert all_to_all_s(1e6, 2, 8, LINK, LAT, NET, NET_LAT) == pytest.approx(2e-6 + 0.5e6 / 400e9, rel=1e-12)
    assert all_to_all_s(1.0, 8, 8, LINK, LAT, NET, NET_LAT) == pytest.approx(2e-6 + 7 / 8 / 400e9, rel=1e-12)
    assert all_to_all_s(0.0, 8, 8, LINK, LAT, NET, NET_LAT) == 0.0
    assert all_to_all_s(1e6, 1, 8, LINK, LAT, NET, NET_LAT) == 0.0


def test_an_expert_group_of_exactly_one_node_never_touches_the_network():
    # ep = g = 8: 2 us + 1 kB x 7/8 / 400 GB/s, below the network's 10 us latency, which is not paid
    t = all_to_all_s(1e3, 8, 8, LINK, LAT, NET, NET_LAT)
    assert t == pytest.approx(2e-6 + 1e3 * 7 / 8 / 400e9, rel=1e-12)
    assert t < NET_LAT


def test_expert_load_imbalance_by_hand():
    # mu = n x top_k / ep; busiest / mean = 1 + sqrt(2 ln(ep) / mu), at most ep
    assert expert_load_imbalance(4, 2, 2) == pytest.approx(1 + math.sqrt(2 * math.log(2) / 4), rel=1e-12)  # 1.589
    assert expert_load_imbalance(1, 8, 8) == pytest.approx(1 + math.sqrt(2 * math.log(8)), rel=1e-12)      # 3.039
    assert expert_load_imbalance(1, 1, 2) == 2.0     # mu = 0.5: 1 + sqrt(2 ln 2 / 0.5) = 2.67, capped at ep = 2
    assert expert_load_imbalance(0, 2, 8) == 1.0                                      # no tokens, no imbalance
    assert expert_load_imbalance(100, 2, 1) == 1.0


@pytest.mark.parametrize("field, value", [("tp", True), ("pp", 0), ("ep", 1.0), ("gpus_per_node", -8)])
def test_layout_sizes_are_whole_numbers(field, value):
    with pytest.raises(InputError, match=rf"^{field} must be a whole number >= 1, got {value!r}$"):
        Parallel(**{field: value})


def test_layout_rules_say_what_is_wrong():
    with pytest.raises(InputError, match=r"^ep must be 1 or equal to tp \(4\), got 2$"):
        Parallel(tp=4, ep=2)
    with pytest.raises(InputError, match=r"^dp_attention needs tp >= 2 \(attention is spread over the TP group's "
                                         r"GPUs\)$"):
        Parallel(tp=1, dp_attention=True)
    assert Parallel(tp=2, dp_attention=True).dp_attention
    with pytest.raises(InputError, match=r"^tp 12 spans nodes but is not a multiple of gpus_per_node 8$"):
        Parallel(tp=12)
    assert Parallel(tp=16).tp_nodes == 2
