// y [M, N] = x [M, K] @ dequant(W [N, K])^T for weights of GGUF's types, read in place.
//
// bfloat16 x, quantized weights: as llama.cpp computes it (ggml-cpu's vec_dot_*_q8_0 and
// *_q8_K): x is quantized per block, like the weights, and each block's dot product is an exact
// int32 sum of int8 products, then scaled in float32.
//   - the 32-element types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) against x in Q8_0 blocks of 32:
//     d_x = max|x| / 127, q = round(x / d_x) (half to even), with sum(q) kept per block. A
//     weight block d_w (u - o) (+ m_w) contributes d_w d_x (sum u q - o sum q) (+ m_w d_x sum q),
//     u its unsigned codes (o = 8 for Q4_0, 16 for Q5_0). Q8_0's signed values take vpdpbusd
//     as u = w + 128 (o = 128), or on AVX2 |q| times w with q's sign (vpsignb), as llama.cpp:
//     exact for w in [-127, 127], which is what every quantizer writes (-128 would wrap).
//   - the K-quants (Q4_K, Q5_K, Q6_K) against x in Q8_K super-blocks of 256 (quantize_row_q8_K:
//     the value of largest magnitude max, iscale = -127 / max, q = min(127, round(iscale x)),
//     d_x = 1 / iscale, and the sums of q per 16). Q4_K/Q5_K: d d_x sum_j scale_j sum(u q) -
//     dmin d_x sum_j min_j sum_j(q), the scales applied in int16 pairs (vpmaddwd/vpdpwssd);
//     Q6_K: d d_x sum_s scale_s (sum(u q) - 32 sum_s(q)), u = q6 + 32.
//   Unlike llama.cpp, x's scales stay float32 (Q8_0 rounds them to float16). The integer sums
//   are exact; the float32 scaling and the sum over blocks and lanes round as any float sum.
// float32 x, or F32/F16/BF16 weights: the weights are dequantized exactly (gguf_dequant.h: the
// values of gguf.quants.dequantize) a chunk of a row at a time into L1 and multiplied by float32
// x with float32 FMAs (bfloat16 x widened first): a float32 model on GGUF weights computes what
// transformers computes on the dequantized weights, up to the order of the sums.
// Output in x's dtype, bfloat16 rounded once (to nearest even).
//
// Rows of x are held in registers 4 at a time (kMaxSkinnyRows); with more, each tile of
// kRowTile weight rows is read from memory once and run against every group of 4 rows of x
// while it sits in L1 (batched decode, prefill; KernelLoader picks between this and
// dequantize + torch's matmul by a measured threshold). Output rows are split across threads
// (parallel.h), all weights of a call (q, k, v; gate, up) in one parallel region with x
// quantized once, as int8_linear_multi. Instruction sets: gguf_avx512.cpp (VNNI),
// gguf_avx2.cpp, gguf_portable.cpp; the best this CPU has is chosen at load time (cpu_features.h),
// or a named one (tests, comparisons). Python reference: zerolayer/scheduler/model/gguf/.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "api.h"
#include "gguf_kernels.h"
#include "kernels.h"
#include "parallel.h"
#include "simd.h"

