"""Launch plans of the sparse (DSA) decode over FlashMLA's FP8 records (ops/sparse_decode.py validates).

The kernels see the caller's (b, s_q) query tokens as a batch of b * s_q single-token rows, each with
its own index list of topk tokens: the scheduler cuts those rows (all of length topk) into one wave
of split-KV pieces, the split-KV kernel (splitkv_sm80.cuh, SPARSE_FP8) masks what topk_length and
invalid indices leave out, and the dense decode's combine kernel merges the splits (lse back in
(b, h_q, s_q) order through DecodeParams.lse_fold, the attention sink applied to the final out). A row
in one split is written by the split-KV kernel itself; when the schedule cuts no row (the host knows:
every row has topk keys, runtimes/decode_schedule.py), the combine is not launched (at b 128, s_q 1 it
ended ~6 us after the split-KV kernel with nothing to merge, ~5% of the call; H200, bench/NOTES.md
session 33). The schedule is get_mla_metadata's for this call's rows, heads and topk (FlashMLA's
contract; the lazy FlashMLASchedMeta form is checked against the call).
"""
from __future__ import annotations

import dataclasses

import torch

from ..configs.decode import CLUSTER_ENV, COMBINE_ROWS_PER_CTA, COMBINE_THREADS, accum_rows, metadata_config
from ..configs.decode_sm80 import Sm80DecodeConfig
from ..configs.sparse import (FP8_RECORDS, HEAD_DIM, HEAD_DIM_V, ctas_per_sm, family_of, head_tile_pairs,
                              num_sm_parts, SparseWsConfig, sparse_config)
from ..jit import env
from ..jit.arch import ArchPair, resolve_for_device
from ..jit.launch import PTR, Blob
from ..jit.stream import current_stream
from . import registry, workspace
from .decode import DECODE_PARAMS, METADATA_PARAMS
from .decode_plan import METADATA_SIZE, _LOG2E, _clusters_fit, _kernel_smem
from .decode_schedule import splits_a_row
from .device import num_sms as _num_sms, smem_per_sm as _smem_per_sm

# Memos (call signature -> plan), bounded like the dense decode's; `reset()` empties them.
MAX_PLANS = 4096
metadata_plans: dict[tuple, "SparseMetadataPlan"] = {}
decode_plans: dict[tuple, "SparseDecodePlan"] = {}


def reset() -> None:
    metadata_plans.clear()
    decode_plans.clear()


def sm_parts_for(device_index: int, h_q: int, cfg: Sm80DecodeConfig | SparseWsConfig | None = None) -> int:
    """Rows of the sparse schedule (SM parts) on this GPU: one wave of split-KV CTAs of `cfg` (the
    decode's kernel for h_q heads by default; its page size does not change its tiles)."""
    if cfg is None:
        cfg = sparse_config(FP8_RECORDS, HEAD_DIM, 64, resolve_for_device(device_index).tuning, h_q)
    return num_sm_parts(_num_sms(device_index), ctas_per_sm(cfg, _smem_per_sm(device_index)), h_q, cfg.block_m)


