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


def _cfg_id(c: dict) -> str:
    from kvtune.optimizer.tune_records import config_id
    return config_id(c)


class Engine:
    """Starts a config and measures attainment at a rate (counting runs and engine time)."""

    def __init__(self, adapter, spec, run_s: float, seed: int):
        self.adapter, self.spec, self.run_s, self.seed = adapter, spec, run_s, seed
        self.runs, self.engine_s = 0, 0.0
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
        run = run_open_loop(eng.url, eng.served_model, plan, timeout_s=300)
        self.runs += 1
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


def truth_table(engine: Engine, configs: list[dict], path: Path, start: float, tol: float) -> dict[str, float]:
    table = json.loads(path.read_text()) if path.exists() else {}
    for cfg in configs:
        key = _cfg_id(cfg)
        if key in table:
            continue
        with engine.up(cfg) as eng:
            g, hist = goodput(engine, eng, start, 1.5, tol)
        table[key] = {"goodput_req_s": g, "runs": hist}
        path.write_text(json.dumps(table, indent=1))
        print(f"truth {key}: {g:.3g} req/s ({len(hist)} runs)", file=sys.stderr)
    return {k: v["goodput_req_s"] for k, v in table.items()}


def run_tune(spec, adapter, run_s: float, budget: int, seed: int, log) -> tuple[list[tuple[int, str]], dict]:
    """(runs used, pick) after each round, and the result."""
    from kvtune.optimizer.tune import TuneSettings, Tuner
    from kvtune.optimizer.tune_store import TuneStore
    with tempfile.TemporaryDirectory() as tmp:
        store = TuneStore(None, "bench", "bench")
        settings = TuneSettings(max_runs=budget, max_engine_s=1e9, run_s=run_s, min_requests=30, near=0,
                                max_rounds=8, seed=seed)
        t = Tuner(spec, adapter, settings, store, Path(tmp), log, threads=1)
        trace: list[tuple[int, str]] = []
        orig = t._round

        def tracked(n):
            rnd = orig(n)
            trace.append((t.runs_used, _cfg_id(rnd.pick)))
            return rnd
        t._round = tracked   # type: ignore[method-assign]
        res = t.run()
    return trace, res.to_json()


def run_blind(engine: Engine, configs: list[dict], budget: int, seed: int, start: float, factor: float,
              truth: dict[str, float], mode: str = "ladder", tol: float = 0.05) -> list[tuple[int, str]]:
    """optuna TPE over the lattice: (runs used, best config) after each trial. Each trial measures
    its config's goodput by a rate ladder (``mode`` ladder: up x ``factor`` until a miss) or by the
    truth table's bisection to ``tol`` (``mode`` bisect: finer, more runs per trial)."""
    import optuna
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    caps = sorted({c["batch_cap"] for c in configs})
    chunks = sorted({c["chunk_tokens"] for c in configs})
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=seed))
    base = dict(configs[0])
    trace: list[tuple[int, str]] = []
    best: tuple[float, str] = (-1.0, "")
    seen: dict[str, float] = {}
    while engine.runs < budget and len(seen) < len(configs) and len(study.trials) < 50 * len(configs):
        trial = study.ask()   # (TPE asks again for configs already measured: they cost no runs)
        cfg = dict(base, batch_cap=trial.suggest_categorical("batch_cap", caps),
                   chunk_tokens=trial.suggest_categorical("chunk_tokens", chunks))
        key = _cfg_id(cfg)
        if key not in seen and mode == "bisect":
            with engine.up(cfg) as eng:
                seen[key], hist = goodput(engine, eng, start, factor, tol, max_runs=budget - engine.runs)
            print(f"blind seed {seed}: {key}: bisected {seen[key]:.3g} req/s ({engine.runs} runs so far)", file=sys.stderr)
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
            print(f"blind seed {seed}: {key}: ladder {[(round(x, 3), round(y, 3)) for x, y in hist]} "
                  f"({engine.runs} runs so far)", file=sys.stderr)
            seen[key] = max([x for x, a in hist if a >= engine.spec.slo.attainment], default=0.0)
        study.tell(trial, seen[key])
        if seen[key] > best[0]:
            best = (seen[key], key)
        trace.append((engine.runs, best[1]))
    return trace


