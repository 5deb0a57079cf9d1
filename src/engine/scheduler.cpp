#include "engine/scheduler.h"

#include <algorithm>
#include <chrono>
#include <memory>

#include "util/env.h"
#include "util/error.h"
#include "util/threadpool.h"

namespace minfer {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::Stop: return "stop";
    case FinishReason::Length: return "length";
    case FinishReason::Cancelled: return "cancelled";
  }
  return "unknown";
}

// One choice of a request being served. tokens = prompt + generated; the KV cache holds
// tokens[0, kv.n_tokens()). Until the first token is generated the step feeds the prompt;
// afterwards it feeds the newest token (decode), or, after a preemption, recomputes everything
// before the newest token first. Choice 0 computes the prompt; the other choices are forked from it
// when its prompt is done.
struct Scheduler::Active {
  uint64_t id = 0;
  std::shared_ptr<const Request> req;  // shared by the request's choices
  int choice = 0;
  int forks_pending = 0;  // choices still to fork from this one once its prompt is computed
  KvPool::Sequence kv;
  std::vector<int32_t> tokens;
  int n_prompt = 0;
  int n_generated = 0;
  Sampler sampler;
  int item = -1;         // index in the current step, -1 when not in it
  bool drawing = false;  // the backend draws its token in the current step

  Active(uint64_t id_, std::shared_ptr<const Request> r, int choice_, KvPool::Sequence kv_)
      : id(id_), req(std::move(r)), choice(choice_), kv(std::move(kv_)), tokens(req->prompt),
        n_prompt(int(tokens.size())), sampler(seeded(req->sampling, choice_)) {}
  static SamplerParams seeded(SamplerParams p, int choice) {
    p.seed += uint64_t(choice);
    return p;
  }
  // Tokens to run before the next token can be generated; 0 when the newest one decodes next.
  int prefill_left() const {
    const int target = n_generated == 0 ? n_prompt : int(tokens.size()) - 1;
    return target - kv.n_tokens();
  }
  bool decoding() const { return n_generated > 0 && prefill_left() == 0; }
  bool wants_logits() const { return req->want_logits || !plain_greedy(req->sampling); }
  // Only the drawn token is needed: no logprobs, no choices still to fork from these logits.
  bool can_draw_on_backend(size_t n_vocab) const {
    return !req->want_logits && forks_pending == 0 && sampler.draws_whole_vocabulary(n_vocab);
  }
  int width() const { return 1 + forks_pending; }  // sequences it occupies once its prompt is done
  int32_t pick(int32_t argmax, std::span<const float> logits, int32_t drawn) {
    return drawn >= 0 ? drawn : plain_greedy(req->sampling) ? argmax : sampler.sample(logits, tokens);
  }
};

Scheduler::Scheduler(Engine& engine, SchedulerOptions opts) : engine_(engine), opts_(std::move(opts)), step_(engine) {
  if (env_flag("MINFER_NO_BACKEND_DRAW")) opts_.backend_draws = false;
  if (opts_.max_seqs <= 0) fail("the number of parallel sequences must be positive, not ", opts_.max_seqs);
  if (opts_.step_tokens <= 0 || opts_.step_tokens > engine.max_tokens()) opts_.step_tokens = engine.max_tokens();
}

Scheduler::~Scheduler() = default;

uint64_t Scheduler::submit(Request r) {
  if (r.prompt.empty()) fail("the prompt is empty");
  if (r.max_tokens < 0) fail("max_tokens must not be negative, not ", r.max_tokens);
  if (r.n < 1 || r.n > opts_.max_seqs) fail("a request asks for ", r.n, " choices; 1 to ", opts_.max_seqs, " can run");
  const int64_t capacity = int64_t(engine_.kv().n_blocks()) * engine_.kv().block_size();
  if (int64_t(r.prompt.size()) + 1 > capacity)
    fail("the prompt has ", r.prompt.size(), " tokens but the KV cache holds ", capacity, " positions in all");
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t id = next_id_++;
  auto a = std::make_unique<Active>(id, std::make_shared<const Request>(std::move(r)), 0, KvPool::Sequence(engine_.kv()));
  a->forks_pending = a->req->n - 1;
  incoming_.push_back(std::move(a));
  ++counts_.waiting;
  return id;
}

void Scheduler::cancel(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  cancelled_.push_back(id);
}

bool Scheduler::has_work() {
  // From the counts, not the step thread's lists: other threads may ask while a step runs.
  std::lock_guard<std::mutex> lock(mu_);
  return counts_.running > 0 || counts_.waiting > 0;
}

SchedulerCounts Scheduler::counts() {
  std::lock_guard<std::mutex> lock(mu_);
  return counts_;
}

