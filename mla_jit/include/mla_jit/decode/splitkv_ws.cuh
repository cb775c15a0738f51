// mla_jit decode: dense paged MLA split-KV kernel for sm_90a, "ws" schedule (warp-specialized:
// one S/softmax warpgroup, two P V warpgroups).
//
// Grid (num_sm_parts, h_kv, ceil(rows / BLOCK_M)), block 384 threads, 1 CTA / SM, dynamic smem
// SplitKVWsConfig<...>::kSmemBytes. Same contract as splitkv.cuh (metadata walk, TMA descriptor
// with box {64, 1, min(page, 64)} and 128B swizzle, out / lse for single-split batches, o_accum /
// lse_accum otherwise), so the host and the combine kernel are unchanged.
//
// Schedule per 64-token KV tile n (stage s = n % NUM_STAGES, use k = n / NUM_STAGES):
//   WG0 (S + softmax): Q[:, :DV] lives in registers for the whole piece (RS wgmma: A from
//        registers, so the N = 64 S GEMM reads only K from smem; at d = 576 the 64 rope columns
//        of Q stay in smem and go through an SS wgmma into the same accumulator).
//        wait full[s] -> (tail: zero K rows >= L) -> S = Q K^T -> mask + online softmax
//        -> P (bf16/fp16), row rescale (and 1/l at a piece end) -> smem slot of stage s
//        -> arrive p_full[s] -> (piece end) lse. WG0 never waits for P V, so S(n+1) and the
//        softmax of n+1 overlap WG1/WG2's P V of tile n on the tensor cores.
//   WG1, WG2 (P V): each owns half of O (64 x DV/2 fp32 in registers).
//        wait p_full[s] -> O *= rescale -> O += P V[:, half] (SS wgmma, V = the K tile read
//        through a transposed view) -> arrive pv_done[s] -> (piece end) store O / l.
//        Thread 128 (WG1) is the TMA producer: after issuing P V(n) (async) it refills the stage
//        of tile n-1 with tile n-1+NUM_STAGES once pv_done of tile n-1 completed; its block-table
//        loads and the wait overlap its own warpgroup's wgmma.
// K and V are the same smem tile (V = first HEAD_DIM_V columns), so every KV byte crosses HBM once
// per CTA. P(n) is written into the rope columns [DV, DV + 64) of stage s's K tile once every warp
// of WG0 finished S(n) (those columns are not part of V), so P lives and dies with its stage and
// three 72 KB stages fit at d = 576. At d = dv there are no rope columns: one P buffer per stage.
//
// Synchronization (every per-stage barrier completes once per use of its stage: parity k & 1):
//   full[s]    count 1 + tx: producer arrive_expect_tx + TMA. Waited by WG0 before S / tail
//              zeroing and (already complete, for visibility of the TMA bytes) by WG1/WG2.
//   p_full[s]  count 4: lane 0 of each WG0 warp after its P / row_scale / info stores (and
//              fence.proxy.async, P and the zeroed tail rows are read by wgmma). Waited by WG1/WG2.
//   pv_done[s] count 8: lane 0 of each WG1/WG2 warp after wgmma.wait of P V(n) and after reading
//              row_inv_l / info. Waited by the producer before refilling stage s with tile n+NS.
//   Stage s's P, row_scale[s], row_inv_l[s], info[s] are rewritten only by WG0 for tile n+NS,
//   after it waited full[s] of n+NS, which the producer issued after pv_done[s] of n: the chain
//   full <- pv_done protects every per-stage slot, so WG0 needs no "P consumed" barrier.
//   Named barrier 1 (WG0, 128 threads): piece start (Q rope rewritten only after every warp's
//   previous S wgmma, and published before the next S), tail zeroing -> S, and S(n) of all four
//   warps done -> P(n) stored over the rope columns that S(n) reads.
// Registers: setmaxnreg moves registers from the P V warpgroups (O half = 128 fp32 + state) to
// WG0 (Q = 128 + S = 32 + state). The three counts must add up to at most the launch allocation
// (168 x 3 warpgroups: __launch_bounds__(384, 1) -> 168 registers per thread), or
// setmaxnreg.inc blocks forever.
#pragma once

#include "common.cuh"

