"""merge_attn_states (vLLM's signature): merge two attention states by log-sum-exp, as torch custom op
`mla_jit::merge_attn_states` (it writes `output` and, when given, `output_lse`)."""
from __future__ import annotations

import torch

from ..configs.merge import MERGE_HEAD_DIMS, MERGE_MAX_CTAS
from ..errors import FeatureNotAvailableError, InvalidArgumentError
from ..jit.stream import current_stream
from ..runtimes import merge_plan as runtime
from ..runtimes.merge import MERGE_PARAMS
from . import library, validate

_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def merge_attn_states(output: torch.Tensor, prefix_output: torch.Tensor, prefix_lse: torch.Tensor,
                      suffix_output: torch.Tensor, suffix_lse: torch.Tensor, output_lse: torch.Tensor | None = None,
                      prefill_tokens_with_context: int | None = None, output_scale: torch.Tensor | None = None) -> None:
    """output = the log-sum-exp merge of (prefix_output, prefix_lse) and (suffix_output, suffix_lse).

    Outputs (T, h, d) bf16/fp16/fp32 (one dtype for all three), any token and head strides with a
    contiguous last dim, rows 16-byte aligned; d in {64, 128, 256, 512}. lse float32 (h, T)
    (FlashAttention's layout), any strides. An lse of +inf or -inf marks an empty state, whose
    values are never read into the result; two empty states give 0 and an output_lse of -inf (as
    vLLM's). Writes `output` (and `output_lse` if given) in place; they may not overlap the inputs
    or each other. vLLM's newer `prefill_tokens_with_context` and `output_scale` are not served yet."""
    if prefill_tokens_with_context is not None:
        raise FeatureNotAvailableError("prefill_tokens_with_context", "merging only the tokens that have a context")
    if output_scale is not None:
        raise FeatureNotAvailableError("output_scale", "an FP8-quantized merge output")
    if library.compiling():
        _merge_op(output, prefix_output, prefix_lse, suffix_output, suffix_lse, output_lse)
    else:
        _merge_eager(output, prefix_output, prefix_lse, suffix_output, suffix_lse, output_lse)


def _signature(output, prefix_output, prefix_lse, suffix_output, suffix_lse, output_lse) -> tuple:
    """Everything the layout checks look at except the token count (it changes every chunked-prefill
    step) and data pointers: the lse head strides are left out too (they follow the token count)."""
    sig = (runtime.plan_env(), output_lse is None)
    for t in (output, prefix_output, suffix_output):
        sig += (t.shape[1:], t.stride(), t.dtype, t.get_device())
    for t in (prefix_lse, suffix_lse) if output_lse is None else (prefix_lse, suffix_lse, output_lse):
        sig += (t.shape[0], t.stride(1), t.dtype, t.get_device(), t.dim())
    return sig


def _merge_eager(output, prefix_output, prefix_lse, suffix_output, suffix_lse, output_lse=None) -> None:
    # (The default repeats the schema's: the dispatcher passes only the arguments given.)
    try:
        signature = _signature(output, prefix_output, prefix_lse, suffix_output, suffix_lse, output_lse)
        plan = runtime.plans.get(signature)
    except (AttributeError, TypeError, IndexError):  # not tensors, or too few dims: the full checks name it
        plan = signature = None
    if plan is None:
        _check_layout(output, prefix_output, prefix_lse, suffix_output, suffix_lse, output_lse)
        plan = runtime.MergePlan(output)
        if signature is not None:
            if len(runtime.plans) >= runtime.MAX_PLANS:  # callers with ever-new layouts: keep the memo bounded
                runtime.plans.clear()
            runtime.plans[signature] = plan
    num_tokens = output.shape[0]
    _check_call(num_tokens, plan, output, prefix_output, prefix_lse, suffix_output, suffix_lse, output_lse)
    if num_tokens == 0 or plan.num_heads == 0:
        return
    olse_ptr, olse_strides = (0, (0, 0)) if output_lse is None else (output_lse.data_ptr(), output_lse.stride())
    out_stride, pre_stride, suf_stride = output.stride(), prefix_output.stride(), suffix_output.stride()
    params = MERGE_PARAMS.pack(
        output.data_ptr(), prefix_output.data_ptr(), suffix_output.data_ptr(), olse_ptr, prefix_lse.data_ptr(),
        suffix_lse.data_ptr(), out_stride[0], out_stride[1], pre_stride[0], pre_stride[1], suf_stride[0],
        suf_stride[1], *prefix_lse.stride(), *suffix_lse.stride(), *olse_strides, num_tokens, plan.num_heads)
    plan.launch(num_tokens)(current_stream(plan.device_index), params)


