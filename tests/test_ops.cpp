// Every CPU op against a naive float64 reference on fresh random inputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/ops.h"
#include "quant/quant.h"
#include "support.h"
#include "util/error.h"
#include "util/half.h"

namespace minfer {
namespace {

using test::random_normal;

// A weight tensor of n_out rows x n_in columns in `type`, quantized from random floats.
struct TestWeight {
  Tensor tensor;
  std::vector<uint8_t> bytes;
  std::vector<double> dequantized;  // what the weight really holds, the reference uses this
};

TestWeight make_weight(GgmlType type, int64_t n_in, int64_t n_out, uint64_t salt) {
  TestWeight w;
  const std::vector<float> src = random_normal(size_t(n_in * n_out), 1.0f, salt);
  const size_t row_size = row_bytes(type, n_in);
  w.bytes.resize(row_size * size_t(n_out));
  std::vector<float> row(static_cast<size_t>(n_in));
  for (int64_t r = 0; r < n_out; ++r) {
    quantize_row(type, &src[size_t(r * n_in)], &w.bytes[size_t(r) * row_size], n_in);
    dequantize_row(type, &w.bytes[size_t(r) * row_size], row.data(), n_in);
    w.dequantized.insert(w.dequantized.end(), row.begin(), row.end());
  }
  w.tensor.name = "test.weight";
  w.tensor.type = type;
  w.tensor.shape = {n_in, n_out};
  w.tensor.nbytes = w.bytes.size();
  w.tensor.data = w.bytes.data();
  return w;
}

TEST(Ops, RmsNormPerRowAndGrouped) {
  const int64_t rows = 3, cols = 64;
  const float eps = 1e-6f;
  const std::vector<float> x = random_normal(size_t(rows * cols), 2.0f, 1);
  for (int group : {0, 16}) {
    const int64_t n = group ? group : cols;
    const std::vector<float> weight = random_normal(size_t(n), 1.0f, 2);
    std::vector<float> out(x.size());
    cpu::rms_norm(x.data(), weight.data(), out.data(), rows, cols, group, eps);
    for (int64_t g = 0; g < rows * cols / n; ++g) {
      double ss = 0;
      for (int64_t i = 0; i < n; ++i) ss += double(x[size_t(g * n + i)]) * x[size_t(g * n + i)];
      const double inv = 1.0 / std::sqrt(ss / double(n) + eps);
      for (int64_t i = 0; i < n; ++i) {
        const double want = x[size_t(g * n + i)] * inv * weight[size_t(i)];
        EXPECT_NEAR(out[size_t(g * n + i)], want, 1e-5 * (1 + std::fabs(want))) << "group " << group;
      }
    }
  }
}

class MatMulTypes : public ::testing::TestWithParam<GgmlType> {};

TEST_P(MatMulTypes, MatchesFloat64Reference) {
  const GgmlType type = GetParam();
  const int64_t n_in = 512, n_out = 37, n_tokens = 3;
  const TestWeight w = make_weight(type, n_in, n_out, 3);
  const std::vector<float> x = random_normal(size_t(n_in * n_tokens), 1.0f, 4);
  const std::vector<float> bias = random_normal(size_t(n_out), 1.0f, 5);
  ThreadPool pool(2);
  std::vector<BlockQ8Pad40> scratch;
  std::vector<float> out(size_t(n_out * n_tokens));
  cpu::matmul(pool, w.tensor, bias.data(), x.data(), n_tokens, out.data(), scratch);

  for (int64_t t = 0; t < n_tokens; ++t) {
    // Quantized weights multiply q8 activations: the reference takes the values the pad40 blocks
    // hold, as it takes what the weight holds, so the tolerance can stay tight. The quantizer is
    // held to its written-out rule bitwise by QuantPad40.MatchesTheRuleBitwise; a second copy of
    // that rule here, in double, once rounded a product a hair off a half the other way.
    std::vector<double> xt(&x[size_t(t * n_in)], &x[size_t((t + 1) * n_in)]);
    if (has_pad40_dot(type)) {
      std::vector<BlockQ8Pad40> blocks(size_t(n_in / QK));
      std::vector<float> held(static_cast<size_t>(n_in));
      quantize_row_pad40(&x[size_t(t * n_in)], blocks.data(), n_in);
      dequantize_row_pad40(blocks.data(), held.data(), n_in);
      xt.assign(held.begin(), held.end());
    }
    double x_norm = 0;
    for (double v : xt) x_norm += v * v;
    for (int64_t r = 0; r < n_out; ++r) {
      double want = bias[size_t(r)], w_norm = 0;
      for (int64_t i = 0; i < n_in; ++i) {
        const double wi = w.dequantized[size_t(r * n_in + i)];
        want += wi * xt[size_t(i)];
        w_norm += wi * wi;
      }
      const double tol = 1e-5 * std::sqrt(w_norm * x_norm) + 1e-5;  // float accumulation
      EXPECT_NEAR(out[size_t(t * n_out + r)], want, tol) << type_traits(type).name << " t=" << t << " r=" << r;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(WeightTypes, MatMulTypes,
                         ::testing::Values(GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0,
                                           GgmlType::Q4_K, GgmlType::Q6_K),
                         [](const auto& info) { return std::string(type_traits(info.param).name); });

void expect_rope(RopeType type, bool with_factors) {
  const int n_tokens = 4, n_heads = 3, head_dim = 16;
  const std::vector<int32_t> positions = {7, 3, 1000, 8};  // tokens of different sequences
  const float base = 10000.0f, freq_scale = 0.5f;
  std::vector<float> factors(head_dim / 2);
  for (int i = 0; i < head_dim / 2; ++i) factors[size_t(i)] = 1.0f + 0.5f * float(i);
  const std::vector<float> x = random_normal(size_t(n_tokens * n_heads * head_dim), 1.0f, 6);
  std::vector<float> y = x;
  const cpu::RopeTable tab =
      cpu::rope_table(positions, head_dim, base, freq_scale, with_factors ? factors.data() : nullptr);
  cpu::rope(y.data(), n_heads, head_dim, tab, type);
  for (int t = 0; t < n_tokens; ++t)
    for (int h = 0; h < n_heads; ++h)
      for (int i = 0; i < head_dim / 2; ++i) {
        double theta = positions[size_t(t)] * double(freq_scale) * std::pow(double(base), -2.0 * i / head_dim);
        if (with_factors) theta /= factors[size_t(i)];
        const size_t head = size_t((t * n_heads + h) * head_dim);
        const size_t a = head + size_t(type == RopeType::NeoX ? i : 2 * i);
        const size_t b = type == RopeType::NeoX ? a + head_dim / 2 : a + 1;
        EXPECT_NEAR(y[a], x[a] * std::cos(theta) - x[b] * std::sin(theta), 1e-5);
        EXPECT_NEAR(y[b], x[a] * std::sin(theta) + x[b] * std::cos(theta), 1e-5);
      }
}

TEST(Ops, RopeNormal) { expect_rope(RopeType::Normal, false); }
TEST(Ops, RopeNeoX) { expect_rope(RopeType::NeoX, false); }
TEST(Ops, RopeWithFrequencyFactors) { expect_rope(RopeType::Normal, true); }

// The cache is paged: blocks of 3 positions in a scrambled order, so position p of the sequence
// lives far from p - 1.
TEST(Ops, AttentionCausalGqaWithPagedCache) {
  const int n_head = 4, n_head_kv = 2, head_dim = 16, first = 5, second = 3, block_size = 3;
  const int total = first + second;
  const int qw = n_head * head_dim, kvw = n_head_kv * head_dim;
  const std::vector<float> q = random_normal(size_t(total * qw), 1.0f, 7);
  const std::vector<float> k = random_normal(size_t(total * kvw), 1.0f, 8);
  const std::vector<float> v = random_normal(size_t(total * kvw), 1.0f, 9);
  const std::vector<int32_t> blocks = {4, 0, 2};  // of a pool of 5
  std::vector<float> k_cache(size_t(5 * block_size * kvw)), v_cache(size_t(5 * block_size * kvw));
  const cpu::KvSeqView cache{k_cache.data(), v_cache.data(), block_size, blocks};
  ThreadPool pool(2);
  std::vector<float> out(size_t(total * qw));
  // A prefill of `first` tokens, then `second` more that must see the cached ones.
  cpu::attention(pool, q.data(), k.data(), v.data(), first, 0, n_head, n_head_kv, head_dim, cache,
                 out.data());
  cpu::attention(pool, &q[size_t(first * qw)], &k[size_t(first * kvw)], &v[size_t(first * kvw)],
                 second, first, n_head, n_head_kv, head_dim, cache, &out[size_t(first * qw)]);

  for (int t = 0; t < total; ++t)
    for (int h = 0; h < n_head; ++h) {
      const int kvh = h / (n_head / n_head_kv);
      std::vector<double> s(size_t(t + 1));
      double mx = -INFINITY, sum = 0;
      for (int j = 0; j <= t; ++j) {
        double d = 0;
        for (int i = 0; i < head_dim; ++i)
          d += double(q[size_t(t * qw + h * head_dim + i)]) * k[size_t(j * kvw + kvh * head_dim + i)];
        s[size_t(j)] = d / std::sqrt(double(head_dim));
        mx = std::max(mx, s[size_t(j)]);
      }
      for (double& e : s) sum += e = std::exp(e - mx);
      for (int i = 0; i < head_dim; ++i) {
        double want = 0;
        for (int j = 0; j <= t; ++j) want += s[size_t(j)] / sum * v[size_t(j * kvw + kvh * head_dim + i)];
        EXPECT_NEAR(out[size_t(t * qw + h * head_dim + i)], want, 1e-5) << "t=" << t << " h=" << h;
      }
    }
}

TEST(Ops, SwiGLUAndAdd) {
  const int64_t n = 1000;
  const std::vector<float> a = random_normal(size_t(n), 3.0f, 10), b = random_normal(size_t(n), 1.0f, 11);
  std::vector<float> out(static_cast<size_t>(n));
  cpu::swiglu(a.data(), b.data(), out.data(), n);
  for (int64_t i = 0; i < n; ++i) {
    const double g = a[size_t(i)];
    EXPECT_NEAR(out[size_t(i)], g / (1 + std::exp(-g)) * b[size_t(i)], 1e-5 * (1 + std::fabs(g * b[size_t(i)])));
  }
  std::vector<float> sum = a;
  cpu::add(sum.data(), b.data(), sum.data(), n);  // aliasing out == a, as the residual does
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(sum[size_t(i)], a[size_t(i)] + b[size_t(i)]);
}

TEST(Ops, EmbedF16TableAndBadToken) {
  const int64_t n_embd = 8, n_vocab = 5;
  const std::vector<float> src = random_normal(size_t(n_embd * n_vocab), 1.0f, 12);
  std::vector<uint16_t> table(src.size());
  for (size_t i = 0; i < src.size(); ++i) table[i] = f32_to_f16(src[i]);
  Tensor t;
  t.name = "token_embd.weight";
  t.type = GgmlType::F16;
  t.shape = {n_embd, n_vocab};
  t.data = reinterpret_cast<const uint8_t*>(table.data());
  const std::vector<int32_t> tokens = {4, 0, 4, 2};
  std::vector<float> out(tokens.size() * size_t(n_embd));
  cpu::embed(t, tokens, out.data());
  for (size_t r = 0; r < tokens.size(); ++r)
    for (int64_t i = 0; i < n_embd; ++i)
      EXPECT_EQ(out[r * size_t(n_embd) + size_t(i)], f16_to_f32(table[size_t(tokens[r] * n_embd + i)]));
  const std::vector<int32_t> bad = {5};
  EXPECT_THROW(cpu::embed(t, bad, out.data()), Error);
}

}  // namespace
}  // namespace minfer
