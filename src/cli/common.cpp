#include "cli/common.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "convert/synth.h"

namespace minfer::cli {

namespace fs = std::filesystem;

void add_sampler_options(CLI::App& app, SamplerParams& sp) {
  app.add_option("--temp", sp.temperature, "temperature (<= 0: greedy)")->capture_default_str();
  app.add_option("--top-k", sp.top_k, "top-k (<= 0: off)")->capture_default_str();
  app.add_option("--top-p", sp.top_p, "top-p (>= 1: off)")->capture_default_str();
  app.add_option("--min-p", sp.min_p, "min-p (<= 0: off)")->capture_default_str();
  app.add_option("--repeat-penalty", sp.repeat_penalty, "repetition penalty (1: off)")->capture_default_str();
  app.add_option("--presence-penalty", sp.presence_penalty, "presence penalty")->capture_default_str();
  app.add_option("--frequency-penalty", sp.frequency_penalty, "frequency penalty")->capture_default_str();
  app.add_option("--repeat-last-n", sp.penalty_last_n, "history the penalties look at")->capture_default_str();
  app.add_option("--seed", sp.seed, "sampling seed")->capture_default_str();
}

std::vector<int32_t> end_of_generation_tokens(const Model& model, const Tokenizer& tok) {
  std::vector<int32_t> ends;
  for (int32_t t = 0; t < std::min(model.hp.n_vocab, tok.n_vocab()); ++t)
    if (tok.is_end_of_generation(t)) ends.push_back(t);
  return ends;
}

std::string resolve_model_path(const std::string& given) {
  if (!given.empty()) return given;
  const fs::path embedded = fs::path(MINFER_SOURCE_DIR) / "models" / "default.gguf";
  if (fs::exists(embedded)) return embedded.string();
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  const fs::path cache = (xdg && *xdg) ? fs::path(xdg) : fs::path(home ? home : "/tmp") / ".cache";
  const fs::path path = cache / "minfer" / "tiny-f16.gguf";
  if (fs::exists(path)) return path.string();
  std::fprintf(stderr, "minfer: no -m given and no models/default.gguf; synthesizing the tiny "
                       "preset (random weights) into %s\n", path.c_str());
  fs::create_directories(path.parent_path());
  synth::Options opts;
  opts.preset = "tiny";
  opts.ftype = synth::FileType::F16;
  // Written under a unique name and renamed, so an interrupted run never leaves a broken file.
  const fs::path tmp = path.string() + ".tmp" + std::to_string(getpid());
  opts.out_path = tmp.string();
  synth::write_model(opts);
  fs::rename(tmp, path);
  return path.string();
}

}  // namespace minfer::cli
