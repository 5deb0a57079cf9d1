// Helpers for the GPU tests: device buffers, and a skip when no CUDA device is present.
#pragma once
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/kernels.h"
#include "../support.h"

namespace minfer::test {

#define MINFER_REQUIRE_GPU()                                  \
  do {                                                        \
    if (!::minfer::cuda_available()) GTEST_SKIP() << "no CUDA device"; \
  } while (0)

inline void cuda_ok(cudaError_t e) { ASSERT_EQ(e, cudaSuccess) << cudaGetErrorString(e); }

// A device buffer of exactly n elements (so that compute-sanitizer memcheck sees any access past
// it), poisoned, so an element no kernel wrote shows up.
template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t n) : n_(n) {
    if (n && cudaMalloc(&p_, n * sizeof(T)) != cudaSuccess) p_ = nullptr;
    fill_bytes(0xA5);
  }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) { upload(host); }
  ~DeviceBuffer() { cudaFree(p_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  T* get() const { return static_cast<T*>(p_); }
  size_t size() const { return n_; }
  void fill_bytes(int byte) {
    if (p_) cudaMemset(p_, byte, n_ * sizeof(T));
  }
  void upload(const std::vector<T>& host) {
    EXPECT_LE(host.size(), n_) << "an upload larger than its device buffer";
    if (p_) cudaMemcpy(p_, host.data(), std::min(host.size(), n_) * sizeof(T), cudaMemcpyHostToDevice);
  }
  std::vector<T> download() const {
    std::vector<T> host(n_);
    cudaDeviceSynchronize();
    if (p_) cudaMemcpy(host.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost);
    return host;
  }

 private:
  void* p_ = nullptr;
  size_t n_;
};

// A matrix's bytes as the weights arena holds them: the device layout of its GGUF rows, then the
// cuda::kWeightsTailBytes of zeros the 32-block kernels may read past the last row (ld_words_a2).
inline std::vector<uint8_t> weights_image(GgmlType t, int64_t cols, const std::vector<uint8_t>& gguf_bytes) {
  std::vector<uint8_t> image = cuda::device_layout(t, cols, gguf_bytes);
  image.resize(image.size() + size_t(cuda::kWeightsTailBytes), 0);
  return image;
}

}  // namespace minfer::test
