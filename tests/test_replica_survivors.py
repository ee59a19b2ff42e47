"""costmodel.replica on what the full mutation run of the module (bench/bench_mutation.py) found
untested. Each test runs the replica on a step model that records every step it is asked to time
(prompt tokens, attention pairs, cached tokens read), so the scheduler's decisions are read off
directly and compared with figures derived by hand from the rules the module docstring states."""

import numpy as np
import pytest

from kvtune.costmodel.requests import Requests
from kvtune.costmodel.simulate import SimConfig, simulate


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