def splitkv_launcher(kv: str, head_dim: int, page_size: int, h_q: int, parts: int, arch: ArchPair,
                     device_index: int):
    """The split-KV launch over `kv` tokens for h_q heads on `parts` SM parts (grid (parts, 1, head
    tiles)), and its config: cluster pairs of head tiles where head_tile_pairs allows them and the GPU
    keeps every pair resident at once, else the unpaired kernel (a second wave of pairs would cost more
    than the pairing saves)."""
    pairs = head_tile_pairs(env.choice(CLUSTER_ENV.name))
    cfg = sparse_config(kv, head_dim, page_size, arch.tuning, h_q, pairs)
    family = registry.get(family_of(cfg))
    grid, block = (parts, 1, -(-h_q // cfg.block_m)), (cfg.num_threads, 1, 1)
    smem = _kernel_smem(family, cfg, arch, device_index)
    if cfg.cluster is not None and not _clusters_fit(family, cfg, arch, device_index, grid, block, smem):
        cfg = dataclasses.replace(cfg, cluster_m=1)
        smem = _kernel_smem(family, cfg, arch, device_index)
    launch = family.launcher(cfg, arch, family.SPLITKV, device_index, (Blob(DECODE_PARAMS.size), PTR), grid, block,
                             dynamic_smem=smem, cluster=cfg.cluster)
    return launch, cfg


class SparseMetadataPlan:
    """The scheduler launch for `rows` (= b * s_q) query tokens of topk keys each and h_q heads."""

    __slots__ = ("launch", "parts", "rows", "topk", "device_index", "block_n", "fixed_overhead_blocks")

    def __init__(self, device_index: int, rows: int, topk: int, h_q: int):
        self.device_index, self.rows, self.topk = device_index, rows, topk
        self.parts = sm_parts_for(device_index, h_q)
        cfg = metadata_config()
        self.block_n, self.fixed_overhead_blocks = cfg.block_n, cfg.fixed_overhead_blocks
        self.launch = None
        if rows:
            family = registry.get("mla_metadata")
            self.launch = family.launcher(cfg, resolve_for_device(device_index), family.ENTRY, device_index,
                                          (Blob(METADATA_PARAMS.size),), (1, 1, 1), (128, 1, 1))

    def run(self, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(tile_scheduler_metadata (parts, 8), num_splits (rows + 1,)), int32 on like's device."""
        metadata = like.new_empty((self.parts, METADATA_SIZE), dtype=torch.int32)
        num_splits = like.new_empty((self.rows + 1,), dtype=torch.int32)
        if self.launch is None:
            metadata.zero_()
            num_splits.zero_()
            return metadata, num_splits
        self.launch(current_stream(self.device_index),
                    METADATA_PARAMS.pack(0, metadata.data_ptr(), num_splits.data_ptr(), self.rows, self.parts,
                                         self.block_n, self.fixed_overhead_blocks, self.topk, 0))
        return metadata, num_splits


class SparseDecodePlan:
    """The launches and sizes of one validated sparse decode signature; `run` enqueues a call."""

    __slots__ = ("splitkv", "combine", "merges", "parts", "b", "s_q", "h_q", "rows", "topk", "q_stride", "idx_stride",
                 "block_stride", "kv_tokens", "o_accum_elems", "accum_elems", "default_scale", "device_index",
                 "out_shape", "lse_shape")

    def __init__(self, q: torch.Tensor, k_cache: torch.Tensor, indices: torch.Tensor, parts: int):
        b, s_q, h_q, d = q.shape
        num_blocks, page_size = k_cache.shape[:2]
        self.device_index = q.get_device()
        arch = resolve_for_device(self.device_index)
        self.rows = b * s_q
        self.splitkv, cfg = splitkv_launcher(FP8_RECORDS, HEAD_DIM, page_size, h_q, parts, arch, self.device_index)
        family = registry.get(family_of(cfg))
        # Programmatic dependent launch exists from sm_90 on; below, the combine follows in stream order.
        self.combine = family.launcher(cfg, arch, family.COMBINE, self.device_index, (Blob(DECODE_PARAMS.size),),
                                       (self.rows, 1, -(-h_q // COMBINE_ROWS_PER_CTA)), (COMBINE_THREADS, 1, 1),
                                       pdl=arch.target.major >= 9)
        self.parts, self.b, self.s_q, self.h_q = parts, b, s_q, h_q
        self.topk = indices.shape[2]
        meta_cfg = metadata_config()
        self.merges = splits_a_row(self.rows, self.topk, parts, meta_cfg.block_n, meta_cfg.fixed_overhead_blocks)
        self.q_stride, self.idx_stride = q.stride(1), indices.stride(1)  # of the flattened (b * s_q) rows
        self.block_stride = k_cache.stride(0) * k_cache.element_size()
        self.kv_tokens = num_blocks * page_size
        slots = accum_rows(self.rows, parts)
        self.o_accum_elems = slots * h_q * HEAD_DIM_V
        self.accum_elems = self.o_accum_elems + slots * h_q
        self.default_scale = d ** -0.5
        self.out_shape = (b, s_q, h_q, HEAD_DIM_V)
        self.lse_shape = (b, h_q, s_q)

    def run(self, q: torch.Tensor, k_cache: torch.Tensor, indices: torch.Tensor, tile_scheduler_metadata: torch.Tensor,
            num_splits: torch.Tensor, scale: float, topk_length: torch.Tensor | None,
            attn_sink: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        out = q.new_empty(self.out_shape)
        lse = q.new_empty(self.lse_shape, dtype=torch.float32)
        stream = current_stream(self.device_index)
        accum_ptr, _, scratch = workspace.decode_scratch(self.device_index, stream, self.accum_elems, 0, q)
        h_q = self.h_q
        params = DECODE_PARAMS.pack(
            q.data_ptr(), out.data_ptr(), lse.data_ptr(), accum_ptr, accum_ptr + 4 * self.o_accum_elems,
            indices.data_ptr(), 0, tile_scheduler_metadata.data_ptr(), num_splits.data_ptr(),
            self.q_stride, 0, q.stride(2), self.idx_stride,
            self.rows, 1, h_q, 1, h_q, h_q, self.parts, 0, scale, scale * _LOG2E, 0, self.s_q, 0, 0, 0,
            0 if topk_length is None else topk_length.data_ptr(), 0 if attn_sink is None else attn_sink.data_ptr(),
            self.block_stride, self.topk, self.kv_tokens, 0)
        self.splitkv(stream, params, k_cache.data_ptr())
        if self.merges:
            self.combine(stream, params)
        del scratch  # (graph capture) freed only now: later captured work may reuse the block
        return out, lse

