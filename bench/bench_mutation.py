"""Mutation testing of the core that decides the answer: the kill rate per module (mutmut).

For each module below, mutmut rewrites the module into mutants (one small change each: an
operator, a number, a comparison, a dropped argument) and runs the tests that exercise it against
every mutant; a mutant the tests still pass "survived". The kill rate is what share of the
mutants the tests catch.

Each module runs in its own temporary copy of the repository (so runs never collide and the
working tree is never touched), one module at a time, under ``nice``. The copy is configured with
``[tool.mutmut]`` from pyproject.toml (shared settings) plus the module's own ``source_paths`` and
test selection from ``MODULES`` here.

The package is ``kvtune``, whose ``kvtune/costmodel``, ``kvtune/optimizer`` and
``kvtune/profiles`` are links to the root folders. mutmut copies ``kvtune/`` with the links
dereferenced, so a module is mutated through its package path (``kvtune/costmodel/memory.py``):
mutating ``costmodel/memory.py`` would leave the tests importing an unmutated copy and every
mutant would "survive". ``--check-planted`` proves the wiring: it plants one mutant the tests
must kill and fails unless they do.

A survivor is either explained in ``bench/mutation_equivalents.yaml`` (why it is equivalent or
cannot matter) or listed as UNEXPLAINED in the report.

    python bench/bench_mutation.py                      # every module, all mutants (an hour or more)
    python bench/bench_mutation.py --module costmodel/memory.py
    python bench/bench_mutation.py --sample 6           # a deterministic sample per module (CI report)
    python bench/bench_mutation.py --check-planted      # the wiring check only

A full run writes bench/RESULTS-mutation.json and the generated block of bench/RESULTS-mutation.md
(the hand-written parts stay); a ``--sample`` run, or one given ``--json``, writes only what
``--json``/``--md`` name.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
RESULTS_JSON = ROOT / "bench" / "RESULTS-mutation.json"
RESULTS_MD = ROOT / "bench" / "RESULTS-mutation.md"
EQUIVALENTS = ROOT / "bench" / "mutation_equivalents.yaml"
BEGIN, END = "<!-- bench_mutation: begin (generated) -->", "<!-- bench_mutation: end -->"

# module (path from the repository root) -> the tests that exercise it (pytest paths or node ids).
# Kept to the tests that call the module in-process and run in seconds: every mutant runs the
# selected tests that reach its function, and a subprocess (the CLI) would import the unmutated
# package.
MODULES: dict[str, list[str]] = {
    "costmodel/memory.py": ["tests/costmodel/test_memory_step.py", "tests/costmodel/test_draft_memory.py", "tests/costmodel/test_fp8_physics.py",
                            "tests/costmodel/test_parallel.py", "tests/costmodel/test_models.py", "tests/costmodel/test_memory.py"],
    "costmodel/models.py": ["tests/costmodel/test_models.py", "tests/costmodel/test_memory_step.py", "tests/costmodel/test_parallel.py",
                            "tests/costmodel/test_fp8_physics.py"],
    "costmodel/parallel.py": ["tests/costmodel/test_parallel.py", "tests/costmodel/test_memory_step.py"],
    "costmodel/step.py": ["tests/costmodel/test_memory_step.py", "tests/costmodel/test_fp8_physics.py", "tests/costmodel/test_parallel.py",
                          "tests/costmodel/test_draft_memory.py", "tests/costmodel/test_simulate.py", "tests/costmodel/test_step.py"],
    "costmodel/replica.py": ["tests/costmodel/test_simulate.py",
                             "tests/costmodel/test_sim_invariants.py::test_every_simulated_result_is_whole_and_finite",
                             "tests/costmodel/test_sim_invariants.py::test_speculation_with_huge_outputs_stays_small_in_memory",
                             "tests/costmodel/test_sim_never_fit.py", "tests/engines/test_engines.py", "tests/costmodel/test_replica.py",
                             "tests/costmodel/test_deployment.py",   # a decode pool's replica: KV that arrives
                             ],
    "costmodel/goodput.py": ["tests/costmodel/test_goodput.py", "tests/costmodel/test_sim_invariants.py", "tests/costmodel/test_sim_never_fit.py"],
    "costmodel/deployment.py": ["tests/costmodel/test_deployment.py"],
    # the race, verification and the answer: their own unit tests on a fake engine whose answer is known by hand
    # (tests/race_fakes.py), milliseconds each, then the in-process tests of the whole search
    "optimizer/simsearch.py": ["tests/optimizer/test_simsearch.py", "tests/optimizer/test_objective.py",
                               "tests/optimizer/test_pruner.py"],
    "optimizer/pruner.py": ["tests/optimizer/test_pruner.py", "tests/optimizer/test_simsearch.py"],
    "optimizer/verify.py": ["tests/optimizer/test_verify.py", "tests/optimizer/test_simsearch.py"],
    "optimizer/recommend.py": ["tests/optimizer/test_recommend.py", "tests/optimizer/test_search.py", "tests/optimizer/test_simsearch.py",
                               "tests/optimizer/test_multinode_solve.py"],
    "optimizer/objective.py": ["tests/optimizer/test_objective.py", "tests/optimizer/test_simsearch.py"],
    "optimizer/deployment_choice.py": ["tests/optimizer/test_deployment_choice.py"],
    "optimizer/gpu_choice.py": ["tests/optimizer/test_gpu_choice.py",
                                "tests/optimizer/test_deployment_choice.py"],
    # with each engine's home (its adapter and read-back): the shared engine suite and the adapters' tests
    "optimizer/launch": ["tests/engines/test_launch.py", "tests/engines/test_launch_disagg.py", "tests/engines/test_launch_contracts.py",
                         "tests/engines/test_capabilities.py", "tests/engines/test_launch_units.py",
                         "tests/engines/test_engine_suite.py", "tests/engines/test_tune_adapters.py",
                         "tests/engines/test_platforms.py"],   # Dynamo, llm-d and KServe: launch/dynamo.py, llmd.py, ...
}
# Never selected: the golden runs (tests/costmodel/test_sim_golden.py) kill any change by its hash without
# saying what is wrong; a mutant counts as killed only by a test that checks a property or a value.

# The planted bug --check-planted expects the tests to catch: KV bytes per token doubled.
PLANT_MODULE = "costmodel/models.py"
PLANT_RE = re.compile(r"def kv_bytes_per_token\(self, kv_dtype: str\) -> int:")


def package_path(module: str) -> str:
    """The path mutmut must mutate: through the kvtune package (see the module docstring)."""
    return f"kvtune/{module}"


def mutated_files(module: str) -> list[str]:
    p = ROOT / module
    if p.is_dir():
        return sorted(package_path(str(f.relative_to(ROOT))) for f in p.rglob("*.py"))
    return [package_path(module)]


# --- the temporary copy ---------------------------------------------------------------------------------------

def copy_repo(dst: Path) -> None:
    """The files git sees (tracked and untracked-not-ignored), links kept as links."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                         capture_output=True, check=True).stdout.decode()
    for rel in sorted(set(filter(None, out.split("\0")))):
        src, tgt = ROOT / rel, dst / rel
        if not src.is_symlink() and not src.exists():
            continue   # deleted in the working tree
        tgt.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            os.symlink(os.readlink(src), tgt)
        elif src.is_file():
            shutil.copy2(src, tgt)


