// The decode matmul on int8 tensor cores, for many tokens at once (mma.sync m16n8k32 and, for the
// 16-element scale halves of q6_K, m16n8k16; s8 x s8 -> s32).
//
// The canonical order (kernels.h) sums each output in 8 streams: stream s takes the 256-column
// groups g = s, s + 8, ... in order, and a fixed tree joins the streams. A CTA owns a tile of
// weight rows x tokens and all of K. Its warps split the tile's rows (16 per warp: one m16
// fragment), its tokens (token quarters or halves) and the 8 streams (KS stream sets of 8 / KS
// streams each): the CTA walks K in steps of KS groups, warp k of a step taking group KS i + k,
// which always belongs to its set, so each stream's groups arrive in order and its sum stays in
// the warp's registers. Per step the CTA stages the tokens' activation blocks of those KS groups
// in shared memory (cp.async, one step ahead) with each block's scale and sum as floats, and the
// rows' per-sub-block scales; each warp loads its rows' quants into registers, multiplies the 8
// sub-blocks for every token fragment, turns each exact integer sum into its term (quant_device.cuh,
// the functions the warp-per-row kernel calls) and adds the group's tree to the stream's
// accumulators. At the end each warp joins its own streams (the lower levels of the canonical
// tree), the CTA joins the warps' values (the top levels) and runs the epilogue (bias, residual,
// store / rope / KV write): the same bits as launch_matvec, for any token count.
//
// Within a sub-block the k32 mma's k index is permuted (thread tid supplies elements 8tid..8tid+7 of
// both operands), which leaves the integer sum unchanged and lets each thread load 8 contiguous
// bytes.
#include <algorithm>

#include "backend/cuda/kernels.h"
#include "backend/cuda/prefill_mma.cuh"
#include "backend/cuda/quant_device.cuh"
#include "util/error.h"

namespace minfer::cuda {
namespace {

using prefill_detail::cp_async_commit;
using prefill_detail::cp_async_wait;
using prefill_detail::shared_address;

constexpr int kStreams = 8;
constexpr int kMaxSegs = 3;
constexpr int kGroupBytes = 8 * kPad40Bytes;    // one token's activation blocks of one group
constexpr int kTokenStride = kGroupBytes + 16;  // padded: fewer bank conflicts on the B fragments
constexpr int kRowGroupBytes = 288;  // a row's bytes of one group (q8_0: 272) plus alignment slack

struct MmaArgs {
  MatSeg seg[kMaxSegs];
  int first_tile[kMaxSegs + 1];
  int n_segs;
  const uint8_t* act;
  int64_t act_stride;
  int n_tokens;
  MatVecExtra extra;
};

// Per-(row, sub-block) scale words staged for one fragment's 16 rows and one group (a row is 9
// pairs apart, so the 8 rows a warp reads at once fall in different banks).
struct StagedScales {
  float2 w[16][9];  // [row][j]: q4_K/q5_K: (d*sc, dmin*m); q6_K: (sc_lo, sc_hi) as ints; q8_0: (d, -)
  float d[16];      // q6_K: the row's d
};

// A CTA shape: ROWF row fragments x KS stream sets x TQ token parts, NW token fragments a warp.
// A warp holds (8 / KS) streams x NW fragments x 4 accumulators; the 8-warp shapes fit two CTAs
// an SM, the 16-warp ones one.
template <int ROWF, int KS, int TQ, int NW>
struct Cfg {
  static constexpr int kRowFrags = ROWF, kSets = KS, kTokenParts = TQ, kWarpFrags = NW;
  static constexpr int kWarps = ROWF * KS * TQ;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kCtasPerSm = kWarps <= 8 ? 2 : 1;
  static constexpr int kRows = 16 * ROWF;
  static constexpr int kTokens = 8 * NW * TQ;
  static constexpr int kSlots = kStreams / KS;  // streams a warp sums
  static constexpr int kActBytes = KS * kTokens * kTokenStride;
  static constexpr int kStageBytes = kActBytes + KS * kRows * kRowGroupBytes;  // activations, quants
  static constexpr int kValueBytes = KS * kTokens * 8 * int(sizeof(float2));  // float4 per token pair
  static constexpr int kScaleBytes = ROWF * KS * int(sizeof(StagedScales));
  static constexpr int kLoopBytes = 2 * kStageBytes + kValueBytes + kScaleBytes;
  static constexpr int kJoinBytes = KS * kRows * kTokens * 4;  // the warps' stream joins
  static constexpr int kSmemBytes = kLoopBytes > kJoinBytes ? kLoopBytes : kJoinBytes;
};
using Cfg1 = Cfg<2, 4, 1, 1>;   // <= 8 tokens: 8 warps, 32 rows x 8 tokens
using Cfg2 = Cfg<2, 4, 1, 2>;   // <= 16 tokens: 8 warps, 32 rows x 16 tokens
using Cfg4n = Cfg<2, 4, 2, 2>;  // tiles of 32 tokens, few rows: 16 warps, 32 x 32
using Cfg4w = Cfg<4, 1, 4, 1>;  // tiles of 32 tokens, many rows: 16 warps, 64 x 32
// Launches of at least this many rows take the "many rows" shape (more activation reuse; the few
// rows shape keeps narrow matrices spread over the SMs).
constexpr int kManyRows = 16384;

__device__ __forceinline__ void mma_k32(int (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%0,%1,%2,%3};\n"
               : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void mma_k16(int (&c)[4], uint32_t a0, uint32_t a1, uint32_t b0) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};\n"
               : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
               : "r"(a0), "r"(a1), "r"(b0));
}

