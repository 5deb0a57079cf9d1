// Row dequantization for every supported type and the pad40 activation quantizer.
#include <algorithm>
#include <cmath>

#include "quant/quant.h"
#include "quant/unpack.h"
#include "util/error.h"
#include "util/half.h"

namespace minfer {
using namespace quant_detail;

namespace {

template <typename Block>
const Block* blocks_of(const void* src) {
  return static_cast<const Block*>(src);
}

void dequantize_q4_0(const BlockQ4_0* b, float* y, int64_t nb) {
  uint8_t q[QK];
  for (int64_t i = 0; i < nb; ++i, y += QK) {
    const float d = f16_to_f32(b[i].d);
    unpack_nibbles32(b[i].qs, q);
    for (int j = 0; j < QK; ++j) y[j] = d * float(q[j] - 8);
  }
}

void dequantize_q4_1(const BlockQ4_1* b, float* y, int64_t nb) {
  uint8_t q[QK];
  for (int64_t i = 0; i < nb; ++i, y += QK) {
    const float d = f16_to_f32(b[i].d), m = f16_to_f32(b[i].m);
    unpack_nibbles32(b[i].qs, q);
    for (int j = 0; j < QK; ++j) y[j] = d * float(q[j]) + m;
  }
}

void dequantize_q5_0(const BlockQ5_0* b, float* y, int64_t nb) {
  uint8_t q[QK];
  for (int64_t i = 0; i < nb; ++i, y += QK) {
    const float d = f16_to_f32(b[i].d);
    unpack_q5_32(b[i].qh, b[i].qs, q);
    for (int j = 0; j < QK; ++j) y[j] = d * float(q[j] - 16);
  }
}

void dequantize_q5_1(const BlockQ5_1* b, float* y, int64_t nb) {
  uint8_t q[QK];
  for (int64_t i = 0; i < nb; ++i, y += QK) {
    const float d = f16_to_f32(b[i].d), m = f16_to_f32(b[i].m);
    unpack_q5_32(b[i].qh, b[i].qs, q);
    for (int j = 0; j < QK; ++j) y[j] = d * float(q[j]) + m;
  }
}

void dequantize_q8_0(const BlockQ8_0* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += QK) {
    const float d = f16_to_f32(b[i].d);
    for (int j = 0; j < QK; ++j) y[j] = d * float(b[i].qs[j]);
  }
}

// q4_K and q5_K share everything but the group unpack.
template <typename Block, void (*unpack)(const Block&, int, uint8_t*)>
void dequantize_k_scale_min(const Block* b, float* y, int64_t nb) {
  uint8_t q[32];
  for (int64_t i = 0; i < nb; ++i) {
    const float d = f16_to_f32(b[i].d), dmin = f16_to_f32(b[i].dmin);
    for (int g = 0; g < 8; ++g, y += 32) {
      int sc, m;
      k_scale_min(b[i].scales, g, sc, m);
      const float dl = d * float(sc), ml = dmin * float(m);
      unpack(b[i], g, q);
      for (int l = 0; l < 32; ++l) y[l] = dl * float(q[l]) - ml;
    }
  }
}

void dequantize_q6_K(const BlockQ6_K* b, float* y, int64_t nb) {
  int8_t q[32];
  for (int64_t i = 0; i < nb; ++i) {
    const float d = f16_to_f32(b[i].d);
    for (int g = 0; g < 8; ++g, y += 32) {
      unpack_q6_K_group(b[i], g, q);
      for (int half = 0; half < 2; ++half) {
        const float dl = d * float(b[i].scales[q6_K_scale_index(g, half)]);
        for (int l = 16 * half; l < 16 * half + 16; ++l) y[l] = dl * float(q[l]);
      }
    }
  }
}

void dequantize_q2_K(const BlockQ2_K* b, float* y, int64_t nb) {
  uint8_t q[32];
  for (int64_t i = 0; i < nb; ++i) {
    const float d = f16_to_f32(b[i].d), dmin = f16_to_f32(b[i].dmin);
    for (int g = 0; g < 8; ++g, y += 32) {
      unpack_q2_K_group(b[i], g, q);
      for (int half = 0; half < 2; ++half) {
        const uint8_t sm = b[i].scales[2 * g + half];
        const float dl = d * float(sm & 0xF), ml = dmin * float(sm >> 4);
        for (int l = 16 * half; l < 16 * half + 16; ++l) y[l] = dl * float(q[l]) - ml;
      }
    }
  }
}

void dequantize_q3_K(const BlockQ3_K* b, float* y, int64_t nb) {
  int8_t q[32];
  for (int64_t i = 0; i < nb; ++i) {
    const float d = f16_to_f32(b[i].d);
    for (int g = 0; g < 8; ++g, y += 32) {
      unpack_q3_K_group(b[i], g, q);
      for (int half = 0; half < 2; ++half) {
        const float dl = d * float(q3_K_scale(b[i].scales, 2 * g + half));
        for (int l = 16 * half; l < 16 * half + 16; ++l) y[l] = dl * float(q[l]);
      }
    }
  }
}

void dequantize_q8_K(const BlockQ8_K* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += QK_K)
    for (int j = 0; j < QK_K; ++j) y[j] = b[i].d * float(b[i].qs[j]);
}

}  // namespace

