// Hopper primitives as inline PTX: mbarrier, TMA bulk-tensor loads, programmatic dependent
// launch. Raw PTX keeps them identical under NVRTC and nvcc and free of host headers.
#pragma once
#include <cuda/std/cstdint>  // NVRTC has no <cstdint>

namespace mla_jit {

using cuda::std::int32_t;
using cuda::std::uint16_t;
using cuda::std::uint32_t;
using cuda::std::uint64_t;

// Layout-compatible with CUtensorMap; passed by value as a __grid_constant__ kernel parameter.
struct alignas(64) TmaDescriptor {
  unsigned long long opaque[16];
};

__device__ __forceinline__ uint32_t smem_addr(const void* ptr) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(ptr));
}

__device__ __forceinline__ void prefetch_tma_descriptor(const TmaDescriptor* desc) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(desc)) : "memory");
}

__device__ __forceinline__ void mbarrier_init(uint64_t* bar, uint32_t arrive_count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(arrive_count));
}

// Make barrier initialisation visible to the async (TMA) proxy before any copy uses it.
__device__ __forceinline__ void fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

__device__ __forceinline__ void fence_proxy_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// The uint32_t forms take shared-memory addresses (smem_addr) computed once outside a hot loop: the
// conversion from a generic pointer costs an S2R and a few ALU instructions a use.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  mbarrier_arrive_expect_tx(smem_addr(bar), bytes);
}

__device__ __forceinline__ void mbarrier_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar)) : "memory");
}

__device__ __forceinline__ void mbarrier_wait(uint32_t bar, uint32_t phase) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "wait_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait_%=;\n"
      "}\n" ::"r"(bar),
      "r"(phase)
      : "memory");
}
__device__ __forceinline__ void mbarrier_wait(uint64_t* bar, uint32_t phase) { mbarrier_wait(smem_addr(bar), phase); }

// 2D tiled TMA load of box (c0, c1) (innermost coordinate first) into shared memory.
__device__ __forceinline__ void tma_load_2d(uint32_t smem_dst, const TmaDescriptor* desc, uint32_t bar,
                                            int32_t c0, int32_t c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4}], [%2];" ::"r"(smem_dst),
      "l"(reinterpret_cast<uint64_t>(desc)), "r"(bar), "r"(c0), "r"(c1)
      : "memory");
}
__device__ __forceinline__ void tma_load_2d(void* smem_dst, const TmaDescriptor* desc, uint64_t* bar,
                                            int32_t c0, int32_t c1) {
  tma_load_2d(smem_addr(smem_dst), desc, smem_addr(bar), c0, c1);
}

// Bulk copy (the TMA engine, no tensor map) of `bytes` (a multiple of 16; both addresses 16-byte
// aligned) from global memory to this CTA's shared memory, completing `bytes` of bar's tx count.
__device__ __forceinline__ void bulk_load(uint32_t smem_dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               ::"r"(smem_dst), "l"(src), "r"(bytes), "r"(smem_addr(bar))
               : "memory");
}

// L2 eviction priorities, as cache-hint policies (createpolicy) for TMA loads and stores.
__device__ __forceinline__ uint64_t l2_evict_first_policy() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}
__device__ __forceinline__ uint64_t l2_evict_normal_policy() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}
__device__ __forceinline__ uint64_t l2_evict_last_policy() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}

// 2D tiled TMA load of box (c0, c1) with an L2 cache-hint policy.
__device__ __forceinline__ void tma_load_2d_hint(void* smem_dst, const TmaDescriptor* desc, uint64_t* bar,
                                                 int32_t c0, int32_t c1, uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1, {%3, %4}], [%2], %5;" ::"r"(smem_addr(smem_dst)),
      "l"(reinterpret_cast<uint64_t>(desc)), "r"(smem_addr(bar)), "r"(c0), "r"(c1), "l"(policy)
      : "memory");
}

// 3D tiled TMA load of box (c0, c1, c2) (innermost coordinate first) into shared memory, with an
// L2 cache-hint policy.
__device__ __forceinline__ void tma_load_3d_hint(uint32_t smem_dst, const TmaDescriptor* desc, uint32_t bar,
                                                 int32_t c0, int32_t c1, int32_t c2, uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1, {%3, %4, %5}], [%2], %6;" ::"r"(smem_dst),
      "l"(reinterpret_cast<uint64_t>(desc)), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "l"(policy)
      : "memory");
}
__device__ __forceinline__ void tma_load_3d_hint(void* smem_dst, const TmaDescriptor* desc, uint64_t* bar,
                                                 int32_t c0, int32_t c1, int32_t c2, uint64_t policy) {
  tma_load_3d_hint(smem_addr(smem_dst), desc, smem_addr(bar), c0, c1, c2, policy);
}

