"""FlashMLA-compatible dense paged MLA decode: get_mla_metadata and flash_mla_with_kvcache, in both
of FlashMLA's forms (the schedule as two tensors, and the lazily filled FlashMLASchedMeta), as
torch custom ops `mla_jit::get_mla_metadata` and `mla_jit::flash_mla_with_kvcache`; and vLLM's
flash_mla_with_kvcache_fp8 (e4m3 q and cache with per-tensor descales, bf16 out), which is
flash_mla_with_kvcache on FP8 tensors.

This module validates arguments and asks the runtime (runtimes/decode_plan.py) for a plan; a warm
call is a signature lookup, the plan's launch and nothing else.
"""
from __future__ import annotations

import torch

from ..configs.decode import SUPPORTED_HEAD_DIMS, SUPPORTED_PAGE_SIZES
from ..errors import FeatureNotAvailableError, InvalidArgumentError
from ..runtimes import decode_plan as runtime
from . import library, sparse_decode, validate
from .schedule import FlashMLASchedMeta, SchedConfig, settle_schedule  # noqa: F401  (public: mla_jit.FlashMLASchedMeta)

_FP8 = torch.float8_e4m3fn
_Q_DTYPES = (torch.bfloat16, torch.float16, _FP8)
_MAX_Q_PER_KV = 128
_MAX_S_Q = 16   # draft tokens per sequence (speculative decoding, multi-token prediction)
_MAX_H_KV = 8
# FlashMLA's is_fp8_kvcache: its sparse (V3.2) cache of 656-byte FP8 records, not the plain e4m3 cache.
_FP8_RECORDS = "FlashMLA's FP8 KV cache records (656 bytes a token; for a plain e4m3 cache pass e4m3 q and k_cache)"


# ---- get_mla_metadata ----------------------------------------------------------------------

def get_mla_metadata(*args, **kwargs):
    """Split-KV schedule for one decoding step; reuse it for every layer.

    FlashMLA's two forms:
    - `get_mla_metadata()` -> (FlashMLASchedMeta(), None): the first flash_mla_with_kvcache call fills it.
    - `get_mla_metadata(cache_seqlens, num_q_tokens_per_head_k, num_heads_k, num_heads_q=None,
      is_fp8_kvcache=False, topk=None)` -> (tile_scheduler_metadata int32 (num_sm_parts, 8),
      num_splits int32 (b + 1,)), computed on the GPU (no host sync: capturable in a CUDA graph).
    """
    if len(args) == 3 and not kwargs:  # the engines' call: straight to the fast path
        if library.compiling():
            return _metadata_op(*args)
        return _metadata_eager(*args)
    if not args and not kwargs:
        return FlashMLASchedMeta(), None
    return _metadata_tensors(*args, **kwargs)


