// mla_jit decode: dense paged MLA split-KV kernel for sm_90a, "ws" schedule (warp-specialized:
// one S/softmax warpgroup, two P V warpgroups).
//
// Grid (num_sm_parts, h_kv, ceil(rows / BLOCK_M)), cluster (1, 1, CLUSTER_M), block 384 threads,
// 1 CTA / SM, dynamic smem SplitKVWsConfig<...>::kSmemBytes. One CTA walks the (batch, token)
// range that the scheduler metadata gives its SM part, for one KV head and one 64-row tile of
// query rows; KV comes through a TMA descriptor with box {64, 1, min(page, 64)} and the 128B
// swizzle. A finished piece goes to out / lse when its batch has a single split, else to
// o_accum / lse_accum.
// FUSED_COMBINE (the default): no combine kernel. The CTA whose split completes a (batch, KV
// head, row tile)'s arrival counter (DecodeParams::combine_counters, zero between launches)
// merges that batch's splits after its main loop (ws_combine_batch: the freed KV stages hold
// the split weights; combine.cuh's combine_row past kMaxSplits), and WG2 writes out = 0 /
// lse = +inf for empty batches at the start. WG0 then stores a split piece's lse_accum, fenced,
// before it publishes the piece's last P; the P V warpgroups fence their o_accum stores and
// thread 128 counts the split (ws_count_split); the completing CTA reads the partials through L2. Saves the combine kernel's launch (host
// time) and its latency-bound run after the split-KV kernel's tail. Without it the combine kernel
// (combine.cuh) runs after this one, as for the other kernel families.
//
// Schedule per 64-token KV tile n (stage s = n % NUM_STAGES, use k = n / NUM_STAGES):
//   WG0 (S + softmax): Q[:, :496] lives in registers for the whole piece (RS wgmma: A from
//        registers, so the N = 64 S GEMM reads only K from smem); Q[:, 496:512] and, at d = 576,
//        the 64 rope columns stay in smem and go through SS wgmmas into the same accumulator.
//        (piece start: Q) -> wait full[s] -> (tail: zero K rows >= L) -> issue S(n) = Q K^T
//        -> fence P(n-1)'s stores for the async proxy while S runs -> wait for S(n)'s first
//        commit group -> arrive p_full of tile n-1 -> wait for the rest of S(n) -> mask + online
//        softmax (lazy rescaling) -> P (bf16/fp16) and the per-row O rescale -> smem slots of
//        stage s (stmatrix) -> (piece end: lse, arrive p_full[s] at once). The thread geometry and the walk's bookkeeping sit after S's wait, off the path
//        from the P store to the next S issue.
//        At the last tile of a piece P and the rescale are multiplied by 1/l, so O comes out
//        normalized. P(n) is published only once most of S(n+1) is done (kSFirstGroupK), so S
//        has the tensor cores nearly to itself and P V(n) runs during the end of S(n+1) and the
//        softmax of n+1. WG0 never waits for P V (e4m3: for P V(n - 2), see below).
//   WG1, WG2 (P V): each owns half of O (64 x DV/2 fp32 in registers).
//        wait p_full[s] -> O *= rescale (skipped where it is 1) -> O += P V[:, half] (SS wgmma,
//        V = the K tile read through a transposed view; scale-d = 0 on a piece's first tile)
//        -> arrive pv_done[s] -> (piece end) store O.
//        Thread 128 (WG1) is the TMA producer: before waiting for P(n) it refills the stage of
//        tile n-1 with tile n-1+NUM_STAGES once pv_done of tile n-1 completed. (e4m3: beside its
//        P V(n) it refills stage n with tile n+NUM_STAGES, once stage_free of tile n completed.)
// K and V are the same smem tile (V = first HEAD_DIM_V columns), so every KV byte crosses HBM once
// per CTA; with CLUSTER_M > 1 the row tiles of a cluster share each tile's loads (multicast), so
// it crosses L2 -> SM once per cluster. P(n) is written into the rope columns [DV, DV + 64) of
// stage s's K tile once every warp of WG0 finished S(n) (those columns are not part of V), so P
// lives and dies with its stage and three 72 KB stages fit at d = 576. At d = dv there are no rope columns: one P buffer per stage.
//
// Synchronization (every per-stage barrier completes once per use of its stage: parity k & 1):
//   full[s]    count 1 + tx: producer arrive_expect_tx + TMA. Waited by WG0 before S / tail
//              zeroing and (already complete, for visibility of the TMA bytes) by WG1/WG2.
//   p_full[s]  count 4: lane 0 of each WG0 warp after its P / row_scale / info stores (and
//              fence.proxy.async, P and the zeroed tail rows are read by wgmma) and after the
//              first commit group of the next tile's S (or at once at a piece's last tile).
//              Waited by WG1/WG2. No cycle: S(n+1) needs full
//              of n+1, which every producer of the cluster issued after pv_done of n+1-NS <= n-1
//              (the cluster's CTAs walk the same tiles: same metadata part and KV head).
//   pv_done[s] count 8 x CLUSTER_M: lane r < CLUSTER_M of each WG1/WG2 warp of every CTA of the
//              cluster, on cluster CTA r's barrier, after wgmma.wait of P V(n) and after reading
//              row_scale / info. Waited by the producer before refilling stage s with tile n+NS
//              (its multicast writes stage s of every CTA of the cluster). The arrive is CTA-scope
//              (CUTLASS's ClusterBarrier does the same; .release.cluster costs a MEMBAR.ALL.GPU
//              per arrive): what it orders before the peer's TMA overwrite are reads (P V's
//              wgmma, retired by wgmma.wait) and WG0's P / tail-zero stores, which that wgmma
//              already read. (e4m3: count 8, this CTA's warps; WG0 waits it for the P slot,
//              and the producer waits stage_free[s] instead, see the e4m3 notes below.)
//   Stage s's P, row_scale[s], info[s] (and its K/V rows, which WG0 zeroes for a tail tile) are
//   rewritten only by WG0 for tile n+NS, after it waited full[s] of n+NS, which the producer
//   issued after pv_done[s] of n: the chain full <- pv_done protects every per-stage slot, so WG0
//   needs no "P consumed" barrier and never waits for the P V warpgroups. (e4m3: full <-
//   stage_free protects the stage and tile_valid[s]; pv_done(n - 2) -> WG0 the P slot, row_scale and
//   info.)
//   Named barrier 1 (WG0, 128 threads): piece start (Q's smem part rewritten only after every
//   warp's previous S wgmma, and published before the next S), tail zeroing -> S, and S(n) of all
//   four warps done -> P(n) stored over the rope columns that S(n) reads (d = 576).
//   Named barrier 2 (WG1 + WG2, 256 threads): the fused combine's count (ws_count_split).
//   Named barrier 3 (WG0 + the producer's warp, 160 threads), once per CTA: WG0 has its first Q
//   (arrive), so the producer issues tiles 1 .. NUM_STAGES - 1 (tile 0 goes out before it).
//   After the main loop every warpgroup moves to kRegsAfter registers; (fused combine only) every
//   warp meets at __syncthreads before step 2.
// Registers (setmaxnreg; counts must add up to at most the launch allocation, 3 x 168 for
// __launch_bounds__(384, 1), or setmaxnreg.inc blocks forever): WG0 184 = R0..R23 state, S at
// R24..R55, Q at R56..R179; WG1/WG2 160 = state + O at R24..R151. ptxas puts wgmma accumulators
// at R24 and ignores a setmaxnreg below (highest register + 3), which is what bounds both.
//
// e4m3 q and cache (Element float_e4m3_t, out bf16; vLLM's FP8 decode): the same schedule on FP8
// wgmma. All of Q (72 registers) is S's register A operand; the KV tile's 64-column chunks use the
// 64B swizzle (64 B rows); 4 stages. P is not divided by l (P / l can fall below e4m3's range):
// WG0 stores it unnormalized as e4m3, and at a piece's last tile the factor 1/l times descale_k
// (row_scale[s][BM + row]), which the P V warpgroups apply to O after that tile's P V. FP8 wgmma
// reads both operands K-major, and V is MN-major in the cache: each P V warpgroup computes O^T =
// V^T P^T instead, V^T its register A operand built straight from the landed K tile (ldmatrix .trans
// and byte permutes, in a token order that P's columns share: ws_load_vt_kstep), P's slab as stored
// the B operand, a 64-dv chunk at a time (ws_pv_tile_regs). It zeroes tokens >= L there itself (the
// producer notes each tile's valid tokens in tile_valid[s]): WG0's tail zeroing runs concurrently.
// O^T's columns are the query rows: the lazy rescale reads WG0's per-warp flags (tile_rescale[s]),
// and O is stored as adjacent dv pairs of 16 rows a thread (ws_store_ot). H200, against V^T
// transposed into shared memory (stmatrix, both operands from there): 1.0-1.09x (session 36).
// Registers: WG0 152, WG1/WG2 176 (a few scalars of the P V loop spill).
// The early stage release (kEarlyRelease, the e4m3 kernel; H200: 1.01-1.05x, 1.00-1.04x with the tile box): P goes into two
// slots of its own (aux, by tile parity) instead of the rope columns, so a stage's last readers are
// S(n) and the P V warps' V^T loads. Each of those warps (WG0's after S's wait, the P V warps
// after their last V^T chunk; 12 x CLUSTER_M, cluster-wide as pv_done otherwise) arrives on stage_free[s],
// which the producer waits before the refill instead of pv_done: the refill no longer waits for
// both P V(n) (H200 trace: ~600 of the P V side's ~1360-clock loop), and it issues it while its
// own P V(n) wgmma runs (the stage's bytes are no operand of it). pv_done (this CTA's 8 P V
// warps) then guards the P slot: WG0 waits pv_done of tile n - 2 before storing P(n), which also
// covers tile n - 2's row_scale / info (read before the arrival; stage s's are rewritten at n + NS).
// CHUNKS_PER_LOAD > 1 (any dense kernel, pages >= 64; H200: e4m3 1.03-1.08x, bf16 0.997-1.006x):
// the descriptor is 4-D (64 columns, head, token, chunk: runtimes/decode_plan.kv_tma_view), so one
// load writes that many chunk slabs (of a stage, or of a KV_FP8 landing slot); 1 load a tile, or with
// a cluster 2-3 loads taken in turns.
//
// KV_FP8 (a bf16 / fp16 q over an e4m3 cache; out in q's dtype): the 16-bit kernel with 2 stages
// and 2 e4m3 landing slots (LandingSlots, the same 221 KB at d = 576). The TMA loads tile n into
// slot n % 2; the P V warpgroups de-quantize it into stage n % 2 (ws_dequant_tile: after a named
// barrier 6 of their 256 threads, since the stage held tile n - 2; rows >= L become 0), release the
// slot on pv_done (the producer then loads tile n + 2 into it) and announce the stage to WG0 on
// kv_ready[s] (count 8). They do it for tile n + 1 before their P V(n), while WG0 runs S(n) and its
// softmax; WG0 publishes every P at once (held back, P(n) would wait for S(n + 1), which waits for
// the de-quantization after P V(n)). descale_k goes into S's scale and, with 1/l, into the last
// tile's P and O rescale.
//
// Sparse (SPARSE_KV != 0; DSA decode and prefill, configs/sparse.py): the batch is single-token rows
// (a decode's b * s_q, a prefill's s_q tokens), each walking its topk indices (block_table) in
// 64-token tiles; the walk is one contiguous run of (row, tile) pairs from the metadata's origin, so
// the P V warpgroups find any tile's indices by arithmetic. No TMA producer: the 256 P V threads
// gather each tile with cp.async (4 threads a token, ws_gather_slot), invalid tokens (index -1 or past the cache,
// past topk_length) zero-filled and never read, and write a valid bit per token (tile_valid) that
// WG0 uses to mask S. m_run is the exact running max (no lazy rescaling: it is max_logits), and the
// attention sink is folded into the last tile's 1/l when a row has a single split. The combine
// kernel merges splits (no fused combine, no clusters).
//   bf16 rows (2): gathered straight into stage n % NS once both P V warpgroups are past P V(n - NS)
//   (named barrier 6), arriving on full[s] (256 cp.async arrivals + 8 warps' valid bytes).
//   FP8 records (1): 2 bf16 stages and one 41 KB record slot, filled by bulk copies (one a token,
//   ws_gather_records) that complete on `landed`. Each thread then de-quantizes a quarter record
//   (128 e4m3 with their scale, 32 rope bytes) into the stage, fences, and its warp arrives on
//   kv_ready[s], which also frees the slot for the next tile's copies. Per tile n: [named barrier 6:
//   P V(n - 1) done] de-quantize tile n + 1 -> P V(n), and while its wgmma runs the gather of tile
//   n + 2 and the index of n + 3.
//   Crossover (FP8 records, CLUSTER_M 2: the two 64-head tiles of a row, grid z 2, one cluster):
//   FlashMLA's split of the de-quantization across the pair. CTA c gathers and converts tokens
//   32 c .. 32 c + 31 of each tile (ws_dequant_half: warp w a 64-column chunk) into its stage and
//   hands them to the peer's stage by bulk copies (shared -> distributed shared memory, 2 a warp),
//   which complete on the peer's kv_ready (8 local arrivals expecting the peer's 36 KB). Half-tile
//   record slots (2, slot_read frees one) let the gather run 3 tiles ahead. A stage is rewritten
//   once both CTAs are past its previous tile: the named barrier here, peer_free (thread 128's
//   arrival from the peer) there. WG0 stores P(n) over the rope rows (kPInRope), a source of this
//   CTA's copies of tile n: it waits copy_landed (the peer's WG0 saw tile n complete) first, and the
//   P V warps wait kv_ready themselves for the peer's bytes (async proxy) besides WG0's P. Session 26's crossover (st.async a thread, the peer's valid bits,
//   one slot) lost to the unpaired kernel once records came by bulk copies (bench/NOTES.md).
//
// Code: mla_splitkv_ws_body (barrier setup, role dispatch, the fused combine's step 2) runs
// ws_softmax_warpgroup in WG0 (per piece ws_load_q; per tile ws_issue_s, ws_wait_s, ws_softmax,
// ws_finish_rows, ws_store_p, ws_store_lse, ws_publish_p) and ws_pv_warpgroup in WG1 / WG2 (per
// tile ws_pv_tile, per piece ws_store_o; thread 128 also ws_producer_start and ws_issue_tile).
#pragma once

#include "combine.cuh"
#include "records.cuh"
#include "sm90_tiles.cuh"

