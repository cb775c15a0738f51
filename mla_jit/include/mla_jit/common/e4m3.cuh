// mla_jit: exact e4m3 (float8_e4m3fn) -> bf16 / fp16 conversion for the mma.sync kernels, which
// multiply in 16 bits what an FP8 cache holds. Every finite e4m3 value (subnormals included) is
// exact in both 16-bit types; NaN (S.1111.111) is not kept (it becomes a finite value): callers
// never read NaN from the cache (tokens past a sequence's end are zero-filled, not loaded).
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/numeric_types.h>

#include "sm80.cuh"

namespace mla_jit {
namespace e4m3 {

// Two e4m3 values, bytes 2 k and 2 k + 1 of w, as a packed pair of T (the lower byte in the low
// half). kHwCvt: cvt.rn.f16x2.e4m3x2 (sm_89 and later, T = fp16); else bit arithmetic (any sm_80+):
// each byte s.eeee.mmm moves to the top of a 16-bit lane, its 7 magnitude bits shift down onto T's
// exponent / mantissa (exponent field e, mantissa mmm00..), which is the value times 2^-8 (fp16,
// exponent bias 15 against 7: sm80::e4m3x2_to_f16x2_scaled) or 2^-120 (bf16, bias 127), subnormals
// included; one multiply by 2^8 / 2^120 restores it exactly.
template <typename T, bool kHwCvt, int k>
__device__ __forceinline__ unsigned pair_to(unsigned w) {
  static_assert(k == 0 || k == 1, "byte pair 0 (bytes 0, 1) or 1 (bytes 2, 3)");
  if constexpr (kHwCvt) {
    static_assert(cute::is_same_v<T, cutlass::half_t>, "the e4m3x2 cvt produces fp16");
    const unsigned short h = static_cast<unsigned short>(w >> (16 * k));
    unsigned r;
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(r) : "h"(h));
    return r;
  } else {
    const unsigned x = __byte_perm(w, 0u, k ? 0x3424u : 0x1404u);  // [b 2k+1, 0, b 2k, 0]
    unsigned r;
    if constexpr (cute::is_same_v<T, cutlass::half_t>) {  // x 2^8
      asm("mul.rn.f16x2 %0, %1, %2;\n" : "=r"(r) : "r"(sm80::e4m3x2_to_f16x2_scaled(x)), "r"(0x5C005C00u));
    } else {
      static_assert(cute::is_same_v<T, cutlass::bfloat16_t>, "bf16 or fp16");
      // x 2^120 (fma: sm_80 has no bf16x2 mul; + -0 keeps the sign of zero)
      const unsigned scaled = (x & 0x80008000u) | ((x >> 4) & 0x07F007F0u);
      asm("fma.rn.bf16x2 %0, %1, %2, %3;\n" : "=r"(r) : "r"(scaled), "r"(0x7B807B80u), "r"(0x80008000u));
    }
    return r;
  }
}

// Eight e4m3 values (w0: values 0-3, w1: 4-7) as four packed pairs of T, in order.
template <typename T, bool kHwCvt>
__device__ __forceinline__ uint4 oct_to(unsigned w0, unsigned w1) {
  return make_uint4(pair_to<T, kHwCvt, 0>(w0), pair_to<T, kHwCvt, 1>(w0), pair_to<T, kHwCvt, 0>(w1),
                    pair_to<T, kHwCvt, 1>(w1));
}

}  // namespace e4m3
}  // namespace mla_jit
