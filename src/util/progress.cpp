#include "util/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <memory>

namespace minfer {

std::function<void(double)> stderr_progress_bar(std::string label) {
  const bool tty = isatty(STDERR_FILENO);
  auto last = std::make_shared<int>(-1);
  return [label = std::move(label), tty, last](double fraction) {
    const int percent = int(std::clamp(fraction, 0.0, 1.0) * 100.0);
    if (percent == *last || (!tty && percent % 10 != 0 && percent != 100)) return;
    *last = percent;
    constexpr int kWidth = 40;
    const int filled = percent * kWidth / 100;
    std::fprintf(stderr, "%s%s [%.*s%*s] %3d%%%s", tty ? "\r" : "", label.c_str(), filled,
                 "########################################", kWidth - filled, "", percent,
                 tty && percent < 100 ? "" : "\n");
    std::fflush(stderr);
  };
}

}  // namespace minfer
