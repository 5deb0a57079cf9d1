// The q4_K and q6_K decode matmuls for 33..64 tokens on warpgroup MMA (sm_90a), with the canonical
// order's bits (quant/canonical_dot.h): a group's S = sum_j sc_j * isum_j is an exact integer however
// it is summed, so the f16 tensor cores may form it from exact f16 integers while every partial sum
// stays below 2^24 (the f32 accumulator is then exact).
//
// B = the plane's int8 quants as f16 in the image `wgmma_operand` holds (operand_image.cuh: written
// by the plane's producer beside the plane, or else by this launch's build_operand_kernel; one
// group a bulk copy). A = the weights, built in registers. k order: a
// wgmma k16 step gives thread tig of a row the columns it holds at k = 2 tig, 2 tig + 1, 2 tig + 8,
// 2 tig + 9; the integer sum does not care which columns those are, so each type picks the ones
// its packing makes cheap and the image puts each activation where its weight lands (column_of).
//
// q4_K (Q4K below). A = q * sc (q <= 15, sc <= 63: <= 945) by one LOP3 and one HFMA2 a pair: a
// nibble under the f16 exponent of 1024 is 1024 + q (low nibble) or 1024 + 16 q (high nibble, no
// shift), and fma(x, sc, -1024 sc) or fma(x, sc / 16, -64 sc) leaves q * sc exactly. 128 columns
// give at most 128 * 945 * 127 < 2^24, so each half group has its own accumulator and float(S) is
// RN(S_0 + S_1), one f32 add (the int-to-float rounding of the canonical order). M = sum_j m_j
// asum_j comes from one mma.sync a token fragment on the digits asum = 64 h + l, A = (64 m_j, m_j).
// Then the term da * fma(d, S, -(dmin * M)) joins its stream. A thread's columns are the nibbles of
// its own 16-byte chunks of the block (chunk tig for steps 0..7, tig + 4 for 8..15).
//
// q6_K (Q6K below). (q - 32) * sc needs 13 bits, so sc = 16 hi + lo (lo 0..15, hi -8..7) gives two
// operands, (q - 32) lo (<= 480) and (q - 32) hi (<= 256), each exact over a whole group
// (256 * 480 * 127 < 2^24) in an accumulator of its own, and float(S) = fma(16, S_hi, S_lo), one
// rounding of the exact S; no M term; the term (d * da) * S. A pair is two 6-bit quants under the
// exponent of 1024 (one PRMT from a word of clean bytes) and fma(x, lo, -1056 lo) = (q - 32) lo.
// Thread tig takes the 64 columns of half n = tig / 2, l in [16 is, 16 is + 16) (is = tig % 2):
// one 16-byte chunk of qh, two of ql, four sub-blocks; step s takes sub-block j = s / 4, word s % 4.
// A row is G 212-byte device blocks padded to 16 bytes (q6k_device_row_bytes), so a stage is one
// box of 224 bytes x the CTA's 128 rows from the 16-byte boundary at or below group g's block (a
// tensor copy's inner start must be 16-byte aligned; the block then starts 0, 4, 8 or 12 bytes in,
// the same in every row, read by words); fragment rows sit 224 bytes apart.
//
// CTA. Two warpgroups, 64 rows each, all 64 tokens (wgmma m64n64k16, 16 steps a group). The
// weights and the group's operand image go through a ring of stages; the last warp to finish with
// a stage refills it. Streams are visited in the order the canonical tree meets them (0, 4, 2, 6,
// 1, 5, 3, 7), so a thread keeps one open stream and its subtree's running value in registers and
// at most two finished streams in shared memory. Where the row tiles would not fill the card, a
// cluster of kSplit CTAs takes one tile, each a run of that order (a subtree), and rank q adds a
// 1/kSplit share of the outputs from all ranks' partials through distributed shared memory in the
// same balanced tree. The epilogue is the decode matmul's (bias, residual, store).
#include <cooperative_groups.h>

#include "backend/cuda/kernels.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/operand_image.cuh"
#include "backend/cuda/prefill_mma.cuh"
#include "backend/cuda/quant_device.cuh"
#include "util/error.h"

