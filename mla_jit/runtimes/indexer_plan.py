"""Launch plans of the DeepSeek V3.2 indexer: the kernel for a layout (heads, head dim, next_n, page
size, device), its launch, the work split, and the TMA descriptors (memoized by pointer and layout:
engines reuse their buffers call after call).

The op layer (ops/indexer.py) validates arguments and asks for a plan; the plan enqueues calls.
"""
from __future__ import annotations

import torch

from ..configs.indexer import (LOGITS_N, SM80_TUNINGS, SM90_TUNINGS, TILE_KEYS, IndexerMetadataConfig,
                               logits_chunk_keys, logits_config, logits_sm80_config, paged_config, paged_sm80_config)
from ..errors import FeatureNotAvailableError
from ..jit import env, tma
from ..jit.arch import resolve_for_device
from ..jit.launch import TMA_DESC, Blob
from ..jit.loader import read_global_int32
from ..jit.stream import current_stream
from . import registry
from .device import num_sms as _num_sms
from .indexer import LOGITS_PARAMS, LOGITS_SM80_PARAMS, METADATA_PARAMS, PAGED_PARAMS, PAGED_SM80_PARAMS

MAX_PLANS = 1024
MAX_DESCRIPTORS = 4096
# A PagedCall's (q, weights, cache) pointer triples: layers x the engine's q / weights buffers.
MAX_CALL_DESCRIPTORS = 512
plans: dict[tuple, object] = {}            # layout signature -> LogitsPlan / PagedCall / MetadataPlan
_descriptors: dict[tuple, tma.TmaDescriptor] = {}
# The variable that picks a kernel: part of the plan keys (read raw on the warm path).
plan_env = env.raw_reader("MLA_JIT_ARCH")
METADATA_THREADS = 256


def reset() -> None:
    """Forget every plan and descriptor (tests use this, with registry.reset_all, to act as a new process)."""
    plans.clear()
    _descriptors.clear()


def _memo(key: tuple, make) -> tma.TmaDescriptor:
    desc = _descriptors.get(key)
    if desc is None:
        if len(_descriptors) >= MAX_DESCRIPTORS:   # callers with ever-new buffers: keep the memo bounded
            _descriptors.clear()
        desc = _descriptors[key] = make()
    return desc


def _tiled(t: torch.Tensor, box: tuple[int, ...], swizzle: int = 0) -> tma.TmaDescriptor:
    return _memo((t.data_ptr(), t.shape, t.stride(), t.dtype, box, swizzle),
                 lambda: tma.tiled(t, box, swizzle=swizzle))


def _indexer_arch(device_index: int, argument: str):
    """The device's arch pair, and whether it takes the TMA + wgmma kernels (else mma.sync)."""
    arch = resolve_for_device(device_index)
    name = arch.tuning.name
    if name not in SM90_TUNINGS and name not in SM80_TUNINGS:
        raise FeatureNotAvailableError(argument, f"the V3.2 indexer on {name}")
    return arch, name in SM90_TUNINGS


def _kernel_launch(family, cfg, arch, device_index: int, params: tuple, threads: int | None = None):
    """The cached launch of a family's kernel: its dynamic shared memory (and, for the mma.sync
    kernels, its block size) read from the binary."""
    binary = family.binary(cfg, arch)
    smem = read_global_int32(binary, f"{family.ENTRY}_smem_bytes", device_index)
    if threads is None:
        threads = read_global_int32(binary, f"{family.ENTRY}_threads", device_index)
    return family.launcher(cfg, arch, family.ENTRY, device_index, params, (1, 1, 1), (threads, 1, 1),
                           dynamic_smem=smem)


