#include "engine/scheduler.h"

#include <algorithm>

#include "util/error.h"

namespace minfer {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::Stop: return "stop";
    case FinishReason::Length: return "length";
    case FinishReason::Cancelled: return "cancelled";
  }
  return "unknown";
}

// A request being served. tokens = prompt + generated; the KV cache holds tokens[0, kv.n_tokens()).
// Until the first token is generated the step feeds the prompt; afterwards it feeds the newest
// token (decode), or, after a preemption, recomputes everything before the newest token first.
struct Scheduler::Active {
  uint64_t id = 0;
  Request req;
  KvPool::Sequence kv;
  std::vector<int32_t> tokens;
  int n_prompt = 0;
  int n_generated = 0;
  Sampler sampler;
  int item = -1;  // index in the current step, -1 when not in it

  Active(uint64_t id_, Request r, KvPool& pool)
      : id(id_), req(std::move(r)), kv(pool), tokens(req.prompt), n_prompt(int(tokens.size())), sampler(req.sampling) {}
  // Tokens to run before the next token can be generated; 0 when the newest one decodes next.
  int prefill_left() const {
    const int target = n_generated == 0 ? n_prompt : int(tokens.size()) - 1;
    return target - kv.n_tokens();
  }
  bool decoding() const { return n_generated > 0 && prefill_left() == 0; }
  bool wants_logits() const { return req.want_logits || !plain_greedy(req.sampling); }
};

Scheduler::Scheduler(Engine& engine, SchedulerOptions opts) : engine_(engine), opts_(std::move(opts)), step_(engine) {
  if (opts_.max_seqs <= 0) fail("the number of parallel sequences must be positive, not ", opts_.max_seqs);
  if (opts_.step_tokens <= 0 || opts_.step_tokens > engine.max_tokens()) opts_.step_tokens = engine.max_tokens();
}

Scheduler::~Scheduler() = default;

uint64_t Scheduler::submit(Request r) {
  if (r.prompt.empty()) fail("the prompt is empty");
  if (r.max_tokens < 0) fail("max_tokens must not be negative, not ", r.max_tokens);
  const int64_t capacity = int64_t(engine_.kv().n_blocks()) * engine_.kv().block_size();
  if (int64_t(r.prompt.size()) + 1 > capacity)
    fail("the prompt has ", r.prompt.size(), " tokens but the KV cache holds ", capacity, " positions in all");
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t id = next_id_++;
  incoming_.push_back(std::make_unique<Active>(id, std::move(r), engine_.kv()));
  ++counts_.waiting;
  return id;
}

void Scheduler::cancel(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  cancelled_.push_back(id);
}

bool Scheduler::has_work() {
  std::lock_guard<std::mutex> lock(mu_);
  return !incoming_.empty() || !waiting_.empty() || !running_.empty();
}

SchedulerCounts Scheduler::counts() {
  std::lock_guard<std::mutex> lock(mu_);
  return counts_;
}

void Scheduler::finish(Active& a, FinishReason r) {
  a.kv.release();
  if (a.req.on_finish) a.req.on_finish(r);
}

// The newest running request gives its blocks back and waits at the head of the queue.
void Scheduler::preempt_newest() {
  std::unique_ptr<Active> a = std::move(running_.back());
  running_.pop_back();
  a->kv.release();
  a->item = -1;
  waiting_.push_front(std::move(a));
  std::lock_guard<std::mutex> lock(mu_);
  ++counts_.preemptions;
}

// Starts a waiting request when the pool can hold all it must compute before its first token.
bool Scheduler::admit(std::unique_ptr<Active>& a, int budget) {
  if (int(running_.size()) >= opts_.max_seqs || budget <= 0) return false;
  if (a->kv.blocks_needed(a->prefill_left() + 1) > engine_.kv().n_free()) return false;
  const int n = std::min(a->prefill_left(), budget);
  const bool completes = n == a->prefill_left() && a->n_generated == 0;
  a->item = step_.add(a->kv, std::span<const int32_t>(a->tokens).subspan(size_t(a->kv.n_tokens()), size_t(n)),
                      false, completes ? Step::Output::Last : Step::Output::None, a->wants_logits());
  if (a->item < 0) return false;
  running_.push_back(std::move(a));
  return true;
}

