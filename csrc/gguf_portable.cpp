// The GGUF kernels in plain C++ (any CPU): the same exact integer sums per block as the vector
// kernels (gguf_isa.h), one value at a time, and the float32 path over exactly dequantized
// values. The reference the vector kernels are compared with in the tests, besides the torch one.

#include <cstdint>
#include <cstring>

#include "gguf_kernels.h"
#include "kernels.h"
#include "simd.h"

#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")

namespace zerolayer {
namespace gguf {
namespace portable {
namespace {

#include "gguf_dequant.h"

// The unsigned codes of a 32-value block (Q8_0: its signed values), with the offset its values
// are stored at (Q4_0: 8, Q5_0: 16) and its min (Q4_1, Q5_1; else 0).
struct Codes32 {
  int32_t u[32];
  float d, min;
  int32_t offset;
};

Codes32 block_codes(int32_t type, const uint8_t* p) {
  Codes32 c{};
  c.d = half_at(p);
  const bool has_min = type == kQ4_1 || type == kQ5_1;
  if (has_min) c.min = half_at(p + 2);
  if (type == kQ8_0) {
    for (int j = 0; j < 32; ++j) c.u[j] = static_cast<int8_t>(p[2 + j]);
    return c;
  }
  const bool five = type == kQ5_0 || type == kQ5_1;
  const uint8_t* qh = five ? p + 2 + (has_min ? 2 : 0) : nullptr;
  uint8_t u[32];
  codes32(p + 2 + (has_min ? 2 : 0) + (five ? 4 : 0), qh, u);
  for (int j = 0; j < 32; ++j) c.u[j] = u[j];
  c.offset = type == kQ4_0 ? 8 : type == kQ5_0 ? 16 : 0;
  return c;
}

// Row i of x against block b of a 32-element type: d_w d_x (sum u q - offset sum q), and the
// min's m_w d_x sum q into *extra.
float dot32(int32_t type, const uint8_t* p, const QuantizedX& x, int64_t i, int64_t b,
            float* extra) {
  const Codes32 c = block_codes(type, p);
  const int8_t* q = x.q32 + i * x.k + b * kQK;
  const int64_t at = i * (x.k / kQK) + b;
  int32_t isum = 0;
  for (int j = 0; j < 32; ++j) isum += c.u[j] * q[j];
  isum -= c.offset * x.sum32[at];
  const float dx = x.d32[at];
  *extra += c.min * (dx * static_cast<float>(x.sum32[at]));
  return static_cast<float>(isum) * (c.d * dx);
}

// Row i of x against super-block b of Q4_K/Q5_K: d d_x sum_j scale_j sum(u q), and -dmin d_x
// sum_j min_j sum(q over j) into *extra.
float dot_q45_k(int32_t type, const uint8_t* p, const QuantizedX& x, int64_t i, int64_t b,
                float* extra) {
  const float d = half_at(p);
  const float dmin = half_at(p + 2);
  uint8_t scales[8], mins[8];
  scales_and_mins(p + 4, scales, mins);
  const uint8_t* qh = p + 16;
  const uint8_t* qs = p + (type == kQ5_K ? 48 : 16);
  const int8_t* q = x.q256 + i * x.k + b * kQKK;
  int32_t isum = 0, min_sum = 0;
  for (int j = 0; j < 8; ++j) {
    int32_t s = 0;
    for (int l = 0; l < 32; ++l) {
      const uint8_t byte = qs[32 * (j / 2) + l];
      int32_t u = j % 2 ? byte >> 4 : byte & 0xF;
      if (type == kQ5_K) u |= ((qh[l] >> j) & 1) << 4;
      s += u * q[32 * j + l];
    }
    isum += scales[j] * s;
    min_sum += mins[j] * x.sum16x2[i * (x.k / 32) + 8 * b + j];
  }
  const float dx = x.d256[i * (x.k / kQKK) + b];
  *extra -= (dmin * dx) * static_cast<float>(min_sum);
  return static_cast<float>(isum) * (d * dx);
}

// Row i of x against super-block b of Q6_K: d d_x sum_s scale_s (sum(u q) - 32 sum(q)).
float dot_q6_k(const uint8_t* p, const QuantizedX& x, int64_t i, int64_t b) {
  const float d = half_at(p + 208);
  const int8_t* sc = reinterpret_cast<const int8_t*>(p + 192);
  const int8_t* q = x.q256 + i * x.k + b * kQKK;
  const int16_t* sums = x.sum16 + i * (x.k / 16) + 16 * b;
  int32_t isum = 0;
  for (int v = 0; v < 256; ++v) {
    const int half = v / 128, t = (v % 128) / 32, l = v % 32;
    const uint8_t low = p[64 * half + 32 * (t % 2) + l];
    const uint8_t high = p[128 + 32 * half + l];
    const int32_t u = (t < 2 ? low & 0xF : low >> 4) | (((high >> (2 * t)) & 3) << 4);
    isum += sc[v / 16] * u * q[v];
  }
  for (int s = 0; s < 16; ++s) isum -= 32 * sc[s] * sums[s];
  return static_cast<float>(isum) * (d * x.d256[i * (x.k / kQKK) + b]);
}

void put(const WeightRows& w, int64_t i, float v) {
  if (w.y_bf16) {
    static_cast<uint16_t*>(w.y)[i] = simd::to_bf16(v);
  } else {
    static_cast<float*>(w.y)[i] = v;
  }
}

void int_rows(const QuantizedX& x, int64_t m0, int64_t m, const WeightRows& w, int64_t n0,
              int64_t n1) {
  const TypeInfo& info = *type_info(w.type);
  const int64_t blocks = x.k / info.block_size;
  for (int64_t r = n0; r < n1; ++r) {
    const uint8_t* row = w.w + r * w.row_bytes;
    for (int64_t i = m0; i < m0 + m; ++i) {
      float acc = 0.f, extra = 0.f;
      for (int64_t b = 0; b < blocks; ++b) {
        const uint8_t* p = row + b * info.type_size;
        if (w.type == kQ6_K) {
          acc += dot_q6_k(p, x, i, b);
        } else if (w.type == kQ4_K || w.type == kQ5_K) {
          acc += dot_q45_k(w.type, p, x, i, b, &extra);
        } else {
          acc += dot32(w.type, p, x, i, b, &extra);
        }
      }
      put(w, i * w.n + r, acc + extra);
    }
  }
}

void float_rows(const float* x, int64_t k, int64_t m0, int64_t m, const WeightRows& w, int64_t n0,
                int64_t n1) {
  constexpr int64_t kChunk = 512, kLanes = 16;
  const TypeInfo& info = *type_info(w.type);
  const int64_t chunk = kChunk / info.block_size * info.block_size;
  float buf[kChunk];
  for (int64_t r = n0; r < n1; ++r) {
    const uint8_t* row = w.w + r * w.row_bytes;
    for (int64_t i = m0; i < m0 + m; ++i) {
      float lanes[kLanes] = {};
      for (int64_t j0 = 0; j0 < k; j0 += chunk) {
        const int64_t len = k - j0 < chunk ? k - j0 : chunk;
        dequantize_blocks(w.type, row, j0 / info.block_size, len / info.block_size, buf);
        const float* xr = x + i * k + j0;
        for (int64_t j = 0; j < len; ++j) lanes[j % kLanes] += buf[j] * xr[j];
      }
      float s = 0.f;
      for (float lane : lanes) s += lane;
      put(w, i * w.n + r, s);
    }
  }
}

void dequantize_row(int32_t type, const uint8_t* row, int64_t k, float* out32, uint16_t* out16) {
  dequantize_row_to(type, row, k, out32, out16);
}

}  // namespace
}  // namespace portable
}  // namespace gguf
}  // namespace zerolayer

#pragma GCC pop_options

namespace zerolayer {
namespace gguf {

const IsaKernels& portable_kernels() {
  static const IsaKernels kernels{"portable", &portable::int_rows, &portable::float_rows,
                                  &portable::dequantize_row};
  return kernels;
}

}  // namespace gguf
}  // namespace zerolayer
