// mla_jit decode: tile-scheduler metadata (one CTA, pure device, CUDA-graph capturable).
//
// Work unit = one block of `block_n` KV tokens. Each non-empty sequence costs
// ceil(L / block_n) blocks plus `fixed_overhead_blocks` per split it is cut into (Q load,
// epilogue, combine). Every SM part gets an equal payload; long sequences are split across
// parts, short ones stay whole. Zero-length sequences get no split (the combine kernel writes
// out = 0, lse = +inf for them).
//
// Output, per part p: meta[p] = {begin_batch, begin_token, end_batch, end_token (exclusive),
// begin_split_local, 0, 0, 0}. The part processes batches begin_batch..end_batch inclusive;
// batch i covers tokens [i == begin_batch ? begin_token : 0, i == end_batch ? end_token : L_i).
// Its split slot for batch i is num_splits[i] + (i == begin_batch ? begin_split_local : 0).
// A part without work has begin = end = (0, 0) -> empty range. num_splits[i] is the prefix sum
// (num_splits[0] = 0, num_splits[b] = total splits <= b + num_sm_parts).
#pragma once

#include "common.cuh"

namespace mla_jit {
namespace decode {

constexpr int kMetadataThreads = 128;

// Whole rows (sparse prefill, every sequence of length fixed_length > 0): part p takes sequences
// [p b / parts, (p + 1) b / parts), each in one split (num_splits[i] = i), so every row's out, lse and
// max_logits are written by the split-KV kernel itself; parts without a sequence get an empty range.
__device__ __forceinline__ void mla_metadata_whole_rows(const MetadataParams& p, int tid) {
  const int parts = p.num_sm_parts;
  for (int part = tid; part < parts; part += kMetadataThreads) {
    int* meta = p.tile_scheduler_metadata + part * kMetaSize;
    const int b0 = int((long long)part * p.b / parts), b1 = int((long long)(part + 1) * p.b / parts);
    const bool any = b0 < b1 && p.fixed_length > 0;
    meta[kMetaBeginBatch] = any ? b0 : 0;
    meta[kMetaBeginToken] = 0;
    meta[kMetaEndBatch] = any ? b1 - 1 : 0;
    meta[kMetaEndToken] = any ? p.fixed_length : 0;
    meta[kMetaBeginSplit] = 0;
    meta[5] = 0; meta[6] = 0; meta[7] = 0;
  }
  for (int i = tid; i <= p.b; i += kMetadataThreads) p.num_splits[i] = p.fixed_length > 0 ? i : 0;
}

__device__ __forceinline__ void mla_metadata_body(const MetadataParams& p) {
  __shared__ long long s_partial[kMetadataThreads / 32];
  const int tid = threadIdx.x;
  if (p.whole_rows) {
    mla_metadata_whole_rows(p, tid);
    return;
  }
  const int bn = p.block_n;
  const int ovh = p.fixed_overhead_blocks;

  // Total payload (parallel reduction; sequential greedy below is O(b + parts)).
  long long local = 0;
  for (int i = tid; i < p.b; i += kMetadataThreads) {
    const int L = max(sequence_length(p, i), 0);
    if (L > 0) local += (L - 1) / bn + 1 + ovh;  // ceil(L / bn) without L + bn - 1's int overflow
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) local += __shfl_xor_sync(0xffffffffu, local, o);
  if ((tid & 31) == 0) s_partial[tid >> 5] = local;
  __syncthreads();
  if (tid != 0) return;
  long long total = 0;
#pragma unroll
  for (int w = 0; w < kMetadataThreads / 32; ++w) total += s_partial[w];

  const int parts = p.num_sm_parts;
  const long long payload = (total + parts - 1) / parts + ovh;

  int cur_b = 0, cur_blk = 0, cur_split = 0;  // cursor: batch, first unassigned block, local split
  int prefix = 0;                              // num_splits prefix of batches already finished
  p.num_splits[0] = 0;
  for (int part = 0; part < parts; ++part) {
    int* meta = p.tile_scheduler_metadata + part * kMetaSize;
    // Skip empty sequences so that a part never starts on one.
    while (cur_b < p.b && sequence_length(p, cur_b) <= 0) {
      p.num_splits[cur_b + 1] = prefix;
      ++cur_b;
    }
    if (cur_b >= p.b) {
      meta[0] = 0; meta[1] = 0; meta[2] = 0; meta[3] = 0; meta[4] = 0;
      meta[5] = 0; meta[6] = 0; meta[7] = 0;
      continue;
    }
    meta[kMetaBeginBatch] = cur_b;
    meta[kMetaBeginToken] = cur_blk * bn;
    meta[kMetaBeginSplit] = cur_split;
    meta[5] = 0; meta[6] = 0; meta[7] = 0;
    // The last part absorbs any rounding leftover.
    long long remain = (part == parts - 1) ? (1ll << 62) : payload;
    int end_b = cur_b, end_tok = 0;
    while (cur_b < p.b) {
      const int L = sequence_length(p, cur_b);
      if (L <= 0) {  // empty sequence inside a part: no split
        p.num_splits[cur_b + 1] = prefix;
        ++cur_b;
        continue;
      }
      const int nblk = (L - 1) / bn + 1;  // (L > 0)
      const int left = nblk - cur_blk;
      if (remain >= (long long)left + ovh) {
        // Finish this sequence inside this part.
        remain -= left + ovh;
        prefix += cur_split + 1;
        p.num_splits[cur_b + 1] = prefix;
        end_b = cur_b;
        end_tok = L;
        ++cur_b;
        cur_blk = 0;
        cur_split = 0;
        if (remain <= ovh) break;  // no room for a useful piece of the next sequence
      } else {
        // Take what fits (at least one block: payload > ovh) and stop; the sequence goes on
        // in the next part as split cur_split + 1.
        const int take = (int)max(remain - ovh, 1ll);
        cur_blk += take;
        end_b = cur_b;
        end_tok = cur_blk * bn;
        ++cur_split;
        break;
      }
    }
    meta[kMetaEndBatch] = end_b;
    meta[kMetaEndToken] = end_tok;
  }
  // Trailing empty sequences (or all of them if there are more parts than work).
  for (; cur_b < p.b; ++cur_b) p.num_splits[cur_b + 1] = prefix;
}

}  // namespace decode
}  // namespace mla_jit
