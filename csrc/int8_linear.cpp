// y = x @ dequant(w)^T for a handful of rows of x (decode) with int8 weights in groups along K.
//
// The weights are symmetric int8 with one float32 scale per group of G consecutive K elements
// (zerolayer/checkpoints/int8_format.py, llama.cpp's Q8_0). Each call quantizes x the same way
// (per row and group: d = max|x| / 127, q = round(x / d)), so that every group's dot product is an
// exact int32 sum of int8 products, then scaled by d_x * d_w and accumulated in float32, as
// llama.cpp's ggml_vec_dot_q8_0_q8_0 does. A decode step reads each weight once; int8 halves the
// bytes of bfloat16.
//
// The int8 products use vpdpbusd, which multiplies unsigned by signed bytes, so x's sign moves onto
// w: |x| * (sign(x) w) = x w (both are in [-127, 127], so no -128 overflows). With AVX512-VNNI it
// runs on 64-byte vectors, two groups of 32 per instruction, the sign applied as a masked
// subtraction (vpsubb under x's precomputed negative mask; there is no 512-bit vpsignb), 4 weight
// rows interleaved per block (4 accumulator chains, 4 read streams) and the two groups' scales
// applied as one vector; about twice the 32-byte loop's rate on one core with the weights in L2.
// AVX-VNNI (and "avx512vnni256", kept for comparisons) runs the 32-byte loop, one group per
// instruction with vpsignb. The ISA is picked once at load time (__builtin_cpu_supports); the
// fallback is plain C++ that the compiler vectorizes (ZL_MULTIVERSION). Output rows are split
// across threads (parallel.h); int8_linear_multi runs several weights sharing x (q, k, v;
// gate, up) with x quantized once and one parallel region over all their rows, as
// skinny_linear_multi does.
//
// Python reference this is tested against: int8_linear_reference in
// zerolayer/scheduler/model/int8_linear.py.

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "api.h"
#include "cpu_features.h"
#include "int8_gemv.h"
#include "kernels.h"
#include "parallel.h"
#include "simd.h"

namespace zerolayer {
namespace {

// One weight's operands: x quantized (xq int8 [M, K], |xq| as uint8, xs [M, K / G] and xs_halves:
// per row of x and 64-byte chunk of K 16 floats, lanes 0-7 the scale of the chunk's first 32
// bytes, 8-15 of its second) and the
// weights (wq int8 [N, K], ws [N, K / G]); y [M, N] in float32, or in bfloat16 (y16) when y16 is
// set (the kernels store through put).
struct Operands {
  const int8_t* xq;
  const uint8_t* xabs;
  const float* xs;
  const float* xs_halves;
  const int8_t* wq;
  const float* ws;
  float* y;
  uint16_t* y16;
  int64_t m, n, k, g;
};

// y[i] = v, rounded to bfloat16 (to nearest even, as torch) where the output is bfloat16.
inline __attribute__((always_inline)) void put(const Operands& o, int64_t i, float v) {
  if (o.y16 != nullptr) {
    o.y16[i] = simd::to_bf16(v);
  } else {
    o.y[i] = v;
  }
}

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
        put(o, m * o.n + r, s);                                                            \
      }                                                                                    \
    }                                                                                      \
  }

ZL_INT8_VNNI_ROWS(rows_avx512vnni256, "avx512vnni,avx512vl,avx512bw,avx512f,avx2,fma",
                  _mm256_dpbusd_epi32)
ZL_INT8_VNNI_ROWS(rows_avxvnni, "avxvnni,avx2,fma", _mm256_dpbusd_avx_epi32)

// vpdpbusd without VNNI, as llama.cpp's AVX2 dot products do: vpmaddubsw multiplies the unsigned
// by the signed bytes and adds adjacent pairs into int16 (|x| <= 127 and |w| <= 127, so a pair's
// sum, at most 2 * 127 * 127 = 32258, never saturates), vpmaddwd by ones adds adjacent int16
// pairs into int32: the same 4-product sums per lane.
__attribute__((target("avx2,fma"), always_inline)) inline __m256i dpbusd_avx2(
    __m256i acc, __m256i unsigned_bytes, __m256i signed_bytes) {
  const __m256i pairs = _mm256_maddubs_epi16(unsigned_bytes, signed_bytes);
  return _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
}

