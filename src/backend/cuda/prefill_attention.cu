// Causal flash attention for prefill over the f16 KV cache (online softmax, f16 tensor cores).
// One CTA = 64 query tokens of one head, 4 warps of 16 queries each. K and V tiles of 64 cache
// positions stream through a double-buffered cp.async pipeline; S = Q K^T stays in registers, is
// turned into probabilities there and re-packed as the A operand of P V (no shared round trip).
// Two multiply kernels, the same key tiles, masks, softmax and rounding points: mma.sync (each
// warp its 16 rows, operands by ldmatrix) and, on sm_90, warpgroup MMA (the CTA's 128 threads are
// one warpgroup: S by wgmma with Q and K read from shared memory, P V by wgmma with P from the S
// registers and V read transposed from shared memory). On sm_90 the default is a third kernel,
// warp-specialized: two or three heads of one KV group a CTA, a consumer warpgroup each running
// the same per-tile body (QueryTile) on one K/V stream that a producer warpgroup fills.
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
  static constexpr int kDim = kHeadDim;
  static constexpr int kChunks = kHeadDim / 8;    // 16-byte chunks of a head vector
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
  const PrefillHeadGroup* head_groups;  // the warp-specialized kernel's CTAs
  const int32_t* tables;
  int block_size;
  int group;         // n_head / n_kv_head
  float scale_log2;  // softmax scale * log2(e): scores are kept in the exp2 domain
};

// The causal range of a query tile: cache positions [0, end). The kernels read it, and the host
// orders tiles and head groups by it.
__host__ __device__ __forceinline__ int tile_kv_end(const PrefillChunk& seq, int q0) {
  return seq.pos0 + (q0 + kQueries < seq.m ? q0 + kQueries : seq.m);
}

// K and V of cache positions [step * kKeys, + kKeys) into the shared tiles k_dst, v_dst (positions
// from kv_end on zero-filled); `thread` is one of kLoaders threads sharing the copies.
template <typename Shape, int kLoaders>
__device__ __forceinline__ void load_kv_tile(const AttentionParams& p, const int32_t* table, int block_shift,
                                             int kv_head, int kv_end, int step, uint32_t k_dst, uint32_t v_dst,
                                             int thread) {
  constexpr int kChunks = Shape::kChunks;
#pragma unroll
  for (int i = 0; i < kKeys * kChunks / kLoaders; ++i) {
    const int idx = thread + i * kLoaders;
    const int row = idx / kChunks, chunk = idx % kChunks;
    const int pos = step * kKeys + row;
    const bool valid = pos < kv_end;
    const int64_t slot = valid ? int64_t(table[pos >> block_shift]) * p.block_size + (pos & (p.block_size - 1)) : 0;
    const int64_t offset = slot * p.ld_kv + kv_head * Shape::kDim + chunk * 8;
    const uint32_t dst = Shape::offset(row, chunk);
    cp_async16(k_dst + dst, p.k_cache + offset, valid);
    cp_async16(v_dst + dst, p.v_cache + offset, valid);
  }
}

// One query tile's attention: 64 query rows of one head, held by four warps of 16 rows (mma.sync:
// the CTA's warps; wgmma: one warpgroup). Both kernels below run this body, step for step, so
// they give the same bits.
template <int kHeadDim, bool kWgmma>
struct QueryTile {
  using Shape = AttentionShape<kHeadDim, kWgmma>;
  uint32_t qf[kWgmma ? 1 : Shape::kDSteps][4];  // mma.sync: the warp's Q fragments
  int limit[2];   // this thread's two query rows (fragment rows lane/4, lane/4 + 8): last visible position
  int min_limit;  // the tile's first query's
  float o[Shape::kDFrags][4];
  float row_max[2];
  float row_sum[2];  // this thread's partial sums; reduced over the quad at the end

  // Q rows [q0, q0 + 64) of `head`, f32 -> scaled f16 into the tile at q_tile (rows past m are
  // zeros); `thread` is one of 128.
  __device__ static void stage_q(uint8_t* q_tile, const AttentionParams& p, const PrefillChunk& seq, int q0,
                                 int head, int thread) {
    const float* q_rows = p.q + int64_t(seq.row0) * p.ldq;
    for (int idx = thread; idx < kQueries * Shape::kChunks; idx += 128) {
      const int row = idx / Shape::kChunks, chunk = idx % Shape::kChunks;
      float4 lo = make_float4(0, 0, 0, 0), hi = lo;
      if (q0 + row < seq.m) {
        const float4* src = reinterpret_cast<const float4*>(q_rows + int64_t(q0 + row) * p.ldq + head * kHeadDim + chunk * 8);
        lo = src[0], hi = src[1];
      }
      const float s = p.scale_log2;
      *reinterpret_cast<uint4*>(q_tile + Shape::offset(row, chunk)) =
          make_uint4(pack_f16x2(lo.x * s, lo.y * s), pack_f16x2(lo.z * s, lo.w * s),
                     pack_f16x2(hi.x * s, hi.y * s), pack_f16x2(hi.z * s, hi.w * s));
    }
  }

