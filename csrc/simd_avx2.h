// AVX2 + FMA helpers of the kernels' explicit AVX2 paths (x86-64-v3: skinny_linear.cpp,
// int8_linear.cpp, bf16_gemm.cpp). Every function is always-inline and compiled inside a caller
// marked ZL_TARGET_AVX2 (simd.h).
#pragma once

#include "simd.h"

#if ZL_X86
#include <immintrin.h>

namespace zerolayer {
namespace avx2 {

#define ZL_AVX2_INLINE __attribute__((target("arch=x86-64-v3"), always_inline)) inline

// The 8 lanes of v summed: (0 + 4) + (2 + 6) + ((1 + 5) + (3 + 7)); one fixed order.
ZL_AVX2_INLINE float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// 16 bfloat16 values at src widened to float32: the 8 even-indexed ones (each 32-bit lane's low
// half, shifted up) and the 8 odd-indexed ones (its high half, masked): 2 integer operations
// where an in-order widening takes 2 shuffles and 2 shifts.
ZL_AVX2_INLINE void widen_even_odd(const uint16_t* src, __m256& even, __m256& odd) {
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src));
  even = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
  odd = _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32(static_cast<int>(0xffff0000u))));
}

// 8 bfloat16 values at src widened to float32 in order.
ZL_AVX2_INLINE __m256 widen8(const uint16_t* src) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

}  // namespace avx2
}  // namespace zerolayer

#endif  // ZL_X86
