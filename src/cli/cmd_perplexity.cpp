// minfer perplexity -m FILE -f TEXT [-c 512] [-b N]
#include <CLI/CLI.hpp>
#include <cstdio>

#include "cli/command.h"
#include "cli/common.h"
#include "engine/perplexity.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"
#include "util/files.h"
#include "util/progress.h"

namespace minfer::cli {
namespace {

int run_perplexity(int argc, char** argv) {
  CLI::App app{"Perplexity of a model on a text file (non-overlapping windows, second half scored)"};
  std::string model_path, text_path, backend = "auto";
  int n_ctx = 512, batch = 512, threads = 0;
  app.add_option("-m,--model", model_path, "GGUF model (default: the embedded default model)");
  app.add_option("-f,--file", text_path, "text file to score")->required();
  app.add_option("-c,--ctx-size", n_ctx, "window size in tokens")->check(CLI::Range(4, 1 << 20));
  app.add_option("-b,--batch-size", batch, "tokens per forward call")->check(CLI::Range(1, 1 << 16));
  add_threads_option(app, threads);
  app.add_option("--backend", backend, "cpu | cuda | auto");
  CLI11_PARSE(app, argc, argv);

  const std::string text = read_file(text_path);

  const Model model = Model::load(resolve_model_path(model_path));
  const Tokenizer tok = Tokenizer::from_gguf(model.file);
  const std::vector<int32_t> tokens = tok.encode(text, /*add_special=*/false, false);
  SessionOptions opts;
  opts.n_ctx = n_ctx;
  opts.ubatch = batch;
  opts.max_outputs = batch;  // every row's logits
  opts.n_threads = threads;
  opts.backend = parse_backend_kind(backend);
  Session session(model, opts);
  std::fprintf(stderr, "perplexity: %zu tokens, %zu windows of %d, backend %s\n", tokens.size(),
               tokens.size() / size_t(n_ctx), n_ctx, session.backend_name().c_str());
  const auto bar = stderr_progress_bar("perplexity");
  const PerplexityResult r =
      perplexity(session, tokens, n_ctx, tok.add_bos() ? tok.bos() : -1,
                 [&](int done, int total) { bar(double(done) / total); });
  std::printf("PPL = %.4f +/- %.4f  (%lld tokens scored in %d windows of %d; mean NLL %.5f)\n",
              r.ppl, r.ppl_err, (long long)r.n_scored, r.n_windows, n_ctx, r.mean_nll);
  return 0;
}

const Register reg("perplexity", "perplexity of a model on a text file", run_perplexity);

}  // namespace
}  // namespace minfer::cli
