// Element-level decoding of the GGUF block layouts, shared by dequantize and the dot kernels so
// both read the bits the same way. Every K super-block is viewed as 8 groups of 32 elements
// (group g = elements 32g .. 32g+31), which line up with the 32-element pad40 activation blocks.
#pragma once
#include <cstdint>
#include <cstring>

#include "quant/types.h"

namespace minfer::quant_detail {

// q4_0/q4_1: element j < 16 is the low nibble of qs[j], element j + 16 the high nibble.
inline void unpack_nibbles32(const uint8_t* qs, uint8_t* out) {
  for (int j = 0; j < 16; ++j) {
    out[j] = qs[j] & 0xF;
    out[j + 16] = qs[j] >> 4;
  }
}

// q5_0/q5_1: bit j of the little-endian 32-bit qh is bit 4 of element j.
inline void unpack_q5_32(const uint8_t* qh_bytes, const uint8_t* qs, uint8_t* out) {
  uint32_t qh;
  std::memcpy(&qh, qh_bytes, 4);
  for (int j = 0; j < 16; ++j) {
    out[j] = uint8_t((qs[j] & 0xF) | (((qh >> j) & 1) << 4));
    out[j + 16] = uint8_t((qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4));
  }
}

// q4_K/q5_K: 6-bit scale and min of sub-block j (0..7) from the 12 packed bytes. Bytes 0-3 hold
// scales 0-3 and bytes 4-7 mins 0-3 in their low 6 bits; bytes 8-11 hold the low 4 bits of scale
// (low nibble) and min (high nibble) 4-7, whose top 2 bits live in bits 6-7 of bytes 0-7.
inline void k_scale_min(const uint8_t* s, int j, int& scale, int& min) {
  if (j < 4) {
    scale = s[j] & 63;
    min = s[j + 4] & 63;
  } else {
    scale = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
    min = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// q4_K: group g uses the 32 bytes qs[32*(g/2)..]: low nibbles for even g, high for odd g.
inline void unpack_q4_K_group(const BlockQ4_K& b, int g, uint8_t* out) {
  const uint8_t* q = b.qs + 32 * (g / 2);
  const int shift = 4 * (g & 1);
  for (int l = 0; l < 32; ++l) out[l] = (q[l] >> shift) & 0xF;
}

// q5_K: as q4_K plus bit g of qh[l] as bit 4 of element l of group g.
inline void unpack_q5_K_group(const BlockQ5_K& b, int g, uint8_t* out) {
  const uint8_t* q = b.qs + 32 * (g / 2);
  const int shift = 4 * (g & 1);
  for (int l = 0; l < 32; ++l)
    out[l] = uint8_t(((q[l] >> shift) & 0xF) | (((b.qh[l] >> g) & 1) << 4));
}

// q6_K: two halves of 128; in half h, group k (0..3) takes the low (k < 2) or high (k >= 2) nibble
// of ql[64h + 32(k&1) + l] and bits 2k..2k+1 of qh[32h + l]. Values are q - 32 in [-32, 31];
// elements 0-15 use scales[8h + 2k], elements 16-31 scales[8h + 2k + 1].
inline void unpack_q6_K_group(const BlockQ6_K& b, int g, int8_t* out) {
  const int h = g / 4, k = g % 4;
  const uint8_t* ql = b.ql + 64 * h + 32 * (k & 1);
  const uint8_t* qh = b.qh + 32 * h;
  const int lshift = 4 * (k / 2), hshift = 2 * k;
  for (int l = 0; l < 32; ++l)
    out[l] = int8_t((((ql[l] >> lshift) & 0xF) | (((qh[l] >> hshift) & 3) << 4)) - 32);
}
inline int q6_K_scale_index(int g, int half16) { return 8 * (g / 4) + 2 * (g % 4) + half16; }

// q2_K: group g takes bits 2(g%4)..+1 of qs[32(g/4) + l]; scales[2g] (elements 0-15) and
// scales[2g+1] (16-31) hold the scale in the low nibble and the min in the high nibble.
inline void unpack_q2_K_group(const BlockQ2_K& b, int g, uint8_t* out) {
  const uint8_t* q = b.qs + 32 * (g / 4);
  const int shift = 2 * (g % 4);
  for (int l = 0; l < 32; ++l) out[l] = (q[l] >> shift) & 3;
}

// q3_K: low 2 bits as q2_K; bit g of hmask[l] set means +0, clear means -4. Values in [-4, 3].
inline void unpack_q3_K_group(const BlockQ3_K& b, int g, int8_t* out) {
  const uint8_t* q = b.qs + 32 * (g / 4);
  const int shift = 2 * (g % 4);
  for (int l = 0; l < 32; ++l)
    out[l] = int8_t(((q[l] >> shift) & 3) - (((b.hmask[l] >> g) & 1) ? 0 : 4));
}
// q3_K 6-bit scale i (0..15) minus 32: low 4 bits in the low (i < 8) or high (i >= 8) nibble of
// scales[i % 8], high 2 bits at bits 2(i/4).. of scales[8 + i%4].
inline int q3_K_scale(const uint8_t* s, int i) {
  const int low = i < 8 ? (s[i] & 0xF) : (s[i - 8] >> 4);
  const int high = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
  return (low | (high << 4)) - 32;
}

}  // namespace minfer::quant_detail
