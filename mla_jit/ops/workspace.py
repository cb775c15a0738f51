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

_buffers: dict[tuple[int, int], torch.Tensor] = {}
_lock = threading.Lock()

try:
    _capturing = torch._C._cuda_isCurrentStreamCapturing  # ~0.05 us; the public wrapper adds ~1 us
except AttributeError:  # pragma: no cover - torch without the private hook
    _capturing = torch.cuda.is_current_stream_capturing


def _per_stream(store: dict, device_index: int, stream: int, numel: int, make) -> torch.Tensor:
    """store[(device, stream)], replaced by make(numel) when missing or smaller than `numel`; while
    a graph is captured, a fresh make(numel) (inside the graph's pool)."""
    if _capturing():
        return make(numel)
    key = (device_index, stream)
    buf = store.get(key)
    if buf is None or buf.numel() < numel:
        with _lock:
            buf = store.get(key)
            if buf is None or buf.numel() < numel:
                # Freeing the smaller buffer is safe: the caching allocator hands it out again
                # only to work ordered after ours on this stream, or after an event it records.
                buf = store[key] = make(numel)
    return buf


def float32_scratch(device_index: int, stream: int, numel: int, like: torch.Tensor) -> torch.Tensor:
    """A float32 buffer of at least `numel` elements on `like`'s device (`device_index`), private
    to work enqueued on `stream` (the caller's current stream there) in call order."""
    return _per_stream(_buffers, device_index, stream, numel,
                       lambda n: like.new_empty((max(n, 1),), dtype=torch.float32))


_counters: dict[tuple[int, int], torch.Tensor] = {}


def zeroed_int32_counters(device_index: int, stream: int, numel: int, like: torch.Tensor) -> torch.Tensor:
    """An int32 buffer of at least `numel` zeros on `like`'s device, private to work enqueued on
    `stream`, which must leave it zero (the fused combine's arrival counters). Not for graph
    capture: see decode_scratch."""
    return _per_stream(_counters, device_index, stream, numel,
                       lambda n: like.new_zeros((max(n, 1),), dtype=torch.int32))


def decode_scratch(device_index: int, stream: int, accum_elems: int, counter_elems: int,
                   like: torch.Tensor) -> tuple[int, int, torch.Tensor | None]:
    """(float32 partials pointer, int32 zeroed counters pointer or 0, keep-alive) for one decode
    call on `stream`. Outside a capture both buffers are the cached per-stream ones. While a graph
    is captured they are one fresh allocation (counters zeroed at its end, a memset node), and
    the caller holds the returned tensor until the kernel is enqueued: two temporaries freed
    one after the other would be handed the same block by the graph's pool."""
    if _capturing():
        buf = like.new_empty((max(accum_elems + counter_elems, 1),), dtype=torch.float32)
        counters_ptr = 0
        if counter_elems:
            buf[accum_elems:].zero_()  # 0.0f and int32 0 share their bits
            counters_ptr = buf.data_ptr() + 4 * accum_elems
        return buf.data_ptr(), counters_ptr, buf
    accum_ptr = float32_scratch(device_index, stream, accum_elems, like).data_ptr()
    counters_ptr = 0
    if counter_elems:
        counters_ptr = zeroed_int32_counters(device_index, stream, counter_elems, like).data_ptr()
    return accum_ptr, counters_ptr, None


def release_workspaces() -> None:
    """Drop every cached scratch buffer (their memory goes back to torch's caching allocator)."""
    with _lock:
        _buffers.clear()
        _counters.clear()