namespace mla_jit {
namespace decode {

namespace detail {

// setmaxnreg (sm_90a): the warpgroup's per-thread register count becomes N. .inc blocks until
// the registers released by .dec of other warpgroups are available.
template <int N>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}

// What the P V warpgroups need to know about a tile besides P and the row scale (WG0 owns the
// metadata walk). bi / slot / single are meaningful only when last != 0.
struct WsTileInfo {
  int last;    // last tile of its piece: O * (1/l) is stored after this tile
  int bi;      // batch of the piece
  int slot;    // o_accum / lse_accum slot of the piece
  int single;  // the batch has a single split: write out / lse directly
};

}  // namespace detail

template <typename Element_, int HEAD_DIM_, int HEAD_DIM_V_, int PAGE_SIZE_, int BLOCK_M_ = 64,
          int BLOCK_N_ = 64, int NUM_STAGES_ = 3>
struct SplitKVWsConfig {
  using Element = Element_;
  static constexpr int HEAD_DIM = HEAD_DIM_;
  static constexpr int HEAD_DIM_V = HEAD_DIM_V_;
  static constexpr int PAGE_SIZE = PAGE_SIZE_;
  static constexpr int BLOCK_M = BLOCK_M_;
  static constexpr int BLOCK_N = BLOCK_N_;
  static constexpr int NUM_STAGES = NUM_STAGES_;
  static constexpr int NUM_THREADS = 384;

  // Per-thread registers after setmaxnreg: WG0 (Q fragment + S) and the P V warpgroups.
  // 128 * (kRegsS + 2 * kRegsPV) <= 384 * 168 (the launch allocation).
  static constexpr int kRegsS = 216;
  static constexpr int kRegsPV = 144;
  static_assert(kRegsS + 2 * kRegsPV <= 3 * 168 && kRegsS % 8 == 0 && kRegsPV % 8 == 0, "setmaxnreg");

  static_assert(BLOCK_M == 64, "one wgmma M tile per warpgroup");
  static_assert(BLOCK_N == 64, "tile = 64 tokens (metadata block_n must match)");
  static_assert(HEAD_DIM_V == 512, "Q[:, :DV] in registers (128 regs / thread) and two O halves of 256");
  static_assert(HEAD_DIM == HEAD_DIM_V || HEAD_DIM == HEAD_DIM_V + 64, "rope part: none or 64 columns");
  static_assert(PAGE_SIZE >= 16 && PAGE_SIZE <= 256 && (PAGE_SIZE & (PAGE_SIZE - 1)) == 0, "page");
  static_assert(NUM_STAGES >= 2, "stages");
  static_assert(cute::is_same_v<Element, cutlass::bfloat16_t> || cute::is_same_v<Element, cutlass::half_t>,
                "bf16 or fp16");

  // d > dv: P goes into the rope columns of its stage's K tile; Q's rope part is kept in smem.
  static constexpr bool kPInRope = HEAD_DIM > HEAD_DIM_V;
  // aux: Q rope (BLOCK_M x 64) when kPInRope, else one P tile (BLOCK_M x BLOCK_N) per stage.
  static constexpr int kAuxElems = kPInRope ? BLOCK_M * 64 : NUM_STAGES * BLOCK_M * BLOCK_N;

  // TMA box: 64 columns (= 128 B, the SWIZZLE_128B span) x 1 head x kBoxRows tokens.
  static constexpr int kBoxCols = 64;
  static constexpr int kBoxRows = PAGE_SIZE < BLOCK_N ? PAGE_SIZE : BLOCK_N;
  static constexpr int kPagesPerTile = BLOCK_N / kBoxRows;  // 1 when a page holds >= 1 tile
  static constexpr int kColChunks = HEAD_DIM / kBoxCols;

