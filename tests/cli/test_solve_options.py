"""kvtune solve's numeric options are typed (INTEGER in --help) and a bad value is still one line
naming the flag and the value."""

import pytest

from helpers import kvtune

NUMERIC = ("--trials", "--seed", "--verify-top", "--jobs", "--workers")


def test_numeric_options_show_as_integers_in_help():
    code, out = kvtune("solve", "--help")
    assert code == 0
    for flag in NUMERIC:
        line = next(ln for ln in out.splitlines() if ln.strip().startswith(flag + " "))
        assert line.split()[1] == "INTEGER", line


@pytest.mark.parametrize("flag", NUMERIC)
@pytest.mark.parametrize("value,says", [("ten", "is not an integer"), ("-5", "must be >=")])
def test_a_bad_numeric_value_is_one_line(flag, value, says, tmp_path):
    code, out = kvtune("solve", tmp_path / "w.yaml", flag, value)
    assert code == 2, out
    (line,) = [ln for ln in out.splitlines() if ln.startswith("Error:")]
    assert flag in line and value in line and says in line, line
    assert "Traceback" not in out
