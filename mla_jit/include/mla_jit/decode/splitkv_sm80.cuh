// mla_jit decode: dense paged MLA split-KV kernel for Ampere / Ada (sm_80, sm_86, sm_89).
//
// Drop-in sibling of the sm_90a kernel (splitkv_ws.cuh, unfused): same DecodeParams, scheduler
// metadata, o_accum / lse_accum layouts and direct out/lse write for single-split batches, so the
// host code, the metadata kernel and the combine kernel are shared. Only sm_80 features: mma.sync m16n8k16
// (bf16/fp16 in, fp32 accumulate), ldmatrix (x4, .trans for V), cp.async (16 B, .cg, zero-fill)
// into XOR-swizzled shared memory, __syncthreads and named barriers (bar.sync id, count).
// No TMA, no wgmma, no mbarrier, no griddepcontrol.
//
// Grid (num_sm_parts, h_kv, ceil(rows / BLOCK_M)), block NUM_WARPS * 32 threads, dynamic smem
// Cfg::kSmemBytes; __launch_bounds__(NUM_THREADS, Cfg::kMinBlocksPerSm) keeps the registers of
// kMinBlocksPerSm CTAs within one SM (configs/decode_sm80.py ctas_per_sm_for mirrors this and the
// shared memory map below). The K cache is read through a plain pointer:
// k_cache is (num_blocks, PAGE_SIZE, h_kv, HEAD_DIM) contiguous; V = its first HEAD_DIM_V columns.
//
// Loads (both variants): thread t copies token t / TPT of the tile (TPT = NUM_THREADS / BLOCK_N
// threads per token), 16-byte chunks (t % TPT) + TPT * i; it looks up that one token's cache row
// in the block table one tile ahead. Tokens >= the piece end (or >= L) are zero-filled by cp.async
// (src-size 0): the block table entry and the cache row behind them are never read, so NaN past L
// can not reach the output. Q, KV stages and P are XOR-swizzled (16-byte chunk ^= row & 7).
//
// Two variants, picked by BLOCK_M:
//
// BLOCK_M == 16, "Q in registers" (4 warps). Warp w holds, as mma A fragments in registers, Q's
// k16 steps {4 j + w}: the QK GEMM is split over HEAD_DIM, each warp computes a partial S of all
// 16 rows x BLOCK_N tokens over its quarter of d, reading K once per CTA. Partials go to smem
// (xS); after one barrier every warp sums the four partials in the same order (so all warps hold
// bit-identical S), masks, runs the online softmax (exp2, scale folded into the log2 domain) and
// turns P into A fragments in registers; O (16 rows x HEAD_DIM_V / 4 columns per warp) += P V
// with V through ldmatrix.trans. Per KV tile n (stage n % NUM_STAGES), two CTA barriers:
//   wait tile n -> bar A -> cp.async tile n + NS - 1 into the stage freed by tile n - 1
//   -> partial S -> xS -> bar X -> S, mask, softmax, P (registers), O = O * rescale + P V.
//
// BLOCK_M in {32, 64}, "Q in shared memory" (W = NUM_WARPS, WM = BLOCK_M / 16, WN = W / WM).
//   S = Q K^T : d is split over KD = kQKSplit warps (ldmatrix x4 for Q and K), then the partial S
//               are exchanged through smem (xS) under a named barrier of those KD warps, so that
//               warp w owns rows [16 wm, +16) x tokens [wn * WARP_N, +WARP_N) of S in full:
//     pairs (KD 2; w = (rg, wn, kd), kd = w % 2): rows [32 rg, +32) x the tokens of group wn over
//               chunks 8 j + 4 kd + {0..3}; the pair swaps the row tiles it does not keep,
//               wm = 2 rg + kd.
//     quads (KD 4, 16-token tiles and 64 x 32 tiles of 8 warps; w = (rg, kd), kd = w % 4): rows
//               [32 rg, +32) x all tokens over chunks 8 j + 2 kd + {0, 1}; reduce-scatter of the 4
//               blocks (row tile, token half): block b = kd is warp kd's, wm = 2 rg + (kd & 1),
//               wn = kd >> 1. In one round (16-token tiles: each warp publishes its 3 other blocks)
//               or, at 32-token tiles, in two (with warp kd ^ 2 the other token half's 2 blocks,
//               then with warp kd ^ 1 the other row tile; 3 group barriers, a 2-block buffer).
//               The row max is exchanged through smem (red_max), P goes to smem.
//   O += P V  : warp w owns all BLOCK_M rows x columns [w * HEAD_DIM_V / W, +HEAD_DIM_V / W) of O
//               in registers (V read once per CTA through ldmatrix.trans, P read from smem).
// Per KV tile n (stage n % NUM_STAGES), three CTA barriers and one group barrier (three for
// two-round quads):
//   wait tile n -> bar A -> cp.async tile n + NS - 1 into the stage freed by tile n - 1
//   -> partial S -> xS -> group barrier(s) -> S, mask, local row max -> bar B -> online softmax,
//   P -> smem, row rescale -> smem -> bar C -> O = O * rescale + P V.
// xS and P share one smem region: xS lives from bar A to bar B, P from bar B to the next bar A.
//
// Sparse (SPARSE_KV != 0, both variants): the batch is single-token rows (a decode's b * s_q, a
// prefill's s_q tokens), each walking its topk indices (block_table) in tiles; a byte per token and
// stage (valid flags, written by the token's producer thread) masks S instead of the length limits.
// FP8 records land in per-stage landing slots and are de-quantized into their K stage one tile ahead
// of their use (>= 3 stages; tile n + 1's copies are waited for before barrier A of tile n). The
// Q-in-smem epilogue reads each row's final max from smem (row_max) for the sink and max_logits.
//
// An e4m3 cache (KV_FP8, dense decode, both variants): tile n's bytes land in landing slot n % NS
// (the producer issues tile n + NS at tile n, NS tiles ahead instead of NS - 1), and after barrier
// A of tile n every thread converts its own chunks of tile n + 1 (waited for before that barrier)
// exactly into K stage (n + 1) % 2 of Element, which tile n - 1 left: tile n + 1 is read after the
// next barrier A. With one K stage (FP8_K_STAGES 1: 32-token tiles where two stages do not fit),
// tile n itself is converted after barrier A and a second barrier (A') publishes it before S; the
// loads then run NS tiles ahead. S's scale takes descale_q * descale_k and O descale_k (read on the
// GPU). An e4m3 q is converted as it is loaded (Element fp16: exact).
//
// The O rescale (O *= exp2(m_old - m_new)) is skipped when every factor a warp would apply is
// exactly 1 (the running max did not move): x * 1.0f == x, so the result is bit-identical.
#pragma once

#include "common.cuh"
#include "records.cuh"
#include "mla_jit/common/e4m3.cuh"
#include "mla_jit/common/sm80.cuh"

namespace mla_jit {
namespace decode {

// SMEM_LIMIT: the largest dynamic shared memory one block of the tuning arch may opt in to
// (sm_80 163 KB, sm_86 / sm_89 99 KB; configs/decode_sm80.py picks the tiles to fit it).
// SPARSE_KV: 0 the dense paged decode; else the sparse (DSA) attention over gathered tokens, whose
// rows are 1: FlashMLA's 656-byte FP8 records (paged; see "Sparse decode" below), 2: bf16 rows of
// HEAD_DIM values (flash_mla_sparse_fwd's kv (s_kv, 1, d_qk); kv_block_stride = the row stride).
enum SparseKV : int { kDenseKV = 0, kSparseFp8Records = 1, kSparseBf16Rows = 2 };
// KV_FP8 (dense decode): 0 the cache holds Element; else it holds e4m3 with a per-tensor descale,
// converted exactly to Element on chip (common/e4m3.cuh; 1: bit arithmetic, 2: the sm_89+ cvt, fp16
// only). Element is then the type the MMAs take; QElement is q's (Element, or e4m3 converted as it is
// loaded) and OutElement out's (bf16 for an e4m3 q, which multiplies in fp16: e4m3 is exact there).
enum KvFp8 : int { kKvElement = 0, kKvE4m3Bits = 1, kKvE4m3Cvt = 2 };
template <typename Element_, int HEAD_DIM_, int HEAD_DIM_V_, int PAGE_SIZE_, int BLOCK_M_, int BLOCK_N_,
          int NUM_STAGES_, int NUM_WARPS_, int SMEM_LIMIT_, int SPARSE_KV_ = kDenseKV, int KV_FP8_ = kKvElement,
          typename QElement_ = Element_, typename OutElement_ = Element_, int FP8_K_STAGES_ = 2,
          typename RECORD_ = V32Record>
struct SplitKVSm80Config {
  using Element = Element_;
  using QElement = QElement_;
  using OutElement = OutElement_;
  static constexpr int HEAD_DIM = HEAD_DIM_;
  static constexpr int HEAD_DIM_V = HEAD_DIM_V_;
  static constexpr int PAGE_SIZE = PAGE_SIZE_;
  static constexpr int BLOCK_M = BLOCK_M_;
  static constexpr int BLOCK_N = BLOCK_N_;
  static constexpr int NUM_STAGES = NUM_STAGES_;
  static constexpr int NUM_WARPS = NUM_WARPS_;
  static constexpr int NUM_THREADS = NUM_WARPS * 32;
  static constexpr int SMEM_LIMIT = SMEM_LIMIT_;
  // Sparse: gathered tokens, masked by per-token valid flags; FP8 records also de-quantized.
  static constexpr bool kSparse = SPARSE_KV_ != kDenseKV;
  static constexpr bool kSparseFp8 = SPARSE_KV_ == kSparseFp8Records;
  // An e4m3 cache (dense): NUM_STAGES e4m3 landing slots and FP8_K_STAGES Element K stages; with 2,
  // each tile is converted a tile ahead of its use (the loads run NUM_STAGES - 2 tiles ahead of
  // that); with 1 (32-token tiles where 2 do not fit), at its turn behind a second barrier.
  static constexpr bool kKvFp8 = KV_FP8_ != kKvElement;
  static constexpr bool kHwCvt = KV_FP8_ == kKvE4m3Cvt;
  static constexpr bool kQFp8 = cute::is_same_v<QElement, cutlass::float_e4m3_t>;
  using CacheT = cute::conditional_t<kKvFp8, unsigned char, Element>;
  static constexpr int kKStages = kKvFp8 ? FP8_K_STAGES_ : NUM_STAGES;
  static_assert(FP8_K_STAGES_ == 2 || (kKvFp8 && FP8_K_STAGES_ == 1), "FP8_K_STAGES: 2, or 1 over an e4m3 cache");
  // cp.async groups a thread may leave pending at barrier A of tile n: the tile it needs then (n, or
  // n + 1 where tiles are converted a tile ahead) must have landed. The producer has issued NS - 1
  // tiles past tile n by then (an e4m3 cache: NS).
  static constexpr int kPendingAtA = kSparseFp8 ? NUM_STAGES - 3 : (kKvFp8 && kKStages == 1) ? NUM_STAGES - 1
                                                                                             : NUM_STAGES - 2;

  // Variant: Q in registers (16-row tiles, one per 4 warps: QK split over d across a tile's 4
  // warps) or in smem. Q in registers with 2 head groups (32 rows, 8 warps): the sparse decode over
  // FP8 records, whose de-quantized K stage then feeds 32 heads instead of 16.
  static constexpr bool kQInRegs = BLOCK_M == 4 * NUM_WARPS;
  static constexpr int kHeadGroups = kQInRegs ? BLOCK_M / 16 : 1;
  static constexpr int kQWarps = kQInRegs ? 4 : NUM_WARPS;  // warps sharing one row tile's QK and O
  static constexpr int WM = BLOCK_M / 16;
  // Q in smem: S is owned by WM row tiles x WN token groups of WARP_N (after the pair exchange).
  // Q in registers: every warp holds all of S (WN = 1).
  static constexpr int WN = kQInRegs ? 1 : NUM_WARPS / WM;
  static constexpr int WARP_N = BLOCK_N / WN;
  static constexpr int S_NT = WARP_N / 8;  // n8 tiles of S per warp
  // O = P V: each warp owns WARP_DV output columns of all BLOCK_M rows.
  static constexpr int WARP_DV = HEAD_DIM_V / kQWarps;
  static constexpr int kORegs = (kQInRegs ? 1 : WM) * (WARP_DV / 8) * 4;
  // Q in registers: k16 steps of d per warp (warp w of a head group takes steps 4 j + w).
  static constexpr int kQKSteps = HEAD_DIM / 16 / kQWarps;
  // Q in smem: QK splits d over kQKSplit warps (2: pairs, 32 rows x WARP_N tokens each; 4: quads,
  // 32 rows x the whole tile each). Quads read Q once per tile instead of once per token group
  // (pairs: WN times): used for 16-token tiles and for 64 x 32 tiles with 8 warps (the sm_80
  // tuning's h_q = 64 kernel: 2.18 instead of 2.47 smem wavefronts per mma).
  static constexpr int kQKSplit =
      (!kQInRegs && NUM_WARPS == 2 * WM && (BLOCK_N == 16 || (BLOCK_N == 32 && WM == 4))) ? 4 : 2;
  // Quads reduce-scatter the 4 blocks of their partial S in one round (each warp publishes the 3
  // blocks it does not own) or, where that buffer does not fit (32-token tiles at 163 KB), in two
  // rounds of 2 and 1 blocks through a 2-block buffer.
  static constexpr int kXRounds = (kQKSplit == 4 && BLOCK_N == 32) ? 2 : 1;
  static constexpr int kXSlots = kQKSplit == 4 ? (kXRounds == 1 ? 3 : 2) : 1;  // blocks a warp publishes at once

