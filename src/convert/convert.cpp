#include "convert/convert.h"

#include <cmath>
#include <filesystem>
#include <set>

#include <nlohmann/json.hpp>

#include "convert/safetensors.h"
#include "convert/tensor_stream.h"
#include "convert/tokenizer_meta.h"
#include "tokenizer/hf_import.h"
#include "util/error.h"
#include "util/files.h"

namespace minfer::convert {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kConfigFile = "config.json";

// An integer field; a missing or null one takes `def` (< 0: required). Checked before it narrows
// to int: 2^32 + 2 layers must not become 2.
int int_field(const json& cfg, const char* key, int def, const std::string& where) {
  if (!cfg.contains(key) || cfg[key].is_null()) {
    if (def < 0) fail(where, ": missing ", key);
    return def;
  }
  const json& v = cfg[key];
  const uint64_t n = v.is_number_unsigned()                           ? v.get<uint64_t>()
                     : v.is_number_integer() && v.get<int64_t>() > 0 ? uint64_t(v.get<int64_t>())
                                                                      : 0;
  if (n < 1 || n > uint64_t(kMaxHParam))
    fail(where, ": ", key, " = ", v.dump(), " is out of range: it must be an integer in [1, ", kMaxHParam, "]");
  return int(n);
}

double float_field(const json& cfg, const char* key, double def, const std::string& where) {
  if (!cfg.contains(key) || cfg[key].is_null()) return def;
  if (!cfg[key].is_number()) fail(where, ": ", key, " must be a number");
  return cfg[key].get<double>();
}

}  // namespace

ModelShape read_hf_config(const std::string& dir) {
  const std::string where = (fs::path(dir) / kConfigFile).string();
  const json cfg = read_json_file(where);
  if (!cfg.contains("architectures") || !cfg["architectures"].is_array() || cfg["architectures"].empty() ||
      !cfg["architectures"][0].is_string())
    fail(where, ": no architectures list");
  const std::string arch = cfg["architectures"][0].get<std::string>();
  ModelShape s;
  HParams& hp = s.hp;
  if (arch == "LlamaForCausalLM") hp.arch = Arch::Llama;
  else if (arch == "MistralForCausalLM") hp.arch = Arch::Mistral;
  else if (arch == "Qwen2ForCausalLM") hp.arch = Arch::Qwen2;
  else if (arch == "Qwen3ForCausalLM") hp.arch = Arch::Qwen3;
  else
    fail(where, ": unsupported architecture ", arch,
         " (supported: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM)");
  hp.arch_name = gguf_arch_name(hp.arch);
  hp.n_embd = int_field(cfg, "hidden_size", -1, where);
  hp.n_layer = int_field(cfg, "num_hidden_layers", -1, where);
  hp.n_head = int_field(cfg, "num_attention_heads", -1, where);
  hp.n_head_kv = int_field(cfg, "num_key_value_heads", hp.n_head, where);
  hp.n_ff = int_field(cfg, "intermediate_size", -1, where);
  hp.n_vocab = int_field(cfg, "vocab_size", -1, where);
  hp.n_ctx_train = int_field(cfg, "max_position_embeddings", 4096, where);
  hp.head_dim = int_field(cfg, "head_dim", hp.n_embd / hp.n_head, where);
  hp.rms_eps = float(float_field(cfg, "rms_norm_eps", 1e-6, where));
  // transformers 5 keeps rope_theta and the scaling together in rope_parameters; 4.x wrote
  // rope_theta and rope_scaling at the top level.
  const bool v5_rope = cfg.contains("rope_parameters") && cfg["rope_parameters"].is_object();
  const json& rope_params = v5_rope ? cfg["rope_parameters"] : cfg;
  hp.rope_base = float(float_field(rope_params, "rope_theta", float_field(cfg, "rope_theta", 10000.0, where), where));
  hp.tied_embeddings = cfg.value("tie_word_embeddings", false);
  hp.rope_type = hp.arch == Arch::Qwen2 || hp.arch == Arch::Qwen3 ? RopeType::NeoX : RopeType::Normal;
  if (cfg.value("attention_bias", false) && hp.arch != Arch::Qwen2)
    fail(where, ": attention_bias = true is not supported for ", arch);
  if (cfg.value("mlp_bias", false)) fail(where, ": mlp_bias = true is not supported");
  const std::string act = cfg.value("hidden_act", std::string("silu"));
  if (act != "silu") fail(where, ": hidden_act ", act, " is not supported (only silu)");

  const json* scaling = v5_rope ? &cfg["rope_parameters"]
                        : cfg.contains("rope_scaling") && !cfg["rope_scaling"].is_null() ? &cfg["rope_scaling"]
                                                                                          : nullptr;
  if (scaling) {
    const json& rs = *scaling;
    if (!rs.is_object()) fail(where, ": rope_scaling is not an object");
    std::string type = rs.value("rope_type", rs.value("type", std::string()));
    const double factor = float_field(rs, "factor", 1.0, where + ": rope_scaling");
    if (type == "linear") {
      s.rope_scaling.kind = RopeScaling::Kind::Linear;
      s.rope_scaling.factor = float(factor);
    } else if (type == "llama3") {
      s.rope_scaling.kind = RopeScaling::Kind::Llama3;
      s.rope_scaling.factor = float(factor);
      s.rope_scaling.low_freq_factor = float(float_field(rs, "low_freq_factor", 1.0, where));
      s.rope_scaling.high_freq_factor = float(float_field(rs, "high_freq_factor", 4.0, where));
      s.rope_scaling.original_context = int_field(rs, "original_max_position_embeddings", 8192, where);
      hp.has_rope_freqs = true;
    } else if (type != "default" && !type.empty()) {
      fail(where, ": rope_scaling type '", type, "' is not supported (supported: linear, llama3)");
    }
    if (!(factor > 0 && std::isfinite(factor)))
      fail(where, ": rope_scaling factor ", factor, " is out of range: it must be a finite number > 0");
    if (s.rope_scaling.kind == RopeScaling::Kind::Llama3 &&
        !(s.rope_scaling.high_freq_factor > s.rope_scaling.low_freq_factor))
      fail(where, ": llama3 rope_scaling needs high_freq_factor > low_freq_factor");
  }
  if (s.rope_scaling.kind == RopeScaling::Kind::Linear) hp.rope_freq_scale = 1.0f / s.rope_scaling.factor;
  validate_hparams(hp, where);
  s.qkv_bias = hp.arch == Arch::Qwen2;
  s.qk_norm = hp.arch == Arch::Qwen3;
  return s;
}

