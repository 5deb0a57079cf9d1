#include "backend/plan.h"

#include <optional>

#include "util/env.h"

namespace minfer {
namespace {

class Lowering {
 public:
  Lowering(const Graph& g, const Fusions& f, StepShape s) : g_(g), f_(f), s_(s) {}

  std::vector<Launch> run() {
    for (size_t i = 0; i < g_.nodes.size();) i += lower_at(i);
    return std::move(out_);
  }

 private:
  const Node& node(size_t i) const { return g_.nodes[i]; }
  int64_t width(int slot) const { return slot == kOutputRowsSlot ? g_.slot_width[kH] : g_.slot_width[size_t(slot)]; }
  bool is(size_t i, Op op) const { return i < g_.nodes.size() && node(i).op == op; }

  // Is `slot` read by a node from `from` on before a node overwrites it? (Rope rewrites in place.)
  bool read_before_written(size_t from, int slot) const {
    for (size_t j = from; j < g_.nodes.size(); ++j) {
      const Node& n = node(j);
      if (n.in[0] == slot || n.in[1] == slot || n.in[2] == slot) return true;
      if (n.out == slot && n.op != Op::Rope) return false;
    }
    return false;
  }
  // The producer-fused A-quantize (MmqCache rule): the next node reading `slot` is a matmul.
  bool feeds_decode_matmul(size_t from, int slot) const {
    for (size_t j = from; j < g_.nodes.size(); ++j) {
      const Node& n = node(j);
      if (n.in[0] == slot || n.in[1] == slot || n.in[2] == slot) return n.op == Op::MatMul || n.op == Op::Output;
    }
    return false;
  }
  // The producer-written bf16 plane: prompt rows, and the next node reading `slot` is a weight
  // matmul (the head reads the gathered output rows, never this plane).
  bool feeds_prompt_gemm(size_t from, int slot) const {
    if (!f_.prompt_a_fuse || !s_.prompt || width(slot) % 8 != 0) return false;
    for (size_t j = from; j < g_.nodes.size(); ++j) {
      const Node& n = node(j);
      if (n.in[0] == slot || n.in[1] == slot || n.in[2] == slot) return n.op == Op::MatMul;
    }
    return false;
  }

