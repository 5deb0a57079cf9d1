// The CUDA backend: the whole forward pass on one GPU. Decode steps (one token) run fused MMVQ
// kernels captured once into a CUDA graph and replayed; prompts run the prefill GEMM and flash
// attention (prefill.h). docs/07-cuda-backend.md describes the design.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"

namespace minfer::cuda {

// Each fusion can be switched off by an environment variable; switched off, the node-by-node path
// runs and produces the same bits (tests/cuda proves it).
struct Fusions {
  bool decode_a_fuse = true;  // MINFER_NO_DECODE_A_FUSE: rms_norm/swiglu write the pad40 plane
  bool cuda_graph = true;     // MINFER_NO_CUDA_GRAPH: launch the decode step node by node
  bool fused_qkv = true;      // MINFER_NO_FUSED_QKV: q/k/v + bias + rope + KV write in one launch
  bool fused_ffn = true;      // MINFER_NO_FUSED_FFN: gate and up in one launch
  bool fused_residual = true; // MINFER_NO_FUSED_RESIDUAL: residual add in the matmul epilogue
  static Fusions from_env();
  static Fusions none();
};

struct KernelTime {
  std::string name;
  int launches = 0;
  double microseconds = 0;
};

struct LoadStats {
  double upload_seconds = 0;  // mmap -> device, including the pinned staging
  int64_t weight_bytes = 0;
  int64_t kv_bytes = 0;
  int64_t workspace_bytes = 0;
};

class CudaBackend : public Backend {
 public:
  CudaBackend(const Model& model, const Graph& graph, Fusions fusions = Fusions::from_env());
  ~CudaBackend() override;
  std::string name() const override { return "cuda"; }
  void reserve(int n_ctx, int max_batch) override;
  int max_batch() const override { return max_batch_; }
  void forward(const Batch& batch, std::vector<float>& logits) override;
  int32_t forward_greedy(const Batch& batch) override;

  // Runs one decode step (token at pos) launch by launch, timing each kernel with CUDA events.
  std::vector<KernelTime> census(int32_t token, int pos);
  const LoadStats& load_stats() const { return stats_; }
  const Fusions& fusions() const { return fusions_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  Fusions fusions_;
  int max_batch_ = 0;
  LoadStats stats_;
};

// Device-to-device copy rate in bytes per second (bytes read + bytes written), for rooflines.
double measure_copy_bandwidth();
std::string device_name();

}  // namespace minfer::cuda
