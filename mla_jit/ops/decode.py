"""FlashMLA-compatible dense paged MLA decode: get_mla_metadata and flash_mla_with_kvcache."""
from __future__ import annotations

import functools
import logging
import math

import torch

from ..configs.decode import (BLOCK_M, CLUSTER_SCHEDULES, COMBINE_ROWS_PER_CTA, COMBINE_THREADS,
                              SUPPORTED_HEAD_DIMS, SUPPORTED_PAGE_SIZES, accum_rows, block_m_for, cluster_m_for,
                              ctas_per_sm_for, decode_config, fused_combine_pays, metadata_config, num_sm_parts,
                              sm80_decode_config)
from ..dtypes import name_of
from ..errors import InvalidArgumentError
from ..jit import env, tma
from ..jit.arch import resolve_for_device
from ..jit.launch import PTR, TMA_DESC, Blob, max_active_clusters
from ..jit.loader import read_global_int32
from ..jit.stream import current_stream
from ..runtimes import registry
from ..runtimes.decode import DECODE_PARAMS, METADATA_PARAMS
from . import validate, workspace

log = logging.getLogger(__name__)

_QKV_DTYPES = (torch.bfloat16, torch.float16)
_METADATA_SIZE = 8
_LOG2E = 1.4426950408889634
_MAX_Q_PER_KV = 128
_MAX_S_Q = 4
_MAX_H_KV = 8


@functools.lru_cache(maxsize=None)
def _num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


@functools.lru_cache(maxsize=None)
def _smem_per_sm(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).shared_memory_per_multiprocessor


def _int32_vector(name: str, value, length: int | None, device=None) -> torch.Tensor:
    validate.tensor(name, value, dtypes=(torch.int32,), ndim=1, device=device, contiguous=True)
    if length is not None and value.shape[0] != length:
        raise InvalidArgumentError(name, f"shape ({length},)", f"shape {tuple(value.shape)}")
    return value


