"""kvtune's cost model: hardware, model architectures, memory, step times, calibration, simulation.

Pure: no printing, no file writing, no environment reading. ``optimizer`` builds on it.
"""

from kvtune import __version__  # the one version source (kvtune/__init__.py)

from .calibration import efficiency_for, find_calibration, load_calibration
from .efficiency import IDEAL, Efficiency
from .errors import DoesNotFit, Infeasible, InputError, KvtuneError, ProfileDataMissing
from .estimate import Estimate, estimate
from .hardware import GPU, get_gpu, list_gpus
from .memory import MemoryPlan, plan_memory, weight_bytes
from .models import ModelArch, get_model, list_models, model_from_config
from .step import SpecConfig, StepBreakdown, StepModel, spec_tokens_per_step

__all__ = [
    "GPU", "get_gpu", "list_gpus", "ModelArch", "get_model", "list_models", "model_from_config",
    "MemoryPlan", "plan_memory", "weight_bytes", "SpecConfig", "StepBreakdown", "StepModel",
    "spec_tokens_per_step", "Efficiency", "IDEAL", "efficiency_for", "find_calibration",
    "load_calibration", "Estimate", "estimate", "KvtuneError", "InputError", "DoesNotFit",
    "Infeasible", "ProfileDataMissing", "__version__",
]
