"""Hugging Face Hub ids resolved to local files: the Hub cache first, the Hub itself when
``huggingface_hub`` is installed and online.

The cache is where ``huggingface_hub`` (and every engine that downloads through it: vLLM, SGLang,
TensorRT-LLM) keeps what it fetched, in the layout its documentation describes (huggingface.co/docs/
huggingface_hub/guides/manage-cache)::

    <cache>/models--<org>--<name>/refs/main                 the commit the main branch points at
    <cache>/models--<org>--<name>/snapshots/<commit>/...    the files of that commit

``<cache>`` is ``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else ``$XDG_CACHE_HOME/huggingface/hub``, else
``~/.cache/huggingface/hub`` (huggingface_hub/constants.py). With ``huggingface_hub`` installed its own
``try_to_load_from_cache`` reads it; without, the layout above is read directly. Only a cache miss
goes online (``hf_hub_download``, which honours ``HF_HUB_OFFLINE``); no network, no package, or a
refusal is a miss, never an error: the caller says where it looked.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["HubFile", "hub_cache_dir", "hub_file", "looks_like_hub_id"]

# huggingface_hub validate_repo_id: letters, digits, '-', '_', '.'; no '--' or '..' (the cache's
# separator); at most 96 characters
_REPO = re.compile(r"^[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9][\w.-]{0,95}$")


@dataclass(frozen=True)
class HubFile:
    """``filename`` of ``repo_id`` on this machine: ``path``; ``how``: where it was found."""

    repo_id: str
    path: Path
    how: str            # "the Hugging Face cache", "the Hugging Face cache (huggingface_hub)", "downloaded ..."

    @property
    def folder(self) -> Path:
        """The snapshot folder holding the file (the checkpoint's other files sit beside it)."""
        return self.path.parent


def looks_like_hub_id(s: str) -> bool:
    """``org/name`` as the Hub spells repository ids (not a path: no leading ``.``, ``/``, ``~``)."""
    return bool(_REPO.match(s)) and "--" not in s and ".." not in s


def hub_cache_dir() -> Path:
    """The Hub cache folder, as huggingface_hub/constants.py resolves it."""
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(var):
            return Path(os.environ[var]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME") or "~/.cache"
    return Path(xdg).expanduser() / "huggingface" / "hub"


def _from_layout(repo_id: str, filename: str, cache: Path) -> Path | None:
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    try:
        commit = (repo / "refs" / "main").read_text().strip()
    except OSError:
        commit = ""
    if commit:
        p = repo / "snapshots" / commit / filename
        return p if p.is_file() else None
    # no refs/main (a snapshot fetched by commit): one snapshot holding the file is unambiguous
    try:
        found = sorted(s / filename for s in (repo / "snapshots").iterdir() if (s / filename).is_file())
    except OSError:
        return None
    return found[0] if len(found) == 1 else None


def _with_package(repo_id: str, filename: str, cache: Path, online: bool) -> HubFile | None:
    try:
        import huggingface_hub as hf  # optional: not a kvtune dependency
    except ImportError:
        return None
    try:
        got = hf.try_to_load_from_cache(repo_id, filename, cache_dir=str(cache))
    except Exception:   # an id the package refuses (HFValidationError): the layout reader says the same
        got = None
    if isinstance(got, str):
        return HubFile(repo_id, Path(got), "the Hugging Face cache (huggingface_hub)")
    if not online:
        return None
    try:
        path = hf.hf_hub_download(repo_id, filename, cache_dir=str(cache))
    except Exception:   # offline, unknown repository, gated, no such file: a miss, said by the caller
        return None
    return HubFile(repo_id, Path(path), "downloaded from the Hugging Face Hub (huggingface_hub)")


def hub_file(repo_id: str, filename: str = "config.json", online: bool = True) -> HubFile | None:
    """``filename`` of Hub repository ``repo_id`` on this machine, or None (not cached, and not
    downloadable: no huggingface_hub, offline, or refused)."""
    cache = hub_cache_dir()
    found = _with_package(repo_id, filename, cache, online)
    if found is not None:
        return found
    p = _from_layout(repo_id, filename, cache)
    return HubFile(repo_id, p, "the Hugging Face cache") if p is not None else None
