// mla_jit decode: the "seesaw" split-KV schedule for sm_90a (MLA_JIT_SM90_DECODE_SCHEDULE=seesaw,
// experimental: correct on the whole test grid, slower than splitkv_ws.cuh on compute-bound
// shapes; bench/NOTES.md has the measurements). Same contract as splitkv_ws.cuh without the fused
// combine (the combine kernel merges the splits).
//
// Grid (num_sm_parts, h_kv, ceil(rows / 64)), 384 threads, 2 KV stages (Q, 64 x d, lives in smem).
//   WG0, WG1 ("math"): tile n (64 tokens) belongs to WG n % 2, which computes S(n) = Q K(n)^T
//     (SS wgmma, issued chunk by chunk as the TMA bytes land), the online softmax against the
//     running max published with tile n - 1, and publishes P(n) (in the rope columns of n's
//     stage, or a P buffer at d = dv), its max, O scale and partial row sums (p_ready). WG w owns
//     O[:, 256 w : 256 w + 256] and adds every tile's P V to it in tile order.
//   WG2: thread 256 is the TMA producer. A stage half (the V columns of one math WG) is refilled
//     as soon as that WG's P V of the stage's previous tile completes.
// Per own tile n a math WG: waits its own P V(n - 2); waits P(n - 1) and issues its P V(n - 1);
// loads Q if a piece starts at n; issues S(n); releases its half of n - 1's stage; softmax(n),
// publish; issues P V(n) (waited at its next tile).
// Lazy rescaling (as in FlashAttention 4): a row's reference max moves only when a tile's max
// exceeds it by more than 2^8, so P <= 256 and O is rarely rescaled; a P V can then be issued
// while the same WG's S is in flight without touching O's registers (which would make ptxas
// serialize every wgmma).
#pragma once

#include "sm90_tiles.cuh"

namespace mla_jit {
namespace decode {

template <typename Element_, int HEAD_DIM_, int HEAD_DIM_V_, int PAGE_SIZE_, int BLOCK_M_, int BLOCK_N_,
          int NUM_STAGES_>
struct SplitKVSeesawConfig : Sm90DecodeTiles<Element_, HEAD_DIM_, HEAD_DIM_V_, PAGE_SIZE_, BLOCK_M_, BLOCK_N_> {
  using Tiles = Sm90DecodeTiles<Element_, HEAD_DIM_, HEAD_DIM_V_, PAGE_SIZE_, BLOCK_M_, BLOCK_N_>;
  using Element = Element_;
  static constexpr int HEAD_DIM = HEAD_DIM_, HEAD_DIM_V = HEAD_DIM_V_;
  static constexpr int BLOCK_M = BLOCK_M_, BLOCK_N = BLOCK_N_, NUM_STAGES = NUM_STAGES_, NUM_THREADS = 384;
  static_assert(NUM_STAGES == 2, "seesaw: Q (64 x d) in smem leaves room for 2 KV stages");
  static_assert(HEAD_DIM_V == 512 && (HEAD_DIM == 512 || HEAD_DIM == 576), "dims");
  // setmaxnreg: the math warpgroups (O half 128 + S 32 + state) and the producer warpgroup.
  static constexpr int kRegsMath = 224, kRegsProd = 56;
  static_assert(2 * kRegsMath + kRegsProd <= 3 * 168, "setmaxnreg");
  // d > dv: P goes into the rope columns of its stage; else into aux, one P tile per stage.
  static constexpr bool kPInRope = HEAD_DIM > HEAD_DIM_V;
  static constexpr int kAuxElems = kPInRope ? 64 : NUM_STAGES * BLOCK_M * BLOCK_N;
  static constexpr int kColChunks = Tiles::kColChunks;
  static constexpr int kChunksPerHalf = HEAD_DIM_V / 2 / Tiles::kBoxCols;  // V columns of one math WG

