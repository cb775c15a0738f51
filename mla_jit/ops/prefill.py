"""FlashAttention-compatible varlen prefill (`flash_attn_varlen_func`) for MLA's MHA mode (q/k head
dim 192, v head dim 128) and the standard head dims, as torch custom op
`mla_jit::flash_attn_varlen_func`.

This module validates arguments and asks the runtime (runtimes/prefill_plan.py) for a plan; a warm
call is a signature lookup, the output allocations and the plan's launch.
"""
from __future__ import annotations

import math

import torch

from ..configs.prefill import SUPPORTED_HEAD_DIMS
from ..errors import FeatureNotAvailableError, InvalidArgumentError
from ..runtimes import prefill_plan as runtime
from . import library, validate

_DTYPES = (torch.bfloat16, torch.float16)

# FlashAttention keywords that change the result, and what mla_jit would need to serve them: given
# with a value other than FlashAttention's default, they raise FeatureNotAvailableError.
_UNSERVED = {
    "block_table": "paged K/V for prefill",
    "seqused_k": "per-sequence key counts below cu_seqlens_k",
    "q_v": "a separate q for the v head dims",
    "alibi_slopes": "ALiBi",
    "q_descale": "FP8 q/k/v with descales",
    "k_descale": "FP8 q/k/v with descales",
    "v_descale": "FP8 q/k/v with descales",
    "s_aux": "attention sinks",
}


def flash_attn_varlen_func(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                           cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int,
                           dropout_p: float = 0.0, softmax_scale: float | None = None, causal: bool = False,
                           window_size=None, softcap: float = 0.0, alibi_slopes=None, deterministic: bool = False,
                           return_attn_probs: bool = False, block_table=None, *, return_softmax_lse: bool = False,
                           out: torch.Tensor | None = None, seqused_k=None, q_v=None, scheduler_metadata=None,
                           num_splits: int = 0, fa_version=None, q_descale=None, k_descale=None, v_descale=None,
                           s_aux=None, cp_world_size: int = 1, cp_rank: int = 0, cp_tot_seqused_k=None):
    """Attention over variable-length sequences packed along the token dim (FlashAttention's API).

    q (total_q, h, d), k (total_k, h_k, d), v (total_k, h_k, dv): bf16 or fp16, any token and head
    strides with a contiguous last dim and 16-byte aligned rows; h a multiple of h_k;
    (d, dv) in {(192, 128), (128, 128), (64, 64)}. cu_seqlens_q / cu_seqlens_k int32 (b + 1,)
    prefix sums of the lengths; max_seqlen_q at least the longest query sequence (as
    FlashAttention's: rows past it are not computed). causal aligns bottom-right (query i of n
    sees keys 0 .. L_k - n + i). Rows that see no key: out 0, lse +inf.

    Returns out (total_q, h, dv) (written into `out=` when given), or (out, lse) with lse float32
    (h, total_q), natural log, when return_softmax_lse or return_attn_probs is set. Keywords that
    have no effect here (deterministic, num_splits, fa_version, scheduler_metadata, window_size
    (-1, -1), softcap 0) are accepted; those with an effect mla_jit does not serve raise
    FeatureNotAvailableError naming them."""
    given = {"block_table": block_table, "seqused_k": seqused_k, "q_v": q_v, "alibi_slopes": alibi_slopes,
             "q_descale": q_descale, "k_descale": k_descale, "v_descale": v_descale, "s_aux": s_aux}
    for name, value in given.items():
        if value is not None:
            raise FeatureNotAvailableError(name, _UNSERVED[name])
    if dropout_p != 0.0:
        raise FeatureNotAvailableError("dropout_p", "dropout (inference kernels)")
    if softcap not in (0, 0.0, None):
        raise FeatureNotAvailableError("softcap", "logit soft-capping")
    if window_size is not None and tuple(window_size) != (-1, -1):
        raise FeatureNotAvailableError("window_size", "sliding-window attention")
    if cp_world_size != 1:
        raise FeatureNotAvailableError("cp_world_size", "context parallelism")
    if library.compiling():
        result = _prefill_op(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale,
                             causal, return_softmax_lse or return_attn_probs, out)
    else:
        result = _prefill_eager(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale,
                                causal, return_softmax_lse or return_attn_probs, out)
    return result if (return_softmax_lse or return_attn_probs) else result[0]