  // Which slot's rows the q8 and the bf16 planes hold. Matmuls read the planes and keep them; a
  // Quantize or ConvertBf16 writes only its own plane. The q8 plane follows the MmqCache rule: any
  // other launch drops it unless it writes it; so does a prompt matmul over a slot of another
  // width (the backend's matvec for weight types without a GEMM quantizes its prompt rows into
  // the shared q8 buffer, whose carve depends on the width, so other widths' decode rows are
  // overwritten). A bf16 plane holds prompt rows: it is dropped by a launch that writes those rows
  // of the slot it mirrors (only its writers and ConvertBf16 touch the planes themselves), not by
  // one over decode rows only, such as the decode rows' swiglu after the SwiGLU GEMM.
  void emit(Launch l) {
    const bool matmul = l.kind == LaunchKind::DecodeMatmul || l.kind == LaunchKind::PromptMatmul;
    if (!matmul && l.kind != LaunchKind::ConvertBf16) q8_slot_ = -1;
    if (l.kind == LaunchKind::PromptMatmul && q8_slot_ >= 0 && width(q8_slot_) != width(l.in)) q8_slot_ = -1;
    if (l.out >= 0 && l.out == bf16_slot_ && l.rows != Rows::Decode) bf16_slot_ = -1;
    if (l.writes_q8 || l.kind == LaunchKind::Quantize) q8_slot_ = l.kind == LaunchKind::Quantize ? l.in : l.out;
    if (l.writes_bf16 || l.kind == LaunchKind::ConvertBf16) {
      bf16_slot_ = l.kind == LaunchKind::ConvertBf16 ? l.in : l.out;
      bf16_plane_ = l.bf16_out;
    }
    out_.push_back(std::move(l));
  }
  // A matmul node's role in its layer, its name past "blk.N." ("attn_out", "ffn_down"): the label of
  // its launch when it launches alone, so that a census or timeline tells o from down.
  std::string role(size_t i) const {
    const std::string& name = node(i).name;
    return name.substr(name.rfind('.') + 1);
  }
  // A decode matmul over `rows` of slot `in`: quantized first unless its producer wrote the plane.
  void decode_matmul(Launch l) {
    if (q8_slot_ != l.in) {
      Launch q{LaunchKind::Quantize, "quantize_q8", l.rows, l.in};
      q.node = l.node;
      emit(std::move(q));
    }
    emit(std::move(l));
  }
  Launch matmul_launch(LaunchKind kind, std::string name, Rows rows, std::initializer_list<size_t> nodes) const {
    Launch l{kind, std::move(name), rows};
    l.in = node(*nodes.begin()).in[0];
    l.node = int(*nodes.begin());
    for (size_t n : nodes) {
      l.seg_node[size_t(l.n_segs)] = int(n);
      l.epi[size_t(l.n_segs)] = SegmentEpilogue::Store;
      ++l.n_segs;
    }
    l.out = node(*nodes.begin()).out;
    return l;
  }
  // A prompt GEMM over slot `in`'s prompt rows: converted to bf16 first unless its producer (or
  // the conversion for an earlier GEMM of the same input) wrote the plane.
  void prompt_matmul(Launch l) {
    if (bf16_slot_ != l.in) {
      Launch c{LaunchKind::ConvertBf16, "activation_bf16", Rows::Prompt, l.in};
      c.node = l.node;
      emit(std::move(c));
    }
    l.bf16_in = uint8_t(bf16_plane_);
    if (l.writes_bf16) l.bf16_out = uint8_t(1 - bf16_plane_);  // the SwiGLU GEMM: not the plane it reads
    emit(std::move(l));
  }
  void prompt_matmuls(std::initializer_list<size_t> nodes) {
    if (!s_.prompt) return;
    for (size_t n : nodes) prompt_matmul(matmul_launch(LaunchKind::PromptMatmul, "gemm_" + role(n), Rows::Prompt, {n}));
  }

