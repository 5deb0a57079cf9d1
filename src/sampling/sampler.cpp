#include "sampling/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <unordered_map>

#include "sampling/draw.h"
#include "util/error.h"

namespace minfer {

namespace {

std::string spelled(const ParamSpelling& spelling, std::string_view name) {
  return spelling ? spelling(name) : std::string(name);
}

// A float parameter must lie in an interval written as mathematicians do: "[0, 2]", "(0, 1]".
void check_float(const ParamSpelling& spelling, std::string_view name, float value, double lo,
                 bool lo_open, double hi, bool hi_open) {
  const double v = value;
  if ((lo_open ? v > lo : v >= lo) && (hi_open ? v < hi : v <= hi)) return;  // false for NaN
  if (std::isinf(hi))
    fail(spelled(spelling, name), " ", v, " is out of range: ", name, " must be a finite number ",
         lo_open ? "> " : ">= ", lo);
  fail(spelled(spelling, name), " ", v, " is out of range: ", name, " must be in ", lo_open ? "(" : "[", lo, ", ",
       hi, hi_open ? ")" : "]");
}

void check_int_at_least(const ParamSpelling& spelling, std::string_view name, int value, int lo,
                        std::string_view meaning_of_lo) {
  if (value >= lo) return;
  fail(spelled(spelling, name), " ", value, " is out of range: ", name, " must be >= ", lo, " (", lo, ": ",
       meaning_of_lo, ")");
}

}  // namespace

void SamplerParams::validate(const ParamSpelling& spelling) const {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  check_float(spelling, "temperature", temperature, 0, false, 2, false);
  check_int_at_least(spelling, "top_k", top_k, 0, "off");
  check_float(spelling, "top_p", top_p, 0, true, 1, false);
  check_float(spelling, "min_p", min_p, 0, false, 1, false);
  check_float(spelling, "repeat_penalty", repeat_penalty, 0, true, kInf, true);
  check_float(spelling, "presence_penalty", presence_penalty, -2, false, 2, false);
  check_float(spelling, "frequency_penalty", frequency_penalty, -2, false, 2, false);
  check_int_at_least(spelling, "repeat_last_n", penalty_last_n, -1, "the whole history");
}

uint64_t parse_seed(std::string_view text, const ParamSpelling& spelling) {
  uint64_t seed = 0;
  bool valid = !text.empty();
  for (char c : text) {
    valid = valid && c >= '0' && c <= '9' && !__builtin_mul_overflow(seed, 10, &seed) &&
            !__builtin_add_overflow(seed, uint64_t(c - '0'), &seed);
  }
  if (!valid)
    fail(spelled(spelling, "seed"), " ", text.substr(0, 40), text.size() > 40 ? "..." : "",
         " is out of range: seed must be an integer in [0, ", std::numeric_limits<uint64_t>::max(), "]");
  return seed;
}

int32_t argmax(std::span<const float> logits) {
  if (logits.empty()) fail("argmax of empty logits");
  return int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

bool plain_greedy(const SamplerParams& p) {
  return p.temperature <= 0 && p.repeat_penalty == 1.0f && p.presence_penalty == 0.0f &&
         p.frequency_penalty == 0.0f;
}

Sampler::Sampler(SamplerParams p) : params_(p), rng_(p.seed) { params_.validate(); }

namespace {
bool penalties_apply(const SamplerParams& p) {
  return (p.repeat_penalty != 1.0f || p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f) &&
         p.penalty_last_n != 0;
}
bool cuts(const SamplerParams& p, size_t n_vocab) {
  return (p.top_k > 0 && size_t(p.top_k) < n_vocab) || p.top_p < 1.0f || p.min_p > 0.0f;
}
}  // namespace

bool Sampler::draws_whole_vocabulary(size_t n_vocab) const {
  return !greedy() && !penalties_apply(params_) && !cuts(params_, n_vocab);
}

int32_t Sampler::sample(std::span<const float> logits, std::span<const int32_t> history) {
  if (logits.empty()) fail("sampler: empty logits");
  const SamplerParams& p = params_;

  // Penalties over the last penalty_last_n tokens of history, on a copy of the logits.
  if (penalties_apply(p)) {
    penalized_.assign(logits.begin(), logits.end());
    const size_t n = p.penalty_last_n < 0 ? history.size()
                                          : std::min(history.size(), size_t(p.penalty_last_n));
    std::unordered_map<int32_t, int> counts;
    for (int32_t id : history.subspan(history.size() - n)) ++counts[id];
    for (const auto& [id, count] : counts) {
      if (id < 0 || size_t(id) >= penalized_.size()) continue;
      float& l = penalized_[size_t(id)];
      l = l > 0 ? l / p.repeat_penalty : l * p.repeat_penalty;
      l -= float(count) * p.frequency_penalty + p.presence_penalty;
    }
    logits = penalized_;
  }

  if (greedy()) return argmax(logits);
  // OpenAI's defaults cut nothing: the draw needs neither candidates nor any order.
  if (!cuts(p, logits.size())) return draw_all(logits);

  cand_.resize(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) cand_[i] = {logits[i], int32_t(i)};

  // Highest logit first; ties broken by the lower id so the order is fully determined.
  const auto better = [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  // Candidates are sorted best-first only as far as a cut needs: the first `sorted` entries are
  // the best in order (unique under `better`, so growing the prefix never reorders it) and the
  // rest follow unordered. With OpenAI's defaults (no top-k) a full sort of a 150k vocabulary
  // per token would cost milliseconds; top-p and min-p cuts usually end within a few hundred.
  size_t keep = cand_.size(), sorted = 0;
  const auto sort_prefix = [&](size_t n) {
    n = std::min(n, keep);
    if (n <= sorted) return;
    // The next best n - sorted among the unordered rest: a heap of them when they are few (most
    // candidates cost one comparison with its top), else a linear selection and a sort.
    const auto first = cand_.begin() + std::ptrdiff_t(sorted), mid = cand_.begin() + std::ptrdiff_t(n),
               last = cand_.begin() + std::ptrdiff_t(keep);
    if (64 * (n - sorted) < keep - sorted) {
      std::partial_sort(first, mid, last, better);
    } else {
      std::nth_element(first, mid, last, better);
      std::sort(first, mid, better);
    }
    sorted = n;
  };
  const auto grow = [&] { sort_prefix(std::max<size_t>(256, 4 * sorted)); };
  if (p.top_k > 0 && size_t(p.top_k) < keep) {
    sort_prefix(size_t(p.top_k));
    keep = size_t(p.top_k);
  }
  sort_prefix(1);
  const float max_logit = cand_[0].first;
  // Probabilities at temperature 1 for top-p and min-p (as llama.cpp's default chain does),
  // relative to the best: exp(l_i - l_max).
  const auto rel = [&](size_t i) { return double(std::exp(cand_[i].first - max_logit)); };  // f32 exp: fast
  if (p.top_p < 1.0f) {
    double total = 0;
    for (size_t i = 0; i < keep; ++i) total += rel(i);
    double cum = 0;
    size_t n = 0;
    while (n < keep) {
      if (n == sorted) grow();
      cum += rel(n++) / total;
      if (cum >= p.top_p) break;
    }
    keep = n;
  }
  if (p.min_p > 0.0f) {
    size_t n = 1;
    while (n < keep) {
      if (n == sorted) grow();
      if (rel(n) < p.min_p) break;
      ++n;
    }
    keep = n;
  }
  cand_.resize(keep);

  // Temperature, then draw from the remaining distribution (in the candidates' order: best first
  // where a cut sorted them, else as they are; the distribution is the same).
  weight_.resize(keep);
  double sum = 0;
  for (size_t i = 0; i < keep; ++i) sum += weight_[i] = std::exp((cand_[i].first - max_logit) / p.temperature);
  const double u = uniform() * sum;
  double cum = 0;
  for (size_t i = 0; i < keep; ++i) {
    cum += weight_[i];
    if (u < cum) return cand_[i].second;
  }
  return cand_[keep - 1].second;
}

double Sampler::uniform() { return double(rng_() >> 11) * 0x1.0p-53; }

int32_t Sampler::draw_all(std::span<const float> logits) {
  return draw_softmax(logits, params_.temperature, uniform(), weight_, block_sum_);
}

}  // namespace minfer
