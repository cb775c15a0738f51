"""Configs of the DeepSeek V3.2 indexer (DeepGEMM's fp8_mqa_logits, fp8_paged_mqa_logits and
get_paged_mqa_logits_metadata): pure functions of the head count, head dim, next_n, page size and
arch. Lengths, batch and key counts are runtime values."""
from __future__ import annotations

import functools
from dataclasses import dataclass

from ..jit.arch import Arch
from .fields import check_fields

INDEXER_HEADS = (8, 16, 32, 64)
INDEXER_HEAD_DIMS = (64, 128)
INDEXER_PAGE_SIZES = (32, 64, 128)
INDEXER_MAX_NEXT_N = 4
SM90_TUNINGS = ("sm_90a",)
TILE_KEYS = 64            # keys per tile of both kernels (the schedule's unit)
LOGITS_N = 128            # fp8_mqa_logits: query tokens x heads per q block (the wgmma N)
SMEM_LIMIT = 227 * 1024


def _smem(n_cols: int, head_dim: int, stages: int) -> int:
    """Shared memory of the sm90 kernels: two Q slots of n_cols rows, the key stages, barriers and alignment."""
    q = 2 * n_cols * head_dim + 2 * n_cols * 4
    return q + stages * (TILE_KEYS * head_dim + TILE_KEYS * 4) + 1024 + 1024


@dataclass(frozen=True)
class LogitsConfig:
    """fp8_mqa_logits on sm_90a: q blocks of 256 / heads tokens, 64-key tiles through num_stages."""
    heads: int
    head_dim: int
    num_stages: int = 8

    def __post_init__(self):
        check_fields(self, heads=INDEXER_HEADS, head_dim=INDEXER_HEAD_DIMS, num_stages=range(2, 17))

    @property
    def unit_rows(self) -> int:
        """Query rows of a work unit: two math warpgroups of 128 / heads rows."""
        return 2 * LOGITS_N // self.heads

    @property
    def smem_bytes(self) -> int:
        return _smem(2 * LOGITS_N, self.head_dim, self.num_stages)


@dataclass(frozen=True)
class PagedConfig:
    """fp8_paged_mqa_logits on sm_90a: next_n tokens x heads columns, 64-key tiles of page_size pages."""
    heads: int
    head_dim: int
    next_n: int
    page_size: int
    num_stages: int = 10

    def __post_init__(self):
        check_fields(self, heads=INDEXER_HEADS, head_dim=INDEXER_HEAD_DIMS, next_n=range(1, INDEXER_MAX_NEXT_N + 1),
                     page_size=INDEXER_PAGE_SIZES, num_stages=range(2, 17))

    @property
    def smem_bytes(self) -> int:
        return _smem(self.next_n * self.heads, self.head_dim, self.num_stages)


@dataclass(frozen=True)
class IndexerMetadataConfig:
    """get_paged_mqa_logits_metadata: arch-neutral, one CTA."""
    tile_keys: int = TILE_KEYS

    def __post_init__(self):
        check_fields(self, tile_keys=(TILE_KEYS,))


@functools.lru_cache(maxsize=None)
def logits_config(heads: int, head_dim: int, arch: Arch) -> LogitsConfig:
    return LogitsConfig(heads, head_dim)


@functools.lru_cache(maxsize=None)
def paged_config(heads: int, head_dim: int, next_n: int, page_size: int, arch: Arch) -> PagedConfig:
    # The deepest key ring that fits beside the two Q slots (memory-bound: tiles in flight).
    for stages in (12, 10, 8, 6):
        cfg = PagedConfig(heads, head_dim, next_n, page_size, stages)
        if cfg.smem_bytes <= SMEM_LIMIT:
            return cfg
    raise AssertionError("no paged indexer config fits")   # (6 stages fit every shape)


def logits_chunk_keys(n_keys: int, num_q_blocks: int, num_sms: int) -> int:
    """Keys per work unit of fp8_mqa_logits: at least 4096 (few unit overheads), and fine enough that
    each SM gets about 64 units (static round robin balances to about 1/64)."""
    per_unit = n_keys * num_q_blocks // (64 * max(num_sms, 1))
    return max(4096, per_unit // TILE_KEYS * TILE_KEYS)
