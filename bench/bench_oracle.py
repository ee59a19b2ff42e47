"""Oracle benchmark: the exhaustive simulated optimum on the lattice beside ``kvtune solve``'s pick.

    nice -n 10 python bench/bench_oracle.py [--jobs 2] [--workloads a.yaml,b.yaml] [--cache-dir DIR]

For each workload (default: ``examples/*.yaml`` and ``bench/oracle/*.yaml``), every configuration
of the lattice ``solve`` searches (``optimizer.search.grid_space``: TP x KV dtype x speculation
length x batch cap x chunk budget) that fits in memory is verified with the simulator exactly as
``solve`` verifies a config (``optimizer.recommend.verify``: goodput bisected by
``costmodel.goodput`` on the workload's own request sample, then sized and simulated at its load).
The oracle's optimum is the cheapest feasible deployment (``min_cost``; ties: most goodput) or the
most goodput per $ (``max_goodput``). Then one whole ``kvtune solve`` process runs on the workload
(its wall time measured around the process) and its pick is compared:

    min_cost      pass: solve's $/h equals the oracle's
    max_goodput   pass: solve's goodput per $ >= 98% of the oracle's

The oracle is CPU-heavy (hundreds of bisections per workload): it runs on ``--jobs`` processes
and caches every config's verification in ``--cache-dir`` (one JSON per workload, keyed by the
workload file's, its calibration's and the cost model's sha256; after a change to the code alone,
a sample of cached verifications is re-run and the cache kept only if each matches exactly), so a
rerun only simulates what changed. A config
whose simulation raises is recorded as a crash, counted in the table (column ``crash``) and
never the optimum. ``--oracle-only`` skips the solves.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing as mp
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kvtune.optimizer.simsearch import lattice_configs, never_fit_reason
from kvtune.optimizer.verify import verify_config
from kvtune.optimizer.search import SolveContext, config_key, evaluate
from kvtune.optimizer.workload import load_workload
ROOT = Path(__file__).resolve().parents[1]

CODE_FILES = ("costmodel/simulate.py", "costmodel/goodput.py", "costmodel/step.py", "costmodel/memory.py",
              "costmodel/sim_clock.py", "costmodel/traffic.py", "optimizer/verify.py", "optimizer/screen.py")
MAX_GOODPUT_PASS = 0.98  # issue 11: max_goodput must reach 98% of the oracle's goodput per $


def _sha(paths) -> str:
    h = hashlib.sha256()
    for p in paths:
        p = Path(p)
        h.update(p.read_bytes() if p.exists() else b"-")
    return h.hexdigest()[:16]


_CTX: dict = {}


def _ctx(path: str) -> SolveContext:
    if path not in _CTX:
        _CTX[path] = SolveContext.build(load_workload(path))
    return _CTX[path]


def _oracle_one(args) -> tuple[str, dict]:
    path, params = args
    ctx = _ctx(path)
    ev = evaluate(ctx, params)
    t0 = time.perf_counter()
    if not ev.fits:
        return config_key(params), {"fits": False, "reason": ev.reason}
    try:
        v = verify_config(ctx, params)
    except Exception as exc:  # recorded and counted, never the optimum
        return config_key(params), {"fits": True, "crash": f"{exc.__class__.__name__}: {exc}",
                                    "seconds": time.perf_counter() - t0}
    keep = {k: v.to_json().get(k) for k in ("params", "feasible", "per_replica_goodput_req_s", "replicas", "gpus", "usd_per_hour",
                                  "goodput_req_s", "simulations", "reason")}
    return config_key(params), {"fits": True, **keep, "seconds": time.perf_counter() - t0}


def oracle(path: str, jobs: int, cache_dir: Path) -> tuple[dict, float]:
    """Every lattice config's verification (cached); returns (results by config key, cpu seconds spent now)."""
    code = _sha(ROOT / f for f in CODE_FILES)
    # the workload file and the calibration it runs on (its sha256 is in the efficiency's source)
    wl = _sha([path]) + "-" + hashlib.sha256(_ctx(path).eff.source.encode()).hexdigest()[:8]
    cache = cache_dir / f"{Path(path).stem}.json"
    got = {}
    if cache.exists():
        blob = json.loads(cache.read_text())
        if blob.get("workload_sha") == wl and blob.get("code_sha") == code:
            got = blob["configs"]
        elif blob.get("workload_sha") == wl and _still_valid(path, blob["configs"]):
            got = blob["configs"]
            _write(cache, {"workload_sha": wl, "code_sha": code, "configs": got})
    ctx = _ctx(path)
    todo = [(path, p) for p in lattice_configs(ctx) if config_key(p) not in got]
    spent = 0.0
    if todo:
        with mp.get_context("fork").Pool(jobs) as pool:
            for i, (key, res) in enumerate(pool.imap_unordered(_oracle_one, todo, chunksize=1)):
                got[key] = res
                spent += res.get("seconds", 0.0)
                if i % 20 == 19 or i == len(todo) - 1:
                    _write(cache, {"workload_sha": wl, "code_sha": code, "configs": got})
    return got, spent


SPOT_CHECKS = 6  # cached verifications re-run when the code changed; all must match to keep the cache


