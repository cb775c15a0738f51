// mla_jit decode: shared parameter structs and small PTX helpers.
// NVRTC-safe: no host headers; only CUTLASS/CuTe device headers are used by the kernels.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/numeric_types.h>
#include <cuda/std/limits>

namespace mla_jit {
namespace decode {

// +inf without <math.h>/<cmath> (INFINITY is not defined under NVRTC).
constexpr float kInf = cuda::std::numeric_limits<float>::infinity();

// Byte image of a CUtensorMap (128 bytes, 64-byte aligned). Declared here so the headers do not
// need <cuda.h> (not available under NVRTC); the host passes the encoded CUtensorMap bytes.
struct alignas(64) TmaDesc {
  unsigned long long opaque[16];
};

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

// ------------------------------------------------------------------------------------------------
// PTX helpers (sm_90).
// ------------------------------------------------------------------------------------------------
__device__ __forceinline__ unsigned smem_u32(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void mbar_init(unsigned long long* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}

// Makes barrier initialisation visible to the async proxy (TMA) and the other threads.
__device__ __forceinline__ void mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

__device__ __forceinline__ void mbar_arrive(unsigned long long* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(bar)) : "memory");
}

__device__ __forceinline__ void mbar_arrive_expect_tx(unsigned long long* bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes)
               : "memory");
}

// Blocks until the phase with the given parity has completed. Waiting on parity 1 of a fresh
// barrier returns at once (the "previous" phase counts as complete), which pipelines rely on.
__device__ __forceinline__ void mbar_wait(unsigned long long* bar, unsigned parity) {
  const unsigned addr = smem_u32(bar);
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      "@!p bra WAIT_%=;\n"
      "}\n" ::"r"(addr), "r"(parity)
      : "memory");
}

// 3D tiled TMA load global -> shared, completion signalled on an mbarrier (complete_tx bytes).
__device__ __forceinline__ void tma_load_3d(void* smem_dst, const TmaDesc* desc, unsigned long long* bar,
                                            int c0, int c1, int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5}], [%2];" ::"r"(smem_u32(smem_dst)),
      "l"(reinterpret_cast<unsigned long long>(desc)), "r"(smem_u32(bar)), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}

__device__ __forceinline__ void tma_prefetch_desc(const TmaDesc* desc) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<unsigned long long>(desc)) : "memory");
}

// Orders this thread's generic-proxy shared-memory writes before later async-proxy (wgmma/TMA)
// accesses of the same memory.
__device__ __forceinline__ void fence_proxy_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// Named barrier among `count` threads (multiple of 32). id 0 is __syncthreads.
__device__ __forceinline__ void named_bar_sync(int id, int count) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(count) : "memory");
}

// Programmatic dependent launch.
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void pdl_launch_dependents() {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

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
