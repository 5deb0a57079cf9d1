#include "util/threadpool.h"

#include <algorithm>
#include <atomic>

namespace minfer {

ThreadPool::ThreadPool(int n_threads) {
  if (n_threads <= 0) n_threads = std::max(1u, std::thread::hardware_concurrency());
  for (int i = 1; i < n_threads; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_start_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn,
                              int64_t min_chunk) {
  if (n <= 0) return;
  const int64_t threads = size();
  int64_t chunk = std::max<int64_t>(min_chunk, (n + threads * 4 - 1) / (threads * 4));
  if (workers_.empty() || n <= chunk) {
    fn(0, n);
    return;
  }
  std::unique_lock<std::mutex> lock(mu_);
  job_ = &fn;
  job_n_ = n;
  job_chunk_ = chunk;
  next_ = 0;
  pending_ = int(workers_.size());
  ++generation_;
  cv_start_.notify_all();
  // The caller works too.
  for (;;) {
    const int64_t b = next_;
    if (b >= n) break;
    next_ = b + chunk;
    lock.unlock();
    fn(b, std::min(n, b + chunk));
    lock.lock();
  }
  cv_done_.wait(lock, [this] { return pending_ == 0; });
  job_ = nullptr;
}

void ThreadPool::worker_loop(int) {
  uint64_t seen = 0;
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_start_.wait(lock, [&] { return stop_ || generation_ != seen; });
    if (stop_) return;
    seen = generation_;
    for (;;) {
      const int64_t b = next_;
      if (b >= job_n_) break;
      next_ = b + job_chunk_;
      const auto* fn = job_;
      const int64_t e = std::min(job_n_, b + job_chunk_);
      lock.unlock();
      (*fn)(b, e);
      lock.lock();
    }
    if (--pending_ == 0) cv_done_.notify_all();
  }
}

}  // namespace minfer
