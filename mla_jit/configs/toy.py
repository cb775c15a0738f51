"""Configs of the toy families (tile copy, wgmma GEMM tile)."""
from __future__ import annotations

import functools
from dataclasses import dataclass

from ..jit.arch import Arch
from .fields import check_fields


@dataclass(frozen=True)
class TileCopyConfig:
    dtype: str          # "bf16", "fp16" or "fp32"
    block_rows: int
    block_cols: int
    num_threads: int

    def __post_init__(self):
        # A TMA box side is at most 256 elements; 16 columns keep its rows a multiple of 16 bytes.
        check_fields(self, dtype=("bf16", "fp16", "fp32"), block_rows=(8, 16, 32, 64, 128, 256),
                     block_cols=(16, 32, 64, 128, 256), num_threads=(32, 64, 128, 256, 512, 1024))


@dataclass(frozen=True)
class WgmmaGemmConfig:
    dtype: str          # "bf16" or "fp16"
    block_m: int
    block_n: int
    block_k: int

    def __post_init__(self):
        # One warpgroup (64 rows) per tile; BLOCK_K = one 128-byte swizzle atom row of 16-bit types.
        check_fields(self, dtype=("bf16", "fp16"), block_m=(64,), block_n=(16, 32, 64, 128, 256), block_k=(64,))


@functools.lru_cache(maxsize=None)
def tile_copy_config(dtype: str, arch: Arch) -> TileCopyConfig:
    # A 64-column box is 128-256 bytes per row: wide enough for full-line TMA transactions.
    return TileCopyConfig(dtype, block_rows=64, block_cols=64, num_threads=256)


@functools.lru_cache(maxsize=None)
def wgmma_gemm_config(dtype: str, arch: Arch) -> WgmmaGemmConfig:
    # BLOCK_K = 64 bf16 = one 128-byte swizzle atom row.
    return WgmmaGemmConfig(dtype, block_m=64, block_n=128, block_k=64)
