// mla_jit indexer, mma.sync (sm_80 / sm_86 / sm_89): fp8_paged_mqa_logits (DeepGEMM's API), the
// decode form. Semantics and work split as the sm_90a kernel's (paged_logits_sm90.cuh): CTA c takes
// its range of (batch entry, 64-key tile) from the schedule.
//
// The CTA's columns are the entry's NEXT_N x H (token, head) pairs, split into token groups of at
// most 64 columns; 4 key groups of 16 keys, or 2 of 32 (paged_warp_keys). Per batch entry: its Q
// tile into shared memory, then its tiles through a NUM_STAGES cp.async ring. Each thread loads its chunks of a tile from the page(s)
// the block table names; the table is read one tile ahead of the loads, so its latency hides
// behind a tile's work. Block ids outside [0, num_blocks) and pages past block_table's columns
// load zeros.
#pragma once

#include "mma_sm80.cuh"
#include "work.cuh"

namespace mla_jit {
namespace indexer {

// Tokens of a warp: the most that divide NEXT_N and fit 64 columns.
constexpr int paged_warp_tokens(int next_n, int h) {
  int t = next_n;
  while (t > 1 && (next_n % t != 0 || t * h > 64)) --t;
  return t;
}

// Token groups of the paged kernel, and keys a warp: 16 (4 key groups) up to 2 token groups, else 32
// (at most 8 warps: registers for the accumulators).
constexpr int paged_token_groups(int next_n, int h) { return next_n / paged_warp_tokens(next_n, h); }
constexpr int paged_warp_keys(int next_n, int h) { return paged_token_groups(next_n, h) <= 2 ? 16 : 32; }

template <int H_, int D_, int NEXT_N_, int PAGE_, int NUM_STAGES_, bool FP8_MMA_>
struct PagedSm80Config
    : Sm80TileConfig<H_, D_, paged_warp_tokens(NEXT_N_, H_) * H_, paged_token_groups(NEXT_N_, H_),
                     paged_warp_keys(NEXT_N_, H_), NUM_STAGES_, FP8_MMA_> {
  static constexpr int NEXT_N = NEXT_N_, PAGE = PAGE_;
  static_assert(PAGE == 32 || PAGE == 64 || PAGE == 128, "page: 32, 64 or 128 keys");
  static_assert(NUM_STAGES_ >= 2, "stages");
  static constexpr int kBoxKeys = PAGE < kTileKeys ? PAGE : kTileKeys;   // keys of a tile in one page
  static constexpr int kBoxes = kTileKeys / kBoxKeys;
};

namespace detail {

// The pages of tile t's boxes (-1: none), read from the entry's block table row.
template <typename Cfg>
struct TilePages {
  int id[Cfg::kBoxes];

