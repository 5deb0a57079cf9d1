// Prefill (many-token) kernels of the CUDA backend: the weight GEMM and causal flash attention.
// Plain C++ launch functions over device pointers; everything runs on the given stream and none of
// them synchronizes. docs/08-cuda-prefill.md explains the choices and the measured rates.
//
// Formulation (docs/08-cuda-prefill.md says why, and what was measured): weight tiles are
// dequantized exactly (f32) into shared memory as bf16 and multiplied on the tensor cores
// (warpgroup MMA on sm_90, mma.sync m16n8k16 elsewhere; f32 accumulation) against a bf16
// activation plane [m][k] (row-major). The backend's producers write that plane beside their f32
// output (rms_norm, swiglu, and this file's attention through PrefillAttention::out_bf16) with
// prefill_activation_bf16() below, the per-element body of the standalone
// launch_prefill_activation_bf16, so fused and standalone planes are bitwise equal; the standalone
// conversion runs where no producer could (MINFER_NO_PROMPT_A_FUSE=1, docs/07).
#pragma once
#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include <cuda_runtime.h>

#include "quant/types.h"

#ifdef __CUDACC__
#include <cuda_bf16.h>
#endif

namespace minfer::cuda {

// ---- activation plane ---------------------------------------------------------------------------
// bf16 bits (round to nearest even, NaN kept) of one activation; the producer-side epilogue.
#ifdef __CUDACC__
__device__ __forceinline__ uint16_t prefill_activation_bf16(float v) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(v));
}
// Two neighbouring activations as one 32-bit word of the plane (lo at the lower address).
__device__ __forceinline__ uint32_t prefill_activation_bf16x2(float lo, float hi) {
  return uint32_t(prefill_activation_bf16(lo)) | (uint32_t(prefill_activation_bf16(hi)) << 16);
}
// silu(g) * u: the swiglu kernel's element and the prompt GEMM's swiglu epilogue (one body, so the
// fused GEMM gives the separate GEMMs' and swiglu's bits). The quotient by the hardware reciprocal
// (2 ulp; 0 once 1 + exp(-g) passes 2^126, where |silu(g)| is about 1e-36 and falling): the IEEE
// division's slow-path branch around every element kept the epilogue from overlapping its
// elements, and the tensor cores idle while both consumer warpgroups run it (docs/14 §25).
__device__ __forceinline__ float silu_mul(float g, float u) { return __fdividef(g, 1.0f + expf(-g)) * u; }
#endif

// dst[i] = prefill_activation_bf16(src[i]) for i < n (the standalone conversion).
void launch_prefill_activation_bf16(const float* src, uint16_t* dst, int64_t n, cudaStream_t stream);

// ---- GEMM: Y[m, n] = X[m, :] . W[n, :] (+ bias[n]) (+ residual[m, n]) --------------------------
// Weight types with a prefill GEMM: q4_K, q5_K, q6_K, q8_0, f16, bf16, f32.
bool prefill_gemm_supports(GgmlType t);
// Whether the current device runs the warpgroup-MMA kernels (sm_90, the sm_90a code this build
// carries); the mma.sync kernels run everywhere.
bool prefill_gemm_device_has_wgmma();

