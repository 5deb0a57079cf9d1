#include "engine/perplexity.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "util/error.h"
#include "util/threadpool.h"

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

  // The first half of a window is context only: it runs as its own step with no logits out
  // (prompt results do not depend on how the prompt is cut into steps), and only the second
  // half's rows come back. Each scored row's NLL is computed in parallel, then summed in row
  // order (Welford: a stable mean and variance in one pass), so the result does not depend on
  // the thread count.
  const int half = n_ctx / 2, n_rows = n_ctx - 1 - half;  // scored: rows half .. n_ctx - 2
  ThreadPool pool;
  std::vector<double> nll(static_cast<size_t>(n_rows));
  double mean = 0, m2 = 0;
  int64_t n = 0;
  std::vector<int32_t> window(n_ctx);
  for (int w = 0; w < n_windows; ++w) {
    std::copy_n(tokens.begin() + size_t(w) * n_ctx, n_ctx, window.begin());
    if (bos >= 0) window[0] = bos;
    session.reset();
    session.eval_greedy(std::span<const int32_t>(window).first(size_t(half)));
    const std::span<const float> logits = session.eval_all(std::span<const int32_t>(window).subspan(size_t(half)));
    const size_t n_vocab = logits.size() / size_t(n_ctx - half);
    pool.parallel_for(n_rows, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const float* row = logits.data() + size_t(r) * n_vocab;
        float max_logit = row[0];
        for (size_t v = 1; v < n_vocab; ++v) max_logit = std::max(max_logit, row[v]);
        double sum = 0;
        for (size_t v = 0; v < n_vocab; ++v) sum += std::exp(double(row[v]) - max_logit);
        nll[size_t(r)] = std::log(sum) + max_logit - row[window[size_t(half + r + 1)]];
      }
    });
    for (const double x : nll) {
      ++n;
      const double delta = x - mean;
      mean += delta / double(n);
      m2 += delta * (x - mean);
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
