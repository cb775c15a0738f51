"""Probe: how fast does a chain of dependent wgmma instructions (one accumulator) run on this GPU,
for one warpgroup alone and for two warpgroups with independent chains at once? And how long does
issuing the chain hold the issuing warps (clock after the commit minus clock before the first
wgmma, as a share of the chain's time): what a warpgroup can overlap with its own wgmmas.

The decode kernel's S = Q K^T is a chain of 36 m64n64k16 wgmmas into one accumulator. If a chain
is latency-bound, a second independent chain (another warpgroup) runs at no extra wall time,
which is what a schedule with two S chains in flight (FlashMLA's seesaw) buys.

Usage (on a Hopper GPU): python bench/probe_wgmma_chain.py [--json OUT]
Prints cycles per wgmma instruction and tensor throughput for each variant.
"""
from __future__ import annotations

import argparse
import json

import torch

from mla_jit.jit.arch import resolve_for_build
from mla_jit.jit.build import KernelSource, build
from mla_jit.jit.launch import I32, PTR, PreparedLaunch
from mla_jit.jit.loader import get_kernel
from mla_jit.jit.stream import current_stream

# (name, N, chain length, A from registers, warpgroups): every chain does 64 x N x 16 x chain MACs.
VARIANTS = [("ss_n64_x36", 64, 36, False, 1), ("ss_n64_x36", 64, 36, False, 2),
            ("rs_n64_x32", 64, 32, True, 1), ("rs_n64_x32", 64, 32, True, 2),
            # m64n32 RS (S in two token parts, tried in session 8; H200: 1367 vs 1672 MAC/cycle/SM at 1 WG).
            ("rs_n32_x32", 32, 32, True, 1), ("rs_n32_x32", 32, 32, True, 2),
            ("ss_n256_x4", 256, 4, False, 1), ("ss_n256_x4", 256, 4, False, 2)]
ITERS = 256

SOURCE = r'''
#include <cute/tensor.hpp>
#include "mla_jit/common/sm90.cuh"
using namespace cute;
using T = cutlass::bfloat16_t;

template <int N, int CHAIN, bool RS>
__device__ __forceinline__ void chain_body(float* out, long long* cycles, int iters) {
  extern __shared__ __align__(1024) unsigned char smem[];
  T* sa = reinterpret_cast<T*>(smem);
  T* sb = sa + 64 * 16 * CHAIN;
  for (int i = threadIdx.x; i < (64 + N) * 16 * CHAIN; i += blockDim.x) sa[i] = T(0.001f * (i % 7));
  mla_jit::fence_proxy_async_shared();
  __syncthreads();
  using Atom = decltype(GMMA::Layout_K_SW128_Atom<T>{});
  Tensor sA = make_tensor(make_smem_ptr(sa), tile_to_shape(Atom{}, Shape<_64, Int<16 * CHAIN>>{}));
  Tensor sB = make_tensor(make_smem_ptr(sb), tile_to_shape(Atom{}, Shape<Int<N>, Int<16 * CHAIN>>{}));
  const int t = threadIdx.x % 128;
  Tensor acc = partition_fragment_C(
      make_tiled_mma(GMMA::ss_op_selector<T, T, float, Shape<_64, Int<N>, Int<16 * CHAIN>>>()), Shape<_64, Int<N>>{});
  clear(acc);
  long long issue = 0;
  long long start = clock64();
  if constexpr (RS) {
    auto mma = make_tiled_mma(GMMA::rs_op_selector<T, T, float, Shape<_64, Int<N>, Int<16 * CHAIN>>>());
    auto thr = mma.get_thread_slice(t);
    Tensor rA = make_tensor<T>(partition_shape_A(mma, Shape<_64, Int<16 * CHAIN>>{}));
#pragma unroll
    for (int i = 0; i < size(rA); ++i) rA(i) = T(0.001f * (i % 5));
    Tensor tB = thr.partition_fragment_B(sB);
    for (int it = 0; it < iters; ++it) {
      warpgroup_fence_operand(rA);
      warpgroup_fence_operand(acc);
      const long long t0 = clock64();
      warpgroup_arrive();
#pragma unroll
      for (int k = 0; k < CHAIN; ++k) gemm(mma, rA(_, _, k), tB(_, _, k), acc);
      warpgroup_commit_batch();
      issue += clock64() - t0;
      warpgroup_wait<0>();
      warpgroup_fence_operand(acc);
    }
  } else {
    auto mma = make_tiled_mma(GMMA::ss_op_selector<T, T, float, Shape<_64, Int<N>, Int<16 * CHAIN>>>());
    auto thr = mma.get_thread_slice(t);
    Tensor tA = thr.partition_fragment_A(sA);
    Tensor tB = thr.partition_fragment_B(sB);
    for (int it = 0; it < iters; ++it) {
      warpgroup_fence_operand(acc);
      const long long t0 = clock64();
      warpgroup_arrive();
#pragma unroll
      for (int k = 0; k < CHAIN; ++k) gemm(mma, tA(_, _, k), tB(_, _, k), acc);
      warpgroup_commit_batch();
      issue += clock64() - t0;
      warpgroup_wait<0>();
      warpgroup_fence_operand(acc);
    }
  }
  long long stop = clock64();
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < size(acc); ++i) s += acc(i);
  out[blockIdx.x * blockDim.x + threadIdx.x] = s;
  if (threadIdx.x == 0) {
    cycles[blockIdx.x] = stop - start;
    cycles[gridDim.x + blockIdx.x] = issue;
  }
}
'''
ENTRY = r'''
extern "C" __global__ void __launch_bounds__(256, 1) {name}(float* out, long long* cycles, int iters) {{
  chain_body<{n}, {chain}, {rs}>(out, cycles, iters);
}}
'''


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json")
    args = parser.parse_args()
    names = sorted({v[0] for v in VARIANTS})
    spec = {v[0]: v for v in VARIANTS}
    source = SOURCE + "".join(ENTRY.format(name=n, n=spec[n][1], chain=spec[n][2], rs="true" if spec[n][3] else "false")
                              for n in names)
    binary = build(KernelSource("probe_wgmma_chain", source, tuple(names), resolve_for_build("sm_90a"), "none"))
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    out = torch.empty(sms * 256, device="cuda")
    cycles = torch.empty(2 * sms, dtype=torch.int64, device="cuda")
    results = []
    for name, n, chain, rs, wgs in VARIANTS:
        smem = (64 + n) * 16 * chain * 2
        kernel = get_kernel(binary, name, 0, smem)
        launch = PreparedLaunch(kernel, (PTR, PTR, I32), (sms, 1, 1), (128 * wgs, 1, 1), dynamic_smem=smem)
        launch(current_stream(0), out.data_ptr(), cycles.data_ptr(), 8)  # warm
        launch(current_stream(0), out.data_ptr(), cycles.data_ptr(), ITERS)
        torch.cuda.synchronize()
        cyc = cycles[:sms].double().median().item()
        issue_share = cycles[sms:].double().median().item() / cyc
        per_instr = cyc / ITERS / chain
        macs = 64 * n * 16 * chain * ITERS * wgs
        results.append({"variant": name, "warpgroups": wgs, "cycles_per_wgmma": per_instr,
                        "macs_per_cycle_per_sm": macs / cyc, "issue_share": issue_share})
        print(f"{name:12} warpgroups={wgs}  {per_instr:7.1f} cycles per wgmma (per chain)  "
              f"{macs / cyc:7.0f} MAC/cycle/SM  issue holds the warps {100 * issue_share:5.1f}% of the chain")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
