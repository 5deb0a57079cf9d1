// Prefill GEMM: Y[m, n] = X[m, :] . W[n, :] (+ bias) (+ residual) with W in its GGUF layout.
// Each CTA dequantizes a 128-row (or, for small grids, 64- or 32-row) x 64-K slice of W per step
// into shared memory as bf16 (exact f32 dequantization, one rounding to bf16) and multiplies it
// with the bf16 activation tile of 64, 128 or (two warpgroups) 256 tokens, which arrives through a
// 3-stage cp.async pipeline: warpgroup MMA on sm_90 (issued before the next step's
// dequantization), mma.sync m16n8k16 elsewhere; both give the same bits.
// The weight slice for step k+2 is loaded into registers while step k computes and is
// dequantized into the other shared buffer after it.
// Split-K (small grids): blockIdx.z selects a slice of the K steps; the CTA stores its raw f32
// accumulators into a workspace plane and splitk_reduce_kernel sums the planes in slice order.
#include <cuda.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <utility>

#include "backend/cuda/kernels.h"
#include "backend/cuda/prefill.h"
#include "backend/cuda/prefill_mma.cuh"
#include "util/env.h"
#include "util/error.h"

namespace minfer::cuda {
namespace {

using namespace prefill_detail;

constexpr int kBK = 64;           // K elements per pipeline step (one weight "chunk" per row)
constexpr int kAStages = 3;       // activation pipeline depth
constexpr int kChunksPerRow = kBK * 2 / 16;  // 16-byte chunks per 64-element bf16 tile row
using Tile = SwizzledTile<kChunksPerRow>;

// A CTA computes kBM tokens x kBN weight rows. Up to 128 tokens it is 128 threads (4 warps: 2 (m)
// x 2 (n) with mma.sync, one warpgroup with wgmma); 128 rows give each thread one weight row; 64
// or 32 rows give a row 2 or 4 threads and the grid 2 or 4 times the CTAs, for more instructions
// (each CTA loads and reads its activation tile). plan_n_tile picks the width by measurement; it
// decides which CTA computes an output, never its sums. 256 tokens (warpgroup MMA only) are two
// warpgroups of 128 tokens each sharing one dequantized 128-row weight tile, two threads a row:
// half the dequantization per FLOP of 128-token tiles.
template <int kBM, int kBN>
struct GemmShape {
  static_assert(kBM == 64 || kBM == 128 || (kBM == 256 && kBN == 128),
                "m-tiles: 64 for small grids, 128, and 256 (two warpgroups, 128-row n-tiles)");
  static_assert(kBN == 32 || kBN == 64 || kBN == 128, "REQUIRES: 1, 2 or 4 threads per weight row");
  static constexpr int kThreads = kBM == 256 ? 256 : 128;
  static constexpr int kWarpGroups = kThreads / 128;
  static constexpr int kParts = kThreads / kBN;  // threads per weight row
  static constexpr int kWarpM = kBM / 2;        // rows per warp
  static constexpr int kMFrags = kWarpM / 16;   // m16 fragments per warp
  static constexpr int kWarpN = kBN / 2;        // columns per warp
  static constexpr int kNFrags = kWarpN / 8;    // n8 fragments per warp
  static constexpr int kAStageBytes = kBM * Tile::kRowBytes;
  static constexpr int kBBufferBytes = kBN * Tile::kRowBytes;
  static constexpr int kSmemBytes = kAStages * kAStageBytes + 2 * kBBufferBytes;
  static constexpr int kAChunksPerThread = kBM * kChunksPerRow / kThreads;
  static constexpr int kWarpGroupRows = kBM / kWarpGroups;  // wgmma: tokens a warpgroup multiplies
};

// One of a launch's stacked matrices (PrefillGemm::stacked): its weight rows, output and bias;
// its columns end at n_end of the launch's columns.
struct GemmSegment {
  const uint8_t* w;
  float* y;
  int64_t ldy;
  const float* bias;
  int n_end;
};

struct GemmParams {
  GemmSegment seg[3];
  int n_segs;
  int64_t w_row_bytes;
  int n, k, m;  // n: every segment's columns
  const uint16_t* x;
  int64_t ldx;
  const float* residual;  // one segment only
  int slice_steps;  // K steps per blockIdx.z slice (k / kBK without split-K)
  float* partial;   // split-K: [gridDim.z][m][n] raw accumulators, bias/residual left to the reduce
  const uint8_t* w_up;  // SwiGLU (PrefillGemm::w_up; one segment), or null
  uint16_t* y_bf16;     // SwiGLU: y's bf16 plane, or null
  bool a_tma;           // warp-specialized: the activation tiles come by the tensor map
  // Warp-specialized: the weight tiles already decoded (weight_image_kernel), [n-tile][K step] of
  // WsShape::kBStageBytes each, copied into the stages as they are; null: the producers decode.
  uint8_t* weight_image;
};

// The segment holding launch column `col`, and its first column. Selects rather than indexes, so
// the parameters stay in the constant bank.
__device__ __forceinline__ GemmSegment segment_at(const GemmParams& p, int col, int& first_col) {
  if (p.n_segs > 2 && col >= p.seg[1].n_end) {
    first_col = p.seg[1].n_end;
    return p.seg[2];
  }
  if (p.n_segs > 1 && col >= p.seg[0].n_end) {
    first_col = p.seg[0].n_end;
    return p.seg[1];
  }
  first_col = 0;
  return p.seg[0];
}

// The weight row that row `tile_row` of a CTA's weight tile decodes, for the n-tile from launch
// column n0 in segment seg (whose first column is seg_n0). SwiGLU: the tile's 32-row groups
// alternate gate and up rows of the CTA's 64 output columns. Rows past the matrix decode its last
// row (valid memory; their columns are never stored).
__device__ __forceinline__ const uint8_t* weight_tile_row(const GemmParams& p, const GemmSegment& seg, int seg_n0,
                                                          int n0, int tile_row, bool swiglu) {
  const int matrix_row = (swiglu ? n0 + (tile_row / 64) * 32 + tile_row % 32 : n0 + tile_row) - seg_n0;
  const uint8_t* matrix = swiglu && (tile_row / 32) % 2 ? p.w_up : seg.w;
  return matrix + int64_t(min(matrix_row, seg.n_end - seg_n0 - 1)) * p.w_row_bytes;
}

// ---- weight decoding: 64 consecutive K elements of one row -> 8 chunks of 8 bf16 ----------------

// The quants are unpacked four at a time: whole-word shifts and masks leave one quant in each
// byte, and one byte permute puts byte i under the exponent of 2^23, giving the float 2^23 + byte
// (exact); subtracting 2^23 (plus the type's offset, 32 for q6_K, 128 for q8_0) is exact too, so
// every weight is the same f32 as dequantize_row computes, for a few instructions each.
__device__ __forceinline__ float two_pow_23_plus_byte(uint32_t bytes, int i) {
  return __int_as_float(__byte_perm(bytes, 0x4B000000u, 0x7440u | uint32_t(i)));
}
constexpr float kTwoPow23 = 8388608.0f;
__device__ __forceinline__ uint32_t byte_at(uint32_t w, int i) { return (w >> (8 * i)) & 0xFFu; }
__device__ __forceinline__ float f16_bits_to_float(uint32_t bits) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(bits)));
}
__device__ __forceinline__ void load16(uint32_t* dst, const uint8_t* src) {
  const uint4 v = __ldg(reinterpret_cast<const uint4*>(src));
  dst[0] = v.x, dst[1] = v.y, dst[2] = v.z, dst[3] = v.w;
}
template <typename ElementFn>  // ElementFn(e) -> float for e = 0..7
__device__ __forceinline__ uint4 pack8(ElementFn f) {
  return make_uint4(pack_bf16x2(f(0), f(1)), pack_bf16x2(f(2), f(3)), pack_bf16x2(f(4), f(5)),
                    pack_bf16x2(f(6), f(7)));
}

// kWords 32-bit words starting at a 2-byte aligned address (q8_0 blocks are 34 bytes). Loads stay
// pure so they can be in flight during the MMA step; the realignment happens in word(). Never
// reads outside [p, p + 4*kWords).
template <int kWords>
struct Unaligned2Words {
  uint32_t w[kWords + 1];
  uint32_t shift;  // 0 or 16 bits
  __device__ __forceinline__ void load(const uint8_t* p) {
    const uintptr_t a = reinterpret_cast<uintptr_t>(p);
    const uint32_t* base = reinterpret_cast<const uint32_t*>(a & ~uintptr_t(3));
    shift = (a & 2) ? 16u : 0u;
#pragma unroll
    for (int i = 0; i < kWords; ++i) w[i] = __ldg(base + i);
    // Only a misaligned run needs word kWords, and then only its low half (still inside the run).
    w[kWords] = shift ? uint32_t(__ldg(reinterpret_cast<const unsigned short*>(base + kWords))) : 0u;
  }
  __device__ __forceinline__ uint32_t word(int i) const { return __funnelshift_r(w[i], w[i + 1], shift); }
};

// kWords aligned 32-bit words (q6_K blocks in the device layout start 4-byte aligned).
template <int kWords>
struct AlignedWords {
  uint32_t w[kWords];
  __device__ __forceinline__ void load(const uint8_t* p) {
#pragma unroll
    for (int i = 0; i < kWords; ++i) w[i] = __ldg(reinterpret_cast<const uint32_t*>(p) + i);
  }
  __device__ __forceinline__ uint32_t word(int i) const { return w[i]; }
};

// A thread decodes part `part` of kParts equal parts of a row's 64-K step: elements
// [part * 64 / kParts, (part + 1) * 64 / kParts), as kChunks = 8 / kParts chunks of 8 bf16. Narrow
// n-tiles give one row several threads (kParts > 1); the values are the same whatever kParts is.
// load() fetches only the part's bytes (pure loads, so they stay in flight); scales() decodes the
// step's block scales once, and chunk<c>(scales) the chunk's weights (a compile-time c: register
// arrays). Decoding the scales inside each chunk cost ~17 instructions a chunk (the compiler does
// not share them between chunks).
template <GgmlType T, int kParts>
struct WeightChunk;

