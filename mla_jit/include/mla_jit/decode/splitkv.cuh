// mla_jit decode: dense paged MLA split-KV kernel for sm_90a (TMA + WGMMA, 2 consumer warpgroups).
//
// Grid (num_sm_parts, h_kv, ceil(rows / BLOCK_M)), block 256 threads, 1 CTA / SM,
// dynamic smem SplitKVConfig<...>::kSmemBytes. One CTA walks the (batch, token) range that the
// scheduler metadata gives its SM part, for one KV head and one 64-row tile of query rows.
//
// Schedule per 64-token KV tile n (stage n % NUM_STAGES):
//   WG0: wait K/V tile -> S = Q K^T (64 x 64, wgmma SS) -> mask + online softmax in registers
//        -> write P (bf16/fp16) and per-row rescale to smem -> O[:, :256] = O*scale + P V[:, :256]
//   WG1: wait P -> O[:, 256:] = O*scale + P V[:, 256:]; thread 128 is the TMA producer and refills
//        the stage of tile n with tile n + NUM_STAGES once both warpgroups are done with tile n.
// K and V are the same smem tile (V = first HEAD_DIM_V columns, read through a transposed view),
// so every KV byte crosses HBM once per CTA.
#pragma once

#include "sm90_tiles.cuh"

namespace mla_jit {
namespace decode {

template <typename Element_, int HEAD_DIM_, int HEAD_DIM_V_, int PAGE_SIZE_, int BLOCK_M_ = 64,
          int BLOCK_N_ = 64, int NUM_STAGES_ = 2>
struct SplitKVConfig : Sm90DecodeTiles<Element_, HEAD_DIM_, HEAD_DIM_V_, PAGE_SIZE_, BLOCK_M_, BLOCK_N_> {
  using Element = Element_;
  static constexpr int HEAD_DIM = HEAD_DIM_;
  static constexpr int BLOCK_M = BLOCK_M_;
  static constexpr int BLOCK_N = BLOCK_N_;
  static constexpr int NUM_STAGES = NUM_STAGES_;
  static constexpr int NUM_THREADS = 256;

  static_assert(HEAD_DIM % 64 == 0 && HEAD_DIM_V_ % 128 == 0 && HEAD_DIM_V_ <= HEAD_DIM, "dims");
  static_assert(HEAD_DIM_V_ / 2 <= 256, "each warpgroup owns HEAD_DIM_V/2 <= 256 output columns");

  struct SharedStorage {
    alignas(1024) Element q[BLOCK_M * HEAD_DIM];
    alignas(1024) Element kv[NUM_STAGES][BLOCK_N * HEAD_DIM];
    alignas(1024) Element p[BLOCK_M * BLOCK_N];
    float row_scale[BLOCK_M];  // exp2(m_old - m_new) of the current tile
    float row_inv_l[BLOCK_M];  // 1 / l at the last tile of a piece
    alignas(8) uint64_t full[NUM_STAGES];  // TMA landed (tx-count barrier)
    uint64_t p_full;   // WG0 wrote P / row_scale (4 warp arrivals)
    uint64_t pv_done;  // all 8 warps finished P V of the tile (frees P and the stage)
  };
  // +1024: the kernel rounds the dynamic smem base up to the 1024 B swizzle period.
  static constexpr int kSmemBytes = int(sizeof(SharedStorage)) + 1024;
  static_assert(kSmemBytes <= 227 * 1024, "shared memory budget (reduce NUM_STAGES)");
};


template <typename Cfg>
__device__ __forceinline__ void mla_splitkv_body(const DecodeParams& p, const TmaDescriptor* tmap) {
  using namespace cute;
  using Element = typename Cfg::Element;
  using SS = typename Cfg::SharedStorage;
  constexpr int BM = Cfg::BLOCK_M, BN = Cfg::BLOCK_N, D = Cfg::HEAD_DIM, DV = Cfg::HEAD_DIM_V;
  constexpr int NS = Cfg::NUM_STAGES;

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
    for (int s = 0; s < NS; ++s) mbarrier_init(&ss.full[s], 1);
    mbarrier_init(&ss.p_full, 4);
    mbarrier_init(&ss.pv_done, 8);
    fence_barrier_init();
  }
  if (is_producer) prefetch_tma_descriptor(tmap);
  __syncthreads();

  // No-op unless launched as a programmatic dependent of the metadata kernel.
  pdl_wait_primary();

