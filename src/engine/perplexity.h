// Perplexity by the usual method: split the tokenized text into non-overlapping windows of n_ctx
// tokens, evaluate each window from an empty context, and score only the second half of each
// window (every scored token then sees at least n_ctx/2 tokens of context).
#pragma once
#include <cstdint>
#include <functional>
#include <span>

#include "engine/session.h"

namespace minfer {

struct PerplexityResult {
  double ppl = 0;       // exp(mean negative log-likelihood)
  double ppl_err = 0;   // standard error of ppl (delta method on the mean NLL)
  double mean_nll = 0;  // nats per scored token
  int64_t n_scored = 0;
  int n_windows = 0;
};

// bos >= 0 replaces each window's first token (models that expect BOS at position 0).
// Throws minfer::Error if the text is shorter than one window (naming both numbers).
PerplexityResult perplexity(Session& session, std::span<const int32_t> tokens, int n_ctx,
                            int32_t bos, const std::function<void(int, int)>& progress = {});

}  // namespace minfer
