// The decode matmul on int8 tensor cores, for many tokens at once (mma.sync m16n8k32 and, for the
// 16-element scale halves of q6_K, m16n8k16; s8 x s8 -> s32).
//
// A CTA of 8 warps owns a tile of 16 weight rows (one m16 fragment) and up to 32 tokens (NTF <= 4
// n8 fragments = tiles of the q8 plane, whose layout makes each B fragment one contiguous 256-byte
// run, a thread's 8 bytes one aligned load, and every fragment and sub-block of a group an
// immediate offset from one pointer). Warp w sums stream w of the canonical order
// (quant/canonical_dot.h): the 256-column groups g = w, w + 8, ... in order, the next group's
// weight lines prefetched to L2 while this one is multiplied (or, where a tile's rows have more
// groups than the 8 streams at one token fragment, the tile's weights streamed into shared memory
// by the tensor memory accelerator: matmul_mma_weight_ring_kernel, one tile a CTA or several for
// gate/up and the head; or the next group's weights already in a second register set:
// matmul_mma_two_groups_kernel). A launch serves one weight type (launch_matmul_mma splits mixed segments), so each
// kernel's registers are what its type needs — except q4_K with q6_K at one token fragment, where
// both kernels have the same registers (matmul_mma_q4k_q6k_kernel).
// For each sub-block j of a group it unpacks the A fragment once and multiplies it with every token
// fragment, accumulating the group's exact integer sums per (row, token):
//   q4_K / q5_K  S += sc_j * isum_j (integer multiply-add on the product); after the group
//                M = sum_j m_j * asum_j on the tensor cores from the plane's sum digits
//                (asum_j = 64 h_j + l_j): A = the row's 8 m_j, B = the digits, two k16 products a
//                token fragment (even and odd tokens), M = C_l + 64 C_h;
//   q6_K         two k16 products, S += sc_lo * isum_lo + sc_hi * isum_hi;
//   q8_0         one float term per block, added by the canonical tree as they come.
// close() then adds what the group needs beyond its sub-blocks (q4_K / q5_K: M; taking M out of
// the sub-block loop freed 16 registers a thread and 4 mma a sub-block: +8 % at 64 sequences).
// Then it forms one term per (row, token) (quant_device.cuh, the same functions the warp-per-row
// kernel calls) and adds it to its stream. The CTA combines the 8 streams in shared
// memory with the canonical tree and runs the segment epilogue (bias, residual, store / rope / KV
// write). Integer sums are exact in any order, so every output element gets the same bits as from
// launch_matvec, for any token count.
//
// Within a sub-block the mma's k index is permuted (thread tid supplies elements 8tid..8tid+7 of
// both operands; 4tid..4tid+3 of each half for k16), which leaves the integer sum unchanged and
// lets each thread load contiguous bytes.
#include <algorithm>
#include <type_traits>

#include "backend/cuda/kernels.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/prefill.h"
#include "backend/cuda/prefill_mma.cuh"
#include "backend/cuda/quant_device.cuh"
#include "util/error.h"

namespace minfer::cuda {
namespace {

using prefill_detail::bulk_copy_to_shared;
using prefill_detail::l2_policy_streaming;
using prefill_detail::tma_load_2d;
using prefill_detail::fence_proxy_async_shared;
using prefill_detail::mbarrier_arrive;
using prefill_detail::mbarrier_expect_tx;
using prefill_detail::mbarrier_init;
using prefill_detail::mbarrier_wait;
using prefill_detail::shared_address;
using prefill_detail::shared_fetch_add_acq_rel;

constexpr int kWarps = 8;      // = the 8 streams of the canonical order
constexpr int kThreads = kWarps * 32;
constexpr int kTileRows = 16;  // one m16 fragment: thread rows gid and gid + 8
// The CTA's shared memory: each warp's stream values (4 per token fragment) for every lane.
template <int NTF>
constexpr int kReduceFloats = kWarps * NTF * 4 * 32;
// CTAs an SM holds (the kernel's launch bounds, so its register budget): 3 at one token fragment
// (80 registers, no spills; +2.5 % at 8 sequences against 2), 2 above it (128 registers; 80 would
// spill).
template <int NTF>
constexpr int kCtasPerSm = NTF == 1 ? 3 : 2;
// The kernel with the activations in shared memory (matmul_mma_shared_activations_kernel): 4
// CTAs an SM (64 registers), each holding fragment 0 of the plane's blocks, 256 bytes a block, so
// rows of up to 6,144 columns (48 KB; four such CTAs and their reduction buffers fit an SM's 228
// KB).
constexpr int kSharedActivationsCtasPerSm = 4;
constexpr int kSharedActivationsMaxCols = 6144;
constexpr int kFragmentBytesPerBlock = 256;

struct MmaArgs {
  MatSeg seg[kMaxMatSegs];
  int first_block[kMaxMatSegs + 1];
  int n_segs;
  Q8Plane act;
  int n_tokens;
  MatVecExtra extra;
  // A launch after this matmul's first launch of another weight type (MatVecExtra::
  // types_side_by_side): it runs beside that launch, lets the next kernel launch at its start and
  // waits for the launch before it only before its CTAs exit (the weight rings; every other kernel
  // waits first as always).
  bool beside_predecessor;
};

__device__ __forceinline__ void mma_k32(int (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%0,%1,%2,%3};\n"
               : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// The same with A's bytes unsigned (0..255).
__device__ __forceinline__ void mma_k32_unsigned_a(int (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%0,%1,%2,%3};\n"
               : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void mma_k16(int (&c)[4], uint32_t a0, uint32_t a1, uint32_t b0) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};\n"
               : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
               : "r"(a0), "r"(a1), "r"(b0));
}

// The two B registers of one token's sub-block: 8 contiguous bytes, or two words (k16 halves).
// Volatile so the compiler keeps the loads where tile_streams issues them (Group::kBLead
// sub-blocks ahead) instead of hoisting every load of the group: the registers that takes spill,
// and spills cost more than the latency hidden (one sub-block ahead was 4 % slower at 32 and 64
// sequences while the kernels spilled, faster once the M products left the sub-block loop).
__device__ __forceinline__ uint2 ldg_b_run(const uint8_t* p) {
  uint2 v;
  asm volatile("ld.global.nc.v2.b32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
  return v;
}
__device__ __forceinline__ uint2 ldg_b_pair(const uint8_t* p0, const uint8_t* p1) {
  uint2 v;
  asm volatile("ld.global.nc.b32 %0, [%1];" : "=r"(v.x) : "l"(p0));
  asm volatile("ld.global.nc.b32 %0, [%1];" : "=r"(v.y) : "l"(p1));
  return v;
}
// Asks L2 for the line holding p (the next group's weights, while this group is multiplied).
__device__ __forceinline__ void prefetch_l2(const uint8_t* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

// Where a group's bytes are read from: the weights in global memory (through the read-only
// cache), or a stage of the weight ring in shared memory (matmul_mma_weight_ring_kernel), as
// shared-space addresses.
struct FromGlobal {
  using Ptr = const uint8_t*;
  __device__ static uint4 v4(Ptr p) { return ld16(p); }
  __device__ static uint2 v2(Ptr p) { return __ldg(reinterpret_cast<const uint2*>(p)); }
  __device__ static uint32_t word(Ptr p) { return ldg_word(p); }
  __device__ static uint16_t u16(Ptr p) { return ld_u16(p); }
};
struct FromShared {
  using Ptr = uint32_t;
  __device__ static uint4 v4(Ptr p) { return prefill_detail::lds128(p); }
  __device__ static uint2 v2(Ptr p) { return prefill_detail::lds64(p); }
  __device__ static uint32_t word(Ptr p) { return prefill_detail::lds32(p); }
  __device__ static uint16_t u16(Ptr p) { return prefill_detail::lds16(p); }
};

// ---- weight groups: one thread's 2 rows (R[0] = tile row gid, R[1] = gid + 8) of one group ----
// load() reads the group's bytes (load_row<From>(r, b): row r's, from b); b_operand(q, tid) loads a token's B registers of one sub-block
// from its 32 quants q; multiply(j, b, ...) multiplies sub-block j (plane block blk = 8g + j) with
// every token fragment (b[nf]: column gid of fragment nf) into the per-fragment state Part;
// close(tok, g, lane, part) completes the group's Parts after its 8 sub-blocks; finish() turns a
// Part into the 4 terms of the thread's C fragment (element e: row R[e / 2], token 2 tid + e % 2),
// da[e % 2] being the group scales of the thread's two tokens.

// The CTA's tokens first .. first + 8 NTF - 1 of the plane (first % (8 NTF) == 0, so its fragments
// lie in one 32-token tile of the plane). Tokens past the last read the tile's padding (quants and
// scales; their results are dropped).
struct Tokens {
  Q8Plane plane;
  int first;
  // The group scales of tokens t and t + 1 (t even): one aligned 4-byte load (scales are group-major).
  __device__ float2 scale_pair(int t, int g) const {
    return __half22float2(__ldg(reinterpret_cast<const __half2*>(plane.scale(first + t, g))));
  }
};

template <bool Q5>
struct GroupQK45 {
  static constexpr int kBytes = Q5 ? 176 : 144, kQsOffset = Q5 ? 48 : 16;
  struct Part {
    int s[4], m[4];
  };
  static constexpr int kGroupBytes = kBytes;
  static constexpr bool kPartialGroups = false;  // rows of whole groups (cols % 256 == 0)
  static constexpr int kBLead = 2;               // sub-blocks of B loads in flight ahead (NTF > 1)
  static constexpr bool kSeveralTilesACta = true;  // at one fragment (matmul_mma_kernel)
  static constexpr bool kTwoGroupsInFlight = true;  // at one fragment (matmul_mma_two_groups_kernel)
  // At one fragment with B from shared memory (matmul_mma_shared_activations_kernel): q4_K, in 64
  // registers without spills; q5_K not measured.
  static constexpr bool kSharedActivations = !Q5;
  // At one fragment, the weight ring over several row tiles a CTA (gate/up): q4_K; q5_K not
  // measured.
  static constexpr bool kRingOverTiles = !Q5;
  __device__ static const uint8_t* group_base(const DevMat& m, int row, int g) {
    return m.data + (size_t(row) * (m.cols / 256) + g) * kBytes;
  }
  // [row]: x = d, dmin (f16); after load() the 6-bit scales and mins of the 8 sub-blocks, one byte
  // each, unpacked once a group: y = sc 0-3, z = m 0-3, w = sc 4-7, and m_hi = m 4-7.
  uint4 h[2];
  uint32_t m_hi[2];
  uint2 qs[2][4];  // [row][pair]: bytes 32 pair + 8 tid .. + 8 of qs
  uint2 qh[2];     // q5_K: bytes 8 tid .. + 8 of qh
  // Row r's bytes of the group, from b.
  template <typename From>
  __device__ void load_row(int r, typename From::Ptr b, int tid) {
    const uint4 raw = From::v4(b);  // y, z, w: the 12 packed scale bytes (k_scale_min)
    const KScaleBytes k = unpack_k_scales(raw.y, raw.z, raw.w);
    h[r] = make_uint4(raw.x, k.sc_lo, k.m_lo, k.sc_hi);
    m_hi[r] = k.m_hi;
#pragma unroll
    for (int p = 0; p < 4; ++p) qs[r][p] = From::v2(b + (kQsOffset + 8 * tid) + 32 * p);
    if (Q5) qh[r] = From::v2(b + 16 + 8 * tid);
  }
  __device__ void load(const DevMat& m, const int (&R)[2], int g, int tid) {
    const int nsb = m.cols / 256;
#pragma unroll
    for (int r = 0; r < 2; ++r) load_row<FromGlobal>(r, m.data + (size_t(R[r]) * nsb + g) * kBytes, tid);
  }
  // In the one-token form q4_K's products are 16 times the canonical sums (sixteenfold): an odd
  // sub-block's high nibbles are read in place as unsigned bytes (16 q: one AND instead of a shift
  // and an AND) and an even sub-block's scale is taken 16 times; finish() shifts the exact integer
  // sum back (|16 S| <= 8 x 63 x 16 x 32 x 15 x 128 < 2^29). Not at more tokens, where it spilled
  // the four-fragment kernel (4 bytes, machine code).
  template <bool kOneToken>
  static constexpr bool kSixteenfold = kOneToken && !Q5;
  template <bool kSixteen>
  __device__ static uint32_t quants(uint32_t q, uint32_t high, int j) {
    if (kSixteen) return q & (j & 1 ? 0xF0F0F0F0u : 0x0F0F0F0Fu);
    uint32_t v = (q >> (4 * (j & 1))) & 0x0F0F0F0Fu;
    if (Q5) v |= ((high >> j) & 0x01010101u) << 4;
    return v;
  }
  __device__ static uint2 b_operand(const uint8_t* q, int tid) { return ldg_b_run(q + 8 * tid); }
  template <int NTF, bool kOneToken = false>
  __device__ void multiply(int j, const uint2 (&b)[NTF], int, const Tokens&, int, Part (&part)[NTF]) const {
    const int p = j / 2;
    constexpr bool kSixteen = kSixteenfold<kOneToken>;
    const uint32_t a[4] = {quants<kSixteen>(qs[0][p].x, Q5 ? qh[0].x : 0u, j),
                           quants<kSixteen>(qs[1][p].x, Q5 ? qh[1].x : 0u, j),
                           quants<kSixteen>(qs[0][p].y, Q5 ? qh[0].y : 0u, j),
                           quants<kSixteen>(qs[1][p].y, Q5 ? qh[1].y : 0u, j)};
    const int byte = j % 4;
    // Byte `byte` of the unpacked scales, 16 times it for an even sub-block in the sixteenfold
    // form: one shift and one AND either way.
    const auto scale = [&](uint32_t word) {
      if (!kSixteen || j % 2) return int((word >> (8 * byte)) & 0xFFu);
      return int((byte == 0 ? word << 4 : word >> (8 * byte - 4)) & 0xFF0u);
    };
    const int sc[2] = {scale(j < 4 ? h[0].y : h[0].w), scale(j < 4 ? h[1].y : h[1].w)};
#pragma unroll
    for (int nf = 0; nf < NTF; ++nf) {
      int c[4] = {0, 0, 0, 0};
      if (kSixteen) mma_k32_unsigned_a(c, a, b[nf].x, b[nf].y);
      else mma_k32(c, a, b[nf].x, b[nf].y);
#pragma unroll
      for (int e = 0; e < 4; e += kOneToken ? 2 : 1) part[nf].s[e] += sc[e / 2] * c[e];
    }
  }
  // M of group g: A row r = its 8 m_j at k 0..7 (tid 0: m 0-3, tid 1: m 4-7; k 8..15 zero), B
  // column n = gid = the digits part (gid & 1) of token pair gid / 2 (kernels.h: Q8Plane), one
  // product for the pair's even tokens and one for the odd (kOneToken: the even one alone): thread
  // element (row, 2 tid + parity) = C_l + 64 C_h in (c[2 row'], c[2 row' + 1]) of the parity's
  // product.
  template <int NTF, bool kOneToken = false>
  __device__ void close(const Tokens& tok, int g, int lane, Part (&part)[NTF]) const {
    const int gid = lane / 4, tid = lane % 4;
    const uint32_t a0 = tid == 0 ? h[0].z : tid == 1 ? m_hi[0] : 0u;
    const uint32_t a1 = tid == 0 ? h[1].z : tid == 1 ? m_hi[1] : 0u;
    const uint8_t* digits = tok.plane.sum_digits(tok.first + 2 * (gid / 2), g) + (gid % 2) * Q8Plane::kDigitsPart +
                            (tid % 2) * Q8Plane::kDigitsHalf;
#pragma unroll
    for (int nf = 0; nf < NTF; ++nf) {
      // the fragment's even and odd token: the two parities of the thread's 8 bytes
      const uint2 d = __ldg(reinterpret_cast<const uint2*>(digits + nf * Q8Plane::kDigitsFragment));
      int even[4] = {0, 0, 0, 0}, odd[4] = {0, 0, 0, 0};
      mma_k16(even, a0, a1, d.x);
      if (!kOneToken) mma_k16(odd, a0, a1, d.y);
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        part[nf].m[2 * r] = even[2 * r] + 64 * even[2 * r + 1];
        part[nf].m[2 * r + 1] = odd[2 * r] + 64 * odd[2 * r + 1];
      }
    }
  }
  template <bool kOneToken = false>
  __device__ void finish(const Part& part, const float (&da)[2], float (&t)[4]) const {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const uint4& hr = h[e / 2];
      const int sum = kSixteenfold<kOneToken> ? part.s[e] >> 4 : part.s[e];  // exact: a multiple of 16
      if (kOneToken && e % 2) t[e] = 0.0f;
      else t[e] = group_term_qk(h2f(uint16_t(hr.x)), h2f(uint16_t(hr.x >> 16)), sum, part.m[e], da[e % 2]);
    }
  }
};

// q6_K: sub-block j = elements 32j..32j+31 of the super-block (halves lo/hi: l = 0..15, 16..31,
// one int8 scale each). With hh = j / 4, kq = j % 4, element l's low 4 bits are nibble kq / 2 of
// ql[64 hh + 32 (kq & 1) + l] and its high 2 bits are bits 2 kq of qh[32 hh + l]. Blocks are
// kQ6KDeviceBlockBytes apart and rows q6k_device_row_bytes, so every word below is one aligned load.
struct GroupQ6K {
  struct Part {
    int s[4];
  };
  static constexpr int kGroupBytes = kQ6KDeviceBlockBytes;
  static constexpr bool kPartialGroups = false;
  static constexpr int kBLead = 2;
  static constexpr bool kSeveralTilesACta = true;
  static constexpr bool kTwoGroupsInFlight = true;
  static constexpr bool kSharedActivations = false;  // 64 registers spill 70-98 bytes
  static constexpr bool kRingOverTiles = true;  // at three CTAs an SM (the head), 80 registers
  __device__ static const uint8_t* group_base(const DevMat& m, int row, int g) {
    return m.data + size_t(row) * size_t(q6k_device_row_bytes(m.cols / 256)) + size_t(g) * kQ6KDeviceBlockBytes;
  }
  uint32_t ql[2][2][2][2];  // [row][j/4][(j%4)&1][half]: bytes 4tid..4tid+3 of the 16-byte run
  uint32_t qh[2][2][2];     // [row][j/4][half]
  uint32_t sc[2][4];        // [row]: the 16 int8 scales
  float d[2];
  // Row r's bytes of the group, from b.
  template <typename From>
  __device__ void load_row(int r, typename From::Ptr b, int tid) {
#pragma unroll
    for (int hh = 0; hh < 2; ++hh)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        ql[r][hh][0][half] = From::word(b + 64 * hh + 16 * half + 4 * tid);
        ql[r][hh][1][half] = From::word(b + 64 * hh + 32 + 16 * half + 4 * tid);
        qh[r][hh][half] = From::word(b + 128 + 32 * hh + 16 * half + 4 * tid);
      }
#pragma unroll
    for (int w = 0; w < 4; ++w) sc[r][w] = From::word(b + 192 + 4 * w);
    d[r] = h2f(From::u16(b + 208));
  }
  __device__ void load(const DevMat& m, const int (&R)[2], int g, int tid) {
#pragma unroll
    for (int r = 0; r < 2; ++r) load_row<FromGlobal>(r, group_base(m, R[r], g), tid);
  }
  __device__ static uint2 b_operand(const uint8_t* q, int tid) { return ldg_b_pair(q + 4 * tid, q + 16 + 4 * tid); }
  template <int NTF, bool kOneToken = false>
  __device__ void multiply(int j, const uint2 (&b)[NTF], int, const Tokens&, int, Part (&part)[NTF]) const {
    const int hh = j / 4, kq = j % 4;
    uint32_t a[2][2];  // [half][row]
    int s[2][2];       // [half][row]: the halves' scales (bytes 2j, 2j + 1)
#pragma unroll
    for (int half = 0; half < 2; ++half)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        a[half][r] = q6k_quants_s8(ql[r][hh][kq & 1][half], qh[r][hh][half], 4 * (kq >> 1), 2 * kq);
        s[half][r] = sext_byte(sc[r][j / 2], 2 * (j & 1) + half);
      }
#pragma unroll
    for (int nf = 0; nf < NTF; ++nf) {
      int lo[4] = {0, 0, 0, 0}, hi[4] = {0, 0, 0, 0};
      mma_k16(lo, a[0][0], a[0][1], b[nf].x);
      mma_k16(hi, a[1][0], a[1][1], b[nf].y);
#pragma unroll
      for (int e = 0; e < 4; e += kOneToken ? 2 : 1) part[nf].s[e] += s[0][e / 2] * lo[e] + s[1][e / 2] * hi[e];
    }
  }
  template <int NTF, bool kOneToken = false>
  __device__ void close(const Tokens&, int, int, Part (&)[NTF]) const {}
  template <bool kOneToken = false>
  __device__ void finish(const Part& part, const float (&da)[2], float (&t)[4]) const {
#pragma unroll
    for (int e = 0; e < 4; ++e) t[e] = kOneToken && e % 2 ? 0.0f : group_term_q6k(d[e / 2], part.s[e], da[e % 2]);
  }
};