namespace mla_jit {
namespace decode {

namespace detail {

// What the P V warpgroups learn about a tile besides P and the row scale (WG0 owns the walk).
struct WsTileInfo {
  int last;  // last tile of its piece: O (already divided by l) is stored after this tile
  int bi;    // batch of the piece (meaningful when last != 0)
};

// Register-lean cursor for WG0: the walk of WorkCursor (batch bi, tile start tok, piece
// [start, stop), L = seqlen), but the metadata bounds are re-read when a piece ends instead of
// living in registers through the loop. Invalid when tok == stop == 0 after the last piece.
struct WsCursor {
  int bi, tok, stop, L;
  __device__ __forceinline__ bool valid() const { return tok < stop; }
  template <typename Lens>
  __device__ __forceinline__ void seek(const int* meta, Lens seqlens, int b) {
    const int begin_b = meta[kMetaBeginBatch], end_b = meta[kMetaEndBatch];
    for (bi = b; bi <= end_b; ++bi) {
      L = max(seqlens[bi], 0);
      const int start = bi == begin_b ? meta[kMetaBeginToken] : 0;
      stop = bi == end_b ? min(meta[kMetaEndToken], L) : L;
      if (start < stop) {
        tok = start;
        return;
      }
    }
    tok = stop = 0;
  }
};

// Sparse and e4m3 kernels, built with MLA_JIT_TRACE: %clock64 at 8 points of tiles kFirstTile ..
// + kTiles of each CTA, a row per (CTA, tile) of mla_jit_trace_phases (bench/trace_ws_phases.py
// reads them). WG0's thread 0: 0 before the wait for the tile, 1 after it, 2 S done, 3 P stored
// (sparse: published). Thread 128 (P V, its loop's tile n): sparse: 4 past the named barrier,
// 5 tile n + 1 de-quantized (FP8 records); e4m3: 4 before the wait for tile n, 5 its first V^T chunk
// in registers; both: 6 P(n) arrived, 7 P V(n) (e4m3: with chunks 1-3's V^T loads) and the work
// beside it done.
// e4m3, the TMA producer (thread 128) at the refill it issues beside P V(n) (tile n + NS):
// 8 the stage released (stage_free of tile n waited), 9 the tile's loads issued; WG0's thread 0:
// 10 / 11 before / after its wait for P(n)'s slot (pv_done of tile n - 2), between 2 and 3.
// Sparse crossover (thread 128, between 4 and 5): 8 past peer_free, 9 past the records' landing.
struct WsPhaseTrace {
  static constexpr int kFirstTile = 8, kTiles = 8;
  __device__ __forceinline__ static void mark(int n, int event) {
#ifdef MLA_JIT_TRACE
    const int cta = int(blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z));
    if (n >= kFirstTile && n < kFirstTile + kTiles && cta < kTraceCtas / kTiles)
      mla_jit_trace_phases[(cta * kTiles + n - kFirstTile) * kTraceEvents + event] = clock64();
#endif
  }
};

// Sparse: every row of the batch has topk tokens (seqlens of the walks).
struct WsFixedLengths {
  int L;
  __device__ __forceinline__ int operator[](int) const { return L; }
};

// Named barriers (0 is __syncthreads'): WG0's 128 threads; the two P V warpgroups (256 threads).
constexpr int kBarWG0 = 1;
constexpr int kBarPV = 2;
// Named barrier of WG0 and the producer's warp (160 threads): the CTA's first Q is loaded.
constexpr int kBarFirstQ = 3;
constexpr int kFirstQThreads = 128 + 32;
// Sparse: WG0 and every gathering thread of the P V warpgroups.
template <typename Cfg>
constexpr int ws_first_q_threads() { return Cfg::kSparse ? 128 + Cfg::kGatherThreads : kFirstQThreads; }
// KV_FP8: the P V warpgroups (256 threads) meet before de-quantizing a tile into a stage.
constexpr int kBarDequant = 6;

// Row r (h: which of the thread's two accumulator rows) of this thread's O columns, cast to the
// output dtype, into out. 32-bit element offsets (here and in the P V epilogue): < 2^31 for every
// shape validation admits, and 64-bit index math costs registers the P V warpgroups lack.
template <typename Cfg, typename TensorO>
__device__ __forceinline__ void ws_store_out_row(const DecodeParams& p, const TensorO& tOrO, int bi, int r, int h,
                                                 int col_base) {
  using Element = typename Cfg::OutElement;
  constexpr int DV = Cfg::HEAD_DIM_V;
  const auto [s, head] = query_row(p, (int)blockIdx.y, r);
  Element* o = reinterpret_cast<Element*>(p.out) + (((bi * p.s_q + s) * p.h_q + head) * DV + col_base);
#pragma unroll
  for (int j = 0; j < cute::size(tOrO) / 4; ++j) {
    const int i = j * 4 + h * 2;
    *reinterpret_cast<unsigned*>(o + j * 8) = ElemTraits<Element>::pack2(tOrO(i), tOrO(i + 1));
  }
}

// Fused combine, step 1: run by both P V warpgroups (256 threads, thread 128 among them) right
// after they stored their halves of a split piece's O into o_accum (WG0 stored and fenced the
// piece's lse_accum before publishing its last P). The CTA counts its split into the (batch, KV
// head, row tile) counter; the CTA that completes the count notes the batch in `pending` and
// merges it after its main loop (step 2, combine_row per query row), when registers and time are free.
// A CTA holds at most two split pieces (the first and the last of its range: batches inside the
// range are whole), so `pending` has two slots: (batch, its first split slot, its split count).
__device__ __forceinline__ void ws_count_split(const DecodeParams& p, const PieceDest& dest, int bi, int g,
                                               int m_block, int tid, int (*pending)[3], int* num_pending) {
  __threadfence();  // release: this thread's o_accum stores, GPU-wide, before the count
  named_barrier_sync(kBarPV, 256);
  if (tid == 128) {
    int* counter = p.combine_counters + (bi * p.h_kv + g) * (int)gridDim.z + m_block;
    if (atomicAdd(counter, 1) == dest.count - 1) {
      *counter = 0;     // every split has counted: zero again for the next launch
      __threadfence();  // acquire: the other splits' stores before step 2's reads
      if (*num_pending >= 2) __trap();  // cannot happen (see above): fail loudly, never overrun smem
      pending[*num_pending][0] = bi;
      pending[*num_pending][1] = dest.first;
      pending[*num_pending][2] = dest.count;
      ++*num_pending;
    }
  }
}

// Fused combine, step 2: merges the nsplit splits (slots first ..) of batch bi for this CTA's
// rows (KV head blockIdx.y, row tile blockIdx.z) into out / lse, by all NUM_THREADS threads
// after the main loop. Phases, so that no thread waits on a chain of dependent global loads:
// (C0) the first kS splits of this thread's first kC chunks of o_accum into registers (they do
// not depend on the weights: their latency overlaps A and B); (A) every split's lse_accum of
// every row into smem `wts` [split][BM]; (B) per row: the final lse (written out) and each
// split's weight 2^(lse_i - lse), in place; (C) out = sum_i w_i * o_i over 16-byte chunks of
// the rows, kC chunks x kS splits of loads in flight per thread. Partials are read through L2
// (ld.global.cg): other SMs wrote them during this kernel. At 16 rows and 5 splits the merge
// is two memory round trips after the main loop (it was ~6, ~5.5 us; clock trace, H200).
template <typename Cfg>
__device__ __forceinline__ void ws_combine_batch(const DecodeParams& p, int bi, int first, int nsplit, float* wts,
                                                 int tid) {
  using Element = typename Cfg::OutElement;  // of out
  constexpr int DV = Cfg::HEAD_DIM_V, BM = Cfg::BLOCK_M, NT = Cfg::NUM_THREADS;
  constexpr int kMaxSplits = int(Cfg::kStageBytes) * Cfg::NUM_STAGES / (BM * 4);  // wts fits the KV stages
  const int g = blockIdx.y, row_base = blockIdx.z * BM;
  const int nrows = min(BM, p.rows - row_base);
  if (nsplit > kMaxSplits) {  // more splits than SMs on any GPU so far: the slow, general path
    for (int lr = tid / 32; lr < nrows; lr += NT / 32)
      combine_row<Element, DV, /*kWrittenByThisGrid=*/true>(p, bi, g, row_base + lr, tid % 32);
    __syncthreads();
    return;
  }
  const int split_stride = p.h_kv * p.rows;  // lse_accum elements between split slots
  const float* lse_acc = p.lse_accum + (first * p.h_kv + g) * p.rows + row_base;
  constexpr int kRowChunks = DV / 4;  // float4 chunks per row
  constexpr int kC = 6, kS = 2;       // chunks per thread per pass (16 rows in one pass), splits per load batch
  const int nchunks = nrows * kRowChunks;
  const float4* o_acc = reinterpret_cast<const float4*>(p.o_accum) + ((first * p.h_kv + g) * p.rows + row_base) * kRowChunks;
  const int o_split_stride = split_stride * kRowChunks;  // float4s between split slots
  float4 v[kS][kC];
  auto load_batch = [&](int base, int i0) {
#pragma unroll
    for (int j = 0; j < kS; ++j) {
#pragma unroll
      for (int c = 0; c < kC; ++c) {
        const int chunk = base + c * NT;
        v[j][c] = (i0 + j < nsplit && chunk < nchunks) ? __ldcg(o_acc + (i0 + j) * o_split_stride + chunk)
                                                       : make_float4(0.f, 0.f, 0.f, 0.f);
      }
    }
  };
  // (C0)
  load_batch(tid, 0);
  // (A)
  for (int idx = tid; idx < nsplit * BM; idx += NT) {
    const int i = idx / BM, lr = idx % BM;
    wts[idx] = lr < nrows ? __ldcg(lse_acc + i * split_stride + lr) : -kInf;
  }
  __syncthreads();
  // (B)
  if (tid < nrows) {
    float mx = -kInf;
    for (int i = 0; i < nsplit; ++i) mx = fmaxf(mx, wts[i * BM + tid]);
    const float mx_use = mx == -kInf ? 0.f : mx;
    float sum = 0.f;
    for (int i = 0; i < nsplit; ++i) sum += exp2f(wts[i * BM + tid] - mx_use);
    const bool any = sum > 0.f;  // else no split saw a key for the row: out = 0, lse = +inf
    const float lse2 = any ? mx_use + log2f(sum) : kInf;
    for (int i = 0; i < nsplit; ++i) wts[i * BM + tid] = any ? exp2f(wts[i * BM + tid] - lse2) : 0.f;
    const int r = row_base + tid;
    const auto [s, head] = query_row(p, g, r);
    p.lse[(bi * p.h_q + head) * p.s_q + s] = any ? lse2 * 0.69314718055994530942f : kInf;
  }
  __syncthreads();
  // (C)
  for (int base = tid; base < nchunks; base += NT * kC) {
    float4 acc[kC];
#pragma unroll
    for (int c = 0; c < kC; ++c) acc[c] = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int i0 = 0; i0 < nsplit; i0 += kS) {
      if (base != tid || i0 != 0) load_batch(base, i0);  // (the first batch came in C0)
#pragma unroll
      for (int j = 0; j < kS; ++j) {
#pragma unroll
        for (int c = 0; c < kC; ++c) {
          const int chunk = base + c * NT;
          const float w = (i0 + j < nsplit && chunk < nchunks) ? wts[(i0 + j) * BM + chunk / kRowChunks] : 0.f;
          acc[c].x += w * v[j][c].x;
          acc[c].y += w * v[j][c].y;
          acc[c].z += w * v[j][c].z;
          acc[c].w += w * v[j][c].w;
        }
      }
    }
#pragma unroll
    for (int c = 0; c < kC; ++c) {
      const int chunk = base + c * NT;
      if (chunk >= nchunks) continue;
      const int r = row_base + chunk / kRowChunks;
      const auto [s, head] = query_row(p, g, r);
      Element* o = reinterpret_cast<Element*>(p.out) + ((bi * p.s_q + s) * p.h_q + head) * DV + (chunk % kRowChunks) * 4;
      uint2 packed;
      packed.x = ElemTraits<Element>::pack2(acc[c].x, acc[c].y);
      packed.y = ElemTraits<Element>::pack2(acc[c].z, acc[c].w);
      *reinterpret_cast<uint2*>(o) = packed;
    }
  }
  __syncthreads();  // wts is rewritten by the next batch's phase A
}

// out = 0 and lse = +inf for this CTA's rows (KV head blockIdx.y, row tile m_block) of every
// batch without splits (no keys), batches blockIdx.x, blockIdx.x + gridDim.x, ...: the work of
// the combine kernel for them. 128 threads (tid_wg).
template <typename Cfg>
__device__ __forceinline__ void ws_write_empty_batches(const DecodeParams& p, int tid_wg, int g, int m_block) {
  using Element = typename Cfg::OutElement;
  constexpr int DV = Cfg::HEAD_DIM_V, BM = Cfg::BLOCK_M;
  constexpr int kChunks = DV / 8;  // 16-byte chunks per row
  for (int bi = blockIdx.x; bi < p.b; bi += gridDim.x) {
    if (p.num_splits[bi + 1] != p.num_splits[bi]) continue;
#pragma unroll 1
    for (int idx = tid_wg; idx < BM * kChunks; idx += 128) {
      const int r = m_block * BM + idx / kChunks;
      if (r >= p.rows) break;
      const auto [s, head] = query_row(p, g, r);
      Element* o = reinterpret_cast<Element*>(p.out) + ((bi * p.s_q + s) * p.h_q + head) * DV;
      reinterpret_cast<uint4*>(o)[idx % kChunks] = make_uint4(0u, 0u, 0u, 0u);
    }
    const int r = m_block * BM + tid_wg;
    if (tid_wg < BM && r < p.rows) {
      const auto [s, head] = query_row(p, g, r);
      p.lse[(bi * p.h_q + head) * p.s_q + s] = kInf;
    }
  }
}

}  // namespace detail

template <typename Element_, int HEAD_DIM_, int HEAD_DIM_V_, int PAGE_SIZE_, int BLOCK_M_ = 64,
          int BLOCK_N_ = 64, int NUM_STAGES_ = 3, bool FUSED_COMBINE_ = true, int CLUSTER_M_ = 1,
          bool KV_FP8_ = false, int SPARSE_KV_ = 0, bool COMPACT_ROWS_ = false, int S_FIRST_GROUP_K_ = 18,
          typename RECORD_ = V32Record, int CHUNKS_PER_LOAD_ = 1, bool S_HALVES_ = false>
struct SplitKVWsConfig : Sm90DecodeTiles<Element_, HEAD_DIM_, HEAD_DIM_V_, PAGE_SIZE_, BLOCK_M_, BLOCK_N_, KV_FP8_> {
  using Tiles = Sm90DecodeTiles<Element_, HEAD_DIM_, HEAD_DIM_V_, PAGE_SIZE_, BLOCK_M_, BLOCK_N_, KV_FP8_>;
  using Element = Element_;
  using OutElement = typename Tiles::OutElement;
  static constexpr bool kFp8 = Tiles::kFp8;
  static constexpr bool kKvFp8 = Tiles::kKvFp8;
  // Per-tensor descales (of q and cache, or of the cache alone) read on the GPU.
  static constexpr bool kDescaled = kFp8 || kKvFp8;
  static constexpr int HEAD_DIM = HEAD_DIM_;
  static constexpr int HEAD_DIM_V = HEAD_DIM_V_;
  static constexpr int BLOCK_M = BLOCK_M_;
  static constexpr int BLOCK_N = BLOCK_N_;
  static constexpr int NUM_STAGES = NUM_STAGES_;
  static constexpr int NUM_THREADS = 384;
  // The CTA that finishes the last split of a (batch, KV head, row tile) merges the splits itself
  // (no combine kernel), and the kernel writes out = 0 / lse = +inf for empty batches.
  static constexpr bool kFusedCombine = FUSED_COMBINE_;
  // Row tiles per cluster (launched with cluster dims (1, 1, CLUSTER_M)): the cluster's CTAs walk
  // the same KV tiles (same metadata part and KV head), so each producer loads 1 / CLUSTER_M of
  // every tile's column chunks and multicasts them to all; a stage is refilled once the P V
  // warpgroups of every CTA in the cluster are done with it.
  static constexpr int CLUSTER_M = CLUSTER_M_;
  static_assert(CLUSTER_M == 1 || CLUSTER_M == 2, "cluster of 1 or 2 row tiles (66 clusters of 2 fit 132 SMs, 30 of 4)");
  // S in two commit groups, the first of S_FIRST_GROUP_K of the 31 register k-steps (0: one
  // group): P(n-1) is published once the first group is done, so P V(n-1), and the refill of its
  // stage that its end starts, begin before S(n) ends (WG0 waited ~11% of its time for a tile's
  // bytes). Interleaved against one group (H200): 0.945-0.977x the time on the h_q = 128, s_q = 2
  // rows at 18, 27 and 31, the s_q = 1 rows within their noise.
  // e4m3: 10 of the 18 (d = 576) or 16 k-steps, about the same share of S.
  static constexpr int kSFirstGroupK = kFp8 ? 10 : S_FIRST_GROUP_K_;

  // Per-thread registers after setmaxnreg: WG0 (Q fragment + S) and the P V warpgroups (O half).
  // kRegsS + 2 * kRegsPV <= 3 * 168 (the launch allocation); see the header comment.
  // e4m3: WG0 holds Q in 72 registers (S at R24..R55, Q above: 152 fit), and the P V warpgroups
  // a 64-dv chunk's V^T operand (8 registers) besides O^T (a few scalars of their loop spill).
  static constexpr int kRegsS = kFp8 ? 152 : 184;
  static constexpr int kRegsPV = kFp8 ? 176 : 160;
  static constexpr int kLaunchRegs = 168;  // 65536 / 384, rounded down to 8: __launch_bounds__(384, 1)
  // Every warpgroup's count after its role (the fused combine's step 2): equal, and at most 168.
  static constexpr int kRegsAfter = kRegsPV < kLaunchRegs ? kRegsPV : kLaunchRegs;
  static_assert(kRegsS + 2 * kRegsPV <= 3 * kLaunchRegs && kRegsS % 8 == 0 && kRegsPV % 8 == 0, "setmaxnreg");

  // Sparse (DSA) attention over tokens gathered by index (splitkv_sm80.cuh's SparseKV numbering):
  // FlashMLA's FP8 records (1: in pages of PAGE_SIZE, de-quantized by the P V warpgroups) or bf16
  // rows (2: gathered straight into the stage). See the header's "Sparse".
  static constexpr bool kSparse = SPARSE_KV_ != 0;
  // Compact rows (dense decode, at most 32 query rows a KV head: one row tile): query row r sits in
  // tile row 16 (r / 8) + r % 8, the first row half of each warp's 16, so every WG0 thread's second
  // accumulator row (row0 + 8) is padding and its softmax (row maxima, exponentials, sums, P packing
  // and stores, the O rescale) runs for one row instead of two. The padding rows' Q is zero and their
  // P is never written (stale bytes): their O is garbage and never stored.
  static constexpr bool kCompactRows = COMPACT_ROWS_;
  static constexpr int kRowHalves = kCompactRows ? 1 : 2;   // a WG0 thread's accumulator rows that are real
  static constexpr int kTileQueryRows = kCompactRows ? BLOCK_M / 2 : BLOCK_M;
  static_assert(!kCompactRows || (SPARSE_KV_ == 0 && CLUSTER_M == 1), "compact rows: the dense decode, one row tile");
  static constexpr bool kSparseFp8 = SPARSE_KV_ == 1;
  // e4m3: a stage goes back to the producer once its last readers are done (WG0's S and the P V
  // warps' V^T loads: stage_free) instead of after P V, whose P then sits in two slots of its own by
  // tile parity (aux) and whose end (pv_done) WG0 waits before reusing a P slot. See "Synchronization".
  // H200, interleaved against the release after P V: 1.01-1.05x on the FP8 rows (bench/NOTES.md, session 35).
  static constexpr bool kEarlyRelease = kFp8;
  // Column chunks a TMA load covers: 1 (a 3-D box of 64 columns, kColChunks loads a tile), or more
  // (pages >= 64: a 4-D box whose outermost dimension is the chunk, so that one load writes the
  // chunk-major slabs of that many chunks; the H200 trace gave the 9 issues of an e4m3 d = 576 tile
  // ~540 clocks of the P V side's chain). Cluster CTA r loads the groups g with g % CLUSTER_M == r.
  static constexpr int kChunksPerLoad = CHUNKS_PER_LOAD_;
  static_assert(kChunksPerLoad == 1 || (SPARSE_KV_ == 0 && PAGE_SIZE_ >= BLOCK_N_ &&
                                        (HEAD_DIM_ / 64) % kChunksPerLoad == 0),
                "a tile-wide box: the dense decode, a page per tile, whole groups of chunks");
  static_assert(SPARSE_KV_ >= 0 && SPARSE_KV_ <= 2, "SPARSE_KV: 0 (dense paged), 1 (FP8 records), 2 (bf16 rows)");
  static_assert(!kSparse || (cute::is_same_v<Element, cutlass::bfloat16_t> && !KV_FP8_ && !FUSED_COMBINE_ &&
                             (CLUSTER_M_ == 1 || kSparseFp8) && (kSparseFp8 || PAGE_SIZE_ == 64)),
                "sparse: bf16, the combine kernel, clusters for FP8 records only; bf16 rows have no pages "
                "(PAGE_SIZE 64 stands in)");
  // FP8 records with CLUSTER_M 2 ("crossover", FlashMLA's name): the two head tiles of a row (grid z
  // 2 = the cluster) share each tile's de-quantization. CTA rank c gathers and converts tokens 32 c ..
  // 32 c + 31 of every tile into its own stage and sends them to its peer's by bulk copies (shared ->
  // distributed shared memory, completing on the peer's kv_ready); its record slot holds half a tile,
  // so two slots fit and the gather runs three tiles ahead. See the header's "Crossover".
  static constexpr bool kCrossover = kSparseFp8 && CLUSTER_M_ == 2;
  static constexpr int kRecordSlots = kCrossover ? 2 : 1;
  static constexpr int kSlotTokens = BLOCK_N_ / kRecordSlots;  // tokens of a record slot
  static_assert(!kSparseFp8 || (HEAD_DIM_ == 576 && NUM_STAGES_ == 2), "FP8 records: d 576, 2 stages, a record slot");
  // The P V warpgroups de-quantize each tile into its 16-bit stage and announce it on kv_ready.
  static constexpr bool kDequantInPv = kKvFp8 || kSparseFp8;
  // The FP8 record of a token (records.cuh). ws_gather_slot / ws_dequant_records map threads onto the
  // V3.2 geometry: 4 threads a token, a quarter (128 values and its scale, 2 rope chunks) each.
  using Record = RECORD_;
  static_assert(!kSparseFp8 || (Record::kNopeValues == 512 && Record::kValuesPerScale == 128 &&
                                Record::kRopeValues == 64 && HEAD_DIM_ == Record::kNopeValues + Record::kRopeValues),
                "FP8 records: the V3.2 geometry (512 e4m3 in 4 scaled quarters, 64 bf16 rope)");
  static constexpr int kRecordBytes = Record::kBytes;
  // Sparse: slots of the per-token valid bits, by tile (tile m's in slot m % kFlagSlots). Records
  // are gathered two tiles ahead of their stage's reuse, so 4 slots; bf16 rows a slot per stage.
  static constexpr int kFlagSlots = kSparseFp8 ? 4 : NUM_STAGES_;
  // Sparse: the P V warpgroups' 256 threads gather each tile (cp.async, 4 threads a token).
  static constexpr int kGatherThreads = 256;
  static constexpr int kGatherChunks = HEAD_DIM * 2 / 16 / 4;  // 16-byte chunks per thread and tile
  static_assert(!kSparse || HEAD_DIM * 2 % 64 == 0, "whole chunks per gathering thread");

