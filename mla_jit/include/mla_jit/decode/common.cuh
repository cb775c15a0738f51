// mla_jit decode: shared parameter structs and small PTX helpers.
// NVRTC-safe: no host headers; only CUTLASS/CuTe device headers are used by the kernels.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/numeric_types.h>
#include <cuda/std/limits>

#include "mla_jit/common/sm90.cuh"

namespace mla_jit {
namespace decode {

// +inf without <math.h>/<cmath> (INFINITY is not defined under NVRTC).
constexpr float kInf = cuda::std::numeric_limits<float>::infinity();


// Runtime parameters of the split-KV and combine kernels. Strides are in elements.
struct DecodeParams {
  const void* q;                 // (b, s_q, h_q, d), last dim contiguous
  void* out;                     // (b, s_q, h_q, dv) contiguous, q dtype
  float* lse;                    // (b, h_q, s_q) contiguous, natural log
  float* o_accum;                // [total_splits][h_kv][rows][dv] float32
  float* lse_accum;              // [total_splits][h_kv][rows] float32, log2 domain
  const int* block_table;        // (b, max_blocks_per_seq), row stride block_table_stride
  const int* cache_seqlens;      // (b,)
  const int* tile_scheduler_metadata;  // [num_sm_parts][8]
  const int* num_splits;         // [b + 1] prefix sums
  long long q_stride_b, q_stride_s, q_stride_h;
  long long block_table_stride;
  int b, s_q, h_q, h_kv, q_per_kv, rows;  // rows = s_q * q_per_kv
  int num_sm_parts, max_blocks_per_seq;
  float scale;       // softmax scale (natural)
  float scale_log2;  // scale * log2(e)
  int causal;
};

// Parameters of the scheduler-metadata kernel.
struct MetadataParams {
  const int* cache_seqlens;      // (b,)
  int* tile_scheduler_metadata;  // [num_sm_parts][8]
  int* num_splits;               // [b + 1]
  int b, num_sm_parts, block_n, fixed_overhead_blocks;
};

// Metadata row layout (int32 x 8 per SM part).
enum : int {
  kMetaBeginBatch = 0, kMetaBeginToken = 1, kMetaEndBatch = 2, kMetaEndToken = 3,
  kMetaBeginSplit = 4, kMetaSize = 8
};

template <typename T>
struct ElemTraits;
template <>
struct ElemTraits<cutlass::bfloat16_t> {
  __device__ __forceinline__ static unsigned pack2(float a, float b) {
    unsigned r;  // cvt.rn packs b into the high half, a into the low half
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(b), "f"(a));
    return r;
  }
};
template <>
struct ElemTraits<cutlass::half_t> {
  __device__ __forceinline__ static unsigned pack2(float a, float b) {
    unsigned r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(b), "f"(a));
    return r;
  }
};

}  // namespace decode
}  // namespace mla_jit
