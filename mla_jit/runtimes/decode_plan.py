"""Launch plans of the dense paged decode: everything a warm call needs, built once per validated
call signature and memoized here.

The op layer (ops/decode.py) validates arguments and asks for a plan; this module owns the rest:
which kernel family and schedule serve the GPU, the cluster fallback, the shared memory a kernel
declares, the TMA descriptor of the cache, the split-KV scratch and the packed launch parameters.
"""
from __future__ import annotations

import logging

import torch

from ..configs.decode import (BLOCK_M, CLUSTER_ENV, COMBINE_ROWS_PER_CTA, COMBINE_THREADS,
                              SCHEDULE_ENV, accum_rows, cluster_m_for, decode_config,
                              fused_combine_pays, metadata_config, num_sm_parts, out_dtype_of)
from ..configs.decode_sm80 import block_m_for, ctas_per_sm_for, sm80_decode_config
from ..dtypes import name_of, torch_dtype
from ..errors import KernelNotWarmError
from ..jit import env, tma
from ..jit.arch import ArchPair, resolve_for_device
from ..jit.launch import PTR, TMA_DESC, Blob, max_active_clusters
from ..jit.loader import read_global_int32
from ..jit.stream import current_stream
from .device import num_sms as _num_sms, smem_per_sm as _smem_per_sm
from . import registry, workspace
from .decode import DECODE_PARAMS, METADATA_PARAMS

log = logging.getLogger(__name__)

FP8 = torch.float8_e4m3fn

METADATA_SIZE = 8   # int32 words per SM part of the schedule (FlashMLA's TileSchedulerMetaDataSize)
_LOG2E = 1.4426950408889634

# Raw values of the variables that pick a kernel: part of every warm-path plan key, so another
# value (set at run time) gets another plan.
plan_env = env.raw_reader("MLA_JIT_ARCH", SCHEDULE_ENV.name, CLUSTER_ENV.name)

# Plan memos: call signature -> plan. Filled by the ops after validation (emptied when they reach
# MAX_PLANS: a caller whose batch or block-table width changes every step must not grow them
# forever); `reset()` empties them.
MAX_PLANS = 4096
metadata_plans: dict[tuple, "MetadataPlan"] = {}
decode_plans: dict[tuple, "DecodePlan"] = {}
_descriptors: dict[tuple, tma.TmaDescriptor] = {}
_smem_bytes: dict[tuple, int] = {}
_unit_descales: dict[int, torch.Tensor] = {}   # device index -> float32 (1,) holding 1.0


def reset() -> None:
    """Forget every plan and descriptor (tests use this, with registry.reset_all, to act as a new process)."""
    for memo in (metadata_plans, decode_plans, _descriptors, _smem_bytes, _unit_descales):
        memo.clear()


def out_dtype(q_dtype: torch.dtype) -> torch.dtype:
    """The dtype of out for `q_dtype` q (configs.decode.out_dtype_of)."""
    try:
        return torch_dtype(out_dtype_of(name_of(q_dtype)))
    except KeyError:  # no kernel dtype (the op's checks reject it; fake tensors may still ask)
        return q_dtype


def _unit_descale(like: torch.Tensor) -> torch.Tensor:
    """A float32 (1,) tensor holding 1.0 on `like`'s device: what an FP8 kernel reads for a descale
    given as None. One per device, made outside graph capture (made inside, its fill would be a node
    of the graph: eager calls would read memory only a replay writes), and copied from the host
    synchronously, so that it is written before a kernel on any stream reads it."""
    device_index = like.get_device()
    unit = _unit_descales.get(device_index)
    if unit is None:
        if like.is_cuda and workspace._capturing():
            raise KernelNotWarmError(f"the FP8 decode needs a 1.0 descale on device {device_index}, made outside "
                                     "CUDA graph capture: run the op once before capture")
        unit = _unit_descales[device_index] = torch.ones(1, dtype=torch.float32).to(like.device)
    return unit


def sm_parts_for(device_index: int, num_q_tokens_per_head_k: int, num_heads_k: int) -> int:
    """Rows of the schedule (SM parts) for this GPU and shape: one wave of split-KV CTAs."""
    arch = resolve_for_device(device_index)
    resident = ctas_per_sm_for(num_q_tokens_per_head_k, arch.tuning, _smem_per_sm(device_index))
    return num_sm_parts(_num_sms(device_index) * resident, num_q_tokens_per_head_k, num_heads_k,
                        block_m_for(num_q_tokens_per_head_k, arch.tuning))


