// `minfer run`: load a model, evaluate a prompt, stream generated text to stdout.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "cli/command.h"
#include "cli/common.h"
#include "engine/session.h"
#include "sampling/sampler.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int run_run(int argc, char** argv) {
  CLI::App app{"Generate text from a prompt", "minfer run"};
  std::string model_path, prompt, backend = "auto";
  int n_predict = 128, n_ctx = 0, n_threads = 0;
  bool ignore_eos = false, no_display_prompt = false;
  minfer::SamplerParams sp;
  app.add_option("-m,--model", model_path, "GGUF model (default: models/default.gguf or a synthesized tiny model)");
  app.add_option("-p,--prompt", prompt, "prompt text")->required();
  app.add_option("-n,--n-predict", n_predict, "tokens to generate")
      ->capture_default_str()
      ->check(minfer::cli::kNonNegativeInt);
  app.add_option("-c,--ctx-size", n_ctx, "context size (0: model's context length capped at 8192)")->capture_default_str();
  minfer::cli::add_sampler_options(app, sp);
  app.add_option("--backend", backend, "cpu, cuda or auto")->capture_default_str();
  minfer::cli::add_threads_option(app, n_threads);
  app.add_flag("--ignore-eos", ignore_eos, "keep generating past the end-of-generation token");
  app.add_flag("--no-display-prompt", no_display_prompt, "print only the generated text, not the prompt first");
  CLI11_PARSE(app, argc, argv);

  model_path = minfer::cli::resolve_model_path(model_path);
  const minfer::Model model = minfer::Model::load(model_path);
  const minfer::Tokenizer tokenizer = minfer::Tokenizer::from_gguf(model.file);
  const std::vector<int32_t> prompt_tokens = tokenizer.encode(prompt, true, true);
  if (prompt_tokens.empty()) minfer::fail("the prompt encodes to no tokens; give a non-empty -p");

  minfer::SessionOptions so;
  so.n_ctx = n_ctx;
  so.n_threads = n_threads;
  so.backend = minfer::parse_backend_kind(backend);
  minfer::Session session(model, so);
  const size_t needed = prompt_tokens.size() + size_t(n_predict);
  if (needed > size_t(session.n_ctx()))
    minfer::fail("prompt (", prompt_tokens.size(), " tokens) + -n ", n_predict, " = ", needed,
                 " tokens exceeds the context size n_ctx=", session.n_ctx(), "; raise -c (max ",
                 model.hp.n_ctx_train, " for this model) or lower -n");

  minfer::Sampler sampler(sp);
  const bool plain_greedy = minfer::plain_greedy(sp);
  std::vector<int32_t> history = prompt_tokens;
  minfer::StreamDecoder decoder(tokenizer);

  // The next token after the prompt, then after each generated one (for plain greedy decoding the
  // argmax where the logits are, and Session::generate_greedy after the prompt).
  auto after_prompt = [&] {
    if (plain_greedy) return session.eval_greedy(prompt_tokens);
    return sampler.sample(session.eval(prompt_tokens), history);
  };
  auto after_token = [&](int32_t token) { return sampler.sample(session.decode(token), history); };

  if (!no_display_prompt) minfer::cli::print(prompt);
  int n_generated = 0, n_decode_steps = 0;
  double gen_seconds = 0;
  const auto t_prompt = std::chrono::steady_clock::now();
  int32_t token = -1;
  if (n_predict > 0)
    token = after_prompt();
  else
    session.eval(prompt_tokens);
  const double prompt_seconds = seconds_since(t_prompt);
  // Prints a token; true while more are wanted (then the token is decoded).
  const auto take = [&](int32_t t) {
    if (!ignore_eos && tokenizer.is_end_of_generation(t)) return false;
    ++n_generated;
    history.push_back(t);
    minfer::cli::print(decoder.push(t));
    if (n_generated == n_predict) return false;
    ++n_decode_steps;
    return true;
  };
  if (plain_greedy && n_predict > 0) {
    const auto t0 = std::chrono::steady_clock::now();
    session.generate_greedy(token, take);  // each step queued while the host prints the last token
    gen_seconds = seconds_since(t0);
  } else {
    while (n_generated < n_predict && take(token)) {
      const auto t0 = std::chrono::steady_clock::now();
      token = after_token(history.back());
      gen_seconds += seconds_since(t0);
    }
  }
  minfer::cli::print(decoder.flush() + "\n");

  std::fprintf(stderr, "prompt: %zu tokens, %.2f t/s | generation: %d tokens, %.2f t/s (%s)\n",
               prompt_tokens.size(), double(prompt_tokens.size()) / std::max(prompt_seconds, 1e-9),
               n_generated, n_decode_steps > 0 ? double(n_decode_steps) / gen_seconds : 0.0,
               session.backend_name().c_str());
  return 0;
}

const minfer::cli::Register registration("run", "generate text from a prompt", run_run);

}  // namespace
