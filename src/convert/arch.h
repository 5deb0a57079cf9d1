// What every model writer (synth, convert, quantize) shares: the GGUF names of an architecture's
// hyperparameter keys and tensors, llama3 rope frequency divisors, and exact GGUF size accounting.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "gguf/gguf.h"
#include "model/model.h"

namespace minfer::convert {

using Metadata = std::vector<std::pair<std::string, gguf::Value>>;

// general.architecture for an Arch (Mistral models are stored as "llama", as llama.cpp does).
const char* gguf_arch_name(Arch arch);
// Sets key to value, replacing an existing entry in place (order kept).
void set_meta(Metadata& md, const std::string& key, gguf::Value value);

struct RopeScaling {
  enum class Kind { None, Linear, Llama3 } kind = Kind::None;
  float factor = 1.0f;
  float low_freq_factor = 1.0f, high_freq_factor = 4.0f;  // llama3 only
  int original_context = 8192;                            // llama3 only
};

struct ModelShape {
  HParams hp;
  RopeScaling rope_scaling;
  bool qkv_bias = false;  // qwen2
  bool qk_norm = false;   // qwen3
};

// {arch}.* hyperparameter keys as llama.cpp names them (context, sizes, heads, rope, rms eps,
// key/value length, vocab size, rope scaling).
Metadata hparam_metadata(const ModelShape& shape);

enum class TensorRole { Matrix, Norm, Bias, RopeFreqs };
struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;  // GGUF order: shape[0] is the row length
  TensorRole role;
};
// Every tensor of the model in the order llama.cpp's converter writes them.
std::vector<TensorSpec> model_tensors(const ModelShape& shape);

// Per-dimension rope frequency divisors of llama3 scaling (head_dim / 2 values): 1 for
// high-frequency dimensions, `factor` for low-frequency ones, smooth in between.
std::vector<float> llama3_rope_freqs(int head_dim, float rope_base, const RopeScaling& s);

// Byte-exact size of a GGUF v3 file with this metadata and these tensors.
struct TensorLayout {
  std::string name;
  GgmlType type;
  std::vector<int64_t> shape;
};
uint64_t tensor_nbytes(GgmlType type, const std::vector<int64_t>& shape);
uint64_t gguf_header_bytes(const Metadata& md, const std::vector<TensorLayout>& tensors,
                           uint64_t alignment = 32);
uint64_t gguf_tensor_bytes(const std::vector<TensorLayout>& tensors, uint64_t alignment = 32);

}  // namespace minfer::convert
