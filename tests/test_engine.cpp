// End to end on the synthesized "tiny" model: the CPU forward pass against a float64 reference,
// prefill/decode consistency, determinism, context limits and MINFER_DUMP + dump-diff.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>

#include "convert/synth.h"
#include "engine/session.h"
#include "quant/quant.h"
#include "sampling/sampler.h"
#include "support.h"
#include "util/error.h"

namespace minfer {
namespace {

namespace fs = std::filesystem;

const std::string& tiny_model(synth::FileType ft) {
  static std::map<synth::FileType, std::string> paths;
  auto it = paths.find(ft);
  if (it != paths.end()) return it->second;
  synth::Options o;
  o.preset = "tiny";
  o.ftype = ft;
  o.seed = test::seed();
  o.out_path = (test::temp_dir("engine") / (std::string("tiny-") + synth::file_type_name(ft) + ".gguf")).string();
  synth::write_model(o);
  return paths[ft] = o.out_path;
}

std::vector<int32_t> random_tokens(int n, int n_vocab, uint64_t salt) {
  std::mt19937_64 rng(test::seed() + salt);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& id : t) id = int32_t(rng() % uint64_t(n_vocab));
  return t;
}

SessionOptions cpu_options(int n_ctx = 64, int ubatch = 512) {
  SessionOptions o;
  o.backend = BackendKind::Cpu;
  o.n_ctx = n_ctx;
  o.ubatch = ubatch;
  o.n_threads = 2;
  return o;
}

// ---- float64 reference forward pass (independent of the graph and the CPU ops) -------------

// Dequantized once per tensor (the reference asks for the same weights for every token).
const std::vector<double>& weights(const Tensor* t) {
  static std::map<std::pair<const Tensor*, const uint8_t*>, std::vector<double>> cache;
  auto [it, fresh] = cache.try_emplace({t, t->data});
  std::vector<double>& out = it->second;
  if (!fresh) return out;
  std::vector<float> row(static_cast<size_t>(t->shape[0]));
  const size_t rb = row_bytes(t->type, t->shape[0]);
  for (int64_t r = 0; r < t->rows(); ++r) {
    dequantize_row(t->type, t->data + size_t(r) * rb, row.data(), t->shape[0]);
    out.insert(out.end(), row.begin(), row.end());
  }
  return out;
}

using Vec = std::vector<double>;

Vec linear(const Tensor* w, const Tensor* b, const Vec& x) {
  const Vec& W = weights(w);
  const size_t n_in = size_t(w->shape[0]), n_out = size_t(w->rows());
  Vec y(n_out);
  const Vec B = b ? weights(b) : Vec(n_out, 0.0);
  for (size_t r = 0; r < n_out; ++r) {
    double s = B[r];
    for (size_t i = 0; i < n_in; ++i) s += W[r * n_in + i] * x[i];
    y[r] = s;
  }
  return y;
}

Vec rms(const Vec& x, const Tensor* w, double eps) {
  const Vec& W = weights(w);
  double ss = 0;
  for (double v : x) ss += v * v;
  const double inv = 1 / std::sqrt(ss / double(x.size()) + eps);
  Vec y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * inv * W[i];
  return y;
}

void rotate(Vec& x, int n_heads, const HParams& hp, int pos) {
  const int d = hp.head_dim, half = d / 2;
  for (int h = 0; h < n_heads; ++h)
    for (int i = 0; i < half; ++i) {
      const double theta = pos * double(hp.rope_freq_scale) * std::pow(double(hp.rope_base), -2.0 * i / d);
      const size_t a = size_t(h * d) + size_t(hp.rope_type == RopeType::NeoX ? i : 2 * i);
      const size_t b = hp.rope_type == RopeType::NeoX ? a + size_t(half) : a + 1;
      const double x0 = x[a], x1 = x[b];
      x[a] = x0 * std::cos(theta) - x1 * std::sin(theta);
      x[b] = x0 * std::sin(theta) + x1 * std::cos(theta);
    }
}

// Logits of the last token after feeding `tokens` from position 0.
Vec reference_logits(const Model& m, const std::vector<int32_t>& tokens) {
  const HParams& hp = m.hp;
  const int n = int(tokens.size()), d = hp.head_dim, group = hp.n_head / hp.n_head_kv;
  const Vec& embd = weights(m.token_embd);
  std::vector<Vec> x(static_cast<size_t>(n));
  for (int t = 0; t < n; ++t)
    x[size_t(t)] = Vec(embd.begin() + tokens[size_t(t)] * hp.n_embd, embd.begin() + (tokens[size_t(t)] + 1) * hp.n_embd);
  for (const LayerWeights& l : m.layers) {
    std::vector<Vec> q(static_cast<size_t>(n)), k(q.size()), v(q.size());
    for (int t = 0; t < n; ++t) {
      const Vec h = rms(x[size_t(t)], l.attn_norm, hp.rms_eps);
      q[size_t(t)] = linear(l.wq, l.bq, h);
      k[size_t(t)] = linear(l.wk, l.bk, h);
      v[size_t(t)] = linear(l.wv, l.bv, h);
      rotate(q[size_t(t)], hp.n_head, hp, t);
      rotate(k[size_t(t)], hp.n_head_kv, hp, t);
    }
    for (int t = 0; t < n; ++t) {
      Vec attn(size_t(hp.n_head * d), 0.0);
      for (int h = 0; h < hp.n_head; ++h) {
        const int kvh = h / group;
        Vec s(size_t(t + 1));
        double mx = -INFINITY, z = 0;
        for (int j = 0; j <= t; ++j) {
          double dot = 0;
          for (int i = 0; i < d; ++i) dot += q[size_t(t)][size_t(h * d + i)] * k[size_t(j)][size_t(kvh * d + i)];
          s[size_t(j)] = dot / std::sqrt(double(d));
          mx = std::max(mx, s[size_t(j)]);
        }
        for (double& e : s) z += e = std::exp(e - mx);
        for (int j = 0; j <= t; ++j)
          for (int i = 0; i < d; ++i) attn[size_t(h * d + i)] += s[size_t(j)] / z * v[size_t(j)][size_t(kvh * d + i)];
      }
      const Vec o = linear(l.wo, nullptr, attn);
      for (size_t i = 0; i < o.size(); ++i) x[size_t(t)][i] += o[i];
      const Vec h2 = rms(x[size_t(t)], l.ffn_norm, hp.rms_eps);
      const Vec g = linear(l.w_gate, nullptr, h2), u = linear(l.w_up, nullptr, h2);
      Vec act(g.size());
      for (size_t i = 0; i < g.size(); ++i) act[i] = g[i] / (1 + std::exp(-g[i])) * u[i];
      const Vec down = linear(l.w_down, nullptr, act);
      for (size_t i = 0; i < down.size(); ++i) x[size_t(t)][i] += down[i];
    }
  }
  return linear(m.output, nullptr, rms(x.back(), m.output_norm, hp.rms_eps));
}

TEST(Engine, F32ForwardMatchesFloat64Reference) {
  const Model m = Model::load(tiny_model(synth::FileType::F32));
  ASSERT_EQ(m.hp.arch, Arch::Qwen2);  // the reference covers biases; NeoX rope
  const std::vector<int32_t> tokens = random_tokens(6, m.hp.n_vocab, 1);
  Session s(m, cpu_options());
  const std::span<const float> got = s.eval(tokens);
  const Vec want = reference_logits(m, tokens);
  ASSERT_EQ(got.size(), want.size());
  double scale = 0;
  for (double v : want) scale = std::max(scale, std::fabs(v));
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-4 * (1 + scale)) << "logit " << i;
}

