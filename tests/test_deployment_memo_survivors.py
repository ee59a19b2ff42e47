"""costmodel.deployment's prefill pool and its memo, on what the round-5 full mutation run of the
module (bench/mutation-runs/r5-step-deployment-all-1337.json) found untested: the time a prompt is
done on its prefill replica (engine time: the front end excluded), every replica of the round robin
served even with a single request, the pool's counters as the sum of its replicas', and the memo
(``_prefill_pool``): it answers exactly as a fresh simulation, computes each input once, tells apart
inputs that differ in anything it reads, hands out copies, works for a model it cannot weakly key,
and holds at most ``_PREFILL_MEMO_MAX`` entries per model. Figures by hand from the docstrings, or by
a second derivation from ``simulate_replica`` (the replica each share runs on)."""

import numpy as np
import pytest
from test_deployment_by_hand import EFF, FRONT_S, H100, requests

from kvtune.costmodel import StepModel, get_model
from kvtune.costmodel import deployment as D
from kvtune.costmodel.deployment import Pool
from kvtune.costmodel.requests import Requests
from kvtune.costmodel.simulate import SimConfig, simulate_replica

CHUNK = 4096


def _step() -> StepModel:
    """A fresh model per test: the memo is keyed by the model object, so nothing carries over."""
    return StepModel(get_model("llama-3.1-8b"), H100, 1, efficiency=EFF)


def _prompt_s(step, tokens_per_prompt: list[int]) -> float:
    """One step computing whole prompts (each under a chunk, no cached context): the tokens and the
    attention pairs of each prompt with itself, added."""
    pairs = sum(StepModel.chunk_pairs(t, 0) for t in tokens_per_prompt)
    return step.step_time_s(0, 0.0, sum(tokens_per_prompt), pairs, 0.0)


def _args(req: Requests, arrival: str = "trace"):
    arr = req.arrival_s.astype(float) if arrival == "trace" else np.zeros(len(req))
    return arr, np.argsort(arr, kind="stable")


def _same(a, b) -> None:
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
    assert a[2:] == b[2:]


# ---- the prefill pool computed ----------------------------------------------------------------------

def test_a_lone_prompt_is_ready_one_prompt_step_after_its_arrival_s():
    # engine time: the prompt arrives at 5 s and is done one step later; the front end's 20 ms
    # (request_overhead_s) is the user's, not the engine's, so it is not in the ready time
    s = _step()
    assert s.request_overhead_s == FRONT_S > 0
    req = requests([1000], [7], [5.0])
    ready, rej, pre, steps, _, reasons = D._simulate_prefill_pool(Pool(s, SimConfig(8, CHUNK), 1), req, *_args(req),
                                                                  "trace", 0)
    assert ready[0] == pytest.approx(5.0 + _prompt_s(s, [1000]), rel=1e-12)
    assert (rej.tolist(), pre, steps, reasons) == ([False], 0, 1, [])


def test_every_replica_of_the_round_robin_serves_even_a_single_request():
    # three prompts at t=0 over two replicas: replica 0 takes the 1st and 3rd (one step of both),
    # replica 1 the 2nd alone (one step); one step each, nothing preempted (nothing decodes there)
    s = _step()
    req = requests([1000, 1000, 1000], [50, 60, 70], [0.0, 0.0, 0.0])
    arr, order = _args(req)
    ready, rej, pre, steps, events, reasons = D._simulate_prefill_pool(Pool(s, SimConfig(8, CHUNK), 2), req, arr,
                                                                       order, "trace", 0)
    two, one = _prompt_s(s, [1000, 1000]), _prompt_s(s, [1000])
    assert ready == pytest.approx([two, one, two], rel=1e-12)
    assert (rej.tolist(), pre, steps, reasons) == ([False] * 3, 0, 2, [])
    # the loop turns: the replicas', added (each serves its share with one output token)
    ev = 0
    for idx in (np.array([0, 2]), np.array([1])):
        sub = requests(req.input_tokens[idx], [1] * idx.size, req.arrival_s[idx])
        ev += simulate_replica(s, sub, SimConfig(8, CHUNK), "trace", None, 0, 0.0, naive=False).events
    assert events == ev and events >= 2      # each replica turns its loop at least once


def test_a_long_prompt_is_simulated_in_closed_form_chunk_runs_and_its_counters_add_up():
    # two 20,000-token prompts at t=0 over two replicas, 512-token chunks: each replica computes
    # ceil(20,000 / 512) = 40 chunks (39 full, one of 32), one step each: 80 steps in the pool. Its
    # loop turns are its replicas' as ``simulate`` runs them (runs of identical chunks summed in
    # closed form, naive=False), so far fewer turns than steps; the times are the replicas' too
    s = _step()
    cfg = SimConfig(8, 512)
    req = requests([20_000, 20_000], [9, 9], [0.0, 0.0])
    ready, rej, pre, steps, events, _ = D._simulate_prefill_pool(Pool(s, cfg, 2), req, *_args(req), "trace", 0)
    assert (rej.tolist(), pre, steps) == ([False, False], 0, 80)
    lone = simulate_replica(s, requests([20_000], [1], [0.0]), cfg, "trace", None, 0, 0.0, naive=False)
    assert (lone.steps, events) == (40, 2 * lone.events)
    assert events < steps
    assert ready.tolist() == [lone.e2e_s[0] - FRONT_S] * 2


# ---- the memo -----------------------------------------------------------------------------------------

@pytest.fixture
def counted(monkeypatch):
    """Counts the prefill pools actually simulated (the memo's misses)."""
    calls = []
    real = D._simulate_prefill_pool

    def spy(*a):
        calls.append(a)
        return real(*a)

    monkeypatch.setattr(D, "_simulate_prefill_pool", spy)
    return calls


