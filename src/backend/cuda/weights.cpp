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

// `rows` GGUF rows of `cols` values of `type` from the mapping, to `dst` in the device layout.
struct Chunk {
  GgmlType type;
  int64_t cols;
  const uint8_t* src;
  uint8_t* dst;
  int64_t rows;
  size_t src_bytes() const { return size_t(rows) * row_bytes(type, cols); }
  size_t dst_bytes() const { return size_t(rows * device_row_bytes(type, cols)); }
};

constexpr size_t kChunk = size_t(16) << 20;  // staging bytes: a chunk's device layout fits

// mmap -> pinned staging (in the device layout) -> device with several threads, each with two
// staging buffers and a stream: a thread copies a chunk from the mapping (faulting the pages in)
// while its previous chunk's DMA runs.
void upload_chunks(const std::vector<Chunk>& chunks, int64_t payload, int device) {
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
        const Chunk& c = chunks[i];
        copy_rows_to_device_layout(c.type, c.cols, c.src, c.rows, static_cast<uint8_t*>(staging[b]));
        check(cudaMemcpyAsync(c.dst, staging[b], c.dst_bytes(), cudaMemcpyHostToDevice, s), "cudaMemcpyAsync (weights)");
        check(cudaEventRecord(free_again[b], s), "cudaEventRecord");
        done += int64_t(c.src_bytes());
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

int64_t device_row_bytes(GgmlType t, int64_t cols) {
  if (t == GgmlType::Q6_K) return q6k_device_row_bytes(cols / QK_K);
  return int64_t(row_bytes(t, cols));
}

void copy_rows_to_device_layout(GgmlType t, int64_t cols, const uint8_t* src, int64_t n_rows, uint8_t* dst) {
  const size_t src_row = row_bytes(t, cols), dst_row = size_t(device_row_bytes(t, cols));
  if (src_row == dst_row) {
    std::memcpy(dst, src, size_t(n_rows) * src_row);
    return;
  }
  const TypeTraits& tt = type_traits(t);  // q6_K: padded blocks, then the row's padding
  const int64_t blocks = cols / tt.block_size;
  const size_t pad = size_t(kQ6KDeviceBlockBytes) - tt.type_size, blocks_bytes = size_t(blocks) * kQ6KDeviceBlockBytes;
  for (int64_t r = 0; r < n_rows; ++r, src += src_row, dst += dst_row) {
    for (int64_t b = 0; b < blocks; ++b) {
      uint8_t* block = dst + b * kQ6KDeviceBlockBytes;
      std::memcpy(block, src + b * tt.type_size, tt.type_size);
      std::memset(block + tt.type_size, 0, pad);
    }
    std::memset(dst + blocks_bytes, 0, dst_row - blocks_bytes);
  }
}

std::vector<uint8_t> device_layout(GgmlType t, int64_t cols, const std::vector<uint8_t>& gguf_bytes) {
  const size_t row = cols > 0 && cols % type_traits(t).block_size == 0 ? row_bytes(t, cols) : 0;
  if (row == 0 || gguf_bytes.size() % row != 0)
    fail("device_layout: ", gguf_bytes.size(), " bytes are not whole ", type_traits(t).name, " rows of ", cols,
         " values");
  const int64_t n_rows = int64_t(gguf_bytes.size() / row);
  std::vector<uint8_t> out(size_t(n_rows * device_row_bytes(t, cols)));
  copy_rows_to_device_layout(t, cols, gguf_bytes.data(), n_rows, out.data());
  return out;
}

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
    total += align_up(t->rows() * device_row_bytes(t->type, cols), 256);
  }
  // Kernels that read a row of 2-byte-aligned blocks (q8_0 and the other 32-blocks) as aligned words
  // read up to one word past the row's last byte (ld_words_a2): inside the next matrix, or the
  // 256-byte alignment, except after the last one. The tail keeps that word in the allocation
  // (compute-sanitizer memcheck found it past the f16 default model's arena).
  arena_ = DeviceArray<uint8_t>(size_t(std::max<int64_t>(total + kWeightsTailBytes, 256)), "cudaMalloc (weights)");
  check(cudaMemset(arena_.get() + total, 0, size_t(kWeightsTailBytes)), "cudaMemset (weights' tail)");
  stats.bytes = total;
  std::vector<Chunk> chunks;
  int64_t payload = 0;
  for (size_t i = 0; i < matrices.size(); ++i) {
    const Tensor* t = matrices[i];
    const int64_t cols = t->shape.empty() ? 1 : t->shape[0], n_rows = t->rows();
    const int64_t src_row = int64_t(row_bytes(t->type, cols)), dst_row = device_row_bytes(t->type, cols);
    if (dst_row > int64_t(kChunk))
      fail("tensor ", t->name, ": a row of ", cols, " values exceeds the upload's staging buffer");
    const int64_t per_chunk = int64_t(kChunk) / dst_row;
    uint8_t* dst = arena_.get() + offsets[i];
    for (int64_t r = 0; r < n_rows; r += per_chunk)
      chunks.push_back({t->type, cols, t->data + r * src_row, dst + r * dst_row, std::min(per_chunk, n_rows - r)});
    payload += int64_t(t->nbytes);
    mats_[t] = DevMat{t->type, int(n_rows), int(cols), dst};
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
