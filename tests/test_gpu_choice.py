"""Issue 16 item 4: the GPU type as a search dimension (hardware.gpu lists several, each priced)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from kvtune.costmodel.errors import InputError
from solve_fakes import solve_kinds, solve_types
from kvtune.optimizer.result import SolveResult, TrialCounts, VerificationCounts
from kvtune.optimizer.workload import load_workload_dict

ROOT = Path(__file__).resolve().parents[1]


def _infeasible(reason: str) -> SolveResult:
    """A solve that found nothing, with no evidence: what the outer loop reads of a type's answer."""
    return SolveResult(kvtune_version="0", seed=0, workload_seed=0, sampler="tpe", source="test",
                       objective="min_cost", study_name="s", target_rate_req_s=1.0,
                       trials=TrialCounts(completed=0, feasible=0),
                       verification=VerificationCounts(configs=0, simulations=0, work_items=0, outcomes={}),
                       status="infeasible", verified=(), race=(), reason=reason)


def _doc(**hw):
    d = yaml.safe_load((ROOT / "examples" / "rag-llama3.1-70b.yaml").read_text())
    d["hardware"].update(hw)
    return d


def test_list_with_a_price_map_and_with_one_price():
    s = load_workload_dict(_doc(gpu=["h100-sxm", "h200"], usd_per_gpu_hour={"h100-sxm": 3.0, "h200": 3.8}))
    assert s.hardware.choices == (("h100-sxm", 3.0), ("h200", 3.8))
    assert s.hardware.gpu == "h100-sxm" and s.hardware.usd_per_gpu_hour == 3.0
    s = load_workload_dict(_doc(gpu=["h200", "b200"], usd_per_gpu_hour=4.0))
    assert s.hardware.choices == (("h200", 4.0), ("b200", 4.0))
    one = load_workload_dict(_doc(gpu="h100-sxm", usd_per_gpu_hour=3.0))  # the scalar forms still work
    assert one.hardware.choices == ()


@pytest.mark.parametrize("hw, needle", [
    (dict(gpu=["h100-sxm", "h200"], usd_per_gpu_hour={"h100-sxm": 3.0}), "hardware.usd_per_gpu_hour.h200: missing"),
    (dict(gpu=["h100-sxm"], usd_per_gpu_hour={"h100-sxm": 3.0, "b200": 5.0}), "hardware.usd_per_gpu_hour.b200"),
    (dict(gpu=["h100-sxm", "nope"], usd_per_gpu_hour=3.0), "hardware.gpu[1]"),
    (dict(gpu=["h100-sxm", "h100"], usd_per_gpu_hour=3.0), "listed twice"),
    (dict(gpu="h100-sxm", usd_per_gpu_hour={"h100-sxm": 3.0}), "needs hardware.gpu to list"),
    (dict(gpu=["h200", "h100-sxm"], usd_per_gpu_hour={"h200": -1, "h100-sxm": 3.0}), "hardware.usd_per_gpu_hour.h200"),
])
def test_bad_choices_name_the_key(hw, needle):
    with pytest.raises(InputError) as exc:
        load_workload_dict(_doc(**hw))
    assert needle in str(exc.value)


def test_fp8_weights_refuse_a_gpu_without_fp8_in_the_list():
    d = _doc(gpu=["h100-sxm", "a100"], usd_per_gpu_hour=2.0)
    d["weights"] = "fp8"
    with pytest.raises(InputError, match=r"hardware.gpu\[1\].*no FP8"):
        load_workload_dict(d)


@pytest.mark.slow
def test_the_cheapest_type_wins_and_the_others_say_why():
    spec = load_workload_dict(_doc(gpu=["h100-sxm", "h200", "a100"],
                                   usd_per_gpu_hour={"h100-sxm": 3.0, "h200": 3.8, "a100": 1.8}))
    r = solve_kinds(spec, trials=20)
    rows = r.gpu_choice
    assert [g.gpu for g in rows] and {g.gpu for g in rows} == {"h100-sxm", "h200", "a100-80gb"}
    ok = [g for g in rows if g.status == "ok"]
    assert ok and rows[0].why == "chosen"
    assert r.recommendation.gpu == rows[0].gpu
    assert rows[0].usd_per_hour == min(g.usd_per_hour for g in ok)
    for g in rows[1:]:
        assert g.why and g.why != "chosen"
        if g.status == "ok":
            assert g.usd_per_hour >= rows[0].usd_per_hour
            assert g.usd_per_hour == pytest.approx(g.gpus * g.usd_per_gpu_hour)


def test_outer_loop_passes_each_type_and_its_price():
    spec = load_workload_dict(_doc(gpu=["h100-sxm", "h200"], usd_per_gpu_hour={"h100-sxm": 3.0, "h200": 5.0}))
    seen = []

    def fake(one, **kw):
        seen.append((one.hardware.gpu, one.hardware.usd_per_gpu_hour, one.hardware.choices, kw.get("study_name")))
        return _infeasible(f"nothing on {one.hardware.gpu}")

    r = solve_types(spec, fake, study_name="s")
    assert seen == [("h100-sxm", 3.0, (), "s-h100-sxm"), ("h200", 5.0, (), "s-h200")]
    assert r.status == "infeasible" and all("no config meets" in g.why for g in r.gpu_choice)
