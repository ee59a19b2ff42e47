"""What kvtune knows about one serving engine, in one record (``Engine``); the registry in
``costmodel.engines`` holds one per engine."""

from __future__ import annotations

from dataclasses import dataclass

from .capabilities import Capabilities
from .policies import Admission, Scheduling
from ..files import profiles_path

__all__ = ["Engine"]


@dataclass(frozen=True)
class Engine:
    name: str                  # as --engine, the workload's engine: and profile rows name it
    display_name: str          # as a person writes it
    version: str               # the engine version whose source the policies follow
    scheduling: Scheduling     # its default scheduler (what one step carries)
    admission: Admission       # its admission rule (room the pool must hold for a new request)
    # calibration: how ``kvtune calibrate`` fits this engine's rows (optimizer.calibrate)
    fit_ttft_stage: bool = False   # a separate TTFT stage (front end and prefill overheads)
    fit_ttft_joint: bool = False   # TTFT fitted jointly with throughput
    fit_pool_stage: bool = False   # the KV pool fitted on its pool-bound runs
    staggered_clients: bool = False  # its benchmark clients start staggered (closed-loop rows)
    # disaggregated serving (costmodel.deployment): whether the prefill replica sends each finished
    # prompt chunk's KV while it computes the next one (else the whole KV after the prompt is done),
    # and whether the first output token comes from the prefill replica with the KV (else the
    # decode replica computes it in one step of its batch, recomputing the last prompt token)
    kv_sent_per_chunk: bool = False
    first_token_from_prefill: bool = True
    # what kvtune can launch on the version its launch settings target (KV dtypes, speculative
    # methods, weight formats, deployment kinds, multi-node): costmodel.engines.capabilities
    capabilities: Capabilities | None = None

    @property
    def prefill_first(self) -> bool:
        """Whether its default scheduler runs prefill-only steps (``SimConfig.prefill_first``)."""
        return not self.scheduling.decodes_with_prefill

    @property
    def output_reserve(self) -> bool:
        """Whether its admission holds room for outputs (``SimConfig.output_reserve``)."""
        return self.admission.varies_per_step

    def calibration_names(self, gpu: str) -> list[str]:
        """Shipped calibration names to try for this engine on ``gpu``, most specific first."""
        return [f"{gpu}-{self.name}"]

    def default_calibration(self, gpu: str) -> str:
        """The calibration name ``--engine`` selects on ``gpu`` (``profiles/calibrations/NAME.yaml``):
        the engine's own where one ships, else the GPU's (``calibration.find_calibration``'s order)."""
        for name in self.calibration_names(gpu):
            if profiles_path("calibrations", f"{name}.yaml").exists():
                return name
        return gpu
