// mla_jit indexer, sm_90a: the linear half of relu on the tensor cores.
//
//   sum_h relu(x_h) w_h = (sum_h |x_h| w_h + sum_h x_h w_h) / 2,   x_h = q_h . k,
//   sum_h x_h w_h = q' . k,   q' = sum_h w_h q_h   (one D-vector per query token).
//
// q' is written as kTerms e4m3 rows with scales s_0 = amax |q'| / 448, s_{j+1} = s_j / kStep, each
// row the rounding of what the rows before it left: e4m3 rounding leaves at most 16 s_j (half a unit
// in [256, 448]), which s_{j+1} = s_j / 28 maps back to 448, so nothing saturates and four terms
// hold q' to 16 s_3, about 1.7e-6 amax |q'| with the scales' float32 rounding. The rows are kCols
// extra wgmma N columns after the heads' (token t's term j in column N + 4 t + j), so one wgmma
// computes every x_h and the four q'_j . k, and the epilogue needs one FFMA per head (on |x_h|, an
// operand modifier) instead of FMNMX + FFMA: relu on the ALU pipe at half rate set the period of
// the fp8_mqa_logits loop.
#pragma once

#include <cuda/std/cstdint>

#include "mla_jit/common/sm90.cuh"
#include "mla_jit/common/sm90_fragment.cuh"

namespace mla_jit {
namespace indexer {

template <int H, int D, int TOKENS>
struct LinearTerms {
  static constexpr int kTerms = 4;
  static constexpr int kCols = kTerms * TOKENS;   // extra N columns (a multiple of 8: TOKENS even)
  static constexpr float kStep = 28.f;
  static constexpr int kThreads = 128;            // one warpgroup builds its tile's rows
  static constexpr int kPairs = TOKENS * D / 2;   // (token, two adjacent d) summed over the heads
  static_assert(kCols % 8 == 0, "whole 8-column wgmma groups");
  static_assert((kPairs < kThreads || kPairs % kThreads == 0) && (D / 2) % 32 == 0, "a warp's pairs: one token");
  static constexpr int kPairsPerThread = kPairs < kThreads ? 1 : kPairs / kThreads;   // (threads >= kPairs idle)
  static constexpr int kWarpsPerToken = D / 64;   // warps sharing a token's pairs

  // Byte offset of (row n, column d) in a K-major e4m3 tile of D-byte rows, swizzled as
  // GMMA::Layout_K_SW128 (D 128) / SW64 (D 64) atoms: 16-byte chunk c of row n at c ^ (n % 8 >> s).
  static __device__ __forceinline__ int offset(int n, int d) {
    if constexpr (D == 128) {
      return n * 128 + (d ^ ((n & 7) << 4));
    } else {
      return n * 64 + (d ^ (((n >> 1) & 3) << 4));
    }
  }

  // Called by the warpgroup's 128 threads (tw) once Q (TOKENS x H rows of the tile, token t's head h
  // in row t H + h) and its weights w[t H + h] have landed: thread tw sums kPairsPerThread pairs
  // (token, two adjacent d) over the heads. Writes rows H TOKENS + 4 t + j (j < 4) of the tile and
  // scale_out[4 t + j] = s_j / 2; red: 4 kPairsPerThread floats of scratch. Ends with the rows
  // visible to the wgmma (async proxy) and the scales to the warpgroup.
  static __device__ __forceinline__ void build(uint8_t* tile, const float* w, float* scale_out, float* red,
                                               int tw, int barrier_id) {
    const int warp = tw / 32, lane = tw % 32;
    float2 v[kPairsPerThread];
    float amax[kPairsPerThread];
#pragma unroll
    for (int i = 0; i < kPairsPerThread; ++i) {   // q' of pair p, and its warp's amax
      const int p = tw + kThreads * i, t = p / (D / 2), d = 2 * (p % (D / 2));
      float2 acc = make_float2(0.f, 0.f);
      if (p < kPairs) {   // (warp-uniform)
#pragma unroll 8
        for (int h = 0; h < H; ++h) {
          const float2 qv = e4m3x2_to_float2(*reinterpret_cast<const uint16_t*>(tile + offset(t * H + h, d)));
          const float wh = w[t * H + h];
          acc.x = fmaf(wh, qv.x, acc.x);
          acc.y = fmaf(wh, qv.y, acc.y);
        }
      }
      v[i] = acc;
      float m = fmaxf(fabsf(acc.x), fabsf(acc.y));
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
      amax[i] = m;
    }
    if constexpr (kWarpsPerToken > 1) {   // a token's amax over its adjacent warps
#pragma unroll
      for (int i = 0; i < kPairsPerThread; ++i) {
        if (lane == 0) red[i * 4 + warp] = amax[i];
      }
      named_barrier_sync(barrier_id, kThreads);
      const int first = warp / kWarpsPerToken * kWarpsPerToken;
#pragma unroll
      for (int i = 0; i < kPairsPerThread; ++i) {
        float m = red[i * 4 + first];
#pragma unroll
        for (int k = 1; k < kWarpsPerToken; ++k) m = fmaxf(m, red[i * 4 + first + k]);
        amax[i] = m;
      }
    }
#pragma unroll
    for (int i = 0; i < kPairsPerThread; ++i) {   // term j: the rounding of what terms 0 .. j - 1 left
      const int p = tw + kThreads * i, t = p / (D / 2), d = 2 * (p % (D / 2));
      if (p >= kPairs) continue;
      // A q' below 1e-30 is taken as zero (its linear part lies far under the tests' absolute
      // bound): 448 * 28^3 / amax would overflow, and 0 * inf put NaN into the terms.
      const float a = amax[i] >= 1e-30f ? amax[i] : 0.f;
      float s = a * (1.f / 448.f);
      float inv = a > 0.f ? 448.f / a : 0.f;
      float2 r = v[i];
#pragma unroll
      for (int j = 0; j < kTerms; ++j) {
        const uint16_t e = pack_e4m3x2(r.x * inv, r.y * inv);   // (saturating: only fp32 rounding passes 448)
        *reinterpret_cast<uint16_t*>(tile + offset(H * TOKENS + kTerms * t + j, d)) = e;
        if (d == 0) scale_out[kTerms * t + j] = 0.5f * s;
        const float2 back = e4m3x2_to_float2(e);
        r.x = fmaf(-s, back.x, r.x);
        r.y = fmaf(-s, back.y, r.y);
        s *= 1.f / kStep;
        inv *= kStep;
      }
    }
    fence_proxy_async_shared();   // the generic-proxy writes, before the wgmma (async proxy) reads
    named_barrier_sync(barrier_id, kThreads);
  }
};

}  // namespace indexer
}  // namespace mla_jit
