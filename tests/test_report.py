"""--report DIR: report.md plus three readable PNG plots for the pick."""

from pathlib import Path

import pytest

from kvtune.optimizer.recommend import solve
from kvtune.optimizer.report import write_report
from kvtune.optimizer.workload import load_workload

EX = Path(__file__).resolve().parents[1] / "examples"


@pytest.mark.slow
def test_report_writes_markdown_and_plots(tmp_path):
    spec = load_workload(EX / "chat-llama3.1-8b.yaml")
    r = solve(spec, trials=20)
    md = Path(write_report(r, spec, str(tmp_path / "rep")))
    text = md.read_text()
    for png in ("frontier.png", "pareto.png", "latency.png"):
        p = md.parent / png
        assert p.exists() and p.stat().st_size > 10_000
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"({png})" in text
    assert "vllm serve" in text and f"{r.recommendation.replicas} x TP{r.recommendation.tp}" in text
    assert "nvidia.com/gpu" in text