  static_assert(HEAD_DIM_V == 512, "Q[:, :DV - 16] (or all of e4m3 Q) in registers, two O halves of 256");
  static_assert(HEAD_DIM == HEAD_DIM_V || HEAD_DIM == HEAD_DIM_V + 64, "rope part: none or 64 columns");
  static_assert(NUM_STAGES >= 2, "stages");

  // Q[:, :kQRegCols] is the register A operand of S: 124 registers. Not all 128 of Q[:, :DV]: the
  // wgmma accumulator of a warpgroup sits at R24 upwards and ptxas needs its highest register
  // + 3 <= the setmaxnreg count, so S (32) + Q (124) fit kRegsS = 184 and 128 would not.
  // Q[:, kQRegCols:DV] (16 columns, SW32 tile) and the rope columns stay in smem (SS wgmma).
  // e4m3: all of Q is 72 registers (18 k-steps of 32 columns), so S is register-A wgmma alone.
  static constexpr int kQRegCols = kFp8 ? HEAD_DIM : HEAD_DIM_V - 16;
  // d > dv: P goes into the rope columns of its stage's K tile; 16-bit Q's rope part is in smem.
  static constexpr bool kPInRope = HEAD_DIM > HEAD_DIM_V && !kEarlyRelease;
  // aux: 16-bit Q rope (BLOCK_M x 64) when kPInRope, else one P tile (BLOCK_M x BLOCK_N) per stage
  // (early release: per P slot).
  // Early release: P(n) in slot n % kEarlyPSlots, whose previous P V (n - kEarlyPSlots) WG0 waits for
  // before the store; the other stage-indexed slots (row_scale, tile_rescale, info) need it <= NS.
  // 3, not 2 (H200, interleaved, bench/NOTES.md session 38): with 2 WG0 waited ~200 clocks a tile
  // for its slot; 3 is 1.04-1.06x faster at h_q 128 s_q 1, 1.01-1.05x at s_q 2, 0.99x at s_q 4-16.
  static constexpr int kEarlyPSlots = 3;
  static_assert(!kEarlyRelease || kEarlyPSlots <= NUM_STAGES, "a P V wait per P slot covers the stage's slots");
  static constexpr int kPSlots = kEarlyRelease ? kEarlyPSlots : NUM_STAGES;
  static constexpr int kAuxElems = kPInRope ? (kFp8 ? 16 : BLOCK_M * 64) : kPSlots * BLOCK_M * BLOCK_N;

  // Q[:, kQRegCols:DV]: 64 x 16, K-major with the 32B swizzle (16-bit only; a 32-column e4m3
  // atom stands in for the unused type).
  using SmemLayoutQ16 = decltype(cute::tile_to_shape(cute::GMMA::Layout_K_SW32_Atom<Element>{},
                                                     cute::Shape<cute::Int<BLOCK_M>, cute::Int<kFp8 ? 32 : 16>>{}));

  // S, register part: A = Q[:, :kQRegCols] from registers, B = K from smem.
  using TiledMmaSRs = decltype(cute::make_tiled_mma(
      cute::GMMA::rs_op_selector<Element, Element, float,
                                 cute::Shape<cute::Int<BLOCK_M>, cute::Int<BLOCK_N>, cute::Int<kQRegCols>>>()));
  // e4m3: S by token halves (tokens 0-31, then 32-63: two commit groups), the first half's softmax
  // beside the second half's wgmmas (ws_softmax_halves). The halves' accumulators are the two halves
  // of S's fragment (elements 0-15: columns 0-31). The configs pick it where it won (configs/decode.py,
  // S_HALVES_MIN_ROWS): the first half's P is stored, and the stage released, after the slot wait,
  // which costs the rows of one or two row tiles a KV head more than the overlap gains.
  static constexpr bool kSHalves = S_HALVES_;
  static_assert(!kSHalves || kFp8, "S halves: the e4m3 kernel");
  using TiledMmaSRsHalf = decltype(cute::make_tiled_mma(
      cute::GMMA::rs_op_selector<Element, Element, float,
                                 cute::Shape<cute::Int<BLOCK_M>, cute::Int<BLOCK_N / 2>, cute::Int<kQRegCols>>>()));
  // S smem part (Q[:, kQRegCols:DV] and the rope): both operands from smem, same accumulator layout.
  using TiledMmaSSs = decltype(cute::make_tiled_mma(
      cute::GMMA::ss_op_selector<Element, Element, float,
                                 cute::Shape<cute::Int<BLOCK_M>, cute::Int<BLOCK_N>, cute::Int<64>>>()));
  // e4m3: O^T (64 dv a wgmma, the rows as N) += V^T (registers) P^T (P's slab, K-major as stored).
  // Compact rows: N is the 32 query rows alone (WG0 stores P(row r) at slab row r), which halves the
  // P V wgmmas and O^T's accumulators.
  static constexpr int kOtRows = kTileQueryRows;
  using TiledMmaOt = decltype(cute::make_tiled_mma(
      cute::GMMA::rs_op_selector<Element, Element, float,
                                 cute::Shape<cute::Int<64>, cute::Int<kOtRows>, cute::Int<BLOCK_N>>>()));
  using SmemLayoutPt = decltype(cute::tile_to_shape(typename Tiles::SwAtom{},
                                                    cute::Shape<cute::Int<kOtRows>, cute::Int<BLOCK_N>>{}));

  // KV_FP8: tile n lands in slot n % NUM_STAGES (the cache's e4m3 bytes) and is de-quantized into
  // kv[n % NUM_STAGES]. A base class, empty otherwise: the 16-bit kernels have no byte to spare.
  struct LandingSlots {
    alignas(1024) unsigned char landing[NUM_STAGES][Tiles::kTileBytes];
  };
  struct NoLandingSlots {};
  // FP8 records: one tile of records (41 KB), gathered a tile ahead of its de-quantization, a bulk
  // copy a token completing on `landed` (BLOCK_N arrivals and the records' bytes).
  struct RecordSlot {
    alignas(1024) unsigned char records[kRecordSlots][kSlotTokens * kRecordBytes];
    // Zeros (written once), de-quantized in place of an invalid token's stale slot bytes.
    alignas(16) unsigned char null_record[kRecordBytes];
    alignas(8) uint64_t landed[kRecordSlots];
    // Crossover: the 8 P V warps have read slot k's records (its refill waits), and the peer's P V
    // warpgroups are past their use of stage s (one arrival from the peer: this CTA may write it).
    uint64_t slot_read[kRecordSlots];
    uint64_t peer_free[NUM_STAGES];
    // Crossover: the peer's WG0 has seen stage s's tile complete, so this CTA's copies of its half
    // have read their source: WG0 waits it before P(n) overwrites the rope rows (kPInRope), one of
    // the copies' sources. One arrival from the peer a tile.
    uint64_t copy_landed[NUM_STAGES];
  };
  struct SharedStorage
      : cute::conditional_t<kKvFp8, LandingSlots, cute::conditional_t<kSparseFp8, RecordSlot, NoLandingSlots>> {
    alignas(1024) Element kv[NUM_STAGES][BLOCK_N * HEAD_DIM];
    alignas(1024) Element aux[kAuxElems];
    alignas(256) Element q16[kFp8 ? 16 : BLOCK_M * 16];  // Q[:, kQRegCols:DV] (16-bit)
    // e4m3: whether any row of WG0's warp w rescaled O in the tile of stage s (O^T's columns are
    // every row: one 16-byte read tells the P V thread whether to load its 16 rows' scales).
    alignas(16) int tile_rescale[kFp8 ? NUM_STAGES : 1][4];
    // O rescale of the tile in stage s: exp2(m_old - m_new), times 1/l at the last tile of a piece
    // (whose P is scaled by 1/l as well, so the P V warpgroups store O as it is). e4m3: P stays
    // unnormalized (P / l would fall below e4m3's range), and [BLOCK_M + row] holds the factor O
    // gets after a piece's last tile: 1/l times the cache's descale.
    float row_scale[NUM_STAGES][kFp8 ? 2 * BLOCK_M : BLOCK_M];
    // e4m3: tokens of the tile in stage s that are < L (set by the producer with the TMA): the P V
    // warpgroups zero the others' V while transposing. Sparse: the tile's valid flags, a bit per
    // token (words 2 s and 2 s + 1; byte w written by gathering warp w), which mask S.
    int tile_valid[kSparse ? 2 * kFlagSlots : kDescaled ? NUM_STAGES : 1];
    detail::WsTileInfo info[NUM_STAGES];
    // TMA producer state, touched by thread 128 only: in smem so that it costs no registers in the
    // (register-bound) P V warpgroup.
    detail::WorkCursor prod;
    int prod_n;  // index of the next tile to issue
    // Fused combine: batches whose splits this CTA merges after its main loop (thread 128 appends).
    int pending[2][3];  // (batch, first split slot, split count) to merge after the main loop
    int num_pending;
    alignas(8) uint64_t full[NUM_STAGES];     // TMA landed (tx-count barrier); sparse: the gather did
    uint64_t p_full[NUM_STAGES];               // WG0 wrote P / row_scale / info (4 warp arrivals)
    uint64_t pv_done[NUM_STAGES];              // WG1 + WG2 of every cluster CTA finished P V (8 x CLUSTER_M;
                                               // early release: of this CTA, 8)
    // Early release: WG0's S and the P V warps' V^T loads of every cluster CTA are done with the stage
    // (12 x CLUSTER_M); the producer waits this instead of pv_done.
    uint64_t stage_free[kEarlyRelease ? NUM_STAGES : 1];
    uint64_t kv_ready[kDequantInPv ? NUM_STAGES : 1];  // the stage is de-quantized (8 P V warps)
  };
  // At d = 576 with 3 stages the +1024 alignment slack does not fit (see Sm90SmemSize).
  static constexpr int kSmemBytes = Sm90SmemSize<SharedStorage>::kBytes;
};

namespace detail {

// The CTA's metadata row. Recomputed where needed (through an opaque move, so it is not hoisted):
// values that live through a loop cost registers (see kRegsS).
__device__ __forceinline__ const int* ws_meta(const DecodeParams& p) {
  return p.tile_scheduler_metadata + opaque(blockIdx.x) * kMetaSize;
}

// ================================ TMA producer (thread 128) ================================

// Loads tile prod_n into stage prod_n % NS once every P V warp is done with tile prod_n - NS
// (thread 128 only; its state is in smem). When one CTA or cluster covers every row tile, KV is
// read once: its lines go first out of L2, so that the split partials (stored with evict_last)
// are still in L2 when they are merged (H200: +3-4% on 32/1/4096/*). Otherwise the other row
// tiles' CTAs read the same KV through L2: normal priority (evict_first cost 1-4% on the
// h_q = 128 rows before clusters).
template <typename Cfg, typename Lens>
__device__ __forceinline__ void ws_issue_tile(const DecodeParams& p, Lens seqlens, const TmaDescriptor* tmap,
                                              typename Cfg::SharedStorage& ss) {
  using Element = typename Cfg::Element;
  constexpr int BN = Cfg::BLOCK_N, NS = Cfg::NUM_STAGES;
  WorkCursor& prod = ss.prod;
  const int n = ss.prod_n;
  const int stage = n % NS;
  const int g = blockIdx.y;
  const int* bt = p.block_table + (long long)prod.bi * p.block_table_stride;
  // e4m3 cache under a 16-bit kernel: the tile lands in its slot (de-quantized by ws_dequant_tile).
  unsigned char* dst = reinterpret_cast<unsigned char*>(ss.kv[stage]);
  if constexpr (Cfg::kKvFp8) dst = ss.landing[stage];
  constexpr int kChunkBytes = BN * Cfg::kBoxCols * Cfg::kKvBytes, kBoxBytes = Cfg::kBoxRows * Cfg::kBoxCols * Cfg::kKvBytes;
  const uint64_t kv_policy =
      gridDim.z == Cfg::CLUSTER_M ? l2_evict_first_policy() : l2_evict_normal_policy();
  // Column chunk i of the tile is loaded by cluster CTA i % CLUSTER_M, for every CTA.
  const uint32_t rank = Cfg::CLUSTER_M > 1 ? cluster_cta_rank() : 0;
  auto load_chunk = [&](int i, unsigned char* chunk_dst, int col, int row) {
    if constexpr (Cfg::CLUSTER_M == 1) {
      tma_load_3d_hint(chunk_dst, tmap, &ss.full[stage], col, g, row, kv_policy);
    } else if (i % Cfg::CLUSTER_M == int(rank)) {
      tma_load_3d_multicast_hint(chunk_dst, tmap, &ss.full[stage], col, g, row,
                                 uint16_t((1u << Cfg::CLUSTER_M) - 1), kv_policy);
    }
  };

  // Before the TMA's arrive: WG1/WG2 read it once full[stage] completes.
  auto note_valid = [&] {
    if constexpr (Cfg::kDescaled) ss.tile_valid[stage] = min(BN, prod.L - prod.tok);
  };
  // Block-table reads first: their latency overlaps the wait for the stage.
  if constexpr (Cfg::kPagesPerTile == 1) {
    const int page = prod.tok / Cfg::PAGE_SIZE;
    const int row = bt[page] * Cfg::PAGE_SIZE + (prod.tok % Cfg::PAGE_SIZE);
    if (n >= NS) mbarrier_wait(Cfg::kEarlyRelease ? &ss.stage_free[stage] : &ss.pv_done[stage], (n / NS - 1) & 1);
    if (Cfg::kFp8) WsPhaseTrace::mark(n - NS, 8);   // issued beside P V(n - NS)
    note_valid();
    mbarrier_arrive_expect_tx(&ss.full[stage], Cfg::kTileBytes);
    if constexpr (Cfg::kChunksPerLoad > 1) {
      // (col, head, token, chunk): group j = chunks [j K, j K + K) in one load.
      constexpr int K = Cfg::kChunksPerLoad;
#pragma unroll
      for (int j = 0; j < Cfg::kColChunks / K; ++j) {
        if constexpr (Cfg::CLUSTER_M == 1) {
          tma_load_4d_hint(dst + j * K * kChunkBytes, tmap, &ss.full[stage], 0, g, row, j * K, kv_policy);
        } else if (j % Cfg::CLUSTER_M == int(rank)) {
          tma_load_4d_multicast_hint(dst + j * K * kChunkBytes, tmap, &ss.full[stage], 0, g, row, j * K,
                                     uint16_t((1u << Cfg::CLUSTER_M) - 1), kv_policy);
        }
      }
    } else {
#pragma unroll
      for (int c = 0; c < Cfg::kColChunks; ++c) load_chunk(c, dst + c * kChunkBytes, c * Cfg::kBoxCols, row);
    }
    if (Cfg::kFp8) WsPhaseTrace::mark(n - NS, 9);
  } else {
    // Several pages per tile: load only pages that hold tokens < L (later block_table
    // entries may be garbage, later pages NaN).
    const int valid = min(BN, prod.L - prod.tok);
    const int npages = (valid + Cfg::PAGE_SIZE - 1) / Cfg::PAGE_SIZE;
    const int* pages = bt + prod.tok / Cfg::PAGE_SIZE;
    // The block-table reads follow the wait here: kept in registers across it, the page rows
    // spill in this (register-bound) P V warpgroup at small page sizes.
    if (n >= NS) mbarrier_wait(Cfg::kEarlyRelease ? &ss.stage_free[stage] : &ss.pv_done[stage], (n / NS - 1) & 1);
    note_valid();
    mbarrier_arrive_expect_tx(&ss.full[stage], npages * Cfg::kPageBytes);
#pragma unroll 1
    for (int j = 0; j < npages; ++j) {
      const int row = pages[j] * Cfg::PAGE_SIZE;
#pragma unroll
      for (int c = 0; c < Cfg::kColChunks; ++c)
        load_chunk(c, dst + c * kChunkBytes + j * kBoxBytes, c * Cfg::kBoxCols, row);
    }
  }
  ss.prod_n = n + 1;
  prod.template advance<BN>(seqlens);
}

// The producer's start (thread 128): its walk, and tile 0 at once. Tiles 1 .. NUM_STAGES - 1 wait
// for WG0's first Q (ws_pv_warpgroup).
template <typename Cfg, typename Lens>
__device__ __forceinline__ void ws_producer_start(const DecodeParams& p, Lens seqlens, const TmaDescriptor* tmap,
                                                  typename Cfg::SharedStorage& ss) {
  const int* meta = ws_meta(p);
  const int b0 = meta[kMetaBeginBatch], t0 = meta[kMetaBeginToken];
  // The first tile's block-table entry into L2 while the walk reads the sequence length
  // (only for a non-empty range: with every sequence empty the table may have no columns).
  if (meta_has_range(meta) && b0 < p.b)
    prefetch_l2(p.block_table + (long long)b0 * p.block_table_stride + t0 / Cfg::PAGE_SIZE);
  ss.prod_n = 0;
  ss.prod.init(meta, seqlens);
  if (ss.prod.valid()) ws_issue_tile<Cfg>(p, seqlens, tmap, ss);
}

// One arrival per warp (all of whose reads of stage s are done) on bars[s] of every CTA of the
// cluster: lane r tells cluster CTA r, whose producer multicasts into this CTA's stage too.
// bars: pv_done, or stage_free (early release; also WG0's warps).
template <typename Cfg>
__device__ __forceinline__ void ws_release_stage(uint64_t* bars, int stage, int lane) {
  __syncwarp();
  if constexpr (Cfg::CLUSTER_M == 1) {
    if (lane == 0) mbarrier_arrive(&bars[stage]);
  } else {
    if (lane < Cfg::CLUSTER_M) mbarrier_arrive_cluster(&bars[stage], lane);
  }
}

// ============================ WG0: S = Q K^T, online softmax, P ============================

// Thread geometry of WG0, recomputed inside its loop from an opaque thread index so that the
// compiler does not keep ~10 derived values live through it. Accumulator (and register-A)
// fragment of a 64 x N wgmma: element i of thread t of the warpgroup lives at row
// ws_row0(t) + 8*((i/2)%2), column (i/4)*8 + ws_col_lane(t) + i%2.
__device__ __forceinline__ int ws_row0(int t) { return (t / 32) * 16 + (t % 32) / 4; }
__device__ __forceinline__ int ws_col_lane(int t) { return (t % 4) * 2; }

// The query row (of the CTA's KV head, < p.rows where real) of tile row `tile_row` of row tile
// m_block: tile row i is row m_block BM + i, or with compact rows (Cfg::kCompactRows) row
// 8 (i / 16) + i % 16 where i % 16 < 8, and none (kNoQueryRow) in the other half.
constexpr int kNoQueryRow = 1 << 30;
template <typename Cfg>
__device__ __forceinline__ int ws_query_row(int m_block, int tile_row) {
  if constexpr (Cfg::kCompactRows) {
    return tile_row % 16 < 8 ? m_block * Cfg::kTileQueryRows + (tile_row / 16) * 8 + tile_row % 16 : kNoQueryRow;
  } else {
    return m_block * Cfg::BLOCK_M + tile_row;
  }
}

// WG0's state through its tile loop: the register part of S's wgmma, its A operand Q[:, :kQRegCols]
// in registers, S (then P) of the current tile, the walk, and the running max and sum of the
// thread's two rows.
template <typename Cfg>
struct WsSoftmaxState {
  using Element = typename Cfg::Element;
  using TiledMmaSRs = typename Cfg::TiledMmaSRs;
  static constexpr int BM = Cfg::BLOCK_M, BN = Cfg::BLOCK_N, kQRegCols = Cfg::kQRegCols;
  // Q[:, :kQRegCols] as the register A operand, fragment ((2,2,2), 1, kQRegCols/16) = 4 x 32-bit
  // registers per k-step. Register i (elements 2i, 2i+1) holds row row0 + 8*(i&1), columns
  // 16*(i/4) + col_lane + 8*((i>>1)&1) + {0,1}: the PTX wgmma A-fragment layout (CuTe's
  // ALayout_64x16; checked against partition_A of an identity tensor on the host).
  // e4m3 (k32 steps, 4 elements a register): the same bytes per register (CuTe's ALayout_64x32).
  static_assert(cute::is_same_v<typename TiledMmaSRs::Atom::Traits::ALayout,
                                cute::conditional_t<Cfg::kFp8, cute::GMMA::ALayout_64x32, cute::GMMA::ALayout_64x16>>,
                "Q register fragment layout");
  using FragQ = decltype(cute::make_tensor<Element>(
      cute::partition_shape_A(TiledMmaSRs{}, cute::Shape<cute::Int<BM>, cute::Int<kQRegCols>>{})));
  // S of a tile: element i is at row row0 + 8 ((i / 2) % 2), column (i / 4) 8 + col_lane + i % 2.
  using FragS = decltype(cute::partition_fragment_C(TiledMmaSRs{}, cute::Shape<cute::Int<BM>, cute::Int<BN>>{}));
  static_assert(decltype(cute::size(FragS{}))::value == BN / 2, "S fragment");

