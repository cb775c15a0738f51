"""Configs of the DeepSeek V3.2 indexer (DeepGEMM's fp8_mqa_logits, fp8_paged_mqa_logits and
get_paged_mqa_logits_metadata): pure functions of the head count, head dim, next_n, page size and
arch. Lengths, batch and key counts are runtime values."""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from ..jit.arch import Arch
from .fields import check_fields

INDEXER_HEADS = (8, 16, 32, 64)
INDEXER_HEAD_DIMS = (64, 128)
INDEXER_PAGE_SIZES = (32, 64, 128)
INDEXER_MAX_NEXT_N = 4
SM90_TUNINGS = ("sm_90a",)
SM80_TUNINGS = ("sm_80", "sm_86", "sm_89")   # the mma.sync kernels (sm_89: FP8 mma)
SM80_SMEM_LIMITS = {"sm_80": 163 * 1024, "sm_86": 99 * 1024, "sm_89": 99 * 1024}
TILE_KEYS = 64            # keys per tile of both kernels (the schedule's unit)
LOGITS_N = 128            # fp8_mqa_logits: query tokens x heads per q block (the wgmma N)
SMEM_LIMIT = 227 * 1024


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def _smem(n_cols: int, head_dim: int, stages: int) -> int:
    """Shared memory of the sm90 kernels: two Q slots of n_cols rows, the key stages, barriers and alignment."""
    q = 2 * n_cols * head_dim + 2 * n_cols * 4
    return q + stages * (TILE_KEYS * head_dim + TILE_KEYS * 4) + 1024 + 1024