namespace minfer::cuda {
namespace {

using namespace prefill_detail;
using namespace operand_image;

constexpr int kThreads = 256, kRowsCta = 128;

// Streams in the order the canonical tree ((0 + 4) + (2 + 6)) + ((1 + 5) + (3 + 7)) meets them.
__constant__ int kStreamOrder[8] = {0, 4, 2, 6, 1, 5, 3, 7};

struct WeightMaps {
  CUtensorMap map[kMaxMatSegs];
};
struct WgmmaArgs {
  MatSeg seg[kMaxMatSegs];
  int first_tile[kMaxMatSegs + 1];
  int n_segs;
  int n_tokens, groups;
  const uint8_t* image;
};

// ---- device helpers --------------------------------------------------------------------------
// d (64 x 64 f32, the mma.m16n8 layout per warp) = [d +] A (registers) x B (K-major descriptor).
__device__ __forceinline__ void wgmma_f16_rs(float (&d)[32], const uint32_t (&a)[4], uint64_t desc_b, int accumulate) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, "
      "%23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate));
#endif
}
// L2 policies (prefill_mma.cuh): the weights pass through once (evict first); a group's operand
// image is read by every row tile (evict last), so the weights streaming past do not push it out
// to memory (+0.9 % at x64 depth 70, +1.3 % at depth 0: docs/perf.md, twenty-third session, run 5).
__device__ __forceinline__ float lds_f32(uint32_t a) {
  float v;
  asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(v) : "r"(a));
  return v;
}
__device__ __forceinline__ void sts_f32(uint32_t a, float v) {
  asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(a), "f"(v));
}
// (w & kMask) | magic in one LOP3 (with both constants immediate, ptxas emits two).
template <uint32_t kMask>
__device__ __forceinline__ uint32_t and_or(uint32_t w, uint32_t magic) {
  uint32_t r;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;\n" : "=r"(r) : "r"(w), "n"(kMask), "r"(magic));
  return r;
}
// The decode matmul's Store epilogue: store_pair's bias and residual and its store, without its
// rope and KV cases (their sin / cos would cost this kernel registers and local memory).
__device__ __forceinline__ void store_output(const MatSeg& seg, int t, int r, float v) {
  const size_t o = size_t(t) * seg.ld_out + r;
  seg.out[o] = with_bias_residual(seg, r, o, v);
}
__device__ __forceinline__ uint32_t h2u(__half2 h) { return *reinterpret_cast<uint32_t*>(&h); }
__device__ __forceinline__ __half2 u2h(uint32_t u) { return *reinterpret_cast<__half2*>(&u); }
// (x, x) for an f16 bit pattern x: constants without a conversion in the loop.
__device__ __forceinline__ __half2 splat(uint16_t bits) { return u2h(uint32_t(bits) * 0x10001u); }
constexpr uint16_t kHalf1024 = 0x6400, kHalf1032 = 0x6408, kHalfMinus1024 = 0xE400, kHalfMinus1056 = 0xE420,
                   kHalfMinus64 = 0xD400, kHalf64 = 0x5400, kHalfSixteenth = 0x2C00;
__device__ __forceinline__ uint32_t word_of(const uint4& q, int w) {
  return w == 0 ? q.x : w == 1 ? q.y : w == 2 ? q.z : q.w;
}
// (1024 + x, 1024 + x) for byte b of w, exact f16 integers: one PRMT under the exponent of 1024.
__device__ __forceinline__ __half2 splat_byte_1024(uint32_t w, uint32_t b) {
  return u2h(__byte_perm(w, 0x64u, b | 0x40u | (b << 8) | 0x4000u));
}

// ---- the weight formats ----------------------------------------------------------------------
// What the kernel asks of a format: kType; kRowBytes, a row's bytes a group in a stage;
// kCopyBytes, the bytes of a group's operand image it reads; column_of(s, kappa), the group column
// k position kappa of step s stands for; weight_map (host) and load (a stage's TMA copy of its
// 128 rows); accumulate, a group's terms into the thread's 32 open
// outputs (rows rr0 and rr0 + 8, tokens 8 j + 2 tig + {0, 1}: the m64n64 fragment) from the stage
// at `base` with its weights at `weights`.

// A 2-D byte tensor of outer x inner bytes (rows inner bytes apart), read in boxes.
CUtensorMap byte_map(const DevMat& m, int64_t inner, int64_t outer, uint32_t box_inner, uint32_t box_outer) {
  return tensor_map_2d("decode matmul (wgmma)", "MINFER_NO_DECODE_WGMMA", CU_TENSOR_MAP_DATA_TYPE_UINT8, m.data,
                       uint64_t(inner), uint64_t(outer), uint64_t(inner), box_inner, box_outer);
}

