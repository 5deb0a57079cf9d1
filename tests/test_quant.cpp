// Quant formats: known-answer dequantization of hand-packed blocks, quantizer quality (RMSE on
// N(0,1) rows), dot kernels against a float64 reference, the pad40 rule, f16/bf16 conversions.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "quant/canonical_dot.h"
#include "quant/quant.h"
#include "support.h"
#include "util/error.h"
#include "util/half.h"

namespace minfer {
namespace {

std::mt19937_64 make_rng(uint64_t salt) { return std::mt19937_64(test::seed() * 31 + salt); }
int uniform_int(std::mt19937_64& rng, int lo, int hi) {
  return std::uniform_int_distribution<int>(lo, hi)(rng);
}

// Scales that are small powers of two keep every expected value exact in float.
float pow2_scale(std::mt19937_64& rng) { return std::ldexp(1.0f, uniform_int(rng, -8, 2)); }

template <typename Block>
std::vector<float> dequantized(GgmlType t, const std::vector<Block>& blocks) {
  const int64_t n = int64_t(blocks.size()) * type_traits(t).block_size;
  std::vector<float> out(size_t(n), NAN);
  dequantize_row(t, blocks.data(), out.data(), n);
  return out;
}

// ---- known answers: blocks packed here from the GGUF layout description ------------------

TEST(QuantDequantize, Q4_0AndQ4_1) {
  auto rng = make_rng(1);
  std::vector<BlockQ4_0> b0(3);
  std::vector<BlockQ4_1> b1(3);
  std::vector<float> want0, want1;
  for (int i = 0; i < 3; ++i) {
    const float d = pow2_scale(rng), m = -pow2_scale(rng) * 3;
    int q[32];
    for (int& v : q) v = uniform_int(rng, 0, 15);
    b0[i].d = b1[i].d = f32_to_f16(d);
    b1[i].m = f32_to_f16(m);
    for (int j = 0; j < 16; ++j) b0[i].qs[j] = b1[i].qs[j] = uint8_t(q[j] | (q[j + 16] << 4));
    for (int j = 0; j < 32; ++j) {
      want0.push_back(d * float(q[j] - 8));
      want1.push_back(d * float(q[j]) + m);
    }
  }
  EXPECT_EQ(dequantized(GgmlType::Q4_0, b0), want0);
  EXPECT_EQ(dequantized(GgmlType::Q4_1, b1), want1);
}

TEST(QuantDequantize, Q5_0AndQ5_1) {
  auto rng = make_rng(2);
  std::vector<BlockQ5_0> b0(3);
  std::vector<BlockQ5_1> b1(3);
  std::vector<float> want0, want1;
  for (int i = 0; i < 3; ++i) {
    const float d = pow2_scale(rng), m = pow2_scale(rng) * 5;
    int q[32];
    for (int& v : q) v = uniform_int(rng, 0, 31);
    b0[i].d = b1[i].d = f32_to_f16(d);
    b1[i].m = f32_to_f16(m);
    uint32_t qh = 0;
    for (int j = 0; j < 32; ++j) qh |= uint32_t(q[j] >> 4) << j;
    for (int k = 0; k < 4; ++k) b0[i].qh[k] = b1[i].qh[k] = uint8_t(qh >> (8 * k));  // little endian
    for (int j = 0; j < 16; ++j) b0[i].qs[j] = b1[i].qs[j] = uint8_t((q[j] & 15) | ((q[j + 16] & 15) << 4));
    for (int j = 0; j < 32; ++j) {
      want0.push_back(d * float(q[j] - 16));
      want1.push_back(d * float(q[j]) + m);
    }
  }
  EXPECT_EQ(dequantized(GgmlType::Q5_0, b0), want0);
  EXPECT_EQ(dequantized(GgmlType::Q5_1, b1), want1);
}

TEST(QuantDequantize, Q8_0AndQ8_K) {
  auto rng = make_rng(3);
  std::vector<BlockQ8_0> b0(2);
  std::vector<BlockQ8_K> bk(1);
  std::vector<float> want0, wantk;
  for (auto& b : b0) {
    const float d = pow2_scale(rng);
    b.d = f32_to_f16(d);
    for (auto& q : b.qs) {
      q = int8_t(uniform_int(rng, -128, 127));
      want0.push_back(d * float(q));
    }
  }
  bk[0].d = 0.375f;
  for (auto& q : bk[0].qs) {
    q = int8_t(uniform_int(rng, -128, 127));
    wantk.push_back(0.375f * float(q));
  }
  EXPECT_EQ(dequantized(GgmlType::Q8_0, b0), want0);
  EXPECT_EQ(dequantized(GgmlType::Q8_K, bk), wantk);
}

// Packs 8 six-bit scales and mins into the 12 q4_K/q5_K scale bytes.
void pack_k_scales(const int* sc, const int* mn, uint8_t* out) {
  for (int j = 0; j < 4; ++j) {
    out[j] = uint8_t((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
    out[j + 4] = uint8_t((mn[j] & 63) | ((mn[j + 4] >> 4) << 6));
    out[j + 8] = uint8_t((sc[j + 4] & 15) | ((mn[j + 4] & 15) << 4));
  }
}

TEST(QuantDequantize, Q4_KAndQ5_K) {
  auto rng = make_rng(4);
  BlockQ4_K b4{};
  BlockQ5_K b5{};
  const float d = pow2_scale(rng), dmin = pow2_scale(rng);
  b4.d = b5.d = f32_to_f16(d);
  b4.dmin = b5.dmin = f32_to_f16(dmin);
  int sc[8], mn[8];
  for (int j = 0; j < 8; ++j) {
    sc[j] = uniform_int(rng, 0, 63);
    mn[j] = uniform_int(rng, 0, 63);
  }
  sc[5] = 63, mn[6] = 47;  // high bits set in the packed upper half
  pack_k_scales(sc, mn, b4.scales);
  pack_k_scales(sc, mn, b5.scales);
  std::vector<float> want4, want5;
  for (int e = 0; e < 256; ++e) {
    const int q = uniform_int(rng, 0, 31), sub = e / 32, within = e % 64;
    uint8_t& byte4 = b4.qs[32 * (e / 64) + within % 32];
    uint8_t& byte5 = b5.qs[32 * (e / 64) + within % 32];
    const int shift = within < 32 ? 0 : 4;
    byte4 = uint8_t(byte4 | ((q & 15) << shift));
    byte5 = uint8_t(byte5 | ((q & 15) << shift));
    b5.qh[e % 32] = uint8_t(b5.qh[e % 32] | ((q >> 4) << sub));
    want4.push_back(float(double(d) * sc[sub] * (q & 15) - double(dmin) * mn[sub]));
    want5.push_back(float(double(d) * sc[sub] * q - double(dmin) * mn[sub]));
  }
  EXPECT_EQ(dequantized(GgmlType::Q4_K, std::vector<BlockQ4_K>{b4}), want4);
  EXPECT_EQ(dequantized(GgmlType::Q5_K, std::vector<BlockQ5_K>{b5}), want5);
}

TEST(QuantDequantize, Q6_K) {
  auto rng = make_rng(5);
  BlockQ6_K b{};
  const float d = pow2_scale(rng);
  b.d = f32_to_f16(d);
  for (auto& s : b.scales) s = int8_t(uniform_int(rng, -128, 127));
  std::vector<float> want;
  for (int e = 0; e < 256; ++e) {
    const int q = uniform_int(rng, 0, 63), half = e / 128, r = e % 128, k = r / 32, l = r % 32;
    uint8_t& low = b.ql[64 * half + 32 * (k & 1) + l];
    low = uint8_t(low | ((q & 15) << (k >= 2 ? 4 : 0)));
    b.qh[32 * half + l] = uint8_t(b.qh[32 * half + l] | ((q >> 4) << (2 * k)));
    want.push_back(float(double(d) * b.scales[e / 16] * (q - 32)));
  }
  EXPECT_EQ(dequantized(GgmlType::Q6_K, std::vector<BlockQ6_K>{b}), want);
}

TEST(QuantDequantize, Q2_KAndQ3_K) {
  auto rng = make_rng(6);
  BlockQ2_K b2{};
  BlockQ3_K b3{};
  const float d = pow2_scale(rng), dmin = pow2_scale(rng);
  b2.d = b3.d = f32_to_f16(d);
  b2.dmin = f32_to_f16(dmin);
  int sc2[16], mn2[16], sc3[16];
  for (int i = 0; i < 16; ++i) {
    sc2[i] = uniform_int(rng, 0, 15);
    mn2[i] = uniform_int(rng, 0, 15);
    sc3[i] = uniform_int(rng, 0, 63);
    b2.scales[i] = uint8_t(sc2[i] | (mn2[i] << 4));
    // q3_K: low 4 bits in scales[i % 8] (low nibble for i < 8), high 2 bits in scales[8 + i % 4].
    b3.scales[i % 8] = uint8_t(b3.scales[i % 8] | ((sc3[i] & 15) << (i < 8 ? 0 : 4)));
    b3.scales[8 + i % 4] = uint8_t(b3.scales[8 + i % 4] | ((sc3[i] >> 4) << (2 * (i / 4))));
  }
  std::vector<float> want2, want3;
  for (int e = 0; e < 256; ++e) {
    const int q2 = uniform_int(rng, 0, 3), high = uniform_int(rng, 0, 1);
    const int half = e / 128, r = e % 128, shift = 2 * (r / 32), l = r % 32;
    b2.qs[32 * half + l] = uint8_t(b2.qs[32 * half + l] | (q2 << shift));
    b3.qs[32 * half + l] = uint8_t(b3.qs[32 * half + l] | (q2 << shift));
    b3.hmask[l] = uint8_t(b3.hmask[l] | (high << (e / 32)));
    want2.push_back(float(double(d) * sc2[e / 16] * q2 - double(dmin) * mn2[e / 16]));
    want3.push_back(float(double(d) * (sc3[e / 16] - 32) * (q2 - (high ? 0 : 4))));
  }
  EXPECT_EQ(dequantized(GgmlType::Q2_K, std::vector<BlockQ2_K>{b2}), want2);
  EXPECT_EQ(dequantized(GgmlType::Q3_K, std::vector<BlockQ3_K>{b3}), want3);
}

TEST(QuantDequantize, FloatTypes) {
  const std::vector<float> x = {1.0f, -2.5f, 65504.0f, 3.0e-5f, -0.0f, 1e-8f, 3.140625f, -7.0f};
  std::vector<uint16_t> h(x.size()), bf(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    h[i] = f32_to_f16(x[i]);
    bf[i] = f32_to_bf16(x[i]);
  }
  std::vector<float> out(x.size());
  dequantize_row(GgmlType::F16, h.data(), out.data(), int64_t(x.size()));
  for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(out[i], f16_to_f32(h[i]));
  dequantize_row(GgmlType::BF16, bf.data(), out.data(), int64_t(x.size()));
  for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(out[i], bf16_to_f32(bf[i]));
  dequantize_row(GgmlType::F32, x.data(), out.data(), int64_t(x.size()));
  EXPECT_EQ(out, x);
}

TEST(QuantDequantize, RejectsBadArguments) {
  std::vector<uint8_t> buf(1024);
  std::vector<float> out(256);
  EXPECT_THROW(dequantize_row(GgmlType::IQ2_XXS, buf.data(), out.data(), 256), Error);
  EXPECT_THROW(dequantize_row(GgmlType::Q4_K, buf.data(), out.data(), 100), Error);
  EXPECT_THROW(quantize_row(GgmlType::Q3_K, out.data(), buf.data(), 256), Error);
  EXPECT_THROW(quantize_row(GgmlType::Q4_0, out.data(), buf.data(), 33), Error);
  EXPECT_THROW(vec_dot_pad40(GgmlType::F16, buf.data(), nullptr, 32), Error);
  EXPECT_THROW(vec_dot_f32(GgmlType::Q8_0, buf.data(), out.data(), 32), Error);
}

// ---- quantizer quality ---------------------------------------------------------------------

struct QualityCase {
  GgmlType type;
  double bits_per_weight;
  double max_rmse;  // ~10% above the measured value; see docs/02-quant-formats.md
};

TEST(QuantQuality, RmseOnGaussianRows) {
  const QualityCase cases[] = {
      {GgmlType::F16, 16, 0.00024},  {GgmlType::BF16, 16, 0.0019},  {GgmlType::Q8_0, 8.5, 0.0059},
      {GgmlType::Q8_K, 9.125, 0.0077}, {GgmlType::Q6_K, 6.5625, 0.019}, {GgmlType::Q5_K, 5.5, 0.040},
      {GgmlType::Q5_1, 6, 0.037},    {GgmlType::Q5_0, 5.5, 0.045},   {GgmlType::Q4_K, 4.5, 0.078},
      {GgmlType::Q4_1, 5, 0.077},    {GgmlType::Q4_0, 4.5, 0.090},
  };
  const int n = 4096, rows = 8;
  const std::vector<float> x = test::random_normal(size_t(n) * rows, 1.0f, 7);
  std::vector<uint8_t> q(size_t(n) * 4);
  std::vector<float> y(n);
  std::printf("type   bits/weight  rmse (N(0,1), %d rows of %d)\n", rows, n);
  for (const auto& c : cases) {
    double se = 0;
    for (int r = 0; r < rows; ++r) {
      const float* xr = x.data() + size_t(r) * n;
      ASSERT_EQ(quantize_row(c.type, xr, q.data(), n), row_bytes(c.type, n));
      dequantize_row(c.type, q.data(), y.data(), n);
      for (int i = 0; i < n; ++i) se += (double(y[i]) - xr[i]) * (double(y[i]) - xr[i]);
    }
    const double rmse = std::sqrt(se / (double(n) * rows));
    EXPECT_DOUBLE_EQ(8.0 * type_traits(c.type).type_size / type_traits(c.type).block_size, c.bits_per_weight);
    std::printf("%-6s %6.4g       %.5f\n", type_traits(c.type).name, c.bits_per_weight, rmse);
    EXPECT_LT(rmse, c.max_rmse) << type_traits(c.type).name;
  }
}

// Rows the search must not trip over: zeros, constants, a single spike, wide dynamic range.
TEST(QuantQuality, DegenerateRows) {
  const int n = 256;
  std::vector<std::vector<float>> rows = {std::vector<float>(n, 0.0f), std::vector<float>(n, -0.75f),
                                          std::vector<float>(n, 2.0f), std::vector<float>(n, 0.0f),
                                          test::random_normal(n, 1e-3f, 8)};
  rows[3][77] = 5.0f;
  for (int i = 0; i < n; ++i) rows[4][i] *= std::ldexp(1.0f, i % 24 - 12);
  std::vector<uint8_t> q(n * 4);
  std::vector<float> y(n);
  for (GgmlType t : {GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0,
                     GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::Q8_K}) {
    for (size_t r = 0; r < rows.size(); ++r) {
      quantize_row(t, rows[r].data(), q.data(), n);
      dequantize_row(t, q.data(), y.data(), n);
      float amax = 0;
      for (float v : rows[r]) amax = std::max(amax, std::fabs(v));
      for (int i = 0; i < n; ++i) {
        ASSERT_TRUE(std::isfinite(y[i])) << type_traits(t).name << " row " << r;
        // Coarse but type-independent: no element may be off by more than the row's range.
        ASSERT_LE(std::fabs(y[i] - rows[r][i]), 0.6f * amax + 1e-6f) << type_traits(t).name << " row " << r;
      }
      if (r == 0) {
        for (int i = 0; i < n; ++i) ASSERT_EQ(y[i], 0.0f) << type_traits(t).name;
      }
    }
  }
}

// ---- pad40 ---------------------------------------------------------------------------------

// The rule from quant.h, written out plainly.
std::vector<BlockQ8Pad40> reference_pad40(const std::vector<float>& x) {
  std::vector<BlockQ8Pad40> out(x.size() / 32);
  for (size_t b = 0; b < out.size(); ++b) {
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = fmaxf(amax, fabsf(x[32 * b + j]));
    const float d = amax / 127.0f;
    const float id = d != 0 ? 1.0f / d : 0.0f;
    BlockQ8Pad40 blk{};
    blk.d = f32_to_f16(d);
    for (int j = 0; j < 32; ++j) {
      const int q = std::min(127, std::max(-128, int(rintf(x[32 * b + j] * id))));
      blk.qs[j] = int8_t(q);
      blk.sum += q;
    }
    out[b] = blk;
  }
  return out;
}

TEST(QuantPad40, MatchesTheRuleBitwise) {
  std::vector<float> x = test::random_normal(32 * 64, 3.0f, 9);
  for (int j = 0; j < 32; ++j) x[j] = 0;                                  // all-zero block
  for (int j = 0; j < 32; ++j) x[32 + j] = float(j - 16) * 127.0f / 16;   // exact levels and ties
  for (int j = 0; j < 32; ++j) x[64 + j] = std::ldexp(float(j + 1), -140);  // subnormal inputs
  for (int j = 0; j < 32; ++j) x[96 + j] = 1e30f * float(j % 5 - 2);        // huge
  const auto want = reference_pad40(x);
  std::vector<BlockQ8Pad40> got(want.size());
  std::memset(got.data(), 0xAB, got.size() * sizeof(BlockQ8Pad40));
  quantize_row_pad40(x.data(), got.data(), int64_t(x.size()));
  ASSERT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(BlockQ8Pad40)), 0);
  static_assert(offsetof(BlockQ8Pad40, qs) == 4 && offsetof(BlockQ8Pad40, sum) == 36);
  std::vector<float> y(x.size());
  dequantize_row_pad40(got.data(), y.data(), int64_t(x.size()));
  for (size_t i = 0; i < x.size(); ++i) {  // bitwise: the huge block's d overflows f16 to inf
    const float want_y = f16_to_f32(got[i / 32].d) * float(got[i / 32].qs[i % 32]);
    ASSERT_EQ(std::memcmp(&y[i], &want_y, 4), 0) << i;
  }
}

// The grouped form: the same rule with one amax per 256 columns, the row's last group short.
TEST(QuantPad40, GroupedSharesOneScalePerGroup) {
  std::vector<float> x = test::random_normal(32 * 67, 3.0f, 10);  // 8 whole groups and a 3-block one
  for (int j = 0; j < 256; ++j) x[size_t(j)] = 0;                                       // an all-zero group
  for (int j = 0; j < 256; ++j) x[size_t(256 + j)] = float(j % 32 - 16) * 127.0f / 16;  // exact levels and ties
  for (int j = 0; j < 256; ++j) x[size_t(512 + j)] = std::ldexp(float(j + 1), -140);    // subnormal inputs
  for (int j = 0; j < 32; ++j) x[size_t(768 + j)] = 1e30f * float(j % 5 - 2);           // huge
  x[size_t(32 * 64 + 5)] = 40.0f;
  // The rule per group, from the per-block form: a group's blocks quantized with the group's amax
  // are what quantize_row_pad40 gives for a copy whose every block holds that amax.
  std::vector<BlockQ8Pad40> got(x.size() / 32), want(x.size() / 32);
  quantize_row_pad40_grouped(x.data(), got.data(), int64_t(x.size()));
  for (size_t g0 = 0; g0 < x.size(); g0 += 256) {
    const size_t g1 = std::min(x.size(), g0 + 256);
    float amax = 0;
    for (size_t i = g0; i < g1; ++i) amax = std::fmax(amax, std::fabs(x[i]));
    const float d = amax / 127.0f, id = d != 0 ? 1.0f / d : 0.0f;
    for (size_t b = g0 / 32; b < g1 / 32; ++b) {
      want[b].d = f32_to_f16(d);
      for (int j = 0; j < 32; ++j) {
        want[b].qs[j] = int8_t(std::min(127, std::max(-128, int(rintf(x[32 * b + size_t(j)] * id)))));
        want[b].sum += want[b].qs[j];
      }
    }
  }
  ASSERT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(BlockQ8Pad40)), 0);
  EXPECT_EQ(f16_to_f32(got[64].d), f16_to_f32(f32_to_f16(40.0f / 127.0f)));  // the short group's own scale
}

