"""The simulator search: every lattice config that fits, raced against the best simulated so far.

The analytic screen (``optimizer.screen``) only orders the race and sizes simulations; what is
recommended is decided by the simulator. Stages, each a batch of independent simulations:

1. zero load: one simulation per (TP, KV dtype, speculation length, chunk budget) at a trickle
   (``ZERO_LOAD_SHARE`` x the decode-bound capacity; the batch cap cannot matter there). Its
   attainment bounds attainment at every rate, so a group that misses the target here is out,
   with the reason (which SLO, by how much; requests that can never fit the KV pool). When every
   group misses, that is the answer to "infeasible": no config meets the SLOs even at vanishing load.
2. seeds: the ``SEEDS`` best configs by screened objective, one per structure, fully verified
   (``optimizer.verify.verify``: goodput bisected by the simulator, then sized).
3. the race, in prior order, ``BATCH`` configs at a time: each config gets the per-replica rate it
   would have to serve to beat the best verified deployment (``bar_req_s``), then
      - pruned without simulating when its decode-bound capacity x ``CAPACITY_SLACK`` is below
        the bar, or when it cannot beat the best at any rate (needs fewer GPUs than its TP);
      - a short simulation (``SHORT_SHARE`` of the requests) at the bar: out if its attainment is
        ``SHORT_MARGIN`` below the target (overload only worsens over a longer run);
      - a full simulation at the bar, on the very requests verification would use there;
      - if it meets: it is fully verified (goodput bisected, replicas sized) and becomes the best
        if its verification says so. With no best yet, the bar is the rate on the most replicas
        the config could need (``replicas_bound``) or max_nodes allows, whichever is fewer.

"Beat" is the recommendation's order (``rank``): min_cost by $/h, then bf16 KV over fp8 at equal
cost (when both are searched), then goodput by more than the bisection tolerance; max_goodput by
goodput per $. Each stage's batch is a function of the earlier stages' results only, and every
simulation is a function of (config, rate, requests) only, so the answer does not depend on
which process ran which simulation (``optimizer.scaleout`` shares batches between processes).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import asdict, dataclass
from typing import Callable

import numpy as np

from kvtune.costmodel.goodput import capacity_bound_req_s

from .layouts import gpus_per_replica
from .search import Evaluation, SolveContext, config_key, evaluate, grid_space
from .verify import REL_TOL, Verification, config_requests, sim_config, sim_requests, verify_config

__all__ = ["Probe", "Outcome", "Race", "race", "candidates", "bar_req_s", "rank", "LocalRunner",
           "ZERO_LOAD_SHARE", "SEEDS", "BATCH", "CAPACITY_SLACK", "SHORT_SHARE", "SHORT_MARGIN"]

ZERO_LOAD_SHARE = 1e-3  # zero-load probe rate, as a share of the decode-bound capacity (goodput's own)
SEEDS = 4               # configs fully verified before the race (best screened of distinct structures)
BATCH = 16              # configs raced per batch (fixed: the answer must not depend on worker count)
CAPACITY_SLACK = 1.2    # decode-bound capacity x this below the bar: pruned unsimulated (measured
                        # simulated goodput / capacity bound: at most 0.71 over bench_oracle's workloads)
SHORT_SHARE = 0.25      # short simulation: this share of the requests (at least SHORT_MIN)
SHORT_MIN = 300
SHORT_MARGIN = 0.10     # short attainment this far below the target: out without the full simulation
_PARAM_KEYS = ("tp", "batch_cap", "kv_dtype", "spec_k", "chunk_tokens")
_LAYOUT_KEYS = ("layout", "pp", "ep", "dp_attention")


@dataclass(frozen=True)
class Probe:
    """One simulation of one config at one per-replica rate (req/s)."""

    config: str
    rate_req_s: float
    n_requests: int
    attainment: float
    meets: bool
    rejected: int = 0
    reason: str = ""     # why it misses, when it does (zero-load probes)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> "Probe":
        return cls(**d)


@dataclass(frozen=True)
class Outcome:
    """What the race concluded about one config: ``verified`` (``verification`` holds
    ``optimizer.verify.verify``'s record), or out with a reason: ``never_fits`` (some requests exceed its whole KV pool),
    ``zero_load`` (misses even alone),
    ``pruned`` (cannot beat the best, by its capacity bound or its TP), ``beaten`` (misses the
    rate it would need, simulated)."""

    params: tuple        # ((key, value), ...) in _PARAM_KEYS order
    status: str
    reason: str
    simulations: int
    verification: Verification | None = None

    @property
    def config(self) -> dict:
        return dict(self.params)

    def to_json(self) -> dict:
        return {"config": self.config, "status": self.status, "reason": self.reason,
                "simulations": self.simulations,
                "verification": self.verification.to_json() if self.verification is not None else None}

    @classmethod
    def from_json(cls, d: dict) -> "Outcome":
        v = d.get("verification")
        return cls(_freeze(d["config"]), d["status"], d["reason"], d["simulations"],
                   Verification.from_json(v) if v is not None else None)


def _freeze(p: dict) -> tuple:
    """A config as a tuple: the search keys, then a multi-node layout's keys (``optimizer.layouts``)."""
    return tuple((k, p[k]) for k in _PARAM_KEYS) + tuple((k, p[k]) for k in _LAYOUT_KEYS if k in p)


@dataclass(frozen=True)
class Race:
    """The race's result: every fitting config's outcome, in lattice order, and how much it simulated."""

    outcomes: tuple
    simulations: int
    zero_load: tuple     # Probe per (tp, kv, k, chunk) group, in lattice order
    no_fit: tuple = ()   # (config key, why it does not fit in memory) for the rest of the lattice
    work_items: int = 0  # distinct simulation jobs (probes and verifications) the race ran

    @property
    def verified(self) -> list[Verification]:
        return [o.verification for o in self.outcomes if o.status == "verified" and o.verification is not None]

    def counts(self) -> dict:
        out: dict = {}
        for o in self.outcomes:
            out[o.status] = out.get(o.status, 0) + 1
        return out


# ---- work items: what a runner executes ---------------------------------------------------------
@dataclass(frozen=True)
class Work:
    """One simulation job: ``probe`` (one simulation at ``rate_req_s`` with ``n_requests``) or
    ``verify`` (``optimizer.verify.verify_config``: a config verifies the same whichever stage asks)."""

    kind: str
    params: tuple
    rate_req_s: float = 0.0
    n_requests: int = 0

    @property
    def key(self) -> str:
        p = dict(self.params)
        if self.kind == "verify":
            return "verify:" + config_key(p)
        return f"probe:{config_key(p)}@{self.rate_req_s:.9g}x{self.n_requests}"

    def to_json(self) -> dict:
        return {**asdict(self), "params": dict(self.params)}

    @classmethod
    def from_json(cls, d: dict) -> "Work":
        return cls(**{**d, "params": _freeze(d["params"])})


def execute(ctx: SolveContext, w: Work) -> dict:
    """Run one work item: a JSON-able result (a ``Probe``'s or ``verify``'s record)."""
    p = dict(w.params)
    if w.kind == "verify":
        return verify_config(ctx, p).to_json()
    from kvtune.costmodel.simulate import simulate
    sm = _step(ctx, p)
    seed = ctx.workload_seed
    req = ctx.spec.requests(w.n_requests, seed, rate_req_s=w.rate_req_s)
    res = simulate(sm, req, sim_config(ctx, p), "trace", seed=seed)
    a = ctx.spec.slo.attainment
    meets = bool(res.slo_attainment >= a)
    return Probe(config_key(p), w.rate_req_s, w.n_requests, float(res.slo_attainment), meets, int(res.rejected),
                 "" if meets else _miss_reason(res, req, a)).to_json()


def _miss_reason(res, req, attainment: float) -> str:
    """Why a simulation misses the target: the SLO that more requests miss, at the attainment
    percentile, against its target; requests that never fit the KV pool."""
    m = res.measured & ~np.isinf(res.ttft_s)
    parts = []
    q = 100 * attainment
    if m.any():
        ttft, tpot = res.ttft_s[m], res.tpot_s[m]
        miss_ttft = ~(ttft <= req.ttft_slo_s[m])
        miss_tpot = (req.output_tokens[m] > 1) & ~(tpot <= req.tpot_slo_s[m])
        if miss_ttft.any():
            long_in = int(np.percentile(req.input_tokens[m], q))
            size = f"{long_in / 1e3:,.0f}k" if long_in >= 10_000 else f"{long_in:,}"
            parts.append(f"TTFT p{q:g} {np.percentile(ttft, q) * 1e3:,.0f} ms > {np.median(req.ttft_slo_s[m]) * 1e3:,.0f} ms "
                         f"({miss_ttft.mean():.0%} of requests miss it; the p{q:g} prompt is {size} tokens)")
        if miss_tpot.any():
            tp = tpot[~np.isnan(tpot)]
            parts.append(f"TPOT p{q:g} {np.percentile(tp, q) * 1e3:.1f} ms > {np.median(req.tpot_slo_s[m]) * 1e3:.1f} ms "
                         f"({miss_tpot.mean():.0%} of requests miss it)")
    if res.rejected:
        parts.append(res.reject_reason or f"{res.rejected} requests never fit the KV pool")
    return "; ".join(parts) or f"attainment {res.slo_attainment:.3f} < {attainment:g}"


_POOL_CTX: SolveContext | None = None  # the context forked pool processes work on


def _pool_execute(w: "Work") -> dict:
    assert _POOL_CTX is not None, "set by LocalRunner before the pool forks"
    return execute(_POOL_CTX, w)


def _pool_screen(params: dict) -> Evaluation:
    assert _POOL_CTX is not None, "set by LocalRunner before the pool forks"
    return evaluate(_POOL_CTX, params)


class LocalRunner:
    """Runs work items on this machine: in this process, or with ``jobs`` > 1 on that many forked
    processes (each item is independent; results come back in order). Remembers results, so a
    verification asked twice is simulated once. Use as a context manager to close the pool."""

    def __init__(self, ctx: SolveContext, jobs: int = 1):
        self.ctx = ctx
        self.cache: dict[str, dict] = {}
        self.jobs = max(1, int(jobs))
        self._pool = None

    def _get_pool(self):
        if self._pool is None and self.jobs > 1:
            import multiprocessing as mp
            global _POOL_CTX
            _POOL_CTX = self.ctx
            self._pool = mp.get_context("fork").Pool(self.jobs)
        return self._pool

    def screen(self, configs: list[dict]) -> list[Evaluation]:
        pool = self._get_pool() if len(configs) > 64 else None
        if pool is None:
            return [evaluate(self.ctx, p) for p in configs]
        return pool.map(_pool_screen, configs, chunksize=max(1, len(configs) // (4 * self.jobs)))

    def run(self, items: list[Work]) -> list[dict]:
        todo = list({w.key: w for w in items if w.key not in self.cache}.values())
        pool = self._get_pool() if len(todo) > 1 else None
        if pool is None:
            for w in todo:
                self.cache[w.key] = execute(self.ctx, w)
        else:
            # the longest first (verifications), so the last to finish is a short one
            todo.sort(key=lambda w: (w.kind != "verify", -w.n_requests))
            for w, r in zip(todo, pool.imap(_pool_execute, todo, chunksize=1)):
                self.cache[w.key] = r
        return [self.cache[w.key] for w in items]

    def close(self) -> None:
        if self._pool is not None:
            self._pool.terminate()
            self._pool = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# ---- requests that can never fit -------------------------------------------------------------------
NEVER_FIT_SAMPLE = 6000  # requests drawn to find the workload's largest (the most any simulation here uses)
NEVER_FIT_CHECK = 4      # the largest this many (prompt + output) are run alone through the simulator


def _largest_requests(ctx: SolveContext):
    from dataclasses import replace
    req = ctx.spec.requests(NEVER_FIT_SAMPLE, ctx.workload_seed, rate_req_s=1.0)
    k = min(NEVER_FIT_CHECK, len(req))
    idx = np.sort(np.argsort(req.input_tokens + req.output_tokens, kind="stable")[-k:])
    cols = {f: getattr(req, f)[idx] for f in ("input_tokens", "output_tokens", "ttft_slo_s", "tpot_slo_s", "class_idx")}
    return replace(req, arrival_s=np.arange(k, dtype=float) * 1e6, prefix_tokens=np.zeros(k, dtype=np.int64),
                   prefix_group=np.full(k, -1, dtype=np.int64), **cols)


def never_fit_reason(ctx: SolveContext, params: dict) -> str:
    """Why some of the workload's requests can never be served on this config (their prompt plus
    output exceed the whole KV pool, so the engine refuses them), or "" if all fit: the largest
    requests of a ``NEVER_FIT_SAMPLE`` draw, run alone through the simulator. Such a config is
    never recommended, whatever its attainment: a deployment would refuse those requests."""
    from kvtune.costmodel.simulate import simulate
    key = ("never_fit", params["tp"], params.get("layout"), params["kv_dtype"], params["spec_k"])
    cache = ctx.memo
    if key not in cache:
        if "largest" not in cache:
            cache["largest"] = _largest_requests(ctx)
        sm = _step(ctx, params)
        res = simulate(sm, cache["largest"], sim_config(ctx, params), "trace", seed=ctx.workload_seed, warmup_frac=0.0)
        cache[key] = (f"the workload's largest requests can never fit the KV pool ({res.reject_reason}; of "
                      f"{NEVER_FIT_SAMPLE:,} drawn)") if res.rejected else ""
    return cache[key]


# ---- the candidates and their order --------------------------------------------------------------
def _step(ctx: SolveContext, p: dict):
    return ctx.step(p["tp"], p["kv_dtype"], p["spec_k"], p.get("layout"))


def lattice_configs(ctx: SolveContext) -> list[dict]:
    """Every config of the search space (``grid_space``): TP, or a multi-node layout's whole
    parallelism (``optimizer.layouts``), x KV dtype x speculation length x batch cap x chunk."""
    space = grid_space(ctx)
    out = []
    for vals in itertools.product(*space.values()):
        p = dict(zip(space, vals))
        p.setdefault("spec_k", 0)
        if "layout" in p:
            p.update(ctx.layouts[p["layout"]])
        out.append({k: p[k] for k in (*_PARAM_KEYS, *_LAYOUT_KEYS) if k in p})
    return out


def candidates(ctx: SolveContext, runner=None) -> tuple[list[Evaluation], list[Evaluation]]:
    """(screen evaluations of the configs that fit in memory, of those that do not), in lattice order."""
    configs = lattice_configs(ctx)
    evs = runner.screen(configs) if runner is not None and hasattr(runner, "screen") else \
        [evaluate(ctx, p) for p in configs]
    return [e for e in evs if e.fits], [e for e in evs if not e.fits]


def _prior(ctx: SolveContext, ev: Evaluation) -> tuple:
    """Race order: the screen's objective for screen-feasible configs, then the rest by
    decode-bound capacity per GPU; the config key breaks ties."""
    p = ev.params
    if ev.feasible:
        return (0, ev.value, config_key(p))
    return (1, -_capacity(ctx, p) / gpus_per_replica(p), config_key(p))


def _capacity(ctx: SolveContext, p: dict) -> float:
    sm = _step(ctx, p)
    return capacity_bound_req_s(sm, ctx.stats.mean_input_tokens, ctx.stats.mean_output_tokens, p["batch_cap"])


def _n(ctx: SolveContext, ev: Evaluation) -> int:
    return config_requests(ctx, ev.params)


# ---- what it takes to beat the best --------------------------------------------------------------
def rank(ctx: SolveContext, v: Verification) -> tuple:
    """Verified feasible configs, best first: min_cost by $/h, then bf16 KV over fp8 at equal cost
    (when both are searched), then goodput; max_goodput by goodput per $. The config key last, so
    the order never depends on which stage verified them."""
    p = v.params
    if ctx.spec.objective == "max_goodput":
        return (-v.per_replica_goodput_req_s / gpus_per_replica(p), v.usd_per_hour, config_key(p))
    fp8_last = p["kv_dtype"] != "bf16" and _both_dtypes(ctx)
    return (v.usd_per_hour, fp8_last, -(v.goodput_req_s or 0.0), gpus_per_replica(p), config_key(p))


def _both_dtypes(ctx: SolveContext) -> bool:
    kv = ctx.spec.search.kv_dtype
    return "bf16" in kv and any(k != "bf16" for k in kv)


def replicas_bound(ctx: SolveContext, p: dict) -> int:
    """The most replicas config ``p`` could need for the target rate (min_cost): its group met
    the SLOs at zero load, simulated at ``ZERO_LOAD_SHARE`` x the decode-bound capacity of its
    largest batch cap, which is at least that share of ``p``'s own (capacity does not fall with
    the batch cap); attainment only falls with load, so each of ``rate / (ZERO_LOAD_SHARE x
    capacity)`` replicas serves at a rate already shown to meet. Its cheapest deployment needs
    no more, so no bar is set below that rate, however many more GPUs hardware.max_nodes offers:
    the race is the same for max_nodes 10,000 and 100,000 (``tests/test_search_cost.py``)."""
    return max(1, math.ceil(ctx.rate_req_s / (ZERO_LOAD_SHARE * _capacity(ctx, p))))


def bar_req_s(ctx: SolveContext, p: dict, best: Verification | None) -> tuple[float | None, int, str]:
    """(per-replica rate config ``p`` must serve to beat ``best``, the replicas it would then
    take, what it would beat); rate None: it cannot beat it at any rate.

    min_cost: ``best`` holds ``params``, ``gpus`` and ``usd_per_hour``. ``p`` beats it on fewer
    GPUs, or, bf16 KV against fp8 KV, on as many. With no best yet, the bar is the rate on the
    most replicas max_nodes allows. max_goodput: ``best`` is a verification; ``p`` beats it with
    more goodput per GPU (by the bisection tolerance)."""
    tp = gpus_per_replica(p)    # GPUs per replica (TP x PP)
    if ctx.spec.objective == "max_goodput":
        if best is None:
            return None, 0, "no config verified yet"
        q = best.per_replica_goodput_req_s / gpus_per_replica(best.params)
        return q * tp * (1 + REL_TOL), ctx.max_gpus // tp, f"{q:.3g} req/s per GPU of {config_key(best.params)}"
    rate = ctx.rate_req_s
    if best is None:
        r = ctx.max_gpus // tp
        if r < 1:
            return None, 0, (f"a replica needs {tp} GPUs > the {ctx.max_gpus} GPUs of hardware.max_nodes "
                             f"{ctx.spec.hardware.max_nodes}")
        need = replicas_bound(ctx, p)
        if need < r:   # max_nodes offers more than this config could use (replicas_bound)
            return rate / need, need, f"the most {tp}-GPU replicas it could need ({need})"
        return rate / r, r, f"the most {tp}-GPU replicas hardware.max_nodes allows ({r})"
    gpus = best.gpus or 0  # a verified best: sized
    why = f"${best.usd_per_hour:.2f}/h ({gpus} GPUs) of {config_key(best.params)}"
    r = (gpus - 1) // tp
    if (gpus % tp == 0 and p["kv_dtype"] == "bf16" and best.params["kv_dtype"] != "bf16"
            and _both_dtypes(ctx)):
        r = gpus // tp                                          # bf16 KV on as many GPUs wins
    if r < 1:
        return None, 0, f"{tp} GPUs per replica cannot beat {why}"
    return rate / r, r, why


# ---- the race --------------------------------------------------------------------------------------
def race(ctx: SolveContext, runner=None, on_stage: Callable[[str, int], None] | None = None,
         seeds: int = SEEDS) -> Race:
    """Zero-load probes, then the race (module docstring). ``runner.run(list[Work])`` returns
    their results in order (``LocalRunner`` or ``optimizer.scaleout.StudyRunner``)."""
    runner = runner or LocalRunner(ctx)
    st = _State(ctx, runner, on_stage)
    fit, nofit = candidates(ctx, runner)
    alive = st.zero_load(fit)
    alive.sort(key=lambda e: _prior(ctx, e))
    if ctx.spec.objective == "max_goodput":
        st.race_goodput(alive, seeds)
    else:
        st.race_cost(alive)
    order = {config_key(ev.params): i for i, ev in enumerate(fit)}
    outs = tuple(sorted(st.outcomes.values(), key=lambda o: order[config_key(o.config)]))
    return Race(outs, st.sims, tuple(st.zl), tuple((config_key(e.params), e.reason) for e in nofit),
                len(st.keys))


class _State:
    """The race's bookkeeping: outcomes, the best so far, simulations spent."""

    def __init__(self, ctx: SolveContext, runner, on_stage):
        self.ctx, self.runner, self.on_stage = ctx, runner, on_stage
        self.outcomes: dict[str, Outcome] = {}
        self.sims = 0
        self.zl: list[Probe] = []
        self.best: Verification | None = None
        self.spent: dict[str, int] = {}
        self.a = ctx.spec.slo.attainment
        self.keys: set[str] = set()

    def stage(self, name: str, n: int) -> None:
        if self.on_stage:
            self.on_stage(name, n)

    def probe(self, items: list[tuple[dict, float, int]]) -> list[Probe]:
        work = [Work("probe", _freeze(p), rate, n) for p, rate, n in items]
        self.keys.update(w.key for w in work)
        res = [Probe.from_json(r) for r in self.runner.run(work)]
        self.sims += len(res)
        for p, _, _ in items:
            self.spent[config_key(p)] = self.spent.get(config_key(p), 0) + 1
        return res

    def verify(self, evs: list[Evaluation]) -> list[Verification]:
        work = [Work("verify", _freeze(ev.params)) for ev in evs]
        self.keys.update(w.key for w in work)
        res = [Verification.from_json(d) for d in self.runner.run(work)]
        for ev, v in zip(evs, res):
            k = config_key(ev.params)
            self.sims += v.simulations
            self.spent[k] = self.spent.get(k, 0) + v.simulations
            self.outcomes[k] = Outcome(_freeze(ev.params), "verified", "" if v.feasible else v.reason,
                                       self.spent[k], v)
        return res

    def out(self, ev: Evaluation, status: str, reason: str) -> None:
        k = config_key(ev.params)
        self.outcomes[k] = Outcome(_freeze(ev.params), status, reason, self.spent.get(k, 0))

    # 1. zero load, per (tp, kv, k, chunk) group: the largest batch cap stands for the group
    def zero_load(self, fit: list[Evaluation]) -> list[Evaluation]:
        ctx, a = self.ctx, self.a
        groups: dict[tuple, list[Evaluation]] = {}
        for ev in fit:
            why = never_fit_reason(ctx, ev.params)
            if why:
                self.out(ev, "never_fits", why)
                continue
            p = ev.params
            groups.setdefault((p["tp"], p.get("layout"), p["kv_dtype"], p["spec_k"], p["chunk_tokens"]), []).append(ev)
        # a short probe first; the full one only where the short one is not clearly in or out
        n_zl = sim_requests(a, 1)
        n_short = min(n_zl, SHORT_MIN)
        reps = [max(g, key=lambda e: e.params["batch_cap"]).params for g in groups.values()]
        rates = [ZERO_LOAD_SHARE * _capacity(ctx, p) for p in reps]
        self.stage("zero load", len(reps))
        zl = self.probe([(p, r, n_short) for p, r in zip(reps, rates)])
        again = [i for i, pr in enumerate(zl) if a - SHORT_MARGIN <= pr.attainment < 1.0 and n_short < n_zl]
        for i, pr in zip(again, self.probe([(reps[i], rates[i], n_zl) for i in again])):
            zl[i] = pr
        self.zl = zl
        alive = []
        for g, pr in zip(groups.values(), zl):
            for ev in g:
                if pr.meets:
                    alive.append(ev)
                else:
                    self.out(ev, "zero_load", f"misses at zero load (attainment {pr.attainment:.3f} < {a:g}): {pr.reason}")
        return alive

    def screen_bar(self, chunk: list[Evaluation]) -> list[tuple[Evaluation, float, int, str]]:
        """Each config's bar against the best; those that cannot beat it, or whose capacity bound
        says they cannot, are out here without a simulation."""
        keep = []
        for ev in chunk:
            p = ev.params
            bar, r, why = bar_req_s(self.ctx, p, self.best)
            if bar is None:
                self.out(ev, "pruned", why)
                continue
            cap = _capacity(self.ctx, p)
            if cap * CAPACITY_SLACK < bar:
                self.out(ev, "pruned", f"decode-bound capacity {cap:.3g} req/s x {CAPACITY_SLACK:g} < the "
                                       f"{bar:.3g} req/s per replica it needs to beat {why}")
                continue
            keep.append((ev, bar, r, why))
        return keep

    def meets_bar(self, cands: list[tuple[Evaluation, float, int, str]]) -> list[tuple[Evaluation, float, int, str]]:
        """Short simulations at the bar, then full ones for the configs not clearly out: those that meet."""
        ctx, a = self.ctx, self.a
        ns = [max(SHORT_MIN, int(SHORT_SHARE * _n(ctx, ev))) for ev, _, _, _ in cands]
        short = self.probe([(ev.params, bar, n) for (ev, bar, _, _), n in zip(cands, ns)])
        full, done = [], {}
        for c, pr, n in zip(cands, short, ns):
            ev, bar, _, why = c
            if n >= _n(ctx, ev):
                done[config_key(ev.params)] = pr
            elif pr.attainment < a - SHORT_MARGIN:
                self.out(ev, "beaten", f"attainment {pr.attainment:.3f} at {bar:.3g} req/s per replica "
                                       f"({n} requests): cannot beat {why}")
                continue
            else:
                full.append(c)
        for (ev, _, _, _), pr in zip(full, self.probe([(ev.params, bar, _n(ctx, ev)) for ev, bar, _, _ in full])):
            done[config_key(ev.params)] = pr
        winners = []
        for c in cands:
            got = done.get(config_key(c[0].params))
            if got is None:
                continue
            pr = got
            if pr.meets:
                winners.append(c)
            else:
                self.out(c[0], "beaten", f"attainment {pr.attainment:.3f} at {c[1]:.3g} req/s per replica: cannot beat {c[3]}")
        return winners

    def race_cost(self, alive: list[Evaluation]) -> None:
        """min_cost: every config against the cheapest verified deployment so far. A config that
        meets the rate it needs is verified (goodput bisected, replicas sized), and becomes the
        best if its verification says it is: the best is always a verified deployment, so no
        config is ever judged against one that would not hold."""
        ctx = self.ctx
        for i in range(0, len(alive), BATCH):
            self.stage("race", len(alive[i:i + BATCH]))
            for ev, bar, r, _why in self.meets_bar(self.screen_bar(alive[i:i + BATCH])):
                p = ev.params
                bar2, r2, why2 = bar_req_s(ctx, p, self.best)
                if bar2 is None:                      # an earlier winner of this batch is cheaper
                    self.out(ev, "beaten", f"meets {bar:.3g} req/s per replica, but {why2}")
                    continue
                if r2 < r:                            # ... so it must serve more per replica
                    pr = self.probe([(p, bar2, _n(ctx, ev))])[0]
                    if not pr.meets:
                        self.out(ev, "beaten", f"attainment {pr.attainment:.3f} at {bar2:.3g} req/s per replica: "
                                               f"cannot beat {why2}")
                        continue
                # no sizing by probes: the verification bisects the goodput and sizes the replicas
                # (a probe per replica fewer cost a simulation per replica max_nodes offered beyond
                # the need, and the count it found was not used)
                v = self.verify([ev])[0]
                if v.feasible and (self.best is None or rank(ctx, v) < rank(ctx, self.best)):
                    self.best = v

    def race_goodput(self, alive: list[Evaluation], n_seeds: int) -> None:
        """max_goodput: seeds verified, then every config against the best goodput per GPU."""
        seeds, structs = [], set()
        for ev in alive:
            s = (ev.params["tp"], ev.params.get("layout"), ev.params["kv_dtype"], ev.params["spec_k"])
            if s not in structs:
                structs.add(s)
                seeds.append(ev)
            if len(seeds) >= n_seeds:
                break
        self.stage("seeds", len(seeds))
        self._take(seeds, self.verify(seeds))
        rest = [ev for ev in alive if config_key(ev.params) not in self.outcomes]
        for i in range(0, len(rest), BATCH):
            chunk = rest[i:i + BATCH]
            self.stage("race", len(chunk))
            if self.best is None:                  # nothing to beat yet: each met the SLOs at zero load
                self._take(chunk, self.verify(chunk))
                continue
            winners = [c[0] for c in self.meets_bar(self.screen_bar(chunk))]
            self._take(winners, self.verify(winners))

    def _take(self, evs: list[Evaluation], res: list[Verification]) -> None:
        for v in res:
            if v.feasible and (self.best is None or rank(self.ctx, v) < rank(self.ctx, self.best)):
                self.best = v
