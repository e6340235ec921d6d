// What the kernels share inside the library: limits, the errors their checks raise, and the
// entry points of one kernel that another one calls. Plain C++ (no torch header): tensors cross
// the C ABI of api.h as raw pointers and sizes, checked by the Python wrappers
// (zerolayer/scheduler/model/native/library.py) before the call.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace zerolayer {

// Most rows of x skinny_linear takes (decode batches up to this size use it).
constexpr int64_t kMaxSkinnyRows = 4;

// An input a kernel refuses; its message reaches Python as a RuntimeError (api.h: zl_last_error).
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

inline void append(std::string& s, const char* v) { s += v; }
inline void append(std::string& s, const std::string& v) { s += v; }
template <typename T, typename = std::enable_if_t<std::is_arithmetic<T>::value>>
void append(std::string& s, T v) {
  s += std::to_string(v);
}

// Throws Error with the message made of parts (strings and numbers, concatenated).
template <typename... Parts>
[[noreturn]] void fail(const Parts&... parts) {
  std::string message;
  (append(message, parts), ...);
  throw Error(message);
}

#define ZL_CHECK(cond, ...)                          \
  do {                                               \
    if (!(cond)) ::zerolayer::fail(__VA_ARGS__);     \
  } while (0)

// Runs body; returns 0, or 1 with the exception's message kept for zl_last_error. Every C entry
// point of api.h goes through it: no exception crosses the ABI.
int guarded(void (*body)(void*), void* context) noexcept;

template <typename F>
int guarded(F&& body) noexcept {
  return guarded([](void* f) { (*static_cast<F*>(f))(); }, static_cast<void*>(&body));
}

// Whether skinny_linear uses AVX-512 BF16's dot product (vdpbf16ps) on this CPU.
bool has_bf16_dot();

// The path skinny_linear takes on this CPU ("avx512bf16", "avx512", "avx2", "portable"); widened:
// the best one without vdpbf16ps.
const char* skinny_linear_isa(bool widened);

// The path paged_attention takes on this CPU ("avx512", "avx2", "portable").
const char* paged_attention_isa();

// The path bf16_gemm takes on this CPU ("avx2"), or nullptr where it has none (no AVX2, or a
// portable build).
const char* bf16_gemm_isa();

// The instruction set int8_linear uses on this CPU for group size G ("avx512vnni", "avxvnni",
// "portable").
const char* int8_linear_isa(int64_t group_size);

}  // namespace zerolayer
