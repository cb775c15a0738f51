// mla_jit indexer, sm_90a: fp8_paged_mqa_logits (DeepGEMM's API), the decode form: NEXT_N query
// tokens of each batch entry against its paged FP8 key cache,
//   logits[b * NEXT_N + j, key] = sum_h relu(q[b, j, h] . k[key]) * weights[b * NEXT_N + j, h] * scale[key]
// for the keys row j sees (context_lens, 1-D or 2-D; indexer/common.cuh), -inf for the other keys
// of the 64-key tiles it computes.
//
// A cache page (uint8, stride(0) bytes apart) holds PAGE keys of D e4m3 values, then PAGE float32
// scales. Work: 64-key tiles of the batch entries' keys, cut into one contiguous range per CTA by
// the schedule (get_paged_mqa_logits_metadata: {batch, tile} where CTA c starts). Roles as the
// ragged kernel's (logits_sm90.cuh): warps 0 .. LOAD_WARPS - 1 load (TMA: warp 0 the Q and weights
// of each batch entry; warp w the page(s) and scales of the CTA's tiles g with g % LOAD_WARPS == w,
// through the block table, read a chunk of 32 of its tiles ahead), the producer warpgroup's other
// warps clean (rows c, c + grid, ...: -inf past the entry's last tile, clean_logits), MATH_WGS
// warpgroups compute the CTA's tiles in turn (tile g of the CTA to warpgroup g % MATH_WGS). The
// producer runs NUM_STAGES tiles ahead, and each math warpgroup's epilogue overlaps the others'
// wgmma; with 3 math warpgroups (fewer registers each) two epilogues run beside each wgmma.
// Pages past block_table's columns, and block ids outside the cache, load zeros (TMA bounds).
#pragma once

#include "linear_terms.cuh"
#include "logits_sm90.cuh"
#include "mla_jit/common/trace.cuh"

namespace mla_jit {
namespace indexer {

// LINEAR: relu's linear half on the tensor cores (linear_terms.cuh), as fp8_mqa_logits does: each math
// warpgroup gets its own copy of the entry's Q (a TMA load each) with 4 NEXT_N rows of q' terms after
// the N head rows, and the wgmma N grows by as much.
template <int H_, int D_, int NEXT_N_, int PAGE_, int NUM_STAGES_, int MATH_WGS_, int LOAD_WARPS_, bool LINEAR_>
struct PagedSm90Config {
  static constexpr int H = H_, D = D_, NEXT_N = NEXT_N_, PAGE = PAGE_, NUM_STAGES = NUM_STAGES_;
  static constexpr int MATH_WGS = MATH_WGS_;     // math warpgroups, taking the CTA's tiles in turn
  static constexpr int LOAD_WARPS = LOAD_WARPS_;  // producer warps, issuing the CTA's tiles in turn
  static constexpr int kLoadWarps = LOAD_WARPS;   // (run_roles)
  static constexpr bool LINEAR = LINEAR_;
  static constexpr int N = NEXT_N * H;
  static constexpr int NUM_THREADS = 128 * (1 + MATH_WGS);
  static_assert(MATH_WGS == 2 || MATH_WGS == 3, "two or three math warpgroups");
  // Stage s then always serves the same warpgroup (tile g: stage g % NUM_STAGES, warpgroup g %
  // MATH_WGS). Otherwise a warpgroup can wait on use u of a stage whose use u - 1 (another warpgroup's
  // tile, issued earlier but not yet landed: TMA loads complete out of order) is still pending, and
  // its parity wait passes at once on the wrong phase (16 stages with 3 warpgroups hung on the H200).
  static_assert(NUM_STAGES % MATH_WGS == 0, "stages: a multiple of the math warpgroups");
  // Likewise each stage is always filled by the same load warp, in order.
  static_assert(LOAD_WARPS >= 1 && LOAD_WARPS <= 3 && NUM_STAGES % LOAD_WARPS == 0,
                "stages: a multiple of the load warps (1 to 3)");
  static_assert(H == 8 || H == 16 || H == 32 || H == 64, "heads: 8, 16, 32 or 64");
  static_assert(D == 64 || D == 128, "head dim: 64 or 128");
  static_assert(NEXT_N >= 1 && N <= 256, "next_n x heads: at most 256 (one wgmma N)");
  static_assert(PAGE == 32 || PAGE == 64 || PAGE == 128, "page: 32, 64 or 128 keys");
  static constexpr int kBoxKeys = PAGE < kTileKeys ? PAGE : kTileKeys;   // keys per TMA box
  static constexpr int kBoxes = kTileKeys / kBoxKeys;                      // boxes per tile
  using Lin = LinearTerms<H, D, LINEAR ? NEXT_N : 2>;   // (2: any valid instance when unused)
  static constexpr int kLinCols = LINEAR ? Lin::kCols : 0;
  static constexpr int NT = N + kLinCols;    // wgmma N
  static_assert(NT <= 256, "one wgmma N");
  static constexpr int kQCopies = LINEAR ? MATH_WGS : 1;          // each warpgroup writes its own q' rows
  static constexpr int kQTile = (NT * D + 1023) / 1024 * 1024;   // each copy 1024-byte aligned (swizzle)
  using Mma = ScoreMma<D, NT>;
  using Fp8 = typename Mma::Fp8;
  using Sum = HeadSum<N, H, kLinCols>;

