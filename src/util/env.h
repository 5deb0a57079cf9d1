// Environment switches. An opt-out (MINFER_NO_*) counts as set when the variable exists and is
// neither empty nor "0", the same rule for every switch.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace minfer {

inline bool env_flag(const char* name) {
  const char* v = std::getenv(name);
  return v && *v && std::strcmp(v, "0") != 0;
}

// A numeric setting: `fallback` where the variable is unset or empty, else its value (junk reads
// as 0) but at least `least`.
inline int64_t env_int(const char* name, int64_t fallback, int64_t least) {
  const char* v = std::getenv(name);
  return v && *v ? std::max(least, int64_t(std::atoll(v))) : fallback;
}

}  // namespace minfer
