// mla_jit prefill: what both kernel families (fwd_sm90.cuh, fwd_sm80.cuh) share: the parameters
// and the work of a tile (which sequence, head and row block, which KV tiles).
//
// Tile order (tile_work): heads are cut into sections of heads_per_section heads whose K and V fit
// in about half the L2 together; a section's tiles run before the next section's, its row tiles
// from the last (causal: the most KV tiles) to the first, its heads fastest. So the CTAs running at
// once read the K / V of a few heads from L2 (every row tile of a head reads the same K / V), and
// within a section the long tiles go first and the short ones fill the tail.
//
#pragma once

namespace mla_jit {
namespace prefill {

// Runtime parameters of both kernel families (the sm_90a kernel reads q, k and v through TMA
// descriptors and ignores their pointers and strides). runtimes/prefill.py packs this struct
// (PREFILL_PARAMS); the CPU tests pin both to this size.
struct PrefillParams {
  const void* q;             // (total_q, h, D_QK)    } any token / head strides (elements),
  const void* k;             // (total_k, h_k, D_QK)  } last dim contiguous, 16-byte aligned rows
  const void* v;             // (total_k, h_k, D_V)   }
  long long q_stride_t, q_stride_h, k_stride_t, k_stride_h, v_stride_t, v_stride_h;
  void* out;                 // (total_q, h, D_V): any token / head stride, last dim contiguous
  float* lse;                // (h, total_q) natural log; nullptr: not written
  const int* cu_seqlens_q;   // (b + 1,)
  const int* cu_seqlens_k;   // (b + 1,)
  long long o_stride_t, o_stride_h;  // elements
  int b, h, q_per_kv;
  int total_q;              // rows of q / out: stores outside [0, total_q) are dropped (bad cu_seqlens_q)
  int num_m_blocks;          // row tiles of the longest sequence (gridDim.x = num_m_blocks * h)
  float scale_log2;          // softmax scale * log2(e)
  float scale;               // softmax scale (natural)
  int heads_per_section;     // the tile order's head sections (see above), >= 1
  int* tile_counter;         // sm_90a: {next tile, CTAs done}, zero at launch (the dynamic scheduler)
};
static_assert(sizeof(PrefillParams) == 160, "PrefillParams layout");

namespace detail {

// The work of one tile: BLOCK_M rows of one head of one sequence, and the KV tiles it visits.
struct TileWork {
  int head;        // query head
  int q0, len_q;   // first token of the sequence in q / out, its length
  int k0, len_k;   // the same in k / v
  int m_block;     // row tile (rows m_block * BLOCK_M ..)
  int n_tiles;     // KV tiles 0 .. n_tiles - 1 hold keys some row of the tile sees
  int mask_from;   // tiles n >= mask_from need the causal / sequence-end mask
};

// Tile t (0 .. num_m_blocks * h - 1, in the order above) of sequence bi.
template <typename Cfg>
__device__ __forceinline__ TileWork tile_work(const PrefillParams& p, int t, int bi) {
  TileWork w;
  w.q0 = p.cu_seqlens_q[bi];
  w.len_q = p.cu_seqlens_q[bi + 1] - w.q0;
  w.k0 = p.cu_seqlens_k[bi];
  w.len_k = p.cu_seqlens_k[bi + 1] - w.k0;
  const int per_section = p.heads_per_section * p.num_m_blocks;
  const int section = t / per_section, in_section = t - section * per_section;
  const int heads = min(p.heads_per_section, p.h - section * p.heads_per_section);   // the last one is short
  w.head = section * p.heads_per_section + in_section % heads;
  w.m_block = p.num_m_blocks - 1 - in_section / heads;
  const int row_first = w.m_block * Cfg::BLOCK_M;
  const int row_last = min(row_first + Cfg::BLOCK_M, w.len_q) - 1;
  // Keys visible to the tile's last row (bottom-right causal: row i sees keys < len_k - len_q + i + 1)
  // and to its first row (every tile past that one needs the mask).
  int end = w.len_k, full = w.len_k;
  if constexpr (Cfg::CAUSAL) {
    end = min(w.len_k, w.len_k - w.len_q + row_last + 1);
    full = min(w.len_k, w.len_k - w.len_q + row_first + 1);
  }
  w.n_tiles = end > 0 ? (end + Cfg::BLOCK_N - 1) / Cfg::BLOCK_N : 0;
  w.mask_from = max(full, 0) / Cfg::BLOCK_N;
  return w;
}

}  // namespace detail
}  // namespace prefill
}  // namespace mla_jit
