#include "backend/cuda/cuda_backend.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

#include "backend/cuda/kernels.h"
#include "backend/cuda/prefill.h"
#include "util/error.h"
#include "util/progress.h"

namespace minfer {

namespace cuda {
namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail("CUDA ", what, ": ", cudaGetErrorString(e));
}

bool env_off(const char* name) {
  const char* v = std::getenv(name);
  return v && *v && std::strcmp(v, "0") != 0;
}

int64_t align_up(int64_t n, int64_t a) { return (n + a - 1) / a * a; }

template <typename T>
T* device_alloc(size_t count, int64_t& total) {
  void* p = nullptr;
  const size_t bytes = std::max<size_t>(count * sizeof(T), 256);
  check(cudaMalloc(&p, bytes), "cudaMalloc");
  total += int64_t(bytes);
  return static_cast<T*>(p);
}

}  // namespace

Fusions Fusions::from_env() {
  Fusions f;
  f.decode_a_fuse = !env_off("MINFER_NO_DECODE_A_FUSE");
  f.cuda_graph = !env_off("MINFER_NO_CUDA_GRAPH");
  f.fused_qkv = !env_off("MINFER_NO_FUSED_QKV");
  f.fused_ffn = !env_off("MINFER_NO_FUSED_FFN");
  f.fused_residual = !env_off("MINFER_NO_FUSED_RESIDUAL");
  return f;
}

Fusions Fusions::none() { return {false, false, false, false, false}; }

enum class Mode { LastLogits, AllLogits, Greedy };

// Pinned host block the decode graph reads its inputs from (position, tokens) and writes its
// result into; the graph's memcpy nodes point here, so a replay only needs these bytes updated.
struct HostIo {
  int32_t pos;
  int32_t result;
  int32_t tokens[1];  // max_batch entries
};

struct CudaBackend::Impl {
  const Model& model;
  const Graph& graph;
  const HParams& hp;
  Fusions fusions;
  cudaStream_t stream = nullptr;
  int n_sms = 0;

  // weights
  uint8_t* arena = nullptr;
  std::map<const Tensor*, DevMat> weights;
  float* inv_freq = nullptr;

  // sized by reserve()
  int n_ctx = 0, max_batch = 0;
  std::vector<uint16_t*> k_cache, v_cache;
  float* slots[kNumSlots] = {};
  uint8_t* q8 = nullptr;        // pad40 activation plane
  uint16_t* bf16 = nullptr;     // prefill activation plane
  float* attn_part = nullptr;
  int decode_splits = 1;
  int32_t* d_io = nullptr;      // device copy of HostIo (pos, result, tokens)
  HostIo* h_io = nullptr;
  float* h_logits = nullptr;    // pinned, one row of logits
  std::vector<void*> allocations;

  // decode graphs by mode
  cudaGraphExec_t graph_exec[3] = {nullptr, nullptr, nullptr};

  // issue-time state
  struct MmqCache {
    const float* src = nullptr;
    int n = 0, dim = 0;
    const uint8_t* q8 = nullptr;
    void clear() { src = nullptr; }
  } mmq;
  int kv_written_layer = -1;

  // census
  bool timing = false;
  struct Mark {
    const char* name;
    cudaEvent_t start, stop;
  };
  std::vector<Mark> marks;
  std::vector<cudaEvent_t> event_pool;
  size_t events_used = 0;

  int step = 0;

  Impl(const Model& m, const Graph& g, Fusions f) : model(m), graph(g), hp(m.hp), fusions(f) {}

  const DevMat& mat(const Tensor* t) const { return weights.at(t); }
  const float* f32(const Tensor* t) const {
    return t ? reinterpret_cast<const float*>(weights.at(t).data) : nullptr;
  }
  int width(int slot) const { return int(graph.slot_width[size_t(slot)]); }
  const int* d_pos() const { return d_io; }
  const int32_t* d_tokens() const { return d_io + 2; }

