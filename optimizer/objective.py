"""The order of two deployments under the workload's objective: one home for it, read by the race
(``optimizer.simsearch.rank``), the deployment-kind and GPU-type choices and the oracle bench.

Lexicographic, as the mission says (the goodput-maximising, cost-minimising config):

    min_cost      the least $/h; among equal $/h, bf16 KV before fp8 KV (a quality preference,
                  when both are searched: stated in the answer's notes); then the most goodput
    max_goodput   the most goodput per $/h; among equal goodput per $/h, the least $/h

Goodput here is the verified one (``optimizer.verify``: robust to the request draw for a pick).
Smaller keys are better; a caller appends its own tie-breaks (the config key) so the order never
depends on which stage or process produced a figure.
"""

from __future__ import annotations

__all__ = ["objective_rank", "prefers_bf16"]


def prefers_bf16(kv_dtypes) -> bool:
    """bf16 KV wins a tie in $/h when the search offers it and another KV format too."""
    kv = list(kv_dtypes)
    return "bf16" in kv and any(k != "bf16" for k in kv)


def objective_rank(objective: str, usd_per_hour: float, goodput_req_s: float, kv_dtype: str,
                   kv_dtypes=("bf16",)) -> tuple:
    """The lexicographic key of one deployment (module docstring), smaller first. ``kv_dtypes``:
    the KV formats searched (the bf16 preference applies only when there was a choice)."""
    usd, good = float(usd_per_hour), float(goodput_req_s or 0.0)
    if objective == "max_goodput":
        return (-good / usd if usd > 0 else 0.0, usd)
    fp8_last = kv_dtype != "bf16" and prefers_bf16(kv_dtypes)
    return (usd, fp8_last, -good)
