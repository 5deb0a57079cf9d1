// Text <-> token ids for the two GGUF tokenizer families: byte-level BPE (tokenizer.ggml.model =
// "gpt2", split regexes chosen by tokenizer.ggml.pre) and SentencePiece ("llama").
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "gguf/gguf.h"
#include "tokenizer/vocab.h"

namespace minfer {

// encode/decode may be called from several threads at once (the word cache is locked).
class Tokenizer {
 public:
  // Throws minfer::Error for a missing/unknown tokenizer model or pre-tokenizer.
  static Tokenizer from_gguf(const gguf::File& file);
  // From metadata already in memory (HF import); `source` names it in error messages.
  static Tokenizer from_metadata(TokenizerMetadata meta, const std::string& source);
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // add_special: BOS/EOS as the metadata flags say; parse_special: turn special-token text
  // (e.g. "<|im_start|>") into its id instead of encoding it as plain text.
  std::vector<int32_t> encode(std::string_view text, bool add_special, bool parse_special) const;
  std::string decode(std::span<const int32_t> ids) const;  // exact bytes; special tokens as text
  std::string token_to_piece(int32_t id) const;            // raw bytes of one token
  const std::string& token_text(int32_t id) const;         // the vocab entry as stored

  int n_vocab() const;
  int32_t bos() const;  // -1 when absent
  int32_t eos() const;
  bool add_bos() const;
  bool is_end_of_generation(int32_t id) const;  // eos, eot, <|im_end|>, <|eot_id|>, ...
  const std::string& model_name() const;        // "gpt2" | "llama"
  const std::string& pre_name() const;          // tokenizer.ggml.pre
  std::string chat_template() const;            // tokenizer.chat_template, "" when absent
  const TokenizerMetadata& metadata() const;

  // Appends the text of one token as decode() renders it inside a sequence; `at_text_start`
  // (true before the first token) lets SentencePiece drop the space prefix it added when
  // encoding. decode() and StreamDecoder share this so that they always agree.
  void append_piece(int32_t id, std::string& out, bool& at_text_start) const;

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Streams decoded text token by token without ever emitting half a UTF-8 character.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tok) : tok_(tok) {}
  std::string push(int32_t id);  // complete characters ready so far
  std::string flush();           // whatever is left (invalid bytes as U+FFFD)
  // Output equals decode(ids) wherever that is valid UTF-8; invalid bytes become U+FFFD.

 private:
  const Tokenizer& tok_;
  std::string pending_;
  bool at_text_start_ = true;
};

}  // namespace minfer
