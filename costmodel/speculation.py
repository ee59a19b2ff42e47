"""Speculative decoding in the simulator: how many verify passes each request needs.

A verify pass runs the target model over a sequence's k drafted tokens plus one and emits 1 + X
tokens, X the run of consecutive accepted drafts: P(X >= j) = a^j for j <= k (acceptance ``a``
per draft, independent), so X = min(floor(ln U / ln a), k) for a uniform U, and the mean tokens a
pass emits is (1 - a^(k+1)) / (1 - a) (``SpecConfig.tokens_per_step``; Leviathan et al. 2023,
"Fast Inference from Transformers via Speculative Decoding", eq. 1).

``verify_passes`` draws, per request, the passes its tokens after the first take: one uniform per
pass, or for outputs past ``SPEC_CLT_TOKENS`` tokens the renewal central limit theorem's normal
count. The draws come from one random stream in fixed segments, a block at a time, so memory stays
bounded whatever the outputs and the result does not depend on the block size.
"""

from __future__ import annotations

import math

import numpy as np

from .step import SpecConfig

__all__ = ["verify_passes", "SPEC_CLT_TOKENS", "SPEC_DRAWS_PER_BLOCK"]

SPEC_DRAWS_PER_BLOCK = 1 << 20  # acceptance draws held at once (8 MiB of doubles)
# a request with more tokens after its first than this gets its pass count from the renewal
# central limit theorem instead of one draw per pass (past 4,096 tokens at k=5, a=0.8: > 1,100
# passes, the count's relative sd ~2%, its law normal to well within that); below it, one draw
# per pass: 20,000 requests of 4,096 tokens draw ~2e7 uniforms (~2 s), not one per token
SPEC_CLT_TOKENS = 4096


def verify_passes(output_tokens: np.ndarray, speculation: SpecConfig, seed: int, *,
                  draws_per_block: int = SPEC_DRAWS_PER_BLOCK, clt_tokens: int = SPEC_CLT_TOKENS) -> np.ndarray:
    """Verify passes (target forward passes, int64, one per request) each request needs for its
    ``output_tokens - 1`` tokens after the first, with ``speculation.k`` drafts accepted each with
    probability ``speculation.acceptance``; ``seed`` fixes the draws.

    Request i reads its passes' uniforms from its own segment of one random stream, segment i
    starting at sum(need[:i]) and ``need[i]`` draws long (at most one per token: a pass emits >= 1);
    it uses as many as it has passes. The stream is drawn ``draws_per_block`` uniforms at a time and
    the unused rest of a long segment is jumped over (``advance``), so memory stays bounded by the
    block whatever the outputs, and the draws are the same as drawing the whole stream at once.
    Requests with more than ``clt_tokens`` tokens after their first draw their count from the
    renewal central limit theorem instead, from a generator of their own (the others' stream is
    unchanged)."""
    need = np.maximum(output_tokens.astype(np.int64) - 1, 0)
    k, a = speculation.k, speculation.acceptance
    total = int(need.sum())
    if total == 0:
        return need.copy()
    if a >= 1.0:
        return -(-need // (k + 1))
    if a <= 0.0:
        return need.copy()  # every pass emits one token
    rng = np.random.default_rng(seed)
    if total <= draws_per_block and need.max() <= clt_tokens:
        return _passes_of_segments(rng.random(total), need, k, a)
    res = np.zeros(len(need), dtype=np.int64)
    long = np.flatnonzero(need > clt_tokens)
    if long.size:  # their own generator: the stream the others read stays as it was
        res[long] = _passes_clt(np.random.default_rng([seed, 1]), need[long], k, a)
    i, n = 0, len(need)
    while i < n:
        if need[i] > clt_tokens:
            rng.bit_generator.advance(int(need[i]))  # type: ignore[attr-defined]  # PCG64 (default_rng) has advance
            i += 1
            continue
        if need[i] > draws_per_block:
            res[i] = _passes_of_long_segment(rng, int(need[i]), k, a, draws_per_block)
            i += 1
            continue
        j, drawn = i, 0  # consecutive requests whose segments fit one block
        while j < n and need[j] <= draws_per_block - drawn and need[j] <= clt_tokens:
            drawn += int(need[j])
            j += 1
        res[i:j] = _passes_of_segments(rng.random(drawn), need[i:j], k, a)
        i = j
    return res


def _accepted_runs(u: np.ndarray, k: int, a: float) -> np.ndarray:
    """Tokens each verify pass emits, 1 + X, from uniforms ``u`` (modified in place)."""
    u[u <= 0] = np.finfo(float).tiny
    return 1 + np.minimum(np.floor(np.log(u) / math.log(a)), k).astype(np.int64)


def _passes_clt(rng: np.random.Generator, need: np.ndarray, k: int, a: float) -> np.ndarray:
    """Passes to emit ``need`` tokens when each emits 1 + X (X as above): by the renewal CLT the
    count is normal with mean need / mu (+ 1/2 for the last pass's overshoot) and variance
    need sigma^2 / mu^3, mu and sigma^2 the mean and variance of 1 + X; within [need/(k+1), need]."""
    j = np.arange(1, k + 1)
    mu = 1.0 + float(np.sum(a ** j))                      # E[1 + X] = sum_{j=0..k} a^j
    var = float(np.sum((2 * j - 1) * a ** j)) - (mu - 1.0) ** 2  # E[X^2] - E[X]^2
    mean = need / mu + 0.5
    sd = np.sqrt(need * max(var, 0.0) / mu ** 3)
    draw = np.rint(mean + sd * rng.standard_normal(len(need))).astype(np.int64)
    return np.clip(draw, -(-need // (k + 1)), need)


def _passes_of_segments(u: np.ndarray, need: np.ndarray, k: int, a: float) -> np.ndarray:
    """Passes of consecutive requests whose segments together are ``u``."""
    runs = _accepted_runs(u, k, a)
    cum = np.concatenate(([0], np.cumsum(runs)))
    start = np.concatenate(([0], np.cumsum(need)[:-1]))
    base = cum[start]
    end = np.searchsorted(cum, base + need, side="left")  # first index with cum >= base + need
    return np.where(need > 0, end - start, 0).astype(np.int64)


def _passes_of_long_segment(rng: np.random.Generator, need: int, k: int, a: float, draws_per_block: int) -> int:
    """Passes of one request whose segment exceeds a block: drawn a block at a time until its
    tokens are reached, then the rest of the segment is skipped."""
    drawn, got = 0, 0
    while True:
        m = min(draws_per_block, need - drawn)
        c = np.cumsum(_accepted_runs(rng.random(m), k, a))
        if got + int(c[-1]) >= need:
            passes = drawn + int(np.searchsorted(c, need - got, side="left")) + 1
            drawn += m
            break
        got += int(c[-1])
        drawn += m
    if need > drawn:
        rng.bit_generator.advance(need - drawn)  # type: ignore[attr-defined]  # PCG64 has advance
    return passes
