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
