// mla_jit decode: dense paged MLA split-KV kernel for Ampere / Ada (sm_80, sm_86, sm_89).
//
// Drop-in sibling of splitkv.cuh (sm_90a): same DecodeParams, scheduler metadata, o_accum /
// lse_accum layouts and direct out/lse write for single-split batches, so the host code, the
// metadata kernel and the combine kernel are shared. Only sm_80 features: mma.sync m16n8k16
// (bf16/fp16 in, fp32 accumulate), ldmatrix (x4, .trans for V), cp.async (16 B, .cg, zero-fill)
// into XOR-swizzled shared memory, __syncthreads. No TMA, no wgmma, no mbarrier, no griddepcontrol.
//
// Grid (num_sm_parts, h_kv, ceil(rows / BLOCK_M)), block NUM_WARPS * 32 threads, 1 CTA / SM,
// dynamic smem Cfg::kSmemBytes. The K cache is read through a plain pointer:
// k_cache is (num_blocks, PAGE_SIZE, h_kv, HEAD_DIM) contiguous; V = its first HEAD_DIM_V columns.
//
// Work split inside the CTA (W = NUM_WARPS, WM = BLOCK_M / 16, WN = W / WM):
//   S = Q K^T : warp w owns rows [16 (w % WM), +16) x tokens [(w / WM) * BLOCK_N / WN, +BLOCK_N / WN)
//               of the tile, looping over HEAD_DIM in 32-wide steps (ldmatrix x4 for Q and K);
//               the row max is exchanged through smem (red_max), P goes to smem (QK sharding).
//   O += P V  : warp w owns all BLOCK_M rows x columns [w * HEAD_DIM_V / W, +HEAD_DIM_V / W) of O
//               in registers (V read once per CTA through ldmatrix.trans, P read from smem).
// Per KV tile n (stage n % NUM_STAGES), three CTA barriers:
//   wait tile n -> bar A -> cp.async tile n + NS - 1 into the stage freed by tile n - 1
//   -> S, mask, local row max -> bar B -> online softmax (exp2, scale folded into log2 domain),
//   P -> smem, row rescale -> smem -> bar C -> O = O * rescale + P V.
// Tokens >= the piece end (or >= L) are zero-filled by cp.async (src-size 0): the block table
// entry and the cache row behind them are never read, so NaN past L can not reach the output.
#pragma once

#include "common.cuh"

namespace mla_jit {
namespace decode {

// Largest dynamic shared memory one block may opt in to, per arch.
constexpr int kSmemLimitSm80 = 163 * 1024;
constexpr int kSmemLimitSm86 = 99 * 1024;
constexpr int kSmemLimitSm89 = 99 * 1024;

template <typename Element_, int HEAD_DIM_, int HEAD_DIM_V_, int PAGE_SIZE_, int BLOCK_M_, int BLOCK_N_,
          int NUM_STAGES_, int NUM_WARPS_, int SMEM_LIMIT_ = kSmemLimitSm80>
struct SplitKVSm80Config {
  using Element = Element_;
  static constexpr int HEAD_DIM = HEAD_DIM_;
  static constexpr int HEAD_DIM_V = HEAD_DIM_V_;
  static constexpr int PAGE_SIZE = PAGE_SIZE_;
  static constexpr int BLOCK_M = BLOCK_M_;
  static constexpr int BLOCK_N = BLOCK_N_;
  static constexpr int NUM_STAGES = NUM_STAGES_;
  static constexpr int NUM_WARPS = NUM_WARPS_;
  static constexpr int NUM_THREADS = NUM_WARPS * 32;
  static constexpr int SMEM_LIMIT = SMEM_LIMIT_;

  // S = Q K^T warp grid: WM row tiles of 16 x WN token groups of WARP_N.
  static constexpr int WM = BLOCK_M / 16;
  static constexpr int WN = NUM_WARPS / WM;
  static constexpr int WARP_N = BLOCK_N / WN;
  // O = P V: each warp owns WARP_DV output columns of all BLOCK_M rows.
  static constexpr int WARP_DV = HEAD_DIM_V / NUM_WARPS;
  static constexpr int kORegs = WM * (WARP_DV / 8) * 4;

