"""The ``kvtune simulate`` command that reproduces a pick's printed figures.

``kvtune solve`` prints it with the recommendation: the pick's exact settings, its replica (or
unit) count, the rate the whole deployment was simulated at (``repr``: the same float comes back),
the requests and seed of the draw whose percentiles are printed, the GPU type and the calibration,
engine and profile the solve was given. ``simulate`` runs the very function the verification ran
(``optimizer.verify.simulate_at``; a disaggregated deployment, ``costmodel.deployment``), so its
TTFT/TPOT percentiles and attainment are solve's, bit for bit.
"""

from __future__ import annotations

import shlex
from typing import Any, Mapping

__all__ = ["aggregated_command", "disaggregated_command", "check_lines"]


def _tail(spec, gpu: str, overrides: Mapping[str, Any] | None, fleet_rate: float, n: int, seed: int) -> list[str]:
    out = ["--rate", repr(float(fleet_rate)), "--requests", str(int(n)), "--seed", str(int(seed))]
    if getattr(spec.hardware, "gpu_file", None) is None:
        out += ["--gpu", gpu]
    for k in ("calibration", "engine", "profile"):
        v = (overrides or {}).get(k)
        if v is not None:
            out += [f"--{k}", str(v)]
    return out


def aggregated_command(spec, params: Mapping[str, Any], v, gpu: str, overrides: Mapping[str, Any] | None = None
                       ) -> str | None:
    """``kvtune simulate`` for an aggregated pick (``v``: its robust ``optimizer.verify.Verification``);
    None when ``v`` has no fresh draws (nothing was printed from a draw)."""
    if v.draws is None or v.fleet_rate_req_s is None or v.replicas is None:
        return None
    args = ["kvtune", "simulate", spec.path, "--tp", str(params["tp"])]
    if params.get("pp", 1) > 1:
        args += ["--pp", str(params["pp"])]
    if params.get("ep", 1) > 1:
        args += ["--ep", str(params["ep"])]
    if params.get("dp_attention"):
        args += ["--dp-attention"]
    args += ["--batch-cap", str(params["batch_cap"]), "--kv-dtype", str(params["kv_dtype"]),
             "--spec-k", str(params.get("spec_k", 0)), "--chunk-tokens", str(params["chunk_tokens"]),
             "--replicas", str(v.replicas)]
    args += _tail(spec, gpu, overrides, v.fleet_rate_req_s, v.draws.n_requests, v.draws.seeds[0])
    return shlex.join(args)


def disaggregated_command(spec, prefill, decode, kv_dtype: str, link: str, units: int, engine: str,
                          fleet_rate: float, n: int, seed: int, gpu: str,
                          overrides: Mapping[str, Any] | None = None) -> str:
    """``kvtune simulate`` for a disaggregated pick: both pools (``optimizer.disagg.PoolChoice``,
    per unit), the KV link and the units (``engine``, whose transfer rules were simulated, is the
    workload's or --engine's, or the default both commands share)."""
    args = ["kvtune", "simulate", spec.path,
            "--prefill-tp", str(prefill.tp), "--prefill-replicas", str(prefill.replicas),
            "--prefill-batch-cap", str(prefill.batch_cap), "--prefill-chunk-tokens", str(prefill.chunk_tokens),
            "--decode-tp", str(decode.tp), "--decode-replicas", str(decode.replicas),
            "--decode-batch-cap", str(decode.batch_cap), "--decode-chunk-tokens", str(decode.chunk_tokens),
            "--kv-dtype", kv_dtype, "--link", link, "--units", str(int(units))]
    args += _tail(spec, gpu, overrides, fleet_rate, n, seed)   # the engine's rules follow --engine or the workload's
    return shlex.join(args)


def check_lines(r) -> list[str]:
    """``kvtune solve``'s summary lines for the pick's fresh draws (``optimizer.verify.Draws``) and
    the command that reproduces its printed percentiles."""
    p = getattr(r, "predicted", None)
    if p is None or not p.draws:
        return []
    d = p.draws
    k, n = len(d["seeds"]), d["n_requests"]
    lines = []
    if d["attainment"]:
        lo, hi, mean = d["attainment_min"], d["attainment_max"], d["attainment_mean"]
        head = (f"  robust: SLO attainment {mean:.3f} on average over {k} fresh draws of {n:,} requests at "
                f"{d['load_req_s']:.3g} req/s per {'unit' if p.per_replica_is else 'replica'} "
                f"(range {lo:.3f}-{hi:.3f}")
        if k > 1:
            lines.append(head + f", every one >= the target): a fresh draw meets it with probability >= "
                                f"{d['coverage']:.0%} by design")
        else:
            lines.append(head + "): a replayed trace has one draw")
        if d.get("goodput_min_req_s") is not None:
            lines.append(f"  robust goodput: the least over the workload's draw and the fresh ones, "
                         f"{d['goodput_min_req_s']:.3g} req/s per {'unit' if p.per_replica_is else 'replica'}")
    if p.check:
        lines.append(f"  check (the first fresh draw, its percentiles above): {p.check}")
    return lines
