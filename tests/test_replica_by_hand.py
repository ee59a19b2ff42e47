"""The replica's scheduling rules (costmodel.replica) against the independent step-by-step reference
of tests/test_simulate.py on pools tight enough that preemption happens often, including the cases
where a preempted request would fit again at once: vLLM V1 admits nothing in a step that had to
preempt (its scheduler returns before the waiting queue when it preempted: vllm/v1/core/sched/
scheduler.py), and the victim is the most recently admitted request. Written against the mutants of
costmodel/replica.py the older tests let through and issue 25's deliberate bugs (admitting in a step
that preempted was caught only by two golden hashes)."""

import numpy as np
import pytest
from test_simulate import _poisson, _reference, _step

from kvtune.costmodel.simulate import SimConfig, simulate


@pytest.mark.parametrize("util, cap, chunk, seed, rate", [
    (0.222, 64, 1024, 0, 20.0),
    (0.233, 64, 512, 1, 60.0),
    (0.215, 64, 2048, 2, 60.0),
    (0.25, 64, 2048, 1, 60.0),
])
def test_tight_pools_match_the_step_by_step_reference(util, cap, chunk, seed, rate):
    s = _step(util=util)
    req = _poisson(60, rate, inp=(200, 900), out=(20, 300), seed=seed)
    res = simulate(s, req, SimConfig(cap, chunk_tokens=chunk, prefix_caching=False))
    ttft, e2e, preemptions = _reference(s, req, cap, chunk)
    assert preemptions > 0
    assert res.preemptions == preemptions
    np.testing.assert_allclose(res.ttft_s, ttft, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(res.e2e_s, e2e, rtol=1e-9, atol=1e-9)