  static_assert(cute::is_same_v<Element, cutlass::bfloat16_t> || cute::is_same_v<Element, cutlass::half_t>,
                "bf16 or fp16");
  static_assert(PAGE_SIZE >= 16 && PAGE_SIZE <= 256 && (PAGE_SIZE & (PAGE_SIZE - 1)) == 0, "page size");
  static_assert(BLOCK_M == 16 || BLOCK_M == 32 || BLOCK_M == 64, "BLOCK_M in {16, 32, 64}");
  static_assert(BLOCK_N % 16 == 0 && 64 % BLOCK_N == 0,
                "BLOCK_N in {16, 32, 64}: a multiple of the mma k and a divisor of the metadata block (64)");
  static_assert(NUM_STAGES >= 2, "cp.async pipeline needs >= 2 stages");
  static_assert(HEAD_DIM % 64 == 0 && HEAD_DIM_V % 64 == 0 && HEAD_DIM_V <= HEAD_DIM, "dims");
  static_assert(WARP_DV % 64 == 0 && WARP_DV * kQWarps == HEAD_DIM_V,
                "a warp's V column slice is whole swizzle periods (8 chunks)");
  static_assert(!kQInRegs || (HEAD_DIM % 64 == 0 && (kHeadGroups == 1 || (kHeadGroups == 2 && SPARSE_KV_ == 1))),
                "Q in registers: 4 warps a 16-row tile, warp w owns chunks 8 j + 2 w + {0, 1} of d; 2 tiles only "
                "for FP8 records");
  static_assert(kQInRegs || (WM % 2 == 0 && NUM_WARPS % WM == 0 && WARP_N % 8 == 0 && WARP_N >= 8),
                "Q in smem: warp pairs cover 32-row groups x whole n8 tiles of S");
  static_assert(kQKSplit == 2 || NUM_WARPS == 2 * WM, "quads: one group of 4 warps per 32 rows, all tokens");
  static_assert(kORegs <= 128, "O accumulator would not fit the register file (use more warps or a smaller BLOCK_M)");
  static_assert(SPARSE_KV_ >= kDenseKV && SPARSE_KV_ <= kSparseBf16Rows, "SPARSE_KV in {0, 1, 2}");
  static_assert(!kSparseFp8 || (HEAD_DIM == 576 && HEAD_DIM_V == 512 && cute::is_same_v<Element, cutlass::bfloat16_t> &&
                                NUM_STAGES >= 3),
                "sparse FP8 records: d 576 / dv 512, bf16, >= 3 stages (tiles are de-quantized one ahead)");
  static_assert(!kSparse || kSparseFp8 || ((HEAD_DIM == 576 || HEAD_DIM == 512) && HEAD_DIM_V == 512 &&
                                           cute::is_same_v<Element, cutlass::bfloat16_t>),
                "sparse bf16 rows: d 576 or 512 / dv 512, bf16");
  static_assert(KV_FP8_ >= kKvElement && KV_FP8_ <= kKvE4m3Cvt && (!kKvFp8 || (!kSparse && NUM_STAGES >= 2)),
                "KV_FP8 in {0, 1, 2}: the dense decode, >= 2 landing slots");
  static_assert(!kHwCvt || cute::is_same_v<Element, cutlass::half_t>, "the e4m3x2 cvt produces fp16");
  static_assert(cute::is_same_v<QElement, Element> || (kQFp8 && kKvFp8), "q: Element, or e4m3 over an e4m3 cache");
  static_assert(cute::is_same_v<OutElement, Element> ||
                    (kQFp8 && cute::is_same_v<OutElement, cutlass::bfloat16_t>), "out: Element, or bf16 for e4m3 q");

  // 16-byte chunks.
  static constexpr int kRowChunks = HEAD_DIM / 8;          // per Q / KV row
  static constexpr int kPRowChunks = BLOCK_N / 8;          // per P row
  static constexpr int kQChunks = BLOCK_M * kRowChunks;
  // KV loads: kThreadsPerToken threads per token, kChunksPerThread chunks each.
  static constexpr int kThreadsPerToken = NUM_THREADS / BLOCK_N;
  static constexpr int kChunksPerThread = kRowChunks / kThreadsPerToken;
  // (FP8 records: the record's 41 chunks go round the token's threads, a bound check per chunk.)
  static_assert(NUM_THREADS % BLOCK_N == 0 && (kSparseFp8 || kKvFp8 || kRowChunks % kThreadsPerToken == 0) &&
                    (kThreadsPerToken % 8 == 0 || 8 % kThreadsPerToken == 0),
                "every thread copies whole chunks of one token");
  // e4m3 cache: a token's HEAD_DIM bytes land in its landing slot row as 16-byte chunks q + TPT i
  // (a bound check where TPT does not divide them). Conversion: kCvtThreads threads a token (at
  // least 8: a quarter warp writes one row's 128-byte period), kCvtTokens tokens a pass.
  static constexpr int kCvtThreads = kThreadsPerToken > 8 ? kThreadsPerToken : 8;
  static constexpr int kCvtTokens = NUM_THREADS / kCvtThreads;
  static_assert(!kKvFp8 || (kCvtThreads % 8 == 0 && BLOCK_N % kCvtTokens == 0), "e4m3 conversion passes");

  // Sparse decode over FP8 records (records.cuh; V3.2: 512 e4m3 values, 4 float32 scales, one per
  // 128 values, and 64 bf16 rope values). The values and scales land in a landing slot (one per
  // stage), the rope straight in its K stage row; a byte per token says whether its index was valid.
  // (An e4m3 cache's landing row: the token's HEAD_DIM values.)
  using Record = RECORD_;
  static_assert(!kSparseFp8 || (Record::kNopeValues == HEAD_DIM_V && Record::kRopeValues == HEAD_DIM - HEAD_DIM_V &&
                                Record::kValuesPerScale % 16 == 0),
                "FP8 records: the nope values are V, the rope the rest of K; a scale covers whole 16-byte chunks");
  static constexpr int kRecordBytes = Record::kBytes, kNopeBytes = Record::kNopeValues;
  static constexpr int kLandRowBytes = kKvFp8 ? HEAD_DIM : Record::kRopeOffset;
  static constexpr int kRecordChunks = kRecordBytes / 16, kLandChunks = kLandRowBytes / 16;
  static constexpr int kLandBytes = kSparseFp8 || kKvFp8 ? NUM_STAGES * BLOCK_N * kLandRowBytes : 0;
  static constexpr int kFlagBytes = kSparse ? (NUM_STAGES * BLOCK_N + 15) / 16 * 16 : 0;
  // FP8 records with Q in registers: the records' scales are folded in where there are few values
  // instead of multiplying every de-quantized one. Warp w takes the 8 k16 steps of value group w (its
  // 128 columns, one scale a token) and rope step w, so its partial S is scale_w(token) x (its group
  // part) + its rope part; its O columns are group w too, so P V takes P x scale_w(token). The K stage
  // then holds the e4m3 values exactly (dequant_tile: bit arithmetic, no multiply).
  static constexpr bool kRecordScaleFold = kSparseFp8 && kQInRegs;
  static_assert(!kRecordScaleFold ||
                    (Record::kValuesPerScale == WARP_DV && HEAD_DIM_V / Record::kValuesPerScale == kQWarps &&
                     kQKSteps == Record::kValuesPerScale / 16 + 1 && HEAD_DIM - HEAD_DIM_V == 16 * kQWarps),
                "scale fold: a value group per warp (its k16 steps and its O columns), a rope k16 step per warp");

  // Shared memory map (bytes; every piece 16-byte aligned).
  static constexpr int kQBytes = kQInRegs ? 0 : BLOCK_M * HEAD_DIM * 2;
  static constexpr int kStageBytes = BLOCK_N * HEAD_DIM * 2;
  static constexpr int kPBytes = kQInRegs ? 0 : BLOCK_M * BLOCK_N * 2;
  // xS: one float4 per lane per n8 tile a warp publishes (all BLOCK_N / 8 tiles with Q in registers;
  // the S_NT tiles of the row tile it gives away in a pair; the 3 blocks of S_NT tiles it does not
  // own in a quad).
  static constexpr int kXBytes = NUM_WARPS * (kQInRegs ? BLOCK_N / 8 : kXSlots * S_NT) * 32 * 16;
  static constexpr int kPXBytes = kPBytes > kXBytes ? kPBytes : kXBytes;  // P and xS share a region
  static constexpr int kRedBytes = kQInRegs ? 0 : WN * BLOCK_M * 4;
  static constexpr int kOffQ = 0;
  static constexpr int kOffKV = kOffQ + kQBytes;
  static constexpr int kOffLand = kOffKV + kKStages * kStageBytes;  // sparse, e4m3 cache: landing slots
  static constexpr int kOffFlags = kOffLand + kLandBytes;             // sparse: token valid flags
  static constexpr int kOffP = kOffFlags + kFlagBytes;                // = xS
  static constexpr int kOffRedMax = kOffP + kPXBytes;              // float [WN][BLOCK_M]
  static constexpr int kOffRedSum = kOffRedMax + kRedBytes;        // float [WN][BLOCK_M]
  static constexpr int kOffRowScale = kOffRedSum + kRedBytes;      // float [BLOCK_M]
  // Sparse, Q in smem: each row's final running max (for the sink and max_logits in the epilogue).
  static constexpr int kOffRowMax = kOffRowScale + (kQInRegs ? 0 : BLOCK_M * 4);  // float [BLOCK_M]
  static constexpr int kSmemBytes = kOffRowMax + (kSparse && !kQInRegs ? BLOCK_M * 4 : 0);
  static_assert(kSmemBytes <= SMEM_LIMIT, "shared memory budget of the arch (reduce NUM_STAGES / BLOCK_N / BLOCK_M)");

  // CTAs per SM the register budget must allow (__launch_bounds__ min blocks): 3 for the small
  // Q-in-registers kernel (<= 168 registers), else 1 (a 128-thread CTA at <= 255 fits twice anyway;
  // two head groups' 256 threads at <= 255 once, as smem allows on sm_80 / sm_89).
  static constexpr int kMinBlocksPerSm = BLOCK_M == 16 ? 3 : 1;
};

namespace sm80 {

using mla_jit::sm80::cp_async_16;
using mla_jit::sm80::cp_async_commit;
using mla_jit::sm80::cp_async_wait;
using mla_jit::sm80::ldsm_x4;
using mla_jit::sm80::ldsm_x4_trans;
using mla_jit::sm80::Mma;
using mla_jit::sm80::smem_u32;
using mla_jit::sm80::swz;

// Barrier of the kSize warps of group `grp` (warps kSize grp .. kSize grp + kSize - 1) on hardware
// barrier grp + 1 (0 is __syncthreads'). Immediate ids: ptxas then reserves kGroups + 1 barriers per
// CTA, not all 16 (on sm_90 barriers bound residency: 64 per SM).
template <int kGroups, int kSize>
__device__ __forceinline__ void group_barrier_sync(int grp) {
  static_assert(kGroups >= 1 && kGroups <= 4 && (kSize == 2 || kSize == 4), "group barriers 1 .. 4");
  constexpr int kThreads = 32 * kSize;
  if (kGroups == 1 || grp == 0) {
    asm volatile("bar.sync 1, %0;\n" ::"n"(kThreads) : "memory");
  } else if (kGroups == 2 || grp == 1) {
    asm volatile("bar.sync 2, %0;\n" ::"n"(kThreads) : "memory");
  } else if (kGroups == 3 || grp == 2) {
    asm volatile("bar.sync 3, %0;\n" ::"n"(kThreads) : "memory");
  } else {
    asm volatile("bar.sync 4, %0;\n" ::"n"(kThreads) : "memory");
  }
}

__device__ __forceinline__ void sts_f4(unsigned addr, const float (&v)[4]) {
  asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "f"(v[0]), "f"(v[1]), "f"(v[2]),
               "f"(v[3])
               : "memory");
}
__device__ __forceinline__ void lds_f4(float (&v)[4], unsigned addr) {
  asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n"
               : "=f"(v[0]), "=f"(v[1]), "=f"(v[2]), "=f"(v[3])
               : "r"(addr)
               : "memory");
}

// The length of each sequence of the kernel's batch: cache_seqlens, or (sparse decode) topk for all
// (a type per case: the dense kernel keeps no register for it).
template <bool kSparse>
struct Lengths {
  const int* seqlens;
  __device__ __forceinline__ int operator()(int b) const { return max(seqlens[b], 0); }
};
template <>
struct Lengths<true> {
  int topk;
  __device__ __forceinline__ int operator()(int) const { return topk; }
};
template <bool kSparse>
__device__ __forceinline__ Lengths<kSparse> lengths_of(const DecodeParams& p) {
  if constexpr (kSparse)
    return {p.topk};
  else
    return {p.cache_seqlens};
}

// The CTA's walk over its pieces (detail::WorkCursor's protocol) in 4 registers: the metadata row's
// bounds are re-read (L1 hits) when a piece ends instead of being kept live; bi < 0 = done.
struct LeanCursor {
  int bi = -1, tok = 0, stop = 0, L = 0;

