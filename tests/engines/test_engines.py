"""The engine registry (costmodel.engines): one place that the simulator, fit, calibrate, the
engine model and the CLI read."""

from __future__ import annotations

import pytest

from kvtune.costmodel import calibration, fit
from kvtune.costmodel.files import profiles_path
from kvtune.costmodel.engines import (ENGINE_NAMES, REGISTRY, MixedChunkedPrefill, OutputReserveAdmission, PrefillFirst,
                               PromptAdmission, admission_for, get_engine, scheduling_for)
from kvtune.costmodel.errors import InputError
from kvtune.costmodel.hardware import get_gpu
from kvtune.optimizer import calibrate
from kvtune.optimizer.cli import main
from kvtune.optimizer.step_factory import StepFactory


def test_every_engine_is_described_in_one_record():
    assert ENGINE_NAMES == ("vllm", "sglang", "trtllm", "llamacpp")
    for name, e in REGISTRY.items():
        assert e.name == name and e.display_name and e.version
        # its default calibration on the H100 ships with kvtune
        assert profiles_path("calibrations", f"{e.default_calibration('h100-sxm')}.yaml").exists()
    assert [REGISTRY[n].display_name for n in ENGINE_NAMES] == ["vLLM", "SGLang", "TensorRT-LLM",
                                                                "llama.cpp llama-server"]
    assert REGISTRY["llamacpp"].default_calibration("h100-sxm") == "h100-sxm"  # none of its own ships
    with pytest.raises(InputError, match="engine must be one of vllm, sglang, trtllm, llamacpp"):
        get_engine("lmdeploy")


def test_policies_of_each_engine():
    v, s, t = REGISTRY["vllm"], REGISTRY["sglang"], REGISTRY["trtllm"]
    assert isinstance(v.scheduling, MixedChunkedPrefill) and isinstance(v.admission, PromptAdmission)
    assert isinstance(s.scheduling, PrefillFirst) and isinstance(s.admission, OutputReserveAdmission)
    assert isinstance(t.scheduling, MixedChunkedPrefill) and isinstance(t.admission, PromptAdmission)
    # the token budget: decodes count against it when mixed, not in a prefill-only step
    assert v.scheduling.prefill_budget(8192, 10, 6) == 8192 - 60
    assert s.scheduling.prefill_budget(8192, 10, 6) == 8192
    # SimConfig's flags name the same policies
    assert type(scheduling_for(True)) is PrefillFirst and type(scheduling_for(False)) is MixedChunkedPrefill
    assert type(admission_for(True)) is OutputReserveAdmission and type(admission_for(False)) is PromptAdmission


def test_fit_calibrate_engine_model_and_cli_read_the_registry():
    assert calibration.ENGINES == ENGINE_NAMES
    assert fit.PREFILL_FIRST_ENGINES == {n for n, e in REGISTRY.items() if e.prefill_first} == {"sglang"}
    assert fit.OUTPUT_RESERVE_ENGINES == {n for n, e in REGISTRY.items() if e.output_reserve} == {"sglang"}
    assert calibrate.STAGGERED_ENGINES == ("trtllm", "vllm")
    assert calibrate.TTFT_STAGE_ENGINES == ("trtllm",) and calibrate.TTFT_JOINT_ENGINES == ("sglang",)
    gpu = get_gpu("h100-sxm")
    for name in ENGINE_NAMES:
        em = StepFactory.build(gpu, engine=name)
        assert em.display_name == REGISTRY[name].display_name
        assert em.default_calibration == (f"h100-sxm-{name}" if name != "llamacpp" else "h100-sxm")
        assert em.sim_config(64, 2048).output_reserve == REGISTRY[name].output_reserve
    assert StepFactory.build(gpu).default_calibration is None
    from kvtune.costmodel.closed_loop import STAGGERED_ENGINES
    assert STAGGERED_ENGINES == {"vllm", "trtllm"}
    for cmd in ("simulate", "goodput", "estimate", "calibrate", "validate"):
        opt = next(p for p in main.commands[cmd].params if p.name == "engine")
        assert tuple(opt.type.choices) == ENGINE_NAMES