// ---- dot kernels ---------------------------------------------------------------------------

const GgmlType kPad40Types[] = {GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1,
                                GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K};

// Random bytes make every level pattern (including the extremes) appear; the f16 scale fields
// are then overwritten with finite values drawn by `scale`.
template <typename Scale>
std::vector<uint8_t> random_weight_row(GgmlType t, int64_t n, std::mt19937_64& rng, Scale scale) {
  std::vector<uint8_t> row(row_bytes(t, n));
  for (auto& b : row) b = uint8_t(rng());
  const int bytes = type_traits(t).type_size;
  for (size_t off = 0; off < row.size(); off += size_t(bytes)) {
    uint16_t* f16_fields[2] = {nullptr, nullptr};
    uint8_t* blk = row.data() + off;
    switch (t) {
      case GgmlType::Q4_0: case GgmlType::Q5_0: case GgmlType::Q8_0:
        f16_fields[0] = &reinterpret_cast<BlockQ4_0*>(blk)->d;
        break;
      case GgmlType::Q4_1: case GgmlType::Q5_1: case GgmlType::Q4_K: case GgmlType::Q5_K:
        f16_fields[0] = &reinterpret_cast<BlockQ4_1*>(blk)->d;
        f16_fields[1] = &reinterpret_cast<BlockQ4_1*>(blk)->m;
        break;
      case GgmlType::Q6_K: f16_fields[0] = &reinterpret_cast<BlockQ6_K*>(blk)->d; break;
      default: break;
    }
    for (uint16_t* f : f16_fields)
      if (f) *f = f32_to_f16(scale(rng));
  }
  return row;
}

