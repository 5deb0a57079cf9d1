// Weight quantizers. The block formats only fix how levels and scales are stored; the quality
// comes from choosing them: every block's scale (and offset) is searched over candidates around
// the min/max fit, each candidate's rounding is refit by least squares, and the smallest squared
// error wins. Stateless and per row, so callers can quantize rows from many threads.
#include <cmath>
#include <cstring>
#include <limits>

#include "quant/quant.h"
#include "util/error.h"
#include "util/half.h"

namespace minfer {
namespace {

// Round to nearest, ties to even, for |v| < 2^22 (adding 1.5 * 2^23 leaves the rounded integer in
// the low mantissa bits). Branch-free so the level loops vectorize; callers clamp the result.
inline int nearest_int(float v) {
  const float t = v + 12582912.0f;
  int32_t bits;
  std::memcpy(&bits, &t, 4);
  return (bits & 0x007fffff) - 0x00400000;
}

inline int clamp_int(int v, int lo, int hi) { return v < lo ? lo : (v > hi ? hi : v); }

struct AffineFit {
  float scale = 0, offset = 0;  // x ~ scale * L + offset, L in [0, nmax]
};

// Least-squares scale/offset for fixed levels L and its squared error.
struct LevelSums {
  float n = 0, sl = 0, sll = 0, slx = 0, sx = 0, sxx = 0;
};

float affine_error(const LevelSums& s, const AffineFit& f) {
  return s.sxx - 2 * (f.scale * s.slx + f.offset * s.sx) + f.scale * f.scale * s.sll +
         2 * f.scale * f.offset * s.sl + s.n * f.offset * f.offset;
}

AffineFit affine_refit(const LevelSums& s, bool offset_nonpositive) {
  AffineFit f;
  const float det = s.n * s.sll - s.sl * s.sl;
  if (det > 0) {
    f.scale = (s.n * s.slx - s.sl * s.sx) / det;
    f.offset = (s.sll * s.sx - s.sl * s.slx) / det;
    if (offset_nonpositive && f.offset > 0) {
      f.offset = 0;
      f.scale = s.slx / s.sll;
    }
  } else {  // all levels equal: the offset alone fits, unless it must stay <= 0
    f.offset = s.sx / s.n;
    if (offset_nonpositive && f.offset > 0) {
      f.offset = 0;
      f.scale = s.sll > 0 ? s.slx / s.sll : 0;
    }
  }
  return f;
}

// Levels for x under inverse scale `iscale` and offset `base`; returns their sums. The level sums
// are exact integers and sum(Lx) runs in 8 independent lanes, so the loop vectorizes.
LevelSums affine_levels(const float* x, int n, int nmax, float iscale, float base, uint8_t* L) {
  int sl = 0, sll = 0;
  float slx[8] = {};
  for (int i = 0; i < n; i += 8)
    for (int k = 0; k < 8; ++k) {
      const int l = clamp_int(nearest_int(iscale * (x[i + k] - base)), 0, nmax);
      L[i + k] = uint8_t(l);
      sl += l;
      sll += l * l;
      slx[k] += float(l) * x[i + k];
    }
  LevelSums s;
  s.n = float(n);
  s.sl = float(sl);
  s.sll = float(sll);
  for (int k = 0; k < 8; ++k) s.slx += slx[k];
  return s;
}

// Best x ~ scale * L + offset with integer L in [0, nmax] over n elements. Candidate inverse
// scales (nmax + step*k) / (max - min), k in [k_lo, k_hi], each refit by least squares, then the
// winner is re-rounded and refit while that lowers the error. offset_nonpositive: the format
// stores -offset as an unsigned number (q4_K/q5_K mins). Levels of the winner go to L.
AffineFit fit_affine(const float* x, int n, int nmax, int k_lo, int k_hi, bool offset_nonpositive,
                     uint8_t* L) {
  float xmin = x[0], xmax = x[0], sx = 0, sxx = 0;
  for (int i = 0; i < n; ++i) {
    xmin = std::fmin(xmin, x[i]);
    xmax = std::fmax(xmax, x[i]);
    sx += x[i];
    sxx += x[i] * x[i];
  }
  if (offset_nonpositive && xmin > 0) xmin = 0;
  if (!(xmax > xmin)) {  // constant block (or NaN): all levels 0
    std::memset(L, 0, size_t(n));
    return {0, offset_nonpositive ? std::fmin(xmin, 0.0f) : xmin};
  }
  uint8_t trial[QK_K];
  AffineFit best{(xmax - xmin) / float(nmax), xmin};
  float best_err = std::numeric_limits<float>::infinity();
  auto consider = [&](float iscale, float base) {
    LevelSums s = affine_levels(x, n, nmax, iscale, base, trial);
    s.sx = sx;
    s.sxx = sxx;
    const AffineFit f = affine_refit(s, offset_nonpositive);
    const float err = affine_error(s, f);
    if (!(err < best_err)) return false;
    best_err = err;
    best = f;
    std::memcpy(L, trial, size_t(n));
    return true;
  };
  for (int k = k_lo; k <= k_hi; ++k) consider((float(nmax) + 0.1f * float(k)) / (xmax - xmin), xmin);
  for (int iter = 0; iter < 3 && best.scale > 0; ++iter)
    if (!consider(1.0f / best.scale, best.offset)) break;
  return best;
}

// Best x ~ scale * L with integer L in [-nneg, npos]. Candidates map the largest-magnitude
// element to about -nneg or +npos (k tenths of a level either way); for fixed levels the
// least-squares scale is sum(Lx)/sum(LL) and the error sum(xx) - sum(Lx)^2/sum(LL), so the
// candidate with the largest sum(Lx)^2/sum(LL) wins. Levels (not offset) go to L.
float fit_symmetric(const float* x, int n, int nneg, int npos, int ksteps, int8_t* L) {
  float xm = 0;
  for (int i = 0; i < n; ++i)
    if (std::fabs(x[i]) > std::fabs(xm)) xm = x[i];
  if (xm == 0 || !std::isfinite(xm)) {
    std::memset(L, 0, size_t(n));
    return 0;
  }
  int8_t trial[QK_K];
  float best_score = -1, best_scale = 0;
  auto consider = [&](float iscale) {
    int sll_int = 0;
    float lanes[8] = {};
    for (int i = 0; i < n; i += 8)
      for (int k = 0; k < 8; ++k) {
        const int l = clamp_int(nearest_int(iscale * x[i + k]), -nneg, npos);
        trial[i + k] = int8_t(l);
        lanes[k] += float(l) * x[i + k];
        sll_int += l * l;
      }
    float slx = 0;
    for (int k = 0; k < 8; ++k) slx += lanes[k];
    const float sll = float(sll_int);
    if (sll == 0) return false;
    const float score = slx * slx / sll;
    if (!(score > best_score)) return false;
    best_score = score;
    best_scale = slx / sll;
    std::memcpy(L, trial, size_t(n));
    return true;
  };
  for (int k = -ksteps; k <= ksteps; ++k) {
    consider(-(float(nneg) + 0.1f * float(k)) / xm);
    consider((float(npos) + 0.1f * float(k)) / xm);
  }
  for (int iter = 0; iter < 3 && best_scale != 0; ++iter)
    if (!consider(1.0f / best_scale)) break;
  return best_scale;
}

// Levels of x for a stored (already rounded) scale: nearest rounding is optimal for fixed scale.
void symmetric_levels(const float* x, int n, float scale, int nneg, int npos, int8_t* L) {
  const float inv = scale != 0 ? 1.0f / scale : 0.0f;
  for (int i = 0; i < n; ++i) L[i] = int8_t(clamp_int(nearest_int(x[i] * inv), -nneg, npos));
}
void affine_levels_for(const float* x, int n, float scale, float offset, int nmax, uint8_t* L) {
  const float inv = scale != 0 ? 1.0f / scale : 0.0f;
  for (int i = 0; i < n; ++i) L[i] = uint8_t(clamp_int(nearest_int((x[i] - offset) * inv), 0, nmax));
}

// Symmetric 32-blocks with a stored f16 scale: q4_0 (nneg 8) and q5_0 (nneg 16). Returns levels
// shifted to unsigned (L + nneg) for packing.
uint16_t quantize_symmetric32(const float* x, int nneg, uint8_t* q) {
  int8_t L[QK];
  const uint16_t d = f32_to_f16(fit_symmetric(x, QK, nneg, nneg - 1, 6, L));
  symmetric_levels(x, QK, f16_to_f32(d), nneg, nneg - 1, L);
  for (int j = 0; j < QK; ++j) q[j] = uint8_t(L[j] + nneg);
  return d;
}

// Affine 32-blocks with stored f16 scale and offset: q4_1 (nmax 15) and q5_1 (nmax 31).
void quantize_affine32(const float* x, int nmax, uint16_t& d, uint16_t& m, uint8_t* q) {
  const AffineFit f = fit_affine(x, QK, nmax, -6, 6, false, q);
  d = f32_to_f16(f.scale);
  m = f32_to_f16(f.offset);
  affine_levels_for(x, QK, f16_to_f32(d), f16_to_f32(m), nmax, q);
}

void pack_nibbles32(const uint8_t* q, uint8_t* qs) {
  for (int j = 0; j < 16; ++j) qs[j] = uint8_t((q[j] & 0xF) | ((q[j + 16] & 0xF) << 4));
}
void pack_qh32(const uint8_t* q, uint8_t* qh_bytes) {
  uint32_t qh = 0;
  for (int j = 0; j < QK; ++j) qh |= uint32_t((q[j] >> 4) & 1) << j;
  std::memcpy(qh_bytes, &qh, 4);
}

void quantize_q4_0(const float* x, BlockQ4_0* b, int64_t nb) {
  uint8_t q[QK];
  for (int64_t i = 0; i < nb; ++i, x += QK) {
    b[i].d = quantize_symmetric32(x, 8, q);
    pack_nibbles32(q, b[i].qs);
  }
}
void quantize_q5_0(const float* x, BlockQ5_0* b, int64_t nb) {
  uint8_t q[QK];
  for (int64_t i = 0; i < nb; ++i, x += QK) {
    b[i].d = quantize_symmetric32(x, 16, q);
    pack_nibbles32(q, b[i].qs);
    pack_qh32(q, b[i].qh);
  }
}
void quantize_q4_1(const float* x, BlockQ4_1* b, int64_t nb) {
  uint8_t q[QK];
  for (int64_t i = 0; i < nb; ++i, x += QK) {
    quantize_affine32(x, 15, b[i].d, b[i].m, q);
    pack_nibbles32(q, b[i].qs);
  }
}
void quantize_q5_1(const float* x, BlockQ5_1* b, int64_t nb) {
  uint8_t q[QK];
  for (int64_t i = 0; i < nb; ++i, x += QK) {
    quantize_affine32(x, 31, b[i].d, b[i].m, q);
    pack_nibbles32(q, b[i].qs);
    pack_qh32(q, b[i].qh);
  }
}

void quantize_q8_0(const float* x, BlockQ8_0* b, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += QK) {
    float amax = 0;
    for (int j = 0; j < QK; ++j) amax = std::fmax(amax, std::fabs(x[j]));
    b[i].d = f32_to_f16(amax / 127.0f);
    const float d = f16_to_f32(b[i].d);
    const float inv = d != 0 ? 1.0f / d : 0.0f;
    for (int j = 0; j < QK; ++j) b[i].qs[j] = int8_t(clamp_int(nearest_int(x[j] * inv), -127, 127));
  }
}

// q4_K/q5_K: per 32-group affine fits, then the 8 scales and 8 mins are themselves quantized to
// 6 bits against the super-block's f16 d and dmin, and the levels re-rounded for the stored values.
template <typename Block>
void quantize_k_scale_min(const float* x, Block* b, int64_t nb, int nmax, int k_lo, int k_hi) {
  uint8_t L[QK_K];
  for (int64_t i = 0; i < nb; ++i, x += QK_K) {
    float scales[8], mins[8], max_scale = 0, max_min = 0;
    for (int g = 0; g < 8; ++g) {
      const AffineFit f = fit_affine(x + 32 * g, 32, nmax, k_lo, k_hi, true, L + 32 * g);
      scales[g] = std::fmax(f.scale, 0.0f);
      mins[g] = -f.offset;
      max_scale = std::fmax(max_scale, scales[g]);
      max_min = std::fmax(max_min, mins[g]);
    }
    b[i].d = f32_to_f16(max_scale / 63.0f);
    b[i].dmin = f32_to_f16(max_min / 63.0f);
    const float d = f16_to_f32(b[i].d), dmin = f16_to_f32(b[i].dmin);
    const float id = d > 0 ? 1.0f / d : 0.0f, idmin = dmin > 0 ? 1.0f / dmin : 0.0f;
    uint8_t ls[8], lm[8];
    for (int g = 0; g < 8; ++g) {
      ls[g] = uint8_t(clamp_int(nearest_int(scales[g] * id), 0, 63));
      lm[g] = uint8_t(clamp_int(nearest_int(mins[g] * idmin), 0, 63));
    }
    for (int j = 0; j < 4; ++j) {
      b[i].scales[j] = uint8_t(ls[j] | ((ls[j + 4] >> 4) << 6));
      b[i].scales[j + 4] = uint8_t(lm[j] | ((lm[j + 4] >> 4) << 6));
      b[i].scales[j + 8] = uint8_t((ls[j + 4] & 0xF) | ((lm[j + 4] & 0xF) << 4));
    }
    for (int g = 0; g < 8; ++g)
      affine_levels_for(x + 32 * g, 32, d * float(ls[g]), -dmin * float(lm[g]), nmax, L + 32 * g);
    // qs: group g's levels go to the low (even g) or high (odd g) nibbles of qs[32*(g/2)..].
    for (int c = 0; c < 4; ++c)
      for (int l = 0; l < 32; ++l)
        b[i].qs[32 * c + l] = uint8_t((L[64 * c + l] & 0xF) | ((L[64 * c + 32 + l] & 0xF) << 4));
    if constexpr (requires { b[i].qh; }) {
      std::memset(b[i].qh, 0, sizeof b[i].qh);
      for (int g = 0; g < 8; ++g)
        for (int l = 0; l < 32; ++l) b[i].qh[l] |= uint8_t(((L[32 * g + l] >> 4) & 1) << g);
    }
  }
}

void quantize_q6_K(const float* x, BlockQ6_K* b, int64_t nb) {
  int8_t L[QK_K];
  for (int64_t i = 0; i < nb; ++i, x += QK_K) {
    float scales[16], max_scale = 0;
    for (int s = 0; s < 16; ++s) {
      scales[s] = fit_symmetric(x + 16 * s, 16, 32, 31, 4, L + 16 * s);
      if (std::fabs(scales[s]) > std::fabs(max_scale)) max_scale = scales[s];
    }
    // The largest-magnitude scale maps to -128 so the int8 scale range is used in full.
    const float iscale = max_scale != 0 ? -128.0f / max_scale : 0.0f;
    b[i].d = f32_to_f16(iscale != 0 ? 1.0f / iscale : 0.0f);
    const float d = f16_to_f32(b[i].d);
    for (int s = 0; s < 16; ++s) {
      b[i].scales[s] = int8_t(clamp_int(nearest_int(iscale * scales[s]), -128, 127));
      symmetric_levels(x + 16 * s, 16, d * float(b[i].scales[s]), 32, 31, L + 16 * s);
    }
    std::memset(b[i].qh, 0, sizeof b[i].qh);
    for (int g = 0; g < 8; ++g) {
      const int h = g / 4, k = g % 4;
      uint8_t* ql = b[i].ql + 64 * h + 32 * (k & 1);
      uint8_t* qh = b[i].qh + 32 * h;
      for (int l = 0; l < 32; ++l) {
        const int u = L[32 * g + l] + 32;
        if (k < 2) ql[l] = uint8_t(u & 0xF);
        else ql[l] = uint8_t(ql[l] | ((u & 0xF) << 4));
        qh[l] = uint8_t(qh[l] | ((u >> 4) << (2 * k)));
      }
    }
  }
}

void quantize_q8_K(const float* x, BlockQ8_K* b, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += QK_K) {
    float xm = 0;
    for (int j = 0; j < QK_K; ++j)
      if (std::fabs(x[j]) > std::fabs(xm)) xm = x[j];
    const float iscale = xm != 0 && std::isfinite(xm) ? -128.0f / xm : 0.0f;
    b[i].d = iscale != 0 ? 1.0f / iscale : 0.0f;
    for (int j = 0; j < QK_K; ++j) b[i].qs[j] = int8_t(clamp_int(nearest_int(iscale * x[j]), -128, 127));
    for (int s = 0; s < QK_K / 16; ++s) {
      int sum = 0;
      for (int j = 0; j < 16; ++j) sum += b[i].qs[16 * s + j];
      b[i].bsums[s] = int16_t(sum);
    }
  }
}

