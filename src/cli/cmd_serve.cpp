// `minfer serve`: an OpenAI-compatible HTTP server (src/server/) over the engine's continuous
// batching. The socket is bound first, so /health answers 503 while the model loads; SIGINT or
// SIGTERM stops it.
#include <CLI/CLI.hpp>

#include <pthread.h>
#include <signal.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <thread>

#include "cli/command.h"
#include "cli/common.h"
#include "engine/scheduler.h"
#include "server/http_server.h"
#include "util/error.h"

namespace minfer::cli {
namespace {

// Positions per sequence when -c is not given: the model's context, capped.
constexpr int kDefaultContextCap = 4096;
// Most choices (n) one request may ask for.
constexpr int kMaxChoices = 16;

int run_serve(int argc, char** argv) {
  CLI::App app{"OpenAI-compatible HTTP server with continuous batching", "minfer serve"};
  std::string model_path, backend = "auto";
  server::HttpOptions http_opts;
  const char* env_key = std::getenv("MINFER_API_KEY");
  if (env_key) http_opts.api_key = env_key;
  int n_ctx = 0, max_seqs = 64, kv_blocks = 0, n_threads = 0, step_tokens = 2048, max_queue = 256;
  double kv_mem_gib = 0;
  app.add_option("-m,--model", model_path, "GGUF model (default: the embedded default model)");
  app.add_option("--host", http_opts.host, "address to listen on")->capture_default_str();
  app.add_option("--port", http_opts.port, "port (0: any free port)")->capture_default_str()->check(CLI::Range(0, 65535));
  app.add_option("--api-key", http_opts.api_key, "require Authorization: Bearer KEY on /v1 routes (default: $MINFER_API_KEY)");
  app.add_option("--backend", backend, "cpu, cuda or auto")->capture_default_str();
  app.add_option("-c,--ctx-size", n_ctx, "positions per sequence, prompt + completion (0: the model's, at most 4096)")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("--max-seqs", max_seqs, "sequences generating at once")->capture_default_str()->check(CLI::Range(1, 4096));
  auto* blocks_opt = app.add_option("--kv-blocks", kv_blocks, "KV blocks in the pool (default: --max-seqs full contexts)")
                         ->check(CLI::PositiveNumber);
  app.add_option("--kv-mem", kv_mem_gib, "memory for the KV pool in GiB, instead of --kv-blocks")
      ->check(CLI::PositiveNumber)->excludes(blocks_opt);
  app.add_option("-b,--batch-size", step_tokens, "tokens per forward step (prompt chunks share it with decode tokens)")
      ->capture_default_str()->check(CLI::Range(1, 65536));
  app.add_option("--max-queue", max_queue, "sequences that may wait beyond --max-seqs; more get 429")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("--timeout", http_opts.request_timeout_s, "seconds a request may take; then it ends with finish_reason length")
      ->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("-t,--threads", n_threads, "CPU threads (0: all cores)")->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  // Signals are taken by sigwait below, never by a handler in some other thread.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  // Declared before the HTTP server so that they outlive every HTTP thread.
  std::unique_ptr<Model> model;
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<ChatPrompt> chat;
  std::unique_ptr<Engine> engine;
  std::unique_ptr<server::Worker> worker;
  std::unique_ptr<server::ServingModel> serving;

  server::ServerMetrics metrics;
  http_opts.threads = max_seqs + max_queue + 16;  // every admitted request holds a connection; some to spare
  server::HttpServer http(http_opts, metrics);
  const int port = http.bind();
  std::thread listener([&] { http.serve(); });
  struct StopOnExit {
    server::HttpServer& http;
    std::thread& listener;
    ~StopOnExit() {
      http.stop();
      listener.join();
    }
  } stop_on_exit{http, listener};
  std::fprintf(stderr, "minfer serve: listening on http://%s:%d (loading the model)\n", http_opts.host.c_str(), port);

  const std::string path = resolve_model_path(model_path);
  model = std::make_unique<Model>(Model::load(path));
  tokenizer = std::make_unique<Tokenizer>(Tokenizer::from_gguf(model->file));
  chat = std::make_unique<ChatPrompt>(*tokenizer, false);
  if (!chat->fallback_reason().empty())
    std::fprintf(stderr, "minfer serve: warning: %s; chat prompts use ChatML\n", chat->fallback_reason().c_str());
  const int ctx_train = model->hp.n_ctx_train > 0 ? model->hp.n_ctx_train : kDefaultContextCap;
  if (n_ctx > ctx_train) fail("-c ", n_ctx, " exceeds this model's context length ", ctx_train);
  if (n_ctx == 0) n_ctx = std::min(ctx_train, kDefaultContextCap);

  std::unique_ptr<Backend> backend_impl = make_backend(*model, parse_backend_kind(backend), n_threads);
  EngineOptions eo;
  eo.max_tokens = std::max(step_tokens, max_seqs);
  const int64_t block_bytes = backend_impl->kv_block_bytes(eo.block_size);
  const int blocks_per_seq = (n_ctx + eo.block_size - 1) / eo.block_size;
  eo.n_blocks = kv_blocks > 0      ? kv_blocks
                : kv_mem_gib > 0 ? int(std::min<double>(std::floor(kv_mem_gib * double(1 << 30) / double(block_bytes)), 1 << 30))
                                 : max_seqs * blocks_per_seq;
  if (eo.n_blocks < blocks_per_seq)
    fail("the KV pool (", eo.n_blocks, " blocks of ", eo.block_size, " positions) cannot hold one context of ", n_ctx,
         " positions; raise --kv-blocks or --kv-mem, or lower -c");
  eo.memory_hint = "lower --max-seqs, -c or --kv-mem";
  engine = std::make_unique<Engine>(*model, eo, std::move(backend_impl));

  SchedulerOptions so;
  so.max_seqs = max_seqs;
  so.step_tokens = step_tokens;
  so.end_tokens = end_of_generation_tokens(*model, *tokenizer);
  worker = std::make_unique<server::Worker>(*engine, so, max_queue);
  serving = std::make_unique<server::ServingModel>(server::ServingModel{
      std::filesystem::path(path).filename().string(), *tokenizer, *chat, *worker,
      server::ServingLimits{n_ctx, std::min(max_seqs, kMaxChoices)}});
  http.set_model(serving.get());
  std::fprintf(stderr,
               "minfer serve: ready: %s on %s, %d positions per sequence, %d sequences at once, %d KV blocks of %d "
               "(%.1f MiB)%s\n",
               serving->id.c_str(), engine->backend_name().c_str(), n_ctx, max_seqs, eo.n_blocks, eo.block_size,
               double(eo.n_blocks) * double(block_bytes) / double(1 << 20), http_opts.api_key.empty() ? "" : ", API key required");

  int signal_number = 0;
  sigwait(&stop_signals, &signal_number);
  std::fprintf(stderr, "minfer serve: stopping (signal %d)\n", signal_number);
  return 0;
}

const Register registration("serve", "OpenAI-compatible HTTP server (continuous batching, prefix cache, chat page)", run_serve);

}  // namespace
}  // namespace minfer::cli
