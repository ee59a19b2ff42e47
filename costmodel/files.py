"""Locating kvtune's shipped data files (the ``profiles`` package), and reading any text file a
user hands kvtune (YAML, JSON, CSV) so that every fault is one ``InputError`` line. Read-only.

Every file is read through ``read_text``, which refuses a file larger than its reader's stated
limit before reading it (``MAX_YAML_BYTES``, ``MAX_TABLE_BYTES``, ``MAX_TEXT_BYTES``), and reads no
more than the limit from a pipe or device (``/dev/zero`` ends too).

YAML is read by ``parse_yaml``: PyYAML's safe loader (libyaml's C scanner when PyYAML has it, its
own otherwise), plus the checks PyYAML does not make (each names the file, the line, the key and
the value):

- a file holds at most ``MAX_YAML_VALUES`` values once its aliases are expanded, counted while it is
  read, so an alias bomb (a few hundred bytes naming 9**9 values) stops at the limit instead of
  expanding; an alias inside the node it names (a recursive structure) is refused;
- a key given twice in one mapping (PyYAML keeps the last silently); merge keys (``<<: *base``)
  work, the mapping's own keys overriding the merged ones, as YAML defines them;
- exponent floats without a dot (``1e12``, ``5E-3``) are numbers, as YAML 1.2 reads them (PyYAML
  implements YAML 1.1, where they are strings);
- a number beyond float range (``1e400``, ``1`` followed by 400 zeros) is refused rather than
  read as ``inf`` or as an integer no float can hold; ``.inf`` and ``.nan`` are read as written
  and left to the reader of each key.
"""

from __future__ import annotations

import math
import os
import re
import stat
from contextlib import contextmanager
from pathlib import Path

import yaml
from yaml.composer import Composer, ComposerError
from yaml.constructor import ConstructorError, SafeConstructor
from yaml.events import AliasEvent
from yaml.parser import Parser
from yaml.reader import Reader
from yaml.resolver import Resolver
from yaml.scanner import Scanner

from .errors import InputError, KvtuneError, escape

__all__ = ["PROFILES_DIR", "printable", "profiles_path", "load_yaml", "parse_yaml", "read_text", "reading", "path_kind",
           "FLOAT_MAX", "UNFORESEEN", "MAX_YAML_BYTES", "MAX_YAML_VALUES", "MAX_TABLE_BYTES", "MAX_TEXT_BYTES",
           "yaml_loader"]

PROFILES_DIR = Path(__file__).resolve().parent.parent / "profiles"
FLOAT_MAX = 1.7976931348623157e308  # largest finite IEEE 754 double (sys.float_info.max)

# Limits on what kvtune reads, far above any real file and low enough that a file at the limit is
# read in seconds (bench/RESULTS-limits.md has the measurements):
# - YAML: the largest shipped file is 6.4 KB (profiles/hardware.yaml) and the most values any holds
#   is 304 (profiles/calibrations/h100-sxm-trtllm.yaml);
# - CSV profile tables: the largest shipped is 113 KB (354 rows, profiles/tables/h100-silicon.csv);
#   tables are read at 1.5-10 MB/s (the first figure on 2 cores at load 14);
# - anything else (benchmark JSON, config.json): a vLLM --save-detailed result keeps every token's
#   latency and reaches hundreds of MB, so only a bound on memory.
MAX_YAML_BYTES = 1 << 20          # 1 MiB
MAX_YAML_VALUES = 20_000          # scalars, lists and mappings, aliases expanded
MAX_TABLE_BYTES = 8 << 20         # 8 MiB, about 25,000 rows
MAX_TEXT_BYTES = 1 << 30          # 1 GiB


def printable(text: str) -> str:
    """``text`` as one printable line: control and format characters (a line break in a key, a
    bidirectional override) escaped (``costmodel.errors.escape``)."""
    return escape(text)


def profiles_path(*parts: str) -> Path:
    return PROFILES_DIR.joinpath(*parts)


