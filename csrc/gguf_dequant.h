// The dequantization of GGUF blocks to float32, with gguf-py's roundings (gguf/quants.py:
// dequantize_blocks; the arithmetic of ggml-quants.c's dequantize_row_*): every product and sum
// rounded to float32 in that order, so the values are bit-exact. Included by each instruction
// set's translation unit (gguf_isa.h, gguf_portable.cpp) inside its own namespace, under
// `#pragma GCC optimize("fp-contract=off")`: a fused d * q - m would round once, not twice.
// No include guard, on purpose; gguf_blocks.h is included before.

// One block at p into y[0 .. block_size).
inline void dequant_q4_0(const uint8_t* p, float* y) {
  const auto b = load_block<BlockQ4_0>(p);
  const float d = fp16_to_fp32(b.d);
  for (int j = 0; j < 16; ++j) {
    y[j] = d * static_cast<float>((b.qs[j] & 0xF) - 8);
    y[j + 16] = d * static_cast<float>((b.qs[j] >> 4) - 8);
  }
}

inline void dequant_q4_1(const uint8_t* p, float* y) {
  const auto b = load_block<BlockQ4_1>(p);
  const float d = fp16_to_fp32(b.d), m = fp16_to_fp32(b.m);
  for (int j = 0; j < 16; ++j) {
    y[j] = d * static_cast<float>(b.qs[j] & 0xF) + m;
    y[j + 16] = d * static_cast<float>(b.qs[j] >> 4) + m;
  }
}

// The fifth bits of a Q5 block's 32 values, as 0 or 16.
inline void high_bits_q5(const uint8_t* qh_bytes, int* high) {
  uint32_t qh;
  std::memcpy(&qh, qh_bytes, sizeof(qh));
  for (int j = 0; j < 32; ++j) high[j] = static_cast<int>((qh >> j) & 1u) << 4;
}

inline void dequant_q5_0(const uint8_t* p, float* y) {
  const auto b = load_block<BlockQ5_0>(p);
  const float d = fp16_to_fp32(b.d);
  int high[32];
  high_bits_q5(b.qh, high);
  for (int j = 0; j < 16; ++j) {
    y[j] = d * static_cast<float>(((b.qs[j] & 0xF) | high[j]) - 16);
    y[j + 16] = d * static_cast<float>(((b.qs[j] >> 4) | high[j + 16]) - 16);
  }
}

inline void dequant_q5_1(const uint8_t* p, float* y) {
  const auto b = load_block<BlockQ5_1>(p);
  const float d = fp16_to_fp32(b.d), m = fp16_to_fp32(b.m);
  int high[32];
  high_bits_q5(b.qh, high);
  for (int j = 0; j < 16; ++j) {
    y[j] = d * static_cast<float>((b.qs[j] & 0xF) | high[j]) + m;
    y[j + 16] = d * static_cast<float>((b.qs[j] >> 4) | high[j + 16]) + m;
  }
}

inline void dequant_q8_0(const uint8_t* p, float* y) {
  const auto b = load_block<BlockQ8_0>(p);
  const float d = fp16_to_fp32(b.d);
  for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(b.qs[j]) * d;
}

// Q4_K and Q5_K (kFive): value l of sub-block j is (d * scale_j) * q - (dmin * min_j).
template <bool kFive>
inline void dequant_q45_k(const uint8_t* p, float* y) {
  const float d = fp16_to_fp32(load_block<uint16_t>(p));
  const float dmin = fp16_to_fp32(load_block<uint16_t>(p + 2));
  uint8_t scales[8], mins[8];
  scales_and_mins(p + 4, scales, mins);
  const uint8_t* qh = p + 16;  // Q5_K only
  const uint8_t* qs = p + (kFive ? 48 : 16);
  for (int c = 0; c < 4; ++c) {
    const float d_lo = d * static_cast<float>(scales[2 * c]);
    const float m_lo = dmin * static_cast<float>(mins[2 * c]);
    const float d_hi = d * static_cast<float>(scales[2 * c + 1]);
    const float m_hi = dmin * static_cast<float>(mins[2 * c + 1]);
    const uint8_t* q = qs + 32 * c;
    for (int l = 0; l < 32; ++l) {
      int lo = q[l] & 0xF, hi = q[l] >> 4;
      if (kFive) {
        lo |= ((qh[l] >> (2 * c)) & 1) << 4;
        hi |= ((qh[l] >> (2 * c + 1)) & 1) << 4;
      }
      y[64 * c + l] = d_lo * static_cast<float>(lo) - m_lo;
      y[64 * c + 32 + l] = d_hi * static_cast<float>(hi) - m_hi;
    }
  }
}

