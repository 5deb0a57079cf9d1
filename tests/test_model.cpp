// Model loading: hyperparameters, tensor lookup and the errors for malformed model files, on
// small files crafted with gguf::Writer.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <map>

#include "model/model.h"
#include "support.h"
#include "util/error.h"

namespace minfer {
namespace {

constexpr int kEmbd = 32, kHeads = 4, kHeadsKv = 2, kFf = 64, kVocab = 16, kLayers = 2;

struct Recipe {
  std::string arch = "llama";
  bool untied = false;
  std::vector<std::string> drop_tensors;
  std::map<std::string, std::vector<int64_t>> reshape;
  std::vector<std::string> drop_keys;
  std::function<void(gguf::Writer&)> extra_keys;
};

std::string write_model(const Recipe& r) {
  const std::string path = (test::temp_dir("model") / "model.gguf").string();
  std::vector<std::pair<std::string, std::vector<int64_t>>> tensors;
  const int64_t q = kEmbd, kv = kHeadsKv * (kEmbd / kHeads);
  tensors.push_back({"token_embd.weight", {kEmbd, kVocab}});
  tensors.push_back({"output_norm.weight", {kEmbd}});
  if (r.untied) tensors.push_back({"output.weight", {kEmbd, kVocab}});
  for (int i = 0; i < kLayers; ++i) {
    const std::string p = "blk." + std::to_string(i) + ".";
    tensors.push_back({p + "attn_norm.weight", {kEmbd}});
    tensors.push_back({p + "attn_q.weight", {kEmbd, q}});
    tensors.push_back({p + "attn_k.weight", {kEmbd, kv}});
    tensors.push_back({p + "attn_v.weight", {kEmbd, kv}});
    if (r.arch == "qwen2") {
      tensors.push_back({p + "attn_q.bias", {q}});
      tensors.push_back({p + "attn_k.bias", {kv}});
      tensors.push_back({p + "attn_v.bias", {kv}});
    }
    if (r.arch == "qwen3") {
      tensors.push_back({p + "attn_q_norm.weight", {kEmbd / kHeads}});
      tensors.push_back({p + "attn_k_norm.weight", {kEmbd / kHeads}});
    }
    tensors.push_back({p + "attn_output.weight", {q, kEmbd}});
    tensors.push_back({p + "ffn_norm.weight", {kEmbd}});
    tensors.push_back({p + "ffn_gate.weight", {kEmbd, kFf}});
    tensors.push_back({p + "ffn_up.weight", {kEmbd, kFf}});
    tensors.push_back({p + "ffn_down.weight", {kFf, kEmbd}});
  }

  gguf::Writer w(path);
  const std::string a = r.arch + ".";
  const std::vector<std::pair<std::string, uint32_t>> ints = {
      {a + "context_length", 256}, {a + "embedding_length", kEmbd}, {a + "block_count", kLayers},
      {a + "feed_forward_length", kFf}, {a + "attention.head_count", kHeads},
      {a + "attention.head_count_kv", kHeadsKv}};
  auto dropped = [&](const std::string& k) {
    return std::find(r.drop_keys.begin(), r.drop_keys.end(), k) != r.drop_keys.end();
  };
  w.set("general.architecture", gguf::Value::from_string(r.arch));
  for (const auto& [k, v] : ints)
    if (!dropped(k)) w.set(k, gguf::Value::from_u32(v));
  w.set(a + "attention.layer_norm_rms_epsilon", gguf::Value::from_f32(1e-5f));
  if (r.extra_keys) r.extra_keys(w);
  std::vector<std::pair<std::string, std::vector<int64_t>>> written;
  for (auto [name, shape] : tensors) {
    if (std::find(r.drop_tensors.begin(), r.drop_tensors.end(), name) != r.drop_tensors.end()) continue;
    if (r.reshape.count(name)) shape = r.reshape.at(name);
    w.add_tensor(name, GgmlType::F32, shape);
    written.push_back({name, shape});
  }
  w.begin_data();
  for (const auto& [name, shape] : written) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    const std::vector<float> zeros(size_t(n), 0.0f);
    w.write_tensor_data(name, zeros.data(), zeros.size() * 4);
  }
  w.finish();
  return path;
}

std::string load_error(const Recipe& r) {
  const std::string path = write_model(r);
  try {
    Model::load(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Model, LoadsLlamaHyperparametersAndTiedEmbeddings) {
  Recipe r;
  r.extra_keys = [](gguf::Writer& w) {
    w.set("llama.rope.freq_base", gguf::Value::from_f32(500000.0f));
    w.set("llama.rope.scaling.type", gguf::Value::from_string("linear"));
    w.set("llama.rope.scaling.factor", gguf::Value::from_f32(4.0f));
  };
  const Model m = Model::load(write_model(r));
  EXPECT_EQ(m.hp.arch, Arch::Llama);
  EXPECT_EQ(m.hp.n_vocab, kVocab);
  EXPECT_EQ(m.hp.n_ctx_train, 256);
  EXPECT_EQ(m.hp.n_layer, kLayers);
  EXPECT_EQ(m.hp.n_head_kv, kHeadsKv);
  EXPECT_EQ(m.hp.head_dim, kEmbd / kHeads);
  EXPECT_EQ(m.hp.rope_type, RopeType::Normal);
  EXPECT_FLOAT_EQ(m.hp.rope_base, 500000.0f);
  EXPECT_FLOAT_EQ(m.hp.rope_freq_scale, 0.25f);
  EXPECT_FLOAT_EQ(m.hp.rms_eps, 1e-5f);
  EXPECT_TRUE(m.hp.tied_embeddings);
  EXPECT_EQ(m.output, m.token_embd);
  // Per layer: 2 norms + q (E*E) + k, v (E*kv) + o (E*E) + 3 ffn (E*F); plus embedding and norm.
  const int64_t kv = kHeadsKv * (kEmbd / kHeads);
  const int64_t per_layer = 2 * kEmbd + 2 * kEmbd * kEmbd + 2 * kEmbd * kv + 3 * kEmbd * kFf;
  EXPECT_EQ(m.n_params(), kLayers * per_layer + kEmbd * kVocab + kEmbd);
  // Tied: the output matmul reads the embedding, so every byte counts.
  EXPECT_EQ(m.bytes_read_per_token(), m.n_params() * 4);
}

TEST(Model, Qwen3UsesNeoXRopeAndQkNorm) {
  Recipe r;
  r.arch = "qwen3";
  r.untied = true;
  const Model m = Model::load(write_model(r));
  EXPECT_EQ(m.hp.rope_type, RopeType::NeoX);
  EXPECT_FALSE(m.hp.tied_embeddings);
  ASSERT_NE(m.layers[1].q_norm, nullptr);
  EXPECT_EQ(m.layers[1].k_norm->name, "blk.1.attn_k_norm.weight");
  EXPECT_EQ(m.bytes_read_per_token(), (m.n_params() - kEmbd * kVocab) * 4);
}

TEST(Model, MissingTensorIsNamed) {
  Recipe r;
  r.arch = "qwen2";
  r.drop_tensors = {"blk.1.attn_v.bias"};
  const std::string e = load_error(r);
  EXPECT_NE(e.find("model.gguf: missing tensor blk.1.attn_v.bias"), std::string::npos) << e;
}

TEST(Model, WrongShapeNamesBothShapes) {
  Recipe r;
  r.reshape["blk.1.attn_k.weight"] = {kEmbd, 8};
  const std::string e = load_error(r);
  EXPECT_NE(e.find("model.gguf: tensor blk.1.attn_k.weight has shape [32, 8], expected [32, 16]"),
            std::string::npos)
      << e;
}

TEST(Model, UnknownArchitecture) {
  Recipe r;
  r.arch = "gpt2";
  const std::string e = load_error(r);
  EXPECT_NE(e.find("unsupported architecture 'gpt2'"), std::string::npos) << e;
}

TEST(Model, MissingMetadataKey) {
  Recipe r;
  r.drop_keys = {"llama.block_count"};
  const std::string e = load_error(r);
  EXPECT_NE(e.find("llama.block_count"), std::string::npos) << e;
}

TEST(Model, HeadCountNotMultipleOfKvHeads) {
  Recipe r;
  r.extra_keys = [](gguf::Writer& w) { w.set("llama.attention.head_count_kv", gguf::Value::from_u32(3)); };
  const std::string e = load_error(r);
  EXPECT_NE(e.find("head_count_kv 3"), std::string::npos) << e;
}

// Every hyperparameter is range-checked at load: a NaN epsilon or a zero rope base used to load
// and produce NUL bytes (NaN logits) instead of an error.
TEST(Model, OutOfRangeHyperparametersAreRefusedByName) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  struct Case {
    std::string key;
    gguf::Value value;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {"llama.attention.layer_norm_rms_epsilon", gguf::Value::from_f32(nan), "attention.layer_norm_rms_epsilon = nan"},
      {"llama.attention.layer_norm_rms_epsilon", gguf::Value::from_f32(0), "attention.layer_norm_rms_epsilon = 0"},
      {"llama.attention.layer_norm_rms_epsilon", gguf::Value::from_f32(-1e-5f), "attention.layer_norm_rms_epsilon = -1e-05"},
      {"llama.attention.layer_norm_rms_epsilon", gguf::Value::from_f32(inf), "attention.layer_norm_rms_epsilon = inf"},
      {"llama.rope.freq_base", gguf::Value::from_f32(0), "rope.freq_base = 0"},
      {"llama.rope.freq_base", gguf::Value::from_f32(nan), "rope.freq_base = nan"},
      {"llama.rope.freq_base", gguf::Value::from_f64(1e300), "rope.freq_base = inf"},  // overflows float
      {"llama.rope.scaling.factor", gguf::Value::from_f32(inf), "rope.scaling.factor = inf"},
      {"llama.rope.scaling.factor", gguf::Value::from_f32(0), "rope.scaling.factor = 0"},
      {"llama.rope.scaling.factor", gguf::Value::from_f32(-2), "rope.scaling.factor = -2"},
      {"llama.context_length", gguf::Value::from_u64(uint64_t(1) << 32), "llama.context_length = 4294967296"},
      {"llama.attention.head_count", gguf::Value::from_i32(-4), "llama.attention.head_count = -4"},
  };
  for (const Case& c : cases) {
    Recipe r;
    r.extra_keys = [&](gguf::Writer& w) {
      w.set(c.key, c.value);
      if (c.key == "llama.rope.scaling.factor") w.set("llama.rope.scaling.type", gguf::Value::from_string("linear"));
    };
    const std::string e = load_error(r);
    EXPECT_NE(e.find(c.expected), std::string::npos) << c.key << ": " << e;
    EXPECT_NE(e.find("out of range"), std::string::npos) << c.key << ": " << e;
  }
}

// block_count is only bounded by 2^30: the loader must not allocate for all of them before it
// finds the file has two layers.
TEST(Model, HugeBlockCountFailsAtTheFirstMissingLayer) {
  Recipe r;
  r.extra_keys = [](gguf::Writer& w) { w.set("llama.block_count", gguf::Value::from_u32(1u << 30)); };
  const std::string e = load_error(r);
  EXPECT_NE(e.find("missing tensor blk.2.attn_norm.weight"), std::string::npos) << e;
}

}  // namespace
}  // namespace minfer
