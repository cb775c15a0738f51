// mla_jit decode: the tiles of the sm_90a split-KV kernel (splitkv_ws.cuh): the TMA box geometry
// of a paged KV tile, the shared-memory layouts and wgmma shapes, and the small per-tile steps
// (tail zeroing, masking, the online softmax's row operations, the swizzled P store, the aligned
// shared-storage base).
#pragma once

#include "common.cuh"

namespace mla_jit {
namespace decode {

// The P V operands (16-bit): V is the MN-major view of the K tile's first HEAD_DIM_V columns (no
// copy). e4m3 has none here: FP8 wgmma takes K-major operands only, and the kernel computes O^T =
// V^T P^T with V^T in registers instead (splitkv_ws.cuh, ws_pv_tile_regs).
template <typename Element, int BLOCK_M, int BLOCK_N, int HEAD_DIM_V, typename SwAtom,
          bool kFp8 = cute::is_same_v<Element, cutlass::float_e4m3_t>>
struct Sm90PvOperands {
  using SmemLayoutVHalf =
      decltype(cute::tile_to_shape(SwAtom{}, cute::Shape<cute::Int<BLOCK_N>, cute::Int<HEAD_DIM_V / 2>>{}));
  using SmemLayoutVtHalf = decltype(cute::composition(
      SmemLayoutVHalf{},
      cute::make_layout(cute::Shape<cute::Int<HEAD_DIM_V / 2>, cute::Int<BLOCK_N>>{}, cute::GenRowMajor{})));
  using TiledMmaO = decltype(cute::make_tiled_mma(
      cute::GMMA::ss_op_selector<Element, Element, float,
                                 cute::Shape<cute::Int<BLOCK_M>, cute::Int<HEAD_DIM_V / 2>, cute::Int<BLOCK_N>>,
                                 cute::GMMA::Major::K, cute::GMMA::Major::MN>()));
};
template <typename Element, int BLOCK_M, int BLOCK_N, int HEAD_DIM_V, typename SwAtom>
struct Sm90PvOperands<Element, BLOCK_M, BLOCK_N, HEAD_DIM_V, SwAtom, true> {  // (none in shared memory)
  using SmemLayoutVtHalf = void;
  using TiledMmaO = void;
};

template <typename Element_, int HEAD_DIM_, int HEAD_DIM_V_, int PAGE_SIZE_, int BLOCK_M_, int BLOCK_N_,
          bool KV_FP8_ = false>
struct Sm90DecodeTiles {
  using Element = Element_;
  static constexpr int HEAD_DIM = HEAD_DIM_;
  static constexpr int HEAD_DIM_V = HEAD_DIM_V_;
  static constexpr int PAGE_SIZE = PAGE_SIZE_;
  static constexpr int BLOCK_M = BLOCK_M_;
  static constexpr int BLOCK_N = BLOCK_N_;
  // e4m3 q and cache (FP8 wgmma, out in bf16), or 16-bit q, cache and out.
  static constexpr bool kFp8 = cute::is_same_v<Element, cutlass::float_e4m3_t>;
  using OutElement = cute::conditional_t<kFp8, cutlass::bfloat16_t, Element>;
  // 16-bit q and out over an e4m3 cache: each tile lands as e4m3 in a landing slot and is
  // de-quantized into its 16-bit stage (dequant_kv_tile_e4m3); everything after is the 16-bit kernel.
  static constexpr bool kKvFp8 = KV_FP8_;
  static_assert(!(kKvFp8 && kFp8), "KV_FP8: a 16-bit q over an e4m3 cache");
  static constexpr int kKvBytes = (kFp8 || kKvFp8) ? 1 : 2;  // bytes of a cache element

  static_assert(BLOCK_M == 64, "one wgmma M tile per warpgroup");
  static_assert(BLOCK_N == 64, "tile = 64 tokens (metadata block_n must match)");
  static_assert(PAGE_SIZE >= 16 && PAGE_SIZE <= 256 && (PAGE_SIZE & (PAGE_SIZE - 1)) == 0, "page");
  static_assert(cute::is_same_v<Element, cutlass::bfloat16_t> || cute::is_same_v<Element, cutlass::half_t> || kFp8,
                "bf16, fp16 or e4m3");

