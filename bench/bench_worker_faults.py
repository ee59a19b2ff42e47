"""What a killed ``--workers`` child costs: wall time of ``kvtune solve --workers 2`` when one child
is SIGKILLed at a point of its simulation work, against the same run undisturbed, and of a later
single-process run on the storage the dead child left behind.

    nice -n 10 python bench/bench_worker_faults.py [--storage sqlite journal postgresql]
        [--points after_create after_claim mid_simulation] [--src DIR]

The kill is injected by ``tests/kill_points/sitecustomize.py`` (put on ``PYTHONPATH``; the points
are described there). ``--src`` runs another checkout's code (e.g. an export of an older commit:
``git archive COMMIT | tar -x -C DIR``), for before/after figures. Every run uses a fresh storage
(a new file, or a new database on one pgserver, which needs the ``pg`` extra). The workload is
tests/optimizer/test_scaleout.py's. Printed: wall seconds per run, the load average at its start, and
whether each run's answer matches the undisturbed run's.
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
KILL_POINTS = ("after_create", "after_claim", "mid_simulation")
_CODE = "import sys; from kvtune.optimizer.cli import main; sys.argv[0] = 'kvtune'; main()"
_KEYS = ("recommendation", "predicted", "verified", "race")


def solve(src: Path, workload: Path, out: Path, args: list[str], env_extra: dict[str, str]) -> tuple[float, float]:
    """(wall seconds, 1-minute load average at the start) of one ``kvtune solve``."""
    env = {**os.environ, **env_extra}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env_extra.get("PYTHONPATH"), str(src)) if p)
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", _CODE, "solve", str(workload), "--quiet", "--json", str(out), *args],
                       cwd=src, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"kvtune solve {' '.join(args)} failed: {p.stderr.strip()[-800:]}")
    return wall, load


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--storage", nargs="+", default=["sqlite", "postgresql"], choices=["sqlite", "journal", "postgresql"])
    ap.add_argument("--points", nargs="+", default=list(KILL_POINTS), choices=KILL_POINTS)
    ap.add_argument("--src", default=str(ROOT), help="checkout whose kvtune runs (default: this one)")
    a = ap.parse_args()
    src = Path(a.src).resolve()
    sys.path.insert(0, str(ROOT / "tests"))
    from test_scaleout import WORKLOAD

    with tempfile.TemporaryDirectory(prefix="kvtune-faults-") as d:
        tmp = Path(d)
        wl = tmp / "w.yaml"
        wl.write_text(yaml.safe_dump(WORKLOAD))
        srv = None
        if "postgresql" in a.storage:
            import pgserver
            srv = pgserver.get_server(str(tmp / "pg"), cleanup_mode="stop")
        n_db = 0

        def fresh(kind: str) -> str:
            nonlocal n_db
            n_db += 1
            if kind == "sqlite":
                return f"sqlite:///{tmp / f'db{n_db}.sqlite'}"
            if kind == "journal":
                return f"journal:{tmp / f'j{n_db}.log'}"
            assert srv is not None
            srv.psql(f"CREATE DATABASE faults{n_db};")
            return srv.get_uri(f"faults{n_db}").replace("postgresql://", "postgresql+psycopg://", 1)

        print(f"kvtune from {src}; workload tests/optimizer/test_scaleout.py WORKLOAD; load = 1-min load average at start")
        print(f"{'storage':10} {'kill point':15} {'run':28} {'wall_s':>7} {'load':>5}  same answer")
        try:
            for kind in a.storage:
                ref_out = tmp / "ref.json"
                t, load = solve(src, wl, ref_out, ["--workers", "2", "--storage", fresh(kind)], {})
                ref = json.loads(ref_out.read_text())
                print(f"{kind:10} {'-':15} {'--workers 2, undisturbed':28} {t:7.1f} {load:5.1f}  -", flush=True)
                for point in a.points:
                    url = fresh(kind)
                    mark = tmp / f"kill-{kind}-{point}"
                    env = {"KVTUNE_TEST_KILL": point, "KVTUNE_TEST_KILL_MARK": str(mark),
                           "PYTHONPATH": str(ROOT / "tests" / "kill_points")}
                    out = tmp / "k.json"
                    t, load = solve(src, wl, out, ["--workers", "2", "--storage", url], env)
                    killed = "killed" if mark.exists() else "NOT KILLED"
                    same = all(json.loads(out.read_text())[k] == ref[k] for k in _KEYS)
                    print(f"{kind:10} {point:15} {'--workers 2, a child ' + killed:28} {t:7.1f} {load:5.1f}  {same}",
                          flush=True)
                    t, load = solve(src, wl, out, ["--storage", url], {})
                    same = all(json.loads(out.read_text())[k] == ref[k] for k in _KEYS)
                    print(f"{kind:10} {point:15} {'later run, one process':28} {t:7.1f} {load:5.1f}  {same}", flush=True)
        finally:
            if srv is not None:
                srv.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
