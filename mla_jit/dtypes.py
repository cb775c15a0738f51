"""torch dtype <-> config name <-> C++ type, in one table.

torch is imported on first use of a torch dtype, not at import: kernel families (and so the
`mla-jit` CLI) render C++ types without it.
"""
from __future__ import annotations

# name: (torch dtype attribute, C++ type, header the C++ type needs)
_TABLE = {
    "bf16": ("bfloat16", "cutlass::bfloat16_t", "cutlass/numeric_types.h"),
    "fp16": ("float16", "cutlass::half_t", "cutlass/numeric_types.h"),
    "fp32": ("float32", "float", None),
    "e4m3": ("float8_e4m3fn", "cutlass::float_e4m3_t", "cutlass/numeric_types.h"),
}
_BY_TORCH: dict = {}    # torch.dtype -> name, filled on first use
_TORCH: dict = {}       # name -> torch.dtype


def _fill() -> None:
    import torch
    for name, (attr, _, _) in _TABLE.items():
        _TORCH[name] = getattr(torch, attr)
        _BY_TORCH[getattr(torch, attr)] = name


def name_of(dtype) -> str:
    try:
        return _BY_TORCH[dtype]
    except KeyError:
        if _BY_TORCH:
            raise
    _fill()
    return _BY_TORCH[dtype]


def torch_dtype(name: str):
    if not _TORCH:
        _fill()
    return _TORCH[name]


def cpp_type(name: str) -> str:
    return _TABLE[name][1]


def cpp_include(name: str) -> str:
    header = _TABLE[name][2]
    return f'#include "{header}"' if header else ""