struct Q4K : Q4KColumns {
  static constexpr OperandFormat kFormat = OperandFormat::Q4K;
  static constexpr int kBlockBytes = 144, kRowBytes = kBlockBytes, kCopyBytes = kImageBytes;
  // rows x row bytes, boxes of one block x 128 rows.
  static CUtensorMap weight_map(const DevMat& m) {
    return byte_map(m, int64_t(m.cols / 256) * kBlockBytes, m.rows, kBlockBytes, kRowsCta);
  }
  __device__ static void load(uint32_t dst, const CUtensorMap* map, int g, int row0, uint32_t bar,
                              uint64_t policy) {
    tma_load_2d(dst, map, g * kBlockBytes, row0, bar, policy);
  }
  __device__ static void accumulate(uint32_t base, uint32_t weights, int g, int rr0, int gq, int tig,
                                    float (&open)[32]);
};

struct Q6K : Q6KColumns {
  static constexpr OperandFormat kFormat = OperandFormat::Q6K;
  static constexpr int kBlockBytes = kQ6KDeviceBlockBytes, kRowBytes = 224, kCopyBytes = kDigitsOffset;
  static_assert(kRowBytes >= kBlockBytes + 12 && kRowBytes % 16 == 0, "TMA boxes, lead <= 12");
  // rows x row bytes, boxes of 224 bytes x 128 rows.
  static CUtensorMap weight_map(const DevMat& m) {
    return byte_map(m, q6k_device_row_bytes(m.cols / 256), m.rows, kRowBytes, kRowsCta);
  }
  // How far block g starts past the 16-byte boundary a box starts at (every row 16-byte aligned).
  __device__ static int lead(int g) { return g * kBlockBytes & 15; }
  __device__ static void load(uint32_t dst, const CUtensorMap* map, int g, int row0, uint32_t bar,
                              uint64_t policy) {
    tma_load_2d(dst, map, g * kBlockBytes - lead(g), row0, bar, policy);
  }
  __device__ static void accumulate(uint32_t base, uint32_t weights, int g, int rr0, int gq, int tig,
                                    float (&open)[32]);
};

__device__ __forceinline__ void Q4K::accumulate(uint32_t base, uint32_t weights, int /*g*/, int rr0,
                                                int gq, int tig, float (&open)[32]) {
  const uint32_t first_byte = 2 * (tig / 2);  // the thread's first sub-block in a 4-byte scale vector
  uint32_t magic = 0x64006400u;
  asm volatile("" : "+r"(magic));  // a register, so the LOP3's immediate can be the mask
  uint4 head[2], chunk_a[2], chunk_b[2];  // per row: d, dmin, scales; the chunks tig and tig + 4 of qs
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const uint32_t row = weights + (rr0 + 8 * r) * kBlockBytes;
    head[r] = lds128(row);
    chunk_a[r] = lds128(row + 16 + 16 * tig);
    chunk_b[r] = lds128(row + 16 + 16 * (tig + 4));
  }
  // [row][chunk][nibble]: (sc, -1024 sc) for low nibbles, (sc / 16, -64 sc) for high ones.
  uint32_t mul[2][2][2], add[2][2][2], m_lo[2], m_hi[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const KScaleBytes k = unpack_k_scales(head[r].y, head[r].z, head[r].w);
    m_lo[r] = k.m_lo;
    m_hi[r] = k.m_hi;
#pragma unroll
    for (int c = 0; c < 2; ++c)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint32_t b = first_byte + h;
        const __half2 sc = __hsub2(splat_byte_1024(c ? k.sc_hi : k.sc_lo, b), splat(kHalf1024));
        mul[r][c][h] = h2u(h ? __hmul2(sc, splat(kHalfSixteenth)) : sc);
        add[r][c][h] = h2u(__hmul2(sc, splat(h ? kHalfMinus64 : kHalfMinus1024)));
      }
  }
  const uint64_t desc0 = sw128_descriptor(base);  // REQUIRES base < 256 KB: k offsets add to the address field
  float acc0[32], acc1[32];
  uint32_t A[16][4];
