"""``kvtune simulate`` takes any deployment ``solve`` can print (issue 22 point 5): a GPU type, a
multi-node layout, a disaggregated deployment; bad combinations are one line, exit 2."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from kvtune.optimizer.cli import main

ROOT = Path(__file__).parent.resolve().parents[1]
CHAT = str(ROOT / "examples" / "chat-llama3.1-8b.yaml")
BASE = ["simulate", CHAT, "--requests", "200", "--json"]


def _run(*args):
    return CliRunner().invoke(main, [*BASE, *args])


def test_a_disaggregated_deployment_simulates_each_unit_at_its_share_of_the_rate():
    r = _run("--prefill-tp", "1", "--prefill-replicas", "2", "--decode-tp", "1", "--decode-batch-cap", "64",
             "--units", "2", "--rate", "20")
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    c = out["config"]
    assert c["deployment"] == "disaggregated" and c["units"] == 2 and c["gpus"] == 2 * (2 + 1)
    assert c["prefill"] == {"tp": 1, "replicas": 2, "batch_cap": 16, "chunk_tokens": 8192}
    assert c["decode"]["batch_cap"] == 64 and c["link"] == "nvlink" and c["engine"] == "vllm"
    assert out["rate_req_s"] == 20 and out["requests"] == 200 and 0 <= out["slo_attainment"] <= 1


def test_the_gpu_type_and_a_layout_are_options():
    r = _run("--gpu", "h200", "--rate", "5")
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["config"]["gpu"] == "h200"
    r = _run("--tp", "2", "--pp", "2", "--rate", "5")
    assert r.exit_code == 0, r.output
    c = json.loads(r.output)["config"]
    assert (c["tp"], c["pp"], c["gpus"]) == (2, 2, 4)


def test_bad_combinations_are_one_line():
    for args, needle in ((["--prefill-tp", "1"], "needs both --prefill-tp and --decode-tp"),
                         (["--prefill-tp", "1", "--decode-tp", "1", "--tp", "2"], "describe a disaggregated deployment"),
                         (["--prefill-tp", "1", "--decode-tp", "1", "--concurrency", "4"], "Poisson --rate"),
                         (["--gpu", "no-such-gpu"], "no-such-gpu")):
        r = _run(*args)
        assert r.exit_code == 2 and needle in r.output and "Traceback" not in r.output, (args, r.output)
