// The decode matmul on int8 tensor cores, for many tokens at once (mma.sync m16n8k32 and, for the
// 16-element scale halves of q6_K, m16n8k16; s8 x s8 -> s32).
//
// A CTA of 8 warps owns a tile of 32 weight rows (two m16 fragments) and up to 64 tokens (8 n8
// fragments). Warp w sums stream w of the canonical order (kernels.h): the 256-column groups
// g = w, w + 8, ... in order; for each group it loads the A fragments of its 4 rows per thread
// once, stages the rows' per-sub-block scales in shared memory, and for every token fragment
// multiplies the 8 sub-blocks, turns each integer sum into its term (quant_device.cuh, the same
// function the warp-per-row kernel calls) and adds the group's tree to its accumulators. The
// block then combines the 8 streams in shared memory with the canonical tree and runs the
// segment epilogue (bias, residual, store / rope / KV write). An integer sum is exact in any
// order, so every output element gets the same bits as from launch_matvec, for any token count.
//
// Within a sub-block the mma's k index is permuted (thread tid supplies elements 8tid..8tid+7 of
// both operands), which leaves the integer sum unchanged and lets each thread load 8 contiguous
// bytes.
#include <algorithm>

#include "backend/cuda/kernels.h"
#include "backend/cuda/quant_device.cuh"
#include "util/error.h"

namespace minfer::cuda {
namespace {

constexpr int kWarps = 8;      // = the 8 streams of the canonical order
constexpr int kThreads = kWarps * 32;
constexpr int kTileRows = 32;  // two m16 fragments
constexpr int kMaxSegs = 3;

struct MmaArgs {
  MatSeg seg[kMaxSegs];
  int first_block[kMaxSegs + 1];
  int n_segs;
  const uint8_t* act;
  int64_t act_stride;
  int n_tokens;
  MatVecExtra extra;
};

// Per-(row, sub-block) scale words staged by each warp for the group it works on.
struct StagedScales {
  float2 w[kTileRows][8];  // q4_K/q5_K: (d*sc, dmin*m); q6_K: (sc_lo, sc_hi) as ints; q8_0: (d, -)
  float d[kTileRows];      // q6_K: the row's d
};
constexpr int kStageBytes = kWarps * int(sizeof(StagedScales));
constexpr int smem_bytes(int ntf) { return std::max(kStageBytes, kWarps * 8 * ntf * 32 * 4); }

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

__device__ __forceinline__ uint32_t ld_word_a2(const uint8_t* p) {
  uint32_t w[1];
  ld_words_a2(p, w);
  return w[0];
}

// ---- weight groups: the A fragments of one thread's 4 rows for one 256-column group ----------
// Rows: R[f][h] = fragment f, row gid + 8h of the tile. a_frag(j, f) gives sub-block j's A
// registers for fragment f; stage() writes one row's scale words for the group.

template <bool Q5>
struct GroupQK45 {
  static constexpr int kBytes = Q5 ? 176 : 144, kQsOffset = Q5 ? 48 : 16;
  static constexpr bool kHalves = false;
  uint2 qs[2][2][4];  // [f][h][pair]: bytes 32 pair + 8 tid .. + 8 of qs
  uint2 qh[2][2];     // q5_K: bytes 8 tid .. + 8 of qh
  __device__ void load(const DevMat& m, const int (&R)[2][2], int g, int tid) {
    const int nsb = m.cols / 256;
#pragma unroll
    for (int f = 0; f < 2; ++f)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint8_t* b = m.data + (size_t(R[f][h]) * nsb + g) * kBytes;
#pragma unroll
        for (int p = 0; p < 4; ++p) qs[f][h][p] = __ldg(reinterpret_cast<const uint2*>(b + kQsOffset + 32 * p + 8 * tid));
        if (Q5) qh[f][h] = __ldg(reinterpret_cast<const uint2*>(b + 16 + 8 * tid));
      }
  }
  __device__ static uint32_t quants(uint32_t q, uint32_t high, int j) {
    uint32_t v = (q >> (4 * (j & 1))) & 0x0F0F0F0Fu;
    if (Q5) v |= ((high >> j) & 0x01010101u) << 4;
    return v;
  }
  __device__ void a_frag(int j, int f, uint32_t (&a)[4]) const {
    const int p = j / 2;
    a[0] = quants(qs[f][0][p].x, Q5 ? qh[f][0].x : 0u, j);
    a[1] = quants(qs[f][1][p].x, Q5 ? qh[f][1].x : 0u, j);
    a[2] = quants(qs[f][0][p].y, Q5 ? qh[f][0].y : 0u, j);
    a[3] = quants(qs[f][1][p].y, Q5 ? qh[f][1].y : 0u, j);
  }
  __device__ static void stage(const DevMat& m, int row, int g, StagedScales& s, int slot) {
    const uint4 h = ld16(m.data + (size_t(row) * (m.cols / 256) + g) * kBytes);
    const float d = h2f(uint16_t(h.x)), dmin = h2f(uint16_t(h.x >> 16));
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      int sc, mn;
      k_scale_min(h, j, sc, mn);
      s.w[slot][j] = make_float2(qk_scale(d, sc), qk_scale(dmin, mn));
    }
  }
  __device__ static float term(const StagedScales& s, int slot, int j, int isum, int, int asum, float da) {
    const float2 w = s.w[slot][j];
    return term_qk(w.x, w.y, isum, asum, da);
  }
};

