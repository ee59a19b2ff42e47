"""Model architectures: parameter counts, KV-cache bytes and FLOPs per token, from config.json.

A model is named by catalog short name (``llama-2-70b``), Hugging Face id
(``meta-llama/Llama-2-70b-hf``) or a path to a local ``config.json``. The reader understands the
fields of the Llama/Mistral/Qwen2/Qwen3/Gemma2 dense families, Mixtral and Qwen3-MoE experts,
DeepSeek-V3 multi-head latent attention (MLA), ``head_dim`` where it is not hidden/heads,
``text_config`` wrappers of multimodal configs, sliding-window layers and tied embeddings.

Counting (nanoGPT's transformer_sizing, extended):
  attention (GQA)  q: h*(H*d)  k,v: h*(Hkv*d) each  o: (H*d)*h   (+ q/k/v biases for Qwen2)
  attention (MLA)  q_a: h*r_q, q_b: r_q*H*(d_nope+d_rope), kv_a: h*(r_kv+d_rope),
                   kv_b: r_kv*H*(d_nope+d_v), o: H*d_v*h
  MLP (SwiGLU)     3*h*i ; an MoE layer has E experts of 3*h*i_moe plus a router h*E
  embeddings       V*h, and the LM head V*h again unless tied
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from .files import load_yaml, path_kind, profiles_path, read_text, reading
from .dtypes import BYTES_PER_ELEMENT
from .errors import InputError

__all__ = ["ModelArch", "get_model", "list_models", "model_from_config", "catalog_entry", "cached_hub_id", "DTYPE_BYTES"]

# Bytes per element of the formats kvtune models (bf16/fp16: 2 bytes; fp8 e4m3/e5m2: 1 byte; GGUF
# block formats fractional): one home, costmodel.dtypes.
DTYPE_BYTES = BYTES_PER_ELEMENT
# The largest size a config.json dimension may state. The biggest real ones are vocabularies of
# ~256k entries and contexts of ~10M tokens; 2**31 - 1 keeps every product of three dimensions
# (parameter counts) exactly representable as a float and far from overflow.
MAX_DIM = 2**31 - 1
# config.json keys that state the longest sequence, as vLLM reads them (vllm/config.py
# _get_and_verify_max_len, v0.6): the smallest of those present wins.
_CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "model_max_length",
                 "max_sequence_length", "max_seq_length", "seq_len")


@dataclass(frozen=True)
class ModelArch:
    name: str
    hf_id: str
    n_layers: int
    hidden: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied_embeddings: bool = False
    qkv_bias: bool = False
    qk_norm: bool = False
    # Mixture of experts (0 experts = dense)
    n_experts: int = 0
    n_active_experts: int = 0
    moe_intermediate: int = 0
    n_shared_experts: int = 0
    n_dense_layers: int = 0  # leading dense layers before the MoE layers (DeepSeek first_k_dense_replace)
    # Multi-head latent attention (DeepSeek): 0 = plain GQA
    kv_lora_rank: int = 0
    q_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    # Sliding-window attention: the window in tokens and how many layers use it
    sliding_window: int = 0
    n_sliding_layers: int = 0
    published_params: float = 0.0  # published size in parameters, 0 when not known
    source: str = ""
    n_mtp_layers: int = 0  # multi-token-prediction heads shipped with the model (DeepSeek num_nextn_predict_layers)
    # The longest sequence (prompt + output) the model serves, tokens; 0 when the config does not say
    max_context_tokens: int = 0

    def __post_init__(self) -> None:
        for f in ("n_layers", "hidden", "n_heads", "n_kv_heads", "head_dim", "vocab", "intermediate"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or not 0 < v <= MAX_DIM:
                raise InputError(f"model {self.name}: {f} must be a whole number in 1..{MAX_DIM}, got {v!r}")
        for f in ("n_experts", "n_active_experts", "moe_intermediate", "n_shared_experts", "n_dense_layers",
                  "kv_lora_rank", "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
                  "sliding_window", "n_sliding_layers", "n_mtp_layers", "max_context_tokens"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_DIM:
                raise InputError(f"model {self.name}: {f} must be a whole number in 0..{MAX_DIM}, got {v!r}")
        for f, n in (("n_dense_layers", self.n_dense_layers), ("n_sliding_layers", self.n_sliding_layers)):
            if n > self.n_layers:
                raise InputError(f"model {self.name}: {f} {n} exceeds the {self.n_layers} layers")
        if self.n_experts and not self.moe_intermediate:
            raise InputError(f"model {self.name}: an MoE model needs moe_intermediate_size (or intermediate_size) >= 1")
        if self.n_heads % self.n_kv_heads:
            raise InputError(f"model {self.name}: num_attention_heads {self.n_heads} is not a multiple of "
                             f"num_key_value_heads {self.n_kv_heads}")
        if self.n_experts and not 0 < self.n_active_experts <= self.n_experts:
            raise InputError(f"model {self.name}: num_experts_per_tok {self.n_active_experts} must be in 1..{self.n_experts}")

    # ---- structure -------------------------------------------------------------------------
    @property
    def is_moe(self) -> bool:
        return self.n_experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def n_moe_layers(self) -> int:
        return self.n_layers - self.n_dense_layers if self.is_moe else 0

    def _attn_params_per_layer(self) -> int:
        h = self.hidden
        if self.is_mla:
            qk = self.qk_nope_head_dim + self.qk_rope_head_dim
            if self.q_lora_rank:
                q = h * self.q_lora_rank + self.q_lora_rank + self.q_lora_rank * self.n_heads * qk
            else:
                q = h * self.n_heads * qk
            kv = (h * (self.kv_lora_rank + self.qk_rope_head_dim) + self.kv_lora_rank
                  + self.kv_lora_rank * self.n_heads * (self.qk_nope_head_dim + self.v_head_dim))
            o = self.n_heads * self.v_head_dim * h
            return q + kv + o
        q = h * self.n_heads * self.head_dim
        kv = 2 * h * self.n_kv_heads * self.head_dim
        o = self.n_heads * self.head_dim * h
        bias = (self.n_heads + 2 * self.n_kv_heads) * self.head_dim if self.qkv_bias else 0
        norm = 2 * self.head_dim if self.qk_norm else 0
        return q + kv + o + bias + norm

    def _expert_params(self) -> int:
        return 3 * self.hidden * self.moe_intermediate

    def _mlp_params(self, active: bool) -> int:
        dense = self.n_layers - self.n_moe_layers
        total = dense * 3 * self.hidden * self.intermediate
        if self.is_moe:
            experts = self.n_active_experts if active else self.n_experts
            per_layer = (experts + self.n_shared_experts) * self._expert_params() + self.hidden * self.n_experts
            total += self.n_moe_layers * per_layer
        return total

    def decoder_layer_params(self, moe: bool) -> int:
        """Parameters of one decoder layer: attention, its MLP (an MoE layer's experts, shared
        experts and router when ``moe``) and its two norms."""
        if moe and self.is_moe:
            mlp = (self.n_experts + self.n_shared_experts) * self._expert_params() + self.hidden * self.n_experts
        else:
            mlp = 3 * self.hidden * self.intermediate
        return self._attn_params_per_layer() + mlp + 2 * self.hidden

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    def _params(self, active: bool) -> int:
        norms = self.n_layers * 2 * self.hidden + self.hidden
        emb = self.embedding_params * (1 if self.tied_embeddings else 2)
        return self.n_layers * self._attn_params_per_layer() + self._mlp_params(active) + norms + emb

    @property
    def total_params(self) -> int:
        """Every parameter stored (all experts)."""
        return self._params(active=False)

    @property
    def active_params(self) -> int:
        """Parameters one token touches (routed top-k experts plus shared experts)."""
        return self._params(active=True)

    @property
    def expert_params_total(self) -> int:
        """Routed-expert parameters across all MoE layers (those a decode batch may skip)."""
        return self.n_moe_layers * self.n_experts * self._expert_params() if self.is_moe else 0

    @property
    def attention_params(self) -> int:
        """Attention projection parameters across all layers (replicated on every GPU under
        data-parallel attention)."""
        return self.n_layers * self._attn_params_per_layer()

    @property
    def routed_active_params(self) -> int:
        """Routed-expert parameters one token runs through (top-k experts of every MoE layer):
        the share of its GEMM work that expert parallelism places on other GPUs."""
        return self.n_moe_layers * self.n_active_experts * self._expert_params() if self.is_moe else 0

    @property
    def matmul_params_per_token(self) -> int:
        """Parameters that take part in a matmul per token: the active set less the input
        embedding lookup (a gather, not a GEMM); with tied embeddings the LM head reuses it."""
        return self.active_params - (0 if self.tied_embeddings else self.embedding_params)

    # ---- KV cache --------------------------------------------------------------------------
    def kv_elements_per_token_per_layer(self) -> int:
        """K and V elements one token stores in one layer (MLA: the compressed latent + rope key)."""
        if self.is_mla:
            return self.kv_lora_rank + self.qk_rope_head_dim
        return 2 * self.n_kv_heads * self.head_dim

    def kv_bytes_per_token(self, kv_dtype: str = "bf16") -> float:
        """Whole-model KV bytes per token of context, all layers (full-attention accounting)."""
        return self.n_layers * self.kv_elements_per_token_per_layer() * DTYPE_BYTES[kv_dtype]

    def kv_bytes_per_token_per_gpu(self, kv_dtype: str, tp: int) -> float:
        """KV bytes per token that one GPU of a TP group holds.

        GQA shards KV heads across ranks; when TP exceeds the KV heads each rank still holds one
        head (replicated), so per-GPU bytes stop falling. MLA's latent is replicated on every rank.
        """
        if self.is_mla:
            return float(self.kv_bytes_per_token(kv_dtype))
        heads_per_gpu = max(self.n_kv_heads / tp, 1.0)
        return self.n_layers * 2 * heads_per_gpu * self.head_dim * DTYPE_BYTES[kv_dtype]

    def kv_read_tokens(self, context: float) -> float:
        """Effective full-model tokens of KV a sequence of ``context`` tokens reads per step:
        sliding-window layers read at most their window."""
        if not self.n_sliding_layers:
            return context
        full = self.n_layers - self.n_sliding_layers
        return (full * context + self.n_sliding_layers * min(context, self.sliding_window)) / self.n_layers

    # ---- FLOPs -----------------------------------------------------------------------------
    def attn_flops_per_token_per_ctx(self) -> float:
        """Attention-score FLOPs per (query token, cached key) pair, all layers: QK^T and PV are
        each one multiply-add (2 FLOPs) per head-dim element per head."""
        if self.is_mla:
            # absorbed MLA decode: scores over the latent+rope dims, values over the latent
            return self.n_layers * self.n_heads * 2 * (2 * self.kv_lora_rank + self.qk_rope_head_dim)
        return self.n_layers * self.n_heads * 2 * 2 * self.head_dim

    def dense_flops_per_token(self) -> float:
        """GEMM FLOPs per token: 2 per matmul parameter (multiply + add)."""
        return 2.0 * self.matmul_params_per_token

    def tp_error(self, tp: int) -> str | None:
        """Why ``tp`` cannot shard this model's attention, or None."""
        if tp < 1:
            return f"tp must be >= 1, got {tp}"
        if not self.is_mla and self.n_kv_heads % tp and tp % self.n_kv_heads:
            return (f"tp {tp} does not divide {self.name}'s {self.n_kv_heads} KV heads "
                    f"(nor is it a multiple of them)")
        if self.n_heads % tp:
            return f"tp {tp} does not divide {self.name}'s {self.n_heads} attention heads"
        return None