// q8_0: sub-block j = block 8g + j (34 bytes: f16 d, 32 int8); the last group may be partial. Its
// terms are floats per block (each with its block's activation scale): Part carries the canonical
// tree's open sums, pair p (T_{2i} + T_{2i+1}), first half q and second half r of the group.
struct GroupQ8 {
  struct Part {
    float p[4], q[4], r[4];
  };
  static constexpr int kGroupBytes = 8 * 34;  // fewer in a partial last group
  static constexpr bool kPartialGroups = true;
  // Its float Parts leave no registers for B loads a sub-block ahead (ptxas: spills 8 -> 84 bytes
  // at four fragments).
  static constexpr int kBLead = 0;
  // Nor for a loop over several row tiles a CTA at one fragment (spills 56 -> 112 bytes), nor
  // for a second group's weights (184 bytes at two CTAs an SM).
  static constexpr bool kSeveralTilesACta = false;
  static constexpr bool kTwoGroupsInFlight = false;
  static constexpr bool kSharedActivations = false;
  static constexpr bool kRingOverTiles = false;
  __device__ static const uint8_t* group_base(const DevMat& m, int row, int g) {
    return m.data + (size_t(row) * (m.cols / 32) + 8 * g) * 34;
  }
  uint32_t q[2][8][2];  // [row][j]: bytes 8tid..8tid+7 of the block's quants
  float d[2][8];
  int n_in_row;         // blocks of this group inside the row
  __device__ void load(const DevMat& m, const int (&R)[2], int g, int tid) {
    const int nb = m.cols / 32;
    n_in_row = min(8, nb - 8 * g);
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        q[r][j][0] = q[r][j][1] = 0;
        d[r][j] = 0.0f;
        if (j < n_in_row) {
          const uint8_t* b = m.data + (size_t(R[r]) * nb + 8 * g + j) * 34;
          ld_words_a2(b + 2 + 8 * tid, q[r][j]);
          d[r][j] = h2f(ld_u16(b));
        }
      }
  }
  __device__ static uint2 b_operand(const uint8_t* q, int tid) { return ldg_b_run(q + 8 * tid); }
  template <int NTF, bool = false>  // every column: q8_0 takes no one-token form
  __device__ void multiply(int j, const uint2 (&b)[NTF], int blk, const Tokens& tok, int tid, Part (&part)[NTF]) const {
    const uint32_t a[4] = {q[0][j][0], q[1][j][0], q[0][j][1], q[1][j][1]};
#pragma unroll
    for (int nf = 0; nf < NTF; ++nf) {
      float t[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      if (j < n_in_row) {
        int c[4] = {0, 0, 0, 0};
        mma_k32(c, a, b[nf].x, b[nf].y);
        const float2 da = tok.scale_pair(8 * nf + 2 * tid, blk / 8);
#pragma unroll
        for (int e = 0; e < 4; ++e) t[e] = term_q8_0(d[e / 2][j], c[e], e % 2 ? da.y : da.x);
      }
      Part& s = part[nf];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s.p[e] = (j & 1) ? __fadd_rn(s.p[e], t[e]) : t[e];
        if (j == 1) s.q[e] = s.p[e];
        if (j == 3) s.q[e] = __fadd_rn(s.q[e], s.p[e]);
        if (j == 5) s.r[e] = s.p[e];
        if (j == 7) s.r[e] = __fadd_rn(s.r[e], s.p[e]);
      }
    }
  }
  template <int NTF, bool = false>
  __device__ void close(const Tokens&, int, int, Part (&)[NTF]) const {}
  template <bool = false>
  __device__ void finish(const Part& part, const float (&)[2], float (&t)[4]) const {
#pragma unroll
    for (int e = 0; e < 4; ++e) t[e] = __fadd_rn(part.q[e], part.r[e]);
  }
};