  cudaEvent_t next_event() {
    if (events_used == event_pool.size()) {
      cudaEvent_t e;
      check(cudaEventCreate(&e), "cudaEventCreate");
      event_pool.push_back(e);
    }
    return event_pool[events_used++];
  }
  // Brackets one kernel launch with events when taking a census.
  template <typename F>
  void launch(const char* name, F&& fn) {
    if (!timing) {
      fn();
      return;
    }
    Mark m{name, next_event(), next_event()};
    check(cudaEventRecord(m.start, stream), "cudaEventRecord");
    fn();
    check(cudaEventRecord(m.stop, stream), "cudaEventRecord");
    marks.push_back(m);
  }

  void upload_weights(LoadStats& stats);
  void reserve(int n_ctx_, int max_batch_, LoadStats& stats);
  void run(const Batch& b, Mode mode);
  void issue(int n, Mode mode, const Fusions& f, bool dump);
  size_t issue_node(size_t i, int n, Mode mode, const Fusions& f);
  size_t try_fused_qkv(size_t i, const Fusions& f);
  size_t try_fused_ffn(size_t i, const Fusions& f);
  const uint8_t* quantized(const float* x, int n, int dim, int ld, const Fusions& f);
  void matmul(const Tensor* w, const Tensor* bias, const float* x, int ld_x, int n, float* out,
              int ld_out, const float* residual, const Fusions& f);
  bool slot_read_before_write(size_t from, int slot) const;
  KvLayer kv_layer(int layer) const {
    return {k_cache[size_t(layer)], v_cache[size_t(layer)], n_ctx, hp.n_head_kv, hp.head_dim};
  }
  RopeParams rope() const { return {inv_freq, hp.head_dim, hp.rope_type == RopeType::NeoX}; }
};