# ---- reading config.json ------------------------------------------------------------------

def _get(cfg: dict, where: str, *keys, default=None, required=True):
    for k in keys:
        if k in cfg and cfg[k] is not None:
            return cfg[k]
    if required and default is None:
        raise InputError(f"{where}: missing key '{keys[0]}'")
    return default


def _int(cfg: dict, where: str, *keys, default=None, required=True, lo: int = 0) -> int:
    v = _get(cfg, where, *keys, default=default, required=required)
    if v is None:
        return 0
    key = next((k for k in keys if cfg.get(k) is not None), keys[0])
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (isinstance(v, float) and not math.isfinite(v)) \
            or int(v) != v:
        raise InputError(f"{where}: key '{key}' must be a whole number, got {_clip(v)}")
    if not lo <= v <= MAX_DIM:
        raise InputError(f"{where}: key '{key}' = {_clip(v)} must be in {lo}..{MAX_DIM}")
    return int(v)


def _clip(v) -> str:
    s = repr(v)
    return s if len(s) <= 40 else s[:30] + f"...({len(s)} characters)"


def _max_context(cfg: dict, where: str) -> int:
    """The longest sequence the config allows (0: not stated), with RoPE scaling as vLLM applies it:
    YaRN stretches ``original_max_position_embeddings`` by ``factor``; linear and dynamic scaling
    stretch the stated length; Llama-3 and LongRoPE configs already state the stretched length."""
    found = [_int(cfg, where, k, default=0, required=False) for k in _CONTEXT_KEYS if cfg.get(k) is not None]
    found = [n for n in found if n > 0]
    if not found:
        return 0
    n = min(found)
    rs = cfg.get("rope_scaling")
    if isinstance(rs, dict):
        kind = str(rs.get("rope_type", rs.get("type", "")))
        factor: Any = rs.get("factor")
        if kind not in ("", "default", "su", "longrope", "llama3", "mrope") and _is_num(factor) and factor >= 1:
            if kind == "yarn" and cfg["rope_scaling"].get("original_max_position_embeddings") is not None:
                n = _int(rs, f"{where}: rope_scaling", "original_max_position_embeddings")
            n = int(min(n * factor, MAX_DIM))
    return n


