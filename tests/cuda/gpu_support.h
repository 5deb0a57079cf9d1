// Helpers for the GPU tests: device buffers, and a skip when no CUDA device is present.
#pragma once
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <vector>

#include "backend/backend.h"
#include "../support.h"

namespace minfer::test {

#define MINFER_REQUIRE_GPU()                                  \
  do {                                                        \
    if (!::minfer::cuda_available()) GTEST_SKIP() << "no CUDA device"; \
  } while (0)

inline void cuda_ok(cudaError_t e) { ASSERT_EQ(e, cudaSuccess) << cudaGetErrorString(e); }

template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t n) : n_(n) {
    // poisoned, so an element no kernel wrote shows up
    if (cudaMalloc(&p_, std::max<size_t>(n * sizeof(T), 256) + 64) != cudaSuccess) p_ = nullptr;
    if (p_) cudaMemset(p_, 0xA5, n * sizeof(T) + 64);
  }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) { upload(host); }
  ~DeviceBuffer() { cudaFree(p_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  T* get() const { return static_cast<T*>(p_); }
  void upload(const std::vector<T>& host) {
    cudaMemcpy(p_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice);
  }
  std::vector<T> download() const {
    std::vector<T> host(n_);
    cudaDeviceSynchronize();
    cudaMemcpy(host.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost);
    return host;
  }

 private:
  void* p_ = nullptr;
  size_t n_;
};

}  // namespace minfer::test
