"""Timing shared by the benchmarks: CUDA events, L2 flushed before each call, variants interleaved."""
import statistics

import torch


def time_interleaved(variants, flush: torch.Tensor, iters: int = 20) -> list[float]:
    """Median us of each (setup, call) variant, the variants alternating call by call; `setup`
    (e.g. an env var switch) runs outside the timed window, the L2 is flushed before each call."""
    for setup, fn in variants:
        setup()
        for _ in range(3):
            fn()
    times = [[] for _ in variants]
    for _ in range(iters):
        for k, (setup, fn) in enumerate(variants):
            setup()
            flush.zero_()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times[k].append(start.elapsed_time(end) * 1e3)
    return [statistics.median(t) for t in times]
