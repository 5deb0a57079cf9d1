// Device-side bodies shared by several kernels: the pad40 quantize of one 32-block (used by the
// standalone quantize kernel AND the fused rms_norm / swiglu epilogues, so their bytes agree by
// construction) and the per-type dot-product units of the matrix-vector kernels.
#pragma once
#include <cuda_fp16.h>

#include <cstdint>

#include "backend/cuda/kernels.h"

namespace minfer::cuda {

__device__ __forceinline__ float h2f(uint16_t h) { return __half2float(__ushort_as_half(h)); }
__device__ __forceinline__ uint16_t f2h(float f) { return __half_as_ushort(__float2half_rn(f)); }
__device__ __forceinline__ float bf2f(uint16_t h) { return __uint_as_float(uint32_t(h) << 16); }

__device__ __forceinline__ uint4 ld16(const uint8_t* p) {
  return __ldg(reinterpret_cast<const uint4*>(p));
}
__device__ __forceinline__ int ld4(const uint8_t* p) { return *reinterpret_cast<const int*>(p); }
// Words of a 2-byte-aligned run, assembled from aligned loads (one extra word per run).
__device__ __forceinline__ uint32_t ldg_word(const uint8_t* p) {
  return __ldg(reinterpret_cast<const uint32_t*>(p));
}
template <int N>
__device__ __forceinline__ void ld_words_a2(const uint8_t* p, uint32_t (&w)[N]) {
  const uintptr_t addr = reinterpret_cast<uintptr_t>(p);
  const uint8_t* base = reinterpret_cast<const uint8_t*>(addr & ~uintptr_t(3));
  const uint32_t shift = uint32_t(addr & 3) * 8;
  uint32_t raw[N + 1];
#pragma unroll
  for (int i = 0; i <= N; ++i) raw[i] = ldg_word(base + 4 * i);
#pragma unroll
  for (int i = 0; i < N; ++i) w[i] = __funnelshift_r(raw[i], raw[i + 1], shift);
}
__device__ __forceinline__ uint16_t ld_u16(const uint8_t* p) {
  return __ldg(reinterpret_cast<const unsigned short*>(p));
}

// pad40 block: f16 d at 0, 2 pad bytes, 32 int8 at 4, int32 sum of the quants at 36.
// Same rule as quantize_row_pad40 on the CPU: amax is exact in any order, rintf and the clamp are
// per element, so every byte matches.
__device__ __forceinline__ void quantize_pad40_block(const float* __restrict__ src,
                                                     uint8_t* __restrict__ dst) {
  float4 v[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) v[i] = reinterpret_cast<const float4*>(src)[i];
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < 8; ++i)
    amax = fmaxf(amax, fmaxf(fmaxf(fabsf(v[i].x), fabsf(v[i].y)),
                             fmaxf(fabsf(v[i].z), fabsf(v[i].w))));
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  int sum = 0;
  uint32_t packed[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const float e[4] = {v[i].x, v[i].y, v[i].z, v[i].w};
    uint32_t p = 0;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int q = max(-128, min(127, __float2int_rn(rintf(__fmul_rn(e[j], id)))));
      p |= uint32_t(uint8_t(int8_t(q))) << (8 * j);
      sum += q;
    }
    packed[i] = p;
  }
  *reinterpret_cast<uint32_t*>(dst) = uint32_t(f2h(d));
  uint32_t* qs = reinterpret_cast<uint32_t*>(dst + 4);
#pragma unroll
  for (int i = 0; i < 8; ++i) qs[i] = packed[i];
  *reinterpret_cast<int*>(dst + 36) = sum;
}

// Rotation of one rope pair; explicit roundings so every kernel that ropes gets the same bits.
__device__ __forceinline__ void rope_rotate(float& x0, float& x1, int pos, float inv_freq) {
  float s, c;
  sincosf(__fmul_rn(float(pos), inv_freq), &s, &c);
  const float y0 = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
  const float y1 = __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c));
  x0 = y0;
  x1 = y1;
}

__device__ __forceinline__ float silu_mul(float g, float u) { return (g / (1.0f + expf(-g))) * u; }

// ---- dot-product units ------------------------------------------------------------------------
// Each weight type splits a row into "units" of 16-32 payload bytes; a lane loads one unit of
// weights once and dots it with NT token rows of activations. The per-row sum is over units in
// a fixed order (lane-strided, then a fixed shuffle tree), so every launch shape that uses these
// units gives the same bits for a row.

struct ActQ8 {  // one pad40 block
  const uint8_t* p;
  __device__ float d() const { return h2f(*reinterpret_cast<const uint16_t*>(p)); }
  __device__ int sum() const { return *reinterpret_cast<const int*>(p + 36); }
  __device__ int w(int k) const { return ld4(p + 4 + 4 * k); }
};

