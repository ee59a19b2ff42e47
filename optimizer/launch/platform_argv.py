"""What the platform manifests (dynamo.py, llmd.py, kserve.py) share: the pinned platform
release each targets, and the edit that turns an engine's own argv into the part a platform
passes through (the platform sets the program, the model, the port or the parallelism itself)."""

from __future__ import annotations

from dataclasses import dataclass

from .pick import LaunchPick

__all__ = ["PlatformVersion", "without_flags", "safe_name", "data_parallel_nodes"]


@dataclass(frozen=True)
class PlatformVersion:
    """A platform release kvtune writes for; ``contract``: the schema CI validates against
    (tests/contracts/platforms/, written by bench/refresh_platform_schemas.py)."""

    platform: str        # kvtune's name for it
    name: str            # how people call it
    version: str
    repository: str      # where the schema was read (GitHub owner/name)
    commit: str          # the release tag's commit
    contract: str

    def to_json(self) -> dict:
        return {"platform": self.platform, "name": self.name, "version": self.version,
                "repository": self.repository, "commit": self.commit, "contract": self.contract}

    @property
    def label(self) -> str:
        return f"{self.name} {self.version}"


def without_flags(argv: list[str], valued: tuple[str, ...] = (), switches: tuple[str, ...] = ()) -> list[str]:
    """``argv`` without the flags in ``valued`` (and the value after each) and the ``switches``."""
    out: list[str] = []
    skip = False
    for a in argv:
        if skip:
            skip = False
            continue
        if a in valued:
            skip = True
            continue
        if a in switches:
            continue
        out.append(a)
    return out


def safe_name(name: str, limit: int = 40) -> str:
    """``name`` as a DNS-1123 label prefix: lower case, alphanumerics and '-', at most ``limit``."""
    return "".join(c if c.isalnum() else "-" for c in name.lower()).strip("-")[:limit].strip("-") or "kvtune-llm"


def data_parallel_nodes(p: LaunchPick) -> bool:
    """Whether ``p`` is the multi-node form llm-d's chart and KServe's presets run (a LeaderWorkerSet
    of data-parallel vLLM): attention data-parallel over whole nodes (vLLM's TP 1 x DP tp,
    vllm.py), no pipeline stages."""
    return p.multi_node and p.dp_attention and p.pp == 1 and p.gpus_per_replica % p.nodes == 0