// Rows of the tile: row m (0..15). Roped segments pair row m < 8 with its rope partner as row
// m + 8 (tile = 8 pairs), so a thread's C fragment holds both halves of a pair.
__device__ __forceinline__ void tile_row(const MatSeg& seg, const MatVecExtra& extra, int tile, int m, int& row,
                                         int& rope_j, bool& valid) {
  if (seg.epi == Epilogue::RopeQ || seg.epi == Epilogue::RopeK) {
    const int p = tile * 8 + m % 8;
    valid = p < seg.w.rows / 2;
    int r0 = 0, r1 = 0;
    rope_j = 0;
    if (valid) rope_pair_index(p, extra.rope.head_dim, extra.rope.neox, r0, r1, rope_j);
    row = m < 8 ? r0 : r1;
  } else {
    row = tile * kTileRows + m;
    valid = row < seg.w.rows;
    rope_j = 0;
  }
  if (!valid) row = 0;  // loads stay in bounds; the result is dropped
}

// The row a thread loads for tile row m (row 0 past the end).
__device__ __forceinline__ int tile_load_row(const MatSeg& seg, const MatVecExtra& extra, int tile, int m) {
  int row, rope_j;
  bool valid;
  tile_row(seg, extra, tile, m, row, rope_j, valid);
  return row;
}

// Group g's terms into the stream acc, from the weights in cur: its B loads (from the plane at
// b_tile, the thread's token in block 0 of the CTA's first fragment; kSharedB: from the CTA's copy
// of fragment 0), its sub-blocks' products, close() and finish(). kOneToken (a launch of one
// token): only the thread's even columns (token 2 tid) are formed, the odd ones' terms are zero —
// only token 0 is stored, and its sums are the same operations in the same order.
template <typename Group, int NTF, bool kSharedB, bool kOneToken = false>
__device__ __forceinline__ void add_group_terms(const Group& cur, int g, const uint8_t* b_tile, int n_blocks,
                                                const Tokens& tok, float (&acc)[NTF][4]) {
  const int lane = threadIdx.x % 32, gid = lane / 4, tid = lane % 4;
  extern __shared__ uint4 activations_copy[];  // kSharedB: fragment 0, 256 bytes a block
  // Sub-block j's B registers of fragment nf, at immediate offsets from one pointer. A q8_0 row's
  // short last group reads its last block again (unused).
  const int last_j = Group::kPartialGroups ? n_blocks - 1 - 8 * g : 7;
  const uint8_t* b_group = b_tile + size_t(g) * 8 * 1024;
  auto b_operand = [&](int j, int nf) {
    if constexpr (kSharedB)
      return reinterpret_cast<const uint2*>(
          activations_copy)[((8 * g + min(j, last_j)) * kFragmentBytesPerBlock + 32 * gid + 8 * tid) / 8];
    return Group::b_operand(b_group + min(j, last_j) * 1024 + nf * 256, tid);
  };
  // Sub-block j + kLead's B loads are issued before sub-block j's products. At one fragment
  // that is the whole group (one round trip a group: measured +2 % at 1 and 8 sequences); at
  // four, Group::kBLead sub-blocks ahead (one: +3.1 % at 32 sequences and +1.1 % at 64; two
  // for q4_K / q5_K and q6_K: +0.8 % more at both, although q6_K then spills 40 bytes; two alone
  // for q4_K / q5_K: ±0, so the gain is q6_K's); at two fragments one ahead (the measured form);
  // from shared memory one ahead.
  constexpr int kLead = kSharedB ? 1 : NTF == 1 ? 8 : NTF == 2 ? std::min(1, Group::kBLead) : Group::kBLead;
  uint2 b[8][NTF];
#pragma unroll
  for (int j = 0; j < kLead; ++j)
#pragma unroll
    for (int nf = 0; nf < NTF; ++nf) b[j][nf] = b_operand(j, nf);
  typename Group::Part part[NTF] = {};
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    if (j + kLead < 8)
#pragma unroll
      for (int nf = 0; nf < NTF; ++nf) b[j + kLead][nf] = b_operand(j + kLead, nf);
    cur.template multiply<NTF, kOneToken>(j, b[j], 8 * g + j, tok, tid, part);
  }
  cur.template close<NTF, kOneToken>(tok, g, lane, part);
#pragma unroll
  for (int nf = 0; nf < NTF; ++nf) {
    const float2 pair = tok.scale_pair(8 * nf + 2 * tid, g);
    const float da[2] = {pair.x, pair.y};
    float t[4];
    cur.template finish<kOneToken>(part[nf], da, t);
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[nf][e] = __fadd_rn(acc[nf][e], t[e]);
  }
}

// Stream `warp` of the tile: acc[nf][e] = the sum of its groups' terms, in group order. The warp
// holds the weights of kInFlight of its groups at once: grp[i] takes its groups warp + i * kWarps,
// then every kInFlight-th one after, each load issued right after grp[i]'s last products, so it
// flies while the other sets are multiplied. kInFlight == 1: each group is loaded at its turn,
// after an L2 prefetch one group ahead; with first_loaded, grp[0] already holds group `warp`.
// kSharedB: B comes from the CTA's copy of fragment 0 in shared memory
// (matmul_mma_shared_activations_kernel), one sub-block ahead and without the L2 prefetch (both
// would cost the 64 registers spills).
template <typename Group, int NTF, int kInFlight = 1, bool kSharedB = false>
__device__ void tile_streams(const MmaArgs& a, const MatSeg& seg, int tile, const Tokens& tok,
                             Group (&grp)[kInFlight], bool first_loaded, float (&acc)[NTF][4]) {
  static_assert(kInFlight == 1 || (kInFlight == 2 && NTF == 1), "two groups in flight, at one token fragment only");
  static_assert(!kSharedB || (kInFlight == 1 && NTF == 1), "B from shared memory at one group and fragment only");
  const DevMat& m = seg.w;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gid = lane / 4, tid = lane % 4;
  const int R[2] = {tile_load_row(seg, a.extra, tile, gid), tile_load_row(seg, a.extra, tile, gid + 8)};
  // The thread's B token in block 0 of the CTA's first fragment; fragment nf of block b lies
  // b * 1024 + nf * 256 further (kernels.h: Q8Plane).
  const uint8_t* b_tile = tok.plane.block_quants(tok.first, 0) + 32 * gid;
  const int n_groups = (m.cols + 255) / 256;
  const int n_blocks = m.cols / 32;
  // At one token fragment the first groups' weights are loaded before the PDL wait: they depend on
  // no earlier kernel, so they arrive during that kernel's tail (measured +4 % at 8 sequences). At
  // more fragments the registers held across the wait cost the loop more (-20 % at 64).
  if (NTF == 1 && !first_loaded) {
#pragma unroll
    for (int i = 0; i < kInFlight; ++i)
      if (warp + i * kWarps < n_groups) grp[i].load(m, R, warp + i * kWarps, tid);
  }
  await_predecessor();
  // Group g's terms into the stream, from the weights in cur.
  const auto add_group = [&](Group& cur, int g) {
    if (kInFlight == 1) {
      if (!kSharedB && g + kWarps < n_groups) {
        // the next group's bytes of rows R[0], R[1]: tid covers 64-byte slice tid of each
#pragma unroll
        for (int r = 0; r < 2; ++r)
          if (64 * tid < Group::kGroupBytes) prefetch_l2(Group::group_base(m, R[r], g + kWarps) + 64 * tid);
      }
      if (NTF != 1 || g != warp) cur.load(m, R, g, tid);
    }
    add_group_terms<Group, NTF, kSharedB>(cur, g, b_tile, n_blocks, tok, acc);
    if (kInFlight > 1 && g + kInFlight * kWarps < n_groups) cur.load(m, R, g + kInFlight * kWarps, tid);
  };
  for (int g = warp; g < n_groups; g += kInFlight * kWarps) {
    add_group(grp[0], g);
    if constexpr (kInFlight == 2)
      if (g + kWarps < n_groups) add_group(grp[1], g + kWarps);
  }
}

// The CTA's work item `item` (a row tile and a token tile): its segment, row tile in it and tokens.
struct Item {
  int si, tile;
  Tokens tok;
};
template <int NTF>
__device__ Item item_at(const MmaArgs& a, int item) {
  // The token tiles of one row tile are neighbours, so its weights come from L2 after the first of
  // them reads them. One fragment means one token tile: no division at run time (+1.0 % at one
  // sequence; a 2-D grid that drops it for every kernel gave +1.6 % there but cost the
  // four-fragment kernel registers, -0.9 % at 64).
  const int n_token_tiles = NTF == 1 ? 1 : (a.n_tokens + 8 * NTF - 1) / (8 * NTF);
  const int row_tile = item / n_token_tiles;
  int si = 0;
  while (si + 1 < a.n_segs && row_tile >= a.first_block[si + 1]) ++si;
  return {si, row_tile - a.first_block[si], Tokens{a.act, item % n_token_tiles * 8 * NTF}};
}

// The thread's 8 streams of tile rows gid (s[0]) and gid + 8 (s[1]) for token (fragment nf, 2 tid
// + k), from red (red[warp][value][lane]).
template <int NTF>
__device__ __forceinline__ void streams_from_red(const float* red, int nf, int k, float (&s)[2][8]) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int r = 0; r < 2; ++r)
#pragma unroll
    for (int w = 0; w < kWarps; ++w) s[r][w] = red[(w * NTF * 4 + nf * 4 + 2 * r + k) * 32 + lane];
}

// The CTA's streams meet in red (red[warp][value][lane], after a barrier) and warp w finishes the
// (token fragment, token of the thread) pairs w, w + 8, ...: both rows, the tree, the epilogue.
template <int NTF>
__device__ void join_streams(const MmaArgs& a, const MatSeg& seg, int tile, const Tokens& tok, const float* red) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gid = lane / 4, tid = lane % 4;
  for (int q = warp; q < NTF * 2; q += kWarps) {
    const int nf = q / 2, k = q % 2;
    float s[2][8];
    streams_from_red<NTF>(red, nf, k, s);
    const int t = tok.first + 8 * nf + 2 * tid + k;
    int r0, r1, j, unused;
    bool ok0, ok1;
    tile_row(seg, a.extra, tile, gid, r0, j, ok0);
    tile_row(seg, a.extra, tile, gid + 8, r1, unused, ok1);
    if (t < a.n_tokens && ok0) store_pair(seg, a.extra, t, r0, r1, j, ok1, stream_tree(s[0]), stream_tree(s[1]));
  }
}

// The thread's stream values into red (red[warp][value][lane]), for join_streams after a barrier.
template <int NTF>
__device__ __forceinline__ void streams_to_red(const float (&acc)[NTF][4], float* red) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int nf = 0; nf < NTF; ++nf)
#pragma unroll
    for (int e = 0; e < 4; ++e) red[(warp * NTF * 4 + nf * 4 + e) * 32 + lane] = acc[nf][e];
}

// The swiglu epilogue's join (MatVecExtra::swiglu_out): tile row gid is gate row 8 tile + gid and
// tile row gid + 8 the same row of up, so the thread holding both writes silu(gate) * up.
__device__ void join_swiglu(const MmaArgs& a, int tile, const Tokens& tok, const float* red) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gid = lane / 4, tid = lane % 4;
  if (warp >= 2) return;
  const int k = warp;
  float s[2][8];
  streams_from_red<1>(red, 0, k, s);
  const int t = tok.first + 2 * tid + k, row = tile * 8 + gid;
  if (t >= a.n_tokens) return;
  const size_t o = size_t(t) * a.seg[0].ld_out;
  const float gate = with_bias_residual(a.seg[0], row, o + row, stream_tree(s[0]));
  const float up = with_bias_residual(a.seg[1], row, o + row, stream_tree(s[1]));
  a.extra.swiglu_out[size_t(t) * a.extra.swiglu_ld + row] = silu_mul(gate, up);
}

