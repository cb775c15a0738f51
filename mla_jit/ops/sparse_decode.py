"""FlashMLA's sparse (DSA) decode: flash_mla_with_kvcache(..., is_fp8_kvcache=True, indices=...) over
its V3.2 FP8 cache records, for any head count from 1 to 128, registered as the torch custom ops
`mla_jit::sparse_mla_decode` and `mla_jit::get_sparse_mla_metadata`.

Each query token (b, s) attends to the cache rows its indices name (page * page_size + offset; -1 or
past the cache: skipped, never read), only the first topk_length[b] of them where topk_length is
given; attn_sink (h_q,) scales out by exp(lse) / (exp(lse) + exp(sink)). block_table and
cache_seqlens are not used. The schedule (FlashMLASchedMeta, or get_mla_metadata's tensors with topk)
cuts the b * s_q query tokens, topk keys each, into one wave of split-KV pieces.
"""
from __future__ import annotations

import torch

from ..configs.decode import SUPPORTED_PAGE_SIZES
from ..configs.sparse import HEAD_DIM, HEAD_DIM_V, MAX_TOPK, RECORD_BYTES
from ..errors import FeatureNotAvailableError, InvalidArgumentError
from ..runtimes import decode_plan, sparse_decode_plan as runtime
from . import library, validate
from .schedule import FlashMLASchedMeta, SchedConfig, settle_schedule

_MAX_H_Q = 128
# Cache dtypes FlashMLA accepts for its records (one byte an element; the kernel reads bytes).
_RECORD_DTYPES = (torch.float8_e4m3fn, torch.int8, torch.uint8)


# ---- schedule ----------------------------------------------------------------------------------

