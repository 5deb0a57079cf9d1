// The CUDA backend's kernels: norms, elementwise, quantize, rope / KV cache, the decode
// matrix-vector kernel (MMVQ) with its fused epilogues, split-K decode attention and argmax.
#include <algorithm>
#include <cfloat>
#include <type_traits>

#include "backend/cuda/kernels.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/operand_image.cuh"
#include "backend/cuda/prefill.h"
#include "backend/cuda/prefill_mma.cuh"
#include "backend/cuda/quant_device.cuh"
#include "sampling/draw_math.h"
#include "util/error.h"

namespace minfer::cuda {

bool cuda_supports_weight_type(GgmlType t) {
  switch (t) {
    case GgmlType::F32: case GgmlType::F16: case GgmlType::BF16: case GgmlType::Q4_0:
    case GgmlType::Q4_1: case GgmlType::Q5_0: case GgmlType::Q5_1: case GgmlType::Q8_0:
    case GgmlType::Q4_K: case GgmlType::Q5_K: case GgmlType::Q6_K:
      return true;
    default:
      return false;
  }
}

// ---- rms_norm (+ fused q8 epilogue) ----------------------------------------------------------
constexpr int kNormThreads = 512;

__device__ __forceinline__ float block_sum(float v, float* red) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) red[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < int(blockDim.x / 32) ? red[lane] : 0.0f;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0) red[0] = v;
  }
  __syncthreads();
  const float r = red[0];
  __syncthreads();
  return r;
}

// One block per normalised row (a token row, or one head when group > 0).
__global__ void rms_norm_kernel(const float* __restrict__ x, int ld_x, const float* __restrict__ w,
                                float* __restrict__ out, int ld_out, int width, int group,
                                float eps, const Q8Plane q8, int q8_rows) {
  MINFER_TIMELINE_PROBE();
  await_predecessor();
  __shared__ float red[32];
  const int per_row = width / group;
  const int row = blockIdx.x / per_row, part = blockIdx.x % per_row;
  const float* xr = x + size_t(row) * ld_x + size_t(part) * group;
  float* yr = out + size_t(row) * ld_out + size_t(part) * group;
  float ss = 0.0f;
  for (int i = threadIdx.x; i < group; i += blockDim.x) ss = fmaf(xr[i], xr[i], ss);
  ss = block_sum(ss, red);
  const float scale = rsqrtf(ss / float(group) + eps);
  for (int i = threadIdx.x; i < group; i += blockDim.x) yr[i] = (xr[i] * scale) * w[i];
  if (row >= q8_rows) return;  // uniform over the block: no thread waits below
  // Epilogue: the whole row is written (barrier), each thread re-reads its blocks L1-hot.
  __syncthreads();
  const int n_blocks = width / 32;
  for (int b0 = 0; b0 < n_blocks; b0 += blockDim.x) {  // every lane of every warp: groups shuffle
    const int b = b0 + int(threadIdx.x);
    quantize_q8_group_member(yr + 32 * b, q8, row, b, b < n_blocks);
  }
}

// Whole rows in blocks of 32: thread b owns elements 32b .. 32b + 31 of its block's row in
// registers, from the load to the q8 epilogue (no second pass over the row). One pass of
// loads, one reduction, one pass of stores: the row's latency is paid once. The row moves
// between global memory and the owners through shared memory, lane-consecutive 16-byte words
// each way: read straight into the owners, a warp's load touched 32 lines of 128 bytes
// (ncu: 53 % of the L1's throughput, 9 % of DRAM's, 17 us for 512 rows of 3584).
// REQUIRES: blockDim.x = width / 32 rounded up to a warp (<= 1024); dynamic shared memory
// rms_norm_staging_bytes(blockDim.x); x, out, w 16-byte aligned with ld_x, ld_out multiples of
// 4. Threads past the row take part in the reduction and the group shuffles with zeros.
constexpr int kNormStageWords = 9;  // a thread's eight float4 of the row plus one (no bank conflicts)
size_t rms_norm_staging_bytes(int threads) { return size_t(threads) * kNormStageWords * sizeof(float4); }

__global__ void rms_norm_rows_kernel(const float* __restrict__ x, int ld_x, const float* __restrict__ w,
                                     float* __restrict__ out, int ld_out, int width, float eps,
                                     const Q8Plane q8, int q8_rows, uint16_t* __restrict__ bf16,
                                     const OperandImage image, bool release_early) {
  MINFER_TIMELINE_PROBE();
  if (release_early) release_dependents();
  extern __shared__ float4 norm_staging[];
  const int row = blockIdx.x, b = threadIdx.x, lane = b % 32, warp = b / 32;
  const bool valid = b < width / 32;
  // The warp's float4 of the row (its threads' 8 each), and this lane's slots among them: word j
  // of the warp is its owner's (j / 8) slot j % 8.
  const int warp_words = max(0, min(256, width / 4 - 256 * warp));
  float4* stage = norm_staging + warp * 32 * kNormStageWords;
  const auto slot = [&](int j) { return (j / 8) * kNormStageWords + j % 8; };
  // The weights depend on no earlier kernel: they are read while the kernel before this one still
  // runs (PDL), so that after the wait only the row's round trip is left. Left to itself ptxas
  // moves the PDL wait ahead of these loads (the first instruction of their basic block); a branch
  // on every loaded word keeps the wait after them. Its condition (every weight a NaN of all ones)
  // never holds for a model's weights, and its body would only nap a nanosecond.
  float4 wv[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) wv[i] = valid ? reinterpret_cast<const float4*>(w + 32 * b)[i] : make_float4(0, 0, 0, 0);
  uint32_t all_ones = 0xffffffffu;
#pragma unroll
  for (int i = 0; i < 8; ++i)
    all_ones &= __float_as_uint(wv[i].x) & __float_as_uint(wv[i].y) & __float_as_uint(wv[i].z) & __float_as_uint(wv[i].w);
  if (all_ones == 0xffffffffu) asm volatile("nanosleep.u32 1;" ::: "memory");
  await_predecessor();
  __shared__ float red[32];
  const float4* x_words = reinterpret_cast<const float4*>(x + size_t(row) * ld_x) + 256 * warp;
#pragma unroll
  for (int i = 0; i < 8; ++i)
    if (const int j = lane + 32 * i; j < warp_words) stage[slot(j)] = x_words[j];
  __syncwarp();
  float4 v[8];
  float ss = 0.0f;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    v[i] = valid ? stage[lane * kNormStageWords + i] : make_float4(0, 0, 0, 0);
    ss = fmaf(v[i].x, v[i].x, ss);
    ss = fmaf(v[i].y, v[i].y, ss);
    ss = fmaf(v[i].z, v[i].z, ss);
    ss = fmaf(v[i].w, v[i].w, ss);
  }
  ss = block_sum(ss, red);
  const float scale = rsqrtf(ss / float(width) + eps);
  if (valid) {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const float4 wi = wv[i];
      v[i] = make_float4((v[i].x * scale) * wi.x, (v[i].y * scale) * wi.y, (v[i].z * scale) * wi.z,
                         (v[i].w * scale) * wi.w);
      stage[lane * kNormStageWords + i] = v[i];  // this lane's own slots: read above by it alone
    }
  }
  __syncwarp();
  float4* out_words = reinterpret_cast<float4*>(out + size_t(row) * ld_out) + 256 * warp;
#pragma unroll
  for (int i = 0; i < 8; ++i)
    if (const int j = lane + 32 * i; j < warp_words) {
      const float4 y = stage[slot(j)];
      out_words[j] = y;
      if (bf16)  // the prompt GEMM's plane
        reinterpret_cast<uint2*>(bf16 + size_t(row) * width + 1024 * warp)[j] =
            make_uint2(prefill_activation_bf16x2(y.x, y.y), prefill_activation_bf16x2(y.z, y.w));
    }
  if (row >= q8_rows) return;  // uniform over the block
  quantize_q8_group_values(v, q8, row, b, valid);
  if (image.format == OperandFormat::None) return;
  __syncwarp();  // the group's plane row, from its eight lanes
  if (valid) operand_image::write_operand_token(image, q8, row, b / 8, b % 8);
}

void launch_rms_norm(const float* x, int ld_x, const float* w, float* out, int ld_out, int n_rows,
                     int width, int group, float eps, const Q8Plane& q8, int q8_rows, const KernelStream& s,
                     uint16_t* bf16, const OperandImage& image) {
  if (group <= 0) group = width;
  if (q8_rows > 0 && (group != width || width % 32 != 0 || q8.n_blocks != width / 32))
    fail("rms_norm: fused quantize needs whole rows of the plane's width");
  check_operand_image("rms_norm", image, q8_rows, width);
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  if (group == width && width % 32 == 0 && width <= 32 * 1024 && ld_x % 4 == 0 && ld_out % 4 == 0 &&
      aligned(x) && aligned(out) && aligned(w) && aligned(bf16)) {
    const int threads = (width / 32 + 31) / 32 * 32;
    const size_t staging = rms_norm_staging_bytes(threads);
    if (staging > 48 * 1024)  // rows over 10240 wide: past the default dynamic shared memory
      if (const cudaError_t e = cudaFuncSetAttribute(rms_norm_rows_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                     int(staging));
          e != cudaSuccess)
        fail("rms_norm: ", staging, " bytes of shared memory for rows of ", width, ": ", cudaGetErrorString(e));
    launch_kernel("rms_norm", rms_norm_rows_kernel, n_rows, threads, staging, s, x, ld_x, w, out, ld_out, width, eps,
                  q8, q8_rows, bf16, image, s.releases_early());
    return;
  }
  const int blocks = n_rows * (width / group);
  const int threads = group >= kNormThreads ? kNormThreads : ((group + 31) / 32) * 32;
  launch_kernel("rms_norm", rms_norm_kernel, blocks, threads, 0, s, x, ld_x, w, out, ld_out, width, group, eps, q8, q8_rows);
  // Rows the row kernel does not take: the matmul's own builder writes the image (the same bytes).
  if (image.format != OperandFormat::None) launch_build_operand_image(q8, q8_rows, width, image, s);
  if (bf16) {  // shapes the row kernel does not take: the standalone conversion (the same bits)
    if (ld_out != width) fail("rms_norm: a bf16 plane needs contiguous output rows");
    launch_prefill_activation_bf16(out, bf16, int64_t(n_rows) * width, s.stream);
  }
}