class EngineTypes : public ::testing::TestWithParam<synth::FileType> {};

TEST_P(EngineTypes, PrefillThenDecodeEqualsOneLongerPrefill) {
  const Model m = Model::load(tiny_model(GetParam()));
  const std::vector<int32_t> tokens = random_tokens(9, m.hp.n_vocab, 2);
  Session stepwise(m, cpu_options());
  stepwise.eval(std::span(tokens).first(tokens.size() - 1));
  const std::span<const float> last = stepwise.eval(std::span(tokens).last(1));
  const std::vector<float> decoded(last.begin(), last.end());
  Session chunked(m, cpu_options(64, 4));  // micro-batches of 4: 4 + 4 + 1 tokens
  const std::span<const float> whole = chunked.eval(tokens);
  ASSERT_EQ(decoded.size(), whole.size());
  // Every token's rows go through the same per-row code whatever the batch, so the two paths
  // agree to rounding noise at f32 weights and for quantized weights alike.
  for (size_t i = 0; i < whole.size(); ++i) ASSERT_NEAR(decoded[i], whole[i], 1e-5) << "logit " << i;
  EXPECT_EQ(stepwise.n_past(), int(tokens.size()));
}

TEST_P(EngineTypes, GreedyIsDeterministicAndMatchesArgmax) {
  const Model m = Model::load(tiny_model(GetParam()));
  const std::vector<int32_t> prompt = random_tokens(5, m.hp.n_vocab, 3);
  auto generate = [&](bool fast_path) {
    Session s(m, cpu_options());
    std::vector<int32_t> out;
    int32_t next = fast_path ? s.eval_greedy(prompt) : argmax(s.eval(prompt));
    for (int i = 0; i < 6; ++i) {
      out.push_back(next);
      next = fast_path ? s.decode_greedy(out.back()) : argmax(s.decode(out.back()));
    }
    return out;
  };
  const std::vector<int32_t> a = generate(true);
  EXPECT_EQ(a, generate(true));
  EXPECT_EQ(a, generate(false));
}

