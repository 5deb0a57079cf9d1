// `minfer synth`: a random-weight model with a published shape and llama.cpp's quant mix.
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <string>

#include "cli/command.h"
#include "cli/common.h"
#include "convert/synth.h"
#include "util/progress.h"

namespace {

int run_synth(int argc, char** argv) {
  namespace synth = minfer::synth;
  CLI::App app{"Write a random-weight GGUF model with a published shape and llama.cpp's quant mix",
               "minfer synth"};
  std::string preset_names;
  for (const auto& p : synth::presets()) preset_names += (preset_names.empty() ? "" : ", ") + p.name;
  synth::Options opts;
  std::string ftype = "f16";
  app.add_option("--preset", opts.preset, "model shape: " + preset_names)->capture_default_str();
  app.add_option("--ftype", ftype, "f32, f16, bf16, q8_0, q4_k_m, q5_k_m, q6_k")->capture_default_str();
  app.add_option("--tokenizer", opts.tokenizer,
                 "HF tokenizer dir, vocab .gguf or \"builtin\" (default: Qwen3's for qwen presets, Llama-3's for "
                 "llama, from tools/npm; built-in for tiny)");
  minfer::cli::add_seed_option(app, opts.seed, "random seed");
  minfer::cli::add_threads_option(app, opts.n_threads);
  app.add_flag("--dry-run", opts.dry_run, "print the tensor table and sizes, write nothing");
  app.add_option("-o,--output", opts.out_path, "output .gguf");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  opts.ftype = synth::parse_file_type(ftype);
  if (!opts.dry_run && opts.out_path.empty()) {
    std::fprintf(stderr, "minfer synth: -o FILE is required (or --dry-run)\n");
    return 1;
  }
  if (opts.tokenizer.empty() && opts.preset != "tiny") setenv("MINFER_SOURCE_DIR", MINFER_SOURCE_DIR, 0);
  if (!opts.dry_run) opts.progress = minfer::stderr_progress_bar("synth " + opts.preset);
  const auto t0 = std::chrono::steady_clock::now();
  const uint64_t size = synth::write_model(opts);
  if (!opts.dry_run) {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::fprintf(stderr, "wrote %s: %llu bytes in %.1f s\n", opts.out_path.c_str(), (unsigned long long)size, s);
  }
  return 0;
}

const minfer::cli::Register registration("synth", "write a random-weight model of a published shape",
                                         run_synth);

}  // namespace
