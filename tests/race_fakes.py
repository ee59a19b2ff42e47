"""Fakes for unit tests of the race (``optimizer.simsearch``), verification (``optimizer.verify``) and
the answer (``optimizer.recommend``): a runner that answers every work item from a known per-replica
goodput per config, so the right answer is known by hand and a test runs in milliseconds.

The rule the fake follows (a monotone engine): a config with goodput ``G`` req/s per replica meets
the target at every rate <= ``G`` (attainment ``MEETS``) and misses above it (``MISSES``); a fresh
draw ``seed`` of it has goodput ``G x factor(seed)`` (1 unless a test says otherwise)."""

from __future__ import annotations

import math
from types import SimpleNamespace

from kvtune.optimizer.deployment import Aggregated
from kvtune.optimizer import verify as vf
from kvtune.optimizer.search import SolveContext, config_key
from kvtune.optimizer.simsearch import LocalRunner, Probe
from kvtune.optimizer.workload import load_workload_dict

MEETS, MISSES = 0.95, 0.5


def spec_dict(objective: str = "min_cost", rate: float | None = 30, kv=("bf16", "fp8"), tp=(1, 2),
              caps=(16, 64), max_nodes: int = 1, attainment: float = 0.9, usd: float = 2.0,
              speculative: dict | None = None, spec_k: int | None = None, weights: str | None = None) -> dict:
    """A small 8B workload: 1,000-token prompts, 200-token outputs; 2 TPs x 3 caps x 2 KV = 12 configs."""
    w: dict = {"classes": [{"name": "c", "share": 1.0, "input_tokens": 1000, "output_tokens": 200}]}
    if rate is not None:
        w["rate_req_s"] = rate
    out = {"model": "llama-3.1-8b",
            "hardware": {"gpu": "h100-sxm", "gpus_per_node": 8, "usd_per_gpu_hour": usd, "max_nodes": max_nodes},
            "workload": w, "slo": {"ttft_ms": 1000, "tpot_ms": 50, "attainment": attainment},
            "objective": objective,
            "search": {"tp": list(tp), "batch_cap": list(caps), "kv_dtype": list(kv), "chunk_tokens": 1024,
                       "trials": 5, "seed": 0}}
    if weights is not None:
        out["weights"] = weights
    if speculative is not None:
        out["speculative"] = speculative
        out["search"]["spec_k"] = spec_k
    return out


def make_ctx(objective: str = "min_cost", **kw) -> SolveContext:
    return SolveContext.build(load_workload_dict(spec_dict(objective, **kw), "<test>"))


def params(tp: int = 1, cap: int = 16, kv: str = "bf16", k: int = 0, chunk: int = 1024) -> Aggregated:
    return Aggregated.from_config({"tp": tp, "batch_cap": cap, "kv_dtype": kv, "spec_k": k, "chunk_tokens": chunk})


class FakeRunner(LocalRunner):
    """A ``LocalRunner`` (so the race may probe ahead with ``jobs`` >= 2) whose work items are
    answered by the rule in the module docstring. ``goodput``: config key -> per-replica goodput
    (a config not listed: ``default``); ``dead``: config keys that miss even at zero load;
    ``factor``: seed -> a fresh draw's share of the goodput; ``upper``: the upper bound a missing
    probe reports (below the target: a short probe rules it out; above: a full probe is run)."""

    def __init__(self, ctx: SolveContext, goodput: dict[str, float], default: float = 0.0, dead=(),
                 factor: dict[int, float] | None = None, jobs: int = 1, upper: float = 0.6):
        super().__init__(ctx, jobs)
        self.goodput, self.default, self.dead = dict(goodput), default, set(dead)
        self.factor = dict(factor or {})
        self.upper = upper
        self.batches: list[list] = []    # every run() call's items, as asked
        self.executed: list = []         # every item actually answered (not from the cache)

    def g(self, p: dict) -> float:
        return self.goodput.get(config_key(p), self.default)

    def draw(self, p: dict, rate: float, seed: int) -> float:
        return MEETS if rate <= self.g(p) * self.factor.get(seed, 1.0) else MISSES

    def answer(self, w) -> dict:
        p = dict(w.params)
        k, g = config_key(p), self.g(p)
        if w.kind == "probe":
            meets = k not in self.dead and w.rate_req_s <= g
            return Probe(k, w.rate_req_s, w.n_requests, MEETS if meets else MISSES, meets, 0,
                         "" if meets else "too slow", 0.92 if meets else 0.3, 1.0 if meets else self.upper,
                         w.rate_req_s if meets else 0.5 * w.rate_req_s).to_json()
        if w.kind == "verify":
            if g <= 0:
                return vf.Verification(p, 0.0, 5, False, "misses at a trickle").to_json()
            return vf._sized(self.ctx, p, g, 5, vf.config_requests(self.ctx, p), nominal=g).to_json()
        if w.kind == "draw":
            return {"attainment": self.draw(p, w.rate_req_s, w.seed)}
        raise AssertionError(f"unexpected work {w.kind}")

    def run(self, items):
        self.batches.append(list(items))
        for w in items:
            if w.key not in self.cache:
                self.executed.append(w)
                self.cache[w.key] = self.answer(w)
        return [self.cache[w.key] for w in items]


class FakeAt:
    """What ``verify.simulate_at`` returns, reduced to what ``robust`` reads."""
    slo_attainment = MEETS
    output_tok_s = 1234.0
    preemptions = 3

    def summary(self) -> dict:
        return {"ttft_ms": {"p50": 100.0, "p90": 200.0, "p99": 300.0, "mean": 120.0},
                "tpot_ms": {"p50": 20.0, "p90": None, "p99": 40.0, "mean": 25.0}}


def patch_simulation(monkeypatch, runner: FakeRunner) -> list:
    """Route ``verify``'s own simulations (one draw, the pick at its load) to the fake; returns the
    list of (fleet rate, replicas, n, seed) ``simulate_at`` was asked for."""
    at: list = []
    monkeypatch.setattr(vf, "draw_attainment", lambda ctx, p, rate, n, seed: runner.draw(p, rate, seed))

    def sim_at(ctx, p, fleet, r, n, seed):
        at.append((fleet, r, n, seed))
        return FakeAt()
    monkeypatch.setattr(vf, "simulate_at", sim_at)
    return at


def expected_min_cost(ctx: SolveContext, goodput: dict[str, float]) -> tuple[int, float]:
    """(GPUs, $/h) of the cheapest config by hand: ceil(rate / G) replicas x TP GPUs."""
    best = math.inf
    for k, g in goodput.items():
        tp = int(k.split("-")[0][2:])
        if g > 0:
            best = min(best, math.ceil(ctx.rate_req_s / g) * tp)
    return int(best), best * ctx.spec.hardware.usd_per_gpu_hour


def ns(**kw) -> SimpleNamespace:
    return SimpleNamespace(**kw)
