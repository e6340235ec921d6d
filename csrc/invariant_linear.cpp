// y = x @ w^T whose every row depends only on that row of x and on w: batch invariant.
//
// torch's CPU GEMM picks its blocking, its K split and its micro-kernel from the number of rows M
// (and the thread count), so the same row of x gives a differently rounded result in a batch of 1,
// of 16 or in a prefill chunk of 512 (Thinking Machines 2025, "Defeating Nondeterminism in LLM
// Inference"). This kernel fixes the reduction order of every output (m, r) whatever M is: a
// float32 vector of kLanes accumulators, lane l summing x[m, j] * w[r, j] for j = l, l + kLanes,
// ... in increasing j (one fused multiply-add each where the CPU has FMA), then the lanes summed
// by a fixed tree (tree_sum), then rounded once to the output dtype (bfloat16: to nearest even,
// as torch).
// K need not be a multiple of kLanes: the last partial chunk is loaded into a zeroed vector, and
// adding 0 * w to a lane leaves it unchanged.
//
// Speed comes from tiling, which changes only which outputs are computed together, never the
// order inside one: a tile of kTileM rows of x times kTileN rows of w keeps its kTileM * kTileN
// accumulators in registers and reads each loaded vector several times; rows of x are taken in
// blocks of kBlockM so a block (float32) stays in L2 while every weight tile of a thread's range
// passes over it, each bfloat16 weight tile widened once per block into a float32 copy in L1.
// Threads split the weight rows (parallel.h), so each output is computed by exactly one thread
// and the thread count does not change it either.
//
// GCC vector extensions with target_clones for x86-64-v4 and the baseline; on a CPU with AVX2 but
// no AVX-512 (or in a build capped at AVX2) an AVX2 tile kernel instead: a 16-lane accumulator as
// two 8-float registers, the same fused multiply-add per lane and the same tree, so its results
// equal the AVX-512 clone's bit for bit; it splits each tile into 2 x 2 ones (8 accumulators of
// 16 AVX2 registers: the 4 x 4 tile of 16-float vectors compiled for x86-64-v3 lives on the
// stack). The baseline has no FMA, so its results are invariant on one machine, not bitwise equal
// to the others'.
//
// Python reference this is tested against: torch.nn.functional.linear (close, not bitwise).

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "api.h"
#include "cpu_features.h"
#include "kernels.h"
#include "parallel.h"
#include "simd.h"
#include "simd_avx2.h"