  static_assert(cute::is_same_v<Element, cutlass::bfloat16_t> || cute::is_same_v<Element, cutlass::half_t>,
                "bf16 or fp16");
  static_assert(PAGE_SIZE >= 16 && PAGE_SIZE <= 256 && (PAGE_SIZE & (PAGE_SIZE - 1)) == 0, "page size");
  static_assert(BLOCK_M == 16 || BLOCK_M == 32 || BLOCK_M == 64, "BLOCK_M in {16, 32, 64}");
  static_assert(BLOCK_N % 16 == 0 && 64 % BLOCK_N == 0,
                "BLOCK_N in {16, 32, 64}: a multiple of the mma k and a divisor of the metadata block (64)");
  static_assert(NUM_STAGES >= 2, "cp.async pipeline needs >= 2 stages");
  static_assert(NUM_WARPS % WM == 0 && WN >= 1, "warps must cover the row tiles");
  static_assert(WARP_N % 8 == 0 && WARP_N >= 8, "each warp needs whole n8 tiles of S");
  static_assert(HEAD_DIM % 64 == 0 && HEAD_DIM_V % 64 == 0 && HEAD_DIM_V <= HEAD_DIM, "dims");
  static_assert(WARP_DV % 16 == 0 && WARP_DV * NUM_WARPS == HEAD_DIM_V, "ldmatrix.trans covers 16 columns");
  static_assert(kORegs <= 128, "O accumulator would not fit the register file (use more warps or a smaller BLOCK_M)");

  // 16-byte chunks.
  static constexpr int kRowChunks = HEAD_DIM / 8;          // per Q / KV row
  static constexpr int kPRowChunks = BLOCK_N / 8;          // per P row
  static constexpr int kTileChunks = BLOCK_N * kRowChunks;
  static constexpr int kChunksPerThread = (kTileChunks + NUM_THREADS - 1) / NUM_THREADS;
  static constexpr int kQChunks = BLOCK_M * kRowChunks;