  // TMA box: 64 columns x 1 head x kBoxRows tokens; 64 columns are the swizzle span (128 B of
  // 16-bit elements with the 128B swizzle, 64 B of e4m3 with the 64B swizzle).
  static constexpr int kBoxCols = 64;
  static constexpr int kChunkRowBytes = kBoxCols * int(sizeof(Element));  // a row of a 64-column chunk
  static constexpr int kBoxRows = PAGE_SIZE < BLOCK_N ? PAGE_SIZE : BLOCK_N;
  static constexpr int kPagesPerTile = BLOCK_N / kBoxRows;  // 1 when a page holds >= 1 tile
  static constexpr int kColChunks = HEAD_DIM / kBoxCols;

  // All operand tiles are K-major and swizzled over their 64 columns: atoms of 8 rows x 64
  // columns, stacked row-major-of-atoms so that each 64-column chunk is a contiguous (rows x
  // kChunkRowBytes) slab, which is exactly what one TMA box writes. Chunk c of a K tile starts at
  // element c * BLOCK_N * 64.
  using SwAtom = cute::conditional_t<kFp8, decltype(cute::GMMA::Layout_K_SW64_Atom<Element>{}),
                                     decltype(cute::GMMA::Layout_K_SW128_Atom<Element>{})>;
  using SmemLayoutK = decltype(cute::tile_to_shape(SwAtom{}, cute::Shape<cute::Int<BLOCK_N>, cute::Int<HEAD_DIM>>{}));
  // One 64 x 64 slab: Q rope, K rope, P.
  using SmemLayoutSlab = decltype(cute::tile_to_shape(SwAtom{}, cute::Shape<cute::Int<64>, cute::Int<64>>{}));
  // A warpgroup's half of O += P V (both operands in smem) and its V operand, (dv/2, tokens).
  using PvOperands = Sm90PvOperands<Element, BLOCK_M, BLOCK_N, HEAD_DIM_V, SwAtom>;
  using SmemLayoutVtHalf = typename PvOperands::SmemLayoutVtHalf;
  using TiledMmaO = typename PvOperands::TiledMmaO;

