"""Configs of the Ampere / Ada dense paged MLA decode (the mma.sync + cp.async family, sm_80 / sm_86 /
sm_89, also the sparse kernels' tiles there): pure functions of shapes and arch, and the residency model
the scheduler plans CTAs per SM with (its Hopper counterpart is configs/decode.py)."""
from __future__ import annotations

import functools
from dataclasses import dataclass

from ..errors import InvalidArgumentError
from ..jit.arch import Arch
from .decode import BLOCK_M, KV_DTYPES, SPARSE_KV, SUPPORTED_HEAD_DIMS, SUPPORTED_PAGE_SIZES
from .fields import check_fields


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
        if self.q_in_registers and self.block_m != 16 and self.sparse != "fp8_records":
            raise InvalidArgumentError("Sm80DecodeConfig.num_warps", "4 a 16-row tile of Q in registers only over "
                                       "FP8 records (else Q in smem: block_m / 16 or block_m / 8 warps)",
                                       f"{self.num_warps} warps at block_m {self.block_m}")
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
        """Q in registers, QK split over d across the 4 warps of each 16-row tile (splitkv_sm80.cuh):
        16 rows and 4 warps, or (FP8 records) 32 rows and 8 warps, two head groups on one K stage."""
        return _q_in_registers(self.block_m, self.num_warps)

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
    if _q_in_registers(block_m, warps):   # KV stages + xS (a float4 per lane per n8 tile per warp)
        return stages * stage + fixed + warps * (block_n // 8) * 32 * 16
    wn = warps // (block_m // 16)
    s_nt = block_n // wn // 8
    # kQKSplit 4 (quads): a warp publishes 3 blocks at 16-token tiles, 2 per round (of 2) at 32.
    quads = warps == 2 * (block_m // 16) and (block_n == 16 or (block_n == 32 and block_m == 64))
    slots = (3 if block_n == 16 else 2) if quads else 1
    p_x = max(block_m * block_n * 2, warps * slots * s_nt * 32 * 16)
    row_max = block_m * 4 if sparse else 0   # sparse: each row's final max for the epilogue
    return block_m * head_dim * 2 + stages * stage + fixed + p_x + 2 * wn * block_m * 4 + block_m * 4 + row_max


def _q_in_registers(block_m: int, warps: int) -> bool:
    """SplitKVSm80Config::kQInRegs: 4 warps a 16-row tile of Q in registers."""
    return block_m == 4 * warps


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
