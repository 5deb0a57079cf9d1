// `minfer batch`: offline generation for a file of prompts, many sequences at a time.
// One prompt per non-empty input line; one JSON object per prompt on the output (JSON Lines, in
// input order): index, prompt, text, tokens (the generated ids), finish_reason. Each prompt samples
// with seed + index, so its text does not depend on --parallel or on the other prompts.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <string>

#include "cli/command.h"
#include "cli/common.h"
#include "engine/scheduler.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"
#include "util/progress.h"

namespace minfer::cli {
namespace {

struct Result {
  std::vector<int32_t> tokens;
  FinishReason reason = FinishReason::Stop;
  bool done = false;
};

std::vector<std::string> read_prompts(const std::string& path) {
  std::ifstream in(path);
  if (!in) fail("cannot read prompts from ", path);
  std::vector<std::string> prompts;
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (!line.empty()) prompts.push_back(line);
  }
  if (in.bad()) fail("error reading ", path);
  if (prompts.empty()) fail(path, " has no prompts (one per non-empty line)");
  return prompts;
}

int run_batch(int argc, char** argv) {
  CLI::App app{"Generate a completion for every line of a file, many at a time", "minfer batch"};
  std::string model_path, prompts_path, out_path, backend = "auto";
  int n_predict = 128, parallel = 8, n_ctx = 0, n_threads = 0, ubatch = 512;
  bool ignore_eos = false;
  SamplerParams sp;
  app.add_option("-m,--model", model_path, "GGUF model (default: the embedded default model)");
  app.add_option("-f,--file", prompts_path, "prompts, one per line")->required();
  app.add_option("-o,--output", out_path, "JSON Lines output (default: stdout)");
  app.add_option("-n,--n-predict", n_predict, "tokens to generate per prompt")->capture_default_str()->check(CLI::Range(1, 1 << 20));
  app.add_option("--parallel", parallel, "sequences generating at once")->capture_default_str()->check(CLI::Range(1, 4096));
  app.add_option("-c,--ctx-size", n_ctx, "context per sequence (0: longest prompt + -n)")->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("-b,--batch-size", ubatch, "tokens per forward step")->capture_default_str()->check(CLI::Range(1, 65536));
  minfer::cli::add_sampler_options(app, sp);
  app.add_option("--backend", backend, "cpu, cuda or auto")->capture_default_str();
  app.add_option("-t,--threads", n_threads, "CPU threads (0: all cores)")->capture_default_str();
  app.add_flag("--ignore-eos", ignore_eos, "keep generating past the end-of-generation token");
  CLI11_PARSE(app, argc, argv);

  const std::vector<std::string> prompts = read_prompts(prompts_path);
  const Model model = Model::load(resolve_model_path(model_path));
  const Tokenizer tokenizer = Tokenizer::from_gguf(model.file);
  std::vector<std::vector<int32_t>> encoded;
  size_t longest = 0;
  for (const std::string& p : prompts) {
    encoded.push_back(tokenizer.encode(p, true, true));
    longest = std::max(longest, encoded.back().size());
  }
  const int64_t per_seq = n_ctx > 0 ? n_ctx : int64_t(longest) + n_predict;
  if (per_seq > model.hp.n_ctx_train)
    fail("a sequence of ", per_seq, " positions (", n_ctx > 0 ? "-c" : "longest prompt + -n",
         ") exceeds this model's context length ", model.hp.n_ctx_train);
  for (size_t i = 0; i < encoded.size(); ++i)
    if (int64_t(encoded[i].size()) >= per_seq)
      fail("prompt ", i, " has ", encoded[i].size(), " tokens, which leaves no room in a context of ", per_seq,
           "; raise -c");

  EngineOptions eo;
  eo.backend = parse_backend_kind(backend);
  eo.n_threads = n_threads;
  eo.max_tokens = std::max(ubatch, parallel);
  eo.n_blocks = parallel * int((per_seq + eo.block_size - 1) / eo.block_size);
  eo.memory_hint = "lower --parallel or -c";
  Engine engine(model, eo);
  SchedulerOptions so;
  so.max_seqs = parallel;
  so.end_tokens = end_of_generation_tokens(model, tokenizer);
  Scheduler scheduler(engine, so);

  std::vector<Result> results(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    Request r;
    r.prompt = encoded[i];
    r.max_tokens = std::min<int64_t>(n_predict, per_seq - int64_t(encoded[i].size()));
    r.sampling = sp;
    r.sampling.seed = sp.seed + i;
    r.ignore_eos = ignore_eos;
    Result& res = results[i];
    r.on_token = [&res](int, int32_t token, std::span<const float>) {
      res.tokens.push_back(token);
      return true;
    };
    r.on_finish = [&res](int, FinishReason reason) {
      res.reason = reason;
      res.done = true;
    };
    scheduler.submit(std::move(r));
  }

  std::FILE* out = out_path.empty() ? stdout : std::fopen(out_path.c_str(), "w");
  if (!out) fail("cannot write ", out_path);
  const auto bar = stderr_progress_bar(str_cat("generating for ", prompts.size(), " prompts, ", parallel, " at a time"));
  const auto t0 = std::chrono::steady_clock::now();
  size_t written = 0;
  while (scheduler.has_work()) {
    scheduler.step();
    // Results go out in input order, each as soon as it and all before it are done.
    for (; written < results.size() && results[written].done; ++written) {
      const Result& res = results[written];
      nlohmann::json j;
      j["index"] = written;
      j["prompt"] = prompts[written];
      j["text"] = tokenizer.decode(res.tokens);
      j["tokens"] = res.tokens;
      j["finish_reason"] = finish_reason_name(res.reason);
      const std::string line = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
      if (std::fwrite(line.data(), 1, line.size(), out) != line.size()) fail("error writing ", out_path.empty() ? "stdout" : out_path);
      bar(double(written + 1) / double(results.size()));
    }
  }
  if (std::fflush(out) != 0 || (out != stdout && std::fclose(out) != 0))
    fail("error writing ", out_path.empty() ? "stdout" : out_path);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const SchedulerCounts c = scheduler.counts();
  std::fprintf(stderr, "batch: %zu prompts, %lld prompt + %lld generated tokens in %.2f s: %.1f generated t/s "
                       "(%lld steps, %lld preemptions, %s)\n",
               prompts.size(), (long long)c.prompt_tokens, (long long)c.generated_tokens, seconds,
               double(c.generated_tokens) / std::max(seconds, 1e-9), (long long)c.steps(), (long long)c.preemptions,
               engine.backend_name().c_str());
  return 0;
}

const Register registration("batch", "generate for a file of prompts, many at a time (JSON Lines out)", run_batch);

}  // namespace
}  // namespace minfer::cli
