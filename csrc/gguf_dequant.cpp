// GGUF's types and instruction sets, and the dequantization entry point (api.h:
// zl_gguf_dequantize): rows of a weight read in place, dequantized exactly to float32 or rounded
// once to bfloat16 (the embedding lookup, the chunked prefill path, the tests).

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "api.h"
#include "cpu_features.h"
#include "gguf_kernels.h"
#include "kernels.h"
#include "parallel.h"

namespace zerolayer {
namespace gguf {
namespace {

constexpr TypeInfo kTypes[] = {
    {kF32, "F32", 1, 4, Domain::kFloat},       {kF16, "F16", 1, 2, Domain::kFloat},
    {kBF16, "BF16", 1, 2, Domain::kFloat},     {kQ4_0, "Q4_0", 32, 18, Domain::kQ8_0},
    {kQ4_1, "Q4_1", 32, 20, Domain::kQ8_0},    {kQ5_0, "Q5_0", 32, 22, Domain::kQ8_0},
    {kQ5_1, "Q5_1", 32, 24, Domain::kQ8_0},    {kQ8_0, "Q8_0", 32, 34, Domain::kQ8_0},
    {kQ4_K, "Q4_K", 256, 144, Domain::kQ8_K},  {kQ5_K, "Q5_K", 256, 176, Domain::kQ8_K},
    {kQ6_K, "Q6_K", 256, 210, Domain::kQ8_K},
};

bool avx512_usable() { return cpu_has(CpuFeature::kAvx512Vnni); }
bool avx2_usable() { return cpu_has(CpuFeature::kAvx2Fma); }

}  // namespace

const TypeInfo* type_info(int32_t id) {
  for (const TypeInfo& info : kTypes) {
    if (info.id == id) return &info;
  }
  return nullptr;
}

const IsaKernels& isa_kernels(const char* isa) {
  struct Candidate {
    const IsaKernels& (*kernels)();
    bool (*usable)();
  };
  static const Candidate kCandidates[] = {
      {&avx512_kernels, &avx512_usable},
      {&avx2_kernels, &avx2_usable},
      {&portable_kernels, [] { return true; }},
  };
  for (const Candidate& c : kCandidates) {
    const IsaKernels& kernels = c.kernels();
    if (isa == nullptr ? c.usable() : std::strcmp(kernels.name, isa) == 0) {
      ZL_CHECK(c.usable(), "gguf: ", kernels.name, " does not run on this CPU");
      return kernels;
    }
  }
  fail("gguf: unknown ISA ", isa);
}

}  // namespace gguf
}  // namespace zerolayer

const char* zl_gguf_isa(void) { return zerolayer::gguf::isa_kernels(nullptr).name; }

int32_t zl_gguf_dequantize(int32_t type, const void* w, int64_t n, int64_t k, const int64_t* ids,
                           int64_t count, int32_t out_dtype, void* out, const char* isa,
                           int32_t num_threads) {
  using namespace zerolayer;
  using namespace zerolayer::gguf;
  return guarded([&] {
    const TypeInfo* info = type_info(type);
    ZL_CHECK(info != nullptr, "gguf_dequantize: unknown GGUF type id ", type);
    ZL_CHECK(k > 0 && k % info->block_size == 0, "gguf_dequantize: K = ", k,
             " is not a multiple of ", info->name, "'s block size ", info->block_size);
    ZL_CHECK(out_dtype == ZL_FLOAT32 || out_dtype == ZL_BFLOAT16,
             "gguf_dequantize: float32 or bfloat16 out expected");
    const int64_t rows = ids != nullptr ? count : n;
    for (int64_t i = 0; ids != nullptr && i < count; ++i) {
      ZL_CHECK(ids[i] >= 0 && ids[i] < n, "gguf_dequantize: row id ", ids[i], " is not in [0, ",
               n, ")");
    }
    const IsaKernels& kernels = isa_kernels(isa);
    const int64_t bytes = row_bytes(*info, k);
    const uint8_t* base = static_cast<const uint8_t*>(w);
    const int64_t grain = std::max<int64_t>(1, (64 << 10) / k);
    parallel_for(0, rows, grain, num_threads, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const uint8_t* row = base + (ids != nullptr ? ids[r] : r) * bytes;
        if (out_dtype == ZL_FLOAT32) {
          kernels.dequantize_row(type, row, k, static_cast<float*>(out) + r * k, nullptr);
        } else {
          kernels.dequantize_row(type, row, k, nullptr, static_cast<uint16_t*>(out) + r * k);
        }
      }
    });
  });
}
