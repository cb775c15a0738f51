"""Configs of the dense paged MLA decode (sm90): pure functions of shapes and arch."""
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
    "cluster (TMA multicast): `auto` or `2` (2 where the row tiles are even, else 1) or `1`. A clustered "
    "launch falls back to none when the GPU cannot keep every cluster resident at once "
    "(cuOccupancyMaxActiveClusters).",
    choices=("auto", "1", "2"), owner=__name__)
FP8_STAGE_RELEASE_ENV = env.declare(
    "MLA_JIT_SM90_FP8_STAGE_RELEASE", "after_pv",
    "When the Hopper e4m3 decode kernel (e4m3 q and cache) gives a KV stage back to its TMA producer: "
    "`after_pv` (once both P V warpgroups are done with the tile) or `early` (once S and the V^T "
    "transpositions have read it; P in slots of its own). `early` is not yet measured on a GPU.",
    choices=("after_pv", "early"), owner=__name__)
TMA_BOX_ENV = env.declare(
    "MLA_JIT_SM90_TMA_BOX", "chunk",
    "TMA loads of a KV tile in the Hopper dense decode kernels (pages >= 64): `chunk` (one per 64 columns) "
    "or `tile` (one 4-D box over the tile's column chunks; with a cluster, one per group of them). `tile` "
    "is not yet measured on a GPU.",
    choices=("chunk", "tile"), owner=__name__)

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