// q6_K: sub-block j = elements 32j..32j+31 of the super-block (halves lo/hi: l = 0..15, 16..31,
// one int8 scale each). With hh = j / 4, kq = j % 4, element l's low 4 bits are nibble kq / 2 of
// ql[64 hh + 32 (kq & 1) + l] and its high 2 bits are bits 2 kq of qh[32 hh + l].
struct GroupQ6K {
  static constexpr bool kHalves = true;  // two k16 products per sub-block (one scale each half)
  uint32_t ql[2][2][2][2][2];  // [f][h][j/4][(j%4)&1][half]: bytes 4tid..4tid+3 of the 16-byte run
  uint32_t qh[2][2][2][2];     // [f][h][j/4][half]
  __device__ void load(const DevMat& m, const int (&R)[2][2], int g, int tid) {
    const int nsb = m.cols / 256;
#pragma unroll
    for (int f = 0; f < 2; ++f)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint8_t* b = m.data + (size_t(R[f][h]) * nsb + g) * 210;
#pragma unroll
        for (int hh = 0; hh < 2; ++hh)
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            ql[f][h][hh][0][half] = ld_word_a2(b + 64 * hh + 16 * half + 4 * tid);
            ql[f][h][hh][1][half] = ld_word_a2(b + 64 * hh + 32 + 16 * half + 4 * tid);
            qh[f][h][hh][half] = ld_word_a2(b + 128 + 32 * hh + 16 * half + 4 * tid);
          }
      }
  }
  __device__ static uint32_t quants(uint32_t low, uint32_t high, int kq) {
    const uint32_t q = ((low >> (4 * (kq >> 1))) & 0x0F0F0F0Fu) | (((high >> (2 * kq)) & 0x03030303u) << 4);
    return __vsub4(q, 0x20202020u);
  }
  // The k16 A registers of sub-block j, half `half`, fragment f: rows gid and gid + 8.
  __device__ void a_half(int j, int half, int f, uint32_t& a0, uint32_t& a1) const {
    const int hh = j / 4, kq = j % 4;
    a0 = quants(ql[f][0][hh][kq & 1][half], qh[f][0][hh][half], kq);
    a1 = quants(ql[f][1][hh][kq & 1][half], qh[f][1][hh][half], kq);
  }
  __device__ static void stage(const DevMat& m, int row, int g, StagedScales& s, int slot) {
    const uint8_t* b = m.data + (size_t(row) * (m.cols / 256) + g) * 210;
    uint32_t sc[4];
    ld_words_a2(b + 192, sc);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int lo = int(int8_t(sc[j / 2] >> (16 * (j & 1)))), hi = int(int8_t(sc[j / 2] >> (16 * (j & 1) + 8)));
      s.w[slot][j] = make_float2(__int_as_float(lo), __int_as_float(hi));
    }
    s.d[slot] = h2f(ld_u16(b + 208));
  }
  __device__ static float term(const StagedScales& s, int slot, int j, int isum_lo, int isum_hi, int, float da) {
    const float2 w = s.w[slot][j];
    return term_q6k(s.d[slot], __float_as_int(w.x) * isum_lo + __float_as_int(w.y) * isum_hi, da);
  }
};