ZL_INT8_VNNI_ROWS(rows_avx2, "avx2,fma", dpbusd_avx2)
#undef ZL_INT8_VNNI_ROWS

#define ZL_AVX512_TARGET "avx512vnni,avx512vl,avx512bw,avx512f,avx2,fma"

// Scales of w for the 64-byte chunk at K offset j, as xs_halves lays them out: lanes 0-7 group
// j / G, lanes 8-15 group (j + 32) / G (the first again when j + 32 is past K, whose products are
// zero). G32: groups of 32, so the two scales are adjacent (one 8-byte load and a permute).
template <bool G32, bool kTail>
__attribute__((target(ZL_AVX512_TARGET), always_inline)) inline __m512 w_halves(
    const float* wsr, int64_t j, int64_t g, const __m512i& halves) {
  if (G32 && !kTail) {
    const __m128 pair = _mm_castpd_ps(_mm_load_sd(reinterpret_cast<const double*>(wsr + j / 32)));
    return _mm512_permutexvar_ps(halves, _mm512_castps128_ps512(pair));
  }
  const float a = wsr[j / g];
  const float b = kTail ? a : wsr[(j + 32) / g];
  return _mm512_mask_blend_ps(0xff00, _mm512_set1_ps(a), _mm512_set1_ps(b));
}

// One 64-byte chunk (K offset j, chunk c) of R weight rows from r0 against the M rows of x:
// |x| times w with x's sign (vpsubb under x's negative mask, vpmovb2m of xq; w and x lie in
// [-127, 127], so no -128 appears), int32 sums of 4 products per lane (vpdpbusd; lanes 0-7 are
// the first group of 32, 8-15 the second), then converted and scaled by x's and w's scales of
// each half. kTail: the last chunk when K is an odd multiple of 32 (its second half is masked
// off and reads nothing).
template <int M, int R, bool G32, bool kTail>
__attribute__((target(ZL_AVX512_TARGET), always_inline)) inline void chunk_avx512(
    const Operands& o, int64_t r0, int64_t c, int64_t chunks, __m512 (&acc)[R][M]) {
  const int64_t j = c * 64;
  const __mmask64 valid = kTail ? 0xffffffffULL : ~0ULL;
  const __m512i zero = _mm512_setzero_si512();
  const __m512i halves = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
  const int64_t groups = o.k / o.g;
  __m512i xa[M];
  __mmask64 neg[M];
  __m512 xsv[M];
  for (int m = 0; m < M; ++m) {
    xa[m] = _mm512_maskz_loadu_epi8(valid, o.xabs + m * o.k + j);
    neg[m] = _mm512_movepi8_mask(_mm512_maskz_loadu_epi8(valid, o.xq + m * o.k + j));
    xsv[m] = _mm512_loadu_ps(o.xs_halves + (m * chunks + c) * 16);
  }
  for (int r = 0; r < R; ++r) {
    const int8_t* wr = o.wq + (r0 + r) * o.k;
    __builtin_prefetch(wr + kPrefetchRows * o.k + j, 0, kPrefetchLocality);
    const __m512i w = kTail ? _mm512_maskz_loadu_epi8(valid, wr + j) : _mm512_loadu_si512(wr + j);
    const __m512 wsv = w_halves<G32, kTail>(o.ws + (r0 + r) * groups, j, o.g, halves);
    for (int m = 0; m < M; ++m) {
      const __m512i signed_w = _mm512_mask_sub_epi8(w, neg[m], zero, w);
      const __m512i isum = _mm512_dpbusd_epi32(zero, xa[m], signed_w);
      acc[r][m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(xsv[m], wsv), acc[r][m]);
    }
  }
}