// ---- weights: mmap -> pinned staging -> device, several threads ------------------------------
void CudaBackend::Impl::upload_weights(LoadStats& stats) {
  std::vector<const Tensor*> tensors;
  auto want = [&](const Tensor* t) {
    if (t && !weights.count(t) && std::find(tensors.begin(), tensors.end(), t) == tensors.end())
      tensors.push_back(t);
  };
  for (const Node& n : graph.nodes) {
    want(n.weight);
    want(n.bias);
  }
  int64_t total = 0;
  std::vector<int64_t> offsets;
  for (const Tensor* t : tensors) {
    if (!cuda_supports_weight_type(t->type))
      fail("tensor ", t->name, " has type ", type_traits(t->type).name,
           ", which the CUDA backend does not support");
    const int64_t cols = t->shape.empty() ? 1 : t->shape[0];
    if (cols % type_traits(t->type).block_size != 0 || (cols % 8 != 0 && t->rows() > 1))
      fail("tensor ", t->name, ": row length ", cols, " does not suit the CUDA kernels");
    offsets.push_back(total);
    total += align_up(int64_t(t->nbytes) + 16, 256);  // +16: kernels read one word past a run
  }
  void* p = nullptr;
  check(cudaMalloc(&p, size_t(std::max<int64_t>(total, 256))), "cudaMalloc (weights)");
  arena = static_cast<uint8_t*>(p);
  allocations.push_back(p);
  stats.weight_bytes = total;

  struct Chunk {
    const uint8_t* src;
    uint8_t* dst;
    size_t bytes;
  };
  constexpr size_t kChunk = size_t(16) << 20;
  std::vector<Chunk> chunks;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor* t = tensors[i];
    for (size_t off = 0; off < t->nbytes; off += kChunk)
      chunks.push_back({t->data + off, arena + offsets[i] + off, std::min(kChunk, size_t(t->nbytes - off))});
    DevMat m;
    m.type = t->type;
    m.cols = int(t->shape.empty() ? 1 : t->shape[0]);
    m.rows = int(t->rows());
    m.data = arena + offsets[i];
    weights[t] = m;
  }

  const auto t0 = std::chrono::steady_clock::now();
  const int n_threads = int(std::clamp<unsigned>(std::thread::hardware_concurrency(), 1u, 8u));
  std::atomic<size_t> next{0};
  std::atomic<int64_t> done{0};
  std::atomic<bool> failed{false};
  std::string error;
  std::mutex error_mu;
  const bool progress = total > (int64_t(256) << 20);
  auto worker = [&] {
    cudaStream_t s = nullptr;
    void* staging[2] = {nullptr, nullptr};
    cudaEvent_t free_again[2] = {nullptr, nullptr};
    try {
      check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
      for (int b = 0; b < 2; ++b) {
        check(cudaMallocHost(&staging[b], kChunk), "cudaMallocHost");
        check(cudaEventCreateWithFlags(&free_again[b], cudaEventDisableTiming), "cudaEventCreate");
      }
      for (int b = 0;; b ^= 1) {
        const size_t i = next.fetch_add(1);
        if (i >= chunks.size() || failed) break;
        check(cudaEventSynchronize(free_again[b]), "cudaEventSynchronize");
        std::memcpy(staging[b], chunks[i].src, chunks[i].bytes);  // faults the mapping in
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
  const auto bar = progress ? stderr_progress_bar(str_cat("loading ", total >> 20, " MiB of weights to the GPU"))
                            : std::function<void(double)>();
  if (bar) {
    int64_t payload = 0;
    for (const Tensor* t : tensors) payload += int64_t(t->nbytes);
    while (done < payload && !failed) {
      bar(double(done) / double(payload));
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  for (auto& t : threads) t.join();
  if (failed) fail(error);
  if (bar) bar(1.0);
  stats.upload_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  // rope: theta_j = pos * inv_freq[j]
  std::vector<float> inv(size_t(hp.head_dim / 2));
  for (int j = 0; j < hp.head_dim / 2; ++j) {
    double f = std::pow(double(hp.rope_base), -2.0 * j / hp.head_dim) * hp.rope_freq_scale;
    if (model.rope_freqs) f /= double(reinterpret_cast<const float*>(model.rope_freqs->data)[j]);
    inv[size_t(j)] = float(f);
  }
  int64_t unused = 0;
  inv_freq = device_alloc<float>(inv.size(), unused);
  allocations.push_back(inv_freq);
  check(cudaMemcpy(inv_freq, inv.data(), inv.size() * sizeof(float), cudaMemcpyHostToDevice),
        "cudaMemcpy (rope)");
}

void CudaBackend::Impl::reserve(int n_ctx_, int max_batch_, LoadStats& stats) {
  if (n_ctx_ <= 0 || max_batch_ <= 0)
    fail("cuda backend: invalid sizes n_ctx=", n_ctx_, " max_batch=", max_batch_);
  if (n_ctx) fail("cuda backend: reserve called twice");
  n_ctx = n_ctx_;
  max_batch = std::min(max_batch_, n_ctx_);
  const int64_t kv_width = int64_t(hp.n_head_kv) * hp.head_dim;
  const int64_t kv_bytes = int64_t(hp.n_layer) * 2 * n_ctx * kv_width * 2;
  size_t free_bytes = 0, total_bytes = 0;
  check(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
  if (kv_bytes > int64_t(free_bytes))
    fail("cuda backend: the KV cache for ", n_ctx, " positions needs ", kv_bytes / (1 << 20),
         " MiB but only ", free_bytes / (1 << 20), " MiB of GPU memory are free (lower -c)");
  for (int l = 0; l < hp.n_layer; ++l) {
    k_cache.push_back(device_alloc<uint16_t>(size_t(n_ctx * kv_width), stats.kv_bytes));
    v_cache.push_back(device_alloc<uint16_t>(size_t(n_ctx * kv_width), stats.kv_bytes));
    allocations.push_back(k_cache.back());
    allocations.push_back(v_cache.back());
  }
  int64_t max_width = 0;
  for (int s = 0; s < kNumSlots; ++s) {
    slots[s] = device_alloc<float>(size_t(max_batch * graph.slot_width[size_t(s)]), stats.workspace_bytes);
    allocations.push_back(slots[s]);
    max_width = std::max(max_width, graph.slot_width[size_t(s)]);
  }
  q8 = device_alloc<uint8_t>(size_t(max_batch * pad40_row_bytes(max_width)), stats.workspace_bytes);
  bf16 = device_alloc<uint16_t>(size_t(max_batch * max_width), stats.workspace_bytes);
  allocations.push_back(q8);
  allocations.push_back(bf16);
  decode_splits = std::max(1, (2 * n_sms + hp.n_head_kv - 1) / hp.n_head_kv);
  decode_splits = std::min(decode_splits, std::max(1, n_ctx / 32));
  attn_part = device_alloc<float>(
      size_t(attention_workspace_floats(1, hp.n_head, hp.head_dim, decode_splits)), stats.workspace_bytes);
  allocations.push_back(attn_part);
  d_io = device_alloc<int32_t>(size_t(2 + max_batch), stats.workspace_bytes);
  allocations.push_back(d_io);
  check(cudaMallocHost(reinterpret_cast<void**>(&h_io), sizeof(int32_t) * size_t(2 + max_batch)),
        "cudaMallocHost");
  check(cudaMallocHost(reinterpret_cast<void**>(&h_logits), sizeof(float) * size_t(hp.n_vocab)),
        "cudaMallocHost");
}

bool CudaBackend::Impl::slot_read_before_write(size_t from, int slot) const {
  for (size_t j = from; j < graph.nodes.size(); ++j) {
    const Node& n = graph.nodes[j];
    if (n.in[0] == slot || n.in[1] == slot || n.in[2] == slot) return true;
    if (n.out == slot && n.op != Op::Rope) return false;
  }
  return false;
}

// The MmqCache: a pad40 plane is a pure function of (src, n, dim); a producer epilogue records
// it, a matmul consults it, and any other node clears it. A hit re-checks that the plane still
// lives where it was recorded.
const uint8_t* CudaBackend::Impl::quantized(const float* x, int n, int dim, int ld, const Fusions& f) {
  if (f.decode_a_fuse && mmq.src == x && mmq.n == n && mmq.dim == dim && mmq.q8 == q8) return q8;
  launch("quantize_pad40", [&] { launch_quantize_pad40(x, ld, q8, n, dim, stream); });
  if (f.decode_a_fuse) mmq = {x, n, dim, q8};
  return q8;
}

void CudaBackend::Impl::matmul(const Tensor* w, const Tensor* bias, const float* x, int ld_x, int n,
                               float* out, int ld_out, const float* residual, const Fusions& f) {
  const DevMat& m = mat(w);
  if (n > 1 && prefill_gemm_supports(m.type) && m.rows % 2 == 0 && ld_out % 2 == 0 &&
      m.cols % (type_traits(m.type).block_size == 256 ? 256 : 64) == 0 && ld_x % 8 == 0) {
    launch("prefill_activation_bf16",
           [&] { launch_prefill_activation_bf16(x, bf16, int64_t(n) * ld_x, stream); });
    PrefillGemm g;
    g.w_type = m.type;
    g.w = m.data;
    g.n = m.rows;
    g.k = m.cols;
    g.x = bf16;
    g.ldx = ld_x;
    g.m = n;
    g.y = out;
    g.ldy = ld_out;
    g.bias = f32(bias);
    g.residual = residual;
    launch("prefill_gemm", [&] { launch_prefill_gemm(g, stream); });
    return;
  }
  const bool quant = type_traits(m.type).quantized;
  const uint8_t* a = quant ? quantized(x, n, m.cols, ld_x, f) : nullptr;
  MatSeg seg;
  seg.w = m;
  seg.bias = f32(bias);
  seg.residual = residual;
  seg.out = out;
  seg.ld_out = ld_out;
  launch("matvec", [&] {
    launch_matvec(&seg, 1, a, pad40_row_bytes(m.cols), x, ld_x, n, MatVecExtra{}, stream);
  });
}

size_t CudaBackend::Impl::try_fused_qkv(size_t i, const Fusions& f) {
  const auto& N = graph.nodes;
  if (!f.fused_qkv || i + 5 >= N.size()) return 0;
  const Node &q = N[i], &k = N[i + 1], &v = N[i + 2], &rq = N[i + 3], &rk = N[i + 4], &at = N[i + 5];
  if (q.op != Op::MatMul || k.op != Op::MatMul || v.op != Op::MatMul || rq.op != Op::Rope ||
      rk.op != Op::Rope || at.op != Op::Attention)
    return 0;
  if (k.in[0] != q.in[0] || v.in[0] != q.in[0] || rq.out != q.out || rk.out != k.out ||
      at.in[0] != q.out || at.in[1] != k.out || at.in[2] != v.out)
    return 0;
  const float* x = slots[q.in[0]];
  const int dim = width(q.in[0]);
  bool any_quant = false;
  for (const Node* n : {&q, &k, &v}) any_quant |= type_traits(n->weight->type).quantized;
  const uint8_t* a = any_quant ? quantized(x, 1, dim, dim, f) : nullptr;
  MatSeg segs[3];
  const Node* nodes[3] = {&q, &k, &v};
  const Epilogue epi[3] = {Epilogue::RopeQ, Epilogue::RopeK, Epilogue::StoreV};
  for (int s = 0; s < 3; ++s) {
    segs[s].w = mat(nodes[s]->weight);
    segs[s].bias = f32(nodes[s]->bias);
    segs[s].out = slots[nodes[s]->out];
    segs[s].ld_out = width(nodes[s]->out);
    segs[s].epi = epi[s];
  }
  MatVecExtra extra;
  extra.rope = rope();
  extra.pos = d_pos();
  extra.kv = kv_layer(at.layer);
  launch("matvec_qkv_rope_kv", [&] {
    launch_matvec(segs, 3, a, pad40_row_bytes(dim), x, dim, 1, extra, stream);
  });
  kv_written_layer = at.layer;
  return 5;
}

size_t CudaBackend::Impl::try_fused_ffn(size_t i, const Fusions& f) {
  const auto& N = graph.nodes;
  if (!f.fused_ffn || i + 2 >= N.size()) return 0;
  const Node &g = N[i], &u = N[i + 1], &sw = N[i + 2];
  if (g.op != Op::MatMul || u.op != Op::MatMul || sw.op != Op::SwiGLU || u.in[0] != g.in[0] ||
      sw.in[0] != g.out || sw.in[1] != u.out || g.bias || u.bias)
    return 0;
  const float* x = slots[g.in[0]];
  const int dim = width(g.in[0]);
  const bool any_quant =
      type_traits(g.weight->type).quantized || type_traits(u.weight->type).quantized;
  const uint8_t* a = any_quant ? quantized(x, 1, dim, dim, f) : nullptr;
  MatSeg segs[2];
  const Node* nodes[2] = {&g, &u};
  for (int s = 0; s < 2; ++s) {
    segs[s].w = mat(nodes[s]->weight);
    segs[s].out = slots[nodes[s]->out];
    segs[s].ld_out = width(nodes[s]->out);
  }
  launch("matvec_gate_up", [&] {
    launch_matvec(segs, 2, a, pad40_row_bytes(dim), x, dim, 1, MatVecExtra{}, stream);
  });
  // the SwiGLU node as the unfused path runs it (the cache is cleared and re-recorded)
  mmq.clear();
  const int w = width(sw.out);
  const bool fuse_q = f.decode_a_fuse && w % 32 == 0;
  launch(fuse_q ? "swiglu_quant_pad40" : "swiglu", [&] {
    launch_swiglu(slots[sw.in[0]], slots[sw.in[1]], slots[sw.out], 1, w, fuse_q ? q8 : nullptr, stream);
  });
  if (fuse_q) mmq = {slots[sw.out], 1, w, q8};
  return 3;
}

size_t CudaBackend::Impl::issue_node(size_t i, int n, Mode mode, const Fusions& f) {
  const Node& node = graph.nodes[i];
  if (node.op != Op::MatMul && node.op != Op::Output) mmq.clear();  // both consume planes
  const bool decode = n == 1;
  if (decode && node.op == Op::MatMul) {
    if (size_t used = try_fused_qkv(i, f)) return used;
    if (size_t used = try_fused_ffn(i, f)) return used;
  }
  const int w = width(node.out);
  float* out = slots[node.out];
  const float* in0 = node.in[0] >= 0 ? slots[node.in[0]] : nullptr;
  switch (node.op) {
    case Op::Embed:
      launch("embed", [&] { launch_embed(mat(node.weight), d_tokens(), out, n, stream); });
      return 1;
    case Op::RmsNorm: {
      const bool fuse_q = decode && f.decode_a_fuse && node.group == 0 && w % 32 == 0;
      const int in_w = width(node.in[0]);
      launch(fuse_q ? "rms_norm_quant_pad40" : "rms_norm", [&] {
        launch_rms_norm(in0, in_w, f32(node.weight), out, w, n, w, node.group, hp.rms_eps,
                        fuse_q ? q8 : nullptr, stream);
      });
      if (fuse_q) mmq = {out, 1, w, q8};
      return 1;
    }
    case Op::MatMul: {
      const int in_w = width(node.in[0]);
      // residual add folded into the epilogue: out' = residual + W x (+ bias)
      if (f.fused_residual && i + 1 < graph.nodes.size()) {
        const Node& add = graph.nodes[i + 1];
        const int other = add.in[0] == node.out ? add.in[1] : (add.in[1] == node.out ? add.in[0] : -1);
        if (add.op == Op::Add && other >= 0 && other != node.out && width(other) == w &&
            !slot_read_before_write(i + 2, node.out)) {
          matmul(node.weight, node.bias, in0, in_w, n, slots[add.out], w, slots[other], f);
          mmq.clear();
          return 2;
        }
      }
      matmul(node.weight, node.bias, in0, in_w, n, out, w, nullptr, f);
      return 1;
    }
    case Op::Rope:
      launch("rope", [&] { launch_rope(out, w, n, node.n_heads, rope(), d_pos(), stream); });
      return 1;
    case Op::Attention: {
      const KvLayer kv = kv_layer(node.layer);
      if (kv_written_layer != node.layer) {
        launch("kv_append", [&] {
          launch_kv_append(slots[node.in[1]], slots[node.in[2]], n, kv, d_pos(), stream);
        });
      }
      kv_written_layer = -1;
      if (!decode && (hp.head_dim == 64 || hp.head_dim == 128)) {
        PrefillAttention pa;
        pa.q = slots[node.in[0]];
        pa.ldq = width(node.in[0]);
        pa.k_cache = kv.k;
        pa.v_cache = kv.v;
        pa.ld_kv = int64_t(hp.n_head_kv) * hp.head_dim;
        pa.out = out;
        pa.ldo = w;
        pa.m = n;
        pa.pos0 = h_io->pos;
        pa.n_head = node.n_heads;
        pa.n_kv_head = hp.n_head_kv;
        pa.head_dim = hp.head_dim;
        pa.scale = 1.0f / std::sqrt(float(hp.head_dim));
        launch("prefill_attention", [&] { launch_prefill_attention(pa, stream); });
        return 1;
      }
      AttnParams p;
      p.q = slots[node.in[0]];
      p.out = out;
      p.kv = kv;
      p.n_head = node.n_heads;
      p.n_tokens = n;
      p.pos = d_pos();
      p.n_splits = decode ? decode_splits : 1;
      p.part = attn_part;
      if (!decode) fail("cuda backend: multi-token attention needs head_dim 64 or 128");
      launch("attention_split_combine", [&] { launch_attention(p, stream); });
      return 1;
    }
    case Op::SwiGLU: {
      const bool fuse_q = decode && f.decode_a_fuse && w % 32 == 0;
      launch(fuse_q ? "swiglu_quant_pad40" : "swiglu", [&] {
        launch_swiglu(in0, slots[node.in[1]], out, n, w, fuse_q ? q8 : nullptr, stream);
      });
      if (fuse_q) mmq = {out, 1, w, q8};
      return 1;
    }
    case Op::Add:
      launch("add", [&] { launch_add(in0, slots[node.in[1]], out, int64_t(n) * w, stream); });
      return 1;
    case Op::Output: {
      const int rows = mode == Mode::AllLogits ? n : 1;
      const int in_w = width(node.in[0]);
      matmul(node.weight, nullptr, in0 + int64_t(n - rows) * in_w, in_w, rows, out, w, nullptr, f);
      if (mode == Mode::Greedy)
        launch("argmax", [&] { launch_argmax(out, w, d_io + 1, stream); });
      return 1;
    }
  }
  return 1;
}

void CudaBackend::Impl::issue(int n, Mode mode, const Fusions& f, bool dump) {
  mmq.clear();
  kv_written_layer = -1;
  for (size_t i = 0; i < graph.nodes.size();) {
    const size_t used = issue_node(i, n, mode, f);
    if (dump) {
      const Node& node = graph.nodes[i];
      const int64_t rows = node.op == Op::Output && mode != Mode::AllLogits ? 1 : n;
      const int64_t w = width(node.out);
      std::vector<float> host(size_t(rows * w));
      check(cudaMemcpyAsync(host.data(), slots[node.out], host.size() * sizeof(float),
                            cudaMemcpyDeviceToHost, stream), "cudaMemcpy (dump)");
      check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
      dump_node(step, int(i), node.name, rows, w, host.data());
    }
    i += used;
  }
}

void CudaBackend::Impl::run(const Batch& b, Mode mode) {
  const int n = int(b.tokens.size());
  if (!n_ctx) fail("cuda backend: forward before reserve");
  if (n == 0 || n > max_batch) fail("cuda backend: batch of ", n, " tokens (allowed 1 .. ", max_batch, ")");
  if (b.pos < 0 || int64_t(b.pos) + n > n_ctx)
    fail("cuda backend: positions ", b.pos, " .. ", int64_t(b.pos) + n - 1,
         " do not fit the KV cache of ", n_ctx, " positions");
  for (int t = 0; t < n; ++t) {
    if (b.tokens[size_t(t)] < 0 || b.tokens[size_t(t)] >= hp.n_vocab)
      fail("cuda backend: token id ", b.tokens[size_t(t)], " outside the vocabulary of ", hp.n_vocab);
    h_io->tokens[t] = b.tokens[size_t(t)];
  }
  h_io->pos = b.pos;
  if (mode == Mode::AllLogits && n == 1) mode = Mode::LastLogits;
  const bool dump = dump_enabled();
  const Fusions f = dump ? Fusions::none() : fusions;
  const size_t io_bytes = sizeof(int32_t) * size_t(2 + n);

  auto record_step = [&] {
    check(cudaMemcpyAsync(d_io, h_io, io_bytes, cudaMemcpyHostToDevice, stream), "cudaMemcpyAsync (io)");
    issue(n, mode, f, dump);
    if (mode == Mode::Greedy)
      check(cudaMemcpyAsync(&h_io->result, d_io + 1, sizeof(int32_t), cudaMemcpyDeviceToHost, stream),
            "cudaMemcpyAsync (token)");
    else if (mode == Mode::LastLogits)
      check(cudaMemcpyAsync(h_logits, slots[kLogits], sizeof(float) * size_t(hp.n_vocab),
                            cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync (logits)");
  };

  if (n == 1 && f.cuda_graph && !dump && !timing) {
    cudaGraphExec_t& exec = graph_exec[int(mode)];
    if (!exec) {
      cudaGraph_t g = nullptr;
      check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
      try {
        record_step();
      } catch (...) {
        cudaStreamEndCapture(stream, &g);
        if (g) cudaGraphDestroy(g);
        throw;
      }
      check(cudaStreamEndCapture(stream, &g), "cudaStreamEndCapture");
      check(cudaGraphInstantiate(&exec, g, 0), "cudaGraphInstantiate");
      cudaGraphDestroy(g);
    }
    check(cudaGraphLaunch(exec, stream), "cudaGraphLaunch");
  } else {
    record_step();
  }
  check(cudaStreamSynchronize(stream), "forward");
  ++step;
}

}  // namespace cuda

using cuda::CudaBackend;

CudaBackend::CudaBackend(const Model& model, const Graph& graph, Fusions fusions)
    : impl_(std::make_unique<Impl>(model, graph, fusions)), fusions_(fusions) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0)
    fail("cuda backend: no CUDA device found (use --backend cpu)");
  cudaDeviceProp prop{};
  cuda::check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  impl_->n_sms = prop.multiProcessorCount;
  cuda::check(cudaStreamCreateWithFlags(&impl_->stream, cudaStreamNonBlocking), "cudaStreamCreate");
  impl_->upload_weights(stats_);
}

CudaBackend::~CudaBackend() {
  Impl& m = *impl_;
  if (m.stream) cudaStreamSynchronize(m.stream);
  for (auto& e : m.graph_exec)
    if (e) cudaGraphExecDestroy(e);
  for (cudaEvent_t e : m.event_pool) cudaEventDestroy(e);
  for (void* p : m.allocations) cudaFree(p);
  if (m.h_io) cudaFreeHost(m.h_io);
  if (m.h_logits) cudaFreeHost(m.h_logits);
  if (m.stream) cudaStreamDestroy(m.stream);
}

void CudaBackend::reserve(int n_ctx, int max_batch) {
  impl_->reserve(n_ctx, max_batch, stats_);
  max_batch_ = impl_->max_batch;
}

void CudaBackend::forward(const Batch& batch, std::vector<float>& logits) {
  const cuda::Mode mode = batch.all_logits ? cuda::Mode::AllLogits : cuda::Mode::LastLogits;
  impl_->run(batch, mode);
  const int vocab = impl_->hp.n_vocab;
  const int rows = batch.all_logits ? int(batch.tokens.size()) : 1;
  logits.resize(size_t(rows) * size_t(vocab));
  if (rows == 1) {
    std::memcpy(logits.data(), impl_->h_logits, sizeof(float) * size_t(vocab));
  } else {
    cuda::check(cudaMemcpy(logits.data(), impl_->slots[kLogits], logits.size() * sizeof(float),
                           cudaMemcpyDeviceToHost), "cudaMemcpy (logits)");
  }
}

int32_t CudaBackend::forward_greedy(const Batch& batch) {
  impl_->run(batch, cuda::Mode::Greedy);
  return impl_->h_io->result;
}

std::vector<cuda::KernelTime> CudaBackend::census(int32_t token, int pos) {
  Impl& m = *impl_;
  m.timing = true;
  m.marks.clear();
  m.events_used = 0;
  const int32_t tok[1] = {token};
  try {
    m.run(Batch{std::span<const int32_t>(tok, 1), pos, false}, cuda::Mode::Greedy);
  } catch (...) {
    m.timing = false;
    throw;
  }
  m.timing = false;
  std::vector<cuda::KernelTime> out;
  for (const auto& mark : m.marks) {
    float ms = 0;
    cuda::check(cudaEventElapsedTime(&ms, mark.start, mark.stop), "cudaEventElapsedTime");
    auto it = std::find_if(out.begin(), out.end(), [&](auto& k) { return k.name == mark.name; });
    if (it == out.end()) it = out.insert(out.end(), {mark.name, 0, 0.0});
    it->launches += 1;
    it->microseconds += 1000.0 * ms;
  }
  return out;
}

double cuda::measure_copy_bandwidth() {
  const size_t bytes = size_t(1) << 30;
  void *a = nullptr, *b = nullptr;
  check(cudaMalloc(&a, bytes), "cudaMalloc");
  check(cudaMalloc(&b, bytes), "cudaMalloc");
  cudaMemset(a, 1, bytes);
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  std::vector<float> times;
  for (int r = 0; r < 8; ++r) {
    cudaEventRecord(e0);
    cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice);
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    if (r >= 2) times.push_back(ms);
  }
  std::sort(times.begin(), times.end());
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaFree(a);
  cudaFree(b);
  check(cudaGetLastError(), "copy bandwidth");
  return 2.0 * double(bytes) / (double(times[times.size() / 2]) * 1e-3);
}

std::string cuda::device_name() {
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) return "none";
  return prop.name;
}

std::unique_ptr<Backend> make_cuda_backend(const Model& model, const Graph& graph) {
  return std::make_unique<CudaBackend>(model, graph);
}

bool cuda_available() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

}  // namespace minfer
