"""Thin checked wrappers over cuda.bindings.driver."""
from __future__ import annotations

import contextlib
import functools

from ..errors import LaunchError


def cu():
    from cuda.bindings import driver
    return driver


def check(result, what: str):
    """Unpack a cuda.bindings (err, *values) tuple, raising LaunchError on failure."""
    driver = cu()
    err = result[0] if isinstance(result, tuple) else result
    if err != driver.CUresult.CUDA_SUCCESS:
        _, name = driver.cuGetErrorName(err)
        _, text = driver.cuGetErrorString(err)
        raise LaunchError(f"{what} failed: {name.decode() if name else err} "
                          f"({text.decode() if text else ''})")
    if not isinstance(result, tuple) or len(result) == 1:
        return None
    return result[1] if len(result) == 2 else result[1:]


@functools.lru_cache(maxsize=1)
def init() -> None:
    check(cu().cuInit(0), "cuInit")


_primary: dict[int, int] = {}   # device index -> its primary context handle (retained once per process)


def primary_context(device_index: int):
    """torch's (primary) context of `device_index`, retained once per process."""
    import torch
    driver = cu()
    ctx = _primary.get(device_index)
    if ctx is None:
        torch.cuda.init()
        init()
        dev = check(driver.cuDeviceGet(device_index), "cuDeviceGet")
        ctx = _primary.setdefault(device_index, check(driver.cuDevicePrimaryCtxRetain(dev),
                                                      "cuDevicePrimaryCtxRetain"))
    return ctx


@contextlib.contextmanager
def device_context(device_index: int):
    """Run the block with `device_index`'s primary context current on this thread, and give the
    thread back the context it had (none, or another device's). Loading a kernel binds its function
    to the current context, so this must hold whatever device the caller's thread is on (cold paths
    only: loading, occupancy queries; launches switch through torch's device guard)."""
    driver = cu()
    ctx = primary_context(device_index)
    current = check(driver.cuCtxGetCurrent(), "cuCtxGetCurrent")
    if current is not None and int(current) == int(ctx):
        yield
        return
    check(driver.cuCtxPushCurrent(ctx), "cuCtxPushCurrent")
    try:
        yield
    finally:
        check(driver.cuCtxPopCurrent(), "cuCtxPopCurrent")
