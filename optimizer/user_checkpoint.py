"""The workload's ``checkpoint:``: the weights the user serves, named as the engine loads them, and
what their files declare (``costmodel.checkpoint_format``).

    checkpoint: /models/llama-2-70b-fp8            # a folder (Hugging Face or ModelOpt layout)
    checkpoint: /models/qwen2.5-7b-q4_k_m.gguf     # a GGUF file (llama.cpp)
    checkpoint: Qwen/Qwen2.5-7B-Instruct           # a Hub id: read from the local Hugging Face cache
    checkpoint: bartowski/Qwen2.5-7B-Instruct-GGUF:Q4_K_M   # a published GGUF repository and its type

A folder, a file and a cached Hub id are read: the format they declare fills in ``weights:`` or must
agree with it, and a config.json beside them must describe the same architecture as ``model:``. A Hub
id that is not on this machine (not cached, no huggingface_hub or offline) is kept as given and
its format is not checked: the notes say so. ``optimizer.engine_space`` checks it against the
engine (a GGUF file needs llama.cpp; TensorRT-LLM's FP8 needs a ModelOpt folder) and
``optimizer.launch`` loads it.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from kvtune.costmodel.checkpoint_format import DeclaredFormat, folder_format, gguf_format
from kvtune.costmodel.checkpoints import GGUF_TYPES, Checkpoint
from kvtune.costmodel.dtypes import KNOWN, canonical
from kvtune.costmodel.errors import InputError, KvtuneError
from kvtune.costmodel.files import path_kind, read_text
from kvtune.costmodel.models import ModelArch, model_from_config

from .hf_cache import HubFile, hub_cache_dir, hub_file, looks_like_hub_id

__all__ = ["UserCheckpoint", "read_checkpoint", "hub_checkpoint", "check_weights", "check_architecture"]

Bad = Callable[[str, Any, str], KvtuneError]   # (key, value, why) -> the workload reader's one-line error
# the architecture numbers a checkpoint's config.json must share with model: (config.json keys as shown)
_SAME = (("n_layers", "num_hidden_layers"), ("hidden", "hidden_size"), ("n_heads", "num_attention_heads"),
         ("n_kv_heads", "num_key_value_heads"), ("intermediate", "intermediate_size"), ("vocab", "vocab_size"),
         ("n_experts", "num_experts"), ("moe_intermediate", "moe_intermediate_size"), ("kv_lora_rank", "kv_lora_rank"))
_SOURCE = "workload checkpoint:"   # Checkpoint.source of what the workload names


@dataclass(frozen=True)
class UserCheckpoint:
    """``given``: as the workload wrote it; ``load``: what the engines load (``id`` the folder, file
    or Hub id; ``kind`` "hf", "gguf_file" or "gguf_hub"; ``weights`` the format it holds);
    ``declared``: what its files say (None: not read); ``config``: the config.json read beside it
    ('' when none); ``found``: where a Hub id was found ('' for a local path); ``key``: the workload
    key that named it."""

    given: str
    load: Checkpoint
    declared: DeclaredFormat | None = None
    config: str = ""
    found: str = ""
    key: str = "checkpoint"     # the workload key that named it ("model": a Hub id outside the catalog)

    @property
    def gguf(self) -> bool:
        return self.load.kind in ("gguf_file", "gguf_hub")

    @property
    def modelopt(self) -> bool:
        return self.declared is not None and self.declared.modelopt

    def holds(self, weights: str, kind: str = "any") -> bool:
        """Whether the engine loads ``weights`` from it as it is (``kind`` 'modelopt': TensorRT-LLM's
        loader, which takes FP8 from a ModelOpt checkpoint only; an unread Hub id is trusted)."""
        if self.load.weights != weights:
            return False
        return kind != "modelopt" or weights != "fp8" or self.declared is None or self.modelopt

    def note(self) -> str:
        what = f"{self.declared.declared} in {self.declared.source}" if self.declared else "format not read"
        where = f", found in {self.found}" if self.found else ""
        return f"checkpoint: loading {self.load.id} (the workload's {self.key}:{where}; {what})"

    def to_json(self) -> dict:
        return {"given": self.given, "key": self.key, **self.load.to_json(), "config": self.config or None, "found": self.found or None,
                "declared": None if self.declared is None else {
                    "weights": self.declared.weights, "declared": self.declared.declared,
                    "source": self.declared.source, "modelopt": self.declared.modelopt,
                    "kv": self.declared.kv or None}}


def _holds(d: DeclaredFormat | None) -> str:
    return (d.weights or "") if d is not None else ""


def _read(read: Callable[[], DeclaredFormat | None], given: str, bad: Bad, key: str = "checkpoint"
          ) -> DeclaredFormat | None:
    """``read()``, its one-line fault (a malformed or truncated file) under ``key``."""
    try:
        return read()
    except InputError as exc:
        raise bad(key, given, str(exc)) from None


def _gguf_tag(given: str) -> UserCheckpoint | None:
    """``repo:TYPE`` (llama-server ``-hf``): a published GGUF repository and the file type in it."""
    repo, _, tag = given.rpartition(":")
    if not repo or not looks_like_hub_id(repo):
        return None
    fmt = canonical(tag)
    fmt = fmt if fmt in GGUF_TYPES else None
    declared = DeclaredFormat(fmt, f"GGUF type {tag}", "the checkpoint's :TYPE tag")
    return UserCheckpoint(given, Checkpoint(given, "gguf_hub", fmt or "", _SOURCE), declared)


def hub_checkpoint(given: str, found: HubFile, bad: Bad, key: str = "checkpoint") -> UserCheckpoint:
    """A Hub id found on this machine (``found``: its config.json): the snapshot folder's declaration
    (a downloaded one fetches its hf_quant_config.json too, if the repository has one)."""
    if found.how.startswith("downloaded"):
        hub_file(given, "hf_quant_config.json")
    declared = _read(lambda: folder_format(found.folder), given, bad, key)
    return UserCheckpoint(given, Checkpoint(given, "hf", _holds(declared), _SOURCE), declared, str(found.path),
                          f"{found.how} ({found.folder})", key)


def read_checkpoint(given: str, local: Path, bad: Bad) -> tuple[UserCheckpoint, list[str]]:
    """``checkpoint:`` as given (``local``: it as a path, resolved against the workload's folder):
    the checkpoint and the notes to print. A path that names nothing, a file that is not GGUF and a
    format kvtune does not model are ``bad`` (one line: file, key, value)."""
    kind = path_kind(local)
    if kind == "dir":
        cfg = local / "config.json"
        declared = _read(lambda: folder_format(local), given, bad)
        if declared is None and not cfg.is_file():
            raise bad("checkpoint", given, f"the folder {local} holds no config.json nor hf_quant_config.json: "
                                           f"not a Hugging Face or ModelOpt checkpoint")
        return UserCheckpoint(given, Checkpoint(str(local), "hf", _holds(declared), _SOURCE), declared,
                              str(cfg) if cfg.is_file() else ""), []
    if kind:
        declared = _read(lambda: gguf_format(local), given, bad)
        ck = UserCheckpoint(given, Checkpoint(str(local), "gguf_file", _holds(declared), _SOURCE), declared)
        return ck, [] if declared else [f"checkpoint: {local} states no general.file_type; its format is not "
                                        f"checked (weights: is taken as given)"]
    if given.startswith((".", "/", "~")) or given.endswith((".gguf", ".json")) or not (
            looks_like_hub_id(given) or _gguf_tag(given)):
        raise bad("checkpoint", given, f"no such file or folder ({local})")
    tagged = _gguf_tag(given)
    if tagged is not None:
        if tagged.declared is not None and tagged.declared.weights is None:
            raise bad("checkpoint", given, f"GGUF type {given.rpartition(':')[2]!r} is not one kvtune models "
                                           f"(it models {', '.join(GGUF_TYPES.values())})")
        return tagged, []
    found = hub_file(given)
    if found is not None:
        return hub_checkpoint(given, found, bad), []
    ck = UserCheckpoint(given, Checkpoint(given, "hf", "", _SOURCE))
    return ck, [f"checkpoint: {given} is not a folder here ({local}) nor in the Hugging Face cache ({hub_cache_dir()}): "
                f"taken as a Hub id the engine downloads; its format is not checked"]


def check_weights(ck: UserCheckpoint, given: str | None, bad: Bad) -> tuple[str, UserCheckpoint, list[str]]:
    """(the weights the workload serves, the checkpoint with the format it holds, notes):
    ``weights:`` as given, else the checkpoint's declaration. A declaration kvtune cannot model, and
    a ``weights:`` that contradicts a quantized or GGUF declaration, are ``bad``. An unquantized
    Hugging Face checkpoint takes any ``weights:`` (the engine quantizes it while loading or converts
    it to GGUF; the engine check says which engines can)."""
    d = ck.declared
    if d is not None and d.weights is None:
        raise bad(ck.key, ck.given, f"holds {d.declared} weights ({d.source}), a format kvtune does not model "
                                          f"(it models {', '.join(KNOWN)}); serve a checkpoint in one of them")
    if d is None or d.weights is None:   # not read: the workload's weights, trusted
        w = given or "bf16"
        return w, _holding(ck, w), []
    if given is None:
        return d.weights, ck, [f"weights: not given; {d.weights}, as the checkpoint declares ({d.declared} in {d.source})"]
    if given != d.weights and (d.quantized or ck.gguf):
        raise bad("weights", given, f"the checkpoint {ck.given} holds {d.weights} weights ({d.declared} in {d.source})")
    return given, ck, []


def _holding(ck: UserCheckpoint, weights: str) -> UserCheckpoint:
    return dataclasses.replace(ck, load=dataclasses.replace(ck.load, weights=weights))


def check_architecture(ck: UserCheckpoint, arch: ModelArch, bad: Bad) -> None:
    """The checkpoint's config.json describes ``arch`` (the model kvtune sizes), or ``bad``."""
    if not ck.config or ck.config == arch.source:
        return
    try:
        cfg = json.loads(read_text(ck.config, "model config (config.json)"))
        theirs = model_from_config(cfg, name=arch.name, where=ck.config)
    except (InputError, ValueError, RecursionError) as exc:
        raise bad(ck.key, ck.given, str(exc).splitlines()[0]) from None
    for field, key in _SAME:
        a, b = getattr(arch, field), getattr(theirs, field)
        if a != b:
            raise bad(ck.key, ck.given, f"its config.json ({ck.config}) has {key} {b} where model {arch.name} "
                                              f"has {a}: a checkpoint of another model")
