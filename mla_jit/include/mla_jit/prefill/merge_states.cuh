// Merge of two attention states by log-sum-exp (chunked prefill: the attention of new tokens over
// the cached prefix and over themselves, computed apart, combined here), with vLLM's semantics:
//   out = (prefix * e^(lse_p - m) + suffix * e^(lse_s - m)) / (e^(lse_p - m) + e^(lse_s - m)),
//   out_lse = m + log(e^(lse_p - m) + e^(lse_s - m)),   m = max(lse_p, lse_s),
// where an lse of +inf or -inf marks an empty state (a row that saw no key) with weight 0. Both
// empty: out = 0 and out_lse = -inf, as vLLM's kernel gives (it copies the prefix output, which
// is zeros for such rows; zeros here, since an empty state's values may be anything).
//
// Memory-bound: each thread moves 16 bytes of a row per input; a row's threads are consecutive
// lanes, so a warp reads whole rows. The grid is a power of two (few distinct launches) and
// strides over the rows.
#pragma once
#include <cuda/std/cstdint>
#include <cuda/std/limits>

#include "cutlass/numeric_types.h"

namespace mla_jit::merge {

// Strides in elements. Mirrored by runtimes/merge.py (MERGE_PARAMS); checked by a static_assert.
struct MergeParams {
  void* out;
  const void* prefix;
  const void* suffix;
  float* out_lse;            // may be null
  const float* prefix_lse;
  const float* suffix_lse;
  long long out_stride_t, out_stride_h;
  long long prefix_stride_t, prefix_stride_h;
  long long suffix_stride_t, suffix_stride_h;
  long long prefix_lse_stride_h, prefix_lse_stride_t;
  long long suffix_lse_stride_h, suffix_lse_stride_t;
  long long out_lse_stride_h, out_lse_stride_t;
  int num_tokens;
  int num_heads;
};
static_assert(sizeof(MergeParams) == 152, "MergeParams layout changed: update runtimes/merge.py");

namespace detail {

constexpr float kInf = cuda::std::numeric_limits<float>::infinity();

// The two states' weights (already divided by their sum) and the merged lse of one row.
struct MergeWeights {
  float prefix, suffix, lse;
};

__device__ __forceinline__ MergeWeights merge_weights(float lse_p, float lse_s) {
  const bool empty_p = isinf(lse_p), empty_s = isinf(lse_s);
  if (empty_p && empty_s) return {0.f, 0.f, -kInf};
  const float m = empty_p ? lse_s : empty_s ? lse_p : fmaxf(lse_p, lse_s);
  const float wp = empty_p ? 0.f : __expf(lse_p - m);
  const float ws = empty_s ? 0.f : __expf(lse_s - m);
  const float sum = wp + ws;  // >= 1: the larger weight is e^0
  const float inv = __fdividef(1.f, sum);  // sum in [1, 2]: the fast reciprocal is exact enough
  return {wp * inv, ws * inv, m + __logf(sum)};
}

// 16 bytes of T as floats and back.
template <typename T>
struct alignas(16) Vec16 {
  static constexpr int N = 16 / sizeof(T);
  T v[N];
  __device__ __forceinline__ void load(const void* p) {
    *reinterpret_cast<uint4*>(v) = __ldg(reinterpret_cast<const uint4*>(p));
  }
  // One st.global.v4 of the packed bits (a plain copy of the array is split into 16-bit stores:
  // cutlass's 16-bit types are classes).
  __device__ __forceinline__ void store(void* p) const {
    uint32_t w[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if constexpr (sizeof(T) == 2) {
        w[i] = static_cast<uint32_t>(v[2 * i].raw()) | (static_cast<uint32_t>(v[2 * i + 1].raw()) << 16);
      } else {
        w[i] = __float_as_uint(v[i]);
      }
    }
    asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(w[0]), "r"(w[1]), "r"(w[2]), "r"(w[3])
                 : "memory");
  }
};

}  // namespace detail

template <typename T, int HEAD_DIM, int NUM_THREADS>
__device__ __forceinline__ void merge_states_body(const MergeParams& p) {
  using V = detail::Vec16<T>;
  constexpr int kThreadsPerRow = HEAD_DIM / V::N;
  static_assert(HEAD_DIM % V::N == 0 && NUM_THREADS % kThreadsPerRow == 0, "a row is whole 16-byte vectors");
  constexpr int kRowsPerCta = NUM_THREADS / kThreadsPerRow;
  const int col = (threadIdx.x % kThreadsPerRow) * V::N;
  // Row indices fit 32 bits (the op checks tokens x heads < 2^31); element offsets are 64-bit.
  const int rows = p.num_tokens * p.num_heads;
  for (int row = blockIdx.x * kRowsPerCta + threadIdx.x / kThreadsPerRow; row < rows; row += gridDim.x * kRowsPerCta) {
    const long long t = row / p.num_heads, h = row % p.num_heads;
    const detail::MergeWeights w = detail::merge_weights(
        p.prefix_lse[h * p.prefix_lse_stride_h + t * p.prefix_lse_stride_t],
        p.suffix_lse[h * p.suffix_lse_stride_h + t * p.suffix_lse_stride_t]);
    V a, b, o;
    a.load(static_cast<const T*>(p.prefix) + t * p.prefix_stride_t + h * p.prefix_stride_h + col);
    b.load(static_cast<const T*>(p.suffix) + t * p.suffix_stride_t + h * p.suffix_stride_h + col);
    // A state of weight 0 (empty, or negligible) is left out rather than multiplied by 0: an empty
    // state's output may hold anything, NaN included.
#pragma unroll
    for (int i = 0; i < V::N; ++i) {
      float x = 0.f;
      if (w.prefix != 0.f) x = static_cast<float>(a.v[i]) * w.prefix;
      if (w.suffix != 0.f) x += static_cast<float>(b.v[i]) * w.suffix;
      o.v[i] = static_cast<T>(x);
    }
    o.store(static_cast<T*>(p.out) + t * p.out_stride_t + h * p.out_stride_h + col);
    if (p.out_lse != nullptr && col == 0) p.out_lse[h * p.out_lse_stride_h + t * p.out_lse_stride_t] = w.lse;
  }
}

}  // namespace mla_jit::merge