def _check_call(num_tokens, plan, output, prefix_output, prefix_lse, suffix_output, suffix_lse, output_lse) -> None:
    """Per call: the token count agrees, rows stay 16-byte aligned, and outputs and inputs do not overlap."""
    if num_tokens * plan.num_heads + MERGE_MAX_CTAS * plan.cfg.rows_per_cta >= 2 ** 31:
        raise InvalidArgumentError("output", "tokens x heads < 2^31 - 2^16", f"shape {tuple(output.shape)}")
    lses = (("prefix_lse", prefix_lse), ("suffix_lse", suffix_lse), ("output_lse", output_lse))
    for name, t in (("prefix_output", prefix_output), ("suffix_output", suffix_output)):
        if t.shape[0] != num_tokens:
            raise InvalidArgumentError(name, f"{num_tokens} tokens (output's)", f"shape {tuple(t.shape)}")
    for name, t in lses:
        if t is not None and t.shape[1] != num_tokens:
            raise InvalidArgumentError(name, f"shape ({plan.num_heads}, {num_tokens})", f"shape {tuple(t.shape)}")
    spans = {name: _span(t) for name, t in (("output", output), ("prefix_output", prefix_output),
                                            ("suffix_output", suffix_output), *lses) if t is not None}
    for name in ("output", "prefix_output", "suffix_output"):
        if spans[name][0] % 16:
            raise InvalidArgumentError(name, "a 16-byte aligned data pointer", hex(spans[name][0]))
    for written in ("output", "output_lse"):
        for other, (lo, hi) in spans.items():
            if written in spans and other != written and lo < spans[written][1] and spans[written][0] < hi:
                raise InvalidArgumentError(other, f"memory apart from {written}", "an overlapping view")


def _span(t: torch.Tensor) -> tuple[int, int]:
    """[first byte, one past the last byte] of what a tensor addresses (empty: a zero-length span)."""
    start = t.data_ptr()
    if t.numel() == 0:
        return start, start
    return start, start + t.element_size() * (1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride())))


def _check_layout(output, prefix_output, prefix_lse, suffix_output, suffix_lse, output_lse) -> None:
    """First call of a layout: everything but the token count and the data pointers."""
    validate.tensor("output", output, dtypes=_DTYPES, ndim=3, last_dim_contiguous=True)
    device = output.device
    _, num_heads, head_dim = output.shape
    if head_dim not in MERGE_HEAD_DIMS:
        raise InvalidArgumentError("output", f"head dim (dim 2) in {MERGE_HEAD_DIMS}", str(head_dim))
    vec = 16 // output.element_size()
    for name, t in (("output", output), ("prefix_output", prefix_output), ("suffix_output", suffix_output)):
        if t is not output:
            validate.tensor(name, t, dtypes=(output.dtype,), ndim=3, device=device, last_dim_contiguous=True)
            validate.shape(name, t, (None, num_heads, head_dim))
        if t.stride(0) % vec or t.stride(1) % vec:
            raise InvalidArgumentError(name, f"16-byte aligned rows (token and head strides multiples of {vec} "
                                       "elements)", f"strides {t.stride()}")
    for name, t in (("prefix_lse", prefix_lse), ("suffix_lse", suffix_lse), ("output_lse", output_lse)):
        if t is None and name == "output_lse":
            continue
        validate.tensor(name, t, dtypes=(torch.float32,), ndim=2, device=device)
        validate.shape(name, t, (num_heads, None))
    for name, t in (("output", output), ("output_lse", output_lse)):
        # Two rows written through one address (a stride-0 view): the result would depend on timing.
        if t is not None and torch._debug_has_internal_overlap(t) == 1:  # 2 ("too hard to tell") passes
            raise InvalidArgumentError(name, "a tensor without internal overlap", f"strides {t.stride()}")


def _merge_fake(output, prefix_output, prefix_lse, suffix_output, suffix_lse, output_lse=None) -> None:
    return None


_merge_op = library.define(
    "merge_attn_states",
    "(Tensor(a!) output, Tensor prefix_output, Tensor prefix_lse, Tensor suffix_output, Tensor suffix_lse, "
    "Tensor(b!)? output_lse=None) -> ()", _merge_eager, _merge_fake, mutates=("output", "output_lse"))