@dataclass(frozen=True)
class Sm80DecodeConfig:
    """The mma.sync + cp.async family (sm_80, sm_86, sm_89): tiles sized to each arch's smem."""
    dtype: str          # q's: "bf16" / "fp16" (out the same), or "e4m3" (q and cache; fp16 MMAs, bf16 out)
    head_dim: int
    head_dim_v: int
    page_size: int
    block_m: int
    block_n: int
    num_stages: int
    num_warps: int
    smem_limit: int     # bytes of shared memory per block on the tuning arch
    # "" the dense paged decode; else the sparse (DSA) kernel (configs/sparse.py) over gathered
    # tokens stored as FlashMLA's FP8 records ("fp8_records") or as bf16 rows ("bf16_rows": sparse
    # prefill's kv; page_size is then unused and kept at 64).
    sparse: str = ""
    # None: the cache has q's dtype. "e4m3" (with a bf16 / fp16 q): the accurate FP8 path. An e4m3
    # cache (this or dtype "e4m3") lands in num_stages landing slots and is converted exactly into
    # 2 K stages of the MMA dtype a tile ahead (splitkv_sm80.cuh, KV_FP8).
    kv_dtype: str | None = None
    # e4m3 -> fp16 by the sm_89+ cvt instruction instead of bit arithmetic (fp16 MMAs only).
    fp8_cvt: bool = False
    # K stages of the MMA dtype over an e4m3 cache: 2 (each tile converted a tile ahead), or 1 (converted
    # at its turn behind a second barrier: 32-token tiles, where 2 stages do not fit).
    fp8_k_stages: int = 2

    def __post_init__(self):
        # Field by field what SplitKVSm80Config's static_asserts accept (splitkv_sm80.cuh); the
        # combination (and smem_limit against the tiles) is the compiler's to check.
        check_fields(self, dtype=("bf16", "fp16", "e4m3"), head_dim=tuple(d for d, _ in SUPPORTED_HEAD_DIMS),
                     page_size=SUPPORTED_PAGE_SIZES, block_m=(16, 32, 64), block_n=(16, 32, 64),
                     num_stages=(2, 3, 4), num_warps=(4, 8), smem_limit=range(1, 228 * 1024 + 1))
        check_fields(self, sparse=tuple(SPARSE_KV), fp8_cvt=(False, True), fp8_k_stages=(2, 1))
        if self.kv_dtype not in KV_DTYPES:
            raise InvalidArgumentError("Sm80DecodeConfig.kv_dtype", f"one of {KV_DTYPES}", repr(self.kv_dtype))
        if self.kv_dtype is not None and self.dtype == "e4m3":
            raise InvalidArgumentError("Sm80DecodeConfig.kv_dtype", "None unless dtype is bf16 or fp16",
                                       f"{self.kv_dtype!r} with dtype {self.dtype!r}")
        if self.kv_fp8 and self.sparse:
            raise InvalidArgumentError("Sm80DecodeConfig.sparse", "'' with an e4m3 cache", repr(self.sparse))
        if self.fp8_k_stages != 2 and not self.kv_fp8:
            raise InvalidArgumentError("Sm80DecodeConfig.fp8_k_stages", "2 unless the cache is e4m3",
                                       str(self.fp8_k_stages))
        if self.fp8_cvt and not (self.kv_fp8 and self.mma_dtype == "fp16"):
            raise InvalidArgumentError("Sm80DecodeConfig.fp8_cvt", "False unless an e4m3 cache meets fp16 MMAs",
                                       f"True with dtype {self.dtype!r}, kv_dtype {self.kv_dtype!r}")
        if self.sparse and (self.dtype != "bf16" or (self.sparse == "fp8_records" and (
                self.head_dim != 576 or self.num_stages < 3))):
            raise InvalidArgumentError("Sm80DecodeConfig.sparse", "bf16 (fp8_records: head_dim 576 and >= 3 "
                                       "stages) with sparse", f"{self.dtype}, {self.head_dim}, {self.num_stages}")
        if (self.head_dim, self.head_dim_v) not in SUPPORTED_HEAD_DIMS:
            raise InvalidArgumentError("Sm80DecodeConfig.head_dim_v",
                                       f"(head_dim, head_dim_v) in {SUPPORTED_HEAD_DIMS}",
                                       f"({self.head_dim}, {self.head_dim_v})")

    @property
    def num_threads(self) -> int:
        return 32 * self.num_warps

    @property
    def kv_fp8(self) -> bool:
        """The cache is e4m3 (q e4m3 too, or the accurate path's 16-bit q)."""
        return self.dtype == "e4m3" or self.kv_dtype == "e4m3"

    @property
    def mma_dtype(self) -> str:
        """The MMAs' input dtype: q's, or fp16 for an e4m3 q (e4m3 values are exact in fp16)."""
        return "fp16" if self.dtype == "e4m3" else self.dtype

    @property
    def fused_combine(self) -> bool:
        """Never: this family's splits are merged by the combine kernel."""
        return False

    @property
    def cluster(self) -> None:
        """No thread block clusters (sm_80 has none)."""
        return None

    @property
    def q_in_registers(self) -> bool:
        """BLOCK_M 16: Q in registers, QK split over d across 4 warps (splitkv_sm80.cuh)."""
        return self.block_m == 16

    @property
    def smem_bytes(self) -> int:
        """The kernel's dynamic shared memory (SplitKVSm80Config::kSmemBytes)."""
        return _sm80_smem_bytes(self.block_m, self.block_n, self.num_stages, self.num_warps, self.head_dim,
                                self.sparse, self.fp8_k_stages if self.kv_fp8 else 0)