  struct SharedStorage {
    alignas(1024) Fp8 q[2][kQCopies][kQTile];   // [slot][copy]: N head rows (TMA), kLinCols q' rows
    alignas(1024) Fp8 k[NUM_STAGES][kTileKeys * D];
    // (TMA destinations: 128-byte aligned, each slot a multiple of 128 bytes)
    alignas(128) float scale[NUM_STAGES][kTileKeys];
    alignas(128) float weights[2][(N + 31) / 32 * 32];
    float lin_scale[2][MATH_WGS][LINEAR ? Lin::kCols : 1];   // [slot][math warpgroup]: s_j / 2 of column 4 t + j
    float lin_red[MATH_WGS][4 * Lin::kPairsPerThread];       // [math warpgroup]: Lin::build's scratch
    alignas(8) uint64_t q_full[2], q_empty[2];
    uint64_t k_full[NUM_STAGES], k_empty[NUM_STAGES];
  };
  static constexpr int kSmemBytes = Sm90SmemSize<SharedStorage>::kBytes;
  static constexpr unsigned kQBytes = kQCopies * N * D + N * sizeof(float);
  static constexpr unsigned kTileBytes = kTileKeys * D + kTileKeys * sizeof(float);
  static constexpr int kRegsProducer = 40;
  static constexpr int kRegsMath = MATH_WGS == 2 ? 232 : 152;   // (run_roles checks the balance)
};

namespace detail {

// Built with MLA_JIT_TRACE (bench/trace_paged_indexer.py): one row of mla_jit_trace_indexer per CTA,
// %globaltimer (ns) at: 0 the CTA's start, 1 load warp 0's first K load issued, 2 math warpgroup 0's
// first tile landed, 3 its first wgmma done, 4 the last K load issued (latest load warp), 5 the last
// tile's logits stored (latest math warpgroup); values: 6 the SM, 7 the CTA's tiles. Without the flag
// every mark compiles to nothing.
struct PagedTrace {
  enum Event { kStart, kFirstLoad, kFirstLanded, kFirstMma, kLastLoad, kLastStore, kSm, kTiles };
#ifdef MLA_JIT_TRACE
  static __device__ __forceinline__ void time(int event) { MLA_JIT_TRACE_TIME(mla_jit_trace_indexer, event); }
  static __device__ __forceinline__ void latest(int event) { MLA_JIT_TRACE_LATEST(mla_jit_trace_indexer, event); }
  static __device__ __forceinline__ void value(int event, unsigned long long v) {
    MLA_JIT_TRACE_VALUE(mla_jit_trace_indexer, event, v);
  }
  static __device__ __forceinline__ void sm() { value(kSm, trace_smid()); }
#else
  static __device__ __forceinline__ void time(int) {}
  static __device__ __forceinline__ void latest(int) {}
  static __device__ __forceinline__ void value(int, unsigned long long) {}
  static __device__ __forceinline__ void sm() {}
#endif
};

// The load warps: warp w issues the loads of the CTA's tiles g with g % LOAD_WARPS == w (so stage
// g % NUM_STAGES always belongs to one warp), warp 0 also the Q and weights of each batch entry.
// One warp alone issued a tile every ~500 cycles (ncu: 87-91% of its time busy at batch 4096),
// about the rate DRAM serves them. Lane i reads the block table for the i-th tile of a chunk of 32
// of the warp's tiles, one chunk ahead (also across batch entries: the next entry's first chunk,
// whose pages do not depend on its length), so that the table's latency (~1 us after the L2
// flush, 11% of the single warp's time) is not paid between a chunk's last load and its next.
template <typename Cfg>
struct BlockIds {
  int id[Cfg::kBoxes];   // lane i: the pages of tile t0 + LOAD_WARPS * i of entry bi (-1: zeros)
  int bi = -1, t0 = -1;  // which chunk

