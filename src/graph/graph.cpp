#include "graph/graph.h"

namespace minfer {

const char* op_name(Op op) {
  switch (op) {
    case Op::Embed: return "embed";
    case Op::RmsNorm: return "rms_norm";
    case Op::MatMul: return "matmul";
    case Op::Rope: return "rope";
    case Op::Attention: return "attention";
    case Op::SwiGLU: return "swiglu";
    case Op::Add: return "add";
    case Op::Output: return "output";
  }
  return "unknown";
}

Graph build_graph(const Model& model) {
  const HParams& hp = model.hp;
  Graph g;
  const int64_t q_width = int64_t(hp.n_head) * hp.head_dim;
  const int64_t kv_width = int64_t(hp.n_head_kv) * hp.head_dim;
  g.slot_width = {};
  g.slot_width[kX] = g.slot_width[kH] = g.slot_width[kO] = g.slot_width[kDown] = hp.n_embd;
  g.slot_width[kQ] = g.slot_width[kAttn] = q_width;
  g.slot_width[kK] = g.slot_width[kV] = kv_width;
  g.slot_width[kGate] = g.slot_width[kUp] = g.slot_width[kFfn] = hp.n_ff;
  g.slot_width[kLogits] = hp.n_vocab;

  auto add = [&](Op op, std::string name, int layer, int out, std::array<int, 3> in,
                 const Tensor* weight = nullptr, const Tensor* bias = nullptr) -> Node& {
    Node n{op, std::move(name), layer, out, in, weight, bias};
    g.nodes.push_back(std::move(n));
    return g.nodes.back();
  };

  add(Op::Embed, "token_embd", -1, kX, {-1, -1, -1}, model.token_embd);
  for (int il = 0; il < hp.n_layer; ++il) {
    const LayerWeights& l = model.layers[size_t(il)];
    const std::string p = "blk." + std::to_string(il) + ".";
    add(Op::RmsNorm, p + "attn_norm", il, kH, {kX, -1, -1}, l.attn_norm);
    add(Op::MatMul, p + "attn_q", il, kQ, {kH, -1, -1}, l.wq, l.bq);
    add(Op::MatMul, p + "attn_k", il, kK, {kH, -1, -1}, l.wk, l.bk);
    add(Op::MatMul, p + "attn_v", il, kV, {kH, -1, -1}, l.wv, l.bv);
    if (l.q_norm) add(Op::RmsNorm, p + "attn_q_norm", il, kQ, {kQ, -1, -1}, l.q_norm).group = hp.head_dim;
    if (l.k_norm) add(Op::RmsNorm, p + "attn_k_norm", il, kK, {kK, -1, -1}, l.k_norm).group = hp.head_dim;
    add(Op::Rope, p + "rope_q", il, kQ, {kQ, -1, -1}).n_heads = hp.n_head;
    add(Op::Rope, p + "rope_k", il, kK, {kK, -1, -1}).n_heads = hp.n_head_kv;
    add(Op::Attention, p + "attn", il, kAttn, {kQ, kK, kV}).n_heads = hp.n_head;
    add(Op::MatMul, p + "attn_out", il, kO, {kAttn, -1, -1}, l.wo);
    add(Op::Add, p + "attn_residual", il, kX, {kX, kO, -1});
    add(Op::RmsNorm, p + "ffn_norm", il, kH, {kX, -1, -1}, l.ffn_norm);
    add(Op::MatMul, p + "ffn_gate", il, kGate, {kH, -1, -1}, l.w_gate);
    add(Op::MatMul, p + "ffn_up", il, kUp, {kH, -1, -1}, l.w_up);
    add(Op::SwiGLU, p + "ffn_swiglu", il, kFfn, {kGate, kUp, -1});
    add(Op::MatMul, p + "ffn_down", il, kDown, {kFfn, -1, -1}, l.w_down);
    add(Op::Add, p + "ffn_residual", il, kX, {kX, kDown, -1});
  }
  add(Op::RmsNorm, "output_norm", -1, kH, {kX, -1, -1}, model.output_norm);
  add(Op::Output, "output", -1, kLogits, {kH, -1, -1}, model.output);
  return g;
}

}  // namespace minfer
