"""A space too large to exhaust (``search.exhaustive_max_configs``): the race covers only the configs
the screen's study sampled, so ``--sampler``, ``--seed`` and ``--trials`` change what is searched;
within the cut-over the race covers the whole lattice whatever they are."""

from __future__ import annotations

import pytest

from kvtune.costmodel.errors import InputError
from kvtune.optimizer.search import SolveContext, workload_digest
from kvtune.optimizer.simsearch import lattice_configs, lattice_size
from kvtune.optimizer.solve import SolveOptions, solve
from tiny_workload import tiny_8b_spec

SEARCH = {"tp": [1, 2, 4], "batch_cap": [8, 256], "kv_dtype": ["bf16", "fp8"], "chunk_tokens": [512, 8192],
          "trials": 12, "seed": 0, "deployment": ["aggregated"]}   # 3 x 6 x 2 x 5 = 180 configs


def spec(**search):
    return tiny_8b_spec({**SEARCH, **search})


def raced(r) -> set[str]:
    return {"-".join(str(v) for v in o.config.values()) for o in r.race}


def test_the_lattice_size_is_the_lattice():
    ctx = SolveContext.build(spec())
    assert lattice_size(ctx) == len(lattice_configs(ctx)) == 180


def test_within_the_cut_over_every_config_is_raced_whatever_the_sampler():
    a = solve(spec(), SolveOptions(seed=0, sampler="tpe"))
    b = solve(spec(), SolveOptions(seed=7, sampler="nsga2", trials=5))
    for r in (a, b):
        assert r.verification.searched == "exhaustive" and r.verification.raced == 180
        assert r.verification.lattice_configs == 180
    assert a.recommendation == b.recommendation and raced(a) == raced(b)


def test_above_it_the_sampler_seed_and_trials_choose_what_is_raced():
    s = spec(exhaustive_max_configs=100)   # 180 configs > 100: sampled
    runs = {(sampler, seed, trials): solve(s, SolveOptions(seed=seed, sampler=sampler, trials=trials))
            for sampler, seed, trials in (("tpe", 0, 12), ("tpe", 1, 12), ("nsga2", 0, 12), ("tpe", 0, 40))}
    for (_, _, trials), r in runs.items():
        v = r.verification
        assert v.searched == "sampled" and v.lattice_configs == 180
        assert 0 < v.raced <= trials and v.raced == len(r.race)   # the study's distinct configs, no more
    sets = [frozenset(raced(r)) for r in runs.values()]
    assert len(set(sets)) == len(sets)   # each flag changed what the simulator raced
    assert len(raced(runs[("tpe", 0, 40)])) > len(raced(runs[("tpe", 0, 12)]))


def test_the_sampled_race_covers_exactly_the_studys_configs():
    r = solve(spec(exhaustive_max_configs=0), SolveOptions(seed=3, trials=20))
    assert r.verification.searched == "sampled" and r.trials.completed == 20
    ctx = SolveContext.build(spec())
    keys = {p.key for p in lattice_configs(ctx)}
    got = {f"tp{o.config['tp']}-b{o.config['batch_cap']}-{o.config['kv_dtype']}-k{o.config['spec_k']}"
           f"-c{o.config['chunk_tokens']}" for o in r.race}
    assert got <= keys and len(got) == r.verification.raced


def test_the_cut_over_is_checked_and_does_not_move_the_screens_study():
    with pytest.raises(InputError, match="search.exhaustive_max_configs"):
        spec(exhaustive_max_configs=-1)
    with pytest.raises(InputError, match="search.exhaustive_max_configs"):
        spec(exhaustive_max_configs="many")
    # the screen's trials are the same either side of it: a study resumes across a change of it
    assert workload_digest(SolveContext.build(spec()), "tpe") == \
        workload_digest(SolveContext.build(spec(exhaustive_max_configs=10)), "tpe")
    assert "exhaustive_max_configs" not in spec().to_dict()["search"]
    assert spec(exhaustive_max_configs=10).to_dict()["search"]["exhaustive_max_configs"] == 10


def test_a_study_made_before_the_cut_over_existed_keeps_its_name():
    """The screen study's name is its workload digest; the field left out of it, a study written by
    kvtune before search.exhaustive_max_configs (24f721f: fd3c51ac02be19d0 for this example) resumes."""
    from pathlib import Path
    from kvtune.optimizer.workload import load_workload
    path = Path(__file__).resolve().parents[2] / "examples" / "chat-llama3.1-8b.yaml"
    assert workload_digest(SolveContext.build(load_workload(str(path))), "tpe") == "fd3c51ac02be19d0"
