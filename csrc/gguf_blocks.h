// GGUF's tensor types as the kernels read them in place: the type ids, the block layouts and the
// integer helpers the dequantization and the dot products share.
//
// Layouts after ggml (ggml/src/ggml-common.h: block_q4_0 ... block_q6_K) and gguf-py
// (gguf/constants.py: GGML_QUANT_SIZES). A row of K values of a quantized type is K / block_size
// blocks of type_size bytes, little-endian; scales are IEEE binary16 bit patterns. A tensor's
// data is 32-byte aligned in a GGUF file but a row need not be (Q4_0 rows are multiples of 18
// bytes), so every multi-byte field is read with memcpy.
#pragma once

#include <cstdint>
#include <cstring>

namespace zerolayer {
namespace gguf {

// ggml_type ids (ggml.h), as GGUF files store them.
enum TypeId : int32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kBF16 = 30,
};

// How the bfloat16-x kernels multiply a type: float FMA, or integer dot products against x
// quantized per block of 32 (Q8_0) or of 256 with 16-element sums (Q8_K).
enum class Domain { kFloat, kQ8_0, kQ8_K };

struct TypeInfo {
  int32_t id;
  const char* name;
  int64_t block_size;  // values per block
  int64_t type_size;   // bytes per block
  Domain domain;
};

// The type with ggml id `id`, or nullptr for one these kernels do not take.
const TypeInfo* type_info(int32_t id);

// Bytes of one row of k values of `info` (k a multiple of its block size).
inline int64_t row_bytes(const TypeInfo& info, int64_t k) {
  return k / info.block_size * info.type_size;
}

constexpr int64_t kQK = 32;    // values per block of the 32-element types (QK4_0 ... QK8_0)
constexpr int64_t kQKK = 256;  // values per super-block of the K-quants (QK_K)

struct BlockQ4_0 {
  uint16_t d;
  uint8_t qs[16];  // value j < 16 in the low nibble of qs[j], j >= 16 in the high one of qs[j-16]
};
struct BlockQ4_1 {
  uint16_t d, m;
  uint8_t qs[16];
};
struct BlockQ5_0 {
  uint16_t d;
  uint8_t qh[4];  // bit j: the fifth bit of value j
  uint8_t qs[16];
};
struct BlockQ5_1 {
  uint16_t d, m;
  uint8_t qh[4];
  uint8_t qs[16];
};
struct BlockQ8_0 {
  uint16_t d;
  int8_t qs[32];
};
// 8 sub-blocks of 32, each with a 6-bit scale and min packed in `scales` (get_scale_min).
struct BlockQ4_K {
  uint16_t d, dmin;
  uint8_t scales[12];
  uint8_t qs[128];  // 64 values per 32 bytes: sub-block 2c in the low nibbles, 2c + 1 the high
};
struct BlockQ5_K {
  uint16_t d, dmin;
  uint8_t scales[12];
  uint8_t qh[32];  // bit j of qh[l]: the fifth bit of value l of sub-block j
  uint8_t qs[128];
};
// 16 sub-blocks of 16 with int8 scales; values 6-bit, offset by 32.
struct BlockQ6_K {
  uint8_t ql[128];
  uint8_t qh[64];
  int8_t scales[16];
  uint16_t d;
};

static_assert(sizeof(BlockQ4_0) == 18 && sizeof(BlockQ4_1) == 20, "ggml block sizes");
static_assert(sizeof(BlockQ5_0) == 22 && sizeof(BlockQ5_1) == 24, "ggml block sizes");
static_assert(sizeof(BlockQ8_0) == 34 && sizeof(BlockQ4_K) == 144, "ggml block sizes");
static_assert(sizeof(BlockQ5_K) == 176 && sizeof(BlockQ6_K) == 210, "ggml block sizes");

// The float16 field at p (any alignment) as float32.
inline float fp16_to_fp32(uint16_t h);
inline float half_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, sizeof(h));
  return fp16_to_fp32(h);
}

// IEEE binary16 bits to float32, exactly (subnormals, infinities and NaN payloads included).
inline float fp16_to_fp32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu;
  uint32_t bits;
  if (exponent == 0x1fu) {
    bits = sign | 0x7f800000u | (mantissa << 13);
  } else if (exponent != 0) {
    bits = sign | ((exponent + 112u) << 23) | (mantissa << 13);
  } else {
    // zero or subnormal: mantissa * 2^-24, exact in float32
    float f = static_cast<float>(mantissa) * 0x1p-24f;
    std::memcpy(&bits, &f, sizeof(bits));
    bits |= sign;
  }
  float out;
  std::memcpy(&out, &bits, sizeof(out));
  return out;
}

// The 8 six-bit scales and mins of a Q4_K/Q5_K block's 12 packed bytes (ggml-quants.c:
// get_scale_min_k4): scale j < 4 is the low 6 bits of byte j, min j < 4 of byte j + 4; scale
// j >= 4 is byte j + 4's low nibble with byte j - 4's top 2 bits above, min j >= 4 its high
// nibble with byte j's top 2 bits. Four bytes at a time, as 32-bit words.
inline void scales_and_mins(const uint8_t* packed, uint8_t* scales, uint8_t* mins) {
  uint32_t u[3];
  std::memcpy(u, packed, sizeof(u));
  const uint32_t low6 = 0x3f3f3f3fu, nibble = 0x0f0f0f0fu, top2 = 0x03030303u;
  const uint32_t s[2] = {u[0] & low6, (u[2] & nibble) | (((u[0] >> 6) & top2) << 4)};
  const uint32_t m[2] = {u[1] & low6, ((u[2] >> 4) & nibble) | (((u[1] >> 6) & top2) << 4)};
  std::memcpy(scales, s, sizeof(s));
  std::memcpy(mins, m, sizeof(m));
}

}  // namespace gguf
}  // namespace zerolayer
