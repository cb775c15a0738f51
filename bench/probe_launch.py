"""Host cost of one kernel launch, by launch path: what a warm decode call's launch could cost.

An empty kernel with the split-KV kernel's parameters (a 160-byte struct and a 128-byte TMA
descriptor, by value), grid 132 x 384 threads, launched N times per path; per-call host time is the
median of rounds, enqueued while a sleep kernel holds the GPU (timing.host_time_us).
Paths: mla_jit's PreparedLaunch (cuda.bindings cuLaunchKernelEx), cuda.bindings cuLaunchKernel,
and libcuda's cuLaunchKernel / cuLaunchKernelEx called through ctypes.
Usage: python bench/probe_launch.py"""
from __future__ import annotations

import ctypes
import sys
from pathlib import Path

import torch

from mla_jit.jit.arch import resolve_for_device
from mla_jit.jit.build import KernelSource, build
from mla_jit.jit.driver import cu
from mla_jit.jit.launch import TMA_DESC, Blob, Immutable, PreparedLaunch
from mla_jit.jit.loader import get_kernel

sys.path.insert(0, str(Path(__file__).parent))
from timing import host_time_us  # noqa: E402

SOURCE = r"""
struct Params { long long w[20]; };
struct alignas(64) Desc { long long w[16]; };
extern "C" __global__ void probe_empty(const __grid_constant__ Params p, const __grid_constant__ Desc d) {}
"""
GRID, BLOCK = (132, 1, 1), (384, 1, 1)


class _Desc(Immutable):
    __slots__ = ("raw", "address")

    def __init__(self):
        self.raw = (ctypes.c_uint8 * 192)()
        base = ctypes.addressof(self.raw)
        self.address = base + (-base) % 64


def per_call_us(fn) -> float:
    return host_time_us(fn, calls=500, rounds=9)


class _LaunchConfig(ctypes.Structure):  # CUlaunchConfig
    _fields_ = [("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint), ("gridDimZ", ctypes.c_uint),
                ("blockDimX", ctypes.c_uint), ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
                ("sharedMemBytes", ctypes.c_uint), ("hStream", ctypes.c_void_p), ("attrs", ctypes.c_void_p),
                ("numAttrs", ctypes.c_uint)]


def main() -> None:
    torch.cuda.init()
    arch = resolve_for_device(0)
    binary = build(KernelSource("probe_empty_launch", SOURCE, ("probe_empty",), arch, "none"))
    kernel = get_kernel(binary, "probe_empty", 0)
    stream = torch.cuda.current_stream().cuda_stream
    params, desc = bytes(160), _Desc()
    prepared = PreparedLaunch(kernel, (Blob(160), TMA_DESC), GRID, BLOCK)
    prepared(stream, params, desc)
    driver = cu()
    arg_block = prepared._arg_block_address
    func = kernel.function

    libcuda = ctypes.CDLL("libcuda.so.1")
    launch = libcuda.cuLaunchKernel
    launch.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
    launch.restype = ctypes.c_int
    func_ptr = int(func)
    launch_ex = libcuda.cuLaunchKernelEx
    launch_ex.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    launch_ex.restype = ctypes.c_int
    cfg = _LaunchConfig(*GRID, *BLOCK, 0, stream, None, 0)
    cfg_ptr = ctypes.addressof(cfg)
    assert launch(func_ptr, *GRID, *BLOCK, 0, stream, arg_block, None) == 0
    assert launch_ex(cfg_ptr, func_ptr, arg_block, None) == 0

    # The same empty kernel with the split-KV kernel's 227 KB of dynamic shared memory, without and
    # with the preferred carveout set to all-shared.
    smem = 227 * 1024
    big = get_kernel(build(KernelSource("probe_empty_launch_smem", SOURCE.replace("probe_empty", "probe_empty_smem"),
                                        ("probe_empty_smem",), arch, "none")), "probe_empty_smem", 0, smem)
    prepared_big = PreparedLaunch(big, (Blob(160), TMA_DESC), GRID, BLOCK, dynamic_smem=smem)
    prepared_big(stream, params, desc)
    big_carve = get_kernel(build(KernelSource("probe_empty_launch_carve",
                                              SOURCE.replace("probe_empty", "probe_empty_carve"),
                                              ("probe_empty_carve",), arch, "none")), "probe_empty_carve", 0, smem)
    attr = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT
    driver.cuFuncSetAttribute(big_carve.function, attr, 100)
    prepared_carve = PreparedLaunch(big_carve, (Blob(160), TMA_DESC), GRID, BLOCK, dynamic_smem=smem)
    prepared_carve(stream, params, desc)

    rows = {
        "PreparedLaunch, 227 KB dynamic smem": lambda: prepared_big(stream, params, desc),
        "PreparedLaunch, 227 KB, carveout 100%": lambda: prepared_carve(stream, params, desc),
        "PreparedLaunch (cuda.bindings cuLaunchKernelEx)": lambda: prepared(stream, params, desc),
        "cuda.bindings cuLaunchKernel": lambda: driver.cuLaunchKernel(func, *GRID, *BLOCK, 0, stream, arg_block, 0),
        "ctypes cuLaunchKernel": lambda: launch(func_ptr, 132, 1, 1, 384, 1, 1, 0, stream, arg_block, None),
        "ctypes cuLaunchKernelEx": lambda: launch_ex(cfg_ptr, func_ptr, arg_block, None),
        "ctypes memmove 160 B (param refill)": lambda: ctypes.memmove(arg_block and prepared._blobs[0][1].address,
                                                                    params, 160),
    }
    print(torch.cuda.get_device_name(0))
    for name, fn in rows.items():
        print(f"{name:50} {per_call_us(fn):6.2f} us")


if __name__ == "__main__":
    main()
