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
};
const std::vector<Preset>& presets();
const Preset& find_preset(const std::string& name);  // throws, listing the known names

enum class FileType { F32, F16, BF16, Q8_0, Q4_K_M, Q5_K_M, Q6_K };
FileType parse_file_type(const std::string& s);  // "f16", "q4_k_m", ... (throws on unknown)
const char* file_type_name(FileType t);
int file_type_gguf_id(FileType t);  // general.file_type: F32 0, F16 1, BF16 32, Q8_0 7, ...
// The tensor type llama.cpp's quantize picks for this tensor (reference mix).
GgmlType tensor_type_for(FileType ft, const std::string& tensor_name, int64_t row_len,
                         int n_layer);

struct Options {
  std::string preset = "tiny";
  FileType ftype = FileType::F16;
  uint64_t seed = 1;
  std::string tokenizer;  // "" = default for the preset; else a HF dir or a vocab .gguf
  std::string out_path;
  int n_threads = 0;
  bool dry_run = false;   // print the tensor table and totals, write nothing
  std::function<void(double)> progress;  // fraction done, for a progress bar
};

// Writes the model (streaming tensors to disk); returns the file size in bytes.
uint64_t write_model(const Options& opts);

}  // namespace minfer::synth
