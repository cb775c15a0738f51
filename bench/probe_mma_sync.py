"""Probe: the mma.sync ceiling of this GPU for the instructions the Ampere/Ada indexer kernels issue:
m16n8k32 e4m3 (sm_89's) and m16n8k16 f16 (sm_80's, on converted e4m3). Operands in registers, 8 warps
a CTA, one CTA an SM, 16 independent accumulators a warp; CUDA events around a whole-GPU launch.

This is the "mma.sync limit" the indexer bench reports its forced sm_80 / sm_89 rows against.

Usage: python bench/probe_mma_sync.py [--json OUT]
"""
from __future__ import annotations

import argparse
import functools
import json

import torch

from mla_jit.jit.arch import resolve_for_device
from mla_jit.jit.build import KernelSource, build
from mla_jit.jit.launch import I32, PTR, PreparedLaunch
from mla_jit.jit.loader import get_kernel
from mla_jit.jit.stream import current_stream

SOURCE = r'''
#include "mla_jit/common/sm80.cuh"
using namespace mla_jit;

template <bool FP8>
__device__ __forceinline__ void body(float* out, int iters) {
  unsigned a[4], b0 = threadIdx.x * 0x01010101u, b1 = b0 ^ 0x10101010u;
#pragma unroll
  for (int i = 0; i < 4; ++i) a[i] = (threadIdx.x + i) * 0x00110011u;
  float acc[16][4] = {};
  for (int it = 0; it < iters; ++it) {
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      if constexpr (FP8) {
#if __CUDA_ARCH__ >= 890
        sm80::mma_e4m3(acc[j], a, b0, b1);
#endif
      } else {
        sm80::Mma<cutlass::half_t>::run(acc[j], a, b0, b1);
      }
    }
  }
  float s = 0.f;
#pragma unroll
  for (int j = 0; j < 16; ++j) s += acc[j][0] + acc[j][1] + acc[j][2] + acc[j][3];
  out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}

extern "C" __global__ void __launch_bounds__(256, 1) probe_e4m3(float* out, int iters) { body<true>(out, iters); }
extern "C" __global__ void __launch_bounds__(256, 1) probe_f16(float* out, int iters) { body<false>(out, iters); }
'''
KINDS = {"e4m3_m16n8k32": ("probe_e4m3", 16 * 8 * 32), "f16_m16n8k16": ("probe_f16", 16 * 8 * 16)}
ITERS = 4096


@functools.lru_cache(maxsize=None)
def peak_tflops(kind: str) -> float:
    """Measured mma.sync TFLOPS of the whole GPU for `kind` (a key of KINDS)."""
    arch = resolve_for_device(0)
    binary = build(KernelSource("probe_mma_sync", SOURCE, tuple(e for e, _ in KINDS.values()), arch, "none"))
    entry, macs = KINDS[kind]
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    out = torch.empty(sms * 256, device="cuda")
    launch = PreparedLaunch(get_kernel(binary, entry, 0, 0), (PTR, I32), (sms, 1, 1), (256, 1, 1))
    stream = current_stream(0)
    launch(stream, out.data_ptr(), 64)   # warm
    times = []
    for _ in range(5):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        launch(stream, out.data_ptr(), ITERS)
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) * 1e-3)
    flops = 2 * macs * 16 * ITERS * 8 * sms
    return flops / sorted(times)[2] / 1e12


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json")
    args = parser.parse_args()
    results = {kind: peak_tflops(kind) for kind in KINDS}
    for kind, tflops in results.items():
        print(f"mma.sync {kind:14} {tflops:7.1f} TFLOPS ({torch.cuda.get_device_name()}, operands in registers)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
