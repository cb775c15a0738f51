"""The fixed cost of one fp8_paged_mqa_logits call against its bandwidth, batch 64 (the rows whose
goal is 1.2x DeepGEMM): average contexts of 64 keys (one or two tiles an entry: launch, start-up
and tail only) up to 32768, next_n 1 and 2, all interleaved call by call as bench_indexer.py times
them (CUDA events, the benchmark's 8 GB L2 flush before each call, median of 20), then each call's
kernel alone (torch.profiler, median of 5), and for reference a device copy and a read-only pass (a
max reduction) over the longest row's key bytes, timed the same way. time = fixed + key bytes /
bandwidth says what is left to cut where.

Usage: python3 bench/probe_paged_floor.py
"""
import statistics

import torch
from torch.profiler import ProfilerActivity, profile

import mla_jit
from bench_indexer import D, paged_inputs
from timing import time_interleaved

AVG_CONTEXTS = (64, 2048, 8192, 32768)


def main() -> None:
    flush = torch.empty(8 << 30, dtype=torch.uint8, device="cuda")   # as bench_indexer.py
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    calls, key_bytes = {}, {}
    for next_n in (1, 2):
        for avg in AVG_CONTEXTS:
            q, cache, weights, lens, table = paged_inputs(64, next_n, avg, torch.Generator(device="cuda").manual_seed(1))
            schedule = mla_jit.get_paged_mqa_logits_metadata(lens, 64, sms)
            max_len = int(lens.max()) + 64
            calls[next_n, avg] = (lambda q=q, cache=cache, weights=weights, lens=lens, table=table, schedule=schedule,
                                  max_len=max_len: mla_jit.fp8_paged_mqa_logits(q, cache, weights, lens, table,
                                                                                schedule, max_len))
            key_bytes[next_n, avg] = int(((lens.long() + 63) // 64).sum()) * 64 * (D + 4)
    event_us = dict(zip(calls, time_interleaved([(lambda: None, c) for c in calls.values()], flush)))
    kernel_us = {}
    for key, call in calls.items():
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                flush.zero_()
                call()
            torch.cuda.synchronize()
        times = [e.device_time for e in prof.events() if e.name.startswith("mla_jit_indexer_paged")]
        kernel_us[key] = statistics.median(times) if times else float("nan")
    print("fp8_paged_mqa_logits, batch 64 (us: events as the benchmark; kernel: the kernel alone):")
    print(f"{'next_n':>6} {'avg ctx':>8} {'key MB':>8} {'us':>8} {'kernel us':>10} {'GB/s':>8} {'GB/s past 64 keys':>18}")
    for (next_n, avg), t in event_us.items():
        nbytes, t0, b0 = key_bytes[next_n, avg], event_us[next_n, 64], key_bytes[next_n, 64]
        inc = (nbytes - b0) / (t - t0) / 1e3 if avg != 64 else float("nan")
        print(f"{next_n:>6} {avg:>8} {nbytes / 1e6:>8.1f} {t:>8.1f} {kernel_us[next_n, avg]:>10.1f} "
              f"{nbytes / t / 1e3:>8.0f} {inc:>18.0f}")
    src = torch.zeros(max(key_bytes.values()), dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    words = src.view(torch.int32)
    t_copy, t_read = time_interleaved([(lambda: None, lambda: dst.copy_(src)), (lambda: None, words.max)], flush)
    print(f"device copy of {src.numel() / 1e6:.1f} MB: {t_copy:.1f} us, {2 * src.numel() / t_copy / 1e3:.0f} GB/s "
          f"(read + write); a max reduction over it: {t_read:.1f} us, {src.numel() / t_read / 1e3:.0f} GB/s (read)")


if __name__ == "__main__":
    main()
