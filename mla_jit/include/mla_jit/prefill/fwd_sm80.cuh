// mla_jit prefill: varlen attention forward for GPUs without TMA / wgmma (sm_80, sm_86, sm_89):
// mma.sync m16n8k16 + ldmatrix + cp.async, v head dim native (no padding to D_QK).
//
// Grid (ceil(max_seqlen_q / BLOCK_M) * h, b) in the tile order of common.cuh, block 32 * BLOCK_M /
// 16 threads: warp w owns query rows 16 w .. 16 w + 15 of the CTA's BLOCK_M. Its Q fragment lives
// in registers for the whole CTA (D_QK / 16 x 4 words), S (16 x BLOCK_N) and O (16 x D_V) are
// fp32 accumulators, P is repacked from S in registers as the A operand of P V.
//
// Shared memory: Q (BLOCK_M x D_QK), then NUM_STAGES stages of K (BLOCK_N x D_QK) and V (BLOCK_N
// x D_V), row-major with the XOR swizzle of common/sm80.cuh (conflict-free cp.async writes and
// ldmatrix reads). Q_ALIASES_KV (sm_86 / sm_89's 99 KB at 192/128): Q is loaded into the stage
// area, moved to registers, and only then are the stages filled. BLOCK_N is 128 (configs/prefill.py):
// S then runs 16 independent MMA chains a warp (8 at 64 keys, too few to hide mma.sync's latency
// with one warp of a sub-partition at the MMAs), and the barriers and softmax reductions come once
// per 128 keys.
//
// Pipeline per KV tile i (walked from the last tile, the only ones needing a mask, to the first):
//   wait for tile i's copies (cp.async group) -> __syncthreads (every warp is done with tile i - 1,
//   whose stage is refilled now) -> issue the copies of tile i + NUM_STAGES - 1 -> S = Q K^T ->
//   mask -> online softmax (lazy rescaling, as the sm_90a kernel) -> O += P V.
//   NUM_STAGES 1 (192/128 at 128 keys): one K and one V buffer, V(i) loaded during S(i) and K(i + 1)
//   during softmax and P V(i), as FlashAttention-2 does (see the main loop).
//   The tiles that need the mask run in a loop of their own; there a warp whose rows see none of
//   the tile's second half computes S and P V over the first half.
// Rows and keys past a sequence's end are copied as zeros (cp.async with 0 source bytes): nothing
// past cu_seqlens is read, and a masked key contributes exactly 0.
#pragma once

#include <cutlass/numeric_types.h>

#include "mla_jit/common/sm80.cuh"
#include "mla_jit/common/sm90_fragment.cuh"
#include "common.cuh"

namespace mla_jit {
namespace prefill {

template <typename Element_, int D_QK_, int D_V_, int BLOCK_M_, int BLOCK_N_, int NUM_STAGES_, bool CAUSAL_,
          bool Q_ALIASES_KV_>
struct PrefillSm80Config {
  using Element = Element_;
  static constexpr int D_QK = D_QK_, D_V = D_V_, BLOCK_M = BLOCK_M_, BLOCK_N = BLOCK_N_;
  static constexpr int NUM_STAGES = NUM_STAGES_;
  static constexpr bool CAUSAL = CAUSAL_, Q_ALIASES_KV = Q_ALIASES_KV_;
  static constexpr int kWarps = BLOCK_M / 16;
  static constexpr int NUM_THREADS = 32 * kWarps;
  static constexpr int kQkChunks = D_QK / 8, kVChunks = D_V / 8;   // 16-byte chunks of a row
  static constexpr int kQBytes = BLOCK_M * D_QK * 2;
  static constexpr int kKBytes = BLOCK_N * D_QK * 2;
  static constexpr int kStageBytes = kKBytes + BLOCK_N * D_V * 2;
  static constexpr int kStagesBytes = NUM_STAGES * kStageBytes;
  static constexpr int kSmemBytes = Q_ALIASES_KV ? (kQBytes > kStagesBytes ? kQBytes : kStagesBytes)
                                                 : kQBytes + kStagesBytes;

