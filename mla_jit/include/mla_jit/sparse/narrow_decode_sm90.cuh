// mla_jit sparse (DSA) decode over FlashMLA's FP8 records on sm_90a for few heads (h_q <= 16: a CTA
// serves 8 or 16 heads of one query token): the "narrow" kernel, whose tensor work scales with the
// heads instead of padding them to wgmma's M = 64 (FlashMLA, and our splitkv_ws.cuh kernel, pay 64
// heads' MMAs at 8 or 16).
//
// Swapped operands. With the heads as wgmma's N (8 or 16):
//   S^T (64 tokens x N)  = K (64 x 576, registers)   . Q^T (smem, K-major, N rows)
//   O^T (512 dv x N)    += V^T (64 dv x 64, registers) . P'^T (smem, K-major, N rows), 8 M blocks
// Both A operands are built in registers straight from the gathered records (no bf16 K stage), by
// bit arithmetic that is exact for every e4m3 value: byte s.eeee.mmm placed as bf16 s.0000eeee.mmm0000
// is the value times 2^-120 (subnormals included). The records' per-128 scales are folded into
// S and P instead of the values: S = sum_b s_b (K_b . Q_b) over the 4 nope blocks (one accumulator
// each) plus the rope's, and P'_b = P * s_b for the dv rows of block b. Q's nope part is stored
// times 2^100 and P'_b times 2^100, so that every product is the true one times 2^-20 (well inside
// fp32's normal range; |q| < 2^28 and s_b < 2^28 keep the bf16 operands finite).
//
// Free permutations keep every register one load away. S sums over d, so K's columns and Q^T's are
// permuted alike: thread (warp w, lane l, q = l % 4) reads bytes 64 G + 16 q .. + 15 of its two
// tokens' records for nope group G (one 16-byte load a row), and logical column j = 2 q + e + 8 hi
// of k-step ks of the group is record byte 64 G + 16 q + 4 ks + 2 e + hi (rope: element 512 + 16 q +
// 4 ks + 2 hi + e), which makes the A registers (b0, b2) and (b1, b3) of one 32-bit word. P V sums
// over tokens and O^T's rows are ours to place: M block 2 b + i2, row 16 w + l / 4 + 8 h is dv
// 128 b + 4 (8 w + l / 4) + 2 i2 + h, so a thread's 4 dv of block b are one 32-bit word of each of
// its 16 tokens' records (the 4 lanes of a row group read 4 tokens 2 records apart: 8 banks apart).
//
// CTA: one warpgroup (8 or 16 heads of one query token), 2 CTAs an SM. Each warp gathers its own
// 16 tokens of each tile (a bulk copy of a record a token, completing on landed[s]) into SLOTS record
// slots, SLOTS tiles ahead; a warp keeps its tokens' valid bits itself (its S rows are its tokens);
// the indices of the tile after come by cp.async (copy_indices), the next row's Q into L2 ahead of
// its piece (prefetch_q).
// Per tile: S^T by 9 commit groups of 4 k-steps (A registers double-buffered), the V words and the
// scales read, the column max across the 4 warps (red, by tile parity; after that barrier every warp
// is done with the slot, which it refills with tile m + SLOTS), P' stored by stmatrix .trans, a named
// barrier, O^T's 8 M blocks. Pieces and splits as in splitkv_ws.cuh: the walk is a contiguous run of
// (row, tile) from the metadata's origin; a row in one split is written here (attention sink
// applied), else its partial goes to o_accum / lse_accum for the combine kernel.
#pragma once

#include "mla_jit/decode/common.cuh"
#include "mla_jit/decode/records.cuh"

namespace mla_jit {
namespace sparse {

using decode::DecodeParams;

template <int HEADS_, int SLOTS_, int PAGE_SIZE_>
struct NarrowSm90Config {
  using Element = cutlass::bfloat16_t;
  using Record = decode::V32Record;
  static constexpr int N = HEADS_;  // heads of a group (wgmma N)
  static constexpr int SLOTS = SLOTS_;
  static constexpr int PAGE_SIZE = PAGE_SIZE_;
  static constexpr int BN = 64, D = 576, DV = 512, R = Record::kBytes;
  static constexpr int kBlocks = Record::kNopeValues / Record::kValuesPerScale;  // 4
  static constexpr int NUM_THREADS = 128;
  static constexpr int kHeadsPerCta = N;
  static_assert(N == 8 || N == 16, "a group of 8 or 16 heads");
  static_assert(Record::kNopeValues == 512 && Record::kValuesPerScale == 128 && Record::kRopeValues == 64 &&
                    Record::kRopeOffset == 528,
                "the thread mapping is written for V3.2's record");
  static_assert(SLOTS >= 2 && SLOTS <= 4, "a tile in flight beside the one read; valid bits in 64");

