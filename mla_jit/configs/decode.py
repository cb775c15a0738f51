"""Configs of the dense paged MLA decode (sm90; the Ampere / Ada family in configs/decode_sm80.py):
pure functions of shapes and arch, and what both families share."""
from __future__ import annotations

import functools
from dataclasses import dataclass

from ..errors import InvalidArgumentError
from ..jit import env
from ..jit.arch import Arch
from .fields import check_fields

# The decode family's knobs (read live; part of the warm-path plan key with MLA_JIT_ARCH).
SCHEDULE_ENV = env.declare(
    "MLA_JIT_SM90_DECODE_SCHEDULE", "auto",
    "Hopper split-KV schedule: `auto` (`ws` for small calls, where host time dominates; `ws_unfused` "
    "otherwise), `ws` (warp-specialized, with the combine fused in) or `ws_unfused` (the same with the "
    "combine kernel).",
    choices=("auto", "ws", "ws_unfused"), owner=__name__)
CLUSTER_ENV = env.declare(
    "MLA_JIT_SM90_CLUSTER", "auto",
    "Row tiles per thread block cluster of the Hopper `ws` kernels, which then load each KV tile once per "
    "cluster (TMA multicast): `auto` or `2` (2 where the row tiles are even, else 1) or `1`. `2` also "
    "pairs the sparse decode's two head tiles (65-128 heads, FP8 records) so that they share each tile's "
    "de-quantization (experimental: `auto` leaves them unpaired). A clustered launch falls back to none "
    "when the GPU cannot keep every cluster resident at once (cuOccupancyMaxActiveClusters).",
    choices=("auto", "1", "2"), owner=__name__)
BLOCK_M = 64           # query rows (s_q * heads per KV head) per CTA tile
BLOCK_N = 64           # KV tokens per pipeline stage
FIXED_OVERHEAD_BLOCKS = 5   # scheduler cost of starting a split, in KV blocks
COMBINE_THREADS = 256       # combine kernel: kCombineThreads (decode/combine.cuh)
COMBINE_ROWS_PER_CTA = 8    # kCombineRowsPerCta: a warp per query row
SUPPORTED_HEAD_DIMS = ((576, 512), (512, 512))
SUPPORTED_PAGE_SIZES = (16, 32, 64, 128, 256)
# Sm80DecodeConfig.sparse -> the kernel's SPARSE_KV (splitkv_sm80.cuh).
SPARSE_KV = {"": 0, "fp8_records": 1, "bf16_rows": 2}


@dataclass(frozen=True)
class MetadataConfig:
    block_n: int
    fixed_overhead_blocks: int

    def __post_init__(self):
        # block_n: the KV tokens per split-KV tile of every decode kernel (the scheduler cuts there).
        check_fields(self, block_n=(BLOCK_N,), fixed_overhead_blocks=range(0, 65))


SCHEDULES = ("ws", "ws_unfused")
# Pipeline stages of the sm90 kernels per dtype: Q[:, :dv] in registers and P in each stage's rope
# columns (or an 8 KB buffer per stage at d = dv) leave room for 3 stages of 2-byte KV (224 KB at
# d = 576, 216 KB at d = 512); an e4m3 stage is half the bytes, and 4 of them fit.
STAGES = {"bf16": 3, "fp16": 3, "e4m3": 4}
# A 16-bit q over an e4m3 cache: 2 16-bit stages and 2 e4m3 landing slots (the same 221 KB at d = 576).
KV_FP8_STAGES = 2


def stages_for(dtype: str, kv_dtype: str | None = None) -> int:
    """Pipeline stages of the sm90 kernel for `dtype` q over a `kv_dtype` cache (None: q's dtype)."""
    return KV_FP8_STAGES if kv_dtype == "e4m3" else STAGES.get(dtype, 3)


def out_dtype_of(dtype: str) -> str:
    """The dtype of out for `dtype` q: its own, except bf16 for e4m3 (vLLM's FP8 decode)."""
    return "bf16" if dtype == "e4m3" else dtype


# Caches a 16-bit q may read besides its own dtype: e4m3, de-quantized on chip (the accurate FP8 path).
KV_DTYPES = (None, "e4m3")


