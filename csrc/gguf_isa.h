// The GGUF row kernels on 32-byte vectors, for one instruction set: included by gguf_avx2.cpp
// (ZL_GGUF_VNNI 0: vpmaddubsw + vpmaddwd) and gguf_avx512.cpp (ZL_GGUF_VNNI 1: vpdpbusd and
// vpdpwssd of AVX512-VNNI on 256-bit vectors) inside their namespace and target pragmas, with
// fp-contract off (the dequantization must round as gguf-py; FMAs here are explicit). No
// include guard, on purpose. The arithmetic is described in gguf_linear.cpp.

#define ZL_GG_INLINE inline __attribute__((always_inline))

// count binary16 values at src (any alignment) widened into y with vcvtph2ps (F16C).
inline void f16_to_f32(const uint8_t* src, int64_t count, float* y) {
  int64_t i = 0;
  for (; i + 8 <= count; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 2 * i));
    _mm256_storeu_ps(y + i, _mm256_cvtph_ps(h));
  }
  for (; i < count; ++i) {
    uint16_t h;
    std::memcpy(&h, src + 2 * i, sizeof(h));
    y[i] = _cvtsh_ss(h);
  }
}

// gguf_dequant.h's dequant32 in registers (a byte array written and read back stalls on store
// forwarding): the codes (nibbles, fifth_bits below), 8 at a time widened to float32, then the
// same roundings (d * (u - o), or d * u, then + m).
inline void block32_values(const uint8_t* qs, const uint8_t* qh, float d, int offset, float m,
                           bool has_min, float* y);

#define ZL_GGUF_F16_TO_F32 f16_to_f32
#define ZL_GGUF_BLOCK32 block32_values
#include "gguf_dequant.h"
#undef ZL_GGUF_BLOCK32
#undef ZL_GGUF_F16_TO_F32

// Weight rows are prefetched into L2 about this many bytes ahead, as skinny_linear and
// int8_linear do (4 bfloat16 rows of 768, 8 int8 ones): a Q4_K row of 768 values is 432 bytes,
// and 4 rows ahead were too few to keep a core's reads going from memory.
constexpr int64_t kPrefetchBytes = 6 << 10;

// The rows ahead that cover kPrefetchBytes for rows of row_bytes (at least one).
ZL_GG_INLINE int64_t prefetch_rows(int64_t row_bytes) {
  return row_bytes >= kPrefetchBytes ? 1 : kPrefetchBytes / row_bytes;
}

ZL_GG_INLINE __m256i load32(const void* p) {
  return _mm256_loadu_si256(static_cast<const __m256i*>(p));
}

ZL_GG_INLINE float half(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, sizeof(h));
  return _cvtsh_ss(h);
}

// acc + the sums of 4 adjacent products of unsigned u and signed s bytes, in 8 int32 lanes.
// AVX2's pairs of products are int16 sums: u <= 63 or |u| <= 127 keeps them from saturating.
ZL_GG_INLINE __m256i dot_u8s8(__m256i acc, __m256i u, __m256i s) {
#if ZL_GGUF_VNNI
  return _mm256_dpbusd_epi32(acc, u, s);
#else
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
#endif
}

// acc + the sums of pairs of (u * s pair sums) times the int16 scales (one per pair of bytes).
ZL_GG_INLINE __m256i dot_u8s8_scaled(__m256i acc, __m256i u, __m256i s, __m256i scales) {
  const __m256i pairs = _mm256_maddubs_epi16(u, s);
#if ZL_GGUF_VNNI
  return _mm256_dpwssd_epi32(acc, pairs, scales);
#else
  return _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, scales));
#endif
}

// An int32 vector whose lanes sum to v (lane 0 holds it).
ZL_GG_INLINE __m256i lane0(int32_t v) { return _mm256_zextsi128_si256(_mm_cvtsi32_si128(v)); }

ZL_GG_INLINE float hsum(__m256 v, __m128 extra) {
  __m128 s = _mm_add_ps(_mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1)), extra);
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// 16 bytes of nibbles as 32 values: the low nibbles (values 0-15), then the high ones.
ZL_GG_INLINE __m256i nibbles(const uint8_t* qs) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i mask = _mm_set1_epi8(0x0F);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(raw, 4), mask), _mm_and_si128(raw, mask));
}

