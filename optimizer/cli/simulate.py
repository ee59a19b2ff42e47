"""``kvtune simulate`` and ``kvtune goodput``: one serving config run through the simulator.

``simulate`` takes any deployment ``kvtune solve`` can print: aggregated replicas (``--tp`` with
``--pp``/``--ep``/``--dp-attention`` for a multi-node layout), a disaggregated deployment
(``--prefill-*``/``--decode-*``, ``--link``, ``--units``) and the GPU type (``--gpu``). Given the
pick's exact settings (solve prints the command), it runs the very simulation solve reported, so
its percentiles and attainment are solve's (``optimizer.check``)."""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Collection

import click

from kvtune.costmodel import get_model
from kvtune.costmodel.closed_loop import CLIENT_STARTS, default_clients, run_closed_loop
from kvtune.costmodel.draft import draft_footprint
from kvtune.costmodel.dtypes import KNOWN as DTYPE_NAMES  # bf16, fp8, fp16, GGUF q8_0/q4_0/...
from kvtune.costmodel.engines import REGISTRY
from kvtune.costmodel.errors import Infeasible, InputError
from kvtune.costmodel.goodput import goodput
from kvtune.costmodel.memory import BLOCK_TOKENS
from kvtune.costmodel.simulate import simulate_fleet
from kvtune.costmodel.step import DRAFT_COST, SPEC_METHOD, SpecConfig
from kvtune.optimizer.workload import MAX_SPEC_K

from ._common import emit_json, json_option

# Flag bounds beyond which a value is a typo: a simulation of 10M requests already holds ~1 GB of
# request arrays; the largest clusters built hold ~100k GPUs; see optimizer.workload for MAX_SPEC_K.
MAX_REQUESTS = 10**7
MAX_REPLICAS = 100_000


class _OneLineCommand(click.Command):
    """Bad or missing flags become one ``Error:`` line and exit 2 (an ``InputError``)."""

    def parse_args(self, ctx, args):
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as exc:
            raise InputError(f"kvtune {self.name}: {exc.format_message()}") from None


def _flag(param) -> str:
    """The flag as the user types it (``--requests``, not the parameter's name ``n_requests``)."""
    return max(param.opts, key=len) if getattr(param, "opts", None) else f"--{param.name.replace('_', '-')}"


class _Int(click.ParamType):
    name = "integer"

    def __init__(self, minimum: int, maximum: int | None = 10**9):
        self.minimum, self.maximum = minimum, maximum

    def convert(self, value, param, ctx):
        try:
            v = int(str(value))
        except ValueError:
            raise InputError(f"{_flag(param)}: {str(value)[:40]!r} is not a whole number") from None
        if v < self.minimum:
            raise InputError(f"{_flag(param)}: {v} must be >= {self.minimum}")
        if self.maximum is not None and v > self.maximum:
            raise InputError(f"{_flag(param)}: {v} must be <= {self.maximum:,}")
        return v


class _Float(click.ParamType):
    name = "number"

    def __init__(self, lo: float = 0.0, hi: float = math.inf, allow_inf: bool = False):
        self.lo, self.hi, self.allow_inf = lo, hi, allow_inf

    def convert(self, value, param, ctx):
        flag = _flag(param)
        try:
            v = float(str(value))
        except ValueError:
            raise InputError(f"{flag}: {value!r} is not a number") from None
        if math.isinf(v) and str(value).strip().lstrip("+-").lower() not in ("inf", "infinity"):
            raise InputError(f"{flag}: {value} is beyond the range of a number (about 1.8e308)")
        if math.isnan(v) or (math.isinf(v) and not self.allow_inf) or not (self.lo < v <= self.hi or (self.allow_inf and v == math.inf)):
            raise InputError(f"{flag}: {value} must be in ({self.lo:g}, {self.hi:g}]" + (" or inf" if self.allow_inf else ""))
        return v


