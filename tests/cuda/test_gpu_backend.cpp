// The CUDA backend end to end: logits against a CPU oracle at the GPU's storage precisions on
// synthesized models of every architecture, greedy streams against the CPU backend on the trained
// default model, every fusion opt-out bit for bit, batch invariance, prefill/decode consistency,
// a full context, `minfer batch`.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cctype>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <cstring>
#include <map>
#include <optional>
#include <random>

#include "backend/cpu/ops.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device.h"
#include "backend/cuda/device_timeline.h"
#include "../batching_support.h"
#include "engine/session.h"
#include "backend/cuda/prefill.h"
#include "convert/synth.h"
#include "gpu_support.h"
#include "sampling/sampler.h"
#include "quant/quant.h"
#include "util/error.h"
#include "util/half.h"
#include "util/threadpool.h"

namespace minfer::test {
namespace {

struct Synth {
  Model model;
  Graph graph;
};

// One synthesized model per preset per test process.
const Synth& synth_model(const std::string& preset) {
  static std::map<std::string, std::unique_ptr<Synth>> cache;
  auto& slot = cache[preset];
  if (!slot) {
    synth::Options o;
    o.preset = preset;
    o.ftype = synth::FileType::Q4_K_M;
    o.seed = seed();
    o.tokenizer = "builtin";
    o.out_path = (temp_dir("gpu-" + preset) / "model.gguf").string();
    synth::write_model(o);
    auto s = std::make_unique<Synth>(Synth{Model::load(o.out_path), {}});
    s->graph = build_graph(s->model);
    slot = std::move(s);
  }
  return *slot;
}

std::vector<int32_t> random_tokens(int n, int vocab, uint64_t salt) {
  std::mt19937_64 rng(seed() + salt);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = int32_t(rng() % uint64_t(vocab));
  return t;
}

double rel_err(const std::vector<float>& a, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    num += (double(a[i]) - ref[i]) * (double(a[i]) - ref[i]);
    den += double(ref[i]) * ref[i];
  }
  return std::sqrt(num / den);
}

test::BackendFactory gpu_backend(Fusions f = Fusions::from_env()) {
  return [f](const Model& m) { return std::make_unique<cuda::CudaBackend>(m, f); };
}

std::unique_ptr<Session> gpu_session(const Synth& s, Fusions f = Fusions::from_env(), int n_ctx = 256) {
  SessionOptions o;
  o.n_ctx = n_ctx;
  return std::make_unique<Session>(s.model, o, gpu_backend(f)(s.model));
}

std::vector<float> copy(std::span<const float> s) { return {s.begin(), s.end()}; }

// The CPU reference ops (backend/cpu/ops.h) run at the GPU's storage precisions: the oracle for
// end-to-end logits on synthesized models. Every matmul input is quantized to q8 (both backends
// do this) and q8 rounding is discontinuous, so on these random-weight models any difference at
// all (f16 vs f32 KV, a summation order) flips some q8 values and the flips cascade through the
// layers to a floor of 1-4 % logits error: the f16 KV cache alone moves the CPU backend's own
// logits by 1.2 % (tiny) / 2.8 % (0.5b shape), a rope position off by one by 1.2 % (docs/07 §4).
// Matching the storage precisions (f16 K/V; for one token the decode matmul's q8 activations with one
// scale per 256 columns; for multi-token batches the GEMM's bf16 activations
// and weights and the flash attention's f16 Q·scale·log2e and f16 P) lowers that floor (tiny
// prefill 1.3 % -> 0.5 %), but summation order remains; the bounds below are the measured floors
// (3 seeds, H200) with about 2x margin. Bugs a random model cannot see are the job of the
// trained-model test (DefaultModelGreedyStreamsMatchTheCpuBackend).
class PrecisionOracle {
 public:
  PrecisionOracle(const Model& m, const Graph& g, int n_ctx) : m_(m), g_(g), n_ctx_(n_ctx), pool_(0) {
    const HParams& hp = m.hp;
    for (int s = 0; s < kNumSlots; ++s) slots_[size_t(s)].resize(size_t(64 * g.slot_width[size_t(s)]));
    const size_t cache = size_t(n_ctx) * size_t(hp.n_head_kv * hp.head_dim);
    k_.assign(size_t(hp.n_layer), std::vector<float>(cache));
    v_.assign(size_t(hp.n_layer), std::vector<float>(cache));
  }
  // Last token's logits; a batch of more than one token takes the GPU's prefill precisions.
  std::vector<float> forward(std::span<const int32_t> toks, int pos) {
    const HParams& hp = m_.hp;
    const int n = int(toks.size());
    std::vector<float> logits;
    std::vector<int32_t> positions(static_cast<size_t>(n));
    for (int t = 0; t < n; ++t) positions[size_t(t)] = pos + t;
    const cpu::RopeTable rope =
        cpu::rope_table(positions, hp.head_dim, hp.rope_base, hp.rope_freq_scale,
                        m_.rope_freqs ? f32(m_.rope_freqs).data() : nullptr);
    for (const Node& node : g_.nodes) {
      const int64_t w = g_.slot_width[size_t(node.out)];
      float* out = slot(node.out);
      const float* in0 = node.in[0] >= 0 ? slot(node.in[0]) : nullptr;
      const float* bias = node.bias ? f32(node.bias).data() : nullptr;
      switch (node.op) {
        case Op::Embed: cpu::embed(*node.weight, toks, out); break;
        case Op::RmsNorm:
          cpu::rms_norm(in0, f32(node.weight).data(), out, n, w, node.group, hp.rms_eps);
          break;
        case Op::MatMul: matmul(*node.weight, bias, in0, n, out); break;
        case Op::Rope: cpu::rope(out, node.n_heads, hp.head_dim, rope, hp.rope_type); break;
        case Op::Attention: {
          float *k = slot(node.in[1]), *v = slot(node.in[2]);
          for (int64_t i = 0; i < n * int64_t(hp.n_head_kv) * hp.head_dim; ++i) {
            k[i] = f16_to_f32(f32_to_f16(k[i]));
            v[i] = f16_to_f32(f32_to_f16(v[i]));
          }
          if (n > 1) {
            prefill_attention(in0, k, v, n, pos, node.n_heads, size_t(node.layer), out);
          } else {
            cpu::attention(pool_, in0, k, v, n, pos, node.n_heads, hp.n_head_kv, hp.head_dim,
                           {k_[size_t(node.layer)].data(), v_[size_t(node.layer)].data(), n_ctx_, whole_}, out);
          }
          break;
        }
        case Op::SwiGLU: cpu::swiglu(in0, slot(node.in[1]), out, n * w); break;
        case Op::Add: cpu::add(in0, slot(node.in[1]), out, n * w); break;
        case Op::Output: {
          logits.resize(size_t(w));
          const int64_t in_w = g_.slot_width[size_t(node.in[0])];
          // The head is a decode matmul on every path (the prompt's last row included).
          matmul(*node.weight, nullptr, in0 + (n - 1) * in_w, 1, logits.data());
          break;
        }
      }
    }
    return logits;
  }

