#include "backend/cuda/weights.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <mutex>
#include <thread>

#include "quant/quant.h"
#include "util/error.h"
#include "util/progress.h"

namespace minfer::cuda {
namespace {

int64_t align_up(int64_t n, int64_t a) { return (n + a - 1) / a * a; }

// The tensor as f32 values, whatever its (dequantizable) type.
std::vector<float> to_f32(const Tensor& t) {
  if (!can_dequantize(t.type) || t.shape.empty() || t.shape[0] % type_traits(t.type).block_size != 0)
    fail("tensor ", t.name, " has type ", type_traits(t.type).name, ", which the CUDA backend cannot read");
  std::vector<float> v(size_t(t.n_elements()));
  const int64_t row = t.shape[0];
  for (int64_t r = 0; r < t.rows(); ++r)
    dequantize_row(t.type, t.data + size_t(r) * row_bytes(t.type, row), v.data() + r * row, row);
  return v;
}

struct Chunk {
  const uint8_t* src;
  uint8_t* dst;
  size_t bytes;
};

// mmap -> pinned staging -> device with several threads, each with two staging buffers and a
// stream: a thread copies a chunk from the mapping (faulting the pages in) while its previous
// chunk's DMA runs.
void upload_chunks(const std::vector<Chunk>& chunks, int64_t payload, int device) {
  constexpr size_t kChunk = size_t(16) << 20;
  const int n_threads = int(std::clamp<unsigned>(std::thread::hardware_concurrency(), 1u, 8u));
  std::atomic<size_t> next{0};
  std::atomic<int64_t> done{0};
  std::atomic<bool> failed{false};
  std::string error;
  std::mutex error_mu;
  auto worker = [&] {
    cudaStream_t s = nullptr;
    void* staging[2] = {nullptr, nullptr};
    cudaEvent_t free_again[2] = {nullptr, nullptr};
    try {
      check(cudaSetDevice(device), "cudaSetDevice");
      check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
      for (int b = 0; b < 2; ++b) {
        check(cudaMallocHost(&staging[b], kChunk), "cudaMallocHost");
        check(cudaEventCreateWithFlags(&free_again[b], cudaEventDisableTiming), "cudaEventCreate");
      }
      for (int b = 0;; b ^= 1) {
        const size_t i = next.fetch_add(1);
        if (i >= chunks.size() || failed) break;
        check(cudaEventSynchronize(free_again[b]), "cudaEventSynchronize");
        std::memcpy(staging[b], chunks[i].src, chunks[i].bytes);
        check(cudaMemcpyAsync(chunks[i].dst, staging[b], chunks[i].bytes, cudaMemcpyHostToDevice, s),
              "cudaMemcpyAsync (weights)");
        check(cudaEventRecord(free_again[b], s), "cudaEventRecord");
        done += int64_t(chunks[i].bytes);
      }
      check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
    } catch (const Error& e) {
      std::lock_guard<std::mutex> lock(error_mu);
      error = e.what();
      failed = true;
    }
    for (int b = 0; b < 2; ++b) {
      if (staging[b]) cudaFreeHost(staging[b]);
      if (free_again[b]) cudaEventDestroy(free_again[b]);
    }
    if (s) cudaStreamDestroy(s);
  };
  std::vector<std::thread> threads;
  for (int i = 0; i < n_threads; ++i) threads.emplace_back(worker);
  const bool progress = payload > (int64_t(256) << 20);
  const auto bar = progress ? stderr_progress_bar(str_cat("loading ", payload >> 20, " MiB of weights to the GPU"))
                            : std::function<void(double)>();
  if (bar) {
    while (done < payload && !failed) {
      bar(double(done) / double(payload));
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  for (auto& t : threads) t.join();
  if (failed) fail(error);
  if (bar) bar(1.0);
}

}  // namespace

DeviceWeights::DeviceWeights(const Model& model, const Graph& graph, UploadStats& stats) {
  std::vector<const Tensor*> matrices, vectors;
  auto add = [](std::vector<const Tensor*>& list, const Tensor* t) {
    if (t && std::find(list.begin(), list.end(), t) == list.end()) list.push_back(t);
  };
  for (const Node& n : graph.nodes) {
    if (n.op == Op::RmsNorm) add(vectors, n.weight);
    else add(matrices, n.weight);
    add(vectors, n.bias);
  }

  int64_t total = 0;
  std::vector<int64_t> offsets;
  for (const Tensor* t : matrices) {
    if (!cuda_supports_weight_type(t->type))
      fail("tensor ", t->name, " has type ", type_traits(t->type).name, ", which the CUDA backend does not support");
    const int64_t cols = t->shape.empty() ? 1 : t->shape[0];
    if (cols % type_traits(t->type).block_size != 0 || (cols % 8 != 0 && t->rows() > 1))
      fail("tensor ", t->name, ": row length ", cols, " does not suit the CUDA kernels");
    offsets.push_back(total);
    total += align_up(int64_t(t->nbytes) + 16, 256);  // +16: kernels read one word past a run
  }
  arena_ = DeviceArray<uint8_t>(size_t(std::max<int64_t>(total, 256)), "cudaMalloc (weights)");
  stats.bytes = total;
  constexpr size_t kChunk = size_t(16) << 20;
  std::vector<Chunk> chunks;
  int64_t payload = 0;
  for (size_t i = 0; i < matrices.size(); ++i) {
    const Tensor* t = matrices[i];
    uint8_t* dst = arena_.get() + offsets[i];
    for (size_t off = 0; off < t->nbytes; off += kChunk)
      chunks.push_back({t->data + off, dst + off, std::min(kChunk, size_t(t->nbytes - off))});
    payload += int64_t(t->nbytes);
    mats_[t] = DevMat{t->type, int(t->rows()), int(t->shape.empty() ? 1 : t->shape[0]), dst};
  }
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  const auto t0 = std::chrono::steady_clock::now();
  upload_chunks(chunks, payload, device);
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  std::vector<float> host;
  std::vector<size_t> vec_offsets;
  for (const Tensor* t : vectors) {
    vec_offsets.push_back(host.size());
    const std::vector<float> v = to_f32(*t);
    host.insert(host.end(), v.begin(), v.end());
    host.resize(size_t(align_up(int64_t(host.size()), 64)));
  }
  vec_arena_ = DeviceArray<float>(host.size());
  check(cudaMemcpy(vec_arena_.get(), host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice),
        "cudaMemcpy (norms, biases)");
  for (size_t i = 0; i < vectors.size(); ++i) vecs_[vectors[i]] = vec_arena_.get() + vec_offsets[i];

  const HParams& hp = model.hp;
  const std::vector<float> divisors = model.rope_freqs ? to_f32(*model.rope_freqs) : std::vector<float>();
  if (model.rope_freqs && divisors.size() < size_t(hp.head_dim / 2))
    fail("tensor rope_freqs.weight has ", divisors.size(), " values, fewer than head_dim / 2 = ", hp.head_dim / 2);
  std::vector<float> inv(size_t(hp.head_dim / 2));
  for (int j = 0; j < hp.head_dim / 2; ++j) {
    double f = std::pow(double(hp.rope_base), -2.0 * j / hp.head_dim) * hp.rope_freq_scale;
    if (model.rope_freqs) f /= double(divisors[size_t(j)]);
    inv[size_t(j)] = float(f);
  }
  inv_freq_ = DeviceArray<float>(inv.size());
  check(cudaMemcpy(inv_freq_.get(), inv.data(), inv.size() * sizeof(float), cudaMemcpyHostToDevice), "cudaMemcpy (rope)");
}

}  // namespace minfer::cuda
