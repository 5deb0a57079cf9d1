#include "engine/perplexity.h"

#include <cmath>
#include <vector>

#include "util/error.h"

namespace minfer {

PerplexityResult perplexity(Session& session, std::span<const int32_t> tokens, int n_ctx,
                            int32_t bos, const std::function<void(int, int)>& progress) {
  if (n_ctx < 4) fail("perplexity: context of ", n_ctx, " tokens is too small (need >= 4)");
  if (n_ctx > session.n_ctx())
    fail("perplexity: window of ", n_ctx, " tokens exceeds the session context n_ctx=",
         session.n_ctx());
  const int n_windows = int(tokens.size() / size_t(n_ctx));
  if (n_windows == 0)
    fail("perplexity: the text has ", tokens.size(), " tokens, fewer than one window of ", n_ctx,
         "; use a longer text or a smaller -c");

  // Welford over per-token NLL: stable mean and variance in one pass.
  double mean = 0, m2 = 0;
  int64_t n = 0;
  std::vector<int32_t> window(n_ctx);
  for (int w = 0; w < n_windows; ++w) {
    std::copy_n(tokens.begin() + size_t(w) * n_ctx, n_ctx, window.begin());
    if (bos >= 0) window[0] = bos;
    session.reset();
    const std::span<const float> logits = session.eval_all(window);
    const size_t n_vocab = logits.size() / size_t(n_ctx);
    for (int j = n_ctx / 2; j < n_ctx - 1; ++j) {
      const float* row = logits.data() + size_t(j) * n_vocab;
      float max_logit = row[0];
      for (size_t v = 1; v < n_vocab; ++v) max_logit = std::max(max_logit, row[v]);
      double sum = 0;
      for (size_t v = 0; v < n_vocab; ++v) sum += std::exp(double(row[v]) - max_logit);
      const double nll = std::log(sum) + max_logit - row[window[j + 1]];
      ++n;
      const double delta = nll - mean;
      mean += delta / double(n);
      m2 += delta * (nll - mean);
    }
    if (progress) progress(w + 1, n_windows);
  }
  PerplexityResult r;
  r.n_windows = n_windows;
  r.n_scored = n;
  r.mean_nll = mean;
  r.ppl = std::exp(mean);
  const double stderr_mean = n > 1 ? std::sqrt(m2 / double(n - 1) / double(n)) : 0.0;
  r.ppl_err = r.ppl * stderr_mean;
  return r;
}

}  // namespace minfer
