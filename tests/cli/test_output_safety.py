"""Output paths never harm what is there (issue 24): a device node or a FIFO is written in place,
never replaced by a rename; a regular file is replaced whole and keeps its mode (a new one gets the
umask); an unwritable target is one line before the work; a write that fails after a solve still
prints the answer; stdout on a full device is one line.

Device nodes are private ones made with ``os.mknod`` in a temporary folder (root only), never the
machine's. Read-only and full file systems are tiny tmpfs mounts made inside a private mount
namespace (``unshare -m``: root only; the mount disappears with the process), so nothing outside
the test changes. Root ignores ``chmod``, so the permission tests run only as another user.
"""

from __future__ import annotations

import errno
import os
import shlex
import shutil
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from kvtune.costmodel.errors import InputError
from kvtune.optimizer.cli import main
from kvtune.optimizer.output import check_output_folder, check_output_path, output_folder, write_atomic

ROOT = Path(__file__).parent.resolve().parent.parent
DATA = Path(__file__).parent.parent / "data"
IS_ROOT = os.geteuid() == 0
KVTUNE = [sys.executable, "-m", "kvtune"]
TINY = {"model": "llama-3.1-8b", "hardware": {"gpu": "h100-sxm", "usd_per_gpu_hour": 3.0},
        "workload": {"rate_req_s": 5, "classes": [{"input_tokens": 512, "output_tokens": 64}]},
        "slo": {"ttft_ms": 1000, "tpot_ms": 50},
        "search": {"tp": [1], "batch_cap": [8, 64], "kv_dtype": ["bf16"], "chunk_tokens": [2048, 2048],
                   "trials": 2, "deployment": ["aggregated"]}}
root_only = pytest.mark.skipif(not IS_ROOT, reason="making device nodes needs root")
not_root = pytest.mark.skipif(IS_ROOT, reason="root writes whatever chmod says; the tmpfs tests cover root")


def _mounts_possible() -> bool:
    if not IS_ROOT or not shutil.which("unshare"):
        return False
    try:
        return subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                               "mount -t tmpfs -o size=64k tmpfs /mnt"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


MOUNTS = _mounts_possible()
needs_mount = pytest.mark.skipif(not MOUNTS, reason="a private tmpfs mount needs root and unshare(1) "
                                                    "(a container without CAP_SYS_ADMIN cannot)")


@pytest.fixture
def workload(tmp_path) -> Path:
    p = tmp_path / "w.yaml"
    p.write_text(yaml.safe_dump(TINY))
    return p


def _one_error(stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.startswith("Error:")]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


def _run(argv):
    res = CliRunner().invoke(main, [str(a) for a in argv], catch_exceptions=True)
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    return res


def _kind(p: Path) -> str:
    m = os.lstat(p).st_mode
    return ("chr" if stat.S_ISCHR(m) else "blk" if stat.S_ISBLK(m) else "fifo" if stat.S_ISFIFO(m)
            else "link" if stat.S_ISLNK(m) else "file" if stat.S_ISREG(m) else "other")


# ---- devices and FIFOs: written in place, never replaced ---------------------------------------------

@root_only
def test_a_character_device_is_written_in_place_never_replaced(tmp_path):
    null = tmp_path / "null"
    os.mknod(null, 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # a private /dev/null
    write_atomic(null, "{}\n")
    assert _kind(null) == "chr"
    res = _run(["profile", "import", DATA / "import_vllm_result.json", "-o", null, "--model", "llama-3.1-8b",
                "--gpu", "h100-sxm", "--tp", "1", "--engine", "vllm"])
    assert res.exit_code == 0 and _kind(null) == "chr", res.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["null"]  # no temporary file left beside it


@root_only
def test_a_block_device_is_refused_before_anything_is_opened(tmp_path):
    disk = tmp_path / "disk"
    os.mknod(disk, 0o660 | stat.S_IFBLK, os.makedev(7, 0))  # a private node for loop0: only stat()ed
    with pytest.raises(InputError, match="block device"):
        write_atomic(disk, "{}\n")
    res = _run(["profile", "import", DATA / "import_vllm_result.json", "-o", disk])
    assert res.exit_code == 2 and "block device" in _one_error(res.stderr)
    assert _kind(disk) == "blk"


def test_a_fifo_is_written_in_place_for_its_reader(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    write_atomic(fifo, "hello\n")
    reader.join(timeout=30)
    assert got == [b"hello\n"] and _kind(fifo) == "fifo"


def test_a_path_through_proc_fd_is_written_in_place(tmp_path):
    """``--json /dev/stdout`` reaches the descriptor through /proc/self/fd: it is written, not renamed
    over (a private link to /proc/self/fd/1 stands for /dev/stdout, so a failure harms nothing else)."""
    out, link = tmp_path / "out.txt", tmp_path / "stdout"
    link.symlink_to("/proc/self/fd/1")
    code = f"from kvtune.optimizer.output import write_atomic; write_atomic({str(link)!r}, 'hi\\n')"
    with out.open("w") as f:
        assert subprocess.run([sys.executable, "-c", code], stdout=f, timeout=60).returncode == 0
    assert out.read_text() == "hi\n" and _kind(link) == "link"


# ---- regular files: whole, with the umask or the old mode ----------------------------------------------

@pytest.mark.parametrize("mask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_a_new_file_gets_the_umask(tmp_path, mask, mode):
    old = os.umask(mask)
    try:
        write_atomic(tmp_path / "r.json", "{}\n")
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "r.json").st_mode) == mode


def test_a_replaced_file_keeps_its_mode_and_nothing_is_left_beside_it(tmp_path):
    p = tmp_path / "r.json"
    p.write_text("old")
    os.chmod(p, 0o640)
    write_atomic(p, "new")
    assert p.read_text() == "new" and stat.S_IMODE(os.stat(p).st_mode) == 0o640
    assert [x.name for x in tmp_path.iterdir()] == ["r.json"]


def test_a_symlink_stays_a_link_and_its_target_is_replaced(tmp_path):
    (tmp_path / "real").mkdir()
    target = tmp_path / "real" / "t.csv"
    target.write_text("old")
    link = tmp_path / "t.csv"
    link.symlink_to(target)
    write_atomic(link, "new")
    assert _kind(link) == "link" and target.read_text() == "new"


def test_solve_json_is_written_with_the_umask(tmp_path, workload):
    old = os.umask(0o022)
    try:
        assert _run(["solve", workload, "--quiet", "--json", tmp_path / "r.json"]).exit_code == 0
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "r.json").st_mode) == 0o644


