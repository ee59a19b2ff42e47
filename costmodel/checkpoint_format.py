"""The weight format a checkpoint's own files declare, read as the engines read them. Read-only.

Three declarations, each read from the file an engine reads it from:

    ModelOpt     ``hf_quant_config.json`` ``quantization.quant_algo`` (FP8, NVFP4, W4A16_AWQ, ...) and
                 ``kv_cache_quant_algo``: what TensorRT-LLM's PyTorch backend loads (and vLLM, SGLang
                 read as ``modelopt`` quantization)
    Hugging Face ``config.json`` ``quantization_config`` (``quant_method`` fp8, compressed-tensors,
                 awq, gptq, bitsandbytes, ..., with ``bits``), else ``torch_dtype`` (``dtype`` in newer
                 transformers): the unquantized checkpoint's own precision
    GGUF         the header's ``general.file_type`` (a ``llama_ftype``), read with the layout of the
                 GGUF specification (ggml-org/ggml docs/gguf.md, version 2 and 3): magic ``GGUF``,
                 uint32 version, uint64 tensor count, uint64 metadata count, then typed key/values

A declaration names a kvtune format (``costmodel.dtypes``) where kvtune models one, else ``weights``
is None and ``declared`` says what the files hold (NVFP4, 4-bit AWQ): the caller refuses it, as
kvtune never invents a width.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from .dtypes import canonical
from .errors import InputError
from .files import read_text

__all__ = ["DeclaredFormat", "folder_format", "config_format", "gguf_format", "GGUF_FILE_TYPES", "UNQUANTIZED"]

# formats an unquantized checkpoint stores (torch_dtype): engines load them as 16-bit ("auto")
UNQUANTIZED = ("bf16", "fp16", "fp32")

# ModelOpt quant_algo (TensorRT-LLM tensorrt_llm/quantization/mode.py QuantAlgo) -> kvtune format.
# The FP8 family keeps 1-byte GEMM weights; W8A8 SmoothQuant is kvtune's int8. The rest (NVFP4,
# 4-bit AWQ/GPTQ, weight-only int8, mixed precision) have no width kvtune models.
_MODELOPT = {"FP8": "fp8", "FP8_PER_CHANNEL_PER_TOKEN": "fp8", "FP8_BLOCK_SCALES": "fp8",
             "W8A8_SQ_PER_CHANNEL": "int8", "W8A8_SQ_PER_TENSOR_PLUGIN": "int8"}
# llama_ftype (llama.cpp include/llama.h LLAMA_FTYPE_*; the GGUF spec's general.file_type table) ->
# kvtune format. The K-quant _S/_M/_L mixes count as their base type (costmodel.checkpoints GGUF_TYPES).
GGUF_FILE_TYPES = {0: ("F32", "fp32"), 1: ("F16", "fp16"), 2: ("Q4_0", "q4_0"), 3: ("Q4_1", "q4_1"),
                   7: ("Q8_0", "q8_0"), 8: ("Q5_0", "q5_0"), 9: ("Q5_1", "q5_1"), 10: ("Q2_K", "q2_k"),
                   11: ("Q3_K_S", "q3_k"), 12: ("Q3_K_M", "q3_k"), 13: ("Q3_K_L", "q3_k"), 14: ("Q4_K_S", "q4_k"),
                   15: ("Q4_K_M", "q4_k"), 16: ("Q5_K_S", "q5_k"), 17: ("Q5_K_M", "q5_k"), 18: ("Q6_K", "q6_k"),
                   21: ("Q2_K_S", "q2_k"), 25: ("IQ4_NL", "iq4_nl"), 32: ("BF16", "bf16")}
_GGUF_MAGIC = b"GGUF"
# GGUF value types (gguf.md gguf_metadata_value_type) with a fixed width: struct format
_FIXED = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_MAX_GGUF_KEYS = 1 << 20          # far above any real file's metadata (a few dozen keys)
_MAX_GGUF_STRING = 1 << 26        # 64 MiB: one key or string value


@dataclass(frozen=True)
class DeclaredFormat:
    """What a checkpoint's files say it holds. ``weights``: the kvtune format (None: one kvtune does
    not model); ``declared``: the value as the file writes it; ``source``: the file and key read;
    ``modelopt``: a ModelOpt checkpoint (hf_quant_config.json); ``kv``: the KV-cache format it sets
    (ModelOpt ``kv_cache_quant_algo``), '' when none."""

    weights: str | None
    declared: str
    source: str
    modelopt: bool = False
    kv: str = ""

    @property
    def quantized(self) -> bool:
        return self.weights not in UNQUANTIZED


def _json(path: Path, what: str) -> dict:
    try:
        data = json.loads(read_text(path, what))
    except (ValueError, RecursionError) as exc:
        raise InputError(f"{path}: malformed JSON ({str(exc).splitlines()[0][:80]})") from None
    if not isinstance(data, dict):
        raise InputError(f"{path}: a {what} is a JSON object")
    return data


def _modelopt(path: Path) -> DeclaredFormat:
    data = _json(path, "ModelOpt quantization config (hf_quant_config.json)")
    q = data.get("quantization")
    if not isinstance(q, dict):
        raise InputError(f"{path}: missing key 'quantization' (ModelOpt writes quantization.quant_algo)")
    algo = q.get("quant_algo")
    kv_algo = q.get("kv_cache_quant_algo")
    kv = "fp8" if isinstance(kv_algo, str) and kv_algo.upper() == "FP8" else ""
    src = f"{path} quantization.quant_algo"
    if algo is None:   # ModelOpt writes null for a checkpoint it only calibrated the KV cache of
        return DeclaredFormat(None, "quant_algo null", src, modelopt=True, kv=kv)
    if not isinstance(algo, str):
        raise InputError(f"{path}: quantization.quant_algo must be a string, got {algo!r}")
    return DeclaredFormat(_MODELOPT.get(algo.upper()), f"quant_algo {algo}", src, modelopt=True, kv=kv)


def config_format(cfg: dict, where: str) -> DeclaredFormat | None:
    """The format a config.json declares: its ``quantization_config``, else its ``torch_dtype``
    (``dtype``); None when it states neither. ``where``: the file, for ``source``."""
    qc = cfg.get("quantization_config")
    if isinstance(cfg.get("text_config"), dict) and not isinstance(qc, dict):
        qc = cfg["text_config"].get("quantization_config")
    if isinstance(qc, dict):
        return _quantization_config(qc, where)
    for key in ("torch_dtype", "dtype"):
        v = cfg.get(key)
        if isinstance(v, str):
            return DeclaredFormat(canonical(v), f"{key} {v}", f"{where} {key}")
    return None


def _quantization_config(qc: dict, where: str) -> DeclaredFormat:
    method = str(qc.get("quant_method", "")).lower()
    src = f"{where} quantization_config"
    if method in ("fp8", "fbgemm_fp8"):
        return DeclaredFormat("fp8", f"quant_method {method}", src)
    if method == "modelopt":   # transformers' ModelOpt integration copies hf_quant_config's keys here
        algo = str(qc.get("quant_algo", ""))
        return DeclaredFormat(_MODELOPT.get(algo.upper()), f"quant_method modelopt, quant_algo {algo}", src,
                              modelopt=True)
    if method == "compressed-tensors":
        return _compressed_tensors(qc, src)
    if method == "bitsandbytes":
        nbits = 8 if qc.get("load_in_8bit") else 4
        return DeclaredFormat(None, f"quant_method bitsandbytes ({nbits}-bit)", src)
    bits = qc.get("bits", qc.get("w_bit"))
    shown = f"quant_method {method or '?'}" + (f", bits {bits}" if bits is not None else "")
    return DeclaredFormat(None, shown, src)   # awq, gptq, mxfp4, ...: weight-only widths kvtune does not model


def _compressed_tensors(qc: dict, src: str) -> DeclaredFormat:
    """compressed-tensors (vLLM, llm-compressor): the weights' ``num_bits``/``type`` of its config groups."""
    seen = set()
    for g in (qc.get("config_groups") or {}).values():
        w = g.get("weights") if isinstance(g, dict) else None
        if isinstance(w, dict):
            seen.add((w.get("num_bits"), str(w.get("type", "int"))))
    if len(seen) == 1:
        bits, kind = seen.pop()
        shown = f"quant_method compressed-tensors, weights {kind} {bits}-bit"
        fmt = "fp8" if (bits, kind) == (8, "float") else "int8" if (bits, kind) == (8, "int") else None
        return DeclaredFormat(fmt, shown, src)
    return DeclaredFormat(None, "quant_method compressed-tensors, " +
                          (f"{len(seen)} weight schemes" if seen else "no weight scheme"), src)


