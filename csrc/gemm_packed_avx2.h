// The packed AVX2 + FMA kernel of bf16_gemm.cpp for many rows of x (prefill): y [m, n] =
// x [m, k] @ w [n, k]^T with w taken kPanel rows at a time, widened and transposed once into a
// float32 panel [k][kPanel], and x in rows of float32; a micro-tile of kMicroRows rows of x times
// the panel keeps its 12 accumulators (8 outputs each) in registers, each step one broadcast of
// x per row and two loads of the panel for 12 FMAs (the outer-product form of BLIS, Van Zee and
// van de Geijn 2015, "BLIS: A Framework for Rapidly Instantiating BLAS Functionality"). Every
// output is one float32 chain of FMAs over k in order, rounded once to bfloat16.
#pragma once

#include <algorithm>
#include <cstdint>

#include "simd.h"
#include "simd_avx2.h"

#if ZL_X86

namespace zerolayer {
namespace avx2 {

constexpr int64_t kPanel = 16;  // weight rows per panel: two 8-float vectors of outputs
// rows of x per micro-tile: 12 accumulators, the panel's 2 vectors and a broadcast in 16
// registers (5 and 6 measured alike; 4 slower)
constexpr int kMicroRows = 6;

// The 8 x 8 block v (rows) transposed in place.
ZL_AVX2_INLINE void transpose8(__m256 (&v)[8]) {
  __m256 t[8], u[8];
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_ps(v[2 * i], v[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_ps(v[2 * i], v[2 * i + 1]);
  }
  for (int i = 0; i < 2; ++i) {
    for (int h = 0; h < 2; ++h) {
      const __m256 a = t[4 * i + h], b = t[4 * i + h + 2];
      u[4 * i + 2 * h] = _mm256_shuffle_ps(a, b, _MM_SHUFFLE(1, 0, 1, 0));
      u[4 * i + 2 * h + 1] = _mm256_shuffle_ps(a, b, _MM_SHUFFLE(3, 2, 3, 2));
    }
  }
  for (int i = 0; i < 4; ++i) {
    v[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
    v[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
  }
}

// panel [k][kPanel] = rows [r, r + kPanel) of w (bfloat16 [n, k]) widened, rows past n zero;
// k a multiple of 8.
ZL_AVX2_INLINE void pack_panel(const uint16_t* w, int64_t k, int64_t n, int64_t r, float* panel) {
  for (int64_t j = 0; j < k; j += 8) {
    for (int half = 0; half < 2; ++half) {
      __m256 v[8];
      for (int i = 0; i < 8; ++i) {
        const int64_t row = r + 8 * half + i;
        v[i] = row < n ? widen8(w + row * k + j) : _mm256_setzero_ps();
      }
      transpose8(v);
      for (int c = 0; c < 8; ++c) _mm256_storeu_ps(panel + (j + c) * kPanel + 8 * half, v[c]);
    }
  }
}

// y rows [m0, m0 + MR), columns [r, r + cols) = x32 rows (float32 [., k]) times the panel.
template <int MR>
ZL_AVX2_INLINE void micro_tile(const float* x32, const float* panel, uint16_t* y, int64_t k,
                               int64_t n, int64_t m0, int64_t r, int64_t cols) {
  __m256 lo[MR], hi[MR];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) lo[i] = hi[i] = _mm256_setzero_ps();
  const float* x = x32 + m0 * k;
  for (int64_t j = 0; j < k; ++j) {
    const __m256 w0 = _mm256_loadu_ps(panel + j * kPanel);
    const __m256 w1 = _mm256_loadu_ps(panel + j * kPanel + 8);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m256 xb = _mm256_broadcast_ss(x + i * k + j);
      lo[i] = _mm256_fmadd_ps(xb, w0, lo[i]);
      hi[i] = _mm256_fmadd_ps(xb, w1, hi[i]);
    }
  }
  alignas(32) float out[MR][kPanel];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
    _mm256_store_ps(out[i], lo[i]);
    _mm256_store_ps(out[i] + 8, hi[i]);
  }
  for (int i = 0; i < MR; ++i) {
    for (int64_t c = 0; c < cols; ++c) y[(m0 + i) * n + r + c] = simd::to_bf16(out[i][c]);
  }
}

// Panels [p0, p1) (weight rows [16 p0, 16 p1) clipped to n) against all m rows of x32.
ZL_AVX2_INLINE void packed_panels(const float* x32, int64_t m, const uint16_t* w, uint16_t* y,
                                  int64_t k, int64_t n, int64_t p0, int64_t p1, float* panel) {
  for (int64_t p = p0; p < p1; ++p) {
    const int64_t r = p * kPanel, cols = std::min(kPanel, n - r);
    pack_panel(w, k, n, r, panel);
    int64_t i = 0;
    for (; i + kMicroRows <= m; i += kMicroRows) {
      micro_tile<kMicroRows>(x32, panel, y, k, n, i, r, cols);
    }
    switch (m - i) {
      case 1: micro_tile<1>(x32, panel, y, k, n, i, r, cols); break;
      case 2: micro_tile<2>(x32, panel, y, k, n, i, r, cols); break;
      case 3: micro_tile<3>(x32, panel, y, k, n, i, r, cols); break;
      case 4: micro_tile<4>(x32, panel, y, k, n, i, r, cols); break;
      case 5: micro_tile<5>(x32, panel, y, k, n, i, r, cols); break;
      default: break;
    }
  }
}

}  // namespace avx2
}  // namespace zerolayer

#endif  // ZL_X86
