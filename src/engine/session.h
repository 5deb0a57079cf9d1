// One conversation over an engine: a single sequence, prompt chunking into micro-batches, and the
// context limit (a clear error, never an overflow).
#pragma once
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "engine/engine.h"

namespace minfer {

struct SessionOptions {
  int n_ctx = 0;         // 0: the model's context length capped at 8192
  // Prompt tokens per forward step; 0: 4096 on CUDA (docs/14 §19: 4096-token steps prefill a long
  // prompt 10 % faster than 512-token ones), 512 on the CPU (where longer steps only take memory).
  int ubatch = 0;
  // The output rows a step may return logits for: eval_all, which wants every row's, runs
  // micro-batches of at most this many tokens (n_vocab floats a row).
  int max_outputs = 512;
  int n_threads = 0;     // CPU backend; 0 = hardware concurrency
  BackendKind backend = BackendKind::Auto;
  int kv_block_size = kDefaultKvBlockSize;
};

class Session {
 public:
  Session(const Model& model, SessionOptions opts);
  // On a backend made by the caller (opts.backend and opts.n_threads are not used).
  Session(const Model& model, SessionOptions opts, std::unique_ptr<Backend> backend);
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;
  int n_ctx() const { return n_ctx_; }
  int n_past() const { return seq_.n_tokens(); }
  const std::string& backend_name() const { return engine_.backend_name(); }
  Engine& engine() { return engine_; }

  // Prompt tokens (the prompt kernels, in micro-batches). Each throws minfer::Error if
  // n_past + tokens.size() > n_ctx, naming the numbers and the -c flag.
  // Returns the last token's logits (n_vocab floats).
  std::span<const float> eval(std::span<const int32_t> tokens);
  // Every token's logits (tokens.size() x n_vocab).
  std::span<const float> eval_all(std::span<const int32_t> tokens);
  // The argmax of the last token's logits (computed where the logits are).
  int32_t eval_greedy(std::span<const int32_t> tokens);
  // One generated token (the decode kernels): its logits, or only their argmax.
  std::span<const float> decode(int32_t token);
  int32_t decode_greedy(int32_t token);
  // Greedy generation on from `token`, the greedy token after what the session holds (from
  // eval_greedy or decode_greedy): passes it and each next greedy token to `take`, and decodes a
  // token only when take returned true for it (asking for more). The steps are fed by one another
  // (Step::submit_after) unless fed_steps_enabled() is false, so the host reads each token while
  // the next step runs; the step past the last token taken is dropped from the context again.
  // The context's end is the error decode_greedy gives.
  void generate_greedy(int32_t token, const std::function<bool(int32_t)>& take);

  void reset() { seq_.truncate(0); }     // forget the context
  void truncate(int n) { seq_.truncate(n); }  // keep the first n positions (n <= n_past)

 private:
  void check_fits(size_t n_new) const;
  // Runs tokens in micro-batches; the last one produces `out` rows (with logits when asked).
  void run(std::span<const int32_t> tokens, bool decode, Step::Output out, bool logits);
  const Model& model_;
  int n_ctx_ = 0;
  int ubatch_ = 0, all_logits_ubatch_ = 0;  // tokens a step, and a step of eval_all
  Engine engine_;
  KvPool::Sequence seq_;
  Step step_, fed_step_;
  std::vector<float> logits_;
  int32_t argmax_ = -1;
};

}  // namespace minfer