// The integer sums of q4_K, q5_K and q8_0 sub-blocks stay below 2^22 in magnitude, so an mma
// accumulator that starts at the bit pattern of 1.5 * 2^23 holds the f32 bits of 1.5 * 2^23 + isum,
// and one subtraction gives isum as f32 exactly (no int-to-float conversion, a slow instruction).
constexpr int kBiasBits = 0x4B400000;
constexpr float kBiasValue = 12582912.0f;
__device__ __forceinline__ float unbias(int c) { return __fsub_rn(__int_as_float(c), kBiasValue); }

__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 4 : 0));
}

// Row m of fragment f of a tile. Roped segments pair the rows: fragment 2q holds the first rows of
// 16 rope pairs, fragment 2q + 1 their partners, so the epilogue finds both halves in the tile.
template <int ROWF>
__device__ __forceinline__ void tile_row(const MatSeg& seg, const MatVecExtra& extra, int tile, int f, int m,
                                         int& row, int& rope_j, bool& valid) {
  rope_j = 0;
  if (seg.epi == Epilogue::RopeQ || seg.epi == Epilogue::RopeK) {
    const int p = tile * (8 * ROWF) + 16 * (f / 2) + m;
    valid = p < seg.w.rows / 2;
    int r0 = 0, r1 = 0;
    if (valid) rope_pair_index(p, extra.rope.head_dim, extra.rope.neox, r0, r1, rope_j);
    row = f % 2 == 0 ? r0 : r1;
  } else {
    row = tile * (16 * ROWF) + 16 * f + m;
    valid = row < seg.w.rows;
  }
  if (!valid) row = 0;  // loads stay in bounds; the result is dropped
}

// ---- weight groups: one thread's quants of rows gid and gid + 8 for one 256-column group -------
// The group's bytes of a row sit in shared memory (staged by cp.async in whole 4- or 16-byte
// pieces, so a row's bytes keep their offset modulo 4). load() points a group at both rows'
// bytes, a_frag(j) / a_half(j, half) read sub-block j's A registers from them (read per
// sub-block, not held: registers go to the accumulators), stage() turns one row's header into
// scale words. bytes(): a row's bytes of one group; offset(): where they start in the tensor.

// Words of a 2-byte-aligned run in shared memory, assembled from aligned loads.
template <int N>
__device__ __forceinline__ void ld_words_a2_shared(const uint8_t* p, uint32_t (&w)[N]) {
  const uintptr_t addr = reinterpret_cast<uintptr_t>(p);
  const uint32_t* base = reinterpret_cast<const uint32_t*>(addr & ~uintptr_t(3));
  const uint32_t shift = uint32_t(addr & 3) * 8;
  uint32_t raw[N + 1];
#pragma unroll
  for (int i = 0; i <= N; ++i) raw[i] = base[i];
#pragma unroll
  for (int i = 0; i < N; ++i) w[i] = __funnelshift_r(raw[i], raw[i + 1], shift);
}
__device__ __forceinline__ uint32_t ld_word_a2_shared(const uint8_t* p) {
  uint32_t w[1];
  ld_words_a2_shared(p, w);
  return w[0];
}
__device__ __forceinline__ uint16_t ld_u16_shared(const uint8_t* p) { return *reinterpret_cast<const uint16_t*>(p); }

