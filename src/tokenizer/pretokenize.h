// Pre-tokenization for byte-level BPE: the text is cut into words by a sequence of split regexes
// (HF "Split" with "Isolated" behaviour: matches and the gaps between them both become pieces),
// and BPE merges never cross a piece boundary. The regex list is chosen by tokenizer.ggml.pre.
#pragma once
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace minfer {

struct PreTokenizerFamily {
  std::vector<std::string_view> names;     // tokenizer.ggml.pre values; names[0] is canonical
  std::vector<std::string_view> patterns;  // applied in order, each to every piece of the last
  bool ignore_merges = false;  // a word that is itself a token is not merged (HF ignore_merges)
  // The list tokenizer.json spells, when it differs from `patterns` (HF import matches this one).
  std::vector<std::string_view> hf_patterns = {};
  const std::vector<std::string_view>& import_patterns() const {
    return hf_patterns.empty() ? patterns : hf_patterns;
  }
};

const std::vector<PreTokenizerFamily>& pre_tokenizer_families();
// nullptr when the name is unknown.
const PreTokenizerFamily* find_pre_tokenizer(std::string_view name);
// The family whose import pattern list equals `patterns` exactly (HF import), preferring the one
// that agrees on ignore_merges when several do; nullptr when none does.
const PreTokenizerFamily* detect_pre_tokenizer(const std::vector<std::string>& patterns,
                                               bool ignore_merges);
// HF pre-tokenizers that are fixed regexes: ByteLevel(use_regex), Digits, Punctuation.
extern const std::string_view kGpt2Pattern;
extern const std::string_view kDigitsPattern;
extern const std::string_view kDigitRunsPattern;
extern const std::string_view kPunctuationPattern;

// PCRE2 (UTF, Unicode properties, JIT). Invalid UTF-8 never matches, so such bytes end up in gap
// pieces and are still encoded byte by byte. Thread-safe: match state is per call.
class PreTokenizer {
 public:
  explicit PreTokenizer(const PreTokenizerFamily& family);
  ~PreTokenizer();
  PreTokenizer(const PreTokenizer&) = delete;
  PreTokenizer& operator=(const PreTokenizer&) = delete;

  // Appends the pieces of `text` (views into it, in order, covering it exactly) to `pieces`.
  void split(std::string_view text, std::vector<std::string_view>& pieces) const;

 private:
  struct Regex;
  std::vector<std::unique_ptr<Regex>> regexes_;
};

}  // namespace minfer
