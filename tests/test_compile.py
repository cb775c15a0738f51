"""GPU-free: compile-only of the toy TMA kernel and the CuTe/WGMMA kernel with both compilers."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

import mla_jit
from mla_jit.jit.build import KernelSource, build
from mla_jit.jit.compiler import get_compiler
from mla_jit.runtimes import registry

from .helpers import SM90


def _ptxas_report(log: str) -> str:
    return "\n".join(line for line in log.splitlines() if "spill" in line or "stack frame" in line)


@pytest.mark.parametrize("family_name", ["tile_copy", "wgmma_gemm"])
def test_compile_toy_families(family_name, compiler_env, cache_root, monkeypatch):
    monkeypatch.setenv("MLA_JIT_PTXAS_VERBOSE", "1")
    family = registry.get(family_name)
    cfg = next(iter(family.prewarm_configs(SM90.tuning, [])))
    binary = build(family.source(cfg, SM90))
    assert binary.origin == "compiled"
    assert binary.cubin[:4] == b"\x7fELF"
    report = _ptxas_report(binary.log)
    assert "0 bytes spill stores, 0 bytes spill loads" in report, binary.log
    assert "0 bytes stack frame" in report, binary.log
    for entry in binary.entry_points:
        assert entry.encode() in binary.cubin


def test_compile_error_carries_log_and_source_path(compiler_env, cache_root):
    src = KernelSource("broken", 'extern "C" __global__ void k() { this is not cuda; }', ("k",), SM90,
                       "mla-jit prewarm")
    with pytest.raises(mla_jit.CompileError) as info:
        build(src, get_compiler(compiler_env))
    err = info.value
    assert err.compiler == compiler_env
    assert "error" in err.log
    assert err.source_path is not None and err.source_path.read_text() == src.source
    assert str(err.source_path) in str(err)


def test_nvrtc_leaves_shared_bytes_objects_alone(cache_root):
    """An empty NVRTC log has size 1; reading it into `b" " * 1` (CPython's shared one-byte object)
    once turned every later b" " into b"\\x00" (print's separators became NULs in child processes)."""
    code = ("from tests.helpers import toy_source; from mla_jit.jit.build import build; build(toy_source()); "
            "print('a', 'b'); import sys; sys.stdout.flush(); assert b' ' == bytes([32]), b' '")
    repo = Path(__file__).resolve().parent.parent
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, cwd=repo,
                          env={**os.environ, "MLA_JIT_CACHE_DIR": str(cache_root), "MLA_JIT_PTXAS_VERBOSE": "0",
                               "MLA_JIT_COMPILER": "nvrtc", "PYTHONPATH": str(repo)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == b"a b\n", proc.stdout