namespace zerolayer {
namespace gguf {

struct QuantizedActs::Buffers {
  std::vector<float> widened;
  std::vector<int8_t> q32, q256;
  std::vector<uint8_t> abs32;
  std::vector<float> d32, d256;
  std::vector<int32_t> sum32;
  std::vector<int16_t> sum16, sum16x2;
  QuantizedX view;
};

namespace {

// Row r of x [m, k] as float32 into out (bfloat16 widened exactly).
void widen_row(const void* x, bool bf16, int64_t r, int64_t k, float* out) {
  if (!bf16) {
    std::memcpy(out, static_cast<const float*>(x) + r * k, k * sizeof(float));
    return;
  }
  const uint16_t* src = static_cast<const uint16_t*>(x) + r * k;
  for (int64_t j = 0; j < k; ++j) out[j] = simd::from_bf16(src[j]);
}

// Q8_0 blocks of 32 of one row (llama.cpp's quantize_row_q8_0 with half-to-even rounding).
ZL_MULTIVERSION void quantize_q8_0(const float* x, int64_t k, int8_t* q, uint8_t* abs, float* d,
                                   int32_t* sum) {
  for (int64_t b = 0; b < k / kQK; ++b) {
    const float* v = x + b * kQK;
    float amax = 0.f;
    for (int j = 0; j < kQK; ++j) amax = std::max(amax, std::fabs(v[j]));
    const float scale = amax / 127.f;
    const float inverse = scale > 0.f ? 1.f / scale : 0.f;
    int32_t s = 0;
    for (int j = 0; j < kQK; ++j) {
      const float r = std::min(127.f, std::max(-127.f, std::nearbyint(v[j] * inverse)));
      q[b * kQK + j] = static_cast<int8_t>(r);
      abs[b * kQK + j] = static_cast<uint8_t>(std::fabs(r));
      s += static_cast<int32_t>(r);
    }
    d[b] = scale, sum[b] = s;
  }
}

// Q8_K super-blocks of 256 of one row (ggml-quants.c: quantize_row_q8_K_ref), with the sums of
// q per 16 and per 32 values.
ZL_MULTIVERSION void quantize_q8_k(const float* x, int64_t k, int8_t* q, float* d, int16_t* sum16,
                                   int16_t* sum32) {
  for (int64_t b = 0; b < k / kQKK; ++b) {
    const float* v = x + b * kQKK;
    int8_t* qb = q + b * kQKK;
    float amax = 0.f, max = 0.f;
    for (int j = 0; j < kQKK; ++j) {
      if (std::fabs(v[j]) > amax) amax = std::fabs(v[j]), max = v[j];
    }
    if (amax == 0.f) {
      d[b] = 0.f;
      std::memset(qb, 0, kQKK);
    } else {
      const float iscale = -127.f / max;
      for (int j = 0; j < kQKK; ++j) {
        qb[j] = static_cast<int8_t>(std::min(127.f, std::nearbyint(iscale * v[j])));
      }
      d[b] = 1.f / iscale;
    }
    for (int s = 0; s < 16; ++s) {
      int32_t total = 0;
      for (int j = 0; j < 16; ++j) total += qb[16 * s + j];
      sum16[b * 16 + s] = static_cast<int16_t>(total);
    }
    for (int s = 0; s < 8; ++s) {
      sum32[b * 8 + s] = static_cast<int16_t>(sum16[b * 16 + 2 * s] + sum16[b * 16 + 2 * s + 1]);
    }
  }
}

}  // namespace

QuantizedActs::QuantizedActs() : buffers_(new Buffers) {}
QuantizedActs::~QuantizedActs() = default;

const QuantizedX& QuantizedActs::view() const { return buffers_->view; }

void QuantizedActs::quantize(const void* x, bool bf16, int64_t m, int64_t k, bool q8_0,
                             bool q8_k, int num_threads) {
  Buffers& b = *buffers_;
  ZL_CHECK(!q8_0 || k % kQK == 0, "gguf_linear: K = ", k, " is not a multiple of 32");
  ZL_CHECK(!q8_k || k % kQKK == 0, "gguf_linear: K = ", k, " is not a multiple of 256");
  b.widened.resize(m * k);
  if (q8_0) b.q32.resize(m * k), b.abs32.resize(m * k), b.d32.resize(m * k / kQK);
  if (q8_0) b.sum32.resize(m * k / kQK);
  if (q8_k) b.q256.resize(m * k), b.d256.resize(m * k / kQKK);
  if (q8_k) b.sum16.resize(m * k / 16), b.sum16x2.resize(m * k / 32);
  parallel_for(0, m, 8, num_threads, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      float* row = b.widened.data() + r * k;
      widen_row(x, bf16, r, k, row);
      if (q8_0) {
        quantize_q8_0(row, k, b.q32.data() + r * k, b.abs32.data() + r * k,
                      b.d32.data() + r * (k / kQK), b.sum32.data() + r * (k / kQK));
      }
      if (q8_k) {
        quantize_q8_k(row, k, b.q256.data() + r * k, b.d256.data() + r * (k / kQKK),
                      b.sum16.data() + r * (k / 16), b.sum16x2.data() + r * (k / 32));
      }
    }
  });
  b.view = QuantizedX{m, k, b.q32.data(), b.abs32.data(), b.d32.data(), b.sum32.data(),
                      b.q256.data(), b.d256.data(), b.sum16.data(), b.sum16x2.data()};
}