  using TiledMma = decltype(cute::make_tiled_mma(
      cute::GMMA::rs_op_selector<Element, Element, float, cute::Shape<cute::_64, cute::Int<N>, cute::_64>>()));
  using SmemLayoutQ =
      decltype(cute::tile_to_shape(cute::GMMA::Layout_K_SW128_Atom<Element>{}, cute::Shape<cute::Int<N>, cute::Int<D>>{}));
  using SmemLayoutP =
      decltype(cute::tile_to_shape(cute::GMMA::Layout_K_SW128_Atom<Element>{}, cute::Shape<cute::Int<N>, cute::Int<BN>>{}));

  struct SharedStorage {
    alignas(1024) Element q[N * D];            // Q^T (permuted, nope x 2^100)
    alignas(1024) Element p[kBlocks][N * BN];  // P'^T of the 4 scale blocks
    alignas(16) unsigned char records[SLOTS][BN * R];
    float red[2][4][N];  // per-warp column maxima, by tile parity
    float red_l[4][N];   // per-warp column sums at a piece's end
    int idx[2][BN];      // the indices of the next tiles to gather (copy_indices)
    alignas(8) uint64_t landed[SLOTS];
  };
  static constexpr int kSmemBytes = Sm90SmemSize<SharedStorage>::kBytes;
  // 2 CTAs an SM (the launch bounds, configs/sparse.py resident_ctas): 228 KB, 1 KB reserved a CTA.
  static_assert(2 * (kSmemBytes + 1024) <= 228 * 1024, "two CTAs an SM");
};

namespace narrow {

constexpr float kQScale = 1.2676506002282294e30f;    // 2^100: Q's nope part and P'
constexpr float kOutScale = 1048576.f;               // 2^20: what every product lacks
// The CTA's 128 threads (bar.sync 1 with an immediate id; a register id makes ptxas reserve all 16
// of the CTA's barriers).
__device__ __forceinline__ void cta_sync() { asm volatile("bar.sync 1, 128;" ::: "memory"); }

// Tile m of the walk: its row and first token (every row has topk tokens, topk / 64 tiles).
struct Tile {
  int bi, tok;
};
__device__ __forceinline__ Tile walk_tile(int origin, int tiles_per_row, int m) {
  const int t = origin + m;
  const int bi = t / tiles_per_row;
  return {bi, (t - bi * tiles_per_row) * 64};
}

// The tile after t (every row has topk tokens).
__device__ __forceinline__ Tile next_tile(Tile t, int topk) {
  t.tok += 64;
  if (t.tok >= topk) {
    t.tok = 0;
    ++t.bi;
  }
  return t;
}

// The CTA's walk: its first tile in the flattened (row, tile) order and its number of tiles. The
// scheduler cuts at tile boundaries and every row has topk tokens, so both are arithmetic on the
// metadata row (one dependent load; the prologue is a few percent of a CTA's ~15 tiles).
struct Walk {
  int origin, num_tiles, tiles_per_row, begin_b, begin_split;
};
__device__ __forceinline__ Walk cta_walk(const DecodeParams& p) {
  const int* meta = p.tile_scheduler_metadata + blockIdx.x * decode::kMetaSize;
  const int4 lo = *reinterpret_cast<const int4*>(meta);  // begin batch, begin token, end batch, end token
  Walk w;
  w.tiles_per_row = p.topk / 64;
  w.begin_b = lo.x;
  w.begin_split = meta[decode::kMetaBeginSplit];
  w.origin = lo.x * w.tiles_per_row + lo.y / 64;
  const int end = lo.z * w.tiles_per_row + (min(lo.w, p.topk) + 63) / 64;
  w.num_tiles = max(0, end - w.origin);
  return w;
}

// A gathering lane's token (lane < 16 of each warp: token 16 w + lane) of a tile: its index,
// position and the row's token limit. The prologue's tiles load their indices directly; the loop's
// come by cp.async into `idx` a tile ahead of their gather (a register load a tile ahead was
// consumed at once by a register copy of the loop-carried value: ~9% of the stall samples, waiting
// for the global round trip every tile).
struct GatherIndex {
  int idx, tok, lim;
};
// The row limit of tile's row (topk_length, else topk).
__device__ __forceinline__ int row_limit(const DecodeParams& p, Tile tile) {
  return p.topk_length != nullptr ? __ldg(p.topk_length + tile.bi / p.lse_fold) : p.topk;
}
__device__ __forceinline__ GatherIndex load_index(const DecodeParams& p, Tile tile, int warp, int lane) {
  if (lane >= 16) return {-1, 0, 0};
  const int tok = tile.tok + 16 * warp + lane;
  return {__ldg(p.block_table + (long long)tile.bi * p.block_table_stride + tok), tok, row_limit(p, tile)};
}
// Tile's indices (lanes < 16) into idx[buf] by cp.async, one commit group (empty past the walk).
template <typename Cfg>
__device__ __forceinline__ void copy_indices(const DecodeParams& p, typename Cfg::SharedStorage& ss, bool in_walk,
                                             Tile tile, int warp, int lane, int buf) {
  if (in_walk && lane < 16) {
    const int* src = p.block_table + (long long)tile.bi * p.block_table_stride + tile.tok + 16 * warp + lane;
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(smem_addr(&ss.idx[buf][16 * warp + lane])), "l"(src)
                 : "memory");
  }
  asm volatile("cp.async.commit_group;" ::: "memory");
}
// The copied indices of tile (in idx[buf]), lim its row's limit.
template <typename Cfg>
__device__ __forceinline__ GatherIndex copied_index(typename Cfg::SharedStorage& ss, Tile tile, int warp, int lane,
                                                    int buf, int lim) {
  asm volatile("cp.async.wait_group 0;" ::: "memory");
  if (lane >= 16) return {-1, 0, 0};
  return {ss.idx[buf][16 * warp + lane], tile.tok + 16 * warp + lane, lim};
}

// Warp w's 16 tokens of tile m into slot m % SLOTS (lanes 0-15, token 16 w + lane: a bulk copy of its
// record; an invalid token copies nothing, its slot bytes stay stale). The slot's previous tile (m - SLOTS)
// has been read by every warp (the caller is past that tile's exchange barrier). Returns the
// tokens' valid bits (bit i: token 16 w + i), which the warp keeps (its S rows are these tokens).
template <typename Cfg>
__device__ __forceinline__ unsigned gather(const DecodeParams& p, const void* cache, typename Cfg::SharedStorage& ss,
                                           int m, int w, int lane, GatherIndex gi) {
  const int s = m % Cfg::SLOTS;
  const bool ok = lane < 16 && gi.idx >= 0 && gi.idx < p.kv_tokens && gi.tok < gi.lim;
  const unsigned bits = __ballot_sync(0xffffffffu, ok) & 0xffffu;
  // One arrival a warp, expecting all of its copies' bytes (an arrival a token sat in the
  // per-lane loop the bulk copies compile to: ~6% of the stall samples).
  if (lane == 0) mbarrier_arrive_expect_tx(&ss.landed[s], __popc(bits) * Cfg::R);
  __syncwarp();
  if (ok) {
    const char* src = reinterpret_cast<const char*>(cache) + (long long)(gi.idx / Cfg::PAGE_SIZE) * p.kv_block_stride +
                      (gi.idx % Cfg::PAGE_SIZE) * Cfg::R;
    bulk_load(smem_addr(ss.records[s]) + (16 * w + lane) * Cfg::R, src, Cfg::R, &ss.landed[s]);
  }
  return bits;
}

// Two e4m3 bytes of x as bf16 x2 times 2^-120, exactly (byte s.eeee.mmm -> s.0000eeee.mmm0000,
// subnormals included): sel picks byte k of the low lane and k' of the high one (byte_perm indices)
// and replicates their sign bits into the byte above each (the 0x8 flag), so one shift and one mask
// place sign, exponent and mantissa.
template <uint32_t kLo, uint32_t kHi>
__device__ __forceinline__ uint32_t e4m3_pair(uint32_t a, uint32_t b) {
  constexpr uint32_t sel = kLo | ((kLo | 8u) << 4) | (kHi << 8) | ((kHi | 8u) << 12);
  return (byte_perm(a, b, sel) << 4) & 0x87F087F0u;
}

// Q (heads of the CTA's head tile, of row bi) into Q^T, columns permuted as K's (header) and the nope
// part times 2^100; heads past h_q are zero. 16-byte global loads (8 values of one head), issued
// together; each gives 4 bf16 pairs of logical columns.
template <typename Cfg>
__device__ __forceinline__ void load_q(const DecodeParams& p, typename Cfg::SharedStorage& ss, int bi, int tw_) {
  // (an opaque thread index: its addresses are recomputed here, once a piece, not hoisted out of the
  // tile loop into registers that the loop does not have)
  const int tw = opaque(tw_);
  constexpr int N = Cfg::N, kChunks = N * Cfg::D / 8, kPer = (kChunks + 127) / 128;
  const int head0 = blockIdx.z * Cfg::kHeadsPerCta;
  const cutlass::bfloat16_t* qb = reinterpret_cast<const cutlass::bfloat16_t*>(p.q) + (long long)bi * p.q_stride_b;
  uint4 v[kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int id = tw + 128 * i, n = id / (Cfg::D / 8), c = id % (Cfg::D / 8);
    v[i] = make_uint4(0u, 0u, 0u, 0u);
    if (id < kChunks && head0 + n < p.h_q) v[i] = __ldg(reinterpret_cast<const uint4*>(qb + (head0 + n) * p.q_stride_h + 8 * c));
  }
  const uint32_t base = smem_addr(ss.q);
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int id = tw + 128 * i, n = id / (Cfg::D / 8), c = id % (Cfg::D / 8);
    if (kChunks % 128 != 0 && id >= kChunks) break;
    const int G = c / 8, cc = c % 8;
    // The chunk's 8 values o = 8 cc + t of group G: q = cc / 2, k-step 2 (cc % 2) + t / 4.
    const int k0 = 64 * G + 32 * (cc % 2) + 2 * (cc / 2);
    uint32_t w[4] = {v[i].x, v[i].y, v[i].z, v[i].w};
    uint32_t pair[4];
    if (G < 8) {
      // nope: t % 4 = 2 e + hi. Pairs (t0, t2) -> cols 2q, 2q+1; (t1, t3) -> 2q+8, 2q+9; of k-steps
      // 2 (cc % 2) and + 1 (values 4-7). Scaled by 2^100 (exact).
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        float f[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const uint32_t word = w[2 * u + e / 2];
          f[e] = __uint_as_float((e % 2 ? word >> 16 : word & 0xffffu) << 16) * kQScale;
        }
        pair[2 * u] = ElemTraits<cutlass::bfloat16_t>::pack2(f[0], f[2]);
        pair[2 * u + 1] = ElemTraits<cutlass::bfloat16_t>::pack2(f[1], f[3]);
      }
    } else {
      // rope: t % 4 = 2 hi + e: words are the pairs already.
      pair[0] = w[0];
      pair[1] = w[1];
      pair[2] = w[2];
      pair[3] = w[3];
    }
    // pair 2u + hi: k-step 2 (cc % 2) + u, columns 2q + 8 hi, + 1.
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int k = k0 + 16 * (j / 2) + 8 * (j % 2);
      asm volatile("st.shared.b32 [%0], %1;" ::"r"(base + sw128_offset<N>(n, k)), "r"(pair[j]) : "memory");
    }
  }
  fence_proxy_async_shared();  // generic stores, read by wgmma
}