__device__ __forceinline__ void k_scale_min(uint4 h, int j, int& sc, int& m) {
  // h.y = scales bytes 0-3, h.z = bytes 4-7, h.w = bytes 8-11
  if (j < 4) {
    sc = (h.y >> (8 * j)) & 63;
    m = (h.z >> (8 * j)) & 63;
  } else {
    const int s = 8 * (j - 4);
    sc = ((h.w >> s) & 0xF) | (((h.y >> s) >> 6 & 3) << 4);
    m = ((h.w >> s) >> 4 & 0xF) | (((h.z >> s) >> 6 & 3) << 4);
  }
}

// q4_K / q5_K: unit = (super-block, chunk c of 64 elements = sub-blocks 2c and 2c+1).
template <bool Q5>
struct UnitQK45 {
  static constexpr int kPerBlock = 4;
  uint4 h, q0, q1, qh0, qh1;
  int c;
  __device__ void load(const DevMat& m, int row, int u) {
    const int nsb = m.cols / 256, sb = u >> 2;
    c = u & 3;
    const uint8_t* b = m.data + (size_t(row) * nsb + sb) * (Q5 ? 176 : 144);
    h = ld16(b);
    const uint8_t* qs = b + (Q5 ? 48 : 16) + 32 * c;
    q0 = ld16(qs);
    q1 = ld16(qs + 16);
    if (Q5) {
      qh0 = ld16(b + 16);
      qh1 = ld16(b + 32);
    }
  }
  __device__ float dot(const uint8_t* act, int u) const {
    const int sb = u >> 2;
    const ActQ8 a0{act + size_t(sb * 8 + 2 * c) * kPad40Bytes};
    const ActQ8 a1{act + size_t(sb * 8 + 2 * c + 1) * kPad40Bytes};
    const uint32_t w[8] = {q0.x, q0.y, q0.z, q0.w, q1.x, q1.y, q1.z, q1.w};
    const uint32_t hb[8] = {qh0.x, qh0.y, qh0.z, qh0.w, qh1.x, qh1.y, qh1.z, qh1.w};
    int s0 = 0, s1 = 0;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      uint32_t lo = w[k] & 0x0F0F0F0Fu, hi = (w[k] >> 4) & 0x0F0F0F0Fu;
      if (Q5) {
        lo |= ((hb[k] >> (2 * c)) & 0x01010101u) << 4;
        hi |= ((hb[k] >> (2 * c + 1)) & 0x01010101u) << 4;
      }
      s0 = __dp4a(int(lo), a0.w(k), s0);
      s1 = __dp4a(int(hi), a1.w(k), s1);
    }
    int sc0, m0, sc1, m1;
    k_scale_min(h, 2 * c, sc0, m0);
    k_scale_min(h, 2 * c + 1, sc1, m1);
    const float d = h2f(uint16_t(h.x)), dmin = h2f(uint16_t(h.x >> 16));
    const float da0 = a0.d(), da1 = a1.d();
    return d * (float(sc0 * s0) * da0 + float(sc1 * s1) * da1) -
           dmin * (float(m0 * a0.sum()) * da0 + float(m1 * a1.sum()) * da1);
  }
};

// q6_K (210-byte blocks: ql[128], qh[64], int8 scales[16], f16 d): unit = (super-block, half n,
// 16-lane range lh): 64 elements n*128 + 32g + 16lh + i for g = 0..3, i = 0..15.
struct UnitQ6K {
  static constexpr int kPerBlock = 4;
  uint32_t A[4], B[4], H[4], sc[2];
  float d;
  int n, lh;
  __device__ void load(const DevMat& m, int row, int u) {
    const int nsb = m.cols / 256;
    const uint8_t* b = m.data + (size_t(row) * nsb + (u >> 2)) * 210;
    n = (u >> 1) & 1;
    lh = u & 1;
    ld_words_a2(b + 64 * n + 16 * lh, A);
    ld_words_a2(b + 64 * n + 32 + 16 * lh, B);
    ld_words_a2(b + 128 + 32 * n + 16 * lh, H);
    ld_words_a2(b + 192 + 8 * n, sc);
    d = h2f(ld_u16(b + 208));
  }
  __device__ float dot(const uint8_t* act, int u) const {
    const int sb = u >> 2;
    float total = 0.0f;
#pragma unroll
    for (int g = 0; g < 4; ++g) {
      const ActQ8 act_g{act + size_t(sb * 8 + 4 * n + g) * kPad40Bytes};
      int s = 0;
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const uint32_t lowsrc = (g & 1) ? B[k] : A[k];
        const uint32_t low = (g < 2) ? (lowsrc & 0x0F0F0F0Fu) : ((lowsrc >> 4) & 0x0F0F0F0Fu);
        const uint32_t q = low | (((H[k] >> (2 * g)) & 0x03030303u) << 4);
        s = __dp4a(int(__vsub4(q, 0x20202020u)), act_g.w(4 * lh + k), s);
      }
      // scale byte 8n + 2g + lh: sc[0] holds bytes 8n..8n+3, sc[1] 8n+4..8n+7
      const uint32_t word = (g < 2) ? sc[0] : sc[1];
      const int scale = int(int8_t(word >> (8 * (2 * (g & 1) + lh))));
      total += float(scale * s) * act_g.d();
    }
    return d * total;
  }
};

