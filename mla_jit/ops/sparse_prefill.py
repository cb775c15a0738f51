"""FlashMLA's sparse (DSA) prefill: flash_mla_sparse_fwd, for any head count from 1 to 128, over bf16
kv rows (FlashMLA's input) or straight over the FP8 cache of 656-byte records (no up-converted copy),
registered as the torch custom ops `mla_jit::flash_mla_sparse_fwd` and (with `out=`)
`mla_jit::flash_mla_sparse_fwd_out`.

Query token i (of s_q, no batch dim: requests are flattened and their offsets encoded in the indices)
attends with its h_q heads to the kv rows indices[i, 0, :topk_length[i]] names (-1 or >= the number of
rows: skipped, never read). Returns out (s_q, h_q, 512) bf16, max_logits and lse (s_q, h_q) float32:
the largest scaled logit (-inf where no key is valid) and the natural log-sum-exp (+inf there), as
FlashMLA's since 2026-01; attn_sink (h_q,) scales out by exp(lse) / (exp(lse) + exp(sink)).
"""
from __future__ import annotations

import math

import torch

from ..configs.sparse import BF16_ROWS, FP8_RECORDS, HEAD_DIM, HEAD_DIM_V, MAX_TOPK, PREFILL_HEAD_DIMS, RECORD_BYTES
from ..errors import InvalidArgumentError
from ..runtimes import sparse_prefill_plan as runtime
from . import library, sparse_decode, validate

_MAX_H_Q = 128