  static_assert(BLOCK_M % 16 == 0 && BLOCK_M <= 256, "16 query rows a warp");
  static_assert(BLOCK_N % 16 == 0 && D_QK % 64 == 0 && D_V % 64 == 0, "tile shapes");
  static_assert(NUM_STAGES >= 1, "one K and one V buffer at least (NUM_STAGES 1: loads overlapped FA2-style)");
  static_assert(cute::is_same_v<Element, cutlass::bfloat16_t> || cute::is_same_v<Element, cutlass::half_t>,
                "bf16 or fp16");
};

namespace detail {

// kRows rows of kChunks 16-byte chunks from `src` (row stride `stride` elements) into a swizzled
// shared tile; rows >= valid_rows are written as zeros and not read. Thread t copies chunks
// c0 + 8 b (c0 = t % 8) of rows r0 + kRowsPerPass a (r0 = t / 8): the swizzle puts a row's chunk c
// at c ^ (row % 8), and (c0 + 8 b) ^ (r0 % 8) = (c0 ^ (r0 % 8)) + 8 b, so every copy is one base
// address plus compile-time offsets (no per-copy addresses held in registers across the loop).
template <typename Cfg, int kRows, int kChunks>
__device__ __forceinline__ void copy_rows(uint32_t dst, const typename Cfg::Element* src, long long stride,
                                          int valid_rows, int tid) {
  constexpr int kRowsPerPass = Cfg::NUM_THREADS / 8;
  static_assert(kChunks % 8 == 0 && kRowsPerPass % 8 == 0 && kRows % kRowsPerPass == 0, "copy shape");
  const int r0 = tid / 8, c0 = tid % 8;
  const uint32_t dst0 = dst + sm80::swz<kChunks>(r0, c0);
  const typename Cfg::Element* src0 = src + r0 * stride + c0 * 8;
#pragma unroll
  for (int a = 0; a < kRows / kRowsPerPass; ++a) {
    const bool valid = r0 + a * kRowsPerPass < valid_rows;
#pragma unroll
    for (int b = 0; b < kChunks / 8; ++b) {
      const typename Cfg::Element* from = valid ? src0 + a * kRowsPerPass * stride + b * 64 : src;
      sm80::cp_async_16(dst0 + unsigned(a * kRowsPerPass * kChunks + b * 8) * 16u, from, valid ? 16 : 0);
    }
  }
}

// Per-thread softmax state of its two rows (lane / 4 and lane / 4 + 8 of its warp's 16).
struct Sm80Rows {
  float m[2];   // reference maximum, log2 units; -inf until the row sees a key
  float l[2];   // this thread's part of the row sum (reduced over the quad at the end)
};

template <typename Cfg>
struct Sm80Frags {
  uint32_t q[Cfg::D_QK / 16][4];          // A operand of S, all of D_QK
  float s[Cfg::BLOCK_N / 8][4];           // S / P accumulator (m16n8 tiles)
  float o[Cfg::D_V / 8][4];               // O accumulator
};

// Where a lane's ldmatrix rows lie in the swizzled tiles. An x4 ldmatrix of a 16-row, two-chunk
// block takes its four 8 x 8 matrices from lanes 0-7, 8-15, 16-23, 24-31; each lane addresses row
// (lane % 8) + 8 (row half) of the block, chunk 2 kk + (chunk bit) (k-step or column pair kk). Q and V
// take the row half from bit 3 of the lane and the chunk from bit 4, K the other way round (its
// matrices then come out as the two register pairs of two n8 tiles). Every such row is lane % 8
// modulo 8, so the swizzle puts the chunk at 8 (kk / 4) + ((2 (kk % 4) + chunk bit) ^ (lane % 8)): four
// addresses a lane and tile serve every k-step (kk / 4 and the block's rows become immediates).
struct LdsmLane {
  int lane;

