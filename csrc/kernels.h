// Entry points of the zerolayer native CPU kernels (bound to Python in paged_attention.cpp).
#pragma once

#include <ATen/ATen.h>

#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace zerolayer {

// Most rows of x skinny_linear takes (decode batches up to this size use it).
constexpr int64_t kMaxSkinnyRows = 4;

// y [M, N] = x [M, K] @ w [N, K]^T in bfloat16, float32 accumulation; M <= kMaxSkinnyRows.
at::Tensor skinny_linear(const at::Tensor& x, const at::Tensor& w);

// skinny_linear through the float32-widening loop whatever the CPU (for comparisons).
at::Tensor skinny_linear_widened(const at::Tensor& x, const at::Tensor& w);

// Whether skinny_linear uses AVX-512 BF16's dot product (vdpbf16ps) on this CPU.
bool has_bf16_dot();

// skinny_linear of one x with each of ws (same K) in one parallel region: [x @ w^T for w in ws].
std::vector<at::Tensor> skinny_linear_multi(const at::Tensor& x, const std::vector<at::Tensor>& ws);

// y [M, N] = x [M, K] @ w [N, K]^T, bfloat16 or float32 (both the same), float32 accumulation in
// a fixed order per output: row m of y depends only on row m of x and on w, for any M.
at::Tensor invariant_linear(const at::Tensor& x, const at::Tensor& w);

// y [M, N] = x [M, K] @ dequant(wq [N, K] int8, ws [N, K / G] float32)^T, x bfloat16 or float32
// quantized per group of G to int8 (Q8_0), int32 dot products per group, float32 accumulation;
// M <= kMaxSkinnyRows. Result in x's dtype.
at::Tensor int8_linear(const at::Tensor& x, const at::Tensor& wq, const at::Tensor& ws);

// The instruction set int8_linear uses on this CPU for group size G ("avx512vnni", "avxvnni",
// "portable").
const char* int8_linear_isa(int64_t group_size);

// int8_linear with the kernel named isa (one of int8_linear_isa's answers, or "avx512vnni256":
// AVX512-VNNI on 32-byte vectors); raises if this CPU or G does not run it (for comparisons).
at::Tensor int8_linear_with_isa(const at::Tensor& x, const at::Tensor& wq, const at::Tensor& ws,
                                const std::string& isa);

// int8_linear of one x with each (wq, ws) of ws (same K and G) in one parallel region, x
// quantized once: [int8_linear(x, wq, ws) for (wq, ws) in ws], the same values.
std::vector<at::Tensor> int8_linear_multi(
    const at::Tensor& x, const std::vector<std::pair<at::Tensor, at::Tensor>>& ws);

// The elementwise steps of a layer (csrc/elementwise.cpp), rows independent of each other.
// RMSNorm of x [..., H] (bfloat16, contiguous) with weight [H] -> x's shape and dtype.
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);

// (s, rms_norm(s)) with s = h + d rounded to h's dtype: a residual add and the next norm.
std::tuple<at::Tensor, at::Tensor> add_rms_norm(const at::Tensor& h, const at::Tensor& d,
                                                const at::Tensor& weight, double eps);

// RoPE (rotate-half) of bfloat16 x [T, heads, D] by cos, sin [T, 1, D] bfloat16 -> [T, heads, D].
at::Tensor rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

}  // namespace zerolayer