void Scheduler::finish(Active& a, FinishReason r) {
  a.kv.release();
  if (!a.req->on_finish) return;
  a.req->on_finish(a.choice, r);
  // Choices never forked end with the one they were to be forked from.
  for (; a.forks_pending > 0; --a.forks_pending) a.req->on_finish(a.req->n - a.forks_pending, r);
}

bool Scheduler::accept(Active& a, int32_t token, std::span<const float> logits, int64_t& generated) {
  const Request& r = *a.req;
  if (!r.ignore_eos && std::find(opts_.end_tokens.begin(), opts_.end_tokens.end(), token) != opts_.end_tokens.end()) {
    finish(a, FinishReason::Stop);
    return false;
  }
  a.tokens.push_back(token);
  ++a.n_generated;
  ++generated;
  const bool keep_going = !r.on_token || r.on_token(a.choice, token, r.want_logits ? logits : std::span<const float>());
  if (!keep_going || a.n_generated >= r.max_tokens) {
    finish(a, keep_going ? FinishReason::Length : FinishReason::Cancelled);
    return false;
  }
  return true;
}

int Scheduler::add_to_step(Active& a, std::span<const int32_t> tokens, bool decode, Step::Output out) {
  const bool draw =
      opts_.backend_draws && out == Step::Output::Last && a.can_draw_on_backend(size_t(engine_.model().hp.n_vocab));
  const int item = step_.add(a.kv, tokens, decode, out, !draw && a.wants_logits());
  a.drawing = item >= 0 && draw;
  if (a.drawing) step_.draw(item, a.req->sampling.temperature, a.sampler.take_uniform());
  return item;
}

// The newest running request gives its blocks back and waits at the head of the queue.
void Scheduler::preempt_newest() {
  std::unique_ptr<Active> a = std::move(running_.back());
  running_.pop_back();
  a->kv.release();
  a->item = -1;
  a->drawing = false;
  waiting_.push_front(std::move(a));
  std::lock_guard<std::mutex> lock(mu_);
  ++counts_.preemptions;
}

// Starts a waiting request when the pool can hold all it must compute before its first token.
// Whole prompt blocks found in the prefix cache are taken instead of computed; at least one
// prompt token is always computed, for the logits of the first generated token.
bool Scheduler::admit(std::unique_ptr<Active>& a, int budget) {
  int occupied = 0;  // running sequences, with the forks they are still to make
  for (const auto& r : running_) occupied += r->width();
  if (occupied + a->width() > opts_.max_seqs || budget <= 0) return false;
  int cached = 0;
  if (opts_.prefix_cache)
    cached = a->kv.attach_cached_prefix(std::span<const int32_t>(a->tokens).first(size_t(a->n_prompt)),
                                        std::min(a->n_prompt, a->prefill_left() - 1));
  if (a->kv.blocks_needed(a->prefill_left() + 1) > engine_.kv().n_free()) {
    a->kv.release();
    return false;
  }
  const int n = std::min(a->prefill_left(), budget);
  const bool completes = n == a->prefill_left() && a->n_generated == 0;
  a->item = add_to_step(*a, std::span<const int32_t>(a->tokens).subspan(size_t(a->kv.n_tokens()), size_t(n)), false,
                        completes ? Step::Output::Last : Step::Output::None);
  if (a->item < 0) {
    a->kv.release();
    return false;
  }
  running_.push_back(std::move(a));
  std::lock_guard<std::mutex> lock(mu_);
  counts_.prefix_hit_tokens += cached;
  return true;
}

