// What the GPU micro-benches (bench_prefill, bench_decode) share: checked CUDA calls, device
// buffers, random weight matrices, and a launch timed with CUDA events as the benchmark's manual time.
#pragma once
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <tuple>
#include <vector>

#include "../tests/cuda/prefill_test_data.h"
#include "backend/cuda/kernels.h"

namespace minfer::bench {

inline void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::abort();
  }
}

struct DeviceMemory {
  void* ptr = nullptr;
  size_t bytes = 0;
  explicit DeviceMemory(size_t n) : bytes(n) { check(cudaMalloc(&ptr, n), "cudaMalloc"); }
  ~DeviceMemory() { cudaFree(ptr); }
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;
};

// A random weight matrix (test::random_weight_rows) of n rows x k columns in type t on the device
// in its device layout, generated once per (t, n, k, salt) and kept for the process (a different
// salt: other bytes at another address, e.g. gate and up of one launch, which must not share
// cache lines).
inline const uint8_t* device_weights(GgmlType t, int64_t n, int64_t k, int salt = 0) {
  static std::map<std::tuple<GgmlType, int64_t, int64_t, int>, std::unique_ptr<DeviceMemory>> cache;
  auto& slot = cache[{t, n, k, salt}];
  if (!slot) {
    const std::vector<uint8_t> host = cuda::device_layout(
        t, k, test::random_weight_rows(t, n, k, 1234 + uint64_t(n) * 7 + uint64_t(k) + 1000003 * uint64_t(salt)));
    slot = std::make_unique<DeviceMemory>(host.size());
    check(cudaMemcpy(slot->ptr, host.data(), host.size(), cudaMemcpyHostToDevice), "upload weights");
  }
  return static_cast<const uint8_t*>(slot->ptr);
}

// Each iteration's time is one launch() between two events; one launch before them warms up
// (module load, shared-memory attributes).
template <typename Launch>
void time_with_events(benchmark::State& state, Launch launch) {
  cudaEvent_t start, stop;
  check(cudaEventCreate(&start), "event");
  check(cudaEventCreate(&stop), "event");
  launch();
  check(cudaDeviceSynchronize(), "warm-up");
  for (auto _ : state) {
    cudaEventRecord(start);
    launch();
    cudaEventRecord(stop);
    check(cudaEventSynchronize(stop), "kernel");
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    state.SetIterationTime(ms * 1e-3);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
}

}  // namespace minfer::bench