  TiledMmaSRs mma_rs;
  FragQ tSrQ;
  FragS tSrS;
  WsCursor cur;
  float m_run[2], l_run[2];  // running max (log2 units, scaled) and per-thread partial sum

  // Q's fragment as 32-bit registers.
  __device__ __forceinline__ auto q32() { return cute::recast<uint32_t>(tSrQ); }
  // kSHalves: S's token half t (columns 32 t .. 32 t + 31) as the accumulator of an N = 32 wgmma:
  // elements 16 t .. 16 t + 15 of tSrS (element i is column (i / 4) 8 + col_lane + i % 2).
  using FragSHalf = decltype(cute::partition_fragment_C(typename Cfg::TiledMmaSRsHalf{},
                                                        cute::Shape<cute::Int<BM>, cute::Int<BN / 2>>{}));
  static_assert(decltype(cute::size(FragSHalf{}))::value * 2 == decltype(cute::size(FragS{}))::value, "S halves");
  __device__ __forceinline__ auto s_half(int t) {
    return cute::make_tensor(tSrS.data() + t * int(cute::size(FragSHalf{})), typename FragSHalf::layout_type{});
  }
};

// WG0's walk to its first piece, with Q of the first batch prefetched into L2 meanwhile.
template <typename Cfg, typename Lens>
__device__ __forceinline__ void ws_seek_first_piece(const DecodeParams& p, Lens seqlens,
                                                    WsSoftmaxState<Cfg>& st) {
  using Element = typename Cfg::Element;
  constexpr int BM = Cfg::BLOCK_M, D = Cfg::HEAD_DIM;
  const int* meta = ws_meta(p);
  const int b0 = meta[kMetaBeginBatch];
  // Q of b0 (the first piece's batch unless that sequence is empty) into L2 while the walk
  // reads the sequence length: the piece start's loads then wait one round trip less. A part
  // without work has an all-zero (empty) range: nothing to prefetch.
  if (meta_has_range(meta) && b0 < p.b) {
    const int m_block = blockIdx.z, g = blockIdx.y;
    const char* qb = reinterpret_cast<const char*>(reinterpret_cast<const Element*>(p.q) + (long long)b0 * p.q_stride_b);
    constexpr int kRowBytes = D * int(sizeof(Element)), kLines = (kRowBytes + 127) / 128 + 1;
    for (int idx = threadIdx.x; idx < BM * kLines; idx += 128) {
      const int r = m_block * BM + idx / kLines;
      if (r < p.rows) {
        const auto [s, head] = query_row(p, g, r);
        const char* row = qb + (s * p.q_stride_s + head * p.q_stride_h) * int(sizeof(Element));
        prefetch_l2(row + min((idx % kLines) * 128, kRowBytes - 1));
      }
    }
  }
  st.cur.seek(meta, seqlens, b0);
}

// Q of st.cur's piece into registers (Q[:, :kQRegCols]) and smem (the rest), running max and sum
// reset. first: the CTA's first piece (the producer waits for it before issuing more tiles).
template <typename Cfg>
__device__ __forceinline__ void ws_load_q(const DecodeParams& p, typename Cfg::SharedStorage& ss,
                                          WsSoftmaxState<Cfg>& st, bool first) {
  using Element = typename Cfg::Element;
  constexpr int BM = Cfg::BLOCK_M, DV = Cfg::HEAD_DIM_V, kQRegCols = Cfg::kQRegCols;
  auto tSrQ32 = st.q32();
  static_assert(decltype(cute::size(tSrQ32))::value == BM * kQRegCols * int(sizeof(Element)) / 4 / 128,
                "Q fragment");
  const int tw = opaque(threadIdx.x % 128);
  const int row0 = ws_row0(tw);
  const int m_block = blockIdx.z, g = blockIdx.y;
  // Every warp's S of the previous piece has completed (wgmma wait) before anyone
  // rewrites Q's smem part; Q's register part is thread-private.
  named_barrier_sync(kBarWG0, 128);
  const Element* qb = reinterpret_cast<const Element*>(p.q) + (long long)st.cur.bi * p.q_stride_b;
  // Every load of Q is issued before any of them is used, so that they are in flight together:
  // waited one after another behind the KV tiles' TMA traffic, a CTA's first Q took ~10 us
  // (clock trace, 32/1/4096/16 on the H200). First the smem parts, by cp.async (no registers):
  // Q[:, kQRegCols:DV] -> q16 (64 rows x 2 chunks of 16 B: one chunk per thread), SW32:
  // chunk index c ^ ((r / 4) % 2) (CuTe's Layout_K_SW32_Atom, SmemLayoutQ16; checked against
  // CuTe on the host).
  // Q[:, DV:D] (kPInRope) -> aux, SW128: BM * 8 / 128 chunks per thread. (e4m3: none, all of
  // Q goes to registers.)
  if constexpr (!Cfg::kFp8) {
    const int lr = tw / 2, c = tw % 2;
    const int r = ws_query_row<Cfg>(m_block, lr);
    const auto [s, head] = query_row(p, g, r);
    cp_async_16(smem_addr(ss.q16) + lr * 32 + ((c ^ ((lr / 4) % 2)) << 4),
                r < p.rows ? qb + s * p.q_stride_s + head * p.q_stride_h + kQRegCols + c * 8 : qb, r < p.rows);
  }
  if constexpr (Cfg::kPInRope && !Cfg::kFp8) {
    static_assert(BM * 8 % 128 == 0, "rope chunks per thread");
#pragma unroll
    for (int i = 0; i < BM * 8 / 128; ++i) {
      const int idx = tw + 128 * i;
      const int r = ws_query_row<Cfg>(m_block, idx / 8);
      const auto [s, head] = query_row(p, g, r);
      cp_async_16(smem_addr(ss.aux) + sw128_offset<BM>(idx / 8, (idx % 8) * 8),
                  r < p.rows ? qb + s * p.q_stride_s + head * p.q_stride_h + DV + (idx % 8) * 8 : qb, r < p.rows);
    }
  }
  // then the register part, in 16-byte loads. Register i of the A fragment holds word tq
  // (= lane % 4) of 16-byte chunk 2 (i / 4) + (i / 2) % 2 of row row0 + 8 (i % 2), so
  // registers 8 j + h + 2 w (w = 0..3) hold word tq of chunks 4 j + w of row h. Lane tq
  // loads chunk 4 j + tq into them (a word for each lane of its quad), and a 4 x 4
  // transpose over the quad gives every lane its own words. Scattered 4-byte loads took
  // 2.4-4 us for a 64-row Q (clock trace, H200). The chunks past the last whole group (2 of
  // 62) are loaded word by word: a padded group would cost the 4 registers WG0 lacks.
  // The A fragment's byte layout is the same for e4m3 (k32 steps) as for 16-bit (k16 steps), so
  // all of this counts 16-byte chunks of kE elements.
  constexpr int kE = 16 / int(sizeof(Element));
  constexpr int kQGroups = kQRegCols / (4 * kE);
  constexpr int kQTailChunks = kQRegCols / kE - 4 * kQGroups;
  static_assert(kQRegCols * int(sizeof(Element)) % 32 == 0, "whole wgmma k-steps (32 bytes)");
  const int tq = tw % 4;
  uint32_t qx[2][kQGroups][4];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = ws_query_row<Cfg>(m_block, row0 + 8 * h);
    const auto [s, head] = query_row(p, g, Cfg::kCompactRows && r >= p.rows ? 0 : r);
    const Element* qrow = qb + s * p.q_stride_s + head * p.q_stride_h + tq * kE;
#pragma unroll
    for (int j = 0; j < kQGroups; ++j) {
      uint4 v = make_uint4(0u, 0u, 0u, 0u);  // padded rows are zero: no NaN from garbage
      if (r < p.rows) v = __ldg(reinterpret_cast<const uint4*>(qrow + j * 4 * kE));
      qx[h][j][0] = v.x;
      qx[h][j][1] = v.y;
      qx[h][j][2] = v.z;
      qx[h][j][3] = v.w;
    }
#pragma unroll
    for (int w = 0; w < kQTailChunks; ++w) {
      uint32_t v = 0u;
      if (r < p.rows) v = __ldg(reinterpret_cast<const uint32_t*>(qrow + (4 * kQGroups + w - tq) * kE + kE / 4 * tq));
      tSrQ32(8 * kQGroups + h + 2 * w) = v;
    }
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
#pragma unroll
    for (int j = 0; j < kQGroups; ++j) {
      uint32_t(&x)[4] = qx[h][j];
      // Butterfly on lane bit b: a lane takes, into each slot w whose bit b differs from its
      // own, its partner's slot w ^ (1 << b). After both bits, slot w of lane q holds
      // word q of the chunk lane w loaded.
#pragma unroll
      for (int b = 1; b <= 2; b <<= 1) {
        const bool hi = tq & b;
#pragma unroll
        for (int w0 = 0; w0 < 4; ++w0) {
          if (w0 & b) continue;
          const uint32_t send = hi ? x[w0] : x[w0 + b];
          const uint32_t recv = __shfl_xor_sync(0xffffffffu, send, b);
          if (hi) {
            x[w0] = recv;
          } else {
            x[w0 + b] = recv;
          }
        }
      }
#pragma unroll
      for (int w = 0; w < 4; ++w) tSrQ32(8 * j + h + 2 * w) = x[w];
    }
  }
  cute::warpgroup_fence_operand(tSrQ32);
  cp_async_wait_all();
  fence_proxy_async_shared();
  named_barrier_sync(kBarWG0, 128);
  if (first) named_barrier_arrive(kBarFirstQ, ws_first_q_threads<Cfg>());  // the producer may start the KV TMAs
  if (first && tw == 0) MLA_JIT_TRACE_TIME(mla_jit_trace_splitkv, kTraceFirstQ);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    st.m_run[h] = -kInf;
    st.l_run[h] = 0.f;
  }
}

// S(n) into st.tSrS, two commit groups (kSFirstGroupK), once tile n (st.cur's tile) has landed.
// Not waited here.
template <typename Cfg>
__device__ __forceinline__ void ws_issue_s(typename Cfg::SharedStorage& ss, WsSoftmaxState<Cfg>& st, int n) {
  using namespace cute;
  using Element = typename Cfg::Element;
  constexpr int BN = Cfg::BLOCK_N, D = Cfg::HEAD_DIM, DV = Cfg::HEAD_DIM_V, NS = Cfg::NUM_STAGES;
  auto& mma_rs = st.mma_rs;
  auto& tSrS = st.tSrS;
  auto tSrQ32 = st.q32();
  const int tw = opaque(threadIdx.x % 128);
  const int stage = n % NS;
  Element* kv = ss.kv[stage];
  if ((Cfg::kSparse || Cfg::kFp8) && tw == 0) WsPhaseTrace::mark(n, 0);
  // KV_FP8: the P V warpgroups de-quantized the tile (tail rows zeroed there).
  mbarrier_wait(Cfg::kDequantInPv ? &ss.kv_ready[stage] : &ss.full[stage], (n / NS) & 1);
  if ((Cfg::kSparse || Cfg::kFp8) && tw == 0) WsPhaseTrace::mark(n, 1);
  // Crossover: the peer's half of tile n has landed here (its copies are done reading their source).
  if constexpr (Cfg::kCrossover) {
    if (tw == 0) mbarrier_arrive_cluster(&ss.copy_landed[stage], cluster_cta_rank() ^ 1u);
  }
  // bf16 rows: the gather's cp.async bytes (generic proxy) are read by wgmma (async proxy).
  if constexpr (Cfg::kSparse && !Cfg::kSparseFp8) fence_proxy_async_shared();
  if (n == 0 && tw == 0) MLA_JIT_TRACE_TIME(mla_jit_trace_splitkv, kTraceTile0);
  // (Sparse rows are topk long, a multiple of BN: no tail.)
  if (!Cfg::kKvFp8 && !Cfg::kSparse && st.cur.tok + BN > st.cur.L) {
    // Tail tile: rows >= L were not loaded (other pages) or hold data past the sequence
    // end (possibly NaN). Zero them (all columns: WG1/WG2 read the V part) so that neither
    // S nor P V can pick up NaN.
    if constexpr (Cfg::kFp8) {
      zero_chunk_rows_from<BN, Cfg::kColChunks, Cfg::kChunkRowBytes>(smem_addr(kv), st.cur.L - st.cur.tok, tw);
    } else {
      zero_rows_from<BN, D>(smem_addr(kv), st.cur.L - st.cur.tok, tw);
    }
    fence_proxy_async_shared();
    named_barrier_sync(kBarWG0, 128);
  }
  // ---- S = Q K^T: Q[:, :kQRegCols] RS (Q from registers), the rest SS ----
  auto thr_rs = mma_rs.get_thread_slice(tw);
  typename Cfg::TiledMmaSSs mma_ss;
  auto thr_ss = mma_ss.get_thread_slice(tw);
  Tensor sK = make_tensor(make_smem_ptr(kv), typename Cfg::SmemLayoutK{});
  Tensor tSrK = thr_rs.partition_fragment_B(sK);  // (MMA, 1, D / 16)
  Tensor tSsK = thr_ss.partition_fragment_B(sK);  // same descriptors, SS atom
  Tensor sQ16 = make_tensor(make_smem_ptr(ss.q16), typename Cfg::SmemLayoutQ16{});
  Tensor tSrQ16 = thr_ss.partition_fragment_A(sQ16);  // (MMA, 1, 1)
  constexpr int kRegK = Cfg::kQRegCols * int(sizeof(Element)) / 32;  // register k-steps (32 bytes each)
  warpgroup_fence_operand(tSrQ32);
  warpgroup_fence_operand(tSrS);
  warpgroup_arrive();
  if constexpr (Cfg::kSHalves) {
    // Token half t: K rows 32 t .. 32 t + 31 of every chunk slab, into S's fragment half t; a commit
    // group each.
    typename Cfg::TiledMmaSRsHalf mma_half;
    auto thr_half = mma_half.get_thread_slice(tw);
#pragma unroll
    for (int t = 0; t < 2; ++t) {
      Tensor sKt = local_tile(sK, Shape<Int<BN / 2>, Int<D>>{}, make_coord(t, 0));
      Tensor tSrKt = thr_half.partition_fragment_B(sKt);  // (MMA, 1, D / 32)
      auto acc = st.s_half(t);
      mma_half.accumulate_ = GMMA::ScaleOut::Zero;
#pragma unroll
      for (int k = 0; k < kRegK; ++k) {
        gemm(mma_half, st.tSrQ(_, _, k), tSrKt(_, _, k), acc);
        mma_half.accumulate_ = GMMA::ScaleOut::One;
      }
      warpgroup_commit_batch();
    }
    warpgroup_fence_operand(tSrS);
    return;
  }
  mma_rs.accumulate_ = GMMA::ScaleOut::Zero;
  static_assert(Cfg::kSFirstGroupK >= 0 && Cfg::kSFirstGroupK <= kRegK, "S's first commit group");
#pragma unroll
  for (int k = 0; k < kRegK; ++k) {
    gemm(mma_rs, st.tSrQ(_, _, k), tSrK(_, _, k), tSrS);
    mma_rs.accumulate_ = GMMA::ScaleOut::One;
    if (Cfg::kSFirstGroupK > 0 && k + 1 == Cfg::kSFirstGroupK) warpgroup_commit_batch();
  }
  mma_ss.accumulate_ = GMMA::ScaleOut::One;
  if constexpr (!Cfg::kFp8) gemm(mma_ss, tSrQ16(_, _, 0), tSsK(_, _, kRegK), tSrS);
  if constexpr (Cfg::kPInRope && !Cfg::kFp8) {
    Tensor sQr = make_tensor(make_smem_ptr(ss.aux), typename Cfg::SmemLayoutSlab{});
    Tensor tSrQr = thr_ss.partition_fragment_A(sQr);  // (MMA, 1, 4)
#pragma unroll
    for (int k = 0; k < size<2>(tSrQr); ++k) gemm(mma_ss, tSrQr(_, _, k), tSsK(_, _, DV / 16 + k), tSrS);
  }
  warpgroup_commit_batch();
  warpgroup_fence_operand(tSrS);
}

