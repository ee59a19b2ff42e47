"""``kvtune estimate``: memory plan and decode-step sweep for one configuration."""

from __future__ import annotations

import click

from costmodel import SpecConfig, estimate, get_gpu, get_model
from costmodel.calibration import efficiency_for

from ._common import dumps, echo_table, parse_int_list


@click.command("estimate")
@click.option("--model", required=True, help="Catalog name, Hugging Face id, or path to config.json.")
@click.option("--gpu", default="h100-sxm", show_default=True)
@click.option("--tp", type=int, default=1, show_default=True, help="Tensor-parallel size (GPUs per replica).")
@click.option("--context", type=int, default=4096, show_default=True, help="Tokens of context per sequence.")
@click.option("--batch", "batch", default="1,8,32,64,128,256", show_default=True, help="Comma-separated batch sizes.")
@click.option("--weight-dtype", type=click.Choice(["bf16", "fp8"]), default="bf16", show_default=True)
@click.option("--kv-dtype", type=click.Choice(["bf16", "fp8"]), default="bf16", show_default=True)
@click.option("--mode", type=click.Choice(["ideal", "calibrated"]), default="calibrated", show_default=True)
@click.option("--calibration", default=None, help="Calibration file or shipped name (calibrated mode).")
@click.option("--engine", type=click.Choice(["vllm", "sglang", "trtllm"]), default=None,
              help="Pick the shipped calibration fitted for this engine.")
@click.option("--gpu-mem-util", type=float, default=0.9, show_default=True)
@click.option("--spec-k", type=int, default=0, show_default=True, help="Speculative draft length (0 = off).")
@click.option("--spec-alpha", type=float, default=0.8, show_default=True, help="Per-token draft acceptance.")
@click.option("--spec-draft-cost", type=float, default=0.05, show_default=True,
              help="One draft pass as a fraction of a target pass.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def estimate_cmd(model, gpu, tp, context, batch, weight_dtype, kv_dtype, mode, calibration, engine,
                 gpu_mem_util, spec_k, spec_alpha, spec_draft_cost, as_json):
    """What a decode step costs, how many sequences fit and the tokens per second."""
    batches = parse_int_list(batch, "batch")
    m, g = get_model(model), get_gpu(gpu)
    eff = efficiency_for(mode, g.name, calibration, engine)
    spec = SpecConfig(spec_k, spec_alpha, spec_draft_cost) if spec_k else None
    est = estimate(m, g, tp, context, batches, weight_dtype, kv_dtype, eff, gpu_mem_util, spec, mode)
    if as_json:
        click.echo(dumps(est.to_dict()))
        return
    click.echo(f"{m.name} on {tp} x {g.name}  weights {weight_dtype}  KV {kv_dtype}  context {context} tokens  [{est.source}]")
    click.echo(f"  weights {est.weight_bytes / 1e9:.1f} GB ({est.weight_bytes_per_gpu / 1e9:.1f} GB/GPU)   "
               f"KV {est.kv_bytes_per_token:,.0f} bytes/token   pool {est.kv_pool_tokens:,} tokens   "
               f"max batch at {context}: {est.max_batch}")
    click.echo(f"  throughput ceiling {est.ceiling_tok_s:,.0f} tok/s (bandwidth / (context x KV bytes))   "
               f"single-user {est.single_user_tok_s:,.1f} tok/s (bandwidth / weights)")
    rows = [[r.batch, f"{r.decode_step_ms:.2f}", f"{r.tokens_per_step:.2f}", f"{r.tok_s_per_user:,.1f}",
             f"{r.tok_s_total:,.0f}", r.bound, "yes" if r.fits else "NO"] for r in est.rows]
    echo_table(["batch", "step_ms", "tok/step", "tok_s_per_user", "tok_s_total", "bound", "fits_pool"], rows)


COMMANDS = [estimate_cmd]
