// Per-CTA timestamps for timeline studies (bench/trace_decode.py), compiled in only with
// MLA_JIT_TRACE=1 (-DMLA_JIT_TRACE, part of the cache key). A kernel records %globaltimer (ns)
// or a value at a few named events into one row per CTA of a global table that the host reads
// back with cuLibraryGetGlobal; rows past kTraceCtas are dropped. The sm80 family's Q-in-smem
// kernel instead fills the split-KV table with %clock64 rows per (CTA, warp, tile) for a phase
// study (decode/splitkv_sm80.cuh: PhaseTrace; bench/trace_sm80_phases.py). Without the flag every
// call compiles to nothing.
#pragma once

namespace mla_jit {

constexpr int kTraceCtas = 4096;
constexpr int kTraceEvents = 12;

#ifdef MLA_JIT_TRACE
__device__ __forceinline__ unsigned long long trace_now() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ unsigned trace_smid() {
  unsigned id;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(id));
  return id;
}

__device__ __forceinline__ int trace_cta() {
  return int(blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z));
}

__device__ __forceinline__ void trace_put(unsigned long long* table, int event, unsigned long long value) {
  const int cta = trace_cta();
  if (cta < kTraceCtas) table[cta * kTraceEvents + event] = value;
}
__device__ __forceinline__ void trace_latest(unsigned long long* table, int event, unsigned long long value) {
  const int cta = trace_cta();
  if (cta < kTraceCtas) atomicMax(table + cta * kTraceEvents + event, value);
}
#define MLA_JIT_TRACE_TIME(table, event) ::mla_jit::trace_put(table, event, ::mla_jit::trace_now())
// The latest of several threads' times (the table is zeroed before a run).
#define MLA_JIT_TRACE_LATEST(table, event) ::mla_jit::trace_latest(table, event, ::mla_jit::trace_now())
#define MLA_JIT_TRACE_VALUE(table, event, value) ::mla_jit::trace_put(table, event, (unsigned long long)(value))
#else
#define MLA_JIT_TRACE_TIME(table, event) ((void)0)
#define MLA_JIT_TRACE_LATEST(table, event) ((void)0)
#define MLA_JIT_TRACE_VALUE(table, event, value) ((void)0)
#endif

}  // namespace mla_jit

#ifdef MLA_JIT_TRACE
// One row per CTA of the split-KV kernel and of the combine kernel: see decode/common.cuh's
// TraceSplitKV / TraceCombine for the columns. C names: the host looks the tables up by them (the
// braces make these definitions, not extern declarations).
extern "C" {
__device__ unsigned long long mla_jit_trace_splitkv[mla_jit::kTraceCtas * mla_jit::kTraceEvents];
__device__ unsigned long long mla_jit_trace_combine[mla_jit::kTraceCtas * mla_jit::kTraceEvents];
// Per-tile %clock64 rows of the ws kernel's sparse mode (decode/splitkv_ws.cuh: WsPhaseTrace).
__device__ unsigned long long mla_jit_trace_phases[mla_jit::kTraceCtas * mla_jit::kTraceEvents];
// One row per CTA of the paged indexer kernel (indexer/paged_logits_sm90.cuh: PagedTrace).
__device__ unsigned long long mla_jit_trace_indexer[mla_jit::kTraceCtas * mla_jit::kTraceEvents];
}
#endif
