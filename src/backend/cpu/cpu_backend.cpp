// The CPU reference backend: executes the graph node by node with the ops in ops.cpp, keeping an
// f32 KV cache per layer in blocks of positions.
#include <unistd.h>

#include <algorithm>
#include <deque>
#include <fstream>
#include <map>

#include "backend/backend.h"
#include "backend/cpu/ops.h"
#include "quant/quant.h"
#include "sampling/draw.h"
#include "sampling/sampler.h"
#include "util/error.h"

namespace minfer {
namespace {

class CpuBackend final : public Backend {
 public:
  CpuBackend(const Model& model, int n_threads)
      : model_(model), graph_(build_graph(model)), pool_(n_threads) {
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
  int max_tokens() const override { return max_tokens_; }
  int max_outputs() const override { return max_outputs_; }

  int64_t kv_block_bytes(int block_size) const override {
    return int64_t(model_.hp.n_layer) * 2 * block_size * kv_width() * int64_t(sizeof(float));
  }
  int64_t workspace_bytes(int max_tokens, int max_outputs) const override {
    int64_t floats = 0;  // every slot; the logits and the gathered rows of the output rows
    for (int s = 0; s < kNumSlots; ++s)
      floats += int64_t(s == kLogits ? max_outputs : max_tokens) * graph_.slot_width[size_t(s)];
    floats += int64_t(max_outputs) * graph_.slot_width[kH];
    return floats * int64_t(sizeof(float));
  }
  int64_t memory_available() const override {
    std::ifstream meminfo("/proc/meminfo");
    std::string key;
    int64_t kib = 0;
    while (meminfo >> key >> kib)
      if (key == "MemAvailable:") return kib * 1024;
    return int64_t(sysconf(_SC_AVPHYS_PAGES)) * sysconf(_SC_PAGESIZE);
  }

  void reserve(int n_blocks, int block_size, int max_tokens, int max_outputs) override {
    if (n_blocks <= 0 || block_size <= 0 || max_tokens <= 0 || max_outputs <= 0 || max_outputs > max_tokens)
      fail("cpu backend: invalid sizes n_blocks=", n_blocks, " block_size=", block_size, " max_tokens=", max_tokens,
           " max_outputs=", max_outputs);
    if (max_tokens_) fail("cpu backend: reserve called twice");
    n_blocks_ = n_blocks;
    block_size_ = block_size;
    max_tokens_ = max_tokens;
    max_outputs_ = max_outputs;
    const size_t cache_floats = size_t(n_blocks) * size_t(block_size) * size_t(kv_width());
    k_cache_.assign(size_t(model_.hp.n_layer), std::vector<float>(cache_floats));
    v_cache_.assign(size_t(model_.hp.n_layer), std::vector<float>(cache_floats));
    for (int s = 0; s < kNumSlots; ++s)
      if (s != kLogits) slots_[size_t(s)].assign(size_t(max_tokens) * size_t(graph_.slot_width[size_t(s)]), 0.0f);
  }

  void copy_blocks(std::span<const BlockCopy> copies) override {
    const size_t block_floats = size_t(block_size_) * size_t(kv_width());
    for (const BlockCopy& c : copies) {
      if (c.src < 0 || c.dst < 0 || c.src >= n_blocks_ || c.dst >= n_blocks_)
        fail("cpu backend: block copy ", c.src, " -> ", c.dst, " outside the pool of ", n_blocks_);
      for (auto* cache : {&k_cache_, &v_cache_})
        for (std::vector<float>& layer : *cache)
          std::copy_n(layer.begin() + ptrdiff_t(size_t(c.src) * block_floats), block_floats,
                      layer.begin() + ptrdiff_t(size_t(c.dst) * block_floats));
    }
  }

  // The step runs here, in submit; collect hands over its results.
  void submit(const StepBatch& in) override {
    validate_step(in, max_tokens_, max_outputs_, n_blocks_, block_size_, model_.hp.n_vocab);
    validate_submit(in, last_, int(done_.size()));
    StepBatch batch = in;
    if (in.tokens_from_previous) batch.tokens = last_argmax_;
    StepOutput& result = done_.emplace_back();
    try {
      forward_now(batch, result);
    } catch (...) {
      done_.pop_back();
      throw;
    }
    last_argmax_ = result.argmax;
    last_ = submitted(in);
  }

  void collect(StepOutput& out) override {
    if (done_.empty()) fail("backend: collect with no step submitted");
    out = std::move(done_.front());
    done_.pop_front();
  }

 private:
  void forward_now(const StepBatch& batch, StepOutput& result) {
    const HParams& hp = model_.hp;
    const int n_tokens = int(batch.tokens.size());
    positions_.clear();
    for (const SeqChunk& c : batch.chunks)
      for (int t = 0; t < c.n_tokens; ++t) positions_.push_back(c.pos + t);
    const cpu::RopeTable rope = cpu::rope_table(positions_, hp.head_dim, hp.rope_base, hp.rope_freq_scale,
                                                model_.rope_freqs ? f32(model_.rope_freqs) : nullptr);
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
          const int64_t q_width = graph_.slot_width[size_t(node.in[0])], kvw = kv_width();
          for (const SeqChunk& c : batch.chunks) {
            const cpu::KvSeqView cache{k_cache_[size_t(node.layer)].data(), v_cache_[size_t(node.layer)].data(),
                                       block_size_, c.blocks};
            cpu::attention(pool_, in0 + c.row * q_width, in1 + c.row * kvw, slot(node.in[2]) + c.row * kvw,
                           c.n_tokens, c.pos, node.n_heads, hp.n_head_kv, hp.head_dim, cache, out + c.row * q_width);
          }
          break;
        }
        case Op::SwiGLU:
          cpu::swiglu(in0, in1, out, n_tokens * width);
          break;
        case Op::Add:
          cpu::add(in0, in1, out, n_tokens * width);
          break;
        case Op::Output: {
          // The wanted rows, gathered, through the output matrix.
          const int64_t in_width = graph_.slot_width[size_t(node.in[0])];
          rows = int64_t(batch.output_rows.size());
          gathered_.resize(size_t(rows * in_width));
          for (int64_t r = 0; r < rows; ++r)
            std::copy_n(in0 + batch.output_rows[size_t(r)] * in_width, in_width, gathered_.begin() + r * in_width);
          logits_.resize(size_t(rows * width));
          out = logits_.data();
          if (rows > 0) cpu::matmul(pool_, *node.weight, nullptr, gathered_.data(), rows, out, scratch_);
          break;
        }
      }
      if (dump) dump_node(step_, int(i), node.name, rows, width, out);
    }
    ++step_;

