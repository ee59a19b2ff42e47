"""What the read limits cost (issue 24 item 2): the time to refuse a YAML alias bomb, an oversize
file, and to read a file right at each limit, with libyaml's scanner and with PyYAML's own (the
fallback when PyYAML is built without libyaml). Load average printed with the figures.

    nice python bench/bench_limits.py          # results: bench/RESULTS-limits.md
"""

from __future__ import annotations

import csv
import os
import tempfile
import time
from pathlib import Path

import yaml

import kvtune.costmodel.files as files
from kvtune.costmodel.errors import InputError
from kvtune.costmodel.files import MAX_TABLE_BYTES, MAX_YAML_BYTES, MAX_YAML_VALUES, parse_yaml, yaml_loader
from kvtune.costmodel.profile_table import read_table

ROOT = Path(__file__).resolve().parents[1]


def bomb(levels: int) -> str:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, levels + 1)]
    return "\n".join(lines) + "\n"


def timed(fn) -> tuple[float, str]:
    t0 = time.perf_counter()
    try:
        fn()
        out = "read"
    except (InputError, yaml.YAMLError) as exc:
        out = "refused: " + str(exc).split(": ", 2)[-1][:60]
    return time.perf_counter() - t0, out


def py_parse(text: str):
    loader = yaml_loader(pure_python=True)(text)
    try:
        return loader.construct_document(loader.get_single_node())
    finally:
        loader.dispose()


def main() -> None:
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; "
          f"limits: YAML {MAX_YAML_BYTES:,} bytes, {MAX_YAML_VALUES:,} values; tables {MAX_TABLE_BYTES:,} bytes")
    at_limit_values = "a: [" + ", ".join(["1"] * (MAX_YAML_VALUES - 3)) + "]\n"
    comment = "a: 1\n#" + "x" * (MAX_YAML_BYTES - 8) + "\n"
    cases = [(f"alias bomb, {lv} levels ({len(bomb(lv))} bytes, 9**{lv + 1} values)", bomb(lv)) for lv in (6, 7, 9, 30)]
    cases += [(f"{MAX_YAML_VALUES - 3:,} integers in one list (at the value limit)", at_limit_values),
              (f"{MAX_YAML_VALUES + 10_000:,} integers in one list", "a: [" + ", ".join(["1"] * (MAX_YAML_VALUES + 10_000)) + "]\n"),
              ("a 1 MiB comment (at the byte limit)", comment)]
    print(f"{'case':<58} {'libyaml_s':>9} {'python_s':>9}  outcome")
    for name, text in cases:
        c, out = timed(lambda text=text: parse_yaml(text, "x.yaml"))
        p, _ = timed(lambda text=text: py_parse(text))
        print(f"{name:<58} {c:9.3f} {p:9.3f}  {out}")
    with tempfile.TemporaryDirectory() as tmp:
        big = Path(tmp) / "w.yaml"
        with big.open("wb") as f:
            f.truncate(50 << 20)
        s, out = timed(lambda: files.load_yaml(big, "workload file"))
        print(f"{'a 50 MiB YAML file':<58} {s:9.3f} {'':>9}  {out}")
        with (ROOT / "profiles" / "tables" / "h100-silicon.csv").open(newline="") as f:
            src = list(csv.DictReader(f))
        t = Path(tmp) / "t.csv"
        with t.open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(src[0]))
            w.writeheader()
            n = 0
            while f.tell() < MAX_TABLE_BYTES - 2000:  # copies of the shipped rows, each its own id and source
                r = dict(src[n % len(src)])
                r["id"], r["source"] = f"x{n}-{r['id']}", f"{r['source']} copy {n}"
                w.writerow(r)
                n += 1
        s, out = timed(lambda: read_table(t))
        print(f"{f'a {t.stat().st_size / (1 << 20):.1f} MiB profile table ({n:,} rows, at the limit)':<58} {s:9.3f} {'':>9}  {out}")
        with t.open("ab") as f:
            f.truncate(MAX_TABLE_BYTES + 1)
        s, out = timed(lambda: read_table(t))
        print(f"{'a profile table one byte over the limit':<58} {s:9.3f} {'':>9}  {out}")
    print(f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
