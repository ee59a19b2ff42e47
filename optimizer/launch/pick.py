"""What the launch generators need to know about one recommended deployment, read once.

``LaunchPick`` is the recommendation's knobs (TP, batch cap, chunk budget, KV dtype, draft length,
weights) plus the multi-node fields the cost model may add (``pp``, ``ep``, ``dp_attention``,
``nodes_per_replica``, ``gpus_per_node``), the model's facts the engines care about (MTP heads, MoE,
gated on Hugging Face) and the memory kvtune planned per GPU. A generator that cannot run the pick
raises ``Unsupported`` with the reason; ``launch_settings`` prints the reason instead of a command.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvtune.costmodel.checkpoints import Checkpoint, native_format, resolve_draft, resolve_weights
from kvtune.costmodel.engines import CAPABILITIES
from kvtune.costmodel.errors import InputError, KvtuneError
from kvtune.costmodel.memory import GPU_MEM_UTIL, plan_memory
from kvtune.costmodel.step import SPEC_METHOD

from .. import space
from ..user_checkpoint import UserCheckpoint
from kvtune.costmodel.draft import draft_footprint
from kvtune.costmodel.parallel import Parallel

__all__ = ["LaunchPick", "MemoryFacts", "Unsupported", "SPEC_METHODS", "NGRAM_MATCH_TOKENS",
           "model_reference", "fp8_checkpoint", "build_pick", "native_fp8", "draft_reference",
           "local_folder"]

# speculative.method values kvtune's launch knows (optimizer/workload.py SpeculativeSpec lists them)
SPEC_METHODS = ("eagle3", "eagle", "medusa", "mtp", "ngram", "draft")
# n-gram lookup length set explicitly on every engine: vLLM 0.33.0's own default
# (vllm/config/speculative.py: prompt_lookup_min = prompt_lookup_max = 5 when neither is given)
NGRAM_MATCH_TOKENS = 5
PLACEHOLDER = "<hf-org/model-or-local-folder>"

# Hugging Face organisations whose models need the licence accepted and a token (gated repositories)
_GATED_ORGS = ("meta-llama/", "mistralai/", "google/")


class Unsupported(Exception):
    """The engine (at the targeted version) cannot run this pick as kvtune simulated it."""


@dataclass(frozen=True)
class MemoryFacts:
    """Per-GPU memory kvtune planned (decimal bytes, costmodel.memory.plan_memory)."""

    gpu_memory_bytes: float
    weight_bytes_total: float
    weight_bytes_per_gpu: float
    activation_reserve_bytes: float
    kv_bytes_per_token_per_gpu: float
    kv_pool_bytes_per_gpu: float
    kv_pool_tokens: int                 # per replica (under DP attention: every GPU's own pool, summed)
    kv_pool_tokens_per_gpu: int         # tokens one GPU's pool holds (= per replica without DP attention)
    # the speculative drafter resident beside the model (costmodel.draft); "" and 0 without one
    draft: str = ""
    draft_weight_bytes_per_gpu: float = 0.0
    draft_kv_bytes_per_token_per_gpu: float = 0.0

    def to_json(self) -> dict:
        # the draft's keys only where there is one (speculation on): a plan without one reads as before
        draft = {"draft": self.draft, "draft_weight_bytes_per_gpu": self.draft_weight_bytes_per_gpu,
                 "draft_kv_bytes_per_token_per_gpu": self.draft_kv_bytes_per_token_per_gpu} if self.draft else {}
        return {"gpu_memory_bytes": self.gpu_memory_bytes, "weight_bytes_total": self.weight_bytes_total,
                "weight_bytes_per_gpu": self.weight_bytes_per_gpu,
                "activation_reserve_bytes": self.activation_reserve_bytes,
                "kv_bytes_per_token_per_gpu": self.kv_bytes_per_token_per_gpu,
                "kv_pool_bytes_per_gpu": self.kv_pool_bytes_per_gpu, "kv_pool_tokens": self.kv_pool_tokens,
                "kv_pool_tokens_per_gpu": self.kv_pool_tokens_per_gpu, **draft}


@dataclass(frozen=True, kw_only=True)
class LaunchPick:
    model: str                          # HF id (or folder) the engine loads for bf16 weights
    model_note: str = ""                # why ``model`` is a placeholder, if it is
    tp: int
    batch_cap: int
    chunk_tokens: int
    kv_dtype: str = "bf16"
    weights: str = "bf16"
    spec_k: int = 0
    spec_method: str | None = None
    draft_model: str | None = None      # the draft checkpoint to load (costmodel.checkpoints.resolve_draft)
    draft_error: str = ""               # why there is none to load, when speculation needs one
    draft_note: str = ""                # where draft_model came from, when not as the workload gave it
    prefix_caching: bool = True
    gpu_mem_util: float = GPU_MEM_UTIL
    replicas: int = 1
    pp: int = 1
    ep: int = 1                         # expert-parallel size; > 1 turns expert parallelism on
    dp_attention: bool = False
    nodes_per_replica: int = 1
    gpus_per_node: int = 8
    mtp_layers: int = 0                 # the model's own MTP heads (config.json num_nextn_predict_layers)
    is_moe: bool = False
    gated: bool = False
    memory: MemoryFacts | None = None
    max_request_tokens: int | None = None   # the longest prompt + output kvtune simulated, when known
    max_prompt_tokens: int | None = None    # the longest prompt kvtune simulated, when known
    model_context_tokens: int = 0           # the model's own longest sequence (config.json); 0: not stated
    notes: tuple[str, ...] = field(default=())
    # the workload's checkpoint: (optimizer.user_checkpoint); ``model`` is then its id
    user_checkpoint: UserCheckpoint | None = None
    knobs: tuple[tuple[str, Any], ...] = ()     # optimizer.space's knobs of the config, (name, value)

    @property
    def knob_values(self) -> dict[str, Any]:
        return dict(self.knobs)

    @property
    def speculating(self) -> bool:
        return bool(self.spec_k) and self.spec_method is not None

    @property
    def gpus_per_replica(self) -> int:
        return self.tp * self.pp

    @property
    def multi_node(self) -> bool:
        return self.nodes_per_replica > 1 or self.gpus_per_replica > self.gpus_per_node

    @property
    def nodes(self) -> int:
        """Nodes one replica spans."""
        return max(self.nodes_per_replica, math.ceil(self.gpus_per_replica / self.gpus_per_node))

    @property
    def gpus_per_pod(self) -> int:
        return self.gpus_per_replica // self.nodes

    def require_draft(self, engine: str) -> str:
        if self.draft_error:
            raise Unsupported(self.draft_error)
        if not self.draft_model:
            raise Unsupported(f"speculative method {self.spec_method!r} needs its draft model: set "
                              f"speculative.draft_model in the workload ({engine} loads it separately)")
        return self.draft_model

    def require_launchable(self, engine: str) -> None:
        """``Unsupported`` with the capability table's reason (``costmodel.engines.capabilities``)
        when ``engine``'s version cannot launch these weights, this KV dtype or this speculation."""
        caps = CAPABILITIES[engine]
        ck = self.user_checkpoint
        if ck is not None and ck.gguf and caps.loader != "gguf":
            raise Unsupported(f"the workload's checkpoint {ck.load.id} is GGUF, which kvtune launches on llama.cpp only")
        why = caps.weights_error(self.weights) or caps.kv_error(self.kv_dtype) \
            or (caps.spec_error(self.spec_method) if self.speculating and self.spec_method else None)
        if why:
            raise Unsupported(why)

    def require_mtp(self) -> None:
        if self.mtp_layers < 1:
            raise Unsupported("speculative method 'mtp' needs a model with multi-token-prediction heads "
                              "(config.json num_nextn_predict_layers, e.g. DeepSeek-V3); this model has none")

    def checkpoint(self, kind: str = "any") -> str:
        """The checkpoint to load: for FP8 weights the published FP8 one (``kind`` 'modelopt' for
        TensorRT-LLM), else the model itself; '' when no FP8 checkpoint is known."""
        if self.weights != "fp8":
            return self.model
        if self.user_checkpoint is not None:   # the workload's own: loaded as it is, or quantized while loading
            return self.model if self.user_checkpoint.holds("fp8", kind) else ""
        return fp8_checkpoint(self.model, kind)

    def weights_checkpoint(self, engine: str) -> Checkpoint | None:
        """What ``engine`` loads for these weights (``costmodel.checkpoints.resolve_weights``; the
        workload's GGUF checkpoint as it is)."""
        ck = self.user_checkpoint
        if ck is not None and ck.gguf:
            return ck.load if ck.load.weights == self.weights else None
        return resolve_weights(self.model, self.weights, CAPABILITIES[engine].loader)


