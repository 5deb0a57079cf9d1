#include "convert/arch.h"

#include <cmath>

#include "util/error.h"

namespace minfer::convert {

const char* gguf_arch_name(Arch arch) {
  switch (arch) {
    case Arch::Llama:
    case Arch::Mistral: return "llama";
    case Arch::Qwen2: return "qwen2";
    case Arch::Qwen3: return "qwen3";
  }
  fail("unknown architecture id ", int(arch));
}

void set_meta(Metadata& md, const std::string& key, gguf::Value value) {
  for (auto& [k, v] : md)
    if (k == key) {
      v = std::move(value);
      return;
    }
  md.emplace_back(key, std::move(value));
}

Metadata hparam_metadata(const ModelShape& shape) {
  const HParams& hp = shape.hp;
  const std::string a = gguf_arch_name(hp.arch);
  using gguf::Value;
  Metadata md;
  md.emplace_back(a + ".vocab_size", Value::from_u32(uint32_t(hp.n_vocab)));
  md.emplace_back(a + ".context_length", Value::from_u32(uint32_t(hp.n_ctx_train)));
  md.emplace_back(a + ".embedding_length", Value::from_u32(uint32_t(hp.n_embd)));
  md.emplace_back(a + ".block_count", Value::from_u32(uint32_t(hp.n_layer)));
  md.emplace_back(a + ".feed_forward_length", Value::from_u32(uint32_t(hp.n_ff)));
  md.emplace_back(a + ".attention.head_count", Value::from_u32(uint32_t(hp.n_head)));
  md.emplace_back(a + ".attention.head_count_kv", Value::from_u32(uint32_t(hp.n_head_kv)));
  md.emplace_back(a + ".rope.freq_base", Value::from_f32(hp.rope_base));
  md.emplace_back(a + ".rope.dimension_count", Value::from_u32(uint32_t(hp.head_dim)));
  md.emplace_back(a + ".attention.layer_norm_rms_epsilon", Value::from_f32(hp.rms_eps));
  if (hp.head_dim * hp.n_head != hp.n_embd || hp.arch == Arch::Qwen3) {
    md.emplace_back(a + ".attention.key_length", Value::from_u32(uint32_t(hp.head_dim)));
    md.emplace_back(a + ".attention.value_length", Value::from_u32(uint32_t(hp.head_dim)));
  }
  if (shape.rope_scaling.kind == RopeScaling::Kind::Linear) {
    md.emplace_back(a + ".rope.scaling.type", Value::from_string("linear"));
    md.emplace_back(a + ".rope.scaling.factor", Value::from_f32(shape.rope_scaling.factor));
  }
  return md;
}

std::vector<TensorSpec> model_tensors(const ModelShape& shape) {
  const HParams& hp = shape.hp;
  const int64_t e = hp.n_embd, q = int64_t(hp.n_head) * hp.head_dim,
                kv = int64_t(hp.n_head_kv) * hp.head_dim, ff = hp.n_ff;
  std::vector<TensorSpec> t;
  t.push_back({"token_embd.weight", {e, hp.n_vocab}, TensorRole::Matrix});
  if (shape.rope_scaling.kind == RopeScaling::Kind::Llama3)
    t.push_back({"rope_freqs.weight", {hp.head_dim / 2}, TensorRole::RopeFreqs});
  for (int i = 0; i < hp.n_layer; ++i) {
    const std::string b = "blk." + std::to_string(i) + ".";
    t.push_back({b + "attn_norm.weight", {e}, TensorRole::Norm});
    t.push_back({b + "attn_q.weight", {e, q}, TensorRole::Matrix});
    t.push_back({b + "attn_k.weight", {e, kv}, TensorRole::Matrix});
    t.push_back({b + "attn_v.weight", {e, kv}, TensorRole::Matrix});
    if (shape.qkv_bias) {
      t.push_back({b + "attn_q.bias", {q}, TensorRole::Bias});
      t.push_back({b + "attn_k.bias", {kv}, TensorRole::Bias});
      t.push_back({b + "attn_v.bias", {kv}, TensorRole::Bias});
    }
    if (shape.qk_norm) {
      t.push_back({b + "attn_q_norm.weight", {hp.head_dim}, TensorRole::Norm});
      t.push_back({b + "attn_k_norm.weight", {hp.head_dim}, TensorRole::Norm});
    }
    t.push_back({b + "attn_output.weight", {q, e}, TensorRole::Matrix});
    t.push_back({b + "ffn_norm.weight", {e}, TensorRole::Norm});
    t.push_back({b + "ffn_gate.weight", {e, ff}, TensorRole::Matrix});
    t.push_back({b + "ffn_up.weight", {e, ff}, TensorRole::Matrix});
    t.push_back({b + "ffn_down.weight", {ff, e}, TensorRole::Matrix});
  }
  t.push_back({"output_norm.weight", {e}, TensorRole::Norm});
  if (!hp.tied_embeddings) t.push_back({"output.weight", {e, hp.n_vocab}, TensorRole::Matrix});
  return t;
}

std::vector<float> llama3_rope_freqs(int head_dim, float rope_base, const RopeScaling& s) {
  // Wavelengths longer than original_context / low_freq_factor are stretched by `factor`, those
  // shorter than original_context / high_freq_factor are kept; in between interpolate smoothly.
  const double low_wavelen = s.original_context / double(s.low_freq_factor);
  const double high_wavelen = s.original_context / double(s.high_freq_factor);
  std::vector<float> divisors(size_t(head_dim / 2));
  for (int i = 0; i < head_dim / 2; ++i) {
    const double freq = 1.0 / std::pow(double(rope_base), 2.0 * i / head_dim);
    const double wavelen = 2.0 * M_PI / freq;
    double d;
    if (wavelen < high_wavelen) {
      d = 1.0;
    } else if (wavelen > low_wavelen) {
      d = s.factor;
    } else {
      const double smooth = (s.original_context / wavelen - s.low_freq_factor) /
                            (s.high_freq_factor - s.low_freq_factor);
      d = 1.0 / ((1.0 - smooth) / s.factor + smooth);
    }
    divisors[size_t(i)] = float(d);
  }
  return divisors;
}

uint64_t tensor_nbytes(GgmlType type, const std::vector<int64_t>& shape) {
  const TypeTraits tt = type_traits(type);
  if (tt.block_size == 0) fail("tensor type id ", uint32_t(type), " has no known size");
  if (shape.empty() || shape[0] % tt.block_size != 0)
    fail("row length ", shape.empty() ? 0 : shape[0], " is not a multiple of the ", tt.name,
         " block size ", tt.block_size);
  uint64_t rows = 1;
  for (size_t i = 1; i < shape.size(); ++i) rows *= uint64_t(shape[i]);
  return rows * row_bytes(type, shape[0]);
}

static uint64_t value_bytes(const gguf::Value& v, gguf::ValueType type) {
  using T = gguf::ValueType;
  switch (type) {
    case T::UINT8: case T::INT8: case T::BOOL: return 1;
    case T::UINT16: case T::INT16: return 2;
    case T::UINT32: case T::INT32: case T::FLOAT32: return 4;
    case T::UINT64: case T::INT64: case T::FLOAT64: return 8;
    case T::STRING: return 8 + v.s.size();
    case T::ARRAY: {
      uint64_t n = 4 + 8;
      for (const auto& e : v.array) n += value_bytes(e, v.array_type);
      return n;
    }
  }
  fail("metadata value of unknown type ", uint32_t(type));
}

static uint64_t align_up(uint64_t n, uint64_t a) { return (n + a - 1) / a * a; }

uint64_t gguf_header_bytes(const Metadata& md, const std::vector<TensorLayout>& tensors,
                           uint64_t alignment) {
  uint64_t n = 4 + 4 + 8 + 8;  // magic, version, tensor count, kv count
  for (const auto& [key, value] : md) n += 8 + key.size() + 4 + value_bytes(value, value.type);
  for (const auto& t : tensors) n += 8 + t.name.size() + 4 + 8 * t.shape.size() + 4 + 8;
  return align_up(n, alignment);
}

uint64_t gguf_tensor_bytes(const std::vector<TensorLayout>& tensors, uint64_t alignment) {
  uint64_t n = 0;
  for (const auto& t : tensors) n += align_up(tensor_nbytes(t.type, t.shape), alignment);
  return n;
}

}  // namespace minfer::convert