class LogitsPlan:
    """fp8_mqa_logits for one (heads, head dim, device)."""

    __slots__ = ("cfg", "launch", "device_index", "heads", "head_dim", "num_sms", "tma")

    def __init__(self, heads: int, head_dim: int, device_index: int):
        self.device_index = device_index
        arch, self.tma = _indexer_arch(device_index, "q")
        self.heads, self.head_dim = heads, head_dim
        self.num_sms = _num_sms(device_index)
        if self.tma:
            self.cfg = logits_config(heads, head_dim, arch.tuning)
            params = (Blob(LOGITS_PARAMS.size), TMA_DESC, TMA_DESC, TMA_DESC, TMA_DESC)
            self.launch = _kernel_launch(registry.get("indexer_logits_sm90"), self.cfg, arch, device_index, params,
                                         384)
        else:
            self.cfg = logits_sm80_config(heads, head_dim, arch.tuning)
            self.launch = _kernel_launch(registry.get("indexer_logits_sm80"), self.cfg, arch, device_index,
                                         (Blob(LOGITS_SM80_PARAMS.size),))

    def run(self, q: torch.Tensor, k: torch.Tensor, k_scale: torch.Tensor, weights: torch.Tensor, ks: torch.Tensor,
            ke: torch.Tensor, logits: torch.Tensor, clean: bool, max_seqlen_k: int) -> None:
        """Enqueue the call on the current stream (arguments validated by the op)."""
        m, n = q.shape[0], k.shape[0]
        if m == 0 or n == 0:
            return
        unit_rows = self.cfg.unit_rows
        num_q_blocks = -(-m // unit_rows)
        chunk = logits_chunk_keys(n, num_q_blocks, self.num_sms, self.cfg.min_chunk_keys)
        num_chunks = -(-n // chunk)
        grid = min(num_q_blocks * num_chunks, self.num_sms)
        base = (ks.data_ptr(), ke.data_ptr(), logits.data_ptr(), logits.stride(0), m, n, num_q_blocks, num_chunks,
                chunk, max_seqlen_k, int(clean), 0)
        if not self.tma:
            params = LOGITS_SM80_PARAMS.pack(*base, q.data_ptr(), k.data_ptr(), k_scale.data_ptr(), weights.data_ptr(),
                                             weights.stride(0))
            self.launch(current_stream(self.device_index), params, grid=(grid, 1, 1))
            return
        params = LOGITS_PARAMS.pack(*base)
        d = self.head_dim
        q_desc = _tiled(q.view(m * self.heads, d), (LOGITS_N, d), swizzle=d)
        w_desc = _tiled(weights, (unit_rows, self.heads))
        k_desc = _tiled(k, (TILE_KEYS, d), swizzle=d)
        s_desc = _memo(("k_scale", k_scale.data_ptr(), n), lambda: tma.encode(   # (a 2-D map: one row of n)
            tma.TmaSpec(torch.float32, (n, 1), (-(-n // 4) * 4,), (TILE_KEYS, 1)), k_scale.data_ptr()))
        self.launch(current_stream(self.device_index), params, q_desc, w_desc, k_desc, s_desc, grid=(grid, 1, 1))


class PagedPlan:
    """fp8_paged_mqa_logits for one (heads, head dim, next_n, page size, device)."""

    __slots__ = ("cfg", "launch", "device_index", "heads", "head_dim", "next_n", "page", "tma")

    def __init__(self, heads: int, head_dim: int, next_n: int, page: int, device_index: int):
        self.device_index = device_index
        arch, self.tma = _indexer_arch(device_index, "q")
        self.heads, self.head_dim, self.next_n, self.page = heads, head_dim, next_n, page
        if self.tma:
            self.cfg = paged_config(heads, head_dim, next_n, page, arch.tuning)
            params = (Blob(PAGED_PARAMS.size), TMA_DESC, TMA_DESC, TMA_DESC, TMA_DESC)
            self.launch = _kernel_launch(registry.get("indexer_paged_sm90"), self.cfg, arch, device_index, params,
                                         self.cfg.num_threads)
        else:
            self.cfg = paged_sm80_config(heads, head_dim, next_n, page, arch.tuning)
            self.launch = _kernel_launch(registry.get("indexer_paged_sm80"), self.cfg, arch, device_index,
                                         (Blob(PAGED_SM80_PARAMS.size),))

    def _cache_descriptors(self, kv_cache: torch.Tensor) -> tuple[tma.TmaDescriptor, tma.TmaDescriptor]:
        """The page values (D x page x blocks, e4m3 as bytes) and the page scales (page x blocks, fp32),
        both through the cache's page stride."""
        blocks, page, d, stride0 = kv_cache.shape[0], self.page, self.head_dim, kv_cache.stride(0)
        box_keys = min(page, TILE_KEYS)
        base = kv_cache.data_ptr()
        values = _memo(("values", base, blocks, page, d, stride0), lambda: tma.encode(
            tma.TmaSpec(torch.uint8, (d, page, blocks), (d, stride0), (d, box_keys, 1), swizzle=d), base))
        scales = _memo(("scales", base, blocks, page, d, stride0), lambda: tma.encode(
            tma.TmaSpec(torch.float32, (page, blocks), (stride0 // 4,), (box_keys, 1)), base + page * d))
        return values, scales

    def descriptors(self, q: torch.Tensor, weights: torch.Tensor, kv_cache: torch.Tensor) -> tuple:
        """The TMA descriptors of q, weights, the page values and the page scales."""
        n_cols = self.next_n * self.heads
        q_desc = _tiled(q.view(q.shape[0] * n_cols, self.head_dim), (n_cols, self.head_dim), swizzle=self.head_dim)
        return (q_desc, _tiled(weights, (self.next_n, self.heads)), *self._cache_descriptors(kv_cache))


class PagedCall:
    """One validated fp8_paged_mqa_logits layout (shapes, strides and dtypes of every tensor fixed: the
    op's signature): its kernel's PagedPlan, the launch values the layout fixes, and the TMA
    descriptors memoized by the three data pointers they depend on. A warm call then reads the
    pointers, packs the parameters and launches (the descriptors' memo keys of shapes and strides,
    and the q view, took about half of the op's host time)."""

    __slots__ = ("plan", "rows", "empty", "ctas", "fixed", "sm80_tail", "descs")

    def __init__(self, plan: PagedPlan, q: torch.Tensor, kv_cache: torch.Tensor, weights: torch.Tensor,
                 context_lens: torch.Tensor, block_table: torch.Tensor, schedule: torch.Tensor):
        self.plan = plan
        b = q.shape[0]
        self.rows = b * plan.next_n
        self.ctas = schedule.shape[0] - 1
        self.empty = b == 0 or self.ctas <= 0 or kv_cache.shape[0] == 0
        # PAGED_PARAMS after the four pointers and the logits row stride.
        self.fixed = (block_table.stride(0), b, plan.next_n, block_table.shape[1], int(context_lens.dim() == 2))
        self.sm80_tail = (weights.stride(0), kv_cache.stride(0), kv_cache.shape[0], 0)
        self.descs: dict[tuple[int, int, int], tuple] = {}

    def run(self, q: torch.Tensor, weights: torch.Tensor, kv_cache: torch.Tensor, q_ptr: int, w_ptr: int, kv_ptr: int,
            lens_ptr: int, table_ptr: int, schedule_ptr: int, logits: torch.Tensor, row_stride: int,
            max_context_len: int, clean: bool) -> None:
        plan = self.plan
        if self.empty:
            if clean and logits.numel():
                logits.fill_(float("-inf"))   # no key at all
            return
        base = (lens_ptr, table_ptr, schedule_ptr, logits.data_ptr(), row_stride, *self.fixed, max_context_len,
                int(clean))
        stream = current_stream(plan.device_index)
        if not plan.tma:
            plan.launch(stream, PAGED_SM80_PARAMS.pack(*base, q_ptr, kv_ptr, w_ptr, *self.sm80_tail),
                        grid=(self.ctas, 1, 1))
            return
        key = (q_ptr, w_ptr, kv_ptr)
        descs = self.descs.get(key)
        if descs is None:
            if len(self.descs) >= MAX_CALL_DESCRIPTORS:   # ever-new buffers: keep the memo bounded
                self.descs.clear()
            descs = self.descs[key] = plan.descriptors(q, weights, kv_cache)
        plan.launch(stream, PAGED_PARAMS.pack(*base), *descs, grid=(self.ctas, 1, 1))


class MetadataPlan:
    """get_paged_mqa_logits_metadata on one device (any arch)."""

    __slots__ = ("launch", "device_index")

    def __init__(self, device_index: int):
        self.device_index = device_index
        arch = resolve_for_device(device_index)
        family = registry.get("indexer_metadata")
        self.launch = family.launcher(IndexerMetadataConfig(), arch, family.ENTRY, device_index,
                                      (Blob(METADATA_PARAMS.size),), (1, 1, 1), (METADATA_THREADS, 1, 1))

    def run(self, context_lens: torch.Tensor, schedule: torch.Tensor) -> None:
        b = context_lens.shape[0]
        next_n = context_lens.shape[1] if context_lens.dim() == 2 else 1
        params = METADATA_PARAMS.pack(context_lens.data_ptr(), schedule.data_ptr(), b, next_n,
                                      int(context_lens.dim() == 2), schedule.shape[0] - 1)
        self.launch(current_stream(self.device_index), params)
