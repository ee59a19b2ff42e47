"""bench/live_server.py builds a llama-server that starts on any CPU of the kind, and trusts no
binary it has not started: the portable cmake options, the start check (``/health`` and one
completion), a cached build that fails it set aside and rebuilt (issue 33: a GGML_NATIVE build died
at start-up on a host reporting AMX and AVX-512 FP16, and stayed cached)."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest

import fake_engine

HERE = Path(__file__).parent.resolve().parent


@pytest.fixture(scope="module")
def live_server():
    spec = importlib.util.spec_from_file_location("kvtune_bench_live_server", HERE.parent / "bench" / "live_server.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _on(flags: list[str]) -> dict[str, str]:
    return dict(f[2:].split("=", 1) for f in flags)


def test_x86_hosts_get_the_v3_level_and_never_native_avx512_or_amx(live_server):
    amx_host = {"sse4_2", "avx", "avx2", "fma", "f16c", "bmi2", "avx512f", "avx512_fp16", "amx_tile", "amx_int8"}
    got = _on(live_server.portable_cmake_flags("x86_64", amx_host))
    assert got["GGML_NATIVE"] == "OFF"
    assert all(got[f"GGML_{k}"] == "ON" for k in ("SSE42", "AVX", "AVX2", "FMA", "F16C", "BMI2"))
    assert all(got[f"GGML_{k}"] == "OFF" for k in ("AVX512", "AMX_TILE", "AMX_INT8", "AMX_BF16"))


def test_an_x86_cpu_without_avx2_gets_no_avx2(live_server):
    got = _on(live_server.portable_cmake_flags("x86_64", {"sse4_2", "avx"}))
    assert got["GGML_AVX"] == "ON" and got["GGML_AVX2"] == got["GGML_FMA"] == got["GGML_BMI2"] == "OFF"


def test_other_architectures_get_their_compiler_baseline(live_server):
    assert live_server.portable_cmake_flags("aarch64", set()) == ["-DGGML_NATIVE=OFF"]


def _crashing(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\necho 'llama threadpool init'\nkill -SEGV $$\n")   # dies at start, as the native build did
    path.chmod(0o755)
    return path


def test_a_cached_build_that_does_not_start_is_set_aside_and_rebuilt(live_server, tmp_path, monkeypatch):
    sh = fake_engine.setup(tmp_path, monkeypatch)
    monkeypatch.delenv("KVTUNE_LLAMA_SERVER", raising=False)
    monkeypatch.setattr(live_server.shutil, "which", lambda name: None)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    cache = tmp_path / "cache"
    broken = _crashing(cache / "old" / "vendor" / "llama.cpp" / live_server.BUILD_DIR / "bin" / "llama-server")
    builds = []

    def build(cache_dir: Path, jobs: int) -> Path:   # the fresh build: an engine that starts
        out = cache_dir / "new" / "vendor" / "llama.cpp" / live_server.BUILD_DIR / "bin" / "llama-server"
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(sh["llama-server"], out)
        builds.append(out)
        return out
    monkeypatch.setattr(live_server, "build_server", build)
    got = live_server.working_server(None, cache, sh["gguf"], 1)
    assert builds == [got]
    assert not broken.exists() and broken.with_name("llama-server.failed-check").exists()
    # the next call finds the checked build and builds nothing
    assert live_server.working_server(None, cache, sh["gguf"], 1) == got and len(builds) == 1
    assert not fake_engine.left_behind(sh["pidfile"])


def test_a_named_binary_that_does_not_start_is_an_error_not_a_rebuild(live_server, tmp_path, monkeypatch):
    sh = fake_engine.setup(tmp_path, monkeypatch)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    mine = _crashing(tmp_path / "bin" / "llama-server")
    monkeypatch.setattr(live_server, "build_server", lambda *a: pytest.fail("rebuilt the user's binary"))
    with pytest.raises(SystemExit) as exc:
        live_server.working_server(str(mine), tmp_path / "cache", sh["gguf"], 1)
    assert str(exc.value).startswith(f"error: {mine}: llama-server exited with")
    assert mine.exists()   # the user's file is left where it was