def _signature(q, k, v, cu_seqlens_q, cu_seqlens_k, causal) -> tuple:
    """What the layout checks look at, minus the token counts and the data pointers."""
    return (runtime.plan_env(), bool(causal), q.shape[1:], q.stride(), q.dtype, q.get_device(), k.shape[1:],
            k.stride(), k.dtype, k.get_device(), v.shape[1:], v.stride(), v.dtype, v.get_device(),
            cu_seqlens_q.dim(), cu_seqlens_q.dtype, cu_seqlens_q.get_device(), cu_seqlens_q.stride(),
            cu_seqlens_k.dim(), cu_seqlens_k.dtype, cu_seqlens_k.get_device(), cu_seqlens_k.stride())


def _prefill_eager(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale=None,
                   causal=False, return_lse=False, out=None):
    # (The defaults repeat the schema's: the dispatcher passes only the arguments given.)
    try:
        signature = _signature(q, k, v, cu_seqlens_q, cu_seqlens_k, causal)
        plan = runtime.plans.get(signature)
    except (AttributeError, TypeError, IndexError):  # not tensors, or too few dims: the full checks name it
        plan = signature = None
    if plan is None:
        _check_layout(q, k, v, cu_seqlens_q, cu_seqlens_k, causal)
        plan = runtime.PrefillPlan(q, k, v, bool(causal))
        if signature is not None:
            if len(runtime.plans) >= runtime.MAX_PLANS:  # callers with ever-new layouts: keep the memo bounded
                runtime.plans.clear()
            runtime.plans[signature] = plan
    scale = _check_call(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, out, plan)
    total_q = q.shape[0]
    if out is None:
        out = q.new_empty((total_q, plan.num_heads, plan.head_dim_v))
    lse = q.new_empty((plan.num_heads, total_q), dtype=torch.float32) if return_lse else None
    plan.run(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, out, lse, scale)
    return out, lse


