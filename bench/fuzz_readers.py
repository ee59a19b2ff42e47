"""The long fuzz run of kvtune's readers (run by hand; CI runs the same properties with a few dozen
examples each, in tests/measure/test_fuzz_readers.py).

    python bench/fuzz_readers.py                 # 10,000 examples per reader, seed 0
    python bench/fuzz_readers.py --examples 500 --seed 3 --only trace

Prints, per reader: examples run (at least --examples: rounds on seeds seed, seed+1, ... until
the reader was called that often), how many the reader accepted (the rest were refused with
kvtune's own one-line error), wall time. Any other exception is a failure: Hypothesis prints the
shrunk input and the script exits 1.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=int, default=10_000, help="examples per reader")
    ap.add_argument("--seed", type=int, default=0, help="Hypothesis seed (a different seed, different inputs)")
    ap.add_argument("--only", action="append", default=[], help="reader name (repeatable); default all")
    args = ap.parse_args()
    os.environ["KVTUNE_FUZZ_EXAMPLES"] = str(args.examples)
    sys.path.insert(0, str(HERE.parent / "tests"))
    from hypothesis import HealthCheck, Phase, seed, settings

    # loaded before the tests are imported, so their settings inherit it (random, seeded below)
    settings.register_profile("fuzz-long", deadline=None, derandomize=False, database=None,
                              phases=[Phase.generate, Phase.shrink], suppress_health_check=list(HealthCheck))
    settings.load_profile("fuzz-long")
    import test_fuzz_readers as fz

    failed = []
    total_t = 0.0
    print(f"{'reader':<20}{'examples':>10}{'accepted':>10}{'wall_s':>9}")
    for name, test in fz.READERS.items():
        if args.only and name not in args.only:
            continue
        t0 = time.perf_counter()
        rounds = 0
        # Hypothesis counts an example it discards (a draw too large) toward its budget, so one run
        # may call the reader fewer times than asked: run again on the next seed until it has.
        while fz.COUNTS[name] < args.examples and rounds < 20:
            try:
                seed(args.seed + rounds)(test)()
            except Exception as exc:  # noqa: BLE001 (a failure is reported, then the next reader runs)
                failed.append((name, exc))
                break
            rounds += 1
        wall = time.perf_counter() - t0
        total_t += wall
        print(f"{name:<20}{fz.COUNTS[name]:>10}{fz.ACCEPTED[name]:>10}{wall:>9.1f}", flush=True)
    print(f"{'all':<20}{sum(fz.COUNTS.values()):>10}{sum(fz.ACCEPTED.values()):>10}{total_t:>9.1f}")
    for name, exc in failed:
        print(f"FAILED {name}: {type(exc).__name__}: {exc}")
        for note in getattr(exc, "__notes__", []):
            print(f"    {note[:2000]}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
