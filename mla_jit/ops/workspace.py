"""Scratch memory reused across calls on one CUDA stream (split-KV partial outputs).

A warm decode call would otherwise spend one allocator round trip (~3 us of host time) on a
scratch buffer that lives only until the call's combine kernel has read it. Work enqueued on
one stream runs in order, so the next call on the same stream can take the same buffer: its
kernels start after the previous call's combine finished. Buffers are therefore keyed by
(device, raw stream handle) and only grow.

While a CUDA graph is being captured the buffer is allocated fresh instead, inside the
graph's memory pool: a graph may be replayed on any stream, concurrently with eager calls or
with other graphs, so it must not share scratch with anything.
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


def float32_scratch(device_index: int, stream: int, numel: int, like: torch.Tensor) -> torch.Tensor:
    """A float32 buffer of at least `numel` elements on `like`'s device (`device_index`), private
    to work enqueued on `stream` (the caller's current stream there) in call order."""
    if _capturing():
        return like.new_empty((numel,), dtype=torch.float32)
    key = (device_index, stream)
    buf = _buffers.get(key)
    if buf is None or buf.numel() < numel:
        with _lock:
            buf = _buffers.get(key)
            if buf is None or buf.numel() < numel:
                # Freeing the smaller buffer is safe: the caching allocator hands it out again
                # only to work ordered after ours on this stream, or after an event it records.
                buf = _buffers[key] = like.new_empty((max(numel, 1),), dtype=torch.float32)
    return buf


def release_workspaces() -> None:
    """Drop every cached scratch buffer (their memory goes back to torch's caching allocator)."""
    with _lock:
        _buffers.clear()
