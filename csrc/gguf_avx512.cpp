// The GGUF kernels for AVX-512 with VNNI (F, BW, DQ, VL, VNNI): the integer dot products with
// vpdpbusd and vpdpwssd on 256-bit vectors, F16 weights widened with vcvtph2ps (gguf_isa.h).

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "gguf_kernels.h"
#include "kernels.h"
#include "simd.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c,bmi2")
#pragma GCC optimize("fp-contract=off")

namespace zerolayer {
namespace gguf {
namespace avx512 {
namespace {

#define ZL_GGUF_VNNI 1
#include "gguf_isa.h"
#undef ZL_GGUF_VNNI

}  // namespace
}  // namespace avx512
}  // namespace gguf
}  // namespace zerolayer

// NOTE: outside the target region: the table is read on every CPU.
#pragma GCC pop_options

namespace zerolayer {
namespace gguf {

const IsaKernels& avx512_kernels() {
  static const IsaKernels kernels{"avx512vnni", &avx512::int_rows, &avx512::float_rows,
                                  &avx512::dequantize_row};
  return kernels;
}

}  // namespace gguf
}  // namespace zerolayer
