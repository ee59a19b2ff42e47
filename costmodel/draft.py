"""The speculative draft's memory: its weights and its own KV cache, derived from an architecture.

A speculative method keeps a drafter resident next to the target; its weights come out of the same
GPU memory the KV pool is carved from, and its attention layers keep their own KV for every token
of every sequence (vLLM allocates the draft's layers in the same block pool as the target's, so a
pool token costs target + draft KV bytes). Per method (vLLM 0.33 structure; SGLang's is the same):

    ngram (and other model-free proposers)   nothing
    draft    a separate model (``speculative.draft_model``, resolved like ``model:``): all its
             weights, stored bf16 (vllm/config/speculative.py: ``quantization`` None means an
             unquantized draft), and the KV of all its layers
    eagle3   one decoder layer of the target's width whose q/k/v read 2 x hidden (embedding and
             hidden state concatenated), the fc fusing 3 target hidden states (3h -> h), the
             layer's extra hidden_norm, a final norm, an LM head over the draft vocabulary and
             the draft-to-target id map (vllm/model_executor/models/llama_eagle3.py); the input
             embedding is the target's (vllm/v1/spec_decode/eagle.py ``load_model`` shares it when
             the checkpoint has none, as EAGLE-3 checkpoints do). KV: that one layer. bf16.
    eagle    one decoder layer of the target's shape without its input norm and the fc fusing
             embedding and hidden state (2h -> h) (vllm/model_executor/models/llama_eagle.py);
             embedding and LM head are the target's (eagle.py ``load_model``). KV: one layer. bf16.
    medusa   ``medusa_num_heads`` heads (5, the default of FasterDecoding/Medusa medusa_model.py
             MedusaConfig and vLLM's MedusaConfig), each one ResBlock (a hidden x hidden linear with
             the reference's bias; replicated, nn.Linear in vllm/model_executor/models/medusa.py) and
             an LM head over the vocabulary (vocabulary-parallel). No attention, no KV. bf16.
    mtp      the model's own ``num_nextn_predict_layers`` heads, each one decoder layer of the
             model's last (MoE) kind plus enorm, hnorm, eh_proj (2h -> h) and a final norm
             (vllm/model_executor/models/deepseek_mtp.py); embedding and LM head are shared with
             the target (DeepSeek-V3 report section 2.2; eagle.py shares them). ``weight_bytes``
             counts ``num_hidden_layers`` only, so these are not in the target's weights. Stored
             in the target's weight format (speculative.py sets the MTP draft's quantization to
             the target's). KV: one layer each.

Sharding: vLLM runs the draft at the target's tensor-parallel size unless
``draft_tensor_parallel_size`` says otherwise (vllm/config/speculative.py
``_verify_and_get_draft_tp``: default ``target_parallel_config.tensor_parallel_size``), so the
column/row-parallel layers and the vocabulary-parallel LM head split by TP, while the
``ReplicatedLinear``/``nn.Linear`` fusion layers, the norms and the id map sit whole on every GPU.
The draft's parallel config has ``pipeline_parallel_size=1``: kvtune charges every GPU of the
replica a TP shard of it (the GPUs that hold it set the pool). Its KV splits across TP by KV heads
like the target's (MLA latents are replicated).
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import InputError
from .models import DTYPE_BYTES, ModelArch, get_model
from .weights import weight_bytes

__all__ = ["DraftFootprint", "draft_footprint", "EAGLE3_DRAFT_VOCAB", "MEDUSA_HEADS", "NO_MEMORY_METHODS",
           "DRAFT_WEIGHT_DTYPE"]

# EAGLE-3 heads predict over a reduced vocabulary: the published heads' config.json say
# draft_vocab_size 32000 (yuhuili/EAGLE3-LLaMA3.1-Instruct-8B: num_hidden_layers 1,
# draft_vocab_size 32000, vocab_size 128256; the EAGLE-3 training config's default)
EAGLE3_DRAFT_VOCAB = 32000
ID_MAP_BYTES = 8   # draft_id_to_target_id: one torch.long per draft-vocabulary entry (llama_eagle3.py)
# drafts without weights of their own: n-gram prompt lookup (vLLM ngram, SGLang NGRAM), llama.cpp lookahead
NO_MEMORY_METHODS = ("ngram", "lookahead", "suffix")
MEDUSA_HEADS = 5   # medusa_num_heads default: FasterDecoding/Medusa medusa_model.py MedusaConfig; vLLM MedusaConfig num_heads
DRAFT_WEIGHT_DTYPE = "bf16"   # vllm/config/speculative.py: a draft's quantization None = unquantized weights


@dataclass(frozen=True)
class DraftFootprint:
    """What a drafter holds in GPU memory, whole (before sharding); bytes are decimal."""

    name: str                         # what the plan and its errors call the draft
    sharded_weight_bytes: float       # split across the TP ranks
    replicated_weight_bytes: float    # whole on every GPU (fusion fc, norms, id map)
    kv_layers: int                    # attention layers keeping KV per token
    kv_heads: int                     # KV heads per layer (0: an MLA latent, replicated on every rank)
    kv_elements_per_token_per_layer: int
    attn_heads: int = 0               # attention heads per layer, to check the TP split (0: not checked)

    def tp_error(self, tp: int) -> str | None:
        """Why the draft cannot run at the target's TP ``tp`` (its heads do not split), or None."""
        if self.kv_heads and self.kv_heads % tp and tp % self.kv_heads:
            return f"tp {tp} does not divide the {self.name}'s {self.kv_heads} KV heads (nor is it a multiple of them)"
        if self.attn_heads and self.attn_heads % tp:
            return f"tp {tp} does not divide the {self.name}'s {self.attn_heads} attention heads"
        return None

    @property
    def weight_bytes(self) -> float:
        return self.sharded_weight_bytes + self.replicated_weight_bytes

    def weight_bytes_per_gpu(self, tp: int) -> float:
        return self.sharded_weight_bytes / tp + self.replicated_weight_bytes

    def kv_bytes_per_token(self, kv_dtype: str) -> float:
        """All draft layers, one token, unsharded."""
        return float(self.kv_layers * self.kv_elements_per_token_per_layer * DTYPE_BYTES[kv_dtype])

    def kv_bytes_per_token_per_gpu(self, kv_dtype: str, tp: int) -> float:
        """KV heads split across TP until each rank holds one (as the target's, costmodel.models)."""
        if not self.kv_heads:
            return self.kv_bytes_per_token(kv_dtype)
        return self.kv_bytes_per_token(kv_dtype) * max(self.kv_heads / tp, 1.0) / self.kv_heads


