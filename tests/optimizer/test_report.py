"""--report DIR: report.md plus three readable PNG plots for the pick, for every kind of pick,
written whole or not at all."""

from pathlib import Path

import pytest

from kvtune.costmodel.hardware import resolve_gpu
from kvtune.costmodel.models import get_model
from kvtune.optimizer import report
from kvtune.optimizer.launch import build_pick, disaggregated_launch
from kvtune.optimizer.recommend import solve
from kvtune.optimizer.report import write_report
from kvtune.optimizer.workload import load_workload

EX = Path(__file__).parent.resolve().parents[1] / "examples"


def test_a_disaggregated_launch_renders_every_engine_and_config_file():
    """The disaggregated launch has no single config.yaml (the prefill, decode and server files)
    and no 'checked' line: the report renders whatever shape each engine's entry has."""
    arch, gpu = get_model("llama-3.1-70b"), resolve_gpu("h100-sxm")

    def pick(tp, cap, replicas):
        cfg = {"tp": tp, "batch_cap": cap, "kv_dtype": "bf16", "spec_k": 0, "chunk_tokens": 8192}
        return build_pick(arch.hf_id, cfg, replicas, 0.9, None, arch=arch, gpu=gpu)

    launch = disaggregated_launch(pick(2, 16, 3), pick(4, 64, 1))
    text = "\n".join(report._launch_lines(launch))
    for head in ("## Launch (vLLM)", "## Launch (SGLang)", "## Launch (TensorRT-LLM)", "## Kubernetes"):
        assert head in text
    for name, body in launch["trtllm"].items():
        if name.endswith("_yaml"):
            assert f"{name[:-5]}.yaml:" in text and body.strip().splitlines()[0] in text
    assert "vllm serve" in text and "trtllm-serve disaggregated" in text


def test_a_report_that_fails_leaves_nothing_behind(tmp_path, monkeypatch):
    def half_then_fail(result, spec, d, *overrides):
        (d / "frontier.png").write_bytes(b"\x89PNG half")
        raise RuntimeError("drawing failed")

    monkeypatch.setattr(report, "_write_files", half_then_fail)
    with pytest.raises(RuntimeError):
        write_report(None, None, str(tmp_path / "rep"))   # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []


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