def reached(trace: list[tuple[int, str]], truth: dict[str, float], within: float = 0.05) -> int | None:
    top = max(truth.values())
    for runs, key in trace:
        if truth.get(key, 0.0) >= (1 - within) * top:
            return runs
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--engine", choices=("fake", "llamacpp"), default="fake")
    ap.add_argument("--server-bin", default=None)
    ap.add_argument("--model-gguf", default=None)
    ap.add_argument("--workload", default=None, help="default: the fake engine's workload (tests/fake_engine.py)")
    ap.add_argument("--run-s", type=float, default=8.0)
    ap.add_argument("--budget", type=int, default=40, help="real runs each method may use")
    ap.add_argument("--tol", type=float, default=0.05)
    ap.add_argument("--ladder-start", type=float, default=2.0)
    ap.add_argument("--ladder", type=float, default=1.5)
    ap.add_argument("--seeds", default="0,1,2", help="blind search seeds (TPE), one tune per seed")
    ap.add_argument("--blind", choices=("ladder", "bisect"), default="ladder",
                    help="how a blind trial measures a config's goodput: a x --ladder rate ladder, or bisection to --tol")
    ap.add_argument("--truth", type=Path, default=None, help="truth cache (JSON)")
    ap.add_argument("-o", "--output", type=Path, default=REPO / "bench" / "RESULTS-tune.md")
    a = ap.parse_args(argv)

    import fake_engine
    from kvtune.optimizer.adapters import LocalAdapter
    from kvtune.optimizer.search import lattice
    from kvtune.optimizer.workload import load_workload

    tmp = Path(tempfile.mkdtemp(prefix="kvtune-bench-tune-"))
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
    adapter = LocalAdapter("llamacpp", binary=binary, model=model, threads=1, log_dir=tmp / "logs")
    s = spec.search
    configs = [{"tp": 1, "batch_cap": b, "kv_dtype": s.kv_dtype[0], "spec_k": 0, "chunk_tokens": c}
               for b in lattice(*s.batch_cap) for c in lattice(*s.chunk_tokens)]
    truth_path = a.truth or (REPO / "bench" / f"bench_tune_truth_{a.engine}.json")
    t0 = time.monotonic()
    truth_engine = Engine(adapter, spec, a.run_s, 0)
    truth = truth_table(truth_engine, configs, truth_path, a.ladder_start, a.tol)
    best_key = max(truth, key=truth.__getitem__)
    rows = []
    for seed in (int(x) for x in a.seeds.split(",")):
        tune_trace, tune_res = run_tune(spec, adapter, a.run_s, a.budget, seed, lambda s: print(s, file=sys.stderr))
        blind_engine = Engine(adapter, spec, a.run_s, seed)
        blind_trace = run_blind(blind_engine, configs, a.budget, seed, a.ladder_start, a.ladder, truth, a.blind, a.tol)
        rows.append((seed, reached(tune_trace, truth), tune_trace[-1][1] if tune_trace else "-", tune_res,
                     reached(blind_trace, truth), blind_trace[-1][1] if blind_trace else "-", blind_engine.runs))
        print(f"seed {seed}: tune {rows[-1][1]} runs, blind {rows[-1][4]} runs", file=sys.stderr)
    load = os.getloadavg()[0]
    lines = [f"# bench_tune: kvtune tune vs a blind measured search ({a.engine} engine)", "",
             f"Workload `{Path(wl).name}`; {len(configs)} configs (batch cap x chunk budget); runs of {a.run_s:g} s of "
             f"open-loop arrivals; budget {a.budget} runs per method. Best measured goodput: {best_key} at "
             f"{truth[best_key]:.3g} req/s (truth table: every config bisected to {a.tol:.0%}, "
             f"{sum(len(v['runs']) for v in json.loads(truth_path.read_text()).values())} runs). "
             f"Load average at the end: {load:.2f}; wall {time.monotonic() - t0:.0f} s.", "",
             f"Blind trials measure goodput by {'a x' + format(a.ladder, 'g') + ' rate ladder from ' + format(a.ladder_start, 'g') + ' req/s' if a.blind == 'ladder' else 'bisection to ' + format(a.tol, '.0%')}.", "",
             "| seed | tune: runs to within 5% of the best | tune's pick (status) | blind TPE: runs to within 5% | "
             "blind's best | blind runs used |", "|---|---|---|---|---|---|"]
    for seed, tr, tp, res, br, bp, bruns in rows:
        lines.append(f"| {seed} | {tr if tr is not None else 'not reached'} | {tp} ({res['status']}, {res['runs']} runs) | "
                     f"{br if br is not None else 'not reached'} | {bp} | {bruns} |")
    lines += ["", "Truth table (measured goodput, req/s per replica):", "",
              "| config | goodput req/s (measured) |", "|---|---|"]
    lines += [f"| {k} | {v:.3g} |" for k, v in sorted(truth.items(), key=lambda kv: -kv[1])]
    a.output.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