template <int kParts>
struct PartShape {
  static_assert(kParts == 1 || kParts == 2 || kParts == 4, "REQUIRES: 1, 2 or 4 threads per weight row");
  static constexpr int kChunks = 8 / kParts;
  static constexpr int kElements = 64 / kParts;
  // The part's half of a 64-element span made of two 32-element halves (runtime for kParts > 1;
  // for kParts = 1 each chunk names its own half: half(c) = c / 4).
  __device__ static int half0(int part) { return kParts == 1 ? 0 : part / (kParts / 2); }
  template <int c>
  __device__ static int half(int part) { return kParts == 1 ? c / 4 : half0(part); }
  // Byte offset of the part inside its 32-byte half (only 4 parts split a half).
  __device__ static int byte_in_half(int part) { return kParts == 4 ? 16 * (part % 2) : 0; }
  // Bytes of a 32-byte half a part reads.
  static constexpr int kHalfBytes = kParts == 4 ? 16 : 32;
  // 32-element halves a part touches (kParts = 1: both), and which of them chunk c is in.
  static constexpr int kHalves = kParts == 1 ? 2 : 1;
  template <int c>
  static constexpr int half_index() { return kParts == 1 ? c / 4 : 0; }
};

struct NoScales {};  // f16, bf16, f32 rows

template <int kParts>
struct WeightChunk<GgmlType::Q4_K, kParts> {  // d, dmin, scales[12] | qs[128]; groups of 32 (6-bit sc, m)
  using Part = PartShape<kParts>;
  uint32_t head[4];
  uint32_t qs[Part::kHalfBytes / 4];  // qs bytes of pair `pair`: low nibbles group 2*pair, high 2*pair+1
  int pair, part;
  __device__ __forceinline__ void load(const uint8_t* row, int k0, int part_) {
    part = part_;
    const uint8_t* blk = row + (k0 / QK_K) * sizeof(BlockQ4_K);
    pair = (k0 % QK_K) / kBK;
    load16(head, blk);
    const uint8_t* q = blk + 16 + 32 * pair + Part::byte_in_half(part);
#pragma unroll
    for (int i = 0; i < Part::kHalfBytes / 16; ++i) load16(qs + 4 * i, q + 16 * i);
  }
  // 6-bit scale and min of group j (0..7) from the 12 packed bytes (the GGUF q4_K/q5_K packing),
  // both packings decoded and one selected (no branch), times the block's d and dmin.
  __device__ __forceinline__ static void scale_min(const uint32_t* head, float d, float dmin, int j, float& dl,
                                                   float& ml) {
    const uint32_t s0 = byte_at(head[1], j & 3), s1 = byte_at(head[2], j & 3), s2 = byte_at(head[3], j & 3);
    const bool low = j < 4;
    const uint32_t sc = low ? s0 & 63 : (s2 & 0xF) | ((s0 >> 6) << 4);
    const uint32_t mn = low ? s1 & 63 : (s2 >> 4) | ((s1 >> 6) << 4);
    dl = d * float(sc);
    ml = dmin * float(mn);
  }
  struct Scales {
    float dl[Part::kHalves], ml[Part::kHalves];  // d * scale and dmin * min of the part's groups
  };
  // The groups of the part's halves in the q4_K/q5_K block (pair `pair` of group pairs).
  __device__ __forceinline__ static Scales group_scales(const uint32_t* head, int pair, int part) {
    Scales s;
    const float d = f16_bits_to_float(head[0] & 0xFFFF), dmin = f16_bits_to_float(head[0] >> 16);
#pragma unroll
    for (int h = 0; h < Part::kHalves; ++h)
      scale_min(head, d, dmin, 2 * pair + (kParts == 1 ? h : Part::half0(part)), s.dl[h], s.ml[h]);
    return s;
  }
  __device__ __forceinline__ Scales scales() const { return group_scales(head, pair, part); }
  template <int c>
  __device__ __forceinline__ uint4 chunk(const Scales& s) const {
    const int shift = 4 * Part::template half<c>(part);
    const float dl = s.dl[Part::template half_index<c>()], ml = s.ml[Part::template half_index<c>()];
    const uint32_t q0 = (qs[2 * (c % 4)] >> shift) & 0x0F0F0F0Fu, q1 = (qs[2 * (c % 4) + 1] >> shift) & 0x0F0F0F0Fu;
    return pack8([&](int e) { return dl * (two_pow_23_plus_byte(e < 4 ? q0 : q1, e % 4) - kTwoPow23) - ml; });
  }
};

template <int kParts>
struct WeightChunk<GgmlType::Q5_K, kParts> {  // as q4_K plus qh[32]: bit j of qh[l] is bit 4 of group j
  using Part = PartShape<kParts>;
  uint32_t head[4];
  uint32_t qh[Part::kHalfBytes / 4];
  uint32_t qs[Part::kHalfBytes / 4];
  int pair, part;
  __device__ __forceinline__ void load(const uint8_t* row, int k0, int part_) {
    part = part_;
    const uint8_t* blk = row + (k0 / QK_K) * sizeof(BlockQ5_K);
    pair = (k0 % QK_K) / kBK;
    load16(head, blk);
    const int offset = Part::byte_in_half(part);
#pragma unroll
    for (int i = 0; i < Part::kHalfBytes / 16; ++i) {
      load16(qh + 4 * i, blk + 16 + offset + 16 * i);
      load16(qs + 4 * i, blk + 48 + 32 * pair + offset + 16 * i);
    }
  }
  using Scales = typename WeightChunk<GgmlType::Q4_K, kParts>::Scales;
  __device__ __forceinline__ Scales scales() const {
    return WeightChunk<GgmlType::Q4_K, kParts>::group_scales(head, pair, part);
  }
  template <int c>
  __device__ __forceinline__ uint4 chunk(const Scales& s) const {
    const int half = Part::template half<c>(part);
    const int group = 2 * pair + half;
    const float dl = s.dl[Part::template half_index<c>()], ml = s.ml[Part::template half_index<c>()];
    const int shift = 4 * half;
    const auto quants = [&](int w) {  // four 5-bit quants, one a byte
      return ((qs[w] >> shift) & 0x0F0F0F0Fu) | (((qh[w] >> group) & 0x01010101u) << 4);
    };
    const uint32_t q0 = quants(2 * (c % 4)), q1 = quants(2 * (c % 4) + 1);
    return pack8([&](int e) { return dl * (two_pow_23_plus_byte(e < 4 ? q0 : q1, e % 4) - kTwoPow23) - ml; });
  }
};

template <int kParts>
struct WeightChunk<GgmlType::Q6_K, kParts> {  // ql[128] | qh[64] | int8 scales[16] | d | 2 bytes; halves of 128
  using Part = PartShape<kParts>;
  // This step's 64 elements are two 32-element groups (hi = 0, 1: ql bytes +32, qh bits +2).
  AlignedWords<Part::kElements / 4> ql;   // the part's ql bytes of ql[64h .. 64h+64)
  AlignedWords<Part::kHalfBytes / 4> qh;  // the part's qh bytes of qh[32h .. 32h+32)
  AlignedWords<1> sc;    // scales[8h + 4*p2 .. +4): the four 16-element scales of this step
  uint32_t d_bits;
  int p2;  // which 64 of the half: groups 2*p2, 2*p2+1 of it
  int part;
  __device__ __forceinline__ void load(const uint8_t* row, int k0, int part_) {
    part = part_;
    const uint8_t* blk = row + (k0 / QK_K) * kQ6KDeviceBlockBytes;
    const int half = (k0 % QK_K) / 128;
    p2 = (k0 % 128) / kBK;
    ql.load(blk + 64 * half + Part::kElements * part);
    qh.load(blk + 128 + 32 * half + Part::byte_in_half(part));
    sc.load(blk + 192 + 8 * half + 4 * p2);
    d_bits = __ldg(reinterpret_cast<const unsigned short*>(blk + 208));
  }
  struct Scales {
    float d;  // the 16-element scales are a byte each; their product with d is left to the chunk
  };
  __device__ __forceinline__ Scales scales() const { return {f16_bits_to_float(d_bits)}; }
  template <int c>
  __device__ __forceinline__ uint4 chunk(const Scales& s) const {
    const int hi = Part::template half<c>(part);
    const int chunk_in_group = kParts == 4 ? 2 * (part % 2) + c : c % 4;  // 8-element chunk of 32
    const int lshift = 4 * p2, hshift = 4 * p2 + 2 * hi;
    const int scale = int(int8_t(byte_at(sc.word(0), 2 * hi + chunk_in_group / 2)));
    const float dl = s.d * float(scale);
    const auto quants = [&](uint32_t lw, uint32_t hw) {  // four unsigned 6-bit quants, one a byte
      return ((lw >> lshift) & 0x0F0F0F0Fu) | (((hw >> hshift) & 0x03030303u) << 4);
    };
    const uint32_t u0 = quants(ql.word(2 * c), qh.word(2 * (c % 4)));
    const uint32_t u1 = quants(ql.word(2 * c + 1), qh.word(2 * (c % 4) + 1));
    return pack8([&](int e) { return dl * (two_pow_23_plus_byte(e < 4 ? u0 : u1, e % 4) - (kTwoPow23 + 32.0f)); });
  }
};

