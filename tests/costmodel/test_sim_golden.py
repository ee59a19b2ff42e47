"""The simulator reproduces its recorded golden runs bit for bit (tests/sim_golden_cases.py says
what they cover and how tests/data/sim_golden.json was produced): a refactor of the simulator must
not move a single number."""

from __future__ import annotations

import json

import pytest

from sim_golden_cases import CASES, FIXTURE, run_case

GOLDEN = json.loads(FIXTURE.read_text())


def test_the_fixture_covers_every_case():
    assert set(GOLDEN["cases"]) == set(CASES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_simulator_reproduces_golden_run(name):
    assert run_case(name) == GOLDEN["cases"][name]