// ---- swiglu (+ fused q8 and bf16 epilogues) ---------------------------------------------------
// Four elements a thread (16-byte loads and stores): block (bx, row) computes elements [1024 bx,
// 1024 bx + 1024) of its row = q8 groups 32 bx .. 32 bx + 31, which warp 0 quantizes after the
// barrier, a lane a group. One element a thread ran at ≈ 40 % of the copy rate (docs/14 §6).
// REQUIRES 256 threads; width % 4 == 0; gate, up, out 16-byte and bf16 8-byte aligned.
__global__ void swiglu_kernel(const float* __restrict__ gate, const float* __restrict__ up,
                              float* __restrict__ out, int width, const Q8Plane q8, int q8_rows,
                              uint16_t* __restrict__ bf16, const OperandImage image) {
  MINFER_TIMELINE_PROBE();
  await_predecessor();
  const int row = blockIdx.y;
  const int i = (blockIdx.x * 256 + threadIdx.x) * 4;
  const size_t at = size_t(row) * width + i;
  float4 y = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  if (i < width) {
    const float4 g = *reinterpret_cast<const float4*>(gate + at), u = *reinterpret_cast<const float4*>(up + at);
    y = make_float4(silu_mul(g.x, u.x), silu_mul(g.y, u.y), silu_mul(g.z, u.z), silu_mul(g.w, u.w));
    *reinterpret_cast<float4*>(out + at) = y;
    if (bf16)
      *reinterpret_cast<uint2*>(bf16 + at) = make_uint2(prefill_activation_bf16x2(y.x, y.y), prefill_activation_bf16x2(y.z, y.w));
  }
  if (row >= q8_rows) return;  // uniform over the block
  // The quantize reads the CTA's values from shared memory, not back from global (one L2 round
  // trip less).
  __shared__ __align__(16) float tile[1024];
  reinterpret_cast<float4*>(tile)[threadIdx.x] = y;
  __syncthreads();
  if (threadIdx.x >= 32) return;  // warp 0 quantizes (whole warps leave: no barrier follows)
  const int b = blockIdx.x * 32 + threadIdx.x;
  quantize_q8_group_member(tile + 32 * threadIdx.x, q8, row, b, b < width / 32);
  if (image.format == OperandFormat::None) return;
  __syncwarp();  // the groups' plane row, from their eight lanes each
  if (b < width / 32) operand_image::write_operand_token(image, q8, row, b / 8, b % 8);
}

// Widths or pointers the four-wide kernel does not take: one element a thread (no q8 epilogue:
// the plane needs width % 32 == 0, which the four-wide kernel takes).
__global__ void swiglu_scalar_kernel(const float* __restrict__ gate, const float* __restrict__ up,
                                     float* __restrict__ out, int width, uint16_t* __restrict__ bf16) {
  MINFER_TIMELINE_PROBE();
  await_predecessor();
  const int row = blockIdx.y;
  const int i = blockIdx.x * 256 + threadIdx.x;
  if (i >= width) return;
  const size_t at = size_t(row) * width + i;
  const float y = silu_mul(gate[at], up[at]);
  out[at] = y;
  if (bf16) bf16[at] = prefill_activation_bf16(y);
}

void launch_swiglu(const float* gate, const float* up, float* out, int n_rows, int width,
                   const Q8Plane& q8, int q8_rows, const KernelStream& s, uint16_t* bf16,
                   const OperandImage& image) {
  if (q8_rows > 0 && (width % 32 != 0 || q8.n_blocks != width / 32))
    fail("swiglu: fused quantize needs width % 32 == 0 and a plane of that width");
  check_operand_image("swiglu", image, q8_rows, width);
  const auto aligned = [](const void* p, uintptr_t n) { return reinterpret_cast<uintptr_t>(p) % n == 0; };
  if (width % 4 == 0 && aligned(gate, 16) && aligned(up, 16) && aligned(out, 16) && aligned(bf16, 8)) {
    launch_kernel("swiglu", swiglu_kernel, dim3((width + 1023) / 1024, n_rows), 256, 0, s, gate, up, out, width, q8,
                  q8_rows, bf16, image);
    return;
  }
  if (q8_rows > 0) fail("swiglu: fused quantize needs 16-byte aligned rows");
  launch_kernel("swiglu", swiglu_scalar_kernel, dim3((width + 255) / 256, n_rows), 256, 0, s, gate, up, out, width, bf16);
}

__global__ void add_kernel(const float* a, const float* b, float* out, int64_t n) {
  MINFER_TIMELINE_PROBE();
  await_predecessor();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = a[i] + b[i];
}

void launch_add(const float* a, const float* b, float* out, int64_t n, const KernelStream& s) {
  launch_kernel("add", add_kernel, unsigned((n + 255) / 256), 256, 0, s, a, b, out, n);
}

// ---- standalone quantize: 8 threads per 256-column group, one per 32-block -----------------------
__global__ void quantize_q8_kernel(const float* __restrict__ x, int ld_x, const Q8Plane q8, int n_rows,
                                   int width) {
  MINFER_TIMELINE_PROBE();
  await_predecessor();
  const int n_blocks = width / 32, n_groups = (n_blocks + 7) / 8;
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t group = i / 8;  // no early exit: the group's lanes shuffle
  const int row = int(group / n_groups), b = int(group % n_groups) * 8 + int(i % 8);
  const bool valid = row < n_rows && b < n_blocks;
  quantize_q8_group_member(x + size_t(row) * ld_x + 32 * size_t(b), q8, row, b, valid);
}

void launch_quantize_q8(const float* x, int ld_x, const Q8Plane& q8, int n_rows, int width, const KernelStream& s) {
  if (width % 32 != 0) fail("quantize_q8: width ", width, " is not a multiple of 32");
  if (q8.n_blocks != width / 32) fail("quantize_q8: a plane of ", 32 * q8.n_blocks, " columns for rows of ", width);
  const int64_t n = int64_t(n_rows) * ((width / 32 + 7) / 8) * 8;
  launch_kernel("quantize_q8", quantize_q8_kernel, unsigned((n + 127) / 128), 128, 0, s, x, ld_x, q8, n_rows, width);
}

// The byte extents of the plane's four arrays (each rounded up to 256 bytes).
struct Q8PlaneExtents {
  int64_t quants, scales, sums, digits;
};
static Q8PlaneExtents q8_plane_extents(int tokens, int width) {
  const int64_t t = (int64_t(tokens) + 31) / 32 * 32, blocks = width / 32, groups = (blocks + 7) / 8;
  const auto up256 = [](int64_t n) { return (n + 255) / 256 * 256; };
  return {up256(t * blocks * 32), up256(t * groups * 2), up256(t * blocks * 4), up256(t * groups * 16)};
}

int64_t q8_plane_bytes(int tokens, int width) {
  const Q8PlaneExtents e = q8_plane_extents(tokens, width);
  return e.quants + e.scales + e.sums + e.digits;
}

Q8Plane q8_plane(uint8_t* buffer, int tokens, int width) {
  const Q8PlaneExtents e = q8_plane_extents(tokens, width);
  Q8Plane p;
  p.n_blocks = width / 32;
  p.token_rows = (tokens + 31) / 32 * 32;
  p.quants = buffer;
  p.scales = reinterpret_cast<uint16_t*>(buffer + e.quants);
  p.sums = reinterpret_cast<int32_t*>(buffer + e.quants + e.scales);
  p.digits = buffer + e.quants + e.scales + e.sums;
  return p;
}

// ---- dequantize (embedding rows) -------------------------------------------------------------
// Group g (32 elements) of row `row` into out[0..32).
__device__ void dequant_group(const DevMat& m, int row, int g, float* out) {
  const int cols = m.cols;
  switch (m.type) {
    case GgmlType::F32:
      for (int l = 0; l < 32; ++l) out[l] = reinterpret_cast<const float*>(m.data)[size_t(row) * cols + 32 * g + l];
      return;
    case GgmlType::F16:
    case GgmlType::BF16: {
      const uint16_t* p = reinterpret_cast<const uint16_t*>(m.data) + size_t(row) * cols + 32 * g;
      for (int l = 0; l < 32; ++l) out[l] = m.type == GgmlType::F16 ? h2f(p[l]) : bf2f(p[l]);
      return;
    }
    case GgmlType::Q4_K:
    case GgmlType::Q5_K: {
      const bool q5 = m.type == GgmlType::Q5_K;
      const int j = g % 8;
      const uint8_t* b = m.data + (size_t(row) * (cols / 256) + g / 8) * (q5 ? 176 : 144);
      const uint4 h = *reinterpret_cast<const uint4*>(b);
      int sc, mn;
      k_scale_min(h, j, sc, mn);
      const float d = h2f(uint16_t(h.x)) * float(sc), dm = h2f(uint16_t(h.x >> 16)) * float(mn);
      const uint8_t* qs = b + (q5 ? 48 : 16) + 32 * (j / 2);
      for (int l = 0; l < 32; ++l) {
        int q = (qs[l] >> (4 * (j & 1))) & 0xF;
        if (q5) q |= ((b[16 + l] >> j) & 1) << 4;
        out[l] = d * float(q) - dm;
      }
      return;
    }
    case GgmlType::Q6_K: {
      const uint8_t* b =
          m.data + size_t(row) * size_t(q6k_device_row_bytes(cols / 256)) + size_t(g / 8) * kQ6KDeviceBlockBytes;
      const int j = g % 8, h = j / 4, k = j % 4;
      const uint8_t* ql = b + 64 * h + 32 * (k & 1);
      const uint8_t* qh = b + 128 + 32 * h;
      const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
      const float d = h2f(uint16_t(b[208] | (b[209] << 8)));
      for (int l = 0; l < 32; ++l) {
        const int q = (((ql[l] >> (4 * (k / 2))) & 0xF) | (((qh[l] >> (2 * k)) & 3) << 4)) - 32;
        out[l] = d * float(sc[8 * h + 2 * k + l / 16]) * float(q);
      }
      return;
    }
    default: {  // 32-blocks: [f16 d][f16 m if _1][u32 qh if q5][qs]
      const bool q8 = m.type == GgmlType::Q8_0;
      const bool q5 = m.type == GgmlType::Q5_0 || m.type == GgmlType::Q5_1;
      const bool mn = m.type == GgmlType::Q4_1 || m.type == GgmlType::Q5_1;
      const int bytes = type_traits(m.type).type_size;
      const uint8_t* b = m.data + (size_t(row) * (cols / 32) + g) * bytes;
      const float d = h2f(uint16_t(b[0] | (b[1] << 8)));
      const float mv = mn ? h2f(uint16_t(b[2] | (b[3] << 8))) : 0.0f;
      const uint8_t* qhp = b + (mn ? 4 : 2);
      const uint32_t qh = q5 ? uint32_t(qhp[0]) | uint32_t(qhp[1]) << 8 | uint32_t(qhp[2]) << 16 |
                                   uint32_t(qhp[3]) << 24
                             : 0u;
      const uint8_t* qs = b + (mn ? 4 : 2) + (q5 ? 4 : 0);
      if (q8) {
        for (int l = 0; l < 32; ++l) out[l] = d * float(int8_t(qs[l]));
        return;
      }
      const int offset = mn ? 0 : (q5 ? 16 : 8);
      for (int l = 0; l < 32; ++l) {
        int q = (qs[l % 16] >> (4 * (l / 16))) & 0xF;
        if (q5) q |= ((qh >> l) & 1) << 4;
        out[l] = mn ? d * float(q) + mv : d * float(q - offset);
      }
      return;
    }
  }
}

__global__ void dequantize_rows_kernel(DevMat m, const int32_t* rows, int row0, float* out) {
  MINFER_TIMELINE_PROBE();
  await_predecessor();
  const int r = blockIdx.y;
  const int row = rows ? rows[r] : row0 + r;
  for (int g = threadIdx.x; g < m.cols / 32; g += blockDim.x) {
    float v[32];
    dequant_group(m, row, g, v);
    float* o = out + size_t(r) * m.cols + 32 * g;
    for (int l = 0; l < 32; ++l) o[l] = v[l];
  }
}

