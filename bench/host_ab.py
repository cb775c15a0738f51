"""A/B of the two launch paths (ctypes libcuda vs cuda.bindings), interleaved in one process."""
import statistics
import time

import torch

import mla_jit
from mla_jit.jit import launch as launch_mod
from mla_jit.runtimes import registry

from bench_decode import make_inputs


def per_call_us(fn, n=1000, rounds=15):
    out = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        out.append((time.perf_counter() - t0) / n * 1e6)
    torch.cuda.synchronize()
    return out


q, k_cache, block_table, lens = make_inputs(32, 1, 4096, 16)
meta, splits = mla_jit.get_mla_metadata(lens, 16, 1)
results = {"direct": [], "bindings": []}
meta_results = {"direct": [], "bindings": []}
for _ in range(4):
    for mode in ("direct", "bindings"):
        launch_mod._libcuda_launch = None if mode == "direct" else False
        for fam in registry.families().values():
            fam._launches.clear()
            fam.plans.clear()
        mla_jit.flash_mla_with_kvcache(q, k_cache, block_table, lens, 512, meta, splits)
        results[mode] += per_call_us(lambda: mla_jit.flash_mla_with_kvcache(q, k_cache, block_table, lens, 512,
                                                                             meta, splits), n=200, rounds=5)
        meta_results[mode] += per_call_us(lambda: mla_jit.get_mla_metadata(lens, 16, 1), n=200, rounds=5)
for mode in results:
    print(f"{mode:9}: decode call {statistics.median(results[mode]):6.2f} us, "
          f"metadata call {statistics.median(meta_results[mode]):6.2f} us")