namespace {

// GGUF name -> HF name of each tensor the model needs.
std::string hf_name(const std::string& gguf) {
  static const std::pair<const char*, const char*> layer_map[] = {
      {"attn_norm.weight", "input_layernorm.weight"},
      {"attn_q.weight", "self_attn.q_proj.weight"},
      {"attn_k.weight", "self_attn.k_proj.weight"},
      {"attn_v.weight", "self_attn.v_proj.weight"},
      {"attn_q.bias", "self_attn.q_proj.bias"},
      {"attn_k.bias", "self_attn.k_proj.bias"},
      {"attn_v.bias", "self_attn.v_proj.bias"},
      {"attn_q_norm.weight", "self_attn.q_norm.weight"},
      {"attn_k_norm.weight", "self_attn.k_norm.weight"},
      {"attn_output.weight", "self_attn.o_proj.weight"},
      {"ffn_norm.weight", "post_attention_layernorm.weight"},
      {"ffn_gate.weight", "mlp.gate_proj.weight"},
      {"ffn_up.weight", "mlp.up_proj.weight"},
      {"ffn_down.weight", "mlp.down_proj.weight"},
  };
  if (gguf == "token_embd.weight") return "model.embed_tokens.weight";
  if (gguf == "output_norm.weight") return "model.norm.weight";
  if (gguf == "output.weight") return "lm_head.weight";
  const size_t dot = gguf.find('.', 4);
  const std::string layer = gguf.substr(4, dot - 4), rest = gguf.substr(dot + 1);
  for (const auto& [g, h] : layer_map)
    if (rest == g) return "model.layers." + layer + "." + h;
  fail("no HF name for tensor ", gguf);
}

}  // namespace