  // The four addresses in the swizzled tile at `tile` (kChunks 16-byte chunks a row); chunk pair kk
  // of row block rb is at out[kk % 4] + (16 rb kChunks + 8 (kk / 4)) * 16. Through opaque moves: each
  // ldmatrix then addresses [register + immediate] (hoisted out of the main loop, such addresses
  // would hold registers for every k-step; recomputed per ldmatrix, they cost an add each).
  template <int kChunks, bool kRowHalfFromBit4>
  __device__ __forceinline__ void bases(uint32_t tile, uint32_t (&out)[4]) const {
    const int half = kRowHalfFromBit4 ? lane / 16 : (lane / 8) % 2;
    const int chunk = kRowHalfFromBit4 ? (lane / 8) % 2 : lane / 16;
    const uint32_t row = tile + uint32_t((lane % 8) + 8 * half) * kChunks * 16;
#pragma unroll
    for (int t = 0; t < 4; ++t) out[t] = uint32_t(opaque(int(row + uint32_t((2 * t + chunk) ^ (lane % 8)) * 16)));
  }
  template <int kChunks>
  __device__ __forceinline__ static constexpr uint32_t offset(int row_block, int kk) {
    return uint32_t(16 * row_block * kChunks + 8 * (kk / 4)) * 16;
  }
};

// Q fragment of warp `warp` (rows 16 warp ..) from the shared tile into registers.
template <typename Cfg>
__device__ __forceinline__ void load_q_frags(Sm80Frags<Cfg>& f, uint32_t q_smem, const LdsmLane& ln, int warp) {
  uint32_t qb[4];
  ln.bases<Cfg::kQkChunks, false>(q_smem, qb);
#pragma unroll
  for (int kk = 0; kk < Cfg::D_QK / 16; ++kk) {
    sm80::ldsm_x4(f.q[kk], qb[kk % 4] + LdsmLane::offset<Cfg::kQkChunks>(warp, kk));
  }
}

// S = Q K^T over the first kKeys keys of the tile in k_smem. A tile's later keys, which no row of the
// warp within the sequence sees, stay 0 until mask_s sets them to -inf (for rows past the sequence's
// end, whose bound may lie beyond them, they stay 0: those rows are computed but never stored).
template <typename Cfg, int kKeys = Cfg::BLOCK_N>
__device__ __forceinline__ void compute_s(Sm80Frags<Cfg>& f, uint32_t k_smem, const LdsmLane& ln) {
#pragma unroll
  for (int nt = 0; nt < Cfg::BLOCK_N / 8; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) f.s[nt][e] = 0.f;
  }
  uint32_t kb[4];
  ln.bases<Cfg::kQkChunks, true>(k_smem, kb);
#pragma unroll
  for (int kk = 0; kk < Cfg::D_QK / 16; ++kk) {
#pragma unroll
    for (int np = 0; np < kKeys / 16; ++np) {
      uint32_t b[4];   // keys 0-7 of the 16: k low, k high; keys 8-15: k low, k high
      sm80::ldsm_x4(b, kb[kk % 4] + LdsmLane::offset<Cfg::kQkChunks>(np, kk));
      sm80::Mma<typename Cfg::Element>::run(f.s[2 * np], f.q[kk], b[0], b[1]);
      sm80::Mma<typename Cfg::Element>::run(f.s[2 * np + 1], f.q[kk], b[2], b[3]);
    }
  }
}

// -inf where key tok0 + column is not visible to the row (lim[h] for row lane / 4 + 8 h).
template <typename Cfg>
__device__ __forceinline__ void mask_s(Sm80Frags<Cfg>& f, int tok0, int lane, const int (&lim)[2]) {
#pragma unroll
  for (int nt = 0; nt < Cfg::BLOCK_N / 8; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int tok = tok0 + nt * 8 + 2 * (lane % 4) + (e & 1);
      if (tok >= lim[e >> 1]) f.s[nt][e] = -kInf;
    }
  }
}

// Online softmax of S in place (S becomes unnormalized P) and the O rescale (lazy, as sm_90a's).
template <typename Cfg>
__device__ __forceinline__ void softmax_rescale(Sm80Frags<Cfg>& f, Sm80Rows& st, float scale_log2) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float mx = -kInf;
#pragma unroll
    for (int nt = 0; nt < Cfg::BLOCK_N / 8; ++nt) mx = fmaxf(mx, fmaxf(f.s[nt][2 * h], f.s[nt][2 * h + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    mx *= scale_log2;
    const bool move = mx > st.m[h] + kLazyRescaleLog2;
    const float m_new = move ? mx : st.m[h];
    const float m_use = m_new == -kInf ? 0.f : m_new;
    const float rescale = move ? ex2_approx(st.m[h] - m_use) : 1.f;
    st.m[h] = m_new;
    float sum = 0.f;
#pragma unroll
    for (int nt = 0; nt < Cfg::BLOCK_N / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float& x = f.s[nt][2 * h + e];
        x = ex2_approx(fmaf(x, scale_log2, -m_use));
        sum += x;
      }
    }
    st.l[h] = st.l[h] * rescale + sum;
    if (__any_sync(0xffffffffu, rescale != 1.f)) {
#pragma unroll
      for (int nt = 0; nt < Cfg::D_V / 8; ++nt) {
        f.o[nt][2 * h] *= rescale;
        f.o[nt][2 * h + 1] *= rescale;
      }
    }
  }
}

// O += P V over the tile in v_smem; P repacked from S (two m16n8 tiles = one k16 A fragment).
// Over the first kKeys keys (P is 0 past them).
template <typename Cfg, int kKeys = Cfg::BLOCK_N>
__device__ __forceinline__ void compute_pv(Sm80Frags<Cfg>& f, uint32_t v_smem, const LdsmLane& ln) {
  using Element = typename Cfg::Element;
  uint32_t vb[4];
  ln.bases<Cfg::kVChunks, false>(v_smem, vb);
#pragma unroll
  for (int kk = 0; kk < kKeys / 16; ++kk) {
    const uint32_t a[4] = {ElemTraits<Element>::pack2(f.s[2 * kk][0], f.s[2 * kk][1]),
                           ElemTraits<Element>::pack2(f.s[2 * kk][2], f.s[2 * kk][3]),
                           ElemTraits<Element>::pack2(f.s[2 * kk + 1][0], f.s[2 * kk + 1][1]),
                           ElemTraits<Element>::pack2(f.s[2 * kk + 1][2], f.s[2 * kk + 1][3])};
#pragma unroll
    for (int np = 0; np < Cfg::D_V / 16; ++np) {
      uint32_t b[4];
      sm80::ldsm_x4_trans(b, vb[np % 4] + LdsmLane::offset<Cfg::kVChunks>(kk, np));
      sm80::Mma<Element>::run(f.o[2 * np], a, b[0], b[1]);
      sm80::Mma<Element>::run(f.o[2 * np + 1], a, b[2], b[3]);
    }
  }
}

// O / l to out (rows past the sequence dropped) and the natural-log LSE (+inf: no key seen).
template <typename Cfg>
__device__ __forceinline__ void store_rows(const PrefillParams& p, const TileWork& w, Sm80Frags<Cfg>& f,
                                           Sm80Rows& st, int warp, int lane) {
  using Element = typename Cfg::Element;
  Element* out = static_cast<Element*>(p.out);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float l = st.l[h];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    const bool seen = l > 0.f;
    const float inv_l = seen ? rcp_approx(l) : 0.f;
    const int r = w.m_block * Cfg::BLOCK_M + warp * 16 + lane / 4 + 8 * h;
    if (r >= w.len_q || unsigned(w.q0 + r) >= unsigned(p.total_q)) continue;
    Element* row = out + (long long)(w.q0 + r) * p.o_stride_t + (long long)w.head * p.o_stride_h + 2 * (lane % 4);
#pragma unroll
    for (int nt = 0; nt < Cfg::D_V / 8; ++nt) {
      const uint32_t v = ElemTraits<Element>::pack2(f.o[nt][2 * h] * inv_l, f.o[nt][2 * h + 1] * inv_l);
      *reinterpret_cast<uint32_t*>(row + nt * 8) = v;
    }
    if (p.lse != nullptr && lane % 4 == 0) {
      p.lse[(long long)w.head * p.total_q + w.q0 + r] =
          seen ? (st.m[h] + lg2_approx(l)) * 0.69314718055994530942f : kInf;
    }
  }
}