void launch_embed(const DevMat& emb, const int32_t* tokens, float* out, int n_tokens,
                  const KernelStream& s) {
  launch_kernel("embed", dequantize_rows_kernel, dim3(1, n_tokens), 128, 0, s, emb, tokens, 0, out);
}

void launch_dequantize_rows(const DevMat& m, int row0, int n_rows, float* out, const KernelStream& s) {
  launch_kernel("dequantize_rows", dequantize_rows_kernel, dim3(1, n_rows), 128, 0, s, m, nullptr, row0, out);
}

// ---- gather / argmax -------------------------------------------------------------------------
__global__ void gather_rows_kernel(const float* __restrict__ src, int ld, const int32_t* __restrict__ rows,
                                   int width, float* __restrict__ dst) {
  MINFER_TIMELINE_PROBE();
  await_predecessor();
  const float* from = src + size_t(rows[blockIdx.y]) * ld;
  float* to = dst + size_t(blockIdx.y) * ld;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < width; i += gridDim.x * blockDim.x) to[i] = from[i];
}

void launch_gather_rows(const float* src, int ld, const int32_t* rows, int n_rows, int width, float* dst,
                        const KernelStream& s) {
  if (n_rows <= 0) return;
  launch_kernel("gather_rows", gather_rows_kernel, dim3((width + 255) / 256, n_rows), 256, 0, s, src, ld, rows, width, dst);
}

// The better of two candidates: the larger value, on ties the smaller index.
__device__ __forceinline__ void argmax_take(float& bv, int& bi, float ov, int oi) {
  if (ov > bv || (ov == bv && oi < bi)) {
    bv = ov;
    bi = oi;
  }
}
__device__ __forceinline__ void argmax_warp(float& bv, int& bi) {
  for (int o = 16; o > 0; o >>= 1) argmax_take(bv, bi, __shfl_xor_sync(0xffffffffu, bv, o), __shfl_xor_sync(0xffffffffu, bi, o));
}

// Block (slice, row) scans its slice of the row; no candidate sorts before index n (= none).
// REQUIRES: blockDim.x a multiple of 32, <= 1024.
__global__ void argmax_slices_kernel(const float* __restrict__ x, int ld, int n, ArgmaxCandidate* candidates) {
  MINFER_TIMELINE_PROBE();
  await_predecessor();
  __shared__ float best_v[32];
  __shared__ int best_i[32];
  const int row = blockIdx.y, slice = blockIdx.x;
  const int begin = int(int64_t(n) * slice / kArgmaxSlices), end = int(int64_t(n) * (slice + 1) / kArgmaxSlices);
  x += size_t(row) * ld;
  float bv = -FLT_MAX;
  int bi = n;
  for (int i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const float v = x[i];
    if (v > bv) { bv = v; bi = i; }  // strided scan visits each thread's indices in order
  }
  argmax_warp(bv, bi);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) { best_v[warp] = bv; best_i[warp] = bi; }
  __syncthreads();
  if (warp == 0) {
    bv = lane < int(blockDim.x / 32) ? best_v[lane] : -FLT_MAX;
    bi = lane < int(blockDim.x / 32) ? best_i[lane] : n;
    argmax_warp(bv, bi);
    if (lane == 0) candidates[size_t(row) * kArgmaxSlices + slice] = {bv, bi};
  }
}

// One warp per row over its kArgmaxSlices candidates; the token also into next_tokens (if given).
__global__ void argmax_pick_kernel(const ArgmaxCandidate* candidates, int n, int32_t* result, int32_t* next_tokens) {
  MINFER_TIMELINE_PROBE();
  await_predecessor();
  static_assert(kArgmaxSlices == 32, "one candidate per lane");
  const ArgmaxCandidate c = candidates[size_t(blockIdx.x) * kArgmaxSlices + threadIdx.x];
  float bv = c.value;
  int bi = c.index;
  argmax_warp(bv, bi);
  if (threadIdx.x == 0) {
    const int token = bi < n ? bi : 0;
    result[blockIdx.x] = token;
    if (next_tokens) next_tokens[blockIdx.x] = token;
  }
}

void launch_argmax_rows(const float* x, int ld, int n_rows, int width, ArgmaxCandidate* candidates, int32_t* result,
                        int32_t* next_tokens, const KernelStream& s) {
  if (n_rows <= 0) return;
  launch_kernel("argmax", argmax_slices_kernel, dim3(kArgmaxSlices, n_rows), 256, 0, s, x, ld, width, candidates);
  launch_kernel("argmax", argmax_pick_kernel, n_rows, kArgmaxSlices, 0, s, candidates, width, result, next_tokens);
}

// ---- whole-vocabulary draw -----------------------------------------------------------------------
// The host's draw_softmax in parallel where its order allows and in its order where the result
// depends on it: the maximum (any order), each block's eight lane sums (one thread a lane, tokens in
// the host's order), the lane tree, then one thread adding the block sums in double, finding the
// drawn block and scanning its weights.
constexpr int kDrawThreads = 1024;

__host__ __device__ constexpr int draw_blocks(int width) { return (width + draw_math::kBlock - 1) / draw_math::kBlock; }
// Shared memory of a draw: the lane sums, the block sums (double) and the drawn block's weights.
constexpr size_t draw_smem_bytes(int width) {
  return size_t(draw_blocks(width)) * (draw_math::kLanes * sizeof(float) + sizeof(double)) + draw_math::kBlock * sizeof(float);
}

// REQUIRES: blockDim.x == kDrawThreads; draw_smem_bytes(width) of dynamic shared memory; width > 0.
__global__ void __launch_bounds__(kDrawThreads) draw_softmax_kernel(const float* __restrict__ x, int64_t ld, int width,
                                                                     const DrawJob* __restrict__ jobs, int32_t* tokens) {
  MINFER_TIMELINE_PROBE();
  using namespace draw_math;
  extern __shared__ double draw_smem[];
  const int n_blocks = draw_blocks(width);
  double* block_sum = draw_smem;
  float* lane_sum = reinterpret_cast<float*>(block_sum + n_blocks);  // [block][lane]
  float* drawn_weight = lane_sum + size_t(n_blocks) * kLanes;
  __shared__ float warp_max[kDrawThreads / 32];
  __shared__ BlockPick pick;
  await_predecessor();
  const DrawJob job = jobs[blockIdx.x];
  const float* l = x + size_t(job.row) * size_t(ld);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  float m = l[0];
  for (int i = threadIdx.x; i < width; i += kDrawThreads) m = fmaxf(m, l[i]);
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  if (lane == 0) warp_max[warp] = m;
  __syncthreads();
  float max_logit = warp_max[0];
  for (int w = 1; w < kDrawThreads / 32; ++w) max_logit = fmaxf(max_logit, warp_max[w]);
  const float scale = exponent_scale(job.temperature);

  for (int t = threadIdx.x; t < n_blocks * kLanes; t += kDrawThreads) {
    const int b = t / kLanes, k = t % kLanes;
    const int first = b * kBlock, last = min(width, first + kBlock);
    const int whole_end = first + (last - first) / 8 * 8;
    float s = 0.0f;
    for (int j = first + k; j < whole_end; j += 8) s = add(s, weight(l[j], max_logit, scale));
    if (k == 0)
      for (int j = whole_end; j < last; ++j) s = add(s, weight(l[j], max_logit, scale));
    lane_sum[t] = s;
  }
  __syncthreads();
  for (int b = threadIdx.x; b < n_blocks; b += kDrawThreads) {
    float lanes[kLanes];
    for (int k = 0; k < kLanes; ++k) lanes[k] = lane_sum[b * kLanes + k];
    block_sum[b] = double(lane_tree(lanes));
  }
  __syncthreads();
  if (threadIdx.x == 0) pick = pick_block(block_sum, n_blocks, job.uniform);
  __syncthreads();
  const int first = pick.block * kBlock, last = min(width, first + kBlock);
  for (int j = first + int(threadIdx.x); j < last; j += kDrawThreads) drawn_weight[j - first] = weight(l[j], max_logit, scale);
  __syncthreads();
  if (threadIdx.x == 0) tokens[blockIdx.x] = pick_token(drawn_weight, first, last - first, pick);
}

void launch_draw_softmax(const float* x, int64_t ld, int width, const DrawJob* jobs, int n_jobs, int32_t* tokens,
                         const KernelStream& s) {
  if (n_jobs <= 0) return;
  if (width <= 0) fail("draw: a row of ", width, " entries");
  const size_t smem = draw_smem_bytes(width);
  // Up to 48 KB (a 300k vocabulary) needs no opt-in; only larger ones pay the queries each launch.
  if (smem > 48 * 1024) {
    const int max_smem = prefill_detail::device_shared_memory_per_block();
    if (smem > size_t(max_smem))
      fail("draw: a vocabulary of ", width, " entries needs ", smem, " bytes of shared memory, more than the ",
           max_smem, " a block has");
    const cudaError_t e = cudaFuncSetAttribute(draw_softmax_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
    if (e != cudaSuccess) fail("draw: cannot set the shared-memory size: ", cudaGetErrorString(e));
  }
  launch_kernel("draw_softmax", draw_softmax_kernel, n_jobs, kDrawThreads, smem, s, x, ld, width, jobs, tokens);
}

// ---- rope / kv -------------------------------------------------------------------------------
// Pair p of a row rotated in place at position pos; its columns and values come back (for a KV write).
struct RopedPair {
  int r0, r1;
  float a, b;
};
__device__ __forceinline__ RopedPair rope_pair(float* row, int p, const RopeParams& rp, int pos) {
  RopedPair r;
  int j;
  rope_pair_index(p, rp.head_dim, rp.neox, r.r0, r.r1, j);
  r.a = row[r.r0], r.b = row[r.r1];
  rope_rotate(r.a, r.b, pos, rp.inv_freq[j]);
  row[r.r0] = r.a;
  row[r.r1] = r.b;
  return r;
}

__global__ void rope_kernel(float* x, int ld, int n_heads, RopeParams rp, const int32_t* positions) {
  MINFER_TIMELINE_PROBE();
  await_predecessor();
  const int t = blockIdx.y;
  const int p = blockIdx.x * blockDim.x + threadIdx.x;
  if (p >= n_heads * rp.head_dim / 2) return;
  rope_pair(x + size_t(t) * ld, p, rp, positions[t]);
}

void launch_rope(float* x, int ld, int n_tokens, int n_heads, const RopeParams& rp,
                 const int32_t* positions, const KernelStream& s) {
  if (n_tokens <= 0) return;
  const int pairs = n_heads * rp.head_dim / 2;
  launch_kernel("rope", rope_kernel, dim3((pairs + 127) / 128, n_tokens), 128, 0, s, x, ld, n_heads, rp, positions);
}

__global__ void kv_append_kernel(const float* k, const float* v, KvLayer kv, const int32_t* slots) {
  MINFER_TIMELINE_PROBE();
  await_predecessor();
  const int t = blockIdx.y;
  const int width = kv.n_kv_heads * kv.head_dim;
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= width) return;
  const size_t at = kv_index(kv, r, slots[t]);
  kv.k[at] = f2h(k[size_t(t) * width + r]);
  kv.v[at] = f2h(v[size_t(t) * width + r]);
}