  struct SharedStorage {
    alignas(1024) Element kv[NUM_STAGES][BLOCK_N * HEAD_DIM];
    alignas(1024) Element q[BLOCK_M * HEAD_DIM];
    alignas(1024) Element aux[kAuxElems];
    float m_tile[2][BLOCK_M];      // running max after tile t (log2 units, scaled), slot t % 2
    float scale_tile[2][BLOCK_M];  // O rescale of tile t (1 unless its reference max moved)
    float inv_l[2][BLOCK_M];       // 1 / l of a piece ending at tile t
    int rescale[2];                // any row of tile t moved its reference max
    float2 l_part[2][128];         // per-thread partial row sums after tile t
    detail::WorkCursor prod;
    alignas(8) uint64_t full[NUM_STAGES][kColChunks];  // one per 64-column chunk of a stage
    uint64_t p_ready[2];   // owner of tile t published P / m / scale / l (4 warp arrivals)
    // Math warpgroup w finished P V of the stage's tile (4 warp arrivals): V columns
    // [w * DV / 2, +DV / 2) are free, and with both the rope columns (S and P are done).
    uint64_t half_free[NUM_STAGES][2];
  };
  static constexpr int kSmemBytes = Sm90SmemSize<SharedStorage>::kBytes;
  // One TMA box of one page: a chunk of 64 columns.
  static constexpr unsigned kPageChunkBytes = Tiles::kBoxRows * Tiles::kBoxCols * sizeof(Element);
};

template <typename Cfg>
__device__ __forceinline__ void mla_splitkv_seesaw_body(const DecodeParams& p, const TmaDescriptor* tmap) {
  using namespace cute;
  using Element = typename Cfg::Element;
  using SS = typename Cfg::SharedStorage;
  constexpr int BM = Cfg::BLOCK_M, BN = Cfg::BLOCK_N, D = Cfg::HEAD_DIM, DV = Cfg::HEAD_DIM_V;
  constexpr int NS = Cfg::NUM_STAGES;

  extern __shared__ __align__(1024) unsigned char smem_raw[];
  SS& ss = detail::aligned_shared_storage<SS>(smem_raw);
  const int tid = threadIdx.x, wg = tid / 128;
  if (tid == 0) {
    for (int s = 0; s < NS; ++s) {
      for (int c = 0; c < Cfg::kColChunks; ++c) mbarrier_init(&ss.full[s][c], 1);
      mbarrier_init(&ss.half_free[s][0], 4);
      mbarrier_init(&ss.half_free[s][1], 4);
    }
    for (int i = 0; i < 2; ++i) mbarrier_init(&ss.p_ready[i], 4);
    fence_barrier_init();
  }
  if (tid == 256) prefetch_tma_descriptor(tmap);
  __syncthreads();
  pdl_wait_primary();
  const int* seqlens = p.cache_seqlens;
  const int* meta = p.tile_scheduler_metadata + blockIdx.x * kMetaSize;
  const int g = blockIdx.y, m_block = blockIdx.z;

  if (wg == 2) {
    // ================================ TMA producer ================================
    detail::setmaxnreg_dec<Cfg::kRegsProd>();
    if (tid != 256) return;
    detail::WorkCursor& prod = ss.prod;
    prod.init(meta, seqlens);
    for (int n = 0; prod.valid(); ++n) {
      const int stage = n % NS;
      // Cache rows of the tile's pages, read before waiting for the stage so that the block-table
      // load overlaps the wait.
      const int* bt = p.block_table + (long long)prod.bi * p.block_table_stride + prod.tok / Cfg::PAGE_SIZE;
      const int npages = Cfg::kPagesPerTile == 1 ? 1 : (min(BN, prod.L - prod.tok) + Cfg::PAGE_SIZE - 1) / Cfg::PAGE_SIZE;
      int rows[Cfg::kPagesPerTile];
#pragma unroll
      for (int j = 0; j < Cfg::kPagesPerTile; ++j)
        rows[j] = j < npages ? bt[j] * Cfg::PAGE_SIZE + (Cfg::kPagesPerTile == 1 ? prod.tok % Cfg::PAGE_SIZE : 0) : 0;
      auto load_chunks = [&](int c0, int c1) {
#pragma unroll
        for (int c = c0; c < c1; ++c) {
          mbarrier_arrive_expect_tx(&ss.full[stage][c], npages * Cfg::kPageChunkBytes);
#pragma unroll
          for (int j = 0; j < Cfg::kPagesPerTile; ++j) {
            if (j < npages)
              tma_load_3d(ss.kv[stage] + c * BN * Cfg::kBoxCols + j * Cfg::kBoxRows * Cfg::kBoxCols, tmap,
                          &ss.full[stage][c], c * Cfg::kBoxCols, g, rows[j]);
          }
        }
      };
      // Each half of V is refilled as soon as its math warpgroup's P V of the stage's previous
      // tile completes, in whichever order; the rope columns (P of that tile) once both did.
      const uint32_t parity = (n / NS - 1) & 1;
      bool loaded[2] = {false, false};
      while (!(loaded[0] && loaded[1])) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          if (!loaded[h] && (n < NS || mbarrier_ready(&ss.half_free[stage][h], parity))) {
            load_chunks(h * Cfg::kChunksPerHalf, (h + 1) * Cfg::kChunksPerHalf);
            loaded[h] = true;
          }
        }
      }
      load_chunks(2 * Cfg::kChunksPerHalf, Cfg::kColChunks);
      prod.template advance<BN>(seqlens);
    }
    return;
  }