def folder_format(folder: Path) -> DeclaredFormat | None:
    """A checkpoint folder's declaration: ``hf_quant_config.json`` (ModelOpt) first, as TensorRT-LLM
    reads it, else its config.json's; None when the folder declares nothing."""
    hq, cfg = folder / "hf_quant_config.json", folder / "config.json"
    own = config_format(_json(cfg, "model config (config.json)"), str(cfg)) if cfg.is_file() else None
    if not hq.is_file():
        return own
    mo = _modelopt(hq)
    if mo.declared == "quant_algo null" and own is not None and not own.quantized:
        # ModelOpt quantized only the KV cache: the weights are the config's own precision
        return DeclaredFormat(own.weights, f"{own.declared}, {mo.declared}", own.source, modelopt=True, kv=mo.kv)
    return mo


# ---- GGUF ----------------------------------------------------------------------------------------

class _Header:
    """Little-endian reads from a GGUF file; a short read is a truncated file."""

    def __init__(self, f: BinaryIO, path: Path) -> None:
        self.f, self.path = f, path

    def take(self, fmt: str):
        n = struct.calcsize(fmt)
        raw = self.f.read(n)
        if len(raw) < n:
            raise InputError(f"{self.path}: truncated GGUF header")
        return struct.unpack(fmt, raw)[0]

    def string(self) -> str:
        n = self.take("<Q")
        if n > _MAX_GGUF_STRING:
            raise InputError(f"{self.path}: a GGUF string of {n:,} bytes; not a GGUF file kvtune can read")
        raw = self.f.read(n)
        if len(raw) < n:
            raise InputError(f"{self.path}: truncated GGUF header")
        return raw.decode("utf-8", "replace")

    def skip(self, vtype: int) -> None:
        if vtype in _FIXED:
            self.take(_FIXED[vtype])
        elif vtype == _STRING:
            self.string()
        elif vtype == _ARRAY:
            etype, count = self.take("<I"), self.take("<Q")
            if etype in _FIXED:   # a block of fixed-width values: skip it whole
                self.f.seek(struct.calcsize(_FIXED[etype]) * count, 1)
            else:
                for _ in range(count):
                    self.skip(etype)
        else:
            raise InputError(f"{self.path}: unknown GGUF value type {vtype}")


