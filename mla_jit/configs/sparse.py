"""Configs of the sparse (DSA) decode over FlashMLA's FP8 cache records: pure functions of the arch.

The kernel is the mma.sync split-KV kernel (splitkv_sm80.cuh) with SPARSE_FP8: 16 query heads of one
query token per CTA, Q in registers, 16-token tiles gathered by index (cp.async), each tile's e4m3
values de-quantized into bf16 one tile ahead of its use. It serves every arch, Hopper included,
until a wgmma kernel lands.
"""
from __future__ import annotations

import functools

from ..jit.arch import Arch
from .decode import Sm80DecodeConfig, _sm80_smem_bytes, sm80_resident_ctas

# FlashMLA's V3.2 FP8 record of a token: 512 e4m3 values, 4 float32 scales (one per 128 values),
# 64 bf16 rope values.
RECORD_BYTES = 656
HEAD_DIM, HEAD_DIM_V = 576, 512
BLOCK_M, BLOCK_N, NUM_WARPS = 16, 16, 4
MAX_TOPK = 1 << 20
# Per-block shared memory the tile plans may take: sm_80 163 KB, sm_86 / sm_89 99 KB, sm_90a 227 KB.
_SMEM_LIMIT = {"sm_80": 163 * 1024, "sm_86": 99 * 1024, "sm_89": 99 * 1024, "sm_90a": 227 * 1024}


def _stages(arch: Arch) -> int:
    """4 stages (111.6 KB) where they fit, else 3 (84.7 KB on the 99 KB Ada / GA10x blocks)."""
    return 4 if _sm80_smem_bytes(BLOCK_M, BLOCK_N, 4, NUM_WARPS, HEAD_DIM, True) <= _SMEM_LIMIT[arch.name] else 3


@functools.lru_cache(maxsize=None)
def sparse_decode_config(page_size: int, arch: Arch) -> Sm80DecodeConfig:
    return Sm80DecodeConfig("bf16", HEAD_DIM, HEAD_DIM_V, page_size, BLOCK_M, BLOCK_N, _stages(arch), NUM_WARPS,
                            _SMEM_LIMIT[arch.name], sparse=True)


def ctas_per_sm(arch: Arch, smem_per_sm: int) -> int:
    """Sparse split-KV CTAs resident per SM, at least 1."""
    smem = _sm80_smem_bytes(BLOCK_M, BLOCK_N, _stages(arch), NUM_WARPS, HEAD_DIM, True)
    return sm80_resident_ctas(smem, NUM_WARPS, BLOCK_M, smem_per_sm)


def num_sm_parts(num_sms: int, resident: int, h_q: int) -> int:
    """SM parts of the schedule: one wave of split-KV CTAs over the ceil(h_q / 16) head tiles."""
    return max(1, num_sms * resident // -(-h_q // BLOCK_M))