// Row bi's Q (the CTA's heads) into L2: its next piece's Q, a tile or two before load_q reads it
// (waited for at a piece's start, a Q load's round trip was ~18% of the kernel's stall samples).
template <typename Cfg>
__device__ __forceinline__ void prefetch_q(const DecodeParams& p, int bi, int tw) {
  constexpr int kLines = Cfg::D * 2 / 128;  // 128-byte lines a head
  const int head0 = blockIdx.z * Cfg::kHeadsPerCta;
  const char* qb = reinterpret_cast<const char*>(p.q) + (long long)bi * p.q_stride_b * 2;
#pragma unroll
  for (int i = 0; i < (Cfg::N * kLines + 127) / 128; ++i) {
    const int id = tw + 128 * i, n = id / kLines;
    if (n < Cfg::N && head0 + n < p.h_q) prefetch_l2(qb + (long long)(head0 + n) * p.q_stride_h * 2 + 128 * (id % kLines));
  }
}

// stmatrix .x4 / .x2 .trans: matrix m's row i (addressed by lane 8 m + i) is column i of the
// fragment's 8 x 8 matrix m.
__device__ __forceinline__ void stmatrix_x4_trans(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(r0),
               "r"(r1), "r"(r2), "r"(r3)
               : "memory");
}
__device__ __forceinline__ void stmatrix_x2_trans(uint32_t addr, uint32_t r0, uint32_t r1) {
  asm volatile("stmatrix.sync.aligned.m8n8.x2.trans.shared.b16 [%0], {%1, %2};" ::"r"(addr), "r"(r0), "r"(r1)
               : "memory");
}

