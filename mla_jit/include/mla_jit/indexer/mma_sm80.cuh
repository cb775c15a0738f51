// mla_jit indexer, mma.sync kernels (sm_80 / sm_86 / sm_89): the parameters, the shared-memory tiles,
// and a warp's score tile with its epilogue, shared by the ragged and the paged kernel.
//
// The CTA's columns (query tokens x heads, N = TG x NW) are split among TG token groups of NW
// columns (whole tokens: the head sum stays in a warp); the 64 keys of a tile among 64 / KW key
// groups of KW keys. Warp (key group, token group) computes S = K Q^T for its KW keys x NW columns
// with mma.sync (keys the M dimension, as the wgmma kernels: indexer/common.cuh's HeadSum is the
// epilogue), reading K from the tile's shared-memory stage with ldmatrix.
//   FP8_MMA (sm_89): m16n8k32 e4m3 x e4m3, Q fragments read from the unit's Q tile by ldmatrix.
//   otherwise (sm_80 / sm_86, no FP8 tensor cores): K fragments are converted e4m3 -> fp16 in
//   registers after ldmatrix, Q once per unit into a fp16 tile (both exact, scaled by 2^-8; the
//   epilogue takes 2^16 back with k_scale), then m16n8k16 f16. The conversion pairs bytes (0, 2)
//   and (1, 3) of each 4-byte group; the fp16 Q tile stores each 16-key group in that same order.
// Key rows are 16-byte chunks XOR-swizzled (common/sm80.cuh swz) so ldmatrix and cp.async phases
// hit distinct banks.
#pragma once

#include <cutlass/numeric_types.h>

#include "mla_jit/common/sm80.cuh"
#include "common.cuh"

namespace mla_jit {
namespace indexer {

// fp8_mqa_logits on the mma.sync kernels: the pointers the sm_90a kernel reads through TMA.
struct LogitsSm80Params {
  LogitsParams base;
  const unsigned char* q;    // (m * H, D) e4m3
  const unsigned char* k;    // (n, D) e4m3
  const float* k_scale;      // (n,), 16-byte aligned
  const float* weights;      // (m, H), rows w_stride floats apart
  long long w_stride;
};
static_assert(sizeof(LogitsSm80Params) == 104, "LogitsSm80Params layout");

struct PagedSm80Params {
  PagedParams base;
  const unsigned char* q;          // (b * next_n * H, D) e4m3
  const unsigned char* kv_cache;   // pages page_stride bytes apart: PAGE x D e4m3, then PAGE float32
  const float* weights;            // (b * next_n, H), rows w_stride floats apart
  long long w_stride;
  long long page_stride;
  int num_blocks;                  // pages in the cache: block ids outside [0, num_blocks) load zeros
  int pad_;
};
static_assert(sizeof(PagedSm80Params) == 120, "PagedSm80Params layout");

template <int H_, int D_, int NW_, int TG_, int KW_, int NUM_STAGES_, bool FP8_MMA_>
struct Sm80TileConfig {
  static constexpr int H = H_, D = D_, NW = NW_, TG = TG_, KW = KW_, NUM_STAGES = NUM_STAGES_;
  static constexpr bool FP8_MMA = FP8_MMA_;
  static constexpr int N = NW * TG;                    // the CTA's columns
  static constexpr int KG = kTileKeys / KW;            // key groups
  static constexpr int NUM_WARPS = KG * TG;
  static constexpr int NUM_THREADS = 32 * NUM_WARPS;
  static constexpr int NT = NW / 8;                    // n8 tiles of a warp
  static constexpr int MT = KW / 16;                   // m16 tiles of a warp
  static constexpr int KSTEPS = D / 32;                // 32-byte k steps (one ldmatrix.x4 of K each)
  static constexpr int K_CHUNKS = D / 16;              // 16-byte chunks of a key row
  static constexpr int Q_CHUNKS = FP8_MMA ? D / 16 : D / 8;   // of a Q row in shared memory
  static_assert(H == 8 || H == 16 || H == 32 || H == 64, "heads: 8, 16, 32 or 64");
  static_assert(D == 64 || D == 128, "head dim: 64 or 128");
  static_assert(NW % H == 0 && NW % 8 == 0 && NW <= 64, "a warp's columns: whole tokens, at most 64");
  static_assert(KW == 16 || KW == 32, "keys of a warp: 16 or 32");
  using Sum = HeadSum<NW, H>;
  // Two accumulators when they fit the registers (up to 32 values each: KW 16 with 64 columns).
  static constexpr bool kPipelined = MT * NT * 4 <= 32;

