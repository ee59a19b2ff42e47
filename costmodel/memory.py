"""GPU memory: weight bytes under tensor parallelism, the KV pool and how many sequences fit.

Accounting is decimal (1 GB = 1e9 bytes, as on datasheets). Per GPU:

    usable      = memory_bytes x gpu_mem_util
    kv_pool     = usable - weights/TP - draft weights/TP - activation_reserve
    pool_tokens = kv_pool / (KV bytes per token held by one GPU + the draft's)

With speculative decoding the drafter (``costmodel.draft``: a separate model, an EAGLE head, MTP
layers; nothing for n-gram) is resident too: its weights per GPU come out of the pool and its own
KV per token is paid by every pool token (vLLM keeps the draft's layers in the same block pool).

KV heads shard across TP ranks until TP exceeds their number; then each rank holds one head
(replicated), so adding GPUs past that point adds pool bytes but not pool tokens per byte.

Across GPUs and nodes (``costmodel.parallel.Parallel``): ``pp`` pipeline stages each hold 1/pp of
the layers, so of the weights and of every token's KV; under data-parallel attention every GPU of
the TP group holds the whole attention weights and the whole KV (MLA latent) of its own sequences,
so the replica's pool is ``tp`` times one GPU's:

    weights/GPU  = ((W - A)/tp + A/(1 if dp_attention else tp)) / pp      A: attention weights
    pool tokens  = floor(kv_pool / (KV bytes per token per GPU / pp)) x (tp if dp_attention else 1)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .draft import DraftFootprint
from .errors import DoesNotFit, InputError
from .hardware import GPU
from .models import DTYPE_BYTES, ModelArch
from .parallel import SINGLE, Parallel
from .weights import check_dtype, weight_bytes   # re-exported: their home is costmodel.weights (below draft)

__all__ = ["MemoryPlan", "weight_bytes", "weight_bytes_per_gpu", "attention_weight_bytes", "plan_memory",
           "check_dtype", "gpus_to_hold", "GPU_MEM_UTIL", "BLOCK_TOKENS"]

# The defaults every command, the simulator and the launch settings share (one home each):
GPU_MEM_UTIL = 0.9  # share of GPU memory the engine may use: vLLM's --gpu-memory-utilization default (vllm/engine/arg_utils.py)
BLOCK_TOKENS = 16   # KV cache block, tokens: vLLM's --block-size default on CUDA (vllm/config CacheConfig)


@dataclass(frozen=True)
class MemoryPlan:
    tp: int
    weight_bytes: float                 # whole model
    weight_bytes_per_gpu: float
    usable_bytes_per_gpu: float         # memory x utilisation
    activation_reserve_bytes: float     # per GPU
    kv_pool_bytes_per_gpu: float
    kv_bytes_per_token: float           # whole model, all layers
    kv_bytes_per_token_per_gpu: float
    kv_pool_tokens: int                 # per replica (one TP group)
    pp: int = 1                         # pipeline stages (GPUs per replica = tp x pp)
    dp_attention: bool = False          # attention data-parallel: each GPU holds its own sequences' KV
    # the speculative drafter's share (costmodel.draft); 0 without one
    draft_name: str = ""
    draft_weight_bytes_per_gpu: float = 0.0
    draft_kv_bytes_per_token_per_gpu: float = 0.0

    @property
    def pool_bytes_per_token_per_gpu(self) -> float:
        """What one pool token costs a GPU: the target's KV and the draft's."""
        return self.kv_bytes_per_token_per_gpu + self.draft_kv_bytes_per_token_per_gpu

    def max_batch(self, context_tokens: int) -> int:
        """Sequences of ``context_tokens`` each that the pool holds at once."""
        if context_tokens <= 0:
            raise InputError(f"context must be > 0 tokens, got {context_tokens}")
        return int(self.kv_pool_tokens // context_tokens)


def attention_weight_bytes(model: ModelArch, weight_dtype: str) -> float:
    """Bytes of the attention projections (stored in the weight format)."""
    return model.attention_params * DTYPE_BYTES[weight_dtype]


def weight_bytes_per_gpu(model: ModelArch, weight_dtype: str, par: Parallel) -> float:
    """Weights one GPU holds under ``par`` (see the module docstring)."""
    w = weight_bytes(model, weight_dtype)
    if not par.dp_attention:
        return w / (par.tp * par.pp)
    a = attention_weight_bytes(model, weight_dtype)
    return ((w - a) / par.tp + a) / par.pp


def gpus_to_hold(model: ModelArch, weight_dtype: str, usable_bytes: float, reserve_bytes: float) -> int | None:
    """The fewest GPUs (a power of two up to 1024) whose memory holds the weights with room left."""
    w = weight_bytes(model, weight_dtype)
    return next((g for g in (2 ** i for i in range(11)) if w / g + reserve_bytes < usable_bytes * 0.95), None)


def plan_memory(model: ModelArch, gpu: GPU, tp: int, weight_dtype: str, kv_dtype: str,
                gpu_mem_util: float = GPU_MEM_UTIL, activation_reserve_bytes: float = 0.0,
                parallel: Parallel | None = None, draft: DraftFootprint | None = None) -> MemoryPlan:
    """``draft``: the speculative drafter resident beside the model (None: none)."""
    check_dtype(kv_dtype, "kv dtype")
    if not 0 < gpu_mem_util <= 1:
        raise InputError(f"gpu memory utilisation must be in (0, 1], got {gpu_mem_util}")
    err = model.tp_error(tp)
    if err:
        raise InputError(err)
    par = parallel if parallel is not None else SINGLE
    if par.tp != tp:
        par = Parallel(tp=tp, pp=par.pp, ep=par.ep if par.ep == 1 else tp, dp_attention=par.dp_attention,
                       gpus_per_node=par.gpus_per_node)
    if par.pp > model.n_layers:
        raise InputError(f"pp {par.pp} exceeds {model.name}'s {model.n_layers} layers")
    w = weight_bytes(model, weight_dtype)
    w_gpu = weight_bytes_per_gpu(model, weight_dtype, par)
    usable = gpu.memory_bytes * gpu_mem_util
    pool = usable - w_gpu - activation_reserve_bytes
    # per token of a sequence this GPU holds: its stage's layers; DP attention: the whole (MLA) KV
    kv_gpu = (float(model.kv_bytes_per_token(kv_dtype)) if par.dp_attention
              else model.kv_bytes_per_token_per_gpu(kv_dtype, tp)) / par.pp
    draft_w_gpu = draft_kv_gpu = 0.0
    if draft is not None:
        err = draft.tp_error(tp)
        if err:
            raise InputError(f"speculative draft: {err} (vLLM runs the draft at the target's TP)")
        draft_w_gpu = draft.weight_bytes_per_gpu(tp)
        draft_kv_gpu = draft.kv_bytes_per_token_per_gpu(kv_dtype, 1 if par.dp_attention else tp)
        if pool > kv_gpu * BLOCK_TOKENS and pool - draft_w_gpu <= (kv_gpu + draft_kv_gpu) * BLOCK_TOKENS:
            raise DoesNotFit(
                f"the speculative {draft.name} ({draft_w_gpu / 1e9:.1f} GB per GPU at TP={tp}) does not fit "
                f"beside {model.name}'s weights ({w_gpu / 1e9:.1f} GB per GPU) on {gpu.name} at "
                f"{gpu_mem_util:.2f} utilisation: {max(pool, 0) / 1e9:.1f} GB left, no room for the KV cache",
                shortfall_bytes=max(draft_w_gpu - pool, 0.0))
        pool -= draft_w_gpu
    if pool <= kv_gpu * BLOCK_TOKENS:  # not even one block of KV fits
        short_gb = (w_gpu + activation_reserve_bytes - usable) / 1e9
        need = gpus_to_hold(model, weight_dtype, usable, activation_reserve_bytes)
        hint = (f"; the weights need at least {need} GPUs per replica (tensor x pipeline parallel)"
                if need and need > par.gpus else "")
        where = f"TP={tp}" + (f" x PP={par.pp}" if par.pp > 1 else "") + (" with DP attention" if par.dp_attention else "")
        raise DoesNotFit(
            f"{model.name} weights ({weight_dtype}) need {w_gpu / 1e9:.1f} GB per GPU at {where} "
            f"(+{activation_reserve_bytes / 1e9:.1f} GB reserve) but {gpu.name} offers "
            f"{usable / 1e9:.1f} GB at {gpu_mem_util:.2f} utilisation: short by {max(short_gb, 0):.1f} GB, "
            f"no room for the KV cache{hint}", shortfall_bytes=max(short_gb, 0) * 1e9)
    ranks = tp if par.dp_attention else 1
    return MemoryPlan(
        tp=tp, weight_bytes=w, weight_bytes_per_gpu=w_gpu, usable_bytes_per_gpu=usable,
        activation_reserve_bytes=activation_reserve_bytes, kv_pool_bytes_per_gpu=pool,
        kv_bytes_per_token=float(model.kv_bytes_per_token(kv_dtype)), kv_bytes_per_token_per_gpu=kv_gpu,
        kv_pool_tokens=int(math.floor(pool / (kv_gpu + draft_kv_gpu))) * ranks, pp=par.pp,
        dp_attention=par.dp_attention, draft_name=draft.name if draft is not None else "",
        draft_weight_bytes_per_gpu=draft_w_gpu, draft_kv_bytes_per_token_per_gpu=draft_kv_gpu,
    )
