// The operand image of the q4_K / q6_K decode matmul on warpgroup MMA (matmul_wgmma.cu): a q8
// plane's tokens as exact f16 integers in the k order the weight format's packing gives, one
// image of kImageBytes per 256-column group. A token's part of every group depends only on that
// token's plane row, so the plane's producer (rms_norm, swiglu) can write it beside the plane,
// and the matmul's own builder launch writes it from the plane otherwise: both call
// write_operand_step, so the bytes are the same by construction.
#pragma once
#include <cuda_fp16.h>

#include "backend/cuda/kernels.h"

namespace minfer::cuda::operand_image {

constexpr int kTokens = 64;
// A group's image: the B slabs (4 x 64 tokens x 128 bytes, 128-byte swizzle, the k order of the
// format's column_of), da as f32, then (q4_K only) the sum digits [token][tig][h pair, l pair] as f16.
constexpr int kSlabBytes = 8192, kScalesOffset = 4 * kSlabBytes, kDigitsOffset = kScalesOffset + kTokens * 4;
constexpr int kImageBytes = kDigitsOffset + kTokens * 4 * 8;  // 35,072
static_assert(kImageBytes % 16 == 0 && kDigitsOffset % 128 == 0, "bulk-copy sizes and TMA destinations");
// The 16 wgmma k16 steps of a group: the writers take them a step a thread.
constexpr int kSteps = 16;

// Position kappa of a wgmma k16 step: the thread it belongs to and its byte in the thread's
// 4-byte word (pairs (0, 2) for kappa < 8, (1, 3) after: one PRMT or LOP3 a pair).
__host__ __device__ constexpr int tig_of(int kappa) { return (kappa % 8) / 2; }
__host__ __device__ constexpr int byte_of(int kappa) { return kappa < 8 ? (kappa & 1 ? 2 : 0) : (kappa & 1 ? 3 : 1); }

// column_of(s, kappa): the group column that k position kappa of step s stands for.
// q4_K: a thread's columns are the nibbles of its own 16-byte chunks of the block (chunk tig for
// steps 0..7, tig + 4 for 8..15).
struct Q4KColumns {
  static constexpr GgmlType kType = GgmlType::Q4_K;
  __host__ __device__ static constexpr int column_of(int s, int kappa) {
    const int chunk = tig_of(kappa) + 4 * (s >> 3), word = (s >> 1) & 3, h = s & 1;
    const int b = 16 * chunk + 4 * word + byte_of(kappa);
    return 64 * (b / 32) + 32 * h + b % 32;
  }
};
// q6_K: thread tig takes the 64 columns of half n = tig / 2, l in [16 is, 16 is + 16) (is = tig % 2);
// step s takes sub-block j = s / 4, word s % 4.
struct Q6KColumns {
  static constexpr GgmlType kType = GgmlType::Q6_K;
  __host__ __device__ static constexpr int column_of(int s, int kappa) {
    const int tig = tig_of(kappa), n = tig / 2, is = tig % 2, j = s / 4, word = s % 4;
    return 128 * n + 32 * j + 16 * is + 4 * word + byte_of(kappa);
  }
};

// Token n's part of step s of group g's image from the plane (zeros where !real: tokens past the
// launch's). Step 4 also writes the token's da, steps 0..3 (q4_K) its sum digits of blocks 2s, 2s + 1.
template <class Columns>
__device__ __forceinline__ void write_operand_step(const Q8Plane& plane, int n, bool real, int g, int s,
                                                   uint8_t* image) {
  uint8_t* img = image + size_t(g) * kImageBytes;
  uint32_t packed[8];
#pragma unroll
  for (int kappa = 0; kappa < 16; kappa += 2) {
    float v[2] = {0.0f, 0.0f};
    if (real)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int col = Columns::column_of(s, kappa + e);
        v[e] = float(int8_t(plane.block_quants(n, 8 * g + col / 32)[col % 32]));
      }
    const __half2 h = __floats2half2_rn(v[0], v[1]);  // |v| <= 127: exact
    packed[kappa / 2] = *reinterpret_cast<const uint32_t*>(&h);
  }
  uint8_t* row = img + (s / 4) * kSlabBytes + n * 128;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int chunk = 2 * (s % 4) + half;
    *reinterpret_cast<uint4*>(row + (chunk ^ (n & 7)) * 16) =
        make_uint4(packed[4 * half], packed[4 * half + 1], packed[4 * half + 2], packed[4 * half + 3]);
  }
  if (s == 4) {
    const float da = real ? __half2float(__ushort_as_half(*plane.scale(n, g))) : 0.0f;
    reinterpret_cast<float*>(img + kScalesOffset)[n] = da;
  } else if (Columns::kType == GgmlType::Q4_K && s < 4) {
    float h[2] = {0.0f, 0.0f}, l[2] = {0.0f, 0.0f};
    if (real)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int32_t sum = *plane.sum(n, 8 * g + 2 * s + e);
        h[e] = float(sum >> 6), l[e] = float(sum & 63);  // sum = 64 h + l; |h| <= 64, exact in f16
      }
    const __half2 hh = __floats2half2_rn(h[0], h[1]), ll = __floats2half2_rn(l[0], l[1]);
    *reinterpret_cast<uint2*>(img + kDigitsOffset + (n * 4 + s) * 8) =
        make_uint2(*reinterpret_cast<const uint32_t*>(&hh), *reinterpret_cast<const uint32_t*>(&ll));
  }
}

// A producer's epilogue, by the eight lanes that quantized group g of token n (lane j of the group
// writes steps 2j and 2j + 1). REQUIRES: the group's plane row is written and visible to the
// calling lanes (__syncwarp after quantize_q8_group_values); n < kTokens.
__device__ __forceinline__ void write_operand_token(const OperandImage& target, const Q8Plane& plane, int n, int g,
                                                    int lane_in_group) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int s = 2 * lane_in_group + i;
    if (target.format == OperandFormat::Q4K)
      write_operand_step<Q4KColumns>(plane, n, true, g, s, target.image);
    else
      write_operand_step<Q6KColumns>(plane, n, true, g, s, target.image);
  }
}

}  // namespace minfer::cuda::operand_image