// Q6_K: value i is (d * scale_{i / 16}) * (q - 32), q = 4 low bits from ql, 2 high from qh.
inline void dequant_q6_k(const uint8_t* p, float* y) {
  const auto b = load_block<BlockQ6_K>(p);
  const float d = fp16_to_fp32(b.d);
  for (int half = 0; half < 2; ++half) {
    const uint8_t* ql = b.ql + 64 * half;
    const uint8_t* qh = b.qh + 32 * half;
    float* out = y + 128 * half;
    const int8_t* sc = b.scales + 8 * half;
    for (int l = 0; l < 32; ++l) {
      const int q0 = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) - 32;
      const int q1 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
      const int q2 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      const int q3 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      const int s = l / 16;
      out[l] = (d * static_cast<float>(sc[s])) * static_cast<float>(q0);
      out[l + 32] = (d * static_cast<float>(sc[s + 2])) * static_cast<float>(q1);
      out[l + 64] = (d * static_cast<float>(sc[s + 4])) * static_cast<float>(q2);
      out[l + 96] = (d * static_cast<float>(sc[s + 6])) * static_cast<float>(q3);
    }
  }
}

// Blocks [first, first + count) of a row of `type` into y (float types: a block is one value).
// The F16 values go through ZL_GGUF_F16_TO_F32 (count values from src into y) where the
// includer defines one (F16C), else the exact bit conversion.
inline void dequantize_blocks(int32_t type, const uint8_t* row, int64_t first, int64_t count,
                              float* y) {
  switch (type) {
    case kF32:
      std::memcpy(y, row + first * 4, count * sizeof(float));
      return;
    case kF16: {
      const uint8_t* src = row + first * 2;
#ifdef ZL_GGUF_F16_TO_F32
      ZL_GGUF_F16_TO_F32(src, count, y);
#else
      for (int64_t i = 0; i < count; ++i) {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, sizeof(h));
        y[i] = fp16_to_fp32(h);
      }
#endif
      return;
    }
    case kBF16:
      for (int64_t i = 0; i < count; ++i) {
        uint16_t h;
        std::memcpy(&h, row + (first + i) * 2, sizeof(h));
        const uint32_t u = static_cast<uint32_t>(h) << 16;
        std::memcpy(y + i, &u, sizeof(u));
      }
      return;
    default:
      break;
  }
  void (*block)(const uint8_t*, float*) = nullptr;
  int64_t size = 0, values = kQK;
  switch (type) {
    case kQ4_0: block = dequant_q4_0, size = sizeof(BlockQ4_0); break;
    case kQ4_1: block = dequant_q4_1, size = sizeof(BlockQ4_1); break;
    case kQ5_0: block = dequant_q5_0, size = sizeof(BlockQ5_0); break;
    case kQ5_1: block = dequant_q5_1, size = sizeof(BlockQ5_1); break;
    case kQ8_0: block = dequant_q8_0, size = sizeof(BlockQ8_0); break;
    case kQ4_K: block = dequant_q45_k<false>, size = sizeof(BlockQ4_K), values = kQKK; break;
    case kQ5_K: block = dequant_q45_k<true>, size = sizeof(BlockQ5_K), values = kQKK; break;
    case kQ6_K: block = dequant_q6_k, size = sizeof(BlockQ6_K), values = kQKK; break;
    default: return;  // the callers check the type first
  }
  for (int64_t i = 0; i < count; ++i) block(row + (first + i) * size, y + i * values);
}

// Row `row` (k values) of `type` into out32, or rounded to bfloat16 into out16.
inline void dequantize_row_to(int32_t type, const uint8_t* row, int64_t k, float* out32,
                              uint16_t* out16) {
  const TypeInfo* info = type_info(type);
  if (out32 != nullptr) {
    dequantize_blocks(type, row, 0, k / info->block_size, out32);
    return;
  }
  constexpr int64_t kChunk = 1024;  // values per pass through a float32 buffer on the stack
  float buf[kChunk];
  const int64_t per_chunk = kChunk / info->block_size * info->block_size;
  for (int64_t j = 0; j < k; j += per_chunk) {
    const int64_t len = k - j < per_chunk ? k - j : per_chunk;
    dequantize_blocks(type, row, j / info->block_size, len / info->block_size, buf);
    for (int64_t i = 0; i < len; ++i) out16[j + i] = simd::to_bf16(buf[i]);
  }
}