// The group's running softmax state per column (head) the thread holds: N / 4 columns, column
// c = 8 (k / 2) + 2 q + k % 2 for k < N / 4.
template <typename Cfg>
struct ColState {
  float m[Cfg::N / 4];  // running max (log2 units, scale applied)
  float l[Cfg::N / 4];  // the thread's partial sum over its rows
};

// Fragment element i (of a 64 x N accumulator): row half (i / 2) % 2, column 8 (i / 4) + 2 q + i % 2;
// its column slot k = 2 (i / 4) + i % 2.
__device__ __forceinline__ constexpr int col_slot(int i) { return 2 * (i / 4) + i % 2; }

// bits: the warp's valid bits of the tiles in its slots, 16 a tile, tile m's lowest.
template <typename Cfg>
__device__ __forceinline__ void decode_loop(const DecodeParams& p, const void* cache, typename Cfg::SharedStorage& ss,
                                            const Walk& walk, int tid, uint64_t bits) {
  using namespace cute;
  using Element = typename Cfg::Element;
  constexpr int N = Cfg::N, R = Cfg::R, kCols = N / 4;
  const int tw = tid % 128, w = tw / 32, lane = tw % 32, q = lane % 4, rg = lane / 4;

  typename Cfg::TiledMma mma;
  auto thr = mma.get_thread_slice(tw);
  using FragA = decltype(make_tensor<Element>(partition_shape_A(typename Cfg::TiledMma{}, Shape<_64, _64>{})));
  using FragC = decltype(partition_fragment_C(mma, Shape<_64, Int<N>>{}));
  Tensor tOrO = partition_fragment_C(mma, Shape<Int<Cfg::DV>, Int<N>>{});  // (V, 8, 1)

  ColState<Cfg> st;
  int cur_bi = -1;
  Tile tile = walk_tile(walk.origin, walk.tiles_per_row, 0);
  // The next tile to gather (SLOTS of the walk; its indices are in idx[SLOTS % 2]) and its row limit.
  Tile itile = tile;
  for (int k = 0; k < Cfg::SLOTS; ++k) itile = next_tile(itile, p.topk);
  int ilim = Cfg::SLOTS < walk.num_tiles ? row_limit(p, itile) : 0;
  for (int m = 0; m < walk.num_tiles; ++m, tile = next_tile(tile, p.topk)) {
    const bool fresh = tile.bi != cur_bi;
    const bool last = m + 1 == walk.num_tiles || tile.tok + 64 >= p.topk;
    // The next row's Q into L2 at this row's last two tiles, when the walk goes on into it.
    if (tile.tok + 128 >= p.topk && m + (p.topk - tile.tok) / 64 < walk.num_tiles) prefetch_q<Cfg>(p, tile.bi + 1, tw);
    if (fresh) {
      // Every warp's S of the previous piece is done (its wgmma waited) before Q is rewritten.
      cta_sync();
      load_q<Cfg>(p, ss, tile.bi, tw);
      cta_sync();
      cur_bi = tile.bi;
#pragma unroll
      for (int k = 0; k < kCols; ++k) {
        st.m[k] = -kInf;
        st.l[k] = 0.f;
      }
    }
    const int s = m % Cfg::SLOTS;
    mbarrier_wait(&ss.landed[s], (m / Cfg::SLOTS) & 1);
    const uint32_t slot = smem_addr(ss.records[s]);
    const int row = 16 * w + rg;  // tokens row and row + 8
    const uint32_t rec0 = slot + row * R, rec1 = rec0 + 8 * R;

    // ---- S^T = K Q^T: 8 nope groups (block G / 2) and the rope, 4 k-steps each ----
    FragC acc[5];
    FragA a[2];
    // A group's two 16-byte loads are issued a group ahead of their conversion (their latency was
    // the S phase's main stall).
    uint4 x0 = ld_shared_v4(rec0 + 16 * q), x1 = ld_shared_v4(rec1 + 16 * q);
    auto fill_nope = [&](FragA& f, int G) {
      const uint32_t r0[4] = {x0.x, x0.y, x0.z, x0.w}, r1[4] = {x1.x, x1.y, x1.z, x1.w};
      auto fa = recast<uint32_t>(f);
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) {
        fa(4 * ks + 0) = e4m3_pair<0, 2>(r0[ks], 0u);  // (b0, b2): columns 2q, 2q + 1
        fa(4 * ks + 1) = e4m3_pair<0, 2>(r1[ks], 0u);
        fa(4 * ks + 2) = e4m3_pair<1, 3>(r0[ks], 0u);  // (b1, b3): columns 2q + 8, 2q + 9
        fa(4 * ks + 3) = e4m3_pair<1, 3>(r1[ks], 0u);
      }
    };
    auto fill_rope = [&](FragA& f) {
      const uint32_t o = Cfg::Record::kRopeOffset + 32 * q;
      const uint4 x0 = ld_shared_v4(rec0 + o), y0 = ld_shared_v4(rec0 + o + 16);
      const uint4 x1 = ld_shared_v4(rec1 + o), y1 = ld_shared_v4(rec1 + o + 16);
      const uint32_t r0[8] = {x0.x, x0.y, x0.z, x0.w, y0.x, y0.y, y0.z, y0.w};
      const uint32_t r1[8] = {x1.x, x1.y, x1.z, x1.w, y1.x, y1.y, y1.z, y1.w};
      auto fa = recast<uint32_t>(f);
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) {
        fa(4 * ks + 0) = r0[2 * ks];
        fa(4 * ks + 1) = r1[2 * ks];
        fa(4 * ks + 2) = r0[2 * ks + 1];
        fa(4 * ks + 3) = r1[2 * ks + 1];
      }
    };
    // Q^T's descriptors from an opaque base, per tile: hoisted, the 36 of them held 72 registers.
    Tensor sQ = make_tensor(make_smem_ptr(ss.q + opaque(0)), typename Cfg::SmemLayoutQ{});
    Tensor tSrQ = thr.partition_fragment_B(sQ);  // (MMA, 1, 36)
    auto issue = [&](FragA& f, FragC& c, int G, bool first) {
      warpgroup_fence_operand(f);
      warpgroup_arrive();
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) {
        mma.accumulate_ = first && ks == 0 ? GMMA::ScaleOut::Zero : GMMA::ScaleOut::One;
        gemm(mma, f(_, 0, ks), tSrQ(_, 0, 4 * G + ks), c(_, 0, 0));
      }
      warpgroup_commit_batch();
    };