  static constexpr unsigned kStageBytes = BLOCK_N * HEAD_DIM * sizeof(Element);  // a stage in smem
  // What the TMA writes: a tile / a page of it (a chunk is BLOCK_N x 64 cache elements, kKvBytes each).
  static constexpr unsigned kTileBytes = BLOCK_N * HEAD_DIM * kKvBytes;
  static constexpr unsigned kPageBytes = kBoxRows * HEAD_DIM * kKvBytes;
};

namespace detail {

// Keys a query row sees in a tile of a sequence of length L: all, or bottom-right causal
// (query s sees keys < L - s_q + s + 1).
__device__ __forceinline__ int visible_keys(const DecodeParams& p, int L, int r) {
  return p.causal ? min(L, L - p.s_q + r / p.q_per_kv + 1) : L;
}

// Issues (and commits) a warpgroup's half of O (+)= P V: P a 64 x 64 slab, V the warpgroup's
// HEAD_DIM_V / 2 columns of a K tile in smem, O the half's accumulator. fresh: O = P V (the first
// tile of a piece; no explicit clear of O, whose loop-carried select would double its registers).
template <typename Cfg, typename TiledMmaO, typename Frag>
__device__ __forceinline__ void issue_pv_half(TiledMmaO& mma_o, int tw, typename Cfg::Element* p_slab,
                                              typename Cfg::Element* v_half, Frag& o, bool fresh) {
  using namespace cute;
  auto thr_o = mma_o.get_thread_slice(tw);
  Tensor sP = make_tensor(make_smem_ptr(p_slab), typename Cfg::SmemLayoutSlab{});
  Tensor tOrP = thr_o.partition_fragment_A(sP);
  Tensor sVt = make_tensor(make_smem_ptr(v_half), typename Cfg::SmemLayoutVtHalf{});
  Tensor tOrV = thr_o.partition_fragment_B(sVt);
  warpgroup_fence_operand(o);
  warpgroup_arrive();
  mma_o.accumulate_ = fresh ? GMMA::ScaleOut::Zero : GMMA::ScaleOut::One;
#pragma unroll
  for (int k = 0; k < size<2>(tOrP); ++k) {
    gemm(mma_o, tOrP(_, _, k), tOrV(_, _, k), o);
    mma_o.accumulate_ = GMMA::ScaleOut::One;
  }
  warpgroup_commit_batch();
}

// ---- e4m3 P V: the token order of P's columns and V^T's columns ----
// FP8 wgmma reads both operands K-major, so V (tokens x dv in the cache) is transposed on chip, into
// the registers of the A operand of O^T = V^T P^T (splitkv_ws.cuh, ws_load_vt_kstep). ldmatrix .trans
// (16-bit elements) does most of it: per 8 x 16-byte matrix it gives lane l (p = l / 4, q = l % 4)
// dv bytes (2p, 2p + 1) of tokens (2q, 2q + 1); two byte permutes per register pair then give 4
// tokens of one dv byte. The tokens come out in a fixed order: slot 4q + {0, 1, 2, 3} of each
// 16-token group holds tokens 2q, 2q + 1, 8 + 2q, 9 + 2q. P V sums over tokens, so P's columns are
// stored in the same slot order and the product is unchanged.

// Byte offset of (row r, byte column c) in a K-major 64-byte-row tile with the 64B swizzle
// (CuTe's Layout_K_SW64_Atom for 8-bit elements: 16-byte chunk c / 16 XOR (r / 2) % 4).
__device__ __forceinline__ uint32_t sw64_offset(int r, int c) {
  return uint32_t(r * 64 + ((((c >> 4) ^ (r >> 1)) & 3) << 4) + (c & 15));
}

// P (thread tw's part of a 64 x 64 fp32 accumulator fragment) as e4m3 into a 64 x 64 K-major SW64
// slab, columns in the slot order above. Tokens 8j + c, + 1 (j even) and 8j + 8 + c, + 1 (c =
// col_lane) land in slots 16 (j / 2) + 2c .. + 3: one 32-bit word, and the words of 8 rows in one
// 16-byte chunk are an 8 x 8 16-bit matrix in stmatrix's fragment order. So a warp's 16 rows x 4
// chunks are two stmatrix .x4 (matrix m: rows + 8 (m & 1), chunk 2q + (m >> 1)): 16 scattered
// 16-bit stores and their per-tile address arithmetic took ~150 instructions of the softmax
// warpgroup's chain.
template <typename Frag>
__device__ __forceinline__ void store_p_e4m3_sw64(uint32_t slab, int tw, const Frag& s) {
  static_assert(cute::size(Frag{}) == 32, "a 64 x 64 accumulator fragment");
  const int lane = tw % 32, m = lane / 8;
  const int row = (tw / 32) * 16 + (m & 1) * 8 + lane % 8;  // the row this lane addresses
  const uint32_t row_addr = slab + uint32_t(row * 64);
  const int sw = (row >> 1) & 3;                            // SW64: chunk index XOR (row / 2) % 4
  auto word = [&](int k, int h) -> uint32_t {               // chunk k, row half h of this thread
    const int j = 2 * k;
    return uint32_t(pack_e4m3x2(s(j * 4 + h * 2), s(j * 4 + h * 2 + 1))) |
           (uint32_t(pack_e4m3x2(s(j * 4 + 4 + h * 2), s(j * 4 + 5 + h * 2))) << 16);
  };
#pragma unroll
  for (int q = 0; q < 2; ++q) {
    const uint32_t addr = row_addr + uint32_t((((2 * q + (m >> 1)) ^ sw) & 3) << 4);
    stmatrix_x4(addr, word(2 * q, 0), word(2 * q, 1), word(2 * q + 1, 0), word(2 * q + 1, 1));
  }
}

// Compact rows (a thread's row0 + 8 is padding): warp w's rows 16w .. 16w + 7 (query rows 8w ..
// 8w + 7) go to slab rows 8w .. 8w + 7 of a 32-row slab, the P^T operand of an N = 32 P V. One
// stmatrix .x4: matrix m is chunk m of the 8 rows.
template <typename Frag>
__device__ __forceinline__ void store_p_e4m3_compact_sw64(uint32_t slab, int tw, const Frag& s) {
  static_assert(cute::size(Frag{}) == 32, "a 64 x 64 accumulator fragment");
  const int lane = tw % 32, m = lane / 8;
  const int row = (tw / 32) * 8 + lane % 8;
  const int sw = (row >> 1) & 3;
  auto word = [&](int k) -> uint32_t {
    const int j = 2 * k;
    return uint32_t(pack_e4m3x2(s(j * 4), s(j * 4 + 1))) | (uint32_t(pack_e4m3x2(s(j * 4 + 4), s(j * 4 + 5))) << 16);
  };
  stmatrix_x4(slab + uint32_t(row * 64 + (((m ^ sw) & 3) << 4)), word(0), word(1), word(2), word(3));
}

// Token half t (columns 32 t .. 32 t + 31) of P as store_p_e4m3_sw64 / _compact_sw64 store it, from
// the half's 16-element fragment h_frag (element i: column 32 t + (i / 4) 8 + col_lane + i % 2).
template <typename Frag>
__device__ __forceinline__ void store_p_e4m3_sw64_half(uint32_t slab, int tw, const Frag& hs, int t) {
  static_assert(cute::size(Frag{}) == 16, "a 64 x 32 accumulator fragment");
  const int lane = tw % 32, m = lane / 8;
  const int row = (tw / 32) * 16 + (m & 1) * 8 + lane % 8;
  const uint32_t row_addr = slab + uint32_t(row * 64);
  const int sw = (row >> 1) & 3;
  auto word = [&](int kk, int h) -> uint32_t {  // chunk 2 t + kk of the 16-column chunks, row half h
    return uint32_t(pack_e4m3x2(hs(8 * kk + h * 2), hs(8 * kk + h * 2 + 1))) |
           (uint32_t(pack_e4m3x2(hs(8 * kk + 4 + h * 2), hs(8 * kk + 5 + h * 2))) << 16);
  };
  const uint32_t addr = row_addr + uint32_t((((2 * t + (m >> 1)) ^ sw) & 3) << 4);
  stmatrix_x4(addr, word(0, 0), word(0, 1), word(1, 0), word(1, 1));
}
template <typename Frag>
__device__ __forceinline__ void store_p_e4m3_compact_sw64_half(uint32_t slab, int tw, const Frag& hs, int t) {
  static_assert(cute::size(Frag{}) == 16, "a 64 x 32 accumulator fragment");
  const int lane = tw % 32, m = (lane / 8) & 1;   // lanes 16-31: addresses unused by .x2
  const int row = (tw / 32) * 8 + lane % 8;
  const int sw = (row >> 1) & 3;
  auto word = [&](int kk) -> uint32_t {
    return uint32_t(pack_e4m3x2(hs(8 * kk), hs(8 * kk + 1))) | (uint32_t(pack_e4m3x2(hs(8 * kk + 4), hs(8 * kk + 5))) << 16);
  };
  stmatrix_x2(slab + uint32_t(row * 64 + ((((2 * t + m) ^ sw) & 3) << 4)), word(0), word(1));
}

// ---- 16-bit q over an e4m3 cache ----
// The e4m3 tile (BN tokens x kChunks 64-column chunks, SW64 slabs of 64-byte rows) in a landing slot
// at `src`, as the 16-bit tile the 16-bit kernel reads (SW128 slabs of 128-byte rows) at `dst`,
// exactly, by the 256 threads of the P V warpgroups (t = 0 .. 255: row t / 4, 16 bytes t % 4 of each
// chunk row). Rows >= valid become 0 without being read: past a sequence's end they may hold NaN or
// stale bytes. Not unrolled: the P V warpgroups hold O in nearly all of their registers (unrolled by
// 2, or with the next chunk's load ahead, ptxas spills there).
template <typename Element, int BN, int kChunks>
__device__ __forceinline__ void dequant_kv_tile_e4m3(uint32_t src, uint32_t dst, int valid, int t) {
  static_assert(BN == 64, "a row per 4 threads");
  const int r = t / 4, u = t % 4;
  const uint32_t from = src + sw64_offset(r, 16 * u);
  const uint32_t to_lo = dst + uint32_t(r * 128 + (((2 * u) ^ (r & 7)) << 4));
  const uint32_t to_hi = dst + uint32_t(r * 128 + (((2 * u + 1) ^ (r & 7)) << 4));
  const bool keep = r < valid;
#pragma unroll 1
  for (int c = 0; c < kChunks; ++c) {
    uint4 x = make_uint4(0u, 0u, 0u, 0u);
    if (keep) x = ld_shared_v4(from + c * BN * 64);
    const uint4 lo = make_uint4(e4m3x2_to_16bit<Element>(x.x), e4m3x2_to_16bit<Element>(x.x >> 16),
                                e4m3x2_to_16bit<Element>(x.y), e4m3x2_to_16bit<Element>(x.y >> 16));
    const uint4 hi = make_uint4(e4m3x2_to_16bit<Element>(x.z), e4m3x2_to_16bit<Element>(x.z >> 16),
                                e4m3x2_to_16bit<Element>(x.w), e4m3x2_to_16bit<Element>(x.w >> 16));
    st_shared_v4(to_lo + c * BN * 128, lo);
    st_shared_v4(to_hi + c * BN * 128, hi);
  }
}

}  // namespace detail
}  // namespace decode
}  // namespace mla_jit
