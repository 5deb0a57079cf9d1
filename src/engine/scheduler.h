// Continuous batching over the engine: requests wait in FCFS order, up to max_seqs generate at
// once, and every step carries one decode token per generating sequence plus prompt chunks of
// newer requests within a per-step token budget (chunked prefill), so long prompts do not stall
// running streams. When the KV pool runs out of blocks the newest request is preempted: its
// blocks are freed and it recomputes its tokens when it runs again. Prompts whose first whole
// blocks were computed before take those blocks from the pool's prefix cache; a request for n
// choices computes its prompt once and forks the sequence n ways (the forks share the prompt's
// blocks).
#pragma once
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "engine/engine.h"
#include "sampling/sampler.h"
#include "util/threadpool.h"

namespace minfer {

enum class FinishReason { Stop, Length, Cancelled };
const char* finish_reason_name(FinishReason r);  // "stop", "length", "cancelled"

struct Request {
  std::vector<int32_t> prompt;
  int max_tokens = 128;       // generated tokens at most, per choice
  SamplerParams sampling;     // a per-request seed makes sampled text independent of the batch
  int n = 1;                  // choices; choice c samples with seed + c
  bool ignore_eos = false;
  bool want_logits = false;   // pass each token's logits row to on_token (logprobs)
  // Called from step() for each generated token of a choice; return false to stop that choice
  // (FinishReason::Cancelled).
  std::function<bool(int choice, int32_t token, std::span<const float> logits)> on_token;
  std::function<void(int choice, FinishReason reason)> on_finish;  // once per choice
};

struct SchedulerOptions {
  int max_seqs = 16;                // sequences generating at once
  int step_tokens = 0;              // token budget per step (0: the engine's max_tokens)
  std::vector<int32_t> end_tokens;  // end-of-generation tokens
  bool prefix_cache = true;         // reuse cached KV blocks of identical prompt prefixes
  int sampling_threads = 0;         // threads sampling the sequences of a step (0: every core)
  // Whole-vocabulary draws where the logits are (Step::draw); off with MINFER_NO_BACKEND_DRAW=1,
  // which copies the logits back and samples on the host instead (the same tokens).
  bool backend_draws = true;
};

// Steps of one kind and where their time went: `forward` is the engine's forward (uploads,
// launches, the device's work, the outputs' download); the rest of a step's wall time is the
// host's (admission, batching, sampling, the token callbacks).
struct StepTimes {
  int64_t steps = 0;
  double seconds = 0, forward_seconds = 0;
};

// Sequences (one per choice) and the KV pool as of the end of the last step.
struct SchedulerCounts {
  int running = 0, waiting = 0;
  int kv_used = 0, kv_cached = 0, kv_total = 0;  // blocks: held by sequences; cached, held by none; all
  int64_t prompt_tokens = 0, generated_tokens = 0, preemptions = 0;
  int64_t prefix_hit_tokens = 0;  // prompt positions taken from the prefix cache, not computed
  StepTimes decode_steps, prompt_steps;  // steps of decode tokens only; steps carrying prompt tokens
  int64_t steps() const { return decode_steps.steps + prompt_steps.steps; }
};

class Scheduler {
 public:
  Scheduler(Engine& engine, SchedulerOptions opts);
  ~Scheduler();
  // Thread-safe. Throws minfer::Error for a request that can never run (empty prompt, a prompt
  // beyond the whole KV pool, more choices than max_seqs).
  uint64_t submit(Request r);
  void cancel(uint64_t id);  // thread-safe; every choice finishes (Cancelled) at the next step
  bool has_work();           // thread-safe
  // One forward step (admission, batching, sampling, callbacks). Call from one thread.
  void step();
  SchedulerCounts counts();  // thread-safe

 private:
  struct Active;
  bool admit(std::unique_ptr<Active>& a, int budget);
  // step_.add for a's tokens; a token that a's sampler draws over the whole vocabulary is drawn by
  // the backend (Step::draw), so its logits stay on the device.
  int add_to_step(Active& a, std::span<const int32_t> tokens, bool decode, Step::Output out);
  void preempt_newest();
  void finish(Active& a, FinishReason r);
  // Takes the token the step produced for `a`; false when `a` finished with it.
  bool accept(Active& a, int32_t token, std::span<const float> logits, int64_t& generated);

  Engine& engine_;
  SchedulerOptions opts_;
  std::mutex mu_;  // guards incoming_, cancelled_, counts_
  std::deque<std::unique_ptr<Active>> incoming_;
  std::vector<uint64_t> cancelled_;
  SchedulerCounts counts_;
  uint64_t next_id_ = 1;
  // step() thread only
  std::deque<std::unique_ptr<Active>> waiting_;
  std::vector<std::unique_ptr<Active>> running_;
  Step step_;
  std::unique_ptr<ThreadPool> sampling_pool_;  // made at the first step that samples 2+ sequences
};

}  // namespace minfer
