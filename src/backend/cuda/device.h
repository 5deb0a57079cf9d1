// Device resources owned by RAII handles (a failed constructor leaks nothing), and the per-device
// context: which device, its SM count, and the kernel attributes set on it. Nothing here is
// process-global, so several devices can each have their own.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

namespace minfer::cuda {

// Throws minfer::Error "CUDA <what>: <error string>" unless e == cudaSuccess.
void check(cudaError_t e, const char* what);

// Device memory of n elements (256 bytes at least, so empty buffers still have an address).
template <typename T>
class DeviceArray {
 public:
  DeviceArray() = default;
  explicit DeviceArray(size_t n, const char* what = "cudaMalloc") : n_(n) {
    void* p = nullptr;
    check(cudaMalloc(&p, std::max<size_t>(n * sizeof(T), 256)), what);
    p_ = static_cast<T*>(p);
  }
  DeviceArray(DeviceArray&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  DeviceArray& operator=(DeviceArray&& o) noexcept {
    if (this != &o) {
      reset();
      p_ = std::exchange(o.p_, nullptr);
      n_ = std::exchange(o.n_, 0);
    }
    return *this;
  }
  ~DeviceArray() { reset(); }
  T* get() const { return p_; }
  size_t size() const { return n_; }
  size_t bytes() const { return std::max<size_t>(n_ * sizeof(T), 256); }

 private:
  void reset() {
    if (p_) cudaFree(p_);
    p_ = nullptr;
  }
  T* p_ = nullptr;
  size_t n_ = 0;
};

// Page-locked host memory of n elements.
template <typename T>
class PinnedArray {
 public:
  PinnedArray() = default;
  explicit PinnedArray(size_t n) : n_(n) {
    void* p = nullptr;
    check(cudaMallocHost(&p, std::max<size_t>(n * sizeof(T), 64)), "cudaMallocHost");
    p_ = static_cast<T*>(p);
  }
  PinnedArray(PinnedArray&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  PinnedArray& operator=(PinnedArray&& o) noexcept {
    if (this != &o) {
      if (p_) cudaFreeHost(p_);
      p_ = std::exchange(o.p_, nullptr);
      n_ = std::exchange(o.n_, 0);
    }
    return *this;
  }
  ~PinnedArray() {
    if (p_) cudaFreeHost(p_);
  }
  T* get() const { return p_; }
  size_t size() const { return n_; }

 private:
  T* p_ = nullptr;
  size_t n_ = 0;
};

class Stream {
 public:
  Stream() { check(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking), "cudaStreamCreate"); }
  // The device's most urgent priority: its blocks are scheduled before other streams' waiting ones.
  struct Urgent {};
  explicit Stream(Urgent) {
    int least = 0, greatest = 0;
    check(cudaDeviceGetStreamPriorityRange(&least, &greatest), "cudaDeviceGetStreamPriorityRange");
    check(cudaStreamCreateWithPriority(&s_, cudaStreamNonBlocking, greatest), "cudaStreamCreateWithPriority");
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  ~Stream() {
    cudaStreamSynchronize(s_);
    cudaStreamDestroy(s_);
  }
  cudaStream_t get() const { return s_; }

 private:
  cudaStream_t s_ = nullptr;
};

class Event {
 public:
  Event() { check(cudaEventCreate(&e_), "cudaEventCreate"); }
  Event(Event&& o) noexcept : e_(std::exchange(o.e_, nullptr)) {}
  Event& operator=(Event&&) = delete;
  Event(const Event&) = delete;
  ~Event() {
    if (e_) cudaEventDestroy(e_);
  }
  cudaEvent_t get() const { return e_; }

 private:
  cudaEvent_t e_ = nullptr;
};

class GraphExec {
 public:
  GraphExec() = default;
  explicit GraphExec(cudaGraph_t g) { check(cudaGraphInstantiate(&e_, g, 0), "cudaGraphInstantiate"); }
  GraphExec(GraphExec&& o) noexcept : e_(std::exchange(o.e_, nullptr)) {}
  GraphExec& operator=(GraphExec&& o) noexcept {
    if (this != &o) {
      if (e_) cudaGraphExecDestroy(e_);
      e_ = std::exchange(o.e_, nullptr);
    }
    return *this;
  }
  ~GraphExec() {
    if (e_) cudaGraphExecDestroy(e_);
  }
  cudaGraphExec_t get() const { return e_; }

 private:
  cudaGraphExec_t e_ = nullptr;
};

// One device: selected (cudaSetDevice) by the constructor and by make_current(), with its
// properties and the kernel attributes the backend's kernels need set once for it.
struct DeviceContext {
  explicit DeviceContext(int device);
  void make_current() const;
  int device = 0;
  int sm_count = 0;
  std::string name;
};

}  // namespace minfer::cuda
