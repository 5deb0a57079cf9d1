// The draw from a tempered softmax over a whole vocabulary (sampling/draw.h). Compiled with
// -fno-trapping-math (CMakeLists.txt) so the float compares of its loops if-convert and the loops
// vectorize; no trap is ever enabled in minfer, so the results are the same.
#include "sampling/draw.h"

#include <algorithm>
#include <cstring>

namespace minfer {

namespace {

// 2^y for y <= 0, to about one ulp, and exactly 0 below -126.5 (no subnormals; -inf gives 0, so a
// masked token is never drawn): y = n + f with n an integer and |f| <= 1/2, 2^f from its Taylor
// series in f ln 2 (degree 7), 2^n put into the exponent (n = -127 makes it 0). Plain arithmetic
// the compiler vectorizes, unlike a call to expf: the draw over a 150k vocabulary is otherwise all
// exponentials.
inline float exp2_nonpositive(float y) {
  y = y < -127.0f ? -127.0f : y;
  const float shifter = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const float t = y + shifter;
  const float n = t - shifter;
  const float r = (y - n) * 0.693147180559945f;  // f ln 2, |r| <= 0.3466
  float p = 1.0f / 5040;
  p = p * r + 1.0f / 720;
  p = p * r + 1.0f / 120;
  p = p * r + 1.0f / 24;
  p = p * r + 1.0f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  int32_t bits;
  std::memcpy(&bits, &t, 4);
  const int32_t scale_bits = (bits - 0x4B400000 + 127) << 23;  // t's mantissa holds n + 2^22 + 2^23
  float scale;
  std::memcpy(&scale, &scale_bits, 4);
  return p * scale;
}

}  // namespace

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
  const float scale = 1.4426950408889634f / temperature;
  weight.resize(n);
  float* w = weight.data();
  for (i = 0; i < n; ++i) w[i] = exp2_nonpositive((l[i] - max_logit) * scale);
  // Sums per block of 256 (eight float lanes, then a fixed tree), the blocks added in double; the
  // draw finds its block from those sums, then its token by a scan inside the block.
  constexpr size_t kBlock = 256;
  block_sum.resize((n + kBlock - 1) / kBlock);
  double total = 0;
  for (size_t b = 0; b < block_sum.size(); ++b) {
    const size_t first = b * kBlock, last = std::min(n, first + kBlock);
    float lane[8] = {};
    size_t j = first;
    for (; j + 8 <= last; j += 8)
      for (int k = 0; k < 8; ++k) lane[k] += w[j + size_t(k)];
    for (; j < last; ++j) lane[0] += w[j];
    block_sum[b] = double(((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7])));
    total += block_sum[b];
  }
  const double u = uniform * total;
  double cum = 0;
  size_t b = 0;
  while (b + 1 < block_sum.size() && cum + block_sum[b] <= u) cum += block_sum[b++];
  const size_t first = b * kBlock, last = std::min(n, first + kBlock);
  for (size_t j = first; j < last; ++j) {
    cum += w[j];
    if (u < cum) return int32_t(j);
  }
  return int32_t(last - 1);  // rounding left u past the block's own sum
}

}  // namespace minfer
