// The dequantization of GGUF blocks to float32, with gguf-py's roundings (gguf/quants.py:
// dequantize_blocks; the arithmetic of ggml-quants.c's dequantize_row_*): every product and sum
// rounded to float32 in that order, so the values are bit-exact. Included by each instruction
// set's translation unit (gguf_isa.h, gguf_portable.cpp) inside its own namespace, under
// `#pragma GCC optimize("fp-contract=off")`: a fused d * q - m would round once, not twice.
// No include guard, on purpose; gguf_blocks.h is included before.

// One block at p into y[0 .. block_size).
// NOTE: the blocks are read in place (their float16 fields with half_at): a copy of an 18- or
// 210-byte struct read back byte by byte stalls on store forwarding.

// The unsigned codes of a 32-value block: 16 bytes of nibbles (value j < 16 in the low nibble of
// byte j, j >= 16 in the high one of byte j - 16), with the fifth bits of qh (Q5) as 16.
// NOTE: in 64-bit words (SWAR): a byte loop is vectorized into byte inserts under -mavx2.
inline void codes32(const uint8_t* qs, const uint8_t* qh, uint8_t* u) {
  constexpr uint64_t kLow = 0x0F0F0F0F0F0F0F0FULL;
  uint64_t q[2], out[4];
  std::memcpy(q, qs, sizeof(q));
  out[0] = q[0] & kLow, out[1] = q[1] & kLow;
  out[2] = (q[0] >> 4) & kLow, out[3] = (q[1] >> 4) & kLow;
  if (qh != nullptr) {
    for (int i = 0; i < 4; ++i) {
      // qh byte i's 8 bits spread over 8 bytes: 0x10 where set
      const uint64_t spread = (qh[i] * 0x0101010101010101ULL) & 0x8040201008040201ULL;
      out[i] |= ((spread + 0x7F7F7F7F7F7F7F7FULL) & 0x8080808080808080ULL) >> 3;
    }
  }
  std::memcpy(u, out, sizeof(out));
}

// A 32-element block's values from its nibbles qs and fifth bits qh (nullptr: none): Q4_0 and
// Q5_0 d * (u - offset); Q4_1 and Q5_1 (kMin) d * u + m. An includer may define
// ZL_GGUF_BLOCK32(qs, qh, d, offset, m, has_min, y) with vector instructions instead.
template <bool kMin>
inline void dequant32(const uint8_t* qs, const uint8_t* qh, float d, int offset, float m,
                      float* y) {
#ifdef ZL_GGUF_BLOCK32
  ZL_GGUF_BLOCK32(qs, qh, d, offset, m, kMin, y);
#else
  uint8_t u[32];
  codes32(qs, qh, u);
  for (int j = 0; j < 32; ++j) {
    if (kMin) {
      y[j] = d * static_cast<float>(u[j]) + m;
    } else {
      y[j] = d * static_cast<float>(static_cast<int>(u[j]) - offset);
    }
  }
#endif
}

inline void dequant_q4_0(const uint8_t* p, float* y) {
  dequant32<false>(p + 2, nullptr, half_at(p), 8, 0.f, y);
}

inline void dequant_q4_1(const uint8_t* p, float* y) {
  dequant32<true>(p + 4, nullptr, half_at(p), 0, half_at(p + 2), y);
}

inline void dequant_q5_0(const uint8_t* p, float* y) {
  dequant32<false>(p + 6, p + 2, half_at(p), 16, 0.f, y);
}

inline void dequant_q5_1(const uint8_t* p, float* y) {
  dequant32<true>(p + 8, p + 4, half_at(p), 0, half_at(p + 2), y);
}

inline void dequant_q8_0(const uint8_t* p, float* y) {
  const float d = half_at(p);
  const int8_t* qs = reinterpret_cast<const int8_t*>(p + 2);
  for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(qs[j]) * d;
}

// Q4_K and Q5_K (kFive): value l of sub-block j is (d * scale_j) * q - (dmin * min_j).
template <bool kFive>
inline void dequant_q45_k(const uint8_t* p, float* y) {
  const float d = half_at(p), dmin = half_at(p + 2);
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
// The codes first (byte operations), then one scale per 16 values.
inline void dequant_q6_k(const uint8_t* p, float* y) {
  const float d = half_at(p + 208);
  const int8_t* sc = reinterpret_cast<const int8_t*>(p + 192);
  int8_t q[256];
  for (int half = 0; half < 2; ++half) {
    const uint8_t* ql = p + 64 * half;
    const uint8_t* qh = p + 128 + 32 * half;
    int8_t* out = q + 128 * half;
    for (int l = 0; l < 32; ++l) {
      out[l] = static_cast<int8_t>(((ql[l] & 0xF) | ((qh[l] & 3) << 4)) - 32);
      out[l + 32] = static_cast<int8_t>(((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32);
      out[l + 64] = static_cast<int8_t>(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
      out[l + 96] = static_cast<int8_t>(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
    }
  }
  for (int s = 0; s < 16; ++s) {
    const float ds = d * static_cast<float>(sc[s]);
    for (int j = 0; j < 16; ++j) y[16 * s + j] = ds * static_cast<float>(q[16 * s + j]);
  }
}

// Blocks [first, first + count) of a row, each Block() (inlined) into its values of y.
template <void (*Block)(const uint8_t*, float*), int64_t kBytes, int64_t kValues>
inline void blocks_of(const uint8_t* row, int64_t first, int64_t count, float* y) {
  for (int64_t i = 0; i < count; ++i) Block(row + (first + i) * kBytes, y + i * kValues);
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
  switch (type) {
    case kQ4_0: return blocks_of<dequant_q4_0, sizeof(BlockQ4_0), kQK>(row, first, count, y);
    case kQ4_1: return blocks_of<dequant_q4_1, sizeof(BlockQ4_1), kQK>(row, first, count, y);
    case kQ5_0: return blocks_of<dequant_q5_0, sizeof(BlockQ5_0), kQK>(row, first, count, y);
    case kQ5_1: return blocks_of<dequant_q5_1, sizeof(BlockQ5_1), kQK>(row, first, count, y);
    case kQ8_0: return blocks_of<dequant_q8_0, sizeof(BlockQ8_0), kQK>(row, first, count, y);
    case kQ4_K:
      return blocks_of<dequant_q45_k<false>, sizeof(BlockQ4_K), kQKK>(row, first, count, y);
    case kQ5_K:
      return blocks_of<dequant_q45_k<true>, sizeof(BlockQ5_K), kQKK>(row, first, count, y);
    case kQ6_K: return blocks_of<dequant_q6_k, sizeof(BlockQ6_K), kQKK>(row, first, count, y);
    default: return;  // the callers check the type first
  }
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
