// Writes a GGUF file whose tensors are produced as float rows on demand (random generation,
// dequantized input, safetensors), converted to each tensor's type on a thread pool. Only the
// tensor being converted and the one being written are in memory at any time.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "convert/arch.h"

namespace minfer::convert {

// Fills rows [row0, row0 + n_rows) of the tensor as floats (n_rows * row_len values). Called
// concurrently from several threads for disjoint row ranges.
using RowSource = std::function<void(int64_t row0, int64_t n_rows, float* dst)>;

struct OutTensor {
  std::string name;
  GgmlType type;
  std::vector<int64_t> shape;  // GGUF order
  RowSource rows;
};

struct StreamOptions {
  int n_threads = 0;                     // 0: all cores
  std::function<void(double)> progress;  // fraction of tensor bytes written
};

// Returns the file size in bytes.
uint64_t write_gguf(const std::string& path, const Metadata& md, const std::vector<OutTensor>& tensors,
                    const StreamOptions& opts);

}  // namespace minfer::convert