template <bool Q5>
struct GroupQK45 {
  static constexpr int kBytes = Q5 ? 176 : 144, kQsOffset = Q5 ? 48 : 16;
  static constexpr bool kHalves = false, kBiased = true, kWholeRuns = true;
  __device__ static int64_t offset(const DevMat& m, int row, int g) { return (int64_t(row) * (m.cols / 256) + g) * kBytes; }
  __device__ static int bytes(const DevMat&, int) { return kBytes; }
  const uint8_t* blk[2];
  int tid;
  __device__ void load(const uint8_t* const (&b)[2], int t) {
    blk[0] = b[0], blk[1] = b[1], tid = t;
  }
  __device__ static uint32_t quants(uint32_t q, uint32_t high, int j) {
    uint32_t v = (q >> (4 * (j & 1))) & 0x0F0F0F0Fu;
    if (Q5) v |= ((high >> j) & 0x01010101u) << 4;
    return v;
  }
  // Bytes 32 (j / 2) + 8 tid .. + 8 of qs (and 8 tid .. + 8 of qh) of both rows.
  __device__ void a_frag(int j, uint32_t (&a)[4]) const {
    uint2 qs[2], qh[2] = {};
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      qs[h] = *reinterpret_cast<const uint2*>(blk[h] + kQsOffset + 32 * (j / 2) + 8 * tid);
      if (Q5) qh[h] = *reinterpret_cast<const uint2*>(blk[h] + 16 + 8 * tid);
    }
    a[0] = quants(qs[0].x, qh[0].x, j);
    a[1] = quants(qs[1].x, qh[1].x, j);
    a[2] = quants(qs[0].y, qh[0].y, j);
    a[3] = quants(qs[1].y, qh[1].y, j);
  }
  __device__ static void stage(const uint8_t* blk, int, StagedScales& s, int slot) {
    const uint4 h = *reinterpret_cast<const uint4*>(blk);
    const float d = h2f(uint16_t(h.x)), dmin = h2f(uint16_t(h.x >> 16));
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      int sc, mn;
      k_scale_min(h, j, sc, mn);
      s.w[slot][j] = make_float2(qk_scale(d, sc), qk_scale(dmin, mn));
    }
  }
  __device__ static float term(float2 w, float, int c, int, float asum, float da) {
    return term_qk(w.x, w.y, unbias(c), asum, da);
  }
};

// q6_K: sub-block j = elements 32j..32j+31 of the super-block (halves lo/hi: l = 0..15, 16..31,
// one int8 scale each). With hh = j / 4, kq = j % 4, element l's low 4 bits are nibble kq / 2 of
// ql[64 hh + 32 (kq & 1) + l] and its high 2 bits are bits 2 kq of qh[32 hh + l].
struct GroupQ6K {
  static constexpr bool kHalves = true;   // two k16 products per sub-block (one scale each half)
  static constexpr bool kBiased = false;  // the scaled sums reach 2^24
  static constexpr bool kWholeRuns = false;
  __device__ static int64_t offset(const DevMat& m, int row, int g) { return (int64_t(row) * (m.cols / 256) + g) * 210; }
  __device__ static int bytes(const DevMat&, int) { return 210; }
  const uint8_t* blk[2];
  int tid;
  __device__ void load(const uint8_t* const (&b)[2], int t) {
    blk[0] = b[0], blk[1] = b[1], tid = t;
  }
  __device__ static uint32_t quants(uint32_t low, uint32_t high, int kq) {
    const uint32_t q = ((low >> (4 * (kq >> 1))) & 0x0F0F0F0Fu) | (((high >> (2 * kq)) & 0x03030303u) << 4);
    return __vsub4(q, 0x20202020u);
  }
  // The k16 A registers of sub-block j, half `half`: rows gid and gid + 8 (bytes 4 tid .. + 4 of
  // the half's 16-byte runs of ql and qh).
  __device__ void a_half(int j, int half, uint32_t& a0, uint32_t& a1) const {
    const int hh = j / 4, kq = j % 4;
    const int ql_at = 64 * hh + 32 * (kq & 1) + 16 * half + 4 * tid, qh_at = 128 + 32 * hh + 16 * half + 4 * tid;
    a0 = quants(ld_word_a2_shared(blk[0] + ql_at), ld_word_a2_shared(blk[0] + qh_at), kq);
    a1 = quants(ld_word_a2_shared(blk[1] + ql_at), ld_word_a2_shared(blk[1] + qh_at), kq);
  }
  __device__ static void stage(const uint8_t* blk, int, StagedScales& s, int slot) {
    uint32_t sc[4];
    ld_words_a2_shared(blk + 192, sc);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int lo = int(int8_t(sc[j / 2] >> (16 * (j & 1)))), hi = int(int8_t(sc[j / 2] >> (16 * (j & 1) + 8)));
      s.w[slot][j] = make_float2(__int_as_float(lo), __int_as_float(hi));
    }
    s.d[slot] = h2f(ld_u16_shared(blk + 208));
  }
  __device__ static float term(float2 w, float d, int isum_lo, int isum_hi, float, float da) {
    return term_q6k(d, __float_as_int(w.x) * isum_lo + __float_as_int(w.y) * isum_hi, da);
  }
};

