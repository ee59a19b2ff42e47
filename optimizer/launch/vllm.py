"""vLLM's home: ``vllm serve`` for vLLM 0.33.0 (its flags: ``FLAGS`` below), and how ``kvtune tune`` starts
it and reads it back (``Vllm``).

What runs is what kvtune simulated: ``--max-num-seqs`` is the batch cap, ``--max-num-batched-tokens``
the per-step token budget with chunked prefill on (mixed prefill/decode steps, vLLM's V1 scheduler),
``--gpu-memory-utilization`` the same share of the whole GPU memory that kvtune's pool is carved
from (weights + activations + KV pool), prefix caching on or off as simulated, and
``--max-model-len`` sized so the pool passes vLLM's start-up check (context.py).
"""

from __future__ import annotations

import json
import re

from kvtune.optimizer.server_http import Unreachable, get, get_json

from .context import vllm_max_model_len
from ..space import knob_argv
from .pick import NGRAM_MATCH_TOKENS, LaunchPick, Unsupported
from .serving import EngineHome, EngineKind, EnginePlan, EngineReport, ServeLine, served_models, set_flag, whole
from .versions import EngineVersion

__all__ = ["vllm_argv", "vllm_speculative_config", "vllm_quantization", "PORT", "VERSION", "FLAGS", "Vllm", "HOME"]

PORT = 8000          # vllm/entrypoints/common/cli_args.py default
MASTER_PORT = 29501  # vllm/config/parallel.py ParallelConfig.master_port default
# kvtune method -> vLLM 0.33.0 SpeculativeConfig.method (vllm/config/speculative.py SpeculativeMethod:
# ngram, draft_model, suffix, custom_class, eagle/eagle3/mtp..., ngram_gpu, dspark; medusa is gone)
_METHOD = {"eagle3": "eagle3", "eagle": "eagle", "mtp": "mtp", "ngram": "ngram", "draft": "draft_model"}
# kvtune KV dtype -> vLLM 0.33.0 --kv-cache-dtype (vllm/config/cache.py CacheDType); bf16 is "auto",
# the model's own dtype
_KV_DTYPE = {"fp8": "fp8", "fp16": "float16"}


def vllm_speculative_config(p: LaunchPick) -> dict | None:
    if not p.speculating:
        return None
    m = p.spec_method
    if m not in _METHOD:
        p.require_launchable("vllm")   # the capability table's reason (costmodel.engines.capabilities)
        raise Unsupported(f"speculative method {m!r} is not one vLLM 0.33.0 runs ({', '.join(sorted(_METHOD))})")
    sc: dict = {"method": _METHOD[m], "num_speculative_tokens": int(p.spec_k)}
    if m == "ngram":
        sc["prompt_lookup_min"] = sc["prompt_lookup_max"] = NGRAM_MATCH_TOKENS
    elif m == "mtp":
        p.require_mtp()     # vLLM loads the target's own MTP layers (SpeculativeConfig: model = target)
    else:                   # eagle3 and eagle heads and draft models are separate checkpoints
        sc["model"] = p.require_draft("vLLM")
    return sc


def vllm_quantization(p: LaunchPick) -> tuple[str, list[str], str]:
    """(checkpoint, extra flags, note) for the pick's weights (bf16, fp16: the model's own
    checkpoint, 2 bytes a weight either way; fp8; anything else is refused by ``require_launchable``)."""
    p.require_launchable("vllm")
    if p.weights != "fp8":
        return p.model, [], ""
    ckpt = p.checkpoint("any")
    if ckpt:
        return ckpt, [], (f"FP8 weights: the FP8 checkpoint {ckpt} (vLLM reads its quantization_config; "
                          f"no --quantization flag)")
    # vLLM 0.33.0: --quantization fp8 refuses a bf16 checkpoint (quantization/fp8.py); the online
    # shorthand fp8_per_tensor quantizes bf16 weights while loading (quantization/online/base.py)
    return p.model, ["--quantization", "fp8_per_tensor"], \
        "FP8 weights: online quantization of the bf16 checkpoint while loading (--quantization fp8_per_tensor)"


