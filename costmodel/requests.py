"""A batch of requests for the simulator: columns of numpy arrays, one row per request.

Produced by ``costmodel.traffic`` (sampling request classes or replaying a trace) and consumed
by ``costmodel.simulate``. Times in seconds, lengths in tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .errors import InputError

__all__ = ["Requests"]


@dataclass(frozen=True)
class Requests:
    arrival_s: np.ndarray      # float64, non-decreasing (Poisson/trace); ignored for rate=inf and closed loop
    input_tokens: np.ndarray   # int64 >= 1: prompt length
    output_tokens: np.ndarray  # int64 >= 1: tokens to generate
    prefix_tokens: np.ndarray  # int64 in [0, input]: leading tokens shared with earlier requests (prefix-cache candidates)
    prefix_group: np.ndarray   # int64: requests with the same group share that prefix (-1: none)
    ttft_slo_s: np.ndarray     # float64: this request's TTFT target
    tpot_slo_s: np.ndarray     # float64: this request's TPOT target
    class_idx: np.ndarray      # int64 index into class_names
    class_names: tuple[str, ...] = ("all",)

    def __post_init__(self) -> None:
        n = len(self.input_tokens)
        for f in ("arrival_s", "output_tokens", "prefix_tokens", "prefix_group", "ttft_slo_s", "tpot_slo_s", "class_idx"):
            if len(getattr(self, f)) != n:
                raise InputError(f"requests: column {f} has {len(getattr(self, f))} rows, expected {n}")
        if n and (self.input_tokens.min() < 1 or self.output_tokens.min() < 1):
            raise InputError("requests: input and output lengths must be >= 1 token")
        if n and ((self.prefix_tokens < 0).any() or (self.prefix_tokens > self.input_tokens).any()):
            raise InputError("requests: prefix_tokens must lie in [0, input_tokens]")

    def __len__(self) -> int:
        return len(self.input_tokens)

    @classmethod
    def uniform(cls, n: int, input_tokens: int, output_tokens: int, ttft_slo_s: float = np.inf,
                tpot_slo_s: float = np.inf, arrival_s: np.ndarray | None = None) -> "Requests":
        """``n`` identical requests (fixed lengths, no shared prefix), all arriving at t=0 unless given."""
        return cls(
            arrival_s=np.zeros(n) if arrival_s is None else np.asarray(arrival_s, dtype=float),
            input_tokens=np.full(n, input_tokens, dtype=np.int64),
            output_tokens=np.full(n, output_tokens, dtype=np.int64),
            prefix_tokens=np.zeros(n, dtype=np.int64),
            prefix_group=np.full(n, -1, dtype=np.int64),
            ttft_slo_s=np.full(n, ttft_slo_s, dtype=float),
            tpot_slo_s=np.full(n, tpot_slo_s, dtype=float),
            class_idx=np.zeros(n, dtype=np.int64),
        )
