"""Kernel launch through cuLaunchKernelEx (cuLaunchKernel when there are no launch attributes)
with a launch configuration built once.

A `PreparedLaunch` owns the CUlaunchConfig (grid, block, dynamic smem, cluster, PDL) and a
prebuilt `void**` argument block whose slots are refilled in place on every call, so a warm
launch does no allocation and no per-call driver-struct setup: fill slots, set the stream,
launch. Families cache one PreparedLaunch per (kernel, grid, block, smem).
"""
from __future__ import annotations

import ctypes
import threading
from typing import Any, Sequence

from .driver import check, cu, device_context
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


def _launch_config(grid: tuple[int, int, int], block: tuple[int, int, int], dynamic_smem: int,
                   cluster: tuple[int, int, int] | None, pdl: bool) -> tuple[Any, list]:
    """A CUlaunchConfig and the attributes it points into (keep both alive together)."""
    driver = cu()
    config = driver.CUlaunchConfig()
    config.gridDimX, config.gridDimY, config.gridDimZ = grid
    config.blockDimX, config.blockDimY, config.blockDimZ = block
    config.sharedMemBytes = dynamic_smem
    attrs = []
    if cluster is not None:
        attr = driver.CUlaunchAttribute()
        attr.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        attr.value.clusterDim.x, attr.value.clusterDim.y, attr.value.clusterDim.z = cluster
        attrs.append(attr)
    if pdl:
        attr = driver.CUlaunchAttribute()
        attr.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        attr.value.programmaticStreamSerializationAllowed = 1
        attrs.append(attr)
    config.attrs = attrs
    config.numAttrs = len(attrs)
    return config, attrs


class PreparedLaunch:
    def __init__(self, kernel: LoadedKernel, params: Sequence[Any], grid: tuple[int, int, int],
                 block: tuple[int, int, int], dynamic_smem: int = 0,
                 cluster: tuple[int, int, int] | None = None, pdl: bool = False):
        driver = cu()
        self.kernel = kernel
        self.cluster = cluster if cluster != (1, 1, 1) else None
        config, attrs = _launch_config(grid, block, dynamic_smem, self.cluster, pdl)
        self._attrs = attrs  # keep alive: config holds raw pointers into them
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
        self._lock = threading.Lock()
        self._launch = driver.cuLaunchKernelEx
        # Without launch attributes, cuLaunchKernel does the same with ~0.9 us less host time
        # (bench/probe_launch.py): it takes plain integers instead of the config struct.
        self._plain = None if attrs else (driver.cuLaunchKernel, self._function, *grid, *block, dynamic_smem)
        self._stream = None
        self._grid = self._config_grid = tuple(grid)
        self._device = kernel.device_index
        import torch  # (not at module level: the CLI imports this module without torch)
        # ~0.1 us; the public torch.cuda.current_device adds lazy-init checks
        self._current_device = getattr(torch._C, "_cuda_getDevice", torch.cuda.current_device)
        self._device_guard = torch.cuda.device

    def __call__(self, stream: int, *args, grid: tuple[int, int, int] | None = None) -> None:
        """Launch on `stream` (a raw cudaStream_t handle of the kernel's device, e.g. torch's
        stream.cuda_stream), whatever device is current on this thread.

        Scalars are given as Python numbers; Blob parameters as an Immutable (a TmaDescriptor),
        `bytes` of the blob's size (struct.pack), or a ctypes object of that size. `grid` replaces
        the prepared grid for this launch (kernels whose grid follows the call's lengths).
        """
        if self._current_device() != self._device:
            # The caller's thread is on another GPU: enqueue from this kernel's context, then go back
            # (inside the guard the check passes: one level of recursion, none on the common path).
            with self._device_guard(self._device):
                return self(stream, *args, grid=grid)
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
            plain = self._plain
            if plain is not None:
                launch, f, gx, gy, gz, bx, by, bz, smem = plain
                if grid is not None:
                    gx, gy, gz = grid
                err = launch(f, gx, gy, gz, bx, by, bz, smem, stream, self._arg_block_address, 0)[0]
            else:
                if stream != self._stream:
                    self._config.hStream = stream
                    self._stream = stream
                grid = grid or self._grid
                if grid != self._config_grid:
                    self._config.gridDimX, self._config.gridDimY, self._config.gridDimZ = grid
                    self._config_grid = grid
                err = self._launch(self._config, self._function, self._arg_block_address, 0)[0]
        if err:
            check((err,), f"launching {self.kernel.name}")


def max_active_clusters(kernel: LoadedKernel, grid: tuple[int, int, int], block: tuple[int, int, int],
                        dynamic_smem: int, cluster: tuple[int, int, int]) -> int:
    """How many clusters of `cluster` CTAs of this kernel the GPU keeps resident at once
    (cuOccupancyMaxActiveClusters): an SM's neighbours in its GPC bound it, not the SM count alone."""
    config, _attrs = _launch_config(grid, block, dynamic_smem, cluster, pdl=False)
    with device_context(kernel.device_index):
        return int(check(cu().cuOccupancyMaxActiveClusters(kernel.function, config),
                         f"cuOccupancyMaxActiveClusters({kernel.name})"))
