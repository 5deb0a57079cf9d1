// The model's weights on one device, uploaded once and shared by everything that runs the model
// there. Matrices go up in the device layout (kernels.h: their GGUF blocks, q6_K's padded to a
// 4-byte multiple), copied into it on the way through the pinned staging; norm weights and biases
// are converted to f32 from whatever type the file stores them in.
#pragma once
#include <map>

#include "backend/cuda/device.h"
#include "backend/cuda/kernels.h"
#include "graph/graph.h"

namespace minfer::cuda {

struct UploadStats {
  double seconds = 0;  // mmap -> device, including the pinned staging
  int64_t bytes = 0;
};

class DeviceWeights {
 public:
  // Throws minfer::Error naming the tensor when a type or shape does not suit the kernels.
  DeviceWeights(const Model& model, const Graph& graph, UploadStats& stats);
  const DevMat& mat(const Tensor* t) const { return mats_.at(t); }
  const float* vec(const Tensor* t) const { return t ? vecs_.at(t) : nullptr; }
  const float* inv_freq() const { return inv_freq_.get(); }  // rope: theta_j = pos * inv_freq[j]

 private:
  DeviceArray<uint8_t> arena_;
  DeviceArray<float> vec_arena_, inv_freq_;
  std::map<const Tensor*, DevMat> mats_;
  std::map<const Tensor*, const float*> vecs_;
};

}  // namespace minfer::cuda