  // After the staged Q is visible to the tile's warps. first_pos: the tile's first query's position.
  __device__ void begin(uint32_t q_smem, int first_pos, int warp, int lane) {
    if constexpr (!kWgmma)
#pragma unroll
      for (int kk = 0; kk < Shape::kDSteps; ++kk)
        ldmatrix_x4(qf[kk], q_smem + Shape::offset(warp * 16 + (lane & 15), 2 * kk + (lane >> 4)));
#pragma unroll
    for (int h = 0; h < 2; ++h) limit[h] = first_pos + warp * 16 + (lane >> 2) + 8 * h;
    min_limit = first_pos;
#pragma unroll
    for (int j = 0; j < Shape::kDFrags; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[j][e] = 0.0f;
    row_max[0] = row_max[1] = -INFINITY;
    row_sum[0] = row_sum[1] = 0.0f;
  }

  // Keys [step * kKeys, + kKeys) from the K and V tiles; their multiplies have completed on return.
  __device__ void step(int step, uint32_t q_smem, uint32_t k_tile, uint32_t v_tile, int warp, int lane) {
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

    if (step * kKeys + kKeys - 1 > min_limit) {  // the tile crosses some row's causal limit
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

  // out (and the bf16 plane) = o / sum for the tile's rows below m.
  __device__ void store(const AttentionParams& p, const PrefillChunk& seq, int q0, int head, int warp, int lane) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float sum = row_sum[h];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      const float inv = 1.0f / sum;
      const int query = q0 + warp * 16 + (lane >> 2) + 8 * h;
      if (query >= seq.m) continue;
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
};

// REQUIRES: blockDim.x == kThreads; gridDim = (n_head, number of tiles); dynamic shared memory
// AttentionShape<kHeadDim, kWgmma>::kSmemBytes. blockIdx.y is the tile (the host orders them
// longest causal range first). kWgmma: sm_90a (other compilations trap).
template <int kHeadDim, bool kWgmma>
__global__ void __launch_bounds__(kThreads, 2) prefill_attention_kernel(const AttentionParams p) {
  using Shape = AttentionShape<kHeadDim, kWgmma>;
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
  const int32_t* table = p.tables + seq.table_offset;
  const int block_shift = __ffs(p.block_size) - 1;
  const int kv_end = tile_kv_end(seq, tile.q0);  // positions this CTA may read: [0, kv_end)
  const int steps = (kv_end + kKeys - 1) / kKeys;
  const auto load_kv = [&](int step, int buffer) {
    load_kv_tile<Shape, kThreads>(p, table, block_shift, kv_head, kv_end, step, k_smem + buffer * Shape::kTileBytes,
                                  v_smem + buffer * Shape::kTileBytes, tid);
  };
  load_kv(0, 0);
  cp_async_commit();

  QueryTile<kHeadDim, kWgmma> rows;
  rows.stage_q(smem, p, seq, tile.q0, head, tid);
  if constexpr (kWgmma) fence_proxy_async_shared();  // the Q stores, for the tensor cores
  __syncthreads();
  rows.begin(q_smem, seq.pos0 + tile.q0, warp, lane);

  for (int step = 0; step < steps; ++step) {
    cp_async_wait<0>();
    if constexpr (kWgmma) fence_proxy_async_shared();  // this thread's copies, for the tensor cores
    // After this barrier the tile of `step` is visible and every warp is done with step - 1's buffer.
    __syncthreads();
    if (step + 1 < steps) load_kv(step + 1, (step + 1) & 1);
    cp_async_commit();
    const int buffer = step & 1;
    rows.step(step, q_smem, k_smem + buffer * Shape::kTileBytes, v_smem + buffer * Shape::kTileBytes, warp, lane);
  }
  rows.store(p, seq, tile.q0, head, warp, lane);
}

// ---- warp-specialized: two or three query heads of a KV group on one K/V stream ------------------
// A producer warpgroup copies the K/V tiles of a group of items (PrefillHeadGroup) by cp.async
// into a ring of kRingStages stages; kConsumers consumer warpgroups each run one (query tile,
// head) item through QueryTile, the same body as above, so the same bits. A K/V tile is copied
// once for all the group's heads, and the consumers drift apart by up to the ring's depth instead
// of meeting at a block barrier every step, so one's softmax overlaps another's multiplies. Per
// stage two mbarriers: full (the producer's 128 cp.async arrivals) and empty (every consumer
// thread's arrival; a consumer without an item, or past its own causal range, still waits and
// arrives every step). Positions past a consumer's range but inside the group's are real keys,
// masked like the last tile's (probability exactly 0), where the kernel above reads zeros: the
// same sums.
constexpr int kRingStages = 4;

// The register file split by setmaxnreg: 128 x producer + kConsumers x 128 x consumer at most
// (1 + kConsumers) x 128 x the registers a thread gets at launch, one CTA an SM (ptxas: no
// spills; three consumers with a 40-register producer spilled).
template <int kConsumers>
struct WsAttentionRoles {
  static_assert(kConsumers == 2 || kConsumers == 3, "two or three consumer warpgroups");
  static constexpr int kThreads = 128 * (1 + kConsumers);
  static constexpr int kProducerRegisters = kConsumers == 2 ? 56 : 48;
  static constexpr int kConsumerRegisters = kConsumers == 2 ? 224 : 152;
  static_assert(kProducerRegisters + kConsumers * kConsumerRegisters <= (1 + kConsumers) * (65536 / kThreads / 8 * 8));
};

template <int kHeadDim, int kConsumers>
struct WsAttentionShape {
  using Shape = AttentionShape<kHeadDim, true>;
  static constexpr int kStageBytes = 2 * Shape::kTileBytes;  // K, then V; whole 1024-byte panels
  static constexpr int kRingOffset = kConsumers * Shape::kQBytes;
  static constexpr int kBarrierOffset = kRingOffset + kRingStages * kStageBytes;
  static constexpr int kSmemBytes = kBarrierOffset + 2 * kRingStages * 8 + 1024;  // + barriers, alignment
};

// REQUIRES: blockDim.x == WsAttentionRoles<kConsumers>::kThreads; gridDim = (n_kv_head, number of
// head groups); dynamic shared memory WsAttentionShape<kHeadDim, kConsumers>::kSmemBytes; a
// group's tiles belong to one chunk, item 0's causal range the longest; sm_90a (other
// compilations trap).
template <int kHeadDim, int kConsumers>
__global__ void __launch_bounds__(WsAttentionRoles<kConsumers>::kThreads, 1)
    prefill_attention_ws_kernel(const AttentionParams p) {
  using Shape = AttentionShape<kHeadDim, true>;
  using Ws = WsAttentionShape<kHeadDim, kConsumers>;
  using Roles = WsAttentionRoles<kConsumers>;
  if constexpr (!device_has_wgmma()) __trap();
  extern __shared__ __align__(128) uint8_t smem_raw[];
  uint8_t* const smem = smem_raw + pad_to_1024(shared_address(smem_raw));
  const uint32_t base = shared_address(smem);
  const auto k_stage = [&](int s) { return base + uint32_t(Ws::kRingOffset + s * Ws::kStageBytes); };
  const auto v_stage = [&](int s) { return k_stage(s) + uint32_t(Shape::kTileBytes); };
  const auto full = [&](int s) { return base + uint32_t(Ws::kBarrierOffset + 8 * s); };
  const auto empty = [&](int s) { return base + uint32_t(Ws::kBarrierOffset + 8 * (kRingStages + s)); };

  const int tid = threadIdx.x, warp_group = tid / 128;
  const int kv_head = blockIdx.x;
  const PrefillHeadGroup& group = p.head_groups[blockIdx.y];
  const PrefillChunk seq = p.chunks[p.tiles[group.tile[0]].chunk];
  const int kv_end = tile_kv_end(seq, p.tiles[group.tile[0]].q0);  // the group's range
  const int steps = (kv_end + kKeys - 1) / kKeys;

  if (tid == 0)
    for (int s = 0; s < kRingStages; ++s) {
      mbarrier_init(full(s), 128);
      mbarrier_init(empty(s), 128 * kConsumers);
    }
  __syncthreads();  // the last block-wide barrier: the warpgroups part here

  if (warp_group == 0) {  // producer
    warpgroup_registers_down<Roles::kProducerRegisters>();
    const int32_t* table = p.tables + seq.table_offset;
    const int block_shift = __ffs(p.block_size) - 1;
    for (int step = 0; step < steps; ++step) {
      const int s = step % kRingStages;
      mbarrier_wait(empty(s), ((step / kRingStages) & 1) ^ 1);  // the first round passes at once
      load_kv_tile<Shape, 128>(p, table, block_shift, kv_head, kv_end, step, k_stage(s), v_stage(s), tid);
      cp_async_mbarrier_arrive(full(s));
    }
    return;  // no barrier follows
  }

  warpgroup_registers_up<Roles::kConsumerRegisters>();
  const int consumer = warp_group - 1, thread = tid % 128, lane = tid & 31, warp = thread / 32;
  const int head_in_group = group.head[consumer];
  const bool active = head_in_group >= 0;
  const int q0 = p.tiles[active ? group.tile[consumer] : group.tile[0]].q0;
  const int head = kv_head * p.group + head_in_group;
  const int own_steps = active ? (tile_kv_end(seq, q0) + kKeys - 1) / kKeys : 0;
  const uint32_t q_smem = base + uint32_t(consumer * Shape::kQBytes);
  QueryTile<kHeadDim, true> rows;
  if (active) {
    rows.stage_q(smem + consumer * Shape::kQBytes, p, seq, q0, head, thread);
    fence_proxy_async_shared();  // the Q stores, for the tensor cores
    warpgroup_barrier(1 + consumer);
    rows.begin(q_smem, seq.pos0 + q0, warp, lane);
  }
  for (int step = 0; step < steps; ++step) {
    const int s = step % kRingStages;
    mbarrier_wait(full(s), (step / kRingStages) & 1);
    if (step < own_steps) {
      fence_proxy_async_shared();  // the stage's cp.async copies, for the tensor cores
      rows.step(step, q_smem, k_stage(s), v_stage(s), warp, lane);
    }
    mbarrier_arrive(empty(s));
  }
  if (active) rows.store(p, seq, q0, head, warp, lane);
}

template <int kHeadDim, bool kWgmma>
void launch_head_dim(const AttentionParams& p, int n_head, int n_tiles, cudaStream_t stream) {
  constexpr int smem = AttentionShape<kHeadDim, kWgmma>::kSmemBytes;
  reserve_dynamic_shared_memory(prefill_attention_kernel<kHeadDim, kWgmma>, smem, "prefill attention");
  prefill_attention_kernel<kHeadDim, kWgmma><<<dim3(n_head, n_tiles), kThreads, smem, stream>>>(p);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) fail("CUDA kernel prefill attention: ", cudaGetErrorString(e));
}

template <int kHeadDim, int kConsumers>
void launch_warp_specialized(const AttentionParams& p, int n_kv_head, int n_groups, cudaStream_t stream) {
  constexpr int smem = WsAttentionShape<kHeadDim, kConsumers>::kSmemBytes;
  const auto kernel = prefill_attention_ws_kernel<kHeadDim, kConsumers>;
  reserve_dynamic_shared_memory(kernel, smem, "prefill attention");
  kernel<<<dim3(n_kv_head, n_groups), WsAttentionRoles<kConsumers>::kThreads, smem, stream>>>(p);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) fail("CUDA kernel prefill attention (warp-specialized): ", cudaGetErrorString(e));
}

bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

}  // namespace