// Pair p of row t: q pair p, else k pair p - q_pairs (also into the K cache), else v pair
// p - q_pairs - k_pairs into the V cache; rope_pair and f2h as in rope_kernel and kv_append_kernel.
// A thread takes kRopeKvPairs pairs blockDim.x apart: with one pair a thread, a 4096-token prompt
// was 74k blocks of 128 threads, and the block scheduling, not the 150 MB a 7B layer moves, set
// the time (93 µs, half the copy rate).
// REQUIRES: gridDim = (ceil(pairs / (kRopeKvPairs * blockDim.x)), tokens), pairs = q_pairs + 2
// k_pairs (launch_rope_kv, blockDim.x = kRopeKvThreads); no barrier, so a thread past the last
// pair may stop early.
constexpr int kRopeKvPairs = 4, kRopeKvThreads = 256;
__global__ void rope_kv_kernel(float* q, int ldq, float* k, const float* v, int ld_kv, int n_q_heads, RopeParams rp,
                               KvLayer kv, const int32_t* positions, const int32_t* slots) {
  MINFER_TIMELINE_PROBE();
  await_predecessor();
  const int t = blockIdx.y;
  const int half = rp.head_dim / 2, q_pairs = n_q_heads * half, k_pairs = kv.n_kv_heads * half;
  const int slot = slots[t], pos = positions[t];
#pragma unroll
  for (int i = 0; i < kRopeKvPairs; ++i) {
    const int p = (blockIdx.x * kRopeKvPairs + i) * blockDim.x + threadIdx.x;
    if (p >= q_pairs + 2 * k_pairs) break;
    if (p >= q_pairs + k_pairs) {
      const int r = 2 * (p - q_pairs - k_pairs);
      const float* row = v + size_t(t) * ld_kv;
      kv.v[kv_index(kv, r, slot)] = f2h(row[r]);
      kv.v[kv_index(kv, r + 1, slot)] = f2h(row[r + 1]);
      continue;
    }
    const bool is_q = p < q_pairs;
    float* row = is_q ? q + size_t(t) * ldq : k + size_t(t) * ld_kv;
    const RopedPair r = rope_pair(row, is_q ? p : p - q_pairs, rp, pos);
    if (!is_q) {
      kv.k[kv_index(kv, r.r0, slot)] = f2h(r.a);
      kv.k[kv_index(kv, r.r1, slot)] = f2h(r.b);
    }
  }
}
void launch_rope_kv(float* q, int ldq, float* k, const float* v, int ld_kv, int n_tokens, int n_q_heads,
                    const RopeParams& rp, const KvLayer& kv, const int32_t* positions, const int32_t* slots,
                    const KernelStream& s) {
  if (n_tokens <= 0) return;
  if (ld_kv != kv.n_kv_heads * kv.head_dim || rp.head_dim != kv.head_dim)
    fail("rope_kv: k/v rows of ", ld_kv, " floats for ", kv.n_kv_heads, " heads of ", kv.head_dim);
  const int pairs = (n_q_heads + 2 * kv.n_kv_heads) * rp.head_dim / 2;
  constexpr int kPairsPerBlock = kRopeKvPairs * kRopeKvThreads;
  launch_kernel("rope_kv", rope_kv_kernel, dim3((pairs + kPairsPerBlock - 1) / kPairsPerBlock, n_tokens), kRopeKvThreads,
                0, s, q, ldq, k, v, ld_kv, n_q_heads, rp, kv, positions, slots);
}
void launch_kv_append(const float* k, const float* v, int n_tokens, const KvLayer& kv,
                      const int32_t* slots, const KernelStream& s) {
  if (n_tokens <= 0) return;
  const int width = kv.n_kv_heads * kv.head_dim;
  launch_kernel("kv_append", kv_append_kernel, dim3((width + 127) / 128, n_tokens), 128, 0, s, k, v, kv, slots);
}

// ---- matrix-vector: warp per row pair, lanes stride over the row's units ----------------------
constexpr int kMvWarps = 4;  // warps (= row pairs) per block
constexpr int kMaxTokens = 8;  // tokens per launch of the multi-token form

struct MatVecArgs {
  MatSeg seg[kMaxMatSegs];
  int first_block[kMaxMatSegs + 1];
  int n_segs;
  Q8Plane act_q8;
  const float* act_f32;
  int act_f32_stride;
  int n_tokens;
  MatVecExtra extra;
};

template <typename Unit>
__device__ __forceinline__ int units_per_row(int cols) {
  return std::is_same_v<Unit, UnitQK45<false>> || std::is_same_v<Unit, UnitQK45<true>> ||
                 std::is_same_v<Unit, UnitQ6K>
             ? cols / 256 * 4
             : (cols / 32 + 1) / 2;
}

// A k-quant unit of rows r0 and r1 (when has_r1) against its activations a (loaded when valid):
// the lane's share of the group's integer sums, added up exactly over the lane quad, then the
// group's term added to the quad's stream (acc0, acc1). The shuffles need every lane of the warp.
template <typename Unit>
__device__ __forceinline__ void add_group_terms(const Unit& w0, const Unit& w1, bool has_r1, const ActChunk& a,
                                                bool valid, float& acc0, float& acc1) {
  GroupSums v[2];
  if (valid) {
    v[0] = w0.group_sums(a);
    if (has_r1) v[1] = w1.group_sums(a);
  }
#pragma unroll
  for (int r = 0; r < 2; ++r)
#pragma unroll
    for (int o = 1; o <= 2; o <<= 1) {
      v[r].s += __shfl_xor_sync(0xffffffffu, v[r].s, o);
      v[r].m += __shfl_xor_sync(0xffffffffu, v[r].m, o);
    }
  if (valid) {  // a k-quant row has whole groups: a unit is valid when its group is
    acc0 = __fadd_rn(acc0, w0.group_term(v[0], a.da));
    if (has_r1) acc1 = __fadd_rn(acc1, w1.group_term(v[1], a.da));
  }
}

// Rows r0 and r1 (when valid) against NT token rows in the canonical order: lane quad s sums the
// groups of stream s (acc), one group per loop iteration; the caller reduces the streams.
template <typename Unit, int NT>
__device__ __forceinline__ void pair_dot_q8(const DevMat& m, int r0, int r1, bool has_r1, const Q8Plane& act,
                                            int nt, float (&acc)[2][NT]) {
  const int n_units = units_per_row<Unit>(m.cols);
  const int lane = threadIdx.x % 32;
  // warp-uniform trip count: the group combine below shuffles across lanes
#pragma unroll 2
  for (int base = 0; base < n_units; base += 32) {
    const int u = base + lane;
    const bool valid = u < n_units;
    const bool group_valid = (u & ~3) < n_units;
    Unit w0, w1;
    if (valid) {
      w0.load(m, r0, u);
      if (has_r1) w1.load(m, r1, u);
    }
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      if (t >= nt) continue;
      const ActRow act_t{act, t};
      if constexpr (Unit::kIntegerGroups) {
        ActChunk a;
        if (valid) a = Unit::load_act(act_t, u);
        add_group_terms(w0, w1, has_r1, a, valid, acc[0][t], acc[1][t]);
      } else {
        float v[2] = {w0.pair_terms(act_t, u, valid), 0.0f};
        if (has_r1) v[1] = w1.pair_terms(act_t, u, valid && has_r1);
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          v[r] = __fadd_rn(v[r], __shfl_xor_sync(0xffffffffu, v[r], 1));
          v[r] = __fadd_rn(v[r], __shfl_xor_sync(0xffffffffu, v[r], 2));
          if (group_valid) acc[r][t] = __fadd_rn(acc[r][t], v[r]);
        }
      }
    }
  }
}

// One token against k-quant rows r0 and r1: pair_dot_q8's terms in its order, with the lanes'
// next round of units (weights and activations) loaded before this round's arithmetic, and the
// first round's weights before the PDL wait (no earlier kernel writes weights), so a warp keeps
// its next round in flight while it works. Waits for the predecessor itself.
template <typename Unit>
__device__ __forceinline__ void pair_dot_one_token(const DevMat& m, int r0, int r1, bool has_r1, const Q8Plane& act,
                                                   float& acc0, float& acc1) {
  const int n_units = units_per_row<Unit>(m.cols);
  const int lane = threadIdx.x % 32;
  const ActRow act_t{act, 0};
  const auto load_weights = [&](Unit& w0, Unit& w1, int u) {
    if (u < n_units) {
      w0.load(m, r0, u);
      if (has_r1) w1.load(m, r1, u);
    }
  };
  Unit w0, w1;
  load_weights(w0, w1, lane);
  await_predecessor();
  ActChunk a;
  if (lane < n_units) a = Unit::load_act(act_t, lane);
#pragma unroll 2
  for (int base = 0; base < n_units; base += 32) {
    const int u_next = base + 32 + lane;
    Unit next0, next1;
    ActChunk a_next;
    load_weights(next0, next1, u_next);
    if (u_next < n_units) a_next = Unit::load_act(act_t, u_next);
    add_group_terms(w0, w1, has_r1, a, base + lane < n_units, acc0, acc1);
    w0 = next0;
    w1 = next1;
    a = a_next;
  }
}

template <GgmlType T, int NT>
__device__ __forceinline__ void pair_dot_f32(const DevMat& m, int r0, int r1, bool has_r1,
                                             const float* act, int act_stride, int nt,
                                             float (&acc)[2][NT]) {
  const int n_units = m.cols / 8;
#pragma unroll 2
  for (int u = threadIdx.x % 32; u < n_units; u += 32) {
    UnitFloat<T> w0, w1;
    w0.load(m, r0, u);
    if (has_r1) w1.load(m, r1, u);
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      if (t < nt) {
        acc[0][t] += w0.dot(act + size_t(t) * act_stride);
        if (has_r1) acc[1][t] += w1.dot(act + size_t(t) * act_stride);
      }
    }
  }
}

// Warp p of a launch: its segment and row pair (a roped segment pairs each rotated pair's rows).
struct MatVecPair {
  const MatSeg* seg;
  int r0, r1, j;
  bool has_r1;
};
// False: the warp has no rows (uniform over the warp; the kernels have no barrier).
__device__ __forceinline__ bool matvec_pair(const MatVecArgs& a, MatVecPair& w) {
  int si = 0;
  while (si + 1 < a.n_segs && int(blockIdx.x) >= a.first_block[si + 1]) ++si;
  w.seg = &a.seg[si];
  const DevMat& m = w.seg->w;
  const int p = (int(blockIdx.x) - a.first_block[si]) * kMvWarps + int(threadIdx.x / 32);
  w.j = 0;
  if (w.seg->epi == Epilogue::RopeQ || w.seg->epi == Epilogue::RopeK) {
    if (p >= m.rows / 2) return false;
    rope_pair_index(p, a.extra.rope.head_dim, a.extra.rope.neox, w.r0, w.r1, w.j);
  } else {
    w.r0 = 2 * p;
    w.r1 = w.r0 + 1;
    if (w.r0 >= m.rows) return false;
  }
  w.has_r1 = w.r1 < m.rows;
  return true;
}

