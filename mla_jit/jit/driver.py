"""Thin checked wrappers over cuda.bindings.driver."""
from __future__ import annotations

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


def ensure_context(device_index: int) -> None:
    """Make torch's (primary) context of `device_index` current on this thread."""
    import torch
    torch.cuda.init()
    driver = cu()
    init()
    ctx = check(driver.cuCtxGetCurrent(), "cuCtxGetCurrent")
    if ctx is None or int(ctx) == 0:
        dev = check(driver.cuDeviceGet(device_index), "cuDeviceGet")
        primary = check(driver.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
        check(driver.cuCtxSetCurrent(primary), "cuCtxSetCurrent")
