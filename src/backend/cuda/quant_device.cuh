// Device-side bodies shared by several kernels: the q8 plane's quantize of one 32-block (used by the
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
// Words of a 2-byte-aligned run, assembled from aligned loads: one word more than the run, which
// may lie up to 4 bytes past its end. REQUIRES: a buffer read this way keeps that word allocated
// (kWeightsTailBytes after its last matrix: the weights arena's tail).
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

// Byte `byte` (0..3) of w as a sign-extended int: one prmt (in its default mode a selector nibble
// with bit 3 set replicates the sign of the byte it names; __byte_perm drops that bit).
__device__ __forceinline__ int sext_byte(uint32_t w, int byte) {
  const uint32_t sign = 8u | uint32_t(byte);
  int v;
  asm("prmt.b32 %0, %1, 0, %2;" : "=r"(v) : "r"(w), "r"(uint32_t(byte) | sign << 4 | sign << 8 | sign << 12));
  return v;
}

// Four q6_K quants minus 32 as int8, one a byte: the low 4 bits from `low` >> lshift, the high 2
// from `high` >> hshift. Bit 7 of every byte is set before 32 is subtracted, so no byte borrows
// from its neighbour, and cleared after; one instruction fewer than __vsub4's three.
__device__ __forceinline__ uint32_t q6k_quants_s8(uint32_t low, uint32_t high, int lshift, int hshift) {
  const uint32_t biased = ((low >> lshift) & 0x0F0F0F0Fu) | ((((high >> hshift) & 0x03030303u) << 4) | 0x80808080u);
  return (biased - 0x20202020u) ^ 0x80808080u;
}

// The q8 plane's quantize of one 32-block (kernels.h: Q8Plane). The 8 blocks of a 256-column
// group share one scale, so 8 lanes quantize a group together: lanes 8i..8i+7 of the warp hold
// blocks 8g..8g+7 of one group; a lane whose block lies past the row passes valid = false (it
// loads and writes nothing). Same rule as quantize_row_pad40_grouped on the CPU: amax is exact in
// any order, rintf and the clamp are per element, so every quant, sum and scale matches.
// REQUIRES: all 32 lanes of the warp call it together (the group's amax is shuffled).
// The block's 32 values in registers (zeros where !valid); (t, b) = its token and block.
__device__ __forceinline__ void quantize_q8_group_values(const float4 (&v)[8], const Q8Plane& plane, int t, int b,
                                                         bool valid) {
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < 8; ++i)
    amax = fmaxf(amax, fmaxf(fmaxf(fabsf(v[i].x), fabsf(v[i].y)),
                             fmaxf(fabsf(v[i].z), fabsf(v[i].w))));