// After the CTA's last tile (every thread): each of its tiles counts into its 256-column group
// (32 tiles of 8 rows), one thread a tile, with a release add that orders the CTA's values before
// the count as the barrier orders them before the add (no __threadfence: its sequentially
// consistent fence also empties the SM's L1). The tile whose add completes a group sets its count
// back to zero for the next launch, and the CTA's warps then quantize the groups it completed, four
// tokens a warp (at 8 tokens two warps a group: one round trip to L2 each), reading the other
// tiles' values from L2 after an acquire. Counting as each tile ends instead cost 6 % on the 7B
// (its fences held back the warp that refills the weight ring). completed: my_tiles ints of shared
// memory. REQUIRES: every thread of the CTA; blockDim.x / 32 warps.
__device__ void publish_swiglu_tiles(const MmaArgs& a, const int2* tile_items, int my_tiles, int* completed) {
  const MatVecExtra& e = a.extra;
  __syncthreads();  // every tile's values are written
  for (int k = int(threadIdx.x); k < my_tiles; k += int(blockDim.x)) {
    int* count = e.swiglu_counts + tile_items[k].y / 32;
    int before;
    asm volatile("atom.add.release.gpu.global.s32 %0, [%1], 1;" : "=r"(before) : "l"(count) : "memory");
    completed[k] = before == 31;
    if (before == 31) *count = 0;
  }
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = int(blockDim.x) / 32;
  const int passes = (e.swiglu_q8_rows + 3) / 4;
  for (int item = warp; item < my_tiles * passes; item += warps) {
    const int k = item / passes;
    if (!completed[k]) continue;
    asm volatile("fence.acq_rel.gpu;" ::: "memory");  // the other tiles' values after their counts
    const int t = 4 * (item % passes) + lane / 8, b = tile_items[k].y / 32 * 8 + lane % 8;  // lanes 8i..8i+7: a token
    const bool valid = t < e.swiglu_q8_rows;
    const float4* src = reinterpret_cast<const float4*>(e.swiglu_out + size_t(valid ? t : 0) * e.swiglu_ld + 32 * b);
    float4 v[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = valid ? __ldcg(src + i) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    quantize_q8_group_values(v, e.swiglu_q8, t, b, valid);
  }
}

// One work item: its streams, then joined by the CTA (without the next tile's first group loaded
// during the join, which the several-tiles loop of matmul_mma_kernel does).
template <typename Group, int NTF, int kInFlight = 1>
__device__ __forceinline__ void work_item(const MmaArgs& a, const Item& it, float* red) {
  const MatSeg& seg = a.seg[it.si];
  Group grp[kInFlight];
  float acc[NTF][4];
#pragma unroll
  for (int nf = 0; nf < NTF; ++nf)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[nf][e] = 0.0f;
  tile_streams<Group, NTF, kInFlight>(a, seg, it.tile, it.tok, grp, false, acc);
  streams_to_red<NTF>(acc, red);
  __syncthreads();
  join_streams<NTF>(a, seg, it.tile, it.tok, red);
}

// CTA b's row tiles b, b + gridDim.x, ... at one token fragment. kSharedB: the CTA first copies
// fragment 0 of the plane's blocks (its <= 8 tokens) into shared memory, after the PDL wait and
// with its first tile's first group already loaded, and every tile reads B from there.
template <typename Group, bool kSharedB>
__device__ __forceinline__ void several_tiles(const MmaArgs& a, float* red) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gid = lane / 4, tid = lane % 4;
  const int n_items = a.first_block[a.n_segs];
  Group grp[1];
  // Row tile `item`'s first group (the warp's) into grp[0]; whether the warp has one.
  const auto load_first_group = [&](int item) {
    const Item it = item_at<1>(a, item);
    const MatSeg& seg = a.seg[it.si];
    const int R[2] = {tile_load_row(seg, a.extra, it.tile, gid), tile_load_row(seg, a.extra, it.tile, gid + 8)};
    if (warp >= (seg.w.cols + 255) / 256) return false;
    grp[0].load(seg.w, R, warp, tid);
    return true;
  };
  bool first_loaded = false;
  if constexpr (kSharedB) {
    extern __shared__ uint4 activations_copy[];
    first_loaded = load_first_group(int(blockIdx.x));
    await_predecessor();
    constexpr int kPieces = kFragmentBytesPerBlock / 16;
    for (int i = int(threadIdx.x); i < a.seg[0].w.cols / 32 * kPieces; i += kThreads)
      activations_copy[i] = *reinterpret_cast<const uint4*>(a.act.block_quants(0, i / kPieces) + 16 * (i % kPieces));
    __syncthreads();
  }
  for (int item = int(blockIdx.x); item < n_items; item += int(gridDim.x)) {
    const Item it = item_at<1>(a, item);
    const MatSeg& seg = a.seg[it.si];
    float acc[1][4] = {{0.0f, 0.0f, 0.0f, 0.0f}};
    tile_streams<Group, 1, 1, kSharedB>(a, seg, it.tile, it.tok, grp, first_loaded, acc);
    streams_to_red<1>(acc, red);
    // The CTA's next row tile's first group is loaded while this one's streams are joined (the
    // registers the first tile loads before the PDL wait).
    const int next = item + int(gridDim.x);
    first_loaded = next < n_items && load_first_group(next);
    __syncthreads();
    join_streams<1>(a, seg, it.tile, it.tok, red);
    if (next < n_items) __syncthreads();  // red is the next tile's
  }
}

// REQUIRES: blockDim.x == kThreads; the items are the segments' row tiles (first_block) times
// ceil(n_tokens / (8 NTF)) token tiles, one a CTA, except at NTF == 1 for
// Group::kSeveralTilesACta, where CTA b takes row tiles b, b + gridDim.x, ...; every segment of
// a.seg has Group's type. Every thread reaches every barrier (a CTA's threads take the same
// items): rows past the end are computed on clamped indices, tokens past the end on the plane
// tile's padding, and both dropped at the store. a.act.token0 % 32 == 0; NTF == 1: n_tokens <= 8.
template <typename Group, int NTF>
__global__ void __launch_bounds__(kThreads, kCtasPerSm<NTF>) matmul_mma_kernel(const __grid_constant__ MmaArgs a) {
  MINFER_TIMELINE_PROBE();
  __shared__ float red[kReduceFloats<NTF>];
  if constexpr (NTF == 1 && Group::kSeveralTilesACta)
    several_tiles<Group, false>(a, red);
  else
    work_item<Group, NTF>(a, item_at<NTF>(a, int(blockIdx.x)), red);
}

// The several-tiles loop with B from a shared-memory copy of the plane's fragment 0, at four CTAs
// an SM: the 16 registers a thread held for a group's B loads buy a fourth CTA (the 14B, gate/up
// and q/k/v: +4.7 %, +9.3 % at 8 sequences; the 7B, gate/up: ±0, +3.1 … +3.6 % at 8).
// REQUIRES: as matmul_mma_kernel at NTF == 1 with several tiles a CTA; gridDim.x <= the row tiles;
// every segment has a.seg[0]'s cols, cols <= kSharedActivationsMaxCols; dynamic shared memory of
// cols / 32 * kFragmentBytesPerBlock bytes.
template <typename Group>
__global__ void __launch_bounds__(kThreads, kSharedActivationsCtasPerSm)
    matmul_mma_shared_activations_kernel(const __grid_constant__ MmaArgs a) {
  MINFER_TIMELINE_PROBE();
  __shared__ float red[kReduceFloats<1>];
  several_tiles<Group, true>(a, red);
}

// One launch of segments of two k-quant types at one token fragment (q/k in q4_K with a q6_K v,
// llama.cpp's Q4_K_M mix): each row tile runs its own type's code. At one fragment both types'
// kernels have the same register budget (kCtasPerSm<1>), so one launch costs neither registers
// nor the second launch's latency.
// REQUIRES: as matmul_mma_kernel at NTF == 1; every segment is q4_K or q6_K; CTA b takes row
// tiles b, b + gridDim.x, ...
__global__ void __launch_bounds__(kThreads, kCtasPerSm<1>) matmul_mma_q4k_q6k_kernel(const __grid_constant__ MmaArgs a) {
  MINFER_TIMELINE_PROBE();
  __shared__ float red[kReduceFloats<1>];
  const int n_items = a.first_block[a.n_segs];
  bool first = true;
  // The CTA's tiles of one type, then of the other: one loop a type keeps each type's registers
  // apart (one loop branching a tile on its type spilled 300 bytes).
  const auto walk = [&](auto group) {
    using Group = decltype(group);
    constexpr bool kQ6K = std::is_same_v<Group, GroupQ6K>;
    for (int item = int(blockIdx.x); item < n_items; item += int(gridDim.x)) {
      const Item it = item_at<1>(a, item);
      if ((a.seg[it.si].w.type == GgmlType::Q6_K) != kQ6K) continue;
      if (!first) __syncthreads();  // red is this tile's
      first = false;
      work_item<Group, 1>(a, it, red);
    }
  };
  walk(GroupQK45<false>{});
  walk(GroupQ6K{});
}

// One row tile a CTA at one token fragment, each warp holding two of its groups' weights in
// registers: a group is multiplied while the next one's loads fly, and its registers are reloaded
// with the group after next right after its products. For launches whose warps stream many groups
// a tile (down: 74 at K = 18944), where one group in flight leaves a round trip before each
// group's products. Two CTAs an SM (128 registers), so it is launched only where the row tiles
// fit one wave at that (two_groups_in_registers).
// REQUIRES: as matmul_mma_kernel at NTF == 1, one row tile a CTA.
template <typename Group>
__global__ void __launch_bounds__(kThreads, 2) matmul_mma_two_groups_kernel(const __grid_constant__ MmaArgs a) {
  MINFER_TIMELINE_PROBE();
  __shared__ float red[kReduceFloats<1>];
  work_item<Group, 1, 2>(a, item_at<1>(a, int(blockIdx.x)), red);
}

// The weight ring of matmul_mma_weight_ring_kernel at CtasPerSm CTAs an SM: round r of a row tile
// (groups 8r .. 8r + 7 of its 16 rows) lies in stage r % kStages, a tile row kPitch bytes apart,
// copied there by the tensor memory accelerator: a tensor copy a half tile (RingCopyMaps), else one
// bulk copy a tile row (every row of the device layout starts 16-byte aligned, DevMat). A
// stage's last reader refills it with round r + kStages, so up to kStages rounds stream in while
// the warps multiply, with no weight bytes held in registers ahead of their products.
// At two CTAs an SM a CTA has 12 warps (more warps than streams, so that the groups' chains
// overlap: +1.9 % on the 7B against 8; 16 gave ±0), and behind the stages lie the terms of the
// tile's groups (a warp's 32 lanes x 4 floats a group) until the streams are folded. At three (row
// tiles that do not fit one wave at two: the 14B's down and o, the 7B's q/k/v) and four (the 14B's
// q/k/v: +0.45 %; 64 registers, two stages) it has 8 warps, warp w summing stream w in registers,
// and no terms (27.6 KB of them at 54 groups would not fit). The 7B's down at three: −0.9 % at one
// sequence, −6 % at eight.
template <typename Group, int CtasPerSm>
struct WeightRing {
  static_assert(CtasPerSm >= 2 && CtasPerSm <= 4, "a ring's CTAs an SM: 2, 3 or 4");
  static constexpr int kWarpsACta = CtasPerSm == 2 ? 12 : kWarps;
  static constexpr int kThreadsACta = kWarpsACta * 32;
  static constexpr bool kTermsInShared = kWarpsACta != kWarps;
  static constexpr int kStages = std::is_same_v<Group, GroupQ6K> || CtasPerSm == 4 ? 2 : 3;
  static constexpr int kRoundBytes = kWarps * Group::kGroupBytes;
  static_assert(kRoundBytes % 16 == 0, "rounds start 16-byte aligned");
  // Rows gid 0..7 on distinct banks: q4_K / q5_K read 8-byte words (a half-warp is four rows of
  // 32 bytes: a pitch of 8 banks modulo 32), q6_K 4-byte words (eight rows of 16 bytes: an odd
  // number of 16-byte bank groups). The pitch past the round is what a tensor copy reads beyond it.
  static constexpr int kPitch = std::is_same_v<Group, GroupQ6K> ? (kRoundBytes / 16 | 1) * 16
                                                                : (kRoundBytes + 127) / 128 * 128 + 32;
  static constexpr int kStageBytes = kTileRows * kPitch;
  static constexpr int kTermBytes = 32 * 4 * 4;
  static constexpr int rounds(int groups) { return (groups + kWarps - 1) / kWarps; }
  // Dynamic shared memory for rows of `groups` groups: the stages, the terms, and a barrier and a
  // read count a round (a round's own barrier, so that a warp that skips rounds never reads a
  // phase of its stage's barrier that belongs to another round).
  static constexpr int bytes(int groups, int tiles = 1) {
    return kStages * kStageBytes + (kTermsInShared ? groups * kTermBytes : 0) + tiles * rounds(groups) * (8 + 4);
  }
  // The ring over several tiles a CTA adds its tile table, 8-byte aligned behind the read counts:
  // each tile's 16 rows' first bytes and its item (segment, row tile).
  static constexpr int over_tiles_bytes(int groups, int tiles) {
    return bytes(groups, tiles) + 4 + tiles * (kTileRows * 8 + 8);
  }
};

