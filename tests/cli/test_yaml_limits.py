"""What kvtune reads is bounded (issue 24): YAML alias bombs stop at ``MAX_YAML_VALUES`` values
while they are read (counted, not timed), a file above its reader's size limit is refused before
it is read, a pipe or device is read no further than the limit, and YAML merge keys work.

No test here times anything: each checks that the loader stops at the stated count or refuses
on the stated size, which is what keeps the cost bounded (bench/RESULTS-limits.md has the times).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from kvtune.costmodel.errors import InputError
from kvtune.costmodel.files import (MAX_TABLE_BYTES, MAX_YAML_BYTES, MAX_YAML_VALUES, load_yaml, parse_yaml,
                                    read_text, yaml_loader)
from kvtune.costmodel.profile_table import read_table
from kvtune.optimizer.workload import load_workload

ROOT = Path(__file__).parent.resolve().parent.parent


def bomb(levels: int, width: int = 9) -> str:
    """The billion-laughs shape: each level lists the one before ``width`` times (width**levels values)."""
    lines = [f"a0: &a0 [{', '.join(['x'] * width)}]"]
    for i in range(1, levels + 1):
        lines.append(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * width)}]")
    return "\n".join(lines) + "\n"


class Counted(yaml_loader()):  # type: ignore[misc,valid-type]
    """The loader, recording how many values it composed before it stopped."""

    peak = 0

    def _count(self, n, mark):
        try:
            super()._count(n, mark)
        finally:
            Counted.peak = max(Counted.peak, self._values)


def _parse_counted(text: str):
    Counted.peak = 0
    loader = Counted(text)
    try:
        return loader.construct_document(loader.get_single_node())
    finally:
        loader.dispose()


@pytest.mark.parametrize("levels", [4, 5, 9, 30])
def test_an_alias_bomb_stops_at_the_value_limit(levels):
    """9**levels values (9**30 ~ 4e28) are never expanded: composing stops one alias past the limit."""
    text = bomb(levels)
    assert 9 ** (levels + 1) > MAX_YAML_VALUES
    with pytest.raises(yaml.YAMLError, match=f"more than {MAX_YAML_VALUES:,} values"):
        _parse_counted(text)
    assert Counted.peak <= 2 * MAX_YAML_VALUES  # the last alias is counted whole (at most the limit), never walked
    with pytest.raises(InputError, match=r"x\.yaml: line \d+ invalid YAML: holds more than 20,000 values"):
        parse_yaml(text, "x.yaml")


def test_the_limit_counts_expanded_values_exactly():
    """A file of exactly ``MAX_YAML_VALUES`` values reads; one more is refused."""
    per_alias = 1 + 100  # a list of 100 scalars
    n_alias = (MAX_YAML_VALUES - 1 - 1 - 2 * (1 + per_alias)) // per_alias  # root map, keys, the anchored list
    head = "a: &a [" + ", ".join(["1"] * 100) + "]\nb: ["
    fill = MAX_YAML_VALUES - (1 + 1 + per_alias + 1 + 1 + n_alias * per_alias)  # scalars to land on the limit
    exact = head + ", ".join(["*a"] * n_alias + ["0"] * fill) + "]\n"
    doc = _parse_counted(exact)
    assert Counted.peak == MAX_YAML_VALUES and len(doc["b"]) == n_alias + fill
    with pytest.raises(yaml.YAMLError, match="more than"):
        _parse_counted(exact.replace("]\n", ", 0]\n"))


def test_a_recursive_alias_is_refused():
    with pytest.raises(InputError, match=r"alias \*a is inside the node it names"):
        parse_yaml("a: &a [1, *a]\n", "x.yaml")


def test_the_pure_python_parser_counts_too():
    """PyYAML without libyaml: the same composer, over PyYAML's own scanner."""
    loader = yaml_loader(pure_python=True)(bomb(9))
    with pytest.raises(yaml.YAMLError, match="more than"):
        loader.get_single_node()
    loader = yaml_loader(pure_python=True)("a: &a {x: 1}\nb: {<<: *a, y: 1e5}\n")
    assert loader.construct_document(loader.get_single_node()) == {"a": {"x": 1}, "b": {"x": 1, "y": 100000.0}}