template <int kParts>
struct WeightChunk<GgmlType::Q8_0, kParts> {  // two 34-byte blocks: f16 d | int8 qs[32]
  using Part = PartShape<kParts>;
  static constexpr int kBlocks = kParts == 1 ? 2 : 1;
  Unaligned2Words<Part::kHalfBytes / 4> qs[kBlocks];
  uint32_t d_bits[kBlocks];
  __device__ __forceinline__ void load(const uint8_t* row, int k0, int part) {
    const uint8_t* blk = row + (k0 / QK) * sizeof(BlockQ8_0);
#pragma unroll
    for (int b = 0; b < kBlocks; ++b) {
      const uint8_t* block = blk + (kParts == 1 ? b : Part::half0(part)) * sizeof(BlockQ8_0);
      d_bits[b] = __ldg(reinterpret_cast<const unsigned short*>(block));
      qs[b].load(block + 2 + Part::byte_in_half(part));
    }
  }
  struct Scales {
    float d[kBlocks];
  };
  __device__ __forceinline__ Scales scales() const {
    Scales s;
#pragma unroll
    for (int b = 0; b < kBlocks; ++b) s.d[b] = f16_bits_to_float(d_bits[b]);
    return s;
  }
  template <int c>
  __device__ __forceinline__ uint4 chunk(const Scales& s) const {
    const Unaligned2Words<Part::kHalfBytes / 4>& q = qs[kParts == 1 ? c / 4 : 0];
    const float d = s.d[kParts == 1 ? c / 4 : 0];
    const uint32_t b0 = q.word(2 * (c % 4)) ^ 0x80808080u, b1 = q.word(2 * (c % 4) + 1) ^ 0x80808080u;  // int8 + 128
    return pack8([&](int e) { return d * (two_pow_23_plus_byte(e < 4 ? b0 : b1, e % 4) - (kTwoPow23 + 128.0f)); });
  }
};

// f16 and bf16 rows: the part's 16-bit elements as they are stored, 8 a chunk.
template <int kParts>
struct Raw16BitChunks {
  using Part = PartShape<kParts>;
  uint32_t raw[4 * Part::kChunks];
  __device__ __forceinline__ void load(const uint8_t* row, int k0, int part) {
    const uint8_t* src = row + size_t(k0 + Part::kElements * part) * 2;
#pragma unroll
    for (int c = 0; c < Part::kChunks; ++c) load16(raw + 4 * c, src + 16 * c);
  }
  __device__ __forceinline__ NoScales scales() const { return {}; }
};

template <int kParts>
struct WeightChunk<GgmlType::F16, kParts> : Raw16BitChunks<kParts> {
  template <int c>
  __device__ __forceinline__ uint4 chunk(NoScales) const {
    const uint32_t* raw = this->raw;
    return pack8([&](int e) { return f16_bits_to_float(raw[4 * c + e / 2] >> (16 * (e % 2))); });
  }
};

template <int kParts>
struct WeightChunk<GgmlType::BF16, kParts> : Raw16BitChunks<kParts> {  // already the tile's format
  template <int c>
  __device__ __forceinline__ uint4 chunk(NoScales) const {
    const uint32_t* raw = this->raw;
    return make_uint4(raw[4 * c], raw[4 * c + 1], raw[4 * c + 2], raw[4 * c + 3]);
  }
};

template <int kParts>
struct WeightChunk<GgmlType::F32, kParts> {  // converted at load time (f32 weights are the rare case)
  using Part = PartShape<kParts>;
  uint32_t packed[4 * Part::kChunks];
  __device__ __forceinline__ void load(const uint8_t* row, int k0, int part) {
    const float4* src = reinterpret_cast<const float4*>(row + size_t(k0 + Part::kElements * part) * 4);
#pragma unroll
    for (int i = 0; i < 2 * Part::kChunks; ++i) {
      const float4 v = __ldg(src + i);
      packed[2 * i] = pack_bf16x2(v.x, v.y);
      packed[2 * i + 1] = pack_bf16x2(v.z, v.w);
    }
  }
  __device__ __forceinline__ NoScales scales() const { return {}; }
  template <int c>
  __device__ __forceinline__ uint4 chunk(NoScales) const {
    return make_uint4(packed[4 * c], packed[4 * c + 1], packed[4 * c + 2], packed[4 * c + 3]);
  }
};

// Part w_part of weight tile row w_tile_row, decoded into the tile at dst (a stage in shared
// memory, or a weight image in global memory: the same bytes at the same offsets).
template <GgmlType T, int kParts>
__device__ __forceinline__ void store_weight_part(uint8_t* dst, const WeightChunk<T, kParts>& w, int w_tile_row,
                                                  int w_part) {
  const auto scales = w.scales();
  const int chunk0 = w_part * PartShape<kParts>::kChunks;
  [&]<int... c>(std::integer_sequence<int, c...>) {
    ((*reinterpret_cast<uint4*>(dst + Tile::offset(w_tile_row, chunk0 + c)) = w.template chunk<c>(scales)), ...);
  }(std::make_integer_sequence<int, PartShape<kParts>::kChunks>{});
}

// ---- the kernel ------------------------------------------------------------------------------------

// The epilogue: accumulator (i, j, e) of this thread is row row_of(i) + 8 * (e >= 2), column n0 +
// tile_col_of(j) + e % 2 of the launch (segment seg from its column seg_n0 on): the SwiGLU
// product and its bf16 plane, the split-K partial plane, or bias + residual into the output.
template <bool kCanSwiGLU, bool kSplitK, int kAccM, int kAccN, typename RowOf, typename TileColOf>
__device__ __forceinline__ void store_tile(const GemmParams& p, const float (&acc)[kAccM][kAccN][4], int n0, int slice,
                                           const GemmSegment& seg, int seg_n0, bool swiglu, RowOf row_of,
                                           TileColOf tile_col_of) {
  const auto col_of = [&](int j) { return n0 + tile_col_of(j); };
  if constexpr (kCanSwiGLU) {
    if (swiglu) {
#pragma unroll
      for (int i = 0; i < kAccM; ++i)
#pragma unroll
        for (int j = 0; j < kAccN; ++j) {
          if (j % 8 >= 4) continue;  // an up block: its gate block j - 4 writes the pair
          const int tile_col = tile_col_of(j);
          const int col = n0 + (tile_col / 64) * 32 + tile_col % 32;
          if (col >= p.n) continue;  // n is even, so col + 1 < n too
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int row = row_of(i) + 8 * h;
            if (row >= p.m) continue;
            const float2 v = make_float2(silu_mul(acc[i][j][2 * h], acc[i][j + 4][2 * h]),
                                         silu_mul(acc[i][j][2 * h + 1], acc[i][j + 4][2 * h + 1]));
            *reinterpret_cast<float2*>(seg.y + int64_t(row) * seg.ldy + col) = v;
            if (p.y_bf16)
              *reinterpret_cast<uint32_t*>(p.y_bf16 + int64_t(row) * seg.ldy + col) = prefill_activation_bf16x2(v.x, v.y);
          }
        }
      return;
    }
  }
  if constexpr (kSplitK) {
    float* plane = p.partial + int64_t(slice) * p.m * p.n;
#pragma unroll
    for (int i = 0; i < kAccM; ++i)
#pragma unroll
      for (int j = 0; j < kAccN; ++j) {
        const int col = col_of(j);
        if (col >= p.n) continue;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int row = row_of(i) + 8 * h;
          if (row < p.m)
            *reinterpret_cast<float2*>(plane + int64_t(row) * p.n + col) =
                make_float2(acc[i][j][2 * h], acc[i][j][2 * h + 1]);
        }
      }
  } else {
#pragma unroll
    for (int i = 0; i < kAccM; ++i) {
#pragma unroll
      for (int j = 0; j < kAccN; ++j) {
        const int col = col_of(j) - seg_n0;  // of the segment
        if (col_of(j) >= p.n) continue;      // n is even, so col + 1 < n too
        float2 bias = make_float2(0.0f, 0.0f);
        if (seg.bias) bias = *reinterpret_cast<const float2*>(seg.bias + col);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int row = row_of(i) + 8 * h;
          if (row >= p.m) continue;
          float2 v = make_float2(acc[i][j][2 * h] + bias.x, acc[i][j][2 * h + 1] + bias.y);
          if (p.residual) {
            const float2 r = *reinterpret_cast<const float2*>(p.residual + int64_t(row) * seg.ldy + col);
            v.x += r.x, v.y += r.y;
          }
          *reinterpret_cast<float2*>(seg.y + int64_t(row) * seg.ldy + col) = v;
        }
      }
    }
  }
}

