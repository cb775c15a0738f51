// mla_jit decode: the layout of a token's record in the sparse (DSA) kernels' FP8 cache, a type the
// kernel configs take as a template parameter (splitkv_ws.cuh, splitkv_sm80.cuh).
//
// DeepSeek V3.2 (FlashMLA's layout, 656 bytes): 512 e4m3 "nope" values, one float32 scale per 128
// of them, then the 64 bf16 rope values (the key's rotary part, not quantized). The kernels' thread
// mappings are written for this geometry and static_assert it; DeepSeek V4's 584-byte record (448
// e4m3 + 64 bf16 rope, e8m0 scales kept per page rather than per token) is the next layout: a second
// type, and kernels mapping threads onto it.
#pragma once

namespace mla_jit {
namespace decode {

struct V32Record {
  static constexpr int kNopeValues = 512;      // e4m3, from byte 0
  static constexpr int kValuesPerScale = 128;  // one float32 scale each
  static constexpr int kRopeValues = 64;       // bf16
  static constexpr int kScaleOffset = kNopeValues;                                     // bytes
  static constexpr int kRopeOffset = kScaleOffset + kNopeValues / kValuesPerScale * 4;   // 528
  static constexpr int kBytes = kRopeOffset + kRopeValues * 2;                          // 656
  static_assert(kBytes == 656 && kRopeOffset % 16 == 0 && kBytes % 16 == 0, "16-byte chunks");
};

}  // namespace decode
}  // namespace mla_jit
