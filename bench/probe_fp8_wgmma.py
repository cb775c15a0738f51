"""Probe: the FP8 wgmma rate fp8_mqa_logits' loop could reach on this GPU, without its epilogue.

Every CTA (one per SM) runs WGS warpgroups, each issuing 64-key "tiles" of m64nNk32 e4m3 SS wgmmas
(K = 128: 4 instructions a tile, one commit group) into two accumulators in turn, keeping one group
in flight (wait<1>), from one K tile and one Q tile in shared memory: the logits kernel's tensor
work and operand traffic with nothing else. N 128: the heads; N 136: with the 8 q' columns.

Usage (on a Hopper GPU): python bench/probe_fp8_wgmma.py
Prints MAC/cycle/SM (clock64) and TFLOPS (CUDA events, all SMs) for each variant.
"""
from __future__ import annotations

import argparse

import torch

from mla_jit.jit.arch import resolve_for_build
from mla_jit.jit.build import KernelSource, build
from mla_jit.jit.launch import I32, PTR, PreparedLaunch
from mla_jit.jit.loader import get_kernel
from mla_jit.jit.stream import current_stream

VARIANTS = [(128, 1), (128, 2), (136, 1), (136, 2)]   # (N, warpgroups)
ITERS = 4096

SOURCE = r'''
#define CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED
#include <cute/tensor.hpp>
#include "mla_jit/common/sm90.cuh"
using namespace cute;
using T = cutlass::float_e4m3_t;

template <int N>
__device__ __forceinline__ void body(float* out, long long* cycles, int iters) {
  extern __shared__ __align__(1024) unsigned char smem[];
  T* sa = reinterpret_cast<T*>(smem);
  T* sb = sa + 64 * 128;
  for (int i = threadIdx.x; i < (64 + N) * 128; i += blockDim.x) sa[i] = T(0.01f * (i % 7));
  mla_jit::fence_proxy_async_shared();
  __syncthreads();
  using Atom = decltype(GMMA::Layout_K_SW128_Atom<T>{});
  Tensor sA = make_tensor(make_smem_ptr(sa), tile_to_shape(Atom{}, Shape<_64, _128>{}));
  Tensor sB = make_tensor(make_smem_ptr(sb), tile_to_shape(Atom{}, Shape<Int<N>, _128>{}));
  auto mma = make_tiled_mma(GMMA::ss_op_selector<T, T, float, Shape<_64, Int<N>, _128>>());
  auto thr = mma.get_thread_slice(threadIdx.x % 128);
  Tensor tA = thr.partition_fragment_A(sA);
  Tensor tB = thr.partition_fragment_B(sB);
  Tensor acc0 = partition_fragment_C(mma, Shape<_64, Int<N>>{});
  Tensor acc1 = partition_fragment_C(mma, Shape<_64, Int<N>>{});
  clear(acc0);
  clear(acc1);
  auto tile = [&](auto& acc) {
    warpgroup_fence_operand(acc);
    warpgroup_arrive();
#pragma unroll
    for (int k = 0; k < 4; ++k) gemm(mma, tA(_, _, k), tB(_, _, k), acc);
    warpgroup_commit_batch();
    warpgroup_fence_operand(acc);
  };
  const long long start = clock64();
  tile(acc0);
  for (int it = 0; it < iters; ++it) {
    tile(acc1);
    warpgroup_wait<1>();
    tile(acc0);
    warpgroup_wait<1>();
  }
  warpgroup_wait<0>();
  const long long stop = clock64();
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < size(acc0); ++i) s += acc0(i) + acc1(i);
  out[blockIdx.x * blockDim.x + threadIdx.x] = s;
  if (threadIdx.x == 0) cycles[blockIdx.x] = stop - start;
}
'''
ENTRY = r'''
extern "C" __global__ void __launch_bounds__(256, 1) fp8_n{n}(float* out, long long* cycles, int iters) {{
  body<{n}>(out, cycles, iters);
}}
'''


def main() -> None:
    argparse.ArgumentParser(description=__doc__).parse_args()
    ns = sorted({n for n, _ in VARIANTS})
    source = SOURCE + "".join(ENTRY.format(n=n) for n in ns)
    binary = build(KernelSource("probe_fp8_wgmma", source, tuple(f"fp8_n{n}" for n in ns),
                                resolve_for_build("sm_90a"), "none"))
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    out = torch.empty(sms * 256, device="cuda")
    cycles = torch.empty(sms, dtype=torch.int64, device="cuda")
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for n, wgs in VARIANTS:
        smem = (64 + n) * 128 + 1024
        launch = PreparedLaunch(get_kernel(binary, f"fp8_n{n}", 0, smem), (PTR, PTR, I32), (sms, 1, 1),
                                (128 * wgs, 1, 1), dynamic_smem=smem)
        launch(current_stream(0), out.data_ptr(), cycles.data_ptr(), 64)   # warm
        start.record()
        launch(current_stream(0), out.data_ptr(), cycles.data_ptr(), ITERS)
        stop.record()
        torch.cuda.synchronize()
        cyc = cycles.double().median().item()
        macs = 64 * n * 128 * (2 * ITERS + 1) * wgs   # per CTA
        tflops = 2 * macs * sms / (start.elapsed_time(stop) * 1e-3) / 1e12
        print(f"m64n{n}k32 x4, {wgs} warpgroup(s): {macs / cyc:7.0f} MAC/cycle/SM, {tflops:6.0f} TFLOPS "
              f"({tflops * 128 / n:6.0f} counting 128 columns), {cyc / (2 * ITERS + 1):6.1f} cycles a tile")


if __name__ == "__main__":
    main()
