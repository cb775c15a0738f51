// mla_jit prefill: varlen attention forward for sm_90a with q/k head dim D_QK and v head dim D_V
// (DeepSeek's MHA-mode prefill: 192 / 128), causal aligned bottom-right, natural-log LSE.
//
// Persistent: grid (min(tiles, SMs)), block 128 * (1 + BLOCK_M / 64) threads, 1 CTA / SM. The
// b * num_m_blocks * h tiles (batch-major, then the order of prefill/common.cuh) are handed out
// dynamically: CTA c starts with tile c, its producer thread takes the next one from
// tile_counter (atomicAdd) while the current one loads, and passes it to the consumers through a
// two-slot mailbox in shared memory. So a CTA loads the next tile's Q and first K / V tiles while
// its consumers finish the current one (last P V, epilogue), and long and short (causal) tiles
// spread over the SMs as they finish. The last CTA to finish zeroes the counter again.
//
// Roles (warp specialization): warp 0 of WG0 is the TMA producer (registers dropped to
// kRegsProducer); WG1 .. WG(BLOCK_M / 64) are consumers, each owning 64 query rows: S (64 x
// BLOCK_N fp32) and O (64 x D_V fp32) live in its registers, P is converted in registers and fed
// to the P V wgmma from registers (RS), so P never touches shared memory.
//
// Per consumer warpgroup, KV tiles walked from the last (the only ones that need the causal or
// sequence-end mask come first) to the first (FlashAttention-3's intra-warpgroup overlap):
//   tile 0:      S = Q K^T -> mask -> softmax -> P
//   tile i > 0:  issue S_i = Q K_i^T; issue O += P_{i-1} V_{i-1}; wait S_i; release K_i;
//                softmax of S_i (overlaps the P V wgmma); wait P V; release V_{i-1}; rescale O;
//                P_i = S_i as Element
//   after:       O += P_last V_last; O /= l; lse; O from registers to out (store_output).
// The row maximum moves lazily (kLazyRescaleLog2): O is rescaled only when some row of the warp
// gained more than 2^8, which after the first tiles is almost never.
//
// Synchronization (mbarriers; KV stage s = i % NUM_STAGES, phase (i / NUM_STAGES) & 1, i counting
// the CTA's KV tiles over all its tiles; Q phase = the CTA's tile count & 1):
//   q_full[w]     count 1 + tx: the producer's expect_tx, then consumer warpgroup w's Q boxes land.
//   q_empty[w]    count 1: warpgroup w's last S wgmma of a tile retired (Q may be overwritten).
//   tile_full[m]  count 1: the producer wrote the tile index into mailbox slot m.
//   tile_empty[m] count 128 * kWgMma: every consumer thread read it.
//   k_full[s]     count 1 + tx; k_empty[s] count kWgMma: one thread per consumer warpgroup
//                 after its S wgmma retired (wgmma.wait), so the producer may overwrite K.
//   v_full[s], v_empty[s]: the same for V (released after the P V wgmma retired).
// Rows past a sequence's end: K rows give S columns that the mask sets to -inf by a select (NaN
// never survives); V rows are zeroed in shared memory before their P V when the tile crosses the
// end (P = 0 there, but 0 * NaN is NaN, and past cu_seqlens_k[-1] the tensor may hold anything).
// Q rows past the end compute garbage rows that are never stored.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/numeric_types.h>

#include "mla_jit/common/sm90.cuh"
#include "mla_jit/common/sm90_fragment.cuh"
#include "common.cuh"

namespace mla_jit {
namespace prefill {

template <typename Element_, int D_QK_, int D_V_, int BLOCK_M_, int BLOCK_N_, int NUM_STAGES_, bool CAUSAL_>
struct PrefillSm90Config {
  using Element = Element_;
  static constexpr int D_QK = D_QK_, D_V = D_V_, BLOCK_M = BLOCK_M_, BLOCK_N = BLOCK_N_;
  static constexpr int NUM_STAGES = NUM_STAGES_;
  static constexpr bool CAUSAL = CAUSAL_;
  static constexpr int kWgMma = BLOCK_M / 64;
  static constexpr int NUM_THREADS = 128 * (1 + kWgMma);

