// Sampler behaviour against hand-computed expectations, and sampled frequencies against the
// softmax probabilities (chi-square).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "sampling/sampler.h"
#include "support.h"

namespace minfer {
namespace {

SamplerParams plain(float temperature) {
  SamplerParams p;
  p.temperature = temperature;
  p.top_k = 0;
  p.top_p = 1.0f;
  p.min_p = 0.0f;
  p.seed = test::seed();
  return p;
}

std::vector<float> log_probs(const std::vector<double>& probs) {
  std::vector<float> l;
  for (double p : probs) l.push_back(float(std::log(p)));
  return l;
}

std::vector<int> histogram(Sampler& s, const std::vector<float>& logits, int draws,
                           std::span<const int32_t> history = {}) {
  std::vector<int> counts(logits.size());
  for (int i = 0; i < draws; ++i) ++counts[size_t(s.sample(logits, history))];
  return counts;
}

// |observed - expected| within 5 standard deviations of a binomial count.
void expect_frequency(int count, int draws, double p) {
  const double sd = std::sqrt(draws * p * (1 - p));
  EXPECT_NEAR(count, draws * p, 5 * sd + 1) << "p=" << p;
}

TEST(Sampler, GreedyIsArgmaxAfterRepeatPenalty) {
  SamplerParams p = plain(0.0f);
  Sampler s(p);
  EXPECT_EQ(s.sample(std::vector<float>{2.0f, 1.9f, -1.0f}, {}), 0);
  p.repeat_penalty = 1.5f;
  Sampler penalized(p);
  const std::vector<int32_t> hist0 = {0};
  // Positive logits are divided: 2.0 / 1.5 = 1.33 < 1.9.
  EXPECT_EQ(penalized.sample(std::vector<float>{2.0f, 1.9f, -1.0f}, hist0), 1);
  // Negative logits are multiplied: -1.0 * 1.5 = -1.5 < -1.2.
  EXPECT_EQ(penalized.sample(std::vector<float>{-1.0f, -1.2f}, hist0), 1);
}

TEST(Sampler, FrequencyPenaltyCountsOccurrencesPresenceDoesNot) {
  const std::vector<float> logits = {1.0f, 0.5f};
  const std::vector<int32_t> hist = {0, 0};
  SamplerParams p = plain(0.0f);
  p.frequency_penalty = 0.2f;  // 1.0 - 2 * 0.2 = 0.6 > 0.5
  EXPECT_EQ(Sampler(p).sample(logits, hist), 0);
  p.frequency_penalty = 0.3f;  // 1.0 - 2 * 0.3 = 0.4 < 0.5
  EXPECT_EQ(Sampler(p).sample(logits, hist), 1);
  p.frequency_penalty = 0.0f;
  p.presence_penalty = 0.4f;   // 1.0 - 0.4 = 0.6 > 0.5, however often it appeared
  EXPECT_EQ(Sampler(p).sample(logits, hist), 0);
}

TEST(Sampler, PenaltiesLookOnlyAtLastN) {
  SamplerParams p = plain(0.0f);
  p.presence_penalty = 1.0f;
  p.penalty_last_n = 1;
  const std::vector<int32_t> hist = {0, 1};  // token 0 is outside the window
  const std::vector<float> logits = {1.0f, 0.5f, 0.2f};
  EXPECT_EQ(Sampler(p).sample(logits, hist), 0);  // 1.0, -0.5, 0.2
  p.penalty_last_n = 2;
  EXPECT_EQ(Sampler(p).sample(logits, hist), 2);  // 0.0, -0.5, 0.2
}

TEST(Sampler, TopKKeepsOnlyTheBest) {
  SamplerParams p = plain(1.0f);
  p.top_k = 2;
  Sampler s(p);
  const std::vector<double> probs = {0.1, 0.4, 0.2, 0.3};
  const int draws = 4000;
  const std::vector<int> c = histogram(s, log_probs(probs), draws);
  EXPECT_EQ(c[0] + c[2], 0);
  expect_frequency(c[1], draws, 0.4 / 0.7);
}

TEST(Sampler, TopPKeepsSmallestPrefixReachingP) {
  SamplerParams p = plain(1.0f);
  p.top_p = 0.75f;  // 0.5 < 0.75 <= 0.5 + 0.3: keeps tokens 0 and 1
  Sampler s(p);
  const int draws = 4000;
  const std::vector<int> c = histogram(s, log_probs({0.5, 0.3, 0.15, 0.05}), draws);
  EXPECT_EQ(c[2] + c[3], 0);
  expect_frequency(c[0], draws, 0.5 / 0.8);
}

TEST(Sampler, MinPDropsTokensBelowFractionOfBest) {
  SamplerParams p = plain(1.0f);
  p.min_p = 0.25f;  // threshold 0.125: keeps 0.5, 0.3, 0.15
  Sampler s(p);
  const int draws = 4000;
  const std::vector<int> c = histogram(s, log_probs({0.5, 0.3, 0.15, 0.05}), draws);
  EXPECT_EQ(c[3], 0);
  expect_frequency(c[2], draws, 0.15 / 0.95);
}

TEST(Sampler, FrequenciesMatchTemperedSoftmax) {
  const float temp = 0.7f;
  const std::vector<float> logits = {0.3f, -0.2f, 1.1f, 0.0f, 0.8f, -1.5f};
  std::vector<double> prob(logits.size());
  double z = 0;
  for (size_t i = 0; i < logits.size(); ++i) z += prob[i] = std::exp(logits[i] / temp);
  for (double& q : prob) q /= z;
  Sampler s(plain(temp));
  const int draws = 20000;
  const std::vector<int> c = histogram(s, logits, draws);
  double chi2 = 0;
  for (size_t i = 0; i < prob.size(); ++i) {
    const double e = draws * prob[i];
    chi2 += (c[i] - e) * (c[i] - e) / e;
  }
  EXPECT_LT(chi2, 40.0);  // 5 degrees of freedom: P(chi2 > 40) < 1e-6
}

TEST(Sampler, SeededSamplingIsDeterministic) {
  std::vector<float> logits(100);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = float(i % 7) * 0.1f;
  SamplerParams p = plain(1.0f);
  Sampler a(p), b(p);
  p.seed += 1;
  Sampler other(p);
  std::vector<int32_t> sa, sb, so;
  for (int i = 0; i < 50; ++i) {
    sa.push_back(a.sample(logits, sa));
    sb.push_back(b.sample(logits, sb));
    so.push_back(other.sample(logits, so));
  }
  EXPECT_EQ(sa, sb);
  EXPECT_NE(sa, so);
}

TEST(Sampler, Argmax) {
  EXPECT_EQ(argmax(std::vector<float>{-3.0f, 7.0f, 7.0f, 1.0f}), 1);
}

}  // namespace
}  // namespace minfer