# ---- unwritable targets: one line before the work ------------------------------------------------------

@not_root
def test_a_read_only_folder_is_refused_before_the_work(tmp_path, workload):
    ro = tmp_path / "ro"
    ro.mkdir()
    os.chmod(ro, 0o555)
    try:
        with pytest.raises(InputError, match="not writable"):
            check_output_path(ro / "r.json", "--json")
        with pytest.raises(InputError, match="not writable"):
            check_output_folder(ro / "rep", "--report")
        res = _run(["solve", workload, "--quiet", "--json", ro / "r.json"])
        assert res.exit_code == 2 and "not writable" in _one_error(res.stderr) and "Recommendation" not in res.stdout
    finally:
        os.chmod(ro, 0o755)


@not_root
def test_a_read_only_file_is_not_replaced(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("mine")
    os.chmod(p, 0o444)
    with pytest.raises(InputError, match="read-only"):
        write_atomic(p, "theirs")
    assert p.read_text() == "mine"


def test_a_folder_or_a_file_in_the_way_is_refused(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "f").write_text("x")
    with pytest.raises(InputError, match="is a folder"):
        check_output_path(tmp_path / "d", "-o")
    with pytest.raises(InputError, match="not a folder"):
        check_output_folder(tmp_path / "f", "--report")
    with pytest.raises(InputError, match="not a folder"):
        check_output_folder(tmp_path / "f" / "rep", "--report")


# ---- failures after the work: the answer is printed, nothing half-written is left ----------------------

@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
def test_json_onto_a_full_device_after_the_solve_still_prints_the_answer(workload):
    res = _run(["solve", workload, "--quiet", "--json", "/dev/full"])
    assert res.exit_code == 2
    line = _one_error(res.stderr)
    assert "/dev/full" in line and "No space left" in line
    assert "Recommendation:" in res.stdout


def test_a_report_that_fails_midway_leaves_nothing_and_the_answer_is_printed(tmp_path, workload, monkeypatch):
    import kvtune.optimizer.report as report

    def full_disk(result, spec, out_dir, *overrides):
        (Path(out_dir) / "frontier.png").write_bytes(b"half a plot")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(report, "write_report", full_disk)
    out = tmp_path / "out"
    out.mkdir()
    res = _run(["solve", workload, "--quiet", "--report", out / "rep", "--json", out / "r.json"])
    assert res.exit_code == 2 and "Recommendation:" in res.stdout
    line = _one_error(res.stderr)
    assert "--report" in line and "No space left" in line
    assert sorted(p.name for p in out.iterdir()) == ["r.json"]  # the JSON was still written; no rep/, no temp


def test_a_report_folder_is_filled_whole_keeping_other_files(tmp_path):
    rep = tmp_path / "rep"
    rep.mkdir()
    (rep / "notes.txt").write_text("mine")
    (rep / "report.md").write_text("old")
    with output_folder(rep, "--report") as d:
        (d / "report.md").write_text("new")
        (d / "plot.png").write_bytes(b"png")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rep"]
    assert (rep / "notes.txt").read_text() == "mine" and (rep / "report.md").read_text() == "new"
    with output_folder(tmp_path / "a" / "b" / "new", "--report") as d:  # missing parents are made at the end
        (d / "report.md").write_text("x")
    assert (tmp_path / "a" / "b" / "new" / "report.md").read_text() == "x"


def test_stdout_on_a_full_device_is_one_line(tmp_path):
    if not os.path.exists("/dev/full"):
        pytest.skip("needs /dev/full (Linux)")
    with open("/dev/full", "w") as full:
        p = subprocess.run(KVTUNE + ["estimate", "--model", "llama-3.1-8b", "--batch", "1,8"], stdout=full,
                           stderr=subprocess.PIPE, text=True, timeout=120)
    assert p.returncode == 2
    assert "stdout" in _one_error(p.stderr) and "No space left" in p.stderr
    assert p.stderr.count("\n") == 1  # nothing more at exit (the interpreter's last flush)


# ---- tiny tmpfs mounts in a private namespace (root) ---------------------------------------------------

def _in_mount(tmp_path: Path, opts: str, script: str, timeout: int = 300) -> subprocess.CompletedProcess:
    """Run ``script`` (``KV`` is kvtune) in a private mount namespace with a tmpfs (``opts``) at mnt/."""
    (tmp_path / "mnt").mkdir()
    kv = shlex.join(KVTUNE)
    body = f"mount -t tmpfs -o {opts} tmpfs mnt && " + script.replace("KV", kv)
    return subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", body], cwd=tmp_path,
                          capture_output=True, text=True, timeout=timeout)


