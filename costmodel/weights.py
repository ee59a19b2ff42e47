"""Weight bytes of a whole model and the dtype check they share: below ``costmodel.memory`` and
``costmodel.draft`` (memory plans the pool around a draft, the draft sizes a draft model's weights),
so neither of those imports the other in a cycle."""

from __future__ import annotations

from .errors import InputError
from .models import DTYPE_BYTES, ModelArch

__all__ = ["check_dtype", "weight_bytes"]


def check_dtype(value: str, what: str) -> str:
    if value not in DTYPE_BYTES:  # canonical names (costmodel.dtypes); callers resolve spellings first
        raise InputError(f"{what} must be one of {', '.join(DTYPE_BYTES)}, got {value!r}")
    return value


def weight_bytes(model: ModelArch, weight_dtype: str) -> float:
    """Bytes of all stored weights. FP8 checkpoints quantise the GEMM weights to 1 byte and keep
    the embedding and LM head in bf16 (as vLLM/TensorRT-LLM FP8 checkpoints do)."""
    check_dtype(weight_dtype, "weight dtype")
    emb = model.embedding_params * (1 if model.tied_embeddings else 2)
    gemm = model.total_params - emb
    return gemm * DTYPE_BYTES[weight_dtype] + emb * DTYPE_BYTES["bf16"]