// tma_load_3d_hint, multicast: the box lands at the same smem offset in every CTA of the cluster
// named in cta_mask, and each one's mbarrier at `bar`'s offset receives the bytes it got.
__device__ __forceinline__ void tma_load_3d_multicast_hint(void* smem_dst, const TmaDescriptor* desc, uint64_t* bar,
                                                           int32_t c0, int32_t c1, int32_t c2, uint16_t cta_mask,
                                                           uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster"
      ".L2::cache_hint [%0], [%1, {%4, %5, %6}], [%2], %3, %7;" ::"r"(smem_addr(smem_dst)),
      "l"(reinterpret_cast<uint64_t>(desc)), "r"(smem_addr(bar)), "h"(cta_mask), "r"(c0), "r"(c1), "r"(c2),
      "l"(policy)
      : "memory");
}

// 4-D forms (coordinates innermost first), for a box that covers several column chunks of a tile.
__device__ __forceinline__ void tma_load_4d_hint(void* smem_dst, const TmaDescriptor* desc, uint64_t* bar, int32_t c0,
                                                 int32_t c1, int32_t c2, int32_t c3, uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1, {%3, %4, %5, %6}], [%2], %7;" ::"r"(smem_addr(smem_dst)),
      "l"(reinterpret_cast<uint64_t>(desc)), "r"(smem_addr(bar)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "l"(policy)
      : "memory");
}
__device__ __forceinline__ void tma_load_4d_multicast_hint(void* smem_dst, const TmaDescriptor* desc, uint64_t* bar,
                                                           int32_t c0, int32_t c1, int32_t c2, int32_t c3,
                                                           uint16_t cta_mask, uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster"
      ".L2::cache_hint [%0], [%1, {%4, %5, %6, %7}], [%2], %3, %8;" ::"r"(smem_addr(smem_dst)),
      "l"(reinterpret_cast<uint64_t>(desc)), "r"(smem_addr(bar)), "h"(cta_mask), "r"(c0), "r"(c1), "r"(c2), "r"(c3),
      "l"(policy)
      : "memory");
}

// ---- Thread block clusters ----
__device__ __forceinline__ uint32_t cluster_cta_rank() {
  uint32_t rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
  return rank;
}

// Arrive on the mbarrier at `bar`'s offset in the shared memory of cluster CTA `cta` (this CTA
// included). Default (CTA-scope) semantics, as CUTLASS's ClusterBarrier: it tells a peer that
// this CTA's wgmma reads of a stage are done (wgmma.wait retired them), which needs no
// cluster-scope release of ordinary stores; .release.cluster costs a MEMBAR.ALL.GPU per arrive.
__device__ __forceinline__ void mbarrier_arrive_cluster(uint64_t* bar, uint32_t cta) {
  asm volatile(
      "{\n"
      ".reg .b32 remote;\n"
      "mapa.shared::cluster.u32 remote, %0, %1;\n"
      "mbarrier.arrive.shared::cluster.b64 _, [remote];\n"
      "}\n" ::"r"(smem_addr(bar)),
      "r"(cta)
      : "memory");
}

// The address of `local`'s counterpart in the shared memory of cluster CTA `cta`.
__device__ __forceinline__ uint32_t mapa_shared(uint32_t local, uint32_t cta) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(cta));
  return remote;
}

// Bulk copy (the TMA engine) of `bytes` (a multiple of 16; 16-byte aligned) of this CTA's shared
// memory into a peer's (remote_dst, from mapa_shared), completing `bytes` of the peer's mbarrier at
// remote_bar. The source must be visible to the async proxy (fence_proxy_async_shared after its
// stores) and must not be rewritten before the peer has seen the bytes land.
__device__ __forceinline__ void bulk_copy_to_peer(uint32_t remote_dst, uint32_t src, uint32_t bytes,
                                                  uint32_t remote_bar) {
  asm volatile("cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               ::"r"(remote_dst), "r"(src), "r"(bytes), "r"(remote_bar)
               : "memory");
}

// Every thread of every CTA of the cluster (all threads must call it).
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}

// 8-byte global store of two floats with an L2 cache-hint policy.
__device__ __forceinline__ void st_global_f2_hint(float* ptr, float a, float b, uint64_t policy) {
  asm volatile("st.global.L2::cache_hint.v2.f32 [%0], {%1, %2}, %3;" ::"l"(ptr), "f"(a), "f"(b), "l"(policy)
               : "memory");
}

// Named barrier among `count` threads (a multiple of 32). Id 0 is __syncthreads'.
__device__ __forceinline__ void named_barrier_sync(int id, int count) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(count) : "memory");
}

// Arrive on a named barrier without waiting (the producer side of a bar.arrive / bar.sync pair).
__device__ __forceinline__ void named_barrier_arrive(int id, int count) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(count) : "memory");
}

// Programmatic dependent launch: a secondary grid may start early; it must wait here before
// reading what the primary grid writes. Both are no-ops for launches without the PDL attribute,
// and compile to nothing below sm_90 (the arch-generic metadata and combine kernels use them).
__device__ __forceinline__ void pdl_wait_primary() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

}  // namespace mla_jit