def fp8_checkpoint(model: str, kind: str = "any") -> str:
    """The published FP8 checkpoint of ``model`` (``kind`` 'modelopt': a ModelOpt one), '' if none."""
    c = resolve_weights(model, "fp8", "modelopt" if kind == "modelopt" else "hf")
    return c.id if c is not None else ""


def native_fp8(model: str) -> bool:
    """Whether ``model`` is published in FP8 only (no bf16 checkpoint exists: DeepSeek-V3)."""
    return native_format(model) == "fp8"


def _looks_like_hf_id(s) -> bool:
    if not isinstance(s, str) or s.count("/") != 1 or s.startswith((".", "/", "~")):
        return False
    org, name = s.split("/")
    return bool(org) and bool(name) and " " not in s


def model_reference(model_arg: str, hf_id: str = "") -> tuple[str, str]:
    """(what to launch, note). A catalog model launches its HF id; a config.json path launches the
    HF id the config names (``_name_or_path``), else a placeholder and a note saying so."""
    if hf_id:
        return hf_id, ""
    p = Path(model_arg)
    if p.suffix == ".json" or p.is_dir() or p.exists():
        cfg_path = p / "config.json" if p.is_dir() else p
        try:
            named = json.loads(cfg_path.read_text()).get("_name_or_path")
        except (OSError, ValueError, AttributeError):
            named = None
        if _looks_like_hf_id(named):
            return named, f"model given as {model_arg}: launching {named}, the id its config.json names"
        return PLACEHOLDER, (f"model given as {model_arg} (a config.json): replace {PLACEHOLDER} with the "
                             f"Hugging Face id or the folder holding the weights")
    return model_arg, ""