 private:
  float* slot(int s) { return slots_[size_t(s)].data(); }
  const std::vector<float>& f32(const Tensor* t) {
    auto& v = f32_[t];
    if (v.empty()) {
      v.resize(size_t(t->n_elements()));
      const int64_t row = t->shape[0];
      for (int64_t r = 0; r < t->rows(); ++r)
        dequantize_row(t->type, t->data + size_t(r) * row_bytes(t->type, row), v.data() + r * row, row);
    }
    return v;
  }
  static float bf16(float x) { return bf16_to_f32(f32_to_bf16(x)); }
  // The prefill GEMM: bf16 activations times bf16-rounded dequantized weights, f32-or-better sums.
  void matmul(const Tensor& w, const float* bias, const float* x, int n, float* out) {
    if (n == 1 && has_pad40_dot(w.type)) {  // the decode matmul: q8 activations, one scale per 256 columns
      const int64_t K = w.shape[0];
      scratch_.resize(size_t(K / 32));
      quantize_row_pad40_grouped(x, scratch_.data(), K);
      pool_.parallel_for(w.rows(), [&](int64_t b, int64_t e) {
        for (int64_t r = b; r < e; ++r)
          out[r] = vec_dot_pad40(w.type, w.data + size_t(r) * row_bytes(w.type, K), scratch_.data(), K) +
                   (bias ? bias[r] : 0.0f);
      });
      return;
    }
    if (n == 1 || !cuda::prefill_gemm_supports(w.type)) {
      cpu::matmul(pool_, w, bias, x, n, out, scratch_);
      return;
    }
    const int64_t K = w.shape[0], N = w.rows();
    std::vector<float> xr(x, x + n * K);
    for (float& e : xr) e = bf16(e);
    pool_.parallel_for(N, [&](int64_t b, int64_t e) {
      std::vector<float> row(static_cast<size_t>(K));
      for (int64_t r = b; r < e; ++r) {
        dequantize_row(w.type, w.data + size_t(r) * row_bytes(w.type, K), row.data(), K);
        for (float& x16 : row) x16 = bf16(x16);
        for (int t = 0; t < n; ++t) {
          double sum = 0;
          for (int64_t k = 0; k < K; ++k) sum += double(row[size_t(k)]) * xr[size_t(t * K + k)];
          out[t * N + r] = float(sum) + (bias ? bias[r] : 0.0f);
        }
      }
    });
  }
  // The flash attention's roundings (one 64-key tile, so its running max is the row max).
  void prefill_attention(const float* q, const float* k_new, const float* v_new, int n, int pos0,
                         int n_head, size_t layer, float* out) {
    const int hd = m_.hp.head_dim, group = n_head / m_.hp.n_head_kv;
    const int64_t kvw = int64_t(m_.hp.n_head_kv) * hd, qw = int64_t(n_head) * hd;
    float *K = k_[layer].data(), *V = v_[layer].data();
    std::copy(k_new, k_new + n * kvw, K + pos0 * kvw);
    std::copy(v_new, v_new + n * kvw, V + pos0 * kvw);
    const float qscale = 1.0f / std::sqrt(float(hd)) * 1.4426950408889634f;
    for (int t = 0; t < n; ++t)
      for (int h = 0; h < n_head; ++h) {
        const int n_keys = pos0 + t + 1;
        const int64_t off = int64_t(h / group) * hd;
        std::vector<double> s(static_cast<size_t>(n_keys)), o(static_cast<size_t>(hd), 0.0);
        double mx = -INFINITY, l = 0;
        for (int j = 0; j < n_keys; ++j) {
          double dot = 0;
          for (int d = 0; d < hd; ++d)
            dot += double(f16_to_f32(f32_to_f16(q[t * qw + h * hd + d] * qscale))) * K[j * kvw + off + d];
          mx = std::max(mx, s[size_t(j)] = dot);
        }
        for (int j = 0; j < n_keys; ++j) {
          const double p = std::exp2(s[size_t(j)] - mx);
          l += p;
          const double p16 = f16_to_f32(f32_to_f16(float(p)));
          for (int d = 0; d < hd; ++d) o[size_t(d)] += p16 * V[j * kvw + off + d];
        }
        for (int d = 0; d < hd; ++d) out[t * qw + h * hd + d] = float(o[size_t(d)] / l);
      }
  }

  const Model& m_;
  const Graph& g_;
  int n_ctx_;
  ThreadPool pool_;
  std::array<std::vector<float>, kNumSlots> slots_;
  std::vector<std::vector<float>> k_, v_;
  std::map<const Tensor*, std::vector<float>> f32_;
  std::vector<BlockQ8Pad40> scratch_;
  const std::vector<int32_t> whole_ = {0};  // the contiguous cache as one block
};

// Measured floors x2 (docs/07 §4): tiny prefill <= 5.2e-3; with the grouped decode plane tiny
// decode <= 1.25e-2, 0.5b <= 3.8e-2 (prefill <= 3.3e-2), other presets <= 1.9e-2.
double logits_bound(const std::string& preset, bool prefill) {
  if (preset == "tiny") return prefill ? 1e-2 : 2.5e-2;
  return 8e-2;
}

class GpuModel : public ::testing::TestWithParam<const char*> {};

// The prompt path (the prompt in one step) and the decode path (the prompt fed one generated-token
// step at a time) against the oracle, and the same difference against the f32-cache CPU backend,
// for the record. Every architecture: qwen2 (biases), llama with llama3 rope_freqs, qwen3 (q/k
// norms), mistral; head_dim 64 and 128.
TEST_P(GpuModel, LogitsMatchThePrecisionOracle) {
  MINFER_REQUIRE_GPU();
  const Synth& s = synth_model(GetParam());
  const auto prompt = random_tokens(24, s.model.hp.n_vocab, 1);
  SessionOptions co;
  co.n_ctx = 256;
  co.backend = BackendKind::Cpu;
  Session cpu(s.model, co);
  PrecisionOracle batch_oracle(s.model, s.graph, 256), step_oracle(s.model, s.graph, 256);
  auto g_batch = gpu_session(s), g_step = gpu_session(s);
  const std::vector<float> lg = copy(g_batch->eval(prompt)), lc = copy(cpu.eval(prompt));
  const std::vector<float> lo = batch_oracle.forward(prompt, 0);
  const double prefill_err = rel_err(lg, lo);
  std::printf("[ measured ] %s prefill: GPU vs oracle %.2e, GPU vs CPU backend %.2e, oracle vs CPU backend %.2e\n",
              GetParam(), prefill_err, rel_err(lg, lc), rel_err(lo, lc));
  EXPECT_LT(prefill_err, logits_bound(GetParam(), true)) << "prefill logits";
  double worst = 0;
  for (size_t t = 0; t < prompt.size(); ++t) {
    const std::vector<float> ls = copy(g_step->decode(prompt[t]));
    const std::vector<float> lso = step_oracle.forward(std::span(&prompt[t], 1), int(t));
    worst = std::max(worst, rel_err(ls, lso));
  }
  // decode steps continue both streams from the oracle's greedy tokens
  int32_t tok = argmax(lo);
  for (int step = 0; step < 8; ++step) {
    const int pos = int(prompt.size()) + step;
    const std::vector<float> ls = copy(g_step->decode(tok));
    const std::vector<float> lso = step_oracle.forward(std::span(&tok, 1), pos);
    worst = std::max(worst, rel_err(ls, lso));
    tok = argmax(lso);
  }
  std::printf("[ measured ] %s decode path, 32 steps: worst GPU vs oracle %.2e\n", GetParam(), worst);
  EXPECT_LT(worst, logits_bound(GetParam(), false)) << "decode-path logits";
}

INSTANTIATE_TEST_SUITE_P(Presets, GpuModel,
                         ::testing::Values("tiny", "qwen2.5-0.5b", "tiny-llama3", "tiny-qwen3", "tiny-mistral"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& c : n) c = std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
                           return n;
                         });

