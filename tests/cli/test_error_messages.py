"""Issue 16 item 5: every error message names only options and keys that exist.

Walks the source (``ast``) for the text of every raised exception in ``costmodel/`` and
``optimizer/`` (string constants and the constant parts of f-strings inside ``raise X(...)``) and
checks each ``--flag`` it names against the click commands that can raise it (introspected from
the ``kvtune`` group), and each dotted workload key (``hardware.gpu``, ``search.tp``, ...) against
the workload schema (introspected from ``optimizer/workload.py``'s ``r.mapping(value, name, keys)``
calls). A message raised from shared code must name flags that every command reaching it has.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import click

from kvtune.optimizer.cli import main

ROOT = Path(__file__).parent.resolve().parents[1]
FLAG = re.compile(r"(?<![\w-])--([a-z][a-z0-9-]*)")
YAML_KEY = re.compile(r"\b(hardware|search|slo|workload|speculative)\.([a-z_]+)\b")
MODEL_COMMANDS = ("estimate", "simulate", "goodput", "solve")

# which commands can raise a module's messages (default: every command that runs the cost model)
REACHED_BY = {
    "costmodel/fit.py": ("calibrate",),  # validate reaches only RowPredictor, which names no flag
    "optimizer/calibrate.py": ("calibrate", "validate"),
    "optimizer/calibrate_held_out.py": ("calibrate",),
    "optimizer/validate.py": ("validate",),
    "optimizer/search.py": ("solve",),
    "optimizer/storage.py": ("solve",),
    "optimizer/recommend.py": ("solve",),
    "optimizer/report.py": ("solve",),
    "optimizer/gpu_choice.py": ("solve",),
    "optimizer/importers.py": ("profile import",),
    "optimizer/profile_run.py": ("profile run",),
    "costmodel/profile_table.py": ("profile import", "profile run", "calibrate", *MODEL_COMMANDS),
}
# kvtune tune's engine adapters and loop (optimizer/adapters/, optimizer/tune*.py) are reached by tune alone
REACHED_BY |= {f"optimizer/adapters/{p.name}": ("tune",) for p in (ROOT / "optimizer" / "adapters").glob("*.py")}
REACHED_BY |= {f"optimizer/{p.name}": ("tune",) for p in (ROOT / "optimizer").glob("tune*.py")}
# optimizer/launch's ``Unsupported`` reasons name the engines' flags (vLLM, SGLang, ...), not kvtune's:
# launch_settings prints them in place of a command; no command raises them as an error
REACHED_BY |= {f"optimizer/launch/{p.name}": () for p in (ROOT / "optimizer" / "launch").glob("*.py")}
# (module, flag): raised only on a path that the commands lacking the flag never take
UNREACHABLE = {
    ("optimizer/step_factory.py", "mode"): "solve always passes mode 'calibrated'; only estimate/simulate/goodput "
                                           "take --mode, and they check it with click first",
}


def commands() -> dict[str, set[str]]:
    """'estimate' -> {'model', 'gpu', ...}; subcommands as 'profile import'."""
    out = {}

    def walk(cmd: click.Command, path: str) -> None:
        if isinstance(cmd, click.Group):
            for name, sub in cmd.commands.items():
                walk(sub, f"{path} {name}".strip())
            return
        flags = set()
        for p in cmd.params:
            for o in (*p.opts, *p.secondary_opts):
                if o.startswith("--"):
                    flags.add(o[2:])
        out[path] = flags | {"help"}

    walk(main, "")
    return out


def schema() -> dict[str, set[str]]:
    """Section -> keys, from optimizer/workload.py's ``r.mapping(value, "section", (keys...))`` calls."""
    tree = ast.parse((ROOT / "optimizer" / "workload.py").read_text())
    out: dict[str, set[str]] = {}
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "mapping"
                and len(node.args) >= 3 and isinstance(node.args[1], ast.Constant)
                and isinstance(node.args[2], ast.Tuple)):
            keys = {e.value for e in node.args[2].elts if isinstance(e, ast.Constant)}
            out.setdefault(node.args[1].value, set()).update(keys)
    return out


