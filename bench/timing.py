"""Timing shared by the benchmarks: CUDA events, L2 flushed before each call, variants interleaved."""
import statistics
import time

import torch


def time_interleaved(variants, flush, iters: int = 20) -> list[float]:
    """Median us of each (setup, call) variant, the variants alternating call by call; `setup`
    (e.g. an env var switch) runs outside the timed window, the L2 is flushed before each call
    (flush: a tensor that is zeroed, or a function that flushes)."""
    flush_l2 = flush if callable(flush) else flush.zero_
    for setup, fn in variants:
        setup()
        for _ in range(3):
            fn()
    times = [[] for _ in variants]
    for _ in range(iters):
        for k, (setup, fn) in enumerate(variants):
            setup()
            flush_l2()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times[k].append(start.elapsed_time(end) * 1e3)
    return [statistics.median(t) for t in times]


def host_time_us(fn, calls: int = 200, rounds: int = 10) -> float:
    """Host (enqueue) time of fn per call, median of rounds. The GPU is held busy by a sleep
    kernel while a round is enqueued, so the figure is host work alone: without it, a call whose
    GPU time exceeds its host time would be timed at the GPU's pace (the launch queue fills)."""
    samples = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        torch.cuda._sleep(100_000_000)  # ~50 ms of GPU time: longer than the round's enqueueing
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - t0) / calls * 1e6)
        torch.cuda.synchronize()
    return statistics.median(samples)


def host_times_interleaved(fns: dict, calls: int = 200, rounds: int = 30) -> dict[str, float]:
    """host_time_us of each function, the functions taking turns round by round, in an order that
    rotates every round (host speed drifts, and a variant's time depends on what ran before it:
    compare variants only within one such run)."""
    samples: dict[str, list[float]] = {name: [] for name in fns}
    names = list(fns)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            samples[name].append(host_time_us(fns[name], calls=calls, rounds=1))
    return {name: statistics.median(values) for name, values in samples.items()}
