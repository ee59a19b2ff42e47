"""The disaggregated deployments (x prefill replicas at TP_p + y decode replicas at TP_d) as a
search beside the aggregated one, with the simulator as the arbiter.

A race in three rounds, the same evidence rules as the aggregated search (the simulator decides;
the screen only prunes):

1. screen: every (TP_p, TP_d, x, y, prefill chunk budget, prefill batch cap, decode batch cap)
   within ``max_gpus`` gets its capacity bound (``costmodel.deployment.disaggregated_bound_req_s``:
   the prefill pool's full-chunk rate and the decode pool's KV/batch bound) and the score it would
   get with that goodput (goodput per GPU; for ``kvtune solve``, $/h at the target rate); the
   prefill pool computes only the prompt tokens the prefix cache does not hold. The bound
   is an upper bound on goodput, so a candidate whose best possible score is worse than a score
   already simulated cannot win and is pruned; the rest go best possible score first;
2. short simulations: goodput bisection with few requests and a loose tolerance for the
   ``short_keep`` candidates with the best possible scores;
3. the few: a full goodput bisection for the best knobs of the best pool shapes (TP_p, x, TP_d,
   y) of round 2: at least ``final_keep`` shapes, then on while a shape's short score beats the best
   full one (short runs read optimistic), at most ``final_max``; the winner is the best score
   among the full runs.

The KV link: NVLink when both pools fit in one node (x TP_p + y TP_d <= GPUs per node), the
node's network otherwise. The engine's transfer overlap and first-token rule come from the
engine registry (``costmodel.engines``); with no engine named, vLLM's (the whole KV after the
prompt, a decode step for the first token: the default launch settings are vLLM's).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from kvtune.costmodel.deployment import Pool, disaggregated_bound_req_s, kv_link, simulate_disaggregated
from kvtune.costmodel.engines import DEFAULT_ENGINE   # whose disaggregation rules apply when none is named
from kvtune.costmodel.goodput import goodput
from kvtune.costmodel.simulate import SimConfig
from kvtune.costmodel.step import StepCost
import multiprocessing as mp
import numpy as np

__all__ = ["PoolChoice", "DisaggCandidate", "DisaggSearch", "search_disaggregated", "margin", "DEFAULT_ENGINE",
           "uncached_prompt_tokens", "fork_map", "ForkPool"]

PREFILL_CHUNKS = (2048, 8192)
PREFILL_CAPS = (16,)        # concurrent prompts in a prefill replica (its chunk budget is what limits it)
DECODE_CAPS = (64, 128, 256, 512)
DECODE_CHUNK = 8192         # a decode replica computes no prompt (vLLM: one recomputed token per request)
MAX_REPLICAS = 6            # per pool


@dataclass(frozen=True)
class PoolChoice:
    tp: int
    replicas: int
    batch_cap: int
    chunk_tokens: int

    @property
    def gpus(self) -> int:
        return self.tp * self.replicas

    def to_json(self) -> dict:
        return {"tp": self.tp, "replicas": self.replicas, "batch_cap": self.batch_cap,
                "chunk_tokens": self.chunk_tokens, "gpus": self.gpus}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> PoolChoice:
        return cls(d["tp"], d["replicas"], d["batch_cap"], d["chunk_tokens"])


@dataclass(frozen=True)
class DisaggCandidate:
    prefill: PoolChoice
    decode: PoolChoice
    link: str                     # "nvlink" | "network"
    bound_req_s: float            # the screen's capacity bound (whole deployment)
    goodput_req_s: float          # simulated (whole deployment); nan where not simulated
    simulations: int = 0
    round: str = "screen"         # the last round it reached: screen, short, final
    reason: str = ""

    @property
    def gpus(self) -> int:
        return self.prefill.gpus + self.decode.gpus

    @property
    def goodput_per_gpu_req_s(self) -> float:
        return self.goodput_req_s / self.gpus

    def to_json(self) -> dict:
        return {"prefill": self.prefill.to_json(), "decode": self.decode.to_json(), "link": self.link,
                "gpus": self.gpus, "bound_req_s": self.bound_req_s, "goodput_req_s": self.goodput_req_s,
                "goodput_per_gpu_req_s": self.goodput_per_gpu_req_s, "simulations": self.simulations,
                "round": self.round, **({"reason": self.reason} if self.reason else {})}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> DisaggCandidate:
        """``to_json``'s object read back (``gpus`` and the goodput per GPU follow from the rest)."""
        return cls(PoolChoice.from_json(d["prefill"]), PoolChoice.from_json(d["decode"]), d["link"],
                   _float(d["bound_req_s"]), _float(d["goodput_req_s"]), d["simulations"], d["round"],
                   d.get("reason", ""))