#pragma unroll
  for (int o = 1; o < 8; o <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  if (!valid) return;
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
  uint4* qs = reinterpret_cast<uint4*>(plane.block_quants(t, b));
  qs[0] = make_uint4(packed[0], packed[1], packed[2], packed[3]);
  qs[1] = make_uint4(packed[4], packed[5], packed[6], packed[7]);
  plane.set_sum(t, b, sum);
  if (b % 8 == 0) *plane.scale(t, b / 8) = f2h(d);
}
// The block's values read from src (32 floats, 16-byte aligned).
__device__ __forceinline__ void quantize_q8_group_member(const float* __restrict__ src, const Q8Plane& plane, int t,
                                                         int b, bool valid) {
  float4 v[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) v[i] = valid ? reinterpret_cast<const float4*>(src)[i] : make_float4(0, 0, 0, 0);
  quantize_q8_group_values(v, plane, t, b, valid);
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

// ---- the canonical order's terms ----------------------------------------------------------------
// One term per 256-column group of a weight row against one q8 plane row
// (quant/canonical_dot.h states the order on the CPU). Every float operation rounds explicitly
// (no contraction), so the two decode matmul kernels and the CPU statement produce the same bits.

// q4_K / q5_K: S = sum_j sc_j * isum_j and M = sum_j m_j * asum_j over the group's 8 sub-blocks
// (exact integers), d / dmin the super-block's scales, da the group's activation scale.
__device__ __forceinline__ float group_term_qk(float d, float dmin, int S, int M, float da) {
  return __fmul_rn(da, __fmaf_rn(d, __int2float_rn(S), -__fmul_rn(dmin, __int2float_rn(M))));
}
// q6_K: S = sum over the 16 halves of sc_h * isum_h.
__device__ __forceinline__ float group_term_q6k(float d, int S, float da) {
  return __fmul_rn(__fmul_rn(d, da), __int2float_rn(S));
}
// q8_0: one 32-block's term; a group adds its 8 with the canonical tree.
__device__ __forceinline__ float term_q8_0(float d, int isum, float da) {
  return __fmul_rn(__fmul_rn(d, da), __int2float_rn(isum));
}

// ---- dot-product units of the warp-per-row-pair kernel ------------------------------------------
// A row is cut into units of 64 columns, four per 256-column group. Lane l of a warp takes units
// l, l + 32, ...: lanes 4s..4s+3 hold the four units of one group, so lane quad s sums the groups
// of stream s. The k-quant units (kIntegerGroups) return the lane's share of the group's integer
// sums (S, M), which the quad adds exactly before one group_term; the 32-block units return the
// lane's share of the float tree over the group's eight block terms (pair_terms), which the quad
// finishes with two shuffles. A lane whose unit lies past the row passes valid = false.

struct GroupSums {
  int s = 0, m = 0;
};
// A k-quant unit's activations at one token: the 16 quant words its dot products read (four
// 16-byte runs of the plane), for q4_K / q5_K its two blocks' sums, and its group's scale.
struct ActChunk {
  uint32_t w[16];
  int sum[2];
  float da;
};

// Token t of a q8 plane, as the warp-per-row kernel's units read it.
struct ActRow {
  Q8Plane plane;
  int t;
  __device__ int word(int b, int k) const { return ld4(plane.block_quants(t, b) + 4 * k); }  // quants 4k..4k+3
  __device__ int sum(int b) const { return *plane.sum(t, b); }
  __device__ float group_scale(int g) const { return h2f(*plane.scale(t, g)); }
  __device__ float block_scale(int b) const { return group_scale(b / 8); }
};

// The 12 packed 6-bit scales and mins of a q4_K / q5_K block (the words after d and dmin) as four
// vectors of one byte a sub-block: what k_scale_min reads one at a time, for the tensor-core
// matmuls that unpack a group's scales at once.
struct KScaleBytes {
  uint32_t sc_lo, m_lo, sc_hi, m_hi;  // sc of sub-blocks 0-3, m 0-3, sc 4-7, m 4-7
};
__device__ __forceinline__ KScaleBytes unpack_k_scales(uint32_t s0, uint32_t s1, uint32_t s2) {
  return {s0 & 0x3F3F3F3Fu, s1 & 0x3F3F3F3Fu, (s2 & 0x0F0F0F0Fu) | ((s0 >> 2) & 0x30303030u),
          ((s2 >> 4) & 0x0F0F0F0Fu) | ((s1 >> 2) & 0x30303030u)};
}

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
  static constexpr bool kIntegerGroups = true;
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
  // Unit u's activations: blocks b0 = 8 (u / 4) + 2 (u % 4) and b0 + 1, and their sums.
  __device__ static ActChunk load_act(const ActRow& act, int u) {
    const int b0 = (u >> 2) * 8 + 2 * (u & 3);
    ActChunk a;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint4 v = ld16(act.plane.block_quants(act.t, b0 + i / 2) + 16 * (i % 2));
      a.w[4 * i] = v.x, a.w[4 * i + 1] = v.y, a.w[4 * i + 2] = v.z, a.w[4 * i + 3] = v.w;
    }
    const int2 sums = *reinterpret_cast<const int2*>(act.plane.sum(act.t, b0));  // b0 even, n_blocks % 8 == 0
    a.sum[0] = sums.x, a.sum[1] = sums.y;
    a.da = act.group_scale(u >> 2);
    return a;
  }
  // Sub-blocks 2c and 2c+1: sc * isum and m * asum of both.
  __device__ GroupSums group_sums(const ActChunk& a) const {
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
      s0 = __dp4a(int(lo), int(a.w[k]), s0);
      s1 = __dp4a(int(hi), int(a.w[8 + k]), s1);
    }
    // sub-blocks 2c, 2c + 1 are bytes 2(c % 2), 2(c % 2) + 1 of the low (c < 2) or high vectors
    const KScaleBytes k = unpack_k_scales(h.y, h.z, h.w);
    const uint32_t sc = c < 2 ? k.sc_lo : k.sc_hi, mn = c < 2 ? k.m_lo : k.m_hi;
    const int shift = 16 * (c & 1);
    GroupSums r;
    r.s = int((sc >> shift) & 0xFF) * s0 + int((sc >> (shift + 8)) & 0xFF) * s1;
    r.m = int((mn >> shift) & 0xFF) * a.sum[0] + int((mn >> (shift + 8)) & 0xFF) * a.sum[1];
    return r;
  }
  __device__ float group_term(GroupSums g, float da) const {
    return group_term_qk(h2f(uint16_t(h.x)), h2f(uint16_t(h.x >> 16)), g.s, g.m, da);
  }
};