  __device__ __forceinline__ void fetch(const PagedParams& p, int b, int t, int lane) {
    bi = b, t0 = t;
    const int t_lane = t + Cfg::LOAD_WARPS * lane;
#pragma unroll
    for (int box = 0; box < Cfg::kBoxes; ++box) {
      // Every column of the table is readable; tiles past the entry's length are never issued. (The
      // unsigned compares also keep a garbage schedule's huge tile, whose page wraps, in bounds.)
      const int page = (t_lane * kTileKeys + box * Cfg::kBoxKeys) / Cfg::PAGE;
      id[box] = unsigned(b) < unsigned(p.b) && unsigned(page) < unsigned(p.max_blocks)
                    ? __ldg(p.block_table + b * p.block_table_stride + page) : -1;
    }
  }
};

template <typename Cfg>
__device__ __forceinline__ void paged_producer(typename Cfg::SharedStorage& ss, const PagedParams& p,
                                               const TmaDescriptor* q_desc, const TmaDescriptor* w_desc,
                                               const TmaDescriptor* k_desc, const TmaDescriptor* s_desc, int warp) {
  constexpr int NS = Cfg::NUM_STAGES, LW = Cfg::LOAD_WARPS;
  const int lane = threadIdx.x % 32;
  const uint64_t k_policy = l2_evict_first_policy();   // each page is read once
  const uint32_t k_full = smem_addr(&ss.k_full[0]), k_empty = smem_addr(&ss.k_empty[0]);
  const uint32_t k_smem = smem_addr(ss.k[0]), scale_smem = smem_addr(ss.scale[0]);
  int stage = warp;     // of this warp's next tile
  uint32_t round = 0;   // how often its stages have wrapped (the empty barrier's parity)
  uint32_t q_iter = 0, kv_iter = 0;
  BlockIds<Cfg> next;   // the warp's next chunk; the first one before the first entry's length is known
  next.fetch(p, max(__ldg(p.schedule + 2 * blockIdx.x), 0), max(__ldg(p.schedule + 2 * blockIdx.x + 1), 0) + warp,
             lane);
  for_each_segment(p, [&](int bi, int t_first, int t_last) {
    const int x = q_iter & 1;
    if (warp == 0 && lane == 0) {
      mbarrier_wait(&ss.q_empty[x], ((q_iter >> 1) & 1) ^ 1);
      mbarrier_arrive_expect_tx(&ss.q_full[x], Cfg::kQBytes);
#pragma unroll
      for (int c = 0; c < Cfg::kQCopies; ++c) tma_load_2d(ss.q[x][c], q_desc, &ss.q_full[x], 0, bi * Cfg::N);
      tma_load_2d(ss.weights[x], w_desc, &ss.q_full[x], 0, bi * Cfg::NEXT_N);
    }
    ++q_iter;
    const int first = t_first + (warp + LW - int(kv_iter % LW)) % LW;   // this warp's first tile here
    kv_iter += t_last - t_first;
    if (first < t_last && (next.bi != bi || next.t0 != first)) next.fetch(p, bi, first, lane);
#pragma unroll 1
    for (int t0 = first; t0 < t_last; t0 += 32 * LW) {
      const BlockIds<Cfg> cur = next;
      if (t0 + 32 * LW < t_last) {
        next.fetch(p, bi, t0 + 32 * LW, lane);
      } else {   // the next entry's first tile of this warp (its tiles start at 0; wasted, and fetched
                 // again at the segment's start, when that entry has no tiles or the CTA's range ends)
        next.fetch(p, bi + 1, (warp + LW - int(kv_iter % LW)) % LW, lane);
      }
      const int count = min(32, (t_last - t0 + LW - 1) / LW);
#pragma unroll 1
      for (int i = 0; i < count; ++i) {
        int ids[Cfg::kBoxes];
#pragma unroll
        for (int box = 0; box < Cfg::kBoxes; ++box) ids[box] = __shfl_sync(0xffffffffu, cur.id[box], i);
        if (lane == 0) {
          mbarrier_wait(k_empty + 8 * stage, (round & 1) ^ 1);
          mbarrier_arrive_expect_tx(k_full + 8 * stage, Cfg::kTileBytes);
#pragma unroll
          for (int box = 0; box < Cfg::kBoxes; ++box) {
            const int row = ((t0 + LW * i) * kTileKeys + box * Cfg::kBoxKeys) % Cfg::PAGE;
            tma_load_3d_hint(k_smem + (stage * kTileKeys + box * Cfg::kBoxKeys) * Cfg::D, k_desc, k_full + 8 * stage,
                             0, row, ids[box], k_policy);
            tma_load_2d(scale_smem + (stage * kTileKeys + box * Cfg::kBoxKeys) * 4, s_desc, k_full + 8 * stage, row,
                        ids[box]);
          }
          if (warp == 0 && round == 0 && stage == 0) PagedTrace::time(PagedTrace::kFirstLoad);
        }
        stage += LW;
        if (stage >= NS) stage -= NS, ++round;
        __syncwarp();
      }
    }
  });
  if (lane == 0) {
    PagedTrace::latest(PagedTrace::kLastLoad);
    if (warp == 0) PagedTrace::value(PagedTrace::kTiles, kv_iter);
  }
}

template <typename Cfg>
__device__ __forceinline__ void paged_math(typename Cfg::SharedStorage& ss, const PagedParams& p, int wg) {
  using Sum = typename Cfg::Sum;
  const int tw = threadIdx.x % 128, warp = tw / 32, lane = tw % 32;
  const int row_in_tile = warp * 16 + lane / 4;
  auto acc = Cfg::Mma::make_acc();
  float w[Sum::kWeights];
  float wl[Sum::kLinWeights > 0 ? Sum::kLinWeights : 1];
  constexpr float kHeadFactor = Cfg::LINEAR ? 0.5f : 1.f;   // (x + |x|) / 2
  int limit[Sum::kOut], row[Sum::kOut];
  uint32_t q_iter = 0, kv_iter = 0;
  for_each_segment(p, [&](int bi, int t_first, int t_last) {
    const int x = q_iter & 1;
    mbarrier_wait(&ss.q_full[x], (q_iter >> 1) & 1);
    const typename Cfg::Fp8* q_tile = ss.q[x][Cfg::LINEAR ? wg : 0];
    if constexpr (Cfg::LINEAR) {   // this warpgroup's q' rows (named barrier 1 + wg)
      Cfg::Lin::build(reinterpret_cast<uint8_t*>(ss.q[x][wg]), ss.weights[x], ss.lin_scale[x][wg], ss.lin_red[wg],
                      tw, 1 + wg);
    }
#pragma unroll
    for (int i = 0; i < Sum::kWeights; ++i) w[i] = kHeadFactor * ss.weights[x][Sum::weight_column(i, lane)];
#pragma unroll
    for (int i = 0; i < Sum::kLinWeights; ++i) wl[i] = Sum::lin_weight(i, lane, ss.lin_scale[x][wg]);
#pragma unroll
    for (int m = 0; m < Sum::kOut; ++m) {
      const int j = Sum::out_token(m, lane);
      const bool stored = Sum::out_owner(lane) && j < Cfg::NEXT_N;
      row[m] = stored ? bi * Cfg::NEXT_N + j : -1;
      limit[m] = stored ? paged_row_limit(p.context_lens, bi, j, Cfg::NEXT_N, p.lens_2d) : 0;
    }
    // The CTA's g-th tile goes to warpgroup g % MATH_WGS: this warpgroup's first tile of the segment.
    const int first = t_first + (wg + Cfg::MATH_WGS - int(kv_iter % Cfg::MATH_WGS)) % Cfg::MATH_WGS;
#pragma unroll 1
    for (int t = first; t < t_last; t += Cfg::MATH_WGS) {
      const uint32_t g = kv_iter + (t - t_first);
      const int s = g % Cfg::NUM_STAGES;
      mbarrier_wait(&ss.k_full[s], (g / Cfg::NUM_STAGES) & 1);
      if (wg == 0 && tw == 0 && g == 0) PagedTrace::time(PagedTrace::kFirstLanded);
      Cfg::Mma::issue(ss.k[s], q_tile, tw, acc);
      cute::warpgroup_wait<0>();
      if (wg == 0 && tw == 0 && g == 0) PagedTrace::time(PagedTrace::kFirstMma);
      const float scale[2] = {ss.scale[s][row_in_tile], ss.scale[s][row_in_tile + 8]};
      __syncwarp();
      if (lane == 0) mbarrier_arrive(&ss.k_empty[s]);
      float out[Sum::kOut];
      if constexpr (Cfg::LINEAR) {
        Sum::run(acc, w, wl, scale, out, lane);
      } else {
        Sum::run(acc, w, scale, out, lane);
      }
      const int key = t * kTileKeys + row_in_tile + 8 * Sum::out_half(lane);
#pragma unroll
      for (int m = 0; m < Sum::kOut; ++m) {
        if (row[m] >= 0 && key < p.stride) p.logits[row[m] * p.stride + key] = key < limit[m] ? out[m] : kNegInf;
      }
    }
    if (tw == 0) mbarrier_arrive(&ss.q_empty[x]);
    kv_iter += t_last - t_first;
    ++q_iter;
  });
  if (tw == 0) PagedTrace::latest(PagedTrace::kLastStore);
}

}  // namespace detail

template <typename Cfg>
__device__ __forceinline__ void paged_logits_body(const PagedParams& p, const TmaDescriptor* q_desc,
                                                  const TmaDescriptor* w_desc, const TmaDescriptor* k_desc,
                                                  const TmaDescriptor* s_desc) {
  if (threadIdx.x == 0) {
    detail::PagedTrace::time(detail::PagedTrace::kStart);
    detail::PagedTrace::sm();
  }
  auto& ss = init_shared<Cfg>({q_desc, w_desc, k_desc, s_desc}, 4, Cfg::MATH_WGS);   // one math warpgroup reads each stage
  run_roles<Cfg>([&](int warp) { detail::paged_producer<Cfg>(ss, p, q_desc, w_desc, k_desc, s_desc, warp); },
                 [&](int lane, int lanes) {
                   if (p.clean) detail::paged_cleaner(p, lane, lanes);
                 },
                 [&](int wg) { detail::paged_math<Cfg>(ss, p, wg); });
}

}  // namespace indexer
}  // namespace mla_jit