def _check_layout(q, k, v, cu_seqlens_q, cu_seqlens_k, causal) -> None:
    """First call of a layout: everything but the token counts and the data pointers."""
    validate.tensor("q", q, dtypes=_DTYPES, ndim=3, last_dim_contiguous=True)
    device = q.device
    validate.tensor("k", k, dtypes=(q.dtype,), ndim=3, device=device, last_dim_contiguous=True)
    validate.tensor("v", v, dtypes=(q.dtype,), ndim=3, device=device, last_dim_contiguous=True)
    _, h, d = q.shape
    _, h_k, d_k = k.shape
    dv = v.shape[2]
    if (d, dv) not in SUPPORTED_HEAD_DIMS:
        raise InvalidArgumentError("q, v", "head dims (q/k, v) in " + ", ".join(f"({a}, {b})" for a, b in
                                                                               SUPPORTED_HEAD_DIMS),
                                   f"({d}, {dv})")
    if d_k != d:
        raise InvalidArgumentError("k", f"head dim {d} (q's)", f"shape {tuple(k.shape)}")
    if h_k == 0 or h % h_k:
        raise InvalidArgumentError("k", f"a number of heads that divides q's {h}", f"shape {tuple(k.shape)}")
    if v.shape[:2] != k.shape[:2]:
        raise InvalidArgumentError("v", f"shape ({k.shape[0]}, {h_k}, {dv}) (k's tokens and heads)",
                                   f"shape {tuple(v.shape)}")
    if h >= 2 ** 31:
        raise InvalidArgumentError("q", "fewer than 2^31 heads", f"shape {tuple(q.shape)}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        # TMA: 16-byte aligned token and head strides (and base, checked per call).
        if any((s * t.element_size()) % 16 for s in t.stride()[:2]):
            raise InvalidArgumentError(name, "token and head strides that are multiples of 16 bytes",
                                       f"strides {t.stride()}")
    for name, t in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        validate.tensor(name, t, dtypes=(torch.int32,), ndim=1, device=device, contiguous=True)
    if not isinstance(causal, (bool, int)):
        raise InvalidArgumentError("causal", "a bool", type(causal).__name__)


def _check_call(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, out,
                plan) -> float:
    """Per call: batch, token counts, lengths, scale, alignment and `out`; returns the softmax scale."""
    if cu_seqlens_q.shape[0] < 1:
        raise InvalidArgumentError("cu_seqlens_q", "shape (b + 1,) with b >= 0", f"shape {tuple(cu_seqlens_q.shape)}")
    if cu_seqlens_k.shape != cu_seqlens_q.shape:
        raise InvalidArgumentError("cu_seqlens_k", f"shape {tuple(cu_seqlens_q.shape)} (cu_seqlens_q's)",
                                   f"shape {tuple(cu_seqlens_k.shape)}")
    total_q, total_k = q.shape[0], k.shape[0]
    if v.shape[0] != total_k:
        raise InvalidArgumentError("v", f"{total_k} tokens (k's)", f"shape {tuple(v.shape)}")
    if total_q >= 2 ** 31 or total_k >= 2 ** 31:
        raise InvalidArgumentError("q" if total_q >= 2 ** 31 else "k", "fewer than 2^31 tokens",
                                   f"{max(total_q, total_k)}")
    for name, value in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise InvalidArgumentError(name, "an int >= 0", repr(value))
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.data_ptr() % 16:
            raise InvalidArgumentError(name, "a 16-byte aligned data pointer", hex(t.data_ptr()))
    if softmax_scale is None:
        scale = q.shape[2] ** -0.5
    else:
        scale = float(softmax_scale)
        if not (math.isfinite(scale) and scale > 0):
            raise InvalidArgumentError("softmax_scale", "a finite scale > 0 (or None for d^-0.5)", repr(softmax_scale))
    if out is not None:
        validate.tensor("out", out, dtypes=(q.dtype,), ndim=3, device=q.device, last_dim_contiguous=True)
        validate.shape("out", out, (total_q, plan.num_heads, plan.head_dim_v))
        if out.data_ptr() % 16 or any((s * out.element_size()) % 16 for s in out.stride()[:2]):
            raise InvalidArgumentError("out", "16-byte aligned rows (pointer, token and head strides)",
                                       f"strides {out.stride()}")
        if torch._debug_has_internal_overlap(out) == 1:
            raise InvalidArgumentError("out", "a tensor without internal overlap", f"strides {out.stride()}")
        for name, t in (("q", q), ("k", k), ("v", v)):
            if validate.overlaps(out, t):
                raise InvalidArgumentError("out", f"memory apart from {name}", "an overlapping view")
    return scale


def _prefill_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale=None,
                  causal=False):
    total_q, h, _ = q.shape
    return q.new_empty((total_q, h, v.shape[2])), q.new_empty((h, total_q), dtype=torch.float32)


def _prefill_out_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, out, softmax_scale=None,
                      causal=False):
    return q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)


def _prefill_functional(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale=None,
                        causal=False):
    return _prefill_eager(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
                          True, None)


def _prefill_into(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, out, softmax_scale=None,
                  causal=False):
    return _prefill_eager(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
                          True, out)[1]


# Two ops for the compile path (a custom op may not return an alias of an input, and Dynamo's
# functionalization takes no optional returns): the functional form returns (out, lse); the `out=`
# form writes out and returns lse. Both always compute lse (h x total_q floats: next to nothing).
_SCHEMA_ARGS = ("Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k, SymInt max_seqlen_q, "
                "SymInt max_seqlen_k")
_prefill_defined = library.define(
    "flash_attn_varlen_func", f"({_SCHEMA_ARGS}, float? softmax_scale=None, bool causal=False) -> (Tensor, Tensor)",
    _prefill_functional, _prefill_fake)
_prefill_out_defined = library.define(
    "flash_attn_varlen_func_out",
    f"({_SCHEMA_ARGS}, Tensor(a!) out, float? softmax_scale=None, bool causal=False) -> Tensor",
    _prefill_into, _prefill_out_fake, mutates=("out",))


def _prefill_op(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal, return_lse,
                out):
    if out is None:
        return _prefill_defined(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale,
                                causal)
    lse = _prefill_out_defined(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, out, softmax_scale,
                               causal)
    return out, lse
