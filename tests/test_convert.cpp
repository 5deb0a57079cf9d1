// minfer convert: safetensors parsing, HF config handling, and the end-to-end oracle: small random
// HF models (tools/hf-oracle/make_models.py, run with transformers) converted to f32 GGUF must give
// the same logits on the CPU engine and the same greedy continuations.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "convert/convert.h"
#include "convert/safetensors.h"
#include "engine/session.h"
#include "model/model.h"
#include "support.h"
#include "util/error.h"
#include "util/half.h"

namespace minfer {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct RawTensor {
  std::string name, dtype;
  std::vector<int64_t> shape;
  std::string bytes;
};

void write_safetensors(const fs::path& path, const std::vector<RawTensor>& tensors) {
  json header = json::object();
  std::string data;
  for (const auto& t : tensors) {
    header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {data.size(), data.size() + t.bytes.size()}}};
    data += t.bytes;
  }
  const std::string h = header.dump();
  const uint64_t n = h.size();
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(&n), 8);
  f << h << data;
}

template <typename T>
std::string bytes_of(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

TEST(Safetensors, ReadsEveryFloatDtype) {
  const fs::path dir = test::temp_dir("st");
  const std::vector<float> f32 = {1.5f, -2.25f, 3.0f, 0.0f, 1e-3f, -7.0f};
  std::vector<uint16_t> f16, bf16;
  for (float x : f32) {
    f16.push_back(f32_to_f16(x));
    bf16.push_back(f32_to_bf16(x));
  }
  write_safetensors(dir / "model.safetensors", {{"a", "F32", {2, 3}, bytes_of(f32)},
                                                {"b", "F16", {6}, bytes_of(f16)},
                                                {"c", "BF16", {3, 2}, bytes_of(bf16)}});
  const auto ckpt = convert::Checkpoint::open(dir.string());
  ASSERT_EQ(ckpt.tensors().size(), 3u);
  EXPECT_EQ(ckpt.get("a").shape, (std::vector<int64_t>{2, 3}));
  for (const char* name : {"a", "b", "c"}) {
    std::vector<float> out(4);
    ckpt.get(name).read_floats(2, 4, out.data());
    for (int i = 0; i < 4; ++i) EXPECT_NEAR(out[i], f32[i + 2], std::abs(f32[i + 2]) * 4e-3) << name << i;
  }
  EXPECT_THROW(ckpt.get("missing"), Error);
}

TEST(Safetensors, RejectsBadFiles) {
  const fs::path dir = test::temp_dir("st-bad");
  write_safetensors(dir / "model.safetensors", {{"a", "I8", {4}, std::string(4, '\0')}});
  try {
    convert::Checkpoint::open(dir.string());
    FAIL() << "I8 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unsupported dtype I8"), std::string::npos) << e.what();
  }
  write_safetensors(dir / "model.safetensors", {{"a", "F32", {5}, std::string(16, '\0')}});
  EXPECT_THROW(convert::Checkpoint::open(dir.string()), Error);
  { std::ofstream(dir / "model.safetensors", std::ios::binary) << std::string("\xff\xff\xff\xff\0\0\0\0{}", 10); }
  EXPECT_THROW(convert::Checkpoint::open(dir.string()), Error);
  { std::ofstream(dir / "model.safetensors", std::ios::binary) << std::string("\x04\0\0\0\0\0\0\0{{{{", 12); }
  EXPECT_THROW(convert::Checkpoint::open(dir.string()), Error);
  fs::remove(dir / "model.safetensors");
  EXPECT_THROW(convert::Checkpoint::open(dir.string()), Error);
}

