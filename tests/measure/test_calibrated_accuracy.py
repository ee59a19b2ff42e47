"""Issue 2: calibrated mode lands within 15% of measured H100 points.

The points come from ../shared/data (converted as bench/fit_shipped_calibrations.py does) or, when
that folder is absent, from the committed copies in profiles/tables. Each engine's points are
predicted with that engine's shipped calibration (``find_calibration('h100-sxm', engine)``).

Which points are held to 15% (a rule, not a pick):
- TensorRT-LLM published points P19-P26 (static-batch throughput and batch-1 prefill);
- SGLang P46 (batch-1 decode);
- every silicon TPOT point at concurrency <= 32 for each engine (below the engines' batch limits);
- TensorRT-LLM silicon TTFT at concurrency <= 16. Those runs kept one request waiting for a slot
  (their rows carry batch_cap = C - 1; ``test_trtllm_runs_kept_one_request_waiting`` shows why), and
  the fit's second stage adds one front-end share per request (``request_overhead_s``, 33 ms).
- SGLang silicon TTFT at every concurrency. SGLang prefills a waiting prompt in a batch of its own
  while the decodes wait (``PREFILL_FIRST_ENGINES``), so clients that start together stay in
  lock-step: each round's prompts are prefilled together, FCFS in 8192-token batches, before anyone
  decodes. ``test_sglang_ttft_grows_with_clients_not_with_output`` shows the signature in the data.
  Where the clients overfill the KV pool (one GPU; two GPUs at 64-128 clients), SGLang admits a
  request only with room held for its output and part of the running ones' (``OUTPUT_RESERVE_ENGINES``)
  and requests wait whole lifetimes; the pool's size there is the calibration's second stage
  (``activation_reserve_bytes``, fitted to those runs' TTFT: ``optimizer.calibrate.POOL_STAGE_ENGINES``).

Not held: vLLM TTFT. It is printed (concurrency <= 16, output 128) and kvtune is far low on it:
it is ~3 prefills even at concurrency 8 and flat in the output length, neither a waiting request
nor a constant, and the source records neither the scheduler's settings nor the client's.
TensorRT-LLM TTFT above concurrency 16 is printed too (``-s``): at 32 it starts to outgrow one
waiting request; at 64-128 it jumps by up to a second while TPOT stays put.

Points in KNOWN_MISSES are outside 15% for a stated reason; the test asserts they still miss, so
the list cannot silently go stale. Run with ``-s`` to see every error.
"""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path

import pytest

from kvtune.costmodel import get_gpu
from kvtune.costmodel.calibration import find_calibration, load_calibration
from kvtune.costmodel.fit import RowPredictor, evaluate
from kvtune.costmodel.profile_table import read_table
from kvtune.optimizer.calibrate import STAGGERED_ENGINES

ROOT = Path(__file__).parent.resolve().parents[1]
SHARED = Path(__file__).parent.resolve().parents[2] / "shared" / "data"
TABLES = ROOT / "profiles" / "tables"
LIMIT = 0.15

# id (or id:metric) -> why kvtune's calibrated model cannot honestly match it
_WHY_TRT_C32 = ("Llama-3.1-8B on 4-8 GPUs, concurrency 16-32, 1k-2k prompts: -16..-29%; TPOT grows with prompts "
                "per output token faster than one prefill overhead per step (5.9 ms) explains")
_WHY_VLLM = "long-prompt point where prefill interference in TPOT is over-predicted"
_WHY_SGLANG_512 = ("SGLang with 512 outputs on 2-8 GPUs: the measured TTFT falls below the 128- and 256-output runs' "
                   "(TP8 1024 c16: 350, 362, then 243 ms; TP8 4096 c64: 2862, 2994, then 2215 ms) while kvtune's "
                   "lock-step round does not depend on the output length: +15..+37%")
_WHY_TRT09 = "TensorRT-LLM 0.9 (compiled engine, FP8) while the fit is driven by 1.0 (PyTorch backend, BF16) runs: "
_WHY_TTFT_2048x256 = ("2048/256 at concurrency 8: measured below the same run with 128 outputs (TP1 265 -> 205 ms, TP8 "
                      "114 -> 78 ms, then 692 and 241 ms at 512), against the one-waiting-request trend of every other group")