// q6_K (blocks of kQ6KDeviceBlockBytes: ql[128], qh[64], int8 scales[16], f16 d): unit = (super-block, half n,
// 16-lane range lh): elements n*128 + 32g + 16lh + i for g = 0..3, i = 0..15, i.e. one 16-element
// half of sub-blocks 4n..4n+3, each with its own scale.
struct UnitQ6K {
  static constexpr bool kIntegerGroups = true;
  uint32_t A[4], B[4], H[4], sc[2];
  float d;
  int n, lh;
  __device__ void load(const DevMat& m, int row, int u) {
    const uint8_t* b =
        m.data + size_t(row) * size_t(q6k_device_row_bytes(m.cols / 256)) + size_t(u >> 2) * kQ6KDeviceBlockBytes;
    n = (u >> 1) & 1;
    lh = u & 1;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      A[k] = ldg_word(b + 64 * n + 16 * lh + 4 * k);
      B[k] = ldg_word(b + 64 * n + 32 + 16 * lh + 4 * k);
      H[k] = ldg_word(b + 128 + 32 * n + 16 * lh + 4 * k);
    }
    sc[0] = ldg_word(b + 192 + 8 * n);
    sc[1] = ldg_word(b + 196 + 8 * n);
    d = h2f(ld_u16(b + 208));
  }
  // Unit u's activations: words 4lh..4lh+3 of blocks 8 (u / 4) + 4n + g, g = 0..3.
  __device__ static ActChunk load_act(const ActRow& act, int u) {
    const int b = (u >> 2) * 8 + 4 * ((u >> 1) & 1);
    ActChunk a;
#pragma unroll
    for (int g = 0; g < 4; ++g) {
      const uint4 v = ld16(act.plane.block_quants(act.t, b + g) + 16 * (u & 1));
      a.w[4 * g] = v.x, a.w[4 * g + 1] = v.y, a.w[4 * g + 2] = v.z, a.w[4 * g + 3] = v.w;
    }
    a.da = act.group_scale(u >> 2);
    return a;
  }
  __device__ GroupSums group_sums(const ActChunk& a) const {
    GroupSums r;
#pragma unroll
    for (int g = 0; g < 4; ++g) {
      int s = 0;
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const uint32_t q = q6k_quants_s8((g & 1) ? B[k] : A[k], H[k], g < 2 ? 0 : 4, 2 * g);
        s = __dp4a(int(q), int(a.w[4 * g + k]), s);
      }
      // scale byte 8n + 2g + lh: sc[0] holds bytes 8n..8n+3, sc[1] 8n+4..8n+7
      r.s += sext_byte((g < 2) ? sc[0] : sc[1], 2 * (g & 1) + lh) * s;
    }
    return r;
  }
  __device__ float group_term(GroupSums g, float da) const { return group_term_q6k(d, g.s, da); }
};