def _parallel(p: LaunchPick) -> list[str]:
    out = []
    if p.dp_attention:
        if not p.is_moe:
            raise Unsupported("DP attention: vLLM 0.33.0 data parallelism of a dense model is plain replicas, "
                              "not the attention-DP kvtune simulated")
        # attention data-parallel over the replica's ranks, experts expert-parallel over all of them
        out += ["--tensor-parallel-size", "1", "--data-parallel-size", str(p.tp)]
        ep_world = p.tp
    else:
        out += ["--tensor-parallel-size", str(p.tp)]
        ep_world = p.tp
    if p.pp > 1:
        out += ["--pipeline-parallel-size", str(p.pp)]
    if p.ep > 1:
        if p.ep != ep_world:
            raise Unsupported(f"expert parallel size {p.ep}: vLLM 0.33.0 --enable-expert-parallel spreads experts "
                              f"over TP x DP = {ep_world} ranks, not {p.ep}")
        out.append("--enable-expert-parallel")
    return out


def vllm_argv(p: LaunchPick, node_rank: str | None = None, master_addr: str | None = None,
              nnodes: str | None = None, role: str = "serve") -> tuple[list[str], list[str]]:
    """(argv, notes). With ``node_rank`` etc. given, the multi-node (mp backend) form: rank 0 serves,
    the others run ``--headless`` (vllm/entrypoints/cli/serve.py run_headless). ``role``: 'serve'
    (aggregated), 'prefill' or 'decode' (a disaggregated pool; sizes ``--max-model-len``)."""
    ckpt, qflags, qnote = vllm_quantization(p)
    sc = vllm_speculative_config(p)
    ctx = vllm_max_model_len(p, role)
    argv = ["vllm", "serve", ckpt, *_parallel(p)]
    if ctx.value is not None:
        argv += ["--max-model-len", str(ctx.value)]
    argv += ["--max-num-seqs", str(p.batch_cap),
            "--max-num-batched-tokens", str(p.chunk_tokens), "--enable-chunked-prefill",
            "--kv-cache-dtype", _KV_DTYPE.get(p.kv_dtype, "auto"),
            "--gpu-memory-utilization", f"{p.gpu_mem_util:g}", *qflags]
    if sc is not None:
        argv += ["--speculative-config", json.dumps(sc, separators=(",", ":"))]
    argv.append("--enable-prefix-caching" if p.prefix_caching else "--no-enable-prefix-caching")
    if node_rank is not None:
        argv += ["--nnodes", nnodes or str(p.nodes), "--node-rank", node_rank,
                 "--master-addr", master_addr or "<leader-address>", "--master-port", str(MASTER_PORT)]
        if node_rank != "0":
            argv.append("--headless")
    argv += knob_argv(KNOB_FLAGS, p.knob_values)
    argv += ["--host", "0.0.0.0", "--port", str(PORT)]
    notes = ([qnote] if qnote else []) + ([ctx.note] if ctx.note else [])
    return argv, notes


# ---- the release this launch line was read from, and where it defines each flag ----
_V = "vllm/engine/arg_utils.py EngineArgs.add_cli_args"
VERSION = EngineVersion(
    "vllm", "vLLM", "0.33.0",
    "vllm 0.33.0 wheel (PyPI; _version.py commit g4ba787ec9): vllm/engine/arg_utils.py, "
    "vllm/config/speculative.py, vllm/config/parallel.py, vllm/config/cache.py, "
    "vllm/entrypoints/common/cli_args.py, vllm/model_executor/layers/quantization/__init__.py",
    "vllm/vllm-openai:v0.33.0")
