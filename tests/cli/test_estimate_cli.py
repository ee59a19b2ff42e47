"""``kvtune estimate`` end to end: the JSON contract and one-line errors with exit 2."""

import json

import pytest
from click.testing import CliRunner

from kvtune.optimizer.cli import main

SEED = ["estimate", "--model", "llama-2-70b", "--gpu", "h100-sxm", "--tp", "8", "--context", "4096",
        "--batch", "1,64,320", "--kv-dtype", "bf16", "--mode", "ideal", "--gpu-mem-util", "0.9", "--json"]


def run(args):
    return CliRunner().invoke(main, args, catch_exceptions=False)


def run_main(args, capsys):
    """Run the real entry point (its own error handling and sys.exit), not click's test runner."""
    with pytest.raises(SystemExit) as info:
        main.main(args=args, prog_name="kvtune")
    out = capsys.readouterr()
    return info.value.code, out.out, out.err


def test_seed_json_contract():
    r = run(SEED)
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    for key in ("kv_bytes_per_token", "weight_bytes", "kv_pool_tokens", "max_batch", "ceiling_tok_s",
                "single_user_tok_s", "rows", "source"):
        assert key in d
    assert d["kv_bytes_per_token"] == 327680
    assert [row["batch"] for row in d["rows"]] == [1, 64, 320]
    for row in d["rows"]:
        assert set(row) >= {"batch", "decode_step_ms", "tokens_per_step", "tok_s_per_user", "tok_s_total", "bound"}
        assert row["bound"] in ("bandwidth", "compute")
    assert d["source"].startswith("ideal")


def test_calibrated_is_default_and_says_so():
    d = json.loads(run(["estimate", "--model", "llama-3.1-8b", "--json"]).output)
    assert d["source"].startswith("calibrated:") and "sha256" in d["source"]


def test_spec_options():
    d = json.loads(run(["estimate", "--model", "llama-3.1-8b", "--batch", "1", "--spec-k", "5",
                        "--spec-alpha", "0.8", "--json"]).output)
    assert d["rows"][0]["tokens_per_step"] == pytest.approx(3.69, abs=0.01)


@pytest.mark.parametrize("args,needle", [
    (["estimate", "--model", "nosuch"], "unknown model 'nosuch'"),
    (["estimate", "--model", "llama-2-70b", "--tp", "3"], "8 KV heads"),
    (["estimate", "--model", "llama-2-70b", "--tp", "8", "--batch", "-1"], "--batch: -1 must be >= 1"),
    (["estimate", "--model", "llama-3.1-405b", "--tp", "2"], "short by"),
    (["estimate", "--model", "llama-3.1-8b", "--gpu", "tpu-v9"], "unknown gpu 'tpu-v9'"),
    (["estimate", "--model", "llama-3.1-8b", "--kv-dtype", "int4"], "int4"),
])
def test_bad_input_one_line_exit_2(args, needle, capsys):
    code, out, err = run_main(args, capsys)
    assert code == 2
    assert needle in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_malformed_config_json_exit_2(tmp_path, capsys):
    p = tmp_path / "config.json"
    p.write_text('{"hidden_size": 4096,')
    code, _, err = run_main(["estimate", "--model", str(p)], capsys)
    assert code == 2 and "malformed JSON" in err and len(err.strip().splitlines()) == 1


def test_human_table_has_units():
    r = run(["estimate", "--model", "llama-3.1-8b", "--batch", "1,8"])
    assert r.exit_code == 0
    assert "tok_s_per_user" in r.output and "step_ms" in r.output
