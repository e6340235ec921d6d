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

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <tuple>

#include "elementwise.h"
#include "kernels.h"
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
void with_weight(const at::Tensor& weight, F&& f) {
  if (weight.scalar_type() == at::kFloat) {
    f(weight.data_ptr<float>());
  } else {
    f(reinterpret_cast<const uint16_t*>(weight.data_ptr<at::BFloat16>()));
  }
}

void check_norm(const at::Tensor& x, const at::Tensor& weight, const char* who) {
  TORCH_CHECK(x.scalar_type() == at::kBFloat16, who, ": bfloat16 x expected");
  TORCH_CHECK(x.dim() >= 1 && x.is_contiguous(), who, ": contiguous x [..., H] expected");
  TORCH_CHECK(weight.dim() == 1 && weight.size(0) == x.size(-1), who, ": weight [",
              x.size(-1), "] expected, got ", weight.sizes());
  TORCH_CHECK(weight.is_contiguous() && (weight.scalar_type() == at::kBFloat16 ||
                                         weight.scalar_type() == at::kFloat),
              who, ": contiguous bfloat16 or float32 weight expected");
}

const uint16_t* bits(const at::Tensor& t) {
  return reinterpret_cast<const uint16_t*>(t.data_ptr<at::BFloat16>());
}

uint16_t* bits(at::Tensor& t) { return reinterpret_cast<uint16_t*>(t.data_ptr<at::BFloat16>()); }

int64_t rows_of(const at::Tensor& x) { return x.size(-1) == 0 ? 0 : x.numel() / x.size(-1); }

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

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  check_norm(x, weight, "rms_norm");
  at::Tensor y = at::empty_like(x);
  const int64_t n = x.size(-1);
  const uint16_t* xp = bits(x);
  uint16_t* yp = bits(y);
  with_weight(weight, [&](const auto* w) {
    at::parallel_for(0, rows_of(x), kGrainRows, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) norm_row(xp + r * n, w, yp + r * n, n, eps);
    });
  });
  return y;
}

std::tuple<at::Tensor, at::Tensor> add_rms_norm(const at::Tensor& h, const at::Tensor& d,
                                                const at::Tensor& weight, double eps) {
  check_norm(h, weight, "add_rms_norm");
  TORCH_CHECK(d.sizes() == h.sizes() && d.scalar_type() == h.scalar_type() && d.is_contiguous(),
              "add_rms_norm: d must be a contiguous tensor of h's shape and dtype");
  at::Tensor s = at::empty_like(h);
  at::Tensor y = at::empty_like(h);
  const int64_t n = h.size(-1);
  const uint16_t* hp = bits(h);
  const uint16_t* dp = bits(d);
  uint16_t* sp = bits(s);
  uint16_t* yp = bits(y);
  with_weight(weight, [&](const auto* w) {
    at::parallel_for(0, rows_of(h), kGrainRows, [&](int64_t r0, int64_t r1) {
      for (int64_t i = r0 * n; i < r1 * n; ++i) sp[i] = to_bf16(widen(hp[i]) + widen(dp[i]));
      for (int64_t r = r0; r < r1; ++r) norm_row(sp + r * n, w, yp + r * n, n, eps);
    });
  });
  return {s, y};
}

at::Tensor rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && cos.scalar_type() == at::kBFloat16 &&
                  sin.scalar_type() == at::kBFloat16,
              "rotary: bfloat16 x, cos and sin expected");
  TORCH_CHECK(x.dim() == 3 && x.is_contiguous(), "rotary: contiguous x [T, heads, D] expected");
  const int64_t t = x.size(0), heads = x.size(1), dim = x.size(2);
  TORCH_CHECK(dim % 2 == 0 && dim <= 1024, "rotary: even head dim up to 1024 expected, got ", dim);
  TORCH_CHECK(cos.numel() == t * dim && sin.numel() == t * dim,
              "rotary: cos and sin [T, 1, D] expected, got ", cos.sizes(), " and ", sin.sizes());
  const at::Tensor c = cos.reshape({t, dim}).contiguous(), s = sin.reshape({t, dim}).contiguous();
  at::Tensor y = at::empty_like(x);
  const uint16_t* xp = bits(x);
  const uint16_t* cp = bits(c);
  const uint16_t* sp = bits(s);
  uint16_t* yp = bits(y);
  at::parallel_for(0, t, kGrainRows, [&](int64_t t0, int64_t t1) {
    for (int64_t ti = t0; ti < t1; ++ti) {
      rotary_rows(xp + ti * heads * dim, cp + ti * dim, sp + ti * dim, yp + ti * heads * dim, heads,
                  dim);
    }
  });
  return y;
}

}  // namespace zerolayer