// R weight rows from r0 (interleaved: R independent accumulator chains and R read streams).
template <int M, int R, bool G32>
__attribute__((target(ZL_AVX512_TARGET), always_inline)) inline void block_avx512(
    const Operands& o, int64_t r0) {
  const int64_t full = o.k / 64, chunks = (o.k + 63) / 64;
  __m512 acc[R][M];
  for (int r = 0; r < R; ++r)
    for (int m = 0; m < M; ++m) acc[r][m] = _mm512_setzero_ps();
  for (int r = 0; r < R; ++r)
    __builtin_prefetch(o.ws + (r0 + r + kPrefetchRows) * (o.k / o.g), 0, kPrefetchLocality);
  for (int64_t c = 0; c < full; ++c) chunk_avx512<M, R, G32, false>(o, r0, c, chunks, acc);
  if (full < chunks) chunk_avx512<M, R, G32, true>(o, r0, full, chunks, acc);
  for (int r = 0; r < R; ++r)
    for (int m = 0; m < M; ++m) put(o, m * o.n + r0 + r, _mm512_reduce_add_ps(acc[r][m]));
}

// Rows [n0, n1) of y with 512-bit vpdpbusd (AVX512-VNNI), two groups of 32 per instruction.
template <int M, bool G32>
__attribute__((target(ZL_AVX512_TARGET))) void rows_avx512vnni_m(
    const Operands& o, int64_t n0, int64_t n1) {
  constexpr int R = M <= 2 ? 4 : 2;
  int64_t r = n0;
  for (; r + R <= n1; r += R) block_avx512<M, R, G32>(o, r);
  for (; r < n1; ++r) block_avx512<M, 1, G32>(o, r);
}

template <int M>
void rows_avx512vnni_dispatch(const Operands& o, int64_t n0, int64_t n1) {
  if (o.g == 32) {
    rows_avx512vnni_m<M, true>(o, n0, n1);
  } else {
    rows_avx512vnni_m<M, false>(o, n0, n1);
  }
}

void rows_avx512vnni(const Operands& o, int64_t n0, int64_t n1) {
  static_assert(kMaxSkinnyRows == 4, "one kernel per number of rows of x");
  switch (o.m) {
    case 1: return rows_avx512vnni_dispatch<1>(o, n0, n1);
    case 2: return rows_avx512vnni_dispatch<2>(o, n0, n1);
    case 3: return rows_avx512vnni_dispatch<3>(o, n0, n1);
    default: return rows_avx512vnni_dispatch<4>(o, n0, n1);
  }
}

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
      put(o, m * o.n + r, acc);
    }
  }
}

using RowsFn = void (*)(const Operands&, int64_t, int64_t);

struct Isa {
  const char* name;
  RowsFn fn;
  // Whether this CPU runs it for group size g.
  bool (*usable)(int64_t g);
};

bool avx512vnni_cpu() {
  return cpu_has(CpuFeature::kAvx512Vnni);
}

// Best first.
const Isa kIsas[] = {
    {"avx512vnni", &rows_avx512vnni, [](int64_t g) { return g % 32 == 0 && avx512vnni_cpu(); }},
    {"avx512vnni256", &rows_avx512vnni256,
     [](int64_t g) { return g % 32 == 0 && avx512vnni_cpu(); }},
    {"avxvnni", &rows_avxvnni,
     [](int64_t g) { return g % 32 == 0 && cpu_has(CpuFeature::kAvxVnni); }},
    {"avx2", &rows_avx2, [](int64_t g) { return g % 32 == 0 && cpu_has(CpuFeature::kAvx2Fma); }},
    {"portable", &rows_portable, [](int64_t) { return true; }},
};

// The best kernel this CPU runs for group size g, or the one named isa (nullptr: the best).
const Isa& isa_for(int64_t g, const char* isa) {
  for (const Isa& candidate : kIsas) {
    if (isa == nullptr ? candidate.usable(g) : std::strcmp(candidate.name, isa) == 0) {
      ZL_CHECK(candidate.usable(g), "int8_linear: ", candidate.name,
               " does not run on this CPU or for group size ", g);
      return candidate;
    }
  }
  fail("int8_linear: unknown ISA ", isa);
}