  const int* meta = p.tile_scheduler_metadata + part * kMetaSize;
  const int* seqlens = p.cache_seqlens;

  // ---------------- TMA producer state (thread 128 only) ----------------
  detail::WorkCursor prod;
  int prod_n = 0;  // index of the next tile to issue
  auto issue_tile = [&]() {
    const int stage = prod_n % NS;
    // Stage reuse: every warp must be done with tile prod_n - NS.
    if (prod_n >= NS) mbarrier_wait(&ss.pv_done, (prod_n - NS) & 1);
    const int* bt = p.block_table + (long long)prod.bi * p.block_table_stride;
    Element* dst = ss.kv[stage];
    if constexpr (Cfg::kPagesPerTile == 1) {
      const int page = prod.tok / Cfg::PAGE_SIZE;
      const int row = bt[page] * Cfg::PAGE_SIZE + (prod.tok % Cfg::PAGE_SIZE);
      mbarrier_arrive_expect_tx(&ss.full[stage], Cfg::kTileBytes);
#pragma unroll
      for (int c = 0; c < Cfg::kColChunks; ++c)
        tma_load_3d(dst + c * BN * Cfg::kBoxCols, tmap, &ss.full[stage], c * Cfg::kBoxCols, g, row);
    } else {
      // Several pages per tile: load only pages that hold tokens < L (later block_table
      // entries may be garbage, later pages NaN).
      const int valid = min(BN, prod.L - prod.tok);
      const int npages = (valid + Cfg::PAGE_SIZE - 1) / Cfg::PAGE_SIZE;
      mbarrier_arrive_expect_tx(&ss.full[stage], npages * Cfg::kPageBytes);
      const int page0 = prod.tok / Cfg::PAGE_SIZE;
#pragma unroll
      for (int j = 0; j < Cfg::kPagesPerTile; ++j) {
        if (j < npages) {
          const int row = bt[page0 + j] * Cfg::PAGE_SIZE;
#pragma unroll
          for (int c = 0; c < Cfg::kColChunks; ++c)
            tma_load_3d(dst + c * BN * Cfg::kBoxCols + j * Cfg::kBoxRows * Cfg::kBoxCols, tmap, &ss.full[stage],
                        c * Cfg::kBoxCols, g, row);
        }
      }
    }
    ++prod_n;
    prod.template advance<BN>(seqlens);
  };
  if (is_producer) {
    prod.init(meta, seqlens);
    for (int s = 0; s < NS && prod.valid(); ++s) issue_tile();
  }
  __syncwarp();  // reconverge warp 4 before any .aligned (wgmma) instruction

  // ---------------- consumer state ----------------
  detail::WorkCursor cur;
  cur.init(meta, seqlens);
  const int begin_split_local = meta[kMetaBeginSplit];

  // Accumulator-fragment geometry of a 64 x N wgmma (f32): element i of a thread lives at
  // row warp*16 + lane/4 + 8*((i/2)%2), column (i/4)*8 + (lane%4)*2 + i%2.
  const int row0 = warp_wg * 16 + lane / 4;  // local rows row0 and row0 + 8
  const int col_lane = (lane % 4) * 2;

  typename Cfg::TiledMmaO mma_o;
  auto thr_o = mma_o.get_thread_slice(tid_wg);
  Tensor tOrO = partition_fragment_C(mma_o, Shape<Int<BM>, Int<DV / 2>>{});
  Tensor sP = make_tensor(make_smem_ptr(ss.p), typename Cfg::SmemLayoutP{});
  Tensor tOrP = thr_o.partition_fragment_A(sP);

