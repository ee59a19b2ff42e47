"""``EngineVersion``: the release of an engine (or router) whose own source kvtune's launch lines
were read from, and the routers in front of a disaggregated deployment with their flags.

Each engine's version and flags live in its home module (``vllm.py``: ``VERSION``, ``FLAGS``);
``registry.FLAGS`` is the contract the tests hold the generated commands to: a flag that is not in
it, with the source file and section it was read from, is never emitted.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["EngineVersion", "ROUTER_VERSIONS", "ROUTER_IMAGES", "ROUTER_FLAGS"]


@dataclass(frozen=True)
class EngineVersion:
    engine: str          # kvtune's name for it
    name: str            # how people call it
    version: str
    source: str          # where the flags below were read
    image: str           # pinned container image of that version ("" where none is published)

    def to_json(self) -> dict:
        return {"engine": self.engine, "name": self.name, "version": self.version, "source": self.source,
                "image": self.image}

    @property
    def label(self) -> str:
        return f"{self.name} {self.version}"


# the routers in front of a disaggregated deployment (optimizer/launch/disagg.py); their flags were
# read from the installed wheel's own --help
ROUTER_VERSIONS: dict[str, EngineVersion] = {
    "vllm-router": EngineVersion(
        "vllm-router", "vllm-router", "0.1.17",
        "vllm-router 0.1.17 wheel (PyPI, vllm-project/router): vllm-router --help", ""),
    "sglang-router": EngineVersion(
        "sglang-router", "sglang-router", "0.3.2",
        "sglang-router 0.3.2 wheel (PyPI): python -m sglang_router.launch_router --help (sglang_router/router_args.py)",
        ""),
}

# the container image each router runs from in a Kubernetes manifest: one that already holds the
# router, so nothing is installed when the pod starts.
# - vllm-router: Docker Hub vllm/vllm-router carries nightly-<date>-<commit> tags (public launch
#   scripts pin this one), but vllm-project/router's .buildkite/scripts/cleanup-nightly-router-builds.sh
#   keeps only the newest 14 of them, so a dated pin stops pulling about two weeks after its date; its
#   release pipeline can also publish vX.Y.Z and latest (.buildkite/README.md: manually gated), and
#   whether v0.1.17 was published is not verified here: the manifest says all this;
# - sglang-router: lmsysorg/sglang builds and installs sgl-router from the same source tree
#   (sglang docker/Dockerfile, "Build and install sgl-router"), so the pinned engine image holds it.
ROUTER_IMAGES: dict[str, str] = {
    "vllm-router": "vllm/vllm-router:nightly-20260710-b93cbcb",
    "sglang-router": "lmsysorg/sglang:v0.5.23",
}

# router flag -> where its --help defines it
ROUTER_FLAGS: dict[str, dict[str, str]] = {
    "vllm-router": {
        "--vllm-pd-disaggregation": "vllm-router --help (PD mode)",
        "--policy": "vllm-router --help (random, round_robin, cache_aware, ...)",
        "--prefill": "vllm-router --help (--prefill URL [BOOTSTRAP_PORT], repeated per prefill server)",
        "--decode": "vllm-router --help (--decode URL, repeated per decode server)",
        "--host": "vllm-router --help",
        "--port": "vllm-router --help",
    },
    "sglang-router": {
        "--pd-disaggregation": "launch_router --help (PD mode)",
        "--policy": "launch_router --help (random, round_robin, cache_aware, power_of_two, manual)",
        "--prefill": "launch_router --help (--prefill URL [BOOTSTRAP_PORT], repeated per prefill server)",
        "--decode": "launch_router --help (--decode URL, repeated per decode server)",
        "--host": "launch_router --help",
        "--port": "launch_router --help (default 30000)",
    },
}