def _gqa_kv_elements(m: ModelArch) -> int:
    return 2 * m.n_kv_heads * m.head_dim


def _eagle_head(target: ModelArch, eagle3: bool) -> DraftFootprint:
    """EAGLE / EAGLE-3 head of ``target`` (the head's config copies the target's hidden size, heads,
    head_dim and intermediate size)."""
    h, d = target.hidden, target.head_dim
    q_out, kv_out = target.n_heads * d, 2 * target.n_kv_heads * d
    qkv_in = 2 * h if eagle3 else h              # EAGLE-3 layer 0 attends over [embedding, hidden]
    attn = qkv_in * (q_out + kv_out) + q_out * h   # qkv_proj + o_proj (no bias: Llama heads)
    mlp = 3 * h * target.intermediate              # gate, up, down
    b = DTYPE_BYTES[DRAFT_WEIGHT_DTYPE]
    if eagle3:
        vocab = min(EAGLE3_DRAFT_VOCAB, target.vocab)
        sharded = (attn + mlp + vocab * h) * b               # + LM head over the draft vocabulary
        norms = 4 * h                                        # input, post-attention, hidden_norm, final
        replicated = (3 * h * h + norms) * b + vocab * ID_MAP_BYTES   # fc over 3 hidden states
        name = f"EAGLE-3 head of {target.name}, draft vocabulary {vocab}"   # the assumed vocabulary, on record
    else:
        sharded = (attn + mlp) * b
        replicated = (2 * h * h + h) * b                     # fc over [embedding, hidden]; post-attention norm
        name = f"EAGLE head of {target.name}"
    return DraftFootprint(name, float(sharded), float(replicated), 1, target.n_kv_heads, _gqa_kv_elements(target))


def _medusa_heads(target: ModelArch) -> DraftFootprint:
    h, n, b = target.hidden, MEDUSA_HEADS, DTYPE_BYTES[DRAFT_WEIGHT_DTYPE]
    return DraftFootprint(f"{n} Medusa heads of {target.name}", float(n * target.vocab * h * b),
                          float(n * (h * h + h) * b), 0, 0, 0)


def _mtp_heads(target: ModelArch, weight_dtype: str) -> DraftFootprint | None:
    n = target.n_mtp_layers
    if n == 0:
        return None
    h = target.hidden
    # one decoder layer of the model's last kind (an MoE layer in DeepSeek-V3), its two norms included
    layer = target.decoder_layer_params(moe=target.is_moe)
    b = DTYPE_BYTES[weight_dtype]
    replicated = n * ((2 * h * h) * b + 3 * h * DTYPE_BYTES["bf16"])   # eh_proj (nn.Linear); enorm, hnorm, norm
    return DraftFootprint(f"{target.name}'s {n} MTP layer{'s' if n > 1 else ''}", float(n * layer * b),
                          float(replicated), n, 0 if target.is_mla else target.n_kv_heads,
                          target.kv_elements_per_token_per_layer())


def _draft_model(draft_model: str | None, target: ModelArch) -> DraftFootprint:
    if not draft_model:
        raise InputError("speculative.draft_model: method 'draft' needs the draft model "
                         "(a catalog name, a Hugging Face id from the catalog or a config.json path)")
    try:
        m = get_model(draft_model)
    except InputError as exc:
        raise InputError(f"speculative.draft_model {draft_model!r}: {exc}") from None
    return DraftFootprint(f"draft model {m.name}", weight_bytes(m, DRAFT_WEIGHT_DTYPE), 0.0, m.n_layers,
                          0 if m.is_mla else m.n_kv_heads, m.kv_elements_per_token_per_layer(), m.n_heads)


def draft_footprint(method: str, target: ModelArch, weight_dtype: str,
                    draft_model: str | None = None) -> DraftFootprint | None:
    """The drafter ``method`` keeps resident for ``target`` (None: no memory of its own).
    ``weight_dtype``: the target's weights (MTP heads are stored like them)."""
    if method in NO_MEMORY_METHODS:
        return None
    if method == "draft":
        return _draft_model(draft_model, target)
    if method in ("eagle3", "eagle"):
        return _eagle_head(target, method == "eagle3")
    if method == "mtp":
        return _mtp_heads(target, weight_dtype)
    if method == "medusa":
        return _medusa_heads(target)
    raise InputError(f"speculative.method {method!r}: kvtune cannot size its drafter's memory "
                     f"(it knows eagle3, eagle, medusa, mtp, draft and {', '.join(NO_MEMORY_METHODS)})")