_WHY_TTFT_SPREAD = ("one constant front-end share (33 ms) and one waiting request: within a TP the residual runs from "
                    "-22% to +33% with prompt length (TP8 c16: -15% at 1k, +33% at 4k), which no constant fits")
_T = "meta_llama_llama_3_1_8b_instruct_meta_llama_llama_3_1_8b_instruct_h100_sxm_trtllm_agg_"
_S = "qwen_qwen3_32b_qwen_qwen3_32b_h100_sxm_sglang_agg_"
KNOWN_MISSES: dict[str, str] = {
    "P19:output_tok_s": _WHY_TRT09 + "static batch 896 of 128/128, +57%: its batch-896 prefill is faster than the fitted prefill rate",
    "P22:output_tok_s": _WHY_TRT09 + "70B TP2 batch 64 of 2048/2048, +19%: FP8 decode slower than the BF16-fitted efficiencies say",
    "P23:step_ms": _WHY_TRT09 + "batch-1 128-token prefill, 6.3 ms, +47%: the fitted prefill overhead of 1.0's eager mixed "
                   "steps (5.9 ms) is nearly the whole step in 0.9's compiled engine",
    _T + "1024x128_c16_tp8_epnone_142:tpot_ms": _WHY_TRT_C32,
    _T + "1024x128_c32_tp4_epnone_106:tpot_ms": _WHY_TRT_C32,
    _T + "1024x128_c32_tp8_epnone_151:tpot_ms": _WHY_TRT_C32,
    _T + "1024x256_c32_tp8_epnone_152:tpot_ms": _WHY_TRT_C32,
    _T + "1024x512_c32_tp8_epnone_153:tpot_ms": _WHY_TRT_C32,
    _T + "2048x128_c32_tp8_epnone_154:tpot_ms": _WHY_TRT_C32,
    "qwen3_32b_qwen3_32b_h100_sxm_vllm_agg_4000x1000_c_tp1_0_epnone_4:tpot_ms": _WHY_VLLM,
    _S + "1024x512_c16_tp4_epnone_20:ttft_ms": _WHY_SGLANG_512,  # +17%
    _S + "1024x512_c16_tp8_epnone_21:ttft_ms": _WHY_SGLANG_512,  # +37%
    _S + "2048x512_c16_tp2_epnone_45:ttft_ms": _WHY_SGLANG_512,  # +21%
    _S + "2048x512_c16_tp8_epnone_47:ttft_ms": _WHY_SGLANG_512,  # +20%
    _S + "1024x512_c128_tp8_epnone_27:ttft_ms": _WHY_SGLANG_512,  # +16%
    _S + "2048x512_c64_tp2_epnone_48:ttft_ms": _WHY_SGLANG_512,  # +23%
    _S + "2048x512_c64_tp8_epnone_50:ttft_ms": _WHY_SGLANG_512,  # +29%
    _S + "2048x512_c128_tp4_epnone_52:ttft_ms": _WHY_SGLANG_512,  # +19%
    _S + "2048x512_c128_tp8_epnone_53:ttft_ms": _WHY_SGLANG_512,  # +23%
    _S + "4096x512_c64_tp4_epnone_75:ttft_ms": _WHY_SGLANG_512,  # +16%
    _S + "4096x512_c64_tp8_epnone_76:ttft_ms": _WHY_SGLANG_512,  # +33%
    _S + "4096x512_c128_tp4_epnone_77:ttft_ms": _WHY_SGLANG_512,  # +24%
    _S + "4096x512_c128_tp8_epnone_78:ttft_ms": _WHY_SGLANG_512,  # +16%
    _T + "2048x256_c8_tp1_epnone_5:ttft_ms": _WHY_TTFT_2048x256,  # +91%
    _T + "4096x128_c8_tp1_epnone_7:ttft_ms": _WHY_TTFT_SPREAD,  # -19%
    _T + "4096x256_c8_tp1_epnone_8:ttft_ms": _WHY_TTFT_SPREAD,  # -17%
    _T + "4096x256_c16_tp1_epnone_17:ttft_ms": _WHY_TTFT_SPREAD,  # -22%
    _T + "1024x128_c8_tp2_epnone_43:ttft_ms": _WHY_TTFT_SPREAD,  # +22%
    _T + "1024x256_c8_tp2_epnone_44:ttft_ms": _WHY_TTFT_SPREAD,  # +18%
    _T + "1024x512_c8_tp2_epnone_45:ttft_ms": _WHY_TTFT_SPREAD,  # +16%
    _T + "1024x256_c16_tp2_epnone_53:ttft_ms": _WHY_TTFT_SPREAD,  # +16%
    _T + "2048x256_c8_tp4_epnone_92:ttft_ms": _WHY_TTFT_SPREAD,  # +19%
    _T + "4096x128_c16_tp4_epnone_103:ttft_ms": _WHY_TTFT_SPREAD,  # +28%
    _T + "2048x256_c8_tp8_epnone_137:ttft_ms": _WHY_TTFT_2048x256,  # +116%
    _T + "1024x128_c16_tp8_epnone_142:ttft_ms": _WHY_TTFT_SPREAD,  # -15%
    _T + "1024x256_c16_tp8_epnone_143:ttft_ms": _WHY_TTFT_SPREAD,  # +21%
    _T + "4096x128_c16_tp8_epnone_148:ttft_ms": _WHY_TTFT_SPREAD,  # +33%
}


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
    if metric == "ttft_ms" and row.engine == "trtllm":
        return row.concurrency <= 16
    if metric == "ttft_ms" and row.engine == "sglang":
        return True
    return False