// On the trained default model the GPU and the CPU backend pick the same greedy tokens. Random
// prompts still meet near-ties (the CPU's top-2 gap fell to 0.001-0.01 within 64 steps for 4 of 6
// seeds, logit rms ≈ 3.5), so where the streams part, the CPU must have rated the GPU's pick within
// a few times the per-logit difference measured at that very step; a real bug parts them by far
// more. A second GPU session decodes the same tokens through `decode`, whose logits give that
// step's difference (and must pick what `decode_greedy` picked).
TEST(GpuBackend, DefaultModelGreedyStreamsMatchTheCpuBackend) {
  MINFER_REQUIRE_GPU();
  const auto path = source_dir() / "models" / "default.gguf";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << path << " not present";
  const Model model = Model::load(path.string());
  SessionOptions o;
  o.n_ctx = 256;
  o.backend = BackendKind::Cpu;
  Session cpu(model, o);
  Session g(model, o, std::make_unique<cuda::CudaBackend>(model));
  Session g_logits(model, o, std::make_unique<cuda::CudaBackend>(model));
  std::mt19937_64 rng(seed() + 7);
  std::vector<int32_t> prompt(16);
  for (auto& t : prompt) t = int32_t(rng() % 1000 + 100);  // ordinary (non-special) tokens
  std::vector<float> lc = copy(cpu.eval(prompt));
  std::vector<float> lg = copy(g_logits.eval(prompt));
  (void)g.eval(prompt);
  const auto rms_of = [](const std::vector<float>& l) {
    double s = 0;
    for (float v : l) s += double(v) * v;
    return std::sqrt(s / double(l.size()));
  };
  double err = rel_err(lg, lc);
  std::printf("[ measured ] default model prefill logits GPU vs CPU backend %.2e (logit rms %.2f)\n", err,
              rms_of(lc));
  // Measured 5.6e-3 … 9.6e-3 over most seeds; seed 3269457564 (logit rms 1.87) 2.41e-2 on every
  // build tried (f16 KV, bf16 prefill GEMM vs f32 / q8); a real bug gives errors of order 1.
  EXPECT_LT(err, 4e-2) << "measured 5.6e-3 … 2.41e-2 over seeds";
  int32_t tc = argmax(lc), tg = argmax(lg);
  int agree = 0;
  double worst_step = 0;
  for (; agree < 64; ++agree) {
    if (tg != tc) {
      const double tie = 4 * std::max(err, 5e-3) * rms_of(lc);
      EXPECT_LT(lc[size_t(tc)] - lc[size_t(tg)], tie)
          << "step " << agree << ": the GPU picked " << tg << ", the CPU " << tc << " by a clear margin"
          << " (that step's logits differ by " << err << " relative)";
      break;
    }
    lc = copy(cpu.decode(tc));
    lg = copy(g_logits.decode(tc));
    tg = g.decode_greedy(tg);
    tc = argmax(lc);
    ASSERT_EQ(argmax(lg), tg) << "step " << agree + 1 << ": decode and decode_greedy parted";
    err = rel_err(lg, lc);
    worst_step = std::max(worst_step, err);
    // Measured 7.0e-3 … 3.52e-2, the worst step of each of 25 seeds: one to four times that seed's
    // prefill difference, which is why the tie takes the step's own
    EXPECT_LT(err, 7e-2) << "step " << agree + 1 << ": decode-step logits GPU vs CPU backend";
  }
  std::printf("[ measured ] default model decode-step logits GPU vs CPU backend: worst %.2e\n", worst_step);
  std::printf("[ measured ] default model greedy agreement: %d of 64 steps\n", agree);
}

// Five sequences: four prompts (one chunk each, 1 to 30 tokens) in one step; then 14 steps in
// which they decode together, the fifth sequence's prompt joining the third of them (a step with
// decode and prompt rows); then 4 steps of the first sequence alone. Every output's logits and
// argmax, in order.
struct Trace {
  std::vector<std::vector<float>> logits;
  std::vector<int32_t> argmax;
};
std::unique_ptr<Engine> trace_engine(const Synth& s, Fusions f) {
  EngineOptions eo;
  eo.max_tokens = 128;
  eo.block_size = 16;
  eo.n_blocks = 40;
  return std::make_unique<Engine>(s.model, eo, gpu_backend(f)(s.model));
}
Trace trace(Engine& engine, const Synth& s) {
  std::vector<KvPool::Sequence> seqs;
  for (int i = 0; i < 5; ++i) seqs.emplace_back(engine.kv());
  const std::vector<int> lengths = {9, 17, 1, 30, 20};
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 5; ++i) prompts.push_back(random_tokens(lengths[size_t(i)], s.model.hp.n_vocab, 10 + uint64_t(i)));
  std::vector<int32_t> next(5, -1);
  Trace t;
  Step step(engine);
  auto run = [&](const std::vector<int>& decoding, int prompting) {
    step.clear();
    std::vector<int> order;
    for (int i : decoding) {
      step.add(seqs[size_t(i)], std::span<const int32_t>(&next[size_t(i)], 1), true, Step::Output::Last, true);
      order.push_back(i);
    }
    for (int i = 0; i < 5; ++i)
      if (prompting & (1 << i)) {
        step.add(seqs[size_t(i)], prompts[size_t(i)], false, Step::Output::Last, true);
        order.push_back(i);
      }
    step.run();
    for (size_t item = 0; item < order.size(); ++item) {
      t.logits.push_back(copy(step.logits(int(item))));
      t.argmax.push_back(step.argmax(int(item))[0]);
      next[size_t(order[item])] = t.argmax.back();
    }
  };
  run({}, 0b01111);
  for (int k = 0; k < 14; ++k) run(k < 3 ? std::vector<int>{0, 1, 2, 3} : std::vector<int>{0, 1, 2, 3, 4}, k == 2 ? 0b10000 : 0);
  for (int k = 0; k < 4; ++k) run({0}, 0);
  return t;
}
Trace trace(const Synth& s, Fusions f) { return trace(*trace_engine(s, f), s); }
// Every output's logits and argmax of b are a's, bit for bit.
void expect_same_trace(const Trace& a, const Trace& b, const std::string& what) {
  ASSERT_EQ(a.logits.size(), b.logits.size()) << what;
  for (size_t i = 0; i < a.logits.size(); ++i)
    ASSERT_EQ(std::memcmp(a.logits[i].data(), b.logits[i].data(), a.logits[i].size() * 4), 0)
        << what << ": logits of output " << i << " differ";
  ASSERT_EQ(a.argmax, b.argmax) << what;
}
// The preset's trace with the backend's opt-out variable set is its trace without it.
void expect_opt_out_keeps_the_trace(const char* preset, const char* opt_out) {
  const Synth& s = synth_model(preset);
  const Trace with = trace(s, Fusions{});
  setenv(opt_out, "1", 1);
  const Trace without = trace(s, Fusions{});
  unsetenv(opt_out);
  expect_same_trace(with, without, std::string(preset) + ", " + opt_out);
}