void Scheduler::step() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    while (!incoming_.empty()) {
      waiting_.push_back(std::move(incoming_.front()));
      incoming_.pop_front();
    }
    for (uint64_t id : cancelled_) {
      auto match = [&](const std::unique_ptr<Active>& a) { return a && a->id == id; };
      for (auto* list : {&waiting_}) {
        auto it = std::find_if(list->begin(), list->end(), match);
        if (it != list->end()) {
          finish(**it, FinishReason::Cancelled);
          list->erase(it);
        }
      }
      auto it = std::find_if(running_.begin(), running_.end(), match);
      if (it != running_.end()) {
        finish(**it, FinishReason::Cancelled);
        running_.erase(it);
      }
    }
    cancelled_.clear();
  }

  step_.clear();
  for (auto& a : running_) a->item = -1;
  int budget = opts_.step_tokens;
  // 1. One decode token for every generating sequence, oldest first. When the pool is out of
  //    blocks the newest sequences give theirs back; a lone sequence that cannot grow ends (Length).
  for (size_t i = 0; i < running_.size() && budget > 0; ++i) {
    Active& a = *running_[i];
    if (!a.decoding()) continue;
    while (a.kv.blocks_needed(1) > engine_.kv().n_free() && running_.size() > i + 1) preempt_newest();
    if (a.kv.blocks_needed(1) > engine_.kv().n_free()) {
      if (i > 0) {  // it is the newest now: it waits
        preempt_newest();
        break;
      }
      finish(a, FinishReason::Length);
      running_.erase(running_.begin());
      --i;
      continue;
    }
    a.item = step_.add(a.kv, std::span<const int32_t>(&a.tokens.back(), 1), true, Step::Output::Last, a.wants_logits());
    if (a.item >= 0) --budget;
  }
  // 2. Prompt chunks of running sequences still prefilling (or recomputing), oldest first.
  for (auto& ap : running_) {
    Active& a = *ap;
    if (a.decoding() || a.item >= 0 || budget <= 0) continue;
    const int n = std::min(a.prefill_left(), budget);
    const bool completes = n == a.prefill_left() && a.n_generated == 0;
    a.item = step_.add(a.kv, std::span<const int32_t>(a.tokens).subspan(size_t(a.kv.n_tokens()), size_t(n)), false,
                       completes ? Step::Output::Last : Step::Output::None, a.wants_logits());
    if (a.item >= 0) budget -= n;
  }
  // 3. New requests, first come first served.
  while (!waiting_.empty() && admit(waiting_.front(), budget)) {
    waiting_.pop_front();
    budget = opts_.step_tokens - step_.n_tokens();
  }

  if (!step_.empty()) {
    step_.run();
    std::vector<size_t> done;
    int64_t prompt_done = 0, generated = 0;
    for (size_t i = 0; i < running_.size(); ++i) {
      Active& a = *running_[i];
      if (a.item < 0 || step_.argmax(a.item).empty()) continue;
      if (a.n_generated == 0) prompt_done += a.n_prompt;
      const std::span<const float> logits = a.wants_logits() ? step_.logits(a.item) : std::span<const float>();
      const int32_t token = plain_greedy(a.req.sampling) ? step_.argmax(a.item)[0] : a.sampler.sample(logits, a.tokens);
      const bool is_end = !a.req.ignore_eos &&
                          std::find(opts_.end_tokens.begin(), opts_.end_tokens.end(), token) != opts_.end_tokens.end();
      if (is_end) {
        finish(a, FinishReason::Stop);
        done.push_back(i);
        continue;
      }
      a.tokens.push_back(token);
      ++a.n_generated;
      ++generated;
      const bool keep_going = !a.req.on_token || a.req.on_token(token, a.req.want_logits ? logits : std::span<const float>());
      if (!keep_going || a.n_generated >= a.req.max_tokens) {
        finish(a, keep_going ? FinishReason::Length : FinishReason::Cancelled);
        done.push_back(i);
      }
    }
    for (auto it = done.rbegin(); it != done.rend(); ++it) running_.erase(running_.begin() + ptrdiff_t(*it));
    std::lock_guard<std::mutex> lock(mu_);
    counts_.prompt_tokens += prompt_done;
    counts_.generated_tokens += generated;
    ++counts_.steps;
  }
  std::lock_guard<std::mutex> lock(mu_);
  counts_.running = int(running_.size());
  counts_.waiting = int(waiting_.size() + incoming_.size());
}

}  // namespace minfer
