#include "engine/session.h"

#include <algorithm>

#include "util/error.h"

namespace minfer {

static constexpr int kDefaultContextCap = 8192;

static int context_size(const Model& model, const SessionOptions& opts) {
  const int model_ctx = model.hp.n_ctx_train;
  if (opts.n_ctx < 0) fail("context size -c ", opts.n_ctx, " must be positive");
  if (opts.n_ctx > model_ctx)
    fail("context size -c ", opts.n_ctx, " exceeds this model's context length ", model_ctx, "; lower -c");
  return opts.n_ctx > 0 ? opts.n_ctx : std::min(model_ctx, kDefaultContextCap);
}

// SessionOptions::ubatch resolved for a backend, within the context.
static int prompt_step(const SessionOptions& o, bool cuda, int n_ctx) {
  if (o.ubatch < 0) fail("micro-batch size ", o.ubatch, " must be positive (or 0: the backend's default)");
  return std::min(o.ubatch > 0 ? o.ubatch : cuda ? 4096 : 512, n_ctx);
}

static EngineOptions engine_options(const SessionOptions& o, int n_ctx, int ubatch) {
  if (o.max_outputs <= 0) fail("output rows per step ", o.max_outputs, " must be positive");
  if (o.kv_block_size <= 0) fail("KV block size ", o.kv_block_size, " must be positive");
  EngineOptions e;
  e.backend = o.backend;
  e.n_threads = o.n_threads;
  e.max_tokens = ubatch;
  e.max_outputs = std::min(o.max_outputs, e.max_tokens);
  e.block_size = o.kv_block_size;
  e.n_blocks = (n_ctx + o.kv_block_size - 1) / o.kv_block_size;
  e.memory_hint = "lower -c (context size " + std::to_string(n_ctx) + ")";
  return e;
}

Session::Session(const Model& model, SessionOptions opts)
    : model_(model),
      n_ctx_(context_size(model, opts)),
      ubatch_(prompt_step(opts, runs_on_cuda(opts.backend), n_ctx_)),
      all_logits_ubatch_(std::min(opts.max_outputs, ubatch_)),
      engine_(model, engine_options(opts, n_ctx_, ubatch_)),
      seq_(engine_.kv()),
      step_(engine_),
      fed_step_(engine_) {}

Session::Session(const Model& model, SessionOptions opts, std::unique_ptr<Backend> backend)
    : model_(model),
      n_ctx_(context_size(model, opts)),
      ubatch_(prompt_step(opts, backend->name() == "cuda", n_ctx_)),
      all_logits_ubatch_(std::min(opts.max_outputs, ubatch_)),
      engine_(model, engine_options(opts, n_ctx_, ubatch_), std::move(backend)),
      seq_(engine_.kv()),
      step_(engine_),
      fed_step_(engine_) {}

void Session::check_fits(size_t n_new) const {
  if (size_t(n_past()) + n_new > size_t(n_ctx_))
    fail(n_past(), " tokens in context + ", n_new, " new tokens = ", size_t(n_past()) + n_new,
         " exceeds the context size n_ctx=", n_ctx_, "; raise -c (max ", model_.hp.n_ctx_train,
         " for this model)");
}

void Session::run(std::span<const int32_t> tokens, bool decode, Step::Output out, bool logits) {
  if (tokens.empty()) fail("nothing to evaluate: no tokens");
  check_fits(tokens.size());
  logits_.clear();
  const size_t ubatch = size_t(out == Step::Output::All ? all_logits_ubatch_ : ubatch_);
  for (size_t begin = 0; begin < tokens.size(); begin += ubatch) {
    const size_t n = std::min(tokens.size() - begin, ubatch);
    const bool last = begin + n == tokens.size();
    const Step::Output o = out == Step::Output::All ? out : last ? out : Step::Output::None;
    step_.clear();
    // The pool holds n_ctx positions for this one sequence, so a chunk that passed check_fits fits.
    if (step_.add(seq_, tokens.subspan(begin, n), decode, o, logits) < 0)
      fail("internal error: the KV pool has no room for ", n, " tokens at position ", n_past());
    step_.run();
    if (o == Step::Output::None) continue;
    if (logits) {
      const std::span<const float> l = step_.logits(0);
      logits_.insert(logits_.end(), l.begin(), l.end());
    }
    argmax_ = step_.argmax(0).back();
  }
}

std::span<const float> Session::eval(std::span<const int32_t> tokens) {
  run(tokens, false, Step::Output::Last, true);
  return logits_;
}

std::span<const float> Session::eval_all(std::span<const int32_t> tokens) {
  run(tokens, false, Step::Output::All, true);
  return logits_;
}

int32_t Session::eval_greedy(std::span<const int32_t> tokens) {
  run(tokens, false, Step::Output::Last, false);
  return argmax_;
}

std::span<const float> Session::decode(int32_t token) {
  run(std::span<const int32_t>(&token, 1), true, Step::Output::Last, true);
  return logits_;
}

int32_t Session::decode_greedy(int32_t token) {
  run(std::span<const int32_t>(&token, 1), true, Step::Output::Last, false);
  return argmax_;
}

void Session::generate_greedy(int32_t token, const std::function<bool(int32_t)>& take) {
  if (!fed_steps_enabled()) {
    while (take(token)) token = decode_greedy(token);
    return;
  }
  if (!take(token)) return;
  check_fits(1);
  int kept = n_past();  // the context up to the last step collected
  // `token` is also the placeholder of a fed step, which takes the step before's argmax
  const auto fill = [&](Step& step) {
    step.clear();
    if (step.add(seq_, std::span<const int32_t>(&token, 1), true, Step::Output::Last, false) < 0)
      fail("internal error: the KV pool has no room for a token at position ", n_past());
  };
  const auto took = [&](const Step& step) {
    ++kept;
    token = argmax_ = step.argmax(0)[0];
    if (!take(token)) return false;
    if (kept == n_past()) check_fits(1);  // nothing queued: the context is full, and this throws
    return true;
  };
  try {
    run_fed_steps(engine_, step_, fed_step_, fill, [&] { return n_past() < n_ctx_; }, took);
  } catch (...) {
    seq_.truncate(kept);
    throw;
  }
  seq_.truncate(kept);
}

}  // namespace minfer
