// y = x @ w^T for a handful of rows of x (decode: one row per running sequence) in bfloat16.
//
// At batch 1 a decode step reads every weight once and does two flops per weight byte pair, so it
// is bound by memory bandwidth, not arithmetic (Williams et al. 2009, "Roofline"). This kernel
// streams each weight row once, widens it from bfloat16 to float32 in registers (bfloat16 is the top
// half of a float32) and multiplies it with every row of x while it is in registers, accumulating in
// float32. Output rows are split across threads in contiguous ranges of weight rows, so each thread
// reads one contiguous slice of w and the hardware prefetcher sees a sequential stream.
//
// One path per instruction set, picked at load time by cpu_has (cpu_features.h, so that a build
// capped at AVX2 runs the AVX2 path on any CPU), best first:
// - "avx512bf16": where the CPU has AVX-512 BF16 (Cooper Lake, Sapphire Rapids, Zen 4 and
//   later), vdpbf16ps multiplies bfloat16 pairs straight from memory;
// - "avx512": the float32-widening loop below compiled for x86-64-v4;
// - "avx2": AVX2 + FMA intrinsics. A 32-byte load holds 16 weights; each 32-bit lane's low
//   bfloat16 shifted up and its high one masked are the 8 even- and the 8 odd-indexed weights as
//   float32 (2 integer operations, no shuffle), so x is widened once per call into that order
//   (GemvX::kFloat32EvenOdd) and each 16 weights cost 2 FMAs per row of x. 4 weight rows are
//   interleaved for M <= 2 (2 for more rows): as many independent accumulator chains and read
//   streams;
// - "portable": the widening loop for the build's baseline target.
// zl_skinny_linear takes a path by name (tests and comparisons; skinny_linear_widened is the best
// one without vdpbf16ps).
//
// Python reference this is tested against: torch.nn.functional.linear.

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "api.h"
#include "cpu_features.h"
#include "gemv.h"
#include "kernels.h"
#include "parallel.h"
#include "simd.h"
#include "gemv_avx2.h"
#include "simd_avx2.h"

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

// Rows [n0, n1) of w against all M rows of x32 (float32 [M, K]); K a multiple of kLanes. For the
// build's baseline target: plain loops over arrays of kLanes floats, which the compiler vectorizes
// for it (a GCC vector of 16 floats wider than the target's registers would live on the stack).
template <int M>
void rows_portable(
    const void* x, const uint16_t* w, uint16_t* y, int64_t k, int64_t n, int64_t n0, int64_t n1) {
  const float* x32 = static_cast<const float*>(x);
  for (int64_t r = n0; r < n1; ++r) {
    const uint16_t* wr = w + r * k;
    float acc[M][kLanes] = {};
    for (int64_t j = 0; j < k; j += kLanes) {
      __builtin_prefetch(wr + j + kPrefetchRows * k, 0, kPrefetchLocality);
      float wv[kLanes];
      for (int l = 0; l < kLanes; ++l) wv[l] = simd::from_bf16(wr[j + l]);
      for (int m = 0; m < M; ++m) {
        for (int l = 0; l < kLanes; ++l) acc[m][l] += wv[l] * x32[m * k + j + l];
      }
    }
    for (int m = 0; m < M; ++m) {
      float s = 0.f;
      for (int l = 0; l < kLanes; ++l) s += acc[m][l];
      y[m * n + r] = to_bf16(s);
    }
  }
}

