// Register-fragment and shared-memory helpers shared by the sm_90a kernels (decode and prefill; the
// mma.sync prefill takes the element traits and the MUFU math too):
// the online softmax's row operations on a wgmma accumulator fragment (64 x N, element i at row
// row0 + 8 * ((i / 2) % 2), column (i / 4) * 8 + 2 * (lane % 4) + i % 2), the 128B-swizzle
// addressing, the fast MUFU math, register reallocation and the aligned shared-storage base.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/numeric_types.h>
#include <cuda/std/limits>

#include "mla_jit/common/sm90.cuh"

namespace mla_jit {

// +inf without <math.h>/<cmath> (INFINITY is not defined under NVRTC).
constexpr float kInf = cuda::std::numeric_limits<float>::infinity();


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


// Dynamic smem size of a kernel whose SharedStorage needs 1024 B alignment (the swizzle period):
// +1024 where it fits, so the kernel can round the base up. Where it does not (227 KB already),
// the kernel requires the base to be 1024-aligned (it is: dynamic smem starts right after the
// 1 KB reserved block when there is no static smem) and traps otherwise.
template <typename SharedStorage>
struct Sm90SmemSize {
  static constexpr int kSlack = int(sizeof(SharedStorage)) + 1024 <= 227 * 1024 ? 1024 : 0;
  static constexpr int kBytes = int(sizeof(SharedStorage)) + kSlack;
  static_assert(kBytes <= 227 * 1024, "shared memory budget (reduce NUM_STAGES)");
};


// setmaxnreg (sm_90a): the warpgroup's per-thread register count becomes N. .inc blocks until
// the registers released by .dec of other warpgroups are available.
template <int N>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}

// The warpgroup's per-thread register count from kFrom to kTo (a decrease first frees registers
// another warpgroup's increase may be waiting for).
template <int kFrom, int kTo>
__device__ __forceinline__ void setmaxnreg_move() {
  if constexpr (kTo < kFrom) {
    setmaxnreg_dec<kTo>();
  } else if constexpr (kTo > kFrom) {
    setmaxnreg_inc<kTo>();
  }
}

// Byte offset of element (r, c) (16-bit elements) in a K-major tile stored as 64-column slabs of
// rows x 128 B with the 128B swizzle (CuTe's Layout_K_SW128_Atom tiled over the rows, slabs
// `rows` apart): the 16 B chunk index c/8 within a 128 B row is XORed with r % 8. Used instead of
// CuTe's swizzled smem tensors for the generic-proxy stores, whose integer pointer swizzling loses
// the shared address space (64-bit generic stores and address registers).
template <int kRows>
__device__ __forceinline__ uint32_t sw128_offset(int r, int c) {
  return uint32_t((c / 64) * kRows * 128 + r * 128 + ((((c / 8) % 8) ^ (r % 8)) << 4) + (c % 8) * 2);
}
// x through an opaque move: addresses derived from it inside a loop are recomputed there instead of
// being hoisted out of the loop as invariants that hold registers across it (a table of swizzled
// addresses per k-step costs registers the decode's WG0 and the mma.sync prefill do not have).
__device__ __forceinline__ int opaque(int x) {
  int y;
  asm volatile("mov.b32 %0, %1;" : "=r"(y) : "r"(x));
  return y;
}
// 2^x with the MUFU instruction alone (flushes results below 2^-126 to 0, ~2 ulp): the accurate
// exp2f adds a denormal-scaling sequence and temporaries per element, and WG0 is register-bound.
__device__ __forceinline__ float ex2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
// log2(x) and 1/x with the MUFU instructions alone (~2^-22 relative error): the accurate log2f's
// polynomial and the IEEE division's slow-path call need registers the (register-bound) WG0 lacks.
__device__ __forceinline__ float lg2_approx(float x) {
  float y;
  asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float rcp_approx(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ uint4 ld_shared_v4(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr)
               : "memory");
  return v;
}
__device__ __forceinline__ void st_shared_v4(uint32_t addr, uint4 v) {
  asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
}