  static_assert(BLOCK_M == 128, "two consumer warpgroups of 64 rows (the register split assumes it)");
  static_assert(BLOCK_N % 64 == 0 && BLOCK_N <= 256, "BLOCK_N: a multiple of 64 up to 256 (one wgmma N)");
  static_assert(D_QK % 64 == 0 && D_V % 64 == 0 && D_V <= 256, "head dims: multiples of 64 (one SW128 slab)");
  static_assert(cute::is_same_v<Element, cutlass::bfloat16_t> || cute::is_same_v<Element, cutlass::half_t>,
                "bf16 or fp16");

  // K-major tiles with the 128B swizzle, 64-column slabs of (rows x 128 B): what one TMA box of
  // {64 columns, 1 head, rows} writes.
  using SwAtom = decltype(cute::GMMA::Layout_K_SW128_Atom<Element>{});
  using SmemLayoutQ = decltype(cute::tile_to_shape(SwAtom{}, cute::Shape<cute::_64, cute::Int<D_QK>>{}));
  using SmemLayoutK = decltype(cute::tile_to_shape(SwAtom{}, cute::Shape<cute::Int<BLOCK_N>, cute::Int<D_QK>>{}));
  using SmemLayoutV = decltype(cute::tile_to_shape(SwAtom{}, cute::Shape<cute::Int<BLOCK_N>, cute::Int<D_V>>{}));
  // V as the (D_V, tokens) B operand of P V: an MN-major view of the same bytes.
  using SmemLayoutVt = decltype(cute::composition(
      SmemLayoutV{}, cute::make_layout(cute::Shape<cute::Int<D_V>, cute::Int<BLOCK_N>>{}, cute::GenRowMajor{})));

  using TiledMmaS = decltype(cute::make_tiled_mma(
      cute::GMMA::ss_op_selector<Element, Element, float,
                                 cute::Shape<cute::_64, cute::Int<BLOCK_N>, cute::Int<D_QK>>>()));
  using TiledMmaO = decltype(cute::make_tiled_mma(
      cute::GMMA::rs_op_selector<Element, Element, float, cute::Shape<cute::_64, cute::Int<D_V>, cute::Int<BLOCK_N>>,
                                 cute::GMMA::Major::K, cute::GMMA::Major::MN>()));

  struct SharedStorage {
    alignas(1024) Element q[kWgMma][64 * D_QK];
    alignas(1024) Element k[NUM_STAGES][BLOCK_N * D_QK];
    alignas(1024) Element v[NUM_STAGES][BLOCK_N * D_V];
    alignas(8) uint64_t q_full[kWgMma], q_empty[kWgMma];
    uint64_t k_full[NUM_STAGES], k_empty[NUM_STAGES], v_full[NUM_STAGES], v_empty[NUM_STAGES];
    uint64_t tile_full[2], tile_empty[2];
    int tile[2];   // the mailbox: tile index (>= the tile count: no more work)
  };
  static constexpr int kSmemBytes = Sm90SmemSize<SharedStorage>::kBytes;