  __device__ __forceinline__ bool valid() const { return bi >= 0; }
  __device__ __forceinline__ bool first_piece(const int* meta) const { return bi == __ldg(meta + kMetaBeginBatch); }
  template <class Len>
  __device__ __forceinline__ void seek(const int* meta, const Len& seqlens, int b) {
    const int begin_b = __ldg(meta + kMetaBeginBatch), end_b = __ldg(meta + kMetaEndBatch);
    for (; b <= end_b; ++b) {
      L = seqlens(b);
      const int start = b == begin_b ? __ldg(meta + kMetaBeginToken) : 0;
      stop = b == end_b ? min(__ldg(meta + kMetaEndToken), L) : L;
      if (start < stop) {
        bi = b;
        tok = start;
        return;
      }
    }
    bi = -1;
  }
  template <class Len>
  __device__ __forceinline__ void init(const int* meta, const Len& seqlens) {
    seek(meta, seqlens, __ldg(meta + kMetaBeginBatch));
  }
  // Returns true when the tile just left was the last one of its piece.
  template <int BLOCK_N, class Len>
  __device__ __forceinline__ bool advance(const int* meta, const Len& seqlens) {
    tok += BLOCK_N;
    if (tok < stop) return false;
    seek(meta, seqlens, bi + 1);
    return true;
  }
};

// Phase study of the Q-in-smem kernel (MLA_JIT_TRACE builds only; bench/trace_sm80_phases.py):
// lane 0 of every warp records %clock64 at 7 points of tiles [kFirstTile, +kTiles) of CTAs below
// kCtas, one row of the split-KV trace table per (CTA, warp, tile): before the wait for tile n, after
// barrier A, after the S MMAs are issued, S exchanged, after barrier B, after barrier C, after the
// P V MMAs are issued. Without the flag every call compiles to nothing.
template <int kWarps>
struct PhaseTrace {
#ifdef MLA_JIT_TRACE
  static constexpr int kFirstTile = 64, kTiles = 4, kCtas = kTraceCtas / (kWarps * kTiles);
  int tile = 0, row = -1;
  __device__ __forceinline__ PhaseTrace(int warp, int lane) {
    const int cta = int(blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z));
    if (lane == 0 && cta < kCtas) row = (cta * kWarps + warp) * kTiles;
  }
  __device__ __forceinline__ void mark(int event) const {
    if (row >= 0 && tile >= kFirstTile && tile < kFirstTile + kTiles)
      mla_jit_trace_splitkv[(row + tile - kFirstTile) * kTraceEvents + event] = clock64();
  }
  __device__ __forceinline__ void next_tile() { ++tile; }
#else
  __device__ __forceinline__ PhaseTrace(int, int) {}
  __device__ __forceinline__ void mark(int) const {}
  __device__ __forceinline__ void next_tile() {}
#endif
};

// KV tile producer, run by every thread: its own LeanCursor walks the CTA's tiles ahead of the
// consumer; thread t copies chunks (t % TPT) + TPT * i of token t / TPT of each tile. The cache
// page of that token is looked up one tile ahead (kv_page) and first used a tile later, so the
// block-table latency is off the issue path.
template <typename Cfg>
struct KVProducer {
  using Element = typename Cfg::Element;
  static constexpr int TPT = Cfg::kThreadsPerToken, CPT = Cfg::kChunksPerThread, RC = Cfg::kRowChunks;
  static constexpr int D = Cfg::HEAD_DIM, PAGE = Cfg::PAGE_SIZE, NS = Cfg::NUM_STAGES;
  // Chunk c = q + TPT i: its swizzled low 3 bits take kLow distinct values (i % kLow), its high
  // bits grow by kHiStep bytes per i / kLow.
  static constexpr int kLow = TPT >= 8 ? 1 : 8 / TPT;
  static constexpr unsigned kHiStep = TPT >= 8 ? unsigned(TPT / 8) * 128u : 128u;

  LeanCursor cur;
  const int* meta;
  // The next tile's cache page of this thread's token (-1: past the piece, zero-fill) and the
  // token's offset in it. The page's first use is the next issue(), a tile after its load.
  int kv_page = -1, kv_in = 0;
  int tok_in_tile, q, stage = 0;
  unsigned dst_off[kLow];

  __device__ __forceinline__ void init(const int* meta_, const Lengths<Cfg::kSparse>& seqlens, const DecodeParams& p,
                                      int tid) {
    meta = meta_;
    tok_in_tile = tid / TPT;
    q = tid % TPT;
    const int r7 = tok_in_tile & 7;
#pragma unroll
    for (int u = 0; u < kLow; ++u) {
      const int c = TPT >= 8 ? q : q + TPT * u;  // the chunk of i = u (TPT >= 8: of every i, low bits)
      dst_off[u] = unsigned(tok_in_tile * RC) * 16u + unsigned(((c & 7) ^ r7) * 16) + unsigned(c >> 3) * 128u;
    }
    cur.init(meta, seqlens);
    if (cur.valid()) fetch_row(p);
  }
  __device__ __forceinline__ void fetch_row(const DecodeParams& p) {
    const int t = cur.tok + tok_in_tile;
    if constexpr (Cfg::kSparse) {
      kv_page = sparse_row(p, cur.bi, t, cur.stop);
    } else {
      kv_in = t % PAGE;
      kv_page = t < cur.stop ? __ldg(p.block_table + (long long)cur.bi * p.block_table_stride + t / PAGE) : -1;
    }
  }
  // Sparse: the cache row (page * PAGE + offset) of token t of row bi's index list, or -1 where the
  // token is past the piece or the row's topk_length, or its index is -1 or out of the cache.
  __device__ __forceinline__ static int sparse_row(const DecodeParams& p, int bi, int t, int stop) {
    if (t >= stop) return -1;
    if (p.topk_length != nullptr && t >= __ldg(p.topk_length + bi / p.lse_fold)) return -1;
    const int idx = __ldg(p.block_table + (long long)bi * p.block_table_stride + t);
    return unsigned(idx) < unsigned(p.kv_tokens) ? idx : -1;
  }
  // Issues the next tile (if any) into the next stage and commits one group (always: the group
  // count stays = the tile count). sAux: the sparse landing slots and flags (unused otherwise).
  __device__ __forceinline__ void issue(const DecodeParams& p, const typename Cfg::CacheT* k_cache, unsigned sKV,
                                        int g, const Lengths<Cfg::kSparse>& seqlens, unsigned sAux = 0) {
    if constexpr (Cfg::kSparseFp8)
      issue_record(p, k_cache, sKV, sAux, seqlens);
    else if constexpr (Cfg::kKvFp8)
      issue_e4m3(p, k_cache, g, sAux, seqlens);
    else
      issue_rows(p, k_cache, sKV, g, seqlens, sAux);
  }
  // Rows of Element (the dense cache, or the sparse prefill's bf16 rows) straight into K stage `stage`.
  __device__ __forceinline__ void issue_rows(const DecodeParams& p, const Element* k_cache, unsigned sKV, int g,
                                             const Lengths<Cfg::kSparse>& seqlens, unsigned sAux) {
    if (cur.valid()) {
      const unsigned dst = sKV + unsigned(stage) * unsigned(Cfg::kStageBytes);
      const Element* src;
      int kr;
      if constexpr (Cfg::kSparse) {  // bf16 rows: kv_page is the row (-1 = zero-fill), rows kv_block_stride bytes apart
        kr = kv_page;
        src = reinterpret_cast<const Element*>(reinterpret_cast<const unsigned char*>(k_cache) +
                                               (kr >= 0 ? (long long)kr * p.kv_block_stride : 0LL)) + q * 8;
        if (q == 0) store_flag(sAux, kr);
      } else {
        kr = kv_page >= 0 ? kv_page * PAGE + kv_in : -1;  // cache row, -1 = zero-fill
        src = k_cache + (kr >= 0 ? ((long long)kr * p.h_kv + g) * D : 0LL) + q * 8;
      }
      const int bytes = kr >= 0 ? 16 : 0;
      // The following tile's lookup before the copies: its load is in flight while they issue
      // (placed after them, ptxas reused a copy's address register and waited for the copies).
      cur.template advance<Cfg::BLOCK_N>(meta, seqlens);
      if (cur.valid()) fetch_row(p);
#pragma unroll
      for (int i = 0; i < CPT; ++i)
        cp_async_16(dst + dst_off[i % kLow] + unsigned(i / kLow) * kHiStep, src + i * TPT * 8, bytes);
    }
    cp_async_commit();
    stage = stage + 1 == NS ? 0 : stage + 1;
  }
  // e4m3 cache: this thread's 16-byte chunks c = q + TPT i of its token's row into the token's row
  // of landing slot `stage` (rows past the piece zero-filled: never read).
  __device__ __forceinline__ void issue_e4m3(const DecodeParams& p, const unsigned char* k_cache, int g, unsigned sAux,
                                             const Lengths<Cfg::kSparse>& seqlens) {
    if (cur.valid()) {
      const int kr = kv_page >= 0 ? kv_page * PAGE + kv_in : -1;  // cache row, -1 = zero-fill
      const unsigned char* src = k_cache + (kr >= 0 ? ((long long)kr * p.h_kv + g) * D : 0LL) + q * 16;
      const int bytes = kr >= 0 ? 16 : 0;
      cur.template advance<Cfg::BLOCK_N>(meta, seqlens);  // the next lookup first, as in issue()
      if (cur.valid()) fetch_row(p);
      const unsigned land = sAux + unsigned((stage * Cfg::BLOCK_N + tok_in_tile) * D + q * 16);
#pragma unroll
      for (int i = 0; i < (Cfg::kLandChunks + TPT - 1) / TPT; ++i)
        if (Cfg::kLandChunks % TPT == 0 || q + TPT * i < Cfg::kLandChunks)
          cp_async_16(land + unsigned(TPT * i * 16), src + TPT * i * 16, bytes);
    }
    cp_async_commit();
    stage = stage + 1 == NS ? 0 : stage + 1;
  }
  // Sparse: this thread's chunks c = q + TPT i of its token's record: below kLandChunks (e4m3 values,
  // scales; V3.2: 0-32) to the landing slot, the rope's (33-40) to the K row's chunks after the nope
  // values' (64-71); invalid tokens zero-filled (never read).
  __device__ __forceinline__ void issue_record(const DecodeParams& p, const typename Cfg::CacheT* k_cache, unsigned sKV,
                                               unsigned sAux, const Lengths<Cfg::kSparse>& seqlens) {
    if (cur.valid()) {
      const int kr = kv_page;
      const unsigned char* rec = reinterpret_cast<const unsigned char*>(k_cache);
      if (kr >= 0) rec += (long long)(kr / PAGE) * p.kv_block_stride + (kr % PAGE) * Cfg::kRecordBytes;
      const int bytes = kr >= 0 ? 16 : 0;
      cur.template advance<Cfg::BLOCK_N>(meta, seqlens);
      if (cur.valid()) fetch_row(p);
      const unsigned land = sAux + unsigned((stage * Cfg::BLOCK_N + tok_in_tile) * Cfg::kLandRowBytes);
      const unsigned krow = sKV + unsigned(stage) * unsigned(Cfg::kStageBytes) + unsigned(tok_in_tile * RC) * 16u;
      const int r7 = tok_in_tile & 7;
#pragma unroll
      for (int i = 0; i < (Cfg::kRecordChunks + TPT - 1) / TPT; ++i) {
        const int c = q + TPT * i;
        if (c < Cfg::kLandChunks) {
          cp_async_16(land + unsigned(c) * 16u, rec + c * 16, bytes);
        } else if (c < Cfg::kRecordChunks) {  // rope chunk j = c - kLandChunks -> K chunk 64 + j (swizzled)
          cp_async_16(krow + unsigned((((c - Cfg::kLandChunks) ^ r7) * 16) + (Cfg::kNopeBytes / 8) * 16),
                      rec + c * 16, bytes);
        }
      }
      if (q == 0) store_flag(sAux, kr);
    }
    cp_async_commit();
    stage = stage + 1 == NS ? 0 : stage + 1;
  }
  // Sparse: the valid flag of this thread's token in the stage being issued (1: row kr >= 0).
  __device__ __forceinline__ void store_flag(unsigned sAux, int kr) const {
    const unsigned flag = sAux + unsigned(Cfg::kLandBytes + stage * Cfg::BLOCK_N + tok_in_tile);
    asm volatile("st.shared.u8 [%0], %1;\n" ::"r"(flag), "r"(kr >= 0 ? 1 : 0) : "memory");
  }
};

