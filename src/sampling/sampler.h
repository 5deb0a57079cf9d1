// Token sampling: penalties, then top-k, top-p, min-p, temperature; greedy when temp is 0.
// Deterministic for a given seed.
#pragma once
#include <cstdint>
#include <functional>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace minfer {

// How a caller spells a sampling parameter in its error messages, given the parameter's name
// ("top_p"): the CLI answers with its flag ("--top-p"), a server's request parser with the request
// field ("top_p", the default). The rule and the rest of the message are the same for both.
using ParamSpelling = std::function<std::string(std::string_view name)>;

struct SamplerParams {
  float temperature = 0.8f;  // [0, 2]; 0: greedy
  int top_k = 40;            // >= 0; 0: off
  float top_p = 0.95f;       // (0, 1]; 1: off
  float min_p = 0.05f;       // [0, 1]; 0: off
  float repeat_penalty = 1.0f;     // > 0; 1: off (llama.cpp semantics: divide positive logits)
  float presence_penalty = 0.0f;   // [-2, 2]
  float frequency_penalty = 0.0f;  // [-2, 2]
  int penalty_last_n = 64;         // tokens of history the penalties look at; -1: all of it
  uint64_t seed = 0;

  // Checks every parameter against its range (OpenAI's where OpenAI has the parameter:
  // temperature, top_p, presence_penalty, frequency_penalty) and throws minfer::Error for the
  // first one outside it, e.g. "--top-p 2 is out of range: top_p must be in (0, 1]". NaN is
  // outside every range.
  void validate(const ParamSpelling& spelling = {}) const;
};

// Greedy with no penalty: the argmax of the raw logits, which a backend computes where they are.
bool plain_greedy(const SamplerParams& p);
// A seed as text (a command-line value, a request field): a decimal integer in [0, 2^64 - 1].
// Anything else, "-1" and "18446744073709551616" included, throws the same kind of message
// instead of wrapping or saturating to some other seed.
uint64_t parse_seed(std::string_view text, const ParamSpelling& spelling = {});

class Sampler {
 public:
  explicit Sampler(SamplerParams p);  // validates p
  // history: tokens generated so far (and prompt), used by the penalties.
  int32_t sample(std::span<const float> logits, std::span<const int32_t> history);
  bool greedy() const { return params_.temperature <= 0; }
  // True when sample() over n_vocab logits is one draw from softmax(logits / temperature) over all
  // of them (temperature > 0, no penalty applies, nothing is cut): that draw can then be done where
  // the logits are (Step::draw, with take_uniform()) and gives the token sample() would.
  bool draws_whole_vocabulary(size_t n_vocab) const;
  // The uniform number the next draw takes (the generator advances as sample() advances it).
  double take_uniform() { return uniform(); }
  const SamplerParams& params() const { return params_; }

 private:
  // Draws from softmax(l / temperature) over all of `logits`, in id order.
  int32_t draw_all(std::span<const float> logits);
  // The next draw's uniform number in [0, 1): 53 random bits.
  double uniform();

  SamplerParams params_;
  std::mt19937_64 rng_;
  std::vector<float> penalized_;                 // the logits after penalties (when any apply)
  std::vector<std::pair<float, int32_t>> cand_;  // the candidates a cut sorts
  std::vector<float> weight_;                    // the draw's unnormalized probabilities
  std::vector<double> block_sum_;                // draw_all: their sums per block of 256
};

int32_t argmax(std::span<const float> logits);

}  // namespace minfer
