"""torch dtype <-> config name <-> C++ type, in one table."""
from __future__ import annotations

import torch

# name: (torch dtype, C++ type, header the C++ type needs)
_TABLE = {
    "bf16": (torch.bfloat16, "cutlass::bfloat16_t", "cutlass/numeric_types.h"),
    "fp16": (torch.float16, "cutlass::half_t", "cutlass/numeric_types.h"),
    "fp32": (torch.float32, "float", None),
}
_BY_TORCH = {v[0]: k for k, v in _TABLE.items()}


def name_of(dtype: torch.dtype) -> str:
    return _BY_TORCH[dtype]


def torch_dtype(name: str) -> torch.dtype:
    return _TABLE[name][0]


def cpp_type(name: str) -> str:
    return _TABLE[name][1]


def cpp_include(name: str) -> str:
    header = _TABLE[name][2]
    return f'#include "{header}"' if header else ""