class _Choice(click.ParamType):
    name = "choice"

    def __init__(self, choices: Collection[str]):
        self.choices = choices

    def convert(self, value, param, ctx):
        if value not in self.choices:
            raise InputError(f"{_flag(param)}: {value!r} is not one of {', '.join(self.choices)}")
        return value


def _config_options(f):
    opts = [
        click.argument("workload", type=click.Path(dir_okay=False)),
        click.option("--tp", type=_Int(1), default=1, show_default=True, help="Tensor-parallel size (GPUs per replica)."),
        click.option("--pp", type=_Int(1), default=1, show_default=True,
                     help="Pipeline stages per replica (a multi-node layout: GPUs per replica = TP x PP)."),
        click.option("--ep", type=_Int(1), default=1, show_default=True,
                     help="Expert parallelism: 1 (experts sliced across the TP group) or equal to --tp."),
        click.option("--dp-attention", is_flag=True, help="Data-parallel attention across the TP group (MLA models)."),
        click.option("--gpu", default=None,
                     help="GPU type from the catalog (default: the workload's hardware.gpu, the first of a list)."),
        click.option("--batch-cap", type=_Int(1), default=128, show_default=True, help="Max running sequences."),
        click.option("--kv-dtype", type=_Choice(DTYPE_NAMES), default="bf16", show_default=True),
        click.option("--spec-k", type=_Int(0, MAX_SPEC_K), default=0, show_default=True, help="Speculative draft length (0 = off)."),
        click.option("--spec-alpha", type=_Float(0.0, 1.0), default=None,
                     help="Per-token acceptance (default: the workload's speculative.acceptance)."),
        click.option("--chunk-tokens", type=_Int(1), default=8192, show_default=True, help="Per-step token budget."),
        click.option("--block-tokens", type=_Int(1), default=BLOCK_TOKENS, show_default=True, help="KV block size."),
        click.option("--no-prefix-caching", is_flag=True, help="Recompute shared prefixes."),
        click.option("--replicas", type=_Int(1, MAX_REPLICAS), default=1, show_default=True, help="Replicas behind a random load balancer."),
        click.option("--seed", type=_Int(0, None), default=0, show_default=True),
        click.option("--mode", type=_Choice(("calibrated", "ideal")), default="calibrated", show_default=True),
        click.option("--calibration", default=None,
                     help="Calibration file, shipped name or 'ideal' (default: the workload's, else the shipped one)."),
        click.option("--engine", type=_Choice(REGISTRY), default=None,   # the registry: an engine added at run time too
                     help="Use the shipped calibration fitted for this engine (overrides the workload's engine and "
                          "calibration unless --calibration is given)."),
        click.option("--profile", default=None,
                     help="Measured profile table: its step times inside its range, the calibration outside "
                          "(default: the workload's profile:)."),
        json_option(),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def engine_choice(spec, calibration, engine, profile) -> tuple:
    """Flags over the workload: --calibration, then --engine (its shipped calibration), then the
    workload's calibration: and engine:; --profile over the workload's profile:."""
    cal = calibration if calibration is not None else (None if engine is not None else spec.calibration)
    return cal, engine or spec.engine, profile or getattr(spec, "profile", None)


def _given(*names: str) -> bool:
    """Whether any of these options was given on the command line (not left at its default)."""
    from click.core import ParameterSource
    ctx = click.get_current_context()
    return any(ctx.get_parameter_source(n) == ParameterSource.COMMANDLINE for n in names)


def _build(workload, tp, kv_dtype, spec_k, spec_alpha, mode, calibration, engine, profile, gpu_name=None,
           pp=1, ep=1, dp_attention=False, layout=False):
    from kvtune.costmodel.hardware import resolve_gpu
    from kvtune.costmodel.parallel import Parallel
    from kvtune.optimizer.step_factory import StepFactory
    from kvtune.optimizer.workload import load_workload

    spec = load_workload(workload)
    model = get_model(spec.model)
    gpu = resolve_gpu(gpu_name) if gpu_name else resolve_gpu(spec.hardware.gpu, spec.hardware.gpu_file)
    cal, eng, prof = engine_choice(spec, calibration, engine, profile)
    em = StepFactory.build(gpu, mode, cal, eng, prof)
    sc = _speculation(workload, spec, model, spec_k, spec_alpha)
    par = None   # a multi-node layout (optimizer.layouts), as solve builds one
    if layout or pp > 1 or ep > 1 or dp_attention or tp > spec.hardware.gpus_per_node:
        par = Parallel(tp=tp, pp=pp, ep=ep, dp_attention=dp_attention, gpus_per_node=spec.hardware.gpus_per_node)
    step = em.step(model, tp, spec.weights, kv_dtype, sc, spec.gpu_mem_util, parallel=par)
    return spec, step, em


def _speculation(workload, spec, model, spec_k, spec_alpha):
    if not spec_k:
        return None
    if spec_alpha is None and spec.speculative is None:
        raise InputError(f"--spec-k {spec_k}: {workload} has no speculative: section; give --spec-alpha")
    s = spec.speculative
    method = s.method if s else SPEC_METHOD
    try:   # the drafter resident beside the model (costmodel.draft)
        draft = draft_footprint(method, model, spec.weights or "bf16", s.draft_model if s else None)
    except InputError as exc:
        raise InputError(f"{workload}: {exc}") from None
    return SpecConfig(spec_k, spec_alpha if spec_alpha is not None else s.acceptance,
                      s.draft_cost if s else DRAFT_COST, method, draft)


def _sim_config(spec, em, batch_cap, chunk_tokens, block_tokens, prefix, spec_k):
    """The engine's scheduler, as solve simulates it (``optimizer.verify.sim_config``): SGLang
    schedules prefill first under NGRAM/STANDALONE speculation."""
    from kvtune.optimizer.launch import scheduling
    cfg = em.sim_config(batch_cap, chunk_tokens, block_tokens, prefix)
    s = spec.speculative
    if scheduling(em.engine, s.method if s else None, spec_k) == "prefill_first":
        cfg = dataclasses.replace(cfg, prefill_first=True)
    return cfg


def _config_dict(spec, step, tp, batch_cap, kv_dtype, spec_k, chunk_tokens, block_tokens, prefix, replicas, mode):
    par = getattr(step, "parallel", None)
    layout = {} if par is None else {"pp": par.pp, "ep": par.ep, "dp_attention": par.dp_attention}
    return {"model": step.model.name, "gpu": step.gpu.name, "tp": tp, **layout, "weights": spec.weights,
            "kv_dtype": kv_dtype,
            "batch_cap": batch_cap, "chunk_tokens": chunk_tokens, "block_tokens": block_tokens,
            "prefix_caching": prefix, "spec_k": spec_k,
            "spec_acceptance": step.speculation.acceptance if step.speculation else None, "replicas": replicas,
            "gpus": tp * (par.pp if par is not None else 1) * replicas, "kv_pool_tokens": step.memory.kv_pool_tokens,
            "mode": "ideal" if step.eff.name == "ideal" else mode}


def _tails(s: dict) -> str:
    return "  ".join(f"{k} p50/p90/p99 {s[k]['p50']:.1f}/{s[k]['p90']:.1f}/{s[k]['p99']:.1f}"
                     for k in ("ttft_ms", "tpot_ms", "e2e_ms"))


def _disaggregated_options(f):
    from kvtune.optimizer.disagg import DECODE_CHUNK, PREFILL_CAPS
    opts = [
        click.option("--prefill-tp", type=_Int(1), default=None,
                     help="Disaggregated: TP of each prefill replica (with --decode-tp: simulate a prefill and a "
                          "decode pool, as solve prints a disaggregated pick)."),
        click.option("--prefill-replicas", type=_Int(1, MAX_REPLICAS), default=1, show_default=True,
                     help="Disaggregated: prefill replicas per unit."),
        click.option("--prefill-batch-cap", type=_Int(1), default=PREFILL_CAPS[0], show_default=True),
        click.option("--prefill-chunk-tokens", type=_Int(1), default=8192, show_default=True),
        click.option("--decode-tp", type=_Int(1), default=None, help="Disaggregated: TP of each decode replica."),
        click.option("--decode-replicas", type=_Int(1, MAX_REPLICAS), default=1, show_default=True,
                     help="Disaggregated: decode replicas per unit."),
        click.option("--decode-batch-cap", type=_Int(1), default=128, show_default=True),
        click.option("--decode-chunk-tokens", type=_Int(1), default=DECODE_CHUNK, show_default=True),
        click.option("--link", type=_Choice(("nvlink", "network")), default=None,
                     help="Disaggregated: the KV link between the pools (default: NVLink when a unit fits one node)."),
        click.option("--units", type=_Int(1, MAX_REPLICAS), default=1, show_default=True,
                     help="Disaggregated: units (prefill + decode pools) behind a random load balancer."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def _simulate_disaggregated(workload, kv_dtype, gpu, block_tokens, no_prefix_caching, seed, mode, calibration,
                            engine, profile, as_json, rate, concurrency, n_requests, **d):
    """``--prefill-*``/``--decode-*``: one disaggregated deployment (``costmodel.deployment``), each unit
    at ``rate / units``, as solve verifies one (``optimizer.disagg_verify.simulate_unit_at``)."""
    from kvtune.costmodel.deployment import Pool, kv_link, simulate_disaggregated
    from kvtune.optimizer.disagg import DEFAULT_ENGINE
    prefix = not no_prefix_caching
    spec, sp, em = _build(workload, d["prefill_tp"], kv_dtype, 0, None, mode, calibration, engine, profile, gpu)
    _, sd, _ = _build(workload, d["decode_tp"], kv_dtype, 0, None, mode, calibration, engine, profile, gpu)
    pre = Pool(sp, em.sim_config(d["prefill_batch_cap"], d["prefill_chunk_tokens"], block_tokens, prefix),
               d["prefill_replicas"])
    dec = Pool(sd, em.sim_config(d["decode_batch_cap"], d["decode_chunk_tokens"], block_tokens, prefix),
               d["decode_replicas"])
    units = d["units"]
    link = d["link"] or ("nvlink" if pre.gpus + dec.gpus <= spec.hardware.gpus_per_node else "network")
    eng = em.engine or DEFAULT_ENGINE
    rate_used = rate if rate is not None else spec.workload.mean_rate_req_s
    if rate_used is None or math.isinf(rate_used):
        raise InputError(f"{workload}: a disaggregated deployment is simulated at a finite Poisson rate "
                         f"(workload.rate_req_s or the rate option)")
    t0 = time.perf_counter()
    req = spec.requests(n_requests, seed, rate_used / units)
    res = simulate_disaggregated(pre, dec, req, kv_link(sp.gpu, link == "nvlink"), "trace", seed, None,
                                 engine=eng).result
    wall = time.perf_counter() - t0
    if res.rejected:
        raise Infeasible(f"{workload}: disaggregated TP{d['prefill_tp']}/TP{d['decode_tp']}, KV {kv_dtype}: "
                         f"{res.reject_reason}")
    out = res.summary()
    out["output_tok_s"] = out["output_tok_s"] * units
    out = {**out, "sim_wall_s": wall, "arrival": "trace", "rate_req_s": rate_used, "concurrency": None,
           "excluded": {"warmup_frac": res.warmup_frac,
                        "rule": "the first warmup_frac of requests in arrival order are left out of the statistics"},
           "config": {"deployment": "disaggregated", "model": sp.model.name, "gpu": sp.gpu.name, "kv_dtype": kv_dtype,
                      "weights": spec.weights, "engine": eng, "link": link, "units": units,
                      "prefill": {"tp": d["prefill_tp"], "replicas": d["prefill_replicas"],
                                  "batch_cap": d["prefill_batch_cap"], "chunk_tokens": d["prefill_chunk_tokens"]},
                      "decode": {"tp": d["decode_tp"], "replicas": d["decode_replicas"],
                                 "batch_cap": d["decode_batch_cap"], "chunk_tokens": d["decode_chunk_tokens"]},
                      "gpus": units * (pre.gpus + dec.gpus), "block_tokens": block_tokens, "prefix_caching": prefix},
           "slo": {"ttft_ms": spec.slo.ttft_ms, "tpot_ms": spec.slo.tpot_ms, "attainment": spec.slo.attainment},
           **em.record()}
    if emit_json(as_json, out):
        return
    click.echo(f"{sp.model.name} disaggregated on {sp.gpu.name}: {units} x [{d['prefill_replicas']} prefill x "
               f"TP{d['prefill_tp']} (batch cap {d['prefill_batch_cap']}, chunk {d['prefill_chunk_tokens']}) + "
               f"{d['decode_replicas']} decode x TP{d['decode_tp']} (batch cap {d['decode_batch_cap']})], KV "
               f"{kv_dtype} over {'NVLink' if link == 'nvlink' else 'the network'}; engine rules {eng}  [{out['source']}]")
    click.echo(f"  {out['requests']} requests at {rate_used:g} req/s (trace, {rate_used / units:g} per unit); "
               f"{out['measured_requests']} measured after warm-up")
    click.echo(f"  {_tails(out)}")
    click.echo(f"  SLO attainment {out['slo_attainment']:.3f} (target {spec.slo.attainment:g})   "
               f"{out['output_tok_s']:,.0f} output tok/s   preemptions {out['preemptions']}   "
               f"simulated in {wall * 1e3:.0f} ms")


@click.command("simulate", cls=_OneLineCommand)
@_config_options
@click.option("--rate", type=_Float(0.0, allow_inf=True), default=None,
              help="Poisson arrivals, req/s across the fleet ('inf': all at t=0). Default: the workload's rate.")
@click.option("--concurrency", type=_Int(1, MAX_REQUESTS), default=None,
              help="Closed loop: clients each with one request in flight (a `vllm bench serve --max-concurrency` run).")
@click.option("--clients", type=_Choice(CLIENT_STARTS), default=None,
              help="Closed loop: how the clients' first requests start: burst (all at t=0, kept in lock-step) or "
                   "staggered (spread over one request's lifetime). Default: the engine's rule, as the calibration "
                   "simulates its benchmarks (staggered for vLLM/TensorRT-LLM, burst for SGLang/llama.cpp).")
@click.option("--requests", "n_requests", type=_Int(1, MAX_REQUESTS), default=2000, show_default=True)
@_disaggregated_options
def simulate_cmd(workload, tp, pp, ep, dp_attention, gpu, batch_cap, kv_dtype, spec_k, spec_alpha, chunk_tokens,
                 block_tokens, no_prefix_caching, replicas, seed, mode, calibration, engine, profile, as_json, rate,
                 concurrency, clients, n_requests, **disagg):
    """Simulate one serving config on a workload: latency tails, SLO attainment, throughput."""
    if rate is not None and concurrency is not None:
        raise InputError("give --rate or --concurrency, not both")
    if clients is not None and concurrency is None:
        raise InputError("--clients applies to a closed loop: give --concurrency")
    if disagg["prefill_tp"] is not None or disagg["decode_tp"] is not None:
        if disagg["prefill_tp"] is None or disagg["decode_tp"] is None:
            raise InputError("a disaggregated deployment needs both --prefill-tp and --decode-tp")
        if concurrency is not None:
            raise InputError("--concurrency: a disaggregated deployment is simulated at a Poisson --rate")
        if _given("tp", "pp", "ep", "dp_attention", "batch_cap", "chunk_tokens", "replicas", "spec_k", "spec_alpha"):
            raise InputError("--prefill-tp and --decode-tp describe a disaggregated deployment: give its pools' "
                             "options, not --tp/--batch-cap/--chunk-tokens/--replicas/--spec-k")
        return _simulate_disaggregated(workload, kv_dtype, gpu, block_tokens, no_prefix_caching, seed, mode,
                                       calibration, engine, profile, as_json, rate, concurrency, n_requests, **disagg)
    spec, step, em = _build(workload, tp, kv_dtype, spec_k, spec_alpha, mode, calibration, engine, profile, gpu,
                            pp, ep, dp_attention, _given("pp", "ep"))
    cfg = _sim_config(spec, em, batch_cap, chunk_tokens, block_tokens, not no_prefix_caching, spec_k)
    closed = None
    if concurrency is not None:
        arrival, rate_used = "closed", None
        if concurrency < replicas:
            raise InputError(f"--concurrency {concurrency}: a closed loop over {replicas} replicas needs at least "
                             f"one client per replica")
        clients_used = clients or default_clients(em.engine)
        per_replica = concurrency // replicas
        closed = {"clients": clients_used, "clients_default": default_clients(em.engine),
                  "clients_per_replica": per_replica,
                  "excluded": {"warmup_requests": per_replica if n_requests > 2 * per_replica else 0,
                               "drain_requests": per_replica if n_requests > 2 * per_replica else 0,
                               "rule": "the first and the last C requests of each replica's closed loop (warm-up "
                                       "and drain) are left out of the latency statistics, as the calibration "
                                       "does (costmodel.closed_loop)"}}
    else:
        rate_used = rate if rate is not None else spec.workload.mean_rate_req_s
        if rate_used is None:
            raise InputError(f"{workload}: workload.rate_req_s is not set; give --rate or --concurrency")
        arrival = "inf" if math.isinf(rate_used) else "trace"

    def make(r, n, s):
        return spec.requests(n, s, r)

    t0 = time.perf_counter()
    if closed is not None:
        # one replica's clients through the calibration's closed-loop path; a random balancer makes
        # every replica statistically the same (costmodel.simulate.simulate_fleet)
        one = run_closed_loop(step, make(math.inf, n_requests, seed), cfg, closed["clients_per_replica"],
                              closed["clients"], seed)
        res = dataclasses.replace(one, output_tok_s=one.output_tok_s * replicas, request_s=one.request_s * replicas,
                                  replicas=int(replicas))
    else:
        res = simulate_fleet(step, make, cfg, replicas, rate_used, n_requests, arrival, concurrency, seed)
    wall = time.perf_counter() - t0
    if res.rejected:  # this config cannot serve the workload at any load
        raise Infeasible(f"{workload}: TP{tp}, KV {kv_dtype}: {res.reject_reason}")
    out = res.summary()
    out["sim_wall_s"] = wall
    if closed is not None:
        out["closed_loop"] = closed
    else:
        out["excluded"] = {"warmup_frac": res.warmup_frac,
                           "rule": "the first warmup_frac of requests in arrival order are left out of the statistics"}
    out = {**out, "arrival": arrival, "rate_req_s": rate_used, "concurrency": concurrency,
           "config": _config_dict(spec, step, tp, batch_cap, kv_dtype, spec_k, chunk_tokens, block_tokens,
                                  not no_prefix_caching, replicas, mode),
           "slo": {"ttft_ms": spec.slo.ttft_ms, "tpot_ms": spec.slo.tpot_ms, "attainment": spec.slo.attainment},
           **em.record()}
    if emit_json(as_json, out):
        return
    load = f"{rate_used:g} req/s" if rate_used is not None else f"concurrency {concurrency}"
    click.echo(f"{step.model.name} TP{tp} x {replicas} on {step.gpu.name}, KV {kv_dtype}, batch cap {batch_cap}, "
               f"chunk {chunk_tokens}, spec k={spec_k}  [{out['source']}]")
    if closed is not None:
        click.echo(f"  {out['requests']} requests at {load} ({arrival}, {closed['clients']} clients); "
                   f"{out['measured_requests']} measured (first and last {closed['excluded']['warmup_requests']} "
                   f"per replica excluded: warm-up and drain)")
    else:
        click.echo(f"  {out['requests']} requests at {load} ({arrival}); {out['measured_requests']} measured after warm-up")
    click.echo(f"  {_tails(out)}")
    click.echo(f"  SLO attainment {out['slo_attainment']:.3f} (target {spec.slo.attainment:g})   "
               f"{out['output_tok_s']:,.0f} output tok/s   {out['request_s']:.2f} req/s   "
               f"preemptions {out['preemptions']}   rejected {out['rejected']}   simulated in {wall * 1e3:.0f} ms")


@click.command("goodput", cls=_OneLineCommand)
@_config_options
@click.option("--attainment", type=_Float(0.0, 1.0), default=None, help="Target share (default: the workload's slo.attainment).")
@click.option("--requests", "n_requests", type=_Int(1, MAX_REQUESTS), default=None, help="Requests per simulation (default: 100 in the tail).")
@click.option("--rel-tol", type=_Float(0.0, 0.5), default=0.02, show_default=True)
def goodput_cmd(workload, tp, pp, ep, dp_attention, gpu, batch_cap, kv_dtype, spec_k, spec_alpha, chunk_tokens,
                block_tokens, no_prefix_caching, replicas, seed, mode, calibration, engine, profile, as_json, attainment,
                n_requests, rel_tol):
    """The highest Poisson rate this config serves with SLO attainment at target."""
    spec, step, em = _build(workload, tp, kv_dtype, spec_k, spec_alpha, mode, calibration, engine, profile, gpu,
                            pp, ep, dp_attention, _given("pp", "ep"))
    cfg = _sim_config(spec, em, batch_cap, chunk_tokens, block_tokens, not no_prefix_caching, spec_k)
    target = attainment if attainment is not None else spec.slo.attainment

    def make(r, n, s):
        return spec.requests(n, s, r)

    t0 = time.perf_counter()
    g = goodput(step, make, cfg, target, n_requests, seed, rel_tol)
    wall = time.perf_counter() - t0
    out = {"goodput_req_s": g.goodput_req_s * replicas, "goodput_req_s_per_replica": g.goodput_req_s,
           "attainment": g.attainment, "target_attainment": target,
           "ttft_ms": g.summary["ttft_ms"], "tpot_ms": g.summary["tpot_ms"], "e2e_ms": g.summary["e2e_ms"],
           "output_tok_s": g.summary["output_tok_s"] * replicas, "preemptions": g.summary["preemptions"],
           "reason": g.reason, "iterations": g.iterations, "bracket_req_s": list(g.bracket), "rel_tol": rel_tol,
           "requests_per_simulation": g.n_requests, "upper_bound_req_s": g.upper_bound_req_s,
           "capacity_limited": g.capacity_limited, "saturated_req_s": g.saturated_req_s, "limit": g.limit,
           "sim_wall_s": wall,
           "config": _config_dict(spec, step, tp, batch_cap, kv_dtype, spec_k, chunk_tokens, block_tokens,
                                  not no_prefix_caching, replicas, mode),
           "slo": {"ttft_ms": spec.slo.ttft_ms, "tpot_ms": spec.slo.tpot_ms, "attainment": target},
           **em.record()}
    if emit_json(as_json, out):
        return
    click.echo(f"{step.model.name} TP{tp} x {replicas} on {step.gpu.name}, KV {kv_dtype}, batch cap {batch_cap}, "
               f"chunk {chunk_tokens}, spec k={spec_k}  [{out['source']}]")
    if g.goodput_req_s == 0:
        click.echo(f"  goodput 0 req/s: {g.reason}")
        return
    click.echo(f"  goodput {out['goodput_req_s']:.3g} req/s ({g.goodput_req_s:.3g} per replica) at attainment "
               f"{g.attainment:.3f} >= {target:g}; {g.iterations} simulations of {g.n_requests} requests, "
               f"bracket {g.bracket[0]:.3g}-{g.bracket[1]:.3g} req/s, {wall:.2f} s")
    click.echo(f"  at that rate: {_tails(g.summary)}")
    if g.capacity_limited:
        click.echo(f"  a limit of {g.limit} (analytic bound {g.upper_bound_req_s:.3g} req/s per replica)")


COMMANDS = [simulate_cmd, goodput_cmd]
