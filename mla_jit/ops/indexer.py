"""DeepSeek V3.2's lightning indexer with DeepGEMM's API: fp8_mqa_logits (prefill, keys ragged per
query row), get_paged_mqa_logits_metadata and fp8_paged_mqa_logits (decode, paged FP8 key cache),
as torch custom ops `mla_jit::fp8_mqa_logits`, `mla_jit::get_paged_mqa_logits_metadata` and
`mla_jit::fp8_paged_mqa_logits`.

    logits[i, j] = sum_h relu(q[i, h] . k[j]) * weights[i, h] * k_scale[j]

(k_scale is applied after the relu, as DeepGEMM does: quantization scales are >= 0.) The logits are
float32 views of buffers laid out as DeepGEMM's (rows 1024-byte aligned, room past the last key),
so engines pass the same strides to their top-k kernels.

This module validates arguments and asks the runtime (runtimes/indexer_plan.py) for a plan.
"""
from __future__ import annotations

import torch

from ..configs.indexer import INDEXER_HEAD_DIMS, INDEXER_HEADS, INDEXER_MAX_NEXT_N, INDEXER_PAGE_SIZES, LOGITS_N
from ..errors import InvalidArgumentError
from ..runtimes import indexer_plan as runtime
from . import library, validate

_FP8 = torch.float8_e4m3fn
_ROW_ALIGN = 256            # floats: DeepGEMM's 1024-byte row alignment
_PAST_KEYS = 256            # fp8_mqa_logits: columns kept past the last key (DeepGEMM's block_kv)
_MAX_INT = 2 ** 31 - 1


def _align(x, a):
    return (x + a - 1) // a * a


def _logits_stride(n: int, max_seqlen_k: int):
    """Row stride (floats) of fp8_mqa_logits' buffer: DeepGEMM's."""
    if max_seqlen_k > 0:
        return _align(_align(max_seqlen_k, _PAST_KEYS), _ROW_ALIGN)
    return _align(n + _PAST_KEYS, _ROW_ALIGN)


def _paged_stride(max_context_len: int):
    return _align(_align(max_context_len, _PAST_KEYS), _ROW_ALIGN)


def _unpack_q(q):
    """DeepGEMM's newer entry points take q as (values, scale factors); FP8 has no scale factors."""
    if isinstance(q, (tuple, list)):
        if len(q) != 2 or q[1] is not None:
            raise InvalidArgumentError("q", "a tensor, or (tensor, None) (e4m3 q has no scale factors)",
                                       f"a {type(q).__name__} of {len(q)}")
        return q[0]
    return q