def _base() -> Requests:
    return requests([900, 1200, 700, 1500], [5, 5, 5, 5], [0.0, 0.004, 0.050, 0.100])   # replica 0: the 1st and 3rd


def test_the_memo_answers_as_a_fresh_simulation_and_simulates_each_input_once(counted):
    s, req = _step(), _base()
    pool = Pool(s, SimConfig(8, CHUNK), 2)
    first = D._prefill_pool(pool, req, *_args(req), "trace", 0)
    again = D._prefill_pool(pool, req, *_args(req), "trace", 0)
    assert len(counted) == 1                  # the second call is a hit
    assert len(D._PREFILL_MEMO[s]) == 1       # kept per model
    _same(first, again)
    _same(again, D._simulate_prefill_pool(pool, req, *_args(req), "trace", 0))


def test_a_hit_shares_nothing_mutable_with_the_caller():
    s = _step()
    req = requests([1000, 50_000_000 // 10], [1, 1], [0.0, 0.0])   # the 2nd never fits: rejected, with a reason
    pool = Pool(s, SimConfig(8, CHUNK), 1)
    got = D._prefill_pool(pool, req, *_args(req), "trace", 0)
    assert got[1].tolist() == [False, True] and got[5]
    want = D._simulate_prefill_pool(pool, req, *_args(req), "trace", 0)
    got[0][:] = -1.0
    got[1][:] = False
    got[5].append("scribbled")
    _same(D._prefill_pool(pool, req, *_args(req), "trace", 0), want)


def _variants():
    """(what differs, the requests the memo is primed with, the requests asked, replicas, config, arrival):
    each asked input differs from the primed one in one thing the prefill pool reads."""
    base = _base()
    n = len(base)

    def w(**kw):
        cols = dict(arrival_s=base.arrival_s, input_tokens=base.input_tokens, output_tokens=base.output_tokens,
                    prefix_tokens=base.prefix_tokens, prefix_group=base.prefix_group, ttft_slo_s=base.ttft_slo_s,
                    tpot_slo_s=base.tpot_slo_s, class_idx=base.class_idx)
        cols.update(kw)
        return Requests(**cols)

    cfg = SimConfig(8, CHUNK, prefix_caching=True)
    pre = np.array([600, 0, 600, 0])
    shared = w(prefix_tokens=pre, prefix_group=np.array([3, -1, 3, -1]))     # both on replica 0, one after the other
    return [
        ("replicas", base, base, 1, cfg, "trace"),
        ("arrival_s", base, w(arrival_s=base.arrival_s * 3), 2, cfg, "trace"),
        ("input_tokens", base, w(input_tokens=base.input_tokens + 500), 2, cfg, "trace"),
        ("prefix_tokens", base, shared, 2, cfg, "trace"),
        ("prefix_group", shared, w(prefix_tokens=pre, prefix_group=np.array([3, -1, 4, -1])), 2, cfg, "trace"),
        ("config", base, base, 2, SimConfig(8, 512, prefix_caching=True), "trace"),
        ("arrival", base, base, 2, cfg, "inf"),
        ("n", base, requests(base.input_tokens[:n - 1], [5] * (n - 1), base.arrival_s[:n - 1]), 2, cfg, "trace"),
    ]


@pytest.mark.parametrize("what, primed, req, replicas, cfg, arrival", _variants(), ids=[v[0] for v in _variants()])
def test_the_memo_tells_apart_inputs_that_differ_in_anything_it_reads(what, primed, req, replicas, cfg, arrival):
    # primed with the other inputs on the same model, the asked ones must get their own simulation
    s = _step()
    prime_pool = Pool(s, SimConfig(8, CHUNK, prefix_caching=True), 2)
    D._prefill_pool(prime_pool, primed, *_args(primed), "trace", 0)
    pool = Pool(s, cfg, replicas)
    got = D._prefill_pool(pool, req, *_args(req, arrival), arrival, 0)
    want = D._simulate_prefill_pool(pool, req, *_args(req, arrival), arrival, 0)
    _same(got, want)
    other = D._simulate_prefill_pool(prime_pool, primed, *_args(primed), "trace", 0)[0]
    assert not (len(other) == len(want[0]) and np.array_equal(other, want[0])), \
        f"the {what} must change the answer for this test to mean anything"


class _Unweakable:
    """A step model that cannot be weakly referenced (no __weakref__ slot): the memo cannot key it."""

    __slots__ = ("_m",)

    def __init__(self, m):
        object.__setattr__(self, "_m", m)

    def __getattr__(self, name):
        return getattr(object.__getattribute__(self, "_m"), name)


def test_a_model_the_memo_cannot_key_is_simulated_each_time(counted):
    s = _Unweakable(_step())
    req = _base()
    pool = Pool(s, SimConfig(8, CHUNK), 2)
    want = D._simulate_prefill_pool(pool, req, *_args(req), "trace", 0)
    counted.clear()
    for _ in range(2):
        _same(D._prefill_pool(pool, req, *_args(req), "trace", 0), want)
    assert len(counted) == 2


def test_the_memo_holds_at_most_its_max_entries_per_model(monkeypatch):
    monkeypatch.setattr(D, "_PREFILL_MEMO_MAX", 2)
    s, base = _step(), _base()
    pool = Pool(s, SimConfig(8, CHUNK), 2)
    for k in range(5):                        # five different inputs (the arrivals shifted by k ms)
        req = requests(base.input_tokens, base.output_tokens, base.arrival_s + k * 1e-3)
        _same(D._prefill_pool(pool, req, *_args(req), "trace", 0),
              D._simulate_prefill_pool(pool, req, *_args(req), "trace", 0))
        assert 1 <= len(D._PREFILL_MEMO[s]) <= 2