// q8_0: sub-block j = block 8g + j (34 bytes: f16 d, 32 int8); the last group may be partial.
struct GroupQ8 {
  static constexpr bool kHalves = false, kBiased = true, kWholeRuns = false;
  __device__ static int64_t offset(const DevMat& m, int row, int g) { return (int64_t(row) * (m.cols / 32) + 8 * g) * 34; }
  __device__ static int bytes(const DevMat& m, int g) { return min(8, m.cols / 32 - 8 * g) * 34; }
  const uint8_t* blk[2];
  int tid;
  __device__ void load(const uint8_t* const (&b)[2], int t) {
    blk[0] = b[0], blk[1] = b[1], tid = t;
  }
  // Bytes 8 tid .. + 8 of block j's quants of both rows (zeros past the row).
  __device__ void a_frag(int j, uint32_t (&a)[4]) const {
    uint32_t q[2][2];
#pragma unroll
    for (int h = 0; h < 2; ++h) ld_words_a2_shared(blk[h] + 34 * j + 2 + 8 * tid, q[h]);
    a[0] = q[0][0];
    a[1] = q[1][0];
    a[2] = q[0][1];
    a[3] = q[1][1];
  }
  __device__ static void stage(const uint8_t* blk, int n_valid, StagedScales& s, int slot) {
#pragma unroll
    for (int j = 0; j < 8; ++j) s.w[slot][j].x = j < n_valid ? h2f(ld_u16_shared(blk + 34 * j)) : 0.0f;
  }
  __device__ static float term(float2 w, float, int c, int, float, float da) {
    return term_q8_0(w.x, unbias(c), da);
  }
};

