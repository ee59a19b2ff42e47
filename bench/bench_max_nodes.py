"""What hardware.max_nodes costs a search: one ``kvtune solve`` per max_nodes value on the same
workload, wall time, simulations and the recommendation, which must not change once max_nodes
covers the answer (more nodes on offer cannot make the cheapest deployment cheaper, and a search
should cost what the workload needs, not what the hardware list allows).

    nice -n 10 python bench/bench_max_nodes.py [--workload examples/chat-llama3.1-8b.yaml]
        [--max-nodes 4 10000 100000] [--src DIR]

Class-based workloads (a trace file's path would not follow the copy). ``--src`` runs another checkout's code (``git archive COMMIT | tar -x -C DIR``) for before/after
figures. Each run: ``--jobs 1``, no storage. Printed: wall seconds, the 1-minute load average at
the start, the simulator race's simulation count, the pick and whether it matches the first run's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
_CODE = "import sys; from kvtune.optimizer.cli import main; sys.argv[0] = 'kvtune'; main()"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", default=str(ROOT / "examples" / "chat-llama3.1-8b.yaml"))
    ap.add_argument("--max-nodes", nargs="+", type=int, default=[4, 10000, 100000])
    ap.add_argument("--src", default=str(ROOT), help="checkout whose kvtune runs (default: this one)")
    a = ap.parse_args()
    src = Path(a.src).resolve()
    base = yaml.safe_load(Path(a.workload).read_text())
    env = {**os.environ, "PYTHONPATH": str(src)}
    print(f"kvtune from {src}; workload {a.workload}; --jobs 1; load = 1-min load average at start")
    print(f"{'max_nodes':>9} {'wall_s':>7} {'load':>5} {'simulations':>11}  pick  (same as the first)")
    ref = None
    with tempfile.TemporaryDirectory(prefix="kvtune-maxnodes-") as d:
        for n in a.max_nodes:
            w = {**base, "hardware": {**base["hardware"], "max_nodes": n}}
            wl = Path(d) / f"w{n}.yaml"
            wl.write_text(yaml.safe_dump(w))
            out = Path(d) / f"r{n}.json"
            load = os.getloadavg()[0]
            t0 = time.perf_counter()
            p = subprocess.run([sys.executable, "-c", _CODE, "solve", str(wl), "--quiet", "--jobs", "1", "--json",
                                str(out)], cwd=src, env=env, capture_output=True, text=True)
            wall = time.perf_counter() - t0
            if p.returncode not in (0, 3):
                raise SystemExit(f"max_nodes {n}: kvtune solve failed: {p.stderr.strip()[-800:]}")
            r = json.loads(out.read_text())
            rec = r.get("recommendation") or {}
            pick = {k: rec.get(k) for k in ("tp", "batch_cap", "kv_dtype", "spec_k", "chunk_tokens", "replicas", "gpus")}
            key = (json.dumps(rec, sort_keys=True), json.dumps(r.get("predicted"), sort_keys=True), r.get("cost"))
            ref = ref or key
            sims = r.get("verification", {}).get("simulations")
            print(f"{n:9d} {wall:7.1f} {load:5.1f} {sims!s:>11}  {pick} ${(r.get('cost') or {}).get('usd_per_hour')}/h"
                  f"  ({key == ref})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