// The 32-blocks ([f16 d][f16 m for _1][u32 qh for q5][qs]): unit = blocks 2u and 2u + 1 (either
// may lie past the row: its term is 0).
template <GgmlType T>
struct Unit32Pair {
  static constexpr bool kIntegerGroups = false;
  static constexpr bool kQ8 = T == GgmlType::Q8_0;
  static constexpr bool kQ5 = T == GgmlType::Q5_0 || T == GgmlType::Q5_1;
  static constexpr bool kMin = T == GgmlType::Q4_1 || T == GgmlType::Q5_1;
  static constexpr int kQsOffset = (kMin ? 4 : 2) + (kQ5 ? 4 : 0);
  struct Block {
    uint32_t q[kQ8 ? 8 : 4];
    uint32_t qh;
    float d, m;
  };
  Block blk[2];
  int n_valid;
  __device__ void load(const DevMat& mat, int row, int u) {
    const int nb = mat.cols / 32;
    n_valid = min(2, nb - 2 * u);
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      if (i >= n_valid) break;
      const uint8_t* b = mat.data + (size_t(row) * nb + 2 * u + i) * type_traits(T).type_size;
      ld_words_a2(b + kQsOffset, blk[i].q);
      if (kQ5) {
        uint32_t h[1];
        ld_words_a2(b + (kMin ? 4 : 2), h);
        blk[i].qh = h[0];
      }
      blk[i].d = h2f(ld_u16(b));
      if (kMin) blk[i].m = h2f(ld_u16(b + 2));
    }
  }
  __device__ static uint32_t spread4(uint32_t b) {  // 4 bits -> bit 4 of 4 bytes
    return ((b & 1) << 4) | ((b & 2) << 11) | ((b & 4) << 18) | ((b & 8) << 25);
  }
  __device__ static float term(const Block& w, const ActRow& a, int b) {
    int s = 0;
    if constexpr (kQ8) {
#pragma unroll
      for (int k = 0; k < 8; ++k) s = __dp4a(int(w.q[k]), a.word(b, k), s);
      return term_q8_0(w.d, s, a.block_scale(b));
    } else {
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        uint32_t lo = w.q[k] & 0x0F0F0F0Fu, hi = (w.q[k] >> 4) & 0x0F0F0F0Fu;
        if (kQ5) {
          lo |= spread4((w.qh >> (4 * k)) & 0xF);
          hi |= spread4((w.qh >> (16 + 4 * k)) & 0xF);
        }
        s = __dp4a(int(lo), a.word(b, k), s);
        s = __dp4a(int(hi), a.word(b, 4 + k), s);
      }
      const float da = a.block_scale(b), dd = __fmul_rn(w.d, da);
      if (kMin) return __fmaf_rn(dd, __int2float_rn(s), __fmul_rn(__fmul_rn(w.m, da), __int2float_rn(a.sum(b))));
      return __fmul_rn(dd, __int2float_rn(s - (kQ5 ? 16 : 8) * a.sum(b)));
    }
  }
  __device__ float pair_terms(const ActRow& act, int u, bool valid) const {
    if (!valid) return 0.0f;
    const float t0 = term(blk[0], act, 2 * u);
    const float t1 = n_valid > 1 ? term(blk[1], act, 2 * u + 1) : 0.0f;
    return __fadd_rn(t0, t1);
  }
};

