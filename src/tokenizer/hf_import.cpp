#include "tokenizer/hf_import.h"

#include <filesystem>

#include "tokenizer/pretokenize.h"
#include "util/error.h"
#include "util/files.h"

namespace minfer {

namespace {

using nlohmann::json;
namespace fs = std::filesystem;

constexpr int64_t kMaxTokens = int64_t(1) << 24;  // far above any real vocabulary (Gemma: 262k)

// The files of a HF directory the import reads.
constexpr const char* kTokenizerFile = "tokenizer.json";
constexpr const char* kTokenizerConfigFile = "tokenizer_config.json";
constexpr const char* kChatTemplateFile = "chat_template.jinja";  // newer transformers

// The split regexes a HF pre_tokenizer applies, in order; fails on components that are not
// regex splits.
void collect_split_patterns(const json& node, const std::string& source,
                            std::vector<std::string>& patterns, bool& byte_level) {
  if (node.is_null()) return;
  const std::string type = node.value("type", "");
  if (type == "Sequence") {
    for (const json& child : node.at("pretokenizers"))
      collect_split_patterns(child, source, patterns, byte_level);
  } else if (type == "Split") {
    const json& pattern = node.at("pattern");
    if (!pattern.contains("Regex"))
      fail(source, ": pre_tokenizer Split with a plain-string pattern is not supported");
    if (node.value("behavior", "") != "Isolated" || node.value("invert", false))
      fail(source, ": pre_tokenizer Split behaviour ", node.value("behavior", "?"),
           node.value("invert", false) ? " (inverted)" : "", " is not supported (only Isolated)");
    patterns.push_back(pattern.at("Regex").get<std::string>());
  } else if (type == "ByteLevel") {
    byte_level = true;
    if (node.value("add_prefix_space", false))
      fail(source, ": ByteLevel add_prefix_space=true is not supported");
    if (node.value("use_regex", true)) patterns.emplace_back(kGpt2Pattern);
  } else if (type == "Digits") {
    patterns.emplace_back(node.value("individual_digits", false) ? kDigitsPattern
                                                                 : kDigitRunsPattern);
  } else if (type == "Punctuation") {
    patterns.emplace_back(kPunctuationPattern);
  } else {
    fail(source, ": pre_tokenizer type ", gguf::quoted(type), " is not supported");
  }
}

// "<|im_end|>" or {"content": "<|im_end|>", ...}; "" when absent or null.
std::string token_content(const json& config, const char* key) {
  if (!config.contains(key)) return "";
  const json& v = config.at(key);
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v.at("content").is_string())
    return v.at("content").get<std::string>();
  return "";
}

// Whether the post-processor puts a special token first in a single sequence (Llama 3 adds
// <|begin_of_text|> this way instead of through add_bos_token).
bool post_processor_adds_bos(const json& node) {
  if (!node.is_object()) return false;
  const std::string type = node.value("type", "");
  if (type == "Sequence" && node.contains("processors")) {
    for (const json& child : node.at("processors"))
      if (post_processor_adds_bos(child)) return true;
    return false;
  }
  if (type != "TemplateProcessing" || !node.contains("single")) return false;
  const json& single = node.at("single");
  return single.is_array() && !single.empty() && single.at(0).contains("SpecialToken");
}

}  // namespace

json read_json_file(const std::string& path) {
  const std::string text = read_file(path);
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    fail(path, ": invalid JSON: ", e.what());
  }
}

std::vector<std::string> hf_tokenizer_files(const std::string& dir) {
  std::vector<std::string> files;
  for (const char* name : {kTokenizerFile, kTokenizerConfigFile, kChatTemplateFile})
    files.push_back((fs::path(dir) / name).string());
  return files;
}

void pad_tokenizer_vocab(TokenizerMetadata& meta, int n_vocab, const std::string& source) {
  if (n_vocab <= 0) return;
  if (n_vocab > kMaxTokens) fail(source, ": vocabulary size ", n_vocab, " is above ", kMaxTokens);
  if (meta.tokens.size() > size_t(n_vocab))
    fail(source, ": the tokenizer has ", meta.tokens.size(), " tokens, more than the requested ",
         n_vocab);
  if (meta.token_types.empty()) meta.token_types.assign(meta.tokens.size(), int32_t(TokenType::NORMAL));
  for (size_t id = meta.tokens.size(); id < size_t(n_vocab); ++id) {
    meta.tokens.push_back("[PAD" + std::to_string(id) + "]");
    meta.token_types.push_back(int32_t(TokenType::UNUSED));
    if (!meta.scores.empty()) meta.scores.push_back(-1000.0f);
  }
}

