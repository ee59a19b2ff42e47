"""``kvtune estimate``: memory plan and decode-step sweep for one configuration."""

from __future__ import annotations

from dataclasses import replace

import click

from kvtune.costmodel import SpecConfig, estimate, get_model
from kvtune.costmodel.errors import InputError
from kvtune.costmodel.memory import GPU_MEM_UTIL
from kvtune.costmodel.draft import draft_footprint
from kvtune.costmodel.step import DRAFT_COST, SPEC_METHOD

from ._common import Choice, EngineChoice, echo_table, emit_json, json_option, parse_int_list


@click.command("estimate")
@click.option("--model", required=True, help="Catalog name, Hugging Face id, or path to config.json.")
@click.option("--gpu", default="h100-sxm", show_default=True)
@click.option("--tp", type=int, default=1, show_default=True, help="Tensor-parallel size (GPUs per replica).")
@click.option("--context", type=int, default=4096, show_default=True, help="Tokens of context per sequence.")
@click.option("--batch", "batch", default="1,8,32,64,128,256", show_default=True, metavar="INTEGER,...", help="Comma-separated batch sizes.")
@click.option("--weight-dtype", type=Choice(["bf16", "fp8"]), default="bf16", show_default=True)
@click.option("--kv-dtype", type=Choice(["bf16", "fp8"]), default="bf16", show_default=True)
@click.option("--mode", type=Choice(["ideal", "calibrated"]), default="calibrated", show_default=True)
@click.option("--calibration", default=None, help="Calibration file, shipped name or 'ideal' (calibrated mode).")
@click.option("--engine", type=EngineChoice(), default=None,
              help="Pick the shipped calibration fitted for this engine.")
@click.option("--profile", default=None,
              help="Measured profile table: its decode step times inside its range, the calibration outside.")
@click.option("--gpu-mem-util", type=float, default=GPU_MEM_UTIL, show_default=True)
@click.option("--spec-k", type=int, default=0, show_default=True, help="Speculative draft length (0 = off).")
@click.option("--spec-alpha", type=float, default=0.8, show_default=True, help="Per-token draft acceptance.")
@click.option("--spec-draft-cost", type=float, default=DRAFT_COST, show_default=True,
              help="One draft pass as a fraction of a target pass.")
@click.option("--spec-method", default=SPEC_METHOD, show_default=True,
              help="Speculative method (eagle3, eagle, mtp, draft, ngram): sizes the drafter's memory.")
@click.option("--spec-draft-model", default=None,
              help="The draft model of --spec-method draft (catalog name, Hugging Face id or config.json).")
@json_option()
def estimate_cmd(model, gpu, tp, context, batch, weight_dtype, kv_dtype, mode, calibration, engine, profile,
                 gpu_mem_util, spec_k, spec_alpha, spec_draft_cost, spec_method, spec_draft_model, as_json):
    """What a decode step costs, how many sequences fit and the tokens per second."""
    from kvtune.costmodel.hardware import resolve_gpu
    from kvtune.optimizer.step_factory import StepFactory

    batches = parse_int_list(batch, "batch")
    m, g = get_model(model), resolve_gpu(gpu)
    _check_flags(m, tp, context, gpu_mem_util, spec_k, spec_alpha, spec_draft_cost)
    em = StepFactory.build(g, mode, calibration, engine, profile)
    eff = em.efficiency
    mode = "ideal" if eff.name == "ideal" else mode
    speculation = None
    if spec_k:
        try:
            draft = draft_footprint(spec_method, m, weight_dtype, spec_draft_model)
        except InputError as exc:
            raise InputError(f"--spec-method {spec_method}: {exc}") from None
        speculation = SpecConfig(spec_k, spec_alpha, spec_draft_cost, spec_method, draft)
    est = estimate(m, g, tp, context, batches, weight_dtype, kv_dtype, eff, gpu_mem_util, speculation, mode)
    if profile:
        est = _measured_rows(est, em.step(m, tp, weight_dtype, kv_dtype, speculation, gpu_mem_util))
    rec = em.record()
    est = replace(est, source=rec["source"])
    if emit_json(as_json, {**est.to_dict(), **rec}):
        return
    click.echo(f"{m.name} on {tp} x {g.name}  weights {weight_dtype}  KV {kv_dtype}  context {context} tokens  [{est.source}]")
    click.echo(f"  weights {est.weight_bytes / 1e9:.1f} GB ({est.weight_bytes_per_gpu / 1e9:.1f} GB/GPU)   "
               f"KV {est.kv_bytes_per_token:,.0f} bytes/token   pool {est.kv_pool_tokens:,} tokens   "
               f"max batch at {context}: {est.max_batch}")
    if est.draft:
        click.echo(f"  draft {est.draft}: {est.draft_weight_bytes_per_gpu / 1e9:.2f} GB/GPU, "
                   f"KV {est.draft_kv_bytes_per_token_per_gpu:,.0f} bytes/token/GPU (counted in the pool)")
    click.echo(f"  throughput ceiling {est.ceiling_tok_s:,.0f} tok/s (bandwidth / (context x KV bytes))   "
               f"single-user {est.single_user_tok_s:,.1f} tok/s (bandwidth / weights read per token)")
    rows = [[r.batch, f"{r.decode_step_ms:.2f}", f"{r.tokens_per_step:.2f}", f"{r.tok_s_per_user:,.1f}",
             f"{r.tok_s_total:,.0f}", r.bound, "yes" if r.fits else "NO"] for r in est.rows]
    echo_table(["batch", "step_ms", "tok/step", "tok_s_per_user", "tok_s_total", "bound", "fits_pool"], rows)


def _check_flags(m, tp, context, gpu_mem_util, spec_k, spec_alpha, spec_draft_cost) -> None:
    """Each flag checked where it enters, so a bad value is one line naming the flag."""
    if tp < 1:
        raise InputError(f"--tp {tp}: must be >= 1")
    if context < 1:
        raise InputError(f"--context {context}: must be >= 1 token")
    if m.max_context_tokens and context > m.max_context_tokens:
        raise InputError(f"--context {context}: beyond {m.name}'s context of {m.max_context_tokens:,} tokens "
                         f"(max_position_embeddings)")
    if not 0 < gpu_mem_util <= 1:  # also refuses nan
        raise InputError(f"--gpu-mem-util {gpu_mem_util}: must be in (0, 1]")
    if not 0 <= spec_k <= 64:
        raise InputError(f"--spec-k {spec_k}: must be in 0..64")
    if not 0 <= spec_alpha <= 1:
        raise InputError(f"--spec-alpha {spec_alpha}: must be in [0, 1]")
    if not 0 <= spec_draft_cost <= 1:
        raise InputError(f"--spec-draft-cost {spec_draft_cost}: must be in [0, 1]")


def _measured_rows(est, sm):
    """The sweep's step times from the measured model (the pool, ceiling and single-user figures
    stay the calibrated model's: they are bandwidth arithmetic, not step times)."""
    rows = []
    for r in est.rows:
        s = sm.decode_step(r.batch, est.context)
        per_user = s.tokens_per_seq / s.time_s
        rows.append(replace(r, decode_step_ms=s.time_s * 1e3, tok_s_per_user=per_user, tok_s_total=per_user * r.batch))
    return replace(est, rows=rows)


COMMANDS = [estimate_cmd]