#pragma unroll
  for (int s = 0; s < 16; ++s) {
    const int c = s >> 3, word = (s >> 1) & 3, h = s & 1;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const uint32_t W = word_of(c ? chunk_b[r] : chunk_a[r], word), W8 = W >> 8;
      const uint32_t lo = h ? and_or<0x00F000F0u>(W, magic) : and_or<0x000F000Fu>(W, magic);
      const uint32_t hi = h ? and_or<0x00F000F0u>(W8, magic) : and_or<0x000F000Fu>(W8, magic);
      A[s][r] = h2u(__hfma2(u2h(lo), u2h(mul[r][c][h]), u2h(add[r][c][h])));
      A[s][2 + r] = h2u(__hfma2(u2h(hi), u2h(mul[r][c][h]), u2h(add[r][c][h])));
    }
    if (s % 8 == 7) {  // a half group: 8 products into its own accumulator
      wgmma_fence();
#pragma unroll
      for (int t = s - 7; t <= s; ++t) {
        const uint64_t desc = desc0 + uint64_t(((t / 4) * kSlabBytes + (t % 4) * 32) >> 4);
        if (t < 8)
          wgmma_f16_rs(acc0, A[t], desc, t != 0);
        else
          wgmma_f16_rs(acc1, A[t], desc, t != 8);
      }
      wgmma_commit();
    }
  }
  // M's A fragment: k 0..7 = 64 m_k, 8..15 = m_k; the thread's k pair is (2 tig, 2 tig + 1).
  uint32_t am[4];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const uint32_t b = 2 * (tig & 1);
    const uint32_t x = __byte_perm(tig < 2 ? m_lo[r] : m_hi[r], 0x64u, b | 0x40u | ((b + 1) << 8) | 0x4000u);
    const __half2 m = __hsub2(u2h(x), splat(kHalf1024));
    am[r] = h2u(__hmul2(m, splat(kHalf64)));
    am[2 + r] = h2u(m);
  }
  float d[2], dmin[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float2 f = __half22float2(u2h(head[r].x));
    d[r] = f.x, dmin[r] = f.y;
  }
  wgmma_wait<0>();
#pragma unroll
  for (int e = 0; e < 32; ++e) fence_operand(acc0[e]), fence_operand(acc1[e]);
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const uint2 digits = lds64(base + kDigitsOffset + ((8 * j + gq) * 4 + tig) * 8);
    const uint2 da = lds64(base + kScalesOffset + (8 * j + 2 * tig) * 4);
    float M[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    mma_f16(M, am, digits.x, digits.y);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = e >> 1;
      const float S = __fadd_rn(acc0[4 * j + e], acc1[4 * j + e]);
      const float f = __fmaf_rn(d[r], S, -__fmul_rn(dmin[r], M[e]));
      open[4 * j + e] = __fadd_rn(open[4 * j + e], __fmul_rn(__uint_as_float(e & 1 ? da.y : da.x), f));
    }
  }
}

__device__ __forceinline__ void Q6K::accumulate(uint32_t base, uint32_t weights, int g, int rr0,
                                                int /*gq*/, int tig, float (&open)[32]) {
  const int n = tig / 2, is = tig % 2;
  const int lead = Q6K::lead(g);  // 0, 4, 8 or 12 bytes: word loads
  uint32_t row[2], lo4[2], hi4[2], qh[2][4];
  float d[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    row[r] = weights + (rr0 + 8 * r) * kRowBytes + lead;
    const uint32_t sc_lo = lds32(row[r] + 192 + 8 * n), sc_hi = lds32(row[r] + 196 + 8 * n);
    // byte j: the scale of sub-block j (scale is + 2 j of the half)
    const uint32_t s4 = __byte_perm(sc_lo, sc_hi, is ? 0x7531u : 0x6420u);
    lo4[r] = s4 & 0x0F0F0F0Fu;
    hi4[r] = ((s4 >> 4) & 0x0F0F0F0Fu) ^ 0x08080808u;  // hi + 8
    d[r] = __low2float(u2h(lds32(row[r] + 208)));
#pragma unroll
    for (int w = 0; w < 4; ++w) qh[r][w] = lds32(row[r] + 128 + 16 * (2 * n + is) + 4 * w);  // qh[32 n + 16 is ..]
  }
  const uint64_t desc0 = sw128_descriptor(base);  // REQUIRES base < 256 KB: k offsets add to the address field
  float acc_lo[32], acc_hi[32];
  uint32_t A[2][4][2][4];  // [buffer][word][lo, hi][fragment register]
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    uint32_t(&buf)[4][2][4] = A[j & 1];
    if (j >= 2) {
      wgmma_wait<1>();  // sub-block j - 2's products, which read this buffer, are done
#pragma unroll
      for (int w = 0; w < 4; ++w)
#pragma unroll
        for (int e = 0; e < 8; ++e) fence_operand(buf[w][e / 4][e % 4]);
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const __half2 lo = __hsub2(splat_byte_1024(lo4[r], j), splat(kHalf1024));
      const __half2 hi = __hsub2(splat_byte_1024(hi4[r], j), splat(kHalf1032));
      const __half2 add_lo = __hmul2(lo, splat(kHalfMinus1056)), add_hi = __hmul2(hi, splat(kHalfMinus1056));
      const uint32_t ql = row[r] + 16 * (4 * n + 2 * (j & 1) + is);  // ql[64 n + 32 (j & 1) + 16 is ..]
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        const uint32_t W = lds32(ql + 4 * w), H = qh[r][w];
        const uint32_t low = (j < 2 ? W : W >> 4) & 0x0F0F0F0Fu;
        const uint32_t top = (j == 0 ? H << 4 : j == 1 ? H << 2 : j == 2 ? H : H >> 2) & 0x30303030u;
        const uint32_t v = low | top;  // four 6-bit quants, one a byte
        const __half2 p02 = u2h(__byte_perm(v, 0x64u, 0x4240u)), p13 = u2h(__byte_perm(v, 0x64u, 0x4341u));
        buf[w][0][r] = h2u(__hfma2(p02, lo, add_lo));
        buf[w][0][2 + r] = h2u(__hfma2(p13, lo, add_lo));
        buf[w][1][r] = h2u(__hfma2(p02, hi, add_hi));
        buf[w][1][2 + r] = h2u(__hfma2(p13, hi, add_hi));
      }
    }
    wgmma_fence();
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      const uint64_t desc = desc0 + uint64_t((j * kSlabBytes + w * 32) >> 4);
      wgmma_f16_rs(acc_lo, buf[w][0], desc, j + w != 0);
      wgmma_f16_rs(acc_hi, buf[w][1], desc, j + w != 0);
    }
    wgmma_commit();
  }
  wgmma_wait<0>();