TokenizerMetadata import_hf_tokenizer(const std::string& dir, int pad_to_vocab) {
  const fs::path tokenizer_path = fs::path(dir) / kTokenizerFile;
  const std::string source = tokenizer_path.string();
  if (!fs::exists(tokenizer_path)) fail(dir, ": no ", kTokenizerFile, " in this directory");
  const json tj = read_json_file(source);
  const fs::path config_path = fs::path(dir) / kTokenizerConfigFile;
  const json config = fs::exists(config_path) ? read_json_file(config_path.string()) : json::object();

  TokenizerMetadata meta;
  try {
    const json& model = tj.at("model");
    if (model.value("type", "") != "BPE")
      fail(source, ": model type ", gguf::quoted(model.value("type", "?")),
           " is not supported (only byte-level BPE)");

    std::vector<std::string> patterns;
    bool byte_level = false;
    collect_split_patterns(tj.value("pre_tokenizer", json()), source, patterns, byte_level);
    if (tj.contains("decoder") && tj.at("decoder").is_object() &&
        tj.at("decoder").value("type", "") == "ByteLevel")
      byte_level = true;
    if (!byte_level) fail(source, ": not a byte-level BPE tokenizer (no ByteLevel component)");
    const PreTokenizerFamily* family =
        detect_pre_tokenizer(patterns, model.value("ignore_merges", false));
    if (!family) {
      std::string list;
      for (const auto& p : patterns) list += "\n  " + gguf::quoted(p, 400);
      fail(source, ": unknown pre-tokenizer (split regexes not of a known family):", list);
    }
    meta.model = "gpt2";
    meta.pre = std::string(family->names[0]);

    // Tokens by id: the model vocabulary, then the added tokens (which may extend it).
    const auto place = [&](int64_t id, std::string text, TokenType type) {
      if (id < 0 || id >= kMaxTokens)
        fail(source, ": token id ", id, " is out of range (0..", kMaxTokens - 1, ")");
      if (size_t(id) >= meta.tokens.size()) {
        meta.tokens.resize(size_t(id) + 1);
        meta.token_types.resize(size_t(id) + 1, -1);
      }
      meta.tokens[size_t(id)] = std::move(text);
      meta.token_types[size_t(id)] = int32_t(type);
    };
    for (const auto& [text, id] : model.at("vocab").items())
      place(id.get<int64_t>(), text, TokenType::NORMAL);
    if (tj.contains("added_tokens"))
      for (const json& added : tj.at("added_tokens"))
        place(added.at("id").get<int64_t>(), added.at("content").get<std::string>(),
              added.value("special", false) ? TokenType::CONTROL : TokenType::USER_DEFINED);
    for (size_t id = 0; id < meta.tokens.size(); ++id)
      if (meta.token_types[id] < 0) {
        meta.tokens[id] = "[PAD" + std::to_string(id) + "]";
        meta.token_types[id] = int32_t(TokenType::UNUSED);
      }

    if (model.contains("merges"))
      for (const json& merge : model.at("merges")) {
        if (merge.is_string()) {
          meta.merges.push_back(merge.get<std::string>());
        } else if (merge.is_array() && merge.size() == 2) {
          meta.merges.push_back(merge.at(0).get<std::string>() + " " +
                                merge.at(1).get<std::string>());
        } else {
          fail(source, ": merge ", meta.merges.size(), " is neither \"a b\" nor [\"a\", \"b\"]");
        }
      }

    const auto id_of = [&](const std::string& text) -> int32_t {
      if (text.empty()) return -1;
      for (size_t id = 0; id < meta.tokens.size(); ++id)
        if (meta.tokens[id] == text) return int32_t(id);
      fail(config_path.string(), ": special token ", gguf::quoted(text), " is not in the vocabulary");
    };
    meta.bos = id_of(token_content(config, "bos_token"));
    meta.eos = id_of(token_content(config, "eos_token"));
    meta.pad = id_of(token_content(config, "pad_token"));
    meta.unk = id_of(token_content(config, "unk_token"));
    if (config.contains("add_bos_token") && config.at("add_bos_token").is_boolean())
      meta.add_bos = config.at("add_bos_token").get<bool>();
    else
      meta.add_bos = meta.bos >= 0 && post_processor_adds_bos(tj.value("post_processor", json()));
    if (config.contains("add_eos_token") && config.at("add_eos_token").is_boolean())
      meta.add_eos = config.at("add_eos_token").get<bool>();
    if (config.contains("chat_template")) {
      const json& t = config.at("chat_template");
      if (t.is_string()) {
        meta.chat_template = t.get<std::string>();
      } else if (t.is_array()) {  // named templates: take "default"
        for (const json& named : t)
          if (named.value("name", "") == "default") meta.chat_template = named.value("template", "");
      }
    }
  } catch (const json::exception& e) {
    fail(source, ": unexpected structure: ", e.what());
  }
  // Newer transformers save the template beside the config instead of inside it.
  const fs::path template_path = fs::path(dir) / kChatTemplateFile;
  if (meta.chat_template.empty() && fs::exists(template_path)) meta.chat_template = read_file(template_path.string());
  meta.add_space_prefix = false;
  pad_tokenizer_vocab(meta, pad_to_vocab, source);
  validate_tokenizer_metadata(meta, source);
  return meta;
}

}  // namespace minfer