// Sparse: e4m3 byte k of w as float32, exactly: its sign, exponent and mantissa moved into
// float32's sign and low exponent / high mantissa bits give the value x 2^-120 (subnormals
// included, as float32 subnormals: no flush to zero here), then x 2^120.
__device__ __forceinline__ float e4m3_to_f32(unsigned w, int k) {
  const unsigned top = __byte_perm(w, 0u, unsigned(k << 12) | 0x444u);  // byte k on top, zeros below
  return __uint_as_float(unsigned(int(top) >> 4) & 0x87F00000u) * 0x1p120f;
}

// Sparse: the e4m3 values of the tile in landing slot sLand, de-quantized (x their 128-value
// scale, rounded once to bf16 as the float32 reference does; kRecordScaleFold: exactly, without the
// scale) into the K stage at sK, columns 0-511 (swizzled). Thread t converts 8 values (one 16-byte K chunk) per step: a warp reads 256
// contiguous bytes and writes one row's 32 chunks.
template <typename Cfg>
__device__ __forceinline__ void dequant_tile(unsigned sLand, unsigned sK, int tid) {
  constexpr int kUnits = Cfg::BLOCK_N * Cfg::kNopeBytes / 8, RC = Cfg::kRowChunks;
#pragma unroll 2
  for (int u = tid; u < kUnits; u += Cfg::NUM_THREADS) {
    const int tok = u / (Cfg::kNopeBytes / 8), c8 = u % (Cfg::kNopeBytes / 8);
    const unsigned row = sLand + unsigned(tok * Cfg::kLandRowBytes);
    unsigned w0, w1;
    asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];\n" : "=r"(w0), "=r"(w1) : "r"(row + unsigned(c8 * 8)));
    unsigned out[4];
    if constexpr (Cfg::kRecordScaleFold) {  // exact: the scale is applied to S and P (kRecordScaleFold)
      const uint4 v = e4m3::oct_to<cutlass::bfloat16_t, false>(w0, w1);
      out[0] = v.x, out[1] = v.y, out[2] = v.z, out[3] = v.w;
    } else {
      float scale;
      asm volatile("ld.shared.f32 %0, [%1];\n"
                   : "=f"(scale)
                   : "r"(row + unsigned(Cfg::Record::kScaleOffset + (c8 / (Cfg::Record::kValuesPerScale / 8)) * 4)));
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const unsigned w = j < 2 ? w0 : w1;
        out[j] = ElemTraits<cutlass::bfloat16_t>::pack2(e4m3_to_f32(w, 2 * (j % 2)) * scale,
                                                        e4m3_to_f32(w, 2 * (j % 2) + 1) * scale);
      }
    }
    const unsigned dst = sK + unsigned(tok * RC) * 16u + unsigned(((c8 & 7) ^ (tok & 7)) * 16 + (c8 >> 3) * 128);
    asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(dst), "r"(out[0]), "r"(out[1]), "r"(out[2]),
                 "r"(out[3])
                 : "memory");
  }
}

// S's scale (log2 units) and O's: the softmax scale, times the per-tensor descales of q and the
// cache for an e4m3 cache (read on the GPU: a graph replay sees their current values), whose
// descale_k O takes too.
struct Scales {
  float s_log2, v;
};
template <typename Cfg>
__device__ __forceinline__ Scales scales_of(const DecodeParams& p) {
  if constexpr (Cfg::kKvFp8) {
    const float dk = __ldg(p.descale_k);
    return {p.scale_log2 * __ldg(p.descale_q) * dk, dk};
  } else {
    return {p.scale_log2, 1.f};
  }
}

// e4m3 cache: the tile in landing slot sLand converted (exactly) into the Element K stage at sK.
// Thread t converts 8-value units q + CT i (CT = kCvtThreads, q = t % CT) of tokens t / CT + kCvtTokens j:
// a quarter warp writes 8 chunks of one row's 128-byte period (no bank conflicts), a half warp
// reads 2 x 64 contiguous bytes of 2 rows HEAD_DIM bytes apart.
template <typename Cfg>
__device__ __forceinline__ void convert_kv_tile(unsigned sLand, unsigned sK, int tid) {
  constexpr int CT = Cfg::kCvtThreads, D = Cfg::HEAD_DIM, kRowUnits = D / 8;
  const int q = tid % CT;
#pragma unroll
  for (int j = 0; j < Cfg::BLOCK_N / Cfg::kCvtTokens; ++j) {
    const int tok = tid / CT + Cfg::kCvtTokens * j;
    const unsigned src = sLand + unsigned(tok * D + q * 8);
    const unsigned dst =
        sK + unsigned(tok * Cfg::kRowChunks) * 16u + unsigned(((q & 7) ^ (tok & 7)) * 16 + (q >> 3) * 128);
#pragma unroll
    for (int i = 0; i < (kRowUnits + CT - 1) / CT; ++i) {
      if (kRowUnits % CT == 0 || q + CT * i < kRowUnits) {
        unsigned w0, w1;
        asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];\n" : "=r"(w0), "=r"(w1) : "r"(src + unsigned(CT * i * 8)));
        const uint4 v = e4m3::oct_to<typename Cfg::Element, Cfg::kHwCvt>(w0, w1);
        asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(dst + unsigned((CT / 8) * i * 128)), "r"(v.x),
                     "r"(v.y), "r"(v.z), "r"(v.w)
                     : "memory");
      }
    }
  }
}

// The KV pipeline's start: the first NUM_STAGES - 1 tiles issued (an e4m3 cache: NUM_STAGES, its
// landing slots); where tiles are converted (FP8 records, an e4m3 cache), tile 0 waited for and
// converted into K stage 0 (read after the first barrier A).
template <typename Cfg>
__device__ __forceinline__ void start_kv(KVProducer<Cfg>& prod, const DecodeParams& p,
                                         const typename Cfg::CacheT* k_cache, unsigned sKV, int g,
                                         const Lengths<Cfg::kSparse>& seqlens, unsigned sAux, int tid) {
  constexpr int NS = Cfg::NUM_STAGES;
#pragma unroll
  for (int s = 0; s < (Cfg::kKvFp8 ? NS : NS - 1); ++s) prod.issue(p, k_cache, sKV, g, seqlens, sAux);
  if constexpr (Cfg::kSparseFp8) {
    cp_async_wait<NS - 2>();
    __syncthreads();
    dequant_tile<Cfg>(sAux, sKV, tid);
  } else if constexpr (Cfg::kKvFp8 && Cfg::kKStages == 2) {
    cp_async_wait<NS - 1>();
    __syncthreads();
    convert_kv_tile<Cfg>(sAux, sKV, tid);
  }
}

// After barrier A of tile n (K stage `stage`, landing slot `land`): the next tile's loads issued
// into the stage / slot freed, and where tiles are converted, tile n + 1 (landed) into its K stage
// (FP8 records: stage + 1 of the common ring; an e4m3 cache: slot land + 1 into the other of its 2 K
// stages), read after the next barrier A. An e4m3 cache with one K stage: tile n converted into it
// now, behind a barrier (A': the stage visible, slot `land` free for tile n + NS).
template <typename Cfg>
__device__ __forceinline__ void refill_and_convert(KVProducer<Cfg>& prod, const DecodeParams& p,
                                                   const typename Cfg::CacheT* k_cache, unsigned sKV, int g,
                                                   const Lengths<Cfg::kSparse>& seqlens, unsigned sAux, int stage,
                                                   int& land, int tid) {
  constexpr int NS = Cfg::NUM_STAGES, BN = Cfg::BLOCK_N;
  if constexpr (Cfg::kKvFp8 && Cfg::kKStages == 1) {
    convert_kv_tile<Cfg>(sAux + unsigned(land * BN * Cfg::kLandRowBytes), sKV, tid);
    __syncthreads();  // A'
    land = land + 1 == NS ? 0 : land + 1;
  }
  prod.issue(p, k_cache, sKV, g, seqlens, sAux);  // tile n + NS - 1 -> stage (n - 1) % NS (e4m3: n + NS -> n % NS)
  if constexpr (Cfg::kSparseFp8) {
    const int next = stage + 1 == NS ? 0 : stage + 1;
    dequant_tile<Cfg>(sAux + unsigned(next * BN * Cfg::kLandRowBytes), sKV + unsigned(next) * unsigned(Cfg::kStageBytes),
                      tid);
  } else if constexpr (Cfg::kKvFp8 && Cfg::kKStages == 2) {
    land = land + 1 == NS ? 0 : land + 1;
    convert_kv_tile<Cfg>(sAux + unsigned(land * BN * Cfg::kLandRowBytes),
                         sKV + unsigned(stage ^ 1) * unsigned(Cfg::kStageBytes), tid);
  }
}

// Row r of a finished piece's O (this thread's O_NT n8 tiles; row half h of the m16 fragment `o`,
// columns col_base + 8 nt + {0, 1}), scaled by inv_l: into out when the batch has a single split,
// else into the piece's o_accum slot.
template <typename Element, int DV, int O_NT>
__device__ __forceinline__ void store_o_row(const DecodeParams& p, PieceDest dest, int bi, int g, int r, int col_base,
                                            const float (&o)[O_NT][4], int h, float inv_l) {
  if (dest.single) {
    const auto [s, head] = query_row(p, g, r);
    Element* out = reinterpret_cast<Element*>(p.out) + ((long long)(bi * p.s_q + s) * p.h_q + head) * DV + col_base;
#pragma unroll
    for (int nt = 0; nt < O_NT; ++nt)
      *reinterpret_cast<unsigned*>(out + nt * 8) =
          ElemTraits<Element>::pack2(o[nt][2 * h] * inv_l, o[nt][2 * h + 1] * inv_l);
  } else {
    float* out = p.o_accum + (((long long)dest.slot * p.h_kv + g) * p.rows + r) * DV + col_base;
#pragma unroll
    for (int nt = 0; nt < O_NT; ++nt)
      *reinterpret_cast<float2*>(out + nt * 8) = make_float2(o[nt][2 * h] * inv_l, o[nt][2 * h + 1] * inv_l);
  }
}

}  // namespace sm80

// ==================================================================================================
// BLOCK_M == 16: Q in registers, QK split over d across the 4 warps, P in registers.
// ==================================================================================================
namespace sm80 {

// Per-thread state of the Q-in-registers kernel through its tile loop. Thread geometry of the
// mma.sync fragments: lane = 4 g4 + tq of warp `warp`; the thread's rows are g4 and g4 + 8 of the
// 16-row tile.
template <typename Cfg>
struct QRegsState {
  static constexpr int NKS = Cfg::kQKSteps;       // k16 steps of d per warp
  static constexpr int O_NT = Cfg::WARP_DV / 8;  // n8 tiles of O per warp
  // Q A fragments of the warp's k16 steps j (qregs_step_col: 4 j + warp, or with kRecordScaleFold its
  // value group's then its rope step; rows g4, g4 + 8; columns 2 tq + {0, 1} (+ 8)).
  unsigned qf[NKS][4];
  float o[O_NT][4];  // O[:, warp * WARP_DV + ...] of the piece
  float m_run[2];    // running max of rows g4, g4 + 8, log2 units (scaled)
  float l_part[2];   // partial row sums over this thread's columns
  int lim[2];        // first masked token of each row

