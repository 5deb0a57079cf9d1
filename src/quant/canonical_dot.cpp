#include "quant/canonical_dot.h"

#include <cmath>

#include "quant/unpack.h"
#include "util/error.h"
#include "util/half.h"

namespace minfer {

using namespace quant_detail;

bool has_canonical_dot(GgmlType t) {
  return t == GgmlType::Q4_K || t == GgmlType::Q5_K || t == GgmlType::Q6_K || t == GgmlType::Q8_0;
}

namespace {

template <typename Q>
int int_dot(const Q* q, const int8_t* a, int from, int to) {
  int s = 0;
  for (int l = from; l < to; ++l) s += int(q[l]) * int(a[l]);
  return s;
}

// Term j of a q4_K / q5_K super-block: d * sc and dmin * m per sub-block, one fma.
template <typename Block>
float term_qk(const Block& b, int j, void (*unpack)(const Block&, int, uint8_t*), const BlockQ8Pad40& a) {
  uint8_t q[32];
  int sc, m;
  unpack(b, j, q);
  k_scale_min(b.scales, j, sc, m);
  const float d_sc = f16_to_f32(b.d) * float(sc), dmin_m = f16_to_f32(b.dmin) * float(m);
  return f16_to_f32(a.d) * std::fma(d_sc, float(int_dot(q, a.qs, 0, 32)), -(dmin_m * float(a.sum)));
}

// Term j (sub-block j of group g) of the row, or +0 past its end.
float term(GgmlType t, const uint8_t* row, const BlockQ8Pad40* x, int64_t cols, int64_t g, int j) {
  const int64_t blk = 8 * g + j;  // the 32-column block
  if (32 * blk >= cols) return 0.0f;
  const BlockQ8Pad40& a = x[blk];
  const float da = f16_to_f32(a.d);
  switch (t) {
    case GgmlType::Q4_K: return term_qk(reinterpret_cast<const BlockQ4_K*>(row)[g], j, unpack_q4_K_group, a);
    case GgmlType::Q5_K: return term_qk(reinterpret_cast<const BlockQ5_K*>(row)[g], j, unpack_q5_K_group, a);
    case GgmlType::Q6_K: {
      const auto& b = reinterpret_cast<const BlockQ6_K*>(row)[g];
      int8_t q[32];
      unpack_q6_K_group(b, j, q);
      const int scaled = b.scales[q6_K_scale_index(j, 0)] * int_dot(q, a.qs, 0, 16) +
                         b.scales[q6_K_scale_index(j, 1)] * int_dot(q, a.qs, 16, 32);
      return (f16_to_f32(b.d) * da) * float(scaled);
    }
    case GgmlType::Q8_0: {
      const auto& b = reinterpret_cast<const BlockQ8_0*>(row)[blk];
      return (f16_to_f32(b.d) * da) * float(int_dot(b.qs, a.qs, 0, 32));
    }
    default:
      fail("canonical_dot: no canonical order for ", type_traits(t).name);
  }
}

}  // namespace

float canonical_dot(GgmlType t, const uint8_t* w_row, const BlockQ8Pad40* x, int64_t cols) {
  float streams[8] = {};
  const int64_t n_groups = (cols + 255) / 256;
  for (int64_t g = 0; g < n_groups; ++g) {
    float T[8];
    for (int j = 0; j < 8; ++j) T[j] = term(t, w_row, x, cols, g, j);
    const float group = ((T[0] + T[1]) + (T[2] + T[3])) + ((T[4] + T[5]) + (T[6] + T[7]));
    streams[g % 8] = streams[g % 8] + group;
  }
  const float* s = streams;
  return ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
}

}  // namespace minfer