// REQUIRES: blockDim.x == GemmShape::kThreads; gridDim = (ceil(m / kBM), ceil(n / kBN), ceil(k / kBK /
// slice_steps)) with gridDim.z == 1 unless kSplitK; k % kBK == 0 (and the K types: k % 256 == 0);
// partial set iff kSplitK; dynamic shared memory GemmShape<kBM>::kSmemBytes. M-tiles vary fastest
// so the CTAs that share one weight slice run together and it is read from DRAM once. kSplitK is
// a template flag so the single-pass instantiation compiles to the same code (and registers) as
// before split-K existed.
//
// kWgmma: the CTA (one warpgroup) multiplies each step with warpgroup MMA (m64 x kBN x k16, both
// operands read from the swizzled tiles by descriptor), issued before the next step's weights are
// dequantized and waited for after, so the tensor cores work while the warps dequantize; the
// accumulators hold the m64 parts of the warpgroup's rows (two warpgroups at kBM = 256, each
// its own 128 tokens) of the whole n-tile. Otherwise each warp runs mma.sync on its 2 x 2 share
// of the tile. REQUIRES for kWgmma: sm_90a (the launcher checks the device; other compilations
// trap), kSmemBytes + 1024 bytes of dynamic shared memory (the tiles are aligned to 1024 bytes
// inside it).
template <GgmlType T, int kBM, int kBN, bool kSplitK, bool kWgmma>
__global__ void __launch_bounds__(GemmShape<kBM, kBN>::kThreads) prefill_gemm_kernel(const GemmParams p) {
  using Shape = GemmShape<kBM, kBN>;
  static_assert(kWgmma || Shape::kWarpGroups == 1, "256-token tiles are warpgroup MMA only");
  constexpr int kThreads = Shape::kThreads;
  if constexpr (kWgmma && !device_has_wgmma()) __trap();
  extern __shared__ __align__(128) uint8_t smem[];
  const uint32_t smem_pad = kWgmma ? pad_to_1024(shared_address(smem)) : 0u;
  const uint32_t a_smem = shared_address(smem) + smem_pad;
  const uint32_t b_smem = a_smem + kAStages * Shape::kAStageBytes;
  uint8_t* b_smem_ptr = smem + smem_pad + kAStages * Shape::kAStageBytes;
  // Accumulators: [m16 fragment][n8 fragment] of the warp's share (mma.sync), or [m64 part][n8
  // block] of the warpgroup's rows (wgmma); four floats each, every output in one of them.
  constexpr int kAccM = kWgmma ? Shape::kWarpGroupRows / 64 : Shape::kMFrags;
  constexpr int kAccN = kWgmma ? kBN / 8 : Shape::kNFrags;
  static_assert(kAccM * kAccN * 4 * kThreads == kBM * kBN, "every output in one accumulator");

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int warp_m = warp >> 1, warp_n = warp & 1;       // mma.sync
  const int warp_group = warp >> 2, warp_in_group = warp & 3;  // wgmma
  // SwiGLU (PrefillGemm::w_up; 128-row n-tiles, single pass): the weight tile's 32-row groups
  // alternate gate and up rows of the CTA's 64 output columns (tile rows 0-31 gate n0.., 32-63 up
  // n0.., 64-95 gate n0+32.., 96-127 up n0+32..), so each thread holds the gate and the up
  // accumulators of its columns (n8 blocks j and j + 4 in both multiply layouts) for the epilogue.
  constexpr bool kCanSwiGLU = kBN == 128 && !kSplitK;
  const bool swiglu = kCanSwiGLU && p.w_up != nullptr;
  const int m0 = blockIdx.x * kBM, n0 = blockIdx.y * (swiglu ? kBN / 2 : kBN);
  // The stacked matrix this CTA's columns belong to (REQUIRES: every segment but the last a
  // multiple of 128 columns, so no n-tile straddles two).
  int seg_n0;
  const GemmSegment seg = segment_at(p, n0, seg_n0);
  // This CTA's K range, in kBK steps.
  const int first_step = kSplitK ? int(blockIdx.z) * p.slice_steps : 0;
  const int steps = kSplitK ? min(p.slice_steps, p.k / kBK - first_step) : p.k / kBK;

  auto load_a = [&](int step, int stage) {
#pragma unroll
    for (int i = 0; i < Shape::kAChunksPerThread; ++i) {
      const int idx = tid + i * kThreads;
      const int row = idx / kChunksPerRow, chunk = idx % kChunksPerRow;
      const int gm = m0 + row;
      const bool valid = gm < p.m;
      const uint16_t* src = p.x + int64_t(valid ? gm : 0) * p.ldx + (first_step + step) * kBK + chunk * 8;
      cp_async16(a_smem + stage * Shape::kAStageBytes + Tile::offset(row, chunk), src, valid);
    }
  };

  // Thread tid decodes part tid % kParts of weight tile row tid / kParts (adjacent threads,
  // adjacent bytes).
  constexpr int kParts = Shape::kParts;
  const int w_tile_row = tid / kParts, w_part = tid % kParts;
  const uint8_t* w_row = weight_tile_row(p, seg, seg_n0, n0, w_tile_row, swiglu);
  WeightChunk<T, kParts> weights;
  auto store_b = [&](int buffer) {
    store_weight_part(b_smem_ptr + buffer * Shape::kBBufferBytes, weights, w_tile_row, w_part);
  };

  float acc[kAccM][kAccN][4];
#pragma unroll
  for (int i = 0; i < kAccM; ++i)
#pragma unroll
    for (int j = 0; j < kAccN; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;

#pragma unroll
  for (int s = 0; s < kAStages - 1; ++s) {
    if (s < steps) load_a(s, s);
    cp_async_commit();
  }
  weights.load(w_row, first_step * kBK, w_part);
  store_b(0);
  if (steps > 1) weights.load(w_row, (first_step + 1) * kBK, w_part);

  for (int step = 0; step < steps; ++step) {
    // Groups committed so far: (kAStages - 1) + step; this step's A tile is the oldest pending one.
    cp_async_wait<kAStages - 2>();
    if constexpr (kWgmma) fence_proxy_async_shared();  // this thread's tile writes, for the tensor cores
    // After this barrier: A stage `step` and B buffer `step & 1` are complete and visible, and every
    // warp has finished step - 1 (wgmma: waited for), so its A stage and B buffer may be overwritten.
    __syncthreads();
    {
      const int next = step + kAStages - 1;
      if (next < steps) load_a(next, next % kAStages);
      cp_async_commit();  // possibly empty: keeps the group count arithmetic above uniform
    }

    const uint32_t a_stage = a_smem + (step % kAStages) * Shape::kAStageBytes;
    const uint32_t b_buffer = b_smem + (step & 1) * Shape::kBBufferBytes;
    if constexpr (kWgmma) {
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kBK / 16; ++kk)  // each accumulator sums its K slices in order
#pragma unroll
        for (int i = 0; i < kAccM; ++i)
          wgmma_bf16<kBN>(reinterpret_cast<float(&)[kBN / 2]>(acc[i]),
                          sw128_descriptor(a_stage + (warp_group * Shape::kWarpGroupRows + i * 64) * Tile::kRowBytes + kk * 32),
                          sw128_descriptor(b_buffer + kk * 32));
      wgmma_commit();
    } else {
#pragma unroll
      for (int kk = 0; kk < kBK / 16; ++kk) {
        uint32_t a[Shape::kMFrags][4];
#pragma unroll
        for (int i = 0; i < Shape::kMFrags; ++i)
          ldmatrix_x4(a[i], a_stage + Tile::offset(warp_m * Shape::kWarpM + i * 16 + (lane & 15),
                                                   2 * kk + (lane >> 4)));
        uint32_t b[Shape::kNFrags / 2][4];  // b[j]: n-fragments 2j (regs 0,1) and 2j+1 (regs 2,3)
#pragma unroll
        for (int j = 0; j < Shape::kNFrags / 2; ++j)
          ldmatrix_x4(b[j], b_buffer + Tile::offset(warp_n * Shape::kWarpN + j * 16 + (lane & 7) + ((lane >> 4) << 3),
                                                    2 * kk + ((lane >> 3) & 1)));
#pragma unroll
        for (int i = 0; i < Shape::kMFrags; ++i)
#pragma unroll
          for (int j = 0; j < Shape::kNFrags; ++j)
            mma_bf16(acc[i][j], a[i], b[j / 2][2 * (j & 1)], b[j / 2][2 * (j & 1) + 1]);
      }
    }

    if (step + 1 < steps) {
      store_b((step + 1) & 1);  // buffer of step - 1: free since the barrier above
      if (step + 2 < steps) weights.load(w_row, (first_step + step + 2) * kBK, w_part);
    }
    if constexpr (kWgmma) {
      wgmma_wait<0>();
#pragma unroll
      for (int i = 0; i < kAccM; ++i)
#pragma unroll
        for (int j = 0; j < kAccN; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) fence_operand(acc[i][j][e]);
    }
  }

  // Epilogue: accumulator (i, j, e) is row row_of(i) + lane/4 (+8 for e >= 2), column col_of(j) +
  // 2*(lane%4) + e%2 (mma.sync: the warp's m16 x n8 fragments; wgmma: warp w of its warpgroup holds
  // rows 16w.. of each m64 part, the n8 blocks of the whole tile).
  const auto row_of = [&](int i) {
    return kWgmma ? m0 + warp_group * Shape::kWarpGroupRows + i * 64 + warp_in_group * 16 + (lane >> 2)
                  : m0 + warp_m * Shape::kWarpM + i * 16 + (lane >> 2);
  };
  const auto tile_col_of = [&](int j) {
    return kWgmma ? j * 8 + 2 * (lane & 3) : warp_n * Shape::kWarpN + j * 8 + 2 * (lane & 3);
  };
  store_tile<kCanSwiGLU, kSplitK>(p, acc, n0, int(blockIdx.z), seg, seg_n0, swiglu, row_of, tile_col_of);
}

// ---- warp-specialized 256 x 128 tiles ------------------------------------------------------------
// Four warpgroups. Two producers have each step's activation tile copied (by the tensor memory
// accelerator, or cp.async) and dequantize the weight tile (two threads a row, as
// prefill_gemm_kernel's 256 threads do) into a ring of kWsStages stages, running ahead of the
// multiply; two consumers (128 tokens each) wait for a stage, issue its wgmma, and release it
// when that has completed. Per stage two mbarriers: full (256 arrivals after the weight stores,
// plus the copy's bytes or 256 cp.async arrivals) and empty (256 consumer arrivals). Every output
// sums the same k16 slices in the same order as prefill_gemm_kernel<T, 256, 128, kSplitK, true>:
// the same bits. The dequantization no longer waits behind a block barrier for the multiply, nor
// the multiply for the dequantization.
// One producer warpgroup (a thread a row) was measured too: the consumers then waited for it
// (docs/14 §13).
// REQUIRES: blockDim.x == kWsThreads; grid and K range as prefill_gemm_kernel with kBM = 256,
// kBN = 128; WsShape::kSmemBytes of dynamic shared memory; sm_90a (other compilations trap).
constexpr int kWsStages = 4;
constexpr int kWsProducerThreads = 256;
constexpr int kWsThreads = kWsProducerThreads + 256;
// The register file split by setmaxnreg: 256 x 96 + 256 x 160 = 512 x 128 (ptxas: no spills;
// consumers hold 128 accumulators). Loading the weights three steps ahead instead of two spilled
// the q6_K producer and was slower (docs/14 §21).
constexpr int kWsProducerRegisters = 96, kWsConsumerRegisters = 160;
struct WsShape {
  static constexpr int kAStageBytes = 256 * Tile::kRowBytes;
  static constexpr int kBStageBytes = 128 * Tile::kRowBytes;
  static constexpr int kStageBytes = kAStageBytes + kBStageBytes;  // a multiple of 1024: stages stay aligned
  static constexpr int kSmemBytes = kWsStages * kStageBytes + 2 * kWsStages * 8 + 1024;  // + barriers, alignment
};