def _int_arg(name: str, value, lo: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= _MAX_INT:
        raise InvalidArgumentError(name, f"an int in [{lo}, 2^31)", repr(value))
    return value


def _f32_rows(name: str, t: torch.Tensor, rows: int, cols: int, device) -> None:
    """A (rows, cols) float32 matrix that TMA can read: unit column stride, 16-byte aligned rows
    (its data pointer: _aligned)."""
    validate.tensor(name, t, dtypes=(torch.float32,), ndim=2, device=device)
    validate.shape(name, t, (rows, cols))
    if rows and (t.stride(1) != 1 or (t.stride(0) * 4) % 16):
        raise InvalidArgumentError(name, "unit column stride and 16-byte aligned rows", f"strides {t.stride()}")


def _aligned(*named: tuple[str, torch.Tensor]) -> None:
    """16-byte aligned data pointers (TMA) of the non-empty tensors."""
    for name, t in named:
        if t.numel() and t.data_ptr() % 16:
            raise InvalidArgumentError(name, "a 16-byte aligned data pointer", hex(t.data_ptr()))


# ---- fp8_mqa_logits ------------------------------------------------------------------------------

def fp8_mqa_logits(q, kv, weights: torch.Tensor, cu_seq_len_k_start: torch.Tensor, cu_seq_len_k_end: torch.Tensor,
                   clean_logits: bool = True, max_seqlen_k: int = 0) -> torch.Tensor:
    """Indexer logits of m query tokens against n keys (DeepGEMM's fp8_mqa_logits).

    q (m, H, D) float8_e4m3fn contiguous (or (q, None)), H in {8, 16, 32, 64}, D in {64, 128};
    kv = (k (n, D) e4m3 contiguous, k_scale (n,) float32 contiguous); weights (m, H) float32;
    cu_seq_len_k_start / _end int32 (m,): row i scores keys [ks[i], ke[i]) of k.
    Returns float32 (m, n), a view of a (align(m, 256 / H), align(n + 256, 256)) buffer; with
    clean_logits the columns outside [ks, ke) hold -inf, else they are unspecified. max_seqlen_k > 0
    returns the compressed (m, max_seqlen_k) form instead (column c is key ks[i] + c; needs
    clean_logits=False, and ke - ks <= max_seqlen_k)."""
    q = _unpack_q(q)
    if not isinstance(kv, (tuple, list)) or len(kv) != 2:
        raise InvalidArgumentError("kv", "a tuple (k, k_scale)", type(kv).__name__)
    k, k_scale = kv
    if library.compiling():
        return _logits_op(q, k, k_scale, weights, cu_seq_len_k_start, cu_seq_len_k_end, clean_logits, max_seqlen_k)
    return _logits_eager(q, k, k_scale, weights, cu_seq_len_k_start, cu_seq_len_k_end, clean_logits, max_seqlen_k)


def _logits_eager(q, k, k_scale, weights, ks, ke, clean_logits=True, max_seqlen_k=0):
    try:
        signature = ("logits", runtime.plan_env(), q.shape[1:], q.dtype, q.get_device(), k.dtype, k.shape[1:])
        plan = runtime.plans.get(signature)
    except (AttributeError, TypeError, IndexError):   # not tensors: the checks below name it
        plan = signature = None
    _check_logits(q, k, k_scale, weights, ks, ke, clean_logits, max_seqlen_k)
    if plan is None:
        plan = runtime.LogitsPlan(q.shape[1], q.shape[2], q.get_device())
        if signature is not None:
            if len(runtime.plans) >= runtime.MAX_PLANS:
                runtime.plans.clear()
            runtime.plans[signature] = plan
    m, n = q.shape[0], k.shape[0]
    cols = max_seqlen_k if max_seqlen_k > 0 else n
    buffer = torch.empty((_align(m, 2 * LOGITS_N // q.shape[1]), _logits_stride(n, max_seqlen_k)), dtype=torch.float32,
                         device=q.device)
    logits = buffer[:m, :cols]
    plan.run(q, k, k_scale, weights, ks, ke, logits, bool(clean_logits), max_seqlen_k)
    return logits


def _check_logits(q, k, k_scale, weights, ks, ke, clean_logits, max_seqlen_k) -> None:
    validate.tensor("q", q, dtypes=(_FP8,), ndim=3, contiguous=True)
    device = q.device
    m, h, d = q.shape
    if h not in INDEXER_HEADS:
        raise InvalidArgumentError("q", f"heads in {INDEXER_HEADS}", f"shape {tuple(q.shape)}")
    if d not in INDEXER_HEAD_DIMS:
        raise InvalidArgumentError("q", f"head dim in {INDEXER_HEAD_DIMS}", f"shape {tuple(q.shape)}")
    validate.tensor("kv[0]", k, dtypes=(_FP8,), ndim=2, device=device, contiguous=True)
    n = k.shape[0]
    validate.shape("kv[0]", k, (n, d))
    validate.tensor("kv[1]", k_scale, dtypes=(torch.float32,), ndim=1, device=device, contiguous=True)
    validate.shape("kv[1]", k_scale, (n,))
    _f32_rows("weights", weights, m, h, device)
    _aligned(("q", q), ("kv[0]", k), ("kv[1]", k_scale), ("weights", weights))
    for name, t in (("cu_seq_len_k_start", ks), ("cu_seq_len_k_end", ke)):
        validate.tensor(name, t, dtypes=(torch.int32,), ndim=1, device=device, contiguous=True)
        validate.shape(name, t, (m,))
    if not isinstance(clean_logits, bool):
        raise InvalidArgumentError("clean_logits", "a bool", type(clean_logits).__name__)
    _int_arg("max_seqlen_k", max_seqlen_k)
    if max_seqlen_k > 0 and clean_logits:
        raise InvalidArgumentError("clean_logits", "False with max_seqlen_k > 0 (the compressed form is not cleaned)",
                                   "True")
    if m * h > _MAX_INT or n > _MAX_INT - 2 * _PAST_KEYS:
        raise InvalidArgumentError("q" if m * h > _MAX_INT else "kv[0]", "fewer than 2^31 rows", f"{max(m * h, n)}")


def _logits_fake(q, k, k_scale, weights, ks, ke, clean_logits=True, max_seqlen_k=0):
    m, n = q.shape[0], k.shape[0]
    cols = max_seqlen_k if max_seqlen_k > 0 else n
    return q.new_empty_strided((m, cols), (_logits_stride(n, max_seqlen_k), 1), dtype=torch.float32)


_logits_defined = library.define(
    "fp8_mqa_logits", "(Tensor q, Tensor k, Tensor k_scale, Tensor weights, Tensor cu_seq_len_k_start, "
    "Tensor cu_seq_len_k_end, bool clean_logits=True, SymInt max_seqlen_k=0) -> Tensor",
    _logits_eager, _logits_fake)


def _logits_op(q, k, k_scale, weights, ks, ke, clean_logits, max_seqlen_k):
    return _logits_defined(q, k, k_scale, weights, ks, ke, clean_logits, max_seqlen_k)


# ---- get_paged_mqa_logits_metadata ----------------------------------------------------------------

def get_paged_mqa_logits_metadata(context_lens: torch.Tensor, block_kv: int, num_sms: int) -> torch.Tensor:
    """Work split of fp8_paged_mqa_logits over num_sms CTAs (DeepGEMM's API): int32 (num_sms + 1, 2).
    context_lens int32 (b,) or (b, next_n) as passed to fp8_paged_mqa_logits; block_kv its cache's page
    size. Computed on the GPU (no host sync; capturable in a CUDA graph); reuse it for every layer of
    a step."""
    if library.compiling():
        return _metadata_defined(context_lens, block_kv, num_sms)
    return _metadata_eager(context_lens, block_kv, num_sms)


def _metadata_eager(context_lens, block_kv, num_sms):
    validate.tensor("context_lens", context_lens, dtypes=(torch.int32,), contiguous=True)
    if context_lens.dim() not in (1, 2):
        raise InvalidArgumentError("context_lens", "shape (b,) or (b, next_n)", f"shape {tuple(context_lens.shape)}")
    if block_kv not in INDEXER_PAGE_SIZES:
        raise InvalidArgumentError("block_kv", f"one of {INDEXER_PAGE_SIZES}", repr(block_kv))
    _int_arg("num_sms", num_sms, 1)
    device_index = context_lens.get_device()
    key = ("metadata", runtime.plan_env(), device_index)
    plan = runtime.plans.get(key)
    if plan is None:
        plan = runtime.plans[key] = runtime.MetadataPlan(device_index)
    schedule = torch.empty((num_sms + 1, 2), dtype=torch.int32, device=context_lens.device)
    plan.run(context_lens, schedule)
    return schedule


def _metadata_fake(context_lens, block_kv, num_sms):
    return context_lens.new_empty((num_sms + 1, 2), dtype=torch.int32)


_metadata_defined = library.define(
    "get_paged_mqa_logits_metadata", "(Tensor context_lens, int block_kv, int num_sms) -> Tensor",
    _metadata_eager, _metadata_fake)


# ---- fp8_paged_mqa_logits --------------------------------------------------------------------------

def fp8_paged_mqa_logits(q, kv_cache: torch.Tensor, weights: torch.Tensor, context_lens: torch.Tensor,
                         block_table: torch.Tensor, schedule_meta: torch.Tensor, max_context_len: int,
                         clean_logits: bool = False) -> torch.Tensor:
    """Indexer logits of b x next_n query tokens against their paged FP8 key cache (DeepGEMM's
    fp8_paged_mqa_logits).

    q (b, next_n, H, D) e4m3 contiguous (or (q, None)), next_n 1 .. 4; kv_cache uint8 (blocks,
    page, 1, D + 4), each page holding page x D e4m3 values then page float32 scales (stride(0) may
    exceed a page: a slab shared by layers; a multiple of 16 bytes); page 32, 64 or 128;
    weights (b * next_n, H) float32; context_lens int32 (b,) (row j of entry b sees keys
    <= len[b] - next_n + j) or (b, next_n) (row (b, j) sees keys < len[b, j]); block_table int32
    (b, max_blocks); schedule_meta from get_paged_mqa_logits_metadata on the same context_lens.
    Returns float32 (b * next_n, max_context_len), a view of a buffer with rows of
    align(max_context_len, 256) floats: -inf for keys a row does not see within its entry's 64-key
    tiles, and (clean_logits) in every column past them."""
    q = _unpack_q(q)
    if library.compiling():
        return _paged_defined(q, kv_cache, weights, context_lens, block_table, schedule_meta, max_context_len,
                              clean_logits)
    return _paged_eager(q, kv_cache, weights, context_lens, block_table, schedule_meta, max_context_len,
                        clean_logits)


def _paged_signature(q, kv_cache, weights, context_lens, block_table, schedule_meta) -> tuple:
    """What _check_paged_layout looks at: shapes, strides, dtypes and devices (not the pointers)."""
    return ("paged", runtime.plan_env(), *((t.shape, t.stride(), t.dtype, t.get_device()) for t in
                                         (q, kv_cache, weights, context_lens, block_table, schedule_meta)))


def _paged_eager(q, kv_cache, weights, context_lens, block_table, schedule_meta, max_context_len,
                 clean_logits=False):
    # A decode-step op: a layout seen before skips its checks (a signature lookup), as decode's does.
    try:
        signature = _paged_signature(q, kv_cache, weights, context_lens, block_table, schedule_meta)
        call = runtime.plans.get(signature)
    except (AttributeError, TypeError):   # not tensors: the checks below name it
        call = signature = None
    if call is None:
        _check_paged_layout(q, kv_cache, weights, context_lens, block_table, schedule_meta)
    _int_arg("max_context_len", max_context_len)
    if not isinstance(clean_logits, bool):
        raise InvalidArgumentError("clean_logits", "a bool", type(clean_logits).__name__)
    q_ptr, w_ptr, kv_ptr = q.data_ptr(), weights.data_ptr(), kv_cache.data_ptr()
    if (q_ptr | w_ptr | kv_ptr) % 16:   # (an empty tensor's pointer does not count: _aligned names the one that does)
        _aligned(("q", q), ("kv_cache", kv_cache), ("weights", weights))
    if call is None:
        _, next_n, h, d = q.shape
        if len(runtime.plans) >= runtime.MAX_PLANS:
            runtime.plans.clear()
        kernel = ("paged", runtime.plan_env(), h, d, next_n, kv_cache.shape[1], q.get_device())
        plan = runtime.plans.get(kernel) or runtime.PagedPlan(h, d, next_n, kv_cache.shape[1], q.get_device())
        runtime.plans[kernel] = plan   # (batch sizes vary: each layout's call shares the kernel's one plan)
        call = runtime.PagedCall(plan, q, kv_cache, weights, context_lens, block_table, schedule_meta)
        if signature is not None:
            runtime.plans[signature] = call
    row_stride = _paged_stride(max_context_len)
    # The view buffer[:, :max_context_len], made by as_strided (a third of the slice's host time).
    logits = torch.empty((call.rows, row_stride), dtype=torch.float32, device=q.device).as_strided(
        (call.rows, max_context_len), (row_stride, 1))
    call.run(q, weights, kv_cache, q_ptr, w_ptr, kv_ptr, context_lens.data_ptr(), block_table.data_ptr(),
             schedule_meta.data_ptr(), logits, row_stride, max_context_len, clean_logits)
    return logits


def _check_paged_layout(q, kv_cache, weights, context_lens, block_table, schedule_meta) -> None:
    """First call of a layout: everything but the pointers and the scalar arguments."""
    validate.tensor("q", q, dtypes=(_FP8,), ndim=4, contiguous=True)
    device = q.device
    b, next_n, h, d = q.shape
    if h not in INDEXER_HEADS:
        raise InvalidArgumentError("q", f"heads in {INDEXER_HEADS}", f"shape {tuple(q.shape)}")
    if d not in INDEXER_HEAD_DIMS:
        raise InvalidArgumentError("q", f"head dim in {INDEXER_HEAD_DIMS}", f"shape {tuple(q.shape)}")
    if not 1 <= next_n <= INDEXER_MAX_NEXT_N:
        raise InvalidArgumentError("q", f"next_n (dim 1) in 1..{INDEXER_MAX_NEXT_N}", f"shape {tuple(q.shape)}")
    validate.tensor("kv_cache", kv_cache, dtypes=(torch.uint8,), ndim=4, device=device)
    blocks, page, heads_kv, row = kv_cache.shape
    if page not in INDEXER_PAGE_SIZES or heads_kv != 1 or row != d + 4:
        raise InvalidArgumentError("kv_cache", f"shape (blocks, page in {INDEXER_PAGE_SIZES}, 1, {d + 4})",
                                   f"shape {tuple(kv_cache.shape)}")
    if kv_cache.stride(1) != d + 4 or kv_cache.stride(3) != 1:
        raise InvalidArgumentError("kv_cache", f"strides (*, {d + 4}, *, 1) (pages of values then scales)",
                                   f"strides {kv_cache.stride()}")
    if blocks and (kv_cache.stride(0) < page * (d + 4) or kv_cache.stride(0) % 16):
        raise InvalidArgumentError("kv_cache", f"a page stride >= {page * (d + 4)} bytes, a multiple of 16",
                                   f"stride(0) {kv_cache.stride(0)}")
    _f32_rows("weights", weights, b * next_n, h, device)
    validate.tensor("context_lens", context_lens, dtypes=(torch.int32,), device=device, contiguous=True)
    if tuple(context_lens.shape) not in ((b,), (b, next_n)):
        raise InvalidArgumentError("context_lens", f"shape ({b},) or ({b}, {next_n})",
                                   f"shape {tuple(context_lens.shape)}")
    validate.tensor("block_table", block_table, dtypes=(torch.int32,), ndim=2, device=device)
    if block_table.shape[0] != b or (block_table.numel() and block_table.stride(1) != 1):
        raise InvalidArgumentError("block_table", f"shape ({b}, max_blocks) with unit column stride",
                                   f"shape {tuple(block_table.shape)}, strides {block_table.stride()}")
    validate.tensor("schedule_meta", schedule_meta, dtypes=(torch.int32,), ndim=2, device=device, contiguous=True)
    if schedule_meta.shape[0] < 2 or schedule_meta.shape[1] != 2:
        raise InvalidArgumentError("schedule_meta", "shape (num_sms + 1, 2) from get_paged_mqa_logits_metadata",
                                   f"shape {tuple(schedule_meta.shape)}")


def _paged_fake(q, kv_cache, weights, context_lens, block_table, schedule_meta, max_context_len, clean_logits=False):
    rows = q.shape[0] * q.shape[1]
    return q.new_empty_strided((rows, max_context_len), (_paged_stride(max_context_len), 1), dtype=torch.float32)


_paged_defined = library.define(
    "fp8_paged_mqa_logits", "(Tensor q, Tensor kv_cache, Tensor weights, Tensor context_lens, Tensor block_table, "
    "Tensor schedule_meta, SymInt max_context_len, bool clean_logits=False) -> Tensor",
    _paged_eager, _paged_fake)
