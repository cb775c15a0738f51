// mla_jit indexer, sm_90a: fp8_mqa_logits (DeepGEMM's API), keys ragged per query row:
//   logits[i, j] = sum_h relu(q[i, h] . k[j]) * weights[i, h] * k_scale[j]   for j in [ks[i], ke[i]).
//
// Work units: a q block (UNIT_Q = 256 / H query rows: two halves of BLOCK_Q = 128 / H rows, so
// each math warpgroup's wgmma N is BLOCK_Q * H = 128, plus 4 BLOCK_Q columns of q' terms with
// LINEAR: linear_terms.cuh) times a chunk of chunk_keys keys; unit u =
// q block u / num_chunks, chunk u % num_chunks, dealt to the persistent CTAs (grid <= SMs) in
// snake order (work.cuh: cta_unit). A unit visits the 64-key tiles of its chunk that some row of
// its q block sees ([min ks, max ke) of the block, from a 64-aligned start).
//
// Roles (384 threads):
//   warp 0 (producer): TMA of each unit's Q (two 128 x D e4m3 halves) and weights, then its K
//     tiles (64 x D e4m3) and k_scale into a NUM_STAGES ring; the warp reads the rows' ranges.
//   warps 1-3 (cleaners, clean_logits in the full form): -inf into the columns of each unit's
//     chunk (< n) outside its tiles. The math warpgroups write every column of the tiles
//     (-inf where the row does not see the key), so the two never write the same column and need
//     no synchronization.
//   warpgroups 1, 2 (math): warpgroup w scores its half of the q block's rows against every tile
//     (both read each K tile: half the K traffic of one q half per CTA). Each keeps two
//     accumulators: the wgmma of its next tile runs while the epilogue of the current one (relu,
//     head weights, sum over heads, k_scale; indexer/common.cuh) runs on the CUDA cores. With
//     LINEAR each builds its tile's q' rows at the unit's start (a few hundred instructions a
//     thread; built during the previous unit's last wgmmas instead, it measured no faster).
//
// Barriers (stage s of the CTA's g-th tile: g % NUM_STAGES, phase (g / NUM_STAGES) & 1):
//   q_full[x] (1 + tx) / q_empty[x] (2: one thread of each math warpgroup) for the unit's Q slot
//   x = (CTA's non-empty unit count) & 1; k_full[s] (1 + tx) / k_empty[s] (8: each math warp,
//   after its scales are read and its wgmma retired).
// Rows past m read zero Q (TMA fills) and are stored into the row padding of the buffer (the op
// allocates align(m, UNIT_Q) rows); keys past n read zero K and scale.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/numeric_types.h>

#include "mla_jit/common/sm90.cuh"
#include "mla_jit/common/sm90_fragment.cuh"
#include "common.cuh"
#include "linear_terms.cuh"
#include "work.cuh"

namespace mla_jit {
namespace indexer {

template <int D>
struct Fp8SwizzleAtom;
template <>
struct Fp8SwizzleAtom<128> {
  using type = decltype(cute::GMMA::Layout_K_SW128_Atom<cutlass::float_e4m3_t>{});
};
template <>
struct Fp8SwizzleAtom<64> {
  using type = decltype(cute::GMMA::Layout_K_SW64_Atom<cutlass::float_e4m3_t>{});
};

// Shared by both indexer kernels: the score tile S = K Q^T of 64 keys and N (token, head) columns.
template <int D_, int N_>
struct ScoreMma {
  static constexpr int D = D_, N = N_;
  using Fp8 = cutlass::float_e4m3_t;
  using SwAtom = typename Fp8SwizzleAtom<D>::type;
  using SmemLayoutK = decltype(cute::tile_to_shape(SwAtom{}, cute::Shape<cute::Int<kTileKeys>, cute::Int<D>>{}));
  using SmemLayoutQ = decltype(cute::tile_to_shape(SwAtom{}, cute::Shape<cute::Int<N>, cute::Int<D>>{}));
  using TiledMma = decltype(cute::make_tiled_mma(
      cute::GMMA::ss_op_selector<Fp8, Fp8, float, cute::Shape<cute::Int<kTileKeys>, cute::Int<N>, cute::Int<D>>>()));

