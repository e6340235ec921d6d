// Row helpers of csrc/elementwise.cpp that other kernels share (csrc/decode_forward.cpp).
#pragma once

#include <cstdint>

namespace zerolayer {

// y = w * bf16(x * rsqrt(mean(x^2) + eps)) for one row of n bfloat16 values, w bfloat16 [n];
// the float32 sum of squares in simd::kLanes partial sums.
void rms_norm_row(const uint16_t* x, const uint16_t* w, uint16_t* y, int64_t n, float eps);

// RoPE (rotate-half) of `heads` rows of dim bfloat16 values at x, in place or into y (x and y
// may be the same): y = bf16(bf16(x * cos) + bf16(rotate_half(x) * sin)); dim even, <= 1024.
void rotary_rows(const uint16_t* x, const uint16_t* cos, const uint16_t* sin, uint16_t* y,
                 int64_t heads, int64_t dim);

}  // namespace zerolayer
