"""cubin -> kernel handles: one library per binary per process, one CUfunction per device."""
from __future__ import annotations

import threading
from dataclasses import dataclass

from .build import Binary
from .driver import check, cu, device_context, init


@dataclass(frozen=True)
class LoadedKernel:
    name: str
    function: object      # CUfunction, valid in the device's primary context
    device_index: int
    max_dynamic_smem: int


_libraries: dict[str, object] = {}
_functions: dict[tuple[str, str, int], LoadedKernel] = {}
_lock = threading.Lock()


def _library(binary: Binary):
    lib = _libraries.get(binary.key)
    if lib is None:
        init()
        lib = check(cu().cuLibraryLoadData(binary.cubin, None, None, 0, None, None, 0), "cuLibraryLoadData")
        _libraries[binary.key] = lib
    return lib


def get_kernel(binary: Binary, entry: str, device_index: int, dynamic_smem: int = 0) -> LoadedKernel:
    """The launchable kernel `entry` of `binary` on `device_index`, with its smem limit raised."""
    memo = (binary.key, entry, device_index)
    if (hit := _functions.get(memo)) is not None and hit.max_dynamic_smem >= dynamic_smem:
        return hit
    driver = cu()
    with _lock, device_context(device_index):
        kernel = check(driver.cuLibraryGetKernel(_library(binary), entry.encode()), f"cuLibraryGetKernel({entry})")
        function = check(driver.cuKernelGetFunction(kernel), "cuKernelGetFunction")
        if dynamic_smem > 0:
            attr = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
            check(driver.cuFuncSetAttribute(function, attr, dynamic_smem),
                  f"setting {dynamic_smem} B of dynamic shared memory on {entry}")
        loaded = LoadedKernel(entry, function, device_index, dynamic_smem)
        _functions[memo] = loaded
        return loaded


def is_loaded(binary_key: str, entry: str, device_index: int) -> bool:
    return (binary_key, entry, device_index) in _functions


def read_global_int32(binary: Binary, symbol: str, device_index: int) -> int:
    """Value of an `extern "C" __device__ const int` in the binary (read once at load time)."""
    import ctypes
    driver = cu()
    with _lock, device_context(device_index):
        dptr, size = check(driver.cuLibraryGetGlobal(_library(binary), symbol.encode()),
                           f"cuLibraryGetGlobal({symbol})")
        value = ctypes.c_int32()
        check(driver.cuMemcpyDtoH(ctypes.addressof(value), dptr, 4), f"reading {symbol}")
    return value.value


def global_address(binary: Binary, symbol: str, device_index: int) -> tuple[int, int]:
    """(device address, size in bytes) of an `extern "C" __device__` variable of the binary."""
    driver = cu()
    with _lock, device_context(device_index):
        dptr, size = check(driver.cuLibraryGetGlobal(_library(binary), symbol.encode()),
                           f"cuLibraryGetGlobal({symbol})")
    return int(dptr), int(size)
