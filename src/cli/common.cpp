#include "cli/common.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <thread>

#include "convert/synth.h"
#include "util/error.h"

namespace minfer::cli {

namespace fs = std::filesystem;

namespace {

// Sampling parameters by their flags: "top_p" -> "--top-p", "temperature" -> "--temp".
std::string sampler_flag(std::string_view name) {
  if (name == "temperature") return "--temp";
  std::string flag = "--" + std::string(name);
  std::replace(flag.begin(), flag.end(), '_', '-');
  return flag;
}

}  // namespace

void add_sampler_options(CLI::App& app, SamplerParams& sp) {
  app.add_option("--temp", sp.temperature, "temperature, 0..2 (0: greedy)")->capture_default_str();
  app.add_option("--top-k", sp.top_k, "top-k (0: off)")->capture_default_str();
  app.add_option("--top-p", sp.top_p, "top-p, in (0, 1] (1: off)")->capture_default_str();
  app.add_option("--min-p", sp.min_p, "min-p, 0..1 (0: off)")->capture_default_str();
  app.add_option("--repeat-penalty", sp.repeat_penalty, "repetition penalty, > 0 (1: off)")->capture_default_str();
  app.add_option("--presence-penalty", sp.presence_penalty, "presence penalty, -2..2")->capture_default_str();
  app.add_option("--frequency-penalty", sp.frequency_penalty, "frequency penalty, -2..2")->capture_default_str();
  app.add_option("--repeat-last-n", sp.penalty_last_n, "history the penalties look at (-1: all)")
      ->capture_default_str();
  add_seed_option(app, sp.seed, "sampling seed");
  app.callback([&sp] { sp.validate(sampler_flag); });
}

void add_seed_option(CLI::App& app, uint64_t& seed, const std::string& help) {
  app.add_option_function<std::string>(
         "--seed", [&seed](const std::string& text) { seed = parse_seed(text, sampler_flag); },
         help + ", 0..2^64-1")
      ->default_str(std::to_string(seed));
}

void add_threads_option(CLI::App& app, int& n_threads) {
  const int max_threads = int(std::max(1u, std::thread::hardware_concurrency()));
  app.add_option("-t,--threads", n_threads, "threads (0: all " + std::to_string(max_threads) + " cores)")
      ->check(CLI::Range(0, max_threads))
      ->capture_default_str();
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
  opts.out_path = path.string();  // written beside it and renamed: never seen half-written
  synth::write_model(opts);
  return path.string();
}

void print(std::string_view text) {
  if (std::fwrite(text.data(), 1, text.size(), stdout) != text.size() || std::fflush(stdout) != 0)
    fail("writing to standard output failed: ", std::strerror(errno));
}

std::optional<std::string> read_stdin_line(size_t max_bytes) {
  std::string line;
  for (int c = std::getc(stdin); c != EOF; c = std::getc(stdin)) {
    if (c == '\n') return line;
    if (line.size() == max_bytes)
      fail("an input line is longer than ", max_bytes, " bytes, the most minfer takes as one message");
    line.push_back(char(c));
  }
  if (std::ferror(stdin)) fail("reading standard input failed: ", std::strerror(errno));
  if (line.empty()) return std::nullopt;
  return line;  // the last line had no newline
}

}  // namespace minfer::cli