  // setmaxnreg: 128 x (24 + 2 x 240) = 64512 <= 65536 (__launch_bounds__(384, 1) allocates 168 each).
  static constexpr int kRegsProducer = 24;
  static constexpr int kRegsMma = 240;
  static constexpr unsigned kQBytesWg = 64 * D_QK * sizeof(Element);   // one consumer warpgroup's Q
  static constexpr unsigned kKBytes = BLOCK_N * D_QK * sizeof(Element);
  static constexpr unsigned kVBytes = BLOCK_N * D_V * sizeof(Element);
};

namespace detail {

// Named barriers (0 is __syncthreads'): consumer warpgroup w uses 1 + w (its 128 threads).
constexpr int kBarConsumerBase = 1;

// ---- Producer (one thread) ----

// Tile t of the b * num_m_blocks * h (batch-major).
template <typename Cfg>
__device__ __forceinline__ TileWork tile_of(const PrefillParams& p, int t) {
  const int per_batch = p.num_m_blocks * p.h, bi = t / per_batch;
  return tile_work<Cfg>(p, t - bi * per_batch, bi);
}

template <typename Cfg>
__device__ __forceinline__ void producer(typename Cfg::SharedStorage& ss, const PrefillParams& p,
                                         const TmaDescriptor* q_desc, const TmaDescriptor* k_desc,
                                         const TmaDescriptor* v_desc) {
  constexpr int BN = Cfg::BLOCK_N, NS = Cfg::NUM_STAGES;
  const uint64_t q_policy = l2_evict_first_policy();   // each Q tile is read by one CTA
  const uint64_t kv_policy = l2_evict_last_policy();   // K / V tiles are read by every row tile of a head
  const int total = p.b * p.num_m_blocks * p.h;
  uint32_t q_iter = 0, kv_iter = 0;
  int t = blockIdx.x;
#pragma unroll 1
  for (uint32_t k = 0;; ++k) {
    const int slot = k & 1;
    mbarrier_wait(&ss.tile_empty[slot], ((k >> 1) & 1) ^ 1);
    ss.tile[slot] = t;
    mbarrier_arrive(&ss.tile_full[slot]);   // (release: the consumers see the index)
    if (t >= total) break;
    const int t_next = int(gridDim.x) + atomicAdd(p.tile_counter, 1);   // lands while this tile loads
    const TileWork w = tile_of<Cfg>(p, t);
    t = t_next;
    if (w.m_block * Cfg::BLOCK_M >= w.len_q) continue;   // no rows (the consumers skip it too)
    const int kv_head = w.head / p.q_per_kv;
#pragma unroll
    for (int wg = 0; wg < Cfg::kWgMma; ++wg) {
      mbarrier_wait(&ss.q_empty[wg], (q_iter & 1) ^ 1);   // a fresh barrier counts as freed
      mbarrier_arrive_expect_tx(&ss.q_full[wg], Cfg::kQBytesWg);
#pragma unroll
      for (int c = 0; c < Cfg::D_QK / 64; ++c) {
        tma_load_3d_hint(ss.q[wg] + c * 64 * 64, q_desc, &ss.q_full[wg], c * 64, w.head,
                         w.q0 + w.m_block * Cfg::BLOCK_M + wg * 64, q_policy);
      }
    }
    ++q_iter;
#pragma unroll 1
    for (int i = 0; i < w.n_tiles; ++i, ++kv_iter) {
      const int n = w.n_tiles - 1 - i, s = kv_iter % NS;
      const uint32_t free_phase = ((kv_iter / NS) & 1) ^ 1;
      const int tok = w.k0 + n * BN;
      mbarrier_wait(&ss.k_empty[s], free_phase);
      mbarrier_arrive_expect_tx(&ss.k_full[s], Cfg::kKBytes);
#pragma unroll
      for (int c = 0; c < Cfg::D_QK / 64; ++c) {
        tma_load_3d_hint(ss.k[s] + c * BN * 64, k_desc, &ss.k_full[s], c * 64, kv_head, tok, kv_policy);
      }
      mbarrier_wait(&ss.v_empty[s], free_phase);
      mbarrier_arrive_expect_tx(&ss.v_full[s], Cfg::kVBytes);
#pragma unroll
      for (int c = 0; c < Cfg::D_V / 64; ++c) {
        tma_load_3d_hint(ss.v[s] + c * BN * 64, v_desc, &ss.v_full[s], c * 64, kv_head, tok, kv_policy);
      }
    }
  }
  // Every CTA took its last index (one past the end) before counting itself done: the last one
  // leaves the counter zero for the next launch.
  if (atomicAdd(p.tile_counter + 1, 1) == int(gridDim.x) - 1) {
    atomicExch(p.tile_counter, 0);
    atomicExch(p.tile_counter + 1, 0);
  }
}

// ---- Consumer warpgroups ----

// Per-thread softmax state of the two rows it holds (row0 and row0 + 8 of its warpgroup's 64).
struct RowState {
  float m[2];   // reference maximum, log2 units (S * scale_log2); -inf until a row sees a key
  float l[2];   // this thread's part of the row sum of P (reduced over the quad at the end)
};

// S = Q K_s^T for this warpgroup's 64 rows; issued and committed, not waited for.
template <typename Cfg, typename FragS>
__device__ __forceinline__ void issue_s(typename Cfg::SharedStorage& ss, int wg, int stage, int tw, FragS& tSrS) {
  using namespace cute;
  typename Cfg::TiledMmaS mma;
  auto thr = mma.get_thread_slice(tw);
  Tensor sQ = make_tensor(make_smem_ptr(ss.q[wg]), typename Cfg::SmemLayoutQ{});
  Tensor sK = make_tensor(make_smem_ptr(ss.k[stage]), typename Cfg::SmemLayoutK{});
  Tensor tSrQ = thr.partition_fragment_A(sQ);
  Tensor tSrK = thr.partition_fragment_B(sK);
  warpgroup_fence_operand(tSrS);
  warpgroup_arrive();
  mma.accumulate_ = GMMA::ScaleOut::Zero;
#pragma unroll
  for (int k = 0; k < size<2>(tSrQ); ++k) {
    gemm(mma, tSrQ(_, _, k), tSrK(_, _, k), tSrS);
    mma.accumulate_ = GMMA::ScaleOut::One;
  }
  warpgroup_commit_batch();
  warpgroup_fence_operand(tSrS);
}

// O (+)= P V_s (P from registers); issued and committed, not waited for. fresh: O = P V.
template <typename Cfg, typename FragP, typename FragO>
__device__ __forceinline__ void issue_pv(typename Cfg::SharedStorage& ss, int stage, int tw, FragP& tOrP, FragO& tOrO,
                                         bool fresh) {
  using namespace cute;
  typename Cfg::TiledMmaO mma;
  auto thr = mma.get_thread_slice(tw);
  Tensor sVt = make_tensor(make_smem_ptr(ss.v[stage]), typename Cfg::SmemLayoutVt{});
  Tensor tOrV = thr.partition_fragment_B(sVt);
  warpgroup_fence_operand(tOrO);
  warpgroup_fence_operand(tOrP);
  warpgroup_arrive();
  mma.accumulate_ = fresh ? GMMA::ScaleOut::Zero : GMMA::ScaleOut::One;
#pragma unroll
  for (int k = 0; k < size<2>(tOrP); ++k) {
    gemm(mma, tOrP(_, _, k), tOrV(_, _, k), tOrO);
    mma.accumulate_ = GMMA::ScaleOut::One;
  }
  warpgroup_commit_batch();
  warpgroup_fence_operand(tOrO);
}

// Online softmax of one S tile in place (S becomes P, unnormalized): returns per row h the
// factor by which O must be scaled (1 when the reference maximum did not move).
template <typename FragS>
__device__ __forceinline__ void softmax_tile(FragS& s, RowState& st, float scale_log2, float (&rescale)[2]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float mx = row_max(s, h) * scale_log2;   // -inf when the row sees no key of the tile
    // Lazy rescaling: the reference moves only when the tile's max exceeds it by more than
    // kLazyRescaleLog2, so P <= 2^8 and most tiles leave O alone.
    const bool move = mx > st.m[h] + kLazyRescaleLog2;
    const float m_new = move ? mx : st.m[h];
    // A row that has seen no key yet keeps m = -inf; its P is exp2(-inf - 0) = 0.
    const float m_use = m_new == -kInf ? 0.f : m_new;
    rescale[h] = move ? ex2_approx(st.m[h] - m_use) : 1.f;   // m = -inf before: 0 (O is still 0)
    st.m[h] = m_new;
    st.l[h] = st.l[h] * rescale[h] + exp2_row(s, h, scale_log2, m_use);
  }
}

// O rows times their factors; skipped by a warp whose rows all kept their maximum.
template <typename FragO>
__device__ __forceinline__ void rescale_o(FragO& o, const float (&rescale)[2]) {
  if (__any_sync(0xffffffffu, rescale[0] != 1.f || rescale[1] != 1.f)) {
    scale_row(o, 0, rescale[0]);
    scale_row(o, 1, rescale[1]);
  }
}

// P (fp32 accumulator of S) into the A-operand registers of the P V wgmma. For 16-bit types the
// m64nNk16 accumulator and the m64nNk16 A fragment order their values alike (pairs of columns,
// then the row half, then 8-column groups; two groups form one k16 block), so the copy is flat.
template <typename Element, typename FragS, typename FragP>
__device__ __forceinline__ void convert_p(const FragS& s, FragP& p) {
  static_assert(decltype(cute::size(s))::value == decltype(cute::size(p))::value, "P fragment");
  uint32_t* packed = reinterpret_cast<uint32_t*>(p.data());
#pragma unroll
  for (int i = 0; i < cute::size(s) / 2; ++i) packed[i] = ElemTraits<Element>::pack2(s(2 * i), s(2 * i + 1));
}

// Rows of V at or past the sequence end (local row v0 of the tile) set to zero before a P V
// reads them. Both consumer warpgroups write the same zeros; each fences and syncs its own
// 128 threads before its wgmma.
template <typename Cfg>
__device__ __forceinline__ void zero_v_tail(typename Cfg::SharedStorage& ss, int stage, int v0, int tw, int wg) {
  zero_rows_from<Cfg::BLOCK_N, Cfg::D_V>(smem_addr(ss.v[stage]), v0, tw);
  fence_proxy_async_shared();
  named_barrier_sync(kBarConsumerBase + wg, 128);
}

// O / l as Element straight from registers to out (each thread: 4 bytes per 8-column group of its
// two rows; shared memory stays free for the next tile's Q), and the natural-log LSE (+inf for a
// row that saw no key; its O is 0).
template <typename Cfg, typename FragO>
__device__ __forceinline__ void store_output(const PrefillParams& p, const TileWork& w, int wg, int tw, FragO& o,
                                             const RowState& st, bool any_tile) {
  using Element = typename Cfg::Element;
  const int row0 = 16 * (tw / 32) + (tw % 32) / 4;
  const int tile_row0 = w.m_block * Cfg::BLOCK_M + wg * 64;   // row of the sequence at local row 0
  Element* out = static_cast<Element*>(p.out);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float l = st.l[h];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    const bool seen = any_tile && l > 0.f;
    const float inv_l = rcp_approx(l);
    const int r = tile_row0 + row0 + 8 * h;
    if (r >= w.len_q || unsigned(w.q0 + r) >= unsigned(p.total_q)) continue;
    if (p.lse != nullptr && tw % 4 == 0) {
      const float lse2 = st.m[h] + lg2_approx(l);
      p.lse[(long long)w.head * p.total_q + w.q0 + r] = seen ? lse2 * 0.69314718055994530942f : kInf;
    }
    Element* row = out + (long long)(w.q0 + r) * p.o_stride_t + (long long)w.head * p.o_stride_h + 2 * (tw % 4);
#pragma unroll
    for (int j = 0; j < cute::size(o) / 4; ++j) {   // selects: O is garbage when no tile ran
      const float a = seen ? o(j * 4 + h * 2) * inv_l : 0.f, b = seen ? o(j * 4 + h * 2 + 1) * inv_l : 0.f;
      *reinterpret_cast<uint32_t*>(row + j * 8) = ElemTraits<Element>::pack2(a, b);
    }
  }
}

// One tile of consumer warpgroup wg. kv_iter: the CTA's KV tiles before this one (stage and phase
// of its first); q_phase: the parity of the CTA's tiles before this one.
template <typename Cfg>
__device__ __forceinline__ void consumer_tile(typename Cfg::SharedStorage& ss, const PrefillParams& p,
                                              const TileWork& w, int wg, uint32_t kv_iter, uint32_t q_phase) {
  using namespace cute;
  using Element = typename Cfg::Element;
  constexpr int BN = Cfg::BLOCK_N, NS = Cfg::NUM_STAGES;
  const int tw = threadIdx.x % 128;
  typename Cfg::TiledMmaS mma_s;
  typename Cfg::TiledMmaO mma_o;
  Tensor tSrS = partition_fragment_C(mma_s, Shape<_64, Int<BN>>{});
  Tensor tOrO = partition_fragment_C(mma_o, Shape<_64, Int<Cfg::D_V>>{});
  Tensor tOrP = make_tensor<Element>(partition_shape_A(mma_o, Shape<_64, Int<BN>>{}));

  // Visible-key limits of this thread's two rows (bottom-right causal), and its column lane.
  const int row0 = 16 * (tw / 32) + (tw % 32) / 4;
  const int col_lane = 2 * (tw % 4);
  int lim[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = w.m_block * Cfg::BLOCK_M + wg * 64 + row0 + 8 * h;
    lim[h] = Cfg::CAUSAL ? min(w.len_k, w.len_k - w.len_q + r + 1) : w.len_k;
  }
  // The tile crossing the sequence end (the first one walked) gets its V tail zeroed.
  const int tail_rows = w.len_k - (w.n_tiles - 1) * BN;   // valid rows of tile n_tiles - 1
  RowState st{{-kInf, -kInf}, {0.f, 0.f}};
  float rescale[2];
  auto stage = [&](int i) { return int((kv_iter + i) % NS); };
  auto phase = [&](int i) { return uint32_t(((kv_iter + i) / NS) & 1); };

  mbarrier_wait(&ss.q_full[wg], q_phase);
  if (w.n_tiles > 0) {
    // Tile n_tiles - 1 (i = 0).
    mbarrier_wait(&ss.k_full[stage(0)], phase(0));
    issue_s<Cfg>(ss, wg, stage(0), tw, tSrS);
    warpgroup_wait<0>();
    if (tw == 0) {
      mbarrier_arrive(&ss.k_empty[stage(0)]);
      if (w.n_tiles == 1) mbarrier_arrive(&ss.q_empty[wg]);
    }
    mask_invisible(tSrS, (w.n_tiles - 1) * BN, col_lane, lim);
    softmax_tile(tSrS, st, p.scale_log2, rescale);
    convert_p<Element>(tSrS, tOrP);
#pragma unroll 1
    for (int i = 1; i < w.n_tiles; ++i) {
      const int n = w.n_tiles - 1 - i, s = stage(i), sp = stage(i - 1);
      mbarrier_wait(&ss.k_full[s], phase(i));
      issue_s<Cfg>(ss, wg, s, tw, tSrS);
      mbarrier_wait(&ss.v_full[sp], phase(i - 1));
      if (i == 1 && tail_rows < BN) zero_v_tail<Cfg>(ss, sp, tail_rows, tw, wg);
      issue_pv<Cfg>(ss, sp, tw, tOrP, tOrO, i == 1);
      warpgroup_wait<1>();   // S_i retired (groups retire in order)
      if (tw == 0) {
        mbarrier_arrive(&ss.k_empty[s]);
        if (i == w.n_tiles - 1) mbarrier_arrive(&ss.q_empty[wg]);   // the tile's last S: Q is free
      }
      if (n >= w.mask_from) mask_invisible(tSrS, n * BN, col_lane, lim);
      softmax_tile(tSrS, st, p.scale_log2, rescale);
      warpgroup_wait<0>();   // P V of tile i - 1 retired: P's registers and V_{i-1} are free
      if (tw == 0) mbarrier_arrive(&ss.v_empty[sp]);
      rescale_o(tOrO, rescale);
      convert_p<Element>(tSrS, tOrP);
    }
    const int i = w.n_tiles - 1, s = stage(i);
    mbarrier_wait(&ss.v_full[s], phase(i));
    if (i == 0 && tail_rows < BN) zero_v_tail<Cfg>(ss, s, tail_rows, tw, wg);
    issue_pv<Cfg>(ss, s, tw, tOrP, tOrO, i == 0);
    warpgroup_wait<0>();
    if (tw == 0) mbarrier_arrive(&ss.v_empty[s]);
  } else if (tw == 0) {
    mbarrier_arrive(&ss.q_empty[wg]);   // no key: Q unused
  }
  store_output<Cfg>(p, w, wg, tw, tOrO, st, w.n_tiles > 0);
}

template <typename Cfg>
__device__ __forceinline__ void consumer(typename Cfg::SharedStorage& ss, const PrefillParams& p, int wg) {
  const int total = p.b * p.num_m_blocks * p.h;
  uint32_t q_iter = 0, kv_iter = 0;
#pragma unroll 1
  for (uint32_t k = 0;; ++k) {
    const int slot = k & 1;
    mbarrier_wait(&ss.tile_full[slot], (k >> 1) & 1);
    const int t = ss.tile[slot];
    mbarrier_arrive(&ss.tile_empty[slot]);
    if (t >= total) break;
    const TileWork w = tile_of<Cfg>(p, t);
    if (w.m_block * Cfg::BLOCK_M >= w.len_q) continue;
    consumer_tile<Cfg>(ss, p, w, wg, kv_iter, q_iter & 1);
    kv_iter += w.n_tiles;
    ++q_iter;
  }
}

}  // namespace detail