// A weight ring's rounds by tensor copies (RingCopyMaps::on): each half tile (8 rows: the plain
// rows 16t.., a swiglu tile's gate or up rows, a neox-rope tile's two runs) comes in one copy of a
// 2-D tensor map over its segment's matrix, a box of 8 rows x kPitch bytes, landing at the stage's
// pitch, where the rows' own bulk copies took 16 copies a round. Those are uniform-operand
// instructions, so the refilling warp issued them one lane at a time, about ten instructions each,
// on the chain every warp reading the refilled stage waits for (docs/13 §2). The box reads the
// pitch's bytes past the round too (the next round's first bytes, which it fetches again, or zeros
// past the row); a tile's rows past the matrix come as zeros, or as rows 0..7 where a whole half is
// past it (tile_load_row's row 0), and their products are dropped. A box must start 16-byte
// aligned in global memory (an odd 8-byte word is an illegal instruction), which every row of the
// device layout does (q6_K rows are padded to 16 bytes, DevMat). Where a segment's half tiles are
// not runs of 8 rows (rope on interleaved pairs), the launch keeps the rows' copies. The same bytes
// land at the same places either way.
struct RingCopyMaps {
  CUtensorMap seg[kMaxMatSegs];
  int on;
};

// One row tile a CTA at one token fragment, its weights streamed through WeightRing and its groups
// dealt over WeightRing::kWarpsACta warps (group g to warp g % kWarpsACta), for launches whose rows
// have more groups than a CTA's 8 streams (down: 74 at K = 18944; o and q/k/v: 14 at 3584) and
// whose tiles fit one wave at CtasPerSm CTAs an SM. kSeveralTiles: CTA b takes row tiles b,
// b + gridDim.x, ... (gate/up, the head), its rounds one sequence over them, so that the next
// tile's rounds stream in while this one's streams are joined.
// With more warps than streams each group's term goes to shared memory (0 + t is t for every term
// a stream can add: a -0 becomes +0, which adds the same to a sum that is never -0) and warps
// 0..7 then add stream w's terms in group order; with 8, warp w adds its groups' terms in order
// itself. Either way the bits are those of every other kernel.
// The ring over tiles writes a table of its tiles' rows and items before the PDL wait, so that a
// refill's source is a shared load and an add on the refilling warp's chain (about 55 instructions
// to its copies), where recomputing it from the round — a division, the segment search, 64-bit
// address products, about 105 — held back that warp and every warp waiting for the round (on an
// H100 7B +1.0 %, 14B +0.8 %). The one-tile ring computes its single tile's source once, as before.
// kSwiglu (with kSeveralTiles): the swiglu epilogue of MatVecExtra::swiglu_out: row tile i is gate
// rows 8i..8i+7 (segment 0) above up rows 8i..8i+7 (segment 1), joined by join_swiglu; after its
// last tile the CTA counts its tiles into their 256-column groups and quantizes the groups it
// completes (publish_swiglu_tiles).
// kOneToken (a launch of one token): each product forms token 0's column alone (add_group_terms).
// REQUIRES: <= 8 tokens (kOneToken: 1); one row tile a CTA, or with kSeveralTiles gridDim.x <= the
// row tiles and every segment of a.seg[0]'s cols; blockDim.x == Ring::kThreadsACta and CtasPerSm CTAs an SM (the
// launch bounds); dynamic shared memory of Ring::bytes(groups) for one tile a CTA, of
// Ring::over_tiles_bytes(groups, the most tiles a CTA takes) for several; every
// row holds whole groups and starts 16-byte aligned, its bytes a multiple of 16 (the device layout:
// no copy reads past a row).
// The body of that kernel (and of matmul_mma_weight_ring_q4k_q6k_kernel's CTAs): red is the join's
// reduction buffer.
template <typename Group, int CtasPerSm, bool kSeveralTiles, bool kSwiglu, bool kOneToken>
__device__ __forceinline__ void weight_ring_cta(const MmaArgs& a, const RingCopyMaps& maps, float* red,
                                                uint8_t* ring_stages) {
  static_assert(!kSwiglu || kSeveralTiles, "the swiglu epilogue is the ring over tiles'");
  using Ring = WeightRing<Group, CtasPerSm>;
  // The CTA's k-th row tile (tile blockIdx.x + k gridDim.x) and its round r are the CTA's round
  // q = k n_rounds + r.
  const auto item_of = [&](int k) {
    if constexpr (kSwiglu) return Item{0, int(blockIdx.x) + k * int(gridDim.x), Tokens{a.act, 0}};
    else return item_at<1>(a, int(blockIdx.x) + k * int(gridDim.x));
  };
  const Item first = item_of(0);
  const MatSeg& first_seg = a.seg[first.si];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gid = lane / 4, tid = lane % 4;
  const int n_items = a.first_block[a.n_segs];
  const int my_tiles = kSeveralTiles ? (n_items - int(blockIdx.x) + int(gridDim.x) - 1) / int(gridDim.x) : 1;
  const int n_groups = first_seg.w.cols / 256, n_rounds = Ring::rounds(n_groups);
  const int my_rounds = my_tiles * n_rounds;
  const uint32_t stages = shared_address(ring_stages);
  float4* terms = reinterpret_cast<float4*>(ring_stages + Ring::kStages * Ring::kStageBytes);
  uint64_t* full = reinterpret_cast<uint64_t*>(terms + (Ring::kTermsInShared ? n_groups * 32 : 0));  // [round]
  int* released = reinterpret_cast<int*>(full + my_rounds);              // [round]
  const uint8_t** tile_rows = reinterpret_cast<const uint8_t**>(released + (my_rounds + 1) / 2 * 2);  // [tile][tile row]
  int2* tile_items = reinterpret_cast<int2*>(tile_rows + my_tiles * kTileRows);  // [tile]: segment, row tile
  // The CTA's round q, round r of its tile k (r may run past the tile's rounds into the next
  // tiles'), into its stage by lanes 0..15 of the calling warp, a tile row each.
  const int first_copy_row = tile_load_row(first_seg, a.extra, first.tile, lane % kTileRows);
  const auto issue = [&](int q, int k, int r) {
    if constexpr (kSeveralTiles)
      for (; r >= n_rounds; r -= n_rounds) ++k;
    const int st = q % Ring::kStages;
    const uint32_t bar = shared_address(&full[q]);
    if (maps.on) {  // uniform over the grid
      if (lane < kTileRows) {
        if (lane % 8 == 0) {  // a half tile's copy; the other lanes only count their arrival
          int si = first.si, row = first_copy_row;
          if constexpr (kSeveralTiles) {
            const int2 item = tile_items[k];
            si = kSwiglu ? lane / 8 : item.x;
            row = kSwiglu ? item.y * 8 : tile_load_row(a.seg[si], a.extra, item.y, lane);
          }
          mbarrier_expect_tx(bar, uint32_t(8 * Ring::kPitch));
          mbarrier_arrive(bar);
          tma_load_2d(stages + st * Ring::kStageBytes + lane * Ring::kPitch, &maps.seg[si], r * (Ring::kRoundBytes / 8),
                      row, bar, l2_policy_streaming(!a.extra.weights_l2_unchanged));
        } else {
          mbarrier_arrive(bar);
        }
      }
      return;
    }
    if (lane < kTileRows) {
      const uint8_t* src = kSeveralTiles ? tile_rows[k * kTileRows + lane] + r * Ring::kRoundBytes
                                         : Group::group_base(first_seg.w, first_copy_row, kWarps * r);
      const int bytes = (min(kWarps, n_groups - kWarps * r) * Group::kGroupBytes + 15) / 16 * 16;
      mbarrier_expect_tx(bar, uint32_t(bytes));
      mbarrier_arrive(bar);
      bulk_copy_to_shared(stages + st * Ring::kStageBytes + lane * Ring::kPitch, src, uint32_t(bytes), bar,
                          l2_policy_streaming(!a.extra.weights_l2_unchanged));
    }
  };
  if (threadIdx.x == 0) {
    for (int q = 0; q < my_rounds; ++q) mbarrier_init(shared_address(&full[q]), kTileRows), released[q] = 0;
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  if constexpr (kSeveralTiles)
    for (int i = int(threadIdx.x); i < my_tiles * kTileRows; i += Ring::kThreadsACta) {
      const Item it = item_of(i / kTileRows);
      if constexpr (kSwiglu) {  // gate rows above up rows
        const int m = i % kTileRows;
        tile_rows[i] = Group::group_base(a.seg[m / 8].w, it.tile * 8 + m % 8, 0);
      } else {
        const MatSeg& seg = a.seg[it.si];
        tile_rows[i] = Group::group_base(seg.w, tile_load_row(seg, a.extra, it.tile, i % kTileRows), 0);
      }
      if (i % kTileRows == 0) tile_items[i / kTileRows] = make_int2(it.si, it.tile);
    }
  __syncthreads();
  // The first rounds depend on no earlier kernel: they stream in during its tail.
  if (warp == 0)
    for (int q = 0; q < Ring::kStages && q < my_rounds; ++q) issue(q, 0, q);
  if (a.beside_predecessor) release_dependents();
  else await_predecessor();
  // Every tile reads the same tokens (one token fragment) and has rows of the same groups.
  const MatSeg& seg = first_seg;
  const DevMat& m = seg.w;
  for (int k = 0; k < my_tiles; ++k) {
    // The thread's rows in a stage: tile rows gid and gid + 8.
    const uint32_t row_at[2] = {stages + gid * Ring::kPitch, stages + (gid + 8) * Ring::kPitch};
    // One token: every lane reads token 0's bytes (one sector a load; the other columns repeat
    // token 0 and are never stored).
    const uint8_t* b_tile = first.tok.plane.block_quants(first.tok.first, 0) + 32 * (kOneToken ? 0 : gid);
    // Every group of a round is read by one warp, each warp taking its groups in order (a tile's
    // before the next tile's, past the join's barriers), so the round holding the lowest unread
    // group is always in its stage: no warp waits on a round that a waiting warp holds back. A
    // warp may skip rounds (12 warps, 8 groups a round).
    float acc[1][4] = {{0.0f, 0.0f, 0.0f, 0.0f}};  // stream `warp` (8 warps)
    for (int g = warp; g < n_groups; g += Ring::kWarpsACta) {
      const int r = g / kWarps, q = k * n_rounds + r, st = q % Ring::kStages;
      mbarrier_wait(shared_address(&full[q]), 0);
      timeline_mark();  // the CTA's first stage has landed (timeline builds)
      Group cur;
      const uint32_t at = st * Ring::kStageBytes + (g % kWarps) * Group::kGroupBytes;
#pragma unroll
      for (int i = 0; i < 2; ++i) cur.template load_row<FromShared>(i, row_at[i] + at, tid);
      __syncwarp();
      // The round's last reader refills its stage with round q + kStages (of one tile, only the
      // last round can have fewer than kWarps groups, and it is followed by none). A round that no
      // later round refills is not counted: the count's fence and atomic sit on the group's chain
      // before its activation loads (o's rounds all fit the stages, so it counts none).
      if (q + Ring::kStages < my_rounds) {  // uniform over the warp
        const int readers = kSeveralTiles ? min(kWarps, n_groups - kWarps * r) : kWarps;
        int last = 0;
        if (lane == 0) last = shared_fetch_add_acq_rel(&released[q], 1) == readers - 1;
        if (__shfl_sync(0xffffffffu, last, 0)) {
          fence_proxy_async_shared();
          issue(q + Ring::kStages, k, r + Ring::kStages);
        }
      }
      if constexpr (Ring::kTermsInShared) {
        float term[1][4] = {{0.0f, 0.0f, 0.0f, 0.0f}};
        add_group_terms<Group, 1, false, kOneToken>(cur, g, b_tile, m.cols / 32, first.tok, term);
        terms[g * 32 + lane] = make_float4(term[0][0], term[0][1], term[0][2], term[0][3]);
      } else {
        add_group_terms<Group, 1, false, kOneToken>(cur, g, b_tile, m.cols / 32, first.tok, acc);
      }
    }
    if constexpr (Ring::kTermsInShared) {
      __syncthreads();
      if (warp < kWarps)
        for (int g = warp; g < n_groups; g += kWarps) {
          const float4 t = terms[g * 32 + lane];
          acc[0][0] = __fadd_rn(acc[0][0], t.x), acc[0][1] = __fadd_rn(acc[0][1], t.y);
          acc[0][2] = __fadd_rn(acc[0][2], t.z), acc[0][3] = __fadd_rn(acc[0][3], t.w);
        }
    }
    if (warp < kWarps) streams_to_red<1>(acc, red);
    __syncthreads();
    if constexpr (kSwiglu)
      join_swiglu(a, tile_items[k].y, first.tok, red);
    else if constexpr (kSeveralTiles)
      join_streams<1>(a, a.seg[tile_items[k].x], tile_items[k].y, first.tok, red);
    else
      join_streams<1>(a, seg, first.tile, first.tok, red);
    if (kSeveralTiles && k + 1 < my_tiles) __syncthreads();  // red and the terms are the next tile's
  }
  // Every round has been read: the read counts are free for the tiles' completions.
  if constexpr (kSwiglu)
    if (a.extra.swiglu_q8_rows > 0) publish_swiglu_tiles(a, tile_items, my_tiles, released);
  if (a.beside_predecessor) await_predecessor_before_exit();
}
template <typename Group, int CtasPerSm, bool kSeveralTiles, bool kSwiglu = false, bool kOneToken = false>
__global__ void __launch_bounds__(WeightRing<Group, CtasPerSm>::kThreadsACta, CtasPerSm)
    matmul_mma_weight_ring_kernel(const __grid_constant__ MmaArgs a, const __grid_constant__ RingCopyMaps maps) {
  MINFER_TIMELINE_PROBE();
  __shared__ float red[kReduceFloats<1>];
  extern __shared__ __align__(128) uint8_t ring_stages[];
  weight_ring_cta<Group, CtasPerSm, kSeveralTiles, kSwiglu, kOneToken>(a, maps, red, ring_stages);
}

// One launch of q4_K and q6_K segments (q/k with a q6_K v, llama.cpp's Q4_K_M mix) through the
// weight ring, one row tile a CTA, each CTA running its tile's type's ring: one wave at CtasPerSm
// CTAs an SM where the register kernel took them (the 7B's q6_K-v layers: q/k/v 7.8 µs a layer
// against 6.1 in its q4_K-v layers' ring, docs/13 §3; +0.3 % at depth 0, +1.1 % at 16384 on an
// H100). The dynamic shared memory is the larger type's ring. At four CTAs an SM (the 14B's 448
// tiles, the reduction buffer in the first stage to fit, q6_K spilling 16 bytes at 64 registers)
// it lost to v and q/k side by side, so only three is taken (two_type_ring_ctas_per_sm).
// REQUIRES: as matmul_mma_weight_ring_kernel with one tile a CTA, for both types' rings (each
// segment's map at its type's pitch); every segment q4_K or q6_K, all of the same cols; dynamic
// shared memory of two_type_ring_bytes.
template <int CtasPerSm, bool kOneToken>
__global__ void __launch_bounds__(kThreads, CtasPerSm)
    matmul_mma_weight_ring_q4k_q6k_kernel(const __grid_constant__ MmaArgs a, const __grid_constant__ RingCopyMaps maps) {
  static_assert(WeightRing<GroupQ6K, CtasPerSm>::kThreadsACta == kThreads &&
                    WeightRing<GroupQK45<false>, CtasPerSm>::kThreadsACta == kThreads,
                "both rings' CTAs are the 8 streams");
  MINFER_TIMELINE_PROBE();
  __shared__ float red[kReduceFloats<1>];
  extern __shared__ __align__(128) uint8_t ring_stages[];
  if (a.seg[item_at<1>(a, int(blockIdx.x)).si].w.type == GgmlType::Q6_K)
    weight_ring_cta<GroupQ6K, CtasPerSm, false, false, kOneToken>(a, maps, red, ring_stages);
  else
    weight_ring_cta<GroupQK45<false>, CtasPerSm, false, false, kOneToken>(a, maps, red, ring_stages);
}

// The shared memory the driver reserves beside each CTA's own.
constexpr int kDriverSharedBytesPerCta = 1024;
// The shared memory a CTA of NTF token fragments takes with dynamic_smem bytes of its own: its
// reduction buffer and the driver's reserve besides.
template <int NTF>
int shared_memory_per_cta(int dynamic_smem) {
  return kReduceFloats<NTF> * 4 + dynamic_smem + kDriverSharedBytesPerCta;
}

// Launches a decode matmul kernel whose CTAs hold NTF token fragments, ctas_per_sm of them an SM
// (its launch bounds), each with dynamic_smem bytes of dynamic shared memory.
template <int NTF, typename... Params, typename... Extra>
void launch_mma(void (*kernel)(MmaArgs, Params...), const MmaArgs& a, int grid, const KernelStream& s,
                int ctas_per_sm = kCtasPerSm<NTF>, int dynamic_smem = 0, int threads = kThreads,
                const Extra&... extra) {
  // The smallest shared-memory carveout that holds the resident CTAs' reduction buffers leaves the
  // rest of the SM's 256 KB to L1, which keeps the activation tiles (measured +1 % at 32 and 64
  // sequences; the driver's default carves 100 KB). Per call: the attribute is per device.
  const int smem_per_cta = shared_memory_per_cta<NTF>(dynamic_smem);
  const int sm_smem = prefill_detail::device_shared_memory_per_sm();
  const int percent = sm_smem > 0 ? std::min(100, (ctas_per_sm * smem_per_cta * 100 + sm_smem - 1) / sm_smem + 1) : 100;
  const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, percent);
  if (e != cudaSuccess) fail("matmul_mma: cannot set the shared-memory carveout: ", cudaGetErrorString(e));
  // A CTA's static and dynamic shared memory past 48 KB need the kernel's opt-in (the shared
  // activations of rows over 5,632 columns: 4 KB of reduction buffer beside them).
  if (kReduceFloats<NTF> * 4 + dynamic_smem > 48 * 1024)
    prefill_detail::reserve_dynamic_shared_memory(kernel, dynamic_smem, "matmul_mma");
  launch_kernel("matmul_mma", kernel, grid, threads, size_t(dynamic_smem), s, a, extra...);
}

