"""The replica's scheduling rules (costmodel.replica) against the independent step-by-step reference
of tests/costmodel/test_simulate.py on pools tight enough that preemption happens often, including the cases
where a preempted request would fit again at once: vLLM V1 admits nothing in a step that had to
preempt (its scheduler returns before the waiting queue when it preempted: vllm/v1/core/sched/
scheduler.py), and the victim is the most recently admitted request. Written against the mutants of
costmodel/replica.py the older tests let through and issue 25's deliberate bugs (admitting in a step
that preempted was caught only by two golden hashes)."""

import kvtune.costmodel.replica as replica_mod
import math
import numpy as np
import pytest
from test_simulate import _poisson, _reference, _step
from kvtune.costmodel.simulate import SimConfig, simulate, simulate_replica
from kvtune.costmodel.requests import Requests
from kvtune.costmodel.step import SpecConfig
from kvtune.costmodel.engines import admission_for, scheduling_for
from kvtune.costmodel.engines.policies import RESERVE_RATIO_INIT
from kvtune.costmodel.replica import Replica, ReplicaInputs

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


# costmodel.replica on what the full mutation run of the module (bench/bench_mutation.py) found
# untested. Each test runs the replica on a step model that records every step it is asked to time
# (prompt tokens, attention pairs, cached tokens read), so the scheduler's decisions are read off
# directly and compared with figures derived by hand from the rules the module docstring states.

class _Recorder:
    """Fixed step times (prompt steps P, decode steps D) and a log of every step's arguments."""

    speculation = None
    has_sliding_window = False
    closed_form_ok = False      # every step timed one by one: every step recorded
    request_overhead_s = 0.0
    tokens_per_step = 1.0
    verify_tokens_per_seq = 1
    tp = 1

    def __init__(self, prompt_s=0.1, decode_s=0.01, pool_tokens=1_000_000):
        self.prompt_s, self.decode_s = prompt_s, decode_s
        self.memory = type("Pool", (), {"kv_pool_tokens": pool_tokens})()
        self.calls: list[tuple] = []

    def step_time_s(self, n_dec, ctx_sum, ptoks=0, ppairs=0.0, pkv=0.0) -> float:
        self.calls.append((n_dec, ctx_sum, ptoks, ppairs, pkv))
        return self.prompt_s if ptoks else self.decode_s

    def prompt_steps(self) -> list[tuple]:
        return [c for c in self.calls if c[2]]


def _requests(inp, out, arrivals, prefix=None, group=None) -> Requests:
    n = len(inp)
    return Requests(arrival_s=np.asarray(arrivals, dtype=float), input_tokens=np.asarray(inp, dtype=np.int64),
                    output_tokens=np.asarray(out, dtype=np.int64),
                    prefix_tokens=np.asarray(prefix if prefix is not None else [0] * n, dtype=np.int64),
                    prefix_group=np.asarray(group if group is not None else [-1] * n, dtype=np.int64),
                    ttft_slo_s=np.full(n, np.inf), tpot_slo_s=np.full(n, np.inf), class_idx=np.zeros(n, dtype=np.int64))


@pytest.mark.parametrize("inp", [100, 96, 97])   # a partial last block, exactly 6 blocks, one token past them
def test_a_wholly_cached_prompt_still_computes_its_last_token(inp):
    """A prompt whose every token is in the prefix cache still runs one token through the model:
    the logits of the first output token come from the last prompt position (vLLM V1's
    KVCacheManager.get_computed_blocks caps a hit at prompt length - 1: "When all tokens hit the
    cache, we must recompute the last token to obtain logits"). Request 0 computes the whole
    prompt and caches it; request 1, the same prompt arriving after request 0 is done, computes 1
    token over inp - 1 cached ones: pairs = 1 x (inp - 1) + 1."""
    s = _Recorder()
    req = _requests([inp, inp], [3, 3], [0.0, 10.0], prefix=[inp, inp], group=[0, 0])
    res = simulate(s, req, SimConfig(8, chunk_tokens=4096))
    first, second = s.prompt_steps()
    assert first[2:] == (inp, inp * (inp + 1) / 2, 0)
    assert second[2:] == (1, (inp - 1) + 1.0, inp - 1)
    np.testing.assert_allclose(res.ttft_s, [0.1, 0.1], atol=1e-12)


def test_a_cached_prefix_is_read_not_computed():
    """Request 1 shares request 0's first 64 tokens (its group's prefix, cached once request 0's
    prompt is done): it computes its other 36 prompt tokens after reading the 64, pairs
    36 x 64 + 36 x 37 / 2. Request 2, of no group, computes all of its 100."""
    s = _Recorder()
    req = _requests([100, 100, 100], [2, 2, 2], [0.0, 10.0, 20.0], prefix=[64, 64, 64], group=[0, 0, -1])
    simulate(s, req, SimConfig(8, chunk_tokens=4096))
    assert [c[2:] for c in s.prompt_steps()] == [(100, 100 * 101 / 2, 0), (36, 36 * 64 + 36 * 37 / 2, 64),
                                                  (100, 100 * 101 / 2, 0)]
    s = _Recorder()
    simulate(s, req, SimConfig(8, chunk_tokens=4096, prefix_caching=False))     # caching off: all computed
    assert [c[2:] for c in s.prompt_steps()] == [(100, 100 * 101 / 2, 0)] * 3


def _decode_replica(step, req, cap, pool_tokens, chunk=4096):
    """A disaggregated decode replica: every request's prompt KV arrives computed (kv_ready)."""
    return simulate_replica(step, req, SimConfig(cap, chunk_tokens=chunk, kv_pool_tokens=pool_tokens), "trace", None,
                            0, 0.0, naive=False, kv_ready=np.ones(len(req), dtype=bool))


def test_a_decode_replica_counts_the_blocks_of_the_requests_that_joined_with_their_kv():
    """Three requests join a decode replica at t = 0 with their prompts' KV (16-token blocks, a
    pool of 30 blocks, batch cap 3): A (16 prompt tokens, 2 output tokens), B and C (160, 200).
    Each joins the decoding set at admission with its first token (TTFT 0 here). A finishes
    after its one decode step (t = D). B and C hold ceil((160 + j + 1) / 16) blocks each at step
    j: 2 x 16 > 30 first at j = 80 (context 240), so C, the newest, is preempted there after 80
    steps, and B runs on to its 199th step (t = 199 D). C, back at the head of the queue with 240
    tokens to recompute (15 blocks), fits only once B is gone: a prompt step P at t = 199 D, then
    its 199 - 80 = 119 remaining decode steps: done at 318 D + P."""
    P, D = 0.1, 0.01
    s = _Recorder(P, D)
    req = _requests([16, 160, 160], [2, 200, 200], [0.0, 0.0, 0.0])
    res = _decode_replica(s, req, cap=3, pool_tokens=30 * 16)
    assert res.preemptions == 1
    np.testing.assert_allclose(res.ttft_s, [0.0, 0.0, 0.0], atol=1e-12)
    np.testing.assert_allclose(res.e2e_s, [D, 199 * D, 318 * D + P], rtol=1e-9)
    assert [c[2] for c in s.prompt_steps()] == [240]      # only C's recompute carries prompt tokens


