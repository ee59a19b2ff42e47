"""Multi-GPU, multi-node layouts for models that one node's TP group cannot hold.

When the weights need more GPUs than the largest ``search.tp`` offers (Llama-3.1-405B bf16 or
DeepSeek-V3 on H100), ``kvtune solve`` searches layouts instead of bare TP sizes: tensor parallel
sizes up to the hardware's GPUs (beyond one node: the all-reduce crosses the network), pipeline
stages, expert parallelism for MoE models and data-parallel attention for MLA models, each one
``costmodel.parallel.Parallel`` and one categorical choice (``layout``) in the search. A replica
gets the fewest GPUs that hold the weights, or twice that (more replicas of the smallest size is
how throughput grows after that). Models that fit in one node search exactly as before (no
``layout`` parameter).

The recommendation carries the layout under the names the launch generators read: ``pp``, ``ep``,
``dp_attention``, ``nodes_per_replica`` and ``gpus_per_node`` (``layout_params``).
"""

from __future__ import annotations

from typing import Mapping

import math

from kvtune.costmodel.memory import gpus_to_hold
from kvtune.costmodel.parallel import Parallel

__all__ = ["search_layouts", "layout_params", "gpus_per_replica", "layout_label"]


def layout_label(p: Parallel) -> str:
    return f"tp{p.tp}-pp{p.pp}-ep{p.ep}" + ("-dpattn" if p.dp_attention else "")


def gpus_per_replica(params: Mapping) -> int:
    """GPUs one replica of a trial's config occupies (TP x PP)."""
    return int(params["tp"]) * int(params.get("pp", 1))


def layout_params(params: Mapping, gpus_per_node: int) -> dict:
    """The parallelism a recommendation carries, defaults filled in, for the launch generators."""
    gpus = gpus_per_replica(params)
    return {"pp": int(params.get("pp", 1)), "ep": int(params.get("ep", 1)),
            "dp_attention": bool(params.get("dp_attention", False)),
            "nodes_per_replica": math.ceil(gpus / gpus_per_node), "gpus_per_node": int(gpus_per_node)}


def _powers(lo: int, hi: int) -> list[int]:
    return [1 << i for i in range(0, 16) if lo <= (1 << i) <= hi]


def search_layouts(model, gpu, weight_dtype: str, tp_choices, gpus_per_node: int, max_nodes: int,
                   gpu_mem_util: float, reserve_bytes: float) -> dict[str, dict]:
    """``{label: params}`` of the layouts to search, or ``{}`` when the largest TP in ``tp_choices``
    holds the weights (the search then stays on TP alone). ``params`` has ``tp``, ``pp``, ``ep``,
    ``dp_attention``. Only layouts within ``gpus_per_node x max_nodes`` GPUs; when none fits
    there, the smallest that holds the weights anyway (solve then answers infeasible, naming the
    node count it would need)."""
    usable = gpu.memory_bytes * gpu_mem_util
    need = gpus_to_hold(model, weight_dtype, usable, reserve_bytes)
    if need is None or need <= max(tp_choices):
        return {}
    max_gpus = gpus_per_node * max_nodes
    sizes = [g for g in (need, 2 * need) if g <= max_gpus] or [need]
    tps = sorted({*tp_choices, *_powers(gpus_per_node, max(sizes))})
    out: dict[str, dict] = {}
    for size in sizes:
        for tp in tps:
            if size % tp or model.tp_error(tp) or (tp > gpus_per_node and tp % gpus_per_node):
                continue
            pp = size // tp
            if pp > model.n_layers:
                continue
            variants = [Parallel(tp=tp, pp=pp, gpus_per_node=gpus_per_node)]
            if model.is_moe and tp > 1:
                variants.append(Parallel(tp=tp, pp=pp, ep=tp, gpus_per_node=gpus_per_node))
                if model.is_mla:
                    variants.append(Parallel(tp=tp, pp=pp, ep=tp, dp_attention=True, gpus_per_node=gpus_per_node))
            for v in variants:
                out[layout_label(v)] = {"tp": v.tp, "pp": v.pp, "ep": v.ep, "dp_attention": v.dp_attention}
    return out