def _strings(node: ast.AST) -> list[str]:
    """The literal text of a raised expression: constants, f-string parts joined with a gap."""
    out = []
    for n in ast.walk(node):
        if isinstance(n, ast.JoinedStr):
            out.append("\x00".join(v.value for v in n.values if isinstance(v, ast.Constant) and isinstance(v.value, str)))
        elif isinstance(n, ast.Constant) and isinstance(n.value, str):
            out.append(n.value)
    return out


@functools.cache
def messages() -> tuple[tuple[str, int, str, str], ...]:
    """(module, line, text, enclosing top-level function) of every raised message (the sources
    parsed once for the three tests that read them)."""
    out = []
    for folder in ("costmodel", "optimizer"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            tree = ast.parse(path.read_text())
            for top in tree.body:
                fn = top.name if isinstance(top, (ast.FunctionDef, ast.ClassDef)) else ""
                for node in ast.walk(top):
                    if isinstance(node, ast.Raise) and node.exc is not None:
                        for s in _strings(node.exc):
                            out.append((rel, node.lineno, s, fn))
    return tuple(out)


def _reached_by(rel: str, fn: str, cmds: dict[str, set[str]]) -> tuple[str, ...]:
    if rel.startswith("optimizer/cli/"):
        import importlib

        mod = importlib.import_module("kvtune." + rel[:-3].replace("/", "."))
        names = []
        for c in getattr(mod, "COMMANDS", []):
            subs = [c] if not isinstance(c, click.Group) else list(c.commands.values())
            for sub in subs:
                path = c.name if sub is c else f"{c.name} {sub.name}"
                if getattr(sub.callback, "__name__", None) == fn:
                    return (path,)   # raised inside this command's own function
                names.append(path)
        return tuple(names) or tuple(cmds)  # _common.py: shared by all
    return REACHED_BY.get(rel, MODEL_COMMANDS)


def test_there_are_messages_to_check():
    msgs = messages()
    assert len(msgs) > 100
    assert any(FLAG.search(s) for _, _, s, _ in msgs)
    assert any(YAML_KEY.search(s) for _, _, s, _ in msgs)


def test_every_flag_named_in_an_error_message_exists():
    cmds = commands()
    bad = []
    for rel, line, text, fn in messages():
        for flag in FLAG.findall(text.replace("\x00", " ")):
            if (rel, flag) in UNREACHABLE:
                continue
            lacking = [c for c in _reached_by(rel, fn, cmds) if flag not in cmds.get(c, set())]
            if lacking:
                bad.append(f"{rel}:{line}: --{flag} does not exist on {', '.join(lacking)}: {text[:90]!r}")
    assert not bad, "\n".join(bad)


def test_every_workload_key_named_in_an_error_message_exists():
    keys = schema()
    assert {"hardware", "search", "slo", "workload", "speculative"} <= set(keys)
    bad = []
    for rel, line, text, _ in messages():
        for section, key in YAML_KEY.findall(text):
            if key not in keys.get(section, set()):
                bad.append(f"{rel}:{line}: {section}.{key} is not a workload key: {text[:90]!r}")
    assert not bad, "\n".join(bad)


def test_a_message_that_named_missing_flags_is_caught():
    """The checker itself: the two messages issue 16 found would fail it."""
    cmds = commands()
    assert "mode" not in cmds["solve"]        # 'use --mode ideal' from solve's calibration lookup
    assert "tp" not in cmds["solve"]          # 'try --tp 16' from solve's memory check
    from kvtune.costmodel.calibration import find_calibration
    from kvtune.costmodel.errors import ProfileDataMissing
    import pytest

    with pytest.raises(ProfileDataMissing) as exc:
        find_calibration("no-such-gpu")
    assert all(f in cmds["solve"] for f in FLAG.findall(str(exc.value)))