#if ZL_X86
// The same with 16-float vectors, one AVX-512 register each.
template <int M>
ZL_TARGET_AVX512 void rows_avx512(
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
// Rows [n0, n1) of w against all M rows of x (bfloat16 [M, K]) with AVX-512 BF16's vdpbf16ps:
// each lane adds the products of a pair of bfloat16 values to a float32 accumulator. The products
// are exact in float32 (8-bit significands), so this differs from the widening loop only in the
// order of the float32 additions (and in flushing subnormals); x needs no widening.
template <int M>
__attribute__((target("avx512f,avx512bw,avx512bf16"))) void rows_avx512bf16(
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

template <int M>
ZL_TARGET_AVX2 void rows_avx2(
    const void* x, const uint16_t* w, uint16_t* y, int64_t k, int64_t n, int64_t n0, int64_t n1) {
  constexpr int R = M <= 2 ? 4 : 2;
  const float* x32 = static_cast<const float*>(x);
  int64_t r = n0;
  for (; r + R <= n1; r += R) avx2::gemv_block<M, R>(x32, w, y, k, n, r);
  for (; r < n1; ++r) avx2::gemv_block<M, 1>(x32, w, y, k, n, r);
}
#endif  // ZL_X86

// One path: its name, whether this CPU (under the build's cap) runs it, its kernels by M.
struct Path {
  const char* name;
  bool (*usable)();
  GemvX x;
  GemvRowsFn fns[kMaxSkinnyRows];
};

#define ZL_ROWS(KERNEL) {&KERNEL<1>, &KERNEL<2>, &KERNEL<3>, &KERNEL<4>}
static_assert(kMaxSkinnyRows == 4, "one kernel per number of rows of x");

// Best first.
const Path kPaths[] = {
#if ZL_X86
    {"avx512bf16", [] { return cpu_has(CpuFeature::kAvx512Bf16); }, GemvX::kBf16,
     ZL_ROWS(rows_avx512bf16)},
    {"avx512", [] { return cpu_has(CpuFeature::kAvx512); }, GemvX::kFloat32,
     ZL_ROWS(rows_avx512)},
    {"avx2", [] { return cpu_has(CpuFeature::kAvx2Fma); }, GemvX::kFloat32EvenOdd,
     ZL_ROWS(rows_avx2)},
#endif
    {"portable", [] { return true; }, GemvX::kFloat32, ZL_ROWS(rows_portable)},
};
#undef ZL_ROWS

// The path named isa (nullptr: the best; "widened": the best without vdpbf16ps).
const Path& path_for(const char* isa) {
  const bool widened = isa != nullptr && std::strcmp(isa, "widened") == 0;
  for (const Path& path : kPaths) {
    if (isa == nullptr || widened) {
      if (path.usable() && !(widened && path.x == GemvX::kBf16)) return path;
    } else if (std::strcmp(path.name, isa) == 0) {
      ZL_CHECK(path.usable(), "skinny_linear: ", isa, " does not run on this CPU or build");
      return path;
    }
  }
  fail("skinny_linear: unknown ISA ", isa);
}

const Path& best_path() {
  static const Path& best = path_for(nullptr);
  return best;
}

GemvRows rows_of(const Path& path, int64_t m) {
  if (m < 1 || m > kMaxSkinnyRows) return {nullptr, path.x, path.name};
  return {path.fns[m - 1], path.x, path.name};
}

}  // namespace

namespace {

// Grain: 256 KiB of weights per task at least, so small matrices stay on one thread.
int64_t grain_rows(int64_t k) { return std::max<int64_t>(1, (256 << 10) / (2 * k)); }

// y_i = x @ w_i^T for count weights w_i [n_i, k] in one parallel region over all their rows.
// NOTE: one region for all the weights (q, k, v or gate, up): each region is a barrier and,
// with passive OpenMP waiting, a wake-up per thread; the weights stay where the loader mapped
// them (no concatenated copy).
void linears(const uint16_t* x, int64_t m, int64_t k, int64_t count, const uint16_t* const* ws,
             const int64_t* ns, uint16_t* const* ys, const Path& path, int num_threads) {
  ZL_CHECK(count >= 1, "skinny_linear_multi: at least one w expected");
  ZL_CHECK(m >= 1 && m <= kMaxSkinnyRows, "skinny_linear: 1 to ", kMaxSkinnyRows, " rows of x");
  ZL_CHECK(k % kLanes == 0, "skinny_linear: K must be a multiple of ", kLanes);
  const GemvRows rows = rows_of(path, m);
  std::vector<float> x32(rows.x == GemvX::kBf16 ? 0 : m * k);
  const void* xp = gemv_prepare_x(rows, x, m * k, x32.data());
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

GemvRows gemv_rows(int64_t m) { return rows_of(best_path(), m); }

const void* gemv_prepare_x(const GemvRows& rows, const uint16_t* x, int64_t count, float* x32) {
  switch (rows.x) {
    case GemvX::kBf16:
      return x;
    case GemvX::kFloat32:
      for (int64_t i = 0; i < count; ++i) x32[i] = simd::from_bf16(x[i]);
      return x32;
    case GemvX::kFloat32EvenOdd:
      for (int64_t j = 0; j < count; j += kLanes) {
        for (int64_t i = 0; i < kLanes / 2; ++i) {
          x32[j + i] = simd::from_bf16(x[j + 2 * i]);
          x32[j + kLanes / 2 + i] = simd::from_bf16(x[j + 2 * i + 1]);
        }
      }
      return x32;
  }
  return x;
}

bool has_bf16_dot() { return best_path().x == GemvX::kBf16; }

const char* skinny_linear_isa(bool widened) {
  return (widened ? path_for("widened") : best_path()).name;
}

}  // namespace zerolayer

int32_t zl_skinny_linear(const uint16_t* x, const uint16_t* w, uint16_t* y, int64_t m, int64_t k,
                         int64_t n, const char* isa, int32_t num_threads) {
  using namespace zerolayer;
  return guarded([&] { linears(x, m, k, 1, &w, &n, &y, path_for(isa), num_threads); });
}

int32_t zl_skinny_linear_multi(const uint16_t* x, int64_t m, int64_t k, int64_t count,
                               const uint16_t* const* ws, const int64_t* ns, uint16_t* const* ys,
                               int32_t num_threads) {
  using namespace zerolayer;
  return guarded([&] { linears(x, m, k, count, ws, ns, ys, best_path(), num_threads); });
}