// 16-byte copy global -> shared that takes no registers (cp.async); valid = false writes 16 zero
// bytes and reads nothing (src must still be a valid address). Complete after cp_async_wait_all.
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }
__device__ __forceinline__ float ld_shared_f32(uint32_t addr) {
  float v;
  asm volatile("ld.shared.f32 %0, [%1];" : "=f"(v) : "r"(addr) : "memory");
  return v;
}
__device__ __forceinline__ uint32_t ld_shared_u8(uint32_t addr) {
  uint32_t v;
  asm volatile("ld.shared.u8 %0, [%1];" : "=r"(v) : "r"(addr) : "memory");
  return v;
}
__device__ __forceinline__ uint32_t ld_shared_u32(uint32_t addr) {
  uint32_t v;
  asm volatile("ld.shared.u32 %0, [%1];" : "=r"(v) : "r"(addr) : "memory");
  return v;
}
// An arrival on bar once every cp.async this thread issued so far has landed; counts as one of the
// barrier's expected arrivals (.noinc).
__device__ __forceinline__ void cp_async_mbarrier_arrive_noinc(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(smem_addr(bar)) : "memory");
}
// Brings the line of ptr into L2 (no register, no wait).
__device__ __forceinline__ void prefetch_l2(const void* ptr) { asm volatile("prefetch.global.L2 [%0];" ::"l"(ptr)); }

// Lazy rescaling (as in FlashAttention 4): a row's reference max moves only when a tile's max
// exceeds it by more than this (log2 units), so P <= 2^8 and the O scale is exactly 1 on most tiles.
constexpr float kLazyRescaleLog2 = 8.f;

// stmatrix .x4: lanes 8m .. 8m + 7 give the row addresses of 8 x 8 matrix m (16 B each); register
// m of every lane holds its two elements of matrix m (the mma accumulator layout).
__device__ __forceinline__ void stmatrix_x4(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(r0), "r"(r1),
               "r"(r2), "r"(r3)
               : "memory");
}

// stmatrix .x2: lanes 8m .. 8m + 7 (m < 2) give the row addresses of matrix m (the others' unused).
__device__ __forceinline__ void stmatrix_x2(uint32_t addr, uint32_t r0, uint32_t r1) {
  asm volatile("stmatrix.sync.aligned.m8n8.x2.shared.b16 [%0], {%1, %2};" ::"r"(addr), "r"(r0), "r"(r1) : "memory");
}

// ldmatrix .x4 .trans: lanes 8m .. 8m + 7 give the row addresses of 8 x 8 (16-bit) matrix m;
// register m of lane l gets elements (2 (l % 4), l / 4) and (2 (l % 4) + 1, l / 4) of it.
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}
// Bytes of {b, a} (a = bytes 0-3, b = 4-7) picked by the nibbles of sel, lowest first.
__device__ __forceinline__ uint32_t byte_perm(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
  return d;
}
// Two floats as e4m3 (round to nearest, saturated to +-448): a in the low byte, b in the high.
__device__ __forceinline__ uint16_t pack_e4m3x2(float a, float b) {
  uint16_t d;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(d) : "f"(b), "f"(a));
  return d;
}
// Two e4m3 (the low byte first) as two 16-bit Element values, exactly (sm_89 and later). fp16: the
// hardware conversion. bf16: through fp16, where every e4m3 value is normal: its exponent and
// mantissa bits shifted into bf16's fields give the value times 2^-112 (a normal bf16 too), and one
// multiply by 2^112 restores it.
template <typename Element>
__device__ __forceinline__ uint32_t e4m3x2_to_16bit(uint32_t v) {
  uint32_t h;
  asm("{\n.reg .b16 lo;\ncvt.u16.u32 lo, %1;\ncvt.rn.f16x2.e4m3x2 %0, lo;\n}" : "=r"(h) : "r"(v));
  if constexpr (cute::is_same_v<Element, cutlass::half_t>) {
    return h;
  } else {
    static_assert(cute::is_same_v<Element, cutlass::bfloat16_t>, "bf16 or fp16");
    const uint32_t scaled = ((h & 0x7fff7fffu) >> 3) | (h & 0x80008000u);
    uint32_t r;
    asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(scaled), "r"(0x77807780u), "r"(0x80008000u));
    return r;
  }
}

