// mla_jit indexer (DeepSeek V3.2's lightning indexer, DeepGEMM's fp8_mqa_logits and
// fp8_paged_mqa_logits): the parameters of the kernels, and the epilogue they share.
//
//   logits[row, key] = sum_h relu(q[row, h] . k[key]) * weights[row, h] * k_scale[key]
//
// The score tile is computed with keys as the wgmma M dimension (64 keys a warpgroup) and
// (query token, head) as N, so the sum over heads runs along a thread's own accumulator columns
// and then across the 4 lanes of a quad; k_scale (one per key, i.e. per accumulator row) is
// applied once per row after the sum (valid for the non-negative scales quantization produces).
#pragma once

#include <cuda/std/cstdint>
#include <cuda/std/limits>

namespace mla_jit {
namespace indexer {

using cuda::std::int32_t;
using cuda::std::uint32_t;

constexpr float kNegInf = -cuda::std::numeric_limits<float>::infinity();
constexpr int kTileKeys = 64;   // keys per tile (one warpgroup's wgmma M)

// fp8_mqa_logits (ragged keys). runtimes/indexer.py packs it (LOGITS_PARAMS).
struct LogitsParams {
  const int* ks;          // (m,) first key of each row (inclusive)
  const int* ke;          // (m,) last key of each row (exclusive)
  float* logits;          // rows of `stride` floats
  long long stride;       // floats between rows
  int m;                  // query tokens (rows)
  int n;                  // keys
  int num_q_blocks;       // ceil(m / BLOCK_Q)
  int num_chunks;         // key chunks a q block is cut into (work units: q block x chunk)
  int chunk_keys;         // keys per chunk, a multiple of kTileKeys
  int max_seqlen_k;       // > 0: compressed rows (column c = key ks[row] + c); 0: column = key
  int clean;              // full form: -inf outside [ks, ke) (every column < n)
  int pad_;
};
static_assert(sizeof(LogitsParams) == 64, "LogitsParams layout");

// fp8_paged_mqa_logits. runtimes/indexer.py packs it (PAGED_PARAMS).
struct PagedParams {
  const int* context_lens;   // (b,) or (b, next_n)
  const int* block_table;    // (b, max_blocks), row stride block_table_stride
  const int* schedule;       // (ctas + 1, 2): {batch, tile} where each CTA's work starts
  float* logits;             // (b * next_n) rows of `stride` floats
  long long stride;
  long long block_table_stride;
  int b, next_n;
  int max_blocks;            // columns of block_table: pages past it are not read
  int lens_2d;               // context_lens (b, next_n): row j sees keys < lens[b, j];
                             // else (b,): row j sees keys <= lens[b] - next_n + j
  int max_context_len;       // columns of the logits view
  int clean;                 // -inf in the columns past each row's keys (< max_context_len)
};
static_assert(sizeof(PagedParams) == 72, "PagedParams layout");

struct MetadataParams {
  const int* context_lens;
  int* schedule;             // (num_ctas + 1, 2)
  int b, next_n, lens_2d, num_ctas;
};
static_assert(sizeof(MetadataParams) == 32, "MetadataParams layout");

// Keys a paged batch entry spans: its longest row's (every row of the entry is computed over it).
__device__ __forceinline__ int paged_keys(const int* lens, int bi, int next_n, bool lens_2d) {
  if (!lens_2d) return max(lens[bi], 0);
  int len = 0;
  for (int j = 0; j < next_n; ++j) len = max(len, lens[bi * next_n + j]);
  return len;
}

// Keys row j of a paged batch entry sees: [0, limit).
__device__ __forceinline__ int paged_row_limit(const int* lens, int bi, int j, int next_n, bool lens_2d) {
  return lens_2d ? lens[bi * next_n + j] : lens[bi] - next_n + j + 1;
}

// ---- The epilogue: relu, head weights, sum over heads, per-key scale ----
//
// A warpgroup's 64 x N fp32 accumulator: element i of a thread sits at row
// warp * 16 + lane / 4 + 8 * ((i / 2) % 2) and column (i / 4) * 8 + 2 * (lane % 4) + i % 2. The
// N columns are Q query tokens of H heads each (column = q * H + h), H a multiple of 8, so each
// 8-column group belongs to one token. LIN > 0: relu's linear half comes from LIN more columns
// (indexer/linear_terms.cuh: token t's four q' terms in columns N + 4 t .. N + 4 t + 3), the head
// weights are halved and the heads' columns enter as |x|.
template <int N, int H, int LIN = 0>
struct HeadSum {
  static_assert(H % 8 == 0 && N % H == 0, "head count: a multiple of 8 dividing N");
  static constexpr int Q = N / H;                    // query tokens in the tile
  static constexpr int kWeights = N / 4;             // a thread's columns
  static constexpr int kQEven = Q == 1 ? 1 : (Q + 1) / 2 * 2;
  // Values a lane holds after the sum: tokens q = 2 m + ((lane >> 1) & 1) (Q > 1), or token 0
  // (Q == 1, lanes with bit 1 clear hold it), each at row half (lane & 1).
  static constexpr int kOut = Q == 1 ? 1 : kQEven / 2;
  // The linear columns: per 8-column group g (tokens 2 g, 2 g + 1), a thread's two columns, each
  // weighted into both tokens (its scale for the token it belongs to, 0 for the other).
  static_assert(LIN % 8 == 0 && LIN / 8 <= (Q + 1) / 2, "linear columns: 4 a token, whole groups");
  static constexpr int kLinWeights = LIN / 2;

