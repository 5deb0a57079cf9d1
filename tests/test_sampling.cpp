// Sampler behaviour against hand-computed expectations, and sampled frequencies against the
// softmax probabilities (chi-square).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <algorithm>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "sampling/sampler.h"
#include "support.h"
#include "util/error.h"

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

// With no cut the draw runs over the whole vocabulary in blocks: frequencies across many blocks
// still follow the float64 softmax, and a -inf logit (a masked token) is never drawn.
TEST(Sampler, DrawOverManyBlocksMatchesTheSoftmax) {
  const float temp = 0.9f;
  std::vector<float> logits(5000, -std::numeric_limits<float>::infinity());
  std::vector<size_t> live;
  for (size_t k = 0; k < 12; ++k) live.push_back(k * 411 + 7);  // spread over 20 blocks of 256
  for (size_t k = 0; k < live.size(); ++k) logits[live[k]] = 0.25f * float(k % 5) - 0.1f * float(k);
  logits[4999] = -200.0f;  // far below the best: weight 0 after the exponent's range
  std::vector<double> prob(logits.size(), 0.0);
  double z = 0;
  for (size_t i : live) z += prob[i] = std::exp(double(logits[i]) / temp);
  for (double& q : prob) q /= z;
  Sampler s(plain(temp));
  const int draws = 20000;
  const std::vector<int> c = histogram(s, logits, draws);
  double chi2 = 0;
  int dead = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    if (prob[i] == 0) {
      dead += c[i];
      continue;
    }
    const double e = draws * prob[i];
    chi2 += (c[i] - e) * (c[i] - e) / e;
  }
  EXPECT_EQ(dead, 0);
  EXPECT_LT(chi2, 50.0);  // 11 degrees of freedom: P(chi2 > 50) < 1e-6
}

// A vocabulary of Qwen's size: the cuts sort only as far as they need, so the kept sets must still
// be exactly the float64 reference's (the best tokens, in order, up to the top-p mass or above
// the min-p fraction), including cuts that reach thousands of candidates.
TEST(Sampler, CutsOnALargeVocabularyKeepExactlyTheReferenceSet) {
  std::mt19937_64 rng(test::seed());
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> logits(151936);
  for (float& l : logits) l = normal(rng);
  std::vector<int32_t> order(logits.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = int32_t(i);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return logits[size_t(a)] > logits[size_t(b)] || (logits[size_t(a)] == logits[size_t(b)] && a < b);
  });
  const double best = logits[size_t(order[0])];
  struct Case {
    int top_k;
    float top_p, min_p;
  };
  for (const Case c : {Case{0, 0.5f, 0.0f}, Case{0, 0.95f, 0.0f}, Case{0, 1.0f, 0.001f}, Case{0, 0.9f, 0.05f},
                       Case{40, 0.95f, 0.05f}, Case{5000, 0.99f, 0.0f}}) {
    size_t keep = c.top_k > 0 ? size_t(c.top_k) : order.size();
    double total = 0;
    for (size_t i = 0; i < keep; ++i) total += std::exp(logits[size_t(order[i])] - best);
    if (c.top_p < 1.0f) {
      double cum = 0;
      size_t n = 0;
      while (n < keep && (cum += std::exp(logits[size_t(order[n++])] - best) / total) < c.top_p) {}
      keep = n;
    }
    if (c.min_p > 0.0f) {
      size_t n = 1;
      while (n < keep && std::exp(logits[size_t(order[n])] - best) >= c.min_p) ++n;
      keep = n;
    }
    std::vector<bool> allowed(logits.size());
    for (size_t i = 0; i < keep; ++i) allowed[size_t(order[i])] = true;
    SamplerParams p = plain(1.5f);
    p.top_k = c.top_k;
    p.top_p = c.top_p;
    p.min_p = c.min_p;
    Sampler s(p);
    std::vector<bool> seen(logits.size());
    size_t distinct = 0;
    for (int i = 0; i < 200; ++i) {
      const int32_t t = s.sample(logits, {});
      ASSERT_TRUE(allowed[size_t(t)]) << "token " << t << " outside the reference set of " << keep << " (top_k "
                                      << c.top_k << ", top_p " << c.top_p << ", min_p " << c.min_p << ")";
      if (!seen[size_t(t)]) seen[size_t(t)] = true, ++distinct;
    }
    // The draws reach across the set (not only its head): at least min(keep, 60) / 2 distinct.
    EXPECT_GE(distinct, std::min<size_t>(keep, 60) / 2) << "keep " << keep;
  }
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

