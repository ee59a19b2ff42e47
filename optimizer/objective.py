"""The workload's objective as an object: how many replicas a deployment gets, how two deployments
are ordered, and the analytic screen's value. The one home for all three: no other module branches
on the objective's name (``objective_for`` turns the workload's ``objective:`` into one of these).

Lexicographic, as the mission says (the goodput-maximising, cost-minimising config):

    min_cost      the least $/h; among equal $/h, bf16 KV before fp8 KV (a quality preference,
                  when both are searched: stated in the answer's notes); then the most goodput.
                  Sized to serve the target rate: replicas = ceil(rate / goodput per replica),
                  the fleet simulated at the target rate, priced at it.
    max_goodput   the most goodput per $/h; among equal goodput per $/h, the least $/h. Sized to
                  every replica hardware.max_nodes holds, the fleet simulated at its goodput (or
                  the target rate when lower), priced at its goodput.

Goodput here is the verified one (``optimizer.verify``: robust to the request draw for a pick).
Smaller keys are better; a caller appends its own tie-breaks (the config key) so the order never
depends on which stage or process produced a figure.
"""

from __future__ import annotations

import math
from typing import ClassVar, Iterable

__all__ = ["Objective", "MinCost", "MaxGoodput", "objective_for", "objective_rank", "prefers_bf16", "OBJECTIVES"]

SIZING_SLACK = 1e-12   # rate / goodput that is an integer up to float rounding takes that many replicas, not one more


def prefers_bf16(kv_dtypes: Iterable[str]) -> bool:
    """bf16 KV wins a tie in $/h when the search offers it and another KV format too."""
    kv = list(kv_dtypes)
    return "bf16" in kv and any(k != "bf16" for k in kv)


