// mla_jit indexer: the work split and the clean pass, shared by the kernels of every arch.
//   fp8_mqa_logits: work units of a q block (UNIT_Q rows) times a chunk of keys; a unit visits the
//   64-key tiles of its chunk that some row of its block sees.
//   fp8_paged_mqa_logits: one range of (batch entry, 64-key tile) per CTA, from the schedule.
// The clean pass writes -inf into the columns a CTA's tiles do not cover.
#pragma once

#include "common.cuh"

namespace mla_jit {
namespace indexer {
namespace detail {

// One work unit: q block qb, chunk [c0, c1) of the keys, and its tiles [t0, t0 + 64 n_tiles).
struct Unit {
  int qb, c0, c1, t0, n_tiles;
};

// Called by whole warps (lane r reads row r of the block; UNIT_Q <= 32).
template <int UNIT_Q>
__device__ __forceinline__ Unit unit_of(const LogitsParams& p, int u, int lane) {
  static_assert(UNIT_Q <= 32, "a lane a row");
  Unit w;
  w.qb = u / p.num_chunks;
  w.c0 = (u - w.qb * p.num_chunks) * p.chunk_keys;
  w.c1 = min(p.n, w.c0 + p.chunk_keys);
  const int r = w.qb * UNIT_Q + lane;
  int s = p.n, e = 0;
  if (lane < UNIT_Q && r < p.m) {
    s = max(__ldg(p.ks + r), 0);
    e = min(__ldg(p.ke + r), p.n);
    if (s >= e) s = p.n, e = 0;   // an empty row widens nothing
  }
  const int lo = max(int(__reduce_min_sync(0xffffffffu, unsigned(s))), w.c0);
  const int hi = min(int(__reduce_max_sync(0xffffffffu, unsigned(e))), w.c1);
  w.t0 = lo < hi ? (lo & ~(kTileKeys - 1)) : w.c0;
  w.n_tiles = lo < hi ? (hi - w.t0 + kTileKeys - 1) / kTileKeys : 0;
  return w;
}

__device__ __forceinline__ int num_units(const LogitsParams& p) {
  return p.num_q_blocks * p.num_chunks;
}

// The CTA's k-th work unit: units are dealt in rounds of gridDim.x, every other round in reverse
// (CTA c takes c, 2G - 1 - c, 2G + c, ...). Plain round robin with an even CTA count and 2 chunks
// a q block gave half the CTAs every full first chunk of a causal batch (0.71x of DeepGEMM at
// seq 4096, kv 8192); the snake mixes chunks and pairs small q blocks with large ones. Once a
// CTA's unit is past the end, so are all its later ones.
__device__ __forceinline__ int cta_unit(int k) {
  const int g = gridDim.x, c = blockIdx.x;
  return k * g + ((k & 1) ? g - 1 - c : c);
}

// -inf into the columns [a, b) of a row (a a multiple of 4; `lane` of `lanes` threads).
__device__ __forceinline__ void fill_neg_inf(float* row, int a, int b, int lane, int lanes) {
  const int b4 = a + ((b - a) & ~3);
  const float4 v = make_float4(kNegInf, kNegInf, kNegInf, kNegInf);
  for (int c = a + 4 * lane; c < b4; c += 4 * lanes) *reinterpret_cast<float4*>(row + c) = v;
  if (lane < b - b4) row[b4 + lane] = kNegInf;
}

template <int UNIT_Q>
__device__ __forceinline__ void logits_cleaner(const LogitsParams& p, int lane, int lanes) {
  const int units = num_units(p);
#pragma unroll 1
  for (int k = 0, u = cta_unit(0); u < units; u = cta_unit(++k)) {
    const Unit w = unit_of<UNIT_Q>(p, u, lane % 32);
    const int tiles_end = w.t0 + w.n_tiles * kTileKeys;
    const int r0 = w.qb * UNIT_Q, r1 = min(p.m, r0 + UNIT_Q);
#pragma unroll 1
    for (int r = r0; r < r1; ++r) {
      float* row = p.logits + r * p.stride;
      fill_neg_inf(row, w.c0, w.t0, lane, lanes);
      if (tiles_end < w.c1) fill_neg_inf(row, tiles_end, w.c1, lane, lanes);
    }
  }
}

__device__ __forceinline__ int paged_tiles(const PagedParams& p, int bi) {
  return (paged_keys(p.context_lens, bi, p.next_n, p.lens_2d) + kTileKeys - 1) / kTileKeys;
}

// Calls f(batch, first tile, end tile) for each batch entry of this CTA's range of the schedule,
// in order. Bounded by the batch size and each entry's tiles whatever the schedule holds.
template <typename F>
__device__ __forceinline__ void for_each_segment(const PagedParams& p, F&& f) {
  const int c = blockIdx.x;
  int bi = max(__ldg(p.schedule + 2 * c), 0), t = max(__ldg(p.schedule + 2 * c + 1), 0);
  const int b_end = __ldg(p.schedule + 2 * c + 2), t_end = __ldg(p.schedule + 2 * c + 3);
#pragma unroll 1
  for (; bi < p.b && bi <= b_end; ++bi, t = 0) {
    const int n = paged_tiles(p, bi);
    const int last = bi == b_end ? min(t_end, n) : n;
    if (t < last) f(bi, t, last);
  }
}

__device__ __forceinline__ void paged_cleaner(const PagedParams& p, int lane, int lanes) {
  const int rows = p.b * p.next_n;
#pragma unroll 1
  for (int r = blockIdx.x; r < rows; r += gridDim.x) {
    const int first = min(paged_tiles(p, r / p.next_n) * kTileKeys, p.max_context_len);
    fill_neg_inf(p.logits + r * p.stride, first, p.max_context_len, lane, lanes);
  }
}

}  // namespace detail
}  // namespace indexer
}  // namespace mla_jit
