"""FlashMLA's lazy schedule object (its 2026-01 API), shared by the dense and the sparse decode."""
from __future__ import annotations

from typing import NamedTuple

import torch

from ..errors import InvalidArgumentError


class SchedConfig(NamedTuple):
    """What a FlashMLASchedMeta's schedule was computed for (FlashMLASchedMeta.Config's fields)."""
    b: int
    s_q: int
    h_q: int
    page_block_size: int
    h_k: int
    causal: bool
    is_fp8_kvcache: bool
    topk: int | None
    extra_page_block_size: int | None
    extra_topk: int | None


class FlashMLASchedMeta:
    """FlashMLA's lazy schedule (its 2026-01 API): `get_mla_metadata()` returns an empty one; the
    first `flash_mla_with_kvcache` call computes the schedule on the GPU (capturable in a CUDA
    graph) and stores it here; later calls reuse it while batch, s_q, h_q, h_kv, page size, causal
    and the flags stay the same (a mismatch raises InvalidArgumentError naming the field). Reuse it
    only while cache_seqlens holds the same values (one decoding step, every layer)."""

    Config = SchedConfig

    def __init__(self) -> None:
        self.have_initialized = False
        self.config: SchedConfig | None = None
        self.tile_scheduler_metadata: torch.Tensor | None = None   # (num_sm_parts, 8) int32
        self.num_splits: torch.Tensor | None = None                # (b + 1,) int32
        self._checked = None  # (q.shape, k_cache.shape, causal) of the last call found consistent

    def __repr__(self) -> str:
        return f"FlashMLASchedMeta(have_initialized={self.have_initialized}, config={self.config})"


def settle_schedule(sched: FlashMLASchedMeta, config: SchedConfig, shapes, compute) -> tuple[torch.Tensor, torch.Tensor]:
    """The schedule tensors of a FlashMLASchedMeta: `compute()`d at its first call; later calls must
    match the `config` it was computed for (their `shapes` then skip this check)."""
    if sched.tile_scheduler_metadata is None:
        sched.tile_scheduler_metadata, sched.num_splits = compute()
        sched.config, sched.have_initialized = config, True
    elif sched.config != config:
        for field, was, now in zip(SchedConfig._fields, sched.config, config):
            if was != now:
                raise InvalidArgumentError(
                    "tile_scheduler_metadata", f"a call consistent with its first one ({field}={was!r}); use a "
                    "new get_mla_metadata() schedule for other shapes", f"{field}={now!r}")
    sched._checked = shapes
    return sched.tile_scheduler_metadata, sched.num_splits
