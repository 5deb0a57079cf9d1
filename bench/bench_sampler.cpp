// Sampler::sample on a Qwen-size vocabulary (151,936 logits drawn from N(0, 3^2)) for the
// parameter sets users send: OpenAI's defaults (temperature 1, no cuts), the CLI's defaults
// (top-k 40, top-p 0.95, min-p 0.05, temperature 0.8), top-p alone, and a repeat penalty over 64
// tokens of history. items/s counts sampled tokens.
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "sampling/sampler.h"

namespace minfer {
namespace {

constexpr size_t kVocab = 151936;

std::vector<float> logits_row() {
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.0f, 3.0f);
  std::vector<float> v(kVocab);
  for (auto& x : v) x = dist(rng);
  return v;
}

void run(benchmark::State& state, SamplerParams p) {
  const std::vector<float> logits = logits_row();
  std::vector<int32_t> history(64);
  for (size_t i = 0; i < history.size(); ++i) history[i] = int32_t(i * 997 % kVocab);
  p.seed = 1;
  Sampler s(p);
  for (auto _ : state) benchmark::DoNotOptimize(s.sample(logits, history));
  state.SetItemsProcessed(state.iterations());
}

// No top-k and no min-p; top_p and the repeat penalty as given.
SamplerParams without_k_cuts(float top_p, float repeat_penalty) {
  SamplerParams p;
  p.temperature = 1.0f;
  p.top_k = 0;
  p.min_p = 0.0f;
  p.top_p = top_p;
  p.repeat_penalty = repeat_penalty;
  return p;
}

void BM_OpenAiDefaults(benchmark::State& state) { run(state, without_k_cuts(1.0f, 1.0f)); }
void BM_CliDefaults(benchmark::State& state) { run(state, SamplerParams{}); }
void BM_TopPOnly(benchmark::State& state) { run(state, without_k_cuts(0.95f, 1.0f)); }
void BM_RepeatPenaltyNoCuts(benchmark::State& state) { run(state, without_k_cuts(1.0f, 1.1f)); }
BENCHMARK(BM_OpenAiDefaults)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_CliDefaults)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_TopPOnly)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_RepeatPenaltyNoCuts)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace minfer