class MetadataPlan:
    """The scheduler-metadata launch for one (batch, rows per KV head, KV heads, device)."""

    __slots__ = ("launch", "parts", "batch", "device_index", "block_n", "fixed_overhead_blocks")

    def __init__(self, device_index: int, batch: int, num_q_tokens_per_head_k: int, num_heads_k: int):
        self.device_index = device_index
        self.batch = batch
        self.parts = sm_parts_for(device_index, num_q_tokens_per_head_k, num_heads_k)
        cfg = metadata_config()
        self.block_n, self.fixed_overhead_blocks = cfg.block_n, cfg.fixed_overhead_blocks
        self.launch = None
        if batch:
            family = registry.get("mla_metadata")
            self.launch = family.launcher(cfg, resolve_for_device(device_index), family.ENTRY, device_index,
                                          (Blob(METADATA_PARAMS.size),), (1, 1, 1), (128, 1, 1))

    def run(self, cache_seqlens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(tile_scheduler_metadata (parts, 8), num_splits (batch + 1,)), both int32, filled on the GPU."""
        metadata = cache_seqlens.new_empty((self.parts, METADATA_SIZE))  # int32, like cache_seqlens
        num_splits = cache_seqlens.new_empty((self.batch + 1,))
        if self.launch is None:  # an empty batch
            metadata.zero_()
            num_splits.zero_()
            return metadata, num_splits
        self.launch(current_stream(self.device_index),
                    METADATA_PARAMS.pack(cache_seqlens.data_ptr(), metadata.data_ptr(), num_splits.data_ptr(),
                                         self.batch, self.parts, self.block_n, self.fixed_overhead_blocks, -1, 0))
        return metadata, num_splits


def _kernels(q_shape, dtype: str, kv_dtype: str, head_dim_v: int, page_size: int, h_kv: int, parts: int,
             max_seq_tokens: int, kv_bytes_per_token: int, arch: ArchPair, device_index: int):
    """(split-KV launch, combine launch or None, TMA box or None, row tiles). The combine launch is
    None where the split-KV kernel merges the splits itself. dtype: q's; kv_dtype: the cache's.

    sm_90a runs the TMA + wgmma family; sm_80/86/89 the mma.sync + cp.async family, which takes the
    cache as a plain pointer instead of a TMA descriptor."""
    b, s_q, h_q, d = q_shape
    rows = s_q * (h_q // h_kv)
    if arch.tuning.major >= 9:
        family = registry.get("mla_decode_sm90")
        schedule, cluster_choice = env.choice(SCHEDULE_ENV.name), env.choice(CLUSTER_ENV.name)
        if schedule == "auto":
            fused = fused_combine_pays(b, rows, parts, head_dim_v, max_seq_tokens, kv_bytes_per_token)
            schedule = "ws" if fused else "ws_unfused"
        cluster_m = cluster_m_for(-(-rows // BLOCK_M), cluster_choice)
        cfg = decode_config(dtype, d, head_dim_v, page_size, arch.tuning, schedule, cluster_m, kv_dtype, rows)
        params = (Blob(DECODE_PARAMS.size), TMA_DESC)
    else:
        family = registry.get("mla_decode_sm80")
        cfg = sm80_decode_config(dtype, d, head_dim_v, page_size, rows, arch.tuning, kv_dtype)
        params, box = (Blob(DECODE_PARAMS.size), PTR), None
    smem = _kernel_smem(family, cfg, arch, device_index)
    row_tiles = -(-rows // cfg.block_m)
    # A compact-rows kernel holds 32 query rows in its one row tile: more would be dropped.
    assert not getattr(cfg, "compact_rows", False) or rows <= cfg.block_m // 2, (cfg, rows)
    grid, block = (parts, h_kv, row_tiles), (cfg.num_threads, 1, 1)
    if cfg.cluster is not None and not _clusters_fit(family, cfg, arch, device_index, grid, block, smem):
        cfg = decode_config(dtype, d, head_dim_v, page_size, arch.tuning, cfg.schedule, 1, kv_dtype, rows)
    if arch.tuning.major >= 9:
        # (token, head, 64 columns), or with several chunks a load (chunk, token, head, 64 columns).
        box = (min(page_size, cfg.block_n), 1, 64)
        if cfg.chunks_per_load > 1:
            box = (cfg.chunks_per_load, *box)
    splitkv = family.launcher(cfg, arch, family.SPLITKV, device_index, params, grid, block, dynamic_smem=smem,
                              cluster=cfg.cluster)
    if cfg.fused_combine:
        return splitkv, None, box, row_tiles
    # Programmatic dependent launch exists from sm_90 on; below, the combine simply follows in stream order.
    combine = family.launcher(cfg, arch, family.COMBINE, device_index, (Blob(DECODE_PARAMS.size),),
                              (b, h_kv, -(-rows // COMBINE_ROWS_PER_CTA)), (COMBINE_THREADS, 1, 1),
                              pdl=arch.target.major >= 9)
    return splitkv, combine, box, row_tiles


def _kernel_smem(family, cfg, arch: ArchPair, device_index: int) -> int:
    """The dynamic shared memory the split-KV kernel declares (an int the cubin exports)."""
    key = (family.name, cfg, arch, device_index)
    smem = _smem_bytes.get(key)
    if smem is None:
        smem = _smem_bytes[key] = read_global_int32(family.binary(cfg, arch), f"{family.SPLITKV}_smem_bytes",
                                                    device_index)
    return smem


def _clusters_fit(family, cfg, arch: ArchPair, device_index: int, grid: tuple[int, int, int],
                  block: tuple[int, int, int], smem: int) -> bool:
    """Whether every cluster of the split-KV grid is resident at once: the scheduler plans one wave
    of CTAs, and a cluster left over for a second wave would double the call's time."""
    kernel = family.kernel(cfg, arch, family.SPLITKV, device_index, smem)
    fits = max_active_clusters(kernel, grid, block, smem, cfg.cluster)
    needed = grid[0] * grid[1] * grid[2] // cfg.cluster_m
    if fits < needed:
        log.info("%s: %d clusters of %d needed, %d resident at once: launching without clusters",
                 family.kernel_name(cfg), needed, cfg.cluster_m, fits)
    return fits >= needed


def kv_tma_view(k_cache: torch.Tensor, rank: int) -> torch.Tensor:
    """The cache as the TMA descriptor sees it: (token, head, column), or at rank 4 (64-column chunk,
    token, head, column within the chunk), whose box lands as the chunk-major slabs the kernel reads."""
    num_blocks, page_size, h_kv, d = k_cache.shape
    rows = k_cache.view(num_blocks * page_size, h_kv, d)
    if rank == 4:
        rows = rows.as_strided((d // 64, num_blocks * page_size, h_kv, 64), (64, h_kv * d, d, 1))
    return rows


def kv_descriptor(k_cache: torch.Tensor, key: tuple, box: tuple[int, ...]) -> tma.TmaDescriptor:
    """The TMA descriptor of the cache for `box` (3-D: token, head, 64 columns; 4-D: the 64-column
    chunk outermost); `key` = (data_ptr, shape, dtype, box) identifies it."""
    desc = _descriptors.get(key)
    if desc is None:
        if len(_descriptors) > 1024:  # callers with ever-new caches: keep the memo bounded
            _descriptors.clear()
        # A box row is 64 columns: 128 B of bf16 / fp16, 64 B of e4m3. The swizzle spans the row (the
        # kernels' shared memory layouts expect it) and L2 promotion is a row (see TmaSpec.l2_promotion).
        row_bytes = box[-1] * k_cache.element_size()
        desc = _descriptors[key] = tma.tiled(kv_tma_view(k_cache, len(box)), box, swizzle=row_bytes,
                                             l2_promotion=row_bytes)
    return desc


class DecodePlan:
    """The launches and sizes of one validated decode signature; `run` enqueues a call."""

    __slots__ = ("splitkv", "combine", "box", "parts", "h_kv", "q_per_kv", "rows", "o_accum_elems",
                 "accum_elems", "counter_elems", "max_blocks", "bt_stride", "default_scale", "device_index",
                 "out_shape", "out_dtype", "lse_shape", "b", "s_q", "h_q", "q_strides", "kv_shape", "kv_dtype",
                 "unit_descale", "unit_ptr")

    def __init__(self, q: torch.Tensor, k_cache: torch.Tensor, block_table: torch.Tensor, head_dim_v: int,
                 parts: int):
        b, s_q, h_q, d = q.shape
        _, page_size, h_kv, _ = k_cache.shape
        self.device_index = q.get_device()
        self.splitkv, self.combine, self.box, row_tiles = _kernels(
            tuple(q.shape), name_of(q.dtype), name_of(k_cache.dtype), head_dim_v, page_size, h_kv, parts,
            block_table.shape[1] * page_size, h_kv * d * k_cache.element_size(),
            resolve_for_device(self.device_index), self.device_index)
        self.b, self.s_q, self.h_q = b, s_q, h_q
        self.q_strides = q.stride()[:3]
        self.parts = parts
        self.h_kv = h_kv
        self.q_per_kv = h_q // h_kv
        self.rows = s_q * self.q_per_kv
        slots = accum_rows(b, parts)
        self.o_accum_elems = slots * h_kv * self.rows * head_dim_v
        self.accum_elems = self.o_accum_elems + slots * h_kv * self.rows
        # Fused combine: one arrival counter per (batch, KV head, row tile).
        self.counter_elems = 0 if self.combine is not None else b * h_kv * row_tiles
        self.max_blocks = block_table.shape[1]
        self.bt_stride = block_table.stride(0)
        self.default_scale = d ** -0.5
        self.out_shape = (b, s_q, h_q, head_dim_v)
        self.out_dtype = out_dtype(q.dtype)
        self.lse_shape = (b, h_q, s_q)
        self.kv_shape, self.kv_dtype = k_cache.shape, k_cache.dtype  # fixed by the plan's signature
        # The kernels over an FP8 cache read both descales through pointers (no host sync:
        # capturable); a descale given as None (always descale_q with a 16-bit q) reads this 1.0.
        # The bf16 / fp16 kernels over a cache of q's dtype read none: null pointers.
        self.unit_descale = _unit_descale(q) if k_cache.dtype == FP8 else None
        self.unit_ptr = 0 if self.unit_descale is None else self.unit_descale.data_ptr()

    def run(self, q: torch.Tensor, q_ptr: int, k_cache: torch.Tensor, k_ptr: int, block_table: torch.Tensor,
            cache_seqlens: torch.Tensor, tile_scheduler_metadata: torch.Tensor, num_splits: torch.Tensor,
            scale: float, causal: bool, descale_q: torch.Tensor | None = None,
            descale_k: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Enqueue the call on the current stream; (out, lse) as flash_mla_with_kvcache returns them.
        The caller has checked the signature (descales included: float32 (1,) on q's device, given
        only with an FP8 cache) and that q_ptr and k_ptr (the data pointers of q and k_cache) are
        16-byte aligned."""
        # new_empty: ~1 us cheaper than torch.empty(..., device=)
        out = q.new_empty(self.out_shape, dtype=self.out_dtype)
        lse = q.new_empty(self.lse_shape, dtype=torch.float32)
        stream = current_stream(self.device_index)
        # Both partial buffers in one scratch block: o_accum then lse_accum (float32); `scratch`
        # keeps a buffer allocated during graph capture alive until the launch is enqueued.
        accum_ptr, counters_ptr, scratch = workspace.decode_scratch(self.device_index, stream, self.accum_elems,
                                                                    self.counter_elems, q)
        q_stride = self.q_strides
        params = DECODE_PARAMS.pack(
            q_ptr, out.data_ptr(), lse.data_ptr(), accum_ptr, accum_ptr + 4 * self.o_accum_elems,
            block_table.data_ptr(), cache_seqlens.data_ptr(), tile_scheduler_metadata.data_ptr(),
            num_splits.data_ptr(), q_stride[0], q_stride[1], q_stride[2], self.bt_stride,
            self.b, self.s_q, self.h_q, self.h_kv, self.q_per_kv, self.rows, self.parts, self.max_blocks,
            scale, scale * _LOG2E, 1 if causal and self.s_q > 1 else 0, 1, counters_ptr,
            self.unit_ptr if descale_q is None else descale_q.data_ptr(),
            self.unit_ptr if descale_k is None else descale_k.data_ptr(), 0, 0, 0, 0, 0, 0)
        box = self.box
        kv = k_ptr if box is None else kv_descriptor(k_cache, (k_ptr, self.kv_shape, self.kv_dtype, box), box)
        self.splitkv(stream, params, kv)
        if self.combine is not None:
            self.combine(stream, params)
        del scratch  # (graph capture) freed only now: later captured work may reuse the block
        return out, lse