def draft_reference(method: str | None, draft_model: str | None, arch) -> tuple[str | None, str, str]:
    """(the draft checkpoint to load, why there is none, where it came from) for ``method``: a
    catalog name becomes its Hugging Face id, a config.json the id it names (``model_reference``),
    a missing EAGLE head the catalog's published one (``costmodel.checkpoints.resolve_draft``)."""
    if not method or arch is None:
        return draft_model, "", ""
    try:
        c = resolve_draft(method, draft_model, arch)
    except InputError as exc:
        return None, str(exc), ""
    if c is None:
        return None, "", ""
    ref, note = model_reference(c.id)
    if ref == PLACEHOLDER:
        return None, f"speculative.draft_model {draft_model!r}: {note}", ""
    if draft_model and ref == draft_model:
        return ref, "", ""
    return ref, "", (f"draft: {ref}" + (f" ({c.source})" if c.source else "") + (f"; {note}" if note else ""))


def local_folder(ckpt: str, platform: str) -> None:
    """``Unsupported`` when ``ckpt`` is a path on this machine: ``platform`` pulls the model by its
    Hub id (``hf://``), and a folder here is not in its pods."""
    if ckpt.startswith(("/", ".", "~")):
        raise Unsupported(f"the checkpoint {ckpt} is a folder on this machine, and {platform} pulls the model "
                          f"from the Hugging Face Hub (hf://): upload it and set checkpoint: to its Hub id")


def gated(model: str) -> bool:
    return model.startswith(_GATED_ORGS)


