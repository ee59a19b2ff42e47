"""The tune summary's first line says in words why the session stopped (the JSON keeps the status key)."""

import pytest

from kvtune.optimizer.tune_records import TuneResult
from kvtune.optimizer.tune_report import summary_lines


def _result(status: str) -> TuneResult:
    return TuneResult(status=status, reason="why", workload="w.yaml", engine="llama-server", target_attainment=0.9,
                      check_multiplier=1.3, pick=None, promise_req_s=None, evidence="simulated",
                      attainment_at_promise=None, attainment_at_check=None, launch_line="", calibration_file="",
                      runs=25, engine_s=688.0)


@pytest.mark.parametrize("status, words", [("converged", "converged after 0 round(s)"),
                                           ("rounds", "stopped at the round limit after 0 round(s)"),
                                           ("budget", "stopped, budget spent after"),
                                           ("infeasible", "stopped, infeasible after"),
                                           ("unmeasurable", "stopped, unmeasurable after")])
def test_first_line_words(status: str, words: str) -> None:
    first = summary_lines(_result(status), "out")[0]
    assert first.startswith(f"kvtune tune w.yaml: {words}")
    assert "25 runs, 688 s of engine time (llama-server)" in first


def test_a_run_stopped_early_reports_the_bound_it_proved_not_its_few_requests_as_an_estimate() -> None:
    from kvtune.optimizer.tune import stop_record
    # issue 33: 12 of 58 sent, 6 misses where the target (0.9 of 52 counted) allows 5
    st = stop_record(sent=12, planned=58, counted_planned=52, misses=6, allowed=5)
    assert st["attainment_at_most"] == round(46 / 52, 4) < 0.9
    observed = {"value": 0.0, "lo": 0.0, "hi": 0.755, "n": 6, "met": 0, "confidence": 0.95, "warmup_excluded": 6,
                "method": "batch-wilson", "n_effective": 6.0}
    r = TuneResult(status="converged", reason="why", workload="w.yaml", engine="llama-server", target_attainment=0.9,
                   check_multiplier=1.3, pick={"tp": 1, "batch_cap": 4, "kv_dtype": "fp16", "spec_k": 0,
                                               "chunk_tokens": 1024},
                   promise_req_s=0.72, evidence="measured",
                   attainment_at_promise={**observed, "value": 0.93, "lo": 0.75, "hi": 0.98, "n": 52, "met": 48},
                   attainment_at_check={**observed, "stopped": st}, launch_line="", calibration_file="",
                   runs=13, engine_s=390.0)
    check = next(line for line in summary_lines(r, "out") if line.startswith("  at 1.3x"))
    assert "at most 0.885 (6 of 52 counted requests missed before the end; stopped after 12 of 58 sent)" in check
    assert "misses" in check and "0.000" not in check
