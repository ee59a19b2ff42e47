"""``kvtune example``: the shipped example workloads, for a user who installed kvtune with pip alone.

The examples live in ``examples/`` at the repository root (the design card); the package links them
as ``kvtune/examples`` and a wheel carries them as package data. ``kvtune example`` lists them;
``kvtune example NAME`` writes ``NAME.yaml`` (and the trace file it replays, at the same relative
path) into the current folder or to ``-o PATH``, whole or not at all, never over an existing file.
"""

from __future__ import annotations

from pathlib import Path

import click
import yaml

from kvtune.costmodel.errors import InputError

from ._common import check_output_path, write_atomic

__all__ = ["examples_dir", "example_names", "COMMANDS"]


def examples_dir() -> Path:
    import kvtune
    return Path(kvtune.__file__).resolve().parent / "examples"


def example_names() -> list[str]:
    return sorted(p.stem for p in examples_dir().glob("*.yaml"))


def _summary(path: Path) -> str:
    """The first sentence of the example's opening comment (each example opens with one saying
    what it shows)."""
    words = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        words.append(line.lstrip("# ").strip())
    text = " ".join(words)
    ends = [i + 1 for i, c in enumerate(text) if c in ".?" and text[i + 1:i + 2] in (" ", "")]
    return text[:ends[0]] if ends else text


def _trace(path: Path) -> str | None:
    """The trace file an example replays (``workload.trace``, relative to the example), if any."""
    doc = yaml.safe_load(path.read_text())
    trace = (doc.get("workload") or {}).get("trace")
    return str(trace) if trace else None


@click.command("example")
@click.argument("name", required=False)
@click.option("-o", "--output", default=None,
              help="Where to write the workload (default: ./NAME.yaml); '-' prints it instead.")
def example_cmd(name: str | None, output: str | None) -> None:
    """List the shipped example workloads, or write example NAME to start from (then: kvtune solve NAME.yaml)."""
    names = example_names()
    if name is None:
        width = max(len(n) for n in names)
        for n in names:
            click.echo(f"{n:<{width}}  {_summary(examples_dir() / f'{n}.yaml')}")
        click.echo("\nwrite one with  kvtune example NAME  (then  kvtune solve NAME.yaml)")
        return
    stem = name[:-len(".yaml")] if name.endswith(".yaml") else name
    if stem not in names:
        raise InputError(f"example {name!r}: no such example; one of {', '.join(names)}")
    src = examples_dir() / f"{stem}.yaml"
    if output == "-":
        click.echo(src.read_text(), nl=False)
        return
    dest = Path(output or f"{stem}.yaml")
    files = [(src, dest)]
    trace = _trace(src)
    if trace is not None:
        files.append((src.parent / trace, dest.parent / trace))
    for _, to in files:   # every path checked before anything is written
        if to.exists():
            raise InputError(f"{to}: exists; kvtune example never overwrites a file (remove it or pass -o)")
    check_output_path(dest, "-o")
    written: list[Path] = []
    try:
        for frm, to in reversed(files):   # the trace first: the workload names it
            to.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(to, frm.read_text())
            written.append(to)
    except BaseException:
        for w in written:   # whole or not at all
            w.unlink(missing_ok=True)
        raise
    click.echo(f"wrote {dest}" + (f" and {files[1][1]}" if len(files) > 1 else "")
               + f"; solve it with:  kvtune solve {dest}")


COMMANDS = [example_cmd]