bool can_dequantize(GgmlType t) {
  switch (t) {
    case GgmlType::F32: case GgmlType::F16: case GgmlType::BF16:
    case GgmlType::Q4_0: case GgmlType::Q4_1: case GgmlType::Q5_0: case GgmlType::Q5_1:
    case GgmlType::Q8_0: case GgmlType::Q2_K: case GgmlType::Q3_K: case GgmlType::Q4_K:
    case GgmlType::Q5_K: case GgmlType::Q6_K: case GgmlType::Q8_K:
      return true;
    default:
      return false;
  }
}

void dequantize_row(GgmlType t, const void* src, float* dst, int64_t n) {
  const TypeTraits tt = type_traits(t);
  if (!can_dequantize(t)) fail("dequantize: unsupported tensor type ", tt.name, " (id ", uint32_t(t), ")");
  if (n < 0 || n % tt.block_size != 0)
    fail("dequantize: row of ", n, " elements is not a multiple of the ", tt.name, " block size ",
         tt.block_size);
  const int64_t nb = n / tt.block_size;
  switch (t) {
    case GgmlType::F32: std::memcpy(dst, src, size_t(n) * 4); return;
    case GgmlType::F16: {
      const uint16_t* h = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_f32(h[i]);
      return;
    }
    case GgmlType::BF16: {
      const uint16_t* h = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(h[i]);
      return;
    }
    case GgmlType::Q4_0: return dequantize_q4_0(blocks_of<BlockQ4_0>(src), dst, nb);
    case GgmlType::Q4_1: return dequantize_q4_1(blocks_of<BlockQ4_1>(src), dst, nb);
    case GgmlType::Q5_0: return dequantize_q5_0(blocks_of<BlockQ5_0>(src), dst, nb);
    case GgmlType::Q5_1: return dequantize_q5_1(blocks_of<BlockQ5_1>(src), dst, nb);
    case GgmlType::Q8_0: return dequantize_q8_0(blocks_of<BlockQ8_0>(src), dst, nb);
    case GgmlType::Q2_K: return dequantize_q2_K(blocks_of<BlockQ2_K>(src), dst, nb);
    case GgmlType::Q3_K: return dequantize_q3_K(blocks_of<BlockQ3_K>(src), dst, nb);
    case GgmlType::Q4_K:
      return dequantize_k_scale_min<BlockQ4_K, unpack_q4_K_group>(blocks_of<BlockQ4_K>(src), dst, nb);
    case GgmlType::Q5_K:
      return dequantize_k_scale_min<BlockQ5_K, unpack_q5_K_group>(blocks_of<BlockQ5_K>(src), dst, nb);
    case GgmlType::Q6_K: return dequantize_q6_K(blocks_of<BlockQ6_K>(src), dst, nb);
    case GgmlType::Q8_K: return dequantize_q8_K(blocks_of<BlockQ8_K>(src), dst, nb);
    default: return;
  }
}

void dequantize_rows(GgmlType t, const void* src, float* dst, int64_t n_rows, int64_t n_cols) {
  const size_t stride = row_bytes(t, n_cols);
  for (int64_t r = 0; r < n_rows; ++r)
    dequantize_row(t, static_cast<const uint8_t*>(src) + size_t(r) * stride, dst + r * n_cols, n_cols);
}

namespace {

void quantize_pad40(const char* what, const float* src, BlockQ8Pad40* dst, int64_t n, int64_t blocks_per_scale) {
  if (n < 0 || n % QK != 0) fail(what, ": row of ", n, " elements is not a multiple of 32");
  const int64_t n_blocks = n / QK;
  for (int64_t first = 0; first < n_blocks; first += blocks_per_scale) {
    const int64_t last = std::min(n_blocks, first + blocks_per_scale);
    float amax = 0.0f;
    for (int64_t i = first * QK; i < last * QK; ++i) amax = std::fmax(amax, std::fabs(src[i]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    for (int64_t b = first; b < last; ++b) {
      int32_t sum = 0;
      for (int j = 0; j < QK; ++j) {
        int q = int(std::rint(src[b * QK + j] * id));
        q = q < -128 ? -128 : (q > 127 ? 127 : q);
        dst[b].qs[j] = int8_t(q);
        sum += q;
      }
      dst[b].d = f32_to_f16(d);
      dst[b].pad = 0;
      dst[b].sum = sum;
    }
  }
}

}  // namespace

void quantize_row_pad40(const float* src, BlockQ8Pad40* dst, int64_t n) {
  quantize_pad40("quantize_row_pad40", src, dst, n, 1);
}

void quantize_row_pad40_grouped(const float* src, BlockQ8Pad40* dst, int64_t n) {
  quantize_pad40("quantize_row_pad40_grouped", src, dst, n, 8);
}

void dequantize_row_pad40(const BlockQ8Pad40* src, float* dst, int64_t n) {
  if (n < 0 || n % QK != 0) fail("dequantize_row_pad40: row of ", n, " elements is not a multiple of 32");
  for (int64_t i = 0; i < n / QK; ++i, dst += QK) {
    const float d = f16_to_f32(src[i].d);
    for (int j = 0; j < QK; ++j) dst[j] = d * float(src[i].qs[j]);
  }
}

}  // namespace minfer