// Copies step i's data into a stage buffer: the activation blocks of groups [KS i, KS i + KS) for
// the tile's tokens (zeros past the row's end; tokens past the last are copies of it, their
// results dropped), and each tile row's bytes of those groups as whole 4-byte words (so the bytes
// keep their offset modulo 4; zeros past the row's end).
template <typename C, typename Group>
__device__ __forceinline__ void stage_step(const MmaArgs& a, const MatSeg& seg, int tile, int i, int t0, uint32_t dst) {
  const DevMat& m = seg.w;
  const int n_blocks = m.cols / 32, n_groups = (m.cols + 255) / 256;
  const bool aligned = (a.act_stride & 15) == 0;
  const int unit = aligned ? 16 : 4;  // rows of an odd number of 32-blocks: 4-byte copies
  const int per_token = kGroupBytes / unit;
  for (int v = threadIdx.x; v < C::kSets * C::kTokens * per_token; v += C::kThreads) {
    const int k = v / (C::kTokens * per_token), t = v / per_token % C::kTokens, piece = v % per_token;
    const int g = C::kSets * i + k;
    const int valid_bytes = max(0, min(8, n_blocks - 8 * g)) * kPad40Bytes;
    const bool valid = unit * piece < valid_bytes;
    const uint8_t* src = a.act + size_t(min(t0 + t, a.n_tokens - 1)) * a.act_stride +
                         (valid ? size_t(g) * kGroupBytes + size_t(unit) * piece : 0);
    const uint32_t to = dst + (k * C::kTokens + t) * kTokenStride + unit * piece;
    if (aligned)
      prefill_detail::cp_async16(to, src, valid);
    else
      cp_async4(to, src, valid);
  }
  // Rows of whole 16-byte runs (q4_K, q5_K in a 16-byte aligned tensor) copy 16 bytes at a time.
  const bool wide = Group::kWholeRuns && (reinterpret_cast<uintptr_t>(m.data) & 15) == 0;
  const int row_unit = wide ? 16 : 4, per_row = kRowGroupBytes / row_unit;
  const uint32_t quant_dst = dst + C::kActBytes;
  for (int v = threadIdx.x; v < C::kSets * C::kRows * per_row; v += C::kThreads) {
    const int k = v / (C::kRows * per_row), r = v / per_row % C::kRows, piece = v % per_row;
    const int g = C::kSets * i + k;
    int row, unused_j;
    bool unused_ok;
    tile_row<C::kRowFrags>(seg, a.extra, tile, r / 16, r % 16, row, unused_j, unused_ok);
    const uint8_t* start = m.data + (g < n_groups ? Group::offset(m, row, g) : 0);
    const uint8_t* base = reinterpret_cast<const uint8_t*>(reinterpret_cast<uintptr_t>(start) & ~uintptr_t(3));
    const int end = int(start - base) + (g < n_groups ? Group::bytes(m, g) : 0);  // bytes from base
    const uint32_t to = quant_dst + (k * C::kRows + r) * kRowGroupBytes + row_unit * piece;
    const bool valid = row_unit * piece < end;
    const uint8_t* src = valid ? base + row_unit * piece : base;
    if (wide)
      prefill_detail::cp_async16(to, src, valid);
    else
      cp_async4(to, src, valid);
  }
}

// A tile row's bytes of group g in the stage buffer (the slot plus the offset modulo 4).
template <typename C, typename Group>
__device__ __forceinline__ const uint8_t* staged_row(const uint8_t* stage, const MatSeg& seg, const MmaArgs& a, int tile,
                                                     int k, int r, int g) {
  int row, unused_j;
  bool unused_ok;
  tile_row<C::kRowFrags>(seg, a.extra, tile, r / 16, r % 16, row, unused_j, unused_ok);
  const uintptr_t start = reinterpret_cast<uintptr_t>(seg.w.data + Group::offset(seg.w, row, g));
  return stage + C::kActBytes + (k * C::kRows + r) * kRowGroupBytes + (start & 3);
}

// The lower levels of the canonical stream tree over a warp's slots (stream k + KS s in slot s),
// and the top levels over the KS sets' values.
template <int KS>
__device__ __forceinline__ float join_slots(const float* v) {
  if constexpr (KS == 1) return __fadd_rn(__fadd_rn(__fadd_rn(v[0], v[4]), __fadd_rn(v[2], v[6])),
                                          __fadd_rn(__fadd_rn(v[1], v[5]), __fadd_rn(v[3], v[7])));
  if constexpr (KS == 2) return __fadd_rn(__fadd_rn(v[0], v[2]), __fadd_rn(v[1], v[3]));
  if constexpr (KS == 4) return __fadd_rn(v[0], v[1]);
  return v[0];
}
template <int KS>
__device__ __forceinline__ float join_sets(const float* w) {
  if constexpr (KS == 1) return w[0];
  if constexpr (KS == 2) return __fadd_rn(w[0], w[1]);
  if constexpr (KS == 4) return __fadd_rn(__fadd_rn(w[0], w[2]), __fadd_rn(w[1], w[3]));
  return __fadd_rn(__fadd_rn(__fadd_rn(w[0], w[4]), __fadd_rn(w[2], w[6])),
                   __fadd_rn(__fadd_rn(w[1], w[5]), __fadd_rn(w[3], w[7])));
}

