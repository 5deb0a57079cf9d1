// Host-callable launchers of the CUDA backend's kernels, and the device-side layout of weights.
// Plain C++ (no CUDA syntax), so the backend and the GPU tests can include it from .cpp files.
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
// q8 != nullptr: also writes the pad40 plane of the output (decode A-quantize fused epilogue;
// needs group == 0 and width % 32 == 0).
void launch_rms_norm(const float* x, int ld_x, const float* w, float* out, int ld_out, int n_rows,
                     int width, int group, float eps, uint8_t* q8, cudaStream_t s);
// out = silu(gate) * up over n_rows x width (row-contiguous); q8 as for rms_norm.
void launch_swiglu(const float* gate, const float* up, float* out, int n_rows, int width,
                   uint8_t* q8, cudaStream_t s);
void launch_add(const float* a, const float* b, float* out, int64_t n, cudaStream_t s);
// The standalone quantize: n_rows rows of width floats (ld_x apart) to pad40 rows.
void launch_quantize_pad40(const float* x, int ld_x, uint8_t* q8, int n_rows, int width,
                           cudaStream_t s);
// out[t] = row tokens[t] of the embedding matrix, dequantized to f32.
void launch_embed(const DevMat& emb, const int32_t* tokens, float* out, int n_tokens,
                  cudaStream_t s);
// rows [row0, row0 + n_rows) of m as f32 (tests and embedding share this path).
void launch_dequantize_rows(const DevMat& m, int row0, int n_rows, float* out, cudaStream_t s);
// Index of the largest value (first one on ties) -> *result.
void launch_argmax(const float* x, int n, int32_t* result, cudaStream_t s);

// ---- rope / kv cache ---------------------------------------------------------------------------
struct RopeParams {
  const float* inv_freq = nullptr;  // [head_dim / 2]: theta_j = pos * inv_freq[j]
  int head_dim = 0;
  bool neox = false;  // pairs (j, j + hd/2) within a head, else (2j, 2j + 1)
};
// In place on n_tokens rows of n_heads * head_dim floats (ld apart); token t at *pos + t.
void launch_rope(float* x, int ld, int n_tokens, int n_heads, const RopeParams& rp,
                 const int* pos, cudaStream_t s);
struct KvLayer {
  uint16_t* k = nullptr;  // f16 [n_ctx][n_kv_heads * head_dim] (the prefill attention's layout)
  uint16_t* v = nullptr;
  int n_ctx = 0, n_kv_heads = 0, head_dim = 0;
};
// Appends n_tokens rows of k and v (n_kv_heads * head_dim floats each) at positions *pos + t.
void launch_kv_append(const float* k, const float* v, int n_tokens, const KvLayer& kv,
                      const int* pos, cudaStream_t s);

// ---- matrix-vector (decode MMVQ) ---------------------------------------------------------------
// What a segment's epilogue does with each row pair after bias and residual.
enum class Epilogue : int {
  Store,     // out[t][r] = v
  RopeQ,     // rope the pair, store to out
  RopeK,     // rope the pair, write f16 into the K cache (out unused)
  StoreV,    // write f16 into the V cache
};
struct MatSeg {
  DevMat w;
  const float* bias = nullptr;      // [rows]
  const float* residual = nullptr;  // [n_tokens][ld_out]: out = dot + bias + residual
  float* out = nullptr;             // [n_tokens][ld_out]
  int ld_out = 0;
  Epilogue epi = Epilogue::Store;
};
struct MatVecExtra {
  RopeParams rope;        // RopeQ / RopeK (pairs follow rope.neox)
  const int* pos = nullptr;
  KvLayer kv;             // RopeK / StoreV
};
// y = W x for up to 3 weight matrices in one launch (q/k/v, gate/up). Activations: the pad40
// plane (rows act_q8_stride bytes apart) for quantized weights, f32 rows for float weights.
void launch_matvec(const MatSeg* segs, int n_segs, const uint8_t* act_q8, int64_t act_q8_stride,
                   const float* act_f32, int act_f32_stride, int n_tokens,
                   const MatVecExtra& extra, cudaStream_t s);

// ---- attention ---------------------------------------------------------------------------------
struct AttnParams {
  const float* q = nullptr;  // [n_tokens][n_head * head_dim]
  float* out = nullptr;      // [n_tokens][n_head * head_dim]
  KvLayer kv;
  int n_head = 0;
  int n_tokens = 0;
  const int* pos = nullptr;  // token t attends to positions [0, *pos + t]
  int n_splits = 1;          // split-K over the KV length
  float* part = nullptr;     // workspace: attention_workspace_floats(...)
};
int64_t attention_workspace_floats(int n_tokens, int n_head, int head_dim, int n_splits);
void launch_attention(const AttnParams& p, cudaStream_t s);

}  // namespace minfer::cuda