// Waits for S(n) (issued by ws_issue_s), and publishes P(n - 1) (stage `unpublished`, if any)
// between its two commit groups. P(n - 1)'s stores reach the async proxy while S(n) runs (the
// fence waits for them); P(n - 1) goes to the P V warpgroups only once most of S(n) is done: S
// then has the tensor cores (nearly) to itself, and P V(n - 1) runs during the rest of it and this
// softmax (tile trace, H200: 4220 -> 3550 cycles per tile at h_q = 128 when published after all
// of S).
template <typename Cfg>
__device__ __forceinline__ void ws_wait_s(typename Cfg::SharedStorage& ss, WsSoftmaxState<Cfg>& st, int tw,
                                          int& unpublished) {
  fence_proxy_async_shared();
  if constexpr (Cfg::kSHalves || Cfg::kSFirstGroupK > 0) cute::warpgroup_wait<1>();
  else cute::warpgroup_wait<0>();
  if (unpublished >= 0) {
    __syncwarp();
    if (tw % 32 == 0) mbarrier_arrive(&ss.p_full[unpublished]);
    unpublished = -1;
  }
  // kSHalves: the second half is waited for in ws_softmax_halves, after the first half's softmax (its
  // accumulators and Q are still in use by its wgmmas here: only the first half is fenced).
  if constexpr (Cfg::kSHalves) {
    auto sa = st.s_half(0);
    cute::warpgroup_fence_operand(sa);
  } else {
    if constexpr (Cfg::kSFirstGroupK > 0) cute::warpgroup_wait<0>();
    cute::warpgroup_fence_operand(st.tSrS);
    auto tSrQ32 = st.q32();
    cute::warpgroup_fence_operand(tSrQ32);
  }
}

// Mask and online softmax of S(n) in place: st.tSrS becomes P (not yet divided by l), the running
// max and sum move, sc gets the O rescale of the tile for the thread's two rows.
template <typename Cfg>
__device__ __forceinline__ void ws_softmax(const DecodeParams& p, WsSoftmaxState<Cfg>& st, int row0, int col_lane,
                                           float (&sc)[2], float scale_log2, const int* valid_words) {
  constexpr int BN = Cfg::BLOCK_N;
  const int m_block = blockIdx.z;
  WsCursor& cur = st.cur;
  // Causal, bottom-right aligned: query s sees keys < L - s_q + s + 1. Keys < L - s_q + 1 are
  // visible to every row, so only a piece's last tile or two mask: the row limits need an
  // integer division (row / q_per_kv), a dependent chain on WG0's critical path.
  if (cur.tok + BN > cur.L - (p.causal ? p.s_q - 1 : 0)) {
    int lim[2];
    if constexpr (Cfg::kCompactRows) lim[1] = kNoQueryRow;   // the padding half: not masked
#pragma unroll
    for (int h = 0; h < Cfg::kRowHalves; ++h) lim[h] = visible_keys(p, cur.L, ws_query_row<Cfg>(m_block, row0 + 8 * h));
    // A select, so NaN never survives.
    mask_invisible(st.tSrS, cur.tok, col_lane, lim);
  }
  // Sparse: tokens whose index was invalid (zero rows) or past the row's topk_length.
  if constexpr (Cfg::kSparse) {
    const unsigned lo = valid_words[0], hi = valid_words[1];
    if ((lo & hi) != 0xffffffffu) {
#pragma unroll
      for (int i = 0; i < cute::size(st.tSrS); ++i) {
        const int c = (i / 4) * 8 + col_lane + (i & 1);  // (i / 4 < 4: c < 32)
        if (!(((i / 4 < 4 ? lo : hi) >> (c & 31)) & 1u)) st.tSrS(i) = -kInf;
      }
    }
  }
  // ---- online softmax (log2 domain) ----
  // Lazy rescaling: m_run moves only by more than kLazyRescaleLog2, so the O scale is exactly
  // 1 for almost every tile and the P V warpgroups skip the rescale (their multiplies
  // competed with this softmax for issue slots). Sparse: m_run is the exact max (max_logits).
  constexpr float kLazy = Cfg::kSparse ? 0.f : kLazyRescaleLog2;
  if constexpr (Cfg::kCompactRows) sc[1] = 1.f;   // the padding half's O rescale
#pragma unroll
  for (int h = 0; h < Cfg::kRowHalves; ++h) {
    const float mx = row_max(st.tSrS, h) * scale_log2;
    // -inf + 8 is -inf: a row's first visible key always moves it; an all-masked tile never.
    const bool move = mx > st.m_run[h] + kLazy;
    const float m_new = move ? mx : st.m_run[h];
    const float m_use = m_new == -kInf ? 0.f : m_new;  // avoid (-inf) - (-inf)
    sc[h] = move ? ex2_approx(st.m_run[h] - m_use) : 1.f;
    st.m_run[h] = m_new;
    const float sum = exp2_row(st.tSrS, h, scale_log2, m_use);
    st.l_run[h] = st.l_run[h] * sc[h] + sum;
  }
}

// kSHalves: ws_softmax in two steps, the first token half's while the second half's wgmmas run (ws_wait_s
// waited for the first). The first half moves m by its own max; where the second half's max moves it
// further, the first half's P and sum take the factor too (rare with the lazy rescale).
template <typename Cfg, bool kMayMask = true>
__device__ __forceinline__ void ws_softmax_halves(const DecodeParams& p, typename Cfg::SharedStorage& ss,
                                                  WsSoftmaxState<Cfg>& st, int row0, int col_lane, int stage, int n,
                                                  float (&sc)[2], float scale_log2) {
  constexpr int BN = Cfg::BLOCK_N;
  const int m_block = blockIdx.z;
  WsCursor& cur = st.cur;
  auto sa = st.s_half(0);
  auto sb = st.s_half(1);
  int lim[2];
  const bool masked = kMayMask && cur.tok + BN > cur.L - (p.causal ? p.s_q - 1 : 0);
  if (masked) {
    if constexpr (Cfg::kCompactRows) lim[1] = kNoQueryRow;
#pragma unroll
    for (int h = 0; h < Cfg::kRowHalves; ++h) lim[h] = visible_keys(p, cur.L, ws_query_row<Cfg>(m_block, row0 + 8 * h));
    mask_invisible(sa, cur.tok, col_lane, lim);
  }
  if constexpr (Cfg::kCompactRows) sc[1] = 1.f;
  float sum_a[2] = {0.f, 0.f}, m_use[2] = {0.f, 0.f};
#pragma unroll
  for (int h = 0; h < Cfg::kRowHalves; ++h) {
    const float mx = row_max(sa, h) * scale_log2;
    const bool move = mx > st.m_run[h] + kLazyRescaleLog2;
    const float m_new = move ? mx : st.m_run[h];
    m_use[h] = m_new == -kInf ? 0.f : m_new;
    sc[h] = move ? ex2_approx(st.m_run[h] - m_use[h]) : 1.f;
    st.m_run[h] = m_new;
    sum_a[h] = exp2_row(sa, h, scale_log2, m_use[h]);
  }
  // The first half's P into P(n)'s slot now: a store ptxas keeps before the wait below (it hoists
  // arithmetic above a wgmma wait, not shared-memory stores), so the first half's softmax runs while
  // the second half's wgmmas do. The slot held P(n - kPSlots): both P V warpgroups are done with it.
  const int tw = threadIdx.x % 128;
  if (tw == 0) WsPhaseTrace::mark(n, 10);
  if (n >= Cfg::kPSlots) mbarrier_wait(&ss.pv_done[(n - Cfg::kPSlots) % Cfg::NUM_STAGES],
                                       ((n - Cfg::kPSlots) / Cfg::NUM_STAGES) & 1);
  if (tw == 0) WsPhaseTrace::mark(n, 11);
  const uint32_t pslab = smem_addr(ss.aux + unsigned(n) % Cfg::kPSlots * (Cfg::BLOCK_M * Cfg::BLOCK_N));
  auto store_half = [&](auto& frag, int t) {
    if constexpr (Cfg::kCompactRows) store_p_e4m3_compact_sw64_half(pslab, tw, frag, t);
    else store_p_e4m3_sw64_half(pslab, tw, frag, t);
  };
  store_half(sa, 0);
  cute::warpgroup_wait<0>();
  cute::warpgroup_fence_operand(st.tSrS);
  auto tSrQ32 = st.q32();
  cute::warpgroup_fence_operand(tSrQ32);
  // All of S read K(n) now (ws_softmax_warpgroup releases the stage here, not after the first half).
  ws_release_stage<Cfg>(ss.stage_free, stage, threadIdx.x % 32);
  if (masked) mask_invisible(sb, cur.tok + BN / 2, col_lane, lim);
  bool moved = false;
#pragma unroll
  for (int h = 0; h < Cfg::kRowHalves; ++h) {
    const float mx = row_max(sb, h) * scale_log2;
    if (mx > st.m_run[h] + kLazyRescaleLog2) {  // m moves again (or first: the first half saw no key)
      moved = true;
      const float m_b = mx;
      const float f = ex2_approx((st.m_run[h] == -kInf ? m_b : m_use[h]) - m_b);
      scale_row(sa, h, f);
      sum_a[h] *= f;
      sc[h] *= f;
      st.m_run[h] = m_b;
      m_use[h] = m_b;
    }
    const float sum_b = exp2_row(sb, h, scale_log2, m_use[h]);
    st.l_run[h] = st.l_run[h] * sc[h] + sum_a[h] + sum_b;
  }
  if (__any_sync(0xffffffffu, moved)) store_half(sa, 0);  // the first half rescaled (stmatrix: the whole warp)
  store_half(sb, 1);
}

// Piece end (the piece's last tile): l and the rows' lse2 (log2 units, -inf for a row without
// keys); P and the O rescale of this tile are scaled by 1/l, so O comes out normalized. e4m3: P
// stays as it is and fin gets 1/l times v_scale (the cache's descale), which O gets after P V.
template <typename Cfg>
__device__ __forceinline__ void ws_finish_rows(const DecodeParams& p, WsSoftmaxState<Cfg>& st, int row0, float (&sc)[2],
                                               float (&lse2)[2], float (&fin)[2], float v_scale) {
  // Sparse, a piece that is its batch's only split: out is final, the attention sink applies here
  // (else the combine kernel applies it).
  bool single = false;
  if constexpr (Cfg::kSparse) single = p.num_splits[st.cur.bi + 1] - p.num_splits[st.cur.bi] == 1;
  if constexpr (Cfg::kCompactRows) fin[1] = 0.f;   // the padding half
#pragma unroll
  for (int h = 0; h < Cfg::kRowHalves; ++h) {
    float l = st.l_run[h];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    const float inv_l = l > 0.f ? rcp_approx(l) : 0.f;
    lse2[h] = l > 0.f ? st.m_run[h] + lg2_approx(l) : -kInf;
    if constexpr (Cfg::kFp8) {
      fin[h] = inv_l * v_scale;
    } else {
      // In place (no second copy of P in registers: WG0 has none to spare). KV_FP8: V's descale too.
      float f = Cfg::kKvFp8 ? inv_l * v_scale : inv_l;
      if constexpr (Cfg::kSparse) {
        const int r = blockIdx.z * Cfg::BLOCK_M + row0 + 8 * h;
        if (single && r < p.rows) f *= sink_factor(p, query_row(p, blockIdx.y, r).head, lse2[h]);
      }
      sc[h] *= f;
      scale_row(st.tSrS, h, f);
    }
  }
}

// Hands P(n) to WG1/WG2 through stage `stage`'s slots: P, the O rescale, the tile's info. Not
// published here (ws_wait_s of the next tile, or ws_publish_p at a piece's last tile).
template <typename Cfg>
__device__ __forceinline__ void ws_store_p(typename Cfg::SharedStorage& ss, WsSoftmaxState<Cfg>& st, int tw, int row0,
                                           int stage, const float (&sc)[2], const float (&fin)[2], bool last,
                                           int tile) {
  using Element = typename Cfg::Element;
  constexpr int BM = Cfg::BLOCK_M, BN = Cfg::BLOCK_N, DV = Cfg::HEAD_DIM_V;
  Element* kv = ss.kv[stage];
  Element* pbuf;
  if constexpr (Cfg::kPInRope) {
    pbuf = kv + DV * BN;  // the rope slab of this tile: free once every warp's S(n) is done
    named_barrier_sync(kBarWG0, 128);
  } else {
    pbuf = ss.aux + (Cfg::kEarlyRelease ? unsigned(tile) % Cfg::kPSlots : stage) * (BM * BN);
  }
  if constexpr (Cfg::kSHalves) {
    // (stored by ws_softmax_halves)
  } else if constexpr (Cfg::kFp8 && Cfg::kCompactRows) {
    store_p_e4m3_compact_sw64(smem_addr(pbuf), tw, st.tSrS);
  } else if constexpr (Cfg::kFp8) {
    store_p_e4m3_sw64(smem_addr(pbuf), tw, st.tSrS);
  } else {
    store_acc_sw128_stsm<Element, 64>(smem_addr(pbuf), tw, st.tSrS);
  }
  if constexpr (Cfg::kFp8) {
    const bool any = __any_sync(0xffffffffu, sc[0] != 1.f || sc[1] != 1.f);
    if (tw % 32 == 0) ss.tile_rescale[stage][tw / 32] = any;
  }
  if ((tw & 3) == 0) {   // (compact rows: the padding half's scale is 1, so the P V side's skip test holds)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      ss.row_scale[stage][row0 + 8 * h] = sc[h];
      if (Cfg::kFp8 && last) ss.row_scale[stage][BM + row0 + 8 * h] = fin[h];
    }
  }
  if (tw == 0) {
    WsTileInfo info;
    info.last = last;
    info.bi = st.cur.bi;
    ss.info[stage] = info;
  }
}

// A finished piece's lse of the thread's two rows, by the rows' writer (the quad leader,
// tw % 4 == 0; the caller tests it, which keeps the test merged with its own branch on the piece end).
template <typename Cfg>
__device__ __forceinline__ void ws_store_lse(const DecodeParams& p, WsSoftmaxState<Cfg>& st, int row0,
                                             const float (&lse2)[2]) {
  const int m_block = blockIdx.z, g = blockIdx.y;
  const int* meta = ws_meta(p);
  const PieceDest dest = piece_dest(p, st.cur.bi, st.cur.bi == meta[kMetaBeginBatch] ? meta[kMetaBeginSplit] : 0);
#pragma unroll
  for (int h = 0; h < Cfg::kRowHalves; ++h) {
    const int r = ws_query_row<Cfg>(m_block, row0 + 8 * h);
    if (r < p.rows) {
      store_piece_lse<Cfg::kSparse>(p, dest, st.cur.bi, g, r, lse2[h]);
      if constexpr (Cfg::kSparse) store_max_logit(p, dest, st.cur.bi, g, r, st.m_run[h]);
    }
  }
  // Fused combine: the CTA that completes the batch's count (after this tile's P V) reads
  // every split's lse_accum; fenced before P is published.
  if (Cfg::kFusedCombine && !dest.single) __threadfence();
}

// Publishes the P stored in stage `stage` to the P V warpgroups (one arrival per warp).
template <typename Cfg>
__device__ __forceinline__ void ws_publish_p(typename Cfg::SharedStorage& ss, int tw, int stage) {
  fence_proxy_async_shared();  // P and the zeroed tail rows are read by wgmma (async proxy)
  __syncwarp();
  if (tw % 32 == 0) mbarrier_arrive(&ss.p_full[stage]);
}

