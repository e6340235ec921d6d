// The library-wide entry points of api.h: the ABI version, the last error and the CPU's features.

#include "api.h"

#include <exception>
#include <string>

#include "cpu_features.h"
#include "kernels.h"

namespace zerolayer {
namespace {

thread_local std::string last_error;

}  // namespace

int guarded(void (*body)(void*), void* context) noexcept {
  try {
    body(context);
    return 0;
  } catch (const std::exception& e) {
    last_error = e.what();
  } catch (...) {
    last_error = "unknown error";
  }
  return 1;
}

}  // namespace zerolayer

int32_t zl_abi_version(void) { return ZL_ABI_VERSION; }

const char* zl_last_error(void) { return zerolayer::last_error.c_str(); }

const char* zl_isa_cap(void) { return zerolayer::isa_cap_name(); }

const char* zl_isa_level(void) { return zerolayer::isa_level_name(); }

int32_t zl_max_skinny_rows(void) { return static_cast<int32_t>(zerolayer::kMaxSkinnyRows); }

int32_t zl_has_bf16_dot(void) { return zerolayer::has_bf16_dot() ? 1 : 0; }

const char* zl_skinny_linear_isa(int32_t widened) {
  return zerolayer::skinny_linear_isa(widened != 0);
}

const char* zl_int8_linear_isa(int64_t group_size) {
  return zerolayer::int8_linear_isa(group_size);
}
