"""GPU-free: tensor-parallel ranks starting together, as torchrun starts them (one process per rank,
the same kernel keys requested at the same moment).

- A cold cache shared by every rank: each key is compiled by exactly one rank; every rank gets the
  same binary from the same entry.
- A read-only prewarmed root on a shared path plus one writable root per rank (MLA_JIT_OFFLINE=1, so a
  miss would fail the rank): every rank loads every kernel from the shared root, and nothing is
  written into the per-rank roots.
"""
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from .tp_launch import release_when_ready, start_ranks, wait_ranks

pytestmark = pytest.mark.slow

RANKS = 8
DTYPES = ["bf16", "fp16", "fp32"]   # three toy kernel keys (tile_copy), each wanted by every rank


def _base_env(cli_env) -> dict:
    return {**cli_env, "TP_RANK_CACHE_DIR": "", "OMP_NUM_THREADS": "1"}


def test_ranks_on_a_cold_shared_root_compile_each_key_once(cli_env, tmp_path):
    shared = tmp_path / "shared"
    out = tmp_path / "reports"
    out.mkdir()
    proc = start_ranks(RANKS, ["build", str(out), *DTYPES], {**_base_env(cli_env), "MLA_JIT_CACHE_DIR": str(shared)})
    release_when_ready(out, RANKS, proc, timeout=300)
    reports = wait_ranks(proc, out, RANKS, timeout=600)
    for dtype in DTYPES:
        origins = [r["origin"][dtype] for r in reports]
        assert origins.count("compiled") == 1 and origins.count("disk") == RANKS - 1, (dtype, origins)
        assert len({r["sha"][dtype] for r in reports}) == 1, dtype
        paths = {r["path"][dtype] for r in reports}
        assert len(paths) == 1 and Path(paths.pop()).is_relative_to(shared), dtype


def _read_only(root: Path) -> None:
    for path in [root, *root.rglob("*")]:
        path.chmod(path.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))


def _writable(root: Path) -> None:
    for path in [root, *root.rglob("*")]:
        path.chmod(path.stat().st_mode | stat.S_IWUSR)


def test_ranks_load_a_readonly_prewarmed_root_with_per_rank_writable_roots(cli_env, tmp_path):
    shared = tmp_path / "image"   # e.g. baked into the serving image, or on NFS
    prewarm = subprocess.run([sys.executable, "-m", "mla_jit.cli", "prewarm", "--arch", "sm_90a", "--op", "tile_copy"],
                             env={**os.environ, **cli_env, "MLA_JIT_CACHE_DIR": str(shared)},
                             capture_output=True, text=True, timeout=600)
    assert prewarm.returncode == 0, prewarm.stderr
    _read_only(shared)
    try:
        out = tmp_path / "reports"
        out.mkdir()
        local = tmp_path / "local"
        env = {**_base_env(cli_env), "MLA_JIT_READONLY_CACHE_DIRS": str(shared), "MLA_JIT_OFFLINE": "1",
               "TP_RANK_CACHE_DIR": str(local / "rank{rank}")}
        proc = start_ranks(RANKS, ["build", str(out), *DTYPES], env)
        release_when_ready(out, RANKS, proc, timeout=300)
        reports = wait_ranks(proc, out, RANKS, timeout=600)
    finally:
        _writable(shared)
    for dtype in DTYPES:
        assert [r["origin"][dtype] for r in reports] == ["disk"] * RANKS, dtype
        assert all(Path(r["path"][dtype]).is_relative_to(shared) for r in reports), dtype
        assert len({r["sha"][dtype] for r in reports}) == 1, dtype
    written = [p for p in local.rglob("*") if p.is_file()] if local.exists() else []
    assert written == [], f"files written into the per-rank roots: {written[:5]}"