// 32-blocks ([f16 d][f16 m for _1][u32 qh for q5][qs]): unit = one block.
template <GgmlType T>
struct Unit32 {
  static constexpr int kPerBlock = 1;
  static constexpr bool kQ8 = T == GgmlType::Q8_0;
  static constexpr bool kQ5 = T == GgmlType::Q5_0 || T == GgmlType::Q5_1;
  static constexpr bool kMin = T == GgmlType::Q4_1 || T == GgmlType::Q5_1;
  static constexpr int kQsOffset = (kMin ? 4 : 2) + (kQ5 ? 4 : 0);
  uint32_t q[kQ8 ? 8 : 4];
  uint32_t qh;
  float d, m;
  __device__ void load(const DevMat& mat, int row, int u) {
    const uint8_t* b = mat.data + (size_t(row) * (mat.cols / 32) + u) * type_traits(T).type_size;
    ld_words_a2(b + kQsOffset, q);
    if (kQ5) {
      uint32_t h[1];
      ld_words_a2(b + (kMin ? 4 : 2), h);
      qh = h[0];
    }
    d = h2f(ld_u16(b));
    if (kMin) m = h2f(ld_u16(b + 2));
  }
  __device__ static uint32_t spread4(uint32_t b) {  // 4 bits -> bit 4 of 4 bytes
    return ((b & 1) << 4) | ((b & 2) << 11) | ((b & 4) << 18) | ((b & 8) << 25);
  }
  __device__ float dot(const uint8_t* act, int u) const {
    const ActQ8 a{act + size_t(u) * kPad40Bytes};
    int s = 0;
    if (kQ8) {
#pragma unroll
      for (int k = 0; k < 8; ++k) s = __dp4a(int(q[k]), a.w(k), s);
      return d * a.d() * float(s);
    }
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      uint32_t lo = q[k] & 0x0F0F0F0Fu, hi = (q[k] >> 4) & 0x0F0F0F0Fu;
      if (kQ5) {
        lo |= spread4((qh >> (4 * k)) & 0xF);
        hi |= spread4((qh >> (16 + 4 * k)) & 0xF);
      }
      s = __dp4a(int(lo), a.w(k), s);
      s = __dp4a(int(hi), a.w(4 + k), s);
    }
    if (kMin) return d * a.d() * float(s) + m * a.d() * float(a.sum());
    const int offset = kQ5 ? 16 : 8;
    return d * a.d() * float(s - offset * a.sum());
  }
};

// Float weights against f32 activations: unit = 8 elements.
template <GgmlType T>
struct UnitFloat {
  static constexpr int kPerBlock = 1;
  float w[8];
  int u;
  __device__ void load(const DevMat& m, int row, int unit) {
    u = unit;
    const size_t e = size_t(row) * m.cols + size_t(unit) * 8;
    if (T == GgmlType::F32) {
      const float4 a = __ldg(reinterpret_cast<const float4*>(m.data) + e / 4);
      const float4 b = __ldg(reinterpret_cast<const float4*>(m.data) + e / 4 + 1);
      w[0] = a.x; w[1] = a.y; w[2] = a.z; w[3] = a.w;
      w[4] = b.x; w[5] = b.y; w[6] = b.z; w[7] = b.w;
    } else {
      const uint4 v = ld16(m.data + e * 2);
      const uint32_t p[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        if (T == GgmlType::F16) {
          w[2 * i] = h2f(uint16_t(p[i]));
          w[2 * i + 1] = h2f(uint16_t(p[i] >> 16));
        } else {
          w[2 * i] = bf2f(uint16_t(p[i]));
          w[2 * i + 1] = bf2f(uint16_t(p[i] >> 16));
        }
      }
    }
  }
  __device__ float dot(const float* x) const {
    const float4 a = reinterpret_cast<const float4*>(x + size_t(u) * 8)[0];
    const float4 b = reinterpret_cast<const float4*>(x + size_t(u) * 8)[1];
    float s = w[0] * a.x;
    s = fmaf(w[1], a.y, s); s = fmaf(w[2], a.z, s); s = fmaf(w[3], a.w, s);
    s = fmaf(w[4], b.x, s); s = fmaf(w[5], b.y, s); s = fmaf(w[6], b.z, s);
    s = fmaf(w[7], b.w, s);
    return s;
  }
};

}  // namespace minfer::cuda