@dataclass(frozen=True)
class DecodeConfig:
    dtype: str          # "bf16" or "fp16" (q, cache and out), or "e4m3" (q and cache; out bf16)
    head_dim: int       # d of q and k
    head_dim_v: int     # leading columns of the cache that are V
    page_size: int
    block_m: int
    block_n: int
    num_stages: int
    # "ws": S/softmax warpgroup + two P V warpgroups (splitkv_ws.cuh), splits merged in the kernel;
    # "ws_unfused": the same with the combine kernel.
    schedule: str = "ws"
    # Row tiles per thread block cluster; each KV tile is loaded once per cluster (TMA multicast)
    # instead of once per row tile.
    cluster_m: int = 1
    # None: the cache has q's dtype. "e4m3" (with a bf16 / fp16 q): the kernel de-quantizes each
    # KV tile in shared memory and multiplies in q's dtype.
    kv_dtype: str | None = None
    # At most 32 query rows a KV head (one row tile): the rows in the first row half of each warp's
    # 16, so the softmax warpgroup runs its per-row work for one of a thread's two rows (splitkv_ws.cuh).
    compact_rows: bool = False
    # e4m3: S in two token halves, the first half's softmax beside the second half's wgmmas (splitkv_ws.cuh
    # kSHalves); decode_config picks it at S_HALVES_MIN_ROWS query rows a KV head and more.
    s_halves: bool = False

    num_threads = 384   # a producer warpgroup, the S/softmax warpgroup, two P V warpgroups

    def __post_init__(self):
        # (dtype and kv_dtype are checked before num_stages, whose values depend on them.)
        if self.kv_dtype not in KV_DTYPES:
            raise InvalidArgumentError("DecodeConfig.kv_dtype", f"one of {KV_DTYPES}", repr(self.kv_dtype))
        if self.kv_dtype is not None and self.dtype not in ("bf16", "fp16"):
            raise InvalidArgumentError("DecodeConfig.kv_dtype", "None unless dtype is bf16 or fp16",
                                       f"{self.kv_dtype!r} with dtype {self.dtype!r}")
        check_fields(self, schedule=SCHEDULES, cluster_m=(1, 2), dtype=tuple(STAGES), compact_rows=(False, True),
                     head_dim=tuple(d for d, _ in SUPPORTED_HEAD_DIMS), page_size=SUPPORTED_PAGE_SIZES,
                     block_m=(BLOCK_M,), block_n=(BLOCK_N,), num_stages=(stages_for(self.dtype, self.kv_dtype),))
        if self.compact_rows and self.cluster_m != 1:   # (at most 32 rows: one row tile)
            raise InvalidArgumentError("DecodeConfig.compact_rows", "False with cluster_m 2", self.compact_rows)
        if self.s_halves and self.dtype != "e4m3":
            raise InvalidArgumentError("DecodeConfig.s_halves", "False unless dtype is 'e4m3'", self.s_halves)
        if (self.head_dim, self.head_dim_v) not in SUPPORTED_HEAD_DIMS:
            raise InvalidArgumentError("DecodeConfig.head_dim_v", f"(head_dim, head_dim_v) in {SUPPORTED_HEAD_DIMS}",
                                       f"({self.head_dim}, {self.head_dim_v})")

    @property
    def cluster(self) -> tuple[int, int, int] | None:
        """Cluster dims of the split-KV launch (grid (parts, h_kv, row tiles)), None for none."""
        return (1, 1, self.cluster_m) if self.cluster_m > 1 else None

    @property
    def chunks_per_load(self) -> int:
        """Column chunks (64 columns) a TMA load covers (splitkv_ws.cuh, kChunksPerLoad)."""
        return _chunks_per_load(self.head_dim, self.page_size, self.cluster_m)

    @property
    def fused_combine(self) -> bool:
        """The split-KV kernel merges the splits itself (no combine kernel; needs combine_counters)."""
        return self.schedule == "ws"


@functools.lru_cache(maxsize=None)
def metadata_config() -> MetadataConfig:
    return MetadataConfig(BLOCK_N, FIXED_OVERHEAD_BLOCKS)


# Fused combine: the CTA completing a batch merges its fp32 partials alone, with 12 warps of one
# SM, after its main loop; the combine kernel spreads them over b * h_kv * ceil(rows / 8) CTAs of
# 8 warps. Fusing saves one launch (~4-5 us of host time). Since the partials are stored with an
# L2 evict_last hint (and single-row-tile KV with evict_first), the combine kernel reads them
# from L2 and is as fast or faster on every shape measured (H200, bench/compare_fused_combine.py,
# unfused / fused GPU time: 0.44-0.99, e.g. 1/1/512/16 0.65, 32/1/4096/16 0.96, 128/2/4096/128
# 0.985). So the kernel fuses only where a call is small enough that host time, not GPU time,
# bounds it: the KV the block table can address is at most FUSED_COMBINE_MAX_KV_BYTES (there a
# call's GPU time, ~10-25 us, is about its host time).
FUSED_COMBINE_MAX_KV_BYTES = 4 << 20
# Within that, the partials per batch must be small (measured before the L2 hints: rows <= 16
# 0.97-1.09x fused / unfused; ~190 KB per batch 1.00-1.015x; 330 KB 0.955x; 0.6-8 MB 0.64-0.94x).
FUSED_COMBINE_MAX_BYTES = 200 * 1024
FUSED_COMBINE_ANY_BYTES_ROWS = 16