std::string validation_error(const std::function<void(SamplerParams&)>& change,
                             const ParamSpelling& spelling = {}) {
  SamplerParams p;
  change(p);
  try {
    p.validate(spelling);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// One routine for the CLI and a server's request parser: each field against its range (OpenAI's
// where OpenAI has it), with one message naming the value, the parameter and the range.
TEST(SamplerParams, ValidateNamesTheParameterAndItsRange) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  struct Case {
    std::function<void(SamplerParams&)> change;
    std::string expected;
  };
  const std::vector<Case> bad = {
      {[&](auto& p) { p.temperature = nan; }, "temperature nan is out of range: temperature must be in [0, 2]"},
      {[&](auto& p) { p.temperature = -1; }, "temperature -1 is out of range: temperature must be in [0, 2]"},
      {[&](auto& p) { p.temperature = 2.5f; }, "temperature 2.5 is out of range"},
      {[&](auto& p) { p.top_k = -1; }, "top_k -1 is out of range: top_k must be >= 0 (0: off)"},
      {[&](auto& p) { p.top_p = 2; }, "top_p 2 is out of range: top_p must be in (0, 1]"},
      {[&](auto& p) { p.top_p = 0; }, "top_p 0 is out of range: top_p must be in (0, 1]"},
      {[&](auto& p) { p.min_p = -1; }, "min_p -1 is out of range: min_p must be in [0, 1]"},
      {[&](auto& p) { p.repeat_penalty = -1; }, "repeat_penalty -1 is out of range: repeat_penalty must be a finite number > 0"},
      {[&](auto& p) { p.repeat_penalty = 0; }, "repeat_penalty 0 is out of range"},
      {[&](auto& p) { p.repeat_penalty = nan; }, "repeat_penalty nan is out of range"},
      {[&](auto& p) { p.repeat_penalty = inf; }, "repeat_penalty inf is out of range"},
      {[&](auto& p) { p.presence_penalty = 2.5f; }, "presence_penalty 2.5 is out of range: presence_penalty must be in [-2, 2]"},
      {[&](auto& p) { p.frequency_penalty = inf; }, "frequency_penalty inf is out of range: frequency_penalty must be in [-2, 2]"},
      {[&](auto& p) { p.frequency_penalty = -inf; }, "frequency_penalty -inf is out of range"},
      {[&](auto& p) { p.penalty_last_n = -2; }, "repeat_last_n -2 is out of range: repeat_last_n must be >= -1"},
  };
  for (const Case& c : bad) EXPECT_NE(validation_error(c.change).find(c.expected), std::string::npos) << c.expected;

  // The ends of every range are allowed.
  EXPECT_EQ(validation_error([](auto& p) {
              p.temperature = 0;
              p.top_k = 0;
              p.top_p = 1;
              p.min_p = 0;
              p.presence_penalty = -2;
              p.frequency_penalty = 2;
              p.penalty_last_n = -1;
            }),
            "");
  EXPECT_EQ(validation_error([](auto& p) {
              p.temperature = 2;
              p.min_p = 1;
              p.presence_penalty = 2;
              p.frequency_penalty = -2;
            }),
            "");

  // The caller spells the parameter its own way; the rule stays the same.
  const ParamSpelling flag = [](std::string_view name) { return name == "top_p" ? "--top-p" : std::string(name); };
  EXPECT_EQ(validation_error([](auto& p) { p.top_p = 2; }, flag), "--top-p 2 is out of range: top_p must be in (0, 1]");
  // A sampler cannot be built from invalid parameters at all.
  SamplerParams p;
  p.min_p = 2;
  EXPECT_THROW(Sampler{p}, Error);
}

TEST(SamplerParams, ParseSeedTakesExactlyTheUint64Range) {
  EXPECT_EQ(parse_seed("0"), 0u);
  EXPECT_EQ(parse_seed("18446744073709551615"), std::numeric_limits<uint64_t>::max());
  for (const char* bad : {"-1", "18446744073709551616", "99999999999999999999999", "", "abc", "1.5", " 1", "0x10", "+1"}) {
    try {
      parse_seed(bad);
      ADD_FAILURE() << "accepted seed '" << bad << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("seed must be an integer in [0, 18446744073709551615]"), std::string::npos)
          << e.what();
    }
  }
}

}  // namespace
}  // namespace minfer
