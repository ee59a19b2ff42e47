"""What optuna-dashboard shows for a solve's evidence study: its Pareto front against the report's.

    pip install optuna-dashboard        # not a kvtune dependency
    python bench/check_dashboard.py [examples/gpu-choice-llama3.1-70b.yaml]

Solves the workload with ``--storage sqlite:///TMP/s.db``, then asks optuna-dashboard's own WSGI app
(``optuna_dashboard.wsgi``, the server ``optuna-dashboard URL`` runs) for the study ``NAME-verified``
through its JSON API (``/api/studies``, ``/api/studies/ID``) and prints the best trials it would draw
as the front beside ``result.pareto``; exit 1 if they differ. Every figure is simulated.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    try:
        from optuna_dashboard import wsgi
    except ImportError:
        print("optuna-dashboard is not installed: pip install optuna-dashboard")
        return 2
    workload = sys.argv[1] if len(sys.argv) > 1 else str(ROOT / "examples" / "gpu-choice-llama3.1-70b.yaml")
    with tempfile.TemporaryDirectory() as tmp:
        url, out = f"sqlite:///{tmp}/s.db", Path(tmp) / "r.json"
        subprocess.run([sys.executable, "-m", "kvtune", "solve", workload, "--quiet", "--storage", url,
                        "--json", str(out)], check=False)
        result = json.loads(out.read_text())
        app = wsgi(url)

        def get(path: str) -> dict:
            env = {"REQUEST_METHOD": "GET", "PATH_INFO": path, "QUERY_STRING": "", "SERVER_NAME": "localhost",
                   "SERVER_PORT": "80", "wsgi.input": io.BytesIO(), "wsgi.url_scheme": "http", "wsgi.errors": sys.stderr}
            return json.loads(b"".join(app(env, lambda status, headers, exc_info=None: None)))
        name = result["study_name"] + "-verified"
        sid = next(s["study_id"] for s in get("/api/studies")["study_summaries"] if s["study_name"] == name)
        study = get(f"/api/studies/{sid}")
        shown = sorted(tuple(t["values"]) for t in study["best_trials"])
        report = sorted((p["usd_per_hour"], p["goodput_req_s"]) for p in result.get("pareto") or ())
        states: dict[str, int] = {}
        for t in study["trials"]:
            states[t["state"]] = states.get(t["state"], 0) + 1
        print(f"study {name}: {len(study['trials'])} trials {states}")
        # the rungs of evidence (optimizer.evidence): each simulated trial's intermediate values
        steps = [len(t.get("intermediate_values") or ()) for t in study["trials"]]
        print(f"trials with intermediate values (the race's rungs): {sum(1 for n in steps if n)}, "
              f"{sum(steps)} values, at most {max(steps, default=0)} on one trial")
        print("dashboard front (usd_per_hour, goodput_req_s):", [(round(u, 2), round(g, 3)) for u, g in shown])
        print("report front    (usd_per_hour, goodput_req_s):", [(round(u, 2), round(g, 3)) for u, g in report])
        same = len(shown) == len(report) and all(abs(a - c) < 1e-9 and abs(b - d) < 1e-9
                                                for (a, b), (c, d) in zip(shown, report))
        print("the same front" if same else "DIFFERENT fronts")
        return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