void Scheduler::step() {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point start = Clock::now();
  std::vector<uint64_t> cancelled;
  {
    std::lock_guard<std::mutex> lock(mu_);
    while (!incoming_.empty()) {
      waiting_.push_back(std::move(incoming_.front()));
      incoming_.pop_front();
    }
    cancelled.swap(cancelled_);
  }
  // Every choice of a cancelled request, waiting or running (callbacks run outside the lock).
  const auto cancel_in = [&](auto& list) {
    for (auto it = list.begin(); it != list.end();) {
      if (std::find(cancelled.begin(), cancelled.end(), (*it)->id) == cancelled.end()) {
        ++it;
        continue;
      }
      finish(**it, FinishReason::Cancelled);
      it = list.erase(it);
    }
  };
  if (!cancelled.empty()) {
    cancel_in(waiting_);
    cancel_in(running_);
  }

  step_.clear();
  for (auto& a : running_) a->item = -1, a->drawing = false;
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
    a.item = add_to_step(a, std::span<const int32_t>(&a.tokens.back(), 1), true, Step::Output::Last);
    if (a.item >= 0) --budget;
  }
  // 2. Prompt chunks of running sequences still prefilling (or recomputing), oldest first.
  for (auto& ap : running_) {
    Active& a = *ap;
    if (a.decoding() || a.item >= 0 || budget <= 0) continue;
    const int n = std::min(a.prefill_left(), budget);
    const bool completes = n == a.prefill_left() && a.n_generated == 0;
    a.item = add_to_step(a, std::span<const int32_t>(a.tokens).subspan(size_t(a.kv.n_tokens()), size_t(n)), false,
                         completes ? Step::Output::Last : Step::Output::None);
    if (a.item >= 0) budget -= n;
  }
  // 3. New requests, first come first served.
  while (!waiting_.empty() && admit(waiting_.front(), budget)) {
    waiting_.pop_front();
    budget = opts_.step_tokens - step_.n_tokens();
  }

  if (!step_.empty()) {
    const bool carries_prompt = step_.carries_prompt();
    const Clock::time_point forward_start = Clock::now();
    step_.run();
    const double forward_seconds = std::chrono::duration<double>(Clock::now() - forward_start).count();
    // Every sequence with an output this step: its logits, argmax and (forks) new choices.
    struct Pick {
      Active* a;
      std::span<const float> logits;
      int32_t argmax, drawn, token = -1;
      std::unique_ptr<Active> fork;  // a new choice, or null for running_[index]
      size_t index = 0;
    };
    std::vector<Pick> picks;
    int64_t prompt_done = 0, generated = 0;
    for (size_t i = 0; i < running_.size(); ++i) {
      Active& a = *running_[i];
      if (a.item < 0) continue;
      // Only prompt positions are offered: generated ones ran on the decode kernels.
      if (opts_.prefix_cache)
        a.kv.cache_full_blocks(std::span<const int32_t>(a.tokens).first(size_t(std::min(a.n_prompt, a.kv.n_tokens()))));
      if (step_.argmax(a.item).empty()) continue;
      if (a.n_generated == 0) prompt_done += a.n_prompt;
      const std::span<const float> logits =
          !a.drawing && a.wants_logits() ? step_.logits(a.item) : std::span<const float>();
      const int32_t argmax = step_.argmax(a.item)[0], drawn = a.drawing ? step_.drawn(a.item) : -1;
      // The other choices start from the same prompt KV and the same logits.
      while (a.forks_pending > 0) {
        auto f = std::make_unique<Active>(a.id, a.req, a.req->n - a.forks_pending--, a.kv.fork(a.kv.n_tokens()));
        picks.push_back({f.get(), logits, argmax, -1, -1, std::move(f)});
      }
      picks.push_back({&a, logits, argmax, drawn, -1, nullptr, i});
    }
    // Sampling is per sequence (its own sampler and history), so the sequences sample in
    // parallel; the callbacks below run in order on this thread.
    const auto pick_range = [&picks](int64_t begin, int64_t end) {
      for (int64_t k = begin; k < end; ++k) {
        Pick& p = picks[size_t(k)];
        p.token = p.a->pick(p.argmax, p.logits, p.drawn);
      }
    };
    const auto sampled = std::count_if(picks.begin(), picks.end(),
                                       [](const Pick& p) { return p.drawn < 0 && !plain_greedy(p.a->req->sampling); });
    if (sampled >= 2) {
      if (!sampling_pool_) sampling_pool_ = std::make_unique<ThreadPool>(opts_.sampling_threads);
      sampling_pool_->parallel_for(int64_t(picks.size()), pick_range);
    } else {
      pick_range(0, int64_t(picks.size()));
    }
    std::vector<size_t> done;
    std::vector<std::unique_ptr<Active>> forks;
    for (Pick& p : picks) {
      const bool more = accept(*p.a, p.token, p.logits, generated);
      if (p.fork && more) forks.push_back(std::move(p.fork));
      if (!p.fork && !more) done.push_back(p.index);
    }
    for (auto it = done.rbegin(); it != done.rend(); ++it) running_.erase(running_.begin() + ptrdiff_t(*it));
    for (auto& f : forks) running_.push_back(std::move(f));
    std::lock_guard<std::mutex> lock(mu_);
    counts_.prompt_tokens += prompt_done;
    counts_.generated_tokens += generated;
    StepTimes& times = carries_prompt ? counts_.prompt_steps : counts_.decode_steps;
    ++times.steps;
    times.seconds += std::chrono::duration<double>(Clock::now() - start).count();
    times.forward_seconds += forward_seconds;
  }
  std::lock_guard<std::mutex> lock(mu_);
  counts_.running = int(running_.size());
  counts_.waiting = int(waiting_.size() + incoming_.size());
  counts_.kv_total = engine_.kv().n_blocks();
  counts_.kv_used = engine_.kv().n_used();
  counts_.kv_cached = engine_.kv().n_cached();
}

}  // namespace minfer