def gguf_format(path: Path) -> DeclaredFormat | None:
    """A GGUF file's ``general.file_type``; None when the header does not state it (the key is
    optional in the spec)."""
    try:
        with path.open("rb") as f:
            h = _Header(f, path)
            if f.read(4) != _GGUF_MAGIC:
                raise InputError(f"{path}: not a GGUF file (it does not start with the magic 'GGUF')")
            version = h.take("<I")
            if version not in (2, 3):   # version 1 counted in uint32; no current tool writes it
                raise InputError(f"{path}: GGUF version {version}; kvtune reads versions 2 and 3")
            h.take("<Q")                # tensor count
            n_keys = h.take("<Q")
            if n_keys > _MAX_GGUF_KEYS:
                raise InputError(f"{path}: {n_keys:,} GGUF metadata keys; not a GGUF file kvtune can read")
            for _ in range(n_keys):
                key, vtype = h.string(), h.take("<I")
                if key == "general.file_type" and vtype in (4, 5):   # uint32 (int32 from some writers)
                    ftype = h.take(_FIXED[vtype])
                    name, fmt = GGUF_FILE_TYPES.get(ftype, (f"file type {ftype}", None))
                    return DeclaredFormat(fmt, f"general.file_type {ftype} ({name})", f"{path} general.file_type")
                h.skip(vtype)
    except OSError as exc:
        raise InputError(f"{path}: cannot read the GGUF file ({exc.strerror or exc})") from None
    return None
