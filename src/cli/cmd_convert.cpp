// `minfer convert HF_DIR -o out.gguf`: HF safetensors checkpoint -> GGUF.
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <string>

#include "cli/command.h"
#include "cli/common.h"
#include "convert/convert.h"
#include "util/progress.h"

namespace {

int run_convert(int argc, char** argv) {
  CLI::App app{"Convert a HF checkpoint (Llama, Mistral, Qwen2, Qwen3; safetensors) to GGUF",
               "minfer convert"};
  minfer::convert::ConvertOptions opts;
  std::string outtype = "f16";
  app.add_option("HF_DIR", opts.hf_dir, "directory with config.json, *.safetensors, tokenizer.json")->required();
  app.add_option("-o,--output", opts.out_path, "output .gguf")->required();
  app.add_option("--outtype", outtype, "f32, f16, bf16, q8_0 (or q4_k_m, q5_k_m, q6_k)")->capture_default_str();
  minfer::cli::add_threads_option(app, opts.n_threads);
  CLI11_PARSE(app, argc, argv);
  opts.outtype = minfer::synth::parse_file_type(outtype);
  opts.progress = minfer::stderr_progress_bar("convert");
  const auto t0 = std::chrono::steady_clock::now();
  const uint64_t size = minfer::convert::convert_hf(opts);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::fprintf(stderr, "wrote %s: %llu bytes in %.1f s\n", opts.out_path.c_str(), (unsigned long long)size, s);
  return 0;
}

const minfer::cli::Register registration("convert", "convert a HF checkpoint (safetensors) to GGUF", run_convert);

}  // namespace
