"""Scratch memory reused across calls on one CUDA stream (split-KV partial outputs and the
arrival counters of the fused combine).

A warm decode call would otherwise spend one allocator round trip (~3 us of host time) on a
scratch buffer that lives only until the call's combine kernel has read it. Work enqueued on
one stream runs in order, so the next call on the same stream can take the same buffer: its
kernels start after the previous call's combine finished. Buffers are therefore keyed by
(device, raw stream handle) and only grow.

While a CUDA graph is being captured the buffer is allocated fresh instead, inside the
graph's memory pool: a graph may be replayed on any stream, concurrently with eager calls or
with other graphs, so it must not share scratch with anything.

Counters are int32 zeros when allocated (inside a capture: a memset node, run at every replay)
and every kernel that uses them leaves them zero again, so one allocation serves every call.
"""
from __future__ import annotations

import threading

import torch

_buffers: dict[tuple[int, int], torch.Tensor] = {}   # float32 partials, per (device, stream)
_counters: dict[tuple[int, int], torch.Tensor] = {}  # int32 zeros (fused-combine arrival counters)
_lock = threading.Lock()

try:
    _capturing = torch._C._cuda_isCurrentStreamCapturing  # ~0.05 us; the public wrapper adds ~1 us
except AttributeError:  # pragma: no cover - torch without the private hook
    _capturing = torch.cuda.is_current_stream_capturing


def _cached(store: dict, key: tuple[int, int], numel: int, like: torch.Tensor, dtype: torch.dtype,
            zeroed: bool) -> torch.Tensor:
    """store[key], replaced by a new buffer of max(numel, 1) elements (zeros if `zeroed`) when
    missing or smaller than `numel`."""
    buf = store.get(key)
    if buf is None or buf.numel() < numel:
        with _lock:
            buf = store.get(key)
            if buf is None or buf.numel() < numel:
                # Freeing the smaller buffer is safe: the caching allocator hands it out again
                # only to work ordered after ours on this stream, or after an event it records.
                shape = (max(numel, 1),)
                buf = store[key] = like.new_zeros(shape, dtype=dtype) if zeroed else like.new_empty(shape, dtype=dtype)
    return buf


def decode_scratch(device_index: int, stream: int, accum_elems: int, counter_elems: int,
                   like: torch.Tensor) -> tuple[int, int, torch.Tensor | None]:
    """(float32 partials pointer, int32 zeroed counters pointer or 0, keep-alive) for one decode
    call on `stream` (the caller's current stream on `like`'s device, `device_index`). Outside a
    capture both buffers are the cached per-stream ones (counters: zero when allocated, and every
    kernel using them leaves them zero). While a graph is captured they are one fresh allocation
    (counters zeroed at its end, a memset node), and the caller holds the returned tensor until the
    kernel is enqueued: two temporaries freed one after the other would be handed the same block
    by the graph's pool."""
    if _capturing():
        buf = like.new_empty((max(accum_elems + counter_elems, 1),), dtype=torch.float32)
        counters_ptr = 0
        if counter_elems:
            buf[accum_elems:].zero_()  # 0.0f and int32 0 share their bits
            counters_ptr = buf.data_ptr() + 4 * accum_elems
        return buf.data_ptr(), counters_ptr, buf
    key = (device_index, stream)
    accum_ptr = _cached(_buffers, key, accum_elems, like, torch.float32, False).data_ptr()
    counters_ptr = 0
    if counter_elems:
        counters_ptr = _cached(_counters, key, counter_elems, like, torch.int32, True).data_ptr()
    return accum_ptr, counters_ptr, None


def release_workspaces() -> None:
    """Drop every cached scratch buffer (their memory goes back to torch's caching allocator)."""
    with _lock:
        _buffers.clear()
        _counters.clear()
