"""Launch plans of the sparse (DSA) prefill (ops/sparse_prefill.py validates).

The kernels are the sparse decode's (splitkv_sm80.cuh with SPARSE_KV: FP8 records, or bf16 rows of the
sparse prefill's kv): the s_q query tokens are the batch, each of topk keys. The scheduler runs in
whole-rows mode (MetadataParams.whole_rows): every token in one split, so the split-KV kernel writes
out, lse and max_logits itself and no combine kernel runs (a prefill has tokens enough to fill the GPU
without splitting them).
"""
from __future__ import annotations

import torch

from ..configs.decode import metadata_config
from ..configs.sparse import FP8_RECORDS, sparse_config
from ..jit.arch import resolve_for_device
from ..jit.launch import Blob
from ..jit.stream import current_stream
from . import registry
from .decode import DECODE_PARAMS, METADATA_PARAMS
from .decode_plan import METADATA_SIZE, _LOG2E, plan_env
from .sparse_decode_plan import sm_parts_for, splitkv_launcher

__all__ = ["SparsePrefillPlan", "plans", "plan_env", "MAX_PLANS", "reset"]

# Memo (layout signature -> plan), bounded; `reset()` empties it.
MAX_PLANS = 4096
plans: dict[tuple, "SparsePrefillPlan"] = {}


def reset() -> None:
    plans.clear()


class SparsePrefillPlan:
    """The launches of one validated layout (any token counts); `run` enqueues a call."""

    __slots__ = ("kv_format", "splitkv", "metadata", "parts", "h_q", "block_n", "fixed_overhead_blocks",
                 "device_index")

    def __init__(self, q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor, kv_format: str):
        h_q, d = q.shape[1:]
        self.device_index = q.get_device()
        self.kv_format, self.h_q = kv_format, h_q
        arch = resolve_for_device(self.device_index)
        page_size = kv.shape[1] if kv_format == FP8_RECORDS else 64
        self.parts = sm_parts_for(self.device_index, h_q, sparse_config(kv_format, d, page_size, arch.tuning, h_q))
        self.splitkv, _cfg = splitkv_launcher(kv_format, d, page_size, h_q, self.parts, arch, self.device_index)
        meta_cfg = metadata_config()
        self.block_n, self.fixed_overhead_blocks = meta_cfg.block_n, meta_cfg.fixed_overhead_blocks
        meta_family = registry.get("mla_metadata")
        self.metadata = meta_family.launcher(meta_cfg, arch, meta_family.ENTRY, self.device_index,
                                             (Blob(METADATA_PARAMS.size),), (1, 1, 1), (128, 1, 1))

    def run(self, q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor, scale: float,
            topk_length: torch.Tensor | None, attn_sink: torch.Tensor | None, out: torch.Tensor,
            max_logits: torch.Tensor, lse: torch.Tensor) -> None:
        s_q = q.shape[0]
        if s_q == 0:
            return
        topk = indices.shape[2]
        if self.kv_format == FP8_RECORDS:
            kv_rows, row_stride = kv.shape[0] * kv.shape[1], kv.stride(0)   # pages of one-byte records
        else:
            kv_rows, row_stride = kv.shape[0], kv.stride(0) * 2
        stream = current_stream(self.device_index)
        # The schedule (parts x 8 and s_q + 1 int32): filled on the GPU, so a call stays capturable.
        meta = indices.new_empty((self.parts, METADATA_SIZE))
        splits = indices.new_empty((s_q + 1,))
        self.metadata(stream, METADATA_PARAMS.pack(0, meta.data_ptr(), splits.data_ptr(), s_q, self.parts,
                                                   self.block_n, self.fixed_overhead_blocks, topk, 1))
        h_q = self.h_q
        params = DECODE_PARAMS.pack(
            q.data_ptr(), out.data_ptr(), lse.data_ptr(), 0, 0, indices.data_ptr(), 0, meta.data_ptr(),
            splits.data_ptr(), q.stride(0), 0, q.stride(1), indices.stride(0),
            s_q, 1, h_q, 1, h_q, h_q, self.parts, 0, scale, scale * _LOG2E, 0, 1, 0, 0, 0,
            0 if topk_length is None else topk_length.data_ptr(), 0 if attn_sink is None else attn_sink.data_ptr(),
            row_stride, topk, kv_rows, max_logits.data_ptr())
        self.splitkv(stream, params, kv.data_ptr())