// The two e4m3 of v's low 16 bits (the low byte first) as float32, exactly (sm_89 and later).
__device__ __forceinline__ float2 e4m3x2_to_float2(uint32_t v) {
  uint32_t h;
  asm("{\n.reg .b16 lo;\ncvt.u16.u32 lo, %1;\ncvt.rn.f16x2.e4m3x2 %0, lo;\n}" : "=r"(h) : "r"(v));
  float2 f;
  asm("{\n.reg .f16 a, b;\nmov.b32 {a, b}, %2;\ncvt.f32.f16 %0, a;\ncvt.f32.f16 %1, b;\n}" : "=f"(f.x), "=f"(f.y) : "r"(h));
  return f;
}

__device__ __forceinline__ void st_shared_u16(uint32_t addr, uint16_t v) {
  asm volatile("st.shared.b16 [%0], %1;" ::"r"(addr), "h"(v) : "memory");
}

// The kernel's SharedStorage in dynamic smem, at a 1024 B boundary (see Sm90SmemSize). Rounded
// by pointer arithmetic on smem_raw (not through an integer), so that the compiler keeps the
// shared address space (32-bit ld/st.shared, not generic 64-bit).
template <typename SharedStorage>
__device__ __forceinline__ SharedStorage& aligned_shared_storage(unsigned char* smem_raw) {
  unsigned char* smem_base = smem_raw;
  if constexpr (Sm90SmemSize<SharedStorage>::kSlack != 0) {
    smem_base += (1024u - (smem_addr(smem_raw) & 1023u)) & 1023u;
  } else {
    if (smem_addr(smem_raw) & 1023u) __trap();  // no room to realign
  }
  return *reinterpret_cast<SharedStorage*>(smem_base);
}

// S fragment (64 x N accumulator: element i at row row0 + 8 * ((i / 2) % 2), column
// (i / 4) * 8 + col_lane + i % 2) of the tile starting at token tok0: -inf where the token is not
// visible to the row (lim[0] for row row0, lim[1] for row0 + 8). A select, so NaN never survives.
template <typename Frag>
__device__ __forceinline__ void mask_invisible(Frag& s, int tok0, int col_lane, const int (&lim)[2]) {
  if (tok0 + int(cute::size(s)) * 2 > min(lim[0], lim[1])) {
#pragma unroll
    for (int i = 0; i < cute::size(s); ++i) {
      const int t = tok0 + (i / 4) * 8 + col_lane + (i & 1);
      if (t >= lim[(i >> 1) & 1]) s(i) = -kInf;
    }
  }
}

// v[0] = max of v[0 .. 2W) as a tree (W a power of two). Recursion, not a halving loop: that one
// stays rolled at W = 8 and puts v in local memory.
template <int W>
__device__ __forceinline__ void max_fold(float* v) {
  if constexpr (W >= 1) {
#pragma unroll
    for (int j = 0; j < W; ++j) v[j] = fmaxf(v[j], v[j + W]);
    max_fold<W / 2>(v);
  }
}

// Max over the row half h (row row0 + 8h) of an S fragment, across the 4 lanes holding the row.
template <typename Frag>
__device__ __forceinline__ float row_max(const Frag& s, int h) {
  // A tree, not a chain: the softmax warpgroup has one warp per SM sub-partition, so the chain's
  // FMNMX latency (16 deep at N = 64) is on its critical path.
  constexpr int kPairs = decltype(cute::size(s))::value / 4;
  static_assert((kPairs & (kPairs - 1)) == 0, "power-of-two column pairs");
  float v[kPairs];
#pragma unroll
  for (int j = 0; j < kPairs; ++j) v[j] = fmaxf(s(j * 4 + h * 2), s(j * 4 + h * 2 + 1));
  max_fold<kPairs / 2>(v);
  float mx = v[0];
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
  return fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
}

// Row half h of an S (or P) fragment times f, in place.
template <typename Frag>
__device__ __forceinline__ void scale_row(Frag& s, int h, float f) {
#pragma unroll
  for (int j = 0; j < cute::size(s) / 4; ++j) {
    s(j * 4 + h * 2) *= f;
    s(j * 4 + h * 2 + 1) *= f;
  }
}