// Launch columns a warp-specialized n-tile covers: 128 weight rows, or 64 SwiGLU outputs (a gate
// and an up row each).
__host__ __device__ constexpr int ws_columns_per_tile(bool swiglu) { return swiglu ? 64 : 128; }

// The launch's work items: 256-token m-tile (fastest, so the CTAs that share a weight slice run
// together), n-tile of 128 columns (64 SwiGLU outputs), K slice. A CTA takes items blockIdx.x,
// blockIdx.x + gridDim.x, ... (persistent: the producers fill the next tile's stages while the
// consumers store this one's).
struct WsWork {
  struct Tile {
    int m0, n0, slice, first_step, steps;
  };
  int m_tiles, n_tiles, items, k_steps, slice_steps;
  int n_per_tile;
  __device__ WsWork(const GemmParams& p, bool swiglu)
      : m_tiles((p.m + 255) / 256), n_tiles(0), items(0), k_steps(p.k / kBK), slice_steps(p.slice_steps),
        n_per_tile(ws_columns_per_tile(swiglu)) {
    n_tiles = (p.n + n_per_tile - 1) / n_per_tile;
    items = m_tiles * n_tiles * ((k_steps + slice_steps - 1) / slice_steps);
  }
  __device__ Tile tile(int item) const {
    Tile t;
    t.m0 = item % m_tiles * 256;
    t.n0 = item / m_tiles % n_tiles * n_per_tile;
    t.slice = item / (m_tiles * n_tiles);
    t.first_step = t.slice * slice_steps;
    t.steps = min(slice_steps, k_steps - t.first_step);
    return t;
  }
};

// With p.a_tma, one producer thread has the tensor memory accelerator copy a stage's activation
// tile through a_map (x as a k-by-m bf16 tensor, boxes of 64 x 256 elements, 128-byte swizzle:
// the Tile layout) instead of 16-byte cp.async copies by every producer thread.
template <GgmlType T, bool kSplitK>
__global__ void __launch_bounds__(kWsThreads, 1) prefill_gemm_ws_kernel(const GemmParams p,
                                                                        const __grid_constant__ CUtensorMap a_map) {
  if constexpr (!device_has_wgmma()) __trap();
  extern __shared__ __align__(128) uint8_t smem[];
  const uint32_t base = shared_address(smem);
  const uint32_t pad = pad_to_1024(base);
  const uint32_t tiles = base + pad;
  uint8_t* const tiles_ptr = smem + pad;
  const uint32_t barriers = tiles + kWsStages * WsShape::kStageBytes;
  const auto a_stage = [&](int s) { return tiles + uint32_t(s * WsShape::kStageBytes); };
  const auto b_offset = [&](int s) { return uint32_t(s * WsShape::kStageBytes + WsShape::kAStageBytes); };
  const auto full = [&](int s) { return barriers + uint32_t(8 * s); };
  const auto empty = [&](int s) { return barriers + uint32_t(8 * (kWsStages + s)); };

  const int tid = threadIdx.x, warp_group = tid / 128;
  constexpr bool kCanSwiGLU = !kSplitK;
  const bool swiglu = kCanSwiGLU && p.w_up != nullptr;
  const WsWork work(p, swiglu);

  if (tid == 0)
    for (int s = 0; s < kWsStages; ++s) {
      // Every producer thread arrives once for its weight rows, and once more for its cp.async
      // copies; with the weight image and the activation map, thread 0 alone fills a stage.
      mbarrier_init(full(s), p.weight_image && p.a_tma ? 1 : p.a_tma ? kWsProducerThreads : 2 * kWsProducerThreads);
      mbarrier_init(empty(s), 256);
    }
  __syncthreads();  // the last block-wide barrier: the warpgroups part here

  // Both roles walk the same work items and count the ring's steps across them (`ring`: the
  // CTA's steps before this item), so stage and phase carry from one tile to the next.
  constexpr int kProducerGroups = kWsProducerThreads / 128;
  if (warp_group < kProducerGroups) {  // producer
    warpgroup_registers_down<kWsProducerRegisters>();
    if (p.weight_image && p.a_tma && tid != 0) return;  // thread 0 copies both tiles; no barrier follows
    // Part tid % kParts of weight tile row tid / kParts.
    constexpr int kParts = kWsProducerThreads / 128;
    const int w_tile_row = tid / kParts, w_part = tid % kParts;
    // Activation chunk tid % 8 of rows tid / 8 + kRowsPerPass i: one source pointer and one
    // swizzled offset, each copy kRowsPerPass rows further (a multiple of 8: the same swizzle).
    constexpr int kRowsPerPass = kWsProducerThreads / kChunksPerRow;
    const int a_row = tid / kChunksPerRow, a_chunk = tid % kChunksPerRow;
    const uint32_t a_dst = uint32_t(Tile::offset(a_row, a_chunk));  // + i * kRowsPerPass * kRowBytes (same swizzle)
    const int64_t a_pass_stride = int64_t(kRowsPerPass) * p.ldx;
    int ring = 0;
    for (int item = blockIdx.x; item < work.items; item += gridDim.x) {
      const WsWork::Tile t = work.tile(item);
      int seg_n0;
      const GemmSegment seg = segment_at(p, t.n0, seg_n0);
      const uint8_t* w_row = weight_tile_row(p, seg, seg_n0, t.n0, w_tile_row, swiglu);
      const int a_rows_valid = p.m - t.m0 - a_row;  // copies i with kRowsPerPass i < this are in range
      const uint16_t* a_src = p.x + int64_t(min(t.m0 + a_row, p.m - 1)) * p.ldx + t.first_step * kBK + a_chunk * 8;
      // Weights are loaded two steps ahead of their dequantization (a register pair of chunks),
      // so an HBM latency hides behind two steps of multiply.
      WeightChunk<T, kParts> weights[2];
      const uint8_t* const image =
          p.weight_image ? p.weight_image + (int64_t(t.n0 / work.n_per_tile) * work.k_steps + t.first_step) *
                                                WsShape::kBStageBytes
                         : nullptr;
      if (!image) {
        weights[0].load(w_row, t.first_step * kBK, w_part);
        if (t.steps > 1) weights[1].load(w_row, (t.first_step + 1) * kBK, w_part);
      }
      const auto produce = [&](int step, WeightChunk<T, kParts>& w) {
        const int s = (ring + step) % kWsStages;
        mbarrier_wait(empty(s), (((ring + step) / kWsStages) & 1) ^ 1);  // the first round passes at once
        if (p.a_tma) {
          if (tid == 0) {  // before its own arrival below, so the phase cannot end without these bytes
            mbarrier_expect_tx(full(s), WsShape::kAStageBytes);
            tma_load_2d(a_stage(s), &a_map, (t.first_step + step) * kBK, t.m0, full(s));
          }
        } else {
#pragma unroll
          for (int i = 0; i < 256 / kRowsPerPass; ++i) {
            const bool valid = kRowsPerPass * i < a_rows_valid;  // an invalid copy zero-fills from row m - 1
            cp_async16(a_stage(s) + a_dst + uint32_t(i * kRowsPerPass * Tile::kRowBytes),
                       a_src + (valid ? i * a_pass_stride : 0) + step * kBK, valid);
          }
          cp_async_mbarrier_arrive(full(s));
        }
        if (image) {
          if (tid == 0) {
            mbarrier_expect_tx(full(s), WsShape::kBStageBytes);
            bulk_copy_to_shared(tiles + b_offset(s), image + int64_t(step) * WsShape::kBStageBytes,
                                WsShape::kBStageBytes, full(s));
          }
        } else {
          store_weight_part(tiles_ptr + b_offset(s), w, w_tile_row, w_part);
          if (step + 2 < t.steps) w.load(w_row, (t.first_step + step + 2) * kBK, w_part);
          fence_proxy_async_shared();  // the weight stores, for the consumers' wgmma
        }
        mbarrier_arrive(full(s));
      };
      for (int step = 0; step < t.steps; step += 2) {
        produce(step, weights[0]);
        if (step + 1 < t.steps) produce(step + 1, weights[1]);
      }
      ring += t.steps;
    }
    return;  // no barrier follows
  }

  warpgroup_registers_up<kWsConsumerRegisters>();
  const int consumer = warp_group - kProducerGroups, lane = tid & 31, warp_in_group = (tid / 32) % 4;
  float acc[2][16][4];
  int ring = 0;
  for (int item = blockIdx.x; item < work.items; item += gridDim.x) {
    const WsWork::Tile t = work.tile(item);
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int j = 0; j < 16; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;
    for (int step = 0; step < t.steps; ++step) {
      const int s = (ring + step) % kWsStages;
      mbarrier_wait(full(s), ((ring + step) / kWsStages) & 1);
      fence_proxy_async_shared();  // the stage's cp.async copies, for the tensor cores
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kBK / 16; ++kk)  // each accumulator sums its K slices in order
#pragma unroll
        for (int i = 0; i < 2; ++i)
          wgmma_bf16<128>(reinterpret_cast<float(&)[64]>(acc[i]),
                          sw128_descriptor(a_stage(s) + (consumer * 128 + i * 64) * Tile::kRowBytes + kk * 32),
                          sw128_descriptor(tiles + b_offset(s) + kk * 32));
      wgmma_commit();
      // This step's multiply done, its stage may be refilled: a consumer holds one stage, not two
      // (the other consumer warpgroup keeps the tensor cores busy meanwhile; docs/14 §21).
      wgmma_wait<0>();
      mbarrier_arrive(empty(s));
    }
    ring += t.steps;
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int j = 0; j < 16; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) fence_operand(acc[i][j][e]);
    int seg_n0;
    const GemmSegment seg = segment_at(p, t.n0, seg_n0);
    const auto row_of = [&](int i) { return t.m0 + consumer * 128 + i * 64 + warp_in_group * 16 + (lane >> 2); };
    const auto tile_col_of = [&](int j) { return j * 8 + 2 * (lane & 3); };
    store_tile<kCanSwiGLU, kSplitK>(p, acc, t.n0, t.slice, seg, seg_n0, swiglu, row_of, tile_col_of);
  }
}