// The tile's streams: every warp's slots, accumulated over K.
template <typename C, typename Group>
__device__ void tile_streams(const MmaArgs& a, const MatSeg& seg, int tile, int t0, uint8_t* smem,
                             float (&acc)[C::kSlots][C::kWarpFrags][4]) {
  const DevMat& m = seg.w;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gid = lane / 4, tid = lane % 4;
  const int q = warp % C::kTokenParts, k = warp / C::kTokenParts % C::kSets, f = warp / (C::kTokenParts * C::kSets);
  const int n_groups = (m.cols + 255) / 256, n_blocks = m.cols / 32;
  const int n_steps = (n_groups + C::kSets - 1) / C::kSets;
  const uint32_t act_smem = shared_address(smem);
  // [set][token pair][j]: (da, asum) of tokens 2p and 2p + 1
  float4* values = reinterpret_cast<float4*>(smem + 2 * C::kStageBytes);
  StagedScales* scales = reinterpret_cast<StagedScales*>(smem + 2 * C::kStageBytes + C::kValueBytes);
  StagedScales& staged = scales[f * C::kSets + k];

  stage_step<C, Group>(a, seg, tile, 0, t0, act_smem);
  cp_async_commit();
  for (int i0 = 0; i0 < n_steps; i0 += C::kSlots) {
#pragma unroll
    for (int s = 0; s < C::kSlots; ++s) {  // step i = i0 + s: group KS i + k is stream k + KS s
      const int i = i0 + s;
      if (i >= n_steps) break;  // uniform over the CTA
      const int buffer = i & 1, g = C::kSets * i + k;
      cp_async_wait<0>();
      __syncthreads();  // this step's data are in; every warp is done with the previous step
      if (i + 1 < n_steps) stage_step<C, Group>(a, seg, tile, i + 1, t0, act_smem + (buffer ^ 1) * C::kStageBytes);
      cp_async_commit();
      const uint8_t* stage = smem + buffer * C::kStageBytes;
      for (int v = threadIdx.x; v < C::kSets * C::kTokens / 2 * 8; v += C::kThreads) {
        const int pair = v / 8, j = v % 8;  // (set, token pair) and sub-block
        const ActQ8 b0{stage + (2 * pair) * kTokenStride + j * kPad40Bytes};
        const ActQ8 b1{stage + (2 * pair + 1) * kTokenStride + j * kPad40Bytes};
        values[v] = make_float4(b0.d(), __int2float_rn(b0.sum()), b1.d(), __int2float_rn(b1.sum()));
      }
      if (q == 0 && lane < 16 && g < n_groups)
        Group::stage(staged_row<C, Group>(stage, seg, a, tile, k, 16 * f + lane, g), min(8, n_blocks - 8 * g), staged, lane);
      __syncthreads();  // token values and scales are staged
      if (g >= n_groups) continue;
      Group cur;
      {
        const uint8_t* blk[2] = {staged_row<C, Group>(stage, seg, a, tile, k, 16 * f + gid, g),
                                 staged_row<C, Group>(stage, seg, a, tile, k, 16 * f + gid + 8, g)};
        cur.load(blk, tid);
      }
      const uint8_t* act = stage + k * C::kTokens * kTokenStride;
      const float4* tv = values + k * (C::kTokens / 2) * 8;
      // The group's tree per output, j outer: E holds T_{2p}, then P = E + T_{2p+1};
      // Q = P01 (+ P23), R = P45; the group = Q + (R + P67).
      float E[C::kWarpFrags][4], Q[C::kWarpFrags][4], R[C::kWarpFrags][4];
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const bool in_row = 8 * g + j < n_blocks;
        uint32_t af[4] = {0, 0, 0, 0}, ah[4] = {0, 0, 0, 0};
        if constexpr (Group::kHalves) {
          cur.a_half(j, 0, af[0], af[1]);
          cur.a_half(j, 1, ah[0], ah[1]);
        } else {
          cur.a_frag(j, af);
        }
        const float2 w[2] = {staged.w[gid][j], staged.w[gid + 8][j]};
        const float dq[2] = {Group::kHalves ? staged.d[gid] : 0.0f, Group::kHalves ? staged.d[gid + 8] : 0.0f};
#pragma unroll
        for (int nf = 0; nf < C::kWarpFrags; ++nf) {
          const int tf = q * C::kWarpFrags + nf;  // the tile's token fragment
          float term[4] = {0.0f, 0.0f, 0.0f, 0.0f};
          if (in_row) {
            const uint8_t* b = act + (8 * tf + gid) * kTokenStride + j * kPad40Bytes;
            const int init = Group::kBiased ? kBiasBits : 0;
            int c[4] = {init, init, init, init}, c_hi[4] = {};
            if constexpr (Group::kHalves) {
              mma_k16(c, af[0], af[1], ld4(b + 4 + 4 * tid));
              mma_k16(c_hi, ah[0], ah[1], ld4(b + 20 + 4 * tid));
            } else {
              mma_k32(c, af, ld4(b + 4 + 8 * tid), ld4(b + 8 + 8 * tid));
            }
            const float4 v = tv[(4 * tf + tid) * 8 + j];  // tokens 8 tf + 2 tid and + 1
#pragma unroll
            for (int e = 0; e < 4; ++e)
              term[e] = Group::term(w[e >> 1], dq[e >> 1], c[e], c_hi[e], (e & 1) ? v.w : v.y, (e & 1) ? v.z : v.x);
          }
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            if (j % 2 == 0) {
              E[nf][e] = term[e];
              continue;
            }
            const float p = __fadd_rn(E[nf][e], term[e]);
            if (j == 1) Q[nf][e] = p;
            if (j == 3) Q[nf][e] = __fadd_rn(Q[nf][e], p);
            if (j == 5) R[nf][e] = p;
            if (j == 7) acc[s][nf][e] = __fadd_rn(acc[s][nf][e], __fadd_rn(Q[nf][e], __fadd_rn(R[nf][e], p)));
          }
        }
      }
    }
  }
}

