"""What an engine loads for the weights kvtune modelled, and for a speculative draft: one place.

Every checkpoint id a launch line names comes from here, read from the model catalog
(``profiles/models.yaml``: ``hf_id``, ``checkpoints``, ``drafts``, each with its source) or from the
workload itself. Three loaders:

    hf        vLLM, SGLang: the model's Hugging Face repository; FP8 weights from a published FP8
              checkpoint (its quantization_config) where the catalog knows one (else the engine may
              quantize while loading: the launch module decides)
    modelopt  TensorRT-LLM's PyTorch backend: FP8 only from a pre-quantized ModelOpt checkpoint
    gguf      llama.cpp: a GGUF file of the modelled format, from a published GGUF repository that
              has that quantization (llama-server ``-hf repo:TYPE``), else made from the Hugging Face
              checkpoint with llama.cpp's own tools (the recipe says how)

A format a loader cannot take resolves to None; the caller refuses the pick with the reason
(``costmodel.engines.capabilities`` says which formats each engine version loads).
"""

from __future__ import annotations

from dataclasses import dataclass

from .engines.capabilities import GGUF_FORMATS, method_needs
from .errors import InputError
from .models import ModelArch, catalog_entry

__all__ = ["Checkpoint", "resolve_weights", "resolve_draft", "native_format", "gguf_file", "local_copy", "GGUF_TYPES",
           "LOADERS"]

LOADERS = ("hf", "modelopt", "gguf")

# kvtune format -> llama.cpp file type (tools/quantize/quantize.cpp QUANT_OPTIONS names, the suffix
# GGUF files carry). The K-quant "_M" mixes keep a few tensors (attn_v, ffn_down) one step wider
# than the named type, so a Q4_K_M file is ~4.8 bits a weight where kvtune counts q4_k's 4.5.
GGUF_TYPES = {"fp32": "F32", "fp16": "F16", "bf16": "BF16", "q8_0": "Q8_0", "q6_k": "Q6_K", "q5_1": "Q5_1",
              "q5_k": "Q5_K_M", "q5_0": "Q5_0", "q4_1": "Q4_1", "q4_k": "Q4_K_M", "q4_0": "Q4_0",
              "iq4_nl": "IQ4_NL", "q3_k": "Q3_K_M", "q2_k": "Q2_K"}
assert set(GGUF_TYPES) == set(GGUF_FORMATS)
# formats convert_hf_to_gguf.py writes itself (its --outtype choices); the rest go through llama-quantize
_CONVERT_OUTTYPES = {"fp32": "f32", "fp16": "f16", "bf16": "bf16", "q8_0": "q8_0"}
_CATALOG = "profiles/models.yaml"


@dataclass(frozen=True)
class Checkpoint:
    """What an engine loads. ``kind``: "hf" (a Hugging Face repository or local folder), "gguf_hub"
    (``repo:TYPE``, a published GGUF repository and the file type in it), "gguf_file" (a local
    GGUF file that ``recipe`` makes from ``made_from``)."""

    id: str
    kind: str
    weights: str                       # the kvtune format it holds
    source: str = ""                   # where the id was read ("" for the model's own id)
    made_from: str = ""                # gguf_file: the Hugging Face checkpoint it is converted from
    recipe: tuple[str, ...] = ()       # gguf_file: the commands that make it

    @property
    def repo(self) -> str:
        """The repository part of a ``gguf_hub`` id (the id itself otherwise)."""
        return self.id.rsplit(":", 1)[0] if self.kind == "gguf_hub" else self.id

    def to_json(self) -> dict:
        return {"id": self.id, "kind": self.kind, "weights": self.weights, "source": self.source,
                **({"made_from": self.made_from, "recipe": list(self.recipe)} if self.recipe else {})}


def _row(model: str) -> dict:
    found = catalog_entry(model)
    return found[1] if found else {}


def native_format(model: str) -> str:
    """The weight format ``model`` (catalog name or HF id) is published in: bf16 unless the catalog
    says otherwise (DeepSeek-V3 ships FP8)."""
    return str(_row(model).get("checkpoints", {}).get("native", "bf16"))


def _published(model: str, key: str, what: str) -> Checkpoint | None:
    entry = _row(model).get("checkpoints", {}).get(key)
    if not entry:
        return None
    return Checkpoint(entry["id"], "hf", what, f"{_CATALOG} {key}: {entry.get('source', '')}".rstrip(": "))