// tiny: q4_K everywhere (the SwiGLU GEMM); tiny-llama3: a q6_K v in some layers (q/k and v on two
// streams); qwen2.5-0.5b: q5_0 gate/up (no GEMM: the matvec over the prompt rows, which quantizes
// them into the q8 plane).
TEST(GpuBackend, EveryOptOutRestoresTheFusedResultBitForBit) {
  MINFER_REQUIRE_GPU();
  std::vector<std::pair<std::string, Fusions>> variants;
  for (const char* name :
       {"decode_a_fuse", "attention_q8", "prompt_a_fuse", "cuda_graph", "fused_qkv", "fused_ffn", "gemm_swiglu",
        "fused_rope_kv", "concurrent_gemms", "decode_beside_prompt", "fused_residual", "pdl", "early_dependents",
        "operand_image", "swiglu_in_matmul"}) {
    Fusions f;
    if (!std::strcmp(name, "decode_a_fuse")) f.decode_a_fuse = false;
    if (!std::strcmp(name, "attention_q8")) f.attention_q8 = false;
    if (!std::strcmp(name, "prompt_a_fuse")) f.prompt_a_fuse = false;
    if (!std::strcmp(name, "cuda_graph")) f.cuda_graph = false;
    if (!std::strcmp(name, "fused_qkv")) f.fused_qkv = false;
    if (!std::strcmp(name, "fused_ffn")) f.fused_ffn = false;
    if (!std::strcmp(name, "swiglu_in_matmul")) f.swiglu_in_matmul = false;
    if (!std::strcmp(name, "gemm_swiglu")) f.gemm_swiglu = false;
    if (!std::strcmp(name, "fused_rope_kv")) f.fused_rope_kv = false;
    if (!std::strcmp(name, "concurrent_gemms")) f.concurrent_gemms = false;
    if (!std::strcmp(name, "decode_beside_prompt")) f.decode_beside_prompt = false;
    if (!std::strcmp(name, "fused_residual")) f.fused_residual = false;
    if (!std::strcmp(name, "pdl")) f.pdl = false;
    if (!std::strcmp(name, "early_dependents")) f.early_dependents = false;
    if (!std::strcmp(name, "operand_image")) f.operand_image = false;
    variants.emplace_back(std::string("no_") + name, f);
  }
  variants.emplace_back("none", Fusions::none());
  for (const char* preset : {"tiny", "tiny-llama3", "qwen2.5-0.5b"}) {
    const Synth& s = synth_model(preset);
    const Trace ref = trace(s, Fusions{});  // everything on
    for (const auto& [name, f] : variants) {
      expect_same_trace(ref, trace(s, f), std::string(preset) + ", " + name);
      if (HasFatalFailure()) return;
    }
  }
}

// tiny-wide's gate/up (768 row tiles of 2,304 columns, q4_K) takes the weight ring over several
// tiles on a GPU of up to 191 SMs, so its decode-only steps run the swiglu in that launch's
// epilogue, which writes down's q8 plane beside the one it reads: the trace of the matmul, then
// the swiglu kernel, with the epilogue in the trace's one-row steps (the backend's limit) and in
// its steps of 1, 4 and 5 rows (MINFER_SWIGLU_EPILOGUE_MAX_ROWS=8).
TEST(GpuBackend, SwigluInTheGateUpEpilogueKeepsTheTrace) {
  MINFER_REQUIRE_GPU();
  ASSERT_LT(cuda::DeviceContext(0).sm_count, 192);
  expect_opt_out_keeps_the_trace("tiny-wide", "MINFER_NO_SWIGLU_IN_MATMUL");
  setenv("MINFER_SWIGLU_EPILOGUE_MAX_ROWS", "8", 1);
  expect_opt_out_keeps_the_trace("tiny-wide", "MINFER_NO_SWIGLU_IN_MATMUL");
  unsetenv("MINFER_SWIGLU_EPILOGUE_MAX_ROWS");
}

// The mixed step's two lanes (decode rows, prompt rows) share no memory up to the output rows:
// on one stream, either lane some launches ahead of the other, the trace keeps the bits of the
// plan's order. One lane's write spoils the other's rows only if it comes between that lane's
// write and read of them, a span within a layer's launches: every lead from 1 to one more than a
// layer's launches runs, both ways.
TEST(GpuBackend, MixedStepLanesGiveTheSameBitsInAnyInterleaving) {
  MINFER_REQUIRE_GPU();
  for (const char* preset : {"tiny", "tiny-llama3"})
    for (const bool gemm_swiglu : {true, false}) {
      const Synth& s = synth_model(preset);
      Fusions f;
      f.gemm_swiglu = gemm_swiglu;
      f.cuda_graph = false;  // the decode steps' bits either way (the opt-out test); no captures to wait for
      const std::string arm = std::string(preset) + (gemm_swiglu ? "" : ", no gemm_swiglu");
      // One engine for every interleaving: each trace's sequences give their blocks back.
      const std::unique_ptr<Engine> engine = trace_engine(s, f);
      auto& backend = dynamic_cast<cuda::CudaBackend&>(engine->backend());
      backend.interleave_lanes(0);
      const Trace in_order = trace(*engine, s);
      Fusions serial = f;
      serial.decode_beside_prompt = false;
      expect_same_trace(trace(s, serial), in_order, arm + ", one lane after the other in plan order");
      const std::vector<Launch> plan = lower(build_graph(s.model), f, {true, true, false});
      const auto lane_launches =
          std::count_if(plan.begin(), plan.end(), [](const Launch& l) { return l.rows != Rows::Output; });
      const int layer_launches = int(lane_launches) / s.model.hp.n_layer;
      for (int lead = 1; lead <= layer_launches + 1; ++lead)
        for (const int decode_lead : {lead, -lead}) {
          backend.interleave_lanes(decode_lead);
          expect_same_trace(in_order, trace(*engine, s),
                            arm + ", the decode lane " + std::to_string(decode_lead) + " launches ahead");
        }
    }
}

