#include "convert/tokenizer_meta.h"

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <map>

#include "tokenizer/hf_import.h"
#include "tokenizer/vocab.h"
#include "util/error.h"

namespace minfer::convert {

namespace {

using gguf::Value;

constexpr int32_t kTokenNormal = 1, kTokenControl = 3, kTokenUnused = 5;

// GPT-2's reversible byte -> printable code point mapping, as UTF-8 strings.
std::vector<std::string> byte_symbols() {
  std::vector<std::string> out(256);
  int next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    const int cp = printable ? b : next++;
    std::string s;
    if (cp < 0x80) {
      s += char(cp);
    } else {
      s += char(0xC0 | (cp >> 6));
      s += char(0x80 | (cp & 0x3F));
    }
    out[size_t(b)] = s;
  }
  return out;
}

constexpr const char* kTrainingText =
    "The quick brown fox jumps over the lazy dog. A model reads the text one token at a time and "
    "predicts the next one. In the beginning there was nothing but the sound of the sea, and then "
    "the people came and built their houses on the shore. They fished in the morning and they sang "
    "in the evening, and their children played in the sand until the sun went down. Every story "
    "that is told here is told again, and every time it changes a little: the names, the places, "
    "the reasons. This is how language works; this is how the weights of a network learn to speak. "
    "Numbers like 1, 2, 3, 10, 100 and 2024 appear in the text as well as words such as question, "
    "answer, function, return, value, string, integer, system, user and assistant. What is the "
    "capital of France? The capital of France is Paris. How many legs does a spider have? Eight. "
    "Write a function that returns the sum of two numbers: def add(a, b): return a + b. Thank you "
    "for your help; you are welcome, and I hope that this answer will be useful for your work.";

}  // namespace

Metadata builtin_tokenizer(int n_vocab) {
  const std::vector<std::string> controls = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
  const int n_merges_max = n_vocab - 256 - int(controls.size());
  if (n_merges_max < 0) fail("built-in tokenizer needs a vocabulary of at least 259 tokens, got ", n_vocab);
  const std::vector<std::string> sym = byte_symbols();

  // Words as the pre-tokenizer would see them (leading space attached), with their counts.
  std::map<std::vector<std::string>, int> words;
  const std::string text = kTrainingText;
  for (size_t i = 0; i < text.size();) {
    size_t j = i + 1;
    while (j < text.size() && text[j] != ' ') ++j;
    std::vector<std::string> w;
    for (size_t k = i; k < j; ++k) w.push_back(sym[uint8_t(text[k])]);
    ++words[w];
    i = j;
  }

  std::vector<std::string> tokens(sym.begin(), sym.end());
  std::vector<std::string> merges;
  while (int(merges.size()) < n_merges_max) {
    std::map<std::pair<std::string, std::string>, int> pairs;  // ordered: ties break by text
    for (const auto& [w, n] : words)
      for (size_t k = 0; k + 1 < w.size(); ++k) pairs[{w[k], w[k + 1]}] += n;
    auto best = pairs.end();
    for (auto it = pairs.begin(); it != pairs.end(); ++it)
      if (best == pairs.end() || it->second > best->second) best = it;
    if (best == pairs.end() || best->second < 2) break;
    const auto [a, b] = best->first;
    merges.push_back(a + " " + b);
    tokens.push_back(a + b);
    std::map<std::vector<std::string>, int> merged;
    for (const auto& [w, n] : words) {
      std::vector<std::string> m;
      for (size_t k = 0; k < w.size(); ++k) {
        if (k + 1 < w.size() && w[k] == a && w[k + 1] == b) {
          m.push_back(a + b);
          ++k;
        } else {
          m.push_back(w[k]);
        }
      }
      merged[m] += n;
    }
    words = std::move(merged);
  }
  std::vector<int32_t> types(tokens.size(), kTokenNormal);
  for (int i = 0; int(tokens.size()) < n_vocab - int(controls.size()); ++i) {
    tokens.push_back("[PAD" + std::to_string(i) + "]");
    types.push_back(kTokenUnused);
  }
  const int32_t first_control = int32_t(tokens.size());
  for (const auto& c : controls) {
    tokens.push_back(c);
    types.push_back(kTokenControl);
  }
  Metadata md;
  md.emplace_back("tokenizer.ggml.model", Value::from_string("gpt2"));
  md.emplace_back("tokenizer.ggml.pre", Value::from_string("qwen2"));
  md.emplace_back("tokenizer.ggml.tokens", Value::from_strings(tokens));
  md.emplace_back("tokenizer.ggml.token_type", Value::from_i32s(types));
  md.emplace_back("tokenizer.ggml.merges", Value::from_strings(merges));
  md.emplace_back("tokenizer.ggml.bos_token_id", Value::from_u32(uint32_t(first_control)));
  md.emplace_back("tokenizer.ggml.eos_token_id", Value::from_u32(uint32_t(first_control + 2)));
  md.emplace_back("tokenizer.ggml.padding_token_id", Value::from_u32(uint32_t(first_control)));
  md.emplace_back("tokenizer.ggml.add_bos_token", Value::from_bool(false));
  md.emplace_back("tokenizer.chat_template",
                  Value::from_string("{% for message in messages %}{{ '<|im_start|>' + message['role'] + "
                                     "'\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}"
                                     "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"));
  return md;
}

Metadata tokenizer_kv(const TokenizerMetadata& meta) {
  // The tokenizer module writes its keys straight into a gguf::Writer; read them back from a
  // metadata-only file so they can be sized and streamed like every other key.
  static std::atomic<int> counter{0};
  const std::filesystem::path tmp = std::filesystem::temp_directory_path() /
                                    ("minfer-tokenizer-" + std::to_string(getpid()) + "-" +
                                     std::to_string(counter++) + ".gguf");
  {
    gguf::Writer w(tmp.string());
    write_tokenizer_metadata(w, meta);
    w.finish();
  }
  Metadata md;
  try {
    const gguf::File f = gguf::File::open(tmp.string());
    for (const auto& [k, v] : f.metadata())
      if (k.rfind("tokenizer.", 0) == 0) md.emplace_back(k, v);
  } catch (...) {
    std::filesystem::remove(tmp);
    throw;
  }
  std::filesystem::remove(tmp);
  return md;
}

std::vector<std::string> tokenizer_source_files(const std::string& source) {
  return std::filesystem::is_directory(source) ? hf_tokenizer_files(source) : std::vector<std::string>{source};
}

Metadata load_tokenizer(const std::string& source, int n_vocab) {
  namespace fs = std::filesystem;
  if (fs::is_directory(source)) return tokenizer_kv(import_hf_tokenizer(source, n_vocab));
  if (!fs::is_regular_file(source))
    fail("tokenizer source ", source, " is neither a directory with tokenizer.json nor a .gguf file");
  TokenizerMetadata meta = read_tokenizer_metadata(gguf::File::open(source));
  pad_tokenizer_vocab(meta, n_vocab, source);
  return tokenizer_kv(meta);
}

}  // namespace minfer::convert