    const size_t vocab = size_t(hp.n_vocab);
    result.argmax.clear();
    wanted_logits_.clear();
    const bool all_wanted = std::all_of(batch.copy_logits.begin(), batch.copy_logits.end(), [](uint8_t c) { return c != 0; });
    for (size_t r = 0; r < batch.output_rows.size(); ++r) {
      const std::span<const float> row(logits_.data() + r * vocab, vocab);
      result.argmax.push_back(argmax(row));
      if (batch.copy_logits[r] && !all_wanted) wanted_logits_.insert(wanted_logits_.end(), row.begin(), row.end());
    }
    result.logits = all_wanted ? std::span<const float>(logits_.data(), batch.output_rows.size() * vocab)
                               : std::span<const float>(wanted_logits_);
    result.drawn.clear();
    for (const Draw& d : batch.draws)
      result.drawn.push_back(draw_softmax(std::span<const float>(logits_.data() + size_t(d.output) * vocab, vocab),
                                          d.temperature, d.uniform, draw_weight_, draw_block_sum_));
  }

  int64_t kv_width() const { return int64_t(model_.hp.n_head_kv) * model_.hp.head_dim; }
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
  std::vector<std::vector<float>> k_cache_, v_cache_;  // per layer: [n_blocks * block_size][kv width]
  std::vector<BlockQ8Pad40> scratch_;
  std::vector<int32_t> positions_;
  std::vector<float> draw_weight_;  // draw_softmax's scratch
  std::vector<double> draw_block_sum_;
  std::vector<float> gathered_, logits_, wanted_logits_;  // wanted_logits_: the flagged rows, when not all are
  int n_blocks_ = 0, block_size_ = 0, max_tokens_ = 0, max_outputs_ = 0, step_ = 0;
  std::deque<StepOutput> done_;  // submitted, not yet collected
  SubmittedStep last_;
  std::vector<int32_t> last_argmax_;  // the tokens of a step submitted with tokens_from_previous
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(const Model& model, int n_threads) {
  return std::make_unique<CpuBackend>(model, n_threads);
}

}  // namespace minfer
