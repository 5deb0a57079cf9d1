// The CUDA backend end to end: logits against a CPU oracle at the GPU's storage precisions on
// synthesized models, greedy streams against the CPU backend on the trained default model,
// every fusion opt-out bit for bit, prefill/decode consistency, a full KV cache.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <cstring>
#include <map>
#include <random>

#include "backend/cpu/ops.h"
#include "backend/cuda/cuda_backend.h"
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

std::unique_ptr<cuda::CudaBackend> gpu(const Synth& s, cuda::Fusions f, int n_ctx = 256) {
  auto b = std::make_unique<cuda::CudaBackend>(s.model, s.graph, f);
  b->reserve(n_ctx, 64);
  return b;
}

// The CPU reference ops (backend/cpu/ops.h) run at the GPU's storage precisions: the oracle for
// end-to-end logits on synthesized models. Every matmul input is quantized to q8 (both backends
// do this) and q8 rounding is discontinuous, so on these random-weight models any difference at
// all (f16 vs f32 KV, a summation order) flips some q8 values and the flips cascade through the
// layers to a floor of 1-4 % logits error: the f16 KV cache alone moves the CPU backend's own
// logits by 1.2 % (tiny) / 2.8 % (0.5b shape), a rope position off by one by 1.2 % (docs/07 §4).
// Matching the storage precisions (f16 K/V; for multi-token batches the GEMM's bf16 activations
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
    const cpu::RopeTable rope =
        cpu::rope_table(pos, n, hp.head_dim, hp.rope_base, hp.rope_freq_scale,
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
                           {k_[size_t(node.layer)].data(), v_[size_t(node.layer)].data(), n_ctx_}, out);
          }
          break;
        }
        case Op::SwiGLU: cpu::swiglu(in0, slot(node.in[1]), out, n * w); break;
        case Op::Add: cpu::add(in0, slot(node.in[1]), out, n * w); break;
        case Op::Output: {
          logits.resize(size_t(w));
          const int64_t in_w = g_.slot_width[size_t(node.in[0])];
          cpu::matmul(pool_, *node.weight, nullptr, in0 + (n - 1) * in_w, 1, logits.data(), scratch_);
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
};

// Measured floors ×2 (docs/07 §4): tiny prefill ≤ 5.2e-3, tiny decode ≤ 9.7e-3, 0.5b ≤ 2.6e-2.
double logits_bound(const std::string& preset, bool prefill) {
  if (preset == "tiny") return prefill ? 1e-2 : 2e-2;
  return 5e-2;
}

class GpuModel : public ::testing::TestWithParam<const char*> {};

// The decode path (prompt fed one token at a time) and the prefill path against the oracle, and
// the size of the same difference against the f32-cache CPU backend, for the record.
TEST_P(GpuModel, LogitsMatchThePrecisionOracle) {
  MINFER_REQUIRE_GPU();
  const Synth& s = synth_model(GetParam());
  const auto prompt = random_tokens(24, s.model.hp.n_vocab, 1);
  auto cpu = make_cpu_backend(s.model, s.graph, 0);
  cpu->reserve(256, 64);
  PrecisionOracle batch_oracle(s.model, s.graph, 256), step_oracle(s.model, s.graph, 256);
  auto g_batch = gpu(s, cuda::Fusions::from_env());
  auto g_step = gpu(s, cuda::Fusions::from_env());
  std::vector<float> lg, lc, ls;
  g_batch->forward({prompt, 0, false}, lg);
  cpu->forward({prompt, 0, false}, lc);
  const std::vector<float> lo = batch_oracle.forward(prompt, 0);
  const double prefill_err = rel_err(lg, lo);
  std::printf("[ measured ] %s prefill: GPU vs oracle %.2e, GPU vs CPU backend %.2e, oracle vs CPU backend %.2e\n",
              GetParam(), prefill_err, rel_err(lg, lc), rel_err(lo, lc));
  EXPECT_LT(prefill_err, logits_bound(GetParam(), true)) << "prefill logits";
  double worst = 0;
  for (size_t t = 0; t < prompt.size(); ++t) {
    const std::span<const int32_t> one(&prompt[t], 1);
    g_step->forward({one, int(t), false}, ls);
    const std::vector<float> lso = step_oracle.forward(one, int(t));
    worst = std::max(worst, rel_err(ls, lso));
  }
  // decode steps continue both streams from the oracle's greedy tokens
  int32_t tok = argmax(lo);
  for (int step = 0; step < 8; ++step) {
    const int32_t in[1] = {tok};
    const int pos = int(prompt.size()) + step;
    g_step->forward({in, pos, false}, ls);
    const std::vector<float> lso = step_oracle.forward(in, pos);
    worst = std::max(worst, rel_err(ls, lso));
    tok = argmax(lso);
  }
  std::printf("[ measured ] %s decode path, 32 steps: worst GPU vs oracle %.2e\n", GetParam(), worst);
  EXPECT_LT(worst, logits_bound(GetParam(), false)) << "decode-path logits";
}