bool prefill_attention_uses_wgmma(const PrefillAttention& a) {
  if (a.wgmma == 1) return true;
  return a.wgmma == 0 && !env_flag("MINFER_NO_WGMMA_ATTENTION") && prefill_gemm_device_has_wgmma();
}

bool prefill_attention_uses_warp_specialization(const PrefillAttention& a) {
  if (!prefill_attention_uses_wgmma(a) || a.warp_specialized == -1) return false;
  return a.warp_specialized == 1 || !env_flag("MINFER_NO_WS_ATTENTION");
}

void launch_prefill_attention(const PrefillAttention& a, cudaStream_t stream) {
  if (a.wgmma < -1 || a.wgmma > 1) fail("prefill attention: wgmma ", a.wgmma, " is not -1, 0 or 1");
  if (a.wgmma == 1 && !prefill_gemm_device_has_wgmma()) fail("prefill attention: warpgroup MMA needs an sm_90 device");
  if (a.warp_specialized < -1 || a.warp_specialized > 1)
    fail("prefill attention: warp_specialized ", a.warp_specialized, " is not -1, 0 or 1");
  if (a.warp_specialized == 1 && !prefill_attention_uses_wgmma(a))
    fail("prefill attention: the warp-specialized kernel needs warpgroup MMA");
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

  const bool warp_specialized = prefill_attention_uses_warp_specialization(a);
  if (warp_specialized && (!a.head_groups || a.n_head_groups <= 0 || a.head_groups_of != a.n_head / a.n_kv_head ||
                           a.head_group_items < 2 || a.head_group_items > kMaxHeadGroupItems))
    fail("prefill attention: the warp-specialized kernel needs head groups of 2 or 3 items for KV group ",
         a.n_head / a.n_kv_head, " (prefill_attention_head_groups; got ", a.n_head_groups, " groups of ",
         a.head_group_items, " items for KV group ", a.head_groups_of, ")");

  const AttentionParams p{a.q,      a.ldq,   reinterpret_cast<const __half*>(a.k_cache),
                          reinterpret_cast<const __half*>(a.v_cache), a.ld_kv, a.out, a.out_bf16, a.ldo,
                          a.chunks, a.tiles, a.head_groups, a.tables, a.block_size, a.n_head / a.n_kv_head,
                          a.scale * kLog2e};
  if (warp_specialized) {
    const bool three = a.head_group_items == 3;
    if (a.head_dim == 64)
      three ? launch_warp_specialized<64, 3>(p, a.n_kv_head, a.n_head_groups, stream)
            : launch_warp_specialized<64, 2>(p, a.n_kv_head, a.n_head_groups, stream);
    else
      three ? launch_warp_specialized<128, 3>(p, a.n_kv_head, a.n_head_groups, stream)
            : launch_warp_specialized<128, 2>(p, a.n_kv_head, a.n_head_groups, stream);
    return;
  }
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
  const auto end = [&](const PrefillTile& t) { return tile_kv_end(chunks[size_t(t.chunk)], t.q0); };
  std::stable_sort(tiles.begin(), tiles.end(), [&](const PrefillTile& a, const PrefillTile& b) { return end(a) > end(b); });
  return tiles;
}