// The CTAs of a launch of one token fragment (k-quant types): at most as many as the SMs hold at
// once, each then taking every grid-th row tile and loading its next tile's first group while it
// joins this one's streams (launches of more row tiles than that: gate/up, the head), unless
// MatVecExtra::decode_ctas says otherwise.
template <typename Group>
int one_fragment_ctas(int row_tiles, const MatVecExtra& extra) {
  if (!Group::kSeveralTilesACta || extra.decode_ctas < 0) return row_tiles;
  if (extra.decode_ctas > 0) return std::min(row_tiles, extra.decode_ctas);
  return extra.sm_count > 0 ? std::min(row_tiles, kCtasPerSm<1> * extra.sm_count) : row_tiles;
}

// Whether a one-fragment launch may keep more than one group in flight a warp: every segment's
// rows have more than more_groups_than groups and one tile a CTA at ctas_per_sm CTAs an SM is one
// wave (gate/up, which fills three CTAs an SM with several tiles each, lost 8.6 % with two groups
// in registers at two).
bool one_wave_of_many_groups(const MmaArgs& a, int row_tiles, int ctas_per_sm, int more_groups_than) {
  if (a.extra.one_group_in_flight || a.extra.sm_count <= 0) return false;
  if (row_tiles > ctas_per_sm * a.extra.sm_count) return false;
  for (int i = 0; i < a.n_segs; ++i)
    if (a.seg[i].w.cols / 256 <= more_groups_than) return false;
  return true;
}

bool same_cols(const MmaArgs& a) {
  for (int i = 0; i < a.n_segs; ++i)
    if (a.seg[i].w.cols != a.seg[0].w.cols) return false;
  return true;
}
// Whether a one-fragment launch may take matmul_mma_shared_activations_kernel: its CTAs take
// several row tiles each (more tiles than three CTAs an SM: gate/up, where the copy of the
// activations serves several tiles; o, one tile a CTA, lost 3.6 % on the 7B) and every segment
// has the same cols, at most kSharedActivationsMaxCols (launch_group tries the weight rings first).
bool shared_activations(const MmaArgs& a, int row_tiles) {
  if (a.extra.activations_from_global || a.extra.decode_ctas != 0 || a.extra.sm_count <= 0) return false;
  if (row_tiles <= kCtasPerSm<1> * a.extra.sm_count) return false;
  return same_cols(a) && a.seg[0].w.cols <= kSharedActivationsMaxCols;
}

// The groups of the launch's longest rows.
int most_groups(const MmaArgs& a) {
  int groups = 0;
  for (int i = 0; i < a.n_segs; ++i) groups = std::max(groups, a.seg[i].w.cols / 256);
  return groups;
}
// The most CTAs an SM a type's ring runs at: q6_K's two stages of 27.4 KB do not fit four.
template <typename Group>
constexpr int kMostRingCtasPerSm = std::is_same_v<Group, GroupQ6K> ? 3 : 4;
// The CTAs an SM of the weight ring a one-fragment launch streams its weights through, one tile a
// CTA, 0 for none: unless MatVecExtra::weights_in_registers or its rows are not aligned
// (ring_rows_aligned), where some warp streams two groups or more and the tiles fit one wave
// (one_wave_of_many_groups) at two CTAs an SM (the 7B's down: 195 KB of 228 at q4_K, 191 at q6_K;
// its o), else at three (the 14B's down and o: +5.6 % against one
// group in flight, which is all the registers allow there, o alone +1.5 %; the 7B's q/k/v in its
// q4_K-v layers), else at four (the 14B's q/k/v in its q4_K-v layers), and the CTAs' rings fit the
// SM's shared memory. The 7B's o and q/k/v (14 groups): +1.2 %.
template <typename Group, int CtasPerSm>
bool weight_ring_fits(const MmaArgs& a, int row_tiles) {
  using Ring = WeightRing<Group, CtasPerSm>;
  return one_wave_of_many_groups(a, row_tiles, CtasPerSm, kWarps) &&
         CtasPerSm * shared_memory_per_cta<1>(Ring::bytes(most_groups(a))) <=
             prefill_detail::device_shared_memory_per_sm();
}
// Whether every segment's rows start 16-byte aligned and are a multiple of 16 bytes, as the
// weight rings' copies need (the device layout's rows are, DevMat).
bool ring_rows_aligned(const MmaArgs& a) {
  for (int i = 0; i < a.n_segs; ++i)
    if (device_row_bytes(a.seg[i].w.type, a.seg[i].w.cols) % 16 != 0 ||
        reinterpret_cast<uintptr_t>(a.seg[i].w.data) % 16 != 0)
      return false;
  return true;
}
template <typename Group>
int weight_ring_ctas_per_sm(const MmaArgs& a, int row_tiles) {
  if (a.extra.weights_in_registers || !ring_rows_aligned(a)) return 0;
  if (weight_ring_fits<Group, 2>(a, row_tiles)) return 2;
  if (weight_ring_fits<Group, 3>(a, row_tiles)) return 3;
  if constexpr (kMostRingCtasPerSm<Group> == 4)
    if (weight_ring_fits<Group, 4>(a, row_tiles)) return 4;
  return 0;
}
// Whether a one-fragment launch of more row tiles than kRingOverTilesCtasPerSm CTAs an SM take
// streams its weights through the weight ring over several tiles a CTA (that many CTAs an SM, CTA b
// taking tiles b, b + grid, ..., its next tile's rounds streaming in during this one's join):
// unless MatVecExtra::weights_in_registers or decode_ctas, for types with Group::kRingOverTiles,
// rows of more than 8 groups, every segment of the same cols, where the CTAs' rings fit the SM's
// shared memory. At the most CTAs an SM the type's ring runs at: q4_K at four (gate/up: +1.5 % on
// the 7B, +1.7 % on the 14B against the activations in shared memory; at three −2.4 %, at two
// −11 %), q6_K at three (the head: +0.4 % on the 7B, +0.9 % on the 14B against the weights in
// registers).
template <typename Group>
constexpr int kRingOverTilesCtasPerSm = kMostRingCtasPerSm<Group>;
// The dynamic shared memory of a launch of the ring over tiles: its CTAs take up to
// ceil(row_tiles / grid) tiles each, a barrier and a read count a round of each and an entry of the
// tile table each.
template <typename Group>
int ring_over_tiles_bytes(const MmaArgs& a, int row_tiles) {
  const int grid = kRingOverTilesCtasPerSm<Group> * a.extra.sm_count;
  return WeightRing<Group, kRingOverTilesCtasPerSm<Group>>::over_tiles_bytes(a.seg[0].w.cols / 256,
                                                                            (row_tiles + grid - 1) / grid);
}
template <typename Group>
bool weight_ring_over_tiles(const MmaArgs& a, int row_tiles) {
  if (a.extra.weights_in_registers || a.extra.decode_ctas != 0 || a.extra.sm_count <= 0 || !ring_rows_aligned(a))
    return false;
  if (row_tiles <= kRingOverTilesCtasPerSm<Group> * a.extra.sm_count || !same_cols(a) || a.seg[0].w.cols / 256 <= kWarps)
    return false;
  return kRingOverTilesCtasPerSm<Group> * shared_memory_per_cta<1>(ring_over_tiles_bytes<Group>(a, row_tiles)) <=
         prefill_detail::device_shared_memory_per_sm();
}
// Whether a one-fragment launch without a weight ring keeps two groups in flight a warp in
// registers (matmul_mma_two_groups_kernel, 128 registers: two CTAs an SM): where every warp streams
// more than two groups (7B down: +4.1 % at one sequence; o, two groups a warp: ±0).
bool two_groups_in_registers(const MmaArgs& a, int row_tiles) {
  return one_wave_of_many_groups(a, row_tiles, 2, 2 * kWarps);
}

