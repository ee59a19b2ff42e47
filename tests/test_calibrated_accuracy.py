"""Issue 2: calibrated mode lands within 15% of measured H100 points.

The points come from ../shared/data (converted as bench/fit_shipped_calibrations.py does) or, when
that folder is absent, from the committed copies in profiles/tables. Each engine's points are
predicted with that engine's shipped calibration (``find_calibration('h100-sxm', engine)``).

Which points are held to 15% (a rule, not a pick):
- TensorRT-LLM published points P19-P26 (static-batch throughput and batch-1 prefill);
- SGLang P46 (batch-1 decode);
- every silicon TPOT point at concurrency <= 32 for each engine, and every silicon TTFT point at
  concurrency <= 16 with output length 128 (below the engines' batch limits, where the benchmark
  TTFT is still prefill and not queueing kvtune cannot see: the source does not record the
  engine's max batch / scheduler settings).

Points in KNOWN_MISSES are outside 15% for a stated reason; the test asserts they still miss, so
the list cannot silently go stale. Run with ``-s`` to see every error.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from costmodel import get_gpu
from costmodel.calibration import find_calibration, load_calibration
from costmodel.fit import RowPredictor, evaluate
from costmodel.profile_table import read_table

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
TABLES = ROOT / "profiles" / "tables"
LIMIT = 0.15

# id (or id:metric) -> why kvtune's calibrated model cannot honestly match it
KNOWN_MISSES: dict[str, str] = {}


def _rows():
    if (SHARED / "h100_silicon_points.csv").exists() and (SHARED / "h100_calibration_points.csv").exists():
        spec = importlib.util.spec_from_file_location("fit_shipped", ROOT / "bench" / "fit_shipped_calibrations.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return (mod.convert_silicon(SHARED / "h100_silicon_points.csv")
                + mod.convert_published(SHARED / "h100_calibration_points.csv"), str(SHARED))
    if (TABLES / "h100-silicon.csv").exists():
        return read_table(TABLES / "h100-silicon.csv") + read_table(TABLES / "h100-published.csv"), str(TABLES)
    pytest.skip("neither ../shared/data nor profiles/tables holds the H100 points")


def _selected(row, metric) -> bool:
    if row.id.startswith("P"):
        return True
    if metric == "tpot_ms":
        return row.concurrency <= 32
    if metric == "ttft_ms":
        return row.concurrency <= 16 and row.output_tokens == 128
    return False


def test_calibrated_within_15_percent():
    rows, where = _rows()
    gpu = get_gpu("h100-sxm")
    pred = RowPredictor(gpu)
    results = []
    for engine in ("trtllm", "vllm", "sglang"):
        eff = load_calibration(find_calibration("h100-sxm", engine))
        mine = [r for r in rows if r.engine == engine]
        for p in evaluate(mine, eff, pred):
            row = next(r for r in mine if r.id == p.id)
            if _selected(row, p.metric):
                results.append((engine, row, p))
    print(f"\ncalibrated accuracy against {where}: {len(results)} points held to {LIMIT:.0%}")
    print(f"{'engine':7} {'tp':>2} {'isl/osl':>9} {'conc':>5} {'metric':13} {'measured':>9} {'kvtune':>9} {'err%':>6}  id")
    bad, stale = [], []
    for engine, row, p in results:
        io = f"{row.input_tokens or row.chunk_tokens}/{row.output_tokens or '-'}"
        conc = row.concurrency or row.num_requests or row.batch or ""
        print(f"{engine:7} {row.tp:>2} {io:>9} {conc:>5} {p.metric:13} {p.measured:9.4g} {p.after:9.4g} "
              f"{p.err_after * 100:+6.1f}  {p.id[-48:]}")
        known = KNOWN_MISSES.get(f"{p.id}:{p.metric}") or KNOWN_MISSES.get(p.id)
        within = abs(p.err_after) <= LIMIT
        if known and within:
            stale.append(p.id)
        elif not known and not within:
            bad.append(f"{p.id}:{p.metric} {p.err_after * 100:+.1f}%")
    assert not bad, f"{len(bad)} points beyond {LIMIT:.0%}: {bad[:10]}"
    assert not stale, f"KNOWN_MISSES now within {LIMIT:.0%}, remove them: {stale}"
