#include "model/model.h"

#include <cmath>
#include <optional>

#include "util/error.h"

namespace minfer {

const char* arch_name(Arch a) {
  switch (a) {
    case Arch::Llama: return "llama";
    case Arch::Qwen2: return "qwen2";
    case Arch::Qwen3: return "qwen3";
    case Arch::Mistral: return "mistral";
  }
  return "unknown";
}

namespace {

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

Arch parse_arch(const std::string& path, const std::string& name) {
  if (name == "llama") return Arch::Llama;
  if (name == "mistral") return Arch::Mistral;
  if (name == "qwen2") return Arch::Qwen2;
  if (name == "qwen3") return Arch::Qwen3;
  fail(path, ": unsupported architecture '", name, "' (supported: llama, mistral, qwen2, qwen3)");
}

// Metadata integers that size buffers, checked before they narrow to int (2^32 + 2 must not
// become 2); validate_hparams checks them again with the rest.
int positive_int(const gguf::File& f, const std::string& key, std::optional<int64_t> def = {}) {
  const int64_t v = f.get_int(key, def);
  if (v <= 0 || v > kMaxHParam)
    fail(f.path(), ": ", key, " = ", v, " is out of range: it must be an integer in [1, ", kMaxHParam, "]");
  return int(v);
}

class TensorFinder {
 public:
  explicit TensorFinder(const gguf::File& f) : f_(f) {}

  const Tensor* optional(const std::string& name, std::vector<int64_t> expected) const {
    const Tensor* t = f_.find_tensor(name);
    if (t && t->shape != expected)
      fail(f_.path(), ": tensor ", name, " has shape ", shape_str(t->shape), ", expected ",
           shape_str(expected));
    return t;
  }
  const Tensor* required(const std::string& name, std::vector<int64_t> expected) const {
    const Tensor* t = optional(name, expected);
    if (!t) fail(f_.path(), ": missing tensor ", name, " (expected shape ", shape_str(expected), ")");
    return t;
  }