// q8_0: sub-block j = block 8g + j (34 bytes: f16 d, 32 int8); the last group may be partial.
struct GroupQ8 {
  static constexpr bool kHalves = false;
  uint32_t q[2][2][8][2];  // [f][h][j]: bytes 8tid..8tid+7 of the block's quants
  __device__ void load(const DevMat& m, const int (&R)[2][2], int g, int tid) {
    const int nb = m.cols / 32;
#pragma unroll
    for (int f = 0; f < 2; ++f)
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          q[f][h][j][0] = q[f][h][j][1] = 0;
          if (8 * g + j < nb) ld_words_a2(m.data + (size_t(R[f][h]) * nb + 8 * g + j) * 34 + 2 + 8 * tid, q[f][h][j]);
        }
  }
  __device__ void a_frag(int j, int f, uint32_t (&a)[4]) const {
    a[0] = q[f][0][j][0];
    a[1] = q[f][1][j][0];
    a[2] = q[f][0][j][1];
    a[3] = q[f][1][j][1];
  }
  __device__ static void stage(const DevMat& m, int row, int g, StagedScales& s, int slot) {
    const int nb = m.cols / 32;
#pragma unroll
    for (int j = 0; j < 8; ++j)
      s.w[slot][j].x = 8 * g + j < nb ? h2f(ld_u16(m.data + (size_t(row) * nb + 8 * g + j) * 34)) : 0.0f;
  }
  __device__ static float term(const StagedScales& s, int slot, int j, int isum, int, int, float da) {
    return term_q8_0(s.w[slot][j].x, isum, da);
  }
};

// Rows of the tile: fragment f, row m. Roped segments pair row m of fragment 0 with its rope
// partner as row m of fragment 1 (tile = 16 pairs), so the epilogue holds both halves of a pair.
__device__ __forceinline__ void tile_row(const MatSeg& seg, const MatVecExtra& extra, int tile, int f, int m,
                                         int& row, int& rope_j, bool& valid) {
  if (seg.epi == Epilogue::RopeQ || seg.epi == Epilogue::RopeK) {
    const int p = tile * 16 + m;
    valid = p < seg.w.rows / 2;
    int r0 = 0, r1 = 0;
    rope_j = 0;
    if (valid) rope_pair_index(p, extra.rope.head_dim, extra.rope.neox, r0, r1, rope_j);
    row = f == 0 ? r0 : r1;
  } else {
    row = tile * kTileRows + 16 * f + m;
    valid = row < seg.w.rows;
    rope_j = 0;
  }
  if (!valid) row = 0;  // loads stay in bounds; the result is dropped
}

template <typename Group, int NTF>
__device__ void tile_streams(const MmaArgs& a, const MatSeg& seg, int tile, int t0, StagedScales& staged,
                             float (&acc)[2][NTF][4]) {
  const DevMat& m = seg.w;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gid = lane / 4, tid = lane % 4;
  int R[2][2];
#pragma unroll
  for (int f = 0; f < 2; ++f)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      int j;
      bool ok;
      tile_row(seg, a.extra, tile, f, gid + 8 * h, R[f][h], j, ok);
    }
  int stage_row, unused_j;
  bool stage_ok;
  tile_row(seg, a.extra, tile, lane / 16, lane % 16, stage_row, unused_j, stage_ok);
  const int n_groups = (m.cols + 255) / 256;
  const int n_blocks = m.cols / 32;
  const int last = a.n_tokens - 1;

  for (int g = warp; g < n_groups; g += kWarps) {
    Group grp;
    grp.load(m, R, g, tid);
    Group::stage(m, stage_row, g, staged, lane);
    __syncwarp();
#pragma unroll
    for (int nf = 0; nf < NTF; ++nf) {
      const uint8_t* act_b = a.act + size_t(min(t0 + 8 * nf + gid, last)) * a.act_stride;
      const uint8_t* act_c[2] = {a.act + size_t(min(t0 + 8 * nf + 2 * tid, last)) * a.act_stride,
                                 a.act + size_t(min(t0 + 8 * nf + 2 * tid + 1, last)) * a.act_stride};
      float pair[4][2][4];  // [j / 2][f][e]: T_{2p} + T_{2p+1}
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int blk = 8 * g + j;
        const bool in_row = blk < n_blocks;
        float term[2][4];
        if (in_row) {
          const uint8_t* b = act_b + size_t(blk) * kPad40Bytes;
          int c[2][4] = {}, c_hi[2][4] = {};
          if constexpr (Group::kHalves) {
            const uint32_t b_lo = ld4(b + 4 + 4 * tid), b_hi = ld4(b + 20 + 4 * tid);
#pragma unroll
            for (int f = 0; f < 2; ++f) {
              uint32_t a0, a1;
              grp.a_half(j, 0, f, a0, a1);
              mma_k16(c[f], a0, a1, b_lo);
              grp.a_half(j, 1, f, a0, a1);
              mma_k16(c_hi[f], a0, a1, b_hi);
            }
          } else {
            const uint32_t b0 = ld4(b + 4 + 8 * tid), b1 = ld4(b + 8 + 8 * tid);
#pragma unroll
            for (int f = 0; f < 2; ++f) {
              uint32_t af[4];
              grp.a_frag(j, f, af);
              mma_k32(c[f], af, b0, b1);
            }
          }
          float da[2];
          int asum[2];
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const ActQ8 ab{act_c[e] + size_t(blk) * kPad40Bytes};
            da[e] = ab.d();
            asum[e] = ab.sum();
          }
#pragma unroll
          for (int f = 0; f < 2; ++f)
#pragma unroll
            for (int e = 0; e < 4; ++e)
              term[f][e] = Group::term(staged, 16 * f + gid + 8 * (e >> 1), j, c[f][e], c_hi[f][e], asum[e & 1], da[e & 1]);
        } else {
#pragma unroll
          for (int f = 0; f < 2; ++f)
#pragma unroll
            for (int e = 0; e < 4; ++e) term[f][e] = 0.0f;
        }
#pragma unroll
        for (int f = 0; f < 2; ++f)
#pragma unroll
          for (int e = 0; e < 4; ++e)
            pair[j / 2][f][e] = (j & 1) ? __fadd_rn(pair[j / 2][f][e], term[f][e]) : term[f][e];
      }