// Quants drawn from [-max_abs, max_abs - 1].
std::vector<BlockQ8Pad40> random_pad40(int64_t n, std::mt19937_64& rng, bool unit_scale,
                                       int max_abs = 128) {
  std::vector<BlockQ8Pad40> x(size_t(n / 32));
  for (auto& b : x) {
    b.d = f32_to_f16(unit_scale ? 1.0f : std::ldexp(1.0f, uniform_int(rng, -10, 0)) * 1.37f);
    b.pad = 0;
    b.sum = 0;
    for (auto& q : b.qs) {
      q = int8_t(uniform_int(rng, -max_abs, max_abs - 1));
      b.sum += q;
    }
  }
  return x;
}

double reference_dot(GgmlType t, const void* w, const std::vector<BlockQ8Pad40>& x, int64_t n,
                     double* abs_sum) {
  std::vector<float> wf(static_cast<size_t>(n)), xf(static_cast<size_t>(n));
  dequantize_row(t, w, wf.data(), n);
  dequantize_row_pad40(x.data(), xf.data(), n);
  double dot = 0;
  *abs_sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    dot += double(wf[i]) * double(xf[i]);
    *abs_sum += std::fabs(double(wf[i]) * double(xf[i]));
  }
  return dot;
}

TEST(QuantDot, Pad40MatchesFloat64Reference) {
  auto rng = make_rng(10);
  for (GgmlType t : kPad40Types)
    for (int64_t n : {int64_t(256), int64_t(4096)}) {
      const auto w = random_weight_row(t, n, rng, [](std::mt19937_64& r) {
        return std::ldexp(1.0f, uniform_int(r, -12, -4)) * (1.0f + float(r() % 1000) / 1000.0f);
      });
      const auto x = random_pad40(n, rng, false);
      double abs_sum = 0;
      const double want = reference_dot(t, w.data(), x, n, &abs_sum);
      const double tol = 1e-5 * abs_sum + 1e-30;
      EXPECT_NEAR(vec_dot_pad40(t, w.data(), x.data(), n), want, tol) << type_traits(t).name << " n=" << n;
      EXPECT_NEAR(vec_dot_pad40_portable(t, w.data(), x.data(), n), want, tol)
          << type_traits(t).name << " n=" << n;
    }
}

