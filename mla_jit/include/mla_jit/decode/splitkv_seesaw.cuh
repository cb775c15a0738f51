// mla_jit decode: dense paged MLA split-KV kernel for sm_90a, "seesaw" schedule.
//
// Same contract as splitkv.cuh (DecodeParams, metadata, o_accum / lse_accum layout, TMA
// descriptor with box {64, 1, min(page, 64)} and 128B swizzle, grid (num_sm_parts, h_kv,
// ceil(rows / 64)), 256 threads, 1 CTA / SM), so the combine kernel and the host are unchanged.
//
// Idea: both warpgroups compute S = Q K^T, for alternate KV tiles, so that one warpgroup's
// non-tensor work (softmax, P store, waits) overlaps the other warpgroup's wgmma. WG0 owns
// O[:, :DV/2], WG1 owns O[:, DV/2:]; the running row max m is shared (both warpgroups track the
// same sequence of maxima), the row sum l is kept as two partial sums (one per warpgroup) that
// are rescaled identically and added at the end of each piece.
//
// Tiles are numbered n = 0, 1, 2, ... over the CTA's whole work range (across pieces); tile n
// lives in KV stage n % 2. Inside a piece the tiles are taken in GROUPS:
//   pair   (tiles A = n, B = n + 1, same piece): WG0 owns A (computes S_A, softmax, P_A),
//          WG1 owns B. m_a = max(m, rowmax S_A), m_b = max(m_a, rowmax S_B).
//   single (the last tile of a piece with an odd tile count): WG0 owns it (like splitkv.cuh).
// For every tile t (owned or not) each warpgroup does, with sc_t = exp2(m_prev - m_t):
//     O_half = O_half * sc_t + P_t V_t[:, half],   l_part = l_part * sc_t (+ rowsum P_t if owner)
// so at the end of a pair both halves and both l parts are relative to m_b.
//
// Timeline of one pair (stage A = n % 2, stage B = A ^ 1):
//   WG0: wait full[A] chunk by chunk, S_A = Q K_A^T (streamed per 64-col chunk)
//        -> mask, softmax(m -> m_a), write P_A + stat[A] = m_a -> arrive pub[A], wait pub[A]
//        -> O_L *= sa; O_L += P_A V_A,L -> arrive empty[A]
//        -> wait pub[B] (m_b, P_B from WG1) -> O_L *= sb; O_L += P_B V_B,L -> arrive empty[B]
//   WG1: wait full[B] chunk by chunk, S_B = Q K_B^T (concurrent with S_A: overlaps WG0's softmax)
//        -> wait pub[A] -> read m_a, sa -> O_R *= sa; ISSUE O_R += P_A V_A,R (async)
//        -> (while that wgmma runs) mask, softmax(m_a -> m_b) of S_B, write P_B + stat[B] = m_b
//           -> arrive pub[B]
//        -> wgmma wait -> arrive empty[A] -> [thread 128: refill stage A with tile n + 2]
//        -> wait pub[B] -> O_R *= sb; O_R += P_B V_B,R -> arrive empty[B]
//        -> [thread 128: refill stage B with tile n + 3]
//   Per warpgroup per pair: one QK^T + two PV halves. WG0's softmax overlaps WG1's S_B; WG1's
//   softmax overlaps WG0's P_A V_A,L and WG1's own P_A V_A,R.
//
// Synchronization (all mbarrier phases of a stage-indexed barrier: tile n -> parity (n >> 1) & 1,
// because stage s holds tiles s, s + 2, s + 4, ... and each completes every barrier once):
//   full[s][c]  count 1 (+tx). Producer: arrive_expect_tx(bytes of chunk c of tile n) + TMA of
//               chunk c (64 columns, all pages of the tile). Waited by the owner of tile n on every
//               chunk (before S), by the non-owner on the chunks of its V half (before its PV).
//   pub[s]      count 4 (lane 0 of each owner warp, after its P / stat / tail-zero stores and
//               fence.proxy.async). Waited by the non-owner (before reading stat[s] and P) and by
//               the owner itself (all 4 warps' P rows written before its own PV reads P).
//   empty[s]    count 8 (lane 0 of every warp, after the wgmma that last reads stage s for tile
//               n has completed: the owner's S is waited before its P store, the PV is the last
//               reader). Waited by the producer (thread 128) with parity ((n' - 2) >> 1) & 1
//               before issuing tile n' into stage s.
//   P_t and stat[s] for tile t live in stage s's slots (P in the K-only "rope" columns DV..DV+63
//   of the tile when D > DV, else in p[s]); they are rewritten only for tile t + 2, whose owner
//   first waits full[s](t + 2), which the producer issued only after empty[s](t): every reader
//   of P_t / stat[s] is done. No extra WAR barrier is needed.
//   named barrier 1 (WG0) / 2 (WG1), 128 threads: tail-tile zeroing -> the owner's own S.
//   named barrier 3 (256): Q of a new piece stored by both warpgroups -> any S reads it. All S
//               wgmma of the previous piece completed before the piece-end barrier 4.
//   named barrier 4 (256): piece end, exchange of the two partial row sums lx[wg][row]. lx is
//               rewritten only at the next piece end, after barrier 3 of the next piece, which WG1 /
//               WG0 reach only after reading lx.
// S is streamed: the owner issues the 4 k-steps of chunk c right after full[s][c] (with a
// wgmma.fence per chunk; without it ptxas serializes every wgmma, C7520).
// Deadlock freedom: the producer (in WG1) only ever waits for empty[s](t) after WG1 itself arrived
// there; WG0's arrival for t needs nothing from WG1 beyond pub[] of tiles WG1 already published
// (WG1 publishes P_B before its refills). Both warpgroups walk the same group sequence (a pure
// function of the metadata), so their named-barrier sequences (3 per piece start, 4 per piece
// end) match.
#pragma once