  // Shared memory map (bytes; every piece 16-byte aligned).
  static constexpr int kQBytes = BLOCK_M * HEAD_DIM * 2;
  static constexpr int kStageBytes = BLOCK_N * HEAD_DIM * 2;
  static constexpr int kPBytes = BLOCK_M * BLOCK_N * 2;
  static constexpr int kOffQ = 0;
  static constexpr int kOffKV = kOffQ + kQBytes;
  static constexpr int kOffP = kOffKV + NUM_STAGES * kStageBytes;
  static constexpr int kOffRedMax = kOffP + kPBytes;            // float [WN][BLOCK_M]
  static constexpr int kOffRedSum = kOffRedMax + WN * BLOCK_M * 4;  // float [WN][BLOCK_M]
  static constexpr int kOffRowScale = kOffRedSum + WN * BLOCK_M * 4;  // float [BLOCK_M]
  static constexpr int kSmemBytes = kOffRowScale + BLOCK_M * 4;
  static_assert(kSmemBytes <= SMEM_LIMIT, "shared memory budget of the arch (reduce NUM_STAGES / BLOCK_N / BLOCK_M)");
};

// The two tunings (see scratch notes): A100-class (163 KB smem) and Ada / GA10x (99 KB smem).
struct SplitKVSm80Tuning {
  static constexpr int BLOCK_M = 64, BLOCK_N = 32, NUM_STAGES = 2, NUM_WARPS = 8, SMEM_LIMIT = kSmemLimitSm80;
};
struct SplitKVSm89Tuning {
  static constexpr int BLOCK_M = 32, BLOCK_N = 16, NUM_STAGES = 3, NUM_WARPS = 4, SMEM_LIMIT = kSmemLimitSm89;
};
template <typename Element, int HEAD_DIM, int HEAD_DIM_V, int PAGE_SIZE, typename T>
using SplitKVSm80ConfigFor = SplitKVSm80Config<Element, HEAD_DIM, HEAD_DIM_V, PAGE_SIZE, T::BLOCK_M, T::BLOCK_N,
                                               T::NUM_STAGES, T::NUM_WARPS, T::SMEM_LIMIT>;

namespace sm80 {

__device__ __forceinline__ unsigned smem_u32(const void* ptr) {
  return static_cast<unsigned>(__cvta_generic_to_shared(ptr));
}

// 16-byte async copy global -> shared; src_bytes = 0 writes 16 zero bytes and reads nothing.
__device__ __forceinline__ void cp_async_16(unsigned dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void ldsm_x4(unsigned (&r)[4], unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}
__device__ __forceinline__ void ldsm_x4_trans(unsigned (&r)[4], unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}

// D += A B, m16n8k16, A row-major (16 x 16), B "col" (n8 x k16 stored k-contiguous), f32 accumulate.
template <typename Element>
struct Mma;
template <>
struct Mma<cutlass::bfloat16_t> {
  __device__ __forceinline__ static void run(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};
template <>
struct Mma<cutlass::half_t> {
  __device__ __forceinline__ static void run(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

// Byte offset of 16-byte chunk `c` of row `row` in a tile of ROW_CHUNKS chunks per row, XOR-swizzled
// so that the 8 rows one ldmatrix phase reads at the same logical chunk hit 8 distinct 16-byte bank
// groups (and so do the 8 chunks one cp.async phase writes).
template <int ROW_CHUNKS>
__device__ __forceinline__ unsigned swz(int row, int c) {
  if constexpr (ROW_CHUNKS >= 8) {
    static_assert(ROW_CHUNKS % 8 == 0, "swizzle period");
    return unsigned(row * ROW_CHUNKS + (c ^ (row & 7))) * 16u;
  } else {
    constexpr int kRowsPerLine = 8 / ROW_CHUNKS;  // rows sharing one 128-byte line
    return unsigned(row * ROW_CHUNKS + (c ^ ((row / kRowsPerLine) % ROW_CHUNKS))) * 16u;
  }
}


}  // namespace sm80

template <typename Cfg>
__device__ __forceinline__ void mla_splitkv_sm80_body(const DecodeParams& p, const typename Cfg::Element* k_cache) {
  using Element = typename Cfg::Element;
  using sm80::swz;
  constexpr int BM = Cfg::BLOCK_M, BN = Cfg::BLOCK_N, D = Cfg::HEAD_DIM, DV = Cfg::HEAD_DIM_V;
  constexpr int NS = Cfg::NUM_STAGES, NT = Cfg::NUM_THREADS, PAGE = Cfg::PAGE_SIZE;
  constexpr int WM = Cfg::WM, WN = Cfg::WN, WARP_N = Cfg::WARP_N, WARP_DV = Cfg::WARP_DV;
  constexpr int RC = Cfg::kRowChunks, PRC = Cfg::kPRowChunks;
  constexpr int S_NT = WARP_N / 8;    // n8 tiles of S per warp
  constexpr int O_NT = WARP_DV / 8;   // n8 tiles of O per warp
  constexpr int MT = WM;              // m16 tiles of O (all rows)

  extern __shared__ __align__(128) unsigned char smem[];
  const unsigned s_base = sm80::smem_u32(smem);
  const unsigned sQ = s_base + Cfg::kOffQ;
  const unsigned sKV = s_base + Cfg::kOffKV;
  const unsigned sP = s_base + Cfg::kOffP;
  unsigned char* p_gen = smem + Cfg::kOffP;
  float* red_max = reinterpret_cast<float*>(smem + Cfg::kOffRedMax);
  float* red_sum = reinterpret_cast<float*>(smem + Cfg::kOffRedSum);
  float* row_scale = reinterpret_cast<float*>(smem + Cfg::kOffRowScale);

  const int tid = threadIdx.x;
  const int warp = tid / 32, lane = tid % 32;
  const int wm = warp % WM, wn = warp / WM;
  const int part = blockIdx.x, g = blockIdx.y, m_block = blockIdx.z;

  const int* meta = p.tile_scheduler_metadata + part * kMetaSize;
  const int* seqlens = p.cache_seqlens;
  const int begin_split_local = meta[kMetaBeginSplit];

  // ------------------------------------------------------------------ producer (all threads)
  // Thread tid copies chunks idx = i * NT + tid of a tile: token idx / RC, column chunk idx % RC.
  // The cache row of each chunk's token is fetched one tile ahead (kv_row, -1 = zero-fill) so the
  // block-table latency is off the issue path.
  detail::WorkCursor prod;
  prod.init(meta, seqlens);
  int kv_row[Cfg::kChunksPerThread];
  auto fetch_rows = [&]() {
    const int* bt = p.block_table + (long long)prod.bi * p.block_table_stride;
#pragma unroll
    for (int i = 0; i < Cfg::kChunksPerThread; ++i) {
      const int idx = i * NT + tid;
      const int t = prod.tok + idx / RC;
      kv_row[i] = (idx < Cfg::kTileChunks && t < prod.stop) ? __ldg(bt + t / PAGE) * PAGE + (t % PAGE) : -1;
    }
  };
  int prod_n = 0;
  auto issue_tile = [&]() {
    if (prod.valid()) {
      const unsigned dst = sKV + (prod_n % NS) * Cfg::kStageBytes;
#pragma unroll
      for (int i = 0; i < Cfg::kChunksPerThread; ++i) {
        const int idx = i * NT + tid;
        if (Cfg::kTileChunks % NT == 0 || idx < Cfg::kTileChunks) {
          const int r = idx / RC, c = idx % RC;
          const int kr = kv_row[i];
          const Element* src = kr >= 0 ? k_cache + (((long long)kr * p.h_kv + g) * D + c * 8) : k_cache;
          sm80::cp_async_16(dst + swz<RC>(r, c), src, kr >= 0 ? 16 : 0);
        }
      }
      prod.template advance<BN>(seqlens);
      if (prod.valid()) fetch_rows();
    }
    sm80::cp_async_commit();  // always: keeps the group count = tile count
    ++prod_n;
  };

  if (prod.valid()) fetch_rows();
#pragma unroll
  for (int s = 0; s < NS - 1; ++s) issue_tile();

  // ------------------------------------------------------------------ consumer state
  detail::WorkCursor cur;
  cur.init(meta, seqlens);

  float o[MT][O_NT][4];
  auto clear_o = [&]() {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < O_NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) o[mt][nt][e] = 0.f;
  };
  clear_o();

  // QK-layout rows of this thread: local rows q_row0 and q_row0 + 8.
  const int q_row0 = wm * 16 + lane / 4;
  const int s_col0 = wn * WARP_N + (lane % 4) * 2;  // first S column (tile-local token) of this thread
  float m_run[2] = {-kInf, -kInf};  // running max, log2 units (scaled)
  float l_part[2] = {0.f, 0.f};     // partial row sum over this thread's columns
  int lim[2] = {0, 0};              // first masked token of each row

  // ldmatrix lane addressing. Every lane reads rows whose (row & 7) is lane-constant (r7), so the
  // XOR swizzle of chunk c only touches c's low 3 bits: address = lane base + xor_off[c & 7]
  // + (c & ~7) * 16 + compile-time row offset. The few lane offsets are computed once here; the
  // unrolled loops then use register + immediate addressing (nothing else is hoisted/kept live).
  const int r7 = lane % 8;
  const int a_chk = lane / 16;
  // Q A fragment (x4: rows 0-15 of the warp's row tile, chunks c and c + 1).
  const unsigned q_base = sQ + unsigned(wm * 16 + (lane % 16)) * RC * 16;
  unsigned q_off[4];  // chunk low bits a_chk + 2u
#pragma unroll
  for (int u = 0; u < 4; ++u) q_off[u] = q_base + unsigned(((a_chk + 2 * u) ^ r7) * 16);
  // K B fragment (x4: 8 tokens x 4 consecutive chunks = k32).
  const int k_chk = lane / 8;
  const unsigned k_base = unsigned(wn * WARP_N + r7) * RC * 16;
  unsigned k_off[2];  // chunk low bits k_chk + 4u
#pragma unroll
  for (int u = 0; u < 2; ++u) k_off[u] = k_base + unsigned(((k_chk + 4 * u) ^ r7) * 16);
  // V B fragment (x4.trans: tokens 0-15 of a k16 step x 2 n8 tiles).
  static_assert(WARP_DV % 64 == 0, "a warp's V column slice starts on a swizzle period");
  const unsigned v_base = unsigned((lane % 8) + 8 * ((lane / 8) % 2)) * RC * 16 + unsigned(warp * WARP_DV / 8) * 16;
  unsigned v_off[4];  // chunk low bits a_chk + 2u
#pragma unroll
  for (int u = 0; u < 4; ++u) v_off[u] = v_base + unsigned(((a_chk + 2 * u) ^ r7) * 16);

  bool piece_start = true;
  int n = 0;
  while (cur.valid()) {
    if (piece_start) {
      // (Re)load Q of batch cur.bi. Safe: every warp finished reading the previous Q (S of the
      // previous tile) before barrier B of that tile. Visible to all after barrier A below.
      const Element* qb = reinterpret_cast<const Element*>(p.q) + (long long)cur.bi * p.q_stride_b;
#pragma unroll 6
      for (int it = 0; it < (Cfg::kQChunks + NT - 1) / NT; ++it) {
        const int idx = it * NT + tid;
        if (Cfg::kQChunks % NT == 0 || idx < Cfg::kQChunks) {
          const int lr = idx / RC, c = idx % RC;
          const int r = m_block * BM + lr;
          uint4 v = make_uint4(0u, 0u, 0u, 0u);  // padded rows are zero
          if (r < p.rows) {
            const int s = r / p.q_per_kv;
            const int head = g * p.q_per_kv + (r - s * p.q_per_kv);
            v = __ldg(reinterpret_cast<const uint4*>(qb + s * p.q_stride_s + head * p.q_stride_h + c * 8));
          }
          *reinterpret_cast<uint4*>(smem + Cfg::kOffQ + swz<RC>(lr, c)) = v;
        }
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        m_run[h] = -kInf;
        l_part[h] = 0.f;
        const int r = m_block * BM + q_row0 + 8 * h;
        // Causal, bottom-right aligned: query s sees keys < L - s_q + s + 1. Never past the piece.
        const int lc = p.causal ? cur.L - p.s_q + r / p.q_per_kv + 1 : cur.L;
        lim[h] = min(lc, cur.stop);
      }
      piece_start = false;
    }

    sm80::cp_async_wait<NS - 2>();  // this thread's copies of tile n landed
    __syncthreads();                // A: everyone's copies of tile n (and Q) are visible; stage n-1 free
    issue_tile();                   // tile n + NS - 1 -> stage (n - 1) % NS

    const unsigned sK = sKV + (n % NS) * Cfg::kStageBytes;
    const bool last = cur.tok + BN >= cur.stop;

    // ---------------- S = Q K^T (16 x WARP_N per warp) ----------------
    float s_acc[S_NT][4];
#pragma unroll
    for (int nt = 0; nt < S_NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) s_acc[nt][e] = 0.f;
#pragma unroll
    for (int k32 = 0; k32 < D / 32; ++k32) {
      // chunks k32 * 4 + {0..3}: high bits (k32 / 2) * 8, low bits 4 * (k32 % 2) + ...
      const unsigned kHi = unsigned(k32 / 2) * 128u;
      unsigned a0[4], a1[4];
      sm80::ldsm_x4(a0, q_off[2 * (k32 % 2)] + kHi);
      sm80::ldsm_x4(a1, q_off[2 * (k32 % 2) + 1] + kHi);
#pragma unroll
      for (int nt = 0; nt < S_NT; ++nt) {
        unsigned b[4];
        sm80::ldsm_x4(b, sK + k_off[k32 % 2] + kHi + unsigned(nt * 8 * RC * 16));
        sm80::Mma<Element>::run(s_acc[nt], a0, b[0], b[1]);
        sm80::Mma<Element>::run(s_acc[nt], a1, b[2], b[3]);
      }
    }

    // ---------------- mask (select: NaN never survives) + local row max ----------------
    if (cur.tok + BN > min(lim[0], lim[1])) {
#pragma unroll
      for (int nt = 0; nt < S_NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int t = cur.tok + s_col0 + nt * 8 + (e & 1);
          if (t >= lim[e >> 1]) s_acc[nt][e] = -kInf;
        }
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float mx = -kInf;
#pragma unroll
      for (int nt = 0; nt < S_NT; ++nt) mx = fmaxf(mx, fmaxf(s_acc[nt][2 * h], s_acc[nt][2 * h + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      if ((lane & 3) == 0) red_max[wn * BM + q_row0 + 8 * h] = mx;
    }
    __syncthreads();  // B: row maxima of all warps visible

    // ---------------- online softmax (log2 domain), P -> smem ----------------
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = q_row0 + 8 * h;
      float mx = red_max[row];
#pragma unroll
      for (int j = 1; j < WN; ++j) mx = fmaxf(mx, red_max[j * BM + row]);
      const float m_new = fmaxf(m_run[h], mx * p.scale_log2);
      const float m_use = m_new == -kInf ? 0.f : m_new;  // avoid (-inf) - (-inf)
      const float sc = exp2f(m_run[h] - m_use);
      m_run[h] = m_new;
      float sum = 0.f;
#pragma unroll
      for (int nt = 0; nt < S_NT; ++nt) {
        const float p0 = exp2f(fmaf(s_acc[nt][2 * h], p.scale_log2, -m_use));
        const float p1 = exp2f(fmaf(s_acc[nt][2 * h + 1], p.scale_log2, -m_use));
        sum += p0 + p1;
        const int col = s_col0 + nt * 8;
        *reinterpret_cast<unsigned*>(p_gen + swz<PRC>(row, col / 8) + (col % 8) * 2) =
            ElemTraits<Element>::pack2(p0, p1);
      }
      l_part[h] = l_part[h] * sc + sum;
      if (wn == 0 && (lane & 3) == 0) row_scale[row] = sc;
      if (last) {
        float l = l_part[h];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        if ((lane & 3) == 0) red_sum[wn * BM + row] = l;
      }
    }
    __syncthreads();  // C: P, row_scale (and red_sum) visible

    // ---------------- O = O * row_scale + P V (all rows x WARP_DV columns per warp) ----------------
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      const float sc0 = row_scale[mt * 16 + lane / 4];
      const float sc1 = row_scale[mt * 16 + lane / 4 + 8];
#pragma unroll
      for (int nt = 0; nt < O_NT; ++nt) {
        o[mt][nt][0] *= sc0;
        o[mt][nt][1] *= sc0;
        o[mt][nt][2] *= sc1;
        o[mt][nt][3] *= sc1;
      }
    }
#pragma unroll
    for (int kt = 0; kt < BN / 16; ++kt) {
      unsigned a[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) sm80::ldsm_x4(a[mt], sP + swz<PRC>(mt * 16 + (lane % 16), kt * 2 + a_chk));
#pragma unroll
      for (int np = 0; np < O_NT / 2; ++np) {
        unsigned b[4];
        // chunk warp * WARP_DV / 8 + 2 np + a_chk: low bits 2 (np % 4) + a_chk, high (np / 4) * 8
        sm80::ldsm_x4_trans(b, sK + v_off[np % 4] + unsigned((np / 4) * 128 + kt * 16 * RC * 16));
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          sm80::Mma<Element>::run(o[mt][2 * np], a[mt], b[0], b[1]);
          sm80::Mma<Element>::run(o[mt][2 * np + 1], a[mt], b[2], b[3]);
        }
      }
    }

    // ---------------- epilogue of a piece ----------------
    if (last) {
      const int ns0 = p.num_splits[cur.bi];
      const bool single = (p.num_splits[cur.bi + 1] - ns0) == 1;
      const int slot = ns0 + (cur.bi == cur.begin_b ? begin_split_local : 0);
      const int col_base = warp * WARP_DV + (lane % 4) * 2;
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int lr = mt * 16 + lane / 4 + 8 * h;
          const int r = m_block * BM + lr;
          if (r >= p.rows) continue;
          float l = red_sum[lr];
#pragma unroll
          for (int j = 1; j < WN; ++j) l += red_sum[j * BM + lr];
          const float inv_l = l > 0.f ? 1.f / l : 0.f;
          if (single) {
            const int s = r / p.q_per_kv;
            const int head = g * p.q_per_kv + (r - s * p.q_per_kv);
            Element* out =
                reinterpret_cast<Element*>(p.out) + ((long long)(cur.bi * p.s_q + s) * p.h_q + head) * DV + col_base;
#pragma unroll
            for (int nt = 0; nt < O_NT; ++nt)
              *reinterpret_cast<unsigned*>(out + nt * 8) =
                  ElemTraits<Element>::pack2(o[mt][nt][2 * h] * inv_l, o[mt][nt][2 * h + 1] * inv_l);
          } else {
            float* out = p.o_accum + (((long long)slot * p.h_kv + g) * p.rows + r) * DV + col_base;
#pragma unroll
            for (int nt = 0; nt < O_NT; ++nt)
              *reinterpret_cast<float2*>(out + nt * 8) =
                  make_float2(o[mt][nt][2 * h] * inv_l, o[mt][nt][2 * h + 1] * inv_l);
          }
        }
      }
      // LSE: one writer per row (QK layout, wn == 0, quad leader), which holds m_run of the row.
      if (wn == 0 && (lane & 3) == 0) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int lr = q_row0 + 8 * h;
          const int r = m_block * BM + lr;
          if (r < p.rows) {
            float l = red_sum[lr];
#pragma unroll
            for (int j = 1; j < WN; ++j) l += red_sum[j * BM + lr];
            const float lse2 = l > 0.f ? m_run[h] + log2f(l) : -kInf;
            if (single) {
              const int s = r / p.q_per_kv;
              const int head = g * p.q_per_kv + (r - s * p.q_per_kv);
              p.lse[((long long)cur.bi * p.h_q + head) * p.s_q + s] =
                  lse2 == -kInf ? kInf : lse2 * 0.69314718055994530942f;
            } else {
              p.lse_accum[((long long)slot * p.h_kv + g) * p.rows + r] = lse2;
            }
          }
        }
      }
      clear_o();
      piece_start = true;
    }
    ++n;
    cur.template advance<BN>(seqlens);
  }
  sm80::cp_async_wait<0>();
}

}  // namespace decode
}  // namespace mla_jit
