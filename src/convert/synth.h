// `minfer synth`: random-weight models with published shapes and llama.cpp's quant mixes, so that
// tests and benchmarks run on files exactly like the ones users have.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "model/model.h"

namespace minfer::synth {

struct Preset {
  std::string name;  // "tiny", "qwen2.5-0.5b", ..., "llama-3.1-8b", "qwen3-8b"
  Arch arch;
  int n_embd, n_layer, n_head, n_head_kv, n_ff, n_vocab, head_dim;
  float rope_base, rms_eps;
  bool tied;
  int n_ctx_train;
  bool llama3_rope = false;  // llama-3.1: rope_freqs.weight from llama3 scaling (factor 8)
};
const std::vector<Preset>& presets();
const Preset& find_preset(const std::string& name);  // throws, listing the known names

enum class FileType { F32, F16, BF16, Q8_0, Q4_K_M, Q5_K_M, Q6_K };
FileType parse_file_type(const std::string& s);  // "f16", "q4_k_m", ... (throws on unknown)
const char* file_type_name(FileType t);
int file_type_gguf_id(FileType t);  // general.file_type: F32 0, F16 1, BF16 32, Q8_0 7, ...
// The tensor type llama.cpp's quantize picks for this tensor (reference mix). 1-D tensors (norms,
// biases, rope_freqs) are f32. Without an output.weight (tied embeddings) token_embd takes the
// output's type, as llama.cpp does. Rows that do not fit a K-quant fall back to q5_0/q5_1/q8_0.
GgmlType tensor_type_for(FileType ft, const std::string& tensor_name, int64_t row_len,
                         int n_layer, bool has_output_tensor = true);

struct Options {
  std::string preset = "tiny";
  FileType ftype = FileType::F16;
  uint64_t seed = 1;
  std::string tokenizer;  // "" = default for the preset; "builtin"; else a HF dir or a vocab .gguf
  std::string out_path;
  int n_threads = 0;
  bool dry_run = false;   // print the tensor table and totals, write nothing
  std::function<void(double)> progress;  // fraction done, for a progress bar
};

// Writes the model (streaming tensors to disk); returns the file size in bytes. With dry_run,
// prints the tensor table and totals to stdout instead and returns the size the file would have.
uint64_t write_model(const Options& opts);

// The tensor table of a preset under a file type (no tokenizer needed).
struct PlannedTensor {
  std::string name;
  GgmlType type;
  std::vector<int64_t> shape;
  uint64_t nbytes;  // unpadded
};
std::vector<PlannedTensor> plan_tensors(const Preset& preset, FileType ftype);
// Sum of the tensor data section (each tensor padded to the 32-byte alignment).
uint64_t planned_tensor_bytes(const std::vector<PlannedTensor>& tensors);

}  // namespace minfer::synth
