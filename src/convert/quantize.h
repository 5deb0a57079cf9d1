// `minfer quantize`: an f32/f16/bf16 GGUF to a lower-precision file type with llama.cpp's
// per-tensor mix (synth::tensor_type_for), metadata kept and general.file_type set.
#pragma once
#include <cstdint>
#include <functional>
#include <string>

#include "convert/synth.h"

namespace minfer::convert {

struct QuantizeOptions {
  std::string in_path, out_path;
  synth::FileType ftype = synth::FileType::Q4_K_M;
  int n_threads = 0;
  std::function<void(double)> progress;
};

// Returns the output file size. Throws for an already-quantized input tensor.
uint64_t quantize_file(const QuantizeOptions& opts);

}  // namespace minfer::convert