#pragma unroll
  for (int e = 0; e < 32; ++e) fence_operand(acc_lo[e]), fence_operand(acc_hi[e]);
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const uint2 da = lds64(base + kScalesOffset + (8 * j + 2 * tig) * 4);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float S = __fmaf_rn(16.0f, acc_hi[4 * j + e], acc_lo[4 * j + e]);
      const float dda = __fmul_rn(d[e >> 1], __uint_as_float(e & 1 ? da.y : da.x));
      open[4 * j + e] = __fadd_rn(open[4 * j + e], __fmul_rn(dda, S));
    }
  }
}

// ---- the operand image -----------------------------------------------------------------------
constexpr int kBuildTokens = 8, kBuildThreads = kBuildTokens * kSteps;
// REQUIRES: gridDim = (groups, kTokens / kBuildTokens), blockDim.x == kBuildThreads: a thread
// writes one wgmma step of one token (write_operand_step). Tokens past n_tokens are zeros.
template <class Columns>
__global__ void __launch_bounds__(kBuildThreads) build_operand_kernel(Q8Plane plane, int n_tokens, uint8_t* image) {
  const int g = blockIdx.x, n = blockIdx.y * kBuildTokens + threadIdx.x / kSteps, s = threadIdx.x % kSteps;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");  // the matmul's CTAs may start now
#endif
  write_operand_step<Columns>(plane, n, n < n_tokens, g, s, image);
}

void launch_builder(const Q8Plane& plane, int n_tokens, int groups, const OperandImage& image, cudaStream_t stream) {
  const dim3 grid(unsigned(groups), kTokens / kBuildTokens);
  if (image.format == OperandFormat::Q4K)
    build_operand_kernel<Q4KColumns><<<grid, kBuildThreads, 0, stream>>>(plane, n_tokens, image.image);
  else
    build_operand_kernel<Q6KColumns><<<grid, kBuildThreads, 0, stream>>>(plane, n_tokens, image.image);
}

// ---- the matmul ------------------------------------------------------------------------------
// The groups s, s + 8, ... of stream s.
__device__ __forceinline__ int stream_length(int s, int groups) { return s < groups ? (groups - s + 7) / 8 : 0; }

template <int kStreams>
__device__ __forceinline__ int group_at(int it, int rank, int groups) {
  for (int i = 0; i < kStreams; ++i) {
    const int s = kStreamOrder[rank * kStreams + i], n = stream_length(s, groups);
    if (it < n) return s + 8 * it;
    it -= n;
  }
  return -1;
}

// The CTA's shared memory: stages (the group's image, then its weights), the finished streams'
// slots, as many stages as fit up to 4.
template <class Fmt, int kSplit>
struct Shape {
  static constexpr int kStreams = 8 / kSplit;  // a CTA's run of kStreamOrder
  static constexpr int kSlots = kStreams == 8 ? 2 : kStreams == 4 ? 1 : 0;
  static constexpr int kWeightsOffset = Fmt::kCopyBytes, kWeightBytes = kRowsCta * Fmt::kRowBytes;
  static constexpr int kStageBytes = (kWeightsOffset + kWeightBytes + 1023) / 1024 * 1024;
  static constexpr int kSlotBytes = kThreads * 32 * 4;
  static constexpr int kFit = (232448 - 256 - 1024 - kSlots * kSlotBytes) / kStageBytes;  // - static, - alignment pad
  static constexpr int kStages = kFit < 4 ? kFit : 4;
  static constexpr int kSlotOffset = kStages * kStageBytes;
  static constexpr int kSmemBytes = kSlotOffset + kSlots * kSlotBytes + 1024;
  static_assert(kStages >= 2 && kWeightsOffset % 128 == 0, "a ring of stages; TMA destinations");
  static_assert(kStageBytes >= kRowsCta * kTokens * 4, "the cluster's partials reuse stage 0");
};