INSTANTIATE_TEST_SUITE_P(Presets, GpuModel, ::testing::Values("tiny", "qwen2.5-0.5b"));

// On the trained default model the GPU and the CPU backend pick the same greedy tokens. Random
// prompts still meet near-ties (the CPU's top-2 gap fell to 0.001-0.01 within 64 steps for 4 of 6
// seeds, logit rms ≈ 3.5), so where the streams part, the CPU must have rated the GPU's pick within
// a few times the measured per-logit difference of its own; a real bug parts them by far more.
TEST(GpuBackend, DefaultModelGreedyStreamsMatchTheCpuBackend) {
  MINFER_REQUIRE_GPU();
  const auto path = source_dir() / "models" / "default.gguf";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << path << " not present";
  const Model model = Model::load(path.string());
  const Graph graph = build_graph(model);
  auto cpu = make_cpu_backend(model, graph, 0);
  cpu->reserve(256, 64);
  cuda::CudaBackend g(model, graph, cuda::Fusions::from_env());
  g.reserve(256, 64);
  std::mt19937_64 rng(seed() + 7);
  std::vector<int32_t> prompt(16);
  for (auto& t : prompt) t = int32_t(rng() % 1000 + 100);  // ordinary (non-special) tokens
  std::vector<float> lc, lg;
  cpu->forward({prompt, 0, false}, lc);
  g.forward({prompt, 0, false}, lg);
  const double err = rel_err(lg, lc);
  double rms = 0;
  for (float v : lc) rms += double(v) * v;
  rms = std::sqrt(rms / double(lc.size()));
  std::printf("[ measured ] default model prefill logits GPU vs CPU backend %.2e (logit rms %.2f)\n", err, rms);
  EXPECT_LT(err, 2e-2) << "measured 5-8e-3 (f16 KV, bf16 prefill GEMM vs f32 / q8)";
  const double tie = 4 * std::max(err, 5e-3) * rms;  // a few times the per-logit difference
  int32_t tc = argmax(lc), tg = argmax(lg);
  int pos = int(prompt.size()), agree = 0;
  for (; agree < 64; ++agree, ++pos) {
    if (tg != tc) {
      EXPECT_LT(lc[size_t(tc)] - lc[size_t(tg)], tie)
          << "step " << agree << ": the GPU picked " << tg << ", the CPU " << tc << " by a clear margin";
      break;
    }
    const int32_t in[1] = {tc};
    cpu->forward({in, pos, false}, lc);
    tc = argmax(lc);
    tg = g.forward_greedy({in, pos, false});
  }
  std::printf("[ measured ] default model greedy agreement: %d of 64 steps\n", agree);
}

// Runs a prompt then `steps` decode steps; returns every step's logits and the greedy stream.
struct Trace {
  std::vector<std::vector<float>> logits;
  std::vector<int32_t> greedy;
};
Trace trace(cuda::CudaBackend& b, const std::vector<int32_t>& prompt, int steps) {
  Trace t;
  std::vector<float> l;
  b.forward({prompt, 0, false}, l);
  t.logits.push_back(l);
  int32_t tok = argmax(l);
  for (int i = 0; i < steps; ++i) {
    const int32_t in[1] = {tok};
    b.forward({in, int(prompt.size()) + i, false}, l);
    t.logits.push_back(l);
    tok = argmax(l);
  }
  // greedy path (argmax on the device) continues from the same cache state
  for (int i = 0; i < steps; ++i) {
    const int32_t in[1] = {tok};
    tok = b.forward_greedy({in, int(prompt.size()) + steps + i, false});
    t.greedy.push_back(tok);
  }
  return t;
}

