#include "support.h"

#include <array>
#include <cstdio>
#include <cstdlib>
#include <unistd.h>

namespace minfer::test {

uint64_t seed() {
  static const uint64_t s = [] {
    if (const char* e = std::getenv("MINFER_TEST_SEED")) return uint64_t(std::strtoull(e, nullptr, 10));
    const uint64_t v = std::random_device{}();
    std::fprintf(stderr, "[minfer test] MINFER_TEST_SEED=%llu\n", (unsigned long long)v);
    return v;
  }();
  return s;
}

std::vector<float> random_normal(size_t n, float stddev, uint64_t salt) {
  std::mt19937_64 rng(seed() * 0x9E3779B97F4A7C15ull + salt);
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

std::filesystem::path temp_dir(const std::string& tag) {
  static int counter = 0;
  auto p = std::filesystem::temp_directory_path() /
           ("minfer-test-" + tag + "-" + std::to_string(getpid()) + "-" + std::to_string(counter++));
  std::filesystem::remove_all(p);
  std::filesystem::create_directories(p);
  return p;
}

std::filesystem::path source_dir() { return MINFER_SOURCE_DIR; }
std::filesystem::path shared_dir() {
  if (const char* e = std::getenv("MINFER_SHARED_DIR")) return e;
  return source_dir().parent_path() / "shared";
}
// MINFER_TEST_CLI: a build carried to another machine (the GPU runs) has its CLI elsewhere.
std::string minfer_binary() {
  if (const char* e = std::getenv("MINFER_TEST_CLI")) return e;
  return MINFER_BINARY;
}

int run_command(const std::string& cmd, std::string* out) {
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return -1;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0)
    if (out) out->append(buf.data(), n);
  const int rc = pclose(p);
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

}  // namespace minfer::test