// WG0's role: per tile, S = Q K^T, mask and online softmax, P into the stage's slots; the walk
// over the CTA's pieces and the lse of each finished one.
template <typename Cfg, typename Lens>
__device__ __forceinline__ void ws_softmax_warpgroup(const DecodeParams& p, Lens seqlens,
                                                     typename Cfg::SharedStorage& ss) {
  constexpr int BN = Cfg::BLOCK_N, NS = Cfg::NUM_STAGES;
  setmaxnreg_move<Cfg::kLaunchRegs, Cfg::kRegsS>();

  WsSoftmaxState<Cfg> st;
  ws_seek_first_piece<Cfg>(p, seqlens, st);

  if (!st.cur.valid()) named_barrier_arrive(kBarFirstQ, ws_first_q_threads<Cfg>());  // no work: free the producer
  // e4m3: the per-tensor descales of q and the cache, read on the GPU (capturable calls): S's
  // scale takes both, O the cache's (V's) after each piece.
  // KV_FP8: descale_q is 1 (16-bit q).
  float fp8_scale_log2 = 0.f, fp8_v_scale = 0.f;
  if constexpr (Cfg::kDescaled) {
    fp8_v_scale = __ldg(p.descale_k);
    fp8_scale_log2 = p.scale_log2 * __ldg(p.descale_q) * fp8_v_scale;
  }
  int unpublished = -1;  // stage whose P is stored but not yet published (ws_wait_s of the next tile does)
  bool piece_start = true;
  // Per tile: S(n) is issued first, and the loop's bookkeeping comes after the wait for it (off
  // WG0's chain S -> softmax -> P store -> S, which is the tile period).
  for (int n = 0; st.cur.valid(); ++n) {
    if (piece_start) {
      ws_load_q<Cfg>(p, ss, st, n == 0);
      piece_start = false;
    }
    ws_issue_s<Cfg>(ss, st, n);
    const int tw = opaque(threadIdx.x % 128);
    const int row0 = ws_row0(tw), col_lane = ws_col_lane(tw);
    const int stage = n % NS;

    ws_wait_s<Cfg>(ss, st, tw, unpublished);
    // S read K(n) (kSHalves: its first half; ws_softmax_halves releases the stage after the second).
    if constexpr (Cfg::kEarlyRelease && !Cfg::kSHalves) ws_release_stage<Cfg>(ss.stage_free, stage, tw % 32);
    if ((Cfg::kSparse || Cfg::kFp8) && tw == 0) WsPhaseTrace::mark(n, 2);
    float sc[2];  // O rescale of this tile
    if constexpr (Cfg::kSHalves) {
      static_assert(Cfg::kEarlyRelease, "S halves: the e4m3 kernel's stage release");
      ws_softmax_halves<Cfg>(p, ss, st, row0, col_lane, stage, n, sc, fp8_scale_log2);
    } else {
      ws_softmax<Cfg>(p, st, row0, col_lane, sc, Cfg::kDescaled ? fp8_scale_log2 : p.scale_log2,
                      ss.tile_valid + (Cfg::kSparse ? 2 * (n % Cfg::kFlagSlots) : 0));
    }
    const bool last = st.cur.tok + BN >= st.cur.stop;
    float lse2[2] = {-kInf, -kInf}, fin[2];
    if (last) ws_finish_rows<Cfg>(p, st, row0, sc, lse2, fin, fp8_v_scale);
    if constexpr (Cfg::kEarlyRelease && !Cfg::kSHalves) {  // (kSHalves: waited in ws_softmax_halves)
      // P(n)'s slot held P(n - kPSlots): both P V warpgroups are done with it (and with that tile's
      // and earlier tiles' row_scale / info, read before their arrival; kPSlots <= NS).
      if (tw == 0) WsPhaseTrace::mark(n, 10);
      constexpr int kSlots = Cfg::kPSlots;
      if (n >= kSlots) mbarrier_wait(&ss.pv_done[(n - kSlots) % NS], ((n - kSlots) / NS) & 1);
      if (tw == 0) WsPhaseTrace::mark(n, 11);
    }
    // Crossover: P(n) goes over the stage's rope rows, which this CTA's copies of tile n read; the
    // peer's arrival says they landed (it comes once the peer's S(n) may start: rarely a wait).
    if constexpr (Cfg::kCrossover) mbarrier_wait(&ss.copy_landed[stage], (n / NS) & 1);
    ws_store_p<Cfg>(ss, st, tw, row0, stage, sc, fin, last, n);

    if constexpr (Cfg::kFusedCombine) {
      if (last && (tw & 3) == 0) ws_store_lse<Cfg>(p, st, row0, lse2);
    }
    // Published after S(n + 1) (in ws_wait_s, which fences the P stores while S runs), except at
    // a piece's last tile: the P V warpgroups then store O, and the next piece's first S waits for
    // its Q anyway.
    // KV_FP8: every P at once. The P V warpgroups de-quantize tile n + 1 before P V(n), and
    // S(n + 1) waits for that: P(n) held back until S(n + 1) started would serialize the three.
    if (last || Cfg::kDequantInPv) ws_publish_p<Cfg>(ss, tw, stage);
    if ((Cfg::kSparse || Cfg::kFp8) && tw == 0) WsPhaseTrace::mark(n, 3);
    if (last) {
      if constexpr (!Cfg::kFusedCombine) {
        if ((tw & 3) == 0) ws_store_lse<Cfg>(p, st, row0, lse2);
      }
      piece_start = true;
      st.cur.seek(ws_meta(p), seqlens, st.cur.bi + 1);
    } else {
      if constexpr (!Cfg::kDequantInPv) unpublished = stage;
      st.cur.tok += BN;
    }
  }
  if (threadIdx.x == 0) MLA_JIT_TRACE_TIME(mla_jit_trace_splitkv, kTraceWg0Done);
  // The code after the role branches runs in every warp: give it one register budget.
  setmaxnreg_move<Cfg::kRegsS, Cfg::kRegsAfter>();
}

// =============== WG1 / WG2: O[:, half] += P V[:, half]; thread 128: TMA producer ===============

// ==================== Sparse: the P V warpgroups gather the tiles (no TMA) ====================

// Row bi and first token tok of tile m of the CTA's walk. Every row of a sparse kernel has topk
// tokens, ceil(topk / 64) tiles, and the scheduler cuts at tile boundaries: the walk is one
// contiguous run of the flattened (row, tile) order.
struct WsSparseTile {
  int bi, tok;
};
// origin: the walk's first tile in that order (ws_walk_origin, read once: the metadata's global
// loads, L1 misses under the 227 KB carve-out, sat on the gathering threads' path every tile).
__device__ __forceinline__ int ws_walk_origin(const DecodeParams& p) {
  const int* meta = ws_meta(p);
  return meta[kMetaBeginBatch] * ((p.topk + 63) / 64) + meta[kMetaBeginToken] / 64;
}
__device__ __forceinline__ WsSparseTile ws_sparse_tile(const DecodeParams& p, int origin, int m) {
  const int tiles_per_row = (p.topk + 63) / 64;
  const int t = origin + m;
  const int q = t / tiles_per_row;
  return {q, (t - q * tiles_per_row) * 64};
}

// Gathering thread t's token r of a tile and its quarter q (of the token's chunks or record): warp w
// takes tokens 8 w .. 8 w + 7, lane l token 8 w + l % 8 and quarter l / 8. The 8 threads of each
// phase of a 16-byte shared access are then 8 tokens at the same quarter, which the SW128 rows
// (and the 656-byte record rows, 41 units apart) put in 8 distinct bank groups: with 4 threads a
// token (t / 4), a phase was 2 tokens x 4 quarters, 4 threads on one bank group.
struct WsGatherSlot {
  int r, q;
};
__device__ __forceinline__ WsGatherSlot ws_gather_slot(int t) { return {(t & 7) | ((t >> 5) << 3), (t >> 3) & 3}; }

// The index of gathering thread t's token (ws_gather_slot) in tile m (-1 past topk: not loaded), its
// position in the row and the row's token limit (topk_length, else topk): loaded a tile ahead of the
// gather, so that their round trip overlaps a tile's work (and the gather divides nothing). Nothing
// here may consume a loaded value: the loads share a scoreboard, and an early use (lim - tok, say)
// waits for all of them right before P V's wgmma wait (H200: 0.88x the time at h_q = 64).
struct WsGatherIndex {
  int idx, tok, lim;
};
template <typename Cfg>
__device__ __forceinline__ void ws_load_index(const DecodeParams& p, int origin, int m, int num_tiles, int t,
                                              WsGatherIndex& gi) {
  if (m >= num_tiles) return;
  // FP8 records: a token's quarter-0 thread alone copies the record (its other threads keep idx -1).
  if (Cfg::kSparseFp8 && ws_gather_slot(t).q != 0) return;
  const WsSparseTile tile = ws_sparse_tile(p, origin, m);
  gi.tok = tile.tok + ws_gather_slot(t).r;
  gi.idx = gi.tok < p.topk ? __ldg(p.block_table + (long long)tile.bi * p.block_table_stride + gi.tok) : -1;
  gi.lim = p.topk_length != nullptr ? __ldg(p.topk_length + tile.bi / p.lse_fold) : p.topk;
}

// Tile m's tokens into stage m % NS by the 256 gathering threads (4 a token, ws_gather_slot;
// kGatherChunks 16-byte chunks each, in the TMA's SW128 layout, sw128_offset). An invalid token
// (index -1 or past the rows, or past topk_length) is zero-filled, never read, and its valid bit is 0. Each thread's cp.asyncs arrive on full[s] when they land; lane 0
// of each warp writes its 8 tokens' valid bits and arrives after them (full: 256 + 8 arrivals).
// FP8 records: tile m's records go into the record slot by bulk copies (the TMA engine), one a
// token, issued by the token's quarter-0 thread, each arriving on `landed` with the record's bytes
// (11 16-byte cp.async per thread, whose scattered addresses shared the LSU with the
// de-quantization and the wgmma issue, took 1.15-1.19x the time). The slot held tile m - 1: every P V warp arrived on its kv_ready after
// de-quantizing it (reading the slot), which the issuing threads wait for. An invalid token copies
// nothing (its valid bit is 0: its de-quantization writes zeros).
// Crossover: every quarter-0 thread still loads its token's index (the CTA's valid bits cover the
// whole tile, so WG0 masks S without the peer), but only the tokens of this CTA's half are copied,
// into slot m % 2 (row r % 32), once all 8 P V warps have read tile m - 2 from it (slot_read; that also
// completed the slot's `landed` phase of tile m - 2 before anyone arrives for tile m).
template <typename Cfg>
__device__ __forceinline__ void ws_gather_records(const DecodeParams& p, const void* cache,
                                                  typename Cfg::SharedStorage& ss, int m, int t, bool ok, int idx) {
  constexpr int R = Cfg::kRecordBytes, NS = Cfg::NUM_STAGES;
  const WsGatherSlot slot = ws_gather_slot(t);
  if (slot.q != 0) return;
  const int k = m % Cfg::kRecordSlots;
  if constexpr (Cfg::kCrossover) {
    if (m >= 2) mbarrier_wait(&ss.slot_read[k], ((m - 2) / 2) & 1);
    ok = ok && (slot.r / Cfg::kSlotTokens) == int(cluster_cta_rank());
  } else {
    if (m > 0) mbarrier_wait(&ss.kv_ready[(m - 1) % NS], ((m - 1) / NS) & 1);
  }
  if (ok) {
    const char* src = reinterpret_cast<const char*>(cache) + (long long)(idx / Cfg::PAGE_SIZE) * p.kv_block_stride +
                      (idx % Cfg::PAGE_SIZE) * R;
    mbarrier_arrive_expect_tx(&ss.landed[k], R);
    const int row = Cfg::kCrossover ? slot.r & (Cfg::kSlotTokens - 1) : slot.r;  // in the slot
    bulk_load(smem_addr(ss.records[k]) + row * R, src, R, &ss.landed[k]);
  } else {
    mbarrier_arrive(&ss.landed[k]);
  }
}

template <typename Cfg>
__device__ __forceinline__ void ws_gather_tile(const DecodeParams& p, const void* kv_rows,
                                               typename Cfg::SharedStorage& ss, int origin, int m, int t,
                                               const WsGatherIndex& gi) {
  constexpr int BN = Cfg::BLOCK_N, NS = Cfg::NUM_STAGES;
  const int s = m % NS;
  const auto [r, q] = ws_gather_slot(t);
  const bool ok = gi.idx >= 0 && gi.idx < p.kv_tokens && gi.tok < gi.lim;
  if constexpr (Cfg::kSparseFp8) {
    ws_gather_records<Cfg>(p, kv_rows, ss, m, t, ok, gi.idx);
  } else {
    const char* src = reinterpret_cast<const char*>(kv_rows) + (ok ? (long long)gi.idx * p.kv_block_stride : 0);
    const uint32_t dst = smem_addr(ss.kv[s]);
#pragma unroll
    for (int j = 0; j < Cfg::kGatherChunks; ++j) {
      const int c = q + 4 * j;  // 16-byte chunk: columns 8 c .. 8 c + 7
      cp_async_16(dst + sw128_offset<BN>(r, 8 * c), src + c * 16, ok);
    }
    cp_async_mbarrier_arrive_noinc(&ss.full[s]);
  }
  // Lanes 0-7 hold tokens 8 w .. 8 w + 7 (quarter 0; the other quarters agree).
  const unsigned bits = __ballot_sync(0xffffffffu, ok) & 0xffu;
  if (t % 32 == 0) {
    reinterpret_cast<unsigned char*>(ss.tile_valid + 2 * (m % Cfg::kFlagSlots))[t / 32] = (unsigned char)bits;
    // (FP8 records: published with the de-quantized stage, on kv_ready)
    if constexpr (!Cfg::kSparseFp8) mbarrier_arrive(&ss.full[s]);
  }
}

// The two e4m3 of w's low 16 bits times their record scale, as bf16x2: each product in float32 and
// rounded once, as the float32 reference de-quantizes.
__device__ __forceinline__ uint32_t ws_scaled_e4m3x2(uint32_t w, float scale) {
  const float2 f = e4m3x2_to_float2(w);
  return ElemTraits<cutlass::bfloat16_t>::pack2(f.x * scale, f.y * scale);
}

// FP8 records: thread t's quarter of tile m (ws_gather_slot) into stage m % NS as bf16, once the
// tile's records have landed, each value times its 128-value scale in float32 and rounded once (as
// the float32 reference does), in the TMA's SW128 layout; the rope copied; an invalid token's quarter
// zeros (the null record's, in place of its stale slot bytes). Then published to WG0 on kv_ready
// (the tile's valid bits were written by lane 0 of the thread's warp at the gather).
template <typename Cfg>
__device__ __forceinline__ void ws_dequant_records(typename Cfg::SharedStorage& ss, int m, int t) {
  constexpr int BN = Cfg::BLOCK_N, NS = Cfg::NUM_STAGES, R = Cfg::kRecordBytes;
  const int s = m % NS;
  const WsGatherSlot slot = ws_gather_slot(t);
  const int r = slot.r, q = slot.q;
  const bool valid = (ld_shared_u8(smem_addr(ss.tile_valid + 2 * (m % Cfg::kFlagSlots)) + (r >> 3)) >> (r & 7)) & 1u;
  mbarrier_wait(&ss.landed[0], m & 1);
  const uint32_t src = valid ? smem_addr(ss.records[0]) + r * R : smem_addr(ss.null_record);
  const uint32_t dst = smem_addr(ss.kv[s]);
  auto chunk_addr = [&](int c) { return dst + sw128_offset<BN>(r, 8 * c); };  // columns 8 c .. 8 c + 7
  using Rec = typename Cfg::Record;
  const float scale = ld_shared_f32(src + Rec::kScaleOffset + 4 * q);  // one per quarter (kValuesPerScale values)
  auto cvt = [&](uint32_t w) { return ws_scaled_e4m3x2(w, scale); };
#pragma unroll 1
  for (int k = 0; k < 8; ++k) {
    const uint4 x = ld_shared_v4(src + q * Rec::kValuesPerScale + k * 16);
    const int c = 16 * q + 2 * k;  // columns 8 c .. 8 c + 15
    st_shared_v4(chunk_addr(c), make_uint4(cvt(x.x), cvt(x.x >> 16), cvt(x.y), cvt(x.y >> 16)));
    st_shared_v4(chunk_addr(c + 1), make_uint4(cvt(x.z), cvt(x.z >> 16), cvt(x.w), cvt(x.w >> 16)));
  }
#pragma unroll
  for (int k = 0; k < 2; ++k) {   // the rope's 8 chunks after the nope's 64 in the K row, 2 a quarter
    st_shared_v4(chunk_addr(Rec::kNopeValues / 8 + 2 * q + k), ld_shared_v4(src + Rec::kRopeOffset + 32 * q + 16 * k));
  }
  fence_proxy_async_shared();  // read by wgmma (async proxy)
  __syncwarp();
  if (t % 32 == 0) mbarrier_arrive(&ss.kv_ready[s]);
}

// Crossover: this CTA's half of tile m (tokens 32 c .. 32 c + 31, c its rank) into stage m % NS of
// both CTAs. Warp w converts column chunk w (values 64 w .. 64 w + 63, scale w / 2) of all 32 tokens
// (lane = token) and copies rope rows 4 w .. 4 w + 3 (a 16-byte unit a lane), so that it alone writes
// two contiguous pieces of the stage (the chunk's 32 rows, 4 KB, and its 4 rope rows, 512 B: the
// SW128 swizzle stays within a row), which it then sends to the peer by two bulk copies. Before
// writing, the stage's previous tile (m - 2) must be done in both CTAs: here the named barrier of the
// caller, in the peer peer_free (whose arrival also means the peer has seen this CTA's tile m - 2 land,
// so the copies' source is free to rewrite). kv_ready[s] then completes on the 8 local warps (each
// expecting its peer warp's 4608 bytes) and the peer's bytes.
template <typename Cfg>
__device__ __forceinline__ void ws_dequant_half(typename Cfg::SharedStorage& ss, int m, int t) {
  constexpr int BN = Cfg::BLOCK_N, NS = Cfg::NUM_STAGES, R = Cfg::kRecordBytes, HALF = Cfg::kSlotTokens;
  using Rec = typename Cfg::Record;
  static_assert(BN == 64 && HALF == 32 && Rec::kValuesPerScale == 128 && Rec::kRopeValues * 2 == 128,
                "a warp a 64-column chunk of 32 tokens, 4 rope rows a warp");
  constexpr uint32_t kChunkBytes = HALF * 128, kRopeBytes = 4 * 128;
  const int s = m % NS, k = m % 2;
  const int w = t / 32, lane = t % 32;
  const int rank = int(cluster_cta_rank());  // (volatile: re-read, not held through the P V loop)
  const int r = HALF * rank + lane;                       // the lane's token row (nope)
  const int rr = HALF * rank + 4 * w + lane / 8, ru = lane % 8;  // its rope row and 16-byte unit
  // The half's valid bits (4 gathering warps wrote them; a named barrier of the 256 P V threads
  // lies between: the first-Q barrier for tile 0, the caller's for the others).
  const uint32_t flags = ld_shared_u32(smem_addr(ss.tile_valid + 2 * (m % Cfg::kFlagSlots) + rank));
  const bool valid = (flags >> lane) & 1u, rope_valid = (flags >> (rr - HALF * rank)) & 1u;
  if (m >= 2) mbarrier_wait(&ss.peer_free[s], ((m - 2) / 2) & 1);
  if (t == 0) WsPhaseTrace::mark(m - 1, 8);
  mbarrier_wait(&ss.landed[k], (m / 2) & 1);
  if (t == 0) WsPhaseTrace::mark(m - 1, 9);
  const uint32_t slot = smem_addr(ss.records[k]);
  const uint32_t src = valid ? slot + lane * R : smem_addr(ss.null_record);
  const uint32_t rope_src = rope_valid ? slot + (rr - HALF * rank) * R : smem_addr(ss.null_record);
  const uint32_t dst = smem_addr(ss.kv[s]);
  const float scale = ld_shared_f32(src + Rec::kScaleOffset + 4 * (w / 2));
  auto cvt = [&](uint32_t x) { return ws_scaled_e4m3x2(x, scale); };
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const uint4 x = ld_shared_v4(src + 64 * w + 16 * j);
    const int c = 8 * w + 2 * j;  // columns 8 c .. 8 c + 15
    st_shared_v4(dst + sw128_offset<BN>(r, 8 * c), make_uint4(cvt(x.x), cvt(x.x >> 16), cvt(x.y), cvt(x.y >> 16)));
    st_shared_v4(dst + sw128_offset<BN>(r, 8 * c + 8), make_uint4(cvt(x.z), cvt(x.z >> 16), cvt(x.w), cvt(x.w >> 16)));
  }
  st_shared_v4(dst + sw128_offset<BN>(rr, Rec::kNopeValues + 8 * ru), ld_shared_v4(rope_src + Rec::kRopeOffset + 16 * ru));
  fence_proxy_async_shared();  // read by wgmma and by the bulk copies (async proxy)
  __syncwarp();
  if (lane == 0) {
    mbarrier_arrive(&ss.slot_read[k]);
    const uint32_t peer = uint32_t(rank ^ 1);
    const uint32_t chunk = dst + w * (BN * 128) + rank * kChunkBytes;
    const uint32_t rope = dst + (Rec::kNopeValues / 64) * (BN * 128) + (HALF * rank + 4 * w) * 128;
    const uint32_t peer_bar = mapa_shared(smem_addr(&ss.kv_ready[s]), peer);
    bulk_copy_to_peer(mapa_shared(chunk, peer), chunk, kChunkBytes, peer_bar);
    bulk_copy_to_peer(mapa_shared(rope, peer), rope, kRopeBytes, peer_bar);
    mbarrier_arrive_expect_tx(&ss.kv_ready[s], kChunkBytes + kRopeBytes);  // the peer's warp w sends as much
  }
}

