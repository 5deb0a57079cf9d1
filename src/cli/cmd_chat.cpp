// `minfer chat`: an interactive conversation. Each turn renders the whole history with the
// model's chat template, keeps the KV cache for the tokens shared with the previous turn and
// evaluates only the rest. Ctrl-C stops the reply being generated; at the prompt it exits.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <optional>
#include <string>
#include <unistd.h>

#include "cli/command.h"
#include "cli/common.h"
#include "engine/session.h"
#include "sampling/sampler.h"
#include "tokenizer/chat_prompt.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"

namespace {

std::atomic<bool> g_generating{false};
std::atomic<bool> g_stop{false};

void on_sigint(int) {
  if (g_generating) {
    g_stop = true;
    return;
  }
  const char nl = '\n';
  (void)!write(STDOUT_FILENO, &nl, 1);
  _exit(130);
}

int run_chat(int argc, char** argv) {
  CLI::App app{"Interactive chat with the model's chat template", "minfer chat"};
  std::string model_path, system_prompt, backend = "auto";
  int n_ctx = 0, n_threads = 0, max_reply = 0;
  bool force_chatml = false;
  minfer::SamplerParams sp;
  app.add_option("-m,--model", model_path, "GGUF model (default: the embedded default model)");
  app.add_option("-c,--ctx-size", n_ctx, "context size (0: model's context length capped at 8192)")->capture_default_str();
  app.add_option("--system", system_prompt, "system message that starts the conversation");
  app.add_option("-n,--n-predict", max_reply, "most tokens per reply (0: until the end token or a full context)")
      ->capture_default_str()
      ->check(minfer::cli::kNonNegativeInt);
  minfer::cli::add_sampler_options(app, sp);
  app.add_option("--backend", backend, "cpu, cuda or auto")->capture_default_str();
  minfer::cli::add_threads_option(app, n_threads);
  app.add_flag("--chatml", force_chatml, "ignore the model's template and use ChatML");
  CLI11_PARSE(app, argc, argv);

  const minfer::Model model = minfer::Model::load(minfer::cli::resolve_model_path(model_path));
  const minfer::Tokenizer tok = minfer::Tokenizer::from_gguf(model.file);
  const minfer::ChatPrompt chat_prompt(tok, force_chatml);
  if (!chat_prompt.fallback_reason().empty())
    std::fprintf(stderr, "minfer chat: warning: %s; using ChatML\n", chat_prompt.fallback_reason().c_str());

  minfer::SessionOptions so;
  so.n_ctx = n_ctx;
  so.n_threads = n_threads;
  so.backend = minfer::parse_backend_kind(backend);
  minfer::Session session(model, so);
  minfer::Sampler sampler(sp);

  struct sigaction sa {};
  sa.sa_handler = on_sigint;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);

  std::vector<minfer::ChatMessage> history;
  if (!system_prompt.empty()) history.push_back({"system", system_prompt});
  std::vector<int32_t> cached;  // the tokens whose keys/values the session holds, in order

  std::fprintf(stderr, "minfer chat: %s, context %d tokens, %s template. Ctrl-C stops a reply; "
                       "Ctrl-C at the prompt or EOF exits; /reset clears the history.\n",
               session.backend_name().c_str(), session.n_ctx(), chat_prompt.uses_model_template() ? "model's" : "ChatML");
  while (true) {
    minfer::cli::print("> ");
    const std::optional<std::string> input = minfer::cli::read_stdin_line();
    if (!input) break;
    const std::string& line = *input;
    if (line.empty()) continue;
    if (line == "/reset") {
      history.resize(system_prompt.empty() ? 0 : 1);
      continue;
    }
    history.push_back({"user", line});
    std::vector<int32_t> prompt;
    try {
      prompt = chat_prompt.tokens(history, true);
    } catch (const minfer::Error& e) {
      std::fprintf(stderr, "minfer chat: %s\n", e.what());
      history.pop_back();
      continue;
    }
    if (static_cast<int>(prompt.size()) >= session.n_ctx()) {
      std::fprintf(stderr, "minfer chat: the conversation (%zu tokens) fills the context of %d tokens; "
                           "/reset or raise -c\n", prompt.size(), session.n_ctx());
      history.pop_back();
      continue;
    }

    // Reuse the cache for the shared prefix; at least one token is evaluated to get logits.
    size_t keep = std::mismatch(prompt.begin(), prompt.end(), cached.begin(), cached.end()).first - prompt.begin();
    keep = std::min({keep, prompt.size() - 1, static_cast<size_t>(session.n_past())});
    session.truncate(static_cast<int>(keep));
    cached.assign(prompt.begin(), prompt.begin() + static_cast<std::ptrdiff_t>(keep));
    std::span<const int32_t> pending(prompt.data() + keep, prompt.size() - keep);

    std::vector<int32_t> sampled_history = prompt;
    minfer::StreamDecoder decoder(tok);
    std::string reply;
    g_stop = false;
    g_generating = true;
    int n_reply = 0;
    bool in_prompt = true;
    while (!g_stop) {
      // The rendered prompt runs on the prompt kernels, each sampled token on the decode kernels.
      std::span<const float> logits = in_prompt ? session.eval(pending) : session.decode(pending[0]);
      in_prompt = false;
      cached.insert(cached.end(), pending.begin(), pending.end());
      const int32_t next = sampler.sample(logits, sampled_history);
      if (tok.is_end_of_generation(next)) break;
      sampled_history.push_back(next);
      std::string piece = decoder.push(next);
      reply += piece;
      minfer::cli::print(piece);
      if ((max_reply > 0 && ++n_reply >= max_reply) || session.n_past() + 1 >= session.n_ctx()) break;
      pending = std::span<const int32_t>(&sampled_history.back(), 1);
    }
    g_generating = false;
    std::string rest = decoder.flush();
    reply += rest;
    minfer::cli::print(rest + (g_stop ? " [interrupted]\n" : "\n"));
    history.push_back({"assistant", reply});
  }
  minfer::cli::print("\n");
  return 0;
}

const minfer::cli::Register registration("chat", "interactive chat using the model's chat template", run_chat);

}  // namespace
