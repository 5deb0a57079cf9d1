// The tokenizer's data as GGUF stores it under tokenizer.ggml.*: one struct shared by the GGUF
// reader, the HF tokenizer.json importer and the writer used by convert/synth/tokenizer-import.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "gguf/gguf.h"

namespace minfer {

// tokenizer.ggml.token_type values (the GGUF convention).
enum class TokenType : int32_t {
  UNDEFINED = 0,
  NORMAL = 1,
  UNKNOWN = 2,
  CONTROL = 3,       // special tokens (bos, eos, <|im_start|>): parsed from text only on request
  USER_DEFINED = 4,  // added tokens stored as raw text: always parsed from text
  UNUSED = 5,        // padding ([PADn]): never produced by encode
  BYTE = 6,          // SentencePiece byte fallback <0xXX>
};

struct TokenizerMetadata {
  std::string model;               // "gpt2" (byte-level BPE) | "llama" (SentencePiece)
  std::string pre = "default";     // pre-tokenizer family (BPE split regexes)
  std::vector<std::string> tokens;
  std::vector<float> scores;       // SentencePiece merge priorities; may be empty for BPE
  std::vector<int32_t> token_types;  // TokenType per token; empty means all NORMAL
  std::vector<std::string> merges;   // BPE "left right", highest priority first
  int32_t bos = -1, eos = -1, eot = -1, eom = -1, unk = -1, pad = -1;
  bool add_bos = false;
  bool add_eos = false;
  bool add_space_prefix = true;    // SentencePiece: prepend "▁" to the text
  std::string chat_template;

  TokenType type_of(int32_t id) const {
    return token_types.empty() ? TokenType::NORMAL : TokenType(token_types[size_t(id)]);
  }
};

// Reads tokenizer.ggml.* and tokenizer.chat_template; throws naming the file and key when the
// vocabulary is missing or inconsistent (array lengths, ids out of range).
TokenizerMetadata read_tokenizer_metadata(const gguf::File& file);
// Writes the same keys (only the ones that carry information).
void write_tokenizer_metadata(gguf::Writer& writer, const TokenizerMetadata& meta);
// Throws when array lengths or special ids do not fit the token list; `source` names the origin.
void validate_tokenizer_metadata(const TokenizerMetadata& meta, const std::string& source);

}  // namespace minfer
