// The decode GEMV's row kernels (csrc/skinny_linear.cpp), for the kernels that run them inside
// their own parallel region (csrc/decode_forward.cpp).
#pragma once

#include <cstdint>

namespace zerolayer {

// y[m * n + r] = bf16(sum_j x[m * k + j] * w[r * k + j]) for rows r in [n0, n1) of w (bfloat16
// [n, k]) and all M rows of x: x is bfloat16 [M, k] when GemvRows::bf16_x, else float32.
using GemvRowsFn = void (*)(const void* x, const uint16_t* w, uint16_t* y, int64_t k, int64_t n,
                            int64_t n0, int64_t n1);

struct GemvRows {
  GemvRowsFn fn;  // nullptr when M is out of range
  bool bf16_x;    // whether fn takes x in bfloat16 (else float32)
};

// The row kernel skinny_linear uses for M rows of x on this CPU (1 <= M <= kMaxSkinnyRows).
GemvRows gemv_rows(int64_t m);

}  // namespace zerolayer