def _stem(model: str) -> str:
    name = model.rstrip("/").rsplit("/", 1)[-1]
    return "".join(c if c.isalnum() or c in "._-" else "-" for c in name) or "model"


def local_copy(model: str) -> tuple[str, tuple[str, ...]]:
    """(the folder holding ``model``'s Hugging Face checkpoint, the command that downloads it
    there): a local folder is itself, with nothing to run."""
    if model.startswith((".", "/", "~", "<")):
        return model, ()
    stem = _stem(model)
    return stem, (f"huggingface-cli download {model} --local-dir {stem}",)


def gguf_file(model: str, weights: str) -> Checkpoint:
    """A local GGUF of ``model`` (an HF id or folder) in ``weights``, and how to make it with
    llama.cpp's tools: convert_hf_to_gguf.py writes f32/f16/bf16/q8_0 itself (--outtype), the other
    types come from its BF16 file through llama-quantize (tools/quantize)."""
    t, stem = GGUF_TYPES[weights], _stem(model)
    out = f"{stem}-{t}.gguf"
    src, get = local_copy(model)
    if weights in _CONVERT_OUTTYPES:
        steps = [f"python convert_hf_to_gguf.py {src} --outtype {_CONVERT_OUTTYPES[weights]} --outfile {out}"]
    else:
        steps = [f"python convert_hf_to_gguf.py {src} --outtype bf16 --outfile {stem}-BF16.gguf",
                 f"llama-quantize {stem}-BF16.gguf {out} {t}"]
    return Checkpoint(out, "gguf_file", weights, made_from=model, recipe=get + tuple(steps))


def resolve_weights(model: str, weights: str, loader: str) -> Checkpoint | None:
    """What ``loader`` loads for ``model`` (an HF id, catalog name or local folder) holding
    ``weights``; None when the loader cannot take that format from anything kvtune knows."""
    if loader not in LOADERS:
        raise ValueError(f"loader must be one of {LOADERS}, got {loader!r}")
    if loader == "gguf":
        if weights not in GGUF_TYPES:
            return None
        g = _row(model).get("checkpoints", {}).get("gguf") or {}
        t = g.get("quants", {}).get(weights)
        if t:
            return Checkpoint(f"{g['repo']}:{t}", "gguf_hub", weights, f"{_CATALOG} gguf: {g.get('source', '')}")
        return gguf_file(model, weights)
    if weights in ("bf16", "fp16"):
        return Checkpoint(model, "hf", weights)
    if weights == "fp8":
        return _published(model, "fp8_modelopt" if loader == "modelopt" else "fp8", "fp8")
    return None


_HEAD = {"eagle3": "EAGLE-3 head", "eagle": "EAGLE head", "medusa": "Medusa heads"}


def resolve_draft(method: str, draft_model: str | None, target: ModelArch) -> Checkpoint | None:
    """The checkpoint ``method`` drafts with beside ``target``: None for methods that load nothing
    of their own (ngram; mtp uses the target's own layers). ``draft``: the catalog model's Hugging
    Face id, else ``draft_model`` as given (an id or a folder); eagle3/eagle/medusa: ``draft_model``
    (a head checkpoint, not a whole model), else the catalog's published head for ``target``.
    ``InputError`` (key ``speculative.draft_model``) when there is nothing to load."""
    needs = method_needs(method)
    if needs != "draft_model":
        return None
    if method == "draft":
        if not draft_model:
            raise InputError("speculative.draft_model: method 'draft' needs the draft model")
        found = catalog_entry(draft_model)
        if found:
            return Checkpoint(found[1]["hf_id"], "hf", "bf16", f"{_CATALOG} {found[0]}")
        return Checkpoint(draft_model, "hf", "bf16")
    head = _HEAD.get(method, "draft head")
    if draft_model:
        found = catalog_entry(draft_model)
        if found:
            raise InputError(f"speculative.draft_model {draft_model!r}: method {method!r} loads an {head} "
                             f"checkpoint, and {found[0]} is a whole model (to draft with it, use method: draft)")
        return Checkpoint(draft_model, "hf", "bf16")
    known = (_row(target.hf_id or target.name).get("drafts") or {}).get(method)
    if known:
        return Checkpoint(known["id"], "hf", "bf16", f"{_CATALOG} drafts.{method}: {known.get('source', '')}")
    raise InputError(f"speculative.draft_model: method {method!r} needs an {head} checkpoint trained for "
                     f"{target.name}, and kvtune's catalog knows no published one: set speculative.draft_model "
                     f"to its Hugging Face id or folder")
