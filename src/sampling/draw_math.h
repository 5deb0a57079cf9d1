// The arithmetic of the whole-vocabulary draw (sampling/draw.h), shared by the host sampler and the
// CUDA backend's draw kernel so that both give the same token for the same logits and uniform
// number: every multiply and add is rounded on its own (the device's explicitly, the host's because
// sampling/draw.cpp is compiled with -ffp-contract=off), in the same order.
#pragma once
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define MINFER_DRAW_FN __host__ __device__ inline
#else
#define MINFER_DRAW_FN inline
#endif

namespace minfer::draw_math {

// Tokens per block: the draw sums weights in blocks of this many (eight float lanes, then a fixed
// tree), adds the block sums in double, finds the drawn block from them and scans inside it.
constexpr int kBlock = 256;
constexpr int kLanes = 8;

MINFER_DRAW_FN float mul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
MINFER_DRAW_FN float add(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
MINFER_DRAW_FN float sub(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}

// The factor that turns (logit - max) into the exponent of 2: log2(e) / temperature.
MINFER_DRAW_FN float exponent_scale(float temperature) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(1.4426950408889634f, temperature);
#else
  return 1.4426950408889634f / temperature;
#endif
}

// 2^y for y <= 0, to about one ulp, and exactly 0 below -126.5 (no subnormals; -inf gives 0, so a
// masked token is never drawn): y = n + f with n an integer and |f| <= 1/2, 2^f from its Taylor
// series in f ln 2 (degree 7), 2^n put into the exponent (n = -127 makes it 0). Plain arithmetic
// the host compiler vectorizes, unlike a call to expf: the draw over a 150k vocabulary is
// otherwise all exponentials.
MINFER_DRAW_FN float exp2_nonpositive(float y) {
  y = y < -127.0f ? -127.0f : y;
  const float shifter = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const float t = add(y, shifter);
  const float n = sub(t, shifter);
  const float r = mul(sub(y, n), 0.693147180559945f);  // f ln 2, |r| <= 0.3466
  float p = 1.0f / 5040;
  p = add(mul(p, r), 1.0f / 720);
  p = add(mul(p, r), 1.0f / 120);
  p = add(mul(p, r), 1.0f / 24);
  p = add(mul(p, r), 1.0f / 6);
  p = add(mul(p, r), 0.5f);
  p = add(mul(p, r), 1.0f);
  p = add(mul(p, r), 1.0f);
  int32_t bits;
  std::memcpy(&bits, &t, 4);
  const int32_t scale_bits = (bits - 0x4B400000 + 127) << 23;  // t's mantissa holds n + 2^22 + 2^23
  float scale;
  std::memcpy(&scale, &scale_bits, 4);
  return mul(p, scale);
}

// The unnormalized probability of a token: 2^((logit - max) * scale).
MINFER_DRAW_FN float weight(float logit, float max_logit, float scale) {
  return exp2_nonpositive(mul(sub(logit, max_logit), scale));
}

// The sum of a block's weights: lane k adds tokens first + k, first + k + 8, ... of the whole
// groups of eight in order, lane 0 then the tail, and the lanes meet in a fixed tree.
MINFER_DRAW_FN float lane_tree(const float (&lane)[kLanes]) {
  return add(add(add(lane[0], lane[1]), add(lane[2], lane[3])), add(add(lane[4], lane[5]), add(lane[6], lane[7])));
}

// Where the draw lands among the blocks: u = uniform × (the block sums added in order, in double),
// then the first block whose running sum passes u (the last one if rounding leaves u past them all).
struct BlockPick {
  int block;
  double cum;  // the sums of the blocks before it
  double u;
};
MINFER_DRAW_FN BlockPick pick_block(const double* block_sum, int n_blocks, double uniform) {
  double total = 0;
  for (int b = 0; b < n_blocks; ++b) total += block_sum[b];
  const double u = uniform * total;
  double cum = 0;
  int b = 0;
  while (b + 1 < n_blocks && cum + block_sum[b] <= u) cum += block_sum[b++];
  return {b, cum, u};
}

// The token inside the picked block: its n weights (tokens first .. first + n - 1) added to the
// running sum in order until it passes u; the block's last token if rounding leaves u past them.
MINFER_DRAW_FN int32_t pick_token(const float* weight, int first, int n, const BlockPick& p) {
  double cum = p.cum;
  for (int j = 0; j < n; ++j) {
    cum += double(weight[j]);
    if (p.u < cum) return first + j;
  }
  return first + n - 1;
}

}  // namespace minfer::draw_math