INSTANTIATE_TEST_SUITE_P(FileTypes, EngineTypes,
                         ::testing::Values(synth::FileType::F32, synth::FileType::Q8_0, synth::FileType::Q4_K_M),
                         [](const auto& info) { return std::string(synth::file_type_name(info.param)); });

TEST(Engine, SeededSamplingIsDeterministic) {
  const Model m = Model::load(tiny_model(synth::FileType::Q8_0));
  const std::vector<int32_t> prompt = random_tokens(4, m.hp.n_vocab, 4);
  auto generate = [&](uint64_t seed) {
    SamplerParams p;
    p.temperature = 1.5f;  // flat enough that different seeds diverge
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.seed = seed;
    Sampler sampler(p);
    Session s(m, cpu_options());
    std::vector<int32_t> history = prompt;
    std::span<const float> logits = s.eval(prompt);
    for (int i = 0; i < 12; ++i) {
      history.push_back(sampler.sample(logits, history));
      logits = s.decode(history.back());
    }
    return history;
  };
  EXPECT_EQ(generate(7), generate(7));
  EXPECT_NE(generate(7), generate(8));
}

TEST(Engine, ContextFullIsAClearError) {
  const Model m = Model::load(tiny_model(synth::FileType::Q8_0));
  Session s(m, cpu_options(8));
  const std::vector<int32_t> tokens = random_tokens(9, m.hp.n_vocab, 5);
  try {
    s.eval(tokens);
    FAIL() << "9 tokens fit a context of 8";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("n_ctx=8"), std::string::npos) << msg;
    EXPECT_NE(msg.find("raise -c (max 4096"), std::string::npos) << msg;
  }
  EXPECT_EQ(s.n_past(), 0);
  s.eval(std::span(tokens).first(8));
  EXPECT_THROW(s.eval(std::span(tokens).last(1)), Error);
  EXPECT_THROW(s.eval_greedy(std::span(tokens).last(1)), Error);
  EXPECT_EQ(s.n_past(), 8);
  EXPECT_THROW(Session(m, cpu_options(m.hp.n_ctx_train + 1)), Error);
}

TEST(Engine, DumpFilesAndDumpDiff) {
  const std::string model = tiny_model(synth::FileType::Q8_0);
  const fs::path dir = test::temp_dir("dump");
  auto run = [&](const std::string& sub) {
    std::string out;
    const int rc = test::run_command("MINFER_DUMP=" + (dir / sub).string() + " " + test::minfer_binary() +
                                         " run -m " + model + " -p 'hello world' -n 3 --temp 0 --backend cpu -t 2",
                                     &out);
    EXPECT_EQ(rc, 0) << out;
  };
  run("a");
  run("b");
  // Step 0 is the prompt; the first node is the embedding: rows = prompt tokens, cols = n_embd.
  const fs::path first = dir / "a" / "step0000" / "0000_token_embd.bin";
  ASSERT_TRUE(fs::exists(first));
  int64_t header[2] = {0, 0};
  std::ifstream(first, std::ios::binary).read(reinterpret_cast<char*>(header), sizeof header);
  EXPECT_EQ(header[1], 256);
  EXPECT_EQ(fs::file_size(first), 16 + uint64_t(header[0] * header[1]) * 4);
  ASSERT_TRUE(fs::exists(dir / "a" / "step0001"));

  std::string out;
  const std::string diff = test::minfer_binary() + " dump-diff " + (dir / "a").string() + " " + (dir / "b").string();
  EXPECT_EQ(test::run_command(diff, &out), 0) << out;
  EXPECT_NE(out.find(" 0 differ"), std::string::npos) << out;

  // Perturb one value of one node in B: that node is reported as the first difference.
  const fs::path victim = dir / "b" / "step0001" / "0004_blk.0.attn_v.bin";
  ASSERT_TRUE(fs::exists(victim));
  {
    std::fstream f(victim, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(16);
    const float bump = 1000.0f;
    f.write(reinterpret_cast<const char*>(&bump), 4);
  }
  out.clear();
  EXPECT_EQ(test::run_command(diff, &out), 1) << out;
  const size_t mark = out.find("<== first difference");
  ASSERT_NE(mark, std::string::npos) << out;
  const size_t line = out.rfind('\n', mark);
  EXPECT_NE(out.substr(line, mark - line).find("step0001/0004_blk.0.attn_v.bin"), std::string::npos) << out;
}

}  // namespace
}  // namespace minfer
