// The decode GEMV's row kernels (csrc/skinny_linear.cpp), for the kernels that run them inside
// their own parallel region (csrc/decode_forward.cpp).
#pragma once

#include <cstdint>

namespace zerolayer {

// How a row kernel reads x [M, k]: bfloat16 as it is, or float32 widened by gemv_prepare_x,
// in order or (kFloat32EvenOdd) with each 16 columns as their 8 even-indexed then their 8
// odd-indexed values (the order in which AVX2 widens a vector of 16 bfloat16 weights).
enum class GemvX { kBf16, kFloat32, kFloat32EvenOdd };

// y[m * n + r] = bf16(sum_j x[m * k + j] * w[r * k + j]) for rows r in [n0, n1) of w (bfloat16
// [n, k]) and all M rows of x, x read as GemvRows::x says.
using GemvRowsFn = void (*)(const void* x, const uint16_t* w, uint16_t* y, int64_t k, int64_t n,
                            int64_t n0, int64_t n1);

struct GemvRows {
  GemvRowsFn fn;  // nullptr when M is out of range
  GemvX x;        // how fn reads x
  const char* isa;  // the path's name (skinny_linear_isa)
};

// The row kernel skinny_linear uses for M rows of x on this CPU (1 <= M <= kMaxSkinnyRows).
GemvRows gemv_rows(int64_t m);

// x [count] (bfloat16, count a multiple of 16, rows of a multiple of 16) as rows.fn reads it:
// x itself for GemvX::kBf16, else widened into x32 [count].
const void* gemv_prepare_x(const GemvRows& rows, const uint16_t* x, int64_t count, float* x32);

}  // namespace zerolayer
