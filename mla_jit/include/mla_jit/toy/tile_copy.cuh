// Toy kernel family: the worked example of the JIT path on Hopper.
// Each CTA TMA-loads one (BLOCK_ROWS x BLOCK_COLS) tile of `src` into shared memory, waits on
// an mbarrier, and writes dst = src + addend with plain stores. Launched twice back to back
// with programmatic dependent launch, the second copy reads what the first wrote, so a wrong
// PDL wait shows up as a wrong result.
#pragma once
#include "mla_jit/common/sm90.cuh"

namespace mla_jit::toy {

template <typename T, int BLOCK_ROWS, int BLOCK_COLS, int NUM_THREADS>
__device__ __forceinline__ void tile_copy_body(const TmaDescriptor& src_desc, T* __restrict__ dst,
                                               int rows, int cols, float addend) {
  static_assert(BLOCK_COLS * sizeof(T) % 16 == 0, "TMA box rows must be multiples of 16 bytes");
  __shared__ alignas(128) T tile[BLOCK_ROWS * BLOCK_COLS];
  __shared__ alignas(8) uint64_t full;

  const int row0 = blockIdx.y * BLOCK_ROWS;
  const int col0 = blockIdx.x * BLOCK_COLS;
  if (threadIdx.x == 0) {
    prefetch_tma_descriptor(&src_desc);
    mbarrier_init(&full, 1);
    fence_barrier_init();
  }
  __syncthreads();

  // Everything above overlaps the previous kernel's tail; src may be its output.
  pdl_wait_primary();
  if (threadIdx.x == 0) {
    mbarrier_arrive_expect_tx(&full, sizeof(tile));  // out-of-bounds parts are zero-filled, still counted
    tma_load_2d(tile, &src_desc, &full, col0, row0);
  }
  mbarrier_wait(&full, 0);
  // Our reads of src are done: let a dependent grid start its prologue.
  pdl_launch_dependents();

  for (int i = threadIdx.x; i < BLOCK_ROWS * BLOCK_COLS; i += NUM_THREADS) {
    const int r = row0 + i / BLOCK_COLS;
    const int c = col0 + i % BLOCK_COLS;
    if (r < rows && c < cols) {
      dst[static_cast<long long>(r) * cols + c] = static_cast<T>(static_cast<float>(tile[i]) + addend);
    }
  }
}

}  // namespace mla_jit::toy
