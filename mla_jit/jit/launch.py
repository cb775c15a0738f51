"""Kernel launch through cuLaunchKernelEx with a launch configuration built once.

A `PreparedLaunch` owns the CUlaunchConfig (grid, block, dynamic smem, cluster, PDL) and a
prebuilt `void**` argument block whose slots are refilled in place on every call, so a warm
launch does no allocation and no per-call driver-struct setup: fill slots, set the stream,
launch. Families cache one PreparedLaunch per (kernel, grid, block, smem).

The launch itself calls libcuda's cuLaunchKernelEx through ctypes with C structs built here
(about 2 us less per launch than cuda.bindings' wrapper, which re-reads its Python-side config
object on every call); where libcuda cannot be opened that way, cuda.bindings is used.
"""
from __future__ import annotations

import ctypes
import threading
from typing import Any, Sequence

from .driver import check, cu
from .loader import LoadedKernel

# Parameter kinds. A kind is either a ctypes scalar type or a fixed-size byte blob (structs,
# TMA descriptors) given as Blob(size, align).
PTR = ctypes.c_uint64
I32 = ctypes.c_int32
I64 = ctypes.c_int64
U32 = ctypes.c_uint32
F32 = ctypes.c_float


class Blob:
    """A by-value parameter of `size` bytes (a struct or a CUtensorMap), filled by memmove."""

    def __init__(self, size: int, align: int = 8):
        self.size = size
        self.align = align


TMA_DESC = Blob(128, 64)

# C layouts of cuda.h's CUlaunchAttribute and CUlaunchConfig (CUDA 12/13).
_ATTR_CLUSTER_DIMENSION = 4
_ATTR_PROGRAMMATIC_STREAM_SERIALIZATION = 6


class _LaunchAttribute(ctypes.Structure):
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_uint32 * 16)]


class _LaunchConfig(ctypes.Structure):
    _fields_ = [("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint), ("gridDimZ", ctypes.c_uint),
                ("blockDimX", ctypes.c_uint), ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
                ("sharedMemBytes", ctypes.c_uint), ("hStream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(_LaunchAttribute)), ("numAttrs", ctypes.c_uint)]


_libcuda_launch = None


def _direct_launch_function():
    """libcuda's cuLaunchKernelEx as a ctypes function, or None."""
    global _libcuda_launch
    if _libcuda_launch is None:
        try:
            fn = ctypes.CDLL("libcuda.so.1").cuLaunchKernelEx
            fn.restype = ctypes.c_int
            _libcuda_launch = fn
        except (OSError, AttributeError):
            _libcuda_launch = False
    return _libcuda_launch or None


class Immutable:
    """Base of by-value parameter sources that never change after construction (a TMA
    descriptor): a launch that gets the same object again skips copying it."""

    __slots__ = ()
    address: int


class _BlobSlot:
    __slots__ = ("raw", "address", "size", "last")

    def __init__(self, blob: Blob):
        self.raw = (ctypes.c_uint8 * (blob.size + blob.align))()
        base = ctypes.addressof(self.raw)
        self.address = base + (-base) % blob.align
        self.size = blob.size
        self.last = None  # the immutable source copied last (TMA descriptors), to skip re-copying


class PreparedLaunch:
    def __init__(self, kernel: LoadedKernel, params: Sequence[Any], grid: tuple[int, int, int],
                 block: tuple[int, int, int], dynamic_smem: int = 0,
                 cluster: tuple[int, int, int] | None = None, pdl: bool = False):
        self.kernel = kernel
        attrs: list[tuple[int, tuple[int, ...]]] = []
        if cluster is not None and cluster != (1, 1, 1):
            attrs.append((_ATTR_CLUSTER_DIMENSION, tuple(cluster)))
        if pdl:
            attrs.append((_ATTR_PROGRAMMATIC_STREAM_SERIALIZATION, (1,)))
        self._direct = _direct_launch_function()
        if self._direct is not None:
            self._attr_array = (_LaunchAttribute * max(1, len(attrs)))()
            for slot, (attr_id, values) in zip(self._attr_array, attrs):
                slot.id = attr_id
                for i, v in enumerate(values):
                    slot.value[i] = v
            config = _LaunchConfig(*grid, *block, dynamic_smem, None,
                                   ctypes.cast(self._attr_array, ctypes.POINTER(_LaunchAttribute)), len(attrs))
            self._config_ref = ctypes.byref(config)
            self._function_ptr = ctypes.c_void_p(int(kernel.function))
        else:
            driver = cu()
            config = driver.CUlaunchConfig()
            config.gridDimX, config.gridDimY, config.gridDimZ = grid
            config.blockDimX, config.blockDimY, config.blockDimZ = block
            config.sharedMemBytes = dynamic_smem
            driver_attrs = []
            for attr_id, values in attrs:
                attr = driver.CUlaunchAttribute()
                attr.id = driver.CUlaunchAttributeID(attr_id)
                if attr_id == _ATTR_CLUSTER_DIMENSION:
                    attr.value.clusterDim.x, attr.value.clusterDim.y, attr.value.clusterDim.z = values
                else:
                    attr.value.programmaticStreamSerializationAllowed = 1
                driver_attrs.append(attr)
            config.attrs = driver_attrs
            config.numAttrs = len(driver_attrs)
            self._attrs = driver_attrs  # keep alive: config holds raw pointers into them
            self._launch = driver.cuLaunchKernelEx
        self._config = config
        self._function = kernel.function
        self._scalars: list[tuple[int, Any]] = []
        self._blobs: list[tuple[int, _BlobSlot]] = []
        addresses = []
        for i, kind in enumerate(params):
            if isinstance(kind, Blob):
                slot = _BlobSlot(kind)
                self._blobs.append((i, slot))
                addresses.append(slot.address)
            else:
                value = kind()
                self._scalars.append((i, value))
                addresses.append(ctypes.addressof(value))
        self._arity = len(params)
        self._arg_block = (ctypes.c_void_p * max(1, len(params)))(*addresses)
        self._arg_block_address = ctypes.addressof(self._arg_block)
        self._arg_block_ptr = ctypes.c_void_p(self._arg_block_address)
        self._lock = threading.Lock()
        self._stream = None

    def __call__(self, stream: int, *args) -> None:
        """Launch on `stream` (a raw cudaStream_t handle, e.g. torch's stream.cuda_stream).

        Scalars are given as Python numbers; Blob parameters as an Immutable (a TmaDescriptor),
        `bytes` of the blob's size (struct.pack), or a ctypes object of that size.
        """
        if len(args) != self._arity:
            raise TypeError(f"{self.kernel.name} takes {self._arity} arguments, got {len(args)}")
        with self._lock:  # the slots are shared: one launch fills and enqueues at a time
            for i, slot in self._scalars:
                slot.value = args[i]
            for i, slot in self._blobs:
                value = args[i]
                if value is slot.last:
                    continue
                if type(value) is bytes:  # packed params (struct.pack): the common case
                    ctypes.memmove(slot.address, value, slot.size)
                    slot.last = None
                elif isinstance(value, Immutable):
                    ctypes.memmove(slot.address, value.address, slot.size)
                    slot.last = value
                else:
                    ctypes.memmove(slot.address, ctypes.addressof(value), slot.size)
                    slot.last = None
            if stream != self._stream:
                self._config.hStream = stream
                self._stream = stream
            if self._direct is not None:
                err = self._direct(self._config_ref, self._function_ptr, self._arg_block_ptr, None)
            else:
                err = self._launch(self._config, self._function, self._arg_block_address, 0)[0]
        if err:
            check((cu().CUresult(int(err)),), f"launching {self.kernel.name}")
