"""The `mla_jit` torch.library namespace: every public op is registered here as an opaque custom op
with a fake (meta) implementation, so torch.compile traces through it without a graph break.

An op module calls `define()` once per op at import. The public Python function keeps an eager
fast path and hands over to `torch.ops.mla_jit.<name>` only while torch.compile traces
(`compiling()`): the dispatcher's per-call cost (several microseconds) stays out of eager decode
steps, and tracing never compiles, loads or launches a kernel (the fake implementation computes
output shapes and dtypes only).
"""
from __future__ import annotations

import re
from typing import Callable

import torch

# The package's own name: "mla_jit", or another where a copy of the package is imported beside it
# (bench/bench_decode.py --against-package), so the two never register the same operator.
NAMESPACE = __package__.split(".")[0]
_library = torch.library.Library(NAMESPACE, "FRAGMENT")
_defined: dict[str, str] = {}   # op name -> schema

# torch.compiler.is_compiling: ~0.05 us, true while Dynamo traces (and in the graphs it makes).
compiling: Callable[[], bool] = torch.compiler.is_compiling


def define(name: str, schema: str, impl: Callable, fake: Callable, *, mutates: tuple[str, ...] = ()):
    """Register `mla_jit::name` with `schema` (the part after the name, e.g. "(Tensor x) -> Tensor"),
    and return the op (`torch.ops.mla_jit.name`).
    the real implementation for CUDA (and CPU, where the implementation's own checks reject the
    tensors with a typed error) and the fake one. Arguments an op writes must be marked in the
    schema (`Tensor(a!) out`); `mutates` repeats their names so the registration checks them."""
    for arg in mutates:
        if not re.search(rf"Tensor\(\w!\)\??\s+{re.escape(arg)}\b", schema):
            raise ValueError(f"{name}: mutated argument {arg!r} is not marked in the schema {schema}")
    _library.define(name + schema)
    for key in ("CUDA", "CPU"):
        _library.impl(name, impl, key)
    torch.library.register_fake(f"{NAMESPACE}::{name}", fake, lib=_library)
    _defined[name] = schema
    return getattr(getattr(torch.ops, NAMESPACE), name)   # the op, for the compile path to call


def defined() -> dict[str, str]:
    """Ops registered so far, name -> schema (tests check every public op against it)."""
    return dict(_defined)