// q/k and a q6_K v in one decode matmul launch (tiny-llama3's Q4_K_M mix; rope and the KV write in
// the epilogue) give the logits of a launch per type (MINFER_NO_TWO_TYPE_DECODE_MATMUL).
TEST(GpuBackend, TwoTypeDecodeMatmulKeepsTheBitsOfALaunchPerType) {
  MINFER_REQUIRE_GPU();
  expect_opt_out_keeps_the_trace("tiny-llama3", "MINFER_NO_TWO_TYPE_DECODE_MATMUL");
}

// q/k in q4_K and a q6_K v through both types' weight rings in one launch (tiny-wide's layer with a
// q6_K v: 9 groups a row, rope and the KV write in the epilogue; the choice itself:
// GpuKernels.TwoTypeWeightRingTakesTheQkvLaunchesOfQ4KM) give the logits of the register kernel
// (MINFER_NO_TWO_TYPE_WEIGHT_RING).
TEST(GpuBackend, TwoTypeWeightRingKeepsTheBitsOfTheRegisterKernel) {
  MINFER_REQUIRE_GPU();
  expect_opt_out_keeps_the_trace("tiny-wide", "MINFER_NO_TWO_TYPE_WEIGHT_RING");
}

// The decode attention reading positions, block tables and the older K/V rows before its PDL wait
// gives the logits of reading everything after it (MINFER_NO_EARLY_ATTENTION_READS).
TEST(GpuBackend, EarlyAttentionReadsKeepTheBits) {
  MINFER_REQUIRE_GPU();
  for (const char* preset : {"tiny", "qwen2.5-0.5b"}) expect_opt_out_keeps_the_trace(preset, "MINFER_NO_EARLY_ATTENTION_READS");
}

// Where the q/k/v matmul launches a weight type at a time (tiny-wide's layer with a q6_K v, with
// MINFER_NO_TWO_TYPE_DECODE_MATMUL; the 14B's q6_K-v layers by default), v first and q/k beside it
// give the logits of q/k and then v, one after the other (MINFER_NO_TYPES_SIDE_BY_SIDE).
TEST(GpuBackend, TypesSideBySideKeepTheBitsOfOneAfterTheOther) {
  MINFER_REQUIRE_GPU();
  setenv("MINFER_NO_TWO_TYPE_DECODE_MATMUL", "1", 1);
  expect_opt_out_keeps_the_trace("tiny-wide", "MINFER_NO_TYPES_SIDE_BY_SIDE");
  unsetenv("MINFER_NO_TWO_TYPE_DECODE_MATMUL");
}

// qwen2.5-0.5b's down projections (19 groups a row, 56 row tiles) with their weights streamed
// through the ring in shared memory give the logits of one group in flight
// (MINFER_NO_TWO_GROUPS_IN_FLIGHT) and of two groups in registers (MINFER_NO_WEIGHT_RING).
TEST(GpuBackend, TwoGroupsInFlightKeepTheBitsOfOne) {
  MINFER_REQUIRE_GPU();
  expect_opt_out_keeps_the_trace("qwen2.5-0.5b", "MINFER_NO_TWO_GROUPS_IN_FLIGHT");
  expect_opt_out_keeps_the_trace("qwen2.5-0.5b", "MINFER_NO_WEIGHT_RING");
}

// The weight ring's one-token launches forming only that token's column (qwen2.5-0.5b: down, o and
// q/k/v through the one-tile rings, gate+up through the ring over tiles) give the logits of every
// column (MINFER_NO_ONE_TOKEN_COLUMN).
TEST(GpuBackend, OneTokenColumnKeepsTheBits) {
  MINFER_REQUIRE_GPU();
  expect_opt_out_keeps_the_trace("qwen2.5-0.5b", "MINFER_NO_ONE_TOKEN_COLUMN");
}

// The weight rings' rounds by tensor copies (tiny-wide: q/k/v with neox rope, o, down and gate+up
// through the rings; qwen2.5-0.5b: down) give the logits of a bulk copy a row
// (MINFER_NO_RING_TENSOR_COPIES).
TEST(GpuBackend, RingTensorCopiesKeepTheBits) {
  MINFER_REQUIRE_GPU();
  for (const char* preset : {"tiny-wide", "qwen2.5-0.5b"}) expect_opt_out_keeps_the_trace(preset, "MINFER_NO_RING_TENSOR_COPIES");
}

// The weight rings' copies and the decode attention's K/V loads evict-first in L2 (cache hints:
// no value depends on them) give the logits of L2's own eviction (MINFER_NO_L2_EVICT_FIRST), on
// the presets whose decode matmuls take the rings (tiny-wide, qwen2.5-0.5b).
TEST(GpuBackend, L2EvictFirstKeepsTheBits) {
  MINFER_REQUIRE_GPU();
  for (const char* preset : {"tiny-wide", "qwen2.5-0.5b"}) expect_opt_out_keeps_the_trace(preset, "MINFER_NO_L2_EVICT_FIRST");
}

// The decode attention's combine one CTA an SM with its partials bulk-copied gives the logits of
// the combine without either (MINFER_NO_COMBINE_SPREAD, MINFER_NO_COMBINE_STAGING); the kernel
// test (SplitKAttention...) compares the staged sums bitwise at depths of up to 16,384.
TEST(GpuBackend, CombineSpreadAndStagingKeepTheBits) {
  MINFER_REQUIRE_GPU();
  expect_opt_out_keeps_the_trace("qwen2.5-0.5b", "MINFER_NO_COMBINE_SPREAD");
  expect_opt_out_keeps_the_trace("qwen2.5-0.5b", "MINFER_NO_COMBINE_STAGING");
}

// qwen2.5-1.5b's gate+up launches (q4_K, 1,536 columns, 1,120 row tiles: more than three CTAs an
// SM take at once on an H200's 132 SMs) with the activations in shared memory give the logits of B
// from global memory (MINFER_NO_SHARED_ACTIVATIONS).
TEST(GpuBackend, SharedActivationsKeepTheBitsOfGlobal) {
  MINFER_REQUIRE_GPU();
  expect_opt_out_keeps_the_trace("qwen2.5-1.5b", "MINFER_NO_SHARED_ACTIVATIONS");
}

