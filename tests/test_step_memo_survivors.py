"""The step model's memos (costmodel/step.py: the per-token-count terms of an MoE step, the
pipeline's micro-batches and hops) and its two entry points, against the mutants of round 5's
full run that the older tests let through (bench/mutation-runs/r5-step-deployment-all-1337.json).

Properties, each from the code's own contract rather than a snapshot:

* ``step_terms`` / ``step_time_s`` are ``breakdown`` without the record (step_terms' docstring):
  the simulator's hot path and the reported breakdown agree bit for bit, whatever the layout.
* A memo returns what a fresh computation returns: a model that has already answered other calls
  (plain floats, numpy scalars, in any order) answers every call exactly as a fresh model does.
  The memos hold plain int/float calls only; "a numpy scalar computes its own" (``_PLAIN``), so a
  float32 call must neither store its float32-rounded terms for a later float call nor read a
  float call's terms.
* numpy scalars compute the same model as plain floats (to float64 rounding).
"""

import numpy as np
import pytest

from kvtune.costmodel import Efficiency, StepModel, get_gpu, get_model
from kvtune.costmodel.parallel import Parallel

H100 = get_gpu("h100-sxm")
EFF = Efficiency(bw_efficiency=0.8, decode_flops_efficiency=0.55, prefill_flops_efficiency=0.7,
                 step_overhead_s=3e-3, prefill_overhead_s=1.5e-3, allreduce_latency_s=7e-6, link_efficiency=0.85,
                 activation_reserve_bytes=2e9, request_overhead_s=0.011, name="test")

# (model, tp, layout): one stage dense; TP dense; an MoE step (memoised per token count); a
# pipeline (memoised micro-batches and hops); an MoE pipeline with expert parallelism
LAYOUTS = [
    ("llama-3.1-8b", 1, None),
    ("llama-3.1-70b", 4, None),
    ("mixtral-8x7b", 2, Parallel(tp=2, ep=2)),
    ("llama-3.1-8b", 1, Parallel(tp=1, pp=4)),
    ("qwen3-30b-a3b", 2, Parallel(tp=2, ep=2, pp=2)),
]


def _model(name, tp, par):
    return StepModel(get_model(name), H100, tp, efficiency=EFF, parallel=par)


def _step(n_seqs, ctx_tok, prefill_tok):
    """(n_decode, decode context sum, prefill tokens, prefill pairs, prefill KV read): a causal
    prefill chunk of P tokens with nothing cached attends over P (P + 1) / 2 pairs."""
    return (n_seqs, n_seqs * ctx_tok, prefill_tok, prefill_tok * (prefill_tok + 1) / 2, 0.0)


# mixed steps; with one stage, some of them make ((t - fixed) + fixed) round away from t
STEPS = [_step(187, 4496.0, 1417.0), _step(80, 1646.0, 2215.0), _step(219, 1746.0, 1580.0),
         _step(56, 0.0, 512.0), _step(179, 2653.0, 199.0), _step(25, 699.0, 2215.0),
         _step(5, 1000.0, 0.0), _step(7, 333.0, 0.0), _step(0, 0.0, 3.0)]


@pytest.mark.parametrize("name,tp,par", LAYOUTS)
def test_step_terms_is_breakdown_bit_for_bit(name, tp, par):
    """step_terms and step_time_s (what the simulator reads) are breakdown's figures exactly."""
    sm = _model(name, tp, par)
    for args in STEPS:
        b = sm.breakdown(*args)
        assert sm.step_terms(*args) == (b.time_s, b.mem_s, b.compute_s, b.comm_s, b.draft_s,
                                        b.bytes_per_gpu, b.flops_per_gpu), (name, par, args)
        assert sm.step_time_s(*args) == b.time_s, (name, par, args)


def _as_floats(terms):
    return tuple(float(x) for x in terms)


def _cast(args, kinds):
    """The step's arguments as the given scalar types ('f' float, 'i' int, 'f32', 'f64' numpy)."""
    conv = {"f": float, "i": int, "f32": np.float32, "f64": np.float64}
    return tuple(conv[k](a) for a, k in zip(args, kinds))


# call orders: a numpy call first then the plain one with the same values, the reverse, and two
# numpy kinds in turn; the arguments that carry the memo keys (n_decode, prefill tokens) vary in type
ORDERS = [
    [("f32", "f", "f", "f", "f"), ("f", "f", "f", "f", "f")],      # numpy decode count, plain prompt
    [("i", "f", "f32", "f", "f"), ("i", "f", "f", "f", "f")],      # plain decode count, numpy prompt
    [("f32", "f32", "f32", "f32", "f32"), ("f", "f", "f", "f", "f")],
    [("f", "f", "f", "f", "f"), ("f32", "f32", "f32", "f32", "f32")],   # plain first, then numpy
    [("f", "f", "f", "f", "f"), ("f32", "f", "f", "f", "f")],
    [("f32", "f32", "f32", "f32", "f32"), ("f64", "f64", "f64", "f64", "f64")],
    [("f32", "f", "f", "f", "f"), ("f64", "f", "f", "f", "f")],    # two numpy decode counts in turn
    [("i", "f", "f32", "f", "f"), ("i", "f", "f64", "f", "f")],    # two numpy prompts in turn
]

# integral counts with a prompt (so prefill tokens enter the hops and the token count)
MEMO_STEPS = [_step(5, 1000.0, 3.0), _step(13, 777.0, 5.0), _step(3, 4096.0, 7.0), _step(6, 100.0, 0.0)]


@pytest.mark.parametrize("name,tp,par", LAYOUTS)
@pytest.mark.parametrize("order", ORDERS, ids=lambda o: ">".join(k[0] + k[2] for k in o))
def test_a_memo_answers_as_a_fresh_model(name, tp, par, order):
    """Every call of a model that has answered others equals the same call of a fresh model."""
    warm = _model(name, tp, par)
    for args in MEMO_STEPS:
        for kinds in order:
            call = _cast(args, kinds)
            got = _as_floats(warm.step_terms(*call))
            want = _as_floats(_model(name, tp, par).step_terms(*call))
            assert got == want, (name, par, kinds, args)


@pytest.mark.parametrize("name,tp,par", LAYOUTS)
def test_numpy_scalars_compute_the_plain_model(name, tp, par):
    """np.float64 arguments (the screen's grids) give the plain floats' step to float64 rounding."""
    sm = _model(name, tp, par)
    for args in STEPS + MEMO_STEPS:
        plain = sm.step_terms(*args)
        np64 = _as_floats(sm.step_terms(*(np.float64(a) for a in args)))
        assert np64 == pytest.approx(plain, rel=1e-12, abs=0.0), (name, par, args)