  // A warpgroup's wgmma descriptor fragments of a K tile / a Q tile in shared memory. A K tile
  // kStageDesc descriptor units (16 bytes) further is k_frag advanced by that much (k_stage): the
  // kernels build their ring's fragment once instead of per tile.
  static constexpr uint32_t kStageDesc = kTileKeys * D / 16;
  static __device__ __forceinline__ auto k_frag(const Fp8* k_tile, int tw) {
    using namespace cute;
    return TiledMma{}.get_thread_slice(tw).partition_fragment_A(make_tensor(make_smem_ptr(k_tile), SmemLayoutK{}));
  }
  static __device__ __forceinline__ auto q_frag(const Fp8* q_tile, int tw) {
    using namespace cute;
    return TiledMma{}.get_thread_slice(tw).partition_fragment_B(make_tensor(make_smem_ptr(q_tile), SmemLayoutQ{}));
  }
  template <typename FragK>
  static __device__ __forceinline__ auto k_stage(const FragK& k0, int stage) {
    return cute::make_tensor(k0.data() + uint32_t(stage) * kStageDesc, k0.layout());
  }

  template <typename FragK, typename FragQ, typename Frag>
  static __device__ __forceinline__ void issue(const FragK& tK, const FragQ& tQ, Frag& acc) {
    using namespace cute;
    TiledMma mma;
    warpgroup_fence_operand(acc);
    warpgroup_arrive();
    mma.accumulate_ = GMMA::ScaleOut::Zero;
#pragma unroll
    for (int k = 0; k < size<2>(tK); ++k) {
      gemm(mma, tK(_, _, k), tQ(_, _, k), acc);
      mma.accumulate_ = GMMA::ScaleOut::One;
    }
    warpgroup_commit_batch();
    warpgroup_fence_operand(acc);
  }

  template <typename Frag>
  static __device__ __forceinline__ void issue(const Fp8* k_tile, const Fp8* q_tile, int tw, Frag& acc) {
    issue(k_frag(k_tile, tw), q_frag(q_tile, tw), acc);
  }

  static __device__ __forceinline__ auto make_acc() {
    TiledMma mma;
    return cute::partition_fragment_C(mma, cute::Shape<cute::Int<kTileKeys>, cute::Int<N>>{});
  }
};

// LINEAR: relu's linear half on the tensor cores (linear_terms.cuh): each math warpgroup's Q tile
// gets 4 BLOCK_Q rows of q' terms after its N head rows, and the wgmma N grows by as much.
template <int H_, int D_, int NUM_STAGES_, bool LINEAR_>
struct LogitsSm90Config {
  static constexpr int H = H_, D = D_, NUM_STAGES = NUM_STAGES_;
  static constexpr bool LINEAR = LINEAR_;
  static constexpr int N = 128;              // BLOCK_Q tokens x H heads
  static constexpr int BLOCK_Q = N / H;      // rows of one math warpgroup
  static constexpr int UNIT_Q = 2 * BLOCK_Q;  // rows of a work unit
  static constexpr int NUM_THREADS = 384;
  static_assert(H == 8 || H == 16 || H == 32 || H == 64, "heads: 8, 16, 32 or 64");
  static_assert(D == 64 || D == 128, "head dim: 64 or 128");
  using Lin = LinearTerms<H, D, BLOCK_Q>;
  static constexpr int kLinCols = LINEAR ? Lin::kCols : 0;
  static constexpr int NT = N + kLinCols;    // wgmma N
  static_assert(NT <= 256, "one wgmma N");
  static constexpr int kQTile = (NT * D + 1023) / 1024 * 1024;   // each tile 1024-byte aligned (swizzle)
  using Mma = ScoreMma<D, NT>;
  using Fp8 = typename Mma::Fp8;
  using Sum = HeadSum<N, H, kLinCols>;

