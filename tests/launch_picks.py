"""A hand-written pick and memory plan the launch tests share (tests/engines/test_launch_units.py,
tests/engines/test_launch_units.py): an 80 GB GPU at gpu_mem_util 0.9 (72 GB), weights 8 GB per GPU, an
activation reserve of 2 GB, a KV pool of 62 GB per GPU holding 10,050 tokens (engines/test_launch_units.py's
docstring derives each engine's block rounding of it)."""

from __future__ import annotations

from kvtune.optimizer.launch import LaunchPick, MemoryFacts

M = "meta-llama/Llama-3.1-8B-Instruct"
POOL = 10_050
MEM = MemoryFacts(gpu_memory_bytes=80e9, weight_bytes_total=16e9, weight_bytes_per_gpu=8e9,
                  activation_reserve_bytes=2e9, kv_bytes_per_token_per_gpu=62e9 / POOL, kv_pool_bytes_per_gpu=62e9,
                  kv_pool_tokens=POOL, kv_pool_tokens_per_gpu=POOL)


def pick(**kw) -> LaunchPick:
    base = dict(model=M, tp=2, batch_cap=64, chunk_tokens=2048, gpu_mem_util=0.9, memory=MEM, max_request_tokens=5000,
                max_prompt_tokens=4000, model_context_tokens=131072, gated=True)
    return LaunchPick(**{**base, **kw})


def flag(argv, name):
    """The value after ``name`` in an argv."""
    return argv[argv.index(name) + 1]
