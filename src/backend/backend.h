// The interface every backend implements (CPU reference, CUDA). A backend owns its KV cache and
// activation buffers; the Session above it does chunking, position bookkeeping and limits.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "graph/graph.h"

namespace minfer {

struct Batch {
  std::span<const int32_t> tokens;  // n_tokens = tokens.size() <= max_batch()
  int pos = 0;                      // position of tokens[0]; the cache holds positions [0, pos)
  bool all_logits = false;          // logits for every token (perplexity) or only the last
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  // Allocates the KV cache for n_ctx positions and buffers for batches up to max_batch tokens.
  virtual void reserve(int n_ctx, int max_batch) = 0;
  virtual int max_batch() const = 0;
  // Runs the graph; logits gets n_vocab floats per requested token, row-major.
  virtual void forward(const Batch& batch, std::vector<float>& logits) = 0;
  // Runs the graph and returns argmax of the last token's logits (the CUDA backend does this on
  // the device and copies back one int).
  virtual int32_t forward_greedy(const Batch& batch);
};

std::unique_ptr<Backend> make_cpu_backend(const Model& model, const Graph& graph, int n_threads);
// Throws minfer::Error when minfer was built without CUDA or no device is present.
std::unique_ptr<Backend> make_cuda_backend(const Model& model, const Graph& graph);
bool cuda_available();

// MINFER_DUMP=DIR: each backend calls this after every node (step = forward call index).
// Writes DIR/stepNNNN/NN_name.bin (header: rows, cols; then f32 data). Returns false when off.
bool dump_enabled();
void dump_node(int step, int node_index, const std::string& name, int64_t rows, int64_t cols,
               const float* data);

}  // namespace minfer