  // K-major tiles with the 128B swizzle, each 64-column chunk a contiguous (rows x 128 B) slab
  // (what one TMA box writes). Chunk c of a K tile starts at element c * BLOCK_N * 64.
  using SwAtom = decltype(cute::GMMA::Layout_K_SW128_Atom<Element>{});
  using SmemLayoutK = decltype(cute::tile_to_shape(SwAtom{}, cute::Shape<cute::Int<BLOCK_N>, cute::Int<HEAD_DIM>>{}));
  // One 64 x 64 slab: Q rope, K rope, P.
  using SmemLayoutSlab = decltype(cute::tile_to_shape(SwAtom{}, cute::Shape<cute::Int<64>, cute::Int<64>>{}));
  using SmemLayoutVHalf =
      decltype(cute::tile_to_shape(SwAtom{}, cute::Shape<cute::Int<BLOCK_N>, cute::Int<HEAD_DIM_V / 2>>{}));
  // V half seen as the (dv/2, tokens) B operand: MN-major view of the same K-major bytes.
  using SmemLayoutVtHalf = decltype(cute::composition(
      SmemLayoutVHalf{},
      cute::make_layout(cute::Shape<cute::Int<HEAD_DIM_V / 2>, cute::Int<BLOCK_N>>{}, cute::GenRowMajor{})));

  // S nope part: A = Q[:, :DV] from registers, B = K from smem.
  using TiledMmaSRs = decltype(cute::make_tiled_mma(
      cute::GMMA::rs_op_selector<Element, Element, float,
                                 cute::Shape<cute::Int<BLOCK_M>, cute::Int<BLOCK_N>, cute::Int<HEAD_DIM_V>>>()));
  // S rope part: both operands from smem, same accumulator layout.
  using TiledMmaSSs = decltype(cute::make_tiled_mma(
      cute::GMMA::ss_op_selector<Element, Element, float,
                                 cute::Shape<cute::Int<BLOCK_M>, cute::Int<BLOCK_N>, cute::Int<64>>>()));
  using TiledMmaO = decltype(cute::make_tiled_mma(
      cute::GMMA::ss_op_selector<Element, Element, float,
                                 cute::Shape<cute::Int<BLOCK_M>, cute::Int<HEAD_DIM_V / 2>, cute::Int<BLOCK_N>>,
                                 cute::GMMA::Major::K, cute::GMMA::Major::MN>()));

  struct SharedStorage {
    alignas(1024) Element kv[NUM_STAGES][BLOCK_N * HEAD_DIM];
    alignas(1024) Element aux[kAuxElems];
    float row_scale[NUM_STAGES][BLOCK_M];  // exp2(m_old - m_new) of the tile in stage s
    float row_inv_l[NUM_STAGES][BLOCK_M];  // 1 / l when the tile in stage s ends its piece
    detail::WsTileInfo info[NUM_STAGES];
    // TMA producer state, touched by thread 128 only: in smem so that it costs no registers in the
    // (register-bound) P V warpgroup.
    detail::WorkCursor prod;
    int prod_n;  // index of the next tile to issue
    alignas(8) uint64_t full[NUM_STAGES];     // TMA landed (tx-count barrier)
    uint64_t p_full[NUM_STAGES];               // WG0 wrote P / row_scale / info (4 warp arrivals)
    uint64_t pv_done[NUM_STAGES];              // WG1 + WG2 finished P V (8 warp arrivals)
  };
  // +1024: the kernel rounds the dynamic smem base up to the 1024 B swizzle period.
  static constexpr int kSmemBytes = int(sizeof(SharedStorage)) + 1024;
  static_assert(kSmemBytes <= 227 * 1024, "shared memory budget (reduce NUM_STAGES)");

  static constexpr unsigned kTileBytes = BLOCK_N * HEAD_DIM * sizeof(Element);
  static constexpr unsigned kPageBytes = kBoxRows * HEAD_DIM * sizeof(Element);
};

template <typename Cfg>
__device__ __forceinline__ void mla_splitkv_ws_body(const DecodeParams& p, const TmaDescriptor* tmap) {
  using namespace cute;
  using Element = typename Cfg::Element;
  using SS = typename Cfg::SharedStorage;
  constexpr int BM = Cfg::BLOCK_M, BN = Cfg::BLOCK_N, D = Cfg::HEAD_DIM, DV = Cfg::HEAD_DIM_V;
  constexpr int NS = Cfg::NUM_STAGES;
  constexpr int kBarWG0 = 1;  // named barrier among WG0's 128 threads (0 is __syncthreads')

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
    for (int s = 0; s < NS; ++s) {
      mbarrier_init(&ss.full[s], 1);
      mbarrier_init(&ss.p_full[s], 4);
      mbarrier_init(&ss.pv_done[s], 8);
    }
    fence_barrier_init();
  }
  if (is_producer) prefetch_tma_descriptor(tmap);
  __syncthreads();

