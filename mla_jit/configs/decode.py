"""Configs of the dense paged MLA decode (sm90): pure functions of shapes and arch."""
from __future__ import annotations

import functools
from dataclasses import dataclass

from ..jit.arch import Arch

BLOCK_M = 64           # query rows (s_q * heads per KV head) per CTA tile
BLOCK_N = 64           # KV tokens per pipeline stage
FIXED_OVERHEAD_BLOCKS = 5   # scheduler cost of starting a split, in KV blocks
SUPPORTED_HEAD_DIMS = ((576, 512), (512, 512))
SUPPORTED_PAGE_SIZES = (16, 32, 64, 128, 256)


@dataclass(frozen=True)
class MetadataConfig:
    block_n: int
    fixed_overhead_blocks: int


@dataclass(frozen=True)
class DecodeConfig:
    dtype: str          # "bf16" or "fp16"
    head_dim: int       # d of q and k
    head_dim_v: int     # leading columns of the cache that are V
    page_size: int
    block_m: int
    block_n: int
    num_stages: int


@functools.lru_cache(maxsize=None)
def metadata_config() -> MetadataConfig:
    return MetadataConfig(BLOCK_N, FIXED_OVERHEAD_BLOCKS)


@functools.lru_cache(maxsize=None)
def decode_config(dtype: str, head_dim: int, head_dim_v: int, page_size: int, arch: Arch) -> DecodeConfig:
    # Q (64 x d) + 2 KV stages (64 x d each) fill Hopper's 227 KB; 3 stages do not fit at d=576.
    return DecodeConfig(dtype, head_dim, head_dim_v, page_size, BLOCK_M, BLOCK_N, num_stages=2)


def num_sm_parts(num_sms: int, num_q_tokens_per_head_k: int, num_heads_k: int) -> int:
    """CTAs per (KV head, row tile) so that one wave covers the GPU."""
    row_tiles = -(-num_q_tokens_per_head_k // BLOCK_M)
    return max(1, num_sms // (num_heads_k * row_tiles))


def accum_rows(batch: int, parts: int) -> int:
    """Upper bound on split slots: every batch once plus one extra cut per SM part."""
    return batch + parts
