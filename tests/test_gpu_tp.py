"""Tensor-parallel ranks on GPUs (tests/tp_rank.py, started as torchrun starts them): each rank runs
DeepSeek V3's decode and MHA-mode prefill attention for its share of the 128 heads from a shared
read-only cache (the test session's own root, warmed first), with a writable root of its own and
MLA_JIT_OFFLINE=1 (a kernel missing from the shared root fails the rank); rank 0 gathers the heads
and checks them against its own 128-head call and the float32 reference.

- Two GPUs, NCCL (NCCL_NVLS_ENABLE=0): skipped where fewer than two GPUs are visible.
- Two ranks on one GPU, gloo through the host: the same start, cache roots, head split and gather
  on any one GPU (it proves nothing about two devices; tests/test_gpu_multi_device.py does that).
- Four ranks on one GPU starting together on a cold shared writable root: each kernel is compiled
  by exactly one rank, and every rank's results pass rank 0's checks.
"""
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mla_jit.jit import env as jit_env

from .tp_launch import RANK_SCRIPT, REPO, start_ranks, wait_ranks

pytestmark = pytest.mark.gpu


def _snapshot(root: Path) -> dict:
    return {str(p): p.stat().st_size for p in root.rglob("*") if p.is_file()} if root.exists() else {}


@pytest.fixture(scope="module")
def shared_root(tmp_path_factory):
    """A copy of the session's writable root, holding every kernel the ranks need (the warm run
    compiles what is missing); the ranks see it only as a read-only root. A copy: other test
    processes (pytest-xdist) keep publishing kernels into the session's root while the ranks run,
    which the no-write check would take for the ranks' writes. Entries appear by a rename, so the
    copy holds only whole ones."""
    out = tmp_path_factory.mktemp("warm")
    run = subprocess.run([sys.executable, str(RANK_SCRIPT), "warm", str(out), "2"], cwd=REPO,
                         capture_output=True, text=True, timeout=1800)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-6000:]
    shared = tmp_path_factory.mktemp("shared") / "root"
    shutil.copytree(jit_env.cache_dir(), shared, ignore=shutil.ignore_patterns(".locks", ".staging"))
    return shared


def _run_ranks(shared: Path, tmp_path: Path, backend: str) -> list[dict]:
    out = tmp_path / "reports"
    out.mkdir()
    env = {"MLA_JIT_READONLY_CACHE_DIRS": str(shared), "TP_RANK_CACHE_DIR": str(tmp_path / "local" / "rank{rank}"),
           "MLA_JIT_OFFLINE": "1", "TP_BACKEND": backend, "NCCL_NVLS_ENABLE": "0", "OMP_NUM_THREADS": "1"}
    before = _snapshot(shared)
    reports = wait_ranks(start_ranks(2, ["attention", str(out)], env), out, 2, timeout=900)
    assert _snapshot(shared) == before, "a rank wrote into the shared read-only root"
    assert [p for p in (tmp_path / "local").rglob("*") if p.is_file()] == [], "a rank wrote a kernel of its own"
    checks = reports[0]["checks"]
    assert set(checks) >= {"decode_vs_one_gpu", "decode_vs_fp32", "prefill_vs_one_gpu", "prefill_vs_fp32"}
    return reports


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_two_gpus_nccl_gather_equals_one_gpu(shared_root, tmp_path):
    reports = _run_ranks(shared_root, tmp_path, "nccl")
    assert sorted(r["device"] for r in reports) == [0, 1]


def test_two_ranks_on_one_gpu_gloo_gather_equals_one_gpu(shared_root, tmp_path):
    reports = _run_ranks(shared_root, tmp_path, "gloo")
    assert [r["backend"] for r in reports] == ["gloo", "gloo"]


def test_ranks_on_a_cold_shared_root_compile_each_kernel_once(tmp_path):
    out = tmp_path / "reports"
    out.mkdir()
    env = {"MLA_JIT_CACHE_DIR": str(tmp_path / "shared"), "MLA_JIT_READONLY_CACHE_DIRS": "", "MLA_JIT_OFFLINE": "0",
           "TP_RANK_CACHE_DIR": "", "TP_BACKEND": "gloo", "OMP_NUM_THREADS": "1"}
    reports = wait_ranks(start_ranks(4, ["attention", str(out)], env), out, 4, timeout=1200)
    names = set().union(*(r["origins"] for r in reports))
    assert names, "no kernel reported"
    for name in names:
        origins = [r["origins"][name] for r in reports if name in r["origins"]]
        assert len(origins) == 4 and origins.count("compiled") == 1, (name, origins)
    assert "checks" in reports[0]