  struct SharedStorage {
    alignas(1024) Fp8 q[2][2][kQTile];    // [slot][math warpgroup]: N head rows (TMA), kLinCols q' rows
    alignas(1024) Fp8 k[NUM_STAGES][kTileKeys * D];
    // (TMA destinations: 128-byte aligned, each slot a multiple of 128 bytes)
    alignas(128) float scale[NUM_STAGES][kTileKeys];
    alignas(128) float weights[2][2 * N];
    int ks[2][UNIT_Q], ke[2][UNIT_Q];    // the unit's rows' key ranges (written by the producer)
    float lin_scale[2][2][LINEAR ? Lin::kCols : 1];   // [slot][math warpgroup]: s_j / 2 of column 4 t + j
    float lin_red[2][4 * Lin::kPairsPerThread];       // [math warpgroup]: Lin::build's scratch
    alignas(8) uint64_t q_full[2], q_empty[2];
    uint64_t k_full[NUM_STAGES], k_empty[NUM_STAGES];
  };
  static constexpr int kSmemBytes = Sm90SmemSize<SharedStorage>::kBytes;
  static constexpr unsigned kQBytes = 2 * (N * D + N * sizeof(float));
  static constexpr unsigned kTileBytes = kTileKeys * D + kTileKeys * sizeof(float);
  // setmaxnreg: 128 x (40 + 2 x 232) = 64512 <= 65536.
  static constexpr int kRegsProducer = 40;
  static constexpr int kRegsMath = 232;
  static constexpr int kLoadWarps = 1;
};

namespace detail {

// Warp 0; lane 0 issues the barriers and TMA loads.
template <typename Cfg>
__device__ __forceinline__ void producer(typename Cfg::SharedStorage& ss, const LogitsParams& p,
                                         const TmaDescriptor* q_desc, const TmaDescriptor* w_desc,
                                         const TmaDescriptor* k_desc, const TmaDescriptor* s_desc) {
  constexpr int NS = Cfg::NUM_STAGES;
  const int lane = threadIdx.x % 32;
  const uint64_t k_policy = l2_evict_last_policy();   // every q block reads the same keys
  uint32_t q_iter = 0, kv_iter = 0;
  const int units = num_units(p);
#pragma unroll 1
  for (int k = 0, u = cta_unit(0); u < units; u = cta_unit(++k)) {
    const Unit w = unit_of<Cfg::UNIT_Q>(p, u, lane);
    if (w.n_tiles == 0) continue;
    const int x = q_iter & 1;
    if (lane == 0) mbarrier_wait(&ss.q_empty[x], ((q_iter >> 1) & 1) ^ 1);
    __syncwarp();
    // The rows' key ranges for the math warpgroups' stores (lane 0's arrive below releases them).
    const int r = w.qb * Cfg::UNIT_Q + lane;
    if (lane < Cfg::UNIT_Q) {
      ss.ks[x][lane] = r < p.m ? __ldg(p.ks + r) : 0;
      ss.ke[x][lane] = r < p.m ? __ldg(p.ke + r) : 0;
    }
    __syncwarp();
    if (lane == 0) {
      mbarrier_arrive_expect_tx(&ss.q_full[x], Cfg::kQBytes);
      tma_load_2d(ss.q[x][0], q_desc, &ss.q_full[x], 0, w.qb * 2 * Cfg::N);
      tma_load_2d(ss.q[x][1], q_desc, &ss.q_full[x], 0, w.qb * 2 * Cfg::N + Cfg::N);
      tma_load_2d(ss.weights[x], w_desc, &ss.q_full[x], 0, w.qb * Cfg::UNIT_Q);
#pragma unroll 1
      for (int i = 0; i < w.n_tiles; ++i) {
        const uint32_t g = kv_iter + i;
        const int s = g % NS;
        mbarrier_wait(&ss.k_empty[s], ((g / NS) & 1) ^ 1);
        mbarrier_arrive_expect_tx(&ss.k_full[s], Cfg::kTileBytes);
        const int key0 = w.t0 + i * kTileKeys;
        tma_load_2d_hint(ss.k[s], k_desc, &ss.k_full[s], 0, key0, k_policy);
        tma_load_2d(ss.scale[s], s_desc, &ss.k_full[s], key0, 0);
      }
    }
    __syncwarp();
    kv_iter += w.n_tiles;
    ++q_iter;
  }
}

// A math warpgroup's view of its unit: the head weights of its columns and, for each value m a
// lane stores (its warpgroup's row Sum::out_token(m, lane); BLOCK_Q is even, so every lane owns
// its values; rows past m lie in the buffer's row padding: written, never read), where the current
// tile's value goes (dst: the row's column for the lane's key; compressed rows start at ks) and
// the key's place in the row's range (rel = key - ks; the range is [ks, ks + len)), both advanced
// by a tile per tile. Held in registers where a lane has at most 2 values (32 and 64 heads); with 8
// and 16 heads (8 and 4 values, whose registers would spill) only value 0's, the rest from the row
// below and shared memory per tile.
template <typename Cfg>
struct MathUnit {
  using Sum = typename Cfg::Sum;
  static constexpr bool kRowsInRegs = Sum::kOut <= 2;
  static constexpr int kRows = kRowsInRegs ? Sum::kOut : 1;
  float w[Sum::kWeights];
  float wl[Sum::kLinWeights > 0 ? Sum::kLinWeights : 1];
  float* dst[kRows];
  int rel[kRows], len[kRows];
  int x, wg;