def _shown(row, metric) -> bool:
    if metric == "ttft_ms" and row.engine == "trtllm":
        return row.concurrency <= 32
    if metric == "ttft_ms" and row.engine == "sglang":
        return True
    return _selected(row, metric) or (metric == "ttft_ms" and row.concurrency <= 16 and row.output_tokens == 128)


@functools.cache
def _predicted() -> tuple[list, str]:
    """(engine, row, point fit) for every row and metric, each engine's rows predicted with its
    shipped calibration as the shipped fits simulate them (optimizer.calibrate.fit_shipped)."""
    rows, where = _rows()
    pred = RowPredictor(get_gpu("h100-sxm"), stagger=STAGGERED_ENGINES)
    out = []
    for engine in ("trtllm", "vllm", "sglang"):
        eff = load_calibration(find_calibration("h100-sxm", engine))
        mine = {r.id: r for r in rows if r.engine == engine}
        out += [(engine, mine[p.id], p) for p in evaluate(list(mine.values()), eff, pred)]
    return out, where


def test_calibrated_within_15_percent():
    everything, where = _predicted()
    results = [x for x in everything if _shown(x[1], x[2].metric)]
    held = [x for x in results if _selected(x[1], x[2].metric)]
    print(f"\ncalibrated accuracy against {where}: {len(held)} points held to {LIMIT:.0%} "
          f"(vLLM TTFT, TRT-LLM TTFT above concurrency 16 and SGLang's above 32 shown, not held)")
    print(f"{'engine':7} {'tp':>2} {'isl/osl':>9} {'conc':>5} {'metric':13} {'measured':>9} {'kvtune':>9} {'err%':>6}  id")
    bad, stale = [], []
    for engine, row, p in results:
        io = f"{row.input_tokens or row.chunk_tokens}/{row.output_tokens or '-'}"
        conc = row.concurrency or row.num_requests or row.batch or ""
        print(f"{engine:7} {row.tp:>2} {io:>9} {conc:>5} {p.metric:13} {p.measured:9.4g} {p.after:9.4g} "
              f"{p.err_after * 100:+6.1f}  {p.id[-48:]}")
        if not _selected(row, p.metric):
            continue
        known = KNOWN_MISSES.get(f"{p.id}:{p.metric}")
        within = abs(p.err_after) <= LIMIT
        if known and within:
            stale.append(p.id)
        elif not known and not within:
            bad.append(f"{p.id}:{p.metric} {p.err_after * 100:+.1f}%")
    within = sum(abs(p.err_after) <= LIMIT for _, r, p in held)
    print(f"{within} of {len(held)} held points within {LIMIT:.0%}; {len(KNOWN_MISSES)} known misses")
    for engine in ("trtllm", "vllm", "sglang"):
        for metric in ("tpot_ms", "ttft_ms", "step_ms", "output_tok_s"):
            errs = [abs(p.err_after) for e, r, p in held if e == engine and p.metric == metric]
            if errs:
                print(f"  {engine:7} {metric:13} {sum(x <= LIMIT for x in errs):3d} of {len(errs):3d} within, "
                      f"MAPE {100 * sum(errs) / len(errs):.1f}%")
    assert not bad, f"{len(bad)} points beyond {LIMIT:.0%}: {bad[:10]}"
    assert not stale, f"KNOWN_MISSES now within {LIMIT:.0%}, remove them: {stale}"