#pragma unroll
      for (int f = 0; f < 2; ++f)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float group = __fadd_rn(__fadd_rn(pair[0][f][e], pair[1][f][e]), __fadd_rn(pair[2][f][e], pair[3][f][e]));
          acc[f][nf][e] = __fadd_rn(acc[f][nf][e], group);
        }
    }
    __syncwarp();  // the next group's staging overwrites this one's scales
  }
}

// REQUIRES: blockDim.x == kThreads; gridDim.x = the segments' tiles (first_block), gridDim.y =
// ceil(n_tokens / (8 NTF)); dynamic shared memory smem_bytes(NTF). Every thread reaches both
// barriers: rows and tokens past the end are computed on clamped indices and dropped at the store.
template <int NTF>
__global__ void __launch_bounds__(kThreads) matmul_mma_kernel(const __grid_constant__ MmaArgs a) {
  extern __shared__ __align__(16) uint8_t smem[];
  int si = 0;
  while (si + 1 < a.n_segs && int(blockIdx.x) >= a.first_block[si + 1]) ++si;
  const MatSeg& seg = a.seg[si];
  const int tile = int(blockIdx.x) - a.first_block[si];
  const int t0 = int(blockIdx.y) * 8 * NTF;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gid = lane / 4, tid = lane % 4;
  StagedScales& staged = reinterpret_cast<StagedScales*>(smem)[warp];

  float acc[2][NTF][4];
#pragma unroll
  for (int f = 0; f < 2; ++f)
#pragma unroll
    for (int nf = 0; nf < NTF; ++nf)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[f][nf][e] = 0.0f;
  switch (seg.w.type) {
    case GgmlType::Q4_K: tile_streams<GroupQK45<false>, NTF>(a, seg, tile, t0, staged, acc); break;
    case GgmlType::Q5_K: tile_streams<GroupQK45<true>, NTF>(a, seg, tile, t0, staged, acc); break;
    case GgmlType::Q6_K: tile_streams<GroupQ6K, NTF>(a, seg, tile, t0, staged, acc); break;
    case GgmlType::Q8_0: tile_streams<GroupQ8, NTF>(a, seg, tile, t0, staged, acc); break;
    default: break;  // the launcher only sends supported types
  }

  // The streams meet in shared memory (the staging area is reused): red[warp][value][lane].
  __syncthreads();
  float* red = reinterpret_cast<float*>(smem);
  constexpr int kValues = 2 * NTF * 4;
#pragma unroll
  for (int f = 0; f < 2; ++f)
#pragma unroll
    for (int nf = 0; nf < NTF; ++nf)
#pragma unroll
      for (int e = 0; e < 4; ++e) red[(warp * kValues + (f * NTF + nf) * 4 + e) * 32 + lane] = acc[f][nf][e];
  __syncthreads();
  // Warp w finishes the (token fragment, element) pairs w, w + 8, ... of every lane position.
  for (int q = warp; q < NTF * 4; q += kWarps) {
    const int nf = q / 4, e = q % 4;
    float s[2][8];
#pragma unroll
    for (int f = 0; f < 2; ++f)
#pragma unroll
      for (int w = 0; w < kWarps; ++w) s[f][w] = red[(w * kValues + (f * NTF + nf) * 4 + e) * 32 + lane];
    const int t = t0 + 8 * nf + 2 * tid + (e & 1);
    int r0, r1, j, unused;
    bool ok0, ok1;
    tile_row(seg, a.extra, tile, 0, gid + 8 * (e >> 1), r0, j, ok0);
    tile_row(seg, a.extra, tile, 1, gid + 8 * (e >> 1), r1, unused, ok1);
    if (t < a.n_tokens && ok0) store_pair(seg, a.extra, t, r0, r1, j, ok1, stream_tree(s[0]), stream_tree(s[1]));
  }
}

