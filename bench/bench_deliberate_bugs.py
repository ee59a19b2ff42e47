"""The deliberate bugs of issue 25, each planted alone in a temporary copy of the repository and run
against the tests that should catch it (default and slow): which tests fail, or that none does.

Each bug is a text substitution in one file; a bug whose text no longer matches the code says so
(the code moved: update the bug, do not drop it). The working tree is never touched.

    python bench/bench_deliberate_bugs.py                 # every bug
    python bench/bench_deliberate_bugs.py --bug preempt-oldest
    python bench/bench_deliberate_bugs.py --json out.json

A bug counts as caught when at least one test fails (or errors, or times out: pytest-timeout) that is
not a golden hash (tests/costmodel/test_sim_golden.py): a golden run that changes says something moved, not
what is wrong.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_mutation import copy_repo  # noqa: E402


@dataclass(frozen=True)
class Bug:
    key: str
    what: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]
    # the same bug where the code has moved: (path, old, new), tried in order when the first does not apply
    elsewhere: tuple[tuple[str, str, str], ...] = ()


BUGS = [
    Bug("rank-most-expensive-first", "simsearch ranks verified configs most expensive first",
        "optimizer/simsearch.py", "return (v.usd_per_hour, fp8_last,", "return (-v.usd_per_hour, fp8_last,",
        ("tests/optimizer/test_simsearch.py", "tests/optimizer/test_search.py", "tests/cli/test_solve.py", "tests/optimizer/test_objective.py",
         "tests/optimizer/test_robust_pick.py", "tests/optimizer/test_deployment_choice.py", "tests/optimizer/test_gpu_choice.py"),
        (("optimizer/objective.py", "return (usd, fp8_last, -good)", "return (-usd, fp8_last, -good)"),)),
    Bug("tie-break-least-goodput", "simsearch's tie-break prefers the least goodput",
        "optimizer/simsearch.py", "fp8_last, -(v.goodput_req_s or 0.0),", "fp8_last, (v.goodput_req_s or 0.0),",
        ("tests/optimizer/test_simsearch.py", "tests/optimizer/test_search.py", "tests/cli/test_solve.py", "tests/optimizer/test_objective.py",
         "tests/optimizer/test_robust_pick.py", "tests/optimizer/test_deployment_choice.py", "tests/optimizer/test_gpu_choice.py"),
        (("optimizer/objective.py", "return (usd, fp8_last, -good)", "return (usd, fp8_last, good)"),)),
    Bug("goodput-skips-saturation", "goodput skips the saturation check on loose SLOs (reports the analytic bound)",
        "costmodel/goodput.py", "            if sat is not None:\n                break\n",
        "            if True:\n                break\n",
        ("tests/costmodel/test_goodput.py", "tests/costmodel/test_goodput.py", "tests/costmodel/test_sim_invariants.py",
         "tests/test_answer_optimality.py")),
    Bug("trtllm-fraction-ignores-draft", "TensorRT-LLM free_gpu_memory_fraction ignores the draft's weights",
        "optimizer/launch/trtllm.py", "free = m.gpu_memory_bytes - m.weight_bytes_per_gpu - m.draft_weight_bytes_per_gpu",
        "free = m.gpu_memory_bytes - m.weight_bytes_per_gpu",
        ("tests/engines/test_launch.py", "tests/costmodel/test_draft_memory.py", "tests/engines/test_launch_disagg.py",
         "tests/engines/test_launch_units.py")),
    Bug("vllm-admits-after-preempting", "vLLM admits in a step that preempted",
        "costmodel/replica.py", "if budget > 0 and waiting and len(running) < cap and not preempted:",
        "if budget > 0 and waiting and len(running) < cap:",
        ("tests/costmodel/test_simulate.py", "tests/costmodel/test_sim_golden.py", "tests/costmodel/test_sim_invariants.py",
         "tests/costmodel/test_replica.py")),
    Bug("allreduce-ignores-prefill", "the TP all-reduce ignores prefill tokens",
        "costmodel/step.py", "self._n_ar * (self._ar_lat + self._ar_s_per_token * n_tokens)",
        "self._n_ar * (self._ar_lat + self._ar_s_per_token * dec_tokens)",
        ("tests/costmodel/test_memory_step.py", "tests/costmodel/test_parallel.py", "tests/costmodel/test_step.py", "tests/costmodel/test_sim_golden.py",
         "tests/measure/test_calibrated_accuracy.py")),
    Bug("preempt-oldest", "preempt the oldest running request instead of the newest",
        "costmodel/replica.py", "v = next(reversed(running))", "v = next(iter(running))",
        ("tests/costmodel/test_simulate.py", "tests/costmodel/test_sim_golden.py", "tests/costmodel/test_sim_invariants.py",
         "tests/costmodel/test_replica.py")),
]


def run_bug(bug: Bug, timeout_s: int) -> dict:
    copy = Path(tempfile.mkdtemp(prefix="kvtune-bug-"))
    t0 = time.perf_counter()
    try:
        copy_repo(copy)
        for path, old, new in ((bug.path, bug.old, bug.new), *bug.elsewhere):
            f = copy / path
            text = f.read_text() if f.exists() else ""
            if text.count(old) == 1:
                f.write_text(text.replace(old, new))
                break
        else:
            return dict(key=bug.key, what=bug.what, applied=False,
                        note=f"the bug's text is not (once) in {bug.path} nor where it moved: the code moved again")
        tests = [t for t in bug.tests if (copy / t).exists()]
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "slow or not slow",
               f"--timeout={timeout_s}", "-rfE", *tests]
        env = dict(os.environ, PYTHONPATH=str(copy), PYTHONDONTWRITEBYTECODE="1")
        r = subprocess.run(["nice", "-n", "19", *cmd], cwd=copy, env=env, capture_output=True, text=True)
        failed = sorted(set(re.findall(r"^(?:FAILED|ERROR) (.+?)(?: - .*)?$", r.stdout, re.M)))
        summary = (r.stdout.strip().splitlines() or [""])[-1]
        caught_by = [t for t in failed if not t.startswith("tests/costmodel/test_sim_golden.py")]
        return dict(key=bug.key, what=bug.what, applied=True, where=path, tests=tests, failed=failed, caught_by=caught_by,
                    caught=bool(caught_by), only_goldens=bool(failed) and not caught_by,
                    timeouts=r.stdout.count("Timeout"), summary=summary, wall_s=round(time.perf_counter() - t0, 1))
    finally:
        shutil.rmtree(copy, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bug", action="append", choices=[b.key for b in BUGS])
    ap.add_argument("--timeout", type=int, default=300, help="per-test timeout, s (pytest-timeout; default 300)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    out = []
    for bug in BUGS:
        if args.bug and bug.key not in args.bug:
            continue
        print(f"--- {bug.key}: {bug.what}", flush=True)
        r = run_bug(bug, args.timeout)
        out.append(r)
        if not r["applied"]:
            print(f"    not applied: {r['note']}")
            continue
        verdict = "CAUGHT" if r["caught"] else ("only by golden hashes" if r["only_goldens"] else "NOT CAUGHT")
        print(f"    {verdict} ({r['summary']}; {r['wall_s']} s)")
        for t in r["caught_by"][:10]:
            print(f"      {t}")
        goldens = len(r["failed"]) - len(r["caught_by"])
        if len(r["caught_by"]) > 10 or goldens:
            print(f"      ... {max(len(r['caught_by']) - 10, 0)} more, and {goldens} golden hash(es)")
    if args.json:
        args.json.write_text(json.dumps(dict(load_average=os.getloadavg()[0], bugs=out), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
