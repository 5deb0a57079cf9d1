// libFuzzer target: a vocabulary is untrusted input inside a model file, and text is untrusted
// input from users. The input is a small text description of a vocabulary followed by the text
// to tokenize (format below, so that the seed corpus is readable and mutations stay meaningful).
// The tokenizer must either refuse the vocabulary with minfer::Error or encode the text to ids
// inside the vocabulary, decode them, and stream-decode them to the same text wherever that text
// is valid UTF-8. Crashes, sanitizer reports, leaks, other exceptions and broken properties are bugs.
//
// Format:  MODEL PRE [add_bos] [add_eos] [no_space_prefix] [bos=N] [eos=N] [eot=N] [unk=N] [pad=N]
//          one token per line: TYPE TEXT   (TYPE a digit, the GGUF token type; \n \t \\ \xHH escapes)
//          --merges--
//          one merge per line: LEFT RIGHT
//          --text--
//          the text to encode (raw bytes, to the end)
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <string_view>

#include "tokenizer/tokenizer.h"
#include "util/error.h"

namespace {

constexpr size_t kMaxFuzzTokens = 4096;

std::string unescape(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '\\' || i + 1 == s.size()) {
      out += s[i];
      continue;
    }
    const char c = s[++i];
    if (c == 'n') out += '\n';
    else if (c == 't') out += '\t';
    else if (c == 'x' && i + 2 < s.size()) {
      out += char(std::strtol(std::string(s.substr(i + 1, 2)).c_str(), nullptr, 16));
      i += 2;
    } else out += c;
  }
  return out;
}

// Well-formed UTF-8 as RFC 3629 defines it: no overlong forms (C0 80), surrogates (ED A0 80) or
// code points above U+10FFFF, written out here so that the check does not share code with the
// decoder it checks.
bool valid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = s[i];
    size_t len = 0;
    unsigned char lo = 0x80, hi = 0xbf;  // the allowed range of the second byte
    if (c < 0x80) len = 1;
    else if (c >= 0xc2 && c <= 0xdf) len = 2;
    else if (c >= 0xe0 && c <= 0xef) len = 3, lo = c == 0xe0 ? 0xa0 : 0x80, hi = c == 0xed ? 0x9f : 0xbf;
    else if (c >= 0xf0 && c <= 0xf4) len = 4, lo = c == 0xf0 ? 0x90 : 0x80, hi = c == 0xf4 ? 0x8f : 0xbf;
    else return false;
    if (i + len > s.size()) return false;
    for (size_t k = 1; k < len; ++k) {
      const unsigned char cc = s[i + k];
      if (k == 1 ? cc < lo || cc > hi : (cc & 0xc0) != 0x80) return false;
    }
    i += len;
  }
  return true;
}

minfer::TokenizerMetadata parse_vocab(std::string_view header) {
  minfer::TokenizerMetadata meta;
  std::istringstream lines{std::string(header)};
  std::string line;
  std::getline(lines, line);
  std::istringstream first(line);
  first >> meta.model >> meta.pre;
  for (std::string flag; first >> flag;) {
    const size_t eq = flag.find('=');
    const int32_t id = eq == std::string::npos ? 0 : int32_t(std::strtol(flag.c_str() + eq + 1, nullptr, 10));
    const std::string key = flag.substr(0, eq);
    if (key == "add_bos") meta.add_bos = true;
    else if (key == "add_eos") meta.add_eos = true;
    else if (key == "no_space_prefix") meta.add_space_prefix = false;
    else if (key == "bos") meta.bos = id;
    else if (key == "eos") meta.eos = id;
    else if (key == "eot") meta.eot = id;
    else if (key == "unk") meta.unk = id;
    else if (key == "pad") meta.pad = id;
  }
  bool in_merges = false;
  while (std::getline(lines, line) && meta.tokens.size() < kMaxFuzzTokens) {
    if (line == "--merges--") {
      in_merges = true;
    } else if (in_merges) {
      meta.merges.push_back(unescape(line));
    } else if (line.size() >= 2 && line[1] == ' ') {
      meta.token_types.push_back(line[0] - '0');  // any digit: invalid types must be refused
      meta.tokens.push_back(unescape(std::string_view(line).substr(2)));
      meta.scores.push_back(-float(meta.tokens.size()));  // SentencePiece: earlier tokens win
    }
  }
  return meta;
}

void check(bool ok, const char* property) {
  if (!ok) {
    std::fprintf(stderr, "fuzz_tokenizer: property broken: %s\n", property);
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  static constexpr std::string_view kTextMarker = "\n--text--\n";
  const size_t marker = input.find(kTextMarker);
  const std::string_view header = input.substr(0, marker);
  const std::string_view text = marker == std::string_view::npos ? "" : input.substr(marker + kTextMarker.size());
  try {
    const minfer::Tokenizer tok = minfer::Tokenizer::from_metadata(parse_vocab(header), "fuzz");
    for (const bool parse_special : {false, true}) {
      const std::vector<int32_t> ids = tok.encode(text, parse_special, parse_special);
      for (int32_t id : ids) check(id >= 0 && id < tok.n_vocab(), "encode returns ids inside the vocabulary");
      const std::string decoded = tok.decode(ids);
      minfer::StreamDecoder stream(tok);
      std::string streamed;
      for (int32_t id : ids) streamed += stream.push(id);
      streamed += stream.flush();
      if (valid_utf8(decoded)) check(streamed == decoded, "stream decoding equals decode() on valid UTF-8");
      for (int32_t id : ids) (void)tok.token_to_piece(id);
    }
  } catch (const minfer::Error&) {
  }
  return 0;
}
