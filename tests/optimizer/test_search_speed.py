"""The search's speed-ups keep its answers bit for bit (issue 22, must-show 7): the screen's memo,
the forked pool the disaggregated search and robust checks keep, the race's look-ahead probes."""

from __future__ import annotations

import dataclasses
import os

import pytest

from kvtune.optimizer.disagg import ForkPool
from kvtune.optimizer.screen import screen
from kvtune.optimizer.search import SolveContext
from kvtune.optimizer.simsearch import lattice_configs
from tiny_workload import tiny_8b_spec


def _spec(**over):
    return tiny_8b_spec({"tp": [1, 2], "batch_cap": [1, 512], "kv_dtype": ["bf16", "fp8"],
                         "chunk_tokens": [512, 8192], "trials": 10, "seed": 0}, **over)


def test_the_screen_memo_gives_the_same_screen_bit_for_bit():
    """Every config of a lattice (batch caps 1 .. 512, so some at their cap, some below), screened
    with one memo per step model in lattice order and alone: the same figures, to the last bit."""
    ctx = SolveContext.build(_spec())
    memos: dict = {}
    n = 0
    for p in lattice_configs(ctx):
        step = ctx.step(p["tp"], p["kv_dtype"], p["spec_k"])
        if isinstance(step, Exception):
            continue
        shared = screen(step, ctx.stats, p["batch_cap"], p["chunk_tokens"], memos.setdefault(id(step), {}))
        alone = screen(step, ctx.stats, p["batch_cap"], p["chunk_tokens"])
        assert repr(shared) == repr(alone), p
        n += 1
    assert n > 20 and any(m for m in memos.values())


def test_fork_pool_maps_in_order_on_processes_and_in_this_process_when_one_job():
    state = {"base": 10}   # reaches the processes by the fork: a closure over it works

    def fn(x):
        return state["base"] + x, os.getpid()
    with ForkPool(fn, 2) as pool:
        assert pool.active
        got = pool.map([1, 2, 3, 4])
        assert [v for v, _ in got] == [11, 12, 13, 14]
        assert all(pid != os.getpid() for _, pid in got)
        assert pool.map([5]) == [(15, os.getpid())]     # one item: no fork needed
    with ForkPool(fn, 1) as pool:
        assert not pool.active and pool.map([1, 2]) == [(11, os.getpid()), (12, os.getpid())]


@pytest.mark.slow
def test_the_disaggregated_answer_is_the_same_on_one_or_two_processes():
    """Rounds 2 and 3 of the disaggregated search and the robust check's draws on a forked pool:
    the same search, verification and robust pick as on one process."""
    from kvtune.optimizer.deployment_choice import disaggregated_answer
    spec = _spec(workload={"rate_req_s": 6, "classes": [{"name": "c", "share": 1.0, "input_tokens": 6000,
                                                        "output_tokens": 200}]},
                 slo={"ttft_ms": 1500, "tpot_ms": 30, "attainment": 0.9})
    a = disaggregated_answer(SolveContext.build(spec), jobs=1)
    b = disaggregated_answer(SolveContext.build(spec), jobs=2)
    assert a.verified is not None and a.verified.draws is not None
    strip = [{k: v for k, v in s.items() if k != "wall_s"} for s in a.searches]
    assert strip == [{k: v for k, v in s.items() if k != "wall_s"} for s in b.searches]
    assert a.pick == b.pick and a.verified is not None and b.verified is not None
    timing = ("sim_wall_s",)   # the simulation's own wall time, not a result
    assert a.verified.at is not None and b.verified.at is not None
    assert {k: v for k, v in a.verified.at.items() if k not in timing} == \
        {k: v for k, v in b.verified.at.items() if k not in timing}
    assert dataclasses.replace(a.verified, at=None) == dataclasses.replace(b.verified, at=None)