  struct SharedStorage {
    alignas(128) unsigned char k[NUM_STAGES][kTileKeys * D];
    alignas(16) float scale[NUM_STAGES][kTileKeys];
    alignas(128) unsigned char q[N * Q_CHUNKS * 16];
  };
  static constexpr int kSmemBytes = int(sizeof(SharedStorage));
};

// A warp's accumulators: two when kPipelined (tile i + 1's MMAs issue before tile i's epilogue, so
// the tensor cores and the CUDA cores overlap within the warp; run_tiles).
template <int B>
struct AccBuf {
  static constexpr int value = B;
};

template <typename Cfg>
struct WarpTile {
  static constexpr int NT = Cfg::NT, MT = Cfg::MT, KSTEPS = Cfg::KSTEPS;
  float acc[Cfg::kPipelined ? 2 : 1][MT][NT][4];
  // k_scale of the lane's rows, read with the tile (its stage is refilled before the epilogue).
  float scale[Cfg::kPipelined ? 2 : 1][MT][2];
  int key_row, col;        // the warp's first key row in the tile, first column of the CTA's Q tile

  __device__ __forceinline__ void init(int warp) {
    key_row = (warp % Cfg::KG) * Cfg::KW;
    col = (warp / Cfg::KG) * Cfg::NW;
  }

  // acc[B] = S of the warp's keys of the tile in k_tile and its columns; scale[B] its rows' k_scale
  // (times 2^16 on the fp16 path: its operands' 2^-8 each).
  template <int B>
  __device__ __forceinline__ void score(const unsigned char* k_tile, const float* k_scale,
                                        const unsigned char* q_tile, int lane) {
    constexpr float kUnscale = Cfg::FP8_MMA ? 1.f : 65536.f;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      const int row = key_row + mt * 16 + lane / 4;
      scale[B][mt][0] = k_scale[row] * kUnscale;
      scale[B][mt][1] = k_scale[row + 8] * kUnscale;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[B][mt][nt][e] = 0.f;
    }
    const unsigned k_base = sm80::smem_u32(k_tile), q_base = sm80::smem_u32(q_tile);
    const int a_row = key_row + lane % 8 + 8 * ((lane / 8) % 2);
#pragma unroll
    for (int ks = 0; ks < KSTEPS; ks += 2) {
      unsigned b[Cfg::FP8_MMA ? NT : 1][4];   // FP8_MMA: n tile nt's b0, b1 of k step ks, then ks + 1
      if constexpr (Cfg::FP8_MMA) {
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
          sm80::ldsm_x4(b[nt], q_base + sm80::swz<Cfg::Q_CHUNKS>(col + nt * 8 + lane % 8, 2 * ks + lane / 8));
      }
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        unsigned a[MT][4];   // rows 0-7 / 8-15 of bytes 32 k .. +15, then of +16 .. +31
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
          sm80::ldsm_x4(a[mt], k_base + sm80::swz<Cfg::K_CHUNKS>(a_row + mt * 16, 2 * (ks + half) + lane / 16));
        if constexpr (Cfg::FP8_MMA) {
#pragma unroll
          for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
              sm80::mma_e4m3(acc[B][mt][nt], a[mt], b[nt][2 * half], b[nt][2 * half + 1]);
        } else {
          score_f16<B>(a, q_tile, ks + half, lane);
        }
      }
    }
  }

  // One 32-byte k step on fp16 operands: two m16n8k16 steps (bytes 0-15, then 16-31).
  template <int B>
  __device__ __forceinline__ void score_f16(const unsigned (&a)[MT][4], const unsigned char* q_tile, int ks,
                                            int lane) {
    unsigned b[NT][4];   // n tile nt: b0, b1 of step 0, then of step 1
    const unsigned q_base = sm80::smem_u32(q_tile);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
      sm80::ldsm_x4(b[nt], q_base + sm80::swz<Cfg::Q_CHUNKS>(col + nt * 8 + lane % 8, 4 * ks + lane / 8));
#pragma unroll
    for (int step = 0; step < 2; ++step) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        unsigned f[4];   // rows g / g + 8, the step's bytes (0, 2) of each group, then (1, 3)
        sm80::e4m3x4_to_f16x4_scaled(a[mt][2 * step], f[0], f[2]);
        sm80::e4m3x4_to_f16x4_scaled(a[mt][2 * step + 1], f[1], f[3]);
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
          sm80::Mma<cutlass::half_t>::run(acc[B][mt][nt], f, b[nt][2 * step], b[nt][2 * step + 1]);
      }
    }
  }

  struct AccView {   // HeadSum's accessor: element i of an m tile
    const float (&a)[NT][4];
    __device__ __forceinline__ float operator()(int i) const { return a[i / 4][i % 4]; }
  };

  // The head sums of m tile mt of acc[B]: HeadSum's out values.
  template <int B>
  __device__ __forceinline__ void head_sum(int mt, const float (&w)[Cfg::Sum::kWeights],
                                           float (&out)[Cfg::Sum::kOut], int lane) const {
    Cfg::Sum::run(AccView{acc[B][mt]}, w, scale[B][mt], out, lane);
  }

  // Key row (in the tile) of the lane's out values of m tile mt.
  __device__ __forceinline__ int out_row(int mt, int lane) const {
    return key_row + mt * 16 + lane / 4 + 8 * Cfg::Sum::out_half(lane);
  }
  // Column group (token of the CTA's tile) of out value m.
  __device__ __forceinline__ int out_token(int m, int lane) const {
    return col / Cfg::H + Cfg::Sum::out_token(m, lane);
  }
};

