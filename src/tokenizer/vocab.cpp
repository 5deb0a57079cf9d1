#include "tokenizer/vocab.h"

#include "util/error.h"

namespace minfer {

namespace {

int32_t read_id(const gguf::File& file, const char* key) {
  const gguf::Value* v = file.find(key);
  if (!v) return -1;
  const int64_t id = v->as_int();
  return id < 0 || id > INT32_MAX ? -1 : int32_t(id);
}

bool read_flag(const gguf::File& file, const char* key, bool def) {
  const gguf::Value* v = file.find(key);
  return v ? v->as_bool() : def;
}

}  // namespace

void validate_tokenizer_metadata(const TokenizerMetadata& meta, const std::string& source) {
  const size_t n = meta.tokens.size();
  if (n == 0) fail(source, ": the vocabulary has no tokens");
  if (n > size_t(INT32_MAX)) fail(source, ": ", n, " tokens do not fit in int32 ids");
  if (meta.model != "gpt2" && meta.model != "llama")
    fail(source, ": tokenizer model ", gguf::quoted(meta.model),
         " is not supported (expected \"gpt2\" or \"llama\")");
  if (!meta.scores.empty() && meta.scores.size() != n)
    fail(source, ": ", meta.scores.size(), " scores for ", n, " tokens");
  if (!meta.token_types.empty() && meta.token_types.size() != n)
    fail(source, ": ", meta.token_types.size(), " token types for ", n, " tokens");
  for (size_t i = 0; i < meta.token_types.size(); ++i)
    if (meta.token_types[i] < 0 || meta.token_types[i] > int32_t(TokenType::BYTE))
      fail(source, ": token ", i, " has unknown token type ", meta.token_types[i]);
  const std::pair<const char*, int32_t> ids[] = {{"bos", meta.bos}, {"eos", meta.eos},
                                                  {"eot", meta.eot}, {"eom", meta.eom},
                                                  {"unknown", meta.unk}, {"padding", meta.pad}};
  for (const auto& [name, id] : ids)
    if (id >= int64_t(n)) fail(source, ": ", name, " token id ", id, " is outside the ", n, " tokens");
}

TokenizerMetadata read_tokenizer_metadata(const gguf::File& file) {
  TokenizerMetadata m;
  const std::string& src = file.path();
  if (!file.find("tokenizer.ggml.model")) fail(src, ": missing metadata key tokenizer.ggml.model");
  m.model = file.get_string("tokenizer.ggml.model");
  m.pre = file.get_string("tokenizer.ggml.pre", "default");
  m.tokens = file.get("tokenizer.ggml.tokens").as_strings();
  if (const gguf::Value* v = file.find("tokenizer.ggml.scores")) m.scores = v->as_floats();
  if (const gguf::Value* v = file.find("tokenizer.ggml.token_type")) {
    for (int64_t t : v->as_ints()) m.token_types.push_back(int32_t(t));
  }
  if (const gguf::Value* v = file.find("tokenizer.ggml.merges")) m.merges = v->as_strings();
  m.bos = read_id(file, "tokenizer.ggml.bos_token_id");
  m.eos = read_id(file, "tokenizer.ggml.eos_token_id");
  m.eot = read_id(file, "tokenizer.ggml.eot_token_id");
  m.eom = read_id(file, "tokenizer.ggml.eom_token_id");
  m.unk = read_id(file, "tokenizer.ggml.unknown_token_id");
  m.pad = read_id(file, "tokenizer.ggml.padding_token_id");
  const bool spm = m.model == "llama";
  m.add_bos = read_flag(file, "tokenizer.ggml.add_bos_token", spm);
  m.add_eos = read_flag(file, "tokenizer.ggml.add_eos_token", false);
  m.add_space_prefix = read_flag(file, "tokenizer.ggml.add_space_prefix", spm);
  m.chat_template = file.get_string("tokenizer.chat_template", "");
  validate_tokenizer_metadata(m, src);
  return m;
}

void write_tokenizer_metadata(gguf::Writer& w, const TokenizerMetadata& m) {
  w.set("tokenizer.ggml.model", gguf::Value::from_string(m.model));
  w.set("tokenizer.ggml.pre", gguf::Value::from_string(m.pre));
  w.set("tokenizer.ggml.tokens", gguf::Value::from_strings(m.tokens));
  if (!m.scores.empty()) w.set("tokenizer.ggml.scores", gguf::Value::from_f32s(m.scores));
  if (!m.token_types.empty())
    w.set("tokenizer.ggml.token_type", gguf::Value::from_i32s(m.token_types));
  if (!m.merges.empty()) w.set("tokenizer.ggml.merges", gguf::Value::from_strings(m.merges));
  const std::pair<const char*, int32_t> ids[] = {
      {"tokenizer.ggml.bos_token_id", m.bos},     {"tokenizer.ggml.eos_token_id", m.eos},
      {"tokenizer.ggml.eot_token_id", m.eot},     {"tokenizer.ggml.eom_token_id", m.eom},
      {"tokenizer.ggml.unknown_token_id", m.unk}, {"tokenizer.ggml.padding_token_id", m.pad}};
  for (const auto& [key, id] : ids)
    if (id >= 0) w.set(key, gguf::Value::from_u32(uint32_t(id)));
  w.set("tokenizer.ggml.add_bos_token", gguf::Value::from_bool(m.add_bos));
  w.set("tokenizer.ggml.add_eos_token", gguf::Value::from_bool(m.add_eos));
  if (m.model == "llama")
    w.set("tokenizer.ggml.add_space_prefix", gguf::Value::from_bool(m.add_space_prefix));
  if (!m.chat_template.empty())
    w.set("tokenizer.chat_template", gguf::Value::from_string(m.chat_template));
}

}  // namespace minfer
