"""Scale-out benchmark: one ``kvtune solve`` with 1 and with 2 worker processes sharing a real
PostgreSQL server (started here with ``pgserver``; install the ``pg`` extra), wall time for each,
and a check that both give the answer of a single process without a storage.

    nice -n 10 python bench/bench_workers.py [--workload examples/speculative-llama3.1-8b.yaml]

Each run uses a fresh database (a new study name), so nothing is read back from an earlier run.
Printed: wall seconds per run, the work trials each worker ran, and whether the answers match.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(workload: str, args: list[str], out: Path) -> float:
    exe = Path(sys.executable).parent / "kvtune"
    t0 = time.perf_counter()
    p = subprocess.run([str(exe), "solve", workload, "--quiet", "--json", str(out), *args], cwd=ROOT,
                       capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"kvtune solve {' '.join(args)} failed: {p.stderr.strip()[-500:]}")
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", default=str(ROOT / "examples" / "speculative-llama3.1-8b.yaml"))
    a = ap.parse_args()
    try:
        import pgserver
    except ImportError:
        print("pgserver is not installed: pip install -e '.[pg]'")
        return 2
    import optuna
    from kvtune.optimizer.scaleout import sim_study_name
    with tempfile.TemporaryDirectory() as d:
        srv = pgserver.get_server(str(Path(d) / "pg"), cleanup_mode="stop")
        try:
            url = srv.get_uri().replace("postgresql://", "postgresql+psycopg://", 1)
            base = Path(d) / "base.json"
            t_base = run(a.workload, ["--jobs", "1"], base)
            ref = json.loads(base.read_text())
            print(f"single process, no storage:   {t_base:6.1f} s wall")
            same = True
            for n in (1, 2):
                out = Path(d) / f"w{n}.json"
                t = run(a.workload, ["--workers", str(n), "--storage", url, "--study-name", f"bench-w{n}"], out)
                r = json.loads(out.read_text())
                st = optuna.load_study(study_name=sim_study_name(f"bench-w{n}"), storage=url)
                per = {}
                for tr in st.get_trials(deepcopy=False):
                    if tr.state.name == "COMPLETE":
                        pid = tr.user_attrs["claim"]["pid"]
                        per[pid] = per.get(pid, 0) + len(tr.user_attrs["claim"]["keys"])
                match = all(r[k] == ref[k] for k in ("recommendation", "predicted", "verified", "race"))
                same &= match
                print(f"{n} worker{'s' if n > 1 else ' '} on PostgreSQL:       {t:6.1f} s wall  "
                      f"simulation jobs per process {sorted(per.values(), reverse=True)}  same answer: {match}")
        finally:
            srv.cleanup()
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
