// The GGUF kernels for AVX2 + FMA + F16C (x86-64-v3): the integer dot products with vpmaddubsw
// and vpmaddwd, F16 weights widened with vcvtph2ps (gguf_isa.h).

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "gguf_kernels.h"
#include "kernels.h"
#include "simd.h"

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,bmi2")
#pragma GCC optimize("fp-contract=off")

namespace zerolayer {
namespace gguf {
namespace avx2 {
namespace {

#define ZL_GGUF_VNNI 0
#include "gguf_isa.h"
#undef ZL_GGUF_VNNI

}  // namespace
}  // namespace avx2
}  // namespace gguf
}  // namespace zerolayer

// NOTE: outside the target region: the table is read on every CPU.
#pragma GCC pop_options

namespace zerolayer {
namespace gguf {

const IsaKernels& avx2_kernels() {
  static const IsaKernels kernels{"avx2", &avx2::int_rows, &avx2::float_rows,
                                  &avx2::dequantize_row};
  return kernels;
}

}  // namespace gguf
}  // namespace zerolayer
