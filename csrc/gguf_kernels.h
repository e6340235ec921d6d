// What the GGUF kernels share inside the library: the operands of the row kernels, the kernels of
// one instruction set (gguf_avx512.cpp, gguf_avx2.cpp, gguf_portable.cpp) and the choice between
// them. The entry points are in api.h (zl_gguf_*); gguf_linear.cpp documents the arithmetic.
#pragma once

#include <cstdint>
#include <memory>

#include "gguf_blocks.h"

namespace zerolayer {
namespace gguf {

// x [m, k] quantized for the integer dot products (gguf_linear.cpp: QuantizedActs), as pointers
// into its buffers. Only the blocks the weights need are filled: Q8_0 for the 32-element types,
// Q8_K for the K-quants.
struct QuantizedX {
  int64_t m = 0, k = 0;
  // Q8_0, per row of x and block of 32: q [m, k], |q| [m, k], d [m, k / 32], sum of q [m, k / 32]
  const int8_t* q32 = nullptr;
  const uint8_t* abs32 = nullptr;
  const float* d32 = nullptr;
  const int32_t* sum32 = nullptr;
  // Q8_K, per row of x and super-block of 256: q [m, k], d [m, k / 256], sums of q per 16 and
  // per 32 values [m, k / 16] and [m, k / 32]
  const int8_t* q256 = nullptr;
  const float* d256 = nullptr;
  const int16_t* sum16 = nullptr;
  const int16_t* sum16x2 = nullptr;
};

// One weight [n, k] of a GGUF type (read in place) and its output y [m, n].
struct WeightRows {
  int32_t type;
  const uint8_t* w;
  int64_t row_bytes;
  int64_t n;
  void* y;      // float32, or bfloat16 where y_bf16
  bool y_bf16;
};

// The kernels of one instruction set. The row kernels compute rows [n0, n1) of y = x @
// dequant(w)^T for rows [m0, m0 + m) of x, m <= kMaxSkinnyRows (held in registers: callers
// with more rows tile them), each weight row read once.
struct IsaKernels {
  const char* name;
  // x quantized (QuantizedX): the types of Domain::kQ8_0 and kQ8_K
  void (*int_rows)(const QuantizedX& x, int64_t m0, int64_t m, const WeightRows& w, int64_t n0,
                   int64_t n1);
  // float32 x [*, k] against any type, the weights dequantized exactly, float32 FMA
  void (*float_rows)(const float* x, int64_t k, int64_t m0, int64_t m, const WeightRows& w,
                     int64_t n0, int64_t n1);
  // one row of k values of `type` dequantized exactly into out32 (float32) or rounded to
  // nearest even into out16 (bfloat16); exactly one of them is set
  void (*dequantize_row)(int32_t type, const uint8_t* row, int64_t k, float* out32,
                         uint16_t* out16);
};

const IsaKernels& avx512_kernels();
const IsaKernels& avx2_kernels();
const IsaKernels& portable_kernels();

// The best kernels this CPU runs (cpu_features.h), or the ones named isa ("avx512vnni", "avx2",
// "portable"; nullptr: the best). Throws Error for an unknown name or one this CPU does not run.
const IsaKernels& isa_kernels(const char* isa);

// ys[i] [m, ns[i]] = x [m, k] @ dequant(ws[i] [ns[i], k] of types[i])^T for count weights, in
// x's dtype (bfloat16 where bf16, else float32), with the kernels isa (nullptr: the best), in
// one parallel region of num_threads (api.h: zl_gguf_linear).
void linear(const void* x, bool bf16, int64_t m, int64_t k, int64_t count, const int32_t* types,
            const void* const* ws, const int64_t* ns, void* const* ys, const char* isa,
            int num_threads);

// x quantized per block for the integer kernels, with buffers reused between calls. Filled for
// the domains a call's weights need; may throw, so prepare it outside a parallel region.
class QuantizedActs {
 public:
  QuantizedActs();
  ~QuantizedActs();
  QuantizedActs(const QuantizedActs&) = delete;
  QuantizedActs& operator=(const QuantizedActs&) = delete;

  // Widens x [m, k] (bfloat16 where bf16, else float32) to float32 and quantizes it: Q8_0
  // blocks where q8_0, Q8_K super-blocks where q8_k (k a multiple of 32, resp. 256; Error
  // otherwise), rows of x shared out over num_threads.
  void quantize(const void* x, bool bf16, int64_t m, int64_t k, bool q8_0, bool q8_k,
                int num_threads);

  const QuantizedX& view() const;
  const float* widened() const;  // x as float32 [m, k]

 private:
  struct Buffers;
  std::unique_ptr<Buffers> buffers_;
};

}  // namespace gguf
}  // namespace zerolayer