// Bit j of the 4 bytes at qh as byte j: 0x10 where set, else 0 (the Q5 types' fifth bits).
ZL_GG_INLINE __m256i fifth_bits(const uint8_t* qh_bytes) {
  uint32_t qh;
  std::memcpy(&qh, qh_bytes, sizeof(qh));
  const __m256i spread = _mm256_set_epi64x(0x0303030303030303LL, 0x0202020202020202LL,
                                           0x0101010101010101LL, 0);
  const __m256i bits = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ULL));
  const __m256i v = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32(qh), spread), bits);
  return _mm256_and_si256(_mm256_cmpeq_epi8(v, bits), _mm256_set1_epi8(0x10));
}

inline void block32_values(const uint8_t* qs, const uint8_t* qh, float d, int offset, float m,
                           bool has_min, float* y) {
  __m256i u = nibbles(qs);
  if (qh != nullptr) u = _mm256_or_si256(u, fifth_bits(qh));
  const __m256 dv = _mm256_set1_ps(d), mv = _mm256_set1_ps(m);
  const __m256i off = _mm256_set1_epi32(offset);
  const __m128i halves[2] = {_mm256_castsi256_si128(u), _mm256_extracti128_si256(u, 1)};
  for (int i = 0; i < 4; ++i) {
    const __m128i eight = i % 2 ? _mm_srli_si128(halves[i / 2], 8) : halves[i / 2];
    const __m256i v = _mm256_sub_epi32(_mm256_cvtepu8_epi32(eight), off);
    const __m256 scaled = _mm256_mul_ps(dv, _mm256_cvtepi32_ps(v));
    _mm256_storeu_ps(y + 8 * i, has_min ? _mm256_add_ps(scaled, mv) : scaled);
  }
}

// The rows m0 .. m0 + M of quantized x one kernel reads.
struct XRows {
  const int8_t* q[kMaxSkinnyRows];
  const uint8_t* abs[kMaxSkinnyRows];
  const float* d[kMaxSkinnyRows];
  const int32_t* sum[kMaxSkinnyRows];
  const int16_t* sum16[kMaxSkinnyRows];
  const int16_t* sum32[kMaxSkinnyRows];

  XRows(const QuantizedX& x, int64_t m0, int64_t m, bool k_quant) {
    for (int64_t i = 0; i < m; ++i) {
      const int64_t r = m0 + i;
      if (k_quant) {
        q[i] = x.q256 + r * x.k, d[i] = x.d256 + r * (x.k / kQKK);
        sum16[i] = x.sum16 + r * (x.k / 16), sum32[i] = x.sum16x2 + r * (x.k / 32);
      } else {
        q[i] = x.q32 + r * x.k, abs[i] = x.abs32 + r * x.k;
        d[i] = x.d32 + r * (x.k / kQK), sum[i] = x.sum32 + r * (x.k / kQK);
      }
    }
  }
};

// A row's running sums for one row of x: 8 float32 lanes in two chains (v2: the odd blocks of
// the 32-element types, where few rows of x leave the FMA latency exposed) and 4 more (mins,
// offsets).
struct Acc {
  __m256 v, v2;
  __m128 e;
};

// Independent accumulator chains per row of x: two where registers allow (M <= 2).
template <int M>
constexpr bool kTwoChains = M <= 2;

