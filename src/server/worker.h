// The engine thread and the channels between it and the HTTP threads. One thread loops
// scheduler.step() while there is work and sleeps on a condition variable otherwise; HTTP threads
// submit requests and read each request's events from its own channel. The engine thread never
// waits on a client: on_token only computes the (small) logprobs and appends to the step's
// outbox; a delivery thread moves each step's events into the channels and wakes their readers
// (one futex call a request, and the woken thread wanting a core) while the next step runs.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "engine/scheduler.h"
#include "server/api.h"

namespace minfer::server {

struct GenerationEvent {
  int choice = 0;
  bool finished = false;  // false: a generated token
  int32_t token = -1;
  FinishReason reason = FinishReason::Stop;
  std::optional<TokenLogprobs> logprobs;  // when the request asked for them

  static GenerationEvent generated(int choice, int32_t token) { return {choice, false, token, FinishReason::Stop, {}}; }
  static GenerationEvent end(int choice, FinishReason reason) { return {choice, true, -1, reason, {}}; }
};

// One request's events, from the engine thread to the HTTP thread that serves the request.
class GenerationChannel {
 public:
  explicit GenerationChannel(int n_choices) : stopped_(size_t(n_choices)) {}
  // Moves the events that arrived into `out`, waiting for some until `until`.
  void wait(std::vector<GenerationEvent>& out, std::chrono::steady_clock::time_point until);
  // The choice generates no more (its stop string appeared): it ends at its next token.
  void stop_choice(int choice) { stopped_[size_t(choice)] = true; }
  bool choice_stopped(int choice) const { return stopped_[size_t(choice)]; }
  void push(GenerationEvent e);

 private:
  std::mutex mu_;
  std::condition_variable arrived_;
  std::vector<GenerationEvent> events_;
  std::vector<std::atomic<bool>> stopped_;
};

struct Submission {
  uint64_t id = 0;
  std::shared_ptr<GenerationChannel> channel;
};

class Worker {
 public:
  // max_waiting: sequences that may wait beyond the max_seqs that run; more are refused.
  Worker(Engine& engine, SchedulerOptions opts, int max_waiting);
  ~Worker();  // ends after the step in progress
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  // nullopt when the queue is full (every choice is a sequence). top_logprobs: the request wants
  // logprobs with that many alternatives. Throws minfer::Error for a request the scheduler
  // refuses, or after the engine failed.
  std::optional<Submission> submit(Request r, std::optional<int> top_logprobs);
  void cancel(uint64_t id);  // every choice ends at the next step; its blocks go back to the pool
  SchedulerCounts counts() { return scheduler_.counts(); }
  std::string failure();     // why the engine thread stopped; "" while it runs

 private:
  void loop();
  void wake();
  void deliver_loop();
  void post_outbox();  // engine thread: hands the step's events to the delivery thread

  struct Delivery {
    std::shared_ptr<GenerationChannel> channel;
    GenerationEvent event;
  };

  Scheduler scheduler_;
  const int capacity_;             // sequences in flight at most
  std::atomic<int> in_flight_{0};  // submitted sequences whose choice has not finished
  std::mutex mu_;
  std::condition_variable work_;
  bool stopping_ = false;
  std::string failure_;
  std::vector<Delivery> outbox_;  // engine thread only: the events of the step in progress
  std::mutex delivery_mu_;
  std::condition_variable delivery_ready_;
  std::vector<Delivery> deliveries_;  // guarded by delivery_mu_, in the order the steps made them
  bool delivery_stopping_ = false;    // guarded by delivery_mu_
  std::thread delivery_thread_;
  std::thread thread_;
};

}  // namespace minfer::server