  // ================================ math warpgroups ================================
  detail::setmaxnreg_inc<Cfg::kRegsMath>();
  const int w = wg;  // owns tiles n % 2 == w and O columns [w * DV / 2, +DV / 2)
  const int tw = tid % 128;
  const int row0 = (tw / 32) * 16 + (tw % 32) / 4, col_lane = (tw % 4) * 2;

  typename Cfg::TiledMmaS mma_s;
  auto thr_s = mma_s.get_thread_slice(tw);
  Tensor sQ = make_tensor(make_smem_ptr(ss.q), typename Cfg::SmemLayoutQ{});
  Tensor tSsQ = thr_s.partition_fragment_A(sQ);  // (MMA, 1, D / 16)
  Tensor tSrS = partition_fragment_C(mma_s, Shape<Int<BM>, Int<BN>>{});
  typename Cfg::TiledMmaO mma_o;
  Tensor tOrO = partition_fragment_C(mma_o, Shape<Int<BM>, Int<DV / 2>>{});

  detail::WorkCursor cur;  // both math warpgroups walk every tile; tile n belongs to WG n % 2
  cur.init(meta, seqlens);
  auto p_buf = [&](int n) -> Element* {
    return Cfg::kPInRope ? ss.kv[n % NS] + DV * BN : ss.aux + (n % NS) * BM * BN;
  };
  // Named barrier of this math warpgroup's 128 threads (ids 2, 3: immediates keep ptxas from
  // reserving all 16 hardware barriers).
  auto wg_barrier = [&]() {
    if (w == 0) {
      named_barrier_sync(2, 128);
    } else {
      named_barrier_sync(3, 128);
    }
  };
  // The same barrier, returning whether `pred` held in any of the warpgroup's threads.
  auto wg_barrier_any = [&](bool pred) -> bool {
    uint32_t any;
    if (w == 0) {
      asm volatile("{\n .reg .pred p, q;\n setp.ne.u32 p, %1, 0;\n bar.red.or.pred q, 2, 128, p;\n selp.u32 %0, 1, 0, q;\n}"
                   : "=r"(any) : "r"(uint32_t(pred)) : "memory");
    } else {
      asm volatile("{\n .reg .pred p, q;\n setp.ne.u32 p, %1, 0;\n bar.red.or.pred q, 3, 128, p;\n selp.u32 %0, 1, 0, q;\n}"
                   : "=r"(any) : "r"(uint32_t(pred)) : "memory");
    }
    return any != 0;
  };