// A sequence's greedy tokens and logits are the same alone (prompt in one step, then one token per
// step) as among 31 others through the scheduler, with its prompt cut into chunks that share
// steps with other sequences' decode tokens (the decode matmul then runs many rows on the
// tensor-core kernel, the prompt GEMM fewer rows).
TEST(GpuBackend, GreedyStreamsDoNotDependOnTheBatch) {
  MINFER_REQUIRE_GPU();
  for (const char* preset : {"tiny", "qwen2.5-0.5b"}) {
    const Synth& s = synth_model(preset);
    const auto prompts = test::random_prompts(32, 1, 90, s.model.hp.n_vocab, 20);
    const auto alone = test::greedy_alone(s.model, gpu_backend(), prompts, 16);
    for (const int step_tokens : {64, 13}) {
      const auto together = test::greedy_together(s.model, gpu_backend(), prompts, 16, 32, step_tokens);
      for (size_t i = 0; i < prompts.size(); ++i) {
        ASSERT_EQ(together[i].tokens, alone[i].tokens) << preset << " prompt " << i << " step tokens " << step_tokens;
        ASSERT_EQ(std::memcmp(together[i].first_logits.data(), alone[i].first_logits.data(),
                              alone[i].first_logits.size() * 4), 0)
            << preset << " prompt " << i << " step tokens " << step_tokens;
      }
    }
  }
}

// The q4_K / q6_K decode matmul on warpgroup MMA (33..64 rows) gives the mma.sync kernel's bits in
// a whole model: 64 sequences' greedy tokens and first logits with it on every launch that stores
// (MINFER_DECODE_WGMMA_MIN_WEIGHTS=0; tiny's Q4_K_M mix is q4_K but for ffn_down in two layers and
// the output head, q6_K; K of 256 and 768: groups in fewer streams than 8), its operand image
// written by rms_norm / swiglu or (MINFER_NO_OPERAND_IMAGE_FUSE) by its own builder, and with
// MINFER_NO_DECODE_WGMMA, the prompts cut into chunks beside decode rows.
TEST(GpuBackend, DecodeWgmmaKeepsTheMmaKernelsBits) {
  MINFER_REQUIRE_GPU();
  if (!cuda::prefill_gemm_device_has_wgmma()) GTEST_SKIP() << "needs an sm_90 device";
  const Synth& s = synth_model("tiny");
  const auto prompts = test::random_prompts(64, 1, 40, s.model.hp.n_vocab, 22);
  using Env = std::vector<std::pair<const char*, const char*>>;
  const auto run = [&](const Env& env) {
    for (const auto& [name, value] : env) setenv(name, value, 1);
    auto streams = test::greedy_together(s.model, gpu_backend(), prompts, 12, 64, 96);
    for (const auto& [name, value] : env) unsetenv(name);
    return streams;
  };
  const auto mma = run({{"MINFER_NO_DECODE_WGMMA", "1"}});
  for (const Env& env : {Env{{"MINFER_DECODE_WGMMA_MIN_WEIGHTS", "0"}},
                         Env{{"MINFER_DECODE_WGMMA_MIN_WEIGHTS", "0"}, {"MINFER_NO_OPERAND_IMAGE_FUSE", "1"}}}) {
    const auto wgmma = run(env);
    for (size_t i = 0; i < prompts.size(); ++i) {
      ASSERT_EQ(wgmma[i].tokens, mma[i].tokens) << "prompt " << i << ", " << env.size() << " variables set";
      ASSERT_EQ(std::memcmp(wgmma[i].first_logits.data(), mma[i].first_logits.data(), mma[i].first_logits.size() * 4), 0)
          << "prompt " << i << ", " << env.size() << " variables set";
    }
  }
}

// Tokens drawn on the device (OpenAI's defaults: nothing cut, no penalty) are the host sampler's
// tokens from the same logits and seed, for 32 sequences at once and one at a time.
TEST(GpuBackend, DeviceDrawsAreTheHostSamplersTokens) {
  MINFER_REQUIRE_GPU();
  const Synth& s = synth_model("qwen2.5-0.5b");
  const auto prompts = test::random_prompts(32, 1, 60, s.model.hp.n_vocab, 21);
  const SamplerParams sp = test::whole_vocabulary_sampling(1.0f, 77);
  const auto host = test::sampled_streams(s.model, gpu_backend(), prompts, 16, 32, sp, true);
  ASSERT_EQ(host.backend_draws, 0);
  for (int max_seqs : {32, 1}) {
    const auto drawn = test::sampled_streams(s.model, gpu_backend(), prompts, 16, max_seqs, sp, false);
    ASSERT_EQ(drawn.backend_draws, 32 * 16);
    for (size_t i = 0; i < prompts.size(); ++i)
      ASSERT_EQ(drawn.tokens[i], host.tokens[i]) << "prompt " << i << " max_seqs " << max_seqs;
  }
}

// Prefill of N then one decode step vs one prefill of N + 1: the two paths differ in precision
// (bf16 GEMM + f16 flash attention vs q8 decode matmul + f32 split-K attention; docs/07 §4), so
// each is held to its oracle, and their difference to the oracles' own difference.
TEST(GpuBackend, PrefillThenDecodeEqualsOnePrefill) {
  MINFER_REQUIRE_GPU();
  const Synth& s = synth_model("qwen2.5-0.5b");
  const auto tokens = random_tokens(40, s.model.hp.n_vocab, 3);
  auto a = gpu_session(s), b = gpu_session(s);
  PrecisionOracle oa(s.model, s.graph, 256), ob(s.model, s.graph, 256);
  const std::span<const int32_t> all(tokens);
  a->eval(all.first(39));
  const std::vector<float> la = copy(a->decode(tokens[39])), lb = copy(b->eval(all));
  oa.forward(all.first(39), 0);
  const std::vector<float> ra = oa.forward(all.subspan(39), 39), rb = ob.forward(all, 0);
  std::printf("[ measured ] prefill+decode vs prefill: GPU %.2e, oracles %.2e; vs oracle %.2e / %.2e\n",
              rel_err(la, lb), rel_err(ra, rb), rel_err(la, ra), rel_err(lb, rb));
  EXPECT_LT(rel_err(la, ra), logits_bound("qwen2.5-0.5b", false));
  EXPECT_LT(rel_err(lb, rb), logits_bound("qwen2.5-0.5b", true));
  EXPECT_LT(rel_err(la, lb), rel_err(ra, rb) + 1e-2);
}

TEST(GpuBackend, AllLogitsRowsMatchLastLogits) {
  MINFER_REQUIRE_GPU();
  const Synth& s = synth_model("tiny");
  const auto tokens = random_tokens(17, s.model.hp.n_vocab, 4);
  auto a = gpu_session(s), b = gpu_session(s);
  const std::vector<float> all = copy(a->eval_all(tokens)), last = copy(b->eval(tokens));
  const size_t V = size_t(s.model.hp.n_vocab);
  ASSERT_EQ(all.size(), tokens.size() * V);
  EXPECT_EQ(std::memcmp(all.data() + all.size() - V, last.data(), V * 4), 0);  // the same head kernel
}

