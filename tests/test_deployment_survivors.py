"""costmodel.deployment on what the full mutation run of the module (bench/bench_mutation.py) found
untested: the throughput bound of a pool that caches prefixes (the prompt tokens it computes, and
the tokens a decode replica holds once), and the router's round robin in arrival order when
arrivals tie (the trace's order breaks the tie). Every figure by hand from the docstrings."""

import math

import numpy as np
import pytest
from test_deployment_by_hand import STEP, _Step, requests

from kvtune.costmodel.deployment import KVLink, Pool, disaggregated_bound_req_s, simulate_disaggregated
from kvtune.costmodel.simulate import SimConfig

INP, OUT = 1500.0, 300.0
CTX = INP + OUT / 2                      # 1,650: a sequence half-way through
POOL = 49_499                            # decode pool tokens: 29 sequences of 1,650, 30 of 1,649
CHUNK = 4096
CHUNK_S = 0.010 + 2e-6 * CHUNK + 1e-9 * CHUNK * (CHUNK + 1) / 2    # _Step's full chunk, no context


def _dec(replicas: int, b: int) -> float:
    """Decode pool bound with b sequences per replica: b / (T(b) x output) each (_Step's T)."""
    return replicas * b / ((0.010 + 5e-4 * b + 1e-6 * b * CTX) * OUT)


def _pools(prefill_caching: bool, decode_caching: bool, prefill_replicas: int = 3, decode_replicas: int = 2):
    s = _Step()
    return (Pool(s, SimConfig(8, CHUNK, prefix_caching=prefill_caching), prefill_replicas),
            Pool(s, SimConfig(512, kv_pool_tokens=POOL, prefix_caching=decode_caching), decode_replicas))


@pytest.mark.parametrize("uncached, todo", [(300.0, 300.0),    # 1,200 of the 1,500 prompt tokens cached
                                            (-5.0, 0.0),       # clamped at nothing to compute (one token's time)
                                            (0.5, 0.5),        # under a token: one token's time
                                            (2000.0, INP)])    # more than the prompt: the prompt
def test_a_caching_prefill_pool_is_bounded_by_the_tokens_it_computes(uncached, todo):
    prefill, _ = _pools(True, False)
    huge_decode = Pool(_Step(), SimConfig(512, kv_pool_tokens=POOL), 10**6)
    got = disaggregated_bound_req_s(prefill, huge_decode, INP, OUT, mean_uncached_tokens=uncached)
    assert got == pytest.approx(3 * CHUNK / CHUNK_S / max(todo, 1.0), rel=1e-12)


@pytest.mark.parametrize("uncached, b", [(300.0, 109),     # own = 1,650 - 1,200 = 450: 49,499 // 450 = 109
                                         (-5.0, 329),      # the whole prompt shared: own 150
                                         (0.5, 328),       # shared 1,499.5: own 150.5 -> 328 (151 -> 327)
                                         (2000.0, 29)])    # nothing shared: own 1,650
def test_a_caching_decode_pool_holds_the_cached_tokens_once(uncached, b):
    _, decode = _pools(True, True)
    huge_prefill = Pool(_Step(), SimConfig(8, CHUNK, prefix_caching=True), 10**6)
    got = disaggregated_bound_req_s(huge_prefill, decode, INP, OUT, mean_uncached_tokens=uncached)
    assert got == pytest.approx(_dec(2, b), rel=1e-12)


def test_what_a_pool_does_not_cache_counts_whole():
    # the prefill pool caches, the decode pool does not: each decode sequence holds its whole context (29 fit;
    # holding one token less would fit 30)
    huge_prefill = Pool(_Step(), SimConfig(8, CHUNK, prefix_caching=True), 10**6)
    _, decode = _pools(True, False)
    assert disaggregated_bound_req_s(huge_prefill, decode, INP, OUT, mean_uncached_tokens=300.0) == \
        pytest.approx(_dec(2, 29), rel=1e-12)
    # the prefill pool does not cache: it computes whole prompts, and then nothing counts as shared downstream
    prefill, decode = _pools(False, True)
    huge_decode = Pool(_Step(), SimConfig(512, kv_pool_tokens=POOL), 10**6)
    assert disaggregated_bound_req_s(prefill, huge_decode, INP, OUT, mean_uncached_tokens=300.0) == \
        pytest.approx(3 * CHUNK / CHUNK_S / INP, rel=1e-12)
    huge_prefill = Pool(_Step(), SimConfig(8, CHUNK, prefix_caching=False), 10**6)
    assert disaggregated_bound_req_s(huge_prefill, decode, INP, OUT, mean_uncached_tokens=300.0) == \
        pytest.approx(_dec(2, 29), rel=1e-12)
    # no figure given: the whole prompt either way
    prefill, decode = _pools(True, True)
    assert disaggregated_bound_req_s(prefill, decode, INP, OUT) == \
        pytest.approx(min(3 * CHUNK / CHUNK_S / INP, _dec(2, 29)), rel=1e-12)


def test_tied_arrivals_go_round_robin_in_the_traces_order():
    """Round robin in arrival order: requests arriving together are dealt in the trace's order (a
    stable sort; the trace here is out of order, which the Requests contract does not ask for but
    both the router and the replica sort away), so of 30 requests at t = 0 (the even ones of 60;
    the odd ones come 100 s later) the
    k-th goes to prefill replica k mod 2 as its (k div 2)-th prompt. Each replica computes one
    prompt per step (batch cap 1, a chunk that holds the prompt): the k-th is done after
    (k div 2 + 1) prefill steps."""
    n = 60
    arrivals = [0.0 if i % 2 == 0 else 100.0 for i in range(n)]
    r = simulate_disaggregated(Pool(STEP, SimConfig(1, 4096), 2), Pool(STEP, SimConfig(64), 2),
                               requests([2000] * n, [4] * n, arrivals), KVLink(1e12, 0.0, "fast"), engine="trtllm")
    p = STEP.prefill_time_s(2000, 0, 4096)
    k = np.arange(n // 2)
    np.testing.assert_allclose(r.prefill_s[0::2], (k // 2 + 1) * p, rtol=1e-9)
    np.testing.assert_allclose(r.prefill_s[1::2], (k // 2 + 1) * p, rtol=1e-9)   # the later ones likewise
    assert math.isfinite(r.result.e2e_s.max())
