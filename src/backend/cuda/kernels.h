// Host-callable launchers of the CUDA backend's kernels, and the device-side layout of weights.
// Plain C++ (no CUDA syntax), so the backend and the GPU tests can include it from .cpp files.
// Every launcher checks its launch and throws minfer::Error naming the kernel on failure.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "quant/types.h"

namespace minfer::cuda {

// A weight matrix on the device, rows x cols, in its GGUF block layout (the prefill GEMM reads
// the same bytes). q4_K/q5_K blocks are 16-byte multiples; q6_K (210 B) and the 32-blocks are only
// 2-byte aligned, so their kernels assemble words from aligned loads.
struct DevMat {
  GgmlType type = GgmlType::F32;
  int rows = 0, cols = 0;
  const uint8_t* data = nullptr;
};
bool cuda_supports_weight_type(GgmlType t);

constexpr int kPad40Bytes = 40;  // bytes per 32-element pad40 activation block
constexpr int64_t pad40_row_bytes(int64_t n) { return n / 32 * kPad40Bytes; }

// ---- elementwise / norm ------------------------------------------------------------------------
// rows of width `width` (x rows ld_x floats apart); group > 0 normalises each group separately.
// q8 != nullptr: also writes the pad40 plane of the first q8_rows output rows (the producer-fused
// A-quantize; needs group == 0 and width % 32 == 0).
void launch_rms_norm(const float* x, int ld_x, const float* w, float* out, int ld_out, int n_rows,
                     int width, int group, float eps, uint8_t* q8, int q8_rows, cudaStream_t s);
// out = silu(gate) * up over n_rows x width (row-contiguous); q8 as for rms_norm.
void launch_swiglu(const float* gate, const float* up, float* out, int n_rows, int width,
                   uint8_t* q8, int q8_rows, cudaStream_t s);
void launch_add(const float* a, const float* b, float* out, int64_t n, cudaStream_t s);
// The standalone quantize: n_rows rows of width floats (ld_x apart) to pad40 rows.
void launch_quantize_pad40(const float* x, int ld_x, uint8_t* q8, int n_rows, int width,
                           cudaStream_t s);
// out[t] = row tokens[t] of the embedding matrix, dequantized to f32.
void launch_embed(const DevMat& emb, const int32_t* tokens, float* out, int n_tokens,
                  cudaStream_t s);
// rows [row0, row0 + n_rows) of m as f32 (tests and embedding share this path).
void launch_dequantize_rows(const DevMat& m, int row0, int n_rows, float* out, cudaStream_t s);
// dst[i] = src[rows[i]] for i < n_rows (rows of width floats; ld floats apart in src and dst).
void launch_gather_rows(const float* src, int ld, const int32_t* rows, int n_rows, int width, float* dst,
                        cudaStream_t s);
// result[r] = index of the largest value of row r (first one on ties), rows `ld` floats apart.
void launch_argmax_rows(const float* x, int ld, int n_rows, int width, int32_t* result, cudaStream_t s);

// ---- rope / kv cache ---------------------------------------------------------------------------
struct RopeParams {
  const float* inv_freq = nullptr;  // [head_dim / 2]: theta_j = pos * inv_freq[j]
  int head_dim = 0;
  bool neox = false;  // pairs (j, j + hd/2) within a head, else (2j, 2j + 1)
};
// In place on n_tokens rows of n_heads * head_dim floats (ld apart); token t at positions[t].
void launch_rope(float* x, int ld, int n_tokens, int n_heads, const RopeParams& rp,
                 const int32_t* positions, cudaStream_t s);
// One layer of the paged KV cache: f16 rows of n_kv_heads * head_dim, one per slot; the slot of
// position p of a sequence is table[p / block_size] * block_size + p % block_size.
struct KvLayer {
  uint16_t* k = nullptr;
  uint16_t* v = nullptr;
  int n_kv_heads = 0, head_dim = 0;
};
// Writes n_tokens rows of k and v (n_kv_heads * head_dim floats each) to slots[t].
void launch_kv_append(const float* k, const float* v, int n_tokens, const KvLayer& kv,
                      const int32_t* slots, cudaStream_t s);

// ---- the decode matmul: y = W x for tokens whose activations are pad40 rows -----------------------
// What a segment's epilogue does with each row pair after bias and residual.
enum class Epilogue : int {
  Store,     // out[t][r] = v
  RopeQ,     // rope the pair, store to out
  RopeK,     // rope the pair, write f16 into the K cache (out unused)
  StoreV,    // write f16 into the V cache
};
// Weight matrices one decode-matmul launch takes (q/k/v; gate/up; one).
constexpr int kMaxMatSegs = 3;
struct MatSeg {
  DevMat w;
  const float* bias = nullptr;      // [rows]
  const float* residual = nullptr;  // [n_tokens][ld_out]: out = dot + bias + residual
  float* out = nullptr;             // [n_tokens][ld_out]
  int ld_out = 0;
  Epilogue epi = Epilogue::Store;
};
struct MatVecExtra {
  RopeParams rope;                   // RopeQ / RopeK (pairs follow rope.neox)
  const int32_t* positions = nullptr;  // [n_tokens]
  const int32_t* slots = nullptr;      // [n_tokens]: KV cache rows for RopeK / StoreV
  KvLayer kv;
};
// For the quantized types with a tensor-core kernel (q4_K, q5_K, q6_K, q8_0) every output element
// is summed in one fixed order that depends only on the weight type and K ("the canonical order",
// quant/canonical_dot.h, docs/10-batching.md): one float term per 256-column group (formed from
// exact integer sums, which needs the pad40 plane's one scale per group); groups g go to stream
// g % 8, each stream summed in order; a tree over the 8 streams; + bias; + residual. Both kernels
// below follow it, so for these types they give the same bits for any token count.
bool matmul_mma_supports(GgmlType t);
// Warp-per-row-pair kernel (dp4a): up to kMaxMatSegs weight matrices in one launch (q/k/v, gate/up),
// tokens in launches of 8. Activations: pad40 rows (act_q8_stride bytes apart) for quantized
// weights, f32 rows for float weights (their own fixed order).
void launch_matvec(const MatSeg* segs, int n_segs, const uint8_t* act_q8, int64_t act_q8_stride,
                   const float* act_f32, int act_f32_stride, int n_tokens,
                   const MatVecExtra& extra, cudaStream_t s);
// Tensor-core kernel (int8 mma): same segments and epilogues, every type matmul_mma_supports.
void launch_matmul_mma(const MatSeg* segs, int n_segs, const uint8_t* act_q8, int64_t act_q8_stride,
                       int n_tokens, const MatVecExtra& extra, cudaStream_t s);

// ---- decode attention over the paged cache ------------------------------------------------------
struct AttnParams {
  const float* q = nullptr;  // [n_tokens][n_head * head_dim]
  float* out = nullptr;      // [n_tokens][n_head * head_dim]
  KvLayer kv;
  int n_head = 0;
  int n_tokens = 0;
  const int32_t* positions = nullptr;     // token t attends to positions [0, positions[t]]
  const int32_t* tables = nullptr;        // block tables, concatenated
  const int32_t* table_offsets = nullptr; // [n_tokens]: token t's table starts at tables[offset]
  int block_size = 0;                     // a power of two
  // Split-K over the KV length: at most n_splits slices of >= 32 positions each. The slice
  // boundaries depend only on the length, so a token's bits do not depend on the batch.
  int n_splits = 1;
  float* part = nullptr;  // workspace: attention_workspace_floats(...)
};
int64_t attention_workspace_floats(int n_tokens, int n_head, int head_dim, int n_splits);
void launch_attention(const AttnParams& p, cudaStream_t s);

}  // namespace minfer::cuda