// eval_all cuts its micro-batches to the output rows a step holds (SessionOptions::max_outputs):
// the prompt GEMMs plan their K split for a fixed token count and attention reads the cache the
// same way, so 8-row micro-batches give the bits of one 40-row step.
TEST(GpuBackend, AllLogitsDoNotDependOnTheOutputRowsAStepHolds) {
  MINFER_REQUIRE_GPU();
  const Synth& s = synth_model("qwen2.5-0.5b");
  const auto tokens = random_tokens(40, s.model.hp.n_vocab, 6);
  std::vector<std::vector<float>> logits;
  for (int max_outputs : {64, 8}) {
    SessionOptions o;
    o.n_ctx = 256;
    o.max_outputs = max_outputs;
    Session session(s.model, o, gpu_backend()(s.model));
    logits.push_back(copy(session.eval_all(tokens)));
  }
  ASSERT_EQ(logits[0].size(), tokens.size() * size_t(s.model.hp.n_vocab));
  EXPECT_EQ(std::memcmp(logits[0].data(), logits[1].data(), logits[0].size() * 4), 0);
}

TEST(GpuBackend, FullContextIsAClearError) {
  MINFER_REQUIRE_GPU();
  const Synth& s = synth_model("tiny");
  auto b = gpu_session(s, Fusions::from_env(), 16);
  const auto tokens = random_tokens(16, s.model.hp.n_vocab, 5);
  b->eval(tokens);
  try {
    b->decode(tokens[0]);
    FAIL() << "no error for position 16 of a 16-position context";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("n_ctx=16"), std::string::npos) << e.what();
  }
  EXPECT_THROW(b->decode_greedy(tokens[0]), Error);
}

TEST(GpuBackend, CensusCountsTheDecodeKernels) {
  MINFER_REQUIRE_GPU();
  const Synth& s = synth_model("tiny");
  auto b = gpu_session(s);
  const auto tokens = random_tokens(5, s.model.hp.n_vocab, 6);
  b->eval(tokens);
  auto& cb = static_cast<cuda::CudaBackend&>(b->engine().backend());
  cb.census_next_step();
  b->decode_greedy(tokens[0]);
  const auto census = cb.census_result();
  int launches = 0;
  std::map<std::string, int> by_name;
  std::map<std::string, int64_t> bytes;
  for (const auto& k : census) {
    launches += k.launches;
    by_name[k.name] = k.launches;
    bytes[k.name] = k.bytes;
    EXPECT_GT(k.microseconds, 0.0) << k.name;
  }
  const int L = s.model.hp.n_layer;
  // One row: the tensor-core kernel unless MINFER_MMA_MIN_ROWS raises the crossover.
  const std::string kernel = cuda::mma_min_rows() <= 1 ? "_mma" : "";
  EXPECT_EQ(by_name["matvec_qkv_rope_kv" + kernel], L);
  EXPECT_EQ(by_name["matvec_gate_up_swiglu" + kernel], L);  // tiny's (96 row tiles): the matmul, then the swiglu kernel
  EXPECT_EQ(by_name["rms_norm_quant_q8"], 2 * L + 1);
  EXPECT_EQ(by_name.count("quantize_q8"), 0u);  // every matmul input's plane comes from its producer
  EXPECT_EQ(by_name["attention_split_combine_quant_q8"], L);
  EXPECT_EQ(by_name["argmax"], 1);
  EXPECT_GT(launches, 0);
  // The bytes each kernel must move: the matmuls stream every weight matrix once (the file's 2-D
  // tensors but the token embedding: tiny's head is not tied); the attention reads K and V (f16) of
  // the 6 positions its row attends to (the 5 of the prompt and its own) in every layer.
  int64_t matrices = 0, streamed = 0;
  for (const Tensor& t : s.model.file.tensors())
    if (t.shape.size() >= 2 && &t != s.model.token_embd) matrices += int64_t(t.nbytes);
  for (const auto& [name, n] : bytes)
    if (name.rfind("matvec", 0) == 0) streamed += n;
  EXPECT_EQ(streamed, matrices);
  EXPECT_EQ(bytes["attention_split_combine_quant_q8"],
            int64_t(L) * 6 * s.model.hp.n_head_kv * s.model.hp.head_dim * 2 * 2);
  EXPECT_EQ(bytes["argmax"], 0);
}

// The timeline's probes (a build configured with -DMINFER_TIMELINE=ON): every CTA of a graph step
// records, its launches come back in stream order, and no launch is released before the one before
// it has ended (PDL's wait returns only once the previous kernel is complete).
TEST(GpuBackend, TimelineRecordsEveryCtaOfAStepInLaunchOrder) {
  MINFER_REQUIRE_GPU();
  if (!cuda::kTimelineBuilt) GTEST_SKIP() << "the probes are in builds configured with -DMINFER_TIMELINE=ON";
  const Synth& s = synth_model("tiny");
  auto b = gpu_session(s);
  const auto tokens = random_tokens(5, s.model.hp.n_vocab, 8);
  b->eval(tokens);
  auto& cb = static_cast<cuda::CudaBackend&>(b->engine().backend());
  const int32_t next = b->decode_greedy(tokens[0]);  // captures the step's graph
  cb.timeline_next_step();
  b->decode_greedy(next);
  const TimelineSummary& t = cb.timeline_result();
  ASSERT_FALSE(t.launches.empty());
  EXPECT_EQ(t.unmatched_launches, 0);
  EXPECT_EQ(t.unmatched_grids, 0);
  std::map<std::string, int> by_label;
  double previous_exit = 0, increments = 0;
  // Events placed by SM clocks (a coarse timer) may misplace a launch's end by a small part of a tick.
  const double slack = t.placed_by_clock ? 0.25e-3 * t.tick_ns : 0.0;
  for (size_t i = 0; i < t.launches.size(); ++i) {
    const TimelineRow& r = t.launches[i];
    ++by_label[r.label];
    EXPECT_EQ(r.recorded, r.ctas) << i << " " << r.label;
    EXPECT_LE(r.first_enter, r.last_enter) << i;
    EXPECT_EQ(r.waited, r.ctas) << i;  // every kernel waits (await_predecessor)
    EXPECT_LE(r.first_enter, r.first_wait) << i;
    EXPECT_LE(r.first_wait, r.last_exit) << i;
    if (i > 0) EXPECT_GE(r.release, -slack) << i << " " << r.label;
    EXPECT_GE(r.last_exit, previous_exit - slack) << i;
    previous_exit = r.last_exit;
    increments += r.increment;
  }
  EXPECT_NEAR(increments, t.step_us, 1e-6 + 4 * slack);
  EXPECT_EQ(by_label["rms_norm_quant_q8"], 2 * s.model.hp.n_layer + 1);
  EXPECT_EQ(by_label["argmax"], 2);  // slices, then the pick
  EXPECT_GT(t.sm_busy, 0.0);
  EXPECT_LE(t.sm_busy, 1.0);
}