// The 32-element types: the weight block's unsigned codes u (or Q8_0's signed values), then per
// row of x the exact int32 sum of u * q plus the offset's -o * sum(q) in the integer lanes,
// scaled by d_w * d_x; Q4_1 and Q5_1 add their min m_w * d_x * sum(q).
template <int32_t T, int M, bool kOdd>
ZL_GG_INLINE void block32(const uint8_t* p, const XRows& x, int64_t b, Acc* acc) {
  const float dw = half(p);
  __m256i u = _mm256_setzero_si256();
  int32_t offset = 0;
  constexpr bool has_min = T == kQ4_1 || T == kQ5_1;
  float mw = 0.f;
  if constexpr (T == kQ4_0) u = nibbles(p + 2), offset = 8;
  if constexpr (T == kQ4_1) u = nibbles(p + 4), mw = half(p + 2);
  if constexpr (T == kQ5_0) u = _mm256_or_si256(nibbles(p + 6), fifth_bits(p + 2)), offset = 16;
  if constexpr (T == kQ5_1) u = _mm256_or_si256(nibbles(p + 8), fifth_bits(p + 4)), mw = half(p + 2);
  if constexpr (T == kQ8_0) {
    u = load32(p + 2);
#if ZL_GGUF_VNNI
    u = _mm256_xor_si256(u, _mm256_set1_epi8(static_cast<char>(0x80)));  // w + 128, unsigned
    offset = 128;
#endif
  }
  for (int i = 0; i < M; ++i) {
    const __m256i q = load32(x.q[i] + b * kQK);
    const int32_t sum = x.sum[i][b];
    __m256i s;
    if constexpr (T == kQ8_0 && !ZL_GGUF_VNNI) {
      // |q| times w with q's sign (|w|, |q| <= 127: the pairs do not saturate)
      s = dot_u8s8(_mm256_setzero_si256(), load32(x.abs[i] + b * kQK), _mm256_sign_epi8(u, q));
    } else {
      s = dot_u8s8(lane0(-offset * sum), u, q);
    }
    const float dx = x.d[i][b];
    __m256& chain = kOdd && kTwoChains<M> ? acc[i].v2 : acc[i].v;
    chain = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(dw * dx), chain);
    if constexpr (has_min) {
      acc[i].e = _mm_add_ss(acc[i].e, _mm_set_ss(mw * (dx * static_cast<float>(sum))));
    }
  }
}

// Q4_K and Q5_K: per sub-block j of 32 the sum of u * q times its 6-bit scale (int16 pairs,
// then vpmaddwd/vpdpwssd by the scale), scaled by d * d_x; minus dmin * d_x * sum_j min_j *
// sum(q over sub-block j) from Q8_K's sums.
template <int32_t T, int M>
ZL_GG_INLINE void block_q45_k(const uint8_t* p, const XRows& x, int64_t b, Acc* acc) {
  const float d = half(p), dmin = half(p + 2);
  alignas(8) uint8_t scales[8], mins[8];
  scales_and_mins(p + 4, scales, mins);
  const uint8_t* qs = p + (T == kQ5_K ? 48 : 16);
  const __m256i low = _mm256_set1_epi8(0x0F);
  __m256i high_bits = _mm256_setzero_si256();
  if constexpr (T == kQ5_K) high_bits = load32(p + 16);
  __m256i isum[M], isum2[kTwoChains<M> ? M : 1];  // the high nibbles' chain where M <= 2
  for (int i = 0; i < M; ++i) isum[i] = _mm256_setzero_si256();
  for (int i = 0; i < (kTwoChains<M> ? M : 1); ++i) isum2[i] = _mm256_setzero_si256();
  for (int c = 0; c < 4; ++c) {
    const __m256i raw = load32(qs + 32 * c);
    __m256i lo = _mm256_and_si256(raw, low);
    __m256i hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low);
    if constexpr (T == kQ5_K) {
      // bit j of each byte of qh (sub-block j = 2c, 2c + 1) moved to bit 4
      const __m256i b16 = _mm256_set1_epi8(0x10);
      const int j = 2 * c;
      const __m256i h_lo = j <= 4 ? _mm256_slli_epi16(high_bits, 4 - j)
                                  : _mm256_srli_epi16(high_bits, j - 4);
      const __m256i h_hi = j + 1 <= 4 ? _mm256_slli_epi16(high_bits, 3 - j)
                                      : _mm256_srli_epi16(high_bits, j - 3);
      lo = _mm256_or_si256(lo, _mm256_and_si256(h_lo, b16));
      hi = _mm256_or_si256(hi, _mm256_and_si256(h_hi, b16));
    }
    const __m256i s_lo = _mm256_set1_epi16(scales[2 * c]);
    const __m256i s_hi = _mm256_set1_epi16(scales[2 * c + 1]);
    for (int i = 0; i < M; ++i) {
      const int8_t* q = x.q[i] + b * kQKK + 64 * c;
      isum[i] = dot_u8s8_scaled(isum[i], lo, load32(q), s_lo);
      __m256i& chain = kTwoChains<M> ? isum2[kTwoChains<M> ? i : 0] : isum[i];
      chain = dot_u8s8_scaled(chain, hi, load32(q + 32), s_hi);
    }
  }
  if constexpr (kTwoChains<M>) {
    for (int i = 0; i < M; ++i) isum[i] = _mm256_add_epi32(isum[i], isum2[i]);
  }
  const __m128i mins16 = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(mins)));
  for (int i = 0; i < M; ++i) {
    const float dx = x.d[i][b];
    acc[i].v = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[i]), _mm256_set1_ps(d * dx), acc[i].v);
    const __m128i sums = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x.sum32[i] + 8 * b));
    acc[i].e = _mm_fnmadd_ps(_mm_cvtepi32_ps(_mm_madd_epi16(mins16, sums)),
                             _mm_set1_ps(dmin * dx), acc[i].e);
  }
}

