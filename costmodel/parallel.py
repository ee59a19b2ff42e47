"""How one replica spreads over GPUs and nodes, and what the spreading costs.

A replica runs on ``tp x pp`` GPUs: ``pp`` pipeline stages of ``tp`` tensor-parallel GPUs each,
stage ``i`` on GPUs ``i*tp .. (i+1)*tp - 1``, packed onto nodes of ``gpus_per_node``. A TP group
larger than a node spans nodes (its all-reduce then crosses the network). ``ep = tp`` places whole
MoE experts on the TP group's GPUs instead of slicing every expert (expert parallelism);
``dp_attention`` runs attention data-parallel across the TP group (each GPU its own sequences and
their KV cache, the attention weights on every GPU), as SGLang's ``--enable-dp-attention`` does
for MLA models. The terms, each a pure function of the hardware data (``costmodel.hardware``):

    all-reduce (S bytes over n GPUs, g per node, N = ceil(n / g) nodes), hierarchical as NCCL:
        t = lat + 2(g-1)/g x S / link_bw  [+ net_lat + 2(N-1)/N x (S/g) / net_bw  when N > 1]
    all-to-all (each GPU sends S bytes spread evenly over the ep GPUs, g per node):
        t = max(lat + S (g-1)/ep / link_bw,  net_lat + S (ep-g)/ep / net_bw)
    pipeline hop (S bytes of activations from one stage to the next):
        t = lat + S / bw   (NVLink inside a node, the network across)
    pipeline round with M micro-batches in flight (M = min(pp, running sequences)):
        every sequence gains a token per pp x t_stage(B / M) + (pp - 1) hops; a stage is busy
        M of every pp stage-times: the bubble is 1 - M / pp
    expert load imbalance (n tokens x top_k routed over ep GPUs, uniform routing):
        busiest / mean GPU load = min(ep, 1 + sqrt(2 ln(ep) / mu)),  mu = n x top_k / ep

The imbalance is the expected maximum of ``ep`` Poisson loads of mean ``mu`` (the Gaussian tail
bound of balls into bins); real routers add skew on top (DeepSeek's EPLB replicates hot experts
to remove most of it), which kvtune does not model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .errors import InputError

__all__ = ["Parallel", "allreduce_s", "all_to_all_s", "hop_s", "expert_load_imbalance", "micro_batches",
           "SINGLE"]


@dataclass(frozen=True)
class Parallel:
    """One replica's layout: tensor x pipeline parallel GPUs, expert parallelism, DP attention."""

    tp: int = 1
    pp: int = 1
    ep: int = 1                 # 1: experts sliced across the TP group; = tp: whole experts per GPU
    dp_attention: bool = False  # attention data-parallel across the TP group (MLA models)
    gpus_per_node: int = 8

    def __post_init__(self) -> None:
        for f in ("tp", "pp", "ep", "gpus_per_node"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise InputError(f"{f} must be a whole number >= 1, got {v!r}")
        if self.ep not in (1, self.tp):
            raise InputError(f"ep must be 1 or equal to tp ({self.tp}), got {self.ep}")
        if self.dp_attention and self.tp < 2:
            raise InputError("dp_attention needs tp >= 2 (attention is spread over the TP group's GPUs)")
        if self.tp > self.gpus_per_node and self.tp % self.gpus_per_node:
            raise InputError(f"tp {self.tp} spans nodes but is not a multiple of gpus_per_node {self.gpus_per_node}")

    @property
    def gpus(self) -> int:
        """GPUs of one replica."""
        return self.tp * self.pp

    @property
    def nodes(self) -> int:
        """Nodes one replica occupies (stages packed onto nodes in order)."""
        return math.ceil(self.gpus / self.gpus_per_node)

    @property
    def tp_nodes(self) -> int:
        """Nodes one TP group spans (1 unless tp > gpus_per_node)."""
        return math.ceil(self.tp / self.gpus_per_node)

    @property
    def cross_node_hops(self) -> int:
        """Stage boundaries (of pp - 1) whose two stages sit on different nodes."""
        g = self.gpus_per_node
        return sum(1 for i in range(1, self.pp) if (i * self.tp - 1) // g != (i * self.tp) // g)

    @property
    def trivial(self) -> bool:
        """One stage, TP inside a node, no EP, no DP attention: the single-node model."""
        return self.pp == 1 and self.tp_nodes == 1 and self.ep == 1 and not self.dp_attention


SINGLE = Parallel()


def allreduce_s(nbytes: float, n: int, gpus_per_node: int, link_bytes_per_s: float, latency_s: float,
                net_bytes_per_s: float, net_latency_s: float) -> float:
    """One all-reduce of ``nbytes`` over ``n`` GPUs: reduce-scatter and all-gather inside each node
    over NVLink, an all-reduce of each GPU's 1/g share across nodes over its own NIC."""
    if n <= 1 or nbytes < 0:
        return 0.0
    g = min(n, gpus_per_node)
    nodes = math.ceil(n / g)
    t = latency_s + 2 * (g - 1) / g * nbytes / link_bytes_per_s if g > 1 else 0.0
    if nodes > 1:
        t += net_latency_s + 2 * (nodes - 1) / nodes * (nbytes / g) / net_bytes_per_s
    return t


def all_to_all_s(nbytes: float, ep: int, gpus_per_node: int, link_bytes_per_s: float, latency_s: float,
                 net_bytes_per_s: float, net_latency_s: float) -> float:
    """One all-to-all in which each GPU sends ``nbytes`` spread evenly over the ``ep`` GPUs (its own
    share stays): NVLink for the GPUs of its node, the network for the rest, in parallel."""
    if ep <= 1 or nbytes <= 0:
        return 0.0
    g = min(ep, gpus_per_node)
    local = latency_s + nbytes * (g - 1) / ep / link_bytes_per_s
    if ep <= g:
        return local
    remote = net_latency_s + nbytes * (ep - g) / ep / net_bytes_per_s
    return max(local, remote)


def hop_s(nbytes: float, bytes_per_s: float, latency_s: float) -> float:
    """One point-to-point transfer between pipeline stages."""
    return latency_s + nbytes / bytes_per_s


def micro_batches(pp: int, n_sequences: float) -> float:
    """Micro-batches in flight in a pipeline of ``pp`` stages: the running sequences split into up
    to ``pp`` groups (vLLM runs one scheduler per stage; TensorRT-LLM/SGLang likewise), and never
    fewer than one (a lone prefill is one micro-batch)."""
    return float(max(1.0, min(float(pp), float(n_sequences))))


def expert_load_imbalance(n_tokens: float, top_k: int, ep: int) -> float:
    """Busiest GPU's expert load over the mean, ``n_tokens`` tokens routing to ``top_k`` experts
    each, spread uniformly over ``ep`` GPUs: 1 + sqrt(2 ln(ep) / mu), at most ``ep``."""
    if ep <= 1 or n_tokens <= 0:
        return 1.0
    mu = n_tokens * top_k / ep
    return min(float(ep), 1.0 + math.sqrt(2.0 * math.log(ep) / mu))
