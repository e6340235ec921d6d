// y = x @ w^T in bfloat16 for any number of rows of x (prefill, batched decode) on CPUs without
// AVX-512 BF16, where torch's bfloat16 matmul is slow.
//
// Without avx512_bf16, oneDNN has no bfloat16 GEMM for torch to call (ONEDNN_MAX_CPU_ISA=AVX2
// acts it out), and torch falls back to its own loops: measured here (AMD EPYC, Zen 4, 2 threads,
// ATEN_CPU_CAPABILITY=avx2, ONEDNN_MAX_CPU_ISA=AVX2) 7-21 GFLOP/s for the `small` preset's
// projections at 64-512 rows, against 25-45 GFLOP/s for the same product in float32. This kernel
// multiplies the bfloat16 weights in place, widened in registers, two ways:
// - fewer than kPackedRows rows of x (batched decode): the AVX2 row-block kernel of the decode
//   GEMV (gemv_avx2.h) over tiles of kTileM rows of x times kTileR weight rows, x widened once per
//   call into the even/odd order it reads, rows of x taken kBlockM at a time (a block stays in L2
//   while a thread's weight rows pass over it);
// - more rows (prefill): 16 weight rows at a time widened and transposed once into a float32
//   panel, then micro-tiles of 6 rows of x times the panel, outer products with 12 accumulators
//   in registers (gemm_packed_avx2.h): about 100 GFLOP/s on one core against 54-76 for the
//   row-block kernel, whose x vectors then stream from L2 at every step.
// Threads split the weight rows (parallel.h), so the thread count does not change a result.
//
// Numerics: the products of bfloat16 values are exact in float32 and summed in float32 (FMA),
// then rounded once to bfloat16 (to nearest even): what torch's kernel computes, in another
// order of the float32 additions (row blocks: 8 lanes of even and odd columns, then a fixed lane
// tree, as the GEMV, so a tile of 4 rows is the GEMV's answer bit for bit; packed: one chain of
// FMAs over K in order per output).
//
// Python reference this is tested against: torch.nn.functional.linear (float64 for the bound).

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "api.h"
#include "cpu_features.h"
#include "gemv.h"
#include "gemm_packed_avx2.h"
#include "gemv_avx2.h"
#include "kernels.h"
#include "parallel.h"
#include "simd.h"

namespace zerolayer {
namespace {

constexpr int kTileM = 4;
constexpr int kTileR = 2;
constexpr int64_t kBlockM = 64;
// Rows of x from which the packed kernel takes over (measured, one thread of an AMD EPYC, Zen 4,
// AVX2 forced, GFLOP/s at N = 2048, K = 768, this kernel / packed: 8 rows 76 / 60, 12 76 / 80,
// 16 75 / 85 (N = 768, K = 2048: 80 / 69), 24 75 / 93, 64 76 / 104, 256 54 / 103).
constexpr int64_t kPackedRows = 24;

#if ZL_X86
// A tile of tm <= kTileM rows of x (x32 at its first row) and R weight rows from r.
template <int R>
ZL_TARGET_AVX2 void tile(const float* x32, const uint16_t* w, uint16_t* y, int64_t k, int64_t n,
                         int64_t r, int tm) {
  switch (tm) {
    case 1: return avx2::gemv_block<1, R>(x32, w, y, k, n, r);
    case 2: return avx2::gemv_block<2, R>(x32, w, y, k, n, r);
    case 3: return avx2::gemv_block<3, R>(x32, w, y, k, n, r);
    default: return avx2::gemv_block<kTileM, R>(x32, w, y, k, n, r);
  }
}

// Weight rows [n0, n1) against all m rows of x32 (even/odd order), into y [m, n].
void rows_range(const float* x32, int64_t m, const uint16_t* w, uint16_t* y, int64_t k, int64_t n,
                int64_t n0, int64_t n1) {
  for (int64_t mb = 0; mb < m; mb += kBlockM) {
    const int64_t me = std::min(m, mb + kBlockM);
    int64_t r = n0;
    for (; r < n1; r += kTileR) {
      const bool full = r + kTileR <= n1;
      for (int64_t i = mb; i < me; i += kTileM) {
        const int tm = static_cast<int>(std::min<int64_t>(kTileM, me - i));
        if (full) {
          tile<kTileR>(x32 + i * k, w, y + i * n, k, n, r, tm);
        } else {
          for (int64_t rr = r; rr < n1; ++rr) tile<1>(x32 + i * k, w, y + i * n, k, n, rr, tm);
        }
      }
    }
  }
}

ZL_TARGET_AVX2 void panels_range(const float* x32, int64_t m, const uint16_t* w, uint16_t* y,
                                 int64_t k, int64_t n, int64_t p0, int64_t p1) {
  std::vector<float> panel(k * avx2::kPanel);
  avx2::packed_panels(x32, m, w, y, k, n, p0, p1, panel.data());
}
#endif  // ZL_X86

void gemm(const uint16_t* x, const uint16_t* w, uint16_t* y, int64_t m, int64_t k, int64_t n,
          int num_threads) {
  ZL_CHECK(bf16_gemm_isa() != nullptr, "bf16_gemm: no AVX2 path on this CPU or build");
  ZL_CHECK(m >= 1 && k >= 1 && n >= 1, "bf16_gemm: empty operands");
  ZL_CHECK(k % simd::kLanes == 0, "bf16_gemm: K must be a multiple of ", simd::kLanes);
#if ZL_X86
  if (m >= kPackedRows) {
    const GemvRows order{nullptr, GemvX::kFloat32, "avx2"};
    std::vector<float> x32(m * k);
    gemv_prepare_x(order, x, m * k, x32.data());
    const int64_t panels = (n + avx2::kPanel - 1) / avx2::kPanel;
    parallel_for(0, panels, 1, num_threads, [&](int64_t p0, int64_t p1) {
      panels_range(x32.data(), m, w, y, k, n, p0, p1);
    });
    return;
  }
  // NOTE: the even/odd order is per 16 columns, so one call for all rows (K % 16 == 0)
  const GemvRows order{nullptr, GemvX::kFloat32EvenOdd, "avx2"};
  std::vector<float> x32(m * k);
  gemv_prepare_x(order, x, m * k, x32.data());
  // Grain: about 256 KiB of weights times row tiles of x per task (small products: one thread).
  const int64_t work_per_row = 2 * k * std::max<int64_t>(1, m / kTileM);
  const int64_t grain = std::max<int64_t>(kTileR, (256 << 10) / work_per_row / kTileR * kTileR);
  parallel_for(0, n, grain, num_threads, [&](int64_t n0, int64_t n1) {
    rows_range(x32.data(), m, w, y, k, n, n0, n1);
  });
#endif
}

}  // namespace

const char* bf16_gemm_isa() {
  return ZL_X86 && cpu_has(CpuFeature::kAvx2Fma) ? "avx2" : nullptr;
}

}  // namespace zerolayer

const char* zl_bf16_gemm_isa(void) { return zerolayer::bf16_gemm_isa(); }

int32_t zl_bf16_gemm(const uint16_t* x, const uint16_t* w, uint16_t* y, int64_t m, int64_t k,
                     int64_t n, int32_t num_threads) {
  using namespace zerolayer;
  return guarded([&] { gemm(x, w, y, m, k, n, num_threads); });
}