def metadata_tensors(cache_seqlens, num_q_tokens_per_head_k, num_heads_k, num_heads_q, is_fp8_kvcache,
                     topk) -> tuple[torch.Tensor, torch.Tensor]:
    """get_mla_metadata(cache_seqlens, s_q * h_q, 1, h_q, True, topk): the sparse schedule of
    b = cache_seqlens.shape[0] sequences (cache_seqlens' values are not read)."""
    validate.tensor("cache_seqlens", cache_seqlens, dtypes=(torch.int32,), ndim=1)
    if not is_fp8_kvcache:
        raise FeatureNotAvailableError("is_fp8_kvcache", "a sparse decode over a bf16 cache (FlashMLA's sparse "
                                       "decode reads its FP8 records: is_fp8_kvcache=True)")
    if num_heads_k != 1:
        raise InvalidArgumentError("num_heads_k", "1 (sparse decode)", repr(num_heads_k))
    if not _is_int(num_heads_q) or not 1 <= num_heads_q <= _MAX_H_Q:
        raise InvalidArgumentError("num_heads_q", f"an int in [1, {_MAX_H_Q}] (needed with topk)", repr(num_heads_q))
    if not _is_int(num_q_tokens_per_head_k) or num_q_tokens_per_head_k < 1 or num_q_tokens_per_head_k % num_heads_q:
        raise InvalidArgumentError("num_q_tokens_per_head_k", f"s_q * num_heads_q ({num_heads_q})",
                                   repr(num_q_tokens_per_head_k))
    _check_topk(topk)
    rows = cache_seqlens.shape[0] * (num_q_tokens_per_head_k // num_heads_q)
    if library.compiling():
        return _metadata_op(cache_seqlens, rows, topk, num_heads_q)
    return _metadata_eager(cache_seqlens, rows, topk, num_heads_q)


def _metadata_eager(like: torch.Tensor, rows: int, topk: int, h_q: int) -> tuple[torch.Tensor, torch.Tensor]:
    key = (like.get_device(), rows, topk, h_q, decode_plan.plan_env())
    plan = runtime.metadata_plans.get(key)
    if plan is None:
        if len(runtime.metadata_plans) >= runtime.MAX_PLANS:
            runtime.metadata_plans.clear()
        plan = runtime.metadata_plans[key] = runtime.SparseMetadataPlan(like.get_device(), rows, topk, h_q)
    return plan.run(like)


def _metadata_fake(like: torch.Tensor, rows: int, topk: int, h_q: int) -> tuple[torch.Tensor, torch.Tensor]:
    parts = runtime.sm_parts_for(like.device.index or 0, h_q)
    return like.new_empty((parts, decode_plan.METADATA_SIZE), dtype=torch.int32), like.new_empty(
        (rows + 1,), dtype=torch.int32)


_metadata_op = library.define("get_sparse_mla_metadata", "(Tensor like, int rows, int topk, int h_q) -> (Tensor, Tensor)",
                              _metadata_eager, _metadata_fake)


def _schedule_of(sched: FlashMLASchedMeta, num_splits, q, k_cache, indices) -> tuple[torch.Tensor, torch.Tensor]:
    if num_splits is not None:
        raise InvalidArgumentError("num_splits", "None when tile_scheduler_metadata is a FlashMLASchedMeta",
                                   type(num_splits).__name__)
    shapes = (q.shape, k_cache.shape, indices.shape)
    if shapes == sched._checked and sched.tile_scheduler_metadata is not None:  # every layer of a step
        return sched.tile_scheduler_metadata, sched.num_splits
    config = SchedConfig(q.shape[0], q.shape[1], q.shape[2], k_cache.shape[1], k_cache.shape[2], False, True,
                         indices.shape[-1], None, None)

    def compute():
        _check_topk(indices.shape[-1])
        if not 1 <= q.shape[2] <= _MAX_H_Q:
            raise InvalidArgumentError("q", f"h_q (dim 2) in [1, {_MAX_H_Q}]", str(q.shape[2]))
        rows, topk, h_q = q.shape[0] * q.shape[1], indices.shape[-1], q.shape[2]
        metadata = _metadata_op if library.compiling() else _metadata_eager
        return metadata(indices, rows, topk, h_q)
    return settle_schedule(sched, config, shapes, compute)


# ---- the op ------------------------------------------------------------------------------------

def sparse_decode(q, k_cache, indices, head_dim_v, tile_scheduler_metadata, num_splits, softmax_scale, causal,
                  is_fp8_kvcache, topk_length, attn_sink, descale_q, descale_k) -> tuple[torch.Tensor, torch.Tensor]:
    """flash_mla_with_kvcache with indices (see the module docstring). Returns out (b, s_q, h_q, 512)
    bf16 and lse (b, h_q, s_q) float32 (natural log, without the sink; +inf where no key is valid)."""
    if causal:
        raise InvalidArgumentError("causal", "False with indices (sparse decode)", repr(causal))
    if not is_fp8_kvcache:
        raise FeatureNotAvailableError("is_fp8_kvcache", "a sparse decode over a bf16 cache (FlashMLA's sparse "
                                       "decode reads its FP8 records: is_fp8_kvcache=True)")
    for name, value in (("descale_q", descale_q), ("descale_k", descale_k)):
        if value is not None:
            raise InvalidArgumentError(name, "None with indices (the FP8 records carry their own scales)",
                                       type(value).__name__)
    for name, value in (("q", q), ("k_cache", k_cache), ("indices", indices)):
        if not isinstance(value, torch.Tensor) or value.dim() not in (3, 4):
            raise InvalidArgumentError(name, "a torch.Tensor of 3 or 4 dims", repr(getattr(value, "shape", value)))
    if type(tile_scheduler_metadata) is FlashMLASchedMeta:
        tile_scheduler_metadata, num_splits = _schedule_of(tile_scheduler_metadata, num_splits, q, k_cache, indices)
    if library.compiling():
        return _sparse_op(q, k_cache, indices, tile_scheduler_metadata, num_splits, head_dim_v, softmax_scale,
                          topk_length, attn_sink)
    return _sparse_eager(q, k_cache, indices, tile_scheduler_metadata, num_splits, head_dim_v, softmax_scale,
                         topk_length, attn_sink)


def _form(t):
    return None if t is None else (t.shape, t.stride(), t.dtype, t.get_device())


def _sparse_eager(q, k_cache, indices, tile_scheduler_metadata, num_splits, head_dim_v, softmax_scale=None,
                  topk_length=None, attn_sink=None) -> tuple[torch.Tensor, torch.Tensor]:
    try:
        signature = (_form(q), _form(k_cache), _form(indices), _form(tile_scheduler_metadata), _form(num_splits),
                     head_dim_v, _form(topk_length), _form(attn_sink), decode_plan.plan_env())
        plan = runtime.decode_plans.get(signature)
    except (AttributeError, TypeError):  # a non-tensor argument: the full checks name it
        plan = signature = None
    if plan is None:
        _check_args(q, k_cache, indices, tile_scheduler_metadata, num_splits, head_dim_v, topk_length, attn_sink)
        if q.shape[0] * q.shape[1] == 0:
            return _sparse_fake(q, k_cache, indices, tile_scheduler_metadata, num_splits, head_dim_v)
        if len(runtime.decode_plans) >= runtime.MAX_PLANS:
            runtime.decode_plans.clear()
        plan = runtime.decode_plans[signature] = runtime.SparseDecodePlan(q, k_cache, indices,
                                                                          tile_scheduler_metadata.shape[0])
    if q.data_ptr() % 16 or k_cache.data_ptr() % 16:
        raise InvalidArgumentError("q/k_cache", "16-byte aligned data pointers",
                                   f"{hex(q.data_ptr())}, {hex(k_cache.data_ptr())}")
    scale = validate.softmax_scale(softmax_scale, plan.default_scale)
    return plan.run(q, k_cache, indices, tile_scheduler_metadata, num_splits, scale, topk_length, attn_sink)


def _sparse_fake(q, k_cache, indices, tile_scheduler_metadata, num_splits, head_dim_v, softmax_scale=None,
                 topk_length=None, attn_sink=None) -> tuple[torch.Tensor, torch.Tensor]:
    b, s_q, h_q = q.shape[:3]
    return q.new_empty((b, s_q, h_q, head_dim_v)), q.new_empty((b, h_q, s_q), dtype=torch.float32)


_sparse_op = library.define(
    "sparse_mla_decode", "(Tensor q, Tensor k_cache, Tensor indices, Tensor tile_scheduler_metadata, Tensor num_splits, "
    "int head_dim_v, float? softmax_scale=None, Tensor? topk_length=None, Tensor? attn_sink=None) -> (Tensor, Tensor)",
    _sparse_eager, _sparse_fake)


# ---- argument checks (first call of a signature) ------------------------------------------------

def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_topk(topk) -> None:
    if not _is_int(topk) or not 1 <= topk <= MAX_TOPK:
        raise InvalidArgumentError("topk / indices.shape[-1]", f"an int in [1, {MAX_TOPK}]", repr(topk))


def check_records(name: str, cache, device: torch.device) -> None:
    """A cache of FlashMLA's FP8 records: (num_blocks, page_size, 1, 656) of a one-byte dtype, records
    contiguous, pages 16-byte aligned (the sparse decode's k_cache, the sparse prefill's kv)."""
    validate.tensor(name, cache, dtypes=_RECORD_DTYPES, ndim=4, device=device)
    _, page_size, h_kv, rec = cache.shape
    if h_kv != 1 or rec != RECORD_BYTES:
        raise InvalidArgumentError(name, f"shape (num_blocks, page_size, 1, {RECORD_BYTES}) of FP8 records",
                                   f"shape {tuple(cache.shape)}")
    if page_size not in SUPPORTED_PAGE_SIZES:
        raise InvalidArgumentError(name, f"page size (dim 1) in {SUPPORTED_PAGE_SIZES}", str(page_size))
    if cache.stride(3) != 1 or cache.stride(1) != RECORD_BYTES or cache.stride(0) % 16:
        raise InvalidArgumentError(name, f"records of {RECORD_BYTES} contiguous bytes (stride(1) == "
                                   f"{RECORD_BYTES}) in pages 16-byte aligned", f"strides {cache.stride()}")


def _check_args(q, k_cache, indices, tile_scheduler_metadata, num_splits, head_dim_v, topk_length, attn_sink) -> None:
    validate.tensor("q", q, dtypes=(torch.bfloat16,), ndim=4, last_dim_contiguous=True)
    device = q.device
    b, s_q, h_q, d = q.shape
    if d != HEAD_DIM:
        raise InvalidArgumentError("q", f"head dim {HEAD_DIM} (DeepSeek V3.2's sparse decode)", f"shape {tuple(q.shape)}")
    if head_dim_v != HEAD_DIM_V:
        raise InvalidArgumentError("head_dim_v", str(HEAD_DIM_V), repr(head_dim_v))
    if not 1 <= h_q <= _MAX_H_Q:
        raise InvalidArgumentError("q", f"h_q (dim 2) in [1, {_MAX_H_Q}]", str(h_q))
    # The kernels see (b, s_q) as one batch of b * s_q rows; 16-byte vector loads of q rows.
    if s_q > 1 and q.stride(0) != s_q * q.stride(1):
        raise InvalidArgumentError("q", "dims 0 and 1 that flatten (stride(0) == s_q * stride(1))",
                                   f"strides {q.stride()}")
    if q.data_ptr() % 16 or any(q.stride(i) * 2 % 16 for i in range(3)):
        raise InvalidArgumentError("q", "a 16-byte aligned base and strides that are multiples of 16 bytes",
                                   f"strides {q.stride()}")
    check_records("k_cache", k_cache, device)
    num_blocks, page_size = k_cache.shape[:2]
    validate.aligned("k_cache", k_cache, 16)
    if num_blocks * page_size >= 2 ** 31:
        raise InvalidArgumentError("k_cache", "fewer than 2^31 tokens", str(num_blocks * page_size))
    validate.tensor("indices", indices, dtypes=(torch.int32,), ndim=3, device=device, last_dim_contiguous=True)
    if indices.shape[:2] != (b, s_q):
        raise InvalidArgumentError("indices", f"shape ({b}, {s_q}, topk) (q's batch and s_q)",
                                   f"shape {tuple(indices.shape)}")
    topk = indices.shape[2]
    _check_topk(topk)
    if s_q > 1 and indices.stride(0) != s_q * indices.stride(1):
        raise InvalidArgumentError("indices", "dims 0 and 1 that flatten (stride(0) == s_q * stride(1))",
                                   f"strides {indices.stride()}")
    if topk_length is not None:
        validate.tensor("topk_length", topk_length, dtypes=(torch.int32,), ndim=1, device=device, contiguous=True)
        validate.shape("topk_length", topk_length, (b,))
    if attn_sink is not None:
        validate.tensor("attn_sink", attn_sink, dtypes=(torch.float32,), ndim=1, device=device, contiguous=True)
        validate.shape("attn_sink", attn_sink, (h_q,))
    validate.tensor("tile_scheduler_metadata", tile_scheduler_metadata, dtypes=(torch.int32,), ndim=2,
                    device=device, contiguous=True)
    if tile_scheduler_metadata.shape[1] != decode_plan.METADATA_SIZE or tile_scheduler_metadata.shape[0] < 1:
        raise InvalidArgumentError("tile_scheduler_metadata", f"shape (num_sm_parts, {decode_plan.METADATA_SIZE}) "
                                   "from get_mla_metadata", f"shape {tuple(tile_scheduler_metadata.shape)}")
    validate.tensor("num_splits", num_splits, dtypes=(torch.int32,), ndim=1, device=device, contiguous=True)
    validate.shape("num_splits", num_splits, (b * s_q + 1,))
    parts = tile_scheduler_metadata.shape[0]
    if (b * s_q + parts) * h_q * HEAD_DIM_V >= 2 ** 31 or b * s_q * topk >= 2 ** 31:
        raise InvalidArgumentError("q / indices", "(b * s_q + num_sm_parts) * h_q * 512 and b * s_q * topk "
                                   "below 2^31", f"shapes {tuple(q.shape)}, {tuple(indices.shape)}")
