// Ampere-class primitives (sm_80 and later) as inline PTX: cp.async, ldmatrix, mma.sync
// m16n8k16 and the XOR swizzle of row-major shared-memory tiles. Used by the mma.sync kernel
// families (decode and prefill for sm_80 / sm_86 / sm_89).
#pragma once

#include <cutlass/numeric_types.h>

namespace mla_jit {
namespace sm80 {

__device__ __forceinline__ unsigned smem_u32(const void* ptr) {
  return static_cast<unsigned>(__cvta_generic_to_shared(ptr));
}

// 16-byte async copy global -> shared; src_bytes = 0 writes 16 zero bytes and reads nothing.
__device__ __forceinline__ void cp_async_16(unsigned dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void ldsm_x4(unsigned (&r)[4], unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}
__device__ __forceinline__ void ldsm_x4_trans(unsigned (&r)[4], unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}

// D += A B, m16n8k16, A row-major (16 x 16), B "col" (n8 x k16 stored k-contiguous), f32 accumulate.
template <typename Element>
struct Mma;
template <>
struct Mma<cutlass::bfloat16_t> {
  __device__ __forceinline__ static void run(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};
template <>
struct Mma<cutlass::half_t> {
  __device__ __forceinline__ static void run(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

// D += A B, m16n8k32, e4m3 x e4m3 -> f32 (sm_89 and later). A row-major 16 x 32 bytes (a register:
// 4 consecutive k of one row, as ldmatrix of 16-byte rows delivers), B "col" (n8 x k32, k-contiguous).
__device__ __forceinline__ void mma_e4m3(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Four e4m3 (bytes 0..3 of w) as two fp16x2, exact and scaled by 2^-8 (every e4m3 value, subnormals
// included, is then a fp16 value; the caller multiplies products by 2^16). Bit operations only: sm_80
// and sm_86 have no e4m3 conversion instruction. lo = (byte 0, byte 2), hi = (byte 1, byte 3): the
// pairing that needs no byte permute; the operands of a dot product just have to agree on it.
__device__ __forceinline__ unsigned e4m3x2_to_f16x2_scaled(unsigned u) {   // u: bytes at bits 8-15, 24-31
  return (u & 0x80008000u) | ((u >> 1) & 0x3F803F80u);
}
__device__ __forceinline__ void e4m3x4_to_f16x4_scaled(unsigned w, unsigned& lo, unsigned& hi) {
  lo = e4m3x2_to_f16x2_scaled((w << 8) & 0xFF00FF00u);
  hi = e4m3x2_to_f16x2_scaled(w & 0xFF00FF00u);
}

// Byte offset of 16-byte chunk `c` of row `row` in a tile of ROW_CHUNKS chunks per row, XOR-swizzled
// so that the 8 rows one ldmatrix phase reads at the same logical chunk hit 8 distinct 16-byte bank
// groups (and so do the 8 chunks one cp.async phase writes).
template <int ROW_CHUNKS>
__device__ __forceinline__ unsigned swz(int row, int c) {
  if constexpr (ROW_CHUNKS >= 8) {
    static_assert(ROW_CHUNKS % 8 == 0, "swizzle period");
    return unsigned(row * ROW_CHUNKS + (c ^ (row & 7))) * 16u;
  } else {
    constexpr int kRowsPerLine = 8 / ROW_CHUNKS;  // rows sharing one 128-byte line
    return unsigned(row * ROW_CHUNKS + (c ^ ((row / kRowsPerLine) % ROW_CHUNKS))) * 16u;
  }
}

}  // namespace sm80
}  // namespace mla_jit
