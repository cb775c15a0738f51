"""How far the memory-bound FP8 decode rows are from their bytes, and what the benchmark's L2 flush
costs them. For the h_q <= 64, s_q 1 anchor rows: our bf16 and FP8 decode and a read-only pass (a
max reduction) over each one's cache bytes (the tokens the lengths cover, contiguous), all
interleaved call by call, timed twice: after the benchmarks' flush (8 GB zeroed: the L2 is left
full of dirty lines that the timed call then writes back), and after that flush followed by a read
of 256 MB (the L2 then holds clean lines only). The benchmarks keep the first; the second says how
much of a short row's time is the flush's write-back rather than the kernel.

Usage: python3 bench/probe_decode_floor.py
"""
import functools

import torch

import mla_jit
from bench_decode import DV, H_KV, flop_and_bytes, make_inputs, quantize_e4m3
from timing import time_interleaved

SHAPES = [(32, 1, 4096, 16), (32, 1, 32768, 16), (32, 1, 4096, 64), (32, 1, 32768, 64),
          (128, 1, 1024, 16), (128, 1, 4096, 16), (128, 1, 32768, 16), (128, 1, 4096, 64)]


def main() -> None:
    flush = torch.empty(8 << 30, dtype=torch.uint8, device="cuda")
    clean = torch.zeros(256 << 20, dtype=torch.uint8, device="cuda").view(torch.int32)
    flushes = {"dirty": flush.zero_, "clean": lambda: (flush.zero_(), clean.max())}
    print(f"{'b':>4} {'sk':>6} {'hq':>4} {'L2':>5} {'bf16 us':>8} {'fp8 us':>8} {'ratio':>6} {'read8 us':>9} "
          f"{'read16 us':>9} {'fp8/read8':>9} {'fp8 GB/s':>8}")
    for b, s_q, s_k, h_q in SHAPES:
        q, k_cache, block_table, lens = make_inputs(b, s_q, s_k, h_q)
        (q8, descale_q), (k8, descale_k) = quantize_e4m3(q), quantize_e4m3(k_cache)
        metadata, num_splits = mla_jit.get_mla_metadata(lens, s_q * h_q // H_KV, H_KV)
        common = (block_table, lens, DV, metadata, num_splits)
        bf16 = functools.partial(mla_jit.flash_mla_with_kvcache, q, k_cache, *common)
        fp8 = functools.partial(mla_jit.flash_mla_with_kvcache_fp8, q8, k8, *common,
                                descale_q=descale_q, descale_k=descale_k)
        tokens = int(lens.long().sum())
        bytes8 = torch.zeros(tokens * k_cache.shape[-1], dtype=torch.uint8, device="cuda").view(torch.int32)
        bytes16 = torch.zeros(2 * bytes8.numel(), dtype=torch.int32, device="cuda")
        _, nbytes = flop_and_bytes(b, s_q, h_q, lens, elem_bytes=1)
        for name, before in flushes.items():
            t16, t8, r8, r16 = time_interleaved([(lambda: None, fn) for fn in (bf16, fp8, bytes8.max, bytes16.max)], before)
            print(f"{b:>4} {s_k:>6} {h_q:>4} {name:>5} {t16:8.1f} {t8:8.1f} {t16 / t8:6.3f} {r8:9.1f} {r16:9.1f} "
                  f"{t8 / r8:9.3f} {nbytes / t8 / 1e3:8.0f}", flush=True)
        del q, k_cache, q8, k8, bytes8, bytes16
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