#pragma unroll
    for (int G = 0; G < 9; ++G) {
      FragA& f = a[G % 2];
      if (G >= 2) {
        warpgroup_wait<1>();
        warpgroup_fence_operand(f);
      }
      if (G < 8) {
        fill_nope(f, G);
        if (G < 7) {
          x0 = ld_shared_v4(rec0 + 64 * (G + 1) + 16 * q);
          x1 = ld_shared_v4(rec1 + 64 * (G + 1) + 16 * q);
        }
      } else {
        fill_rope(f);
      }
      FragC& c = acc[G < 8 ? G / 2 : 4];
      warpgroup_fence_operand(c);
      issue(f, c, G, G % 2 == 0 || G == 8);
    }
    // Scales and valid bits while S runs; then (S's accumulators folded, their registers free) the
    // V words of P V: the thread's 4 dv of block b are one word of each of its tokens 16 ks + 2 q +
    // {0, 1, 8, 9}. Then the slot is released.
    const float4 sc0 = *reinterpret_cast<const float4*>(&ss.records[s][row * R + Cfg::Record::kScaleOffset]);
    const float4 sc1 = *reinterpret_cast<const float4*>(&ss.records[s][(row + 8) * R + Cfg::Record::kScaleOffset]);
    const unsigned vbits = unsigned(bits);
    const bool ok0 = (vbits >> rg) & 1u, ok1 = (vbits >> (rg + 8)) & 1u;
    warpgroup_wait<0>();