def _metadata_tensors(cache_seqlens: torch.Tensor, num_q_tokens_per_head_k: int, num_heads_k: int,
                      num_heads_q: int | None = None, is_fp8_kvcache: bool = False,
                      topk: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    if topk is not None:  # the sparse decode's schedule (FlashMLA's pre-2026 form)
        return sparse_decode.metadata_tensors(cache_seqlens, num_q_tokens_per_head_k, num_heads_k, num_heads_q,
                                              is_fp8_kvcache, topk)
    if is_fp8_kvcache:
        raise FeatureNotAvailableError("is_fp8_kvcache", _FP8_RECORDS + " without topk (dense decode)")
    if library.compiling():
        return _metadata_op(cache_seqlens, num_q_tokens_per_head_k, num_heads_k)
    return _metadata_eager(cache_seqlens, num_q_tokens_per_head_k, num_heads_k)


def _metadata_eager(cache_seqlens: torch.Tensor, num_q_tokens_per_head_k: int,
                    num_heads_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    try:
        signature = (cache_seqlens.shape, cache_seqlens.dtype, cache_seqlens.stride(), cache_seqlens.get_device(),
                     num_q_tokens_per_head_k, num_heads_k, runtime.plan_env())
        plan = runtime.metadata_plans.get(signature)
    except (AttributeError, TypeError):  # not a tensor, or an unhashable count: full checks below
        plan = signature = None
    if plan is None:
        _check_metadata_args(cache_seqlens, num_q_tokens_per_head_k, num_heads_k)
        plan = runtime.MetadataPlan(cache_seqlens.get_device(), cache_seqlens.shape[0], num_q_tokens_per_head_k,
                                    num_heads_k)
        if signature is not None:
            if len(runtime.metadata_plans) >= runtime.MAX_PLANS:
                runtime.metadata_plans.clear()
            runtime.metadata_plans[signature] = plan
    return plan.run(cache_seqlens)


def _check_metadata_args(cache_seqlens, num_q_tokens_per_head_k, num_heads_k) -> None:
    _int32_vector("cache_seqlens", cache_seqlens, None)
    if not _is_int(num_q_tokens_per_head_k) or num_q_tokens_per_head_k < 1:
        raise InvalidArgumentError("num_q_tokens_per_head_k", "a positive int (s_q * h_q // h_kv)",
                                   repr(num_q_tokens_per_head_k))
    if not _is_int(num_heads_k) or not 1 <= num_heads_k <= _MAX_H_KV:
        raise InvalidArgumentError("num_heads_k", f"an int in [1, {_MAX_H_KV}]", repr(num_heads_k))


def _metadata_fake(cache_seqlens: torch.Tensor, num_q_tokens_per_head_k: int,
                   num_heads_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    parts = runtime.sm_parts_for(cache_seqlens.device.index or 0, num_q_tokens_per_head_k, num_heads_k)
    return (cache_seqlens.new_empty((parts, runtime.METADATA_SIZE)),
            cache_seqlens.new_empty((cache_seqlens.shape[0] + 1,)))


_metadata_op = library.define("get_mla_metadata", "(Tensor cache_seqlens, int num_q_tokens_per_head_k, int num_heads_k) "
               "-> (Tensor, Tensor)", _metadata_eager, _metadata_fake)


# ---- flash_mla_with_kvcache ----------------------------------------------------------------

def flash_mla_with_kvcache(q: torch.Tensor, k_cache: torch.Tensor, block_table: torch.Tensor,
                           cache_seqlens: torch.Tensor, head_dim_v: int,
                           tile_scheduler_metadata: torch.Tensor | FlashMLASchedMeta,
                           num_splits: torch.Tensor | None = None, softmax_scale: float | None = None,
                           causal: bool = False, is_fp8_kvcache: bool = False, indices: torch.Tensor | None = None,
                           attn_sink: torch.Tensor | None = None, extra_k_cache: torch.Tensor | None = None,
                           extra_indices_in_kvcache: torch.Tensor | None = None,
                           topk_length: torch.Tensor | None = None,
                           extra_topk_length: torch.Tensor | None = None, *, descale_q: torch.Tensor | None = None,
                           descale_k: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Paged MLA decode (FlashMLA's API). Returns out (b, s_q, h_q, head_dim_v) in q's dtype (bf16
    for e4m3 q) and lse (b, h_q, s_q) float32 (natural log; +inf for rows that see no key).

    `tile_scheduler_metadata` is either the tensor pair's first half from get_mla_metadata(...)
    (with `num_splits` the second), or a FlashMLASchedMeta from get_mla_metadata() (`num_splits`
    None). An e4m3 q and cache take per-tensor descales `descale_q` / `descale_k` (float32 (1,) on
    q's device; None: 1.0), as SGLang passes them: see flash_mla_with_kvcache_fp8. A bf16 / fp16 q
    over an e4m3 cache (descale_k only) reads the cache de-quantized on chip, out in q's dtype. With
    `indices` this is FlashMLA's sparse (DSA) decode over its FP8 cache records (is_fp8_kvcache,
    topk_length, attn_sink: ops/sparse_decode.py); the extra_* KV cache raises FeatureNotAvailableError."""
    if indices is not None:  # sparse (DSA) decode
        if extra_k_cache is not None or extra_indices_in_kvcache is not None or extra_topk_length is not None:
            _reject_unavailable(False, None, None, extra_k_cache, extra_indices_in_kvcache, None, extra_topk_length)
        return sparse_decode.sparse_decode(q, k_cache, indices, head_dim_v, tile_scheduler_metadata, num_splits,
                                           softmax_scale, causal, is_fp8_kvcache, topk_length, attn_sink,
                                           descale_q, descale_k)
    if (is_fp8_kvcache or attn_sink is not None or extra_k_cache is not None
            or extra_indices_in_kvcache is not None or topk_length is not None or extra_topk_length is not None):
        _reject_unavailable(is_fp8_kvcache, indices, attn_sink, extra_k_cache, extra_indices_in_kvcache,
                            topk_length, extra_topk_length)
    if type(tile_scheduler_metadata) is FlashMLASchedMeta:
        tile_scheduler_metadata, num_splits = _schedule_of(tile_scheduler_metadata, num_splits, q, k_cache,
                                                           cache_seqlens, causal)
    if library.compiling():
        return _decode_op(q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata, num_splits,
                          softmax_scale, causal, descale_q, descale_k)
    return _decode_eager(q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata, num_splits,
                         softmax_scale, causal, descale_q, descale_k)


def flash_mla_with_kvcache_fp8(q: torch.Tensor, k_cache: torch.Tensor, block_table: torch.Tensor,
                               cache_seqlens: torch.Tensor, head_dim_v: int,
                               tile_scheduler_metadata: torch.Tensor | FlashMLASchedMeta,
                               num_splits: torch.Tensor | None = None, softmax_scale: float | None = None,
                               causal: bool = False, descale_q: torch.Tensor | None = None,
                               descale_k: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM's FP8 dense decode (`flash_mla_with_kvcache_fp8`): q (b, s_q, h_q, d) and k_cache
    (num_blocks, page, h_kv, d) float8_e4m3fn, quantized by the caller with per-tensor scales;
    `descale_q` / `descale_k` float32 (1,) on q's device, read by the kernel on the GPU (no host
    sync: capturable), None meaning 1.0. Computes softmax(softmax_scale * (q * descale_q) .
    (k * descale_k)) (v * descale_k), V the first head_dim_v columns of the cache. Returns out
    (b, s_q, h_q, head_dim_v) bfloat16 and lse (b, h_q, s_q) float32; shapes, schedules and limits
    as flash_mla_with_kvcache (Hopper only for now). A bf16 / fp16 q (descale_q None) is the accurate
    path: the cache is de-quantized on chip and multiplied in q's dtype; out in q's dtype."""
    if getattr(k_cache, "dtype", None) != _FP8:
        raise InvalidArgumentError("k_cache", "a torch.float8_e4m3fn cache (flash_mla_with_kvcache serves bf16 "
                                   "and fp16)", str(getattr(k_cache, "dtype", type(k_cache).__name__)))
    return flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata,
                                  num_splits, softmax_scale, causal, descale_q=descale_q, descale_k=descale_k)


def _reject_unavailable(is_fp8_kvcache, indices, attn_sink, extra_k_cache, extra_indices_in_kvcache,
                        topk_length, extra_topk_length) -> None:
    for name, value, feature in (("is_fp8_kvcache", is_fp8_kvcache or None, _FP8_RECORDS),
                                 ("indices", indices, "sparse attention (DSA)"),
                                 ("attn_sink", attn_sink, "attention sinks (sparse attention)"),
                                 ("extra_k_cache", extra_k_cache, "an extra KV cache (sparse attention)"),
                                 ("extra_indices_in_kvcache", extra_indices_in_kvcache,
                                  "an extra KV cache (sparse attention)"),
                                 ("topk_length", topk_length, "per-batch top-k lengths (sparse attention)"),
                                 ("extra_topk_length", extra_topk_length,
                                  "per-batch top-k lengths (sparse attention)")):
        if value is not None:
            raise FeatureNotAvailableError(name, feature)


def _schedule_of(sched: FlashMLASchedMeta, num_splits, q, k_cache, cache_seqlens,
                 causal) -> tuple[torch.Tensor, torch.Tensor]:
    """The schedule tensors of a FlashMLASchedMeta, computed (on the GPU) at its first call."""
    if num_splits is not None:
        raise InvalidArgumentError("num_splits", "None when tile_scheduler_metadata is a FlashMLASchedMeta",
                                   type(num_splits).__name__)
    try:  # the warm path: the same shapes as the last consistent call (every layer of a step)
        shapes = (q.shape, k_cache.shape, causal)
        if shapes == sched._checked and sched.tile_scheduler_metadata is not None:
            return sched.tile_scheduler_metadata, sched.num_splits
    except AttributeError:  # not tensors: checked below
        shapes = None
    for name, value in (("q", q), ("k_cache", k_cache)):
        if not isinstance(value, torch.Tensor) or value.dim() != 4:
            raise InvalidArgumentError(name, "a 4-dim torch.Tensor", repr(getattr(value, "shape", type(value))))
    config = SchedConfig(q.shape[0], q.shape[1], q.shape[2], k_cache.shape[1], k_cache.shape[2], bool(causal),
                         False, None, None, None)

    def compute():
        h_kv = k_cache.shape[2]
        if not 1 <= h_kv <= _MAX_H_KV or q.shape[2] % h_kv:
            raise InvalidArgumentError("k_cache", f"h_kv (dim 2) in [1, {_MAX_H_KV}] dividing h_q={q.shape[2]}",
                                       str(h_kv))
        return _metadata_tensors(cache_seqlens, q.shape[1] * q.shape[2] // h_kv, h_kv)
    return settle_schedule(sched, config, shapes, compute)


def _descale_form(descale):
    """What the checks look at of a descale (None, or its shape, dtype and device)."""
    return None if descale is None else (descale.shape, descale.dtype, descale.get_device())


def _signature(q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata, num_splits,
               descale_q=None, descale_k=None):
    """Everything _check_decode_args looks at except data pointers, as one hashable tuple: a call
    whose signature was validated before skips the checks (alignment is re-checked every call; the
    descales' pointers are read every call)."""
    return (q.shape, q.stride(), q.dtype, q.get_device(), k_cache.shape, k_cache.stride(), k_cache.dtype,
            k_cache.get_device(), block_table.shape, block_table.stride(), block_table.dtype,
            block_table.get_device(), cache_seqlens.shape, cache_seqlens.stride(), cache_seqlens.dtype,
            cache_seqlens.get_device(), tile_scheduler_metadata.shape, tile_scheduler_metadata.stride(),
            tile_scheduler_metadata.dtype, tile_scheduler_metadata.get_device(), num_splits.shape,
            num_splits.stride(), num_splits.dtype, num_splits.get_device(), head_dim_v,
            _descale_form(descale_q), _descale_form(descale_k),
            runtime.plan_env())  # MLA_JIT_ARCH / schedule are read live: another value, another plan


def _decode_eager(q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata, num_splits,
                  softmax_scale=None, causal=False, descale_q=None,
                  descale_k=None) -> tuple[torch.Tensor, torch.Tensor]:
    # (The defaults repeat the schema's: the dispatcher passes only the arguments given.)
    try:
        signature = _signature(q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata,
                               num_splits, descale_q, descale_k)
        plan = runtime.decode_plans.get(signature)
    except (AttributeError, TypeError):  # a non-tensor argument: the full checks name it
        plan = signature = None
    if plan is None:
        _check_decode_args(q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata,
                           num_splits, softmax_scale, descale_q, descale_k)
        if q.shape[0] == 0:
            return _decode_fake(q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata,
                                num_splits)
        if len(runtime.decode_plans) >= runtime.MAX_PLANS:  # ever-new shapes: keep the memo bounded
            runtime.decode_plans.clear()
        plan = runtime.decode_plans[signature] = runtime.DecodePlan(q, k_cache, block_table, head_dim_v,
                                                                    tile_scheduler_metadata.shape[0])
    q_ptr, k_ptr = q.data_ptr(), k_cache.data_ptr()
    if q_ptr % 16 or k_ptr % 16:
        raise InvalidArgumentError("q/k_cache", "16-byte aligned data pointers", f"{hex(q_ptr)}, {hex(k_ptr)}")
    scale = validate.softmax_scale(softmax_scale, plan.default_scale)
    return plan.run(q, q_ptr, k_cache, k_ptr, block_table, cache_seqlens, tile_scheduler_metadata, num_splits, scale,
                    causal, descale_q, descale_k)


def _decode_fake(q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata, num_splits,
                 softmax_scale=None, causal=False, descale_q=None,
                 descale_k=None) -> tuple[torch.Tensor, torch.Tensor]:
    b, s_q, h_q, _ = q.shape
    return (q.new_empty((b, s_q, h_q, head_dim_v), dtype=runtime.out_dtype(q.dtype)),
            q.new_empty((b, h_q, s_q), dtype=torch.float32))


_decode_op = library.define("flash_mla_with_kvcache",
               "(Tensor q, Tensor k_cache, Tensor block_table, Tensor cache_seqlens, int head_dim_v, "
               "Tensor tile_scheduler_metadata, Tensor num_splits, float? softmax_scale=None, bool causal=False, "
               "Tensor? descale_q=None, Tensor? descale_k=None) -> (Tensor, Tensor)", _decode_eager, _decode_fake)


# ---- argument checks (first call of a signature) --------------------------------------------

def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int32_vector(name: str, value, length: int | None, device=None) -> torch.Tensor:
    validate.tensor(name, value, dtypes=(torch.int32,), ndim=1, device=device, contiguous=True)
    if length is not None and value.shape[0] != length:
        raise InvalidArgumentError(name, f"shape ({length},)", f"shape {tuple(value.shape)}")
    return value


def _check_decode_args(q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata,
                       num_splits, softmax_scale, descale_q=None, descale_k=None) -> None:
    validate.tensor("q", q, dtypes=_Q_DTYPES, ndim=4, last_dim_contiguous=True)
    device = q.device
    # An e4m3 cache takes e4m3 q (FP8 products) or a 16-bit q (the cache de-quantized on chip).
    validate.tensor("k_cache", k_cache, dtypes=(q.dtype, _FP8), ndim=4, device=device, contiguous=True)
    _check_descales(q, k_cache, descale_q, descale_k)
    b, s_q, h_q, d = q.shape
    num_blocks, page_size, h_kv, d_k = k_cache.shape
    if d_k != d:
        raise InvalidArgumentError("k_cache", f"last dim {d} (q's head dim)", f"shape {tuple(k_cache.shape)}")
    if not _is_int(head_dim_v) or (d, head_dim_v) not in SUPPORTED_HEAD_DIMS:
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
    # Q rows are read with 16-byte vector loads (8 bf16 / fp16 elements, 16 e4m3).
    esize = q.element_size()
    if q.data_ptr() % 16 or any(q.stride(i) * esize % 16 for i in range(3)):
        raise InvalidArgumentError("q", "a 16-byte aligned base and strides that are multiples of 16 bytes",
                                   f"strides {q.stride()} of {esize}-byte elements")
    validate.aligned("k_cache", k_cache, 16)
    validate.tensor("block_table", block_table, dtypes=(torch.int32,), ndim=2, device=device,
                    last_dim_contiguous=True)
    if block_table.shape[0] != b:
        raise InvalidArgumentError("block_table", f"{b} rows (q's batch)", f"shape {tuple(block_table.shape)}")
    _int32_vector("cache_seqlens", cache_seqlens, b, device)
    validate.tensor("tile_scheduler_metadata", tile_scheduler_metadata, dtypes=(torch.int32,), ndim=2,
                    device=device, contiguous=True)
    if tile_scheduler_metadata.shape[1] != runtime.METADATA_SIZE or tile_scheduler_metadata.shape[0] < 1:
        raise InvalidArgumentError("tile_scheduler_metadata", f"shape (num_sm_parts, {runtime.METADATA_SIZE}) "
                                   "from get_mla_metadata", f"shape {tuple(tile_scheduler_metadata.shape)}")
    _int32_vector("num_splits", num_splits, b + 1, device)
    check_output_offsets(q.shape, tile_scheduler_metadata.shape[0], head_dim_v)
    validate.softmax_scale(softmax_scale, 1.0)


def _check_descales(q, k_cache, descale_q, descale_k) -> None:
    """Per-tensor descales scale FP8 tensors only (descale_q an e4m3 q, descale_k an e4m3 cache); the
    kernel reads each as one float32 on q's GPU."""
    for name, value, tensor in (("descale_q", descale_q, q), ("descale_k", descale_k, k_cache)):
        if value is None:
            continue
        if tensor.dtype != _FP8:
            raise InvalidArgumentError(name, f"None with a {tensor.dtype} {'q' if tensor is q else 'k_cache'} "
                                       "(descales scale FP8 tensors)", type(value).__name__)
        validate.tensor(name, value, dtypes=(torch.float32,), ndim=1, device=q.device)
        validate.shape(name, value, (1,))


def check_output_offsets(q_shape, num_sm_parts: int, head_dim_v: int) -> None:
    """The kernels index out and the split-KV partials (one slot per split: at most
    b + num_sm_parts) with 32-bit element offsets."""
    b, s_q, h_q = q_shape[0], q_shape[1], q_shape[2]
    if (b + num_sm_parts) * s_q * h_q * head_dim_v >= 2 ** 31:
        raise InvalidArgumentError("q", "(batch + num_sm_parts) * s_q * h_q * head_dim_v < 2^31",
                                   f"shape {tuple(q_shape)} with {num_sm_parts} sm parts")