@needs_mount
@pytest.mark.parametrize("flag, target", [("--json", "mnt/r.json"), ("--report", "mnt/rep"),
                                          ("--storage", "journal:mnt/j.log"), ("--storage", "sqlite:///mnt/s.db")])
def test_a_read_only_mount_is_refused_before_the_solve(tmp_path, workload, flag, target):
    p = _in_mount(tmp_path, "size=64k,ro", f"KV solve w.yaml --quiet {flag} {target}")
    assert p.returncode == 2, p.stderr
    assert "read-only file system" in _one_error(p.stderr) and p.stdout == ""


@needs_mount
def test_a_report_onto_a_full_disk_prints_the_answer_and_leaves_nothing(tmp_path, workload):
    p = _in_mount(tmp_path, "size=64k", "KV solve w.yaml --quiet --report mnt/rep; echo rc=$?; ls -A mnt")
    assert "Recommendation:" in p.stdout and "rc=2" in p.stdout, p.stderr
    assert p.stdout.rstrip().endswith("rc=2"), "something was left on the full disk"
    line = _one_error(p.stderr)
    assert "--report" in line and "No space left" in line


@needs_mount
def test_a_journal_on_a_full_disk_is_one_line_and_keeps_whole_records(tmp_path, workload):
    p = _in_mount(tmp_path, "size=16k", "KV solve w.yaml --quiet --storage journal:mnt/j.log; echo rc=$?; "
                                        "tail -c 1 mnt/j.log | od -An -c")
    assert "rc=2" in p.stdout, p.stderr
    assert "No space left" in _one_error(p.stderr)
    assert p.stdout.rstrip().endswith("\\n"), "the journal ends mid-record"


@needs_mount
@pytest.mark.slow
@pytest.mark.parametrize("storage, sizes", [("sqlite:///mnt/s.db", range(96, 208, 16)),
                                           ("journal:mnt/j.log", range(16, 80, 16))])
def test_a_study_filling_the_disk_at_any_point_ends_in_one_line(tmp_path, workload, storage, sizes):
    """The disk fills at creation, at a trial's start or at its end, depending on its size (KiB):
    every run ends in exit 0 or one Error line (optuna's own 'Should not reach' assertion no more),
    and a journal keeps whole records."""
    script = "; ".join(f"umount mnt 2>/dev/null; mount -t tmpfs -o size={k}k tmpfs mnt && "
                       f"KV solve w.yaml --quiet --trials 20 --storage {storage} >/dev/null 2>err{k}; echo rc{k}=$?"
                       for k in sizes)
    p = _in_mount(tmp_path, "size=8k", script, timeout=900)
    for k in sizes:
        err = (tmp_path / f"err{k}").read_text()
        rc = p.stdout.split(f"rc{k}=")[1].split()[0]
        assert rc in ("0", "2") and "Traceback" not in err, (k, rc, err[-2000:])
        if rc == "2":
            assert "No space left" in _one_error(err) or "disk is full" in _one_error(err)
    assert any(f"rc{k}=2" in p.stdout for k in sizes), "no size filled the disk: the test checked nothing"


def test_a_storage_fault_lost_under_optuna_s_own_assertion_is_found():
    """optuna raises ``AssertionError('Should not reach.')`` from a ``finally`` when a trial's state
    cannot be written; the CLI finds the full database underneath and says that."""
    from kvtune.optimizer.cli import _machine_fault

    class OperationalError(Exception):
        pass

    try:
        try:
            try:
                raise OperationalError("(sqlite3.OperationalError) database or disk is full")
            except OperationalError as e:
                raise RuntimeError("An exception is raised during the commit.") from e
        finally:
            raise AssertionError("Should not reach.")
    except AssertionError as exc:
        fault = _machine_fault(exc)
    assert type(fault).__name__ == "OperationalError"
    assert _machine_fault(AssertionError("a bug")) is None  # a bug keeps its traceback