#pragma unroll
    for (int i = 0; i < 5; ++i) warpgroup_fence_operand(acc[i]);
    const float sl2 = p.scale_log2, fs = sl2 * kOutScale;
    float sv[N / 2];
    {
      const float k0[4] = {sc0.x * fs, sc0.y * fs, sc0.z * fs, sc0.w * fs};
      const float k1[4] = {sc1.x * fs, sc1.y * fs, sc1.z * fs, sc1.w * fs};
#pragma unroll
      for (int i = 0; i < N / 2; ++i) {
        const bool hi = (i / 2) % 2;
        const float* kk = hi ? k1 : k0;
        float x = acc[4](i) * sl2;
        x = fmaf(acc[3](i), kk[3], x);
        x = fmaf(acc[2](i), kk[2], x);
        x = fmaf(acc[1](i), kk[1], x);
        x = fmaf(acc[0](i), kk[0], x);
        sv[i] = (hi ? ok1 : ok0) ? x : -kInf;
      }
    }
    uint32_t vw[4][16];
#pragma unroll
    for (int b = 0; b < 4; ++b) {
#pragma unroll
      for (int k = 0; k < 16; ++k) {
        const int tok = 16 * (k / 4) + 2 * q + (k % 2) + 8 * ((k / 2) % 2);
        asm volatile("ld.shared.b32 %0, [%1];"
                     : "=r"(vw[b][k])
                     : "r"(slot + tok * R + 128 * b + 4 * (8 * w + rg))
                     : "memory");
      }
    }

    // ---- the column max across the group's warps ----
    const int par = m & 1;
    float mx[kCols];
#pragma unroll
    for (int k = 0; k < kCols; ++k) {
      const int i = 4 * (k / 2) + k % 2;
      float v = fmaxf(sv[i], sv[i + 2]);
      v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 4));
      v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 8));
      v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 16));
      mx[k] = v;
    }
    if (rg == 0) {
#pragma unroll
      for (int k = 0; k < kCols; ++k) ss.red[par][w][8 * (k / 2) + 2 * q + k % 2] = mx[k];
    }
    cta_sync();
    // Every warp has read the slot: refill it with tile m + SLOTS (its indices loaded a tile ago).
    bits >>= 16;
    if (m + Cfg::SLOTS < walk.num_tiles) {
      const int t = m + Cfg::SLOTS;
      const GatherIndex gi = copied_index<Cfg>(ss, itile, w, lane, t & 1, ilim);
      bits |= uint64_t(gather<Cfg>(p, cache, ss, t, w, lane, gi)) << (16 * (Cfg::SLOTS - 1));
      itile = next_tile(itile, p.topk);
      copy_indices<Cfg>(p, ss, t + 1 < walk.num_tiles, itile, w, lane, (t + 1) & 1);
      if (itile.tok == 0 && t + 1 < walk.num_tiles) ilim = row_limit(p, itile);  // (a new row: once a row)
    }
    float alpha[kCols], muse[kCols];
    bool moved = false;