// Q6_K: per 32 values the sum of u * q (u = q6 + 32 in [0, 63]) times the two int8 scales of
// their halves, less 32 * sum_i scale_i * sum(q over sub-block i), scaled by d * d_x.
template <int M>
ZL_GG_INLINE void block_q6_k(const uint8_t* p, const XRows& x, int64_t b, Acc* acc) {
  const float d = half(p + 208);
  const int8_t* sc = reinterpret_cast<const int8_t*>(p + 192);
  const __m256i low = _mm256_set1_epi8(0x0F), two = _mm256_set1_epi8(0x30);
  __m256i isum[M], isum2[kTwoChains<M> ? M : 1];  // the odd quarters' chain where M <= 2
  for (int i = 0; i < M; ++i) isum[i] = _mm256_setzero_si256();
  for (int i = 0; i < (kTwoChains<M> ? M : 1); ++i) isum2[i] = _mm256_setzero_si256();
  for (int h = 0; h < 2; ++h) {
    const __m256i qa = load32(p + 64 * h), qb = load32(p + 64 * h + 32);
    const __m256i qh = load32(p + 128 + 32 * h);
    __m256i u[4];
    u[0] = _mm256_or_si256(_mm256_and_si256(qa, low), _mm256_and_si256(_mm256_slli_epi16(qh, 4), two));
    u[1] = _mm256_or_si256(_mm256_and_si256(qb, low), _mm256_and_si256(_mm256_slli_epi16(qh, 2), two));
    u[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(qa, 4), low), _mm256_and_si256(qh, two));
    u[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(qb, 4), low),
                           _mm256_and_si256(_mm256_srli_epi16(qh, 2), two));
    for (int t = 0; t < 4; ++t) {
      const int s = 8 * h + 2 * t;
      const __m256i scales = _mm256_set_m128i(_mm_set1_epi16(sc[s + 1]), _mm_set1_epi16(sc[s]));
      for (int i = 0; i < M; ++i) {
        __m256i& chain = kTwoChains<M> && t % 2 ? isum2[kTwoChains<M> ? i : 0] : isum[i];
        chain = dot_u8s8_scaled(chain, u[t], load32(x.q[i] + b * kQKK + 128 * h + 32 * t), scales);
      }
    }
  }
  if constexpr (kTwoChains<M>) {
    for (int i = 0; i < M; ++i) isum[i] = _mm256_add_epi32(isum[i], isum2[i]);
  }
  const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sc)));
  for (int i = 0; i < M; ++i) {
    const __m256i offset = _mm256_madd_epi16(sc16, load32(x.sum16[i] + 16 * b));
    const __m256i total = _mm256_sub_epi32(isum[i], _mm256_slli_epi32(offset, 5));
    acc[i].v = _mm256_fmadd_ps(_mm256_cvtepi32_ps(total), _mm256_set1_ps(d * x.d[i][b]), acc[i].v);
  }
}