# Per-block shared memory: sm_80 163 KB, sm_86/sm_89 99 KB.
_SMEM_LIMIT = {"sm_80": 163 * 1024, "sm_86": 99 * 1024, "sm_89": 99 * 1024}
# Residency model of the sm80 family (sm_80 .. sm_90): shared memory the driver reserves per block,
# registers per SM, and their allocation granularity (per thread, warp-granular units of 256).
_SMEM_RESERVED_PER_BLOCK = 1024
_REGS_PER_SM = 65536
_REG_GRANULE = 8


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
    # e4m3 q and cache: a stage goes back to the TMA producer once S and the V^T transpositions have
    # read it, P in two slots of its own (splitkv_ws.cuh, kEarlyRelease); else after P V.
    early_release: bool = False
    # Column chunks (64 columns) a TMA load covers: 1, or (pages >= 64) a divisor of the tile's chunks
    # (splitkv_ws.cuh, kChunksPerLoad).
    chunks_per_load: int = 1

    num_threads = 384   # a producer warpgroup, the S/softmax warpgroup, two P V warpgroups

    def __post_init__(self):
        # (dtype and kv_dtype are checked before num_stages, whose values depend on them.)
        if self.kv_dtype not in KV_DTYPES:
            raise InvalidArgumentError("DecodeConfig.kv_dtype", f"one of {KV_DTYPES}", repr(self.kv_dtype))
        if self.kv_dtype is not None and self.dtype not in ("bf16", "fp16"):
            raise InvalidArgumentError("DecodeConfig.kv_dtype", "None unless dtype is bf16 or fp16",
                                       f"{self.kv_dtype!r} with dtype {self.dtype!r}")
        check_fields(self, schedule=SCHEDULES, cluster_m=(1, 2), dtype=tuple(STAGES), compact_rows=(False, True),
                     early_release=(False, True) if self.dtype == "e4m3" else (False,),
                     chunks_per_load=_chunk_groups(self.head_dim) if self.page_size >= BLOCK_N else (1,),
                     head_dim=tuple(d for d, _ in SUPPORTED_HEAD_DIMS), page_size=SUPPORTED_PAGE_SIZES,
                     block_m=(BLOCK_M,), block_n=(BLOCK_N,), num_stages=(stages_for(self.dtype, self.kv_dtype),))
        if self.compact_rows and self.cluster_m != 1:   # (at most 32 rows: one row tile)
            raise InvalidArgumentError("DecodeConfig.compact_rows", "False with cluster_m 2", self.compact_rows)
        if (self.head_dim, self.head_dim_v) not in SUPPORTED_HEAD_DIMS:
            raise InvalidArgumentError("DecodeConfig.head_dim_v", f"(head_dim, head_dim_v) in {SUPPORTED_HEAD_DIMS}",
                                       f"({self.head_dim}, {self.head_dim_v})")

    @property
    def cluster(self) -> tuple[int, int, int] | None:
        """Cluster dims of the split-KV launch (grid (parts, h_kv, row tiles)), None for none."""
        return (1, 1, self.cluster_m) if self.cluster_m > 1 else None

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


@functools.lru_cache(maxsize=None)
def decode_config(dtype: str, head_dim: int, head_dim_v: int, page_size: int, arch: Arch,
                  schedule: str = "ws", cluster_m: int = 1, kv_dtype: str | None = None,
                  rows: int | None = None, stage_release: str = "after_pv", tma_box: str = "chunk") -> DecodeConfig:
    """kv_dtype: the cache's dtype where it is not q's (`dtype`). rows: query rows a KV head (s_q x
    h_q / h_kv), where known: compact rows at most BLOCK_M / 2 (one row tile, half of it padding).
    stage_release: MLA_JIT_SM90_FP8_STAGE_RELEASE's choice (the e4m3 kernel only); tma_box:
    MLA_JIT_SM90_TMA_BOX's."""
    kv_dtype = None if kv_dtype == dtype else kv_dtype
    return DecodeConfig(dtype, head_dim, head_dim_v, page_size, BLOCK_M, BLOCK_N,
                        num_stages=stages_for(dtype, kv_dtype), schedule=schedule, cluster_m=cluster_m,
                        kv_dtype=kv_dtype, compact_rows=rows is not None and rows <= BLOCK_M // 2 and cluster_m == 1,
                        early_release=stage_release == "early" and dtype == "e4m3",
                        chunks_per_load=_chunks_per_load(head_dim, page_size, cluster_m, tma_box))


def _chunk_groups(head_dim: int) -> tuple[int, ...]:
    """Chunks a TMA load may cover at head_dim: the divisors of the tile's 64-column chunks."""
    chunks = head_dim // 64
    return tuple(k for k in range(1, chunks + 1) if chunks % k == 0)


def _chunks_per_load(head_dim: int, page_size: int, cluster_m: int, tma_box: str) -> int:
    """A tile's column chunks in one TMA load ("tile", with a page per tile), or in one load per
    cluster CTA and group (2 groups of 4 at d = 512, 3 of 3 at d = 576, taken in turns); else 1."""
    chunks = head_dim // 64
    if tma_box != "tile" or page_size < BLOCK_N:
        return 1
    if cluster_m == 1:
        return chunks
    return chunks // 2 if chunks % 2 == 0 else 3


