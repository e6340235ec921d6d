// y = x @ w^T for a handful of rows of x (decode: one row per running sequence) in bfloat16.
//
// At batch 1 a decode step reads every weight once and does two flops per weight byte pair, so it
// is bound by memory bandwidth, not arithmetic (Williams et al. 2009, "Roofline"). This kernel
// streams each weight row once, widens it from bfloat16 to float32 in registers (bfloat16 is the top
// half of a float32) and multiplies it with every row of x while it is in registers, accumulating in
// float32. Output rows are split across threads in contiguous ranges of weight rows, so each thread
// reads one contiguous slice of w and the hardware prefetcher sees a sequential stream.
//
// Vectors are GCC/Clang vector extensions compiled for x86-64-v4, x86-64-v3 and baseline with the
// right one picked at load time (target_clones), like paged_attention.cpp. Where the CPU has
// AVX-512 BF16 (Cooper Lake, Sapphire Rapids, Zen 4 and later), the dot product instruction
// vdpbf16ps multiplies bfloat16 pairs straight from memory instead (skinny_linear_widened keeps the
// widening loop callable for comparison).
//
// Python reference this is tested against: torch.nn.functional.linear.

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "api.h"
#include "gemv.h"
#include "kernels.h"
#include "parallel.h"
#include "simd.h"