// The ring's launches of one token take its one-token form unless MatVecExtra::every_token_column.
bool one_token_form(const MmaArgs& a) { return a.n_tokens == 1 && !a.extra.every_token_column; }

// Whether a ring launch copies its rounds by tensor maps (RingCopyMaps): unless
// MatVecExtra::ring_row_copies, where every segment's half tiles are runs of 8 rows (plain rows,
// rows past the end zero-filled and dropped; rope on neox pairs over whole tiles of heads whose
// half is a multiple of 8). A ring's rows are aligned either way (ring_rows_aligned).
bool ring_tensor_copies(const MmaArgs& a) {
  if (a.extra.ring_row_copies) return false;
  for (int i = 0; i < a.n_segs; ++i) {
    const MatSeg& seg = a.seg[i];
    if (seg.epi == Epilogue::RopeQ || seg.epi == Epilogue::RopeK)
      if (!a.extra.rope.neox || a.extra.rope.head_dim % 16 != 0 || seg.w.rows % kTileRows != 0) return false;
  }
  return true;
}
// Each segment's map at its ring's pitch (pitch[i]: segment i's).
RingCopyMaps ring_copy_maps_at(const MmaArgs& a, const int (&pitch)[kMaxMatSegs]) {
  RingCopyMaps maps{};
  maps.on = ring_tensor_copies(a);
  if (!maps.on) return maps;
  for (int i = 0; i < a.n_segs; ++i) {  // rows of 8-byte words, boxes of a half tile
    const DevMat& m = a.seg[i].w;
    const uint64_t row_bytes = uint64_t(device_row_bytes(m.type, m.cols));
    maps.seg[i] = prefill_detail::tensor_map_2d("decode matmul (weight ring)", "MINFER_NO_RING_TENSOR_COPIES",
                                                CU_TENSOR_MAP_DATA_TYPE_UINT64, m.data, row_bytes / 8, uint64_t(m.rows),
                                                row_bytes, uint32_t(pitch[i] / 8), 8);
  }
  return maps;
}
template <typename Group, int CtasPerSm>
constexpr int ring_box_pitch() {
  constexpr int kPitch = WeightRing<Group, CtasPerSm>::kPitch;
  static_assert(kPitch % 16 == 0 && kPitch / 8 <= 256 && 8 * kPitch % 128 == 0,
                "a half tile's box: whole 8-byte elements, at most 256 of them, landing 128-byte aligned");
  return kPitch;
}
template <typename Group, int CtasPerSm>
RingCopyMaps ring_copy_maps(const MmaArgs& a) {
  int pitch[kMaxMatSegs];
  for (int& p : pitch) p = ring_box_pitch<Group, CtasPerSm>();
  return ring_copy_maps_at(a, pitch);
}
template <typename Group, int CtasPerSm>
void launch_weight_ring(const MmaArgs& a, int row_tiles, const KernelStream& s) {
  using Ring = WeightRing<Group, CtasPerSm>;
  launch_mma<1>(one_token_form(a) ? matmul_mma_weight_ring_kernel<Group, CtasPerSm, false, false, true>
                                  : matmul_mma_weight_ring_kernel<Group, CtasPerSm, false>,
                a, row_tiles, s, CtasPerSm, Ring::bytes(most_groups(a)), Ring::kThreadsACta,
                ring_copy_maps<Group, CtasPerSm>(a));
}
template <typename Group, bool kSwiglu = false>
void launch_weight_ring_over_tiles(const MmaArgs& a, int row_tiles, const KernelStream& s) {
  constexpr int kCtas = kRingOverTilesCtasPerSm<Group>;
  launch_mma<1>(one_token_form(a) ? matmul_mma_weight_ring_kernel<Group, kCtas, true, kSwiglu, true>
                                  : matmul_mma_weight_ring_kernel<Group, kCtas, true, kSwiglu>,
                a, kCtas * a.extra.sm_count, s, kCtas, ring_over_tiles_bytes<Group>(a, row_tiles),
                WeightRing<Group, kCtas>::kThreadsACta, ring_copy_maps<Group, kCtas>(a));
}

// The kernel a one-fragment launch of one k-quant type takes, tried in this order (launch_group,
// and the predicates the tests ask).
enum class OneFragmentKernel { WeightRing, TwoGroupsInRegisters, WeightRingOverTiles, SharedActivations, Plain };
struct OneFragmentChoice {
  OneFragmentKernel kernel;
  int ring_ctas_per_sm;  // WeightRing: 2, 3 or 4
};
template <typename Group>
OneFragmentChoice one_fragment_choice(const MmaArgs& a, int row_tiles) {
  if constexpr (Group::kTwoGroupsInFlight) {
    if (const int ctas = weight_ring_ctas_per_sm<Group>(a, row_tiles)) return {OneFragmentKernel::WeightRing, ctas};
    if (two_groups_in_registers(a, row_tiles)) return {OneFragmentKernel::TwoGroupsInRegisters, 0};
  }
  if constexpr (Group::kRingOverTiles)
    if (weight_ring_over_tiles<Group>(a, row_tiles)) return {OneFragmentKernel::WeightRingOverTiles, 0};
  if constexpr (Group::kSharedActivations)
    if (shared_activations(a, row_tiles)) return {OneFragmentKernel::SharedActivations, 0};
  return {OneFragmentKernel::Plain, 0};
}

template <typename Group>
void launch_group(const MmaArgs& a, int row_tiles, const KernelStream& s) {
  // At most 32 tokens a CTA: four fragments keep the kernel near 128 registers (two CTAs per SM).
  // (measured: 16 tokens a CTA is 4-5 % slower than 32 at 32 and 64 sequences)
  const int ntf = a.n_tokens <= 8 ? 1 : a.n_tokens <= 16 ? 2 : 4;
  const int grid = row_tiles * ((a.n_tokens + 8 * ntf - 1) / (8 * ntf));
  if (ntf == 1) {
    const OneFragmentChoice choice = one_fragment_choice<Group>(a, row_tiles);
    switch (choice.kernel) {
      case OneFragmentKernel::WeightRing:
        if constexpr (Group::kTwoGroupsInFlight) {
          if (choice.ring_ctas_per_sm == 2) return launch_weight_ring<Group, 2>(a, row_tiles, s);
          if (choice.ring_ctas_per_sm == 3) return launch_weight_ring<Group, 3>(a, row_tiles, s);
          if constexpr (kMostRingCtasPerSm<Group> == 4) return launch_weight_ring<Group, 4>(a, row_tiles, s);
        }
        break;
      case OneFragmentKernel::TwoGroupsInRegisters:
        if constexpr (Group::kTwoGroupsInFlight)
          return launch_mma<1>(matmul_mma_two_groups_kernel<Group>, a, row_tiles, s);
        break;
      case OneFragmentKernel::WeightRingOverTiles:
        if constexpr (Group::kRingOverTiles) return launch_weight_ring_over_tiles<Group>(a, row_tiles, s);
        break;
      case OneFragmentKernel::SharedActivations:
        if constexpr (Group::kSharedActivations)
          return launch_mma<1>(matmul_mma_shared_activations_kernel<Group>, a,
                               std::min(row_tiles, kSharedActivationsCtasPerSm * a.extra.sm_count), s,
                               kSharedActivationsCtasPerSm, a.seg[0].w.cols / 32 * kFragmentBytesPerBlock);
        break;
      case OneFragmentKernel::Plain: break;
    }
    launch_mma<1>(matmul_mma_kernel<Group, 1>, a, one_fragment_ctas<Group>(row_tiles, a.extra), s);
  } else if (ntf == 2) {
    launch_mma<2>(matmul_mma_kernel<Group, 2>, a, grid, s);
  } else {
    launch_mma<4>(matmul_mma_kernel<Group, 4>, a, grid, s);
  }
}

// The arguments of a launch over these segments: the segments, their row tiles (first_block) and
// the operands.
MmaArgs mma_args(const MatSeg* segs, int n_segs, const Q8Plane& act_q8, int n_tokens, const MatVecExtra& extra) {
  MmaArgs a{};
  a.n_segs = n_segs;
  int row_tiles = 0;
  for (int i = 0; i < n_segs; ++i) {
    a.seg[i] = segs[i];
    a.first_block[i] = row_tiles;
    const bool roped = segs[i].epi == Epilogue::RopeQ || segs[i].epi == Epilogue::RopeK;
    row_tiles += roped ? (segs[i].w.rows / 2 + 7) / 8 : (segs[i].w.rows + kTileRows - 1) / kTileRows;
  }
  a.first_block[n_segs] = row_tiles;
  a.act = act_q8;
  a.n_tokens = n_tokens;
  a.extra = extra;
  return a;
}
int row_tiles_of(const MmaArgs& a) { return a.first_block[a.n_segs]; }

// The q4_K + q6_K weight ring's dynamic shared memory: the larger type's ring.
template <int CtasPerSm>
int two_type_ring_bytes(int groups) {
  return std::max(WeightRing<GroupQK45<false>, CtasPerSm>::bytes(groups), WeightRing<GroupQ6K, CtasPerSm>::bytes(groups));
}
template <int CtasPerSm>
bool two_type_ring_fits(const MmaArgs& a, int row_tiles) {
  return one_wave_of_many_groups(a, row_tiles, CtasPerSm, kWarps) &&
         CtasPerSm * shared_memory_per_cta<1>(two_type_ring_bytes<CtasPerSm>(most_groups(a))) <=
             prefill_detail::device_shared_memory_per_sm();
}
// The CTAs an SM (3, where one wave of them holds the row tiles) at which q4_K and q6_K segments of
// one token fragment take matmul_mma_weight_ring_q4k_q6k_kernel; 0 where they do not:
// MatVecExtra::two_type_register_kernel, weights_in_registers or launch_per_type, rows of 8 groups
// or fewer, of unlike cols, or not aligned for the ring's copies. (At four, the 14B's q/k/v ran
// −0.2 % at depth 0 and −0.9 % at 16384 against v and q/k side by side: sixty-third session.)
int two_type_ring_ctas_per_sm(const MmaArgs& a, int row_tiles) {
  if (a.extra.two_type_register_kernel || a.extra.weights_in_registers || a.extra.launch_per_type) return 0;
  if (a.n_tokens > 8 || !same_cols(a) || !ring_rows_aligned(a)) return 0;
  for (int i = 0; i < a.n_segs; ++i)
    if (a.seg[i].w.type != GgmlType::Q4_K && a.seg[i].w.type != GgmlType::Q6_K) return 0;
  return two_type_ring_fits<3>(a, row_tiles) ? 3 : 0;
}
template <int CtasPerSm>
void launch_weight_ring_q4k_q6k(const MmaArgs& a, int row_tiles, const KernelStream& s) {
  int pitch[kMaxMatSegs] = {};
  for (int i = 0; i < a.n_segs; ++i)
    pitch[i] = a.seg[i].w.type == GgmlType::Q6_K ? ring_box_pitch<GroupQ6K, CtasPerSm>()
                                                  : ring_box_pitch<GroupQK45<false>, CtasPerSm>();
  launch_mma<1>(one_token_form(a) ? matmul_mma_weight_ring_q4k_q6k_kernel<CtasPerSm, true>
                                  : matmul_mma_weight_ring_q4k_q6k_kernel<CtasPerSm, false>,
                a, row_tiles, s, CtasPerSm, two_type_ring_bytes<CtasPerSm>(most_groups(a)), kThreads,
                ring_copy_maps_at(a, pitch));
}