// REQUIRES: blockDim.x == C::kThreads; gridDim.x = the segments' tiles x token tiles, the token
// tile fastest (the CTAs that read the same weights run together); dynamic shared memory
// C::kSmemBytes. Every thread reaches every barrier: rows and tokens past the end are computed on
// clamped indices and dropped at the store.
template <typename C>
__global__ void __launch_bounds__(C::kThreads, C::kCtasPerSm) matmul_mma_kernel(const __grid_constant__ MmaArgs a) {
  extern __shared__ __align__(16) uint8_t smem[];
  const int token_tiles = (a.n_tokens + C::kTokens - 1) / C::kTokens;
  const int tile_index = int(blockIdx.x) / token_tiles;
  int si = 0;
  while (si + 1 < a.n_segs && tile_index >= a.first_tile[si + 1]) ++si;
  const MatSeg& seg = a.seg[si];
  const int tile = tile_index - a.first_tile[si];
  const int t0 = int(blockIdx.x) % token_tiles * C::kTokens;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gid = lane / 4, tid = lane % 4;
  const int q = warp % C::kTokenParts, k = warp / C::kTokenParts % C::kSets, f = warp / (C::kTokenParts * C::kSets);

  float acc[C::kSlots][C::kWarpFrags][4];
#pragma unroll
  for (int s = 0; s < C::kSlots; ++s)
#pragma unroll
    for (int nf = 0; nf < C::kWarpFrags; ++nf)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[s][nf][e] = 0.0f;
  switch (seg.w.type) {  // uniform over the CTA
    case GgmlType::Q4_K: tile_streams<C, GroupQK45<false>>(a, seg, tile, t0, smem, acc); break;
    case GgmlType::Q5_K: tile_streams<C, GroupQK45<true>>(a, seg, tile, t0, smem, acc); break;
    case GgmlType::Q6_K: tile_streams<C, GroupQ6K>(a, seg, tile, t0, smem, acc); break;
    case GgmlType::Q8_0: tile_streams<C, GroupQ8>(a, seg, tile, t0, smem, acc); break;
    default: break;  // the launcher only sends supported types
  }

  // Each warp's join of its streams, then the sets' join and the epilogue.
  __syncthreads();  // the loop's shared memory becomes the join area: [set][tile row][token]
  float* joined = reinterpret_cast<float*>(smem);
#pragma unroll
  for (int nf = 0; nf < C::kWarpFrags; ++nf)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float v[C::kSlots];
#pragma unroll
      for (int s = 0; s < C::kSlots; ++s) v[s] = acc[s][nf][e];
      const int r = 16 * f + gid + 8 * (e >> 1), t = 8 * (q * C::kWarpFrags + nf) + 2 * tid + (e & 1);
      joined[(k * C::kRows + r) * C::kTokens + t] = join_slots<C::kSets>(v);
    }
  __syncthreads();
  const bool roped = seg.epi == Epilogue::RopeQ || seg.epi == Epilogue::RopeK;
  const int items = (roped ? C::kRows / 2 : C::kRows) * C::kTokens;
  for (int i = threadIdx.x; i < items; i += C::kThreads) {
    const int t = i % C::kTokens, item = i / C::kTokens;
    if (t0 + t >= a.n_tokens) continue;
    // tile rows of the item: a rope pair (fragment 2p / 2p + 1, row m) or one row
    const int fr0 = roped ? 2 * (item / 16) : item / 16, m = item % 16;
    int r0, r1 = -1, rope_j = 0, unused;
    bool ok0, ok1 = false;
    tile_row<C::kRowFrags>(seg, a.extra, tile, fr0, m, r0, rope_j, ok0);
    if (roped) tile_row<C::kRowFrags>(seg, a.extra, tile, fr0 + 1, m, r1, unused, ok1);
    if (!ok0) continue;
    float w0[C::kSets], w1[C::kSets];
#pragma unroll
    for (int ks = 0; ks < C::kSets; ++ks) {
      w0[ks] = joined[(ks * C::kRows + 16 * fr0 + m) * C::kTokens + t];
      w1[ks] = roped ? joined[(ks * C::kRows + 16 * (fr0 + 1) + m) * C::kTokens + t] : 0.0f;
    }
    store_pair(seg, a.extra, t0 + t, r0, r1, rope_j, ok1, join_sets<C::kSets>(w0), join_sets<C::kSets>(w1));
  }
}

