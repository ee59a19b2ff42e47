"""How close the hardware gets to its datasheet: the parameters a calibration fits.

``IDEAL`` is the speed-of-light model (datasheet peaks, no overheads, no communication cost);
calibrated efficiencies come from a YAML file in ``profiles/calibrations/`` fitted to measured data
(see ``costmodel.calibration``). Each field is dimensionless or carries its unit in its name.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from .errors import InputError

__all__ = ["Efficiency", "IDEAL", "PARAM_BOUNDS", "FP8_PARAMS", "ATTENTION_PARAMS"]

# Physical bounds for each fitted parameter (used to validate files and to bound the fit).
PARAM_BOUNDS = {
    "bw_efficiency": (0.05, 1.0),            # achieved / datasheet HBM bandwidth
    "decode_flops_efficiency": (0.02, 1.0),  # achieved / dense peak for small-M decode GEMMs
    "prefill_flops_efficiency": (0.05, 1.0), # achieved / dense peak for prefill GEMMs + attention
    "step_overhead_s": (0.0, 0.2),           # fixed per engine step: launches, scheduling, sampling
    "prefill_overhead_s": (0.0, 0.1),        # extra per step that carries prompt tokens (no CUDA graph, prefill metadata)
    "allreduce_latency_s": (0.0, 1e-3),      # per TP all-reduce, latency part
    "link_efficiency": (0.05, 1.2),          # achieved / datasheet one-way link bandwidth (NVLS can exceed 1)
    "activation_reserve_bytes": (0.0, 40e9), # per GPU, held back from the KV pool (activations, graphs)
    "request_overhead_s": (0.0, 0.2),        # per request, on its first token, outside the engine's steps:
                                             # HTTP, tokenizing, detokenizing and streaming (client-side TTFT)
    # FP8 as its own physics (1 / 0 = FP8 behaves as bf16 does, scaled to its datasheet rates):
    "fp8_gemm_efficiency": (0.25, 2.0),      # FP8-weight GEMM rate / (FP8 dense peak x the bf16-fitted FLOP
                                             # efficiency): per-tensor/per-token scaling, FP8 kernel maturity
    "fp8_kv_bw_efficiency": (0.25, 2.0),     # FP8 KV read rate / (HBM bandwidth x bw_efficiency): the attention
                                             # kernel's dequantisation of the cache
    "fp8_scale_overhead_s": (0.0, 0.01),     # per step with FP8 weights: dynamic activation quantisation kernels
    # decode attention's FLOP rate / the decode GEMM rate (1 = as fast as the GEMMs, the model before it):
    # a fused GPU attention kernel is memory bound and hides under the KV read; llama.cpp on a CPU
    # computes q.k per cached token at about a fifth of its GEMM rate (profiles/tables/smollm2-135m-cpu-
    # llamacpp.csv, one client: TPOT 16.7 / 24.3 / 43.7 ms at contexts 96 / 288 / 1056)
    "decode_attn_efficiency": (0.01, 4.0),
}
# the FP8 terms, fitted on FP8 rows only (optimizer.calibrate)
FP8_PARAMS = ("fp8_gemm_efficiency", "fp8_kv_bw_efficiency", "fp8_scale_overhead_s")
# fitted with the others by `kvtune calibrate` where the rows separate it (optimizer.calibrate)
ATTENTION_PARAMS = ("decode_attn_efficiency",)


@dataclass(frozen=True)
class Efficiency:
    bw_efficiency: float = 1.0
    decode_flops_efficiency: float = 1.0
    prefill_flops_efficiency: float = 1.0
    step_overhead_s: float = 0.0
    prefill_overhead_s: float = 0.0
    allreduce_latency_s: float = 0.0
    link_efficiency: float = 1.0
    activation_reserve_bytes: float = 0.0
    request_overhead_s: float = 0.0
    fp8_gemm_efficiency: float = 1.0
    fp8_kv_bw_efficiency: float = 1.0
    fp8_scale_overhead_s: float = 0.0
    decode_attn_efficiency: float = 1.0
    model_comm: bool = True       # False: all-reduce costs nothing (the ideal model's seed arithmetic)
    name: str = "ideal"
    source: str = "ideal: datasheet peaks, no overheads, no all-reduce cost"

    def __post_init__(self) -> None:
        for key, (lo, hi) in PARAM_BOUNDS.items():
            v = getattr(self, key)
            if not isinstance(v, (int, float)) or not lo <= v <= hi:
                raise InputError(f"calibration {self.name}: {key} = {v!r} is outside its physical range [{lo}, {hi}]")

    def params(self) -> dict[str, float]:
        return {k: getattr(self, k) for k in PARAM_BOUNDS}

    def with_params(self, **values) -> "Efficiency":
        d = asdict(self)
        d.update(values)
        return Efficiency(**d)


IDEAL = Efficiency(model_comm=False)
