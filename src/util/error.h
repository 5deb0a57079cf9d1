// One exception type for every user-facing failure: the message names the file, the item and the
// numbers, so the CLI can print it as-is and exit non-zero.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace minfer {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

template <typename... Args>
std::string str_cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

template <typename... Args>
[[noreturn]] void fail(const Args&... args) {
  throw Error(str_cat(args...));
}

}  // namespace minfer
