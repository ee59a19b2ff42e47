"""costmodel.replica on what the full mutation run of the module (bench/bench_mutation.py) found
untested. Each test runs the replica on a step model that records every step it is asked to time
(prompt tokens, attention pairs, cached tokens read), so the scheduler's decisions are read off
directly and compared with figures derived by hand from the rules the module docstring states."""

import numpy as np
import pytest
from test_simulate import _poisson, _reference, _step

from kvtune.costmodel.requests import Requests
from kvtune.costmodel.step import SpecConfig
from kvtune.costmodel.simulate import SimConfig, simulate, simulate_replica


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
    """As tests/test_replica_by_hand.py, with 128-token chunks: a preempted request's recompute
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