// Q8_0 quantization of count groups of g values of x (float32, or bfloat16 where bf16), each
// widened into buf [g] first: scales s[i] = max|x| / 127 and q = round(x * (1 / s[i])), clamped
// to [-127, 127] (nearbyint: half to even in the default rounding mode, as torch.round), and |q|.
// Multiversioned so that nearbyint is an instruction (roundps), not a libm call per value.
ZL_MULTIVERSION void quantize_groups(const void* x, bool bf16, int64_t count, int64_t g,
                                     float* buf, int8_t* q, uint8_t* abs, float* s) {
  for (int64_t i = 0; i < count; ++i) {
    if (bf16) {
      const uint16_t* src = static_cast<const uint16_t*>(x) + i * g;
      for (int64_t j = 0; j < g; ++j) {
        const uint32_t u = static_cast<uint32_t>(src[j]) << 16;
        std::memcpy(buf + j, &u, sizeof(u));
      }
    } else {
      std::memcpy(buf, static_cast<const float*>(x) + i * g, g * sizeof(float));
    }
    // max|x| in 16 lanes (the compiler vectorizes these; one chain of maxss is 4 cycles a value).
    float lanes[16] = {};
    int64_t j0 = 0;
    for (; j0 + 16 <= g; j0 += 16) {
      for (int l = 0; l < 16; ++l) lanes[l] = std::max(lanes[l], std::fabs(buf[j0 + l]));
    }
    for (; j0 < g; ++j0) lanes[0] = std::max(lanes[0], std::fabs(buf[j0]));
    float amax = 0.f;
    for (float lane : lanes) amax = std::max(amax, lane);
    const float d = amax / 127.f;
    const float inverse = d > 0.f ? 1.f / d : 0.f;
    s[i] = d;
    for (int64_t j = 0; j < g; ++j) {
      const float v = std::min(127.f, std::max(-127.f, std::nearbyint(buf[j] * inverse)));
      q[i * g + j] = static_cast<int8_t>(v);
      abs[i * g + j] = static_cast<uint8_t>(std::fabs(v));
    }
  }
}

// x [M, K] quantized per group of g (Q8_0): what Operands points into. Also, for the 512-bit
// kernel, per row and 64-byte chunk the scales of its two halves.
struct QuantizedX {
  std::vector<int8_t> q;
  std::vector<uint8_t> abs;
  std::vector<float> s;
  std::vector<float> s_halves;
  std::vector<float> buf;
  int64_t m = 0, k = 0, g = 1;

  // x: [m_, k_] contiguous, float32 or bfloat16 (bf16); the buffers are reused between calls.
  void quantize(const void* x, bool bf16, int64_t m_, int64_t k_, int64_t g_) {
    m = m_, k = k_, g = g_;
    const int64_t groups = k / g, chunks = (k + 63) / 64;
    q.resize(m * k);
    abs.resize(m * k);
    s.resize(m * groups);
    s_halves.resize(m * chunks * 16);
    buf.resize(g);
    quantize_groups(x, bf16, m * groups, g, buf.data(), q.data(), abs.data(), s.data());
    for (int64_t r = 0; r < m; ++r) {
      for (int64_t c = 0; c < chunks; ++c) {
        const int64_t j = c * 64;
        const float a = s[r * groups + j / g];
        const float b = j + 32 < k ? s[r * groups + (j + 32) / g] : a;
        float* halves = s_halves.data() + (r * chunks + c) * 16;
        for (int lane = 0; lane < 16; ++lane) halves[lane] = lane < 8 ? a : b;
      }
    }
  }

  // Weights wq [n, k] with scales ws [n, k / g]; y [M, n] float32, or bfloat16 (bf16).
  Operands operands(const int8_t* wq, const float* ws, void* y, bool bf16, int64_t n) const {
    return Operands{q.data(), abs.data(), s.data(), s_halves.data(), wq, ws,
                    bf16 ? nullptr : static_cast<float*>(y),
                    bf16 ? static_cast<uint16_t*>(y) : nullptr, m, n, k, g};
  }