def _memory(arch, gpu, cfg: dict, weights: str, kv_dtype: str, gpu_mem_util: float,
            reserve_bytes: float, speculative: dict | None) -> MemoryFacts | None:
    """The plan the simulator used: with speculation (``speculative``: {method, draft_model}) its
    drafter's weights and KV too (costmodel.draft)."""
    if arch is None or gpu is None:
        return None
    tp = int(cfg["tp"])
    try:
        par = Parallel(tp=tp, pp=int(cfg.get("pp", 1)), ep=int(cfg.get("ep", 1)),
                       dp_attention=bool(cfg.get("dp_attention", False)),
                       gpus_per_node=int(cfg.get("gpus_per_node", 8)))
        draft = (draft_footprint(speculative.get("method") or SPEC_METHOD, arch, weights,
                                 speculative.get("draft_model"))
                 if speculative and int(cfg.get("spec_k") or 0) else None)
        plan = plan_memory(arch, gpu, tp, weights, kv_dtype, gpu_mem_util, reserve_bytes, par, draft)
    except KvtuneError:
        return None
    return MemoryFacts(gpu.memory_bytes, plan.weight_bytes, plan.weight_bytes_per_gpu, reserve_bytes,
                       plan.kv_bytes_per_token_per_gpu, plan.kv_pool_bytes_per_gpu, plan.kv_pool_tokens,
                       int(plan.kv_pool_bytes_per_gpu // plan.pool_bytes_per_token_per_gpu),
                       plan.draft_name, plan.draft_weight_bytes_per_gpu, plan.draft_kv_bytes_per_token_per_gpu)


def build_pick(model: str, cfg: dict, replicas: int, gpu_mem_util: float, speculative: dict | None, *,
               arch=None, gpu=None, weights: str = "bf16", activation_reserve_bytes: float = 0.0,
               gpus_per_node: int = 8, prefix_caching: bool = True,
               max_request_tokens: int | None = None, max_prompt_tokens: int | None = None,
               checkpoint: UserCheckpoint | None = None) -> LaunchPick:
    """``cfg``: {tp, batch_cap, kv_dtype, spec_k, chunk_tokens} and optionally pp, ep, dp_attention,
    nodes_per_replica, gpus_per_node; ``speculative``: the workload's ``speculative:`` section ({method, draft_model}) or None; ``arch``/``gpu``: the
    costmodel records (for the memory plan and the model's facts); ``checkpoint``: the workload's
    ``checkpoint:``, which every engine then loads instead of ``model``."""
    if checkpoint is not None:
        ref, note = checkpoint.load.id, checkpoint.note()
    else:
        ref, note = model_reference(model, getattr(arch, "hf_id", "") if arch is not None else "")
    tp, pp = int(cfg["tp"]), int(cfg.get("pp", 1))
    gpn = int(cfg.get("gpus_per_node", gpus_per_node))
    spec_k = int(cfg.get("spec_k") or 0)
    method = speculative.get("method", SPEC_METHOD) if speculative else None
    draft, draft_error, draft_note = draft_reference(method if spec_k else None, (speculative or {}).get("draft_model"),
                                                     arch)
    return LaunchPick(
        model=ref, model_note=note, tp=tp, batch_cap=int(cfg["batch_cap"]), chunk_tokens=int(cfg["chunk_tokens"]),
        kv_dtype=str(cfg.get("kv_dtype", "bf16")), weights=weights, spec_k=spec_k if method else 0,
        spec_method=method if spec_k else None, draft_model=draft, draft_error=draft_error, draft_note=draft_note,
        prefix_caching=prefix_caching, gpu_mem_util=float(gpu_mem_util), replicas=int(replicas), pp=pp,
        ep=int(cfg.get("ep", 1)), dp_attention=bool(cfg.get("dp_attention", False)),
        nodes_per_replica=int(cfg.get("nodes_per_replica", 1)), gpus_per_node=gpn,
        mtp_layers=int(getattr(arch, "n_mtp_layers", 0) or 0) if arch is not None else 0,
        is_moe=bool(getattr(arch, "is_moe", False)), gated=gated(ref),
        memory=_memory(arch, gpu, dict(cfg, gpus_per_node=gpn), weights, str(cfg.get("kv_dtype", "bf16")),
                       float(gpu_mem_util), activation_reserve_bytes, speculative),
        max_request_tokens=max_request_tokens, max_prompt_tokens=max_prompt_tokens,
        model_context_tokens=int(getattr(arch, "max_context_tokens", 0) or 0) if arch is not None else 0,
        user_checkpoint=checkpoint, knobs=tuple((a.name, cfg[a.name]) for a in space.AXES if a.name in cfg))