template <int32_t T, int M, bool kOdd>
ZL_GG_INLINE void block_any(const uint8_t* p, const XRows& x, int64_t b, Acc* acc) {
  if constexpr (T == kQ4_K || T == kQ5_K) {
    block_q45_k<T, M>(p, x, b, acc);
  } else if constexpr (T == kQ6_K) {
    block_q6_k<M>(p, x, b, acc);
  } else {
    block32<T, M, kOdd>(p, x, b, acc);
  }
}

ZL_GG_INLINE void put(const WeightRows& w, int64_t i, float v) {
  if (w.y_bf16) {
    static_cast<uint16_t*>(w.y)[i] = simd::to_bf16(v);
  } else {
    static_cast<float*>(w.y)[i] = v;
  }
}

ZL_GG_INLINE void prefetch_row(const uint8_t* row, int64_t bytes) {
  for (int64_t j = 0; j < bytes; j += 64) __builtin_prefetch(row + j, 0, 1);
}

// R weight rows from r against the M rows of x, interleaved: R independent chains of
// dependent multiply-adds (one row alone leaves the multipliers half idle at M = 1).
template <int32_t T, int M, int R>
ZL_GG_INLINE void row_group(const XRows& x, int64_t m0, const WeightRows& w, int64_t r,
                            int64_t blocks, int64_t type_size) {
  const uint8_t* row[R];
  const int64_t ahead = prefetch_rows(w.row_bytes);
  for (int j = 0; j < R; ++j) {
    row[j] = w.w + (r + j) * w.row_bytes;
    if (r + j + ahead < w.n) prefetch_row(row[j] + ahead * w.row_bytes, w.row_bytes);
  }
  Acc acc[R][M];
  for (int j = 0; j < R; ++j) {
    for (int i = 0; i < M; ++i) acc[j][i] = Acc{_mm256_setzero_ps(), _mm256_setzero_ps(), _mm_setzero_ps()};
  }
  int64_t b = 0;
  for (; b + 2 <= blocks; b += 2) {
    for (int j = 0; j < R; ++j) {
      block_any<T, M, false>(row[j] + b * type_size, x, b, acc[j]);
      block_any<T, M, true>(row[j] + (b + 1) * type_size, x, b + 1, acc[j]);
    }
  }
  if (b < blocks) {
    for (int j = 0; j < R; ++j) block_any<T, M, false>(row[j] + b * type_size, x, b, acc[j]);
  }
  for (int j = 0; j < R; ++j) {
    for (int i = 0; i < M; ++i) {
      put(w, (m0 + i) * w.n + r + j, hsum(_mm256_add_ps(acc[j][i].v, acc[j][i].v2), acc[j][i].e));
    }
  }
}

template <int32_t T, int M>
void int_rows_t(const QuantizedX& x, int64_t m0, const WeightRows& w, int64_t n0, int64_t n1) {
  constexpr bool k_quant = T == kQ4_K || T == kQ5_K || T == kQ6_K;
  constexpr int R = M == 1 ? 2 : 1;
  const TypeInfo& info = *type_info(T);
  const int64_t blocks = x.k / info.block_size;
  const XRows rows(x, m0, M, k_quant);
  int64_t r = n0;
  for (; r + R <= n1; r += R) row_group<T, M, R>(rows, m0, w, r, blocks, info.type_size);
  for (; r < n1; ++r) row_group<T, M, 1>(rows, m0, w, r, blocks, info.type_size);
}

template <int32_t T>
void int_rows_m(const QuantizedX& x, int64_t m0, int64_t m, const WeightRows& w, int64_t n0,
                int64_t n1) {
  static_assert(kMaxSkinnyRows == 4, "one kernel per number of rows of x");
  switch (m) {
    case 1: return int_rows_t<T, 1>(x, m0, w, n0, n1);
    case 2: return int_rows_t<T, 2>(x, m0, w, n0, n1);
    case 3: return int_rows_t<T, 3>(x, m0, w, n0, n1);
    default: return int_rows_t<T, 4>(x, m0, w, n0, n1);
  }
}