  // This warpgroup's half of O += P(n) V(n) (fresh: the first tile of a piece overwrites O). No
  // register work on O: with lazy rescaling it can be issued while this warpgroup's S is in flight.
  // n < 0: a throwaway fresh P V of whatever the smem holds (issued so that no wgmma sits in a
  // divergent branch: ptxas would serialize them all); the next P V overwrites O.
  auto issue_pv = [&](int n, bool fresh) {
    // The TMA bytes of this half of V(n): complete already (the owner of n waited for them before
    // S(n)), waited again so that they are visible to this warpgroup.
#pragma unroll 1
    for (int c = 0; c < (n >= 0 ? Cfg::kChunksPerHalf : 0); ++c)
      mbarrier_wait(&ss.full[n % NS][w * Cfg::kChunksPerHalf + c], (n / NS) & 1);
    n = max(n, 0);
    detail::issue_pv_half<Cfg>(mma_o, tw, p_buf(n), ss.kv[n % NS] + w * (DV / 2) * BN, tOrO, fresh);
  };
  // O rows *= the scale of tile n (the rare case where its row max moved the reference max).
  // Callers have no wgmma in flight.
  auto rescale_o = [&](int n) {
    const float sc0 = ss.scale_tile[n % 2][row0], sc1 = ss.scale_tile[n % 2][row0 + 8];
#pragma unroll
    for (int i = 0; i < size(tOrO); ++i) tOrO(i) *= ((i >> 1) & 1) ? sc1 : sc0;
  };
  // O / l of a finished piece of batch bi (callers have no wgmma in flight).
  auto store_o = [&](int bi, float inv_l0, float inv_l1) {
    const PieceDest dest = piece_dest(p, bi, bi == meta[kMetaBeginBatch] ? meta[kMetaBeginSplit] : 0);
    const int col_base = w * (DV / 2) + col_lane;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = m_block * BM + row0 + 8 * h;
      if (r >= p.rows) continue;
      const float inv_l = h ? inv_l1 : inv_l0;
      const auto [s, head] = query_row(p, g, r);
      if (dest.single) {
        Element* out_row = reinterpret_cast<Element*>(p.out) + (((bi * p.s_q + s) * p.h_q + head) * DV + col_base);
#pragma unroll
        for (int j = 0; j < size(tOrO) / 4; ++j) {
          const int i = j * 4 + h * 2;
          *reinterpret_cast<uint32_t*>(out_row + j * 8) = ElemTraits<Element>::pack2(tOrO(i) * inv_l, tOrO(i + 1) * inv_l);
        }
      } else {
        float* acc_row = p.o_accum + (((dest.slot * p.h_kv + g) * p.rows + r) * DV + col_base);
#pragma unroll
        for (int j = 0; j < size(tOrO) / 4; ++j) {
          const int i = j * 4 + h * 2;
          *reinterpret_cast<float2*>(acc_row + j * 8) = make_float2(tOrO(i) * inv_l, tOrO(i + 1) * inv_l);
        }
      }
    }
  };
  auto release = [&](int n) {
    __syncwarp();
    if (tw % 32 == 0) mbarrier_arrive(&ss.half_free[n % NS][w]);
  };

  // Q of a piece into smem by this warpgroup.
  auto load_q = [&](int bi) {
    const Element* qb = reinterpret_cast<const Element*>(p.q) + (long long)bi * p.q_stride_b;
#pragma unroll 1
    for (int idx = tw; idx < BM * (D / 8); idx += 128) {
      const int lr = idx / (D / 8), c = idx % (D / 8);
      uint4 v = make_uint4(0u, 0u, 0u, 0u);
      const int r = m_block * BM + lr;
      if (r < p.rows) {
        const auto [s, head] = query_row(p, g, r);
        v = __ldg(reinterpret_cast<const uint4*>(qb + s * p.q_stride_s + head * p.q_stride_h + c * 8));
      }
      detail::st_shared_v4(smem_addr(ss.q) + detail::sw128_offset<BM>(lr, c * 8), v);
    }
    fence_proxy_async_shared();
  };

  struct TileRef {
    int bi, tok, L;
    bool start, last;
  };

  // S(n) = Q K(n)^T, chunk by chunk as the TMA bytes land: 4 k-steps of 16 per 64-column chunk,
  // one commit group each (a wait between the wgmmas of one group makes ptxas serialize them).
  auto issue_s = [&](int n, const TileRef& t) {
    Element* kv = ss.kv[n % NS];
    if (t.tok + BN > t.L) {  // rows past the end (NaN allowed there) are zeroed before S
#pragma unroll 1
      for (int c = 0; c < Cfg::kColChunks; ++c) mbarrier_wait(&ss.full[n % NS][c], (n / NS) & 1);
      detail::zero_rows_from<BN, D>(smem_addr(kv), t.L - t.tok, tw);
      fence_proxy_async_shared();
      wg_barrier();
    }
    Tensor sK = make_tensor(make_smem_ptr(kv), typename Cfg::SmemLayoutK{});
    Tensor tSsK = thr_s.partition_fragment_B(sK);
    warpgroup_fence_operand(tSrS);
    mma_s.accumulate_ = GMMA::ScaleOut::Zero;
    constexpr int kSteps = Cfg::kBoxCols / 16;
#pragma unroll
    for (int c = 0; c < Cfg::kColChunks; ++c) {
      mbarrier_wait(&ss.full[n % NS][c], (n / NS) & 1);
      warpgroup_arrive();
#pragma unroll
      for (int k = c * kSteps; k < (c + 1) * kSteps; ++k) {
        gemm(mma_s, tSsQ(_, _, k), tSsK(_, _, k), tSrS);
        mma_s.accumulate_ = GMMA::ScaleOut::One;
      }
      warpgroup_commit_batch();
    }
  };

  // Online softmax of S(n) with lazy rescaling: P = exp2(S * scale - m_ref), where a row's
  // reference max m_ref only moves when the tile's max exceeds it by more than kRescaleLog2 (so
  // P <= 2^kRescaleLog2 and O rarely needs rescaling). Publishes P(n) into smem, m_ref, the O
  // scale, the partial row sums, whether any row moved (rescale[n % 2]) and, at a piece's last
  // tile, 1/l. Returns whether O must be rescaled before P V(n); 1/l in inv_l at the last tile.
  constexpr float kRescaleLog2 = 8.f;
  auto softmax_publish = [&](int n, const TileRef& t, float (&inv_l)[2]) -> bool {
    float m_prev[2], l_prev[2];
    if (t.start) {
      m_prev[0] = m_prev[1] = -kInf;
      l_prev[0] = l_prev[1] = 0.f;
    } else {
      const float2 lp = ss.l_part[(n - 1) % 2][tw];
      m_prev[0] = ss.m_tile[(n - 1) % 2][row0];
      m_prev[1] = ss.m_tile[(n - 1) % 2][row0 + 8];
      l_prev[0] = lp.x;
      l_prev[1] = lp.y;
    }
    int lim[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) lim[h] = detail::visible_keys(p, t.L, m_block * BM + row0 + 8 * h);
    detail::mask_invisible(tSrS, t.tok, col_lane, lim);
    float sc[2], l_new[2], m_new[2];
    bool moved = false;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float mx = detail::row_max(tSrS, h);
      mx *= p.scale_log2;
      // -inf - x is -inf, never > mx: an all-masked row keeps m_ref (-inf at a piece start).
      const bool move = mx > m_prev[h] + kRescaleLog2;
      m_new[h] = move ? mx : m_prev[h];
      const float m_use = m_new[h] == -kInf ? 0.f : m_new[h];
      sc[h] = move ? detail::ex2_approx(m_prev[h] - m_use) : 1.f;
      moved |= move && !t.start;
      const float sum = detail::exp2_row(tSrS, h, p.scale_log2, m_use);
      l_new[h] = l_prev[h] * sc[h] + sum;
    }
    float lse2[2] = {-kInf, -kInf};
    if (t.last) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float l = l_new[h];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        inv_l[h] = l > 0.f ? detail::rcp_approx(l) : 0.f;
        lse2[h] = l > 0.f ? (m_new[h] == -kInf ? 0.f : m_new[h]) + detail::lg2_approx(l) : -kInf;
      }
    }
    // Also the barrier after which every warp's S(n) has read the rope slab P goes into.
    const bool rescale = wg_barrier_any(moved);
    detail::store_p_slab<Element>(smem_addr(p_buf(n)), row0, col_lane, tSrS);
    if ((tw & 3) == 0) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        ss.m_tile[n % 2][row0 + 8 * h] = m_new[h];
        ss.scale_tile[n % 2][row0 + 8 * h] = sc[h];
        ss.inv_l[n % 2][row0 + 8 * h] = inv_l[h];
      }
    }
    if (tw == 0) ss.rescale[n % 2] = rescale;
    ss.l_part[n % 2][tw] = make_float2(l_new[0], l_new[1]);
    if (t.last && (tw & 3) == 0) {
      const PieceDest dest = piece_dest(p, t.bi, t.bi == meta[kMetaBeginBatch] ? meta[kMetaBeginSplit] : 0);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = m_block * BM + row0 + 8 * h;
        if (r < p.rows) store_piece_lse(p, dest, t.bi, g, r, lse2[h]);
      }
    }
    fence_proxy_async_shared();  // P (and a new piece's Q) before the other's wgmmas read them
    __syncwarp();
    if (tw % 32 == 0) mbarrier_arrive(&ss.p_ready[n % 2]);
    return rescale;
  };

  // The walk (see the header comment for the order of operations per own tile).
  TileRef prev{}, t{};
  bool has_prev = false;
  bool own_pv_pending = false;  // own P V(n - 2) issued, not waited
  int pend_n = 0;
  TileRef pend{};
  float pend_inv_l[2] = {0.f, 0.f};
  int n = 0;
  auto finish_own_pv = [&]() {  // own P V(pend_n) complete: release, store a finished piece
    release(pend_n);
    if (pend.last) store_o(pend.bi, pend_inv_l[0], pend_inv_l[1]);
    own_pv_pending = false;
  };
  for (; cur.valid(); ++n) {
    t.bi = cur.bi;
    t.tok = cur.tok;
    t.L = cur.L;
    t.start = n == 0 || prev.last;
    t.last = cur.tok + BN >= cur.stop;
    cur.template advance<BN>(seqlens);
    if (n % 2 == w) {
      warpgroup_wait<0>();  // own P V(n - 2), if any (unconditional: a wait in a branch serializes)
      warpgroup_fence_operand(tOrO);
      if (own_pv_pending) finish_own_pv();
      // The other's P V(n - 1) first: its stage half is then free for tile n + 1 early. A new
      // piece's Q is loaded after P(n - 1) is published (the other's S(n - 1), the last reader
      // of the old Q, is done); the other's next S waits for P(n), published after S(n).
      float prev_inv_l[2] = {0.f, 0.f};
      if (has_prev) {
        mbarrier_wait(&ss.p_ready[(n - 1) % 2], ((n - 1) / 2) & 1);
        prev_inv_l[0] = ss.inv_l[(n - 1) % 2][row0];
        prev_inv_l[1] = ss.inv_l[(n - 1) % 2][row0 + 8];
        if (ss.rescale[(n - 1) % 2]) rescale_o(n - 1);  // rare; nothing in flight here
      }
      issue_pv(has_prev ? n - 1 : -1, !has_prev || prev.start);  // n - 1 < 0: throwaway
      if (t.start) {
        load_q(t.bi);
        wg_barrier();
      }
      issue_s(n, t);
      warpgroup_wait<7>();  // P V(n - 1) done (and S(n)'s first chunks)
      if (has_prev) release(n - 1);
      warpgroup_wait<0>();  // S(n) done
      warpgroup_fence_operand(tSrS);
      warpgroup_fence_operand(tOrO);
      if (has_prev && prev.last) store_o(prev.bi, prev_inv_l[0], prev_inv_l[1]);
      float inv_l[2] = {0.f, 0.f};
      const bool rescale = softmax_publish(n, t, inv_l);
      if (rescale) rescale_o(n);
      issue_pv(n, t.start);
      own_pv_pending = true;
      pend_n = n;
      pend = t;
      pend_inv_l[0] = inv_l[0];
      pend_inv_l[1] = inv_l[1];
    }
    prev = t;
    has_prev = true;
  }
  warpgroup_wait<0>();
  warpgroup_fence_operand(tOrO);
  if (own_pv_pending) finish_own_pv();
  // The CTA's last tile is the other's: its P V for this half.
  if (n >= 1 && (n - 1) % 2 != w) {
    mbarrier_wait(&ss.p_ready[(n - 1) % 2], ((n - 1) / 2) & 1);
    const float i0 = ss.inv_l[(n - 1) % 2][row0], i1 = ss.inv_l[(n - 1) % 2][row0 + 8];
    if (ss.rescale[(n - 1) % 2]) rescale_o(n - 1);
    issue_pv(n - 1, prev.start);
    warpgroup_wait<0>();
    warpgroup_fence_operand(tOrO);
    release(n - 1);
    store_o(prev.bi, i0, i1);
  }
  pdl_launch_dependents();
}

}  // namespace decode
}  // namespace mla_jit
