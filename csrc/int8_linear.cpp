// y = x @ dequant(w)^T for a handful of rows of x (decode) with int8 weights in groups along K.
//
// The weights are symmetric int8 with one float32 scale per group of G consecutive K elements
// (zerolayer/checkpoints/int8_format.py, llama.cpp's Q8_0). Each call quantizes x the same way
// (per row and group: d = max|x| / 127, q = round(x / d)), so that every group's dot product is an
// exact int32 sum of int8 products, then scaled by d_x * d_w and accumulated in float32, as
// llama.cpp's ggml_vec_dot_q8_0_q8_0 does. A decode step reads each weight once; int8 halves the
// bytes of bfloat16.
//
// The int8 products use vpdpbusd (AVX512-VNNI with AVX512VL, or AVX-VNNI, on 32-byte vectors: one
// group of 32 per instruction). It multiplies unsigned by signed bytes, so x's sign moves onto w:
// |x| * (sign(x) w) = x w (vpsignb; both are in [-127, 127], so no -128 overflows). The ISA is
// picked once at load time (__builtin_cpu_supports); the fallback is plain C++ that the compiler
// vectorizes (ZL_MULTIVERSION). Output rows are split across threads with at::parallel_for.
//
// Python reference this is tested against: int8_linear_reference in
// zerolayer/scheduler/model/int8_linear.py.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels.h"
#include "simd.h"

namespace zerolayer {
namespace {

// One call's operands: x quantized (xq int8 [M, K], |xq| as uint8, xs [M, K / G]) and the
// weights (wq int8 [N, K], ws [N, K / G]); y float32 [M, N].
struct Operands {
  const int8_t* xq;
  const uint8_t* xabs;
  const float* xs;
  const int8_t* wq;
  const float* ws;
  float* y;
  int64_t m, n, k, g;
};

// Software prefetch of the weight row kPrefetchRows ahead (and its scales) into L2, as
// skinny_linear.cpp does: the hardware prefetcher alone leaves a core well below its read rate.
// 8 int8 rows are about as many bytes ahead as skinny_linear's 4 bfloat16 rows.
constexpr int64_t kPrefetchRows = 8;
constexpr int kPrefetchLocality = 1;

// Rows [n0, n1) of y with the VNNI instruction DPBUSD on 32-byte chunks (G a multiple of 32).
#define ZL_INT8_VNNI_ROWS(NAME, TARGET, DPBUSD)                                              \
  __attribute__((target(TARGET))) void NAME(const Operands& o, int64_t n0, int64_t n1) {   \
    const int64_t groups = o.k / o.g;                                                      \
    for (int64_t r = n0; r < n1; ++r) {                                                    \
      const int8_t* wr = o.wq + r * o.k;                                                   \
      const float* wsr = o.ws + r * groups;                                                \
      for (int64_t j = 0; j < o.k; j += 64)                                                \
        __builtin_prefetch(wr + kPrefetchRows * o.k + j, 0, kPrefetchLocality);            \
      __builtin_prefetch(wsr + kPrefetchRows * groups, 0, kPrefetchLocality);              \
      for (int64_t m = 0; m < o.m; ++m) {                                                  \
        const int8_t* xr = o.xq + m * o.k;                                                 \
        const uint8_t* ar = o.xabs + m * o.k;                                              \
        const float* xsr = o.xs + m * groups;                                              \
        __m256 acc = _mm256_setzero_ps();                                                  \
        for (int64_t gi = 0; gi < groups; ++gi) {                                          \
          __m256i isum = _mm256_setzero_si256();                                           \
          for (int64_t j = gi * o.g; j < (gi + 1) * o.g; j += 32) {                        \
            const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wr + j)); \
            const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xr + j)); \
            const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ar + j)); \
            isum = DPBUSD(isum, a, _mm256_sign_epi8(w, x));                                \
          }                                                                                \
          acc = _mm256_fmadd_ps(                                                           \
              _mm256_cvtepi32_ps(isum), _mm256_set1_ps(xsr[gi] * wsr[gi]), acc);           \
        }                                                                                  \
        alignas(32) float lanes[8];                                                        \
        _mm256_store_ps(lanes, acc);                                                       \
        float s = 0.f;                                                                     \
        for (float v : lanes) s += v;                                                      \
        o.y[m * o.n + r] = s;                                                              \
      }                                                                                    \
    }                                                                                      \
  }

ZL_INT8_VNNI_ROWS(rows_avx512vnni, "avx512vnni,avx512vl,avx512bw,avx512f,avx2,fma", _mm256_dpbusd_epi32)
ZL_INT8_VNNI_ROWS(rows_avxvnni, "avxvnni,avx2,fma", _mm256_dpbusd_avx_epi32)
#undef ZL_INT8_VNNI_ROWS