def _still_valid(path: str, configs: dict) -> bool:
    """The cost model or verification code changed since the cache was written: re-verify a
    spread of cached configs (feasible ones first); keep the cache only if each matches exactly."""
    keys = sorted(k for k, r in configs.items() if r.get("feasible")) or sorted(configs)
    picks = keys[:: max(1, len(keys) // SPOT_CHECKS)][:SPOT_CHECKS]
    for k in picks:
        old = configs[k]
        if "params" not in old:
            continue
        _, new = _oracle_one((path, old["params"]))
        same = all(new.get(f) == old.get(f) for f in ("feasible", "per_replica_goodput_req_s", "usd_per_hour",
                                                       "goodput_req_s", "crash"))
        if not same:
            print(f"  {Path(path).stem}: cache invalid after a code change ({k}: {old.get('per_replica_goodput_req_s')} "
                  f"-> {new.get('per_replica_goodput_req_s')}); recomputing", flush=True)
            return False
    print(f"  {Path(path).stem}: code changed; {len(picks)} cached verifications re-run, all identical: cache kept",
          flush=True)
    return True


def _write(path: Path, blob: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(blob, sort_keys=True))
    os.replace(tmp, path)


def oracle_best(spec, results: dict, ctx: SolveContext) -> dict | None:
    """The best feasible config; like solve, never one on which some of the workload's requests
    can never fit the KV pool (``optimizer.simsearch.never_fit_reason``)."""
    ok = [r for r in results.values() if r.get("feasible") and not never_fit_reason(ctx, r["params"])]
    if not ok:
        return None
    if spec.objective == "max_goodput":
        return max(ok, key=lambda r: (r["goodput_req_s"] / r["usd_per_hour"], -r["usd_per_hour"]))
    return min(ok, key=lambda r: (r["usd_per_hour"], -r["goodput_req_s"]))


def run_solve(path: str, extra: list[str]) -> tuple[dict, float, float]:
    """(result, wall s, cpu s) of one whole ``kvtune solve`` process (CPU: it and its children)."""
    import resource
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "r.json"
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        exe = Path(sys.executable).parent / "kvtune"
        p = subprocess.run([str(exe), "solve", path, "--quiet", "--json", str(out), *extra],
                           cwd=ROOT, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
        if not out.exists():
            return {"status": "error", "reason": (p.stderr or p.stdout).strip().splitlines()[-1:]}, wall, cpu
        return json.loads(out.read_text()), wall, cpu


def _cfg(p: dict) -> str:
    return f"TP{p['tp']} {p['kv_dtype']} k{p['spec_k']} b{p['batch_cap']} c{p['chunk_tokens']}"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workloads", default=None, help="comma-separated YAML paths (default: examples + bench/oracle)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--cache-dir", default=os.environ.get("KVTUNE_ORACLE_CACHE", "/tmp/kvtune-oracle-cache"))
    ap.add_argument("--oracle-only", action="store_true")
    ap.add_argument("--solve-args", default="", help="extra arguments for kvtune solve")
    a = ap.parse_args()
    # examples that list several GPU types (hardware.gpu as a list) are solved per type by
    # optimizer.gpu_choice; the oracle here walks one type's lattice, so they are left out
    paths = a.workloads.split(",") if a.workloads else \
        [str(p) for p in sorted((ROOT / "examples").glob("*.yaml")) + sorted((ROOT / "bench" / "oracle").glob("*.yaml"))
         if not load_workload(p).hardware.choices]
    cache_dir = Path(a.cache_dir)
    ok_all = True
    print("| workload | objective | solve pick | GPUs | $/h | goodput req/s | oracle optimum | GPUs | $/h | "
          "goodput req/s | ratio | pass | configs (fit/crash) | oracle cpu s | solve wall s | solve cpu s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    print(f"(machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start)")
    for path in paths:
        spec = load_workload(path)
        res, spent = oracle(path, a.jobs, cache_dir)
        cpu = sum(r.get("seconds", 0.0) for r in res.values())
        fit = sum(1 for r in res.values() if r.get("fits"))
        crash = sum(1 for r in res.values() if r.get("crash"))
        best = oracle_best(spec, res, _ctx(path))
        o = (f"{_cfg(best['params'])} | {best['gpus']} | {best['usd_per_hour']:.0f} | {best['goodput_req_s']:.2f}"
             if best else "infeasible | | | ")
        if a.oracle_only:
            print(f"| {Path(path).stem} | {spec.objective} | | | | | {o} | | | {len(res)} ({fit}/{crash}) | {cpu:.0f} | | |",
                  flush=True)
            continue
        r, wall, scpu = run_solve(path, a.solve_args.split())
        if r.get("status") == "ok":
            rec, pr = r["recommendation"], r["predicted"]
            s = f"{rec['replicas']} x {_cfg(rec)} | {rec['gpus']} | {r['cost']['usd_per_hour']:.0f} | {pr['goodput_req_s']:.2f}"
        else:
            s = f"{r.get('status')}: {str(r.get('reason'))[:60]} | | | "
        if best is None:
            ratio, passed = (1.0 if r.get("status") != "ok" else float("nan")), r.get("status") != "ok"
        elif r.get("status") != "ok":
            ratio, passed = 0.0, False
        elif spec.objective == "max_goodput":
            ratio = (pr["goodput_req_s"] / r["cost"]["usd_per_hour"]) / (best["goodput_req_s"] / best["usd_per_hour"])
            passed = ratio >= MAX_GOODPUT_PASS
        else:
            ratio = best["usd_per_hour"] / r["cost"]["usd_per_hour"]
            passed = abs(r["cost"]["usd_per_hour"] - best["usd_per_hour"]) < 1e-6
        ok_all &= passed
        if best is not None:
            o = f"{best['replicas']} x {o}"
        print(f"| {Path(path).stem} | {spec.objective} | {s} | {o} | {ratio:.3f} | {'yes' if passed else 'NO'} | "
              f"{len(res)} ({fit}/{crash}) | {cpu:.0f} | {wall:.1f} | {scpu:.1f} |", flush=True)
    print("\nratio: min_cost oracle $/h / solve $/h; max_goodput solve goodput per $ / oracle's. "
          "oracle cpu s: the summed simulation time of every config's verification (cached runs reuse it).")
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
