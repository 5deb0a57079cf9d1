// A fixed pool of worker threads for data-parallel loops (the CPU backend's matmuls, quantize).
#pragma once
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace minfer {

class ThreadPool {
 public:
  explicit ThreadPool(int n_threads = 0);  // 0: std::thread::hardware_concurrency()
  ~ThreadPool();
  int size() const { return int(workers_.size()) + 1; }
  // Calls fn(begin, end) on disjoint chunks covering [0, n); the caller thread takes a share.
  // Returns when all chunks are done. min_chunk bounds the chunk size from below.
  void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn,
                    int64_t min_chunk = 1);

 private:
  void worker_loop(int index);
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_start_, cv_done_;
  const std::function<void(int64_t, int64_t)>* job_ = nullptr;
  int64_t job_n_ = 0, job_chunk_ = 1;
  int64_t next_ = 0;
  int pending_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
};

}  // namespace minfer