def flash_mla_sparse_fwd(q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor, sm_scale: float, d_v: int = 512,
                         attn_sink: torch.Tensor | None = None, topk_length: torch.Tensor | None = None,
                         out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sparse attention of s_q query tokens over their selected kv rows (see the module docstring).

    q (s_q, h_q, d_qk) bf16, d_qk 576 or 512; kv (s_kv, 1, d_qk) bf16, or (num_blocks, page_size, 1,
    656) FP8 records (d_qk 576; indices then name page * page_size + offset); indices (s_q, 1, topk)
    int32; topk_length (s_q,) int32; attn_sink (h_q,) float32; out (s_q, h_q, 512) bf16 contiguous.
    Returns (out, max_logits, lse)."""
    if library.compiling():
        if out is None:
            return _functional_op(q, kv, indices, sm_scale, d_v, attn_sink, topk_length)
        max_logits, lse = _out_op(q, kv, indices, out, sm_scale, d_v, attn_sink, topk_length)
        return out, max_logits, lse
    return _eager(q, kv, indices, sm_scale, d_v, attn_sink, topk_length, out)


def _form(t):
    return None if t is None else (t.shape[1:], t.stride(), t.dtype, t.get_device())


def _eager(q, kv, indices, sm_scale, d_v=512, attn_sink=None, topk_length=None, out=None):
    try:  # the layout minus the token counts (they change every call) and the data pointers
        signature = (_form(q), _form(kv), _form(indices), d_v, _form(attn_sink), topk_length is None,
                     runtime.plan_env())
        plan = runtime.plans.get(signature)
    except (AttributeError, TypeError, IndexError):  # a non-tensor argument: the full checks name it
        plan = signature = None
    if plan is None:
        kv_format = _check_layout(q, kv, indices, d_v, attn_sink)
        plan = runtime.SparsePrefillPlan(q, kv, indices, kv_format)
        if signature is not None:
            if len(runtime.plans) >= runtime.MAX_PLANS:
                runtime.plans.clear()
            runtime.plans[signature] = plan
    _check_call(q, kv, indices, sm_scale, topk_length, out, plan)
    s_q, h_q = q.shape[:2]
    if out is None:
        out = q.new_empty((s_q, h_q, HEAD_DIM_V))
    max_logits = q.new_empty((s_q, h_q), dtype=torch.float32)
    lse = q.new_empty((s_q, h_q), dtype=torch.float32)
    plan.run(q, kv, indices, float(sm_scale), topk_length, attn_sink, out, max_logits, lse)
    return out, max_logits, lse


def _check_layout(q, kv, indices, d_v, attn_sink) -> str:
    """First call of a layout: everything but the token counts, the call's tensors and the data
    pointers. Returns the kv format (FP8_RECORDS or BF16_ROWS)."""
    validate.tensor("q", q, dtypes=(torch.bfloat16,), ndim=3, last_dim_contiguous=True)
    device = q.device
    _, h_q, d = q.shape
    if d not in PREFILL_HEAD_DIMS:
        raise InvalidArgumentError("q", f"head dim (dim 2) in {PREFILL_HEAD_DIMS}", f"shape {tuple(q.shape)}")
    if not 1 <= h_q <= _MAX_H_Q:
        raise InvalidArgumentError("q", f"h_q (dim 1) in [1, {_MAX_H_Q}]", str(h_q))
    if any(q.stride(i) * 2 % 16 for i in range(2)):
        raise InvalidArgumentError("q", "token and head strides that are multiples of 16 bytes", f"strides {q.stride()}")
    if d_v != HEAD_DIM_V:
        raise InvalidArgumentError("d_v", str(HEAD_DIM_V), repr(d_v))
    if isinstance(kv, torch.Tensor) and kv.dim() == 4:
        kv_format = FP8_RECORDS
        sparse_decode.check_records("kv", kv, device)
        if d != HEAD_DIM:
            raise InvalidArgumentError("kv", f"FP8 records under a q of head dim {HEAD_DIM}", f"q head dim {d}")
    else:
        kv_format = BF16_ROWS
        validate.tensor("kv", kv, dtypes=(torch.bfloat16,), ndim=3, device=device, last_dim_contiguous=True)
        if kv.shape[1:] != (1, d):
            raise InvalidArgumentError("kv", f"shape (s_kv, 1, {d}) (q's head dim), or FP8 records (num_blocks, "
                                       f"page_size, 1, {RECORD_BYTES})", f"shape {tuple(kv.shape)}")
        if kv.stride(0) * 2 % 16:
            raise InvalidArgumentError("kv", "a row stride that is a multiple of 16 bytes", f"strides {kv.stride()}")
    validate.tensor("indices", indices, dtypes=(torch.int32,), ndim=3, device=device, last_dim_contiguous=True)
    if indices.shape[1] != 1:
        raise InvalidArgumentError("indices", "shape (s_q, 1, topk)", f"shape {tuple(indices.shape)}")
    if not 1 <= indices.shape[2] <= MAX_TOPK:
        raise InvalidArgumentError("indices", f"topk (dim 2) in [1, {MAX_TOPK}]", f"shape {tuple(indices.shape)}")
    if attn_sink is not None:
        validate.tensor("attn_sink", attn_sink, dtypes=(torch.float32,), ndim=1, device=device, contiguous=True)
        validate.shape("attn_sink", attn_sink, (h_q,))
    return kv_format


def _check_call(q, kv, indices, sm_scale, topk_length, out, plan) -> None:
    """Per call: token counts, sizes the kernels index with 32 bits, alignment, scale and `out`."""
    s_q, h_q = q.shape[:2]
    if indices.shape[0] != s_q:
        raise InvalidArgumentError("indices", f"shape ({s_q}, 1, topk) (q's s_q)", f"shape {tuple(indices.shape)}")
    rows = kv.shape[0] * (kv.shape[1] if plan.kv_format == FP8_RECORDS else 1)
    if rows >= 2 ** 31 or (s_q + plan.parts) * h_q * HEAD_DIM_V >= 2 ** 31:
        raise InvalidArgumentError("q / kv", "fewer than 2^31 kv rows and (s_q + num_sm_parts) * h_q * 512 below "
                                   "2^31", f"shapes {tuple(q.shape)}, {tuple(kv.shape)}")
    for name, t in (("q", q), ("kv", kv)):
        validate.aligned(name, t, 16)
    if isinstance(sm_scale, bool) or not isinstance(sm_scale, (float, int)) or not math.isfinite(sm_scale):
        raise InvalidArgumentError("sm_scale", "a finite float", repr(sm_scale))
    if topk_length is not None:
        validate.tensor("topk_length", topk_length, dtypes=(torch.int32,), ndim=1, device=q.device, contiguous=True)
        validate.shape("topk_length", topk_length, (s_q,))
    if out is not None:
        validate.tensor("out", out, dtypes=(torch.bfloat16,), ndim=3, device=q.device, contiguous=True)
        validate.shape("out", out, (s_q, h_q, HEAD_DIM_V))
        validate.aligned("out", out, 16)
        for name, t in (("q", q), ("kv", kv), ("indices", indices)):
            if validate.overlaps(out, t):
                raise InvalidArgumentError("out", f"memory apart from {name}", "an overlapping view")


def _functional(q, kv, indices, sm_scale, d_v=512, attn_sink=None, topk_length=None):
    return _eager(q, kv, indices, sm_scale, d_v, attn_sink, topk_length, None)


def _functional_fake(q, kv, indices, sm_scale, d_v=512, attn_sink=None, topk_length=None):
    s_q, h_q = q.shape[:2]
    return (q.new_empty((s_q, h_q, HEAD_DIM_V)), q.new_empty((s_q, h_q), dtype=torch.float32),
            q.new_empty((s_q, h_q), dtype=torch.float32))


def _into(q, kv, indices, out, sm_scale, d_v=512, attn_sink=None, topk_length=None):
    return _eager(q, kv, indices, sm_scale, d_v, attn_sink, topk_length, out)[1:]


def _into_fake(q, kv, indices, out, sm_scale, d_v=512, attn_sink=None, topk_length=None):
    return _functional_fake(q, kv, indices, sm_scale)[1:]


# Two ops for the compile path (a custom op may not return an alias of an input): the functional
# form returns (out, max_logits, lse); the `out=` form writes out and returns (max_logits, lse).
_TAIL = "float sm_scale, int d_v=512, Tensor? attn_sink=None, Tensor? topk_length=None"
_functional_op = library.define("flash_mla_sparse_fwd", f"(Tensor q, Tensor kv, Tensor indices, {_TAIL}) -> "
                                "(Tensor, Tensor, Tensor)", _functional, _functional_fake)
_out_op = library.define("flash_mla_sparse_fwd_out", f"(Tensor q, Tensor kv, Tensor indices, Tensor(a!) out, "
                         f"{_TAIL}) -> (Tensor, Tensor)", _into, _into_fake, mutates=("out",))