  size_t lower_at(size_t i) {
    const Node& n = node(i);
    switch (n.op) {
      case Op::Embed:
        emit({LaunchKind::Embed, "embed", Rows::All, -1, -1, n.out, int(i), int(i)});
        return 1;
      case Op::RmsNorm: {
        const bool to_head = is(i + 1, Op::Output) && node(i + 1).in[0] == n.out;
        // The head of a decode-only step whose rows are all output reads this plane directly;
        // every other decode matmul reads the decode rows.
        const bool q8 = f_.decode_a_fuse && s_.decode && n.group == 0 && width(n.out) % 32 == 0 &&
                        (to_head ? s_.output_is_all_rows : feeds_decode_matmul(i + 1, n.out));
        Launch l{LaunchKind::RmsNorm, q8 ? "rms_norm_quant_q8" : "rms_norm", Rows::All, n.in[0], -1, n.out,
                 int(i), int(i)};
        l.writes_q8 = q8;
        l.writes_bf16 = n.group == 0 && feeds_prompt_gemm(i + 1, n.out);
        emit(std::move(l));
        return 1;
      }
      case Op::MatMul:
        if (size_t used = qkv(i)) return used;
        if (size_t used = gate_up(i)) return used;
        return single_matmul(i);
      case Op::Rope:
        if (const std::optional<Rows> rows = rows_not_roped())
          emit({LaunchKind::Rope, "rope", *rows, -1, -1, n.out, int(i), int(i)});
        return 1;
      case Op::Attention: {
        if (const std::optional<Rows> rows = rows_not_roped())
          emit({LaunchKind::KvAppend, "kv_append", *rows, n.in[1], n.in[2], -1, int(i)});
        roped_decode_ = roped_prompt_ = false;
        if (s_.decode) {
          Launch l{LaunchKind::DecodeAttention, "attention_split_combine", Rows::Decode, n.in[0], -1, n.out, int(i),
                   s_.prompt ? -1 : int(i)};
          // The combine writes the o-projection's q8 plane where its blocks cover whole 256-column
          // groups of heads; not in a mixed step, whose prompt attention (next) drops the plane.
          const int64_t w = width(n.out), head_dim = n.n_heads > 0 ? w / n.n_heads : 0;
          l.writes_q8 = f_.decode_a_fuse && f_.attention_q8 && !s_.prompt && head_dim > 0 && 256 % head_dim == 0 &&
                        w % 256 == 0 && feeds_decode_matmul(i + 1, n.out);
          if (l.writes_q8) l.name = "attention_split_combine_quant_q8";
          emit(std::move(l));
        }
        if (s_.prompt) {
          Launch l{LaunchKind::PromptAttention, "prefill_attention", Rows::Prompt, n.in[0], -1, n.out, int(i), int(i)};
          // Only the prompt rows get the plane; in a mixed step the decode rows' output comes
          // from the split kernel, but the GEMM reads prompt rows only.
          l.writes_bf16 = feeds_prompt_gemm(i + 1, n.out);
          emit(std::move(l));
        }
        return 1;
      }
      case Op::SwiGLU:
        swiglu(i, Rows::All);
        return 1;
      case Op::Add:
        emit({LaunchKind::Add, "add", Rows::All, n.in[0], n.in[1], n.out, int(i), int(i)});
        return 1;
      case Op::Output: {
        int in = n.in[0];
        Rows rows = Rows::Decode;  // all rows of a decode-only step
        if (!s_.output_is_all_rows) {
          emit({LaunchKind::GatherOutputRows, "gather_output_rows", Rows::Output, in, -1, kOutputRowsSlot, int(i)});
          in = kOutputRowsSlot;
          rows = Rows::Output;
        }
        Launch l = matmul_launch(LaunchKind::DecodeMatmul, "matvec_output", rows, {i});
        l.in = in;
        decode_matmul(std::move(l));
        emit({LaunchKind::Argmax, "argmax", rows, n.out, -1, -1, int(i), int(i)});
        return 1;
      }
    }
    return 1;
  }

  // q, k, v of one input in one decode launch; with rope and the KV write in its epilogue when
  // rope_q, rope_k and attention follow directly (qwen3's q/k norms come between: Store only).
  // Prompt rows: one launch of the three (the backend stacks those of one type in one GEMM).
  size_t qkv(size_t i) {
    if (!f_.fused_qkv || !is(i + 1, Op::MatMul) || !is(i + 2, Op::MatMul)) return 0;
    const Node &q = node(i), &k = node(i + 1), &v = node(i + 2);
    if (k.in[0] != q.in[0] || v.in[0] != q.in[0]) return 0;
    const bool roped = is(i + 3, Op::Rope) && is(i + 4, Op::Rope) && is(i + 5, Op::Attention) &&
                       node(i + 3).out == q.out && node(i + 4).out == k.out && node(i + 5).in[0] == q.out &&
                       node(i + 5).in[1] == k.out && node(i + 5).in[2] == v.out;
    if (s_.decode) {
      Launch l = matmul_launch(LaunchKind::DecodeMatmul, roped ? "matvec_qkv_rope_kv" : "matvec_qkv", Rows::Decode,
                               {i, i + 1, i + 2});
      if (roped) {
        l.epi = {SegmentEpilogue::RopeQ, SegmentEpilogue::RopeK, SegmentEpilogue::StoreV};
        l.node = int(i + 5);  // the attention node: its layer's cache
        roped_decode_ = true;
      }
      decode_matmul(std::move(l));
    }
    if (s_.prompt) {
      prompt_matmul(matmul_launch(LaunchKind::PromptMatmul, "gemm_qkv", Rows::Prompt, {i, i + 1, i + 2}));
      if (roped && f_.fused_rope_kv) {
        emit({LaunchKind::RopeKv, "rope_kv", Rows::Prompt, k.out, v.out, q.out, int(i + 5)});
        roped_prompt_ = true;
      }
    }
    return 3;
  }

