"""Storage formats of weights and KV cache, and how many bytes one element takes.

kvtune's physics needs only the bytes a format moves (``BYTES_PER_ELEMENT``) and whether GEMMs run
on FP8 tensor cores (``fp8`` only); every other format computes at the bf16/fp16 rate. Names are
kept as a table records them; ``canonical`` maps the spellings engines use onto one name each.

GGUF block formats (llama.cpp) store blocks of 32 values (256 for the K-quants) with their scales,
so a format's width is bytes per block / values per block (ggml/src/ggml-common.h,
``block_q4_0`` .. ``block_q6_K``, llama.cpp b4000+):

    q4_0   fp16 scale + 16 B of nibbles            = 18 B / 32  = 4.5 bits
    q4_1   fp16 scale + fp16 min + 16 B            = 20 B / 32  = 5 bits
    q5_0   fp16 scale + 4 B high bits + 16 B       = 22 B / 32  = 5.5 bits
    q5_1   scale + min + 4 B + 16 B                = 24 B / 32  = 6 bits
    q8_0   fp16 scale + 32 B                       = 34 B / 32  = 8.5 bits
    iq4_nl fp16 scale + 16 B                       = 18 B / 32  = 4.5 bits
    q2_K   84 B / 256 = 2.625 bits;  q3_K 110 B / 256 = 3.4375;  q4_K 144 B / 256 = 4.5;
    q5_K   176 B / 256 = 5.5;        q6_K 210 B / 256 = 6.5625
"""

from __future__ import annotations

from .errors import InputError

__all__ = ["BYTES_PER_ELEMENT", "canonical", "check_dtype", "is_fp8", "KNOWN"]

# bytes per stored element, canonical names
BYTES_PER_ELEMENT: dict[str, float] = {
    "fp32": 4.0,
    "bf16": 2.0,
    "fp16": 2.0,
    "fp8": 1.0,       # e4m3 / e5m2: 1 byte; per-tensor or per-channel scales are negligible
    "int8": 1.0,      # W8A8 / SmoothQuant, per-channel scales negligible
    "q8_0": 34 / 32,
    "q6_k": 210 / 256,
    "q5_1": 24 / 32,
    "q5_k": 176 / 256,
    "q5_0": 22 / 32,
    "q4_1": 20 / 32,
    "q4_k": 144 / 256,
    "q4_0": 18 / 32,
    "iq4_nl": 18 / 32,
    "q3_k": 110 / 256,
    "q2_k": 84 / 256,
}

# other spellings of the same format (llama.cpp --cache-type-k f16, vLLM --kv-cache-dtype fp8_e4m3,
# HF torch_dtype float16, GGUF file-type names such as Q4_K_M)
_ALIASES = {
    "f32": "fp32", "float32": "fp32", "float": "fp32",
    "f16": "fp16", "float16": "fp16", "half": "fp16",
    "bfloat16": "bf16",
    "fp8_e4m3": "fp8", "fp8_e5m2": "fp8", "e4m3": "fp8", "e5m2": "fp8", "float8": "fp8", "fp8_e4m3fn": "fp8",
    "q4_k_m": "q4_k", "q4_k_s": "q4_k", "q5_k_m": "q5_k", "q5_k_s": "q5_k", "q3_k_m": "q3_k", "q3_k_s": "q3_k",
    "q3_k_l": "q3_k",
}

KNOWN = tuple(BYTES_PER_ELEMENT)


def canonical(name: str) -> str | None:
    """The canonical name of a format (case-insensitive, aliases resolved), or None if unknown."""
    if not isinstance(name, str):
        return None
    n = name.strip().lower()
    n = _ALIASES.get(n, n)
    return n if n in BYTES_PER_ELEMENT else None


def check_dtype(value: str, what: str) -> str:
    """``value``'s canonical name; an ``InputError`` naming ``what`` if kvtune does not know it."""
    c = canonical(value)
    if c is None:
        raise InputError(f"{what} {value!r} is not a format kvtune knows (known: {', '.join(KNOWN)}, "
                         f"and the spellings f16, float16, fp8_e4m3, Q4_K_M, ...)")
    return c


def is_fp8(name: str) -> bool:
    return canonical(name) == "fp8"
