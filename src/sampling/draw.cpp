// The draw from a tempered softmax over a whole vocabulary (sampling/draw.h). Compiled with
// -fno-trapping-math (CMakeLists.txt) so the float compares of its loops if-convert and the loops
// vectorize (no trap is ever enabled in minfer, so the results are the same), and with
// -ffp-contract=off so every operation of sampling/draw_math.h rounds as the device's does.
#include "sampling/draw.h"

#include <algorithm>

#include "sampling/draw_math.h"

namespace minfer {

int32_t draw_softmax(std::span<const float> logits, float temperature, double uniform, std::vector<float>& weight,
                     std::vector<double>& block_sum) {
  const size_t n = logits.size();
  const float* l = logits.data();
  float lane_max[8];
  for (float& m : lane_max) m = l[0];
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; ++k) lane_max[k] = std::max(lane_max[k], l[i + size_t(k)]);
  for (; i < n; ++i) lane_max[0] = std::max(lane_max[0], l[i]);
  const float max_logit = *std::max_element(lane_max, lane_max + 8);
  // softmax(l / T) up to its sum: 2^((l - max) log2(e) / T).
  const float scale = draw_math::exponent_scale(temperature);
  weight.resize(n);
  float* w = weight.data();
  for (i = 0; i < n; ++i) w[i] = draw_math::weight(l[i], max_logit, scale);
  // Sums per block (eight float lanes, then a fixed tree), the blocks added in double; the draw
  // finds its block from those sums, then its token by a scan inside the block.
  constexpr size_t kBlock = draw_math::kBlock;
  block_sum.resize((n + kBlock - 1) / kBlock);
  for (size_t b = 0; b < block_sum.size(); ++b) {
    const size_t first = b * kBlock, last = std::min(n, first + kBlock);
    float lane[draw_math::kLanes] = {};
    size_t j = first;
    for (; j + 8 <= last; j += 8)
      for (int k = 0; k < 8; ++k) lane[k] += w[j + size_t(k)];
    for (; j < last; ++j) lane[0] += w[j];
    block_sum[b] = double(draw_math::lane_tree(lane));
  }
  const draw_math::BlockPick pick = draw_math::pick_block(block_sum.data(), int(block_sum.size()), uniform);
  const size_t first = size_t(pick.block) * kBlock, last = std::min(n, first + kBlock);
  return draw_math::pick_token(w + first, int(first), int(last - first), pick);
}

}  // namespace minfer
