// The AVX2 + FMA row-block kernel of the bfloat16 linears (skinny_linear.cpp's "avx2" path for
// up to 4 rows of x, bf16_gemm.cpp for more): R rows of w against M rows of x, x widened to
// float32 once per call in the even/odd order of widen_even_odd (gemv.h: GemvX::kFloat32EvenOdd),
// each weight vector loaded and widened once and multiplied with every row of x from registers.
#pragma once

#include <cstdint>

#include "simd_avx2.h"

#if ZL_X86

namespace zerolayer {
namespace avx2 {

// Software prefetch of the weight rows kGemvPrefetchRows ahead into L2 (prefetcht2), as the
// other decode GEMVs do (skinny_linear.cpp says why).
constexpr int64_t kGemvPrefetchRows = 4;

// 16 columns from j of R weight rows from r0 against the M rows of x32 (even/odd order).
template <int M, int R>
ZL_AVX2_INLINE void gemv_step(
    const float* x32, const uint16_t* w, int64_t k, int64_t r0, int64_t j, __m256 (&acc)[R][M]) {
  for (int r = 0; r < R; ++r) {
    __m256 even, odd;
    widen_even_odd(w + (r0 + r) * k + j, even, odd);
    for (int m = 0; m < M; ++m) {
      acc[r][m] = _mm256_fmadd_ps(even, _mm256_loadu_ps(x32 + m * k + j), acc[r][m]);
      acc[r][m] = _mm256_fmadd_ps(odd, _mm256_loadu_ps(x32 + m * k + j + 8), acc[r][m]);
    }
  }
}

// R weight rows from r0: 32 columns a step (one prefetch per row and 64-byte line), then the
// 16 left where K is an odd multiple of 16.
template <int M, int R>
ZL_AVX2_INLINE void gemv_block(
    const float* x32, const uint16_t* w, uint16_t* y, int64_t k, int64_t n, int64_t r0) {
  __m256 acc[R][M];
  for (int r = 0; r < R; ++r)
    for (int m = 0; m < M; ++m) acc[r][m] = _mm256_setzero_ps();
  int64_t j = 0;
  for (; j + 32 <= k; j += 32) {
    for (int r = 0; r < R; ++r) {
      __builtin_prefetch(w + (r0 + r + kGemvPrefetchRows) * k + j, 0, 1);
    }
    gemv_step<M, R>(x32, w, k, r0, j, acc);
    gemv_step<M, R>(x32, w, k, r0, j + 16, acc);
  }
  if (j < k) gemv_step<M, R>(x32, w, k, r0, j, acc);
  for (int r = 0; r < R; ++r)
    for (int m = 0; m < M; ++m) y[m * n + r0 + r] = simd::to_bf16(hsum(acc[r][m]));
}

}  // namespace avx2
}  // namespace zerolayer

#endif  // ZL_X86