struct PrefillGemm {
  GgmlType w_type = GgmlType::F32;
  const void* w = nullptr;  // n rows of device_row_bytes(w_type, k) bytes each, contiguous (kernels.h)
  int64_t n = 0;            // output features (weight rows)
  int64_t k = 0;            // input features
  const uint16_t* x = nullptr;  // bf16 activations, row-major [m][ldx]
  int64_t ldx = 0;
  int64_t m = 0;                // tokens (any m >= 1)
  float* y = nullptr;           // f32 output, row-major [m][ldy]
  int64_t ldy = 0;
  const float* bias = nullptr;      // [n] or null
  const float* residual = nullptr;  // [m][ldy] added to the product, or null; may equal y
  // SwiGLU: with w_up (the up matrix, w's type and shape), y = silu(X . W^T) * (X . W_up^T), both
  // products of one CTA (no bias, residual or K split; 128-row n-tiles), and the same bits as the
  // two GEMMs followed by the swiglu kernel.
  const void* w_up = nullptr;
  uint16_t* y_bf16 = nullptr;  // SwiGLU: also y as a bf16 plane [m][ldy] (prefill_activation_bf16), or null
  // Stacked matrices (q, k and v of one input): up to two more of w's type and k, multiplied in
  // the same launch as if their rows followed w's, each into its own output (row stride, bias).
  // Every matrix but the last has n % 128 == 0 (no n-tile straddles two); no residual or SwiGLU.
  // Each output has the bits of its own launch planned for the same columns (n_plan).
  struct Stacked {
    const void* w = nullptr;
    int64_t n = 0;
    float* y = nullptr;
    int64_t ldy = 0;
    const float* bias = nullptr;
  };
  std::array<Stacked, 2> stacked{};
  int n_stacked = 0;
  // 0: chosen from the grid size (256 with warpgroup MMA where 256-token tiles still fill the
  // card, unless MINFER_NO_WIDE_GEMM_TILES is set to anything but "0"); 64, 128 or 256 force one
  // (tests, bench; 256 needs warpgroup MMA and 128-row n-tiles).
  int m_tile = 0;
  // Weight rows a CTA: 0 chooses from the grid and the type (128 everywhere when
  // MINFER_NO_NARROW_GEMM_TILES is set to anything but "0"); 32, 64 or 128 force one. The width
  // never changes the bits of an output.
  int n_tile = 0;
  // Warpgroup MMA (sm_90): 0 chooses it on an sm_90 device unless MINFER_NO_WGMMA_GEMM is set to
  // anything but "0"; 1 forces it (an sm_90 device only), -1 forces the mma.sync kernel.
  int wgmma = 0;
  // 256-token tiles: 0 runs them warp-specialized (two producer warpgroups dequantizing into a ring
  // of stages, two consumer warpgroups multiplying) unless MINFER_NO_WS_GEMM is set to anything
  // but "0"; 1 forces it, -1 the kernel whose warpgroups both dequantize and multiply. The same
  // bits either way.
  int warp_specialized = 0;
  // Warp-specialized tiles: 0 has the tensor memory accelerator copy each stage's activation tile
  // (one instruction a stage) unless MINFER_NO_GEMM_TMA is set to anything but "0"; 1 forces it, -1
  // has every producer thread copy its 16-byte pieces (cp.async). The same bits either way.
  int tma = 0;
  // Warp-specialized tiles: 0 decodes every weight tile once into weight_image_buffer (one launch
  // before the GEMM) and has the stages copy it from there, where the launch has at least
  // kPrefillGemmWeightImageMinTokens tokens (several 256-token m-tiles would each decode it again)
  // and the buffer holds prefill_gemm_weight_image_bytes(g), unless MINFER_NO_GEMM_WEIGHT_IMAGE is
  // set to anything but "0"; 1 forces it (the buffer must hold it), -1 has the producers decode.
  // The stages hold the same bytes either way, so the same bits.
  int weight_image = 0;
  uint8_t* weight_image_buffer = nullptr;
  size_t weight_image_buffer_bytes = 0;
  // Warp-specialized tiles run persistent: 0 launches one CTA an SM, each walking the launch's
  // tiles in turn; n > 0 launches at most n (tests: several tiles a CTA).
  int ctas = 0;
  // Split-K: the K loop is cut into k_splits slices run by separate CTAs; each writes its f32
  // partial tile to the workspace and a second kernel sums the slices in slice order (then + bias,
  // then + residual), so results are deterministic run to run. 0: chosen from the grid size (1
  // when MINFER_NO_GEMM_SPLITK is set to anything but "0": the single-pass kernel, bit for bit);
  // >= 1 forces that many slices (tests, bench; clamped to one 64-K step per slice).
  int k_splits = 0;
  // The token count the automatic choice plans for (0: m). The slice count changes each output's
  // summation order, so the engine plans every GEMM of a weight for one fixed count: then a
  // token's result does not depend on how many tokens share the launch.
  int64_t m_plan = 0;
  // The weight rows the automatic K split plans for (0: n plus the stacked matrices'). The engine
  // plans every matrix of a q/k/v or gate/up group for the group's total, so a matrix's sums are
  // the same in its own launch as stacked with the others (the fusions' opt-outs keep the bits).
  int64_t n_plan = 0;
  int sm_count = 0;  // of the device the GEMM runs on (0: asked from the current device)
  // Split-K partials, k_splits * m * n floats (prefill_gemm_workspace_bytes); needed when the
  // plan splits K.
  float* workspace = nullptr;
  size_t workspace_bytes = 0;
};

