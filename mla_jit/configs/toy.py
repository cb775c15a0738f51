"""Configs of the toy families (tile copy, wgmma GEMM tile)."""
from __future__ import annotations

import functools
from dataclasses import dataclass

from ..jit.arch import Arch


@dataclass(frozen=True)
class TileCopyConfig:
    dtype: str          # "bf16", "fp16" or "fp32"
    block_rows: int
    block_cols: int
    num_threads: int


@dataclass(frozen=True)
class WgmmaGemmConfig:
    dtype: str          # "bf16" or "fp16"
    block_m: int
    block_n: int
    block_k: int


@functools.lru_cache(maxsize=None)
def tile_copy_config(dtype: str, arch: Arch) -> TileCopyConfig:
    # A 64-column box is 128-256 bytes per row: wide enough for full-line TMA transactions.
    return TileCopyConfig(dtype, block_rows=64, block_cols=64, num_threads=256)


@functools.lru_cache(maxsize=None)
def wgmma_gemm_config(dtype: str, arch: Arch) -> WgmmaGemmConfig:
    # BLOCK_K = 64 bf16 = one 128-byte swizzle atom row.
    return WgmmaGemmConfig(dtype, block_m=64, block_n=128, block_k=64)