#pragma unroll
    for (int k = 0; k < kCols; ++k) {
      const int c = 8 * (k / 2) + 2 * q + k % 2;
      float t = fmaxf(fmaxf(ss.red[par][0][c], ss.red[par][1][c]), fmaxf(ss.red[par][2][c], ss.red[par][3][c]));
      const float mn = fmaxf(st.m[k], t);
      muse[k] = mn == -kInf ? 0.f : mn;
      alpha[k] = ex2_approx(st.m[k] - muse[k]);
      moved |= mn != st.m[k];
      st.m[k] = mn;
    }
    float pv[N / 2];
#pragma unroll
    for (int i = 0; i < N / 2; ++i) pv[i] = ex2_approx(sv[i] - muse[col_slot(i)]);
#pragma unroll
    for (int k = 0; k < kCols; ++k) {
      const int i = 4 * (k / 2) + k % 2;
      st.l[k] = fmaf(st.l[k], alpha[k], pv[i] + pv[i + 2]);
    }
    if (!fresh && __any_sync(0xffffffffu, moved)) {
#pragma unroll
      for (int i = 0; i < size(tOrO); ++i) tOrO(i) *= alpha[col_slot(i % (N / 2))];
    }

    // ---- P'_b = P s_b 2^100 (0 for invalid tokens) into the group's 4 P'^T slabs ----
    {
      // (selects: an invalid token's slot bytes are stale or never written, its scales maybe NaN)
      const float t0[4] = {ok0 ? sc0.x * kQScale : 0.f, ok0 ? sc0.y * kQScale : 0.f, ok0 ? sc0.z * kQScale : 0.f,
                           ok0 ? sc0.w * kQScale : 0.f};
      const float t1[4] = {ok1 ? sc1.x * kQScale : 0.f, ok1 ? sc1.y * kQScale : 0.f, ok1 ? sc1.z * kQScale : 0.f,
                           ok1 ? sc1.w * kQScale : 0.f};
      const int mi = lane / 8, ri = lane % 8;
      // Lane 8 mi + ri addresses row ri of matrix mi: head 8 (mi / 2) + ri, tokens 16 w + 8 (mi % 2).
      const int head = 8 * (mi / 2) + ri, tok = 16 * w + 8 * (mi % 2);
#pragma unroll
      for (int b = 0; b < 4; ++b) {
        auto pk = [&](int i) {
          const float* tt = ((i / 2) % 2) ? t1 : t0;
          return ElemTraits<Element>::pack2(pv[i] * tt[b], pv[i + 1] * tt[b]);
        };
        const uint32_t dst = smem_addr(ss.p[b]) + sw128_offset<N>(N == 16 ? head : ri, tok);
        if constexpr (N == 16) {
          stmatrix_x4_trans(dst, pk(0), pk(2), pk(4), pk(6));
        } else {
          stmatrix_x2_trans(dst, pk(0), pk(2));
        }
      }
    }
    fence_proxy_async_shared();
    cta_sync();

    // ---- O^T += V^T P'^T: M block 2 b + i2 (dv 128 b + 4 (8 w + rg) + 2 i2 + h) ----