  __device__ __forceinline__ void clear_o() {
#pragma unroll
    for (int nt = 0; nt < O_NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[nt][e] = 0.f;
  }
  __device__ __forceinline__ void init() {
    clear_o();
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      m_run[h] = -kInf;
      l_part[h] = 0.f;
      lim[h] = 0;
    }
  }
};

// The first column of warp w's k16 step j of d: 64 j + 16 w, or (kRecordScaleFold) the 128 columns
// of value group w, then rope step w.
template <typename Cfg>
__device__ __forceinline__ int qregs_step_col(int j, int warp) {
  if constexpr (Cfg::kRecordScaleFold) return j + 1 < Cfg::kQKSteps ? 128 * warp + 16 * j : Cfg::HEAD_DIM_V + 16 * warp;
  else return 64 * j + 16 * warp;
}

// Piece start: Q of batch cur.bi straight into registers (padded rows are zero), the running max
// and sums reset, the rows' mask limits (m_block: the warp's 16-row tile; warp: its index in the tile's
// 4 warps).
template <typename Cfg>
__device__ __forceinline__ void qregs_start_piece(const DecodeParams& p, const LeanCursor& cur, QRegsState<Cfg>& st,
                                                  int warp, int g4, int tq, int m_block) {
  using QElement = typename Cfg::QElement;
  constexpr int NKS = Cfg::kQKSteps;
  const int g = blockIdx.y;
  const QElement* qb = reinterpret_cast<const QElement*>(p.q) + (long long)cur.bi * p.q_stride_b;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = m_block * 16 + g4 + 8 * h;
    if (r < p.rows) {
      const auto [s, head] = query_row(p, g, r);
      const QElement* qrow = qb + s * p.q_stride_s + head * p.q_stride_h + 2 * tq;
#pragma unroll
      for (int j = 0; j < NKS; ++j) {  // columns qregs_step_col + 2 tq + {0, 1}, and + 8
        if constexpr (Cfg::kQFp8) {
          const unsigned short* q2 = reinterpret_cast<const unsigned short*>(qrow + qregs_step_col<Cfg>(j, warp));
          st.qf[j][h] = e4m3::pair_to<typename Cfg::Element, Cfg::kHwCvt, 0>(__ldg(q2));
          st.qf[j][h + 2] = e4m3::pair_to<typename Cfg::Element, Cfg::kHwCvt, 0>(__ldg(q2 + 4));
        } else {
          const unsigned* q2 = reinterpret_cast<const unsigned*>(qrow + qregs_step_col<Cfg>(j, warp));
          st.qf[j][h] = __ldg(q2);
          st.qf[j][h + 2] = __ldg(q2 + 4);
        }
      }
    } else {
#pragma unroll
      for (int j = 0; j < NKS; ++j) st.qf[j][h] = st.qf[j][h + 2] = 0u;
    }
    st.m_run[h] = -kInf;
    st.l_part[h] = 0.f;
    // Causal, bottom-right aligned: query s sees keys < L - s_q + s + 1. Never past the piece.
    const int lc = p.causal ? cur.L - p.s_q + r / p.q_per_kv + 1 : cur.L;
    st.lim[h] = min(lc, cur.stop);
  }
}

// Partial S = Q K^T of the tile at sK over this warp's k16 steps, all tokens (k_lane: the lane's
// K B-fragment offset).
template <typename Cfg>
__device__ __forceinline__ void qregs_partial_s(const QRegsState<Cfg>& st, unsigned sK, unsigned k_lane,
                                                float (&s_acc)[Cfg::BLOCK_N / 8][4]) {
  using Element = typename Cfg::Element;
  constexpr int NKS = Cfg::kQKSteps, NTB = Cfg::BLOCK_N / 8, RC = Cfg::kRowChunks;
#pragma unroll
  for (int nt = 0; nt < NTB; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) s_acc[nt][e] = 0.f;
#pragma unroll
  for (int j = 0; j < NKS; ++j) {
#pragma unroll
    for (int np = 0; np < NTB / 2; ++np) {
      unsigned b[4];
      ldsm_x4(b, sK + k_lane + unsigned(np * 16 * RC * 16 + j * 128));
      Mma<Element>::run(s_acc[2 * np], st.qf[j], b[0], b[1]);
      Mma<Element>::run(s_acc[2 * np + 1], st.qf[j], b[2], b[3]);
    }
  }
}

// kRecordScaleFold: the partial S of warp w, scale_w(token) x (Q K^T over value group w) + Q K^T over
// rope step w (k_lane: the lane's K B-fragment offset without the warp's chunks; s_land: the stage's
// landing slot). scl gets the thread's tokens' group-w scales (token nt 8 + 2 tq + e), which P takes too.
template <typename Cfg>
__device__ __forceinline__ void qregs_partial_s_folded(const QRegsState<Cfg>& st, unsigned sK, unsigned k_lane,
                                                       unsigned s_land, int warp, int tq,
                                                       float (&s_acc)[Cfg::BLOCK_N / 8][4],
                                                       float (&scl)[Cfg::BLOCK_N / 8][2]) {
  using Element = typename Cfg::Element;
  constexpr int NKS = Cfg::kQKSteps, NTB = Cfg::BLOCK_N / 8, RC = Cfg::kRowChunks;
  // The scales first: their loads are in flight during the group's MMAs.
  const unsigned scale0 = s_land + unsigned(2 * tq * Cfg::kLandRowBytes + Cfg::Record::kScaleOffset + 4 * warp);
#pragma unroll
  for (int nt = 0; nt < NTB; ++nt)
#pragma unroll
    for (int e = 0; e < 2; ++e)
      asm volatile("ld.shared.f32 %0, [%1];\n"
                   : "=f"(scl[nt][e])
                   : "r"(scale0 + unsigned((8 * nt + e) * Cfg::kLandRowBytes)));
#pragma unroll
  for (int nt = 0; nt < NTB; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) s_acc[nt][e] = 0.f;
  // Group w: chunks 16 w + 2 j + {0, 1}; swizzled, chunk low bits (2 (j % 4) + sub) ^ (row & 7), so
  // the lane's offset XOR 32 (j % 4) (k_lane's row part is a multiple of 128 bytes).
#pragma unroll
  for (int j = 0; j + 1 < NKS; ++j) {
#pragma unroll
    for (int np = 0; np < NTB / 2; ++np) {
      unsigned b[4];
      ldsm_x4(b, sK + (k_lane ^ unsigned(32 * (j % 4))) +
                     unsigned(256 * warp + 128 * (j / 4) + np * 16 * RC * 16));
      Mma<Element>::run(s_acc[2 * np], st.qf[j], b[0], b[1]);
      Mma<Element>::run(s_acc[2 * np + 1], st.qf[j], b[2], b[3]);
    }
  }
#pragma unroll
  for (int nt = 0; nt < NTB; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) s_acc[nt][e] *= scl[nt][e & 1];
  // Rope step w: chunks HEAD_DIM_V / 8 + 2 w + {0, 1}.
#pragma unroll
  for (int np = 0; np < NTB / 2; ++np) {
    unsigned b[4];
    ldsm_x4(b, sK + (k_lane ^ unsigned(32 * warp)) + unsigned(2 * Cfg::HEAD_DIM_V + np * 16 * RC * 16));
    Mma<Element>::run(s_acc[2 * np], st.qf[NKS - 1], b[0], b[1]);
    Mma<Element>::run(s_acc[2 * np + 1], st.qf[NKS - 1], b[2], b[3]);
  }
}

// The head group's 4 partial S exchanged through xS (x_ld: this lane's float4 of the group's warp 0's
// first n8 tile; warp: the index in the group): after barrier X every warp sums the four partials in
// the same order, so the group's warps hold bit-identical S; then the mask (a select: NaN never survives).
template <typename Cfg>
__device__ __forceinline__ void qregs_reduce_s(float (&s_acc)[Cfg::BLOCK_N / 8][4], unsigned x_ld, int tok,
                                               const int (&lim)[2], int warp, int tq, unsigned s_flags, int grp) {
  constexpr int NTB = Cfg::BLOCK_N / 8, W = Cfg::kQWarps, BN = Cfg::BLOCK_N;
#pragma unroll
  for (int nt = 0; nt < NTB; ++nt) sts_f4(x_ld + unsigned((warp * NTB + nt) * 32 * 16), s_acc[nt]);
  // X: the head group's partials visible (its own xS; the next tile's barrier A orders the reuse)
  if constexpr (Cfg::kHeadGroups == 1)
    __syncthreads();
  else
    group_barrier_sync<Cfg::kHeadGroups, 4>(grp);

  // ---------------- S = sum of the 4 partials (same order in every warp), mask ----------------
#pragma unroll
  for (int nt = 0; nt < NTB; ++nt) {
    lds_f4(s_acc[nt], x_ld + unsigned(nt * 32 * 16));
#pragma unroll
    for (int w2 = 1; w2 < W; ++w2) {
      float v[4];
      lds_f4(v, x_ld + unsigned((w2 * NTB + nt) * 32 * 16));
#pragma unroll
      for (int e = 0; e < 4; ++e) s_acc[nt][e] += v[e];
    }
  }
  if constexpr (Cfg::kSparse) {  // the tile's valid flags (0 also past the piece and topk_length)
#pragma unroll
    for (int nt = 0; nt < NTB; ++nt) {
      unsigned short f2;
      asm volatile("ld.shared.u16 %0, [%1];\n" : "=h"(f2) : "r"(s_flags + unsigned(nt * 8 + 2 * tq)));
#pragma unroll
      for (int e = 0; e < 4; ++e)
        if (((f2 >> (8 * (e & 1))) & 0xff) == 0) s_acc[nt][e] = -kInf;
    }
  } else if (tok + BN > min(lim[0], lim[1])) {
#pragma unroll
    for (int nt = 0; nt < NTB; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int t = tok + nt * 8 + 2 * tq + (e & 1);
        if (t >= lim[e >> 1]) s_acc[nt][e] = -kInf;
      }
  }
}

