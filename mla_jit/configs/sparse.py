"""Configs of the sparse (DSA) attention kernels: pure functions of the arch and the token storage.

The kernel is the mma.sync split-KV kernel (splitkv_sm80.cuh) with SPARSE_KV: 16 query heads of one
query token per CTA, Q in registers, 16-token tiles gathered by index (cp.async). Tokens are
FlashMLA's FP8 records (the decode's cache, also read by the sparse prefill: each tile's e4m3 values
de-quantized into bf16 one tile ahead of its use) or bf16 rows (the sparse prefill's kv, d_qk 576 or
512). It serves every arch, Hopper included, until a wgmma kernel lands.
"""
from __future__ import annotations

import functools

from ..jit.arch import Arch
from .decode import Sm80DecodeConfig, _sm80_smem_bytes, sm80_resident_ctas

# FlashMLA's V3.2 FP8 record of a token: 512 e4m3 values, 4 float32 scales (one per 128 values),
# 64 bf16 rope values.
RECORD_BYTES = 656
HEAD_DIM, HEAD_DIM_V = 576, 512
# Sparse prefill over bf16 rows: d_qk 576 (V3.2) or 512 (V4).
PREFILL_HEAD_DIMS = (576, 512)
BLOCK_M, BLOCK_N, NUM_WARPS = 16, 16, 4
MAX_TOPK = 1 << 20
# Token storage -> Sm80DecodeConfig.sparse.
FP8_RECORDS, BF16_ROWS = "fp8_records", "bf16_rows"
# bf16 rows are not paged: the config's page size is a fixed placeholder.
_ROWS_PAGE = 64
# Per-block shared memory the tile plans may take: sm_80 163 KB, sm_86 / sm_89 99 KB, sm_90a 227 KB.
_SMEM_LIMIT = {"sm_80": 163 * 1024, "sm_86": 99 * 1024, "sm_89": 99 * 1024, "sm_90a": 227 * 1024}


def _stages(arch: Arch, head_dim: int, kv: str) -> int:
    """4 stages where they fit (FP8 records 111.6 KB, bf16 rows <= 78 KB), else 3 (FP8 records: 84.7
    KB on the 99 KB Ada / GA10x blocks)."""
    return 4 if _sm80_smem_bytes(BLOCK_M, BLOCK_N, 4, NUM_WARPS, head_dim, kv) <= _SMEM_LIMIT[arch.name] else 3


@functools.lru_cache(maxsize=None)
def sparse_config(kv: str, head_dim: int, page_size: int, arch: Arch) -> Sm80DecodeConfig:
    """The kernel over `kv` tokens (FP8_RECORDS in pages of page_size, or BF16_ROWS of head_dim)."""
    page = page_size if kv == FP8_RECORDS else _ROWS_PAGE
    return Sm80DecodeConfig("bf16", head_dim, HEAD_DIM_V, page, BLOCK_M, BLOCK_N, _stages(arch, head_dim, kv),
                            NUM_WARPS, _SMEM_LIMIT[arch.name], sparse=kv)


def sparse_decode_config(page_size: int, arch: Arch) -> Sm80DecodeConfig:
    return sparse_config(FP8_RECORDS, HEAD_DIM, page_size, arch)


def ctas_per_sm(cfg: Sm80DecodeConfig, smem_per_sm: int) -> int:
    """CTAs of the sparse kernel `cfg` resident per SM, at least 1."""
    return sm80_resident_ctas(cfg.smem_bytes, NUM_WARPS, BLOCK_M, smem_per_sm)


def num_sm_parts(num_sms: int, resident: int, h_q: int) -> int:
    """SM parts of the schedule: one wave of split-KV CTAs over the ceil(h_q / 16) head tiles."""
    return max(1, num_sms * resident // -(-h_q // BLOCK_M))
