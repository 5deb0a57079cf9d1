// Token sampling: penalties, then top-k, top-p, min-p, temperature; greedy when temp <= 0.
// Deterministic for a given seed.
#pragma once
#include <cstdint>
#include <random>
#include <span>
#include <vector>

namespace minfer {

struct SamplerParams {
  float temperature = 0.8f;  // <= 0: greedy
  int top_k = 40;            // <= 0: off
  float top_p = 0.95f;       // >= 1: off
  float min_p = 0.05f;       // <= 0: off
  float repeat_penalty = 1.0f;     // 1: off (llama.cpp semantics: divide positive logits)
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  int penalty_last_n = 64;         // tokens of history the penalties look at
  uint64_t seed = 0;
};

// Greedy with no penalty: the argmax of the raw logits, which a backend computes where they are.
bool plain_greedy(const SamplerParams& p);

class Sampler {
 public:
  explicit Sampler(SamplerParams p);
  // history: tokens generated so far (and prompt), used by the penalties.
  int32_t sample(std::span<const float> logits, std::span<const int32_t> history);
  bool greedy() const { return params_.temperature <= 0; }
  const SamplerParams& params() const { return params_; }

 private:
  SamplerParams params_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> cand_;
};

int32_t argmax(std::span<const float> logits);

}  // namespace minfer