FLAGS: dict[str, str] = {
    "--tensor-parallel-size": f"{_V}, ParallelConfig group",
    "--pipeline-parallel-size": f"{_V}, ParallelConfig group",
    "--data-parallel-size": f"{_V}, ParallelConfig group",
    "--enable-expert-parallel": f"{_V}, ParallelConfig group",
    "--nnodes": f"{_V}, ParallelConfig group (ParallelConfig.nnodes: multi-node with the mp backend)",
    "--node-rank": f"{_V}, ParallelConfig group",
    "--master-addr": f"{_V}, ParallelConfig group",
    "--master-port": f"{_V}, ParallelConfig group",
    "--headless": "vllm/entrypoints/common/cli_args.py (serve --headless: workers of node_rank > 0, cli/serve.py run_headless)",
    "--max-model-len": f"{_V}, ModelConfig group (checked against the KV pool at start-up: "
                       "v1/core/kv_cache_planning.py check_enough_kv_cache_memory)",
    "--max-num-seqs": f"{_V}, SchedulerConfig group",
    "--max-num-batched-tokens": f"{_V}, SchedulerConfig group",
    "--enable-chunked-prefill": f"{_V}, SchedulerConfig group",
    "--kv-cache-dtype": f"{_V}, CacheConfig group; values vllm/config/cache.py CacheDType",
    "--gpu-memory-utilization": f"{_V}, CacheConfig group",
    "--enable-prefix-caching": f"{_V}, CacheConfig group (BooleanOptionalAction)",
    "--no-enable-prefix-caching": f"{_V}, CacheConfig group (BooleanOptionalAction)",
    "--quantization": f"{_V}, ModelConfig group; fp8_per_tensor: quantization/__init__.py online shorthands "
                      "(fp8 itself refuses online quantization: quantization/fp8.py Fp8Config)",
    "--speculative-config": f"{_V}, VllmConfig group; keys vllm/config/speculative.py SpeculativeConfig",
    "--kv-transfer-config": f"{_V}, VllmConfig group; keys vllm/config/kv_transfer.py KVTransferConfig "
                            "(kv_connector NixlConnector: kv_connector/factory.py; kv_role kv_both)",
    "--host": "vllm/entrypoints/common/cli_args.py (host)",
    "--port": "vllm/entrypoints/common/cli_args.py (port, default 8000)",
}

# optimizer.space's knobs vLLM sets: knob -> (its flag, where this release defines it); none of the
# shipped axes yet. Its flags join FLAGS, its launch line sets them (space.knob_argv)
KNOB_FLAGS: dict[str, tuple[str, str]] = {}
FLAGS |= dict(KNOB_FLAGS.values())


# ---- kvtune tune: how it starts this engine and reads it back (optimizer.adapters) ----
class Vllm(EngineKind):
    name, label, default_binary = "vllm", "vLLM", "vllm"
    probe, probe_rank = ("/version", "version"), 1   # a route other servers may answer too: tried last

    def busy(self, root, timeout_s=5.0):
        try:
            st, _, body = get(root, "/metrics", timeout_s)
        except Unreachable:
            return None
        if st != 200:
            return None
        # vllm/v1/metrics/loggers.py: gauges vllm:num_requests_running and vllm:num_requests_waiting
        vals = re.findall(r"^vllm:num_requests_(?:running|waiting)\{[^}]*\}\s+([0-9.eE+-]+)",
                          body.decode("utf-8", "replace"), re.M)
        return any(float(v) > 0 for v in vals) if vals else None

    def plan(self, pick, *, binary, model, host, port, threads):
        argv, notes = vllm_argv(pick)
        argv = [binary] + argv[1:]
        if model:
            argv[2] = model                                  # vllm serve MODEL
        argv = set_flag(set_flag(argv, "--host", host), "--port", str(port))
        return EnginePlan(self.name, tuple(argv), pick.batch_cap, pick.chunk_tokens, None, None, argv[2], tuple(notes))

    def read_back(self, root, log_text="", timeout_s=5.0):
        st, v = get_json(root, "/version", timeout_s)
        pool = None
        try:
            st_m, _, body = get(root, "/metrics", timeout_s)
        except Unreachable:
            st_m, body = 0, b""
        if st_m == 200:
            m = re.search(r"^vllm:cache_config_info\{([^}]*)\}", body.decode("utf-8", "replace"), re.M)
            if m:
                labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
                blocks, size = whole(labels.get("num_gpu_blocks")), whole(labels.get("block_size"))
                pool = whole(labels.get("kv_cache_size_tokens")) or (blocks * size if blocks and size else None)
        models = served_models(root, timeout_s)
        return EngineReport(engine=self.name, version=str(v.get("version", "")) if isinstance(v, dict) else "",
                            served_model=models[0] if models else "", pool_tokens=pool)


def serve_line(p: LaunchPick, node_rank: str | None = None, addr: str | None = None, nnodes: str | None = None,
               config_dir: str | None = None) -> ServeLine:
    """``vllm serve`` for ``p`` (``EngineHome.serve_line``)."""
    return ServeLine(*vllm_argv(p, node_rank, addr, nnodes))


HOME = EngineHome("vllm", VERSION, FLAGS, serve_line, knob_flags=KNOB_FLAGS, worker_flags="--node-rank r --headless", adapter=Vllm())
