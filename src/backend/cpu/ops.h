// The CPU reference ops, one function per graph op. Activations are row-major f32 matrices of
// n_tokens rows; weights are GGUF tensors in any type the quant module can read. These are the
// oracle the CUDA kernels are tested against, so they favour clarity (and f32 everywhere outside
// the weight formats) over speed tricks.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "model/model.h"
#include "quant/types.h"
#include "util/threadpool.h"

namespace minfer::cpu {

// out[t] = row tokens[t] of table (dequantized). Throws on a token id outside the table.
void embed(const Tensor& table, std::span<const int32_t> tokens, float* out);

// Per row (group == 0) or per group of `group` columns: out = x / sqrt(mean(x^2) + eps) * weight,
// where weight has `group` entries when grouped, else `cols`. out may alias x.
void rms_norm(const float* x, const float* weight, float* out, int64_t rows, int64_t cols,
              int group, float eps);

// out[t][r] = dot(weight row r, x[t]) + bias[r] for t < n_tokens. Quantized weights with a pad40
// kernel take activations quantized to pad40 once per call (into `scratch`); f32/f16/bf16 weights
// use float dots; other types are dequantized row by row. Parallel over weight rows.
void matmul(ThreadPool& pool, const Tensor& weight, const float* bias, const float* x,
            int64_t n_tokens, float* out, std::vector<BlockQ8Pad40>& scratch);
// Throws naming the tensor when matmul cannot read its type.
void check_matmul_weight(const Tensor& weight);

// cos/sin of every (token, frequency) pair of one batch, shared by all layers and heads:
// angle = positions[t] * freq_scale * base^(-2i/head_dim) / freq_factors[i].
struct RopeTable {
  int n_tokens = 0;
  int half = 0;  // head_dim / 2
  std::vector<float> cos, sin;  // [n_tokens][half]
};
RopeTable rope_table(std::span<const int32_t> positions, int head_dim, float base, float freq_scale,
                     const float* freq_factors /* nullable, [head_dim/2] */);
// In place on x ([n_tokens][n_heads * head_dim]). Normal rotates pairs (2i, 2i+1); NeoX rotates
// pairs (i, i + head_dim/2).
void rope(float* x, int n_heads, int head_dim, const RopeTable& table, RopeType type);

// One sequence's KV rows of one layer: position p lives in row
// blocks[p / block_size] * block_size + p % block_size of the k and v arrays (n_head_kv * head_dim
// floats a row). A contiguous cache is one block of n_ctx positions.
struct KvSeqView {
  float* k = nullptr;
  float* v = nullptr;
  int block_size = 0;
  std::span<const int32_t> blocks;
  int64_t row(int p) const { return int64_t(blocks[size_t(p / block_size)]) * block_size + p % block_size; }
};

// Causal attention with grouped KV heads for n_tokens consecutive tokens of one sequence at
// positions pos0 .. pos0 + n_tokens - 1. First writes their k and v rows into the cache (the caller
// guarantees the blocks exist), then token t attends over positions 0 .. pos0 + t.
void attention(ThreadPool& pool, const float* q, const float* k_new, const float* v_new,
               int n_tokens, int pos0, int n_head, int n_head_kv, int head_dim, const KvSeqView& cache,
               float* out);

void swiglu(const float* gate, const float* up, float* out, int64_t n);  // silu(gate) * up
void add(const float* a, const float* b, float* out, int64_t n);        // out may alias a

}  // namespace minfer::cpu
