"""``kvtune estimate``: one configuration's memory plan and decode-step sweep over batch.

Two goals, one knob: ``tok_s_per_user`` (interactivity) and ``tok_s_total`` (throughput) both
follow from the step time T(B) = (W + B x ctx x kv) / BW at batch B in the memory-bound regime:
per_user u = 1/T and total t = B/T. Eliminating B gives

    t = BW / (ctx x kv) x (1 - u / (BW / W)) = ceiling_tok_s x (1 - u / single_user_tok_s)

a straight line whose intercepts are the ceiling (u -> 0) and one lonely user's speed (t -> 0).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from .efficiency import Efficiency
from .errors import InputError
from .hardware import GPU
from .memory import GPU_MEM_UTIL
from .models import ModelArch
from .step import SpecConfig, StepModel

__all__ = ["Estimate", "EstimateRow", "estimate"]


@dataclass(frozen=True)
class EstimateRow:
    batch: int
    decode_step_ms: float
    tokens_per_step: float      # tokens each sequence gains per step (1, or the speculative mean)
    tok_s_per_user: float       # interactivity goal
    tok_s_total: float          # throughput goal
    bound: str                  # bandwidth | compute
    fits: bool                  # batch x context fits in the KV pool
    mem_ms: float
    compute_ms: float
    comm_ms: float
    overhead_ms: float
    draft_ms: float


@dataclass(frozen=True)
class Estimate:
    model: str
    gpu: str
    tp: int
    context: int
    weight_dtype: str
    kv_dtype: str
    gpu_mem_util: float
    kv_bytes_per_token: float          # whole model, all layers
    kv_bytes_per_token_per_gpu: float
    weight_bytes: float                # whole model
    weight_bytes_per_gpu: float
    activation_reserve_bytes: float    # per GPU
    kv_pool_tokens: int                # per replica
    max_batch: int                     # at ``context``
    ceiling_tok_s: float               # achieved bandwidth / (context x KV bytes per token)
    single_user_tok_s: float           # achieved bandwidth / weight bytes one token reads (MoE: routed experts)
    spec_k: int
    spec_alpha: float
    rows: list[EstimateRow] = field(default_factory=list)
    memory_accounting: str = ("decimal GB (1 GB = 1e9 bytes); datasheet capacity x gpu_mem_util - weights/TP - "
                              "draft weights/TP - activation reserve")
    draft: str = ""                              # the speculative drafter resident beside the model, if any
    draft_weight_bytes_per_gpu: float = 0.0
    draft_kv_bytes_per_token_per_gpu: float = 0.0
    mode: str = "ideal"
    source: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


def estimate(model: ModelArch, gpu: GPU, tp: int, context: int, batches: list[int],
             weight_dtype: str = "bf16", kv_dtype: str = "bf16", efficiency: Efficiency | None = None,
             gpu_mem_util: float = GPU_MEM_UTIL, speculation: SpecConfig | None = None, mode: str = "ideal") -> Estimate:
    if context < 1:
        raise InputError(f"context must be >= 1 token, got {context}")
    for b in batches:
        if b < 1:
            raise InputError(f"batch must be >= 1, got {b}")
    sm = StepModel(model, gpu, tp, weight_dtype, kv_dtype, efficiency, speculation, gpu_mem_util) if efficiency else \
        StepModel(model, gpu, tp, weight_dtype, kv_dtype, speculation=speculation, gpu_mem_util=gpu_mem_util)
    mem = sm.memory
    bw_gpu = gpu.hbm_bytes_per_s * sm.eff.bw_efficiency
    rows = []
    for b in batches:
        s = sm.decode_step(b, context)
        per_user = s.tokens_per_seq / s.time_s
        rows.append(EstimateRow(
            batch=b, decode_step_ms=s.time_s * 1e3, tokens_per_step=s.tokens_per_seq,
            tok_s_per_user=per_user, tok_s_total=per_user * b, bound=s.bound,
            fits=b * context <= mem.kv_pool_tokens, mem_ms=s.mem_s * 1e3, compute_ms=s.compute_s * 1e3,
            comm_ms=s.comm_s * 1e3, overhead_ms=s.overhead_s * 1e3, draft_ms=s.draft_s * 1e3))
    return Estimate(
        model=model.name, gpu=gpu.name, tp=tp, context=context, weight_dtype=weight_dtype,
        kv_dtype=kv_dtype, gpu_mem_util=gpu_mem_util, kv_bytes_per_token=mem.kv_bytes_per_token,
        kv_bytes_per_token_per_gpu=mem.kv_bytes_per_token_per_gpu, weight_bytes=mem.weight_bytes,
        weight_bytes_per_gpu=mem.weight_bytes_per_gpu, activation_reserve_bytes=mem.activation_reserve_bytes,
        kv_pool_tokens=mem.kv_pool_tokens, max_batch=mem.max_batch(context),
        ceiling_tok_s=bw_gpu / (context * mem.kv_bytes_per_token_per_gpu),
        # one sequence's token reads what a batch-1 decode step reads: MoE models only the routed
        # (and shared) experts, the same term as the batch-1 row's weight read (StepModel)
        single_user_tok_s=bw_gpu / sm.weight_read_bytes(1.0),
        spec_k=speculation.k if speculation else 0, spec_alpha=speculation.acceptance if speculation else 0.0,
        rows=rows, mode=mode, source=sm.eff.source, draft=mem.draft_name,
        draft_weight_bytes_per_gpu=mem.draft_weight_bytes_per_gpu,
        draft_kv_bytes_per_token_per_gpu=mem.draft_kv_bytes_per_token_per_gpu)