@functools.lru_cache(maxsize=None)
def sm80_decode_config(dtype: str, head_dim: int, head_dim_v: int, page_size: int, rows: int,
                       arch: Arch, kv_dtype: str | None = None) -> Sm80DecodeConfig:
    """kv_dtype: the cache's dtype where it is not q's (`dtype`)."""
    kv_dtype = None if kv_dtype == dtype else kv_dtype
    kv_fp8 = dtype == "e4m3" or kv_dtype == "e4m3"
    if kv_fp8:
        block_m, block_n, stages, warps, k_stages = _sm80_fp8_tiles(rows, arch)
    else:
        (block_m, block_n, stages, warps), k_stages = _sm80_tiles(rows, arch), 2
    # sm_89 converts e4m3 to fp16 in one instruction a pair; to bf16, bit arithmetic is as short.
    fp8_cvt = kv_fp8 and arch.name == "sm_89" and (dtype == "e4m3" or dtype == "fp16")
    return Sm80DecodeConfig(dtype, head_dim, head_dim_v, page_size, block_m, block_n, stages, warps,
                            _SMEM_LIMIT[arch.name], kv_dtype=kv_dtype, fp8_cvt=fp8_cvt, fp8_k_stages=k_stages)


def _sm80_tiles(rows: int, arch: Arch) -> tuple[int, int, int, int]:
    """(block_m, block_n, stages, warps), d = 576 smem in parentheses.
    rows <= 16, every arch: 16 x 16, 3 stages, 4 warps, Q in registers (59,392 B: 3 CTAs on a
    228 KB Hopper SM, 2 on A100, 1 on a 100 KB Ada SM).
    sm_80 (163 KB): rows <= 32: 32 x 32, 2 stages, 4 warps (115,328 B: 2 CTAs on Hopper);
    more rows: 64 x 32, 2 stages, 8 warps, QK by quads of warps (165,120 B).
    sm_86 / sm_89 (99 KB): 32 x 16, 3 stages, 4 warps (98,944 B: 2 CTAs on Hopper)."""
    if rows <= 16:
        return (16, 16, 3, 4)
    if arch.name == "sm_80":
        return (32, 32, 2, 4) if rows <= 32 else (64, 32, 2, 8)
    return (32, 16, 3, 4)


def _sm80_fp8_tiles(rows: int, arch: Arch) -> tuple[int, int, int, int, int]:
    """(block_m, block_n, landing slots, warps, K stages) over an e4m3 cache: the block_m of
    _sm80_tiles and at least its CTAs per SM on every GPU (the schedule is planned without the
    cache's dtype; test_decode_cpu checks this). Smem at d = 576:
    rows <= 16, every arch: 16 x 16, 3 slots, 4 warps, 2 K stages (68,608 B).
    sm_80: 32 x 32 (rows <= 32, 4 warps) and 64 x 32 (8 warps), 2 slots, 1 K stage (115,328 and
    165,120 B: the bf16 kernel's; 16-token tiles with 2 K stages ran at 0.61-0.78x of it on the H200,
    paying the per-tile exchange and barriers twice per 32 keys). sm_86 / sm_89: 32 x 16, 4 slots,
    1 K stage (98,944 B; 1.01-1.03x the 2 slots and 2 K stages that also fit, on the H200)."""
    if rows <= 16:
        return (16, 16, 3, 4, 2)
    if arch.name == "sm_80":
        return (32, 32, 2, 4, 1) if rows <= 32 else (64, 32, 2, 8, 1)
    return (32, 16, 4, 4, 1)


# Sparse decode: a landing slot row per token and stage (512 e4m3 values + 4 float32 scales).
SPARSE_LANDING_ROW_BYTES = 528