# The exemptions can only shrink: a point leaves KNOWN_MISSES when the model improves (the test
# above fails on a stale entry), never joins it to make a regression pass. Lower this number when
# you remove entries; raising it needs a reviewer's reason in the commit.
KNOWN_MISSES_MAX = 37


def test_known_misses_only_shrink():
    assert len(KNOWN_MISSES) <= KNOWN_MISSES_MAX
    for key, why in KNOWN_MISSES.items():
        assert ":" in key and why.strip(), f"{key}: a known miss names its metric and says why"


# Groups not held point by point (the module docstring says why) are held as groups: each group's
# TTFT MAPE against the measured runs may not grow beyond what the shipped calibration gives today
# (measured 2026-12-01 with `pytest -s`; the number in brackets). A model change that improves a
# group lowers its ceiling here. (engine, tp) -> (MAPE ceiling %, sign of the bias)
TTFT_GROUP_CEILING_PCT: dict[tuple[str, int], tuple[float, int]] = {
    ("vllm", 1): (23.0, -1),    # [21.8] one run (4000/1000)
    ("vllm", 2): (52.0, -1),    # [50.5] 31 runs: ~3 prefills even at 8 clients (bench/RESULTS-ttft.md)
    ("vllm", 4): (60.0, -1),    # [58.3] 30 runs
    ("vllm", 8): (61.0, -1),    # [59.1] 31 runs
    ("trtllm", 1): (25.0, -1),  # [23.1] every concurrency, not only the <= 16 held above
    ("trtllm", 2): (28.0, -1),  # [26.5]
    ("trtllm", 4): (32.0, -1),  # [30.6]
    ("trtllm", 8): (41.0, -1),  # [39.5] 64-128 clients jump by up to a second while TPOT stays put
}


def test_ttft_groups_within_their_ceilings():
    everything, _ = _predicted()
    for (engine, tp), (ceiling, sign) in TTFT_GROUP_CEILING_PCT.items():
        errs = [p.err_after for e, r, p in everything if e == engine and r.tp == tp and p.metric == "ttft_ms"]
        assert errs, f"no {engine} TP{tp} TTFT rows: the table changed"
        mape = 100 * sum(abs(x) for x in errs) / len(errs)
        bias = sum(errs) / len(errs)
        print(f"{engine} TP{tp}: TTFT MAPE {mape:.1f}% (ceiling {ceiling}%), bias {100 * bias:+.1f}% over {len(errs)} runs")
        assert mape <= ceiling, f"{engine} TP{tp} TTFT MAPE {mape:.1f}% > {ceiling}%"
        assert bias * sign > 0, f"{engine} TP{tp} TTFT bias changed sign ({100 * bias:+.1f}%): look again"


