// Shared helpers for the tests: deterministic-per-run random data, temp dirs, repo paths.
#pragma once
#include <cstdint>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

namespace minfer::test {

// A fresh seed per process (printed once) so kernels are tested on new inputs each run; set
// MINFER_TEST_SEED to reproduce a failure.
uint64_t seed();
std::vector<float> random_normal(size_t n, float stddev = 1.0f, uint64_t salt = 0);
std::filesystem::path temp_dir(const std::string& tag);  // unique, created
std::filesystem::path source_dir();                      // repo root
std::filesystem::path shared_dir();                      // ../shared beside the repo
std::string minfer_binary();                             // the built CLI (MINFER_TEST_CLI: another path)
// Runs a shell command, returns its exit code; stdout+stderr captured into *out when given.
int run_command(const std::string& cmd, std::string* out = nullptr);

}  // namespace minfer::test
