"""The small Llama-3.1-8B workload many optimizer tests solve: one class of 3,000-token prompts and
~200-token answers at 30 req/s on one 8 x H100 node at $2/GPU-h, TTFT 400 ms / TPOT 30 ms at 0.9.
Each test gives its own search space (and any other section) over it."""

from __future__ import annotations

from kvtune.optimizer.workload import WorkloadSpec, load_workload_dict

TINY_8B: dict = {
    "model": "llama-3.1-8b",
    "hardware": {"gpu": "h100-sxm", "gpus_per_node": 8, "usd_per_gpu_hour": 2.0, "max_nodes": 1},
    "workload": {"rate_req_s": 30, "classes": [{"name": "c", "share": 1.0, "input_tokens": 3000,
                                                "output_tokens": {"dist": "lognormal", "mean": 200, "sigma": 0.5,
                                                                  "max": 800}}]},
    "slo": {"ttft_ms": 400, "tpot_ms": 30, "attainment": 0.9},
    "objective": "min_cost",
}


def tiny_8b(search: dict, objective: str = "min_cost", **over) -> dict:
    """``TINY_8B`` with ``search`` and ``objective``, then ``over``'s sections replacing its own."""
    return {**TINY_8B, "objective": objective, "search": search, **over}


def tiny_8b_spec(search: dict, objective: str = "min_cost", **over) -> WorkloadSpec:
    return load_workload_dict(tiny_8b(search, objective, **over), "<test>")
