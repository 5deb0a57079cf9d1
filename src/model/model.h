// A transformer language model as stored in a GGUF file: hyperparameters from metadata and the
// weight tensors found by name (with shape checks). The tensors point into the file's mapping.
#pragma once
#include <string>
#include <vector>

#include "gguf/gguf.h"

namespace minfer {

enum class Arch { Llama, Qwen2, Qwen3, Mistral };
enum class RopeType { Normal, NeoX };  // normal: adjacent pairs (llama); NeoX: halves (qwen)

struct HParams {
  Arch arch = Arch::Llama;
  std::string arch_name;  // general.architecture
  int n_vocab = 0;
  int n_ctx_train = 0;
  int n_embd = 0;
  int n_layer = 0;
  int n_head = 0;
  int n_head_kv = 0;
  int head_dim = 0;  // {arch}.attention.key_length, default n_embd / n_head
  int n_ff = 0;
  float rms_eps = 1e-6f;
  RopeType rope_type = RopeType::Normal;
  float rope_base = 10000.0f;
  float rope_freq_scale = 1.0f;  // linear rope scaling: position multiplier (1 / factor)
  bool has_rope_freqs = false;   // llama3-style per-dimension frequency divisors (rope_freqs.weight)
  bool tied_embeddings = false;  // output.weight absent: logits use token_embd
};

// The largest size-like hyperparameter (widths, heads, layers, context, vocabulary) minfer reads:
// buffers are sized from them, and every value must fit an int.
inline constexpr int64_t kMaxHParam = int64_t(1) << 30;

// Every hyperparameter's range, named by its GGUF key: sizes in [1, kMaxHParam], heads that divide
// evenly, an even head dimension (rope pairs), finite floats (rms epsilon in (0, 1), rope base > 1,
// rope scaling factor > 0): a NaN epsilon or a zero base would turn every output into NaN instead
// of an error. Throws minfer::Error starting with `where` (the GGUF file, or convert's config.json).
void validate_hparams(const HParams& hp, const std::string& where);

using Tensor = gguf::TensorInfo;

struct LayerWeights {
  const Tensor* attn_norm = nullptr;
  const Tensor* wq = nullptr;
  const Tensor* wk = nullptr;
  const Tensor* wv = nullptr;
  const Tensor* bq = nullptr;  // qwen2 only
  const Tensor* bk = nullptr;
  const Tensor* bv = nullptr;
  const Tensor* q_norm = nullptr;  // qwen3 only: RMSNorm over each head (head_dim weights)
  const Tensor* k_norm = nullptr;
  const Tensor* wo = nullptr;
  const Tensor* ffn_norm = nullptr;
  const Tensor* w_gate = nullptr;
  const Tensor* w_up = nullptr;
  const Tensor* w_down = nullptr;
};

struct Model {
  gguf::File file;
  HParams hp;
  const Tensor* token_embd = nullptr;
  const Tensor* output_norm = nullptr;
  const Tensor* output = nullptr;      // == token_embd when tied
  const Tensor* rope_freqs = nullptr;  // optional, [head_dim / 2] f32
  std::vector<LayerWeights> layers;

  // Throws minfer::Error naming the file and the missing / mis-shaped tensor or metadata key.
  static Model load(const std::string& path);
  static Model from_file(gguf::File file);
  // Parameter count (elements of all tensors, tied output counted once).
  int64_t n_params() const;
  // Bytes of all weights that one decode step reads (everything but token_embd, unless tied).
  int64_t bytes_read_per_token() const;
};

const char* arch_name(Arch a);

}  // namespace minfer
