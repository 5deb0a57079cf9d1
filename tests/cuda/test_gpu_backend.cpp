// The CUDA backend end to end on synthesized models: logits against the CPU backend, greedy
// streams, every fusion opt-out bit for bit, prefill/decode consistency, a full KV cache.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <random>

#include "backend/cuda/cuda_backend.h"
#include "convert/synth.h"
#include "gpu_support.h"
#include "sampling/sampler.h"
#include "util/error.h"

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

class GpuModel : public ::testing::TestWithParam<const char*> {};

TEST_P(GpuModel, LogitsMatchCpuAndGreedyStreamsAgree) {
  MINFER_REQUIRE_GPU();
  const Synth& s = synth_model(GetParam());
  auto cpu = make_cpu_backend(s.model, s.graph, 0);
  cpu->reserve(256, 64);
  auto g = gpu(s, cuda::Fusions::from_env());
  const auto prompt = random_tokens(24, s.model.hp.n_vocab, 1);
  std::vector<float> lc, lg;
  cpu->forward({prompt, 0, false}, lc);
  g->forward({prompt, 0, false}, lg);
  EXPECT_LT(rel_err(lg, lc), 1e-2) << "prefill logits";
  // decode: logits and 64 greedy steps
  int32_t tc = argmax(lc), tg = argmax(lg);
  ASSERT_EQ(tg, tc) << "first token after the prompt";
  int pos = int(prompt.size());
  for (int step = 0; step < 64; ++step, ++pos) {
    const int32_t in[1] = {tc};
    if (step < 4) {
      cpu->forward({in, pos, false}, lc);
      g->forward({in, pos, false}, lg);
      EXPECT_LT(rel_err(lg, lc), 1e-2) << "decode logits, step " << step;
      tc = argmax(lc);
      tg = argmax(lg);
    } else {
      tc = cpu->forward_greedy({in, pos, false});
      tg = g->forward_greedy({in, pos, false});
    }
    ASSERT_EQ(tg, tc) << "greedy token " << step;
  }
}

INSTANTIATE_TEST_SUITE_P(Presets, GpuModel, ::testing::Values("tiny", "qwen2.5-0.5b"));

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

TEST(GpuBackend, PrefillThenDecodeEqualsOnePrefill) {
  MINFER_REQUIRE_GPU();
  const Synth& s = synth_model("qwen2.5-0.5b");
  const auto tokens = random_tokens(40, s.model.hp.n_vocab, 3);
  auto a = gpu(s, cuda::Fusions::from_env());
  auto b = gpu(s, cuda::Fusions::from_env());
  std::vector<float> la, lb;
  const std::span<const int32_t> all(tokens);
  a->forward({all.first(39), 0, false}, la);
  a->forward({all.subspan(39), 39, false}, la);
  b->forward({all, 0, false}, lb);
  EXPECT_LT(rel_err(la, lb), 1e-2);
  EXPECT_EQ(argmax(la), argmax(lb));
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
