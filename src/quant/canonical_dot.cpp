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

// A q4_K / q5_K super-block against its group: the two exact integer sums, then one term.
template <typename Block>
float group_qk(const Block& b, void (*unpack)(const Block&, int, uint8_t*), const BlockQ8Pad40* a) {
  int S = 0, M = 0;
  for (int j = 0; j < 8; ++j) {
    uint8_t q[32];
    int sc, m;
    unpack(b, j, q);
    k_scale_min(b.scales, j, sc, m);
    S += sc * int_dot(q, a[j].qs, 0, 32);
    M += m * a[j].sum;
  }
  const float da = f16_to_f32(a[0].d);
  return da * std::fma(f16_to_f32(b.d), float(S), -(f16_to_f32(b.dmin) * float(M)));
}

float group_q6k(const BlockQ6_K& b, const BlockQ8Pad40* a) {
  int S = 0;
  for (int j = 0; j < 8; ++j) {
    int8_t q[32];
    unpack_q6_K_group(b, j, q);
    S += b.scales[q6_K_scale_index(j, 0)] * int_dot(q, a[j].qs, 0, 16) +
         b.scales[q6_K_scale_index(j, 1)] * int_dot(q, a[j].qs, 16, 32);
  }
  return (f16_to_f32(b.d) * f16_to_f32(a[0].d)) * float(S);
}

float group_q8_0(const BlockQ8_0* row, const BlockQ8Pad40* x, int64_t n_blocks, int64_t g) {
  float t[8];
  for (int j = 0; j < 8; ++j) {
    const int64_t blk = 8 * g + j;
    t[j] = blk < n_blocks ? (f16_to_f32(row[blk].d) * f16_to_f32(x[blk].d)) * float(int_dot(row[blk].qs, x[blk].qs, 0, 32))
                          : 0.0f;
  }
  return ((t[0] + t[1]) + (t[2] + t[3])) + ((t[4] + t[5]) + (t[6] + t[7]));
}

float group_term(GgmlType t, const uint8_t* row, const BlockQ8Pad40* x, int64_t cols, int64_t g) {
  switch (t) {
    case GgmlType::Q4_K: return group_qk(reinterpret_cast<const BlockQ4_K*>(row)[g], unpack_q4_K_group, x + 8 * g);
    case GgmlType::Q5_K: return group_qk(reinterpret_cast<const BlockQ5_K*>(row)[g], unpack_q5_K_group, x + 8 * g);
    case GgmlType::Q6_K: return group_q6k(reinterpret_cast<const BlockQ6_K*>(row)[g], x + 8 * g);
    case GgmlType::Q8_0: return group_q8_0(reinterpret_cast<const BlockQ8_0*>(row), x, cols / 32, g);
    default: fail("canonical_dot: no canonical order for ", type_traits(t).name);
  }
}

}  // namespace

float canonical_dot(GgmlType t, const uint8_t* w_row, const BlockQ8Pad40* x, int64_t cols) {
  float streams[8] = {};
  const int64_t n_groups = (cols + 255) / 256;
  for (int64_t g = 0; g < n_groups; ++g) streams[g % 8] = streams[g % 8] + group_term(t, w_row, x, cols, g);
  const float* s = streams;
  return ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
}

}  // namespace minfer
