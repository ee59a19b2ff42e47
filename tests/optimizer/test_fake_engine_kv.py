"""The fake engine's optional KV-cache-type cost terms (KVTUNE_FAKE_COST ``kv``, used by
bench/bench_tune.py's 72-config lattice): a named type changes the step cost as documented, an
unnamed type and the default cost do not."""

from __future__ import annotations

import fake_engine


def _step_ms(kv_type: str, cost: dict) -> float:
    e = fake_engine.Engine(4, 256, 4096, 1, dict(fake_engine.DEFAULT_COST, **cost), None, kv_type)
    return e._step_s(decoding=4, prompt=100, context=2000) * 1e3


def test_default_cost_ignores_the_cache_type():
    c = fake_engine.DEFAULT_COST
    want = c["base_ms"] + c["seq_ms"] * 4 + c["prefill_ms_per_tok"] * 100 + c["ctx_us_per_tok"] * 2000 / 1e3
    assert _step_ms("f16", {}) == _step_ms("q8_0", {}) == want


def test_a_named_cache_type_scales_context_and_adds_its_terms():
    kv = {"kv": {"q8_0": {"ctx_scale": 0.5, "seq_ms": 1.0, "prefill_ms_per_tok": 0.1}}}
    base = _step_ms("f16", kv)
    assert _step_ms("f16", {}) == base                 # a type not named costs as before
    c = fake_engine.DEFAULT_COST
    want = base - c["ctx_us_per_tok"] * 2000 / 1e3 * 0.5 + 1.0 * 4 + 0.1 * 100
    assert abs(_step_ms("q8_0", kv) - want) < 1e-9
