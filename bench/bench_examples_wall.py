"""Wall time of whole ``kvtune solve`` processes on every shipped example, both deployment kinds
searched (issue 14 item 7: <= 15 s each), with the kind that won and its margin.

    nice -n 10 python bench/bench_examples_wall.py
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET_S = 15.0


def main() -> int:
    print(f"{'example':<36} {'wall_s':>7} {'status':<12} {'kind':<14} {'margin_%':>8}  {'disagg search_s':>15}")
    worst = 0.0
    for ex in sorted((ROOT / "examples").glob("*.yaml")):
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "r.json"
            t0 = time.perf_counter()
            p = subprocess.run([str(Path(sys.executable).parent / "kvtune"), "solve", str(ex), "--quiet", "--json", str(out)],
                               cwd=ROOT, capture_output=True, text=True)
            wall = time.perf_counter() - t0
            worst = max(worst, wall)
            r = json.loads(out.read_text()) if out.exists() else {}
        d = r.get("deployment") or {}
        ds = sum(s.get("wall_s", 0.0) for s in d.get("search", []))
        m = d.get("margin_pct")
        print(f"{ex.name:<36} {wall:>7.1f} {r.get('status', 'rc=' + str(p.returncode)):<12} {str(d.get('kind')):<14} "
              f"{'-' if m is None else f'{m:.1f}':>8}  {ds:>15.1f}", flush=True)
    print(f"slowest {worst:.1f} s (target {TARGET_S:g} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