// The weight image of a warp-specialized launch: each tile the producers would store into a
// stage, with their threads' rows and parts (store_weight_part), so a stage gets the same bytes
// from the image as from its producers. A launch of several 256-token m-tiles then decodes each
// weight once instead of once per m-tile (docs/14 §27). Block (n-tile, run) decodes `run_steps`
// consecutive K steps of its tile's rows, each thread its row part two steps ahead (as the
// producers do), into one of two tiles in shared memory, which thread 0 then copies out whole by
// the tensor memory accelerator: 16-byte stores scattered over 128 rows ran at a third of the
// copy rate (ncu, docs/14 §27).
// REQUIRES: blockDim.x == kWsProducerThreads; grid (n-tiles of WsWork, ceil(k / kBK / run_steps)).
template <GgmlType T>
__global__ void __launch_bounds__(kWsProducerThreads) weight_image_kernel(const GemmParams p, uint8_t* image,
                                                                          int run_steps) {
  __shared__ __align__(128) uint8_t tiles[2][WsShape::kBStageBytes];
  constexpr int kParts = kWsProducerThreads / 128;
  const bool swiglu = p.w_up != nullptr;
  const int n0 = int(blockIdx.x) * ws_columns_per_tile(swiglu), k_steps = p.k / kBK;
  const int first_step = int(blockIdx.y) * run_steps, steps = min(run_steps, k_steps - first_step);
  const int w_tile_row = int(threadIdx.x) / kParts, w_part = int(threadIdx.x) % kParts;
  int seg_n0;
  const GemmSegment seg = segment_at(p, n0, seg_n0);
  const uint8_t* w_row = weight_tile_row(p, seg, seg_n0, n0, w_tile_row, swiglu);
  uint8_t* out = image + (int64_t(blockIdx.x) * k_steps + first_step) * WsShape::kBStageBytes;
  WeightChunk<T, kParts> weights[2];
  weights[0].load(w_row, first_step * kBK, w_part);
  if (steps > 1) weights[1].load(w_row, (first_step + 1) * kBK, w_part);
  const auto decode = [&](int step, WeightChunk<T, kParts>& w) {
    uint8_t* tile = tiles[step & 1];
    if (step >= 2) {  // the copy out of this tile two steps ago has read it
      if (threadIdx.x == 0) bulk_wait_read<1>();
      __syncthreads();
    }
    store_weight_part(tile, w, w_tile_row, w_part);
    if (step + 2 < steps) w.load(w_row, (first_step + step + 2) * kBK, w_part);
    fence_proxy_async_shared();  // the tile's stores, for the copy engine
    __syncthreads();
    if (threadIdx.x == 0) {
      bulk_copy_to_global(out + int64_t(step) * WsShape::kBStageBytes, shared_address(tile), WsShape::kBStageBytes);
      bulk_commit();
    }
  };
  for (int step = 0; step < steps; step += 2) {
    decode(step, weights[0]);
    if (step + 1 < steps) decode(step + 1, weights[1]);
  }
  if (threadIdx.x == 0) bulk_wait_read<0>();  // shared memory stays until the last copy has read it
}

// y[r][c] = sum over slices s in order 0.. of partial[s][r][c] (+ bias[c]) (+ residual[r][c]):
// the same operation order as the single-pass epilogue, and fixed, so results are deterministic.
// Thread x of block (bx, by) sums column pair bx * blockDim.x + x of rows by, by + gridDim.y, ...
// (a 2-D grid: no 64-bit division by the row length, which ncu found made the kernel
// instruction-bound).
__global__ void splitk_reduce_kernel(const GemmParams p, int splits) {
  const int launch_col = 2 * int(blockIdx.x * blockDim.x + threadIdx.x);
  if (launch_col >= p.n) return;
  int first_col;
  const GemmSegment seg = segment_at(p, launch_col, first_col);
  const int col = launch_col - first_col;
  const float *bias = seg.bias, *residual = p.residual;
  float* y = seg.y;
  const int64_t ldy = seg.ldy, plane = int64_t(p.m) * p.n;
  const float2 b = bias ? make_float2(bias[col], bias[col + 1]) : make_float2(0.0f, 0.0f);
  for (int row = blockIdx.y; row < p.m; row += gridDim.y) {
    const float* src = p.partial + int64_t(row) * p.n + launch_col;
    float2 v = *reinterpret_cast<const float2*>(src);
    for (int s = 1; s < splits; ++s) {
      const float2 part = *reinterpret_cast<const float2*>(src + s * plane);
      v.x += part.x, v.y += part.y;
    }
    if (bias) v.x += b.x, v.y += b.y;
    if (residual) {  // may alias y: this thread reads its element before writing it
      const float2 r = *reinterpret_cast<const float2*>(residual + int64_t(row) * ldy + col);
      v.x += r.x, v.y += r.y;
    }
    *reinterpret_cast<float2*>(y + int64_t(row) * ldy + col) = v;
  }
}

template <GgmlType T, int kBM, int kBN, bool kSplitK, bool kWgmma>
void launch_typed(const GemmParams& p, int splits, cudaStream_t stream) {
  constexpr int smem = GemmShape<kBM, kBN>::kSmemBytes + (kWgmma ? 1024 : 0);
  reserve_dynamic_shared_memory(prefill_gemm_kernel<T, kBM, kBN, kSplitK, kWgmma>, smem, "prefill GEMM");
  const int n_per_cta = p.w_up ? kBN / 2 : kBN;  // SwiGLU: a gate and an up row per output column
  const dim3 grid((p.m + kBM - 1) / kBM, (p.n + n_per_cta - 1) / n_per_cta, splits);
  prefill_gemm_kernel<T, kBM, kBN, kSplitK, kWgmma><<<grid, GemmShape<kBM, kBN>::kThreads, smem, stream>>>(p);
}

template <GgmlType T, int kBM, int kBN, bool kWgmma>
void launch_shaped(const GemmParams& p, int splits, cudaStream_t stream) {
  splits > 1 ? launch_typed<T, kBM, kBN, true, kWgmma>(p, splits, stream)
             : launch_typed<T, kBM, kBN, false, kWgmma>(p, 1, stream);
}

template <GgmlType T, int kBM, bool kWgmma>
void launch_m_tiled(const GemmParams& p, PrefillGemmPlan plan, cudaStream_t stream) {
  switch (plan.n_tile) {
    case 32: launch_shaped<T, kBM, 32, kWgmma>(p, plan.k_splits, stream); break;
    case 64: launch_shaped<T, kBM, 64, kWgmma>(p, plan.k_splits, stream); break;
    default: launch_shaped<T, kBM, 128, kWgmma>(p, plan.k_splits, stream); break;
  }
}

// The activation plane x (m rows of k bf16, ldx apart) as the 2-D tensor map the warp-specialized
// producers copy 64 x 256 boxes of (zeros past row m).
CUtensorMap activation_tensor_map(const GemmParams& p) {
  return tensor_map_2d("prefill GEMM", "MINFER_NO_GEMM_TMA", CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, p.x, uint64_t(p.k),
                       uint64_t(p.m), uint64_t(p.ldx) * 2, kBK, 256, CU_TENSOR_MAP_SWIZZLE_128B);
}

template <GgmlType T, bool kSplitK>
void launch_warp_specialized(const GemmParams& p, int ctas, cudaStream_t stream) {
  constexpr int smem = WsShape::kSmemBytes;
  reserve_dynamic_shared_memory(prefill_gemm_ws_kernel<T, kSplitK>, smem, "prefill GEMM");
  const CUtensorMap a_map = p.a_tma ? activation_tensor_map(p) : CUtensorMap{};
  prefill_gemm_ws_kernel<T, kSplitK><<<ctas, kWsThreads, smem, stream>>>(p, a_map);
}

template <GgmlType T>
void launch_for_type(const GemmParams& p, PrefillGemmPlan plan, cudaStream_t stream) {
  if (p.weight_image) {
    const int per_tile = ws_columns_per_tile(p.w_up != nullptr), n_tiles = (p.n + per_tile - 1) / per_tile;
    const int runs = (p.k / kBK + plan.image_run_steps - 1) / plan.image_run_steps;
    weight_image_kernel<T><<<dim3(n_tiles, runs), kWsProducerThreads, 0, stream>>>(p, p.weight_image,
                                                                                 plan.image_run_steps);
  }
  if (plan.m_tile == 256 && plan.warp_specialized)
    plan.k_splits > 1 ? launch_warp_specialized<T, true>(p, plan.ctas, stream)
                      : launch_warp_specialized<T, false>(p, plan.ctas, stream);
  else if (plan.m_tile == 256)  // warpgroup MMA, 128-row n-tiles (checked by the launcher)
    launch_shaped<T, 256, 128, true>(p, plan.k_splits, stream);
  else if (plan.wgmma)
    plan.m_tile == 128 ? launch_m_tiled<T, 128, true>(p, plan, stream) : launch_m_tiled<T, 64, true>(p, plan, stream);
  else
    plan.m_tile == 128 ? launch_m_tiled<T, 128, false>(p, plan, stream) : launch_m_tiled<T, 64, false>(p, plan, stream);
}

int multiprocessor_count(const PrefillGemm& g) {
  if (g.sm_count > 0) return g.sm_count;
  int device = 0, n = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device);
  return n > 0 ? n : 132;
}

