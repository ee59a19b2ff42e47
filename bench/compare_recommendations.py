"""Behaviour check for refactors: record every example's recommendation, then compare two records.

    python bench/compare_recommendations.py record OUT.json [--examples a,b] [--oracle] [--seed 0]
    python bench/compare_recommendations.py compare BEFORE.json AFTER.json

``record`` runs ``kvtune solve`` (a subprocess, the installed command) on each ``examples/*.yaml``
(and with ``--oracle`` each ``bench/oracle/*.yaml``, recorded as ``oracle/<name>``)
with a fixed ``--seed`` and keeps its whole ``--json`` result minus what legitimately changes from
run to run: timestamps, wall times, file paths (the solve's own temporary folder) and the version.
The exit status is kept too (3 infeasible is a recommendation). ``compare`` says, per example,
``identical`` or the first differing keys, and exits 1 if any differs. A refactor that claims to be
behaviour-neutral must leave every example identical, bit for bit (floats compared as written by
``json.dumps``, i.e. ``repr``).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Keys whose values change between identical runs: clocks, timings, absolute paths, the version.
VOLATILE_KEYS = ("time", "wall", "elapsed", "timestamp", "created", "date", "version")


def _volatile(key: str) -> bool:
    k = key.lower()
    return any(v in k for v in VOLATILE_KEYS) or k.endswith("_s_wall")


def scrub(obj, tmp: str):
    """Drop volatile keys and the temporary folder's path, recursively."""
    if isinstance(obj, dict):
        return {k: scrub(v, tmp) for k, v in obj.items() if not _volatile(k)}
    if isinstance(obj, list):
        return [scrub(v, tmp) for v in obj]
    if isinstance(obj, str):
        return obj.replace(tmp, "<tmp>").replace(str(ROOT), "<root>")
    return obj


def record(out: Path, examples: list[str], seed: int) -> None:
    records = {}
    for name in examples:
        path = ROOT / "bench" / f"{name}.yaml" if name.startswith("oracle/") else ROOT / "examples" / f"{name}.yaml"
        with tempfile.TemporaryDirectory() as tmp:
            js = Path(tmp) / "result.json"
            proc = subprocess.run(
                ["kvtune", "solve", str(path), "--seed", str(seed), "--quiet", "--json", str(js)],
                cwd=ROOT, capture_output=True, text=True,
            )
            result = json.loads(js.read_text()) if js.exists() else None
            records[name] = {
                "exit_status": proc.returncode,
                "result": scrub(result, tmp),
                "stderr_last": proc.stderr.strip().splitlines()[-1:] if proc.returncode not in (0, 3) else [],
            }
        print(f"{name}: exit {proc.returncode}", flush=True)
    out.write_text(json.dumps(records, indent=1, sort_keys=True))


def _diff(a, b, where: str, out: list[str]) -> None:
    if len(out) >= 8:
        return
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                out.append(f"{where}.{k}: only in {'after' if k in b else 'before'}")
            else:
                _diff(a[k], b[k], f"{where}.{k}", out)
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            _diff(x, y, f"{where}[{i}]", out)
    elif json.dumps(a) != json.dumps(b):
        out.append(f"{where}: {json.dumps(a)[:80]} -> {json.dumps(b)[:80]}")


def compare(before: Path, after: Path) -> int:
    a, b = json.loads(before.read_text()), json.loads(after.read_text())
    bad = 0
    for name in sorted(set(a) | set(b)):
        if name not in a or name not in b:
            print(f"{name}: only in {'after' if name in b else 'before'}")
            bad += 1
            continue
        diffs: list[str] = []
        _diff(a[name], b[name], "", diffs)
        print(f"{name}: {'identical' if not diffs else 'DIFFERS'}")
        for d in diffs:
            print(f"    {d}")
        bad += bool(diffs)
    print("all identical" if not bad else f"{bad} example(s) differ")
    return 1 if bad else 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record")
    r.add_argument("out", type=Path)
    r.add_argument("--examples", default="", help="comma-separated names (default: every example)")
    r.add_argument("--oracle", action="store_true", help="also every bench/oracle/*.yaml workload")
    r.add_argument("--seed", type=int, default=0)
    c = sub.add_parser("compare")
    c.add_argument("before", type=Path)
    c.add_argument("after", type=Path)
    args = p.parse_args()
    if args.cmd == "compare":
        return compare(args.before, args.after)
    names = [n for n in args.examples.split(",") if n] or sorted(
        q.stem for q in (ROOT / "examples").glob("*.yaml"))
    if args.oracle:
        names += sorted(f"oracle/{q.stem}" for q in (ROOT / "bench" / "oracle").glob("*.yaml"))
    record(args.out, names, args.seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