class Objective:
    """What a deployment is sized and ranked by (module docstring). Stateless; one instance each."""

    name: ClassVar[str]
    priced_at: ClassVar[str]        # the rate $/M tokens is priced at: "target rate" | "goodput"
    basis: ClassVar[str]            # what a margin between two deployments is in
    caps_cost: ClassVar[bool]       # a $/h found on one GPU type bounds the search of the next (needs a rate)
    screen_metric: ClassVar[str]    # what the screen's study values are (optuna-dashboard shows the name)
    fixed_fleet: ClassVar[bool]     # the replica count is the node budget's (robust sizing lowers goodput,
                                    # not adds replicas); else the fleet is sized to the target rate
    bf16_tie_break: ClassVar[bool]  # bf16 KV wins a tie in the first key (the answer's notes say when it cost goodput)

    def priced_rate_req_s(self, target_rate_req_s: float, goodput_req_s: float) -> float:
        """The request rate a deployment's $ per million output tokens is priced at (``priced_at``)."""
        return target_rate_req_s if self.priced_at == "target rate" else goodput_req_s

    def replicas(self, rate_req_s: float, per_replica_req_s: float, gpus_per_replica: int, max_gpus: int,
                 at_least: int | None = None) -> int:
        """How many replicas (or units) of ``gpus_per_replica`` GPUs serving ``per_replica_req_s``
        each the deployment gets; 0 when none can (no goodput, or not one within ``max_gpus``)."""
        raise NotImplementedError

    def fleet_rate_req_s(self, rate_req_s: float, per_replica_req_s: float, replicas: int) -> float:
        """The rate the whole deployment is simulated (and its latencies predicted) at."""
        raise NotImplementedError

    def rank(self, usd_per_hour: float, goodput_req_s: float, kv_dtype: str,
             kv_dtypes: Iterable[str] = ("bf16",)) -> tuple:
        """The lexicographic key of one deployment, smaller first. ``kv_dtypes``: the KV formats
        searched (the bf16 preference applies only when there was a choice)."""
        raise NotImplementedError

    def screen_value(self, usd_per_hour: float, per_replica_goodput_req_s: float, gpus_per_replica: int,
                     usd_per_gpu_hour: float, headroom: float, aggressiveness: float, feasible: bool,
                     worst_usd_per_hour: float) -> float:
        """The analytic screen's objective value of a trial (lower is better): what the optuna
        sampler climbs and the race's prior order reads."""
        raise NotImplementedError

    def margin_pct(self, win_usd_per_hour: float, win_goodput_req_s: float, lose_usd_per_hour: float,
                   lose_goodput_req_s: float) -> float:
        """How much better the winner is, in ``basis``."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return self.name


class MinCost(Objective):
    name = "min_cost"
    priced_at = "target rate"
    basis = "$/h"
    caps_cost = True
    fixed_fleet = False
    bf16_tie_break = True
    screen_metric = "screened_usd_per_hour_ranked"   # $/h, less a bounded headroom bonus; infeasible: 2 x the max-nodes $/h
    GOODPUT_BONUS = 0.01   # share of $/h a config with 100% screened headroom gains in the screen's value
    PARSIMONY = 2e-5       # share of $/h the largest batch cap and chunk budget lose in the screen's value

    def replicas(self, rate_req_s, per_replica_req_s, gpus_per_replica, max_gpus, at_least=None):
        if at_least:
            return int(at_least)
        if not per_replica_req_s > 0:
            return 0
        return max(1, math.ceil(rate_req_s / per_replica_req_s * (1 - SIZING_SLACK)))

    def fleet_rate_req_s(self, rate_req_s, per_replica_req_s, replicas):
        return rate_req_s

    def rank(self, usd_per_hour, goodput_req_s, kv_dtype, kv_dtypes=("bf16",)):
        fp8_last = kv_dtype != "bf16" and prefers_bf16(kv_dtypes)
        return (float(usd_per_hour), fp8_last, -float(goodput_req_s or 0.0))

    def screen_value(self, usd_per_hour, per_replica_goodput_req_s, gpus_per_replica, usd_per_gpu_hour, headroom,
                     aggressiveness, feasible, worst_usd_per_hour):
        # ranks by $/h, then (a bounded bonus, under GOODPUT_BONUS of the $/h, never enough to reorder
        # two costs) by screened headroom, then (PARSIMONY, smaller still) by the smaller batch cap and
        # chunk: the sampler climbs towards more goodput at the cheapest cost and, among configs the
        # screen cannot tell apart, towards the least aggressive settings
        if not feasible:
            return 2 * worst_usd_per_hour
        return usd_per_hour * (1 - self.GOODPUT_BONUS * min(max(headroom, 0.0), 1.0) + self.PARSIMONY * aggressiveness)

    def margin_pct(self, win_usd_per_hour, win_goodput_req_s, lose_usd_per_hour, lose_goodput_req_s):
        return 100.0 * (lose_usd_per_hour / win_usd_per_hour - 1.0)


class MaxGoodput(Objective):
    name = "max_goodput"
    priced_at = "goodput"
    basis = "goodput per $"
    caps_cost = False
    fixed_fleet = True
    bf16_tie_break = False
    screen_metric = "screened_neg_goodput_req_s_per_usd_hour"

    def replicas(self, rate_req_s, per_replica_req_s, gpus_per_replica, max_gpus, at_least=None):
        return max_gpus // gpus_per_replica

    def fleet_rate_req_s(self, rate_req_s, per_replica_req_s, replicas):
        served = per_replica_req_s * replicas
        return served if not math.isfinite(rate_req_s) else min(rate_req_s, served)

    def rank(self, usd_per_hour, goodput_req_s, kv_dtype, kv_dtypes=("bf16",)):
        usd, good = float(usd_per_hour), float(goodput_req_s or 0.0)
        return (-good / usd if usd > 0 else 0.0, usd)

    def screen_value(self, usd_per_hour, per_replica_goodput_req_s, gpus_per_replica, usd_per_gpu_hour, headroom,
                     aggressiveness, feasible, worst_usd_per_hour):
        return -per_replica_goodput_req_s / (gpus_per_replica * usd_per_gpu_hour)

    def margin_pct(self, win_usd_per_hour, win_goodput_req_s, lose_usd_per_hour, lose_goodput_req_s):
        return 100.0 * ((win_goodput_req_s / win_usd_per_hour) / (lose_goodput_req_s / lose_usd_per_hour) - 1.0)


OBJECTIVES: dict[str, Objective] = {o.name: o for o in (MinCost(), MaxGoodput())}


def objective_for(name: str) -> Objective:
    """The workload's ``objective:`` as its object (the workload reader has checked the name)."""
    return OBJECTIVES[name]


def objective_rank(objective: str, usd_per_hour: float, goodput_req_s: float, kv_dtype: str,
                   kv_dtypes: Iterable[str] = ("bf16",)) -> tuple:
    """``objective_for(objective).rank(...)``: the lexicographic key of one deployment."""
    return OBJECTIVES[objective].rank(usd_per_hour, goodput_req_s, kv_dtype, kv_dtypes)
