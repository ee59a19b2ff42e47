"""The search space cut to what the workload's engine can launch (``costmodel.engines.capabilities``).

``for_engine`` runs once per workload, as it is read (``optimizer.workload``), with the engine the
solve will launch: the workload's ``engine:`` or ``--engine``, vLLM's row when neither names one
(vLLM's launch line is the one printed then). Two kinds of answer:

- an explicit request the engine cannot launch (the weights, the speculative method, its draft,
  a single KV dtype, TP size or deployment kind) is one error naming the key, the value and why;
- a search over options (a list of KV dtypes, TP sizes or deployment kinds, or the defaults) keeps
  the options the engine can launch and drops the rest, and ``WorkloadSpec.notes`` says which
  and why (solve prints the notes and writes them to the JSON).

Model facts decide too: ``mtp`` needs the model's own multi-token-prediction heads; an EAGLE head
or draft model resolves to a real checkpoint (``costmodel.checkpoints``) or the workload is refused;
TensorRT-LLM's FP8 weights need a published ModelOpt checkpoint. A workload's own ``checkpoint:``
(``optimizer.user_checkpoint``) replaces the catalog's: a GGUF one needs llama.cpp, TensorRT-LLM's
FP8 a ModelOpt folder, whose KV format (kv_cache_quant_algo) TensorRT-LLM then runs.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

from kvtune.costmodel.checkpoints import resolve_draft, resolve_weights
from kvtune.costmodel.engines import capabilities_for
from kvtune.costmodel.engines.capabilities import Capabilities
from kvtune.costmodel.errors import InputError, KvtuneError
from kvtune.costmodel.models import ModelArch

from .workload_spec import WorkloadSpec

__all__ = ["for_engine"]

Bad = Callable[[str, Any, str], KvtuneError]   # (key, value, why) -> the workload reader's one-line error
BadKey = Callable[[str, str], KvtuneError]     # (key, why): the same for a key that is missing


def _who(caps: Capabilities, named: bool) -> str:
    return "" if named else f" ({caps.label} is the engine when none is named: set engine: to choose another)"


def _weights(spec: WorkloadSpec, arch: ModelArch, caps: Capabilities, named: bool, bad: Bad) -> None:
    if spec.checkpoint is not None:   # the more precise reason first: what the named checkpoint is
        _checkpoint(spec, caps, named, bad)
    err = caps.weights_error(spec.weights)
    if err:
        hint = "; llama.cpp (engine: llamacpp) loads GGUF" if caps.loader != "gguf" else ""
        raise bad("weights", spec.weights, err + hint + _who(caps, named))
    if spec.checkpoint is not None:
        return
    if spec.weights == "fp8" and caps.loader == "modelopt" \
            and resolve_weights(arch.hf_id or arch.name, "fp8", "modelopt") is None:
        raise bad("weights", spec.weights, f"{caps.label} loads FP8 weights from a pre-quantized ModelOpt checkpoint "
                                           f"and kvtune's catalog knows none for {arch.name}: quantize it with "
                                           f"NVIDIA ModelOpt and name that folder in checkpoint:, or choose "
                                           f"another engine")


def _checkpoint(spec: WorkloadSpec, caps: Capabilities, named: bool, bad: Bad) -> None:
    """The workload's checkpoint: against the engine: a GGUF file or repository loads on llama.cpp
    only; TensorRT-LLM takes FP8 weights from a ModelOpt checkpoint only (hf_quant_config.json), not
    from a config.json quantization_config nor by quantizing bf16 while loading."""
    ck = spec.checkpoint
    assert ck is not None
    if ck.gguf and caps.loader != "gguf":
        raise bad(ck.key, ck.given, "a GGUF checkpoint, and kvtune launches GGUF on llama.cpp only "
                                          "(engine: llamacpp)" + _who(caps, named))
    if spec.weights == "fp8" and caps.loader == "modelopt" and not ck.holds("fp8", "modelopt"):
        d = ck.declared
        held = f"{d.declared} in {d.source}" if d is not None else "not read"
        raise bad(ck.key, ck.given, f"{caps.label} loads FP8 weights from a pre-quantized ModelOpt checkpoint "
                                          f"(hf_quant_config.json), and this one declares {held}: quantize it with "
                                          f"NVIDIA ModelOpt and serve that folder, or choose another engine")


def _checkpoint_kv(spec: WorkloadSpec, caps: Capabilities) -> Callable[[str], str | None]:
    """The KV-dtype refusal with the checkpoint's own KV format: TensorRT-LLM's kv_cache_config dtype
    auto (what kvtune writes for bf16 KV) takes a ModelOpt checkpoint's kv_cache_quant_algo, so only
    that format is launched as simulated."""
    ck = spec.checkpoint
    kv = ck.declared.kv if ck is not None and ck.declared is not None else ""
    if not kv or caps.engine != "trtllm":
        return caps.kv_error

    def error(k: str) -> str | None:
        if k != kv:
            return (f"the checkpoint's hf_quant_config.json sets kv_cache_quant_algo {kv.upper()}, which "
                    f"{caps.label} runs whenever kv_cache_config dtype is auto, so {k} KV is not what it would run")
        return caps.kv_error(k)
    return error


def _speculative(spec: WorkloadSpec, arch: ModelArch, caps: Capabilities, named: bool, bad: Bad, bad_key: BadKey,
                 notes: list[str]):
    s = spec.speculative
    if s is None or spec.search.spec_k[1] == 0:
        return s
    err = caps.spec_error(s.method)
    if err:
        raise bad("speculative.method", s.method, err + _who(caps, named))
    if s.method == "mtp" and not arch.n_mtp_layers:
        raise bad("speculative.method", s.method,
                  f"{arch.name} has no multi-token-prediction heads (config.json num_nextn_predict_layers is 0): "
                  f"mtp drafts with the model's own heads; use eagle3, draft or ngram")
    try:
        ckpt = resolve_draft(s.method, s.draft_model, arch)
    except InputError as exc:
        msg = str(exc).split(": ", 1)[-1] if str(exc).startswith("speculative.draft_model") else str(exc)
        if s.draft_model is None:
            raise bad_key("speculative.draft_model", "missing: " + msg) from None
        raise bad("speculative.draft_model", s.draft_model, msg) from None
    if ckpt is not None and not s.draft_model:
        notes.append(f"speculative.draft_model: not given; drafting with {ckpt.id}, the published "
                     f"{s.method} head for {arch.name} ({ckpt.source})")
        return dataclasses.replace(s, draft_model=ckpt.id)
    return s


def _cut(key: str, values: tuple, given: Mapping[str, Any], error: Callable[[Any], str | None], bad: Bad,
         notes: list[str], suffix: str) -> tuple:
    """``values`` less those ``error`` refuses: all refused is an error; some, a note."""
    keep = tuple(v for v in values if error(v) is None)
    dropped = [v for v in values if error(v) is not None]
    if not dropped:
        return values
    why = error(dropped[0]) or ""
    if not keep:
        raise bad(f"search.{key}", given.get(key, list(values)), why + suffix)
    shown = ", ".join(str(v) for v in dropped)
    src = "search." + key if key in given else f"search.{key} (default)"
    notes.append(f"{src}: {shown} not searched: {why}")
    return keep


def for_engine(spec: WorkloadSpec, arch: ModelArch, given_search: Mapping[str, Any] | None, bad: Bad,
               bad_key: BadKey) -> WorkloadSpec:
    """``spec`` with its search space cut to what ``spec.engine`` (vLLM when None) can launch and
    its speculative draft resolved; ``bad``/``bad_key`` make the reader's one-line errors. See the
    module docstring for what is refused and what is dropped with a note."""
    caps = capabilities_for(spec.engine)
    named = spec.engine is not None
    given = given_search if isinstance(given_search, Mapping) else {}
    suffix = _who(caps, named)
    notes: list[str] = list(spec.notes)
    _weights(spec, arch, caps, named, bad)
    speculative = _speculative(spec, arch, caps, named, bad, bad_key, notes)
    s = spec.search
    gpn = spec.hardware.gpus_per_node
    kv = _cut("kv_dtype", s.kv_dtype, given, _checkpoint_kv(spec, caps), bad, notes, suffix)
    tp = _cut("tp", s.tp, given, lambda t: caps.replica_error(t, gpn), bad, notes, suffix)
    kinds = _cut("deployment", s.deployment, given, caps.deployment_error, bad, notes, suffix)
    search = dataclasses.replace(s, kv_dtype=kv, tp=tp, deployment=kinds)
    return dataclasses.replace(spec, search=search, speculative=speculative, notes=tuple(notes))