// With every scale 1 the whole dot is an integer; kept below 2^24 the result must be exact.
TEST(QuantDot, Pad40IntegerPartIsExact) {
  auto rng = make_rng(11);
  for (GgmlType t : kPad40Types) {
    const int64_t n = 256;
    const auto w = random_weight_row(t, n, rng, [](std::mt19937_64&) { return 1.0f; });
    // Activations small enough that every partial sum stays below 2^24.
    std::vector<float> wf(static_cast<size_t>(n));
    dequantize_row(t, w.data(), wf.data(), n);
    float wmax = 1;
    for (float v : wf) wmax = std::max(wmax, std::fabs(v));
    const auto x = random_pad40(n, rng, true, std::min(128, int(16777216.0 / (double(n) * wmax))));
    double abs_sum = 0;
    const double want = reference_dot(t, w.data(), x, n, &abs_sum);
    ASSERT_LT(abs_sum, 16777216.0);
    EXPECT_EQ(double(vec_dot_pad40(t, w.data(), x.data(), n)), want) << type_traits(t).name;
    EXPECT_EQ(double(vec_dot_pad40_portable(t, w.data(), x.data(), n)), want) << type_traits(t).name;
  }
}

// The canonical summation order of the decode matmuls is a dot product like any other: against the
// float64 reference, for row lengths of whole, partial (q8_0 past a 256-column group) and many
// groups.
TEST(QuantDot, CanonicalOrderMatchesFloat64Reference) {
  auto rng = make_rng(14);
  for (GgmlType t : {GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::Q8_0}) {
    ASSERT_TRUE(has_canonical_dot(t));
    for (int64_t n : {int64_t(256), int64_t(3584), int64_t(18944), int64_t(t == GgmlType::Q8_0 ? 544 : 512)}) {
      const auto w = random_weight_row(t, n, rng, [](std::mt19937_64& r) {
        return std::ldexp(1.0f, uniform_int(r, -12, -4)) * (1.0f + float(r() % 1000) / 1000.0f);
      });
      auto x = random_pad40(n, rng, false);
      for (size_t b = 0; b < x.size(); ++b) x[b].d = x[b / 8 * 8].d;  // one scale per group, as grouped
      double abs_sum = 0;
      const double want = reference_dot(t, w.data(), x, n, &abs_sum);
      EXPECT_NEAR(canonical_dot(t, w.data(), x.data(), n), want, 1e-5 * abs_sum + 1e-30)
          << type_traits(t).name << " n=" << n;
    }
  }
  EXPECT_FALSE(has_canonical_dot(GgmlType::Q4_0));
}

