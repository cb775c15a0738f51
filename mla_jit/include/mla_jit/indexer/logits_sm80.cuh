// mla_jit indexer, mma.sync (sm_80 / sm_86 / sm_89): fp8_mqa_logits (DeepGEMM's API), keys ragged
// per query row. The work units and the clean pass are the sm_90a kernel's (indexer/work.cuh):
// a q block of UNIT_Q rows x a chunk of keys, dealt to the persistent CTAs in snake order
// (cta_unit).
//
// A CTA (64 / KW key groups of KW keys x TG token groups of 64 columns; indexer/mma_sm80.cuh) takes
// a unit: its Q tile (64 TG rows of (token, head)) into shared memory, then the unit's 64-key tiles
// through a NUM_STAGES cp.async ring (one __syncthreads a tile: every warp reads every stage).
// Rows past m read zero Q and weights and are stored into the buffer's row padding (the op
// allocates align(m, UNIT_Q) rows); keys past n read zero K and scale.
#pragma once

#include "mma_sm80.cuh"
#include "work.cuh"

namespace mla_jit {
namespace indexer {

// KW keys x 64 columns a warp, TG token groups: units of UNIT_Q = 64 TG / H rows.
template <int H_, int D_, int NUM_STAGES_, bool FP8_MMA_, int KW_, int TG_>
struct LogitsSm80Config : Sm80TileConfig<H_, D_, 64, TG_, KW_, NUM_STAGES_, FP8_MMA_> {
  using Base = Sm80TileConfig<H_, D_, 64, TG_, KW_, NUM_STAGES_, FP8_MMA_>;
  static constexpr int UNIT_Q = Base::N / H_;   // rows of a work unit
  static_assert(NUM_STAGES_ >= 2, "stages");
};

namespace detail {

// Keys [key0, key0 + 64) and their scales into stage s (keys >= n: zeros).
template <typename Cfg>
__device__ __forceinline__ void load_key_tile(typename Cfg::SharedStorage& ss, int s, const LogitsSm80Params& pp,
                                              int key0, int tid) {
  constexpr int kChunks = kTileKeys * Cfg::K_CHUNKS;
  static_assert(kChunks % Cfg::NUM_THREADS == 0, "whole rounds");
  const int n = pp.base.n;
  const unsigned dst = sm80::smem_u32(ss.k[s]);
#pragma unroll
  for (int j = 0; j < kChunks / Cfg::NUM_THREADS; ++j) {
    const int i = tid + j * Cfg::NUM_THREADS;
    const int row = i / Cfg::K_CHUNKS, c = i % Cfg::K_CHUNKS, key = key0 + row;
    const bool ok = key < n;
    sm80::cp_async_16(dst + sm80::swz<Cfg::K_CHUNKS>(row, c), ok ? pp.k + (long long)key * Cfg::D + c * 16 : pp.k,
                      ok ? 16 : 0);
  }
  if (tid < kTileKeys / 4) {
    const int key = key0 + 4 * tid;
    const int bytes = max(0, min(16, (n - key) * 4));
    sm80::cp_async_16(sm80::smem_u32(&ss.scale[s][4 * tid]), bytes ? pp.k_scale + key : pp.k_scale, bytes);
  }
}

template <typename Cfg>
__device__ __forceinline__ void logits_sm80_unit(typename Cfg::SharedStorage& ss, const LogitsSm80Params& pp,
                                                 const Unit& un, WarpTile<Cfg>& tile, int tid, int lane) {
  using Sum = typename Cfg::Sum;
  constexpr int NS = Cfg::NUM_STAGES;
  const LogitsParams& p = pp.base;
  const int row0 = un.qb * Cfg::UNIT_Q;
  __syncthreads();   // the previous unit's reads of the Q tile and the stages are done
  load_q_tile<Cfg>(ss.q, pp.q + (long long)row0 * Cfg::H * Cfg::D, (p.m - row0) * Cfg::H, tid);
  sm80::cp_async_commit();
#pragma unroll
  for (int s = 0; s < NS - 1; ++s) {
    if (s < un.n_tiles) load_key_tile<Cfg>(ss, s, pp, un.t0 + s * kTileKeys, tid);
    sm80::cp_async_commit();
  }
  float w[Sum::kWeights];
  load_weights<Cfg>(w, tile, pp.weights, pp.w_stride, row0, p.m, lane);
  int ks[Sum::kOut], ke[Sum::kOut];   // the key ranges of the lane's rows
#pragma unroll
  for (int m = 0; m < Sum::kOut; ++m) {
    const int r = row0 + tile.out_token(m, lane);
    ks[m] = r < p.m ? __ldg(p.ks + r) : 0;
    ke[m] = r < p.m ? __ldg(p.ke + r) : 0;
  }
  auto load = [&](int j, int stage) { load_key_tile<Cfg>(ss, stage, pp, un.t0 + j * kTileKeys, tid); };
  auto finish = [&](int i, auto buf) {
#pragma unroll
    for (int mt = 0; mt < Cfg::MT; ++mt) {
      float out[Sum::kOut];
      tile.template head_sum<decltype(buf)::value>(mt, w, out, lane);
      const int key = un.t0 + i * kTileKeys + tile.out_row(mt, lane);
#pragma unroll
      for (int m = 0; m < Sum::kOut; ++m) {
        if (!Sum::out_owner(lane)) continue;
        float* row = p.logits + (row0 + tile.out_token(m, lane)) * p.stride;
        if (p.max_seqlen_k > 0) {
          const int col = key - ks[m];
          if (col >= 0 && col < p.max_seqlen_k) row[col] = out[m];
        } else {
          const bool seen = key >= ks[m] && key < ke[m];
          row[key] = (p.clean && !seen) ? kNegInf : out[m];
        }
      }
    }
  };
  run_tiles<Cfg>(ss, tile, un.n_tiles, load, finish, lane);
}

}  // namespace detail

template <typename Cfg>
__device__ __forceinline__ void logits_sm80_body(const LogitsSm80Params& pp) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  auto& ss = *reinterpret_cast<typename Cfg::SharedStorage*>(smem_raw);
  const LogitsParams& p = pp.base;
  const int tid = threadIdx.x, lane = tid % 32;
  if (p.clean && p.max_seqlen_k == 0) detail::logits_cleaner<Cfg::UNIT_Q>(p, tid, Cfg::NUM_THREADS);
  WarpTile<Cfg> tile;
  tile.init(tid / 32);
  const int units = detail::num_units(p);
#pragma unroll 1
  for (int k = 0, u = detail::cta_unit(0); u < units; u = detail::cta_unit(++k)) {
    const detail::Unit un = detail::unit_of<Cfg::UNIT_Q>(p, u, lane);
    if (un.n_tiles > 0) detail::logits_sm80_unit<Cfg>(ss, pp, un, tile, tid, lane);
  }
}

}  // namespace indexer
}  // namespace mla_jit