def get_mla_metadata(cache_seqlens: torch.Tensor, num_q_tokens_per_head_k: int,
                     num_heads_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Split-KV schedule for one decoding step; reuse it for every layer.

    Returns (tile_scheduler_metadata int32 (num_sm_parts, 8), num_splits int32 (b + 1,)).
    Runs on the GPU only (no host sync), so it can be captured in a CUDA graph.
    """
    family = registry.get("mla_metadata")
    try:
        signature = (cache_seqlens.shape, cache_seqlens.dtype, cache_seqlens.stride(), cache_seqlens.get_device(),
                     num_q_tokens_per_head_k, num_heads_k, env.plan_inputs())
        plan = family.plans.get(signature)
    except (AttributeError, TypeError):  # not a tensor, or an unhashable count: full checks below
        plan = signature = None
    if plan is None:
        plan = _metadata_plan(cache_seqlens, num_q_tokens_per_head_k, num_heads_k)
        if signature is not None:
            family.plans[signature] = plan
    launch, parts, batch = plan
    metadata = cache_seqlens.new_empty((parts, _METADATA_SIZE))  # int32, like cache_seqlens
    num_splits = cache_seqlens.new_empty((batch + 1,))
    if batch == 0:
        num_splits.zero_()
        metadata.zero_()
        return metadata, num_splits
    cfg = metadata_config()
    launch(current_stream(cache_seqlens.get_device()),
           METADATA_PARAMS.pack(cache_seqlens.data_ptr(), metadata.data_ptr(), num_splits.data_ptr(), batch,
                                parts, cfg.block_n, cfg.fixed_overhead_blocks))
    return metadata, num_splits


def _metadata_plan(cache_seqlens, num_q_tokens_per_head_k, num_heads_k):
    """Validate get_mla_metadata's arguments; return (launch, num_sm_parts, batch) for them."""
    _int32_vector("cache_seqlens", cache_seqlens, None)
    if not isinstance(num_q_tokens_per_head_k, int) or num_q_tokens_per_head_k < 1:
        raise InvalidArgumentError("num_q_tokens_per_head_k", "a positive int (s_q * h_q // h_kv)",
                                   repr(num_q_tokens_per_head_k))
    if not isinstance(num_heads_k, int) or not 1 <= num_heads_k <= _MAX_H_KV:
        raise InvalidArgumentError("num_heads_k", f"an int in [1, {_MAX_H_KV}]", repr(num_heads_k))
    device = cache_seqlens.get_device()
    arch = resolve_for_device(device)
    batch = cache_seqlens.shape[0]
    resident = ctas_per_sm_for(num_q_tokens_per_head_k, arch.tuning, _smem_per_sm(device))
    parts = num_sm_parts(_num_sms(device) * resident, num_q_tokens_per_head_k, num_heads_k,
                         block_m_for(num_q_tokens_per_head_k, arch.tuning))
    launch = None
    if batch:
        family = registry.get("mla_metadata")
        launch = family.launcher(metadata_config(), arch, family.ENTRY, device,
                                 (Blob(METADATA_PARAMS.size),), (1, 1, 1), (128, 1, 1))
    return launch, parts, batch


def _check_decode_args(q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata,
                       num_splits, softmax_scale):
    validate.tensor("q", q, dtypes=_QKV_DTYPES, ndim=4, last_dim_contiguous=True)
    device = q.device
    validate.tensor("k_cache", k_cache, dtypes=(q.dtype,), ndim=4, device=device, contiguous=True)
    b, s_q, h_q, d = q.shape
    num_blocks, page_size, h_kv, d_k = k_cache.shape
    if d_k != d:
        raise InvalidArgumentError("k_cache", f"last dim {d} (q's head dim)", f"shape {tuple(k_cache.shape)}")
    if not isinstance(head_dim_v, int) or (d, head_dim_v) not in SUPPORTED_HEAD_DIMS:
        raise InvalidArgumentError("head_dim_v / q.shape[-1]",
                                   f"(d, head_dim_v) in {list(SUPPORTED_HEAD_DIMS)}", f"({d}, {head_dim_v})")
    if page_size not in SUPPORTED_PAGE_SIZES:
        raise InvalidArgumentError("k_cache", f"page block size (dim 1) in {SUPPORTED_PAGE_SIZES}",
                                   str(page_size))
    if not 1 <= h_kv <= _MAX_H_KV or h_q % h_kv:
        raise InvalidArgumentError("k_cache", f"h_kv (dim 2) in [1, {_MAX_H_KV}] dividing h_q={h_q}", str(h_kv))
    if h_q // h_kv > _MAX_Q_PER_KV:
        raise InvalidArgumentError("q", f"at most {_MAX_Q_PER_KV} query heads per KV head", str(h_q // h_kv))
    if not 1 <= s_q <= _MAX_S_Q:
        raise InvalidArgumentError("q", f"s_q (dim 1) in [1, {_MAX_S_Q}]", str(s_q))
    if num_blocks * page_size >= 2 ** 31:
        raise InvalidArgumentError("k_cache", "fewer than 2^31 tokens", str(num_blocks * page_size))
    # Q rows are read with 16-byte vector loads.
    if q.data_ptr() % 16 or q.stride(1) % 8 or q.stride(2) % 8 or q.stride(0) % 8:
        raise InvalidArgumentError("q", "a 16-byte aligned base and strides that are multiples of 8 elements",
                                   f"strides {q.stride()}")
    validate.aligned("k_cache", k_cache, 16)
    validate.tensor("block_table", block_table, dtypes=(torch.int32,), ndim=2, device=device,
                    last_dim_contiguous=True)
    if block_table.shape[0] != b:
        raise InvalidArgumentError("block_table", f"{b} rows (q's batch)", f"shape {tuple(block_table.shape)}")
    _int32_vector("cache_seqlens", cache_seqlens, b, device)
    validate.tensor("tile_scheduler_metadata", tile_scheduler_metadata, dtypes=(torch.int32,), ndim=2,
                    device=device, contiguous=True)
    if tile_scheduler_metadata.shape[1] != _METADATA_SIZE or tile_scheduler_metadata.shape[0] < 1:
        raise InvalidArgumentError("tile_scheduler_metadata", f"shape (num_sm_parts, {_METADATA_SIZE}) "
                                   "from get_mla_metadata", f"shape {tuple(tile_scheduler_metadata.shape)}")
    _int32_vector("num_splits", num_splits, b + 1, device)
    _check_output_offsets(q.shape, tile_scheduler_metadata.shape[0], head_dim_v)
    if softmax_scale is not None and not (isinstance(softmax_scale, (int, float)) and math.isfinite(softmax_scale)):
        raise InvalidArgumentError("softmax_scale", "a finite float or None", repr(softmax_scale))


def _check_output_offsets(q_shape, num_sm_parts: int, head_dim_v: int) -> None:
    """The kernels index out and the split-KV partials (one slot per split: at most
    b + num_sm_parts) with 32-bit element offsets."""
    b, s_q, h_q = q_shape[0], q_shape[1], q_shape[2]
    if (b + num_sm_parts) * s_q * h_q * head_dim_v >= 2 ** 31:
        raise InvalidArgumentError("q", "(batch + num_sm_parts) * s_q * h_q * head_dim_v < 2^31",
                                   f"shape {tuple(q_shape)} with {num_sm_parts} sm parts")


def _decode_plan(q, k_cache, head_dim_v: int, parts: int, max_seq_tokens: int):
    """(splitkv launch, combine launch or None, TMA box or None, row tiles) for this shape; cached
    by the caller. The combine launch is None where the split-KV kernel merges the splits itself.

    sm_90a runs the TMA + wgmma family; sm_80/86/89 the mma.sync + cp.async family, which takes
    the cache as a plain pointer instead of a TMA descriptor."""
    device = q.get_device()
    arch = resolve_for_device(device)
    b, s_q, h_q, d = q.shape
    _, page_size, h_kv, _ = k_cache.shape
    rows = s_q * (h_q // h_kv)
    dtype = name_of(q.dtype)
    if arch.tuning.major >= 9:
        family = registry.get("mla_decode_sm90")
        schedule, cluster_choice = env.sm90_decode_schedule(), env.sm90_cluster()
        if schedule == "auto":
            fused = fused_combine_pays(b, rows, parts, head_dim_v, max_seq_tokens,
                                       h_kv * d * k_cache.element_size())
            schedule = "ws" if fused else "ws_unfused"
        cluster_m = cluster_m_for(-(-rows // BLOCK_M), cluster_choice) if schedule in CLUSTER_SCHEDULES else 1
        cfg = decode_config(dtype, d, head_dim_v, page_size, arch.tuning, schedule, cluster_m)
        params, threads, box = (Blob(DECODE_PARAMS.size), TMA_DESC), cfg.num_threads, (min(page_size, cfg.block_n), 1, 64)
    else:
        family = registry.get("mla_decode_sm80")
        cfg = sm80_decode_config(dtype, d, head_dim_v, page_size, rows, arch.tuning)
        params, threads, box = (Blob(DECODE_PARAMS.size), PTR), cfg.num_threads, None
    smem_key = (cfg, arch, device)
    smem = family.plans.get(smem_key)
    if smem is None:
        smem = family.plans[smem_key] = read_global_int32(family.binary(cfg, arch),
                                                          f"{family.SPLITKV}_smem_bytes", device)
    row_tiles = -(-rows // cfg.block_m)
    grid = (parts, h_kv, row_tiles)
    if cfg.cluster is not None and not _clusters_fit(family, cfg, arch, device, grid, threads, smem):
        cfg = decode_config(dtype, d, head_dim_v, page_size, arch.tuning, cfg.schedule, 1)
    splitkv = family.launcher(cfg, arch, family.SPLITKV, device, params, grid, (threads, 1, 1), dynamic_smem=smem,
                              cluster=cfg.cluster)
    if cfg.fused_combine:
        return splitkv, None, box, row_tiles
    # Programmatic dependent launch exists from sm_90 on; below, the combine simply follows in stream order.
    combine = family.launcher(cfg, arch, family.COMBINE, device, (Blob(DECODE_PARAMS.size),),
                              (b, h_kv, -(-rows // COMBINE_ROWS_PER_CTA)), (COMBINE_THREADS, 1, 1),
                              pdl=arch.target.major >= 9)
    return splitkv, combine, box, row_tiles


def _clusters_fit(family, cfg, arch, device: int, grid: tuple[int, int, int], threads: int, smem: int) -> bool:
    """Whether every cluster of the split-KV grid is resident at once: the scheduler plans one wave
    of CTAs, and a cluster left over for a second wave would double the call's time."""
    kernel = family.kernel(cfg, arch, family.SPLITKV, device, smem)
    fits = max_active_clusters(kernel, grid, (threads, 1, 1), smem, cfg.cluster)
    needed = grid[0] * grid[1] * grid[2] // cfg.cluster_m
    if fits < needed:
        log.info("%s: %d clusters of %d needed, %d resident at once: launching without clusters",
                 family.kernel_name(cfg), needed, cfg.cluster_m, fits)
    return fits >= needed


def _kv_descriptor(k_cache: torch.Tensor, key: tuple, box: tuple[int, int, int]) -> tma.TmaDescriptor:
    """The TMA descriptor of the cache; `key` = (data_ptr, shape, dtype) identifies it."""
    descriptors = registry.get("mla_decode_sm90").descriptors
    desc = descriptors.get(key)
    if desc is None:
        if len(descriptors) > 1024:  # callers with ever-new caches: keep the memo bounded
            descriptors.clear()
        num_blocks, page_size, h_kv, d = k_cache.shape
        # L2 promotion = a box row (128 B): see TmaSpec.l2_promotion.
        desc = descriptors[key] = tma.tiled(k_cache.view(num_blocks * page_size, h_kv, d), box, swizzle=128,
                                            l2_promotion=128)
    return desc


def _signature(q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata, num_splits):
    """Everything _check_decode_args looks at except data pointers, as one hashable tuple: a call
    whose signature was validated before skips the checks (alignment is re-checked every call)."""
    return (q.shape, q.stride(), q.dtype, q.get_device(), k_cache.shape, k_cache.stride(), k_cache.dtype,
            k_cache.get_device(), block_table.shape, block_table.stride(), block_table.dtype,
            block_table.get_device(), cache_seqlens.shape, cache_seqlens.stride(), cache_seqlens.dtype,
            cache_seqlens.get_device(), tile_scheduler_metadata.shape, tile_scheduler_metadata.stride(),
            tile_scheduler_metadata.dtype, tile_scheduler_metadata.get_device(), num_splits.shape,
            num_splits.stride(), num_splits.dtype, num_splits.get_device(), head_dim_v,
            env.plan_inputs())  # MLA_JIT_ARCH / schedule are read live: another value, another plan


class _DecodePlan:
    """Everything a warm call needs for one validated signature."""

    __slots__ = ("splitkv", "combine", "box", "parts", "h_kv", "q_per_kv", "rows", "o_accum_elems",
                 "accum_elems", "counter_elems", "max_blocks", "bt_stride", "default_scale", "device_index",
                 "out_shape", "lse_shape")

    def __init__(self, q, k_cache, block_table, head_dim_v: int, parts: int):
        self.splitkv, self.combine, self.box, row_tiles = _decode_plan(
            q, k_cache, head_dim_v, parts, block_table.shape[1] * k_cache.shape[1])
        b, s_q, h_q, d = q.shape
        self.parts = parts
        self.h_kv = k_cache.shape[2]
        self.q_per_kv = h_q // self.h_kv
        self.rows = s_q * self.q_per_kv
        slots = accum_rows(b, parts)
        self.o_accum_elems = slots * self.h_kv * self.rows * head_dim_v
        self.accum_elems = self.o_accum_elems + slots * self.h_kv * self.rows
        # Fused combine: one arrival counter per (batch, KV head, row tile).
        self.counter_elems = 0 if self.combine is not None else b * self.h_kv * row_tiles
        self.max_blocks = block_table.shape[1]
        self.bt_stride = block_table.stride(0)
        self.default_scale = d ** -0.5
        self.device_index = q.get_device()
        self.out_shape = (b, s_q, h_q, head_dim_v)
        self.lse_shape = (b, h_q, s_q)


def flash_mla_with_kvcache(q: torch.Tensor, k_cache: torch.Tensor, block_table: torch.Tensor,
                           cache_seqlens: torch.Tensor, head_dim_v: int, tile_scheduler_metadata: torch.Tensor,
                           num_splits: torch.Tensor, softmax_scale: float | None = None,
                           causal: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Paged MLA decode (FlashMLA's API). Returns out (b, s_q, h_q, head_dim_v) in q's dtype and
    lse (b, h_q, s_q) float32 (natural log; +inf for rows that see no key)."""
    family = registry.get("mla_decode_sm90")  # holds the op's plans, whichever family a plan launches
    try:
        signature = _signature(q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata,
                               num_splits)
        plan = family.plans.get(signature)
    except (AttributeError, TypeError):  # a non-tensor argument: the full checks name it
        plan = signature = None
    if plan is None:
        _check_decode_args(q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata,
                           num_splits, softmax_scale)
        if q.shape[0] == 0:
            return (torch.empty((0, *q.shape[1:3], head_dim_v), dtype=q.dtype, device=q.device),
                    torch.empty((0, q.shape[2], q.shape[1]), dtype=torch.float32, device=q.device))
        plan = family.plans[signature] = _DecodePlan(q, k_cache, block_table, head_dim_v,
                                                     tile_scheduler_metadata.shape[0])
    q_ptr, k_ptr = q.data_ptr(), k_cache.data_ptr()
    if q_ptr % 16 or k_ptr % 16:
        raise InvalidArgumentError("q/k_cache", "16-byte aligned data pointers", f"{hex(q_ptr)}, {hex(k_ptr)}")
    if softmax_scale is None:
        scale = plan.default_scale
    elif isinstance(softmax_scale, (int, float)) and math.isfinite(softmax_scale):
        scale = float(softmax_scale)
    else:
        raise InvalidArgumentError("softmax_scale", "a finite float or None", repr(softmax_scale))
    shape = signature[0]
    b, s_q, h_q = shape[0], shape[1], shape[2]
    out = q.new_empty(plan.out_shape)  # new_empty: ~1 us cheaper than torch.empty(..., device=)
    lse = q.new_empty(plan.lse_shape, dtype=torch.float32)
    stream = current_stream(plan.device_index)
    # Both partial buffers in one scratch block: o_accum then lse_accum (float32); `scratch` keeps
    # a buffer allocated during graph capture alive until the launch is enqueued.
    accum_ptr, counters_ptr, scratch = workspace.decode_scratch(plan.device_index, stream, plan.accum_elems,
                                                                plan.counter_elems, q)
    q_stride = signature[1]
    params = DECODE_PARAMS.pack(
        q_ptr, out.data_ptr(), lse.data_ptr(), accum_ptr, accum_ptr + 4 * plan.o_accum_elems,
        block_table.data_ptr(), cache_seqlens.data_ptr(), tile_scheduler_metadata.data_ptr(),
        num_splits.data_ptr(), q_stride[0], q_stride[1], q_stride[2], plan.bt_stride,
        b, s_q, h_q, plan.h_kv, plan.q_per_kv, plan.rows, plan.parts, plan.max_blocks, scale, scale * _LOG2E,
        1 if causal and s_q > 1 else 0, counters_ptr)
    kv = k_ptr if plan.box is None else _kv_descriptor(k_cache, (k_ptr, signature[4], signature[6]), plan.box)
    plan.splitkv(stream, params, kv)
    if plan.combine is not None:
        plan.combine(stream, params)
    del scratch  # (graph capture) freed only now: later captured work may reuse the block
    return out, lse