  auto clear_o = [&]() {
#pragma unroll
    for (int i = 0; i < size(tOrO); ++i) tOrO(i) = 0.f;
  };
  // O = O * scale + P V_half for the tile in `stage`.
  auto pv_gemm = [&](int stage, float sc0, float sc1) {
#pragma unroll
    for (int i = 0; i < size(tOrO); ++i) tOrO(i) *= ((i >> 1) & 1) ? sc1 : sc0;
    Tensor sVt = make_tensor(make_smem_ptr(ss.kv[stage] + wg * (DV / 2) * BN), typename Cfg::SmemLayoutVtHalf{});
    Tensor tOrV = thr_o.partition_fragment_B(sVt);
    warpgroup_fence_operand(tOrO);
    warpgroup_arrive();
    mma_o.accumulate_ = GMMA::ScaleOut::One;
#pragma unroll
    for (int k = 0; k < size<2>(tOrP); ++k) gemm(mma_o, tOrP(_, _, k), tOrV(_, _, k), tOrO);
    warpgroup_commit_batch();
    warpgroup_wait<0>();
    warpgroup_fence_operand(tOrO);
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
        const auto [s, head] = query_row(p, g, r);
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
  int n = 0;  // consumer tile index
  if (wg == 0) {
    // =========================== WG0: S, softmax, P, O[:, :DV/2] ===========================
    typename Cfg::TiledMmaS mma_s;
    auto thr_s = mma_s.get_thread_slice(tid_wg);
    Tensor sQ = make_tensor(make_smem_ptr(ss.q), typename Cfg::SmemLayoutQ{});
    Tensor tSrQ = thr_s.partition_fragment_A(sQ);
    Tensor tSrS = partition_fragment_C(mma_s, Shape<Int<BM>, Int<BN>>{});
    static_assert(decltype(size(tSrS))::value == BN / 2, "S fragment");

    float m_run[2], l_run[2];  // running max (log2 units, scaled) and per-thread partial sum
    int lim[2];                // first masked token for each of this thread's rows

    bool piece_start = true;
    while (cur.valid()) {
      const int stage = n % NS;
      if (piece_start) {
        // (Re)load Q for this batch. The barrier makes sure no warp of WG0 still reads the
        // previous Q through an in-flight wgmma.
        named_barrier_sync(1, 128);
        constexpr int kChunks = D / 8;  // 16-byte chunks per row
        const Element* qb = reinterpret_cast<const Element*>(p.q) + (long long)cur.bi * p.q_stride_b;
#pragma unroll 4
        for (int idx = tid_wg; idx < BM * kChunks; idx += 128) {
          const int lr = idx / kChunks, c = idx % kChunks;
          const int r = m_block * BM + lr;
          uint4 v = make_uint4(0u, 0u, 0u, 0u);  // padded rows are zero: no NaN from garbage
          if (r < p.rows) {
            const auto [s, head] = query_row(p, g, r);
            v = __ldg(reinterpret_cast<const uint4*>(qb + s * p.q_stride_s + head * p.q_stride_h + c * 8));
          }
          *reinterpret_cast<uint4*>(&sQ(lr, c * 8)) = v;
        }
        fence_proxy_async_shared();
        named_barrier_sync(1, 128);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          m_run[h] = -kInf;
          l_run[h] = 0.f;
          const int r = m_block * BM + row0 + 8 * h;
          // Causal, bottom-right aligned: query s sees keys < L - s_q + s + 1.
          lim[h] = p.causal ? min(cur.L, cur.L - p.s_q + r / p.q_per_kv + 1) : cur.L;
        }
        piece_start = false;
      }

      mbarrier_wait(&ss.full[stage], (n / NS) & 1);
      Tensor sK = make_tensor(make_smem_ptr(ss.kv[stage]), typename Cfg::SmemLayoutK{});
      if (cur.tok + BN > cur.L) {
        // Tail tile: rows >= L were not loaded (other pages) or hold data past the sequence
        // end (possibly NaN). Zero them so that neither S nor P V can pick up NaN.
        constexpr int kChunks = D / 8;
        const int v0 = cur.L - cur.tok;
        for (int idx = tid_wg; idx < (BN - v0) * kChunks; idx += 128) {
          const int lr = v0 + idx / kChunks, c = idx % kChunks;
          *reinterpret_cast<uint4*>(&sK(lr, c * 8)) = make_uint4(0u, 0u, 0u, 0u);
        }
        fence_proxy_async_shared();
        named_barrier_sync(1, 128);
      }

      // ---- S = Q K^T ----
      Tensor tSrK = thr_s.partition_fragment_B(sK);
      warpgroup_fence_operand(tSrS);
      warpgroup_arrive();
      mma_s.accumulate_ = GMMA::ScaleOut::Zero;
#pragma unroll
      for (int k = 0; k < size<2>(tSrQ); ++k) {
        gemm(mma_s, tSrQ(_, _, k), tSrK(_, _, k), tSrS);
        mma_s.accumulate_ = GMMA::ScaleOut::One;
      }
      warpgroup_commit_batch();
      warpgroup_wait<0>();
      warpgroup_fence_operand(tSrS);

      // ---- mask (select, so NaN never survives) ----
      if (cur.tok + BN > min(lim[0], lim[1])) {
#pragma unroll
        for (int i = 0; i < size(tSrS); ++i) {
          const int t = cur.tok + (i / 4) * 8 + col_lane + (i & 1);
          if (t >= lim[(i >> 1) & 1]) tSrS(i) = -kInf;
        }
      }
      // ---- online softmax (log2 domain) ----
      float sc[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float mx = -kInf;
#pragma unroll
        for (int j = 0; j < size(tSrS) / 4; ++j) mx = fmaxf(mx, fmaxf(tSrS(j * 4 + h * 2), tSrS(j * 4 + h * 2 + 1)));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float m_new = fmaxf(m_run[h], mx * p.scale_log2);
        const float m_use = m_new == -kInf ? 0.f : m_new;  // avoid (-inf) - (-inf)
        sc[h] = exp2f(m_run[h] - m_use);
        m_run[h] = m_new;
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
        l_run[h] = l_run[h] * sc[h] + sum;
      }

      const bool last = cur.tok + BN >= cur.stop;
      float inv_l[2] = {0.f, 0.f}, lse2[2] = {-kInf, -kInf};
      if (last) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          float l = l_run[h];
          l += __shfl_xor_sync(0xffffffffu, l, 1);
          l += __shfl_xor_sync(0xffffffffu, l, 2);
          inv_l[h] = l > 0.f ? 1.f / l : 0.f;
          lse2[h] = l > 0.f ? m_run[h] + log2f(l) : -kInf;
        }
      }