namespace zerolayer {
namespace {

using simd::kLanes;
using simd::to_bf16;
using simd::VecF;
typedef float Vec8 __attribute__((vector_size(32)));
typedef float Vec4 __attribute__((vector_size(16)));

constexpr int kTileM = 4;
constexpr int kTileN = 4;
constexpr int64_t kBlockM = 64;

// kLanes weights starting at src, as float32; `count` < kLanes loads a partial chunk, zero-filled.
inline __attribute__((always_inline)) VecF load_w(const uint16_t* src, int64_t count) {
  if (count == kLanes) return simd::widen(src);
  uint16_t h[kLanes] = {};
  std::memcpy(h, src, count * sizeof(uint16_t));
  return simd::widen(h);
}

inline float widen_value(uint16_t v) { return simd::from_bf16(v); }
inline float widen_value(float v) { return v; }

inline __attribute__((always_inline)) VecF load_w(const float* src, int64_t count) {
  VecF f = VecF{};
  std::memcpy(&f, src, count * sizeof(float));
  return f;
}

// The lanes summed as a tree: lane i + lane i + 8, then i + 4, i + 2, i + 1 (4 vector steps
// instead of 15 dependent adds). Fixed, like every other step of an output's reduction.
inline __attribute__((always_inline)) float tree_sum(VecF v) {
  Vec8 lo8, hi8;
  std::memcpy(&lo8, &v, sizeof(lo8));
  std::memcpy(&hi8, reinterpret_cast<const char*>(&v) + sizeof(lo8), sizeof(hi8));
  const Vec8 s8 = lo8 + hi8;
  Vec4 lo4, hi4;
  std::memcpy(&lo4, &s8, sizeof(lo4));
  std::memcpy(&hi4, reinterpret_cast<const char*>(&s8) + sizeof(lo4), sizeof(hi4));
  const Vec4 s4 = lo4 + hi4;
  return (s4[0] + s4[2]) + (s4[1] + s4[3]);
}

inline void store(uint16_t* y, float v) { *y = to_bf16(v); }
inline void store(float* y, float v) { *y = v; }

// Outputs [m0, m0 + TM) x [r0, r0 + TN). x32: float32 rows of stride kp (K padded with zeros to a
// multiple of kLanes); w: weight rows r0 ... r0 + TN - 1, of stride k; y: rows of stride n.
template <typename W, typename Y, int TM, int TN>
ZL_MULTIVERSION void tile_kernel(
    const float* x32, int64_t kp, const W* w, int64_t k, Y* y, int64_t n, int64_t m0, int64_t r0) {
  VecF acc[TM][TN];
  for (int a = 0; a < TM; ++a)
    for (int b = 0; b < TN; ++b) acc[a][b] = VecF{};
  // One chunk of kLanes columns from j (count of them real, the rest zeros).
  auto step = [&](int64_t j, int64_t count) __attribute__((always_inline)) {
    VecF wv[TN];
    for (int b = 0; b < TN; ++b) wv[b] = load_w(w + b * k + j, count);
    for (int a = 0; a < TM; ++a) {
      VecF xv;
      std::memcpy(&xv, x32 + (m0 + a) * kp + j, sizeof(xv));
      for (int b = 0; b < TN; ++b) acc[a][b] += wv[b] * xv;
    }
  };
  const int64_t full = k - k % kLanes;
  for (int64_t j = 0; j < full; j += kLanes) step(j, kLanes);
  if (full < k) step(full, k - full);
  for (int a = 0; a < TM; ++a)
    for (int b = 0; b < TN; ++b) store(y + (m0 + a) * n + r0 + b, tree_sum(acc[a][b]));
}

template <typename W, typename Y>
using TileFn = void (*)(const float*, int64_t, const W*, int64_t, Y*, int64_t, int64_t, int64_t);

template <typename W, typename Y, int TM>
TileFn<W, Y> tile_for_n(int tn) {
  switch (tn) {
    case 1: return &tile_kernel<W, Y, TM, 1>;
    case 2: return &tile_kernel<W, Y, TM, 2>;
    case 3: return &tile_kernel<W, Y, TM, 3>;
    default: return &tile_kernel<W, Y, TM, kTileN>;
  }
}

template <typename W, typename Y>
TileFn<W, Y> tile_for(int tm, int tn) {
  switch (tm) {
    case 1: return tile_for_n<W, Y, 1>(tn);
    case 2: return tile_for_n<W, Y, 2>(tn);
    case 3: return tile_for_n<W, Y, 3>(tn);
    default: return tile_for_n<W, Y, kTileM>(tn);
  }
}

#if ZL_X86
// kLanes weights from src (count < kLanes: zero-filled) as two 8-float halves, in order.
ZL_AVX2_INLINE void load_halves(const uint16_t* src, int64_t count, __m256& lo, __m256& hi) {
  uint16_t h[kLanes] = {};
  if (count < kLanes) {
    std::memcpy(h, src, count * sizeof(uint16_t));
    src = h;
  }
  lo = avx2::widen8(src);
  hi = avx2::widen8(src + kLanes / 2);
}

ZL_AVX2_INLINE void load_halves(const float* src, int64_t count, __m256& lo, __m256& hi) {
  float f[kLanes] = {};
  if (count < kLanes) {
    std::memcpy(f, src, count * sizeof(float));
    src = f;
  }
  lo = _mm256_loadu_ps(src);
  hi = _mm256_loadu_ps(src + kLanes / 2);
}

// tree_sum of the 16 lanes (lo, hi), in its order: lane i + lane i + 8, then + 4, then
// (0 + 2) + (1 + 3).
ZL_AVX2_INLINE float tree_sum_halves(__m256 lo, __m256 hi) {
  const __m256 s8 = _mm256_add_ps(lo, hi);
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  alignas(16) float v[4];
  _mm_store_ps(v, s4);
  return (v[0] + v[2]) + (v[1] + v[3]);
}

// One chunk of kLanes columns from j (count of them real) of tile_kernel, on halves.
template <typename W, int TM, int TN>
ZL_AVX2_INLINE void step_halves(const float* x32, int64_t kp, const W* w, int64_t k, int64_t m0,
                                int64_t j, int64_t count, __m256 (&lo)[TM][TN],
                                __m256 (&hi)[TM][TN]) {
  __m256 wl[TN], wh[TN];
  for (int b = 0; b < TN; ++b) load_halves(w + b * k + j, count, wl[b], wh[b]);
  for (int a = 0; a < TM; ++a) {
    const __m256 xl = _mm256_loadu_ps(x32 + (m0 + a) * kp + j);
    const __m256 xh = _mm256_loadu_ps(x32 + (m0 + a) * kp + j + kLanes / 2);
    for (int b = 0; b < TN; ++b) {
      lo[a][b] = _mm256_fmadd_ps(wl[b], xl, lo[a][b]);
      hi[a][b] = _mm256_fmadd_ps(wh[b], xh, hi[a][b]);
    }
  }
}

// tile_kernel's outputs [m0, m0 + TM) x [r0, r0 + TN) with AVX2 registers.
template <typename W, typename Y, int TM, int TN>
ZL_AVX2_INLINE void tile_halves(const float* x32, int64_t kp, const W* w, int64_t k, Y* y,
                                int64_t n, int64_t m0, int64_t r0) {
  __m256 lo[TM][TN], hi[TM][TN];
  for (int a = 0; a < TM; ++a) {
    for (int b = 0; b < TN; ++b) lo[a][b] = hi[a][b] = _mm256_setzero_ps();
  }
  const int64_t full = k - k % kLanes;
  for (int64_t j = 0; j < full; j += kLanes) step_halves(x32, kp, w, k, m0, j, kLanes, lo, hi);
  if (full < k) step_halves(x32, kp, w, k, m0, full, k - full, lo, hi);
  for (int a = 0; a < TM; ++a) {
    for (int b = 0; b < TN; ++b) {
      store(y + (m0 + a) * n + r0 + b, tree_sum_halves(lo[a][b], hi[a][b]));
    }
  }
}

// A tile of tm x tn (each at most kTileM, kTileN) as 2 x 2 tiles and their remainders.
template <typename W, typename Y>
ZL_TARGET_AVX2 void tile_avx2(const float* x32, int64_t kp, const W* w, int64_t k, Y* y,
                              int64_t n, int64_t m0, int64_t r0, int tm, int tn) {
  for (int a = 0; a < tm; a += 2) {
    for (int b = 0; b < tn; b += 2) {
      const W* wb = w + b * k;
      const int shape = 2 * std::min(2, tm - a) + std::min(2, tn - b);
      switch (shape) {
        case 3: tile_halves<W, Y, 1, 1>(x32, kp, wb, k, y, n, m0 + a, r0 + b); break;
        case 4: tile_halves<W, Y, 1, 2>(x32, kp, wb, k, y, n, m0 + a, r0 + b); break;
        case 5: tile_halves<W, Y, 2, 1>(x32, kp, wb, k, y, n, m0 + a, r0 + b); break;
        default: tile_halves<W, Y, 2, 2>(x32, kp, wb, k, y, n, m0 + a, r0 + b); break;
      }
    }
  }
}
#endif  // ZL_X86

// Whether the tiles take tile_avx2: a CPU (under the build's cap) with AVX2 but no AVX-512.
bool tiles_avx2() {
  static const bool avx2 =
      ZL_X86 && cpu_has(CpuFeature::kAvx2Fma) && !cpu_has(CpuFeature::kAvx512);
  return avx2;
}

// Outputs [m0, m0 + tm) x [r0, r0 + tn), by the path this CPU takes.
template <typename W, typename Y>
void tile(const float* x32, int64_t kp, const W* w, int64_t k, Y* y, int64_t n, int64_t m0,
          int64_t r0, int tm, int tn) {
#if ZL_X86
  if (tiles_avx2()) return tile_avx2<W, Y>(x32, kp, w, k, y, n, m0, r0, tm, tn);
#endif
  tile_for<W, Y>(tm, tn)(x32, kp, w, k, y, n, m0, r0);
}

// The widened rows [r, r + tn) of w, zero-padded to kp columns, in pack [tn, kp] (plain loops:
// the compiler vectorizes them for any target).
template <typename W>
ZL_MULTIVERSION void pack_rows(const W* w, int64_t k, int64_t kp, int64_t r, int tn, float* pack) {
  for (int b = 0; b < tn; ++b) {
    for (int64_t j = 0; j < k; ++j) pack[b * kp + j] = widen_value(w[(r + b) * k + j]);
    for (int64_t j = k; j < kp; ++j) pack[b * kp + j] = 0.f;
  }
}

// Weight rows [n0, n1) against every row of x. A weight tile that meets several tiles of x is
// widened once into `pack` (float32, exact), which changes no result.
template <typename W, typename Y>
void rows_range(
    const float* x32, int64_t m, int64_t kp, const W* w, int64_t k, Y* y, int64_t n, int64_t n0,
    int64_t n1) {
  std::vector<float> pack(m > kTileM ? kTileN * kp : 0);
  for (int64_t mb = 0; mb < m; mb += kBlockM) {
    const int64_t me = std::min(m, mb + kBlockM);
    for (int64_t r = n0; r < n1; r += kTileN) {
      const int tn = static_cast<int>(std::min<int64_t>(kTileN, n1 - r));
      if (me - mb > kTileM) pack_rows(w, k, kp, r, tn, pack.data());
      for (int64_t i = mb; i < me; i += kTileM) {
        const int tm = static_cast<int>(std::min<int64_t>(kTileM, me - i));
        if (me - mb > kTileM) {
          tile<float, Y>(x32, kp, pack.data(), kp, y, n, i, r, tm, tn);
        } else {
          tile<W, Y>(x32, kp, w + r * k, k, y, n, i, r, tm, tn);
        }
      }
    }
  }
}

// y [m, n] = x [m, k] @ w [n, k]^T, W and Y both uint16_t (bfloat16) or both float.
template <typename W>
void invariant_linear(const W* x, const W* w, W* y, int64_t m, int64_t k, int64_t n,
                      int num_threads) {
  if (m == 0 || n == 0) return;
  const int64_t kp = (k + kLanes - 1) / kLanes * kLanes;
  // x widened to float32 once, padded to kp columns with zeros (the partial last chunk).
  std::vector<float> x32(m * kp, 0.f);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < k; ++j) x32[i * kp + j] = widen_value(x[i * k + j]);
  }
  // Grain: about 256 KiB of weights times rows of x per task, so small matrices stay on one thread.
  const int64_t work_per_row = k * static_cast<int64_t>(sizeof(W)) * std::max<int64_t>(1, m / kTileM);
  const int64_t grain = std::max<int64_t>(kTileN, (256 << 10) / work_per_row / kTileN * kTileN);
  parallel_for(0, n, grain, num_threads, [&](int64_t n0, int64_t n1) {
    rows_range<W, W>(x32.data(), m, kp, w, k, y, n, n0, n1);
  });
}

}  // namespace
}  // namespace zerolayer

int32_t zl_invariant_linear(int32_t dtype, const void* x, const void* w, void* y, int64_t m,
                            int64_t k, int64_t n, int32_t num_threads) {
  using namespace zerolayer;
  return guarded([&] {
    ZL_CHECK(dtype == ZL_FLOAT32 || dtype == ZL_BFLOAT16,
             "invariant_linear: x and w both bfloat16 or both float32 expected");
    if (dtype == ZL_BFLOAT16) {
      invariant_linear(static_cast<const uint16_t*>(x), static_cast<const uint16_t*>(w),
                       static_cast<uint16_t*>(y), m, k, n, num_threads);
    } else {
      invariant_linear(static_cast<const float*>(x), static_cast<const float*>(w),
                       static_cast<float*>(y), m, k, n, num_threads);
    }
  });
}
