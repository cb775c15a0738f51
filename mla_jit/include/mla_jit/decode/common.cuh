// mla_jit decode: shared parameter structs and small PTX helpers.
// NVRTC-safe: no host headers; only CUTLASS/CuTe device headers are used by the kernels.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/numeric_types.h>
#include <cuda/std/limits>

#include "mla_jit/common/sm90.cuh"
#include "mla_jit/common/sm90_fragment.cuh"
#include "mla_jit/common/trace.cuh"

namespace mla_jit {
namespace decode {

// Columns of the trace tables (MLA_JIT_TRACE builds; common/trace.cuh): times in ns of
// %globaltimer unless noted. Split-KV kernel (ws schedule):
enum TraceSplitKV {
  kTraceEntry = 0,      // thread 0 at entry
  kTraceTile0 = 1,      // WG0 saw the CTA's first KV tile landed (it had its first Q before)
  kTraceFirstQ = 2,     // WG0 has its first Q (loads landed, smem part published)
  kTraceWg0Done = 3,    // WG0 left its tile loop
  kTracePvDone = 4,     // both P V warpgroups left theirs (the later of the two)
  kTraceExit = 5,       // thread 0 at exit (after the fused combine)
  kTraceTiles = 6,      // value: KV tiles of this CTA
  kTraceSmId = 7,       // value: %smid
};
// Combine kernel:
enum TraceCombine {
  kTraceCombineEntry = 0,   // thread 0 at entry
  kTraceCombineGo = 1,      // thread 0 past the wait for the split-KV grid
  kTraceCombineDone = 2,    // thread 0 after its rows (CTAs that merge splits)
  kTraceCombineSplits = 3,  // value: splits of the CTA's batch
};

// Runtime parameters of the split-KV and combine kernels. Strides are in elements.
struct DecodeParams {
  const void* q;                 // (b, s_q, h_q, d), last dim contiguous
  void* out;                     // (b, s_q, h_q, dv) contiguous, q dtype (bf16 for e4m3 q)
  float* lse;                    // (b, h_q, s_q) contiguous, natural log
  float* o_accum;                // [total_splits][h_kv][rows][dv] float32
  float* lse_accum;              // [total_splits][h_kv][rows] float32, log2 domain
  const int* block_table;        // (b, max_blocks_per_seq), row stride block_table_stride
  const int* cache_seqlens;      // (b,)
  const int* tile_scheduler_metadata;  // [num_sm_parts][8]
  const int* num_splits;         // [b + 1] prefix sums
  long long q_stride_b, q_stride_s, q_stride_h;
  long long block_table_stride;
  int b, s_q, h_q, h_kv, q_per_kv, rows;  // rows = s_q * q_per_kv
  int num_sm_parts, max_blocks_per_seq;
  float scale;       // softmax scale (natural)
  float scale_log2;  // scale * log2(e)
  int causal;
  // Rows bi of q / out are (batch bi / lse_fold, query position bi % lse_fold) of lse (b, h_q, s_q):
  // the sparse decode flattens (b, s_q) into its batch of single-token rows (s_q = 1 here, lse_fold =
  // the caller's s_q); 1 for dense decode.
  int lse_fold;
  // Fused combine (ws schedule): one arrival counter per (batch, KV head, row tile), zero between
  // launches (the CTA that completes a batch's count resets it). Unused by the other kernels.
  int* combine_counters;
  // e4m3 q and cache: per-tensor descales (float32 (1,) on the GPU; nullptr for 16-bit kernels).
  const float* descale_q;
  const float* descale_k;
  // Sparse (DSA) decode over FP8 records (nullptr / 0 otherwise). block_table holds the indices
  // ((b * s_q, topk) rows of stride block_table_stride; -1 or >= kv_tokens: invalid).
  const int* topk_length;     // (b,) of the caller's batch, or nullptr (topk everywhere)
  const float* attn_sink;     // (h_q,) or nullptr
  long long kv_block_stride;  // bytes between cache pages (bf16 rows: between rows)
  int topk;
  int kv_tokens;              // num_blocks * page_size (bf16 rows: s_kv)
  // Sparse prefill: (rows, h_q) float32, each row's largest scaled logit (natural units, -inf for
  // no valid key), written where a row has a single split (always, under a whole-rows schedule).
  float* max_logits;          // or nullptr
};
// runtimes/decode.py packs this struct (DECODE_PARAMS); the CPU tests pin both to this size.
static_assert(sizeof(DecodeParams) == 216, "DecodeParams layout");

// Offset in lse (b, h_q, s_q) of row (bi, head, s) of the kernels' batch; kFolded (sparse decode):
// bi is a flattened (b, s_q) row (see lse_fold), the division only there.
template <bool kFolded = false>
__device__ __forceinline__ long long lse_index(const DecodeParams& p, int bi, int head, int s) {
  if constexpr (kFolded) {
    const int b = bi / p.lse_fold, s_fold = bi - b * p.lse_fold;
    return ((long long)b * p.h_q + head) * p.lse_fold + s_fold;  // (the kernels' s_q is 1)
  } else {
    return ((long long)bi * p.h_q + head) * p.s_q + s;
  }
}

// The attention sink's factor on out of a row of head `head` with log-sum-exp lse2 (log2 units):
// exp(lse) / (exp(lse) + exp(sink)); 1 without a sink. (lse2 = -inf: 0, and out is 0 anyway.)
__device__ __forceinline__ float sink_factor(const DecodeParams& p, int head, float lse2) {
  if (p.attn_sink == nullptr) return 1.f;
  return 1.f / (1.f + exp2f(fmaf(__ldg(p.attn_sink + head), 1.44269504088896341f, -lse2)));
}

// Parameters of the scheduler-metadata kernel.
struct MetadataParams {
  const int* cache_seqlens;      // (b,); unused when fixed_length >= 0
  int* tile_scheduler_metadata;  // [num_sm_parts][8]
  int* num_splits;               // [b + 1]
  int b, num_sm_parts, block_n, fixed_overhead_blocks;
  int fixed_length;              // >= 0: every sequence has this length (sparse decode: topk); -1: cache_seqlens
  int whole_rows;                // != 0 (with fixed_length): no splits, each part a run of whole sequences
};

__device__ __forceinline__ int sequence_length(const MetadataParams& p, int i) {
  return p.fixed_length >= 0 ? p.fixed_length : p.cache_seqlens[i];
}

// Metadata row layout (int32 x 8 per SM part).
enum : int {
  kMetaBeginBatch = 0, kMetaBeginToken = 1, kMetaEndBatch = 2, kMetaEndToken = 3,
  kMetaBeginSplit = 4, kMetaSize = 8
};

// Whether a part's metadata range [begin, end) holds any token (a part without work is all zero).
__device__ __forceinline__ bool meta_has_range(const int* meta) {
  return meta[kMetaEndBatch] > meta[kMetaBeginBatch] || meta[kMetaEndToken] > meta[kMetaBeginToken];
}

// Query row r of KV head g (rows of a head group are s-major: r = s * q_per_kv + local head):
// its query position s and its head in q / out.
struct QueryRow {
  int s, head;
};
__device__ __forceinline__ QueryRow query_row(const DecodeParams& p, int g, int r) {
  const int s = r / p.q_per_kv;
  return {s, g * p.q_per_kv + (r - s * p.q_per_kv)};
}

// Where a finished piece of batch bi goes: out / lse when the batch has a single split, else split
// slot num_splits[bi] + local of o_accum / lse_accum (local: the CTA's first split index in its
// first batch, 0 otherwise).
struct PieceDest {
  bool single;
  int slot;
  int first;   // the batch's first split slot (num_splits[bi])
  int count;   // its number of splits
};
__device__ __forceinline__ PieceDest piece_dest(const DecodeParams& p, int bi, int local) {
  const int ns0 = p.num_splits[bi];
  const int count = p.num_splits[bi + 1] - ns0;
  return {count == 1, ns0 + local, ns0, count};
}

// LSE of query row r (KV head g) of a finished piece of batch bi, given in log2 units (-inf: the
// row saw no key): the natural log into lse (+inf for no key) when the batch has a single split,
// else the log2 partial into lse_accum for the combine kernel.
template <bool kFolded = false>
__device__ __forceinline__ void store_piece_lse(const DecodeParams& p, PieceDest dest, int bi, int g, int r,
                                                float lse2) {
  if (dest.single) {
    const auto [s, head] = query_row(p, g, r);
    p.lse[lse_index<kFolded>(p, bi, head, s)] = lse2 == -kInf ? kInf : lse2 * 0.69314718055994530942f;
  } else {
    p.lse_accum[((long long)dest.slot * p.h_kv + g) * p.rows + r] = lse2;
  }
}

// Sparse prefill: the largest scaled logit of query row r (KV head g) of batch bi, given as the
// running max m2 in log2 units, into max_logits (natural units) when the batch has a single split.
__device__ __forceinline__ void store_max_logit(const DecodeParams& p, PieceDest dest, int bi, int g, int r, float m2) {
  if (p.max_logits == nullptr || !dest.single) return;
  const auto [s, head] = query_row(p, g, r);
  p.max_logits[lse_index<true>(p, bi, head, s)] = m2 * 0.69314718055994530942f;
}

namespace detail {

// Cursor over the tiles of one CTA's work range (the scheduler metadata walk shared by the
// split-KV kernels): batch bi, tile start tok, piece [start, stop).
struct WorkCursor {
  int bi = 0, tok = 0, stop = 0, L = 0;
  int begin_b = 0, begin_tok = 0, end_b = -1, end_tok = 0;

