"""``kvtune tune`` against a blind measured search on the same engine and budget (issue 21, must
show 2): how many real runs each needs to reach a config within 5% of the best measured goodput.

- **truth**: every config of the workload's lattice (batch cap x chunk budget) measured on the
  engine: its goodput bisected over open-loop runs of ``--run-s`` seconds (the highest rate whose
  measured attainment meets the target, to ``--tol``). Cached in ``--truth`` (JSON) by config.
- **tune**: ``optimizer.tune.Tuner`` from no calibration (a profile grid, then rounds); after
  each round its answer is the round's pick.
- **blind**: optuna's TPE sampler over the same lattice (as ``auto-tune-vllm`` does over vLLM's
  flags): each trial starts the engine with a config and climbs a rate ladder (x ``--ladder`` from
  ``--ladder-start`` req/s) until a run misses; its answer is the config with the best measured
  goodput so far.

A method has reached the best when its answer's *true* goodput is within 5% of the best true
goodput. The engine is the fake engine (tests/fake_engine.py: a hidden cost function, real
HTTP, real sleeps) by default, or llama.cpp's ``llama-server`` (``--engine llamacpp``; the
truth table then costs ~1 h of engine time on the 2-core machine: run it on a quiet one).

Usage: python bench/bench_tune.py [--engine fake|llamacpp] [--run-s 8] [-o bench/RESULTS-tune.md]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MAX_LADDER = 32.0    # the blind ladder never climbs past this many times its start
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "bench"))


def _load() -> float:
    return round(os.getloadavg()[0], 2)


def _cfg_id(c: dict) -> str:
    from kvtune.optimizer.tune_records import config_id
    return config_id(c)


class Engine:
    """Starts a config and measures attainment at a rate (counting runs and engine time)."""

    def __init__(self, adapter, spec, run_s: float, seed: int):
        self.adapter, self.spec, self.run_s, self.seed = adapter, spec, run_s, seed
        self.runs, self.engine_s = 0, 0.0
        self.log: list[dict] = []    # every run: rate, attainment, wall seconds, the machine's load average
        from kvtune.optimizer.search import SolveContext
        self.ctx = SolveContext.build(spec, None, "ideal", "llamacpp")

    def pick(self, cfg: dict):
        from kvtune.optimizer.launch.pick import build_pick
        from kvtune.optimizer.tune import max_request_tokens
        return build_pick(self.ctx.model.hf_id, cfg, 1, self.spec.gpu_mem_util, None, arch=self.ctx.model,
                          gpu=self.ctx.gpu, weights=self.spec.weights, gpus_per_node=1,
                          max_request_tokens=max_request_tokens(self.spec))

    @contextlib.contextmanager
    def up(self, cfg: dict):
        t0 = time.monotonic()
        try:
            with self.adapter.running(self.pick(cfg)) as eng:
                yield eng
        finally:
            self.engine_s += time.monotonic() - t0

    def attainment(self, eng, rate: float) -> float:
        from kvtune.optimizer.loadgen import OpenLoopPlan, run_open_loop
        n = max(30, math.ceil(rate * self.run_s))
        warm = max(4, math.ceil(0.1 * n))
        plan = OpenLoopPlan.from_workload(self.spec, rate, n + warm, self.seed, warm)
        t0 = time.monotonic()
        run = run_open_loop(eng.url, eng.served_model, plan, timeout_s=300)
        self.runs += 1
        self.log.append({"rate": rate, "attainment": run.attainment().value, "wall_s": round(time.monotonic() - t0, 2),
                         "loadavg_1m": _load()})
        return run.attainment().value


def goodput(engine: Engine, eng, start: float, factor: float, tol: float, max_runs: int = 12) -> tuple[float, list]:
    """Climb x ``factor`` from ``start`` until a miss, then bisect to ``tol``: (goodput, [(rate, att)])."""
    target = engine.spec.slo.attainment
    hist: list[tuple[float, float]] = []
    lo, hi, r = 0.0, math.inf, start
    while len(hist) < max_runs:
        a = engine.attainment(eng, r)
        hist.append((r, a))
        if a >= target:   # NaN (nothing counted) is a miss
            lo = r
        else:
            hi = r
        if math.isinf(hi):
            r *= factor
        elif lo == 0.0:
            r /= factor
        elif hi / lo - 1 <= tol:
            break
        else:
            r = math.sqrt(lo * hi)
    return lo, hist


# ---- parallel workers (fork: each builds its own adapter from _CTX, set in main) ----
_CTX: dict = {}


def _adapter(tag: str):
    from kvtune.optimizer.adapters import LocalAdapter
    return LocalAdapter("llamacpp", binary=_CTX["binary"], model=_CTX["model"], threads=1,
                        log_dir=_CTX["tmp"] / f"logs-{tag}")


def _truth_one(cfg: dict) -> tuple[str, dict]:
    key = _cfg_id(cfg)
    engine = Engine(_adapter(f"truth-{key}"), _CTX["spec"], _CTX["truth_run_s"], 0)
    t0 = time.monotonic()
    with engine.up(cfg) as eng:
        g, hist = goodput(engine, eng, _CTX["truth_start"], 1.5, _CTX["tol"])
    return key, {"goodput_req_s": g, "runs": hist, "engine_s": round(engine.engine_s, 1),
                 "wall_s": round(time.monotonic() - t0, 1), "log": engine.log}


def truth_table(configs: list[dict], path: Path, jobs: int) -> dict[str, float]:
    """Every config's goodput bisected to ``--tol`` (cached by config in ``path``), ``jobs`` configs at once
    (each on its own engine and port)."""
    from concurrent.futures import ProcessPoolExecutor, as_completed
    table = json.loads(path.read_text()) if path.exists() else {}
    todo = [c for c in configs if _cfg_id(c) not in table]
    with ProcessPoolExecutor(max_workers=max(1, jobs)) as ex:
        for fut in as_completed([ex.submit(_truth_one, c) for c in todo]):
            key, rec = fut.result()
            table[key] = rec
            path.write_text(json.dumps(table, indent=1))
            print(f"truth {key}: {rec['goodput_req_s']:.3g} req/s ({len(rec['runs'])} runs, load "
                  f"{min(r['loadavg_1m'] for r in rec['log']):.2f}-{max(r['loadavg_1m'] for r in rec['log']):.2f}) "
                  f"[{len(table)}/{len(configs)}]", file=sys.stderr, flush=True)
    return {_cfg_id(c): table[_cfg_id(c)]["goodput_req_s"] for c in configs}


def run_tune(spec, adapter, run_s: float, budget: int, seed: int, log, near: int = 0
             ) -> tuple[list[tuple[int, float, str]], dict]:
    """(runs used, engine seconds used, pick) after each round, and the result. ``near``: tune's
    --near (the configs the simulator ranks next, measured at 1.0x each round; kvtune tune's default 2)."""
    from kvtune.optimizer.tune import TuneSettings, Tuner
    from kvtune.optimizer.tune_store import TuneStore
    with tempfile.TemporaryDirectory() as tmp:
        store = TuneStore(None, "bench", "bench")
        settings = TuneSettings(max_runs=budget, max_engine_s=1e9, run_s=run_s, min_requests=30, near=near,
                                max_rounds=8, seed=seed)
        t = Tuner(spec, adapter, settings, store, Path(tmp), log, threads=1)
        trace: list[tuple[int, float, str]] = []
        orig = t._round

        def tracked(n):
            rnd = orig(n)
            trace.append((t.runs_used, round(t.engine_s_used, 1), _cfg_id(rnd.pick)))
            return rnd
        t._round = tracked   # type: ignore[method-assign]
        res = t.run()
        loads = [r.get("loadavg_1m") for j in res.to_json().get("jobs", []) for r in j.get("runs", [])
                 if isinstance(r, dict) and r.get("loadavg_1m") is not None]
    out = res.to_json()
    out["_loads"] = loads
    return trace, out


def run_blind(engine: Engine, configs: list[dict], budget: int, seed: int, start: float, factor: float,
              truth: dict[str, float], mode: str = "ladder", tol: float = 0.05, sampler: str = "tpe",
              stop_at: float | None = None) -> list[tuple[int, float, str]]:
    """A blind search over the lattice: (runs used, engine seconds used, best config) after each trial.
    ``sampler``: optuna's TPE or uniform random (optuna's RandomSampler; it may draw a config again:
    a repeat costs no runs). Each trial measures its config's goodput by a rate ladder (``mode``
    ladder: up x ``factor`` until a miss) or by the truth table's bisection to ``tol`` (``mode``
    bisect: finer, more runs per trial). ``stop_at``: stop once the best measured config's true
    goodput is at least this (the runs to reach it are all the bench reports)."""
    import optuna
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    axes = {k: sorted({c[k] for c in configs}) for k in ("batch_cap", "chunk_tokens", "kv_dtype")}
    # TPE's first trials are optuna's RandomSampler on the same seed: the random search draws on
    # seed + 1000, or its first trials would be TPE's, config for config
    smp = optuna.samplers.TPESampler(seed=seed) if sampler == "tpe" else optuna.samplers.RandomSampler(seed=seed + 1000)
    study = optuna.create_study(direction="maximize", sampler=smp)
    base = dict(configs[0])
    trace: list[tuple[int, float, str]] = []
    best: tuple[float, str] = (-1.0, "")
    seen: dict[str, float] = {}
    while engine.runs < budget and len(seen) < len(configs) and len(study.trials) < 50 * len(configs):
        trial = study.ask()   # (TPE asks again for configs already measured: they cost no runs)
        cfg = dict(base, **{k: trial.suggest_categorical(k, v) for k, v in axes.items()})
        key = _cfg_id(cfg)
        if key not in seen and mode == "bisect":
            with engine.up(cfg) as eng:
                seen[key], _ = goodput(engine, eng, start, factor, tol, max_runs=budget - engine.runs)
            print(f"{sampler} seed {seed}: {key}: bisected {seen[key]:.3g} req/s ({engine.runs} runs so far)",
                  file=sys.stderr, flush=True)
        elif key not in seen:
            with engine.up(cfg) as eng:
                hist: list[tuple[float, float]] = []
                r = start
                while engine.runs < budget and r <= MAX_LADDER * start:   # the ladder: up until a miss
                    a = engine.attainment(eng, r)
                    hist.append((r, a))
                    if not a >= engine.spec.slo.attainment:   # a miss (or no request counted)
                        break
                    r *= factor
            print(f"{sampler} seed {seed}: {key}: ladder {[(round(x, 3), round(y, 3)) for x, y in hist]} "
                  f"({engine.runs} runs so far)", file=sys.stderr, flush=True)
            seen[key] = max([x for x, a in hist if a >= engine.spec.slo.attainment], default=0.0)
        study.tell(trial, seen[key])
        if seen[key] > best[0]:
            best = (seen[key], key)
        trace.append((engine.runs, round(engine.engine_s, 1), best[1]))
        if stop_at is not None and truth.get(best[1], 0.0) >= stop_at:
            break
    return trace


def reached(trace: list[tuple[int, float, str]], truth: dict[str, float], within: float = 0.05
            ) -> tuple[int, float] | None:
    """(runs, engine seconds) when the trace's answer first came within ``within`` of the best true goodput."""
    top = max(truth.values())
    for runs, secs, key in trace:
        if truth.get(key, 0.0) >= (1 - within) * top:
            return runs, secs
    return None


def _method_one(task: tuple[str, int]) -> dict:
    """One (method, seed): tune, or a blind search (tpe/random); its trace and what it reached."""
    method, seed = task
    a, spec, truth = _CTX["args"], _CTX["spec"], _CTX["truth"]
    t0, l0 = time.monotonic(), _load()
    adapter = _adapter(f"{method}-{seed}")
    if method == "tune":
        logf = open(_CTX["tmp"] / f"tune-{seed}.log", "w")
        trace, res = run_tune(spec, adapter, a.run_s, a.budget, seed, lambda m: print(m, file=logf, flush=True),
                              near=a.near)
        logf.close()
        runs_used, status, loads = res["runs"], res["status"], res.pop("_loads", [])
    else:
        engine = Engine(adapter, spec, a.run_s, seed)
        top = max(truth.values())
        trace = run_blind(engine, _CTX["configs"], a.blind_budget, seed, a.ladder_start, a.ladder, truth, a.blind,
                          a.tol, sampler=method, stop_at=(1 - 0.05) * top if a.stop_at_reach else None)
        runs_used, status, loads = engine.runs, "-", [r["loadavg_1m"] for r in engine.log]
    hit = reached(trace, truth)
    row = {"method": method, "seed": seed, "reached_runs": hit[0] if hit else None,
           "reached_engine_s": hit[1] if hit else None, "answer": trace[-1][2] if trace else "-",
           "runs_used": runs_used, "status": status, "trace": trace, "wall_s": round(time.monotonic() - t0, 1),
           "load_start": l0, "load_end": _load(),
           "load_min": min(loads, default=None), "load_max": max(loads, default=None)}
    print(f"{method} seed {seed}: reached {hit} (runs used {runs_used}, answer {row['answer']})",
          file=sys.stderr, flush=True)
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--engine", choices=("fake", "llamacpp"), default="fake")
    ap.add_argument("--server-bin", default=None)
    ap.add_argument("--model-gguf", default=None)
    ap.add_argument("--workload", default=None, help="default: the fake engine's workload (tests/fake_engine.py)")
    ap.add_argument("--fake-cost", type=Path, default=None,
                    help="a JSON file: the fake engine's hidden cost (KVTUNE_FAKE_COST), e.g. bench/bench_tune_fake72_cost.json")
    ap.add_argument("--run-s", type=float, default=8.0)
    ap.add_argument("--truth-run-s", type=float, default=None, help="the truth table's run length (default --run-s)")
    ap.add_argument("--truth-start", type=float, default=None, help="the truth bisection's first rate (default --ladder-start)")
    ap.add_argument("--budget", type=int, default=40, help="real runs tune may use")
    ap.add_argument("--blind-budget", type=int, default=None, help="real runs each blind search may use (default --budget)")
    ap.add_argument("--near", type=int, default=0, help="tune's --near (kvtune tune's default is 2; this bench's was 0)")
    ap.add_argument("--tol", type=float, default=0.05)
    ap.add_argument("--ladder-start", type=float, default=2.0)
    ap.add_argument("--ladder", type=float, default=1.5)
    ap.add_argument("--seeds", default="0,1,2", help="seeds: one tune and one blind search per method per seed")
    ap.add_argument("--methods", default="tune,tpe", help="of tune, tpe (optuna TPE), random (optuna RandomSampler)")
    ap.add_argument("--blind", choices=("ladder", "bisect"), default="ladder",
                    help="how a blind trial measures a config's goodput: a x --ladder rate ladder, or bisection to --tol")
    ap.add_argument("--stop-at-reach", action="store_true",
                    help="end a blind search once its answer is within 5%% of the best true goodput (saves engine time)")
    ap.add_argument("--jobs", type=int, default=1, help="truth configs, and (method, seed) searches, run at once")
    ap.add_argument("--truth", type=Path, default=None, help="truth cache (JSON)")
    ap.add_argument("--rows", type=Path, default=None, help="write every method's row and trace here (JSON)")
    ap.add_argument("-o", "--output", type=Path, default=REPO / "bench" / "RESULTS-tune.md")
    a = ap.parse_args(argv)
    a.blind_budget = a.blind_budget or a.budget

    import fake_engine
    from kvtune.optimizer.search import lattice
    from kvtune.optimizer.workload import load_workload

    tmp = Path(tempfile.mkdtemp(prefix="kvtune-bench-tune-"))
    if a.fake_cost is not None:
        os.environ["KVTUNE_FAKE_COST"] = json.dumps(json.loads(a.fake_cost.read_text()))
    if a.engine == "fake":
        class _MP:
            def setenv(self, k, v):
                os.environ[k] = v
        sh = fake_engine.setup(tmp, _MP())
        binary, model, wl = str(sh["llama-server"]), str(sh["gguf"]), str(a.workload or sh["workload"])
    else:
        from live_server import find_model, find_server
        cache = Path(os.environ.get("KVTUNE_LLAMA_CACHE", "/work/cache/llama"))
        binary = str(find_server(a.server_bin, cache) or "")
        model = str(find_model(a.model_gguf) or "")
        wl = a.workload or str(REPO / "bench" / "tune_demo.yaml")
        if not binary or not model:
            print("error: no llama-server or no GGUF model (see bench/live_server.py)", file=sys.stderr)
            return 2
    spec = load_workload(wl)
    s = spec.search
    configs = [{"tp": 1, "batch_cap": b, "kv_dtype": k, "spec_k": 0, "chunk_tokens": c}
               for k in s.kv_dtype for b in lattice(*s.batch_cap) for c in lattice(*s.chunk_tokens)]
    truth_path = a.truth or (REPO / "bench" / f"bench_tune_truth_{a.engine}.json")
    _CTX.update(binary=binary, model=model, tmp=tmp, spec=spec, tol=a.tol, args=a, configs=configs,
                truth_run_s=a.truth_run_s or a.run_s, truth_start=a.truth_start or a.ladder_start)
    t0 = time.monotonic()
    truth = truth_table(configs, truth_path, a.jobs)
    _CTX["truth"] = truth
    best_key = max(truth, key=truth.__getitem__)
    top = truth[best_key]
    near = sorted(k for k, v in truth.items() if v >= 0.95 * top)
    tasks = [(m, int(x)) for x in a.seeds.split(",") if x.strip() for m in a.methods.split(",") if m.strip()]
    from concurrent.futures import ProcessPoolExecutor
    if a.jobs > 1:
        with ProcessPoolExecutor(max_workers=a.jobs) as ex:
            rows = list(ex.map(_method_one, tasks))
    else:
        rows = [_method_one(t) for t in tasks]
    if a.rows:
        a.rows.write_text(json.dumps({"truth_best": [best_key, top], "within_5pct": near, "rows": rows}, indent=1))
    load = os.getloadavg()[0]
    tt = json.loads(truth_path.read_text())
    truth_loads = [r["loadavg_1m"] for k in truth for r in tt[k].get("log", [])]
    lines = [f"# bench_tune: kvtune tune vs a blind measured search ({a.engine} engine)", "",
             f"Workload `{Path(wl).name}`; {len(configs)} configs (batch cap x chunk budget x KV dtype); runs of "
             f"{a.run_s:g} s of open-loop arrivals (truth: {_CTX['truth_run_s']:g} s); budget {a.budget} runs for tune, "
             f"{a.blind_budget} per blind search. Best measured goodput: {best_key} at {top:.3g} req/s; {len(near)} "
             f"configs within 5% of it (truth table: every config bisected to {a.tol:.0%}, "
             f"{sum(len(tt[k]['runs']) for k in truth)} runs"
             + (f", load average {min(truth_loads):.2f}-{max(truth_loads):.2f}" if truth_loads else "") + "). "
             f"Load average at the end: {load:.2f}; wall {time.monotonic() - t0:.0f} s.", "",
             f"Blind trials measure goodput by {'a x' + format(a.ladder, 'g') + ' rate ladder from ' + format(a.ladder_start, 'g') + ' req/s' if a.blind == 'ladder' else 'bisection to ' + format(a.tol, '.0%')}.", "",
             "| method | seed | runs to within 5% of the best | engine s to within 5% | answer (status) | runs used | load (1 min) |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['method']} | {r['seed']} | {r['reached_runs'] if r['reached_runs'] is not None else 'not reached'} | "
                     f"{r['reached_engine_s'] if r['reached_engine_s'] is not None else '-'} | {r['answer']} ({r['status']}) | "
                     f"{r['runs_used']} | {r['load_min']}-{r['load_max']} |")
    lines += ["", "Truth table (measured goodput, req/s per replica):", "",
              "| config | goodput req/s (measured) |", "|---|---|"]
    lines += [f"| {k} | {v:.3g} |" for k, v in sorted(truth.items(), key=lambda kv: -kv[1])]
    a.output.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