  // The rows whose q/k rope and KV write no fused launch has done (the layer's Rope and Attention
  // nodes do them), or none.
  std::optional<Rows> rows_not_roped() const {
    const bool decode = s_.decode && !roped_decode_, prompt = s_.prompt && !roped_prompt_;
    if (decode && prompt) return Rows::All;
    if (decode) return roped_prompt_ ? Rows::Decode : Rows::All;
    if (prompt) return roped_decode_ ? Rows::Prompt : Rows::All;
    return std::nullopt;
  }

  // gate and up in one decode launch, then the SwiGLU node. Prompt rows: gate, up and the SwiGLU
  // in one GEMM, then the decode rows' swiglu (after the GEMM, so the q8 plane it writes for the
  // down matmul survives the GEMM's fallback for weight types without one).
  size_t gate_up(size_t i) {
    if (!f_.fused_ffn || !is(i + 1, Op::MatMul) || !is(i + 2, Op::SwiGLU)) return 0;
    const Node &gate = node(i), &up = node(i + 1), &sw = node(i + 2);
    if (up.in[0] != gate.in[0] || sw.in[0] != gate.out || sw.in[1] != up.out || gate.bias || up.bias) return 0;
    if (s_.decode && !s_.prompt && f_.swiglu_in_matmul) {  // a decode-only step: the swiglu in the epilogue
      Launch l = matmul_launch(LaunchKind::DecodeMatmul, "matvec_gate_up_swiglu", Rows::Decode, {i, i + 1});
      l.swiglu = true;
      l.out = sw.out;
      l.completes_node = int(i + 2);
      l.writes_q8 = swiglu_writes_q8(i + 2);
      decode_matmul(std::move(l));
      return 3;
    }
    if (s_.decode) decode_matmul(matmul_launch(LaunchKind::DecodeMatmul, "matvec_gate_up", Rows::Decode, {i, i + 1}));
    if (!f_.gemm_swiglu || !s_.prompt) {
      prompt_matmuls({i, i + 1});
      swiglu(i + 2, Rows::All);
      return 3;
    }
    Launch l = matmul_launch(LaunchKind::PromptMatmul, "gemm_swiglu", Rows::Prompt, {i, i + 1});
    l.swiglu = true;
    l.out = sw.out;
    l.completes_node = s_.decode ? -1 : int(i + 2);
    l.writes_bf16 = feeds_prompt_gemm(i + 3, sw.out);
    prompt_matmul(std::move(l));
    if (s_.decode) swiglu(i + 2, Rows::Decode);
    return 3;
  }

  // Whether the swiglu node i writes the q8 plane of its decode rows (its consumer a decode matmul).
  bool swiglu_writes_q8(size_t i) const {
    const Node& n = node(i);
    return f_.decode_a_fuse && s_.decode && width(n.out) % 32 == 0 && feeds_decode_matmul(i + 1, n.out);
  }
  void swiglu(size_t i, Rows rows) {
    const Node& n = node(i);
    const bool q8 = swiglu_writes_q8(i);
    // completes the node: all rows, or the decode rows after the SwiGLU GEMM wrote the prompt rows
    Launch l{LaunchKind::SwiGLU, q8 ? "swiglu_quant_q8" : "swiglu", rows, n.in[0], n.in[1], n.out, int(i), int(i)};
    l.writes_q8 = q8;
    l.writes_bf16 = rows == Rows::All && feeds_prompt_gemm(i + 1, n.out);
    emit(std::move(l));
  }