template <typename Cfg>
__device__ __forceinline__ void prefill_fwd_body(const PrefillParams& p, const TmaDescriptor* q_desc,
                                                 const TmaDescriptor* k_desc, const TmaDescriptor* v_desc) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  using SS = typename Cfg::SharedStorage;
  SS& ss = aligned_shared_storage<SS>(smem_raw);
  const int warp = __shfl_sync(0xffffffffu, int(threadIdx.x) / 32, 0);
  if (threadIdx.x == 0) {
    prefetch_tma_descriptor(q_desc);
    prefetch_tma_descriptor(k_desc);
    prefetch_tma_descriptor(v_desc);
#pragma unroll
    for (int wg = 0; wg < Cfg::kWgMma; ++wg) {
      mbarrier_init(&ss.q_full[wg], 1);
      mbarrier_init(&ss.q_empty[wg], 1);
    }
#pragma unroll
    for (int m = 0; m < 2; ++m) {
      mbarrier_init(&ss.tile_full[m], 1);
      mbarrier_init(&ss.tile_empty[m], 128 * Cfg::kWgMma);
    }
#pragma unroll
    for (int s = 0; s < Cfg::NUM_STAGES; ++s) {
      mbarrier_init(&ss.k_full[s], 1);
      mbarrier_init(&ss.v_full[s], 1);
      mbarrier_init(&ss.k_empty[s], Cfg::kWgMma);
      mbarrier_init(&ss.v_empty[s], Cfg::kWgMma);
    }
    fence_barrier_init();
  }
  __syncthreads();
  if (warp < 4) {
    setmaxnreg_dec<Cfg::kRegsProducer>();
    if (warp == 0 && cute::elect_one_sync()) detail::producer<Cfg>(ss, p, q_desc, k_desc, v_desc);
  } else {
    setmaxnreg_inc<Cfg::kRegsMma>();
    detail::consumer<Cfg>(ss, p, warp / 4 - 1);
  }
}

}  // namespace prefill
}  // namespace mla_jit