// Tiles of this CTA (WG0 owns the walk; the P V warpgroups only need the count).
template <typename Cfg, typename Lens>
__device__ __forceinline__ int ws_count_tiles(const DecodeParams& p, Lens seqlens) {
  constexpr int BN = Cfg::BLOCK_N;
  int num_tiles = 0;
  WorkCursor c;
  c.init(ws_meta(p), seqlens);
  while (c.valid()) {
    num_tiles += (c.stop - c.tok + BN - 1) / BN;
    c.seek(seqlens, c.bi + 1);
  }
  return num_tiles;
}

// The P V of the tile in `stage` (use parity `phase`) for this warpgroup's half of O (16-bit q;
// e4m3: ws_pv_tile_regs): wait for its P, O *= the rows' rescale (skipped where it is 1), O (+)=
// P V[:, half] (fresh: the piece's first tile, O = P V), then release the stage to the producer(s)
// of the cluster. Returns the tile's info (read before the release).
// during: work of the thread's own (no O, no wgmma) done while the P V wgmma runs.
template <typename Cfg, typename TiledMmaO, typename FragO, typename During>
__device__ __forceinline__ WsTileInfo ws_pv_tile(typename Cfg::SharedStorage& ss, TiledMmaO& mma_o, FragO& tOrO,
                                                 int stage, uint32_t phase, bool fresh, int half, int tid_wg,
                                                 int lane, int row0, During&& during, int tile) {
  using Element = typename Cfg::Element;
  constexpr int BM = Cfg::BLOCK_M, BN = Cfg::BLOCK_N, DV = Cfg::HEAD_DIM_V;
  static_assert(!Cfg::kFp8, "e4m3: ws_pv_tile_regs");
  Element* kv = ss.kv[stage];
  // Crossover: the warpgroup's half re-derived here (opaque), or its 64-bit offset spills.
  const int wg_half = Cfg::kCrossover ? opaque(int(threadIdx.x)) / 128 - 1 : half;
  Element* v_half = kv + wg_half * (DV / 2) * BN;
  mbarrier_wait(&ss.p_full[stage], phase);
  if (Cfg::kSparse && tid_wg == 0 && half == 0) WsPhaseTrace::mark(tile, 6);
  // Complete already (WG0 waited it): TMA bytes visible. KV_FP8: not waited (ws_dequant_tile did;
  // the slot may already hold tile n + NS, its barrier a phase further on, the parity back).
  if constexpr (!Cfg::kDequantInPv) mbarrier_wait(&ss.full[stage], phase);
  // Crossover: half of V came from the peer by bulk copies (async proxy): their completion observed
  // here too, not only through WG0 (complete already; phase n + 2 cannot begin before this P V).
  if constexpr (Cfg::kCrossover) mbarrier_wait(&ss.kv_ready[stage], phase);
  if constexpr (Cfg::kSparse && !Cfg::kSparseFp8) fence_proxy_async_shared();  // cp.async bytes, read by wgmma
  const float sc0 = ss.row_scale[stage][row0], sc1 = ss.row_scale[stage][row0 + 8];
  // Lazy rescaling makes the scale exactly 1 on most tiles; a piece's first tile overwrites O.
  if (!fresh && __any_sync(0xffffffffu, sc0 != 1.f || sc1 != 1.f)) {
#pragma unroll
    for (int i = 0; i < cute::size(tOrO); ++i) tOrO(i) *= ((i >> 1) & 1) ? sc1 : sc0;
  }

  Element* pbuf;
  if constexpr (Cfg::kPInRope) {
    pbuf = kv + DV * BN;
  } else {
    pbuf = ss.aux + stage * (BM * BN);
  }
  issue_pv_half<Cfg>(mma_o, tid_wg, pbuf, v_half, tOrO, fresh);
  during();

  cute::warpgroup_wait<0>();
  cute::warpgroup_fence_operand(tOrO);
  if (Cfg::kSparse && tid_wg == 0 && half == 0) WsPhaseTrace::mark(tile, 7);
  // Read the rest of stage s's slots before releasing the stage.
  const WsTileInfo info = ss.info[stage];
  // KV_FP8: the TMA refills the landing slot, which ws_dequant_tile releases. Sparse: the P V
  // warpgroups refill the stage themselves after a named barrier.
  if constexpr (!Cfg::kKvFp8 && !Cfg::kSparse) ws_release_stage<Cfg>(ss.pv_done, stage, lane);
  return info;
}

// ---- e4m3: O^T = V^T P^T with V^T in registers ----
// Warp w of a P V warpgroup owns dv 16w .. 16w + 15 of each of its half's four 64-dv chunks (the
// M blocks of O^T). Per chunk and 32-token k-step one ldmatrix .x4 .trans (matrix i: tokens 8i ..
// 8i + 7 of the step, the warp's 16 dv bytes) gives lane l (p = l / 4, q = l % 4) dv bytes 2p, 2p + 1
// of tokens 2q, 2q + 1 per matrix, and two byte permutes per matrix pair give dv 2p (and 2p + 1) of
// tokens {2q, 2q + 1, 8 + 2q, 9 + 2q}: the A fragment's registers of row p (and p + 8) in the slot
// order P is stored in (store_p_e4m3_sw64). So O^T's row p of the warp's 16 is dv 16w + 2p, row
// p + 8 is dv 16w + 2p + 1: a thread holds adjacent dv pairs. Tokens >= valid become 0 (rows past a
// sequence's end may hold NaN).
template <typename Cfg, typename FragA>
__device__ __forceinline__ void ws_load_vt_kstep(uint32_t kv_half, int mb, int ks, int valid, int tw, FragA& tOrA) {
  constexpr int BN = Cfg::BLOCK_N;
  static_assert(BN == 64, "two 32-token k-steps");
  const int lane = tw % 32, w = tw / 32, i = lane / 8, rr = lane % 8, q = lane % 4;
  // Row 32 ks + 8 i + rr of chunk slab mb, byte column 16 w (SW64: chunk XOR (row / 2) % 4, and
  // (32 ks + 8 i) / 2 % 4 == 0): a per-lane base plus immediates.
  const uint32_t base = kv_half + uint32_t((8 * i + rr) * 64 + (((w ^ (rr >> 1)) & 3) << 4));
  uint32_t r[4];
  ldmatrix_x4_trans(base + uint32_t(mb * BN * 64 + ks * 32 * 64), r);
  if (valid < BN) {  // a sequence's last tile (uniform)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int t = 32 * ks + 8 * j + 2 * q;
      r[j] &= (t < valid ? 0xffffu : 0u) | (t + 1 < valid ? 0xffff0000u : 0u);
    }
  }
  auto a = cute::recast<uint32_t>(tOrA(cute::_, 0, ks));
  a(0) = byte_perm(r[0], r[1], 0x6420);
  a(1) = byte_perm(r[0], r[1], 0x7531);
  a(2) = byte_perm(r[2], r[3], 0x6420);
  a(3) = byte_perm(r[2], r[3], 0x7531);
}

// O^T's column c = 8j + 2q + e (j < kOtRows / 8, e < 2) is tile row c, or with compact rows query
// row c, which is tile row 16j + 2q + e (ws_query_row).
template <typename Cfg>
__device__ __forceinline__ int ws_ot_tile_row(int j, int q) { return (Cfg::kCompactRows ? 16 : 8) * j + 2 * q; }
// Its query row (ws_query_row of that tile row, with the padding test folded away: 2q + e < 8).
template <typename Cfg>
__device__ __forceinline__ int ws_ot_query_row(int m_block, int j, int q, int e) {
  if constexpr (Cfg::kCompactRows) return m_block * Cfg::kTileQueryRows + 8 * j + 2 * q + e;
  else return ws_query_row<Cfg>(m_block, 8 * j + 2 * q + e);
}
// A thread's O^T accumulators of one 64-dv chunk (M block mb): element 4j + 2h + e is dv row p + 8h
// of column 8j + 2q + e.
template <typename Cfg>
constexpr int kOtChunkRegs = Cfg::kOtRows / 2;

// O^T's columns of this thread times their rows' factors at f (tile-row indexed: row_scale of a
// stage, the O rescale, or at BLOCK_M the piece's final factor).
template <typename Cfg, typename FragO>
__device__ __forceinline__ void ws_scale_ot_columns(FragO& tOrO, const float* f, int q) {
  constexpr int R = kOtChunkRegs<Cfg>;
#pragma unroll
  for (int j = 0; j < Cfg::kOtRows / 8; ++j) {
    const float2 c = *reinterpret_cast<const float2*>(f + ws_ot_tile_row<Cfg>(j, q));
#pragma unroll
    for (int mb = 0; mb < 4; ++mb) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        tOrO(R * mb + 4 * j + 2 * h) *= c.x;
        tOrO(R * mb + 4 * j + 2 * h + 1) *= c.y;
      }
    }
  }
}

// ws_pv_tile for e4m3: the tile's V^T into registers as soon as it has landed, the stage released
// (its last reader), then O^T (+)= V^T P^T once P is published: 4 chunks x 2 k-steps of m64n64k32.
template <typename Cfg, typename TiledMmaOt, typename FragO, typename During>
__device__ __forceinline__ WsTileInfo ws_pv_tile_regs(typename Cfg::SharedStorage& ss, TiledMmaOt& mma_ot,
                                                      FragO& tOrO, int stage, uint32_t phase, bool fresh, int half,
                                                      int tid_wg, int lane, During&& during, int tile) {
  using namespace cute;
  using Element = typename Cfg::Element;
  constexpr int BM = Cfg::BLOCK_M, BN = Cfg::BLOCK_N, DV = Cfg::HEAD_DIM_V;
  static_assert(cute::is_same_v<typename TiledMmaOt::Atom::Traits::ALayout, GMMA::ALayout_64x32>,
                "V^T register fragment layout (ws_load_vt_kstep)");
  Element* kv = ss.kv[stage];
  const uint32_t kv_half = smem_addr(kv + half * (DV / 2) * BN);
  // One A set (8 registers: a chunk's two k-steps; O^T's 128 accumulators leave no room for more:
  // all four chunks' 32 spilled 192 bytes, two sets in turns 64, and ptxas serialized every wgmma
  // with either). The 8 steps (chunk mb, k-step ks) are a commit group each and take the set's
  // halves in turns: step s + 1's half is loaded once step s - 1 (its last reader) is done, while
  // step s runs, so one wgmma is always in flight beside the loads. Step 0's and 1's are loaded as
  // soon as the tile has landed.
  using FragA = decltype(make_tensor<Element>(partition_shape_A(TiledMmaOt{}, Shape<_64, Int<BN>>{})));  // (V, 1, 2)
  FragA a;
  if (tid_wg == 0 && half == 0) WsPhaseTrace::mark(tile, 4);
  mbarrier_wait(&ss.full[stage], phase);
  // The producer writes the tile's valid count before its arrival on full: read after the wait
  // (before it, the first tiles of a CTA could see a stale or unwritten count).
  const int valid = ss.tile_valid[stage];
  ws_load_vt_kstep<Cfg>(kv_half, 0, 0, valid, tid_wg, a);
  ws_load_vt_kstep<Cfg>(kv_half, 0, 1, valid, tid_wg, a);
  if (tid_wg == 0 && half == 0) WsPhaseTrace::mark(tile, 5);
  mbarrier_wait(&ss.p_full[stage], phase);
  if (tid_wg == 0 && half == 0) WsPhaseTrace::mark(tile, 6);
  const int q = lane % 4;
  if (!fresh) {  // lazy rescaling: almost every tile has none (one 16-byte read says)
    const int4 any = *reinterpret_cast<const int4*>(ss.tile_rescale[stage]);
    if (any.x | any.y | any.z | any.w) ws_scale_ot_columns<Cfg>(tOrO, ss.row_scale[stage], q);
  }
  Tensor sP = make_tensor(make_smem_ptr(ss.aux + unsigned(tile) % Cfg::kPSlots * (BM * BN)),
                         typename Cfg::SmemLayoutPt{});
  auto thr = mma_ot.get_thread_slice(tid_wg);
  Tensor tOrB = thr.partition_fragment_B(sP);  // (MMA, 1, 2)
  warpgroup_fence_operand(tOrO);
#pragma unroll
  for (int step = 0; step < 8; ++step) {
    const int mb = step / 2, ks = step % 2;
    if (step >= 2) {
      warpgroup_wait<1>();  // step - 2, this half's last reader, is done (step - 1 runs on)
      auto half_a = a(_, 0, ks);
      warpgroup_fence_operand(half_a);
      ws_load_vt_kstep<Cfg>(kv_half, mb, ks, valid, tid_wg, a);
    }
    if (step == 7) ws_release_stage<Cfg>(ss.stage_free, stage, lane);  // V read into registers: its last use
    auto step_a = a(_, 0, ks);
    warpgroup_fence_operand(step_a);
    warpgroup_arrive();
    mma_ot.accumulate_ = fresh && ks == 0 ? GMMA::ScaleOut::Zero : GMMA::ScaleOut::One;
    gemm(mma_ot, a(_, 0, ks), tOrB(_, 0, ks), tOrO(_, mb, 0));
    warpgroup_commit_batch();
  }
  during();
  warpgroup_wait<0>();
  warpgroup_fence_operand(tOrO);
  if (tid_wg == 0 && half == 0) WsPhaseTrace::mark(tile, 7);
  const WsTileInfo info = ss.info[stage];
  if (info.last) ws_scale_ot_columns<Cfg>(tOrO, ss.row_scale[stage] + BM, q);
  __syncwarp();
  if (lane == 0) mbarrier_arrive(&ss.pv_done[stage]);  // this CTA's P slot (WG0 waits it)
  return info;
}

// ws_store_o for e4m3: thread (w, p, q) holds O[row 8j + 2q + e][dv half 256 + 64 mb + 16w + 2p, + 1].
template <typename Cfg, typename FragO>
__device__ __forceinline__ void ws_store_ot(const DecodeParams& p, typename Cfg::SharedStorage& ss, const FragO& tOrO,
                                            const WsTileInfo& info, int half, int tid) {
  using Out = typename Cfg::OutElement;
  constexpr int DV = Cfg::HEAD_DIM_V;
  const int m_block = blockIdx.z, g = blockIdx.y;
  const int* meta = ws_meta(p);
  const PieceDest dest = piece_dest(p, info.bi, info.bi == meta[kMetaBeginBatch] ? meta[kMetaBeginSplit] : 0);
  const int tw = tid % 128, lane = tw % 32;
  const int dv0 = half * (DV / 2) + (tw / 32) * 16 + 2 * (lane / 4), q = lane % 4;
  const uint64_t keep = l2_evict_last_policy();
  constexpr int R = kOtChunkRegs<Cfg>;
#pragma unroll
  for (int j = 0; j < Cfg::kOtRows / 8; ++j) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int r = ws_ot_query_row<Cfg>(m_block, j, q, e);
      if (r >= p.rows) continue;
      if (dest.single) {
        const auto [s, head] = query_row(p, g, r);
        Out* o = reinterpret_cast<Out*>(p.out) + (((info.bi * p.s_q + s) * p.h_q + head) * DV + dv0);
#pragma unroll
        for (int mb = 0; mb < 4; ++mb)
          *reinterpret_cast<unsigned*>(o + 64 * mb) =
              ElemTraits<Out>::pack2(tOrO(R * mb + 4 * j + e), tOrO(R * mb + 4 * j + 2 + e));
      } else {
        float* o = p.o_accum + (((dest.slot * p.h_kv + g) * p.rows + r) * DV + dv0);
#pragma unroll
        for (int mb = 0; mb < 4; ++mb)
          st_global_f2_hint(o + 64 * mb, tOrO(R * mb + 4 * j + e), tOrO(R * mb + 4 * j + 2 + e), keep);
      }
    }
  }
  if constexpr (Cfg::kFusedCombine) {
    if (!dest.single) ws_count_split(p, dest, info.bi, g, m_block, tid, ss.pending, &ss.num_pending);
  }
}