def _float(x: Any) -> Any:
    """A figure read back: the output writes inf and nan as strings."""
    return float(x) if isinstance(x, str) else x


@dataclass(frozen=True)
class DisaggSearch:
    best: DisaggCandidate | None      # None: no disaggregated deployment met the SLOs
    simulated: tuple[DisaggCandidate, ...]   # every candidate simulated, best first
    screened: int                     # candidates the screen bounded
    pruned: int                       # ... of which the bound ruled out
    simulations: int
    wall_s: float
    engine: str

    def to_json(self) -> dict:
        return {"best": None if self.best is None else self.best.to_json(), "engine": self.engine,
                "screened": self.screened, "pruned": self.pruned, "simulations": self.simulations,
                "wall_s": round(self.wall_s, 3), "simulated": [c.to_json() for c in self.simulated[:8]]}


def search_disaggregated(step_for: Callable[[int], StepCost | Exception | None],
                         sim_config: Callable[[int, int], SimConfig],
                         make_requests: Callable, attainment: float, *, tps, gpu, gpus_per_node: int,
                         max_gpus: int, engine: str | None = None, seed: int = 0, final_n: int = 400,
                         short_n: int = 150, short_keep: int = 48, final_keep: int = 3, final_max: int = 8,
                         rel_tol: float = 0.05,
                         prefill_chunks=PREFILL_CHUNKS, prefill_caps=PREFILL_CAPS, decode_caps=DECODE_CAPS,
                         max_replicas: int = MAX_REPLICAS, time_budget_s: float | None = None,
                         score: Callable[[DisaggCandidate], tuple] | None = None, jobs: int = 1) -> DisaggSearch:
    """The best disaggregated deployment by simulated goodput per GPU (module docstring).

    ``step_for(tp)``: the step model of one replica at ``tp`` (None or an exception instance
    where the model does not fit); ``sim_config(batch_cap, chunk_tokens)``: the engine's
    ``SimConfig``; ``make_requests(rate, n, seed)``: the workload's requests; ``tps``: the TPs to
    try for either pool. ``time_budget_s`` stops round 2 early (the candidates not yet simulated
    are reported as pruned by time). ``score`` ranks simulated candidates, lowest first (default:
    most goodput per GPU; ``kvtune solve`` passes the objective's: $/h at the target rate).
    ``jobs`` > 1: round 2's bisections on that many forked processes (the same answer)."""
    wall0 = time.perf_counter()
    eng = engine or DEFAULT_ENGINE
    if score is None:
        def score(o: DisaggCandidate) -> tuple:
            return (-o.goodput_per_gpu_req_s, o.gpus)
    steps: dict[int, StepCost] = {}
    for tp in sorted(set(int(t) for t in tps)):
        s = step_for(tp)
        if s is not None and not isinstance(s, Exception) and tp <= gpus_per_node:
            steps[tp] = s
    probe = make_requests(1.0, 200, seed)
    mean_in, mean_out = float(probe.input_tokens.mean()), float(probe.output_tokens.mean())
    mean_todo = uncached_prompt_tokens(probe)

    # ---- 1. screen: the capacity bound of every candidate ---------------------------------------
    cands = []
    for tpp, sp in steps.items():
        for tpd, sd in steps.items():
            for x in range(1, max_replicas + 1):
                for y in range(1, max_replicas + 1):
                    gpus = x * tpp + y * tpd
                    if gpus > max_gpus:
                        continue
                    link = "nvlink" if gpus <= gpus_per_node else "network"
                    for chunk in prefill_chunks:
                        for pcap in prefill_caps:
                            for dcap in decode_caps:
                                pp = Pool(sp, sim_config(pcap, chunk), x)
                                dp = Pool(sd, sim_config(dcap, DECODE_CHUNK), y)
                                ub = disaggregated_bound_req_s(pp, dp, mean_in, mean_out, mean_todo)
                                pc, dc = PoolChoice(tpp, x, pcap, chunk), PoolChoice(tpd, y, dcap, DECODE_CHUNK)
                                # the best score this candidate could reach: its bound as its goodput
                                lb = score(DisaggCandidate(pc, dc, link, ub, ub))
                                cands.append((lb, ub, pc, dc, link, pp, dp))
    screened = len(cands)
    # a candidate whose best possible score is no score at all (its bound cannot serve the objective
    # within the GPUs or the price allowed) cannot win at any rate: pruned unsimulated
    cands = [c for c in cands if math.isfinite(c[0][0])]
    cands.sort(key=lambda c: (c[0], c[2].gpus + c[3].gpus, c[2].tp, c[3].tp, c[2].replicas, c[3].replicas,
                              c[2].chunk_tokens, c[3].batch_cap))

    def run(c, n, tol) -> tuple[float, int, str]:
        _, ub, _, _, link, pp, dp = c
        lk = kv_link(gpu, link == "nvlink")

        def sim(req, arrival, wf):
            return simulate_disaggregated(pp, dp, req, lk, arrival, seed, wf, engine=eng).result

        g = goodput(dp.step, make_requests, dp.config, attainment, n_requests=n, seed=seed, rel_tol=tol,
                    sim=sim, upper_bound_req_s=ub)
        return float(g.goodput_req_s), int(g.iterations), g.reason or ""

    # independent bisections on ``jobs`` forked processes (candidates by their index: they reach the
    # processes by the fork), one pool for rounds 2 and 3
    with ForkPool(lambda a: run(cands[a[0]], a[1], a[2]), jobs if time_budget_s is None else 1) as pool:
        return _rounds(cands, run, pool, score, screened, short_n, short_keep, final_n, final_keep, final_max,
                       rel_tol, time_budget_s, wall0, eng)


