// The CPU's features, capped by the build (cpu_features.h).

#include "cpu_features.h"

#ifndef ZL_ISA_CAP
#define ZL_ISA_CAP 2
#endif

namespace zerolayer {
namespace {

constexpr int kCap = ZL_ISA_CAP;

#if defined(__x86_64__) && defined(__GNUC__)
bool reported(CpuFeature feature) {
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                    __builtin_cpu_supports("f16c");
  const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") &&
                      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
                      __builtin_cpu_supports("avx512vl");
  switch (feature) {
    case CpuFeature::kAvx2Fma: return avx2;
    case CpuFeature::kAvx512: return avx512;
    case CpuFeature::kAvx512Vnni: return avx512 && __builtin_cpu_supports("avx512vnni");
    case CpuFeature::kAvx512Bf16: return avx512 && __builtin_cpu_supports("avx512bf16");
    case CpuFeature::kAvxVnni: return avx2 && __builtin_cpu_supports("avxvnni");
  }
  return false;
}
#else
bool reported(CpuFeature) { return false; }
#endif

int level_of(CpuFeature feature) {
  return feature == CpuFeature::kAvx2Fma ? kIsaAvx2 : kIsaAvx512;
}

}  // namespace

bool cpu_has(CpuFeature feature) { return level_of(feature) <= kCap && reported(feature); }

const char* isa_cap_name() {
  return kCap >= kIsaAvx512 ? "native" : kCap == kIsaAvx2 ? "avx2" : "portable";
}

const char* isa_level_name() {
  if (cpu_has(CpuFeature::kAvx512)) return "avx512";
  return cpu_has(CpuFeature::kAvx2Fma) ? "avx2" : "portable";
}

}  // namespace zerolayer
