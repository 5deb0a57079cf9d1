#include "backend/cuda/device.h"

#include "backend/cuda/kernels.h"
#include "util/error.h"

namespace minfer::cuda {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail("CUDA ", what, ": ", cudaGetErrorString(e));
}

DeviceContext::DeviceContext(int dev) : device(dev) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0)
    fail("cuda backend: no CUDA device found (use --backend cpu)");
  if (dev < 0 || dev >= count) fail("cuda backend: device ", dev, " does not exist (", count, " found)");
  make_current();
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
  sm_count = prop.multiProcessorCount;
  name = prop.name;
}

void DeviceContext::make_current() const { check(cudaSetDevice(device), "cudaSetDevice"); }

}  // namespace minfer::cuda
