"""Device properties the launch plans size their grids with (queried once per device)."""
from __future__ import annotations

import functools

import torch


@functools.lru_cache(maxsize=None)
def _properties(device_index: int):
    return torch.cuda.get_device_properties(device_index)


def num_sms(device_index: int) -> int:
    return _properties(device_index).multi_processor_count


def smem_per_sm(device_index: int) -> int:
    return _properties(device_index).shared_memory_per_multiprocessor


def l2_bytes(device_index: int) -> int:
    return _properties(device_index).L2_cache_size