// The n tiles of a unit (or batch entry) through the NUM_STAGES ring, after its Q group and the
// first NUM_STAGES - 1 tile groups were committed (load(j, stage) issues tile j's copies). Tile
// i + 1's MMAs are issued before tile i's epilogue (finish(i, AccBuf<i % 2>)). One group is
// committed a tile, so cp_async_wait<NS - 2> always means "the next tile landed".
template <typename Cfg, typename Load, typename Finish>
__device__ __forceinline__ void run_tiles(typename Cfg::SharedStorage& ss, WarpTile<Cfg>& tile, int n, Load&& load,
                                          Finish&& finish, int lane) {
  constexpr int NS = Cfg::NUM_STAGES;
  // Tile i landed for all, and every warp is done reading tile i - 1 (its stage is refilled here).
  auto advance = [&](int i) {
    sm80::cp_async_wait<NS - 2>();
    __syncthreads();
    if (i + NS - 1 < n) load(i + NS - 1, (i + NS - 1) % NS);
    sm80::cp_async_commit();
  };
  auto score = [&](int i, auto buf) {
    tile.template score<decltype(buf)::value>(ss.k[i % NS], ss.scale[i % NS], ss.q, lane);
  };
  if (n <= 0) return;
  if constexpr (!Cfg::kPipelined) {
#pragma unroll 1
    for (int i = 0; i < n; ++i) {
      advance(i);
      score(i, AccBuf<0>{});
      finish(i, AccBuf<0>{});
    }
    return;
  }
  advance(0);
  score(0, AccBuf<0>{});
  int i = 0;
#pragma unroll 1
  for (; i + 2 < n; i += 2) {
    advance(i + 1);
    score(i + 1, AccBuf<1>{});
    finish(i, AccBuf<0>{});
    advance(i + 2);
    score(i + 2, AccBuf<0>{});
    finish(i + 1, AccBuf<1>{});
  }
  if (i + 1 < n) {
    advance(i + 1);
    score(i + 1, AccBuf<1>{});
    finish(i, AccBuf<0>{});
    finish(i + 1, AccBuf<1>{});
  } else {
    finish(i, AccBuf<0>{});
  }
}

// Q rows [0, rows) of the CTA's tile from global (row r at src + r * D bytes; rows past `valid` are
// zeros) into the Q tile: FP8_MMA by cp.async (the caller commits), else converted to fp16 here.
template <typename Cfg>
__device__ __forceinline__ void load_q_tile(unsigned char* q_tile, const unsigned char* src, int valid, int tid) {
  constexpr int kChunks = Cfg::N * Cfg::K_CHUNKS;
#pragma unroll
  for (int j = 0; j < (kChunks + Cfg::NUM_THREADS - 1) / Cfg::NUM_THREADS; ++j) {
    const int i = tid + j * Cfg::NUM_THREADS;
    if (kChunks % Cfg::NUM_THREADS != 0 && i >= kChunks) break;
    const int r = i / Cfg::K_CHUNKS, c = i % Cfg::K_CHUNKS;
    const bool ok = r < valid;
    if constexpr (Cfg::FP8_MMA) {
      sm80::cp_async_16(sm80::smem_u32(q_tile) + sm80::swz<Cfg::Q_CHUNKS>(r, c),
                        ok ? src + (long long)r * Cfg::D + c * 16 : src, ok ? 16 : 0);
    } else {
      uint4 v = make_uint4(0, 0, 0, 0);
      if (ok) v = __ldg(reinterpret_cast<const uint4*>(src + (long long)r * Cfg::D + c * 16));
      uint4 lo, hi;   // fp16 chunks 2c (bytes (0, 2) of each group) and 2c + 1 (bytes (1, 3))
      sm80::e4m3x4_to_f16x4_scaled(v.x, lo.x, hi.x);
      sm80::e4m3x4_to_f16x4_scaled(v.y, lo.y, hi.y);
      sm80::e4m3x4_to_f16x4_scaled(v.z, lo.z, hi.z);
      sm80::e4m3x4_to_f16x4_scaled(v.w, lo.w, hi.w);
      *reinterpret_cast<uint4*>(q_tile + sm80::swz<Cfg::Q_CHUNKS>(r, 2 * c)) = lo;
      *reinterpret_cast<uint4*>(q_tile + sm80::swz<Cfg::Q_CHUNKS>(r, 2 * c + 1)) = hi;
    }
  }
}

// The head weights of the warp's columns for the CTA's tokens: token t of the tile is global row
// row0 + t (rows >= rows_valid: 0).
template <typename Cfg, typename Tile>
__device__ __forceinline__ void load_weights(float (&w)[Cfg::Sum::kWeights], const Tile& tile, const float* weights,
                                             long long w_stride, int row0, int rows_valid, int lane) {
#pragma unroll
  for (int i = 0; i < Cfg::Sum::kWeights; ++i) {
    const int c = tile.col + Cfg::Sum::weight_column(i, lane);
    const int t = c / Cfg::H;
    w[i] = row0 + t < rows_valid ? __ldg(weights + (row0 + t) * w_stride + c % Cfg::H) : 0.f;
  }
}

}  // namespace indexer
}  // namespace mla_jit
