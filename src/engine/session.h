// One conversation's state over a backend: how many positions the KV cache holds, prompt
// chunking into micro-batches, and the context limit (a clear error, never an overflow).
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"

namespace minfer {

enum class BackendKind { Cpu, Cuda, Auto };
BackendKind parse_backend_kind(const std::string& s);  // "cpu" | "cuda" | "auto"

struct SessionOptions {
  int n_ctx = 0;         // 0: the model's context length capped at 8192
  int ubatch = 512;      // prompt tokens per forward call
  int n_threads = 0;     // CPU backend; 0 = hardware concurrency
  BackendKind backend = BackendKind::Auto;
};

class Session {
 public:
  Session(const Model& model, SessionOptions opts);
  int n_ctx() const { return n_ctx_; }
  int n_past() const { return n_past_; }
  const std::string& backend_name() const { return backend_name_; }
  // Appends tokens to the context; returns the last token's logits (n_vocab floats). Throws
  // minfer::Error if n_past + tokens.size() > n_ctx, naming the numbers and the -c flag.
  std::span<const float> eval(std::span<const int32_t> tokens);
  // Like eval but returns all tokens' logits (tokens.size() x n_vocab).
  std::span<const float> eval_all(std::span<const int32_t> tokens);
  // Greedy fast path: appends tokens and returns argmax of the last logits.
  int32_t eval_greedy(std::span<const int32_t> tokens);
  void reset() { n_past_ = 0; }          // forget the context (cache is overwritten)
  void truncate(int n) { n_past_ = n; }  // keep the first n positions (n <= n_past)

 private:
  void check_fits(size_t n_new) const;
  // Checks the context limit, then calls fn(batch, is_last) for each micro-batch of tokens and
  // advances n_past after each.
  template <typename Fn>
  void for_each_ubatch(std::span<const int32_t> tokens, Fn&& fn);
  const Model& model_;
  Graph graph_;
  std::unique_ptr<Backend> backend_;
  std::string backend_name_;
  int n_ctx_ = 0;
  int ubatch_ = 512;
  int n_past_ = 0;
  std::vector<float> logits_;
};

}  // namespace minfer