TEST(QuantDot, QuantizedWeightsAgainstQuantizedActivations) {
  const int64_t n = 4096;
  const auto wf = test::random_normal(size_t(n), 0.02f, 12);
  const auto xf = test::random_normal(size_t(n), 1.0f, 13);
  std::vector<BlockQ8Pad40> x(size_t(n / 32));
  quantize_row_pad40(xf.data(), x.data(), n);
  for (GgmlType t : kPad40Types) {
    std::vector<uint8_t> w(row_bytes(t, n));
    quantize_row(t, wf.data(), w.data(), n);
    double abs_sum = 0;
    const double want = reference_dot(t, w.data(), x, n, &abs_sum);
    EXPECT_NEAR(vec_dot_pad40(t, w.data(), x.data(), n), want, 1e-5 * abs_sum) << type_traits(t).name;
  }
}

TEST(QuantDot, FloatWeights) {
  for (int64_t n : {int64_t(7), int64_t(32), int64_t(1000), int64_t(4096)}) {
    const auto wf = test::random_normal(size_t(n), 1.0f, 14 + uint64_t(n));
    const auto x = test::random_normal(size_t(n), 1.0f, 15 + uint64_t(n));
    for (GgmlType t : {GgmlType::F32, GgmlType::F16, GgmlType::BF16}) {
      std::vector<uint8_t> w(row_bytes(t, n));
      quantize_row(t, wf.data(), w.data(), n);
      std::vector<float> deq(static_cast<size_t>(n));
      dequantize_row(t, w.data(), deq.data(), n);
      double want = 0, abs_sum = 0;
      for (int64_t i = 0; i < n; ++i) {
        want += double(deq[i]) * x[i];
        abs_sum += std::fabs(double(deq[i]) * x[i]);
      }
      EXPECT_NEAR(vec_dot_f32(t, w.data(), x.data(), n), want, 1e-5 * abs_sum) << type_traits(t).name;
      EXPECT_NEAR(vec_dot_f32_portable(t, w.data(), x.data(), n), want, 1e-5 * abs_sum)
          << type_traits(t).name;
    }
  }
}