def test_one_token_outputs_that_join_with_their_kv_finish_at_admission():
    """A request with one output token whose KV arrives computed is done when admitted: its first
    token came with the KV and nothing is left to decode (no decode step runs for it). Four such
    requests and a fifth with 3 output tokens (2 decode steps), all at t = 0 and then again at
    t = 1 s: every one-token request finishes at its arrival, the fifth 2 D after it, and the
    replica runs exactly those 2 + 2 decode steps."""
    P, D = 0.1, 0.01
    s = _Recorder(P, D)
    req = _requests([100] * 10, [1, 1, 1, 1, 3] * 2, [0.0] * 5 + [1.0] * 5)
    res = _decode_replica(s, req, cap=8, pool_tokens=10_000)
    np.testing.assert_allclose(res.ttft_s, 0.0, atol=1e-12)
    np.testing.assert_allclose(res.e2e_s, [0.0] * 4 + [2 * D] + [0.0] * 4 + [2 * D], atol=1e-12)
    assert len(s.calls) == 4 and not s.prompt_steps()
    assert res.preemptions == 0 and res.rejected == 0


def test_preempting_a_joined_request_frees_all_its_blocks():
    """A request that joined with its KV borrows no prefix-cache block, so preempting it frees every
    block it holds. A pool of 10 blocks of 16 tokens; X (141 prompt tokens, 10 output tokens) and Y
    (4, 8) join at t = 0 with 9 + 1 blocks. At step 3 X's context reaches 144 (10 blocks, 11 in
    all): Y, the newest, is preempted and frees its 1 block, exactly enough, so X runs on alone
    (one preemption) to its 9th step (t = 9 D). Y recomputes its 7 tokens then (a prompt step P)
    and decodes its 7 - 3 = 4 remaining steps: done at 13 D + P."""
    P, D = 0.1, 0.01
    s = _Recorder(P, D)
    res = _decode_replica(s, _requests([141, 4], [10, 8], [0.0, 0.0]), cap=4, pool_tokens=10 * 16)
    assert res.preemptions == 1
    np.testing.assert_allclose(res.e2e_s, [9 * D, 13 * D + P], rtol=1e-9)
    assert [c[2] for c in s.prompt_steps()] == [7]


def test_preemption_goes_on_until_the_step_fits():
    """Preemption frees the newest running request's blocks until the step fits, however many that
    takes. Four requests B1..B4 (160 prompt tokens, 40 output tokens) and a small S (4, 30) join a
    decode replica of 46 blocks at t = 0 (4 x 10 + 1 blocks). At step 16 every B crosses into its
    12th block (context 176) while S holds 2 (context 20): 50 > 46. S, the newest, frees 2 (48,
    still too many), then B4 frees 12: two preemptions. B1..B3 finish at step 39 (t = 39 D); B4
    (176 tokens to recompute, 11 blocks) could not fit before, and S queues behind it (FCFS); both
    recompute in one prompt step P, then decode their 23 and 13 remaining steps."""
    P, D = 0.1, 0.01
    s = _Recorder(P, D)
    res = _decode_replica(s, _requests([160] * 4 + [4], [40] * 4 + [30], [0.0] * 5), cap=8, pool_tokens=46 * 16)
    assert res.preemptions == 2
    np.testing.assert_allclose(res.e2e_s, [39 * D] * 3 + [62 * D + P, 52 * D + P], rtol=1e-9)
    assert [c[2] for c in s.prompt_steps()] == [176 + 20]


