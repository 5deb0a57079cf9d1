// Drawing one token from softmax(logits / temperature) over a whole vocabulary, with no cut: the
// sampler's path for OpenAI's defaults, where the work is one exponential per token.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

namespace minfer {

// uniform in [0, 1). weight and block_sum are scratch (kept by the caller across draws). The
// exponentials are computed to about one ulp (2^y by a polynomial, exactly 0 far below the best
// logit, so -inf logits are never drawn); tokens are taken in id order.
int32_t draw_softmax(std::span<const float> logits, float temperature, double uniform, std::vector<float>& weight,
                     std::vector<double>& block_sum);

}  // namespace minfer