// Joins the lane quads' streams with the canonical tree, the butterfly over the quad bits (16, 8,
// 4), or lane partials (streams false) with the full butterfly; lane t stores token t's pair.
template <int NT>
__device__ __forceinline__ void store_pair_sums(const MatVecArgs& a, const MatVecPair& w, float (&acc)[2][NT], int nt,
                                                bool streams) {
#pragma unroll
  for (int t = 0; t < NT; ++t) {
    for (int o = 16; o >= (streams ? 4 : 1); o >>= 1) {
      acc[0][t] = __fadd_rn(acc[0][t], __shfl_xor_sync(0xffffffffu, acc[0][t], o));
      acc[1][t] = __fadd_rn(acc[1][t], __shfl_xor_sync(0xffffffffu, acc[1][t], o));
    }
  }
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int t = 0; t < NT; ++t)
    if (t < nt && lane == t) store_pair(*w.seg, a.extra, t, w.r0, w.r1, w.j, w.has_r1, acc[0][t], acc[1][t]);
}

template <int NT>
__global__ void __launch_bounds__(kMvWarps * 32) matvec_kernel(const __grid_constant__ MatVecArgs a) {
  MINFER_TIMELINE_PROBE();
  await_predecessor();
  MatVecPair w;
  if (!matvec_pair(a, w)) return;
  const DevMat& m = w.seg->w;
  const int r0 = w.r0, r1 = w.r1;
  const bool has_r1 = w.has_r1;
  float acc[2][NT];
#pragma unroll
  for (int t = 0; t < NT; ++t) acc[0][t] = acc[1][t] = 0.0f;
  const int nt = a.n_tokens;
  bool streams = true;  // acc holds the lane quad's stream (canonical order); else lane partials
  // k-quant types at one token: matvec_one_token_kernel (launch_matvec)
  constexpr bool kTakesKQuants = NT > 1;
  switch (m.type) {
    case GgmlType::Q4_K: if constexpr (kTakesKQuants) pair_dot_q8<UnitQK45<false>, NT>(m, r0, r1, has_r1, a.act_q8, nt, acc); break;
    case GgmlType::Q5_K: if constexpr (kTakesKQuants) pair_dot_q8<UnitQK45<true>, NT>(m, r0, r1, has_r1, a.act_q8, nt, acc); break;
    case GgmlType::Q6_K: if constexpr (kTakesKQuants) pair_dot_q8<UnitQ6K, NT>(m, r0, r1, has_r1, a.act_q8, nt, acc); break;
    case GgmlType::Q8_0: pair_dot_q8<Unit32Pair<GgmlType::Q8_0>, NT>(m, r0, r1, has_r1, a.act_q8, nt, acc); break;
    case GgmlType::Q4_0: pair_dot_q8<Unit32Pair<GgmlType::Q4_0>, NT>(m, r0, r1, has_r1, a.act_q8, nt, acc); break;
    case GgmlType::Q4_1: pair_dot_q8<Unit32Pair<GgmlType::Q4_1>, NT>(m, r0, r1, has_r1, a.act_q8, nt, acc); break;
    case GgmlType::Q5_0: pair_dot_q8<Unit32Pair<GgmlType::Q5_0>, NT>(m, r0, r1, has_r1, a.act_q8, nt, acc); break;
    case GgmlType::Q5_1: pair_dot_q8<Unit32Pair<GgmlType::Q5_1>, NT>(m, r0, r1, has_r1, a.act_q8, nt, acc); break;
    case GgmlType::F32: streams = false; pair_dot_f32<GgmlType::F32, NT>(m, r0, r1, has_r1, a.act_f32, a.act_f32_stride, nt, acc); break;
    case GgmlType::F16: streams = false; pair_dot_f32<GgmlType::F16, NT>(m, r0, r1, has_r1, a.act_f32, a.act_f32_stride, nt, acc); break;
    case GgmlType::BF16: streams = false; pair_dot_f32<GgmlType::BF16, NT>(m, r0, r1, has_r1, a.act_f32, a.act_f32_stride, nt, acc); break;
    default: return;
  }
  store_pair_sums<NT>(a, w, acc, nt, streams);
}

// One token against one k-quant type's segments: a kernel per type, so its registers are what that
// type's pipelined loads need, not the widest type's.
template <typename Unit>
__global__ void __launch_bounds__(kMvWarps * 32) matvec_one_token_kernel(const __grid_constant__ MatVecArgs a) {
  MINFER_TIMELINE_PROBE();
  MatVecPair w;
  if (!matvec_pair(a, w)) return;
  float acc[2][1] = {{0.0f}, {0.0f}};
  pair_dot_one_token<Unit>(w.seg->w, w.r0, w.r1, w.has_r1, a.act_q8, acc[0][0], acc[1][0]);
  store_pair_sums<1>(a, w, acc, 1, true);
}

int segments_of_type(const MatSeg* segs, int n_segs, int first, bool (&taken)[kMaxMatSegs],
                     MatSeg (&of_type)[kMaxMatSegs]) {
  int n = 0;
  for (int i = first; i < n_segs; ++i)
    if (segs[i].w.type == segs[first].w.type) taken[i] = true, of_type[n++] = segs[i];
  return n;
}

void launch_matvec(const MatSeg* segs, int n_segs, const Q8Plane& act_q8, const float* act_f32, int act_f32_stride,
                   int n_tokens, const MatVecExtra& extra, const KernelStream& s) {
  if (n_segs < 1 || n_segs > kMaxMatSegs) fail("matvec: ", n_segs, " segments (1..", kMaxMatSegs, " supported)");
  // The launch of segments segs[0..n) for tokens t0..t0 + nt - 1.
  const auto args = [&](const MatSeg* launch_segs, int n, int t0, int nt, int& blocks) {
    MatVecArgs a{};
    a.n_segs = n;
    blocks = 0;
    for (int i = 0; i < n; ++i) {
      a.seg[i] = launch_segs[i];
      if (a.seg[i].residual) a.seg[i].residual += size_t(t0) * launch_segs[i].ld_out;
      if (a.seg[i].out) a.seg[i].out += size_t(t0) * launch_segs[i].ld_out;
      a.first_block[i] = blocks;
      const int pairs = (launch_segs[i].w.rows + 1) / 2;
      blocks += (pairs + kMvWarps - 1) / kMvWarps;
    }
    a.first_block[n] = blocks;
    a.act_q8 = act_q8.from_token(t0);
    a.act_f32 = act_f32 ? act_f32 + size_t(t0) * act_f32_stride : nullptr;
    a.act_f32_stride = act_f32_stride;
    a.n_tokens = nt;
    a.extra = extra;
    if (extra.positions) a.extra.positions += t0;
    if (extra.slots) a.extra.slots += t0;
    return a;
  };
  int blocks = 0;
  if (n_tokens == 1) {
    bool taken[kMaxMatSegs] = {};
    for (int first = 0; first < n_segs; ++first) {
      if (taken[first]) continue;
      MatSeg of_type[kMaxMatSegs];
      const int n = segments_of_type(segs, n_segs, first, taken, of_type);
      const MatVecArgs a = args(of_type, n, 0, 1, blocks);
      switch (of_type[0].w.type) {
        case GgmlType::Q4_K: launch_kernel("matvec", matvec_one_token_kernel<UnitQK45<false>>, blocks, kMvWarps * 32, 0, s, a); break;
        case GgmlType::Q5_K: launch_kernel("matvec", matvec_one_token_kernel<UnitQK45<true>>, blocks, kMvWarps * 32, 0, s, a); break;
        case GgmlType::Q6_K: launch_kernel("matvec", matvec_one_token_kernel<UnitQ6K>, blocks, kMvWarps * 32, 0, s, a); break;
        default: launch_kernel("matvec", matvec_kernel<1>, blocks, kMvWarps * 32, 0, s, a); break;
      }
    }
    return;
  }
  for (int t0 = 0; t0 < n_tokens; t0 += kMaxTokens) {
    const int nt = n_tokens - t0 < kMaxTokens ? n_tokens - t0 : kMaxTokens;
    const MatVecArgs a = args(segs, n_segs, t0, nt, blocks);
    launch_kernel("matvec", matvec_kernel<kMaxTokens>, blocks, kMvWarps * 32, 0, s, a);
  }
}

// ---- attention: split-K over the KV length, the q heads of a KV group in one block -------------
// grid (n_kv_heads x head chunks, split CTAs, n_tokens), 4 warps. A block owns G q heads of one KV
// head (all of them up to kAttnMaxHeads; more as chunks of at most that many, the last maybe
// smaller) and the slices y, y + gridDim.y, ... of its token's positions, so each K/V byte is read
// once for its heads and a short sequence's empty slices cost no block. Warp w takes the body's
// kPositions positions at start + w kPositions, then every 4 kPositions, keeping its own online
// softmax (m, l, acc) in the exp2 domain; the next iteration's K/V loads (or the block's next
// slice's first) are issued before this one's arithmetic. The four warps merge in shared memory and
// the block writes one partial a slice; attn_combine merges the slices. A head's arithmetic
// involves no other head, so how heads are grouped into blocks does not change a bit. Two bodies:
// AttnMma (f16 tensor cores, head_dim 64 and 128) and AttnSimt (CUDA cores, every head_dim; the
// only one with MINFER_NO_MMA_ATTENTION).
constexpr int kAttnWarps = 4;
constexpr int kAttnUnroll = 4;
constexpr int kAttnMaxHeads = 8;
constexpr float kAttnLog2e = 1.4426950408889634f;  // q is pre-scaled by it: scores in the exp2 domain
// Block-table entries a split block stages in shared memory (a sequence of up to 1024 KV blocks:
// 65,536 positions at the engine's 64): a K/V address then needs no global load first, which in
// a loop that prefetches one iteration ahead put two round trips on every iteration.
constexpr int kAttnTableCache = 1024;
// Slices of at least two block iterations of AttnSimt (64 positions at head_dim 128): each slice
// costs a merge of the four warps, a partial and the combine's read of it, which at 32 and 64
// sequences of 64–200 positions outweigh the parallelism of one-iteration slices (+1.1 % at x32,
// +1.8 % at x64, +3.6 / +4.3 % at depth 70; -1 % at one sequence; four iterations: -0.8 % at x32
// against two).
constexpr int kAttnMinIterations = 2;

// Positions per split for a sequence of len positions: at most n_splits slices, each at least
// kAttnMinIterations iterations of the block (4 warps x U loads of 32 / (HD / 8) positions). A
// function of the length alone, so a token's bits do not depend on the batch; splits past the
// length are empty and skipped.
__host__ __device__ __forceinline__ int attn_split_chunk(int len, int n_splits, int head_dim) {
  const int least = kAttnMinIterations * kAttnWarps * kAttnUnroll * (32 / (head_dim / 8));
  const int even = (len + n_splits - 1) / n_splits;
  return even > least ? even : least;
}
// The slices that hold positions.
__host__ __device__ __forceinline__ int attn_splits_used(int len, int n_splits, int head_dim) {
  const int chunk = attn_split_chunk(len, n_splits, head_dim), used = (len + chunk - 1) / chunk;
  return used < n_splits ? used : n_splits;
}

__device__ __forceinline__ void half8_to_float(const uint4& r, float (&f)[8]) {
  const uint32_t w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 x = __half22float2(*reinterpret_cast<const __half2*>(&w[i]));
    f[2 * i] = x.x;
    f[2 * i + 1] = x.y;
  }
}

