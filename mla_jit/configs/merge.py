"""Config of the attention-state merge (merge_attn_states): a pure function of dtype and head dim."""
from __future__ import annotations

import functools
from dataclasses import dataclass

from ..jit.arch import Arch
from .fields import check_fields

MERGE_DTYPES = ("bf16", "fp16", "fp32")
MERGE_HEAD_DIMS = (64, 128, 256, 512)   # prefill's v (128), decode's latent (512), and the usual others
MERGE_THREADS = 256
# The grid is a power of two up to this many CTAs (a few resident per SM on 132-SM GPUs), striding
# over the rows: a handful of distinct launches serve every token count.
MERGE_MAX_CTAS = 1024


@dataclass(frozen=True)
class MergeConfig:
    dtype: str          # of out, prefix and suffix
    head_dim: int
    num_threads: int = MERGE_THREADS

    def __post_init__(self):
        check_fields(self, dtype=MERGE_DTYPES, head_dim=MERGE_HEAD_DIMS, num_threads=(128, 256, 512))

    @property
    def rows_per_cta(self) -> int:
        """(token, head) rows a CTA handles per step: a row is head_dim / (16 B / element size) threads."""
        elem_bytes = 4 if self.dtype == "fp32" else 2
        return self.num_threads // (self.head_dim * elem_bytes // 16)


@functools.lru_cache(maxsize=None)
def merge_config(dtype: str, head_dim: int, arch: Arch) -> MergeConfig:
    # Memory-bound and arch-neutral: the same 256-thread CTAs everywhere.
    return MergeConfig(dtype, head_dim)


def merge_grid(rows: int, rows_per_cta: int) -> int:
    """CTAs for `rows` (token, head) rows: the next power of two of what covers them, capped."""
    needed = max(1, -(-rows // rows_per_cta))
    return min(MERGE_MAX_CTAS, 1 << (needed - 1).bit_length())
