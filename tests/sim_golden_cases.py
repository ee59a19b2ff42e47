"""Golden simulations: a fixed set of runs covering every scheduling path of the simulator, whose
results are recorded bit for bit in ``tests/data/sim_golden.json`` (costmodel/test_sim_golden.py checks
that the simulator still reproduces them exactly).

Coverage: every engine policy (vLLM mixed chunked prefill, SGLang prefill-first with its output
reserve and SGLang mixed, TensorRT-LLM), prefix caching on and off, speculation (long and short
outputs), small chunk budgets (the closed-form run of identical prompt chunks), preemption (with
SGLang's retraction too), closed-loop (cold burst and staggered clients), Poisson and offline
arrivals, the closed-form clock and naive mode (one step at a time) of the same runs, a sliding
window model, an MoE model, a measured step table (no closed form), a pool override with a
watermark, requests that never fit, and a fleet.

Regenerate (only when a change of numbers is intended, and say why in the commit):

    python tests/sim_golden_cases.py --write
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
# run as a script (--write) from a checkout: the repository root holds the kvtune package. Imported by
# pytest it adds nothing, so no test can import the repository's folders by their bare names
if __name__ == "__main__" and str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))

from kvtune.costmodel import SpecConfig, StepModel, efficiency_for, get_gpu, get_model  # noqa: E402
from kvtune.costmodel.measured import MeasuredStepModel  # noqa: E402
from kvtune.costmodel.profile_table import ProfileRow  # noqa: E402
from kvtune.costmodel.requests import Requests  # noqa: E402
from kvtune.costmodel.simulate import SimConfig, simulate_replica, simulate_fleet  # noqa: E402

FIXTURE = HERE / "data" / "sim_golden.json"
H100 = get_gpu("h100-sxm")
CAL = efficiency_for("calibrated", "h100-sxm")

VLLM = {}
SGLANG = {"prefill_first": True, "output_reserve": True}
SGLANG_MIXED = {"output_reserve": True}
TRTLLM = {}  # in-flight batching with mixed chunks: vLLM V1's rules (kvtune's launch lines configure it so)


def _requests(n, seed, inp, out, rate=None, prefix=0, groups=0, ttft=1.0, tpot=0.05):
    rng = np.random.default_rng(seed)
    arr = np.zeros(n) if rate is None else np.concatenate(([0.0], np.cumsum(rng.exponential(1.0 / rate, n - 1))))
    i = rng.integers(inp[0], inp[1] + 1, n)
    o = rng.integers(out[0], out[1] + 1, n)
    grp = rng.integers(0, groups, n) if groups else np.full(n, -1)
    pre = np.where(grp >= 0, np.minimum(i, prefix), 0)
    return Requests(arrival_s=arr, input_tokens=i, output_tokens=o, prefix_tokens=pre, prefix_group=grp,
                    ttft_slo_s=np.full(n, ttft), tpot_slo_s=np.full(n, tpot), class_idx=np.zeros(n, dtype=np.int64))


def _step(model="llama-3.1-8b", tp=1, kv="bf16", spec=None, util=0.9, measured=False):
    s = StepModel(get_model(model), H100, tp, kv_dtype=kv, efficiency=CAL,
                  speculation=SpecConfig(*spec) if spec else None, gpu_mem_util=util)
    if not measured:
        return s
    rows = [ProfileRow(id=f"d{b}-{c}", kind="step", model=model, phase="decode", batch=b, context_tokens=c,
                       step_ms=6.0 + 0.05 * b + 0.001 * c) for b in (1, 8, 64) for c in (256, 2048)]
    rows += [ProfileRow(id=f"p{c}", kind="step", model=model, phase="prefill", batch=1, context_tokens=0,
                        chunk_tokens=c, step_ms=0.02 * c) for c in (128, 1024, 4096)]
    return MeasuredStepModel(s, rows, "golden", "00" * 32)


# name: (step kwargs, SimConfig kwargs, requests kwargs, arrival, concurrency, naive, replicas)
CASES = {
    "vllm-poisson": ({}, {"batch_cap": 64, **VLLM}, dict(n=400, seed=1, inp=(200, 3000), out=(20, 400), rate=20.0),
                     "trace", None, False, 1),
    "vllm-poisson-naive": ({}, {"batch_cap": 64, **VLLM}, dict(n=400, seed=1, inp=(200, 3000), out=(20, 400), rate=20.0),
                           "trace", None, True, 1),
    "vllm-prefix": ({}, {"batch_cap": 32, **VLLM}, dict(n=300, seed=2, inp=(1000, 4000), out=(10, 300), rate=15.0,
                                                         prefix=800, groups=3), "trace", None, False, 1),
    "vllm-prefix-off": ({}, {"batch_cap": 32, "prefix_caching": False, **VLLM},
                        dict(n=300, seed=2, inp=(1000, 4000), out=(10, 300), rate=15.0, prefix=800, groups=3),
                        "trace", None, False, 1),
    "vllm-preempt-offline": ({"util": 0.233}, {"batch_cap": 256, **VLLM},
                             dict(n=200, seed=3, inp=(300, 900), out=(200, 700)), "inf", None, False, 1),
    "vllm-preempt-offline-naive": ({"util": 0.233}, {"batch_cap": 256, **VLLM},
                                   dict(n=200, seed=3, inp=(300, 900), out=(200, 700)), "inf", None, True, 1),
    "vllm-small-chunk-70b": ({"model": "llama-3.1-70b", "tp": 4}, {"batch_cap": 128, "chunk_tokens": 512, **VLLM},
                             dict(n=200, seed=4, inp=(2000, 12000), out=(50, 300), rate=3.0), "trace", None, False, 1),
    "vllm-small-chunk-70b-naive": ({"model": "llama-3.1-70b", "tp": 4},
                                   {"batch_cap": 128, "chunk_tokens": 512, **VLLM},
                                   dict(n=200, seed=4, inp=(2000, 12000), out=(50, 300), rate=3.0), "trace", None, True, 1),
    "sglang-poolbound": ({"util": 0.3}, {"batch_cap": 128, "chunk_tokens": 4096, **SGLANG},
                         dict(n=300, seed=5, inp=(500, 3000), out=(100, 800), rate=12.0), "trace", None, False, 1),
    "sglang-poolbound-naive": ({"util": 0.3}, {"batch_cap": 128, "chunk_tokens": 4096, **SGLANG},
                               dict(n=300, seed=5, inp=(500, 3000), out=(100, 800), rate=12.0), "trace", None, True, 1),
    "sglang-retract-offline": ({"util": 0.233}, {"batch_cap": 256, **SGLANG},
                               dict(n=200, seed=6, inp=(300, 900), out=(200, 700)), "inf", None, False, 1),
    "sglang-mixed-closed": ({"util": 0.3}, {"batch_cap": 64, "chunk_tokens": 2048, **SGLANG_MIXED},
                            dict(n=300, seed=7, inp=(500, 3000), out=(100, 600)), "closed", 24, False, 1),
    "prefill-first-only": ({}, {"batch_cap": 64, "prefill_first": True},
                           dict(n=300, seed=8, inp=(200, 3000), out=(20, 400), rate=20.0), "trace", None, False, 1),
    "trtllm-closed-staggered": ({"model": "llama-3.1-70b", "tp": 4}, {"batch_cap": 32, **TRTLLM},
                                dict(n=200, seed=9, inp=(1000, 2000), out=(100, 300), rate=50.0), "closed", 16, False, 1),
    "trtllm-closed-burst": ({"model": "llama-3.1-70b", "tp": 4}, {"batch_cap": 32, **TRTLLM},
                            dict(n=200, seed=9, inp=(1000, 2000), out=(100, 300)), "closed", 16, False, 1),
    "spec-poisson": ({"spec": (5, 0.8)}, {"batch_cap": 32, **VLLM},
                     dict(n=300, seed=10, inp=(200, 2000), out=(20, 600), rate=10.0, tpot=0.01), "trace", None, False, 1),
    "spec-poisson-naive": ({"spec": (5, 0.8)}, {"batch_cap": 32, **VLLM},
                           dict(n=300, seed=10, inp=(200, 2000), out=(20, 600), rate=10.0, tpot=0.01),
                           "trace", None, True, 1),
    "spec-preempt-sglang": ({"spec": (3, 0.7), "util": 0.233}, {"batch_cap": 128, **SGLANG},
                            dict(n=150, seed=11, inp=(300, 900), out=(200, 900)), "inf", None, False, 1),
    "spec-long-outputs": ({"spec": (4, 0.75)}, {"batch_cap": 16, **VLLM},
                          dict(n=40, seed=12, inp=(100, 500), out=(3000, 9000), rate=1.0), "trace", None, False, 1),
    "sliding-gemma": ({"model": "gemma-2-9b"}, {"batch_cap": 64, "chunk_tokens": 1024, **VLLM},
                      dict(n=300, seed=13, inp=(500, 8000), out=(50, 800), rate=8.0), "trace", None, False, 1),
    "moe-mixtral-fp8kv": ({"model": "mixtral-8x7b", "tp": 4, "kv": "fp8"}, {"batch_cap": 128, **VLLM},
                          dict(n=300, seed=14, inp=(200, 3000), out=(20, 500), rate=25.0), "trace", None, False, 1),
    "measured-table": ({"measured": True}, {"batch_cap": 64, **VLLM},
                       dict(n=200, seed=15, inp=(100, 2000), out=(10, 200), rate=10.0), "trace", None, False, 1),
    "pool-override-watermark": ({}, {"batch_cap": 64, "kv_pool_tokens": 20000, "watermark_frac": 0.05,
                                     "block_tokens": 32, **VLLM},
                                dict(n=250, seed=16, inp=(200, 4000), out=(50, 600), rate=10.0), "trace", None, False, 1),
    "never-fit-sglang": ({"util": 0.233}, {"batch_cap": 32, **SGLANG},
                         dict(n=200, seed=17, inp=(100, 60000), out=(10, 300), rate=5.0, prefix=300, groups=2),
                         "trace", None, False, 1),
    "fleet-3": ({}, {"batch_cap": 64, **VLLM}, dict(n=600, seed=18, inp=(200, 3000), out=(20, 400), rate=45.0),
                "trace", None, False, 3),
}


def _digest(a: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


def _num(x) -> str | float | int:
    x = x.item() if hasattr(x, "item") else x
    if isinstance(x, float):
        return repr(x)  # exact, and inf/nan survive JSON
    return x


def run_case(name: str) -> dict:
    sk, ck, rk, arrival, conc, naive, replicas = CASES[name]
    step = _step(**sk)
    cfg = SimConfig(**ck)
    if replicas > 1:
        rate, n, seed = rk["rate"], rk["n"], rk["seed"]

        def make(r, m, s):
            return _requests(**{**rk, "n": m, "seed": s, "rate": None if r == float("inf") else r})
        res = simulate_fleet(step, make, cfg, replicas, rate, n, arrival, conc, seed)
    else:
        req = _requests(**rk)
        res = simulate_replica(step, req, cfg, arrival, conc, rk["seed"], None, naive=naive)
    out = {k: _num(getattr(res, k)) for k in ("preemptions", "rejected", "makespan_s", "output_tok_s", "request_s",
                                               "slo_attainment", "steps", "events", "replicas", "reject_reason")}
    for k in ("arrival_s", "ttft_s", "tpot_s", "e2e_s", "met_slo", "measured", "output_tokens"):
        a = getattr(res, k)
        out[k] = {"sha256": _digest(a), "head": [_num(v) for v in a[:3]]}
    return out


def main() -> None:
    commit = subprocess.run(["git", "-C", str(HERE.parent), "rev-parse", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    data = {"how": "python tests/sim_golden_cases.py --write: every case of tests/sim_golden_cases.py run by the "
                   "simulator as it was at the commit below; floats as repr() strings, arrays as sha256 of their "
                   "float64/bool bytes plus their first values",
            "commit": commit, "numpy": np.__version__, "cases": {name: run_case(name) for name in CASES}}
    if "--write" in sys.argv:
        FIXTURE.write_text(json.dumps(data, indent=1) + "\n")
        print(f"wrote {FIXTURE} ({len(CASES)} cases) at {commit[:12]}")
    else:
        print(json.dumps(data, indent=1))


if __name__ == "__main__":
    main()