  // Linear weight k of this thread (k = 4 g + 2 column + token): from scales[4 t + j] (s_j / 2).
  static __device__ __forceinline__ float lin_weight(int k, int lane, const float* scales) {
    const int g = k / 4, col = 2 * (lane % 4) + (k / 2) % 2, tok = k % 2;
    return tok == col / 4 ? scales[4 * (2 * g + tok) + col % 4] : 0.f;
  }

  // Weight of accumulator element i's column, as index into the thread's kWeights.
  static __device__ __forceinline__ constexpr int weight_index(int i) { return (i / 4) * 2 + i % 2; }
  // Column of weight w of this thread (the load side).
  static __device__ __forceinline__ int weight_column(int w, int lane) { return (w / 2) * 8 + 2 * (lane % 4) + w % 2; }

  // Token of the lane's value m (see kOut).
  static __device__ __forceinline__ int out_token(int m, int lane) { return Q == 1 ? 0 : 2 * m + ((lane >> 1) & 1); }
  // Row half (0: row lane / 4, 1: row lane / 4 + 8 of the warp's 16) of the lane's values.
  static __device__ __forceinline__ int out_half(int lane) { return lane & 1; }
  // Whether the lane's values are its own (Q == 1 leaves duplicates on lanes with bit 1 set).
  static __device__ __forceinline__ bool out_owner(int lane) { return Q > 1 || ((lane >> 1) & 1) == 0; }

  // acc: N / 2 accumulator values; w: kWeights head weights; scale[h]: k_scale of the thread's row
  // half h. out: kOut sums (see above).
  template <typename Acc>
  static __device__ __forceinline__ void run(const Acc& acc, const float (&w)[kWeights], const float (&scale)[2],
                                             float (&out)[kOut], int lane) {
    static_assert(LIN == 0, "the linear columns need their weights");
    run(acc, w, nullptr, scale, out, lane);
  }

  // wl: kLinWeights linear weights (LIN > 0; lin_weight).
  template <typename Acc>
  static __device__ __forceinline__ void run(const Acc& acc, const float (&w)[kWeights], const float* wl,
                                             const float (&scale)[2], float (&out)[kOut], int lane) {
    float part[kQEven][2];
#pragma unroll
    for (int q = 0; q < kQEven; ++q) part[q][0] = part[q][1] = 0.f;
#pragma unroll
    for (int i = 0; i < N / 2; ++i) {
      const int q = ((i / 4) * 8) / H;
      const float x = LIN > 0 ? fabsf(acc(i)) : fmaxf(acc(i), 0.f);
      part[q][(i / 2) % 2] = fmaf(x, w[weight_index(i)], part[q][(i / 2) % 2]);
    }
#pragma unroll
    for (int i = 0; i < LIN / 2; ++i) {   // group g = i / 4: value i % 2's column, row half (i / 2) % 2
      const int g = i / 4, h = (i / 2) % 2, k = 4 * g + 2 * (i % 2);
      part[2 * g][h] = fmaf(acc(N / 2 + i), wl[k], part[2 * g][h]);
      if (2 * g + 1 < kQEven) part[2 * g + 1][h] = fmaf(acc(N / 2 + i), wl[k + 1], part[2 * g + 1][h]);
    }
    const bool odd = lane & 1;
    float half[kQEven];   // reduce-scatter over lane bit 0: keep row half (lane & 1)
#pragma unroll
    for (int q = 0; q < kQEven; ++q) {
      const float keep = (odd ? part[q][1] : part[q][0]) * (odd ? scale[1] : scale[0]);
      const float send = (odd ? part[q][0] : part[q][1]) * (odd ? scale[0] : scale[1]);
      half[q] = keep + __shfl_xor_sync(0xffffffffu, send, 1);
    }
    if constexpr (Q == 1) {
      out[0] = half[0] + __shfl_xor_sync(0xffffffffu, half[0], 2);
    } else {
      const bool hi = (lane >> 1) & 1;   // reduce-scatter over lane bit 1: keep tokens of parity hi
#pragma unroll
      for (int m = 0; m < kOut; ++m) {
        const float keep = hi ? half[2 * m + 1] : half[2 * m];
        const float send = hi ? half[2 * m] : half[2 * m + 1];
        out[m] = keep + __shfl_xor_sync(0xffffffffu, send, 2);
      }
    }
  }
};

}  // namespace indexer
}  // namespace mla_jit