TEST(GpuBackend, EveryOptOutRestoresTheFusedResultBitForBit) {
  MINFER_REQUIRE_GPU();
  const Synth& s = synth_model("qwen2.5-0.5b");
  const auto prompt = random_tokens(9, s.model.hp.n_vocab, 2);
  cuda::Fusions all;  // everything on
  auto ref_backend = gpu(s, all);
  const Trace ref = trace(*ref_backend, prompt, 12);
  ref_backend.reset();
  std::vector<std::pair<std::string, cuda::Fusions>> variants;
  for (const char* name : {"decode_a_fuse", "cuda_graph", "fused_qkv", "fused_ffn", "fused_residual"}) {
    cuda::Fusions f = all;
    if (!std::strcmp(name, "decode_a_fuse")) f.decode_a_fuse = false;
    if (!std::strcmp(name, "cuda_graph")) f.cuda_graph = false;
    if (!std::strcmp(name, "fused_qkv")) f.fused_qkv = false;
    if (!std::strcmp(name, "fused_ffn")) f.fused_ffn = false;
    if (!std::strcmp(name, "fused_residual")) f.fused_residual = false;
    variants.emplace_back(std::string("no_") + name, f);
  }
  variants.emplace_back("none", cuda::Fusions::none());
  for (const auto& [name, f] : variants) {
    auto b = gpu(s, f);
    const Trace t = trace(*b, prompt, 12);
    ASSERT_EQ(t.logits.size(), ref.logits.size());
    for (size_t i = 0; i < t.logits.size(); ++i)
      ASSERT_EQ(std::memcmp(t.logits[i].data(), ref.logits[i].data(), t.logits[i].size() * 4), 0)
          << name << ": logits of step " << i << " differ";
    ASSERT_EQ(t.greedy, ref.greedy) << name;
  }
}

// Prefill of N then one decode step vs one prefill of N + 1: the two paths differ in precision
// (bf16 GEMM + f16 flash attention vs q8 MMVQ + f32 split-K attention; docs/07 §4), so each is
// held to its oracle, and their difference to the oracles' own difference.
TEST(GpuBackend, PrefillThenDecodeEqualsOnePrefill) {
  MINFER_REQUIRE_GPU();
  const Synth& s = synth_model("qwen2.5-0.5b");
  const auto tokens = random_tokens(40, s.model.hp.n_vocab, 3);
  auto a = gpu(s, cuda::Fusions::from_env());
  auto b = gpu(s, cuda::Fusions::from_env());
  PrecisionOracle oa(s.model, s.graph, 256), ob(s.model, s.graph, 256);
  std::vector<float> la, lb;
  const std::span<const int32_t> all(tokens);
  a->forward({all.first(39), 0, false}, la);
  a->forward({all.subspan(39), 39, false}, la);
  b->forward({all, 0, false}, lb);
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
  auto a = gpu(s, cuda::Fusions::from_env());
  auto b = gpu(s, cuda::Fusions::from_env());
  std::vector<float> all, last;
  a->forward({tokens, 0, true}, all);
  b->forward({tokens, 0, false}, last);
  const size_t V = size_t(s.model.hp.n_vocab);
  ASSERT_EQ(all.size(), tokens.size() * V);
  const std::vector<float> tail(all.end() - long(V), all.end());
  EXPECT_LT(rel_err(tail, last), 1e-2);
}

TEST(GpuBackend, FullKvCacheIsAClearError) {
  MINFER_REQUIRE_GPU();
  const Synth& s = synth_model("tiny");
  auto b = gpu(s, cuda::Fusions::from_env(), 16);
  const auto tokens = random_tokens(16, s.model.hp.n_vocab, 5);
  std::vector<float> l;
  b->forward({tokens, 0, false}, l);
  const int32_t one[1] = {tokens[0]};
  try {
    b->forward({one, 16, false}, l);
    FAIL() << "no error for position 16 of a 16-position cache";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("KV cache of 16 positions"), std::string::npos) << e.what();
  }
  EXPECT_THROW(b->forward_greedy({one, 17, false}), Error);
}

TEST(GpuBackend, CensusCountsTheDecodeKernels) {
  MINFER_REQUIRE_GPU();
  const Synth& s = synth_model("tiny");
  auto b = gpu(s, cuda::Fusions::from_env());
  const auto tokens = random_tokens(5, s.model.hp.n_vocab, 6);
  std::vector<float> l;
  b->forward({tokens, 0, false}, l);
  const auto census = b->census(tokens[0], 5);
  int launches = 0;
  std::map<std::string, int> by_name;
  for (const auto& k : census) {
    launches += k.launches;
    by_name[k.name] = k.launches;
    EXPECT_GT(k.microseconds, 0.0) << k.name;
  }
  const int L = s.model.hp.n_layer;
  EXPECT_EQ(by_name["matvec_qkv_rope_kv"], L);
  EXPECT_EQ(by_name["matvec_gate_up"], L);
  EXPECT_EQ(by_name["rms_norm_quant_pad40"], 2 * L + 1);
  EXPECT_EQ(by_name["quantize_pad40"], L);  // attn_out only: its producer is attention
  EXPECT_EQ(by_name["argmax"], 1);
  EXPECT_GT(launches, 0);
}

}  // namespace
}  // namespace minfer::test
