#include "backend/backend.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "sampling/sampler.h"
#include "util/error.h"

namespace minfer {

int32_t Backend::forward_greedy(const Batch& batch) {
  std::vector<float> logits;
  Batch last_only = batch;
  last_only.all_logits = false;
  forward(last_only, logits);
  return argmax(logits);
}

#ifndef MINFER_HAVE_CUDA
std::unique_ptr<Backend> make_cuda_backend(const Model&, const Graph&) {
  fail("the CUDA backend is not available: minfer was built without CUDA (use --backend cpu)");
}
bool cuda_available() { return false; }
#endif

static const char* dump_dir() {
  static const char* dir = [] {
    const char* d = std::getenv("MINFER_DUMP");
    return (d && *d) ? d : nullptr;
  }();
  return dir;
}

bool dump_enabled() { return dump_dir() != nullptr; }

void dump_node(int step, int node_index, const std::string& name, int64_t rows, int64_t cols,
               const float* data) {
  const char* dir = dump_dir();
  if (!dir) return;
  char step_name[32], file_name[32];
  std::snprintf(step_name, sizeof step_name, "step%04d", step);
  std::snprintf(file_name, sizeof file_name, "%04d_", node_index);
  const std::filesystem::path step_dir = std::filesystem::path(dir) / step_name;
  std::error_code ec;
  std::filesystem::create_directories(step_dir, ec);
  if (ec) fail("MINFER_DUMP: cannot create directory ", step_dir.string(), ": ", ec.message());
  const std::filesystem::path path = step_dir / (file_name + name + ".bin");
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) fail("MINFER_DUMP: cannot write ", path.string());
  const int64_t header[2] = {rows, cols};
  const size_t n = size_t(rows * cols);
  const bool ok = std::fwrite(header, sizeof header, 1, f) == 1 &&
                  std::fwrite(data, sizeof(float), n, f) == n;
  if (std::fclose(f) != 0 || !ok) fail("MINFER_DUMP: short write to ", path.string());
}

}  // namespace minfer
