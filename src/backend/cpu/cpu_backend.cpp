// The CPU reference backend: executes the graph node by node with the ops in ops.cpp, keeping an
// f32 KV cache per layer.
#include <map>

#include "backend/backend.h"
#include "backend/cpu/ops.h"
#include "quant/quant.h"
#include "util/error.h"

namespace minfer {
namespace {

class CpuBackend final : public Backend {
 public:
  CpuBackend(const Model& model, const Graph& graph, int n_threads)
      : model_(model), graph_(graph), pool_(n_threads) {
    for (const Node& node : graph_.nodes) {
      if (node.op == Op::MatMul || node.op == Op::Output) cpu::check_matmul_weight(*node.weight);
      if (node.op == Op::RmsNorm) keep_as_f32(node.weight);
      if (node.bias) keep_as_f32(node.bias);
    }
    if (!can_dequantize(model.token_embd->type))
      fail("tensor token_embd.weight has type ", type_traits(model.token_embd->type).name,
           ", which the CPU backend cannot read");
    if (model.rope_freqs) keep_as_f32(model.rope_freqs);
  }

  std::string name() const override { return "cpu"; }
  int max_batch() const override { return max_batch_; }

  void reserve(int n_ctx, int max_batch) override {
    if (n_ctx <= 0 || max_batch <= 0)
      fail("cpu backend: invalid sizes n_ctx=", n_ctx, " max_batch=", max_batch);
    const HParams& hp = model_.hp;
    n_ctx_ = n_ctx;
    max_batch_ = max_batch;
    const size_t cache_floats = size_t(n_ctx) * size_t(hp.n_head_kv) * size_t(hp.head_dim);
    k_cache_.assign(size_t(hp.n_layer), std::vector<float>(cache_floats));
    v_cache_.assign(size_t(hp.n_layer), std::vector<float>(cache_floats));
    for (int s = 0; s < kNumSlots; ++s)
      if (s != kLogits) slots_[size_t(s)].assign(size_t(max_batch) * size_t(graph_.slot_width[size_t(s)]), 0.0f);
  }

  void forward(const Batch& batch, std::vector<float>& logits) override {
    const HParams& hp = model_.hp;
    const int n_tokens = int(batch.tokens.size());
    if (max_batch_ == 0) fail("cpu backend: forward before reserve");
    if (n_tokens == 0 || n_tokens > max_batch_)
      fail("cpu backend: batch of ", n_tokens, " tokens (allowed 1 .. ", max_batch_, ")");
    if (batch.pos < 0 || int64_t(batch.pos) + n_tokens > n_ctx_)
      fail("cpu backend: positions ", batch.pos, " .. ", int64_t(batch.pos) + n_tokens - 1,
           " do not fit the KV cache of ", n_ctx_, " positions");

    const cpu::RopeTable rope = cpu::rope_table(
        batch.pos, n_tokens, hp.head_dim, hp.rope_base, hp.rope_freq_scale,
        model_.rope_freqs ? f32(model_.rope_freqs) : nullptr);
    const int n_out_rows = batch.all_logits ? n_tokens : 1;
    const bool dump = dump_enabled();

    for (size_t i = 0; i < graph_.nodes.size(); ++i) {
      const Node& node = graph_.nodes[i];
      const int64_t width = graph_.slot_width[size_t(node.out)];
      float* out = node.op == Op::Output ? nullptr : slot(node.out);
      const float* in0 = node.in[0] >= 0 ? slot(node.in[0]) : nullptr;
      const float* in1 = node.in[1] >= 0 ? slot(node.in[1]) : nullptr;
      int64_t rows = n_tokens;
      switch (node.op) {
        case Op::Embed:
          cpu::embed(*node.weight, batch.tokens, out);
          break;
        case Op::RmsNorm:
          cpu::rms_norm(in0, f32(node.weight), out, n_tokens, width, node.group, hp.rms_eps);
          break;
        case Op::MatMul:
          cpu::matmul(pool_, *node.weight, f32(node.bias), in0, n_tokens, out, scratch_);
          break;
        case Op::Rope:
          cpu::rope(out, node.n_heads, hp.head_dim, rope, hp.rope_type);
          break;
        case Op::Attention: {
          const cpu::KvCacheView cache{k_cache_[size_t(node.layer)].data(),
                                       v_cache_[size_t(node.layer)].data(), n_ctx_};
          cpu::attention(pool_, in0, in1, slot(node.in[2]), n_tokens, batch.pos, node.n_heads,
                         hp.n_head_kv, hp.head_dim, cache, out);
          break;
        }
        case Op::SwiGLU:
          cpu::swiglu(in0, in1, out, n_tokens * width);
          break;
        case Op::Add:
          cpu::add(in0, in1, out, n_tokens * width);
          break;
        case Op::Output: {
          rows = n_out_rows;
          logits.resize(size_t(rows * width));
          out = logits.data();
          const int64_t in_width = graph_.slot_width[size_t(node.in[0])];
          cpu::matmul(pool_, *node.weight, nullptr, in0 + (n_tokens - rows) * in_width, rows,
                      out, scratch_);
          break;
        }
      }
      if (dump) dump_node(step_, int(i), node.name, rows, width, out);
    }
    ++step_;
  }

 private:
  float* slot(int s) { return slots_[size_t(s)].data(); }
  const float* f32(const Tensor* t) const {
    return t ? f32_copies_.at(t).data() : nullptr;
  }
  void keep_as_f32(const Tensor* t) {
    if (!t || f32_copies_.count(t)) return;
    if (!can_dequantize(t->type) || t->shape[0] % type_traits(t->type).block_size != 0)
      fail("tensor ", t->name, " has type ", type_traits(t->type).name,
           ", which the CPU backend cannot read");
    std::vector<float>& v = f32_copies_[t];
    v.resize(size_t(t->n_elements()));
    const int64_t row = t->shape[0];
    const size_t row_size = row_bytes(t->type, row);
    for (int64_t r = 0; r < t->rows(); ++r)
      dequantize_row(t->type, t->data + size_t(r) * row_size, v.data() + r * row, row);
  }

  const Model& model_;
  const Graph graph_;
  ThreadPool pool_;
  std::map<const Tensor*, std::vector<float>> f32_copies_;  // norms, biases, rope_freqs
  std::array<std::vector<float>, kNumSlots> slots_;
  std::vector<std::vector<float>> k_cache_, v_cache_;
  std::vector<BlockQ8Pad40> scratch_;
  int n_ctx_ = 0, max_batch_ = 0, step_ = 0;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(const Model& model, const Graph& graph, int n_threads) {
  return std::make_unique<CpuBackend>(model, graph, n_threads);
}

}  // namespace minfer