def _rounds(cands, run, pool: ForkPool, score, screened, short_n, short_keep, final_n, final_keep, final_max,
            rel_tol, time_budget_s, wall0, eng) -> DisaggSearch:
    """Rounds 2 and 3 of ``search_disaggregated`` (module docstring) on ``cands``, screened and ordered."""
    # ---- 2. short simulations, branch and bound on the bound per GPU ----------------------------
    short: list[tuple[Any, float, int, str]] = []
    sims = 0
    if pool.active:   # independent bisections: on ``jobs`` processes, in order
        todo = cands[:short_keep]
        short = [(c, *r) for c, r in zip(todo, pool.map([(k, short_n, 0.1) for k in range(len(todo))]))]
        sims = sum(it for _, _, it, _ in short)
    else:
        for c in cands:
            if len(short) >= short_keep:
                break
            if time_budget_s is not None and time.perf_counter() - wall0 > time_budget_s and short:
                break
            g, it, why = run(c, short_n, 0.1)
            sims += it
            short.append((c, g, it, why))
    pruned = screened - len(short)
    short.sort(key=lambda s: score(DisaggCandidate(s[0][2], s[0][3], s[0][4], s[0][1], s[1])))

    # ---- 3. the few: full goodput for the best knobs of the best pool shapes ---------------------
    # (short runs read optimistic: one whose short score is already worse than the best full one
    # stops the round once ``final_keep`` shapes have run)
    out = []
    shapes: set[tuple[int, int, int, int]] = set()
    best_final = None
    ahead: dict[int, tuple[float, int, str]] = {}
    if pool.active:   # the first ``final_keep`` shapes run whatever the others give: side by side
        first: list = []
        seen: set[tuple[int, int, int, int]] = set()
        for c, g, _, _ in short:
            shape = (c[2].tp, c[2].replicas, c[3].tp, c[3].replicas)
            if g > 0 and shape not in seen and len(seen) < min(final_keep, final_max):
                seen.add(shape)
                first.append(c)
        index = {id(c): k for k, c in enumerate(cands)}
        ahead = dict(zip((id(c) for c in first), pool.map([(index[id(c)], final_n, rel_tol) for c in first])))
    for c, g, it, why in short:
        shape = (c[2].tp, c[2].replicas, c[3].tp, c[3].replicas)
        sc = score(DisaggCandidate(c[2], c[3], c[4], c[1], g))
        go = (g > 0 and shape not in shapes and len(shapes) < final_max
              and (len(shapes) < final_keep or best_final is None or sc < best_final))
        if go:
            shapes.add(shape)
            gf, itf, whyf = ahead[id(c)] if id(c) in ahead else run(c, final_n, rel_tol)
            sims += itf
            o = DisaggCandidate(c[2], c[3], c[4], c[1], gf, it + itf, "final", whyf)
            best_final = score(o) if best_final is None or score(o) < best_final else best_final
            out.append(o)
        else:
            out.append(DisaggCandidate(c[2], c[3], c[4], c[1], g, it, "short", why))
    finals = sorted((o for o in out if o.round == "final"), key=score)
    rest = sorted((o for o in out if o.round != "final"), key=score)
    ranked = tuple(finals + rest)
    best = finals[0] if finals and finals[0].goodput_req_s > 0 and math.isfinite(score(finals[0])[0]) else None
    return DisaggSearch(best, ranked, screened, pruned, sims, time.perf_counter() - wall0, eng)