// The MMA turn of warp group g (named barrier 1 + g over both groups' threads): turn_wait by the
// group whose turn it is, turn_pass by the other when it hands the turn over.
template <typename Cfg>
__device__ __forceinline__ void turn_wait(int g) {
  named_barrier_sync(1 + g, Cfg::NUM_THREADS);
}
template <typename Cfg>
__device__ __forceinline__ void turn_pass(int g) {
  named_barrier_arrive(1 + g, Cfg::NUM_THREADS);
}
// One K and one V buffer: every thread's copies of the V buffer have landed (all threads).
constexpr int kVReadyBarrier = 3;

}  // namespace detail

template <typename Cfg>
__device__ __forceinline__ void prefill_sm80_body(const PrefillParams& p) {
  using namespace detail;
  using Element = typename Cfg::Element;
  constexpr int BM = Cfg::BLOCK_M, BN = Cfg::BLOCK_N, NS = Cfg::NUM_STAGES;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  const TileWork w = tile_work<Cfg>(p, blockIdx.x, blockIdx.y);
  if (w.m_block * BM >= w.len_q) return;   // the whole CTA: past this sequence's rows
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const uint32_t q_smem = sm80::smem_u32(smem_raw);
  const uint32_t stages = q_smem + (Cfg::Q_ALIASES_KV ? 0 : Cfg::kQBytes);
  const int kv_head = w.head / p.q_per_kv;
  const Element* qg = static_cast<const Element*>(p.q) + (long long)(w.q0 + w.m_block * BM) * p.q_stride_t +
                      (long long)w.head * p.q_stride_h;
  // The copies of walk step i (tile n_tiles - 1 - i) into stage i % NS. Source rows are addressed
  // from the parameters (constant bank) and an opaque thread index at each step: 64-bit pointers
  // held across the main loop would cost registers the 128-key tiles do not have.
  auto load_k = [&](int i) {
    const int n = w.n_tiles - 1 - i;
    const long long tok = w.k0 + n * BN;
    copy_rows<Cfg, BN, Cfg::kQkChunks>(stages + (i % NS) * Cfg::kStageBytes, static_cast<const Element*>(p.k) +
                                       tok * p.k_stride_t + (long long)kv_head * p.k_stride_h, p.k_stride_t,
                                       min(BN, w.len_k - n * BN), opaque(tid));
  };
  auto load_v = [&](int i) {
    const int n = w.n_tiles - 1 - i;
    const long long tok = w.k0 + n * BN;
    copy_rows<Cfg, BN, Cfg::kVChunks>(stages + (i % NS) * Cfg::kStageBytes + Cfg::kKBytes,
                                      static_cast<const Element*>(p.v) + tok * p.v_stride_t +
                                      (long long)kv_head * p.v_stride_h, p.v_stride_t, min(BN, w.len_k - n * BN),
                                      opaque(tid));
  };

  const LdsmLane ln{lane};
  Sm80Frags<Cfg> f;
  Sm80Rows st{{-kInf, -kInf}, {0.f, 0.f}};
#pragma unroll
  for (int nt = 0; nt < Cfg::D_V / 8; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) f.o[nt][e] = 0.f;
  }
  // Keys visible to the thread's rows (bottom-right causal), and to its warp's last row (the keys the
  // warp computes in a tile that needs the mask; 0 for a warp past the sequence's rows).
  auto visible = [&](int r) { return Cfg::CAUSAL ? min(w.len_k, w.len_k - w.len_q + r + 1) : w.len_k; };
  int lim[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) lim[h] = visible(w.m_block * BM + warp * 16 + lane / 4 + 8 * h);
  const int warp_first = w.m_block * BM + warp * 16;
  const int warp_keys = warp_first < w.len_q ? visible(min(warp_first + 15, w.len_q - 1)) : 0;

  if (w.n_tiles > 0) {
    copy_rows<Cfg, BM, Cfg::kQkChunks>(q_smem, qg, p.q_stride_t, min(BM, w.len_q - w.m_block * BM), tid);
    sm80::cp_async_commit();
    if constexpr (Cfg::Q_ALIASES_KV) {   // Q to registers before the stages overwrite it
      sm80::cp_async_wait<0>();
      __syncthreads();
      load_q_frags<Cfg>(f, q_smem, ln, warp);
      __syncthreads();
    }
    if constexpr (NS == 1) {
      load_k(0);
      sm80::cp_async_commit();
    }
#pragma unroll
    for (int i = 0; i < NS - 1; ++i) {
      if (i < w.n_tiles) {
        load_k(i);
        load_v(i);
      }
      sm80::cp_async_commit();   // (empty groups keep the count uniform)
    }
    if constexpr (!Cfg::Q_ALIASES_KV) {   // Q (the oldest group) to registers while K/V land
      sm80::cp_async_wait<NS == 1 ? 1 : NS - 1>();
      __syncthreads();
      load_q_frags<Cfg>(f, q_smem, ln, warp);
    }
    // Ping-pong: the two halves of the warps take turns at the MMAs (group 0 first), so one half's
    // softmax runs while the other's MMAs fill the tensor pipes (each SM sub-partition holds a
    // warp of each half: warps w and w + 4).
    const int grp = warp / (Cfg::kWarps / 2);
    if (grp == 1) turn_pass<Cfg>(0);
    // One K and one V buffer (NS == 1): V(i) lands during S(i), K(i + 1) during softmax and P V(i).
    // After its S, every thread waits for its copies of V(i) and meets the others at kVReady: then
    // everyone's V(i) is in, no warp reads K(i) any more, and K(i + 1) is issued. Group 1 meets there
    // before its softmax (which overlaps group 0's P V), group 0 after its own (which overlaps group
    // 1's S).
    auto v_ready_k_next = [&](int i) {
      sm80::cp_async_wait<0>();
      named_barrier_sync(kVReadyBarrier, Cfg::NUM_THREADS);
      if (i + 1 < w.n_tiles) load_k(i + 1);
      sm80::cp_async_commit();
    };
    // Walk step i (tile n = n_tiles - 1 - i). The tiles that need the mask come first (the walk runs
    // from the last tile): they run in their own loop, with kPartial, so that the loop over the full
    // tiles has no per-block tests.
    auto step = [&](int i, auto partial) {
      constexpr bool kPartial = decltype(partial)::value;
      sm80::cp_async_wait<NS == 1 ? 0 : NS - 2>();   // this thread's copies of step i (and Q) landed
      __syncthreads();                 // everyone's; and every warp is done with step i - 1's stage
      if constexpr (NS == 1) {
        load_v(i);
      } else if (i + NS - 1 < w.n_tiles) {
        load_k(i + NS - 1);
        load_v(i + NS - 1);
      }
      sm80::cp_async_commit();
      const int n = w.n_tiles - 1 - i;
      const uint32_t stage = stages + (i % NS) * Cfg::kStageBytes;
      // A tile that needs the mask: a warp whose rows see none of its second half computes the first.
      const bool half = kPartial && warp_keys - n * BN <= BN / 2;
      turn_wait<Cfg>(grp);
      if (half) {
        compute_s<Cfg, BN / 2>(f, stage, ln);
      } else {
        compute_s<Cfg>(f, stage, ln);
      }
      turn_pass<Cfg>(1 - grp);
      if (NS == 1 && grp == 1) v_ready_k_next(i);
      if (kPartial) mask_s<Cfg>(f, n * BN, lane, lim);
      softmax_rescale<Cfg>(f, st, p.scale_log2);
      if (NS == 1 && grp == 0) v_ready_k_next(i);
      turn_wait<Cfg>(grp);
      if (half) {
        compute_pv<Cfg, BN / 2>(f, stage + Cfg::kKBytes, ln);
      } else {
        compute_pv<Cfg>(f, stage + Cfg::kKBytes, ln);
      }
      turn_pass<Cfg>(1 - grp);
    };
    int i = 0;
#pragma unroll 1
    for (; i < w.n_tiles && w.n_tiles - 1 - i >= w.mask_from; ++i) step(i, cute::true_type{});
#pragma unroll 1
    for (; i < w.n_tiles; ++i) step(i, cute::false_type{});
    if (grp == 0) turn_wait<Cfg>(0);   // group 1's last pass (each barrier ends balanced)
    sm80::cp_async_wait<0>();
  }
  store_rows<Cfg>(p, w, f, st, warp, lane);
}

}  // namespace prefill
}  // namespace mla_jit