  __device__ __forceinline__ void next_tile() {
#pragma unroll
    for (int m = 0; m < kRows; ++m) dst[m] += kTileKeys, rel[m] += kTileKeys;
  }
};

// Value m's ks and len from the unit's slot of shared memory.
template <typename Cfg>
__device__ __forceinline__ int2 unit_range_smem(const typename Cfg::SharedStorage& ss, int x, int wg, int m, int lane) {
  const int q = wg * Cfg::BLOCK_Q + Cfg::Sum::out_token(m, lane);
  const int ks = ss.ks[x][q];
  return make_int2(ks, max(ss.ke[x][q] - ks, 0));
}

template <typename Cfg>
__device__ __forceinline__ void load_math_unit(const typename Cfg::SharedStorage& ss, const LogitsParams& p,
                                               const Unit& w, int x, int wg, int warp, int lane, MathUnit<Cfg>& mu) {
  using Sum = typename Cfg::Sum;
  static_assert(Sum::Q == Cfg::BLOCK_Q && Sum::Q % 2 == 0, "every lane owns its values");
  constexpr float kHeadFactor = Cfg::LINEAR ? 0.5f : 1.f;   // (x + |x|) / 2
#pragma unroll
  for (int i = 0; i < Sum::kWeights; ++i)
    mu.w[i] = kHeadFactor * ss.weights[x][wg * Cfg::N + Sum::weight_column(i, lane)];
#pragma unroll
  for (int i = 0; i < Sum::kLinWeights; ++i) mu.wl[i] = Sum::lin_weight(i, lane, ss.lin_scale[x][wg]);
  mu.x = x;
  mu.wg = wg;
  const int key = w.t0 + warp * 16 + lane / 4 + 8 * Sum::out_half(lane);   // the lane's key in tile 0
  float* row0 = p.logits + (w.qb * Cfg::UNIT_Q + wg * Cfg::BLOCK_Q + Sum::out_token(0, lane)) * p.stride;
  if constexpr (MathUnit<Cfg>::kRowsInRegs) {
#pragma unroll
    for (int m = 0; m < MathUnit<Cfg>::kRows; ++m) {
      const int2 range = unit_range_smem<Cfg>(ss, x, wg, m, lane);
      mu.dst[m] = row0 + 2 * m * p.stride + key - (p.max_seqlen_k > 0 ? range.x : 0);   // (out_token: 2 m + ..)
      mu.rel[m] = key - range.x;
      mu.len[m] = range.y;
    }
  } else {   // value 0's row at the key, and the key
    mu.dst[0] = row0 + key;
    mu.rel[0] = key;
  }
}

// Tile i of the unit (the CTA's g-th; mu at tile i): its stage is full; sum the accumulator, release
// the stage, store, advance mu.
template <typename Cfg, typename Frag>
__device__ __forceinline__ void finish_tile(typename Cfg::SharedStorage& ss, const LogitsParams& p,
                                            MathUnit<Cfg>& mu, uint32_t g, const Frag& acc, int warp, int lane) {
  using Sum = typename Cfg::Sum;
  const int s = g % Cfg::NUM_STAGES;
  const int row_in_tile = warp * 16 + lane / 4;
  const float scale[2] = {ss.scale[s][row_in_tile], ss.scale[s][row_in_tile + 8]};
  __syncwarp();
  if (lane == 0) mbarrier_arrive(&ss.k_empty[s]);
  float out[Sum::kOut];
  Sum::run(acc, mu.w, mu.wl, scale, out, lane);
#pragma unroll
  for (int m = 0; m < Sum::kOut; ++m) {
    float* dst;
    int rel, len;
    if constexpr (MathUnit<Cfg>::kRowsInRegs) {
      dst = mu.dst[m], rel = mu.rel[m], len = mu.len[m];
    } else {   // from value 0's row and the key (see load_math_unit)
      const int2 range = unit_range_smem<Cfg>(ss, mu.x, mu.wg, m, lane);
      rel = mu.rel[0] - range.x;
      len = range.y;
      dst = mu.dst[0] + 2 * m * p.stride - (p.max_seqlen_k > 0 ? range.x : 0);
    }
    if (p.max_seqlen_k > 0) {
      if (unsigned(rel) < unsigned(p.max_seqlen_k)) *dst = out[m];
    } else {
      *dst = (p.clean && unsigned(rel) >= unsigned(len)) ? kNegInf : out[m];
    }
  }
  mu.next_tile();
}

template <typename Cfg, typename FragK, typename FragQ, typename Frag>
__device__ __forceinline__ void wait_and_issue(typename Cfg::SharedStorage& ss, const FragK& k0, const FragQ& tq,
                                               uint32_t g, Frag& acc) {
  const int s = g % Cfg::NUM_STAGES;
  mbarrier_wait(&ss.k_full[s], (g / Cfg::NUM_STAGES) & 1);
  Cfg::Mma::issue(Cfg::Mma::k_stage(k0, s), tq, acc);
}

template <typename Cfg>
__device__ __forceinline__ void math(typename Cfg::SharedStorage& ss, const LogitsParams& p, int wg) {
  const int tw = threadIdx.x % 128, warp = tw / 32, lane = tw % 32;
  auto acc0 = Cfg::Mma::make_acc();
  auto acc1 = Cfg::Mma::make_acc();
  const auto k0 = Cfg::Mma::k_frag(ss.k[0], tw);   // the K ring's stage 0
  static_assert(sizeof(ss.k[0]) == Cfg::Mma::kStageDesc * 16, "K stages kStageDesc descriptor units apart");
  MathUnit<Cfg> mu;
  uint32_t q_iter = 0, kv_iter = 0;
  const int units = num_units(p);
#pragma unroll 1
  for (int k = 0, u = cta_unit(0); u < units; u = cta_unit(++k)) {
    const Unit w = unit_of<Cfg::UNIT_Q>(p, u, lane);
    if (w.n_tiles == 0) continue;
    const int x = q_iter & 1;
    mbarrier_wait(&ss.q_full[x], (q_iter >> 1) & 1);
    if constexpr (Cfg::LINEAR) {   // this warpgroup's q' rows (named barrier 1 + wg)
      Cfg::Lin::build(reinterpret_cast<uint8_t*>(ss.q[x][wg]), &ss.weights[x][wg * Cfg::N], ss.lin_scale[x][wg],
                      ss.lin_red[wg], tw, 1 + wg);
    }
    load_math_unit<Cfg>(ss, p, w, x, wg, warp, lane, mu);
    // Every tile of the unit, two in flight: acc0 holds tiles i (even), acc1 tiles i + 1. One
    // group (acc0's) is pending at the loop head on every path, so ptxas keeps the wgmma async.
    const int n = w.n_tiles;
    const auto tq = Cfg::Mma::q_frag(ss.q[x][wg], tw);
    auto issue = [&](int i, auto& acc) { wait_and_issue<Cfg>(ss, k0, tq, kv_iter + i, acc); };
    auto finish = [&](int i, const auto& acc) { finish_tile<Cfg>(ss, p, mu, kv_iter + i, acc, warp, lane); };
    issue(0, acc0);
    int i = 0;
#pragma unroll 1
    for (; i + 2 < n; i += 2) {
      issue(i + 1, acc1);
      cute::warpgroup_wait<1>();
      finish(i, acc0);
      issue(i + 2, acc0);
      cute::warpgroup_wait<1>();
      finish(i + 1, acc1);
    }
    if (i + 1 < n) {
      issue(i + 1, acc1);
      cute::warpgroup_wait<1>();
      finish(i, acc0);
      cute::warpgroup_wait<0>();
      finish(i + 1, acc1);
    } else {
      cute::warpgroup_wait<0>();
      finish(i, acc0);
    }
    // Every wgmma of this warpgroup that read Q retired (waited above): release the Q slot.
    if (tw == 0) mbarrier_arrive(&ss.q_empty[x]);
    kv_iter += n;
    ++q_iter;
  }
}

}  // namespace detail

// Both indexer kernels' start: the shared storage, descriptors prefetched, barriers initialized
// (k_empty_arrivals: math warps that release each K stage).
template <typename Cfg>
__device__ __forceinline__ typename Cfg::SharedStorage& init_shared(const TmaDescriptor* const (&descs)[4],
                                                                    int k_empty_arrivals, int q_empty_arrivals = 2) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  using SS = typename Cfg::SharedStorage;
  SS& ss = aligned_shared_storage<SS>(smem_raw);
  if (threadIdx.x == 0) {
#pragma unroll
    for (int d = 0; d < 4; ++d) prefetch_tma_descriptor(descs[d]);
#pragma unroll
    for (int x = 0; x < 2; ++x) {
      mbarrier_init(&ss.q_full[x], 1);
      mbarrier_init(&ss.q_empty[x], q_empty_arrivals);   // one thread of each math warpgroup
    }
#pragma unroll
    for (int s = 0; s < Cfg::NUM_STAGES; ++s) {
      mbarrier_init(&ss.k_full[s], 1);
      mbarrier_init(&ss.k_empty[s], k_empty_arrivals);
    }
    fence_barrier_init();
  }
  __syncthreads();
  return ss;
}

// Both kernels' roles: warps 0 .. kLoadWarps - 1 load (load warp), the producer warpgroup's other
// warps clean (lane, lanes), warpgroups 1.. compute (wg).
template <typename Cfg, typename Load, typename Clean, typename Math>
__device__ __forceinline__ void run_roles(Load&& load, Clean&& clean, Math&& math) {
  // setmaxnreg.inc waits for registers the CTA's other warps gave back: taking more than the
  // producer warpgroup gives hangs the math warpgroups. Launch: 65536 / threads a thread, in 8s.
  constexpr int kLaunchRegs = 65536 / Cfg::NUM_THREADS / 8 * 8;
  static_assert((Cfg::NUM_THREADS / 128 - 1) * (Cfg::kRegsMath - kLaunchRegs) <= kLaunchRegs - Cfg::kRegsProducer,
                "setmaxnreg: the math warpgroups take more registers than the producer warpgroup gives");
  const int warp = __shfl_sync(0xffffffffu, int(threadIdx.x) / 32, 0);
  if (warp < 4) {
    setmaxnreg_dec<Cfg::kRegsProducer>();
    static_assert(Cfg::kLoadWarps >= 1 && Cfg::kLoadWarps <= 3, "one to three load warps");
    if (warp < Cfg::kLoadWarps) {
      load(warp);
    } else {
      clean(int(threadIdx.x) - 32 * Cfg::kLoadWarps, 128 - 32 * Cfg::kLoadWarps);
    }
  } else {
    setmaxnreg_inc<Cfg::kRegsMath>();
    math(warp / 4 - 1);
  }
}

template <typename Cfg>
__device__ __forceinline__ void logits_body(const LogitsParams& p, const TmaDescriptor* q_desc,
                                            const TmaDescriptor* w_desc, const TmaDescriptor* k_desc,
                                            const TmaDescriptor* s_desc) {
  auto& ss = init_shared<Cfg>({q_desc, w_desc, k_desc, s_desc}, 8);   // both math warpgroups read each stage
  run_roles<Cfg>([&](int) { detail::producer<Cfg>(ss, p, q_desc, w_desc, k_desc, s_desc); },
                 [&](int lane, int lanes) {
                   if (p.clean && p.max_seqlen_k == 0) detail::logits_cleaner<Cfg::UNIT_Q>(p, lane, lanes);
                 },
                 [&](int wg) { detail::math<Cfg>(ss, p, wg); });
}

}  // namespace indexer
}  // namespace mla_jit