const float* QuantizedActs::widened() const { return buffers_->widened.data(); }

namespace {

// Weight rows run against every group of 4 rows of x while they are in L1 (M > 4).
constexpr int64_t kRowTile = 16;

// Rows [n0, n1) of one weight for all rows of x: the integer kernels, or the float path.
void weight_rows(const IsaKernels& kernels, const QuantizedActs& acts, bool bf16,
                 const WeightRows& w, int64_t m, int64_t k, int64_t n0, int64_t n1) {
  const bool integer = bf16 && type_info(w.type)->domain != Domain::kFloat;
  const int64_t tile = m <= kMaxSkinnyRows ? n1 - n0 : kRowTile;
  for (int64_t r0 = n0; r0 < n1; r0 += tile) {
    const int64_t r1 = std::min(n1, r0 + tile);
    for (int64_t m0 = 0; m0 < m; m0 += kMaxSkinnyRows) {
      const int64_t rows = std::min(kMaxSkinnyRows, m - m0);
      if (integer) {
        kernels.int_rows(acts.view(), m0, rows, w, r0, r1);
      } else {
        kernels.float_rows(acts.widened(), k, m0, rows, w, r0, r1);
      }
    }
  }
}

// Grain: 256 KiB of weights per task at least, so small matrices stay on one thread.
int64_t grain_rows(int64_t row_bytes) { return std::max<int64_t>(1, (256 << 10) / row_bytes); }

}  // namespace

void linear(const void* x, bool bf16, int64_t m, int64_t k, int64_t count, const int32_t* types,
            const void* const* ws, const int64_t* ns, void* const* ys, const char* isa,
            int num_threads) {
  ZL_CHECK(m >= 1, "gguf_linear: at least one row of x expected");
  ZL_CHECK(count >= 1, "gguf_linear: at least one weight expected");
  const IsaKernels& kernels = isa_kernels(isa);
  bool q8_0 = false, q8_k = false;
  std::vector<WeightRows> weights;
  std::vector<int64_t> starts{0};  // weight i: rows [starts[i], starts[i + 1]) of them all
  for (int64_t i = 0; i < count; ++i) {
    const TypeInfo* info = type_info(types[i]);
    ZL_CHECK(info != nullptr, "gguf_linear: unknown GGUF type id ", types[i]);
    ZL_CHECK(k % info->block_size == 0, "gguf_linear: K = ", k, " is not a multiple of ",
             info->name, "'s block size ", info->block_size);
    // NOTE: float32 x takes the exact float path for every type.
    q8_0 |= bf16 && info->domain == Domain::kQ8_0;
    q8_k |= bf16 && info->domain == Domain::kQ8_K;
    weights.push_back(WeightRows{types[i], static_cast<const uint8_t*>(ws[i]),
                                 row_bytes(*info, k), ns[i], ys[i], bf16});
    starts.push_back(starts.back() + ns[i]);
  }
  QuantizedActs acts;
  acts.quantize(x, bf16, m, k, q8_0, q8_k, num_threads);
  const int64_t grain = std::max<int64_t>(
      1, grain_rows(weights[0].row_bytes) * kMaxSkinnyRows / std::max(m, kMaxSkinnyRows));
  parallel_for(0, starts.back(), grain, num_threads, [&](int64_t r0, int64_t r1) {
    for (int64_t i = 0; i < count; ++i) {
      const int64_t lo = std::max(r0, starts[i]), hi = std::min(r1, starts[i + 1]);
      if (lo < hi) weight_rows(kernels, acts, bf16, weights[i], m, k, lo - starts[i], hi - starts[i]);
    }
  });
}

}  // namespace gguf
}  // namespace zerolayer

int32_t zl_gguf_linear(int32_t x_dtype, const void* x, int64_t m, int64_t k, int64_t count,
                       const int32_t* types, const void* const* ws, const int64_t* ns,
                       void* const* ys, const char* isa, int32_t num_threads) {
  using namespace zerolayer;
  return guarded([&] {
    ZL_CHECK(x_dtype == ZL_FLOAT32 || x_dtype == ZL_BFLOAT16,
             "gguf_linear: bfloat16 or float32 x expected");
    gguf::linear(x, x_dtype == ZL_BFLOAT16, m, k, count, types, ws, ns, ys, isa, num_threads);
  });
}
