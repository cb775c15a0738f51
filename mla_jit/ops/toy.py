"""Toy ops over the toy families: a TMA tile copy (with a PDL chain) and a wgmma GEMM tile."""
from __future__ import annotations

import torch

from ..configs.toy import tile_copy_config, wgmma_gemm_config
from ..dtypes import name_of
from ..errors import InvalidArgumentError
from ..jit import tma
from ..jit.arch import resolve_for_device
from ..jit.launch import F32, I32, PTR, TMA_DESC, PreparedLaunch
from ..jit.stream import current_stream
from ..runtimes import registry
from . import library, validate

_COPY_PARAMS = (TMA_DESC, PTR, I32, I32, F32)
_COPY_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
# Warm-path memos of the toy ops (a real family keeps these in its runtime module).
_plans: dict[tuple, tuple[PreparedLaunch, tuple[int, int]]] = {}
descriptors: dict[tuple, tma.TmaDescriptor] = {}


def _copy_plan(src: torch.Tensor, pdl: bool) -> tuple[PreparedLaunch, tuple[int, int]]:
    device = src.device.index
    arch = resolve_for_device(device)
    family = registry.get("tile_copy")
    plan_key = (device, src.dtype, src.shape, pdl, arch)
    plan = _plans.get(plan_key)
    if plan is None:
        cfg = tile_copy_config(name_of(src.dtype), arch.tuning)
        rows, cols = src.shape
        grid = ((cols + cfg.block_cols - 1) // cfg.block_cols, (rows + cfg.block_rows - 1) // cfg.block_rows, 1)
        launch = family.launcher(cfg, arch, "mla_jit_tile_copy", device, _COPY_PARAMS, grid,
                                 (cfg.num_threads, 1, 1), pdl=pdl)
        plan = _plans[plan_key] = (launch, (cfg.block_rows, cfg.block_cols))
    return plan


def _tile_copy_launch(src: torch.Tensor, dst: torch.Tensor, addend: float, pdl: bool) -> None:
    launch, box = _copy_plan(src, pdl)
    desc_key = (src.data_ptr(), src.shape, src.dtype)
    desc = descriptors.get(desc_key)
    if desc is None:
        if len(descriptors) > 4096:  # bound the cache for callers that copy ever-new tensors
            descriptors.clear()
        desc = descriptors[desc_key] = tma.tiled(src, box)
    rows, cols = src.shape
    launch(current_stream(src.device.index), desc, dst.data_ptr(), rows, cols, addend)


def _check_copy_input(src) -> torch.Tensor:
    validate.tensor("src", src, dtypes=_COPY_DTYPES, ndim=2, contiguous=True)
    validate.aligned("src", src, 16)
    if (src.shape[1] * src.element_size()) % 16:
        raise InvalidArgumentError("src", "rows whose size is a multiple of 16 bytes", f"shape {tuple(src.shape)}")
    return src


def tile_copy(src: torch.Tensor, addend: float = 0.0, out: torch.Tensor | None = None,
              pdl: bool = False) -> torch.Tensor:
    """out = src + addend through a TMA tile load. `src` 2D contiguous bf16/fp16/fp32.

    The worked example of an op with `out=`: the torch op `mla_jit::tile_copy_out` writes `out`
    (declared mutated in its schema); this function allocates `out` when none is given and calls
    the op while torch.compile traces, the eager path otherwise."""
    if out is None:
        out = torch.empty_like(src) if isinstance(src, torch.Tensor) else None
    if library.compiling():
        _tile_copy_out_op(src, float(addend), out, pdl)
    else:
        _tile_copy_out(src, float(addend), out, pdl)
    return out


def _tile_copy_out(src: torch.Tensor, addend: float, out: torch.Tensor, pdl: bool = False) -> None:
    _check_copy_input(src)
    validate.tensor("out", out, dtypes=(src.dtype,), device=src.device, contiguous=True)
    validate.shape("out", out, tuple(src.shape))
    _tile_copy_launch(src, out, float(addend), pdl)


def _tile_copy_out_fake(src: torch.Tensor, addend: float, out: torch.Tensor, pdl: bool = False) -> None:
    return None


_tile_copy_out_op = library.define("tile_copy_out", "(Tensor src, float addend, Tensor(a!) out, bool pdl=False) -> ()",
               _tile_copy_out, _tile_copy_out_fake, mutates=("out",))


def tile_copy_chain(src: torch.Tensor, addend: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Two copies back to back, the second launched with PDL and reading the first's output:
    returns (src + addend, (src + addend) + addend)."""
    _check_copy_input(src)
    mid = torch.empty_like(src)
    out = torch.empty_like(src)
    _tile_copy_launch(src, mid, float(addend), pdl=True)
    _tile_copy_launch(mid, out, float(addend), pdl=True)
    return mid, out


_GEMM_PARAMS = (PTR, PTR, PTR, I32, I32, I32)


def wgmma_gemm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """C = A @ B^T in fp32 through one wgmma tile per CTA. A (M, K), B (N, K), bf16 or fp16;
    M % 64 == 0, N % 128 == 0, K % 64 == 0."""
    validate.tensor("a", a, dtypes=(torch.bfloat16, torch.float16), ndim=2, contiguous=True)
    validate.tensor("b", b, dtypes=(a.dtype,), ndim=2, device=a.device, contiguous=True)
    device = a.device.index
    arch = resolve_for_device(device)
    cfg = wgmma_gemm_config(name_of(a.dtype), arch.tuning)
    (m, k), (n, k2) = a.shape, b.shape
    if k2 != k:
        raise InvalidArgumentError("b", f"shape (N, {k})", f"shape {tuple(b.shape)}")
    for name, size, mult in (("a.shape[0]", m, cfg.block_m), ("b.shape[0]", n, cfg.block_n),
                             ("a.shape[1]", k, cfg.block_k)):
        if size % mult or size == 0:
            raise InvalidArgumentError(name, f"a positive multiple of {mult}", str(size))
    c = torch.empty((m, n), dtype=torch.float32, device=a.device)
    launch = registry.get("wgmma_gemm").launcher(cfg, arch, "mla_jit_wgmma_gemm", device, _GEMM_PARAMS,
                                                 (n // cfg.block_n, m // cfg.block_m, 1), (128, 1, 1))
    launch(current_stream(device), a.data_ptr(), b.data_ptr(), c.data_ptr(), m, n, k)
    return c