def _waiting_slope(rows, engine: str, c: int) -> list[float]:
    """Per (TP, prompt) group at concurrency c: the slope of measured mean TTFT against the request
    lifetime L = osl x TPOT, times (c - 1). A request that always waits for one of c - 1 slots
    waits one departure interval, L / (c - 1): slope x (c - 1) = 1; no queue: 0."""
    import numpy as np

    groups: dict = {}
    for r in rows:
        if r.engine == engine and r.concurrency == c and r.ttft_mean_ms and r.tpot_mean_ms:
            groups.setdefault((r.tp, r.input_tokens), []).append((r.output_tokens * r.tpot_mean_ms, r.ttft_mean_ms))
    return [float(np.polyfit(*np.array(v).T, 1)[0]) * (c - 1) for v in groups.values() if len(v) >= 3]


def test_trtllm_runs_kept_one_request_waiting():
    """Why the TensorRT-LLM rows carry batch_cap = concurrency - 1 (bench/fit_shipped_calibrations.py):
    at fixed TP, prompt and concurrency their TTFT grows with the output length by one departure
    interval, L / (C - 1), as if one request always waited for a slot; vLLM's does not grow."""
    import numpy as np

    rows, _ = _rows()
    for c in (8, 16):
        trt = _waiting_slope(rows, "trtllm", c)
        vllm = _waiting_slope(rows, "vllm", c)
        print(f"C={c}: TRT-LLM slope x (C-1) median {np.median(trt):.2f} over {len(trt)} groups; "
              f"vLLM {np.median(vllm):+.2f} over {len(vllm)}")
        assert len(trt) >= 10 and 0.8 <= np.median(trt) <= 1.2
        assert len(vllm) >= 5 and abs(np.median(vllm)) < 0.1
    trt_rows = [r for r in rows if r.engine == "trtllm" and r.concurrency]
    assert trt_rows and all(r.batch_cap == r.concurrency - 1 for r in trt_rows)
    assert all(r.batch_cap is None for r in rows if r.engine != "trtllm")


def _ttft_ratio(rows, engine: str, key_a, key_b) -> list[float]:
    """Measured TTFT(key_a) / TTFT(key_b) over (TP >= 2, prompt, output, concurrency) groups; keys
    map a row's (output, concurrency) to the pair's other member."""
    d = {(r.tp, r.input_tokens, r.output_tokens, r.concurrency): r.ttft_mean_ms
         for r in rows if r.engine == engine and r.tp >= 2 and r.concurrency and r.ttft_mean_ms}
    out = []
    for (tp, isl, osl, c) in d:
        a, b = (tp, isl) + key_a(osl, c), (tp, isl) + key_b(osl, c)
        if (tp, isl, osl, c) == b and a in d:
            out.append(d[a] / d[b])
    return out


def test_sglang_ttft_grows_with_clients_not_with_output():
    """Why SGLang rows are simulated prefill-first with clients starting together (lock-step rounds):
    its TTFT grows about as fast as the round (the prompts of every client, prefilled before anyone
    decodes: 16 -> 64 clients gives up to 4x) and not with the output length; vLLM's and
    TensorRT-LLM's grow far less with the clients, TensorRT-LLM's grows with the output."""
    import numpy as np

    rows, _ = _rows()
    c64 = lambda o, c: (o, 64)  # noqa: E731
    c16 = lambda o, c: (o, 16)  # noqa: E731
    o256 = lambda o, c: (256, c)  # noqa: E731
    o128 = lambda o, c: (128, c)  # noqa: E731
    sgl, vllm, trt = (np.median(_ttft_ratio(rows, e, c64, c16)) for e in ("sglang", "vllm", "trtllm"))
    sgl_out, trt_out = (np.median(_ttft_ratio(rows, e, o256, o128)) for e in ("sglang", "trtllm"))
    print(f"TTFT 64 / 16 clients, median: SGLang {sgl:.2f}, vLLM {vllm:.2f}, TRT-LLM {trt:.2f}; "
          f"output 256 / 128: SGLang {sgl_out:.2f}, TRT-LLM {trt_out:.2f}")
    assert 2.5 <= sgl <= 4.0 and vllm < 2.2 and trt < 2.2
    assert 0.9 <= sgl_out <= 1.1 and trt_out > 1.15