  // Weights wq [n, k] with scales ws [n, k / g]; y16 [M, n] bfloat16.
  Operands operands(const int8_t* wq, const float* ws, uint16_t* y16, int64_t n) const {
    return Operands{q.data(), abs.data(), s.data(), s_halves.data(), wq, ws, nullptr, y16,
                    m, n, k, g};
  }
};

// Grain: 256 KiB of weights per task at least, so small matrices stay on one thread.
int64_t grain_rows(int64_t k) { return std::max<int64_t>(1, (256 << 10) / k); }

// [x @ dequant(w)^T for each of count weights] with the kernel isa (nullptr: the best) in one
// parallel region.
void run(const void* x, bool bf16, int64_t m, int64_t k, int64_t g, int64_t count,
         const int8_t* const* wqs, const float* const* wss, const int64_t* ns, void* const* ys,
         const char* isa, int num_threads) {
  ZL_CHECK(m >= 1 && m <= kMaxSkinnyRows, "int8_linear: 1 to ", kMaxSkinnyRows, " rows of x");
  ZL_CHECK(g >= 1 && k % g == 0, "int8_linear: K must be a multiple of the group size");
  const RowsFn fn = isa_for(g, isa).fn;
  QuantizedX xq;
  xq.quantize(x, bf16, m, k, g);
  std::vector<Operands> ops;
  std::vector<int64_t> starts{0};  // weight i: rows [starts[i], starts[i + 1]) of the concatenation
  for (int64_t i = 0; i < count; ++i) {
    ops.push_back(xq.operands(wqs[i], wss[i], ys[i], bf16, ns[i]));
    starts.push_back(starts.back() + ns[i]);
  }
  // One parallel region for all the weights (q, k, v or gate, up), as skinny_linear_multi.
  parallel_for(0, starts.back(), grain_rows(k), num_threads, [&](int64_t r0, int64_t r1) {
    for (int64_t i = 0; i < count; ++i) {
      const int64_t lo = std::max(r0, starts[i]), hi = std::min(r1, starts[i + 1]);
      if (lo < hi) fn(ops[i], lo - starts[i], hi - starts[i]);
    }
  });
}

}  // namespace

struct Int8Gemv::State {
  QuantizedX x;
  RowsFn fn;
  int64_t g;
};

Int8Gemv::Int8Gemv(int64_t group_size)
    : state_(new State{QuantizedX(), isa_for(group_size, nullptr).fn, group_size}) {}

Int8Gemv::~Int8Gemv() = default;

void Int8Gemv::quantize(const uint16_t* x, int64_t m, int64_t k) {
  state_->x.quantize(x, true, m, k, state_->g);
}

void Int8Gemv::rows(const int8_t* wq, const float* ws, uint16_t* y, int64_t n, int64_t n0,
                    int64_t n1) const {
  state_->fn(state_->x.operands(wq, ws, y, n), n0, n1);
}

const char* int8_linear_isa(int64_t group_size) { return isa_for(group_size, nullptr).name; }

}  // namespace zerolayer

int32_t zl_int8_linear(int32_t x_dtype, const void* x, int64_t m, int64_t k, int64_t group_size,
                       int64_t count, const int8_t* const* wqs, const float* const* wss,
                       const int64_t* ns, void* const* ys, const char* isa, int32_t num_threads) {
  using namespace zerolayer;
  return guarded([&] {
    ZL_CHECK(x_dtype == ZL_FLOAT32 || x_dtype == ZL_BFLOAT16,
             "int8_linear: bfloat16 or float32 x expected");
    ZL_CHECK(count >= 1, "int8_linear_multi: at least one weight expected");
    run(x, x_dtype == ZL_BFLOAT16, m, k, group_size, count, wqs, wss, ns, ys, isa, num_threads);
  });
}
