// mla_jit decode: the tiles of the sm_90a split-KV kernel (splitkv_ws.cuh): the TMA box geometry
// of a paged KV tile, the shared-memory layouts and wgmma shapes, and the small per-tile steps
// (tail zeroing, masking, the online softmax's row operations, the swizzled P store, the aligned
// shared-storage base).
#pragma once

#include "common.cuh"

namespace mla_jit {
namespace decode {

template <typename Element_, int HEAD_DIM_, int HEAD_DIM_V_, int PAGE_SIZE_, int BLOCK_M_, int BLOCK_N_>
struct Sm90DecodeTiles {
  using Element = Element_;
  static constexpr int HEAD_DIM = HEAD_DIM_;
  static constexpr int HEAD_DIM_V = HEAD_DIM_V_;
  static constexpr int PAGE_SIZE = PAGE_SIZE_;
  static constexpr int BLOCK_M = BLOCK_M_;
  static constexpr int BLOCK_N = BLOCK_N_;

  static_assert(BLOCK_M == 64, "one wgmma M tile per warpgroup");
  static_assert(BLOCK_N == 64, "tile = 64 tokens (metadata block_n must match)");
  static_assert(PAGE_SIZE >= 16 && PAGE_SIZE <= 256 && (PAGE_SIZE & (PAGE_SIZE - 1)) == 0, "page");
  static_assert(cute::is_same_v<Element, cutlass::bfloat16_t> || cute::is_same_v<Element, cutlass::half_t>,
                "bf16 or fp16");

  // TMA box: 64 columns (= 128 B, the SWIZZLE_128B span) x 1 head x kBoxRows tokens.
  static constexpr int kBoxCols = 64;
  static constexpr int kBoxRows = PAGE_SIZE < BLOCK_N ? PAGE_SIZE : BLOCK_N;
  static constexpr int kPagesPerTile = BLOCK_N / kBoxRows;  // 1 when a page holds >= 1 tile
  static constexpr int kColChunks = HEAD_DIM / kBoxCols;

  // All operand tiles are K-major with the 128B swizzle: atoms of 8 rows x 64 columns, stacked
  // row-major-of-atoms so that each 64-column chunk is a contiguous (rows x 128 B) slab, which is
  // exactly what one TMA box writes. Chunk c of a K tile starts at element c * BLOCK_N * 64.
  using SwAtom = decltype(cute::GMMA::Layout_K_SW128_Atom<Element>{});
  using SmemLayoutK = decltype(cute::tile_to_shape(SwAtom{}, cute::Shape<cute::Int<BLOCK_N>, cute::Int<HEAD_DIM>>{}));
  // One 64 x 64 slab: Q rope, K rope, P.
  using SmemLayoutSlab = decltype(cute::tile_to_shape(SwAtom{}, cute::Shape<cute::Int<64>, cute::Int<64>>{}));
  // V half seen as the (dv/2, tokens) B operand: MN-major view of the same K-major bytes.
  using SmemLayoutVHalf =
      decltype(cute::tile_to_shape(SwAtom{}, cute::Shape<cute::Int<BLOCK_N>, cute::Int<HEAD_DIM_V / 2>>{}));
  using SmemLayoutVtHalf = decltype(cute::composition(
      SmemLayoutVHalf{},
      cute::make_layout(cute::Shape<cute::Int<HEAD_DIM_V / 2>, cute::Int<BLOCK_N>>{}, cute::GenRowMajor{})));

  // A warpgroup's half of O += P V, both operands in smem.
  using TiledMmaO = decltype(cute::make_tiled_mma(
      cute::GMMA::ss_op_selector<Element, Element, float,
                                 cute::Shape<cute::Int<BLOCK_M>, cute::Int<HEAD_DIM_V / 2>, cute::Int<BLOCK_N>>,
                                 cute::GMMA::Major::K, cute::GMMA::Major::MN>()));

  static constexpr unsigned kTileBytes = BLOCK_N * HEAD_DIM * sizeof(Element);
  static constexpr unsigned kPageBytes = kBoxRows * HEAD_DIM * sizeof(Element);
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

}  // namespace detail
}  // namespace decode
}  // namespace mla_jit