// The step times count every forward since the reset, with device time that fits in the wall time
// around them; the first step after a reset has no idle time before it. Split, a step's three parts
// add up to its device time.
TEST(GpuBackend, StepTimesCountEveryForwardSinceTheReset) {
  MINFER_REQUIRE_GPU();
  const Synth& s = synth_model("tiny");
  auto b = gpu_session(s);
  const auto tokens = random_tokens(5, s.model.hp.n_vocab, 7);
  b->eval(tokens);
  auto& cb = static_cast<cuda::CudaBackend&>(b->engine().backend());
  cb.reset_step_times();
  EXPECT_EQ(cb.step_times().steps, 0);
  const auto t0 = std::chrono::steady_clock::now();
  int32_t next = b->decode_greedy(tokens[0]);
  EXPECT_EQ(cb.step_times().steps, 1);
  EXPECT_EQ(cb.step_times().idle_seconds, 0.0);
  for (int i = 0; i < 4; ++i) next = b->decode_greedy(next);
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const cuda::StepTimes& st = cb.step_times();
  EXPECT_EQ(st.steps, 5);
  EXPECT_GT(st.device_seconds, 0.0);
  EXPECT_GT(st.idle_seconds, 0.0);  // the host's turn between steps is never free
  // Both are intervals inside the host's window (the GPU's clock: 1 % and 0.1 ms of slack).
  EXPECT_LE(st.idle_seconds + st.device_seconds, wall * 1.01 + 1e-4);
  EXPECT_EQ(st.split_steps, 0);  // off unless asked for

  // Split: only the steps after the switch, each in three parts that add up to its device time.
  cb.split_step_times(true);
  const double device_before = st.device_seconds;
  for (int i = 0; i < 3; ++i) next = b->decode_greedy(next);
  const double split_device = st.device_seconds - device_before;
  cb.split_step_times(false);
  b->decode_greedy(next);
  EXPECT_EQ(st.steps, 9);
  EXPECT_EQ(st.split_steps, 3);
  EXPECT_GT(st.upload_seconds, 0.0);
  EXPECT_GT(st.launch_seconds, 0.0);
  EXPECT_GT(st.copy_back_seconds, 0.0);
  // The events' resolution is about half a microsecond: three parts of three steps.
  EXPECT_NEAR(st.upload_seconds + st.launch_seconds + st.copy_back_seconds, split_device, 9 * 1e-6);
}

// A step's rows and block tables go up in one device buffer that grows with the tables, dropping
// the captured graphs, which hold its address. On tiny (block size 16) eight prompt rows' six
// sections and 13 tables outgrow its first 56 ints during the prompt, and a decode row's six and
// 107 tables the doubled 112 at position 1,697: the graphs' logits stay the eager path's, bit for
// bit, on both sides of it.
TEST(GpuBackend, GrowingBlockTablesKeepTheGraphsBits) {
  MINFER_REQUIRE_GPU();
  const Synth& s = synth_model("tiny");
  SessionOptions o;
  o.n_ctx = 2048;
  o.ubatch = 8;
  o.max_outputs = 8;
  o.kv_block_size = 16;
  Fusions eager = Fusions::from_env();
  eager.cuda_graph = false;
  Session graphs(s.model, o, gpu_backend()(s.model)), steps(s.model, o, gpu_backend(eager)(s.model));
  const auto prompt = random_tokens(200, s.model.hp.n_vocab, 5);
  graphs.eval(prompt);
  steps.eval(prompt);
  int32_t token = prompt.back();
  for (int i = 0; i < 1600; ++i) {
    const std::vector<float> a = copy(graphs.decode(token)), b = copy(steps.decode(token));
    ASSERT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0) << "the logits differ at position " << 200 + i;
    token = argmax(a);
  }
}

// Greedy decoding with each step queued behind the one it takes its tokens from (the token never
// leaves the device: that step's argmax also writes the next step's token section) gives each
// prompt the tokens it gets alone, one read-back a step: one sequence (a graph of one row) and three
// (padded to a graph's bucket of four), captured and launch by launch; KV blocks of 4 positions, so
// the block tables outgrow the step buffers several times while a step is in flight.
TEST(GpuBackend, FedStepsGiveEachPromptsGreedyStream) {
  MINFER_REQUIRE_GPU();
  const Synth& s = synth_model("tiny");
  Fusions eager = Fusions::from_env();
  eager.cuda_graph = false;
  const int n_gen = 600;
  for (const int n : {1, 3}) {
    const auto prompts = test::random_prompts(n, 2, 12, s.model.hp.n_vocab, 31 + uint64_t(n));
    const auto alone = test::greedy_alone(s.model, gpu_backend(), prompts, n_gen);
    for (const bool graphs : {true, false}) {
      const auto fed = test::greedy_fed(s.model, graphs ? gpu_backend() : gpu_backend(eager), prompts, n_gen, 4);
      for (size_t i = 0; i < prompts.size(); ++i)
        ASSERT_EQ(fed[i], alone[i].tokens) << n << " sequences, prompt " << i << (graphs ? ", graphs" : ", eager");
    }
  }
}

// Session::generate_greedy on the GPU (the token never on the host between steps) gives
// decode_greedy's tokens, leaves the same context (the next token's logits, bit for bit) and stops
// at a full context with the same error.
TEST(GpuBackend, GenerateGreedyIsDecodeGreedyAStepAtATime) {
  MINFER_REQUIRE_GPU();
  const Synth& s = synth_model("tiny");
  test::expect_generate_greedy_is_decode_greedy(s.model, gpu_backend());
}

// `minfer batch` on the GPU: --parallel 1 and --parallel 8 write the same greedy lines.
TEST(GpuBackend, BatchCliParallelOneEqualsEight) {
  MINFER_REQUIRE_GPU();
  synth::Options o;
  o.preset = "tiny";
  o.ftype = synth::FileType::Q4_K_M;
  o.seed = seed();
  o.tokenizer = "builtin";
  const auto dir = temp_dir("gpu-batch-cli");
  o.out_path = (dir / "tiny.gguf").string();
  synth::write_model(o);
  {
    std::ofstream f(dir / "prompts.txt");
    for (int i = 0; i < 20; ++i) f << "prompt number " << i << std::string(size_t(i * 3), 'x') << "\n";
  }
  auto run = [&](int parallel) {
    const std::string out = (dir / ("out" + std::to_string(parallel))).string();
    std::string log;
    const int rc = run_command(minfer_binary() + " batch -m " + o.out_path + " -f " + (dir / "prompts.txt").string() +
                                   " -n 24 --temp 0 --ignore-eos --backend cuda --parallel " + std::to_string(parallel) +
                                   " -o " + out,
                               &log);
    EXPECT_EQ(rc, 0) << log;
    std::ifstream in(out);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  const std::string one = run(1), eight = run(8);
  EXPECT_FALSE(one.empty());
  EXPECT_EQ(one, eight);
}

}  // namespace
}  // namespace minfer::test
