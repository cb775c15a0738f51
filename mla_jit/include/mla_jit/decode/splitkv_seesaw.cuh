// mla_jit decode: the "seesaw" split-KV schedule for sm_90a (MLA_JIT_SM90_DECODE_SCHEDULE=seesaw,
// experimental: correct on the whole test grid; it was on par with splitkv_ws.cuh only on the
// longest compute-bound rows, where ws has since become 1.07-1.18x faster (not re-measured against
// this kernel); bench/NOTES.md has the measurements). Same contract as
// splitkv_ws.cuh without the fused combine (the combine kernel merges the splits).
//
// Grid (num_sm_parts, h_kv, ceil(rows / 64)), 384 threads, 2 KV stages (Q, 64 x d, lives in smem).
//   WG0, WG1 ("math"): tiles (64 tokens) go in pairs, 2k to WG0 and 2k + 1 to WG1. A tile's owner
//     computes S (SS wgmma, issued chunk by chunk as the TMA bytes land), the online softmax
//     against the running max of the tile before, and publishes P (in the rope columns of the
//     tile's stage, or a P buffer at d = dv), its max, O scale flag and partial row sums
//     (p_ready). WG w owns O[:, 256 w : 256 w + 256] and adds every tile's P V to it in order.
//   WG2: thread 256 is the TMA producer. A stage half (the V columns of one math WG) is refilled
//     as soon as that WG's P V of the stage's previous tile completes.
// Per pair: WG0 softmax(2k) -> P V(2k) -> [waits P(2k + 1)] -> P V(2k + 1) -> S(2k + 2);
//           WG1 [waits P(2k)] softmax(2k + 1) -> P V(2k) -> P V(2k + 1) -> S(2k + 3).
// The chain per pair is softmax(2k) -> softmax(2k + 1) -> P V -> S(2k + 2) (whose bytes are
// refilled meanwhile); each S runs while the other warpgroup does its softmax and P Vs.
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
  auto issue_pv = [&](int n, bool fresh) {
    // The TMA bytes of this half of V(n): complete already (the owner of n waited for them before
    // S(n)), waited again so that they are visible to this warpgroup.
#pragma unroll 1
    for (int c = 0; c < Cfg::kChunksPerHalf; ++c)
      mbarrier_wait(&ss.full[n % NS][w * Cfg::kChunksPerHalf + c], (n / NS) & 1);
    detail::issue_pv_half<Cfg>(mma_o, tw, p_buf(n), ss.kv[n % NS] + w * (DV / 2) * BN, tOrO, fresh);
  };
  // O rows *= the scale of tile n (the rare case where its row max moved the reference max).
  // Callers have no wgmma in flight.
  auto rescale_o = [&](float sc0, float sc1) {
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

  // A tile's O scale (applied only when `rescale`: some row moved its reference max) and 1/l
  // (at a piece's last tile), (x, y) for this thread's two rows.
  struct TileScales {
    bool rescale;
    float2 sc, inv_l;
  };

  // Online softmax of S(n) with lazy rescaling: P = exp2(S * scale - m_ref), where a row's
  // reference max m_ref only moves when the tile's max exceeds it by more than kLazyRescaleLog2
  // (so P <= 2^8 and O rarely needs rescaling). Publishes P(n) into smem, m_ref, the O
  // scale, the partial row sums, whether any row moved (rescale[n % 2]) and, at a piece's last
  // tile, 1/l; returns them (TileScales) for this warpgroup's P V(n).
  auto softmax_publish = [&](int n, const TileRef& t) -> TileScales {
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
      const bool move = mx > m_prev[h] + detail::kLazyRescaleLog2;
      m_new[h] = move ? mx : m_prev[h];
      const float m_use = m_new[h] == -kInf ? 0.f : m_new[h];
      sc[h] = move ? detail::ex2_approx(m_prev[h] - m_use) : 1.f;
      moved |= move && !t.start;
      const float sum = detail::exp2_row(tSrS, h, p.scale_log2, m_use);
      l_new[h] = l_prev[h] * sc[h] + sum;
    }
    float lse2[2] = {-kInf, -kInf}, inv_l[2] = {0.f, 0.f};
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
    return TileScales{rescale, make_float2(sc[0], sc[1]), make_float2(inv_l[0], inv_l[1])};
  };

  // Tiles in pairs: 2k to WG0, 2k + 1 to WG1. Per pair a warpgroup finishes its own S, runs its
  // softmax (WG1 after WG0's, whose max it needs), adds P V of both tiles to its O half in tile
  // order, then issues S of its tile of the next pair, which runs during the other's softmax.
  bool next_start = true;
  auto next_tile = [&](TileRef& t) -> bool {
    if (!cur.valid()) return false;
    t.bi = cur.bi;
    t.tok = cur.tok;
    t.L = cur.L;
    t.start = next_start;
    t.last = cur.tok + BN >= cur.stop;
    next_start = t.last;
    cur.template advance<BN>(seqlens);
    return true;
  };
  // S of own tile n (prev: tile n - 1, when n > 0). Q: a piece starting at n is loaded once the
  // other's S(n - 1), the last reader of the old Q, is done (P(n - 1) published); one that
  // started at the other's tile n - 1 was loaded before P(n - 1) was published.
  auto start_s = [&](int n, const TileRef& t, const TileRef& prev) {
    if (n > 0 && (t.start || prev.start)) mbarrier_wait(&ss.p_ready[(n - 1) % 2], ((n - 1) / 2) & 1);
    if (t.start) {
      load_q(t.bi);
      wg_barrier();
    }
    issue_s(n, t);
  };
  // This warpgroup's P V of tile n (own or the other's, P published), waited for: O in tile
  // order, the stage half released, a finished piece stored. Called unconditionally (valid
  // false: nothing but the wait): a wgmma wait in a branch makes ptxas serialize every wgmma.
  auto apply_pv = [&](bool valid, int n, const TileRef& t, const TileScales& f) {
    if (valid) {
      if (f.rescale) rescale_o(f.sc.x, f.sc.y);  // rare; nothing in flight here
      issue_pv(n, t.start);
    }
    warpgroup_wait<0>();
    warpgroup_fence_operand(tOrO);
    if (valid) {
      release(n);
      if (t.last) store_o(t.bi, f.inv_l.x, f.inv_l.y);
    }
  };
  // The other warpgroup's tile n's scales, read right after its P is published (before this
  // warpgroup publishes its next P, after which the slot may be rewritten).
  auto read_scales = [&](int n) {
    TileScales f;
    f.rescale = ss.rescale[n % 2];
    f.sc = make_float2(ss.scale_tile[n % 2][row0], ss.scale_tile[n % 2][row0 + 8]);
    f.inv_l = make_float2(ss.inv_l[n % 2][row0], ss.inv_l[n % 2][row0 + 8]);
    return f;
  };

  TileRef ta{}, tb{};
  bool va = next_tile(ta);
  bool vb = va && next_tile(tb);
  if (w == 0 ? va : vb) {
    const TileRef own = w == 0 ? ta : tb;  // copies: a ternary of references puts them in local memory
    start_s(w, own, ta);
  }
  // Waited right away (the warpgroup has nothing else to do until its softmax): a wgmma in flight
  // across the loop's back edge, issued in a branch, makes ptxas serialize every wgmma.
  warpgroup_wait<0>();
  warpgroup_fence_operand(tSrS);
  for (int k = 0; va; ++k) {
    const int n0 = 2 * k, n1 = n0 + 1;
    TileRef na{}, nb{};
    const bool wa = vb && next_tile(na);
    const bool wb = wa && next_tile(nb);
    // The other's tile (WG0: n1, WG1: n0): its P published, then its scales read at once (the
    // slot is rewritten at its tile after next, which waits for this warpgroup's next P). WG1
    // needs it before its softmax (the max after n0); WG0 after its own P V(n0).
    const int no = n0 + 1 - w;
    TileScales other{}, own_f{};
    auto wait_other = [&]() {
      mbarrier_wait(&ss.p_ready[no % 2], (no / 2) & 1);
      other = read_scales(no);
    };
    if (w == 1) wait_other();
    if (w == 0 || vb) {
      const TileRef own = w == 0 ? ta : tb;
      own_f = softmax_publish(n0 + w, own);
    }
    const TileScales f0 = w == 0 ? own_f : other;  // copies (see `own` above)
    apply_pv(true, n0, ta, f0);
    if (w == 0 && vb) wait_other();
    const TileScales f1 = w == 1 ? own_f : other;
    apply_pv(vb, n1, tb, f1);
    // S of own tile in the next pair.
    if (w == 0 ? wa : wb) {
      const TileRef own = w == 0 ? na : nb, before = w == 0 ? tb : na;
      start_s(n0 + 2 + w, own, before);
    }
    warpgroup_wait<0>();
    warpgroup_fence_operand(tSrS);
    ta = na;
    tb = nb;
    va = wa;
    vb = wb;
  }
  pdl_launch_dependents();
}

}  // namespace decode
}  // namespace mla_jit
