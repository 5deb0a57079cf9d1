// Continuous batching over the engine: requests wait in FCFS order, up to max_seqs generate at
// once, and every step carries one decode token per generating sequence plus prompt chunks of
// newer requests within a per-step token budget (chunked prefill), so long prompts do not stall
// running streams. When the KV pool runs out of blocks the newest request is preempted: its
// blocks are freed and it recomputes its tokens when it runs again.
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

namespace minfer {

enum class FinishReason { Stop, Length, Cancelled };
const char* finish_reason_name(FinishReason r);  // "stop", "length", "cancelled"

struct Request {
  std::vector<int32_t> prompt;
  int max_tokens = 128;       // generated tokens at most
  SamplerParams sampling;     // a per-request seed makes sampled text independent of the batch
  bool ignore_eos = false;
  bool want_logits = false;   // pass each token's logits row to on_token (logprobs)
  // Called from step() for each generated token; return false to stop (FinishReason::Cancelled).
  std::function<bool(int32_t token, std::span<const float> logits)> on_token;
  std::function<void(FinishReason reason)> on_finish;
};

struct SchedulerOptions {
  int max_seqs = 16;                // sequences generating at once
  int step_tokens = 0;              // token budget per step (0: the engine's max_tokens)
  std::vector<int32_t> end_tokens;  // end-of-generation tokens
};

struct SchedulerCounts {
  int running = 0, waiting = 0;
  int64_t prompt_tokens = 0, generated_tokens = 0, preemptions = 0, steps = 0;
};

class Scheduler {
 public:
  Scheduler(Engine& engine, SchedulerOptions opts);
  ~Scheduler();
  // Thread-safe. Throws minfer::Error for a request that can never run (empty prompt, prompt plus
  // max_tokens beyond the whole KV pool).
  uint64_t submit(Request r);
  void cancel(uint64_t id);  // thread-safe; the request finishes (Cancelled) at the next step
  bool has_work();           // thread-safe
  // One forward step (admission, batching, sampling, callbacks). Call from one thread.
  void step();
  SchedulerCounts counts();  // thread-safe

 private:
  struct Active;
  bool admit(std::unique_ptr<Active>& a, int budget);
  void preempt_newest();
  void finish(Active& a, FinishReason r);

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
};

}  // namespace minfer
