// `minfer quantize IN OUT TYPE`: f32/f16/bf16 model -> q8_0/q4_k_m/q5_k_m/q6_k/f16/bf16.
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <string>

#include "cli/command.h"
#include "cli/common.h"
#include "convert/quantize.h"
#include "util/progress.h"

namespace {

int run_quantize(int argc, char** argv) {
  CLI::App app{"Quantize an f32/f16/bf16 GGUF model with llama.cpp's per-tensor mix", "minfer quantize"};
  minfer::convert::QuantizeOptions opts;
  std::string type;
  app.add_option("IN", opts.in_path, "input .gguf (f32/f16/bf16)")->required();
  app.add_option("OUT", opts.out_path, "output .gguf")->required();
  app.add_option("TYPE", type, "q8_0, q4_k_m, q5_k_m, q6_k, f16, bf16")->required();
  minfer::cli::add_threads_option(app, opts.n_threads);
  CLI11_PARSE(app, argc, argv);
  opts.ftype = minfer::synth::parse_file_type(type);
  opts.progress = minfer::stderr_progress_bar("quantize " + type);
  const auto t0 = std::chrono::steady_clock::now();
  const uint64_t size = minfer::convert::quantize_file(opts);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::fprintf(stderr, "wrote %s: %llu bytes in %.1f s\n", opts.out_path.c_str(), (unsigned long long)size, s);
  return 0;
}

const minfer::cli::Register registration("quantize", "quantize an f32/f16/bf16 model (llama.cpp's mix)",
                                         run_quantize);

}  // namespace