// The workspace the automatic split-K choice may use at most (7B/14B layers at m = 512: one slice
// is m * n * 4 <= 14.7 MB, so >= 4 slices fit).
constexpr size_t kPrefillGemmWorkspaceBytes = size_t(64) << 20;

// Tokens from which a warp-specialized launch decodes its weights once into the weight image
// (PrefillGemm::weight_image): three 256-token m-tiles. The 7B's prompt steps of two m-tiles were
// 9 % slower with it, of three 2 % faster (docs/14 §27).
constexpr int64_t kPrefillGemmWeightImageMinTokens = 513;

// What launch_prefill_gemm(g) runs: the m-tile and the effective number of K slices (1: no
// split-K). Reads MINFER_NO_GEMM_SPLITK; g must pass launch_prefill_gemm's checks.
struct PrefillGemmPlan {
  int m_tile = 0;
  int n_tile = 128;
  int k_splits = 1;
  bool wgmma = false;
  bool warp_specialized = false;  // 256-token tiles: producer and consumer warpgroups
  bool tma = false;               // warp-specialized: activation tiles by the tensor memory accelerator
  int ctas = 0;                   // warp-specialized: the persistent grid
  bool weight_image = false;      // warp-specialized: the weights decoded once, before the GEMM
  int image_run_steps = 0;        // weight image: the K steps a block of its decoding pass
};
PrefillGemmPlan prefill_gemm_plan(const PrefillGemm& g);
// Workspace bytes launch_prefill_gemm(g) needs (0 without split-K).
size_t prefill_gemm_workspace_bytes(const PrefillGemm& g);
// Bytes of g's weight image (every weight tile of the launch decoded: its columns in tiles of 128
// weight rows, 64 SwiGLU outputs, by its K in 64-element steps, 16 KB each), whether or not the
// plan takes it.
size_t prefill_gemm_weight_image_bytes(const PrefillGemm& g);

// REQUIRES (checked, minfer::Error otherwise): prefill_gemm_supports(w_type); k % 256 == 0 for the
// K types and k % 64 == 0 otherwise; n % 2 == 0; ldx >= k, ldx % 8 == 0; ldy >= n, ldy % 2 == 0;
// x 16-byte and w 16-byte aligned (cudaMalloc gives 256); y, residual 8-byte aligned.
// A forced k_splits must fit its workspace (k_splits * m * n * 4 bytes after clamping).
// Precision: each product x_k * w_k carries one bf16 rounding of x and one of the exactly (f32)
// dequantized w, so |y - exact| <= 2^-8 * sum_k |x_k w_k| plus f32 accumulation error.
void launch_prefill_gemm(const PrefillGemm& g, cudaStream_t stream);