// Split-K cost model, in units of one 64-K step of a 128-row CTA while the SM holds two of them
// (~2 us on the H200): the CTAs run in whole waves of 2 per SM (a partial last wave costs a full
// one: the measured single-pass times at m = 512 fit that within 5%), each wave as long as its
// slice plus a fixed prologue/epilogue, and the partial planes cost their traffic (written once,
// read by the reduce mostly from L2) at about this many bytes per step. Slices shorter than
// kMinSliceSteps are not considered (the fixed cost would dominate). k_splits = 1 is a candidate
// too (128-row tiles, one pass). bench_prefill's split sweep checks the choice.
constexpr int kMaxSplits = 8;
constexpr int kMinSliceSteps = 8;
constexpr double kSliceOverheadSteps = 2.0;
constexpr double kPartialBytesPerStep = 16e6;

int choose_splits(int64_t m, int64_t n, int steps, int64_t tiles128, int sm_count, size_t workspace_bytes) {
  const int64_t slots = 2 * int64_t(sm_count);
  const double plane_bytes = double(m) * double(n) * 4.0;
  auto cost = [&](int splits) {
    const int slice = (steps + splits - 1) / splits;
    const int64_t waves = (tiles128 * splits + slots - 1) / slots;
    const double traffic = splits > 1 ? (splits + 2) * plane_bytes / kPartialBytesPerStep : 0.0;
    return double(waves) * (slice + kSliceOverheadSteps) + traffic;
  };
  int best = 1;
  double best_cost = cost(1);
  for (int splits = 2; splits <= kMaxSplits && splits * kMinSliceSteps <= steps; ++splits) {
    if (splits * plane_bytes > double(workspace_bytes)) break;
    const double c = cost(splits);
    if (c < best_cost) best = splits, best_cost = c;
  }
  return best;
}

bool split_k_disabled() { return env_flag("MINFER_NO_GEMM_SPLITK"); }

// The n-tile, given the m-tile and K split: the rule fitted to bench_prefill's sweep of the 7B
// shapes at 16-512 tokens and checked end to end (docs/08, "Short prompts"). With fewer CTAs of
// 128 rows than SMs, a narrower tile fills the card: 32 rows while they fit one wave of two a SM,
// else 64. q6_K weights take 64 rows below two CTAs of 128 a SM. Otherwise 128 rows: at two and
// more CTAs a SM the narrower tiles' extra instructions (each CTA loads and reads its activation
// tile) cost more than they fill.
int plan_n_tile(const PrefillGemm& g, const PrefillGemmPlan& plan, int sm_count) {
  if (g.n_tile) return g.n_tile;
  if (plan.m_tile == 256) return 128;  // the only width of 256-token tiles
  if (env_flag("MINFER_NO_NARROW_GEMM_TILES")) return 128;
  const int64_t m_tiles = (g.m + plan.m_tile - 1) / plan.m_tile;
  const auto ctas = [&](int n_tile) { return m_tiles * ((g.n + n_tile - 1) / n_tile) * plan.k_splits; };
  const int64_t sms = sm_count;
  if (ctas(128) < sms) return ctas(32) <= 2 * sms ? 32 : 64;
  return g.w_type == GgmlType::Q6_K && ctas(128) < 2 * sms ? 64 : 128;
}

// 256-token tiles (warpgroup MMA; one CTA of two warpgroups a SM instead of two of one) halve the
// dequantization per FLOP. They are taken where the tokens present fill both warpgroups and the
// CTAs still occupy at least 3/4 of the SMs that 128-token tiles would: bench_prefill's m-tile
// sweep of the 7B shapes at 512 and 4096 tokens (docs/14) — faster for every matrix there except
// k and v at 512 tokens (56 CTAs of 256 against 112 of 128).
bool wide_tiles_fill(const PrefillGemm& g, const PrefillGemmPlan& plan, int sm_count) {
  if (!plan.wgmma || g.m <= 128 || (g.n_tile != 0 && g.n_tile != 128) || env_flag("MINFER_NO_WIDE_GEMM_TILES"))
    return false;
  const int64_t n_tiles = (g.n + 127) / 128;
  const auto covered_sms = [&](int m_tile) {
    return std::min<int64_t>((g.m + m_tile - 1) / m_tile * n_tiles * plan.k_splits, sm_count);
  };
  return 4 * covered_sms(256) >= 3 * covered_sms(128);
}

// Matrix i of a launch: w's (0), then the stacked ones.
PrefillGemm::Stacked matrix(const PrefillGemm& g, int i) {
  return i == 0 ? PrefillGemm::Stacked{g.w, g.n, g.y, g.ldy, g.bias} : g.stacked[size_t(i - 1)];
}

int64_t launch_columns(const PrefillGemm& g) {
  int64_t n = 0;
  for (int i = 0; i <= g.n_stacked; ++i) n += matrix(g, i).n;
  return n;
}

// The split-K partial planes of m tokens by n columns (0 in one pass).
size_t split_k_bytes(const PrefillGemmPlan& plan, int64_t m, int64_t n) {
  return plan.k_splits > 1 ? size_t(plan.k_splits) * size_t(m) * size_t(n) * sizeof(float) : 0;
}

bool is_k_type(GgmlType t) {
  return t == GgmlType::Q4_K || t == GgmlType::Q5_K || t == GgmlType::Q6_K;
}

__global__ void activation_bf16_kernel(const float* __restrict__ src, uint16_t* __restrict__ dst, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) dst[i] = prefill_activation_bf16(src[i]);
}

}  // namespace

bool prefill_gemm_device_has_wgmma() {
  int device = 0, major = 0, minor = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  return major == 9 && minor == 0;
}

bool prefill_gemm_supports(GgmlType t) {
  switch (t) {
    case GgmlType::Q4_K: case GgmlType::Q5_K: case GgmlType::Q6_K: case GgmlType::Q8_0:
    case GgmlType::F16: case GgmlType::BF16: case GgmlType::F32:
      return true;
    default:
      return false;
  }
}

PrefillGemmPlan prefill_gemm_plan(const PrefillGemm& g) {
  if (g.w_up) {  // SwiGLU: the grid of one GEMM over both matrices' rows, 128-row tiles, one pass
    PrefillGemm both = g;
    both.w_up = nullptr, both.n = 2 * g.n, both.n_tile = 128, both.k_splits = 1;
    return prefill_gemm_plan(both);
  }
  if (g.n_stacked > 0) {  // the grid of one GEMM over every stacked matrix's rows
    PrefillGemm all = g;
    all.n = launch_columns(g), all.n_stacked = 0;
    return prefill_gemm_plan(all);
  }
  const int sm_count = multiprocessor_count(g);
  const int steps = std::max(1, int(g.k / kBK));
  // The K split (it sets the sums) from the planned shape; the tiles from the launch's.
  const int64_t m = g.m_plan > 0 ? g.m_plan : g.m, n = g.n_plan > 0 ? g.n_plan : g.n;
  const int64_t tiles128 = ((m + 127) / 128) * ((n + 127) / 128);
  // Without split-K, 128-row m-tiles halve the weight dequantization per FLOP, and 64-row tiles
  // double the CTA count when 128 would leave the SMs (two CTAs each) less than two waves of work.
  const bool enough_tiles = tiles128 >= 4 * int64_t(sm_count);
  const size_t workspace_bytes = kPrefillGemmWorkspaceBytes;
  const bool single_pass = g.k_splits == 1 || (g.k_splits == 0 && (enough_tiles || split_k_disabled()));
  PrefillGemmPlan plan;
  plan.wgmma = g.wgmma == 1 || (g.wgmma == 0 && !env_flag("MINFER_NO_WGMMA_GEMM") && prefill_gemm_device_has_wgmma());
  if (single_pass) {
    plan.m_tile = g.m_tile ? g.m_tile : (enough_tiles ? 128 : 64);
  } else {
    // Small grid: split-K restores the CTA count, so the tiles can stay at 128 rows (half the
    // dequantization per FLOP; the cost model counts waves of two per SM) unless m fits in 64.
    plan.k_splits = g.k_splits ? g.k_splits : choose_splits(m, n, steps, tiles128, sm_count, workspace_bytes);
    // Equal slices of whole steps, none empty.
    const int slice = (steps + std::min(plan.k_splits, steps) - 1) / std::min(plan.k_splits, steps);
    plan.k_splits = (steps + slice - 1) / slice;
    plan.m_tile = g.m_tile ? g.m_tile : (g.m <= 64 ? 64 : 128);
  }
  if (!g.m_tile && plan.m_tile == 128 && wide_tiles_fill(g, plan, sm_count)) plan.m_tile = 256;
  plan.warp_specialized = plan.m_tile == 256 && (g.warp_specialized == 1 ||
                                                 (g.warp_specialized == 0 && !env_flag("MINFER_NO_WS_GEMM")));
  if (plan.warp_specialized) {  // persistent: one CTA an SM (or g.ctas) over the work items
    // MINFER_NO_PERSISTENT_GEMM: a CTA an item, the grid before persistence (the same bits).
    const int64_t items = (g.m + 255) / 256 * ((g.n + 127) / 128) * plan.k_splits;
    const int64_t most = g.ctas > 0 ? g.ctas : env_flag("MINFER_NO_PERSISTENT_GEMM") ? items : sm_count;
    plan.ctas = int(std::min<int64_t>(items, most));
    plan.tma = g.tma == 1 || (g.tma == 0 && !env_flag("MINFER_NO_GEMM_TMA"));
    plan.weight_image = g.weight_image == 1 ||
                        (g.weight_image == 0 && g.m >= kPrefillGemmWeightImageMinTokens && g.weight_image_buffer &&
                         g.weight_image_buffer_bytes >= prefill_gemm_weight_image_bytes(g) &&
                         !env_flag("MINFER_NO_GEMM_WEIGHT_IMAGE"));
    if (plan.weight_image) {  // its pass in runs of 2 to 8 K steps a block, about 8 blocks an SM
      const int64_t image_tiles = (g.n + 127) / 128 * steps;  // g: the launch's columns, no SwiGLU pairs
      plan.image_run_steps = int(std::clamp<int64_t>(image_tiles / (8 * int64_t(sm_count)), 2, 8));
    }
  }
  // The n-tile follows the tokens actually present (it does not change any output's sums).
  plan.n_tile = plan_n_tile(g, plan, sm_count);
  return plan;
}