namespace zerolayer {
namespace {

using simd::hsum;
using simd::kLanes;
using simd::to_bf16;
using simd::VecF;
using simd::widen;

// Software prefetch of the weight row kPrefetchRows ahead, into L2 (locality 1: prefetcht2).
// The hardware prefetcher alone leaves one core at about two thirds of its read rate: measured
// here over one token's matrices of the `small` preset (200 MB, 2 threads), 13.7 GB/s without,
// 22.5 GB/s with this hint and 9.9 GB/s with the non-temporal one (locality 0, prefetchnta, which
// this kernel used before: it bypasses L2, so each line arrived just in time or late).
constexpr int64_t kPrefetchRows = 4;
constexpr int kPrefetchLocality = 1;

// Rows [n0, n1) of w against all M rows of x32 (float32 [M, K]); K a multiple of kLanes.
template <int M>
ZL_MULTIVERSION void rows_kernel(
    const void* x, const uint16_t* w, uint16_t* y, int64_t k, int64_t n, int64_t n0, int64_t n1) {
  const float* x32 = static_cast<const float*>(x);
  for (int64_t r = n0; r < n1; ++r) {
    const uint16_t* wr = w + r * k;
    VecF acc[M];
    for (int m = 0; m < M; ++m) acc[m] = VecF{};
    for (int64_t j = 0; j < k; j += kLanes) {
      __builtin_prefetch(wr + j + kPrefetchRows * k, 0, kPrefetchLocality);
      VecF wv = widen(wr + j);
      for (int m = 0; m < M; ++m) {
        VecF xv;
        std::memcpy(&xv, x32 + m * k + j, sizeof(xv));
        acc[m] += wv * xv;
      }
    }
    for (int m = 0; m < M; ++m) y[m * n + r] = to_bf16(hsum(acc[m]));
  }
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define ZL_HAVE_BF16_DOT 1
// Rows [n0, n1) of w against all M rows of x (bfloat16 [M, K]) with AVX-512 BF16's vdpbf16ps:
// each lane adds the products of a pair of bfloat16 values to a float32 accumulator. The products
// are exact in float32 (8-bit significands), so this differs from rows_kernel only in the order
// of the float32 additions (and in flushing subnormals); x needs no widening since it is bfloat16.
template <int M>
__attribute__((target("avx512f,avx512bw,avx512bf16"))) void rows_kernel_bf16_dot(
    const void* x, const uint16_t* w, uint16_t* y, int64_t k, int64_t n, int64_t n0, int64_t n1) {
  const uint16_t* x16 = static_cast<const uint16_t*>(x);
  for (int64_t r = n0; r < n1; ++r) {
    const uint16_t* wr = w + r * k;
    __m512 acc[M];
    for (int m = 0; m < M; ++m) acc[m] = _mm512_setzero_ps();
    int64_t j = 0;
    for (; j + 32 <= k; j += 32) {
      __builtin_prefetch(wr + j + kPrefetchRows * k, 0, kPrefetchLocality);
      const __m512i wv = _mm512_loadu_si512(wr + j);
      for (int m = 0; m < M; ++m) {
        const __m512i xv = _mm512_loadu_si512(x16 + m * k + j);
        acc[m] = _mm512_dpbf16_ps(acc[m], (__m512bh)wv, (__m512bh)xv);
      }
    }
    if (j < k) {  // K is a multiple of 16: one half vector left, the other half zeros
      const __m512i wv = _mm512_maskz_loadu_epi16(0xffff, wr + j);
      for (int m = 0; m < M; ++m) {
        const __m512i xv = _mm512_maskz_loadu_epi16(0xffff, x16 + m * k + j);
        acc[m] = _mm512_dpbf16_ps(acc[m], (__m512bh)wv, (__m512bh)xv);
      }
    }
    for (int m = 0; m < M; ++m) {
      VecF v;
      std::memcpy(&v, &acc[m], sizeof(v));
      y[m * n + r] = to_bf16(hsum(v));
    }
  }
}
#endif

using Rows = GemvRows;

bool has_bf16_dot_cpu() {
#ifdef ZL_HAVE_BF16_DOT
  return __builtin_cpu_supports("avx512bf16");
#else
  return false;
#endif
}

Rows rows_for(int64_t m, bool bf16_dot) {
#ifdef ZL_HAVE_BF16_DOT
  if (bf16_dot) {
    switch (m) {
      case 1: return {&rows_kernel_bf16_dot<1>, true};
      case 2: return {&rows_kernel_bf16_dot<2>, true};
      case 3: return {&rows_kernel_bf16_dot<3>, true};
      case 4: return {&rows_kernel_bf16_dot<4>, true};
      default: return {nullptr, false};
    }
  }
#endif
  switch (m) {
    case 1: return {&rows_kernel<1>, false};
    case 2: return {&rows_kernel<2>, false};
    case 3: return {&rows_kernel<3>, false};
    case 4: return {&rows_kernel<4>, false};
    default: return {nullptr, false};
  }
}

}  // namespace

namespace {

// Grain: 256 KiB of weights per task at least, so small matrices stay on one thread.
int64_t grain_rows(int64_t k) { return std::max<int64_t>(1, (256 << 10) / (2 * k)); }

// x as the row kernel reads it: the bfloat16 x itself, or widened to float32 into x32.
const void* x_for(const uint16_t* x, int64_t count, const Rows& rows, std::vector<float>& x32) {
  if (rows.bf16_x) return x;
  x32.resize(count);
  for (int64_t i = 0; i < count; ++i) x32[i] = simd::from_bf16(x[i]);
  return x32.data();
}

// y_i = x @ w_i^T for count weights w_i [n_i, k] in one parallel region over all their rows.
// NOTE: one region for all the weights (q, k, v or gate, up): each region is a barrier and,
// with passive OpenMP waiting, a wake-up per thread; the weights stay where the loader mapped
// them (no concatenated copy).
void linears(const uint16_t* x, int64_t m, int64_t k, int64_t count, const uint16_t* const* ws,
             const int64_t* ns, uint16_t* const* ys, bool bf16_dot, int num_threads) {
  ZL_CHECK(count >= 1, "skinny_linear_multi: at least one w expected");
  ZL_CHECK(m >= 1 && m <= kMaxSkinnyRows, "skinny_linear: 1 to ", kMaxSkinnyRows, " rows of x");
  ZL_CHECK(k % kLanes == 0, "skinny_linear: K must be a multiple of ", kLanes);
  const Rows rows = rows_for(m, bf16_dot);
  std::vector<float> x32;
  const void* xp = x_for(x, m * k, rows, x32);
  // weight i owns rows [starts[i], starts[i + 1]) of the concatenation
  std::vector<int64_t> starts{0};
  for (int64_t i = 0; i < count; ++i) starts.push_back(starts.back() + ns[i]);
  parallel_for(0, starts.back(), grain_rows(k), num_threads, [&](int64_t r0, int64_t r1) {
    for (int64_t i = 0; i < count; ++i) {
      const int64_t lo = std::max(r0, starts[i]), hi = std::min(r1, starts[i + 1]);
      if (lo < hi) rows.fn(xp, ws[i], ys[i], k, ns[i], lo - starts[i], hi - starts[i]);
    }
  });
}

}  // namespace

GemvRows gemv_rows(int64_t m) { return rows_for(m, has_bf16_dot()); }

bool has_bf16_dot() {
  static const bool supported = has_bf16_dot_cpu();
  return supported;
}

}  // namespace zerolayer

int32_t zl_skinny_linear(const uint16_t* x, const uint16_t* w, uint16_t* y, int64_t m, int64_t k,
                         int64_t n, int32_t widened, int32_t num_threads) {
  using namespace zerolayer;
  return guarded([&] {
    linears(x, m, k, 1, &w, &n, &y, !widened && has_bf16_dot(), num_threads);
  });
}

int32_t zl_skinny_linear_multi(const uint16_t* x, int64_t m, int64_t k, int64_t count,
                               const uint16_t* const* ws, const int64_t* ns, uint16_t* const* ys,
                               int32_t num_threads) {
  using namespace zerolayer;
  return guarded([&] { linears(x, m, k, count, ws, ns, ys, has_bf16_dot(), num_threads); });
}
