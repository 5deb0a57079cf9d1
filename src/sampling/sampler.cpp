#include "sampling/sampler.h"

#include <algorithm>
#include <cmath>
#include <unordered_map>

#include "util/error.h"

namespace minfer {

int32_t argmax(std::span<const float> logits) {
  if (logits.empty()) fail("argmax of empty logits");
  return int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

bool plain_greedy(const SamplerParams& p) {
  return p.temperature <= 0 && p.repeat_penalty == 1.0f && p.presence_penalty == 0.0f &&
         p.frequency_penalty == 0.0f;
}

Sampler::Sampler(SamplerParams p) : params_(p), rng_(p.seed) {}

int32_t Sampler::sample(std::span<const float> logits, std::span<const int32_t> history) {
  if (logits.empty()) fail("sampler: empty logits");
  const SamplerParams& p = params_;
  cand_.resize(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) cand_[i] = {logits[i], int32_t(i)};

  // Penalties over the last penalty_last_n tokens of history.
  const bool penalize = p.repeat_penalty != 1.0f || p.presence_penalty != 0.0f ||
                        p.frequency_penalty != 0.0f;
  if (penalize && p.penalty_last_n != 0) {
    const size_t n = p.penalty_last_n < 0 ? history.size()
                                          : std::min(history.size(), size_t(p.penalty_last_n));
    std::unordered_map<int32_t, int> counts;
    for (int32_t id : history.subspan(history.size() - n)) ++counts[id];
    for (const auto& [id, count] : counts) {
      if (id < 0 || size_t(id) >= cand_.size()) continue;
      float& l = cand_[size_t(id)].first;
      l = l > 0 ? l / p.repeat_penalty : l * p.repeat_penalty;
      l -= float(count) * p.frequency_penalty + p.presence_penalty;
    }
  }

  // Highest logit first; ties broken by the lower id so the order is fully determined.
  const auto better = [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  if (greedy()) return std::min_element(cand_.begin(), cand_.end(), better)->second;

  size_t keep = cand_.size();
  if (p.top_k > 0 && size_t(p.top_k) < keep) {
    keep = size_t(p.top_k);
    std::partial_sort(cand_.begin(), cand_.begin() + keep, cand_.end(), better);
  } else {
    std::sort(cand_.begin(), cand_.end(), better);
  }
  cand_.resize(keep);

  // Probabilities at temperature 1 for top-p and min-p (as llama.cpp's default chain does).
  const float max_logit = cand_[0].first;
  std::vector<double> prob(keep);
  double total = 0;
  for (size_t i = 0; i < keep; ++i) total += prob[i] = std::exp(double(cand_[i].first - max_logit));
  if (p.top_p < 1.0f) {
    double cum = 0;
    size_t n = 0;
    while (n < keep) {
      cum += prob[n++] / total;
      if (cum >= p.top_p) break;
    }
    keep = n;
  }
  if (p.min_p > 0.0f) {
    // prob[i] / prob[0] = exp(l_i - l_max), so the cut is independent of normalisation.
    size_t n = 1;
    while (n < keep && prob[n] >= p.min_p) ++n;
    keep = n;
  }
  cand_.resize(keep);

  // Temperature, then draw from the remaining distribution.
  std::vector<double> weight(keep);
  double sum = 0;
  for (size_t i = 0; i < keep; ++i)
    sum += weight[i] = std::exp(double(cand_[i].first - max_logit) / p.temperature);
  const double u = double(rng_() >> 11) * 0x1.0p-53 * sum;  // uniform in [0, sum)
  double cum = 0;
  for (size_t i = 0; i < keep; ++i) {
    cum += weight[i];
    if (u < cum) return cand_[i].second;
  }
  return cand_[keep - 1].second;
}

}  // namespace minfer
