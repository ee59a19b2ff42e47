"""Several processes on one storage: the race's simulations shared, one answer, identical to a
single process's. The PostgreSQL test needs the ``pg`` extra (pgserver and psycopg; CI installs
it) and skips cleanly without it."""

import json
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
import yaml
from optuna.trial import TrialState
from pg_helpers import pg_server, pg_url

ROOT = Path(__file__).parent.resolve().parents[1]

WORKLOAD = {"model": "llama-3.1-8b",
            "hardware": {"gpu": "h100-sxm", "gpus_per_node": 8, "usd_per_gpu_hour": 2.0, "max_nodes": 1},
            "workload": {"rate_req_s": 30, "classes": [{"name": "c", "share": 1.0, "input_tokens": 3000,
                                                        "output_tokens": 200}]},
            "slo": {"ttft_ms": 400, "tpot_ms": 30, "attainment": 0.9},
            "search": {"tp": [1, 2], "batch_cap": [16, 64], "kv_dtype": ["bf16", "fp8"],
                       "chunk_tokens": [1024, 4096], "trials": 12, "seed": 0}}


def _solve(tmp_path, name, *args):
    wl = tmp_path / "w.yaml"
    wl.write_text(yaml.safe_dump(WORKLOAD))
    out = tmp_path / f"{name}.json"
    code = ("import sys; from kvtune.optimizer.cli import main; sys.argv[0] = 'kvtune'; main()")
    p = subprocess.run([sys.executable, "-c", code, "solve", str(wl), "--quiet", "--json", str(out), *args],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(out.read_text())


def _sim_study(url, r):
    from kvtune.optimizer.search import make_storage
    from kvtune.optimizer.scaleout import sim_study_name
    st = make_storage(url)
    return (optuna.load_study(study_name=r["study_name"], storage=st),
            optuna.load_study(study_name=sim_study_name(r["study_name"]), storage=st))


def _same_answer(a, b):
    assert a["recommendation"] == b["recommendation"]
    assert a["predicted"] == b["predicted"] and a["verified"] == b["verified"] and a["race"] == b["race"]


def _check_shared(url, one, two, trials):
    screen, sims = _sim_study(url, two)
    # the screen: exactly the trials asked for; the race: each simulation once, as one process ran them
    assert len(screen.get_trials(states=(TrialState.COMPLETE,))) == trials
    done = sims.get_trials(states=(TrialState.COMPLETE,))
    keys = [k for t in done for k in t.user_attrs["claim"]["keys"]]
    assert len(keys) == len(set(keys)) == two["verification"]["work_items"] == one["verification"]["work_items"]
    assert not sims.get_trials(states=(TrialState.RUNNING,))
    assert all(t.user_attrs.get("surplus") for t in sims.get_trials(states=(TrialState.FAIL,)))
    assert len({t.user_attrs["claim"]["pid"] for t in done}) == 2   # both processes simulated
    _same_answer(one, two)


@pytest.mark.slow
def test_two_workers_on_a_journal_give_the_single_process_answer(tmp_path):
    one = _solve(tmp_path, "one", "--jobs", "1")
    url = f"journal:{tmp_path / 'j.log'}"
    two = _solve(tmp_path, "two", "--workers", "2", "--storage", url)
    _check_shared(url, one, two, WORKLOAD["search"]["trials"])


@pytest.mark.slow
def test_two_workers_on_postgresql_give_the_single_process_answer(tmp_path):
    with pg_server() as srv:
        url = pg_url(srv)
        one = _solve(tmp_path, "one", "--jobs", "1")
        two = _solve(tmp_path, "two", "--workers", "2", "--storage", url)
        _check_shared(url, one, two, WORKLOAD["search"]["trials"])


@pytest.mark.slow
def test_workers_without_a_storage_use_a_temporary_journal(tmp_path):
    one = _solve(tmp_path, "one", "--jobs", "1")
    two = _solve(tmp_path, "two", "--workers", "2")
    _same_answer(one, two)
    assert not list(tmp_path.glob("*.log"))   # the temporary journal lives elsewhere and is gone
