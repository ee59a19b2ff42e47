"""Locating kvtune's shipped data files (the ``profiles`` package), and reading any text file a
user hands kvtune (YAML, JSON, CSV) so that every fault is one ``InputError`` line. Read-only.

YAML is read by ``parse_yaml``: PyYAML's safe loader, plus three checks PyYAML does not make
(each names the file, the line, the key and the value):

- a key given twice in one mapping (PyYAML keeps the last silently);
- exponent floats without a dot (``1e12``, ``5E-3``) are numbers, as YAML 1.2 reads them (PyYAML
  implements YAML 1.1, where they are strings);
- a number beyond float range (``1e400``, ``1`` followed by 400 zeros) is refused rather than
  read as ``inf`` or as an integer no float can hold; ``.inf`` and ``.nan`` are read as written
  and left to the reader of each key.
"""

from __future__ import annotations

import math
import re
from contextlib import contextmanager
from pathlib import Path

import yaml

from .errors import InputError, KvtuneError

__all__ = ["PROFILES_DIR", "printable", "profiles_path", "load_yaml", "parse_yaml", "read_text", "reading", "path_kind", "FLOAT_MAX", "UNFORESEEN"]

PROFILES_DIR = Path(__file__).resolve().parent.parent / "profiles"
FLOAT_MAX = 1.7976931348623157e308  # largest finite IEEE 754 double (sys.float_info.max)


def printable(text: str) -> str:
    """``text`` as one printable line: control characters (a line break in a key) escaped."""
    return text if text.isprintable() else text.encode("unicode_escape").decode("ascii")


def profiles_path(*parts: str) -> Path:
    return PROFILES_DIR.joinpath(*parts)


def read_text(path: str | Path, what: str = "file") -> str:
    """A file's text as UTF-8 (a byte-order mark is dropped); any fault is one line."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        raise InputError(f"{path}: no such {what}") from None
    except IsADirectoryError:
        raise InputError(f"{path}: is a folder, not a {what}") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read {what} ({exc.strerror or exc})") from None
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise InputError(f"{path}: line {line}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start}); "
                         f"a {what} is a text file") from None


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys and reads YAML 1.2 exponent floats."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        try:
            dup = key in seen
            seen.add(key)
        except TypeError:  # an unhashable key (a list or mapping used as a key)
            raise yaml.constructor.ConstructorError(None, None, "a key must be a plain value, not a list or mapping",
                                                    key_node.start_mark) from None
        if dup:
            raise yaml.constructor.ConstructorError(None, None, f"key '{printable(str(key))}' given twice",
                                                    key_node.start_mark)
    return loader.construct_mapping(node, deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
# YAML 1.2 core schema floats that YAML 1.1 reads as strings: an exponent without a dot
_EXP_FLOAT = re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$")
_StrictLoader.add_implicit_resolver("tag:yaml.org,2002:float", _EXP_FLOAT, list("-+0123456789"))
_FLOAT_TAG, _INT_TAG = "tag:yaml.org,2002:float", "tag:yaml.org,2002:int"


def _check_numbers(node, key: str, shown: str) -> None:
    """Refuse numbers beyond float range, naming the key path and the text as written."""
    if isinstance(node, yaml.ScalarNode):
        if node.tag not in (_FLOAT_TAG, _INT_TAG):
            return
        text = node.value.replace("_", "").strip().lower()
        if node.tag == _FLOAT_TAG and text.lstrip("+-") in (".inf", ".nan"):
            return
        digits = text.lstrip("+-")
        try:
            if node.tag == _FLOAT_TAG:
                v = float(text)
            elif digits.isdigit():
                v = float(int(digits))
            else:
                return  # hexadecimal, octal, sexagesimal: left to PyYAML
        except OverflowError:
            v = math.inf
        except ValueError:
            return
        if not math.isfinite(v):
            raise InputError(f"{shown}: line {node.start_mark.line + 1}: {printable(key or 'value')} = "
                             f"{printable(_clip(node.value))}: "
                             f"beyond the range of a number (about 1.8e308)")
    elif isinstance(node, yaml.SequenceNode):
        for i, child in enumerate(node.value):
            _check_numbers(child, f"{key}[{i}]", shown)
    elif isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            name = k.value if isinstance(k, yaml.ScalarNode) else "?"
            _check_numbers(v, f"{key}.{name}" if key else str(name), shown)


def _clip(s: str) -> str:
    return s if len(s) <= 40 else s[:20] + f"...({len(s)} characters)"


def parse_yaml(text: str, shown: str) -> object:
    """Parse one YAML document; every fault is one ``InputError`` naming ``shown`` and the line."""
    loader = None
    try:
        loader = _StrictLoader(text)  # its reader refuses control characters here
        node = loader.get_single_node()
        if node is None:
            return None
        _check_numbers(node, "", shown)
        return loader.construct_document(node)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise InputError(f"{shown}:{where} invalid YAML: {printable(problem)}") from None
    except RecursionError:
        raise InputError(f"{shown}: invalid YAML: nested too deeply") from None
    finally:
        if loader is not None:
            loader.dispose()


def load_yaml(path: Path, what: str = "YAML file") -> object:
    """Read and parse a YAML file (``read_text`` then ``parse_yaml``)."""
    return parse_yaml(read_text(path, what), str(path))


# The last net under every reader of a user's file: a fault the reader's own checks did not
# foresee still reaches the user as one line naming the file, not as a traceback. The readers'
# tests and fuzzers assert that this net is never what catches a fault (UNFORESEEN marks it).
UNFORESEEN = "unforeseen fault"


@contextmanager
def reading(path, what: str):
    try:
        yield
    except KvtuneError:
        raise
    except (ValueError, TypeError, OverflowError, KeyError, IndexError, AttributeError, RecursionError,
            UnicodeError) as exc:
        first = (str(exc).splitlines() or [""])[0][:120]
        raise InputError(f"{path}: cannot read this {what} ({UNFORESEEN}: {type(exc).__name__}: {first})") from exc


def path_kind(path) -> str | None:
    """``"file"``, ``"dir"``, ``"other"`` or None (nothing there, or a name no file can have: too long,
    a NUL inside). Never raises: pathlib's ``exists()`` raises on a name longer than the system's limit."""
    import os
    import stat

    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return None
    return "file" if stat.S_ISREG(mode) else "dir" if stat.S_ISDIR(mode) else "other"