template <typename Block>
Block* blocks_of(void* dst) {
  return static_cast<Block*>(dst);
}

}  // namespace

bool can_quantize(GgmlType t) {
  switch (t) {
    case GgmlType::F32: case GgmlType::F16: case GgmlType::BF16: case GgmlType::Q8_0:
    case GgmlType::Q4_0: case GgmlType::Q4_1: case GgmlType::Q5_0: case GgmlType::Q5_1:
    case GgmlType::Q4_K: case GgmlType::Q5_K: case GgmlType::Q6_K: case GgmlType::Q8_K:
      return true;
    default:
      return false;
  }
}

size_t quantize_row(GgmlType t, const float* src, void* dst, int64_t n) {
  const TypeTraits tt = type_traits(t);
  if (!can_quantize(t)) fail("quantize: unsupported target type ", tt.name, " (id ", uint32_t(t), ")");
  if (n < 0 || n % tt.block_size != 0)
    fail("quantize: row of ", n, " elements is not a multiple of the ", tt.name, " block size ",
         tt.block_size);
  const int64_t nb = n / tt.block_size;
  switch (t) {
    case GgmlType::F32: std::memcpy(dst, src, size_t(n) * 4); break;
    case GgmlType::F16:
      for (int64_t i = 0; i < n; ++i) static_cast<uint16_t*>(dst)[i] = f32_to_f16(src[i]);
      break;
    case GgmlType::BF16:
      for (int64_t i = 0; i < n; ++i) static_cast<uint16_t*>(dst)[i] = f32_to_bf16(src[i]);
      break;
    case GgmlType::Q4_0: quantize_q4_0(src, blocks_of<BlockQ4_0>(dst), nb); break;
    case GgmlType::Q4_1: quantize_q4_1(src, blocks_of<BlockQ4_1>(dst), nb); break;
    case GgmlType::Q5_0: quantize_q5_0(src, blocks_of<BlockQ5_0>(dst), nb); break;
    case GgmlType::Q5_1: quantize_q5_1(src, blocks_of<BlockQ5_1>(dst), nb); break;
    case GgmlType::Q8_0: quantize_q8_0(src, blocks_of<BlockQ8_0>(dst), nb); break;
    case GgmlType::Q4_K: quantize_k_scale_min(src, blocks_of<BlockQ4_K>(dst), nb, 15, -6, 6); break;
    case GgmlType::Q5_K: quantize_k_scale_min(src, blocks_of<BlockQ5_K>(dst), nb, 31, -5, 10); break;
    case GgmlType::Q6_K: quantize_q6_K(src, blocks_of<BlockQ6_K>(dst), nb); break;
    case GgmlType::Q8_K: quantize_q8_K(src, blocks_of<BlockQ8_K>(dst), nb); break;
    default: break;
  }
  return row_bytes(t, n);
}

}  // namespace minfer