template <typename C>
void set_smem() {
  const cudaError_t e = cudaFuncSetAttribute(reinterpret_cast<const void*>(matmul_mma_kernel<C>),
                                             cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmemBytes);
  if (e != cudaSuccess)
    fail("matmul_mma: cannot reserve ", C::kSmemBytes, " bytes of shared memory: ", cudaGetErrorString(e));
}

template <typename C>
void launch(MmaArgs a, const MatSeg* segs, int n_segs, cudaStream_t s) {
  int tiles = 0;
  for (int i = 0; i < n_segs; ++i) {
    a.first_tile[i] = tiles;
    const bool roped = segs[i].epi == Epilogue::RopeQ || segs[i].epi == Epilogue::RopeK;
    tiles += roped ? (segs[i].w.rows / 2 + C::kRows / 2 - 1) / (C::kRows / 2) : (segs[i].w.rows + C::kRows - 1) / C::kRows;
  }
  a.first_tile[n_segs] = tiles;
  const int token_tiles = (a.n_tokens + C::kTokens - 1) / C::kTokens;
  matmul_mma_kernel<C><<<tiles * token_tiles, C::kThreads, C::kSmemBytes, s>>>(a);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) fail("CUDA kernel matmul_mma: ", cudaGetErrorString(e));
}

}  // namespace

bool matmul_mma_supports(GgmlType t) {
  return t == GgmlType::Q4_K || t == GgmlType::Q5_K || t == GgmlType::Q6_K || t == GgmlType::Q8_0;
}

void init_matmul_mma_kernels() {
  set_smem<Cfg1>();
  set_smem<Cfg2>();
  set_smem<Cfg4n>();
  set_smem<Cfg4w>();
}

void launch_matmul_mma(const MatSeg* segs, int n_segs, const uint8_t* act_q8, int64_t act_q8_stride,
                       int n_tokens, const MatVecExtra& extra, cudaStream_t s) {
  if (n_segs < 1 || n_segs > kMaxSegs) fail("matmul_mma: ", n_segs, " segments (1..3 supported)");
  if (n_tokens <= 0) return;
  MmaArgs a{};
  a.n_segs = n_segs;
  int64_t rows = 0;
  for (int i = 0; i < n_segs; ++i) {
    const MatSeg& seg = segs[i];
    if (!matmul_mma_supports(seg.w.type))
      fail("matmul_mma: no kernel for weight type ", type_traits(seg.w.type).name);
    if (seg.w.cols % type_traits(seg.w.type).block_size != 0)
      fail("matmul_mma: rows of ", seg.w.cols, " do not fill whole blocks");
    a.seg[i] = seg;
    rows += seg.w.rows;
  }
  a.act = act_q8;
  a.act_stride = act_q8_stride;
  a.n_tokens = n_tokens;
  a.extra = extra;
  if (n_tokens <= 8)
    launch<Cfg1>(a, segs, n_segs, s);
  else if (n_tokens <= 16)
    launch<Cfg2>(a, segs, n_segs, s);
  else if (rows >= kManyRows)
    launch<Cfg4w>(a, segs, n_segs, s);
  else
    launch<Cfg4n>(a, segs, n_segs, s);
}

}  // namespace minfer::cuda
