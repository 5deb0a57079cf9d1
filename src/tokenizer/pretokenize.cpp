#include "tokenizer/pretokenize.h"

#include <pcre2.h>

#include "tokenizer/unicode.h"
#include "util/error.h"

namespace minfer {

// The split regexes below are the published ones of each tokenizer family (GPT-2's, tiktoken's
// cl100k/o200k as used by Llama 3 / GPT-4o, Qwen2's, DeepSeek's), written as tokenizer.json
// spells them so that HF import can recognise them by string equality. Some characters are
// written as \u escapes: they have canonical decompositions, and an editor normalising the
// source to NFC would silently turn them into other characters.
const std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
const std::string_view kDigitsPattern = R"(\p{N})";
const std::string_view kDigitRunsPattern = R"(\p{N}+)";
const std::string_view kPunctuationPattern = R"([\p{P}\$\+<=>\^~\|`]+)";

namespace {

constexpr std::string_view kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kQwen2Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kGpt4oPattern =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kNewlinePattern = R"([\r\n])";
constexpr std::string_view kDigitTriplesPattern = R"([0-9][0-9][0-9])";
constexpr std::string_view kCjkRunsPattern = R"([一-龥ࠀ-一가-퟿]+)";
constexpr std::string_view kDeepseekLlmLetters =
    R"(\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-)" "\u1F7D" R"(ᾀ-ᾴᾶ-ᾼ)" "\u1FBE" R"(ῂ-ῄῆ-ῌῐ-)" "\u1FD3" R"(ῖ-)" "\u1FDB" R"(ῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤ)" "\u2126" R"(ℨ)" "\u212A" R"(-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+)";
constexpr std::string_view kDeepseekLlmPunct = R"(\s?[!-/:-~！-／：-～‘-‟　-。]+)";
constexpr std::string_view kDeepseekV3Words =
    R"([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

}  // namespace

const std::vector<PreTokenizerFamily>& pre_tokenizer_families() {
  static const std::vector<PreTokenizerFamily> families = {
      {{"gpt2", "default", "gpt-2", "mpt", "olmo"}, {kGpt2Pattern}, false},
      {{"llama-bpe", "llama3"}, {kLlama3Pattern}, true},
      {{"dbrx", "smaug-bpe"}, {kLlama3Pattern}, false},
      {{"qwen2", "stablelm2", "megrez"}, {kQwen2Pattern}, false},
      {{"gpt-4o"}, {kGpt4oPattern}, false},
      {{"deepseek-llm"},
       {kNewlinePattern, kDeepseekLlmLetters, kDeepseekLlmPunct, R"(\s+$)", kCjkRunsPattern,
        kDigitRunsPattern},
       false},
      {{"deepseek-coder"},
       {kNewlinePattern, R"(\s?\p{L}+)", R"(\s?\p{P}+)", kCjkRunsPattern, kDigitsPattern},
       false},
      {{"deepseek-v3"}, {R"(\p{N}{1,3})", R"([一-龥぀-ゟ゠-ヿ]+)", kDeepseekV3Words}, false},
      // Falcon's tokenizer.json also isolates digit runs (Digits) after the byte-level mapping,
      // where it can split a UTF-8 character; its merges never join a digit to anything else,
      // so leaving that stage out gives the same tokens (the shared vectors confirm it).
      {{"falcon"},
       {kPunctuationPattern, kGpt2Pattern, kDigitTriplesPattern},
       false,
       {kPunctuationPattern, kGpt2Pattern, kDigitRunsPattern, kDigitTriplesPattern}},
      {{"starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b"},
       {kDigitsPattern, kGpt2Pattern},
       false},
  };
  return families;
}

const PreTokenizerFamily* find_pre_tokenizer(std::string_view name) {
  for (const auto& family : pre_tokenizer_families())
    for (std::string_view n : family.names)
      if (n == name) return &family;
  return nullptr;
}

const PreTokenizerFamily* detect_pre_tokenizer(const std::vector<std::string>& patterns,
                                               bool ignore_merges) {
  const PreTokenizerFamily* found = nullptr;
  for (const auto& family : pre_tokenizer_families()) {
    const auto& own = family.import_patterns();
    if (!std::equal(own.begin(), own.end(), patterns.begin(), patterns.end())) continue;
    if (!found || (family.ignore_merges == ignore_merges && found->ignore_merges != ignore_merges))
      found = &family;
  }
  return found;
}

struct PreTokenizer::Regex {
  pcre2_code* code = nullptr;
  ~Regex() { pcre2_code_free(code); }
};

PreTokenizer::PreTokenizer(const PreTokenizerFamily& family) {
  for (std::string_view pattern : family.patterns) {
    int error = 0;
    PCRE2_SIZE error_offset = 0;
    auto regex = std::make_unique<Regex>();
    // DOLLAR_ENDONLY: `$` means the end of the piece, as in the Rust regex HF tokenizers use.
    regex->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF |
                                    PCRE2_DOLLAR_ENDONLY,
                                &error, &error_offset, nullptr);
    if (!regex->code) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(error, message, sizeof message);
      fail("pre-tokenizer ", family.names[0], ": regex does not compile at offset ", error_offset,
           ": ", reinterpret_cast<const char*>(message));
    }
    pcre2_jit_compile(regex->code, PCRE2_JIT_COMPLETE);  // falls back to the interpreter
    regexes_.push_back(std::move(regex));
  }
}

PreTokenizer::~PreTokenizer() = default;

void PreTokenizer::split(std::string_view text, std::vector<std::string_view>& pieces) const {
  std::vector<std::string_view> current{text}, next;
  std::unique_ptr<pcre2_match_data, void (*)(pcre2_match_data*)> match(
      pcre2_match_data_create(1, nullptr), pcre2_match_data_free);
  if (!match) fail("pre-tokenizer: out of memory");
  for (const auto& regex : regexes_) {
    next.clear();
    for (std::string_view piece : current) {
      const auto* subject = reinterpret_cast<PCRE2_SPTR>(piece.data());
      size_t gap_start = 0, offset = 0;
      while (offset < piece.size()) {
        const int rc =
            pcre2_match(regex->code, subject, piece.size(), offset, 0, match.get(), nullptr);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
          PCRE2_UCHAR message[256];
          pcre2_get_error_message(rc, message, sizeof message);
          fail("pre-tokenizer: matching a ", piece.size(), "-byte piece failed: ",
               reinterpret_cast<const char*>(message));
        }
        const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(match.get());
        const size_t begin = ov[0], end = ov[1];
        if (begin > gap_start) next.push_back(piece.substr(gap_start, begin - gap_start));
        if (end > begin) {
          next.push_back(piece.substr(begin, end - begin));
          offset = gap_start = end;
        } else {  // an empty match: move on, the character stays in the gap
          offset = end + utf8::char_len(piece.substr(end));
        }
      }
      if (gap_start < piece.size()) next.push_back(piece.substr(gap_start));
    }
    current.swap(next);
  }
  pieces.insert(pieces.end(), current.begin(), current.end());
}

}  // namespace minfer
