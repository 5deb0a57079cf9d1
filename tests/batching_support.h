// Runs prompts alone and together on one kind of backend, for the batch-invariance tests (CPU and
// GPU share them): a sequence's greedy tokens and logits must not depend on the batch around it
// or on how its prompt was cut into chunks.
#pragma once
#include <functional>
#include <memory>
#include <vector>

#include "engine/engine.h"
#include "sampling/sampler.h"

namespace minfer::test {

using BackendFactory = std::function<std::unique_ptr<Backend>(const Model&)>;

struct GreedyStream {
  std::vector<int32_t> tokens;      // generated, greedy
  std::vector<float> first_logits;  // the logits the first token was picked from
};

// Each prompt in a session of its own: the prompt in one step, then one decode step per token.
std::vector<GreedyStream> greedy_alone(const Model& model, const BackendFactory& backend,
                                       const std::vector<std::vector<int32_t>>& prompts, int n_gen);
// All prompts through the scheduler: up to max_seqs at a time, step_tokens per step (so prompts
// are cut into chunks and share steps with other sequences' decode tokens).
std::vector<GreedyStream> greedy_together(const Model& model, const BackendFactory& backend,
                                          const std::vector<std::vector<int32_t>>& prompts, int n_gen,
                                          int max_seqs, int step_tokens);
// All prompts in one step (one output row each), then n_gen - 1 decode steps of all of them, each
// submitted fed by the step before (Step::submit_after) before that one is collected: each
// prompt's n_gen greedy tokens. block_size: the KV pool's (small, so that block tables grow).
std::vector<std::vector<int32_t>> greedy_fed(const Model& model, const BackendFactory& backend,
                                             const std::vector<std::vector<int32_t>>& prompts, int n_gen,
                                             int block_size);
// Session::generate_greedy against decode_greedy a token at a time on one backend (gtest
// expectations): the same tokens after 1, 2 and 9 of them, the same context left (the logits of the
// next token decoded after them, bit for bit), and at a context that ends six tokens past the
// prompt the same tokens and the same error.
void expect_generate_greedy_is_decode_greedy(const Model& model, const BackendFactory& backend);
std::vector<std::vector<int32_t>> random_prompts(int n, int min_len, int max_len, int n_vocab, uint64_t salt);
// Each prompt's n_gen sampled tokens (end tokens ignored) through the scheduler, up to max_seqs at
// a time; request i samples with `sampling` at seed sampling.seed + i. want_logits: each request
// asks for its logits (as logprobs do), so the host samples from them instead of the backend
// drawing where the logits are.
// Sampling at `temperature` with nothing cut and no penalty (OpenAI's defaults at temperature 1).
SamplerParams whole_vocabulary_sampling(float temperature, uint64_t seed);
struct SampledStreams {
  std::vector<std::vector<int32_t>> tokens;  // per prompt
  int64_t backend_draws = 0;                 // tokens the backend drew (StepBatch::draws)
};
SampledStreams sampled_streams(const Model& model, const BackendFactory& backend,
                               const std::vector<std::vector<int32_t>>& prompts, int n_gen, int max_seqs,
                               const SamplerParams& sampling, bool want_logits);

}  // namespace minfer::test
