#include "server/worker.h"

#include <cstdio>

#include "server/output.h"
#include "util/error.h"

namespace minfer::server {

void GenerationChannel::wait(std::vector<GenerationEvent>& out, std::chrono::steady_clock::time_point until) {
  std::unique_lock<std::mutex> lock(mu_);
  arrived_.wait_until(lock, until, [&] { return !events_.empty(); });
  for (GenerationEvent& e : events_) out.push_back(std::move(e));
  events_.clear();
}

void GenerationChannel::push(GenerationEvent e) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    events_.push_back(std::move(e));
  }
  arrived_.notify_one();
}

Worker::Worker(Engine& engine, SchedulerOptions opts, int max_waiting)
    : scheduler_(engine, opts), capacity_(opts.max_seqs + max_waiting), delivery_thread_([this] { deliver_loop(); }),
      thread_([this] { loop(); }) {}

Worker::~Worker() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  work_.notify_one();
  thread_.join();
  {
    std::lock_guard<std::mutex> lock(delivery_mu_);
    delivery_stopping_ = true;
  }
  delivery_ready_.notify_one();
  delivery_thread_.join();  // after delivering what the engine thread posted
}

void Worker::post_outbox() {
  if (outbox_.empty()) return;
  {
    std::lock_guard<std::mutex> lock(delivery_mu_);
    for (Delivery& d : outbox_) deliveries_.push_back(std::move(d));
  }
  outbox_.clear();
  delivery_ready_.notify_one();
}

void Worker::deliver_loop() {
  std::vector<Delivery> batch;
  std::unique_lock<std::mutex> lock(delivery_mu_);
  while (true) {
    delivery_ready_.wait(lock, [&] { return delivery_stopping_ || !deliveries_.empty(); });
    if (deliveries_.empty()) return;  // stopping, and everything delivered
    batch.swap(deliveries_);
    lock.unlock();
    for (Delivery& d : batch) d.channel->push(std::move(d.event));
    batch.clear();
    lock.lock();
  }
}

void Worker::wake() {
  // Taking the lock orders this after the engine thread's check for work, so the wake-up is not lost.
  { std::lock_guard<std::mutex> lock(mu_); }
  work_.notify_one();
}

std::optional<Submission> Worker::submit(Request r, std::optional<int> top_logprobs) {
  if (const std::string f = failure(); !f.empty()) fail("the engine stopped: ", f);
  const int n = r.n;
  if (in_flight_.fetch_add(n) + n > capacity_) {
    in_flight_ -= n;
    return std::nullopt;
  }
  auto channel = std::make_shared<GenerationChannel>(n);
  r.want_logits = top_logprobs.has_value();
  r.on_token = [this, channel, top_logprobs](int choice, int32_t token, std::span<const float> logits) {
    if (channel->choice_stopped(choice)) return false;
    GenerationEvent e = GenerationEvent::generated(choice, token);
    if (top_logprobs) e.logprobs = token_logprobs(logits, token, *top_logprobs);
    outbox_.push_back({channel, std::move(e)});
    return true;
  };
  r.on_finish = [this, channel](int choice, FinishReason reason) {
    --in_flight_;
    outbox_.push_back({channel, GenerationEvent::end(choice, reason)});
  };
  uint64_t id;
  try {
    id = scheduler_.submit(std::move(r));
  } catch (...) {
    in_flight_ -= n;
    throw;
  }
  wake();
  return Submission{id, std::move(channel)};
}

void Worker::cancel(uint64_t id) {
  scheduler_.cancel(id);
  wake();
}

std::string Worker::failure() {
  std::lock_guard<std::mutex> lock(mu_);
  return failure_;
}

void Worker::loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    work_.wait(lock, [&] { return stopping_ || scheduler_.has_work(); });
    if (stopping_) return;
    lock.unlock();
    try {
      scheduler_.step();
      post_outbox();
    } catch (const std::exception& e) {
      // A backend failure (a device error, say): requests waiting on it see failure() and end.
      std::fprintf(stderr, "minfer serve: the engine stopped: %s\n", e.what());
      post_outbox();
      lock.lock();
      failure_ = e.what();
      return;
    }
    lock.lock();
  }
}

}  // namespace minfer::server
