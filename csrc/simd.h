// What the CPU kernels share: multiversioning and the 16-float vectors of the linear kernels.
//
// Vectors are GCC/Clang vector extensions rather than intrinsics; ZL_MULTIVERSION compiles a hot
// function for x86-64-v4 (AVX-512), x86-64-v3 (AVX2) and baseline and picks one at load time
// (target_clones), so the build needs no -march flag and a cached library runs on another CPU.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__GNUC__) && !defined(__clang__)
// The 64-byte vectors only live in always-inline helpers, so the ABI note does not apply.
#pragma GCC diagnostic ignored "-Wpsabi"
#endif

// -DZL_NO_MULTIVERSION builds for the compiler's target only (to test one ISA with -march=...).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(ZL_NO_MULTIVERSION)
#define ZL_MULTIVERSION \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define ZL_MULTIVERSION
#endif

// Functions compiled for one named level, which a kernel picks itself by cpu_has
// (cpu_features.h): unlike target_clones, each can also be called by name (the explicit-ISA
// entry points the tests use), and ZL_ISA_CAP caps the choice.
#if defined(__x86_64__) && defined(__GNUC__)
#define ZL_X86 1
#define ZL_TARGET_AVX512 __attribute__((target("arch=x86-64-v4")))
#define ZL_TARGET_AVX2 __attribute__((target("arch=x86-64-v3")))
#else
#define ZL_X86 0
#endif

namespace zerolayer {
namespace simd {

constexpr int64_t kLanes = 16;
typedef float VecF __attribute__((vector_size(64)));
typedef uint32_t VecU __attribute__((vector_size(64)));
typedef uint16_t VecH __attribute__((vector_size(32)));

// kLanes bfloat16 values from src widened to float32 (bfloat16 is the top half of a float32).
inline __attribute__((always_inline)) VecF widen(const uint16_t* src) {
  VecH h;
  std::memcpy(&h, src, sizeof(h));
  VecU u = __builtin_convertvector(h, VecU) << 16;
  VecF f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

inline __attribute__((always_inline)) void store(float* dst, VecF v) {
  std::memcpy(dst, &v, sizeof(v));
}

// The lanes summed left to right: one fixed order, which batch invariance relies on.
inline __attribute__((always_inline)) float hsum(VecF v) {
  float s = 0.f;
  for (int i = 0; i < kLanes; ++i) s += v[i];
  return s;
}

inline __attribute__((always_inline)) uint16_t to_bf16(float f) {
  // Round to nearest even, as torch does; NaN stays NaN.
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// One bfloat16 value as float32 (exact).
inline float from_bf16(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// f rounded to bfloat16 precision (to nearest even), as a float32.
inline float round_bf16(float f) { return from_bf16(to_bf16(f)); }

}  // namespace simd
}  // namespace zerolayer