// Online softmax (log2 domain) of S in place: P in registers as the A fragments pa of the P V
// k16 steps (kRecordScaleFold: times p_scale, the tokens' scales of the warp's value group), sc the O
// rescale of the thread's two rows.
template <typename Cfg>
__device__ __forceinline__ void qregs_softmax(float scale_log2, float (&s_acc)[Cfg::BLOCK_N / 8][4],
                                              QRegsState<Cfg>& st, float (&sc)[2],
                                              unsigned (&pa)[Cfg::BLOCK_N / 16][4],
                                              const float (&p_scale)[Cfg::BLOCK_N / 8][2]) {
  using Element = typename Cfg::Element;
  constexpr int NTB = Cfg::BLOCK_N / 8, BN = Cfg::BLOCK_N;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float mx = -kInf;
#pragma unroll
    for (int nt = 0; nt < NTB; ++nt) mx = fmaxf(mx, fmaxf(s_acc[nt][2 * h], s_acc[nt][2 * h + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float m_new = fmaxf(st.m_run[h], mx * scale_log2);
    const float m_use = m_new == -kInf ? 0.f : m_new;  // avoid (-inf) - (-inf)
    sc[h] = exp2f(st.m_run[h] - m_use);
    st.m_run[h] = m_new;
    float sum = 0.f;
#pragma unroll
    for (int nt = 0; nt < NTB; ++nt) {
      const float p0 = exp2f(fmaf(s_acc[nt][2 * h], scale_log2, -m_use));
      const float p1 = exp2f(fmaf(s_acc[nt][2 * h + 1], scale_log2, -m_use));
      sum += p0 + p1;
      s_acc[nt][2 * h] = p0;
      s_acc[nt][2 * h + 1] = p1;
    }
    st.l_part[h] = st.l_part[h] * sc[h] + sum;
  }
  // kRecordScaleFold: P V multiplies this warp's value group, whose scales P takes (l does not).
  if constexpr (Cfg::kRecordScaleFold) {
#pragma unroll
    for (int nt = 0; nt < NTB; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) s_acc[nt][e] *= p_scale[nt][e & 1];
  }
  // C fragments of n8 tiles 2 kt, 2 kt + 1 = the A fragment of k16 step kt.
#pragma unroll
  for (int kt = 0; kt < BN / 16; ++kt) {
    pa[kt][0] = ElemTraits<Element>::pack2(s_acc[2 * kt][0], s_acc[2 * kt][1]);
    pa[kt][1] = ElemTraits<Element>::pack2(s_acc[2 * kt][2], s_acc[2 * kt][3]);
    pa[kt][2] = ElemTraits<Element>::pack2(s_acc[2 * kt + 1][0], s_acc[2 * kt + 1][1]);
    pa[kt][3] = ElemTraits<Element>::pack2(s_acc[2 * kt + 1][2], s_acc[2 * kt + 1][3]);
  }
}

// O = O * rescale + P V (16 rows x WARP_DV columns per warp), V of the tile at sK through
// ldmatrix.trans (v_base, v_x: the lane's V B-fragment offsets).
template <typename Cfg>
__device__ __forceinline__ void qregs_pv(QRegsState<Cfg>& st, const float (&sc)[2],
                                         const unsigned (&pa)[Cfg::BLOCK_N / 16][4], unsigned sK, unsigned v_base,
                                         unsigned v_x) {
  using Element = typename Cfg::Element;
  constexpr int BN = Cfg::BLOCK_N, RC = Cfg::kRowChunks, O_NT = Cfg::WARP_DV / 8;
  if (__any_sync(0xffffffffu, sc[0] != 1.f || sc[1] != 1.f)) {
#pragma unroll
    for (int nt = 0; nt < O_NT; ++nt) {
      st.o[nt][0] *= sc[0];
      st.o[nt][1] *= sc[0];
      st.o[nt][2] *= sc[1];
      st.o[nt][3] *= sc[1];
    }
  }
#pragma unroll
  for (int kt = 0; kt < BN / 16; ++kt) {
#pragma unroll
    for (int np = 0; np < O_NT / 2; ++np) {
      unsigned b[4];
      // chunk warp * WARP_DV / 8 + 2 np + a_chk: low bits 2 (np % 4) + a_chk, high (np / 4) * 8
      ldsm_x4_trans(b, sK + v_base + (v_x ^ unsigned(32 * (np % 4))) + unsigned((np / 4) * 128 + kt * 16 * RC * 16));
      Mma<Element>::run(st.o[2 * np], pa[kt], b[0], b[1]);
      Mma<Element>::run(st.o[2 * np + 1], pa[kt], b[2], b[3]);
    }
  }
}

// Epilogue of a piece: O / l of the thread's rows into out or o_accum, the LSE (lse_writer: one
// writer per row, warp 0's quad leader; every warp holds the same m_run and l), O cleared.
template <typename Cfg>
__device__ __forceinline__ void qregs_finish_piece(const DecodeParams& p, const int* meta, const LeanCursor& cur,
                                                   QRegsState<Cfg>& st, int warp, int g4, int tq, bool lse_writer,
                                                   float v_scale, int m_block) {
  constexpr int DV = Cfg::HEAD_DIM_V, WARP_DV = Cfg::WARP_DV;
  const int g = blockIdx.y;
  float l[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l[h] = st.l_part[h];
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
  }
  // meta re-read here (not kept live: registers are tight at 3 CTAs / SM)
  const PieceDest dest = piece_dest(p, cur.bi, cur.first_piece(meta) ? __ldg(meta + kMetaBeginSplit) : 0);
  const int col_base = warp * WARP_DV + tq * 2;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = m_block * 16 + g4 + 8 * h;
    if (r >= p.rows) continue;
    float inv_l = l[h] > 0.f ? v_scale / l[h] : 0.f;
    // A single split is the final out: the attention sink applies here (else in the combine).
    if constexpr (Cfg::kSparse) {
      if (dest.single) inv_l *= sink_factor(p, query_row(p, g, r).head, st.m_run[h] + log2f(l[h]));
    }
    store_o_row<typename Cfg::OutElement, DV>(p, dest, cur.bi, g, r, col_base, st.o, h, inv_l);
  }
  if (lse_writer) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = m_block * 16 + g4 + 8 * h;
      if (r < p.rows) {
        store_piece_lse<Cfg::kSparse>(p, dest, cur.bi, g, r, l[h] > 0.f ? st.m_run[h] + log2f(l[h]) : -kInf);
        if constexpr (Cfg::kSparse) store_max_logit(p, dest, cur.bi, g, r, st.m_run[h]);
      }
    }
  }
  st.clear_o();
}

}  // namespace sm80

// Per KV tile: wait for it, barrier A, refill the freed stage, partial S, exchange (barrier X),
// softmax, P V; at a piece's end its epilogue. With 2 head groups (kHeadGroups) every thread loads
// and de-quantizes the tiles, each group of 4 warps runs the rest for its 16 rows.
template <typename Cfg>
__device__ __forceinline__ void mla_splitkv_sm80_qregs(const DecodeParams& p, const typename Cfg::CacheT* k_cache) {
  constexpr int BN = Cfg::BLOCK_N, NS = Cfg::NUM_STAGES;
  constexpr int RC = Cfg::kRowChunks, WARP_DV = Cfg::WARP_DV;
  constexpr int NTB = BN / 8;  // n8 tiles of S (all tokens of the tile)

  extern __shared__ __align__(128) unsigned char smem[];
  const unsigned s_base = sm80::smem_u32(smem);
  const unsigned sKV = s_base + Cfg::kOffKV;
  const unsigned sX = s_base + Cfg::kOffP;

  const int tid = threadIdx.x;
  const int lane = tid % 32;
  // Head group grp (rows m_block * 16 ..) and the warp's index in it (its d steps and O columns).
  const int grp = Cfg::kHeadGroups == 1 ? 0 : tid / 128, warp = (tid / 32) % 4;
  const int m_block = int(blockIdx.z) * Cfg::kHeadGroups + grp;
  const int g4 = lane / 4, tq = lane % 4, r7 = lane % 8;
  const int part = blockIdx.x, g = blockIdx.y;

  const int* meta = p.tile_scheduler_metadata + part * kMetaSize;
  const auto seqlens = sm80::lengths_of<Cfg::kSparse>(p);

  const unsigned sAux = s_base + Cfg::kOffLand;  // sparse: landing slots, then flags

  const sm80::Scales scales = sm80::scales_of<Cfg>(p);

  sm80::KVProducer<Cfg> prod;
  prod.init(meta, seqlens, p, tid);
  sm80::start_kv<Cfg>(prod, p, k_cache, sKV, g, seqlens, sAux, tid);

  sm80::LeanCursor cur;
  cur.init(meta, seqlens);

  sm80::QRegsState<Cfg> st;
  st.init();

  // K B fragments (x4: tokens 16 np + {0..7, 8..15} x chunks 8 j + 2 warp + {0, 1}): lane base
  // (kRecordScaleFold: without the warp's chunks, qregs_partial_s_folded adds them).
  const unsigned k_lane = unsigned((8 * (lane / 16) + r7) * RC) * 16u +
                          unsigned((((Cfg::kRecordScaleFold ? 0 : 2 * warp) + (lane / 8) % 2) ^ r7) * 16);
  // V B fragments (x4.trans: tokens 0-15 of a k16 step x 2 n8 tiles), as in the Q-in-smem variant.
  const int a_chk = lane / 16;
  // Chunk low bits a_chk + 2u = a_chk ^ 2u, so the swizzled offset is v_x ^ 32u (2 registers, not 4).
  const unsigned v_base = unsigned((lane % 8) + 8 * ((lane / 8) % 2)) * RC * 16 + unsigned(warp * WARP_DV / 8) * 16;
  const unsigned v_x = unsigned((a_chk ^ r7) * 16);
  // xS: float4 [group][warp][n8 tile][lane].
  const unsigned x_ld = sX + unsigned(lane) * 16u + unsigned(grp * 4 * NTB * 32 * 16);

  bool piece_start = true;
  int stage = 0, land = 0;  // tile n's K stage and (e4m3 cache) landing slot
  while (cur.valid()) {
    if (piece_start) {
      sm80::qregs_start_piece<Cfg>(p, cur, st, warp, g4, tq, m_block);
      piece_start = false;
    }

    // This thread's copies of tile n landed (converted a tile ahead: of tile n + 1, converted below).
    sm80::cp_async_wait<Cfg::kPendingAtA>();
    __syncthreads();  // A: everyone's copies of tile n (+ 1) visible, tile n converted; stage n-1 and xS free
    sm80::refill_and_convert<Cfg>(prod, p, k_cache, sKV, g, seqlens, sAux, stage, land, tid);

    const unsigned sK = sKV + unsigned(stage) * unsigned(Cfg::kStageBytes);
    const bool last = cur.tok + BN >= cur.stop;

    float s_acc[NTB][4], scl[NTB][2];
    if constexpr (Cfg::kRecordScaleFold) {
      sm80::qregs_partial_s_folded<Cfg>(st, sK, k_lane, sAux + unsigned(stage * BN * Cfg::kLandRowBytes), warp, tq,
                                        s_acc, scl);
    } else {
      sm80::qregs_partial_s<Cfg>(st, sK, k_lane, s_acc);
    }
    sm80::qregs_reduce_s<Cfg>(s_acc, x_ld, cur.tok, st.lim, warp, tq,
                              Cfg::kSparse ? sAux + unsigned(Cfg::kLandBytes + stage * BN) : 0u, grp);
    float sc[2];
    unsigned pa[BN / 16][4];
    sm80::qregs_softmax<Cfg>(scales.s_log2, s_acc, st, sc, pa, scl);
    sm80::qregs_pv<Cfg>(st, sc, pa, sK, v_base, v_x);
    if (last) {
      sm80::qregs_finish_piece<Cfg>(p, meta, cur, st, warp, g4, tq, /*lse_writer=*/warp == 0 && tq == 0, scales.v,
                                     m_block);
      piece_start = true;
    }
    stage = stage + 1 == Cfg::kKStages ? 0 : stage + 1;
    cur.template advance<BN>(meta, seqlens);
  }
  sm80::cp_async_wait<0>();
}