def test_merge_keys_work_and_own_keys_win():
    d = parse_yaml("base: &b {ttft_ms: 500, tpot_ms: 40}\nslo:\n  <<: *b\n  tpot_ms: 30\n", "x.yaml")
    assert d["slo"] == {"ttft_ms": 500, "tpot_ms": 30}
    d = parse_yaml("a: &a {x: 1}\nb: &b {y: 2}\nc: {<<: [*a, *b], z: 3}\n", "x.yaml")
    assert d["c"] == {"x": 1, "y": 2, "z": 3}
    with pytest.raises(InputError, match="key 'z' given twice"):  # a mapping's own keys are still unique
        parse_yaml("a: &a {x: 1}\nc: {<<: *a, z: 3, z: 4}\n", "x.yaml")


def test_a_workload_with_a_merge_key_loads(tmp_path):
    w = tmp_path / "w.yaml"
    w.write_text("model: llama-3.1-8b\nhardware: {gpu: h100-sxm, usd_per_gpu_hour: 3.0}\n"
                 "workload:\n  rate_req_s: 5\n  classes:\n"
                 "    - {name: chat, share: 0.5, input_tokens: 512, output_tokens: 64, slo: &s {ttft_ms: 800}}\n"
                 "    - {name: rag, share: 0.5, input_tokens: 4096, output_tokens: 64, slo: {<<: *s, tpot_ms: 40}}\n"
                 "slo: {ttft_ms: 1000, tpot_ms: 50}\n")
    spec = load_workload(w)
    assert spec.workload.classes[1].ttft_ms == 800 and spec.workload.classes[1].tpot_ms == 40


def test_a_number_check_visits_an_aliased_node_once():
    """The old check walked every alias path (9**levels); a node is now checked once, at its first key."""
    with pytest.raises(InputError, match=r"line 1: a\[0\] = 1e400"):
        parse_yaml("a: &a [1e400]\nb: [*a, *a]\n", "x.yaml")


# ---- sizes ------------------------------------------------------------------------------------------

def _sparse(path: Path, size: int) -> Path:
    with path.open("wb") as f:  # a hole: no disk used, nothing to read before the size check
        f.truncate(size)
    return path


def test_a_yaml_file_over_the_limit_is_refused_before_reading(tmp_path):
    big = _sparse(tmp_path / "w.yaml", 50 << 20)
    with pytest.raises(InputError, match=r"w\.yaml: the workload file is 50 MiB; kvtune reads at most 1 MiB"):
        load_workload(big)
    with pytest.raises(InputError, match="the calibration file is 50 MiB"):
        load_yaml(big, "calibration file")


def test_a_yaml_file_at_the_limit_reads(tmp_path):
    p = tmp_path / "c.yaml"
    body = "a: 1\n"
    p.write_text(body + "#" * (MAX_YAML_BYTES - len(body) - 1) + "\n")
    assert os.path.getsize(p) == MAX_YAML_BYTES and load_yaml(p) == {"a": 1}
    with pytest.raises(InputError, match="1 MiB"):
        parse_yaml("#" * (MAX_YAML_BYTES + 1), "x.yaml")


def test_a_table_over_its_limit_is_refused(tmp_path):
    t = _sparse(tmp_path / "t.csv", MAX_TABLE_BYTES + 1)
    with pytest.raises(InputError, match=r"t\.csv: the profile table is 8 MiB; kvtune reads at most 8 MiB"):
        read_table(t)


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="needs /dev/zero")
def test_a_device_is_read_no_further_than_the_limit():
    with pytest.raises(InputError, match="longer than 1 KiB"):
        read_text("/dev/zero", "workload file", 1024)


def test_shipped_yaml_files_are_far_inside_the_limits():
    """The limits leave room: the largest shipped YAML file and its value count, against the limits."""
    largest = max((ROOT / "profiles").rglob("*.yaml"), key=lambda p: p.stat().st_size)
    assert largest.stat().st_size * 100 < MAX_YAML_BYTES
    for p in (ROOT / "profiles").rglob("*.yaml"):
        _parse_counted(p.read_text())
        assert Counted.peak * 20 < MAX_YAML_VALUES, p