#include "splitkv.cuh"

namespace mla_jit {
namespace decode {

namespace detail {
template <typename Element, int N, bool kHas>
struct SeesawPBuf {
  alignas(1024) Element p[2][N];
};
template <typename Element, int N>
struct SeesawPBuf<Element, N, false> {};

// Register-lean consumer cursor: same walk as WorkCursor (batch bi, tile start tok, piece
// [start, stop), L = seqlen), but the metadata bounds are re-read from global memory when a
// piece ends instead of living in registers through the whole loop.
// Returns x through an opaque move: values derived from it inside a loop are not hoisted out
// of the loop by the optimizer (loop-invariant address tables would cost registers the
// register-bound consumer loop does not have).
__device__ __forceinline__ int opaque(int x) {
  int y;
  asm volatile("mov.b32 %0, %1;" : "=r"(y) : "r"(x));
  return y;
}

struct SeesawCursor {
  int bi = 0, tok = 0, stop = 0, L = 0;
  __device__ __forceinline__ bool valid() const { return tok < stop; }
  // Moves to the first non-empty piece at or after batch `b` (tok = stop = 0 when none).
  __device__ __forceinline__ void seek(const int* meta, const int* seqlens, int b) {
    const int begin_b = meta[kMetaBeginBatch], end_b = meta[kMetaEndBatch];
    for (bi = b; bi <= end_b; ++bi) {
      L = max(seqlens[bi], 0);
      const int start = bi == begin_b ? meta[kMetaBeginToken] : 0;
      stop = bi == end_b ? min(meta[kMetaEndToken], L) : L;
      if (start < stop) {
        tok = start;
        return;
      }
    }
    tok = stop = 0;
  }
  __device__ __forceinline__ void init(const int* meta, const int* seqlens) { seek(meta, seqlens, meta[kMetaBeginBatch]); }
  template <int BLOCK_N>
  __device__ __forceinline__ void advance(const int* meta, const int* seqlens) {
    tok += BLOCK_N;
    if (tok < stop) return;
    seek(meta, seqlens, bi + 1);
  }
};
}  // namespace detail

template <typename Element_, int HEAD_DIM_, int HEAD_DIM_V_, int PAGE_SIZE_, int BLOCK_M_ = 64,
          int BLOCK_N_ = 64, int NUM_STAGES_ = 2>
struct SeesawConfig
    : SplitKVConfig<Element_, HEAD_DIM_, HEAD_DIM_V_, PAGE_SIZE_, BLOCK_M_, BLOCK_N_, NUM_STAGES_> {
  using Base = SplitKVConfig<Element_, HEAD_DIM_, HEAD_DIM_V_, PAGE_SIZE_, BLOCK_M_, BLOCK_N_, NUM_STAGES_>;
  using Element = Element_;
  static constexpr int HEAD_DIM = HEAD_DIM_;
  static constexpr int HEAD_DIM_V = HEAD_DIM_V_;
  static constexpr int BLOCK_M = BLOCK_M_;
  static constexpr int BLOCK_N = BLOCK_N_;
  static_assert(NUM_STAGES_ == 2, "seesaw: a pair of tiles occupies exactly the two stages");
  // P of a tile goes into the tile's own K-only columns [DV, DV + 64) when there are any (free once
  // the owner's S is done); otherwise into a separate 2 x 8 KB buffer.
  static constexpr bool kPInRope = HEAD_DIM > HEAD_DIM_V;
  static_assert(!kPInRope || HEAD_DIM - HEAD_DIM_V >= 64, "rope slab must hold a 64 x 64 P tile");
  static constexpr int kColChunks = Base::kColChunks;
  static constexpr int kVChunksHalf = HEAD_DIM_V / 2 / 64;

  struct SharedStorage {
    alignas(1024) Element q[BLOCK_M * HEAD_DIM];
    alignas(1024) Element kv[2][BLOCK_N * HEAD_DIM];
    detail::SeesawPBuf<Element, BLOCK_M * BLOCK_N, !kPInRope> pbuf;
    alignas(16) float stat[2][BLOCK_M];  // row max m after the tile in stage s (log2, scaled)
    float lx[2][BLOCK_M];                // partial row sums of WG0 / WG1 at a piece end
    alignas(8) uint64_t full[2][kColChunks];  // TMA landed, per 64-column chunk
    uint64_t pub[2];                           // owner published P / stat of the tile in stage s
    uint64_t empty[2];                         // all 8 warps done reading stage s
    // TMA producer state, touched by thread 128 only. Kept in smem so that it costs no registers
    // in the (register-bound) consumer loop.
    detail::WorkCursor prod;
    int prod_n;  // index of the next tile to issue
  };
  static constexpr int kSmemBytes = int(sizeof(SharedStorage)) + 1024;
  static_assert(kSmemBytes <= 227 * 1024, "shared memory budget");
  static constexpr unsigned kChunkBytes = BLOCK_N * 64 * sizeof(Element);            // one page-full tile
  static constexpr unsigned kPageChunkBytes = Base::kBoxRows * 64 * sizeof(Element);  // one box
};

template <typename Cfg>
__device__ __forceinline__ void mla_splitkv_seesaw_body(const DecodeParams& p, const TmaDescriptor* tmap) {
  using namespace cute;
  using Element = typename Cfg::Element;
  using SS = typename Cfg::SharedStorage;
  constexpr int BM = Cfg::BLOCK_M, BN = Cfg::BLOCK_N, D = Cfg::HEAD_DIM, DV = Cfg::HEAD_DIM_V;
  constexpr int NCH = Cfg::kColChunks;
  constexpr int KPC = 64 / 16;  // wgmma k-steps per 64-column chunk

  extern __shared__ __align__(1024) unsigned char smem_raw[];
  SS& ss = *reinterpret_cast<SS*>((reinterpret_cast<uint64_t>(smem_raw) + 1023ull) & ~1023ull);

  const int tid = threadIdx.x;
  const int wg = tid / 128;
  const int tid_wg = tid % 128;
  const int warp_wg = tid_wg / 32;
  const int lane = tid % 32;
  const int part = blockIdx.x, g = blockIdx.y, m_block = blockIdx.z;
  const bool is_producer = tid == 128;

  if (tid == 0) {
    for (int s = 0; s < 2; ++s) {
      for (int c = 0; c < NCH; ++c) mbarrier_init(&ss.full[s][c], 1);
      mbarrier_init(&ss.pub[s], 4);
      mbarrier_init(&ss.empty[s], 8);
    }
    fence_barrier_init();
  }
  if (is_producer) prefetch_tma_descriptor(tmap);
  __syncthreads();

  // No-op unless launched as a programmatic dependent of the metadata kernel.
  pdl_wait_primary();

  const int* meta = p.tile_scheduler_metadata + part * kMetaSize;
  const int* seqlens = p.cache_seqlens;

  auto p_ptr = [&](int stage) -> Element* {
    if constexpr (Cfg::kPInRope) {
      return ss.kv[stage] + DV * BN;  // chunk DV / 64 of the tile: a 64 x 64 swizzled slab
    } else {
      return ss.pbuf.p[stage];
    }
  };

  // ---------------- TMA producer (thread 128 only; state in smem) ----------------
  auto issue_tile = [&]() {
    detail::WorkCursor& prod = ss.prod;
    const int prod_n = ss.prod_n;
    const int stage = prod_n & 1;
    // Stage reuse: all 8 warps are done with tile prod_n - 2 (P, stat and K/V of that tile).
    if (prod_n >= 2) mbarrier_wait(&ss.empty[stage], ((prod_n - 2) >> 1) & 1);
    const int* bt = p.block_table + (long long)prod.bi * p.block_table_stride;
    Element* dst = ss.kv[stage];
    if constexpr (Cfg::kPagesPerTile == 1) {
      const int page = prod.tok / Cfg::PAGE_SIZE;
      const int row = bt[page] * Cfg::PAGE_SIZE + (prod.tok % Cfg::PAGE_SIZE);
#pragma unroll
      for (int c = 0; c < NCH; ++c) {
        mbarrier_arrive_expect_tx(&ss.full[stage][c], Cfg::kChunkBytes);
        tma_load_3d(dst + c * BN * Cfg::kBoxCols, tmap, &ss.full[stage][c], c * Cfg::kBoxCols, g, row);
      }
    } else {
      // Several pages per tile: load only pages that hold tokens < L (later block_table
      // entries may be garbage, later pages NaN).
      const int valid = min(BN, prod.L - prod.tok);
      const int npages = (valid + Cfg::PAGE_SIZE - 1) / Cfg::PAGE_SIZE;
      const int page0 = prod.tok / Cfg::PAGE_SIZE;
      int rows[Cfg::kPagesPerTile];
#pragma unroll
      for (int j = 0; j < Cfg::kPagesPerTile; ++j) rows[j] = j < npages ? bt[page0 + j] * Cfg::PAGE_SIZE : 0;
#pragma unroll
      for (int c = 0; c < NCH; ++c) {
        mbarrier_arrive_expect_tx(&ss.full[stage][c], npages * Cfg::kPageChunkBytes);
#pragma unroll
        for (int j = 0; j < Cfg::kPagesPerTile; ++j) {
          if (j < npages)
            tma_load_3d(dst + c * BN * Cfg::kBoxCols + j * Cfg::kBoxRows * Cfg::kBoxCols, tmap,
                        &ss.full[stage][c], c * Cfg::kBoxCols, g, rows[j]);
        }
      }
    }
    ss.prod_n = prod_n + 1;
    prod.template advance<BN>(seqlens);
  };
  if (is_producer) {
    ss.prod_n = 0;
    ss.prod.init(meta, seqlens);
    for (int s = 0; s < 2 && ss.prod.valid(); ++s) issue_tile();
  }
  __syncwarp();  // reconverge warp 4 before any .aligned instruction

  // ---------------- consumer state (both warpgroups) ----------------
  detail::SeesawCursor cur;
  cur.init(meta, seqlens);

  // Accumulator-fragment geometry of a 64 x N wgmma (f32): element i of a thread lives at
  // row warp*16 + lane/4 + 8*((i/2)%2), column (i/4)*8 + (lane%4)*2 + i%2.
  const int row0 = warp_wg * 16 + lane / 4;  // local rows row0 and row0 + 8
  const int col_lane = (lane % 4) * 2;

  typename Cfg::TiledMmaO mma_o;
  auto thr_o = mma_o.get_thread_slice(tid_wg);
  Tensor tOrO = partition_fragment_C(mma_o, Shape<Int<BM>, Int<DV / 2>>{});

  typename Cfg::TiledMmaS mma_s;
  auto thr_s = mma_s.get_thread_slice(tid_wg);
  Tensor sQ = make_tensor(make_smem_ptr(ss.q), typename Cfg::SmemLayoutQ{});
  Tensor tSrQ = thr_s.partition_fragment_A(sQ);
  Tensor tSrS = partition_fragment_C(mma_s, Shape<Int<BM>, Int<BN>>{});
  static_assert(decltype(size(tSrS))::value == BN / 2, "S fragment");
  static_assert(decltype(size<2>(tSrQ))::value == NCH * KPC, "k-steps per chunk");

  // Set at every piece start (the loop starts with one).
  float m_run[2] = {-kInf, -kInf};  // shared running max (log2, scaled); same in both warpgroups
  float l_part[2] = {0.f, 0.f};     // this warpgroup's partial row sum (per thread: its columns)

  auto clear_o = [&]() {
#pragma unroll
    for (int i = 0; i < size(tOrO); ++i) tOrO(i) = 0.f;
  };
  auto scale_o = [&](float sc0, float sc1) {
#pragma unroll
    for (int i = 0; i < size(tOrO); ++i) tOrO(i) *= ((i >> 1) & 1) ? sc1 : sc0;
  };
  // Waits until this warpgroup's V half of tile n (stage) has landed.
  auto wait_v_half = [&](int stage, int n) {
    const uint32_t ph = (n >> 1) & 1;
#pragma unroll
    for (int c = 0; c < Cfg::kVChunksHalf; ++c) mbarrier_wait(&ss.full[stage][wg * Cfg::kVChunksHalf + c], ph);
  };
  // Issues O_half += P V_half for the tile in `stage` (O already rescaled). Async: pv_wait().
  auto pv_issue = [&](int stage) {
    Tensor sP = make_tensor(make_smem_ptr(p_ptr(stage)), typename Cfg::SmemLayoutP{});
    Tensor tOrP = thr_o.partition_fragment_A(sP);
    Tensor sVt = make_tensor(make_smem_ptr(ss.kv[stage] + wg * (DV / 2) * BN), typename Cfg::SmemLayoutVtHalf{});
    Tensor tOrV = thr_o.partition_fragment_B(sVt);
    warpgroup_fence_operand(tOrO);
    warpgroup_arrive();
    mma_o.accumulate_ = GMMA::ScaleOut::One;
#pragma unroll
    for (int k = 0; k < size<2>(tOrP); ++k) gemm(mma_o, tOrP(_, _, k), tOrV(_, _, k), tOrO);
    warpgroup_commit_batch();
  };
  auto pv_wait = [&]() {
    warpgroup_wait<0>();
    warpgroup_fence_operand(tOrO);
  };
  auto arrive_empty = [&](int stage) {
    __syncwarp();
    if (lane == 0) mbarrier_arrive(&ss.empty[stage]);
  };
  // Thread 128 refills the stage just released (tile n + 2); waits for the other warpgroup.
  auto producer_step = [&]() {
    if (is_producer && ss.prod.valid()) issue_tile();
    __syncwarp();  // lane 0 of warp 4 may have diverged into the producer path
  };
  // Rescale factor from the previous max to m_new (m_new >= m_prev, or both -inf -> 0).
  auto rescale = [&](float m_prev, float m_new) {
    return exp2f(m_prev - (m_new == -kInf ? 0.f : m_new));
  };

  // ---- owner: S = Q K^T for tile n at token tok in `stage`, with the tail zeroed, masked ----
  auto compute_s = [&](int stage, int n, int tok) {
    const uint32_t ph = (n >> 1) & 1;
    Tensor sK = make_tensor(make_smem_ptr(ss.kv[stage]), typename Cfg::SmemLayoutK{});
    if (tok + BN > cur.L) {
      // Tail tile: rows >= L were not loaded (other pages) or hold data past the sequence end
      // (possibly NaN). Zero them (all columns: the other warpgroup's P V reads them too).
#pragma unroll 1
      for (int c = 0; c < NCH; ++c) mbarrier_wait(&ss.full[stage][c], ph);
      constexpr int kChunks = D / 8;
      const int v0 = cur.L - tok;
#pragma unroll 1
      for (int idx = detail::opaque(tid_wg); idx < (BN - v0) * kChunks; idx += 128) {
        const int lr = v0 + idx / kChunks, c = idx % kChunks;
        *reinterpret_cast<uint4*>(&sK(lr, c * 8)) = make_uint4(0u, 0u, 0u, 0u);
      }
      fence_proxy_async_shared();
      if (wg == 0) {
        named_barrier_sync(1, 128);
      } else {
        named_barrier_sync(2, 128);
      }
    }
    Tensor tSrK = thr_s.partition_fragment_B(sK);
    warpgroup_fence_operand(tSrS);
    mma_s.accumulate_ = GMMA::ScaleOut::Zero;
    // Streamed: chunk c's k-steps are issued as soon as chunk c has landed.
#pragma unroll
    for (int c = 0; c < NCH; ++c) {
      mbarrier_wait(&ss.full[stage][c], ph);
      warpgroup_arrive();
#pragma unroll
      for (int kk = 0; kk < KPC; ++kk) {
        gemm(mma_s, tSrQ(_, _, c * KPC + kk), tSrK(_, _, c * KPC + kk), tSrS);
        mma_s.accumulate_ = GMMA::ScaleOut::One;
      }
    }
    warpgroup_commit_batch();
    warpgroup_wait<0>();
    warpgroup_fence_operand(tSrS);
    // mask (select, so NaN never survives). Causal, bottom-right aligned: query s sees keys
    // < L - s_q + s + 1. Recomputed per tile (cheap) to keep it out of the loop's registers.
    int lim[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = m_block * BM + row0 + 8 * h;
      lim[h] = p.causal ? min(cur.L, cur.L - p.s_q + r / p.q_per_kv + 1) : cur.L;
    }
    if (tok + BN > min(lim[0], lim[1])) {
#pragma unroll
      for (int i = 0; i < size(tSrS); ++i) {
        const int t = tok + (i / 4) * 8 + col_lane + (i & 1);
        if (t >= lim[(i >> 1) & 1]) tSrS(i) = -kInf;
      }
    }
  };
  // ---- owner: online softmax of S from max m_prev, P + stat store, publish on pub[stage] ----
  // Returns the new max in m_out and the rescale factor in sc; updates l_part.
  auto softmax_publish = [&](int stage, const float (&m_prev)[2], float (&m_out)[2], float (&sc)[2]) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float mx = -kInf;
#pragma unroll
      for (int j = 0; j < size(tSrS) / 4; ++j) mx = fmaxf(mx, fmaxf(tSrS(j * 4 + h * 2), tSrS(j * 4 + h * 2 + 1)));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_new = fmaxf(m_prev[h], mx * p.scale_log2);
      const float m_use = m_new == -kInf ? 0.f : m_new;  // avoid (-inf) - (-inf)
      sc[h] = exp2f(m_prev[h] - m_use);
      m_out[h] = m_new;
      float sum = 0.f;
#pragma unroll
      for (int j = 0; j < size(tSrS) / 4; ++j) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float& x = tSrS(j * 4 + h * 2 + e);
          x = exp2f(fmaf(x, p.scale_log2, -m_use));
          sum += x;
        }
      }
      l_part[h] = l_part[h] * sc[h] + sum;
    }
    // P_t / stat[stage] are free: their readers (tile t - 2) finished before this stage was
    // refilled with tile t, and the owner waited full[stage](t) in compute_s.
    // At d=576 P overwrites this tile's rope columns, which the S wgmma of every warp of the
    // warpgroup reads: wgmma.wait_group covers only the calling warp, so wait for all four.
    if constexpr (Cfg::kPInRope) named_barrier_sync(1 + wg, 128);
    Tensor sP = make_tensor(make_smem_ptr(p_ptr(stage)), typename Cfg::SmemLayoutP{});
