// Causal flash attention for prefill over the f16 KV cache (online softmax, f16 tensor cores).
// One CTA = 64 query tokens of one head, 4 warps of 16 queries each. K and V tiles of 64 cache
// positions stream through a double-buffered cp.async pipeline; S = Q K^T stays in registers, is
// turned into probabilities there and re-packed as the A operand of P V (no shared round trip).
// Two multiply kernels, the same key tiles, masks, softmax and rounding points: mma.sync (each
// warp its 16 rows, operands by ldmatrix) and, on sm_90, warpgroup MMA (the CTA's 128 threads are
// one warpgroup: S by wgmma with Q and K read from shared memory, P V by wgmma with P from the S
// registers and V read transposed from shared memory).
#include <algorithm>
#include <cmath>

#include "backend/cuda/prefill.h"
#include "backend/cuda/prefill_mma.cuh"
#include "util/env.h"
#include "util/error.h"

namespace minfer::cuda {
namespace {

using namespace prefill_detail;

constexpr int kQueries = 64;   // query rows per CTA
constexpr int kKeys = 64;      // cache positions per pipeline step
constexpr int kThreads = 128;  // 4 warps x 16 query rows
constexpr float kLog2e = 1.4426950408889634f;

// A tile row is one head vector of f16. mma.sync: rows of kHeadDim / 8 16-byte chunks, chunk c of
// row r at c ^ (r & 7). Warpgroup MMA: panels of 64 rows x 64 elements (128-byte rows, the
// 128-byte-swizzle layout wgmma reads), a 128-element head vector in two panels 8 KB apart; the
// tiles start 1024-byte aligned (kSmemBytes holds the padding).
template <int kHeadDim, bool kWgmma>
struct AttentionShape {
  static_assert(kQueries == 64 && kKeys == 64, "a panel is 64 rows");
  using Tile = SwizzledTile<kHeadDim / 8>;
  using Panel = SwizzledTile<8>;
  static constexpr int kPanelBytes = 64 * Panel::kRowBytes;
  static constexpr int kTileBytes = kKeys * Tile::kRowBytes;  // the same bytes in either layout
  static constexpr int kQBytes = kQueries * Tile::kRowBytes;
  static_assert(kHeadDim / 64 * kPanelBytes == kTileBytes, "a tile is whole panels");
  static constexpr int kSmemBytes = kQBytes + 4 * kTileBytes + (kWgmma ? 1024 : 0);  // Q, K[2], V[2]
  static constexpr int kDSteps = kHeadDim / 16;   // k16 steps of Q K^T
  static constexpr int kDFrags = kHeadDim / 8;    // n8 fragments of the output
  __device__ static uint32_t offset(int row, int chunk) {
    if constexpr (kWgmma) return uint32_t((chunk / 8) * kPanelBytes) + Panel::offset(row, chunk % 8);
    else return Tile::offset(row, chunk);
  }
};

struct AttentionParams {
  const float* q;
  int64_t ldq;
  const __half* k_cache;
  const __half* v_cache;
  int64_t ld_kv;
  float* out;
  uint16_t* out_bf16;
  int64_t ldo;
  const PrefillChunk* chunks;
  const PrefillTile* tiles;
  const int32_t* tables;
  int block_size;
  int group;         // n_head / n_kv_head
  float scale_log2;  // softmax scale * log2(e): scores are kept in the exp2 domain
};

// REQUIRES: blockDim.x == kThreads; gridDim = (n_head, number of tiles); dynamic shared memory
// AttentionShape<kHeadDim, kWgmma>::kSmemBytes. blockIdx.y is the tile (the host orders them
// longest causal range first). kWgmma: sm_90a (other compilations trap).
template <int kHeadDim, bool kWgmma>
__global__ void __launch_bounds__(kThreads, 2) prefill_attention_kernel(const AttentionParams p) {
  using Shape = AttentionShape<kHeadDim, kWgmma>;
  constexpr int kChunks = kHeadDim / 8;
  if constexpr (kWgmma && !device_has_wgmma()) __trap();
  extern __shared__ __align__(128) uint8_t smem_raw[];
  const uint32_t smem_pad = kWgmma ? pad_to_1024(shared_address(smem_raw)) : 0u;
  uint8_t* const smem = smem_raw + smem_pad;
  const uint32_t q_smem = shared_address(smem);
  const uint32_t k_smem = q_smem + Shape::kQBytes;
  const uint32_t v_smem = k_smem + 2 * Shape::kTileBytes;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int head = blockIdx.x, kv_head = head / p.group;
  const PrefillTile tile = p.tiles[blockIdx.y];
  const PrefillChunk seq = p.chunks[tile.chunk];
  const int q0 = tile.q0, m = seq.m, pos0 = seq.pos0;
  const float* q_rows = p.q + int64_t(seq.row0) * p.ldq;
  const int32_t* table = p.tables + seq.table_offset;
  const int block_shift = __ffs(p.block_size) - 1;
  const int q_last = min(q0 + kQueries, m) - 1;
  const int kv_end = pos0 + q_last + 1;  // positions this CTA may read: [0, kv_end)
  const int steps = (kv_end + kKeys - 1) / kKeys;

  auto load_kv = [&](int step, int buffer) {
#pragma unroll
    for (int i = 0; i < kKeys * kChunks / kThreads; ++i) {
      const int idx = tid + i * kThreads;
      const int row = idx / kChunks, chunk = idx % kChunks;
      const int pos = step * kKeys + row;
      const bool valid = pos < kv_end;  // past it: zero-filled, never read
      const int64_t slot = valid ? int64_t(table[pos >> block_shift]) * p.block_size + (pos & (p.block_size - 1)) : 0;
      const int64_t offset = slot * p.ld_kv + kv_head * kHeadDim + chunk * 8;
      const uint32_t dst = buffer * Shape::kTileBytes + Shape::offset(row, chunk);
      cp_async16(k_smem + dst, p.k_cache + offset, valid);
      cp_async16(v_smem + dst, p.v_cache + offset, valid);
    }
  };
  load_kv(0, 0);
  cp_async_commit();

  // Q tile: f32 -> scaled f16 into shared memory (rows past m are zeros).
  for (int idx = tid; idx < kQueries * kChunks; idx += kThreads) {
    const int row = idx / kChunks, chunk = idx % kChunks;
    float4 lo = make_float4(0, 0, 0, 0), hi = lo;
    if (q0 + row < m) {
      const float4* src = reinterpret_cast<const float4*>(q_rows + int64_t(q0 + row) * p.ldq + head * kHeadDim + chunk * 8);
      lo = src[0], hi = src[1];
    }
    const float s = p.scale_log2;
    *reinterpret_cast<uint4*>(smem + Shape::offset(row, chunk)) =
        make_uint4(pack_f16x2(lo.x * s, lo.y * s), pack_f16x2(lo.z * s, lo.w * s),
                   pack_f16x2(hi.x * s, hi.y * s), pack_f16x2(hi.z * s, hi.w * s));
  }
  if constexpr (kWgmma) fence_proxy_async_shared();  // the Q stores, for the tensor cores
  __syncthreads();
  uint32_t qf[kWgmma ? 1 : Shape::kDSteps][4];  // mma.sync: the warp's Q fragments
  if constexpr (!kWgmma)
#pragma unroll
    for (int kk = 0; kk < Shape::kDSteps; ++kk)
      ldmatrix_x4(qf[kk], q_smem + Shape::offset(warp * 16 + (lane & 15), 2 * kk + (lane >> 4)));

  // This thread's two query rows (fragment rows lane/4 and lane/4 + 8) and their causal limits.
  int limit[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) limit[h] = pos0 + q0 + warp * 16 + (lane >> 2) + 8 * h;
  const int cta_min_limit = pos0 + q0;

  float o[Shape::kDFrags][4];
#pragma unroll
  for (int j = 0; j < Shape::kDFrags; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) o[j][e] = 0.0f;
  float row_max[2] = {-INFINITY, -INFINITY};
  float row_sum[2] = {0.0f, 0.0f};  // this thread's partial sums; reduced over the quad at the end

  for (int step = 0; step < steps; ++step) {
    cp_async_wait<0>();
    if constexpr (kWgmma) fence_proxy_async_shared();  // this thread's copies, for the tensor cores
    // After this barrier the tile of `step` is visible and every warp is done with step - 1's buffer.
    __syncthreads();
    if (step + 1 < steps) load_kv(step + 1, (step + 1) & 1);
    cp_async_commit();

    const int buffer = step & 1;
    const uint32_t k_tile = k_smem + buffer * Shape::kTileBytes;
    const uint32_t v_tile = v_smem + buffer * Shape::kTileBytes;

    float s[kKeys / 8][4];
#pragma unroll
    for (int j = 0; j < kKeys / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[j][e] = 0.0f;
    if constexpr (kWgmma) {  // the m64n64 accumulators are s[j][e] in the mma.sync layout, warp by warp
      float(&s_flat)[kKeys / 2] = reinterpret_cast<float(&)[kKeys / 2]>(s);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < Shape::kDSteps; ++kk) {
        const uint32_t k_offset = uint32_t((kk / 4) * Shape::kPanelBytes + (kk % 4) * 32);
        wgmma_f16_n64(s_flat, sw128_descriptor(q_smem + k_offset), sw128_descriptor(k_tile + k_offset));
      }
      wgmma_commit();
      wgmma_wait<0>();
#pragma unroll
      for (int e = 0; e < kKeys / 2; ++e) fence_operand(s_flat[e]);
    } else {
#pragma unroll
      for (int kk = 0; kk < Shape::kDSteps; ++kk) {
#pragma unroll
        for (int j = 0; j < kKeys / 16; ++j) {
          uint32_t kb[4];
          ldmatrix_x4(kb, k_tile + Shape::offset(j * 16 + (lane & 7) + ((lane >> 4) << 3),
                                                 2 * kk + ((lane >> 3) & 1)));
          mma_f16(s[2 * j], qf[kk], kb[0], kb[1]);
          mma_f16(s[2 * j + 1], qf[kk], kb[2], kb[3]);
        }
      }
    }

    if (step * kKeys + kKeys - 1 > cta_min_limit) {  // the tile crosses some row's causal limit
#pragma unroll
      for (int j = 0; j < kKeys / 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (step * kKeys + j * 8 + 2 * (lane & 3) + (e & 1) > limit[e >> 1]) s[j][e] = -INFINITY;
    }

    // Online softmax; position 0 is visible to every row, so after step 0 each max is finite.
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float mx = row_max[h];
#pragma unroll
      for (int j = 0; j < kKeys / 8; ++j) mx = fmaxf(mx, fmaxf(s[j][2 * h], s[j][2 * h + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float alpha = exp2f(row_max[h] - mx);
      row_max[h] = mx;
      float sum = 0.0f;
#pragma unroll
      for (int j = 0; j < kKeys / 8; ++j) {
        s[j][2 * h] = exp2f(s[j][2 * h] - mx);
        s[j][2 * h + 1] = exp2f(s[j][2 * h + 1] - mx);
        sum += s[j][2 * h] + s[j][2 * h + 1];
      }
      row_sum[h] = row_sum[h] * alpha + sum;
#pragma unroll
      for (int j = 0; j < Shape::kDFrags; ++j) o[j][2 * h] *= alpha, o[j][2 * h + 1] *= alpha;
    }

    // O += P V: the S accumulators of n-fragments 2t, 2t+1 form the A fragment of keys 16t..16t+15.
    uint32_t pa[kKeys / 16][4];
#pragma unroll
    for (int t = 0; t < kKeys / 16; ++t) {
      pa[t][0] = pack_f16x2(s[2 * t][0], s[2 * t][1]), pa[t][1] = pack_f16x2(s[2 * t][2], s[2 * t][3]);
      pa[t][2] = pack_f16x2(s[2 * t + 1][0], s[2 * t + 1][1]), pa[t][3] = pack_f16x2(s[2 * t + 1][2], s[2 * t + 1][3]);
    }
    if constexpr (kWgmma) {  // V's 16 key rows of slice t: two 8-row atoms from row 16t of its panels
      float(&o_flat)[kHeadDim / 2] = reinterpret_cast<float(&)[kHeadDim / 2]>(o);
      wgmma_fence();
#pragma unroll
      for (int t = 0; t < kKeys / 16; ++t)
        wgmma_f16_regs_a_mn_b<kHeadDim>(o_flat, pa[t], sw128_mn_descriptor(v_tile + uint32_t(t * 16 * 128), Shape::kPanelBytes));
      wgmma_commit();
      wgmma_wait<0>();
#pragma unroll
      for (int e = 0; e < kHeadDim / 2; ++e) fence_operand(o_flat[e]);
#pragma unroll
      for (int t = 0; t < kKeys / 16; ++t)
#pragma unroll
        for (int e = 0; e < 4; ++e) fence_operand(pa[t][e]);
    } else {
#pragma unroll
      for (int t = 0; t < kKeys / 16; ++t)
#pragma unroll
        for (int dj = 0; dj < kHeadDim / 16; ++dj) {
          uint32_t vb[4];
          ldmatrix_x4_trans(vb, v_tile + Shape::offset(t * 16 + (lane & 7) + ((lane >> 3) & 1) * 8,
                                                       2 * dj + (lane >> 4)));
          mma_f16(o[2 * dj], pa[t], vb[0], vb[1]);
          mma_f16(o[2 * dj + 1], pa[t], vb[2], vb[3]);
        }
    }
  }

#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float sum = row_sum[h];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    const float inv = 1.0f / sum;
    const int query = q0 + warp * 16 + (lane >> 2) + 8 * h;
    if (query >= m) continue;
    const int64_t row = seq.row0 + query;
#pragma unroll
    for (int j = 0; j < Shape::kDFrags; ++j) {
      const int col = head * kHeadDim + j * 8 + 2 * (lane & 3);
      const float2 v = make_float2(o[j][2 * h] * inv, o[j][2 * h + 1] * inv);
      *reinterpret_cast<float2*>(p.out + int64_t(row) * p.ldo + col) = v;
      if (p.out_bf16)
        *reinterpret_cast<uint32_t*>(p.out_bf16 + int64_t(row) * p.ldo + col) = prefill_activation_bf16x2(v.x, v.y);
    }
  }
}

template <int kHeadDim, bool kWgmma>
void launch_head_dim(const AttentionParams& p, int n_head, int n_tiles, cudaStream_t stream) {
  constexpr int smem = AttentionShape<kHeadDim, kWgmma>::kSmemBytes;
  reserve_dynamic_shared_memory(prefill_attention_kernel<kHeadDim, kWgmma>, smem, "prefill attention");
  prefill_attention_kernel<kHeadDim, kWgmma><<<dim3(n_head, n_tiles), kThreads, smem, stream>>>(p);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) fail("CUDA kernel prefill attention: ", cudaGetErrorString(e));
}

bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

}  // namespace

bool prefill_attention_uses_wgmma(const PrefillAttention& a) {
  if (a.wgmma == 1) return true;
  return a.wgmma == 0 && !env_flag("MINFER_NO_WGMMA_ATTENTION") && prefill_gemm_device_has_wgmma();
}

void launch_prefill_attention(const PrefillAttention& a, cudaStream_t stream) {
  if (a.wgmma < -1 || a.wgmma > 1) fail("prefill attention: wgmma ", a.wgmma, " is not -1, 0 or 1");
  if (a.wgmma == 1 && !prefill_gemm_device_has_wgmma()) fail("prefill attention: warpgroup MMA needs an sm_90 device");
  if (a.head_dim != 64 && a.head_dim != 128)
    fail("prefill attention: head_dim ", a.head_dim, " is not supported (64 or 128)");
  if (a.n_head <= 0 || a.n_kv_head <= 0 || a.n_head % a.n_kv_head != 0)
    fail("prefill attention: n_head ", a.n_head, " is not a positive multiple of n_kv_head ", a.n_kv_head);
  if (a.n_tiles <= 0) return;
  if (a.block_size <= 0 || (a.block_size & (a.block_size - 1)) != 0)
    fail("prefill attention: KV block size ", a.block_size, " is not a power of two");
  const int64_t q_width = int64_t(a.n_head) * a.head_dim, kv_width = int64_t(a.n_kv_head) * a.head_dim;
  if (a.ldq < q_width || a.ldo < q_width || a.ld_kv < kv_width || a.ldq % 8 || a.ldo % 8 || a.ld_kv % 8)
    fail("prefill attention: strides ldq ", a.ldq, ", ldo ", a.ldo, ", ld_kv ", a.ld_kv,
         " must be multiples of 8 covering ", q_width, " (q/out) and ", kv_width, " (kv) elements");
  if (!a.q || !a.k_cache || !a.v_cache || !a.out || !a.chunks || !a.tiles || !a.tables)
    fail("prefill attention: null q, cache, output, chunk, tile or table pointer");
  if (!aligned16(a.q) || !aligned16(a.k_cache) || !aligned16(a.v_cache) || !aligned16(a.out) ||
      !aligned16(a.out_bf16))
    fail("prefill attention: pointers must be 16-byte aligned");

  const AttentionParams p{a.q, a.ldq, reinterpret_cast<const __half*>(a.k_cache),
                          reinterpret_cast<const __half*>(a.v_cache), a.ld_kv, a.out, a.out_bf16, a.ldo,
                          a.chunks, a.tiles, a.tables, a.block_size, a.n_head / a.n_kv_head, a.scale * kLog2e};
  const bool wgmma = prefill_attention_uses_wgmma(a);
  if (a.head_dim == 64)
    wgmma ? launch_head_dim<64, true>(p, a.n_head, a.n_tiles, stream) : launch_head_dim<64, false>(p, a.n_head, a.n_tiles, stream);
  else
    wgmma ? launch_head_dim<128, true>(p, a.n_head, a.n_tiles, stream) : launch_head_dim<128, false>(p, a.n_head, a.n_tiles, stream);
}

std::vector<PrefillTile> prefill_attention_tiles(std::span<const PrefillChunk> chunks) {
  std::vector<PrefillTile> tiles;
  for (size_t c = 0; c < chunks.size(); ++c)
    for (int q0 = 0; q0 < chunks[c].m; q0 += kQueries) tiles.push_back({int32_t(c), q0});
  // Longest causal range (last key position) first.
  std::stable_sort(tiles.begin(), tiles.end(), [&](const PrefillTile& a, const PrefillTile& b) {
    const auto end = [&](const PrefillTile& t) {
      return chunks[size_t(t.chunk)].pos0 + std::min(t.q0 + kQueries, chunks[size_t(t.chunk)].m);
    };
    return end(a) > end(b);
  });
  return tiles;
}

}  // namespace minfer::cuda