def _toml_value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"cannot write {v!r} as TOML")


# mutmut settings a run overrides (main fills it from --timeout-multiplier / --timeout-constant). mutmut 3.8.1
# stops a mutant's tests after (estimated + timeout_constant) x timeout_multiplier s of wall time (and twice that
# of CPU time; mutmut/__main__.py and workers/isolation.py), its estimate being the summed measured durations of
# the tests that reach the mutated function; defaults 15 and 1 s. A mutant stopped there counts as a timeout.
CONFIG_OVERRIDES: dict = {}


def base_config() -> dict:
    import tomllib
    cfg = dict(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"].get("mutmut", {}))
    return {**cfg, **CONFIG_OVERRIDES}


def write_config(dst: Path, module: str | list[str], tests: list[str]) -> dict:
    """pyproject.toml of the copy: [tool.mutmut] = the shared settings + the module's (modules') paths and tests."""
    cfg = base_config()
    cfg["source_paths"] = [package_path(m) for m in ([module] if isinstance(module, str) else module)]
    cfg["pytest_add_cli_args_test_selection"] = list(tests)
    text = (dst / "pyproject.toml").read_text()
    text = re.sub(r"(?ms)^\[tool\.mutmut\]\n.*?(?=^\[|\Z)", "", text)
    text = text.rstrip() + "\n\n[tool.mutmut]\n" + "".join(f"{k} = {_toml_value(v)}\n" for k, v in cfg.items())
    (dst / "pyproject.toml").write_text(text)
    return cfg


@contextlib.contextmanager
def in_dir(path: Path):
    old = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(old)


def enumerate_mutants(copy: Path, module: str) -> list[str]:
    """Every mutant name mutmut will make of ``module`` (mutmut's own generator, no tests run)."""
    from mutmut.configuration import reset_config
    from mutmut.mutation.file_mutation import mutate_file_contents
    from mutmut.utils.format_utils import get_mutant_name
    names: list[str] = []
    with in_dir(copy):
        reset_config()
        for f in mutated_files(module):
            mf = mutate_file_contents(f, Path(f).read_text())
            names += [get_mutant_name(Path(f), n) for n in mf.mutant_names]
        reset_config()
    return names


def sample(names: list[str], n: int, skip: int = 0) -> list[str]:
    """A deterministic sample: the ``n`` names with the smallest SHA-256 (stable while the function is).
    ``skip``: the ``n`` after the first ``skip`` of that order (a fresh sample, disjoint from ``--sample skip``:
    mutants nobody looked at while writing the tests)."""
    return sorted(sorted(names, key=lambda s: hashlib.sha256(s.encode()).hexdigest())[skip:skip + n])


# --- running and reading --------------------------------------------------------------------------------------

def mutmut_exe() -> str:
    exe = Path(sys.executable).parent / "mutmut"
    if not exe.exists():
        sys.exit("Error: mutmut is not installed in this environment (pip install -e '.[test]')")
    return str(exe)


def run_mutmut(copy: Path, names: list[str], max_children: int, log: Path, timeout_s: float | None) -> int:
    cmd = ["nice", "-n", "19", mutmut_exe(), "run", "--max-children", str(max_children), *names]
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    with open(log, "w") as out:
        try:
            return subprocess.run(cmd, cwd=copy, stdout=out, stderr=subprocess.STDOUT, env=env,
                                  timeout=timeout_s).returncode
        except subprocess.TimeoutExpired:
            out.write(f"\n[bench_mutation] stopped after {timeout_s} s\n")
            return -1


def read_results(copy: Path, module: str) -> dict[str, str]:
    """mutant name -> mutmut's status (killed, survived, timeout, no tests, not checked, ...)."""
    from mutmut.stats import status_by_exit_code
    out: dict[str, str] = {}
    for f in mutated_files(module):
        meta = copy / "mutants" / (f + ".meta")
        if meta.exists():
            for k, code in json.loads(meta.read_text())["exit_code_by_key"].items():
                out[k] = status_by_exit_code[code]
    return out


def mutant_diff(copy: Path, name: str, module: str) -> str:
    from mutmut.configuration import reset_config
    from mutmut.mutation.diff_apply import find_mutant, get_diff_for_mutant
    with in_dir(copy):
        reset_config()
        try:
            return get_diff_for_mutant(name, path=find_mutant(name).path)
        finally:
            reset_config()


def function_of(name: str) -> str:
    """'kvtune.costmodel.step.xǁStepModelǁdecode__mutmut_3' -> 'StepModel.decode'."""
    fn = name.rpartition(".")[2].partition("__mutmut_")[0]
    if fn.startswith("x_"):
        return fn[2:]
    return ".".join(p for p in fn[1:].split("ǁ") if p)


def changed_lines(diff: str) -> tuple[str, str]:
    lines = diff.splitlines()
    minus = [ln[1:].strip() for ln in lines if ln.startswith("-") and not ln.startswith("---")]
    plus = [ln[1:].strip() for ln in lines if ln.startswith("+") and not ln.startswith("+++")]
    return "\n".join(minus), "\n".join(plus)


def load_equivalents() -> list[dict]:
    if not EQUIVALENTS.exists():
        return []
    return yaml.safe_load(EQUIVALENTS.read_text()) or []


def _norm(s: object) -> str:
    return re.sub(r"\s+", " ", str(s)).strip()


def explain(module: str, function: str, before: str, after: str, equivalents: list[dict]) -> str | None:
    norm = _norm
    for e in equivalents:
        if e["module"] != module or e["function"] != function:
            continue
        if "after_regex" in e:     # a family of mutants: the mutated line(s) match the pattern
            if re.fullmatch(e["after_regex"], norm(after)) and re.fullmatch(e.get("before_regex", ".*"), norm(before)):
                return str(e["why"])
        elif "before" not in e or (norm(e["before"]) == norm(before) and norm(e["after"]) == norm(after)):
            return str(e["why"])   # an entry without before/after covers the whole function
    return None


KILLED = ("killed", "timeout")   # a timeout is a mutant the tests stopped (it looped or slowed >15x)


def summarise(module: str, statuses: dict[str, str], copy: Path, equivalents: list[dict]) -> dict:
    counts: dict[str, int] = {}
    for s in statuses.values():
        counts[s] = counts.get(s, 0) + 1
    tested = sum(v for k, v in counts.items() if k not in ("not checked", "skipped"))
    caught = sum(counts.get(k, 0) for k in KILLED)
    survivors = []
    for name, s in sorted(statuses.items()):
        if s in KILLED or s in ("not checked", "skipped"):
            continue
        diff = mutant_diff(copy, name, module)
        before, after = changed_lines(diff)
        fn = function_of(name)
        survivors.append(dict(name=name, status=s, function=fn, before=before, after=after,
                              why=explain(module, fn, before, after, equivalents)))
    return dict(module=module, mutants=len(statuses), tested=tested, killed=counts.get("killed", 0),
                timeout=counts.get("timeout", 0), survived=counts.get("survived", 0),
                no_tests=counts.get("no tests", 0), other=tested - caught - counts.get("survived", 0)
                - counts.get("no tests", 0),
                kill_rate_pct=round(100.0 * caught / tested, 1) if tested else None, survivors=survivors)


def untested_by_order(copy: Path, module: str, names: list[str], n_tested: int, tested_names: set[str],
                      max_children: int, log_dir: Path) -> list[str]:
    """The mutants an earlier run of every mutant never reached, for a results file that does not list them
    (only its survivors and how many it tested). mutmut runs the mutants fastest first (stably sorted by the
    summed measured time of the tests that reach each one's function: mutmut/__main__.py, _run), so a run stopped
    after ``n_tested`` reached the first ``n_tested`` of that order. The timings come from mutmut's stats file
    (mutants/mutmut-stats.json), collected here by running one earlier survivor (``tested_names``) and kept in the
    copy for the run that follows. They are measured again, so the order near the cut may differ from the
    earlier run's: an earlier survivor after the cut (it was tested) is dropped and counted in the log."""
    from mutmut.utils.format_utils import mangled_name_from_mutant_name
    warm = sorted(tested_names)[:1]
    if not warm:
        sys.exit(f"Error: --rerun-untested: {module}: the earlier run names no mutant to collect stats with")
    run_mutmut(copy, warm, max_children, log_dir / (module.replace("/", "_") + ".stats.log"), None)
    stats = json.loads((copy / "mutants" / "mutmut-stats.json").read_text())
    tests_of, dur = stats["tests_by_mangled_function_name"], stats["duration_by_test"]

    def est(n: str) -> float:
        return sum(dur.get(t, 0.0) for t in tests_of.get(mangled_name_from_mutant_name(n), []))

    order = sorted(names, key=est)
    rest = order[n_tested:]
    moved = [n for n in rest if n in tested_names]
    with open(log_dir / (module.replace("/", "_") + ".untested.txt"), "w") as f:
        f.write(f"{len(order)} mutants in mutmut's order; untested = the {len(rest)} after the first {n_tested}; "
                f"{len(moved)} earlier survivors among them dropped: {moved}\n")
        f.writelines(f"{est(n):.3f} {n}\n" for n in order)
    return [n for n in rest if n not in tested_names]


def run_module(module: str, tests: list[str], n_sample: int | None, max_children: int, timeout_s: float | None,
               keep: bool, log_dir: Path, plant: bool = False, only: list[str] | None = None,
               untested_of: tuple[int, set[str]] | None = None) -> dict:
    t0 = time.perf_counter()
    missing = [t for t in tests if not (ROOT / t.split("::")[0]).exists()]
    if missing:
        print(f"  warning: {module}: no such test file {', '.join(missing)}", file=sys.stderr)
        tests = [t for t in tests if t not in missing]
    copy = Path(tempfile.mkdtemp(prefix="kvtune-mutation-"))
    try:
        copy_repo(copy)
        write_config(copy, module, tests)
        names = enumerate_mutants(copy, module)
        chosen: list[str] = sample(names, n_sample) if n_sample else []
        if plant:
            chosen = [planted_mutant(copy, names)]
        if untested_of is not None and only is None:
            only = untested_by_order(copy, module, names, untested_of[0], untested_of[1], max_children, log_dir)
        if only is not None:
            chosen = [n for n in names if n in set(only)]
            if not chosen:
                return dict(module=module, mutants=0, tested=0, killed=0, timeout=0, survived=0, no_tests=0, other=0,
                            kill_rate_pct=None, survivors=[], enumerated=len(names), sampled=True, mutmut_rc=0,
                            wall_s=0.0, tests=tests, log="")
        log = log_dir / (module.replace("/", "_") + ".log")
        rc = run_mutmut(copy, chosen, max_children, log, timeout_s)
        statuses = read_results(copy, module)
        if chosen:
            statuses = {k: v for k, v in statuses.items() if k in set(chosen)}
        res = summarise(module, statuses, copy, load_equivalents())
        res.update(enumerated=len(names), sampled=bool(chosen), mutmut_rc=rc, wall_s=round(time.perf_counter() - t0, 1),
                   tests=tests, log=str(log))
        res["not_checked"] = sorted(k for k, v in statuses.items() if v == "not checked")   # --rerun-untested
        if only is not None:   # what a survivors rerun was asked to test, and what it never reached (--combine)
            res.update(selected=chosen)
        if rc != 0:
            res["error"] = f"mutmut exited {rc}; see {log}"
        return res
    finally:
        if keep:
            print(f"  kept {copy}", file=sys.stderr)
        else:
            shutil.rmtree(copy, ignore_errors=True)


def run_sample(modules: list[str], n_sample: int, max_children: int, timeout_s: float | None, keep: bool,
               log_dir: Path, skip: int = 0) -> list[dict]:
    """``n_sample`` mutants of each module, all in one copy and one mutmut run over the union of the
    modules' tests (one instrumented pass instead of one per module: what makes the CI report fit in
    minutes). Each mutant still runs only the tests that reach its function, from that union."""
    t0 = time.perf_counter()
    tests = list(dict.fromkeys(t for m in modules for t in MODULES[m] if (ROOT / t.split("::")[0]).exists()))
    copy = Path(tempfile.mkdtemp(prefix="kvtune-mutation-"))
    try:
        copy_repo(copy)
        write_config(copy, modules, tests)
        chosen = {m: sample(enumerate_mutants(copy, m), n_sample, skip) for m in modules}
        log = log_dir / "sample.log"
        rc = run_mutmut(copy, [n for m in modules for n in chosen[m]], max_children, log, timeout_s)
        rows = []
        equivalents = load_equivalents()
        for m in modules:
            statuses = {k: v for k, v in read_results(copy, m).items() if k in set(chosen[m])}
            res = summarise(m, statuses, copy, equivalents)
            res.update(enumerated=None, sampled=True, mutmut_rc=rc, wall_s=None, tests=MODULES[m], log=str(log))
            if rc != 0:
                res["error"] = f"mutmut exited {rc}; see {log}"
            rows.append(res)
        print(f"    one run over {len(modules)} modules: {round(time.perf_counter() - t0, 1)} s", flush=True)
        return rows
    finally:
        if keep:
            print(f"  kept {copy}", file=sys.stderr)
        else:
            shutil.rmtree(copy, ignore_errors=True)


def planted_mutant(copy: Path, names: list[str]) -> str:
    """The mutant of ModelArch.kv_bytes_per_token that multiplies instead of... whichever its first is."""
    want = [n for n in names if function_of(n) == "ModelArch.kv_bytes_per_token"]
    if not want:
        sys.exit("Error: --check-planted: no mutant of ModelArch.kv_bytes_per_token in costmodel/models.py")
    return sorted(want, key=lambda n: int(n.rpartition("_")[2]))[0]


# --- reports --------------------------------------------------------------------------------------------------

def run_kind(r: dict) -> str:
    """'all' (every mutant of the module), 'sample' or 'survivors' (an earlier run's survivors only);
    an 'all' run stopped by --module-timeout says how far it got (the rest were never tested)."""
    kind = r.get("run") or ("sample" if r.get("sampled") else "all")
    if kind == "all" and r.get("tested", 0) < r.get("mutants", 0):
        kind = f"all, stopped after {r['tested']} of {r['mutants']}"
    return kind


def table(rows: list[dict]) -> str:
    head = ("| module | run | mutants | killed | timeout | survived | no tests | other | kill rate (%) | "
            "survivors explained | wall (s) |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
    body = ""
    for r in rows:
        expl = sum(1 for s in r["survivors"] if s["why"])
        body += (f"| {r['module']} | {run_kind(r)} | {r['tested']} | {r['killed']} | {r['timeout']} | {r['survived']} | "
                 f"{r['no_tests']} | {r['other']} | {r['kill_rate_pct']} | {expl}/{len(r['survivors'])} | "
                 f"{r['wall_s'] if r['wall_s'] is not None else '-'} |\n")
    return head + body


def survivors_md(rows: list[dict]) -> str:
    out = []
    for r in rows:
        if not r["survivors"]:
            continue
        out.append(f"\n#### {r['module']}\n")
        for s in r["survivors"]:
            why = s["why"] or "**UNEXPLAINED**"
            before = s["before"].replace("\n", " / ").replace("|", "\\|")
            after = s["after"].replace("\n", " / ").replace("|", "\\|")
            out.append(f"- `{s['function']}` ({s['status']}): `{before}` -> `{after}`: {why}")
    return "\n".join(out) + "\n"


def markdown_block(meta: dict, rows: list[dict]) -> str:
    return (f"{BEGIN}\n_Generated by `python bench/bench_mutation.py` at commit {meta['commit']} on {meta['date']} "
            f"({meta['mode']}; load average {meta['load_before']} before, {meta['load_after']} after, "
            f"{meta['cpus']} CPUs, mutmut {meta['mutmut']}). Kill rate = (killed + timeout) / mutants tested._\n\n"
            + table(rows) + "\n### Survivors\n" + survivors_md(rows) + END + "\n")


def write_markdown(path: Path, block: str) -> None:
    text = path.read_text() if path.exists() else "# Mutation testing\n\n"
    if BEGIN in text and END in text:
        pre, rest = text.split(BEGIN, 1)
        post = rest.split(END, 1)[1].lstrip("\n")
        text = pre + block + post
    else:
        text = text.rstrip() + "\n\n" + block
    path.write_text(text)


def combine(paths: list[Path], md: Path) -> int:
    """The generated block of ``md`` from several results files: per module the row of the last file
    that has it; the header names every file's run (kind, commit, date, load average)."""
    by_module: dict[str, dict] = {}
    runs = []
    for p in paths:
        blob = json.loads(p.read_text())
        m = blob["meta"]
        runs.append(f"{p.name}: {m['mode']} at commit {m['commit']} on {m['date']}, load average "
                    f"{m['load_before']} before, {m['load_after']} after"
                    + "".join(f", mutmut {k} {m[k]:g}" for k in ("timeout_multiplier", "timeout_constant") if k in m))
        for r in blob["modules"]:
            prev = by_module.get(r["module"])
            if run_kind(r) == "untested":
                # the rest of a stopped run of every mutant (--rerun-untested): its counts added to that run's
                if prev is None or prev["tested"] + r["tested"] > prev["mutants"] or r["enumerated"] != prev["mutants"]:
                    sys.exit(f"Error: {p.name}: {r['module']}'s run of untested mutants follows no stopped run of "
                             "all its mutants in the files before it")
                counts = {k: prev[k] + r[k] for k in ("tested", "killed", "timeout", "survived", "no_tests", "other")}
                r = dict(prev, **counts, survivors=prev["survivors"] + r["survivors"],
                         run=f"all, in two parts ({prev['tested']} + {r['tested']} untested)"
                         + (f", {prev['mutants'] - counts['tested']} never tested" if counts["tested"] < prev["mutants"] else ""),
                         wall_s=round((prev["wall_s"] or 0) + (r["wall_s"] or 0), 1))
                r["kill_rate_pct"] = round(100.0 * (r["killed"] + r["timeout"]) / r["tested"], 1)
                by_module[r["module"]] = r
                continue
            if run_kind(r) == "survivors" and prev is not None \
                    and {s["name"] for s in prev["survivors"]} >= {s["name"] for s in r["survivors"]}:
                # an earlier full run's survivors tested again (after new tests): its counts updated. A rerun of
                # some of them (``selected``) keeps the others, and those it never reached, as survivors
                selected = set(r.get("selected") or [s["name"] for s in prev["survivors"]])
                if "selected" not in r and r["tested"] < len(selected):
                    sys.exit(f"Error: {p.name}: {r['module']}'s rerun tested {r['tested']} of the {len(selected)} "
                             "earlier survivors and does not say which; run it again to the end")
                gone = selected - {s["name"] for s in r["survivors"]} - set(r.get("not_checked", []))
                kept = [s for s in prev["survivors"] if s["name"] not in selected or s["name"] in r.get("not_checked", [])]
                now = {s["name"]: s for s in kept + r["survivors"]}
                left = [now[k] for k in sorted(now)]
                assert len(gone) == r["killed"] + r["timeout"], (p.name, len(gone), r["killed"], r["timeout"])
                r = dict(prev, killed=prev["killed"] + r["killed"], timeout=prev["timeout"] + r["timeout"],
                         survived=sum(1 for s in left if s["status"] == "survived"),
                         no_tests=sum(1 for s in left if s["status"] == "no tests"), survivors=left,
                         run=run_kind(prev) if run_kind(prev).endswith("survivors rerun") else f"{run_kind(prev)}, survivors rerun",
                         wall_s=round((prev["wall_s"] or 0) + (r["wall_s"] or 0), 1))
                r["kill_rate_pct"] = round(100.0 * (r["killed"] + r["timeout"]) / r["tested"], 1)
            by_module[r["module"]] = r
    rows = [by_module[m] for m in MODULES if m in by_module]
    equivalents = load_equivalents()   # a survivor explained since its run is marked so (the entry is read now)
    for r in rows:
        for s in r["survivors"]:
            s["why"] = s["why"] or explain(r["module"], s["function"], s["before"], s["after"], equivalents)
    meta0 = json.loads(paths[-1].read_text())["meta"]
    block = (f"{BEGIN}\n_Generated by `python bench/bench_mutation.py --combine` from {len(paths)} run(s) "
             f"({meta0['cpus']} CPUs, mutmut {meta0['mutmut']}); column run: all = every mutant of the module, "
             f"sample of N = N mutants chosen deterministically (an estimate), survivors = an earlier run's "
             f"survivors only. Kill rate = (killed + timeout) / mutants tested._\n\n"
             + "".join(f"- {x}\n" for x in runs) + "\n" + table(rows) + "\n### Survivors\n" + survivors_md(rows) + END + "\n")
    write_markdown(md, block)
    print(table(rows))
    return 0


def git_commit() -> str:
    r = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                           capture_output=True, text=True).stdout.strip()
    return r.stdout.strip() + ("+uncommitted" if dirty else "")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--module", action="append", choices=list(MODULES), help="only this module (repeatable)")
    ap.add_argument("--sample", type=int, metavar="N", help="N mutants per module, chosen deterministically")
    ap.add_argument("--sample-skip", type=int, default=0, metavar="K",
                    help="with --sample: the N after the first K (a fresh sample, disjoint from --sample K)")
    ap.add_argument("--max-children", type=int, default=2, help="mutants tested at once (default 2)")
    ap.add_argument("--module-timeout", type=float, default=None, metavar="S", help="stop a module's run after S s")
    ap.add_argument("--timeout-multiplier", type=float, default=None, metavar="X",
                    help="mutmut's timeout_multiplier (default 15): a mutant whose tests run longer than X times "
                         "their measured time (+ the constant) is stopped and counted as a timeout (killed); "
                         "lower it where looping mutants would each take minutes (costmodel/replica.py)")
    ap.add_argument("--timeout-constant", type=float, default=None, metavar="S",
                    help="mutmut's timeout_constant in seconds (default 1), added to the estimate before multiplying")
    ap.add_argument("--json", type=Path, help="write the results here (default: RESULTS-mutation.json on a full run)")
    ap.add_argument("--md", type=Path, help="update this Markdown's generated block (default: RESULTS-mutation.md "
                                            "on a full run)")
    ap.add_argument("--rerun-survivors", type=Path, metavar="JSON",
                    help="test only the mutants that survived in this earlier results file (while writing tests)")
    ap.add_argument("--unexplained-only", action="store_true",
                    help="with --rerun-survivors: only the survivors bench/mutation_equivalents.yaml does not explain "
                         "now (an explained one survives again by construction; --combine keeps it as it was)")
    ap.add_argument("--rerun-untested", type=Path, metavar="JSON",
                    help="test only the mutants this earlier run of all mutants never reached (stopped by "
                         "--module-timeout): its not_checked list, or for a file without one mutmut's order after "
                         "the first 'tested'")
    ap.add_argument("--keep", action="store_true", help="keep each temporary copy (to browse with mutmut)")
    ap.add_argument("--check-planted", action="store_true",
                    help="plant one mutant of ModelArch.kv_bytes_per_token and fail unless the tests kill it")
    ap.add_argument("--combine", type=Path, nargs="+", metavar="JSON",
                    help="write --md (default RESULTS-mutation.md) from these results files (a later file's row "
                         "for a module replaces an earlier one's), each run's kind, date and load kept; runs nothing")
    args = ap.parse_args()

    if args.combine:
        return combine(args.combine, args.md or RESULTS_MD)
    if args.timeout_multiplier is not None:
        CONFIG_OVERRIDES["timeout_multiplier"] = args.timeout_multiplier
    if args.timeout_constant is not None:
        CONFIG_OVERRIDES["timeout_constant"] = args.timeout_constant
    log_dir = Path(tempfile.mkdtemp(prefix="kvtune-mutation-logs-"))
    if args.check_planted:
        r = run_module(PLANT_MODULE, MODULES[PLANT_MODULE], None, 1, args.module_timeout, args.keep, log_dir,
                       plant=True)
        ok = r["mutants"] == 1 and r["killed"] == 1
        print(f"planted mutant of {PLANT_MODULE} ModelArch.kv_bytes_per_token: "
              f"{'killed' if ok else 'NOT killed'} ({r['wall_s']} s; log {r['log']})")
        return 0 if ok else 1

    modules = args.module or list(MODULES)
    earlier: dict[str, list[str]] = {}
    if args.rerun_survivors:
        equivalents = load_equivalents()
        for r in json.loads(args.rerun_survivors.read_text())["modules"]:
            earlier[r["module"]] = [s["name"] for s in r["survivors"] if not args.unexplained_only
                                    or not explain(r["module"], s["function"], s["before"], s["after"], equivalents)]
        modules = [m for m in modules if m in earlier]
    untested_of: dict[str, tuple[int, set[str]]] = {}
    if args.rerun_untested:
        for r in json.loads(args.rerun_untested.read_text())["modules"]:
            if r.get("not_checked") is not None and r.get("selected") is None:
                earlier[r["module"]] = list(r["not_checked"])
            elif r["tested"] < r["mutants"]:
                untested_of[r["module"]] = (r["tested"], {s["name"] for s in r["survivors"]})
        modules = [m for m in modules if m in earlier or m in untested_of]
    load_before = round(os.getloadavg()[0], 1)
    commit = git_commit()   # the tree each copy is taken from now, not whatever is committed when the run ends
    rows: list[dict] = []
    if args.sample:
        print(f"--- a sample of {args.sample} mutants from each of {len(modules)} modules, one mutmut run ...", flush=True)
        rows = run_sample(modules, args.sample, args.max_children, args.module_timeout, args.keep, log_dir,
                          args.sample_skip)
        for r in rows:
            r["run"] = f"sample of {args.sample}" + (f" after the first {args.sample_skip}" if args.sample_skip else "")
    for m in ([] if args.sample else modules):
        print(f"--- {m} ({'sample of ' + str(args.sample) if args.sample else 'all mutants'}) ...", flush=True)
        r = run_module(m, MODULES[m], args.sample, args.max_children, args.module_timeout, args.keep, log_dir,
                       only=earlier.get(m) if args.rerun_survivors or args.rerun_untested else None,
                       untested_of=untested_of.get(m))
        r["run"] = ("survivors" if args.rerun_survivors else "untested" if args.rerun_untested
                    else "all" if not args.sample else f"sample of {args.sample}")
        rows.append(r)
        print(f"    {r['killed']} killed, {r['timeout']} timeout, {r['survived']} survived, {r['no_tests']} no tests "
              f"of {r['tested']} -> {r['kill_rate_pct']} % in {r['wall_s']} s"
              + (f"  [{r['error']}]" if r.get("error") else ""), flush=True)
    import mutmut
    meta = dict(commit=commit, date=dt.datetime.now().strftime("%Y-%m-%d %H:%M"),
                mode=(f"sample of {args.sample} per module"
                      + (f" after the first {args.sample_skip}" if args.sample_skip else "") if args.sample
                      else ("earlier survivors only" + (" (those not explained)" if args.unexplained_only else ""))
                      if args.rerun_survivors else f"the mutants {args.rerun_untested.name} never reached"
                      if args.rerun_untested else "all mutants"),
                load_before=load_before, load_after=round(os.getloadavg()[0], 1), cpus=os.cpu_count(),
                mutmut=getattr(mutmut, "__version__", "?"), python=platform.python_version(),
                **{k: v for k, v in CONFIG_OVERRIDES.items()})
    print()
    print(table(rows))
    partial = bool(args.sample or args.rerun_survivors or args.rerun_untested)
    json_path = args.json or (None if partial else RESULTS_JSON)
    # a run written to its own --json (one module, to --combine later) leaves the Markdown alone unless --md says
    md_path = args.md or (None if partial or args.json else RESULTS_MD)
    if json_path:
        old = json.loads(json_path.read_text()) if json_path.exists() and not partial else {}
        merged = {r["module"]: r for r in old.get("modules", [])}
        merged.update({r["module"]: r for r in rows})
        ordered = [merged[m] for m in MODULES if m in merged]
        json_path.write_text(json.dumps(dict(meta=meta, modules=ordered), indent=1, ensure_ascii=False) + "\n")
        rows_for_md = ordered
    else:
        rows_for_md = rows
    if md_path:
        write_markdown(md_path, markdown_block(meta, rows_for_md))
    unexplained = sum(1 for r in rows for s in r["survivors"] if not s["why"])
    print(f"{unexplained} unexplained survivors; logs in {log_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