  __device__ __forceinline__ void read(const PagedParams& p, const int* table, int t, int t_last) {
#pragma unroll
    for (int box = 0; box < Cfg::kBoxes; ++box) {
      const int page = (t * kTileKeys + box * Cfg::kBoxKeys) / Cfg::PAGE;
      id[box] = t < t_last && page < p.max_blocks ? __ldg(table + page) : -1;
    }
  }
  __device__ __forceinline__ int of_row(int row) const {
    if constexpr (Cfg::kBoxes == 1) return id[0];
    else return row < Cfg::kBoxKeys ? id[0] : id[1];
  }
};

// Tile t (keys t * 64 ...) of pages `pages` into stage s.
template <typename Cfg>
__device__ __forceinline__ void load_page_tile(typename Cfg::SharedStorage& ss, int s, const PagedSm80Params& pp,
                                               const TilePages<Cfg>& pages, int t, int tid) {
  constexpr int kChunks = kTileKeys * Cfg::K_CHUNKS;
  const unsigned dst = sm80::smem_u32(ss.k[s]);
#pragma unroll
  for (int j = 0; j < (kChunks + Cfg::NUM_THREADS - 1) / Cfg::NUM_THREADS; ++j) {
    const int i = tid + j * Cfg::NUM_THREADS;
    if (kChunks % Cfg::NUM_THREADS != 0 && i >= kChunks) break;
    const int row = i / Cfg::K_CHUNKS, c = i % Cfg::K_CHUNKS;
    const int id = pages.of_row(row);
    const bool ok = id >= 0 && id < pp.num_blocks;
    const int in_page = (t * kTileKeys + row) % Cfg::PAGE;
    const unsigned char* src = pp.kv_cache + (ok ? id * pp.page_stride + in_page * Cfg::D + c * 16 : 0);
    sm80::cp_async_16(dst + sm80::swz<Cfg::K_CHUNKS>(row, c), src, ok ? 16 : 0);
  }
  if (tid < kTileKeys / 4) {
    const int row = 4 * tid, id = pages.of_row(row);
    const bool ok = id >= 0 && id < pp.num_blocks;
    const int in_page = (t * kTileKeys + row) % Cfg::PAGE;
    const unsigned char* src =
        pp.kv_cache + (ok ? id * pp.page_stride + Cfg::PAGE * Cfg::D + in_page * sizeof(float) : 0);
    sm80::cp_async_16(sm80::smem_u32(&ss.scale[s][row]), src, ok ? 16 : 0);
  }
}

template <typename Cfg>
__device__ __forceinline__ void paged_sm80_segment(typename Cfg::SharedStorage& ss, const PagedSm80Params& pp,
                                                   WarpTile<Cfg>& tile, int bi, int t_first, int t_last, int tid,
                                                   int lane) {
  using Sum = typename Cfg::Sum;
  constexpr int NS = Cfg::NUM_STAGES;
  const PagedParams& p = pp.base;
  const int* table = p.block_table + bi * p.block_table_stride;
  const int n = t_last - t_first;
  __syncthreads();   // the previous entry's reads of the Q tile and the stages are done
  load_q_tile<Cfg>(ss.q, pp.q + (long long)bi * Cfg::N * Cfg::D, Cfg::N, tid);
  sm80::cp_async_commit();
  TilePages<Cfg> pages;
  pages.read(p, table, t_first, t_last);
#pragma unroll
  for (int s = 0; s < NS - 1; ++s) {
    if (s < n) {
      load_page_tile<Cfg>(ss, s, pp, pages, t_first + s, tid);
      pages.read(p, table, t_first + s + 1, t_last);
    }
    sm80::cp_async_commit();
  }
  float w[Sum::kWeights];
  load_weights<Cfg>(w, tile, pp.weights, pp.w_stride, bi * Cfg::NEXT_N, p.b * Cfg::NEXT_N, lane);
  int row[Sum::kOut], limit[Sum::kOut];
#pragma unroll
  for (int m = 0; m < Sum::kOut; ++m) {
    const int j = tile.out_token(m, lane);
    const bool stored = Sum::out_owner(lane) && j < Cfg::NEXT_N;
    row[m] = stored ? bi * Cfg::NEXT_N + j : -1;
    limit[m] = stored ? paged_row_limit(p.context_lens, bi, j, Cfg::NEXT_N, p.lens_2d) : 0;
  }
  auto load = [&](int j, int stage) {
    load_page_tile<Cfg>(ss, stage, pp, pages, t_first + j, tid);
    pages.read(p, table, t_first + j + 1, t_last);
  };
  auto finish = [&](int i, auto buf) {
#pragma unroll
    for (int mt = 0; mt < Cfg::MT; ++mt) {
      float out[Sum::kOut];
      tile.template head_sum<decltype(buf)::value>(mt, w, out, lane);
      const int key = (t_first + i) * kTileKeys + tile.out_row(mt, lane);
#pragma unroll
      for (int m = 0; m < Sum::kOut; ++m) {
        if (row[m] >= 0 && key < p.stride) p.logits[row[m] * p.stride + key] = key < limit[m] ? out[m] : kNegInf;
      }
    }
  };
  run_tiles<Cfg>(ss, tile, n, load, finish, lane);
}

}  // namespace detail

template <typename Cfg>
__device__ __forceinline__ void paged_sm80_body(const PagedSm80Params& pp) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  auto& ss = *reinterpret_cast<typename Cfg::SharedStorage*>(smem_raw);
  const int tid = threadIdx.x, lane = tid % 32;
  if (pp.base.clean) detail::paged_cleaner(pp.base, tid, Cfg::NUM_THREADS);
  WarpTile<Cfg> tile;
  tile.init(tid / 32);
  detail::for_each_segment(pp.base, [&](int bi, int t_first, int t_last) {
    detail::paged_sm80_segment<Cfg>(ss, pp, tile, bi, t_first, t_last, tid, lane);
  });
}

}  // namespace indexer
}  // namespace mla_jit