def _size_text(n: int) -> str:
    return f"{n / (1 << 20):,.0f} MiB" if n >= 1 << 20 else f"{n / 1024:,.0f} KiB" if n >= 1024 else f"{n} bytes"


def read_text(path: str | Path, what: str = "file", max_bytes: int = MAX_TEXT_BYTES) -> str:
    """A file's text as UTF-8 (a byte-order mark is dropped); any fault is one line. A file larger
    than ``max_bytes`` is refused before it is read; a pipe or device is read to ``max_bytes``."""
    p = Path(path)
    try:
        with p.open("rb") as f:
            st = os.fstat(f.fileno())
            if stat.S_ISREG(st.st_mode) and st.st_size > max_bytes:
                raise InputError(f"{path}: the {what} is {_size_text(st.st_size)}; kvtune reads at most "
                                 f"{_size_text(max_bytes)} of a {what}")
            raw = f.read(max_bytes + 1)
    except FileNotFoundError:
        raise InputError(f"{path}: no such {what}") from None
    except IsADirectoryError:
        raise InputError(f"{path}: is a folder, not a {what}") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read {what} ({exc.strerror or exc})") from None
    if len(raw) > max_bytes:
        raise InputError(f"{path}: the {what} is longer than {_size_text(max_bytes)}; kvtune reads at most "
                         f"{_size_text(max_bytes)} of a {what}")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise InputError(f"{path}: line {line}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start}); "
                         f"a {what} is a text file") from None


# ---- the YAML loader -------------------------------------------------------------------------------

class _PyParser(Reader, Scanner, Parser):
    """PyYAML's own scanner and parser (pure Python)."""

    def __init__(self, stream):
        Reader.__init__(self, stream)
        Scanner.__init__(self)
        Parser.__init__(self)


try:  # libyaml's scanner and parser: a megabyte comment in milliseconds, where PyYAML's own takes seconds
    from yaml._yaml import CParser as _Parser
except ImportError:  # PyYAML built without libyaml
    _Parser = _PyParser  # type: ignore[misc,assignment]


class _CountingComposer(Composer):
    """PyYAML's composer, counting every value it builds and every value an alias repeats, so that
    composing stops at ``MAX_YAML_VALUES`` whatever the aliases would expand to."""

    def __init__(self) -> None:
        Composer.__init__(self)
        self._values = 0
        self._anchor_values: dict[str, int] = {}  # anchor -> values in the node it names

    def _count(self, n: int, mark) -> None:
        self._values += n
        if self._values > MAX_YAML_VALUES:
            raise ComposerError(None, None, f"holds more than {MAX_YAML_VALUES:,} values once its aliases are "
                                            f"expanded; kvtune reads at most {MAX_YAML_VALUES:,}", mark)

    def compose_node(self, parent, index):
        event = self.peek_event()
        if isinstance(event, AliasEvent):
            if event.anchor in self.anchors:
                n = self._anchor_values.get(event.anchor)
                if n is None:
                    raise ComposerError(None, None, f"alias *{escape(str(event.anchor))} is inside the node it names "
                                                    f"(a recursive structure)", event.start_mark)
                self._count(n, event.start_mark)
            return Composer.compose_node(self, parent, index)
        anchor = getattr(event, "anchor", None)
        before = self._values
        self._count(1, event.start_mark)
        node = Composer.compose_node(self, parent, index)
        if anchor is not None:
            self._anchor_values[anchor] = self._values - before
        return node


class _StrictBase(_CountingComposer, SafeConstructor, Resolver):
    """The safe loader with counted composition, refused duplicate keys and YAML 1.2 exponent
    floats, less its parser (below). The composer comes first so that its methods, not libyaml's,
    build the nodes."""

    def _init_parts(self) -> None:
        _CountingComposer.__init__(self)
        SafeConstructor.__init__(self)
        Resolver.__init__(self)


class _StrictLoader(_StrictBase, _Parser):
    def __init__(self, stream) -> None:
        _Parser.__init__(self, stream)
        self._init_parts()