void launch_prefill_gemm(const PrefillGemm& g, cudaStream_t stream) {
  const char* type_name = type_traits(g.w_type).name;
  if (!prefill_gemm_supports(g.w_type)) fail("prefill GEMM: no kernel for weight type ", type_name);
  const int64_t k_multiple = is_k_type(g.w_type) ? QK_K : kBK;
  if (g.k <= 0 || g.k % k_multiple != 0)
    fail("prefill GEMM (", type_name, "): k = ", g.k, " is not a positive multiple of ", k_multiple);
  if (g.m <= 0) fail("prefill GEMM (", type_name, "): m = ", g.m, " must be positive");
  if (g.ldx < g.k || g.ldx % 8 != 0) fail("prefill GEMM: ldx = ", g.ldx, " must be >= k = ", g.k, " and a multiple of 8");
  if (g.m_tile != 0 && g.m_tile != 64 && g.m_tile != 128 && g.m_tile != 256)
    fail("prefill GEMM: m_tile ", g.m_tile, " is not 0, 64, 128 or 256");
  if (g.n_tile != 0 && g.n_tile != 32 && g.n_tile != 64 && g.n_tile != 128)
    fail("prefill GEMM: n_tile ", g.n_tile, " is not 0, 32, 64 or 128");
  if (g.k_splits < 0) fail("prefill GEMM: k_splits ", g.k_splits, " is negative");
  if (g.wgmma < -1 || g.wgmma > 1) fail("prefill GEMM: wgmma ", g.wgmma, " is not -1, 0 or 1");
  if (g.wgmma == 1 && !prefill_gemm_device_has_wgmma()) fail("prefill GEMM: warpgroup MMA needs an sm_90 device");
  if (g.warp_specialized < -1 || g.warp_specialized > 1)
    fail("prefill GEMM: warp_specialized ", g.warp_specialized, " is not -1, 0 or 1");
  if (g.ctas < 0) fail("prefill GEMM: ctas ", g.ctas, " is negative");
  if (g.tma < -1 || g.tma > 1) fail("prefill GEMM: tma ", g.tma, " is not -1, 0 or 1");
  if (g.weight_image < -1 || g.weight_image > 1)
    fail("prefill GEMM: weight_image ", g.weight_image, " is not -1, 0 or 1");
  if (g.m > INT32_MAX || g.n > INT32_MAX || g.k > INT32_MAX)
    fail("prefill GEMM: dimensions ", g.m, " x ", g.n, " x ", g.k, " exceed 32-bit indexing");
  if (!g.x) fail("prefill GEMM: null activation pointer");
  if (reinterpret_cast<uintptr_t>(g.x) % 16 || reinterpret_cast<uintptr_t>(g.residual) % 8)
    fail("prefill GEMM: misaligned pointer (x needs 16 bytes, residual 8)");
  if (g.n_stacked < 0 || g.n_stacked > int(g.stacked.size()))
    fail("prefill GEMM: ", g.n_stacked, " stacked matrices (at most ", g.stacked.size(), ")");
  for (int i = 0; i <= g.n_stacked; ++i) {  // w's matrix, then the stacked ones
    const PrefillGemm::Stacked mat = matrix(g, i);
    if (mat.n <= 0 || mat.n % 2 != 0 || mat.ldy < mat.n || mat.ldy % 2 != 0)
      fail("prefill GEMM (", type_name, "): matrix ", i, ": n = ", mat.n, " must be even and positive, ldy = ",
           mat.ldy, " >= n and even");
    if (i < g.n_stacked && mat.n % 128 != 0)
      fail("prefill GEMM: matrix ", i, " has ", mat.n, " rows (not a multiple of 128) and a stacked one follows");
    if (!mat.w || !mat.y) fail("prefill GEMM: matrix ", i, ": null weight or output pointer");
    if (reinterpret_cast<uintptr_t>(mat.w) % 16 || reinterpret_cast<uintptr_t>(mat.y) % 8 ||
        reinterpret_cast<uintptr_t>(mat.bias) % 8)
      fail("prefill GEMM: matrix ", i, ": misaligned pointer (w needs 16 bytes; y, bias 8)");
  }

  if (g.workspace && reinterpret_cast<uintptr_t>(g.workspace) % 8)
    fail("prefill GEMM: split-K workspace must be 8-byte aligned");

  if (g.w_up) {
    if (g.bias || g.residual) fail("prefill GEMM: the SwiGLU epilogue takes no bias or residual");
    if ((g.n_tile != 0 && g.n_tile != 128) || g.k_splits > 1)
      fail("prefill GEMM: the SwiGLU epilogue runs 128-row n-tiles in one pass (n_tile ", g.n_tile, ", k_splits ",
           g.k_splits, ")");
    if (reinterpret_cast<uintptr_t>(g.w_up) % 16 || reinterpret_cast<uintptr_t>(g.y_bf16) % 4)
      fail("prefill GEMM: misaligned pointer (w_up needs 16 bytes, y_bf16 4)");
  } else if (g.y_bf16) {
    fail("prefill GEMM: y_bf16 is the SwiGLU epilogue's (set w_up)");
  }
  if (g.n_stacked > 0 && (g.w_up || g.residual))
    fail("prefill GEMM: stacked matrices take no SwiGLU or residual");
  const int64_t n_all = launch_columns(g);
  if (n_all > INT32_MAX) fail("prefill GEMM: ", n_all, " columns exceed 32-bit indexing");
  const PrefillGemmPlan plan = prefill_gemm_plan(g);
  if (plan.m_tile == 256 && (!plan.wgmma || plan.n_tile != 128))
    fail("prefill GEMM: 256-token tiles need warpgroup MMA and 128-row n-tiles (n_tile ", plan.n_tile, ")");
  const int steps = int(g.k / kBK);
  GemmParams p{};
  for (int i = 0, n_end = 0; i <= g.n_stacked; ++i) {
    const PrefillGemm::Stacked mat = matrix(g, i);
    n_end += int(mat.n);
    p.seg[i] = {static_cast<const uint8_t*>(mat.w), mat.y, mat.ldy, mat.bias, n_end};
  }
  p.n_segs = 1 + g.n_stacked;
  p.w_row_bytes = device_row_bytes(g.w_type, g.k);
  p.n = int(n_all), p.k = int(g.k), p.m = int(g.m);
  p.x = g.x, p.ldx = g.ldx, p.residual = g.residual;
  p.slice_steps = (steps + plan.k_splits - 1) / plan.k_splits;
  p.w_up = static_cast<const uint8_t*>(g.w_up), p.y_bf16 = g.y_bf16;
  p.a_tma = plan.tma;
  if (plan.weight_image) {
    const size_t need = prefill_gemm_weight_image_bytes(g);
    if (!g.weight_image_buffer || need > g.weight_image_buffer_bytes)
      fail("prefill GEMM: the weight image of ", n_all, " x ", g.k, " needs ", need, " bytes, more than the ",
           g.weight_image_buffer ? g.weight_image_buffer_bytes : 0, " given");
    if (reinterpret_cast<uintptr_t>(g.weight_image_buffer) % 16)
      fail("prefill GEMM: the weight image must be 16-byte aligned");
    p.weight_image = g.weight_image_buffer;
  }
  if (plan.k_splits > 1) {
    const size_t need = split_k_bytes(plan, g.m, n_all);
    if (!g.workspace || need > g.workspace_bytes)
      fail("prefill GEMM: ", plan.k_splits, " K slices of ", g.m, " x ", n_all, " need ", need,
           " bytes of split-K workspace, more than the ", g.workspace ? g.workspace_bytes : 0, " given");
    p.partial = g.workspace;
  }
  switch (g.w_type) {
    case GgmlType::Q4_K: launch_for_type<GgmlType::Q4_K>(p, plan, stream); break;
    case GgmlType::Q5_K: launch_for_type<GgmlType::Q5_K>(p, plan, stream); break;
    case GgmlType::Q6_K: launch_for_type<GgmlType::Q6_K>(p, plan, stream); break;
    case GgmlType::Q8_0: launch_for_type<GgmlType::Q8_0>(p, plan, stream); break;
    case GgmlType::F16: launch_for_type<GgmlType::F16>(p, plan, stream); break;
    case GgmlType::BF16: launch_for_type<GgmlType::BF16>(p, plan, stream); break;
    case GgmlType::F32: launch_for_type<GgmlType::F32>(p, plan, stream); break;
    default: break;
  }
  if (plan.k_splits > 1) {
    constexpr int kBlock = 256;
    const dim3 grid(unsigned((n_all / 2 + kBlock - 1) / kBlock), unsigned(std::min<int64_t>(g.m, 65535)));
    splitk_reduce_kernel<<<grid, kBlock, 0, stream>>>(p, plan.k_splits);
  }
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) fail("CUDA kernel prefill GEMM (", type_name, "): ", cudaGetErrorString(e));
}

size_t prefill_gemm_workspace_bytes(const PrefillGemm& g) {
  const PrefillGemmPlan plan = prefill_gemm_plan(g);
  return split_k_bytes(plan, g.m, launch_columns(g));
}

size_t prefill_gemm_weight_image_bytes(const PrefillGemm& g) {
  const int per_tile = ws_columns_per_tile(g.w_up != nullptr);
  return size_t((launch_columns(g) + per_tile - 1) / per_tile) * size_t(g.k / kBK) * WsShape::kBStageBytes;
}

void launch_prefill_activation_bf16(const float* src, uint16_t* dst, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  constexpr int kBlock = 256;
  activation_bf16_kernel<<<unsigned((n + kBlock - 1) / kBlock), kBlock, 0, stream>>>(src, dst, n);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) fail("CUDA kernel activation_bf16: ", cudaGetErrorString(e));
}

}  // namespace minfer::cuda
