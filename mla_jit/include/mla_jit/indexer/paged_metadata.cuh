// mla_jit indexer: get_paged_mqa_logits_metadata. Cuts the 64-key tiles of every batch entry
// (tiles(b) = ceil(keys(b) / 64), keys(b) its longest row's) into num_ctas contiguous ranges of
// equal size (the first total % num_ctas one tile longer) and writes where each starts:
// schedule[c] = {batch, tile within it}, schedule[num_ctas] = {b, 0}. A start that falls on the
// end of an entry points at the next entry with tiles; with no tiles at all every row is {b, 0}.
//
// One CTA: thread i sums the tiles of a contiguous run of entries, a block scan gives each run's
// first tile, then each thread writes the starts that fall in its run.
#pragma once

#include "common.cuh"

namespace mla_jit {
namespace indexer {

constexpr int kMetadataThreads = 256;

// First c in [0, num_ctas] whose range starts at or after tile x (start(c) = c * q + min(c, r)).
__device__ __forceinline__ int first_cta_at(long long x, int num_ctas, long long q, long long r) {
  long long c;
  if (x <= r * (q + 1)) {
    c = (x + q) / (q + 1);   // ceil(x / (q + 1))
  } else {
    c = q == 0 ? num_ctas : r + (x - r * (q + 1) + q - 1) / q;
  }
  return int(c < num_ctas ? c : num_ctas);
}

__device__ __forceinline__ void paged_metadata_body(const MetadataParams& p) {
  __shared__ long long run_first[kMetadataThreads];
  const int tid = threadIdx.x;
  const int per = (p.b + kMetadataThreads - 1) / kMetadataThreads;
  const int b0 = min(p.b, tid * per), b1 = min(p.b, b0 + per);
  long long mine = 0;
  for (int bi = b0; bi < b1; ++bi) mine += (paged_keys(p.context_lens, bi, p.next_n, p.lens_2d) + kTileKeys - 1) / kTileKeys;
  run_first[tid] = mine;
  __syncthreads();
  // Inclusive scan (Hillis-Steele) of the runs' tile counts.
  for (int off = 1; off < kMetadataThreads; off <<= 1) {
    const long long add = tid >= off ? run_first[tid - off] : 0;
    __syncthreads();
    run_first[tid] += add;
    __syncthreads();
  }
  const long long total = run_first[kMetadataThreads - 1];
  long long first = run_first[tid] - mine;   // this run's first tile
  const long long q = total / p.num_ctas, r = total % p.num_ctas;
  int c = first_cta_at(first, p.num_ctas, q, r);
  for (int bi = b0; bi < b1 && c <= p.num_ctas; ++bi) {
    const long long n = (paged_keys(p.context_lens, bi, p.next_n, p.lens_2d) + kTileKeys - 1) / kTileKeys;
    for (; c <= p.num_ctas; ++c) {
      const long long start = c * q + (c < r ? c : r);
      if (start >= first + n || start >= total) break;
      p.schedule[2 * c] = bi;
      p.schedule[2 * c + 1] = int(start - first);
    }
    first += n;
  }
  // Starts at the very end (and every start when there are no tiles): {b, 0}.
  if (tid == 0) {
    for (int e = first_cta_at(total, p.num_ctas, q, r); e <= p.num_ctas; ++e) {
      p.schedule[2 * e] = p.b;
      p.schedule[2 * e + 1] = 0;
    }
  }
}

}  // namespace indexer
}  // namespace mla_jit