std::vector<PrefillHeadGroup> prefill_attention_head_groups(std::span<const PrefillChunk> chunks,
                                                           std::span<const PrefillTile> tiles, int group, int items) {
  if (group <= 0) fail("prefill attention head groups: KV group ", group, " is not positive");
  if (items < 1 || items > kMaxHeadGroupItems)
    fail("prefill attention head groups: ", items, " items a CTA is not 1..", kMaxHeadGroupItems);
  // Each chunk's (tile, head) items, its tiles in list order (longest causal range first), heads
  // fastest; consecutive items share a CTA, so a group never spans two sequences.
  std::vector<std::vector<int32_t>> chunk_tiles(chunks.size());
  for (size_t t = 0; t < tiles.size(); ++t) chunk_tiles[size_t(tiles[t].chunk)].push_back(int32_t(t));
  std::vector<PrefillHeadGroup> groups;
  for (const std::vector<int32_t>& list : chunk_tiles) {
    int filled = items;
    for (const int32_t t : list)
      for (int32_t h = 0; h < group; ++h) {
        if (filled == items) {
          PrefillHeadGroup g;
          std::fill(std::begin(g.tile), std::end(g.tile), t);
          std::fill(std::begin(g.head), std::end(g.head), -1);
          groups.push_back(g);
          filled = 0;
        }
        groups.back().tile[filled] = t, groups.back().head[filled] = h;
        ++filled;
      }
  }
  const auto end = [&](const PrefillHeadGroup& g) {
    const PrefillTile& t = tiles[size_t(g.tile[0])];
    return tile_kv_end(chunks[size_t(t.chunk)], t.q0);
  };
  std::stable_sort(groups.begin(), groups.end(), [&](const PrefillHeadGroup& a, const PrefillHeadGroup& b) { return end(a) > end(b); });
  return groups;
}

int prefill_attention_head_group_items(std::span<const PrefillChunk> chunks, std::span<const PrefillTile> tiles,
                                       int n_kv_head, int group, int sm_count) {
  std::vector<int64_t> chunk_items(chunks.size(), 0);
  for (const PrefillTile& t : tiles) chunk_items[size_t(t.chunk)] += group;
  // One CTA an SM, every CTA about as long: time ~ waves x the CTA's length, which grows with its
  // consumers (they share the SM's tensor cores).
  int best = 2;
  int64_t best_cost = 0;
  for (int items = 2; items <= kMaxHeadGroupItems; ++items) {
    int64_t ctas = 0;
    for (const int64_t n : chunk_items) ctas += (n + items - 1) / items;
    ctas *= n_kv_head;
    const int64_t cost = (ctas + sm_count - 1) / std::max(sm_count, 1) * items;
    if (items == 2 || cost < best_cost) best = items, best_cost = cost;
  }
  return best;
}

}  // namespace minfer::cuda