class _PyStrictLoader(_StrictBase, _PyParser):
    def __init__(self, stream) -> None:
        _PyParser.__init__(self, stream)
        self._init_parts()


def yaml_loader(pure_python: bool = False) -> type:
    """The loader ``parse_yaml`` uses (libyaml's parser when PyYAML has it), or the same over
    PyYAML's pure-Python parser (what a PyYAML without libyaml runs): for tests and benchmarks."""
    return _PyStrictLoader if pure_python else _StrictLoader


_MERGE_TAG = "tag:yaml.org,2002:merge"


def _construct_mapping(loader: _StrictBase, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen = set()
    for key_node, _ in node.value:
        if key_node.tag == _MERGE_TAG:  # ``<<: *base``: merged by SafeConstructor below, own keys winning
            continue
        key = loader.construct_object(key_node, deep=deep)
        try:
            dup = key in seen
            seen.add(key)
        except TypeError:  # an unhashable key (a list or mapping used as a key)
            raise ConstructorError(None, None, "a key must be a plain value, not a list or mapping",
                                   key_node.start_mark) from None
        if dup:
            raise ConstructorError(None, None, f"key '{printable(str(key))}' given twice", key_node.start_mark)
    return loader.construct_mapping(node, deep)


# (the stubs type constructors for PyYAML's own Loader classes; this loader is assembled from their parts)
_StrictBase.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)  # type: ignore[type-var]
# YAML 1.2 core schema floats that YAML 1.1 reads as strings: an exponent without a dot
_EXP_FLOAT = re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$")
_StrictBase.add_implicit_resolver("tag:yaml.org,2002:float", _EXP_FLOAT, list("-+0123456789"))
_FLOAT_TAG, _INT_TAG = "tag:yaml.org,2002:float", "tag:yaml.org,2002:int"


def _check_numbers(node, key: str, shown: str, seen: set | None = None) -> None:
    """Refuse numbers beyond float range, naming the key path and the text as written. A node an
    alias repeats is checked once (at the first path that reaches it)."""
    seen = set() if seen is None else seen
    if id(node) in seen:
        return
    seen.add(id(node))
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
            _check_numbers(child, f"{key}[{i}]", shown, seen)
    elif isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            name = k.value if isinstance(k, yaml.ScalarNode) else "?"
            _check_numbers(v, f"{key}.{name}" if key else str(name), shown, seen)


def _clip(s: str) -> str:
    return s if len(s) <= 40 else s[:20] + f"...({len(s)} characters)"


def parse_yaml(text: str, shown: str) -> object:
    """Parse one YAML document; every fault is one ``InputError`` naming ``shown`` and the line."""
    if len(text) > MAX_YAML_BYTES:  # callers read with read_text(..., MAX_YAML_BYTES); this is the net
        raise InputError(f"{shown}: the YAML file is longer than {_size_text(MAX_YAML_BYTES)}; kvtune reads at most "
                         f"{_size_text(MAX_YAML_BYTES)} of a YAML file")
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
        context = getattr(exc, "context", None)
        cmark = getattr(exc, "context_mark", None)
        if context and context.startswith("found"):  # "found duplicate anchor 'a'; first occurrence" + "second ..."
            problem = f"{context} (line {cmark.line + 1}), {problem}" if cmark is not None else context
        raise InputError(f"{shown}:{where} invalid YAML: {printable(problem)}") from None
    except RecursionError:
        raise InputError(f"{shown}: invalid YAML: nested too deeply") from None
    finally:
        if loader is not None:
            loader.dispose()


def load_yaml(path: Path, what: str = "YAML file") -> object:
    """Read and parse a YAML file (``read_text`` then ``parse_yaml``), at most ``MAX_YAML_BYTES``."""
    return parse_yaml(read_text(path, what, MAX_YAML_BYTES), str(path))


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
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return None
    return "file" if stat.S_ISREG(mode) else "dir" if stat.S_ISDIR(mode) else "other"