uint64_t convert_hf(const ConvertOptions& opts) {
  const ModelShape shape = read_hf_config(opts.hf_dir);
  const HParams& hp = shape.hp;
  const Checkpoint ckpt = Checkpoint::open(opts.hf_dir);
  std::vector<std::string> inputs = ckpt.files();
  inputs.push_back((fs::path(opts.hf_dir) / kConfigFile).string());
  for (std::string& f : hf_tokenizer_files(opts.hf_dir)) inputs.push_back(std::move(f));
  refuse_to_overwrite_inputs(opts.out_path, inputs);
  ModelShape out_shape = shape;
  // An lm_head missing from the checkpoint means the embeddings are tied whatever config says.
  if (!ckpt.find("lm_head.weight")) out_shape.hp.tied_embeddings = true;

  Metadata md;
  md.emplace_back("general.architecture", gguf::Value::from_string(gguf_arch_name(hp.arch)));
  md.emplace_back("general.name", gguf::Value::from_string(fs::path(opts.hf_dir).filename().string()));
  md.emplace_back("general.file_type", gguf::Value::from_u32(uint32_t(synth::file_type_gguf_id(opts.outtype))));
  if (opts.outtype != synth::FileType::F32 && opts.outtype != synth::FileType::F16 &&
      opts.outtype != synth::FileType::BF16)
    md.emplace_back("general.quantization_version", gguf::Value::from_u32(2));
  for (auto& kv : hparam_metadata(out_shape)) md.push_back(std::move(kv));
  for (auto& kv : tokenizer_kv(import_hf_tokenizer(opts.hf_dir, hp.n_vocab))) md.push_back(std::move(kv));

  std::vector<OutTensor> tensors;
  std::set<std::string> used;
  for (const TensorSpec& spec : model_tensors(out_shape)) {
    const GgmlType type = synth::tensor_type_for(opts.outtype, spec.name, spec.shape[0], hp.n_layer,
                                                 !out_shape.hp.tied_embeddings);
    if (spec.role == TensorRole::RopeFreqs) {
      auto freqs = std::make_shared<std::vector<float>>(llama3_rope_freqs(hp.head_dim, hp.rope_base, shape.rope_scaling));
      tensors.push_back({spec.name, type, spec.shape,
                         [freqs](int64_t, int64_t, float* dst) { std::copy(freqs->begin(), freqs->end(), dst); }});
      continue;
    }
    const std::string name = hf_name(spec.name);
    const StTensor& st = ckpt.get(name);
    used.insert(name);
    // safetensors shapes are [out, in]; GGUF lists the contiguous dimension first.
    const std::vector<int64_t> expected(spec.shape.rbegin(), spec.shape.rend());
    if (st.shape != expected) {
      std::string got, want;
      for (int64_t d : st.shape) got += (got.empty() ? "" : ", ") + std::to_string(d);
      for (int64_t d : expected) want += (want.empty() ? "" : ", ") + std::to_string(d);
      fail(st.file, ": tensor ", name, " has shape [", got, "], config.json implies [", want, "]");
    }
    const int64_t row_len = spec.shape[0];
    const StTensor* src = &st;
    // llama-arch rope rotates adjacent pairs; HF rotates the two halves of each head. Reorder each
    // head's rows so that row 2i+j comes from HF row j*head_dim/2 + i.
    const bool is_q = spec.name.ends_with("attn_q.weight"), is_k = spec.name.ends_with("attn_k.weight");
    if (hp.rope_type == RopeType::Normal && (is_q || is_k)) {
      const int64_t hd = hp.head_dim;
      tensors.push_back({spec.name, type, spec.shape, [src, row_len, hd](int64_t r0, int64_t n, float* dst) {
                           for (int64_t r = r0; r < r0 + n; ++r) {
                             const int64_t head = r / hd, w = r % hd;
                             const int64_t from = head * hd + (w % 2) * (hd / 2) + w / 2;
                             src->read_floats(from * row_len, row_len, dst + (r - r0) * row_len);
                           }
                         }});
    } else {
      tensors.push_back({spec.name, type, spec.shape, [src, row_len](int64_t r0, int64_t n, float* dst) {
                           src->read_floats(r0 * row_len, n * row_len, dst);
                         }});
    }
  }
  for (const auto& [name, t] : ckpt.tensors()) {
    if (used.count(name) || name.ends_with("rotary_emb.inv_freq")) continue;
    if (name == "lm_head.weight" && out_shape.hp.tied_embeddings) continue;
    fail(t.file, ": unexpected tensor ", name, " for ", hp.arch_name,
         " (the converter would drop it; is config.json right?)");
  }
  return write_gguf(opts.out_path, md, tensors, {opts.n_threads, opts.progress});
}

}  // namespace minfer::convert