def _is_num(v) -> bool:
    return not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v)


def model_from_config(cfg: dict, name: str, hf_id: str = "", where: str | None = None,
                      published_params: float = 0.0) -> ModelArch:
    """Build a ModelArch from a Hugging Face config.json dictionary.
    A fault the checks did not foresee is still one line (``costmodel.files.reading``).
    """
    with reading(where or name, "model config"):
        return _model_from_config(cfg, name, hf_id, where, published_params)


def _model_from_config(cfg: dict, name: str, hf_id: str = "", where: str | None = None,
                      published_params: float = 0.0) -> ModelArch:
    where = where or name
    if not isinstance(cfg, dict):
        raise InputError(f"{where}: config must be a JSON object")
    if "text_config" in cfg and isinstance(cfg["text_config"], dict):
        merged = dict(cfg["text_config"])
        merged.setdefault("tie_word_embeddings", cfg.get("tie_word_embeddings", False))
        cfg = merged
    hidden = _int(cfg, where, "hidden_size", "d_model", "n_embd", lo=1)
    n_heads = _int(cfg, where, "num_attention_heads", "n_head", lo=1)
    n_kv = _int(cfg, where, "num_key_value_heads", default=n_heads, lo=1)
    head_dim = _int(cfg, where, "head_dim", default=hidden // n_heads, lo=1)
    n_layers = _int(cfg, where, "num_hidden_layers", "n_layer", lo=1)
    n_experts = _int(cfg, where, "num_local_experts", "num_experts", "n_routed_experts", default=0, required=False)
    mtype = str(cfg.get("model_type", ""))
    sliding = 0
    n_sliding = 0
    sw = cfg.get("sliding_window")
    use_sw = cfg.get("use_sliding_window", True)
    if isinstance(sw, int) and not isinstance(sw, bool) and sw > 0 and use_sw:
        sliding = sw
        if "layer_types" in cfg and isinstance(cfg["layer_types"], list):
            n_sliding = sum(1 for t in cfg["layer_types"] if "sliding" in str(t))
        elif mtype.startswith("gemma2") or mtype.startswith("gemma3"):
            n_sliding = n_layers // 2  # Gemma 2 alternates local (sliding) and global layers
        elif "max_window_layers" in cfg:
            n_sliding = max(n_layers - _int(cfg, where, "max_window_layers", default=0, required=False), 0)
        else:
            n_sliding = n_layers  # Mistral-style: every layer uses the window
    n_sliding = min(n_sliding, n_layers)
    kv_lora = _int(cfg, where, "kv_lora_rank", default=0, required=False)
    fields: dict[str, Any] = dict(
        name=name,
        hf_id=hf_id,
        n_layers=n_layers,
        hidden=hidden,
        n_heads=n_heads,
        n_kv_heads=n_kv,
        head_dim=head_dim,
        intermediate=_int(cfg, where, "intermediate_size", "ffn_dim", default=4 * hidden, lo=1),
        vocab=_int(cfg, where, "vocab_size", lo=1),
        tied_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        qkv_bias=bool(cfg.get("attention_bias", mtype in ("qwen2", "qwen2_moe"))),
        qk_norm=mtype in ("qwen3", "qwen3_moe"),
        n_experts=n_experts,
        n_active_experts=_int(cfg, where, "num_experts_per_tok", default=0, required=False) if n_experts else 0,
        moe_intermediate=(_int(cfg, where, "moe_intermediate_size", default=0, required=False)
                          or _int(cfg, where, "intermediate_size", default=4 * hidden)) if n_experts else 0,
        n_shared_experts=_int(cfg, where, "n_shared_experts", default=0, required=False),
        n_dense_layers=_int(cfg, where, "first_k_dense_replace", default=0, required=False) if n_experts else 0,
        kv_lora_rank=kv_lora,
        q_lora_rank=_int(cfg, where, "q_lora_rank", default=0, required=False) if kv_lora else 0,
        qk_nope_head_dim=_int(cfg, where, "qk_nope_head_dim", default=0, required=False),
        qk_rope_head_dim=_int(cfg, where, "qk_rope_head_dim", default=0, required=False),
        v_head_dim=_int(cfg, where, "v_head_dim", default=0, required=False),
        sliding_window=sliding,
        n_sliding_layers=n_sliding,
        published_params=published_params,
        source=where,
        n_mtp_layers=_int(cfg, where, "num_nextn_predict_layers", default=0, required=False),
        max_context_tokens=_max_context(cfg, where),
    )
    try:
        return ModelArch(**fields)
    except InputError as exc:  # a rule across keys (heads, experts): name the file too
        raise InputError(f"{where}: {exc}") from None


@lru_cache(maxsize=None)
def _catalog() -> dict:
    data = load_yaml(profiles_path("models.yaml"))
    assert isinstance(data, dict), "the shipped model catalog is a mapping of model names"
    return data


def list_models() -> list[str]:
    return list(_catalog())


def _normalise(s: str) -> str:
    s = s.strip().lower()
    for suffix in ("-instruct", "-hf", "-chat"):
        if s.endswith(suffix):
            s = s[: -len(suffix)]
    return s.replace("meta-llama-", "llama-")


def _lookup(name: str) -> str | None:
    cat = _catalog()
    key = name.strip().lower()
    if key in cat:
        return key
    for short, row in cat.items():
        hf = row["hf_id"].lower()
        if key == hf or _normalise(key.split("/")[-1]) == _normalise(hf.split("/")[-1]):
            return short
        if _normalise(key) == short:
            return short
    return None


def catalog_entry(name: str) -> tuple[str, dict] | None:
    """(short name, row) of the catalog model ``name`` (a short name or Hugging Face id, as
    ``get_model`` resolves them), or None if the catalog has no such model. The row holds its
    ``hf_id`` and, where published, other checkpoints (``costmodel.checkpoints`` reads them)."""
    if not isinstance(name, str) or not name.strip():
        return None
    short = _lookup(name)
    return None if short is None else (short, _catalog()[short])


def _read_config(path: Path) -> dict:
    text = read_text(path, "model config (config.json)")
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}: malformed JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    except (ValueError, RecursionError) as exc:  # an integer of over 4300 digits; nesting too deep
        raise InputError(f"{path}: malformed JSON ({str(exc).splitlines()[0][:80]})") from None