 private:
  const gguf::File& f_;
};

}  // namespace

void validate_hparams(const HParams& hp, const std::string& where) {
  const std::pair<const char*, int> sizes[] = {
      {"vocab_size", hp.n_vocab},           {"context_length", hp.n_ctx_train},
      {"embedding_length", hp.n_embd},      {"block_count", hp.n_layer},
      {"feed_forward_length", hp.n_ff},     {"attention.head_count", hp.n_head},
      {"attention.head_count_kv", hp.n_head_kv}, {"attention.key_length", hp.head_dim},
  };
  for (const auto& [key, value] : sizes)
    if (value < 1 || value > kMaxHParam)
      fail(where, ": ", key, " = ", value, " is out of range: it must be an integer in [1, ", kMaxHParam, "]");
  if (hp.n_head % hp.n_head_kv != 0)
    fail(where, ": attention.head_count ", hp.n_head, " is not a multiple of attention.head_count_kv ",
         hp.n_head_kv);
  if (hp.head_dim % 2 != 0) fail(where, ": head dimension ", hp.head_dim, " must be even for rope");
  if (!(std::isfinite(hp.rms_eps) && hp.rms_eps > 0 && hp.rms_eps < 1))
    fail(where, ": attention.layer_norm_rms_epsilon = ", hp.rms_eps,
         " is out of range: it must be a finite number in (0, 1)");
  if (!(std::isfinite(hp.rope_base) && hp.rope_base > 1))
    fail(where, ": rope.freq_base = ", hp.rope_base, " is out of range: it must be a finite number > 1");
  if (!(std::isfinite(hp.rope_freq_scale) && hp.rope_freq_scale > 0))
    fail(where, ": rope.scaling.factor = ", 1.0 / hp.rope_freq_scale,
         " is out of range: it must be a finite number > 0");
}

Model Model::load(const std::string& path) { return from_file(gguf::File::open(path)); }

Model Model::from_file(gguf::File file) {
  Model m;
  m.file = std::move(file);
  const gguf::File& f = m.file;
  HParams& hp = m.hp;
  hp.arch_name = f.get_string("general.architecture");
  hp.arch = parse_arch(f.path(), hp.arch_name);
  const std::string a = hp.arch_name + ".";

  hp.n_ctx_train = positive_int(f, a + "context_length");
  hp.n_embd = positive_int(f, a + "embedding_length");
  hp.n_layer = positive_int(f, a + "block_count");
  hp.n_ff = positive_int(f, a + "feed_forward_length");
  hp.n_head = positive_int(f, a + "attention.head_count");
  hp.n_head_kv = positive_int(f, a + "attention.head_count_kv", hp.n_head);
  hp.head_dim = positive_int(f, a + "attention.key_length", hp.n_embd / hp.n_head);
  hp.rms_eps = float(f.get_float(a + "attention.layer_norm_rms_epsilon", 1e-5));
  hp.rope_base = float(f.get_float(a + "rope.freq_base", 10000.0));
  hp.rope_type = (hp.arch == Arch::Qwen2 || hp.arch == Arch::Qwen3) ? RopeType::NeoX
                                                                     : RopeType::Normal;
  const std::string scaling = f.get_string(a + "rope.scaling.type", std::string("none"));
  if (scaling == "linear") {
    hp.rope_freq_scale = float(1.0 / f.get_float(a + "rope.scaling.factor", 1.0));
  } else if (scaling != "none") {
    fail(f.path(), ": unsupported rope scaling type '", scaling, "' (supported: none, linear)");
  }

  const TensorFinder t(f);
  const Tensor* embd = f.find_tensor("token_embd.weight");
  if (!embd) fail(f.path(), ": missing tensor token_embd.weight");
  if (embd->shape.size() != 2 || embd->shape[0] != hp.n_embd)
    fail(f.path(), ": tensor token_embd.weight has shape ", shape_str(embd->shape),
         ", expected [", hp.n_embd, ", n_vocab]");
  if (embd->shape[1] <= 0 || embd->shape[1] > kMaxHParam)
    fail(f.path(), ": tensor token_embd.weight has ", embd->shape[1], " rows (vocabulary size)");
  hp.n_vocab = int(embd->shape[1]);
  m.token_embd = embd;
  validate_hparams(hp, f.path());

  const int64_t E = hp.n_embd, V = hp.n_vocab, F = hp.n_ff, D = hp.head_dim;
  const int64_t Q = int64_t(hp.n_head) * D, KV = int64_t(hp.n_head_kv) * D;
  m.output_norm = t.required("output_norm.weight", {E});
  m.output = t.optional("output.weight", {E, V});
  hp.tied_embeddings = m.output == nullptr;
  if (hp.tied_embeddings) m.output = embd;
  m.rope_freqs = t.optional("rope_freqs.weight", {D / 2});
  hp.has_rope_freqs = m.rope_freqs != nullptr;

  const bool biases = hp.arch == Arch::Qwen2;
  const bool qk_norm = hp.arch == Arch::Qwen3;
  // Layer by layer, so that a block_count larger than the file's layers fails at the first missing
  // tensor instead of allocating for 2^30 layers.
  for (int i = 0; i < hp.n_layer; ++i) {
    const std::string p = "blk." + std::to_string(i) + ".";
    LayerWeights& l = m.layers.emplace_back();
    l.attn_norm = t.required(p + "attn_norm.weight", {E});
    l.wq = t.required(p + "attn_q.weight", {E, Q});
    l.wk = t.required(p + "attn_k.weight", {E, KV});
    l.wv = t.required(p + "attn_v.weight", {E, KV});
    if (biases) {
      l.bq = t.required(p + "attn_q.bias", {Q});
      l.bk = t.required(p + "attn_k.bias", {KV});
      l.bv = t.required(p + "attn_v.bias", {KV});
    }
    if (qk_norm) {
      l.q_norm = t.required(p + "attn_q_norm.weight", {D});
      l.k_norm = t.required(p + "attn_k_norm.weight", {D});
    }
    l.wo = t.required(p + "attn_output.weight", {Q, E});
    l.ffn_norm = t.required(p + "ffn_norm.weight", {E});
    l.w_gate = t.required(p + "ffn_gate.weight", {E, F});
    l.w_up = t.required(p + "ffn_up.weight", {E, F});
    l.w_down = t.required(p + "ffn_down.weight", {F, E});
  }
  return m;
}

int64_t Model::n_params() const {
  int64_t n = 0;
  for (const Tensor& t : file.tensors()) n += t.n_elements();
  return n;
}

int64_t Model::bytes_read_per_token() const {
  int64_t n = 0;
  for (const Tensor& t : file.tensors())
    if (&t != token_embd || hp.tied_embeddings) n += int64_t(t.nbytes);
  return n;
}

}  // namespace minfer
