"""README's install and test commands are what CI runs: .ci/run holds each of them (but the clone,
which CI's checkout is), as written and in order."""

import re
from pathlib import Path

ROOT = Path(__file__).parent.resolve().parents[1]


def _block(section: str) -> list[str]:
    text = (ROOT / "README.md").read_text()
    body = text.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    code = re.search(r"```bash\n(.*?)```", body, re.S)
    assert code, f"README ## {section} has no bash block"
    return [ln.strip() for ln in code.group(1).splitlines() if ln.strip() and not ln.startswith("#")]


def test_ci_runs_the_readme_install_and_test_commands_exactly():
    ci = [ln.strip() for ln in (ROOT / ".ci" / "run").read_text().splitlines()]
    wanted = [c for c in _block("Install") + _block("Test") if not c.startswith("git clone")]
    assert wanted[0].startswith("python3 -m venv"), wanted   # a venv before any pip
    at = 0
    for cmd in wanted:
        assert cmd in ci[at:], f"{cmd!r} not in .ci/run after line {at}"
        at = ci.index(cmd, at) + 1


def test_the_install_installs_the_package_and_the_tests_add_their_tools():
    assert "pip install -e ." in _block("Install")
    assert not any("[test]" in c for c in _block("Install"))
    assert _block("Test")[:2] == ['pip install -e ".[test]"', "pytest -q -n auto"]   # xdist: the test extra
