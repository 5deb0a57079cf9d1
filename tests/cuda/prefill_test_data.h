// Random weight matrices in GGUF block layouts for the prefill GEMM test and bench: random bytes
// (every bit pattern of quants and packed scales is a valid block) with the f16 block scales set
// to finite values, so the data covers all code paths and never holds NaN or Inf.
#pragma once
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "quant/types.h"
#include "util/half.h"

namespace minfer::test {

inline std::vector<uint8_t> random_weight_rows(GgmlType t, int64_t n, int64_t k, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> scale(0.002f, 0.02f);
  const size_t bytes = row_bytes(t, k) * size_t(n);
  std::vector<uint8_t> w(bytes + 8);
  for (size_t i = 0; i < w.size(); i += 8) {
    const uint64_t r = rng();
    std::memcpy(&w[i], &r, 8);
  }
  w.resize(bytes);
  auto set_f16 = [&](size_t at, float v) {
    const uint16_t h = f32_to_f16(v);
    std::memcpy(&w[at], &h, 2);
  };
  switch (t) {
    case GgmlType::Q4_K:
    case GgmlType::Q5_K: {  // d and dmin lead the block
      const size_t block = t == GgmlType::Q4_K ? sizeof(BlockQ4_K) : sizeof(BlockQ5_K);
      for (size_t b = 0; b < bytes; b += block) set_f16(b, scale(rng)), set_f16(b + 2, scale(rng));
      break;
    }
    case GgmlType::Q6_K:
      for (size_t b = 0; b < bytes; b += sizeof(BlockQ6_K)) set_f16(b + offsetof(BlockQ6_K, d), scale(rng));
      break;
    case GgmlType::Q8_0:
      for (size_t b = 0; b < bytes; b += sizeof(BlockQ8_0)) set_f16(b, scale(rng));
      break;
    case GgmlType::F16:
      for (size_t b = 0; b < bytes; b += 2) set_f16(b, normal(rng));
      break;
    case GgmlType::BF16:
      for (size_t b = 0; b < bytes; b += 2) {
        const uint16_t h = f32_to_bf16(normal(rng));
        std::memcpy(&w[b], &h, 2);
      }
      break;
    case GgmlType::F32:
      for (size_t b = 0; b < bytes; b += 4) {
        const float v = normal(rng);
        std::memcpy(&w[b], &v, 4);
      }
      break;
    default:
      break;
  }
  return w;
}

}  // namespace minfer::test