// The q4_K + q6_K launch for these segments at one token fragment, if it takes them: q4_K and q6_K,
// nothing else, MatVecExtra::launch_per_type unset; the weight ring of both types where it takes
// them (two_type_ring_ctas_per_sm: the 7B's 288 row tiles at three CTAs an SM), else the register
// kernel where the row tiles fit one wave of its CTAs (the 14B's 448 left a second round of tiles,
// a 6.8 µs tail, docs/13 §2: there q/k take their own launch, the weight ring, and v another, side
// by side). (q5_K with q6_K spilled 56 bytes.)
bool launch_q4k_q6k(const MatSeg* segs, int n_segs, const Q8Plane& act_q8, int n_tokens, const MatVecExtra& extra,
                    const KernelStream& s) {
  if (n_tokens > 8 || extra.launch_per_type) return false;
  bool q4k = false, q6k = false;
  for (int i = 0; i < n_segs; ++i) {
    q4k = q4k || segs[i].w.type == GgmlType::Q4_K;
    q6k = q6k || segs[i].w.type == GgmlType::Q6_K;
    if (segs[i].w.type != GgmlType::Q4_K && segs[i].w.type != GgmlType::Q6_K) return false;
  }
  if (!q4k || !q6k) return false;
  const MmaArgs a = mma_args(segs, n_segs, act_q8, n_tokens, extra);
  const int row_tiles = row_tiles_of(a);
  if (two_type_ring_ctas_per_sm(a, row_tiles) == 3) {
    launch_weight_ring_q4k_q6k<3>(a, row_tiles, s);
    return true;
  }
  if (extra.sm_count > 0 && row_tiles > kCtasPerSm<1> * extra.sm_count) return false;
  launch_mma<1>(matmul_mma_q4k_q6k_kernel, a, one_fragment_ctas<GroupQ6K>(row_tiles, extra), s);
  return true;
}

OperandFormat operand_format_of(GgmlType t) {
  return t == GgmlType::Q4_K ? OperandFormat::Q4K : t == GgmlType::Q6_K ? OperandFormat::Q6K : OperandFormat::None;
}

// launch_group's one-fragment choice for these segments (one k-quant type, <= 8 tokens); Plain
// where none applies.
OneFragmentChoice one_fragment_choice_of(const MatSeg* segs, int n_segs, int n_tokens, const MatVecExtra& extra) {
  const OneFragmentChoice none{OneFragmentKernel::Plain, 0};
  if (n_segs < 1 || n_segs > kMaxMatSegs || n_tokens < 1 || n_tokens > 8) return none;
  const GgmlType t = segs[0].w.type;
  for (int i = 0; i < n_segs; ++i)
    if (segs[i].w.type != t) return none;
  const MmaArgs a = mma_args(segs, n_segs, Q8Plane{}, n_tokens, extra);
  const int row_tiles = row_tiles_of(a);
  switch (t) {
    case GgmlType::Q4_K: return one_fragment_choice<GroupQK45<false>>(a, row_tiles);
    case GgmlType::Q5_K: return one_fragment_choice<GroupQK45<true>>(a, row_tiles);
    case GgmlType::Q6_K: return one_fragment_choice<GroupQ6K>(a, row_tiles);
    case GgmlType::Q8_0: return one_fragment_choice<GroupQ8>(a, row_tiles);
    default: return none;
  }
}


}  // namespace

OperandFormat matmul_mma_operand_format(const MatSeg* segs, int n_segs, int n_tokens, const MatVecExtra& extra) {
  bool taken[kMaxMatSegs] = {};
  for (int first = 0; first < n_segs && first < kMaxMatSegs; ++first) {
    if (taken[first]) continue;
    MatSeg of_type[kMaxMatSegs];
    const int n = segments_of_type(segs, n_segs, first, taken, of_type);
    if (matmul_wgmma_takes(of_type, n, n_tokens, extra)) return operand_format_of(segs[first].w.type);
  }
  return OperandFormat::None;
}

bool matmul_mma_two_groups_in_flight(const MatSeg* segs, int n_segs, int n_tokens, const MatVecExtra& extra) {
  return one_fragment_choice_of(segs, n_segs, n_tokens, extra).kernel == OneFragmentKernel::TwoGroupsInRegisters;
}

int matmul_mma_two_type_ring_ctas_per_sm(const MatSeg* segs, int n_segs, int n_tokens, const MatVecExtra& extra) {
  if (n_segs < 1 || n_segs > kMaxMatSegs || n_tokens < 1) return 0;
  const MmaArgs a = mma_args(segs, n_segs, Q8Plane{}, n_tokens, extra);
  return two_type_ring_ctas_per_sm(a, row_tiles_of(a));
}

int matmul_mma_weight_ring_ctas_per_sm(const MatSeg* segs, int n_segs, int n_tokens, const MatVecExtra& extra) {
  const OneFragmentChoice choice = one_fragment_choice_of(segs, n_segs, n_tokens, extra);
  return choice.kernel == OneFragmentKernel::WeightRing ? choice.ring_ctas_per_sm : 0;
}

bool matmul_mma_shared_activations(const MatSeg* segs, int n_segs, int n_tokens, const MatVecExtra& extra) {
  return one_fragment_choice_of(segs, n_segs, n_tokens, extra).kernel == OneFragmentKernel::SharedActivations;
}

bool matmul_mma_weight_ring_over_tiles(const MatSeg* segs, int n_segs, int n_tokens, const MatVecExtra& extra) {
  return one_fragment_choice_of(segs, n_segs, n_tokens, extra).kernel == OneFragmentKernel::WeightRingOverTiles;
}

bool matmul_mma_ring_tensor_copies(const MatSeg* segs, int n_segs, int n_tokens, const MatVecExtra& extra) {
  const OneFragmentKernel k = one_fragment_choice_of(segs, n_segs, n_tokens, extra).kernel;
  if (k != OneFragmentKernel::WeightRing && k != OneFragmentKernel::WeightRingOverTiles) return false;
  return ring_tensor_copies(mma_args(segs, n_segs, Q8Plane{}, n_tokens, extra));
}

bool matmul_mma_supports(GgmlType t) {
  return t == GgmlType::Q4_K || t == GgmlType::Q5_K || t == GgmlType::Q6_K || t == GgmlType::Q8_0;
}

void launch_matmul_mma(const MatSeg* segs, int n_segs, const Q8Plane& act_q8, int n_tokens, const MatVecExtra& extra,
                       const KernelStream& s) {
  if (n_segs < 1 || n_segs > kMaxMatSegs) fail("matmul_mma: ", n_segs, " segments (1..", kMaxMatSegs, " supported)");
  if (act_q8.token0 % 32 != 0) fail("matmul_mma: the plane view starts at token ", act_q8.token0, ", not a tile");
  for (int i = 0; i < n_segs; ++i) {
    if (!matmul_mma_supports(segs[i].w.type))
      fail("matmul_mma: no kernel for weight type ", type_traits(segs[i].w.type).name);
    if (segs[i].w.cols % type_traits(segs[i].w.type).block_size != 0)
      fail("matmul_mma: rows of ", segs[i].w.cols, " do not fill whole blocks");
  }
  if (n_tokens <= 0 || launch_q4k_q6k(segs, n_segs, act_q8, n_tokens, extra, s)) return;
  MatVecExtra launch_extra = extra;  // its operand_ready follows the image through the launches
  struct TypeLaunch {
    int n, row_tiles;
    MatSeg segs[kMaxMatSegs];
  };
  TypeLaunch launches[kMaxMatSegs];
  int n_launches = 0;
  bool taken[kMaxMatSegs] = {};
  for (int first = 0; first < n_segs; ++first) {
    if (taken[first]) continue;
    TypeLaunch& t = launches[n_launches++];
    t.n = segments_of_type(segs, n_segs, first, taken, t.segs);
    t.row_tiles = row_tiles_of(mma_args(t.segs, t.n, act_q8, n_tokens, launch_extra));
  }
  // Side by side (at one token fragment), the type of the fewest row tiles launches first and the
  // others beside it: their CTAs find room on the SMs its few CTAs leave (the 14B's 64 q6_K v tiles,
  // then q/k's 384 beside them: one wave; the other way round v's CTAs found none until q/k's left).
  const bool side_by_side = extra.types_side_by_side && n_tokens <= 8;
  if (side_by_side)
    std::stable_sort(launches, launches + n_launches,
                     [](const TypeLaunch& x, const TypeLaunch& y) { return x.row_tiles < y.row_tiles; });
  for (int li = 0; li < n_launches; ++li) {
    const TypeLaunch& t = launches[li];
    const GgmlType type = t.segs[0].w.type;
    if (matmul_wgmma_takes(t.segs, t.n, n_tokens, launch_extra)) {
      launch_matmul_wgmma(t.segs, t.n, act_q8, n_tokens, launch_extra, s);
      launch_extra.wgmma_operand_ready = operand_format_of(type);  // built by (or for) that launch
      continue;
    }
    MmaArgs a = mma_args(t.segs, t.n, act_q8, n_tokens, launch_extra);
    // A later type's launch reads the plane the first one reads and writes rows of its own.
    a.beside_predecessor = side_by_side && li > 0;
    const int row_tiles = row_tiles_of(a);
    switch (type) {
      case GgmlType::Q4_K: launch_group<GroupQK45<false>>(a, row_tiles, s); break;
      case GgmlType::Q5_K: launch_group<GroupQK45<true>>(a, row_tiles, s); break;
      case GgmlType::Q6_K: launch_group<GroupQ6K>(a, row_tiles, s); break;
      default: launch_group<GroupQ8>(a, row_tiles, s); break;
    }
  }
}

bool matmul_mma_swiglu_takes(const MatSeg (&segs)[2], int n_tokens, const MatVecExtra& extra) {
  const MatSeg &gate = segs[0], &up = segs[1];
  if (gate.w.type != GgmlType::Q4_K || gate.w.rows != up.w.rows || gate.w.rows % 256 != 0) return false;
  if (gate.bias || up.bias || gate.residual || up.residual || gate.epi != Epilogue::Store || up.epi != Epilogue::Store)
    return false;
  // gate/up's kernel, the one with the epilogue: 1..8 tokens, segments of one type and one width
  return matmul_mma_weight_ring_over_tiles(segs, 2, n_tokens, extra);
}

void launch_matmul_mma_swiglu(const MatSeg (&segs)[2], const Q8Plane& act_q8, int n_tokens, const MatVecExtra& extra,
                              const KernelStream& s) {
  if (!matmul_mma_swiglu_takes(segs, n_tokens, extra) || extra.swiglu_counts == nullptr ||
      extra.swiglu_out == nullptr || act_q8.token0 % 32 != 0)
    fail("matmul_mma: the swiglu in gate/up's epilogue does not take this launch");
  if (extra.swiglu_q8_rows > n_tokens || (extra.swiglu_q8_rows > 0 && extra.swiglu_q8.n_blocks != segs[0].w.rows / 32))
    fail("matmul_mma: the swiglu's q8 plane is ", 32 * extra.swiglu_q8.n_blocks, " columns wide, its rows ",
         segs[0].w.rows);
  const MmaArgs a = mma_args(segs, 2, act_q8, n_tokens, extra);
  launch_weight_ring_over_tiles<GroupQK45<false>, true>(a, row_tiles_of(a), s);
}

}  // namespace minfer::cuda