// REQUIRES: blockDim.x == kThreads; gridDim = (the segments' 128-row tiles, kSplit) in clusters of
// (1, kSplit); the segments' weights of Fmt's type with cols = 256 * groups;
// 1 <= n_tokens <= 64; the image in Fmt's k order of this plane's first n_tokens tokens (the
// builder's or the producer's, the same bytes; other token rows only reach outputs not stored);
// dynamic shared memory Shape<Fmt, kSplit>::kSmemBytes.
template <class Fmt, int kSplit>
__global__ void __launch_bounds__(kThreads, 1)
    matmul_wgmma_kernel(const __grid_constant__ WeightMaps maps, const __grid_constant__ WgmmaArgs a) {
  using Sh = Shape<Fmt, kSplit>;
  constexpr int kStages = Sh::kStages, kL = Sh::kStreams;
  extern __shared__ uint8_t raw[];
  __shared__ __align__(8) uint64_t full[kStages];
  __shared__ int released[kStages];
  const uint32_t base0 = shared_address(raw) + pad_to_1024(shared_address(raw));
  int seg = 0;
  while (seg + 1 < a.n_segs && int(blockIdx.x) >= a.first_tile[seg + 1]) ++seg;
  const int row0 = (int(blockIdx.x) - a.first_tile[seg]) * kRowsCta, rank = kSplit > 1 ? int(blockIdx.y) : 0;
  int n_iter = 0;
  for (int i = 0; i < kL; ++i) n_iter += stream_length(kStreamOrder[rank * kL + i], a.groups);
  const uint64_t keep = l2_policy_evict_last(), stream_by = l2_policy_evict_first();
  // A stage's copies of iteration it (group g): the weights (no earlier kernel writes them), then
  // its image.
  const auto issue_weights = [&](int it, int g) {
    const int st = it % kStages;
    const uint32_t bar = shared_address(&full[st]), dst = base0 + st * Sh::kStageBytes;
    mbarrier_expect_tx(bar, Fmt::kCopyBytes + Sh::kWeightBytes);
    mbarrier_arrive(bar);
    Fmt::load(dst + Sh::kWeightsOffset, &maps.map[seg], g, row0, bar, stream_by);
  };
  const auto issue_image = [&](int it, int g) {
    const int st = it % kStages;
    bulk_copy_to_shared(base0 + st * Sh::kStageBytes, a.image + size_t(g) * kImageBytes, Fmt::kCopyBytes,
                        shared_address(&full[st]), keep);
  };
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) mbarrier_init(shared_address(&full[s]), 1), released[s] = 0;
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  // Launched as the programmatic dependent of the builder or of the plane's producer
  // (launch_format): the first stages' weights stream in while it runs; the image, the residual
  // and the outputs wait for it.
  if (threadIdx.x == 0)
    for (int it = 0; it < kStages && it < n_iter; ++it) issue_weights(it, group_at<kL>(it, rank, a.groups));
  await_predecessor();
  if (threadIdx.x == 0)
    for (int it = 0; it < kStages && it < n_iter; ++it) issue_image(it, group_at<kL>(it, rank, a.groups));

  const int wg = threadIdx.x / 128, w = threadIdx.x / 32 % 4, lane = threadIdx.x % 32, gq = lane >> 2, tig = lane & 3;
  const int rr0 = wg * 64 + 16 * w + gq;  // the CTA rows of fragment rows g (rr0) and g + 8
  const uint32_t slot_base = base0 + Sh::kSlotOffset + threadIdx.x * 4;  // slot k, value e: + k * kSlotBytes + e * 1024
  float open[32], total[32];

  int it = 0;