def fused_combine_pays(batch: int, rows: int, parts: int, head_dim_v: int, max_seq_tokens: int,
                       kv_bytes_per_token: int = 576 * 2, block_m: int = BLOCK_M, block_n: int = BLOCK_N) -> bool:
    """Whether the sm90 ws kernel should merge the splits itself (the "auto" schedule): only for
    small calls (batch x max_seq_tokens x kv_bytes_per_token, the KV block_table can address, at
    most FUSED_COMBINE_MAX_KV_BYTES), and then only if the partials a completing CTA reads are
    small: splits per batch x rows per tile x dv x 4 B, with splits per batch estimated as the
    scheduler's average (batch + parts) / batch, at most one per KV tile."""
    if batch * max_seq_tokens * kv_bytes_per_token > FUSED_COMBINE_MAX_KV_BYTES:
        return False
    tile_rows = min(rows, block_m)
    if tile_rows <= FUSED_COMBINE_ANY_BYTES_ROWS:
        return True
    splits = min((batch + parts) / batch, -(-max_seq_tokens // block_n))
    return splits * tile_rows * head_dim_v * 4 <= FUSED_COMBINE_MAX_BYTES


def cluster_m_for(row_tiles: int, choice: str = "auto") -> int:
    """Row tiles per cluster of the ws kernels for `row_tiles` row tiles (grid z) and the
    MLA_JIT_SM90_CLUSTER choice ("auto" or "2": 2 where row_tiles is even, else 1; "1": 1). Row
    tiles of one KV head and SM part read the same KV tiles: with one row tile there is nothing to
    share. Interleaved against none (H200): 1.11-1.25x at h_q = 128, s_q = 1, where the pair covers
    both row tiles; 1.006-1.039x at s_q = 2 (two clusters per KV head). Not 4: the 33 clusters of
    4 a 132-SM grid of 4 row tiles needs cannot all be resident (30 fit on the H200)."""
    return 2 if choice != "1" and row_tiles % 2 == 0 else 1


# S by token halves (e4m3) from this many query rows a KV head. Interleaved against one S chain (H200,
# bench/NOTES.md session 39; halves' time / one chain's): 0.962-0.984 at h_q 128 s_q 4-16, 1.029-1.033
# at h_q 128 s_q 1, 1.001-1.035 at h_q 16 s_q 1-16 (up to 256 rows).
S_HALVES_MIN_ROWS = 512


@functools.lru_cache(maxsize=None)
def decode_config(dtype: str, head_dim: int, head_dim_v: int, page_size: int, arch: Arch,
                  schedule: str = "ws", cluster_m: int = 1, kv_dtype: str | None = None,
                  rows: int | None = None) -> DecodeConfig:
    """kv_dtype: the cache's dtype where it is not q's (`dtype`). rows: query rows a KV head (s_q x
    h_q / h_kv), where known: compact rows at most BLOCK_M / 2 (one row tile, half of it padding); e4m3
    S by token halves at S_HALVES_MIN_ROWS or more."""
    kv_dtype = None if kv_dtype == dtype else kv_dtype
    return DecodeConfig(dtype, head_dim, head_dim_v, page_size, BLOCK_M, BLOCK_N,
                        num_stages=stages_for(dtype, kv_dtype), schedule=schedule, cluster_m=cluster_m,
                        kv_dtype=kv_dtype, compact_rows=rows is not None and rows <= BLOCK_M // 2 and cluster_m == 1,
                        s_halves=dtype == "e4m3" and rows is not None and rows >= S_HALVES_MIN_ROWS)


def _chunks_per_load(head_dim: int, page_size: int, cluster_m: int) -> int:
    """A tile's column chunks in one TMA load (a page per tile), or in one load per cluster CTA and
    group (2 groups of 4 at d = 512, 3 of 3 at d = 576, taken in turns); smaller pages 1 (a load a
    page and chunk). Interleaved on the H200 against a load per chunk (bench/NOTES.md, session 35):
    the e4m3 kernel 1.03-1.08x (the producer's 9 issues were ~540 clocks of its tile period), the
    bf16 kernel 0.997-1.006x."""
    chunks = head_dim // 64
    if page_size < BLOCK_N:
        return 1
    if cluster_m == 1:
        return chunks
    return chunks // 2 if chunks % 2 == 0 else 3


def num_sm_parts(num_sms: int, num_q_tokens_per_head_k: int, num_heads_k: int, block_m: int = BLOCK_M) -> int:
    """CTAs per (KV head, row tile) so that one wave covers the GPU."""
    row_tiles = -(-num_q_tokens_per_head_k // block_m)
    return max(1, num_sms // (num_heads_k * row_tiles))


def accum_rows(batch: int, parts: int) -> int:
    """Upper bound on split slots: every batch once plus one extra cut per SM part."""
    return batch + parts