// Float weights against f32 activations: unit = 8 elements (their own lane-strided order).
template <GgmlType T>
struct UnitFloat {
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

// The tree over the 8 streams: ((s0 + s4) + (s2 + s6)) + ((s1 + s5) + (s3 + s7)).
__device__ __forceinline__ float stream_tree(const float (&s)[8]) {
  return __fadd_rn(__fadd_rn(__fadd_rn(s[0], s[4]), __fadd_rn(s[2], s[6])),
                   __fadd_rn(__fadd_rn(s[1], s[5]), __fadd_rn(s[3], s[7])));
}

// ---- epilogue of the decode matmuls ---------------------------------------------------------------
// Rope pair p of a row of heads: rows (r0, r1) and frequency index j.
__device__ __forceinline__ void rope_pair_index(int p, int hd, bool neox, int& r0, int& r1, int& j) {
  const int half = hd / 2, head = p / half;
  j = p % half;
  if (neox) {
    r0 = head * hd + j;
    r1 = r0 + half;
  } else {
    r0 = head * hd + 2 * j;
    r1 = r0 + 1;
  }
}

__device__ __forceinline__ size_t kv_index(const KvLayer& kv, int r, int slot) {
  return size_t(slot) * kv.n_kv_heads * kv.head_dim + r;
}

// Output r (at out index o = t * ld_out + r) before its store: + bias, then + residual (the
// canonical order's last steps).
__device__ __forceinline__ float with_bias_residual(const MatSeg& seg, int r, size_t o, float v) {
  if (seg.bias) v = __fadd_rn(v, seg.bias[r]);
  if (seg.residual) v = __fadd_rn(v, seg.residual[o]);
  return v;
}

// The segment epilogue of one output pair (r0, r1) of token t: bias, residual, then the store
// (or rope, or KV cache write). v1 is ignored when !has_r1. Shared with the tensor-core kernel.
// Every operand is read before the first store and outside the branches on the epilogue, so that
// the reads are one round trip: a read after a store that may alias it waits for nothing but is
// issued only after the store, and the q/k/v launch ended on four round trips in a row (the bias,
// rope's position and frequency, the KV slot, the slot again after the first KV write;
// scripts/sass --chains). The same operations in the same order on the values.
__device__ __forceinline__ void store_pair(const MatSeg& seg, const MatVecExtra& extra, int t, int r0, int r1,
                                           int rope_j, bool has_r1, float v0, float v1) {
  const size_t o = size_t(t) * seg.ld_out;
  const bool roped = seg.epi == Epilogue::RopeQ || seg.epi == Epilogue::RopeK;
  const bool to_kv = seg.epi == Epilogue::RopeK || seg.epi == Epilogue::StoreV;
  const float bias0 = seg.bias ? seg.bias[r0] : 0.0f, bias1 = seg.bias && has_r1 ? seg.bias[r1] : 0.0f;
  const float residual0 = seg.residual ? seg.residual[o + r0] : 0.0f;
  const float residual1 = seg.residual && has_r1 ? seg.residual[o + r1] : 0.0f;
  const int pos = roped ? extra.positions[t] : 0, slot = to_kv ? extra.slots[t] : 0;
  const float inv_freq = roped ? extra.rope.inv_freq[rope_j] : 0.0f;
  if (seg.bias) v0 = __fadd_rn(v0, bias0), v1 = __fadd_rn(v1, bias1);
  if (seg.residual) v0 = __fadd_rn(v0, residual0), v1 = __fadd_rn(v1, residual1);
  switch (seg.epi) {
    case Epilogue::Store:
      seg.out[o + r0] = v0;
      if (has_r1) seg.out[o + r1] = v1;
      break;
    case Epilogue::RopeQ:
      rope_rotate(v0, v1, pos, inv_freq);
      seg.out[o + r0] = v0;
      seg.out[o + r1] = v1;
      break;
    case Epilogue::RopeK:
      rope_rotate(v0, v1, pos, inv_freq);
      extra.kv.k[kv_index(extra.kv, r0, slot)] = f2h(v0);
      extra.kv.k[kv_index(extra.kv, r1, slot)] = f2h(v1);
      break;
    case Epilogue::StoreV:
      extra.kv.v[kv_index(extra.kv, r0, slot)] = f2h(v0);
      if (has_r1) extra.kv.v[kv_index(extra.kv, r1, slot)] = f2h(v1);
      break;
  }
}

}  // namespace minfer::cuda