#pragma unroll 1
  for (int i = 0; i < kL; ++i) {
#pragma unroll
    for (int e = 0; e < 32; ++e) open[e] = 0.0f;
#pragma unroll 1
    for (int g = kStreamOrder[rank * kL + i]; g < a.groups; g += 8, ++it) {
      const int st = it % kStages;
      mbarrier_wait(shared_address(&full[st]), (it / kStages) & 1);
      const uint32_t base = base0 + st * Sh::kStageBytes;
      Fmt::accumulate(base, base + Sh::kWeightsOffset, g, rr0, gq, tig, open);
      __syncwarp();
      // The stage's last reader refills it; its reset of the count reaches the next round's readers
      // through its mbarrier arrive (a release) and their wait.
      if (lane == 0 && shared_fetch_add_acq_rel(&released[st], 1) == kThreads / 32 - 1) {
        released[st] = 0;
        if (it + kStages < n_iter) {
          fence_proxy_async_shared();
          const int g_next = group_at<kL>(it + kStages, rank, a.groups);
          issue_weights(it + kStages, g_next);
          issue_image(it + kStages, g_next);
        }
      }
    }
    // The stream joins the CTA's subtree at position i of its run: one branch a stream.
    const uint32_t slot1 = slot_base, slot2 = slot_base + Sh::kSlotBytes;
    switch (i) {
      case 0:
#pragma unroll
        for (int e = 0; e < 32; ++e) total[e] = open[e];
        break;
      case 1:
#pragma unroll
        for (int e = 0; e < 32; ++e) total[e] = __fadd_rn(total[e], open[e]);
        break;
      case 2:
      case 4:
#pragma unroll
        for (int e = 0; e < 32; ++e) sts_f32(slot1 + e * 1024, open[e]);
        break;
      case 3:
#pragma unroll
        for (int e = 0; e < 32; ++e) total[e] = __fadd_rn(total[e], __fadd_rn(lds_f32(slot1 + e * 1024), open[e]));
        break;
      case 5:
#pragma unroll
        for (int e = 0; e < 32; ++e) sts_f32(slot1 + e * 1024, __fadd_rn(lds_f32(slot1 + e * 1024), open[e]));
        break;
      case 6:
#pragma unroll
        for (int e = 0; e < 32; ++e) sts_f32(slot2 + e * 1024, open[e]);
        break;
      default:
#pragma unroll
        for (int e = 0; e < 32; ++e)
          total[e] = __fadd_rn(total[e], __fadd_rn(lds_f32(slot1 + e * 1024),
                                                   __fadd_rn(lds_f32(slot2 + e * 1024), open[e])));
    }
  }
  const MatSeg& sg = a.seg[seg];
  if constexpr (kSplit == 1) {
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int row = row0 + rr0 + 8 * (e >> 1), n = 8 * j + 2 * tig + (e & 1);
        if (row < sg.w.rows && n < a.n_tokens) store_output(sg, n, row, total[4 * j + e]);
      }
  } else {
    // The partials [token][row] in stage 0 (every copy into it has been waited for), then rank q
    // adds rows [q * 128 / kSplit, ...) of every rank in the balanced tree.
    namespace cg = cooperative_groups;
    cg::cluster_group cluster = cg::this_cluster();
    float* part = reinterpret_cast<float*>(raw + pad_to_1024(shared_address(raw)));
    __syncthreads();  // every warp is past its last read of the stages
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) part[(8 * j + 2 * tig + (e & 1)) * kRowsCta + rr0 + 8 * (e >> 1)] = total[4 * j + e];
    cluster.sync();
    constexpr int kShare = kRowsCta / kSplit;
    const float* parts[kSplit];
#pragma unroll
    for (int q = 0; q < kSplit; ++q) parts[q] = cluster.map_shared_rank(part, q);
    for (int x = threadIdx.x; x < kShare * kTokens; x += kThreads) {
      const int local = rank * kShare + x % kShare, n = x / kShare, row = row0 + local;
      if (n >= a.n_tokens || row >= sg.w.rows) continue;
      float v[kSplit];
#pragma unroll
      for (int q = 0; q < kSplit; ++q) v[q] = parts[q][n * kRowsCta + local];
#pragma unroll
      for (int width = 1; width < kSplit; width *= 2)
#pragma unroll
        for (int q = 0; q + width < kSplit; q += 2 * width) v[q] = __fadd_rn(v[q], v[q + width]);
      store_output(sg, n, row, v[0]);
    }
    cluster.sync();  // no CTA leaves while another reads its shared memory
  }
}

