#include "engine/session.h"

#include <algorithm>

#include "util/error.h"

namespace minfer {

BackendKind parse_backend_kind(const std::string& s) {
  if (s == "cpu") return BackendKind::Cpu;
  if (s == "cuda") return BackendKind::Cuda;
  if (s == "auto") return BackendKind::Auto;
  fail("unknown backend '", s, "' (expected cpu, cuda or auto)");
}

static constexpr int kDefaultContextCap = 8192;

Session::Session(const Model& model, SessionOptions opts) : model_(model), graph_(build_graph(model)) {
  const int model_ctx = model.hp.n_ctx_train;
  if (opts.n_ctx < 0) fail("context size -c ", opts.n_ctx, " must be positive");
  if (opts.n_ctx > model_ctx)
    fail("context size -c ", opts.n_ctx, " exceeds this model's context length ", model_ctx,
         "; lower -c");
  n_ctx_ = opts.n_ctx > 0 ? opts.n_ctx : std::min(model_ctx, kDefaultContextCap);
  if (opts.ubatch <= 0) fail("micro-batch size ", opts.ubatch, " must be positive");
  ubatch_ = std::min(opts.ubatch, n_ctx_);

  const bool use_cuda = opts.backend == BackendKind::Cuda ||
                        (opts.backend == BackendKind::Auto && cuda_available());
  backend_ = use_cuda ? make_cuda_backend(model, graph_)
                      : make_cpu_backend(model, graph_, opts.n_threads);
  backend_->reserve(n_ctx_, ubatch_);
  ubatch_ = std::min(ubatch_, backend_->max_batch());
  backend_name_ = backend_->name();
}

void Session::check_fits(size_t n_new) const {
  if (size_t(n_past_) + n_new > size_t(n_ctx_))
    fail(n_past_, " tokens in context + ", n_new, " new tokens = ", size_t(n_past_) + n_new,
         " exceeds the context size n_ctx=", n_ctx_, "; raise -c (max ",
         model_.hp.n_ctx_train, " for this model)");
}

template <typename Fn>
void Session::for_each_ubatch(std::span<const int32_t> tokens, Fn&& fn) {
  check_fits(tokens.size());
  for (size_t begin = 0; begin < tokens.size(); begin += size_t(ubatch_)) {
    const size_t n = std::min(tokens.size() - begin, size_t(ubatch_));
    fn(Batch{tokens.subspan(begin, n), n_past_, false}, begin + n == tokens.size());
    n_past_ += int(n);
  }
}

std::span<const float> Session::eval(std::span<const int32_t> tokens) {
  for_each_ubatch(tokens, [&](const Batch& batch, bool) { backend_->forward(batch, logits_); });
  return logits_;
}

std::span<const float> Session::eval_all(std::span<const int32_t> tokens) {
  std::vector<float> all;
  all.reserve(tokens.size() * size_t(model_.hp.n_vocab));
  for_each_ubatch(tokens, [&](Batch batch, bool) {
    batch.all_logits = true;
    backend_->forward(batch, logits_);
    all.insert(all.end(), logits_.begin(), logits_.end());
  });
  logits_ = std::move(all);
  return logits_;
}

int32_t Session::eval_greedy(std::span<const int32_t> tokens) {
  if (tokens.empty()) fail("eval_greedy: no tokens to evaluate");
  int32_t next = -1;
  for_each_ubatch(tokens, [&](const Batch& batch, bool is_last) {
    if (is_last)
      next = backend_->forward_greedy(batch);
    else
      backend_->forward(batch, logits_);
  });
  return next;
}

}  // namespace minfer
