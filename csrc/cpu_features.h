// The CPU's vector extensions as the kernels may use them: what the CPU reports
// (__builtin_cpu_supports), capped by the build's ZL_ISA_CAP, so that a library built for an
// AVX2 host (ZEROLAYER_CPU_ISA=avx2: -march=x86-64-v3 -DZL_ISA_CAP=1 -DZL_NO_MULTIVERSION) runs
// only AVX2 code on an AVX-512 CPU too. Every runtime ISA choice of the kernels asks here.
#pragma once

namespace zerolayer {

// The levels of ZL_ISA_CAP: what a build may use at most.
constexpr int kIsaPortable = 0;  // baseline x86-64 (SSE2), or any other architecture
constexpr int kIsaAvx2 = 1;      // x86-64-v3: AVX2, FMA, F16C, BMI2
constexpr int kIsaAvx512 = 2;    // x86-64-v4 (AVX-512 F/BW/DQ/VL) and its VNNI and BF16 additions

enum class CpuFeature {
  kAvx2Fma,     // AVX2 + FMA + F16C (x86-64-v3)
  kAvx512,      // AVX-512 F, BW, DQ, VL (x86-64-v4)
  kAvx512Vnni,  // AVX-512 VNNI (vpdpbusd on 512-bit vectors), with kAvx512
  kAvx512Bf16,  // AVX-512 BF16 (vdpbf16ps), with kAvx512
  kAvxVnni,     // AVX-VNNI (vpdpbusd on 256-bit vectors, VEX encoded); above the AVX2 cap
};

// Whether the CPU has `feature` and this build's cap allows it.
bool cpu_has(CpuFeature feature);

// The build's cap: "native" (whatever the CPU has), "avx2" or "portable".
const char* isa_cap_name();

// The best level this library runs on this CPU: "avx512", "avx2" or "portable".
const char* isa_level_name();

}  // namespace zerolayer
