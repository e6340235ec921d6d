// The elementwise steps of a Llama layer, each one native call instead of a chain of torch ops.
//
// At batch 1 a decode step is about 40 torch calls per layer, most of them on one row of 768
// values; each costs 3-30 microseconds of dispatch, allocation and GIL hand-offs, far more than
// its arithmetic (measured: torch's RMSNorm of one bfloat16 row 35 us, the rotation of q 25 us).
// These kernels do the same arithmetic with the same roundings in one call each:
//
// - rms_norm:      y = w * (x * rsqrt(mean(x^2) + eps)), normalized in float32 and cast back to
//                  x's dtype before the product with w (cast to x's dtype), as transformers'
//                  LlamaRMSNorm and zerolayer.scheduler.model.llama.rms_norm compute it
//                  (Zhang & Sennrich 2019, "Root Mean Square Layer Normalization").
// - add_rms_norm:  s = h + d rounded to the dtype, then rms_norm(s): the residual add and the
//                  next norm in one pass.
// - rotary:        RoPE in the rotate-half form (Su et al. 2021, "RoFormer"), x * cos +
//                  rotate_half(x) * sin with each product and the sum rounded to bfloat16, as
//                  torch computes zerolayer.scheduler.model.rope.apply_rotary in bfloat16.
//
// Only bfloat16: its squares are exact in float32, so the sum of squares does not depend on
// fused multiply-adds, and the results equal the torch expressions bit for bit except where the
// order of the float32 sum (torch's reduction tree) moves a result across a bfloat16 rounding
// boundary (none in 153,600 values of random rows measured here). In float32 the sum's order and
// FMAs changed 28% of the rows' last bits, so float32 models keep torch's ops. Rows are
// independent: a row's result does not depend on the other rows or on the thread count (batch
// invariant). (silu(gate) * up was tried too: 18 us against torch's 9 us for 2048 values, since
// expf is not vectorized here; it stays in torch.)

#include <cmath>
#include <cstdint>
#include <cstring>

#include "api.h"
#include "elementwise.h"
#include "kernels.h"
#include "parallel.h"
#include "simd.h"

namespace zerolayer {
namespace {

using simd::to_bf16;

// Rows per task at least: a decode step's handful of rows stays on the calling thread (a
// parallel region costs more than the work); prefill's hundreds of rows are split.
constexpr int64_t kGrainRows = 64;

using simd::round_bf16;
inline float widen(uint16_t h) { return simd::from_bf16(h); }

// The float32 sum of squares of n bfloat16 values, in kLanes partial sums added left to right.
ZL_MULTIVERSION float sum_squares(const uint16_t* x, int64_t n) {
  float lanes[simd::kLanes] = {};
  int64_t j = 0;
  for (; j + simd::kLanes <= n; j += simd::kLanes) {
    for (int64_t l = 0; l < simd::kLanes; ++l) {
      const float v = widen(x[j + l]);
      lanes[l] += v * v;
    }
  }
  for (; j < n; ++j) lanes[0] += widen(x[j]) * widen(x[j]);
  float s = 0.f;
  for (float v : lanes) s += v;
  return s;
}

// The norm weight's j-th value in bfloat16 precision: a float32 weight of a bfloat16 model is
// rounded first, as weight.to(x.dtype) does.
inline float weight_at(const uint16_t* w, int64_t j) { return widen(w[j]); }
inline float weight_at(const float* w, int64_t j) { return round_bf16(w[j]); }

// y = w * bf16(x * rsqrt(mean(x^2) + eps)) for one row of n values.
template <typename W>
ZL_MULTIVERSION void norm_row(const uint16_t* x, const W* w, uint16_t* y, int64_t n, float eps) {
  const float mean = sum_squares(x, n) / static_cast<float>(n);
  const float r = 1.f / std::sqrt(mean + eps);
  for (int64_t j = 0; j < n; ++j) y[j] = to_bf16(weight_at(w, j) * round_bf16(widen(x[j]) * r));
}

// Runs f(w) with the weight's data as const uint16_t* (bfloat16) or const float* (float32).
template <typename F>
void with_weight(const void* weight, int32_t dtype, F&& f) {
  ZL_CHECK(dtype == ZL_BFLOAT16 || dtype == ZL_FLOAT32,
           "rms_norm: contiguous bfloat16 or float32 weight expected");
  if (dtype == ZL_FLOAT32) {
    f(static_cast<const float*>(weight));
  } else {
    f(static_cast<const uint16_t*>(weight));
  }
}

}  // namespace

void rms_norm_row(const uint16_t* x, const uint16_t* w, uint16_t* y, int64_t n, float eps) {
  norm_row(x, w, y, n, eps);
}

void rotary_rows(const uint16_t* x, const uint16_t* cos, const uint16_t* sin, uint16_t* y,
                 int64_t heads, int64_t dim) {
  const int64_t half = dim / 2;
  float row[1024];
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t j = 0; j < dim; ++j) row[j] = widen(x[h * dim + j]);
    for (int64_t j = 0; j < dim; ++j) {
      // rotate_half(x) = cat(-x[half:], x[:half]); each product and the sum rounded.
      const float rotated = j < half ? -row[j + half] : row[j - half];
      y[h * dim + j] = to_bf16(round_bf16(row[j] * widen(cos[j])) + round_bf16(rotated * widen(sin[j])));
    }
  }
}

}  // namespace zerolayer

int32_t zl_rms_norm(const uint16_t* x, const void* w, int32_t w_dtype, uint16_t* y, int64_t rows,
                    int64_t n, double eps, int32_t num_threads) {
  using namespace zerolayer;
  return guarded([&] {
    with_weight(w, w_dtype, [&](const auto* wp) {
      parallel_for(0, rows, kGrainRows, num_threads, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) norm_row(x + r * n, wp, y + r * n, n, eps);
      });
    });
  });
}

int32_t zl_add_rms_norm(const uint16_t* h, const uint16_t* d, const void* w, int32_t w_dtype,
                        uint16_t* s, uint16_t* y, int64_t rows, int64_t n, double eps,
                        int32_t num_threads) {
  using namespace zerolayer;
  return guarded([&] {
    with_weight(w, w_dtype, [&](const auto* wp) {
      parallel_for(0, rows, kGrainRows, num_threads, [&](int64_t r0, int64_t r1) {
        for (int64_t i = r0 * n; i < r1 * n; ++i) s[i] = to_bf16(widen(h[i]) + widen(d[i]));
        for (int64_t r = r0; r < r1; ++r) norm_row(s + r * n, wp, y + r * n, n, eps);
      });
    });
  });
}

int32_t zl_rotary(const uint16_t* x, const uint16_t* cos, const uint16_t* sin, uint16_t* y,
                  int64_t t, int64_t heads, int64_t dim, int32_t num_threads) {
  using namespace zerolayer;
  return guarded([&] {
    ZL_CHECK(dim % 2 == 0 && dim <= 1024, "rotary: even head dim up to 1024 expected, got ", dim);
    parallel_for(0, t, kGrainRows, num_threads, [&](int64_t t0, int64_t t1) {
      for (int64_t ti = t0; ti < t1; ++ti) {
        rotary_rows(x + ti * heads * dim, cos + ti * dim, sin + ti * dim, y + ti * heads * dim,
                    heads, dim);
      }
    });
  });
}