// Any G: per group an int32 sum of int8 products (vectorized by the compiler), then its scales.
ZL_MULTIVERSION void rows_portable(const Operands& o, int64_t n0, int64_t n1) {
  const int64_t groups = o.k / o.g;
  for (int64_t r = n0; r < n1; ++r) {
    const int8_t* wr = o.wq + r * o.k;
    for (int64_t m = 0; m < o.m; ++m) {
      const int8_t* xr = o.xq + m * o.k;
      float acc = 0.f;
      for (int64_t gi = 0; gi < groups; ++gi) {
        int32_t isum = 0;
        for (int64_t j = gi * o.g; j < (gi + 1) * o.g; ++j) {
          isum += static_cast<int32_t>(xr[j]) * static_cast<int32_t>(wr[j]);
        }
        acc += static_cast<float>(isum) * (o.xs[m * groups + gi] * o.ws[r * groups + gi]);
      }
      o.y[m * o.n + r] = acc;
    }
  }
}

using RowsFn = void (*)(const Operands&, int64_t, int64_t);

// The best kernel this CPU runs for group size g, and its name.
RowsFn rows_for(int64_t g, const char** isa) {
  if (g % 32 == 0) {
    if (__builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512bw")) {
      *isa = "avx512vnni";
      return &rows_avx512vnni;
    }
    if (__builtin_cpu_supports("avxvnni")) {
      *isa = "avxvnni";
      return &rows_avxvnni;
    }
  }
  *isa = "portable";
  return &rows_portable;
}

// Q8_0 quantization of x32 [M, K] per group of g: xq, |xq| and the scales d = max|x| / 127.
void quantize_rows(const float* x, int64_t m, int64_t k, int64_t g, int8_t* xq, uint8_t* xabs,
                   float* xs) {
  const int64_t groups = k / g;
  for (int64_t i = 0; i < m * groups; ++i) {
    const float* xg = x + i * g;
    float amax = 0.f;
    for (int64_t j = 0; j < g; ++j) amax = std::max(amax, std::fabs(xg[j]));
    const float d = amax / 127.f;
    const float inverse = d > 0.f ? 1.f / d : 0.f;
    xs[i] = d;
    for (int64_t j = 0; j < g; ++j) {
      // nearbyint: round half to even in the default rounding mode, as torch.round.
      const float q = std::min(127.f, std::max(-127.f, std::nearbyint(xg[j] * inverse)));
      xq[i * g + j] = static_cast<int8_t>(q);
      xabs[i * g + j] = static_cast<uint8_t>(std::fabs(q));
    }
  }
}

}  // namespace

const char* int8_linear_isa(int64_t group_size) {
  const char* isa = nullptr;
  rows_for(group_size, &isa);
  return isa;
}

at::Tensor int8_linear(const at::Tensor& x, const at::Tensor& wq, const at::Tensor& ws) {
  TORCH_CHECK(x.dim() == 2 && wq.dim() == 2 && ws.dim() == 2,
              "int8_linear: x [M, K], w [N, K] and scales [N, K / G] expected");
  TORCH_CHECK(wq.scalar_type() == at::kChar, "int8_linear: int8 w expected");
  TORCH_CHECK(ws.scalar_type() == at::kFloat, "int8_linear: float32 scales expected");
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kFloat,
              "int8_linear: bfloat16 or float32 x expected");
  TORCH_CHECK(wq.is_contiguous() && ws.is_contiguous(), "int8_linear: contiguous w and scales");
  const int64_t m = x.size(0), k = x.size(1), n = wq.size(0);
  TORCH_CHECK(wq.size(1) == k, "int8_linear: x has ", k, " columns, w ", wq.size(1));
  TORCH_CHECK(ws.size(0) == n && ws.size(1) >= 1 && k % ws.size(1) == 0,
              "int8_linear: scales [", n, ", K / G] expected, got ", ws.sizes());
  TORCH_CHECK(m >= 1 && m <= kMaxSkinnyRows, "int8_linear: 1 to ", kMaxSkinnyRows, " rows of x");
  const int64_t g = k / ws.size(1);
  const at::Tensor x32 = x.to(at::kFloat).contiguous();
  std::vector<int8_t> xq(m * k);
  std::vector<uint8_t> xabs(m * k);
  std::vector<float> xs(m * (k / g));
  quantize_rows(x32.data_ptr<float>(), m, k, g, xq.data(), xabs.data(), xs.data());
  at::Tensor y = at::empty({m, n}, x32.options());
  const Operands o{xq.data(), xabs.data(), xs.data(), wq.data_ptr<int8_t>(),
                   ws.data_ptr<float>(), y.data_ptr<float>(), m, n, k, g};
  const char* isa = nullptr;
  RowsFn fn = rows_for(g, &isa);
  // Grain: 256 KiB of weights per task at least, so small matrices stay on one thread.
  const int64_t grain = std::max<int64_t>(1, (256 << 10) / k);
  at::parallel_for(0, n, grain, [&](int64_t n0, int64_t n1) { fn(o, n0, n1); });
  return y.to(x.scalar_type());
}

}  // namespace zerolayer
