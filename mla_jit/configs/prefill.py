"""Config of the varlen attention prefill (flash_attn_varlen_func): a pure function of the head dims,
dtype, causality and arch. The head count and the lengths are runtime values (grid and params)."""
from __future__ import annotations

import functools
from dataclasses import dataclass

from ..jit.arch import Arch
from .fields import check_fields

PREFILL_DTYPES = ("bf16", "fp16")
# (q/k head dim, v head dim): DeepSeek's MHA-mode prefill, and the standard ones to compare with.
SUPPORTED_HEAD_DIMS = ((192, 128), (128, 128), (64, 64))
SM90_TUNINGS = ("sm_90a",)


@dataclass(frozen=True)
class PrefillConfig:
    dtype: str
    head_dim: int        # of q and k
    head_dim_v: int
    causal: bool
    block_m: int = 128   # query rows per CTA: one 64-row consumer warpgroup each
    block_n: int = 128   # keys per pipeline stage
    num_stages: int = 2

    def __post_init__(self):
        check_fields(self, dtype=PREFILL_DTYPES, head_dim=tuple(sorted({d for d, _ in SUPPORTED_HEAD_DIMS})),
                     head_dim_v=tuple(sorted({dv for _, dv in SUPPORTED_HEAD_DIMS})), causal=(False, True),
                     block_m=(128,), block_n=(64, 128, 192), num_stages=(2, 3))
        if (self.head_dim, self.head_dim_v) not in SUPPORTED_HEAD_DIMS:
            from ..errors import InvalidArgumentError
            raise InvalidArgumentError("PrefillConfig.head_dim/head_dim_v",
                                       " or ".join(f"{d}/{dv}" for d, dv in SUPPORTED_HEAD_DIMS),
                                       f"{self.head_dim}/{self.head_dim_v}")

    @property
    def smem_bytes(self) -> int:
        """Shared memory of the sm90 kernel (fwd_sm90.cuh SharedStorage, + 1 KB alignment slack)."""
        q = self.block_m * self.head_dim * 2
        kv = self.num_stages * self.block_n * (self.head_dim + self.head_dim_v) * 2
        return q + kv + 1024 + 1024


SM90_SMEM_LIMIT = 227 * 1024


@functools.lru_cache(maxsize=None)
def prefill_config(dtype: str, head_dim: int, head_dim_v: int, causal: bool, arch: Arch) -> PrefillConfig:
    # Two stages of 128 keys at 192/128 (208 KB with Q); the smaller head dims take a third stage.
    cfg = PrefillConfig(dtype, head_dim, head_dim_v, causal)
    deeper = PrefillConfig(dtype, head_dim, head_dim_v, causal, num_stages=3)
    return deeper if deeper.smem_bytes <= SM90_SMEM_LIMIT else cfg

# Dynamic shared memory a block may have on the mma.sync family's tunings.
SM80_SMEM_LIMITS = {"sm_80": 166912, "sm_86": 101376, "sm_89": 101376}


@dataclass(frozen=True)
class Sm80PrefillConfig:
    """The mma.sync + cp.async family (sm_80, sm_86, sm_89): 16 query rows a warp, Q in registers."""
    dtype: str
    head_dim: int
    head_dim_v: int
    causal: bool
    num_stages: int      # 1: one K and one V buffer, each loaded while the other is read
    q_aliases_kv: bool   # Q loaded through the K/V stage area (small shared memory)
    block_m: int = 128
    block_n: int = 128

    def __post_init__(self):
        check_fields(self, dtype=PREFILL_DTYPES, head_dim=tuple(sorted({d for d, _ in SUPPORTED_HEAD_DIMS})),
                     head_dim_v=tuple(sorted({dv for _, dv in SUPPORTED_HEAD_DIMS})), causal=(False, True),
                     num_stages=(1, 2, 3), q_aliases_kv=(False, True), block_m=(128,), block_n=(64, 128))
        if (self.head_dim, self.head_dim_v) not in SUPPORTED_HEAD_DIMS:
            from ..errors import InvalidArgumentError
            raise InvalidArgumentError("Sm80PrefillConfig.head_dim/head_dim_v",
                                       " or ".join(f"{d}/{dv}" for d, dv in SUPPORTED_HEAD_DIMS),
                                       f"{self.head_dim}/{self.head_dim_v}")

    @property
    def smem_bytes(self) -> int:
        """fwd_sm80.cuh's kSmemBytes."""
        q = self.block_m * self.head_dim * 2
        stages = self.num_stages * self.block_n * (self.head_dim + self.head_dim_v) * 2
        return max(q, stages) if self.q_aliases_kv else q + stages


@functools.lru_cache(maxsize=None)
def sm80_prefill_config(dtype: str, head_dim: int, head_dim_v: int, causal: bool, arch: Arch) -> Sm80PrefillConfig:
    """Tiles of 128 keys; Q in its own area where it fits beside them (its load then overlaps the
    first K tile's), else loaded through the K/V area; then the deepest pipeline that fits. At
    192/128: one K and one V buffer with Q beside them in sm_80's 163 KB, Q through them in 99 KB;
    tiles of 64 keys only where not even that fits. (H200, bench/NOTES.md: two 64-row CTAs an SM lost
    to one of 128 rows; 128-key tiles won over 64-key ones; at sm_80's 192/128, one buffer each
    with Q beside them won over two stages with Q through them.)"""
    limit = SM80_SMEM_LIMITS[arch.name]
    for block_n in (128, 64):
        for stages, alias in ((3, False), (2, False), (1, False), (3, True), (2, True), (1, True)):
            cfg = Sm80PrefillConfig(dtype, head_dim, head_dim_v, causal, stages, alias, block_n=block_n)
            if cfg.smem_bytes <= limit:
                return cfg
    raise AssertionError(f"no prefill tile fits {arch.name}")   # (one aliased 64-key buffer fits every head dim)