      // ---- hand P to WG1 (P buffer is free once every warp finished P V of tile n-1) ----
      mbarrier_wait(&ss.pv_done, (n & 1) ^ 1);
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
        for (int h = 0; h < 2; ++h) {
          ss.row_scale[row0 + 8 * h] = sc[h];
          if (last) ss.row_inv_l[row0 + 8 * h] = inv_l[h];
        }
      }
      fence_proxy_async_shared();
      __syncwarp();
      if (lane == 0) mbarrier_arrive(&ss.p_full);
      mbarrier_wait(&ss.p_full, n & 1);  // all of WG0's P is written before WG0's own P V reads it

      // ---- O[:, :DV/2] ----
      pv_gemm(stage, sc[0], sc[1]);
      __syncwarp();
      if (lane == 0) mbarrier_arrive(&ss.pv_done);

      if (last) {
        const PieceDest dest = piece_dest(p, cur.bi, cur.bi == cur.begin_b ? begin_split_local : 0);
        store_o(inv_l[0], inv_l[1], dest.single, dest.slot);
        if ((lane & 3) == 0) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int r = m_block * BM + row0 + 8 * h;
            if (r < p.rows) store_piece_lse(p, dest, cur.bi, g, r, lse2[h]);
          }
        }
        clear_o();
        piece_start = true;
      }
      ++n;
      cur.template advance<BN>(seqlens);
    }
  } else {
    // =========================== WG1: O[:, DV/2:] + TMA producer ===========================
    while (cur.valid()) {
      const int stage = n % NS;
      mbarrier_wait(&ss.p_full, n & 1);
      mbarrier_wait(&ss.full[stage], (n / NS) & 1);
      const float sc0 = ss.row_scale[row0], sc1 = ss.row_scale[row0 + 8];
      const bool last = cur.tok + BN >= cur.stop;
      float il0 = 0.f, il1 = 0.f;
      if (last) {
        il0 = ss.row_inv_l[row0];
        il1 = ss.row_inv_l[row0 + 8];
      }
      pv_gemm(stage, sc0, sc1);
      __syncwarp();
      if (lane == 0) mbarrier_arrive(&ss.pv_done);
      // Refill this stage with tile n + NS (waits for WG0 to finish tile n).
      if (is_producer && prod.valid()) issue_tile();
      __syncwarp();  // lane 0 of warp 4 may have diverged into the producer path
      if (last) {
        const PieceDest dest = piece_dest(p, cur.bi, cur.bi == cur.begin_b ? begin_split_local : 0);
        store_o(il0, il1, dest.single, dest.slot);
        clear_o();
      }
      ++n;
      cur.template advance<BN>(seqlens);
    }
  }
  pdl_launch_dependents();
}

}  // namespace decode
}  // namespace mla_jit