// ---- f16 / bf16 conversions ------------------------------------------------------------------

TEST(QuantHalf, F16RoundTripsEveryPattern) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = f16_to_f32(uint16_t(h));
    const bool nan = (h & 0x7c00) == 0x7c00 && (h & 0x3ff);
    if (nan) {
      EXPECT_TRUE(std::isnan(f));
      EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(f))));
    } else {
      ASSERT_EQ(f32_to_f16(f), h) << std::hex << h;
    }
  }
}

TEST(QuantHalf, F16RoundsHalfwayToEven) {
  // Midpoints between neighbouring finite f16 values (exact in float) round to the even one.
  for (uint32_t h = 0; h < 0x7bff; ++h) {
    const double lo = f16_to_f32(uint16_t(h)), hi = f16_to_f32(uint16_t(h + 1));
    const float mid = float((lo + hi) / 2);
    ASSERT_EQ(double(mid), (lo + hi) / 2);
    const uint16_t even = (h & 1) ? uint16_t(h + 1) : uint16_t(h);
    ASSERT_EQ(f32_to_f16(mid), even) << std::hex << h;
    ASSERT_EQ(f32_to_f16(-mid), uint16_t(even | 0x8000)) << std::hex << h;
    // Just off the midpoint goes to the nearer neighbour.
    ASSERT_EQ(f32_to_f16(std::nextafter(mid, 0.0f)), h);
    ASSERT_EQ(f32_to_f16(std::nextafter(mid, 1e9f)), h + 1);
  }
}