#pragma unroll
    for (int j = 0; j < size(tSrS) / 4; ++j) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int i = j * 4 + h * 2;
        *reinterpret_cast<unsigned*>(&sP(row0 + 8 * h, j * 8 + col_lane)) =
            ElemTraits<Element>::pack2(tSrS(i), tSrS(i + 1));
      }
    }
    if ((lane & 3) == 0) {
#pragma unroll
      for (int h = 0; h < 2; ++h) ss.stat[stage][row0 + 8 * h] = m_out[h];
    }
    fence_proxy_async_shared();
    __syncwarp();
    if (lane == 0) mbarrier_arrive(&ss.pub[stage]);
  };
  // ---- non-owner: read the max published for the tile in `stage` ----
  auto read_stat = [&](int stage, int n, float (&m_out)[2]) {
    mbarrier_wait(&ss.pub[stage], (n >> 1) & 1);
#pragma unroll
    for (int h = 0; h < 2; ++h) m_out[h] = ss.stat[stage][row0 + 8 * h];
  };

  // Writes this warpgroup's half of O for the finished piece (rows < p.rows only).
  auto store_o = [&](float inv_l0, float inv_l1, bool single, int slot) {
    const int col_base = wg * (DV / 2) + col_lane;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = m_block * BM + row0 + 8 * h;
      if (r >= p.rows) continue;
      const float inv_l = h ? inv_l1 : inv_l0;
      if (single) {
        const int s = r / p.q_per_kv;
        const int head = g * p.q_per_kv + (r - s * p.q_per_kv);
        Element* o = reinterpret_cast<Element*>(p.out) + ((long long)(cur.bi * p.s_q + s) * p.h_q + head) * DV + col_base;
#pragma unroll
        for (int j = 0; j < size(tOrO) / 4; ++j) {
          const int i = j * 4 + h * 2;
          *reinterpret_cast<unsigned*>(o + j * 8) =
              ElemTraits<Element>::pack2(tOrO(i) * inv_l, tOrO(i + 1) * inv_l);
        }
      } else {
        float* o = p.o_accum + (((long long)slot * p.h_kv + g) * p.rows + r) * DV + col_base;
#pragma unroll
        for (int j = 0; j < size(tOrO) / 4; ++j) {
          const int i = j * 4 + h * 2;
          *reinterpret_cast<float2*>(o + j * 8) = make_float2(tOrO(i) * inv_l, tOrO(i + 1) * inv_l);
        }
      }
    }
  };

  clear_o();
  int n = 0;  // index of the first tile of the current group (same in both warpgroups)
  bool piece_start = true;
  while (cur.valid()) {
    if (piece_start) {
      // (Re)load Q for this batch with all 256 threads. Every S wgmma that read the previous Q
      // completed before the piece-end barrier (4) of the previous piece.
      constexpr int kChunks = D / 8;  // 16-byte chunks per row
      const Element* qb = reinterpret_cast<const Element*>(p.q) + (long long)cur.bi * p.q_stride_b;
#pragma unroll 2
      for (int idx = detail::opaque(tid); idx < BM * kChunks; idx += 256) {
        const int lr = idx / kChunks, c = idx % kChunks;
        const int r = m_block * BM + lr;
        uint4 v = make_uint4(0u, 0u, 0u, 0u);  // padded rows are zero: no NaN from garbage
        if (r < p.rows) {
          const int s = r / p.q_per_kv;
          const int head = g * p.q_per_kv + (r - s * p.q_per_kv);
          v = __ldg(reinterpret_cast<const uint4*>(qb + s * p.q_stride_s + head * p.q_stride_h + c * 8));
        }
        *reinterpret_cast<uint4*>(&sQ(lr, c * 8)) = v;
      }
      fence_proxy_async_shared();
      named_barrier_sync(3, 256);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        m_run[h] = -kInf;
        l_part[h] = 0.f;
      }
      piece_start = false;
    }

    const int tokA = cur.tok;
    const int sA = n & 1;
    const bool pair = tokA + BN < cur.stop;
    const bool last = tokA + (pair ? 2 : 1) * BN >= cur.stop;

    if (!pair) {
      // ======================= single tile n: WG0 owns it (as in splitkv.cuh) =================
      float sc[2];
      if (wg == 0) {
        compute_s(sA, n, tokA);
        float m_new[2];
        softmax_publish(sA, m_run, m_new, sc);
        m_run[0] = m_new[0];
        m_run[1] = m_new[1];
        mbarrier_wait(&ss.pub[sA], (n >> 1) & 1);  // all of WG0's P rows are written
      } else {
        float m_new[2];
        read_stat(sA, n, m_new);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          sc[h] = rescale(m_run[h], m_new[h]);
          l_part[h] *= sc[h];
          m_run[h] = m_new[h];
        }
      }
      wait_v_half(sA, n);
      scale_o(sc[0], sc[1]);
      pv_issue(sA);
      pv_wait();
      arrive_empty(sA);
      if (wg == 1) producer_step();  // tile n + 2 into stage sA
    } else {
      // ======================= pair: A = tile n (WG0), B = tile n + 1 (WG1) ====================
      const int sB = sA ^ 1;
      const int tokB = tokA + BN;
      if (wg == 0) {
        float m_a[2], sa[2];
        compute_s(sA, n, tokA);
        softmax_publish(sA, m_run, m_a, sa);
        mbarrier_wait(&ss.pub[sA], (n >> 1) & 1);  // all of WG0's P_A rows are written
        wait_v_half(sA, n);
        scale_o(sa[0], sa[1]);
        pv_issue(sA);
        pv_wait();
        arrive_empty(sA);
        // B: wait for WG1's P_B and m_b.
        float m_b[2], sb[2];
        read_stat(sB, n + 1, m_b);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          sb[h] = rescale(m_a[h], m_b[h]);
          l_part[h] *= sb[h];
          m_run[h] = m_b[h];
        }
        wait_v_half(sB, n + 1);
        scale_o(sb[0], sb[1]);
        pv_issue(sB);
        pv_wait();
        arrive_empty(sB);
      } else {
        compute_s(sB, n + 1, tokB);  // runs alongside WG0's S_A, overlaps WG0's softmax
        float m_a[2], sa[2];
        read_stat(sA, n, m_a);  // waits pub[A]: P_A and m_a are ready
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          sa[h] = rescale(m_run[h], m_a[h]);
          l_part[h] *= sa[h];
        }
        wait_v_half(sA, n);
        scale_o(sa[0], sa[1]);
        pv_issue(sA);  // async: O_R += P_A V_A,R runs while we do the softmax of S_B
        float m_b[2], sb[2];
        softmax_publish(sB, m_a, m_b, sb);
        pv_wait();
        arrive_empty(sA);
        producer_step();  // tile n + 2 into stage sA (waits for WG0's P_A V_A,L)
        mbarrier_wait(&ss.pub[sB], ((n + 1) >> 1) & 1);  // all of WG1's P_B rows are written
        m_run[0] = m_b[0];
        m_run[1] = m_b[1];
        scale_o(sb[0], sb[1]);
        pv_issue(sB);  // V_B was waited for (all chunks) in compute_s
        pv_wait();
        arrive_empty(sB);
        producer_step();  // tile n + 3 into stage sB (waits for WG0's P_B V_B,L)
      }
    }

    if (last) {
      // ---- piece end: add the two partial row sums, write O halves and the LSE ----
      float lt[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float l = l_part[h];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        lt[h] = l;
        if ((lane & 3) == 0) ss.lx[wg][row0 + 8 * h] = l;
      }
      named_barrier_sync(4, 256);
      float inv_l[2], lse2[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float l = lt[h] + ss.lx[wg ^ 1][row0 + 8 * h];
        inv_l[h] = l > 0.f ? 1.f / l : 0.f;
        lse2[h] = l > 0.f ? m_run[h] + log2f(l) : -kInf;
      }
      bool single;
      int slot;
      {
        const int ns0 = p.num_splits[cur.bi];
        single = (p.num_splits[cur.bi + 1] - ns0) == 1;
        slot = ns0 + (cur.bi == meta[kMetaBeginBatch] ? meta[kMetaBeginSplit] : 0);
      }
      store_o(inv_l[0], inv_l[1], single, slot);
      if (wg == 0 && (lane & 3) == 0) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int r = m_block * BM + row0 + 8 * h;
          if (r < p.rows) {
            if (single) {
              const int s = r / p.q_per_kv;
              const int head = g * p.q_per_kv + (r - s * p.q_per_kv);
              p.lse[((long long)cur.bi * p.h_q + head) * p.s_q + s] =
                  lse2[h] == -kInf ? kInf : lse2[h] * 0.69314718055994530942f;
            } else {
              p.lse_accum[((long long)slot * p.h_kv + g) * p.rows + r] = lse2[h];
            }
          }
        }
      }
      clear_o();
      piece_start = true;
    }
    if (pair) {
      n += 2;
      cur.template advance<BN>(meta, seqlens);  // stays inside the piece (tokA + BN < stop)
      cur.template advance<BN>(meta, seqlens);
    } else {
      n += 1;
      cur.template advance<BN>(meta, seqlens);
    }
  }
  pdl_launch_dependents();
}

}  // namespace decode
}  // namespace mla_jit