  // One matmul; with the following residual Add folded into its epilogue when allowed.
  size_t single_matmul(size_t i) {
    const Node& n = node(i);
    int residual = -1, out = n.out;
    size_t used = 1;
    if (f_.fused_residual && is(i + 1, Op::Add)) {
      const Node& add = node(i + 1);
      const int other = add.in[0] == n.out ? add.in[1] : (add.in[1] == n.out ? add.in[0] : -1);
      if (other >= 0 && other != n.out && width(other) == width(n.out) && !read_before_written(i + 2, n.out)) {
        residual = other;
        out = add.out;
        used = 2;
      }
    }
    const int completes = int(i + used - 1);
    if (s_.decode) {
      Launch l = matmul_launch(LaunchKind::DecodeMatmul, "matvec_" + role(i), Rows::Decode, {i});
      l.residual = residual;
      l.out = out;
      l.completes_node = s_.prompt ? -1 : completes;
      decode_matmul(std::move(l));
    }
    if (s_.prompt) {
      Launch l = matmul_launch(LaunchKind::PromptMatmul, "gemm_" + role(i), Rows::Prompt, {i});
      l.residual = residual;
      l.out = out;
      l.completes_node = completes;
      prompt_matmul(std::move(l));
    }
    return used;
  }

  const Graph& g_;
  const Fusions& f_;
  StepShape s_;
  std::vector<Launch> out_;
  int q8_slot_ = -1;                  // the slot whose decode (or output) rows the q8 plane holds
  int bf16_slot_ = -1;                // the slot whose rows a bf16 plane (prompt GEMM input) holds
  int bf16_plane_ = 0;                // ... and which of the two
  bool roped_decode_ = false;  // the fused qkv epilogue roped and cached the decode rows
  bool roped_prompt_ = false;  // a rope_kv launch roped and cached the prompt rows
};

}  // namespace

Fusions Fusions::from_env() {
  Fusions f;
  f.decode_a_fuse = !env_flag("MINFER_NO_DECODE_A_FUSE");
  f.attention_q8 = !env_flag("MINFER_NO_ATTENTION_Q8");
  f.prompt_a_fuse = !env_flag("MINFER_NO_PROMPT_A_FUSE");
  f.cuda_graph = !env_flag("MINFER_NO_CUDA_GRAPH");
  f.fused_qkv = !env_flag("MINFER_NO_FUSED_QKV");
  f.fused_ffn = !env_flag("MINFER_NO_FUSED_FFN");
  f.swiglu_in_matmul = !env_flag("MINFER_NO_SWIGLU_IN_MATMUL");
  f.gemm_swiglu = !env_flag("MINFER_NO_GEMM_SWIGLU");
  f.fused_rope_kv = !env_flag("MINFER_NO_FUSED_ROPE_KV");
  f.concurrent_gemms = !env_flag("MINFER_NO_CONCURRENT_GEMMS");
  f.decode_beside_prompt = !env_flag("MINFER_NO_DECODE_BESIDE_PROMPT");
  f.fused_residual = !env_flag("MINFER_NO_FUSED_RESIDUAL");
  f.pdl = !env_flag("MINFER_NO_PDL");
  f.early_dependents = !env_flag("MINFER_NO_EARLY_DEPENDENTS");
  f.operand_image = !env_flag("MINFER_NO_OPERAND_IMAGE_FUSE");
  f.batch_invariant = !env_flag("MINFER_NONDETERMINISTIC");
  return f;
}

Fusions Fusions::none() {
  Fusions f;
  f.decode_a_fuse = f.attention_q8 = f.prompt_a_fuse = f.cuda_graph = f.fused_qkv = f.fused_ffn = f.swiglu_in_matmul =
      f.gemm_swiglu = f.fused_rope_kv = f.concurrent_gemms = f.decode_beside_prompt = f.fused_residual = f.pdl =
          f.early_dependents = f.operand_image = false;
  return f;
}

std::vector<Launch> lower(const Graph& graph, const Fusions& fusions, StepShape shape) {
  return Lowering(graph, fusions, shape).run();
}

int64_t launch_weight_bytes(const Launch& l, const Graph& graph) {
  if (l.kind != LaunchKind::DecodeMatmul && l.kind != LaunchKind::PromptMatmul) return 0;
  int64_t bytes = 0;
  for (int s = 0; s < l.n_segs; ++s) bytes += int64_t(graph.nodes[size_t(l.seg_node[size_t(s)])].weight->nbytes);
  return bytes;
}

}  // namespace minfer