def cached_hub_id(path: Path) -> str:
    """The Hub id whose Hugging Face cache snapshot holds ``path`` (``.../models--ORG--NAME/snapshots/
    REV/config.json``, the cache layout huggingface_hub documents), '' for any other path."""
    parts = path.parts
    if len(parts) >= 4 and parts[-3] == "snapshots" and parts[-4].startswith("models--"):
        org_name = parts[-4][len("models--"):].split("--")
        if len(org_name) == 2 and all(org_name):
            return "/".join(org_name)
    return ""


def get_model(name: str) -> ModelArch:
    """Resolve a catalog short name, a Hugging Face id or a path to config.json."""
    if not name or not str(name).strip():
        raise InputError("model name is empty")
    p = Path(name)
    kind = path_kind(p)
    if p.suffix == ".json" or kind:
        if kind == "dir":
            p = p / "config.json"
        if not path_kind(p):
            raise InputError(f"model config {p}: no such file")
        hub = cached_hub_id(p)
        return model_from_config(_read_config(p), name=hub.split("/")[1] if hub else p.parent.name or p.stem,
                                 hf_id=hub, where=str(p))
    short = _lookup(str(name))
    if short is None:
        raise InputError(f"unknown model '{name}'; use a catalog name ({', '.join(list_models())}), "
                         f"a Hugging Face id from that catalog, or a path to a config.json")
    row = _catalog()[short]
    path = profiles_path(row["config"])
    return model_from_config(_read_config(path), name=short, hf_id=row["hf_id"], where=f"profiles/{row['config']}",
                             published_params=float(row.get("published_params_b", 0)) * 1e9)