void int_rows(const QuantizedX& x, int64_t m0, int64_t m, const WeightRows& w, int64_t n0,
              int64_t n1) {
  switch (w.type) {
    case kQ4_0: return int_rows_m<kQ4_0>(x, m0, m, w, n0, n1);
    case kQ4_1: return int_rows_m<kQ4_1>(x, m0, m, w, n0, n1);
    case kQ5_0: return int_rows_m<kQ5_0>(x, m0, m, w, n0, n1);
    case kQ5_1: return int_rows_m<kQ5_1>(x, m0, m, w, n0, n1);
    case kQ8_0: return int_rows_m<kQ8_0>(x, m0, m, w, n0, n1);
    case kQ4_K: return int_rows_m<kQ4_K>(x, m0, m, w, n0, n1);
    case kQ5_K: return int_rows_m<kQ5_K>(x, m0, m, w, n0, n1);
    case kQ6_K: return int_rows_m<kQ6_K>(x, m0, m, w, n0, n1);
    default: return;  // float types take float_rows (checked by the caller)
  }
}

// Float32 x: a row's values dequantized exactly, kChunk at a time into a buffer in L1 (F32
// rows are read in place), then 16 at a time in two chains of FMAs per row of x.
template <int M>
void float_rows_t(const float* x, int64_t k, int64_t m0, const WeightRows& w, int64_t n0,
                  int64_t n1) {
  constexpr int64_t kChunk = 512;
  const TypeInfo& info = *type_info(w.type);
  const int64_t chunk = kChunk / info.block_size * info.block_size;
  alignas(64) float buf[kChunk];
  for (int64_t r = n0; r < n1; ++r) {
    const uint8_t* row = w.w + r * w.row_bytes;
    const int64_t ahead = prefetch_rows(w.row_bytes);
    if (r + ahead < w.n) prefetch_row(row + ahead * w.row_bytes, w.row_bytes);
    __m256 a0[M], a1[M];
    float tail[M];
    for (int i = 0; i < M; ++i) a0[i] = a1[i] = _mm256_setzero_ps(), tail[i] = 0.f;
    for (int64_t j0 = 0; j0 < k; j0 += chunk) {
      const int64_t len = k - j0 < chunk ? k - j0 : chunk;
      const float* v = buf;
      if (w.type == kF32) {
        v = reinterpret_cast<const float*>(row) + j0;
      } else {
        dequantize_blocks(w.type, row, j0 / info.block_size, len / info.block_size, buf);
      }
      int64_t j = 0;
      for (; j + 16 <= len; j += 16) {
        const __m256 w0 = _mm256_loadu_ps(v + j), w1 = _mm256_loadu_ps(v + j + 8);
        for (int i = 0; i < M; ++i) {
          const float* xr = x + (m0 + i) * k + j0 + j;
          a0[i] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xr), a0[i]);
          a1[i] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xr + 8), a1[i]);
        }
      }
      for (; j < len; ++j) {
        for (int i = 0; i < M; ++i) tail[i] += v[j] * x[(m0 + i) * k + j0 + j];
      }
    }
    for (int i = 0; i < M; ++i) {
      put(w, (m0 + i) * w.n + r, hsum(_mm256_add_ps(a0[i], a1[i]), _mm_set_ss(tail[i])));
    }
  }
}

void float_rows(const float* x, int64_t k, int64_t m0, int64_t m, const WeightRows& w, int64_t n0,
                int64_t n1) {
  switch (m) {
    case 1: return float_rows_t<1>(x, k, m0, w, n0, n1);
    case 2: return float_rows_t<2>(x, k, m0, w, n0, n1);
    case 3: return float_rows_t<3>(x, k, m0, w, n0, n1);
    default: return float_rows_t<4>(x, k, m0, w, n0, n1);
  }
}

void dequantize_row(int32_t type, const uint8_t* row, int64_t k, float* out32, uint16_t* out16) {
  dequantize_row_to(type, row, k, out32, out16);
}

#undef ZL_GG_INLINE
