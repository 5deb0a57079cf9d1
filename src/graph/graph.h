// The forward pass as a flat list of named nodes over a few activation slots. Both backends
// execute this same list; the CUDA backend may fuse adjacent nodes (each fusion has an opt-out
// that restores the node-by-node path bit for bit).
#pragma once
#include <array>
#include <string>
#include <vector>

#include "model/model.h"

namespace minfer {

enum class Op {
  Embed,      // out[t] = token_embd row of token t (dequantized to f32)
  RmsNorm,    // out = in0 * rsqrt(mean(in0^2) + eps) * weight; per row, or per head when
              // group > 0 (qwen3 q/k norm: group = head_dim)
  MatMul,     // out = in0 @ weight^T (+ bias)
  Rope,       // in place on in0 (== out): rotate each head's pairs by position
  Attention,  // out = causal softmax(q k^T / sqrt(hd)) v over the KV cache; first appends this
              // batch's k (in1) and v (in2) to the layer's cache at the batch positions
  SwiGLU,     // out = silu(in0) * in1
  Add,        // out = in0 + in1 (out may alias in0: the residual stream)
  Output,     // logits: out = in0 rows selected for output @ weight^T
};
const char* op_name(Op op);

// Activation slots: every node reads and writes rows of n_tokens x width f32.
enum Slot : int { kX, kH, kQ, kK, kV, kAttn, kO, kGate, kUp, kFfn, kDown, kLogits, kNumSlots };

struct Node {
  Op op;
  std::string name;  // GGUF-style: "blk.3.attn_q", "output_norm", ...
  int layer = -1;
  int out = -1;
  std::array<int, 3> in = {-1, -1, -1};
  const Tensor* weight = nullptr;
  const Tensor* bias = nullptr;
  int group = 0;      // RmsNorm: normalise groups of this many (0: the whole row)
  int n_heads = 0;    // Rope / Attention: heads of in0 (q); Attention: kv heads from hp
};

struct Graph {
  std::vector<Node> nodes;
  std::array<int64_t, kNumSlots> slot_width{};  // columns of each slot
};

Graph build_graph(const Model& model);

}  // namespace minfer
