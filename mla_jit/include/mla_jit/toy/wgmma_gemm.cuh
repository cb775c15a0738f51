// Toy kernel family: one warpgroup computes a (BLOCK_M x BLOCK_N) tile of C = A * B^T with
// CuTe's SM90 GMMA atoms (wgmma from 128B-swizzled shared memory). It is the smallest kernel
// that exercises CuTe + wgmma through both compilers; the MLA kernels build on the same pieces.
#pragma once
#include <cute/tensor.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cute/arch/mma_sm90.hpp>

#include "mla_jit/common/sm90.cuh"

namespace mla_jit::toy {

template <typename T, int BLOCK_M, int BLOCK_N, int BLOCK_K>
struct WgmmaGemmShared {
  cute::array_aligned<T, BLOCK_M * BLOCK_K, 1024> a;
  cute::array_aligned<T, BLOCK_N * BLOCK_K, 1024> b;
};

// A: (M, K) row-major, B: (N, K) row-major, C: (M, N) fp32 row-major. M % BLOCK_M == 0,
// N % BLOCK_N == 0, K % BLOCK_K == 0 (checked on the host). 128 threads.
template <typename T, int BLOCK_M, int BLOCK_N, int BLOCK_K>
__device__ __forceinline__ void wgmma_gemm_body(const T* __restrict__ A, const T* __restrict__ B,
                                                float* __restrict__ C, int M, int N, int K) {
  using namespace cute;
  using Shared = WgmmaGemmShared<T, BLOCK_M, BLOCK_N, BLOCK_K>;
  __shared__ Shared shared;

  using SmemAtom = decltype(GMMA::Layout_K_SW128_Atom<T>{});
  auto layout_a = tile_to_shape(SmemAtom{}, make_shape(Int<BLOCK_M>{}, Int<BLOCK_K>{}));
  auto layout_b = tile_to_shape(SmemAtom{}, make_shape(Int<BLOCK_N>{}, Int<BLOCK_K>{}));
  Tensor sA = make_tensor(make_smem_ptr(shared.a.data()), layout_a);
  Tensor sB = make_tensor(make_smem_ptr(shared.b.data()), layout_b);

  auto tiled_mma = make_tiled_mma(
      GMMA::ss_op_selector<T, T, float, Shape<Int<BLOCK_M>, Int<BLOCK_N>, Int<BLOCK_K>>>());
  auto thr_mma = tiled_mma.get_thread_slice(threadIdx.x);
  Tensor tCsA = thr_mma.partition_A(sA);
  Tensor tCsB = thr_mma.partition_B(sB);
  Tensor tCrA = thr_mma.make_fragment_A(tCsA);
  Tensor tCrB = thr_mma.make_fragment_B(tCsB);
  Tensor acc = partition_fragment_C(tiled_mma, Shape<Int<BLOCK_M>, Int<BLOCK_N>>{});
  clear(acc);

  const int m0 = blockIdx.y * BLOCK_M;
  const int n0 = blockIdx.x * BLOCK_N;
  for (int k0 = 0; k0 < K; k0 += BLOCK_K) {
    for (int i = threadIdx.x; i < BLOCK_M * BLOCK_K; i += 128) {
      sA(i / BLOCK_K, i % BLOCK_K) = A[static_cast<long long>(m0 + i / BLOCK_K) * K + k0 + i % BLOCK_K];
    }
    for (int i = threadIdx.x; i < BLOCK_N * BLOCK_K; i += 128) {
      sB(i / BLOCK_K, i % BLOCK_K) = B[static_cast<long long>(n0 + i / BLOCK_K) * K + k0 + i % BLOCK_K];
    }
    // Generic-proxy stores must be visible to the async proxy (wgmma reads smem through it).
    fence_proxy_async_shared();
    __syncthreads();
    warpgroup_arrive();
    gemm(tiled_mma, tCrA, tCrB, acc);
    warpgroup_commit_batch();
    warpgroup_wait<0>();
    __syncthreads();
  }

  Tensor gC = make_tensor(make_gmem_ptr(C + static_cast<long long>(m0) * N + n0),
                          make_shape(Int<BLOCK_M>{}, Int<BLOCK_N>{}), make_stride(N, Int<1>{}));
  Tensor tCgC = thr_mma.partition_C(gC);
  copy(acc, tCgC);
}

}  // namespace mla_jit::toy