// Row half h of an S fragment becomes P = 2^(S * scale_log2 - m_use) in place; returns this
// thread's part of the row sum.
template <typename Frag>
__device__ __forceinline__ float exp2_row(Frag& s, int h, float scale_log2, float m_use) {
  float sum = 0.f;
#pragma unroll
  for (int j = 0; j < cute::size(s) / 4; ++j) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      float& x = s(j * 4 + h * 2 + e);
      x = ex2_approx(fmaf(x, scale_log2, -m_use));
      sum += x;
    }
  }
  return sum;
}

// Rows [v0, kRows) of a K-major SW128 tile of kCols columns set to zero by the 128 threads of a
// warpgroup (tw: thread in the warpgroup), before a wgmma reads it: rows past a sequence's end
// may hold NaN.
template <int kRows, int kCols>
__device__ __forceinline__ void zero_rows_from(uint32_t tile_addr, int v0, int tw) {
  constexpr int kChunks = kCols / 8;
#pragma unroll 1
  for (int idx = tw; idx < (kRows - v0) * kChunks; idx += 128) {
    const int lr = v0 + idx / kChunks, c = idx % kChunks;
    st_shared_v4(tile_addr + sw128_offset<kRows>(lr, c * 8), make_uint4(0u, 0u, 0u, 0u));
  }
}

// Rows [v0, kRows) of a K-major tile of kChunks column chunks (each a contiguous kRows x
// kRowBytes slab) set to zero by the 128 threads of a warpgroup. A swizzle (64B or 128B, within a
// row's bytes) does not move bytes between rows, so whole rows are zeroed without it.
template <int kRows, int kChunks, int kRowBytes>
__device__ __forceinline__ void zero_chunk_rows_from(uint32_t tile_addr, int v0, int tw) {
  constexpr int kPieces = kRowBytes / 16;  // 16-byte stores per row of a chunk
#pragma unroll 1
  for (int idx = tw; idx < (kRows - v0) * kPieces * kChunks; idx += 128) {
    const int c = idx / ((kRows - v0) * kPieces), rest = idx % ((kRows - v0) * kPieces);
    st_shared_v4(tile_addr + (c * kRows + v0) * kRowBytes + rest * 16, make_uint4(0u, 0u, 0u, 0u));
  }
}

// A 64 x N wgmma accumulator fragment of thread tw of the warpgroup (rows row0 + {0, 8}, row0 =
// 16 (tw / 32) + (tw % 32) / 4; columns 8j + 2 (tw % 4) + {0, 1}), as Element, into a K-major
// SW128 tile of kRows rows (64-column slabs kRows * 128 B apart): columns 8j.. go to the
// swizzled 16 B chunk (j % 8) ^ (row % 8) of slab j / 8. Through stmatrix: each instruction
// writes the 8 x 8 matrices (chunk j, rows +0), (j, +8), (j + 1, +0), (j + 1, +8), so a thread
// issues N / 16 of them instead of N / 2 32-bit stores.
template <typename Element, int kRows, typename Frag>
__device__ __forceinline__ void store_acc_sw128_stsm(uint32_t tile_addr, int tw, const Frag& s) {
  const int lane = tw % 32, m = lane / 8, rr = lane % 8;
  const uint32_t row_addr = tile_addr + ((tw / 32) * 16 + (m & 1) * 8 + rr) * 128;
#pragma unroll
  for (int q = 0; q < cute::size(s) / 8; ++q) {
    const int i0 = q * 8, i1 = q * 8 + 4;  // chunks j = 2q and 2q + 1
    const uint32_t slab = uint32_t(q / 4) * (kRows * 128);
    stmatrix_x4(row_addr + slab + ((((2 * q) % 8 + (m >> 1)) ^ rr) << 4),
                ElemTraits<Element>::pack2(s(i0), s(i0 + 1)), ElemTraits<Element>::pack2(s(i0 + 2), s(i0 + 3)),
                ElemTraits<Element>::pack2(s(i1), s(i1 + 1)), ElemTraits<Element>::pack2(s(i1 + 2), s(i1 + 3)));
  }
}

}  // namespace mla_jit