template <int NTF>
void launch_ntf(const MmaArgs& a, int blocks, cudaStream_t s) {
  const dim3 grid(blocks, (a.n_tokens + 8 * NTF - 1) / (8 * NTF));
  matmul_mma_kernel<NTF><<<grid, kThreads, smem_bytes(NTF), s>>>(a);
}

}  // namespace

bool matmul_mma_supports(GgmlType t) {
  return t == GgmlType::Q4_K || t == GgmlType::Q5_K || t == GgmlType::Q6_K || t == GgmlType::Q8_0;
}

void init_matmul_mma_kernels() {
  auto set = [](const void* fn, int bytes) {
    const cudaError_t e = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    if (e != cudaSuccess) fail("matmul_mma: cannot reserve ", bytes, " bytes of shared memory: ", cudaGetErrorString(e));
  };
  set(reinterpret_cast<const void*>(matmul_mma_kernel<1>), smem_bytes(1));
  set(reinterpret_cast<const void*>(matmul_mma_kernel<2>), smem_bytes(2));
  set(reinterpret_cast<const void*>(matmul_mma_kernel<4>), smem_bytes(4));
  set(reinterpret_cast<const void*>(matmul_mma_kernel<8>), smem_bytes(8));
}

void launch_matmul_mma(const MatSeg* segs, int n_segs, const uint8_t* act_q8, int64_t act_q8_stride,
                       int n_tokens, const MatVecExtra& extra, cudaStream_t s) {
  if (n_segs < 1 || n_segs > kMaxSegs) fail("matmul_mma: ", n_segs, " segments (1..3 supported)");
  if (n_tokens <= 0) return;
  MmaArgs a{};
  a.n_segs = n_segs;
  int blocks = 0;
  for (int i = 0; i < n_segs; ++i) {
    const MatSeg& seg = segs[i];
    if (!matmul_mma_supports(seg.w.type))
      fail("matmul_mma: no kernel for weight type ", type_traits(seg.w.type).name);
    if (seg.w.cols % type_traits(seg.w.type).block_size != 0)
      fail("matmul_mma: rows of ", seg.w.cols, " do not fill whole blocks");
    a.seg[i] = seg;
    a.first_block[i] = blocks;
    const bool roped = seg.epi == Epilogue::RopeQ || seg.epi == Epilogue::RopeK;
    blocks += roped ? (seg.w.rows / 2 + 15) / 16 : (seg.w.rows + kTileRows - 1) / kTileRows;
  }
  a.first_block[n_segs] = blocks;
  a.act = act_q8;
  a.act_stride = act_q8_stride;
  a.n_tokens = n_tokens;
  a.extra = extra;
  if (n_tokens <= 8)
    launch_ntf<1>(a, blocks, s);
  else if (n_tokens <= 16)
    launch_ntf<2>(a, blocks, s);
  else if (n_tokens <= 32)
    launch_ntf<4>(a, blocks, s);
  else
    launch_ntf<8>(a, blocks, s);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) fail("CUDA kernel matmul_mma: ", cudaGetErrorString(e));
}

}  // namespace minfer::cuda