def test_small_chunks_on_a_tight_pool_match_the_step_by_step_reference():
    """As tests/costmodel/test_replica.py, with 128-token chunks: a preempted request's recompute
    spans several steps, and it may be preempted again before it decodes (8 preemptions here)."""
    s = _step(util=0.222)
    req = _poisson(60, 20.0, inp=(200, 900), out=(20, 300), seed=0)
    res = simulate(s, req, SimConfig(64, chunk_tokens=128, prefix_caching=False))
    ttft, e2e, preemptions = _reference(s, req, 64, 128)
    assert preemptions == 8 and res.preemptions == preemptions
    np.testing.assert_allclose(res.ttft_s, ttft, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(res.e2e_s, e2e, rtol=1e-9, atol=1e-9)


def test_a_victim_frees_the_blocks_its_context_and_next_token_fill():
    """A victim with c tokens cached frees ceil((c + 1) / 16) blocks (its context and the slot of
    the token being computed), exactly the count it held. A pool of 10 blocks; X (132 prompt
    tokens, 20 output tokens) and Y (4, 30) join at t = 0 with 9 + 1 blocks. At step 12 X crosses
    into its 10th block and Y, at context 16, into its 2nd: 12 > 10. Y frees its 2 blocks, exactly
    enough (one preemption); X finishes at step 19 (t = 19 D); Y recomputes its 16 tokens then
    (a prompt step P) and decodes its 29 - 12 = 17 remaining steps."""
    P, D = 0.1, 0.01
    s = _Recorder(P, D)
    res = _decode_replica(s, _requests([132, 4], [20, 30], [0.0, 0.0]), cap=4, pool_tokens=10 * 16)
    assert res.preemptions == 1
    np.testing.assert_allclose(res.e2e_s, [19 * D, 36 * D + P], rtol=1e-9)
    assert [c[2] for c in s.prompt_steps()] == [16]


def test_a_victim_on_a_block_boundary_frees_only_what_it_holds():
    """Y (4 prompt tokens) reaches context 15 at step 11: 1 block (16 slots with the token being
    computed), no more. X1 and X2 (117, 20) cross into their 9th block at that step: 19 blocks in
    a pool of 17. Y frees 1 (18, too many), then X2 frees 9: two preemptions. X2, at the head of
    the queue, fits again beside X1 the next step (9 + 8 = 17) and recomputes its 128 tokens in
    the step that decodes X1 (context 129): the 13th step."""
    s = _Recorder(0.1, 0.01)
    res = _decode_replica(s, _requests([117, 117, 4], [20, 20, 30], [0.0] * 3), cap=4, pool_tokens=17 * 16)
    assert res.preemptions >= 2
    assert s.calls[11][:3] == (1, 117 + 11, 0)               # the step that preempted: X1 alone decodes
    assert s.calls[12] == (1, 117 + 12, 128, 128 * 129 / 2, 0)


def test_a_request_alone_beside_pinned_prefixes_restarts_with_nothing_decoding():
    """A (80 prompt tokens, the first 64 its group's prefix; 40 output tokens) runs alone in a pool
    of 10 blocks of 16. Its prompt step (P) caches the prefix: 4 pinned blocks beside A's 6. A's
    context reaches 96 at its 16th decode step (the 17th step): 7 + 4 = 11 blocks. A is preempted,
    the engine is empty, so it drops the prefix cache and takes A back at once (vLLM frees cached
    blocks for a request that needs them): a prompt step recomputing 96 tokens with nothing
    decoding (no context beside it), after which the prefix does not fit to be cached again (4 +
    7 > 10); then A's 39 - 16 = 23 remaining decode steps from context 96."""
    P, D = 0.1, 0.01
    s = _Recorder(P, D)
    req = _requests([80], [40], [0.0], prefix=[64], group=[0])
    res = simulate(s, req, SimConfig(8, chunk_tokens=4096, kv_pool_tokens=10 * 16))
    assert res.preemptions == 1
    assert s.calls[0] == (0, 0.0, 80, 80 * 81 / 2, 0)
    assert [c[:3] for c in s.calls[1:17]] == [(1, 80.0 + j, 0) for j in range(16)]
    assert s.calls[17] == (0, 0.0, 96, 96 * 97 / 2, 0)
    assert [c[:3] for c in s.calls[18:]] == [(1, 96.0 + j, 0) for j in range(23)]
    np.testing.assert_allclose(res.e2e_s, [2 * P + 39 * D], rtol=1e-9)


def test_a_victim_that_borrowed_prefix_blocks_frees_only_its_own():
    """Preempting a request frees its own blocks, not the prefix-cache blocks it borrowed. A pool of
    15 blocks of 16: A (group 0: its first 64 tokens shared) and C (no group), 71 prompt tokens
    each, are computed in one step (P), A's prefix is then pinned (4 blocks). B (group 0, 65
    tokens) arrives during that step and is admitted the next: it reads the 64 cached tokens,
    computes 1 and holds 5 - 4 = 1 block of its own: 5 + 5 + 1 + 4 = 15. At step 10 A and C cross
    into their 6th block (context 80): 17 > 15. B, the newest, frees its 1 (16, too many), then C
    frees 6: only A decodes in that step. Before it, steps 2..9 decode all three, contexts
    2 (71 + g - 1) + 65 + g - 2."""
    s = _Recorder(0.1, 0.01)
    req = _requests([71, 71, 65], [40, 40, 40], [0.0, 0.0, 0.05], prefix=[64, 0, 64], group=[0, -1, 0])
    simulate(s, req, SimConfig(8, chunk_tokens=4096, kv_pool_tokens=15 * 16))
    assert s.calls[0] == (0, 0.0, 142, 2 * 71 * 72 / 2, 0)
    assert s.calls[1] == (2, 142.0, 1, 1 * 64 + 1.0, 64)
    assert [c[:3] for c in s.calls[2:10]] == [(3, 203.0 + 3 * g, 0) for g in range(2, 10)]
    assert s.calls[10][:3] == (1, 80.0, 0)


def test_a_speculating_victim_leaves_the_context_it_reached():
    """With speculation (k = 1, every draft accepted: 2 tokens per verify step, so 40 tokens after
    the first take 20 steps of gain 2), X and Y (100 prompt tokens, 41 output tokens) join a decode
    replica of 14 blocks with 7 each. At step 6 both reach context 112 (8 blocks): 16 > 14, so Y
    is preempted and the decoding set keeps X's context alone: 112 (not 200 + 6 x 4 less anything
    else), growing 2 a step."""
    s = _Recorder(0.1, 0.01)
    s.speculation, s.verify_tokens_per_seq = SpecConfig(1, 1.0), 2
    res = _decode_replica(s, _requests([100, 100], [41, 41], [0.0, 0.0]), cap=4, pool_tokens=14 * 16)
    assert [c[:3] for c in s.calls[:6]] == [(2, 200.0 + 4 * j, 0) for j in range(6)]
    assert [c[:3] for c in s.calls[6:20]] == [(1, 112.0 + 2 * j, 0) for j in range(14)]
    assert res.preemptions == 1


def test_a_slot_freed_by_preemption_lends_no_prefix_blocks():
    """A slot a preempted request leaves borrows nothing any more, even while a higher slot is in use.
    A pool of 18 blocks of 16. E (16 prompt tokens, 3 output tokens), A (71, the first 64 its group's
    prefix) and C (71), 60 output tokens each, are computed in one step; A's prefix is pinned (4
    blocks); they take slots 0, 1, 2. E finishes at step 3 and frees slot 0; B (group 0, 65 tokens)
    arrives meanwhile, reads the cached 64 and computes 1 token in step 3 (beside A and C): slot 0,
    holding 5 - 4 = 1 block of its own. Steps 4..25 decode all three (contexts 2 (70 + g) + 61 + g).
    At step 26 A and C reach 7 blocks, B 6 (2 of its own): 20 > 18, so B is preempted (18 left).
    B needs 2 blocks to come back: A and C's 14 and the 4 pinned leave none, so they decode alone
    until step 42, where they reach 8 blocks each (20 > 18) and C, the newest, is preempted."""
    s = _Recorder(0.1, 0.01)
    req = _requests([16, 71, 71, 65], [3, 60, 60, 60], [0.0, 0.0, 0.0, 0.1 + 0.015], prefix=[0, 64, 0, 64],
                    group=[-1, 0, -1, 0])
    res = simulate(s, req, SimConfig(8, chunk_tokens=4096, kv_pool_tokens=18 * 16))
    assert s.calls[0][:3] == (0, 0.0, 158)
    assert s.calls[3][:3] == (2, 146.0, 1)
    assert [c[:3] for c in s.calls[4:26]] == [(3, 201.0 + 3 * g, 0) for g in range(4, 26)]
    assert [c[:3] for c in s.calls[26:42]] == [(2, 2 * (70.0 + g), 0) for g in range(26, 42)]
    assert s.calls[42][:3] == (1, 112.0, 0)
    assert res.preemptions >= 2


# costmodel.replica at the edges the full mutation run (bench/mutation-runs/mut4-replica-x3-0715.json) found
# untested: a one-token prompt budget, a rejected request in the middle of the queue, the prefix-cache pin decision
# at its exact limit, the watermark, an empty engine's admission, fractional block counts, and the helpers' own
# contracts (the chunk-run length, the block bound, the cached step fractions). Each scenario runs on the step model
# of tests/costmodel/test_replica.py, which records every step it is asked to time, and every expected value is
# derived by hand from the rules in costmodel/replica.py's docstrings (16-token blocks throughout: a prompt of p
# tokens needs ceil(p / 16) blocks, a decoding sequence with c tokens cached holds ceil((c + 1) / 16)).

P, D = 0.1, 0.01   # the recorder's prompt-step and decode-step times (s)


def _prompts(s: _Recorder) -> list[tuple]:
    """Each step that carried prompt tokens: (prompt tokens, cached tokens read)."""
    return [(c[2], c[4]) for c in s.prompt_steps()]


# ---- the prompt budget ------------------------------------------------------------------------------------------

def test_the_last_token_of_the_budget_starts_the_next_prompt():
    """A budget of 101 prompt tokens a step. X (201 tokens) takes 101 in step 1 and its last 100 in step 2,
    which leaves 1 token: Y (50 tokens), waiting behind it, starts with that 1 token in step 2 and computes
    its other 49 in step 3 (X then decodes beside it: 101 - 1 = 100 tokens of budget)."""
    s = _Recorder(P, D)
    res = simulate(s, _requests([201, 50], [2, 2], [0.0, 0.0]), SimConfig(8, chunk_tokens=101))
    assert [c[2] for c in s.prompt_steps()] == [101, 100 + 1, 49]
    assert s.calls[1][4] == 101 + 0                        # step 2 reads X's 101 computed tokens, Y's none
    np.testing.assert_allclose(res.ttft_s, [2 * P, 3 * P], rtol=1e-12)


def test_a_one_token_budget_beside_the_decodes_still_computes_a_prompt_token():
    """The budget counts one token per decoding sequence (vLLM V1). Three requests join a decode replica with
    their KV at t = 0 and a fourth, Y (5 prompt tokens), must compute its prompt; chunk_tokens 4. Step 1 starts
    with nothing decoding: Y gets all 4 tokens (the three join beside it). Step 2 has 3 decodes: 4 - 3 = 1 token
    of budget, Y's last. Y's first token comes after 2 prompt steps; its one decode step is step 3. The three
    decode 19 steps each: steps 1 and 2 (prompt steps, P) and 17 more (D)."""
    s = _Recorder(P, D)
    req = _requests([100, 100, 100, 5], [20, 20, 20, 2], [0.0] * 4)
    res = simulate_replica(s, req, SimConfig(8, chunk_tokens=4, kv_pool_tokens=10_000), "trace", None, 0, 0.0,
                           naive=False, kv_ready=np.array([True, True, True, False]))
    assert [c[2] for c in s.prompt_steps()] == [4, 1]
    np.testing.assert_allclose(res.ttft_s, [0.0, 0.0, 0.0, 2 * P], atol=1e-12)
    np.testing.assert_allclose(res.e2e_s, [2 * P + 17 * D] * 3 + [2 * P + D], rtol=1e-9)


def test_a_rejected_request_in_the_queue_does_not_stop_the_admissions_behind_it():
    """A pool of 20 blocks. R (1000 prompt tokens) can never fit and is rejected; A and B (16 tokens each)
    around it in the queue are both admitted in the first step: one prompt step of 32 tokens."""
    s = _Recorder(P, D)
    res = simulate(s, _requests([16, 1000, 16], [2, 2, 2], [0.0, 0.0, 0.0]),
                   SimConfig(8, chunk_tokens=4096, kv_pool_tokens=20 * 16))
    assert res.rejected == 1
    assert [c[2] for c in s.prompt_steps()] == [32]


def test_a_two_token_output_decodes_once():
    """Two output tokens: the first comes with the prompt step, the second after one decode step."""
    s = _Recorder(P, D)
    res = simulate(s, _requests([16], [2], [0.0]), SimConfig(8, chunk_tokens=4096))
    np.testing.assert_allclose(res.e2e_s, [P + D], rtol=1e-12)
    assert len(s.calls) == 2


def test_a_one_token_output_that_finishes_at_its_prompt_step_does_not_hold_back_the_prompt_after_it():
    """O (16 tokens, 1 output token) and B (16 tokens, 3 output tokens) are computed in one step; O is done
    there, and B's prompt completes in the same step (one prompt step, then B's 2 decode steps)."""
    s = _Recorder(P, D)
    res = simulate(s, _requests([16, 16], [1, 3], [0.0, 0.0]), SimConfig(8, chunk_tokens=4096))
    assert [c[2] for c in s.prompt_steps()] == [32]
    np.testing.assert_allclose(res.e2e_s, [P, P + 2 * D], rtol=1e-12)


def test_the_scheduler_counts_its_loop_turns():
    """``events`` counts the loop's turns. A (16 tokens, 3 output tokens), one step at a time (the recorder
    has no closed form): its prompt step and 2 decode steps are 3 turns; the idle engine then jumps to R's
    arrival (a 4th turn) and R, which can never fit the pool, is rejected in the 5th, which ends the run."""
    s = _Recorder(P, D)
    res = simulate(s, _requests([16, 1000], [3, 2], [0.0, 5.0]), SimConfig(8, chunk_tokens=4096,
                                                                             kv_pool_tokens=20 * 16))
    assert res.rejected == 1
    assert res.events == 5


# ---- the prefix cache: the pin decision at its limit ------------------------------------------------------------
#
# A request whose prompt completes pins its group's prefix (ceil(prefix / 16) blocks) when, after it, the pool
# still holds the decoding sequences' bound (sum of (c + 1) / 16 + 1 each, less the blocks they borrow), the
# prompts still computing, the pinned prefixes, the new prefix and the request's own ceil((d + 1) / 16). A later
# request of the group then reads the prefix: its prompt step computes inp - prefix tokens after reading prefix.

def test_a_prefix_is_pinned_when_it_fits_exactly():
    """A (79 prompt tokens, 64 of them its group's prefix, 1 output token) alone in a pool of 9 blocks: 4 + 5 =
    9 <= 9, so the prefix is pinned; C (the same prompt, 10 s later) computes 15 tokens after reading 64."""
    s = _Recorder(P, D)
    simulate(s, _requests([79, 79], [1, 1], [0.0, 10.0], prefix=[64, 64], group=[0, 0]),
             SimConfig(8, chunk_tokens=4096, kv_pool_tokens=9 * 16))
    assert _prompts(s) == [(79, 0), (15, 64)]


@pytest.mark.parametrize("pool_blocks, pinned", [(12, False), (13, True)])
def test_the_pin_decision_counts_the_decoding_bound_and_whole_blocks(pool_blocks, pinned):
    """B (7 prompt tokens, no group) and A (80, the first 65 its group's prefix, 1 output token) complete in
    one step; B decodes on beside A's decision: bound (7 + 1) / 16 + 1 = 1.5, prefix ceil(65 / 16) = 5 blocks,
    A's own ceil(81 / 16) = 6: 12.5 blocks. A pool of 12 does not pin the prefix, and C (A's prompt, at t = 10 s)
    computes all 80; a pool of 13 pins it, and C reads 65 and computes 15."""
    s = _Recorder(P, D)
    simulate(s, _requests([7, 80, 80], [3, 1, 1], [0.0, 0.0, 10.0], prefix=[0, 65, 65], group=[-1, 0, 0]),
             SimConfig(8, chunk_tokens=4096, kv_pool_tokens=pool_blocks * 16))
    assert _prompts(s)[0] == (87, 0)
    assert _prompts(s)[1] == ((15, 65) if pinned else (80, 0))


# Z (40 tokens, the first 32 group 1's prefix, 1 output token) pins 2 blocks at t = 0. At t = 1 s, B (group 1,
# b tokens, 10 output tokens) reads Z's 32 cached tokens (borrowing 2 blocks) and A (79 tokens, the first 64
# group 0's prefix, 1 output token) computes its whole prompt in the same step; B completes first and decodes
# beside A's decision: bound (b + 1) / 16 + 1 - 2, plus 2 pinned, 4 for the new prefix, ceil(80 / 16) = 5 for A.
# C (group 0, like A) comes at t = 10 s: it reads 64 if A's prefix was pinned. D (128 tokens, no group, 8 blocks)
# comes at t = 20 s: beside 6 pinned blocks it does not fit a pool of 12 or 13, so the empty engine drops the
# prefix cache; E (like A) at t = 30 s then computes its whole prompt again.
_PIN_CASES = [
    # pool, b, A's decision: bound + 2 + 4 + 5 blocks
    (13, 40, True),     # (41 / 16 + 1 - 2) + 11 = 12.5625 <= 13
    (12, 40, False),    # 12.5625 > 12
    (13, 48, False),    # (49 / 16 + 1 - 2) + 11 = 13.0625 > 13
]


@pytest.mark.parametrize("pool_blocks, b, pinned", _PIN_CASES)
def test_the_pin_decision_counts_borrowed_and_pinned_blocks(pool_blocks, b, pinned):
    s = _Recorder(P, D)
    req = _requests([40, b, 79, 79, 128, 79], [1, 10, 1, 1, 1, 1], [0.0, 1.0, 1.0, 10.0, 20.0, 30.0],
                    prefix=[32, 32, 64, 64, 0, 64], group=[1, 1, 0, 0, -1, 0])
    simulate(s, req, SimConfig(8, chunk_tokens=4096, kv_pool_tokens=pool_blocks * 16))
    c_step = (15, 64) if pinned else (79, 0)     # C: A's prefix pinned, or C computes (and pins) it
    assert _prompts(s) == [(40, 0), (b - 32 + 79, 32), c_step, (128, 0), (79, 0)]


def test_the_pin_decision_counts_two_borrowing_decoders():
    """As above with two B's (40 tokens each, group 1): both borrow 2 blocks, so A's decision sees the bound
    (80 + 2) / 16 + 2 - 4 = 3.125, + 2 pinned + 4 + 5 = 14.125 <= 15: pinned; C reads 64."""
    s = _Recorder(P, D)
    req = _requests([40, 40, 40, 79, 79], [1, 10, 10, 1, 1], [0.0, 1.0, 1.0, 1.0, 10.0],
                    prefix=[32, 32, 32, 64, 64], group=[1, 1, 1, 0, 0])
    simulate(s, req, SimConfig(8, chunk_tokens=4096, kv_pool_tokens=15 * 16))
    assert _prompts(s) == [(40, 0), (8 + 8 + 79, 64), (15, 64)]


def test_the_pin_decision_counts_the_prompts_still_computing():
    """B (7 tokens), A (79, the first 64 group 0's prefix, 1 output token) and E (40 tokens) with a budget of 96:
    B and A complete in step 1 and E computes 10 of its 40 (3 blocks held). A's decision: 1.5 + 3 + 4 + 5 = 13.5
    > 13, not pinned; E's other 30 tokens in step 2 (reading its first 10); C (A's prompt, t = 10 s) computes all
    79."""
    s = _Recorder(P, D)
    req = _requests([7, 79, 40, 79], [3, 1, 1, 1], [0.0, 0.0, 0.0, 10.0], prefix=[0, 64, 0, 64],
                    group=[-1, 0, -1, 0])
    simulate(s, req, SimConfig(8, chunk_tokens=96, kv_pool_tokens=13 * 16))
    assert _prompts(s) == [(96, 0), (30, 10), (79, 0)]


def test_a_one_token_output_finished_at_its_prompt_step_holds_no_blocks_at_the_pin_decision():
    """O (16 tokens, 1 output token) is done in the step where A (79, the first 64 group 0's prefix) completes:
    A's decision sees nothing decoding, 4 + 5 = 9 <= 9: pinned, and C reads the prefix."""
    s = _Recorder(P, D)
    req = _requests([16, 79, 79], [1, 1, 1], [0.0, 0.0, 10.0], prefix=[0, 64, 64], group=[-1, 0, 0])
    simulate(s, req, SimConfig(8, chunk_tokens=4096, kv_pool_tokens=9 * 16))
    assert _prompts(s) == [(95, 0), (15, 64)]


@pytest.mark.parametrize("prefixes, second", [
    ([1, 1], (19, 1)),       # a one-token prefix is cached as any other: the second reads it
    ([0, 64], (100, 0)),     # the first shares nothing: nothing is cached for the group, the second computes all
])
def test_a_group_caches_exactly_the_prefix_its_first_request_shares(prefixes, second):
    s = _Recorder(P, D)
    inp = 20 if prefixes[0] == 1 else 100
    simulate(s, _requests([inp, inp], [1, 1], [0.0, 10.0], prefix=prefixes, group=[0, 0]),
             SimConfig(8, chunk_tokens=4096))
    assert _prompts(s) == [(inp, 0), second]


def test_a_prefill_only_step_reads_the_cached_prefix():
    """SGLang's default scheduling (prefill_first): a prompt step runs without the decodes, and it still reads
    the cached prefix: C computes 15 tokens over the 64 A cached (pairs 15 x 64 + 15 x 16 / 2)."""
    s = _Recorder(P, D)
    simulate(s, _requests([79, 79], [1, 1], [0.0, 10.0], prefix=[64, 64], group=[0, 0]),
             SimConfig(8, chunk_tokens=4096, prefill_first=True))
    assert s.prompt_steps()[1] == (0, 0.0, 15, 15 * 64 + 15 * 16 / 2, 64)


def test_a_request_that_read_a_partial_prefix_block_owns_that_block():
    """A (80 tokens, the first 65 group 0's prefix, 1 output token) pins ceil(65 / 16) = 5 blocks in a pool of
    11 (5 + 6 <= 11). C (the same prompt, 90 output tokens) reads the 65 tokens but borrows only the 4 whole
    blocks: it holds ceil((c + 1) / 16) - 4 of its own. Beside the 5 pinned, that passes 11 first at c = 160
    (80 decode steps): C is preempted, the engine is empty, drops the prefix cache and recomputes C's 160 tokens
    at once; C's last 9 steps reach 169 tokens (11 blocks): no second preemption."""
    s = _Recorder(P, D)
    res = simulate(s, _requests([80, 80], [1, 90], [0.0, 10.0], prefix=[65, 65], group=[0, 0]),
                   SimConfig(8, chunk_tokens=4096, kv_pool_tokens=11 * 16))
    assert res.preemptions == 1
    assert _prompts(s) == [(80, 0), (15, 65), (160, 0)]


def test_dropping_the_prefix_cache_for_an_empty_engine_frees_every_pinned_block():
    """A (80 tokens, the first 64 group 0's prefix, 1 output token) pins 4 blocks in a pool of 10 (4 + 6).
    D (112 tokens, 40 output tokens) needs 7 beside them: the empty engine drops the cache and admits it. D
    then decodes to 151 tokens (10 blocks, the whole pool): never preempted."""
    s = _Recorder(P, D)
    res = simulate(s, _requests([80, 112], [1, 40], [0.0, 10.0], prefix=[64, 0], group=[0, -1]),
                   SimConfig(8, chunk_tokens=4096, kv_pool_tokens=10 * 16))
    assert res.preemptions == 0
    assert _prompts(s) == [(80, 0), (112, 0)]
    np.testing.assert_allclose(res.e2e_s, [P, P + 39 * D], rtol=1e-9)


# ---- admission limits --------------------------------------------------------------------------------------------

def test_the_watermark_holds_back_part_of_the_pool():
    """A pool of 100 blocks with a 10% watermark admits up to 90. A (800 tokens, 50 blocks) and B (720, 45)
    do not fit together (95 > 90): B waits until A (2 output tokens) is done after its decode step."""
    s = _Recorder(P, D)
    res = simulate(s, _requests([800, 720], [2, 2], [0.0, 0.0]),
                   SimConfig(8, chunk_tokens=4096, kv_pool_tokens=100 * 16, watermark_frac=0.1))
    assert [c[2] for c in s.prompt_steps()] == [800, 720]
    np.testing.assert_allclose(res.ttft_s, [P, 2 * P + D], rtol=1e-9)


@pytest.mark.parametrize("output_reserve", [False, True])
def test_an_empty_engine_takes_a_head_that_fills_the_pool(output_reserve):
    """A request whose prompt and output just fit the pool (17 + 14 + 1 = 32 tokens, 2 blocks of a 2-block pool)
    is served alone whatever the admission policy's reserve for its output (an empty engine takes the head):
    a prompt step, then 13 decode steps."""
    s = _Recorder(P, D)
    res = simulate(s, _requests([17], [14], [0.0]),
                   SimConfig(8, chunk_tokens=4096, kv_pool_tokens=2 * 16, output_reserve=output_reserve))
    assert res.rejected == 0
    np.testing.assert_allclose(res.e2e_s, [P + 13 * D], rtol=1e-9)


def test_requests_joining_with_their_kv_count_their_whole_prompts_at_admission():
    """Three requests of 160 prompt tokens (10 blocks each, 5 output tokens) reach a decode replica of 29
    blocks with their KV. A and B join (20 blocks counted; they hold 11 each once decoding); C would make 30 >
    29 and waits: the exact count, 22 + 10 = 32, agrees. A and B finish after 4 decode steps, then C joins and
    decodes its 4: no preemption, no prompt recomputed."""
    s = _Recorder(P, D)
    res = _decode_replica(s, _requests([160] * 3, [5] * 3, [0.0] * 3), cap=8, pool_tokens=29 * 16)
    assert res.preemptions == 0 and not s.prompt_steps()
    np.testing.assert_allclose(res.ttft_s, [0.0, 0.0, 4 * D], atol=1e-12)
    np.testing.assert_allclose(res.e2e_s, [4 * D, 4 * D, 8 * D], rtol=1e-9)


def test_a_speculating_victim_recomputes_the_context_it_reached():
    """As tests/costmodel/test_replica.py::test_a_speculating_victim_leaves_the_context_it_reached: Y, preempted
    after 6 verify steps of 2 tokens, comes back once X is done (step 20) and recomputes 100 + 6 x 2 = 112."""
    s = _Recorder(P, D)
    s.speculation, s.verify_tokens_per_seq = SpecConfig(1, 1.0), 2
    res = _decode_replica(s, _requests([100, 100], [41, 41], [0.0, 0.0]), cap=4, pool_tokens=14 * 16)
    assert res.preemptions == 1
    assert [c[2] for c in s.prompt_steps()] == [112]


# ---- the helpers' contracts ----------------------------------------------------------------------------------------

def _replica(step, n=4, cap=4, total_blocks=1000, output_reserve=False, out=50, kv_ready=None) -> Replica:
    x = ReplicaInputs(inp=[100] * n, out=[out] * n, pre=[0] * n, grp=[-1] * n, arr=[0.0] * n, nsteps=[out - 1] * n,
                      gain=[1.0] * n, rejected=[False] * n, n_trace=n, clients=0, all_at_once=False, kv_ready=kv_ready)
    return Replica(step, x, batch_cap=cap, chunk_tokens=4096, block_tokens=16, prefix_caching=True,
                   total_blocks=total_blocks, watermark_blocks=0, scheduling=scheduling_for(False),
                   admission=admission_for(output_reserve), naive=False)


def _decoding(r: Replica, contexts) -> None:
    for i, c in enumerate(contexts):
        r.running[i] = None
        r._join_decode(i, c)


@pytest.mark.parametrize("target, c, m", [(31, 10, 3), (1, 1, 1), (2, 1, 1), (40, 10, 3)])
def test_a_chunk_run_ends_before_the_prompts_last_chunk(target, c, m):
    """Nothing decoding: the run repeats the step's shape (c tokens of the prompt) until the step that carries
    the prompt's last chunk: 31 tokens in chunks of 10 are 3 runs of 10 then 1; 40 are 3 runs then the last 10;
    a prompt whose only chunk is its last runs 1 step."""
    r = _replica(_Recorder())
    r.pf_target[0], r.pf_done[0] = target, 0
    assert r._chunk_run_length((0, c)) == m


@pytest.mark.parametrize("contexts, shared, alloc, pinned, total, m", [
    # bound at step j: (sum c + j G + n) / 16 + n - shared + alloc + pinned <= total
    ([100], 0, 5, 0, 20, 124),           # (101 + j) / 16 + 6 <= 20: j <= 123
    ([100, 100], 1, 3, 2, 30, 92),       # (202 + 2 j) / 16 + 2 - 1 + 3 + 2 <= 30: j <= 91
])
def test_a_chunk_run_stops_at_the_block_bound(contexts, shared, alloc, pinned, total, m):
    r = _replica(_Recorder(), total_blocks=total, out=5000)
    _decoding(r, contexts)
    r.shared_dec, r.alloc_pf, r.pinned = shared, alloc, pinned
    r.pf_target[3], r.pf_done[3] = 100_000, 0
    assert r._chunk_run_length((3, 10)) == m


def test_the_used_block_bound_is_an_upper_bound():
    """Two sequences at 160 tokens hold ceil(161 / 16) = 11 blocks each: the bound (322 / 16 + 2 = 22.125)
    is not below the exact 22; with nothing decoding both are 0."""
    r = _replica(_Recorder())
    assert r.dec_blocks(0) == 0 and r._used_bound() == 0
    _decoding(r, [160, 160])
    assert r.dec_blocks(0) == 22
    assert r._used_bound() >= 22


def test_the_step_fractions_are_built_once_and_read_only():
    replica_mod._STEPS_OVER.clear()       # a cold cache: the values are computed here, not found
    j = replica_mod._steps_over(7, 6)
    np.testing.assert_array_equal(j, np.arange(7) / 6)
    assert not j.flags.writeable
    assert replica_mod._steps_over(7, 6) is j


def test_a_chunk_run_sums_the_steps_it_stands_for():
    """``_chunk_run`` over m steps of one prompt chunk of c tokens beside one decoding sequence equals the sum
    of the m steps timed one by one (the step model's step_time_s), with a cold step-fraction cache."""
    step = _step()
    replica_mod._STEPS_OVER.clear()
    r = _replica(step, out=5000)
    _decoding(r, [500])
    c, m, d0 = 64, 9, 128
    r.pf_target[3], r.pf_done[3] = 10_000, d0
    t0 = r.t
    r._chunk_run((3, c), m)
    want = sum(step.step_time_s(1, 500.0 + j, c, c * (d0 + j * c) + c * (c + 1) / 2, d0 + j * c) for j in range(m))
    assert math.isclose(r.t - t0, want, rel_tol=1e-9)
    assert r.pf_done[3] == d0 + m * c and r.gstep == m


def test_the_output_reserve_starts_at_its_initial_ratio():
    """SGLang's new_token_ratio starts at 0.7 on a fresh replica: one prompt computing with 99 output tokens
    to go holds back 0.7 x 99 / 16 blocks."""
    r = _replica(_Recorder(), output_reserve=True, out=100)
    r.prefilling.append(0)
    assert math.isclose(r.admission.running_reserve(r), RESERVE_RATIO_INIT * 99 / 16, rel_tol=1e-12)


@pytest.mark.parametrize("kv", [False, True])
def test_a_decoding_slot_holds_its_finish_step(kv):
    """The slot array sF holds the step at which the sequence in the slot finishes (SGLang's output reserve
    reads it: the tokens a running request has left). One request of 5 output tokens: computed here, its
    prompt step is step 1 and it finishes after 4 decode steps at step 5; joining with its KV at step 0, it
    finishes at step 4. A finished slot keeps that value (only its context, gain and borrowed blocks are
    cleared), and the reserve it held at the start was 0.7 x its 4 tokens to go."""
    if kv:
        r = _replica(_Recorder(P, D), n=1, output_reserve=True, out=5)
        _decoding(r, [100])
        assert math.isclose(r.admission.running_reserve(r), RESERVE_RATIO_INIT * 4 / 16, rel_tol=1e-12)
    r = _replica(_Recorder(P, D), n=1, output_reserve=True, out=5, kv_ready=[True] if kv else None)
    r.run()
    assert r.gstep == (4 if kv else 5)
    assert r.sF[0] == r.gstep


# ---- pure decode runs that stop for an arrival ---------------------------------------------------------------------

def _arrival_during_decodes(offsets_s, n=32):
    """n requests (1000 prompt tokens, 1001 output tokens) at t = 0 on the real step model, and one more (500,
    20) arriving at each given time: the simulation in closed form (decode runs summed by the clock, stopped by
    the arrival) and one step at a time (naive), with the results of both."""
    s = _step()
    cfg = SimConfig(256, chunk_tokens=8192)
    first_done = simulate_replica(s, _requests([1000] * n, [1001] * n, [0.0] * n), cfg, "trace", None, 0, 0.0,
                                  naive=True).e2e_s.min()
    for off in offsets_s:
        tau = float(first_done * off if off < 1.5 else first_done + (off - 2.0))
        req = _requests([1000] * n + [500], [1001] * n + [20], [0.0] * n + [tau])
        yield (simulate_replica(s, req, cfg, "trace", None, 0, 0.0, naive=False),
               simulate_replica(s, req, cfg, "trace", None, 0, 0.0, naive=True))


@pytest.mark.parametrize("n", [32, 160])   # 160 decoding: the clock's step time has two linear pieces
def test_a_decode_run_stops_for_an_arrival_as_the_steps_one_by_one_do(n):
    """A pure decode run is summed in closed form up to the next event; an arrival is one: the run stops after
    the step during which it arrives (the arrival joins the batch at the next boundary, as stepping one step at a
    time finds). Arrivals at 30 %, 60 %, 90 % and 97 % of the way to the first completion, and 0.1 ms and 1 ms
    after it: every request's first-token and finish times agree with the step-by-step run."""
    for closed, naive in _arrival_during_decodes([0.3, 0.6, 0.9, 0.97, 2.0001, 2.001], n):
        assert closed.events < naive.events                   # the closed form did sum runs
        np.testing.assert_allclose(closed.ttft_s, naive.ttft_s, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(closed.e2e_s, naive.e2e_s, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("prompt, out, pool_blocks", [(160, 18, 191), (159, 3, 175)])
def test_a_decode_run_whose_last_step_runs_out_of_blocks_stops_before_it(prompt, out, pool_blocks):
    """16 identical requests decode in lockstep on the real step model (all prompts in one step). With c tokens
    cached each holds ceil((c + 1) / 16) blocks; the run to their common finish (out - 1 decode steps) crosses
    into a new block at its last step: 160 tokens: contexts 160..176, 11 blocks each until context 176 (12),
    16 x 12 = 192 > 191; 159 tokens: contexts 159, 160, 16 x 11 = 176 > 175. So that step does not fit and one
    request, the newest, is preempted there, as stepping one step at a time finds."""
    s = _step()
    n = 16
    req = _requests([prompt] * n, [out] * n, [0.0] * n)
    cfg = SimConfig(n, chunk_tokens=4096, prefix_caching=False, kv_pool_tokens=pool_blocks * 16)
    closed = simulate_replica(s, req, cfg, "trace", None, 0, 0.0, naive=False)
    naive = simulate_replica(s, req, cfg, "trace", None, 0, 0.0, naive=True)
    assert closed.preemptions == naive.preemptions == 1
    np.testing.assert_allclose(closed.e2e_s, naive.e2e_s, rtol=1e-9)


def test_a_decode_run_beside_a_prompt_without_budget_counts_the_prompts_blocks():
    """A decode replica on the real step model: 16 requests join with their KV (160 tokens, 18 output tokens) and
    X (32 prompt tokens) computes its prompt, 16 tokens a step (chunk_tokens 16). Step 1 starts with nothing
    decoding: X gets 16 tokens and holds its 2 blocks; from step 2 the 16 decodes take the whole budget, so X
    waits, part-way, beside a pure decode run. At the run's last step (context 176) the 16 hold 12 blocks each:
    192 + X's 2 = 194 > 193, so the run stops before it and the newest is preempted there, as stepping finds."""
    s = _step()
    n = 16
    req = _requests([160] * n + [32], [18] * n + [2], [0.0] * (n + 1))
    cfg = SimConfig(n + 1, chunk_tokens=16, prefix_caching=False, kv_pool_tokens=193 * 16)
    kv = np.array([True] * n + [False])
    closed = simulate_replica(s, req, cfg, "trace", None, 0, 0.0, naive=False, kv_ready=kv)
    naive = simulate_replica(s, req, cfg, "trace", None, 0, 0.0, naive=True, kv_ready=kv)
    assert closed.preemptions == naive.preemptions == 1
    np.testing.assert_allclose(closed.e2e_s, naive.e2e_s, rtol=1e-9)


@pytest.mark.parametrize("pool_blocks, preempted", [(191, 1), (176, 2)])
def test_a_speculating_decode_run_whose_last_step_runs_out_of_blocks_stops_before_it(pool_blocks, preempted):
    """As above with speculation (k = 1, every draft accepted: 2 tokens a verify step): 16 requests join a decode
    replica with their KV (160 tokens, 19 output tokens: 9 verify steps of 2). At the run's last step their
    context reaches 176 (12 blocks each, 192 > 191) while the step before holds 11 each (174: 176 <= 191).
    Turns (closed form): the joins and one run of the 8 steps that fit; the step that preempts the newest and
    runs the 9th verify step (the other 15 finish); the victim's recompute (160 + 8 x 2 = 176 tokens); its last
    verify step: 4 turns, 11 steps. A pool of 176 blocks is filled exactly by the 8 steps that fit (the run still
    takes them all) and the 9th preempts two (192 - 12 > 176); both recompute in one prompt step: the same turns."""
    s = _step(spec=SpecConfig(1, 1.0))
    n = 16
    req = _requests([160] * n, [19] * n, [0.0] * n)
    cfg = SimConfig(n, chunk_tokens=4096, prefix_caching=False, kv_pool_tokens=pool_blocks * 16)
    kv = np.ones(n, dtype=bool)
    closed = simulate_replica(s, req, cfg, "trace", None, 0, 0.0, naive=False, kv_ready=kv)
    naive = simulate_replica(s, req, cfg, "trace", None, 0, 0.0, naive=True, kv_ready=kv)
    assert closed.preemptions == naive.preemptions == preempted
    np.testing.assert_allclose(closed.e2e_s, naive.e2e_s, rtol=1e-9)
    assert (closed.events, closed.steps) == (4, 11)


def test_a_slot_freed_by_preemption_below_the_top_holds_no_block_with_one_token_blocks():
    """One-token blocks: a sequence with c tokens cached holds c + 1. A decode replica of 53 blocks; A (10
    tokens, 3 output tokens), B and C (10, 40) join with their KV at t = 0 in slots 0, 1, 2. A finishes after
    2 steps; D (20 tokens, 30 output tokens), arriving meanwhile, joins in slot 0 below B and C. At step g
    B and C hold 11 + g each and D 19 + g: 53 at step 4, 56 > 53 at step 5, so D, the newest, is preempted
    (its slot, below the top, holds nothing now) and cannot come back (32 + its 23 > 53). B and C alone pass 53
    at step 16 (2 x 27 = 54): C is preempted there."""
    s = _Recorder(P, D)
    req = _requests([10, 10, 10, 20], [3, 40, 40, 30], [0.0, 0.0, 0.0, 0.015])
    simulate_replica(s, req, SimConfig(4, chunk_tokens=4096, block_tokens=1, kv_pool_tokens=53), "trace", None,
                     0, 0.0, naive=False, kv_ready=np.ones(4, dtype=bool))
    assert [c[0] for c in s.calls[:17]] == [3] * 5 + [2] * 11 + [1]


def test_a_speculating_sequence_that_finishes_takes_its_whole_context_out_of_the_batch():
    """Speculation (k = 1, every draft accepted: 2 tokens a verify step). X (100 prompt tokens, 11 output
    tokens: 5 verify steps) and Y (100, 41) join a decode replica with their KV: steps 0..4 decode both
    (contexts 200 + 4 j); X finishes after step 4 with 110 tokens, so step 5 decodes Y alone at context 110."""
    s = _Recorder(P, D)
    s.speculation, s.verify_tokens_per_seq = SpecConfig(1, 1.0), 2
    _decode_replica(s, _requests([100, 100], [11, 41], [0.0, 0.0]), cap=4, pool_tokens=10_000)
    assert [c[:2] for c in s.calls[:5]] == [(2, 200.0 + 4 * j) for j in range(5)]
    assert [c[:2] for c in s.calls[5:20]] == [(1, 110.0 + 2 * j) for j in range(15)]


def test_a_slot_freed_by_a_completion_below_the_top_holds_no_block_with_one_token_blocks():
    """One-token blocks, a decode replica of 53 blocks: A (10 tokens, 3 output tokens), B and C (10, 40) join
    with their KV at t = 0 in slots 0, 1, 2. A finishes after 2 steps and its slot 0, below B's and C's, stays
    free (holding nothing). B and C hold 11 + g each at step g: 54 > 53 first at step 16, where C is preempted."""
    s = _Recorder(P, D)
    req = _requests([10, 10, 10], [3, 40, 40], [0.0, 0.0, 0.0])
    simulate_replica(s, req, SimConfig(4, chunk_tokens=4096, block_tokens=1, kv_pool_tokens=53), "trace", None,
                     0, 0.0, naive=False, kv_ready=np.ones(3, dtype=bool))
    assert [c[0] for c in s.calls[:17]] == [3] * 2 + [2] * 14 + [1]


# ---- the loop runs once per event ------------------------------------------------------------------------------------
# ``events`` counts the loop's turns: a run of identical steps summed in closed form is one turn (the module
# docstring: pure decode steps up to the next event, a completion, an arrival or block pressure; a prompt's chunks
# up to its last chunk, the next completion or the block bound). On the real step model (closed form on):

def test_a_lone_request_is_a_prompt_step_and_one_decode_run():
    """500 prompt tokens, 200 output tokens, nothing else: the prompt step, then its 199 decode steps in one run."""
    res = simulate(_step(), _requests([500], [200], [0.0]), SimConfig(8))
    assert (res.events, res.steps) == (2, 200)


def test_a_prompt_in_three_chunks_is_a_chunk_run_the_last_chunk_and_one_decode_run():
    """250 prompt tokens with a budget of 100: chunks of 100 and 100 summed as one run (they repeat a shape), the
    last chunk of 50 (its first token), then its 49 decode steps in one run: 3 turns, 52 steps."""
    res = simulate(_step(), _requests([250], [50], [0.0]), SimConfig(8, chunk_tokens=100))
    assert (res.events, res.steps) == (3, 52)


def test_a_full_batch_decodes_in_one_run_while_a_request_waits_for_the_output_reserve():
    """SGLang's admission (the output reserve) and a batch cap of 1: A runs, B waits. The reserve shrinks step by
    step, but a full batch admits nobody before a completion, so A's 99 decode steps are one run: A's prompt, A's
    run, B's prompt, B's run: 4 turns."""
    res = simulate(_step(), _requests([100, 100], [100, 100], [0.0, 0.0]), SimConfig(1, output_reserve=True))
    assert (res.events, res.steps) == (4, 200)


def test_a_decode_run_that_runs_out_of_blocks_is_one_run_up_to_the_last_step_that_fits():
    """tests above: 16 requests (160 tokens, 18 output tokens) in a pool of 191 blocks. Turns: the 16 prompts;
    one run of 16 decode steps (the 17th does not fit); the step that preempts the newest and runs one decode step
    (the other 15 finish); the victim's recompute (176 tokens, its first token was out already); its last decode
    step: 5 turns, 20 steps."""
    n = 16
    res = simulate(_step(), _requests([160] * n, [18] * n, [0.0] * n),
                   SimConfig(n, chunk_tokens=4096, prefix_caching=False, kv_pool_tokens=191 * 16))
    assert (res.events, res.steps, res.preemptions) == (5, 20, 1)


def test_a_decode_run_with_a_whole_block_to_spare_per_sequence_runs_until_the_second_crossing():
    """16 requests join a decode replica with their KV (160 tokens, 40 output tokens: 39 decode steps) in a pool
    of 192 blocks. Each holds ceil((160 + j + 1) / 16) blocks at step j: 11 until j = 15, 12 from j = 16, 13
    from j = 32: 16 x 12 = 192 still fits, 208 does not. Turns: the joins and one run of 32 steps; the step that
    preempts two (208 - 13 = 195 > 192, 182 fits) and runs step 32; the 14 left, whose 13 blocks leave no room
    for a victim's 12, finish in one run of 6; the victims recompute (192 tokens each) in one prompt step; their
    last 7 decode steps in one run: 5 turns, 47 steps."""
    n = 16
    res = simulate_replica(_step(), _requests([160] * n, [40] * n, [0.0] * n),
                           SimConfig(n, chunk_tokens=4096, prefix_caching=False, kv_pool_tokens=192 * 16), "trace",
                           None, 0, 0.0, naive=False, kv_ready=np.ones(n, dtype=bool))
    assert (res.events, res.steps, res.preemptions) == (5, 47, 2)


def test_a_free_slot_below_the_top_does_not_shorten_a_decode_run():
    """As above, with a 17th request Z (160 tokens, 2 output tokens) joining first, in slot 0: it finishes after
    one step and its slot stays free below the 16 others (holding nothing). The 16 then hold 11 blocks at
    context 161, 12 up to context 191 and 13 from 192 (16 x 13 = 208 > 192): one run of 31 steps (to step 32).
    Turns: the joins and Z's one step; the run of 31; the step that preempts two and runs step 32; the 14 left
    finish in one run of 6 (a victim's 12 blocks do not fit beside their 182); the victims' recompute; their
    last 7 decode steps: 6 turns, 47 steps."""
    n = 17
    res = simulate_replica(_step(), _requests([160] * n, [2] + [40] * 16, [0.0] * n),
                           SimConfig(n, chunk_tokens=4096, prefix_caching=False, kv_pool_tokens=192 * 16), "trace",
                           None, 0, 0.0, naive=False, kv_ready=np.ones(n, dtype=bool))
    assert (res.events, res.steps, res.preemptions) == (6, 47, 2)