// ==================================================================================================
// BLOCK_M in {32, 64}: Q in shared memory, QK by warp pairs split over d, P through shared memory.
// ==================================================================================================
namespace sm80 {

// O = 0 (this warp's O_MT x O_NT accumulator fragments).
template <int O_MT, int O_NT>
__device__ __forceinline__ void clear_o(float (&o)[O_MT][O_NT][4]) {
#pragma unroll
  for (int mt = 0; mt < O_MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < O_NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[mt][nt][e] = 0.f;
}

// Q of batch bi (all BLOCK_M rows) into smem, by every thread.
template <typename Cfg>
__device__ __forceinline__ void qsmem_load_q(const DecodeParams& p, unsigned char* smem, int bi, int tid, int m_block,
                                             int g) {
  using QElement = typename Cfg::QElement;
  constexpr int BM = Cfg::BLOCK_M, NT = Cfg::NUM_THREADS, RC = Cfg::kRowChunks;
  const QElement* qb = reinterpret_cast<const QElement*>(p.q) + (long long)bi * p.q_stride_b;
#pragma unroll 6
  for (int it = 0; it < (Cfg::kQChunks + NT - 1) / NT; ++it) {
    const int idx = it * NT + tid;
    if (Cfg::kQChunks % NT == 0 || idx < Cfg::kQChunks) {
      const int lr = idx / RC, c = idx % RC;
      const int r = m_block * BM + lr;
      uint4 v = make_uint4(0u, 0u, 0u, 0u);  // padded rows are zero
      if (r < p.rows) {
        const auto [s, head] = query_row(p, g, r);
        const QElement* src = qb + s * p.q_stride_s + head * p.q_stride_h + c * 8;
        if constexpr (Cfg::kQFp8) {  // 8 e4m3 values, converted
          const uint2 w = __ldg(reinterpret_cast<const uint2*>(src));
          v = e4m3::oct_to<typename Cfg::Element, Cfg::kHwCvt>(w.x, w.y);
        } else {
          v = __ldg(reinterpret_cast<const uint4*>(src));
        }
      }
      *reinterpret_cast<uint4*>(smem + Cfg::kOffQ + swz<RC>(lr, c)) = v;
    }
  }
}

// Pair exchange through xS (x_st: this lane's slot of this warp, x_ld: this lane's float4 of warp 0):
// keep row tile kd, give row tile 1 - kd to warp ^ 1 (selects, not dynamic indexing), add what the
// partner gave.
template <typename Cfg>
__device__ __forceinline__ void qsmem_exchange_pairs(const float (&sp)[2][Cfg::S_NT][4], int kd, int warp,
                                                     unsigned x_st, unsigned x_ld, float (&s_acc)[Cfg::S_NT][4]) {
  constexpr int S_NT = Cfg::S_NT;
#pragma unroll
  for (int nt = 0; nt < S_NT; ++nt) {
    float give[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      give[e] = kd ? sp[0][nt][e] : sp[1][nt][e];
      s_acc[nt][e] = kd ? sp[1][nt][e] : sp[0][nt][e];
    }
    sts_f4(x_st + unsigned(nt * 32 * 16), give);
  }
  group_barrier_sync<Cfg::NUM_WARPS / 2, 2>(warp >> 1);
#pragma unroll
  for (int nt = 0; nt < S_NT; ++nt) {
    float v[4];
    lds_f4(v, x_ld + unsigned(((warp ^ 1) * S_NT + nt) * 32 * 16));
#pragma unroll
    for (int e = 0; e < 4; ++e) s_acc[nt][e] += v[e];
  }
}

// Quad reduce-scatter through xS: block b = (row tile b & 1, token group b >> 1) belongs to warp
// kd = b; s_acc gets this warp's block summed over the quad.
template <typename Cfg>
__device__ __forceinline__ void qsmem_exchange_quads(const float (&sp)[2][2 * Cfg::S_NT][4], int kd, int rg, int warp,
                                                     unsigned x_st, unsigned x_ld, float (&s_acc)[Cfg::S_NT][4]) {
  constexpr int S_NT = Cfg::S_NT, XS = Cfg::kXSlots;
  if constexpr (Cfg::kXRounds == 1) {
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      if (b == kd) {
#pragma unroll
        for (int nt = 0; nt < S_NT; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) s_acc[nt][e] = sp[b & 1][(b >> 1) * S_NT + nt][e];
      } else {
        const int slot = b < kd ? b : b - 1;
#pragma unroll
        for (int nt = 0; nt < S_NT; ++nt)
          sts_f4(x_st + unsigned((slot * S_NT + nt) * 32 * 16), sp[b & 1][(b >> 1) * S_NT + nt]);
      }
    }
    group_barrier_sync<Cfg::NUM_WARPS / 4, 4>(rg);
#pragma unroll
    for (int k2 = 0; k2 < 4; ++k2) {
      if (k2 != kd) {
        const int slot = kd < k2 ? kd : kd - 1;  // where warp k2 put block kd
#pragma unroll
        for (int nt = 0; nt < S_NT; ++nt) {
          float v[4];
          lds_f4(v, x_ld + unsigned((((4 * rg + k2) * 3 + slot) * S_NT + nt) * 32 * 16));
#pragma unroll
          for (int e = 0; e < 4; ++e) s_acc[nt][e] += v[e];
        }
      }
    }
  } else {
    // Round 1, with warp kd ^ 2 (the other token group): publish the two blocks of the other
    // token group (slot = row tile), add the partner's two blocks of this one.
    const int tg = kd >> 1;
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
      for (int nt = 0; nt < S_NT; ++nt) {
        float give[4];  // element-wise selects: a select of two array references goes to local memory
#pragma unroll
        for (int e = 0; e < 4; ++e) give[e] = tg ? sp[mi][nt][e] : sp[mi][S_NT + nt][e];
        sts_f4(x_st + unsigned((mi * S_NT + nt) * 32 * 16), give);
      }
    group_barrier_sync<Cfg::NUM_WARPS / 4, 4>(rg);
    float kept[2][S_NT][4];
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
      for (int nt = 0; nt < S_NT; ++nt) {
        float v[4];
        lds_f4(v, x_ld + unsigned((((warp ^ 2) * XS + mi) * S_NT + nt) * 32 * 16));
#pragma unroll
        for (int e = 0; e < 4; ++e) kept[mi][nt][e] = (tg ? sp[mi][S_NT + nt][e] : sp[mi][nt][e]) + v[e];
      }
    group_barrier_sync<Cfg::NUM_WARPS / 4, 4>(rg);  // the partner read this warp's slots
    // Round 2, with warp kd ^ 1 (the other row tile): publish its row tile, keep this one.
    const int mine = kd & 1;
#pragma unroll
    for (int nt = 0; nt < S_NT; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s_acc[nt][e] = mine ? kept[1][nt][e] : kept[0][nt][e];
      float give[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) give[e] = mine ? kept[0][nt][e] : kept[1][nt][e];
      sts_f4(x_st + unsigned(nt * 32 * 16), give);
    }
    group_barrier_sync<Cfg::NUM_WARPS / 4, 4>(rg);
#pragma unroll
    for (int nt = 0; nt < S_NT; ++nt) {
      float v[4];
      lds_f4(v, x_ld + unsigned(((warp ^ 1) * XS * S_NT + nt) * 32 * 16));
#pragma unroll
      for (int e = 0; e < 4; ++e) s_acc[nt][e] += v[e];
    }
  }
}

// Mask (select: NaN never survives) of this warp's S block of the tile starting at token tok, and
// its local row maxima into red_max[wn][row] (s_col0: the thread's first S column, q_row0: its
// first row).
template <typename Cfg>
__device__ __forceinline__ void qsmem_mask_row_max(float (&s_acc)[Cfg::S_NT][4], int tok, const int (&lim)[2],
                                                   int s_col0, int q_row0, int wn, int lane, float* red_max,
                                                   unsigned s_flags) {
  constexpr int BM = Cfg::BLOCK_M, BN = Cfg::BLOCK_N, S_NT = Cfg::S_NT;
  if constexpr (Cfg::kSparse) {  // the stage's valid flags (s_flags: its first token's byte)
#pragma unroll
    for (int nt = 0; nt < S_NT; ++nt) {
      unsigned short f2;
      asm volatile("ld.shared.u16 %0, [%1];\n" : "=h"(f2) : "r"(s_flags + unsigned(s_col0 + nt * 8)));
#pragma unroll
      for (int e = 0; e < 4; ++e)
        if (((f2 >> (8 * (e & 1))) & 0xff) == 0) s_acc[nt][e] = -kInf;
    }
  } else if (tok + BN > min(lim[0], lim[1])) {
#pragma unroll
    for (int nt = 0; nt < S_NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int t = tok + s_col0 + nt * 8 + (e & 1);
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
}

// Online softmax (log2 domain) with the rows' maxima over all token groups (red_max, after
// barrier B): P -> smem, the O rescale of each row -> row_scale, and at a piece's last tile the
// group's row sums -> red_sum.
template <typename Cfg>
__device__ __forceinline__ void qsmem_softmax(float scale_log2, const float (&s_acc)[Cfg::S_NT][4],
                                              float (&m_run)[2], float (&l_part)[2], int q_row0, int s_col0, int wn,
                                              int lane, bool last, unsigned char* smem) {
  using Element = typename Cfg::Element;
  constexpr int BM = Cfg::BLOCK_M, WN = Cfg::WN, S_NT = Cfg::S_NT, PRC = Cfg::kPRowChunks;
  unsigned char* p_gen = smem + Cfg::kOffP;
  const float* red_max = reinterpret_cast<const float*>(smem + Cfg::kOffRedMax);
  float* red_sum = reinterpret_cast<float*>(smem + Cfg::kOffRedSum);
  float* row_scale = reinterpret_cast<float*>(smem + Cfg::kOffRowScale);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = q_row0 + 8 * h;
    float mx = red_max[row];
#pragma unroll
    for (int j = 1; j < WN; ++j) mx = fmaxf(mx, red_max[j * BM + row]);
    const float m_new = fmaxf(m_run[h], mx * scale_log2);
    const float m_use = m_new == -kInf ? 0.f : m_new;  // avoid (-inf) - (-inf)
    const float sc = exp2f(m_run[h] - m_use);
    m_run[h] = m_new;
    float sum = 0.f;
#pragma unroll
    for (int nt = 0; nt < S_NT; ++nt) {
      const float p0 = exp2f(fmaf(s_acc[nt][2 * h], scale_log2, -m_use));
      const float p1 = exp2f(fmaf(s_acc[nt][2 * h + 1], scale_log2, -m_use));
      sum += p0 + p1;
      const int col = s_col0 + nt * 8;
      *reinterpret_cast<unsigned*>(p_gen + swz<PRC>(row, col / 8) + (col % 8) * 2) = ElemTraits<Element>::pack2(p0, p1);
    }
    l_part[h] = l_part[h] * sc + sum;
    if (wn == 0 && (lane & 3) == 0) row_scale[row] = sc;
    if constexpr (Cfg::kSparse) {  // the epilogue's sink and max_logits need every row's max
      if (last && wn == 0 && (lane & 3) == 0) reinterpret_cast<float*>(smem + Cfg::kOffRowMax)[row] = m_new;
    }
    if (last) {
      float l = l_part[h];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      if ((lane & 3) == 0) red_sum[wn * BM + row] = l;
    }
  }
}

// O = O * row_scale + P V for the tile in stage sKt: this warp's O_MT x O_NT fragments (P from
// smem at sP, V through ldmatrix.trans; v_lane: the lane's V B-fragment offset).
template <typename Cfg, int O_MT, int O_NT>
__device__ __forceinline__ void qsmem_pv_tile(float (&o)[O_MT][O_NT][4], unsigned sKt, unsigned sP, const float* row_scale,
                                              unsigned v_lane, int lane) {
  using Element = typename Cfg::Element;
  constexpr int BN = Cfg::BLOCK_N, RC = Cfg::kRowChunks, PRC = Cfg::kPRowChunks;
  const int a_chk = lane / 16;
  {
    float scl[O_MT][2];
    bool rescale = false;
#pragma unroll
    for (int mt = 0; mt < O_MT; ++mt) {
      scl[mt][0] = row_scale[mt * 16 + lane / 4];
      scl[mt][1] = row_scale[mt * 16 + lane / 4 + 8];
      rescale |= scl[mt][0] != 1.f || scl[mt][1] != 1.f;
    }
    if (__any_sync(0xffffffffu, rescale)) {
#pragma unroll
      for (int mt = 0; mt < O_MT; ++mt) {
#pragma unroll
        for (int nt = 0; nt < O_NT; ++nt) {
          o[mt][nt][0] *= scl[mt][0];
          o[mt][nt][1] *= scl[mt][0];
          o[mt][nt][2] *= scl[mt][1];
          o[mt][nt][3] *= scl[mt][1];
        }
      }
    }
  }
#pragma unroll
  for (int kt = 0; kt < BN / 16; ++kt) {
    unsigned a[O_MT][4];
#pragma unroll
    for (int mt = 0; mt < O_MT; ++mt) ldsm_x4(a[mt], sP + swz<PRC>(mt * 16 + (lane % 16), kt * 2 + a_chk));
#pragma unroll
    for (int np = 0; np < O_NT / 2; ++np) {
      unsigned b[4];
      // chunk o_col0 / 8 + 2 np + a_chk: low bits 2 (np % 4) + a_chk, high (np / 4) * 8
      ldsm_x4_trans(b, sKt + (v_lane ^ unsigned(32 * (np % 4))) + unsigned((np / 4) * 128 + kt * 16 * RC * 16));
#pragma unroll
      for (int mt = 0; mt < O_MT; ++mt) {
        Mma<Element>::run(o[mt][2 * np], a[mt], b[0], b[1]);
        Mma<Element>::run(o[mt][2 * np + 1], a[mt], b[2], b[3]);
      }
    }
  }
}

// A finished piece: O rows / l into out or o_accum, the LSE, then fresh state for the next one
// (l: the rows' sums over the token groups, red_sum; o_col0: this warp's first O column).
template <typename Cfg, int O_MT, int O_NT>
__device__ __forceinline__ void qsmem_finish_piece(const DecodeParams& p, const int* meta, int bi, bool first_piece,
                                                   float (&o)[O_MT][O_NT][4], float (&m_run)[2], float (&l_part)[2],
                                                   const float* red_sum, int o_col0, int q_row0, int wn, int lane,
                                                   float v_scale) {
  constexpr int BM = Cfg::BLOCK_M, DV = Cfg::HEAD_DIM_V, WN = Cfg::WN;
  const int g = blockIdx.y, m_block = blockIdx.z;
  const PieceDest dest = piece_dest(p, bi, first_piece ? __ldg(meta + kMetaBeginSplit) : 0);
  const int col_base = o_col0 + (lane % 4) * 2;
  const float* row_max = red_sum + (Cfg::kOffRowMax - Cfg::kOffRedSum) / 4;  // (sparse only)
#pragma unroll
  for (int mt = 0; mt < O_MT; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int lr = mt * 16 + lane / 4 + 8 * h;
      const int r = m_block * BM + lr;
      if (r >= p.rows) continue;
      float l = red_sum[lr];
#pragma unroll
      for (int j = 1; j < WN; ++j) l += red_sum[j * BM + lr];
      float inv_l = l > 0.f ? v_scale / l : 0.f;
      if constexpr (Cfg::kSparse) {  // a single split is the final out: the attention sink applies here
        if (dest.single) inv_l *= sink_factor(p, query_row(p, g, r).head, row_max[lr] + log2f(l));
      }
      store_o_row<typename Cfg::OutElement, DV>(p, dest, bi, g, r, col_base, o[mt], h, inv_l);
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
        store_piece_lse<Cfg::kSparse>(p, dest, bi, g, r, l > 0.f ? m_run[h] + log2f(l) : -kInf);
        if constexpr (Cfg::kSparse) store_max_logit(p, dest, bi, g, r, m_run[h]);
      }
    }
  }
  clear_o(o);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    m_run[h] = -kInf;
    l_part[h] = 0.f;
  }
}

}  // namespace sm80