// A hand-made one-layer llama whose q_proj rows are numbered: after conversion, each head's rows
// must be interleaved (HF row j*hd/2 + i -> GGUF row 2i + j), as llama-arch rope expects.
TEST(Convert, PermutesLlamaQKRowsAndMapsConfig) {
  const fs::path dir = test::temp_dir("conv-llama");
  const int E = 32, H = 2, KV = 1, HD = 16, FF = 64, V = 512;
  json cfg = {{"architectures", {"LlamaForCausalLM"}}, {"hidden_size", E}, {"num_hidden_layers", 1},
              {"num_attention_heads", H}, {"num_key_value_heads", KV}, {"intermediate_size", FF},
              {"vocab_size", V}, {"max_position_embeddings", 1024}, {"rms_norm_eps", 1e-5},
              {"rope_theta", 10000.0}, {"tie_word_embeddings", true},
              {"rope_scaling", {{"rope_type", "linear"}, {"factor", 2.0}}}};
  std::ofstream(dir / "config.json") << cfg.dump();
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
    fs::copy_file(test::source_dir() / "tools/hf-oracle/tokenizer" / f, dir / f);
  auto rows = [](int n_rows, int row_len) {  // element (r, c) = r + c / 1000
    std::vector<float> v;
    for (int r = 0; r < n_rows; ++r)
      for (int c = 0; c < row_len; ++c) v.push_back(float(r) + float(c) / 1000.0f);
    return bytes_of(v);
  };
  const std::string p = "model.layers.0.";
  write_safetensors(dir / "model.safetensors",
                    {{"model.embed_tokens.weight", "F32", {V, E}, rows(V, E)},
                     {"model.norm.weight", "F32", {E}, rows(1, E)},
                     {p + "input_layernorm.weight", "F32", {E}, rows(1, E)},
                     {p + "post_attention_layernorm.weight", "F32", {E}, rows(1, E)},
                     {p + "self_attn.q_proj.weight", "F32", {H * HD, E}, rows(H * HD, E)},
                     {p + "self_attn.k_proj.weight", "F32", {KV * HD, E}, rows(KV * HD, E)},
                     {p + "self_attn.v_proj.weight", "F32", {KV * HD, E}, rows(KV * HD, E)},
                     {p + "self_attn.o_proj.weight", "F32", {E, H * HD}, rows(E, H * HD)},
                     {p + "mlp.gate_proj.weight", "F32", {FF, E}, rows(FF, E)},
                     {p + "mlp.up_proj.weight", "F32", {FF, E}, rows(FF, E)},
                     {p + "mlp.down_proj.weight", "F32", {E, FF}, rows(E, FF)},
                     {p + "self_attn.rotary_emb.inv_freq", "F32", {HD / 2}, rows(1, HD / 2)}});
  const fs::path out = dir / "out.gguf";
  convert::ConvertOptions opts;
  opts.hf_dir = dir.string();
  opts.out_path = out.string();
  opts.outtype = synth::FileType::F32;
  opts.n_threads = 2;
  convert::convert_hf(opts);

  const gguf::File f = gguf::File::open(out.string());
  EXPECT_EQ(f.get_string("general.architecture"), "llama");
  EXPECT_EQ(f.get_int("llama.attention.head_count_kv"), KV);
  EXPECT_EQ(f.get_int("llama.context_length"), 1024);
  EXPECT_NEAR(f.get_float("llama.attention.layer_norm_rms_epsilon"), 1e-5, 1e-9);
  EXPECT_EQ(f.get_string("llama.rope.scaling.type"), "linear");
  EXPECT_EQ(f.get_float("llama.rope.scaling.factor"), 2.0);
  EXPECT_EQ(f.find_tensor("output.weight"), nullptr);  // tied
  EXPECT_EQ(f.get("tokenizer.ggml.tokens").array.size(), size_t(V));
  for (const char* name : {"blk.0.attn_q.weight", "blk.0.attn_k.weight"}) {
    const auto* t = f.find_tensor(name);
    ASSERT_NE(t, nullptr);
    const float* x = reinterpret_cast<const float*>(t->data);
    for (int64_t r = 0; r < t->rows(); ++r) {
      const int64_t head = r / HD, w = r % HD;
      const float want_row = float(head * HD + (w % 2) * (HD / 2) + w / 2);
      EXPECT_EQ(x[r * E], want_row) << name << " row " << r;
      EXPECT_FLOAT_EQ(x[r * E + 7], want_row + 0.007f);
    }
  }
  const float* v = reinterpret_cast<const float*>(f.find_tensor("blk.0.attn_v.weight")->data);
  EXPECT_EQ(v[3 * E], 3.0f);  // not permuted
  EXPECT_NO_THROW(Model::load(out.string()));

  // Unsupported architecture and rope scaling are clear errors.
  cfg["architectures"] = {"GPT2LMHeadModel"};
  std::ofstream(dir / "config.json") << cfg.dump();
  try {
    convert::convert_hf(opts);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unsupported architecture GPT2LMHeadModel"), std::string::npos) << e.what();
  }
  cfg["architectures"] = {"LlamaForCausalLM"};
  cfg["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  std::ofstream(dir / "config.json") << cfg.dump();
  EXPECT_THROW(convert::convert_hf(opts), Error);
}

// 64-bit and out-of-range hyperparameters are refused by name, never narrowed to int (2^32 + 2
// layers used to become 2) or written into a file that would load as NaNs.
TEST(Convert, RefusesOutOfRangeHyperparameters) {
  const fs::path dir = test::temp_dir("conv-range");
  const json base = {{"architectures", {"LlamaForCausalLM"}}, {"hidden_size", 64}, {"num_hidden_layers", 2},
                     {"num_attention_heads", 4}, {"intermediate_size", 128}, {"vocab_size", 512}};
  const std::vector<std::pair<json, std::string>> cases = {
      {{{"num_hidden_layers", (int64_t(1) << 32) + 2}}, "num_hidden_layers = 4294967298 is out of range"},
      {{{"hidden_size", -64}}, "hidden_size = -64 is out of range"},
      {{{"vocab_size", 0}}, "vocab_size = 0 is out of range"},
      {{{"max_position_embeddings", 1.5}}, "max_position_embeddings = 1.5 is out of range"},
      {{{"rms_norm_eps", 0}}, "attention.layer_norm_rms_epsilon = 0 is out of range"},
      {{{"rms_norm_eps", 1e-60}}, "attention.layer_norm_rms_epsilon = 0 is out of range"},  // 0 as a float
      {{{"rope_theta", 0}}, "rope.freq_base = 0 is out of range"},
      {{{"rope_theta", 1e300}}, "rope.freq_base = inf is out of range"},
      {{{"rope_scaling", {{"rope_type", "linear"}, {"factor", 1e300}}}}, "rope.scaling.factor = inf is out of range"},
  };
  for (const auto& [change, expected] : cases) {
    json cfg = base;
    cfg.update(change);
    std::ofstream(dir / "config.json") << cfg.dump();
    try {
      convert::read_hf_config(dir.string());
      ADD_FAILURE() << cfg.dump() << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
    }
  }
}

TEST(Convert, ReadsTransformers5RopeParameters) {
  const fs::path dir = test::temp_dir("conv-cfg");
  const json cfg = {{"architectures", {"Qwen3ForCausalLM"}}, {"hidden_size", 64}, {"num_hidden_layers", 2},
                    {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"head_dim", 32},
                    {"intermediate_size", 128}, {"vocab_size", 512},
                    {"rope_parameters", {{"rope_theta", 500000.0}, {"rope_type", "llama3"}, {"factor", 8.0},
                                         {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0},
                                         {"original_max_position_embeddings", 8192}}}};
  std::ofstream(dir / "config.json") << cfg.dump();
  const convert::ModelShape s = convert::read_hf_config(dir.string());
  EXPECT_EQ(s.hp.rope_base, 500000.0f);
  EXPECT_EQ(s.hp.head_dim, 32);
  EXPECT_EQ(s.hp.n_ctx_train, 4096);  // absent: default
  EXPECT_TRUE(s.qk_norm);
  EXPECT_EQ(s.rope_scaling.kind, convert::RopeScaling::Kind::Llama3);
  EXPECT_EQ(s.rope_scaling.factor, 8.0f);
}

// ---- the transformers oracle -------------------------------------------------------------------

class HfOracle : public testing::TestWithParam<std::string> {};

TEST_P(HfOracle, F32LogitsAndGreedyContinuationsMatchTransformers) {
  const fs::path src = test::source_dir() / "tests/data/hf" / GetParam();
  ASSERT_TRUE(fs::exists(src / "golden.json")) << src << " missing: run tools/hf-oracle/make_models.py";
  std::ifstream gj(src / "golden.json");
  const json golden = json::parse(gj);
  std::ifstream gb(src / "golden.bin", std::ios::binary);
  const std::string blob((std::istreambuf_iterator<char>(gb)), {});
  const float* ref_all = reinterpret_cast<const float*>(blob.data());
  const int V = golden["vocab"];

  const fs::path out = test::temp_dir("oracle") / (GetParam() + ".gguf");
  std::string log;
  ASSERT_EQ(test::run_command(test::minfer_binary() + " convert " + src.string() + " --outtype f32 -t 2 -o " +
                                  out.string(),
                              &log),
            0)
      << log;
  const Model model = Model::load(out.string());
  Session session(model, {.n_ctx = 256, .n_threads = 2, .backend = BackendKind::Cpu});
  double worst = 0;
  for (const auto& p : golden["prompts"]) {
    const std::vector<int32_t> ids = p["ids"].get<std::vector<int32_t>>();
    const size_t offset = p["logits_offset"].get<size_t>();
    ASSERT_LE((offset + ids.size() * V) * sizeof(float), blob.size());
    session.reset();
    const auto logits = session.eval_all(ids);
    ASSERT_EQ(logits.size(), ids.size() * size_t(V));
    double max_diff = 0, max_ref = 0;
    for (size_t i = 0; i < logits.size(); ++i) {
      max_diff = std::max(max_diff, double(std::abs(logits[i] - ref_all[offset + i])));
      max_ref = std::max(max_ref, double(std::abs(ref_all[offset + i])));
    }
    const double rel = max_diff / max_ref;
    worst = std::max(worst, rel);
    EXPECT_LT(rel, 1e-4) << "prompt of " << ids.size() << " tokens: max |diff| " << max_diff
                         << ", max |logit| " << max_ref;

    session.reset();
    std::vector<int32_t> greedy;
    int32_t next = session.eval_greedy(ids);
    for (int k = 0; k < 32; ++k) {
      greedy.push_back(next);
      if (k + 1 < 32) next = session.decode_greedy(next);
    }
    EXPECT_EQ(greedy, p["greedy"].get<std::vector<int32_t>>()) << "prompt of " << ids.size() << " tokens";
  }
  std::printf("[oracle %s] worst relative logit error %.3g\n", GetParam().c_str(), worst);
}

INSTANTIATE_TEST_SUITE_P(Models, HfOracle, testing::Values("qwen2", "llama", "qwen3", "mistral", "llama_linear"));

}  // namespace
}  // namespace minfer
