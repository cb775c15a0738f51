"""Configs of the sparse (DSA) attention kernels: pure functions of the arch and the token storage.

Tokens are FlashMLA's FP8 records (the decode's cache, also read by the sparse prefill) or bf16 rows
(the sparse prefill's kv, d_qk 576 or 512), gathered by index. On sm_90a, FP8 records of at most
NARROW_MAX_HEADS heads: the narrow kernel (sparse/narrow_decode_sm90.cuh, SparseNarrowConfig), heads as
wgmma's N, 1.35-1.45x the wide kernel at 8-16 heads (H200, bench/NOTES.md session 40); else the dense
decode's warp-specialized wgmma kernel (splitkv_ws.cuh with SPARSE_KV, SparseWsConfig): 64 heads of one
query token a tile (fewer heads pad the tile, as FlashMLA does), the P V warpgroups gathering the
tiles (and de-quantizing FP8 records into bf16). On sm_80 / sm_86 / sm_89 the mma.sync split-KV
kernel (splitkv_sm80.cuh with SPARSE_KV): FP8 records 16 heads a CTA with Q in registers, each tile
de-quantized one tile ahead of its use; bf16 rows on the dense family's tiles, so that above 16 heads
a gathered row feeds 32 or 64 heads' MMAs.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

from ..jit.arch import Arch
from ..errors import InvalidArgumentError
from .decode import SPARSE_KV, SUPPORTED_PAGE_SIZES
from .decode_sm80 import Sm80DecodeConfig, _sm80_smem_bytes, sm80_resident_ctas
from .fields import check_fields

# FlashMLA's V3.2 FP8 record of a token: 512 e4m3 values, 4 float32 scales (one per 128 values),
# 64 bf16 rope values (the kernels' V32Record, include/mla_jit/decode/records.cuh).
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
# Per-block shared memory the mma.sync tile plans may take: sm_80 163 KB, sm_86 / sm_89 99 KB.
_SMEM_LIMIT = {"sm_80": 163 * 1024, "sm_86": 99 * 1024, "sm_89": 99 * 1024}


# The narrow sm_90a kernel (SparseNarrowConfig) serves FP8 records up to this many heads (above, a CTA
# of 16 heads would re-read every record for each head tile; 32 heads stay on the wide kernel).
NARROW_MAX_HEADS = 16


@dataclass(frozen=True)
class SparseNarrowConfig:
    """The sm_90a kernel for few heads over FP8 records (include/mla_jit/sparse/narrow_decode_sm90.cuh):
    S^T = K Q^T and O^T = V^T P^T with the heads as wgmma's N (8 or 16) and both A operands built in
    registers from the records, so that its tensor work scales with the heads; one warpgroup a CTA, each
    warp gathering its 16 tokens of a tile into `slots` record slots ahead; 2 CTAs an SM (launch
    bounds; shared memory 2 x ~110 KB)."""
    heads: int
    slots: int
    page_size: int

    fused_combine = False
    num_threads = 128
    resident_ctas = 2
    cluster = None

    def __post_init__(self):
        check_fields(self, heads=(8, 16), slots=(2,), page_size=SUPPORTED_PAGE_SIZES)

    @property
    def block_m(self) -> int:
        """Heads a CTA serves (the grid's head tiles are ceil(h_q / block_m))."""
        return self.heads


@dataclass(frozen=True)
class SparseWsConfig:
    """The sm_90a kernel (splitkv_ws.cuh with SPARSE_KV): 64 heads x 64 gathered tokens per tile, one
    S / softmax warpgroup and two P V warpgroups that also gather the tiles (cp.async). bf16 rows are
    gathered into 3 stages; FP8 records (pages of page_size) into a record slot a tile ahead, and
    de-quantized into 2 bf16 stages."""
    head_dim: int
    num_stages: int
    sparse: str = BF16_ROWS
    page_size: int = _ROWS_PAGE
    # FP8 records over two head tiles (65-128 heads): 2 runs the pair as a cluster that shares each
    # tile's de-quantization ("crossover", splitkv_ws.cuh); 1 de-quantizes every tile in both CTAs.
    cluster_m: int = 1

    block_m = 64
    num_threads = 384
    fused_combine = False

    def __post_init__(self):
        check_fields(self, head_dim=PREFILL_HEAD_DIMS, num_stages=(2, 3), sparse=(BF16_ROWS, FP8_RECORDS),
                     page_size=SUPPORTED_PAGE_SIZES, cluster_m=(1, 2))
        if self.sparse == FP8_RECORDS and (self.head_dim, self.num_stages) != (HEAD_DIM, 2):
            raise InvalidArgumentError("SparseWsConfig.num_stages", "head_dim 576 and 2 stages for FP8 records",
                                       f"{self.head_dim}, {self.num_stages}")
        if self.cluster_m != 1 and self.sparse != FP8_RECORDS:
            raise InvalidArgumentError("SparseWsConfig.cluster_m", "1 for bf16 rows", self.cluster_m)

    @property
    def sparse_kv(self) -> int:
        return SPARSE_KV[self.sparse]

    @property
    def cluster(self) -> tuple[int, int, int] | None:
        """Launch cluster dims (the grid's head tiles are its z), or None."""
        return (1, 1, self.cluster_m) if self.cluster_m > 1 else None


def _tiles(arch: Arch, head_dim: int, kv: str, h_q: int) -> tuple[int, int, int, int]:
    """(block_m, block_n, stages, warps) of the mma.sync kernel. FP8 records, and bf16 rows of at most
    16 heads: 16-token tiles with Q in registers, 4 warps a 16-head tile; FP8 records above 16 heads
    two such tiles a CTA (32 heads, 8 warps), so that one de-quantization of a tile feeds 32 heads. 4
    stages where they fit (FP8 records 111.6 / 115.7 KB at 16 / 32 heads, bf16 rows <= 78 KB), else 3
    (FP8 records: 84.7 / 88.8 KB on the 99 KB Ada / GA10x blocks). bf16 rows of more heads: 32 x 16,
    3 stages, 4 warps (99 KB at d 576); above 32 heads on sm_80 64 x 32 with 8 warps and 2 stages (its
    163 KB)."""
    if kv == FP8_RECORDS or h_q <= BLOCK_M:
        groups = 2 if kv == FP8_RECORDS and h_q > BLOCK_M else 1
        block_m, warps = groups * BLOCK_M, groups * NUM_WARPS
        fits = _sm80_smem_bytes(block_m, BLOCK_N, 4, warps, head_dim, kv) <= _SMEM_LIMIT[arch.name]
        return block_m, BLOCK_N, 4 if fits else 3, warps
    if h_q <= 32 or arch.name != "sm_80":
        return 32, 16, 3, 4
    return 64, 32, 2, 8


def head_tile_pairs(cluster_choice: str) -> bool:
    """Whether FP8 records over two head tiles run as cluster pairs, for the MLA_JIT_SM90_CLUSTER
    choice: only with "2" for now. The pair kernel's ordering fix for its rope-row copies (found by a
    review after its GPU run, bench/NOTES.md session 41) is built but not yet run on a GPU; "auto"
    keeps the unpaired kernel until it is."""
    return cluster_choice == "2"


@functools.lru_cache(maxsize=None)
def sparse_config(kv: str, head_dim: int, page_size: int, arch: Arch, h_q: int = BLOCK_M,
                  pairs: bool = True) -> Sm80DecodeConfig | SparseWsConfig | SparseNarrowConfig:
    """The kernel over `kv` tokens (FP8_RECORDS in pages of page_size, or BF16_ROWS of head_dim) for
    h_q query heads: on sm_90a the narrow kernel for FP8 records up to NARROW_MAX_HEADS heads (8- or
    16-head CTAs), else the wide wgmma kernel; elsewhere the mma.sync kernel's tiles. bf16 rows take
    the wide kernel below 64 heads too (a tile of 8 or 16 heads is mostly padding, as in FlashMLA): at
    16 heads it took 0.74-0.84x the time of the mma.sync kernel's 16-row tiles (H200, session 27).
    FP8 records over two head tiles (65-128 heads) run as cluster pairs with `pairs` (head_tile_pairs)
    sharing each tile's de-quantization (bulk copies between the pair's shared memories, half-tile
    record slots gathered 3 tiles ahead): 1.10x the unpaired kernel at 128 heads s_q 1-2, 1.07x on the
    FP8-cache prefill (H200, bench/NOTES.md session 41; session 26's st.async pairs lost, 0.85x).
    The default (`pairs` True) is the pure function's; the plans pass head_tile_pairs' choice."""
    if arch.name == "sm_90a":
        if kv == BF16_ROWS:
            return SparseWsConfig(head_dim, 3)
        if h_q <= NARROW_MAX_HEADS:
            return SparseNarrowConfig(8 if h_q <= 8 else 16, 2, page_size)
        pair = 2 if pairs and -(-h_q // SparseWsConfig.block_m) == 2 else 1
        return SparseWsConfig(HEAD_DIM, 2, kv, page_size, cluster_m=pair)
    page = page_size if kv == FP8_RECORDS else _ROWS_PAGE
    block_m, block_n, stages, warps = _tiles(arch, head_dim, kv, h_q)
    return Sm80DecodeConfig("bf16", head_dim, HEAD_DIM_V, page, block_m, block_n, stages, warps,
                            _SMEM_LIMIT[arch.name], sparse=kv)


def sparse_decode_config(page_size: int, arch: Arch, h_q: int = BLOCK_M) -> Sm80DecodeConfig:
    """The sparse decode's kernel (FP8 records) for h_q heads."""
    return sparse_config(FP8_RECORDS, HEAD_DIM, page_size, arch, h_q)


def family_of(cfg: Sm80DecodeConfig | SparseWsConfig | SparseNarrowConfig) -> str:
    """The kernel family (runtimes/decode.py) that builds `cfg`."""
    if isinstance(cfg, SparseNarrowConfig):
        return "mla_sparse_narrow_sm90"
    return "mla_sparse_sm90" if isinstance(cfg, SparseWsConfig) else "mla_sparse_decode"


def ctas_per_sm(cfg: Sm80DecodeConfig | SparseWsConfig | SparseNarrowConfig, smem_per_sm: int) -> int:
    """CTAs of the sparse kernel `cfg` resident per SM, at least 1."""
    if isinstance(cfg, SparseNarrowConfig):
        return cfg.resident_ctas
    if isinstance(cfg, SparseWsConfig):
        return 1
    return sm80_resident_ctas(cfg.smem_bytes, cfg.num_warps, cfg.block_m, smem_per_sm)


def num_sm_parts(num_sms: int, resident: int, h_q: int, block_m: int = BLOCK_M) -> int:
    """SM parts of the schedule: one wave of split-KV CTAs over the ceil(h_q / block_m) head tiles."""
    return max(1, num_sms * resident // -(-h_q // block_m))
