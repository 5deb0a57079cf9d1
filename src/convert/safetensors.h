// Reader for HF safetensors checkpoints: a single model.safetensors, or shards listed by
// model.safetensors.index.json. Each file is an 8-byte little-endian header length, a JSON header
// {name: {dtype, shape, data_offsets}} and the raw tensor bytes; files are memory-mapped.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "util/mmap.h"

namespace minfer::convert {

enum class StDtype { F32, F16, BF16 };

struct StTensor {
  std::string name;
  StDtype dtype;
  std::vector<int64_t> shape;  // safetensors (row-major) order: the last dimension is contiguous
  const uint8_t* data = nullptr;
  uint64_t nbytes = 0;
  std::string file;

  int64_t n_elements() const;
  // Converts elements [first, first + n) to float.
  void read_floats(int64_t first, int64_t n, float* dst) const;
};

class Checkpoint {
 public:
  // `dir` holds model.safetensors or model.safetensors.index.json + shards.
  static Checkpoint open(const std::string& dir);
  // Parses one file (throws naming the file and the bad item).
  void add_file(const std::string& path);

  const StTensor* find(const std::string& name) const;
  const StTensor& get(const std::string& name) const;  // throws naming the checkpoint
  const std::map<std::string, StTensor>& tensors() const { return tensors_; }
  // Every file the checkpoint was read from (the shards and their index).
  const std::vector<std::string>& files() const { return files_; }

 private:
  std::string dir_;
  std::vector<std::string> files_;
  std::vector<Mapping> mappings_;
  std::map<std::string, StTensor> tensors_;
};

}  // namespace minfer::convert
