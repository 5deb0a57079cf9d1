// Environment switches. An opt-out (MINFER_NO_*) counts as set when the variable exists and is
// neither empty nor "0", the same rule for every switch.
#pragma once
#include <cstdlib>
#include <cstring>

namespace minfer {

inline bool env_flag(const char* name) {
  const char* v = std::getenv(name);
  return v && *v && std::strcmp(v, "0") != 0;
}

}  // namespace minfer
