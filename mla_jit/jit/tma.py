"""TMA descriptors (CUtensorMap) for tiled loads, validated before the driver sees them.

Dims are given innermost first, as the driver takes them. Strides are in elements for the
dims above the innermost (which must be contiguous). The descriptor is copied into an
aligned 128-byte buffer that PreparedLaunch copies into the kernel parameter block.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Sequence

import torch

from ..errors import InvalidArgumentError
from .driver import check, cu
from .launch import Immutable

_DTYPES = {
    torch.uint8: ("CU_TENSOR_MAP_DATA_TYPE_UINT8", 1),
    torch.int8: ("CU_TENSOR_MAP_DATA_TYPE_UINT8", 1),
    torch.float8_e4m3fn: ("CU_TENSOR_MAP_DATA_TYPE_UINT8", 1),
    torch.float8_e5m2: ("CU_TENSOR_MAP_DATA_TYPE_UINT8", 1),
    torch.float16: ("CU_TENSOR_MAP_DATA_TYPE_FLOAT16", 2),
    torch.bfloat16: ("CU_TENSOR_MAP_DATA_TYPE_BFLOAT16", 2),
    torch.int32: ("CU_TENSOR_MAP_DATA_TYPE_INT32", 4),
    torch.uint32: ("CU_TENSOR_MAP_DATA_TYPE_UINT32", 4),
    torch.float32: ("CU_TENSOR_MAP_DATA_TYPE_FLOAT32", 4),
    torch.int64: ("CU_TENSOR_MAP_DATA_TYPE_INT64", 8),
    torch.float64: ("CU_TENSOR_MAP_DATA_TYPE_FLOAT64", 8),
}

SWIZZLE_BYTES = {0: "CU_TENSOR_MAP_SWIZZLE_NONE", 32: "CU_TENSOR_MAP_SWIZZLE_32B",
                 64: "CU_TENSOR_MAP_SWIZZLE_64B", 128: "CU_TENSOR_MAP_SWIZZLE_128B"}
L2_PROMOTION_BYTES = {0: "CU_TENSOR_MAP_L2_PROMOTION_NONE", 64: "CU_TENSOR_MAP_L2_PROMOTION_L2_64B",
                      128: "CU_TENSOR_MAP_L2_PROMOTION_L2_128B", 256: "CU_TENSOR_MAP_L2_PROMOTION_L2_256B"}


@dataclass(frozen=True)
class TmaSpec:
    dtype: torch.dtype
    dims: tuple[int, ...]          # innermost first
    strides: tuple[int, ...]       # elements, for dims[1:]
    box: tuple[int, ...]           # innermost first
    swizzle: int = 0               # bytes: 0, 32, 64 or 128
    oob_fill_nan: bool = False
    # Bytes the L2 fetches per miss (0: a sector). Above a box row's extent, L2 also fetches bytes
    # the box did not ask for: for the decode KV cache (128-byte box rows, loaded evict_first) 256
    # cost 1-7% on the memory-bound rows against 128 (H200), likely lines evicted before the box
    # that needs them arrives, then fetched again.
    l2_promotion: int = 128


class TmaDescriptor(Immutable):
    """A 64-byte-aligned copy of an encoded CUtensorMap; `.address` points at it."""

    __slots__ = ("_raw", "address", "spec", "global_address")

    def __init__(self, tensor_map, spec: TmaSpec, global_address: int):
        self._raw = (ctypes.c_uint8 * 192)()
        base = ctypes.addressof(self._raw)
        self.address = base + (-base) % 64
        ctypes.memmove(self.address, tensor_map.getPtr(), 128)
        self.spec = spec
        self.global_address = global_address


def _fail(what: str, expected: str, got) -> None:
    raise InvalidArgumentError(f"TMA descriptor {what}", expected, str(got))


def validate(spec: TmaSpec, global_address: int) -> int:
    """Check the driver's encoding rules; return the element size."""
    if spec.dtype not in _DTYPES:
        _fail("dtype", f"one of {sorted(str(d) for d in _DTYPES)}", spec.dtype)
    esize = _DTYPES[spec.dtype][1]
    rank = len(spec.dims)
    if not 1 <= rank <= 5:
        _fail("rank", "1 to 5 dims", rank)
    if len(spec.box) != rank or len(spec.strides) != rank - 1:
        _fail("shape", f"box of {rank} dims and {rank - 1} strides", (spec.box, spec.strides))
    if global_address % 16:
        _fail("global address", "16-byte aligned", hex(global_address))
    for d in spec.dims:
        if not 1 <= d <= 2 ** 32:
            _fail("dims", "each dim in [1, 2^32]", spec.dims)
    for s in spec.strides:
        if (s * esize) % 16 or not 0 < s * esize < 2 ** 40:
            _fail("strides", "each stride a positive multiple of 16 bytes below 2^40", spec.strides)
    for b in spec.box:
        if not 1 <= b <= 256:
            _fail("box", "each box dim in [1, 256]", spec.box)
    inner_bytes = spec.box[0] * esize
    if inner_bytes % 16:
        _fail("box", "an innermost box extent that is a multiple of 16 bytes", spec.box)
    if spec.swizzle not in SWIZZLE_BYTES:
        _fail("swizzle", "0, 32, 64 or 128 bytes", spec.swizzle)
    if spec.l2_promotion not in L2_PROMOTION_BYTES:
        _fail("L2 promotion", "0, 64, 128 or 256 bytes", spec.l2_promotion)
    if spec.swizzle and inner_bytes > spec.swizzle:
        _fail("box", f"an innermost box extent of at most {spec.swizzle} bytes with {spec.swizzle}B swizzle",
              spec.box)
    return esize


def encode(spec: TmaSpec, global_address: int) -> TmaDescriptor:
    esize = validate(spec, global_address)
    driver = cu()
    dtype = getattr(driver.CUtensorMapDataType, _DTYPES[spec.dtype][0])
    rank = len(spec.dims)
    tensor_map = check(driver.cuTensorMapEncodeTiled(
        dtype, rank, global_address,
        [driver.cuuint64_t(d) for d in spec.dims],
        [driver.cuuint64_t(s * esize) for s in spec.strides],
        [driver.cuuint32_t(b) for b in spec.box],
        [driver.cuuint32_t(1)] * rank,
        driver.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        getattr(driver.CUtensorMapSwizzle, SWIZZLE_BYTES[spec.swizzle]),
        getattr(driver.CUtensorMapL2promotion, L2_PROMOTION_BYTES[spec.l2_promotion]),
        (driver.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA if spec.oob_fill_nan
         else driver.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE),
    ), "cuTensorMapEncodeTiled")
    return TmaDescriptor(tensor_map, spec, global_address)


def tiled(tensor: torch.Tensor, box: Sequence[int], swizzle: int = 0, l2_promotion: int = 128) -> TmaDescriptor:
    """Descriptor over an N-D tensor (outermost first, like torch), box given outermost first."""
    if tensor.stride(-1) != 1:
        raise InvalidArgumentError("tensor", "a contiguous last dim", f"strides {tensor.stride()}")
    spec = TmaSpec(tensor.dtype, tuple(reversed(tensor.shape)), tuple(reversed(tensor.stride()[:-1])),
                   tuple(reversed(tuple(box))), swizzle, l2_promotion=l2_promotion)
    return encode(spec, tensor.data_ptr())
