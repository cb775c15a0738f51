"""Argument checks shared by the ops. Each raises InvalidArgumentError naming the argument."""
from __future__ import annotations

import math

import torch

from ..errors import InvalidArgumentError


def on_gpu(value: torch.Tensor) -> bool:
    """Whether a tensor lives on a CUDA device (CPU tests stub this to reach the later checks)."""
    return value.is_cuda


def tensor(name: str, value, *, dtypes: tuple[torch.dtype, ...] | None = None, ndim: int | None = None,
           device: torch.device | None = None, last_dim_contiguous: bool = False,
           contiguous: bool = False) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise InvalidArgumentError(name, "a torch.Tensor", type(value).__name__)
    if dtypes is not None and value.dtype not in dtypes:
        raise InvalidArgumentError(name, f"dtype in {[str(d) for d in dtypes]}", str(value.dtype))
    if ndim is not None and value.dim() != ndim:
        raise InvalidArgumentError(name, f"{ndim} dims", f"shape {tuple(value.shape)}")
    if device is not None and value.device != device:
        raise InvalidArgumentError(name, f"a tensor on {device}", str(value.device))
    if device is None and not on_gpu(value):
        raise InvalidArgumentError(name, "a CUDA tensor", str(value.device))
    if contiguous and not value.is_contiguous():
        raise InvalidArgumentError(name, "a contiguous tensor", f"strides {value.stride()}")
    if last_dim_contiguous and value.dim() and value.stride(-1) != 1 and value.shape[-1] != 1:
        raise InvalidArgumentError(name, "a contiguous last dim", f"strides {value.stride()}")
    return value


def shape(name: str, value: torch.Tensor, expected: tuple) -> None:
    """`expected` holds ints or None (any size)."""
    got = tuple(value.shape)
    if len(got) != len(expected) or any(e is not None and g != e for g, e in zip(got, expected)):
        want = "(" + ", ".join("*" if e is None else str(e) for e in expected) + ")"
        raise InvalidArgumentError(name, f"shape {want}", f"shape {got}")


def aligned(name: str, value: torch.Tensor, alignment: int) -> None:
    if value.data_ptr() % alignment:
        raise InvalidArgumentError(name, f"a data pointer aligned to {alignment} bytes", hex(value.data_ptr()))


def softmax_scale(value, default: float) -> float:
    """The softmax scale a call asked for: `default` for None, else a finite number."""
    if value is None:
        return default
    if isinstance(value, (float, int)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    raise InvalidArgumentError("softmax_scale", "a finite float or None", repr(value))


def overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether the byte spans two tensors address intersect (empty tensors intersect nothing)."""
    if a.numel() == 0 or b.numel() == 0:
        return False
    a0, b0 = a.data_ptr(), b.data_ptr()
    a1 = a0 + a.element_size() * (1 + sum((n - 1) * s for n, s in zip(a.shape, a.stride())))
    b1 = b0 + b.element_size() * (1 + sum((n - 1) * s for n, s in zip(b.shape, b.stride())))
    return a0 < b1 and b0 < a1