_FORKED: tuple | None = None   # (fn, items) the forked processes of ``fork_map`` read


def _forked_call(i: int):
    assert _FORKED is not None, "set by fork_map before the pool forks"
    fn, items = _FORKED
    return fn(items[i])


def fork_map(fn: Callable[[Any], Any], items: list, jobs: int) -> list:
    """``[fn(x) for x in items]`` on ``jobs`` forked processes (``fn`` and ``items`` reach them by the
    fork, so closures work), results in order; in this process when ``jobs`` or the items are < 2."""
    global _FORKED
    if jobs < 2 or len(items) < 2:
        return [fn(x) for x in items]
    _FORKED = (fn, items)
    try:
        with mp.get_context("fork").Pool(min(jobs, len(items))) as pool:
            return pool.map(_forked_call, range(len(items)), chunksize=1)
    finally:
        _FORKED = None


_FORK_FN: Callable[[Any], Any] | None = None   # the function the processes of a ``ForkPool`` run


def _fork_fn_call(x):
    assert _FORK_FN is not None, "set by ForkPool before its pool forks"
    return _FORK_FN(x)


class ForkPool:
    """``map(xs)``: ``[fn(x) for x in xs]`` on ``jobs`` forked processes kept for the whole ``with``
    block (``fork_map`` forks a pool per call), results in order. ``fn`` reaches the processes by
    the fork, so closures over large state work; each ``x`` by pickling (keep them small: indices,
    seeds, rates). In this process when ``jobs`` < 2 or a batch has fewer than 2 items; the pool
    forks at the first batch that needs it. One at a time in a process (``fn`` is a module global)."""

    def __init__(self, fn: Callable[[Any], Any], jobs: int):
        self.fn, self.jobs = fn, int(jobs)
        self._pool: Any = None   # a multiprocessing Pool, forked at the first batch that needs it

    @property
    def active(self) -> bool:
        """Batches run on several processes."""
        return self.jobs > 1

    def __enter__(self) -> "ForkPool":
        return self

    def map(self, xs: list) -> list:
        global _FORK_FN
        if self.jobs < 2 or len(xs) < 2:
            return [self.fn(x) for x in xs]
        if self._pool is None:
            _FORK_FN = self.fn
            self._pool = mp.get_context("fork").Pool(self.jobs)
        return self._pool.map(_fork_fn_call, xs, chunksize=1)

    def __exit__(self, *exc) -> None:
        global _FORK_FN
        if self._pool is not None:
            self._pool.terminate()
            self._pool = None
            _FORK_FN = None


def uncached_prompt_tokens(req) -> float:
    """Mean prompt tokens a prefill pool computes once the prefix cache is warm: a request of a
    prefix group reads its shared prefix from the cache (steady state: the first request of each
    group per replica is left out, so the bound stays an upper bound)."""
    shared = np.where(req.prefix_group >= 0, req.prefix_tokens, 0)
    return float(np.maximum(req.input_tokens - shared, 0).mean())


def margin(a_per_gpu: float, b_per_gpu: float) -> float:
    """How much more goodput per GPU ``a`` gives than ``b`` (0.12 = 12% more); inf if b is 0."""
    if b_per_gpu <= 0:
        return math.inf if a_per_gpu > 0 else 0.0
    return a_per_gpu / b_per_gpu - 1.0