// Per KV tile: wait for it, barrier A, refill the freed stage, partial S and its exchange, mask and
// row maxima, barrier B, softmax (P -> smem), barrier C, P V; at a piece's end its epilogue. The
// partial S MMA loops stay inline and O / m_run / l_part / lim stay separate locals (no state
// struct): either change moved ptxas's register assignment of this ~250-register kernel by a few
// moves, on some targets for the worse.
template <typename Cfg>
__device__ __forceinline__ void mla_splitkv_sm80_qsmem(const DecodeParams& p, const typename Cfg::CacheT* k_cache) {
  using Element = typename Cfg::Element;
  constexpr int BM = Cfg::BLOCK_M, BN = Cfg::BLOCK_N;
  constexpr int NS = Cfg::NUM_STAGES;
  constexpr int WN = Cfg::WN, WARP_N = Cfg::WARP_N, WARP_DV = Cfg::WARP_DV;
  constexpr int RC = Cfg::kRowChunks;
  constexpr int S_NT = Cfg::S_NT;     // n8 tiles of S per warp
  constexpr int O_MT = Cfg::WM;       // m16 tiles of O per warp (all BLOCK_M rows)
  constexpr int O_NT = WARP_DV / 8;   // n8 tiles of O per warp

  extern __shared__ __align__(128) unsigned char smem[];
  const unsigned s_base = sm80::smem_u32(smem);
  const unsigned sQ = s_base + Cfg::kOffQ;
  const unsigned sKV = s_base + Cfg::kOffKV;
  const unsigned sP = s_base + Cfg::kOffP;
  const unsigned sX = s_base + Cfg::kOffP;  // xS shares P's region (disjoint lifetimes, see header)
  const unsigned sAux = s_base + Cfg::kOffLand;  // sparse: the tokens' valid flags
  float* red_max = reinterpret_cast<float*>(smem + Cfg::kOffRedMax);
  float* red_sum = reinterpret_cast<float*>(smem + Cfg::kOffRedSum);
  float* row_scale = reinterpret_cast<float*>(smem + Cfg::kOffRowScale);

  const int tid = threadIdx.x;
  const int warp = tid / 32, lane = tid % 32;
  // QK roles. Pairs (KD 2): warp w = (rg, wn, kd) computes rows [32 rg, +32) x tokens of group wn
  // over d half kd and then owns row tile wm = 2 rg + kd. Quads (KD 4): warp w = (rg, kd) computes
  // rows [32 rg, +32) x all tokens over d quarter kd and then owns block kd: row tile
  // wm = 2 rg + (kd & 1), token group wn = kd >> 1.
  constexpr int KD = Cfg::kQKSplit;
  const int kd = warp % KD;
  const int rg = KD == 2 ? warp / (2 * WN) : warp / 4;
  const int wn = KD == 2 ? (warp >> 1) % WN : kd >> 1;
  const int wm = KD == 2 ? 2 * rg + kd : 2 * rg + (kd & 1);
  const int part = blockIdx.x, g = blockIdx.y, m_block = blockIdx.z;

  const int o_col0 = warp * WARP_DV;  // first O column of this warp

  const int* meta = p.tile_scheduler_metadata + part * kMetaSize;
  const auto seqlens = sm80::lengths_of<Cfg::kSparse>(p);

  const sm80::Scales scales = sm80::scales_of<Cfg>(p);

  sm80::KVProducer<Cfg> prod;
  prod.init(meta, seqlens, p, tid);
  // The first tiles are issued after the first piece's Q loads (below): issued first, every CTA's
  // KV loads queue ahead of Q's (as in the sm90 ws kernel).
  bool kv_started = false;

  // ------------------------------------------------------------------ consumer state
  sm80::LeanCursor cur;
  cur.init(meta, seqlens);

  float o[O_MT][O_NT][4];  // all BLOCK_M rows x this warp's WARP_DV columns of O
  sm80::clear_o(o);

  // QK-layout rows of this thread (after the pair exchange): local rows q_row0 and q_row0 + 8.
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
  // Q A fragment (x4: rows 0-15 of m16 tile mi of the group's 32 rows, chunks 8 j + 4 kd + 2 u + {0, 1}
  // for pairs, 8 j + 2 kd + {0, 1} for quads).
  const unsigned q_base = sQ + unsigned(rg * 32 + (lane % 16)) * RC * 16;
  unsigned q_off[2];
#pragma unroll
  for (int u = 0; u < 2; ++u)
    q_off[u] = q_base + unsigned((((KD == 2 ? 4 * kd + 2 * u : 2 * kd) + a_chk) ^ r7) * 16);
  // K B fragment. Pairs: x4 = 8 tokens x chunks 8 j + 4 kd + {0..3} (k32 of one n8 tile). Quads:
  // x4 = tokens 16 np + {0..7, 8..15} x chunks 8 j + 2 kd + {0, 1} (k16 of two n8 tiles).
  const unsigned k_off =
      KD == 2 ? unsigned(wn * WARP_N + r7) * RC * 16 + unsigned(((4 * kd + lane / 8) ^ r7) * 16)
              : unsigned((8 * (lane / 16) + r7) * RC) * 16u + unsigned(((2 * kd + (lane / 8) % 2) ^ r7) * 16);
  // V B fragment (x4.trans: tokens 0-15 of a k16 step x 2 n8 tiles).
  const unsigned v_base = unsigned((lane % 8) + 8 * ((lane / 8) % 2)) * RC * 16 + unsigned(o_col0 / 8) * 16;
  // Chunk low bits a_chk + 2u = a_chk ^ 2u, and v_base is a multiple of 128 bytes: the swizzled
  // offset of column pair u is v_lane ^ 32u (one register, not four).
  const unsigned v_lane = v_base + unsigned((a_chk ^ r7) * 16);
  // xS: float4 [warp][slot][n8 tile][lane]. Pairs: one slot, the row tile a warp gives away (read by
  // warp ^ 1). One-round quads: slots 0..2 = the blocks b != kd in increasing b (block b is owned by
  // warp kd = b). Two-round quads: slots 0..1 = the row tiles of round 1, slot 0 again in round 2.
  constexpr int XS = Cfg::kXSlots;
  const unsigned x_st = sX + unsigned(warp * XS * S_NT * 32 + lane) * 16u;
  const unsigned x_ld = sX + unsigned(lane) * 16u;

  bool piece_start = true;
  int stage = 0, land = 0;  // tile n's K stage and (e4m3 cache) landing slot
  sm80::PhaseTrace<Cfg::NUM_WARPS> phases(warp, lane);
  while (cur.valid()) {
    if (piece_start) {
      // Safe: every warp finished reading the previous Q (S of the previous tile) before barrier B
      // of that tile. Visible to all after barrier A below.
      sm80::qsmem_load_q<Cfg>(p, smem, cur.bi, tid, m_block, g);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = m_block * BM + q_row0 + 8 * h;
        // Causal, bottom-right aligned: query s sees keys < L - s_q + s + 1. Never past the piece.
        const int lc = p.causal ? cur.L - p.s_q + r / p.q_per_kv + 1 : cur.L;
        lim[h] = min(lc, cur.stop);
      }
      piece_start = false;
      if (!kv_started) {
        sm80::start_kv<Cfg>(prod, p, k_cache, sKV, g, seqlens, sAux, tid);
        kv_started = true;
      }
    }

    phases.mark(0);
    // This thread's copies of tile n landed (converted a tile ahead: of tile n + 1, converted below).
    sm80::cp_async_wait<Cfg::kPendingAtA>();
    __syncthreads();                // A: everyone's copies of tile n (and Q) are visible; stage n-1, P free
    phases.mark(1);
    sm80::refill_and_convert<Cfg>(prod, p, k_cache, sKV, g, seqlens, sAux, stage, land, tid);

    const unsigned sK = sKV + unsigned(stage) * unsigned(Cfg::kStageBytes);
    const bool last = cur.tok + BN >= cur.stop;

    float s_acc[S_NT][4];  // S of row tile wm x token group wn, after the exchange
    if constexpr (KD == 2) {
      // ---------------- partial S = Q K^T (32 rows x WARP_N over half of d per warp) ----------------
      float sp[2][S_NT][4];
#pragma unroll
      for (int mi = 0; mi < 2; ++mi)
#pragma unroll
        for (int nt = 0; nt < S_NT; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) sp[mi][nt][e] = 0.f;
#pragma unroll
      for (int j = 0; j < RC / 8; ++j) {
        unsigned a[2][2][4];
#pragma unroll
        for (int mi = 0; mi < 2; ++mi)
#pragma unroll
          for (int u = 0; u < 2; ++u) sm80::ldsm_x4(a[mi][u], q_off[u] + unsigned(mi * 16 * RC * 16 + j * 128));
#pragma unroll
        for (int nt = 0; nt < S_NT; ++nt) {
          unsigned b[4];
          sm80::ldsm_x4(b, sK + k_off + unsigned(nt * 8 * RC * 16 + j * 128));
#pragma unroll
          for (int mi = 0; mi < 2; ++mi) {
            sm80::Mma<Element>::run(sp[mi][nt], a[mi][0], b[0], b[1]);
            sm80::Mma<Element>::run(sp[mi][nt], a[mi][1], b[2], b[3]);
          }
        }
      }
      phases.mark(2);
      sm80::qsmem_exchange_pairs<Cfg>(sp, kd, warp, x_st, x_ld, s_acc);
    } else {
      // ---------------- partial S = Q K^T (32 rows x BLOCK_N over a quarter of d per warp) ----------------
      float sp[2][2 * S_NT][4];  // [m16 tile][n8 tile of the whole tile]
#pragma unroll
      for (int mi = 0; mi < 2; ++mi)
#pragma unroll
        for (int nt = 0; nt < 2 * S_NT; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) sp[mi][nt][e] = 0.f;
#pragma unroll
      for (int j = 0; j < RC / 8; ++j) {
        unsigned a[2][4];
#pragma unroll
        for (int mi = 0; mi < 2; ++mi) sm80::ldsm_x4(a[mi], q_off[0] + unsigned(mi * 16 * RC * 16 + j * 128));
#pragma unroll
        for (int np = 0; np < S_NT; ++np) {
          unsigned b[4];
          sm80::ldsm_x4(b, sK + k_off + unsigned(np * 16 * RC * 16 + j * 128));
#pragma unroll
          for (int mi = 0; mi < 2; ++mi) {
            sm80::Mma<Element>::run(sp[mi][2 * np], a[mi], b[0], b[1]);
            sm80::Mma<Element>::run(sp[mi][2 * np + 1], a[mi], b[2], b[3]);
          }
        }
      }
      phases.mark(2);
      sm80::qsmem_exchange_quads<Cfg>(sp, kd, rg, warp, x_st, x_ld, s_acc);
    }

    phases.mark(3);
    sm80::qsmem_mask_row_max<Cfg>(s_acc, cur.tok, lim, s_col0, q_row0, wn, lane, red_max,
                                  sAux + unsigned(Cfg::kLandBytes + stage * BN));
    __syncthreads();  // B: row maxima of all warps visible; every xS read done (P may overwrite it)
    phases.mark(4);

    sm80::qsmem_softmax<Cfg>(scales.s_log2, s_acc, m_run, l_part, q_row0, s_col0, wn, lane, last, smem);
    __syncthreads();  // C: P, row_scale (and red_sum) visible
    phases.mark(5);

    sm80::qsmem_pv_tile<Cfg>(o, sK, sP, row_scale, v_lane, lane);
    if (last) {
      sm80::qsmem_finish_piece<Cfg>(p, meta, cur.bi, cur.first_piece(meta), o, m_run, l_part, red_sum, o_col0,
                                    q_row0, wn, lane, scales.v);
    }
    phases.mark(6);
    phases.next_tile();
    if (last) piece_start = true;
    stage = stage + 1 == Cfg::kKStages ? 0 : stage + 1;
    cur.template advance<BN>(meta, seqlens);
  }
  sm80::cp_async_wait<0>();
}

template <typename Cfg>
__device__ __forceinline__ void mla_splitkv_sm80_body(const DecodeParams& p, const typename Cfg::CacheT* k_cache) {
  if constexpr (Cfg::kQInRegs)
    mla_splitkv_sm80_qregs<Cfg>(p, k_cache);
  else
    mla_splitkv_sm80_qsmem<Cfg>(p, k_cache);
}

}  // namespace decode
}  // namespace mla_jit