@dataclass(frozen=True)
class LogitsConfig:
    """fp8_mqa_logits on sm_90a: q blocks of 256 / heads tokens, 64-key tiles through num_stages.
    linear_on_mma: relu's linear half computed by the wgmma from 4 e4m3 terms of sum_h w_h q_h per
    token (indexer/linear_terms.cuh), 512 / heads more wgmma columns, one FFMA a head in the epilogue."""
    heads: int
    head_dim: int
    num_stages: int = 12
    linear_on_mma: bool = False

    def __post_init__(self):
        check_fields(self, heads=INDEXER_HEADS, head_dim=INDEXER_HEAD_DIMS, num_stages=range(2, 17),
                     linear_on_mma=(False, True))
        if self.linear_on_mma and self.heads < 32:   # (more q' columns than registers: spills)
            from ..errors import InvalidArgumentError
            raise InvalidArgumentError("LogitsConfig.linear_on_mma", "heads of 32 or 64", self.heads)

    @property
    def linear_cols(self) -> int:
        """Extra wgmma columns of a math warpgroup's tile: 4 q' terms of each of its tokens."""
        return 4 * LOGITS_N // self.heads if self.linear_on_mma else 0

    @property
    def unit_rows(self) -> int:
        """Query rows of a work unit: two math warpgroups of 128 / heads rows."""
        return 2 * LOGITS_N // self.heads

    @property
    def min_chunk_keys(self) -> int:
        """Fewest keys of a work unit (logits_chunk_keys): both math warpgroups reach a unit's end
        together, so the tensor cores drain there, and its start (Q, q' rows, first wgmma) adds to
        it. On the H200, interleaved: 8192 keys 1.04-1.07x 4096 on the benchmark's mid rows, 16384
        1.036-1.082x 8192 on the long ones (kv 32768, 131072), the others within 1%."""
        return 16384

    @property
    def smem_bytes(self) -> int:
        tile = -(-(LOGITS_N + self.linear_cols) * self.head_dim // 1024) * 1024   # a 1024-aligned Q tile
        return _smem(2 * LOGITS_N, self.head_dim, self.num_stages) + 4 * (tile - LOGITS_N * self.head_dim) + 1024


@dataclass(frozen=True)
class PagedConfig:
    """fp8_paged_mqa_logits on sm_90a: next_n tokens x heads columns, 64-key tiles of page_size pages."""
    heads: int
    head_dim: int
    next_n: int
    page_size: int
    num_stages: int = 10
    math_warpgroups: int = 2   # taking the CTA's tiles in turn (paged_logits_sm90.cuh)
    load_warps: int = 2        # issuing the CTA's tiles' loads in turn
    linear_on_mma: bool = False   # relu's linear half by the wgmma (LogitsConfig's), Q copied per warpgroup

    def __post_init__(self):
        # load_warps: the kernel takes 1 to 3; only 2 has run on a GPU (1 and 3: bench/NOTES.md session 30).
        check_fields(self, heads=INDEXER_HEADS, head_dim=INDEXER_HEAD_DIMS, next_n=range(1, INDEXER_MAX_NEXT_N + 1),
                     page_size=INDEXER_PAGE_SIZES, num_stages=range(2, 17), math_warpgroups=(2, 3),
                     load_warps=(2,), linear_on_mma=(False, True))
        lin_cols = 4 * self.next_n if self.linear_on_mma else 0
        if self.linear_on_mma and (self.next_n % 2 or self.next_n * self.heads + lin_cols > 256):
            from ..errors import InvalidArgumentError   # (whole 8-column groups, one wgmma N)
            raise InvalidArgumentError("PagedConfig.linear_on_mma", "an even next_n with next_n x (heads + 4) "
                                       "<= 256", self.linear_on_mma)
        # Each stage serves one math warpgroup and is filled by one load warp (paged_logits_sm90.cuh).
        if self.num_stages % math.lcm(self.math_warpgroups, self.load_warps):
            from ..errors import InvalidArgumentError
            raise InvalidArgumentError("PagedConfig.num_stages", f"a multiple of math_warpgroups "
                                       f"({self.math_warpgroups}) and load_warps ({self.load_warps})",
                                       self.num_stages)

    @property
    def num_threads(self) -> int:
        return 128 * (1 + self.math_warpgroups)

    @property
    def smem_bytes(self) -> int:
        """paged_logits_sm90.cuh's SharedStorage, an upper bound: each member rounded up to its
        alignment (1024 for the Q copies, 128 for the rest), the struct to 1024 (its alignment), plus
        Sm90SmemSize's 1024 bytes of slack."""
        n, lin_cols = self.next_n * self.heads, 4 * self.next_n if self.linear_on_mma else 0
        q_tile = _round_up((n + lin_cols) * self.head_dim, 1024)
        copies = self.math_warpgroups if self.linear_on_mma else 1
        small = (_round_up(2 * _round_up(n, 32) * 4, 128)                          # weights
                 + _round_up(2 * self.math_warpgroups * max(lin_cols, 1) * 4, 128)  # lin_scale
                 + _round_up(self.math_warpgroups * 4 * 4 * 4, 128)                 # lin_red
                 + _round_up((6 + 2 * self.num_stages) * 8, 128))                   # barriers
        stages = self.num_stages * (TILE_KEYS * self.head_dim + TILE_KEYS * 4)
        return _round_up(2 * copies * q_tile + stages + small, 1024) + 1024


@dataclass(frozen=True)
class IndexerMetadataConfig:
    """get_paged_mqa_logits_metadata: arch-neutral, one CTA."""
    tile_keys: int = TILE_KEYS

    def __post_init__(self):
        check_fields(self, tile_keys=(TILE_KEYS,))


def _sm80_smem(n_cols: int, head_dim: int, stages: int, fp8_mma: bool) -> int:
    """Shared memory of the mma.sync kernels: the key stages and the Q tile (fp16 without FP8 mma)."""
    return stages * (TILE_KEYS * head_dim + TILE_KEYS * 4) + n_cols * head_dim * (1 if fp8_mma else 2)


def paged_warp_tokens(next_n: int, heads: int) -> int:
    """Query tokens of a warp of the mma.sync paged kernel: the most that divide next_n in 64 columns
    (paged_logits_sm80.cuh's paged_warp_tokens)."""
    return max(t for t in range(1, next_n + 1) if next_n % t == 0 and (t == 1 or t * heads <= 64))


@dataclass(frozen=True)
class LogitsSm80Config:
    """fp8_mqa_logits on the mma.sync family: warps of warp_keys keys x 64 columns (64 / warp_keys key
    groups by token_groups), q blocks of 64 token_groups / heads tokens, 64-key tiles through
    num_stages cp.async stages; fp8_mma (sm_89) or e4m3 converted to fp16 (sm_80 / sm_86)."""
    heads: int
    head_dim: int
    num_stages: int
    fp8_mma: bool
    warp_keys: int = 32      # 16: two accumulators fit (mma_sm80.cuh's kPipelined)
    token_groups: int = 4

    def __post_init__(self):
        check_fields(self, heads=INDEXER_HEADS, head_dim=INDEXER_HEAD_DIMS, num_stages=range(2, 17),
                     fp8_mma=(True, False), warp_keys=(16, 32), token_groups=(1, 2, 4))

    @property
    def unit_rows(self) -> int:
        """Query rows of a work unit (a divisor of the op's row alignment, 256 / heads)."""
        return 64 * self.token_groups // self.heads

    @property
    def min_chunk_keys(self) -> int:
        """Fewest keys of a work unit (logits_chunk_keys)."""
        return 4096

    @property
    def num_threads(self) -> int:
        return 32 * (TILE_KEYS // self.warp_keys) * self.token_groups

    @property
    def smem_bytes(self) -> int:
        return _sm80_smem(64 * self.token_groups, self.head_dim, self.num_stages, self.fp8_mma)


@dataclass(frozen=True)
class PagedSm80Config:
    """fp8_paged_mqa_logits on the mma.sync family: next_n x heads columns in token groups of at most
    64, 4 key groups of 16 keys or 2 of 32 (paged_logits_sm80.cuh), 64-key tiles of page_size pages
    through num_stages cp.async stages."""
    heads: int
    head_dim: int
    next_n: int
    page_size: int
    num_stages: int
    fp8_mma: bool

    def __post_init__(self):
        check_fields(self, heads=INDEXER_HEADS, head_dim=INDEXER_HEAD_DIMS, next_n=range(1, INDEXER_MAX_NEXT_N + 1),
                     page_size=INDEXER_PAGE_SIZES, num_stages=range(2, 17), fp8_mma=(True, False))

    @property
    def num_threads(self) -> int:
        token_groups = self.next_n // paged_warp_tokens(self.next_n, self.heads)
        warp_keys = 16 if token_groups <= 2 else 32
        return 32 * token_groups * (64 // warp_keys)

    @property
    def smem_bytes(self) -> int:
        return _sm80_smem(self.next_n * self.heads, self.head_dim, self.num_stages, self.fp8_mma)


@functools.lru_cache(maxsize=None)
def logits_sm80_config(heads: int, head_dim: int, arch: Arch) -> LogitsSm80Config:
    # The deepest ring that fits the arch's shared memory beside the Q tile (tiles in flight). Warps of
    # 32 keys x 64 columns, one accumulator: on the H200 (forced) 1.15-1.19x (sm_80) and 1.04-1.24x
    # (sm_89) the 16-key warps with two accumulators (bench/NOTES.md, session 16).
    for stages in (6, 4, 3, 2):
        cfg = LogitsSm80Config(heads, head_dim, stages, arch.name == "sm_89", warp_keys=32, token_groups=4)
        if cfg.smem_bytes <= SM80_SMEM_LIMITS[arch.name]:
            return cfg
    raise AssertionError("no mma.sync indexer config fits")   # (2 stages fit every shape)


@functools.lru_cache(maxsize=None)
def paged_sm80_config(heads: int, head_dim: int, next_n: int, page_size: int, arch: Arch) -> PagedSm80Config:
    # Memory-bound: the deepest ring that fits.
    for stages in (8, 6, 4, 3, 2):
        cfg = PagedSm80Config(heads, head_dim, next_n, page_size, stages, arch.name == "sm_89")
        if cfg.smem_bytes <= SM80_SMEM_LIMITS[arch.name]:
            return cfg
    raise AssertionError("no mma.sync paged indexer config fits")


@functools.lru_cache(maxsize=None)
def logits_config(heads: int, head_dim: int, arch: Arch) -> LogitsConfig:
    # relu's linear half on the tensor cores with 64 heads (8 more wgmma columns: 1.03-1.13x on the
    # H200); with 32 heads (16 more) it measured 0.98x, with 16 0.90-0.93x (bench/NOTES.md).
    return LogitsConfig(heads, head_dim, linear_on_mma=heads == 64)


@functools.lru_cache(maxsize=None)
def paged_config(heads: int, head_dim: int, next_n: int, page_size: int, arch: Arch) -> PagedConfig:
    # The deepest key ring that fits beside the Q slots (memory-bound: tiles in flight). Three
    # math warpgroups where a tile's accumulator and weights fit their 152 registers (next_n x heads
    # <= 128), else two.
    # Two load warps: one alone issues a tile about as fast as DRAM serves them.
    math_wgs, load_warps = (3 if next_n * heads <= 128 else 2), 2
    # relu's linear half on the tensor cores where the epilogue bounds the tile (64 heads, next_n 2;
    # other head counts compile without spills but are not measured).
    linear = heads == 64 and next_n == 2
    for stages in (12, 10, 9, 8, 6):
        if stages % math.lcm(math_wgs, load_warps):   # each stage: one math warpgroup, one load warp
            continue
        cfg = PagedConfig(heads, head_dim, next_n, page_size, stages, math_wgs, load_warps, linear)
        if cfg.smem_bytes <= SMEM_LIMIT:
            return cfg
    raise AssertionError("no paged indexer config fits")   # (6 stages fit every shape)


def logits_chunk_keys(n_keys: int, num_q_blocks: int, num_sms: int, min_keys: int = 4096) -> int:
    """Keys per work unit of fp8_mqa_logits: at least min_keys (few unit overheads) but halved, down
    to 4096, while that leaves fewer than two units an SM (few query rows over many keys would
    otherwise leave SMs idle), and fine enough that each SM gets about 64 units (the static snake
    order balances to about 1/64)."""
    sms = max(num_sms, 1)
    per_unit = n_keys * num_q_blocks // (64 * sms)
    floor = min_keys
    while floor > 4096 and num_q_blocks * -(-n_keys // floor) < 2 * sms:
        floor = max(4096, floor // 2 // TILE_KEYS * TILE_KEYS)
    return max(floor, per_unit // TILE_KEYS * TILE_KEYS)