// This warpgroup's half of O for a finished piece (rows < p.rows only): into out (single split)
// or the piece's o_accum slot, and with the fused combine the split's count.
template <typename Cfg, typename FragO>
__device__ __forceinline__ void ws_store_o(const DecodeParams& p, typename Cfg::SharedStorage& ss, const FragO& tOrO,
                                           const WsTileInfo& info, int half, int row0, int col_lane, int tid) {
  constexpr int DV = Cfg::HEAD_DIM_V;
  const int m_block = blockIdx.z, g = blockIdx.y;
  const int* meta = ws_meta(p);
  const PieceDest dest = piece_dest(p, info.bi, info.bi == meta[kMetaBeginBatch] ? meta[kMetaBeginSplit] : 0);
  const bool single = dest.single;
  const int slot = dest.slot;
  const int col_base = half * (DV / 2) + col_lane;
#pragma unroll
  for (int h = 0; h < Cfg::kRowHalves; ++h) {
    const int r = ws_query_row<Cfg>(m_block, row0 + 8 * h);
    if (r >= p.rows) continue;
    if (single) {
      ws_store_out_row<Cfg>(p, tOrO, info.bi, r, h, col_base);
    } else {
      float* o = p.o_accum + (((slot * p.h_kv + g) * p.rows + r) * DV + col_base);
      const uint64_t keep = l2_evict_last_policy();
#pragma unroll
      for (int j = 0; j < cute::size(tOrO) / 4; ++j) {
        const int i = j * 4 + h * 2;
        st_global_f2_hint(o + j * 8, tOrO(i), tOrO(i + 1), keep);
      }
    }
  }
  if constexpr (Cfg::kFusedCombine) {
    if (!single) ws_count_split(p, dest, info.bi, g, m_block, tid, ss.pending, &ss.num_pending);
  }
}

// The role of WG1 / WG2 (wg 1, 2): each owns half of O (64 x DV/2 fp32 in registers) and adds
// every tile's P V to it; thread 128 (WG1) is also the TMA producer.
// KV_FP8: tile n de-quantized from its landing slot into its 16-bit stage by the 256 threads of
// WG1 + WG2, the slot released to the producer (pv_done) and the stage announced to WG0 (kv_ready).
// The stage held tile n - NS, so both warpgroups meet first: each is past its P V of that tile.
// The thread index is re-read (opaque): kept through the P V loop it would cost a register O needs.
template <typename Cfg>
__device__ __forceinline__ void ws_dequant_tile(typename Cfg::SharedStorage& ss, int n) {
  constexpr int NS = Cfg::NUM_STAGES;
  const int s = n % NS;
  named_barrier_sync(kBarDequant, 256);
  mbarrier_wait(&ss.full[s], (n / NS) & 1);
  const int t = opaque(threadIdx.x) - 128;
  dequant_kv_tile_e4m3<typename Cfg::Element, Cfg::BLOCK_N, Cfg::kColChunks>(
      smem_addr(ss.landing[s]), smem_addr(ss.kv[s]), ss.tile_valid[s], t);
  fence_proxy_async_shared();  // read by wgmma (async proxy)
  ws_release_stage<Cfg>(ss.pv_done, s, t % 32);
  if (t % 32 == 0) mbarrier_arrive(&ss.kv_ready[s]);
}

template <typename Cfg, typename Lens>
__device__ __forceinline__ void ws_pv_warpgroup(const DecodeParams& p, Lens seqlens, const TmaDescriptor* tmap,
                                                const void* kv_rows, typename Cfg::SharedStorage& ss, int wg, int tid) {
  using namespace cute;
  constexpr int BM = Cfg::BLOCK_M, DV = Cfg::HEAD_DIM_V, NS = Cfg::NUM_STAGES;
  // setmaxnreg first: WG0's setmaxnreg.inc waits for these registers, and with it the CTA's
  // first Q (the tile count below walks the CTA's batches, a chain of dependent loads).
  __syncwarp();  // setmaxnreg is .aligned
  setmaxnreg_move<Cfg::kLaunchRegs, Cfg::kRegsPV>();
  const bool is_producer = tid == 128;
  const int half = wg - 1;
  const int tid_wg = tid % 128;

  // Tile 0 is issued at once, tiles 1 .. NUM_STAGES - 1 once WG0 has its first Q: issued
  // together, the KV tiles of every CTA (~29 MB) were queued ahead of the small Q loads, which
  // then landed ~10 us after the CTA started (clock trace, 32/1/4096/16 on the H200).
  const bool producer_warp = tid / 32 == 4;
  if constexpr (!Cfg::kSparse) {
    if (is_producer) ws_producer_start<Cfg>(p, seqlens, tmap, ss);
    __syncwarp();
  }

  // Counted before O's registers are live.
  const int num_tiles = ws_count_tiles<Cfg>(p, seqlens);

  // Sparse: the gathering threads' next index (tile 0's gathered at once, 1 .. NS - 1 once WG0 has
  // its first Q, as the TMA producer does).
  WsGatherIndex gi{-1, 0, 0};
  const int origin = Cfg::kSparse ? ws_walk_origin(p) : 0;
  // FP8 records: tile 0 de-quantized and tile 1 gathered before the loop (which de-quantizes tile
  // n + 1 before its P V(n) and gathers n + 2 beside it).
  if constexpr (Cfg::kSparseFp8) {
    if (tid - 128 < Cfg::kRecordBytes / 16) {
      st_shared_v4(smem_addr(ss.null_record) + 16 * (tid - 128), make_uint4(0u, 0u, 0u, 0u));
    }
  }
  if constexpr (Cfg::kSparse) {
    ws_load_index<Cfg>(p, origin, 0, num_tiles, tid - 128, gi);
    if (num_tiles > 0) ws_gather_tile<Cfg>(p, kv_rows, ss, origin, 0, tid - 128, gi);
    ws_load_index<Cfg>(p, origin, 1, num_tiles, tid - 128, gi);
    named_barrier_sync(kBarFirstQ, ws_first_q_threads<Cfg>());
    if constexpr (Cfg::kCrossover) {
      // Tile 0 de-quantized, tiles 1 and 2 gathered (the loop gathers tile n + 3 beside P V(n)).
      if (num_tiles > 0) ws_dequant_half<Cfg>(ss, 0, tid - 128);
      if (num_tiles > 1) {
        ws_gather_tile<Cfg>(p, kv_rows, ss, origin, 1, tid - 128, gi);
        ws_load_index<Cfg>(p, origin, 2, num_tiles, tid - 128, gi);
      }
      if (num_tiles > 2) {
        ws_gather_tile<Cfg>(p, kv_rows, ss, origin, 2, tid - 128, gi);
        ws_load_index<Cfg>(p, origin, 3, num_tiles, tid - 128, gi);
      }
    } else if constexpr (Cfg::kSparseFp8) {
      if (num_tiles > 0) ws_dequant_records<Cfg>(ss, 0, tid - 128);
      if (num_tiles > 1) {
        ws_gather_tile<Cfg>(p, kv_rows, ss, origin, 1, tid - 128, gi);
        ws_load_index<Cfg>(p, origin, 2, num_tiles, tid - 128, gi);
      }
    } else {
      for (int m = 1; m < NS && m < num_tiles; ++m) {
        ws_gather_tile<Cfg>(p, kv_rows, ss, origin, m, tid - 128, gi);
        ws_load_index<Cfg>(p, origin, m + 1, num_tiles, tid - 128, gi);
      }
    }
  }

  if constexpr (Cfg::kFusedCombine) {
    // No combine kernel: batches without keys get out = 0 / lse = +inf here (WG2 has time for
    // it while WG0 computes the first S).
    if (half == 1) ws_write_empty_batches<Cfg>(p, tid_wg, blockIdx.y, blockIdx.z);
  }
  if (!Cfg::kSparse && producer_warp) {
    named_barrier_sync(kBarFirstQ, kFirstQThreads);
    if (is_producer) {
      MLA_JIT_TRACE_VALUE(mla_jit_trace_splitkv, kTraceTiles, num_tiles);
      for (int s = 1; s < NS && ss.prod.valid(); ++s) ws_issue_tile<Cfg>(p, seqlens, tmap, ss);
    }
    __syncwarp();  // reconverge warp 4 before any .aligned instruction
  }

  // O's half (e4m3: O^T's, dv x rows; ws_pv_tile_regs).
  conditional_t<Cfg::kFp8, typename Cfg::TiledMmaOt, typename Cfg::TiledMmaO> mma_o;
  Tensor tOrO = partition_fragment_C(
      mma_o, conditional_t<Cfg::kFp8, Shape<Int<DV / 2>, Int<Cfg::kOtRows>>, Shape<Int<BM>, Int<DV / 2>>>{});
#pragma unroll
  for (int i = 0; i < size(tOrO); ++i) tOrO(i) = 0.f;

  // KV_FP8: tile n + 1 is de-quantized before P V(n), during WG0's S and softmax of tile n, and
  // its slot refilled at once with tile n + 1 + NS (two tiles of TMA latency hidden).
  if constexpr (Cfg::kKvFp8) {
    if (num_tiles > 0) {
      ws_dequant_tile<Cfg>(ss, 0);
      if (is_producer && ss.prod.valid()) ws_issue_tile<Cfg>(p, seqlens, tmap, ss);
      __syncwarp();
    }
  }

  int stage = 0;
  uint32_t phase = 0;
  bool fresh = true;  // first tile of a piece: the P V wgmma overwrites O (scale-d = 0)
  for (int n = 0; n < num_tiles; ++n) {
    // Refill the stage of tile n - 1 with tile n - 1 + NS as soon as both P V warpgroups are
    // done with it (e4m3: beside P V(n), during_pv), before waiting for P(n): P(n) is published only after S(n + 1), whose
    // bytes may be the ones this issues (NS = 2), and the TMA latency (~3600 cycles at h_q = 128,
    // H200) needs the head start.
    if constexpr (Cfg::kKvFp8) {
      if (n + 1 < num_tiles) {
        ws_dequant_tile<Cfg>(ss, n + 1);
        if (is_producer && ss.prod.valid()) ws_issue_tile<Cfg>(p, seqlens, tmap, ss);
      }
    } else if constexpr (Cfg::kSparseFp8) {
      // Tile n + 1 into the stage of tile n - 1 once both P V warpgroups are past P V(n - 1) (its
      // records landed in the slot; tile n + 2's go there during P V(n)).
      if (n + 1 < num_tiles) {
        // (Crossover at n = 0 too: the barrier orders the gathering warps' valid bits of tile 1,
        // which ws_dequant_half reads in other warps.)
        if (n > 0 || Cfg::kCrossover) named_barrier_sync(kBarDequant, 256);
        // Crossover: this CTA is done with stage (n + 1) % NS, which the peer may now fill.
        if (Cfg::kCrossover && n > 0 && tid == 128) {
          mbarrier_arrive_cluster(&ss.peer_free[(n + 1) % NS], cluster_cta_rank() ^ 1u);
        }
        if (tid == 128) WsPhaseTrace::mark(n, 4);
        const int t = opaque(tid) - 128;
        if constexpr (Cfg::kCrossover) {
          ws_dequant_half<Cfg>(ss, n + 1, t);
        } else {
          ws_dequant_records<Cfg>(ss, n + 1, t);
        }
        if (tid == 128) WsPhaseTrace::mark(n, 5);
      }
    } else if constexpr (Cfg::kSparse) {
      // Both P V warpgroups are past P V(n - 1) (named barrier): its stage takes tile n - 1 + NS.
      if (n > 0 && n - 1 + NS < num_tiles) {
        named_barrier_sync(kBarDequant, 256);
        if (tid == 128) WsPhaseTrace::mark(n, 4);
        const int t = opaque(tid) - 128;
        ws_gather_tile<Cfg>(p, kv_rows, ss, origin, n - 1 + NS, t, gi);
        ws_load_index<Cfg>(p, origin, n + NS, num_tiles, t, gi);
      }
    } else if constexpr (!Cfg::kEarlyRelease) {
      if (is_producer && n > 0 && ss.prod.valid()) ws_issue_tile<Cfg>(p, seqlens, tmap, ss);
    }
    __syncwarp();  // lane 0 of warp 4 may have diverged into the producer path
    // The thread's rows and columns, re-derived each tile (opaque): live through the loop they
    // would cost registers that O and the de-quantization need.
    const int tw = opaque(tid_wg);
    const int row0 = ws_row0(tw), col_lane = ws_col_lane(tw);
    // FP8 records: tile n + 2's gather (into the slot tile n + 1 just left) and n + 3's index while P V(n)
    // runs on the tensor cores: off the path from the de-quantization to the next one.
    auto during_pv = [&] {
      if constexpr (Cfg::kEarlyRelease) {
        // Stage n is free once S(n) and the V^T loads have read it (stage_free), and P V(n) reads
        // only V^T (registers) and P: its refill with tile n + NS runs beside P V(n), off the P V chain.
        if (is_producer && ss.prod.valid()) ws_issue_tile<Cfg>(p, seqlens, tmap, ss);
        __syncwarp();  // reconverge before wgmma.wait (.aligned)
      }
      if constexpr (Cfg::kSparseFp8) {
        constexpr int kAhead = Cfg::kCrossover ? 3 : 2;  // tiles gathered ahead of this P V
        if (n + kAhead < num_tiles) {
          const int t = opaque(tid) - 128;
          ws_gather_tile<Cfg>(p, kv_rows, ss, origin, n + kAhead, t, gi);
          ws_load_index<Cfg>(p, origin, n + kAhead + 1, num_tiles, t, gi);
        }
      }
    };
    WsTileInfo info;
    if constexpr (Cfg::kFp8) {
      info = ws_pv_tile_regs<Cfg>(ss, mma_o, tOrO, stage, phase, fresh, half, tw, tw % 32, during_pv, n);
      if (info.last) ws_store_ot<Cfg>(p, ss, tOrO, info, half, tid);
    } else {
      info = ws_pv_tile<Cfg>(ss, mma_o, tOrO, stage, phase, fresh, half, tw, tw % 32, row0, during_pv, n);
      if (info.last) ws_store_o<Cfg>(p, ss, tOrO, info, half, row0, col_lane, tid);
    }
    fresh = info.last;
    if (++stage == NS) {
      stage = 0;
      phase ^= 1u;
    }
  }
  if (tid_wg == 0) MLA_JIT_TRACE_LATEST(mla_jit_trace_splitkv, kTracePvDone);  // WG1's or WG2's, later
  __syncwarp();
  setmaxnreg_move<Cfg::kRegsPV, Cfg::kRegsAfter>();
}

}  // namespace detail

// kv_rows (sparse): the gathered rows' base (tmap unused); dense: tmap, the cache's TMA descriptor.
template <typename Cfg>
__device__ __forceinline__ void mla_splitkv_ws_body(const DecodeParams& p, const TmaDescriptor* tmap,
                                                    const void* kv_rows = nullptr) {
  using SS = typename Cfg::SharedStorage;
  constexpr int NS = Cfg::NUM_STAGES;

  extern __shared__ __align__(1024) unsigned char smem_raw[];
  SS& ss = aligned_shared_storage<SS>(smem_raw);

  const int tid = threadIdx.x;
  const int wg = tid / 128;

  if (tid == 0) {
    MLA_JIT_TRACE_TIME(mla_jit_trace_splitkv, kTraceEntry);
    MLA_JIT_TRACE_VALUE(mla_jit_trace_splitkv, kTraceSmId, trace_smid());
    for (int s = 0; s < NS; ++s) {
      // Sparse: each gathering thread's cp.async arrival and one per gathering warp (valid flags).
      mbarrier_init(&ss.full[s], Cfg::kSparse ? Cfg::kGatherThreads + Cfg::kGatherThreads / 32 : 1);
      mbarrier_init(&ss.p_full[s], 4);
      mbarrier_init(&ss.pv_done[s], Cfg::kEarlyRelease ? 8 : 8 * Cfg::CLUSTER_M);
      if constexpr (Cfg::kEarlyRelease) mbarrier_init(&ss.stage_free[s], 12 * Cfg::CLUSTER_M);
      if constexpr (Cfg::kDequantInPv) mbarrier_init(&ss.kv_ready[s], 8);
    }
    if constexpr (Cfg::kSparseFp8) {
      for (int k = 0; k < Cfg::kRecordSlots; ++k) mbarrier_init(&ss.landed[k], Cfg::BLOCK_N);
      if constexpr (Cfg::kCrossover) {
        for (int k = 0; k < Cfg::kRecordSlots; ++k) mbarrier_init(&ss.slot_read[k], 8);
        for (int s = 0; s < NS; ++s) {
          mbarrier_init(&ss.peer_free[s], 1);
          mbarrier_init(&ss.copy_landed[s], 1);
        }
      }
    }
    ss.num_pending = 0;
    fence_barrier_init();
  }
  if (!Cfg::kSparse && tid == 128) prefetch_tma_descriptor(tmap);  // the producer's
  __syncthreads();
  // Every CTA's barriers are initialized before any peer multicasts into it or arrives on them.
  if constexpr (Cfg::CLUSTER_M > 1) cluster_sync();

  // No-op unless launched as a programmatic dependent of the metadata kernel.
  pdl_wait_primary();

  // Sequence lengths: the cache's, or (sparse) topk for every row.
  auto roles = [&](auto seqlens) {
    if (wg == 0) {
      detail::ws_softmax_warpgroup<Cfg>(p, seqlens, ss);
    } else {
      detail::ws_pv_warpgroup<Cfg>(p, seqlens, tmap, kv_rows, ss, wg, tid);
    }
  };
  if constexpr (Cfg::kSparse) {
    roles(detail::WsFixedLengths{p.topk});
  } else {
    const int* seqlens = p.cache_seqlens;
    roles(seqlens);
  }
  if constexpr (Cfg::kFusedCombine) {
    // Step 2 of the fused combine: all 12 warps merge the batches this CTA completed. The KV
    // stages are free now (every tile was consumed): they hold the split weights.
    __syncthreads();
    for (int k = 0; k < ss.num_pending; ++k) {
      detail::ws_combine_batch<Cfg>(p, ss.pending[k][0], ss.pending[k][1], ss.pending[k][2],
                                    reinterpret_cast<float*>(ss.kv), tid);
    }
  }
  // No CTA leaves while a peer may still arrive on its pv_done (stage_free) barriers.
  if constexpr (Cfg::CLUSTER_M > 1) cluster_sync();
  if (tid == 0) MLA_JIT_TRACE_TIME(mla_jit_trace_splitkv, kTraceExit);
  pdl_launch_dependents();
}

}  // namespace decode
}  // namespace mla_jit
