// mla_jit decode: combine split-KV partial results by log-sum-exp.
//
// Grid (b, h_kv, ceil(rows / kCombineRowsPerCta)), block kCombineThreads, no dynamic smem.
// One warp per query row; each lane owns HEAD_DIM_V / 32 consecutive-by-float4 columns.
// Batches with exactly one split return at once (the split-KV kernel wrote out/lse);
// zero-split (empty) batches get out = 0, lse = +inf.
// Launch with programmatic dependent launch after the split-KV kernel: griddepcontrol.wait
// precedes every read of data the split-KV kernel writes (num_splits, from the metadata kernel,
// is read before it).
#pragma once

#include "common.cuh"

namespace mla_jit {
namespace decode {

constexpr int kCombineRowsPerCta = 8;
constexpr int kCombineThreads = kCombineRowsPerCta * 32;

// Merges the splits of query row r (KV head g) of batch bi into out / lse, by one warp (lane):
// nothing for a single-split batch (the split-KV kernel wrote it), out = 0 / lse = +inf for an
// empty one. kWrittenByThisGrid: the partials were written by other CTAs of the calling grid (the
// fused combine), so they are read through L2 (ld.global.cg) rather than the read-only path.
template <typename Element, int HEAD_DIM_V, bool kWrittenByThisGrid, bool kSparse = false>
__device__ __forceinline__ void combine_row(const DecodeParams& p, int bi, int g, int r, int lane) {
  static_assert(HEAD_DIM_V % 128 == 0, "one float4 per lane per 128 columns");
  constexpr int kVecPerLane = HEAD_DIM_V / 128;
  auto load_f = [](const float* ptr) { return kWrittenByThisGrid ? __ldcg(ptr) : *ptr; };
  auto load_f4 = [](const float4* ptr) { return kWrittenByThisGrid ? __ldcg(ptr) : __ldg(ptr); };
  const int split_begin = p.num_splits[bi];
  const int nsplit = p.num_splits[bi + 1] - split_begin;
  if (nsplit == 1) return;  // written directly by the split-KV kernel

  const auto [s, h] = query_row(p, g, r);
  Element* out = reinterpret_cast<Element*>(p.out) + ((long long)(bi * p.s_q + s) * p.h_q + h) * HEAD_DIM_V;
  float* lse_out = p.lse + lse_index<kSparse>(p, bi, h, s);

  float acc[kVecPerLane * 4];
#pragma unroll
  for (int i = 0; i < kVecPerLane * 4; ++i) acc[i] = 0.f;
  float lse_final = kInf;

  if (nsplit > 1) {
    // Partial LSEs are in log2 units; -inf marks a split that saw no key for this row.
    const long long row_stride = (long long)p.h_kv * p.rows;  // between split slots
    const float* lse_acc = p.lse_accum + (long long)split_begin * row_stride + (long long)g * p.rows + r;
    float mx = -kInf;
    for (int i = lane; i < nsplit; i += 32) mx = fmaxf(mx, load_f(lse_acc + i * row_stride));
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    const float mx_use = (mx == -kInf) ? 0.f : mx;
    float sum = 0.f;
    for (int i = lane; i < nsplit; i += 32) sum += exp2f(load_f(lse_acc + i * row_stride) - mx_use);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    const bool any = sum > 0.f;
    const float lse2 = any ? mx_use + log2f(sum) : kInf;
    lse_final = any ? lse2 * 0.69314718055994530942f : kInf;

    if (any) {
      const float sink = kSparse ? sink_factor(p, h, lse2) : 1.f;  // folded into the split weights
      const float* o_acc = p.o_accum + ((long long)split_begin * row_stride + (long long)g * p.rows + r) * HEAD_DIM_V;
      const long long o_split_stride = row_stride * HEAD_DIM_V;
#pragma unroll 2
      for (int i = 0; i < nsplit; ++i) {
        const float w = exp2f(load_f(lse_acc + i * row_stride) - lse2) * sink;  // uniform across the warp
        if (w != 0.f) {  // skip splits that saw no key (their partial o is 0 anyway)
          const float4* src = reinterpret_cast<const float4*>(o_acc + i * o_split_stride);
#pragma unroll
          for (int j = 0; j < kVecPerLane; ++j) {
            const float4 v = load_f4(src + j * 32 + lane);
            acc[j * 4 + 0] += w * v.x;
            acc[j * 4 + 1] += w * v.y;
            acc[j * 4 + 2] += w * v.z;
            acc[j * 4 + 3] += w * v.w;
          }
        }
      }
    }
  }
  if (lane == 0) *lse_out = lse_final;
#pragma unroll
  for (int j = 0; j < kVecPerLane; ++j) {
    uint2 v;
    v.x = ElemTraits<Element>::pack2(acc[j * 4 + 0], acc[j * 4 + 1]);
    v.y = ElemTraits<Element>::pack2(acc[j * 4 + 2], acc[j * 4 + 3]);
    *reinterpret_cast<uint2*>(out + (j * 32 + lane) * 4) = v;
  }
}

// Split-count ceiling of the staged path below (static smem: kCombineRowsPerCta x this floats);
// batches with more splits (only possible with more SM parts than this) take combine_row.
constexpr int kCombineMaxStagedSplits = 512;

// kSparse: the sparse decode's rows (lse_fold, attention sink).
template <typename Element, int HEAD_DIM_V, bool kSparse = false>
__device__ __forceinline__ void mla_combine_body(const DecodeParams& p) {
  static_assert(HEAD_DIM_V % 128 == 0, "one float4 per lane per 128 columns");
  constexpr int kVecPerLane = HEAD_DIM_V / 128;
  constexpr int R = kCombineRowsPerCta;
  __shared__ float s_w[R][kCombineMaxStagedSplits];  // per row: split LSEs, then split weights
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int bi = blockIdx.x, g = blockIdx.y, row_base = blockIdx.z * R;
  const int r = row_base + warp;

  // num_splits comes from the metadata kernel, which finished before the split-KV kernel
  // started: read it before waiting for the split-KV kernel (this overlaps that kernel's tail).
  const int split_begin = p.num_splits[bi];
  const int nsplit = p.num_splits[bi + 1] - split_begin;
  if (threadIdx.x == 0) {
    MLA_JIT_TRACE_TIME(mla_jit_trace_combine, kTraceCombineEntry);
    MLA_JIT_TRACE_VALUE(mla_jit_trace_combine, kTraceCombineSplits, nsplit);
  }

  // Every CTA waits, even one with nothing to do: this grid must not complete before the split-KV
  // kernel it depends on (work ordered after it relies on that).
  pdl_wait_primary();  // everything below may read split-KV kernel results
  if (threadIdx.x == 0) MLA_JIT_TRACE_TIME(mla_jit_trace_combine, kTraceCombineGo);
  if (nsplit == 1) return;  // written directly by the split-KV kernel

  if (nsplit > kCombineMaxStagedSplits) {
    if (r < p.rows) combine_row<Element, HEAD_DIM_V, /*kWrittenByThisGrid=*/false, kSparse>(p, bi, g, r, lane);
    return;
  }
  // Every row's split LSEs (log2 units; -inf: the split saw no key) in one parallel round.
  const int row_stride = p.h_kv * p.rows;  // lse_accum elements between split slots
  const float* lse_acc = p.lse_accum + (long long)split_begin * row_stride + (long long)g * p.rows + row_base;
  for (int idx = threadIdx.x; idx < nsplit * R; idx += kCombineThreads) {
    const int i = idx / R, w = idx % R;
    s_w[w][i] = row_base + w < p.rows ? lse_acc[(long long)i * row_stride + w] : -kInf;
  }
  __syncthreads();
  if (r >= p.rows) return;

  float mx = -kInf;
  for (int i = lane; i < nsplit; i += 32) mx = fmaxf(mx, s_w[warp][i]);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  const float mx_use = (mx == -kInf) ? 0.f : mx;
  float sum = 0.f;
  for (int i = lane; i < nsplit; i += 32) sum += exp2f(s_w[warp][i] - mx_use);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  const bool any = sum > 0.f;  // else no split saw a key: out = 0, lse = +inf
  const float lse2 = any ? mx_use + log2f(sum) : kInf;
  float sink = 1.f;  // the attention sink's factor, folded into the split weights
  if constexpr (kSparse) {
    if (any) sink = sink_factor(p, query_row(p, g, r).head, lse2);
  }
  for (int i = lane; i < nsplit; i += 32) s_w[warp][i] = any ? exp2f(s_w[warp][i] - lse2) * sink : 0.f;
  __syncwarp();

  // out = sum_i w_i o_i. Every split wrote all rows of its slot (zeros where it saw no key), so
  // no branch on w: the loads of 4 splits are in flight at once.
  float acc[kVecPerLane * 4];
#pragma unroll
  for (int i = 0; i < kVecPerLane * 4; ++i) acc[i] = 0.f;
  const float4* o_acc = reinterpret_cast<const float4*>(
      p.o_accum + ((long long)split_begin * row_stride + (long long)g * p.rows + r) * HEAD_DIM_V);
  const long long o_split_stride = (long long)row_stride * (HEAD_DIM_V / 4);  // float4s
#pragma unroll 4
  for (int i = 0; i < nsplit; ++i) {
    const float w = s_w[warp][i];
#pragma unroll
    for (int j = 0; j < kVecPerLane; ++j) {
      const float4 v = __ldg(o_acc + i * o_split_stride + j * 32 + lane);
      acc[j * 4 + 0] += w * v.x;
      acc[j * 4 + 1] += w * v.y;
      acc[j * 4 + 2] += w * v.z;
      acc[j * 4 + 3] += w * v.w;
    }
  }
  const auto [s, h] = query_row(p, g, r);
  if (lane == 0) p.lse[lse_index<kSparse>(p, bi, h, s)] = any ? lse2 * 0.69314718055994530942f : kInf;
  Element* out = reinterpret_cast<Element*>(p.out) + ((long long)(bi * p.s_q + s) * p.h_q + h) * HEAD_DIM_V;
#pragma unroll
  for (int j = 0; j < kVecPerLane; ++j) {
    uint2 v;
    v.x = ElemTraits<Element>::pack2(acc[j * 4 + 0], acc[j * 4 + 1]);
    v.y = ElemTraits<Element>::pack2(acc[j * 4 + 2], acc[j * 4 + 3]);
    *reinterpret_cast<uint2*>(out + (j * 32 + lane) * 4) = v;
  }
  if (threadIdx.x == 0) MLA_JIT_TRACE_TIME(mla_jit_trace_combine, kTraceCombineDone);
}

}  // namespace decode
}  // namespace mla_jit