// One KV head's cache of one token's sequence: the address of position pos's row.
struct AttnKv {
  const uint8_t* k;  // the KV head's first element of slot 0
  const uint8_t* v;
  size_t ld;  // bytes between slots
  const int32_t* table;
  int block_shift, block_size;
  uint64_t policy;  // the K/V loads' L2 policy (AttnParams::kv_evict_first)
  __device__ uint4 load(const uint8_t* p) const { return prefill_detail::ld16_policy(p, policy); }
  __device__ size_t offset(int pos) const {
    return (size_t(table[pos >> block_shift]) * block_size + (pos & (block_size - 1))) * ld;
  }
  // The offsets of N rows of a warp iteration, those at or past end as end - 1's: every table entry
  // is read whether or not its row is loaded, so the N reads go out together (read inside each
  // row's `pos < end`, ptxas kept them one round trip after another). REQUIRES: end > 0.
  template <int N>
  __device__ void row_offsets(const int (&pos)[N], int end, size_t (&off)[N]) const {
#pragma unroll
    for (int i = 0; i < N; ++i) off[i] = offset(min(pos[i], end - 1));
  }
};

// The block's per-warp results of a slice, merged by attn_split_kernel.
template <int HD, int G>
struct AttnStash {
  float acc[kAttnWarps][G][HD];
  float m[kAttnWarps][G], l[kAttnWarps][G];
};

// CUDA cores: C = HD / 8 lanes share a position (lane c holds dims 8c..8c+7: one 16-byte load per
// K or V row chunk, a row read as one contiguous run), the warp covers 32 / C positions per load
// and keeps U loads of K and V in flight per lane. A score is the xor-butterfly sum over the C
// lanes (bitwise equal on all of them, so the max and the rescale branch are warp-uniform).
template <int HD, int G>
struct AttnSimt {
  static constexpr int kHeadDim = HD, kHeads = G, C = HD / 8, LP = 32 / C, U = kAttnUnroll, kPositions = U * LP;
  struct Loads {
    uint4 k[U], v[U];
  };
  struct Shared {};
  int c, grp;
  float q[G][8];
  float m[G], l[G], acc[G][8];
  __device__ AttnSimt(Shared&, int lane) : c(lane % C), grp(lane / C) {}
  __device__ void read_q(const AttnParams& p, Shared&, int t, int qh0, int n_heads, int) {
    const float scale = rsqrtf(float(HD)) * kAttnLog2e;
    const float* qt = p.q + size_t(t) * p.n_head * HD;
#pragma unroll
    for (int h = 0; h < G; ++h)
#pragma unroll
      for (int j = 0; j < 8; ++j) q[h][j] = qt[size_t(qh0 + min(h, n_heads - 1)) * HD + 8 * c + j] * scale;
  }
  __device__ void reset() {
#pragma unroll
    for (int h = 0; h < G; ++h) {
      m[h] = -INFINITY;
      l[h] = 0.0f;
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[h][j] = 0.0f;
    }
  }
  // the positions base + u LP + grp before end. REQUIRES: base < end (see AttnKv::row_offsets).
  __device__ void load(const AttnKv& kv, int base, int end, Loads& r) const {
    int pos[U];
#pragma unroll
    for (int u = 0; u < U; ++u) pos[u] = base + u * LP + grp;
    size_t off[U];
    kv.row_offsets(pos, end, off);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (pos[u] < end) {
        r.k[u] = kv.load(kv.k + off[u] + 16 * c);
        r.v[u] = kv.load(kv.v + off[u] + 16 * c);
      } else {
        r.k[u] = r.v[u] = make_uint4(0, 0, 0, 0);
      }
    }
  }
  __device__ void step(const Loads& r, int base, int end) {
    float s[U][G];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      float k[8];
      half8_to_float(r.k[u], k);
#pragma unroll
      for (int h = 0; h < G; ++h) {
        float d = 0.0f;
#pragma unroll
        for (int j = 0; j < 8; ++j) d = fmaf(q[h][j], k[j], d);
        s[u][h] = d;
      }
    }
#pragma unroll
    for (int o = C / 2; o > 0; o >>= 1)
#pragma unroll
      for (int u = 0; u < U; ++u)
#pragma unroll
        for (int h = 0; h < G; ++h) s[u][h] += __shfl_xor_sync(0xffffffffu, s[u][h], o);
#pragma unroll
    for (int h = 0; h < G; ++h) {
      float mx = -INFINITY;
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (base + u * LP + grp < end) mx = fmaxf(mx, s[u][h]);
#pragma unroll
      for (int o = C; o < 32; o <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
      if (mx > m[h]) {  // warp-uniform
        const float corr = exp2f(m[h] - mx);
        l[h] *= corr;
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[h][j] *= corr;
        m[h] = mx;
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const bool valid = base + u * LP + grp < end;
      float v[8];
      half8_to_float(r.v[u], v);
#pragma unroll
      for (int h = 0; h < G; ++h) {
        const float e = valid ? exp2f(s[u][h] - m[h]) : 0.0f;
        l[h] += e;
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[h][j] = fmaf(e, v[j], acc[h][j]);
      }
    }
  }
  // merges the position groups of the warp (same m on every lane) into the warp's stash
  __device__ void stash(AttnStash<HD, G>& st, int warp, int) {
#pragma unroll
    for (int o = C; o < 32; o <<= 1)
#pragma unroll
      for (int h = 0; h < G; ++h) {
        l[h] += __shfl_xor_sync(0xffffffffu, l[h], o);
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[h][j] += __shfl_xor_sync(0xffffffffu, acc[h][j], o);
      }
    if (grp == 0) {
#pragma unroll
      for (int h = 0; h < G; ++h) {
#pragma unroll
        for (int j = 0; j < 8; ++j) st.acc[warp][h][8 * c + j] = acc[h][j];
        if (c == 0) {
          st.m[warp][h] = m[h];
          st.l[warp][h] = l[h];
        }
      }
    }
  }
};

// The transpose of the 8x8 f16 matrix whose fragment the warp holds (row lane / 4, columns
// 2 (lane % 4) and + 1).
__device__ __forceinline__ uint32_t movmatrix_trans(uint32_t x) {
  uint32_t y;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(y) : "r"(x));
  return y;
}
// x as f16 hi + lo (hi = x rounded, lo = the rest rounded): two products with an f16 operand carry
// x to about 22 bits, as close to the f32 arithmetic of AttnSimt as the tests can tell.
__device__ __forceinline__ void split_half2(float x0, float x1, uint32_t& hi, uint32_t& lo) {
  const __half2 h = __floats2half2_rn(x0, x1);
  const float2 back = __half22float2(h);
  const __half2 r = __floats2half2_rn(x0 - back.x, x1 - back.y);
  hi = *reinterpret_cast<const uint32_t*>(&h);
  lo = *reinterpret_cast<const uint32_t*>(&r);
}

// f16 tensor cores (mma.sync m16n8k16, f32 accumulation), a warp iteration = 16 positions and the
// block's G <= 8 heads as one n8 column of heads:
//   scores S^T (16 positions x 8 heads) = K (A: rows = positions gid and gid + 8, the k16 step's
//     dims; thread tid holds dims [tid HD/4, + HD/4) of both rows, two 32-bit words a step, so the
//     k index is permuted alike in A and B) x Q^T (B: column gid = head gid), Q split hi + lo;
//   P^T as B of the output (k = positions, n = heads): S^T's f32 fragment rounded to f16 hi + lo
//     and transposed by movmatrix (the fragment of positions 0-7, then 8-15);
//   O^T (dims x heads) += V^T (A: m16 tile mt's row gid = dim gid HD/8 + mt, row gid + 8 = dim
//     gid HD/8 + HD/16 + mt; thread (gid, tid) loads positions 2tid, 2tid + 1, 2tid + 8, 2tid + 9,
//     dims [gid HD/8, + HD/8), and pairs two positions' halves of a dim with one prmt) x P^T.
// Masked positions get score -inf and zero K/V bytes.
template <int HD, int G>
struct AttnMma {
  static_assert(G <= 8, "the block's heads are one n8 column of the mma");
  static_assert(HD == 64 || HD == 128, "registers: K, V, next K, V and the output for head_dim <= 128");
  static constexpr int kHeadDim = HD, kHeads = G, kPositions = 16;
  static constexpr int KW = HD / 32;  // 16-byte K loads of a position (dims [tid HD/4, + HD/4))
  static constexpr int VW = HD / 64;  // 16-byte V loads of a position (dims [gid HD/8, + HD/8))
  static constexpr int DS = HD / 16;  // k16 steps of the scores = m16 tiles of the output
  struct Loads {
    uint4 k[2][KW];  // positions gid, gid + 8
    uint4 v[4][VW];  // positions 2tid, 2tid + 1, 2tid + 8, 2tid + 9
  };
  // Q^T's B fragments of each k16 step and lane, {hi b0, hi b1, lo b0, lo b1}: the same for every
  // warp, and in registers they would spill the double-buffered loads (255 registers, 152 bytes).
  struct Shared {
    uint4 q[DS][32];
  };
  const Shared& sh;
  int gid, tid;
  float m[2], l[2];  // heads 2 tid, 2 tid + 1 (l: this lane's positions until stash)
  float acc[DS][4];  // element e: dim row gid + 8 (e / 2) of tile mt, head 2 tid + e % 2
  __device__ static uint32_t word(const uint4* w, int i) {
    const uint4& x = w[i / 4];
    return i % 4 == 0 ? x.x : i % 4 == 1 ? x.y : i % 4 == 2 ? x.z : x.w;
  }
  __device__ AttnMma(Shared& shared, int lane) : sh(shared), gid(lane / 4), tid(lane % 4) {}
  // REQUIRES: a block barrier between read_q and the first step (warp 0 writes sh).
  __device__ void read_q(const AttnParams& p, Shared& shared, int t, int qh0, int n_heads, int warp) {
    if (warp != 0) return;
    const float scale = rsqrtf(float(HD)) * kAttnLog2e;
    const float* qrow = p.q + size_t(t) * p.n_head * HD + size_t(qh0 + min(gid, n_heads - 1)) * HD + tid * (HD / 4);
#pragma unroll
    for (int s = 0; s < DS; ++s) {
      const float4 x = *reinterpret_cast<const float4*>(qrow + 4 * s);
      uint4 f;
      split_half2(x.x * scale, x.y * scale, f.x, f.z);
      split_half2(x.z * scale, x.w * scale, f.y, f.w);
      shared.q[s][gid * 4 + tid] = f;
    }
  }
  __device__ void reset() {
#pragma unroll
    for (int i = 0; i < 2; ++i) m[i] = -INFINITY, l[i] = 0.0f;
#pragma unroll
    for (int mt = 0; mt < DS; ++mt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mt][e] = 0.0f;
  }
  // REQUIRES: base < end (see AttnKv::row_offsets).
  __device__ void load(const AttnKv& kv, int base, int end, Loads& r) const {
    const int pos[6] = {base + gid, base + gid + 8, base + 2 * tid, base + 2 * tid + 1, base + 2 * tid + 8,
                        base + 2 * tid + 9};  // K rows 0-1, V rows 0-3
    size_t off[6];
    kv.row_offsets(pos, end, off);
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const uint8_t* row = kv.k + off[i] + tid * (HD / 2);
#pragma unroll
      for (int w = 0; w < KW; ++w) r.k[i][w] = pos[i] < end ? kv.load(row + 16 * w) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint8_t* row = kv.v + off[2 + i] + gid * (HD / 4);
#pragma unroll
      for (int w = 0; w < VW; ++w) r.v[i][w] = pos[2 + i] < end ? kv.load(row + 16 * w) : make_uint4(0, 0, 0, 0);
    }
  }
  __device__ void step(const Loads& r, int base, int end) {
    float s[4] = {0.0f, 0.0f, 0.0f, 0.0f};  // positions gid (0, 1), gid + 8 (2, 3); heads 2 tid + e % 2
#pragma unroll
    for (int ks = 0; ks < DS; ++ks) {
      const uint32_t a[4] = {word(r.k[0], 2 * ks), word(r.k[1], 2 * ks), word(r.k[0], 2 * ks + 1),
                             word(r.k[1], 2 * ks + 1)};
      const uint4 q = sh.q[ks][gid * 4 + tid];
      prefill_detail::mma_f16(s, a, q.x, q.y);
      prefill_detail::mma_f16(s, a, q.z, q.w);
    }
    if (base + gid >= end) s[0] = s[1] = -INFINITY;
    if (base + gid + 8 >= end) s[2] = s[3] = -INFINITY;
    float p[4];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float mx = fmaxf(s[h], s[2 + h]);
#pragma unroll
      for (int o = 4; o < 32; o <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
      // position base is valid, so mx is finite; exp2(-inf - finite) = 0 for masked positions and
      // for the first iteration's m
      const float mn = fmaxf(m[h], mx), corr = exp2f(m[h] - mn);
      m[h] = mn;
      p[h] = exp2f(s[h] - mn);
      p[2 + h] = exp2f(s[2 + h] - mn);
      l[h] = l[h] * corr + p[h] + p[2 + h];
#pragma unroll
      for (int mt = 0; mt < DS; ++mt) acc[mt][h] *= corr, acc[mt][2 + h] *= corr;
    }
    uint32_t hi[2], lo[2];  // P^T: positions 0-7 (b0), 8-15 (b1) of the B fragment
    split_half2(p[0], p[1], hi[0], lo[0]);
    split_half2(p[2], p[3], hi[1], lo[1]);
#pragma unroll
    for (int i = 0; i < 2; ++i) hi[i] = movmatrix_trans(hi[i]), lo[i] = movmatrix_trans(lo[i]);
#pragma unroll
    for (int mt = 0; mt < DS; ++mt) {
      // the f16 halves (mt & 1) of words mt / 2 (row gid) and HD/32 + mt / 2 (row gid + 8)
      const uint32_t sel = (mt & 1) ? 0x7632u : 0x5410u;
      const int w0 = mt / 2, w1 = HD / 32 + mt / 2;
      const uint32_t a[4] = {__byte_perm(word(r.v[0], w0), word(r.v[1], w0), sel),
                             __byte_perm(word(r.v[0], w1), word(r.v[1], w1), sel),
                             __byte_perm(word(r.v[2], w0), word(r.v[3], w0), sel),
                             __byte_perm(word(r.v[2], w1), word(r.v[3], w1), sel)};
      prefill_detail::mma_f16(acc[mt], a, hi[0], hi[1]);
      prefill_detail::mma_f16(acc[mt], a, lo[0], lo[1]);
    }
  }
  __device__ void stash(AttnStash<HD, G>& st, int warp, int n_heads) {
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int o = 4; o < 32; o <<= 1) l[h] += __shfl_xor_sync(0xffffffffu, l[h], o);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int head = 2 * tid + h;
      if (head >= n_heads) continue;