def _sm80_smem_bytes(block_m: int, block_n: int, stages: int, warps: int, head_dim: int,
                     sparse: str = "", fp8_k_stages: int = 0) -> int:
    """Mirror of SplitKVSm80Config::kSmemBytes (splitkv_sm80.cuh): [Q] KV stages, [landing slots,
    sparse flags], P / xS, reductions. An e4m3 cache (fp8_k_stages > 0): that many K stages and
    `stages` landing slots."""
    stage = block_n * head_dim * 2   # a K stage, and (per stage) what goes with it
    fixed = 0                        # the rest of the stage area
    if sparse == "fp8_records":
        stage += block_n * SPARSE_LANDING_ROW_BYTES
    if sparse:
        fixed = -(-stages * block_n // 16) * 16   # the tokens' valid flags
    if fp8_k_stages:   # `stages` landing slots of head_dim bytes a token, and the K stages
        stage, fixed = block_n * head_dim, fp8_k_stages * stage
    if block_m == 16:   # Q in registers: KV stages + xS (a float4 per lane per n8 tile per warp)
        return stages * stage + fixed + warps * (block_n // 8) * 32 * 16
    wn = warps // (block_m // 16)
    s_nt = block_n // wn // 8
    # kQKSplit 4 (quads): a warp publishes 3 blocks at 16-token tiles, 2 per round (of 2) at 32.
    quads = warps == 2 * (block_m // 16) and (block_n == 16 or (block_n == 32 and block_m == 64))
    slots = (3 if block_n == 16 else 2) if quads else 1
    p_x = max(block_m * block_n * 2, warps * slots * s_nt * 32 * 16)
    row_max = block_m * 4 if sparse else 0   # sparse: each row's final max for the epilogue
    return block_m * head_dim * 2 + stages * stage + fixed + p_x + 2 * wn * block_m * 4 + block_m * 4 + row_max


def _sm80_min_blocks(block_m: int) -> int:
    """SplitKVSm80Config::kMinBlocksPerSm: the __launch_bounds__ minimum blocks per SM."""
    return 3 if block_m == 16 else 1


def ctas_per_sm_for(rows: int, arch: Arch, smem_per_sm: int) -> int:
    """Split-KV CTAs the scheduler plans to keep resident on each SM of a GPU with `smem_per_sm`
    bytes of shared memory per SM, for the kernel tuned for `arch`. The sm90 kernel fills an SM
    alone. An sm80-family kernel: what its shared memory (at the largest head dim; + the 1 KB the
    driver reserves per block) and its registers (at the most ptxas may use under the kernel's
    __launch_bounds__) both allow; never more than fits, at least 1."""
    if arch.major >= 9:
        return 1
    block_m, block_n, stages, warps = _sm80_tiles(rows, arch)
    smem = max(_sm80_smem_bytes(block_m, block_n, stages, warps, d) for d, _ in SUPPORTED_HEAD_DIMS)
    return sm80_resident_ctas(smem, warps, block_m, smem_per_sm)


def sm80_resident_ctas(smem: int, warps: int, block_m: int, smem_per_sm: int) -> int:
    """CTAs of an sm80-family kernel (`smem` bytes, `warps` warps, tile rows `block_m`) resident on
    one SM: what shared memory (+ the driver's 1 KB a block) and the registers ptxas may use under
    the kernel's __launch_bounds__ both allow; at least 1."""
    by_smem = smem_per_sm // (smem + _SMEM_RESERVED_PER_BLOCK)
    threads = 32 * warps
    reg_cap = min(255, _REGS_PER_SM // (threads * _sm80_min_blocks(block_m)) // _REG_GRANULE * _REG_GRANULE)
    by_regs = _REGS_PER_SM // (threads * (-(-reg_cap // _REG_GRANULE) * _REG_GRANULE))
    return max(1, min(by_smem, by_regs))


def block_m_for(rows: int, arch: Arch) -> int:
    """Query rows per CTA of the decode kernel serving `arch` (grid and scheduler both use it)."""
    return BLOCK_M if arch.major >= 9 else _sm80_tiles(rows, arch)[0]


def num_sm_parts(num_sms: int, num_q_tokens_per_head_k: int, num_heads_k: int, block_m: int = BLOCK_M) -> int:
    """CTAs per (KV head, row tile) so that one wave covers the GPU."""
    row_tiles = -(-num_q_tokens_per_head_k // block_m)
    return max(1, num_sms // (num_heads_k * row_tiles))


def accum_rows(batch: int, parts: int) -> int:
    """Upper bound on split slots: every batch once plus one extra cut per SM part."""
    return batch + parts