  // No-op unless launched as a programmatic dependent of the metadata kernel.
  pdl_wait_primary();

  const int* meta = p.tile_scheduler_metadata + part * kMetaSize;
  const int* seqlens = p.cache_seqlens;

  // Accumulator-fragment geometry of a 64 x N wgmma (f32): element i of a thread lives at
  // row warp*16 + lane/4 + 8*((i/2)%2), column (i/4)*8 + (lane%4)*2 + i%2.
  const int row0 = warp_wg * 16 + lane / 4;  // local rows row0 and row0 + 8
  const int col_lane = (lane % 4) * 2;

  // ---------------- TMA producer (thread 128 only; state in smem) ----------------
  // Loads tile prod_n into stage prod_n % NS once every P V warp is done with tile prod_n - NS.
  auto issue_tile = [&]() {
    detail::WorkCursor& prod = ss.prod;
    const int n = ss.prod_n;
    const int stage = n % NS;
    const int* bt = p.block_table + (long long)prod.bi * p.block_table_stride;
    Element* dst = ss.kv[stage];
    // Block-table reads first: their latency overlaps the wait for the stage.
    if constexpr (Cfg::kPagesPerTile == 1) {
      const int page = prod.tok / Cfg::PAGE_SIZE;
      const int row = bt[page] * Cfg::PAGE_SIZE + (prod.tok % Cfg::PAGE_SIZE);
      if (n >= NS) mbarrier_wait(&ss.pv_done[stage], (n / NS - 1) & 1);
      mbarrier_arrive_expect_tx(&ss.full[stage], Cfg::kTileBytes);
#pragma unroll
      for (int c = 0; c < Cfg::kColChunks; ++c)
        tma_load_3d(dst + c * BN * Cfg::kBoxCols, tmap, &ss.full[stage], c * Cfg::kBoxCols, g, row);
    } else {
      // Several pages per tile: load only pages that hold tokens < L (later block_table
      // entries may be garbage, later pages NaN).
      const int valid = min(BN, prod.L - prod.tok);
      const int npages = (valid + Cfg::PAGE_SIZE - 1) / Cfg::PAGE_SIZE;
      const int page0 = prod.tok / Cfg::PAGE_SIZE;
      int rows[Cfg::kPagesPerTile];
#pragma unroll
      for (int j = 0; j < Cfg::kPagesPerTile; ++j) rows[j] = j < npages ? bt[page0 + j] * Cfg::PAGE_SIZE : 0;
      if (n >= NS) mbarrier_wait(&ss.pv_done[stage], (n / NS - 1) & 1);
      mbarrier_arrive_expect_tx(&ss.full[stage], npages * Cfg::kPageBytes);
#pragma unroll
      for (int j = 0; j < Cfg::kPagesPerTile; ++j) {
        if (j < npages) {
#pragma unroll
          for (int c = 0; c < Cfg::kColChunks; ++c)
            tma_load_3d(dst + c * BN * Cfg::kBoxCols + j * Cfg::kBoxRows * Cfg::kBoxCols, tmap, &ss.full[stage],
                        c * Cfg::kBoxCols, g, rows[j]);
        }
      }
    }
    ss.prod_n = n + 1;
    prod.template advance<BN>(seqlens);
  };
  if (is_producer) {
    ss.prod_n = 0;
    ss.prod.init(meta, seqlens);
    for (int s = 0; s < NS && ss.prod.valid(); ++s) issue_tile();
  }
  __syncwarp();  // reconverge warp 4 before any .aligned instruction