template <class Fmt, int kSplit>
void launch_split(const WeightMaps& maps, const WgmmaArgs& a, int tiles, const KernelStream& s) {
  constexpr int smem = Shape<Fmt, kSplit>::kSmemBytes;
  reserve_dynamic_shared_memory(matmul_wgmma_kernel<Fmt, kSplit>, smem, "decode matmul (wgmma)");
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(unsigned(tiles), kSplit);
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s.stream;
  // After the builder or the image's producer with PDL (s.pdl_within); in clusters of (1, kSplit).
  const bool pdl = s.pdl_within;
  cudaLaunchAttribute attrs[2]{};
  attrs[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attrs[0].val.programmaticStreamSerializationAllowed = 1;
  attrs[1].id = cudaLaunchAttributeClusterDimension;
  attrs[1].val.clusterDim.x = 1, attrs[1].val.clusterDim.y = kSplit, attrs[1].val.clusterDim.z = 1;
  cfg.attrs = pdl ? attrs : attrs + 1;
  cfg.numAttrs = (pdl ? 1 : 0) + (kSplit > 1 ? 1 : 0);
  const cudaError_t e = cudaLaunchKernelEx(&cfg, matmul_wgmma_kernel<Fmt, kSplit>, maps, a);
  if (e != cudaSuccess) fail("decode matmul (wgmma): launch failed: ", cudaGetErrorString(e));
}

template <class Fmt>
void launch_format(const MatSeg* segs, int n_segs, const Q8Plane& act_q8, int n_tokens, const MatVecExtra& extra,
                   const KernelStream& s) {
  WeightMaps maps{};
  WgmmaArgs a{};
  int tiles = 0;
  for (int i = 0; i < n_segs; ++i) {
    maps.map[i] = Fmt::weight_map(segs[i].w);
    a.seg[i] = segs[i];
    a.first_tile[i] = tiles;
    tiles += (segs[i].w.rows + kRowsCta - 1) / kRowsCta;
  }
  a.first_tile[n_segs] = tiles;
  a.n_segs = n_segs;
  a.n_tokens = n_tokens;
  a.groups = segs[0].w.cols / 256;
  a.image = extra.wgmma_operand;
  if (extra.wgmma_operand_ready != Fmt::kFormat)
    launch_builder(act_q8, n_tokens, a.groups, {extra.wgmma_operand, Fmt::kFormat}, s.stream);
  // Split a tile's streams over a cluster where the tiles alone would leave most SMs idle
  // (7B: gate/up's 296 tiles run whole, the 28 tiles of a 3584-row matrix in clusters of 4).
  if (tiles >= 100)
    launch_split<Fmt, 1>(maps, a, tiles, s);
  else if (tiles >= 50)
    launch_split<Fmt, 2>(maps, a, tiles, s);
  else if (tiles >= 25)
    launch_split<Fmt, 4>(maps, a, tiles, s);
  else
    launch_split<Fmt, 8>(maps, a, tiles, s);
}

}  // namespace

int64_t wgmma_operand_bytes(int width) { return int64_t(width / 256) * kImageBytes; }

void check_operand_image(const char* writer, const OperandImage& image, int n_tokens, int width) {
  if (image.format == OperandFormat::None) return;
  if (!image.image || n_tokens < 1 || n_tokens > kTokens || width % 256 != 0)
    fail(writer, ": an operand image of ", n_tokens, " rows of ", width, " (1..", kTokens,
         " rows of whole 256-column groups)");
}

void launch_build_operand_image(const Q8Plane& plane, int n_tokens, int width, const OperandImage& image,
                                const KernelStream& s) {
  if (image.format == OperandFormat::None) fail("operand image: no format to build");
  check_operand_image("operand image", image, n_tokens, width);
  launch_builder(plane, n_tokens, width / 256, image, s.stream);
}

bool matmul_wgmma_takes(const MatSeg* segs, int n_segs, int n_tokens, const MatVecExtra& extra) {
  if (!extra.wgmma_operand || n_tokens < kWgmmaMinTokens || n_tokens > kTokens) return false;
  const GgmlType type = segs[0].w.type;
  if (type != GgmlType::Q4_K && type != GgmlType::Q6_K) return false;
  for (int i = 0; i < n_segs; ++i)
    if (segs[i].w.type != type || segs[i].epi != Epilogue::Store || segs[i].w.cols != segs[0].w.cols ||
        wgmma_operand_bytes(segs[i].w.cols) > extra.wgmma_operand_bytes)
      return false;
  return true;
}

void launch_matmul_wgmma(const MatSeg* segs, int n_segs, const Q8Plane& act_q8, int n_tokens, const MatVecExtra& extra,
                         const KernelStream& s) {
  if (!matmul_wgmma_takes(segs, n_segs, n_tokens, extra)) fail("decode matmul (wgmma): launch outside its conditions");
  if (segs[0].w.type == GgmlType::Q4_K)
    launch_format<Q4K>(segs, n_segs, act_q8, n_tokens, extra, s);
  else
    launch_format<Q6K>(segs, n_segs, act_q8, n_tokens, extra, s);
}

}  // namespace minfer::cuda
