// The lowering pass on the graphs of every architecture: which launches a step gets, which fusion
// rules apply, that every opt-out removes its rule, and that every graph node is computed exactly
// once. (That the launches compute the same bits fused and unfused is the GPU tests' job.)
#include <gtest/gtest.h>

#include <map>

#include "backend/plan.h"
#include "convert/synth.h"
#include "support.h"

namespace minfer {
namespace {

const Model& model(const std::string& preset) {
  static std::map<std::string, std::unique_ptr<Model>> cache;
  auto& m = cache[preset];
  if (!m) {
    synth::Options o;
    o.preset = preset;
    o.ftype = synth::FileType::Q4_K_M;
    o.tokenizer = "builtin";
    o.out_path = (test::temp_dir("plan") / (preset + ".gguf")).string();
    synth::write_model(o);
    m = std::make_unique<Model>(Model::load(o.out_path));
  }
  return *m;
}

std::map<std::string, int> count(const std::vector<Launch>& launches) {
  std::map<std::string, int> n;
  for (const Launch& l : launches) ++n[l.name];
  return n;
}

constexpr StepShape kDecode{true, false, true};
constexpr StepShape kPrompt{false, true, false};
constexpr StepShape kMixed{true, true, false};

TEST(Plan, DecodeStepFusesQkvRopeKvGateUpResidualAndQuantize) {
  const Model& m = model("tiny");
  const int L = m.hp.n_layer;
  const auto n = count(lower(build_graph(m), Fusions{}, kDecode));
  EXPECT_EQ(n.at("matvec_qkv_rope_kv"), L);
  EXPECT_EQ(n.at("matvec_gate_up_swiglu"), L);  // the swiglu and its q8 plane in the epilogue
  EXPECT_EQ(n.count("matvec_gate_up"), 0u);
  EXPECT_EQ(n.count("swiglu_quant_q8"), 0u);
  EXPECT_EQ(n.at("matvec_attn_out"), L);  // each with its residual add, labelled by its weight's role
  EXPECT_EQ(n.at("matvec_ffn_down"), L);
  EXPECT_EQ(n.count("matvec"), 0u);
  EXPECT_EQ(n.at("rms_norm_quant_q8"), 2 * L + 1);
  EXPECT_EQ(n.count("quantize_q8"), 0u);  // attn_out's plane: the attention combine writes it
  EXPECT_EQ(n.at("attention_split_combine_quant_q8"), L);
  EXPECT_EQ(n.count("rope"), 0u);
  EXPECT_EQ(n.count("kv_append"), 0u);
  EXPECT_EQ(n.count("add"), 0u);
  EXPECT_EQ(n.count("gather_output_rows"), 0u);
  EXPECT_EQ(n.at("matvec_output"), 1);
  EXPECT_EQ(n.at("argmax"), 1);
}

TEST(Plan, Qwen3KeepsItsFusedQkvAroundTheHeadNorms) {
  const Model& m = model("tiny-qwen3");
  const int L = m.hp.n_layer;
  const auto n = count(lower(build_graph(m), Fusions{}, kDecode));
  EXPECT_EQ(n.at("matvec_qkv"), L);  // the q/k norms sit between the matmuls and rope
  EXPECT_EQ(n.count("matvec_qkv_rope_kv"), 0u);
  EXPECT_EQ(n.at("rope"), 2 * L);
  EXPECT_EQ(n.at("kv_append"), L);
  EXPECT_EQ(n.at("rms_norm"), 2 * L);  // q_norm and k_norm
}

TEST(Plan, PromptAndMixedSteps) {
  const Model& m = model("tiny-llama3");
  const int L = m.hp.n_layer;
  const auto prompt = count(lower(build_graph(m), Fusions{}, kPrompt));
  EXPECT_EQ(prompt.at("gemm_attn_out"), L);
  EXPECT_EQ(prompt.at("gemm_ffn_down"), L);
  EXPECT_EQ(prompt.at("gemm_qkv"), L);      // q, k and v (stacked by the backend where it can)
  EXPECT_EQ(prompt.at("gemm_swiglu"), L);  // gate, up and the swiglu in one
  EXPECT_EQ(prompt.count("swiglu"), 0u);
  EXPECT_EQ(prompt.at("prefill_attention"), L);
  EXPECT_EQ(prompt.at("rope_kv"), L);  // q and k roped, k and v cached: one launch
  EXPECT_EQ(prompt.count("rope") + prompt.count("kv_append"), 0u);
  EXPECT_EQ(prompt.count("attention_split_combine"), 0u);
  EXPECT_EQ(prompt.at("gather_output_rows"), 1);
  EXPECT_EQ(prompt.count("rms_norm_quant_q8"), 0u);  // no decode rows: no plane to write
  EXPECT_EQ(prompt.at("quantize_q8"), 1);           // the head's gathered rows
  // The bf16 plane of every prompt GEMM input comes from its producer: the attention rms_norm (q,
  // k, v), prompt attention (o), the ffn rms_norm (gate, up), swiglu (down).
  EXPECT_EQ(prompt.count("activation_bf16"), 0u);
  int bf16_writers = 0;
  for (const Launch& l : lower(build_graph(m), Fusions{}, kPrompt)) bf16_writers += l.writes_bf16;
  EXPECT_EQ(bf16_writers, 4 * L);
  const auto mixed = count(lower(build_graph(m), Fusions{}, kMixed));
  EXPECT_EQ(mixed.at("matvec_qkv_rope_kv"), L);  // decode rows: fused, roped, cached
  EXPECT_EQ(mixed.at("gemm_attn_out"), L);       // prompt rows: the GEMM
  EXPECT_EQ(mixed.at("gemm_ffn_down"), L);
  EXPECT_EQ(mixed.at("gemm_qkv"), L);
  EXPECT_EQ(mixed.at("gemm_swiglu"), L);
  EXPECT_EQ(mixed.at("swiglu_quant_q8"), L);     // the decode rows' swiglu (and their q8 plane)
  EXPECT_EQ(mixed.at("rope_kv"), L);             // prompt rows: roped and cached in one launch
  EXPECT_EQ(mixed.count("rope") + mixed.count("kv_append"), 0u);
  EXPECT_EQ(mixed.at("attention_split_combine"), L);  // the prompt attention after it would drop a plane,
  EXPECT_EQ(mixed.at("quantize_q8"), L + 1);          // so attn_out quantizes; and the head's gathered rows
  EXPECT_EQ(mixed.at("prefill_attention"), L);
  EXPECT_EQ(mixed.count("activation_bf16"), 0u);  // the decode rows' q8 launches keep the plane
  // The decode rows' swiglu runs after the SwiGLU GEMM (whose matvec fallback for weight types
  // without a GEMM would overwrite the q8 plane) and feeds the down matmul without a quantize.
  const std::vector<Launch> steps = lower(build_graph(m), Fusions{}, kMixed);
  for (size_t i = 0; i < steps.size(); ++i)
    if (steps[i].name == std::string("swiglu_quant_q8")) {
      ASSERT_TRUE(i > 0 && i + 1 < steps.size());
      EXPECT_EQ(steps[i].rows, Rows::Decode);
      EXPECT_EQ(steps[i - 1].name, std::string("gemm_swiglu"));
      EXPECT_EQ(steps[i + 1].name, std::string("matvec_ffn_down"));
    }
  for (const Launch& l : lower(build_graph(m), Fusions{}, kDecode)) EXPECT_FALSE(l.writes_bf16) << l.name;
}

// A decode step and a prompt step each stream every weight matrix once: their matmul launches'
// weight bytes add up to the file's matrices (every 2-D tensor but the token embedding, which the
// head reads only when tied), fused or not.
TEST(Plan, MatmulLaunchesStreamEveryWeightMatrixOnce) {
  for (const char* preset : {"tiny", "tiny-qwen3", "tiny-llama3"}) {
    const Model& m = model(preset);
    int64_t matrices = 0;
    for (const Tensor& t : m.file.tensors())
      if (t.shape.size() >= 2 && (&t != m.token_embd || m.hp.tied_embeddings)) matrices += int64_t(t.nbytes);
    const Graph g = build_graph(m);
    for (const Fusions& f : {Fusions{}, Fusions::none()})
      for (const StepShape shape : {kDecode, kPrompt}) {
        int64_t streamed = 0;
        for (const Launch& l : lower(g, f, shape)) streamed += launch_weight_bytes(l, g);
        EXPECT_EQ(streamed, matrices) << preset << (shape.decode ? " decode" : " prompt");
      }
  }
}

// Each opt-out removes exactly its rule; with all of them off every node is its own launch.
TEST(Plan, EveryOptOutRemovesItsRule) {
  const Model& m = model("tiny");
  const Graph g = build_graph(m);
  auto with = [](auto change) {
    Fusions f;
    change(f);
    return f;
  };
  auto n = count(lower(g, with([](Fusions& f) { f.fused_qkv = false; }), kDecode));
  EXPECT_EQ(n.count("matvec_qkv_rope_kv"), 0u);
  EXPECT_EQ(n.at("rope"), 2 * m.hp.n_layer);
  n = count(lower(g, with([](Fusions& f) { f.fused_ffn = false; }), kDecode));
  EXPECT_EQ(n.count("matvec_gate_up"), 0u);
  EXPECT_EQ(n.count("matvec_gate_up_swiglu"), 0u);
  n = count(lower(g, with([](Fusions& f) { f.swiglu_in_matmul = false; }), kDecode));
  EXPECT_EQ(n.count("matvec_gate_up_swiglu"), 0u);
  EXPECT_EQ(n.at("matvec_gate_up"), m.hp.n_layer);
  EXPECT_EQ(n.at("swiglu_quant_q8"), m.hp.n_layer);
  n = count(lower(g, with([](Fusions& f) { f.fused_residual = false; }), kDecode));
  EXPECT_EQ(n.at("add"), 2 * m.hp.n_layer);
  n = count(lower(g, with([](Fusions& f) { f.decode_a_fuse = false; }), kDecode));
  EXPECT_EQ(n.count("rms_norm_quant_q8") + n.count("swiglu_quant_q8") + n.count("attention_split_combine_quant_q8"), 0u);
  for (const Launch& l : lower(g, with([](Fusions& f) { f.decode_a_fuse = false; }), kDecode)) EXPECT_FALSE(l.writes_q8) << l.name;
  EXPECT_EQ(n.at("quantize_q8"), 4 * m.hp.n_layer + 1);  // qkv, o, gate_up, down, head
  n = count(lower(g, with([](Fusions& f) { f.attention_q8 = false; }), kDecode));
  EXPECT_EQ(n.count("attention_split_combine_quant_q8"), 0u);
  EXPECT_EQ(n.at("attention_split_combine"), m.hp.n_layer);
  EXPECT_EQ(n.at("quantize_q8"), m.hp.n_layer);  // o only
  n = count(lower(g, with([](Fusions& f) { f.prompt_a_fuse = false; }), kPrompt));
  EXPECT_EQ(n.at("activation_bf16"), 4 * m.hp.n_layer);  // once for q, k, v; o; gate and up; down
  n = count(lower(g, with([](Fusions& f) { f.gemm_swiglu = false; }), kPrompt));
  EXPECT_EQ(n.count("gemm_swiglu"), 0u);
  for (const char* role : {"attn_out", "ffn_gate", "ffn_up", "ffn_down"})
    EXPECT_EQ(n.at(std::string("gemm_") + role), m.hp.n_layer) << role;
  EXPECT_EQ(n.at("swiglu"), m.hp.n_layer);
  for (const StepShape shape : {kPrompt, kMixed}) {
    n = count(lower(g, with([](Fusions& f) { f.fused_rope_kv = false; }), shape));
    EXPECT_EQ(n.count("rope_kv"), 0u);
    EXPECT_EQ(n.at("rope"), 2 * m.hp.n_layer);  // prompt rows (mixed: the decode rows' in the qkv epilogue)
    EXPECT_EQ(n.at("kv_append"), m.hp.n_layer);
  }
  n = count(lower(g, with([](Fusions& f) { f.fused_qkv = false; }), kPrompt));
  EXPECT_EQ(n.count("gemm_qkv"), 0u);
  for (const char* role : {"attn_q", "attn_k", "attn_v", "attn_out", "ffn_down"})
    EXPECT_EQ(n.at(std::string("gemm_") + role), m.hp.n_layer) << role;

  for (const StepShape shape : {kDecode, kPrompt, kMixed}) {
    const std::vector<Launch> plain = lower(g, Fusions::none(), shape);
    std::vector<int> completed(g.nodes.size(), 0);
    for (const Launch& l : plain) {
      EXPECT_LE(l.n_segs, 1) << l.name;
      EXPECT_FALSE(l.writes_q8) << l.name;
      EXPECT_FALSE(l.writes_bf16) << l.name;
      EXPECT_FALSE(l.swiglu) << l.name;
      EXPECT_EQ(l.residual, -1) << l.name;
      if (l.completes_node >= 0) ++completed[size_t(l.completes_node)];
    }
    for (size_t i = 0; i < g.nodes.size(); ++i)
      EXPECT_EQ(completed[i], 1) << g.nodes[i].name << " (shape " << shape.decode << shape.prompt << ")";
  }
}

}  // namespace
}  // namespace minfer
