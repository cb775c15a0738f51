"""merge_attn_states (vLLM's signature): merge two attention states by log-sum-exp, as torch custom op
`mla_jit::merge_attn_states` (it writes `output` and, when given, `output_lse`)."""
from __future__ import annotations

import torch

from ..configs.merge import MERGE_HEAD_DIMS, merge_config, merge_grid
from ..dtypes import name_of
from ..errors import InvalidArgumentError
from ..jit.arch import resolve_for_device
from ..jit.launch import Blob
from ..jit.stream import current_stream
from ..runtimes import registry
from ..runtimes.decode_plan import plan_env
from ..runtimes.merge import MERGE_PARAMS
from . import library, validate

_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_plans: dict[tuple, object] = {}   # call signature -> PreparedLaunch


def merge_attn_states(output: torch.Tensor, prefix_output: torch.Tensor, prefix_lse: torch.Tensor,
                      suffix_output: torch.Tensor, suffix_lse: torch.Tensor,
                      output_lse: torch.Tensor | None = None) -> None:
    """output = the log-sum-exp merge of (prefix_output, prefix_lse) and (suffix_output, suffix_lse).

    Outputs (T, h, d) bf16/fp16/fp32 (one dtype for all three), any token and head strides with a
    contiguous last dim, rows 16-byte aligned; d in {64, 128, 256, 512}. lse float32 (h, T) (FlashAttention's
    layout), any strides. An lse of +inf or -inf marks an empty state; two empty states give 0 and
    an output_lse of +inf. Writes `output` (and `output_lse` if given) in place."""
    if library.compiling():
        torch.ops.mla_jit.merge_attn_states(output, prefix_output, prefix_lse, suffix_output, suffix_lse, output_lse)
    else:
        _merge_eager(output, prefix_output, prefix_lse, suffix_output, suffix_lse, output_lse)


def _signature(output, prefix_output, prefix_lse, suffix_output, suffix_lse, output_lse) -> tuple:
    sig = (plan_env(),)
    for t in (output, prefix_output, prefix_lse, suffix_output, suffix_lse):
        sig += (t.shape, t.stride(), t.dtype, t.get_device())
    if output_lse is not None:
        sig += (output_lse.shape, output_lse.stride(), output_lse.dtype, output_lse.get_device())
    return sig


def _merge_eager(output, prefix_output, prefix_lse, suffix_output, suffix_lse, output_lse=None) -> None:
    # (The default repeats the schema's: the dispatcher passes only the arguments given.)
    try:
        signature = _signature(output, prefix_output, prefix_lse, suffix_output, suffix_lse, output_lse)
        launch = _plans.get(signature)
    except (AttributeError, TypeError):  # a non-tensor argument: the full checks name it
        launch = signature = None
    if launch is None:
        _check_args(output, prefix_output, prefix_lse, suffix_output, suffix_lse, output_lse)
        if output.shape[0] * output.shape[1] == 0:
            return
        launch = _launch_for(output)
        if signature is not None:
            _plans[signature] = launch
    pointers = (output.data_ptr(), prefix_output.data_ptr(), suffix_output.data_ptr())
    if (pointers[0] | pointers[1] | pointers[2]) % 16:
        raise InvalidArgumentError("output/prefix_output/suffix_output", "16-byte aligned data pointers",
                                   ", ".join(hex(p) for p in pointers))
    out_lse_ptr, olse_strides = (0, (0, 0)) if output_lse is None else (output_lse.data_ptr(), output_lse.stride())
    params = MERGE_PARAMS.pack(
        pointers[0], pointers[1], pointers[2], out_lse_ptr, prefix_lse.data_ptr(), suffix_lse.data_ptr(),
        *output.stride()[:2], *prefix_output.stride()[:2], *suffix_output.stride()[:2], *prefix_lse.stride(),
        *suffix_lse.stride(), *olse_strides, output.shape[0], output.shape[1])
    launch(current_stream(output.get_device()), params)


def _launch_for(output: torch.Tensor):
    device = output.get_device()
    arch = resolve_for_device(device)
    family = registry.get("merge_states")
    cfg = merge_config(name_of(output.dtype), output.shape[2], arch.tuning)
    grid = merge_grid(output.shape[0] * output.shape[1], cfg.rows_per_cta)
    return family.launcher(cfg, arch, family.ENTRY, device, (Blob(MERGE_PARAMS.size),), (grid, 1, 1),
                           (cfg.num_threads, 1, 1))


def _check_args(output, prefix_output, prefix_lse, suffix_output, suffix_lse, output_lse) -> None:
    validate.tensor("output", output, dtypes=_DTYPES, ndim=3, last_dim_contiguous=True)
    device = output.device
    num_tokens, num_heads, head_dim = output.shape
    if num_tokens * num_heads >= 2 ** 31:
        raise InvalidArgumentError("output", "tokens x heads < 2^31", f"shape {tuple(output.shape)}")
    if head_dim not in MERGE_HEAD_DIMS:
        raise InvalidArgumentError("output", f"head dim (dim 2) in {MERGE_HEAD_DIMS}", str(head_dim))
    vec = 16 // output.element_size()
    for name, t in (("output", output), ("prefix_output", prefix_output), ("suffix_output", suffix_output)):
        if t is not output:
            validate.tensor(name, t, dtypes=(output.dtype,), ndim=3, device=device, last_dim_contiguous=True)
            validate.shape(name, t, tuple(output.shape))
        if t.stride(0) % vec or t.stride(1) % vec or t.data_ptr() % 16:
            raise InvalidArgumentError(name, f"16-byte aligned rows (a 16-byte aligned base, token and head strides "
                                       f"multiples of {vec} elements)", f"strides {t.stride()}")
    for name, t in (("prefix_lse", prefix_lse), ("suffix_lse", suffix_lse), ("output_lse", output_lse)):
        if t is None and name == "output_lse":
            continue
        validate.tensor(name, t, dtypes=(torch.float32,), ndim=2, device=device)
        validate.shape(name, t, (num_heads, num_tokens))
    for name, t in (("prefix_output", prefix_output), ("suffix_output", suffix_output),
                    ("prefix_lse", prefix_lse), ("suffix_lse", suffix_lse)):
        if _overlaps(t, output) or (output_lse is not None and _overlaps(t, output_lse)):
            raise InvalidArgumentError(name, "memory apart from output and output_lse", "an overlapping view")


def _overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether the address ranges two tensors span intersect (a conservative check)."""
    if a.numel() == 0 or b.numel() == 0:
        return False
    def span(t):
        start = t.data_ptr()
        return start, start + t.element_size() * (1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride())))
    (a0, a1), (b0, b1) = span(a), span(b)
    return a0 < b1 and b0 < a1


def _merge_fake(output, prefix_output, prefix_lse, suffix_output, suffix_lse, output_lse=None) -> None:
    return None


library.define("merge_attn_states",
               "(Tensor(a!) output, Tensor prefix_output, Tensor prefix_lse, Tensor suffix_output, "
               "Tensor suffix_lse, Tensor(b!)? output_lse=None) -> ()",
               _merge_eager, _merge_fake, mutates=("output", "output_lse"))