  __device__ __forceinline__ bool valid() const { return bi <= end_b; }

  // Moves to the first non-empty piece at or after batch `b`. seqlens: cache_seqlens, or anything
  // indexable (the sparse kernels' fixed topk).
  template <typename Lens>
  __device__ __forceinline__ void seek(Lens seqlens, int b) {
    for (bi = b; bi <= end_b; ++bi) {
      L = max(seqlens[bi], 0);
      const int start = bi == begin_b ? begin_tok : 0;
      stop = bi == end_b ? min(end_tok, L) : L;
      if (start < stop) {
        tok = start;
        return;
      }
    }
  }
  template <typename Lens>
  __device__ __forceinline__ void init(const int* meta, Lens seqlens) {
    begin_b = meta[kMetaBeginBatch];
    begin_tok = meta[kMetaBeginToken];
    end_b = meta[kMetaEndBatch];
    end_tok = meta[kMetaEndToken];
    seek(seqlens, begin_b);
  }
  // Returns true when the tile just left was the last one of its piece.
  template <int BLOCK_N, typename Lens>
  __device__ __forceinline__ bool advance(Lens seqlens) {
    tok += BLOCK_N;
    if (tok < stop) return false;
    seek(seqlens, bi + 1);
    return true;
  }
};

}  // namespace detail

}  // namespace decode
}  // namespace mla_jit