// ---- causal flash attention over the paged f16 KV cache ------------------------------------------
// Several sequences' prompt chunks in one launch. Chunk c holds step rows [row0, row0 + m) at
// positions [pos0, pos0 + m) of its sequence; query i attends to the sequence's positions
// [0, pos0 + i], whose K and V (this chunk's included) are already in the cache. Position p of a
// sequence lives in slot table[p / block_size] * block_size + p % block_size of the layer's cache:
// f16 rows of ld_kv elements, kv head g at columns [g * head_dim, (g + 1) * head_dim). Query head h
// uses kv head h / (n_head / n_kv_head). Keys are visited in 64-position tiles from position 0,
// so a query's result does not depend on how its prompt was cut into chunks.
struct PrefillChunk {
  int32_t row0, m, pos0, table_offset;  // table_offset: the chunk's block table in `tables`
};
struct PrefillTile {
  int32_t chunk, q0;  // 64 queries of a chunk, from query q0
};
// The 64-query tiles of the chunks, longest causal range first (those CTAs start first).
std::vector<PrefillTile> prefill_attention_tiles(std::span<const PrefillChunk> chunks);
// Up to three (tile, head within the KV group) items of one chunk that the warp-specialized kernel
// runs on one K/V stream, a consumer warpgroup each: indices into the tile list, item 0's causal
// range the longest; head -1: no item.
constexpr int kMaxHeadGroupItems = 3;
struct PrefillHeadGroup {
  int32_t tile[kMaxHeadGroupItems];
  int32_t head[kMaxHeadGroupItems];
};
// Every tile's `group` heads, `items` at a time within its chunk (heads fastest, the chunk's tiles
// in list order), longest causal range first.
std::vector<PrefillHeadGroup> prefill_attention_head_groups(std::span<const PrefillChunk> chunks,
                                                           std::span<const PrefillTile> tiles, int group, int items);
// Items a CTA (2 or 3) for these tiles: the fewer waves of one CTA an SM, weighed by the items a
// CTA (the 14B at 512 tokens: 160 CTAs of two are two waves on 132 SMs, 112 of three one).
int prefill_attention_head_group_items(std::span<const PrefillChunk> chunks, std::span<const PrefillTile> tiles,
                                       int n_kv_head, int group, int sm_count);

struct PrefillAttention {
  const float* q = nullptr;  // [rows][ldq]; head h at columns [h*head_dim, (h+1)*head_dim), roped
  int64_t ldq = 0;
  const uint16_t* k_cache = nullptr;  // f16 bits, one layer
  const uint16_t* v_cache = nullptr;
  int64_t ld_kv = 0;
  float* out = nullptr;         // [rows][ldo], same head layout as q
  uint16_t* out_bf16 = nullptr; // optional: the o-projection's bf16 activation plane, [rows][ldo]
  int64_t ldo = 0;
  const PrefillChunk* chunks = nullptr;  // device
  const PrefillTile* tiles = nullptr;    // device
  int n_tiles = 0;
  const int32_t* tables = nullptr;       // device, block tables concatenated
  int block_size = 0;                    // a power of two
  int n_head = 0;
  int n_kv_head = 0;
  int head_dim = 0;  // 64 or 128
  float scale = 0;   // softmax scale, usually 1/sqrt(head_dim)
  // Warpgroup MMA (sm_90): 0 chooses it on an sm_90 device unless MINFER_NO_WGMMA_ATTENTION is set
  // to anything but "0"; 1 forces it (an sm_90 device only), -1 forces the mma.sync kernel.
  int wgmma = 0;
  // With warpgroup MMA: two or three heads of a KV group a CTA on one K/V stream (a producer
  // warpgroup and a consumer an item). 0 chooses it unless MINFER_NO_WS_ATTENTION is set to
  // anything but "0"; 1 forces it, -1 the one-head kernel. The same bits either way. Needs
  // head_groups = prefill_attention_head_groups(chunks, tiles, head_groups_of, head_group_items).
  int warp_specialized = 0;
  const PrefillHeadGroup* head_groups = nullptr;  // device
  int n_head_groups = 0;
  int head_group_items = 0;
  int head_groups_of = 0;  // the KV group size they were built for
};
bool prefill_attention_uses_wgmma(const PrefillAttention& a);
bool prefill_attention_uses_warp_specialization(const PrefillAttention& a);

// REQUIRES (checked): head_dim 64 or 128; n_head % n_kv_head == 0; block_size a power of two;
// ldq, ld_kv, ldo multiples of 8 (16-byte rows) and >= n_head*head_dim (ld_kv >= n_kv*head_dim);
// pointers 16-byte aligned. Positions past a query tile's last query are never read.
// Precision: q is rounded to f16 (after scaling), the probabilities to f16, accumulation in f32.
void launch_prefill_attention(const PrefillAttention& a, cudaStream_t stream);

}  // namespace minfer::cuda
