"""Issue 34 items 1 and 5: one meaning of --json ('-' = stdout), schema_version, the shipped JSON
Schemas (every example's workload and result), argv/env launch entries, typed options, KVTUNE_*
environment variables, the report extra and the progress line clipped to the terminal."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml
from click.testing import CliRunner

from example_solves import solve_example
from kvtune.optimizer.cli import main
from kvtune.optimizer.cli.solve import _Progress
from kvtune.optimizer.launch import launch_settings
from kvtune.optimizer.launch.shell import argv_of, commands_of
from kvtune.costmodel.errors import InputError
from kvtune.optimizer.output import SCHEMA_VERSION
from kvtune.optimizer.workload import load_workload_dict

ROOT = Path(__file__).parent.resolve().parent.parent
SCHEMAS = ROOT / "profiles" / "schemas"
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
CHAT = ROOT / "examples" / "chat-llama3.1-8b.yaml"


def _validator(name: str) -> jsonschema.Draft202012Validator:
    schema = json.loads((SCHEMAS / name).read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def _errors(v: jsonschema.Draft202012Validator, doc) -> list[str]:
    return [f"{e.json_path}: {e.message[:120]}" for e in v.iter_errors(doc)]


def _solve_stdout(workload: Path) -> tuple[dict, str]:
    """``kvtune solve W --json -`` in a process of its own: stdout must be the JSON alone."""
    p = subprocess.run([sys.executable, "-m", "kvtune", "solve", str(workload), "--json", "-", "--quiet"],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode in (0, 3), p.stderr[-2000:]
    return json.loads(p.stdout), p.stderr


# ---- the schemas ---------------------------------------------------------------------------------

@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_workload_is_valid_under_the_shipped_schema(path):
    assert _errors(_validator("workload.schema.json"), yaml.safe_load(path.read_text())) == []


def test_the_workload_schema_flags_a_typo_an_editor_should_underline():
    doc = yaml.safe_load(CHAT.read_text())
    doc["slo"]["tpot_msec"] = 50
    doc["objective"] = "cheapest"
    errs = _errors(_validator("workload.schema.json"), doc)
    assert any("tpot_msec" in e for e in errs) and any("cheapest" in e for e in errs), errs


def test_the_workload_schema_lists_every_search_key_the_reader_takes():
    """A search knob added to optimizer.space is read as search.<name>; an editor's schema that does
    not list it would underline a valid file."""
    doc = yaml.safe_load(CHAT.read_text())
    doc["search"] = {"no_such_key": 1}
    with pytest.raises(InputError) as exc:
        load_workload_dict(doc, "<test>")
    allowed = set(str(exc.value).split("allowed: ", 1)[1].split(", "))
    schema = json.loads((SCHEMAS / "workload.schema.json").read_text())
    assert allowed == set(schema["properties"]["search"]["properties"])


def test_solve_json_dash_is_json_only_on_stdout_valid_under_the_result_schema():
    result, stderr = _solve_stdout(CHAT)
    assert result["schema_version"] == SCHEMA_VERSION
    assert result["recommendation"]["gpus"] >= 1
    assert "Recommendation:" in stderr   # the human summary went to stderr
    assert _errors(_validator("result.schema.json"), result) == []
    # the launch entries as argv beside the shell text: the same words
    assert result["launch"]["argv"]["vllm"] == [argv_of(result["launch"]["vllm"])]


@pytest.mark.slow
@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_result_is_valid_under_the_shipped_schema(path, tmp_path_factory):
    """Every example's --json answer (solved once per session, shared with the report and launch
    tests; stdout as the JSON alone is the chat example's test above)."""
    s = solve_example(tmp_path_factory, path.stem)
    assert s.code == 0, s.text[-2000:]
    assert _errors(_validator("result.schema.json"), s.result) == []


def test_the_schemas_are_package_data():
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert '"schemas/*.json"' in pyproject and '"py.typed"' in pyproject
    assert (ROOT / "kvtune" / "py.typed").exists()
    assert (ROOT / "kvtune" / "profiles" / "schemas" / "result.schema.json").exists()


# ---- --json on every command ---------------------------------------------------------------------

