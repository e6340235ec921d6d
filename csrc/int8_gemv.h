// The int8 decode GEMV of csrc/int8_linear.cpp for kernels that run it inside their own parallel
// region (csrc/decode_forward.cpp): x quantized once by one thread, rows shared out by all.
#pragma once

#include <cstdint>
#include <memory>

namespace zerolayer {

class Int8Gemv {
 public:
  // The best kernel this CPU runs for groups of group_size (int8_linear_isa); may throw, so
  // construct it outside a parallel region.
  explicit Int8Gemv(int64_t group_size);
  ~Int8Gemv();
  Int8Gemv(const Int8Gemv&) = delete;
  Int8Gemv& operator=(const Int8Gemv&) = delete;

  // Quantizes bfloat16 x [m, k] per group (Q8_0), as int8_linear does; k a multiple of the group
  // size, m <= kMaxSkinnyRows. Reuses its buffers.
  void quantize(const uint16_t* x, int64_t m, int64_t k);

  // Rows [n0, n1) of y [m, n] (bfloat16) = x @ dequant(wq [n, k] int8, ws [n, k / g])^T.
  void rows(const int8_t* wq, const float* ws, uint16_t* y, int64_t n, int64_t n0,
            int64_t n1) const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace zerolayer