#pragma unroll
      for (int mt = 0; mt < DS; ++mt) {
        st.acc[warp][head][gid * (HD / 8) + mt] = acc[mt][h];
        st.acc[warp][head][gid * (HD / 8) + HD / 16 + mt] = acc[mt][2 + h];
      }
      if (gid == 0) {
        st.m[warp][head] = m[h];
        st.l[warp][head] = l[h];
      }
    }
  }
};

// With p.early_reads the block reads the token's position and block table and issues its first
// slice's first K/V loads before the PDL wait, so that chain of round trips runs during the q/k/v
// launch's tail; a warp whose first iteration reaches the token's own row (which that launch
// writes) issues its loads after the wait.
// REQUIRES: blockDim.x == kAttnWarps * 32; gridDim.x == n_kv_heads * head_chunks; every thread
// reaches both barriers of a slice (the slice loop is uniform over the block) and the PDL wait
// (p.early_reads is uniform over the grid).
template <typename Body>
__global__ void __launch_bounds__(kAttnWarps * 32) attn_split_kernel(const AttnParams p, int head_chunks,
                                                                     bool release_early) {
  MINFER_TIMELINE_PROBE();
  if (release_early) release_dependents();
  if (!p.early_reads) await_predecessor();
  constexpr int HD = Body::kHeadDim, G = Body::kHeads, PW = Body::kPositions, NW = kAttnWarps;
  __shared__ __align__(16) AttnStash<HD, G> st;
  __shared__ typename Body::Shared sh;
  const int kvh = blockIdx.x / head_chunks, t = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int group = p.n_head / p.kv.n_kv_heads;
  const int first = int(blockIdx.x % head_chunks) * G;  // of the KV head's q heads
  const int qh0 = kvh * group + first, n_heads = min(G, group - first);  // the block's q heads
  const int len = p.positions[t] + 1;
  const int chunk = attn_split_chunk(len, p.n_splits, HD);
  const int n_used = attn_splits_used(len, p.n_splits, HD);
  const int block_shift = __ffs(p.block_size) - 1;  // block_size is a power of two
  const int32_t* table = p.tables + p.table_offsets[t];
  const size_t head_bytes = size_t(kvh) * HD * 2;
  AttnKv kv{reinterpret_cast<const uint8_t*>(p.kv.k) + head_bytes,
            reinterpret_cast<const uint8_t*>(p.kv.v) + head_bytes,
            size_t(p.kv.n_kv_heads) * HD * 2,
            table,
            block_shift,
            p.block_size,
            prefill_detail::l2_policy_streaming(p.kv_evict_first)};
  Body body(sh, lane);
  if (!p.early_reads) body.read_q(p, sh, t, qh0, n_heads, warp);
  typename Body::Loads cur, next;
  int loaded = -1;  // the slice whose first iteration next holds, moved into cur after the merge
  // Issues the warp's first iteration of slice `split` into next (when it has one there).
  auto load_slice_start = [&](int split) {
    const int from = split * chunk + warp * PW, end = min(len, split * chunk + chunk);
    if (split >= n_used || from >= end) return;
    body.load(kv, from, end, next);
    loaded = split;
  };
  // The first slice's first loads (addresses from the table in global memory) fly across the
  // barrier below, so a block's first K/V round trip overlaps its q and table loads. With early
  // reads they go out before the PDL wait where they end before the token's own row.
  const bool first_loads_early = !p.early_reads || int(blockIdx.y) * chunk + (warp + 1) * PW < len;
  if (first_loads_early) load_slice_start(blockIdx.y);
  const int n_entries = (len + p.block_size - 1) >> block_shift;
  __shared__ int32_t table_cache[kAttnTableCache];
  if (n_entries <= kAttnTableCache)
    for (int i = threadIdx.x; i < n_entries; i += NW * 32) table_cache[i] = table[i];
  if (p.early_reads) {
    await_predecessor();
    if (!first_loads_early) load_slice_start(blockIdx.y);
    body.read_q(p, sh, t, qh0, n_heads, warp);
  }
  __syncthreads();  // sh and the table cache are written
  if (n_entries <= kAttnTableCache) kv.table = table_cache;
  float* part_acc = p.part;
  float* part_ml = p.part + size_t(p.n_tokens) * p.n_head * p.n_splits * HD;
  for (int split = blockIdx.y; split < n_used; split += gridDim.y) {  // uniform over the block
    const int start = split * chunk, end = min(len, start + chunk);
    body.reset();
    int base = start + warp * PW;
    if (loaded == split) cur = next;
    else if (base < end) body.load(kv, base, end, cur);
    for (; base < end; base += NW * PW) {
      const bool more = base + NW * PW < end;
      if (more) {
        body.load(kv, base + NW * PW, end, next);  // prefetch the next iteration
      } else {  // or the block's next slice's first: its loads fly during this slice's merge
        load_slice_start(split + gridDim.y);
      }
      body.step(cur, base, end);
      // A register copy waits for its loads: the next slice's are copied only after the merge.
      if (more) cur = next;
    }
    body.stash(st, warp, n_heads);
    __syncthreads();
    // partial layout: [t][q head][split] x HD acc, then (m, l) pairs in a second array. A thread
    // merges four dims of one head (a warp covers whole heads at head_dim 128), the warps' terms
    // in warp order with one fma each, as the combine merges slices.
    constexpr int V = HD / 4;
    for (int i = threadIdx.x; i < n_heads * V; i += NW * 32) {
      const int h = i / V, d = 4 * (i % V);
      float mx = -INFINITY;
#pragma unroll
      for (int w = 0; w < NW; ++w) mx = fmaxf(mx, st.m[w][h]);
      float4 a = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      float sum = 0.0f;
      if (mx > -INFINITY) {
#pragma unroll
        for (int w = 0; w < NW; ++w) {
          if (st.l[w][h] == 0.0f) continue;  // a warp that saw no position
          const float f = exp2f(st.m[w][h] - mx);
          const float4 x = *reinterpret_cast<const float4*>(&st.acc[w][h][d]);
          a = make_float4(fmaf(x.x, f, a.x), fmaf(x.y, f, a.y), fmaf(x.z, f, a.z), fmaf(x.w, f, a.w));
          sum = fmaf(st.l[w][h], f, sum);
        }
      }
      const size_t idx = (size_t(t) * p.n_head + qh0 + h) * p.n_splits + split;
      *reinterpret_cast<float4*>(part_acc + idx * HD + d) = a;
      if (d == 0) {
        part_ml[2 * idx] = mx;
        part_ml[2 * idx + 1] = sum;
      }
    }
    __syncthreads();  // the stash is read before the next slice writes it
  }
}