#pragma unroll
    for (int mb = 0; mb < 8; ++mb) {
      const int b = mb / 2, i2 = mb % 2;
      FragA& f = a[mb % 2];
      if (mb >= 2) {
        warpgroup_wait<1>();
        warpgroup_fence_operand(f);
      }
      auto fa = recast<uint32_t>(f);
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {  // tokens 2q, 2q+1 (half 0) or 2q+8, 2q+9
          const uint32_t w0 = vw[b][4 * ks + 2 * half], w1 = vw[b][4 * ks + 2 * half + 1];
          // byte 2 i2 + h of both tokens (w0: the low lane, w1: the high one)
          if (i2 == 0) {
            fa(4 * ks + 2 * half + 0) = e4m3_pair<0, 4>(w0, w1);
            fa(4 * ks + 2 * half + 1) = e4m3_pair<1, 5>(w0, w1);
          } else {
            fa(4 * ks + 2 * half + 0) = e4m3_pair<2, 6>(w0, w1);
            fa(4 * ks + 2 * half + 1) = e4m3_pair<3, 7>(w0, w1);
          }
        }
      }
      Tensor sP = make_tensor(make_smem_ptr(ss.p[b] + opaque(0)), typename Cfg::SmemLayoutP{});
      Tensor tOrP = thr.partition_fragment_B(sP);  // (MMA, 1, 4)
      auto o = tOrO(_, mb, 0);
      warpgroup_fence_operand(f);
      warpgroup_fence_operand(o);
      warpgroup_arrive();
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) {
        mma.accumulate_ = fresh && ks == 0 ? GMMA::ScaleOut::Zero : GMMA::ScaleOut::One;
        gemm(mma, f(_, 0, ks), tOrP(_, 0, ks), o);
      }
      warpgroup_commit_batch();
    }
    warpgroup_wait<0>();
    warpgroup_fence_operand(tOrO);

    if (last) {
      // ---- the piece's end: l across the warps, lse, O / l into out or the split's partial ----
      float lt[kCols];
#pragma unroll
      for (int k = 0; k < kCols; ++k) {
        float v = st.l[k];
        v += __shfl_xor_sync(0xffffffffu, v, 4);
        v += __shfl_xor_sync(0xffffffffu, v, 8);
        v += __shfl_xor_sync(0xffffffffu, v, 16);
        lt[k] = v;
      }
      if (rg == 0) {
#pragma unroll
        for (int k = 0; k < kCols; ++k) ss.red_l[w][8 * (k / 2) + 2 * q + k % 2] = lt[k];
      }
      cta_sync();
      const decode::PieceDest dest = decode::piece_dest(p, tile.bi, tile.bi == walk.begin_b ? walk.begin_split : 0);
      const int head0 = blockIdx.z * Cfg::kHeadsPerCta;
      float fin[kCols];
#pragma unroll
      for (int k = 0; k < kCols; ++k) {
        const int c = 8 * (k / 2) + 2 * q + k % 2;
        const float l = ss.red_l[0][c] + ss.red_l[1][c] + ss.red_l[2][c] + ss.red_l[3][c];
        const float lse2 = l > 0.f ? st.m[k] + lg2_approx(l) : -kInf;
        float f = l > 0.f ? kOutScale * rcp_approx(l) : 0.f;
        const int head = head0 + c;
        if (head < p.h_q) {
          if (dest.single) f *= decode::sink_factor(p, head, lse2);
          if (w == 0 && rg == 0) {
            decode::store_piece_lse<true>(p, dest, tile.bi, 0, head, lse2);
            decode::store_max_logit(p, dest, tile.bi, 0, head, st.m[k]);
          }
        }
        fin[k] = f;
      }
#pragma unroll
      for (int k = 0; k < kCols; ++k) {
        const int c = 8 * (k / 2) + 2 * q + k % 2, head = head0 + c;
        if (head >= p.h_q) continue;
        const int i0 = 4 * (k / 2) + k % 2;  // row half 0; + 2: row half 1
#pragma unroll
        for (int b = 0; b < 4; ++b) {
          const int dv = 128 * b + 4 * (8 * w + rg);
          const float v0 = tOrO(i0, 2 * b, 0) * fin[k], v1 = tOrO(i0 + 2, 2 * b, 0) * fin[k];
          const float v2 = tOrO(i0, 2 * b + 1, 0) * fin[k], v3 = tOrO(i0 + 2, 2 * b + 1, 0) * fin[k];
          if (dest.single) {
            Element* out = reinterpret_cast<Element*>(p.out) + ((long long)tile.bi * p.h_q + head) * Cfg::DV + dv;
            *reinterpret_cast<uint2*>(out) =
                make_uint2(ElemTraits<Element>::pack2(v0, v1), ElemTraits<Element>::pack2(v2, v3));
          } else {
            float* acc_out = p.o_accum + ((long long)dest.slot * p.rows + head) * Cfg::DV + dv;
            *reinterpret_cast<float4*>(acc_out) = make_float4(v0, v1, v2, v3);
          }
        }
      }
    }
  }
}

}  // namespace narrow

template <typename Cfg>
__device__ __forceinline__ void narrow_decode_body(const DecodeParams& p, const void* cache) {
  using SS = typename Cfg::SharedStorage;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  SS& ss = aligned_shared_storage<SS>(smem_raw);
  const int tid = threadIdx.x, w = tid / 32, lane = tid % 32;
  if (tid == 0) {
    for (int s = 0; s < Cfg::SLOTS; ++s) mbarrier_init(&ss.landed[s], 4);  // a warp's arrival
    fence_barrier_init();
  }
  __syncthreads();
  pdl_wait_primary();  // (the metadata kernel's schedule)
  const narrow::Walk walk = narrow::cta_walk(p);
  if (walk.num_tiles > 0) narrow::prefetch_q<Cfg>(p, walk.begin_b, tid);  // (load_q reads it after the first gathers)
  uint64_t bits = 0;
  narrow::Tile tile = narrow::walk_tile(walk.origin, walk.tiles_per_row, 0);
  for (int m = 0; m < Cfg::SLOTS && m < walk.num_tiles; ++m, tile = narrow::next_tile(tile, p.topk)) {
    bits |= uint64_t(narrow::gather<Cfg>(p, cache, ss, m, w, lane, narrow::load_index(p, tile, w, lane))) << (16 * m);
  }
  narrow::copy_indices<Cfg>(p, ss, Cfg::SLOTS < walk.num_tiles, tile, w, lane, Cfg::SLOTS & 1);
  narrow::decode_loop<Cfg>(p, cache, ss, walk, tid, bits);
  pdl_launch_dependents();
}

}  // namespace sparse
}  // namespace mla_jit
