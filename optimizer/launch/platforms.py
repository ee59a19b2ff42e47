"""The serving platforms' launch output for one pick, in the launch settings' ``platforms`` key:
NVIDIA Dynamo (dynamo.py), llm-d modelservice values (llmd.py) and KServe (kserve.py), each as the
object (for ``jq``) and as YAML to apply; where a platform cannot run the pick, its entry is the
reason instead (``unsupported``).

A platform runs the workload's engine where it has that engine (Dynamo: vLLM, SGLang, TensorRT-LLM); llm-d and
KServe run vLLM, as does Dynamo for another engine, and the entry's notes say so, since kvtune
simulated that engine's scheduling for this pick.
"""

from __future__ import annotations

from .dynamo import DYNAMO, PlannerTargets, dynamo_graph, planner_inputs
from .dynamo import HF_SECRET as DYNAMO_SECRET
from .dynamo import IMAGES as DYNAMO_ENGINES
from .kserve import KSERVE, llm_inference_service
from .kubernetes import HF_SECRET, dump_yaml
from .llmd import HF_SECRET as LLMD_SECRET
from .llmd import LLMD, llmd_values
from .pick import LaunchPick, Unsupported
from .platform_argv import safe_name
from .shell import comment_block
from .registry import ENGINE_VERSIONS

__all__ = ["platform_launch", "PLATFORMS", "PlannerTargets"]

PLATFORMS = {v.platform: v for v in (DYNAMO, LLMD, KSERVE)}


def _engine_note(platform: str, engine: str | None, runs: str) -> list[str]:
    if (engine or "vllm") == runs:
        return []
    return [f"{PLATFORMS[platform].label} runs {ENGINE_VERSIONS[runs].name} here; kvtune simulated this pick on "
            f"{ENGINE_VERSIONS[engine].name if engine is not None and engine in ENGINE_VERSIONS else engine}, whose scheduling may differ"]


def _entry(doc: dict, head: list[str], key: str = "manifest") -> dict:
    return {"resource": doc, key: comment_block(head) + "\n" + dump_yaml([doc])}


def platform_launch(name: str, engine: str | None, serve: LaunchPick | None = None,
                    prefill: LaunchPick | None = None, decode: LaunchPick | None = None,
                    targets: PlannerTargets | None = None) -> dict:
    """Every platform's output for an aggregated pick (``serve``) or a disaggregated one
    (``prefill`` + ``decode``); ``targets``: what Dynamo's SLA planner is asked to hold."""
    name = safe_name(name)
    out: dict = {"versions": {k: v.to_json() for k, v in PLATFORMS.items()}, "unsupported": {}, "notes": {}}
    first = serve or decode or prefill
    gated = first.gated if first is not None else False
    runs = engine if engine in DYNAMO_ENGINES else "vllm"
    try:
        doc = dynamo_graph(name, runs, serve, prefill, decode)
        notes = _engine_note("dynamo", engine, runs)
        head = [f"{DYNAMO.label}: kubectl apply -f this (needs the Dynamo operator and its CRDs)",
                f"Hugging Face token: kubectl create secret generic {DYNAMO_SECRET} --from-literal=HF_TOKEN=hf_..."
                + (" (required: gated model)" if gated else ""), *notes]
        out["dynamo"] = _entry(doc, head)
        if prefill is not None and decode is not None:
            out["dynamo"]["planner"] = planner_inputs(name, runs, prefill, decode, targets)
        else:
            notes.append(f"{DYNAMO.label}'s SLA planner scales prefill and decode workers: it has no input for "
                         f"an aggregated pick")
        out["notes"]["dynamo"] = notes
    except Unsupported as exc:
        out["unsupported"]["dynamo"] = str(exc)
    try:
        values = llmd_values(serve, prefill, decode, engine)
        notes = _engine_note("llmd", engine, "vllm")
        head = [f"{LLMD.label} chart values: helm install {name} llm-d-modelservice/llm-d-modelservice "
                f"--version {LLMD.version} -f values.yaml",
                f"Hugging Face token: kubectl create secret generic {LLMD_SECRET} --from-literal=HF_TOKEN=hf_..."
                + (" (required: gated model)" if gated else ""),
                "the chart serves behind llm-d's inference gateway (its own chart: llm-d-infra, GAIE)", *notes]
        out["llmd"] = _entry(values, head, "values_yaml")
        out["notes"]["llmd"] = notes
    except Unsupported as exc:
        out["unsupported"]["llmd"] = str(exc)
    try:
        doc = llm_inference_service(name, serve, prefill, decode)
        notes = _engine_note("kserve", engine, "vllm")
        head = [f"{KSERVE.label}: kubectl apply -f this (needs KServe's LLMInferenceService controller)",
                f"Hugging Face token: kubectl create secret generic {HF_SECRET['name']} "
                f"--from-literal={HF_SECRET['key']}=hf_..." + (" (required: gated model)" if gated else ""), *notes]
        out["kserve"] = _entry(doc, head)
        out["notes"]["kserve"] = notes
    except Unsupported as exc:
        out["unsupported"]["kserve"] = str(exc)
    return out