TEST(QuantHalf, F16EdgeCases) {
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16(65519.996f), 0x7bff);
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);  // halfway to 2^16 rounds to even: overflow
  EXPECT_EQ(f32_to_f16(1e10f), 0x7c00);
  EXPECT_EQ(f32_to_f16(-INFINITY), 0xfc00);
  EXPECT_EQ(f16_to_f32(0x7c00), INFINITY);
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -25)), 0x0000);  // tie with zero: even
  EXPECT_EQ(f32_to_f16(std::ldexp(1.5f, -25)), 0x0001);
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -14)), 0x0400);  // smallest normal
  EXPECT_EQ(f16_to_f32(0x03ff), std::ldexp(1023.0f, -24));
  EXPECT_EQ(f32_to_f16(-0.0f), 0x8000);
  EXPECT_EQ(f32_to_f16(1e-30f), 0x0000);
  EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(NAN))));
  EXPECT_EQ(f32_to_f16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);      // tie: even (down)
  EXPECT_EQ(f32_to_f16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);  // tie: even (up)
}

TEST(QuantHalf, Bf16) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = bf16_to_f32(uint16_t(h));
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    ASSERT_EQ(bits, h << 16);
    if (!std::isnan(f)) {
      ASSERT_EQ(f32_to_bf16(f), h);
    }
  }
  EXPECT_EQ(f32_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);      // tie: even (down)
  EXPECT_EQ(f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);  // tie: even (up)
  EXPECT_EQ(f32_to_bf16(std::nextafter(1.0f + std::ldexp(1.0f, -8), 2.0f)), 0x3f81);
  EXPECT_EQ(f32_to_bf16(INFINITY), 0x7f80);
  EXPECT_EQ(f32_to_bf16(3.4e38f), 0x7f80);  // rounds past the largest finite bf16
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
  uint32_t snan_bits = 0x7f800001;  // a NaN whose payload sits below bit 16 stays a NaN
  float snan;
  std::memcpy(&snan, &snan_bits, 4);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(snan))));
}

}  // namespace
}  // namespace minfer
