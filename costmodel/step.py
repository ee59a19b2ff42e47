"""Step times: what one engine iteration (a decode step, a prefill chunk, or both mixed) costs.

For one TP group (a replica), per GPU:

    bytes   = weights read + KV read (+ KV written)          weights/TP; MoE reads only touched experts
    flops   = 2 x matmul params x tokens / TP  +  attention pairs x 4 x heads x head_dim x layers / TP
    t_mem   = bytes / (HBM bandwidth x bw_efficiency)
    t_comp  = GEMM flops / (peak x flops_efficiency) + attention flops / (bf16 peak x flops_efficiency)
              (decode attention x decode_attn_efficiency: its rate against the GEMMs', 1 unless fitted)
    t_comm  = 2 x layers x (all-reduce latency + 2(TP-1)/TP x tokens x hidden x 2 bytes / link bandwidth)
    t_step  = max(t_mem, t_comp) + t_comm + step overhead (+ draft time with speculation)
              (+ prefill overhead when the step carries prompt tokens: engines replay a captured
              CUDA graph for pure-decode batches and launch every kernel of a mixed one)

Decode tokens use the decode FLOP efficiency (small-M GEMMs); prefill tokens use the prefill one.
Speculative decoding (draft length k, per-token acceptance a) turns every decode sequence into
k+1 verify tokens: the same bytes, k+1 times the arithmetic, plus k draft passes costing
``draft_cost`` of a target pass each, and emits (1 - a^(k+1)) / (1 - a) tokens on average.
The drafter's memory (``SpecConfig.draft``, ``costmodel.draft``) comes out of the KV pool in the
memory plan (``costmodel.memory.plan_memory``).

Beyond one node's TP group (``parallel=costmodel.parallel.Parallel(...)``): per-GPU bytes and FLOPs
divide by tp x pp; a pipeline step is a round (pp stage-times of a 1/M micro-batch, M = min(pp,
sequences), plus the stage-to-stage hops); the all-reduce is hierarchical when TP spans nodes;
expert parallelism charges the busiest GPU (``expert_load_imbalance``); DP attention replicates the
attention weights, reads each sequence's KV on one GPU and moves MoE tokens by all-to-all. The
terms and their formulas are in ``costmodel/parallel.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol, runtime_checkable

from .draft import DraftFootprint
from .efficiency import IDEAL, Efficiency
from .errors import InputError
from .hardware import GPU
from .memory import GPU_MEM_UTIL, MemoryPlan, attention_weight_bytes, plan_memory, weight_bytes
from .models import DTYPE_BYTES, ModelArch
from .parallel import SINGLE, Parallel, all_to_all_s, allreduce_s, expert_load_imbalance, hop_s, micro_batches

__all__ = ["DRAFT_COST", "SPEC_METHOD", "SpecConfig", "StepBreakdown", "StepCost", "StepModel", "StepTerms", "chunked_prefill_time_s",
           "spec_tokens_per_step"]

ACT_BYTES = 2  # activations travel as bf16 in the TP all-reduce


def spec_tokens_per_step(k: int, acceptance: float) -> float:
    """Expected tokens emitted per verify pass: 1 + a + a^2 + ... + a^k = (1 - a^(k+1)) / (1 - a)."""
    if k < 0:
        raise InputError(f"speculative length k must be >= 0, got {k}")
    if not 0 <= acceptance <= 1:
        raise InputError(f"speculative acceptance must be in [0, 1], got {acceptance}")
    if k == 0:
        return 1.0
    if acceptance == 1:
        return float(k + 1)
    return (1 - acceptance ** (k + 1)) / (1 - acceptance)


# Speculative-decoding defaults, where the workload's speculative: section or a flag gives none.
# One draft pass as a fraction of a target pass: an EAGLE-style head is one decoder layer (1/32 of a
# Llama-3.1-8B's layers, 1/80 of a 70B's) plus the LM head, so about 0.03-0.05; 0.05 is the
# conservative end (an assumption: set speculative.draft_cost for a separate draft model).
DRAFT_COST = 0.05
SPEC_METHOD = "eagle3"   # the method a speculative: section without one means (EAGLE-3, Li et al. 2025)


@dataclass(frozen=True)
class SpecConfig:
    k: int
    acceptance: float
    draft_cost: float = DRAFT_COST  # one draft forward pass as a fraction of a target forward pass
    method: str = SPEC_METHOD
    # the drafter resident in GPU memory (costmodel.draft.draft_footprint). None means no draft
    # memory: only for direct library callers; the workload path always derives it from the method
    draft: DraftFootprint | None = None

    def __post_init__(self) -> None:
        spec_tokens_per_step(self.k, self.acceptance)
        if not 0 <= self.draft_cost <= 1:
            raise InputError(f"speculative draft_cost must be in [0, 1], got {self.draft_cost}")

    @property
    def tokens_per_step(self) -> float:
        return spec_tokens_per_step(self.k, self.acceptance)


@dataclass(frozen=True)
class StepBreakdown:
    time_s: float
    mem_s: float
    compute_s: float
    comm_s: float
    overhead_s: float
    draft_s: float
    bytes_per_gpu: float
    flops_per_gpu: float
    tokens_per_seq: float  # output tokens each decode sequence gains this step (expected)

    @property
    def bound(self) -> str:
        return "bandwidth" if self.mem_s >= self.compute_s else "compute"


# (time_s, mem_s, compute_s, comm_s, draft_s, bytes_per_gpu, flops_per_gpu) of one step
StepTerms = tuple[float, float, float, float, float, float, float]


@runtime_checkable
class StepCost(Protocol):
    """What the simulator (``costmodel.replica``, ``costmodel.sim_clock``, ``costmodel.simulate``),
    the goodput search, the screen and the commands read from a step model. ``StepModel`` (the
    analytic model) and ``costmodel.measured.MeasuredStepModel`` (measured step times inside a
    table's range) implement it explicitly; nothing outside reads their underscore names."""

    # read-only members (properties, so an implementation may forward them)
    @property
    def model(self) -> ModelArch: ...
    @property
    def gpu(self) -> GPU: ...
    @property
    def tp(self) -> int: ...
    @property
    def weight_dtype(self) -> str: ...
    @property
    def kv_dtype(self) -> str: ...
    @property
    def speculation(self) -> SpecConfig | None: ...
    @property
    def memory(self) -> MemoryPlan: ...
    @property
    def eff(self) -> Efficiency: ...
    @property
    def parallel(self) -> Parallel: ...

    @property
    def tokens_per_step(self) -> float:
        """Output tokens a decoding sequence gains per step (expected; > 1 with speculation)."""
        ...

    @property
    def request_overhead_s(self) -> float:
        """Not a step cost: the front end's share of every request's TTFT (HTTP, tokenizing,
        streaming the first token), added once per request by the simulator."""
        ...

    @property
    def prefill_overhead_s(self) -> float:
        """The fixed cost a step pays when it carries prompt tokens (engines replay a captured CUDA
        graph for pure-decode batches and launch every kernel of a mixed one); in ``step_time_s``."""
        ...

    @property
    def closed_form_ok(self) -> bool:
        """Step times are a piecewise-linear function of context, so runs of decode steps may be
        summed in closed form (``costmodel.sim_clock``); False: the simulator times every step."""
        ...

    @property
    def verify_tokens_per_seq(self) -> int:
        """Tokens each decoding sequence puts through a step: 1, or k + 1 with speculation."""
        ...

    @property
    def has_sliding_window(self) -> bool:
        """Whether some layers attend over a sliding window (KV reads not linear in context)."""
        ...

    def step_terms(self, n_decode: float, decode_ctx_sum: float, prefill_tokens: float,
                   prefill_pairs: float, prefill_kv_read: float) -> StepTerms: ...

    def breakdown(self, n_decode: float, decode_ctx_sum: float, prefill_tokens: float = 0.0,
                  prefill_pairs: float = 0.0, prefill_kv_read: float = 0.0) -> StepBreakdown: ...

    def step_time_s(self, n_decode: float, decode_ctx_sum: float, prefill_tokens: float = 0.0,
                    prefill_pairs: float = 0.0, prefill_kv_read: float = 0.0) -> float: ...

    def decode_step(self, batch: int, context: float) -> StepBreakdown: ...

    def prefill_time_s(self, prompt_tokens: int, cached_tokens: int = 0,
                       chunk_tokens: int | None = None) -> float: ...

    def weight_read_bytes(self, n_tokens: float) -> float: ...

    # the closed-form clock's probes (costmodel.sim_clock), read only when closed_form_ok is True
    def plain_decode_mem_s(self, n_decode: float, decode_ctx_sum: float) -> float: ...

    def plain_decode_compute_coeffs(self, n_decode: float) -> tuple[float, float]: ...


# the argument types whose token-count terms are memoised (a numpy scalar computes its own)
_PLAIN = (float, int)


class StepModel:
    """The cost model for one replica (a TP group) of one model on one GPU type."""

    def __init__(self, model: ModelArch, gpu: GPU, tp: int = 1, weight_dtype: str = "bf16",
                 kv_dtype: str = "bf16", efficiency: Efficiency = IDEAL, speculation: SpecConfig | None = None,
                 gpu_mem_util: float = GPU_MEM_UTIL, parallel: Parallel | None = None):
        self.model, self.gpu, self.tp = model, gpu, tp
        self.weight_dtype, self.kv_dtype = weight_dtype, kv_dtype
        self.eff = efficiency
        self.speculation = speculation if speculation is not None and speculation.k > 0 else None
        par = parallel if parallel is not None else SINGLE
        if par.tp != tp:
            if parallel is not None:
                raise InputError(f"parallel layout has tp {par.tp} but the step model was asked for tp {tp}")
            par = Parallel(tp=tp, gpus_per_node=max(tp, par.gpus_per_node))
        if par.ep > 1 and not model.is_moe:
            raise InputError(f"ep {par.ep}: {model.name} has no experts (expert parallelism needs an MoE model)")
        self.parallel = par
        self.memory: MemoryPlan = plan_memory(model, gpu, tp, weight_dtype, kv_dtype, gpu_mem_util,
                                              efficiency.activation_reserve_bytes, par,
                                              self.speculation.draft if self.speculation else None)
        e = efficiency
        expert_bytes = model.expert_params_total * DTYPE_BYTES[weight_dtype]
        attn_bytes = attention_weight_bytes(model, weight_dtype) if par.dp_attention else 0.0
        stage_gpus = tp * par.pp
        # DP attention: every GPU of the TP group reads the whole attention weights of its stage
        self._w_dense_gpu = ((weight_bytes(model, weight_dtype) - expert_bytes - attn_bytes) / tp
                             + attn_bytes) / par.pp
        self._w_expert_gpu = expert_bytes / stage_gpus
        self._route_frac = model.n_active_experts / model.n_experts if model.is_moe else 0.0
        # KV bytes per token of the batch, averaged over the GPUs (DP attention: each holds 1/tp of them)
        self._kv_gpu = self.memory.kv_bytes_per_token_per_gpu / (tp if par.dp_attention else 1)
        # bytes-equivalent of one KV token's read time (FP8 KV: its dequantising read rate)
        self._kv_gpu_t = self._kv_gpu / (efficiency.fp8_kv_bw_efficiency if kv_dtype == "fp8" else 1.0)
        self._bw = gpu.hbm_bytes_per_s * e.bw_efficiency
        self._ep = par.ep
        self._routed_flops_tok = 2.0 * model.routed_active_params / stage_gpus if par.ep > 1 else 0.0
        self._gemm_flops_tok = model.dense_flops_per_token() / stage_gpus - self._routed_flops_tok
        self._attn_flops_pair = model.attn_flops_per_token_per_ctx() / stage_gpus
        peak = gpu.matmul_flops_per_s(weight_dtype)
        # FP8 as its own physics (costmodel.efficiency FP8_PARAMS): FP8 GEMMs, FP8 KV reads, scaling
        fp8_w = weight_dtype == "fp8"
        peak *= e.fp8_gemm_efficiency if fp8_w else 1.0
        self._dec_gemm_rate = peak * e.decode_flops_efficiency
        self._dec_attn_rate = gpu.bf16_flops_per_s * e.decode_flops_efficiency * e.decode_attn_efficiency
        self._pre_gemm_rate = peak * e.prefill_flops_efficiency
        self._pre_attn_rate = gpu.bf16_flops_per_s * e.prefill_flops_efficiency
        if tp > 1 and e.model_comm:
            self._n_ar: float = 2 * model.n_layers  # all-reduces per step (float: divided by pp stages)
            self._ar_lat = e.allreduce_latency_s
            self._ar_s_per_token = 2 * (tp - 1) / tp * model.hidden * ACT_BYTES / (gpu.link_bytes_per_s * e.link_efficiency)
        else:
            self._n_ar, self._ar_lat, self._ar_s_per_token = 0, 0.0, 0.0
        self._n_a2a = 0.0
        self._pp = par.pp
        if not par.trivial:
            self._parallel_comm(model, gpu, e, par)
        self._overhead = e.step_overhead_s + (e.fp8_scale_overhead_s if fp8_w else 0.0)
        self._pf_overhead = e.prefill_overhead_s
        # not a step cost: added once to every request's time to first token (costmodel.simulate)
        self.request_overhead_s = e.request_overhead_s
        self._sliding = model.n_sliding_layers > 0
        self._q_per_seq = self.speculation.k + 1 if self.speculation else 1
        self._draft_frac = self.speculation.k * self.speculation.draft_cost if self.speculation else 0.0
        self.tokens_per_step = self.speculation.tokens_per_step if self.speculation else 1.0
        # the terms of a step that depend on its token count alone, memoised per count where they
        # cost more than a lookup (MoE: the experts touched, the busiest GPU's load, the
        # all-to-all; pipelines: the micro-batches and hops): the same floats, computed once
        self._tok_memo: dict | None = {} if self._w_expert_gpu or self._ep > 1 or self._n_a2a else None
        self._pp_memo: dict = {}
        # ``_terms`` without its dispatch: what the simulator's step_terms / step_time_s call
        self._terms_fn = self._pipeline_terms if self._pp > 1 else self._stage_terms

    # ---- StepCost: the protocol the simulator reads (costmodel.replica, costmodel.sim_clock) ---
    # step times are StepModel's piecewise-linear function of context: runs of steps may be summed
    # in closed form (a step model that interpolates measurements says False)
    closed_form_ok: bool = True

    @property
    def verify_tokens_per_seq(self) -> int:
        """Tokens each decoding sequence puts through a step: 1, or k + 1 with speculation."""
        return self._q_per_seq

    @property
    def has_sliding_window(self) -> bool:
        """Whether some layers attend over a sliding window (KV reads not linear in context)."""
        return self._sliding

    @property
    def prefill_overhead_s(self) -> float:
        """The fixed cost of a step that carries prompt tokens (already in ``step_time_s``)."""
        return self._pf_overhead

    def step_terms(self, n_decode: float, decode_ctx_sum: float, prefill_tokens: float,
                   prefill_pairs: float, prefill_kv_read: float) -> StepTerms:
        """(time, mem, compute, comm, draft, bytes, flops) of one step, seconds, bytes and FLOPs
        per GPU: ``breakdown`` without the record (the simulator's hot path)."""
        return self._terms_fn(n_decode, decode_ctx_sum, prefill_tokens, prefill_pairs, prefill_kv_read)

    def plain_decode_mem_s(self, n_decode: float, decode_ctx_sum: float) -> float:
        """Memory time of a plain (non-speculative) decode step: the draft's share of a step is
        ``draft_frac x max(this, compute)``."""
        return (self.weight_read_bytes(n_decode) + self._kv_read_tokens(n_decode, decode_ctx_sum) * self._kv_gpu) / self._bw

    def plain_decode_compute_coeffs(self, n_decode: float) -> tuple[float, float]:
        """(c0, c1): a plain decode step's compute time is c0 + c1 x context sum (seconds)."""
        return n_decode * self._gemm_flops_tok / self._dec_gemm_rate, self._attn_flops_pair / self._dec_attn_rate

    def _parallel_comm(self, model: ModelArch, gpu: GPU, e: Efficiency, par: Parallel) -> None:
        """Communication of a layout beyond one node's TP group (``costmodel.parallel``): per stage,
        the TP all-reduces (hierarchical when the group spans nodes), DP attention's gathers for the
        dense layers and the MoE all-to-all (dispatch + combine) of each GPU's own tokens."""
        link = gpu.link_bytes_per_s * e.link_efficiency
        net = gpu.network_bytes_per_s * e.link_efficiency
        lat, net_lat = e.allreduce_latency_s, gpu.network_latency_s
        g = par.gpus_per_node
        tok_bytes = model.hidden * ACT_BYTES
        self._comm = (link, net, lat, net_lat, g)
        if not e.model_comm:  # the ideal model: communication costs nothing
            self._n_ar, self._ar_lat, self._ar_s_per_token = 0, 0.0, 0.0
            self._hop_bytes_tok, self._hops = 0.0, (0, 0)
            return
        if par.tp > 1:
            self._ar_lat = allreduce_s(0.0, par.tp, g, link, lat, net, net_lat)
            self._ar_s_per_token = allreduce_s(tok_bytes, par.tp, g, link, lat, net, net_lat) - self._ar_lat
            if par.dp_attention:
                # attention is local; each dense MLP layer (and each MoE layer whose experts are sliced)
                # gathers every GPU's tokens and scatters the result: one all-reduce's volume
                layers = model.n_layers - (model.n_moe_layers if par.ep > 1 else 0)
                self._n_ar = layers
            else:
                self._n_ar = 2 * model.n_layers
            self._n_ar /= par.pp
            if par.dp_attention and par.ep > 1:
                self._n_a2a = 2.0 * model.n_moe_layers / par.pp   # dispatch + combine per MoE layer
                # bytes one GPU sends per token of the replica's step: its 1/tp share, top-k copies
                self._a2a_bytes_tok = model.n_active_experts * tok_bytes / par.tp
        self._hop_bytes_tok = tok_bytes
        self._hops = (par.pp - 1 - par.cross_node_hops, par.cross_node_hops)

    def a2a_s(self, n_tokens: float) -> float:
        """All-to-all time of one MoE layer's dispatch (or combine) for a step of ``n_tokens``."""
        if not self._n_a2a:
            return 0.0
        link, net, lat, net_lat, g = self._comm
        return all_to_all_s(n_tokens * self._a2a_bytes_tok, self._ep, g, link, lat, net, net_lat)

    def hops_s(self, n_tokens: float) -> float:
        """The pipeline's stage-to-stage transfers for one micro-batch of ``n_tokens``."""
        if self._pp == 1 or not self._hop_bytes_tok:
            return 0.0
        link, net, lat, net_lat, _ = self._comm
        b = n_tokens * self._hop_bytes_tok
        intra, inter = self._hops
        return intra * hop_s(b, link, lat) + inter * hop_s(b, net, net_lat)

    # ---- pieces ----------------------------------------------------------------------------
    def weight_read_bytes(self, n_tokens: float) -> float:
        """Weights one GPU reads in a step of ``n_tokens``; MoE layers read only the experts the
        tokens route to: expected touched share 1 - (1 - k/E)^tokens (uniform routing)."""
        if not self._w_expert_gpu:
            return self._w_dense_gpu
        touched = 1.0 - (1.0 - self._route_frac) ** max(n_tokens, 1.0)
        if self._ep > 1:  # whole experts per GPU: the busiest GPU touches more of its own than the mean
            touched = min(1.0, touched * expert_load_imbalance(n_tokens, self.model.n_active_experts, self._ep))
        return self._w_dense_gpu + self._w_expert_gpu * touched

    def _kv_read_tokens(self, n_seqs: float, ctx_sum: float) -> float:
        if not self.model.n_sliding_layers or n_seqs <= 0:
            return ctx_sum
        return n_seqs * self.model.kv_read_tokens(ctx_sum / n_seqs)

    def _terms(self, n_decode: float, decode_ctx_sum: float, prefill_tokens: float,
               prefill_pairs: float, prefill_kv_read: float) -> StepTerms:
        """(time, mem, compute, comm, draft, bytes, flops) of one step; the simulator's hot path.
        With pipeline stages, one round: every running sequence advances once (``_pipeline_terms``)."""
        if self._pp > 1:
            return self._pipeline_terms(n_decode, decode_ctx_sum, prefill_tokens, prefill_pairs, prefill_kv_read)
        return self._stage_terms(n_decode, decode_ctx_sum, prefill_tokens, prefill_pairs, prefill_kv_read)

    def _pipeline_terms(self, n_decode: float, decode_ctx_sum: float, prefill_tokens: float,
                        prefill_pairs: float, prefill_kv_read: float) -> StepTerms:
        """A pipeline round: the step's sequences split into M = min(pp, sequences) micro-batches;
        each stage runs its layers for each micro-batch in turn, so a sequence's next token comes
        after pp stage-times of a 1/M-sized micro-batch plus the pp - 1 hops, whatever M is: with
        fewer micro-batches than stages the stages idle (the bubble, 1 - M/pp of their time)."""
        key = (n_decode, prefill_tokens)
        plain = type(n_decode) in _PLAIN and type(prefill_tokens) in _PLAIN
        memo = self._pp_memo.get(key) if plain else None
        if memo is None:
            m = micro_batches(self._pp, n_decode)
            memo = (m, self.hops_s((n_decode * self._q_per_seq + prefill_tokens) / m))
            if plain:
                self._pp_memo[key] = memo
        m, hops = memo
        st = self._stage_terms(n_decode / m, decode_ctx_sum / m, prefill_tokens / m, prefill_pairs / m,
                               prefill_kv_read / m)
        if st[0] <= 0:
            return st
        fixed = self._overhead + (self._pf_overhead if prefill_tokens > 0 else 0.0)
        p = self._pp
        time_s = p * (st[0] - fixed) + hops + fixed
        # per GPU over the round: its stage ran M micro-batches
        return time_s, p * st[1], p * st[2], p * st[3] + hops, p * st[4], m * st[5], m * st[6]

    def _token_terms(self, n_tokens: float) -> tuple[float, float, float]:
        """(weight bytes read per GPU, busiest GPU's expert load over the mean, communication s) of
        a step of ``n_tokens``: the part of ``_stage_terms`` that depends on the count alone."""
        weights = self.weight_read_bytes(n_tokens) if self._w_expert_gpu else self._w_dense_gpu
        imb = expert_load_imbalance(n_tokens, self.model.n_active_experts, self._ep) if self._ep > 1 else 1.0
        comm_s = self._n_ar * (self._ar_lat + self._ar_s_per_token * n_tokens) if self._n_ar else 0.0
        if self._n_a2a:
            comm_s += self._n_a2a * self.a2a_s(n_tokens * imb)
        return weights, imb, comm_s

    def _stage_terms(self, n_decode: float, decode_ctx_sum: float, prefill_tokens: float,
                     prefill_pairs: float, prefill_kv_read: float) -> StepTerms:
        """One stage's pass over one (micro-)batch: the whole step when there is one stage."""
        q = self._q_per_seq
        dec_tokens = n_decode * q
        n_tokens = dec_tokens + prefill_tokens
        if n_tokens <= 0:
            return 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0
        dec_kv = self._kv_read_tokens(n_decode, decode_ctx_sum) if self._sliding else decode_ctx_sum
        tok_memo = self._tok_memo
        if tok_memo is None:  # dense: the weights are read whole, no expert imbalance
            weights, imb = self._w_dense_gpu, 1.0
            comm_s = self._n_ar * (self._ar_lat + self._ar_s_per_token * n_tokens) if self._n_ar else 0.0
        elif type(n_tokens) in _PLAIN:
            memo = tok_memo.get(n_tokens)
            if memo is None:
                memo = tok_memo[n_tokens] = self._token_terms(n_tokens)
            weights, imb, comm_s = memo
        else:  # numpy scalars (the screen's grids): computed in their own arithmetic, as always
            weights, imb, comm_s = self._token_terms(n_tokens)
        kv_tokens = dec_kv + prefill_kv_read + n_tokens
        bytes_gpu = weights + kv_tokens * self._kv_gpu
        dec_gemm = dec_tokens * self._gemm_flops_tok
        if self._routed_flops_tok:  # expert parallelism: the busiest GPU's routed-expert GEMMs set the pace
            dec_gemm += dec_tokens * self._routed_flops_tok * imb
        dec_attn = (q * decode_ctx_sum + n_decode * q * (q + 1) / 2) * self._attn_flops_pair
        pre_gemm = prefill_tokens * (self._gemm_flops_tok + self._routed_flops_tok * imb)
        pre_attn = prefill_pairs * self._attn_flops_pair
        mem_s = (weights + kv_tokens * self._kv_gpu_t) / self._bw
        comp_s = (dec_gemm / self._dec_gemm_rate + dec_attn / self._dec_attn_rate
                  + pre_gemm / self._pre_gemm_rate + pre_attn / self._pre_attn_rate)
        draft_s = 0.0
        if self._draft_frac and n_decode:
            # the draft runs k passes over the decode batch, each a fraction of a plain target step
            plain_comp = (n_decode * self._gemm_flops_tok / self._dec_gemm_rate
                          + decode_ctx_sum * self._attn_flops_pair / self._dec_attn_rate)
            plain_mem = (self.weight_read_bytes(n_decode) + dec_kv * self._kv_gpu) / self._bw
            draft_s = self._draft_frac * max(plain_mem, plain_comp)
        time_s = (mem_s if mem_s >= comp_s else comp_s) + comm_s + self._overhead + draft_s
        if prefill_tokens > 0:
            time_s += self._pf_overhead
        return time_s, mem_s, comp_s, comm_s, draft_s, bytes_gpu, dec_gemm + dec_attn + pre_gemm + pre_attn

    def breakdown(self, n_decode: float, decode_ctx_sum: float, prefill_tokens: float = 0.0,
                  prefill_pairs: float = 0.0, prefill_kv_read: float = 0.0) -> StepBreakdown:
        """Cost of one step with ``n_decode`` decode sequences whose contexts sum to
        ``decode_ctx_sum`` tokens, plus ``prefill_tokens`` prompt tokens attending over
        ``prefill_pairs`` (query, key) pairs and reading ``prefill_kv_read`` cached tokens."""
        t, mem_s, comp_s, comm_s, draft_s, bytes_gpu, flops = self._terms(
            n_decode, decode_ctx_sum, prefill_tokens, prefill_pairs, prefill_kv_read)
        overhead = (self._overhead + (self._pf_overhead if prefill_tokens > 0 else 0.0)) if t > 0 else 0.0
        return StepBreakdown(t, mem_s, comp_s, comm_s, overhead, draft_s, bytes_gpu, flops, self.tokens_per_step)

    def step_time_s(self, n_decode: float, decode_ctx_sum: float, prefill_tokens: float = 0.0,
                    prefill_pairs: float = 0.0, prefill_kv_read: float = 0.0) -> float:
        return self._terms_fn(n_decode, decode_ctx_sum, prefill_tokens, prefill_pairs, prefill_kv_read)[0]

    # ---- convenience -----------------------------------------------------------------------
    def decode_step(self, batch: int, context: float) -> StepBreakdown:
        """A pure decode step of ``batch`` sequences, each with ``context`` tokens cached."""
        if batch < 1:
            raise InputError(f"batch must be >= 1, got {batch}")
        return self.breakdown(batch, batch * float(context))

    @staticmethod
    def chunk_pairs(chunk: float, prior: float) -> float:
        """(query, key) pairs of a causal prefill chunk of ``chunk`` tokens after ``prior`` cached."""
        return chunk * prior + chunk * (chunk + 1) / 2

    def prefill_time_s(self, prompt_tokens: int, cached_tokens: int = 0, chunk_tokens: int | None = None) -> float:
        """Time to prefill a prompt alone (no decodes riding along), in chunks of ``chunk_tokens``."""
        return chunked_prefill_time_s(self.step_time_s, prompt_tokens, cached_tokens, chunk_tokens)


def chunked_prefill_time_s(step_time_s: Callable[..., float], prompt_tokens: int, cached_tokens: int = 0,
                           chunk_tokens: int | None = None) -> float:
    """A prompt prefilled alone in chunks of ``chunk_tokens``: the sum of ``step_time_s(0, 0,
    chunk, pairs, prior)`` over its chunks (any ``StepCost``'s step times)."""
    todo = max(prompt_tokens - cached_tokens, 0)
    if todo == 0:
        return 0.0
    chunk = chunk_tokens or todo
    t, done = 0.0, cached_tokens
    while todo > 0:
        n = min(chunk, todo)
        t += step_time_s(0, 0.0, n, StepModel.chunk_pairs(n, done), done)
        done += n
        todo -= n
    return t
