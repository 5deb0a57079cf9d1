// `minfer convert`: a HF checkpoint directory (config.json, safetensors, tokenizer.json) of
// LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM or Qwen3ForCausalLM to GGUF.
#pragma once
#include <cstdint>
#include <functional>
#include <string>

#include "convert/arch.h"
#include "convert/synth.h"

namespace minfer::convert {

// Reads config.json: architecture, sizes, rope (theta, linear / llama3 scaling), rms eps, head
// dim, context length, tied embeddings. Throws for unsupported architectures and features.
ModelShape read_hf_config(const std::string& dir);

struct ConvertOptions {
  std::string hf_dir, out_path;
  synth::FileType outtype = synth::FileType::F16;
  int n_threads = 0;
  std::function<void(double)> progress;
};

// Returns the output file size.
uint64_t convert_hf(const ConvertOptions& opts);

}  // namespace minfer::convert