// One block per (G q heads, token), HD / 2 threads a head: each head's splits' (m, l) pairs are
// staged in shared memory and turned into weights in parallel, then thread i of the head sums dims
// 2i and 2i + 1 over the splits with independent loads (at a dim a thread the 7B's 64-token step
// needed 1.7 waves of blocks; two dims a thread fit one). The first kAhead splits' partials are
// loaded with the (m, l) pairs, so their round trip overlaps the weights'. kStaged: the rest of the
// block's partials (one contiguous run a head) are bulk-copied into shared memory at the block's
// start, behind the pairs, instead of the sum loop's batches of eight loads a thread (the same sums
// in the same order). G = 256 / HD with the q8 epilogue: the block's heads are one 256-column group
// of the q8 plane, which warp 0 quantizes from shared memory (quantize_q8_group_values, the
// standalone quantize's bits) for the o-projection's decode matmul.
// REQUIRES: blockDim.x == G * HD / 2; gridDim.x * G == n_head; combine_shared_bytes(G, HD,
// n_splits, kStaged) of dynamic shared memory; p.q8_rows > 0 only with G * HD == 256. With
// p.early_reads the token's position is read before the PDL wait.
constexpr int kCombineAhead = 4;
constexpr int combine_pairs_bytes(int g, int n_splits) { return (2 * g * n_splits * 4 + 15) / 16 * 16; }
constexpr int combine_shared_bytes(int g, int hd, int n_splits, bool staged) {
  return combine_pairs_bytes(g, n_splits) + (staged ? g * n_splits * hd * 4 + 8 : 0);
}
template <int HD, int G, bool kStaged>
__global__ void attn_combine_kernel(const AttnParams p, bool release_early) {
  MINFER_TIMELINE_PROBE();
  if (release_early) release_dependents();
  if (!p.early_reads) await_predecessor();
  extern __shared__ __align__(16) float ml[];  // a head's m (then the weight) of each split, then l of each split
  constexpr int T = HD / 2, kAhead = kCombineAhead;
  const int head = threadIdx.x / T, tid = threadIdx.x % T;
  const int qh = blockIdx.x * G + head, t = blockIdx.y;
  const int len = p.positions[t] + 1;
  const int S = attn_splits_used(len, p.n_splits, HD);
  if (p.early_reads) await_predecessor();
  float *w_s = ml + 2 * head * p.n_splits, *l_s = w_s + S;
  const float* part_ml = p.part + size_t(p.n_tokens) * p.n_head * p.n_splits * HD;
  const size_t base = (size_t(t) * p.n_head + qh) * p.n_splits;
  const float2* acc = reinterpret_cast<const float2*>(p.part + base * HD) + tid;  // split s at acc[s T]
  float2 ahead[kAhead];
#pragma unroll
  for (int s = 0; s < kAhead; ++s) ahead[s] = s < S ? acc[s * T] : make_float2(0.0f, 0.0f);
  // kStaged: staged[head][split - kAhead][HD] behind the pairs, then the copies' barrier
  float* staged = ml + combine_pairs_bytes(G, p.n_splits) / 4;
  uint64_t* landed = reinterpret_cast<uint64_t*>(staged + G * p.n_splits * HD);
  if constexpr (kStaged) {
    if (threadIdx.x == 0 && S > kAhead) {  // S is uniform over the block: every head has the token's splits
      const uint32_t bar = prefill_detail::shared_address(landed), bytes = uint32_t(S - kAhead) * HD * 4;
      prefill_detail::mbarrier_init(bar, 1);
      asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
      prefill_detail::mbarrier_expect_tx(bar, G * bytes);
      prefill_detail::mbarrier_arrive(bar);
      const size_t block_base = (size_t(t) * p.n_head + size_t(blockIdx.x) * G) * p.n_splits;
      for (int h = 0; h < G; ++h)
        prefill_detail::bulk_copy_to_shared(prefill_detail::shared_address(staged + h * p.n_splits * HD),
                                            p.part + (block_base + size_t(h) * p.n_splits + kAhead) * HD, bytes, bar);
    }
  }
  for (int s = tid; s < S; s += T) {
    w_s[s] = part_ml[2 * (base + s)];
    l_s[s] = part_ml[2 * (base + s) + 1];
  }
  __syncthreads();  // also publishes the copies' barrier's initialization
  float mx = -INFINITY;
  for (int s = 0; s < S; ++s)
    if (l_s[s] > 0.0f) mx = fmaxf(mx, w_s[s]);
  __syncthreads();  // every thread has its max before m turns into the weight
  for (int s = tid; s < S; s += T) w_s[s] = l_s[s] > 0.0f ? exp2f(w_s[s] - mx) : 0.0f;
  __syncthreads();
  float2 num = make_float2(0.0f, 0.0f);
  float den = 0.0f;
  const auto add = [&](int s, float2 x) {  // splits in order: the same sums at any kAhead
    den = fmaf(l_s[s], w_s[s], den);
    num = make_float2(fmaf(x.x, w_s[s], num.x), fmaf(x.y, w_s[s], num.y));
  };
#pragma unroll
  for (int s = 0; s < kAhead; ++s)
    if (s < S) add(s, ahead[s]);
  if constexpr (kStaged) {
    if (S > kAhead) prefill_detail::mbarrier_wait(prefill_detail::shared_address(landed), 0);
    const float2* mine = reinterpret_cast<const float2*>(staged + head * p.n_splits * HD) + tid;
    for (int s = kAhead; s < S; ++s) add(s, mine[size_t(s - kAhead) * T]);
  } else {
#pragma unroll 8
    for (int s = kAhead; s < S; ++s) add(s, acc[size_t(s) * T]);
  }
  const float2 out = make_float2(num.x / den, num.y / den);
  reinterpret_cast<float2*>(p.out + size_t(t) * p.n_head * HD + size_t(qh) * HD)[tid] = out;
  if constexpr (G * HD == 256) {
    __shared__ __align__(16) float2 group[128];
    if (t < p.q8_rows) {  // uniform over the block
      group[threadIdx.x] = out;
      __syncthreads();
      if (threadIdx.x < 32)
        quantize_q8_group_member(reinterpret_cast<const float*>(group) + 32 * threadIdx.x, p.q8, t,
                                 blockIdx.x * 8 + int(threadIdx.x), threadIdx.x < 8);
    }
  }
}

// The combine launch. Where its CTAs are no more than the SMs (a few decode rows), each asks for
// more than half an SM's shared memory (combine_spread), so that no two share an SM: launched by PDL
// while the split's CTAs fill every SM's registers, they would otherwise all become resident on the
// first SMs a split CTA leaves and read their partials through those SMs' load pipes (the 7B's 14
// CTAs on 3-7 SMs at depth 16384, docs/13 §2); with combine_staging they bulk-copy their
// partials. Launch geometry and the load path only: the same sums in the same order.
template <int HD, int G>
static void launch_attention_combine(const AttnParams& p, const KernelStream& s) {
  const dim3 grid(p.n_head / G, p.n_tokens);
  const bool few = int(grid.x * grid.y) <= p.sm_count;
  int sm_bytes = 0, block_bytes = 0;
  if (few && (p.combine_spread || p.combine_staging)) {
    sm_bytes = prefill_detail::device_shared_memory_per_sm();
    block_bytes = prefill_detail::device_shared_memory_per_block();
    if (sm_bytes <= 0 || block_bytes <= 0) fail("attention combine: the device's shared memory limits cannot be read");
  }
  const bool staged = few && p.combine_staging && combine_shared_bytes(G, HD, p.n_splits, true) <= block_bytes;
  int bytes = combine_shared_bytes(G, HD, p.n_splits, staged);
  if (few && p.combine_spread) bytes = std::max(bytes, std::min(sm_bytes / 2 + 1, block_bytes));
  const auto kernel = staged ? attn_combine_kernel<HD, G, true> : attn_combine_kernel<HD, G, false>;
  if (bytes > 48 * 1024) prefill_detail::reserve_dynamic_shared_memory(kernel, bytes, "attention combine");
  launch_kernel("attention", kernel, grid, G * HD / 2, size_t(bytes), s, p, s.releases_early());
}

int64_t attention_workspace_floats(int n_tokens, int n_head, int head_dim, int n_splits) {
  return int64_t(n_tokens) * n_head * n_splits * (head_dim + 2);
}

int decode_attention_splits(int sm_count, int n_kv_heads) {
  return std::max(1, (2 * sm_count + n_kv_heads - 1) / n_kv_heads);
}

int attention_slices(int len, int n_splits, int head_dim) { return attn_splits_used(len, n_splits, head_dim); }

// The split launch: gridDim.y = the most split CTAs a (KV head, token, head chunk) that fit in one
// wave (the blocks an SM holds at this kernel's registers, times the SMs), at least one, at most
// one a slice.
template <typename Body>
static void launch_attention_body(const AttnParams& p, int head_chunks, const KernelStream& s) {
  int resident = 0;
  const cudaError_t e =
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, attn_split_kernel<Body>, kAttnWarps * 32, 0);
  if (e != cudaSuccess) fail("attention: occupancy query: ", cudaGetErrorString(e));
  const int per_split = p.kv.n_kv_heads * p.n_tokens * head_chunks;
  const int split_ctas = std::clamp(std::max(resident, 1) * p.sm_count / per_split, 1, p.n_splits);
  const dim3 grid(p.kv.n_kv_heads * head_chunks, split_ctas, p.n_tokens);
  launch_kernel("attention", attn_split_kernel<Body>, grid, kAttnWarps * 32, 0, s, p, head_chunks, s.releases_early());
}
template <int HD, int G>
static void launch_attention_split(const AttnParams& p, int head_chunks, const KernelStream& s) {
  if constexpr (HD <= 128) {
    if (p.tensor_cores) return launch_attention_body<AttnMma<HD, G>>(p, head_chunks, s);
  }
  launch_attention_body<AttnSimt<HD, G>>(p, head_chunks, s);
}

// One launch: a KV head's q heads in p.head_chunks chunks (at least enough for kAttnMaxHeads heads a
// block), of equal size but the last.
template <int HD>
static void launch_attention_hd(const AttnParams& p, const KernelStream& s) {
  const int group = p.n_head / p.kv.n_kv_heads;
  const int wanted = std::clamp(p.head_chunks, (group + kAttnMaxHeads - 1) / kAttnMaxHeads, group);
  const int heads = (group + wanted - 1) / wanted, head_chunks = (group + heads - 1) / heads;  // none empty
  switch (heads) {
    case 1: launch_attention_split<HD, 1>(p, head_chunks, s); break;
    case 2: launch_attention_split<HD, 2>(p, head_chunks, s); break;
    case 3: launch_attention_split<HD, 3>(p, head_chunks, s); break;
    case 4: launch_attention_split<HD, 4>(p, head_chunks, s); break;
    case 5: launch_attention_split<HD, 5>(p, head_chunks, s); break;
    case 6: launch_attention_split<HD, 6>(p, head_chunks, s); break;
    case 7: launch_attention_split<HD, 7>(p, head_chunks, s); break;
    default: launch_attention_split<HD, 8>(p, head_chunks, s); break;
  }
  if (p.q8_rows > 0) {  // the q8 epilogue: a block per 256-column group
    static_assert(256 % HD == 0, "a group is whole heads");
    constexpr int G = 256 / HD;
    if (p.n_head % G != 0) fail("attention: a q8 plane of ", p.n_head, " heads of ", HD, " is not whole 256-column groups");
    if (p.q8.n_blocks != p.n_head * HD / 32) fail("attention: the q8 plane is ", 32 * p.q8.n_blocks, " columns wide");
    return launch_attention_combine<HD, G>(p, s);
  }
  launch_attention_combine<HD, 1>(p, s);
}

void launch_attention(const AttnParams& p, const KernelStream& s) {
  if (p.n_tokens <= 0) return;
  if (p.n_head % p.kv.n_kv_heads != 0) fail("attention: n_head ", p.n_head, " % n_kv ", p.kv.n_kv_heads);
  if (p.sm_count <= 0) fail("attention: the device's multiprocessor count ", p.sm_count, " is not positive");
  if (p.block_size <= 0 || (p.block_size & (p.block_size - 1)) != 0)
    fail("attention: KV block size ", p.block_size, " is not a power of two");
  switch (p.kv.head_dim) {
    case 64: launch_attention_hd<64>(p, s); break;
    case 128: launch_attention_hd<128>(p, s); break;
    case 256: launch_attention_hd<256>(p, s); break;
    default: fail("attention: head_dim ", p.kv.head_dim, " (64, 128 or 256 supported)");
  }
}

}  // namespace minfer::cuda