def test_bare_json_still_prints_json_and_a_path_writes_the_file(tmp_path):
    r = CliRunner().invoke(main, ["estimate", "--model", "llama-3.1-8b", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["schema_version"] == SCHEMA_VERSION
    out = tmp_path / "est.json"
    r = CliRunner().invoke(main, ["estimate", "--model", "llama-3.1-8b", "--json", str(out)])
    assert r.exit_code == 0, r.output
    assert "max batch" in r.stdout          # the human text, since the JSON went to the file
    assert json.loads(out.read_text())["model"] == "llama-3.1-8b"


def test_bare_json_before_the_workload_argument_keeps_its_old_meaning():
    """``kvtune simulate --json W.yaml``: W.yaml is the input, not the output path (nothing overwritten)."""
    before = CHAT.read_bytes()
    r = CliRunner().invoke(main, ["simulate", "--json", str(CHAT), "--requests", "40"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["schema_version"] == SCHEMA_VERSION
    assert CHAT.read_bytes() == before


def test_calibrate_dash_is_the_yaml_alone_on_stdout(tmp_path, monkeypatch):
    """``-o -``: the calibration YAML on stdout (it loads as --calibration), the human text on stderr."""
    monkeypatch.chdir(tmp_path)
    table = ROOT / "tests" / "data" / "sweeps" / "nim-llama-3.3-70b-fp8-tp2-5000x500-low.csv"
    r = CliRunner().invoke(main, ["calibrate", str(table), "--gpu", "h100-sxm", "-o", "-", "--name", "nim-fit"])
    assert r.exit_code == 0, r.output
    doc = yaml.safe_load(r.stdout)
    assert doc["name"] == "nim-fit" and doc["params"]
    assert "calibrate h100-sxm" in r.stderr and "wrote the calibration to stdout" in r.stderr
    assert not (tmp_path / "-").exists()
    r = CliRunner().invoke(main, ["calibrate", str(table), "-o", "-"])
    assert r.exit_code == 2 and r.output.startswith("Error: -o -: give --name"), r.output
    r = CliRunner().invoke(main, ["calibrate", str(table), "-o", "-", "--name", "x", "--json", "-"])
    assert r.exit_code == 2 and r.output.startswith("Error: -o - and --json -"), r.output


@pytest.mark.parametrize("args", [
    ["solve", str(CHAT), "--report", "-"],
    ["tune", str(CHAT), "--url", "http://127.0.0.1:9/v1", "-o", "-"],
    ["profile", "run", "--url", "http://127.0.0.1:9/v1", "--model", "m", "-o", "-"],
    ["profile", "open-loop", str(CHAT), "--url", "http://127.0.0.1:9/v1", "--model", "m", "--rate", "1", "-o", "-"],
    ["profile", "import", str(ROOT / "tests" / "data" / "import_guidellm.json"), "-o", "-"],
], ids=["solve-report", "tune-out", "profile-run", "profile-open-loop", "profile-import"])
def test_a_dash_for_an_output_that_cannot_be_stdout_is_one_error_line_and_no_file_named_dash(args, tmp_path,
                                                                                              monkeypatch):
    """'-' means stdout for every --json and -o; where the output is a folder, or a table kvtune reads
    back and writes per-request logs beside, it cannot be, and a file or folder named '-' is not it."""
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 2, r.output
    assert r.output.startswith("Error: ") and len(r.output.strip().splitlines()) == 1, r.output
    assert "'-' (stdout) cannot take" in r.output, r.output
    assert list(tmp_path.iterdir()) == []


# ---- launch argv / env ---------------------------------------------------------------------------

def test_launch_argv_and_env_split_the_shell_text():
    out = launch_settings("llama-3.1-8b", {"tp": 1, "batch_cap": 64, "kv_dtype": "bf16", "spec_k": 0,
                                           "chunk_tokens": 8192}, 1, 0.9, None)
    supported = [e for e in ("vllm", "sglang", "llamacpp") if e not in out["unsupported"]]
    assert {"vllm", "sglang"} <= set(supported)
    for e in supported:
        assert out["argv"][e] == [argv_of(out[e])] and out["env"][e] == [{}]
    for e in out["unsupported"]:
        assert out["argv"].get(e, []) == []   # nothing to start
    assert out["argv"]["trtllm"] == [argv_of(out["trtllm"]["command"])]
    cmds = commands_of("# a comment\nA=1 B='x y' vllm serve m \\\n  --port 8000\n\nvllm-router --port 9\n")
    assert cmds == [{"argv": ["vllm", "serve", "m", "--port", "8000"], "env": {"A": "1", "B": "x y"}},
                    {"argv": ["vllm-router", "--port", "9"], "env": {}}]


# ---- typed options, env vars ---------------------------------------------------------------------

def test_tune_help_shows_no_text_for_a_number():
    r = CliRunner().invoke(main, ["tune", "--help"], terminal_width=200)
    numeric = ["--max-runs", "--max-engine-s", "--run-s", "--min-requests", "--max-requests", "--warmup", "--check",
               "--near", "--max-rounds", "--port", "--startup-timeout-s", "--request-timeout-s", "--seed", "--threads",
               "--memory-budget-gb", "--rates"]
    for flag in numeric:
        line = next(ln for ln in r.output.splitlines() if re.search(rf"(^|\s){flag}\s", ln))
        assert " TEXT" not in line, line
    assert "[vllm|sglang|trtllm|llamacpp]" in r.output   # --engine is a choice


def _number_list(text) -> bool:
    try:
        return bool(text) and all(float(x) == float(x) for x in str(text).split(","))
    except ValueError:
        return False


def test_no_help_shows_text_for_a_number_or_a_list_of_numbers():
    """Every command, not only tune: a text option that takes numbers (its default a number or a
    comma list of them, or --rate) names what it takes (INTEGER,... / FLOAT,...) in --help."""
    import click

    def walk(cmd, path):
        if isinstance(cmd, click.Group):
            for name, sub in cmd.commands.items():
                yield from walk(sub, path + [name])
        else:
            yield path, cmd

    checked = 0
    for path, cmd in walk(main, []):
        flags = [p.opts[-1] for p in cmd.params if isinstance(p, click.Option) and p.type.name == "text"
                 and (_number_list(p.default) or p.opts[-1] == "--rate")]
        if not flags:
            continue
        out = CliRunner().invoke(main, [*path, "--help"], terminal_width=200).output
        for flag in flags:
            line = next(ln for ln in out.splitlines() if re.search(rf"(^|\s){flag}\s", ln))
            assert " TEXT" not in line, (path, line)
            checked += 1
    assert checked >= 5   # estimate --batch; profile run --concurrency, --isl, --osl; profile open-loop --rate


def test_solve_sampler_and_engine_are_choices():
    # choices in --help (above), refused in kvtune's one line, as before they were choices
    r = CliRunner().invoke(main, ["solve", str(CHAT), "--sampler", "random"])
    assert r.exit_code == 2 and r.output == "Error: --sampler must be one of tpe, grid, nsga2, got 'random'\n"
    r = CliRunner().invoke(main, ["solve", str(CHAT), "--engine", "ollama"])
    assert r.exit_code == 2 and r.output == \
        "Error: --engine must be one of vllm, sglang, trtllm, llamacpp, got 'ollama'\n"


def test_tune_bad_number_is_one_error_line():
    r = CliRunner().invoke(main, ["tune", str(CHAT), "--max-runs", "ten"])
    assert r.exit_code == 2 and "--max-runs: 'ten' is not an integer" in r.output


def test_options_read_kvtune_environment_variables():
    r = CliRunner().invoke(main, ["estimate", "--model", "llama-3.1-8b", "--json", "-"], env={"KVTUNE_ESTIMATE_TP": "2"})
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["tp"] == 2


# ---- the report extra ----------------------------------------------------------------------------

def test_report_without_matplotlib_names_the_extra_and_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)   # importlib.util.find_spec then says: not installed
    dest = tmp_path / "rep"
    r = CliRunner().invoke(main, ["solve", str(CHAT), "--report", str(dest), "--json", str(tmp_path / "r.json")])
    assert r.exit_code == 2
    assert "pip install 'kvtune[report]'" in r.output and r.output.startswith("Error:")
    assert not dest.exists() and not (tmp_path / "r.json").exists()


def test_tune_without_matplotlib_writes_its_report_and_says_the_plots_need_the_extra(tmp_path, monkeypatch):
    """kvtune tune measures whether or not the plots can be drawn, so it does not refuse; its summary
    (printed, and in report.md) must not claim plots it did not draw, and names what to install."""
    from kvtune.optimizer.tune_records import TuneResult
    from kvtune.optimizer.tune_report import summary_lines, write_report
    result = TuneResult(status="converged", reason="", workload="w.yaml", engine="llamacpp", target_attainment=0.9,
                        check_multiplier=1.3, pick=None, promise_req_s=None, evidence="simulated",
                        attainment_at_promise=None, attainment_at_check=None, launch_line="", calibration_file="",
                        runs=0, engine_s=0.0)
    assert "report.md (plots)" in summary_lines(result, "out")[-1]
    monkeypatch.setitem(sys.modules, "matplotlib", None)   # importlib.util.find_spec then says: not installed
    last = summary_lines(result, "out")[-1]
    assert "report.md (plots)" not in last and "pip install 'kvtune[report]'" in last, last
    page = write_report(result, tmp_path).read_text()
    assert "pip install 'kvtune[report]'" in page and not list(tmp_path.glob("*.png"))


# ---- the progress line ---------------------------------------------------------------------------

def test_progress_line_is_clipped_to_the_terminal_width(monkeypatch):
    monkeypatch.setattr("shutil.get_terminal_size", lambda *a, **k: __import__("os").terminal_size((40, 24)))
    buf = io.StringIO()
    p = _Progress(enabled=True, stream=buf)
    p.start("h100-sxm, a long label for the GPU type")
    p(3, 10)
    p.stage("race", 120)
    p.close()
    drawn = [seg for seg in buf.getvalue().replace("\n", "\r").split("\r") if seg]
    assert drawn and all(len(seg) <= 39 for seg in drawn), [len(s) for s in drawn]