  if (wg == 0) {
    // =========================== WG0: S = Q K^T, softmax, P ===========================
    detail::setmaxnreg_inc<Cfg::kRegsS>();

    typename Cfg::TiledMmaSRs mma_rs;
    auto thr_rs = mma_rs.get_thread_slice(tid_wg);
    // Q[:, :DV] as the register A operand: (row, col) of every element from an identity tensor
    // partitioned like A; consecutive elements 2i, 2i+1 are columns c, c+1 of one row.
    Tensor cQ = make_identity_tensor(Shape<Int<BM>, Int<DV>>{});
    Tensor tScQ = thr_rs.partition_A(cQ);
    Tensor tSrQ = make_tensor<Element>(partition_shape_A(mma_rs, Shape<Int<BM>, Int<DV>>{}));
    Tensor tSrQ32 = recast<uint32_t>(tSrQ);
    static_assert(decltype(size(tSrQ32))::value == BM * DV / 2 / 128, "Q fragment");
    Tensor tSrS = partition_fragment_C(mma_rs, Shape<Int<BM>, Int<BN>>{});
    static_assert(decltype(size(tSrS))::value == BN / 2, "S fragment");

    detail::WorkCursor cur;
    cur.init(meta, seqlens);

    float m_run[2], l_run[2];  // running max (log2 units, scaled) and per-thread partial sum
    int lim[2];                // first masked token for each of this thread's rows
    int stage = 0;
    uint32_t phase = 0;
    bool piece_start = true;
    while (cur.valid()) {
      if (piece_start) {
        // Every warp's S of the previous piece has completed (wgmma wait) before anyone
        // rewrites Q's rope part in smem; Q's register part is thread-private.
        if constexpr (Cfg::kPInRope) named_barrier_sync(kBarWG0, 128);
        const Element* qb = reinterpret_cast<const Element*>(p.q) + (long long)cur.bi * p.q_stride_b;
        const Element* qrow[2];
        bool qok[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int r = m_block * BM + row0 + 8 * h;
          qok[h] = r < p.rows;  // padded rows are zero: no NaN from garbage
          const int s = r / p.q_per_kv;
          const int head = g * p.q_per_kv + (r - s * p.q_per_kv);
          qrow[h] = qok[h] ? qb + s * p.q_stride_s + head * p.q_stride_h : qb;
        }
#pragma unroll
        for (int i = 0; i < size(tSrQ32); ++i) {
          const auto rc = tScQ(2 * i);
          const int h = (get<0>(rc) - row0) >> 3;  // 0 or 1 (folds: the identity row is row0 + 8 * v1)
          uint32_t v = 0u;
          if (qok[h]) v = __ldg(reinterpret_cast<const uint32_t*>(qrow[h] + get<1>(rc)));
          tSrQ32(i) = v;
        }
        warpgroup_fence_operand(tSrQ32);
        if constexpr (Cfg::kPInRope) {
          Tensor sQr = make_tensor(make_smem_ptr(ss.aux), typename Cfg::SmemLayoutSlab{});
#pragma unroll
          for (int idx = tid_wg; idx < BM * 8; idx += 128) {
            const int lr = idx / 8, c = idx % 8;
            const int r = m_block * BM + lr;
            uint4 v = make_uint4(0u, 0u, 0u, 0u);
            if (r < p.rows) {
              const int s = r / p.q_per_kv;
              const int head = g * p.q_per_kv + (r - s * p.q_per_kv);
              v = __ldg(reinterpret_cast<const uint4*>(qb + s * p.q_stride_s + head * p.q_stride_h + DV + c * 8));
            }
            *reinterpret_cast<uint4*>(&sQr(lr, c * 8)) = v;
          }
          fence_proxy_async_shared();
          named_barrier_sync(kBarWG0, 128);
        }
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

      mbarrier_wait(&ss.full[stage], phase);
      Element* kv = ss.kv[stage];
      Tensor sK = make_tensor(make_smem_ptr(kv), typename Cfg::SmemLayoutK{});
      if (cur.tok + BN > cur.L) {
        // Tail tile: rows >= L were not loaded (other pages) or hold data past the sequence
        // end (possibly NaN). Zero them (all columns: WG1/WG2 read the V part) so that neither
        // S nor P V can pick up NaN.
        constexpr int kChunks = D / 8;
        const int v0 = cur.L - cur.tok;
        for (int idx = tid_wg; idx < (BN - v0) * kChunks; idx += 128) {
          const int lr = v0 + idx / kChunks, c = idx % kChunks;
          *reinterpret_cast<uint4*>(&sK(lr, c * 8)) = make_uint4(0u, 0u, 0u, 0u);
        }
        fence_proxy_async_shared();
        named_barrier_sync(kBarWG0, 128);
      }

      // ---- S = Q K^T: nope part RS (Q from registers), rope part SS ----
      Tensor tSrK = thr_rs.partition_fragment_B(sK);
      warpgroup_fence_operand(tSrQ32);
      warpgroup_fence_operand(tSrS);
      warpgroup_arrive();
      mma_rs.accumulate_ = GMMA::ScaleOut::Zero;
#pragma unroll
      for (int k = 0; k < size<2>(tSrQ); ++k) {
        gemm(mma_rs, tSrQ(_, _, k), tSrK(_, _, k), tSrS);
        mma_rs.accumulate_ = GMMA::ScaleOut::One;
      }
      if constexpr (Cfg::kPInRope) {
        typename Cfg::TiledMmaSSs mma_ss;
        auto thr_ss = mma_ss.get_thread_slice(tid_wg);
        Tensor sQr = make_tensor(make_smem_ptr(ss.aux), typename Cfg::SmemLayoutSlab{});
        Tensor sKr = make_tensor(make_smem_ptr(kv + DV * BN), typename Cfg::SmemLayoutSlab{});
        Tensor tSrQr = thr_ss.partition_fragment_A(sQr);
        Tensor tSrKr = thr_ss.partition_fragment_B(sKr);
        mma_ss.accumulate_ = GMMA::ScaleOut::One;
#pragma unroll
        for (int k = 0; k < size<2>(tSrQr); ++k) gemm(mma_ss, tSrQr(_, _, k), tSrKr(_, _, k), tSrS);
      }
      warpgroup_commit_batch();
      warpgroup_wait<0>();
      warpgroup_fence_operand(tSrS);
      warpgroup_fence_operand(tSrQ32);

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
      bool single = false;
      int slot = 0;
      if (last) {
        const int ns0 = p.num_splits[cur.bi];
        single = (p.num_splits[cur.bi + 1] - ns0) == 1;
        slot = ns0 + (cur.bi == cur.begin_b ? meta[kMetaBeginSplit] : 0);
      }

      // ---- hand P(n) to WG1/WG2 through stage s's slots ----
      Element* pbuf;
      if constexpr (Cfg::kPInRope) {
        pbuf = kv + DV * BN;  // the rope slab of this tile: free once every warp's S(n) is done
        named_barrier_sync(kBarWG0, 128);
      } else {
        pbuf = ss.aux + stage * (BM * BN);
      }
      Tensor sP = make_tensor(make_smem_ptr(pbuf), typename Cfg::SmemLayoutSlab{});
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
          ss.row_scale[stage][row0 + 8 * h] = sc[h];
          if (last) ss.row_inv_l[stage][row0 + 8 * h] = inv_l[h];
        }
      }
      if (tid_wg == 0) {
        detail::WsTileInfo info;
        info.last = last;
        info.bi = cur.bi;
        info.slot = slot;
        info.single = single;
        ss.info[stage] = info;
      }
      fence_proxy_async_shared();  // P and the zeroed tail rows are read by wgmma (async proxy)
      __syncwarp();
      if (lane == 0) mbarrier_arrive(&ss.p_full[stage]);

      if (last) {
        if ((lane & 3) == 0) {
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
        piece_start = true;
      }
      if (++stage == NS) {
        stage = 0;
        phase ^= 1u;
      }
      cur.template advance<BN>(seqlens);
    }
  } else {
    // ================ WG1 / WG2: O[:, half] += P V[:, half]; thread 128: TMA producer ================
    detail::setmaxnreg_dec<Cfg::kRegsPV>();
    const int half = wg - 1;

    // Tiles of this CTA (WG0 owns the walk; the P V warpgroups only need the count).
    int num_tiles = 0;
    {
      detail::WorkCursor c;
      c.init(meta, seqlens);
      while (c.valid()) {
        num_tiles += (c.stop - c.tok + BN - 1) / BN;
        c.seek(seqlens, c.bi + 1);
      }
    }

    typename Cfg::TiledMmaO mma_o;
    auto thr_o = mma_o.get_thread_slice(tid_wg);
    Tensor tOrO = partition_fragment_C(mma_o, Shape<Int<BM>, Int<DV / 2>>{});
#pragma unroll
    for (int i = 0; i < size(tOrO); ++i) tOrO(i) = 0.f;

    int stage = 0;
    uint32_t phase = 0;
    for (int n = 0; n < num_tiles; ++n) {
      mbarrier_wait(&ss.p_full[stage], phase);
      mbarrier_wait(&ss.full[stage], phase);  // complete already (WG0 waited it): TMA bytes visible
      const float sc0 = ss.row_scale[stage][row0], sc1 = ss.row_scale[stage][row0 + 8];
#pragma unroll
      for (int i = 0; i < size(tOrO); ++i) tOrO(i) *= ((i >> 1) & 1) ? sc1 : sc0;

      Element* kv = ss.kv[stage];
      Element* pbuf;
      if constexpr (Cfg::kPInRope) {
        pbuf = kv + DV * BN;
      } else {
        pbuf = ss.aux + stage * (BM * BN);
      }
      Tensor sP = make_tensor(make_smem_ptr(pbuf), typename Cfg::SmemLayoutSlab{});
      Tensor tOrP = thr_o.partition_fragment_A(sP);
      Tensor sVt = make_tensor(make_smem_ptr(kv + half * (DV / 2) * BN), typename Cfg::SmemLayoutVtHalf{});
      Tensor tOrV = thr_o.partition_fragment_B(sVt);
      warpgroup_fence_operand(tOrO);
      warpgroup_arrive();
      mma_o.accumulate_ = GMMA::ScaleOut::One;
#pragma unroll
      for (int k = 0; k < size<2>(tOrP); ++k) gemm(mma_o, tOrP(_, _, k), tOrV(_, _, k), tOrO);
      warpgroup_commit_batch();

      // While P V(n) runs: refill the stage of tile n-1 with tile n-1+NS (waits until WG2 is done
      // with tile n-1 as well).
      if (is_producer && n > 0 && ss.prod.valid()) issue_tile();
      __syncwarp();  // lane 0 of warp 4 may have diverged into the producer path

      warpgroup_wait<0>();
      warpgroup_fence_operand(tOrO);
      // Read the rest of stage s's slots before releasing the stage.
      const detail::WsTileInfo info = ss.info[stage];
      float il0 = 0.f, il1 = 0.f;
      if (info.last) {
        il0 = ss.row_inv_l[stage][row0];
        il1 = ss.row_inv_l[stage][row0 + 8];
      }
      __syncwarp();
      if (lane == 0) mbarrier_arrive(&ss.pv_done[stage]);

      if (info.last) {
        // This warpgroup's half of O for the finished piece (rows < p.rows only).
        const int col_base = half * (DV / 2) + col_lane;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int r = m_block * BM + row0 + 8 * h;
          if (r >= p.rows) continue;
          const float inv_l = h ? il1 : il0;
          if (info.single) {
            const int s = r / p.q_per_kv;
            const int head = g * p.q_per_kv + (r - s * p.q_per_kv);
            Element* o =
                reinterpret_cast<Element*>(p.out) + ((long long)(info.bi * p.s_q + s) * p.h_q + head) * DV + col_base;
#pragma unroll
            for (int j = 0; j < size(tOrO) / 4; ++j) {
              const int i = j * 4 + h * 2;
              *reinterpret_cast<unsigned*>(o + j * 8) =
                  ElemTraits<Element>::pack2(tOrO(i) * inv_l, tOrO(i + 1) * inv_l);
            }
          } else {
            float* o = p.o_accum + (((long long)info.slot * p.h_kv + g) * p.rows + r) * DV + col_base;
#pragma unroll
            for (int j = 0; j < size(tOrO) / 4; ++j) {
              const int i = j * 4 + h * 2;
              *reinterpret_cast<float2*>(o + j * 8) = make_float2(tOrO(i) * inv_l, tOrO(i + 1) * inv_l);
            }
          }
        }
#pragma unroll
        for (int i = 0; i < size(tOrO); ++i) tOrO(i) = 0.f;
      }
      if (++stage == NS) {
        stage = 0;
        phase ^= 1u;
      }
    }
  }
  pdl_launch_dependents();
}

}  // namespace decode
}  // namespace mla_jit
